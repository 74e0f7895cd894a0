//! The tenancy boundary (SECURITY.md, design.md §8): every name a team writes is resolved inside
//! that team's namespace, or refused with the field that named it.
//!
//! - [`datasets`]: the teams' uploaded datasets, content-addressed, per team.
//! - [`lines`]: model lines with an owner, readers, publishers and a gate-policy floor.
//! - [`curricula`]: each team's curricula, and the teams it shared each with.
//! - [`sweep`]: deletes dataset content once no name, unfinished job, running pipeline or
//!   published version cites it and its grace period has passed.
//! - [`resolve`]: a submitted spec checked against all of it and pinned (`dataset:NAME` becomes
//!   `dataset:NAME@SHA256`, `line:L` becomes `line:L@N`), and, when its worker starts, turned
//!   into the spec the worker reads, with server paths in place of names.
//! - [`shown`]: the other way round, for what a team reads: names in place of server paths.
//!
//! The operator's config is trusted ([`crate::config::TenancyConfig`]): base models, data roots,
//! secrets and per-team allowances. A team is whatever its token says ([`crate::api::auth`]).

pub mod curricula;
pub mod datasets;
pub mod lines;
pub mod resolve;
pub mod shown;
pub mod sweep;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use rlvr_protocol::spec::{Priority, SpecError};
use rlvr_protocol::worker::{GraderCaps, HostContext, Secret};

use crate::config::{Config, SecretConfig};
use crate::state_dir::StateDir;

pub use curricula::Curricula;
pub use datasets::Datasets;
pub use lines::Lines;

/// The entries of `dir`; none when it does not exist (a store's directories appear with their
/// first file).
pub(crate) fn entries_of(dir: &Path) -> std::io::Result<Vec<std::fs::DirEntry>> {
    match std::fs::read_dir(dir) {
        Ok(entries) => entries.collect(),
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(error) => Err(error),
    }
}

/// The names of the directories in `dir`, sorted (none when it does not exist).
pub(crate) fn directories_in(dir: &Path) -> std::io::Result<Vec<String>> {
    let mut names = Vec::new();
    for entry in entries_of(dir)? {
        if entry.file_type()?.is_dir()
            && let Ok(name) = entry.file_name().into_string()
        {
            names.push(name);
        }
    }
    names.sort();
    Ok(names)
}

/// What the config lets each team do and name.
#[derive(Debug, Clone)]
pub struct Tenancy {
    config: crate::config::TenancyConfig,
    /// `[graders]`, as every team's graders get it in their host context.
    grader_caps: GraderCaps,
    /// The teams' datasets.
    pub datasets: Datasets,
    /// The registry's model lines.
    pub lines: Lines,
    /// The teams' curricula.
    pub curricula: Curricula,
    /// Where Tinker clients' saved states are (`TEAM/RUN/KIND/NAME`): a job's `model.policy`
    /// may name one as `tinker://RUN/KIND/NAME`.
    pub tinker_root: PathBuf,
    /// The server's paths, and the names a team reads in their place.
    pub shown: shown::ShownPaths,
}

/// A team's allowance.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Allowance {
    pub priorities: Vec<Priority>,
    pub max_queued: u32,
}

/// Where a secret's value is, for the worker of a job whose team may use it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SecretSource {
    Env(String),
    File(PathBuf),
}

/// Why a secret's value could not be read: said to the operator (the daemon's log), never to the
/// team, whose message only says the secret is not available.
#[derive(Debug, thiserror::Error)]
pub enum SecretError {
    #[error("secret {name}: environment variable {variable} is not set or not UTF-8")]
    Env { name: String, variable: String },
    #[error("secret {name}: cannot read {path}: {source}")]
    File { name: String, path: PathBuf, source: std::io::Error },
}

impl Tenancy {
    /// From the daemon's config and state directory.
    pub fn new(config: &Config, state_dir: &StateDir) -> Self {
        let registry = config.daemon.registry.clone().unwrap_or_else(|| state_dir.default_registry());
        let graders = &config.graders;
        let grader_caps = GraderCaps {
            memory_mb: graders.max_memory_mb,
            max_file_mb: graders.max_file_mb,
            max_processes: graders.max_processes,
            max_parallel: graders.max_parallel,
            max_response_bytes: graders.max_response_bytes,
            work_root: Some(grader_work_dir(config, state_dir)),
        };
        let shown = shown_paths(config, state_dir, &registry);
        Tenancy {
            config: config.tenancy.clone(),
            grader_caps,
            datasets: Datasets::new(state_dir.datasets(), config.tenancy.max_dataset_bytes),
            lines: Lines::new(registry, config.tenancy.max_lines_per_team as usize),
            curricula: Curricula::new(state_dir.curricula()),
            tinker_root: state_dir.tinker(),
            shown,
        }
    }

    /// How long unnamed, uncited dataset content is kept after its last use.
    pub fn dataset_grace(&self) -> std::time::Duration {
        std::time::Duration::from_secs(self.config.dataset_grace_s)
    }

    /// The priorities and queue length `team` may use.
    pub fn allowance(&self, team: &str) -> Allowance {
        let entry = self.config.teams.iter().find(|entry| entry.name == team);
        Allowance {
            priorities: entry
                .and_then(|entry| entry.priorities.clone())
                .unwrap_or_else(|| self.config.priorities.clone()),
            max_queued: entry.and_then(|entry| entry.max_queued).unwrap_or(self.config.max_queued_per_team),
        }
    }

    /// How many datasets a team may keep.
    pub fn max_datasets(&self) -> u32 {
        self.config.max_datasets_per_team
    }

    /// The names of the base models `team` may use, in the config's order.
    pub fn base_model_names(&self, team: &str) -> Vec<String> {
        self.config
            .base_models
            .iter()
            .filter(|model| model.teams.as_ref().is_none_or(|teams| teams.iter().any(|t| t == team)))
            .map(|model| model.name.clone())
            .collect()
    }

    /// The directory of base model `name`, if `team` may use it. One message for "no such base
    /// model" and "not yours": a team learns nothing about what it may not use.
    pub fn base_model(&self, team: &str, name: &str) -> Result<&Path, String> {
        self.config
            .base_models
            .iter()
            .find(|model| {
                model.name == name && model.teams.as_ref().is_none_or(|teams| teams.iter().any(|t| t == team))
            })
            .map(|model| model.path.as_path())
            .ok_or_else(|| format!("no base model {name:?} is available to team {team}"))
    }

    /// The directory of data root `name`, if `team` may read it.
    pub fn data_root(&self, team: &str, name: &str) -> Result<&Path, String> {
        self.config
            .data_roots
            .iter()
            .find(|root| root.name == name && root.teams.iter().any(|t| t == team))
            .map(|root| root.path.as_path())
            .ok_or_else(|| format!("no data root {name:?} is available to team {team}"))
    }

    /// Where secret `name` is, if `team` may use it.
    pub fn secret(&self, team: &str, name: &str) -> Result<SecretSource, String> {
        self.config
            .secrets
            .iter()
            .find(|secret| secret.name == name && secret.teams.iter().any(|t| t == team))
            .and_then(source_of)
            .ok_or_else(|| format!("no secret {name:?} is available to team {team}"))
    }

    /// A refusal for each `(field, secret name)` the team may not use: one message whether the
    /// secret does not exist or is another team's.
    pub fn ungranted_secrets(&self, team: &str, named: &[(String, String)]) -> Vec<SpecError> {
        named
            .iter()
            .filter_map(|(field, name)| self.secret(team, name).err().map(|message| refuse(field, message)))
            .collect()
    }

    /// The values of every secret granted to `team`, read now (from the daemon's environment or
    /// files): what a job's worker is handed on its standard input. A team's job may name any
    /// of its team's secrets, so the worker gets them all and nothing else. A value that cannot
    /// be read is the operator's problem, said in the daemon's log; the job hears only that the
    /// secret is not available.
    pub fn team_secrets(&self, team: &str) -> Result<BTreeMap<String, Secret>, String> {
        let mut values = BTreeMap::new();
        for secret in self.config.secrets.iter().filter(|secret| secret.teams.iter().any(|t| t == team)) {
            let Some(source) = source_of(secret) else { continue };
            let value = read_secret(&secret.name, &source).map_err(|error| {
                tracing::error!(%error, "a secret cannot be read");
                format!(
                    "secret {:?} cannot be read by the daemon; the operator has been told in its log",
                    secret.name
                )
            })?;
            values.insert(secret.name.clone(), Secret::new(value));
        }
        Ok(values)
    }
}

impl Tenancy {
    /// What `team`'s plugins may use, in a worker or in the daemon's dry-run: its secrets and
    /// the operator's outbound policy.
    pub fn host_context(&self, team: &str, policy: &rlvr_outbound::Policy) -> Result<HostContext, String> {
        Ok(HostContext {
            secrets: self.team_secrets(team)?,
            outbound_allow: policy.entries().iter().map(ToString::to_string).collect(),
            outbound_allow_private: policy.allow_private(),
            outbound_unrestricted: false,
            // The worker gives its optimizer the job's own figure.
            max_new_tokens: None,
            grader_caps: Some(self.grader_caps.clone()),
        })
    }
}

/// Where graders' sandboxes work: `graders.work_dir`, or `<state_dir>/grader-work`.
pub fn grader_work_dir(config: &Config, state_dir: &StateDir) -> std::path::PathBuf {
    config.graders.work_dir.clone().unwrap_or_else(|| state_dir.default_grader_work())
}

fn source_of(secret: &SecretConfig) -> Option<SecretSource> {
    match (&secret.env, &secret.file) {
        (Some(variable), None) => Some(SecretSource::Env(variable.clone())),
        (None, Some(path)) => Some(SecretSource::File(path.clone())),
        _ => None,
    }
}

/// A secret's value: the variable's, or the file's without one trailing newline.
pub fn read_secret(name: &str, source: &SecretSource) -> Result<String, SecretError> {
    match source {
        SecretSource::Env(variable) => std::env::var(variable)
            .ok()
            .filter(|value| !value.is_empty())
            .ok_or_else(|| SecretError::Env { name: name.to_owned(), variable: variable.clone() }),
        SecretSource::File(path) => std::fs::read_to_string(path)
            .map(|text| text.strip_suffix('\n').unwrap_or(&text).to_owned())
            .map_err(|source| SecretError::File { name: name.to_owned(), path: path.clone(), source }),
    }
}

/// A refusal naming its field.
pub(crate) fn refuse(field: &str, message: impl Into<String>) -> SpecError {
    SpecError { field: field.to_owned(), message: message.into() }
}

/// The paths a team never reads, and their names: the operator's base models and data roots,
/// the registry and the state directory.
fn shown_paths(config: &Config, state_dir: &StateDir, registry: &Path) -> shown::ShownPaths {
    let tenancy = &config.tenancy;
    let mut pairs: Vec<(&Path, String)> =
        vec![(state_dir.path(), "state:".to_owned()), (registry, "registry:".to_owned())];
    pairs.extend(
        tenancy.base_models.iter().map(|model| (model.path.as_path(), format!("base:{}", model.name))),
    );
    pairs.extend(tenancy.data_roots.iter().map(|root| (root.path.as_path(), format!("root:{}", root.name))));
    shown::ShownPaths::new(pairs)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{BaseModelConfig, DataRootConfig, TeamConfig};

    fn tenancy() -> Tenancy {
        let mut config = Config::default();
        config.tenancy.teams = vec![TeamConfig {
            name: "research".into(),
            priorities: Some(vec![Priority::Low, Priority::Normal, Priority::High]),
            max_queued: Some(3),
        }];
        config.tenancy.base_models = vec![
            BaseModelConfig { name: "open".into(), path: "/m/open".into(), teams: None },
            BaseModelConfig {
                name: "closed".into(),
                path: "/m/closed".into(),
                teams: Some(vec!["research".into()]),
            },
        ];
        config.tenancy.data_roots =
            vec![DataRootConfig { name: "shared".into(), path: "/d".into(), teams: vec!["research".into()] }];
        config.tenancy.secrets = vec![SecretConfig {
            name: "token".into(),
            teams: vec!["research".into()],
            env: Some("RLVR_TEST_NEVER_SET_VARIABLE".into()),
            file: None,
        }];
        Tenancy::new(&config, &StateDir::new("/state".into()))
    }

    #[test]
    fn each_team_reaches_only_what_it_was_granted() {
        let tenancy = tenancy();
        assert_eq!(tenancy.allowance("research").max_queued, 3);
        // regression: any team preempted any other by writing priority = "high"
        assert_eq!(tenancy.allowance("vision").priorities, [Priority::Low, Priority::Normal]);
        assert_eq!(tenancy.base_model("vision", "open"), Ok(Path::new("/m/open")));
        assert_eq!(tenancy.base_model("research", "closed"), Ok(Path::new("/m/closed")));
        // Not granted and not there read the same.
        assert_eq!(
            tenancy.base_model("vision", "closed").unwrap_err().replace("closed", "X"),
            tenancy.base_model("vision", "missing").unwrap_err().replace("missing", "X")
        );
        assert!(tenancy.data_root("vision", "shared").is_err());
        assert_eq!(tenancy.data_root("research", "shared"), Ok(Path::new("/d")));
        assert!(tenancy.secret("vision", "token").is_err());
        // An unset variable says nothing to the team about the variable.
        let named = [("verifiers[0].bearer_token_secret".to_owned(), "token".to_owned())];
        assert!(tenancy.ungranted_secrets("research", &named).is_empty());
        let refused = tenancy.ungranted_secrets("vision", &named);
        assert_eq!(refused[0].field, "verifiers[0].bearer_token_secret");
        let message = tenancy.team_secrets("research").unwrap_err();
        assert!(!message.contains("RLVR_TEST_NEVER_SET_VARIABLE"), "{message}");
    }
}
