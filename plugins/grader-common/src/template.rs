//! The template syntax of every grader with templates: `{{sample}}` and `{{item.PATH}}`.
//!
//! A template is text with placeholders in double braces, read once when the options are checked
//! ([`Template::parse`]) and filled per item ([`Template::render`]):
//! - `{{sample}}` (or OpenAI's spelling `{{sample.output_text}}`) is the completion being graded;
//! - `{{item.PATH}}` is the value at a dotted path in the item, `{"id": ..., "prompt": ...,
//!   "reference": {...}}` (design.md §1 batch format): `{{item.reference.answer}}`,
//!   `{{item.prompt}}`; a segment that is a number also indexes an array
//!   (`{{item.reference.choices.0}}`).
//!
//! Whitespace inside the braces is allowed (`{{ item.prompt }}`). A string is inserted as it is,
//! a number or a boolean as its JSON text, an object or an array as compact JSON (an object's
//! keys in the order serde_json keeps them: sorted, or as written when a crate in the build turns
//! on its `preserve_order`). A path that is
//! not in the item, or whose value is `null`, is a [`RenderError`] naming the path: a grader turns
//! it into an error verdict rather than comparing against a silent `""` or `"null"`.
//!
//! Everything outside placeholders is literal text, including a lone `{`, `}` or `}}`; there is
//! no escape for a literal `{{`, as in OpenAI's graders.

use std::fmt;
use std::str::FromStr;

use serde_json::Value;

/// A parsed template: literal text and placeholders, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Template {
    source: String,
    parts: Vec<Part>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Part {
    Text(String),
    Sample,
    /// The segments after `item.`, never empty, none of them empty.
    Item(Vec<String>),
}

/// Why a template's text is not a template; `at` is the byte offset of the placeholder's `{{`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TemplateError {
    /// A `{{` with no `}}` after it.
    #[error("unclosed `{{{{` at byte {at}; expected `}}}}` after it")]
    Unclosed {
        /// Byte offset of the `{{`.
        at: usize,
    },
    /// `{{}}` or `{{  }}`.
    #[error("empty placeholder at byte {at}; expected {{{{sample}}}} or {{{{item.PATH}}}}")]
    Empty {
        /// Byte offset of the `{{`.
        at: usize,
    },
    /// A placeholder that starts with neither `sample` nor `item`.
    #[error("unknown placeholder `{expression}` at byte {at}; expected {{{{sample}}}} or {{{{item.PATH}}}}")]
    UnknownRoot {
        /// The placeholder's text, trimmed.
        expression: String,
        /// Byte offset of the `{{`.
        at: usize,
    },
    /// `{{sample.X}}` for an X other than `output_text`.
    #[error(
        "unknown placeholder `{expression}` at byte {at}; the sample is text: expected {{{{sample}}}} or {{{{sample.output_text}}}}"
    )]
    UnknownSampleField {
        /// The placeholder's text, trimmed.
        expression: String,
        /// Byte offset of the `{{`.
        at: usize,
    },
    /// `{{item}}` or `{{item.}}`: the whole item is not a value a grader compares.
    #[error(
        "placeholder `{expression}` at byte {at} names no path; expected item.PATH, e.g. item.reference.answer"
    )]
    EmptyPath {
        /// The placeholder's text, trimmed.
        expression: String,
        /// Byte offset of the `{{`.
        at: usize,
    },
    /// A path with an empty segment (`item..x`, `item.x.`) or a character a path cannot hold
    /// (whitespace, `{`, `}`).
    #[error("bad path `{expression}` at byte {at}: {problem}")]
    BadPath {
        /// The placeholder's text, trimmed.
        expression: String,
        /// Byte offset of the `{{`.
        at: usize,
        /// What is wrong with it.
        problem: &'static str,
    },
}

/// Why a template could not be filled for one item.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RenderError {
    /// The path is not in the item.
    #[error("{path}: not found in the item ({detail})")]
    Missing {
        /// The path as the template writes it, e.g. `item.reference.answer`.
        path: String,
        /// Where the lookup stopped, e.g. `item.reference has no key "answer"`.
        detail: String,
    },
    /// The path holds `null`.
    #[error("{path}: is null in the item")]
    Null {
        /// The path as the template writes it.
        path: String,
    },
}

impl Template {
    /// Reads a template's text; any problem names the placeholder and its byte offset.
    pub fn parse(text: &str) -> Result<Template, TemplateError> {
        let mut parts = Vec::new();
        let mut literal = String::new();
        let mut rest = text;
        let mut offset = 0;
        while let Some(open) = rest.find("{{") {
            literal.push_str(&rest[..open]);
            let at = offset + open;
            let after_open = &rest[open + 2..];
            let Some(close) = after_open.find("}}") else {
                return Err(TemplateError::Unclosed { at });
            };
            let part = placeholder(&after_open[..close], at)?;
            if !literal.is_empty() {
                parts.push(Part::Text(std::mem::take(&mut literal)));
            }
            parts.push(part);
            let consumed = open + 2 + close + 2;
            rest = &rest[consumed..];
            offset += consumed;
        }
        literal.push_str(rest);
        if !literal.is_empty() {
            parts.push(Part::Text(literal));
        }
        Ok(Template { source: text.to_owned(), parts })
    }

    /// Fills the template for one item: `sample` is the completion, `item` the item's JSON
    /// (`{"id": ..., "prompt": ..., "reference": {...}}`, see [`crate::item_json`]).
    pub fn render(&self, sample: &str, item: &Value) -> Result<String, RenderError> {
        let mut out = String::new();
        for part in &self.parts {
            match part {
                Part::Text(text) => out.push_str(text),
                Part::Sample => out.push_str(sample),
                Part::Item(path) => match lookup(item, path)? {
                    Value::String(text) => out.push_str(text),
                    Value::Null => return Err(RenderError::Null { path: written(path) }),
                    // Numbers, booleans, objects and arrays: compact JSON. Writing a Value to a
                    // String cannot fail.
                    other => out.push_str(&other.to_string()),
                },
            }
        }
        Ok(out)
    }

    /// The template's text as written.
    pub fn as_str(&self) -> &str {
        &self.source
    }

    /// Whether the template reads the completion.
    pub fn uses_sample(&self) -> bool {
        self.parts.iter().any(|part| matches!(part, Part::Sample))
    }

    /// The item paths the template reads, as written (`item.reference.answer`), in order.
    pub fn item_paths(&self) -> Vec<String> {
        self.parts
            .iter()
            .filter_map(|part| match part {
                Part::Item(path) => Some(written(path)),
                _ => None,
            })
            .collect()
    }
}

/// Reads one placeholder's inner text (between `{{` and `}}`); `at` is its `{{`'s offset.
fn placeholder(inner: &str, at: usize) -> Result<Part, TemplateError> {
    let expression = inner.trim();
    if expression.is_empty() {
        return Err(TemplateError::Empty { at });
    }
    let owned = || expression.to_owned();
    if expression.contains(['{', '}']) {
        return Err(TemplateError::BadPath {
            expression: owned(),
            at,
            problem: "a placeholder holds no braces",
        });
    }
    if expression.chars().any(char::is_whitespace) {
        return Err(TemplateError::BadPath {
            expression: owned(),
            at,
            problem: "whitespace inside a path; only around it",
        });
    }
    let (root, path) = match expression.split_once('.') {
        Some((root, path)) => (root, Some(path)),
        None => (expression, None),
    };
    match (root, path) {
        ("sample", None) | ("sample", Some("output_text")) => Ok(Part::Sample),
        ("sample", Some(_)) => Err(TemplateError::UnknownSampleField { expression: owned(), at }),
        ("item", None) | ("item", Some("")) => Err(TemplateError::EmptyPath { expression: owned(), at }),
        ("item", Some(path)) => {
            let segments: Vec<String> = path.split('.').map(str::to_owned).collect();
            if segments.iter().any(String::is_empty) {
                return Err(TemplateError::BadPath {
                    expression: owned(),
                    at,
                    problem: "an empty segment between dots",
                });
            }
            Ok(Part::Item(segments))
        }
        _ => Err(TemplateError::UnknownRoot { expression: owned(), at }),
    }
}

/// The value at `path` under `item`, or which segment was not there.
fn lookup<'a>(item: &'a Value, path: &[String]) -> Result<&'a Value, RenderError> {
    let mut value = item;
    for (depth, segment) in path.iter().enumerate() {
        let parent = || {
            let mut name = String::from("item");
            for segment in &path[..depth] {
                name.push('.');
                name.push_str(segment);
            }
            name
        };
        let next = match value {
            Value::Object(map) => map.get(segment.as_str()),
            Value::Array(list) => segment.parse::<usize>().ok().and_then(|index| list.get(index)),
            _ => None,
        };
        value = next.ok_or_else(|| RenderError::Missing {
            path: written(path),
            detail: match value {
                Value::Object(_) => format!("{} has no key {segment:?}", parent()),
                Value::Array(list) => {
                    format!(
                        "{} is an array of {} and {segment:?} is not an index in it",
                        parent(),
                        list.len()
                    )
                }
                other => format!("{} is {}, not an object", parent(), kind(other)),
            },
        })?;
    }
    Ok(value)
}

fn kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// `item.` and the segments joined by dots: the path as the template wrote it.
fn written(path: &[String]) -> String {
    format!("item.{}", path.join("."))
}

impl fmt::Display for Template {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.source)
    }
}

impl FromStr for Template {
    type Err = TemplateError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        Template::parse(text)
    }
}

/// A template in a plugin's options: a string, parsed when the options are read, so a bad
/// template is refused at submit with its key (`input: unclosed `{{` at byte 0; …`).
impl<'de> serde::Deserialize<'de> for Template {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        Template::parse(&text).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn item() -> Value {
        json!({
            "id": "q1",
            "prompt": "What is 2+2?",
            "reference": {
                "answer": "4",
                "n": 4,
                "ratio": 0.5,
                "ok": true,
                "nothing": null,
                "choices": ["three", "four"],
                "nested": {"a": [1, {"b": "deep"}]},
                "obj": {"x": 1, "y": [true, null]},
                "0": "zero key",
                "ünï": "código ✓"
            }
        })
    }

    /// Parses `template` and renders it for `sample` and [`item`]; `expected` is the text or the
    /// error's message.
    fn check(template: &str, sample: &str, expected: Result<&str, &str>) {
        let got = Template::parse(template)
            .map_err(|error| error.to_string())
            .and_then(|parsed| parsed.render(sample, &item()).map_err(|error| error.to_string()));
        assert_eq!(got.as_deref().map_err(String::as_str), expected, "template {template:?}");
    }

    #[test]
    fn placeholders_render_the_sample_and_item_paths() {
        let cases: &[(&str, &str, Result<&str, &str>)] = &[
            ("{{sample}}", "The answer is 4.", Ok("The answer is 4.")),
            ("{{sample.output_text}}", "x", Ok("x")),
            ("{{ sample }}", "x", Ok("x")),
            ("{{\tsample.output_text\n}}", "x", Ok("x")),
            ("{{item.reference.answer}}", "", Ok("4")),
            ("{{ item.reference.answer }}", "", Ok("4")),
            ("{{item.prompt}}", "", Ok("What is 2+2?")),
            ("{{item.id}}", "", Ok("q1")),
            (
                "Q: {{item.prompt}}\nA: {{sample}}\nGold: {{item.reference.answer}}.",
                "4",
                Ok("Q: What is 2+2?\nA: 4\nGold: 4."),
            ),
            ("{{sample}}{{sample}}", "ab", Ok("abab")),
            ("", "x", Ok("")),
            ("no placeholders", "x", Ok("no placeholders")),
            // Scalars as JSON, containers as compact JSON.
            ("{{item.reference.n}}", "", Ok("4")),
            ("{{item.reference.ratio}}", "", Ok("0.5")),
            ("{{item.reference.ok}}", "", Ok("true")),
            ("{{item.reference.choices}}", "", Ok(r#"["three","four"]"#)),
            ("{{item.reference.obj}}", "", Ok(r#"{"x":1,"y":[true,null]}"#)),
            // One key per object: the order of an object's keys depends on whether serde_json's
            // `preserve_order` is on in the build, so nothing should depend on it.
            ("{{item.reference.nested}}", "", Ok(r#"{"a":[1,{"b":"deep"}]}"#)),
            // Array indexes and object keys that look like numbers.
            ("{{item.reference.choices.1}}", "", Ok("four")),
            ("{{item.reference.nested.a.1.b}}", "", Ok("deep")),
            ("{{item.reference.0}}", "", Ok("zero key")),
            ("{{item.reference.ünï}}", "", Ok("código ✓")),
            // The sample is inserted as is, braces included: it is never read as a template.
            ("[{{sample}}]", "{{item.id}}", Ok("[{{item.id}}]")),
            // Lone braces and a stray closing pair are literal text.
            ("{ {sample} }} }", "x", Ok("{ {sample} }} }")),
            ("{x}{{sample}}}", "y", Ok("{x}y}")),
        ];
        for (template, sample, expected) in cases {
            check(template, sample, *expected);
        }
    }

    #[test]
    fn a_missing_or_null_path_is_an_error_naming_it() {
        let cases: &[(&str, &str)] = &[
            (
                "{{item.reference.gold}}",
                r#"item.reference.gold: not found in the item (item.reference has no key "gold")"#,
            ),
            (
                "{{item.completion}}",
                r#"item.completion: not found in the item (item has no key "completion")"#,
            ),
            (
                "{{item.reference.answer.text}}",
                "item.reference.answer.text: not found in the item (item.reference.answer is a string, not an object)",
            ),
            (
                "{{item.reference.choices.2}}",
                r#"item.reference.choices.2: not found in the item (item.reference.choices is an array of 2 and "2" is not an index in it)"#,
            ),
            (
                "{{item.reference.choices.first}}",
                r#"item.reference.choices.first: not found in the item (item.reference.choices is an array of 2 and "first" is not an index in it)"#,
            ),
            (
                "{{item.reference.choices.-1}}",
                r#"item.reference.choices.-1: not found in the item (item.reference.choices is an array of 2 and "-1" is not an index in it)"#,
            ),
            (
                "{{item.reference.n.x}}",
                "item.reference.n.x: not found in the item (item.reference.n is a number, not an object)",
            ),
            ("{{item.reference.nothing}}", "item.reference.nothing: is null in the item"),
            (
                "{{item.reference.nothing.x}}",
                "item.reference.nothing.x: not found in the item (item.reference.nothing is null, not an object)",
            ),
            ("ok {{sample}} then {{ item.x }}", r#"item.x: not found in the item (item has no key "x")"#),
        ];
        for (template, expected) in cases {
            check(template, "s", Err(expected));
        }
    }

    #[test]
    fn bad_templates_are_refused_with_the_placeholder_and_offset() {
        let cases: &[(&str, &str)] = &[
            ("{{sample", "unclosed `{{` at byte 0; expected `}}` after it"),
            ("abc {{item.prompt}} {{", "unclosed `{{` at byte 20; expected `}}` after it"),
            ("{{sample}", "unclosed `{{` at byte 0; expected `}}` after it"),
            ("{{}}", "empty placeholder at byte 0; expected {{sample}} or {{item.PATH}}"),
            ("x{{   }}", "empty placeholder at byte 1; expected {{sample}} or {{item.PATH}}"),
            (
                "{{completion}}",
                "unknown placeholder `completion` at byte 0; expected {{sample}} or {{item.PATH}}",
            ),
            (
                "{{reference.answer}}",
                "unknown placeholder `reference.answer` at byte 0; expected {{sample}} or {{item.PATH}}",
            ),
            ("{{Sample}}", "unknown placeholder `Sample` at byte 0; expected {{sample}} or {{item.PATH}}"),
            ("{{samples}}", "unknown placeholder `samples` at byte 0; expected {{sample}} or {{item.PATH}}"),
            (
                "{{sample.output_json}}",
                "unknown placeholder `sample.output_json` at byte 0; the sample is text: expected {{sample}} or {{sample.output_text}}",
            ),
            (
                "{{sample.}}",
                "unknown placeholder `sample.` at byte 0; the sample is text: expected {{sample}} or {{sample.output_text}}",
            ),
            (
                "{{item}}",
                "placeholder `item` at byte 0 names no path; expected item.PATH, e.g. item.reference.answer",
            ),
            (
                "{{ item. }}",
                "placeholder `item.` at byte 0 names no path; expected item.PATH, e.g. item.reference.answer",
            ),
            ("{{item..answer}}", "bad path `item..answer` at byte 0: an empty segment between dots"),
            ("{{item.reference.}}", "bad path `item.reference.` at byte 0: an empty segment between dots"),
            (
                "{{item. reference}}",
                "bad path `item. reference` at byte 0: whitespace inside a path; only around it",
            ),
            (
                "{{item.reference answer}}",
                "bad path `item.reference answer` at byte 0: whitespace inside a path; only around it",
            ),
            ("{{{sample}}}", "bad path `{sample` at byte 0: a placeholder holds no braces"),
            ("{{ {{sample}} }}", "bad path `{{sample` at byte 0: a placeholder holds no braces"),
            ("é{{x}}", "unknown placeholder `x` at byte 2; expected {{sample}} or {{item.PATH}}"),
        ];
        for (template, expected) in cases {
            check(template, "s", Err(expected));
        }
    }

    #[test]
    fn a_template_reports_what_it_reads() {
        let template =
            Template::parse("{{sample}} vs {{ item.reference.answer }} / {{item.prompt}}").unwrap();
        assert!(template.uses_sample());
        assert_eq!(template.item_paths(), ["item.reference.answer", "item.prompt"]);
        assert_eq!(template.to_string(), "{{sample}} vs {{ item.reference.answer }} / {{item.prompt}}");
        let plain: Template = "text".parse().unwrap();
        assert!(!plain.uses_sample());
        assert!(plain.item_paths().is_empty());
    }

    #[test]
    fn a_template_in_options_is_parsed_when_they_are_read() {
        #[derive(Debug, serde::Deserialize)]
        #[allow(dead_code)]
        struct Options {
            input: Template,
        }
        let ok: Options = serde_json::from_str(r#"{"input": "{{ sample }}"}"#).unwrap();
        assert_eq!(ok.input.render("x", &item()).unwrap(), "x");
        let error = serde_json::from_str::<Options>(r#"{"input": "{{item}}"}"#).unwrap_err().to_string();
        assert!(error.starts_with("placeholder `item` at byte 0 names no path"), "{error}");
        let error = serde_json::from_str::<Options>(r#"{"input": 3}"#).unwrap_err().to_string();
        assert!(error.starts_with("invalid type: integer `3`, expected a string"), "{error}");
    }

    /// Odd inputs, each parsed and (when it parses) rendered against odd items: no panic, and a
    /// template that parses keeps its text. The inputs are built from the syntax's own pieces so
    /// every branch of the reader sees prefixes, overlaps and multi-byte characters: every string
    /// of up to 3 pieces, then 20,000 longer ones from a fixed pseudo-random sequence.
    #[test]
    fn no_input_panics() {
        let pieces = [
            "{",
            "}",
            "{{",
            "}}",
            "{{{",
            "}}}",
            "sample",
            "item",
            ".",
            "..",
            " ",
            "\n",
            "é",
            "✓",
            "0",
            "reference",
            "answer",
            "\u{0}",
            "😀",
            "output_text",
        ];
        let items =
            [item(), json!(null), json!("text"), json!([1, 2]), json!({"reference": null}), json!({})];
        let try_one = |text: &str| {
            if let Ok(template) = Template::parse(text) {
                assert_eq!(template.as_str(), text);
                for item in &items {
                    let _ = template.render("{{sample}} é", item);
                }
            }
        };
        let n = pieces.len();
        for length in 0..=3u32 {
            for mut code in 0..n.pow(length) {
                let mut text = String::new();
                for _ in 0..length {
                    text.push_str(pieces[code % n]);
                    code /= n;
                }
                try_one(&text);
            }
        }
        // A linear congruential sequence: the same inputs on every run, so a failure reproduces.
        let mut state: u64 = 0x2545_f491_4f6c_dd1d;
        let mut next = || {
            state = state.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
            (state >> 33) as usize
        };
        for _ in 0..20_000 {
            let length = 4 + next() % 12;
            let text: String = (0..length).map(|_| pieces[next() % n]).collect();
            try_one(&text);
        }
    }
}
