//! The gates (design.md §6): the worker's evaluation of the candidate against its baseline in,
//! one [`Criterion`] per line of the gate table out. Pure: no IO, no clock.
//!
//! [`judge`] reads the worker's [`Outcome`] (its gate evaluation of the candidate and of the
//! baseline — the model line's published version, or the job's starting checkpoint for the
//! first — on the held-out and canary sets, plus training's trend) and the spec's `[gates]`. Each
//! criterion is its own function. A criterion a job cannot be judged on (no canaries, say) is
//! "not checked" when nothing was asked of it, and fails when a threshold was: never a silent
//! pass.

use rlvr_protocol::gates::{Criterion, GateReport, Op, Status};
use rlvr_protocol::spec::{GatesSection, JobSpec};
use rlvr_protocol::worker::{GateEvaluation, GateScore, Outcome, Trend};

/// The defaults of `[gates]` (design.md §6): a candidate must not score worse on the held-out
/// set, must not break a canary the baseline passed, must not double its completion length, and
/// its verifiers must have answered (errors and timeouts each ≤ 5%). KL has no default: its
/// scale depends on the estimator and the task; unset, it is measured and shown only.
pub const HELDOUT_GAIN_MIN: f64 = 0.0;
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
        heldout_gain(spec, gates, evaluation, gain),
        canary_regressions(spec, gates, evaluation),
        kl(gates, outcome.training.as_ref()),
        length_ratio(gates, evaluation),
        verifier_rate(gates, evaluation, VerifierRate::Errors),
        verifier_rate(gates, evaluation, VerifierRate::Timeouts),
        reward_hacking(gates, outcome.training.as_ref(), gain),
    ];
    GateReport::new(evaluation.map(|evaluation| evaluation.baseline.clone()), criteria)
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

fn heldout_gain(
    spec: &JobSpec,
    gates: &GatesSection,
    evaluation: Option<&GateEvaluation>,
    gain: Option<f64>,
) -> Criterion {
    let threshold = gates.heldout_gain_min.unwrap_or(HELDOUT_GAIN_MIN);
    match (heldout_pair(evaluation), gain) {
        (Some((before, after)), Some(gain)) => Criterion::judged(
            "heldout_gain",
            Op::AtLeast,
            Some(gain),
            Some(threshold),
            format!("held-out accuracy {:.4} → {:.4}", before.figures.accuracy, after.figures.accuracy),
        ),
        _ if spec.data.heldout.is_none() => Criterion::judged(
            "heldout_gain",
            Op::AtLeast,
            None,
            gates.heldout_gain_min,
            "not checked: the job has no data.heldout".into(),
        ),
        _ => Criterion::judged(
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
    }
}

#[cfg(test)]
mod tests {
    use rlvr_protocol::worker::{Baseline, BaselineKind, CanaryRegressions, ModelScores, ScoreFigures};

    use super::*;

    fn spec(extra: &str) -> JobSpec {
        JobSpec::from_toml(&format!(
            "[job]\nname = \"a\"\nteam = \"t\"\nmodel_line = \"line\"\n[model]\npolicy = \"builtin:tiny-arith\"\n\
             [data]\ntrain = \"/t.jsonl\"\nheldout = \"/h.jsonl\"\n[optimizer]\nplugin = \"grpo\"\n[budget]\nmax_steps = 2\n{extra}"
        ))
        .unwrap()
    }

    fn score(accuracy: f64, length: f64) -> Option<GateScore> {
        Some(GateScore {
            figures: ScoreFigures {
                accuracy,
                reward_mean: accuracy,
                completion_len_mean: length,
                prompts: 20,
            },
            verifier_calls: 40,
            verifier_errors: 0,
            verifier_timeouts: 0,
        })
    }

    /// A candidate that passes every default: held-out 0.30 → 0.40, no canary lost, KL 0.02,
    /// lengths 10 → 12, clean verifiers, training reward 0.2 → 0.5.
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
                candidate: ModelScores { heldout: score(0.40, 12.0), canaries: score(1.0, 5.0) },
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
                "[gates]\nheldout_gain_min = 0.2\n",
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
            ("verifier errors", "", |o| candidate_heldout(o).verifier_errors = 8, &["verifier_error_rate"]),
            (
                "verifier timeouts",
                "[gates]\nverifier_timeout_rate_max = 0.01\n",
                |o| evaluation(o).candidate.canaries.as_mut().unwrap().verifier_timeouts = 1,
                &["verifier_timeout_rate"],
            ),
            (
                "reward up, held-out down, a small drop allowed by heldout_gain_min",
                "[gates]\nheldout_gain_min = -0.1\n",
                |o| candidate_heldout(o).figures.accuracy = 0.25,
                &["reward_hacking"],
            ),
            (
                "reward up, held-out down",
                "",
                |o| candidate_heldout(o).figures.accuracy = 0.25,
                &["heldout_gain", "reward_hacking"],
            ),
            (
                "held-out down with the reward down too is no hacking",
                "",
                |o| {
                    candidate_heldout(o).figures.accuracy = 0.25;
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
        candidate_heldout(&mut outcome).figures.accuracy = 0.28;
        evaluation(&mut outcome).candidate.canaries = None;
        evaluation(&mut outcome).baseline_scores.canaries = None;
        let report = judge(&spec(""), &outcome);
        assert!(
            report.refusal().starts_with(
                "gates refused: heldout_gain: -0.0200 < 0 (held-out accuracy 0.3000 → 0.2800); reward_hacking:"
            ),
            "{}",
            report.refusal()
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
}
