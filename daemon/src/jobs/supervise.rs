//! One job's run on this daemon, from its dispatch task to an end or a requeue.
//!
//! The rules that make a job, once accepted, run to an end whatever happens:
//! - **Only the current task runs a job.** Every (re)queue records a new dispatch task id in the
//!   job first; a task whose id is not the record's is stale (a duplicate after a crash) and is
//!   dropped. A job is also supervised at most once per daemon, and its worker holds the run's
//!   `flock`, so no job ever runs twice at the same time.
//! - **One retry policy, ours.** The backend never retries (its task always completes). A worker
//!   that dies (signal, panic) counts a crash and the job is requeued with a new task; at
//!   `queue.max_crashes` it is dead-lettered (`failed`). A job found `running` when its task
//!   comes back was running on a daemon that died: that counts too.
//! - **Nothing is lost to Redis being away.** Every write of an outcome is retried with backoff
//!   until Redis takes it ([`Supervisor::persist`]).
//! - **SIGTERM** (daemon stopping): the worker is asked to checkpoint at its next step boundary
//!   and exits 75; the job goes `preempted → queued` with a new task, and resumes exactly.
//!   Cancel: the worker is killed at once (its last checkpoint stays intact) and the job ends
//!   `cancelled`.

use std::collections::{BTreeSet, HashMap};
use std::io::{BufRead, Seek};
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rlvr_queue::dispatch::new_task_id;
use rlvr_queue::job::{JobState, JobView};
use rlvr_queue::spec::{JobSpec, Priority};
use rlvr_queue::store::StoreError;
use serde_json::{Value, json};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, info, info_span, warn};

use super::Queues;
use super::gate::{self, Verdict};
use crate::worker::lifecycle::EXIT_INTERRUPTED;

/// How often a running job's worker, cancel flag and metrics are looked at.
const WATCH_INTERVAL: Duration = Duration::from_millis(200);
/// Exit status of a worker that refused its job (spec, plugins, data, model): not a crash.
const EXIT_JOB_ERROR: i32 = 2;

/// What the daemon's supervisors share.
pub struct Supervisor {
    pub queues: Queues,
    /// `rlvrd`, started as `rlvrd worker` for each job.
    pub exe: PathBuf,
    /// `<state_dir>/jobs`: one directory per job (spec, run state, worker log).
    pub jobs_dir: PathBuf,
    /// Where gated checkpoints go when a job names no `[publish] registry`.
    pub default_registry: PathBuf,
    pub plugin_dirs: Vec<PathBuf>,
    pub worker_threads: usize,
    pub max_crashes: u32,
    pub stop_timeout: Duration,
    /// Cancelled on SIGTERM: workers checkpoint and jobs are requeued.
    pub stopping: CancellationToken,
    pub slots: Slots,
    /// Jobs supervised by this daemon now; the flag turns true when the supervision ends.
    active: Mutex<HashMap<String, tokio::sync::watch::Receiver<bool>>>,
}

/// Why a worker process ended, as the supervisor sees it.
#[derive(Debug, Clone, PartialEq)]
pub enum WorkerEnd {
    /// Trained to its end; the worker's outcome JSON.
    Finished(Value),
    /// Checkpointed and stopped on request.
    Interrupted,
    /// Killed because its job was cancelled.
    Cancelled,
    /// Refused its job (exit 2): the reason, from its log.
    JobError(String),
    /// Died: signal, panic, anything else.
    Crashed(String),
}

impl Supervisor {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        queues: Queues,
        exe: PathBuf,
        state_dir: &Path,
        plugin_dirs: Vec<PathBuf>,
        worker_threads: usize,
        max_crashes: u32,
        stop_timeout: Duration,
        slots: usize,
        stopping: CancellationToken,
    ) -> Self {
        Supervisor {
            queues,
            exe,
            jobs_dir: state_dir.join("jobs"),
            default_registry: state_dir.join("registry"),
            plugin_dirs,
            worker_threads,
            max_crashes,
            stop_timeout,
            stopping,
            slots: Slots::new(slots),
            active: Mutex::new(HashMap::new()),
        }
    }

    /// Jobs this daemon runs at once.
    pub fn slots_total(&self) -> usize {
        self.slots.total
    }

    /// Handles dispatch task `task_id` of job `id` to the end of this daemon's part in it. Never
    /// fails: every outcome is written to the job record.
    pub async fn handle(self: &Arc<Self>, id: String, task_id: String) {
        let (done, running_already) = {
            let mut active = self.active.lock().unwrap_or_else(|p| p.into_inner());
            match active.get(&id) {
                Some(running) => (None, Some(running.clone())),
                None => {
                    let (sender, receiver) = tokio::sync::watch::channel(false);
                    active.insert(id.clone(), receiver);
                    (Some(sender), None)
                }
            }
        };
        if let Some(mut running) = running_already {
            // The same job's task again (redelivered after the backend's worker was rebuilt):
            // hold it until the supervision under way ends, so its lease covers the job.
            info!(job = %id, task = %task_id, "job is supervised here already; holding this task until it ends");
            let _ = running.wait_for(|ended| *ended).await;
            return;
        }
        let span = info_span!("job", id = %id);
        self.handle_inner(&id, &task_id).instrument(span).await;
        self.active.lock().unwrap_or_else(|p| p.into_inner()).remove(&id);
        if let Some(done) = done {
            let _ = done.send(true);
        }
    }

    async fn handle_inner(&self, id: &str, task_id: &str) {
        let Some(job) = self.persist("read the job", || self.queues.store.get(id)).await else { return };
        let current = self.persist("read the task id", || self.queues.store.task_id(id)).await.flatten();
        if current.as_deref() != Some(task_id) {
            info!(task = %task_id, current = ?current, "stale dispatch task; the job has a newer one");
            return;
        }
        if job.state.is_terminal() {
            return;
        }
        let Some(spec) = self.persist("read the spec", || self.queues.store.spec(id)).await else { return };
        let priority = spec.job.priority;

        if job.state.is_active() {
            // Its task came back while the record says a daemon holds it: that daemon died.
            if job.state == JobState::Evaluating && job.result.is_some() {
                self.finish(id, &spec, job.result.clone().unwrap_or_default()).await;
                return;
            }
            let reason = format!("the daemon running it stopped ({} at step {})", job.state, job.step);
            if self.count_crash_or_dead_letter(id, &reason).await {
                return;
            }
            if self.transition(id, JobState::Queued, &format!("requeued: {reason}"), &[]).await.is_none() {
                return;
            }
        } else if job.state == JobState::Preempted
            && self.transition(id, JobState::Queued, "requeued after preemption", &[]).await.is_none()
        {
            return;
        }

        // Admission: a slot, most urgent and oldest first.
        let created = job.created_at.clone();
        let slot = tokio::select! {
            slot = self.slots.acquire(priority, &created, id) => slot,
            _ = self.stopping.cancelled() => {
                self.slots.forget(priority, &created, id);
                // Leave it queued under a new task for the next daemon: this one is stopping.
                self.requeue(id, priority, None, "the daemon stopped before admitting it").await;
                return;
            }
        };
        if self.transition(id, JobState::Admitted, "admitted to a device slot", &[]).await.is_none() {
            drop(slot);
            return;
        }
        let end = self.run_worker(id, &spec, job.step).await;
        drop(slot);
        self.conclude(id, &spec, end).await;
    }

    /// Runs the worker to its end: progress to Redis, cancel and SIGTERM passed on.
    async fn run_worker(&self, id: &str, spec: &JobSpec, from_step: u64) -> WorkerEnd {
        let dir = self.jobs_dir.join(id);
        let prepared = prepare_job_dir(&dir, spec);
        let log_path = dir.join("worker.log");
        let spawned = prepared.and_then(|()| {
            let log = std::fs::OpenOptions::new().create(true).append(true).open(&log_path)?;
            let mut command = tokio::process::Command::new(&self.exe);
            command
                .arg("worker")
                .arg("--spec")
                .arg(dir.join("spec.json"))
                .arg("--state-dir")
                .arg(dir.join("run"))
                .arg("--resume")
                .arg("--threads")
                .arg(self.worker_threads.to_string())
                .arg("--exit-with-parent")
                .arg(std::process::id().to_string());
            for plugin_dir in &self.plugin_dirs {
                command.arg("--plugin-dir").arg(plugin_dir);
            }
            command.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(log).kill_on_drop(true);
            command.spawn()
        });
        let mut child = match spawned {
            Ok(child) => child,
            Err(error) => {
                return WorkerEnd::Crashed(format!("cannot start the worker in {}: {error}", dir.display()));
            }
        };
        let pid = child.id().unwrap_or(0);
        let reason = if from_step > 0 {
            format!("worker pid {pid} resuming from its last checkpoint (step {from_step} reached before)")
        } else {
            format!("worker pid {pid} started")
        };
        if self.transition(id, JobState::Running, &reason, &[]).await.is_none() {
            // Cancelled between admission and start.
            let _ = child.kill().await;
            return WorkerEnd::Cancelled;
        }
        let mut stdout = child.stdout.take();
        let output = tokio::spawn(async move {
            let mut text = String::new();
            if let Some(stdout) = &mut stdout {
                let _ = tokio::io::AsyncReadExt::read_to_string(stdout, &mut text).await;
            }
            text
        });
        let mut progress = ProgressTail::new(dir.join("run/metrics.jsonl"), spec.budget.max_steps);
        let mut cancelled = false;
        let mut stop_deadline: Option<Instant> = None;
        let status: ExitStatus = loop {
            tokio::select! {
                status = child.wait() => match status {
                    Ok(status) => break status,
                    Err(error) => return WorkerEnd::Crashed(format!("waiting for the worker: {error}")),
                },
                _ = tokio::time::sleep(WATCH_INTERVAL) => {}
            }
            if let Some((step, figures)) = progress.poll()
                && let Err(error) = self.queues.store.set_progress(id, step, &figures).await
            {
                warn!(%error, "cannot record progress; will try with the next step");
            }
            if !cancelled && self.queues.store.cancel_requested(id).await.unwrap_or(false) {
                info!(pid, "cancel requested: killing the worker");
                cancelled = true;
                let _ = child.start_kill();
            }
            if self.stopping.is_cancelled() && stop_deadline.is_none() && !cancelled {
                info!(pid, "daemon stopping: asking the worker to checkpoint");
                signal(pid, nix::sys::signal::Signal::SIGTERM);
                stop_deadline = Some(Instant::now() + self.stop_timeout);
            }
            if stop_deadline.is_some_and(|deadline| Instant::now() >= deadline) {
                warn!(
                    pid,
                    "the worker did not stop in time: killing it; it resumes from its last checkpoint"
                );
                let _ = child.start_kill();
                stop_deadline = Some(Instant::now() + Duration::from_secs(3600));
            }
        };
        if let Some((step, figures)) = progress.poll() {
            let _ = self.queues.store.set_progress(id, step, &figures).await;
        }
        let stdout = output.await.unwrap_or_default();
        if cancelled {
            return WorkerEnd::Cancelled;
        }
        classify(status, &stdout, &log_path)
    }

    /// Writes the end of a worker run to the job record.
    async fn conclude(&self, id: &str, spec: &JobSpec, end: WorkerEnd) {
        let priority = spec.job.priority;
        match end {
            WorkerEnd::Finished(outcome) => {
                let extra = [("result", outcome.to_string())];
                if self
                    .transition(id, JobState::Evaluating, "training ended; gating the candidate", &extra)
                    .await
                    .is_some()
                {
                    self.finish(id, spec, outcome).await;
                }
            }
            WorkerEnd::Interrupted => {
                if self
                    .transition(id, JobState::Preempted, "the daemon is stopping; checkpointed", &[])
                    .await
                    .is_some()
                {
                    self.requeue(
                        id,
                        priority,
                        Some(JobState::Queued),
                        "requeued: resumes from its checkpoint",
                    )
                    .await;
                }
            }
            WorkerEnd::Cancelled => {
                let reason = "cancelled: the worker was stopped";
                let _ = self.transition(id, JobState::Cancelled, reason, &[]).await;
            }
            WorkerEnd::JobError(message) => {
                let _ = self.transition(id, JobState::Failed, &message, &[]).await;
            }
            WorkerEnd::Crashed(what) => {
                warn!(%what, "worker crashed");
                if !self.count_crash_or_dead_letter(id, &what).await {
                    self.requeue(
                        id,
                        priority,
                        Some(JobState::Queued),
                        &format!("requeued after a crash: {what}"),
                    )
                    .await;
                }
            }
        }
    }

    /// Gates a finished job and records the verdict.
    async fn finish(&self, id: &str, spec: &JobSpec, outcome: Value) {
        let (spec2, id2, registry) = (spec.clone(), id.to_owned(), self.default_registry.clone());
        let verdict =
            tokio::task::spawn_blocking(move || gate::evaluate(&spec2, &id2, &outcome, &registry)).await;
        match verdict {
            Ok(Ok(Verdict::Published { version, path, table })) => {
                let reason =
                    format!("published {} version {version} at {}", spec.job.model_line, path.display());
                let extra = [("gates", json!(table).to_string()), ("published", path.display().to_string())];
                let _ = self.transition(id, JobState::Published, &reason, &extra).await;
            }
            Ok(Ok(Verdict::Refused { reason, table })) => {
                let _ = self
                    .transition(id, JobState::Refused, &reason, &[("gates", json!(table).to_string())])
                    .await;
            }
            Ok(Err(message)) => {
                let _ = self.transition(id, JobState::Failed, &message, &[]).await;
            }
            Err(error) => {
                let _ =
                    self.transition(id, JobState::Failed, &format!("gating panicked: {error}"), &[]).await;
            }
        }
    }

    /// Counts a crash; at the limit, dead-letters the job (`failed`) and returns true.
    async fn count_crash_or_dead_letter(&self, id: &str, what: &str) -> bool {
        let Some(crashes) = self.persist("count a crash", || self.queues.store.count_crash(id)).await else {
            return true;
        };
        if crashes < self.max_crashes {
            return false;
        }
        let reason = format!("dead-lettered after {crashes} crashes (queue.max_crashes); the last: {what}");
        warn!(%reason, "dead letter");
        if self.transition(id, JobState::Failed, &reason, &[]).await.is_some() {
            self.persist("dead-letter", || self.queues.store.dead_letter(id)).await;
        }
        true
    }

    /// Gives the job a new dispatch task (moving it to `to`, when given) and pushes it.
    async fn requeue(&self, id: &str, priority: Priority, to: Option<JobState>, reason: &str) {
        let task_id = new_task_id();
        let fields = [("task_id", task_id.clone())];
        let recorded = match to {
            Some(state) => self.transition(id, state, reason, &fields).await.is_some(),
            None => self
                .persist("record the new task", || self.queues.store.set_fields(id, &fields))
                .await
                .is_some(),
        };
        if !recorded {
            return;
        }
        let mut delay = Duration::from_millis(200);
        while let Err(error) = self.queues.enqueue(id, &task_id, priority).await {
            warn!(%error, "cannot push the job's new task yet; retrying (the recovery sweep would too)");
            tokio::time::sleep(delay).await;
            delay = (delay * 2).min(Duration::from_secs(5));
        }
    }

    /// A change of state, retried while Redis is away; `None` when the job may not make it
    /// (cancelled meanwhile, or gone).
    async fn transition(
        &self,
        id: &str,
        to: JobState,
        reason: &str,
        extra: &[(&str, String)],
    ) -> Option<JobState> {
        let mut delay = Duration::from_millis(200);
        loop {
            match self.queues.store.transition(id, to, reason, extra).await {
                Ok(from) => {
                    info!(from = %from, to = %to, %reason, "state");
                    return Some(from);
                }
                Err(StoreError::Redis(error)) => {
                    warn!(%error, to = %to, "redis away; retrying the change of state");
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(Duration::from_secs(5));
                }
                Err(error) => {
                    info!(%error, to = %to, "change of state not made");
                    return None;
                }
            }
        }
    }

    /// Runs a store call until Redis answers it; `None` for any other error (logged).
    async fn persist<T, F, Fut>(&self, what: &str, mut call: F) -> Option<T>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<T, StoreError>>,
    {
        let mut delay = Duration::from_millis(200);
        loop {
            match call().await {
                Ok(value) => return Some(value),
                Err(StoreError::Redis(error)) => {
                    warn!(%error, "redis away; retrying: {what}");
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(Duration::from_secs(5));
                }
                Err(error) => {
                    warn!(%error, "cannot {what}");
                    return None;
                }
            }
        }
    }
}

/// Writes the job's spec (once: the worker checks it never changes under a run) and run dir.
fn prepare_job_dir(dir: &Path, spec: &JobSpec) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let path = dir.join("spec.json");
    if !path.exists() {
        let temp = dir.join(".spec.json.tmp");
        std::fs::write(&temp, serde_json::to_vec_pretty(spec).map_err(std::io::Error::other)?)?;
        std::fs::rename(temp, &path)?;
    }
    Ok(())
}

fn signal(pid: u32, signal: nix::sys::signal::Signal) {
    if pid > 0 {
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), signal);
    }
}

/// What a worker's exit status, stdout and log say about how it ended.
fn classify(status: ExitStatus, stdout: &str, log: &Path) -> WorkerEnd {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(0), _) => {
            match stdout.lines().rev().find_map(|line| serde_json::from_str::<Value>(line).ok()) {
                Some(outcome) => WorkerEnd::Finished(outcome),
                None => WorkerEnd::Crashed("the worker exited 0 without its outcome line".into()),
            }
        }
        (Some(code), _) if code == i32::from(EXIT_INTERRUPTED) => WorkerEnd::Interrupted,
        (Some(EXIT_JOB_ERROR), _) => WorkerEnd::JobError(last_error_line(log)),
        (Some(code), _) => {
            WorkerEnd::Crashed(format!("the worker exited with status {code}: {}", last_error_line(log)))
        }
        (None, Some(signal)) => {
            let name = nix::sys::signal::Signal::try_from(signal)
                .map_or_else(|_| signal.to_string(), |s| s.to_string());
            WorkerEnd::Crashed(format!("the worker was killed by {name}"))
        }
        (None, None) => WorkerEnd::Crashed("the worker ended without a status".into()),
    }
}

/// The worker's own last word (`rlvrd worker: …`), else its log's last line.
fn last_error_line(log: &Path) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let tail: Vec<&str> = text.lines().rev().take(200).collect();
    tail.iter()
        .find_map(|line| line.strip_prefix("rlvrd worker: "))
        .or_else(|| tail.first().copied())
        .unwrap_or("no log")
        .chars()
        .take(2000)
        .collect()
}

/// Follows a run's metrics.jsonl for the latest step's figures.
struct ProgressTail {
    path: PathBuf,
    offset: u64,
    max_steps: u64,
    started: Instant,
    first_step: Option<u64>,
    heldout: Option<f64>,
}

impl ProgressTail {
    fn new(path: PathBuf, max_steps: u64) -> Self {
        ProgressTail { path, offset: 0, max_steps, started: Instant::now(), first_step: None, heldout: None }
    }

    /// The newest step and its figures, when a new one was logged since the last call.
    fn poll(&mut self) -> Option<(u64, Value)> {
        let mut file = std::fs::File::open(&self.path).ok()?;
        file.seek(std::io::SeekFrom::Start(self.offset)).ok()?;
        let mut reader = std::io::BufReader::new(file);
        let mut newest = None;
        let mut line = String::new();
        while reader.read_line(&mut line).ok()? > 0 {
            if !line.ends_with('\n') {
                break; // half-written: next time
            }
            self.offset += line.len() as u64;
            if let Ok(value) = serde_json::from_str::<Value>(&line) {
                if let Some(accuracy) = value.pointer("/heldout/accuracy").and_then(Value::as_f64) {
                    self.heldout = Some(accuracy);
                }
                if value.get("reward_mean").is_some() || value.get("loss").is_some() {
                    newest = Some(value);
                }
            }
            line.clear();
        }
        let newest = newest?;
        let step = newest.get("step").and_then(Value::as_u64)?;
        let first = *self.first_step.get_or_insert(step.saturating_sub(1));
        let done_here = step.saturating_sub(first).max(1);
        let eta_s = self.started.elapsed().as_secs_f64() / done_here as f64
            * self.max_steps.saturating_sub(step) as f64;
        let figures = json!({
            "step": step,
            "max_steps": self.max_steps,
            "reward": newest.get("reward_mean"),
            "loss": newest.get("loss"),
            "kl": newest.get("kl_ref"),
            "heldout": self.heldout,
            "tokens_per_s": newest.pointer("/time/generation_tokens_per_s"),
            "step_s": newest.pointer("/time/step_s"),
            "eta_s": eta_s.round(),
        });
        Some((step, figures))
    }
}

/// Device slots, given most urgent first, then oldest (a stand-in for the scheduler of issue 6,
/// which replaces it with memory packing, quotas and phase grants).
pub struct Slots {
    total: usize,
    state: Mutex<SlotState>,
    changed: Notify,
}

struct SlotState {
    free: usize,
    /// (priority rank: 0 = high, created_at, job id).
    waiting: BTreeSet<(u8, String, String)>,
}

/// A held slot; dropping it frees the slot.
pub struct SlotGuard<'a> {
    slots: &'a Slots,
}

impl Drop for SlotGuard<'_> {
    fn drop(&mut self) {
        self.slots.state.lock().unwrap_or_else(|p| p.into_inner()).free += 1;
        self.slots.changed.notify_waiters();
    }
}

fn rank(priority: Priority) -> u8 {
    match priority {
        Priority::High => 0,
        Priority::Normal => 1,
        Priority::Low => 2,
    }
}

impl Slots {
    pub fn new(count: usize) -> Self {
        let total = count.max(1);
        Slots {
            total,
            state: Mutex::new(SlotState { free: total, waiting: BTreeSet::new() }),
            changed: Notify::new(),
        }
    }

    /// Waits for a slot; the most urgent, then oldest, waiter gets each free one.
    pub async fn acquire(&self, priority: Priority, created_at: &str, id: &str) -> SlotGuard<'_> {
        let key = (rank(priority), created_at.to_owned(), id.to_owned());
        loop {
            let notified = self.changed.notified();
            {
                let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
                state.waiting.insert(key.clone());
                if state.free > 0 && state.waiting.first() == Some(&key) {
                    state.waiting.remove(&key);
                    state.free -= 1;
                    drop(state);
                    // The next waiter may fit too.
                    self.changed.notify_waiters();
                    return SlotGuard { slots: self };
                }
            }
            notified.await;
        }
    }

    /// Takes a waiter off the list (it stopped waiting).
    pub fn forget(&self, priority: Priority, created_at: &str, id: &str) {
        let key = (rank(priority), created_at.to_owned(), id.to_owned());
        self.state.lock().unwrap_or_else(|p| p.into_inner()).waiting.remove(&key);
        self.changed.notify_waiters();
    }
}

/// The view's priority as the spec type.
pub fn priority_of(job: &JobView) -> Priority {
    match job.priority.as_str() {
        "high" => Priority::High,
        "low" => Priority::Low,
        _ => Priority::Normal,
    }
}
