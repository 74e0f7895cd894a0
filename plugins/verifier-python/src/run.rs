//! One item's run: a fresh sandbox, the grader's source, the sample and the item in on fd 3,
//! one result line out on fd 4, all within the item's deadline.

use std::fs::File;
use std::io::Read;
use std::os::fd::OwnedFd;
use std::path::Path;
use std::time::{Duration, Instant};

use rlvr_sandbox_common::fdio::{self, LineReader, PipeError};
use rlvr_sandbox_common::sandbox::{Sandbox, Stream, Termination};
use serde::Deserialize;

/// The sandboxed side (untrusted once the grader runs beside it; see its header).
pub const RUNNER: &str = include_str!("runner.py");

/// Interpreter flags: no site module (fast start, no site-packages), no user site, no bytecode.
const ARGS: [&str; 5] = ["-S", "-s", "-B", "-c", RUNNER];
/// Longest result line we read; the runner sends at most 8 KiB.
const REPLY_MAX: usize = 16 * 1024;
/// How long to wait for the runner's exit status once it has answered or closed its pipes.
const STATUS_GRACE: Duration = Duration::from_millis(500);
/// The file in the work dir that takes the grader's stdout and stderr.
const OUTPUT_FILE: &str = "output.txt";
/// Output kept for `--explain`, bytes.
const OUTPUT_KEEP: usize = 2048;

/// What the runner sends back on fd 4: the score grade() returned, the error the child found,
/// or the wait status of a child that ended without a word.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum Reply {
    /// grade() returned this finite number (bool as 0/1).
    Score(f64),
    /// grade() could not give a score.
    Error(ChildError),
    /// The child that ran grade() ended without a result; its raw wait status.
    Ended(i32),
}

/// An error the sandboxed child reported.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ChildError {
    /// `syntax`, `exception`, `no_grade` or `return`.
    pub kind: String,
    /// The last traceback line or what was wrong with the returned value.
    pub message: String,
}

/// How a run ended, before it becomes a verdict.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// A finite score.
    Score(f64),
    /// No score: the message names why.
    Failed(String),
    /// The wall clock or the CPU limit ran out.
    TimedOut(String),
}

/// A run's result and, when asked, the grader's first output bytes.
#[derive(Debug)]
pub struct Ran {
    /// The outcome.
    pub outcome: Outcome,
    /// The start of what the grader printed (stdout and stderr), when explaining.
    pub output: Option<String>,
}

/// Knobs of one run.
#[derive(Debug, Clone, Copy)]
pub struct RunLimits {
    /// Wall clock for the whole run: interpreter start, compiling the source, grade().
    pub timeout: Duration,
    /// Address space, MiB (for messages).
    pub memory_mb: u64,
}

/// Runs `grade(sample, item)` of `source` in a fresh sandbox under `work_root`.
pub fn run(
    sandbox: &Sandbox,
    work_root: &Path,
    limits: RunLimits,
    source: &str,
    sample: &str,
    item_literal: &str,
    explain: bool,
) -> Result<Ran, String> {
    let deadline = Instant::now() + limits.timeout;
    let workdir = tempfile::Builder::new()
        .prefix("rlvr-python-")
        .tempdir_in(work_root)
        .map_err(|error| format!("cannot create a work directory: {error}"))?;
    let output_path = workdir.path().join(OUTPUT_FILE);
    let output =
        File::create(&output_path).map_err(|error| format!("cannot create the output file: {error}"))?;
    let stderr = output.try_clone().map_err(|error| format!("cannot create the output file: {error}"))?;
    let pipe = || fdio::pipe().map_err(|error| format!("pipe: {error}"));
    let (request_read, request_write) = pipe()?;
    let (reply_read, reply_write) = pipe()?;
    let mut child = sandbox
        .spawn(
            workdir.path(),
            &ARGS,
            Stream::Null,
            Stream::Pipe(OwnedFd::from(output)),
            Stream::Pipe(OwnedFd::from(stderr)),
            [Some(request_read), Some(reply_write)],
        )
        .map_err(|error| format!("cannot start the sandbox: {error}"))?;
    fdio::set_nonblocking(&request_write).map_err(|error| format!("pipe: {error}"))?;
    let mut replies = LineReader::new(reply_read).map_err(|error| format!("pipe: {error}"))?;
    let header = format!("{} {} {}\n", source.len(), sample.len(), item_literal.len());
    let mut input = Vec::with_capacity(header.len() + source.len() + sample.len() + item_literal.len());
    for part in [header.as_str(), source, sample, item_literal] {
        input.extend_from_slice(part.as_bytes());
    }
    // A runner that died at start (too little memory for the interpreter) closes its end: the
    // write fails, and the read below then reports how it ended.
    let sent = fdio::write_all_until(&request_write, &input, deadline);
    drop(request_write);
    let reply = match sent {
        Err(PipeError::Timeout) => Err(PipeError::Timeout),
        _ => replies.read_line(deadline, REPLY_MAX),
    };
    let timed_out =
        || Outcome::TimedOut(format!("the grader ran past timeout_ms ({} ms)", limits.timeout.as_millis()));
    let outcome = match reply {
        Ok(line) => {
            let termination = child.finish(STATUS_GRACE);
            match serde_json::from_slice::<Reply>(&line) {
                Ok(reply) => judge(reply, limits),
                // Runs of ours only: the runner forwards what the child wrote, which the grader
                // can shape (it is its own pipe); anything but one of our lines is refused.
                Err(_) if termination.cpu_limit() => timed_out(),
                Err(_) => Outcome::Failed(format!(
                    "the grader sent a malformed result ({} bytes); only returning from grade() sets the score",
                    line.len()
                )),
            }
        }
        Err(PipeError::Timeout) => {
            child.kill();
            child.finish(Duration::ZERO);
            timed_out()
        }
        Err(PipeError::TooLong) => {
            child.kill();
            child.finish(Duration::ZERO);
            Outcome::Failed(format!("the grader sent a result over {REPLY_MAX} bytes"))
        }
        Err(PipeError::Closed | PipeError::Io(_)) => {
            let termination = child.finish(STATUS_GRACE);
            match termination {
                Termination::Signaled(_) if termination.cpu_limit() => timed_out(),
                Termination::Signaled(signal) => Outcome::Failed(format!(
                    "the sandbox ended without a result: {}",
                    signal_text(signal, limits)
                )),
                Termination::Exited(code) => {
                    Outcome::Failed(format!("the sandbox ended without a result (exit code {code})"))
                }
                Termination::Killed => Outcome::Failed("the sandbox ended without a result".to_owned()),
            }
        }
    };
    let output = explain.then(|| read_output(&output_path));
    Ok(Ran { outcome, output })
}

/// The outcome a well-formed reply stands for.
fn judge(reply: Reply, limits: RunLimits) -> Outcome {
    match reply {
        Reply::Score(score) if score.is_finite() => Outcome::Score(score),
        Reply::Score(score) => Outcome::Failed(format!("grade returned {score}; expected a finite number")),
        Reply::Error(error) => {
            let mut message = error.message;
            if message.starts_with("MemoryError") {
                message.push_str(&format!(
                    "; the grader's memory is limited to {} MiB (memory_mb)",
                    limits.memory_mb
                ));
            }
            if error.kind == "syntax" {
                message = format!("the source does not compile: {message}");
            }
            Outcome::Failed(message)
        }
        Reply::Ended(status) => {
            if libc::WIFSIGNALED(status) {
                let signal = libc::WTERMSIG(status);
                if signal == libc::SIGXCPU {
                    return Outcome::TimedOut("the grader ran past its CPU time".to_owned());
                }
                Outcome::Failed(format!("the grader ended without a result: {}", signal_text(signal, limits)))
            } else {
                Outcome::Failed(format!(
                    "the grader exited (code {}) without returning from grade()",
                    libc::WEXITSTATUS(status)
                ))
            }
        }
    }
}

/// A signal that ended a sandboxed process, in words.
fn signal_text(signal: i32, limits: RunLimits) -> String {
    match signal {
        libc::SIGSYS => {
            "killed by the sandbox for a forbidden system call (SIGSYS; e.g. opening a socket)".to_owned()
        }
        libc::SIGKILL => "killed (SIGKILL)".to_owned(),
        libc::SIGSEGV => {
            format!("crashed (SIGSEGV; the memory limit is {} MiB, memory_mb)", limits.memory_mb)
        }
        libc::SIGABRT => {
            format!("aborted (SIGABRT; the memory limit is {} MiB, memory_mb)", limits.memory_mb)
        }
        libc::SIGXFSZ => "killed for writing past the file size limit (SIGXFSZ)".to_owned(),
        other => format!("killed by signal {other}"),
    }
}

/// The start of the grader's output, for the explanation.
fn read_output(path: &Path) -> String {
    let mut kept = Vec::new();
    if let Ok(file) = File::open(path) {
        let _ = file.take(OUTPUT_KEEP as u64 + 1).read_to_end(&mut kept);
    }
    let cut = kept.len() > OUTPUT_KEEP;
    kept.truncate(OUTPUT_KEEP);
    let mut text = String::from_utf8_lossy(&kept).into_owned();
    if cut {
        text.push_str(" ...");
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: RunLimits = RunLimits { timeout: Duration::from_secs(1), memory_mb: 256 };

    fn check(line: &str, expected: Result<Outcome, ()>) {
        let got = serde_json::from_str::<Reply>(line).map(|reply| judge(reply, LIMITS)).map_err(|_| ());
        assert_eq!(got, expected, "{line}");
    }

    #[test]
    fn replies_are_read_strictly() {
        let failed = |text: &str| Ok(Outcome::Failed(text.to_owned()));
        // Wait statuses as waitpid gives them: signal in the low 7 bits, exit code << 8.
        let cases = [
            (r#"{"score":0.5}"#, Ok(Outcome::Score(0.5))),
            (r#"{"score":-3}"#, Ok(Outcome::Score(-3.0))),
            (r#"{"score":1e-05}"#, Ok(Outcome::Score(1e-5))),
            (
                r#"{"error":{"kind":"exception","message":"ZeroDivisionError: division by zero (grader.py, line 2)"}}"#,
                failed("ZeroDivisionError: division by zero (grader.py, line 2)"),
            ),
            (
                r#"{"error":{"kind":"syntax","message":"SyntaxError: invalid syntax (grader.py, line 1)"}}"#,
                failed("the source does not compile: SyntaxError: invalid syntax (grader.py, line 1)"),
            ),
            (
                r#"{"error":{"kind":"exception","message":"MemoryError (grader.py, line 3)"}}"#,
                failed(
                    "MemoryError (grader.py, line 3); the grader's memory is limited to 256 MiB (memory_mb)",
                ),
            ),
            (r#"{"ended":24}"#, Ok(Outcome::TimedOut("the grader ran past its CPU time".to_owned()))),
            (
                r#"{"ended":31}"#,
                failed(
                    "the grader ended without a result: killed by the sandbox for a forbidden system call \
                     (SIGSYS; e.g. opening a socket)",
                ),
            ),
            (r#"{"ended":768}"#, failed("the grader exited (code 3) without returning from grade()")),
            // Anything else is not a reply.
            ("1.0", Err(())),
            (r#"{"score":"1.0"}"#, Err(())),
            (r#"{"score":1.0,"extra":1}"#, Err(())),
            (r#"{"score":1e999}"#, Err(())),
            (r#"{"score":NaN}"#, Err(())),
            (r#"{"error":{"kind":"x"}}"#, Err(())),
            ("", Err(())),
        ];
        for (line, expected) in cases {
            check(line, expected);
        }
    }
}
