//! Loading a model (a Hugging Face directory or `builtin:tiny-arith`) and saving a checkpoint
//! that loads back through the directory path.
//!
//! `load` of a PEFT adapter directory loads its base and attaches the adapters; `save_pretrained`
//! writes the adapters merged, `save_adapter` the adapter directory.

use std::io::Write;
use std::path::{Path, PathBuf};

use tch::nn::VarStore;
use tch::{Device, Kind, Tensor};

use crate::builtin;
use crate::config::LlamaConfig;
use crate::error::{ModelError, Result, io_err};
use crate::lora::{self, LoraConfig};
use crate::model::Llama;
use crate::tokenizer::{Tokenizer, TokenizerFiles};
use crate::weights::{WeightFiles, write_safetensors};

/// A model ready to use: weights in a `VarStore` (named as in Hugging Face's files), the
/// decoder over them, its tokenizer and config.
pub struct LoadedModel {
    /// The parameters, trainable, under their Hugging Face names.
    pub vs: VarStore,
    pub model: Llama,
    pub tokenizer: Tokenizer,
    pub config: LlamaConfig,
    /// Where it came from: `builtin:tiny-arith?seed=0` or the directory's path (for an adapter
    /// directory, its base's).
    pub source: String,
    /// LoRA adapters on the weights, when attached: then only they train.
    pub adapters: Option<Adapters>,
}

/// A model's LoRA adapters: their tensors (trainable, under PEFT's names without its prefix) and
/// configuration.
pub struct Adapters {
    pub vs: VarStore,
    pub config: LoraConfig,
}

impl std::fmt::Debug for LoadedModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoadedModel")
            .field("source", &self.source)
            .field("device", &self.model.device())
            .field("kind", &self.model.kind())
            .field("params", &self.num_parameters())
            .field("lora", &self.adapters.as_ref().map(|a| &a.config))
            .finish_non_exhaustive()
    }
}

impl LoadedModel {
    /// Number of parameters (tied embeddings counted once).
    pub fn num_parameters(&self) -> i64 {
        self.vs.variables().values().map(Tensor::numel).sum::<usize>() as i64
    }

    /// Attaches fresh LoRA adapters (`A` seeded from `seed`, `B` zero: the model computes as
    /// before) in the model's device and kind; from then on the base weights are frozen.
    pub fn attach_lora(&mut self, config: &LoraConfig, seed: u64) -> Result<()> {
        let (device, kind) = (self.model.device(), self.model.kind());
        self.attach_lora_with(config, |name, shape| Ok(lora::initial_tensor(seed, name, shape, device, kind)))
    }

    /// Attaches the adapters of a PEFT adapter directory (its `adapter_config.json` and
    /// `adapter_model.safetensors`); the directory's base is not read (this model is the base).
    pub fn attach_lora_from(&mut self, dir: &Path) -> Result<LoraConfig> {
        let (config, _) = LoraConfig::read_peft(&dir.join(lora::CONFIG_FILE))?;
        let (device, kind) = (self.model.device(), self.model.kind());
        let weights = WeightFiles::open_file(&dir.join(lora::WEIGHTS_FILE))?;
        self.attach_lora_with(&config, |name, shape| {
            weights.get(&format!("{}{name}", lora::PEFT_PREFIX), shape, device, kind)
        })?;
        Ok(config)
    }

    fn attach_lora_with(
        &mut self,
        config: &LoraConfig,
        get: impl FnMut(&str, &[i64]) -> Result<Tensor>,
    ) -> Result<()> {
        let vs = VarStore::new(self.model.device());
        self.model.attach_lora(&vs, config, get)?;
        self.vs.freeze();
        self.adapters = Some(Adapters { vs, config: config.clone() });
        Ok(())
    }

    /// Merges the adapters (if any) into the weights and drops them: a plain model again, every
    /// weight trainable.
    pub fn merge_adapters(&mut self) {
        if self.adapters.take().is_some() {
            // An unembedding adapter over tied embeddings leaves an output layer of its own: a
            // weight of the model's store from now on, and the config says so.
            if let Some(head) = self.model.merge_adapters() {
                let name = format!("{}.weight", lora::UNEMBED);
                let kept = crate::model::add_variable(&self.vs, &name, tch::no_grad(|| head.detach().copy()));
                self.model.set_lm_head(kept);
                self.config.tie_word_embeddings = Some(false);
            }
            self.vs.unfreeze();
        }
    }

    /// The tensors that train: the adapters' when there are adapters, else every weight.
    pub fn trainable(&self) -> Vec<(String, Tensor)> {
        let vs = self.adapters.as_ref().map_or(&self.vs, |adapters| &adapters.vs);
        vs.variables().into_iter().collect()
    }

    /// A copy of the values of [`Self::trainable`] now: the weights an earlier update left, to
    /// compute with again later ([`Self::with_earlier_weights`]).
    pub fn snapshot_trainable(&self) -> TrainableSnapshot {
        let copies = tch::no_grad(|| {
            self.trainable_by_name().into_iter().map(|(name, t)| (name, t.detach().copy())).collect()
        });
        TrainableSnapshot(copies)
    }

    /// [`Self::trainable`] in name order (a `VarStore` lists its variables in no fixed order).
    fn trainable_by_name(&self) -> Vec<(String, Tensor)> {
        let mut trainable = self.trainable();
        trainable.sort_by(|a, b| a.0.cmp(&b.0));
        trainable
    }

    /// Runs `f` with `earlier`'s values in the trainable tensors, then puts the current values
    /// back; `earlier` holds the current values afterwards — the next snapshot, taken by the swap
    /// rather than by another copy. The tensors keep their identity (an optimizer's state stays
    /// theirs). Fails when `earlier` is not of this model's trainable tensors.
    pub fn with_earlier_weights<T>(
        &self,
        earlier: &mut TrainableSnapshot,
        f: impl FnOnce() -> T,
    ) -> Result<T> {
        let trainable = self.trainable_by_name();
        let fits = trainable.len() == earlier.0.len()
            && trainable.iter().zip(&earlier.0).all(|((name, t), (earlier_name, e))| {
                name == earlier_name && t.size() == e.size() && t.kind() == e.kind()
            });
        if !fits {
            return Err(ModelError::InvalidInput(
                "a weight snapshot of another model's trainable tensors".into(),
            ));
        }
        tch::no_grad(|| {
            for ((_, tensor), (_, earlier)) in trainable.iter().zip(earlier.0.iter_mut()) {
                let current = tensor.detach().copy();
                tensor.detach().copy_(earlier);
                *earlier = current;
            }
        });
        let result = f();
        tch::no_grad(|| {
            for ((_, tensor), (_, current)) in trainable.iter().zip(&earlier.0) {
                tensor.detach().copy_(current);
            }
        });
        Ok(result)
    }

    /// A copy of this model with its own weights (e.g. the frozen reference when
    /// `reference = "same"`); `trainable = false` makes every parameter require no grad.
    pub fn duplicate(&self, trainable: bool) -> Result<LoadedModel> {
        if self.adapters.is_some() {
            return Err(ModelError::InvalidInput("a model with LoRA adapters is not duplicated".into()));
        }
        let vars = self.vs.variables();
        let spec = self.model.spec().clone();
        let mut vs = VarStore::new(self.model.device());
        let model = Llama::build(&vs, &spec, self.model.kind(), |name, _| {
            let t = vars.get(name).ok_or_else(|| ModelError::MissingTensor {
                name: name.into(),
                file: PathBuf::from(&self.source),
            })?;
            Ok(tch::no_grad(|| t.detach().copy()))
        })?;
        if !trainable {
            vs.freeze();
        }
        let tokenizer = Tokenizer::from_files(self.tokenizer.files.clone(), &self.config)?;
        Ok(LoadedModel {
            vs,
            model,
            tokenizer,
            config: self.config.clone(),
            source: self.source.clone(),
            adapters: None,
        })
    }
}

/// The values of a model's trainable tensors at one moment ([`LoadedModel::snapshot_trainable`]).
/// Name-ordered, as the model's trainable tensors are named.
pub struct TrainableSnapshot(Vec<(String, Tensor)>);

impl TrainableSnapshot {
    /// The bytes it holds.
    pub fn bytes(&self) -> usize {
        self.0.iter().map(|(_, t)| t.numel() * t.kind().elt_size_in_bytes()).sum()
    }
}

/// Loads `source` — a built-in model (`builtin:NAME[?seed=N][&layers=K]`), a directory
/// with `config.json`, safetensors weights and `tokenizer.json`, or a PEFT adapter directory
/// (its base loaded, the adapters attached) — onto `device` in `kind`
/// (`Kind::Float` or `Kind::BFloat16`; bf16 works on CPU but is slower than f32 there unless
/// the CPU has native bf16 matrix units).
pub fn load(source: &str, device: Device, kind: Kind) -> Result<LoadedModel, ModelError> {
    if !matches!(kind, Kind::Float | Kind::BFloat16) {
        return Err(ModelError::UnsupportedKind { kind });
    }
    if source.starts_with(rlvr_protocol::builtin_models::PREFIX) {
        let builtin = builtin::BuiltinSource::parse(source)
            .map_err(|message| ModelError::UnknownSource { source_name: source.to_owned(), message })?;
        return load_builtin(&builtin, device, kind);
    }
    let dir = Path::new(source);
    if !dir.is_dir() {
        return Err(if dir.exists() {
            ModelError::UnknownSource {
                source_name: source.to_owned(),
                message: "expected a model directory or builtin:NAME".to_owned(),
            }
        } else {
            ModelError::MissingFile { path: dir.to_owned() }
        });
    }
    if lora::is_adapter_dir(dir) {
        let (_, base) = LoraConfig::read_peft(&dir.join(lora::CONFIG_FILE))?;
        let base = lora::base_of(dir, &base);
        if lora::is_adapter_dir(Path::new(&base)) {
            return Err(ModelError::InvalidField {
                file: dir.join(lora::CONFIG_FILE),
                field: "base_model_name_or_path".into(),
                message: format!("{base} is an adapter directory itself, not a model"),
            });
        }
        let mut model = load(&base, device, kind)?;
        model.attach_lora_from(dir)?;
        return Ok(model);
    }
    let config_path = dir.join("config.json");
    let config = LlamaConfig::from_file(&config_path)?;
    let spec = config.spec(&config_path)?;
    let tokenizer = Tokenizer::from_dir(dir, &config)?;
    let weights = WeightFiles::open(dir)?;
    let vs = VarStore::new(device);
    let model = Llama::build(&vs, &spec, kind, |name, shape| weights.get(name, shape, device, kind))?;
    Ok(LoadedModel { vs, model, tokenizer, config, source: source.to_owned(), adapters: None })
}

fn load_builtin(source: &builtin::BuiltinSource, device: Device, kind: Kind) -> Result<LoadedModel> {
    let config = builtin::source_config(source);
    let name = source.to_string();
    let spec = config.spec(Path::new(&name))?;
    let shape = source.shape();
    let files = TokenizerFiles {
        tokenizer_json: builtin::tokenizer_json(shape.vocab as i64),
        tokenizer_config: Some(builtin::tokenizer_config_json(shape.max_positions.unwrap_or(512))),
        generation_config: None,
        chat_template_jinja: None,
        dir: PathBuf::from(&name),
    };
    let tokenizer = Tokenizer::from_files(files, &config)?;
    let vs = VarStore::new(device);
    let model = Llama::build(&vs, &spec, kind, |name, shape| {
        Ok(builtin::init_tensor(source, name, shape, device, kind))
    })?;
    Ok(LoadedModel { vs, model, tokenizer, config, source: name, adapters: None })
}

/// `model`'s config with its dtype the weights' own: a bf16 job's checkpoint of a model loaded
/// from f32 weights says `bfloat16`, so that transformers (`torch_dtype="auto"`) and other
/// readers take the weights as they are. Transformers 5 writes `dtype`, 4 `torch_dtype`: the keys
/// the config has are updated, or `torch_dtype` (which both read) added.
fn config_as_saved(model: &LoadedModel, merged: bool) -> LlamaConfig {
    let mut config = model.config.clone();
    // A merged unembedding adapter is an output layer of its own (`Llama::merged_weights`).
    if merged && model.model.has_unembed_adapter() {
        config.tie_word_embeddings = Some(false);
    }
    let kind = model.vs.variables().values().next().map(Tensor::kind);
    let name = match kind {
        Some(Kind::BFloat16) => "bfloat16",
        Some(Kind::Half) => "float16",
        Some(Kind::Float) => "float32",
        _ => return config,
    };
    let keys: Vec<&str> =
        ["dtype", "torch_dtype"].into_iter().filter(|key| config.extra.contains_key(*key)).collect();
    for key in if keys.is_empty() { vec!["torch_dtype"] } else { keys } {
        config.extra.insert(key.to_owned(), serde_json::Value::from(name));
    }
    config
}

/// Writes a checkpoint of `model` to `dir`: `config.json` (its dtype the weights'),
/// `model.safetensors` (Hugging Face names, contiguous, the model's dtype; with LoRA adapters,
/// merged into the weights), `tokenizer.json`, `tokenizer_config.json`, and
/// `chat_template.jinja` / `generation_config.json` when the model has them.
///
/// Atomic: everything is written and fsynced in a temporary directory next to `dir`, which is
/// then renamed to `dir`; a reader sees no checkpoint or a whole one. `dir` must not exist.
pub fn save_pretrained(model: &LoadedModel, dir: &Path) -> Result<()> {
    write_dir_atomically(dir, |tmp| {
        write_text(tmp, "config.json", &config_as_saved(model, true).to_json())?;
        write_tokenizer(&model.tokenizer, tmp)?;
        write_weights(&tmp.join("model.safetensors"), &model.model.merged_weights(&model.vs))
    })
}

/// Writes a LoRA model's base to `dir` as [`save_pretrained`] writes a model, without its
/// adapters (for an engine that applies them itself, each step's as [`save_adapter`] writes
/// them); a model without adapters is written whole. Atomic like [`save_pretrained`].
pub fn save_base(model: &LoadedModel, dir: &Path) -> Result<()> {
    write_dir_atomically(dir, |tmp| {
        write_text(tmp, "config.json", &config_as_saved(model, false).to_json())?;
        write_tokenizer(&model.tokenizer, tmp)?;
        let mut tensors: Vec<(String, Tensor)> = model.vs.variables().into_iter().collect();
        tensors.sort_by(|a, b| a.0.cmp(&b.0));
        write_weights(&tmp.join("model.safetensors"), &tensors)
    })
}

/// Writes `model`'s LoRA adapters to `dir` as a PEFT adapter directory over `base` (the path or
/// name written as `base_model_name_or_path`): `adapter_config.json`, `adapter_model.safetensors`
/// (PEFT's tensor names), and the tokenizer's files, so the directory is all a reader needs besides
/// the base. Atomic like [`save_pretrained`].
pub fn save_adapter(model: &LoadedModel, base: &str, dir: &Path) -> Result<()> {
    let adapters = model
        .adapters
        .as_ref()
        .ok_or_else(|| ModelError::InvalidInput("the model has no LoRA adapters to save".into()))?;
    write_dir_atomically(dir, |tmp| {
        write_text(tmp, lora::CONFIG_FILE, &adapters.config.to_peft_json(base))?;
        write_tokenizer(&model.tokenizer, tmp)?;
        let mut tensors: Vec<(String, Tensor)> = adapters
            .vs
            .variables()
            .into_iter()
            .map(|(name, tensor)| (format!("{}{name}", lora::PEFT_PREFIX), tensor))
            .collect();
        tensors.sort_by(|a, b| a.0.cmp(&b.0));
        write_weights(&tmp.join(lora::WEIGHTS_FILE), &tensors)
    })
}

pub(crate) fn write_text(dir: &Path, file: &str, text: &str) -> Result<()> {
    let path = dir.join(file);
    let mut f = std::fs::File::create(&path).map_err(io_err(&path))?;
    f.write_all(text.as_bytes()).map_err(io_err(&path))?;
    f.sync_all().map_err(io_err(&path))
}

pub(crate) fn write_tokenizer(tokenizer: &Tokenizer, dir: &Path) -> Result<()> {
    let files = &tokenizer.files;
    write_text(dir, "tokenizer.json", &files.tokenizer_json)?;
    let optional = [
        ("tokenizer_config.json", &files.tokenizer_config),
        ("generation_config.json", &files.generation_config),
        ("chat_template.jinja", &files.chat_template_jinja),
    ];
    for (file, text) in optional {
        if let Some(text) = text {
            write_text(dir, file, text)?;
        }
    }
    Ok(())
}

pub(crate) fn write_weights(path: &Path, tensors: &[(String, Tensor)]) -> Result<()> {
    write_safetensors(path, tensors)?;
    std::fs::File::open(path).and_then(|f| f.sync_all()).map_err(io_err(path))
}

/// Fills a temporary directory next to `dir` with `fill`, then renames it to `dir` and fsyncs the
/// parent: a reader sees no directory or a whole one. `dir` must not exist.
pub(crate) fn write_dir_atomically(dir: &Path, fill: impl FnOnce(&Path) -> Result<()>) -> Result<()> {
    if dir.exists() {
        return Err(ModelError::AlreadyExists { path: dir.to_owned() });
    }
    let parent = match dir.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_owned(),
        _ => PathBuf::from("."),
    };
    let name = dir
        .file_name()
        .ok_or_else(|| ModelError::InvalidInput(format!("{} has no file name", dir.display())))?;
    let tmp = tempfile::Builder::new()
        .prefix(&format!(".{}.tmp-", name.to_string_lossy()))
        .tempdir_in(&parent)
        .map_err(io_err(&parent))?;
    fill(tmp.path())?;
    let tmp = tmp.keep();
    if let Err(e) = std::fs::rename(&tmp, dir) {
        let _ = std::fs::remove_dir_all(&tmp);
        return Err(if dir.exists() {
            ModelError::AlreadyExists { path: dir.to_owned() }
        } else {
            ModelError::Io { path: dir.to_owned(), source: e }
        });
    }
    // The rename is durable once the parent directory is.
    std::fs::File::open(&parent).and_then(|f| f.sync_all()).map_err(io_err(&parent))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The snapshot's values are computed with, then the current ones are back, and the
    /// snapshot has become them.
    #[test]
    fn earlier_weights_are_swapped_in_for_one_call_and_the_snapshot_moves_on() {
        let model = load("builtin:tiny-arith", Device::Cpu, Kind::Float).unwrap();
        let first = |m: &LoadedModel| m.trainable_by_name()[0].1.detach().copy();
        let before = first(&model);
        let mut snapshot = model.snapshot_trainable();
        tch::no_grad(|| {
            for (_, tensor) in model.trainable() {
                let _ = tensor.detach().g_add_scalar_(1.0);
            }
        });
        let after = first(&model);
        let seen = model.with_earlier_weights(&mut snapshot, || first(&model)).unwrap();
        assert!(seen.equal(&before), "the call saw the earlier weights");
        assert!(first(&model).equal(&after), "the current weights are back");
        assert!(snapshot.0[0].1.equal(&after), "the snapshot holds the current weights");
        assert_eq!(snapshot.bytes(), model.num_parameters() as usize * 4);

        let other = load("builtin:tiny-arith", Device::Cpu, Kind::Float).unwrap();
        let mut lora = load("builtin:tiny-arith", Device::Cpu, Kind::Float).unwrap();
        let config = LoraConfig {
            rank: 2,
            alpha: 4.0,
            dropout: 0.0,
            target_modules: vec![crate::lora::LoraTarget::QProj],
            unembed: false,
        };
        lora.attach_lora(&config, 0).unwrap();
        let mut wrong = lora.snapshot_trainable();
        assert!(other.with_earlier_weights(&mut wrong, || ()).is_err());
    }
}
