//! The names a tenant writes, and what each may refer to (SECURITY.md, design.md §8).
//!
//! A job spec never holds a server path: its data and models are references the daemon resolves
//! inside the team's namespace. This module only parses them (pure); the daemon's `tenancy`
//! module decides what a team may reach.
//!
//! - data (`data.train`, `data.heldout`, `data.canaries`): `dataset:NAME` or
//!   `dataset:NAME@SHA256` (a dataset the team uploaded, `PUT /v1/datasets/NAME`), or
//!   `root:ROOT/relative/path.jsonl` (a file under an operator-declared data root granted to the
//!   team);
//! - models (`model.policy`, `model.reference`): a built-in model (`builtin:NAME[?seed=N]`,
//!   `builtin_models`), `base:NAME` (an operator-declared base model), `line:LINE@VERSION` /
//!   `line:LINE` (the newest version of a model line the team may read), or `tinker://RUN/KIND/NAME` (a state or sampler a Tinker
//!   training client of the team's saved: its LoRA adapter over its base);
//! - a shared curriculum (`curriculum.name`): `NAME` (the team's own) or `TEAM/NAME` (another
//!   team's, which that team shared with it).
//!
//! A spec goes through three forms, the last two types of their own: as the team wrote it
//! (`JobSpec`), with its names pinned ([`PinnedSpec`]: what a record keeps and a team sees), and
//! with its names resolved to the server's paths ([`ServerSpec`]: what a worker reads).

use std::fmt;

/// What a name of a dataset, model line, curriculum, secret, base model or data root must look
/// like: it is one directory or file name on the server, so it cannot hold a path.
pub const NAME_RULE: &str =
    "1 to 64 characters among letters, digits, '-', '_' and '.', not starting with '.'";

/// Whether `name` follows [`NAME_RULE`].
pub fn valid_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && !name.starts_with('.')
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

/// What a team name must look like, wherever the config or a tool names a team.
pub const TEAM_RULE: &str = "a team name of lowercase letters, digits, '_' and '-'";

/// Whether `team` follows [`TEAM_RULE`].
pub fn valid_team_name(team: &str) -> bool {
    !team.is_empty()
        && team.len() <= 64
        && team.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == '-')
}

/// Whether `text` is a sha256 as we write them: 64 lowercase hex characters.
pub fn valid_sha256(text: &str) -> bool {
    text.len() == 64 && text.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// What the data fields may hold, for messages.
pub const DATA_RULE: &str = "\"dataset:NAME\", \"dataset:NAME@SHA256\" (a dataset your team uploaded with PUT \
     /v1/datasets/NAME or rlvrctl dataset put) or \"root:ROOT/path/in/root.jsonl\" (a data root the operator \
     granted your team)";

/// What the model fields may hold, for messages.
pub const MODEL_RULE: &str = "\"builtin:tiny-arith\", \"base:NAME\" (a base model the operator declared), \
     \"line:LINE\" or \"line:LINE@VERSION\" (a model line your team may read), \
     \"tinker://RUN/weights/NAME\" or \"tinker://RUN/sampler_weights/NAME\" (an adapter a Tinker client of \
     your team saved)";

/// A data reference.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DataRef {
    /// A dataset of the team's, at its current content or pinned to `sha256`.
    Dataset { name: String, sha256: Option<String> },
    /// A file under a data root: `path` is relative, with no `.`/`..` parts and no empty parts.
    Root { root: String, path: String },
}

impl DataRef {
    /// Parses a spec's data field; the error says what was expected, without the value.
    pub fn parse(text: &str) -> Result<DataRef, String> {
        if let Some(rest) = text.strip_prefix("dataset:") {
            let (name, sha256) = match rest.split_once('@') {
                Some((name, sha)) if valid_sha256(sha) => (name, Some(sha.to_owned())),
                Some(_) => return Err("expected a sha256 of 64 lowercase hex characters after '@'".into()),
                None => (rest, None),
            };
            if !valid_name(name) {
                return Err(format!("expected a dataset name of {NAME_RULE}"));
            }
            return Ok(DataRef::Dataset { name: name.to_owned(), sha256 });
        }
        if let Some(rest) = text.strip_prefix("root:") {
            let Some((root, path)) = rest.split_once('/') else {
                return Err("expected root:ROOT/path/in/root.jsonl".into());
            };
            if !valid_name(root) {
                return Err(format!("expected a data root name of {NAME_RULE}"));
            }
            let parts_ok = !path.is_empty()
                && path.len() <= 1024
                && path.split('/').all(|part| !part.is_empty() && part != "." && part != "..")
                && !path.contains(['\0', '\\']);
            if !parts_ok {
                return Err(
                    "expected a relative path inside the root: no empty, '.' or '..' parts, no '\\\\'".into(),
                );
            }
            return Ok(DataRef::Root { root: root.to_owned(), path: path.to_owned() });
        }
        Err(format!("expected {DATA_RULE}; a job spec cannot name a server path"))
    }
}

impl fmt::Display for DataRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DataRef::Dataset { name, sha256: Some(sha) } => write!(f, "dataset:{name}@{sha}"),
            DataRef::Dataset { name, sha256: None } => write!(f, "dataset:{name}"),
            DataRef::Root { root, path } => write!(f, "root:{root}/{path}"),
        }
    }
}

/// A model reference.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ModelRef {
    /// A built-in model (`builtin:…`, checked by [`crate::builtin_models::BuiltinSource::parse`]):
    /// kept as written.
    Builtin(String),
    /// An operator-declared base model.
    Base(String),
    /// A version of a model line, or its newest when `None`.
    Line { line: String, version: Option<u64> },
    /// What a Tinker training client of the team's saved.
    Tinker(crate::tinker::paths::TinkerPath),
}

impl ModelRef {
    /// Parses a spec's model field; the error says what was expected, without the value.
    pub fn parse(text: &str) -> Result<ModelRef, String> {
        if text.starts_with(crate::builtin_models::PREFIX) {
            crate::builtin_models::BuiltinSource::parse(text)?;
            return Ok(ModelRef::Builtin(text.to_owned()));
        }
        if let Some(name) = text.strip_prefix("base:") {
            if !valid_name(name) {
                return Err(format!("expected a base model name of {NAME_RULE}"));
            }
            return Ok(ModelRef::Base(name.to_owned()));
        }
        if text.starts_with(crate::tinker::paths::SCHEME) {
            return crate::tinker::paths::TinkerPath::parse(text).map(ModelRef::Tinker).map_err(|e| e.0);
        }
        if let Some(rest) = text.strip_prefix("line:") {
            let (line, version) = match rest.split_once('@') {
                Some((line, version)) => match version.parse::<u64>() {
                    Ok(version) if version > 0 => (line, Some(version)),
                    _ => return Err("expected a version number (1, 2, …) after '@'".into()),
                },
                None => (rest, None),
            };
            if !valid_name(line) {
                return Err(format!("expected a model line name of {NAME_RULE}"));
            }
            return Ok(ModelRef::Line { line: line.to_owned(), version });
        }
        Err(format!("expected {MODEL_RULE}; a job spec cannot name a server path"))
    }
}

impl fmt::Display for ModelRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ModelRef::Builtin(text) => f.write_str(text),
            ModelRef::Base(name) => write!(f, "base:{name}"),
            ModelRef::Line { line, version: Some(version) } => write!(f, "line:{line}@{version}"),
            ModelRef::Line { line, version: None } => write!(f, "line:{line}"),
            ModelRef::Tinker(path) => write!(f, "{path}"),
        }
    }
}

/// A curriculum a job starts from: its own team's (`owner` `None`, or the job's team) or
/// another team's that shared it (`TEAM/NAME`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CurriculumRef {
    pub owner: Option<String>,
    pub name: String,
}

impl CurriculumRef {
    /// Parses `curriculum.name`; the error says what was expected.
    pub fn parse(text: &str) -> Result<CurriculumRef, String> {
        let (owner, name) = match text.split_once('/') {
            Some((owner, name)) => (Some(owner), name),
            None => (None, text),
        };
        if owner.is_some_and(|owner| !valid_team_name(owner)) || !valid_name(name) {
            return Err(format!(
                "expected NAME (your team's curriculum) or TEAM/NAME (one shared with your team), \
                 NAME of {NAME_RULE} and TEAM {TEAM_RULE}"
            ));
        }
        Ok(CurriculumRef { owner: owner.map(str::to_owned), name: name.to_owned() })
    }

    /// The team whose curriculum it is, for a job of `team`.
    pub fn owner_for<'a>(&'a self, team: &'a str) -> &'a str {
        self.owner.as_deref().unwrap_or(team)
    }
}

impl fmt::Display for CurriculumRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.owner {
            Some(owner) => write!(f, "{owner}/{}", self.name),
            None => f.write_str(&self.name),
        }
    }
}

/// A spec whose names the daemon checked in its team's namespace and pinned — every
/// `dataset:NAME` with its content's SHA-256, every `line:LINE` with a version: what a job's
/// record keeps, and what its team is shown. Only the daemon's admission makes one from a spec,
/// and a record gives one back ([`PinnedSpec::from_record`]).
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
#[serde(transparent)]
pub struct PinnedSpec(crate::spec::JobSpec);

impl PinnedSpec {
    /// `spec`, whose names the daemon's admission has just pinned.
    pub fn admitted(spec: crate::spec::JobSpec) -> PinnedSpec {
        PinnedSpec(spec)
    }

    /// A spec a job record holds: it was pinned when the job was admitted.
    pub fn from_record(spec: crate::spec::JobSpec) -> PinnedSpec {
        PinnedSpec(spec)
    }

    /// The spec, to change what is not a name (`[resources]` grown after running out of memory).
    pub fn resources_mut(&mut self) -> &mut crate::spec::ResourcesSection {
        &mut self.0.resources
    }

    pub fn into_spec(self) -> crate::spec::JobSpec {
        self.0
    }
}

impl std::ops::Deref for PinnedSpec {
    type Target = crate::spec::JobSpec;
    fn deref(&self) -> &crate::spec::JobSpec {
        &self.0
    }
}

/// A spec whose names are the server's paths: what a worker reads from its job directory. Never
/// stored in a record and never shown to a team (it says where things are on the host).
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
#[serde(transparent)]
pub struct ServerSpec(crate::spec::JobSpec);

impl ServerSpec {
    /// `spec`, whose names the daemon has just replaced by the paths they resolve to.
    pub fn resolved(spec: crate::spec::JobSpec) -> ServerSpec {
        ServerSpec(spec)
    }
}

impl std::ops::Deref for ServerSpec {
    type Target = crate::spec::JobSpec;
    fn deref(&self) -> &crate::spec::JobSpec {
        &self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn curriculum_references_are_a_name_or_a_team_and_a_name() {
        for (text, owner, name) in [("arith", None, "arith"), ("math/arith", Some("math"), "arith")] {
            let parsed = CurriculumRef::parse(text).unwrap();
            assert_eq!((parsed.owner.as_deref(), parsed.name.as_str()), (owner, name));
            assert_eq!(parsed.to_string(), text);
        }
        assert_eq!(CurriculumRef::parse("arith").unwrap().owner_for("vision"), "vision");
        assert_eq!(CurriculumRef::parse("math/arith").unwrap().owner_for("vision"), "math");
        for bad in
            ["", "a/b/c", "../arith", "math/..", "Math/arith", "/arith", "math/", "math/.hidden", "a b"]
        {
            assert!(CurriculumRef::parse(bad).is_err(), "{bad:?}");
        }
    }

    fn check_data(text: &str, expected: Result<&str, &str>) {
        let got = DataRef::parse(text).map(|r| r.to_string());
        match (&got, expected) {
            (Ok(got), Ok(want)) => assert_eq!(got, want, "{text}"),
            (Err(got), Err(want)) => assert!(got.contains(want), "{text}: {got:?} lacks {want:?}"),
            _ => panic!("{text}: got {got:?}, expected {expected:?}"),
        }
    }

    #[test]
    fn data_references_hold_names_never_paths() {
        let sha = "a".repeat(64);
        let pinned = format!("dataset:train@{sha}");
        let cases: &[(&str, Result<&str, &str>)] = &[
            ("dataset:train", Ok("dataset:train")),
            (&pinned, Ok(&pinned)),
            ("dataset:train@ABC", Err("sha256")),
            ("dataset:../other/train", Err("dataset name")),
            ("dataset:.hidden", Err("dataset name")),
            ("dataset:", Err("dataset name")),
            ("root:shared/math/train.jsonl", Ok("root:shared/math/train.jsonl")),
            ("root:shared/../../etc/passwd", Err("relative path")),
            ("root:shared//x", Err("relative path")),
            ("root:shared/./x", Err("relative path")),
            ("root:shared/", Err("relative path")),
            ("root:shared", Err("root:ROOT/")),
            ("root:../x/y", Err("data root name")),
            // regression: a spec named another team's train.jsonl by its absolute path
            ("/srv/teams/other/train.jsonl", Err("cannot name a server path")),
            ("train.jsonl", Err("cannot name a server path")),
            ("/proc/self/environ", Err("cannot name a server path")),
            ("file:///etc/passwd", Err("cannot name a server path")),
        ];
        for (text, expected) in cases {
            check_data(text, *expected);
        }
    }

    #[test]
    fn model_references_hold_names_never_paths() {
        let cases: &[(&str, Result<&str, &str>)] = &[
            ("builtin:tiny-arith", Ok("builtin:tiny-arith")),
            ("base:smollm2-135m", Ok("base:smollm2-135m")),
            ("line:tiny-arith", Ok("line:tiny-arith")),
            ("line:tiny-arith@3", Ok("line:tiny-arith@3")),
            ("line:tiny-arith@0", Err("version number")),
            ("line:tiny-arith@x", Err("version number")),
            ("line:../x", Err("model line name")),
            ("base:a/b", Err("base model name")),
            ("tinker://s1:train:0/sampler_weights/final", Ok("tinker://s1:train:0/sampler_weights/final")),
            ("tinker://s1:train:0/weights/../x", Err("expected tinker://RUN/weights/NAME")),
            ("tinker://../sampler_weights/x", Err("the run")),
            // regression: model.policy accepted another team's published checkpoint by path
            ("/srv/registry/tiny-arith/1", Err("cannot name a server path")),
        ];
        for (text, expected) in cases {
            let got = ModelRef::parse(text).map(|r| r.to_string());
            match (&got, expected) {
                (Ok(got), Ok(want)) => assert_eq!(got, want, "{text}"),
                (Err(got), Err(want)) => assert!(got.contains(want), "{text}: {got:?} lacks {want:?}"),
                _ => panic!("{text}: got {got:?}, expected {expected:?}"),
            }
        }
    }
}
