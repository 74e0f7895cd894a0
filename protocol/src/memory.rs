//! What a job needs in memory on its device, known before it runs: an estimate from the model's
//! shape and the spec, split into what the job holds all along (**resident**: weights, the
//! reference, optimizer state) and what one phase adds while it runs (**phase peak**: the KV
//! cache of a rollout, the activations and logits of an update, the gates' baseline of an
//! evaluation).
//!
//! A device serves one phase at a time (`sched`'s grants), so jobs sharing a device need the sum
//! of their resident parts plus the largest of their phase peaks: that is how the scheduler packs
//! them, and how submit fills `[resources] memory_gb` (resident + largest peak) and
//! `resident_gb` when the spec leaves them out.
//!
//! Pure: the caller reads `config.json` and the data; no IO, no libtorch. The figures follow
//! what the worker allocates (`rlvr-worker`'s models, AdamW with f32 moments and, for bf16, f32
//! master weights and gradient sums; generation with a KV cache per row; log-probabilities from
//! hidden states at the completion positions), with constants measured against the worker's
//! peak resident size on CPU (`tests/tests/estimate.rs`); the book's scheduling page has the figures.
//!
//! [`ModelShape`] comes from a `config.json`'s text or the built-in model's; [`estimate`] takes the
//! spec and [`Inputs`] and returns a [`MemoryEstimate`]: the resident parts and each phase's. The
//! daemon's side, which reads the configs and the data, is `daemon/src/jobs/estimate.rs`.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::spec::{Dtype, JobSpec, LoraTarget, RolloutEngine};

/// Bytes in one GB of the spec's and the inventory's figures (a GiB, as NVML and `free -g`).
pub const BYTES_PER_GB: f64 = (1u64 << 30) as f64;

/// What libtorch, the plugins and the worker's own code take in a CPU worker's resident size
/// before any model: its libraries' pages and allocator arenas. About what a worker of the
/// built-in model holds after loading it (0.5–0.7 GB); with it, tests/tests/estimate.rs's cases
/// come within 7% of their measured peaks.
pub const CPU_RUNTIME_BYTES: u64 = 600 << 20;

/// What a CUDA context and libtorch's kernels take on a GPU before any tensor (not counted by
/// libtorch's allocator, but by the device). An allowance, not yet measured: no GPU has run
/// the estimate.
pub const CUDA_CONTEXT_BYTES: u64 = 512 << 20;

/// What submit adds to the estimate's peak when it fills `memory_gb`: the worker is held to that
/// figure (past it, it ends out of memory and is requeued larger), and the peak moves by what
/// the estimate does not model: the allocator's arenas and fragmentation, libtorch's
/// temporaries. In tests/tests/estimate.rs's cases the estimate came within −5% to +8% of one
/// run's peak, and the same job's peak moved by up to 8% from run to run.
pub const HEADROOM: f64 = 0.15;

/// What a `rollout.engine = "vllm"` job's server holds on a CPU besides its weights and KV
/// cache: two Python processes with torch and vLLM loaded (the API server 0.9 GB, the engine
/// 1.1 GB, measured with vLLM 0.26.0's CPU build serving `builtin:tiny-arith`).
pub const VLLM_CPU_RUNTIME_BYTES: u64 = 2 << 30;

/// … on a GPU: its CUDA context and the activations of its profiling pass. An allowance, not
/// measured: no GPU has run vLLM here.
pub const VLLM_CUDA_RUNTIME_BYTES: u64 = 1 << 30;

/// Tokens in one block of a vLLM server's KV cache on `device`: vLLM's defaults (0.26), 128 for
/// its CPU backend and 16 on CUDA. A sequence holds whole blocks, however short it is.
pub fn vllm_block_tokens(device: DeviceKind) -> u64 {
    match device {
        DeviceKind::Cpu => 128,
        DeviceKind::Cuda => 16,
    }
}

/// The KV cache a job's vLLM server is started with (`--kv-cache-memory-bytes`): every row of a
/// step (prompts × group size) at `sequence_tokens` (its longest prompt and `max_new_tokens`) in
/// whole blocks of [`vllm_block_tokens`], so the server decodes a step's rows at once, as the
/// native sampler does, and never queues them for want of cache; plus 16 MiB, since vLLM keeps a
/// block back and rounds the cache down to whole blocks. (Counted in tokens rather than blocks,
/// a step of 512 rows of 10 tokens got 104 of the 128-token CPU blocks it needed and was
/// decoded in five waves.)
pub fn vllm_kv_cache_bytes(
    spec: &JobSpec,
    shape: &ModelShape,
    sequence_tokens: u64,
    device: DeviceKind,
) -> u64 {
    let rows = u64::from(spec.rollout.prompts_per_step) * u64::from(spec.optimizer.group_size);
    let block = vllm_block_tokens(device);
    rows * sequence_tokens.div_ceil(block) * block * shape.kv_bytes_per_token(spec.model.dtype) + (16 << 20)
}

/// Bytes of one element of `dtype`.
fn element_bytes(dtype: Dtype) -> u64 {
    match dtype {
        Dtype::F32 => 4,
        Dtype::Bf16 => 2,
    }
}

/// Prompts an evaluation generates at once: the worker's batch, and the estimate's.
pub const EVAL_BATCH: u64 = 64;

/// Tokens a chat template may add around a prompt, beyond its own text: an allowance, since
/// submit does not render templates.
pub const TEMPLATE_TOKENS: u64 = 32;

/// The f32 logits one chunk of a log-probability pass may hold: 64 MiB, which is 110 positions
/// of a 152k vocabulary (Qwen2.5), 341 of a 49k one (SmolLM2), and every position a batch of the
/// 101-token built-in model has (up to 166k). A chunk has a few times that alive at once (the
/// logits in the model's dtype, their f32 copy, the tempered copy, logsumexp's exponentials; in
/// a training pass's backward, that chunk's graph and its logits' gradient): a few hundred MiB,
/// where the whole `[B × C × V]` is 1.1–1.4 GiB of f32 per 1k completion tokens, which a training
/// pass's graph used to keep until its backward pass. Smaller chunks would save little more and
/// cost more: each chunk reads the `lm_head` weight (`V × hidden`) twice and, when that weight
/// (or the tied embeddings) trains, adds a gradient as large as it — a cost per chunk, not per
/// position.
pub const LOGITS_CHUNK_BYTES: u64 = 64 << 20;

/// Positions per chunk of logits for a vocabulary of `vocab`: [`LOGITS_CHUNK_BYTES`] of f32, at
/// least one (the model's default `logits_chunk`).
pub const fn logits_chunk_positions(vocab: u64) -> u64 {
    let positions = LOGITS_CHUNK_BYTES / (4 * if vocab == 0 { 1 } else { vocab });
    if positions == 0 { 1 } else { positions }
}

/// The shape of a Llama-family model: what its memory depends on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ModelShape {
    pub hidden: u64,
    pub intermediate: u64,
    pub layers: u64,
    pub heads: u64,
    pub kv_heads: u64,
    pub head_dim: u64,
    pub vocab: u64,
    pub tied_embeddings: bool,
    /// Biases on q, k and v (Qwen2, Llama's `attention_bias`).
    pub qkv_bias: bool,
    pub o_bias: bool,
    pub mlp_bias: bool,
    /// `max_position_embeddings`, when the config has it.
    pub max_positions: Option<u64>,
}

impl ModelShape {
    /// The keys and values one token holds in a KV cache, in bytes of `dtype`.
    pub fn kv_bytes_per_token(&self, dtype: Dtype) -> u64 {
        2 * self.layers * self.kv_heads * self.head_dim * element_bytes(dtype)
    }

    /// `builtin:tiny-arith` (its `config.json`: `rlvr_model::builtin::config`; a test there
    /// checks they agree).
    pub const BUILTIN: ModelShape = ModelShape {
        hidden: 128,
        intermediate: 384,
        layers: 4,
        heads: 4,
        kv_heads: 2,
        head_dim: 32,
        vocab: 101,
        tied_embeddings: true,
        qkv_bias: false,
        o_bias: false,
        mlp_bias: false,
        max_positions: Some(512),
    };

    /// The shape a `config.json` describes, with transformers' defaults (Qwen2's q/k/v biases,
    /// `head_dim = hidden / heads`, as many KV heads as heads, tied embeddings off).
    pub fn from_config_json(text: &str) -> Result<ModelShape, String> {
        let value: Value = serde_json::from_str(text).map_err(|error| format!("not JSON: {error}"))?;
        let count = |key: &str| -> Result<Option<u64>, String> {
            match value.get(key) {
                None | Some(Value::Null) => Ok(None),
                Some(number) => match number.as_u64() {
                    Some(n) if n > 0 => Ok(Some(n)),
                    _ => Err(format!("{key}: expected a positive integer, got {number}")),
                },
            }
        };
        let required = |key: &str| count(key)?.ok_or_else(|| format!("{key}: missing"));
        let flag = |key: &str| value.get(key).and_then(Value::as_bool);
        let hidden = required("hidden_size")?;
        let heads = required("num_attention_heads")?;
        let qwen2 = value.get("model_type").and_then(Value::as_str) == Some("qwen2");
        let attention_bias = flag("attention_bias").unwrap_or(false);
        Ok(ModelShape {
            hidden,
            intermediate: required("intermediate_size")?,
            layers: required("num_hidden_layers")?,
            heads,
            kv_heads: count("num_key_value_heads")?.unwrap_or(heads),
            head_dim: count("head_dim")?.unwrap_or(hidden / heads),
            vocab: required("vocab_size")?,
            tied_embeddings: flag("tie_word_embeddings").unwrap_or(false),
            qkv_bias: qwen2 || attention_bias,
            o_bias: attention_bias,
            mlp_bias: flag("mlp_bias").unwrap_or(false),
            max_positions: count("max_position_embeddings")?,
        })
    }

    /// `[in, out]` of each linear layer of one decoder layer, by LoRA target.
    fn linears(&self) -> [(LoraTarget, u64, u64); 7] {
        let (h, i) = (self.hidden, self.intermediate);
        let (q, kv) = (self.heads * self.head_dim, self.kv_heads * self.head_dim);
        [
            (LoraTarget::QProj, h, q),
            (LoraTarget::KProj, h, kv),
            (LoraTarget::VProj, h, kv),
            (LoraTarget::OProj, q, h),
            (LoraTarget::GateProj, h, i),
            (LoraTarget::UpProj, h, i),
            (LoraTarget::DownProj, i, h),
        ]
    }

    /// Parameters: embeddings, the LM head unless tied, each layer's linears, biases and norms,
    /// the final norm.
    pub fn parameters(&self) -> u64 {
        let (q, kv) = (self.heads * self.head_dim, self.kv_heads * self.head_dim);
        let mut layer: u64 = self.linears().iter().map(|(_, i, o)| i * o).sum::<u64>() + 2 * self.hidden;
        if self.qkv_bias {
            layer += q + 2 * kv;
        }
        if self.o_bias {
            layer += self.hidden;
        }
        if self.mlp_bias {
            layer += 2 * self.intermediate + self.hidden;
        }
        let head = if self.tied_embeddings { 0 } else { self.vocab * self.hidden };
        self.vocab * self.hidden + head + self.layers * layer + self.hidden
    }

    /// LoRA's parameters at `rank` on `targets`: `rank × (in + out)` per adapted linear.
    pub fn lora_parameters(&self, rank: u64, targets: &[LoraTarget]) -> u64 {
        let per_layer: u64 = self
            .linears()
            .iter()
            .filter(|(t, _, _)| targets.contains(t))
            .map(|(_, i, o)| rank * (i + o))
            .sum();
        self.layers * per_layer
    }

    /// The largest single tensor, in elements (a backward pass's transient gradient).
    fn largest_tensor(&self) -> u64 {
        let linear = self.linears().iter().map(|(_, i, o)| i * o).max().unwrap_or(0);
        linear.max(self.vocab * self.hidden)
    }
}

/// Where the job runs: what the device holds besides the job's tensors.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "lowercase")]
pub enum DeviceKind {
    Cpu,
    Cuda,
}

/// What the optimizer plugin keeps beside the policy (its `OptimizerInfo`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct OptimizerNeeds {
    pub reference: bool,
    pub value_head: bool,
    /// Offline preference pairs (DPO): each record is two rows, its chosen and its rejected
    /// completion.
    pub pairs: bool,
    /// Offline (SFT, DPO): completions come from the data, not from sampling.
    pub offline: bool,
    /// The trained model is a reward model (`rm`): the policy's backbone with a score head, one
    /// score per sequence — no logits over the vocabulary, no activation checkpointing (the
    /// worker's reward-model pass keeps its whole graph), held-out pairs scored, not sampled.
    pub reward_model: bool,
}

/// Token lengths the job's data can reach, as submit bounds them (a token is at least one byte
/// of text, so a record's bytes bound its tokens).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct DataLengths {
    /// The longest prompt.
    pub prompt_tokens: u64,
    /// The longest completion of an offline record (chosen or rejected for pairs); 0 online.
    pub completion_tokens: u64,
    /// The longest held-out prompt; 0 without a held-out set.
    pub heldout_prompt_tokens: u64,
}

impl DataLengths {
    /// Reads the longest `prompt` and completion (`completion`, `chosen`, `rejected`) of a
    /// JSONL file's records, in bytes, a line at a time; lines that are not records are skipped
    /// (the worker refuses them with their line number).
    pub fn scan_jsonl(lines: impl std::io::BufRead) -> std::io::Result<(u64, u64)> {
        let (mut prompt, mut completion) = (0u64, 0u64);
        for line in lines.lines() {
            let Ok(Value::Object(record)) = serde_json::from_str::<Value>(&line?) else { continue };
            let bytes = |key: &str| record.get(key).and_then(Value::as_str).map_or(0, |s| s.len() as u64);
            prompt = prompt.max(bytes("prompt"));
            completion = completion.max(bytes("completion")).max(bytes("chosen")).max(bytes("rejected"));
        }
        Ok((prompt, completion))
    }
}

/// One part of an estimate.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Part {
    pub name: String,
    pub bytes: u64,
}

/// What one phase adds on top of the resident part while it runs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct PhasePeak {
    /// `rollout`, `update` or `eval`.
    pub phase: String,
    pub parts: Vec<Part>,
}

impl PhasePeak {
    pub fn bytes(&self) -> u64 {
        self.parts.iter().map(|part| part.bytes).sum()
    }
}

/// A job's memory on each of its devices.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct MemoryEstimate {
    pub device: DeviceKind,
    /// Held from start to end.
    pub resident: Vec<Part>,
    /// Added by each phase while it runs.
    pub phases: Vec<PhasePeak>,
}

impl MemoryEstimate {
    pub fn resident_bytes(&self) -> u64 {
        self.resident.iter().map(|part| part.bytes).sum()
    }

    /// The largest phase, and what it adds.
    pub fn largest_phase(&self) -> Option<&PhasePeak> {
        self.phases.iter().max_by_key(|phase| phase.bytes())
    }

    /// What the job needs alone: resident plus its largest phase.
    pub fn total_bytes(&self) -> u64 {
        self.resident_bytes() + self.largest_phase().map_or(0, PhasePeak::bytes)
    }

    /// [`Self::resident_bytes`] in GB, rounded up to a tenth: the spec's `resident_gb`.
    pub fn resident_gb(&self) -> f64 {
        round_up_gb(self.resident_bytes())
    }

    /// [`Self::total_bytes`] plus [`HEADROOM`], in GB rounded up to a tenth: the spec's
    /// `memory_gb`, which is also the worker's cap.
    pub fn total_gb(&self) -> f64 {
        round_up_gb((self.total_bytes() as f64 * (1.0 + HEADROOM)) as u64)
    }
}

/// `bytes` in GB, rounded up to a tenth.
pub fn round_up_gb(bytes: u64) -> f64 {
    up_to_a_tenth(bytes as f64 / BYTES_PER_GB)
}

/// `gb` rounded up to a tenth, at least 0.1: how the spec's memory figures are written.
pub fn up_to_a_tenth(gb: f64) -> f64 {
    // In tenths, less a hair, so 1.5 stays 1.5 rather than 1.6 for a product's last bit.
    let tenths = (gb * 10.0 - 1e-9).ceil().max(1.0);
    tenths / 10.0
}

/// A `reward-model` grader's model and how it is batched (`[[verifiers]]` keys).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RewardModelInput {
    /// Its backbone's shape (its LM-head entry, if any, is not loaded).
    pub shape: ModelShape,
    pub batch_size: u64,
    pub max_length: u64,
}

/// What the estimate is made from, besides the spec.
#[derive(Debug, Clone, PartialEq)]
pub struct Inputs {
    pub policy: ModelShape,
    /// The reference's shape when it is a model of its own (`model.reference` not `same`).
    pub reference: Option<ModelShape>,
    /// The gates' baseline when it is a model loaded for the evaluation (a line's published
    /// version, or the start when the policy has no adapters to switch off).
    pub baseline: Option<ModelShape>,
    pub needs: OptimizerNeeds,
    pub data: DataLengths,
    pub device: DeviceKind,
    /// The `reward-model` graders' models, in the spec's order.
    pub reward_models: Vec<RewardModelInput>,
}

/// Bytes saved per token per decoder layer for the backward pass, in units of the model's
/// element size: the norms' inputs and outputs, q, k, v before and after RoPE, attention's
/// output and o_proj's, the MLP's gate, up, their activation and product, and the residual
/// sums. Measured against the worker (tests/tests/estimate.rs); see `activation_elements`.
const SAVED_HIDDEN: u64 = 8;
const SAVED_ATTENTION: u64 = 5;
const SAVED_MLP: u64 = 5;

/// f32 copies of a chunk of logits alive at once in a training pass: the logits, their f32 copy
/// and the log-sum-exp's saved input, and the gradient of one of them in backward.
const LOGITS_COPIES: u64 = 4;

/// Copies of the hidden states at the completion positions a training pass holds beside the
/// model's graph: the leaf the log-probabilities read, its gradient, and the gradient's chunks.
const HIDDEN_COPIES: u64 = 3;

/// The estimate for `spec` run with `inputs`.
pub fn estimate(spec: &JobSpec, inputs: &Inputs) -> MemoryEstimate {
    let shape = &inputs.policy;
    let element = element_bytes(spec.model.dtype);
    let part = |name: &str, bytes: u64| Part { name: name.to_owned(), bytes };
    let mut resident = vec![match inputs.device {
        DeviceKind::Cpu => part("runtime (libtorch, plugins)", CPU_RUNTIME_BYTES),
        DeviceKind::Cuda => part("CUDA context", CUDA_CONTEXT_BYTES),
    }];

    // Weights and what trains.
    let parameters = if inputs.needs.reward_model {
        // The backbone without an untied LM head, and a one-row score head.
        let lm_head = if shape.tied_embeddings { 0 } else { shape.vocab * shape.hidden };
        shape.parameters() - lm_head + shape.hidden
    } else {
        shape.parameters()
    };
    let weights = if inputs.needs.reward_model { "reward model weights" } else { "policy weights" };
    resident.push(part(weights, parameters * element));
    let trainable = match &spec.model.lora {
        Some(lora) => {
            let adapters = shape.lora_parameters(u64::from(lora.rank), &lora.target_modules);
            resident.push(part("LoRA adapters", adapters * element));
            adapters
        }
        None => parameters,
    };
    let value_head = if inputs.needs.value_head { shape.hidden + 1 } else { 0 };
    if value_head > 0 {
        resident.push(part("value head", value_head * 4));
    }
    let trained = trainable + value_head;
    // f32 moments; f32 gradients (bf16: the parameter's own gradient, an f32 sum and an f32
    // master copy). The fused update needs no scratch memory.
    let per_trained = match spec.model.dtype {
        Dtype::F32 => 4 + 4 + 4,
        Dtype::Bf16 => 4 + 4 + 2 + 4 + 4,
    };
    resident.push(part("optimizer (AdamW state, gradients)", trained * per_trained));
    // One step off policy: a copy of what trains, the weights that sampled the step.
    if spec.rollout.off_policy_steps > 0 {
        resident.push(part("sampling weights (off policy)", trainable * element));
    }

    let reference_copy =
        inputs.needs.reference && !(spec.model.lora.is_some() && spec.model.reference == "same");
    if reference_copy {
        let reference = inputs.reference.unwrap_or(*shape);
        resident.push(part("reference weights", reference.parameters() * element));
    }

    // Reward models: resident in the policy's dtype for the whole run, backbone and a head of
    // a few rows (counted as one). Scored one at a time, each batch a no-grad pass.
    let reward_weights: u64 = inputs
        .reward_models
        .iter()
        .map(|rm| {
            let lm_head = if rm.shape.tied_embeddings { 0 } else { rm.shape.vocab * rm.shape.hidden };
            rm.shape.parameters() - lm_head + rm.shape.hidden
        })
        .sum();
    if reward_weights > 0 {
        resident.push(part("reward model weights", reward_weights * element));
    }
    let reward_pass = inputs
        .reward_models
        .iter()
        .map(|rm| {
            let tokens = rm.batch_size * rm.max_length;
            vec![
                part("reward model pass", tokens * layer_step_elements(&rm.shape) * element),
                // Rows × heads × length², as in the update.
                part("reward model attention scores", tokens * rm.shape.heads * rm.max_length * element),
            ]
        })
        .max_by_key(|parts| parts.iter().map(|p| p.bytes).sum::<u64>());

    // Sequence lengths.
    let new_tokens = u64::from(spec.rollout.max_new_tokens);
    let prompt = inputs.data.prompt_tokens + TEMPLATE_TOKENS;
    let completion = match &spec.env {
        // An episode: its turns and the environment's replies between them, each reply counted
        // as long as a turn (what an environment answers is not known before it runs).
        Some(env) => u64::from(env.max_turns) * 2 * new_tokens,
        None if inputs.needs.offline => inputs.data.completion_tokens + 1,
        None => new_tokens,
    };
    let kv_per_token = shape.kv_bytes_per_token(spec.model.dtype);

    let mut phases = Vec::new();
    // Rollout on vLLM: its server holds a copy of the weights and its KV cache all along — but
    // on a GPU it shares with the trainer it sleeps between rollouts (its weights in host memory,
    // its cache dropped), so there they are the rollout phase's, and only its runtime stays.
    if spec.rollout.engine == RolloutEngine::Vllm {
        let runtime = match inputs.device {
            DeviceKind::Cpu => VLLM_CPU_RUNTIME_BYTES,
            DeviceKind::Cuda => VLLM_CUDA_RUNTIME_BYTES,
        };
        resident.push(part("vLLM server (runtime)", runtime));
        let server = vec![
            part("vLLM weights", shape.parameters() * element),
            part("vLLM KV cache", vllm_kv_cache_bytes(spec, shape, prompt + new_tokens, inputs.device)),
        ];
        let sleeps = inputs.device == DeviceKind::Cuda && spec.rollout.off_policy_steps == 0;
        match sleeps {
            true => phases.push(PhasePeak { phase: "rollout".into(), parts: server }),
            false => resident.extend(server),
        }
    }
    // Rollout: every row of the step generated at once, each with its own KV cache.
    if !inputs.needs.offline && spec.rollout.engine == RolloutEngine::Native {
        let rows = u64::from(spec.rollout.prompts_per_step) * u64::from(spec.optimizer.group_size);
        phases.push(PhasePeak {
            phase: "rollout".into(),
            parts: vec![
                part("KV cache", rows * (prompt + new_tokens) * kv_per_token),
                part("prompt pass", rows * prompt * layer_step_elements(shape) * element),
                part("sampling (logits, top-p)", rows * shape.vocab * 4 * 4),
            ],
        });
    }

    // Update: one micro-batch's forward and backward at a time, of `micro_batch_size` rows (a
    // pair is two rows) or the step's rows when fewer, and no more tokens than
    // `micro_batch_tokens` (though never less than one unit of rows: the worker's micro-batches).
    let step_rows = u64::from(spec.rollout.prompts_per_step)
        * match (inputs.needs.offline, inputs.needs.pairs) {
            (false, _) => u64::from(spec.optimizer.group_size),
            (true, true) => 2,
            (true, false) => 1,
        };
    let unit = if inputs.needs.pairs { 2 } else { 1 };
    let sequence = prompt + completion;
    let rows_per_micro =
        (u64::from(spec.optimizer.micro_batch_size) / unit * unit).max(unit).min(step_rows.max(unit));
    // An online group's rows share its prompt in a pass: the prompt runs once and its keys and
    // values are copied to each row (`rlvr_model::logprobs`), unless activation checkpointing
    // runs each row whole. A micro-batch's rows are consecutive, so it holds this many prompts.
    let group = match inputs.needs.offline || inputs.needs.reward_model || spec.model.activation_checkpointing
    {
        true => 1,
        false => u64::from(spec.optimizer.group_size).max(1),
    };
    let prompts_per_micro = rows_per_micro.div_ceil(group);
    // Padded tokens of one pass (its prompts and its rows' completions, each padded to the
    // longest), completion positions among them: bounded by the rows, or by
    // `micro_batch_tokens` — in tokens, not in rows of the longest sequence, since shorter rows
    // pack more of them into the limit.
    let mut tokens = prompts_per_micro * prompt + rows_per_micro * completion;
    if let Some(max_tokens) = spec.optimizer.micro_batch_tokens {
        tokens = tokens.min(max_tokens.max(unit * sequence));
    }
    let positions = (rows_per_micro * completion).min(tokens);
    let saved_layers = if spec.model.activation_checkpointing && !inputs.needs.reward_model {
        // Each layer's input, and one layer recomputed with its activations.
        shape.layers * tokens * shape.hidden + tokens * activation_elements(shape)
    } else {
        shape.layers * tokens * activation_elements(shape)
    };
    let mut update = vec![part("activations", saved_layers * element)];
    if spec.model.dtype == Dtype::Bf16 && inputs.device == DeviceKind::Cpu && !inputs.needs.reward_model {
        // Measured, cause not yet found: bf16 GRPO updates on a CPU peaked above the rest of
        // this estimate by about the logits of every completion position in bf16 and in f32 at
        // once (0.63 and 0.67 GB at the 0.5B and 1.5B shapes, 512 positions of a 152k
        // vocabulary: 0.47 GB), nothing of the kind in f32; 4 new tokens a row, nothing.
        update.push(part("logits of every position (bf16 on a CPU)", positions * shape.vocab * 6));
    }
    if !inputs.needs.reward_model {
        update.push(part(
            "logits (in chunks)",
            positions.min(logits_chunk_positions(shape.vocab)) * shape.vocab * 4 * LOGITS_COPIES
                + positions * shape.hidden * element * HIDDEN_COPIES,
        ));
    }
    if group > 1 {
        update.push(part(
            "prompt keys and values",
            shape.layers * rows_per_micro * prompt * 2 * shape.kv_heads * shape.head_dim * element,
        ));
    }
    // Queries × keys × heads: each prompt's tokens over its own, each completion's over its
    // prompt and itself.
    let scores = match group {
        1 => tokens * sequence,
        _ => prompts_per_micro * prompt * prompt + rows_per_micro * completion * sequence,
    };
    update.push(part("attention scores", scores * shape.heads * element));
    // Gradients computed in backward before they are added to a parameter's own: with LoRA a
    // full weight's passes through each adapted layer's input (only the adapters keep theirs);
    // in full fine-tuning the embedding's and the lm_head's (or the tied one's two), dense and
    // as large as the largest tensor.
    let transient = if spec.model.lora.is_some() { 1 } else { 2 };
    update.push(part("transient gradients", transient * shape.largest_tensor() * element));
    phases.push(PhasePeak { phase: "update".into(), parts: update });

    // Evaluation: held-out prompts generated greedily, a batch at a time, beside the gates'
    // baseline when it is a model of its own.
    if inputs.needs.reward_model && spec.data.heldout.is_some() {
        // Held-out pairs scored without grad, EVAL_BATCH rows a pass, beside the gates'
        // baseline (the start's or the line's reward model).
        let rows = EVAL_BATCH * sequence;
        let mut parts = vec![
            part("scoring pass", rows * layer_step_elements(shape) * element),
            part("attention scores", rows * shape.heads * sequence * element),
        ];
        if inputs.baseline.is_some() {
            parts.push(part("gates' baseline weights", parameters * element));
        }
        phases.push(PhasePeak { phase: "eval".into(), parts });
    } else if spec.data.heldout.is_some() || spec.data.canaries.is_some() {
        let heldout_prompt =
            inputs.data.heldout_prompt_tokens.max(inputs.data.prompt_tokens) + TEMPLATE_TOKENS;
        let mut parts = vec![
            part("KV cache", EVAL_BATCH * (heldout_prompt + new_tokens) * kv_per_token),
            part("sampling (logits)", EVAL_BATCH * shape.vocab * 4 * 2),
        ];
        if let Some(baseline) = &inputs.baseline {
            parts.push(part("gates' baseline weights", baseline.parameters() * element));
        }
        phases.push(PhasePeak { phase: "eval".into(), parts });
    }
    if let Some(parts) = reward_pass {
        phases.push(PhasePeak { phase: "reward".into(), parts });
    }
    MemoryEstimate { device: inputs.device, resident, phases }
}

/// Elements saved per token of one decoder layer in a training forward pass.
fn activation_elements(shape: &ModelShape) -> u64 {
    let attention = (shape.heads + 2 * shape.kv_heads) * shape.head_dim;
    SAVED_HIDDEN * shape.hidden + SAVED_ATTENTION * attention + SAVED_MLP * shape.intermediate
}

/// Elements alive per token while one layer of a no-grad pass runs (a prompt's prefill).
fn layer_step_elements(shape: &ModelShape) -> u64 {
    3 * shape.hidden + (shape.heads + 2 * shape.kv_heads) * shape.head_dim + 3 * shape.intermediate
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A reward model's weights are resident and its batch is a phase of its own, which grows
    /// with `batch_size × max_length`.
    #[test]
    fn reward_models_are_resident_with_a_phase() {
        let spec = JobSpec::from_toml(
            "[job]\nname = \"rm\"\nteam = \"t\"\nmodel_line = \"l\"\n[model]\npolicy = \"builtin:tiny-arith\"\n\
             [data]\ntrain = \"dataset:d\"\n[optimizer]\nplugin = \"grpo\"\n\
             [[verifiers]]\nplugin = \"reward-model\"\nmodel = \"line:rm\"\n[budget]\nmax_steps = 1\n",
        )
        .unwrap();
        let inputs = |reward_models: Vec<RewardModelInput>| Inputs {
            policy: ModelShape::BUILTIN,
            reference: None,
            baseline: None,
            needs: OptimizerNeeds::default(),
            data: DataLengths { prompt_tokens: 16, completion_tokens: 0, heldout_prompt_tokens: 0 },
            device: DeviceKind::Cpu,
            reward_models,
        };
        let rm =
            |batch_size, max_length| RewardModelInput { shape: ModelShape::BUILTIN, batch_size, max_length };
        let without = estimate(&spec, &inputs(vec![]));
        assert!(without.phases.iter().all(|phase| phase.phase != "reward"));
        let check = |batch_size: u64, max_length: u64| {
            let with = estimate(&spec, &inputs(vec![rm(batch_size, max_length)]));
            // The built-in model's embeddings are tied: all its parameters, plus a head row.
            let weights = with.resident.iter().find(|part| part.name == "reward model weights").unwrap();
            assert_eq!(weights.bytes, (ModelShape::BUILTIN.parameters() + 128) * 4);
            assert_eq!(with.resident_bytes(), without.resident_bytes() + weights.bytes);
            with.phases.iter().find(|phase| phase.phase == "reward").unwrap().bytes()
        };
        assert!(check(8, 1024) > check(8, 512));
        assert!(check(8, 512) > check(2, 512));
    }

    /// A job whose rollouts are vLLM's holds the server all along — its runtime, a copy of the
    /// weights and a KV cache for every row of a step — and samples nothing on its own device;
    /// on a GPU it shares with the trainer, the server's weights and cache are the rollout
    /// phase's (it sleeps between rollouts); one step off policy adds the sampling weights' copy.
    #[test]
    fn a_vllm_job_holds_the_server_and_has_no_rollout_phase() {
        let toml = |engine: &str| {
            format!(
                "[job]\nname = \"v\"\nteam = \"t\"\nmodel_line = \"l\"\n[model]\npolicy = \"builtin:tiny-arith\"\n\
                 [data]\ntrain = \"dataset:d\"\n[optimizer]\nplugin = \"grpo\"\ngroup_size = 4\n\
                 [[verifiers]]\nplugin = \"math\"\n[rollout]\nengine = \"{engine}\"\nprompts_per_step = 8\n\
                 max_new_tokens = 20\n[budget]\nmax_steps = 1\n"
            )
        };
        let inputs = |device| Inputs {
            policy: ModelShape::BUILTIN,
            reference: None,
            baseline: None,
            needs: OptimizerNeeds::default(),
            data: DataLengths { prompt_tokens: 12, completion_tokens: 0, heldout_prompt_tokens: 0 },
            device,
            reward_models: vec![],
        };
        let native = estimate(&JobSpec::from_toml(&toml("native")).unwrap(), &inputs(DeviceKind::Cpu));
        let spec = JobSpec::from_toml(&toml("vllm")).unwrap();
        let off_policy =
            toml("vllm").replace("max_new_tokens = 20", "max_new_tokens = 20\noff_policy_steps = 1");
        let off_policy = JobSpec::from_toml(&off_policy).unwrap();
        // (device, one step off policy, the server's runtime, the server sleeps between rollouts)
        let cases = [
            (DeviceKind::Cpu, false, VLLM_CPU_RUNTIME_BYTES, false),
            (DeviceKind::Cpu, true, VLLM_CPU_RUNTIME_BYTES, false),
            (DeviceKind::Cuda, false, VLLM_CUDA_RUNTIME_BYTES, true),
            (DeviceKind::Cuda, true, VLLM_CUDA_RUNTIME_BYTES, false),
        ];
        for (device, off, runtime, sleeps) in cases {
            let vllm = estimate(if off { &off_policy } else { &spec }, &inputs(device));
            let find = |parts: &[Part], name: &str| {
                parts.iter().find(|part| part.name == name).map(|part| part.bytes)
            };
            let resident = |name: &str| find(&vllm.resident, name);
            let rollout = vllm.phases.iter().find(|phase| phase.phase == "rollout");
            assert_eq!(resident("vLLM server (runtime)"), Some(runtime));
            // Where the server's weights and cache are: all along, or the rollout's alone.
            let server = if sleeps { &rollout.unwrap().parts } else { &vllm.resident };
            assert_eq!(find(server, "vLLM weights"), Some(ModelShape::BUILTIN.parameters() * 4), "{vllm:?}");
            // 32 rows of (12 + 32 template + 20) tokens in whole blocks (one of 128 tokens on the
            // CPU, four of 16 on CUDA); 2 × 4 layers × 2 KV heads × 32 × 4 bytes a token.
            let held = if device == DeviceKind::Cpu { 128 } else { 64 };
            assert_eq!(find(server, "vLLM KV cache"), Some(32 * held * 2048 + (16 << 20)), "{vllm:?}");
            assert_eq!(rollout.is_some(), sleeps, "{vllm:?}");
            // One step off policy: a copy of what trains, the weights that sampled the step.
            let copy = resident("sampling weights (off policy)");
            assert_eq!(copy, off.then(|| ModelShape::BUILTIN.parameters() * 4), "{vllm:?}");
        }
        assert!(native.phases.iter().any(|phase| phase.phase == "rollout"));
    }

    /// A reward model's job (`rm`) trains the backbone and a one-row head: no logits over the
    /// vocabulary in its update, no sampling in its evaluation, its weights without an untied
    /// LM head.
    #[test]
    fn a_reward_models_training_has_no_vocabulary_logits_and_scores_its_heldout() {
        let spec = JobSpec::from_toml(
            "[job]\nname = \"rm\"\nteam = \"t\"\nmodel_line = \"l\"\n[model]\npolicy = \"builtin:tiny-arith\"\n\
             [data]\ntrain = \"dataset:d\"\nheldout = \"dataset:h\"\n[optimizer]\nplugin = \"rm\"\n\
             [budget]\nmax_steps = 1\n",
        )
        .unwrap();
        let inputs = |reward_model: bool| Inputs {
            policy: ModelShape::BUILTIN,
            reference: None,
            baseline: Some(ModelShape::BUILTIN),
            needs: OptimizerNeeds { pairs: true, offline: true, reward_model, ..OptimizerNeeds::default() },
            data: DataLengths { prompt_tokens: 16, completion_tokens: 8, heldout_prompt_tokens: 16 },
            device: DeviceKind::Cpu,
            reward_models: Vec::new(),
        };
        let (rm, dpo_like) = (estimate(&spec, &inputs(true)), estimate(&spec, &inputs(false)));
        let names = |estimate: &MemoryEstimate, phase: &str| -> Vec<String> {
            let phase = estimate.phases.iter().find(|p| p.phase == phase).unwrap();
            phase.parts.iter().map(|part| part.name.clone()).collect()
        };
        assert_eq!(names(&rm, "update"), ["activations", "attention scores", "transient gradients"]);
        assert!(names(&dpo_like, "update").contains(&"logits (in chunks)".to_owned()));
        assert_eq!(names(&rm, "eval"), ["scoring pass", "attention scores", "gates' baseline weights"]);
        let weights = rm.resident.iter().find(|part| part.name == "reward model weights").unwrap();
        // Tied embeddings: every parameter, and a head row of `hidden`.
        assert_eq!(weights.bytes, (ModelShape::BUILTIN.parameters() + ModelShape::BUILTIN.hidden) * 4);
        assert!(rm.phases.iter().all(|phase| phase.phase != "rollout"));
    }

    /// Parameter counts of known models, from their configs (counts as transformers reports
    /// them: `model.num_parameters()`).
    #[test]
    fn parameters_of_known_shapes() {
        assert_eq!(ModelShape::BUILTIN.parameters(), 800_512, "builtin.rs says 800 512");
        // SmolLM2-135M: hidden 576, 30 layers, 9 heads over 3 KV heads of 64, MLP 1536,
        // vocabulary 49152, tied.
        let smollm2 = r#"{"hidden_size": 576, "intermediate_size": 1536, "num_hidden_layers": 30,
            "num_attention_heads": 9, "num_key_value_heads": 3, "vocab_size": 49152,
            "tie_word_embeddings": true, "model_type": "llama", "max_position_embeddings": 8192}"#;
        let shape = ModelShape::from_config_json(smollm2).unwrap();
        assert_eq!(shape.head_dim, 64);
        assert_eq!(shape.parameters(), 134_515_008);
        // Qwen2.5-0.5B: q/k/v biases, tied; 494 032 768 parameters.
        let qwen = r#"{"hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 24,
            "num_attention_heads": 14, "num_key_value_heads": 2, "vocab_size": 151936,
            "tie_word_embeddings": true, "model_type": "qwen2"}"#;
        assert_eq!(ModelShape::from_config_json(qwen).unwrap().parameters(), 494_032_768);
    }

    #[test]
    fn a_config_missing_a_size_is_refused_naming_it() {
        let error = ModelShape::from_config_json(r#"{"hidden_size": 8}"#).unwrap_err();
        assert!(error.starts_with("num_attention_heads: missing"), "{error}");
        let error = ModelShape::from_config_json(r#"{"hidden_size": -8}"#).unwrap_err();
        assert!(error.starts_with("hidden_size: expected a positive integer"), "{error}");
    }

    #[test]
    fn lora_counts_rank_times_in_plus_out() {
        let shape = ModelShape::BUILTIN;
        // q: 128→128, k, v: 128→64, o: 128→128, gate, up: 128→384, down: 384→128.
        let per_layer = 256 + 192 + 192 + 256 + 512 + 512 + 512;
        assert_eq!(shape.lora_parameters(1, &LoraTarget::ALL), 4 * per_layer);
        assert_eq!(shape.lora_parameters(8, &[LoraTarget::QProj]), 4 * 8 * 256);
    }

    #[test]
    fn data_lengths_read_the_longest_fields() {
        let text = "{\"prompt\": \"abc\", \"completion\": \"de\"}\nnot json\n{\"prompt\": \"a\", \"chosen\": \"12345\", \"rejected\": \"1\"}\n";
        assert_eq!(DataLengths::scan_jsonl(text.as_bytes()).unwrap(), (3, 5));
    }
}
