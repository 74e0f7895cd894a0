//! Loading a model (a Hugging Face directory or `builtin:tiny-arith`) and saving a checkpoint
//! that loads back through the directory path.

use std::io::Write;
use std::path::{Path, PathBuf};

use tch::nn::VarStore;
use tch::{Device, Kind, Tensor};

use crate::builtin;
use crate::config::LlamaConfig;
use crate::error::{ModelError, Result, io_err};
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
    /// Where it came from: `builtin:tiny-arith?seed=0` or the directory's path.
    pub source: String,
}

impl std::fmt::Debug for LoadedModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoadedModel")
            .field("source", &self.source)
            .field("device", &self.model.device())
            .field("kind", &self.model.kind())
            .field("params", &self.num_parameters())
            .finish_non_exhaustive()
    }
}

impl LoadedModel {
    /// Number of parameters (tied embeddings counted once).
    pub fn num_parameters(&self) -> i64 {
        self.vs.variables().values().map(Tensor::numel).sum::<usize>() as i64
    }

    /// A copy of this model with its own weights (e.g. the frozen reference when
    /// `reference = "same"`); `trainable = false` makes every parameter require no grad.
    pub fn duplicate(&self, trainable: bool) -> Result<LoadedModel> {
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
        Ok(LoadedModel { vs, model, tokenizer, config: self.config.clone(), source: self.source.clone() })
    }
}

/// Loads `source` — `builtin:tiny-arith` (seed 0), `builtin:tiny-arith?seed=N`, or a directory
/// with `config.json`, safetensors weights and `tokenizer.json` — onto `device` in `kind`
/// (`Kind::Float` or `Kind::BFloat16`; bf16 works on CPU but is slower than f32 there unless
/// the CPU has native bf16 matrix units).
pub fn load(source: &str, device: Device, kind: Kind) -> Result<LoadedModel, ModelError> {
    if !matches!(kind, Kind::Float | Kind::BFloat16) {
        return Err(ModelError::UnsupportedKind { kind });
    }
    if source.starts_with("builtin:") {
        let seed = builtin::parse_source(source)
            .ok_or_else(|| ModelError::UnknownSource { source_name: source.to_owned() })?;
        return load_builtin(seed, device, kind);
    }
    let dir = Path::new(source);
    if !dir.is_dir() {
        return Err(if dir.exists() {
            ModelError::UnknownSource { source_name: source.to_owned() }
        } else {
            ModelError::MissingFile { path: dir.to_owned() }
        });
    }
    let config_path = dir.join("config.json");
    let config = LlamaConfig::from_file(&config_path)?;
    let spec = config.spec(&config_path)?;
    let tokenizer = Tokenizer::from_dir(dir, &config)?;
    let weights = WeightFiles::open(dir)?;
    let vs = VarStore::new(device);
    let model = Llama::build(&vs, &spec, kind, |name, shape| weights.get(name, shape, device, kind))?;
    Ok(LoadedModel { vs, model, tokenizer, config, source: source.to_owned() })
}

fn load_builtin(seed: u64, device: Device, kind: Kind) -> Result<LoadedModel> {
    let config = builtin::config(seed);
    let spec = config.spec(Path::new(builtin::NAME))?;
    let files = TokenizerFiles {
        tokenizer_json: builtin::tokenizer_json(),
        tokenizer_config: Some(builtin::tokenizer_config_json()),
        generation_config: None,
        chat_template_jinja: None,
        dir: PathBuf::from(builtin::NAME),
    };
    let tokenizer = Tokenizer::from_files(files, &config)?;
    let vs = VarStore::new(device);
    let model = Llama::build(&vs, &spec, kind, |name, shape| {
        Ok(builtin::init_tensor(seed, name, shape, device, kind))
    })?;
    Ok(LoadedModel { vs, model, tokenizer, config, source: format!("{}?seed={seed}", builtin::NAME) })
}

/// `model`'s config with its dtype the weights' own: a bf16 job's checkpoint of a model loaded
/// from f32 weights says `bfloat16`, so that transformers (`torch_dtype="auto"`) and other
/// readers take the weights as they are. Transformers 5 writes `dtype`, 4 `torch_dtype`: the keys
/// the config has are updated, or `torch_dtype` (which both read) added.
fn config_as_saved(model: &LoadedModel) -> LlamaConfig {
    let mut config = model.config.clone();
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
/// `model.safetensors` (Hugging Face names, contiguous, the model's dtype), `tokenizer.json`, `tokenizer_config.json`, and
/// `chat_template.jinja` / `generation_config.json` when the model has them.
///
/// Atomic: everything is written and fsynced in a temporary directory next to `dir`, which is
/// then renamed to `dir`; a reader sees no checkpoint or a whole one. `dir` must not exist.
pub fn save_pretrained(model: &LoadedModel, dir: &Path) -> Result<()> {
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
    let write = |file: &str, text: &str| -> Result<()> {
        let path = tmp.path().join(file);
        let mut f = std::fs::File::create(&path).map_err(io_err(&path))?;
        f.write_all(text.as_bytes()).map_err(io_err(&path))?;
        f.sync_all().map_err(io_err(&path))
    };
    write("config.json", &config_as_saved(model).to_json())?;
    let files = &model.tokenizer.files;
    write("tokenizer.json", &files.tokenizer_json)?;
    if let Some(text) = &files.tokenizer_config {
        write("tokenizer_config.json", text)?;
    }
    if let Some(text) = &files.generation_config {
        write("generation_config.json", text)?;
    }
    if let Some(text) = &files.chat_template_jinja {
        write("chat_template.jinja", text)?;
    }
    let mut tensors: Vec<(String, Tensor)> = model.vs.variables().into_iter().collect();
    tensors.sort_by(|a, b| a.0.cmp(&b.0));
    let weights = tmp.path().join("model.safetensors");
    write_safetensors(&weights, &tensors)?;
    std::fs::File::open(&weights).and_then(|f| f.sync_all()).map_err(io_err(&weights))?;
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
