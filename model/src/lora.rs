//! LoRA adapters (Hu et al., 2021) in Hugging Face PEFT's format: the configuration, fresh
//! adapters, and the adapter directory (`adapter_config.json`, `adapter_model.safetensors`) that
//! PEFT's `PeftModel.from_pretrained` loads over the base it names.
//!
//! The computation is in [`crate::model`]: each targeted linear layer adds
//! `scaling · B·A·dropout(x)` to its output, `scaling = alpha / rank`, as PEFT's `lora.Linear` does.

use std::path::{Path, PathBuf};

use serde_json::{Value, json};
use tch::{Device, Kind, Tensor};

pub use rlvr_protocol::spec::LoraTarget;

use crate::error::{ModelError, Result, io_err};

/// What PEFT prefixes every adapter tensor's name with in `adapter_model.safetensors`.
pub const PEFT_PREFIX: &str = "base_model.model.";

/// The adapter directory's files.
pub const CONFIG_FILE: &str = "adapter_config.json";
pub const WEIGHTS_FILE: &str = "adapter_model.safetensors";

/// What PEFT names the unembedding (output layer) as a target, and its weight's prefix.
pub const UNEMBED: &str = "lm_head";

/// A LoRA configuration: rank, scale, dropout, and the linear layers adapted.
#[derive(Debug, Clone, PartialEq)]
pub struct LoraConfig {
    pub rank: i64,
    pub alpha: f64,
    pub dropout: f64,
    pub target_modules: Vec<LoraTarget>,
    /// The unembedding (`lm_head`) adapted too: its adapter adds to the logits (without dropout).
    pub unembed: bool,
}

impl LoraConfig {
    /// From the job spec's `[model] lora`.
    pub fn from_spec(section: &rlvr_protocol::spec::LoraSection) -> LoraConfig {
        LoraConfig {
            rank: i64::from(section.rank),
            alpha: section.alpha(),
            dropout: section.dropout,
            target_modules: section.target_modules.clone(),
            unembed: false,
        }
    }

    /// What the adapters' product is multiplied by: `alpha / rank`.
    pub fn scaling(&self) -> f64 {
        self.alpha / self.rank as f64
    }

    /// `adapter_config.json` for an adapter over `base` (its path or hub name), as PEFT writes it.
    pub fn to_peft_json(&self, base: &str) -> String {
        let targets: Vec<&str> =
            self.target_modules.iter().map(|t| t.name()).chain(self.unembed.then_some(UNEMBED)).collect();
        let value = json!({
            "peft_type": "LORA",
            "task_type": "CAUSAL_LM",
            "base_model_name_or_path": base,
            "r": self.rank,
            "lora_alpha": self.alpha,
            "lora_dropout": self.dropout,
            "target_modules": targets,
            "bias": "none",
            "fan_in_fan_out": false,
            "use_rslora": false,
            "use_dora": false,
            "modules_to_save": null,
            "layers_to_transform": null,
            "layers_pattern": null,
            "rank_pattern": {},
            "alpha_pattern": {},
            "init_lora_weights": true,
            "inference_mode": true,
            "revision": null,
        });
        let mut text = serde_json::to_string_pretty(&value).expect("serializes");
        text.push('\n');
        text
    }

    /// Reads a PEFT `adapter_config.json`: the configuration and the base it names. Refuses what
    /// the model does not compute (rsLoRA, DoRA, biases, per-layer ranks, other modules trained).
    pub fn read_peft(path: &Path) -> Result<(LoraConfig, String)> {
        let text = std::fs::read_to_string(path).map_err(io_err(path))?;
        let json: Value = serde_json::from_str(&text)
            .map_err(|source| ModelError::Json { file: path.to_owned(), source })?;
        let field = |name: &str| json.get(name).filter(|v| !v.is_null());
        let invalid = |name: &str, message: &str| ModelError::InvalidField {
            file: path.to_owned(),
            field: name.to_owned(),
            message: message.to_owned(),
        };
        let missing = |name: &str| ModelError::MissingField { file: path.to_owned(), field: name.to_owned() };
        match field("peft_type").and_then(Value::as_str) {
            Some("LORA") => {}
            _ => return Err(invalid("peft_type", "expected \"LORA\"")),
        }
        type IsSet = fn(&Value) -> bool;
        let unsupported: [(&str, IsSet); 6] = [
            ("use_rslora", |v| v.as_bool() == Some(true)),
            ("use_dora", |v| v.as_bool() == Some(true)),
            ("fan_in_fan_out", |v| v.as_bool() == Some(true)),
            ("bias", |v| v.as_str().is_some_and(|s| s != "none")),
            ("rank_pattern", |v| v.as_object().is_some_and(|o| !o.is_empty())),
            ("alpha_pattern", |v| v.as_object().is_some_and(|o| !o.is_empty())),
        ];
        for (name, set) in unsupported {
            if field(name).is_some_and(set) {
                return Err(invalid(name, "not supported: plain LoRA adapters only"));
            }
        }
        for name in ["modules_to_save", "layers_to_transform"] {
            if field(name).is_some_and(|v| v.as_array().is_none_or(|a| !a.is_empty())) {
                return Err(invalid(name, "not supported: plain LoRA adapters on every layer only"));
            }
        }
        let rank = field("r").and_then(Value::as_i64).ok_or_else(|| missing("r"))?;
        if rank < 1 {
            return Err(invalid("r", "expected a rank of at least 1"));
        }
        let alpha = field("lora_alpha").and_then(Value::as_f64).ok_or_else(|| missing("lora_alpha"))?;
        let dropout = field("lora_dropout").and_then(Value::as_f64).unwrap_or(0.0);
        let names: Vec<&str> = match field("target_modules") {
            Some(Value::Array(items)) => items.iter().filter_map(Value::as_str).collect(),
            Some(Value::String(one)) => vec![one.as_str()],
            _ => return Err(missing("target_modules")),
        };
        let mut target_modules = Vec::new();
        let mut unembed = false;
        for name in names {
            if name == UNEMBED {
                unembed = true;
                continue;
            }
            let target = LoraTarget::from_name(name).ok_or_else(|| {
                invalid(
                    "target_modules",
                    &format!("unknown module {name:?}: expected q_proj … down_proj or lm_head"),
                )
            })?;
            target_modules.push(target);
        }
        target_modules.sort();
        let base = field("base_model_name_or_path")
            .and_then(Value::as_str)
            .ok_or_else(|| missing("base_model_name_or_path"))?
            .to_owned();
        Ok((LoraConfig { rank, alpha, dropout, target_modules, unembed }, base))
    }
}

/// Where a target sits in a decoder layer: `self_attn.q_proj`, `mlp.gate_proj`.
pub fn module_path(target: LoraTarget) -> &'static str {
    match target {
        LoraTarget::QProj => "self_attn.q_proj",
        LoraTarget::KProj => "self_attn.k_proj",
        LoraTarget::VProj => "self_attn.v_proj",
        LoraTarget::OProj => "self_attn.o_proj",
        LoraTarget::GateProj => "mlp.gate_proj",
        LoraTarget::UpProj => "mlp.up_proj",
        LoraTarget::DownProj => "mlp.down_proj",
    }
}

/// The first value of adapter tensor `name` (`….lora_A.weight` or `….lora_B.weight`): `A` as
/// PEFT's default initialisation draws it (Kaiming-uniform with a = √5: uniform in ±1/√in), from
/// a stream seeded by (seed, name), so the same job starts from the same adapters on any machine;
/// `B` zero, so the adapted model starts as its base.
pub fn initial_tensor(seed: u64, name: &str, shape: &[i64], device: Device, kind: Kind) -> Tensor {
    if name.ends_with("lora_B.weight") {
        return Tensor::zeros(shape, (kind, device));
    }
    let fan_in = shape.get(1).copied().unwrap_or(1).max(1);
    crate::builtin::seeded_uniform(seed, name, shape, 1.0 / (fan_in as f32).sqrt(), device, kind)
}

/// Whether `dir` is a PEFT adapter directory (an adapter config and no model config of its own).
pub fn is_adapter_dir(dir: &Path) -> bool {
    dir.join(CONFIG_FILE).is_file() && !dir.join("config.json").is_file()
}

/// The base an adapter directory names, resolved against the directory when relative.
pub fn base_of(dir: &Path, base: &str) -> String {
    if base.starts_with("builtin:") || Path::new(base).is_absolute() {
        base.to_owned()
    } else {
        PathBuf::from(dir).join(base).to_string_lossy().into_owned()
    }
}
