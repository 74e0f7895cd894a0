//! Batch verification over JSONL, the engine of `rlvrctl verify` (design.md §1 formats).
//!
//! In, one object per line: `{"id", "prompt", "completion", "reference": {...}}`, with `"pred"`
//! accepted for `completion` and `"gold"` for `reference.answer`; other fields are ignored.
//! Out, one object per input line, same order: `{"id", "score", "passed", "components",
//! "extracted", "error", "latency_us"}`. A line that cannot be read (invalid UTF-8, bad JSON, a
//! missing field) gets an output line with `error` set; the other lines are still answered.
//! Blank lines are skipped.

use std::io::{self, BufRead, Write};
use std::time::Instant;

use rlvr_plugin_api::abi_stable::std_types::RResult;
use rlvr_plugin_api::{Verdict, VerifierBox, VerifyItem};
use serde::Serialize;
use serde::ser::SerializeMap;
use serde_json::{Map, Value};

/// Counts of one batch.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct BatchSummary {
    /// Output lines written.
    pub items: usize,
    /// Items that passed.
    pub passed: usize,
    /// Items with `error` set (unreadable lines and verifier errors).
    pub errors: usize,
}

/// One output line.
#[derive(Debug, Serialize)]
pub struct OutputLine {
    /// The input's id, or null when it had none.
    pub id: Option<String>,
    /// The reward.
    pub score: f64,
    /// Whether the item counts as correct.
    pub passed: bool,
    /// Named parts of the score, in the verifier's order.
    pub components: Components,
    /// The graded answer.
    pub extracted: Option<String>,
    /// Why the item could not be judged.
    pub error: Option<String>,
    /// Time in the verifier, microseconds.
    pub latency_us: u64,
}

/// Components, serialized as a JSON object in the verifier's order.
#[derive(Debug, Default)]
pub struct Components(pub Vec<(String, f64)>);

impl Serialize for Components {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(self.0.len()))?;
        for (name, value) in &self.0 {
            map.serialize_entry(name, value)?;
        }
        map.end()
    }
}

impl OutputLine {
    fn failed(id: Option<String>, error: String) -> Self {
        OutputLine {
            id,
            score: 0.0,
            passed: false,
            components: Components::default(),
            extracted: None,
            error: Some(error),
            latency_us: 0,
        }
    }

    fn from_verdict(id: Option<String>, verdict: Verdict, latency_us: u64) -> Self {
        let error = verdict.error.into_option().map(|error| error.into_string());
        if !verdict.score.is_finite() {
            return OutputLine::failed(id, format!("verifier returned a non-finite score {}", verdict.score));
        }
        OutputLine {
            id,
            score: verdict.score,
            passed: verdict.passed && error.is_none(),
            components: Components(
                verdict.components.into_iter().map(|c| (c.name.into_string(), c.value)).collect(),
            ),
            extracted: verdict.extracted.into_option().map(|answer| answer.into_string()),
            error,
            latency_us,
        }
    }
}

/// A parsed input line.
#[derive(Debug, PartialEq)]
pub struct InputItem {
    /// The caller's id.
    pub id: Option<String>,
    /// The prompt.
    pub prompt: String,
    /// The completion (or `pred`).
    pub completion: String,
    /// The reference object as JSON text, with `gold` folded in as `answer`.
    pub reference_json: String,
}

/// Parses one input line. On error, returns the id when it could be read, and the message.
pub fn parse_line(bytes: &[u8]) -> Result<InputItem, (Option<String>, String)> {
    let text = std::str::from_utf8(bytes)
        .map_err(|error| (None, format!("invalid UTF-8 at byte {}", error.valid_up_to())))?;
    let value: Value =
        serde_json::from_str(text).map_err(|error| (None, format!("invalid JSON: {error}")))?;
    let Value::Object(mut object) = value else {
        return Err((None, "expected a JSON object".to_owned()));
    };
    let id = match object.remove("id") {
        None | Some(Value::Null) => None,
        Some(Value::String(id)) => Some(id),
        Some(Value::Number(id)) => Some(id.to_string()),
        Some(_) => return Err((None, "id: expected a string".to_owned())),
    };
    let fail = |message: String| (id.clone(), message);
    let text_field = |object: &mut Map<String, Value>, name: &str| match object.remove(name) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(text)) => Ok(Some(text)),
        Some(_) => Err(format!("{name}: expected a string")),
    };
    let prompt = text_field(&mut object, "prompt").map_err(fail)?.unwrap_or_default();
    let completion = match (
        text_field(&mut object, "completion").map_err(fail)?,
        text_field(&mut object, "pred").map_err(fail)?,
    ) {
        (Some(completion), None) | (None, Some(completion)) => completion,
        (Some(_), Some(_)) => {
            return Err(fail("completion and pred both given: expected one of them".to_owned()));
        }
        (None, None) => {
            return Err(fail("completion: missing (expected a string, or its alias pred)".to_owned()));
        }
    };
    let mut reference = match object.remove("reference") {
        None | Some(Value::Null) => Map::new(),
        Some(Value::Object(reference)) => reference,
        Some(_) => return Err(fail("reference: expected a JSON object".to_owned())),
    };
    match object.remove("gold") {
        None | Some(Value::Null) => {}
        Some(gold @ (Value::String(_) | Value::Number(_))) => match reference.get("answer") {
            None => {
                reference.insert("answer".to_owned(), gold);
            }
            Some(answer) if *answer == gold => {}
            Some(_) => {
                return Err(fail(
                    "gold and reference.answer both given and differ: expected one of them".to_owned(),
                ));
            }
        },
        Some(_) => return Err(fail("gold: expected a string".to_owned())),
    }
    Ok(InputItem { id, prompt, completion, reference_json: Value::Object(reference).to_string() })
}

/// Verifies one parsed item.
pub fn verify_item(verifier: &VerifierBox, item: &InputItem) -> OutputLine {
    let request = VerifyItem::new(
        item.id.as_deref().unwrap_or(""),
        &item.prompt,
        &item.completion,
        &item.reference_json,
    );
    let started = Instant::now();
    let result = verifier.verify(request);
    let latency_us = u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX);
    match result {
        RResult::ROk(verdict) => OutputLine::from_verdict(item.id.clone(), verdict, latency_us),
        RResult::RErr(error) => {
            let mut line = OutputLine::failed(item.id.clone(), error.to_string());
            line.latency_us = latency_us;
            line
        }
    }
}

/// Reads JSONL from `input`, verifies each line with `verifier`, writes JSONL to `output`.
/// Only IO errors on `input` or `output` stop the batch.
pub fn run_batch(
    verifier: &VerifierBox,
    mut input: impl BufRead,
    mut output: impl Write,
) -> io::Result<BatchSummary> {
    let mut summary = BatchSummary::default();
    let mut buffer = Vec::new();
    let mut line_number = 0usize;
    loop {
        buffer.clear();
        if input.read_until(b'\n', &mut buffer)? == 0 {
            break;
        }
        line_number += 1;
        let line = buffer.strip_suffix(b"\n").unwrap_or(&buffer);
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        let out = match parse_line(line) {
            Ok(item) => verify_item(verifier, &item),
            Err((id, message)) => OutputLine::failed(id, format!("line {line_number}: {message}")),
        };
        summary.items += 1;
        summary.passed += usize::from(out.passed);
        summary.errors += usize::from(out.error.is_some());
        serde_json::to_writer(&mut output, &out)?;
        output.write_all(b"\n")?;
        output.flush()?;
    }
    Ok(summary)
}
