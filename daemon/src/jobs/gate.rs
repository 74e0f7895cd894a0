//! The gates (design.md §6): the worker's evaluation of the candidate against its baseline in,
//! one [`Criterion`] per line of the gate table out. Pure: no IO, no clock.
//!
//! [`judge`] reads the worker's [`Outcome`] (its gate evaluation of the candidate and of the
//! baseline — the model line's published version, or the job's starting checkpoint for the
//! first — on the held-out and canary sets, plus training's trend) and the spec's `[gates]`. Each
//! criterion is its own function. A criterion a job cannot be judged on (no canaries, say) is
//! "not checked" when nothing was asked of it, and fails when a threshold was: never a silent
//! pass.
//!
//! The held-out gain is judged on the lower end of its paired interval (`super::paired`).
//! `rlvrd gates` calls the same [`judge`] (and `dataset_output`'s) on a standalone run's outcome.

use rlvr_protocol::gates::{Criterion, GateReport, Op, Status};
use rlvr_protocol::spec::{GatesSection, JobSpec};
use rlvr_protocol::worker::{GateEvaluation, GateScore, Outcome, Trend};

use super::paired;

/// The defaults of `[gates]` (design.md §6): a candidate must have gained on the held-out set
/// beyond noise, must not break a canary the baseline passed, must not double its completion
/// length, and its verifiers must have answered (errors and timeouts each ≤ 5%). KL has no
/// default: its scale depends on the estimator and the task; unset, it is measured and shown
/// only.
///
/// `heldout_gain_min` bounds the **lower end** of the gain's 95% paired interval
/// ([`paired::gain_interval`]), not the gain itself. 0.01, not 0: a candidate that changed no
/// verdict (held-out 0 → 0, or any score → the same one on every prompt) has the interval
/// [0, 0], which a bound of 0 would let through. The lower end moves in steps of 1/n, so on a
/// held-out set of up to 100 prompts 0.01 means "above zero": a first real gain passes — on 48
/// prompts, 5 more right and none lost do (lower end 1/48) — while noise, whose interval
/// straddles zero, does not. On larger sets it asks for a point of accuracy, so that a gain too
/// small to matter does not make a new version of the line.
pub const HELDOUT_GAIN_MIN: f64 = 0.01;
pub const CANARY_REGRESSIONS_MAX: u32 = 0;
pub const LENGTH_RATIO_MAX: f64 = 2.0;
pub const VERIFIER_ERROR_RATE_MAX: f64 = 0.05;
pub const VERIFIER_TIMEOUT_RATE_MAX: f64 = 0.05;

/// Judges the worker's `outcome` by `spec`'s gates.
pub fn judge(spec: &JobSpec, outcome: &Outcome) -> GateReport {
    let gates = &spec.gates;
    let evaluation = outcome.evaluation.as_ref();
    let gain = heldout_gain_of(evaluation);
    let criteria = vec![
        heldout_gain(spec, gates, evaluation, spec.job.seed),
        canary_regressions(spec, gates, evaluation),
        kl(gates, outcome.training.as_ref()),
        length_ratio(gates, evaluation),
        verifier_rate(gates, evaluation, VerifierRate::Errors),
        verifier_rate(gates, evaluation, VerifierRate::Timeouts),
        reward_hacking(gates, outcome.training.as_ref(), gain),
    ];
    GateReport {
        candidate: outcome.candidate.clone(),
        ..GateReport::new(evaluation.map(|evaluation| evaluation.baseline.clone()), criteria)
    }
}

/// The held-out scores of the baseline and of the candidate, when both were measured.
fn heldout_pair(evaluation: Option<&GateEvaluation>) -> Option<(&GateScore, &GateScore)> {
    let evaluation = evaluation?;
    evaluation.baseline_scores.heldout.as_ref().zip(evaluation.candidate.heldout.as_ref())
}

/// Held-out accuracy after minus before.
fn heldout_gain_of(evaluation: Option<&GateEvaluation>) -> Option<f64> {
    heldout_pair(evaluation).map(|(before, after)| after.figures.accuracy - before.figures.accuracy)
}

/// The held-out gain, judged on its paired interval: the lower end must reach the threshold.
/// Measured is that lower end; the note and the criterion's `interval` show the estimate, both
/// ends and the prompts. Scores without per-prompt verdicts that pair up are never a pass.
fn heldout_gain(
    spec: &JobSpec,
    gates: &GatesSection,
    evaluation: Option<&GateEvaluation>,
    seed: u64,
) -> Criterion {
    let threshold = gates.heldout_gain_min.unwrap_or(HELDOUT_GAIN_MIN);
    match heldout_pair(evaluation) {
        Some((before, after)) => {
            let accuracies =
                format!("held-out accuracy {:.4} → {:.4}", before.figures.accuracy, after.figures.accuracy);
            match paired::gain_interval(&before.passed.0, &after.passed.0, seed) {
                Some(interval) => Criterion::judged(
                    "heldout_gain",
                    Op::AtLeast,
                    Some(interval.low),
                    Some(threshold),
                    format!("{accuracies}; gain {}; the lower end is judged", interval.describe()),
                )
                .with_interval(interval),
                None => Criterion::judged(
                    "heldout_gain",
                    Op::AtLeast,
                    None,
                    Some(threshold),
                    format!(
                        "{accuracies}, but no per-prompt verdicts of both on the same prompts \
                         ({} and {}) to pair",
                        before.passed.0.len(),
                        after.passed.0.len()
                    ),
                ),
            }
        }
        None if spec.data.heldout.is_none() => Criterion::judged(
            "heldout_gain",
            Op::AtLeast,
            None,
            gates.heldout_gain_min,
            "not checked: the job has no data.heldout".into(),
        ),
        None => Criterion::judged(
            "heldout_gain",
            Op::AtLeast,
            None,
            Some(threshold),
            "no held-out score of the candidate and its baseline".into(),
        ),
    }
}

fn canary_regressions(
    spec: &JobSpec,
    gates: &GatesSection,
    evaluation: Option<&GateEvaluation>,
) -> Criterion {
    let asked = gates.canary_regressions_max.map(f64::from);
    let threshold = asked.unwrap_or(f64::from(CANARY_REGRESSIONS_MAX));
    let measured =
        evaluation.and_then(|evaluation| Some((evaluation, evaluation.candidate.canaries.as_ref()?)));
    match measured {
        Some((evaluation, canaries)) => {
            let regressions = &evaluation.canary_regressions;
            let prompts = canaries.figures.prompts;
            let note = if regressions.ids.is_empty() {
                format!("of {prompts} canaries, none the baseline passed fails now")
            } else {
                format!(
                    "of {prompts} canaries, these passed before and fail now: {}",
                    regressions.ids.join(", ")
                )
            };
            Criterion::judged(
                "canary_regressions",
                Op::AtMost,
                Some(regressions.count as f64),
                Some(threshold),
                note,
            )
        }
        None if spec.data.canaries.is_none() => Criterion::judged(
            "canary_regressions",
            Op::AtMost,
            None,
            asked,
            "not checked: the job has no data.canaries".into(),
        ),
        None => Criterion::judged(
            "canary_regressions",
            Op::AtMost,
            None,
            Some(threshold),
            "no canary scores of the candidate and its baseline".into(),
        ),
    }
}

fn kl(gates: &GatesSection, trend: Option<&Trend>) -> Criterion {
    let kl = trend.and_then(|trend| trend.kl_last);
    let note = match (kl, gates.kl_max) {
        (Some(_), Some(_)) => "mean KL to the reference over the last training steps",
        (Some(_), None) => "measured only: no gates.kl_max",
        (None, _) => "no KL to a reference was measured (no reference model in this job)",
    };
    Criterion::judged("kl", Op::AtMost, kl, gates.kl_max, note.into())
}

fn length_ratio(gates: &GatesSection, evaluation: Option<&GateEvaluation>) -> Criterion {
    let lengths = heldout_pair(evaluation)
        .map(|(before, after)| (before.figures.completion_len_mean, after.figures.completion_len_mean))
        .filter(|(before, _)| *before > 0.0);
    match lengths {
        Some((before, after)) => Criterion::judged(
            "length_ratio",
            Op::AtMost,
            Some(after / before),
            Some(gates.length_ratio_max.unwrap_or(LENGTH_RATIO_MAX)),
            format!("mean held-out completion length {before:.1} → {after:.1} tokens"),
        ),
        None => Criterion::judged(
            "length_ratio",
            Op::AtMost,
            None,
            gates.length_ratio_max,
            "not checked: no held-out completions of the candidate and its baseline".into(),
        ),
    }
}

/// Which verifier rate a criterion bounds.
#[derive(Clone, Copy)]
enum VerifierRate {
    Errors,
    Timeouts,
}

fn verifier_rate(gates: &GatesSection, evaluation: Option<&GateEvaluation>, rate: VerifierRate) -> Criterion {
    let (name, asked, default, what) = match rate {
        VerifierRate::Errors => {
            ("verifier_error_rate", gates.verifier_error_rate_max, VERIFIER_ERROR_RATE_MAX, "errors")
        }
        VerifierRate::Timeouts => {
            ("verifier_timeout_rate", gates.verifier_timeout_rate_max, VERIFIER_TIMEOUT_RATE_MAX, "timeouts")
        }
    };
    // The candidate's own evaluation: its held-out and canary sets together.
    let scores: Vec<&GateScore> = evaluation
        .map(|evaluation| [&evaluation.candidate.heldout, &evaluation.candidate.canaries])
        .into_iter()
        .flatten()
        .flatten()
        .collect();
    let calls: usize = scores.iter().map(|score| score.verifier_calls).sum();
    if calls == 0 {
        return Criterion::judged(
            name,
            Op::AtMost,
            None,
            asked,
            "not checked: the candidate was not evaluated".into(),
        );
    }
    let count: usize = scores
        .iter()
        .map(|score| match rate {
            VerifierRate::Errors => score.verifier_errors,
            VerifierRate::Timeouts => score.verifier_timeouts,
        })
        .sum();
    Criterion::judged(
        name,
        Op::AtMost,
        Some(count as f64 / calls as f64),
        Some(asked.unwrap_or(default)),
        format!("{count} {what} in {calls} verifier calls on the candidate's evaluation"),
    )
}

/// Training reward up while held-out down: the model learned the reward, not the task. Refused
/// unless `gates.refuse_reward_hacking = false`, which keeps the line as information.
fn reward_hacking(gates: &GatesSection, trend: Option<&Trend>, gain: Option<f64>) -> Criterion {
    let (Some(trend), Some(gain)) = (trend, gain) else {
        return Criterion::judged(
            "reward_hacking",
            Op::AtLeast,
            None,
            None,
            "not checked: needs a training reward and held-out scores".into(),
        );
    };
    let (first, last) = (trend.reward_first, trend.reward_last);
    let refuse = gates.refuse_reward_hacking.unwrap_or(true);
    let hacking = last > first && gain < 0.0;
    let mut note = format!(
        "training reward {first:.4} → {last:.4} (mean of the first and last steps), held-out {}",
        if gain < 0.0 { "down" } else { "not down" }
    );
    if hacking {
        note.push_str(": the model learned the reward, not the task");
    }
    if !refuse {
        note.push_str(" (gates.refuse_reward_hacking = false: not enforced)");
    }
    Criterion {
        name: "reward_hacking".into(),
        status: if hacking && refuse { Status::Fail } else { Status::Pass },
        measured: Some(gain),
        threshold: Some(0.0),
        op: Op::AtLeast,
        note,
        interval: None,
    }
}

#[cfg(test)]
mod tests {
    use rlvr_protocol::worker::{
        Baseline, BaselineKind, CanaryRegressions, CandidateCheckpoint, ModelScores, ScoreFigures, Verdicts,
    };

    use rlvr_protocol::gates::PairedInterval;

    use super::*;

    fn spec(extra: &str) -> JobSpec {
        JobSpec::from_toml(&format!(
            "[job]\nname = \"a\"\nteam = \"t\"\nmodel_line = \"line\"\n[model]\npolicy = \"builtin:tiny-arith\"\n\
             [data]\ntrain = \"/t.jsonl\"\nheldout = \"/h.jsonl\"\n[optimizer]\nplugin = \"grpo\"\n[budget]\nmax_steps = 2\n{extra}"
        ))
        .unwrap()
    }

    /// Prompts of the constructed held-out set.
    const PROMPTS: usize = 40;

    /// A score whose verdicts pass the first `accuracy × PROMPTS` prompts: a higher score passes
    /// every prompt a lower one did (only gains, or only losses, between two of them).
    fn score(accuracy: f64, length: f64) -> Option<GateScore> {
        let passing = (accuracy * PROMPTS as f64).round() as usize;
        Some(GateScore {
            figures: ScoreFigures {
                accuracy,
                reward_mean: accuracy,
                completion_len_mean: length,
                prompts: PROMPTS,
            },
            verifier_calls: 2 * PROMPTS,
            verifier_errors: 0,
            verifier_timeouts: 0,
            passed: Verdicts((0..PROMPTS).map(|i| i < passing).collect()),
        })
    }

    /// The candidate's held-out verdicts set to `passed` (`1` and `0` by prompt), its accuracy
    /// with them.
    fn set_candidate(outcome: &mut Outcome, passed: &str) {
        let heldout = candidate_heldout(outcome);
        heldout.passed = serde_json::from_value(serde_json::Value::String(passed.to_owned())).unwrap();
        heldout.figures.accuracy =
            heldout.passed.0.iter().filter(|p| **p).count() as f64 / heldout.passed.0.len() as f64;
    }

    /// The baseline passes the first 12 of 40 (0.30); these verdicts of the candidate are:
    /// a true gain — the 12 and 12 more (0.60);
    const GAIN: &str = concat!("111111111111", "111111111111", "0000000000000000");
    /// noise — 3 of the 12 lost, 4 others won (0.325);
    const NOISE: &str = concat!("000111111111", "1111", "000000000000000000000000");
    /// a regression — 4 of the 12 lost (0.20).
    const REGRESSION: &str = concat!("11111111", "0000", "0000000000000000000000000000");

    /// A candidate that passes every default: held-out 0.30 → 0.60 (12 of 40 prompts gained,
    /// none lost), no canary lost, KL 0.02, lengths 10 → 12, clean verifiers, training reward
    /// 0.2 → 0.5.
    fn good_outcome() -> Outcome {
        let training = Trend {
            steps: 10,
            reward_first: 0.2,
            reward_last: 0.5,
            kl_last: Some(0.02),
            length_first: 10.0,
            length_last: 12.0,
        };
        Outcome {
            steps: 10,
            training: Some(training),
            evaluation: Some(GateEvaluation {
                baseline: Baseline {
                    kind: BaselineKind::Start,
                    model: "builtin:tiny-arith".into(),
                    version: None,
                },
                candidate: ModelScores { heldout: score(0.60, 12.0), canaries: score(1.0, 5.0) },
                baseline_scores: ModelScores { heldout: score(0.30, 10.0), canaries: score(1.0, 5.0) },
                canary_regressions: CanaryRegressions { count: 0, ids: Vec::new() },
                training: Some(training),
            }),
            ..Outcome::default()
        }
    }

    fn evaluation(outcome: &mut Outcome) -> &mut GateEvaluation {
        outcome.evaluation.as_mut().unwrap()
    }

    fn candidate_heldout(outcome: &mut Outcome) -> &mut GateScore {
        evaluation(outcome).candidate.heldout.as_mut().unwrap()
    }

    fn failing(report: &GateReport) -> Vec<&str> {
        report.criteria.iter().filter(|c| c.status == Status::Fail).map(|c| c.name.as_str()).collect()
    }

    #[test]
    fn a_good_candidate_passes_and_each_criterion_fails_on_its_own() {
        let with_canaries = |extra: &str| {
            let mut spec = spec(extra);
            spec.data.canaries = Some("/c.jsonl".into());
            spec
        };
        let report = judge(&with_canaries(""), &good_outcome());
        assert!(report.passed, "{report:#?}");
        assert_eq!(report.criteria.len(), 7);
        assert_eq!(report.baseline.as_ref().map(|b| b.kind), Some(BaselineKind::Start));

        type Change = fn(&mut Outcome);
        let cases: [(&str, &str, Change, &[&str]); 9] = [
            (
                "held-out gain below its minimum",
                "[gates]\nheldout_gain_min = 0.5\n",
                |_| {},
                &["heldout_gain"],
            ),
            (
                "a canary lost",
                "",
                |o| evaluation(o).canary_regressions = CanaryRegressions { count: 1, ids: vec!["c7".into()] },
                &["canary_regressions"],
            ),
            ("KL above its maximum", "[gates]\nkl_max = 0.01\n", |_| {}, &["kl"]),
            (
                "completions twice as long",
                "",
                |o| candidate_heldout(o).figures.completion_len_mean = 25.0,
                &["length_ratio"],
            ),
            ("verifier errors", "", |o| candidate_heldout(o).verifier_errors = 12, &["verifier_error_rate"]),
            (
                "verifier timeouts",
                "[gates]\nverifier_timeout_rate_max = 0.01\n",
                |o| evaluation(o).candidate.canaries.as_mut().unwrap().verifier_timeouts = 2,
                &["verifier_timeout_rate"],
            ),
            (
                "reward up, held-out down, a drop allowed by heldout_gain_min",
                "[gates]\nheldout_gain_min = -0.5\n",
                |o| set_candidate(o, REGRESSION),
                &["reward_hacking"],
            ),
            (
                "reward up, held-out down",
                "",
                |o| set_candidate(o, REGRESSION),
                &["heldout_gain", "reward_hacking"],
            ),
            (
                "held-out down with the reward down too is no hacking",
                "",
                |o| {
                    set_candidate(o, REGRESSION);
                    o.training.as_mut().unwrap().reward_last = 0.1;
                },
                &["heldout_gain"],
            ),
        ];
        for (what, extra, change, expected) in cases {
            let mut outcome = good_outcome();
            change(&mut outcome);
            let report = judge(&with_canaries(extra), &outcome);
            assert_eq!(failing(&report), expected, "{what}: {report:#?}");
            assert!(!report.passed, "{what}");
        }
    }

    #[test]
    fn refusals_name_the_measured_value_and_threshold_and_unmeasurable_asks_never_pass() {
        let mut outcome = good_outcome();
        set_candidate(&mut outcome, REGRESSION);
        evaluation(&mut outcome).candidate.canaries = None;
        evaluation(&mut outcome).baseline_scores.canaries = None;
        let report = judge(&spec(""), &outcome);
        let refusal = report.refusal();
        assert!(
            refusal.starts_with("gates refused: heldout_gain: -0.")
                && refusal.contains(" < 0.01 (held-out accuracy 0.3000 → 0.2000; gain -0.1000 [95% -0.",)
                && refusal
                    .contains("], 40 prompts (0 better, 4 worse); the lower end is judged); reward_hacking:"),
            "{refusal}"
        );
        // No canaries in the job: not checked, and no reason to refuse.
        let canary = &report.criteria[1];
        assert!(canary.status == Status::NotChecked && canary.note.starts_with("not checked"), "{canary:?}");
        // KL measured with no bound asked for: shown, not checked.
        assert_eq!(report.criteria[2].status, Status::NotChecked);
        // Asked for a KL bound in a job that measured none: refused.
        let mut no_kl = good_outcome();
        no_kl.training.as_mut().unwrap().kl_last = None;
        let report = judge(&spec("[gates]\nkl_max = 0.1\n"), &no_kl);
        assert_eq!(failing(&report), ["kl"]);
        // No evaluation at all (the worker could not score): the held-out gain is not a pass.
        let report = judge(&spec(""), &Outcome { steps: 3, ..Outcome::default() });
        assert!(failing(&report).contains(&"heldout_gain"), "{report:#?}");
    }

    /// The held-out gain on its paired interval, by the default threshold: what passes, what is
    /// refused, and what the criterion shows.
    #[test]
    fn a_true_gain_passes_and_noise_a_regression_or_no_change_do_not() {
        fn check(what: &str, candidate: &str, extra: &str, passes: bool, interval: (f64, f64, f64)) {
            let mut outcome = good_outcome();
            set_candidate(&mut outcome, candidate);
            // Training reward flat: only the gain criterion speaks.
            outcome.training.as_mut().unwrap().reward_last = 0.2;
            let report = judge(&spec(extra), &outcome);
            let gain = &report.criteria[0];
            assert_eq!(gain.name, "heldout_gain");
            assert_eq!(gain.status == Status::Pass, passes, "{what}: {gain:#?}");
            assert_eq!(report.passed, passes, "{what}: {report:#?}");
            let shown = gain.interval.expect("the interval is in the criterion");
            assert_eq!(gain.measured, Some(shown.low), "{what}: the lower end is what is judged");
            assert_eq!((shown.estimate, shown.low, shown.high), interval, "{what}: {shown:?}");
            assert_eq!((shown.prompts, shown.confidence), (PROMPTS, 0.95), "{what}");
        }
        let zero = "0".repeat(PROMPTS);
        check("a true gain", GAIN, "", true, (0.3, 0.175, 0.45));
        check("noise", NOISE, "", false, (0.025, -0.1, 0.15));
        check("a regression", REGRESSION, "", false, (-0.1, -0.2, -0.025));
        // Held-out 0 → 0 (a candidate that learned nothing): [0, 0] is below the default 0.01.
        let mut nothing = good_outcome();
        evaluation(&mut nothing).baseline_scores.heldout.as_mut().unwrap().passed =
            serde_json::from_value(serde_json::Value::String(zero.clone())).unwrap();
        evaluation(&mut nothing).baseline_scores.heldout.as_mut().unwrap().figures.accuracy = 0.0;
        set_candidate(&mut nothing, &zero);
        nothing.training.as_mut().unwrap().reward_last = 0.0;
        nothing.training.as_mut().unwrap().reward_first = 0.0;
        let report = judge(&spec(""), &nothing);
        assert_eq!(failing(&report), ["heldout_gain"], "{report:#?}");
        assert_eq!(report.criteria[0].measured, Some(0.0));
        // A looser threshold, asked for, lets noise through; a regression's whole interval is
        // below zero, so `-0.01` still refuses it.
        check("noise, allowed", NOISE, "[gates]\nheldout_gain_min = -0.2\n", true, (0.025, -0.1, 0.15));
        check(
            "a regression, -0.01",
            REGRESSION,
            "[gates]\nheldout_gain_min = -0.01\n",
            false,
            (-0.1, -0.2, -0.025),
        );
    }

    #[test]
    fn scores_without_paired_verdicts_are_never_a_pass_and_the_candidate_is_reported() {
        // A record of a worker that reported no per-prompt verdicts: refused, saying why.
        let mut outcome = good_outcome();
        candidate_heldout(&mut outcome).passed = Verdicts::default();
        let report = judge(&spec(""), &outcome);
        let gain = &report.criteria[0];
        assert_eq!((gain.status, gain.measured, gain.interval), (Status::Fail, None, None), "{gain:?}");
        assert!(
            gain.note.contains("no per-prompt verdicts of both on the same prompts (40 and 0)"),
            "{gain:?}"
        );
        // Verdicts of different sets do not pair either.
        let mut outcome = good_outcome();
        set_candidate(&mut outcome, "1111");
        assert_eq!(judge(&spec(""), &outcome).criteria[0].status, Status::Fail);
        // The checkpoint the worker chose is in the report as it was given.
        let mut outcome = good_outcome();
        let chosen = CandidateCheckpoint { step: 6, heldout: Some(0.6), scored: Vec::new() };
        outcome.candidate = Some(chosen.clone());
        assert_eq!(judge(&spec(""), &outcome).candidate, Some(chosen));
        // The same job and verdicts give the same interval (the job's seed), another seed may not.
        let first = judge(&spec(""), &good_outcome()).criteria[0].interval;
        assert_eq!(judge(&spec(""), &good_outcome()).criteria[0].interval, first);
        let reseeded: Vec<Option<PairedInterval>> = (1..6)
            .map(|seed| {
                let mut spec = spec("");
                spec.job.seed = seed;
                judge(&spec, &good_outcome()).criteria[0].interval
            })
            .collect();
        assert!(reseeded.iter().any(|other| other != &first), "{reseeded:?}");
    }
}
