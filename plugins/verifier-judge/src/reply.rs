//! Reading the judge's answer, strictly: the chat-completions envelope ([`parse_completion`]),
//! then the message content against the rubric ([`parse_reply`]).
//!
//! The content must be exactly one JSON object — `{"score": <number in [min, max]>}` or
//! `{"label": "<one of the labels>"}`, optionally with a `"reason"` string — with whitespace
//! around it, optionally inside one ```` ```json ```` (or bare ```` ``` ````) fence. Anything
//! else is refused with what was wrong: prose, two objects, a duplicated key, an unknown key, a
//! number out of range or not a number, an unknown label. Never a guess, never a silent 0: a
//! judge that rambles gives error verdicts its owners see, not a reward the policy learns from.

use std::fmt;

use rlvr_verifier_http_common::attempt::snippet;
use serde::Deserialize;
use serde::de::{Deserializer, MapAccess, Visitor};
use serde_json::Value;

use crate::rubric::{Choice, Rubric};

/// What a chat completion carried that the plugin uses.
#[derive(Debug, Clone, PartialEq)]
pub struct Completion {
    /// The first (only) choice's message content.
    pub content: String,
    /// The model the endpoint says answered, when it says.
    pub model: Option<String>,
    /// `usage.prompt_tokens` and `usage.completion_tokens`, when reported.
    pub usage: Option<(f64, f64)>,
}

/// Reads a 2xx body of `/v1/chat/completions`. The error says what was wrong, in words that go
/// into the verdict's error.
pub fn parse_completion(body: &[u8]) -> Result<Completion, String> {
    let value: Value = serde_json::from_slice(body).map_err(|error| {
        format!(
            "the judge's response is not a chat completion (invalid JSON: {error}): \"{}\"",
            snippet(body)
        )
    })?;
    let Value::Object(object) = &value else {
        let got = snippet(value.to_string().as_bytes());
        return Err(format!(
            "the judge's response is not a chat completion: expected a JSON object, got {got}"
        ));
    };
    if let (Some(error), None) = (object.get("error"), object.get("choices")) {
        let message = error
            .get("message")
            .and_then(Value::as_str)
            .map_or_else(|| snippet(error.to_string().as_bytes()), str::to_owned);
        return Err(format!("the judge endpoint answered an error: {message:.200}"));
    }
    let choices = match object.get("choices") {
        Some(Value::Array(choices)) => choices,
        _ => return Err("the judge's response is not a chat completion: no \"choices\" array".to_owned()),
    };
    let [choice] = choices.as_slice() else {
        return Err(format!("the judge's response has {} choices, expected exactly 1", choices.len()));
    };
    let message = choice.get("message");
    let content = match message.and_then(|message| message.get("content")) {
        Some(Value::String(content)) => content.clone(),
        _ => {
            let refusal = message.and_then(|message| message.get("refusal")).and_then(Value::as_str);
            return Err(match refusal {
                Some(refusal) => format!("the judge refused to answer: {refusal:.200}"),
                None => "the judge's response has no message content (choices[0].message.content)".to_owned(),
            });
        }
    };
    if choice.get("finish_reason").and_then(Value::as_str) == Some("length") {
        return Err(format!(
            "the judge's reply was cut off at max_tokens (finish_reason \"length\"): \"{}\"",
            snippet(content.as_bytes())
        ));
    }
    let model = object.get("model").and_then(Value::as_str).map(str::to_owned);
    let usage = object.get("usage").and_then(|usage| {
        let count = |key: &str| usage.get(key).and_then(Value::as_f64);
        Some((count("prompt_tokens")?, count("completion_tokens")?))
    });
    Ok(Completion { content, model, usage })
}

/// A checked reply.
#[derive(Debug, Clone, PartialEq)]
pub struct Reply {
    /// The score or label.
    pub choice: Choice,
    /// The judge's reason, when it gave one.
    pub reason: Option<String>,
}

/// Why a reply's content was refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ReplyError {
    /// Nothing but whitespace.
    #[error("empty reply, expected one JSON object")]
    Empty,
    /// A ```` ``` ```` fence that is not one whole fenced block.
    #[error("expected one ```json fenced block and nothing around it")]
    Fence,
    /// Not JSON at all: prose, or prose around JSON.
    #[error("expected one JSON object, got text that is not JSON ({0})")]
    NotJson(String),
    /// JSON, but not an object.
    #[error("expected one JSON object, got {0}")]
    NotObject(&'static str),
    /// An object, then more.
    #[error("expected exactly one JSON object, got text after it")]
    Trailing,
    /// A second object after the first.
    #[error("expected exactly one JSON object, got more than one")]
    TwoObjects,
    /// The same key twice: which one would count is a guess.
    #[error("the key \"{0}\" appears twice")]
    Duplicate(String),
    /// A key other than the rubric's and `reason`.
    #[error("unknown key \"{key}\", expected only \"{expected}\" and \"reason\"")]
    UnknownKey {
        /// The key.
        key: String,
        /// The rubric's key.
        expected: &'static str,
    },
    /// The rubric's key is missing.
    #[error("missing \"{0}\"")]
    Missing(&'static str),
    /// A value of the wrong type.
    #[error("\"{key}\" must be {expected}, got {got}")]
    WrongType {
        /// The key.
        key: &'static str,
        /// What it must be.
        expected: &'static str,
        /// What it was.
        got: &'static str,
    },
    /// A score outside the rubric's range.
    #[error("score {score} is outside the rubric's range {min} to {max}")]
    OutOfRange {
        /// The score.
        score: f64,
        /// The range.
        min: f64,
        /// The range.
        max: f64,
    },
    /// A label not in the rubric.
    #[error("label {label:?} is not one of the rubric's labels {labels}")]
    UnknownLabel {
        /// The label.
        label: String,
        /// The rubric's labels, quoted.
        labels: String,
    },
}

/// Reads the judge's message content against `rubric`.
pub fn parse_reply(content: &str, rubric: &Rubric) -> Result<Reply, ReplyError> {
    let text = unfence(content.trim())?;
    if text.is_empty() {
        return Err(ReplyError::Empty);
    }
    if !text.starts_with('{') {
        return Err(match serde_json::from_str::<Value>(text) {
            Ok(value) => ReplyError::NotObject(kind(&value)),
            Err(error) => ReplyError::NotJson(without_position(&error)),
        });
    }
    let mut stream = serde_json::Deserializer::from_str(text).into_iter::<Entries>();
    let entries = match stream.next() {
        Some(Ok(entries)) => entries.0,
        Some(Err(error)) => return Err(ReplyError::NotJson(without_position(&error))),
        None => return Err(ReplyError::Empty),
    };
    let rest = text[stream.byte_offset()..].trim_start();
    if rest.starts_with('{') {
        return Err(ReplyError::TwoObjects);
    }
    if !rest.is_empty() {
        return Err(ReplyError::Trailing);
    }
    let key = rubric.key();
    let mut choice = None;
    let mut reason = None;
    for (index, (name, value)) in entries.iter().enumerate() {
        if entries[..index].iter().any(|(earlier, _)| earlier == name) {
            return Err(ReplyError::Duplicate(name.clone()));
        }
        if name == "reason" {
            match value {
                Value::String(text) => reason = Some(text.clone()),
                other => {
                    return Err(ReplyError::WrongType {
                        key: "reason",
                        expected: "a string",
                        got: kind(other),
                    });
                }
            }
        } else if name == key {
            choice = Some(read_choice(value, rubric)?);
        } else {
            return Err(ReplyError::UnknownKey { key: name.clone(), expected: key });
        }
    }
    let choice = choice.ok_or(ReplyError::Missing(key))?;
    Ok(Reply { choice, reason })
}

fn read_choice(value: &Value, rubric: &Rubric) -> Result<Choice, ReplyError> {
    match rubric {
        Rubric::Score { min, max, .. } => {
            let Value::Number(number) = value else {
                return Err(ReplyError::WrongType { key: "score", expected: "a number", got: kind(value) });
            };
            // serde_json refuses NaN, Infinity and out-of-range literals while parsing; every
            // number it gives is finite.
            let score = number.as_f64().unwrap_or(f64::NAN);
            if !(score >= *min && score <= *max) {
                return Err(ReplyError::OutOfRange { score, min: *min, max: *max });
            }
            Ok(Choice::Score(score))
        }
        Rubric::Label { labels, .. } => {
            let Value::String(label) = value else {
                return Err(ReplyError::WrongType { key: "label", expected: "a string", got: kind(value) });
            };
            if !labels.contains(label) {
                let quoted = labels.iter().map(|l| format!("{l:?}")).collect::<Vec<_>>().join(", ");
                return Err(ReplyError::UnknownLabel { label: label.clone(), labels: quoted });
            }
            Ok(Choice::Label(label.clone()))
        }
    }
}

/// The inside of one fenced block (```` ```json ```` or ```` ``` ````, closed at the very end),
/// or the text itself when it has no fence.
fn unfence(text: &str) -> Result<&str, ReplyError> {
    let Some(rest) = text.strip_prefix("```") else {
        return Ok(text);
    };
    let (tag, body) = rest.split_once('\n').ok_or(ReplyError::Fence)?;
    if !matches!(tag.trim().to_ascii_lowercase().as_str(), "" | "json") {
        return Err(ReplyError::Fence);
    }
    let inner = body.trim_end().strip_suffix("```").ok_or(ReplyError::Fence)?;
    if inner.contains("```") {
        return Err(ReplyError::Fence);
    }
    Ok(inner.trim())
}

/// A JSON object's entries in order, duplicates kept (serde_json's `Value` keeps the last of a
/// duplicated key without a word).
struct Entries(Vec<(String, Value)>);

impl<'de> Deserialize<'de> for Entries {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct EntriesVisitor;
        impl<'de> Visitor<'de> for EntriesVisitor {
            type Value = Entries;
            fn expecting(&self, formatter: &mut fmt::Formatter) -> fmt::Result {
                formatter.write_str("a JSON object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Entries, A::Error> {
                let mut entries = Vec::new();
                while let Some(entry) = map.next_entry::<String, Value>()? {
                    entries.push(entry);
                }
                Ok(Entries(entries))
            }
        }
        deserializer.deserialize_map(EntriesVisitor)
    }
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

/// serde_json's message without "at line 1 column 5": the position is in text nobody wrote.
fn without_position(error: &serde_json::Error) -> String {
    let text = error.to_string();
    match text.rfind(" at line ") {
        Some(at) => text[..at].to_owned(),
        None => text,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn score() -> Rubric {
        Rubric::Score { min: 0.0, max: 10.0, pass_threshold: 7.0 }
    }

    fn label() -> Rubric {
        Rubric::Label {
            labels: vec!["correct".into(), "incorrect".into()],
            passing_labels: vec!["correct".into()],
        }
    }

    /// `expected`: `Ok((choice, reason))` or the error's message.
    fn check(rubric: &Rubric, content: &str, expected: Result<(Choice, Option<&str>), &str>) {
        let got = parse_reply(content, rubric).map_err(|error| error.to_string());
        let expected = expected
            .map(|(choice, reason)| Reply { choice, reason: reason.map(str::to_owned) })
            .map_err(str::to_owned);
        assert_eq!(got, expected, "{content:?}");
    }

    #[test]
    fn accepted_replies() {
        let s = |x: f64| Choice::Score(x);
        let cases: &[(&str, Choice, Option<&str>)] = &[
            (r#"{"score": 8}"#, s(8.0), None),
            ("  \n{\"score\": 7.5}\n ", s(7.5), None),
            (r#"{"reason": "right answer", "score": 10}"#, s(10.0), Some("right answer")),
            (r#"{"score": 0, "reason": ""}"#, s(0.0), Some("")),
            (r#"{"score": 1e1}"#, s(10.0), None),
            ("```json\n{\"score\": 3}\n```", s(3.0), None),
            ("```JSON\n{\"score\": 3}\n```\n", s(3.0), None),
            ("```\n{\"score\": 3}\n```", s(3.0), None),
        ];
        for (content, choice, reason) in cases {
            check(&score(), content, Ok((choice.clone(), *reason)));
        }
        check(&label(), r#"{"label": "correct"}"#, Ok((Choice::Label("correct".into()), None)));
        check(
            &label(),
            r#"{"reason": "no", "label": "incorrect"}"#,
            Ok((Choice::Label("incorrect".into()), Some("no"))),
        );
    }

    #[test]
    fn refused_replies_say_what_was_wrong() {
        let cases: &[(&Rubric, &str, &str)] = &[
            (&score(), "", "empty reply, expected one JSON object"),
            (&score(), "   \n", "empty reply, expected one JSON object"),
            (
                &score(),
                "The answer deserves an 8.",
                "expected one JSON object, got text that is not JSON (expected value)",
            ),
            (
                &score(),
                "Score: {\"score\": 8}",
                "expected one JSON object, got text that is not JSON (expected value)",
            ),
            (&score(), "8", "expected one JSON object, got a number"),
            (&score(), "\"8\"", "expected one JSON object, got a string"),
            (&score(), "[{\"score\": 8}]", "expected one JSON object, got an array"),
            (&score(), "null", "expected one JSON object, got null"),
            (
                &score(),
                "{\"score\": 8} {\"score\": 2}",
                "expected exactly one JSON object, got more than one",
            ),
            (
                &score(),
                "{\"score\": 8}\nI think that is fair.",
                "expected exactly one JSON object, got text after it",
            ),
            (
                &score(),
                "{\"score\": 8",
                "expected one JSON object, got text that is not JSON (EOF while parsing an object)",
            ),
            (
                &score(),
                "{\"score\": NaN}",
                "expected one JSON object, got text that is not JSON (expected value)",
            ),
            (
                &score(),
                "{\"score\": 1e999}",
                "expected one JSON object, got text that is not JSON (number out of range)",
            ),
            (&score(), "{\"score\": 11}", "score 11 is outside the rubric's range 0 to 10"),
            (&score(), "{\"score\": -0.5}", "score -0.5 is outside the rubric's range 0 to 10"),
            (&score(), "{\"score\": \"8\"}", "\"score\" must be a number, got a string"),
            (&score(), "{\"score\": null}", "\"score\" must be a number, got null"),
            (&score(), "{\"reason\": \"good\"}", "missing \"score\""),
            (&score(), "{}", "missing \"score\""),
            (&score(), "{\"score\": 8, \"score\": 2}", "the key \"score\" appears twice"),
            (
                &score(),
                "{\"score\": 8, \"confidence\": 0.9}",
                "unknown key \"confidence\", expected only \"score\" and \"reason\"",
            ),
            (
                &score(),
                "{\"label\": \"correct\"}",
                "unknown key \"label\", expected only \"score\" and \"reason\"",
            ),
            (&score(), "{\"score\": 8, \"reason\": 5}", "\"reason\" must be a string, got a number"),
            (&score(), "```json\n{\"score\": 8}", "expected one ```json fenced block and nothing around it"),
            (
                &score(),
                "```python\n{\"score\": 8}\n```",
                "expected one ```json fenced block and nothing around it",
            ),
            (
                &score(),
                "```json\n{\"score\": 8}\n```\n```json\n{\"score\": 2}\n```",
                "expected one ```json fenced block and nothing around it",
            ),
            (
                &score(),
                "Here: ```json\n{\"score\": 8}\n```",
                "expected one JSON object, got text that is not JSON (expected value)",
            ),
            (
                &label(),
                "{\"label\": \"Correct\"}",
                "label \"Correct\" is not one of the rubric's labels \"correct\", \"incorrect\"",
            ),
            (&label(), "{\"label\": 1}", "\"label\" must be a string, got a number"),
            (&label(), "{\"score\": 1}", "unknown key \"score\", expected only \"label\" and \"reason\""),
            (&label(), "correct", "expected one JSON object, got text that is not JSON (expected value)"),
        ];
        for (rubric, content, message) in cases {
            check(rubric, content, Err(message));
        }
    }

    /// `(content, model, usage)` of a completion.
    type Fields<'a> = (&'a str, Option<&'a str>, Option<(f64, f64)>);

    /// `expected`: `Ok((content, model, usage))` or the start of the error.
    fn envelope(body: &str, expected: Result<Fields<'_>, &str>) {
        match (parse_completion(body.as_bytes()), expected) {
            (Ok(got), Ok((content, model, usage))) => {
                assert_eq!(
                    got,
                    Completion { content: content.into(), model: model.map(Into::into), usage },
                    "{body}"
                )
            }
            (Err(got), Err(start)) => assert!(got.starts_with(start), "{body}: {got}"),
            (got, expected) => panic!("{body}: got {got:?}, expected {expected:?}"),
        }
    }

    #[test]
    fn chat_completion_envelopes() {
        envelope(
            r#"{"id": "x", "model": "judge-1", "choices": [{"index": 0, "message": {"role": "assistant", "content": "{\"score\": 8}"}, "finish_reason": "stop"}], "usage": {"prompt_tokens": 20, "completion_tokens": 5, "total_tokens": 25}}"#,
            Ok((r#"{"score": 8}"#, Some("judge-1"), Some((20.0, 5.0)))),
        );
        envelope(r#"{"choices": [{"message": {"content": "hi"}}]}"#, Ok(("hi", None, None)));
        envelope(
            "<html>502 Bad Gateway</html>",
            Err("the judge's response is not a chat completion (invalid JSON: "),
        );
        envelope("[]", Err("the judge's response is not a chat completion: expected a JSON object, got []"));
        envelope(
            r#"{"error": {"message": "model not found"}}"#,
            Err("the judge endpoint answered an error: model not found"),
        );
        envelope(
            r#"{"object": "list"}"#,
            Err("the judge's response is not a chat completion: no \"choices\" array"),
        );
        envelope(r#"{"choices": []}"#, Err("the judge's response has 0 choices, expected exactly 1"));
        envelope(
            r#"{"choices": [{"message": {"content": "a"}}, {"message": {"content": "b"}}]}"#,
            Err("the judge's response has 2 choices, expected exactly 1"),
        );
        envelope(
            r#"{"choices": [{"message": {"content": null, "refusal": "I cannot grade this"}}]}"#,
            Err("the judge refused to answer: I cannot grade this"),
        );
        envelope(
            r#"{"choices": [{"message": {"content": 5}}]}"#,
            Err("the judge's response has no message content"),
        );
        envelope(
            r#"{"choices": [{"message": {"content": "{\"reason\": \"long"}, "finish_reason": "length"}]}"#,
            Err(
                "the judge's reply was cut off at max_tokens (finish_reason \"length\"): \"{\"reason\": \"long\"",
            ),
        );
    }
}
