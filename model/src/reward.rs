//! Learned reward models: Hugging Face sequence-classification checkpoints (a Llama-family
//! backbone under `model.*` and a bias-free linear head `score.weight` `[num_labels, hidden]`,
//! `config.json` naming `LlamaForSequenceClassification` — or Mistral's or Qwen2's — with its
//! labels and `pad_token_id`), loaded, scored in batches without grad, and written back.
//!
//! A row's score is the head applied to the final hidden state at one position, chosen as
//! transformers' `*ForSequenceClassification` chooses it: the rightmost token whose id is not the
//! config's `pad_token_id` (a token equal to it at the end of the text is skipped, as transformers
//! skips it; a row of nothing but that id is read at position 0), or the last token when the
//! config has no `pad_token_id` (where transformers refuses batches of more than one row). Rows
//! are padded on the right, so the choice never depends on the other rows of a batch; transformers
//! with left padding reads the same position except for a row of nothing but the pad id.
//!
//! `from_base` makes one from a causal LM with a fresh head; `save_pretrained` writes it back;
//! `training_logits` gives the scores with grad, for the `rm` optimizer.

use std::path::{Path, PathBuf};

use serde_json::{Map, Value, json};
use tch::nn::VarStore;
use tch::{Device, Kind, Tensor};

use crate::chat::ChatMessage;
use crate::config::LlamaConfig;
use crate::error::{ModelError, Result};
use crate::model::{Llama, Padding, add_variable, positions_from_mask};
use crate::policy::{LoadedModel, write_dir_atomically, write_text, write_tokenizer, write_weights};
use crate::tokenizer::Tokenizer;
use crate::weights::WeightFiles;

/// The head's tensor name in a sequence-classification checkpoint.
pub const SCORE_WEIGHT: &str = "score.weight";

/// Labels when the config names none: transformers' `PretrainedConfig` default, which it does not
/// write to `config.json` (a two-label model's config has no `id2label`).
const DEFAULT_NUM_LABELS: usize = 2;

/// A loaded reward model: backbone, score head, tokenizer and config.
pub struct RewardModel {
    /// Every tensor under its Hugging Face name (`model.*`, `score.weight`), frozen.
    pub vs: VarStore,
    model: Llama,
    /// `[num_labels, hidden]`.
    score: Tensor,
    pub tokenizer: Tokenizer,
    pub config: LlamaConfig,
    /// `id2label` in id order.
    labels: Vec<String>,
    /// The config's `pad_token_id`: what the scored position skips (see the module docs).
    pad_token_id: Option<i64>,
    /// The directory it came from, or `builtin:…` for one made from a base model.
    pub source: String,
}

impl std::fmt::Debug for RewardModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RewardModel")
            .field("source", &self.source)
            .field("device", &self.model.device())
            .field("kind", &self.model.kind())
            .field("labels", &self.labels)
            .field("pad_token_id", &self.pad_token_id)
            .finish_non_exhaustive()
    }
}

/// The sequence-classification architecture name of a model type.
fn architecture(model_type: &str) -> Option<&'static str> {
    match model_type {
        "llama" => Some("LlamaForSequenceClassification"),
        "mistral" => Some("MistralForSequenceClassification"),
        "qwen2" => Some("Qwen2ForSequenceClassification"),
        _ => None,
    }
}

/// `id2label` in id order: every id from 0 to n−1 once. Absent, transformers' two default labels.
fn labels_of(config: &LlamaConfig, file: &Path) -> Result<Vec<String>> {
    let invalid = |field: &str, message: String| ModelError::InvalidField {
        file: file.to_owned(),
        field: field.into(),
        message,
    };
    let declared = match config.extra.get("num_labels") {
        None | Some(Value::Null) => None,
        Some(v) => Some(
            v.as_u64()
                .filter(|n| *n > 0)
                .ok_or_else(|| invalid("num_labels", format!("expected a positive integer, found {v}")))?
                as usize,
        ),
    };
    let labels = match config.extra.get("id2label") {
        None | Some(Value::Null) => {
            let n = declared.unwrap_or(DEFAULT_NUM_LABELS);
            return Ok((0..n).map(|i| format!("LABEL_{i}")).collect());
        }
        Some(Value::Object(map)) => {
            let mut labels = vec![None; map.len()];
            for (id, name) in map {
                let i = id.parse::<usize>().ok().filter(|i| *i < map.len()).ok_or_else(|| {
                    invalid("id2label", format!("id \"{id}\" is not one of 0..{}", map.len()))
                })?;
                let name = name.as_str().ok_or_else(|| {
                    invalid("id2label", format!("label of id {id} is not a string: {name}"))
                })?;
                if labels[i].replace(name.to_owned()).is_some() {
                    return Err(invalid("id2label", format!("id {i} is named twice")));
                }
            }
            // n distinct ids below n: every slot is filled.
            labels.into_iter().map(|l| l.unwrap_or_default()).collect::<Vec<String>>()
        }
        Some(v) => return Err(invalid("id2label", format!("expected an object of id to label, found {v}"))),
    };
    if labels.is_empty() {
        return Err(invalid("id2label", "names no label".into()));
    }
    if let Some(n) = declared
        && n != labels.len()
    {
        return Err(invalid("num_labels", format!("{n}, but id2label names {} labels", labels.len())));
    }
    Ok(labels)
}

/// Loads the sequence-classification checkpoint in `dir` onto `device` in `kind` (f32 or bf16),
/// frozen: `config.json` must name the architecture of its `model_type` in `architectures`, the
/// weights hold `model.*` and `score.weight`, and `tokenizer.json` is there.
pub fn load_reward_model(dir: &Path, device: Device, kind: Kind) -> Result<RewardModel> {
    if !matches!(kind, Kind::Float | Kind::BFloat16) {
        return Err(ModelError::UnsupportedKind { kind });
    }
    if !dir.is_dir() {
        return Err(ModelError::MissingFile { path: dir.to_owned() });
    }
    let config_path = dir.join("config.json");
    let config = LlamaConfig::from_file(&config_path)?;
    let spec = config.spec(&config_path)?;
    let wanted = architecture(&config.model_type).expect("spec() accepted the model_type");
    let names: Vec<&str> = match config.extra.get("architectures") {
        Some(Value::Array(items)) => items.iter().filter_map(Value::as_str).collect(),
        _ => Vec::new(),
    };
    if !names.contains(&wanted) {
        return Err(ModelError::InvalidField {
            file: config_path,
            field: "architectures".into(),
            message: format!("{names:?} does not name {wanted}: not a sequence-classification checkpoint"),
        });
    }
    let labels = labels_of(&config, &config_path)?;
    let tokenizer = Tokenizer::from_dir(dir, &config)?;
    let weights = WeightFiles::open(dir)?;
    let vs = VarStore::new(device);
    let model =
        Llama::build_backbone(&vs, &spec, kind, |name, shape| weights.get(name, shape, device, kind))?;
    let shape = [labels.len() as i64, spec.hidden_size];
    let score = add_variable(&vs, SCORE_WEIGHT, weights.get(SCORE_WEIGHT, &shape, device, kind)?);
    let mut vs = vs;
    vs.freeze();
    let pad_token_id = config.pad_token_id();
    Ok(RewardModel {
        vs,
        model,
        score,
        tokenizer,
        config,
        labels,
        pad_token_id,
        source: dir.display().to_string(),
    })
}

/// The position a row of real length `len` is scored at (see the module docs): the rightmost
/// token that is not `pad`, position 0 when every token is `pad`, the last without a `pad`.
pub fn scored_position(ids: &[i64], pad: Option<i64>) -> usize {
    match pad {
        None => ids.len().saturating_sub(1),
        Some(pad) => ids.iter().rposition(|&id| id != pad).unwrap_or(0),
    }
}

impl RewardModel {
    /// A fresh reward model on `base`'s backbone (its LM head, if untied, left out): a head of
    /// `num_labels` rows drawn from `seed` (uniform, std 0.02, transformers' initializer range),
    /// the config `base`'s with the sequence-classification architecture, default labels and a
    /// `pad_token_id` (the tokenizer's when the config has none). On `base`'s device and kind.
    pub fn from_base(base: &LoadedModel, num_labels: usize, seed: u64) -> Result<RewardModel> {
        if num_labels == 0 {
            return Err(ModelError::InvalidInput("a reward model has at least one label".into()));
        }
        if base.adapters.is_some() {
            return Err(ModelError::InvalidInput(
                "merge the LoRA adapters before making a reward model".into(),
            ));
        }
        let (device, kind) = (base.model.device(), base.model.kind());
        let file = PathBuf::from(&base.source).join("config.json");
        let mut config = base.config.clone();
        let arch = architecture(&config.model_type).ok_or_else(|| ModelError::UnsupportedModelType {
            file: file.clone(),
            model_type: config.model_type.clone(),
        })?;
        let labels: Vec<String> = (0..num_labels).map(|i| format!("LABEL_{i}")).collect();
        config.extra.insert("architectures".into(), json!([arch]));
        let id2label: Map<String, Value> =
            labels.iter().enumerate().map(|(i, l)| (i.to_string(), json!(l))).collect();
        let label2id: Map<String, Value> =
            labels.iter().enumerate().map(|(i, l)| (l.clone(), json!(i))).collect();
        config.extra.insert("id2label".into(), Value::Object(id2label));
        config.extra.insert("label2id".into(), Value::Object(label2id));
        config.extra.remove("num_labels");
        if config.pad_token_id().is_none() {
            config.pad_token_id = Some(json!(base.tokenizer.pad_id()));
        }
        let spec = base.model.spec().clone();
        let vars = base.vs.variables();
        let vs = VarStore::new(device);
        let model = Llama::build_backbone(&vs, &spec, kind, |name, _| {
            let t = vars
                .get(name)
                .ok_or_else(|| ModelError::MissingTensor { name: name.into(), file: file.clone() })?;
            Ok(tch::no_grad(|| t.detach().copy()))
        })?;
        let head = crate::builtin::seeded_uniform(
            seed,
            SCORE_WEIGHT,
            &[num_labels as i64, spec.hidden_size],
            0.02 * 3f32.sqrt(),
            device,
            kind,
        );
        let score = add_variable(&vs, SCORE_WEIGHT, head);
        let mut vs = vs;
        vs.freeze();
        let tokenizer = Tokenizer::from_files(base.tokenizer.files.clone(), &config)?;
        let pad_token_id = config.pad_token_id();
        Ok(RewardModel {
            vs,
            model,
            score,
            tokenizer,
            config,
            labels,
            pad_token_id,
            source: base.source.clone(),
        })
    }

    /// Number of logits per row.
    pub fn num_labels(&self) -> usize {
        self.labels.len()
    }

    /// The labels (`id2label`), in id order.
    pub fn labels(&self) -> &[String] {
        &self.labels
    }

    /// The id of a label: its name in `id2label`, or its index written as a number.
    pub fn label_id(&self, label: &str) -> Option<usize> {
        self.labels
            .iter()
            .position(|l| l == label)
            .or_else(|| label.parse::<usize>().ok().filter(|i| *i < self.labels.len()))
    }

    /// The config's `pad_token_id`.
    pub fn pad_token_id(&self) -> Option<i64> {
        self.pad_token_id
    }

    /// The backbone's device.
    pub fn device(&self) -> Device {
        self.model.device()
    }

    /// The weights' dtype.
    pub fn kind(&self) -> Kind {
        self.model.kind()
    }

    /// The backbone's vocabulary size (embedding rows).
    pub fn vocab_size(&self) -> i64 {
        self.model.vocab_size()
    }

    /// Number of parameters, head included.
    pub fn num_parameters(&self) -> i64 {
        self.vs.variables().values().map(Tensor::numel).sum::<usize>() as i64
    }

    /// Ids of `text` as `tokenizer(text)` gives them (the tokenizer's own specials added).
    pub fn encode(&self, text: &str) -> Result<Vec<i64>> {
        self.tokenizer.encode_with_specials(text)
    }

    /// Ids of a prompt and its completion as one exchange: with a chat template, the user and
    /// assistant messages rendered without a generation prompt and tokenized as rendered (the
    /// template writes its own specials), as a conversational reward-model dataset is; without
    /// one, `tokenizer(prompt + completion)`.
    pub fn encode_exchange(&self, prompt: &str, completion: &str) -> Result<Vec<i64>> {
        if self.tokenizer.has_chat_template() {
            let messages = [
                ChatMessage::user(prompt),
                ChatMessage { role: "assistant".into(), content: completion.into() },
            ];
            self.tokenizer.encode(&self.tokenizer.render_chat(&messages, false)?)
        } else {
            self.encode(&format!("{prompt}{completion}"))
        }
    }

    /// Logits `[rows, num_labels]` (f32) of token-id rows, `batch_size` rows per forward pass,
    /// without grad. Rows are batched longest first (less padding) and answered in input order;
    /// each is scored as if alone (see the module docs). Refuses an empty row, an id outside the
    /// vocabulary and a zero batch size.
    pub fn score(&self, rows: &[Vec<i64>], batch_size: usize) -> Result<Vec<Vec<f32>>> {
        if batch_size == 0 {
            return Err(ModelError::InvalidInput("batch_size must be at least 1".into()));
        }
        let vocab = self.vocab_size();
        for (i, row) in rows.iter().enumerate() {
            if row.is_empty() {
                return Err(ModelError::InvalidInput(format!("row {i} has no tokens")));
            }
            if let Some(id) = row.iter().find(|id| !(0..vocab).contains(*id)) {
                return Err(ModelError::InvalidInput(format!(
                    "row {i}: token id {id} outside the vocabulary of {vocab}"
                )));
            }
        }
        let mut order: Vec<usize> = (0..rows.len()).collect();
        order.sort_by_key(|&i| std::cmp::Reverse(rows[i].len()));
        let mut out = vec![Vec::new(); rows.len()];
        for chunk in order.chunks(batch_size) {
            let batch: Vec<&[i64]> = chunk.iter().map(|&i| rows[i].as_slice()).collect();
            for (&i, logits) in chunk.iter().zip(self.score_batch(&batch)?) {
                out[i] = logits;
            }
        }
        Ok(out)
    }

    /// One forward pass over `rows` (none empty), right-padded, without grad.
    fn score_batch(&self, rows: &[&[i64]]) -> Result<Vec<Vec<f32>>> {
        let logits = tch::no_grad(|| self.logits(rows)).to_device(Device::Cpu);
        let n = self.num_labels();
        let flat = Vec::<f32>::try_from(logits.flatten(0, -1))
            .map_err(crate::error::torch_err("reading the reward model's logits"))?;
        Ok(flat.chunks(n).map(<[f32]>::to_vec).collect())
    }

    /// Logits `[rows, num_labels]` (f32, on the model's device) of `rows` in one forward pass,
    /// with grad: a reward-model trainer's pass. Every row must be non-empty with ids inside the
    /// vocabulary (as [`score`](Self::score) checks). There is one score per row, so there are no
    /// per-token logits to chunk; the backbone's graph is kept whole.
    pub fn training_logits(&self, rows: &[&[i64]]) -> Result<Tensor> {
        let vocab = self.vocab_size();
        for (i, row) in rows.iter().enumerate() {
            if row.is_empty() {
                return Err(ModelError::InvalidInput(format!("row {i} has no tokens")));
            }
            if let Some(id) = row.iter().find(|id| !(0..vocab).contains(*id)) {
                return Err(ModelError::InvalidInput(format!(
                    "row {i}: token id {id} outside the vocabulary of {vocab}"
                )));
            }
        }
        Ok(self.logits(rows))
    }

    /// The head at each row's scored position, `[rows, num_labels]` f32; grad as the caller's
    /// mode is.
    fn logits(&self, rows: &[&[i64]]) -> Tensor {
        let device = self.device();
        let b = rows.len() as i64;
        let width = rows.iter().map(|r| r.len()).max().unwrap_or(0);
        let fill = self.pad_token_id.filter(|id| (0..self.vocab_size()).contains(id)).unwrap_or(0);
        let mut ids = Vec::with_capacity(rows.len() * width);
        let mut mask = Vec::with_capacity(rows.len() * width);
        let mut at = Vec::with_capacity(rows.len());
        for row in rows {
            ids.extend_from_slice(row);
            ids.extend(std::iter::repeat_n(fill, width - row.len()));
            mask.extend(std::iter::repeat_n(1i64, row.len()));
            mask.extend(std::iter::repeat_n(0i64, width - row.len()));
            at.push(scored_position(row, self.pad_token_id) as i64);
        }
        let padded = rows.iter().any(|r| r.len() < width);
        let w = width as i64;
        let ids = Tensor::from_slice(&ids).view([b, w]).to_device(device);
        let mask = Tensor::from_slice(&mask).view([b, w]).to_device(device);
        let positions = positions_from_mask(&mask);
        let hidden = self.model.forward_with(&ids, &positions, &mask, Padding::from_bool(padded), None);
        let h = hidden.size()[2];
        let at = Tensor::from_slice(&at).to_device(device).view([b, 1, 1]).expand([b, 1, h], false);
        let last = hidden.gather(1, &at, false).squeeze_dim(1);
        last.linear(&self.score, None::<Tensor>).to_kind(Kind::Float)
    }

    /// Every weight (backbone and head) under its Hugging Face name, sorted: what a reward-model
    /// trainer's optimizer updates. Call [`VarStore::unfreeze`] on [`vs`](Self::vs) first.
    pub fn trainable(&self) -> Vec<(String, Tensor)> {
        let mut params: Vec<(String, Tensor)> = self.vs.variables().into_iter().collect();
        params.sort_by(|a, b| a.0.cmp(&b.0));
        params
    }

    /// Writes the checkpoint to `dir` as transformers writes one (`config.json`,
    /// `model.safetensors` with `model.*` and `score.weight`, the tokenizer's files); atomic like
    /// [`crate::save_pretrained`]. `dir` must not exist.
    pub fn save_pretrained(&self, dir: &Path) -> Result<()> {
        let mut tensors: Vec<(String, Tensor)> = self.vs.variables().into_iter().collect();
        tensors.sort_by(|a, b| a.0.cmp(&b.0));
        write_dir_atomically(dir, |tmp| {
            write_text(tmp, "config.json", &self.config.to_json())?;
            write_tokenizer(&self.tokenizer, tmp)?;
            write_weights(&tmp.join("model.safetensors"), &tensors)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scored_position_is_transformers_rightmost_non_pad() {
        let check = |ids: &[i64], pad: Option<i64>, expected: usize| {
            assert_eq!(scored_position(ids, pad), expected, "{ids:?} pad {pad:?}");
        };
        check(&[5, 6, 7], Some(0), 2);
        check(&[5, 0, 7], Some(0), 2); // a pad id inside the text changes nothing
        check(&[5, 6, 0, 0], Some(0), 1); // trailing pad ids are skipped, as transformers does
        check(&[0, 0], Some(0), 0); // transformers' argmax of all zeros
        check(&[5, 6, 0], None, 2); // no pad id: the last token
        check(&[7], Some(7), 0);
    }

    #[test]
    fn labels_from_the_config() {
        let check = |extra: Value, expected: std::result::Result<Vec<&str>, &str>| {
            let mut config = crate::builtin::config(0);
            for (k, v) in extra.as_object().unwrap() {
                config.extra.insert(k.clone(), v.clone());
            }
            let got = labels_of(&config, Path::new("config.json")).map_err(|e| e.to_string());
            let expected =
                expected.map(|v| v.into_iter().map(String::from).collect::<Vec<_>>()).map_err(String::from);
            assert_eq!(got, expected, "{extra}");
        };
        check(json!({}), Ok(vec!["LABEL_0", "LABEL_1"]));
        check(json!({"num_labels": 3}), Ok(vec!["LABEL_0", "LABEL_1", "LABEL_2"]));
        check(json!({"id2label": {"1": "good", "0": "bad"}}), Ok(vec!["bad", "good"]));
        check(json!({"id2label": {"0": "score"}, "num_labels": 1}), Ok(vec!["score"]));
        check(
            json!({"id2label": {"0": "a", "2": "b"}}),
            Err("config.json: field \"id2label\": id \"2\" is not one of 0..2"),
        );
        check(
            json!({"id2label": {"0": "a"}, "num_labels": 2}),
            Err("config.json: field \"num_labels\": 2, but id2label names 1 labels"),
        );
        check(json!({"id2label": {}}), Err("config.json: field \"id2label\": names no label"));
        check(
            json!({"num_labels": 0}),
            Err("config.json: field \"num_labels\": expected a positive integer, found 0"),
        );
    }
}
