//! Publishing a gated checkpoint (design.md §1 "Published checkpoint", §6): the one path both a
//! finished job ([`super::supervise`]) and an admin's forced promotion (`api::outcomes`) take —
//! judge, copy into the model line, write the manifest, record it on the job, deliver the
//! manifest to the job's webhook.
//!
//! Publishing is a copy into `<registry>/<model_line>/.staging-<job>/`, a manifest, then a
//! `rename` to the next free version number: a reader never sees half a checkpoint, two jobs of
//! one line never take the same version (the rename onto an existing version fails, and the
//! loser takes the next), and a job gated twice (its daemon died mid-publish) finds its own
//! version instead of publishing again.
//!
//! The steps are [`gate_and_publish`], [`record`] and [`deliver_webhook`]. Publishers of one line
//! take turns on `<line>/.publish.lock`, the lock `tenancy::lines` shares.

use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use rlvr_protocol::fs::naming;
use rlvr_protocol::gates::{Forced, GateReport, Manifest};
use rlvr_protocol::job::{JobOutput, JobState};
use rlvr_protocol::spec::JobSpec;
use rlvr_protocol::worker::Outcome;
use rlvr_queue::store::{JobStore, RecordField, StoreError};
use sha2::{Digest, Sha256};

use super::gate::judge;
use super::webhook;
use crate::tenancy::lines::{self, LineError, Lines};

/// What the gates decided.
#[derive(Debug, Clone, PartialEq)]
pub enum Verdict {
    /// Published.
    Published(Box<Published>),
    /// Refused: the failing criteria, one line each.
    Refused { reason: String, report: Box<GateReport> },
}

/// A published version.
#[derive(Debug, Clone, PartialEq)]
pub struct Published {
    /// Its number in the model line.
    pub version: u64,
    /// Its directory.
    pub path: PathBuf,
    /// The manifest written there (its report, with the override of a forced promotion).
    pub manifest: Manifest,
}

impl Published {
    /// The job record's fields that say it: the gate report and the output (the line version,
    /// what a pipeline's next stage starts from, with its directory).
    pub fn record_fields(&self) -> [RecordField; 2] {
        let output = JobOutput::Checkpoint {
            line: self.manifest.model_line.clone(),
            version: self.version,
            path: self.path.display().to_string(),
        };
        [RecordField::Gates(Box::new(self.manifest.gates.clone())), RecordField::Output(output)]
    }
}

/// Why a candidate the gates let through could not be published.
#[derive(Debug, thiserror::Error)]
pub enum PublishError {
    /// The worker's outcome names no checkpoint.
    #[error("the worker reported no checkpoint to publish")]
    NoCheckpoint,
    /// Copying into the model line failed.
    #[error("publishing to {registry}: {source}")]
    Io {
        /// The registry published to.
        registry: PathBuf,
        /// The cause.
        source: io::Error,
    },
    /// The manifest just written cannot be read back.
    #[error("{path}: {message}")]
    Manifest {
        /// `manifest.json`.
        path: PathBuf,
        /// Why.
        message: String,
    },
}

/// The model line's newest published version, if any: the baseline of the next candidate.
pub fn latest_version(spec: &JobSpec, lines: &Lines) -> Option<(u64, PathBuf)> {
    lines::versions(&lines.dir(&spec.job.model_line).ok()?).ok()?.pop()
}

/// Judges `outcome` and, when every criterion passes (or an admin forced it), publishes its
/// checkpoint into the job's model line.
///
/// The gates judged are the job's held to the line's policy as it is now (a policy tightened
/// after submit still holds), and the job's team must still be allowed to publish there: an
/// owner who took that right away after submit is obeyed.
pub fn gate_and_publish(
    spec: &JobSpec,
    job_id: &str,
    outcome: &Outcome,
    lines: &Lines,
    forced: Option<Forced>,
) -> Result<Verdict, PublishError> {
    let line_name = &spec.job.model_line;
    let io = |source: io::Error| PublishError::Io { registry: lines.registry().to_owned(), source };
    let policy = match lines.publisher(&spec.job.team, line_name, true) {
        Ok(policy) => policy,
        Err(LineError::Io(error)) => return Err(io(error)),
        Err(refused) => {
            let report = Box::new(GateReport::new(None, Vec::new()));
            return Ok(Verdict::Refused { reason: format!("job.model_line: {refused}"), report });
        }
    };
    let mut held = spec.clone();
    held.gates = spec.gates.within(&policy);
    let mut report = judge(&held, outcome);
    if !report.passed && forced.is_none() {
        return Ok(Verdict::Refused { reason: report.refusal(), report: Box::new(report) });
    }
    report.forced = forced;
    if outcome.checkpoint.as_os_str().is_empty() {
        return Err(PublishError::NoCheckpoint);
    }
    let published_at = humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string();
    let manifest = Manifest::new(job_id, spec, outcome, report, published_at);
    let line = lines.dir(line_name).map_err(|error| io(io::Error::other(error.to_string())))?;
    let (version, path) = publish(&line, &outcome.checkpoint.join("model"), manifest).map_err(io)?;
    let manifest_path = path.join("manifest.json");
    let manifest = fs::read(&manifest_path)
        .map_err(|error| error.to_string())
        .and_then(|bytes| serde_json::from_slice(&bytes).map_err(|error| error.to_string()))
        .map_err(|message| PublishError::Manifest { path: manifest_path, message })?;
    Ok(Verdict::Published(Box::new(Published { version, path, manifest })))
}

/// Records `published` on job `id`: `published`, with `reason`. A concurrent promotion that won
/// already is no error.
pub async fn record(
    store: &JobStore,
    id: &str,
    published: &Published,
    reason: &str,
) -> Result<(), StoreError> {
    match store.transition(id, JobState::Published, reason, &published.record_fields()).await {
        Ok(_) | Err(StoreError::Conflict { .. }) => Ok(()),
        Err(error) => Err(error),
    }
}

/// Delivers the manifest of `published` to the job's webhook, if it names one, through the
/// daemon's `outbound` client, and records the answer on the job (retried with backoff; a failed
/// delivery never un-publishes).
pub async fn deliver_webhook(
    store: &JobStore,
    outbound: &rlvr_outbound::Client,
    id: &str,
    spec: &JobSpec,
    published: &Published,
) {
    let Some(url) = spec.publish.as_ref().and_then(|publish| publish.webhook.as_deref()) else { return };
    let answer = webhook::deliver(outbound, url, &published.manifest).await;
    if let Err(error) = store.set_fields(id, &[RecordField::Webhook(answer)]).await {
        tracing::warn!(%error, "cannot record the webhook's answer");
    }
}

/// Copies `model` into the next version of `line` with `manifest` (its version and each file's
/// sha256 filled in).
///
/// Publishers of one line take turns (an exclusive `flock` on `<line>/.publish.lock`, released
/// by the kernel if the process dies): the check for the job's own version and the publish are
/// one step, so a job gated twice at once (a forced promotion racing another) publishes once.
///
/// Every error names the path it concerns; on any error the staging directory is removed, so a
/// full disk or a read-only registry leaves neither half a version nor the space it took.
pub fn publish(line: &Path, model: &Path, manifest: Manifest) -> io::Result<(u64, PathBuf)> {
    fs::create_dir_all(line).map_err(naming(line))?;
    let _lock = lines::lock(line).map_err(naming(line))?;
    if let Some(found) = published_by(line, &manifest.job_id).map_err(naming(line))? {
        return Ok(found);
    }
    let staging = line.join(format!(".staging-{}", manifest.job_id));
    if staging.exists() {
        fs::remove_dir_all(&staging).map_err(naming(&staging))?;
    }
    fs::create_dir(&staging).map_err(naming(&staging))?;
    let published = stage_and_rename(line, model, &staging, manifest);
    if published.is_err() {
        let _ = fs::remove_dir_all(&staging);
    }
    published
}

/// [`publish`]'s work once `staging` exists: the model's files and the manifest copied into it,
/// then renamed to the next free version.
fn stage_and_rename(
    line: &Path,
    model: &Path,
    staging: &Path,
    mut manifest: Manifest,
) -> io::Result<(u64, PathBuf)> {
    let mut entries: Vec<_> =
        fs::read_dir(model).and_then(Iterator::collect::<Result<_, _>>).map_err(naming(model))?;
    entries.sort_by_key(|entry| entry.file_name());
    for entry in entries {
        if !entry.file_type().map_err(naming(&entry.path()))?.is_file() {
            continue;
        }
        let name = entry.file_name();
        let target = staging.join(&name);
        let copied = fs::copy(entry.path(), &target)
            .and_then(|_| fs::File::open(&target)?.sync_all())
            .and_then(|()| fs::read(&target));
        let bytes = copied.map_err(naming(&target))?;
        manifest.files.insert(name.to_string_lossy().into_owned(), hex::encode(Sha256::digest(bytes)));
    }
    let mut version = next_version(line).map_err(naming(line))?;
    let manifest_path = staging.join("manifest.json");
    loop {
        manifest.version = version;
        let text = serde_json::to_string_pretty(&manifest).map_err(io::Error::other)?;
        let written = fs::File::create(&manifest_path)
            .and_then(|mut file| file.write_all(text.as_bytes()).and_then(|()| file.sync_all()));
        written.map_err(naming(&manifest_path))?;
        let target = line.join(version.to_string());
        // rename(2) onto an existing non-empty directory fails: a concurrent publisher took it.
        match fs::rename(staging, &target) {
            Ok(()) => {
                // The version is whole and visible from here: a failed fsync of the line's
                // directory (its new name may not survive a power loss) is no reason to call the
                // publication failed.
                if let Err(error) = rlvr_protocol::fs::sync_dir(line) {
                    tracing::warn!(%error, line = %line.display(), version, "cannot fsync the model line's directory");
                }
                return Ok((version, target));
            }
            Err(error) if target.exists() => {
                tracing::debug!(%error, version, "version taken by another publisher; trying the next");
                version += 1;
            }
            Err(error) => return Err(naming(&target)(error)),
        }
    }
}

fn next_version(line: &Path) -> io::Result<u64> {
    Ok(lines::versions(line)?.last().map_or(1, |(version, _)| version + 1))
}

/// The version this job published already, if it did.
fn published_by(line: &Path, job_id: &str) -> io::Result<Option<(u64, PathBuf)>> {
    /// The one field looked at: a manifest of another release still says which job made it.
    #[derive(serde::Deserialize)]
    struct MadeBy {
        job_id: String,
    }
    for (version, path) in lines::versions(line)? {
        let made_by = fs::read(path.join("manifest.json"))
            .ok()
            .and_then(|bytes| serde_json::from_slice::<MadeBy>(&bytes).ok());
        if made_by.is_some_and(|made_by| made_by.job_id == job_id) {
            return Ok(Some((version, path)));
        }
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn manifest(job_id: &str) -> Manifest {
        let spec = JobSpec::from_toml(
            "[job]\nname = \"a\"\nteam = \"t\"\nmodel_line = \"line\"\n[model]\npolicy = \"builtin:tiny-arith\"\n\
             [data]\ntrain = \"/t.jsonl\"\n[optimizer]\nplugin = \"sft\"\n[budget]\nmax_steps = 2\n",
        )
        .unwrap();
        Manifest::new(job_id, &spec, &Outcome::default(), GateReport::new(None, Vec::new()), String::new())
    }

    #[test]
    fn two_publishers_of_one_line_get_two_versions_and_a_second_gating_finds_the_first() {
        let dir = tempfile::tempdir().unwrap();
        let model = dir.path().join("model");
        fs::create_dir(&model).unwrap();
        fs::write(model.join("config.json"), "{}").unwrap();
        let line = dir.path().join("registry/line");
        let (first, _) = publish(&line, &model, manifest("JOB1")).unwrap();
        let (second, path) = publish(&line, &model, manifest("JOB2")).unwrap();
        assert_eq!((first, second), (1, 2));
        let written: Manifest =
            serde_json::from_slice(&fs::read(path.join("manifest.json")).unwrap()).unwrap();
        assert_eq!(written.version, 2);
        assert_eq!(written.files["config.json"], hex::encode(Sha256::digest(b"{}")));
        assert_eq!(publish(&line, &model, manifest("JOB1")).unwrap().0, 1);
        let names: Vec<_> = fs::read_dir(&line).unwrap().flatten().map(|e| e.file_name()).collect();
        assert_eq!(names.len(), 3, "two versions and the lock file, no staging left behind: {names:?}");
    }
}
