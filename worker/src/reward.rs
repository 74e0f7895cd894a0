//! The reward of a completion: the weighted sum of the job's verifiers (design.md §1), each
//! called through `verify::verify_items` — the same threads and host deadline as `rlvrctl
//! verify`, so a hanging verifier costs one deadline, never the job.

use std::sync::Arc;
use std::time::Duration;

use rlvr_plugin_api::VerifierBox;

use rlvr_plugin_host::verify::{BatchOptions, InputItem, OutputLine, verify_items};

/// The longest one verifier call may take. Above the http verifier's worst case (25 s).
pub const VERIFY_DEADLINE: Duration = Duration::from_secs(30);

/// One of the job's verifiers.
pub struct WeightedVerifier {
    /// Its short name, the prefix of its reward components.
    pub name: String,
    /// `name@version`.
    pub id: String,
    pub weight: f64,
    pub verifier: Arc<VerifierBox>,
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
    /// Σ weight · score.
    pub reward: f64,
    /// Every verifier with a weight above 0 passed it.
    pub passed: bool,
    /// `NAME` (its score) and `NAME.COMPONENT` of each verifier, in the job's order.
    pub components: Vec<(String, f64)>,
    /// Verifier errors (timeouts included), as `NAME: message`.
    pub errors: Vec<String>,
    pub timeouts: u32,
    /// Microseconds in each verifier call.
    pub latencies_us: Vec<u64>,
    /// What each verifier graded, by name.
    pub extracted: Vec<(String, Option<String>)>,
}

/// The job's verifiers.
pub struct Rewarder {
    pub verifiers: Vec<WeightedVerifier>,
    pub parallel: usize,
    pub deadline: Duration,
}

impl Rewarder {
    /// `name@version` of every verifier, in the job's order.
    pub fn ids(&self) -> Vec<String> {
        self.verifiers.iter().map(|v| v.id.clone()).collect()
    }

    /// Scores every item with every verifier; one result per item, in order.
    pub fn score(&self, items: &[ToScore<'_>]) -> Vec<Scored> {
        let mut scored: Vec<Scored> = items
            .iter()
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
        for verifier in &self.verifiers {
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
                verifier_id: verifier.id.clone(),
                parallel: self.parallel,
                deadline: self.deadline,
                explain: false,
            };
            let lines = verify_items(Arc::clone(&verifier.verifier), inputs, &options);
            for (scored, line) in scored.iter_mut().zip(lines) {
                fold(scored, verifier, line);
            }
        }
        scored
    }
}

fn fold(scored: &mut Scored, verifier: &WeightedVerifier, line: OutputLine) {
    let score = if line.score.is_finite() { line.score } else { 0.0 };
    scored.reward += verifier.weight * score;
    if verifier.weight > 0.0 && !line.passed {
        scored.passed = false;
    }
    scored.components.push((verifier.name.clone(), score));
    for (name, value) in line.components.0 {
        scored.components.push((format!("{}.{name}", verifier.name), value));
    }
    if let Some(error) = line.error {
        scored.errors.push(format!("{}: {error}", verifier.name));
    }
    scored.timeouts += u32::from(line.timed_out);
    scored.latencies_us.push(line.latency_us);
    scored.extracted.push((verifier.name.clone(), line.extracted));
}
