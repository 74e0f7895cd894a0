//! A metrics line as TensorBoard scalars (**pure**): one rule over the line's JSON, the same text
//! `metrics.jsonl` holds, so every figure the worker logs is charted and none is renamed by hand.
//!
//! The rule ([`MetricsLine::figures`], shared with the MLflow runs): every number in the line but
//! `step` is a scalar. A top-level number `x` is tagged
//! `train/x` (`train/reward_mean`, `train/loss`, `train/kl_ref`, an optimizer's own figures);
//! a number inside an object is tagged by its path (`heldout/accuracy`, `components/math`,
//! `time/step_s`, `time/verifier_latency_us/p99`, `dynamic_sampling/extra_rounds`). TensorBoard
//! groups charts by the part before the first `/`. Nulls, strings and lists are not scalars.

use rlvr_protocol::worker::MetricsLine;

/// One tagged value of an event.
#[derive(Debug, Clone, PartialEq)]
pub struct Scalar {
    pub tag: String,
    pub value: f64,
}

/// The group of a line's top-level numbers.
const TOP_LEVEL_GROUP: &str = "train";

/// `line`'s scalars ([`MetricsLine::figures`], the top-level ones under [`TOP_LEVEL_GROUP`]),
/// sorted by tag.
pub fn scalars(line: &MetricsLine) -> Vec<Scalar> {
    let mut out: Vec<Scalar> = line
        .figures()
        .into_iter()
        .map(|(name, value)| {
            let tag = if name.contains('/') { name } else { format!("{TOP_LEVEL_GROUP}/{name}") };
            Scalar { tag, value }
        })
        .collect();
    out.sort_by(|a, b| a.tag.cmp(&b.tag));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(line: &str, expected: &[(&str, f64)]) {
        let line: MetricsLine = serde_json::from_str(line).unwrap();
        let got: Vec<(String, f64)> =
            scalars(&line).into_iter().map(|scalar| (scalar.tag, scalar.value)).collect();
        let expected: Vec<(String, f64)> =
            expected.iter().map(|(tag, value)| ((*tag).to_owned(), *value)).collect();
        assert_eq!(got, expected, "{line:?}");
    }

    #[test]
    fn a_line_as_scalars() {
        // Held-out before training: the step is the event's, not a scalar.
        check(
            r#"{"step":0,"heldout":{"accuracy":0.25,"reward_mean":0.5,"completion_len_mean":12.0,"prompts":8}}"#,
            &[
                ("heldout/accuracy", 0.25),
                ("heldout/completion_len_mean", 12.0),
                ("heldout/prompts", 8.0),
                ("heldout/reward_mean", 0.5),
            ],
        );
        // An online step: components and times by path, an optimizer's figure at the top level,
        // its null (not a finite number) left out, as is a latency not measured.
        check(
            r#"{"step":3,"reward_mean":0.5,"passed_frac":0.25,"components":{"math":0.5,"format":1.0},
                "kl_ref":0.01,"loss":-0.2,"lr":1e-5,"tokens_generated":96,
                "dynamic_sampling":{"extra_rounds":1,"groups_sampled":4,"groups_trained":2},
                "time":{"update_s":0.5,"step_s":2.0,"generation_tokens_per_s":48.0,
                        "verifier_latency_us":{"p50":30,"p99":null}},
                "clip_frac":0.125,"approx_kl":null}"#,
            &[
                ("components/format", 1.0),
                ("components/math", 0.5),
                ("dynamic_sampling/extra_rounds", 1.0),
                ("dynamic_sampling/groups_sampled", 4.0),
                ("dynamic_sampling/groups_trained", 2.0),
                ("time/generation_tokens_per_s", 48.0),
                ("time/step_s", 2.0),
                ("time/update_s", 0.5),
                ("time/verifier_latency_us/p50", 30.0),
                ("train/clip_frac", 0.125),
                ("train/kl_ref", 0.01),
                ("train/loss", -0.2),
                ("train/lr", 1e-5),
                ("train/passed_frac", 0.25),
                ("train/reward_mean", 0.5),
                ("train/tokens_generated", 96.0),
            ],
        );
        // A line with nothing to chart.
        check(r#"{"step":5}"#, &[]);
    }
}
