//! The job's models on its device: the policy (from the spec, or the checkpoint resumed), the
//! frozen reference when the optimizer reads one, and the value head of optimizers with a critic.
//!
//! With LoRA the reference is `Reference::PolicyBase`, the policy with its adapters off, and only
//! the adapters train. An optimizer that trains a reward model loads the spec's causal LM, makes
//! `RewardModel::from_base` (or loads the checkpoint's `model/`), and empties the policy's tensors.

use std::path::Path;

use rlvr_model::reward::{RewardModel, load_reward_model};
use rlvr_model::weights::WeightFiles;
use rlvr_model::{LoadedModel, LoraConfig, load as load_model};
use rlvr_plugin_api::OptimizerBox;
use rlvr_plugin_api::{OptimizerInfo, TrainedModel};
use rlvr_protocol::spec::{Dtype, JobSpec};
use sha2::{Digest, Sha256};
use tch::{Device, Kind, Tensor, nn};

use crate::{TrainData, WorkerError};
use rlvr_protocol::records::PromptRecord;

/// Where a LoRA job's checkpoint keeps its adapters (a PEFT adapter directory): what a resume
/// attaches to the base. `model/` beside it is what is published (the same adapters, or merged).
pub const ADAPTER_DIR: &str = "adapter";

/// Copies the trained weights of the checkpoint at `checkpoint` into `policy`, in place: its
/// LoRA adapters from `adapter/` (the base is the spec's and never trains), else every weight
/// from `model/`. The tensors a resume would load, without a second copy of the model.
pub fn load_trained_weights(policy: &LoadedModel, checkpoint: &Path) -> Result<(), WorkerError> {
    let fail = |message: String| WorkerError::State { path: checkpoint.to_owned(), message };
    let (files, prefix) = if policy.adapters.is_some() {
        let file = checkpoint.join(ADAPTER_DIR).join(rlvr_model::lora::WEIGHTS_FILE);
        (WeightFiles::open_file(&file), rlvr_model::lora::PEFT_PREFIX)
    } else {
        (WeightFiles::open(&checkpoint.join("model")), "")
    };
    copy_stored(policy.trainable(), files.map_err(|error| fail(error.to_string()))?, prefix, checkpoint)
}

/// [`load_trained_weights`] for a reward-model job: the checkpoint's `model/` (a
/// sequence-classification directory under the same tensor names) into `reward_model`.
pub fn load_trained_reward_model(reward_model: &RewardModel, checkpoint: &Path) -> Result<(), WorkerError> {
    let files = WeightFiles::open(&checkpoint.join("model"))
        .map_err(|error| WorkerError::State { path: checkpoint.to_owned(), message: error.to_string() })?;
    copy_stored(reward_model.trainable(), files, "", checkpoint)
}

/// The names and shapes of a policy's weights freed by [`release_weights`]: what
/// [`load_released_weights`] loads back.
pub struct ReleasedWeights(Vec<(String, Vec<i64>)>);

/// Frees the policy's weights: each variable keeps its kind and device but holds nothing (an
/// engine job's ranks load copies of their own while the worker waits; on a GPU the worker's
/// would be memory they need). Returns what they were, to load new weights into.
pub fn release_weights(policy: &LoadedModel) -> ReleasedWeights {
    let mut released = Vec::new();
    for (name, mut tensor) in policy.trainable() {
        released.push((name, tensor.size()));
        tensor.set_data(&Tensor::empty([0], (tensor.kind(), tensor.device())));
    }
    crate::memory::release(policy.vs.device());
    ReleasedWeights(released)
}

/// Loads `checkpoint`'s `model/` into a policy whose weights were freed by [`release_weights`],
/// each tensor at the shape it had.
pub fn load_released_weights(
    policy: &LoadedModel,
    released: &ReleasedWeights,
    checkpoint: &Path,
) -> Result<(), WorkerError> {
    let fail = |message: String| WorkerError::State { path: checkpoint.to_owned(), message };
    let files = WeightFiles::open(&checkpoint.join("model")).map_err(|error| fail(error.to_string()))?;
    let mut variables: std::collections::HashMap<String, Tensor> = policy.trainable().into_iter().collect();
    for (name, shape) in &released.0 {
        let mut variable =
            variables.remove(name).ok_or_else(|| fail(format!("{name}: not a weight of the policy")))?;
        let stored = files
            .get(name, shape, variable.device(), variable.kind())
            .map_err(|error| fail(error.to_string()))?;
        variable.set_data(&stored);
    }
    Ok(())
}

/// Copies each of `trainable`'s tensors from `files` (named `prefix` + its name), in place.
fn copy_stored(
    trainable: Vec<(String, tch::Tensor)>,
    files: WeightFiles,
    prefix: &str,
    checkpoint: &Path,
) -> Result<(), WorkerError> {
    let fail = |message: String| WorkerError::State { path: checkpoint.to_owned(), message };
    for (name, variable) in trainable {
        let stored = files
            .get(&format!("{prefix}{name}"), &variable.size(), variable.device(), variable.kind())
            .map_err(|error| fail(error.to_string()))?;
        let mut variable = variable;
        tch::no_grad(|| variable.copy_(&stored));
    }
    Ok(())
}

/// A value head: a linear layer over the policy's hidden states, in its own VarStore.
pub type ValueHead = (nn::VarStore, nn::Linear);

/// The frozen reference of a job whose optimizer reads one.
pub enum Reference {
    /// A model of its own.
    Model(Box<LoadedModel>),
    /// The policy with its LoRA adapters off: the base it started from, with no second copy.
    PolicyBase,
}

/// The models of one run.
pub struct Models {
    /// The model being trained (with `[model] lora`, the base with adapters: only they train).
    pub policy: LoadedModel,
    /// The frozen reference, when the optimizer reads one.
    pub reference: Option<Reference>,
    /// Where the reference came from and the SHA-256 of its weights: a resume checks it.
    pub reference_identity: Option<String>,
    /// The critic, for optimizers with a value head.
    pub value_head: Option<ValueHead>,
    /// The model being trained when the optimizer trains a reward model: the policy's backbone
    /// with a fresh score head (`RewardModel::from_base`), or the checkpoint resumed. The
    /// policy then only lends its tokenizer and config; its weights are released.
    pub reward_model: Option<RewardModel>,
}

impl Models {
    /// Loads the models on `device`: the policy from `checkpoint` when resuming, else from the
    /// spec; the reference only when `optimizer` reads it (GRPO with `kl_beta = 0` does not).
    pub fn load(
        spec: &JobSpec,
        checkpoint: Option<&Path>,
        device: Device,
        info: &OptimizerInfo,
        trains: TrainedModel,
        optimizer: &OptimizerBox,
    ) -> Result<Models, WorkerError> {
        let kind = weight_kind(spec.model.dtype);
        if trains == TrainedModel::RewardModel {
            return Self::load_reward_model(spec, checkpoint, device, kind);
        }
        // Process-wide, and set before the first product. libtorch's default (off) stands
        // otherwise; on a CPU it would change nothing.
        if spec.model.tf32 && device.is_cuda() {
            rlvr_model::cuda_settings::set_tf32(true)
                .map_err(|error| WorkerError::Model { field: "model.tf32", message: error.to_string() })?;
        }
        // cuBLAS's workspace is fixed by `main` before any handle exists; the CPU's kernels are
        // deterministic already.
        if spec.checkpoint.exact_resume && device.is_cuda() {
            rlvr_model::cuda_settings::set_deterministic(true).map_err(|error| WorkerError::Model {
                field: "checkpoint.exact_resume",
                message: error.to_string(),
            })?;
        }
        let lora = spec.model.lora.as_ref().map(LoraConfig::from_spec);
        let policy_error = |error: rlvr_model::ModelError| WorkerError::Model {
            field: "model.policy",
            message: error.to_string(),
        };
        // A LoRA job's checkpoint holds its adapters (`adapter/`); the base is the spec's.
        let policy_source = match (checkpoint, &lora) {
            (Some(path), None) => path.join("model").to_string_lossy().into_owned(),
            _ => spec.model.policy.clone(),
        };
        let mut policy = load_model(&policy_source, device, kind).map_err(policy_error)?;
        policy.model.set_activation_checkpointing(spec.model.activation_checkpointing);
        // A policy that is itself an adapter directory (a published LoRA version) starts as the
        // model it computes: its adapters merged, every weight its own.
        policy.merge_adapters();
        if let Some(config) = &lora {
            match checkpoint {
                Some(path) => {
                    let adapter = path.join(ADAPTER_DIR);
                    policy.attach_lora_from(&adapter).map_err(|error| WorkerError::State {
                        path: adapter.clone(),
                        message: error.to_string(),
                    })?;
                }
                None => policy.attach_lora(config, spec.job.seed).map_err(|error| WorkerError::Model {
                    field: "model.lora",
                    message: error.to_string(),
                })?,
            }
        }
        let reference_source =
            if spec.model.reference == "same" { &spec.model.policy } else { &spec.model.reference };
        let reference = if !(info.needs_reference && optimizer.uses_reference()) {
            None
        } else if lora.is_some() && spec.model.reference == "same" {
            Some(Reference::PolicyBase)
        } else {
            let mut reference = load_model(reference_source, device, kind).map_err(|error| {
                WorkerError::Model { field: "model.reference", message: error.to_string() }
            })?;
            reference.merge_adapters();
            reference.vs.freeze();
            if reference.tokenizer.vocab_size() != policy.tokenizer.vocab_size() {
                return Err(WorkerError::Model {
                    field: "model.reference",
                    message: format!(
                        "tokenizer mismatch: the reference has {} tokens, the policy {}",
                        reference.tokenizer.vocab_size(),
                        policy.tokenizer.vocab_size()
                    ),
                });
            }
            Some(Reference::Model(Box::new(reference)))
        };
        let reference_identity = reference.as_ref().map(|reference| {
            let weights = match reference {
                Reference::Model(model) => &model.vs,
                Reference::PolicyBase => &policy.vs,
            };
            format!("{reference_source} sha256:{}", weights_sha256(weights))
        });
        let value_head = info.needs_value_head.then(|| value_head(&policy, device));
        if let (Some(path), Some((vs, _))) = (checkpoint, &value_head) {
            vs.read_safetensors(path.join("value_head.safetensors")).map_err(|error| WorkerError::State {
                path: path.to_owned(),
                message: format!("value_head.safetensors: {error}"),
            })?;
        }
        Ok(Models { policy, reference, reference_identity, value_head, reward_model: None })
    }

    /// A reward model's run: the spec's causal LM (the fit rules refused LoRA), a single-label
    /// reward model on its backbone with a head drawn from the job's seed — or, resuming, the
    /// checkpoint's `model/`, a sequence-classification directory — every weight trainable.
    fn load_reward_model(
        spec: &JobSpec,
        checkpoint: Option<&Path>,
        device: Device,
        kind: Kind,
    ) -> Result<Models, WorkerError> {
        let policy = load_model(&spec.model.policy, device, kind)
            .map_err(|error| WorkerError::Model { field: "model.policy", message: error.to_string() })?;
        let mut reward_model = match checkpoint {
            Some(path) => load_reward_model(&path.join("model"), device, kind).map_err(|error| {
                WorkerError::State { path: path.to_owned(), message: format!("model: {error}") }
            })?,
            None => start_reward_model(&policy, spec.job.seed)
                .map_err(|error| WorkerError::Model { field: "model.policy", message: error.to_string() })?,
        };
        reward_model.vs.unfreeze();
        // One copy of the weights on the device: the reward model's. The policy's tensors are
        // emptied in place (every handle to them shares the storage) — nothing of an rm job
        // reads them; the gates' baseline loads its own.
        tch::no_grad(|| {
            for (_, mut tensor) in policy.vs.variables() {
                tensor.set_data(&Tensor::empty([0], (tensor.kind(), tensor.device())));
            }
        });
        Ok(Models {
            policy,
            reference: None,
            reference_identity: None,
            value_head: None,
            reward_model: Some(reward_model),
        })
    }

    /// Every trainable tensor (the policy's weights or its LoRA adapters, then the value head),
    /// sorted by name: the optimizer's fixed order.
    pub fn trainable(&self) -> Vec<(String, Tensor)> {
        if let Some(reward_model) = &self.reward_model {
            return reward_model.trainable();
        }
        let mut params = self.policy.trainable();
        if let Some((vs, _)) = &self.value_head {
            params.extend(vs.variables());
        }
        params.sort_by(|a, b| a.0.cmp(&b.0));
        params
    }
}

/// The weights' kind for `model.dtype`, on any device: with bf16 the optimizer keeps the f32
/// master weights (`optim`), and the products run on libtorch's bf16 kernels (the oneDNN f32
/// path is for f32 only).
pub fn weight_kind(dtype: Dtype) -> Kind {
    match dtype {
        Dtype::F32 => Kind::Float,
        Dtype::Bf16 => Kind::BFloat16,
    }
}

/// A zero-initialized value head over the policy's hidden states: deterministic, and its first
/// values predict nothing.
fn value_head(policy: &LoadedModel, device: Device) -> ValueHead {
    let vs = nn::VarStore::new(device);
    let config =
        nn::LinearConfig { ws_init: nn::Init::Const(0.0), bs_init: Some(nn::Init::Const(0.0)), bias: true };
    let head = nn::linear(vs.root() / "value_head", policy.model.hidden_size(), 1, config);
    (vs, head)
}

/// Refuses data whose prompt (and completion, offline) would run past the model's positions, naming
/// the first record that does: found at start, not at the step that draws it.
pub fn check_lengths(
    spec: &JobSpec,
    policy: &LoadedModel,
    train: &TrainData,
    heldout: Option<&[PromptRecord]>,
) -> Result<(), WorkerError> {
    let Some(limit) = policy.config.max_position_embeddings else { return Ok(()) };
    let tokenizer = &policy.tokenizer;
    let budget = i64::from(spec.rollout.max_new_tokens);
    let prompt_len = |text: &str| -> Result<i64, String> {
        let rendered = tokenizer.render_prompt(text).map_err(|e| e.to_string())?;
        Ok(tokenizer.encode(&rendered).map_err(|e| e.to_string())?.len() as i64)
    };
    let text_len = |text: &str| -> Result<i64, String> {
        // The completion, and the end-of-sequence token the trainer appends.
        Ok(tokenizer.encode(text).map_err(|e| e.to_string())?.len() as i64 + 1)
    };
    let mut records: Vec<(&'static str, &str, Result<i64, String>)> = Vec::new();
    match train {
        TrainData::Prompts(prompts) => {
            records.extend(
                prompts
                    .iter()
                    .map(|p| ("data.train", p.id.as_str(), prompt_len(&p.prompt).map(|n| n + budget))),
            );
        }
        TrainData::Sft(items) => records.extend(items.iter().map(|r| {
            (
                "data.train",
                r.id.as_str(),
                prompt_len(&r.prompt).and_then(|p| Ok(p + text_len(&r.completion)?)),
            )
        })),
        TrainData::Pairs(items) => records.extend(items.iter().map(|r| {
            let longest = |p: i64| Ok(p + text_len(&r.chosen)?.max(text_len(&r.rejected)?));
            ("data.train", r.id.as_str(), prompt_len(&r.prompt).and_then(longest))
        })),
    }
    for record in heldout.unwrap_or_default() {
        records.push(("data.heldout", record.id.as_str(), prompt_len(&record.prompt).map(|n| n + budget)));
    }
    for (field, id, length) in records {
        match length {
            Ok(length) if length <= limit => {}
            Ok(length) => {
                return Err(WorkerError::Model {
                    field,
                    message: format!(
                        "record {id:?} needs {length} positions (prompt, completion or rollout.max_new_tokens), \
                         more than the model's max_position_embeddings ({limit})"
                    ),
                });
            }
            Err(message) => {
                return Err(WorkerError::Model { field, message: format!("record {id:?}: {message}") });
            }
        }
    }
    Ok(())
}

/// SHA-256 of what a model computes with: its weights, then its LoRA adapters when it has them.
pub fn model_sha256(model: &LoadedModel) -> String {
    match &model.adapters {
        None => weights_sha256(&model.vs),
        Some(adapters) => {
            let mut hasher = Sha256::new();
            hasher.update(weights_sha256(&model.vs));
            hasher.update(weights_sha256(&adapters.vs));
            hex::encode(hasher.finalize())
        }
    }
}

/// The reward model an rm job starts from: one label (a scalar score), the head drawn from
/// `seed`. The gates' baseline at the job's start is this same model.
pub fn start_reward_model(base: &LoadedModel, seed: u64) -> rlvr_model::Result<RewardModel> {
    RewardModel::from_base(base, 1, seed)
}

/// SHA-256 over a VarStore's tensors: names sorted, each name then its raw bytes.
pub fn weights_sha256(vs: &nn::VarStore) -> String {
    let mut named: Vec<(String, Tensor)> = vs.variables().into_iter().collect();
    named.sort_by(|a, b| a.0.cmp(&b.0));
    let mut hasher = Sha256::new();
    for (name, tensor) in named {
        hasher.update(name.as_bytes());
        let tensor = tensor.to_device(Device::Cpu).contiguous();
        let mut buffer = vec![0u8; tensor.numel() * tensor.kind().elt_size_in_bytes()];
        tensor.copy_data_u8(&mut buffer, tensor.numel());
        hasher.update(&buffer);
    }
    hex::encode(hasher.finalize())
}

/// What `rlvr-worker export-model` wrote: one JSON line.
#[derive(Debug, serde::Serialize)]
pub struct ExportedModel {
    /// The source as loaded (`builtin:NAME?seed=N…`).
    pub source: String,
    pub dir: std::path::PathBuf,
    pub parameters: u64,
    pub dtype: Dtype,
}

/// Writes the model `source` names (a built-in model, a directory, an adapter over its base) to
/// `dir` as a Hugging Face directory in `dtype` (`config.json`, `model.safetensors`, the
/// tokenizer's files; adapters merged), atomically: the weights a peer needs to compare with a
/// built-in model's run. `dir` must not exist.
pub fn export(source: &str, dir: &Path, dtype: Dtype) -> Result<ExportedModel, String> {
    let model = load_model(source, Device::Cpu, weight_kind(dtype)).map_err(|error| error.to_string())?;
    rlvr_model::policy::save_pretrained(&model, dir).map_err(|error| error.to_string())?;
    let parameters = model.vs.variables().values().map(|tensor| tensor.numel() as u64).sum();
    Ok(ExportedModel { source: model.source.clone(), dir: dir.to_owned(), parameters, dtype })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An engine job's worker frees its policy while the ranks train and loads their weights back
    /// into it: every tensor empty in between, the exported weights (bit for bit) afterwards.
    #[test]
    fn a_released_policy_holds_nothing_and_loads_weights_back_at_their_shapes() {
        let policy = load_model("builtin:tiny-arith", Device::Cpu, Kind::Float).unwrap();
        let before = model_sha256(&policy);
        let dir = tempfile::tempdir().unwrap();
        rlvr_model::policy::save_pretrained(&policy, &dir.path().join("model")).unwrap();

        let released = release_weights(&policy);
        assert!(!released.0.is_empty());
        assert!(policy.trainable().iter().all(|(_, tensor)| tensor.numel() == 0));
        assert_ne!(model_sha256(&policy), before);

        load_released_weights(&policy, &released, dir.path()).unwrap();
        assert_eq!(model_sha256(&policy), before);
        // A directory without the model's tensors is refused naming what is missing.
        let empty = tempfile::tempdir().unwrap();
        let released = release_weights(&policy);
        assert!(load_released_weights(&policy, &released, empty.path()).is_err());
    }
}
