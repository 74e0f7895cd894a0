//! Held-out scoring: greedy completions of the held-out prompts, scored by the job's verifiers.
//! Greedy, so a score depends on the weights only — and uses no randomness that resume tracks.

use rlvr_trainer::{SamplerRng, SamplingParams, generate};
use serde_json::{Value, json};

use super::Job;
use super::reward::ToScore;
use crate::sched::policy::Phase;

/// Prompts generated at once.
const EVAL_BATCH: usize = 64;

/// A held-out score.
#[derive(Debug, Clone, PartialEq)]
pub struct HeldoutScore {
    /// Fraction of prompts whose completion passed every weighted verifier.
    pub accuracy: f64,
    pub reward_mean: f64,
    pub completion_len_mean: f64,
    pub prompts: usize,
}

impl HeldoutScore {
    pub fn to_json(&self) -> Value {
        json!({
            "accuracy": self.accuracy,
            "reward_mean": self.reward_mean,
            "completion_len_mean": self.completion_len_mean,
            "prompts": self.prompts,
        })
    }
}

/// Scores the policy on the held-out set (or its first `eval.max_prompts`).
pub fn heldout(job: &Job) -> Result<HeldoutScore, String> {
    let Some(heldout) = &job.heldout else { return Err("no held-out set".into()) };
    let _grant = job.grants.hold(Phase::Eval)?;
    let limit = job.spec.eval.max_prompts.map_or(heldout.len(), |m| (m as usize).min(heldout.len()));
    let records = &heldout[..limit];
    let params = SamplingParams { temperature: 0.0, top_p: 1.0, top_k: 0, ..job.sampling.clone() };
    // Greedy decoding draws nothing; a throwaway generator keeps the training one untouched.
    let mut rng = SamplerRng::new(0);
    let tokenizer = &job.policy.tokenizer;
    let (mut passed, mut reward, mut length) = (0usize, 0.0, 0usize);
    for chunk in records.chunks(EVAL_BATCH) {
        let mut prompts = Vec::with_capacity(chunk.len());
        for record in chunk {
            let rendered = tokenizer
                .render_prompt(&record.prompt)
                .map_err(|e| format!("held-out {}: {e}", record.id))?;
            prompts.push(tokenizer.encode(&rendered).map_err(|e| format!("held-out {}: {e}", record.id))?);
        }
        let sampled = tch::no_grad(|| generate(&job.policy.model, tokenizer, &prompts, 1, &params, &mut rng))
            .map_err(|error| format!("held-out sampling: {error}"))?;
        let items: Vec<ToScore<'_>> = sampled
            .iter()
            .map(|sample| {
                let record = &chunk[sample.prompt_index];
                ToScore {
                    id: &record.id,
                    prompt: &record.prompt,
                    completion: &sample.text,
                    reference_json: &record.reference_json,
                }
            })
            .collect();
        for (scored, sample) in job.rewarder.score(&items).iter().zip(&sampled) {
            passed += usize::from(scored.passed);
            reward += scored.reward;
            length += sample.tokens.len();
        }
    }
    let n = records.len().max(1) as f64;
    Ok(HeldoutScore {
        accuracy: passed as f64 / n,
        reward_mean: reward / n,
        completion_len_mean: length as f64 / n,
        prompts: records.len(),
    })
}
