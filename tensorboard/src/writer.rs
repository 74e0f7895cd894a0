//! The event file a process appends a run's metrics to (`RunDir::tensorboard`).
//!
//! Each process that writes starts its own file, named as TensorFlow names them
//! (`events.out.tfevents.<unix secs>.<host>.<pid>.<n>`), created at its first line: a file is
//! never appended to by two processes, and a process that writes nothing leaves none. A resumed
//! run (after a preemption, from its checkpoint) writes again the steps after that checkpoint, as
//! `metrics.jsonl` is cut back and written again; so the new file's first event after the version
//! is a `SessionLog` START at the first step it writes, and TensorBoard's loader drops every
//! value an earlier file holds at that step or later — what it shows is what `metrics.jsonl`
//! holds. (TensorBoard's Rust data server needs no START: it drops the later points of a series
//! whose step goes back.)
//!
//! Every line is written whole, with one `write`, as soon as it is appended: a live TensorBoard
//! sees each step. Failures are returned, for the caller to log: a chart is never worth a job.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use rlvr_protocol::worker::MetricsLine;

use crate::record::{Event, record};
use crate::scalars::scalars;

/// What every event file's name starts with (TensorBoard looks for it).
pub const FILE_PREFIX: &str = "events.out.tfevents.";

/// Files this process has started: the name's last part, unique even within one second.
static FILES_STARTED: AtomicU32 = AtomicU32::new(0);

/// A write to the event file that did not happen.
#[derive(Debug, thiserror::Error)]
pub enum EventLogError {
    #[error("cannot create the event file in {}: {source}", dir.display())]
    Create { dir: PathBuf, source: io::Error },
    #[error("cannot write {}: {source}", path.display())]
    Write { path: PathBuf, source: io::Error },
}

/// A run's TensorBoard directory, appended to by this process.
#[derive(Debug)]
pub struct EventLog {
    dir: PathBuf,
    /// This process's file, once a line was written.
    file: Option<(PathBuf, File)>,
}

impl EventLog {
    /// The log of directory `dir` (created at the first line).
    pub fn new(dir: PathBuf) -> EventLog {
        EventLog { dir, file: None }
    }

    /// This process's file, once it has one.
    pub fn file(&self) -> Option<&Path> {
        self.file.as_ref().map(|(path, _)| path.as_path())
    }

    /// Appends `line`'s scalars as one event at its step (nothing when it has none).
    pub fn append(&mut self, line: &MetricsLine) -> Result<(), EventLogError> {
        self.append_at(line, unix_now())
    }

    fn append_at(&mut self, line: &MetricsLine, wall_time: f64) -> Result<(), EventLogError> {
        let scalars = scalars(line);
        if scalars.is_empty() {
            return Ok(());
        }
        let mut bytes = Vec::new();
        if self.file.is_none() {
            let path = self.create(wall_time)?;
            bytes.extend(record(&Event::file_version(wall_time)));
            bytes.extend(record(&Event::start(wall_time, line.step)));
            self.file = Some(path);
        }
        bytes.extend(record(&Event::scalars(wall_time, line.step, &scalars)));
        let Some((path, file)) = &mut self.file else { unreachable!("opened above") };
        file.write_all(&bytes).map_err(|source| EventLogError::Write { path: path.clone(), source })
    }

    /// A new file, named to sort after every file already in the directory.
    fn create(&self, wall_time: f64) -> Result<(PathBuf, File), EventLogError> {
        let fail = |source| EventLogError::Create { dir: self.dir.clone(), source };
        fs::create_dir_all(&self.dir).map_err(fail)?;
        let existing: Vec<String> = fs::read_dir(&self.dir)
            .map_err(fail)?
            .filter_map(|entry| entry.ok()?.file_name().into_string().ok())
            .collect();
        let name = FileName {
            now_secs: wall_time as u64,
            host: hostname(),
            pid: std::process::id(),
            n: FILES_STARTED.fetch_add(1, Ordering::Relaxed),
        }
        .after(&existing);
        let path = self.dir.join(name);
        let file = OpenOptions::new().append(true).create_new(true).open(&path).map_err(fail)?;
        Ok((path, file))
    }
}

/// The parts of an event file's name.
struct FileName {
    now_secs: u64,
    host: String,
    pid: u32,
    n: u32,
}

impl FileName {
    /// The name, its seconds moved past the newest of `existing`'s when they would not sort
    /// after it: TensorBoard reads a run's files in name order, and a START must come after the
    /// values it drops (a restart within the same second, a clock set back).
    fn after(&self, existing: &[String]) -> String {
        let newest = existing
            .iter()
            .filter_map(|name| name.strip_prefix(FILE_PREFIX)?.split('.').next()?.parse::<u64>().ok())
            .max();
        let secs = match newest {
            Some(newest) if newest >= self.now_secs => newest + 1,
            _ => self.now_secs,
        };
        format!("{FILE_PREFIX}{secs:010}.{}.{}.{}", self.host, self.pid, self.n)
    }
}

/// The machine's name, as a file name's part (Linux: the kernel's; `localhost` when unreadable).
fn hostname() -> String {
    let name = fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    let name: String = name
        .trim()
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() || c == '-' || c == '_' { c } else { '_' })
        .collect();
    if name.is_empty() { "localhost".to_owned() } else { name }
}

fn unix_now() -> f64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0.0, |since| since.as_secs_f64())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check_name(now_secs: u64, existing: &[&str], expected: &str) {
        let name = FileName { now_secs, host: "gpu-1".to_owned(), pid: 42, n: 0 };
        let existing: Vec<String> = existing.iter().map(|name| (*name).to_owned()).collect();
        assert_eq!(name.after(&existing), expected, "{existing:?}");
    }

    #[test]
    fn file_names_sort_after_the_files_there() {
        check_name(1_700_000_000, &[], "events.out.tfevents.1700000000.gpu-1.42.0");
        // An earlier run's file, and things that are not event files.
        check_name(
            1_700_000_000,
            &["events.out.tfevents.1690000000.gpu-2.7.0", "notes.txt", "events.out.tfevents.x"],
            "events.out.tfevents.1700000000.gpu-1.42.0",
        );
        // A restart within the same second: pid 42 would sort before pid 99.
        check_name(
            1_700_000_000,
            &["events.out.tfevents.1700000000.gpu-1.99.0"],
            "events.out.tfevents.1700000001.gpu-1.42.0",
        );
        // A clock set back.
        check_name(
            1_600_000_000,
            &["events.out.tfevents.1700000005.gpu-1.99.0"],
            "events.out.tfevents.1700000006.gpu-1.42.0",
        );
    }

    fn line(text: &str) -> MetricsLine {
        serde_json::from_str(text).unwrap()
    }

    /// The records of `bytes`, checked frame by frame, as step and what.
    fn read_records(bytes: &[u8]) -> Vec<Event> {
        let mut events = Vec::new();
        let mut rest = bytes;
        while !rest.is_empty() {
            let length = u64::from_le_bytes(rest[..8].try_into().unwrap()) as usize;
            assert_eq!(crate::record::masked_crc32c(&rest[..8]).to_le_bytes(), rest[8..12]);
            let payload = &rest[12..12 + length];
            assert_eq!(crate::record::masked_crc32c(payload).to_le_bytes(), rest[12 + length..16 + length]);
            events.push(prost::Message::decode(payload).unwrap());
            rest = &rest[16 + length..];
        }
        events
    }

    #[test]
    fn a_file_per_process_its_start_at_the_first_step_written() {
        let dir = tempfile::tempdir().unwrap();
        let tensorboard = dir.path().join("tensorboard");
        let mut log = EventLog::new(tensorboard.clone());
        log.append_at(&line(r#"{"step":4}"#), 10.0).unwrap();
        assert!(!tensorboard.exists(), "a line without scalars starts no file");
        log.append_at(&line(r#"{"step":4,"loss":0.5}"#), 10.0).unwrap();
        log.append_at(&line(r#"{"step":5,"loss":0.25,"heldout":{"accuracy":0.5,"reward_mean":0.5,"completion_len_mean":3.0,"prompts":2}}"#), 11.0).unwrap();
        let path = log.file().unwrap().to_owned();
        let events = read_records(&fs::read(&path).unwrap());
        use crate::record::{SessionLog, What};
        let summary = |event: &Event| match &event.what {
            Some(What::Summary(summary)) => {
                summary.value.iter().map(|value| (value.tag.clone(), value.simple_value)).collect::<Vec<_>>()
            }
            other => panic!("not a summary: {other:?}"),
        };
        assert_eq!(events.len(), 4);
        assert_eq!(events[0], Event::file_version(10.0));
        assert_eq!((events[1].step, &events[1].what), (4, &Some(What::SessionLog(SessionLog { status: 1 }))));
        assert_eq!((events[2].step, summary(&events[2])), (4, vec![("train/loss".to_owned(), Some(0.5))]));
        assert_eq!(events[3].step, 5);
        assert_eq!(summary(&events[3]).len(), 5);
        // The next process (a resume) starts its own file, after this one.
        let mut resumed = EventLog::new(tensorboard.clone());
        resumed.append_at(&line(r#"{"step":5,"loss":0.125}"#), 10.0).unwrap();
        let second = resumed.file().unwrap().to_owned();
        assert!(second.file_name() > path.file_name(), "{second:?} sorts after {path:?}");
        let events = read_records(&fs::read(&second).unwrap());
        assert_eq!((events[1].step, events[2].step), (5, 5));
    }

    #[test]
    fn a_directory_that_cannot_be_made_is_an_error_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let blocker = dir.path().join("tensorboard");
        fs::write(&blocker, "a file where the directory goes").unwrap();
        let error = EventLog::new(blocker.clone()).append(&line(r#"{"step":1,"loss":1.0}"#)).unwrap_err();
        assert!(
            error.to_string().starts_with(&format!("cannot create the event file in {}", blocker.display())),
            "{error}"
        );
    }
}
