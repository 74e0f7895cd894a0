//! The teams' datasets: JSONL uploaded through the API, stored by content, named per team.
//!
//! ```text
//! <state_dir>/datasets/<team>/
//!   blobs/<sha256>.jsonl    the content, never rewritten
//!   names/<name>.json       a name → its current content (`api::Dataset`)
//!   incoming/<random>       uploads being received
//! ```
//!
//! A spec names `dataset:NAME`; submit pins it to the content of the moment
//! (`dataset:NAME@SHA256`), so a job and its resumes read the same bytes even if the name is
//! uploaded again. A team sees only its own directory: the team comes from the token, never from
//! the request. Deleting a name deletes its content once no other name of the team points at it;
//! a job still waiting on that content then fails at start, saying so.

use std::fs;
use std::io::{self, BufRead, BufReader, Read as _};
use std::path::{Path, PathBuf};

use rlvr_protocol::api::Dataset;
use rlvr_protocol::names::{NAME_RULE, valid_name, valid_sha256};

/// Longest line read when checking an upload is JSONL: 64 MiB (a record bigger than that is a
/// mistake, and the check must not hold a whole multi-gigabyte line in memory).
const MAX_RECORD_BYTES: usize = 64 << 20;

/// The datasets of every team.
#[derive(Debug, Clone)]
pub struct Datasets {
    root: PathBuf,
    max_bytes: u64,
}

/// Why a dataset request was refused.
#[derive(Debug, thiserror::Error)]
pub enum DatasetError {
    #[error("expected a dataset name of {NAME_RULE}")]
    BadName,
    #[error("the dataset is over {limit} bytes (tenancy.max_dataset_bytes sets the limit)")]
    TooLarge { limit: u64 },
    #[error("line {line}: {message}")]
    NotJsonl { line: u64, message: String },
    #[error("the dataset has no records; expected JSONL, one JSON object per line")]
    Empty,
    #[error("team {team} keeps {limit} datasets already (tenancy.max_datasets_per_team); delete one first")]
    TooMany { team: String, limit: u32 },
    #[error("no dataset {name:?} in team {team}")]
    NotFound { team: String, name: String },
    #[error("dataset {name:?} of team {team} no longer has content {sha256}")]
    Gone { team: String, name: String, sha256: String },
    #[error("the dataset store: {0}")]
    Io(#[from] io::Error),
}

impl Datasets {
    /// The store under `root`, taking uploads of at most `max_bytes`.
    pub fn new(root: PathBuf, max_bytes: u64) -> Self {
        Datasets { root, max_bytes }
    }

    /// The largest upload taken.
    pub fn max_bytes(&self) -> u64 {
        self.max_bytes
    }

    fn team_dir(&self, team: &str) -> PathBuf {
        // Team names come from the config (checked there): one path component.
        self.root.join(team)
    }

    fn name_file(&self, team: &str, name: &str) -> PathBuf {
        self.team_dir(team).join("names").join(format!("{name}.json"))
    }

    /// The file holding content `sha256` of `team`'s datasets.
    pub fn blob(&self, team: &str, sha256: &str) -> PathBuf {
        self.team_dir(team).join("blobs").join(format!("{sha256}.jsonl"))
    }

    /// A fresh file to receive an upload into.
    pub fn incoming(&self, team: &str) -> io::Result<PathBuf> {
        let dir = self.team_dir(team).join("incoming");
        fs::create_dir_all(&dir)?;
        let mut bytes = [0u8; 16];
        getrandom::fill(&mut bytes).map_err(io::Error::other)?;
        Ok(dir.join(hex::encode(bytes)))
    }

    /// Takes the upload received into `incoming` (its `sha256` and size computed while it came in)
    /// as dataset `name` of `team`: checks it is JSONL, moves it into place and points the name at
    /// it; also whether the name is new. `incoming` is removed whatever happens.
    pub fn finish(
        &self,
        team: &str,
        name: &str,
        incoming: &Path,
        sha256: &str,
        bytes: u64,
        max_datasets: u32,
    ) -> Result<(Dataset, bool), DatasetError> {
        let result = self.take(team, name, incoming, sha256, bytes, max_datasets);
        let _ = fs::remove_file(incoming);
        result
    }

    fn take(
        &self,
        team: &str,
        name: &str,
        incoming: &Path,
        sha256: &str,
        bytes: u64,
        max_datasets: u32,
    ) -> Result<(Dataset, bool), DatasetError> {
        if !valid_name(name) {
            return Err(DatasetError::BadName);
        }
        if bytes > self.max_bytes {
            return Err(DatasetError::TooLarge { limit: self.max_bytes });
        }
        let records = count_records(incoming)?;
        let existing = self.get(team, name)?;
        let created = existing.is_none();
        if created && self.list(team)?.len() >= max_datasets as usize {
            return Err(DatasetError::TooMany { team: team.to_owned(), limit: max_datasets });
        }
        let blob = self.blob(team, sha256);
        fs::create_dir_all(blob.parent().unwrap_or(&self.root))?;
        if !blob.exists() {
            fs::File::open(incoming)?.sync_all()?;
            fs::rename(incoming, &blob)?;
        }
        let dataset = Dataset {
            name: name.to_owned(),
            sha256: sha256.to_owned(),
            bytes,
            records,
            uploaded_at: humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string(),
        };
        let file = self.name_file(team, name);
        fs::create_dir_all(file.parent().unwrap_or(&self.root))?;
        let json = serde_json::to_vec_pretty(&dataset).map_err(io::Error::other)?;
        rlvr_protocol::fs::write_atomic(&file, &json)?;
        if let Some(old) = existing.filter(|old| old.sha256 != sha256) {
            self.drop_if_unnamed(team, &old.sha256)?;
        }
        Ok((dataset, created))
    }

    /// Dataset `name` of `team`, if there is one.
    pub fn get(&self, team: &str, name: &str) -> Result<Option<Dataset>, DatasetError> {
        if !valid_name(name) {
            return Err(DatasetError::BadName);
        }
        match fs::read(self.name_file(team, name)) {
            Ok(bytes) => Ok(Some(serde_json::from_slice(&bytes).map_err(io::Error::other)?)),
            Err(error) if error.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(error) => Err(error.into()),
        }
    }

    /// `team`'s datasets, by name.
    pub fn list(&self, team: &str) -> Result<Vec<Dataset>, DatasetError> {
        let dir = self.team_dir(team).join("names");
        let entries = match fs::read_dir(&dir) {
            Ok(entries) => entries,
            Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(error) => return Err(error.into()),
        };
        let mut datasets = Vec::new();
        for entry in entries {
            let file_name = entry?.file_name();
            let Some(name) = file_name.to_str().and_then(|name| name.strip_suffix(".json")) else { continue };
            if let Some(dataset) = self.get(team, name)? {
                datasets.push(dataset);
            }
        }
        datasets.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(datasets)
    }

    /// Deletes `name` of `team`, and its content when no other name points at it.
    pub fn delete(&self, team: &str, name: &str) -> Result<(), DatasetError> {
        let dataset = self
            .get(team, name)?
            .ok_or_else(|| DatasetError::NotFound { team: team.to_owned(), name: name.to_owned() })?;
        fs::remove_file(self.name_file(team, name))?;
        self.drop_if_unnamed(team, &dataset.sha256)
    }

    fn drop_if_unnamed(&self, team: &str, sha256: &str) -> Result<(), DatasetError> {
        if self.list(team)?.iter().all(|other| other.sha256 != sha256) {
            match fs::remove_file(self.blob(team, sha256)) {
                Ok(()) => {}
                Err(error) if error.kind() == io::ErrorKind::NotFound => {}
                Err(error) => return Err(error.into()),
            }
        }
        Ok(())
    }

    /// The content a spec's `dataset:NAME[@SHA256]` refers to: its sha256 (the name's current one
    /// when not pinned) and file.
    pub fn resolve(
        &self,
        team: &str,
        name: &str,
        sha256: Option<&str>,
    ) -> Result<(String, PathBuf), DatasetError> {
        let sha256 = match sha256 {
            Some(sha) if valid_sha256(sha) => sha.to_owned(),
            Some(_) => return Err(DatasetError::BadName),
            None => {
                self.get(team, name)?
                    .ok_or_else(|| DatasetError::NotFound { team: team.to_owned(), name: name.to_owned() })?
                    .sha256
            }
        };
        let blob = self.blob(team, &sha256);
        if !blob.is_file() {
            return Err(DatasetError::Gone { team: team.to_owned(), name: name.to_owned(), sha256 });
        }
        Ok((sha256, blob))
    }
}

/// The JSON records of a JSONL file: every non-blank line must be a JSON object.
pub fn count_records(path: &Path) -> Result<u64, DatasetError> {
    let mut reader = BufReader::new(fs::File::open(path)?);
    let mut line = Vec::new();
    let (mut number, mut records) = (0u64, 0u64);
    loop {
        line.clear();
        let read = (&mut reader).take(MAX_RECORD_BYTES as u64 + 1).read_until(b'\n', &mut line)?;
        if read == 0 {
            break;
        }
        number += 1;
        if line.len() > MAX_RECORD_BYTES {
            return Err(DatasetError::NotJsonl {
                line: number,
                message: format!("longer than {MAX_RECORD_BYTES} bytes"),
            });
        }
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        match serde_json::from_slice::<serde_json::Value>(&line) {
            Ok(serde_json::Value::Object(_)) => records += 1,
            Ok(_) => {
                return Err(DatasetError::NotJsonl {
                    line: number,
                    message: "expected a JSON object".into(),
                });
            }
            Err(error) => return Err(DatasetError::NotJsonl { line: number, message: error.to_string() }),
        }
    }
    if records == 0 {
        return Err(DatasetError::Empty);
    }
    Ok(records)
}

#[cfg(test)]
mod tests {
    use super::*;
    use sha2::{Digest, Sha256};

    fn upload(store: &Datasets, team: &str, name: &str, text: &str) -> Result<Dataset, DatasetError> {
        let incoming = store.incoming(team).unwrap();
        fs::write(&incoming, text).unwrap();
        let sha = hex::encode(Sha256::digest(text.as_bytes()));
        store.finish(team, name, &incoming, &sha, text.len() as u64, 3).map(|(dataset, _)| dataset)
    }

    #[test]
    fn datasets_are_per_team_pinned_by_content_and_checked() {
        let dir = tempfile::tempdir().unwrap();
        let store = Datasets::new(dir.path().to_owned(), 1000);
        let first =
            upload(&store, "a", "train", "{\"prompt\": \"1+1=\"}\n\n{\"prompt\": \"2+2=\"}\n").unwrap();
        assert_eq!(first.records, 2);
        // Another team's name space is another directory.
        assert!(matches!(store.resolve("b", "train", None), Err(DatasetError::NotFound { .. })));
        let (sha, path) = store.resolve("a", "train", None).unwrap();
        assert_eq!(sha, first.sha256);
        // A new upload of the name moves it; the old content goes once nothing names it.
        let second = upload(&store, "a", "train", "{\"prompt\": \"3+3=\"}\n").unwrap();
        assert!(!path.exists());
        assert!(matches!(store.resolve("a", "train", Some(&first.sha256)), Err(DatasetError::Gone { .. })));
        assert_eq!(store.resolve("a", "train", None).unwrap().0, second.sha256);
        let cases: &[(&str, &str)] = &[
            ("not json\n", "line 1: expected ident"),
            ("{\"a\": 1}\n[1, 2]\n", "line 2: expected a JSON object"),
            ("\n \n", "no records"),
        ];
        for (text, expected) in cases {
            let error = upload(&store, "a", "bad", text).unwrap_err().to_string();
            assert!(error.contains(expected), "{text:?}: {error}");
        }
        assert!(matches!(upload(&store, "a", "../x", "{}\n"), Err(DatasetError::BadName)));
        assert!(matches!(
            upload(&store, "a", "big", &"{}\n".repeat(400)),
            Err(DatasetError::TooLarge { .. })
        ));
        upload(&store, "a", "two", "{}\n").unwrap();
        upload(&store, "a", "three", "{}\n").unwrap();
        assert!(matches!(upload(&store, "a", "four", "{}\n"), Err(DatasetError::TooMany { .. })));
        assert_eq!(store.list("a").unwrap().len(), 3);
        store.delete("a", "two").unwrap();
        assert!(matches!(store.delete("a", "two"), Err(DatasetError::NotFound { .. })));
        assert!(
            fs::read_dir(dir.path().join("a/incoming")).unwrap().next().is_none(),
            "no upload left behind"
        );
    }
}
