//! Model lines with owners: who may publish into a line, who may start from its versions, and
//! the line's gate policy (a floor a job's `[gates]` may tighten, never loosen).
//!
//! ```text
//! <registry>/<line>/
//!   line.json      owner, readers, publishers, policy (`api::ModelLine` without versions)
//!   1/ 2/ …        published versions (`jobs::publish`)
//! ```
//!
//! A line is created by the first job that names it (owned by that job's team) or by
//! `PUT /v1/model-lines/{name}`; `line.json` is made with a hard link, which fails when it
//! exists, so two teams racing for a new name cannot both own it. A line directory without
//! `line.json` but with versions (published before lines had owners) belongs to nobody: only an
//! admin can give it an owner, and nobody publishes into it until then.
//!
//! The line's lock (`<line>/.publish.lock`) is shared with publishing.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use rlvr_protocol::api::{ModelLine, ModelLineUpdate};
use rlvr_protocol::gates::Manifest;
use rlvr_protocol::names::{NAME_RULE, valid_name, valid_team_name};
use rlvr_protocol::spec::GatesSection;
use serde::{Deserialize, Serialize};

/// The registry's model lines.
#[derive(Debug, Clone)]
pub struct Lines {
    registry: PathBuf,
    /// `tenancy.max_lines_per_team`: lines a team may own; an admin's handover is not held to it.
    max_per_team: usize,
}

/// What `line.json` holds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct LineFile {
    owner: String,
    #[serde(default)]
    readers: Vec<String>,
    #[serde(default)]
    publishers: Vec<String>,
    #[serde(default)]
    policy: GatesSection,
}

/// Why a line request was refused. A line the caller may not read is [`LineError::NotFound`]:
/// names of other teams' lines do not leak.
#[derive(Debug, thiserror::Error)]
pub enum LineError {
    #[error("expected a model line name of {NAME_RULE}")]
    BadName,
    #[error("no model line {0:?} visible to this team")]
    NotFound(String),
    #[error("model line {line:?} belongs to another team; its owner can add yours to its publishers")]
    NotPublisher { line: String },
    #[error("only the owner of model line {line:?} or an admin may change it")]
    NotOwner { line: String },
    #[error(
        "model line {line:?} has versions but no owner; an admin gives it one (PUT /v1/model-lines/{line})"
    )]
    Unowned { line: String },
    #[error("{field}: expected {}, got {value:?}", rlvr_protocol::names::TEAM_RULE)]
    BadTeam { field: &'static str, value: String },
    #[error("only an admin may hand a model line to another team")]
    OwnerNeedsAdmin,
    #[error("model line {line:?} has no version {version}")]
    NoVersion { line: String, version: u64 },
    #[error("model line {line:?} has no published version yet")]
    NoVersions { line: String },
    #[error(
        "your team owns {max} model lines already (tenancy.max_lines_per_team); publish into one of them, or ask an admin"
    )]
    Quota { max: usize },
    #[error("the registry: {0}")]
    Io(#[from] io::Error),
}

/// Who acts on a line: a team, maybe an admin.
#[derive(Debug, Clone, Copy)]
pub struct Actor<'a> {
    pub team: &'a str,
    pub admin: bool,
}

impl Lines {
    /// The lines of the registry at `registry`, at most `max_per_team` made by each team.
    pub fn new(registry: PathBuf, max_per_team: usize) -> Self {
        Lines { registry, max_per_team }
    }

    /// Refuses a new line of `team` when it owns `max_per_team` already. Counted, not reserved:
    /// two lines made at the same instant may both pass the last place. A `line.json` that cannot
    /// be read counts for nobody: one damaged line must not stop every team making lines.
    fn check_quota(&self, team: &str) -> Result<(), LineError> {
        let mut owned = 0;
        for entry in super::entries_of(&self.registry)? {
            let file_name = entry.file_name();
            let Some(name) = file_name.to_str().filter(|name| valid_name(name)) else { continue };
            if self.read(name).ok().flatten().is_some_and(|file| file.owner == team) {
                owned += 1;
                if owned >= self.max_per_team {
                    return Err(LineError::Quota { max: self.max_per_team });
                }
            }
        }
        Ok(())
    }

    /// The registry directory.
    pub fn registry(&self) -> &Path {
        &self.registry
    }

    /// The directory of line `name` (checked against the name rule: one path component).
    pub fn dir(&self, name: &str) -> Result<PathBuf, LineError> {
        if valid_name(name) { Ok(self.registry.join(name)) } else { Err(LineError::BadName) }
    }

    fn read(&self, name: &str) -> Result<Option<LineFile>, LineError> {
        match fs::read(self.dir(name)?.join("line.json")) {
            Ok(bytes) => Ok(Some(serde_json::from_slice(&bytes).map_err(io::Error::other)?)),
            Err(error) if error.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(error) => Err(error.into()),
        }
    }

    /// The line as `actor` may see it (owner, readers and publishers see it; admins see all).
    pub fn get(&self, actor: Actor<'_>, name: &str) -> Result<ModelLine, LineError> {
        let file = self.read(name)?.ok_or_else(|| LineError::NotFound(name.to_owned()))?;
        if !actor.admin && !may_read(&file, actor.team) {
            return Err(LineError::NotFound(name.to_owned()));
        }
        Ok(self.view(name, file)?)
    }

    fn view(&self, name: &str, file: LineFile) -> io::Result<ModelLine> {
        let versions = versions(&self.registry.join(name))?.into_iter().map(|(version, _)| version).collect();
        Ok(ModelLine {
            name: name.to_owned(),
            owner: file.owner,
            readers: file.readers,
            publishers: file.publishers,
            policy: file.policy,
            versions,
        })
    }

    /// The lines `actor` may see, by name.
    pub fn list(&self, actor: Actor<'_>) -> Result<Vec<ModelLine>, LineError> {
        let mut lines = Vec::new();
        for entry in super::entries_of(&self.registry)? {
            let file_name = entry.file_name();
            let Some(name) = file_name.to_str().filter(|name| valid_name(name)) else { continue };
            match self.get(actor, name) {
                Ok(line) => lines.push(line),
                Err(LineError::NotFound(_)) => {}
                Err(error) => return Err(error),
            }
        }
        lines.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(lines)
    }

    /// Whether `team` may publish into line `name`, creating the line for it when nobody has it
    /// yet (`claim`; a dry run does not). Returns the line's policy.
    pub fn publisher(&self, team: &str, name: &str, claim: bool) -> Result<GatesSection, LineError> {
        match self.read(name)? {
            Some(file) if file.owner == team || file.publishers.iter().any(|t| t == team) => Ok(file.policy),
            Some(_) => Err(LineError::NotPublisher { line: name.to_owned() }),
            None if !versions(&self.dir(name)?)?.is_empty() => {
                Err(LineError::Unowned { line: name.to_owned() })
            }
            // A dry run claims nothing, but is refused as its submit would be.
            None if !claim => self.check_quota(team).map(|()| GatesSection::default()),
            None => {
                self.check_quota(team)?;
                let new = LineFile {
                    owner: team.to_owned(),
                    readers: Vec::new(),
                    publishers: Vec::new(),
                    policy: GatesSection::default(),
                };
                match self.create(name, &new) {
                    Ok(()) => Ok(new.policy),
                    // Another team's job claimed it at the same moment: ask again.
                    Err(LineError::Io(error)) if error.kind() == io::ErrorKind::AlreadyExists => {
                        self.publisher(team, name, false)
                    }
                    Err(error) => Err(error),
                }
            }
        }
    }

    /// Writes `line.json` of a line that has none; `AlreadyExists` when one appeared.
    fn create(&self, name: &str, file: &LineFile) -> Result<(), LineError> {
        let dir = self.dir(name)?;
        fs::create_dir_all(&dir)?;
        let staging = dir.join(format!(".line.json.{}", std::process::id()));
        let json = serde_json::to_vec_pretty(file).map_err(io::Error::other)?;
        rlvr_protocol::fs::write_atomic(&staging, &json)?;
        let linked = fs::hard_link(&staging, dir.join("line.json"));
        let _ = fs::remove_file(&staging);
        linked?;
        rlvr_protocol::fs::sync_dir(&dir)?;
        Ok(())
    }

    /// The directory of version `version` (the newest when `None`) of line `name`, if `team` may
    /// read the line; with its number.
    pub fn version(&self, team: &str, name: &str, version: Option<u64>) -> Result<(u64, PathBuf), LineError> {
        let file = self.read(name)?.ok_or_else(|| LineError::NotFound(name.to_owned()))?;
        if !may_read(&file, team) {
            return Err(LineError::NotFound(name.to_owned()));
        }
        let all = versions(&self.dir(name)?)?;
        match version {
            Some(wanted) => all
                .into_iter()
                .find(|(number, _)| *number == wanted)
                .ok_or(LineError::NoVersion { line: name.to_owned(), version: wanted }),
            None => all.into_iter().next_back().ok_or(LineError::NoVersions { line: name.to_owned() }),
        }
    }

    /// Version `version` (the newest when `None`) of line `name`, if `actor` may see the line:
    /// its published manifest and its directory. Admins read every line.
    pub fn published(
        &self,
        actor: Actor<'_>,
        name: &str,
        version: Option<u64>,
    ) -> Result<(Manifest, PathBuf), LineError> {
        let team = if actor.admin {
            self.read(name)?.map(|file| file.owner).unwrap_or_default()
        } else {
            actor.team.to_owned()
        };
        let (_, dir) = self.version(&team, name, version)?;
        let text = fs::read(dir.join("manifest.json"))?;
        let manifest = serde_json::from_slice(&text)
            .map_err(|error| io::Error::other(format!("{}: {error}", dir.join("manifest.json").display())))?;
        Ok((manifest, dir))
    }

    /// The manifest of every published version of every line: what the data sweep keeps the
    /// content of. A manifest that cannot be read is an error, not a version skipped.
    pub fn manifests(&self) -> io::Result<Vec<Manifest>> {
        let mut manifests = Vec::new();
        for entry in super::entries_of(&self.registry)? {
            if !entry.file_type()?.is_dir() {
                continue;
            }
            for (_, dir) in versions(&entry.path())? {
                let path = dir.join("manifest.json");
                let text = fs::read(&path)?;
                let manifest = serde_json::from_slice(&text)
                    .map_err(|error| io::Error::other(format!("{}: {error}", path.display())))?;
                manifests.push(manifest);
            }
        }
        Ok(manifests)
    }

    /// The line's policy, if it has an owner (the floor the gates apply at publish).
    pub fn policy(&self, name: &str) -> Result<GatesSection, LineError> {
        Ok(self.read(name)?.map(|file| file.policy).unwrap_or_default())
    }

    /// `PUT /v1/model-lines/{name}`: creates the line for `actor`'s team (or the admin's `owner`)
    /// or changes it (owner or admin). Returns the line and whether it is new.
    pub fn update(
        &self,
        actor: Actor<'_>,
        name: &str,
        update: ModelLineUpdate,
    ) -> Result<(ModelLine, bool), LineError> {
        for (field, teams) in [("readers", &update.readers), ("publishers", &update.publishers)] {
            if let Some(bad) = teams.iter().flatten().find(|team| !valid_team_name(team)) {
                return Err(LineError::BadTeam { field, value: bad.clone() });
            }
        }
        if let Some(owner) = &update.owner {
            if !actor.admin {
                return Err(LineError::OwnerNeedsAdmin);
            }
            if !valid_team_name(owner) {
                return Err(LineError::BadTeam { field: "owner", value: owner.clone() });
            }
        }
        let dir = self.dir(name)?;
        fs::create_dir_all(&dir)?;
        // Changes of one line take turns with each other and with publishing.
        let _lock = lock(&dir)?;
        let existing = self.read(name)?;
        let created = existing.is_none();
        let mut file = match existing {
            Some(file) if actor.admin || file.owner == actor.team => file,
            Some(file) if may_read(&file, actor.team) => {
                return Err(LineError::NotOwner { line: name.to_owned() });
            }
            Some(_) => return Err(LineError::NotFound(name.to_owned())),
            None if !actor.admin && !versions(&dir)?.is_empty() => {
                return Err(LineError::Unowned { line: name.to_owned() });
            }
            None => {
                if !actor.admin {
                    self.check_quota(actor.team)?;
                }
                LineFile {
                    owner: actor.team.to_owned(),
                    readers: Vec::new(),
                    publishers: Vec::new(),
                    policy: GatesSection::default(),
                }
            }
        };
        if let Some(owner) = update.owner {
            file.owner = owner;
        }
        if let Some(readers) = update.readers {
            file.readers = readers;
        }
        if let Some(publishers) = update.publishers {
            file.publishers = publishers;
        }
        if let Some(policy) = update.policy {
            file.policy = policy;
        }
        let json = serde_json::to_vec_pretty(&file).map_err(io::Error::other)?;
        rlvr_protocol::fs::write_atomic(&dir.join("line.json"), &json)?;
        Ok((self.view(name, file)?, created))
    }
}

fn may_read(file: &LineFile, team: &str) -> bool {
    file.owner == team || file.readers.iter().any(|t| t == team) || file.publishers.iter().any(|t| t == team)
}

/// An exclusive `flock` on `<line>/.publish.lock`, released when dropped (or when the process
/// dies): the one lock of a line, shared with `jobs::publish`.
pub fn lock(line: &Path) -> io::Result<fs::File> {
    let lock =
        fs::OpenOptions::new().create(true).truncate(false).write(true).open(line.join(".publish.lock"))?;
    // SAFETY: flock on a descriptor we own; it is released when `lock` is dropped (closed).
    if unsafe { libc::flock(std::os::fd::AsRawFd::as_raw_fd(&lock), libc::LOCK_EX) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(lock)
}

/// Published versions of a line, by number; none when the line's directory does not exist.
pub fn versions(line: &Path) -> io::Result<Vec<(u64, PathBuf)>> {
    let mut found = Vec::new();
    for entry in super::entries_of(line)? {
        if let Some(version) = entry.file_name().to_str().and_then(|name| name.parse::<u64>().ok()) {
            found.push((version, entry.path()));
        }
    }
    found.sort();
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: Actor<'static> = Actor { team: "a", admin: false };
    const B: Actor<'static> = Actor { team: "b", admin: false };
    const ADMIN: Actor<'static> = Actor { team: "ops", admin: true };

    #[test]
    fn a_line_belongs_to_the_team_that_made_it() {
        let dir = tempfile::tempdir().unwrap();
        let lines = Lines::new(dir.path().to_owned(), 100);
        // A dry run claims nothing.
        lines.publisher("a", "tiny-arith", false).unwrap();
        assert!(matches!(lines.get(A, "tiny-arith"), Err(LineError::NotFound(_))));
        lines.publisher("a", "tiny-arith", true).unwrap();
        // regression: one team published versions into another team's line tiny-arith
        assert!(matches!(lines.publisher("b", "tiny-arith", true), Err(LineError::NotPublisher { .. })));
        assert!(matches!(lines.get(B, "tiny-arith"), Err(LineError::NotFound(_))));
        assert!(matches!(lines.version("b", "tiny-arith", None), Err(LineError::NotFound(_))));
        assert!(matches!(
            lines.update(B, "tiny-arith", ModelLineUpdate::default()),
            Err(LineError::NotFound(_))
        ));
        // The owner grants reading; the reader may not change the line.
        let grant = ModelLineUpdate { readers: Some(vec!["b".into()]), ..ModelLineUpdate::default() };
        lines.update(A, "tiny-arith", grant).unwrap();
        assert!(matches!(lines.version("b", "tiny-arith", None), Err(LineError::NoVersions { .. })));
        assert!(matches!(
            lines.update(B, "tiny-arith", ModelLineUpdate::default()),
            Err(LineError::NotOwner { .. })
        ));
        assert!(matches!(lines.publisher("b", "tiny-arith", true), Err(LineError::NotPublisher { .. })));
        let handover = ModelLineUpdate { owner: Some("b".into()), ..ModelLineUpdate::default() };
        assert!(matches!(lines.update(A, "tiny-arith", handover.clone()), Err(LineError::OwnerNeedsAdmin)));
        lines.update(ADMIN, "tiny-arith", handover).unwrap();
        assert_eq!(lines.get(B, "tiny-arith").unwrap().owner, "b");
        // Names are one path component.
        assert!(matches!(lines.publisher("a", "../etc", true), Err(LineError::BadName)));
        assert!(matches!(lines.publisher("a", "cron.d/x", true), Err(LineError::BadName)));
        assert_eq!(lines.list(A).unwrap().len(), 0);
        assert_eq!(lines.list(B).unwrap().len(), 1);
    }

    // regression: one team made 270 lines in 11 s, the names others' examples use among them
    #[test]
    fn a_team_makes_at_most_its_quota_of_lines_by_publishing_or_by_asking() {
        let dir = tempfile::tempdir().unwrap();
        let lines = Lines::new(dir.path().to_owned(), 2);
        lines.publisher("a", "one", true).unwrap();
        lines.update(A, "two", ModelLineUpdate::default()).unwrap();
        assert!(matches!(lines.publisher("a", "three", true), Err(LineError::Quota { max: 2 })));
        assert!(matches!(
            lines.update(A, "three", ModelLineUpdate::default()),
            Err(LineError::Quota { max: 2 })
        ));
        // A dry run claims nothing, and is refused as its submit would be; a team's own lines
        // stay its own.
        assert!(matches!(lines.publisher("a", "three", false), Err(LineError::Quota { max: 2 })));
        lines.publisher("a", "one", true).unwrap();
        lines.update(A, "two", ModelLineUpdate::default()).unwrap();
        // Another team has its own quota; an admin may make lines beyond it.
        lines.publisher("b", "three", true).unwrap();
        lines
            .update(ADMIN, "four", ModelLineUpdate { owner: Some("a".into()), ..ModelLineUpdate::default() })
            .unwrap();
        assert_eq!(lines.list(ADMIN).unwrap().len(), 4);
        // A damaged line.json of one team's counts for nobody and stops no other team.
        fs::write(dir.path().join("one/line.json"), "{not json").unwrap();
        lines.publisher("c", "five", true).unwrap();
    }

    #[test]
    fn a_line_with_versions_and_no_owner_waits_for_an_admin() {
        let dir = tempfile::tempdir().unwrap();
        fs::create_dir_all(dir.path().join("old/1")).unwrap();
        let lines = Lines::new(dir.path().to_owned(), 100);
        assert!(matches!(lines.publisher("a", "old", true), Err(LineError::Unowned { .. })));
        assert!(matches!(lines.update(A, "old", ModelLineUpdate::default()), Err(LineError::Unowned { .. })));
        let give = ModelLineUpdate { owner: Some("a".into()), ..ModelLineUpdate::default() };
        lines.update(ADMIN, "old", give).unwrap();
        assert_eq!(lines.version("a", "old", None).unwrap().0, 1);
    }
}
