//! Who may start from a team's curriculum: its own team, and the teams it shared it with.
//!
//! ```text
//! <state_dir>/curricula/<team>/<name>/
//!   1.json, 2.json …   versions (crate::curricula writes them)
//!   readers.json       {"readers": ["vision"]}: the teams this one shared the curriculum with
//! ```
//!
//! A reader's job names it `TEAM/NAME` and starts from its pinned version; it never feeds it: a
//! refresh counts the owner's jobs only (`crate::curricula::refresh`), and only the owner asks for
//! one (`POST /v1/curricula/{name}/refresh` runs in the caller's team). The owner changes the
//! readers (`PUT /v1/curricula/{name}`); a job admitted before a grant was taken back fails at its
//! next start, naming `curriculum.name`.

use std::fs;
use std::io;
use std::path::PathBuf;

use rlvr_protocol::api::Curriculum;
use rlvr_protocol::names::{CurriculumRef, TEAM_RULE, valid_name, valid_team_name};
use rlvr_protocol::spec::JobSpec;
use serde::{Deserialize, Serialize};

/// Why a curriculum's readers cannot be read or changed.
#[derive(Debug, thiserror::Error)]
pub enum CurriculumError {
    #[error("curriculum name {0:?}: expected {NAME_RULE}", NAME_RULE = rlvr_protocol::names::NAME_RULE)]
    BadName(String),
    #[error("readers[{index}]: expected {TEAM_RULE}, got {team:?}")]
    BadReader { index: usize, team: String },
    #[error(transparent)]
    Io(#[from] io::Error),
}

/// `readers.json`.
#[derive(Debug, Default, Serialize, Deserialize)]
struct ReadersFile {
    readers: Vec<String>,
}

/// The teams' curricula directories, as far as who may read them goes.
#[derive(Debug, Clone)]
pub struct Curricula {
    root: PathBuf,
}

impl Curricula {
    /// Over `root` (`<state_dir>/curricula`).
    pub fn new(root: PathBuf) -> Self {
        Curricula { root }
    }

    /// The directory of `team`'s curricula (what `crate::curricula` reads and writes).
    pub fn team_dir(&self, team: &str) -> PathBuf {
        self.root.join(team)
    }

    /// The curricula directory a job of `team` naming `reference` reads from: its own team's, or
    /// the owner's when the owner shared the curriculum with `team`. One message whether the
    /// curriculum does not exist or was not shared: a team learns nothing of another's otherwise.
    pub fn dir_for(&self, team: &str, reference: &CurriculumRef) -> Result<PathBuf, String> {
        let owner = reference.owner_for(team);
        if owner != team {
            let shared = match self.readers(owner, &reference.name) {
                Ok(readers) => readers.iter().any(|reader| reader == team),
                Err(error) => {
                    tracing::error!(%error, "cannot read a curriculum's readers");
                    return Err("the curricula cannot be read now; retry later".into());
                }
            };
            if !shared {
                return Err(format!("no curriculum {reference} is shared with team {team}"));
            }
        }
        Ok(self.team_dir(owner))
    }

    /// The curricula directory of the curriculum `spec` names and its name there; `None` when it
    /// names none. The refusal names the field.
    pub fn for_job(&self, spec: &JobSpec) -> Result<Option<(PathBuf, String)>, String> {
        let Some(name) = spec.curriculum.as_ref().and_then(|curriculum| curriculum.name.as_deref()) else {
            return Ok(None);
        };
        let reference =
            CurriculumRef::parse(name).map_err(|message| format!("curriculum.name: {message}"))?;
        let dir = self
            .dir_for(&spec.job.team, &reference)
            .map_err(|message| format!("curriculum.name: {message}"))?;
        Ok(Some((dir, reference.name)))
    }

    /// The teams `owner` shared curriculum `name` with (none when it never did).
    pub fn readers(&self, owner: &str, name: &str) -> Result<Vec<String>, CurriculumError> {
        let path = self.readers_path(owner, name)?;
        match fs::read(&path) {
            Ok(bytes) => {
                let file: ReadersFile = serde_json::from_slice(&bytes).map_err(|error| {
                    io::Error::new(io::ErrorKind::InvalidData, format!("{}: {error}", path.display()))
                })?;
                Ok(file.readers)
            }
            Err(error) if error.kind() == io::ErrorKind::NotFound => Ok(Vec::new()),
            Err(error) => Err(error.into()),
        }
    }

    /// Sets the teams `owner`'s curriculum `name` is shared with; whether the curriculum's
    /// directory was made now (a curriculum may be shared before its first refresh).
    pub fn set_readers(&self, owner: &str, name: &str, readers: &[String]) -> Result<bool, CurriculumError> {
        if let Some((index, team)) = readers.iter().enumerate().find(|(_, team)| !valid_team_name(team)) {
            return Err(CurriculumError::BadReader { index, team: team.clone() });
        }
        let path = self.readers_path(owner, name)?;
        let dir = path.parent().expect("readers.json has a directory");
        let created = !dir.exists();
        fs::create_dir_all(dir)?;
        let mut readers = readers.to_vec();
        readers.sort();
        readers.dedup();
        let bytes = serde_json::to_vec_pretty(&ReadersFile { readers }).expect("JSON");
        rlvr_protocol::fs::write_atomic(&path, &bytes)?;
        Ok(created)
    }

    /// What `team` sees of its curricula and those shared with it (every team's for an admin):
    /// readers only of its own.
    pub fn list(&self, team: &str, admin: bool) -> Result<Vec<Curriculum>, CurriculumError> {
        let mut found = Vec::new();
        for owner in super::directories_in(&self.root)?.into_iter().filter(|owner| valid_team_name(owner)) {
            for name in
                super::directories_in(&self.team_dir(&owner))?.into_iter().filter(|name| valid_name(name))
            {
                let readers = self.readers(&owner, &name)?;
                let mine = owner == team || admin;
                if !mine && !readers.iter().any(|reader| reader == team) {
                    continue;
                }
                let latest_version = crate::curricula::latest_number(&self.team_dir(&owner), &name)
                    .map_err(|error| io::Error::other(error.to_string()))?;
                found.push(Curriculum {
                    owner: owner.clone(),
                    name,
                    readers: if mine { readers } else { Vec::new() },
                    latest_version,
                });
            }
        }
        Ok(found)
    }

    /// `<root>/<owner>/<name>/readers.json`, once both are names.
    fn readers_path(&self, owner: &str, name: &str) -> Result<PathBuf, CurriculumError> {
        if !valid_name(name) || !valid_team_name(owner) {
            return Err(CurriculumError::BadName(name.to_owned()));
        }
        Ok(self.team_dir(owner).join(name).join("readers.json"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_curriculum_is_its_teams_and_its_readers_and_nobody_elses() {
        let dir = tempfile::tempdir().unwrap();
        let curricula = Curricula::new(dir.path().to_owned());
        let own = CurriculumRef::parse("arith").unwrap();
        let theirs = CurriculumRef::parse("math/arith").unwrap();
        assert_eq!(curricula.dir_for("math", &own).unwrap(), dir.path().join("math"));
        assert_eq!(curricula.dir_for("math", &theirs).unwrap(), dir.path().join("math"));
        // Not shared and not there read the same.
        let refused = curricula.dir_for("vision", &theirs).unwrap_err();
        let missing = curricula.dir_for("vision", &CurriculumRef::parse("math/nope").unwrap()).unwrap_err();
        assert_eq!(refused.replace("arith", "X"), missing.replace("nope", "X"));

        assert!(curricula.set_readers("math", "arith", &["vision".into(), "vision".into()]).unwrap());
        assert_eq!(curricula.readers("math", "arith").unwrap(), ["vision"]);
        assert_eq!(curricula.dir_for("vision", &theirs).unwrap(), dir.path().join("math"));
        assert!(curricula.dir_for("audio", &theirs).is_err());
        // The readers see the curriculum, not who else reads it.
        let seen = curricula.list("vision", false).unwrap();
        assert_eq!((seen.len(), seen[0].owner.as_str(), seen[0].readers.len()), (1, "math", 0));
        assert_eq!(curricula.list("math", false).unwrap()[0].readers, ["vision"]);
        assert!(curricula.list("audio", false).unwrap().is_empty());
        assert_eq!(curricula.list("audio", true).unwrap().len(), 1);

        // Taken back.
        assert!(!curricula.set_readers("math", "arith", &[]).unwrap());
        assert!(curricula.dir_for("vision", &theirs).is_err());
        // A reader that is not a team name, a curriculum name that is a path.
        assert!(matches!(
            curricula.set_readers("math", "arith", &["ok".into(), "../x".into()]),
            Err(CurriculumError::BadReader { index: 1, .. })
        ));
        assert!(matches!(curricula.set_readers("math", "../x", &[]), Err(CurriculumError::BadName(_))));
    }
}
