//! Writing files so that a reader, or a crash at any moment, sees the old content or the new,
//! never half: the one way rlvr replaces a file (checkpoints' state, the job's spec, progress,
//! the address file, reports, plugin copies).

use std::fs::{self, File};
use std::io::{self, Write};
use std::path::Path;

use serde::Serialize;

/// Writes `bytes` to `path` through a temporary file in the same directory, fsync and rename,
/// then fsyncs the directory. The temporary name starts with `.` and ends with `.tmp-<pid>-<n>`,
/// so readers that list the directory can tell it from a published file; `n` counts this
/// process's writes, so two threads replacing one file each write their own temporary file (with
/// the pid alone, one renamed the other's away and failed: concurrent uploads of one dataset
/// name answered 500).
pub fn write_atomic(path: &Path, bytes: &[u8]) -> io::Result<()> {
    replace(path, bytes, Durability::Synced)
}

/// [`write_atomic`] without the fsyncs: readers never see half the file, but a crash may lose the
/// new content. For what is rewritten often and is worth nothing after a crash (a job's live
/// progress, once a step): two fsyncs a step would be paid on the training loop for nothing.
pub fn replace_atomic(path: &Path, bytes: &[u8]) -> io::Result<()> {
    replace(path, bytes, Durability::Unsynced)
}

/// Whether a replaced file must survive a crash.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Durability {
    Synced,
    Unsynced,
}

fn replace(path: &Path, bytes: &[u8], durability: Durability) -> io::Result<()> {
    let synced = durability == Durability::Synced;
    let parent = match path.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent,
        _ => Path::new("."),
    };
    let name = path.file_name().map(|name| name.to_string_lossy()).unwrap_or_default();
    static WRITES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = WRITES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let temp = parent.join(format!(".{name}.tmp-{}-{n}", std::process::id()));
    let written = (|| {
        let mut file = File::create(&temp)?;
        file.write_all(bytes)?;
        if synced {
            file.sync_all()?;
        }
        fs::rename(&temp, path)
    })();
    if written.is_err() {
        let _ = fs::remove_file(&temp);
    }
    written?;
    if synced { sync_dir(parent) } else { Ok(()) }
}

/// [`write_atomic`] of `value` as pretty JSON.
pub fn write_json_atomic<T: Serialize + ?Sized>(path: &Path, value: &T) -> io::Result<()> {
    write_atomic(path, &serde_json::to_vec_pretty(value).map_err(io::Error::other)?)
}

/// An error's message with the path it concerns before it, its kind kept: a job's reason or a log
/// line then says which file a full disk or a read-only directory refused
/// (`…/model.safetensors: No space left on device (os error 28)`), which the error alone does not.
pub fn naming(path: &Path) -> impl FnOnce(io::Error) -> io::Error + '_ {
    move |error| io::Error::new(error.kind(), format!("{}: {error}", path.display()))
}

/// fsyncs a directory, so that the names created or renamed in it survive a crash.
pub fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_is_replaced_whole_and_no_temporary_file_stays() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.json");
        write_atomic(&path, b"old").unwrap();
        write_json_atomic(&path, &serde_json::json!({"step": 2})).unwrap();
        assert_eq!(fs::read_to_string(&path).unwrap(), "{\n  \"step\": 2\n}");
        let names: Vec<String> = fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into())
            .collect();
        assert_eq!(names, ["state.json"]);
    }

    #[test]
    fn an_unsynced_replace_is_whole_too() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("progress.json");
        replace_atomic(&path, b"{\"step\": 1}").unwrap();
        replace_atomic(&path, b"{\"step\": 2}").unwrap();
        assert_eq!(fs::read(&path).unwrap(), b"{\"step\": 2}");
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 1, "no temporary file stays");
    }

    #[test]
    fn a_failed_write_leaves_the_old_file() {
        let dir = tempfile::tempdir().unwrap();
        // A name a file may have but its temporary name may not (over 255 bytes with its
        // `.` and `.tmp-<pid>-<n>`): the write fails before anything is renamed.
        let path = dir.path().join("f".repeat(250));
        fs::write(&path, b"old").unwrap();
        assert!(write_atomic(&path, b"new").is_err());
        assert_eq!(fs::read(&path).unwrap(), b"old");
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 1, "no temporary file stays");
    }

    #[test]
    fn threads_replacing_one_file_at_once_all_succeed_and_one_content_wins_whole() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("name.json");
        let contents: Vec<Vec<u8>> =
            (0..16).map(|i| format!("{{\"writer\": {i}}}").repeat(1000).into_bytes()).collect();
        std::thread::scope(|scope| {
            for content in &contents {
                let path = &path;
                scope.spawn(move || {
                    for _ in 0..20 {
                        write_atomic(path, content).unwrap();
                    }
                });
            }
        });
        assert!(contents.contains(&fs::read(&path).unwrap()));
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 1, "no temporary file stays");
    }
}
