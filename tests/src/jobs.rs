//! The job API of `rlvrd serve` as the tests use it: submit, read, wait, follow the events, and
//! what the worker processes are doing. API calls go through `rlvr-client`, as `rlvrctl`'s do;
//! [`client`] is for the requests it would never send (malformed or hostile ones).

use std::fs;
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use reqwest::blocking::Client;
use rlvr_client::{ClientConfig, HttpError, Settings, SpecFormat, Token, Url, View};
use rlvr_protocol::gates::GateReport;
use rlvr_protocol::job::{ErrorBody, JobEvent, JobState, JobView};
use rlvr_protocol::worker::Outcome;
use serde::Serialize;
use serde_json::Value;

use crate::{ADMIN_TOKEN, Daemon, TEAM_TOKEN, artifact};

/// A raw HTTP client, for requests `rlvr-client` would never send: malformed bodies, wrong
/// methods, hostile headers (rustls needs its provider installed first).
pub fn client() -> Client {
    let _ = rustls::crypto::ring::default_provider().install_default();
    Client::builder().timeout(Duration::from_secs(30)).build().unwrap()
}

/// The daemon's API acting with `token` (none: anonymous), as the tests want it: every answer
/// seen as it is (no busy retries), 30 s for an answer.
pub fn api(daemon: &Daemon, token: Option<&str>) -> rlvr_client::Client {
    let server = Url::parse(&daemon.url).expect("the daemon's URL");
    let settings = Settings::new(server, token.map(|token| Token::new(token, "the tests")));
    let config =
        ClientConfig { busy_retries: 0, timeout: Duration::from_secs(30), ..ClientConfig::default() };
    rlvr_client::Client::with_config(settings, config).expect("an HTTP client")
}

/// The path segments of `/v1/jobs/ID`.
pub(crate) fn segments(path: &str) -> Vec<&str> {
    assert!(!path.contains('?'), "a path without a query: {path}");
    path.trim_start_matches('/').split('/').collect()
}

/// An answer as the tests read it: its status and JSON body. An error status comes with the
/// daemon's error body (`null` when the body was not the daemon's); no answer at all panics.
fn answer<T: Serialize>(
    daemon: &Daemon,
    result: Result<T, HttpError>,
    ok: impl Fn(&T) -> u16,
) -> (u16, Value) {
    match result {
        Ok(value) => (ok(&value), serde_json::to_value(&value).expect("JSON")),
        Err(HttpError::Status { status, error, from_daemon, .. }) => {
            let body = if from_daemon {
                serde_json::to_value(ErrorBody { error: *error }).expect("JSON")
            } else {
                Value::Null
            };
            (status.as_u16(), body)
        }
        Err(error) => panic!("{error}; daemon log:\n{}\n(again, after the log: {error})", daemon.log()),
    }
}

/// `POST /v1/jobs` with a TOML body: status and JSON answer. The client checks that a 201 says
/// `created` and a 200 does not. Data files the spec names by path are uploaded first as the
/// team's datasets, as `rlvrctl submit` does; a spec whose files cannot be uploaded is sent as it
/// is, for the daemon to refuse.
pub fn submit(daemon: &Daemon, token: &str, toml: &str, key: Option<&str>) -> (u16, Value) {
    let api = api(daemon, Some(token));
    let toml =
        api.upload_spec_data(toml, SpecFormat::Toml, Path::new("/")).unwrap_or_else(|_| toml.to_owned());
    let submitted = api.submit(&toml, SpecFormat::Toml, key);
    answer(daemon, submitted, |submitted| if submitted.created { 201 } else { 200 })
}

/// Submits as team `tests`, expecting 201; the job's id.
pub fn submit_ok(daemon: &Daemon, toml: &str) -> String {
    let (status, body) = submit(daemon, TEAM_TOKEN, toml, None);
    assert_eq!(status, 201, "{body}\n{}", daemon.log());
    body["id"].as_str().unwrap().to_owned()
}

/// `GET path` (a JSON route) with `token`: status and JSON answer.
pub fn get(daemon: &Daemon, token: &str, path: &str) -> (u16, Value) {
    // The client checks that a success is a 200.
    answer(daemon, api(daemon, Some(token)).get::<Value>(&segments(path), &[]), |_| 200)
}

/// A job as the API answered it: the typed view (its fields through `Deref`), shown as its JSON
/// in a failed assertion's message.
#[derive(Debug, Clone)]
pub struct Job(pub JobView);

impl std::ops::Deref for Job {
    type Target = JobView;

    fn deref(&self) -> &JobView {
        &self.0
    }
}

impl std::fmt::Display for Job {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&serde_json::to_string(&self.0).map_err(|_| std::fmt::Error)?)
    }
}

impl Job {
    /// How its training ended; panics, showing the job, when it has no result yet.
    pub fn outcome(&self) -> &Outcome {
        self.result.as_ref().unwrap_or_else(|| panic!("no result: {self}"))
    }

    /// The hash of the weights it trained (see [`Job::outcome`]).
    pub fn weights(&self) -> String {
        self.outcome().weights_sha256.clone()
    }

    /// Its gate report; panics, showing the job, when it has none.
    pub fn report(&self) -> &GateReport {
        self.gates.as_ref().unwrap_or_else(|| panic!("no gate report: {self}"))
    }

    /// The directory of the checkpoint it published; panics, showing the job, when it has none.
    pub fn published_dir(&self) -> &Path {
        Path::new(self.published.as_deref().unwrap_or_else(|| panic!("nothing published: {self}")))
    }
}

/// The job, as an admin sees it (any team's).
pub fn job(daemon: &Daemon, id: &str) -> Job {
    job_as(daemon, ADMIN_TOKEN, id)
}

/// The job, as `token` sees it (a team reads names where the record keeps the server's paths).
pub fn job_as(daemon: &Daemon, token: &str, id: &str) -> Job {
    Job(api(daemon, Some(token)).job(id).unwrap_or_else(|error| panic!("job {id}: {error}")))
}

/// Waits until the job satisfies `done`; panics with its record and the daemon log otherwise.
pub fn wait_job(daemon: &Daemon, id: &str, timeout: Duration, done: impl Fn(&Job) -> bool) -> Job {
    let deadline = Instant::now() + timeout;
    loop {
        let current = job(daemon, id);
        if done(&current) {
            return current;
        }
        assert!(Instant::now() < deadline, "job {id} timed out at {current}\n{}", daemon.log());
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Whether the job reached a final state.
pub fn ended(job: &Job) -> bool {
    job.state.is_terminal()
}

/// The `state` events of a followed job.
#[derive(Default)]
struct StateEvents(Vec<JobEvent>);

impl View for StateEvents {
    fn state(&mut self, event: &JobEvent, _: &str) {
        self.0.push(event.clone());
    }

    fn progress(&mut self, _: &JobView, _: &str) {}
}

/// The job's `state` events in order, read from its event stream to the final one: call this
/// once the job has ended.
pub fn state_events(daemon: &Daemon, id: &str) -> Vec<JobEvent> {
    let mut events = StateEvents::default();
    api(daemon, Some(ADMIN_TOKEN)).follow(id, &mut events).unwrap_or_else(|error| {
        panic!(
            "events of {id}: {error}; daemon log:\n{}\n(again, after the log: events of {id}: {error})",
            daemon.log()
        )
    });
    events.0
}

/// The job's states in order (see [`state_events`]).
pub fn states(daemon: &Daemon, id: &str) -> Vec<JobState> {
    state_events(daemon, id).iter().map(|event| event.state).collect()
}

/// When an event happened, in ms since the epoch (its stream id is `<ms>-<seq>`).
pub fn event_ms(event: &JobEvent) -> u64 {
    event.id.split('-').next().and_then(|ms| ms.parse().ok()).unwrap()
}

/// Pids of the worker processes running job `id` now (their command line names the job's
/// directory).
pub fn worker_pids(id: &str) -> Vec<u32> {
    workers().into_iter().filter(|(_, job)| job == id).map(|(pid, _)| pid).collect()
}

/// The worker processes of the daemon whose state directory is `state` (as its config names it),
/// with their jobs' ids: never another test's.
pub fn workers_of_daemon(state: &Path) -> Vec<(u32, String)> {
    let jobs = format!("{}/jobs/", state.display());
    workers_where(|cmdline| cmdline.contains(&jobs))
}

/// Every worker process running a job now, with its job's id (from its command line, which names
/// the job's directory `…/jobs/ID/…`).
pub fn workers() -> Vec<(u32, String)> {
    workers_where(|_| true)
}

fn workers_where(keep: impl Fn(&str) -> bool) -> Vec<(u32, String)> {
    let Ok(entries) = fs::read_dir("/proc") else { return Vec::new() };
    entries
        .flatten()
        .filter_map(|entry| {
            let pid = entry.file_name().to_str()?.parse().ok()?;
            let cmdline = fs::read(entry.path().join("cmdline")).ok()?;
            let text = String::from_utf8_lossy(&cmdline);
            if !text.contains("worker\0") || !keep(&text) {
                return None;
            }
            let (_, after) = text.split_once("/jobs/")?;
            let id = after.split(['/', '\0']).next()?;
            Some((pid, id.to_owned()))
        })
        .collect()
}

/// The threads of process `pid` that would run a handler of `signal` (its bit not in their
/// blocked set, `SigBlk` of `/proc/PID/task/TID/status`), by name (`comm`).
pub fn threads_taking(pid: u32, signal: nix::sys::signal::Signal) -> Vec<String> {
    let bit = 1u64 << (signal as i32 - 1);
    let Ok(tasks) = fs::read_dir(format!("/proc/{pid}/task")) else { return Vec::new() };
    tasks
        .flatten()
        .filter_map(|task| {
            let status = fs::read_to_string(task.path().join("status")).ok()?;
            let blocked = status.lines().find_map(|line| line.strip_prefix("SigBlk:"))?;
            let blocked = u64::from_str_radix(blocked.trim(), 16).ok()?;
            let name = fs::read_to_string(task.path().join("comm")).unwrap_or_default();
            (blocked & bit == 0).then(|| name.trim().to_owned())
        })
        .collect()
}

/// How many workers run job `id` now.
pub fn workers_of(id: &str) -> usize {
    worker_pids(id).len()
}

/// Counts, in the background, the most workers seen at once for a job.
pub struct WorkerWatch {
    stop: Arc<AtomicBool>,
    most: Arc<AtomicUsize>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl WorkerWatch {
    pub fn start(id: &str) -> Self {
        let (stop, most) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicUsize::new(0)));
        let (s, m, id) = (stop.clone(), most.clone(), id.to_owned());
        let thread = std::thread::spawn(move || {
            while !s.load(Ordering::SeqCst) {
                m.fetch_max(workers_of(&id), Ordering::SeqCst);
                std::thread::sleep(Duration::from_millis(20));
            }
        });
        WorkerWatch { stop, most, thread: Some(thread) }
    }

    pub fn most(mut self) -> usize {
        self.stop.store(true, Ordering::SeqCst);
        let _ = self.thread.take().map(std::thread::JoinHandle::join);
        self.most.load(Ordering::SeqCst)
    }
}

/// The weights hash of the same spec run by a standalone worker, uninterrupted.
///
/// Computed once per spec and build: the answer is kept in `target/test-reference-runs/` under a
/// key of everything the run depends on (the spec, the content of every file it names, the
/// worker's build, the plugin libraries' bytes, the environment), so the stories that resume the
/// same spec compare with one reference run, and a later run over the same build (a kept target
/// directory) reuses it. The run is deterministic (one libtorch thread), and any change to an
/// input is a new key, so a kept answer is the answer a fresh run would give.
pub fn uninterrupted_weights(daemon: &Daemon, dir: &Path, toml: &str) -> String {
    let kept = crate::target_dir().join("test-reference-runs").join(reference_key(daemon, toml));
    if let Ok(weights) = fs::read_to_string(&kept) {
        return weights;
    }
    let spec = dir.join("uninterrupted.toml");
    fs::write(&spec, toml).unwrap();
    let output = Command::new(artifact("rlvr-worker"))
        .args(["run", "--threads", "1", "--spec"])
        .arg(&spec)
        .arg("--state-dir")
        .arg(dir.join("uninterrupted"))
        .arg("--plugin-dir")
        .arg(&daemon.plugins)
        .env("RLVR_LOG", "warn")
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let outcome: Value = serde_json::from_slice(&output.stdout).unwrap();
    let weights = outcome["weights_sha256"].as_str().unwrap().to_owned();
    // Written whole (a temp file renamed): two tests computing the same key at once both write
    // the same answer, and a reader never sees half of one.
    let parent = kept.parent().expect("a key has a directory");
    fs::create_dir_all(parent).unwrap();
    let partial = tempfile::NamedTempFile::new_in(parent).unwrap();
    fs::write(partial.path(), &weights).unwrap();
    partial.persist(&kept).unwrap();
    weights
}

/// The key of an uninterrupted run of `toml`: the spec with each quoted string that names a
/// file replaced by the file's sha256 (the same data written in another test's temp dir is the
/// same input), the worker binary's size and modification time (cargo rewrites it on every
/// build), the bytes of the plugin libraries it loads, and the environment that steers its
/// arithmetic (`RLVR_*`, `MKL_*`, `OMP_*`).
fn reference_key(daemon: &Daemon, toml: &str) -> String {
    use sha2::Digest;
    let mut key = sha2::Sha256::new();
    for (i, part) in toml.split('"').enumerate() {
        let path = Path::new(part);
        if i % 2 == 1 && path.is_absolute() && path.is_file() {
            key.update(sha2::Sha256::digest(fs::read(path).unwrap()));
        } else {
            key.update(part.as_bytes());
        }
        key.update(b"\"");
    }
    let worker = fs::metadata(artifact("rlvr-worker")).unwrap();
    let built = worker.modified().unwrap().duration_since(std::time::UNIX_EPOCH).unwrap();
    key.update(format!("worker {} {}\n", worker.len(), built.as_nanos()));
    let mut libraries: Vec<_> =
        fs::read_dir(&daemon.plugins).unwrap().map(|entry| entry.unwrap().path()).collect();
    libraries.sort();
    for library in libraries {
        key.update(library.file_name().unwrap().as_encoded_bytes());
        key.update(sha2::Sha256::digest(fs::read(&library).unwrap()));
    }
    let mut environment: Vec<_> = std::env::vars()
        .filter(|(name, _)| ["RLVR_", "MKL_", "OMP_"].iter().any(|prefix| name.starts_with(prefix)))
        .collect();
    environment.sort();
    key.update(format!("{environment:?}"));
    hex::encode(key.finalize())
}
