//! `code`: runs a Python solution against the item's tests in a layered sandbox and scores it.
//!
//! The solution is the last fenced code block of the completion (or the whole completion). The
//! tests come from `reference` (design.md §1): `asserts` — statements run by a trusted evaluator
//! that calls into the sandboxed solution through proxies and compares the returned plain values
//! itself — or `io` — stdin/stdout pairs, one fresh sandboxed process each, stdout compared here.
//! Neither the expected values nor the test code ever enter the sandbox, and the solution's exit
//! code is never read: a verdict rests only on what the trusted side saw.
//!
//! Components: `tests_passed` (fraction), `timeout` (1 when a test ran out of time),
//! `unsafe` (1 when the sandbox killed the solution for a forbidden system call; the score is
//! then 0), `weak_isolation` (1 when the config accepted missing isolation layers).
//! The score is the pass fraction or, with `scoring = "all_or_nothing"`, 1 only when all pass.
//!
//! Isolation layers: see [`sandbox`] and [`layers`]; which ones the kernel allows is found once
//! per process ([`probe`]) and reported in [`VerifierPlugin::notes`].
//!
//! `run.rs` drives a run; `evaluator.py` is the trusted evaluator (it holds the tests and never runs
//! solution code) and `runner.py` the sandboxed side; the sandbox is `rlvr-sandbox-common`'s.
//! Invariant: expected values never enter the sandbox, and `check_options` starts no interpreter and
//! probes no kernel.

pub mod reference;
pub mod run;

// The sandbox is shared with the python grader; re-exported under its old paths.
pub use rlvr_sandbox_common::{Probe, check_layers, fdio, layers, probe, sandbox};

use std::path::PathBuf;
use std::time::Duration;

use rlvr_plugin_api::{
    GraderCaps, HostContext, Metadata, OptionError, OptionsReport, PluginError, Resource, Verdict,
    VerifierPlugin, VerifyItem, check_known_answers, export_verifier, parse_options,
};
use serde::Deserialize;

use rlvr_sandbox_common::Semaphore;

use crate::layers::{Layer, LayerSet};
use crate::reference::Tests;
use crate::run::{EvaluatorPool, IoCompare, Outcome, RunError, RunLimits, Runner};
use crate::sandbox::{Limits, Sandbox};

/// How the score is made from the tests.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Scoring {
    /// Passed tests / all tests.
    Fraction,
    /// 1 when every test passed, else 0.
    AllOrNothing,
}

/// The plugin's keys in a job's `[[verifiers]]` entry.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CodeConfig {
    /// The interpreter solutions and the evaluator run under.
    pub python: PathBuf,
    /// `fraction` or `all_or_nothing`.
    pub scoring: Scoring,
    /// Runs at once across all threads using this verifier.
    pub max_parallel: usize,
    /// Time for each test when the reference has no `timeout_ms`, milliseconds.
    pub timeout_ms: u64,
    /// Largest `timeout_ms` a reference may ask for.
    pub max_timeout_ms: u64,
    /// Time for a whole item, all tests together, milliseconds; keep it under the host's
    /// per-item deadline (`rlvrctl verify --deadline-ms`, 30 s by default).
    pub run_budget_ms: u64,
    /// Address space of a sandboxed process, MiB.
    pub memory_mb: u64,
    /// Address space of each trusted evaluator process, MiB (`RLIMIT_AS`): a test that keeps
    /// too many of the solution's values fails with `MemoryError` instead of growing the host.
    pub evaluator_memory_mb: u64,
    /// Processes and threads a sandboxed solution may have.
    pub max_processes: u64,
    /// Largest file a solution may write, MiB.
    pub max_file_mb: u64,
    /// Open files of a sandboxed process.
    pub max_open_files: u64,
    /// Largest stdout of one io test, bytes; more fails the test.
    pub max_output_bytes: usize,
    /// Largest value one call may return in asserts mode, bytes of JSON.
    pub max_reply_bytes: usize,
    /// Largest solution, bytes; a larger one scores 0 without running.
    pub max_code_bytes: usize,
    /// How io stdout is compared: `lines` (trailing whitespace ignored), `exact`, `tokens`.
    pub io_compare: IoCompare,
    /// Extra paths the sandbox may read (e.g. a site-packages directory).
    pub read_paths: Vec<PathBuf>,
    /// Where throw-away work directories are made; the system temp dir by default.
    pub work_root: Option<PathBuf>,
    /// Isolation layers this job accepts to run without when the kernel lacks them. Without
    /// this, a missing layer refuses the verifier.
    pub allow_missing_layers: Vec<Layer>,
}

impl Default for CodeConfig {
    fn default() -> Self {
        CodeConfig {
            python: PathBuf::from("/usr/bin/python3"),
            scoring: Scoring::Fraction,
            max_parallel: std::thread::available_parallelism().map_or(1, std::num::NonZero::get),
            timeout_ms: 4_000,
            max_timeout_ms: 10_000,
            run_budget_ms: 20_000,
            memory_mb: 1024,
            evaluator_memory_mb: 2048,
            max_processes: 32,
            max_file_mb: 16,
            max_open_files: 64,
            max_output_bytes: 1 << 20,
            max_reply_bytes: 1 << 20,
            max_code_bytes: 64 << 10,
            io_compare: IoCompare::Lines,
            read_paths: Vec::new(),
            work_root: None,
            allow_missing_layers: Vec::new(),
        }
    }
}

/// The code verifier.
#[derive(Debug)]
pub struct CodeVerifier {
    config: CodeConfig,
    sandbox: Sandbox,
    /// Layers missing on this host that the config accepted; reported in every verdict.
    missing: LayerSet,
    work_root: PathBuf,
    pool: EvaluatorPool,
    permits: Semaphore,
}

/// Longest `extracted` (the code that ran), bytes.
const EXTRACTED_MAX: usize = 4096;

/// Holds `config` to the operator's `caps` (`GraderCaps::hold_sandbox`), the
/// evaluator's memory included; `written`: the options as the spec wrote them.
pub fn within_caps(
    config: &mut CodeConfig,
    caps: &GraderCaps,
    written: &serde_json::Value,
) -> Result<(), OptionError> {
    let mut limits = [
        ("memory_mb", Resource::MemoryMb, &mut config.memory_mb),
        ("evaluator_memory_mb", Resource::MemoryMb, &mut config.evaluator_memory_mb),
        ("max_file_mb", Resource::FileMb, &mut config.max_file_mb),
        ("max_processes", Resource::Processes, &mut config.max_processes),
    ];
    caps.hold_sandbox(written, &mut limits, &mut config.max_parallel, &mut config.work_root)
}

/// The checks of `config` that need nothing from the host: ranges and relations of its numbers.
/// (`python`, `work_root` and `allow_missing_layers` are checked against the host when the
/// verifier is created.)
pub fn check_limits(config: &CodeConfig) -> Result<(), OptionError> {
    let positive = [
        ("max_parallel", config.max_parallel as u64),
        ("timeout_ms", config.timeout_ms),
        ("max_timeout_ms", config.max_timeout_ms),
        ("run_budget_ms", config.run_budget_ms),
        ("memory_mb", config.memory_mb),
        ("max_processes", config.max_processes),
        ("max_file_mb", config.max_file_mb),
        ("max_open_files", config.max_open_files),
        ("max_output_bytes", config.max_output_bytes as u64),
        ("max_reply_bytes", config.max_reply_bytes as u64),
        ("max_code_bytes", config.max_code_bytes as u64),
    ];
    for (key, value) in positive {
        if value == 0 {
            return Err(OptionError::new(key, "expected a positive number"));
        }
    }
    if config.timeout_ms > config.max_timeout_ms {
        return Err(OptionError::new(
            "timeout_ms",
            format!("expected at most max_timeout_ms ({}), got {}", config.max_timeout_ms, config.timeout_ms),
        ));
    }
    for (key, value) in [("memory_mb", config.memory_mb), ("evaluator_memory_mb", config.evaluator_memory_mb)]
    {
        if value < 64 {
            return Err(OptionError::new(
                key,
                format!("expected at least 64 (python needs ~30 MiB), got {value}"),
            ));
        }
    }
    Ok(())
}

impl CodeVerifier {
    /// A verifier with `config`, checked against what this host allows.
    pub fn new(config: CodeConfig) -> Result<Self, PluginError> {
        check_limits(&config)?;
        let work_root = config.work_root.clone().unwrap_or_else(std::env::temp_dir);
        if !work_root.is_dir() {
            return Err(PluginError::invalid_config(format!(
                "work_root: expected an existing directory, got {}",
                work_root.display()
            )));
        }
        let probe = probe(&config.python);
        if let Err(error) = &probe.python {
            return Err(PluginError::invalid_config(error.clone()));
        }
        let allowed: LayerSet = config.allow_missing_layers.iter().copied().collect();
        let missing = check_layers(probe.available, allowed).map_err(PluginError::invalid_config)?;
        let cpu_seconds = config.run_budget_ms.div_ceil(1000) + 1;
        let mib = |value: u64| value.saturating_mul(1 << 20);
        let sandbox = Sandbox {
            python: config.python.clone(),
            layers: probe.available,
            limits: Limits {
                cpu_seconds,
                address_space: mib(config.memory_mb),
                processes: config.max_processes,
                file_size: mib(config.max_file_mb),
                open_files: config.max_open_files,
            },
            read_paths: probe.read_paths(&config.read_paths),
            landlock_abi: probe.landlock_abi,
            seccomp: probe.seccomp.clone().unwrap_or_default(),
        };
        let pool = EvaluatorPool::new(mib(config.evaluator_memory_mb));
        let permits = Semaphore::new(config.max_parallel);
        Ok(CodeVerifier { config, sandbox, missing, work_root, pool, permits })
    }

    fn verdict(&self, outcome: &Outcome, code: &str, explain: bool) -> Verdict {
        let fraction = if outcome.total == 0 { 0.0 } else { outcome.passed as f64 / outcome.total as f64 };
        let all = outcome.total > 0 && outcome.passed == outcome.total;
        let score = match self.config.scoring {
            _ if outcome.unsafe_ => 0.0,
            Scoring::Fraction => fraction,
            Scoring::AllOrNothing => f64::from(u8::from(all)),
        };
        let flag = |on: bool| f64::from(u8::from(on));
        let mut verdict = Verdict::new(score, all && !outcome.unsafe_)
            .component("tests_passed", fraction)
            .component("timeout", flag(outcome.timed_out))
            .component("unsafe", flag(outcome.unsafe_))
            .component("weak_isolation", flag(!self.missing.is_empty()))
            .extracted(truncate(code, EXTRACTED_MAX));
        if explain {
            verdict = verdict.explain(format!(
                "solution: {} bytes of python, from {}",
                code.len(),
                "the last fenced code block (or the whole completion)"
            ));
            for line in &outcome.lines {
                verdict = verdict.explain(line.clone());
            }
            verdict = verdict.explain(format!("{} of {} tests passed", outcome.passed, outcome.total));
            if !self.missing.is_empty() {
                verdict = verdict.explain(format!(
                    "weaker isolation accepted by the config: running without {}",
                    self.missing.names()
                ));
            }
        }
        verdict
    }
}

/// `text` cut to at most `max` bytes on a char boundary, marked when cut.
fn truncate(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_owned();
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}\n# ... ({} bytes in all)", &text[..end], text.len())
}

impl VerifierPlugin for CodeVerifier {
    fn metadata() -> Metadata {
        Metadata {
            name: "code",
            version: env!("CARGO_PKG_VERSION"),
            description: "runs a python solution against assert or stdin/stdout tests in a sandbox",
        }
    }

    fn reference_schema() -> &'static str {
        r#"{"language": "python", "asserts": ["assert add(1, 2) == 3"], "setup": "import math (optional, asserts only)", "timeout_ms": 4000} or {"language": "python", "io": [{"stdin": "1 2\n", "stdout": "3\n"}], "timeout_ms": 4000}"#
    }

    fn notes() -> Vec<String> {
        rlvr_sandbox_common::notes(&CodeConfig::default().python)
    }

    fn from_config(config_json: &str) -> Result<Self, PluginError> {
        CodeVerifier::new(parse_options(config_json)?)
    }

    /// Held to the operator's caps when the host gives any (the daemon always does).
    fn from_config_in(config_json: &str, host: &HostContext) -> Result<Self, PluginError> {
        let mut config: CodeConfig = parse_options(config_json)?;
        if let Some(caps) = &host.grader_caps {
            let written = serde_json::from_str(config_json).unwrap_or_default();
            within_caps(&mut config, caps, &written)?;
        }
        CodeVerifier::new(config)
    }

    /// Keys and numbers only: creating the verifier runs `python` and probes the kernel's
    /// isolation layers, which a check in the daemon at submit must not do.
    fn check_options(config_json: &str) -> Result<OptionsReport, OptionError> {
        let config: CodeConfig = parse_options(config_json)?;
        check_limits(&config)?;
        // The interpreter and the directories are the host's: reported when the options set
        // them, so a daemon refuses them in a tenant's job.
        let written: serde_json::Value = serde_json::from_str(config_json).unwrap_or_default();
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
        Ok(report)
    }

    fn verify(&self, item: &VerifyItem<'_>) -> Result<Verdict, PluginError> {
        let (tests, timeout_ms) = match reference::parse(item.reference_json.as_str()) {
            Ok(parsed) => parsed,
            Err(message) => return Ok(Verdict::error(message)),
        };
        if let Some(timeout_ms) = timeout_ms
            && timeout_ms > self.config.max_timeout_ms
        {
            return Ok(Verdict::error(format!(
                "reference.timeout_ms: expected at most {} (max_timeout_ms), got {timeout_ms}",
                self.config.max_timeout_ms
            )));
        }
        let code = reference::extract_code(item.completion.as_str());
        let explain = item.explain;
        if code.len() > self.config.max_code_bytes {
            let outcome = Outcome {
                total: tests.count(),
                lines: vec![format!(
                    "not run: the solution is {} bytes, over max_code_bytes ({})",
                    code.len(),
                    self.config.max_code_bytes
                )],
                ..Outcome::default()
            };
            return Ok(self.verdict(&outcome, code, explain));
        }
        let _permit = self.permits.acquire();
        let runner = Runner {
            sandbox: &self.sandbox,
            work_root: &self.work_root,
            pool: &self.pool,
            limits: RunLimits {
                per_test: Duration::from_millis(timeout_ms.unwrap_or(self.config.timeout_ms)),
                budget: Duration::from_millis(self.config.run_budget_ms),
                max_reply_bytes: self.config.max_reply_bytes,
                max_output_bytes: self.config.max_output_bytes,
            },
            explain,
        };
        let result = match &tests {
            Tests::Asserts { setup, tests } => runner.run_asserts(code, setup, tests),
            Tests::Io(cases) => runner.run_io(code, cases, self.config.io_compare),
        };
        match result {
            Ok(outcome) => Ok(self.verdict(&outcome, code, explain)),
            Err(RunError::Budget(message)) => Ok(Verdict::timeout(message)),
            Err(RunError::Internal(message)) => Ok(Verdict::error(message)),
        }
    }

    fn self_test() -> Result<(), PluginError> {
        // The weakest accepted config: the plugin loads on any kernel; a job's own config decides
        // whether a missing layer refuses it.
        let config = CodeConfig { allow_missing_layers: Layer::ALL.to_vec(), ..CodeConfig::default() };
        let verifier = CodeVerifier::new(config)?;
        check_known_answers(
            &verifier,
            &[
                ("def add(a, b):\n    return a + b\n", r#"{"asserts": ["assert add(1, 2) == 3"]}"#, 1.0),
                ("def add(a, b):\n    return a - b\n", r#"{"asserts": ["assert add(1, 2) == 3"]}"#, 0.0),
                (
                    "print(sum(map(int, input().split())))",
                    r#"{"io": [{"stdin": "1 2\n", "stdout": "3\n"}]}"#,
                    1.0,
                ),
            ],
        )
    }
}

export_verifier!(CodeVerifier);

#[cfg(test)]
mod tests {
    use super::*;

    /// Options → `Ok(())` (accepted, nothing to report) or `Err((key, start of the message))`.
    fn check_options(json: &str, expected: Result<(), (&str, &str)>) {
        match (CodeVerifier::check_options(json), expected) {
            (Ok(report), Ok(())) => assert_eq!(report, OptionsReport::default()),
            (Err(error), Err((key, message))) => {
                assert_eq!(error.key, key, "{json}: {error}");
                assert!(error.message.starts_with(message), "{json}: {error}");
            }
            (got, expected) => panic!("{json}: got {got:?}, expected {expected:?}"),
        }
    }

    #[test]
    fn options_are_checked_naming_the_key_without_running_anything() {
        check_options("{}", Ok(()));
        // Not run or looked at by the check (the worker does that when it creates the verifier),
        // but reported: they are server paths.
        let report = CodeVerifier::check_options(
            r#"{"python": "/x/python", "work_root": "/w", "read_paths": ["/r"]}"#,
        )
        .unwrap();
        let keys: Vec<&str> = report.paths.iter().map(|path| path.key.as_str()).collect();
        assert_eq!(keys, ["python", "work_root", "read_paths[0]"]);
        check_options(
            r#"{"timeout_m": 1}"#,
            Err(("timeout_m", "unknown key; expected one of python, scoring, ")),
        );
        check_options(r#"{"max_processes": 0}"#, Err(("max_processes", "expected a positive number")));
        check_options(
            r#"{"timeout_ms": 20000}"#,
            Err(("timeout_ms", "expected at most max_timeout_ms (10000), got 20000")),
        );
        check_options(
            r#"{"memory_mb": 10}"#,
            Err(("memory_mb", "expected at least 64 (python needs ~30 MiB), got 10")),
        );
        check_options(
            r#"{"scoring": "half"}"#,
            Err(("scoring", "expected one of fraction, all_or_nothing, got \"half\"")),
        );
    }

    fn check_compare(compare: IoCompare, got: &str, expected: &str, matches: bool) {
        assert_eq!(
            compare.matches(got.as_bytes(), expected),
            matches,
            "{compare:?}: {got:?} vs {expected:?}"
        );
    }

    #[test]
    fn stdout_comparison() {
        let cases: &[(IoCompare, &str, &str, bool)] = &[
            (IoCompare::Lines, "3\n", "3\n", true),
            (IoCompare::Lines, "3", "3\n", true),
            (IoCompare::Lines, "3  \n\n\n", "3\n", true),
            (IoCompare::Lines, "1 2\n3\n", "1 2\n3\n", true),
            (IoCompare::Lines, "1  2\n", "1 2\n", false),
            (IoCompare::Lines, "\n3\n", "3\n", false),
            (IoCompare::Lines, "", "0\n", false),
            (IoCompare::Exact, "3", "3\n", false),
            (IoCompare::Exact, "3\n", "3\n", true),
            (IoCompare::Tokens, "1\n2   3", "1 2 3\n", true),
            (IoCompare::Tokens, "1 2", "1 2 3", false),
        ];
        for (compare, got, expected, matches) in cases {
            check_compare(*compare, got, expected, *matches);
        }
    }

    #[test]
    fn extracted_code_is_cut_on_a_char_boundary() {
        assert_eq!(truncate("abc", 3), "abc");
        assert_eq!(truncate("aé", 2), "a\n# ... (3 bytes in all)");
    }

    #[test]
    fn self_test_passes() {
        CodeVerifier::self_test().unwrap();
    }
}
