//! The end of training: the candidate against the job's gates, and publishing a checkpoint that
//! passes (design.md §6, §1 "Published checkpoint").
//!
//! This is the first criterion of §6 — held-out gain over the starting point, from the worker's
//! own greedy scoring — and the atomic publish. The other criteria (canaries, KL, length, verifier
//! health, reward hacking) join this table as they are built; a criterion a job cannot be judged
//! on is reported as "not checked", never as passed silently.
//!
//! Publishing is a copy into `<registry>/<model_line>/.staging-<job>/`, a manifest, then a
//! `rename` to the next free version number: a reader never sees half a checkpoint, two jobs of
//! one line never take the same version (the rename onto an existing version fails, and the
//! loser takes the next), and a job gated twice (its daemon died mid-publish) finds its own
//! version instead of publishing again.

use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use rlvr_queue::spec::JobSpec;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

/// One criterion's line of the gate table.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Criterion {
    pub name: String,
    pub passed: bool,
    pub measured: Option<f64>,
    pub threshold: Option<f64>,
    pub note: String,
}

/// What the gates decided.
#[derive(Debug, Clone, PartialEq)]
pub enum Verdict {
    /// Published as this version, at this path.
    Published { version: u64, path: PathBuf, table: Vec<Criterion> },
    /// Refused: the failing criteria, one line each.
    Refused { reason: String, table: Vec<Criterion> },
}

/// Judges the worker's `outcome` (its stdout JSON) by `spec`'s gates (pure).
pub fn judge(spec: &JobSpec, outcome: &Value) -> Vec<Criterion> {
    let before = outcome.get("heldout_before").and_then(Value::as_f64);
    let after = outcome.get("heldout_after").and_then(Value::as_f64);
    let threshold = spec.gates.heldout_gain_min.unwrap_or(0.0);
    let heldout = match (before, after) {
        (Some(before), Some(after)) => Criterion {
            name: "heldout_gain".into(),
            passed: after - before >= threshold,
            measured: Some(after - before),
            threshold: Some(threshold),
            note: format!("held-out accuracy {before:.4} → {after:.4}"),
        },
        _ if spec.data.heldout.is_none() && spec.gates.heldout_gain_min.is_none() => Criterion {
            name: "heldout_gain".into(),
            passed: true,
            measured: None,
            threshold: None,
            note: "not checked: the job has no data.heldout".into(),
        },
        _ => Criterion {
            name: "heldout_gain".into(),
            passed: false,
            measured: None,
            threshold: Some(threshold),
            note: "no held-out score before and after training".into(),
        },
    };
    vec![heldout]
}

/// Judges and, when every criterion passes, publishes the checkpoint of `outcome`.
pub fn evaluate(
    spec: &JobSpec,
    job_id: &str,
    outcome: &Value,
    default_registry: &Path,
) -> Result<Verdict, String> {
    let table = judge(spec, outcome);
    let failed: Vec<String> = table
        .iter()
        .filter(|criterion| !criterion.passed)
        .map(|criterion| match (criterion.measured, criterion.threshold) {
            (Some(measured), Some(threshold)) => {
                format!("{}: {measured:.4} < {threshold} ({})", criterion.name, criterion.note)
            }
            _ => format!("{}: {}", criterion.name, criterion.note),
        })
        .collect();
    if !failed.is_empty() {
        return Ok(Verdict::Refused { reason: format!("gates refused: {}", failed.join("; ")), table });
    }
    let registry = spec.publish.as_ref().map_or_else(|| default_registry.to_owned(), |p| p.registry.clone());
    let checkpoint = outcome
        .get("checkpoint")
        .and_then(Value::as_str)
        .filter(|path| !path.is_empty())
        .ok_or("the worker reported no checkpoint to publish")?;
    let manifest = json!({
        "job_id": job_id,
        "model_line": spec.job.model_line,
        "step": outcome.get("steps"),
        "weights_sha256": outcome.get("weights_sha256"),
        "heldout_before": outcome.get("heldout_before"),
        "heldout_after": outcome.get("heldout_after"),
        "gates": table,
        "spec": spec,
    });
    let (version, path) =
        publish(&registry.join(&spec.job.model_line), job_id, &Path::new(checkpoint).join("model"), manifest)
            .map_err(|error| format!("publishing to {}: {error}", registry.display()))?;
    Ok(Verdict::Published { version, path, table })
}

/// Copies `model` into the next version of `line` with `manifest` (plus each file's sha256).
fn publish(line: &Path, job_id: &str, model: &Path, mut manifest: Value) -> io::Result<(u64, PathBuf)> {
    fs::create_dir_all(line)?;
    if let Some(found) = published_by(line, job_id)? {
        return Ok(found);
    }
    let staging = line.join(format!(".staging-{job_id}"));
    if staging.exists() {
        fs::remove_dir_all(&staging)?;
    }
    fs::create_dir(&staging)?;
    let mut files = serde_json::Map::new();
    let mut entries: Vec<_> = fs::read_dir(model)?.collect::<Result<_, _>>()?;
    entries.sort_by_key(|entry| entry.file_name());
    for entry in entries {
        if !entry.file_type()?.is_file() {
            continue;
        }
        let name = entry.file_name();
        let target = staging.join(&name);
        fs::copy(entry.path(), &target)?;
        fs::File::open(&target)?.sync_all()?;
        files.insert(
            name.to_string_lossy().into_owned(),
            json!(hex::encode(Sha256::digest(fs::read(&target)?))),
        );
    }
    manifest["files"] = Value::Object(files);
    let mut version = next_version(line)?;
    loop {
        manifest["version"] = json!(version);
        let mut file = fs::File::create(staging.join("manifest.json"))?;
        file.write_all(serde_json::to_string_pretty(&manifest).map_err(io::Error::other)?.as_bytes())?;
        file.sync_all()?;
        let target = line.join(version.to_string());
        // rename(2) onto an existing non-empty directory fails: a concurrent publisher took it.
        match fs::rename(&staging, &target) {
            Ok(()) => {
                fs::File::open(line)?.sync_all()?;
                return Ok((version, target));
            }
            Err(error) if target.exists() => {
                tracing::debug!(%error, version, "version taken by another publisher; trying the next");
                version += 1;
            }
            Err(error) => return Err(error),
        }
    }
}

/// Published versions of a line, by number.
fn versions(line: &Path) -> io::Result<Vec<(u64, PathBuf)>> {
    let mut found = Vec::new();
    for entry in fs::read_dir(line)? {
        let entry = entry?;
        if let Some(version) = entry.file_name().to_str().and_then(|name| name.parse::<u64>().ok()) {
            found.push((version, entry.path()));
        }
    }
    found.sort();
    Ok(found)
}

fn next_version(line: &Path) -> io::Result<u64> {
    Ok(versions(line)?.last().map_or(1, |(version, _)| version + 1))
}

/// The version this job published already, if it did.
fn published_by(line: &Path, job_id: &str) -> io::Result<Option<(u64, PathBuf)>> {
    for (version, path) in versions(line)? {
        let manifest =
            fs::read(path.join("manifest.json")).ok().and_then(|b| serde_json::from_slice::<Value>(&b).ok());
        if manifest.as_ref().and_then(|m| m.get("job_id")).and_then(Value::as_str) == Some(job_id) {
            return Ok(Some((version, path)));
        }
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(extra: &str) -> JobSpec {
        JobSpec::from_toml(&format!(
            "[job]\nname = \"a\"\nteam = \"t\"\nmodel_line = \"line\"\n[model]\npolicy = \"builtin:tiny-arith\"\n\
             [data]\ntrain = \"/t.jsonl\"\nheldout = \"/h.jsonl\"\n[optimizer]\nplugin = \"grpo\"\n[budget]\nmax_steps = 2\n{extra}"
        ))
        .unwrap()
    }

    #[test]
    fn heldout_gain_is_judged_against_its_threshold() {
        let cases = [
            ("", 0.20, 0.30, true),
            ("", 0.30, 0.20, false),
            ("[gates]\nheldout_gain_min = 0.15\n", 0.20, 0.30, false),
            ("[gates]\nheldout_gain_min = 0.05\n", 0.20, 0.30, true),
        ];
        for (extra, before, after, passed) in cases {
            let table = judge(&spec(extra), &json!({"heldout_before": before, "heldout_after": after}));
            assert_eq!(table[0].passed, passed, "{extra} {before} → {after}");
        }
        let table = judge(&spec(""), &json!({"heldout_before": 0.2}));
        assert!(!table[0].passed, "a missing score is never a pass");
    }

    #[test]
    fn two_publishers_of_one_line_get_two_versions_and_a_second_gating_finds_the_first() {
        let dir = tempfile::tempdir().unwrap();
        let model = dir.path().join("model");
        fs::create_dir(&model).unwrap();
        fs::write(model.join("config.json"), "{}").unwrap();
        let line = dir.path().join("registry/line");
        let (first, _) = publish(&line, "JOB1", &model, json!({"job_id": "JOB1"})).unwrap();
        let (second, path) = publish(&line, "JOB2", &model, json!({"job_id": "JOB2"})).unwrap();
        assert_eq!((first, second), (1, 2));
        let manifest: Value = serde_json::from_slice(&fs::read(path.join("manifest.json")).unwrap()).unwrap();
        assert_eq!(manifest["version"], 2);
        assert_eq!(manifest["files"]["config.json"], hex::encode(Sha256::digest(b"{}")));
        assert_eq!(publish(&line, "JOB1", &model, json!({"job_id": "JOB1"})).unwrap().0, 1);
        let names: Vec<_> = fs::read_dir(&line).unwrap().flatten().map(|e| e.file_name()).collect();
        assert_eq!(names.len(), 2, "no staging left behind: {names:?}");
    }
}
