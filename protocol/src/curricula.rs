//! Curricula shared across jobs: the versions a job pins (`<curricula_dir>/<name>/<N>.json`),
//! written by the daemon's refresh (`rlvr-daemon`'s `curricula`) and read by the worker, whose
//! curriculum plugin starts from a pinned version's counts.
//!
//! ```text
//! CURRICULA_DIR/
//!   arith/1.json     version 1 (format: `CurriculumVersion`)
//!   arith/2.json     version 2: version 1's counts × decay, plus the records since version 1
//! ```
//! Versions are never rewritten, and a version is published whole or not at all (a temporary
//! file hard-linked to its name), so a reader needs no lock.

use std::collections::BTreeMap;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use serde::{Deserialize, Deserializer, Serialize};
use serde_json::Value;

pub use crate::names::{NAME_RULE, valid_name};

/// One version of a curriculum: `<curricula_dir>/<name>/<version>.json`.
///
/// ```json
/// {
///   "name": "arith",
///   "version": 2,
///   "created_at": "2026-11-21T02:00:00.000Z",
///   "previous": 1,
///   "decay": 0.5,
///   "records": {"count": 3, "jobs": [{"job": "01J…", "from_line": 4, "to_line": 7}]},
///   "prompts": {"p1": {"attempts": 5.0, "passes": 2.5, "pass_rate": 0.5}},
///   "skipped": [{"job": "01K…", "reason": "spec.json: expected value at line 1 column 1"}]
/// }
/// ```
///
/// Not `deny_unknown_fields`: the daemon writes these files and reads them back for as long as
/// jobs pin them, so a daemon rolled back one release must still read what a newer one wrote.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CurriculumVersion {
    /// The curriculum's name (also its directory).
    pub name: String,
    /// N: 1 for the first refresh, one more for each refresh after it.
    pub version: u64,
    /// When the refresh ran: RFC 3339, UTC, milliseconds.
    #[serde(serialize_with = "crate::time::rfc3339::serialize", deserialize_with = "parse_rfc3339")]
    pub created_at: SystemTime,
    /// The version whose counts (decayed) and line watermarks this one starts from; `null` for
    /// the first.
    pub previous: Option<u64>,
    /// The weight `previous`'s counts kept, in [0, 1].
    pub decay: f64,
    /// The rollout records added by this refresh.
    pub records: RecordsUsed,
    /// Per prompt id: `previous`'s counts × `decay`, plus this refresh's records. A prompt whose
    /// attempts decayed to exactly 0 (`decay` 0) is dropped: it has no evidence left.
    pub prompts: BTreeMap<String, PromptCounts>,
    /// Jobs of this curriculum (or of an unreadable spec) whose files could not be read this
    /// time. A skipped job keeps its watermark in `records.jobs`, so its records wait for a
    /// later refresh instead of being lost or counted twice.
    #[serde(default)]
    pub skipped: Vec<SkippedJob>,
}

/// The rollout records a version added.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RecordsUsed {
    /// Records (lines) added, over every job.
    pub count: u64,
    /// Per job of the curriculum, by job id: the lines of its `rollouts.jsonl` added,
    /// `from_line..to_line` (0-based, half-open, counting complete lines only). `to_line` is
    /// where the next refresh starts; an empty range carries a watermark forward.
    pub jobs: Vec<JobLines>,
}

/// The lines of one job's `rollouts.jsonl` a version added.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobLines {
    pub job: String,
    pub from_line: u64,
    pub to_line: u64,
}

/// A prompt's weighted counts.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct PromptCounts {
    /// Completions sampled (weighted by decay).
    pub attempts: f64,
    /// Completions that passed (weighted by decay).
    pub passes: f64,
    /// `passes / attempts`: the raw rate, no prior (a job's curriculum plugin adds its own).
    pub pass_rate: f64,
}

/// A job directory a refresh could not read, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SkippedJob {
    pub job: String,
    pub reason: String,
}

impl CurriculumVersion {
    /// The counts in the shape of the curriculum plugins' `history` key, which seeds a job's
    /// estimates from this version: `{"<prompt id>": {"passes": p, "attempts": a}}`.
    pub fn history(&self) -> Value {
        let entries = self.prompts.iter().map(|(id, counts)| {
            (id.clone(), serde_json::json!({"passes": counts.passes, "attempts": counts.attempts}))
        });
        Value::Object(entries.collect())
    }
}

/// Why a curriculum could not be refreshed or read. Each names the file at fault.
#[derive(Debug, thiserror::Error)]
pub enum CurriculaError {
    #[error("curriculum name {name:?}: expected {NAME_RULE}")]
    InvalidName { name: String },
    #[error("decay {decay}: expected a number in [0, 1]")]
    InvalidDecay { decay: f64 },
    /// A file or directory that could not be read or written.
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: io::Error },
    /// A complete line of a rollouts file that is not a rollout record; `line` is 1-based.
    #[error("{path}:{line}: {message}")]
    MalformedRecord { path: PathBuf, line: u64, message: String },
    /// A version file that does not hold the version its name says.
    #[error("{path}: {message}")]
    Corrupt { path: PathBuf, message: String },
    #[error("curriculum {name} has no version {version} ({path} does not exist)")]
    NoSuchVersion { name: String, version: u64, path: PathBuf },
    #[error("{dir}: gave up after {attempts} attempts: other refreshes kept publishing the next version")]
    Contended { dir: PathBuf, attempts: u32 },
}

pub fn io_error(path: &Path) -> impl FnOnce(io::Error) -> CurriculaError + '_ {
    move |source| CurriculaError::Io { path: path.to_owned(), source }
}

pub fn check_name(name: &str) -> Result<(), CurriculaError> {
    if valid_name(name) { Ok(()) } else { Err(CurriculaError::InvalidName { name: name.to_owned() }) }
}

pub fn version_path(curricula_dir: &Path, name: &str, version: u64) -> PathBuf {
    curricula_dir.join(name).join(format!("{version}.json"))
}

/// Version `version` of curriculum `name`.
pub fn load(curricula_dir: &Path, name: &str, version: u64) -> Result<CurriculumVersion, CurriculaError> {
    check_name(name)?;
    let path = version_path(curricula_dir, name, version);
    let bytes = match fs::read(&path) {
        Ok(bytes) => bytes,
        Err(error) if error.kind() == io::ErrorKind::NotFound => {
            return Err(CurriculaError::NoSuchVersion { name: name.to_owned(), version, path });
        }
        Err(source) => return Err(CurriculaError::Io { path, source }),
    };
    let corrupt = |message: String| CurriculaError::Corrupt { path: path.clone(), message };
    let loaded: CurriculumVersion =
        serde_json::from_slice(&bytes).map_err(|error| corrupt(error.to_string()))?;
    if loaded.name != name || loaded.version != version {
        return Err(corrupt(format!(
            "holds curriculum {} version {}, expected {name} version {version}",
            loaded.name, loaded.version
        )));
    }
    Ok(loaded)
}

/// The newest version of curriculum `name`; `None` before its first refresh.
pub fn latest(curricula_dir: &Path, name: &str) -> Result<Option<CurriculumVersion>, CurriculaError> {
    latest_number(curricula_dir, name)?.map(|version| load(curricula_dir, name, version)).transpose()
}

/// The number of the newest version of curriculum `name`, without reading it (what admission
/// pins); `None` before its first refresh.
pub fn latest_number(curricula_dir: &Path, name: &str) -> Result<Option<u64>, CurriculaError> {
    check_name(name)?;
    let dir = curricula_dir.join(name);
    let entries = match fs::read_dir(&dir) {
        Ok(entries) => entries,
        Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(source) => return Err(CurriculaError::Io { path: dir, source }),
    };
    let mut newest = None;
    for entry in entries {
        let entry = entry.map_err(io_error(&dir))?;
        // Temporary files start with '.', so only published versions parse.
        if let Some(version) = entry.file_name().to_str().and_then(parse_version_file_name) {
            newest = newest.max(Some(version));
        }
    }
    Ok(newest)
}

/// `12.json` → 12; anything else (temporary files, `012.json`, `0.json`) → `None`.
pub fn parse_version_file_name(file_name: &str) -> Option<u64> {
    let digits = file_name.strip_suffix(".json")?;
    let canonical =
        !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()) && !digits.starts_with('0');
    if canonical { digits.parse().ok() } else { None }
}

fn parse_rfc3339<'de, D: Deserializer<'de>>(deserializer: D) -> Result<SystemTime, D::Error> {
    let text = String::deserialize(deserializer)?;
    humantime::parse_rfc3339(&text).map_err(serde::de::Error::custom)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn version_file_names_parse_strictly() {
        let cases = [
            ("1.json", Some(1)),
            ("12.json", Some(12)),
            ("0.json", None),
            ("012.json", None),
            (".tmpX.json.tmp", None),
        ];
        for (name, expected) in cases {
            assert_eq!(parse_version_file_name(name), expected, "{name}");
        }
        assert_eq!(parse_version_file_name(".json"), None);
        assert_eq!(parse_version_file_name("1.json.tmp"), None);
    }
}
