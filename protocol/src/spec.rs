//! The job spec of design.md §1: what a team submits, as TOML or JSON.
//!
//! Every section refuses keys it does not know (`deny_unknown_fields`), except the plugin sections
//! (`[optimizer]`, `[[verifiers]]`, `[curriculum]`), whose extra keys belong to the plugin and are
//! checked by it when the job creates it. Every error names the field (`rollout.top_p`) and says
//! what was expected. Checks that need the plugin registry or the file system live with their
//! owners (the daemon at submit, the worker at start); here is everything a spec can say about
//! itself.
//!
//! The numeric ranges are tables of rules (`RULES`, `LORA_RULES`, `VERIFIER_RULES`), one row per
//! field.

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
    /// `[reward]`: a formula over the graders' names instead of their weighted sum.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reward: Option<RewardSection>,
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
    /// `[engine]`: the native worker (the default) or an existing distributed engine.
    #[serde(default, skip_serializing_if = "is_native")]
    pub engine: crate::engine::EngineSection,
    /// `[tracking]`: an MLflow tracking server the daemon logs the job's run to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tracking: Option<TrackingSection>,
    /// `[env]`: the environment a multi-turn job's episodes are played against.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub env: Option<crate::env::EnvSection>,
}

fn is_native(engine: &crate::engine::EngineSection) -> bool {
    *engine == crate::engine::EngineSection::default()
}

/// `[job]`: who runs it and what it publishes to.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct JobSection {
    /// The job's name: in lists, events, its report and the published manifest.
    pub name: String,
    /// The team the job runs for; left out, the submitting token's ([`JobSpec::fill_team`]).
    #[serde(default)]
    pub team: String,
    /// `low`, `normal` or `high`: the order the scheduler admits jobs in (before fair share), and
    /// which running jobs a job that cannot be admitted may preempt (lower-priority ones).
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

impl Priority {
    /// `low`, `normal` or `high`: how specs, the job record and the API write it.
    pub fn as_str(self) -> &'static str {
        match self {
            Priority::Low => "low",
            Priority::Normal => "normal",
            Priority::High => "high",
        }
    }
}

impl std::fmt::Display for Priority {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for Priority {
    type Err = String;

    fn from_str(text: &str) -> Result<Priority, String> {
        [Priority::Low, Priority::Normal, Priority::High]
            .into_iter()
            .find(|priority| priority.as_str() == text)
            .ok_or_else(|| format!("expected low, normal or high, got {text:?}"))
    }
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
    /// The weights' and activations' dtype. With `bf16` the optimizer keeps f32 master weights,
    /// f32 moments and f32 gradient sums (mixed precision), and checkpoints the master weights
    /// in `optimizer.safetensors`; the checkpoint's `model/` holds the bf16 weights. On CPU
    /// bf16 works but is slower than f32 unless the CPU has bf16 matrix instructions.
    #[serde(default)]
    pub dtype: Dtype,
    /// Lets CUDA run f32 matrix products on TF32 tensor cores (10-bit mantissa inputs, f32
    /// sums): faster, less precise. For `dtype = "f32"` only (bf16 products are bf16 already);
    /// on a CPU it changes nothing.
    #[serde(default)]
    pub tf32: bool,
    /// Trains low-rank adapters instead of the weights: only the adapters (and a value head)
    /// train, the reference is the base with the adapters off, and checkpoints hold the
    /// adapters as a PEFT adapter directory.
    #[serde(default)]
    pub lora: Option<LoraSection>,
    /// Keeps only each decoder layer's input during a training forward pass and recomputes the
    /// layer in the backward pass: the same gradients for about one more forward pass of compute,
    /// and activation memory of one layer instead of all of them.
    #[serde(default)]
    pub activation_checkpointing: bool,
}

/// `[model] lora`: LoRA adapters (Hu et al., 2021, "LoRA: Low-Rank Adaptation of Large Language
/// Models"), as Hugging Face PEFT defines them: each targeted linear layer computes
/// `W·x + (alpha / rank)·B·A·dropout(x)` with `A` `[rank × in]`, `B` `[out × rank]`, B zero at the
/// start so training starts from the base model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct LoraSection {
    /// The adapters' rank r.
    pub rank: u32,
    /// The scale's numerator: updates are scaled by `alpha / rank`. Defaults to the rank (scale 1).
    #[serde(default)]
    pub alpha: Option<f64>,
    /// Dropout on the adapters' input during training passes.
    #[serde(default)]
    pub dropout: f64,
    /// Which linear layers get adapters, by their Hugging Face names; all seven by default.
    #[serde(default = "LoraTarget::all")]
    pub target_modules: Vec<LoraTarget>,
}

impl LoraSection {
    /// `alpha`, or the rank when unset.
    pub fn alpha(&self) -> f64 {
        self.alpha.unwrap_or(f64::from(self.rank))
    }
}

/// A linear layer of a Llama-family decoder layer that LoRA can adapt, named as in Hugging Face.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum LoraTarget {
    QProj,
    KProj,
    VProj,
    OProj,
    GateProj,
    UpProj,
    DownProj,
}

impl LoraTarget {
    /// Every target, in a decoder layer's order.
    pub const ALL: [LoraTarget; 7] = [
        LoraTarget::QProj,
        LoraTarget::KProj,
        LoraTarget::VProj,
        LoraTarget::OProj,
        LoraTarget::GateProj,
        LoraTarget::UpProj,
        LoraTarget::DownProj,
    ];

    fn all() -> Vec<LoraTarget> {
        Self::ALL.to_vec()
    }

    /// The module's Hugging Face name: `q_proj`.
    pub fn name(self) -> &'static str {
        match self {
            LoraTarget::QProj => "q_proj",
            LoraTarget::KProj => "k_proj",
            LoraTarget::VProj => "v_proj",
            LoraTarget::OProj => "o_proj",
            LoraTarget::GateProj => "gate_proj",
            LoraTarget::UpProj => "up_proj",
            LoraTarget::DownProj => "down_proj",
        }
    }

    /// The target of a Hugging Face module name.
    pub fn from_name(name: &str) -> Option<LoraTarget> {
        Self::ALL.into_iter().find(|target| target.name() == name)
    }
}

fn same() -> String {
    "same".to_owned()
}

/// `model.dtype`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "lowercase")]
pub enum Dtype {
    /// Everything in f32.
    #[default]
    F32,
    /// bf16 weights and activations; the optimizer's state in f32 (mixed precision).
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
    /// Prompts with references (JSONL) the gates score the candidate and its baseline on: one the
    /// baseline passes and the candidate fails is a regression (`gates.canary_regressions_max`).
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<String>))]
    pub canaries: Option<PathBuf>,
}

/// `[optimizer]`: the plugin, the trainer's own keys, and the plugin's keys (the rest).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct OptimizerSection {
    /// The optimizer plugin: `name` (the newest loaded version) or `name@version`.
    pub plugin: String,
    /// Completions per prompt.
    #[serde(default = "defaults::group_size")]
    pub group_size: u32,
    /// Updates per batch (μ).
    #[serde(default = "defaults::one")]
    pub mu: u32,
    /// AdamW's learning rate: the peak, after `warmup_steps`, of `lr_schedule`.
    #[serde(default = "defaults::lr")]
    pub lr: f64,
    /// After the warm-up: `constant` at `lr`, or from `lr` down to 0 at `budget.max_steps`,
    /// `linear` or `cosine`.
    #[serde(default)]
    pub lr_schedule: LrSchedule,
    /// Steps over which the learning rate rises linearly to `lr` (0: none).
    #[serde(default)]
    pub warmup_steps: u64,
    /// AdamW's decoupled weight decay.
    #[serde(default)]
    pub weight_decay: f64,
    /// AdamW's β₁: the decay of its first moment (the gradients' running mean).
    #[serde(default = "defaults::adam_beta1")]
    pub adam_beta1: f64,
    /// AdamW's β₂: the decay of its second moment (the squared gradients' running mean).
    #[serde(default = "defaults::adam_beta2")]
    pub adam_beta2: f64,
    /// AdamW's ε, added to the second moment's square root.
    #[serde(default = "defaults::adam_eps")]
    pub adam_eps: f64,
    /// Clip the global gradient norm to this; 0 turns clipping off.
    #[serde(default = "defaults::one_f")]
    pub grad_clip: f64,
    /// Rows per forward/backward pass; a batch is split into micro-batches of this size.
    #[serde(default = "defaults::micro_batch_size")]
    pub micro_batch_size: u32,
    /// At most this many tokens per forward/backward pass (rows × the longest prompt plus the
    /// longest completion among them, as the pass pads them), on top of `micro_batch_size`:
    /// long completions get small micro-batches and short ones large, so a step's peak memory
    /// follows its tokens, not its longest row times `micro_batch_size`. Unset: rows only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub micro_batch_tokens: Option<u64>,
    /// The plugin's own keys, passed to it as a JSON object.
    #[serde(flatten)]
    #[cfg_attr(feature = "openapi", schema(value_type = Object))]
    pub options: Map<String, Value>,
}

impl OptimizerSection {
    /// The trainer's keys: the plugin never sees them.
    pub const TRAINER_KEYS: [&'static str; 13] = [
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
        "micro_batch_tokens",
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

/// `[[verifiers]]`: a grader — a plugin and its keys.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct PluginSection {
    /// `name` (newest loaded) or `name@version`.
    pub plugin: String,
    /// The grader's name in `[reward] formula` and in the reward's components; the plugin's name
    /// by default. Two graders of one plugin need a name each.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// The verifier's weight in the reward (a weighted sum when there is no `[reward] formula`).
    #[serde(default = "defaults::one_f")]
    pub weight: f64,
    #[serde(flatten)]
    #[cfg_attr(feature = "openapi", schema(value_type = Object))]
    pub options: Map<String, Value>,
}

/// The built-in grader that scores with a learned reward model on the job's device (not a
/// plugin library): `[[verifiers]] plugin = "reward-model"`.
pub const REWARD_MODEL_GRADER: &str = "reward-model";

/// `[reward]`: how the graders' scores make the reward.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct RewardSection {
    /// A formula over the graders' names (`0.7 * math + 0.3 * format`, `min(a, b)`,
    /// `format > 0 ? math : 0`): see `formula`'s grammar. A completion passes when every grader
    /// the formula reads passed it.
    pub formula: String,
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
    /// New tokens a completion may have; one that reaches it without its EOS is cut.
    #[serde(default = "defaults::max_new_tokens")]
    pub max_new_tokens: u32,
    /// The sampling temperature of the rollouts (0: greedy). Held-out is always scored greedily.
    #[serde(default = "defaults::one_f")]
    pub temperature: f64,
    /// Nucleus sampling: each token from the smallest set of likeliest tokens holding this much
    /// probability (1: all of them).
    #[serde(default = "defaults::one_f")]
    pub top_p: f64,
    /// 0 turns top-k off.
    #[serde(default)]
    pub top_k: u32,
    /// Prompts a step samples from (each `optimizer.group_size` times in an online job), or the
    /// records a step trains on in an offline one (SFT, DPO).
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
    /// What generates the completions: rlvr's own sampler (the default, which a resume repeats
    /// to the bit) or a vLLM server the worker starts and syncs after every update.
    #[serde(default, skip_serializing_if = "RolloutEngine::is_native")]
    pub engine: RolloutEngine,
    /// `engine = "vllm"`: the sync check. The mean over a step's sampled tokens of
    /// |trainer's − vLLM's log-probability| above which the step fails instead of training on
    /// samples of weights other than the trainer's (a sync that did not take). In f32 on a CPU a
    /// synced server is within ~1e-5; bf16 kernels differ by ~1e-2.
    #[serde(default = "defaults::max_logprob_gap", skip_serializing_if = "defaults::is_max_logprob_gap")]
    pub max_logprob_gap: f64,
    /// `engine = "vllm"`: truncated importance sampling. Each token's advantage is weighted by
    /// min(exp(trainer's − vLLM's log-probability), this cap), correcting for what is left of
    /// the mismatch (verl's TIS, default C = 2); 0 turns it off.
    #[serde(default = "defaults::importance_cap", skip_serializing_if = "defaults::is_importance_cap")]
    pub importance_cap: f64,
    /// `engine = "vllm"` on a device of its own (`resources.devices = 2`): how many updates the
    /// weights that sample a step may be behind the trainer's. 0 (the default): every step samples
    /// the weights of the update before it. 1: the server samples step t+1's prompts while step t
    /// updates, from the weights before that update, and the ratio's denominator is those
    /// weights' log-probabilities (the trainer keeps a copy of them to compute and check them).
    #[serde(default, skip_serializing_if = "defaults::is_zero")]
    pub off_policy_steps: u32,
    /// Sampling runs to `max_new_tokens` whatever the model samples (an end-of-sequence token is
    /// kept as any other): a benchmark's fixed number of tokens per step. Held-out scoring still
    /// ends at EOS. Off by default.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub ignore_eos: bool,
}

/// `rollout.engine`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "lowercase")]
pub enum RolloutEngine {
    /// The worker's own batched sampler (libtorch): seeded, bit-exact on resume.
    #[default]
    Native,
    /// vLLM's OpenAI-compatible server, a child of the worker, its weights reloaded after each
    /// update; resumes exactly up to sampling.
    Vllm,
}

impl RolloutEngine {
    pub fn is_native(&self) -> bool {
        *self == RolloutEngine::Native
    }

    /// The name the spec writes.
    pub fn name(self) -> &'static str {
        match self {
            RolloutEngine::Native => "native",
            RolloutEngine::Vllm => "vllm",
        }
    }
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
            engine: RolloutEngine::Native,
            max_logprob_gap: defaults::max_logprob_gap(),
            importance_cap: defaults::importance_cap(),
            off_policy_steps: 0,
            ignore_eos: false,
        }
    }
}

/// `[budget]`: when the job ends.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct BudgetSection {
    /// Steps to train. 0: an evaluation — the policy as it is (a line's version, or a Tinker
    /// client's saved adapter, `model.policy = "tinker://…"`) is scored, judged by the line's
    /// gates and published on a pass.
    pub max_steps: u64,
    /// Training ends once the rollouts have generated this many tokens; the job is then scored
    /// and gated as at `max_steps`.
    #[serde(default)]
    pub max_generated_tokens: Option<u64>,
    /// Training ends after this many minutes of it; the job is then scored and gated as at
    /// `max_steps`.
    #[serde(default)]
    pub max_wall_minutes: Option<f64>,
}

/// `[resources]`: what the job needs on each device.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct ResourcesSection {
    /// Devices on each node: the native worker's one, or an `[engine]` job's ranks per node.
    #[serde(default = "defaults::one")]
    pub devices: u32,
    /// Nodes an `[engine]` job's ranks span, `devices` on each (`engine.launcher = "ray"`: the
    /// cluster places them all at once, or not at all). 1: this host, or one node of the cluster.
    #[serde(default = "defaults::one", skip_serializing_if = "defaults::is_one")]
    pub nodes: u32,
    /// Memory the job needs on each device at its peak, in GB (GiB): what it holds all along plus
    /// its largest phase. Unset (0): submit fills it from the job's memory estimate
    /// (`rlvrctl estimate`), or takes whole devices when it cannot estimate.
    #[serde(default)]
    pub memory_gb: f64,
    /// Of `memory_gb`, what the job holds between its device phases (weights, reference,
    /// optimizer state); the rest it needs only while a phase runs. Jobs sharing a device need
    /// the sum of their resident parts plus the largest of their phases (a device serves one
    /// phase at a time). Unset: all of `memory_gb`, or the estimate's when submit fills it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resident_gb: Option<f64>,
}

impl ResourcesSection {
    /// An `[engine]` job's processes: `devices` on each of `nodes`.
    pub fn ranks(&self) -> u32 {
        self.devices.saturating_mul(self.nodes)
    }

    /// `resident_gb`, or all of `memory_gb`.
    pub fn resident(&self) -> f64 {
        self.resident_gb.unwrap_or(self.memory_gb)
    }
}

impl Default for ResourcesSection {
    fn default() -> Self {
        ResourcesSection { devices: 1, nodes: 1, memory_gb: 0.0, resident_gb: None }
    }
}

/// `[stop]`: conditions checked every step (unset = not checked).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct StopSection {
    /// Stop (failed) when a step's KL to the reference exceeds this.
    pub kl_max: Option<f64>,
    /// Stop when the held-out score fell this much below the start while the training reward
    /// rose.
    pub heldout_drop_max: Option<f64>,
    /// Stop when the mean completion length of the last 5 steps over the first 5 exceeds this.
    pub length_growth_max: Option<f64>,
    /// Stop when verifier timeouts over the last 5 steps' completions exceed this rate.
    pub verifier_timeout_rate_max: Option<f64>,
    /// Stop when verifier errors over the last 5 steps' completions exceed this rate.
    pub verifier_error_rate_max: Option<f64>,
}

/// `[gates]`: promotion criteria (design.md §6; unset = the daemon's default).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct GatesSection {
    /// The least held-out gain over the baseline: the lower end of the 95% paired bootstrap
    /// interval of the accuracy difference must reach it (unset: 0.01).
    pub heldout_gain_min: Option<f64>,
    /// The most canaries the baseline passed and the candidate fails (unset: 0).
    pub canary_regressions_max: Option<u32>,
    /// The most mean KL to the reference over the last 5 training steps (unset: measured and
    /// shown only).
    pub kl_max: Option<f64>,
    /// The most mean held-out completion length, candidate over baseline (unset: 2).
    pub length_ratio_max: Option<f64>,
    /// The most verifier errors per call in the candidate's evaluation (unset: 0.05).
    pub verifier_error_rate_max: Option<f64>,
    /// The most verifier timeouts per call in the candidate's evaluation (unset: 0.05).
    pub verifier_timeout_rate_max: Option<f64>,
    /// Refuse a candidate whose training reward rose (last 5 steps over the first 5) while its
    /// held-out accuracy fell (unset: true).
    pub refuse_reward_hacking: Option<bool>,
}

/// One criterion of [`GatesSection`] seen as a number, and which way is stricter: what a model
/// line's policy floor needs to compare a job's gates with the line's.
struct GateBound {
    key: &'static str,
    /// `true`: a larger value is stricter (a minimum); `false`: a smaller one is (a maximum).
    larger_is_stricter: bool,
    get: fn(&GatesSection) -> Option<f64>,
    set: fn(&mut GatesSection, f64),
}

const GATE_BOUNDS: &[GateBound] = &[
    GateBound {
        key: "heldout_gain_min",
        larger_is_stricter: true,
        get: |g| g.heldout_gain_min,
        set: |g, x| g.heldout_gain_min = Some(x),
    },
    GateBound {
        key: "canary_regressions_max",
        larger_is_stricter: false,
        get: |g| g.canary_regressions_max.map(f64::from),
        set: |g, x| g.canary_regressions_max = Some(x as u32),
    },
    GateBound { key: "kl_max", larger_is_stricter: false, get: |g| g.kl_max, set: |g, x| g.kl_max = Some(x) },
    GateBound {
        key: "length_ratio_max",
        larger_is_stricter: false,
        get: |g| g.length_ratio_max,
        set: |g, x| g.length_ratio_max = Some(x),
    },
    GateBound {
        key: "verifier_error_rate_max",
        larger_is_stricter: false,
        get: |g| g.verifier_error_rate_max,
        set: |g, x| g.verifier_error_rate_max = Some(x),
    },
    GateBound {
        key: "verifier_timeout_rate_max",
        larger_is_stricter: false,
        get: |g| g.verifier_timeout_rate_max,
        set: |g, x| g.verifier_timeout_rate_max = Some(x),
    },
    GateBound {
        key: "refuse_reward_hacking",
        larger_is_stricter: true,
        get: |g| g.refuse_reward_hacking.map(|b| if b { 1.0 } else { 0.0 }),
        set: |g, x| g.refuse_reward_hacking = Some(x > 0.5),
    },
];

impl GateBound {
    /// Whether `job` is looser than `floor`.
    fn looser(&self, job: f64, floor: f64) -> bool {
        if self.larger_is_stricter { job < floor } else { job > floor }
    }
}

impl GatesSection {
    /// The criteria a model line's `policy` floor forbids this job's `[gates]` to set: each as
    /// `(field, message)`. A job may leave a criterion unset (it then takes the floor) or tighten
    /// it, never loosen it.
    pub fn loosened_against(&self, policy: &GatesSection) -> Vec<SpecError> {
        GATE_BOUNDS
            .iter()
            .filter_map(|bound| {
                let (job, floor) = ((bound.get)(self)?, (bound.get)(policy)?);
                bound.looser(job, floor).then(|| SpecError {
                    field: format!("gates.{}", bound.key),
                    message: format!(
                        "the model line's policy sets {} {}; a job may tighten the line's gates, not loosen them",
                        if bound.larger_is_stricter { "at least" } else { "at most" },
                        show_bound(bound.key, floor)
                    ),
                })
            })
            .collect()
    }

    /// These gates held to `policy`: each criterion the stricter of the two, the policy's where
    /// the job sets none. What the gates judge at publish, so a policy tightened after submit
    /// still holds.
    pub fn within(&self, policy: &GatesSection) -> GatesSection {
        let mut effective = self.clone();
        for bound in GATE_BOUNDS {
            let Some(floor) = (bound.get)(policy) else { continue };
            match (bound.get)(self) {
                Some(job) if !bound.looser(job, floor) => {}
                _ => (bound.set)(&mut effective, floor),
            }
        }
        effective
    }
}

fn show_bound(key: &str, value: f64) -> String {
    match key {
        "refuse_reward_hacking" => (value > 0.5).to_string(),
        _ => value.to_string(),
    }
}

/// `[publish]`: who is told when a gated checkpoint is published. Where it goes is the operator's
/// registry and the job's `job.model_line`, never a spec's choice: there is no `registry` key.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct PublishSection {
    /// A URL the published manifest is POSTed to (5 attempts, 0.5 s doubling backoff, 10 s
    /// each); one that stays down never un-publishes: the job's `webhook` field says what happened.
    #[serde(default)]
    pub webhook: Option<String>,
    /// With `[model] lora`: publish the base with the adapters merged into its weights (a plain
    /// model directory) instead of the PEFT adapter directory that names its base.
    #[serde(default)]
    pub merge_lora: bool,
}

/// `[tracking]`: the MLflow tracking server the daemon logs the job to — one run per job (named
/// by its id), its spec as params, its metrics lines as metrics, its end as the run's status, and
/// the published model's files as the run's artifacts. The daemon calls the url, so the
/// operator's `[outbound] allow` must cover it (checked at submit and on every request).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct TrackingSection {
    /// The server's base url, `http://host:port` or `https://host[/prefix]`: what MLflow clients
    /// take as `MLFLOW_TRACKING_URI`.
    pub mlflow_uri: String,
    /// The MLflow experiment the run goes into, created when missing; default
    /// `<job.team>/<job.model_line>`.
    #[serde(default)]
    pub experiment: Option<String>,
    /// A team secret sent as `Authorization: Bearer <value>` (MLflow's `MLFLOW_TRACKING_TOKEN`),
    /// for a server behind authentication; none by default.
    #[serde(default)]
    pub token_secret: Option<String>,
}

/// Longest `tracking.experiment`, in characters.
pub const MAX_EXPERIMENT_CHARS: usize = 256;

impl TrackingSection {
    /// The experiment of `spec`'s run: `experiment`, or `<team>/<model_line>`.
    pub fn experiment_of(&self, job: &JobSection) -> String {
        self.experiment.clone().unwrap_or_else(|| format!("{}/{}", job.team, job.model_line))
    }

    /// `mlflow_uri` without a trailing `/`, where the REST paths (`/api/2.0/mlflow/...`) go.
    pub fn base_url(&self) -> &str {
        self.mlflow_uri.trim_end_matches('/')
    }

    /// What `[tracking]` says wrong about itself for a job of `team` (where the url may go is the
    /// operator's `[outbound]` policy, checked by the daemon). An experiment is named under the
    /// team's prefix: experiments are shared by everyone on an MLflow server, and a team's runs
    /// must not land in another's.
    fn problems(&self, team: &str) -> Vec<SpecError> {
        let mut errors = Vec::new();
        let mut refuse = |field: &str, message: String| {
            errors.push(SpecError { field: format!("tracking.{field}"), message })
        };
        let uri = &self.mlflow_uri;
        let rest = uri.strip_prefix("http://").or_else(|| uri.strip_prefix("https://"));
        match rest {
            None => refuse("mlflow_uri", format!("expected an http:// or https:// url, got {uri:?}")),
            Some(rest) if rest.is_empty() || rest.starts_with('/') => {
                refuse("mlflow_uri", format!("expected a host after the scheme, got {uri:?}"))
            }
            Some(_) if uri.contains(['?', '#']) || uri.chars().any(char::is_whitespace) => refuse(
                "mlflow_uri",
                format!("expected the server's base url, without query, fragment or spaces, got {uri:?}"),
            ),
            Some(_) => {}
        }
        if let Some(name) = &self.experiment
            && (name.trim().is_empty()
                || name.chars().count() > MAX_EXPERIMENT_CHARS
                || name.chars().any(char::is_control))
        {
            refuse(
                "experiment",
                format!("expected 1 to {MAX_EXPERIMENT_CHARS} printable characters, got {name:?}"),
            );
        } else if let Some(name) = &self.experiment
            && !name.strip_prefix(team).is_some_and(|rest| rest.len() > 1 && rest.starts_with('/'))
        {
            refuse("experiment", format!("expected a name under the job's team, \"{team}/…\", got {name:?}"));
        }
        if self.token_secret.as_deref().is_some_and(|name| name.trim().is_empty()) {
            refuse("token_secret", "expected the name of one of the team's secrets, got \"\"".into());
        }
        errors
    }
}

/// `[checkpoint]`: how often state is saved.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct CheckpointSection {
    /// A checkpoint every this many steps, and always at the end.
    #[serde(default = "defaults::checkpoint_every")]
    pub every_steps: u64,
    /// A run resumed from a checkpoint ends bit-identically to an uninterrupted one (on the same
    /// device and libraries). On CUDA this takes libtorch's deterministic algorithms, which cost
    /// speed; `false` lets CUDA pick faster kernels whose sums vary from run to run. The CPU is
    /// deterministic either way.
    #[serde(default = "defaults::yes")]
    pub exact_resume: bool,
    /// Checkpoints kept for their held-out score: the best this many of those scored (held-out
    /// is scored, and a checkpoint written, every `eval.every_steps` and at the end). The best
    /// retained one is what the gates judge and what is published. 0 keeps none for its score.
    #[serde(default = "defaults::one")]
    pub keep_best: u32,
    /// The newest this many checkpoints are kept too (a resume starts from the newest); older
    /// ones that are not among the best are deleted, so a long run's disk use stays bounded.
    #[serde(default = "defaults::keep_last")]
    pub keep_last: u32,
}

impl Default for CheckpointSection {
    fn default() -> Self {
        CheckpointSection {
            every_steps: defaults::checkpoint_every(),
            exact_resume: true,
            keep_best: defaults::one(),
            keep_last: defaults::keep_last(),
        }
    }
}

impl CheckpointSection {
    /// `keep_best` and `keep_last` as the retention rule.
    pub fn retention(&self) -> crate::checkpoints::Retention {
        crate::checkpoints::Retention {
            keep_best: self.keep_best as usize,
            keep_last: self.keep_last as usize,
        }
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
    pub fn max_logprob_gap() -> f64 {
        0.1
    }
    pub fn is_max_logprob_gap(value: &f64) -> bool {
        *value == max_logprob_gap()
    }
    pub fn importance_cap() -> f64 {
        2.0
    }
    pub fn is_importance_cap(value: &f64) -> bool {
        *value == importance_cap()
    }
    pub fn is_zero(value: &u32) -> bool {
        *value == 0
    }
    pub fn is_one(value: &u32) -> bool {
        *value == 1
    }
    pub fn group_size() -> u32 {
        8
    }
    pub fn one() -> u32 {
        1
    }
    /// Two: the newest checkpoint and the one before it, so a checkpoint being replaced never
    /// leaves a run with nothing to resume from.
    pub fn keep_last() -> u32 {
        2
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
    pub fn yes() -> bool {
        true
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
    /// A spec that leaves out `job.team` runs for `team`, the submitting token's: a newcomer's
    /// first spec (`rlvrctl init`'s) needs no team name written into it.
    pub fn fill_team(&mut self, team: &str) {
        if self.job.team.is_empty() {
            team.clone_into(&mut self.job.team);
        }
    }

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

    /// Every range and consistency check a spec can make about itself: the names, the numeric
    /// ranges of [`RULES`] and [`VERIFIER_RULES`], and the checks that relate two fields.
    pub fn validate(&self) -> Result<(), SpecErrors> {
        let mut errors = names(self);
        errors.extend(RULES.iter().filter_map(|rule| rule.check("", self)));
        if let Some(lora) = &self.model.lora {
            errors.extend(LORA_RULES.iter().filter_map(|rule| rule.check("model.lora.", lora)));
        }
        let formula = self.reward.as_ref().map(|reward| reward.formula.as_str());
        errors.extend(
            check_graders(&self.verifiers, self.env_term(), formula, "verifiers", "reward.formula").1,
        );
        errors.extend(relations(self));
        errors.extend(crate::env::problems(self));
        errors.extend(self.tracking.iter().flat_map(|tracking| tracking.problems(&self.job.team)));
        if errors.is_empty() { Ok(()) } else { Err(SpecErrors(errors)) }
    }

    /// The reward's term after the graders' in a job with `[env]`: the environment's reward,
    /// named [`ENV_TERM`] in `[reward] formula` and in the reward's components.
    pub fn env_term(&self) -> Option<&'static str> {
        self.env.is_some().then_some(ENV_TERM)
    }

    /// `[reward] formula`, parsed against the graders' names (and `env`'s, with `[env]`); `None`
    /// for a weighted sum.
    pub fn reward_formula(&self) -> Result<Option<crate::formula::Formula>, SpecError> {
        let Some(reward) = &self.reward else { return Ok(None) };
        let names: Vec<&str> =
            self.verifiers.iter().map(PluginSection::grader_name).chain(self.env_term()).collect();
        crate::formula::Formula::parse(&reward.formula, &names)
            .map(Some)
            .map_err(|error| SpecError { field: "reward.formula".into(), message: error.to_string() })
    }

    /// The optimizer plugin's own keys, as the JSON object it is created with.
    pub fn optimizer_plugin_config(&self) -> String {
        Value::Object(self.optimizer.options.clone()).to_string()
    }

    /// Every plugin library the spec names, in the spec's order: the optimizer unless it is
    /// built in, each grader but the built-in reward model, the curriculum. What the daemon
    /// hands a worker, and all the worker loads.
    pub fn plugin_libraries(&self) -> Vec<NamedPlugin<'_>> {
        use rlvr_plugin_api::PluginKind;

        let mut named = Vec::new();
        if crate::builtin::Builtin::of(self).is_none() {
            named.push(NamedPlugin {
                field: "optimizer.plugin".into(),
                plugin: &self.optimizer.plugin,
                kind: PluginKind::Optimizer,
            });
        }
        for (i, section) in self.verifiers.iter().enumerate() {
            if !crate::reward_model::is_reward_model(section) {
                named.push(NamedPlugin {
                    field: format!("verifiers[{i}].plugin"),
                    plugin: &section.plugin,
                    kind: PluginKind::Verifier,
                });
            }
        }
        if let Some(curriculum) = &self.curriculum {
            named.push(NamedPlugin {
                field: "curriculum.plugin".into(),
                plugin: &curriculum.plugin,
                kind: PluginKind::Curriculum,
            });
        }
        named
    }
}

/// A plugin library a spec names ([`JobSpec::plugin_libraries`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NamedPlugin<'a> {
    /// The key that names it: `optimizer.plugin`, `verifiers[1].plugin`, `curriculum.plugin`.
    pub field: String,
    /// `name` (any loaded version) or `name@version`, as written.
    pub plugin: &'a str,
    /// The kind the field asks for.
    pub kind: rlvr_plugin_api::PluginKind,
}

impl PluginSection {
    /// The plugin's own keys (not `plugin`, not `name`, not `weight`), as the JSON object it is
    /// created with.
    pub fn plugin_config(&self) -> String {
        Value::Object(self.options.clone()).to_string()
    }

    /// Its name in the reward: `name`, or the plugin's name without a version.
    pub fn grader_name(&self) -> &str {
        self.name.as_deref().unwrap_or_else(|| self.plugin.split('@').next().unwrap_or_default())
    }
}

/// The environment's reward as a term of a job's reward (`[env]`): a formula may name it, and it
/// is a component of every episode's reward.
pub const ENV_TERM: &str = "env";

/// The checks of a list of graders and their reward formula, wherever they are written: a job's
/// `[[verifiers]]` and `[reward]`, or a dry-run's `reward` (`POST /v1/verify`). `env`: the
/// environment's term when the job has `[env]` (a formula may name it after the graders', and no
/// grader may take its name). `graders_field` and `formula_field` are the keys as the caller's
/// document writes them (`verifiers`, `reward.formula`). Returns the parsed formula when there is
/// one and it parses.
pub fn check_graders(
    graders: &[PluginSection],
    env: Option<&str>,
    formula: Option<&str>,
    graders_field: &str,
    formula_field: &str,
) -> (Option<crate::formula::Formula>, Vec<SpecError>) {
    if graders.len() > MAX_GRADERS {
        // Thousands of graders would each be checked (and each answered) here first.
        let message = format!("expected at most {MAX_GRADERS} graders, got {}", graders.len());
        return (None, vec![SpecError { field: graders_field.to_owned(), message }]);
    }
    let mut errors = Vec::new();
    let is_term = |name: &str| {
        name.len() <= MAX_GRADER_NAME_CHARS
            && name.chars().next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
    };
    for (i, grader) in graders.iter().enumerate() {
        let prefix = format!("{graders_field}[{i}].");
        errors.extend(VERIFIER_RULES.iter().filter_map(|rule| rule.check(&prefix, grader)));
        if let Some(name) = &grader.name
            && !is_term(name)
        {
            errors.push(SpecError {
                field: format!("{prefix}name"),
                message: format!(
                    "expected 1–{MAX_GRADER_NAME_CHARS} of [A-Za-z0-9_], not starting with a digit \
                     (a name a formula can use), got {name:?}"
                ),
            });
        }
        if let Some(first) = graders[..i].iter().position(|other| other.grader_name() == grader.grader_name())
        {
            errors.push(SpecError {
                field: format!("{prefix}name"),
                message: format!(
                    "{graders_field}[{first}] is named {:?} too; give each grader of one plugin a `name`",
                    grader.grader_name()
                ),
            });
        }
        if env.is_some_and(|env| grader.grader_name() == env) {
            errors.push(SpecError {
                field: format!("{prefix}name"),
                message: format!(
                    "{:?} is the environment's reward in a job with [env]; give this grader another `name`",
                    grader.grader_name()
                ),
            });
        }
        if formula.is_some() && grader.weight != 1.0 {
            errors.push(SpecError {
                field: format!("{prefix}weight"),
                message: format!("unused with {formula_field}; write the weight in the formula"),
            });
        }
    }
    let Some(text) = formula else { return (None, errors) };
    let names: Vec<&str> = graders.iter().map(PluginSection::grader_name).chain(env).collect();
    match crate::formula::Formula::parse(text, &names) {
        Ok(parsed) => (Some(parsed), errors),
        Err(error) => {
            let hint = match names.iter().find(|name| !is_term(name)) {
                Some(name) if error.message.starts_with("not a grader") => {
                    format!("; {name:?} is not a name a formula can use: give its grader a `name`")
                }
                _ => String::new(),
            };
            errors.push(SpecError { field: formula_field.to_owned(), message: format!("{error}{hint}") });
            (None, errors)
        }
    }
}

/// A numeric field's value, as its rule reads it.
#[derive(Debug, Clone, Copy)]
enum Num {
    Int(u64),
    Real(f64),
}

impl fmt::Display for Num {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Num::Int(i) => write!(f, "{i}"),
            Num::Real(x) => write!(f, "{x}"),
        }
    }
}

/// One end of a range of reals.
#[derive(Debug, Clone, Copy)]
enum Bound {
    Open(f64),
    Closed(f64),
}

/// What a numeric field may hold. Each is said one way (see [`Rule::expected`]), so a range is
/// written once, here, and its message follows from it.
#[derive(Debug, Clone, Copy)]
enum Range {
    /// Integers from one to the other: `1 to 1024`; `1` when they are the same.
    Ints(u64, u64),
    /// Integers from this one up: `at least 1`.
    IntsFrom(u64),
    /// Finite reals between two bounds: `in (0, 1]`.
    Reals(Bound, Bound),
    /// Finite reals past a bound: `> 0`, `≥ 0`.
    RealsFrom(Bound),
    /// Finite reals > 0, said `positive`: for amounts (minutes, tokens) rather than thresholds.
    Positive,
}

impl Range {
    fn contains(self, value: Num) -> bool {
        let x = match value {
            Num::Int(i) => match self {
                Range::Ints(lo, hi) => return (lo..=hi).contains(&i),
                Range::IntsFrom(lo) => return i >= lo,
                _ => i as f64,
            },
            Num::Real(x) => x,
        };
        let above = |bound| match bound {
            Bound::Open(lo) => x > lo,
            Bound::Closed(lo) => x >= lo,
        };
        let below = |bound| match bound {
            Bound::Open(hi) => x < hi,
            Bound::Closed(hi) => x <= hi,
        };
        x.is_finite()
            && match self {
                Range::Reals(lo, hi) => above(lo) && below(hi),
                Range::RealsFrom(lo) => above(lo),
                Range::Positive => x > 0.0,
                Range::Ints(..) | Range::IntsFrom(_) => false,
            }
    }
}

/// A numeric field of `T`, its range and how its message names it.
struct Rule<T> {
    /// The field's path under `T`: `rollout.top_p`, or `weight` under a verifier.
    field: &'static str,
    /// The value; `None` when the field is unset (and so not checked).
    get: fn(&T) -> Option<Num>,
    range: Range,
    /// What the value is: the noun of a real ("rate" in `a rate in [0, 1]`, "number" when
    /// unset), or the unit after an integer range ("extra rounds" in `0 to 16 extra rounds`).
    noun: Option<&'static str>,
    /// Said after the range: `(0 = off)`.
    note: Option<&'static str>,
}

impl<T> Rule<T> {
    const fn new(field: &'static str, get: fn(&T) -> Option<Num>, range: Range) -> Self {
        Rule { field, get, range, noun: None, note: None }
    }

    const fn noun(self, noun: &'static str) -> Self {
        Rule { noun: Some(noun), ..self }
    }

    const fn note(self, note: &'static str) -> Self {
        Rule { note: Some(note), ..self }
    }

    /// What the field must hold, in words: `a number in (0, 1]`, `1 to 64`, `a positive number of
    /// minutes`, `a number ≥ 0 (0 = off)`.
    fn expected(&self) -> String {
        let noun = self.noun.unwrap_or("number");
        let unit = self.noun.map(|noun| format!(" {noun}")).unwrap_or_default();
        let range = match self.range {
            Range::Ints(lo, hi) if lo == hi => format!("{lo}{unit}"),
            Range::Ints(lo, hi) => format!("{lo} to {hi}{unit}"),
            Range::IntsFrom(lo) => format!("at least {lo}{unit}"),
            Range::Reals(lo, hi) => {
                let (open, lo) = match lo {
                    Bound::Open(x) => ('(', x),
                    Bound::Closed(x) => ('[', x),
                };
                let (close, hi) = match hi {
                    Bound::Open(x) => (')', x),
                    Bound::Closed(x) => (']', x),
                };
                format!("a {noun} in {open}{lo}, {hi}{close}")
            }
            Range::RealsFrom(Bound::Open(lo)) => format!("a {noun} > {lo}"),
            Range::RealsFrom(Bound::Closed(lo)) => format!("a {noun} ≥ {lo}"),
            Range::Positive => format!("a positive {noun}"),
        };
        match self.note {
            Some(note) => format!("{range} {note}"),
            None => range,
        }
    }

    /// The error of `value`'s field, if its value is out of range; `prefix` goes before the field.
    fn check(&self, prefix: &str, value: &T) -> Option<SpecError> {
        let found = (self.get)(value).filter(|found| !self.range.contains(*found))?;
        Some(SpecError {
            field: format!("{prefix}{}", self.field),
            message: format!("expected {}, got {found}", self.expected()),
        })
    }
}

fn int(value: impl Into<u64>) -> Option<Num> {
    Some(Num::Int(value.into()))
}

/// A real field's value, set (`f64`) or maybe unset (`Option<f64>`).
fn real(value: impl Into<Option<f64>>) -> Option<Num> {
    value.into().map(Num::Real)
}

/// `[0, 1]`: rates and score fractions.
const UNIT: Range = Reals(Closed(0.0), Closed(1.0));

/// A rate of verifier outcomes, in [`UNIT`].
const fn rate(field: &'static str, get: fn(&JobSpec) -> Option<Num>) -> SpecRule {
    SpecRule::new(field, get, UNIT).noun("rate")
}

use Bound::{Closed, Open};
use Range::{Ints, IntsFrom, Positive, Reals, RealsFrom};

/// A rule on a whole spec (naming `JobSpec` lets a row's closure know its argument's type).
type SpecRule = Rule<JobSpec>;

/// The numeric ranges of a spec, in the order of its sections.
const RULES: &[SpecRule] = &[
    SpecRule::new("optimizer.group_size", |s| int(s.optimizer.group_size), Ints(1, 1024)),
    SpecRule::new("optimizer.mu", |s| int(s.optimizer.mu), Ints(1, 64)),
    SpecRule::new("optimizer.lr", |s| real(s.optimizer.lr), Reals(Open(0.0), Closed(1.0))),
    SpecRule::new("optimizer.adam_beta1", |s| real(s.optimizer.adam_beta1), Reals(Closed(0.0), Open(1.0))),
    SpecRule::new("optimizer.adam_beta2", |s| real(s.optimizer.adam_beta2), Reals(Closed(0.0), Open(1.0))),
    SpecRule::new("optimizer.adam_eps", |s| real(s.optimizer.adam_eps), Positive),
    SpecRule::new("optimizer.weight_decay", |s| real(s.optimizer.weight_decay), UNIT),
    SpecRule::new("optimizer.grad_clip", |s| real(s.optimizer.grad_clip), RealsFrom(Closed(0.0)))
        .note("(0 = off)"),
    SpecRule::new("optimizer.micro_batch_size", |s| int(s.optimizer.micro_batch_size), IntsFrom(1)),
    SpecRule::new("optimizer.micro_batch_tokens", |s| s.optimizer.micro_batch_tokens.map(Num::Int), Positive)
        .noun("number of tokens"),
    SpecRule::new("rollout.max_new_tokens", |s| int(s.rollout.max_new_tokens), Ints(1, 32768)),
    SpecRule::new("rollout.temperature", |s| real(s.rollout.temperature), Reals(Closed(0.0), Closed(10.0)))
        .note("(0 = greedy)"),
    SpecRule::new("rollout.top_p", |s| real(s.rollout.top_p), Reals(Open(0.0), Closed(1.0))),
    SpecRule::new("rollout.prompts_per_step", |s| int(s.rollout.prompts_per_step), Ints(1, 4096)),
    SpecRule::new("rollout.dynamic_sampling_rounds", |s| int(s.rollout.dynamic_sampling_rounds), Ints(0, 16))
        .noun("extra rounds"),
    SpecRule::new("rollout.max_logprob_gap", |s| real(s.rollout.max_logprob_gap), Positive)
        .noun("mean log-probability gap"),
    SpecRule::new("rollout.off_policy_steps", |s| int(s.rollout.off_policy_steps), Ints(0, 1))
        .noun("updates")
        .note("(0 = on policy; 1 = one step off, on a device of its own)"),
    SpecRule::new("rollout.importance_cap", |s| real(s.rollout.importance_cap), RealsFrom(Closed(0.0)))
        .note("(0 = off; verl's default is 2)"),
    SpecRule::new("stop.kl_max", |s| real(s.stop.kl_max), RealsFrom(Open(0.0))),
    SpecRule::new("stop.heldout_drop_max", |s| real(s.stop.heldout_drop_max), UNIT)
        .noun("held-out score drop"),
    SpecRule::new("stop.length_growth_max", |s| real(s.stop.length_growth_max), RealsFrom(Open(1.0)))
        .noun("factor"),
    rate("stop.verifier_timeout_rate_max", |s| real(s.stop.verifier_timeout_rate_max)),
    rate("stop.verifier_error_rate_max", |s| real(s.stop.verifier_error_rate_max)),
    SpecRule::new(
        "gates.heldout_gain_min",
        |s| real(s.gates.heldout_gain_min),
        Reals(Closed(-1.0), Closed(1.0)),
    )
    .noun("held-out score change"),
    SpecRule::new("gates.kl_max", |s| real(s.gates.kl_max), RealsFrom(Open(0.0))),
    SpecRule::new("gates.length_ratio_max", |s| real(s.gates.length_ratio_max), RealsFrom(Open(0.0)))
        .noun("ratio"),
    rate("gates.verifier_timeout_rate_max", |s| real(s.gates.verifier_timeout_rate_max)),
    rate("gates.verifier_error_rate_max", |s| real(s.gates.verifier_error_rate_max)),
    SpecRule::new("budget.max_steps", |s| int(s.budget.max_steps), Ints(0, 10_000_000)),
    SpecRule::new("budget.max_generated_tokens", |s| s.budget.max_generated_tokens.map(Num::Int), Positive)
        .noun("number of tokens"),
    SpecRule::new("budget.max_wall_minutes", |s| real(s.budget.max_wall_minutes), Positive)
        .noun("number of minutes"),
    // The native worker runs on one device, and more would be held idle; an engine job takes
    // one process per device.
    SpecRule::new(
        "resources.devices",
        |s| int(s.resources.devices).filter(|_| !s.engine.is_engine() && s.rollout.off_policy_steps == 0),
        Ints(1, 1),
    )
    .note(
        "(one device per native job: that is what the worker uses; an off-policy vLLM job takes two, an \
         [engine] job may take more)",
    ),
    SpecRule::new(
        "resources.devices",
        |s| int(s.resources.devices).filter(|_| !s.engine.is_engine() && s.rollout.off_policy_steps > 0),
        Ints(2, 2),
    )
    .note("(rollout.off_policy_steps: one device for the trainer, one for the vLLM server)"),
    SpecRule::new(
        "resources.devices",
        |s| int(s.resources.devices).filter(|_| s.engine.is_engine()),
        Ints(1, 1024),
    ),
    // More nodes than one are a Ray cluster's (the engine's launcher refuses them on this host).
    SpecRule::new(
        "resources.nodes",
        |s| int(s.resources.nodes).filter(|_| !s.engine.is_engine()),
        Ints(1, 1),
    )
    .note("(a native job runs on one host; an [engine] job on a Ray cluster may span more)"),
    SpecRule::new(
        "resources.nodes",
        |s| int(s.resources.nodes).filter(|_| s.engine.is_engine()),
        Ints(1, 256),
    ),
    SpecRule::new("resources.memory_gb", |s| real(s.resources.memory_gb), RealsFrom(Closed(0.0))),
    SpecRule::new("resources.resident_gb", |s| real(s.resources.resident_gb), RealsFrom(Closed(0.0))),
    SpecRule::new("checkpoint.every_steps", |s| int(s.checkpoint.every_steps), IntsFrom(1)),
    SpecRule::new("checkpoint.keep_best", |s| int(s.checkpoint.keep_best), Ints(0, 1000)),
    // At least one: the newest checkpoint is what a resume starts from.
    SpecRule::new("checkpoint.keep_last", |s| int(s.checkpoint.keep_last), Ints(1, 1000)),
];

/// The ranges of `[model] lora`, when it is there.
const LORA_RULES: &[Rule<LoraSection>] = &[
    Rule::new("rank", |l: &LoraSection| int(l.rank), Ints(1, 4096)),
    Rule::new("alpha", |l: &LoraSection| real(l.alpha), Positive),
    Rule::new("dropout", |l: &LoraSection| real(l.dropout), Reals(Closed(0.0), Open(1.0))).noun("rate"),
];

/// The numeric ranges of each `[[verifiers]]` entry.
const VERIFIER_RULES: &[Rule<PluginSection>] =
    &[Rule::new("weight", |v| real(v.weight), RealsFrom(Closed(0.0)))];

/// Every numeric key's range, as `validate` words it ("1 to 1024", "a rate in [0, 1]"), by its
/// path (`optimizer.lr`, `model.lora.rank`, `verifiers[].weight`): the book's job-spec reference
/// shows these, so it cannot drift from what submit accepts.
pub fn key_ranges() -> Vec<(String, String)> {
    let spec = RULES.iter().map(|rule| (rule.field.to_owned(), rule.expected()));
    let lora = LORA_RULES.iter().map(|rule| (format!("model.lora.{}", rule.field), rule.expected()));
    let graders = VERIFIER_RULES.iter().map(|rule| (format!("verifiers[].{}", rule.field), rule.expected()));
    spec.chain(lora).chain(graders).collect()
}

/// Longest grader name (`[[verifiers]] name`).
const MAX_GRADER_NAME_CHARS: usize = 64;
/// Most graders in one reward, a job's or a dry-run's: each one grades every completion.
pub const MAX_GRADERS: usize = 16;

/// Longest job, team and model line name.
const MAX_NAME_CHARS: usize = 128;

/// `job.name`, `job.team`, `job.model_line` (which also names a directory, so no leading `.`), and
/// `model.policy`.
fn names(spec: &JobSpec) -> Vec<SpecError> {
    let name_ok = |s: &str| {
        !s.is_empty()
            && s.len() <= MAX_NAME_CHARS
            && s.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
    };
    let names = [
        ("job.name", &spec.job.name, false),
        ("job.team", &spec.job.team, false),
        ("job.model_line", &spec.job.model_line, true),
    ];
    let mut errors = Vec::new();
    for (field, name, no_leading_dot) in names {
        if !name_ok(name) || (no_leading_dot && name.starts_with('.')) {
            let dot = if no_leading_dot { ", not starting with '.'" } else { "" };
            let message = format!("expected 1–{MAX_NAME_CHARS} of [A-Za-z0-9._-]{dot}, got {name:?}");
            errors.push(SpecError { field: field.to_owned(), message });
        }
    }
    if spec.model.policy.is_empty() {
        let message = format!("expected a directory or {}", crate::builtin_models::TINY_ARITH);
        errors.push(SpecError { field: "model.policy".to_owned(), message });
    }
    errors
}

/// The checks that are not one field's range: one field against another, or the items of a list.
fn relations(spec: &JobSpec) -> Vec<SpecError> {
    let mut errors = Vec::new();
    let mut check = |ok: bool, field: &str, message: String| {
        if !ok {
            errors.push(SpecError { field: field.to_owned(), message });
        }
    };
    check(
        spec.optimizer.warmup_steps <= spec.budget.max_steps,
        "optimizer.warmup_steps",
        format!(
            "expected at most budget.max_steps ({}), got {}",
            spec.budget.max_steps, spec.optimizer.warmup_steps
        ),
    );
    check(
        !spec.model.tf32 || spec.model.dtype == Dtype::F32,
        "model.tf32",
        "TF32 is for f32 matrix products; with model.dtype = \"bf16\" they are bf16 already".into(),
    );
    if let Some(lora) = &spec.model.lora {
        let mut targets = lora.target_modules.clone();
        targets.sort();
        targets.dedup();
        check(
            !lora.target_modules.is_empty() && targets.len() == lora.target_modules.len(),
            "model.lora.target_modules",
            "expected a non-empty list without repeats of q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj"
                .into(),
        );
    }
    check(
        spec.publish.as_ref().is_none_or(|publish| !publish.merge_lora) || spec.model.lora.is_some(),
        "publish.merge_lora",
        "merges LoRA adapters: it needs [model] lora".into(),
    );
    if let Some(resident) = spec.resources.resident_gb {
        let memory = spec.resources.memory_gb;
        check(
            memory > 0.0 && resident <= memory,
            "resources.resident_gb",
            format!("expected at most resources.memory_gb ({memory}, which it is a part of), got {resident}"),
        );
    }
    if spec.rollout.engine == RolloutEngine::Vllm {
        // vLLM's processed log-probabilities are renormalised over the tokens top-p and top-k
        // keep; the trainer's are over the whole vocabulary, so the sync check could not tell a
        // stale server from the filter.
        check(
            spec.rollout.top_p == 1.0 && spec.rollout.top_k == 0,
            "rollout.engine",
            format!(
                "\"vllm\" samples with top_p = 1 and top_k = 0 (vLLM's log-probabilities are renormalised over \
                 the tokens a filter keeps, the trainer's are not), got top_p = {} and top_k = {}",
                spec.rollout.top_p, spec.rollout.top_k
            ),
        );
    }
    if spec.rollout.off_policy_steps > 0 {
        check(
            spec.rollout.engine == RolloutEngine::Vllm,
            "rollout.off_policy_steps",
            "samples the next step while this one updates: that needs rollout.engine = \"vllm\" (the native \
             sampler shares the trainer's weights and device)"
                .into(),
        );
        // Extra rounds sample after the round before them is graded: nothing to overlap.
        check(
            spec.rollout.dynamic_sampling_rounds == 0,
            "rollout.off_policy_steps",
            "cannot be combined with rollout.dynamic_sampling_rounds (an extra round depends on the grades \
             of the round before it)"
                .into(),
        );
    }
    check(
        spec.rollout.stop.iter().all(|s| !s.is_empty()),
        "rollout.stop",
        "expected non-empty strings".into(),
    );
    if let Some(curriculum) = &spec.curriculum {
        check(
            curriculum.name.is_none() || !curriculum.options.contains_key("history"),
            "curriculum.history",
            "the pinned version of curriculum.name seeds the estimates; give one or the other".into(),
        );
    }
    errors
}

/// serde_path_to_error writes `?` for an unknown position and `.` at the root.
pub(crate) fn clean_path(path: &str) -> String {
    if path == "." || path == "?" { String::new() } else { path.to_owned() }
}

/// serde reports a missing field at its parent's path: name the field itself.
pub(crate) fn with_missing_field(path: String, message: &str) -> String {
    let missing = message.strip_prefix("missing field `").and_then(|rest| rest.split('`').next());
    match missing {
        Some(name) if path.is_empty() => name.to_owned(),
        Some(name) => format!("{path}.{name}"),
        None => path,
    }
}

/// serde_json appends "at line L column C"; the field path already says where.
pub(crate) fn strip_position(message: &str) -> String {
    match message.rfind(" at line ") {
        Some(index) => message[..index].to_owned(),
        None => message.to_owned(),
    }
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
    fn graders_names_and_the_reward_formula() {
        let two = |extra: &str| {
            MINIMAL.replace(
                "[[verifiers]]\nplugin = \"math\"\n",
                &format!(
                    "[[verifiers]]\nplugin = \"math\"\n[[verifiers]]\nplugin = \"format@0.1.0\"\n{extra}"
                ),
            )
        };
        let cases: &[(String, &[&str])] = &[
            (two("[reward]\nformula = \"0.7 * math + 0.3 * format\"\n"), &[]),
            (two("[reward]\nformula = \"format > 0 ? math : 0\"\n"), &[]),
            (
                two("[reward]\nformula = \"0.7 * math + 0.3 * fromat\"\n"),
                &["reward.formula: at column 20, `fromat`: not a grader of this reward (graders: math, format)"],
            ),
            (
                two("weight = 0.5\n[reward]\nformula = \"math\"\n"),
                &["verifiers[1].weight: unused with reward.formula; write the weight in the formula"],
            ),
            (
                two("[reward]\nformula = \"math\"\nscale = 2\n"),
                &["reward.scale: unknown field `scale`, expected `formula`"],
            ),
            (
                MINIMAL.replace("plugin = \"math\"\n", "plugin = \"math\"\n[[verifiers]]\nplugin = \"math\"\n"),
                &[r#"verifiers[1].name: verifiers[0] is named "math" too; give each grader of one plugin a `name`"#],
            ),
            (
                MINIMAL.replace(
                    "plugin = \"math\"\n",
                    &((1..=MAX_GRADERS).map(|i| format!("plugin = \"math\"\nname = \"m{i}\"\n[[verifiers]]\n")).collect::<String>()
                        + "plugin = \"math\"\nname = \"last\"\n"),
                ),
                &["verifiers: expected at most 16 graders, got 17"],
            ),
            (
                MINIMAL.replace(
                    "plugin = \"math\"\n",
                    "plugin = \"math\"\n[[verifiers]]\nplugin = \"math\"\nname = \"math_last\"\nfallback = \"last\"\n\
                     [reward]\nformula = \"max(math, math_last)\"\n",
                ),
                &[],
            ),
            (
                MINIMAL.replace("plugin = \"math\"\n", "plugin = \"math\"\nname = \"2nd-math\"\n"),
                &[r#"verifiers[0].name: expected 1–64 of [A-Za-z0-9_], not starting with a digit (a name a formula can use), got "2nd-math""#],
            ),
            (
                MINIMAL.replace(
                    "plugin = \"math\"\n",
                    "plugin = \"math\"\n[[verifiers]]\nplugin = \"string-check\"\n[reward]\nformula = \"math * string\"\n",
                ),
                &[r#"reward.formula: at column 8, `string`: not a grader of this reward (graders: math, string-check); "string-check" is not a name a formula can use: give its grader a `name`"#],
            ),
        ];
        for (text, expected) in cases {
            check(text, expected);
        }
        let spec = JobSpec::from_toml(&two("name = \"fmt\"\n")).unwrap();
        assert_eq!(spec.verifiers[1].grader_name(), "fmt");
        assert_eq!(spec.verifiers[1].plugin_config(), "{}", "the name is not one of the plugin's keys");
        assert_eq!(spec.verifiers[0].grader_name(), "math");
    }

    #[test]
    fn a_minimal_spec_gets_the_documented_defaults_and_keeps_plugin_keys_apart() {
        let spec = JobSpec::from_toml(MINIMAL).unwrap();
        spec.validate().unwrap();
        assert_eq!(spec.optimizer.group_size, 8);
        assert_eq!(spec.optimizer.mu, 1);
        assert_eq!(spec.rollout.max_new_tokens, 256);
        assert_eq!(spec.model.reference, "same");
        assert_eq!((spec.model.dtype, spec.model.tf32), (Dtype::F32, false));
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
            ("[resources]\ndevices = 0\n", "resources.devices", "expected 1 (one device per native job"),
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

    /// MINIMAL with `lines` added to its `[section]`, or in a new one when it has none.
    fn with(section: &str, lines: &str) -> String {
        let header = format!("\n[{section}]\n");
        if MINIMAL.contains(&header) {
            MINIMAL.replacen(&header, &format!("{header}{lines}\n"), 1)
        } else {
            format!("{MINIMAL}{header}{lines}\n")
        }
    }

    /// Parses and validates `text`: `expected` is every error as displayed, in order; none when
    /// the spec is valid.
    fn check(text: &str, expected: &[&str]) {
        let got: Vec<String> = match JobSpec::from_toml(text) {
            Err(error) => vec![error.to_string()],
            Ok(spec) => match spec.validate() {
                Ok(()) => Vec::new(),
                Err(errors) => errors.0.iter().map(ToString::to_string).collect(),
            },
        };
        assert_eq!(got, expected, "{text}");
    }

    /// Parses `text`, which does not parse: the error names `field` ("" for the text as a whole)
    /// and says `message`. What `from_toml` refuses `POST /v1/jobs` answers 400, what `validate`
    /// refuses 422 (`read_spec` in daemon/src/api/jobs.rs): these rows are the 400s.
    fn check_parse(text: &str, field: &str, message: &str) {
        let error = JobSpec::from_toml(text).expect_err(text);
        assert_eq!((error.field.as_str(), error.message.as_str()), (field, message), "{text}");
    }

    #[test]
    fn what_does_not_parse_is_refused_before_validation_naming_the_key() {
        let cases: &[(String, &str, &str)] = &[
            ("[job\nname = 1".into(), "", "not valid TOML: unclosed table, expected `]`"),
            (
                MINIMAL.replace("max_steps = 10", "max_steps = \"two\""),
                "budget.max_steps",
                "invalid type: string \"two\", expected u64",
            ),
            (
                MINIMAL.replace("max_steps = 10", "max_steps = -2"),
                "budget.max_steps",
                "invalid value: integer `-2`, expected u64",
            ),
            (MINIMAL.replace("[budget]\nmax_steps = 10\n", ""), "budget", "missing field `budget`"),
            (
                with("budget", "max_hours = 3"),
                "budget.max_hours",
                "unknown field `max_hours`, expected one of `max_steps`, `max_generated_tokens`, \
                 `max_wall_minutes`",
            ),
            (
                with("job", "colour = \"red\""),
                "job.colour",
                "unknown field `colour`, expected one of `name`, `team`, `priority`, `model_line`, `seed`",
            ),
            (
                with("job", "priority = \"urgent\""),
                "job.priority",
                "unknown variant `urgent`, expected one of `low`, `normal`, `high`",
            ),
            (
                with("model", "dtype = \"f8\""),
                "model.dtype",
                "unknown variant `f8`, expected `f32` or `bf16`",
            ),
            (
                with("optimizer", "lr = \"fast\""),
                "optimizer.lr",
                "invalid type: string \"fast\", expected f64",
            ),
            (
                with("rollout", "top_q = 1"),
                "rollout.top_q",
                "unknown field `top_q`, expected one of `max_new_tokens`, `temperature`, `top_p`, `top_k`, \
                 `prompts_per_step`, `stop`, `dynamic_sampling_rounds`, `engine`, `max_logprob_gap`, \
                 `importance_cap`, `off_policy_steps`, `ignore_eos`",
            ),
            (
                with("stop", "kl = 1"),
                "stop.kl",
                "unknown field `kl`, expected one of `kl_max`, `heldout_drop_max`, `length_growth_max`, \
                 `verifier_timeout_rate_max`, `verifier_error_rate_max`",
            ),
            (
                with("gates", "kl = 1"),
                "gates.kl",
                "unknown field `kl`, expected one of `heldout_gain_min`, `canary_regressions_max`, `kl_max`, \
                 `length_ratio_max`, `verifier_error_rate_max`, `verifier_timeout_rate_max`, \
                 `refuse_reward_hacking`",
            ),
            // regression: a spec wrote into another team's registry with [publish] registry
            (
                with("publish", "registry = \"/etc\""),
                "publish.registry",
                "unknown field `registry`, expected `webhook` or `merge_lora`",
            ),
        ];
        for (text, field, message) in cases {
            check_parse(text, field, message);
        }
    }

    #[test]
    fn each_rule_says_its_range() {
        let cases: &[(&str, &str, &str)] = &[
            ("optimizer", "group_size = 0", "optimizer.group_size: expected 1 to 1024, got 0"),
            ("optimizer", "group_size = 5000", "optimizer.group_size: expected 1 to 1024, got 5000"),
            ("optimizer", "mu = 65", "optimizer.mu: expected 1 to 64, got 65"),
            ("optimizer", "lr = -1.0", "optimizer.lr: expected a number in (0, 1], got -1"),
            ("optimizer", "adam_beta1 = 1.0", "optimizer.adam_beta1: expected a number in [0, 1), got 1"),
            ("optimizer", "adam_beta2 = -0.5", "optimizer.adam_beta2: expected a number in [0, 1), got -0.5"),
            ("optimizer", "adam_eps = 0.0", "optimizer.adam_eps: expected a positive number, got 0"),
            (
                "optimizer",
                "weight_decay = 1.5",
                "optimizer.weight_decay: expected a number in [0, 1], got 1.5",
            ),
            ("optimizer", "grad_clip = -1.0", "optimizer.grad_clip: expected a number ≥ 0 (0 = off), got -1"),
            ("optimizer", "micro_batch_size = 0", "optimizer.micro_batch_size: expected at least 1, got 0"),
            (
                "optimizer",
                "micro_batch_tokens = 0",
                "optimizer.micro_batch_tokens: expected a positive number of tokens, got 0",
            ),
            ("rollout", "max_new_tokens = 40000", "rollout.max_new_tokens: expected 1 to 32768, got 40000"),
            (
                "rollout",
                "max_new_tokens = 1000000",
                "rollout.max_new_tokens: expected 1 to 32768, got 1000000",
            ),
            (
                "rollout",
                "temperature = 11.0",
                "rollout.temperature: expected a number in [0, 10] (0 = greedy), got 11",
            ),
            (
                "rollout",
                "temperature = -1.0",
                "rollout.temperature: expected a number in [0, 10] (0 = greedy), got -1",
            ),
            ("rollout", "top_p = nan", "rollout.top_p: expected a number in (0, 1], got NaN"),
            ("rollout", "prompts_per_step = 0", "rollout.prompts_per_step: expected 1 to 4096, got 0"),
            (
                "rollout",
                "dynamic_sampling_rounds = 17",
                "rollout.dynamic_sampling_rounds: expected 0 to 16 extra rounds, got 17",
            ),
            (
                "rollout",
                "max_logprob_gap = 0.0",
                "rollout.max_logprob_gap: expected a positive mean log-probability gap, got 0",
            ),
            (
                "rollout",
                "importance_cap = -1.0",
                "rollout.importance_cap: expected a number ≥ 0 (0 = off; verl's default is 2), got -1",
            ),
            (
                "rollout",
                "engine = \"vllm\"\ntop_p = 0.9",
                "rollout.engine: \"vllm\" samples with top_p = 1 and top_k = 0 (vLLM's log-probabilities are \
                 renormalised over the tokens a filter keeps, the trainer's are not), got top_p = 0.9 and top_k = 0",
            ),
            (
                "rollout",
                "engine = \"vllm\"\ntop_k = 5",
                "rollout.engine: \"vllm\" samples with top_p = 1 and top_k = 0 (vLLM's log-probabilities are \
                 renormalised over the tokens a filter keeps, the trainer's are not), got top_p = 1 and top_k = 5",
            ),
            ("stop", "kl_max = 0.0", "stop.kl_max: expected a number > 0, got 0"),
            ("stop", "kl_max = -1.0", "stop.kl_max: expected a number > 0, got -1"),
            (
                "stop",
                "heldout_drop_max = 2.0",
                "stop.heldout_drop_max: expected a held-out score drop in [0, 1], got 2",
            ),
            ("stop", "length_growth_max = 1.0", "stop.length_growth_max: expected a factor > 1, got 1"),
            ("stop", "length_growth_max = 0.5", "stop.length_growth_max: expected a factor > 1, got 0.5"),
            (
                "stop",
                "verifier_error_rate_max = 2.0",
                "stop.verifier_error_rate_max: expected a rate in [0, 1], got 2",
            ),
            (
                "stop",
                "verifier_timeout_rate_max = inf",
                "stop.verifier_timeout_rate_max: expected a rate in [0, 1], got inf",
            ),
            (
                "gates",
                "heldout_gain_min = -2.0",
                "gates.heldout_gain_min: expected a held-out score change in [-1, 1], got -2",
            ),
            (
                "gates",
                "heldout_gain_min = 2.0",
                "gates.heldout_gain_min: expected a held-out score change in [-1, 1], got 2",
            ),
            ("gates", "length_ratio_max = 0.0", "gates.length_ratio_max: expected a ratio > 0, got 0"),
            (
                "gates",
                "verifier_error_rate_max = 1.5",
                "gates.verifier_error_rate_max: expected a rate in [0, 1], got 1.5",
            ),
            (
                "gates",
                "verifier_timeout_rate_max = -0.1",
                "gates.verifier_timeout_rate_max: expected a rate in [0, 1], got -0.1",
            ),
            // budget.max_steps: with the relations below (MINIMAL sets it).
            (
                "budget",
                "max_generated_tokens = 0",
                "budget.max_generated_tokens: expected a positive number of tokens, got 0",
            ),
            (
                "budget",
                "max_wall_minutes = -5.0",
                "budget.max_wall_minutes: expected a positive number of minutes, got -5",
            ),
            (
                "resources",
                "devices = 2",
                "resources.devices: expected 1 (one device per native job: that is what the worker uses; an \
                 off-policy vLLM job takes two, an [engine] job may take more), got 2",
            ),
            ("resources", "memory_gb = -1.0", "resources.memory_gb: expected a number ≥ 0, got -1"),
            (
                "resources",
                "memory_gb = 4.0\nresident_gb = 4.5",
                "resources.resident_gb: expected at most resources.memory_gb (4, which it is a part of), got 4.5",
            ),
            (
                "resources",
                "resident_gb = 1.0",
                "resources.resident_gb: expected at most resources.memory_gb (0, which it is a part of), got 1",
            ),
            ("checkpoint", "every_steps = 0", "checkpoint.every_steps: expected at least 1, got 0"),
            ("checkpoint", "keep_last = 0", "checkpoint.keep_last: expected 1 to 1000, got 0"),
            ("checkpoint", "keep_best = 1001", "checkpoint.keep_best: expected 0 to 1000, got 1001"),
        ];
        for (section, lines, expected) in cases {
            check(&with(section, lines), &[expected]);
        }
        // The ends of each range are in it.
        let edges = [
            ("optimizer", "group_size = 1\nmu = 64\nlr = 1.0\nadam_beta1 = 0.0\nadam_eps = 1e-30"),
            ("optimizer", "weight_decay = 1.0\ngrad_clip = 0.0\nmicro_batch_size = 1"),
            (
                "rollout",
                "max_new_tokens = 32768\ntemperature = 0.0\ntop_p = 1.0\ndynamic_sampling_rounds = 16",
            ),
            ("rollout", "engine = \"vllm\"\nmax_logprob_gap = 1e-9\nimportance_cap = 0.0"),
            ("rollout", "engine = \"native\"\ntop_p = 0.5\ntop_k = 3"),
            ("stop", "heldout_drop_max = 0.0\nverifier_error_rate_max = 1.0\nlength_growth_max = 1.01"),
            ("gates", "heldout_gain_min = -1.0\nkl_max = 1e-9"),
            ("resources", "devices = 1\nmemory_gb = 0.0"),
            ("resources", "memory_gb = 2.0\nresident_gb = 2.0"),
            ("checkpoint", "keep_best = 0\nkeep_last = 1"),
            ("checkpoint", "keep_best = 1000\nkeep_last = 1000"),
        ];
        for (section, lines) in edges {
            check(&with(section, lines), &[]);
        }
    }

    /// One step off policy: vLLM only, on two devices, without dynamic sampling.
    #[test]
    fn off_policy_rollouts_need_vllm_two_devices_and_one_round() {
        let off = |rollout: &str, devices: u32| {
            format!("{}\n[resources]\ndevices = {devices}\n", with("rollout", rollout))
        };
        let vllm = "engine = \"vllm\"\noff_policy_steps = 1";
        check(&off(vllm, 2), &[]);
        check(
            &off(vllm, 1),
            &[
                "resources.devices: expected 2 (rollout.off_policy_steps: one device for the trainer, one for \
               the vLLM server), got 1",
            ],
        );
        check(
            &off("engine = \"vllm\"\noff_policy_steps = 2", 2),
            &[
                "rollout.off_policy_steps: expected 0 to 1 updates (0 = on policy; 1 = one step off, on a device of \
               its own), got 2",
            ],
        );
        check(
            &off("off_policy_steps = 1", 2),
            &["rollout.off_policy_steps: samples the next step while this one updates: that needs \
               rollout.engine = \"vllm\" (the native sampler shares the trainer's weights and device)"],
        );
        check(
            &off(&format!("{vllm}\ndynamic_sampling_rounds = 2"), 2),
            &[
                "rollout.off_policy_steps: cannot be combined with rollout.dynamic_sampling_rounds (an extra round \
               depends on the grades of the round before it)",
            ],
        );
        // On policy, a native job has one device.
        check(
            &off("engine = \"vllm\"", 2),
            &["resources.devices: expected 1 (one device per native job: that is what the worker uses; an \
               off-policy vLLM job takes two, an [engine] job may take more), got 2"],
        );
    }

    #[test]
    fn names_lists_and_relations() {
        let cases: &[(String, &[&str])] = &[
            (
                MINIMAL.replace("name = \"arith\"", "name = \"\""),
                &[r#"job.name: expected 1–128 of [A-Za-z0-9._-], got """#],
            ),
            (
                MINIMAL.replace("name = \"arith\"", "name = \"a b/c\""),
                &[r#"job.name: expected 1–128 of [A-Za-z0-9._-], got "a b/c""#],
            ),
            // A model line is a name in the team's namespace, never a path out of it.
            (
                MINIMAL.replace("model_line = \"tiny\"", "model_line = \"../escape\""),
                &[
                    r#"job.model_line: expected 1–128 of [A-Za-z0-9._-], not starting with '.', got "../escape""#,
                ],
            ),
            // Left out and not filled from a token (a spec run by hand): refused by name.
            (
                MINIMAL.replace("team = \"math\"\n", ""),
                &[r#"job.team: expected 1–128 of [A-Za-z0-9._-], got """#],
            ),
            (
                MINIMAL
                    .replace("team = \"math\"", "team = \"a b\"")
                    .replace("model_line = \"tiny\"", "model_line = \".x\""),
                &[
                    r#"job.team: expected 1–128 of [A-Za-z0-9._-], got "a b""#,
                    r#"job.model_line: expected 1–128 of [A-Za-z0-9._-], not starting with '.', got ".x""#,
                ],
            ),
            (
                MINIMAL.replace("policy = \"builtin:tiny-arith\"", "policy = \"\""),
                &["model.policy: expected a directory or builtin:tiny-arith"],
            ),
            (
                MINIMAL.replace(
                    "[[verifiers]]\nplugin = \"math\"\n",
                    "[[verifiers]]\nplugin = \"math\"\n[[verifiers]]\nplugin = \"code\"\nweight = -1.0\n",
                ),
                &["verifiers[1].weight: expected a number ≥ 0, got -1"],
            ),
            (
                MINIMAL.replace("plugin = \"math\"\n", "plugin = \"math\"\nweight = -1.0\n"),
                &["verifiers[0].weight: expected a number ≥ 0, got -1"],
            ),
            (
                with("optimizer", "warmup_steps = 11"),
                &["optimizer.warmup_steps: expected at most budget.max_steps (10), got 11"],
            ),
            (with("rollout", "stop = [\"\\n\", \"\"]"), &["rollout.stop: expected non-empty strings"]),
            (
                with("model", "dtype = \"bf16\"\ntf32 = true"),
                &[
                    r#"model.tf32: TF32 is for f32 matrix products; with model.dtype = "bf16" they are bf16 already"#,
                ],
            ),
            (with("model", "dtype = \"bf16\"\ntf32 = false"), &[]),
            (with("model", "tf32 = true"), &[]),
            (with("model", "tf32 = 1"), &["model.tf32: invalid type: integer `1`, expected a boolean"]),
            (with("model", "lora = { rank = 8 }"), &[]),
            (
                with(
                    "model",
                    "lora = { rank = 8, alpha = 16.0, dropout = 0.05, target_modules = [\"q_proj\", \"v_proj\"] }",
                ),
                &[],
            ),
            (
                with("model", "lora = { rank = 0, alpha = -1.0, dropout = 1.0 }"),
                &[
                    "model.lora.rank: expected 1 to 4096, got 0",
                    "model.lora.alpha: expected a positive number, got -1",
                    "model.lora.dropout: expected a rate in [0, 1), got 1",
                ],
            ),
            (
                with("model", "lora = { rank = 8, target_modules = [] }"),
                &[
                    "model.lora.target_modules: expected a non-empty list without repeats of q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj",
                ],
            ),
            (
                with("model", "lora = { rank = 8, target_modules = [\"q_proj\", \"q_proj\"] }"),
                &[
                    "model.lora.target_modules: expected a non-empty list without repeats of q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj",
                ],
            ),
            (
                with("model", "lora = { rank = 8, target_modules = [\"lm_head\"] }"),
                &[
                    "model.lora.target_modules[0]: unknown variant `lm_head`, expected one of `q_proj`, `k_proj`, `v_proj`, `o_proj`, `gate_proj`, `up_proj`, `down_proj`",
                ],
            ),
            (with("model", "activation_checkpointing = true"), &[]),
            (
                with("publish", "merge_lora = true"),
                &["publish.merge_lora: merges LoRA adapters: it needs [model] lora"],
            ),
            (
                with("curriculum", "plugin = \"frontier\"\nname = \"shared\"\nhistory = []"),
                &[
                    "curriculum.history: the pinned version of curriculum.name seeds the estimates; give one or the other",
                ],
            ),
            (with("tracking", "mlflow_uri = \"http://127.0.0.1:5000/\"\nexperiment = \"math/arith\""), &[]),
            // regression: team beta's job logged into team alpha's experiment
            (
                with("tracking", "mlflow_uri = \"http://127.0.0.1:5000/\"\nexperiment = \"alpha/arith\""),
                &[
                    r#"tracking.experiment: expected a name under the job's team, "math/…", got "alpha/arith""#,
                ],
            ),
            (
                with("tracking", "mlflow_uri = \"http://127.0.0.1:5000/\"\nexperiment = \"arith\""),
                &[r#"tracking.experiment: expected a name under the job's team, "math/…", got "arith""#],
            ),
            (
                with("tracking", "mlflow_uri = \"http://127.0.0.1:5000/\"\nexperiment = \"math/\""),
                &[r#"tracking.experiment: expected a name under the job's team, "math/…", got "math/""#],
            ),
            (
                with("tracking", "mlflow_uri = \"http://127.0.0.1:5000/\"\nexperiment = \"mathematics/x\""),
                &[
                    r#"tracking.experiment: expected a name under the job's team, "math/…", got "mathematics/x""#,
                ],
            ),
            (
                with("tracking", "mlflow_uri = \"file:///etc/passwd\""),
                &["tracking.mlflow_uri: expected an http:// or https:// url, got \"file:///etc/passwd\""],
            ),
            (
                with("tracking", "mlflow_uri = \"https://\"\nexperiment = \" \"\ntoken_secret = \"\""),
                &[
                    "tracking.mlflow_uri: expected a host after the scheme, got \"https://\"",
                    "tracking.experiment: expected 1 to 256 printable characters, got \" \"",
                    "tracking.token_secret: expected the name of one of the team's secrets, got \"\"",
                ],
            ),
            (
                with("tracking", "mlflow_uri = \"http://mlflow:5000/?next=x\""),
                &[
                    "tracking.mlflow_uri: expected the server's base url, without query, fragment or spaces, got \"http://mlflow:5000/?next=x\"",
                ],
            ),
            (
                with("tracking", "uri = \"http://mlflow:5000\""),
                &[
                    "tracking.uri: unknown field `uri`, expected one of `mlflow_uri`, `experiment`, `token_secret`",
                ],
            ),
            (
                MINIMAL.replace("max_steps = 10", "max_steps = 99999999999"),
                &["budget.max_steps: expected 0 to 10000000, got 99999999999"],
            ),
            // Every problem at once, ranges before relations.
            (
                with("budget", "max_wall_minutes = 0.0").replace("max_steps = 10", "max_steps = 99999999999"),
                &[
                    "budget.max_steps: expected 0 to 10000000, got 99999999999",
                    "budget.max_wall_minutes: expected a positive number of minutes, got 0",
                ],
            ),
        ];
        for (text, expected) in cases {
            check(text, expected);
        }
    }

    #[test]
    fn the_plugin_libraries_a_spec_names_are_its_plugins_not_its_built_ins() {
        use rlvr_plugin_api::PluginKind::{Curriculum, Optimizer, Verifier};

        fn check(toml: &str, expected: &[(&str, &str, rlvr_plugin_api::PluginKind)]) {
            let spec = JobSpec::from_toml(toml).unwrap();
            let named = spec.plugin_libraries();
            let named: Vec<(&str, &str, rlvr_plugin_api::PluginKind)> =
                named.iter().map(|named| (named.field.as_str(), named.plugin, named.kind)).collect();
            assert_eq!(named, expected, "{toml}");
        }
        check(MINIMAL, &[("optimizer.plugin", "grpo", Optimizer), ("verifiers[0].plugin", "math", Verifier)]);
        let more = MINIMAL.replace(
            "[[verifiers]]\nplugin = \"math\"\n",
            "[[verifiers]]\nplugin = \"reward-model\"\nmodel = \"rm\"\n[[verifiers]]\nplugin = \"math@0.2.0\"\n\
             [curriculum]\nplugin = \"frontier\"\n",
        );
        check(
            &more,
            &[
                ("optimizer.plugin", "grpo", Optimizer),
                ("verifiers[1].plugin", "math@0.2.0", Verifier),
                ("curriculum.plugin", "frontier", Curriculum),
            ],
        );
        let sampling =
            MINIMAL.replace("plugin = \"grpo\"\nclip_eps_high = 0.28", "plugin = \"rejection-sampling\"");
        check(&sampling, &[("verifiers[0].plugin", "math", Verifier)]);
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

#[cfg(test)]
mod gate_floor_tests {
    use super::GatesSection;

    fn gates(toml: &str) -> GatesSection {
        toml::from_str(toml).unwrap()
    }

    #[test]
    fn a_job_may_tighten_a_lines_gates_but_not_loosen_them() {
        let policy = gates("heldout_gain_min = 0.0\nkl_max = 0.5\nrefuse_reward_hacking = true");
        let cases: &[(&str, &[&str])] = &[
            ("", &[]),
            ("heldout_gain_min = 0.05\nkl_max = 0.1", &[]),
            // regression: a team published into a line with heldout_gain_min = -1
            ("heldout_gain_min = -1.0", &["gates.heldout_gain_min"]),
            ("kl_max = 2.0\nrefuse_reward_hacking = false", &["gates.kl_max", "gates.refuse_reward_hacking"]),
            ("length_ratio_max = 100.0", &[]),
        ];
        for (job, expected) in cases {
            let fields: Vec<String> =
                gates(job).loosened_against(&policy).into_iter().map(|error| error.field).collect();
            assert_eq!(fields, *expected, "{job}");
        }
        let effective = gates("heldout_gain_min = -1.0\nkl_max = 0.1").within(&policy);
        assert_eq!(effective, gates("heldout_gain_min = 0.0\nkl_max = 0.1\nrefuse_reward_hacking = true"));
        assert_eq!(gates("kl_max = 3.0").within(&GatesSection::default()), gates("kl_max = 3.0"));
    }
}
