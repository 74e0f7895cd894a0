//! The records of a job's data files (JSONL, one object a line), as teams write them: prompts
//! with the reference their verifiers check (online training, held-out, canaries),
//! demonstrations (SFT) and preference pairs (DPO, reward models).
//!
//! One reader for both sides: the worker loads the records it trains on, and the daemon checks
//! every record of a job's files at submit ([`check`]), so that a file the job cannot use is
//! refused with its field, line and key before the job waits in the queue, not when it starts.
//! Every error names the spec's field, the file, the line and the record's key.
//!
//! [`RecordKind`] says which record a file holds, by the optimizer's data mode and the model it
//! trains. The worker loads them (`load_*`); submit reads every record through [`check`], a line at a
//! time, in the daemon's `jobs::checks::data_problems`, with the same errors.

use std::collections::HashSet;
use std::fs::File;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};

use rlvr_plugin_api::{DataMode, TrainedModel};
use serde_json::{Map, Value};

/// A prompt with the reference its verifiers check against (online training, held-out, canaries).
#[derive(Debug, Clone, PartialEq)]
pub struct PromptRecord {
    pub id: String,
    pub prompt: String,
    /// The `reference` object as JSON text.
    pub reference_json: String,
}

/// A demonstration for SFT: the loss is on `completion` only.
#[derive(Debug, Clone, PartialEq)]
pub struct SftRecord {
    pub id: String,
    pub prompt: String,
    pub completion: String,
}

/// A preference pair for DPO.
#[derive(Debug, Clone, PartialEq)]
pub struct PairRecord {
    pub id: String,
    pub prompt: String,
    pub chosen: String,
    pub rejected: String,
    /// How far the chosen completion must out-score the rejected one (Llama 2's margin, for a
    /// reward model's loss); 0 when the record gives none. DPO does not read it.
    pub margin: f64,
}

/// What the records of one file are.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RecordKind {
    /// `{"id", "prompt", "reference": {...}}`.
    Prompts,
    /// `{"prompt", "completion"}`, `id` optional.
    Demonstrations,
    /// `{"prompt", "chosen", "rejected"}`, `id` and `margin` optional.
    Pairs,
}

impl RecordKind {
    /// What `data.train` holds for an optimizer of `mode`.
    pub fn of_train(mode: DataMode) -> Self {
        match mode {
            DataMode::OnlineGroups | DataMode::OnlineWithCritic => RecordKind::Prompts,
            DataMode::OfflineSft => RecordKind::Demonstrations,
            DataMode::OfflinePairs => RecordKind::Pairs,
        }
    }

    /// The records, as a sentence's end: `prompts: {"id", "prompt", "reference": {…}} a line`.
    pub fn expected(self) -> &'static str {
        match self {
            RecordKind::Prompts => r#"prompts: {"id", "prompt", "reference": {…}} a line"#,
            RecordKind::Demonstrations => r#"demonstrations: {"prompt", "completion"} a line"#,
            RecordKind::Pairs => r#"preference pairs: {"prompt", "chosen", "rejected"} a line"#,
        }
    }

    /// What `data.heldout` holds for a job that trains `trains`: prompts a policy answers, or
    /// pairs a reward model ranks.
    pub fn of_heldout(trains: TrainedModel) -> Self {
        match trains {
            TrainedModel::Policy => RecordKind::Prompts,
            TrainedModel::RewardModel => RecordKind::Pairs,
        }
    }
}

/// A data file that could not be used.
#[derive(Debug, thiserror::Error)]
pub enum DataError {
    #[error("{field}: cannot read {path}: {source}")]
    Read { field: &'static str, path: PathBuf, source: std::io::Error },
    #[error("{field}: {path} line {line}: {message}")]
    Record { field: &'static str, path: PathBuf, line: usize, message: String },
    #[error("{field}: {path} has no records")]
    Empty { field: &'static str, path: PathBuf },
}

impl DataError {
    /// The spec's field that named the file.
    pub fn field(&self) -> &'static str {
        match self {
            DataError::Read { field, .. }
            | DataError::Record { field, .. }
            | DataError::Empty { field, .. } => field,
        }
    }

    /// The error without the spec's field, and with `shown` in place of the file's path (a
    /// dataset's name for a team, which must not see the server's paths).
    pub fn message_for(&self, shown: &str) -> String {
        match self {
            DataError::Read { source, .. } => format!("cannot read {shown}: {source}"),
            DataError::Record { line, message, .. } => format!("{shown} line {line}: {message}"),
            DataError::Empty { .. } => format!("{shown} has no records"),
        }
    }
}

/// Prompts with references: `{"id", "prompt", "reference": {...}}`.
pub fn load_prompts(field: &'static str, path: &Path) -> Result<Vec<PromptRecord>, DataError> {
    collect(field, path, prompt_record)
}

/// Demonstrations: `{"prompt", "completion"}`, `id` optional.
pub fn load_sft(field: &'static str, path: &Path) -> Result<Vec<SftRecord>, DataError> {
    collect(field, path, sft_record)
}

/// Preference pairs: `{"prompt", "chosen", "rejected"}`, `id` optional.
pub fn load_pairs(field: &'static str, path: &Path) -> Result<Vec<PairRecord>, DataError> {
    collect(field, path, pair_record)
}

/// Reads every record of `path` as `kind` and keeps none: the number of records, or the first
/// error as loading would give it. A line at a time, so a file as large as the largest dataset
/// costs a line's memory (and its ids).
pub fn check(kind: RecordKind, field: &'static str, path: &Path) -> Result<usize, DataError> {
    let mut count = 0;
    match kind {
        RecordKind::Prompts => each_record(field, path, prompt_record, |_| count += 1)?,
        RecordKind::Demonstrations => each_record(field, path, sft_record, |_| count += 1)?,
        RecordKind::Pairs => each_record(field, path, pair_record, |_| count += 1)?,
    }
    Ok(count)
}

type Parse<T> = fn(usize, &mut Map<String, Value>) -> Result<(String, T), String>;

fn collect<T>(field: &'static str, path: &Path, parse: Parse<T>) -> Result<Vec<T>, DataError> {
    let mut records = Vec::new();
    each_record(field, path, parse, |record| records.push(record))?;
    Ok(records)
}

/// Hands each record of `path` (parsed by `parse`) to `take`, checking ids are unique; blank
/// lines are skipped, and a file without records is an error.
fn each_record<T>(
    field: &'static str,
    path: &Path,
    parse: Parse<T>,
    mut take: impl FnMut(T),
) -> Result<(), DataError> {
    let read_error = |source| DataError::Read { field, path: path.to_owned(), source };
    let file = File::open(path).map_err(read_error)?;
    let mut seen = HashSet::new();
    for (index, line) in BufReader::new(file).lines().enumerate() {
        let line_text = line.map_err(read_error)?;
        if line_text.trim().is_empty() {
            continue;
        }
        let line = index + 1;
        let record = |message: String| DataError::Record { field, path: path.to_owned(), line, message };
        let mut object = match serde_json::from_str::<Value>(&line_text) {
            Ok(Value::Object(object)) => object,
            Ok(_) => return Err(record("expected a JSON object".into())),
            Err(error) => return Err(record(format!("invalid JSON: {error}"))),
        };
        let (id, value) = parse(line, &mut object).map_err(record)?;
        if !seen.insert(id.clone()) {
            return Err(record(format!("id: {id:?} appears twice; ids must be unique")));
        }
        take(value);
    }
    if seen.is_empty() {
        return Err(DataError::Empty { field, path: path.to_owned() });
    }
    Ok(())
}

fn prompt_record(line: usize, object: &mut Map<String, Value>) -> Result<(String, PromptRecord), String> {
    let id = id(object, line, true)?;
    let prompt = text(object, "prompt")?;
    let reference = match object.remove("reference") {
        Some(Value::Object(reference)) => reference,
        None | Some(Value::Null) => Map::new(),
        Some(_) => return Err("reference: expected a JSON object".into()),
    };
    let reference_json = Value::Object(reference).to_string();
    Ok((id.clone(), PromptRecord { id, prompt, reference_json }))
}

fn sft_record(line: usize, object: &mut Map<String, Value>) -> Result<(String, SftRecord), String> {
    let id = id(object, line, false)?;
    let record = SftRecord {
        id: id.clone(),
        prompt: text(object, "prompt")?,
        completion: text(object, "completion")?,
    };
    if record.completion.is_empty() {
        return Err("completion: expected a non-empty string".into());
    }
    Ok((id, record))
}

fn pair_record(line: usize, object: &mut Map<String, Value>) -> Result<(String, PairRecord), String> {
    let id = id(object, line, false)?;
    let record = PairRecord {
        id: id.clone(),
        prompt: text(object, "prompt")?,
        chosen: text(object, "chosen")?,
        rejected: text(object, "rejected")?,
        margin: margin(object)?,
    };
    Ok((id, record))
}

fn text(object: &mut Map<String, Value>, name: &str) -> Result<String, String> {
    match object.remove(name) {
        Some(Value::String(text)) => Ok(text),
        None | Some(Value::Null) => Err(format!("{name}: missing (expected a string)")),
        Some(_) => Err(format!("{name}: expected a string")),
    }
}

/// `id` as given (a string or a number), or `line-N` when the record has none.
fn id(object: &mut Map<String, Value>, line: usize, required: bool) -> Result<String, String> {
    match object.remove("id") {
        Some(Value::String(id)) if !id.is_empty() => Ok(id),
        Some(Value::Number(id)) => Ok(id.to_string()),
        None | Some(Value::Null) if !required => Ok(format!("line-{line}")),
        None | Some(Value::Null) => Err("id: missing (expected a string)".into()),
        Some(_) => Err("id: expected a non-empty string".into()),
    }
}

/// A pair's optional `margin`: a finite number ≥ 0.
fn margin(object: &mut Map<String, Value>) -> Result<f64, String> {
    match object.remove("margin") {
        None | Some(Value::Null) => Ok(0.0),
        Some(Value::Number(number)) => match number.as_f64() {
            Some(margin) if margin.is_finite() && margin >= 0.0 => Ok(margin),
            _ => Err(format!("margin: expected a finite number ≥ 0, got {number}")),
        },
        Some(other) => Err(format!("margin: expected a number, got {other}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn record_errors_name_file_line_and_field() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("train.jsonl");
        std::fs::write(
            &path,
            "{\"id\": \"a\", \"prompt\": \"1+1\", \"reference\": {\"answer\": \"2\"}}\n\n{\"id\": \"b\", \"prompt\": 3}\n",
        )
        .unwrap();
        let error = load_prompts("data.train", &path).unwrap_err().to_string();
        assert!(
            error.starts_with("data.train: ") && error.ends_with("line 3: prompt: expected a string"),
            "{error}"
        );
        std::fs::write(&path, "{\"id\": \"a\", \"prompt\": \"x\"}\n{\"id\": \"a\", \"prompt\": \"y\"}\n")
            .unwrap();
        let error = load_prompts("data.train", &path).unwrap_err().to_string();
        assert!(error.contains("line 2: id: \"a\" appears twice"), "{error}");
        std::fs::write(&path, "\n").unwrap();
        assert!(load_sft("data.train", &path).unwrap_err().to_string().contains("has no records"));
    }

    /// Each kind against records written for each kind: `check` answers as loading does, with
    /// the first key the record lacks.
    #[test]
    fn a_file_is_checked_for_the_keys_its_kind_needs() {
        let dir = tempfile::tempdir().unwrap();
        let write = |name: &str, text: &str| {
            let path = dir.path().join(name);
            std::fs::write(&path, text).unwrap();
            path
        };
        let prompts = write(
            "prompts.jsonl",
            "{\"id\": \"p1\", \"prompt\": \"2+2=\", \"reference\": {\"answer\": \"4\"}}\n",
        );
        let demonstrations = write(
            "sft.jsonl",
            "{\"prompt\": \"2+2=\", \"completion\": \"4\"}\n{\"prompt\": \"1+1=\", \"completion\": \"2\"}\n",
        );
        let pairs = write(
            "pairs.jsonl",
            "{\"prompt\": \"2+2=\", \"chosen\": \"4\", \"rejected\": \"5\", \"margin\": 1}\n",
        );
        let no_prompt = write("no-prompt.jsonl", "{\"id\": \"q\", \"question\": \"2+2=\"}\n");
        let rows: [(RecordKind, &Path, Result<usize, &str>); 8] = [
            (RecordKind::Prompts, &prompts, Ok(1)),
            (RecordKind::Demonstrations, &demonstrations, Ok(2)),
            (RecordKind::Pairs, &pairs, Ok(1)),
            // A demonstration has no id: a prompt must.
            (RecordKind::Prompts, &demonstrations, Err("line 1: id: missing (expected a string)")),
            (RecordKind::Demonstrations, &prompts, Err("line 1: completion: missing (expected a string)")),
            (RecordKind::Pairs, &demonstrations, Err("line 1: chosen: missing (expected a string)")),
            (RecordKind::Prompts, &no_prompt, Err("line 1: prompt: missing (expected a string)")),
            (RecordKind::Pairs, &dir.path().join("absent.jsonl"), Err("cannot read")),
        ];
        for (kind, path, expected) in rows {
            let got = check(kind, "data.train", path).map_err(|error| error.to_string());
            match (&got, expected) {
                (Ok(count), Ok(want)) => assert_eq!(*count, want, "{kind:?} {}", path.display()),
                (Err(error), Err(want)) => {
                    assert!(error.starts_with("data.train: ") && error.contains(want), "{kind:?}: {error}")
                }
                _ => panic!("{kind:?} {}: {got:?}, expected {expected:?}", path.display()),
            }
        }
        let shown =
            check(RecordKind::Prompts, "data.train", &no_prompt).unwrap_err().message_for("dataset q");
        assert_eq!(shown, "dataset q line 1: prompt: missing (expected a string)");
    }

    #[test]
    fn the_kinds_follow_the_optimizer_and_the_trained_model() {
        assert_eq!(RecordKind::of_train(DataMode::OnlineGroups), RecordKind::Prompts);
        assert_eq!(RecordKind::of_train(DataMode::OnlineWithCritic), RecordKind::Prompts);
        assert_eq!(RecordKind::of_train(DataMode::OfflineSft), RecordKind::Demonstrations);
        assert_eq!(RecordKind::of_train(DataMode::OfflinePairs), RecordKind::Pairs);
        assert_eq!(RecordKind::of_heldout(TrainedModel::Policy), RecordKind::Prompts);
        assert_eq!(RecordKind::of_heldout(TrainedModel::RewardModel), RecordKind::Pairs);
    }
}
