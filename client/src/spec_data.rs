//! A spec's local data files, uploaded as the team's datasets: the daemon reads no path a spec
//! writes, so `rlvrctl submit job.toml` with `train = "data/train.jsonl"` uploads that file and
//! submits `train = "dataset:train@<sha256>"`; a pipeline spec's stages likewise.

use std::path::{Path, PathBuf};

use rlvr_protocol::names::valid_name;
use rlvr_protocol::pipeline::PREVIOUS;

use crate::{Client, HttpError, SpecFormat};

/// The data keys a spec may hold files in.
const DATA_KEYS: [&str; 3] = ["train", "heldout", "canaries"];

/// Why a spec's data could not be uploaded.
#[derive(Debug, thiserror::Error)]
pub enum SpecDataError {
    /// The spec is not TOML or JSON; the daemon will say exactly what is wrong with it.
    #[error("the spec does not parse: {0}")]
    Parse(String),
    /// A local file cannot be read.
    #[error("data.{key}: cannot read {path}: {source}")]
    Read {
        /// `train`, `heldout` or `canaries`.
        key: String,
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The upload was refused or failed.
    #[error("data.{key}: uploading {path}: {source}")]
    Upload {
        /// `train`, `heldout` or `canaries`.
        key: String,
        /// The file.
        path: PathBuf,
        /// Why.
        source: Box<HttpError>,
    },
}

/// What the uploads of a spec's files do to the team's names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Upload {
    /// Each file becomes the dataset its name says (a submit).
    Named,
    /// Each file's content is checked and kept for the spec to cite; no name moves (a dry run).
    DryRun,
}

pub(crate) fn upload(
    client: &Client,
    spec: &str,
    format: SpecFormat,
    base_dir: &Path,
    mode: Upload,
) -> Result<String, SpecDataError> {
    let mut value: serde_json::Value = match format {
        SpecFormat::Toml => toml::from_str(spec).map_err(|error| SpecDataError::Parse(error.to_string()))?,
        SpecFormat::Json => {
            serde_json::from_str(spec).map_err(|error| SpecDataError::Parse(error.to_string()))?
        }
    };
    let mut changed = false;
    // A job spec's `[data]`, or each stage's of a pipeline spec (`[[stages]]`).
    let mut sections: Vec<&mut serde_json::Map<String, serde_json::Value>> = Vec::new();
    if let Some(object) = value.as_object_mut() {
        for (key, item) in object.iter_mut() {
            match (key.as_str(), item) {
                ("data", serde_json::Value::Object(data)) => sections.push(data),
                ("stages", serde_json::Value::Array(stages)) => sections
                    .extend(stages.iter_mut().filter_map(|stage| stage.get_mut("data")?.as_object_mut())),
                _ => {}
            }
        }
    }
    for data in sections {
        for key in DATA_KEYS {
            let Some(text) = data.get(key).and_then(|v| v.as_str()) else { continue };
            // `previous`: a pipeline stage's input, the stage before's output.
            if text.starts_with("dataset:") || text.starts_with("root:") || text == PREVIOUS {
                continue;
            }
            let path = base_dir.join(text);
            let read_error = |source| SpecDataError::Read { key: key.to_owned(), path: path.clone(), source };
            // Only a regular file: `/dev/zero` or a FIFO would be read until memory runs out.
            let meta = std::fs::metadata(&path).map_err(read_error)?;
            if !meta.is_file() {
                return Err(read_error(std::io::Error::other("not a regular file")));
            }
            let content = std::fs::read(&path).map_err(read_error)?;
            let name = dataset_name(&path, key);
            let sent = match mode {
                Upload::Named => client.put_dataset(&name, &content),
                Upload::DryRun => client.check_dataset(&name, &content),
            };
            let dataset = sent.map_err(|source| SpecDataError::Upload {
                key: key.to_owned(),
                path: path.clone(),
                source: Box::new(source),
            })?;
            data.insert(key.to_owned(), format!("dataset:{}@{}", dataset.name, dataset.sha256).into());
            changed = true;
        }
    }
    if !changed {
        return Ok(spec.to_owned());
    }
    match format {
        SpecFormat::Toml => toml::to_string(&value).map_err(|error| SpecDataError::Parse(error.to_string())),
        SpecFormat::Json => {
            serde_json::to_string(&value).map_err(|error| SpecDataError::Parse(error.to_string()))
        }
    }
}

/// The dataset name for a local file: its stem with anything outside the name rule replaced by
/// `-` (`train.jsonl` → `train`), or the key when nothing usable is left.
fn dataset_name(path: &Path, key: &str) -> String {
    let stem = path.file_stem().and_then(|stem| stem.to_str()).unwrap_or(key);
    let cleaned: String = stem
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') { c } else { '-' })
        .take(64)
        .collect();
    let cleaned = cleaned.trim_start_matches('.').to_owned();
    if valid_name(&cleaned) { cleaned } else { key.to_owned() }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn local_files_get_names_by_the_rule() {
        let cases = [
            ("/x/train.jsonl", "train"),
            ("a b.jsonl", "a-b"),
            (".hidden.jsonl", "hidden"),
            ("/x/.jsonl", "jsonl"),
            ("/x/...", "train"),
        ];
        for (path, expected) in cases {
            assert_eq!(dataset_name(Path::new(path), "train"), expected, "{path}");
        }
    }
}
