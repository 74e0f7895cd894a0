//! The crate's error type: every failure names the file and the key or field it is about.

use std::path::PathBuf;

/// Why a model, tokenizer or checkpoint could not be loaded or saved, or a batch not built.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// Reading or writing `path` failed (the cause says which: a missing file, a full disk).
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("missing file {path}")]
    MissingFile { path: PathBuf },
    #[error(
        "no model weights in {dir}: expected model.safetensors, model.safetensors.index.json or *.safetensors"
    )]
    NoWeights { dir: PathBuf },
    #[error("{file}: invalid JSON: {source}")]
    Json {
        file: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error("{file}: missing field \"{field}\"")]
    MissingField { file: PathBuf, field: String },
    #[error("{file}: field \"{field}\": {message}")]
    InvalidField { file: PathBuf, field: String, message: String },
    #[error("{file}: unsupported model_type \"{model_type}\" (supported: llama, mistral, qwen2)")]
    UnsupportedModelType { file: PathBuf, model_type: String },
    #[error("{file}: unsupported rope type \"{rope_type}\" (supported: default, linear, llama3)")]
    UnsupportedRope { file: PathBuf, rope_type: String },
    #[error("missing tensor {name} in {file}")]
    MissingTensor { name: String, file: PathBuf },
    #[error("tensor {name} in {file}: shape mismatch, expected {expected:?}, found {found:?}")]
    ShapeMismatch { name: String, file: PathBuf, expected: Vec<i64>, found: Vec<i64> },
    #[error("tensor {name} in {file}: unsupported dtype {dtype}")]
    UnsupportedDtype { name: String, file: PathBuf, dtype: String },
    #[error("{file}: not a valid safetensors file: {message}")]
    Safetensors { file: PathBuf, message: String },
    #[error("{file}: tokenizer: {message}")]
    Tokenizer { file: PathBuf, message: String },
    #[error("chat template from {file}: {message}")]
    Template { file: PathBuf, message: String },
    #[error("unknown model source \"{source_name}\": {message}")]
    UnknownSource { source_name: String, message: String },
    #[error("unsupported dtype {kind:?}: models load as f32 (Float) or bf16 (BFloat16)")]
    UnsupportedKind { kind: tch::Kind },
    #[error("{path} already exists: a checkpoint is never written over")]
    AlreadyExists { path: PathBuf },
    #[error("{what}: {source}")]
    Torch {
        what: String,
        #[source]
        source: tch::TchError,
    },
    #[error("invalid input: {0}")]
    InvalidInput(String),
}

/// The crate's result type.
pub type Result<T, E = ModelError> = std::result::Result<T, E>;

pub(crate) fn io_err(path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> ModelError {
    let path = path.into();
    move |source| ModelError::Io { path, source }
}

pub(crate) fn torch_err(what: impl Into<String>) -> impl FnOnce(tch::TchError) -> ModelError {
    let what = what.into();
    move |source| ModelError::Torch { what, source }
}
