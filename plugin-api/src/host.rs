//! What the host gives a plugin when it creates one: the secrets the job may use and where the
//! plugin may send requests ([`HostContext`]).
//!
//! A plugin never reads the process environment for credentials: the worker's environment is
//! scrubbed, and an option naming an environment variable would let one team's job read what the
//! operator set for another. Instead an option names a secret (`bearer_token_secret =
//! "grader-token"`), the operator declares which teams may use it, and the host passes the values
//! of the secrets this job may use and its options name.
//!
//! # Wire form
//!
//! The context crosses the ABI (`create_in`) and the worker's stdin
//! (`rlvr-worker run --host-context-stdin`) as one JSON object:
//!
//! ```json
//! {"secrets": {"grader-token": "…"}, "outbound_allow": ["grader.example.com"], "outbound_allow_private": false}
//! ```
//!
//! - `secrets`: name → value, only those the job's team may use and its options name.
//! - `outbound_allow`: the destinations plugins may send requests to, as the operator's outbound
//!   allow-list writes them: a host, `host:port`, `*.domain` (its subdomains), an IP address,
//!   `IP:port` or a CIDR. Empty: none.
//! - `outbound_allow_private`: whether private, loopback and link-local addresses may be reached
//!   (checked again after name resolution).
//! - `outbound_unrestricted`: no outbound policy at all — only for a program run by hand on its
//!   user's behalf ([`HostContext::unrestricted`]); the daemon never sets it. A key of its own
//!   rather than a wildcard entry: the allow-list has no entry for "anywhere", and a missing key
//!   must mean the restricted default.
//!
//! - `max_new_tokens`: the job's `rollout.max_new_tokens`, for its optimizer.
//! - `grader_caps`: the operator's caps on what a grader's own options may ask of the host
//!   ([`GraderCaps`]): `{"memory_mb": 2048, "max_file_mb": 64, "max_processes": 64,
//!   "max_parallel": 4, "max_response_bytes": 4194304, "work_root": "/var/lib/rlvr/grader-work"}`.
//!   Absent: no caps (a program
//!   run by hand).
//!
//! Every key may be absent (its default: none, none, false, false), and keys a plugin does not
//! know are ignored, so a newer host can add one without breaking older plugins.
//!
//! `max_new_tokens` is there for DAPO's overlong shaping; graders hold their resource options to the
//! `grader_caps`. An option naming an environment variable (`bearer_token_env`) is refused without
//! reading the environment, so no answer depends on, or tells, what the environment holds.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

/// The host's context for one job's plugins; see the [module docs](self) for the JSON form.
///
/// The default is the most restricted context: no secrets, no outbound requests.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostContext {
    /// Secret values by name: only those the job's team may use and its options name.
    #[serde(default)]
    pub secrets: BTreeMap<String, Secret>,
    /// Destinations plugins may send requests to: `host`, `*.domain`, or `*` for any.
    #[serde(default)]
    pub outbound_allow: Vec<String>,
    /// Whether private, loopback and link-local addresses may be reached.
    #[serde(default)]
    pub outbound_allow_private: bool,
    /// No outbound policy at all: a program run by hand ([`HostContext::unrestricted`]).
    #[serde(default)]
    pub outbound_unrestricted: bool,
    /// The job's `rollout.max_new_tokens`, given to its optimizer (DAPO's overlong shaping needs
    /// it as `L_max`); `None` where no job runs (the daemon's option checks, `rlvrctl verify`).
    /// Appended: a plugin built before it ignores the key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_new_tokens: Option<u32>,
    /// The operator's caps on a grader's own resource options; `None`: none. Appended: a plugin
    /// built before it ignores the key (and its options are bounded by its own ranges only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grader_caps: Option<GraderCaps>,
}

/// What a grader's options may ask of the host at most, set by the operator (`[graders]` of
/// rlvrd's config), and where its sandboxes work. A grader whose options ask for more is refused
/// at the key; a default of the plugin's beyond a cap is lowered to it, as parallelism always is
/// (it changes no verdict) ([`GraderCaps::hold`], [`GraderCaps::parallel`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GraderCaps {
    /// Largest address space of one sandboxed process, MiB (`memory_mb` and the like).
    pub memory_mb: u64,
    /// Largest file a sandboxed process may write, MiB (`max_file_mb`).
    pub max_file_mb: u64,
    /// Most processes and threads of one sandboxed run (`max_processes`).
    pub max_processes: u64,
    /// Most items one grader runs at once (`max_parallel`).
    pub max_parallel: u64,
    /// Largest answer body an http or judge grader may accept, bytes (`max_response_bytes`).
    pub max_response_bytes: u64,
    /// Where sandboxes make their work directories (a filesystem the operator bounds); `None`:
    /// the system's temporary directory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub work_root: Option<std::path::PathBuf>,
}

/// A resource a grader's option asks for, as [`GraderCaps`] caps it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resource {
    /// Address space of one process, MiB.
    MemoryMb,
    /// Largest file written, MiB.
    FileMb,
    /// Processes and threads of one run.
    Processes,
    /// An answer body, bytes.
    ResponseBytes,
}

impl GraderCaps {
    /// Holds option `key`'s `value` of `resource` to its cap: refused beyond it when the options
    /// wrote the key (`written`), naming the operator's setting (`memory_mb: expected at most 2048
    /// on this host (graders.max_memory_mb), got 4096`); a default beyond it is lowered to it.
    pub fn hold(
        &self,
        key: &str,
        resource: Resource,
        value: &mut u64,
        written: bool,
    ) -> Result<(), crate::OptionError> {
        let (cap, setting) = match resource {
            Resource::MemoryMb => (self.memory_mb, "graders.max_memory_mb"),
            Resource::FileMb => (self.max_file_mb, "graders.max_file_mb"),
            Resource::Processes => (self.max_processes, "graders.max_processes"),
            Resource::ResponseBytes => (self.max_response_bytes, "graders.max_response_bytes"),
        };
        if *value > cap {
            if written {
                return Err(crate::OptionError::new(
                    key,
                    format!("expected at most {cap} on this host ({setting}), got {value}"),
                ));
            }
            *value = cap;
        }
        Ok(())
    }

    /// Holds a sandboxed grader's resource options: each of `limits` (`(key, resource, value)`)
    /// by [`hold`](Self::hold) (`written`: the options as the spec wrote them); `max_parallel`
    /// lowered to the cap; the sandboxes working under the host's work root unless the options
    /// name one (which a daemon refuses in a team's job).
    pub fn hold_sandbox(
        &self,
        written: &serde_json::Value,
        limits: &mut [(&str, Resource, &mut u64)],
        max_parallel: &mut usize,
        work_root: &mut Option<std::path::PathBuf>,
    ) -> Result<(), crate::OptionError> {
        for (key, resource, value) in limits.iter_mut() {
            self.hold(key, *resource, value, written.get(*key).is_some())?;
        }
        *max_parallel = self.parallel(*max_parallel);
        if work_root.is_none() {
            work_root.clone_from(&self.work_root);
        }
        Ok(())
    }

    /// Items graded at once: `asked`, lowered to the cap (at least 1).
    pub fn parallel(&self, asked: usize) -> usize {
        asked.min(usize::try_from(self.max_parallel).unwrap_or(usize::MAX)).max(1)
    }
}

impl HostContext {
    /// No secrets and no restriction on outbound requests: a program run by hand, on its user's
    /// own behalf (`rlvr-worker run` without `--host-context-stdin`, `rlvrctl verify`).
    pub fn unrestricted() -> Self {
        HostContext { outbound_unrestricted: true, ..HostContext::default() }
    }

    /// The secret named `name`, if this job may use it. The answer is the same whether no such
    /// secret exists or the job's team may not use it: plugins say "no secret named X is
    /// available to this job" either way.
    pub fn secret(&self, name: &str) -> Option<&Secret> {
        self.secrets.get(name)
    }

    /// The context as its one-line JSON form.
    pub fn to_json(&self) -> String {
        // A map of strings, strings and a bool: serializing cannot fail.
        serde_json::to_string(self).unwrap_or_else(|_| "{}".to_owned())
    }

    /// Reads the JSON form. Blank text is the default (most restricted) context. The error
    /// never quotes the text, which holds secret values.
    pub fn from_json(text: &str) -> Result<Self, HostContextError> {
        if text.trim().is_empty() {
            return Ok(HostContext::default());
        }
        serde_json::from_str(text).map_err(|error| HostContextError {
            line: error.line(),
            column: error.column(),
            category: match error.classify() {
                serde_json::error::Category::Data => "not the host context's shape",
                serde_json::error::Category::Eof => "cut short",
                _ => "not JSON",
            },
        })
    }
}

/// The host context's JSON could not be read. Says where, never what: the text holds secrets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostContextError {
    /// Line of the problem (1-based).
    pub line: usize,
    /// Column of the problem (1-based).
    pub column: usize,
    /// What kind of problem: not JSON, cut short, or not the context's shape.
    pub category: &'static str,
}

impl fmt::Display for HostContextError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "host context: {} at line {} column {}", self.category, self.line, self.column)
    }
}

impl std::error::Error for HostContextError {}

/// A secret's value. `Debug` shows `Secret(<redacted>)` and there is no `Display`: a value is
/// only read through [`Secret::expose`], where it is used.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Secret(String);

impl Secret {
    /// A secret with `value`.
    pub fn new(value: impl Into<String>) -> Self {
        Secret(value.into())
    }

    /// The value, for the one place that sends it. Never put it in a message.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(<redacted>)")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_json_form_round_trips_and_absent_keys_are_the_defaults() {
        let mut context = HostContext::default();
        context.secrets.insert("grader-token".into(), Secret::new("s3cret"));
        context.outbound_allow.push("grader.example.com".into());
        let json = context.to_json();
        assert_eq!(
            json,
            r#"{"secrets":{"grader-token":"s3cret"},"outbound_allow":["grader.example.com"],"outbound_allow_private":false,"outbound_unrestricted":false}"#
        );
        assert_eq!(HostContext::from_json(&json).unwrap(), context);
        assert_eq!(HostContext::from_json("{}").unwrap(), HostContext::default());
        // Absent keys are the restricted defaults: no destination at all.
        let default = HostContext::default();
        assert!(default.outbound_allow.is_empty() && !default.outbound_allow_private);
        assert!(!default.outbound_unrestricted && HostContext::unrestricted().outbound_unrestricted);
        assert_eq!(HostContext::from_json(" ").unwrap(), HostContext::default());
        // A newer host's key is ignored by an older plugin.
        assert_eq!(HostContext::from_json(r#"{"later_key": 1}"#).unwrap(), HostContext::default());
    }

    #[test]
    fn a_secret_never_shows_in_debug_or_errors() {
        let mut context = HostContext::unrestricted();
        context.secrets.insert("t".into(), Secret::new("s3cret"));
        assert!(!format!("{context:?}").contains("s3cret"));
        for text in [r#"{"secrets": {"t": "s3cret"}"#, r#"{"secrets": {"t": 5, "u": "s3cret"}}"#, "s3cret"] {
            let error = HostContext::from_json(text).unwrap_err().to_string();
            assert!(!error.contains("s3cret"), "{error}");
            assert!(error.starts_with("host context: "), "{error}");
        }
    }
}
