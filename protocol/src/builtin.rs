//! The built-in optimizers: `[optimizer] plugin = "rejection-sampling"` — jobs the worker runs
//! itself, with no plugin library, because what they do is not a loss over log-probabilities
//! that a plugin could compute (rejection sampling changes no weight at all). The precedent is
//! the built-in `reward-model` grader: a reserved name, its keys checked here (by the daemon at
//! submit, without a registry lookup, and by the worker at start), each refusal naming the key
//! as the spec writes it (`optimizer.threshold`).
//!
//! A rejection-sampling job samples `optimizer.group_size` completions of each prompt of
//! `data.train` (one pass, `rollout.prompts_per_step` prompts a step), scores them with the
//! job's graders (`[[verifiers]]`, `[reward]`: the reward training uses), keeps the best `keep`
//! distinct completions of each prompt whose reward clears `threshold`, and writes them as an
//! SFT dataset (`{id, prompt, completion, reward}`) that becomes the team's dataset `output`: a
//! later job names it `dataset:OUTPUT@SHA256` (the job's `output`).
//!
//! The second built-in, `distill` (`DistillOptions`), trains a student on a teacher
//! (`worker/src/distill.rs`): a loss that needs both models' logits, which no plugin receives.
//! [`SampledRow`] and [`SampledDataset`] are a rejection-sampling job's rows and tally.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::spec::{JobSpec, SpecError};

/// The `plugin` value of a rejection-sampling job.
pub const REJECTION_SAMPLING: &str = "rejection-sampling";
/// The `plugin` value of a distillation job.
pub const DISTILL: &str = "distill";

/// Which built-in optimizer a spec names, if any.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Builtin {
    RejectionSampling,
    Distill,
}

impl Builtin {
    /// The built-in optimizer `plugin` names: exactly its name (a built-in has no versions).
    pub fn named(plugin: &str) -> Option<Builtin> {
        match plugin {
            REJECTION_SAMPLING => Some(Builtin::RejectionSampling),
            DISTILL => Some(Builtin::Distill),
            _ => None,
        }
    }

    /// The built-in optimizer of `spec`, if it names one.
    pub fn of(spec: &JobSpec) -> Option<Builtin> {
        Builtin::named(&spec.optimizer.plugin)
    }

    /// Its name, as a spec writes it.
    pub fn name(self) -> &'static str {
        match self {
            Builtin::RejectionSampling => REJECTION_SAMPLING,
            Builtin::Distill => DISTILL,
        }
    }
}

/// `[optimizer]`'s own keys of a rejection-sampling job.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RejectionSamplingOptions {
    /// The team's dataset the accepted rows become (a name of `names::NAME_RULE`); uploading
    /// again under that name replaces its content, as `PUT /v1/datasets/{name}` does.
    pub output: String,
    /// A completion is accepted when its reward is at least this; unset: when it passed (every
    /// grader the reward reads passed it).
    #[serde(default)]
    pub threshold: Option<f64>,
    /// Accepted completions kept per prompt, best reward first (best-of-N with `keep = 1`).
    #[serde(default = "one")]
    pub keep: u32,
    /// The gate: the job publishes its dataset only with at least this many rows.
    #[serde(default = "one_u64")]
    pub min_accepted: u64,
    /// The gate: and only when at least this fraction of the prompts sampled got a row.
    #[serde(default)]
    pub min_acceptance_rate: Option<f64>,
}

fn one() -> u32 {
    1
}

fn one_u64() -> u64 {
    1
}

impl RejectionSamplingOptions {
    /// The keys of `spec`'s `[optimizer]` (the trainer's keys left out), checked; every refusal
    /// names `optimizer.KEY`.
    pub fn from_spec(spec: &JobSpec) -> Result<Self, SpecError> {
        let error = |key: &str, message: String| SpecError { field: format!("optimizer.{key}"), message };
        let options: Map<String, Value> = spec.optimizer.options.clone();
        let parsed: RejectionSamplingOptions =
            rlvr_plugin_api::options::parse_options(&Value::Object(options).to_string())
                .map_err(|e| error(&e.key, e.message))?;
        if !crate::names::valid_name(&parsed.output) {
            return Err(error("output", format!("expected a dataset name of {}", crate::names::NAME_RULE)));
        }
        if let Some(threshold) = parsed.threshold
            && !threshold.is_finite()
        {
            return Err(error("threshold", format!("expected a finite number, got {threshold}")));
        }
        if parsed.keep == 0 || parsed.keep > spec.optimizer.group_size {
            return Err(error(
                "keep",
                format!(
                    "expected 1 to optimizer.group_size ({}), got {}",
                    spec.optimizer.group_size, parsed.keep
                ),
            ));
        }
        if let Some(rate) = parsed.min_acceptance_rate
            && !(0.0..=1.0).contains(&rate)
        {
            return Err(error("min_acceptance_rate", format!("expected 0 to 1, got {rate}")));
        }
        Ok(parsed)
    }

    /// Whether a completion of `reward` that `passed` is accepted.
    pub fn accepts(&self, reward: f64, passed: bool) -> bool {
        match self.threshold {
            Some(threshold) => reward.is_finite() && reward >= threshold,
            None => passed,
        }
    }
}

/// Whatever else of `spec` a rejection-sampling job cannot honour, as `(field, message)`: it is
/// graded (verifiers needed), trains nothing (no held-out or canary comparison, no curriculum,
/// no LoRA), and changes no model line.
pub fn rejection_sampling_problems(spec: &JobSpec) -> Vec<SpecError> {
    let mut problems = Vec::new();
    let mut problem = |field: &str, message: &str| {
        problems.push(SpecError { field: field.to_owned(), message: message.to_owned() })
    };
    const WHY: &str = "a rejection-sampling job changes no weights, so there is nothing to compare";
    if spec.verifiers.is_empty() {
        problem(
            "verifiers",
            "rejection-sampling accepts completions by their reward; name at least one grader",
        );
    }
    if spec.data.heldout.is_some() {
        problem("data.heldout", WHY);
    }
    if spec.data.canaries.is_some() {
        problem("data.canaries", WHY);
    }
    if spec.curriculum.is_some() {
        problem("curriculum", "rejection-sampling visits every prompt of data.train once, in order");
    }
    if spec.model.lora.is_some() {
        problem("model.lora", "rejection-sampling trains nothing; name the model to sample from");
    }
    if spec.rollout.dynamic_sampling_rounds > 0 {
        problem("rollout.dynamic_sampling_rounds", "rejection-sampling samples every prompt once");
    }
    problems
}

/// What a distillation job trains the student (`model.policy`) on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DistillMode {
    /// SFT on the teacher's sampled completions (token-mean negative log-likelihood).
    Traces,
    /// KL(teacher ‖ student) per position over the vocabulary, on the teacher's samples: forward
    /// KL is an expectation under the teacher, so its own samples are where it is estimated
    /// (supervised KD; Hinton et al. 2015; GKD with λ = 0, arXiv:2306.13649).
    ForwardKl,
    /// KL(student ‖ teacher) per position, on the student's own samples: reverse KL is an
    /// expectation under the student, and on-policy samples avoid the train/generate mismatch
    /// (GKD with λ = 1, arXiv:2306.13649; MiniLLM, arXiv:2306.08543).
    ReverseKl,
}

/// `[optimizer]`'s own keys of a distillation job (`plugin = "distill"`); the trainer's keys
/// (`lr`, `group_size` — completions sampled per prompt —, `micro_batch_size`, …) as for any job.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DistillOptions {
    /// The teacher, named as `model.policy` is (`builtin:…`, a base model, `line:L[@V]`) and
    /// resolved by the same tenancy rules. It must share the student's tokenizer.
    pub teacher: String,
    pub mode: DistillMode,
    /// τ: both distributions are softened to `softmax(logits / τ)` and the KL is scaled by τ²,
    /// so its gradients keep their size as τ changes (Hinton et al. 2015 §2). KL modes only.
    #[serde(default = "one_f")]
    pub temperature: f64,
}

fn one_f() -> f64 {
    1.0
}

/// Largest τ a spec may ask for.
pub const MAX_TEMPERATURE: f64 = 100.0;

impl DistillOptions {
    /// The keys of `spec`'s `[optimizer]`, checked; every refusal names `optimizer.KEY`.
    pub fn from_spec(spec: &JobSpec) -> Result<Self, SpecError> {
        let error = |key: &str, message: String| SpecError { field: format!("optimizer.{key}"), message };
        let parsed: DistillOptions = rlvr_plugin_api::options::parse_options(
            &Value::Object(spec.optimizer.options.clone()).to_string(),
        )
        .map_err(|e| error(&e.key, e.message))?;
        if parsed.teacher.trim().is_empty() {
            return Err(error(
                "teacher",
                "expected a model name (builtin:…, a base model or line:NAME[@VERSION])".into(),
            ));
        }
        if !(parsed.temperature > 0.0 && parsed.temperature <= MAX_TEMPERATURE) {
            return Err(error(
                "temperature",
                format!("expected more than 0 and at most {MAX_TEMPERATURE}, got {}", parsed.temperature),
            ));
        }
        if parsed.mode == DistillMode::Traces && parsed.temperature != 1.0 {
            return Err(error(
                "temperature",
                "traces train on the teacher's samples: no temperature applies".into(),
            ));
        }
        Ok(parsed)
    }
}

/// Whatever else of `spec` a distillation job cannot honour: a curriculum or dynamic sampling
/// (they choose prompts by reward, which distillation does not read), and held-out or canary
/// sets without a grader to score them.
pub fn distill_problems(spec: &JobSpec) -> Vec<SpecError> {
    let mut problems = Vec::new();
    let mut problem = |field: &str, message: &str| {
        problems.push(SpecError { field: field.to_owned(), message: message.to_owned() })
    };
    if spec.curriculum.is_some() {
        problem("curriculum", "distillation reads no reward to choose prompts by");
    }
    if spec.rollout.dynamic_sampling_rounds > 0 {
        problem("rollout.dynamic_sampling_rounds", "distillation reads no reward to drop groups by");
    }
    if spec.verifiers.is_empty() && (spec.data.heldout.is_some() || spec.data.canaries.is_some()) {
        problem(
            "verifiers",
            "data.heldout and data.canaries are scored with the job's verifiers; name at least one",
        );
    }
    problems
}

/// One row of a rejection-sampling job's output dataset: an SFT demonstration (`{prompt,
/// completion}`, what `data.train` of an SFT job reads) with where it came from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SampledRow {
    /// `<prompt id>-<rank>`: unique in the dataset.
    pub id: String,
    pub prompt: String,
    pub completion: String,
    /// Its reward from the job's graders.
    pub reward: f64,
    /// The prompt's record id in `data.train`.
    pub prompt_id: String,
}

/// What a rejection-sampling job produced, in its worker's `Outcome`: the daemon gates it and
/// publishes the run's rows (`RunDir::dataset`, JSONL of [`SampledRow`]).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SampledDataset {
    /// Prompts sampled.
    pub prompts: u64,
    /// Completions sampled and scored.
    pub completions: u64,
    /// Rows written (accepted, distinct).
    pub accepted: u64,
    /// Prompts with at least one row.
    pub prompts_accepted: u64,
    /// Accepted completions left out because the same prompt had the same text already.
    pub duplicates: u64,
    /// Sum of the rows' rewards (the mean is `reward_sum / accepted`).
    pub reward_sum: f64,
    /// Sum of every completion's reward.
    pub all_reward_sum: f64,
}

impl SampledDataset {
    /// Prompts with a row over prompts sampled.
    pub fn acceptance_rate(&self) -> Option<f64> {
        (self.prompts > 0).then(|| self.prompts_accepted as f64 / self.prompts as f64)
    }

    /// The rows' mean reward.
    pub fn accepted_reward_mean(&self) -> Option<f64> {
        (self.accepted > 0).then(|| self.reward_sum / self.accepted as f64)
    }

    /// Every completion's mean reward.
    pub fn reward_mean(&self) -> Option<f64> {
        (self.completions > 0).then(|| self.all_reward_sum / self.completions as f64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SPEC: &str = "[job]\nname = \"rs\"\nteam = \"t\"\nmodel_line = \"l\"\n\
        [model]\npolicy = \"builtin:tiny-arith\"\n[data]\ntrain = \"dataset:d\"\n\
        [[verifiers]]\nplugin = \"math\"\n[budget]\nmax_steps = 2\n[optimizer]\nplugin = \"rejection-sampling\"\ngroup_size = 4\n";

    fn check(keys: &str, expected: Result<(Option<f64>, u32), (&str, &str)>) {
        let spec = JobSpec::from_toml(&format!("{SPEC}{keys}")).unwrap();
        let got = RejectionSamplingOptions::from_spec(&spec).map(|o| (o.threshold, o.keep));
        let expected =
            expected.map_err(|(field, message)| SpecError { field: field.into(), message: message.into() });
        match (&got, &expected) {
            (Err(got), Err(want)) => {
                assert_eq!(got.field, want.field, "{keys}: {got:?}");
                assert!(got.message.contains(&want.message), "{keys}: {got:?}");
            }
            _ => assert_eq!(got, expected, "{keys}"),
        }
    }

    #[test]
    fn keys_checked_and_named() {
        check("output = \"rs-out\"", Ok((None, 1)));
        check("output = \"rs-out\"\nthreshold = 0.5\nkeep = 4", Ok((Some(0.5), 4)));
        check("", Err(("optimizer.output", "missing")));
        check("output = \"../x\"", Err(("optimizer.output", "expected a dataset name")));
        check(
            "output = \"o\"\nkeep = 5",
            Err(("optimizer.keep", "expected 1 to optimizer.group_size (4), got 5")),
        );
        check("output = \"o\"\nkeep = 0", Err(("optimizer.keep", "got 0")));
        check(
            "output = \"o\"\nmin_acceptance_rate = 2.0",
            Err(("optimizer.min_acceptance_rate", "expected 0 to 1")),
        );
        check("output = \"o\"\nthreshhold = 1", Err(("optimizer.threshhold", "unknown")));
    }

    #[test]
    fn acceptance_by_threshold_or_pass() {
        let spec = JobSpec::from_toml(&format!("{SPEC}output = \"o\"")).unwrap();
        let mut options = RejectionSamplingOptions::from_spec(&spec).unwrap();
        assert!(options.accepts(0.0, true) && !options.accepts(1.0, false));
        options.threshold = Some(0.5);
        assert!(
            options.accepts(0.5, false) && !options.accepts(0.4, true) && !options.accepts(f64::NAN, true)
        );
    }

    #[test]
    fn what_a_rejection_sampling_job_cannot_say() {
        let mut spec = JobSpec::from_toml(&format!("{SPEC}output = \"o\"")).unwrap();
        assert!(rejection_sampling_problems(&spec).is_empty());
        spec.data.heldout = Some("dataset:h".into());
        spec.verifiers.clear();
        let fields: Vec<String> = rejection_sampling_problems(&spec).into_iter().map(|p| p.field).collect();
        assert_eq!(fields, ["verifiers", "data.heldout"]);
    }
}
