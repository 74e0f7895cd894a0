//! A completion's reward from its graders' verdicts: their weighted sum (design.md §1), or the
//! job's `[reward] formula` over their names. One place for both the worker's rewards and the
//! daemon's dry-run (`POST /v1/verify`), so a team's test of its reward is the reward it trains
//! on. Each grader is called through [`verify_items`] — the same threads and host deadline as
//! `rlvrctl verify`, so a hanging grader costs one deadline, never the job.
//!
//! [`Reward`] calls each grader; `Combiner` folds the verdicts into the weighted sum or the
//! formula's value, with the components named `NAME` and `NAME.COMPONENT`.

use std::sync::Arc;
use std::time::Duration;

use rlvr_plugin_api::VerifierBox;
use rlvr_protocol::formula::Formula;

use crate::verify::{BatchOptions, Components, InputItem, OutputLine, Stop, verify_items};

/// The longest one grader call may take. Above the http verifier's worst case (25 s).
pub const VERIFY_DEADLINE: Duration = Duration::from_secs(30);

/// One of the reward's graders that a plugin library answers.
pub struct Grader {
    /// `name@version` of its plugin.
    pub id: String,
    pub verifier: Arc<VerifierBox>,
}

/// How the graders' verdicts make a reward: each grader's name (the prefix of its components)
/// and weight, in the spec's order, and the formula when there is one.
#[derive(Debug, Clone)]
pub struct Combiner {
    pub names: Vec<String>,
    pub weights: Vec<f64>,
    pub formula: Option<Formula>,
}

/// A completion to score.
pub struct ToScore<'a> {
    pub id: &'a str,
    pub prompt: &'a str,
    pub completion: &'a str,
    pub reference_json: &'a str,
}

/// A completion's scores.
#[derive(Debug, Clone, PartialEq)]
pub struct Scored {
    /// Σ weight · score, or the formula's value (0 when it is not a number: see `errors`).
    pub reward: f64,
    /// Every grader with a weight above 0 passed it; with a formula, every grader it reads.
    pub passed: bool,
    /// `NAME` (its score) and `NAME.COMPONENT` of each grader, in the job's order.
    pub components: Vec<(String, f64)>,
    /// Grader errors (timeouts included), as `NAME: message`; a formula's as `reward: message`.
    pub errors: Vec<String>,
    pub timeouts: u32,
    /// Microseconds in each grader call.
    pub latencies_us: Vec<u64>,
    /// What each grader graded, by name.
    pub extracted: Vec<(String, Option<String>)>,
}

impl Scored {
    /// The batch format's line for this completion (`rlvrctl verify`'s, and the dry-run's):
    /// `extracted` is the grader's when there is one grader, else null (each grader's is in the
    /// components' names' order in `Scored::extracted`).
    pub fn output_line(self, id: Option<String>, verifier: &str) -> OutputLine {
        let extracted = match self.extracted.as_slice() {
            [(_, one)] => one.clone(),
            _ => None,
        };
        OutputLine {
            id,
            score: self.reward,
            passed: self.passed,
            components: Components(self.components),
            extracted,
            error: (!self.errors.is_empty()).then(|| self.errors.join("; ")),
            timed_out: self.timeouts > 0,
            latency_us: self.latencies_us.iter().sum(),
            verifier: verifier.to_owned(),
            explanation: None,
        }
    }
}

/// A reward whose graders are all plugins.
pub struct Reward {
    /// In the same order as `combiner.names`.
    pub graders: Vec<Grader>,
    pub combiner: Combiner,
    /// Items verified at once, per grader.
    pub parallel: usize,
    /// The longest one grader call may take.
    pub deadline: Duration,
    /// When to stop handing items to the graders (a dry-run's request gone or over its budget);
    /// `None` for a job's rewards, which grade every item.
    pub stop: Option<Arc<Stop>>,
}

impl Reward {
    /// `name@version` of every grader, in the job's order.
    pub fn ids(&self) -> Vec<String> {
        self.graders.iter().map(|grader| grader.id.clone()).collect()
    }

    /// Each grader's verdict on every item: one list per grader, in the job's order, each in
    /// the items' order.
    pub fn verdicts(&self, items: &[ToScore<'_>]) -> Vec<Vec<OutputLine>> {
        self.graders
            .iter()
            .map(|grader| {
                let inputs = items
                    .iter()
                    .map(|item| InputItem {
                        id: Some(item.id.to_owned()),
                        prompt: item.prompt.to_owned(),
                        completion: item.completion.to_owned(),
                        reference_json: item.reference_json.to_owned(),
                    })
                    .collect();
                let options = BatchOptions {
                    verifier_id: grader.id.clone(),
                    parallel: self.parallel,
                    deadline: self.deadline,
                    explain: false,
                    stop: self.stop.clone(),
                };
                verify_items(Arc::clone(&grader.verifier), inputs, &options)
            })
            .collect()
    }

    /// Scores every item with every grader; one result per item, in order.
    pub fn score(&self, items: &[ToScore<'_>]) -> Vec<Scored> {
        self.combiner.combine(self.verdicts(items), items.len())
    }
}

impl Combiner {
    /// The rewards of `count` items from each grader's verdicts (one list per grader, in
    /// `names`' order, each in the items' order).
    pub fn combine(&self, per_grader: Vec<Vec<OutputLine>>, count: usize) -> Vec<Scored> {
        debug_assert_eq!(per_grader.len(), self.names.len());
        let mut scored: Vec<Scored> = (0..count)
            .map(|_| Scored {
                reward: 0.0,
                passed: true,
                components: Vec::new(),
                errors: Vec::new(),
                timeouts: 0,
                latencies_us: Vec::new(),
                extracted: Vec::new(),
            })
            .collect();
        let mut scores = vec![vec![0.0; self.names.len()]; count];
        for (grader, lines) in per_grader.into_iter().enumerate() {
            let counts = match &self.formula {
                Some(formula) => formula.uses().contains(&grader),
                None => self.weights[grader] > 0.0,
            };
            for ((item, line), scores) in scored.iter_mut().zip(lines).zip(&mut scores) {
                // An error's score counts as 0, and the error is logged with the completion.
                let score = if line.score.is_finite() && line.error.is_none() { line.score } else { 0.0 };
                scores[grader] = score;
                let name = &self.names[grader];
                if counts && !line.passed {
                    item.passed = false;
                }
                item.components.push((name.clone(), score));
                for (component, value) in line.components.0 {
                    item.components.push((format!("{name}.{component}"), value));
                }
                if let Some(error) = line.error {
                    item.errors.push(format!("{name}: {error}"));
                }
                item.timeouts += u32::from(line.timed_out);
                item.latencies_us.push(line.latency_us);
                item.extracted.push((name.clone(), line.extracted));
            }
        }
        for (item, scores) in scored.iter_mut().zip(scores) {
            item.reward = match &self.formula {
                Some(formula) => match formula.evaluate(&scores) {
                    Ok(reward) => reward,
                    Err(error) => {
                        item.errors.push(format!("reward: {error}"));
                        item.passed = false;
                        0.0
                    }
                },
                None => scores.iter().zip(&self.weights).map(|(score, weight)| weight * score).sum(),
            };
        }
        scored
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(score: f64, passed: bool, error: Option<&str>) -> OutputLine {
        OutputLine {
            id: None,
            score,
            passed,
            components: Components(vec![("correct".into(), score)]),
            extracted: Some(format!("{score}")),
            error: error.map(str::to_owned),
            timed_out: false,
            latency_us: 7,
            verifier: "x@1.0.0".into(),
            explanation: None,
        }
    }

    fn combiner(formula: Option<&str>, weights: [f64; 2]) -> Combiner {
        let names = vec!["math".to_owned(), "format".to_owned()];
        let formula = formula.map(|text| Formula::parse(text, &["math", "format"]).unwrap());
        Combiner { names, weights: weights.to_vec(), formula }
    }

    #[test]
    fn weighted_sums_and_formulas() {
        // (formula, weights, math's verdict, format's verdict, reward, passed, errors)
        type Verdict = (f64, bool, Option<&'static str>);
        type Case = (Option<&'static str>, [f64; 2], Verdict, Verdict, f64, bool, &'static [&'static str]);
        let cases: &[Case] = &[
            (None, [1.0, 0.5], (1.0, true, None), (1.0, true, None), 1.5, true, &[]),
            (None, [1.0, 0.0], (1.0, true, None), (0.0, false, None), 1.0, true, &[]),
            (
                None,
                [1.0, 0.5],
                (1.0, true, None),
                (f64::NAN, false, Some("boom")),
                1.0,
                false,
                &["format: boom"],
            ),
            (
                Some("0.7 * math + 0.3 * format"),
                [1.0, 1.0],
                (1.0, true, None),
                (0.0, false, None),
                0.7,
                false,
                &[],
            ),
            (
                Some("format > 0 ? math : 0"),
                [1.0, 1.0],
                (1.0, true, None),
                (0.0, false, None),
                0.0,
                false,
                &[],
            ),
            (Some("math"), [1.0, 1.0], (1.0, true, None), (0.0, false, None), 1.0, true, &[]),
            // An error's score is 0 in the formula, never the plugin's number.
            (
                Some("math + format"),
                [1.0, 1.0],
                (1.0, true, None),
                (0.9, false, Some("late")),
                1.0,
                false,
                &["format: late"],
            ),
            (
                Some("math / format"),
                [1.0, 1.0],
                (1.0, true, None),
                (0.0, true, None),
                0.0,
                false,
                &["reward: the reward formula gave inf (not a finite number)"],
            ),
        ];
        for (formula, weights, math, format, reward, passed, errors) in cases {
            let per_grader =
                vec![vec![line(math.0, math.1, math.2)], vec![line(format.0, format.1, format.2)]];
            let got = combiner(*formula, *weights).combine(per_grader, 1).remove(0);
            assert!((got.reward - reward).abs() < 1e-12, "{formula:?}: reward {} ≠ {reward}", got.reward);
            assert_eq!(got.passed, *passed, "{formula:?}");
            assert_eq!(got.errors, *errors, "{formula:?}");
            let names: Vec<&str> = got.components.iter().map(|(name, _)| name.as_str()).collect();
            assert_eq!(names, ["math", "math.correct", "format", "format.correct"]);
            assert_eq!(got.latencies_us, [7, 7]);
        }
    }

    #[test]
    fn the_batch_line_of_a_reward() {
        let per_grader = vec![vec![line(1.0, true, None)], vec![line(0.0, false, Some("no tags"))]];
        let scored = combiner(Some("math * 2"), [1.0, 1.0]).combine(per_grader, 1).remove(0);
        let out = scored.output_line(Some("a".into()), "reward");
        let json = serde_json::to_value(&out).unwrap();
        assert_eq!(json["score"], 2.0);
        assert_eq!(json["passed"], true);
        assert_eq!(json["error"], "format: no tags");
        assert_eq!(json["extracted"], serde_json::Value::Null);
        assert_eq!(json["latency_us"], 14);
        assert_eq!(json["components"]["format.correct"], 0.0);
    }
}
