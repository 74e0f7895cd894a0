//! Why a job may not be learning, read off its metrics lines (**pure**): steps on which every
//! group's completions all failed, or all passed. GRPO's and RLOO's advantages are a completion's
//! reward against its group's, so on such a step every advantage is zero and the update learns
//! nothing. The worker puts these warnings into `progress.json` (so `rlvrctl status` shows them
//! while the job runs and after it ends) and `rlvrctl report` computes them from the same lines.

use serde::{Deserialize, Serialize};

use crate::worker::MetricsLine;

/// A warning is raised once this share of the online steps so far were all-fail (or all-pass)…
const SHARE: f64 = 0.25;

/// Which way a step's groups gave no signal.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "kebab-case")]
pub enum GroupWarningKind {
    /// Every completion of every group failed.
    AllFail,
    /// Every completion of every group passed.
    AllPass,
}

/// Steps whose every group was all-fail or all-pass, and what to do about it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct GroupWarning {
    pub kind: GroupWarningKind,
    /// Online steps of the run (so far) whose every group was of this kind.
    pub steps: u64,
    /// Online steps of the run so far.
    pub of_steps: u64,
    /// Such steps in a row, ending at the latest step (0: the latest step had signal).
    pub streak: u64,
    /// The warning in words, with the advice.
    pub message: String,
}

/// Counts steps without signal over a run's metrics lines, in order.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GroupSignals {
    online_steps: u64,
    all_fail: Tally,
    all_pass: Tally,
}

#[derive(Debug, Clone, Copy, Default, PartialEq)]
struct Tally {
    steps: u64,
    streak: u64,
}

impl Tally {
    fn observe(&mut self, whole: bool) {
        if whole {
            self.steps += 1;
            self.streak += 1;
        } else {
            self.streak = 0;
        }
    }
}

impl GroupSignals {
    /// The signals of `lines`, in order.
    pub fn of<'a>(lines: impl IntoIterator<Item = &'a MetricsLine>) -> Self {
        let mut signals = GroupSignals::default();
        for line in lines {
            signals.observe(line);
        }
        signals
    }

    /// Takes one metrics line; lines without group fractions (offline steps, held-out lines)
    /// change nothing.
    pub fn observe(&mut self, line: &MetricsLine) {
        let (Some(all_fail), Some(all_pass)) = (line.all_fail_frac, line.all_pass_frac) else { return };
        self.online_steps += 1;
        self.all_fail.observe(all_fail >= 1.0);
        self.all_pass.observe(all_pass >= 1.0);
    }

    /// The warnings due: a kind whose latest step had no signal, or that covers at least a
    /// quarter of the online steps so far.
    pub fn warnings(&self) -> Vec<GroupWarning> {
        [(GroupWarningKind::AllFail, self.all_fail), (GroupWarningKind::AllPass, self.all_pass)]
            .into_iter()
            .filter(|(_, tally)| {
                tally.streak > 0
                    || (tally.steps > 0 && tally.steps as f64 >= SHARE * self.online_steps as f64)
            })
            .map(|(kind, tally)| GroupWarning {
                kind,
                steps: tally.steps,
                of_steps: self.online_steps,
                streak: tally.streak,
                message: message(kind, tally, self.online_steps),
            })
            .collect()
    }
}

fn message(kind: GroupWarningKind, tally: Tally, of_steps: u64) -> String {
    let (what, advice) = match kind {
        GroupWarningKind::AllFail => (
            "all-fail",
            "every advantage is zero and nothing is learned; start from an SFT cold start, add a format \
             reward, or choose easier prompts",
        ),
        GroupWarningKind::AllPass => (
            "all-pass",
            "every advantage is zero and nothing is left to learn on these prompts; choose harder prompts \
             or a frontier curriculum",
        ),
    };
    let streak = match tally.streak {
        0 => String::new(),
        n if n == tally.steps => String::new(),
        1 => ", the latest among them".to_owned(),
        n => format!(", the last {n} in a row"),
    };
    format!("every group was {what} in {} of {of_steps} steps{streak}: {advice}", tally.steps)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(step: u64, fractions: Option<(f64, f64)>) -> MetricsLine {
        MetricsLine {
            step,
            all_fail_frac: fractions.map(|(fail, _)| fail),
            all_pass_frac: fractions.map(|(_, pass)| pass),
            ..MetricsLine::default()
        }
    }

    /// `steps` as (all-fail fraction, all-pass fraction) per step, `None` for an offline or held-out
    /// line; `expected` as (kind, steps, of, streak) per warning.
    fn check(steps: &[Option<(f64, f64)>], expected: &[(GroupWarningKind, u64, u64, u64)]) {
        let lines: Vec<MetricsLine> =
            steps.iter().enumerate().map(|(i, fractions)| line(i as u64 + 1, *fractions)).collect();
        let got: Vec<_> = GroupSignals::of(&lines)
            .warnings()
            .into_iter()
            .map(|warning| (warning.kind, warning.steps, warning.of_steps, warning.streak))
            .collect();
        assert_eq!(got, expected, "{steps:?}");
    }

    #[test]
    fn steps_without_signal_are_warned_of_by_kind() {
        use GroupWarningKind::{AllFail, AllPass};
        let (fail, pass, mixed) = (Some((1.0, 0.0)), Some((0.0, 1.0)), Some((0.5, 0.25)));
        check(&[], &[]);
        check(&[mixed, mixed, mixed], &[]);
        check(&[fail], &[(AllFail, 1, 1, 1)]);
        check(&[fail, fail, fail, mixed], &[(AllFail, 3, 4, 0)]);
        // One early all-fail step in eight is a quarter's half: no warning once signal came back.
        check(&[fail, mixed, mixed, mixed, mixed, mixed, mixed, mixed], &[]);
        // … but the latest step's is always said.
        check(&[mixed, mixed, mixed, mixed, mixed, mixed, mixed, fail], &[(AllFail, 1, 8, 1)]);
        check(&[mixed, pass, pass], &[(AllPass, 2, 3, 2)]);
        check(&[fail, fail, pass, pass], &[(AllFail, 2, 4, 0), (AllPass, 2, 4, 2)]);
        // Offline steps and held-out lines carry no group fractions and are not steps here.
        check(&[None, fail, None], &[(AllFail, 1, 1, 1)]);
        check(&[None, None], &[]);
    }

    #[test]
    fn the_message_counts_the_steps_and_gives_the_advice() {
        let lines = [
            line(1, Some((1.0, 0.0))),
            line(2, Some((0.0, 0.0))),
            line(3, Some((1.0, 0.0))),
            line(4, Some((1.0, 0.0))),
        ];
        let warnings = GroupSignals::of(&lines).warnings();
        assert_eq!(
            warnings[0].message,
            "every group was all-fail in 3 of 4 steps, the last 2 in a row: every advantage is zero and nothing \
             is learned; start from an SFT cold start, add a format reward, or choose easier prompts"
        );
        let all = GroupSignals::of(&lines[..1]).warnings();
        assert!(
            all[0].message.starts_with("every group was all-fail in 1 of 1 steps: "),
            "{}",
            all[0].message
        );
    }
}
