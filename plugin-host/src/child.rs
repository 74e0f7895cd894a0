//! Runs a short-lived helper process (`rlvr-worker probe-plugin`, `rlvr-worker check-options`)
//! whose answer is its last stdout line: output collected, a time limit, a kill past it.

use std::io::Read;
use std::path::PathBuf;
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use serde::de::DeserializeOwned;

/// The helper could not give an answer.
#[derive(Debug, thiserror::Error)]
pub enum ChildError {
    /// It did not start.
    #[error("cannot start the worker process {}: {source}", exe.display())]
    Spawn {
        /// The executable.
        exe: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// It ran past its time and was killed.
    #[error("the worker process did not finish within {} s and was killed", limit.as_secs_f64())]
    Timeout {
        /// The limit.
        limit: Duration,
    },
}

/// What a helper left when it exited.
#[derive(Debug)]
pub struct ChildOutput {
    /// How it ended.
    pub status: ExitStatus,
    /// Everything it wrote to stdout.
    pub stdout: String,
    /// Everything it wrote to stderr.
    pub stderr: String,
}

impl ChildOutput {
    /// The last non-blank stdout line, read as `T`.
    pub fn last_line<T: DeserializeOwned>(&self) -> Option<T> {
        let line = self.stdout.lines().rev().find(|line| !line.trim().is_empty())?;
        serde_json::from_str(line).ok()
    }

    /// How it ended and, when it said anything on stderr, the last 400 characters of it.
    pub fn describe(&self) -> String {
        let trimmed = self.stderr.trim();
        let start = trimmed.char_indices().rev().nth(400).map_or(0, |(at, _)| at);
        let tail = &trimmed[start..];
        let exit = describe_exit(self.status);
        if tail.is_empty() { exit } else { format!("{exit}; its last words: {tail}") }
    }
}

/// Runs `command` with stdin closed and stdout and stderr collected, killing it past `limit`.
pub fn run(mut command: Command, limit: Duration) -> Result<ChildOutput, ChildError> {
    let exe = PathBuf::from(command.get_program());
    let mut child = command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|source| ChildError::Spawn { exe, source })?;
    let readers = [child.stdout.take().map(reader), child.stderr.take().map(reader)];
    let started = Instant::now();
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if started.elapsed() < limit => std::thread::sleep(Duration::from_millis(5)),
            Ok(None) | Err(_) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(ChildError::Timeout { limit });
            }
        }
    };
    let [stdout, stderr] =
        readers.map(|reader| reader.and_then(|thread| thread.join().ok()).unwrap_or_default());
    Ok(ChildOutput { status, stdout, stderr })
}

/// Reads a pipe to its end on a thread of its own, so a chatty child never blocks on a full pipe.
fn reader(mut pipe: impl Read + Send + 'static) -> std::thread::JoinHandle<String> {
    std::thread::spawn(move || {
        let mut text = String::new();
        let _ = pipe.read_to_string(&mut text);
        text
    })
}

fn describe_exit(status: ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (_, Some(signal)) => match nix::sys::signal::Signal::try_from(signal) {
            Ok(signal) => format!("killed by {signal}"),
            Err(_) => format!("killed by signal {signal}"),
        },
        (Some(code), _) => format!("exit code {code}"),
        _ => "unknown exit".to_owned(),
    }
}
