//! `tinker://` paths (pure): what `save_weights` and `save_weights_for_sampler` answer,
//! `load_weights` and `create_sampling_session` take, and a job's `model.policy` may name (the
//! gate bridge: an evaluation judged by a line's gates) — `tinker://RUN/weights/NAME` (a training
//! state) or `tinker://RUN/sampler_weights/NAME` (a sampler's weights), RUN a training client's
//! id — and where each lives: under the Tinker directory, in the directory of the team whose key
//! saved it. A path is resolved in the caller's team's directory only, so another team's key finds
//! nothing there (a 404, as for a path never saved).

use std::fmt;
use std::path::{Path, PathBuf};

/// The scheme.
pub const SCHEME: &str = "tinker://";

/// The longest run id and name taken.
const MAX_PART: usize = 128;

/// What a path holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PathKind {
    /// A training state (adapter, and optimizer state when saved with it).
    Weights,
    /// A sampler's weights (the adapter).
    SamplerWeights,
}

impl PathKind {
    fn as_str(self) -> &'static str {
        match self {
            PathKind::Weights => "weights",
            PathKind::SamplerWeights => "sampler_weights",
        }
    }
}

/// A parsed `tinker://RUN/KIND/NAME`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TinkerPath {
    pub run: String,
    pub kind: PathKind,
    pub name: String,
}

/// Why a path was refused (the request's fault).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct PathError(pub String);

/// Whether `part` may be a run id or a name: 1–128 of `[A-Za-z0-9._:-]`, not `.` or `..`.
fn valid(part: &str) -> bool {
    (1..=MAX_PART).contains(&part.len())
        && part != "."
        && part != ".."
        && part.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-' | ':'))
}

impl TinkerPath {
    /// `kind` of run `run` named `name`, both checked.
    pub fn new(run: &str, kind: PathKind, name: &str) -> Result<TinkerPath, PathError> {
        for (what, part) in [("run", run), ("name", name)] {
            if !valid(part) {
                return Err(PathError(format!(
                    "the {what} {part:?}: expected 1 to {MAX_PART} of letters, digits, '.', '_', ':' and '-'"
                )));
            }
        }
        Ok(TinkerPath { run: run.to_owned(), kind, name: name.to_owned() })
    }

    /// A path as the SDK writes one.
    pub fn parse(text: &str) -> Result<TinkerPath, PathError> {
        let refuse = || {
            PathError(format!(
                "expected tinker://RUN/weights/NAME or tinker://RUN/sampler_weights/NAME, got {text:?}"
            ))
        };
        let rest = text.strip_prefix(SCHEME).ok_or_else(refuse)?;
        let mut parts = rest.split('/');
        let (Some(run), Some(kind), Some(name), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(refuse());
        };
        let kind = match kind {
            "weights" => PathKind::Weights,
            "sampler_weights" => PathKind::SamplerWeights,
            _ => return Err(refuse()),
        };
        TinkerPath::new(run, kind, name)
    }

    /// Where it lives for `team`: `root/TEAM/RUN/KIND/NAME`.
    pub fn dir(&self, root: &Path, team: &str) -> PathBuf {
        root.join(team).join(&self.run).join(self.kind.as_str()).join(&self.name)
    }
}

impl fmt::Display for TinkerPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{SCHEME}{}/{}/{}", self.run, self.kind.as_str(), self.name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_read_as_the_sdk_writes_them_and_live_in_their_teams_directory() {
        let path = TinkerPath::parse("tinker://s1:train:0/sampler_weights/000020").unwrap();
        assert_eq!(
            (path.run.as_str(), path.kind, path.name.as_str()),
            ("s1:train:0", PathKind::SamplerWeights, "000020")
        );
        assert_eq!(path.to_string(), "tinker://s1:train:0/sampler_weights/000020");
        assert_eq!(
            path.dir(Path::new("/state/tinker"), "math"),
            Path::new("/state/tinker/math/s1:train:0/sampler_weights/000020")
        );
        // (text, the refusal)
        let cases = [
            ("s1/weights/a", "expected tinker://RUN/weights/NAME"),
            ("tinker://s1/checkpoints/a", "expected tinker://RUN/weights/NAME"),
            ("tinker://s1/weights/a/b", "expected tinker://RUN/weights/NAME"),
            ("tinker://s1/weights/..", "the name \"..\""),
            ("tinker://../weights/a", "the run \"..\""),
            ("tinker:///weights/a", "the run \"\""),
            ("tinker://s1/weights/a b", "the name \"a b\""),
        ];
        for (text, expected) in cases {
            let refused = TinkerPath::parse(text).unwrap_err().0;
            assert!(refused.contains(expected), "{text}: {refused}");
        }
        assert!(TinkerPath::new("s1", PathKind::Weights, &"x".repeat(129)).is_err());
    }
}
