//! Jobs that train on an existing distributed engine instead of the native worker's step loop
//! (`[engine]`), and what crosses to the engine: the contract the engine's entry script reads.
//!
//! **Pure.** [`trl_trainer`] is the one mapping of a `grpo`, `sft` or `dpo` job onto TRL's trainer
//! and its keys ([`TrlTrainer`]: the shared [`TrlTraining`] plus each trainer's own; [`trl_grpo`]
//! is its GRPO case): it returns the engine's arguments or every key the engine cannot honour,
//! each refusal naming the key as the spec writes it and what the engine cannot do. The daemon
//! calls it at submit ([`engine_problems`]: a spec the engine cannot run is refused there) and the
//! worker at start (the arguments it hands the engine), so the check and the mapping cannot drift
//! apart. [`GRPO_MAPPING`], [`SFT_MAPPING`] and [`DPO_MAPPING`] are the same tables as data: the
//! tables of the book's engines page, `docs/src/operators/engines.md` (a test keeps them equal).
//!
//! `[engine]` is [`EngineSection`]: `kind` native or trl, `launcher` local or ray, `strategy`
//! ddp or fsdp2, `heldout` worker or engine.
//! [`EngineContract`] is what the worker hands `engines/trl/run.py`.
//!
//! The defaults of the GRPO keys here are the `grpo` plugin's (`plugins/optimizer-grpo`): a key
//! the spec leaves out means what it means to the native worker.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::spec::{Dtype, JobSpec, LrSchedule, RolloutEngine, RolloutSection, SpecError};

/// `[engine]`: where the job's training runs.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct EngineSection {
    #[serde(default)]
    pub kind: EngineKind,
    #[serde(default)]
    pub launcher: Launcher,
    /// How the ranks share the model: each a whole copy (`ddp`, the default), or each a shard of
    /// its parameters, gradients and optimizer state (`fsdp2`).
    #[serde(default)]
    pub strategy: Strategy,
    /// Who completes the held-out prompts (and the gates' canaries) that the worker scores: the
    /// worker on its own device (`worker`, the default), or the engine's ranks (`engine`), for a
    /// model that does not fit one device; the worker then keeps its copy of the model on the CPU.
    #[serde(default)]
    pub heldout: HeldoutBy,
}

/// Who generates an engine job's held-out (and canary) completions; the worker scores them
/// either way, with the job's graders.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "lowercase")]
pub enum HeldoutBy {
    /// The worker, greedily on its own device, before and after the engine trains.
    #[default]
    Worker,
    /// The engine's ranks, greedily, each a share of the prompts (sharded ranks gather a layer at
    /// a time): before training, every `eval.every_steps`, after training, and the gates'
    /// published baseline before training.
    Engine,
}

/// How an engine job's ranks hold the model.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "lowercase")]
pub enum Strategy {
    /// Data parallelism: every rank holds the whole model, its gradients and its AdamW moments
    /// (16 bytes a parameter in f32), and the gradients are averaged each pass.
    #[default]
    Ddp,
    /// PyTorch's FSDP2 (`fully_shard`, through accelerate): each rank holds 1/ranks of the
    /// parameters, gradients and optimizer state, and gathers a layer's weights only while it
    /// computes with them. The engine's checkpoints are sharded (torch.distributed.checkpoint)
    /// and resume on the world size that wrote them; the final weights are gathered once into a
    /// Hugging Face directory.
    Fsdp2,
}

/// Which engine trains the job.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "lowercase")]
pub enum EngineKind {
    /// The native worker's own step loop (one device).
    #[default]
    Native,
    /// TRL's trainers under accelerate, one process per device (`resources.devices`): gloo on
    /// CPU slots, NCCL with DDP on GPUs.
    Trl,
}

/// Where the engine's processes are started.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "lowercase")]
pub enum Launcher {
    /// `torchrun` on this host, on the job's granted devices.
    #[default]
    Local,
    /// A Ray cluster's Jobs API, at the daemon's configured address.
    Ray,
}

impl EngineSection {
    /// Whether an engine, not the native worker, trains the job.
    pub fn is_engine(&self) -> bool {
        self.kind != EngineKind::Native
    }
}

impl EngineKind {
    pub fn name(self) -> &'static str {
        match self {
            EngineKind::Native => "native",
            EngineKind::Trl => "trl",
        }
    }
}

impl Strategy {
    pub fn name(self) -> &'static str {
        match self {
            Strategy::Ddp => "ddp",
            Strategy::Fsdp2 => "fsdp2",
        }
    }
}

impl HeldoutBy {
    pub fn name(self) -> &'static str {
        match self {
            HeldoutBy::Worker => "worker",
            HeldoutBy::Engine => "engine",
        }
    }
}

impl Launcher {
    pub fn name(self) -> &'static str {
        match self {
            Launcher::Local => "local",
            Launcher::Ray => "ray",
        }
    }
}

/// Which TRL trainer an engine job runs, with its keys: what the entry script builds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "name", content = "keys", rename_all = "lowercase")]
pub enum TrlTrainer {
    /// `GRPOTrainer` (the `grpo` plugin's jobs).
    Grpo(TrlGrpoConfig),
    /// `SFTTrainer` on prompt-completion pairs, the loss on the completions only (the `sft`
    /// plugin's jobs).
    Sft(TrlSftConfig),
    /// `DPOTrainer` on preference pairs, the sigmoid loss (the `dpo` plugin's jobs).
    Dpo(TrlDpoConfig),
}

/// The keys every TRL trainer takes from a job: the optimizer, the batch, the budget, the
/// checkpoints (TRL's `TrainingArguments`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrlTraining {
    pub learning_rate: f64,
    pub lr_scheduler_type: String,
    pub warmup_steps: u64,
    pub weight_decay: f64,
    pub adam_beta1: f64,
    pub adam_beta2: f64,
    pub adam_epsilon: f64,
    pub max_grad_norm: f64,
    /// Rows (completions, or demonstrations) each process computes per forward/backward pass.
    pub per_device_train_batch_size: u32,
    /// Passes per optimizer step: a step's rows over every process.
    pub gradient_accumulation_steps: u32,
    pub max_steps: u64,
    pub save_steps: u64,
    /// The engine's checkpoints kept (the newest): disks do not fill.
    pub save_total_limit: u32,
    pub seed: u64,
    pub bf16: bool,
    /// `engine.strategy = "fsdp2"`: TrainingArguments' `fsdp` and `fsdp_config`; absent, DDP.
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    pub fsdp: Option<TrlFsdp>,
}

/// TRL's (TrainingArguments') FSDP keys for `engine.strategy = "fsdp2"`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrlFsdp {
    pub fsdp: bool,
    pub fsdp_config: TrlFsdpConfig,
}

/// accelerate's FSDP plugin, as `fsdp_config` takes it: version 2, each decoder layer its own
/// shard unit (the model's `_no_split_modules`), resharded after its forward pass (the memory
/// FSDP2 is for), checkpoints as shards (each rank writes its own; nothing is gathered until the
/// final model).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrlFsdpConfig {
    pub version: u32,
    pub auto_wrap_policy: String,
    pub reshard_after_forward: bool,
    pub state_dict_type: String,
}

impl TrlFsdp {
    fn fsdp2() -> TrlFsdp {
        TrlFsdp {
            fsdp: true,
            fsdp_config: TrlFsdpConfig {
                version: 2,
                auto_wrap_policy: "TRANSFORMER_BASED_WRAP".to_owned(),
                reshard_after_forward: true,
                state_dict_type: "SHARDED_STATE_DICT".to_owned(),
            },
        }
    }
}

/// TRL's `GRPOConfig` keys a job maps to (TRL 1.16), as the entry script passes them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrlGrpoConfig {
    #[serde(flatten)]
    pub training: TrlTraining,
    pub num_generations: u32,
    pub num_iterations: u32,
    pub loss_type: String,
    pub scale_rewards: String,
    pub epsilon: f64,
    pub epsilon_high: f64,
    pub beta: f64,
    pub importance_sampling_level: String,
    pub max_completion_length: u32,
    pub temperature: f64,
    pub top_p: f64,
    /// 0: off (TRL's convention too).
    pub top_k: u32,
    /// DAPO's soft overlong punishment as TRL's reward function
    /// (`trl.rewards.get_soft_overlong_punishment`), weighted by the penalty; `None`: off.
    pub overlong: Option<TrlOverlong>,
    /// `rollout.engine = "vllm"`: TRL's generation on vLLM; absent, TRL generates with the
    /// model itself (`generate`).
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    pub vllm: Option<TrlVllm>,
}

/// TRL's vLLM keys a GRPO job with `rollout.engine = "vllm"` maps to: vLLM in each rank's own
/// process on its device (`colocate`), asleep through the optimizer step as the native path's
/// server is on a shared GPU, its mismatch with the trainer corrected per token by truncated
/// importance sampling at `rollout.importance_cap` (0: off), as the native path does.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrlVllm {
    pub use_vllm: bool,
    pub vllm_mode: String,
    pub vllm_enable_sleep_mode: bool,
    pub vllm_importance_sampling_correction: bool,
    pub vllm_importance_sampling_mode: String,
    pub vllm_importance_sampling_clip_max: f64,
}

/// TRL's `DPOConfig` keys a DPO job maps to: the shared ones (a pass's rows are pairs), β and
/// cDPO's label smoothing, with TRL's `sigmoid` loss — the `dpo` plugin's.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrlDpoConfig {
    #[serde(flatten)]
    pub training: TrlTraining,
    pub beta: f64,
    pub label_smoothing: f64,
}

/// TRL's `SFTConfig` keys an SFT job maps to: the shared ones; the loss is TRL's token mean over
/// the completions of the step (`completion_only_loss`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrlSftConfig {
    #[serde(flatten)]
    pub training: TrlTraining,
}

/// DAPO's soft overlong punishment: the buffer `L_cache` and the term's weight.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TrlOverlong {
    pub buffer: u32,
    pub weight: f64,
}

/// One row of the spec-to-TRL mapping: our key, TRL's, and how the value crosses.
pub struct MappingRow {
    pub ours: &'static str,
    pub theirs: &'static str,
    pub note: &'static str,
}

/// How a GRPO job's keys reach TRL's `GRPOConfig` (the book's engines page shows this table).
pub const GRPO_MAPPING: &[MappingRow] = &[
    MappingRow { ours: "optimizer.group_size", theirs: "num_generations", note: "as is" },
    MappingRow { ours: "optimizer.mu", theirs: "num_iterations", note: "as is" },
    MappingRow { ours: "optimizer.lr", theirs: "learning_rate", note: "as is" },
    MappingRow {
        ours: "optimizer.lr_schedule",
        theirs: "lr_scheduler_type",
        note: "constant, linear, cosine",
    },
    MappingRow { ours: "optimizer.warmup_steps", theirs: "warmup_steps", note: "as is" },
    MappingRow { ours: "optimizer.weight_decay", theirs: "weight_decay", note: "as is" },
    MappingRow {
        ours: "optimizer.adam_beta1, adam_beta2, adam_eps",
        theirs: "adam_beta1, adam_beta2, adam_epsilon",
        note: "as is",
    },
    MappingRow {
        ours: "optimizer.grad_clip",
        theirs: "max_grad_norm",
        note: "as is (0: no clipping in both)",
    },
    MappingRow {
        ours: "optimizer.micro_batch_size",
        theirs: "per_device_train_batch_size",
        note: "completions per pass and process; gradient_accumulation_steps = prompts_per_step × group_size ÷ (micro_batch_size × processes), which must be whole",
    },
    MappingRow {
        ours: "optimizer.loss_agg",
        theirs: "loss_type",
        note: "token-mean → dapo, seq-mean-token-mean → grpo, seq-mean-token-sum-norm → dr_grpo",
    },
    MappingRow { ours: "optimizer.scale_rewards", theirs: "scale_rewards", note: "group, batch, none" },
    MappingRow {
        ours: "optimizer.clip_eps_low, clip_eps_high",
        theirs: "epsilon, epsilon_high",
        note: "as is (epsilon_high = epsilon when unset)",
    },
    MappingRow { ours: "optimizer.kl_beta", theirs: "beta", note: "k3 in the loss, as ours" },
    MappingRow {
        ours: "optimizer.importance_ratio",
        theirs: "importance_sampling_level",
        note: "token, sequence (GSPO)",
    },
    MappingRow {
        ours: "optimizer.overlong_buffer, overlong_penalty",
        theirs: "reward function get_soft_overlong_punishment",
        note: "weighted by overlong_penalty (1 when unset)",
    },
    MappingRow { ours: "rollout.max_new_tokens", theirs: "max_completion_length", note: "as is" },
    MappingRow {
        ours: "rollout.temperature, top_p, top_k",
        theirs: "temperature, top_p, top_k",
        note: "as is",
    },
    MappingRow {
        ours: "rollout.engine",
        theirs: "use_vllm, vllm_mode, vllm_enable_sleep_mode",
        note: "\"vllm\" → vLLM colocated in each rank, asleep through the optimizer step (CUDA only: the venv gets vLLM on GPU hosts); \"native\" → TRL's own generate",
    },
    MappingRow {
        ours: "rollout.importance_cap",
        theirs: "vllm_importance_sampling_correction, _mode, _clip_max",
        note: "token_truncate at the cap; 0 → no correction",
    },
    MappingRow { ours: "budget.max_steps", theirs: "max_steps", note: "as is" },
    MappingRow {
        ours: "checkpoint.every_steps",
        theirs: "save_steps",
        note: "the engine's checkpoints, which a resume starts from",
    },
    MappingRow { ours: "checkpoint.keep_last", theirs: "save_total_limit", note: "the newest kept" },
    MappingRow { ours: "job.seed", theirs: "seed", note: "as is" },
    MappingRow { ours: "model.dtype", theirs: "bf16", note: "bf16 → true" },
];

/// How an SFT job's keys reach TRL's `SFTConfig`, beyond the shared ones of [`GRPO_MAPPING`]
/// (learning rate and schedule, AdamW, clipping, `micro_batch_size`, steps, checkpoints, seed).
pub const SFT_MAPPING: &[MappingRow] = &[
    MappingRow {
        ours: "rollout.prompts_per_step",
        theirs: "gradient_accumulation_steps",
        note: "demonstrations a step = micro_batch_size × processes × gradient_accumulation_steps, which must be whole",
    },
    MappingRow {
        ours: "optimizer.loss_agg",
        theirs: "(TRL's loss)",
        note: "token-mean only, over the completions (completion_only_loss)",
    },
    MappingRow {
        ours: "data.train",
        theirs: "train_dataset",
        note: "prompt-completion pairs; conversational when the tokenizer has a chat template",
    },
];

/// How a DPO job's keys reach TRL's `DPOConfig`, beyond the shared ones.
pub const DPO_MAPPING: &[MappingRow] = &[
    MappingRow {
        ours: "optimizer.beta, label_smoothing",
        theirs: "beta, label_smoothing",
        note: "as is, loss_type sigmoid (cDPO when smoothing)",
    },
    MappingRow {
        ours: "optimizer.micro_batch_size",
        theirs: "per_device_train_batch_size",
        note: "halved: ours counts sequences, two a pair, TRL's pairs (it must be even)",
    },
    MappingRow {
        ours: "rollout.prompts_per_step",
        theirs: "gradient_accumulation_steps",
        note: "pairs a step, split as for SFT",
    },
];

/// The optimizer plugins each engine can run, by name.
const TRL_OPTIMIZERS: &[&str] = &["grpo", "sft", "dpo"];

/// `spec` as a TRL trainer's arguments for `processes` processes, or every key TRL cannot run
/// as written (each naming the key and what TRL cannot do).
pub fn trl_trainer(spec: &JobSpec, processes: u32) -> Result<TrlTrainer, Vec<SpecError>> {
    let mut refusals = Refusals::default();
    let optimizer = spec.optimizer.plugin.split('@').next().unwrap_or_default();
    refuse_what_trl_cannot_run(spec, &mut refusals);
    if spec.rollout.engine == RolloutEngine::Vllm && matches!(optimizer, "sft" | "dpo") {
        refusals.add("rollout.engine", format!("a {optimizer} job samples nothing: leave it out"));
    }
    let trainer = match optimizer {
        "grpo" => {
            let keys = GrpoKeys::read(&spec.optimizer.options, &mut refusals);
            let rows = spec.rollout.prompts_per_step * spec.optimizer.group_size;
            let what = "a step's completions (rollout.prompts_per_step × optimizer.group_size)";
            let micro = spec.optimizer.micro_batch_size;
            let training = training(spec, processes, rows, micro, what, &mut refusals);
            TrlTrainer::Grpo(keys.config(spec, training))
        }
        "sft" => {
            read_sft_keys(&spec.optimizer.options, &mut refusals);
            let what = "a step's demonstrations (rollout.prompts_per_step)";
            let rows = spec.optimizer.micro_batch_size;
            let training =
                training(spec, processes, spec.rollout.prompts_per_step, rows, what, &mut refusals);
            TrlTrainer::Sft(TrlSftConfig { training })
        }
        "dpo" => {
            let (beta, label_smoothing) = read_dpo_keys(&spec.optimizer.options, &mut refusals);
            // Our micro-batches count sequences, two a pair; TRL's count pairs.
            let micro = spec.optimizer.micro_batch_size;
            if micro % 2 != 0 {
                refusals.add(
                    "optimizer.micro_batch_size",
                    "a DPO pass takes whole pairs: expected an even number",
                );
            }
            let what = "a step's pairs (rollout.prompts_per_step)";
            let training =
                training(spec, processes, spec.rollout.prompts_per_step, micro / 2, what, &mut refusals);
            TrlTrainer::Dpo(TrlDpoConfig { training, beta, label_smoothing })
        }
        other => {
            refusals.add(
                "optimizer.plugin",
                format!(
                    "the trl engine runs {}; {other:?} has no TRL counterpart here (use engine.kind = \"native\")",
                    TRL_OPTIMIZERS.join(", ")
                ),
            );
            return Err(refusals.0);
        }
    };
    if refusals.0.is_empty() { Ok(trainer) } else { Err(refusals.0) }
}

/// A GRPO job's mapping ([`trl_trainer`] for a `grpo` job).
pub fn trl_grpo(spec: &JobSpec, processes: u32) -> Result<TrlGrpoConfig, Vec<SpecError>> {
    match trl_trainer(spec, processes)? {
        TrlTrainer::Grpo(config) => Ok(config),
        TrlTrainer::Sft(_) | TrlTrainer::Dpo(_) => Err(vec![SpecError {
            field: "optimizer.plugin".to_owned(),
            message: "not a grpo job".to_owned(),
        }]),
    }
}

/// The keys every trainer shares; `rows` a step's rows (`what`, in words), split into passes of
/// `micro` rows on each of `processes`.
fn training(
    spec: &JobSpec,
    processes: u32,
    rows: u32,
    micro: u32,
    what: &str,
    refusals: &mut Refusals,
) -> TrlTraining {
    let o = &spec.optimizer;
    if spec.engine.strategy == Strategy::Fsdp2 && processes < 2 {
        refusals.add(
            "engine.strategy",
            format!(
                "fsdp2 shards the model over the job's ranks, and this job has {processes}: ask for at \
                 least 2 (resources.devices × resources.nodes), or leave engine.strategy out"
            ),
        );
    }
    let per_pass = micro.saturating_mul(processes.max(1));
    let accumulation = if per_pass > 0 && rows % per_pass == 0 {
        rows / per_pass
    } else {
        refusals.add(
            "optimizer.micro_batch_size",
            format!(
                "{what}, {rows}, must split into passes of micro_batch_size ({}) on each of the {processes} \
                 processes (resources.devices × resources.nodes)",
                o.micro_batch_size
            ),
        );
        0
    };
    TrlTraining {
        learning_rate: o.lr,
        lr_scheduler_type: match o.lr_schedule {
            LrSchedule::Constant => "constant",
            LrSchedule::Linear => "linear",
            LrSchedule::Cosine => "cosine",
        }
        .to_owned(),
        warmup_steps: o.warmup_steps,
        weight_decay: o.weight_decay,
        adam_beta1: o.adam_beta1,
        adam_beta2: o.adam_beta2,
        adam_epsilon: o.adam_eps,
        max_grad_norm: o.grad_clip,
        per_device_train_batch_size: micro,
        gradient_accumulation_steps: accumulation,
        max_steps: spec.budget.max_steps,
        save_steps: spec.checkpoint.every_steps,
        save_total_limit: spec.checkpoint.keep_last,
        seed: spec.job.seed,
        bf16: spec.model.dtype == Dtype::Bf16,
        fsdp: (spec.engine.strategy == Strategy::Fsdp2).then(TrlFsdp::fsdp2),
    }
}

/// The `dpo` plugin's keys (its defaults: β 0.1, no smoothing), as TRL's DPO takes them.
fn read_dpo_keys(options: &Map<String, Value>, refusals: &mut Refusals) -> (f64, f64) {
    let (mut beta, mut label_smoothing) = (0.1, 0.0);
    for (key, value) in options {
        match (key.as_str(), value.as_f64()) {
            ("beta", Some(number)) => beta = number,
            ("label_smoothing", Some(number)) => label_smoothing = number,
            _ => refusals.add(&format!("optimizer.{key}"), "not a dpo key the trl engine maps"),
        }
    }
    (beta, label_smoothing)
}

/// The `sft` plugin's keys, as TRL's SFT can take them.
fn read_sft_keys(options: &Map<String, Value>, refusals: &mut Refusals) {
    for (key, value) in options {
        let field = format!("optimizer.{key}");
        match key.as_str() {
            "loss_agg" if value.as_str() == Some("token-mean") => {}
            "loss_agg" => refusals
                .add(&field, "the trl engine takes \"token-mean\" only: TRL's SFT loss is the token mean"),
            _ => refusals.add(&field, "not an sft key the trl engine maps"),
        }
    }
}

/// Every problem of running `spec` on its `[engine]` (none for a native job): what [`trl_grpo`]
/// refuses, for the submit's checks.
pub fn engine_problems(spec: &JobSpec) -> Vec<SpecError> {
    match spec.engine.kind {
        EngineKind::Native if spec.engine.strategy != Strategy::Ddp => vec![SpecError {
            field: "engine.strategy".to_owned(),
            message: format!(
                "{} shards an engine job's ranks; the native worker trains on one device (set engine.kind = \"trl\")",
                spec.engine.strategy.name()
            ),
        }],
        EngineKind::Native if spec.engine.heldout != HeldoutBy::Worker => vec![SpecError {
            field: "engine.heldout".to_owned(),
            message: "the engine's ranks complete the held-out prompts of an engine job; the native worker \
                      scores its own (set engine.kind = \"trl\")"
                .to_owned(),
        }],
        EngineKind::Native => Vec::new(),
        EngineKind::Trl => {
            let mut problems = trl_trainer(spec, spec.resources.ranks()).err().unwrap_or_default();
            if spec.resources.nodes > 1 && spec.engine.launcher == Launcher::Local {
                problems.push(SpecError {
                    field: "resources.nodes".to_owned(),
                    message: format!(
                        "{} nodes: torchrun here starts ranks on this host only; set engine.launcher = \"ray\" \
                         for a job that spans a cluster's nodes",
                        spec.resources.nodes
                    ),
                });
            }
            problems
        }
    }
}

/// The refusals gathered so far.
#[derive(Default)]
struct Refusals(Vec<SpecError>);

impl Refusals {
    fn add(&mut self, field: &str, message: impl Into<String>) {
        self.0.push(SpecError { field: field.to_owned(), message: message.into() });
    }
}

/// What the engine path cannot do whatever the optimizer: the sections the native step loop
/// runs and TRL's trainer has no place for.
fn refuse_what_trl_cannot_run(spec: &JobSpec, refusals: &mut Refusals) {
    if spec.model.reference != "same" && spec.model.reference != spec.model.policy {
        refusals.add("model.reference", "TRL's reference is the starting policy; leave model.reference out");
    }
    if spec.model.lora.is_some() {
        refusals.add(
            "model.lora",
            "the trl engine trains every weight here; LoRA jobs run on engine.kind = \"native\"",
        );
    }
    if spec.model.activation_checkpointing {
        refusals.add("model.activation_checkpointing", "not passed to the trl engine yet");
    }
    if spec.optimizer.micro_batch_tokens.is_some() {
        refusals.add(
            "optimizer.micro_batch_tokens",
            "TRL splits passes by rows only (optimizer.micro_batch_size)",
        );
    }
    if spec.curriculum.is_some() {
        refusals.add("curriculum", "TRL samples its own prompt order; a curriculum cannot steer it");
    }
    if !spec.rollout.stop.is_empty() {
        refusals.add("rollout.stop", "the trl engine ends completions at EOS or max_new_tokens only");
    }
    if spec.rollout.ignore_eos {
        refusals.add("rollout.ignore_eos", "TRL's trainers end a completion at its EOS token");
    }
    if spec.rollout.dynamic_sampling_rounds > 0 {
        refusals.add("rollout.dynamic_sampling_rounds", "TRL's GRPOTrainer has no dynamic sampling");
    }
    if spec.rollout.engine == RolloutEngine::Vllm {
        if spec.rollout.off_policy_steps > 0 {
            refusals.add(
                "rollout.off_policy_steps",
                "TRL samples ahead only in its server mode (`trl vllm-serve` on devices of its own, the \
                 weights sent over NCCL), which the trl engine does not run; leave it out to colocate vLLM",
            );
        }
        if spec.rollout.max_logprob_gap != RolloutSection::default().max_logprob_gap {
            refusals.add(
                "rollout.max_logprob_gap",
                "TRL does not check its vLLM sync, it only corrects the mismatch (rollout.importance_cap); \
                 leave it out",
            );
        }
    }
    if spec.budget.max_generated_tokens.is_some() {
        refusals.add("budget.max_generated_tokens", "the trl engine's budget is budget.max_steps");
    }
    if spec.budget.max_wall_minutes.is_some() {
        refusals.add("budget.max_wall_minutes", "the trl engine's budget is budget.max_steps");
    }
    if spec.eval.every_steps > 0 && spec.engine.heldout == HeldoutBy::Worker {
        refusals.add(
            "eval.every_steps",
            "the worker scores an engine job's held-out before and after its run only; set engine.heldout = \
             \"engine\" to have the ranks complete it during the run",
        );
    }
    let stop = &spec.stop;
    let stops = [
        ("stop.kl_max", stop.kl_max.is_some()),
        ("stop.heldout_drop_max", stop.heldout_drop_max.is_some()),
        ("stop.length_growth_max", stop.length_growth_max.is_some()),
        ("stop.verifier_timeout_rate_max", stop.verifier_timeout_rate_max.is_some()),
        ("stop.verifier_error_rate_max", stop.verifier_error_rate_max.is_some()),
    ];
    for (field, set) in stops {
        if set {
            refusals.add(field, "the trl engine's steps are not watched by [stop] conditions");
        }
    }
    for (i, grader) in spec.verifiers.iter().enumerate() {
        if grader.plugin.split('@').next() == Some(crate::spec::REWARD_MODEL_GRADER) {
            refusals.add(
                &format!("verifiers[{i}].plugin"),
                "the engine's rewards come from the daemon's POST /v1/verify, which scores no reward model",
            );
        }
    }
}

/// The `grpo` plugin's keys, read as TRL can take them.
struct GrpoKeys {
    loss_type: &'static str,
    scale_rewards: String,
    clip_eps_low: f64,
    clip_eps_high: Option<f64>,
    kl_beta: f64,
    importance_sampling_level: String,
    overlong_buffer: Option<u32>,
    overlong_penalty: Option<f64>,
}

impl GrpoKeys {
    /// The GRPO keys of `spec` with the shared `training` ones.
    fn config(self, spec: &JobSpec, training: TrlTraining) -> TrlGrpoConfig {
        TrlGrpoConfig {
            training,
            num_generations: spec.optimizer.group_size,
            num_iterations: spec.optimizer.mu,
            loss_type: self.loss_type.to_owned(),
            scale_rewards: self.scale_rewards,
            epsilon: self.clip_eps_low,
            epsilon_high: self.clip_eps_high.unwrap_or(self.clip_eps_low),
            beta: self.kl_beta,
            importance_sampling_level: self.importance_sampling_level,
            max_completion_length: spec.rollout.max_new_tokens,
            temperature: spec.rollout.temperature,
            top_p: spec.rollout.top_p,
            top_k: spec.rollout.top_k,
            overlong: self
                .overlong_buffer
                .map(|buffer| TrlOverlong { buffer, weight: self.overlong_penalty.unwrap_or(1.0) }),
            vllm: (spec.rollout.engine == RolloutEngine::Vllm).then(|| TrlVllm {
                use_vllm: true,
                vllm_mode: "colocate".to_owned(),
                vllm_enable_sleep_mode: true,
                vllm_importance_sampling_correction: spec.rollout.importance_cap > 0.0,
                vllm_importance_sampling_mode: "token_truncate".to_owned(),
                // TRL's default where ours is off: never read then.
                vllm_importance_sampling_clip_max: if spec.rollout.importance_cap > 0.0 {
                    spec.rollout.importance_cap
                } else {
                    3.0
                },
            }),
        }
    }

    fn read(options: &Map<String, Value>, refusals: &mut Refusals) -> GrpoKeys {
        let mut keys = GrpoKeys {
            loss_type: "grpo",
            scale_rewards: "group".to_owned(),
            clip_eps_low: 0.2,
            clip_eps_high: None,
            kl_beta: 0.04,
            importance_sampling_level: "token".to_owned(),
            overlong_buffer: None,
            overlong_penalty: None,
        };
        for (key, value) in options {
            let field = format!("optimizer.{key}");
            let text = value.as_str();
            let number = value.as_f64();
            let mut only = |allowed: &str, ok: bool, why: &str| {
                if !ok {
                    refusals.add(&field, format!("the trl engine takes {allowed} only: {why}"));
                }
            };
            match key.as_str() {
                "scale_rewards" => match text {
                    Some(scale @ ("group" | "batch" | "none")) => keys.scale_rewards = scale.to_owned(),
                    _ => only("group, batch or none", false, "TRL's scale_rewards"),
                },
                "std" => {
                    only("\"sample\"", text == Some("sample"), "TRL divides by the Bessel-corrected std")
                }
                "eps" => only("1e-4", number == Some(1e-4), "TRL adds 1e-4 to the std"),
                "clip_eps_low" => keys.clip_eps_low = number.unwrap_or(keys.clip_eps_low),
                "clip_eps_high" => keys.clip_eps_high = number,
                "kl_beta" => keys.kl_beta = number.unwrap_or(keys.kl_beta),
                "kl_estimator" => only("\"k3\"", text == Some("k3"), "TRL's KL term is the k3 estimator"),
                "kl_in" => only("\"loss\"", text == Some("loss"), "TRL has no KL in the reward"),
                "loss_agg" => match text {
                    Some("token-mean") => keys.loss_type = "dapo",
                    Some("seq-mean-token-mean") => keys.loss_type = "grpo",
                    Some("seq-mean-token-sum-norm") => keys.loss_type = "dr_grpo",
                    _ => only(
                        "token-mean, seq-mean-token-mean or seq-mean-token-sum-norm",
                        false,
                        "TRL's loss_type",
                    ),
                },
                "loss" => only(
                    "\"ppo-clip\"",
                    text == Some("ppo-clip"),
                    "TRL's cispo caps the weight at epsilon_high itself and has no lower clip; ours clips at 1 ± ε",
                ),
                "importance_ratio" => match text {
                    Some(level @ ("token" | "sequence")) => keys.importance_sampling_level = level.to_owned(),
                    _ => only("token or sequence", false, "TRL's importance_sampling_level"),
                },
                "clip_ratio_c" => refusals.add(
                    &field,
                    "TRL has no dual clip (its delta clips the ratio of every token, not the loss)",
                ),
                "overlong_buffer" => {
                    keys.overlong_buffer = value.as_u64().and_then(|n| u32::try_from(n).ok())
                }
                "overlong_penalty" => keys.overlong_penalty = number,
                "entropy_coef" => only("0", number == Some(0.0), "TRL has no entropy bonus"),
                _ => refusals.add(&field, "not a grpo key the trl engine maps"),
            }
        }
        keys
    }
}

/// What the worker hands the engine's entry script (`engines/trl/run.py`), as
/// `<run>/engine/contract.json`. The script reads nothing else of the job.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EngineContract {
    /// Which TRL trainer, with its keys.
    pub trainer: TrlTrainer,
    /// The starting model, a Hugging Face directory (the built-in model exported first).
    pub model: PathBuf,
    /// `data.train`: JSONL prompts with `id`, `prompt` and `reference` (GRPO), or demonstrations
    /// with `prompt` and `completion` (SFT). A prompt goes through the model's chat template when
    /// its tokenizer has one, as the native worker does.
    pub train: PathBuf,
    /// Where the engine checkpoints (`checkpoint-N/`) and writes its final model (`final/`).
    pub output_dir: PathBuf,
    /// Where rank 0 appends one `MetricsLine` per step.
    pub metrics: PathBuf,
    /// The daemon's `POST /v1/verify` and the body's reward: the job's graders and formula,
    /// exactly as its spec writes them (a GRPO job's rewards).
    pub verify: VerifyAccess,
    /// `engine.heldout = "engine"`: the prompt sets the ranks complete for the worker to score.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub heldout: Option<HeldoutContract>,
}

/// The held-out prompts (and the gates' canaries) the ranks complete greedily, each rank a share,
/// rank 0 writing every completion in the set's order to `<dir>/<at>/<set>.jsonl` (one
/// [`EngineCompletion`] a line), then `<dir>/<at>/DONE`: `at` is `start` (the starting weights,
/// before the first step), `step-N` (the held-out set only, every `every_steps`), `final` (the
/// final model) and `baseline` (`baseline_model`, before the first step). A start that finds an
/// `at` done skips it (a resume). The worker tokenizes the prompts (its chat template, its
/// tokenizer) and decodes the completions, so both ends are its own sampler's.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HeldoutContract {
    /// The held-out prompts (`data.heldout`'s first `eval.max_prompts`): one [`EngineCompletion`]
    /// a line, its `tokens` the prompt's ids.
    pub heldout: PathBuf,
    /// `data.canaries`, as `heldout`: completed at `start`, `final` and `baseline`.
    pub canaries: Option<PathBuf>,
    /// `rollout.max_new_tokens`.
    pub max_new_tokens: u32,
    /// `eval.every_steps` (0: before and after training only).
    pub every_steps: u64,
    /// Where the completions go.
    pub dir: PathBuf,
    /// The gates' baseline when it is not the starting model (the model line's published
    /// version), a Hugging Face directory each rank loads whole, once, before training.
    pub baseline_model: Option<PathBuf>,
}

/// A line of a [`HeldoutContract`] file: a prompt's ids, or a completion's generated ids after
/// its prompt (the first EOS and what follows are the worker's to cut, by its own sampler's rules).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EngineCompletion {
    pub tokens: Vec<i64>,
}

/// How the engine gets its rewards: the daemon's dry-run route, with the job's graders.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VerifyAccess {
    /// `http://HOST:PORT/v1/verify`.
    pub url: String,
    /// The job's reward: its graders and formula, as `POST /v1/verify` takes them.
    pub reward: crate::api::RewardRequest,
    /// The file holding the job-scoped token, readable by its owner only: the ranks read it
    /// there, so it is in no process's argv or environment and in no cluster's job record (a Ray
    /// job's runtime environment is shown on its dashboard).
    pub token_file: PathBuf,
}

/// The environment variable that carries the job-scoped token from the daemon to the worker
/// (never in argv, which other users can read); the worker hands it to an engine's ranks in
/// [`VerifyAccess::token_file`], not in their environment.
pub const JOB_TOKEN_ENV: &str = "RLVR_JOB_TOKEN";

#[cfg(test)]
#[path = "engine_tests.rs"]
mod tests;
