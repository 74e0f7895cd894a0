//! The tokenizer of a model: `tokenizer.json` (the `tokenizers` crate), its special tokens and
//! EOS ids, and its chat template.

use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::chat::{ChatMessage, ChatTemplate, SpecialTokens};
use crate::config::{LlamaConfig, ids_of};
use crate::error::{ModelError, Result, io_err};

/// A model's tokenizer with its special tokens and chat template.
///
/// The files it was read from are kept as text and written back verbatim by
/// `save_pretrained`, so a checkpoint's tokenizer is byte-identical to its source's.
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    specials: SpecialTokens,
    template: Option<ChatTemplate>,
    eos_ids: Vec<i64>,
    pad_id: i64,
    bos_id: Option<i64>,
    pub(crate) files: TokenizerFiles,
}

/// The text of the tokenizer's files, written back on save.
#[derive(Clone, Debug, Default)]
pub(crate) struct TokenizerFiles {
    pub tokenizer_json: String,
    pub tokenizer_config: Option<String>,
    pub generation_config: Option<String>,
    /// `chat_template.jinja`, when the template came from that file.
    pub chat_template_jinja: Option<String>,
    /// Where they were read from, for error messages.
    pub dir: PathBuf,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("dir", &self.files.dir)
            .field("vocab", &self.vocab_size())
            .field("eos_ids", &self.eos_ids)
            .field("pad_id", &self.pad_id)
            .field("template", &self.template.is_some())
            .finish()
    }
}

fn read_optional(path: &Path) -> Result<Option<String>> {
    match std::fs::read_to_string(path) {
        Ok(text) => Ok(Some(text)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(io_err(path)(e)),
    }
}

/// A special token in tokenizer_config.json: a string, or an AddedToken object with "content".
fn token_string(value: Option<&Value>) -> Option<String> {
    match value? {
        Value::String(s) => Some(s.clone()),
        Value::Object(o) => o.get("content").and_then(Value::as_str).map(str::to_owned),
        _ => None,
    }
}

impl Tokenizer {
    /// Reads `tokenizer.json` (required), `tokenizer_config.json`, `chat_template.jinja` and
    /// `generation_config.json` (optional) from a model directory.
    pub fn from_dir(dir: &Path, config: &LlamaConfig) -> Result<Tokenizer> {
        let path = dir.join("tokenizer.json");
        let tokenizer_json = match std::fs::read_to_string(&path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(ModelError::MissingFile { path });
            }
            Err(e) => return Err(io_err(&path)(e)),
        };
        let files = TokenizerFiles {
            tokenizer_json,
            tokenizer_config: read_optional(&dir.join("tokenizer_config.json"))?,
            generation_config: read_optional(&dir.join("generation_config.json"))?,
            chat_template_jinja: read_optional(&dir.join("chat_template.jinja"))?,
            dir: dir.to_owned(),
        };
        Self::from_files(files, config)
    }

    pub(crate) fn from_files(files: TokenizerFiles, config: &LlamaConfig) -> Result<Tokenizer> {
        let dir = files.dir.clone();
        let tok_path = dir.join("tokenizer.json");
        let inner = tokenizers::Tokenizer::from_bytes(files.tokenizer_json.as_bytes())
            .map_err(|e| ModelError::Tokenizer { file: tok_path.clone(), message: e.to_string() })?;
        let parse = |text: &Option<String>, name: &str| -> Result<Option<Value>> {
            text.as_deref()
                .map(|t| {
                    serde_json::from_str(t)
                        .map_err(|source| ModelError::Json { file: dir.join(name), source })
                })
                .transpose()
        };
        let tok_config = parse(&files.tokenizer_config, "tokenizer_config.json")?;
        let gen_config = parse(&files.generation_config, "generation_config.json")?;
        let field = |k: &str| tok_config.as_ref().and_then(|c| token_string(c.get(k)));
        let specials = SpecialTokens {
            bos: field("bos_token"),
            eos: field("eos_token"),
            pad: field("pad_token"),
            unk: field("unk_token"),
        };
        let id_of =
            |token: &Option<String>| token.as_deref().and_then(|t| inner.token_to_id(t)).map(i64::from);

        let template =
            match (&files.chat_template_jinja, tok_config.as_ref().and_then(|c| c.get("chat_template"))) {
                (Some(source), _) => {
                    Some(ChatTemplate::new(source.clone(), &dir.join("chat_template.jinja"))?)
                }
                (None, Some(Value::String(source))) => {
                    Some(ChatTemplate::new(source.clone(), &dir.join("tokenizer_config.json"))?)
                }
                (None, Some(Value::Array(named))) => {
                    // [{"name": "default", "template": "..."}, {"name": "tool_use", ...}]
                    let default = named
                        .iter()
                        .find(|t| t.get("name").and_then(Value::as_str) == Some("default"))
                        .and_then(|t| t.get("template"))
                        .and_then(Value::as_str);
                    match default {
                        Some(source) => {
                            Some(ChatTemplate::new(source.into(), &dir.join("tokenizer_config.json"))?)
                        }
                        None => {
                            return Err(ModelError::InvalidField {
                                file: dir.join("tokenizer_config.json"),
                                field: "chat_template".into(),
                                message: "a list of templates without one named \"default\"".into(),
                            });
                        }
                    }
                }
                _ => None,
            };

        // EOS: the union of what generation_config, config and tokenizer_config name.
        let mut eos_ids = ids_of(gen_config.as_ref().and_then(|g| g.get("eos_token_id")));
        eos_ids.extend(config.eos_token_ids());
        eos_ids.extend(id_of(&specials.eos));
        let vocab = inner.get_vocab_size(true) as i64;
        eos_ids.retain(|&id| (0..vocab.max(config.vocab_size)).contains(&id));
        eos_ids.sort_unstable();
        eos_ids.dedup();
        let pad_id = id_of(&specials.pad)
            .or_else(|| config.pad_token_id())
            .or_else(|| ids_of(gen_config.as_ref().and_then(|g| g.get("pad_token_id"))).first().copied())
            .or_else(|| eos_ids.first().copied())
            .unwrap_or(0);
        let bos_id = id_of(&specials.bos).or_else(|| ids_of(config.bos_token_id.as_ref()).first().copied());
        Ok(Tokenizer { inner, specials, template, eos_ids, pad_id, bos_id, files })
    }

    fn error(&self, message: impl ToString) -> ModelError {
        ModelError::Tokenizer { file: self.files.dir.join("tokenizer.json"), message: message.to_string() }
    }

    /// Token ids of `text`, without the specials a post-processor would add (as
    /// `apply_chat_template` tokenizes: the template writes its own BOS). Special-token text in
    /// `text` (e.g. `<|im_end|>`) becomes the special token.
    pub fn encode(&self, text: &str) -> Result<Vec<i64>> {
        let enc = self.inner.encode(text, false).map_err(|e| self.error(e))?;
        Ok(enc.get_ids().iter().map(|&id| i64::from(id)).collect())
    }

    /// The ids of a prompt for one user message: the chat template with the generation prompt
    /// when the model has one; otherwise the raw text with the tokenizer's own specials (a BOS
    /// where its post-processor adds one, as `tokenizer(text)` would).
    pub fn encode_prompt(&self, user_text: &str) -> Result<Vec<i64>> {
        if self.template.is_some() {
            self.encode(&self.render_prompt(user_text)?)
        } else {
            self.encode_with_specials(user_text)
        }
    }

    /// Token ids of `text` with the specials the tokenizer's post-processor adds (a BOS for
    /// Llama's), as `tokenizer(text)` gives them in transformers.
    pub fn encode_with_specials(&self, text: &str) -> Result<Vec<i64>> {
        let enc = self.inner.encode(text, true).map_err(|e| self.error(e))?;
        Ok(enc.get_ids().iter().map(|&id| i64::from(id)).collect())
    }

    /// Text of `ids`, special tokens left out. Ids the vocabulary does not have are skipped.
    pub fn decode(&self, ids: &[i64]) -> String {
        let ids: Vec<u32> = ids.iter().filter_map(|&id| u32::try_from(id).ok()).collect();
        // decode fails only on ids it cannot map, which the filter above and the model's
        // vocabulary rule out; an empty string is the honest answer if it ever does.
        self.inner.decode(&ids, true).unwrap_or_default()
    }

    /// Text of `ids` with their special tokens (`<|im_end|>` as written): what a chat template's
    /// rendering of those tokens reads.
    pub fn decode_with_specials(&self, ids: &[i64]) -> String {
        let ids: Vec<u32> = ids.iter().filter_map(|&id| u32::try_from(id).ok()).collect();
        self.inner.decode(&ids, false).unwrap_or_default()
    }

    /// The prompt text for one user message: the chat template with `add_generation_prompt`
    /// when the model has a template, the raw text otherwise.
    pub fn render_prompt(&self, user_text: &str) -> Result<String> {
        match &self.template {
            Some(_) => self.render_chat(&[ChatMessage::user(user_text)], true),
            None => Ok(user_text.to_owned()),
        }
    }

    /// A whole conversation through the chat template (error if the model has none).
    pub fn render_chat(&self, messages: &[ChatMessage], add_generation_prompt: bool) -> Result<String> {
        match &self.template {
            Some(t) => t.render(messages, add_generation_prompt, &self.specials),
            None => Err(ModelError::Template {
                file: self.files.dir.clone(),
                message: "the model has no chat template".into(),
            }),
        }
    }

    /// Whether the model ships a chat template.
    pub fn has_chat_template(&self) -> bool {
        self.template.is_some()
    }

    /// The chat template's text, if any.
    pub fn chat_template(&self) -> Option<&str> {
        self.template.as_ref().map(ChatTemplate::source)
    }

    /// Ids that end a completion (union of generation_config, config and tokenizer_config).
    pub fn eos_ids(&self) -> &[i64] {
        &self.eos_ids
    }

    /// Whether `id` ends a completion.
    pub fn is_eos(&self, id: i64) -> bool {
        self.eos_ids.contains(&id)
    }

    /// The id used for padding: tokenizer_config's pad_token, config's pad_token_id, or the first EOS.
    pub fn pad_id(&self) -> i64 {
        self.pad_id
    }

    /// The BOS id, if the model names one.
    pub fn bos_id(&self) -> Option<i64> {
        self.bos_id
    }

    /// The special-token strings.
    pub fn special_tokens(&self) -> &SpecialTokens {
        &self.specials
    }

    /// Vocabulary size, added tokens included.
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    /// The underlying `tokenizers` tokenizer.
    pub fn inner(&self) -> &tokenizers::Tokenizer {
        &self.inner
    }
}
