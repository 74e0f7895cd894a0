//! Where config comes from: the built-in defaults (from the field table), the file, and env vars
//! `RLVR__SECTION__KEY`, merged with figment; then the validator, then serde.
//!
//! The file and the env vars are read and parsed here, once, so that what is validated is what was
//! read; a problem with the file as a whole or with a variable's name leaves that layer or
//! variable out and is reported with the rest.

use std::io;
use std::path::Path;
use std::sync::Arc;

use figment::providers::{Format, Toml};
use figment::value::{Dict, Map, Value};
use figment::{Figment, Metadata, Profile, Provider};

use super::{Config, ConfigErrors, ConfigProblem, DEFAULT_CONFIG_PATH, check, fields};

/// Prefix of the env vars that set config keys: `RLVR__SECTION__KEY`, e.g. `RLVR__API__LISTEN` or
/// `RLVR__PLUGINS__DIRS='["/a", "/b"]'`. Values are parsed like TOML values (lists, numbers, booleans,
/// `{key = "value"}` tables); the string keys (`daemon.state_dir`, `redis.url`, `api.listen`, …)
/// take the text as it is unless it is a quoted string.
pub const ENV_PREFIX: &str = "RLVR__";

const ENV_SEPARATOR: &str = "__";
/// Name of the env layer's figment metadata: how a value's tag is recognised as coming from env.
pub(super) const ENV_LAYER_NAME: &str = "rlvr environment variables";
/// Env values nested deeper than this are refused before parsing: figment's value parser recurses,
/// and an env var must not be able to overflow the stack.
const MAX_ENV_NESTING: usize = 32;
pub(super) const DEFAULT_SOURCE: &str = "built-in default";

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
pub(super) struct ConfigFile<'a> {
    pub path: &'a Path,
    pub required: bool,
}

impl<'a> ConfigFile<'a> {
    fn from_option(file: Option<&'a Path>) -> Self {
        match file {
            Some(path) => ConfigFile { path, required: true },
            None => ConfigFile { path: Path::new(DEFAULT_CONFIG_PATH), required: false },
        }
    }
}

pub(super) fn load_with(
    file: ConfigFile<'_>,
    env: Vec<(String, String)>,
    mut problems: Vec<ConfigProblem>,
) -> Result<Config, ConfigErrors> {
    let figment = layers(file, env, &mut problems);
    check::check(&figment, &mut problems);
    if !problems.is_empty() {
        return Err(ConfigErrors { problems });
    }
    // The validator accepted every value, so serde only has to put them in their fields. Should it
    // still refuse one, the table and the structs disagree: that is reported, never papered over.
    let config = figment.extract::<Config>().map_err(|errors| {
        let problems = errors
            .into_iter()
            .map(|error| {
                let keys: Vec<&str> = error.path.iter().map(String::as_str).collect();
                let source = check::source_of(error.metadata.as_ref(), &keys);
                ConfigProblem::new(error.path.join("."), error.kind.to_string(), source)
            })
            .collect();
        ConfigErrors { problems }
    })?;
    let problems = across_keys(&config, &figment);
    if problems.is_empty() { Ok(config) } else { Err(ConfigErrors { problems }) }
}

/// The rules between keys, which no one key's range can say.
fn across_keys(config: &Config, figment: &Figment) -> Vec<ConfigProblem> {
    let mut problems = Vec::new();
    // The dispatch backend (apalis-redis) keeps heartbeats and its dead-after window in whole
    // seconds: with 500 ms × 3 the window was 1 s, and a daemon's queue consumers, one a
    // priority, counted each other dead whenever a heartbeat ran late on a busy machine and
    // restarted (11 times in a soak run of 200 jobs, each redelivering the tasks in flight).
    let window_ms = config.queue.heartbeat_ms * u64::from(config.queue.missed_heartbeats);
    if window_ms < MIN_DEAD_AFTER_MS {
        let key = "queue.missed_heartbeats";
        let source = check::source_of(figment.find_metadata(key), &["queue", "missed_heartbeats"]);
        problems.push(ConfigProblem::new(
            key,
            format!(
                "heartbeat_ms × missed_heartbeats is {window_ms} ms; at least {MIN_DEAD_AFTER_MS}: the dispatch \
                 queue counts heartbeats in whole seconds, and under that a busy daemon's own queue consumers \
                 count each other dead"
            ),
            source,
        ));
    }
    problems
}

/// The shortest `queue.heartbeat_ms × queue.missed_heartbeats` (see [`across_keys`]).
pub const MIN_DEAD_AFTER_MS: u64 = 3000;

/// Merges the layers. Problems with the file or the env var names go to `problems`, and the layer
/// (or the variable) is left out.
pub(super) fn layers(
    file: ConfigFile<'_>,
    env: Vec<(String, String)>,
    problems: &mut Vec<ConfigProblem>,
) -> Figment {
    let defaults = Layer {
        metadata: Metadata::named(DEFAULT_SOURCE),
        data: Map::from([(Profile::Default, fields::defaults())]),
    };
    let mut figment = Figment::from(defaults);
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

pub(super) fn file_source(path: &Path) -> String {
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
    if fields::takes_text(key) && !raw.trim_start().starts_with('"') {
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
