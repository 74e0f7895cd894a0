//! Chat templates (Jinja, from `chat_template.jinja` or `tokenizer_config.json`) rendered with
//! minijinja the way transformers' `apply_chat_template` renders them.
//!
//! Transformers' conventions reproduced: `trim_blocks` and `lstrip_blocks`, loop controls,
//! `raise_exception(msg)`, a `tojson` that writes like Python's `json.dumps(ensure_ascii=False)`,
//! Python string methods (`.strip()`, `.startswith()`, ...) through minijinja-contrib, and the
//! variables `messages`, `add_generation_prompt`, `bos_token`, `eos_token`, `pad_token`,
//! `unk_token`. Deliberately absent: `strftime_now` — templates that ask for today's date fall
//! back to their fixed default, so a rendered prompt never depends on the day a job runs.

use std::io;
use std::path::{Path, PathBuf};

use minijinja::value::{Kwargs, Serde, Value};
use minijinja::{Environment, ErrorKind};
use serde::{Deserialize, Serialize};

use crate::error::{ModelError, Result};

/// One message of a conversation.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatMessage {
    pub role: String,
    pub content: String,
}

impl ChatMessage {
    /// A message with the `user` role.
    pub fn user(content: impl Into<String>) -> ChatMessage {
        ChatMessage { role: "user".into(), content: content.into() }
    }
}

/// The special-token strings a template may use.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SpecialTokens {
    pub bos: Option<String>,
    pub eos: Option<String>,
    pub pad: Option<String>,
    pub unk: Option<String>,
}

/// A compiled chat template.
pub struct ChatTemplate {
    env: Environment<'static>,
    source: String,
    file: PathBuf,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate").field("file", &self.file).finish_non_exhaustive()
    }
}

const NAME: &str = "chat_template";

impl ChatTemplate {
    /// Compiles `source`; `file` names where it came from in errors.
    pub fn new(source: String, file: &Path) -> Result<ChatTemplate> {
        let mut env = Environment::new();
        let syntax = minijinja::syntax::SyntaxConfig::builder()
            .trim_blocks(true)
            .lstrip_blocks(true)
            .build()
            .expect("the default delimiters are valid");
        env.set_syntax(syntax);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function(
            "raise_exception",
            |message: String| -> std::result::Result<Value, minijinja::Error> {
                Err(minijinja::Error::new(ErrorKind::InvalidOperation, message))
            },
        );
        env.add_filter("tojson", tojson);
        env.add_template_owned(NAME, source.clone())
            .map_err(|e| ModelError::Template { file: file.to_owned(), message: describe(&e) })?;
        Ok(ChatTemplate { env, source, file: file.to_owned() })
    }

    /// The template text.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Renders a conversation.
    pub fn render(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
        specials: &SpecialTokens,
    ) -> Result<String> {
        let template = self.env.get_template(NAME).expect("added in new");
        let ctx = minijinja::context! {
            messages => Value::from(Serde(messages)),
            add_generation_prompt => add_generation_prompt,
            bos_token => specials.bos.clone().unwrap_or_default(),
            eos_token => specials.eos.clone().unwrap_or_default(),
            pad_token => specials.pad.clone(),
            unk_token => specials.unk.clone(),
        };
        template
            .render(ctx)
            .map_err(|e| ModelError::Template { file: self.file.clone(), message: describe(&e) })
    }
}

fn describe(e: &minijinja::Error) -> String {
    let mut message = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        message.push_str(": ");
        message.push_str(&s.to_string());
        source = s.source();
    }
    message
}

/// Python's `json.dumps(value, ensure_ascii=False, indent=indent)`: ", " and ": " separators
/// without indent; "," and ": " with.
fn tojson(value: &Value, kwargs: Kwargs) -> std::result::Result<Value, minijinja::Error> {
    let indent: Option<usize> = kwargs.get("indent")?;
    kwargs.assert_all_used()?;
    let mut out = Vec::new();
    let result = match indent {
        Some(n) => {
            let spaces = " ".repeat(n);
            let fmt = serde_json::ser::PrettyFormatter::with_indent(spaces.as_bytes());
            serde::Serialize::serialize(value, &mut serde_json::Serializer::with_formatter(&mut out, fmt))
        }
        None => serde::Serialize::serialize(
            value,
            &mut serde_json::Serializer::with_formatter(&mut out, PyFormatter),
        ),
    };
    result.map_err(|e| minijinja::Error::new(ErrorKind::InvalidOperation, format!("tojson: {e}")))?;
    Ok(Value::from_safe_string(String::from_utf8(out).expect("serde_json writes UTF-8")))
}

struct PyFormatter;

impl serde_json::ser::Formatter for PyFormatter {
    fn begin_array_value<W: ?Sized + io::Write>(&mut self, w: &mut W, first: bool) -> io::Result<()> {
        if first { Ok(()) } else { w.write_all(b", ") }
    }
    fn begin_object_key<W: ?Sized + io::Write>(&mut self, w: &mut W, first: bool) -> io::Result<()> {
        if first { Ok(()) } else { w.write_all(b", ") }
    }
    fn begin_object_value<W: ?Sized + io::Write>(&mut self, w: &mut W) -> io::Result<()> {
        w.write_all(b": ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(template: &str, messages: &[ChatMessage], expected: &str) {
        let t = ChatTemplate::new(template.into(), Path::new("t.jinja")).unwrap();
        let specials =
            SpecialTokens { bos: Some("<s>".into()), eos: Some("</s>".into()), ..Default::default() };
        assert_eq!(t.render(messages, true, &specials).unwrap(), expected);
    }

    #[test]
    fn hf_conventions() {
        // trim_blocks / lstrip_blocks: the block lines leave no blank lines (expected value
        // from jinja2 with transformers' settings).
        check(
            "{{ bos_token }}\n{% for m in messages %}\n  {{ m.role }}: {{ m['content'].strip() }}\n{% endfor %}\n{% if add_generation_prompt %}A:{% endif %}",
            &[ChatMessage::user("  hi ")],
            "<s>\n  user: hi\nA:",
        );
        check(
            "{{ messages | tojson }}",
            &[ChatMessage::user("é\"")],
            r#"[{"role": "user", "content": "é\""}]"#,
        );
        check(
            "{% for m in messages %}{% if loop.first %}{% continue %}{% endif %}{{ m.content }}{% endfor %}",
            &[ChatMessage::user("a"), ChatMessage::user("b")],
            "b",
        );
        let t = ChatTemplate::new("{{ raise_exception('no system role') }}".into(), Path::new("t.jinja"))
            .unwrap();
        let err = t.render(&[], false, &SpecialTokens::default()).unwrap_err().to_string();
        assert!(err.contains("no system role") && err.contains("t.jinja"), "{err}");
    }
}
