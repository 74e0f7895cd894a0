//! The job API of `rlvrd serve` as the tests use it: submit, read, wait, follow the events, and
//! what the worker processes are doing.

use std::fs;
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use reqwest::blocking::Client;
use serde_json::Value;

use crate::{ADMIN_TOKEN, Daemon, TEAM_TOKEN, artifact};

/// An HTTP client (rustls needs its provider installed first).
pub fn client() -> Client {
    let _ = rustls::crypto::ring::default_provider().install_default();
    Client::builder().timeout(Duration::from_secs(30)).build().unwrap()
}

/// `POST /v1/jobs` with a TOML body: status and JSON answer.
pub fn submit(daemon: &Daemon, token: &str, toml: &str, key: Option<&str>) -> (u16, Value) {
    let mut request = client()
        .post(format!("{}/v1/jobs", daemon.url))
        .bearer_auth(token)
        .header("content-type", "application/toml")
        .body(toml.to_owned());
    if let Some(key) = key {
        request = request.header("idempotency-key", key);
    }
    let response = request.send().unwrap();
    let status = response.status().as_u16();
    (status, response.json().unwrap_or(Value::Null))
}

/// Submits as team `tests`, expecting 201; the job's id.
pub fn submit_ok(daemon: &Daemon, toml: &str) -> String {
    let (status, body) = submit(daemon, TEAM_TOKEN, toml, None);
    assert_eq!(status, 201, "{body}\n{}", daemon.log());
    body["id"].as_str().unwrap().to_owned()
}

/// `GET path` with `token`: status and JSON answer.
pub fn get(daemon: &Daemon, token: &str, path: &str) -> (u16, Value) {
    let response = client().get(format!("{}{path}", daemon.url)).bearer_auth(token).send().unwrap();
    let status = response.status().as_u16();
    (status, response.json().unwrap_or(Value::Null))
}

/// The job, as an admin sees it (any team's).
pub fn job(daemon: &Daemon, id: &str) -> Value {
    let (status, body) = get(daemon, ADMIN_TOKEN, &format!("/v1/jobs/{id}"));
    assert_eq!(status, 200, "{body}");
    body
}

/// Waits until the job satisfies `done`; panics with its record and the daemon log otherwise.
pub fn wait_job(daemon: &Daemon, id: &str, timeout: Duration, done: impl Fn(&Value) -> bool) -> Value {
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
pub fn ended(job: &Value) -> bool {
    ["published", "refused", "failed", "cancelled"].contains(&job["state"].as_str().unwrap_or(""))
}

/// The job's `state` events in order (`id`, `at`, `state`, `reason`, `step`); the stream ends
/// after the final one, so call this once the job has ended.
pub fn state_events(daemon: &Daemon, id: &str) -> Vec<Value> {
    let text = client()
        .get(format!("{}/v1/jobs/{id}/events", daemon.url))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .unwrap()
        .text()
        .unwrap();
    text.split("\n\n")
        .filter(|block| block.contains("event: state"))
        .filter_map(|block| block.lines().find_map(|line| line.strip_prefix("data: ")))
        .map(|data| serde_json::from_str::<Value>(data).unwrap())
        .collect()
}

/// The job's states in order (see [`state_events`]).
pub fn states(daemon: &Daemon, id: &str) -> Vec<String> {
    state_events(daemon, id).iter().map(|event| event["state"].as_str().unwrap().to_owned()).collect()
}

/// When an event happened, in ms since the epoch (its stream id is `<ms>-<seq>`).
pub fn event_ms(event: &Value) -> u64 {
    event["id"].as_str().and_then(|id| id.split('-').next()).and_then(|ms| ms.parse().ok()).unwrap()
}

/// Pids of the worker processes running job `id` now (their command line names the job's
/// directory).
pub fn worker_pids(id: &str) -> Vec<u32> {
    let Ok(entries) = fs::read_dir("/proc") else { return Vec::new() };
    entries
        .flatten()
        .filter_map(|entry| {
            let pid = entry.file_name().to_str()?.parse().ok()?;
            let cmdline = fs::read(entry.path().join("cmdline")).ok()?;
            let text = String::from_utf8_lossy(&cmdline);
            (text.contains("worker\0") && text.contains(&format!("/jobs/{id}/"))).then_some(pid)
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
pub fn uninterrupted_weights(daemon: &Daemon, dir: &Path, toml: &str) -> String {
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
    outcome["weights_sha256"].as_str().unwrap().to_owned()
}
