//! `python`: a team's own reward function, `def grade(sample, item) -> float`, run in the code
//! verifier's sandbox (shared through `rlvr-sandbox-common`).
//!
//! Each item gets a fresh sandboxed interpreter that sees only the grader's source, this item's
//! sample (the completion) and this item (`{"id", "prompt", "reference"}`), nothing else: no
//! other items, no files of the host, no network. The score is what grade() returned, as a
//! finite number; an exception, a syntax error, a wrong return type, NaN, a timeout or a crash is
//! an error verdict naming it — never a silent 0. The result comes back from the sandbox's first
//! process, which never runs the grader's code, over an fd the grader's process does not hold
//! (see `runner.py`), so printing a number or writing to an fd cannot set the score.
//!
//! `check_options` reports the source's SHA-256 (key `source`) for the host to record with the
//! job.

pub mod literal;
pub mod run;

use std::path::PathBuf;
use std::time::Duration;

use rlvr_plugin_api::{
    GraderCaps, HostContext, Metadata, OptionError, OptionsReport, PluginError, Resource, Verdict,
    VerifierPlugin, VerifyItem, check_known_answers, export_verifier, parse_options,
};
use rlvr_sandbox_common::Semaphore;
use rlvr_sandbox_common::layers::{Layer, LayerSet};
use rlvr_sandbox_common::sandbox::{Limits, Sandbox};
use serde::Deserialize;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use crate::run::{Outcome, RunLimits};

/// Largest `source`, bytes.
pub const MAX_SOURCE_BYTES: usize = 64 * 1024;
/// Largest `timeout_ms`: one item must end well inside the host's per-item deadline (30 s).
pub const MAX_TIMEOUT_MS: u64 = 20_000;

/// The plugin's keys in a job's `[[verifiers]]` entry (or a dry-run's `grader`).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PythonConfig {
    /// The grader: Python source defining `grade(sample, item)`. Required.
    pub source: Option<String>,
    /// Wall clock for one item (interpreter start, compile, grade()), milliseconds.
    pub timeout_ms: u64,
    /// Address space of the sandboxed grader, MiB (`RLIMIT_AS`).
    pub memory_mb: u64,
    /// A score at or above this passes.
    pub pass_threshold: f64,
    /// Processes and threads the grader may have (`RLIMIT_NPROC`).
    pub max_processes: u64,
    /// Largest file the grader may write, MiB (`RLIMIT_FSIZE`); its output counts too.
    pub max_file_mb: u64,
    /// Open files of the grader (`RLIMIT_NOFILE`).
    pub max_open_files: u64,
    /// Runs at once across all threads of one verifier.
    pub max_parallel: usize,
    /// The interpreter (the host's; refused in a tenant's job by the daemon).
    pub python: PathBuf,
    /// Extra read-only paths for the sandbox, e.g. a site-packages directory (the host's).
    pub read_paths: Vec<PathBuf>,
    /// Where throw-away work directories go; the system temp dir by default (the host's).
    pub work_root: Option<PathBuf>,
    /// Isolation layers this job accepts to run without when the kernel lacks them.
    pub allow_missing_layers: Vec<Layer>,
}

impl Default for PythonConfig {
    fn default() -> Self {
        PythonConfig {
            source: None,
            timeout_ms: 5_000,
            memory_mb: 512,
            pass_threshold: 1.0,
            max_processes: 16,
            max_file_mb: 16,
            max_open_files: 64,
            max_parallel: std::thread::available_parallelism().map_or(1, std::num::NonZero::get),
            python: PathBuf::from("/usr/bin/python3"),
            read_paths: Vec::new(),
            work_root: None,
            allow_missing_layers: Vec::new(),
        }
    }
}

/// The checks that need nothing from the host (no process, no file): the source's presence,
/// size and shape, and the numbers' ranges. A source that does not compile is an error verdict
/// at run time: compiling it here would mean starting Python at submit.
pub fn check_config(config: &PythonConfig) -> Result<&str, OptionError> {
    let source = config
        .source
        .as_deref()
        .ok_or_else(|| OptionError::new("source", "missing; this key is required"))?;
    if source.trim().is_empty() {
        return Err(OptionError::new(
            "source",
            "expected python source defining grade(sample, item), got an empty string",
        ));
    }
    if source.len() > MAX_SOURCE_BYTES {
        return Err(OptionError::new(
            "source",
            format!("expected at most {MAX_SOURCE_BYTES} bytes, got {}", source.len()),
        ));
    }
    if !source.contains("def grade") {
        return Err(OptionError::new(
            "source",
            "expected a function `def grade(sample, item)`, found no `def grade`",
        ));
    }
    let ranges = [
        ("timeout_ms", config.timeout_ms, 1, MAX_TIMEOUT_MS, ""),
        ("memory_mb", config.memory_mb, 64, 1 << 20, " (python needs ~30 MiB)"),
        ("max_processes", config.max_processes, 2, 4096, " (the grader runs in a second process)"),
        ("max_file_mb", config.max_file_mb, 1, 1 << 20, ""),
        ("max_open_files", config.max_open_files, 16, 1 << 16, ""),
        ("max_parallel", config.max_parallel as u64, 1, 1024, ""),
    ];
    for (key, value, min, max, why) in ranges {
        if !(min..=max).contains(&value) {
            return Err(OptionError::new(key, format!("expected {min} to {max}{why}, got {value}")));
        }
    }
    if !config.pass_threshold.is_finite() {
        return Err(OptionError::new(
            "pass_threshold",
            format!("expected a finite number, got {}", config.pass_threshold),
        ));
    }
    Ok(source)
}

/// Holds `config` to the operator's `caps` (`GraderCaps::hold_sandbox`); `written`:
/// the options as the spec wrote them.
pub fn within_caps(config: &mut PythonConfig, caps: &GraderCaps, written: &Value) -> Result<(), OptionError> {
    let mut limits = [
        ("memory_mb", Resource::MemoryMb, &mut config.memory_mb),
        ("max_file_mb", Resource::FileMb, &mut config.max_file_mb),
        ("max_processes", Resource::Processes, &mut config.max_processes),
    ];
    caps.hold_sandbox(written, &mut limits, &mut config.max_parallel, &mut config.work_root)
}

/// Lowercase hex SHA-256 of `text`.
pub fn sha256_hex(text: &str) -> String {
    hex::encode(Sha256::digest(text.as_bytes()))
}

/// The python grader.
#[derive(Debug)]
pub struct PythonGrader {
    source: String,
    source_sha256: String,
    config: PythonConfig,
    sandbox: Sandbox,
    /// Layers missing on this host that the config accepted; reported in every verdict.
    missing: LayerSet,
    work_root: PathBuf,
    permits: Semaphore,
}

impl PythonGrader {
    /// Checks `config` and probes what this host allows (starting sandboxed interpreters once
    /// per process).
    pub fn new(config: PythonConfig) -> Result<Self, PluginError> {
        let source = check_config(&config)?.to_owned();
        let work_root = config.work_root.clone().unwrap_or_else(std::env::temp_dir);
        if !work_root.is_dir() {
            return Err(PluginError::invalid_config(format!(
                "work_root: expected an existing directory, got {}",
                work_root.display()
            )));
        }
        let probe = rlvr_sandbox_common::probe(&config.python);
        if let Err(error) = &probe.python {
            return Err(PluginError::invalid_config(error.clone()));
        }
        let allowed: LayerSet = config.allow_missing_layers.iter().copied().collect();
        let missing = rlvr_sandbox_common::check_layers(probe.available, allowed)
            .map_err(PluginError::invalid_config)?;
        let mib = |value: u64| value.saturating_mul(1 << 20);
        let sandbox = Sandbox {
            python: config.python.clone(),
            layers: probe.available,
            limits: Limits {
                // The wall clock ends a run first; the CPU limit also bounds a grader's threads.
                cpu_seconds: config.timeout_ms.div_ceil(1000) + 1,
                address_space: mib(config.memory_mb),
                processes: config.max_processes,
                file_size: mib(config.max_file_mb),
                open_files: config.max_open_files,
            },
            read_paths: probe.read_paths(&config.read_paths),
            landlock_abi: probe.landlock_abi,
            seccomp: probe.seccomp.clone().unwrap_or_default(),
        };
        let permits = Semaphore::new(config.max_parallel);
        let source_sha256 = sha256_hex(&source);
        Ok(PythonGrader { source, source_sha256, config, sandbox, missing, work_root, permits })
    }

    fn limits(&self) -> RunLimits {
        RunLimits { timeout: Duration::from_millis(self.config.timeout_ms), memory_mb: self.config.memory_mb }
    }
}

impl VerifierPlugin for PythonGrader {
    fn metadata() -> Metadata {
        Metadata {
            name: "python",
            version: env!("CARGO_PKG_VERSION"),
            description: "a team's own grade(sample, item) -> float in python, run in a sandbox",
        }
    }

    fn reference_schema() -> &'static str {
        r#"any JSON: the grader gets the item as {"id": "...", "prompt": "...", "reference": <this>}"#
    }

    fn notes() -> Vec<String> {
        rlvr_sandbox_common::notes(&PythonConfig::default().python)
    }

    fn from_config(config_json: &str) -> Result<Self, PluginError> {
        PythonGrader::new(parse_options(config_json)?)
    }

    /// Held to the operator's caps when the host gives any (the daemon always does).
    fn from_config_in(config_json: &str, host: &HostContext) -> Result<Self, PluginError> {
        let mut config: PythonConfig = parse_options(config_json)?;
        if let Some(caps) = &host.grader_caps {
            let written = serde_json::from_str(config_json).unwrap_or_default();
            within_caps(&mut config, caps, &written)?;
        }
        PythonGrader::new(config)
    }

    /// Keys, sizes and numbers only (no interpreter is started); reports the host paths the
    /// options name and the source's digest, to be recorded with the job.
    fn check_options(config_json: &str) -> Result<OptionsReport, OptionError> {
        let config: PythonConfig = parse_options(config_json)?;
        let source = check_config(&config)?;
        let written: Value = serde_json::from_str(config_json).unwrap_or_default();
        let mut report = OptionsReport::default();
        if written.get("python").is_some() {
            report = report.path("python", &config.python.display().to_string());
        }
        if let Some(root) = config.work_root.as_ref().filter(|_| written.get("work_root").is_some()) {
            report = report.path("work_root", &root.display().to_string());
        }
        for (i, path) in config.read_paths.iter().enumerate() {
            report = report.path(&format!("read_paths[{i}]"), &path.display().to_string());
        }
        Ok(report.digest("source", &sha256_hex(source)))
    }

    fn verify(&self, item: &VerifyItem<'_>) -> Result<Verdict, PluginError> {
        let reference: Value = match serde_json::from_str(item.reference_json.as_str()) {
            Ok(reference) => reference,
            Err(error) => return Ok(Verdict::error(format!("reference: expected JSON, {error}"))),
        };
        let item_value =
            json!({"id": item.id.as_str(), "prompt": item.prompt.as_str(), "reference": reference});
        let literal = literal::python_literal(&item_value);
        let explain = item.explain;
        let ran = {
            let _permit = self.permits.acquire();
            run::run(
                &self.sandbox,
                &self.work_root,
                self.limits(),
                &self.source,
                item.completion.as_str(),
                &literal,
                explain,
            )
        };
        let ran = match ran {
            Ok(ran) => ran,
            Err(message) => return Ok(Verdict::error(message)),
        };
        let mut verdict = match &ran.outcome {
            Outcome::Score(score) => Verdict::new(*score, *score >= self.config.pass_threshold)
                .component("weak_isolation", f64::from(u8::from(!self.missing.is_empty()))),
            Outcome::Failed(message) => Verdict::error(message.clone()),
            Outcome::TimedOut(message) => Verdict::timeout(message.clone()),
        };
        if explain {
            verdict = verdict.explain(format!(
                "grader: {} bytes of python, sha256 {}",
                self.source.len(),
                self.source_sha256
            ));
            match &ran.outcome {
                Outcome::Score(score) => {
                    verdict = verdict.explain(format!(
                        "grade returned {score}; pass_threshold {}",
                        self.config.pass_threshold
                    ))
                }
                Outcome::Failed(message) | Outcome::TimedOut(message) => {
                    verdict = verdict.explain(format!("no score: {message}"))
                }
            }
            if let Some(output) = ran.output.filter(|output| !output.is_empty()) {
                verdict = verdict.explain(format!("output: {output}"));
            }
            if !self.missing.is_empty() {
                verdict = verdict.explain(format!(
                    "weaker isolation accepted by the config: running without {}",
                    self.missing.names()
                ));
            }
        }
        Ok(verdict)
    }

    fn self_test() -> Result<(), PluginError> {
        // The weakest accepted config: the plugin loads on any kernel; a job's own config decides
        // whether a missing layer refuses it.
        let config = PythonConfig {
            source: Some(SELF_TEST_GRADER.to_owned()),
            allow_missing_layers: Layer::ALL.to_vec(),
            ..PythonConfig::default()
        };
        let grader = PythonGrader::new(config)?;
        check_known_answers(
            &grader,
            &[
                ("The answer is 42.", r#"{"answer": "42"}"#, 1.0),
                ("The answer is 41.", r#"{"answer": "42"}"#, 0.0),
            ],
        )
    }
}

/// The self-test's grader: the last number of the sample against `reference.answer`.
const SELF_TEST_GRADER: &str = r#"
import re

def grade(sample, item):
    numbers = re.findall(r"-?\d+", sample)
    return float(bool(numbers) and numbers[-1] == item["reference"]["answer"])
"#;

export_verifier!(PythonGrader);

#[cfg(test)]
mod tests;
