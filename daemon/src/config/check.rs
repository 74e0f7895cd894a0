//! The validator: walks the merged tree against the field table and reports every problem, each
//! with its key and where its value came from.
//!
//! It decides what is accepted; it builds nothing (serde does, afterwards, from the same tree).
//! Each [`Kind`] has one check here, and every "expected …" text comes from [`Kind::what`], so a
//! range is written once, in the table.
//!
//! Secrets are never echoed: a wrong value where a secret is (or may hold one) is described by its
//! kind only.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::net::SocketAddr;
use std::path::Path;

use figment::value::{Dict, Num, Tag, Value};
use figment::{Figment, Metadata, Profile};

use super::ConfigProblem;
use super::fields::{self, Field, Integers, Kind, Positive, SECTIONS, SHARE, TEAM_NAME, Unique};
use super::layers::{DEFAULT_SOURCE, ENV_LAYER_NAME, file_source};

/// Longest string quoted back in a message; longer ones are cut.
const MAX_QUOTED_CHARS: usize = 80;
/// Slack for the sum of `[scheduler.shares]`: shares written as decimals rarely add up exactly.
const SHARES_SUM_SLACK: f64 = 1e-9;

/// Checks the merged tree, adding what is wrong to `problems`.
pub(super) fn check(figment: &Figment, problems: &mut Vec<ConfigProblem>) {
    match figment.find_value("") {
        Ok(root) => Checker { figment, problems }.root(&root),
        Err(errors) => {
            // Only the defaults layer can fail here (file and env are parsed before merging), and it
            // does not; keep whatever figment says rather than trust that.
            problems
                .extend(errors.into_iter().map(|e| ConfigProblem::new("", e.to_string(), DEFAULT_SOURCE)));
        }
    }
}

/// Where a value came from, by its layer's metadata: `env NAME`, `file PATH` or the defaults.
pub(super) fn source_of(metadata: Option<&Metadata>, keys: &[&str]) -> String {
    match metadata {
        Some(m) if m.name == ENV_LAYER_NAME => format!("env {}", m.interpolate(&Profile::Default, keys)),
        Some(m) => match m.source.as_ref().and_then(|s| s.file_path()) {
            Some(path) => file_source(path),
            None => DEFAULT_SOURCE.to_owned(),
        },
        None => DEFAULT_SOURCE.to_owned(),
    }
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

/// Walks the merged tree against the table, collecting problems.
struct Checker<'a> {
    figment: &'a Figment,
    problems: &'a mut Vec<ConfigProblem>,
}

/// Reporting, and the shapes every check starts from (a table, a string, a list).
impl Checker<'_> {
    fn report(&mut self, path: &KeyPath, tag: Tag, message: impl Into<String>) {
        let source = source_of(self.figment.get_metadata(tag), &path.keys());
        self.problems.push(ConfigProblem::new(path.to_string(), message, source));
    }

    fn expected(&mut self, path: &KeyPath, value: &Value, what: &str) {
        // A value in place of a table or list that holds a secret may be that secret, or hold it
        // (an env var that did not parse as a list of tables is one string): say only its kind.
        let keys = path.keys();
        let found = if fields::secret_paths().any(|secret| secret.starts_with(&keys)) {
            kind(value).to_owned()
        } else {
            describe(value)
        };
        self.report(path, value.tag(), format!("expected {what}, found {found}"));
    }

    /// `value` as a table, reporting keys not in `known`.
    fn table<'v>(&mut self, path: &KeyPath, value: &'v Value, known: &[&str]) -> Option<&'v Dict> {
        let dict = self.any_table(path, value, "a table")?;
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
    fn any_table<'v>(&mut self, path: &KeyPath, value: &'v Value, what: &str) -> Option<&'v Dict> {
        match value {
            Value::Dict(_, dict) if !is_datetime(dict) => Some(dict),
            _ => {
                self.expected(path, value, what);
                None
            }
        }
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

    fn array<'v>(&mut self, path: &KeyPath, value: &'v Value, what: &str) -> Option<&'v [Value]> {
        match value {
            Value::Array(_, items) => Some(items),
            _ => {
                self.expected(path, value, what);
                None
            }
        }
    }
}

/// The walk: sections, their keys, and each key by its kind.
impl Checker<'_> {
    fn root(&mut self, root: &Value) {
        let path = KeyPath::default();
        let names: Vec<&str> = SECTIONS.iter().map(|section| section.name).collect();
        let Some(dict) = self.table(&path, root, &names) else { return };
        for section in &SECTIONS {
            if let Some(value) = dict.get(section.name) {
                let fields: Vec<&Field> = fields::in_section(section.name).collect();
                self.fields(&path.key(section.name), value, &fields, false);
            }
        }
    }

    /// A table holding `fields`: a section, or an entry of a list of tables (`entry`: there a key
    /// without a default is required). Returns the keys that passed, with their values.
    fn fields<'v>(
        &mut self,
        path: &KeyPath,
        value: &'v Value,
        fields: &[&Field],
        entry: bool,
    ) -> Option<Vec<(&'static str, &'v Value)>> {
        let known: Vec<&str> = fields.iter().map(|field| field.key()).collect();
        let dict = self.table(path, value, &known)?;
        let mut passed = Vec::new();
        for field in fields {
            let key = path.key(field.key());
            let required = entry && field.kind.required_in_entry();
            let Some(v) = dict.get(field.key()) else {
                if required {
                    self.report(&key, value.tag(), "missing required key");
                }
                continue;
            };
            // An empty value (figment's unit) leaves a section's key without a default unset.
            let unset = !entry && !field.kind.has_default() && matches!(v, Value::Empty(..));
            if !unset && self.value(&key, &field.kind, v) {
                passed.push((field.key(), v));
            }
        }
        Some(passed)
    }

    /// Checks one value against its kind; whether it passed.
    fn value(&mut self, path: &KeyPath, kind: &Kind, value: &Value) -> bool {
        let what = kind.what(&path.to_string());
        match kind {
            Kind::AbsolutePath(_) => {
                let absolute = self.string(path, value, &what).map(|s| Path::new(s).is_absolute());
                self.passed(absolute, path, value, &what)
            }
            Kind::Url { schemes, .. } => self.url(path, value, schemes, &what),
            Kind::SocketAddr(_) => {
                let parsed = self.string(path, value, &what).map(|s| s.parse::<SocketAddr>().is_ok());
                self.passed(parsed, path, value, &what)
            }
            Kind::Integer(integers) => self.integer(path, value, integers, &what).is_some(),
            Kind::Number(positive) => self.positive(path, value, positive).is_some(),
            Kind::Dirs(_) => self.dirs(path, value, &what),
            Kind::Strings { item, check, .. } => self.strings(path, value, item, *check, &what),
            Kind::TeamName => self.team(path, value),
            Kind::Sha256 => self.sha256(path, value),
            Kind::Bool(_) => {
                let is_bool = matches!(value, Value::Bool(..));
                self.passed(Some(is_bool), path, value, &what)
            }
            Kind::Tables { fields, unique, one_of } => {
                self.tables(path, value, fields, unique, one_of, &what)
            }
            Kind::Name => {
                let valid = self.string(path, value, &what).map(rlvr_protocol::names::valid_name);
                self.passed(valid, path, value, &what)
            }
            Kind::EnvName => {
                let valid = self.string(path, value, &what).map(is_env_name);
                self.passed(valid, path, value, &what)
            }
            Kind::GpuUuid => {
                let valid = self.string(path, value, &what).map(is_gpu_uuid);
                self.passed(valid, path, value, &what)
            }
            Kind::Optional(kind) => self.value(path, kind, value),
            Kind::Shares => self.shares(path, value),
        }
    }

    /// Reports `what` when a value of the right shape failed its test (`Some(false)`); `None`
    /// means its shape was wrong and has been reported.
    fn passed(&mut self, test: Option<bool>, path: &KeyPath, value: &Value, what: &str) -> bool {
        if test == Some(false) {
            self.expected(path, value, what);
        }
        test == Some(true)
    }
}

/// The checks of the kinds that need more than a shape and a test.
impl Checker<'_> {
    fn url(&mut self, path: &KeyPath, value: &Value, schemes: &[&str], what: &str) -> bool {
        let Some(url) = self.string(path, value, what) else { return false };
        let message = match schemes.iter().find(|scheme| url.starts_with(*scheme)) {
            Some(scheme) if url.len() > scheme.len() && !url.contains(char::is_whitespace) => return true,
            Some(_) => "expected a host or socket path after the scheme".to_owned(),
            None => format!("expected {what}"),
        };
        // Never `describe`: the url may carry a password.
        self.report(path, value.tag(), format!("{message}, found {}", redact_url(url)));
        false
    }

    fn integer(&mut self, path: &KeyPath, value: &Value, integers: &Integers, what: &str) -> Option<u64> {
        let found = match value {
            Value::Num(_, n) => integer_of(*n)
                .and_then(|i| u64::try_from(i).ok())
                .filter(|i| (integers.min..=integers.max()).contains(i)),
            _ => None,
        };
        if found.is_none() {
            self.expected(path, value, what);
        }
        found
    }

    fn positive(&mut self, path: &KeyPath, value: &Value, positive: &Positive) -> Option<f64> {
        let found = match value {
            Value::Num(_, n) => Some(float_of(*n)).filter(|x| positive.contains(*x)),
            _ => None,
        };
        if found.is_none() {
            self.expected(path, value, &positive.what());
        }
        found
    }

    fn dirs(&mut self, path: &KeyPath, value: &Value, what: &str) -> bool {
        let Some(items) = self.array(path, value, what) else { return false };
        let mut ok = true;
        for (i, item) in items.iter().enumerate() {
            let path = path.index(i);
            match self.string(&path, item, "a directory path") {
                Some("") => self.expected(&path, item, "a non-empty directory path"),
                Some(_) => continue,
                None => {}
            }
            ok = false;
        }
        ok
    }

    /// Each item a string that `check` accepts; each refused one reported with its index.
    fn strings(
        &mut self,
        path: &KeyPath,
        value: &Value,
        item: &str,
        check: fn(&str) -> Result<(), String>,
        what: &str,
    ) -> bool {
        let Some(items) = self.array(path, value, what) else { return false };
        let mut ok = true;
        for (i, v) in items.iter().enumerate() {
            let path = path.index(i);
            let Some(text) = self.string(&path, v, item) else {
                ok = false;
                continue;
            };
            if let Err(why) = check(text) {
                let why = if why.is_empty() { why } else { format!(" ({why})") };
                self.report(&path, v.tag(), format!("expected {item}, found {}{why}", quote(text)));
                ok = false;
            }
        }
        ok
    }

    fn team(&mut self, path: &KeyPath, value: &Value) -> bool {
        let valid = self.string(path, value, TEAM_NAME).map(is_team_name);
        self.passed(valid, path, value, TEAM_NAME)
    }

    /// Never quotes the value back: a token pasted here by mistake must not end up in the logs.
    fn sha256(&mut self, path: &KeyPath, value: &Value) -> bool {
        let found = match value {
            Value::String(_, s) if s.len() == 64 && s.chars().all(|c| matches!(c, '0'..='9' | 'a'..='f')) => {
                return true;
            }
            Value::String(_, s) if s.len() == 64 && s.chars().all(|c| c.is_ascii_hexdigit()) => {
                "64 hex characters with uppercase letters".to_owned()
            }
            Value::String(_, s) => format!("a string of {} characters", s.chars().count()),
            other => kind(other).to_owned(),
        };
        let what = Kind::Sha256.what(&path.to_string());
        self.report(path, value.tag(), format!("expected {what}, found {found}"));
        false
    }

    /// `[[path]]`: each entry's keys, then whether it repeats an earlier entry's `unique` key.
    fn tables(
        &mut self,
        path: &KeyPath,
        value: &Value,
        fields: &[Field],
        unique: &Unique,
        one_of: &[&str],
        what: &str,
    ) -> bool {
        let Some(items) = self.array(path, value, what) else { return false };
        let fields: Vec<&Field> = fields.iter().collect();
        let problems_before = self.problems.len();
        let mut first_with: HashMap<String, usize> = HashMap::new();
        for (i, item) in items.iter().enumerate() {
            let Some(passed) = self.fields(&path.index(i), item, &fields, true) else { continue };
            if !one_of.is_empty() {
                // Counted among the keys written, valid or not: a bad value is its own problem.
                let written = |key: &str| matches!(item, Value::Dict(_, dict) if dict.contains_key(key));
                let set = one_of.iter().filter(|key| written(key)).count();
                if set != 1 {
                    let message =
                        format!("expected exactly one of {} to be set, found {set}", one_of.join(", "));
                    self.report(&path.index(i), item.tag(), message);
                }
            }
            let Some((_, key)) = passed.iter().find(|(key, _)| *key == unique.key) else { continue };
            let key = unique_text(key);
            match first_with.get(&key) {
                Some(first) => {
                    let first = path.index(*first).to_string();
                    let message = unique.message.replace("{first}", &first).replace("{value}", &key);
                    self.report(&path.index(i).key(unique.key), item.tag(), message);
                }
                None => {
                    first_with.insert(key, i);
                }
            }
        }
        self.problems.len() == problems_before
    }

    /// `[scheduler.shares]`: every team name and fraction on its own, then their sum.
    fn shares(&mut self, path: &KeyPath, value: &Value) -> bool {
        let Some(table) = self.any_table(path, value, "a table") else { return false };
        let problems_before = self.problems.len();
        let mut shares = BTreeMap::new();
        for (team, v) in table {
            let key = path.key(team);
            let valid_team = is_team_name(team);
            if !valid_team {
                self.report(&key, v.tag(), format!("expected {TEAM_NAME}, found {}", quote(team)));
            }
            if let Some(share) = self.positive(&key, v, &SHARE).filter(|_| valid_team) {
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
        self.problems.len() == problems_before
    }
}

/// A unique key's value as text, the same for every way of writing it (`0` read as `U8` or `I64`).
fn unique_text(value: &Value) -> String {
    match value {
        Value::String(_, s) => s.clone(),
        other => describe(other),
    }
}

/// An environment variable's name as the config may give one: `[A-Z_][A-Z0-9_]*`.
fn is_env_name(name: &str) -> bool {
    name.chars().next().is_some_and(|c| c.is_ascii_uppercase() || c == '_')
        && name.chars().all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_')
}

/// A GPU's or MIG instance's UUID, or a prefix of one: `GPU-` or `MIG-`, then letters, digits and
/// `-` (the old `MIG-GPU-…/GI/CI` form is not read).
fn is_gpu_uuid(uuid: &str) -> bool {
    ["GPU-", "MIG-"].iter().any(|prefix| uuid.len() > prefix.len() && uuid.starts_with(prefix))
        && uuid.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
}

use rlvr_protocol::names::valid_team_name as is_team_name;

/// `x` with at most 6 decimals, so that a sum like `0.1 + 0.2` reads `0.3`.
fn short_number(x: f64) -> String {
    ((x * 1e6).round() / 1e6).to_string()
}

/// An integer `Num` as `i128` (which holds every integer but `u128` above `i128::MAX`); `None` for
/// floats.
pub(super) fn integer_of(n: Num) -> Option<i128> {
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
pub(super) fn float_of(n: Num) -> f64 {
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
