//! Daemon configuration (`rlvrd.toml`): one field table, the layers it is read from, a validator
//! that reports every problem, and the documented example rendered from the table.
//!
//! Layers, lowest first: built-in defaults, the config file, env vars `RLVR__SECTION__KEY`. They are
//! merged with figment, whose tags remember which layer every value came from (`layers.rs`).
//! Validation then walks the merged tree itself instead of stopping at serde's first error
//! (`check.rs`): every known key is checked on its own, unknown keys are found by comparing
//! against the table, and each problem names its key and where the value came from (`file
//! /etc/rlvr/rlvrd.toml`, `env RLVR__API__LISTEN`, `built-in default`). `rlvrd validate` prints
//! them all at once.
//!
//! The field table (`fields.rs`) is the one place a key is described: its dotted path, its kind
//! (type, range, default) and its doc. The validator, the defaults layer (and so
//! [`Config::default`]) and `configs/rlvrd.toml` ([`example_toml`]) all come from it. The serde
//! structs below only give the rest of the daemon typed fields: once the validator has accepted the
//! merged tree, serde builds the `Config` from it.

mod check;
mod example;
mod fields;
mod layers;
#[cfg(test)]
mod tests;

use std::collections::BTreeMap;
use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;

use rlvr_protocol::spec::Priority;
use serde::{Deserialize, Serialize};

pub use example::example_toml;
pub use layers::{ENV_PREFIX, load, load_from};
/// The config file `rlvrd` reads when no `--config` is given, and only if it exists.
pub use rlvr_plugin_host::dirs::DEFAULT_CONFIG_PATH;

/// The daemon's configuration. Its keys, ranges and defaults are documented in
/// `configs/rlvrd.toml`, which is rendered from the field table.
//
// No `#[serde(default)]` on these structs: the merged tree always holds the defaults layer, and
// serde calls a container's `Default` before it reads anything, which would recurse here, where
// the defaults are themselves deserialized from the table.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    pub daemon: DaemonConfig,
    pub redis: RedisConfig,
    pub api: ApiConfig,
    pub plugins: PluginsConfig,
    pub auth: AuthConfig,
    pub tenancy: TenancyConfig,
    pub outbound: OutboundConfig,
    pub devices: DevicesConfig,
    pub queue: QueueConfig,
    pub scheduler: SchedulerConfig,
    pub graders: GradersConfig,
    pub engines: EnginesConfig,
    pub tinker: TinkerConfig,
}

/// `[daemon]`
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DaemonConfig {
    /// Where the daemon keeps job state, checkpoints and loaded plugin copies. Absolute.
    pub state_dir: PathBuf,
    /// The worker executable (`rlvr-worker`); unset: `rlvr-worker` next to `rlvrd`. Absolute.
    pub worker_exe: Option<PathBuf>,
    /// Where model lines are published; unset: `<state_dir>/registry`. Absolute.
    pub registry: Option<PathBuf>,
}

/// `[redis]`
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RedisConfig {
    /// `redis://`, `rediss://` or `unix://` url of the queue's Redis.
    pub url: String,
}

/// `[api]`
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ApiConfig {
    pub listen: SocketAddr,
    /// Larger request bodies get 413.
    pub max_body_bytes: u64,
    /// Per team, on every route but `/healthz` and `/metrics`; more get 429.
    pub rate_limit_per_minute: u32,
    /// Per client address: requests with a missing, malformed or unknown token; more get 429.
    pub auth_failures_per_minute: u32,
    /// Open connections at most; must fit under the open-file limit.
    pub max_connections: u32,
    /// From a request's first byte to the end of its head.
    pub header_timeout_s: u64,
    /// From the end of a request's head to the end of its body.
    pub body_timeout_s: u64,
    /// Between requests on a kept-alive connection.
    pub idle_timeout_s: u64,
    /// Team dry-runs (`POST /v1/verify`) grading at once over the daemon.
    pub dry_runs_at_once: u32,
    /// Team dry-runs grading at once per team.
    pub dry_runs_per_team: u32,
    /// The longest one `POST /v1/verify` grades; items left are answered as not graded.
    pub dry_run_budget_s: u64,
    /// Event streams one team may have open at once.
    pub streams_per_team: u32,
    /// Requests one team may have open at once, event streams included.
    pub requests_per_team: u32,
    /// The built book served at `/docs`; unset: `book/` above `rlvrd`'s directory, when built.
    pub docs_dir: Option<PathBuf>,
}

/// `[queue]`: how the daemon takes jobs off Redis and looks after their workers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QueueConfig {
    pub poll_interval_ms: u64,
    pub heartbeat_ms: u64,
    /// Before a daemon counts as dead and its jobs go to another.
    pub missed_heartbeats: u32,
    /// Crashes of a job's worker before the job is dead-lettered.
    pub max_crashes: u32,
    /// On SIGTERM, how long running jobs get to checkpoint before their workers are killed.
    pub stop_timeout_s: u64,
    /// libtorch threads of each worker; 0 = every core.
    pub worker_threads: u32,
    /// Ended jobs' records a team keeps in Redis, the newest (`jobs::retention`).
    pub keep_ended_per_team: u32,
    /// Days an ended job's record is kept at most.
    pub keep_ended_days: u32,
}

/// `[scheduler]`: the settings of the scheduling policy (design.md §7).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SchedulerConfig {
    pub starvation_after_s: u64,
    pub fair_share_half_life_s: u64,
    pub preempt_grace_s: u64,
    /// `[scheduler.shares]`: team name → guaranteed fraction of the inventory's capacity.
    pub shares: BTreeMap<String, f64>,
}

/// `[graders]`: caps on what a grader's own options may ask of the host.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GradersConfig {
    pub max_memory_mb: u64,
    pub max_file_mb: u64,
    pub max_processes: u64,
    pub max_parallel: u64,
    pub max_response_bytes: u64,
    /// Sandboxes' work directories; `None`: `<state_dir>/grader-work`. Absolute.
    #[serde(default)]
    pub work_dir: Option<PathBuf>,
}

/// `[engines]`: the distributed engines jobs may train on.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EnginesConfig {
    /// The trl engine environment's python; `None`: trl jobs are refused.
    #[serde(default)]
    pub trl_python: Option<PathBuf>,
    /// A Ray cluster's Jobs API; `None`: ray-launched jobs are refused.
    #[serde(default)]
    pub ray_address: Option<String>,
    /// The python with Ray on the cluster's nodes; `None`: jobs on more than one node are refused.
    #[serde(default)]
    pub ray_python: Option<PathBuf>,
    /// The vLLM environment's python; `None`: `rollout.engine = "vllm"` jobs are refused.
    #[serde(default)]
    pub vllm_python: Option<PathBuf>,
    /// The installed `[env]` environments (`NAME.py`) and the python that runs them as a job's
    /// sidecar; `None`: `env.environment` is refused.
    #[serde(default)]
    pub environments: Option<PathBuf>,
    #[serde(default)]
    pub environments_python: Option<PathBuf>,
}

/// `[tinker]`: the Tinker SDK's training clients.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TinkerConfig {
    /// What each client asks for on its device.
    pub memory_gb: f64,
    /// A session's heartbeats stopped this long: its clients are suspended.
    pub idle_release_s: u64,
    /// State-changing requests between a client's checkpoints.
    pub checkpoint_every: u32,
    pub clients_per_team: u32,
    /// Requests per minute per team on the SDK's routes.
    pub rate_limit_per_minute: u32,
    /// Requests open at once per team on the SDK's routes.
    pub requests_per_team: u32,
}

/// `[plugins]`
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PluginsConfig {
    /// Directories watched for plugin libraries; they need not exist.
    pub dirs: Vec<PathBuf>,
    pub scan_interval_ms: u64,
    /// The registry's copies and probe reports; unset: `<state_dir>/plugin-cache`. Absolute.
    pub cache_dir: Option<PathBuf>,
}

/// `[auth]`
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AuthConfig {
    /// `[[auth.tokens]]`: one entry per bearer token.
    pub tokens: Vec<TokenConfig>,
}

/// One `[[auth.tokens]]` entry. The token itself is never in the config, only its hash.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenConfig {
    pub team: String,
    /// Hex sha256 of the token, 64 lowercase hex characters.
    pub sha256: String,
    /// Admin tokens may force promotions.
    #[serde(default)]
    pub admin: bool,
}

/// `[tenancy]`: what each team may name and ask for (SECURITY.md).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TenancyConfig {
    pub max_dataset_bytes: u64,
    pub max_datasets_per_team: u32,
    /// Seconds unnamed, uncited dataset content is kept after its last use.
    pub dataset_grace_s: u64,
    /// Waiting jobs per team unless its entry says otherwise.
    pub max_queued_per_team: u32,
    /// Model lines a team may own.
    pub max_lines_per_team: u32,
    /// The priorities a team may use unless its entry says otherwise.
    pub priorities: Vec<Priority>,
    /// `[[tenancy.teams]]`: per-team allowances.
    pub teams: Vec<TeamConfig>,
    /// `[[tenancy.base_models]]`.
    pub base_models: Vec<BaseModelConfig>,
    /// `[[tenancy.data_roots]]`.
    pub data_roots: Vec<DataRootConfig>,
    /// `[[tenancy.secrets]]`.
    pub secrets: Vec<SecretConfig>,
}

/// One `[[tenancy.teams]]` entry.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TeamConfig {
    pub name: String,
    #[serde(default)]
    pub priorities: Option<Vec<Priority>>,
    #[serde(default)]
    pub max_queued: Option<u32>,
}

/// One `[[tenancy.base_models]]` entry.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BaseModelConfig {
    pub name: String,
    pub path: PathBuf,
    /// `None`: every team.
    #[serde(default)]
    pub teams: Option<Vec<String>>,
}

/// One `[[tenancy.data_roots]]` entry.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DataRootConfig {
    pub name: String,
    pub path: PathBuf,
    pub teams: Vec<String>,
}

/// One `[[tenancy.secrets]]` entry: where its value is, never the value.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SecretConfig {
    pub name: String,
    pub teams: Vec<String>,
    /// Exactly one of `env` and `file` is set (the checker says so).
    #[serde(default)]
    pub env: Option<String>,
    #[serde(default)]
    pub file: Option<PathBuf>,
}

/// `[outbound]`: where outbound requests (webhooks) may go; read by `rlvr_outbound::Policy::new`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OutboundConfig {
    /// Allow-list entries (host, host:port, `*.domain`, IP, IP:port, CIDR); empty: none.
    pub allow: Vec<String>,
    /// Whether listed destinations may be non-public addresses.
    pub allow_private: bool,
}

impl OutboundConfig {
    /// The policy outbound requests go through. The validator has parsed every entry already,
    /// so this fails only for a config built in code.
    pub fn policy(&self) -> Result<rlvr_outbound::Policy, rlvr_outbound::PolicyError> {
        rlvr_outbound::Policy::new(&self.allow, self.allow_private)
    }
}

/// `[devices]`: the device inventory the scheduler packs jobs onto.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DevicesConfig {
    /// CPU slots, used when no GPU is found or when set.
    pub cpu_slots: Option<u32>,
    pub cpu_slot_memory_gb: Option<f64>,
    /// `[[devices.gpus]]`: the GPUs to use, with their memory, instead of every GPU NVML reports.
    pub gpus: Vec<GpuConfig>,
}

/// One `[[devices.gpus]]` entry: one GPU or MIG instance, by exactly one of `index` and `uuid`
/// (the checker says so).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GpuConfig {
    /// NVML's (nvidia-smi's) index of a GPU; unique.
    #[serde(default)]
    pub index: Option<u32>,
    /// A GPU's `GPU-…` or a MIG instance's `MIG-…` UUID, in full or a prefix only it has.
    #[serde(default)]
    pub uuid: Option<String>,
    pub memory_gb: f64,
}

impl Default for Config {
    /// The field table's defaults.
    fn default() -> Self {
        // The table is a constant; `defaults_are_the_tables` runs this, so it cannot fail in a
        // build whose tests pass.
        figment::value::Value::from(fields::defaults())
            .deserialize()
            .unwrap_or_else(|error| panic!("the config field table's defaults do not fit Config: {error}"))
    }
}

/// Each section's default is the table's, through [`Config::default`].
macro_rules! section_defaults {
    ($($section:ident: $type:ty),* $(,)?) => {$(
        impl Default for $type {
            fn default() -> Self {
                Config::default().$section
            }
        }
    )*};
}

section_defaults!(
    daemon: DaemonConfig,
    redis: RedisConfig,
    api: ApiConfig,
    plugins: PluginsConfig,
    auth: AuthConfig,
    tenancy: TenancyConfig,
    outbound: OutboundConfig,
    devices: DevicesConfig,
    queue: QueueConfig,
    scheduler: SchedulerConfig,
    graders: GradersConfig,
    engines: EnginesConfig,
    tinker: TinkerConfig,
);

/// Every problem found in a config, at once. Displays a count, then one problem per line.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("config has {} problem(s):\n{}", .problems.len(), lines(.problems))]
pub struct ConfigErrors {
    pub problems: Vec<ConfigProblem>,
}

/// One problem: which key, what is wrong, and where the value came from.
///
/// Displays as `{key}: {message} (from {source})`; problems about the file as a whole (missing,
/// unreadable, bad TOML syntax) have an empty `key` and display as `{message} (from {source})`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigProblem {
    /// Dotted path of the key, e.g. `api.listen` or `auth.tokens[1].sha256`; empty for the whole file.
    pub key: String,
    /// What is wrong, lowercase, without a trailing period.
    pub message: String,
    /// Where the value came from: `file PATH`, `env NAME` or `built-in default`.
    pub source: String,
}

impl ConfigProblem {
    fn new(key: impl Into<String>, message: impl Into<String>, source: impl Into<String>) -> Self {
        ConfigProblem { key: key.into(), message: message.into(), source: source.into() }
    }
}

impl fmt::Display for ConfigProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if !self.key.is_empty() {
            write!(f, "{}: ", self.key)?;
        }
        write!(f, "{} (from {})", self.message, self.source)
    }
}

fn lines(problems: &[ConfigProblem]) -> String {
    problems.iter().map(|problem| format!("  {problem}")).collect::<Vec<_>>().join("\n")
}
