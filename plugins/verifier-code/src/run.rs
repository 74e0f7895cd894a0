//! One item's run: the solution in fresh sandboxes, the tests on the trusted side, and the
//! relay between them with every read and write bounded by the test's deadline.

use std::os::fd::OwnedFd;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde::Deserialize;
use serde_json::{Value, json};

use crate::fdio::{self, LineReader, PipeError};
use crate::reference::IoCase;
use crate::sandbox::{Sandbox, Spawned, Stream, Termination};

/// The child-side program (untrusted once the solution runs beside it).
pub const RUNNER: &str = include_str!("runner.py");
/// The trusted evaluator of asserts.
pub const EVALUATOR: &str = include_str!("evaluator.py");

/// Interpreter flags: no site module (fast start, no site-packages), no user site, no bytecode.
pub const PYTHON_FLAGS: [&str; 3] = ["-S", "-s", "-B"];

/// How long to wait for the solution's status once its pipes closed by themselves.
const STATUS_GRACE: Duration = Duration::from_millis(500);
/// Longest line the evaluator may send us (its requests carry the tests' arguments).
const EVALUATOR_LINE_LIMIT: usize = 64 * 1024 * 1024;
/// Stderr kept from an io test, for the explanation.
const STDERR_KEEP: usize = 2048;

/// Knobs of one run, from the config and the reference.
#[derive(Debug, Clone, Copy)]
pub struct RunLimits {
    /// Time for each test (for asserts, also for loading the solution).
    pub per_test: Duration,
    /// Time for the whole item; tests past it count as timed out.
    pub budget: Duration,
    /// Largest reply from the solution (one value), bytes.
    pub max_reply_bytes: usize,
    /// Largest stdout of an io test, bytes.
    pub max_output_bytes: usize,
}

/// What a run found, before it becomes a verdict.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Outcome {
    /// Tests passed.
    pub passed: usize,
    /// Tests in all.
    pub total: usize,
    /// A test ran out of time (or CPU).
    pub timed_out: bool,
    /// The sandbox stopped a forbidden system call (seccomp killed the solution).
    pub unsafe_: bool,
    /// Explanation lines (only when asked).
    pub lines: Vec<String>,
}

/// Why a run could not be judged.
#[derive(Debug)]
pub enum RunError {
    /// The item's own budget ran out on the trusted side (a slow evaluator or tests).
    Budget(String),
    /// Something of ours failed: spawning, the evaluator, a pipe.
    Internal(String),
}

/// How stdout is compared with the expected one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum IoCompare {
    /// Byte for byte.
    Exact,
    /// Line by line, ignoring trailing whitespace on each line and trailing empty lines.
    Lines,
    /// Whitespace-separated tokens.
    Tokens,
}

impl IoCompare {
    /// Whether `got` matches `expected`.
    pub fn matches(self, got: &[u8], expected: &str) -> bool {
        let got = String::from_utf8_lossy(got);
        match self {
            IoCompare::Exact => got == expected,
            IoCompare::Lines => {
                let lines = |text: &str| {
                    let mut lines: Vec<String> =
                        text.lines().map(|line| line.trim_end().to_owned()).collect();
                    while lines.last().is_some_and(String::is_empty) {
                        lines.pop();
                    }
                    lines
                };
                lines(&got) == lines(expected)
            }
            IoCompare::Tokens => got.split_whitespace().eq(expected.split_whitespace()),
        }
    }
}

/// A warm evaluator process: trusted Python that holds the tests of one run at a time.
#[derive(Debug)]
pub struct Evaluator {
    child: Child,
    input: OwnedFd,
    output: LineReader,
}

impl Evaluator {
    fn spawn(python: &Path, workdir: &Path, address_space: u64) -> std::io::Result<Evaluator> {
        let (in_read, in_write) = fdio::pipe()?;
        let (out_read, out_write) = fdio::pipe()?;
        let mut command = Command::new(python);
        command
            .args(PYTHON_FLAGS)
            .arg("-c")
            .arg(EVALUATOR)
            .env_clear()
            .env("PYTHONHASHSEED", "0")
            .env("PYTHONIOENCODING", "utf-8")
            .env("LANG", "C.UTF-8")
            .current_dir(workdir)
            .stdin(Stdio::from(in_read))
            .stdout(Stdio::from(out_write))
            .stderr(Stdio::null());
        let limit = libc::rlimit { rlim_cur: address_space, rlim_max: address_space };
        // SAFETY: setrlimit is async-signal-safe and touches only the forked child. Past the
        // limit the evaluator gets MemoryError (the test fails) or dies (see `run_asserts`).
        unsafe {
            command.pre_exec(move || {
                if libc::setrlimit(libc::RLIMIT_AS, &limit) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = command.spawn()?;
        fdio::set_nonblocking(&in_write)?;
        Ok(Evaluator { child, input: in_write, output: LineReader::new(out_read)? })
    }

    fn send(&mut self, line: &[u8], deadline: Instant) -> Result<(), PipeError> {
        fdio::write_all_until(&self.input, line, deadline)
    }

    fn recv(&mut self, deadline: Instant) -> Result<Vec<u8>, PipeError> {
        self.output.read_line(deadline, EVALUATOR_LINE_LIMIT)
    }

    /// How it ended, once its pipes closed (waits a little for the status).
    fn ended(&mut self) -> String {
        let until = Instant::now() + STATUS_GRACE;
        loop {
            match self.child.try_wait() {
                Ok(Some(status)) => return status.to_string(),
                Ok(None) if Instant::now() < until => std::thread::sleep(Duration::from_millis(5)),
                Ok(None) => return "closed its pipes".to_owned(),
                Err(error) => return error.to_string(),
            }
        }
    }

    /// Its address space now, bytes (0 when unknown).
    fn address_space(&self) -> u64 {
        std::fs::read_to_string(format!("/proc/{}/statm", self.child.id()))
            .ok()
            .and_then(|statm| statm.split_whitespace().next()?.parse::<u64>().ok())
            .map_or(0, |pages| {
                // SAFETY: sysconf has no preconditions.
                let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
                pages.saturating_mul(u64::try_from(page).unwrap_or(4096))
            })
    }
}

impl Drop for Evaluator {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Idle evaluators, reused across runs so that a run spawns only its sandboxed child.
#[derive(Debug)]
pub struct EvaluatorPool {
    idle: Mutex<Vec<Evaluator>>,
    /// `RLIMIT_AS` of each evaluator, bytes.
    address_space: u64,
}

impl EvaluatorPool {
    /// An empty pool whose evaluators get `address_space` bytes (`RLIMIT_AS`).
    pub fn new(address_space: u64) -> Self {
        EvaluatorPool { idle: Mutex::default(), address_space }
    }

    fn take(&self, python: &Path, workdir: &Path) -> Result<Evaluator, RunError> {
        let idle = self.idle.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).pop();
        match idle {
            Some(evaluator) => Ok(evaluator),
            None => Evaluator::spawn(python, workdir, self.address_space)
                .map_err(|error| RunError::Internal(format!("cannot start the evaluator: {error}"))),
        }
    }

    /// Keeps `evaluator` for the next run, unless a run left it holding over half its limit
    /// (a test kept large values): then it ends and the next run starts a fresh one.
    fn give_back(&self, evaluator: Evaluator) {
        if evaluator.address_space() > self.address_space / 2 {
            return;
        }
        self.idle.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).push(evaluator);
    }

    /// Starts `count` evaluators ahead of the first run.
    pub fn warm(&self, python: &Path, workdir: &Path, count: usize) {
        for _ in 0..count {
            if let Ok(evaluator) = Evaluator::spawn(python, workdir, self.address_space) {
                self.give_back(evaluator);
            }
        }
    }
}

/// One evaluator result line.
#[derive(Debug, Deserialize)]
struct TestResult {
    passed: bool,
    #[serde(default)]
    detail: String,
}

/// A run's fixed context.
pub struct Runner<'a> {
    /// The sandbox to spawn children in.
    pub sandbox: &'a Sandbox,
    /// Where throw-away directories go.
    pub work_root: &'a Path,
    /// Warm evaluators.
    pub pool: &'a EvaluatorPool,
    /// Time and size limits.
    pub limits: RunLimits,
    /// Build explanation lines.
    pub explain: bool,
}

fn internal(what: &str) -> impl Fn(std::io::Error) -> RunError + '_ {
    move |error| RunError::Internal(format!("{what}: {error}"))
}

fn excerpt(bytes: &[u8], limit: usize) -> String {
    let text = String::from_utf8_lossy(&bytes[..bytes.len().min(limit)]).into_owned();
    let mut text = format!("{text:?}");
    if bytes.len() > limit {
        text.push_str(&format!(" (first {limit} of {} bytes)", bytes.len()));
    }
    text
}

impl Runner<'_> {
    fn workdir(&self) -> Result<tempfile::TempDir, RunError> {
        tempfile::Builder::new()
            .prefix("rlvr-code-")
            .tempdir_in(self.work_root)
            .map_err(internal("cannot create a work directory"))
    }

    fn spawn(
        &self,
        workdir: &Path,
        stdin: Stream,
        stdout: Stream,
        stderr: Stream,
        extra: [Option<OwnedFd>; 2],
    ) -> Result<Spawned, RunError> {
        let args = [PYTHON_FLAGS[0], PYTHON_FLAGS[1], PYTHON_FLAGS[2], "-c", RUNNER];
        self.sandbox
            .spawn(workdir, &args, stdin, stdout, stderr, extra)
            .map_err(internal("cannot start the sandbox"))
    }

    /// Asserts: one sandboxed child answers calls; the evaluator runs the tests.
    pub fn run_asserts(&self, code: &str, setup: &str, tests: &[String]) -> Result<Outcome, RunError> {
        let started = Instant::now();
        let budget_end = started + self.limits.budget;
        let per_test = |now: Instant| (now + self.limits.per_test).min(budget_end);
        let mut outcome = Outcome { total: tests.len(), ..Outcome::default() };
        let workdir = self.workdir()?;
        let (request_read, request_write) = fdio::pipe().map_err(internal("pipe"))?;
        let (reply_read, reply_write) = fdio::pipe().map_err(internal("pipe"))?;
        let mut child = self.spawn(
            workdir.path(),
            Stream::Null,
            Stream::Null,
            Stream::Null,
            [Some(request_read), Some(reply_write)],
        )?;
        fdio::set_nonblocking(&request_write).map_err(internal("pipe"))?;
        let mut replies = LineReader::new(reply_read).map_err(internal("pipe"))?;

        // Load the solution.
        let deadline = per_test(Instant::now());
        let hello = format!("asserts {}\n{code}", code.len());
        let loaded = fdio::write_all_until(&request_write, hello.as_bytes(), deadline)
            .and_then(|()| replies.read_line(deadline, self.limits.max_reply_bytes));
        let mut gone: Option<String> = None;
        match loaded {
            Ok(line) => match serde_json::from_slice::<Value>(&line) {
                Ok(reply) if reply.get("ok").is_some() => {}
                Ok(reply) => {
                    let raised = reply.get("raise").map_or_else(|| reply.to_string(), Value::to_string);
                    gone = Some(format!("solution failed to load: {raised}"));
                }
                Err(_) => gone = Some("solution sent a malformed reply while loading".to_owned()),
            },
            Err(PipeError::Timeout) => {
                outcome.timed_out = true;
                gone = Some("solution did not load within the time limit".to_owned());
            }
            Err(error) => gone = Some(format!("solution ended while loading ({error})")),
        }
        if let Some(why) = gone {
            let termination =
                child.finish(STATUS_GRACE.min(budget_end.saturating_duration_since(Instant::now())));
            self.note_termination(&mut outcome, termination);
            if self.explain {
                outcome.lines.push(why);
                outcome.lines.push(format!("0 of {} tests passed", tests.len()));
            }
            return Ok(outcome);
        }

        // Run the tests. Until the solution has answered a call, the evaluator runs trusted code
        // only and has the item's budget (running past it is our error). From then on it may be
        // working on the solution's values (decoding a reply, hashing it into a set), so each
        // test's deadline binds it too, and running past that is the solution's timeout.
        let mut evaluator = self.pool.take(&self.sandbox.python, self.work_root)?;
        let job = json!({"setup": setup, "tests": tests, "explain": self.explain}).to_string() + "\n";
        let budget_error = || {
            RunError::Budget(format!(
                "the tests did not finish within the run budget of {} ms",
                self.limits.budget.as_millis()
            ))
        };
        evaluator.send(job.as_bytes(), budget_end).map_err(|error| match error {
            PipeError::Timeout => budget_error(),
            other => RunError::Internal(format!("evaluator: {other}")),
        })?;
        let mut deadline = per_test(Instant::now());
        let mut gone: Option<String> = None;
        let mut ended_by_itself = false;
        let mut solution_answered = false;
        let mut results: Vec<TestResult> = Vec::with_capacity(tests.len());
        // Why the evaluator was stopped before it finished, when it was.
        let mut stopped: Option<String> = None;
        loop {
            let evaluator_deadline = if solution_answered { deadline } else { budget_end };
            let line = match evaluator.recv(evaluator_deadline) {
                Ok(line) => line,
                Err(error) => {
                    stopped = Some(self.evaluator_failed(&mut evaluator, error, solution_answered)?);
                    break;
                }
            };
            let message: Value = serde_json::from_slice(&line)
                .map_err(|error| RunError::Internal(format!("evaluator sent invalid JSON: {error}")))?;
            if message.get("begin").is_some() {
                deadline = per_test(Instant::now());
                continue;
            }
            if let Some(end) = message.get("end") {
                let result = TestResult::deserialize(end)
                    .map_err(|error| RunError::Internal(format!("evaluator sent a bad result: {error}")))?;
                results.push(result);
                continue;
            }
            if let Some(op) = message.get("call") {
                let op = op.as_str().ok_or_else(|| {
                    RunError::Internal(format!("evaluator sent a call that is not a string: {op}"))
                })?;
                let answer = match &gone {
                    Some(why) => (json!({"gone": why}).to_string() + "\n").into_bytes(),
                    None => {
                        let request = op.to_owned() + "\n";
                        let reply = fdio::write_all_until(&request_write, request.as_bytes(), deadline)
                            .and_then(|()| replies.read_line(deadline, self.limits.max_reply_bytes));
                        match reply {
                            Ok(reply) if serde_json::from_slice::<serde::de::IgnoredAny>(&reply).is_ok() => {
                                solution_answered = true;
                                let mut answer = b"{\"reply\":".to_vec();
                                answer.extend_from_slice(&reply);
                                answer.extend_from_slice(b"}\n");
                                answer
                            }
                            failure => {
                                let why = match failure {
                                    Ok(_) => "sent a malformed reply".to_owned(),
                                    Err(PipeError::Timeout) => {
                                        outcome.timed_out = true;
                                        child.kill();
                                        "timed out".to_owned()
                                    }
                                    Err(PipeError::Closed) => {
                                        ended_by_itself = true;
                                        "ended".to_owned()
                                    }
                                    Err(PipeError::TooLong) => {
                                        format!("sent a reply over {} bytes", self.limits.max_reply_bytes)
                                    }
                                    Err(PipeError::Io(error)) => format!("failed: {error}"),
                                };
                                let answer = (json!({"gone": why}).to_string() + "\n").into_bytes();
                                gone = Some(why);
                                answer
                            }
                        }
                    }
                };
                let evaluator_deadline = if solution_answered { deadline } else { budget_end };
                if let Err(error) = evaluator.send(&answer, evaluator_deadline) {
                    stopped = Some(self.evaluator_failed(&mut evaluator, error, solution_answered)?);
                    break;
                }
                continue;
            }
            if message.get("done").is_some() {
                break;
            }
            return Err(RunError::Internal(format!("evaluator sent an unknown message: {message}")));
        }
        match &stopped {
            // Killed (dropped) rather than reused: it may still be busy, or it is gone.
            Some(why) => {
                drop(evaluator);
                if why.starts_with("timed out") {
                    outcome.timed_out = true;
                    child.kill();
                }
                while results.len() < tests.len() {
                    results.push(TestResult { passed: false, detail: why.clone() });
                }
            }
            None => self.pool.give_back(evaluator),
        }
        drop(request_write);
        let grace = if ended_by_itself { STATUS_GRACE } else { Duration::ZERO };
        let termination = child.finish(grace);
        self.note_termination(&mut outcome, termination);
        outcome.passed = results.iter().filter(|result| result.passed).count();
        if results.len() != tests.len() {
            return Err(RunError::Internal(format!(
                "evaluator returned {} results for {} tests",
                results.len(),
                tests.len()
            )));
        }
        if self.explain {
            for (index, (result, test)) in results.iter().zip(tests).enumerate() {
                let verdict = if result.passed { "passed" } else { "failed" };
                let detail =
                    if result.detail.is_empty() { String::new() } else { format!(" ({})", result.detail) };
                outcome.lines.push(format!("test {} {verdict}: {}{detail}", index + 1, test.trim()));
            }
        }
        Ok(outcome)
    }

    /// Io: one sandboxed child per test, stdin in, stdout compared here.
    pub fn run_io(&self, code: &str, cases: &[IoCase], compare: IoCompare) -> Result<Outcome, RunError> {
        let started = Instant::now();
        let budget_end = started + self.limits.budget;
        let mut outcome = Outcome { total: cases.len(), ..Outcome::default() };
        let hello = format!("io {}\n{code}", code.len());
        for (index, case) in cases.iter().enumerate() {
            let number = index + 1;
            let now = Instant::now();
            if now >= budget_end {
                outcome.timed_out = true;
                if self.explain {
                    outcome
                        .lines
                        .push(format!("test {number} failed: not run, the item's time budget ran out"));
                }
                continue;
            }
            let deadline = (now + self.limits.per_test).min(budget_end);
            let result = self.run_io_case(&hello, case, deadline)?;
            self.note_termination(&mut outcome, result.termination);
            let timed_out = result.timed_out || result.termination.cpu_limit();
            outcome.timed_out |= timed_out;
            let passed = !timed_out
                && !result.termination.seccomp_violation()
                && !result.over_limit
                && compare.matches(&result.stdout, &case.stdout);
            outcome.passed += usize::from(passed);
            if self.explain {
                let line = if passed {
                    format!("test {number} passed")
                } else if timed_out {
                    format!("test {number} failed: timed out")
                } else if result.over_limit {
                    format!("test {number} failed: printed over {} bytes", self.limits.max_output_bytes)
                } else {
                    let mut line = format!(
                        "test {number} failed: stdin {}, expected {}, got {}",
                        excerpt(case.stdin.as_bytes(), 200),
                        excerpt(case.stdout.as_bytes(), 200),
                        excerpt(&result.stdout, 200)
                    );
                    if !result.stderr.is_empty() {
                        line.push_str(&format!("; stderr {}", excerpt(&result.stderr, 500)));
                    }
                    line
                };
                outcome.lines.push(line);
            }
        }
        Ok(outcome)
    }

    fn run_io_case(&self, hello: &str, case: &IoCase, deadline: Instant) -> Result<IoResult, RunError> {
        let workdir = self.workdir()?;
        let pipe = || fdio::pipe().map_err(internal("pipe"));
        let (stdin_read, stdin_write) = pipe()?;
        let (stdout_read, stdout_write) = pipe()?;
        let (stderr_read, stderr_write) = pipe()?;
        let (request_read, request_write) = pipe()?;
        let mut child = self.spawn(
            workdir.path(),
            Stream::Pipe(stdin_read),
            Stream::Pipe(stdout_write),
            Stream::Pipe(stderr_write),
            [Some(request_read), None],
        )?;
        for fd in [&stdin_write, &stdout_read, &stderr_read, &request_write] {
            fdio::set_nonblocking(fd).map_err(internal("pipe"))?;
        }
        let mut result = IoResult::default();
        if fdio::write_all_until(&request_write, hello.as_bytes(), deadline).is_err() {
            result.timed_out = Instant::now() >= deadline;
        }
        drop(request_write);
        let mut stdin = Some((stdin_write, case.stdin.as_bytes()));
        let mut stdout = Some(stdout_read);
        let mut stderr = Some(stderr_read);
        let mut chunk = vec![0u8; 64 * 1024];
        while stdout.is_some() || stderr.is_some() {
            if result.timed_out {
                break;
            }
            // Stdin first, as far as the pipe takes it; closed when done so the solution sees EOF.
            if let Some((fd, data)) = &mut stdin {
                match fdio::write_some(fd, data) {
                    Ok(written) => *data = &data[written..],
                    Err(error) if error.kind() == std::io::ErrorKind::WouldBlock => {}
                    Err(_) => *data = &[],
                }
                if data.is_empty() {
                    stdin = None;
                }
            }
            let mut polls = Vec::new();
            for (fd, events) in [
                (stdout.as_ref(), libc::POLLIN),
                (stderr.as_ref(), libc::POLLIN),
                (stdin.as_ref().map(|(fd, _)| fd), libc::POLLOUT),
            ] {
                if let Some(fd) = fd {
                    polls.push(libc::pollfd { fd: std::os::fd::AsRawFd::as_raw_fd(fd), events, revents: 0 });
                }
            }
            let millis = deadline.saturating_duration_since(Instant::now()).as_millis().min(i32::MAX as u128);
            // SAFETY: `polls` holds valid pollfds for its length.
            let ready = unsafe { libc::poll(polls.as_mut_ptr(), polls.len() as libc::nfds_t, millis as i32) };
            if ready == 0 && Instant::now() >= deadline {
                result.timed_out = true;
                break;
            }
            for (stream, keep, is_stdout) in
                [(&mut stdout, usize::MAX, true), (&mut stderr, STDERR_KEEP, false)]
            {
                let Some(fd) = stream.as_ref() else { continue };
                match fdio::read_some(fd, &mut chunk) {
                    Ok(0) => *stream = None,
                    Ok(read) => {
                        let buffer = if is_stdout { &mut result.stdout } else { &mut result.stderr };
                        let room = keep.min(self.limits.max_output_bytes + 1).saturating_sub(buffer.len());
                        buffer.extend_from_slice(&chunk[..read.min(room)]);
                        if is_stdout && buffer.len() > self.limits.max_output_bytes {
                            result.over_limit = true;
                        }
                    }
                    Err(error)
                        if matches!(
                            error.kind(),
                            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::Interrupted
                        ) => {}
                    Err(_) => *stream = None,
                }
            }
            if result.over_limit {
                break;
            }
        }
        let finished_by_itself = stdout.is_none() && stderr.is_none() && !result.timed_out;
        if !finished_by_itself {
            child.kill();
        }
        let grace = if finished_by_itself {
            deadline.saturating_duration_since(Instant::now()) + Duration::from_millis(100)
        } else {
            Duration::ZERO
        };
        result.termination = child.finish(grace);
        if finished_by_itself && result.termination == Termination::Killed {
            // It closed its output but kept running until the deadline.
            result.timed_out = true;
        }
        Ok(result)
    }

    /// The evaluator ran past a deadline or ended. Once the solution has answered a call this
    /// is laid to the solution's values (the reason its remaining tests fail); before, it is ours.
    fn evaluator_failed(
        &self,
        evaluator: &mut Evaluator,
        error: PipeError,
        solution_answered: bool,
    ) -> Result<String, RunError> {
        match (error, solution_answered) {
            (PipeError::Timeout, true) => {
                Ok("timed out: the tests ran past the time limit on the solution's values".to_owned())
            }
            (PipeError::Timeout, false) => Err(RunError::Budget(format!(
                "the tests did not finish within the run budget of {} ms",
                self.limits.budget.as_millis()
            ))),
            (error, answered) => {
                let why = format!(
                    "the evaluator ended ({}; {error}) with its memory limited to {} MiB",
                    evaluator.ended(),
                    self.pool.address_space >> 20
                );
                if answered {
                    Ok(format!("{why}, on the solution's values"))
                } else {
                    Err(RunError::Internal(why))
                }
            }
        }
    }

    fn note_termination(&self, outcome: &mut Outcome, termination: Termination) {
        if termination.seccomp_violation() {
            outcome.unsafe_ = true;
            if self.explain {
                outcome.lines.push("the sandbox killed the solution for a forbidden system call".to_owned());
            }
        }
        if termination.cpu_limit() {
            outcome.timed_out = true;
        }
    }
}

/// One io test's raw result.
#[derive(Debug, Default)]
struct IoResult {
    stdout: Vec<u8>,
    stderr: Vec<u8>,
    over_limit: bool,
    timed_out: bool,
    termination: Termination,
}
