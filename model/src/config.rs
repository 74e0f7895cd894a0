//! `config.json` of a Llama-family model: what we read, checked, and written back unchanged.
//!
//! Transformers has two spellings for RoPE settings: `rope_theta` + `rope_scaling` (v4) and
//! `rope_parameters` (v5, with `rope_theta` inside). Both are read; `rope_parameters` wins.

use std::path::Path;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::error::{ModelError, Result};

/// The parsed `config.json`. Fields the model does not use are kept in `extra`, so writing the
/// config back gives the same keys and values (`serde_json` round trip).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LlamaConfig {
    pub model_type: String,
    pub hidden_size: i64,
    pub intermediate_size: i64,
    pub num_hidden_layers: i64,
    pub num_attention_heads: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub num_key_value_heads: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub head_dim: Option<i64>,
    pub vocab_size: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rms_norm_eps: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rope_theta: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rope_scaling: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rope_parameters: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_position_embeddings: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tie_word_embeddings: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attention_bias: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mlp_bias: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hidden_act: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sliding_window: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub use_sliding_window: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bos_token_id: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eos_token_id: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pad_token_id: Option<Value>,
    /// Every other key, written back as it was read.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// How rotary position embeddings are computed.
#[derive(Clone, Debug, PartialEq)]
pub enum RopeScaling {
    /// Plain RoPE.
    None,
    /// Positions divided by `factor` (inv_freq / factor).
    Linear { factor: f64 },
    /// Llama 3.1's frequency-dependent scaling.
    Llama3 { factor: f64, low_freq_factor: f64, high_freq_factor: f64, original_max_position_embeddings: f64 },
}

/// What the model code needs, checked and resolved (defaults applied) from a [`LlamaConfig`].
#[derive(Clone, Debug, PartialEq)]
pub struct ModelSpec {
    pub hidden_size: i64,
    pub intermediate_size: i64,
    pub num_layers: i64,
    pub num_heads: i64,
    pub num_kv_heads: i64,
    pub head_dim: i64,
    pub vocab_size: i64,
    pub rms_norm_eps: f64,
    pub rope_theta: f64,
    pub rope_scaling: RopeScaling,
    pub tie_word_embeddings: bool,
    /// Bias on q, k and v (Qwen2; Llama's `attention_bias`).
    pub qkv_bias: bool,
    /// Bias on o_proj (Llama's `attention_bias`; not Qwen2).
    pub o_bias: bool,
    pub mlp_bias: bool,
    /// Mistral's sliding-window attention, in tokens.
    pub sliding_window: Option<i64>,
}

impl LlamaConfig {
    /// Reads and parses `config.json` (no checks beyond the JSON shape; see [`Self::spec`]).
    pub fn from_file(path: &Path) -> Result<LlamaConfig> {
        let text = std::fs::read_to_string(path).map_err(|source| {
            if source.kind() == std::io::ErrorKind::NotFound {
                ModelError::MissingFile { path: path.to_owned() }
            } else {
                ModelError::Io { path: path.to_owned(), source }
            }
        })?;
        Self::from_json(&text, path)
    }

    /// Parses the text of a `config.json`; `file` names it in errors.
    pub fn from_json(text: &str, file: &Path) -> Result<LlamaConfig> {
        let value: Value = serde_json::from_str(text)
            .map_err(|source| ModelError::Json { file: file.to_owned(), source })?;
        let Value::Object(map) = &value else {
            return Err(ModelError::InvalidField {
                file: file.to_owned(),
                field: "(top level)".into(),
                message: "expected a JSON object".into(),
            });
        };
        for field in [
            "model_type",
            "hidden_size",
            "intermediate_size",
            "num_hidden_layers",
            "num_attention_heads",
            "vocab_size",
        ] {
            if map.get(field).is_none_or(Value::is_null) {
                return Err(ModelError::MissingField { file: file.to_owned(), field: field.into() });
            }
        }
        serde_path_to_error::deserialize(value).map_err(|e| ModelError::InvalidField {
            file: file.to_owned(),
            field: e.path().to_string(),
            message: e.inner().to_string(),
        })
    }

    /// The config as pretty JSON, as `config.json` is written.
    pub fn to_json(&self) -> String {
        let mut text = serde_json::to_string_pretty(self).expect("a config serializes");
        text.push('\n');
        text
    }

    /// Checks what the model code supports and resolves defaults; `file` names the config in
    /// errors.
    pub fn spec(&self, file: &Path) -> Result<ModelSpec> {
        let invalid = |field: &str, message: String| ModelError::InvalidField {
            file: file.to_owned(),
            field: field.into(),
            message,
        };
        let qwen2 = match self.model_type.as_str() {
            "llama" | "mistral" => false,
            "qwen2" => true,
            other => {
                return Err(ModelError::UnsupportedModelType {
                    file: file.to_owned(),
                    model_type: other.into(),
                });
            }
        };
        if let Some(act) = &self.hidden_act
            && act != "silu"
        {
            return Err(invalid("hidden_act", format!("unsupported activation \"{act}\" (supported: silu)")));
        }
        for (field, v) in [
            ("hidden_size", self.hidden_size),
            ("intermediate_size", self.intermediate_size),
            ("num_hidden_layers", self.num_hidden_layers),
            ("num_attention_heads", self.num_attention_heads),
            ("vocab_size", self.vocab_size),
        ] {
            if v <= 0 {
                return Err(invalid(field, format!("must be positive, found {v}")));
            }
        }
        let num_kv_heads = self.num_key_value_heads.unwrap_or(self.num_attention_heads);
        if num_kv_heads <= 0 || self.num_attention_heads % num_kv_heads != 0 {
            return Err(invalid(
                "num_key_value_heads",
                format!("{num_kv_heads} does not divide num_attention_heads {}", self.num_attention_heads),
            ));
        }
        let head_dim = match self.head_dim {
            Some(d) => d,
            None => {
                if self.hidden_size % self.num_attention_heads != 0 {
                    return Err(invalid(
                        "head_dim",
                        "absent and hidden_size is not a multiple of num_attention_heads".into(),
                    ));
                }
                self.hidden_size / self.num_attention_heads
            }
        };
        if head_dim <= 0 || head_dim % 2 != 0 {
            return Err(invalid("head_dim", format!("must be even and positive for RoPE, found {head_dim}")));
        }
        let (rope_theta, rope_scaling) = self.rope(file)?;
        let sliding_window = match &self.sliding_window {
            None | Some(Value::Null) => None,
            Some(v) => {
                let w = v.as_i64().filter(|w| *w > 0).ok_or_else(|| {
                    invalid("sliding_window", format!("expected a positive integer or null, found {v}"))
                })?;
                if qwen2 {
                    // Qwen2 applies the window only with use_sliding_window, and then only to
                    // the layers past max_window_layers: refuse it rather than get it subtly wrong.
                    if self.use_sliding_window == Some(true) {
                        return Err(invalid(
                            "use_sliding_window",
                            "Qwen2 sliding-window attention is not supported".into(),
                        ));
                    }
                    None
                } else {
                    Some(w)
                }
            }
        };
        let attention_bias = self.attention_bias.unwrap_or(false);
        Ok(ModelSpec {
            hidden_size: self.hidden_size,
            intermediate_size: self.intermediate_size,
            num_layers: self.num_hidden_layers,
            num_heads: self.num_attention_heads,
            num_kv_heads,
            head_dim,
            vocab_size: self.vocab_size,
            // transformers' default for Llama, Mistral and Qwen2.
            rms_norm_eps: self.rms_norm_eps.unwrap_or(1e-6),
            rope_theta,
            rope_scaling,
            // LlamaConfig, MistralConfig and Qwen2Config all default to untied.
            tie_word_embeddings: self.tie_word_embeddings.unwrap_or(false),
            qkv_bias: qwen2 || attention_bias,
            o_bias: !qwen2 && attention_bias,
            mlp_bias: !qwen2 && self.mlp_bias.unwrap_or(false),
            sliding_window,
        })
    }

    fn rope(&self, file: &Path) -> Result<(f64, RopeScaling)> {
        // v5 writes everything under rope_parameters; v4 has rope_theta + rope_scaling.
        let (params, field) = match (&self.rope_parameters, &self.rope_scaling) {
            (Some(p @ Value::Object(_)), _) => (Some(p), "rope_parameters"),
            (_, Some(s @ Value::Object(_))) => (Some(s), "rope_scaling"),
            _ => (None, "rope_scaling"),
        };
        let num = |key: &str| -> Result<Option<f64>> {
            match params.and_then(|p| p.get(key)) {
                None | Some(Value::Null) => Ok(None),
                Some(v) => v.as_f64().map(Some).ok_or_else(|| ModelError::InvalidField {
                    file: file.to_owned(),
                    field: format!("{field}.{key}"),
                    message: format!("expected a number, found {v}"),
                }),
            }
        };
        let need = |key: &str| -> Result<f64> {
            num(key)?.ok_or_else(|| ModelError::MissingField {
                file: file.to_owned(),
                field: format!("{field}.{key}"),
            })
        };
        let theta = num("rope_theta")?.or(self.rope_theta).unwrap_or(10_000.0);
        let rope_type = params
            .and_then(|p| p.get("rope_type").or_else(|| p.get("type")))
            .and_then(Value::as_str)
            .unwrap_or("default");
        let scaling = match rope_type {
            "default" => RopeScaling::None,
            "linear" => RopeScaling::Linear { factor: need("factor")? },
            "llama3" => {
                let original = match num("original_max_position_embeddings")? {
                    Some(v) => v,
                    None => {
                        return Err(ModelError::MissingField {
                            file: file.to_owned(),
                            field: format!("{field}.original_max_position_embeddings"),
                        });
                    }
                };
                RopeScaling::Llama3 {
                    factor: need("factor")?,
                    low_freq_factor: need("low_freq_factor")?,
                    high_freq_factor: need("high_freq_factor")?,
                    original_max_position_embeddings: original,
                }
            }
            other => {
                return Err(ModelError::UnsupportedRope { file: file.to_owned(), rope_type: other.into() });
            }
        };
        Ok((theta, scaling))
    }

    /// The EOS ids the config names (`eos_token_id`: a number or a list).
    pub fn eos_token_ids(&self) -> Vec<i64> {
        ids_of(self.eos_token_id.as_ref())
    }

    /// The PAD id the config names, if any.
    pub fn pad_token_id(&self) -> Option<i64> {
        ids_of(self.pad_token_id.as_ref()).first().copied()
    }
}

/// The ids in a `*_token_id` value: a number, a list of numbers, or null.
pub(crate) fn ids_of(value: Option<&Value>) -> Vec<i64> {
    match value {
        Some(Value::Number(n)) => n.as_i64().into_iter().collect(),
        Some(Value::Array(items)) => items.iter().filter_map(Value::as_i64).collect(),
        _ => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec_of(json: &str) -> Result<ModelSpec> {
        let file = Path::new("config.json");
        LlamaConfig::from_json(json, file)?.spec(file)
    }

    const BASE: &str = r#""hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 100"#;

    #[test]
    fn llama_defaults_and_round_trip() {
        let json = format!(r#"{{"model_type": "llama", {BASE}, "rope_theta": 500000.0, "foo": [1, 2]}}"#);
        let file = Path::new("config.json");
        let config = LlamaConfig::from_json(&json, file).unwrap();
        let spec = config.spec(file).unwrap();
        assert_eq!(spec.head_dim, 16);
        assert_eq!(spec.rope_theta, 500000.0);
        assert!(!spec.tie_word_embeddings && !spec.qkv_bias);
        let back: Value = serde_json::from_str(&config.to_json()).unwrap();
        assert_eq!(back, serde_json::from_str::<Value>(&json).unwrap());
    }

    #[test]
    fn qwen2_has_qkv_bias_only() {
        let spec = spec_of(&format!(
            r#"{{"model_type": "qwen2", {BASE}, "sliding_window": 4096, "use_sliding_window": false}}"#
        ))
        .unwrap();
        assert!(spec.qkv_bias && !spec.o_bias && spec.sliding_window.is_none());
    }

    #[test]
    fn rope_scaling_kinds() {
        let spec = spec_of(&format!(
            r#"{{"model_type": "llama", {BASE}, "rope_scaling": {{"type": "linear", "factor": 2.0}}}}"#
        ))
        .unwrap();
        assert_eq!(spec.rope_scaling, RopeScaling::Linear { factor: 2.0 });
        let spec = spec_of(&format!(
            r#"{{"model_type": "llama", {BASE}, "rope_parameters": {{"rope_type": "llama3", "rope_theta": 1000.0, "factor": 8.0,
                "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 64}}}}"#
        ))
        .unwrap();
        assert_eq!(spec.rope_theta, 1000.0);
        assert!(matches!(spec.rope_scaling, RopeScaling::Llama3 { factor: 8.0, .. }));
        let err = spec_of(&format!(
            r#"{{"model_type": "llama", {BASE}, "rope_scaling": {{"rope_type": "yarn", "factor": 4.0}}}}"#
        ))
        .unwrap_err();
        assert_eq!(
            err.to_string(),
            "config.json: unsupported rope type \"yarn\" (supported: default, linear, llama3)"
        );
    }

    #[test]
    fn errors_name_the_field() {
        let err = spec_of(&format!(r#"{{"model_type": "gpt2", {BASE}}}"#)).unwrap_err();
        assert_eq!(
            err.to_string(),
            "config.json: unsupported model_type \"gpt2\" (supported: llama, mistral, qwen2)"
        );
        let err = spec_of(r#"{"model_type": "llama", "hidden_size": 64}"#).unwrap_err();
        assert_eq!(err.to_string(), "config.json: missing field \"intermediate_size\"");
        let err = spec_of(
            r#"{"model_type": "llama", "hidden_size": "64", "intermediate_size": 1, "num_hidden_layers": 1,
            "num_attention_heads": 1, "vocab_size": 1}"#,
        )
        .unwrap_err();
        assert!(err.to_string().starts_with("config.json: field \"hidden_size\": invalid type"), "{err}");
        let err =
            spec_of(&format!(r#"{{"model_type": "llama", {BASE}, "hidden_act": "gelu"}}"#)).unwrap_err();
        assert!(err.to_string().contains("\"hidden_act\""), "{err}");
    }
}
