//! Asking a plugin about its options before a job runs: in this process for a plugin the host
//! has loaded, in a worker process (`rlvr-worker check-options`) for an optimizer the daemon only
//! probed, with the answers of the latter cached.
//!
//! The answer is `Ok(Some(report))` (accepted; the secret names and URLs the options refer to),
//! `Ok(None)` (a plugin built before `check_options`: checked when a worker creates it), or an
//! [`OptionsProblem`]. [`spec_field`] turns a key inside a plugin's options into the spec's own
//! path (`verifiers[1].fallbak`), for the daemon at submit and the worker at start alike.
//!
//! Why a worker process: `rlvrd` never maps optimizer code, so at submit it runs `rlvr-worker
//! check-options` (a process start with libtorch's load) once per library build and canonical
//! options, at most two at once. Measured on a 2-core machine (debug builds, 30 submits each): 1.4 ms
//! median per submit before; 1.4–1.5 ms after for options already seen, 185–197 ms for new optimizer
//! options. An answer that could not be had (the process failed) is not cached and not a refusal:
//! the job is checked at start, as for a plugin built before `check_options`, with `options not
//! checked by check_options` in its notes.

use std::collections::{HashMap, VecDeque};
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use rlvr_plugin_api::abi_stable::std_types::RResult;
use rlvr_plugin_api::{OptionError, OptionsReport, PluginError, PluginErrorKind, PluginModRef};
use rlvr_protocol::worker::OptionsCheck;
use serde_json::Value;

use crate::child;
use crate::loader;

/// Why a plugin's options were not accepted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OptionsProblem {
    /// The plugin refused them: a key inside its options (empty: the whole object) and why.
    #[error("{0}")]
    Refused(OptionError),
    /// The plugin failed to answer (it panicked, or its report did not parse): a job with these
    /// options would fail the same way when the plugin is created.
    #[error("the plugin failed checking its options: {message}")]
    Failed {
        /// What happened.
        message: String,
    },
    /// The question could not be asked (the worker process did not start, crashed or ran out
    /// of time). Nothing is known of the options; they are checked when a worker creates the
    /// plugin.
    #[error("the options could not be checked: {message}")]
    Unavailable {
        /// Why.
        message: String,
    },
}

/// The spec's path of `key` inside the options of the plugin at `section` (`verifiers[1]`,
/// `optimizer`, `curriculum`): `verifiers[1].fallbak`, or the section itself for a problem of
/// the whole object.
pub fn spec_field(section: &str, key: &str) -> String {
    if key.is_empty() {
        section.to_owned()
    } else if key.starts_with('[') {
        format!("{section}{key}")
    } else {
        format!("{section}.{key}")
    }
}

/// Asks a loaded library's `check_options`; `Ok(None)` when the library predates it.
pub fn check_in_process(
    module: &PluginModRef,
    options_json: &str,
) -> Result<Option<OptionsReport>, OptionsProblem> {
    let Some(check) = module.check_options() else {
        return Ok(None);
    };
    match check(options_json.into()) {
        RResult::ROk(report) => serde_json::from_str(report.as_str()).map(Some).map_err(|error| {
            OptionsProblem::Failed { message: format!("its report is not an options report: {error}") }
        }),
        RResult::RErr(error) => Err(problem(error)),
    }
}

/// A plugin's error as a problem: a refused key for `InvalidConfig`, a failure otherwise.
fn problem(error: PluginError) -> OptionsProblem {
    match error.kind {
        PluginErrorKind::InvalidConfig => OptionsProblem::Refused(OptionError::from(error)),
        _ => OptionsProblem::Failed { message: error.to_string() },
    }
}

/// The body of `rlvr-worker check-options`: loads `library` (no self-test: the registry's probe
/// ran it) and asks it about `options_json`.
pub fn check_main(library: &Path, options_json: &str) -> OptionsCheck {
    let module = match loader::load_for_options(library) {
        Ok(module) => module,
        Err(refusal) => return OptionsCheck::Unavailable { message: refusal.message },
    };
    match check_in_process(&module, options_json) {
        Ok(Some(report)) => OptionsCheck::Checked(report),
        Ok(None) => OptionsCheck::NotChecked,
        Err(OptionsProblem::Refused(error)) => {
            OptionsCheck::Refused { key: error.key, message: error.message }
        }
        Err(OptionsProblem::Failed { message }) => OptionsCheck::Failed { message },
        Err(OptionsProblem::Unavailable { message }) => OptionsCheck::Unavailable { message },
    }
}

/// Asks `library`'s `check_options` in a child process (`<exe> check-options`), within
/// `timeout`.
pub fn check_in_child(
    exe: &Path,
    library: &Path,
    options_json: &str,
    timeout: Duration,
) -> Result<Option<OptionsReport>, OptionsProblem> {
    let mut command = Command::new(exe);
    command.arg("check-options").arg("--plugin-path").arg(library).arg("--options-json").arg(options_json);
    let unavailable = |message: String| OptionsProblem::Unavailable { message };
    let output = child::run(command, timeout).map_err(|error| unavailable(error.to_string()))?;
    let Some(check) = output.last_line::<OptionsCheck>() else {
        return Err(unavailable(format!(
            "the worker process answered nothing readable ({})",
            output.describe()
        )));
    };
    match check {
        OptionsCheck::Checked(report) => Ok(Some(report)),
        OptionsCheck::NotChecked => Ok(None),
        OptionsCheck::Refused { key, message } => {
            Err(OptionsProblem::Refused(OptionError::new(key, message)))
        }
        OptionsCheck::Failed { message } => Err(OptionsProblem::Failed { message }),
        OptionsCheck::Unavailable { message } => Err(unavailable(message)),
    }
}

/// `json` with every object's keys sorted, so two spellings of the same options share a cache
/// entry; text that is not JSON is its own key.
pub fn canonical_json(json: &str) -> String {
    fn sort(value: Value) -> Value {
        match value {
            Value::Object(map) => {
                let mut entries: Vec<(String, Value)> = map.into_iter().collect();
                entries.sort_by(|a, b| a.0.cmp(&b.0));
                Value::Object(entries.into_iter().map(|(key, value)| (key, sort(value))).collect())
            }
            Value::Array(items) => Value::Array(items.into_iter().map(sort).collect()),
            other => other,
        }
    }
    match serde_json::from_str::<Value>(json) {
        Ok(value) => sort(value).to_string(),
        Err(_) => json.to_owned(),
    }
}

/// Answers of [`check_in_child`] by (library sha256, canonical options), at most `capacity` of
/// them, the oldest dropped first. Only answers that depend on nothing but those two are kept:
/// an [`OptionsProblem::Unavailable`] is asked again next time.
#[derive(Debug)]
pub struct OptionsCache {
    capacity: usize,
    answers: HashMap<(String, String), Result<Option<OptionsReport>, OptionsProblem>>,
    order: VecDeque<(String, String)>,
}

impl OptionsCache {
    /// An empty cache of at most `capacity` answers.
    pub fn new(capacity: usize) -> Self {
        OptionsCache { capacity, answers: HashMap::new(), order: VecDeque::new() }
    }

    /// The cached answer for `sha256` and `options_json`.
    pub fn get(
        &self,
        sha256: &str,
        options_json: &str,
    ) -> Option<Result<Option<OptionsReport>, OptionsProblem>> {
        self.answers.get(&(sha256.to_owned(), canonical_json(options_json))).cloned()
    }

    /// Keeps `answer` unless it is [`OptionsProblem::Unavailable`].
    pub fn put(
        &mut self,
        sha256: &str,
        options_json: &str,
        answer: &Result<Option<OptionsReport>, OptionsProblem>,
    ) {
        if matches!(answer, Err(OptionsProblem::Unavailable { .. })) || self.capacity == 0 {
            return;
        }
        let key = (sha256.to_owned(), canonical_json(options_json));
        if self.answers.insert(key.clone(), answer.clone()).is_none() {
            self.order.push_back(key);
        }
        while self.order.len() > self.capacity {
            if let Some(oldest) = self.order.pop_front() {
                self.answers.remove(&oldest);
            }
        }
    }

    /// Answers kept.
    pub fn len(&self) -> usize {
        self.answers.len()
    }

    /// Whether no answer is kept.
    pub fn is_empty(&self) -> bool {
        self.answers.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_inside_options_become_the_specs_fields() {
        let cases = [
            (("verifiers[1]", "fallbak"), "verifiers[1].fallbak"),
            (("optimizer", "kl_bta"), "optimizer.kl_bta"),
            (("curriculum", "history.p0.passes"), "curriculum.history.p0.passes"),
            (("verifiers[0]", "[2]"), "verifiers[0][2]"),
            (("verifiers[0]", ""), "verifiers[0]"),
        ];
        for ((section, key), expected) in cases {
            assert_eq!(spec_field(section, key), expected);
        }
    }

    #[test]
    fn the_cache_shares_spellings_drops_the_oldest_and_keeps_no_unavailable() {
        assert_eq!(
            canonical_json(r#"{"b": 1, "a": {"d": [{"f": 1, "e": 2}], "c": 3}}"#),
            canonical_json(r#"{"a":{"c":3,"d":[{"e":2,"f":1}]},"b":1}"#)
        );
        let mut cache = OptionsCache::new(2);
        let refused = Err(OptionsProblem::Refused(OptionError::new("kl_bta", "unknown key")));
        cache.put("sha", r#"{"x": 1, "y": 2}"#, &Ok(None));
        assert_eq!(cache.get("sha", r#"{"y":2,"x":1}"#), Some(Ok(None)));
        assert_eq!(cache.get("other", r#"{"y":2,"x":1}"#), None);
        cache.put("sha", "{}", &refused);
        cache.put("sha", r#"{"z": 3}"#, &Ok(Some(OptionsReport::default())));
        assert_eq!(cache.len(), 2);
        assert_eq!(cache.get("sha", r#"{"x": 1, "y": 2}"#), None, "the oldest answer is dropped");
        assert_eq!(cache.get("sha", "{}"), Some(refused));
        cache.put("sha", r#"{"w": 1}"#, &Err(OptionsProblem::Unavailable { message: "timeout".into() }));
        assert_eq!(cache.get("sha", r#"{"w": 1}"#), None);
    }
}
