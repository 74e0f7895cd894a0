//! One training client: a base model with the client's LoRA adapter, and AdamW over the
//! adapter. What the SDK's `TrainingClient` and `SamplingClient` ask of it — forward/backward
//! with a Tinker loss (gradients accumulating until `optim_step`), an AdamW step with that step's
//! settings, sampling with log-probabilities, and its state saved and loaded — computed on the
//! worker's device. No IO but the state directory.
//!
//! A datum's targets are its input shifted by one (`target[i] = input[i + 1]`, the last target
//! the token after the input): how the SDK's and the cookbook's datums are made. Then the datum is
//! the model's sequence `input + [last target]`, trained as a completion of its first token, so
//! the chunked training pass (`rlvr_model::training_logprobs`) computes every target's
//! log-probability with no `[N, V]` logits held at once.
//!
//! The adapter's scale is α/r with α = 32, the convention of Thinking Machines' "LoRA Without
//! Regret" (Schulman et al., 2025), which Tinker follows: learning rates transfer across ranks.

use std::collections::BTreeMap;
use std::path::Path;

use rlvr_model::weights::WeightFiles;
use rlvr_model::{LoadedModel, LoraConfig, LoraTarget, SamplerRng, SamplingParams, SequenceBatch, Tokenizer};
use rlvr_protocol::tinker::answers::Sequence;
use rlvr_protocol::tinker::datums::TrainDatum;
use rlvr_protocol::tinker::loss::Loss;
use rlvr_protocol::tinker::wire::{self, AdamParams, SampleParams, StopSpec};
use tch::{Kind, Tensor};

use super::loss::{LossInputs, datum_loss};
use crate::optim::{AdamW, AdamWConfig};

/// The adapters' α (their scale is α / rank).
pub const LORA_ALPHA: f64 = 32.0;

/// Datums computed together in one training pass (a request's datums, in passes of this many).
const PASS_ROWS: usize = 16;

/// The most tokens a sample may ask for when it names no `max_tokens`.
pub const DEFAULT_MAX_TOKENS: usize = 512;

/// Why a request could not be served: the request's fault (a `user` error to the SDK) or not.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ClientError {
    #[error("{0}")]
    Request(String),
    #[error("{0}")]
    Internal(String),
}

fn request(message: impl Into<String>) -> ClientError {
    ClientError::Request(message.into())
}

/// A forward (or forward/backward) pass's result: each datum's target log-probabilities, and
/// the loss summed over them.
#[derive(Debug, Clone, PartialEq)]
pub struct Pass {
    pub logprobs: Vec<Vec<f32>>,
    pub loss: f64,
}

/// The base model with the client's adapter, and its optimizer.
pub struct TrainingClient {
    model: LoadedModel,
    adam: AdamW,
    /// Gradients accumulated since the last step (a step with none moves nothing).
    accumulated: bool,
}

impl std::fmt::Debug for TrainingClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TrainingClient")
            .field("model", &self.model)
            .field("steps", &self.adam.steps())
            .finish()
    }
}

/// The LoRA configuration of a client's `lora_config`: the attention projections (`train_attn`),
/// the MLP's (`train_mlp`), the unembedding (`train_unembed`).
pub fn lora_config(lora: &wire::LoraConfig) -> Result<LoraConfig, ClientError> {
    if lora.rank == 0 {
        return Err(request("lora_config.rank: expected at least 1"));
    }
    let mut target_modules = Vec::new();
    if lora.train_attn {
        target_modules.extend([LoraTarget::QProj, LoraTarget::KProj, LoraTarget::VProj, LoraTarget::OProj]);
    }
    if lora.train_mlp {
        target_modules.extend([LoraTarget::GateProj, LoraTarget::UpProj, LoraTarget::DownProj]);
    }
    if target_modules.is_empty() && !lora.train_unembed {
        return Err(request(
            "lora_config: train_attn, train_mlp and train_unembed are all false: nothing would train",
        ));
    }
    Ok(LoraConfig {
        rank: i64::from(lora.rank),
        alpha: LORA_ALPHA,
        dropout: 0.0,
        target_modules,
        unembed: lora.train_unembed,
    })
}

impl TrainingClient {
    /// A client over `model` (the base, loaded) with a fresh adapter of `lora` seeded by `seed`.
    pub fn new(
        mut model: LoadedModel,
        lora: &wire::LoraConfig,
        seed: u64,
    ) -> Result<TrainingClient, ClientError> {
        let config = lora_config(lora)?;
        model.attach_lora(&config, seed).map_err(|error| ClientError::Internal(error.to_string()))?;
        let mut trainable = model.trainable();
        trainable.sort_by(|a, b| a.0.cmp(&b.0));
        let adam = AdamW::new(trainable, adam_config(&DEFAULT_ADAM));
        Ok(TrainingClient { model, adam, accumulated: false })
    }

    /// The model (its tokenizer, its adapter).
    pub fn model(&self) -> &LoadedModel {
        &self.model
    }

    /// Optimizer steps taken.
    pub fn steps(&self) -> i64 {
        self.adam.steps()
    }

    /// A forward pass over `data` with `loss`, and unless `forward_only` its backward pass, whose
    /// gradients add to those since the last step. Each datum's targets must be its input
    /// shifted by one.
    pub fn forward_backward(
        &mut self,
        data: &[TrainDatum],
        loss: &Loss,
        forward_only: bool,
    ) -> Result<Pass, ClientError> {
        let device = self.model.model.device();
        let mut rows = Vec::with_capacity(data.len());
        for (i, datum) in data.iter().enumerate() {
            let inputs =
                LossInputs::of(datum, loss, device).map_err(|m| request(format!("data[{i}].{m}")))?;
            let targets = Vec::<i64>::try_from(inputs.targets.flatten(0, -1))
                .map_err(|e| ClientError::Internal(e.to_string()))?;
            if inputs.targets.dim() != 1 {
                return Err(request(format!(
                    "data[{i}].loss_fn_inputs.target_tokens: several targets per position are not served: one per token"
                )));
            }
            let shifted = datum.tokens[1..] == targets[..targets.len() - 1];
            if !shifted {
                return Err(request(format!(
                    "data[{i}].loss_fn_inputs.target_tokens: expected model_input shifted by one (target[i] = input[i + 1])"
                )));
            }
            let vocab = self.model.model.vocab_size();
            if let Some(bad) = datum.tokens.iter().chain(&targets).find(|&&t| !(0..vocab).contains(&t)) {
                return Err(request(format!(
                    "data[{i}]: token {bad} is outside the vocabulary (0..{vocab})"
                )));
            }
            rows.push((vec![datum.tokens[0]], targets, inputs));
        }
        let pad = self.model.tokenizer.pad_id();
        let mut logprobs = Vec::with_capacity(rows.len());
        let mut total = 0.0;
        for pass in rows.chunks(PASS_ROWS) {
            let pairs: Vec<(&[i64], &[i64])> =
                pass.iter().map(|(p, c, _)| (p.as_slice(), c.as_slice())).collect();
            let batch = SequenceBatch::new(&pairs, pad, device).map_err(|e| request(e.to_string()))?;
            let per_row = |all: &Tensor, row: usize, len: usize| all.get(row as i64).narrow(0, 0, len as i64);
            if forward_only {
                let (all, _) = rlvr_model::completion_logprobs(&self.model.model, &batch, 1.0);
                for (row, (_, targets, inputs)) in pass.iter().enumerate() {
                    let lp = per_row(&all, row, targets.len());
                    total += tch::no_grad(|| datum_loss(loss, &lp, inputs)).double_value(&[]);
                    logprobs
                        .push(Vec::<f32>::try_from(lp).map_err(|e| ClientError::Internal(e.to_string()))?);
                }
                continue;
            }
            self.model.model.set_training(Some(0));
            let training = rlvr_model::training_logprobs(&self.model.model, &batch, 1.0);
            let all = training.logprobs().shallow_clone();
            let mut row_losses = Vec::with_capacity(pass.len());
            for (row, (_, targets, inputs)) in pass.iter().enumerate() {
                let lp = per_row(&all, row, targets.len());
                row_losses.push(datum_loss(loss, &lp, inputs));
                logprobs.push(
                    Vec::<f32>::try_from(lp.detach()).map_err(|e| ClientError::Internal(e.to_string()))?,
                );
            }
            let pass_loss = Tensor::stack(&row_losses, 0).sum(Kind::Float);
            total += pass_loss.double_value(&[]);
            self.adam.backward(&pass_loss, || training.backward());
            self.model.model.set_training(None);
            self.accumulated = true;
        }
        if !total.is_finite() {
            return Err(request(format!("the loss is {total}: the inputs give no finite loss")));
        }
        Ok(Pass { logprobs, loss: total })
    }

    /// One AdamW step with this step's settings over the gradients accumulated since the last,
    /// which it then clears. Returns its metrics (`grad_norm:mean`, before clipping).
    pub fn optim_step(&mut self, params: &AdamParams) -> Result<BTreeMap<String, f64>, ClientError> {
        let checks = [
            ("learning_rate", params.learning_rate >= 0.0),
            ("beta1", (0.0..1.0).contains(&params.beta1)),
            ("beta2", (0.0..1.0).contains(&params.beta2)),
            ("eps", params.eps > 0.0),
            ("weight_decay", params.weight_decay >= 0.0),
            ("grad_clip_norm", params.grad_clip_norm >= 0.0),
        ];
        if let Some((name, _)) = checks.iter().find(|(_, ok)| !ok) {
            return Err(request(format!("adam_params.{name}: out of range ({params:?})")));
        }
        let mut metrics = BTreeMap::new();
        if !self.accumulated {
            // Nothing to step on: the weights stay, as the SDK's server leaves them.
            return Ok(metrics);
        }
        self.adam.set_config(adam_config(params));
        let norm = self.adam.clip_grad_norm(params.grad_clip_norm);
        self.adam.step(params.learning_rate);
        self.adam.zero_grad();
        self.accumulated = false;
        metrics.insert("grad_norm:mean".to_owned(), norm);
        Ok(metrics)
    }

    /// `count` sequences sampled after `prompt`, each with its tokens' log-probabilities, and the
    /// prompt's own log-probabilities when asked (NaN for its first token).
    pub fn sample(
        &self,
        prompt: &[i64],
        params: &SampleParams,
        count: u32,
        prompt_logprobs: bool,
    ) -> Result<(Vec<Sequence>, Option<Vec<f32>>), ClientError> {
        if prompt.is_empty() {
            return Err(request("prompt: expected at least one token"));
        }
        if count == 0 {
            return Err(request("num_samples: expected at least 1"));
        }
        let stop = match &params.stop {
            None => Vec::new(),
            Some(StopSpec::Text(text)) => vec![text.clone()],
            Some(StopSpec::Texts(texts)) => texts.clone(),
            Some(StopSpec::Tokens(tokens)) => {
                let eos = self.model.tokenizer.eos_ids();
                if tokens.iter().all(|t| eos.contains(t)) {
                    Vec::new()
                } else {
                    return Err(request(
                        "sampling_params.stop: stop tokens other than the end of sequence are not served: pass stop strings",
                    ));
                }
            }
        };
        let sampling = SamplingParams {
            max_new_tokens: params.max_tokens.map_or(DEFAULT_MAX_TOKENS, |n| n as usize),
            temperature: params.temperature,
            top_p: params.top_p,
            top_k: usize::try_from(params.top_k).unwrap_or(0),
            stop,
            ignore_eos: false,
        };
        let mut rng = match params.seed {
            Some(seed) => SamplerRng::new(seed),
            None => SamplerRng::new(rand_seed()),
        };
        let sampled = rlvr_model::generate(
            &self.model.model,
            &self.model.tokenizer,
            &[prompt.to_vec()],
            count as usize,
            &sampling,
            &mut rng,
        )
        .map_err(|error| request(format!("sampling_params: {error}")))?;
        let sequences = sampled
            .into_iter()
            .map(|s| Sequence {
                stopped: s.finish != rlvr_model::Finish::Length,
                tokens: s.tokens,
                logprobs: s.logprobs,
            })
            .collect();
        let prompt_logprobs = if prompt_logprobs { Some(self.prompt_logprobs(prompt)?) } else { None };
        Ok((sequences, prompt_logprobs))
    }

    /// Each prompt token's log-probability given those before it; NaN for the first.
    fn prompt_logprobs(&self, prompt: &[i64]) -> Result<Vec<f32>, ClientError> {
        let mut out = vec![f32::NAN];
        if prompt.len() > 1 {
            let pad = self.model.tokenizer.pad_id();
            let batch = SequenceBatch::new(&[(&prompt[..1], &prompt[1..])], pad, self.model.model.device())
                .map_err(|e| request(e.to_string()))?;
            let (all, _) = rlvr_model::completion_logprobs(&self.model.model, &batch, 1.0);
            out.extend(Vec::<f32>::try_from(all.get(0)).map_err(|e| ClientError::Internal(e.to_string()))?);
        }
        Ok(out)
    }

    /// Writes the adapter (a PEFT directory over `base`) and, with `optimizer`, AdamW's state and
    /// step count into `dir` (which must not exist): whole or not at all, the files written in a
    /// temporary directory beside it that is renamed to `dir` at the end.
    pub fn save_state(&self, base: &BaseModel, dir: &Path, optimizer: bool) -> Result<(), ClientError> {
        let internal = |e: String| ClientError::Internal(format!("{}: {e}", dir.display()));
        let parent = dir.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
        let tmp = tempfile::Builder::new()
            .prefix(".state-")
            .tempdir_in(parent)
            .map_err(|e| internal(e.to_string()))?;
        rlvr_model::save_adapter(&self.model, &base.location, &tmp.path().join("adapter"))
            .map_err(|e| internal(e.to_string()))?;
        std::fs::write(tmp.path().join(rlvr_protocol::tinker::process::SDK_BASE_FILE), &base.name)
            .map_err(|e| internal(e.to_string()))?;
        if optimizer {
            let tensors = self.adam.state_tensors();
            rlvr_model::weights::write_safetensors(&tmp.path().join("optimizer.safetensors"), &tensors)
                .map_err(|e| internal(e.to_string()))?;
            std::fs::write(tmp.path().join("optimizer-steps"), self.adam.steps().to_string())
                .map_err(|e| internal(e.to_string()))?;
        }
        std::fs::rename(tmp.keep(), dir).map_err(|e| internal(e.to_string()))?;
        Ok(())
    }

    /// A client from `base` (loaded) and a state [`TrainingClient::save_state`] wrote: its
    /// adapter, and with `optimizer` its AdamW state (refused when the state has none).
    pub fn load_state(
        mut model: LoadedModel,
        dir: &Path,
        optimizer: bool,
    ) -> Result<TrainingClient, ClientError> {
        model.attach_lora_from(&dir.join("adapter")).map_err(|e| ClientError::Internal(e.to_string()))?;
        let mut trainable = model.trainable();
        trainable.sort_by(|a, b| a.0.cmp(&b.0));
        let mut adam = AdamW::new(trainable, adam_config(&DEFAULT_ADAM));
        if optimizer {
            load_optimizer(&mut adam, dir)?;
        }
        Ok(TrainingClient { model, adam, accumulated: false })
    }

    /// Loads the state in `dir` (a [`TrainingClient::save_state`]'s) into this client: its
    /// adapter's values (the same rank and layers as this client's), and with `optimizer` AdamW's
    /// state; without, AdamW starts afresh. Gradients accumulated so far are dropped.
    pub fn load_state_into(&mut self, dir: &Path, optimizer: bool) -> Result<(), ClientError> {
        let adapter = adapter_tensors(&dir.join("adapter"))?;
        self.set_adapter(&adapter)?;
        let mut trainable = self.model.trainable();
        trainable.sort_by(|a, b| a.0.cmp(&b.0));
        self.adam = AdamW::new(trainable, adam_config(&DEFAULT_ADAM));
        if optimizer {
            load_optimizer(&mut self.adam, dir)?;
        }
        self.accumulated = false;
        Ok(())
    }

    /// Everything the client holds, written to `dir` (which must not exist): the state with its
    /// optimizer, and the gradients accumulated since the last step — a preempted client's.
    pub fn suspend(&self, base: &BaseModel, dir: &Path) -> Result<(), ClientError> {
        self.save_state(base, dir, true)?;
        if self.accumulated {
            rlvr_model::weights::write_safetensors(&dir.join(GRADIENTS), &self.adam.gradient_tensors())
                .map_err(|e| ClientError::Internal(format!("{}: {e}", dir.display())))?;
        }
        Ok(())
    }

    /// A client from `base` (loaded) and what [`TrainingClient::suspend`] wrote: it goes on as
    /// the suspended one would have.
    pub fn resume(model: LoadedModel, dir: &Path) -> Result<TrainingClient, ClientError> {
        let mut client = TrainingClient::load_state(model, dir, true)?;
        let gradients = dir.join(GRADIENTS);
        if gradients.is_file() {
            let saved =
                WeightFiles::open_file(&gradients).map_err(|e| ClientError::Internal(e.to_string()))?;
            client.adam.restore_gradients(&saved).map_err(ClientError::Internal)?;
            client.accumulated = true;
        }
        Ok(client)
    }

    /// Runs `f` with the adapter's values `weights` (a saved sampler's), then puts the client's
    /// own back.
    pub fn with_adapter<T>(
        &self,
        weights: &[(String, Tensor)],
        f: impl FnOnce(&Self) -> T,
    ) -> Result<T, ClientError> {
        let own: Vec<(String, Tensor)> = tch::no_grad(|| {
            self.model.trainable().into_iter().map(|(n, t)| (n, t.detach().copy())).collect()
        });
        self.set_adapter(weights)?;
        let out = f(self);
        self.set_adapter(&own)?;
        Ok(out)
    }

    /// Copies `values` into the adapter's tensors, name by name: every tensor of the adapter, of
    /// its shape.
    fn set_adapter(&self, values: &[(String, Tensor)]) -> Result<(), ClientError> {
        let trainable: BTreeMap<String, Tensor> = self.model.trainable().into_iter().collect();
        if values.len() != trainable.len() || values.iter().any(|(n, _)| !trainable.contains_key(n)) {
            return Err(request("this state's adapter is not this client's: its rank or its layers differ"));
        }
        for (name, value) in values {
            let mut target = trainable[name].shallow_clone();
            if target.size() != value.size() {
                return Err(request(format!(
                    "this state's adapter is not this client's: {name} is {:?}",
                    value.size()
                )));
            }
            tch::no_grad(|| target.copy_(value));
        }
        Ok(())
    }

    /// The tokenizer the client's datums are in.
    pub fn tokenizer(&self) -> &Tokenizer {
        &self.model.tokenizer
    }
}

/// AdamW's settings until the first step names its own (the SDK's defaults).
const DEFAULT_ADAM: AdamParams = AdamParams {
    learning_rate: 1e-4,
    beta1: 0.9,
    beta2: 0.95,
    eps: 1e-12,
    weight_decay: 0.0,
    grad_clip_norm: 0.0,
};

/// The gradients a suspended client had accumulated since its last step.
const GRADIENTS: &str = "gradients.safetensors";

/// The base a client trains on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BaseModel {
    /// Where the worker loads it from (a directory or `builtin:…`): what saved adapters name as
    /// their base, so that one loads on its own (a job's `model.policy = "tinker://…"`).
    pub location: String,
    /// What the SDK calls it: kept beside the adapter in `SDK_BASE_FILE`.
    pub name: String,
}

/// AdamW's state from a state directory that has it.
fn load_optimizer(adam: &mut AdamW, dir: &Path) -> Result<(), ClientError> {
    let internal = |e: String| ClientError::Internal(e);
    let file = dir.join("optimizer.safetensors");
    if !file.is_file() {
        return Err(request("this state was saved without its optimizer: load it without optimizer"));
    }
    let saved = WeightFiles::open_file(&file).map_err(|e| internal(e.to_string()))?;
    let steps: i64 = std::fs::read_to_string(dir.join("optimizer-steps"))
        .ok()
        .and_then(|text| text.trim().parse().ok())
        .ok_or_else(|| internal("the state's optimizer-steps is missing or not a number".into()))?;
    adam.load_state(&saved, steps).map_err(internal)
}

/// An adapter directory's tensors, under the names the client's adapter has (PEFT's prefix off).
pub fn adapter_tensors(dir: &Path) -> Result<Vec<(String, Tensor)>, ClientError> {
    let file = dir.join(rlvr_model::lora::WEIGHTS_FILE);
    let weights = WeightFiles::open_file(&file).map_err(|e| request(format!("{}: {e}", dir.display())))?;
    let mut tensors = Vec::new();
    for name in weights.names() {
        let shape = weights.shape(name).unwrap_or_default().to_vec();
        let tensor = weights
            .get(name, &shape, tch::Device::Cpu, Kind::Float)
            .map_err(|e| ClientError::Internal(e.to_string()))?;
        tensors.push((name.strip_prefix(rlvr_model::lora::PEFT_PREFIX).unwrap_or(name).to_owned(), tensor));
    }
    Ok(tensors)
}

fn adam_config(params: &AdamParams) -> AdamWConfig {
    AdamWConfig {
        beta1: params.beta1,
        beta2: params.beta2,
        eps: params.eps,
        weight_decay: params.weight_decay,
    }
}

/// A seed for a sample that names none, from the OS.
fn rand_seed() -> u64 {
    let mut bytes = [0u8; 8];
    let _ = getrandom::fill(&mut bytes);
    u64::from_le_bytes(bytes)
}

#[cfg(test)]
mod tests {
    fn builtin() -> BaseModel {
        BaseModel { location: "builtin:tiny-arith".into(), name: "builtin:tiny-arith".into() }
    }

    use std::collections::BTreeMap;

    use tch::Device;

    use rlvr_protocol::tinker::datums::{Input, Values};

    use super::*;

    fn lora(rank: u32) -> wire::LoraConfig {
        wire::LoraConfig { rank, seed: None, train_unembed: true, train_mlp: true, train_attn: true }
    }

    fn client(seed: u64) -> TrainingClient {
        let model = rlvr_model::load("builtin:tiny-arith", Device::Cpu, Kind::Float).unwrap();
        TrainingClient::new(model, &lora(4), seed).unwrap()
    }

    /// `prompt` then `answer` as the SDK's datums are made: input the sequence but its last
    /// token, targets the sequence but its first; `extra` inputs per target position, of which a
    /// `weights` input (1 on the answer) comes with every datum.
    fn datum(client: &TrainingClient, prompt: &str, answer: &str, extra: &[(&str, Vec<f32>)]) -> TrainDatum {
        let prompt_ids = client.tokenizer().encode(prompt).unwrap();
        let answer_ids = client.tokenizer().encode(answer).unwrap();
        let full: Vec<i64> = prompt_ids.iter().chain(&answer_ids).copied().collect();
        let n = full.len() - 1;
        let weights: Vec<f32> = (0..n).map(|i| if i + 1 >= prompt_ids.len() { 1.0 } else { 0.0 }).collect();
        let mut inputs: BTreeMap<String, Input> = BTreeMap::new();
        inputs.insert("target_tokens".into(), Input { columns: 1, values: Values::Int(full[1..].to_vec()) });
        inputs.insert("weights".into(), Input { columns: 1, values: Values::Float(weights) });
        for (name, values) in extra {
            let values: Vec<f32> = values.iter().copied().cycle().take(n).collect();
            inputs.insert((*name).to_owned(), Input { columns: 1, values: Values::Float(values) });
        }
        TrainDatum { tokens: full[..n].to_vec(), inputs }
    }

    const STEP: AdamParams = AdamParams {
        learning_rate: 1e-2,
        beta1: 0.9,
        beta2: 0.95,
        eps: 1e-12,
        weight_decay: 0.0,
        grad_clip_norm: 1.0,
    };

    fn adapter(client: &TrainingClient) -> Vec<(String, Tensor)> {
        let mut tensors = client.model().trainable();
        tensors.sort_by(|a, b| a.0.cmp(&b.0));
        tensors
    }

    fn max_diff(a: &[(String, Tensor)], b: &[(String, Tensor)]) -> f64 {
        a.iter().zip(b).map(|((_, x), (_, y))| (x - y).abs().max().double_value(&[])).fold(0.0, f64::max)
    }

    #[test]
    fn sft_steps_lower_the_loss_of_what_they_train_on() {
        let mut client = client(1);
        let data = [datum(&client, "12+7=", "19", &[]), datum(&client, "3+4=", "7", &[])];
        let mut losses = Vec::new();
        for _ in 0..12 {
            let pass = client.forward_backward(&data, &Loss::CrossEntropy, false).unwrap();
            assert_eq!(
                pass.logprobs.iter().map(Vec::len).collect::<Vec<_>>(),
                [data[0].tokens.len(), data[1].tokens.len()]
            );
            losses.push(pass.loss);
            let metrics = client.optim_step(&STEP).unwrap();
            assert!(metrics["grad_norm:mean"] > 0.0);
        }
        assert_eq!(client.steps(), 12);
        assert!(losses[11] < 0.5 * losses[0], "the loss did not fall: {losses:?}");
    }

    #[test]
    fn a_request_sent_in_chunks_trains_as_the_request_whole() {
        let mut whole = client(2);
        let mut chunked = client(2);
        let data: Vec<TrainDatum> =
            ["1+1=", "22+3=", "5+50=", "9+9="].iter().map(|p| datum(&whole, p, "2", &[])).collect();
        let one = whole.forward_backward(&data, &Loss::CrossEntropy, false).unwrap();
        let first = chunked.forward_backward(&data[..2], &Loss::CrossEntropy, false).unwrap();
        let second = chunked.forward_backward(&data[2..], &Loss::CrossEntropy, false).unwrap();
        // The same weights, the same logprobs: to the last bits, which batches of other shapes
        // round otherwise (their matmuls take other kernels).
        let joined = [first.logprobs, second.logprobs].concat();
        for (a, b) in one.logprobs.iter().flatten().zip(joined.iter().flatten()) {
            assert!((a - b).abs() < 1e-5, "{a} ≠ {b}");
        }
        assert!((one.loss - (first.loss + second.loss)).abs() < 1e-4);
        whole.optim_step(&STEP).unwrap();
        chunked.optim_step(&STEP).unwrap();
        let diff = max_diff(&adapter(&whole), &adapter(&chunked));
        assert!(diff < 1e-5, "the adapters after the step differ by {diff:e}");
        // A forward-only pass changes nothing.
        let before = adapter(&whole).into_iter().map(|(n, t)| (n, t.copy())).collect::<Vec<_>>();
        whole.forward_backward(&data, &Loss::CrossEntropy, true).unwrap();
        whole.optim_step(&STEP).unwrap();
        assert_eq!(max_diff(&before, &adapter(&whole)), 0.0, "no gradient, no step");
    }

    #[test]
    fn each_rl_loss_is_its_formula_on_the_returned_logprobs() {
        let sampling = vec![-1.5, -0.4, -2.2, -0.9];
        let advantages = vec![1.0, -0.5, 2.0, 0.0];
        let losses = [
            Loss::ImportanceSampling,
            Loss::Ppo { low: 0.8, high: 1.2 },
            Loss::Cispo { low: 0.9, high: 1.1 },
            Loss::Dro { beta: 0.2 },
            Loss::Gspo { low: 0.9, high: 1.1 },
        ];
        for loss in losses {
            let mut client = client(3);
            let data = [datum(
                &client,
                "41+1=",
                "42",
                &[
                    ("logprobs", sampling.clone()),
                    ("advantages", advantages.clone()),
                    ("sequence_ratio_mask", vec![1.0; 4]),
                ],
            )];
            let pass = client.forward_backward(&data, &loss, false).unwrap();
            let q = |i: usize| f64::from(sampling[i % 4]);
            let lps: Vec<f64> = pass.logprobs[0].iter().map(|&lp| f64::from(lp)).collect();
            // GSPO's sequence ratio: the mean log-ratio over the tokens its mask marks (all).
            let s = (lps.iter().enumerate().map(|(i, lp)| lp - q(i)).sum::<f64>() / lps.len() as f64).exp();
            let mut want = 0.0;
            for (i, &lp) in lps.iter().enumerate() {
                let (q, a) = (q(i), f64::from(advantages[i % 4]));
                let r = (lp - q).exp();
                want -= match loss {
                    Loss::ImportanceSampling => r * a,
                    Loss::Ppo { low, high } => (r * a).min(r.clamp(low, high) * a),
                    Loss::Cispo { low, high } => r.clamp(low, high) * lp * a,
                    Loss::Dro { beta } => lp * a - 0.5 * beta * (lp - q) * (lp - q),
                    Loss::Gspo { low, high } => (s * a).min(s.clamp(low, high) * a),
                    Loss::CrossEntropy => unreachable!(),
                };
            }
            assert!(
                (pass.loss - want).abs() < 1e-4 * want.abs().max(1.0),
                "{loss:?}: loss:sum {} ≠ {want}",
                pass.loss
            );
        }
    }

    #[test]
    fn a_datum_that_cannot_be_trained_on_is_refused_naming_it() {
        let mut client = client(4);
        let good = datum(&client, "1+2=", "3", &[]);
        let mut unshifted = good.clone();
        unshifted.inputs.insert(
            "target_tokens".into(),
            Input { columns: 1, values: Values::Int(vec![1; good.tokens.len()]) },
        );
        let mut outside = good.clone();
        outside.tokens[0] = 1 << 40;
        let cases = [
            (
                vec![good.clone(), unshifted],
                "data[1].loss_fn_inputs.target_tokens: expected model_input shifted by one",
            ),
            (vec![outside], "data[0]: token 1099511627776 is outside the vocabulary"),
            (vec![good.clone()], "data[0].loss_fn_inputs.logprobs: ppo needs it"),
        ];
        for (i, (data, expected)) in cases.into_iter().enumerate() {
            let loss = if i == 2 { Loss::Ppo { low: 0.8, high: 1.2 } } else { Loss::CrossEntropy };
            let refused = client.forward_backward(&data, &loss, false).unwrap_err();
            assert!(
                matches!(&refused, ClientError::Request(m) if m.contains(expected)),
                "{expected}: {refused:?}"
            );
        }
        assert!(
            client
                .optim_step(&AdamParams { beta1: 1.0, ..STEP })
                .unwrap_err()
                .to_string()
                .contains("adam_params.beta1")
        );
        assert!(
            lora_config(&wire::LoraConfig {
                train_attn: false,
                train_mlp: false,
                train_unembed: false,
                ..lora(2)
            })
            .unwrap_err()
            .to_string()
            .contains("nothing would train")
        );
    }

    #[test]
    fn samples_carry_their_logprobs_stop_where_asked_and_repeat_with_a_seed() {
        let client = client(5);
        let prompt = client.tokenizer().encode("12+30=").unwrap();
        let params = SampleParams {
            max_tokens: Some(6),
            seed: Some(9),
            stop: None,
            temperature: 1.0,
            top_k: -1,
            top_p: 1.0,
        };
        let (sequences, prompt_logprobs) = client.sample(&prompt, &params, 3, true).unwrap();
        assert_eq!(sequences.len(), 3);
        for sequence in &sequences {
            assert_eq!(sequence.tokens.len(), sequence.logprobs.len());
            assert!(sequence.logprobs.iter().all(|l| l.is_finite() && *l <= 0.0));
            assert!(sequence.stopped || sequence.tokens.len() == 6, "{sequence:?}");
        }
        let prompt_logprobs = prompt_logprobs.unwrap();
        assert_eq!(prompt_logprobs.len(), prompt.len());
        assert!(prompt_logprobs[0].is_nan() && prompt_logprobs[1..].iter().all(|l| l.is_finite()));
        assert_eq!(
            client.sample(&prompt, &params, 3, false).unwrap().0,
            sequences,
            "the same seed, the same samples"
        );
        let stop = SampleParams {
            stop: Some(StopSpec::Texts(vec!["=".into()])),
            temperature: 0.0,
            ..params.clone()
        };
        let (stopped, _) = client.sample(&client.tokenizer().encode("1").unwrap(), &stop, 1, false).unwrap();
        let text = client.tokenizer().decode(&stopped[0].tokens);
        assert!(!stopped[0].stopped || text.ends_with('='), "{text:?}");
        let tokens = SampleParams { stop: Some(StopSpec::Tokens(vec![5])), ..params };
        assert!(
            client.sample(&prompt, &tokens, 1, false).unwrap_err().to_string().contains("pass stop strings")
        );
    }

    #[test]
    fn a_saved_state_with_its_optimizer_takes_the_same_next_step() {
        let mut trained = client(6);
        let data = [datum(&trained, "8+8=", "16", &[])];
        for _ in 0..2 {
            trained.forward_backward(&data, &Loss::CrossEntropy, false).unwrap();
            trained.optim_step(&STEP).unwrap();
        }
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join("state");
        trained.save_state(&builtin(), &state, true).unwrap();
        let base = || rlvr_model::load("builtin:tiny-arith", Device::Cpu, Kind::Float).unwrap();
        let mut resumed = TrainingClient::load_state(base(), &state, true).unwrap();
        let mut weights_only = TrainingClient::load_state(base(), &state, false).unwrap();
        assert_eq!(max_diff(&adapter(&trained), &adapter(&resumed)), 0.0);
        for client in [&mut trained, &mut resumed, &mut weights_only] {
            client.forward_backward(&data, &Loss::CrossEntropy, false).unwrap();
            client.optim_step(&STEP).unwrap();
        }
        let next = |client: &mut TrainingClient| {
            client.forward_backward(&data, &Loss::CrossEntropy, true).unwrap().loss
        };
        assert_eq!(next(&mut trained), next(&mut resumed), "the same state, the same next step");
        assert_ne!(
            next(&mut trained),
            next(&mut weights_only),
            "without the optimizer's moments, another step"
        );
        let bare = dir.path().join("bare");
        trained.save_state(&builtin(), &bare, false).unwrap();
        let refused = TrainingClient::load_state(base(), &bare, true).unwrap_err();
        assert!(refused.to_string().contains("saved without its optimizer"), "{refused}");
    }

    #[test]
    fn a_client_suspended_between_its_backward_pass_and_its_step_resumes_as_it_was() {
        let mut straight = client(7);
        let mut suspended = client(7);
        let data = [datum(&straight, "30+3=", "33", &[])];
        for client in [&mut straight, &mut suspended] {
            client.forward_backward(&data, &Loss::CrossEntropy, false).unwrap();
            client.optim_step(&STEP).unwrap();
            client.forward_backward(&data, &Loss::CrossEntropy, false).unwrap();
        }
        let dir = tempfile::tempdir().unwrap();
        suspended.suspend(&builtin(), &dir.path().join("suspended")).unwrap();
        let base = rlvr_model::load("builtin:tiny-arith", Device::Cpu, Kind::Float).unwrap();
        let mut resumed = TrainingClient::resume(base, &dir.path().join("suspended")).unwrap();
        assert_eq!(resumed.steps(), 1);
        straight.optim_step(&STEP).unwrap();
        resumed.optim_step(&STEP).unwrap();
        assert_eq!(max_diff(&adapter(&straight), &adapter(&resumed)), 0.0, "the same step, to the bit");
    }

    #[test]
    fn a_state_loads_into_a_live_client_and_a_samplers_weights_sample_as_they_did() {
        let mut trained = client(8);
        let data = [datum(&trained, "2+2=", "4", &[])];
        for _ in 0..3 {
            trained.forward_backward(&data, &Loss::CrossEntropy, false).unwrap();
            trained.optim_step(&STEP).unwrap();
        }
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join("state");
        trained.save_state(&builtin(), &state, false).unwrap();
        let mut other = client(9);
        let own = adapter(&other).into_iter().map(|(n, t)| (n, t.copy())).collect::<Vec<_>>();
        // Sampling with the saved weights: the trained client's samples; its own weights after.
        let prompt = trained.tokenizer().encode("2+2=").unwrap();
        let greedy = SampleParams {
            max_tokens: Some(3),
            seed: Some(1),
            stop: None,
            temperature: 0.0,
            top_k: -1,
            top_p: 1.0,
        };
        let weights = adapter_tensors(&state.join("adapter")).unwrap();
        let sampled = other
            .with_adapter(&weights, |client| client.sample(&prompt, &greedy, 1, false))
            .unwrap()
            .unwrap();
        assert_eq!(sampled.0, trained.sample(&prompt, &greedy, 1, false).unwrap().0);
        assert_eq!(max_diff(&own, &adapter(&other)), 0.0, "the client's own weights are back");
        other.load_state_into(&state, false).unwrap();
        assert_eq!(max_diff(&adapter(&trained), &adapter(&other)), 0.0);
        let model = rlvr_model::load("builtin:tiny-arith", Device::Cpu, Kind::Float).unwrap();
        let mut narrow = TrainingClient::new(model, &lora(2), 1).unwrap();
        let refused = narrow.load_state_into(&state, false).unwrap_err();
        assert!(refused.to_string().contains("is not this client's"), "{refused}");
    }
}
