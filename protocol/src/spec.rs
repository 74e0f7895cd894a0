//! The job spec of design.md §1: what a team submits, as TOML or JSON.
//!
//! Every section refuses keys it does not know (`deny_unknown_fields`), except the plugin sections
//! (`[optimizer]`, `[[verifiers]]`, `[curriculum]`), whose extra keys belong to the plugin and are
//! checked by it when the job creates it. Every error names the field (`rollout.top_p`) and says
//! what was expected. Checks that need the plugin registry or the file system live with their
//! owners (the daemon at submit, the worker at start); here is everything a spec can say about
//! itself.

use std::fmt;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// A whole job spec.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct JobSpec {
    pub job: JobSection,
    pub model: ModelSection,
    pub data: DataSection,
    pub optimizer: OptimizerSection,
    #[serde(default)]
    pub verifiers: Vec<PluginSection>,
    #[serde(default)]
    pub curriculum: Option<CurriculumSection>,
    #[serde(default)]
    pub rollout: RolloutSection,
    pub budget: BudgetSection,
    #[serde(default)]
    pub resources: ResourcesSection,
    #[serde(default)]
    pub stop: StopSection,
    #[serde(default)]
    pub gates: GatesSection,
    #[serde(default)]
    pub publish: Option<PublishSection>,
    #[serde(default)]
    pub checkpoint: CheckpointSection,
    #[serde(default)]
    pub eval: EvalSection,
}

/// `[job]`: who runs it and what it publishes to.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct JobSection {
    pub name: String,
    pub team: String,
    #[serde(default)]
    pub priority: Priority,
    /// The model line a published checkpoint joins.
    pub model_line: String,
    /// Seeds data order, sampling and everything else random in the job.
    #[serde(default)]
    pub seed: u64,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "lowercase")]
pub enum Priority {
    Low,
    #[default]
    Normal,
    High,
}

/// `[model]`: the policy to train and the frozen reference.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct ModelSection {
    /// A Hugging Face directory, or `builtin:tiny-arith`.
    pub policy: String,
    /// `same` (a frozen copy of the starting policy) or a directory.
    #[serde(default = "same")]
    pub reference: String,
    #[serde(default)]
    pub dtype: Dtype,
}

fn same() -> String {
    "same".to_owned()
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "lowercase")]
pub enum Dtype {
    #[default]
    F32,
    Bf16,
}

/// `[data]`: JSONL files.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct DataSection {
    /// Prompts with references (online methods), `{prompt, completion}` (SFT) or
    /// `{prompt, chosen, rejected}` (DPO).
    #[cfg_attr(feature = "openapi", schema(value_type = String))]
    pub train: PathBuf,
    /// Prompts with references, scored greedily with the job's verifiers.
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<String>))]
    pub heldout: Option<PathBuf>,
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<String>))]
    pub canaries: Option<PathBuf>,
}

/// `[optimizer]`: the plugin, the trainer's own keys, and the plugin's keys (the rest).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct OptimizerSection {
    pub plugin: String,
    /// Completions per prompt.
    #[serde(default = "defaults::group_size")]
    pub group_size: u32,
    /// Updates per batch (μ).
    #[serde(default = "defaults::one")]
    pub mu: u32,
    #[serde(default = "defaults::lr")]
    pub lr: f64,
    #[serde(default)]
    pub lr_schedule: LrSchedule,
    #[serde(default)]
    pub warmup_steps: u64,
    #[serde(default)]
    pub weight_decay: f64,
    #[serde(default = "defaults::adam_beta1")]
    pub adam_beta1: f64,
    #[serde(default = "defaults::adam_beta2")]
    pub adam_beta2: f64,
    #[serde(default = "defaults::adam_eps")]
    pub adam_eps: f64,
    /// Clip the global gradient norm to this; 0 turns clipping off.
    #[serde(default = "defaults::one_f")]
    pub grad_clip: f64,
    /// Rows per forward/backward pass; a batch is split into micro-batches of this size.
    #[serde(default = "defaults::micro_batch_size")]
    pub micro_batch_size: u32,
    /// The plugin's own keys, passed to it as a JSON object.
    #[serde(flatten)]
    #[cfg_attr(feature = "openapi", schema(value_type = Object))]
    pub options: Map<String, Value>,
}

impl OptimizerSection {
    /// The trainer's keys: the plugin never sees them.
    pub const TRAINER_KEYS: [&'static str; 12] = [
        "plugin",
        "group_size",
        "mu",
        "lr",
        "lr_schedule",
        "warmup_steps",
        "weight_decay",
        "adam_beta1",
        "adam_beta2",
        "adam_eps",
        "grad_clip",
        "micro_batch_size",
    ];
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "lowercase")]
pub enum LrSchedule {
    #[default]
    Constant,
    Linear,
    Cosine,
}

/// `[[verifiers]]`: a plugin and its keys.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct PluginSection {
    /// `name` (newest loaded) or `name@version`.
    pub plugin: String,
    /// The verifier's weight in the reward.
    #[serde(default = "defaults::one_f")]
    pub weight: f64,
    #[serde(flatten)]
    #[cfg_attr(feature = "openapi", schema(value_type = Object))]
    pub options: Map<String, Value>,
}

/// `[curriculum]`: the curriculum plugin, its keys, and the shared curriculum the job starts from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct CurriculumSection {
    /// `name` (newest loaded) or `name@version`.
    pub plugin: String,
    /// A shared curriculum (`rlvrctl curriculum refresh NAME` writes its versions): the job pins
    /// its latest version at admission and its estimates start from that version's counts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(flatten)]
    #[cfg_attr(feature = "openapi", schema(value_type = Object))]
    pub options: Map<String, Value>,
}

impl CurriculumSection {
    /// The plugin's own keys (not `plugin`, not `name`), as the JSON object it is created with.
    pub fn plugin_config(&self) -> String {
        Value::Object(self.options.clone()).to_string()
    }
}

/// `[rollout]`: sampling.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct RolloutSection {
    #[serde(default = "defaults::max_new_tokens")]
    pub max_new_tokens: u32,
    #[serde(default = "defaults::one_f")]
    pub temperature: f64,
    #[serde(default = "defaults::one_f")]
    pub top_p: f64,
    /// 0 turns top-k off.
    #[serde(default)]
    pub top_k: u32,
    #[serde(default = "defaults::prompts_per_step")]
    pub prompts_per_step: u32,
    /// Generation stops at the first of these strings (kept in the completion).
    #[serde(default)]
    pub stop: Vec<String>,
    /// Dynamic sampling (DAPO): groups whose completions all pass or all fail teach nothing and
    /// are dropped; up to this many more rounds of prompts are sampled to fill the step with
    /// groups that do. 0 (the default) trains on every group.
    #[serde(default)]
    pub dynamic_sampling_rounds: u32,
}

impl Default for RolloutSection {
    fn default() -> Self {
        RolloutSection {
            max_new_tokens: defaults::max_new_tokens(),
            temperature: 1.0,
            top_p: 1.0,
            top_k: 0,
            prompts_per_step: defaults::prompts_per_step(),
            stop: Vec::new(),
            dynamic_sampling_rounds: 0,
        }
    }
}

/// `[budget]`: when the job ends.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct BudgetSection {
    pub max_steps: u64,
    #[serde(default)]
    pub max_generated_tokens: Option<u64>,
    #[serde(default)]
    pub max_wall_minutes: Option<f64>,
}

/// `[resources]`: what the job needs on each device.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct ResourcesSection {
    #[serde(default = "defaults::one")]
    pub devices: u32,
    #[serde(default)]
    pub memory_gb: f64,
}

impl Default for ResourcesSection {
    fn default() -> Self {
        ResourcesSection { devices: 1, memory_gb: 0.0 }
    }
}

/// `[stop]`: conditions checked every step (unset = not checked).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct StopSection {
    pub kl_max: Option<f64>,
    pub heldout_drop_max: Option<f64>,
    pub length_growth_max: Option<f64>,
    pub verifier_timeout_rate_max: Option<f64>,
    pub verifier_error_rate_max: Option<f64>,
}

/// `[gates]`: promotion criteria (design.md §6; unset = the daemon's default).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct GatesSection {
    pub heldout_gain_min: Option<f64>,
    pub canary_regressions_max: Option<u32>,
    pub kl_max: Option<f64>,
    pub length_ratio_max: Option<f64>,
    pub verifier_error_rate_max: Option<f64>,
    pub verifier_timeout_rate_max: Option<f64>,
    pub refuse_reward_hacking: Option<bool>,
}

/// `[publish]`: where a gated checkpoint goes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct PublishSection {
    #[cfg_attr(feature = "openapi", schema(value_type = String))]
    pub registry: PathBuf,
    #[serde(default)]
    pub webhook: Option<String>,
}

/// `[checkpoint]`: how often state is saved.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct CheckpointSection {
    /// A checkpoint every this many steps, and always at the end.
    #[serde(default = "defaults::checkpoint_every")]
    pub every_steps: u64,
}

impl Default for CheckpointSection {
    fn default() -> Self {
        CheckpointSection { every_steps: defaults::checkpoint_every() }
    }
}

/// `[eval]`: held-out scoring during training.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct EvalSection {
    /// Score the held-out set every this many steps; 0 = only before the first step and at the end.
    #[serde(default)]
    pub every_steps: u64,
    /// At most this many held-out prompts (the first ones); unset = all.
    #[serde(default)]
    pub max_prompts: Option<u32>,
}

mod defaults {
    pub fn group_size() -> u32 {
        8
    }
    pub fn one() -> u32 {
        1
    }
    pub fn one_f() -> f64 {
        1.0
    }
    pub fn lr() -> f64 {
        1e-6
    }
    pub fn adam_beta1() -> f64 {
        0.9
    }
    pub fn adam_beta2() -> f64 {
        0.999
    }
    pub fn adam_eps() -> f64 {
        1e-8
    }
    pub fn micro_batch_size() -> u32 {
        8
    }
    pub fn max_new_tokens() -> u32 {
        256
    }
    pub fn prompts_per_step() -> u32 {
        8
    }
    pub fn checkpoint_every() -> u64 {
        10
    }
}

/// One thing wrong with a spec: the field (dotted path, `[i]` for list items) and what was expected.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SpecError {
    pub field: String,
    pub message: String,
}

impl fmt::Display for SpecError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.field.is_empty() {
            write!(f, "{}", self.message)
        } else {
            write!(f, "{}: {}", self.field, self.message)
        }
    }
}

impl std::error::Error for SpecError {}

/// Every problem of a spec at once.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpecErrors(pub Vec<SpecError>);

impl fmt::Display for SpecErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, error) in self.0.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            write!(f, "{error}")?;
        }
        Ok(())
    }
}

impl std::error::Error for SpecErrors {}

impl JobSpec {
    /// Parses TOML, naming the field of a type error.
    pub fn from_toml(text: &str) -> Result<JobSpec, SpecError> {
        let deserializer = toml::Deserializer::parse(text).map_err(|error| SpecError {
            field: String::new(),
            message: format!("not valid TOML: {}", error.message()),
        })?;
        serde_path_to_error::deserialize(deserializer).map_err(|error| {
            let field = clean_path(&error.path().to_string());
            let message = error.into_inner().message().to_owned();
            SpecError { field: with_missing_field(field, &message), message }
        })
    }

    /// Parses JSON, naming the field of a type error.
    pub fn from_json(text: &str) -> Result<JobSpec, SpecError> {
        let mut deserializer = serde_json::Deserializer::from_str(text);
        serde_path_to_error::deserialize(&mut deserializer).map_err(|error| {
            let field = clean_path(&error.path().to_string());
            let inner = error.into_inner();
            let message = if inner.is_syntax() || inner.is_eof() {
                format!("not valid JSON: {inner}")
            } else {
                strip_position(&inner.to_string())
            };
            SpecError { field: with_missing_field(field, &message), message }
        })
    }

    /// Parses and validates a spec file, by its extension (`.json`, otherwise TOML).
    pub fn parse_file_text(path: &std::path::Path, text: &str) -> Result<JobSpec, SpecErrors> {
        let spec = if path.extension().is_some_and(|ext| ext == "json") {
            JobSpec::from_json(text)
        } else {
            JobSpec::from_toml(text)
        }
        .map_err(|error| SpecErrors(vec![error]))?;
        spec.validate()?;
        Ok(spec)
    }

    /// Every range and consistency check a spec can make about itself.
    pub fn validate(&self) -> Result<(), SpecErrors> {
        let mut errors = Vec::new();
        let mut check = |ok: bool, field: &str, message: String| {
            if !ok {
                errors.push(SpecError { field: field.to_owned(), message });
            }
        };
        let name_ok = |s: &str| {
            !s.is_empty()
                && s.len() <= 128
                && s.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        };
        check(
            name_ok(&self.job.name),
            "job.name",
            format!("expected 1–128 of [A-Za-z0-9._-], got {:?}", self.job.name),
        );
        check(
            name_ok(&self.job.team),
            "job.team",
            format!("expected 1–128 of [A-Za-z0-9._-], got {:?}", self.job.team),
        );
        check(
            name_ok(&self.job.model_line) && !self.job.model_line.starts_with('.'),
            "job.model_line",
            format!("expected 1–128 of [A-Za-z0-9._-], not starting with '.', got {:?}", self.job.model_line),
        );
        check(
            !self.model.policy.is_empty(),
            "model.policy",
            "expected a directory or builtin:tiny-arith".into(),
        );
        check(
            self.optimizer.group_size >= 1 && self.optimizer.group_size <= 1024,
            "optimizer.group_size",
            format!("expected 1 to 1024, got {}", self.optimizer.group_size),
        );
        check(
            (1..=64).contains(&self.optimizer.mu),
            "optimizer.mu",
            format!("expected 1 to 64, got {}", self.optimizer.mu),
        );
        check(
            self.optimizer.lr.is_finite() && self.optimizer.lr > 0.0 && self.optimizer.lr <= 1.0,
            "optimizer.lr",
            format!("expected a number in (0, 1], got {}", self.optimizer.lr),
        );
        for (field, value) in [
            ("optimizer.adam_beta1", self.optimizer.adam_beta1),
            ("optimizer.adam_beta2", self.optimizer.adam_beta2),
        ] {
            check((0.0..1.0).contains(&value), field, format!("expected a number in [0, 1), got {value}"));
        }
        check(
            self.optimizer.adam_eps.is_finite() && self.optimizer.adam_eps > 0.0,
            "optimizer.adam_eps",
            format!("expected a positive number, got {}", self.optimizer.adam_eps),
        );
        check(
            self.optimizer.weight_decay.is_finite() && (0.0..=1.0).contains(&self.optimizer.weight_decay),
            "optimizer.weight_decay",
            format!("expected a number in [0, 1], got {}", self.optimizer.weight_decay),
        );
        check(
            self.optimizer.grad_clip.is_finite() && self.optimizer.grad_clip >= 0.0,
            "optimizer.grad_clip",
            format!("expected a number ≥ 0 (0 = off), got {}", self.optimizer.grad_clip),
        );
        check(
            self.optimizer.micro_batch_size >= 1,
            "optimizer.micro_batch_size",
            format!("expected at least 1, got {}", self.optimizer.micro_batch_size),
        );
        check(
            self.optimizer.warmup_steps <= self.budget.max_steps,
            "optimizer.warmup_steps",
            format!(
                "expected at most budget.max_steps ({}), got {}",
                self.budget.max_steps, self.optimizer.warmup_steps
            ),
        );
        for (i, verifier) in self.verifiers.iter().enumerate() {
            check(
                verifier.weight.is_finite() && verifier.weight >= 0.0,
                &format!("verifiers[{i}].weight"),
                format!("expected a number ≥ 0, got {}", verifier.weight),
            );
        }
        let rollout = &self.rollout;
        check(
            (1..=32768).contains(&rollout.max_new_tokens),
            "rollout.max_new_tokens",
            format!("expected 1 to 32768, got {}", rollout.max_new_tokens),
        );
        check(
            rollout.temperature.is_finite() && (0.0..=10.0).contains(&rollout.temperature),
            "rollout.temperature",
            format!("expected a number in [0, 10] (0 = greedy), got {}", rollout.temperature),
        );
        check(
            rollout.top_p.is_finite() && rollout.top_p > 0.0 && rollout.top_p <= 1.0,
            "rollout.top_p",
            format!("expected a number in (0, 1], got {}", rollout.top_p),
        );
        check(
            (1..=4096).contains(&rollout.prompts_per_step),
            "rollout.prompts_per_step",
            format!("expected 1 to 4096, got {}", rollout.prompts_per_step),
        );
        check(
            rollout.dynamic_sampling_rounds <= 16,
            "rollout.dynamic_sampling_rounds",
            format!("expected 0 to 16 extra rounds, got {}", rollout.dynamic_sampling_rounds),
        );
        check(
            rollout.stop.iter().all(|s| !s.is_empty()),
            "rollout.stop",
            "expected non-empty strings".into(),
        );
        let stop = &self.stop;
        let in_unit = |value: Option<f64>| value.is_none_or(|v| v.is_finite() && (0.0..=1.0).contains(&v));
        check(
            in_unit(stop.heldout_drop_max),
            "stop.heldout_drop_max",
            format!(
                "expected a held-out score drop in [0, 1], got {}",
                stop.heldout_drop_max.unwrap_or_default()
            ),
        );
        check(
            stop.length_growth_max.is_none_or(|v| v.is_finite() && v > 1.0),
            "stop.length_growth_max",
            format!("expected a factor > 1, got {}", stop.length_growth_max.unwrap_or_default()),
        );
        if let Some(curriculum) = &self.curriculum {
            check(
                curriculum.name.is_none() || !curriculum.options.contains_key("history"),
                "curriculum.history",
                "the pinned version of curriculum.name seeds the estimates; give one or the other".into(),
            );
        }
        let gates = &self.gates;
        check(
            gates.heldout_gain_min.is_none_or(|v| v.is_finite() && (-1.0..=1.0).contains(&v)),
            "gates.heldout_gain_min",
            format!(
                "expected a held-out score change in [-1, 1], got {}",
                gates.heldout_gain_min.unwrap_or_default()
            ),
        );
        for (field, value) in [("stop.kl_max", stop.kl_max), ("gates.kl_max", gates.kl_max)] {
            check(
                value.is_none_or(|v| v.is_finite() && v > 0.0),
                field,
                format!("expected a number > 0, got {}", value.unwrap_or_default()),
            );
        }
        check(
            gates.length_ratio_max.is_none_or(|v| v.is_finite() && v > 0.0),
            "gates.length_ratio_max",
            format!("expected a ratio > 0, got {}", gates.length_ratio_max.unwrap_or_default()),
        );
        for (field, value) in [
            ("stop.verifier_timeout_rate_max", stop.verifier_timeout_rate_max),
            ("stop.verifier_error_rate_max", stop.verifier_error_rate_max),
            ("gates.verifier_timeout_rate_max", gates.verifier_timeout_rate_max),
            ("gates.verifier_error_rate_max", gates.verifier_error_rate_max),
        ] {
            check(
                in_unit(value),
                field,
                format!("expected a rate in [0, 1], got {}", value.unwrap_or_default()),
            );
        }
        check(
            (1..=10_000_000).contains(&self.budget.max_steps),
            "budget.max_steps",
            format!("expected 1 to 10000000, got {}", self.budget.max_steps),
        );
        check(
            self.budget.max_wall_minutes.is_none_or(|m| m.is_finite() && m > 0.0),
            "budget.max_wall_minutes",
            "expected a positive number of minutes".into(),
        );
        check(
            self.budget.max_generated_tokens.is_none_or(|t| t > 0),
            "budget.max_generated_tokens",
            "expected a positive number of tokens".into(),
        );
        check(
            (1..=64).contains(&self.resources.devices),
            "resources.devices",
            format!("expected 1 to 64, got {}", self.resources.devices),
        );
        check(
            self.resources.memory_gb.is_finite() && self.resources.memory_gb >= 0.0,
            "resources.memory_gb",
            format!("expected a number ≥ 0, got {}", self.resources.memory_gb),
        );
        check(
            self.checkpoint.every_steps >= 1,
            "checkpoint.every_steps",
            format!("expected at least 1, got {}", self.checkpoint.every_steps),
        );
        if errors.is_empty() { Ok(()) } else { Err(SpecErrors(errors)) }
    }

    /// The optimizer plugin's own keys, as the JSON object it is created with.
    pub fn optimizer_plugin_config(&self) -> String {
        Value::Object(self.optimizer.options.clone()).to_string()
    }
}

impl PluginSection {
    /// The plugin's own keys (not `plugin`, not `weight`), as the JSON object it is created with.
    pub fn plugin_config(&self) -> String {
        Value::Object(self.options.clone()).to_string()
    }
}

/// serde_path_to_error writes `?` for an unknown position and `.` at the root.
fn clean_path(path: &str) -> String {
    if path == "." || path == "?" { String::new() } else { path.to_owned() }
}

/// serde reports a missing field at its parent's path: name the field itself.
fn with_missing_field(path: String, message: &str) -> String {
    let missing = message.strip_prefix("missing field `").and_then(|rest| rest.split('`').next());
    match missing {
        Some(name) if path.is_empty() => name.to_owned(),
        Some(name) => format!("{path}.{name}"),
        None => path,
    }
}

/// serde_json appends "at line L column C"; the field path already says where.
fn strip_position(message: &str) -> String {
    match message.rfind(" at line ") {
        Some(index) => message[..index].to_owned(),
        None => message.to_owned(),
    }
}

/// The built-in model's source name (`model.policy`): a small Llama-family model made from a
/// seed, for the demo and the tests.
pub const BUILTIN_MODEL: &str = "builtin:tiny-arith";

/// The seed of a built-in model source, `builtin:tiny-arith` (seed 0) or
/// `builtin:tiny-arith?seed=N`; `None` for anything else.
pub fn builtin_seed(source: &str) -> Option<u64> {
    let rest = source.strip_prefix(BUILTIN_MODEL)?;
    if rest.is_empty() {
        return Some(0);
    }
    rest.strip_prefix("?seed=")?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    const MINIMAL: &str = r#"
[job]
name = "arith"
team = "math"
model_line = "tiny"
[model]
policy = "builtin:tiny-arith"
[data]
train = "train.jsonl"
[optimizer]
plugin = "grpo"
clip_eps_high = 0.28
[[verifiers]]
plugin = "math"
[budget]
max_steps = 10
"#;

    #[test]
    fn a_minimal_spec_gets_the_documented_defaults_and_keeps_plugin_keys_apart() {
        let spec = JobSpec::from_toml(MINIMAL).unwrap();
        spec.validate().unwrap();
        assert_eq!(spec.optimizer.group_size, 8);
        assert_eq!(spec.optimizer.mu, 1);
        assert_eq!(spec.rollout.max_new_tokens, 256);
        assert_eq!(spec.model.reference, "same");
        assert_eq!(spec.optimizer_plugin_config(), r#"{"clip_eps_high":0.28}"#);
        assert_eq!(spec.verifiers[0].plugin_config(), "{}");
        assert_eq!(spec.verifiers[0].weight, 1.0);
    }

    #[test]
    fn errors_name_the_field() {
        let cases: &[(&str, &str, &str)] = &[
            ("[rollout]\ntop_p = 2.0\n", "rollout.top_p", "expected a number in (0, 1]"),
            ("[rollout]\ntop_q = 2.0\n", "rollout.top_q", "unknown field `top_q`"),
            ("[rollout]\nmax_new_tokens = -3\n", "rollout.max_new_tokens", "invalid value"),
            ("[rollout]\nmax_new_tokens = \"many\"\n", "rollout.max_new_tokens", "invalid type"),
            ("[resources]\ndevices = 0\n", "resources.devices", "expected 1 to 64"),
            ("[stop]\nkl = 1.0\n", "stop.kl", "unknown field `kl`"),
        ];
        for (extra, field, message) in cases {
            let text = format!("{MINIMAL}{extra}");
            let error = match JobSpec::from_toml(&text) {
                Err(error) => error,
                Ok(spec) => spec.validate().unwrap_err().0.remove(0),
            };
            assert_eq!(error.field, *field, "{extra}: {error}");
            assert!(error.message.contains(message), "{extra}: {error}");
        }
    }

    #[test]
    fn json_and_toml_agree() {
        let spec = JobSpec::from_toml(MINIMAL).unwrap();
        let json = serde_json::to_string(&spec).unwrap();
        assert_eq!(JobSpec::from_json(&json).unwrap(), spec);
        let error = JobSpec::from_json(r#"{"job": 3}"#).unwrap_err();
        assert_eq!(error.field, "job", "{error}");
        assert!(JobSpec::from_json("{").unwrap_err().message.starts_with("not valid JSON"));
    }
}
