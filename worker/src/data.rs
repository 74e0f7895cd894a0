//! The job's data files (JSONL) and the order the training data is visited in.
//!
//! Every record error names the file, the line and the field. The order is a seeded shuffle per
//! epoch, so a [`Cursor`] (epoch, index) is all a checkpoint needs to continue exactly.

use std::collections::HashSet;
use std::fs;
use std::path::{Path, PathBuf};

use rlvr_seeded::SplitMix64;
use serde::{Deserialize, Serialize};
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

/// A JSON object and its 1-based line number.
type NumberedObject = (usize, Map<String, Value>);

/// Reads a JSONL file of objects; blank lines are skipped. `field` is the spec key that named it.
fn read_objects(field: &'static str, path: &Path) -> Result<Vec<NumberedObject>, DataError> {
    let text = fs::read_to_string(path).map_err(|source| DataError::Read {
        field,
        path: path.to_owned(),
        source,
    })?;
    let mut objects = Vec::new();
    for (index, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let record =
            |message: String| DataError::Record { field, path: path.to_owned(), line: index + 1, message };
        match serde_json::from_str::<Value>(line) {
            Ok(Value::Object(object)) => objects.push((index + 1, object)),
            Ok(_) => return Err(record("expected a JSON object".into())),
            Err(error) => return Err(record(format!("invalid JSON: {error}"))),
        }
    }
    if objects.is_empty() {
        return Err(DataError::Empty { field, path: path.to_owned() });
    }
    Ok(objects)
}

/// Reads the records of `path` with `parse`, checking ids are unique.
fn read_records<T>(
    field: &'static str,
    path: &Path,
    mut parse: impl FnMut(usize, &mut Map<String, Value>) -> Result<(String, T), String>,
) -> Result<Vec<T>, DataError> {
    let mut seen = HashSet::new();
    let mut records = Vec::new();
    for (line, mut object) in read_objects(field, path)? {
        let record = |message: String| DataError::Record { field, path: path.to_owned(), line, message };
        let (id, value) = parse(line, &mut object).map_err(record)?;
        if !seen.insert(id.clone()) {
            return Err(record(format!("id: {id:?} appears twice; ids must be unique")));
        }
        records.push(value);
    }
    Ok(records)
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

/// Prompts with references: `{"id", "prompt", "reference": {...}}`.
pub fn load_prompts(field: &'static str, path: &Path) -> Result<Vec<PromptRecord>, DataError> {
    read_records(field, path, |line, object| {
        let id = id(object, line, true)?;
        let prompt = text(object, "prompt")?;
        let reference = match object.remove("reference") {
            Some(Value::Object(reference)) => reference,
            None | Some(Value::Null) => Map::new(),
            Some(_) => return Err("reference: expected a JSON object".into()),
        };
        let reference_json = Value::Object(reference).to_string();
        Ok((id.clone(), PromptRecord { id, prompt, reference_json }))
    })
}

/// Demonstrations: `{"prompt", "completion"}`, `id` optional.
pub fn load_sft(field: &'static str, path: &Path) -> Result<Vec<SftRecord>, DataError> {
    read_records(field, path, |line, object| {
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
    })
}

/// Preference pairs: `{"prompt", "chosen", "rejected"}`, `id` optional.
pub fn load_pairs(field: &'static str, path: &Path) -> Result<Vec<PairRecord>, DataError> {
    read_records(field, path, |line, object| {
        let id = id(object, line, false)?;
        let record = PairRecord {
            id: id.clone(),
            prompt: text(object, "prompt")?,
            chosen: text(object, "chosen")?,
            rejected: text(object, "rejected")?,
            margin: margin(object)?,
        };
        Ok((id, record))
    })
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

/// Where the data order stands: the next record is `order(epoch)[index]`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Cursor {
    pub epoch: u64,
    pub index: u64,
}

impl Cursor {
    /// The next `count` record indices of a data set of `len` records, advancing the cursor
    /// (into the next epoch when needed; an epoch never repeats a record).
    pub fn take(&mut self, count: usize, len: usize, seed: u64) -> Vec<usize> {
        let mut picked = Vec::with_capacity(count);
        let mut order = epoch_order(len, seed, self.epoch);
        while picked.len() < count {
            if self.index as usize >= len {
                self.epoch += 1;
                self.index = 0;
                order = epoch_order(len, seed, self.epoch);
            }
            picked.push(order[self.index as usize]);
            self.index += 1;
        }
        picked
    }
}

/// A permutation of `0..len` from `seed` and `epoch` (Fisher–Yates over SplitMix64, modulo
/// draws: the order of every recorded run).
pub fn epoch_order(len: usize, seed: u64, epoch: u64) -> Vec<usize> {
    let mut rng =
        SplitMix64::new(seed ^ epoch.wrapping_mul(rlvr_seeded::GOLDEN_GAMMA) ^ 0xD1B5_4A32_D192_ED03);
    let mut order: Vec<usize> = (0..len).collect();
    for i in (1..len).rev() {
        let j = (rng.next_u64() % (i as u64 + 1)) as usize;
        order.swap(i, j);
    }
    order
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cursor_visits_every_record_once_per_epoch_and_resumes_exactly() {
        let mut cursor = Cursor::default();
        let first: Vec<usize> = cursor.take(7, 7, 42);
        let mut sorted = first.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, (0..7).collect::<Vec<_>>());
        let mut saved = cursor;
        let mut straight = cursor;
        assert_eq!(straight.take(10, 7, 42), saved.take(10, 7, 42));
        assert_ne!(epoch_order(50, 42, 0), epoch_order(50, 42, 1));
    }

    #[test]
    fn record_errors_name_file_line_and_field() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("train.jsonl");
        fs::write(&path, "{\"id\": \"a\", \"prompt\": \"1+1\", \"reference\": {\"answer\": \"2\"}}\n\n{\"id\": \"b\", \"prompt\": 3}\n").unwrap();
        let error = load_prompts("data.train", &path).unwrap_err().to_string();
        assert!(
            error.starts_with("data.train: ") && error.ends_with("line 3: prompt: expected a string"),
            "{error}"
        );
        fs::write(&path, "{\"id\": \"a\", \"prompt\": \"x\"}\n{\"id\": \"a\", \"prompt\": \"y\"}\n").unwrap();
        let error = load_prompts("data.train", &path).unwrap_err().to_string();
        assert!(error.contains("line 2: id: \"a\" appears twice"), "{error}");
        fs::write(&path, "\n").unwrap();
        assert!(load_sft("data.train", &path).unwrap_err().to_string().contains("has no records"));
    }
}
