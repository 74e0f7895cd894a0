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
//! the request.
//!
//! Content is never deleted when a name moves or goes: only [`Datasets::sweep`] deletes it, and
//! only content that no name points at, that nothing the caller says still cites (a queued or
//! running job, a running pipeline, a published version: `super::sweep`), and that was neither
//! uploaded nor resolved within the grace period (a submit between resolving a name and its job
//! reaching Redis). Every change to a team's names and blobs holds the team's lock.

use std::fs;
use std::io::{self, BufRead, BufReader, Read as _};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use rlvr_protocol::api::Dataset;
use rlvr_protocol::names::{NAME_RULE, valid_name, valid_sha256};
use std::collections::{BTreeSet, HashMap};

/// Longest line read when checking an upload is JSONL: 64 MiB (a record bigger than that is a
/// mistake, and the check must not hold a whole multi-gigabyte line in memory).
const MAX_RECORD_BYTES: usize = 64 << 20;

/// The least time an upload stays in `incoming/` before a sweep takes it for dead.
const INCOMING_KEPT: Duration = Duration::from_secs(3600);

/// The datasets of every team.
#[derive(Debug, Clone)]
pub struct Datasets {
    root: PathBuf,
    max_bytes: u64,
    /// One lock per team, held by whatever changes its names or blobs: an upload's check of the
    /// name, its rename and the name's pointer are one step, and a sweep never deletes content a
    /// name is being pointed at.
    locks: Arc<Mutex<HashMap<String, Arc<Mutex<()>>>>>,
}

/// A team's content on disk, as a sweep sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Blob {
    pub sha256: String,
    pub bytes: u64,
    /// Its last upload or resolve.
    pub used: SystemTime,
}

/// What a sweep of one team did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Swept {
    /// Content deleted: no name, nothing citing it, unused for the grace period.
    pub deleted: Vec<Blob>,
    /// Content no name points at, kept because something cites it or it was used lately.
    pub kept_unnamed: Vec<Blob>,
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
        Datasets { root, max_bytes, locks: Arc::default() }
    }

    /// `f`, holding `team`'s lock.
    fn locked<T>(&self, team: &str, f: impl FnOnce() -> T) -> T {
        let lock = {
            let mut locks = self.locks.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            locks.entry(team.to_owned()).or_default().clone()
        };
        let _held = lock.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        f()
    }

    /// The teams that have a dataset directory.
    pub fn teams(&self) -> io::Result<Vec<String>> {
        super::directories_in(&self.root)
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
        // The content's check (a read of up to max_bytes) before the lock, which other uploads of
        // the team wait for.
        let checked = self.check_upload(name, incoming, bytes);
        let result = checked.and_then(|records| {
            self.locked(team, || -> Result<(Dataset, bool), DatasetError> {
                let created = self.get(team, name)?.is_none();
                if created && self.list(team)?.len() >= max_datasets as usize {
                    return Err(DatasetError::TooMany { team: team.to_owned(), limit: max_datasets });
                }
                self.store_blob(team, incoming, sha256)?;
                let dataset = Dataset {
                    name: name.to_owned(),
                    sha256: sha256.to_owned(),
                    bytes,
                    records,
                    uploaded_at: now_rfc3339(),
                };
                let file = self.name_file(team, name);
                fs::create_dir_all(file.parent().unwrap_or(&self.root))?;
                let json = serde_json::to_vec_pretty(&dataset).map_err(io::Error::other)?;
                // The content the name pointed at before stays: a job may have pinned it (a sweep
                // deletes it once nothing does).
                rlvr_protocol::fs::write_atomic(&file, &json)?;
                Ok((dataset, created))
            })
        });
        let _ = fs::remove_file(incoming);
        result
    }

    /// A dry run's upload: checks the upload received into `incoming` as [`finish`](Self::finish)
    /// does and keeps its content, so that a spec checked against `dataset:NAME@SHA256` finds it,
    /// but points no name at it: the team's names stay as they were. The content stays until a
    /// sweep finds it unnamed, uncited and unused for the grace period. `incoming` is removed
    /// whatever happens.
    pub fn keep_content(
        &self,
        team: &str,
        name: &str,
        incoming: &Path,
        sha256: &str,
        bytes: u64,
    ) -> Result<Dataset, DatasetError> {
        let result = (|| {
            let records = self.check_upload(name, incoming, bytes)?;
            self.locked(team, || self.store_blob(team, incoming, sha256))?;
            Ok(Dataset {
                name: name.to_owned(),
                sha256: sha256.to_owned(),
                bytes,
                records,
                uploaded_at: now_rfc3339(),
            })
        })();
        let _ = fs::remove_file(incoming);
        result
    }

    /// The name and size checks of an upload, and its records.
    fn check_upload(&self, name: &str, incoming: &Path, bytes: u64) -> Result<u64, DatasetError> {
        if !valid_name(name) {
            return Err(DatasetError::BadName);
        }
        if bytes > self.max_bytes {
            return Err(DatasetError::TooLarge { limit: self.max_bytes });
        }
        count_records(incoming)
    }

    /// Moves `incoming` into place as content `sha256` of `team`, unless that content is there
    /// already; either way the content counts as used now. Under the team's lock.
    fn store_blob(&self, team: &str, incoming: &Path, sha256: &str) -> Result<(), DatasetError> {
        let blob = self.blob(team, sha256);
        fs::create_dir_all(blob.parent().unwrap_or(&self.root))?;
        if blob.exists() {
            mark_used(&blob)?;
        } else {
            fs::File::open(incoming)?.sync_all()?;
            fs::rename(incoming, &blob)?;
            mark_used(&blob)?;
        }
        Ok(())
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
        let mut datasets = Vec::new();
        for entry in super::entries_of(&self.team_dir(team).join("names"))? {
            let file_name = entry.file_name();
            let Some(name) = file_name.to_str().and_then(|name| name.strip_suffix(".json")) else { continue };
            if let Some(dataset) = self.get(team, name)? {
                datasets.push(dataset);
            }
        }
        datasets.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(datasets)
    }

    /// Deletes the name `name` of `team`. Its content stays until a sweep finds nothing citing
    /// it: a job that pinned it still reads it.
    pub fn delete(&self, team: &str, name: &str) -> Result<(), DatasetError> {
        if !valid_name(name) {
            return Err(DatasetError::BadName);
        }
        match self.locked(team, || fs::remove_file(self.name_file(team, name))) {
            Ok(()) => Ok(()),
            Err(error) if error.kind() == io::ErrorKind::NotFound => {
                Err(DatasetError::NotFound { team: team.to_owned(), name: name.to_owned() })
            }
            Err(error) => Err(error.into()),
        }
    }

    /// `team`'s content on disk.
    fn blobs(&self, team: &str) -> io::Result<Vec<Blob>> {
        let mut blobs = Vec::new();
        for entry in super::entries_of(&self.team_dir(team).join("blobs"))? {
            let file_name = entry.file_name();
            let Some(sha256) = file_name.to_str().and_then(|name| name.strip_suffix(".jsonl")) else {
                continue;
            };
            if !valid_sha256(sha256) {
                continue;
            }
            let meta = entry.metadata()?;
            blobs.push(Blob { sha256: sha256.to_owned(), bytes: meta.len(), used: meta.modified()? });
        }
        blobs.sort_by(|a, b| a.sha256.cmp(&b.sha256));
        Ok(blobs)
    }

    /// Deletes `team`'s content that no name points at, `cited` does not name, and nothing
    /// uploaded or resolved within `grace` of `now`; and uploads left in `incoming/` by a
    /// request that died (older than `grace`). Under the team's lock.
    pub fn sweep(
        &self,
        team: &str,
        cited: &BTreeSet<String>,
        now: SystemTime,
        grace: Duration,
    ) -> Result<Swept, DatasetError> {
        self.locked(team, || -> Result<Swept, DatasetError> {
            let named: BTreeSet<String> =
                self.list(team)?.into_iter().map(|dataset| dataset.sha256).collect();
            let blobs = self.blobs(team)?;
            let mut swept = Swept::default();
            for blob in blobs {
                match keep(&blob, &named, cited, now, grace) {
                    Keep::Named => {}
                    Keep::Cited | Keep::Recent => swept.kept_unnamed.push(blob),
                    Keep::No => match fs::remove_file(self.blob(team, &blob.sha256)) {
                        Ok(()) => swept.deleted.push(blob),
                        Err(error) if error.kind() == io::ErrorKind::NotFound => {}
                        Err(error) => return Err(error.into()),
                    },
                }
            }
            self.sweep_incoming(team, now, grace)?;
            Ok(swept)
        })
    }

    /// Removes uploads older than `grace` (and than [`INCOMING_KEPT`]) from `team`'s `incoming/`:
    /// a request that died mid-way or a daemon killed while receiving left them.
    fn sweep_incoming(&self, team: &str, now: SystemTime, grace: Duration) -> io::Result<()> {
        // Never sooner than an hour: an upload being checked writes nothing, so with a grace of
        // seconds its file would look dead while a large one is still read.
        let grace = grace.max(INCOMING_KEPT);
        for entry in super::entries_of(&self.team_dir(team).join("incoming"))? {
            let modified = entry.metadata()?.modified()?;
            if now.duration_since(modified).is_ok_and(|age| age > grace) {
                match fs::remove_file(entry.path()) {
                    Ok(()) => {}
                    Err(error) if error.kind() == io::ErrorKind::NotFound => {}
                    Err(error) => return Err(error),
                }
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
        // Used now: a sweep keeps it through the grace period, the time a submit takes to put
        // its job (which cites it from then on) into Redis.
        match self.locked(team, || mark_used(&blob)) {
            Ok(()) => Ok((sha256, blob)),
            Err(error) if error.kind() == io::ErrorKind::NotFound => {
                Err(DatasetError::Gone { team: team.to_owned(), name: name.to_owned(), sha256 })
            }
            Err(error) => Err(error.into()),
        }
    }
}

/// Why a sweep keeps content, or not.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Keep {
    /// A name of the team points at it.
    Named,
    /// A job, pipeline or published version cites it.
    Cited,
    /// Uploaded or resolved within the grace period.
    Recent,
    /// None of these: deleted.
    No,
}

/// The sweep's rule for one blob.
fn keep(
    blob: &Blob,
    named: &BTreeSet<String>,
    cited: &BTreeSet<String>,
    now: SystemTime,
    grace: Duration,
) -> Keep {
    if named.contains(&blob.sha256) {
        Keep::Named
    } else if cited.contains(&blob.sha256) {
        Keep::Cited
    } else if now.duration_since(blob.used).map_or(true, |age| age <= grace) {
        // A time in the future (a clock set back) counts as recent: keeping is the safe side.
        Keep::Recent
    } else {
        Keep::No
    }
}

/// Sets `blob`'s modification time to now: the time a sweep reads as its last use.
fn mark_used(blob: &Path) -> io::Result<()> {
    fs::File::options().write(true).open(blob)?.set_modified(SystemTime::now())
}

fn now_rfc3339() -> String {
    humantime::format_rfc3339_seconds(SystemTime::now()).to_string()
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

    fn sha(text: &str) -> String {
        hex::encode(Sha256::digest(text.as_bytes()))
    }

    fn upload(store: &Datasets, team: &str, name: &str, text: &str) -> Result<Dataset, DatasetError> {
        let incoming = store.incoming(team).unwrap();
        fs::write(&incoming, text).unwrap();
        store.finish(team, name, &incoming, &sha(text), text.len() as u64, 3).map(|(dataset, _)| dataset)
    }

    /// A sweep as if `later` had passed since every use.
    fn sweep_after(store: &Datasets, team: &str, cited: &[&str], later: Duration) -> Swept {
        let cited = cited.iter().map(|sha| sha.to_string()).collect();
        store.sweep(team, &cited, SystemTime::now() + later, Duration::from_secs(60)).unwrap()
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
        // A new upload of the name moves it; the old content stays for whoever pinned it, until
        // a sweep finds nothing citing it.
        let second = upload(&store, "a", "train", "{\"prompt\": \"3+3=\"}\n").unwrap();
        assert_eq!(store.resolve("a", "train", None).unwrap().0, second.sha256);
        assert_eq!(store.resolve("a", "train", Some(&first.sha256)).unwrap().1, path);
        let swept = sweep_after(&store, "a", &[], Duration::from_secs(3600));
        assert_eq!(
            swept.deleted.iter().map(|blob| blob.sha256.as_str()).collect::<Vec<_>>(),
            [first.sha256.as_str()]
        );
        assert!(!path.exists());
        assert!(matches!(store.resolve("a", "train", Some(&first.sha256)), Err(DatasetError::Gone { .. })));
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
        assert!(matches!(store.delete("a", "../train"), Err(DatasetError::BadName)));
        assert!(
            fs::read_dir(dir.path().join("a/incoming")).unwrap().next().is_none(),
            "no upload left behind"
        );
    }

    #[test]
    fn a_sweep_keeps_named_cited_and_recent_content_and_deletes_the_rest() {
        let now = SystemTime::now();
        let grace = Duration::from_secs(60);
        let blob = |sha: &str, age_s: u64| Blob {
            sha256: sha.into(),
            bytes: 1,
            used: now - Duration::from_secs(age_s),
        };
        let named: BTreeSet<String> = ["n".to_owned()].into();
        let cited: BTreeSet<String> = ["c".to_owned()].into();
        let cases = [
            (blob("n", 7200), Keep::Named),
            (blob("c", 7200), Keep::Cited),
            (blob("r", 30), Keep::Recent),
            (blob("r", 60), Keep::Recent),
            (blob("o", 61), Keep::No),
            // A use in the future (a clock set back) is recent: keeping is the safe side.
            (Blob { sha256: "f".into(), bytes: 1, used: now + Duration::from_secs(600) }, Keep::Recent),
        ];
        for (blob, expected) in cases {
            assert_eq!(keep(&blob, &named, &cited, now, grace), expected, "{blob:?}");
        }
    }

    #[test]
    fn a_dry_runs_upload_points_no_name_and_pinned_content_outlives_its_name() {
        let dir = tempfile::tempdir().unwrap();
        let store = Datasets::new(dir.path().to_owned(), 1 << 20);
        let pinned = upload(&store, "a", "sft", "{\"prompt\": \"p\"}\n").unwrap();
        // A dry run of another spec sends other content under the same name: checked and kept,
        // the name untouched.
        let text = "{\"prompt\": \"q\"}\n";
        let incoming = store.incoming("a").unwrap();
        fs::write(&incoming, text).unwrap();
        let checked = store.keep_content("a", "sft", &incoming, &sha(text), text.len() as u64).unwrap();
        assert_eq!((checked.name.as_str(), checked.records), ("sft", 1));
        assert!(!incoming.exists());
        assert_eq!(store.get("a", "sft").unwrap().unwrap().sha256, pinned.sha256);
        assert!(store.resolve("a", "sft", Some(&checked.sha256)).is_ok());
        let incoming = store.incoming("a").unwrap();
        fs::write(&incoming, "not json\n").unwrap();
        assert!(matches!(
            store.keep_content("a", "sft", &incoming, &sha("x"), 9),
            Err(DatasetError::NotJsonl { .. })
        ));
        assert!(!incoming.exists());

        // The name deleted: a job that pinned its content still cites it, so a sweep keeps it;
        // the dry run's content, cited by nothing, goes once the grace period has passed.
        store.delete("a", "sft").unwrap();
        assert!(
            sweep_after(&store, "a", &[], Duration::ZERO).deleted.is_empty(),
            "used within the grace period"
        );
        let swept = sweep_after(&store, "a", &[&pinned.sha256], Duration::from_secs(3600));
        assert_eq!(swept.deleted.iter().map(|blob| &blob.sha256).collect::<Vec<_>>(), [&checked.sha256]);
        assert_eq!(swept.kept_unnamed.iter().map(|blob| &blob.sha256).collect::<Vec<_>>(), [&pinned.sha256]);
        assert!(store.resolve("a", "sft", Some(&pinned.sha256)).is_ok());
        // Nothing cites it any more: gone at the next sweep.
        let swept = sweep_after(&store, "a", &[], Duration::from_secs(3600));
        assert_eq!(swept.deleted.len(), 1);
        assert!(fs::read_dir(dir.path().join("a/blobs")).unwrap().next().is_none());
    }

    #[test]
    fn an_upload_that_died_is_swept_from_incoming_after_the_grace_period() {
        let dir = tempfile::tempdir().unwrap();
        let store = Datasets::new(dir.path().to_owned(), 1 << 20);
        let incoming = store.incoming("a").unwrap();
        fs::write(&incoming, "{\"prompt\": \"half").unwrap();
        sweep_after(&store, "a", &[], Duration::from_secs(1800));
        assert!(incoming.exists(), "an upload younger than an hour stays, whatever the grace period");
        sweep_after(&store, "a", &[], Duration::from_secs(7200));
        assert!(!incoming.exists());
        assert_eq!(store.teams().unwrap(), ["a"]);
    }

    #[test]
    fn concurrent_uploads_of_one_name_all_succeed_and_leave_one_name_and_no_upload_behind() {
        let dir = tempfile::tempdir().unwrap();
        let store = Datasets::new(dir.path().to_owned(), 1 << 20);
        let texts: Vec<String> = (0..20).map(|i| format!("{{\"prompt\": \"{i}\"}}\n")).collect();
        std::thread::scope(|scope| {
            for text in &texts {
                let store = &store;
                scope.spawn(move || upload(store, "a", "train", text).unwrap());
            }
        });
        let named = store.get("a", "train").unwrap().unwrap();
        assert!(texts.iter().any(|text| sha(text) == named.sha256));
        assert_eq!(store.list("a").unwrap().len(), 1);
        assert_eq!(
            fs::read_dir(dir.path().join("a/blobs")).unwrap().count(),
            20,
            "every content kept until a sweep"
        );
        assert!(fs::read_dir(dir.path().join("a/incoming")).unwrap().next().is_none());
        assert_eq!(sweep_after(&store, "a", &[], Duration::from_secs(3600)).deleted.len(), 19);
    }
}
