//! What probe processes reported, kept on disk beside the content-addressed copies, so that a
//! daemon started again over an unchanged plugin directory starts no probe process.
//!
//! A probe (`rlvr-worker probe-plugin`) maps libtorch: 0.6–0.8 s and about 480 MB per library,
//! once per library at every start, because the registry's memory dies with the daemon. Its
//! answer depends on two things only: the library's bytes and the worker that loaded them (its
//! plugin API, abi_stable layout and libtorch version are compiled into it). So a report is kept
//! under both — the library's sha256 and the worker's [`WorkerIdentity`] — and a new build of
//! either asks again.
//!
//! - Only what the probe process itself answered is kept: the library loaded, or it refused it
//!   for a reason the library carries. A crash, a timeout or a failed start may be the machine's
//!   fault (memory, load), and is asked again at the next start.
//! - Entries are written with [`rlvr_protocol::fs::write_atomic`] (a temporary file, renamed), so
//!   several daemons may share a cache directory: a reader sees a whole entry or none.
//! - An entry that cannot be read, does not parse, or names another library or worker is
//!   ignored (and the library probed again), never an error: the cache only saves time.
//!
//! Measured on a 2-core machine under other builds (load 4–9), debug build, 16 plugins: a start
//! took 16–32 s before the reports were kept; 3.4–5.8 s after (hashing, comparing and loading the
//! verifiers in-process remain), 22–35 s the first time. The worker's identity
//! is its GNU build-id (the linker's hash of the binary, read from its note segment), or its size
//! and mtime when it has none.

use std::fs::File;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::registry::ProbeReport;

/// The entries' format; an entry of another is ignored.
const FORMAT: u32 = 1;

/// Which build of the worker executable probed: its GNU build-id (the linker's hash of the
/// binary), or, for a binary linked without one, its size and modification time.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkerIdentity(String);

impl WorkerIdentity {
    /// The identity of the executable at `exe`. Reads its ELF header and note segments only:
    /// parsing the whole file (its symbol tables) took about 0.2 s per library of a debug build.
    pub fn of(exe: &Path) -> io::Result<WorkerIdentity> {
        let file = File::open(exe)?;
        let metadata = file.metadata()?;
        let cache = object::ReadCache::new(file);
        Ok(match build_id(&cache) {
            Some(id) => WorkerIdentity(format!("build-id:{}", hex::encode(id))),
            None => WorkerIdentity(format!(
                "stamp:{}:{}.{:09}",
                metadata.len(),
                metadata.mtime(),
                metadata.mtime_nsec()
            )),
        })
    }

    /// The identity as written in an entry.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// A short, file-name-safe digest of the identity, for entry names: a stamp has `:` and `.`,
    /// and the full identity is in the entry, compared on every read.
    fn digest(&self) -> String {
        hex::encode(&Sha256::digest(self.0.as_bytes())[..8])
    }
}

/// The GNU build-id note of a 64-bit ELF file, from its `PT_NOTE` segments (where the linker
/// puts it in an executable); `None` for anything else.
fn build_id(data: &object::ReadCache<File>) -> Option<&[u8]> {
    use object::read::elf::{FileHeader, ProgramHeader};

    let header = object::elf::FileHeader64::<object::Endianness>::parse(data).ok()?;
    let endian = header.endian().ok()?;
    for segment in header.program_headers(endian, data).ok()? {
        let Ok(Some(mut notes)) = segment.notes(endian, data) else { continue };
        while let Ok(Some(note)) = notes.next() {
            if note.name() == object::elf::ELF_NOTE_GNU
                && note.n_type(endian) == object::elf::NT_GNU_BUILD_ID
                && !note.desc().is_empty()
            {
                return Some(note.desc());
            }
        }
    }
    None
}

/// One entry: the key it answers for, written beside the answer so that a misnamed or copied
/// file is not taken for another library's.
#[derive(Debug, Serialize, Deserialize)]
struct Entry {
    format: u32,
    sha256: String,
    worker: WorkerIdentity,
    report: ProbeReport,
}

/// Where the report `worker` gave for the library copied to `copy` (`<stem>-<sha256>.so`) is
/// kept: `<stem>-<sha256>.<worker digest>.probe.json`, beside the copy, so an operator sees which
/// copy each report is about and removing a copy's files removes its reports.
fn entry_path(copy: &Path, worker: &WorkerIdentity) -> PathBuf {
    let stem = copy.file_stem().map(|stem| stem.to_string_lossy()).unwrap_or_default();
    copy.with_file_name(format!("{stem}.{}.probe.json", worker.digest()))
}

/// The report `worker` gave for the library with `sha256`, copied to `copy`, if one was kept and
/// reads back whole; anything else is `None` (and logged when an entry was there but unusable).
pub fn read(copy: &Path, sha256: &str, worker: &WorkerIdentity) -> Option<ProbeReport> {
    let path = entry_path(copy, worker);
    let text = match std::fs::read(&path) {
        Ok(text) => text,
        Err(error) if error.kind() == io::ErrorKind::NotFound => return None,
        Err(error) => {
            tracing::warn!(path = %path.display(), %error, "plugin probe report unreadable; probing again");
            return None;
        }
    };
    match serde_json::from_slice::<Entry>(&text) {
        Ok(entry) if entry.format == FORMAT && entry.sha256 == sha256 && &entry.worker == worker => {
            Some(entry.report)
        }
        Ok(_) => {
            tracing::warn!(path = %path.display(), "plugin probe report is for another library, worker or format; probing again");
            None
        }
        Err(error) => {
            tracing::warn!(path = %path.display(), %error, "plugin probe report corrupt; probing again");
            None
        }
    }
}

/// Keeps `report`, what `worker` answered for the library with `sha256` copied to `copy`.
pub fn write(copy: &Path, sha256: &str, worker: &WorkerIdentity, report: &ProbeReport) -> io::Result<()> {
    let entry =
        Entry { format: FORMAT, sha256: sha256.to_owned(), worker: worker.clone(), report: report.clone() };
    let bytes = serde_json::to_vec_pretty(&entry).map_err(io::Error::other)?;
    rlvr_protocol::fs::write_atomic(&entry_path(copy, worker), &bytes)
}

#[cfg(test)]
mod tests {
    use rlvr_plugin_api::PluginKind;

    use super::*;
    use crate::loader::{LoadRefusal, PluginMeta, RefusalReason};

    const SHA: &str = "a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1";
    const OTHER_SHA: &str = "b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2";

    fn loaded() -> ProbeReport {
        ProbeReport::Loaded(PluginMeta {
            kind: PluginKind::Optimizer,
            name: "grpo".into(),
            version: semver::Version::new(0, 1, 0),
            description: "group relative".into(),
            reference_schema: None,
            data_mode: Some("online-groups".into()),
            needs_reference: Some(true),
            needs_value_head: Some(false),
            needs_groups: Some(true),
            trains: Some("policy".into()),
            notes: vec!["a note".into()],
        })
    }

    fn worker(build: &str) -> WorkerIdentity {
        WorkerIdentity(format!("build-id:{build}"))
    }

    /// What is read back for `(sha256, worker)` of the copy after one report was written for
    /// (SHA, w1).
    fn check(written: &ProbeReport, asked: (&str, &WorkerIdentity), expected: Option<&ProbeReport>) {
        let dir = tempfile::tempdir().unwrap();
        let copy = dir.path().join(format!("librlvr_optimizer_grpo-{SHA}.so"));
        write(&copy, SHA, &worker("w1"), written).unwrap();
        assert_eq!(read(&copy, asked.0, asked.1).as_ref(), expected);
    }

    #[test]
    fn a_report_is_found_again_under_its_library_and_worker_only() {
        let refused = ProbeReport::Refused(LoadRefusal::new(RefusalReason::SelfTestFailed, "self-test: no"));
        // Hit: the same library, the same worker, whatever the report said.
        check(&loaded(), (SHA, &worker("w1")), Some(&loaded()));
        check(&refused, (SHA, &worker("w1")), Some(&refused));
        // Miss: another build of the library, or another build of the worker.
        check(&loaded(), (OTHER_SHA, &worker("w1")), None);
        check(&loaded(), (SHA, &worker("w2")), None);
    }

    #[test]
    fn a_corrupt_or_misplaced_entry_is_ignored_and_replaced() {
        let dir = tempfile::tempdir().unwrap();
        let (copy, other_copy) = (dir.path().join(format!("lib-{SHA}.so")), dir.path().join("lib-other.so"));
        let w1 = worker("w1");
        let path = entry_path(&copy, &w1);
        for bytes in [&b""[..], b"{\"format\": 1, \"sha256\": ", b"\x7fELF", b"{}"] {
            std::fs::write(&path, bytes).unwrap();
            assert_eq!(read(&copy, SHA, &w1), None, "{}", String::from_utf8_lossy(bytes));
        }
        // Another library's entry under this one's name (copied by hand, say) is not believed.
        write(&other_copy, OTHER_SHA, &w1, &loaded()).unwrap();
        std::fs::rename(entry_path(&other_copy, &w1), &path).unwrap();
        assert_eq!(read(&copy, SHA, &w1), None);
        // An unreadable entry (a directory where the file should be) is a miss too.
        std::fs::remove_file(&path).unwrap();
        std::fs::create_dir(&path).unwrap();
        assert_eq!(read(&copy, SHA, &w1), None);
        std::fs::remove_dir(&path).unwrap();
        // The next probe's report replaces what was there.
        std::fs::write(&path, b"garbage").unwrap();
        write(&copy, SHA, &w1, &loaded()).unwrap();
        assert_eq!(read(&copy, SHA, &w1), Some(loaded()));
    }

    #[test]
    fn a_worker_is_known_by_its_build_id_else_by_size_and_time() {
        // This test binary is linked as the workspace's binaries are: with a build-id, which a
        // rebuild changes and a copy keeps.
        let exe = std::env::current_exe().unwrap();
        let identity = WorkerIdentity::of(&exe).unwrap();
        assert!(identity.as_str().starts_with("build-id:"), "{identity:?}");
        let dir = tempfile::tempdir().unwrap();
        let copy = dir.path().join("copy");
        std::fs::copy(&exe, &copy).unwrap();
        assert_eq!(WorkerIdentity::of(&copy).unwrap(), identity);
        // A script (or a binary without the note) is known by its size and modification time.
        let script = dir.path().join("rlvr-worker");
        std::fs::write(&script, "#!/bin/sh\n").unwrap();
        let stamped = WorkerIdentity::of(&script).unwrap();
        assert!(stamped.as_str().starts_with("stamp:10:"), "{stamped:?}");
        std::fs::write(&script, "#!/bin/sh\nexit 1\n").unwrap();
        assert_ne!(WorkerIdentity::of(&script).unwrap(), stamped);
        assert!(WorkerIdentity::of(&dir.path().join("missing")).is_err());
    }
}
