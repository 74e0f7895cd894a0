//! The end of training: the candidate against the job's gates, and publishing a checkpoint that
//! passes (design.md §6, §1 "Published checkpoint").
//!
//! [`judge`] is pure: the worker's outcome (its gate evaluation of the candidate and of the
//! baseline — the model line's published version, or the job's starting checkpoint for the
//! first — on the held-out and canary sets, plus training's trend) and the spec's `[gates]` in,
//! one line per criterion out. A criterion a job cannot be judged on (no canaries, say) is
//! reported as "not checked", never passed silently when its threshold was asked for.
//!
//! Publishing is a copy into `<registry>/<model_line>/.staging-<job>/`, a manifest, then a
//! `rename` to the next free version number: a reader never sees half a checkpoint, two jobs of
//! one line never take the same version (the rename onto an existing version fails, and the
//! loser takes the next), and a job gated twice (its daemon died mid-publish) finds its own
//! version instead of publishing again.

use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use rlvr_protocol::spec::JobSpec;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

/// The defaults of `[gates]` (design.md §6): a candidate must not score worse on the held-out
/// set, must not break a canary the baseline passed, must not double its completion length, and
/// its verifiers must have answered (errors and timeouts each ≤ 5%). KL has no default: its
/// scale depends on the estimator and the task; unset, it is measured and shown only.
pub const HELDOUT_GAIN_MIN: f64 = 0.0;
pub const CANARY_REGRESSIONS_MAX: u32 = 0;
pub const LENGTH_RATIO_MAX: f64 = 2.0;
pub const VERIFIER_ERROR_RATE_MAX: f64 = 0.05;
pub const VERIFIER_TIMEOUT_RATE_MAX: f64 = 0.05;

/// One criterion's line of the gate table.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Criterion {
    pub name: String,
    pub passed: bool,
    pub measured: Option<f64>,
    pub threshold: Option<f64>,
    /// How measured compares with threshold to pass: `>=` or `<=`.
    pub op: String,
    pub note: String,
}

impl Criterion {
    fn new(name: &str, op: &str, measured: Option<f64>, threshold: Option<f64>, note: String) -> Self {
        let passed = match (measured, threshold) {
            (Some(measured), Some(threshold)) if op == ">=" => measured >= threshold,
            (Some(measured), Some(threshold)) => measured <= threshold,
            // Nothing asked for: shown, not judged.
            (_, None) => true,
            // Asked for and not measurable: never a pass.
            (None, Some(_)) => false,
        };
        Criterion { name: name.to_owned(), passed, measured, threshold, op: op.to_owned(), note }
    }

    /// `heldout_gain: -0.0200 < 0 (held-out accuracy 0.3100 → 0.2900)`.
    pub fn failure(&self) -> String {
        match (self.measured, self.threshold) {
            (Some(measured), Some(threshold)) => {
                let broken = if self.op == ">=" { "<" } else { ">" };
                format!("{}: {measured:.4} {broken} {threshold} ({})", self.name, self.note)
            }
            _ => format!("{}: {}", self.name, self.note),
        }
    }
}

/// An admin's promotion of a refused candidate, recorded in the manifest.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Forced {
    /// The admin token's team.
    pub by: String,
    pub reason: String,
    /// RFC 3339.
    pub at: String,
}

/// The gate report stored with the job (`gates`) and in the manifest.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct GateReport {
    /// Every criterion passed.
    pub passed: bool,
    /// What the candidate was compared with (`kind` `published` or `start`, `model`, `version`).
    pub baseline: Value,
    pub criteria: Vec<Criterion>,
    #[serde(default)]
    pub forced: Option<Forced>,
}

impl GateReport {
    /// The refusal: each failing criterion with its measured value and threshold.
    pub fn refusal(&self) -> String {
        let failed: Vec<String> =
            self.criteria.iter().filter(|criterion| !criterion.passed).map(Criterion::failure).collect();
        format!("gates refused: {}", failed.join("; "))
    }
}

/// What the gates decided.
#[derive(Debug, Clone, PartialEq)]
pub enum Verdict {
    /// Published as this version, at this path, with this manifest.
    Published { version: u64, path: PathBuf, report: GateReport, manifest: Value },
    /// Refused: the failing criteria, one line each.
    Refused { reason: String, report: GateReport },
}

/// Judges the worker's `outcome` (its stdout JSON) by `spec`'s gates (pure).
pub fn judge(spec: &JobSpec, outcome: &Value) -> GateReport {
    let gates = &spec.gates;
    let evaluation = outcome.get("evaluation").unwrap_or(&Value::Null);
    let figure = |path: &str| evaluation.pointer(path).and_then(Value::as_f64);
    let trend = outcome.get("training").filter(|t| !t.is_null());
    let trend_figure = |key: &str| trend.and_then(|t| t.get(key)).and_then(Value::as_f64);
    let mut criteria = Vec::new();

    let (before, after) =
        (figure("/baseline_scores/heldout/accuracy"), figure("/candidate/heldout/accuracy"));
    let heldout_gain = before.zip(after).map(|(before, after)| after - before);
    criteria.push(match heldout_gain {
        Some(gain) => Criterion::new(
            "heldout_gain",
            ">=",
            Some(gain),
            Some(gates.heldout_gain_min.unwrap_or(HELDOUT_GAIN_MIN)),
            format!("held-out accuracy {:.4} → {:.4}", before.unwrap_or_default(), after.unwrap_or_default()),
        ),
        None if spec.data.heldout.is_none() => Criterion::new(
            "heldout_gain",
            ">=",
            None,
            gates.heldout_gain_min,
            "not checked: the job has no data.heldout".into(),
        ),
        None => Criterion::new(
            "heldout_gain",
            ">=",
            None,
            Some(gates.heldout_gain_min.unwrap_or(HELDOUT_GAIN_MIN)),
            "no held-out score of the candidate and its baseline".into(),
        ),
    });

    let regressions = evaluation.pointer("/canary_regressions/count").and_then(Value::as_f64);
    let canary_threshold = gates.canary_regressions_max.map(f64::from);
    criteria.push(match (regressions, figure("/candidate/canaries/prompts")) {
        (Some(count), Some(prompts)) => {
            let ids: Vec<&str> = evaluation
                .pointer("/canary_regressions/ids")
                .and_then(Value::as_array)
                .map(|ids| ids.iter().filter_map(Value::as_str).collect())
                .unwrap_or_default();
            let note = if ids.is_empty() {
                format!("of {prompts} canaries, none the baseline passed fails now")
            } else {
                format!("of {prompts} canaries, these passed before and fail now: {}", ids.join(", "))
            };
            Criterion::new(
                "canary_regressions",
                "<=",
                Some(count),
                Some(canary_threshold.unwrap_or(f64::from(CANARY_REGRESSIONS_MAX))),
                note,
            )
        }
        _ if spec.data.canaries.is_none() => Criterion::new(
            "canary_regressions",
            "<=",
            None,
            canary_threshold,
            "not checked: the job has no data.canaries".into(),
        ),
        _ => Criterion::new(
            "canary_regressions",
            "<=",
            None,
            Some(canary_threshold.unwrap_or(f64::from(CANARY_REGRESSIONS_MAX))),
            "no canary scores of the candidate and its baseline".into(),
        ),
    });

    let kl = trend_figure("kl_last");
    criteria.push(Criterion::new(
        "kl",
        "<=",
        kl,
        gates.kl_max,
        match (kl, gates.kl_max) {
            (Some(_), Some(_)) => "mean KL to the reference over the last training steps".into(),
            (Some(_), None) => "measured only: no gates.kl_max".into(),
            (None, _) => "no KL to a reference was measured (no reference model in this job)".into(),
        },
    ));

    let (length_before, length_after) = (
        figure("/baseline_scores/heldout/completion_len_mean"),
        figure("/candidate/heldout/completion_len_mean"),
    );
    let length_ratio =
        length_before.zip(length_after).filter(|(before, _)| *before > 0.0).map(|(b, a)| a / b);
    let length_threshold = gates.length_ratio_max.unwrap_or(LENGTH_RATIO_MAX);
    criteria.push(match length_ratio {
        Some(ratio) => Criterion::new(
            "length_ratio",
            "<=",
            Some(ratio),
            Some(length_threshold),
            format!(
                "mean held-out completion length {:.1} → {:.1} tokens",
                length_before.unwrap_or_default(),
                length_after.unwrap_or_default()
            ),
        ),
        None => Criterion::new(
            "length_ratio",
            "<=",
            None,
            gates.length_ratio_max,
            "not checked: no held-out completions of the candidate and its baseline".into(),
        ),
    });

    let sum = |key: &str| {
        ["/candidate/heldout/", "/candidate/canaries/"]
            .iter()
            .filter_map(|set| figure(&format!("{set}{key}")))
            .sum::<f64>()
    };
    let calls = sum("verifier_calls");
    for (name, key, asked, default, what) in [
        (
            "verifier_error_rate",
            "verifier_errors",
            gates.verifier_error_rate_max,
            VERIFIER_ERROR_RATE_MAX,
            "errors",
        ),
        (
            "verifier_timeout_rate",
            "verifier_timeouts",
            gates.verifier_timeout_rate_max,
            VERIFIER_TIMEOUT_RATE_MAX,
            "timeouts",
        ),
    ] {
        criteria.push(if calls > 0.0 {
            let count = sum(key);
            Criterion::new(
                name,
                "<=",
                Some(count / calls),
                Some(asked.unwrap_or(default)),
                format!("{count} {what} in {calls} verifier calls on the candidate's evaluation"),
            )
        } else {
            Criterion::new(name, "<=", None, asked, "not checked: the candidate was not evaluated".into())
        });
    }

    let refuse_hacking = gates.refuse_reward_hacking.unwrap_or(true);
    let reward = trend_figure("reward_first").zip(trend_figure("reward_last"));
    criteria.push(match (reward, heldout_gain) {
        (Some((first, last)), Some(gain)) => {
            let hacking = last > first && gain < 0.0;
            let mut line = Criterion {
                name: "reward_hacking".into(),
                passed: !(hacking && refuse_hacking),
                measured: Some(gain),
                threshold: Some(0.0),
                op: ">=".into(),
                note: format!(
                    "training reward {first:.4} → {last:.4} (mean of the first and last steps), held-out {}",
                    if gain < 0.0 { "down" } else { "not down" }
                ),
            };
            if hacking {
                line.note = format!("{}: the model learned the reward, not the task", line.note);
            }
            if !refuse_hacking {
                line.note.push_str(" (gates.refuse_reward_hacking = false: not enforced)");
            }
            line
        }
        _ => Criterion::new(
            "reward_hacking",
            ">=",
            None,
            None,
            "not checked: needs a training reward and held-out scores".into(),
        ),
    });

    GateReport {
        passed: criteria.iter().all(|criterion| criterion.passed),
        baseline: evaluation.get("baseline").cloned().unwrap_or(Value::Null),
        criteria,
        forced: None,
    }
}

/// Where a job publishes: its `[publish] registry`, or the daemon's default.
pub fn registry_of(spec: &JobSpec, default_registry: &Path) -> PathBuf {
    spec.publish.as_ref().map_or_else(|| default_registry.to_owned(), |p| p.registry.clone())
}

/// The model line's newest published version, if any: the baseline of the next candidate.
pub fn latest_version(spec: &JobSpec, default_registry: &Path) -> Option<(u64, PathBuf)> {
    let line = registry_of(spec, default_registry).join(&spec.job.model_line);
    versions(&line).ok()?.pop()
}

/// Judges and, when every criterion passes (or an admin forced it), publishes the checkpoint of
/// `outcome`.
pub fn evaluate(
    spec: &JobSpec,
    job_id: &str,
    outcome: &Value,
    default_registry: &Path,
    forced: Option<Forced>,
) -> Result<Verdict, String> {
    let mut report = judge(spec, outcome);
    if !report.passed && forced.is_none() {
        return Ok(Verdict::Refused { reason: report.refusal(), report });
    }
    report.forced = forced;
    let registry = registry_of(spec, default_registry);
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
        "plugins": outcome.get("plugins"),
        "data_sha256": outcome.get("data_sha256"),
        "metrics": {
            "training": outcome.get("training"),
            "evaluation": outcome.get("evaluation"),
            "stopped": outcome.get("stopped"),
        },
        "gates": report,
        "spec": spec,
        "published_at": humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string(),
    });
    let (version, path) =
        publish(&registry.join(&spec.job.model_line), job_id, &Path::new(checkpoint).join("model"), manifest)
            .map_err(|error| format!("publishing to {}: {error}", registry.display()))?;
    let manifest = fs::read(path.join("manifest.json"))
        .ok()
        .and_then(|bytes| serde_json::from_slice(&bytes).ok())
        .unwrap_or(Value::Null);
    Ok(Verdict::Published { version, path, report, manifest })
}

/// Copies `model` into the next version of `line` with `manifest` (plus each file's sha256).
///
/// Publishers of one line take turns (an exclusive `flock` on `<line>/.publish.lock`, released
/// by the kernel if the process dies): the check for the job's own version and the publish are
/// one step, so a job gated twice at once (a forced promotion racing another) publishes once.
pub fn publish(line: &Path, job_id: &str, model: &Path, mut manifest: Value) -> io::Result<(u64, PathBuf)> {
    fs::create_dir_all(line)?;
    let lock =
        fs::OpenOptions::new().create(true).truncate(false).write(true).open(line.join(".publish.lock"))?;
    // SAFETY: flock on a descriptor we own; it is released when `lock` is dropped (closed).
    if unsafe { libc::flock(std::os::fd::AsRawFd::as_raw_fd(&lock), libc::LOCK_EX) } != 0 {
        return Err(io::Error::last_os_error());
    }
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

    /// A candidate that passes every default: held-out 0.30 → 0.40, no canary lost, KL 0.02,
    /// lengths 10 → 12, clean verifiers, training reward 0.2 → 0.5.
    fn good_outcome() -> Value {
        let set = |accuracy: f64, length: f64| {
            json!({"accuracy": accuracy, "completion_len_mean": length, "prompts": 20,
                   "verifier_calls": 40, "verifier_errors": 0, "verifier_timeouts": 0})
        };
        json!({
            "steps": 10,
            "training": {"steps": 10, "reward_first": 0.2, "reward_last": 0.5, "kl_last": 0.02,
                         "length_first": 10.0, "length_last": 12.0},
            "evaluation": {
                "baseline": {"kind": "start", "model": "builtin:tiny-arith", "version": null},
                "candidate": {"heldout": set(0.40, 12.0), "canaries": set(1.0, 5.0)},
                "baseline_scores": {"heldout": set(0.30, 10.0), "canaries": set(1.0, 5.0)},
                "canary_regressions": {"count": 0, "ids": []},
            },
        })
    }

    fn failing(report: &GateReport) -> Vec<&str> {
        report.criteria.iter().filter(|c| !c.passed).map(|c| c.name.as_str()).collect()
    }

    #[test]
    fn a_good_candidate_passes_and_each_criterion_fails_on_its_own() {
        let with_canaries = |extra: &str| {
            let mut spec = spec(extra);
            spec.data.canaries = Some("/c.jsonl".into());
            spec
        };
        let report = judge(&with_canaries(""), &good_outcome());
        assert!(report.passed, "{report:#?}");
        assert_eq!(report.criteria.len(), 7);
        assert_eq!(report.baseline["kind"], "start");

        type Change = fn(&mut Value);
        let cases: [(&str, &str, Change, &[&str]); 9] = [
            (
                "held-out gain below its minimum",
                "[gates]\nheldout_gain_min = 0.2\n",
                |_| {},
                &["heldout_gain"],
            ),
            (
                "a canary lost",
                "",
                |o| o["evaluation"]["canary_regressions"] = json!({"count": 1, "ids": ["c7"]}),
                &["canary_regressions"],
            ),
            ("KL above its maximum", "[gates]\nkl_max = 0.01\n", |_| {}, &["kl"]),
            (
                "completions twice as long",
                "",
                |o| o["evaluation"]["candidate"]["heldout"]["completion_len_mean"] = json!(25.0),
                &["length_ratio"],
            ),
            (
                "verifier errors",
                "",
                |o| o["evaluation"]["candidate"]["heldout"]["verifier_errors"] = json!(8),
                &["verifier_error_rate"],
            ),
            (
                "verifier timeouts",
                "[gates]\nverifier_timeout_rate_max = 0.01\n",
                |o| o["evaluation"]["candidate"]["canaries"]["verifier_timeouts"] = json!(1),
                &["verifier_timeout_rate"],
            ),
            (
                "reward up, held-out down, a small drop allowed by heldout_gain_min",
                "[gates]\nheldout_gain_min = -0.1\n",
                |o| o["evaluation"]["candidate"]["heldout"]["accuracy"] = json!(0.25),
                &["reward_hacking"],
            ),
            (
                "reward up, held-out down",
                "",
                |o| o["evaluation"]["candidate"]["heldout"]["accuracy"] = json!(0.25),
                &["heldout_gain", "reward_hacking"],
            ),
            (
                "held-out down with the reward down too is no hacking",
                "",
                |o| {
                    o["evaluation"]["candidate"]["heldout"]["accuracy"] = json!(0.25);
                    o["training"]["reward_last"] = json!(0.1);
                },
                &["heldout_gain"],
            ),
        ];
        for (what, extra, change, expected) in cases {
            let mut outcome = good_outcome();
            change(&mut outcome);
            let report = judge(&with_canaries(extra), &outcome);
            assert_eq!(failing(&report), expected, "{what}: {report:#?}");
            assert!(!report.passed, "{what}");
        }
    }

    #[test]
    fn refusals_name_the_measured_value_and_threshold_and_unmeasurable_asks_never_pass() {
        let mut outcome = good_outcome();
        outcome["evaluation"]["candidate"]["heldout"]["accuracy"] = json!(0.28);
        for scores in ["candidate", "baseline_scores"] {
            outcome["evaluation"][scores]["canaries"] = Value::Null;
        }
        let report = judge(&spec(""), &outcome);
        assert!(
            report.refusal().starts_with(
                "gates refused: heldout_gain: -0.0200 < 0 (held-out accuracy 0.3000 → 0.2800); reward_hacking:"
            ),
            "{}",
            report.refusal()
        );
        // No canaries in the job: shown as not checked, and passed.
        let canary = &report.criteria[1];
        assert!(canary.passed && canary.note.starts_with("not checked"), "{canary:?}");
        // Asked for a KL bound in a job that measured none: refused.
        let mut no_kl = good_outcome();
        no_kl["training"]["kl_last"] = Value::Null;
        let report = judge(&spec("[gates]\nkl_max = 0.1\n"), &no_kl);
        assert_eq!(failing(&report), ["kl"]);
        // No evaluation at all (the worker could not score): the held-out gain is not a pass.
        let report = judge(&spec(""), &json!({"steps": 3}));
        assert!(failing(&report).contains(&"heldout_gain"), "{report:#?}");
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
        assert_eq!(names.len(), 3, "two versions and the lock file, no staging left behind: {names:?}");
    }
}
