//! Daemon configuration (`rlvrd.toml`): the schema, its layers and a validator that reports every problem.
//!
//! Layers, lowest first: built-in defaults, the config file, env vars `RLVR__SECTION__KEY`. They are
//! merged with figment, whose tags remember which layer every value came from. Validation then walks
//! the merged tree itself instead of stopping at serde's first error: every known key is checked on
//! its own, unknown keys are found by comparing against the schema, and each problem names its key and
//! where the value came from (`file /etc/rlvr/rlvrd.toml`, `env RLVR__API__LISTEN`, `built-in
//! default`). `rlvrd validate` prints them all at once.
//!
//! The serde derives on the structs describe the same schema (for `Serialize`d defaults and for
//! callers that deserialize a `Config` themselves); a test checks that serde and the validator agree
//! on every config the tests accept.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::io;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use figment::providers::{Format, Serialized, Toml};
use figment::value::{Dict, Map, Num, Tag, Value};
use figment::{Figment, Metadata, Profile, Provider};
use serde::{Deserialize, Serialize};

/// The config file `rlvrd` reads when no `--config` is given, and only if it exists.
pub const DEFAULT_CONFIG_PATH: &str = "/etc/rlvr/rlvrd.toml";

/// Prefix of the env vars that set config keys: `RLVR__SECTION__KEY`, e.g. `RLVR__API__LISTEN` or
/// `RLVR__PLUGINS__DIRS='["/a", "/b"]'`. Values are parsed like TOML values (lists, numbers, booleans,
/// `{key = "value"}` tables); the string keys (`daemon.state_dir`, `redis.url`, `api.listen`) take the
/// text as it is unless it is a quoted string.
pub const ENV_PREFIX: &str = "RLVR__";

const ENV_SEPARATOR: &str = "__";
/// Name of the env layer's figment metadata: how a value's tag is recognised as coming from env.
const ENV_LAYER_NAME: &str = "rlvr environment variables";
/// Keys whose env value is taken as text, so that `RLVR__REDIS__URL=...` never turns into a number.
const ENV_STRING_KEYS: [&str; 4] = ["daemon.state_dir", "daemon.worker_exe", "redis.url", "api.listen"];
/// Env values nested deeper than this are refused before parsing: figment's value parser recurses,
/// and an env var must not be able to overflow the stack.
const MAX_ENV_NESTING: usize = 32;
/// Longest string quoted back in a message; longer ones are cut.
const MAX_QUOTED_CHARS: usize = 80;
const DEFAULT_SOURCE: &str = "built-in default";

const SECTIONS: [&str; 8] = ["daemon", "redis", "api", "plugins", "auth", "devices", "queue", "scheduler"];
const REDIS_SCHEMES: [&str; 3] = ["redis://", "rediss://", "unix://"];
const SCAN_INTERVAL_MS: std::ops::RangeInclusive<u64> = 100..=60_000;
/// What a team name is, for messages: `[[auth.tokens]]` teams and `[scheduler.shares]` keys alike.
const TEAM_NAME: &str = "a team name of lowercase letters, digits, '_' and '-'";
/// Slack for the sum of `[scheduler.shares]`: shares written as decimals rarely add up exactly.
const SHARES_SUM_SLACK: f64 = 1e-9;

/// The daemon's configuration. See `configs/rlvrd.toml` for a documented example.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    pub daemon: DaemonConfig,
    pub redis: RedisConfig,
    pub api: ApiConfig,
    pub plugins: PluginsConfig,
    pub auth: AuthConfig,
    pub devices: DevicesConfig,
    pub queue: QueueConfig,
    pub scheduler: SchedulerConfig,
}

/// `[daemon]`
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DaemonConfig {
    /// Where the daemon keeps job state, checkpoints and loaded plugin copies. Absolute.
    pub state_dir: PathBuf,
    /// The worker executable (`rlvr-worker`), which runs each job and probes plugins. Absolute;
    /// unset: `rlvr-worker` next to `rlvrd`.
    pub worker_exe: Option<PathBuf>,
}

impl Default for DaemonConfig {
    fn default() -> Self {
        DaemonConfig { state_dir: PathBuf::from("/var/lib/rlvr"), worker_exe: None }
    }
}

/// `[redis]`
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RedisConfig {
    /// `redis://`, `rediss://` or `unix://` url of the queue's Redis.
    pub url: String,
}

impl Default for RedisConfig {
    fn default() -> Self {
        RedisConfig { url: "redis://127.0.0.1:6379".to_owned() }
    }
}

/// `[api]`
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ApiConfig {
    /// Address the HTTP API listens on.
    pub listen: SocketAddr,
    /// Largest request body accepted, in bytes (1024 to 67108864); larger ones get 413.
    pub max_body_bytes: u64,
    /// Requests per minute each team may make to the job routes (1 to 1000000); more get 429.
    pub rate_limit_per_minute: u32,
}

impl Default for ApiConfig {
    fn default() -> Self {
        ApiConfig {
            listen: SocketAddr::from(([127, 0, 0, 1], 8470)),
            max_body_bytes: 1 << 20,
            rate_limit_per_minute: 600,
        }
    }
}

/// `[queue]`: how the daemon takes jobs off Redis and looks after their workers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct QueueConfig {
    /// How often an idle daemon looks for new jobs, in milliseconds (50 to 10000).
    pub poll_interval_ms: u64,
    /// The daemon's heartbeat on Redis, in milliseconds (200 to 60000).
    pub heartbeat_ms: u64,
    /// Heartbeats missed before a daemon counts as dead and its jobs go to another (2 to 100).
    pub missed_heartbeats: u32,
    /// Crashes of a job's worker before the job is dead-lettered (1 to 100).
    pub max_crashes: u32,
    /// On SIGTERM, how long running jobs get to checkpoint before their workers are killed, in
    /// seconds (1 to 3600). Keep it under systemd's TimeoutStopSec.
    pub stop_timeout_s: u64,
    /// libtorch threads of each worker; 0 = every core (1 to 1024, or 0).
    pub worker_threads: u32,
}

impl Default for QueueConfig {
    fn default() -> Self {
        QueueConfig {
            poll_interval_ms: 250,
            heartbeat_ms: 2000,
            missed_heartbeats: 3,
            max_crashes: 3,
            stop_timeout_s: 100,
            worker_threads: 0,
        }
    }
}

/// `[scheduler]`: the settings of the scheduling policy (design.md §7).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SchedulerConfig {
    /// A job waiting this long, in seconds, stops smaller jobs from backfilling past it (1 to
    /// 604800).
    pub starvation_after_s: u64,
    /// How fast a team's past device use fades from its fair-share standing: the half-life, in
    /// seconds (1 to 2592000).
    pub fair_share_half_life_s: u64,
    /// How long a preempted job's worker gets to checkpoint at its step boundary before it is
    /// killed, in seconds (1 to 3600).
    pub preempt_grace_s: u64,
    /// `[scheduler.shares]`: team name → guaranteed fraction of the inventory's capacity, each in
    /// (0, 1], summing to at most 1. Teams not named have no guaranteed share.
    pub shares: BTreeMap<String, f64>,
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        SchedulerConfig {
            starvation_after_s: 600,
            fair_share_half_life_s: 3600,
            preempt_grace_s: 120,
            shares: BTreeMap::new(),
        }
    }
}

/// `[plugins]`
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PluginsConfig {
    /// Directories watched for plugin libraries. They need not exist: the registry warns at scan time.
    pub dirs: Vec<PathBuf>,
    /// How often the directories are scanned for new files, in milliseconds (100 to 60000).
    pub scan_interval_ms: u64,
}

impl Default for PluginsConfig {
    fn default() -> Self {
        PluginsConfig { dirs: vec![PathBuf::from("/usr/lib/rlvr/plugins")], scan_interval_ms: 1000 }
    }
}

/// `[auth]`
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AuthConfig {
    /// `[[auth.tokens]]`: one entry per bearer token.
    pub tokens: Vec<TokenConfig>,
}

/// One `[[auth.tokens]]` entry. The token itself is never in the config, only its hash.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenConfig {
    /// The team the token acts for: lowercase letters, digits, `_` and `-`.
    pub team: String,
    /// Hex sha256 of the token, 64 lowercase hex characters: `printf %s "$TOKEN" | sha256sum`.
    pub sha256: String,
    /// Admin tokens may force promotions.
    #[serde(default)]
    pub admin: bool,
}

/// `[devices]`: the device inventory the scheduler packs jobs onto.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DevicesConfig {
    /// CPU slots, used when no GPU is found or when set. At least 1.
    pub cpu_slots: Option<u32>,
    /// Memory of each CPU slot in GB; finite and greater than 0.
    pub cpu_slot_memory_gb: Option<f64>,
    /// `[[devices.gpus]]`: overrides what NVML reports.
    pub gpus: Vec<GpuConfig>,
}

/// One `[[devices.gpus]]` entry.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GpuConfig {
    /// CUDA device index; unique.
    pub index: u32,
    /// Usable memory in GB; finite and greater than 0.
    pub memory_gb: f64,
}

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

/// Where config comes from: built-in defaults < the file < env `RLVR__SECTION__KEY`.
///
/// `file: Some(p)` means the user named a file (`--config`): it must exist, else a problem naming it.
/// `file: None` means use [`DEFAULT_CONFIG_PATH`] if it exists, else defaults + env only.
pub fn load(file: Option<&Path>) -> Result<Config, ConfigErrors> {
    let mut problems = Vec::new();
    let mut env = Vec::new();
    for (name, value) in std::env::vars_os() {
        let name = match name.into_string() {
            Ok(name) => name,
            Err(name) => {
                let name = name.to_string_lossy();
                if name.starts_with(ENV_PREFIX) {
                    let message = "environment variable name is not valid UTF-8";
                    problems.push(ConfigProblem::new("", message, format!("env {name}")));
                }
                continue;
            }
        };
        if !name.starts_with(ENV_PREFIX) {
            continue;
        }
        match value.into_string() {
            Ok(value) => env.push((name, value)),
            Err(_) => {
                let key = env_keys(&name).join(".");
                problems.push(ConfigProblem::new(key, "value is not valid UTF-8", format!("env {name}")));
            }
        }
    }
    load_with(ConfigFile::from_option(file), env, problems)
}

/// Same as [`load`], but env vars come from `env` instead of the process environment.
pub fn load_from(
    file: Option<&Path>,
    env: impl IntoIterator<Item = (String, String)>,
) -> Result<Config, ConfigErrors> {
    load_with(ConfigFile::from_option(file), env.into_iter().collect(), Vec::new())
}

/// Which file to read, and whether its absence is a problem.
#[derive(Clone, Copy)]
struct ConfigFile<'a> {
    path: &'a Path,
    required: bool,
}

impl<'a> ConfigFile<'a> {
    fn from_option(file: Option<&'a Path>) -> Self {
        match file {
            Some(path) => ConfigFile { path, required: true },
            None => ConfigFile { path: Path::new(DEFAULT_CONFIG_PATH), required: false },
        }
    }
}

fn load_with(
    file: ConfigFile<'_>,
    env: Vec<(String, String)>,
    mut problems: Vec<ConfigProblem>,
) -> Result<Config, ConfigErrors> {
    let figment = layers(file, env, &mut problems);
    let config = match figment.find_value("") {
        Ok(root) => Checker { figment: &figment, problems: &mut problems }.config(&root),
        Err(errors) => {
            // Only the defaults layer can fail here (file and env are parsed before merging), and it
            // does not; keep whatever figment says rather than trust that.
            problems
                .extend(errors.into_iter().map(|e| ConfigProblem::new("", e.to_string(), DEFAULT_SOURCE)));
            Config::default()
        }
    };
    if problems.is_empty() { Ok(config) } else { Err(ConfigErrors { problems }) }
}

/// Merges the layers. Problems with the file or the env var names go to `problems`, and the layer
/// (or the variable) is left out.
fn layers(file: ConfigFile<'_>, env: Vec<(String, String)>, problems: &mut Vec<ConfigProblem>) -> Figment {
    let mut figment = Figment::from(Serialized::defaults(Config::default()));
    if let Some(layer) = file_layer(file, problems) {
        figment = figment.merge(layer);
    }
    figment.merge(env_layer(env, problems))
}

/// Data already read and parsed, with the metadata that names where it came from.
struct Layer {
    metadata: Metadata,
    data: Map<Profile, Dict>,
}

impl Provider for Layer {
    fn metadata(&self) -> Metadata {
        self.metadata.clone()
    }

    fn data(&self) -> figment::Result<Map<Profile, Dict>> {
        Ok(self.data.clone())
    }
}

fn file_source(path: &Path) -> String {
    format!("file {}", path.display())
}

/// Reads and parses the file once, so that what is validated is what was read.
fn file_layer(file: ConfigFile<'_>, problems: &mut Vec<ConfigProblem>) -> Option<Layer> {
    let source = file_source(file.path);
    let bytes = match std::fs::read(file.path) {
        Ok(bytes) => bytes,
        Err(e) if !file.required && e.kind() == io::ErrorKind::NotFound => return None,
        Err(e) => {
            problems.push(ConfigProblem::new(
                "",
                format!("cannot read config file: {}", io_reason(&e)),
                source,
            ));
            return None;
        }
    };
    let text = match String::from_utf8(bytes) {
        Ok(text) => text,
        Err(e) => {
            let valid = e.as_bytes().get(..e.utf8_error().valid_up_to()).unwrap_or_default();
            let line = valid.iter().filter(|b| **b == b'\n').count() + 1;
            problems.push(ConfigProblem::new("", format!("not valid UTF-8 at line {line}"), source));
            return None;
        }
    };
    match Toml::string(&text).data() {
        Ok(data) => Some(Layer { metadata: Metadata::from("TOML file", file.path), data }),
        Err(e) => {
            problems.push(ConfigProblem::new("", toml_message(&e.to_string()), source));
            None
        }
    }
}

fn io_reason(e: &io::Error) -> String {
    match e.kind() {
        io::ErrorKind::NotFound => "no such file".to_owned(),
        io::ErrorKind::PermissionDenied => "permission denied".to_owned(),
        io::ErrorKind::IsADirectory => "it is a directory".to_owned(),
        _ => lowercase_first(&e.to_string()),
    }
}

fn lowercase_first(s: &str) -> String {
    let mut chars = s.chars();
    match chars.next() {
        Some(first) => first.to_lowercase().chain(chars).collect(),
        None => String::new(),
    }
}

/// Turns toml's multi-line report ("TOML parse error at line 3, column 8", the source line, a caret,
/// the message) into one line: "invalid TOML at line 3, column 8: <message>".
fn toml_message(report: &str) -> String {
    let mut lines = report.lines();
    let head = lines.next().unwrap_or_default().trim();
    let position = head.strip_prefix("TOML parse error at ").unwrap_or(head);
    // The snippet lines carry a `|` gutter (`  |`, `3 | key = = 3`); the other lines are the message.
    let is_snippet =
        |l: &str| l.trim_start_matches(|c: char| c.is_ascii_digit() || c == ' ').starts_with('|');
    let message: Vec<&str> =
        lines.filter(|l| !is_snippet(l)).map(str::trim).filter(|l| !l.is_empty()).collect();
    let message = message.join("; ");
    let message = message.trim_end_matches('.');
    if message.is_empty() {
        format!("invalid TOML: {}", lowercase_first(position))
    } else {
        format!("invalid TOML at {position}: {}", lowercase_first(message))
    }
}

/// Splits `RLVR__API__LISTEN` into `["api", "listen"]`.
fn env_keys(name: &str) -> Vec<String> {
    let rest = name.strip_prefix(ENV_PREFIX).unwrap_or(name);
    rest.split(ENV_SEPARATOR).map(str::to_ascii_lowercase).collect()
}

/// Builds the env layer from `RLVR__` variables, in name order. Its metadata maps a key path back
/// to the variable that set it.
fn env_layer(env: Vec<(String, String)>, problems: &mut Vec<ConfigProblem>) -> Layer {
    let mut vars: Vec<(String, String)> =
        env.into_iter().filter(|(name, _)| name.starts_with(ENV_PREFIX)).collect();
    vars.sort();
    let mut dict = Dict::new();
    // Which variable set which key path; paths never overlap (conflicts are refused below).
    let mut owners: Vec<(Vec<String>, String)> = Vec::new();
    for (name, raw) in vars {
        let keys = env_keys(&name);
        let key = keys.join(".");
        let source = format!("env {name}");
        if keys.iter().any(String::is_empty) {
            let message = format!("malformed variable name, expected {ENV_PREFIX}SECTION{ENV_SEPARATOR}KEY");
            problems.push(ConfigProblem::new(key, message, source));
            continue;
        }
        if let Some((_, other)) = owners.iter().find(|(k, _)| k.starts_with(&keys) || keys.starts_with(k)) {
            problems.push(ConfigProblem::new(key, format!("conflicts with {other}, set only one"), source));
            continue;
        }
        let Some(value) = parse_env_value(&key, &raw) else {
            let message = format!("value nested more than {MAX_ENV_NESTING} levels deep");
            problems.push(ConfigProblem::new(key, message, source));
            continue;
        };
        insert(&mut dict, &keys, value);
        owners.push((keys, name));
    }
    let owners = Arc::new(owners);
    let metadata = Metadata::named(ENV_LAYER_NAME)
        .interpolater(move |_: &Profile, keys: &[&str]| env_var_for(&owners, keys));
    Layer { metadata, data: Map::from([(Profile::Default, dict)]) }
}

fn parse_env_value(key: &str, raw: &str) -> Option<Value> {
    if ENV_STRING_KEYS.contains(&key) && !raw.trim_start().starts_with('"') {
        return Some(Value::from(raw.to_owned()));
    }
    if nesting_depth(raw) > MAX_ENV_NESTING {
        return None;
    }
    let Ok(value) = raw.parse::<Value>();
    Some(value)
}

/// Upper bound on how deep `[` and `{` nest in `s` (brackets inside strings count too).
fn nesting_depth(s: &str) -> usize {
    let (mut depth, mut max) = (0usize, 0usize);
    for c in s.chars() {
        match c {
            '[' | '{' => {
                depth += 1;
                max = max.max(depth);
            }
            ']' | '}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    max
}

fn insert(dict: &mut Dict, keys: &[String], value: Value) {
    match keys {
        [] => {}
        [last] => {
            dict.insert(last.clone(), value);
        }
        [first, rest @ ..] => {
            let entry = dict.entry(first.clone()).or_insert_with(|| Value::from(Dict::new()));
            if let Value::Dict(_, inner) = entry {
                insert(inner, rest, value);
            }
        }
    }
}

/// The variable that set `keys` (or a table holding them), or, for a table the env layer created
/// to hold variables, the first variable under it.
fn env_var_for(owners: &[(Vec<String>, String)], keys: &[&str]) -> String {
    let shared = |k: &[String]| k.iter().zip(keys).all(|(a, b)| a == b);
    owners
        .iter()
        .find(|(k, _)| k.len() <= keys.len() && shared(k))
        .or_else(|| owners.iter().find(|(k, _)| shared(k)))
        .map(|(_, name)| name.clone())
        .unwrap_or_else(|| {
            let keys: Vec<String> = keys.iter().map(|k| k.to_ascii_uppercase()).collect();
            format!("{ENV_PREFIX}{}", keys.join(ENV_SEPARATOR))
        })
}

/// A key's path in the config, e.g. `auth.tokens[1].sha256`.
#[derive(Clone, Default)]
struct KeyPath(Vec<Segment>);

#[derive(Clone)]
enum Segment {
    Key(String),
    Index(usize),
}

impl KeyPath {
    fn key(&self, key: &str) -> KeyPath {
        let mut path = self.clone();
        path.0.push(Segment::Key(key.to_owned()));
        path
    }

    fn index(&self, index: usize) -> KeyPath {
        let mut path = self.clone();
        path.0.push(Segment::Index(index));
        path
    }

    fn is_root(&self) -> bool {
        self.0.is_empty()
    }

    /// The table keys only, as figment's interpolater takes them.
    fn keys(&self) -> Vec<&str> {
        self.0
            .iter()
            .filter_map(|s| match s {
                Segment::Key(k) => Some(k.as_str()),
                Segment::Index(_) => None,
            })
            .collect()
    }
}

impl fmt::Display for KeyPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, segment) in self.0.iter().enumerate() {
            match segment {
                Segment::Index(index) => write!(f, "[{index}]")?,
                Segment::Key(key) => {
                    if i > 0 {
                        f.write_str(".")?;
                    }
                    let bare = !key.is_empty()
                        && key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
                    if bare { f.write_str(key)? } else { write!(f, "{}", quote(key))? }
                }
            }
        }
        Ok(())
    }
}

/// Walks the merged tree against the schema, collecting problems and building the `Config`. The
/// `Config` it returns is only meaningful when it found no problem.
struct Checker<'a> {
    figment: &'a Figment,
    problems: &'a mut Vec<ConfigProblem>,
}

impl Checker<'_> {
    fn source(&self, tag: Tag, path: &KeyPath) -> String {
        match self.figment.get_metadata(tag) {
            Some(m) if m.name == ENV_LAYER_NAME => {
                format!("env {}", m.interpolate(&Profile::Default, &path.keys()))
            }
            Some(m) => match m.source.as_ref().and_then(|s| s.file_path()) {
                Some(path) => file_source(path),
                None => DEFAULT_SOURCE.to_owned(),
            },
            None => DEFAULT_SOURCE.to_owned(),
        }
    }

    fn report(&mut self, path: &KeyPath, tag: Tag, message: impl Into<String>) {
        let source = self.source(tag, path);
        self.problems.push(ConfigProblem::new(path.to_string(), message, source));
    }

    fn expected(&mut self, path: &KeyPath, value: &Value, what: &str) {
        self.report(path, value.tag(), format!("expected {what}, found {}", describe(value)));
    }

    /// `value` as a table, reporting keys not in `known`.
    fn table<'v>(&mut self, path: &KeyPath, value: &'v Value, known: &[&str]) -> Option<&'v Dict> {
        let dict = self.any_table(path, value)?;
        let what = if path.is_root() { "section" } else { "key" };
        for (key, v) in dict {
            if !known.contains(&key.as_str()) {
                let message = format!("unknown {what}, expected one of: {}", known.join(", "));
                self.report(&path.key(key), v.tag(), message);
            }
        }
        Some(dict)
    }

    /// `value` as a table whose keys are data (team names, say), not a schema.
    fn any_table<'v>(&mut self, path: &KeyPath, value: &'v Value) -> Option<&'v Dict> {
        match value {
            Value::Dict(_, dict) if !is_datetime(dict) => Some(dict),
            _ => {
                self.expected(path, value, "a table");
                None
            }
        }
    }

    fn required<'v>(
        &mut self,
        path: &KeyPath,
        table: &Value,
        dict: &'v Dict,
        key: &str,
    ) -> Option<&'v Value> {
        let value = dict.get(key);
        if value.is_none() {
            self.report(&path.key(key), table.tag(), "missing required key");
        }
        value
    }

    fn string<'v>(&mut self, path: &KeyPath, value: &'v Value, what: &str) -> Option<&'v str> {
        match value {
            Value::String(_, s) => Some(s),
            _ => {
                self.expected(path, value, what);
                None
            }
        }
    }

    fn boolean(&mut self, path: &KeyPath, value: &Value) -> Option<bool> {
        match value {
            Value::Bool(_, b) => Some(*b),
            _ => {
                self.expected(path, value, "true or false");
                None
            }
        }
    }

    fn integer(
        &mut self,
        path: &KeyPath,
        value: &Value,
        range: std::ops::RangeInclusive<u64>,
        what: &str,
    ) -> Option<u64> {
        let found = match value {
            Value::Num(_, n) => {
                integer_of(*n).and_then(|i| u64::try_from(i).ok()).filter(|i| range.contains(i))
            }
            _ => None,
        };
        if found.is_none() {
            self.expected(path, value, what);
        }
        found
    }

    fn u32(&mut self, path: &KeyPath, value: &Value, min: u32, what: &str) -> Option<u32> {
        let found = self.integer(path, value, u64::from(min)..=u64::from(u32::MAX), what)?;
        u32::try_from(found).ok()
    }

    fn positive_number(&mut self, path: &KeyPath, value: &Value, what: &str) -> Option<f64> {
        let found = match value {
            Value::Num(_, n) => Some(float_of(*n)).filter(|f| f.is_finite() && *f > 0.0),
            _ => None,
        };
        if found.is_none() {
            self.expected(path, value, what);
        }
        found
    }

    fn array<'v>(&mut self, path: &KeyPath, value: &'v Value, what: &str) -> Option<&'v [Value]> {
        match value {
            Value::Array(_, items) => Some(items),
            _ => {
                self.expected(path, value, what);
                None
            }
        }
    }

    fn config(&mut self, root: &Value) -> Config {
        let mut config = Config::default();
        let path = KeyPath::default();
        let Some(root) = self.table(&path, root, &SECTIONS) else { return config };
        if let Some(v) = root.get("daemon") {
            self.daemon(&path.key("daemon"), v, &mut config.daemon);
        }
        if let Some(v) = root.get("redis") {
            self.redis(&path.key("redis"), v, &mut config.redis);
        }
        if let Some(v) = root.get("api") {
            self.api(&path.key("api"), v, &mut config.api);
        }
        if let Some(v) = root.get("plugins") {
            self.plugins(&path.key("plugins"), v, &mut config.plugins);
        }
        if let Some(v) = root.get("auth") {
            self.auth(&path.key("auth"), v, &mut config.auth);
        }
        if let Some(v) = root.get("devices") {
            self.devices(&path.key("devices"), v, &mut config.devices);
        }
        if let Some(v) = root.get("queue") {
            self.queue(&path.key("queue"), v, &mut config.queue);
        }
        if let Some(v) = root.get("scheduler") {
            self.scheduler(&path.key("scheduler"), v, &mut config.scheduler);
        }
        config
    }

    fn daemon(&mut self, path: &KeyPath, value: &Value, out: &mut DaemonConfig) {
        let Some(table) = self.table(path, value, &["state_dir", "worker_exe"]) else { return };
        if let Some(v) = table.get("state_dir") {
            let path = path.key("state_dir");
            let what = "an absolute path";
            match self.string(&path, v, what) {
                Some(s) if Path::new(s).is_absolute() => out.state_dir = PathBuf::from(s),
                Some(_) => self.expected(&path, v, what),
                None => {}
            }
        }
        if let Some(v) = table.get("worker_exe").filter(|v| !matches!(v, Value::Empty(..))) {
            let path = path.key("worker_exe");
            let what = "an absolute path";
            match self.string(&path, v, what) {
                Some(s) if Path::new(s).is_absolute() => out.worker_exe = Some(PathBuf::from(s)),
                Some(_) => self.expected(&path, v, what),
                None => {}
            }
        }
    }

    fn redis(&mut self, path: &KeyPath, value: &Value, out: &mut RedisConfig) {
        let Some(table) = self.table(path, value, &["url"]) else { return };
        if let Some(v) = table.get("url") {
            let path = path.key("url");
            let what = "a url starting with redis://, rediss:// or unix://";
            let Some(url) = self.string(&path, v, what) else { return };
            match REDIS_SCHEMES.iter().find(|scheme| url.starts_with(*scheme)) {
                Some(scheme) if url.len() > scheme.len() && !url.contains(char::is_whitespace) => {
                    out.url = url.to_owned();
                }
                Some(_) => self.report(
                    &path,
                    v.tag(),
                    format!("expected a host or socket path after the scheme, found {}", redact_url(url)),
                ),
                None => self.report(&path, v.tag(), format!("expected {what}, found {}", redact_url(url))),
            }
        }
    }

    fn queue(&mut self, path: &KeyPath, value: &Value, out: &mut QueueConfig) {
        let known = [
            "poll_interval_ms",
            "heartbeat_ms",
            "missed_heartbeats",
            "max_crashes",
            "stop_timeout_s",
            "worker_threads",
        ];
        let Some(table) = self.table(path, value, &known) else { return };
        let mut integer = |key: &str, range: std::ops::RangeInclusive<u64>, out: &mut u64| {
            if let Some(v) = table.get(key) {
                let what = format!("an integer from {} to {}", range.start(), range.end());
                if let Some(found) = self.integer(&path.key(key), v, range, &what) {
                    *out = found;
                }
            }
        };
        integer("poll_interval_ms", 50..=10_000, &mut out.poll_interval_ms);
        integer("heartbeat_ms", 200..=60_000, &mut out.heartbeat_ms);
        integer("stop_timeout_s", 1..=3600, &mut out.stop_timeout_s);
        let mut small = [
            ("missed_heartbeats", 2..=100, u64::from(out.missed_heartbeats)),
            ("max_crashes", 1..=100, u64::from(out.max_crashes)),
            ("worker_threads", 0..=1024, u64::from(out.worker_threads)),
        ];
        for (key, range, value) in &mut small {
            integer(key, range.clone(), value);
        }
        out.missed_heartbeats = small[0].2 as u32;
        out.max_crashes = small[1].2 as u32;
        out.worker_threads = small[2].2 as u32;
    }

    fn scheduler(&mut self, path: &KeyPath, value: &Value, out: &mut SchedulerConfig) {
        let known = ["starvation_after_s", "fair_share_half_life_s", "preempt_grace_s", "shares"];
        let Some(table) = self.table(path, value, &known) else { return };
        let mut integer = |key: &str, range: std::ops::RangeInclusive<u64>, out: &mut u64| {
            if let Some(v) = table.get(key) {
                let what = format!("an integer from {} to {} (seconds)", range.start(), range.end());
                if let Some(found) = self.integer(&path.key(key), v, range, &what) {
                    *out = found;
                }
            }
        };
        integer("starvation_after_s", 1..=604_800, &mut out.starvation_after_s);
        integer("fair_share_half_life_s", 1..=2_592_000, &mut out.fair_share_half_life_s);
        integer("preempt_grace_s", 1..=3600, &mut out.preempt_grace_s);
        if let Some(v) = table.get("shares") {
            self.shares(&path.key("shares"), v, &mut out.shares);
        }
    }

    /// `[scheduler.shares]`: every team name and fraction on its own, then their sum.
    fn shares(&mut self, path: &KeyPath, value: &Value, out: &mut BTreeMap<String, f64>) {
        let Some(table) = self.any_table(path, value) else { return };
        let mut shares = BTreeMap::new();
        for (team, v) in table {
            let key = path.key(team);
            let valid_team = is_team_name(team);
            if !valid_team {
                self.report(&key, v.tag(), format!("expected {TEAM_NAME}, found {}", quote(team)));
            }
            let what = "a fraction of the capacity greater than 0 and at most 1";
            let share = self.positive_number(&key, v, what);
            let share = match share {
                Some(share) if share > 1.0 => {
                    self.expected(&key, v, what);
                    None
                }
                share => share,
            };
            if let Some(share) = share.filter(|_| valid_team) {
                shares.insert(team.clone(), share);
            }
        }
        let sum: f64 = shares.values().sum();
        if sum > 1.0 + SHARES_SUM_SLACK {
            let teams: Vec<String> =
                shares.iter().map(|(team, share)| format!("{team} {}", short_number(*share))).collect();
            let message = format!(
                "expected shares summing to at most 1, found {} ({})",
                short_number(sum),
                teams.join(", ")
            );
            self.report(path, value.tag(), message);
        }
        *out = shares;
    }

    fn api(&mut self, path: &KeyPath, value: &Value, out: &mut ApiConfig) {
        let Some(table) = self.table(path, value, &["listen", "max_body_bytes", "rate_limit_per_minute"])
        else {
            return;
        };
        if let Some(v) = table.get("max_body_bytes") {
            let what = "an integer from 1024 to 67108864";
            if let Some(found) = self.integer(&path.key("max_body_bytes"), v, 1024..=(64 << 20), what) {
                out.max_body_bytes = found;
            }
        }
        if let Some(v) = table.get("rate_limit_per_minute") {
            let what = "an integer from 1 to 1000000";
            if let Some(found) = self.integer(&path.key("rate_limit_per_minute"), v, 1..=1_000_000, what) {
                out.rate_limit_per_minute = found as u32;
            }
        }
        if let Some(v) = table.get("listen") {
            let path = path.key("listen");
            let what = "a socket address like 127.0.0.1:8470";
            match self.string(&path, v, what).map(str::parse::<SocketAddr>) {
                Some(Ok(addr)) => out.listen = addr,
                Some(Err(_)) => self.expected(&path, v, what),
                None => {}
            }
        }
    }

    fn plugins(&mut self, path: &KeyPath, value: &Value, out: &mut PluginsConfig) {
        let Some(table) = self.table(path, value, &["dirs", "scan_interval_ms"]) else { return };
        if let Some(v) = table.get("dirs") {
            let path = path.key("dirs");
            if let Some(items) =
                self.array(&path, v, "a list of directories like [\"/usr/lib/rlvr/plugins\"]")
            {
                let mut dirs = Vec::new();
                for (i, item) in items.iter().enumerate() {
                    let path = path.index(i);
                    match self.string(&path, item, "a directory path") {
                        Some("") => self.expected(&path, item, "a non-empty directory path"),
                        Some(dir) => dirs.push(PathBuf::from(dir)),
                        None => {}
                    }
                }
                out.dirs = dirs;
            }
        }
        if let Some(v) = table.get("scan_interval_ms") {
            let what = "an integer from 100 to 60000 (milliseconds)";
            if let Some(ms) = self.integer(&path.key("scan_interval_ms"), v, SCAN_INTERVAL_MS, what) {
                out.scan_interval_ms = ms;
            }
        }
    }

    fn auth(&mut self, path: &KeyPath, value: &Value, out: &mut AuthConfig) {
        let Some(table) = self.table(path, value, &["tokens"]) else { return };
        let Some(v) = table.get("tokens") else { return };
        let path = path.key("tokens");
        let Some(items) = self.array(&path, v, "a list of tables ([[auth.tokens]])") else { return };
        let mut first_with: HashMap<String, usize> = HashMap::new();
        for (i, item) in items.iter().enumerate() {
            let Some(token) = self.token(&path.index(i), item) else { continue };
            if let Some(first) = first_with.get(&token.sha256) {
                let message = format!("same sha256 as {path}[{first}], every token must be different");
                self.report(&path.index(i).key("sha256"), item.tag(), message);
            } else {
                first_with.insert(token.sha256.clone(), i);
            }
            out.tokens.push(token);
        }
    }

    fn token(&mut self, path: &KeyPath, value: &Value) -> Option<TokenConfig> {
        let table = self.table(path, value, &["team", "sha256", "admin"])?;
        let team = self.required(path, value, table, "team").and_then(|v| self.team(&path.key("team"), v));
        let sha256 =
            self.required(path, value, table, "sha256").and_then(|v| self.sha256(&path.key("sha256"), v));
        let admin = match table.get("admin") {
            Some(v) => self.boolean(&path.key("admin"), v),
            None => Some(false),
        };
        Some(TokenConfig { team: team?, sha256: sha256?, admin: admin? })
    }

    fn team(&mut self, path: &KeyPath, value: &Value) -> Option<String> {
        let team = self.string(path, value, TEAM_NAME)?;
        if !is_team_name(team) {
            self.expected(path, value, TEAM_NAME);
            return None;
        }
        Some(team.to_owned())
    }

    /// Never quotes the value back: a token pasted here by mistake must not end up in the logs.
    fn sha256(&mut self, path: &KeyPath, value: &Value) -> Option<String> {
        let what =
            "the hex sha256 of the token (64 lowercase hex characters: printf %s \"$TOKEN\" | sha256sum)";
        let found = match value {
            Value::String(_, s) if s.len() == 64 && s.chars().all(|c| matches!(c, '0'..='9' | 'a'..='f')) => {
                return Some(s.clone());
            }
            Value::String(_, s) if s.len() == 64 && s.chars().all(|c| c.is_ascii_hexdigit()) => {
                "64 hex characters with uppercase letters".to_owned()
            }
            Value::String(_, s) => format!("a string of {} characters", s.chars().count()),
            other => kind(other).to_owned(),
        };
        self.report(path, value.tag(), format!("expected {what}, found {found}"));
        None
    }

    fn devices(&mut self, path: &KeyPath, value: &Value, out: &mut DevicesConfig) {
        let Some(table) = self.table(path, value, &["cpu_slots", "cpu_slot_memory_gb", "gpus"]) else {
            return;
        };
        match table.get("cpu_slots") {
            None | Some(Value::Empty(..)) => {}
            Some(v) => out.cpu_slots = self.u32(&path.key("cpu_slots"), v, 1, "an integer of at least 1"),
        }
        match table.get("cpu_slot_memory_gb") {
            None | Some(Value::Empty(..)) => {}
            Some(v) => {
                let what = "a number of gigabytes greater than 0";
                out.cpu_slot_memory_gb = self.positive_number(&path.key("cpu_slot_memory_gb"), v, what);
            }
        }
        let Some(v) = table.get("gpus") else { return };
        let path = path.key("gpus");
        let Some(items) = self.array(&path, v, "a list of tables ([[devices.gpus]])") else { return };
        let mut first_with: HashMap<u32, usize> = HashMap::new();
        for (i, item) in items.iter().enumerate() {
            let Some(gpu) = self.gpu(&path.index(i), item) else { continue };
            if let Some(first) = first_with.get(&gpu.index) {
                let message = format!("gpu {} is already listed at {path}[{first}]", gpu.index);
                self.report(&path.index(i).key("index"), item.tag(), message);
            } else {
                first_with.insert(gpu.index, i);
            }
            out.gpus.push(gpu);
        }
    }

    fn gpu(&mut self, path: &KeyPath, value: &Value) -> Option<GpuConfig> {
        let table = self.table(path, value, &["index", "memory_gb"])?;
        let index = self
            .required(path, value, table, "index")
            .and_then(|v| self.u32(&path.key("index"), v, 0, "a device index (an integer of at least 0)"));
        let memory_gb = self.required(path, value, table, "memory_gb").and_then(|v| {
            self.positive_number(&path.key("memory_gb"), v, "a number of gigabytes greater than 0")
        });
        Some(GpuConfig { index: index?, memory_gb: memory_gb? })
    }
}

/// Team names, wherever the config names a team: lowercase letters, digits, `_` and `-`.
fn is_team_name(team: &str) -> bool {
    !team.is_empty()
        && team.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == '-')
}

/// `x` with at most 6 decimals, so that a sum like `0.1 + 0.2` reads `0.3`.
fn short_number(x: f64) -> String {
    ((x * 1e6).round() / 1e6).to_string()
}

/// An integer `Num` as `i128` (which holds every integer but `u128` above `i128::MAX`); `None` for
/// floats.
fn integer_of(n: Num) -> Option<i128> {
    Some(match n {
        Num::U8(v) => v.into(),
        Num::U16(v) => v.into(),
        Num::U32(v) => v.into(),
        Num::U64(v) => v.into(),
        Num::U128(v) => i128::try_from(v).unwrap_or(i128::MAX),
        Num::USize(v) => i128::try_from(v).unwrap_or(i128::MAX),
        Num::I8(v) => v.into(),
        Num::I16(v) => v.into(),
        Num::I32(v) => v.into(),
        Num::I64(v) => v.into(),
        Num::I128(v) => v,
        Num::ISize(v) => i128::try_from(v).unwrap_or(i128::MAX),
        Num::F32(_) | Num::F64(_) => return None,
    })
}

/// Any `Num` as `f64`. An `f32` goes through its shortest decimal form, so `8.1f32` is `8.1`, not
/// `8.100000381469727`.
fn float_of(n: Num) -> f64 {
    match n {
        Num::F32(v) => v.to_string().parse().unwrap_or(f64::from(v)),
        Num::F64(v) => v,
        other => integer_of(other).map_or(f64::NAN, |i| i as f64),
    }
}

fn num_text(n: Num) -> String {
    match integer_of(n) {
        Some(i) => match n {
            Num::U128(v) => v.to_string(),
            _ => i.to_string(),
        },
        None => float_of(n).to_string(),
    }
}

/// toml's date-times reach figment as a table with one magic key.
fn is_datetime(dict: &Dict) -> bool {
    dict.len() == 1 && dict.keys().all(|k| k == "$__toml_private_datetime")
}

fn kind(value: &Value) -> &'static str {
    match value {
        Value::String(..) => "a string",
        Value::Char(..) => "a character",
        Value::Bool(..) => "a boolean",
        Value::Num(..) => "a number",
        Value::Empty(..) => "nothing",
        Value::Dict(_, dict) if is_datetime(dict) => "a date-time",
        Value::Dict(..) => "a table",
        Value::Array(..) => "a list",
    }
}

/// What a value is, for "found ...": scalars as they are written, tables and lists by kind.
fn describe(value: &Value) -> String {
    match value {
        Value::String(_, s) => quote(s),
        Value::Char(_, c) => format!("{c:?}"),
        Value::Bool(_, b) => b.to_string(),
        Value::Num(_, n) => num_text(*n),
        other => kind(other).to_owned(),
    }
}

/// `s` quoted and escaped on one line, cut at [`MAX_QUOTED_CHARS`].
fn quote(s: &str) -> String {
    if s.chars().count() <= MAX_QUOTED_CHARS {
        format!("{s:?}")
    } else {
        let cut: String = s.chars().take(MAX_QUOTED_CHARS).collect();
        format!("{cut:?}…")
    }
}

/// A url quoted without its credentials: `redis://user:pw@host` becomes `"redis://…@host"`.
fn redact_url(url: &str) -> String {
    match (url.split_once("://"), url.rsplit_once('@')) {
        (Some((scheme, _)), Some((_, host))) => quote(&format!("{scheme}://…@{host}")),
        (None, Some((_, host))) => quote(&format!("…@{host}")),
        (_, None) => quote(url),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const EXAMPLE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../configs/rlvrd.toml");
    const SHA_A: &str = "fc370c33546204391aad5a828b0b76a2b8cc73c1f3a2b6d6b437574760089ab4";
    const SHA_B: &str = "47276e0703c50cdecbe34a9ca7d1d202246b0ca57271aacc86a9b7bb24e939a0";
    /// Stands for "no file": optional and absent, like a missing DEFAULT_CONFIG_PATH.
    fn no_file() -> ConfigFile<'static> {
        ConfigFile { path: Path::new("/nonexistent/rlvr-config-test/rlvrd.toml"), required: false }
    }

    fn env_vec(env: &[(&str, &str)]) -> Vec<(String, String)> {
        env.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    fn load_file(file: ConfigFile<'_>, env: &[(&str, &str)]) -> Result<Config, ConfigErrors> {
        load_with(file, env_vec(env), Vec::new())
    }

    /// Loads `toml` (written to a temp file; `None`: no file) under `env`. `expected` lists the
    /// problems as displayed, `{file}` standing for the temp file's path; empty means the config must
    /// load, and then serde must agree with the validator on the result.
    fn check(toml: Option<&str>, env: &[(&str, &str)], expected: &[&str]) -> Config {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("rlvrd.toml");
        let file = match toml {
            Some(toml) => {
                std::fs::write(&path, toml).unwrap();
                ConfigFile { path: &path, required: true }
            }
            None => no_file(),
        };
        let result = load_file(file, env);
        let expected: Vec<String> =
            expected.iter().map(|e| e.replace("{file}", &path.display().to_string())).collect();
        match result {
            Ok(config) => {
                assert!(expected.is_empty(), "loaded, but expected problems:\n{}", expected.join("\n"));
                let serde: Config = layers(file, env_vec(env), &mut Vec::new()).extract().unwrap();
                assert_eq!(serde, config, "serde and the validator disagree");
                config
            }
            Err(errors) => {
                let got: Vec<String> = errors.problems.iter().map(ToString::to_string).collect();
                assert_eq!(got, expected);
                Config::default()
            }
        }
    }

    #[test]
    fn defaults_alone_are_valid() {
        assert_eq!(check(None, &[], &[]), Config::default());
        assert_eq!(check(Some(""), &[], &[]), Config::default());
    }

    #[test]
    fn defaults_are_the_documented_ones() {
        let config = Config::default();
        assert_eq!(config.daemon.state_dir, Path::new("/var/lib/rlvr"));
        assert_eq!(config.redis.url, "redis://127.0.0.1:6379");
        assert_eq!(config.api.listen.to_string(), "127.0.0.1:8470");
        assert_eq!(config.plugins.dirs, [PathBuf::from("/usr/lib/rlvr/plugins")]);
        assert_eq!(config.plugins.scan_interval_ms, 1000);
        assert!(config.auth.tokens.is_empty());
        assert_eq!(config.devices, DevicesConfig { cpu_slots: None, cpu_slot_memory_gb: None, gpus: vec![] });
        assert_eq!(
            config.scheduler,
            SchedulerConfig {
                starvation_after_s: 600,
                fair_share_half_life_s: 3600,
                preempt_grace_s: 120,
                shares: BTreeMap::new(),
            }
        );
    }

    #[test]
    fn file_overrides_default() {
        let toml = format!(
            r#"
            [daemon]
            state_dir = "/srv/rlvr"
            [redis]
            url = "unix:///run/redis.sock"
            [api]
            listen = "0.0.0.0:9000"
            [plugins]
            dirs = ["/a", "relative/b"]
            scan_interval_ms = 100
            [[auth.tokens]]
            team = "research"
            sha256 = "{SHA_A}"
            [[auth.tokens]]
            team = "ops-2"
            sha256 = "{SHA_B}"
            admin = true
            [devices]
            cpu_slots = 3
            cpu_slot_memory_gb = 8
            [[devices.gpus]]
            index = 1
            memory_gb = 79.5
            [scheduler]
            starvation_after_s = 1
            fair_share_half_life_s = 2592000
            preempt_grace_s = 3600
            [scheduler.shares]
            research = 0.5
            ops-2 = 0.25
            eval_team = 0.25
            "#
        );
        let config = check(Some(&toml), &[], &[]);
        let expected = Config {
            daemon: DaemonConfig { state_dir: "/srv/rlvr".into(), worker_exe: None },
            redis: RedisConfig { url: "unix:///run/redis.sock".into() },
            api: ApiConfig { listen: "0.0.0.0:9000".parse().unwrap(), ..ApiConfig::default() },
            plugins: PluginsConfig { dirs: vec!["/a".into(), "relative/b".into()], scan_interval_ms: 100 },
            auth: AuthConfig {
                tokens: vec![
                    TokenConfig { team: "research".into(), sha256: SHA_A.into(), admin: false },
                    TokenConfig { team: "ops-2".into(), sha256: SHA_B.into(), admin: true },
                ],
            },
            devices: DevicesConfig {
                cpu_slots: Some(3),
                cpu_slot_memory_gb: Some(8.0),
                gpus: vec![GpuConfig { index: 1, memory_gb: 79.5 }],
            },
            queue: QueueConfig::default(),
            scheduler: SchedulerConfig {
                starvation_after_s: 1,
                fair_share_half_life_s: 2_592_000,
                preempt_grace_s: 3600,
                shares: BTreeMap::from([
                    ("research".to_owned(), 0.5),
                    ("ops-2".to_owned(), 0.25),
                    ("eval_team".to_owned(), 0.25),
                ]),
            },
        };
        assert_eq!(config, expected);
    }

    #[test]
    fn env_overrides_file() {
        let toml = "[api]\nlisten = \"127.0.0.1:1\"\n[plugins]\ndirs = [\"/from/file\"]\n";
        let tokens = format!(r#"[{{team = "ci", sha256 = "{SHA_A}", admin = true}}]"#);
        let env = [
            ("RLVR__API__LISTEN", "0.0.0.0:8470"),
            ("RLVR__PLUGINS__DIRS", r#"["/a", "/b"]"#),
            ("RLVR__DEVICES__CPU_SLOTS", "4"),
            ("RLVR__DEVICES__CPU_SLOT_MEMORY_GB", "8.1"),
            ("RLVR__DEVICES__GPUS", "[{index = 0, memory_gb = 80.5}]"),
            ("RLVR__AUTH__TOKENS", &tokens),
            ("RLVR__REDIS__URL", "rediss://cache.internal:6380"),
            ("RLVR__DAEMON__STATE_DIR", r#""/quoted/dir""#),
            ("RLVR__SCHEDULER__PREEMPT_GRACE_S", "30"),
            ("RLVR__SCHEDULER__SHARES", "{research = 0.6, ci = 0.4}"),
            ("OTHER__API__LISTEN", "nonsense"),
        ];
        let config = check(Some(toml), &env, &[]);
        assert_eq!(config.api.listen.to_string(), "0.0.0.0:8470");
        assert_eq!(config.plugins.dirs, [PathBuf::from("/a"), PathBuf::from("/b")]);
        assert_eq!(config.plugins.scan_interval_ms, 1000);
        assert_eq!(config.devices.cpu_slots, Some(4));
        assert_eq!(config.devices.cpu_slot_memory_gb, Some(8.1));
        assert_eq!(config.devices.gpus, [GpuConfig { index: 0, memory_gb: 80.5 }]);
        assert_eq!(
            config.auth.tokens,
            [TokenConfig { team: "ci".into(), sha256: SHA_A.into(), admin: true }]
        );
        assert_eq!(config.redis.url, "rediss://cache.internal:6380");
        assert_eq!(config.daemon.state_dir, Path::new("/quoted/dir"));
        assert_eq!(config.scheduler.preempt_grace_s, 30);
        assert_eq!(config.scheduler.starvation_after_s, 600);
        assert_eq!(
            config.scheduler.shares,
            BTreeMap::from([("ci".to_owned(), 0.4), ("research".to_owned(), 0.6)])
        );
        // One share per variable, merged with the file's table.
        let toml = "[scheduler.shares]\nresearch = 0.5\n";
        let config = check(Some(toml), &[("RLVR__SCHEDULER__SHARES__CI", "0.5")], &[]);
        assert_eq!(
            config.scheduler.shares,
            BTreeMap::from([("ci".to_owned(), 0.5), ("research".to_owned(), 0.5)])
        );
    }

    #[test]
    fn every_problem_is_reported_at_once_with_its_source() {
        let toml = r#"
            [api]
            listen = "nonsense"
            lisen = "127.0.0.1:1"
            [[auth.tokens]]
            team = "research"
            sha256 = "not-a-hash"
            [devices]
            cpu_slots = 0
        "#;
        let env = [("RLVR__PLUGINS__SCAN_INTERVAL_MS", "5"), ("RLVR__REDIS__URL", "http://user:pw@host:1")];
        check(
            Some(toml),
            &env,
            &[
                r#"redis.url: expected a url starting with redis://, rediss:// or unix://, found "http://…@host:1" (from env RLVR__REDIS__URL)"#,
                "api.lisen: unknown key, expected one of: listen, max_body_bytes, rate_limit_per_minute (from file {file})",
                r#"api.listen: expected a socket address like 127.0.0.1:8470, found "nonsense" (from file {file})"#,
                "plugins.scan_interval_ms: expected an integer from 100 to 60000 (milliseconds), found 5 (from env RLVR__PLUGINS__SCAN_INTERVAL_MS)",
                r#"auth.tokens[0].sha256: expected the hex sha256 of the token (64 lowercase hex characters: printf %s "$TOKEN" | sha256sum), found a string of 10 characters (from file {file})"#,
                "devices.cpu_slots: expected an integer of at least 1, found 0 (from file {file})",
            ],
        );
    }

    #[test]
    fn named_file_must_exist() {
        let missing = Path::new("/nonexistent/rlvr-config-test/missing.toml");
        let errors = load_from(Some(missing), Vec::new()).unwrap_err();
        assert_eq!(
            errors.to_string(),
            "config has 1 problem(s):\n  \
             cannot read config file: no such file (from file /nonexistent/rlvr-config-test/missing.toml)"
        );
        // `load` reads the process env, which the tests never set; the file problem is there either way.
        let errors = load(Some(missing)).unwrap_err();
        assert!(errors.problems.iter().any(|p| p.source == format!("file {}", missing.display())));
    }

    #[test]
    fn missing_default_file_means_defaults_and_env() {
        let config = load_file(no_file(), &[("RLVR__API__LISTEN", "127.0.0.1:9")]).unwrap();
        assert_eq!(config.api.listen.to_string(), "127.0.0.1:9");
    }

    #[test]
    fn a_directory_is_not_a_config_file() {
        let dir = tempfile::tempdir().unwrap();
        let errors = load_from(Some(dir.path()), Vec::new()).unwrap_err();
        assert_eq!(errors.problems.len(), 1);
        assert_eq!(errors.problems[0].key, "");
        assert_eq!(errors.problems[0].source, format!("file {}", dir.path().display()));
    }

    #[test]
    fn toml_syntax_error_is_one_problem_with_file_and_line() {
        check(
            Some("[api]\nlisten = \"127.0.0.1:1\"\nscan_interval_ms = = 3\n"),
            &[],
            &["invalid TOML at line 3, column 20: invalid string; expected `\"`, `'` (from file {file})"],
        );
        check(
            Some("[api]\nlisten = \"a\"\nlisten = \"b\"\n"),
            &[],
            &["invalid TOML at line 3, column 1: duplicate key `listen` in table `api` (from file {file})"],
        );
        check(
            Some("a = 1\n\u{0}\n"),
            &[],
            &["invalid TOML at line 2, column 1: invalid key (from file {file})"],
        );
    }

    #[test]
    fn file_that_is_not_utf8_is_one_problem_with_its_line() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("rlvrd.toml");
        std::fs::write(&path, b"[api]\nlisten = \"\xff\"\n").unwrap();
        let errors = load_from(Some(&path), Vec::new()).unwrap_err();
        assert_eq!(
            errors.to_string(),
            format!("config has 1 problem(s):\n  not valid UTF-8 at line 2 (from file {})", path.display())
        );
    }

    #[test]
    fn unknown_sections_and_keys() {
        check(
            Some("[apii]\nlisten = \"127.0.0.1:1\"\n[devices]\ncpu = 1\n"),
            &[("RLVR__METRICS__PORT", "9")],
            &[
                "apii: unknown section, expected one of: daemon, redis, api, plugins, auth, devices, queue, scheduler (from file {file})",
                "metrics: unknown section, expected one of: daemon, redis, api, plugins, auth, devices, queue, scheduler (from env RLVR__METRICS__PORT)",
                "devices.cpu: unknown key, expected one of: cpu_slots, cpu_slot_memory_gb, gpus (from file {file})",
            ],
        );
        check(
            Some("\"a.b\" = 1\n[api]\n\"with space\" = 2\n"),
            &[],
            &[
                r#""a.b": unknown section, expected one of: daemon, redis, api, plugins, auth, devices, queue, scheduler (from file {file})"#,
                r#"api."with space": unknown key, expected one of: listen, max_body_bytes, rate_limit_per_minute (from file {file})"#,
            ],
        );
    }

    #[test]
    fn example_config_loads() {
        let config = load_file(ConfigFile { path: Path::new(EXAMPLE), required: true }, &[]).unwrap();
        assert_eq!(config.daemon.state_dir, Path::new("/var/lib/rlvr"));
        assert_eq!(config.api.listen.to_string(), "127.0.0.1:8470");
        assert_eq!(config.plugins.dirs, [PathBuf::from("/usr/lib/rlvr/plugins")]);
        // The example leaves the devices to NVML or one CPU slot: a copy on a GPU machine must
        // not turn its GPUs into CPU slots.
        assert_eq!(config.devices, DevicesConfig::default());
        assert_eq!(config.scheduler, SchedulerConfig::default());
        let teams: Vec<(&str, bool)> =
            config.auth.tokens.iter().map(|t| (t.team.as_str(), t.admin)).collect();
        assert_eq!(teams, [("research", false), ("admin", true)]);
        // Through `check` too, so serde agrees with the validator on it.
        check(Some(&std::fs::read_to_string(EXAMPLE).unwrap()), &[], &[]);
    }

    #[test]
    fn value_problems() {
        let cases: &[(&str, &str)] = &[
            (
                "[daemon]\nstate_dir = \"var/lib\"",
                r#"daemon.state_dir: expected an absolute path, found "var/lib""#,
            ),
            ("[daemon]\nstate_dir = \"\"", r#"daemon.state_dir: expected an absolute path, found """#),
            (
                "[daemon]\nstate_dir = 1979-05-27",
                "daemon.state_dir: expected an absolute path, found a date-time",
            ),
            ("daemon = 5", "daemon: expected a table, found 5"),
            (
                "[redis]\nurl = \"redis://\"",
                r#"redis.url: expected a host or socket path after the scheme, found "redis://""#,
            ),
            (
                "[redis]\nurl = \"redis://a b\"",
                r#"redis.url: expected a host or socket path after the scheme, found "redis://a b""#,
            ),
            (
                "[redis]\nurl = \"localhost:6379\"",
                r#"redis.url: expected a url starting with redis://, rediss:// or unix://, found "localhost:6379""#,
            ),
            ("[api]\nlisten = 8470", "api.listen: expected a socket address like 127.0.0.1:8470, found 8470"),
            (
                "[api]\nlisten = \"localhost:8470\"",
                r#"api.listen: expected a socket address like 127.0.0.1:8470, found "localhost:8470""#,
            ),
            (
                "[plugins]\ndirs = \"/a\"",
                r#"plugins.dirs: expected a list of directories like ["/usr/lib/rlvr/plugins"], found "/a""#,
            ),
            (
                "[plugins]\ndirs = [\"/a\", \"\", 3]",
                "plugins.dirs[1]: expected a non-empty directory path, found \"\"\nplugins.dirs[2]: expected a directory path, found 3",
            ),
            (
                "[plugins]\nscan_interval_ms = 60001",
                "plugins.scan_interval_ms: expected an integer from 100 to 60000 (milliseconds), found 60001",
            ),
            (
                "[plugins]\nscan_interval_ms = -1",
                "plugins.scan_interval_ms: expected an integer from 100 to 60000 (milliseconds), found -1",
            ),
            (
                "[plugins]\nscan_interval_ms = 1000.0",
                "plugins.scan_interval_ms: expected an integer from 100 to 60000 (milliseconds), found 1000",
            ),
            (
                "[auth]\ntokens = {team = \"a\"}",
                "auth.tokens: expected a list of tables ([[auth.tokens]]), found a table",
            ),
            (
                "[[auth.tokens]]\nadmin = \"yes\"\nuser = \"x\"",
                "auth.tokens[0].user: unknown key, expected one of: team, sha256, admin\nauth.tokens[0].team: missing required key\nauth.tokens[0].sha256: missing required key\nauth.tokens[0].admin: expected true or false, found \"yes\"",
            ),
            (
                "[devices]\ncpu_slots = 4294967296",
                "devices.cpu_slots: expected an integer of at least 1, found 4294967296",
            ),
            (
                "[devices]\ncpu_slot_memory_gb = nan",
                "devices.cpu_slot_memory_gb: expected a number of gigabytes greater than 0, found NaN",
            ),
            (
                "[devices]\ncpu_slot_memory_gb = -inf",
                "devices.cpu_slot_memory_gb: expected a number of gigabytes greater than 0, found -inf",
            ),
            (
                "[devices]\ncpu_slot_memory_gb = 0",
                "devices.cpu_slot_memory_gb: expected a number of gigabytes greater than 0, found 0",
            ),
            (
                "[[devices.gpus]]\nindex = 0\nmemory_gb = 80\n[[devices.gpus]]\nindex = 0\nmemory_gb = 40\n[[devices.gpus]]\nmemory_gb = \"80\"",
                "devices.gpus[1].index: gpu 0 is already listed at devices.gpus[0]\ndevices.gpus[2].index: missing required key\ndevices.gpus[2].memory_gb: expected a number of gigabytes greater than 0, found \"80\"",
            ),
            (
                "[[devices.gpus]]\nindex = -1\nmemory_gb = 1",
                "devices.gpus[0].index: expected a device index (an integer of at least 0), found -1",
            ),
            (
                "[scheduler]\nstarvation_after_s = 0\nfair_share_half_life_s = 2592001\npreempt_grace_s = 1.5\npreempt = 1",
                "scheduler.preempt: unknown key, expected one of: starvation_after_s, fair_share_half_life_s, preempt_grace_s, shares\n\
                 scheduler.starvation_after_s: expected an integer from 1 to 604800 (seconds), found 0\n\
                 scheduler.fair_share_half_life_s: expected an integer from 1 to 2592000 (seconds), found 2592001\n\
                 scheduler.preempt_grace_s: expected an integer from 1 to 3600 (seconds), found 1.5",
            ),
            ("[scheduler]\nshares = 0.5", "scheduler.shares: expected a table, found 0.5"),
            (
                "[scheduler.shares]\nResearch = 0.5\n\"a b\" = \"0.1\"\nzero = 0\nbig = 1.5\nok = 1",
                "scheduler.shares.Research: expected a team name of lowercase letters, digits, '_' and '-', found \"Research\"\n\
                 scheduler.shares.\"a b\": expected a team name of lowercase letters, digits, '_' and '-', found \"a b\"\n\
                 scheduler.shares.\"a b\": expected a fraction of the capacity greater than 0 and at most 1, found \"0.1\"\n\
                 scheduler.shares.big: expected a fraction of the capacity greater than 0 and at most 1, found 1.5\n\
                 scheduler.shares.zero: expected a fraction of the capacity greater than 0 and at most 1, found 0",
            ),
            (
                "[scheduler.shares]\nresearch = 0.7\nvision = 0.2\nops = 0.2",
                "scheduler.shares: expected shares summing to at most 1, found 1.1 (ops 0.2, research 0.7, vision 0.2)",
            ),
        ];
        for (toml, expected) in cases {
            let expected: Vec<String> =
                expected.lines().map(|l| format!("{l} (from file {{file}})")).collect();
            let expected: Vec<&str> = expected.iter().map(String::as_str).collect();
            check(Some(toml), &[], &expected);
        }
    }

    #[test]
    fn shares_that_sum_to_one_in_decimals_are_accepted() {
        // 0.1 + 0.2 + 0.7 is 1.0000000000000002 in f64.
        let config = check(Some("[scheduler.shares]\na = 0.1\nb = 0.2\nc = 0.7\n"), &[], &[]);
        assert_eq!(config.scheduler.shares.len(), 3);
        check(Some("[scheduler.shares]\nall = 1\n"), &[], &[]);
        check(Some("[scheduler.shares]\n"), &[], &[]);
    }

    #[test]
    fn token_problems_never_quote_the_secret() {
        let upper = SHA_A.to_uppercase();
        let toml = format!(
            r#"
            [[auth.tokens]]
            team = "Research"
            sha256 = "{upper}"
            [[auth.tokens]]
            team = "a"
            sha256 = "my-secret-token"
            [[auth.tokens]]
            team = "b"
            sha256 = "{SHA_B}"
            [[auth.tokens]]
            team = "c"
            sha256 = "{SHA_B}"
            "#
        );
        let what = r#"expected the hex sha256 of the token (64 lowercase hex characters: printf %s "$TOKEN" | sha256sum)"#;
        check(
            Some(&toml),
            &[],
            &[
                r#"auth.tokens[0].team: expected a team name of lowercase letters, digits, '_' and '-', found "Research" (from file {file})"#,
                &format!(
                    "auth.tokens[0].sha256: {what}, found 64 hex characters with uppercase letters (from file {{file}})"
                ),
                &format!(
                    "auth.tokens[1].sha256: {what}, found a string of 15 characters (from file {{file}})"
                ),
                "auth.tokens[3].sha256: same sha256 as auth.tokens[2], every token must be different (from file {file})",
            ],
        );
    }

    #[test]
    fn env_problems_name_the_variable() {
        let bad_tokens = r#"[{team = "ci", sha256 = "abc"}]"#;
        check(
            None,
            &[
                ("RLVR__API__LISEN", "127.0.0.1:1"),
                ("RLVR__API____X", "1"),
                ("RLVR__", "1"),
                ("RLVR__AUTH__TOKENS", bad_tokens),
                ("RLVR__DEVICES", "{cpu_slots = 2}"),
                ("RLVR__DEVICES__CPU_SLOTS", "3"),
                ("RLVR__PLUGINS__DIRS", "/one/dir"),
                ("RLVR__REDIS__URL", "42"),
            ],
            &[
                "malformed variable name, expected RLVR__SECTION__KEY (from env RLVR__)",
                "api..x: malformed variable name, expected RLVR__SECTION__KEY (from env RLVR__API____X)",
                "devices.cpu_slots: conflicts with RLVR__DEVICES, set only one (from env RLVR__DEVICES__CPU_SLOTS)",
                r#"redis.url: expected a url starting with redis://, rediss:// or unix://, found "42" (from env RLVR__REDIS__URL)"#,
                "api.lisen: unknown key, expected one of: listen, max_body_bytes, rate_limit_per_minute (from env RLVR__API__LISEN)",
                r#"plugins.dirs: expected a list of directories like ["/usr/lib/rlvr/plugins"], found "/one/dir" (from env RLVR__PLUGINS__DIRS)"#,
                r#"auth.tokens[0].sha256: expected the hex sha256 of the token (64 lowercase hex characters: printf %s "$TOKEN" | sha256sum), found a string of 3 characters (from env RLVR__AUTH__TOKENS)"#,
            ],
        );
    }

    #[test]
    fn errors_display_one_problem_per_line() {
        let errors = ConfigErrors {
            problems: vec![
                ConfigProblem::new("api.listen", "expected a socket address", "env RLVR__API__LISTEN"),
                ConfigProblem::new("", "cannot read config file: no such file", "file /x.toml"),
            ],
        };
        assert_eq!(
            errors.to_string(),
            "config has 2 problem(s):\n  \
             api.listen: expected a socket address (from env RLVR__API__LISTEN)\n  \
             cannot read config file: no such file (from file /x.toml)"
        );
    }

    #[test]
    fn never_panics_on_mangled_files() {
        let example = std::fs::read_to_string(EXAMPLE).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("rlvrd.toml");
        let file = ConfigFile { path: &path, required: true };
        let inserts =
            ["[", "]", "{", "}", "=", "\"", "'", "\n", ".", "#", "-", "0x", "nan", "[[", "\u{0}", "é"];
        let mut state: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = move || {
            state = state.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
            usize::try_from(state >> 33).unwrap()
        };
        for _ in 0..300 {
            let mut text = example.clone();
            for _ in 0..1 + next() % 4 {
                let mut at = next() % (text.len() + 1);
                while !text.is_char_boundary(at) {
                    at -= 1;
                }
                text.insert_str(at, inserts[next() % inserts.len()]);
            }
            std::fs::write(&path, &text).unwrap();
            let _ = load_file(file, &[]);
        }
        let deep = format!("a = {}", "[".repeat(100_000));
        std::fs::write(&path, deep).unwrap();
        assert!(load_file(file, &[]).is_err());
    }

    #[test]
    fn never_panics_on_odd_env_values() {
        let deep = "[".repeat(100_000);
        let values = [
            "",
            " ",
            "[",
            "]",
            "{",
            "}",
            "[[",
            "{a=}",
            "{=1}",
            "nan",
            "-1",
            "1e999",
            "1.5",
            "-0",
            "true",
            "'",
            "'ab'",
            "'a'",
            "\"",
            "\"\\u{0}\"",
            "\"\\q\"",
            "\u{0}",
            "99999999999999999999999999999999999999999",
            "-99999999999999999999999999999999999999999",
            "[{team=1}]",
            "[{index=-1, memory_gb=1}]",
            &deep,
        ];
        let keys = [
            "RLVR__DAEMON__STATE_DIR",
            "RLVR__REDIS__URL",
            "RLVR__API__LISTEN",
            "RLVR__PLUGINS__DIRS",
            "RLVR__PLUGINS__SCAN_INTERVAL_MS",
            "RLVR__AUTH__TOKENS",
            "RLVR__DEVICES__CPU_SLOTS",
            "RLVR__DEVICES__CPU_SLOT_MEMORY_GB",
            "RLVR__DEVICES__GPUS",
            "RLVR__DEVICES",
            "RLVR__SCHEDULER__STARVATION_AFTER_S",
            "RLVR__SCHEDULER__SHARES",
            "RLVR__SCHEDULER__SHARES__A",
            "RLVR__SCHEDULER",
            "RLVR__X",
        ];
        for key in keys {
            for value in values {
                let _ = load_file(no_file(), &[(key, value)]);
            }
        }
        let errors = load_file(no_file(), &[("RLVR__PLUGINS__DIRS", &deep)]).unwrap_err();
        assert_eq!(
            errors.to_string(),
            "config has 1 problem(s):\n  \
             plugins.dirs: value nested more than 32 levels deep (from env RLVR__PLUGINS__DIRS)"
        );
    }
}
