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
//! - **Out of memory is not a crash.** A worker holds its job to `[resources] memory_gb` (on a
//!   CPU its own watchdog, `--memory-cap`; on CUDA libtorch's allocator, capped through
//!   `PYTORCH_CUDA_ALLOC_CONF`) and exits `OutOfMemory` past it; the job is requeued once with a
//!   larger request, written into its record's spec, or fails naming the numbers
//!   ([`super::out_of_memory`]).
//! - **Nothing is lost to Redis being away.** Every write of an outcome is retried with backoff
//!   until Redis takes it ([`Supervisor::persist`]).
//! - **SIGTERM** (daemon stopping): the worker is asked to checkpoint at its next step boundary
//!   and exits 75; the job goes `preempted → queued` with a new task, and resumes exactly.
//! - **Admission and preemption are the scheduler's** (`sched::service`): a job waits for its
//!   seat's admission; when the scheduler preempts it, its worker is asked to checkpoint and leave
//!   as on SIGTERM, is killed after `scheduler.preempt_grace_s`, and the job is requeued
//!   (`preempted → queued`) to resume from its last checkpoint.
//!   Cancel: the worker is killed at once (its last checkpoint stays intact) and the job ends
//!   `cancelled`.
//!
//! The worker is spawned with [`WorkerArgs`] on its devices: its `--plugin-file`s (the registry's
//! copies of the libraries the spec names, every loaded version of each name: `job_libraries`), its
//! `--memory-cap` (the record's `memory_gb`, or a whole device's memory for 0), and for an engine job the
//! engine's python, the verify route, the Ray address and, in its environment, the run's
//! `JobToken`. Its `progress.json` is copied to the record; `classify` turns its exit into a
//! [`WorkerEnd`].

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rlvr_plugin_host::Registry;
use rlvr_protocol::job::{JobState, JobView};
use rlvr_protocol::names::{PinnedSpec, ServerSpec};
use rlvr_protocol::spec::{JobSpec, Priority, RolloutEngine};
use rlvr_queue::dispatch::new_task_id;

use crate::jobs::tokens::{JobToken, JobTokens};
use crate::sched::inventory::InventoryDevice;
use crate::sched::policy::Demand;
use crate::sched::service::{Scheduler, Seat};
use rlvr_protocol::engine::{EngineKind, JOB_TOKEN_ENV, Launcher};
use rlvr_queue::store::{RecordField, StoreError};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{Instrument, info, info_span, warn};

use super::Queues;
use super::dataset_output::{self, DatasetVerdict};
use super::mlflow;
use super::out_of_memory;
use super::publish::{self, Verdict};
use rlvr_protocol::fs::write_json_atomic;

use crate::state_dir::StateDir;
use crate::tenancy::Tenancy;
use rlvr_protocol::jobdir::{JobDir, JobsDir, RunDir};
use rlvr_protocol::kind::JobKind;
use rlvr_protocol::memory::BYTES_PER_GB;
use rlvr_protocol::worker::{LastWord, OutOfMemory, Outcome, Progress, WorkerArgs, WorkerExit};

/// How often a running job's worker, cancel flag and metrics are looked at.
const WATCH_INTERVAL: Duration = Duration::from_millis(200);
/// How often a job waiting for admission looks whether it was cancelled meanwhile.
const ADMISSION_RECHECK: Duration = Duration::from_secs(1);

/// What a [`Supervisor`] is made from.
pub struct SupervisorConfig {
    pub queues: Queues,
    /// The worker executable, started as `rlvr-worker run` for each job.
    pub worker: PathBuf,
    /// The daemon's state directory: jobs, the default registry and the curricula are in it.
    pub state_dir: StateDir,
    /// The loaded plugins: a worker is given the copies of its job's libraries, and loads no other.
    pub registry: Arc<Registry>,
    /// libtorch threads of each worker.
    pub worker_threads: usize,
    /// Crashes of a job's worker before the job is dead-lettered.
    pub max_crashes: u32,
    /// How long a worker gets to checkpoint when the daemon stops.
    pub stop_timeout: Duration,
    pub scheduler: Arc<Scheduler>,
    /// The scheduler's grant socket, passed to each worker.
    pub grant_socket: PathBuf,
    /// How long a preempted worker gets to checkpoint before it is killed.
    pub preempt_grace: Duration,
    /// Cancelled on SIGTERM: workers checkpoint and jobs are requeued.
    pub stopping: CancellationToken,
    /// Resolves a job's names into the paths its worker reads; the model lines it publishes to.
    pub tenancy: Arc<Tenancy>,
    /// The client webhooks go through (`[outbound]`).
    pub outbound: rlvr_outbound::Client,
    pub engines: Engines,
    /// How many ended jobs' records a team keeps, and how long (applied when one ends).
    pub retention: crate::jobs::retention::Retention,
}

/// What an `[engine]` job's worker is given to start its engine.
pub struct Engines {
    /// `engines.trl_python`; `None`: trl jobs are refused at submit.
    pub trl_python: Option<PathBuf>,
    /// `engines.ray_address`; `None`: ray-launched jobs are refused at submit.
    pub ray_address: Option<String>,
    /// `engines.ray_python`; `None`: jobs on more than one node are refused at submit.
    pub ray_python: Option<PathBuf>,
    /// `engines.vllm_python`; `None`: `rollout.engine = "vllm"` jobs are refused at submit.
    pub vllm_python: Option<PathBuf>,
    /// `engines.environments` and `engines.environments_python`; `None`: `env.environment` jobs
    /// are refused at submit.
    pub environments: Option<(PathBuf, PathBuf)>,
    /// This daemon's `POST /v1/verify`, where the engine gets its rewards.
    pub verify_url: String,
    /// Where each run's job token is minted (and the API finds it).
    pub tokens: Arc<JobTokens>,
}

impl Engines {
    /// The installed environment `name`'s script and the python that runs it, or why not.
    pub fn environment(&self, name: &str) -> Result<(PathBuf, PathBuf), String> {
        installed_environment(self.environments.as_ref(), name)
    }
}

/// `name`'s script under the installed environments' directory (and their python), or why not:
/// what submit refuses and the supervisor resolves, one rule.
pub fn installed_environment(
    environments: Option<&(PathBuf, PathBuf)>,
    name: &str,
) -> Result<(PathBuf, PathBuf), String> {
    let Some((dir, python)) = environments else {
        return Err(
            "env.environment: this daemon has no installed environments (engines.environments)".into()
        );
    };
    let script = dir.join(format!("{name}.py"));
    match script.is_file() {
        true => Ok((script, python.clone())),
        false => {
            let mut installed: Vec<String> = std::fs::read_dir(dir)
                .map(|entries| {
                    entries
                        .filter_map(|entry| {
                            entry.ok()?.file_name().to_str()?.strip_suffix(".py").map(str::to_owned)
                        })
                        .collect()
                })
                .unwrap_or_default();
            installed.sort();
            Err(format!(
                "env.environment: no environment {name:?} is installed here (installed: {})",
                installed.join(", ")
            ))
        }
    }
}

/// What the daemon's supervisors share.
pub struct Supervisor {
    pub queues: Queues,
    /// The worker executable, started as `rlvr-worker run` for each job.
    pub exe: PathBuf,
    /// `<state_dir>/jobs`: one directory per job (spec, run state, worker log).
    pub jobs_dir: JobsDir,
    /// Resolves a job's names into the paths its worker reads; the model lines it publishes to.
    pub tenancy: Arc<Tenancy>,
    /// The loaded plugins: a worker is given the copies of its job's libraries, and loads no other.
    pub registry: Arc<Registry>,
    pub worker_threads: usize,
    pub max_crashes: u32,
    pub stop_timeout: Duration,
    /// Cancelled on SIGTERM: workers checkpoint and jobs are requeued.
    pub stopping: CancellationToken,
    pub scheduler: Arc<Scheduler>,
    /// The scheduler's grant socket, passed to each worker.
    pub grant_socket: PathBuf,
    /// How long a preempted worker gets to checkpoint before it is killed.
    pub preempt_grace: Duration,
    /// The client webhooks go through (`[outbound]`).
    pub outbound: rlvr_outbound::Client,
    pub engines: Engines,
    /// Ended jobs' records kept (`jobs::retention`), applied to a team when one of its jobs ends.
    pub retention: crate::jobs::retention::Retention,
    /// Jobs supervised by this daemon now; the flag turns true when the supervision ends.
    active: Mutex<HashMap<String, tokio::sync::watch::Receiver<bool>>>,
    /// Every supervision under way, whichever queue worker took its task: a worker rebuilt after
    /// a Redis error drops its handlers, not the supervisions they started, and the daemon's stop
    /// must wait for those too ([`Supervisor::supervisions_ended`]).
    supervisions: TaskTracker,
}

/// Why a worker process ended, as the supervisor sees it.
#[derive(Debug, Clone, PartialEq)]
pub enum WorkerEnd {
    /// Trained to its end; the worker's outcome.
    Finished(Box<Outcome>),
    /// Checkpointed and stopped on request (the daemon stopping).
    Interrupted,
    /// Stopped to make room for job `for_job`: checkpointed, or killed after the grace period.
    Preempted { for_job: String, killed: bool },
    /// Killed because its job was cancelled.
    Cancelled,
    /// Refused its job (exit 2): the reason, from its log.
    JobError(String),
    /// Ran out of memory (exit 71): its report, from its log's last line (`None` when that line
    /// was not one).
    OutOfMemory(Option<OutOfMemory>),
    /// Died: signal, panic, anything else.
    Crashed(String),
}

impl Supervisor {
    pub fn new(config: SupervisorConfig) -> Self {
        Supervisor {
            queues: config.queues,
            exe: config.worker,
            jobs_dir: config.state_dir.jobs(),
            tenancy: config.tenancy,
            registry: config.registry,
            worker_threads: config.worker_threads,
            max_crashes: config.max_crashes,
            stop_timeout: config.stop_timeout,
            stopping: config.stopping,
            scheduler: config.scheduler,
            grant_socket: config.grant_socket,
            preempt_grace: config.preempt_grace,
            outbound: config.outbound,
            engines: config.engines,
            retention: config.retention,
            active: Mutex::new(HashMap::new()),
            supervisions: TaskTracker::new(),
        }
    }

    /// Starts [`Supervisor::handle`] on a task of its own, which outlives the queue worker's
    /// handler that asked for it (see [`Supervisor::supervisions`]); the handle resolves when it
    /// ends.
    pub fn supervise(self: &Arc<Self>, id: String, task_id: String) -> tokio::task::JoinHandle<()> {
        let supervisor = Arc::clone(self);
        self.supervisions.spawn(async move { supervisor.handle(id, task_id).await })
    }

    /// Resolves when every supervision started so far has ended; none may start after (the
    /// daemon is stopping).
    pub async fn supervisions_ended(&self) {
        self.supervisions.close();
        self.supervisions.wait().await;
    }

    /// Handles dispatch task `task_id` of job `id` to the end of this daemon's part in it. Never
    /// fails: every outcome is written to the job record.
    pub async fn handle(self: &Arc<Self>, id: String, task_id: String) {
        loop {
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
                // The same job's task again while a supervision of it runs here: either the
                // task under way, redelivered after the backend's worker was rebuilt (held so
                // its lease covers the job; stale once that supervision ends), or a newer task
                // the supervision's own requeue pushed before it ended (a worker that stopped
                // on a signal of its own): handled once it has ended. Taken as stale, it left
                // the job `queued` with no task anyone would run.
                info!(job = %id, task = %task_id, "job is supervised here already; this task waits until that ends");
                if running.wait_for(|ended| *ended).await.is_err() {
                    warn!(job = %id, task = %task_id, "the supervision under way ended without a word; leaving this task");
                    return;
                }
                continue;
            }
            let span = info_span!("job", id = %id);
            self.handle_inner(&id, &task_id).instrument(span).await;
            self.active.lock().unwrap_or_else(|p| p.into_inner()).remove(&id);
            if let Some(done) = done {
                let _ = done.send(true);
            }
            // An ended job may put its team past the records it keeps.
            if let Ok(job) = self.queues.store.get(&id).await
                && job.state.is_terminal()
            {
                crate::jobs::retention::sweep_team(&self.queues.store, &self.retention, &job.team).await;
            }
            return;
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
            if job.state == JobState::Evaluating
                && let Some(outcome) = job.result.clone()
            {
                let tracker = self.track(id, &spec);
                self.finish(id, &spec, outcome).await;
                self.end_tracking(id, tracker).await;
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

        // Admission: the scheduler's, most urgent first, then fair share, then age.
        let demand = self.demand(id, &spec, &job);
        if let Err(why) = self.scheduler.can_ever_fit(&demand) {
            // The inventory changed since the submit (a GPU gone from the config).
            let _ = self.transition(id, JobState::Failed, &why.to_string(), &[]).await;
            return;
        }
        let mut seat = match self.scheduler.enqueue(demand) {
            Ok(seat) => seat,
            Err(error) => {
                warn!(%error, "the scheduler knows this job already; leaving this task");
                return;
            }
        };
        let devices = loop {
            tokio::select! {
                // A stopping daemon starts nothing, even when the devices are free at once.
                biased;
                _ = self.stopping.cancelled() => {
                    drop(seat);
                    // Leave it queued under a new task for the next daemon: this one is stopping.
                    self.requeue(id, priority, None, "the daemon stopped before admitting it", &[]).await;
                    return;
                }
                devices = seat.admitted() => break devices,
                _ = tokio::time::sleep(ADMISSION_RECHECK) => {
                    // Cancelled while it waited: its place goes to the next.
                    let state = self.queues.store.get(id).await.map(|job| job.state);
                    if state.is_ok_and(|state| state.is_terminal()) {
                        return;
                    }
                }
            }
        };
        let devices = self.scheduler.inventory_devices(&devices);
        let names: Vec<String> = devices.iter().map(|device| device.kind.to_string()).collect();
        let uuids: Vec<&str> =
            devices.iter().filter_map(|device| device.gpu.as_ref()).map(|gpu| gpu.uuid.as_str()).collect();
        info!(devices = %names.join(","), uuids = %uuids.join(","), "admitted");
        let reason = format!("admitted to {}", names.join(", "));
        let mut fields = vec![RecordField::Devices(names.clone())];
        // The shared curriculum's version is pinned at the first admission and kept on resumes.
        let curriculum = match self.pin_curriculum(&spec, job.curriculum_version) {
            Ok(pinned) => pinned,
            Err(message) => {
                let _ = self.transition(id, JobState::Failed, &message, &[]).await;
                return;
            }
        };
        if job.curriculum_version.is_none()
            && let Some((_, version)) = &curriculum
        {
            fields.push(RecordField::CurriculumVersion(*version));
        }
        if self.transition(id, JobState::Admitted, &reason, &fields).await.is_none() {
            return;
        }
        let tracker = self.track(id, &spec);
        let end = self.run_worker(id, &spec, &job, curriculum, &mut seat, &devices).await;
        // The worker is gone: its devices are free for the next job.
        drop(seat);
        self.conclude(id, &spec, end, &names.join(",")).await;
        self.end_tracking(id, tracker).await;
    }

    /// Starts the job's MLflow tracker when its spec names `[tracking]`: a task of its own, which
    /// nothing here waits for.
    fn track(&self, id: &str, spec: &JobSpec) -> Option<mlflow::Tracker> {
        let tracking = spec.tracking.as_ref()?;
        let token = match &tracking.token_secret {
            None => None,
            // Read at each start, so a rotated secret is the one sent.
            Some(name) => match self.tenancy.team_secrets(&spec.job.team) {
                Ok(secrets) if secrets.contains_key(name) => {
                    secrets.get(name).map(|secret| secret.expose().to_owned())
                }
                _ => {
                    warn!(secret = %name, "mlflow: tracking.token_secret is not available; the run is not logged");
                    return None;
                }
            },
        };
        let dir = self.jobs_dir.job(id);
        let job = mlflow::TrackedJob {
            id: id.to_owned(),
            spec: spec.clone(),
            state_file: dir.mlflow(),
            metrics: dir.run().metrics(),
        };
        let server = mlflow::Server::new(self.outbound.clone(), tracking, token);
        Some(mlflow::Tracker::start(job, server, self.stopping.clone()))
    }

    /// Hands the job's tracker the record the supervision left: its end, or a requeue.
    async fn end_tracking(&self, id: &str, tracker: Option<mlflow::Tracker>) {
        let Some(tracker) = tracker else { return };
        match self.queues.store.get(id).await {
            Ok(job) => tracker.end(job),
            Err(error) => warn!(%error, "mlflow: cannot read the job's end; its run is left as it is"),
        }
    }

    /// The curricula directory of the job's shared curriculum and the version it runs with: the
    /// one pinned before, else the latest (0 when there is none yet); `None` when the job names no
    /// shared curriculum.
    fn pin_curriculum(&self, spec: &JobSpec, pinned: Option<u64>) -> Result<Option<(PathBuf, u64)>, String> {
        // Checked on every start: a grant taken back stops the reader's next run.
        let Some((dir, name)) = self.tenancy.curricula.for_job(spec)? else { return Ok(None) };
        if let Some(version) = pinned {
            return Ok(Some((dir, version)));
        }
        let latest = crate::curricula::latest_number(&dir, &name)
            .map_err(|error| format!("curriculum.name: cannot pin a version of {name}: {error}"))?;
        Ok(Some((dir, latest.unwrap_or(0))))
    }

    /// What the job asks the scheduler for; its age counts from its submission.
    fn demand(&self, id: &str, spec: &JobSpec, job: &JobView) -> Demand {
        let now = std::time::SystemTime::now();
        let created = humantime::parse_rfc3339(&job.created_at).unwrap_or(now);
        self.scheduler.demand(id, spec, now.duration_since(created).unwrap_or_default())
    }

    /// Runs the worker to its end on `devices`: progress to Redis; cancel, SIGTERM and
    /// preemption passed on.
    async fn run_worker(
        &self,
        id: &str,
        spec: &PinnedSpec,
        job: &JobView,
        curriculum: Option<(PathBuf, u64)>,
        seat: &mut Seat,
        devices: &[InventoryDevice],
    ) -> WorkerEnd {
        let dir = self.jobs_dir.job(id);
        // An engine job's token lives as long as this run of its worker.
        let (mut child, _job_token) = match self.spawn_worker(&dir, id, spec, job.kind, curriculum, devices) {
            Ok(spawned) => spawned,
            Err(SpawnError::Refused(reason)) => return WorkerEnd::JobError(reason),
            Err(SpawnError::Io(error)) => {
                return WorkerEnd::Crashed(format!(
                    "cannot start the worker in {}: {error}",
                    dir.path().display()
                ));
            }
        };
        let pid = child.id().unwrap_or(0);
        let reason = if job.step > 0 {
            format!("worker pid {pid} resuming from its last checkpoint (step {} reached before)", job.step)
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
        let mut watch = WorkerWatch::new(pid, dir.run());
        let status = self.watch_worker(id, &mut child, seat, &mut watch).await;
        // The worker is gone, however it went: no cluster job of its outlives it (nor runs
        // beside the next run's engine).
        if spec.engine.kind != EngineKind::Native
            && spec.engine.launcher == Launcher::Ray
            && let Some(address) = &self.engines.ray_address
        {
            super::cluster::stop_left_running(address, &dir.run(), id).await;
        }
        let status = match status {
            Ok(status) => status,
            Err(error) => return WorkerEnd::Crashed(format!("waiting for the worker: {error}")),
        };
        let stdout = output.await.unwrap_or_default();
        if watch.cancelled {
            return WorkerEnd::Cancelled;
        }
        let mut end = classify(status, &stdout, &dir.worker_log());
        // Asked to stop (SIGTERM) and ended by it before its handler was in place, killed for
        // being slow to stop, or ended `Transient` meanwhile (a worker still starting finds the
        // stopping daemon's grant socket gone): not a crash; it resumes from its last checkpoint.
        let transient = status.code() == Some(i32::from(WorkerExit::Transient.code()));
        if watch.stop_deadline.is_some()
            && (watch.killed || transient || died_of(status, nix::sys::signal::Signal::SIGTERM))
        {
            end = WorkerEnd::Interrupted;
        }
        match (watch.preempted_for, end) {
            (Some(for_job), WorkerEnd::Interrupted) => WorkerEnd::Preempted { for_job, killed: watch.killed },
            (_, end) => end,
        }
    }

    /// Starts `rlvr-worker run` for job `id` in `dir` (its spec written first, its stderr to the
    /// job's log), on `devices`.
    fn spawn_worker(
        &self,
        dir: &JobDir,
        id: &str,
        spec: &PinnedSpec,
        kind: Option<JobKind>,
        curriculum: Option<(PathBuf, u64)>,
        devices: &[InventoryDevice],
    ) -> Result<(tokio::process::Child, Option<JobToken>), SpawnError> {
        if !dir.spec().exists() {
            // The names the team wrote, as the server's paths; written once, so every resume
            // reads what the first run read.
            let resolved =
                crate::tenancy::resolve::worker_spec(&self.tenancy, spec).map_err(SpawnError::Refused)?;
            prepare_job_dir(dir, &resolved)?;
        }
        // What the job's plugins may use: its team's secrets and the operator's outbound policy.
        let host =
            self.tenancy.host_context(&spec.job.team, self.outbound.policy()).map_err(SpawnError::Refused)?;
        let log = std::fs::OpenOptions::new().create(true).append(true).open(dir.worker_log())?;
        // The gates compare with the line's version published when this run started.
        let baseline = publish::latest_version(spec, &self.tenancy.lines);
        // Version 0 (none yet): the plugin starts from its own prior.
        let curriculum = curriculum.filter(|(_, version)| *version > 0);
        let plugin_files = job_libraries(&self.registry, spec).map_err(SpawnError::Refused)?;
        let on_gpu = devices.iter().any(|device| device.gpu.is_some());
        let memory_cap = memory_cap_bytes(spec.resources.memory_gb, devices);
        // An engine job: the engine's python and a token of its own for the verify route.
        let engine = match spec.engine.kind {
            EngineKind::Native => None,
            EngineKind::Trl => {
                let python = self.engines.trl_python.clone().ok_or_else(|| {
                    SpawnError::Refused(
                        "engine.kind: this daemon runs no trl engine (engines.trl_python)".into(),
                    )
                })?;
                // One rank per device asked for (here or on a Ray cluster), each grading at once.
                let ranks = usize::try_from(spec.resources.ranks()).unwrap_or(usize::MAX).max(1);
                let token = self.engines.tokens.mint(&spec.job.team, id, ranks).map_err(|error| {
                    SpawnError::Io(std::io::Error::other(format!("cannot make the job's token: {error}")))
                })?;
                Some((python, token))
            }
        };
        let args = WorkerArgs {
            spec: dir.spec(),
            state_dir: dir.run().path().to_owned(),
            resume: true,
            plugin_files,
            threads: Some(self.worker_threads),
            exit_with_parent: Some(std::process::id()),
            grant_socket: Some(self.grant_socket.clone()),
            job_id: Some(id.to_owned()),
            baseline_version: baseline.as_ref().map(|(version, _)| *version),
            baseline: baseline.map(|(_, path)| path),
            curricula_dir: curriculum.as_ref().map(|(dir, _)| dir.clone()),
            curriculum_version: curriculum.map(|(_, version)| version),
            device: Some(if on_gpu { "cuda" } else { "cpu" }.to_owned()),
            host_context_stdin: true,
            memory_cap,
            engine_python: engine.as_ref().map(|(python, _)| python.clone()),
            // A trl job's vLLM runs in its ranks, from the trl environment.
            vllm_python: match spec.rollout.engine {
                RolloutEngine::Vllm if !spec.engine.is_engine() => {
                    Some(self.engines.vllm_python.clone().ok_or_else(|| {
                        SpawnError::Refused(
                            "rollout.engine: this daemon runs no vLLM (engines.vllm_python)".into(),
                        )
                    })?)
                }
                _ => None,
            },
            env_script: match spec.env.as_ref().and_then(|env| env.environment.as_ref()) {
                Some(name) => Some(self.engines.environment(name).map_err(SpawnError::Refused)?.0),
                None => None,
            },
            env_python: match spec.env.as_ref().and_then(|env| env.environment.as_ref()) {
                Some(name) => Some(self.engines.environment(name).map_err(SpawnError::Refused)?.1),
                None => None,
            },
            verify_url: engine.as_ref().map(|_| self.engines.verify_url.clone()),
            ray_address: match spec.engine.launcher {
                Launcher::Ray if engine.is_some() => self.engines.ray_address.clone(),
                _ => None,
            },
            ray_python: match spec.engine.launcher {
                Launcher::Ray if engine.is_some() && spec.resources.nodes > 1 => {
                    self.engines.ray_python.clone()
                }
                _ => None,
            },
            kind,
            ..WorkerArgs::default()
        };
        let mut command = tokio::process::Command::new(&self.exe);
        command.args(args.command_line());
        // The worker and the plugins it loads see none of the daemon's environment but what a
        // process needs to run: secrets reach them by name only (SECURITY.md). Its GPUs by UUID.
        command.env_clear().envs(worker_environment(std::env::vars_os(), devices, spec.resources.memory_gb));
        if let Some((_, token)) = &engine {
            // Its environment, like the host context its stdin: never argv, never a file.
            command.env(JOB_TOKEN_ENV, &token.token);
        }
        command.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(log).kill_on_drop(true);
        let mut child = command.spawn()?;
        // The context goes on the worker's standard input, never into its arguments, environment
        // or job directory; the worker reads one line before anything else.
        if let Some(mut stdin) = child.stdin.take() {
            let line = host.to_json() + "\n";
            tokio::spawn(async move {
                if let Err(error) = tokio::io::AsyncWriteExt::write_all(&mut stdin, line.as_bytes()).await {
                    warn!(%error, "cannot hand the worker its host context; it exits and the job is retried");
                }
            });
        }
        Ok((child, engine.map(|(_, token)| token)))
    }

    /// Waits for the worker to exit, recording its progress and passing on a cancel (kill), the
    /// daemon's stop and a preemption (SIGTERM, then a kill past the grace period).
    async fn watch_worker(
        &self,
        id: &str,
        child: &mut tokio::process::Child,
        seat: &mut Seat,
        watch: &mut WorkerWatch,
    ) -> std::io::Result<ExitStatus> {
        let pid = watch.pid;
        let status = loop {
            tokio::select! {
                status = child.wait() => break status?,
                for_job = seat.preempted(), if watch.preempted_for.is_none() && watch.stop_deadline.is_none() && !watch.cancelled => {
                    info!(pid, for_job = %for_job, "preempted: asking the worker to checkpoint and leave");
                    signal(pid, nix::sys::signal::Signal::SIGTERM);
                    watch.stop_deadline = Some(Instant::now() + self.preempt_grace);
                    watch.preempted_for = Some(for_job);
                }
                _ = tokio::time::sleep(WATCH_INTERVAL) => {}
            }
            self.record_progress(id, &mut watch.progress).await;
            if !watch.cancelled && self.queues.store.cancel_requested(id).await.unwrap_or(false) {
                info!(pid, "cancel requested: killing the worker");
                watch.cancelled = true;
                let _ = child.start_kill();
            }
            if self.stopping.is_cancelled() && watch.stop_deadline.is_none() && !watch.cancelled {
                info!(pid, "daemon stopping: asking the worker to checkpoint");
                signal(pid, nix::sys::signal::Signal::SIGTERM);
                watch.stop_deadline = Some(Instant::now() + self.stop_timeout);
            }
            if watch.stop_deadline.is_some_and(|deadline| Instant::now() >= deadline) {
                warn!(
                    pid,
                    "the worker did not stop in time: killing it; it resumes from its last checkpoint"
                );
                let _ = child.start_kill();
                watch.killed = true;
                watch.stop_deadline = Some(Instant::now() + Duration::from_secs(3600));
            }
        };
        self.record_progress(id, &mut watch.progress).await;
        Ok(status)
    }

    /// Copies the worker's progress to the job record, when it changed.
    async fn record_progress(&self, id: &str, watch: &mut ProgressWatch) {
        if let Some(progress) = watch.poll()
            && let Err(error) = self.queues.store.set_progress(id, &progress).await
        {
            warn!(%error, "cannot record progress; will try with the next step");
        }
    }

    /// Writes the end of a worker run on `devices` (their names) to the job record.
    async fn conclude(&self, id: &str, spec: &PinnedSpec, end: WorkerEnd, devices: &str) {
        let priority = spec.job.priority;
        match end {
            WorkerEnd::Finished(outcome) => {
                let extra = [RecordField::Result(outcome.clone())];
                if self
                    .transition(id, JobState::Evaluating, "training ended; gating the candidate", &extra)
                    .await
                    .is_some()
                {
                    self.finish(id, spec, *outcome).await;
                }
            }
            WorkerEnd::Interrupted => {
                if self
                    .transition(
                        id,
                        JobState::Preempted,
                        "the daemon is stopping; it resumes from its last checkpoint",
                        &[],
                    )
                    .await
                    .is_some()
                {
                    self.requeue(
                        id,
                        priority,
                        Some(JobState::Queued),
                        "requeued: resumes from its checkpoint",
                        &[],
                    )
                    .await;
                }
            }
            WorkerEnd::Preempted { for_job, killed } => {
                let how = if killed {
                    format!("killed after scheduler.preempt_grace_s ({} s)", self.preempt_grace.as_secs())
                } else {
                    "checkpointed".to_owned()
                };
                let reason = format!("preempted to make room for job {for_job}; {how}");
                if self.transition(id, JobState::Preempted, &reason, &[]).await.is_some() {
                    self.persist("count a preemption", || self.queues.store.count_preemption(id)).await;
                    self.requeue(
                        id,
                        priority,
                        Some(JobState::Queued),
                        "requeued: resumes from its last checkpoint",
                        &[],
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
            WorkerEnd::OutOfMemory(report) => self.out_of_memory(id, spec, report.as_ref(), devices).await,
            WorkerEnd::Crashed(what) => {
                warn!(%what, "worker crashed");
                if !self.count_crash_or_dead_letter(id, &what).await {
                    self.requeue(
                        id,
                        priority,
                        Some(JobState::Queued),
                        &format!("requeued after a crash: {what}"),
                        &[],
                    )
                    .await;
                }
            }
        }
    }

    /// A worker on `devices` ran out of memory: the job is requeued once with a larger
    /// `[resources] memory_gb` (its record's spec changed with the requeue, so the scheduler and
    /// the next worker's cap see it, after a restart too), or fails naming the numbers. Never a
    /// crash.
    async fn out_of_memory(&self, id: &str, spec: &PinnedSpec, report: Option<&OutOfMemory>, devices: &str) {
        let Some(earlier) =
            self.persist("read the memory requeues", || self.queues.store.memory_requeues(id)).await
        else {
            let reason = "out of memory, and the job's count of memory requeues cannot be read";
            let _ = self.transition(id, JobState::Failed, reason, &[]).await;
            return;
        };
        let resources = &spec.resources;
        let ran = out_of_memory::Ran {
            memory_gb: resources.memory_gb,
            resident_gb: resources.resident_gb,
            earlier,
            report,
            devices,
        };
        let next = out_of_memory::next(&ran, |memory_gb, resident_gb| {
            let grown = grown(spec, memory_gb, resident_gb);
            let demand = self.scheduler.demand(id, &grown, Duration::ZERO);
            self.scheduler.can_ever_fit(&demand).map_err(|why| why.to_string())
        });
        match next {
            out_of_memory::Next::Requeue { memory_gb, resident_gb, reason } => {
                warn!(%reason, "out of memory");
                let grown = grown(spec, memory_gb, resident_gb);
                let fields = [RecordField::GrownSpec { spec: Box::new(grown), requeues: earlier + 1 }];
                self.requeue(id, spec.job.priority, Some(JobState::Queued), &reason, &fields).await;
            }
            out_of_memory::Next::Fail(reason) => {
                warn!(%reason, "out of memory");
                let _ = self.transition(id, JobState::Failed, &reason, &[]).await;
            }
        }
    }

    /// Gates a finished job and records the verdict; a published one's manifest then goes to
    /// the job's webhook, if it names one.
    async fn finish(&self, id: &str, spec: &JobSpec, outcome: Outcome) {
        // A built-in's kind is the spec's alone: no optimizer to ask.
        if JobKind::of(spec, None) == Some(JobKind::RejectionSampling) {
            return self.finish_dataset(id, spec, outcome).await;
        }
        let (spec2, id2, tenancy) = (spec.clone(), id.to_owned(), self.tenancy.clone());
        let verdict = tokio::task::spawn_blocking(move || {
            publish::gate_and_publish(&spec2, &id2, &outcome, &tenancy.lines, None)
        })
        .await;
        match verdict {
            Ok(Ok(Verdict::Published(published))) => {
                let reason = format!(
                    "published {} version {} at {}",
                    spec.job.model_line,
                    published.version,
                    published.path.display()
                );
                if self
                    .persist("record the publication", || {
                        publish::record(&self.queues.store, id, &published, &reason)
                    })
                    .await
                    .is_some()
                {
                    publish::deliver_webhook(&self.queues.store, &self.outbound, id, spec, &published).await;
                }
            }
            Ok(Ok(Verdict::Refused { reason, report })) => {
                let _ = self.transition(id, JobState::Refused, &reason, &[RecordField::Gates(report)]).await;
            }
            Ok(Err(error)) => {
                let _ = self.transition(id, JobState::Failed, &error.to_string(), &[]).await;
            }
            Err(error) => {
                let _ =
                    self.transition(id, JobState::Failed, &format!("gating panicked: {error}"), &[]).await;
            }
        }
    }

    /// Gates a finished rejection-sampling job's dataset and records the verdict: published as
    /// the team's dataset (its output, which a later spec names `dataset:NAME@SHA256`), or refused.
    async fn finish_dataset(&self, id: &str, spec: &JobSpec, outcome: Outcome) {
        let (spec2, tenancy) = (spec.clone(), self.tenancy.clone());
        let rows = self.jobs_dir.job(id).run().dataset();
        let verdict = tokio::task::spawn_blocking(move || {
            dataset_output::gate_and_publish(
                &spec2,
                &outcome,
                &rows,
                &tenancy.datasets,
                tenancy.max_datasets(),
            )
        })
        .await;
        match verdict {
            Ok(Ok(DatasetVerdict::Published { output, report })) => {
                let reason = format!("published {}", output.handed_on().reference());
                let fields = [RecordField::Gates(Box::new(report)), RecordField::Output(output)];
                let _ = self.transition(id, JobState::Published, &reason, &fields).await;
            }
            Ok(Ok(DatasetVerdict::Refused { reason, report })) => {
                let _ = self
                    .transition(id, JobState::Refused, &reason, &[RecordField::Gates(Box::new(report))])
                    .await;
            }
            Ok(Err(error)) => {
                let _ = self.transition(id, JobState::Failed, &error.to_string(), &[]).await;
            }
            Err(error) => {
                let reason = format!("gating panicked: {error}");
                let _ = self.transition(id, JobState::Failed, &reason, &[]).await;
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

    /// Gives the job a new dispatch task (moving it to `to`, when given, with the `extra` record
    /// fields) and pushes it.
    async fn requeue(
        &self,
        id: &str,
        priority: Priority,
        to: Option<JobState>,
        reason: &str,
        extra: &[RecordField],
    ) {
        let task_id = new_task_id();
        let mut fields = vec![RecordField::TaskId(task_id.clone())];
        fields.extend(extra.iter().cloned());
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
        extra: &[RecordField],
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

/// Why a worker could not be started.
#[derive(Debug, thiserror::Error)]
enum SpawnError {
    /// The job's fault: something its spec names is gone or no longer granted.
    #[error("{0}")]
    Refused(String),
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

/// The daemon's copies of the plugin libraries `spec` names, for the worker's `--plugin-file`s:
/// every loaded version of each name (a resumed run pins the version its record names), or the
/// one `name@version`. A worker that scanned the plugin directories instead would map, hash, copy
/// and self-test every library there to use two or three. A name nothing loaded answers to is
/// the job's fault, at its field.
fn job_libraries(registry: &Registry, spec: &JobSpec) -> Result<Vec<PathBuf>, String> {
    let mut files: Vec<PathBuf> = Vec::new();
    for named in spec.plugin_libraries() {
        let versions = registry
            .versions(named.plugin, Some(named.kind))
            .map_err(|error| format!("{}: {error}", named.field))?;
        for plugin in versions {
            if !files.contains(&plugin.library) {
                files.push(plugin.library.clone());
            }
        }
    }
    Ok(files)
}

/// The variables of the daemon's environment a worker gets: what finding libraries, logging,
/// temporary files, certificates and the accelerator need, by exact name or prefix. Everything
/// else (tokens, `RLVR__…` config overrides, a team's grader credentials) stays in the daemon.
const WORKER_ENV: &[&str] = &[
    "PATH",
    "LD_LIBRARY_PATH",
    "HOME",
    "TMPDIR",
    "LANG",
    "LC_ALL",
    "TZ",
    "RLVR_LOG",
    "RLVR_CPU_MATMUL",
    "RUST_BACKTRACE",
    "SSL_CERT_FILE",
    "SSL_CERT_DIR",
    CUDA_ALLOC_CONF,
    ALLOC_CONF,
];
const WORKER_ENV_PREFIXES: &[&str] = &["CUDA_", "CUBLAS_", "NVIDIA_", "NCCL_", "OMP_", "MKL_", "KMP_"];

/// The variable that names a worker's GPUs.
const CUDA_VISIBLE_DEVICES: &str = "CUDA_VISIBLE_DEVICES";
/// The daemon's own, about which GPUs it sees and how it numbers them: never a worker's.
const DAEMON_ONLY_ENV: &[&str] = &[CUDA_VISIBLE_DEVICES, "CUDA_DEVICE_ORDER"];

/// libtorch's allocator settings: the CUDA allocator reads the first, and the second only when
/// the first is not set.
const CUDA_ALLOC_CONF: &str = "PYTORCH_CUDA_ALLOC_CONF";
const ALLOC_CONF: &str = "PYTORCH_ALLOC_CONF";
/// The setting of [`CUDA_ALLOC_CONF`] that caps a process's allocator at a fraction of the
/// device's memory (libtorch 2.11, `CUDAAllocatorConfig`; applied when the allocator first
/// initialises a device).
const MEMORY_FRACTION: &str = "per_process_memory_fraction";

/// A worker's environment on `devices`: the entries of `vars` it inherits ([`WORKER_ENV`]), but for
/// the daemon's own `CUDA_VISIBLE_DEVICES` and `CUDA_DEVICE_ORDER`, and `CUDA_VISIBLE_DEVICES`
/// naming its GPUs by UUID (`GPU-…`, `MIG-…`), so no ordering decides which GPU it gets; empty
/// on CPU slots, so it sees no GPU at all. On a GPU, a job asking for `memory_gb` (> 0, less than
/// the device) gets libtorch's allocator capped at that share of the device
/// ([`cuda_alloc_conf`]), after whatever allocator settings the operator gave.
pub(crate) fn worker_environment(
    vars: impl Iterator<Item = (std::ffi::OsString, std::ffi::OsString)>,
    devices: &[InventoryDevice],
    memory_gb: f64,
) -> Vec<(std::ffi::OsString, std::ffi::OsString)> {
    let mut environment: Vec<_> = vars
        .filter(|(name, _)| {
            name.to_str().is_some_and(|name| {
                (WORKER_ENV.contains(&name)
                    || WORKER_ENV_PREFIXES.iter().any(|prefix| name.starts_with(prefix)))
                    && !DAEMON_ONLY_ENV.contains(&name)
            })
        })
        .collect();
    let uuids: Vec<&str> =
        devices.iter().filter_map(|device| device.gpu.as_ref()).map(|gpu| gpu.uuid.as_str()).collect();
    environment.push((CUDA_VISIBLE_DEVICES.into(), uuids.join(",").into()));
    if let Some(fraction) = memory_fraction(memory_gb, devices) {
        let operator = |name: &str| {
            environment
                .iter()
                .find(|(key, _)| key == name)
                .map(|(_, value)| value.to_string_lossy().into_owned())
        };
        let conf =
            cuda_alloc_conf(operator(CUDA_ALLOC_CONF).or_else(|| operator(ALLOC_CONF)).as_deref(), fraction);
        environment.retain(|(key, _)| key != CUDA_ALLOC_CONF);
        environment.push((CUDA_ALLOC_CONF.into(), conf.into()));
    }
    environment
}

/// The share of its GPU a job of `memory_gb` may take: `memory_gb` less the CUDA context's
/// allowance (which the request counts, and which lies outside libtorch's allocator, the only
/// thing the fraction caps) over the device's total (as NVML reports it: CUDA's total, which the
/// fraction multiplies; else the configured memory). `None` on CPU slots, for whole devices (0)
/// and for a request the size of the device.
fn memory_fraction(memory_gb: f64, devices: &[InventoryDevice]) -> Option<f64> {
    if memory_gb <= 0.0 {
        return None;
    }
    // One device per job (resources.devices = 1): the smallest, should there be more.
    let total = devices
        .iter()
        .filter_map(|device| Some(device.gpu.as_ref()?.total_memory_gb.unwrap_or(device.memory_gb)))
        .reduce(f64::min)?;
    if memory_gb >= total {
        return None;
    }
    let context_gb = rlvr_protocol::memory::CUDA_CONTEXT_BYTES as f64 / BYTES_PER_GB;
    // A request too small to hold the context still gets half of itself for tensors.
    Some((memory_gb - context_gb).max(memory_gb / 2.0) / total)
}

/// `PYTORCH_CUDA_ALLOC_CONF` for a worker: the operator's settings (`key:value` pairs, values
/// possibly `[lists]`) with the job's `per_process_memory_fraction` in place of any the operator
/// gave (the job's share is the daemon's to set).
fn cuda_alloc_conf(operator: Option<&str>, fraction: f64) -> String {
    let mut entries: Vec<String> = Vec::new();
    let (mut entry, mut depth) = (String::new(), 0usize);
    for c in operator.unwrap_or_default().chars() {
        match c {
            '[' => depth += 1,
            ']' => depth = depth.saturating_sub(1),
            ',' if depth == 0 => {
                entries.push(std::mem::take(&mut entry));
                continue;
            }
            _ => {}
        }
        entry.push(c);
    }
    entries.push(entry);
    entries.retain(|entry| {
        let key = entry.split(':').next().unwrap_or_default().trim();
        !key.is_empty() && key != MEMORY_FRACTION
    });
    entries.push(format!("{MEMORY_FRACTION}:{fraction}"));
    entries.join(",")
}

/// The `--memory-cap` of a job of `memory_gb` on `devices`, in bytes: its request, or a whole
/// device's memory for 0.
fn memory_cap_bytes(memory_gb: f64, devices: &[InventoryDevice]) -> Option<u64> {
    let gb = if memory_gb > 0.0 {
        memory_gb
    } else {
        devices.iter().map(|device| device.memory_gb).reduce(f64::min)?
    };
    Some((gb * BYTES_PER_GB).round() as u64)
}

/// `spec` asking for `memory_gb` per device, `resident_gb` of it between phases.
fn grown(spec: &PinnedSpec, memory_gb: f64, resident_gb: Option<f64>) -> PinnedSpec {
    let mut grown = spec.clone();
    grown.resources_mut().memory_gb = memory_gb;
    grown.resources_mut().resident_gb = resident_gb;
    grown
}

/// Writes the job's spec (once: the worker checks it never changes under a run).
fn prepare_job_dir(dir: &JobDir, spec: &ServerSpec) -> std::io::Result<()> {
    std::fs::create_dir_all(dir.path())?;
    if !dir.spec().exists() {
        write_json_atomic(&dir.spec(), spec)?;
    }
    Ok(())
}

fn signal(pid: u32, signal: nix::sys::signal::Signal) {
    if pid > 0 {
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), signal);
    }
}

/// Whether the process was ended by `signal`.
fn died_of(status: ExitStatus, signal: nix::sys::signal::Signal) -> bool {
    use std::os::unix::process::ExitStatusExt;
    status.signal() == Some(signal as i32)
}

/// What a worker's exit status, stdout and log say about how it ended.
fn classify(status: ExitStatus, stdout: &str, log: &Path) -> WorkerEnd {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(0), _) => {
            match stdout.lines().rev().find_map(|line| serde_json::from_str::<Outcome>(line).ok()) {
                Some(outcome) => WorkerEnd::Finished(Box::new(outcome)),
                None => WorkerEnd::Crashed("the worker exited 0 without its outcome line".into()),
            }
        }
        (Some(code), _) => match WorkerExit::from_code(code) {
            Some(WorkerExit::Interrupted) => WorkerEnd::Interrupted,
            Some(WorkerExit::JobError) => WorkerEnd::JobError(last_error_line(stdout, log)),
            Some(WorkerExit::OutOfMemory) => {
                WorkerEnd::OutOfMemory(OutOfMemory::from_line(&last_error_line(stdout, log)))
            }
            Some(WorkerExit::Finished | WorkerExit::Transient) | None => WorkerEnd::Crashed(format!(
                "the worker exited with status {code}: {}",
                last_error_line(stdout, log)
            )),
        },
        (None, Some(signal)) => {
            let signal = nix::sys::signal::Signal::try_from(signal);
            let name = signal.map_or_else(|_| status.to_string(), |s| s.to_string());
            // A signal the process raised on itself (an abort, a fault) leaves its reason as the
            // log's last line (`terminate called …`, glibc's `malloc(): …`): the crash says it.
            use nix::sys::signal::Signal::{SIGABRT, SIGBUS, SIGFPE, SIGILL, SIGSEGV};
            if matches!(signal, Ok(SIGABRT | SIGBUS | SIGFPE | SIGILL | SIGSEGV)) {
                WorkerEnd::Crashed(format!(
                    "the worker was killed by {name}: {}",
                    last_error_line(stdout, log)
                ))
            } else {
                WorkerEnd::Crashed(format!("the worker was killed by {name}"))
            }
        }
        (None, None) => WorkerEnd::Crashed("the worker ended without a status".into()),
    }
}

/// The worker's own last word: its [`LastWord`] line on stdout (it gets through when the disk
/// is full), else its log's `rlvr-worker: …` line, else its log's last line.
fn last_error_line(stdout: &str, log: &Path) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let tail: Vec<&str> = text.lines().rev().take(200).collect();
    let said = LastWord::last_in(stdout);
    said.as_deref()
        .or_else(|| tail.iter().find_map(|line| line.strip_prefix("rlvr-worker: ")))
        .or_else(|| tail.first().copied())
        .unwrap_or("no log")
        .chars()
        .take(2000)
        .collect()
}

/// What the supervision of one worker process saw.
struct WorkerWatch {
    pid: u32,
    progress: ProgressWatch,
    /// Killed because its job was cancelled.
    cancelled: bool,
    /// When a worker asked to stop (SIGTERM) is killed if it has not exited.
    stop_deadline: Option<Instant>,
    /// Asked to leave to make room for this job.
    preempted_for: Option<String>,
    /// Killed after its stop deadline.
    killed: bool,
}

impl WorkerWatch {
    fn new(pid: u32, run: RunDir) -> Self {
        WorkerWatch {
            pid,
            progress: ProgressWatch { run, last: None },
            cancelled: false,
            stop_deadline: None,
            preempted_for: None,
            killed: false,
        }
    }
}

/// Follows a run's `progress.json`: the worker's own figures after each step.
struct ProgressWatch {
    run: RunDir,
    last: Option<Progress>,
}

impl ProgressWatch {
    /// The progress, when it changed since the last call.
    fn poll(&mut self) -> Option<Progress> {
        let progress = self.run.read_progress()?;
        if self.last.as_ref() == Some(&progress) {
            return None;
        }
        self.last = Some(progress.clone());
        Some(progress)
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::process::ExitStatusExt;

    use expect_test::expect;

    use super::*;
    use crate::sched::inventory::{ComputeMode, DeviceKind, GpuInfo, MigState};

    #[test]
    fn an_installed_environment_is_its_script_in_the_directory_or_a_sentence_naming_what_is_there() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("arith.py"), "").unwrap();
        std::fs::write(dir.path().join("maze.py"), "").unwrap();
        let python = PathBuf::from("/venv/bin/python");
        let installed = Some((dir.path().to_owned(), python.clone()));
        assert_eq!(
            installed_environment(installed.as_ref(), "arith"),
            Ok((dir.path().join("arith.py"), python))
        );
        assert_eq!(
            installed_environment(installed.as_ref(), "chess"),
            Err("env.environment: no environment \"chess\" is installed here (installed: arith, maze)".into())
        );
        assert_eq!(
            installed_environment(None, "arith"),
            Err("env.environment: this daemon has no installed environments (engines.environments)".into())
        );
    }

    // regression: an operator who started rlvrd with CUDA_VISIBLE_DEVICES=2,3 got jobs on GPU 0
    #[test]
    fn a_worker_gets_its_gpus_by_uuid_whatever_the_daemons_cuda_variables() {
        let daemon = [
            ("PATH", "/usr/bin"),
            ("CUDA_VISIBLE_DEVICES", "2,3"),
            ("CUDA_DEVICE_ORDER", "FASTEST_FIRST"),
            ("CUDA_CACHE_PATH", "/var/cache/cuda"),
            ("RLVR__AUTH__TOKENS", "not for workers"),
        ];
        let gpu = |kind: DeviceKind, uuid: &str, mig: MigState| InventoryDevice {
            kind,
            name: kind.to_string(),
            memory_gb: 40.0,
            gpu: Some(GpuInfo {
                uuid: uuid.to_owned(),
                model: None,
                total_memory_gb: None,
                compute_mode: Some(ComputeMode::Default),
                mig: Some(mig),
            }),
        };
        let cases = [
            vec![gpu(
                DeviceKind::Cuda { index: 2 },
                "GPU-8932f937-d72c-4106-c12f-20bd9faed9f6",
                MigState::Disabled,
            )],
            vec![gpu(
                DeviceKind::Mig { gpu: 3, instance: 1 },
                "MIG-c6d4f1ef-42e4-5de3-91c7-45d71c87eb3f",
                MigState::Instance { parent: "GPU-1".to_owned() },
            )],
            vec![InventoryDevice {
                kind: DeviceKind::Cpu { slot: 0 },
                name: "cpu:0".to_owned(),
                memory_gb: 8.0,
                gpu: None,
            }],
        ];
        let mut shown = String::new();
        for devices in cases {
            let vars = daemon.iter().map(|(name, value)| (name.into(), value.into()));
            let mut environment: Vec<String> = worker_environment(vars, &devices, 0.0)
                .into_iter()
                .map(|(name, value)| format!("{}={}", name.to_string_lossy(), value.to_string_lossy()))
                .collect();
            environment.sort();
            let names: Vec<String> = devices.iter().map(|device| device.kind.to_string()).collect();
            shown.push_str(&format!("{}: {}\n", names.join(","), environment.join(" ")));
        }
        expect![[r#"
            cuda:2: CUDA_CACHE_PATH=/var/cache/cuda CUDA_VISIBLE_DEVICES=GPU-8932f937-d72c-4106-c12f-20bd9faed9f6 PATH=/usr/bin
            cuda:3/mig:1: CUDA_CACHE_PATH=/var/cache/cuda CUDA_VISIBLE_DEVICES=MIG-c6d4f1ef-42e4-5de3-91c7-45d71c87eb3f PATH=/usr/bin
            cpu:0: CUDA_CACHE_PATH=/var/cache/cuda CUDA_VISIBLE_DEVICES= PATH=/usr/bin
        "#]].assert_eq(&shown);
    }

    /// On a GPU a job's `memory_gb` caps libtorch's allocator at its share of the device, after
    /// the operator's own allocator settings (from either variable), whose fraction it replaces;
    /// a whole device, a CPU slot or a request the size of the device get no cap. The
    /// `--memory-cap` is the request, or the whole device's memory.
    #[test]
    fn a_job_on_a_gpu_gets_its_share_of_the_allocator_after_the_operators_settings() {
        let gpu = InventoryDevice {
            kind: DeviceKind::Cuda { index: 0 },
            name: "cuda:0".to_owned(),
            memory_gb: 70.0,
            gpu: Some(GpuInfo {
                uuid: "GPU-1".to_owned(),
                model: None,
                total_memory_gb: Some(80.0),
                compute_mode: Some(ComputeMode::Default),
                mig: Some(MigState::Disabled),
            }),
        };
        let cpu = InventoryDevice {
            kind: DeviceKind::Cpu { slot: 0 },
            name: "cpu:0".to_owned(),
            memory_gb: 8.0,
            gpu: None,
        };
        /// The daemon's variables.
        type Vars = &'static [(&'static str, &'static str)];
        let cases: [(Vars, &InventoryDevice, f64); 7] = [
            (&[], &gpu, 10.0),
            (&[("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")], &gpu, 20.0),
            (
                &[(
                    "PYTORCH_CUDA_ALLOC_CONF",
                    "roundup_power2_divisions:[256:1,512:2],per_process_memory_fraction:0.9, \
                     garbage_collection_threshold:0.6",
                )],
                &gpu,
                40.0,
            ),
            (&[("PYTORCH_ALLOC_CONF", "max_split_size_mb:512")], &gpu, 8.0),
            (&[("PYTORCH_ALLOC_CONF", "max_split_size_mb:512")], &gpu, 0.0),
            (&[], &gpu, 80.0),
            (&[("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")], &cpu, 2.0),
        ];
        let mut shown = String::new();
        for (daemon, device, memory_gb) in cases {
            let vars = daemon.iter().map(|(name, value)| (name.into(), value.into()));
            let mut environment: Vec<String> =
                worker_environment(vars, std::slice::from_ref(device), memory_gb)
                    .into_iter()
                    .filter(|(name, _)| name.to_string_lossy().starts_with("PYTORCH_"))
                    .map(|(name, value)| format!("{}={}", name.to_string_lossy(), value.to_string_lossy()))
                    .collect();
            environment.sort();
            if environment.is_empty() {
                environment.push("(no allocator settings)".to_owned());
            }
            let cap = memory_cap_bytes(memory_gb, std::slice::from_ref(device));
            shown.push_str(&format!(
                "{} {memory_gb} GB, cap {cap:?}: {}\n",
                device.name,
                environment.join(" ")
            ));
        }
        expect![[r#"
            cuda:0 10 GB, cap Some(10737418240): PYTORCH_CUDA_ALLOC_CONF=per_process_memory_fraction:0.11875
            cuda:0 20 GB, cap Some(21474836480): PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True,per_process_memory_fraction:0.24375
            cuda:0 40 GB, cap Some(42949672960): PYTORCH_CUDA_ALLOC_CONF=roundup_power2_divisions:[256:1,512:2], garbage_collection_threshold:0.6,per_process_memory_fraction:0.49375
            cuda:0 8 GB, cap Some(8589934592): PYTORCH_ALLOC_CONF=max_split_size_mb:512 PYTORCH_CUDA_ALLOC_CONF=max_split_size_mb:512,per_process_memory_fraction:0.09375
            cuda:0 0 GB, cap Some(75161927680): PYTORCH_ALLOC_CONF=max_split_size_mb:512
            cuda:0 80 GB, cap Some(85899345920): (no allocator settings)
            cpu:0 2 GB, cap Some(2147483648): PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
        "#]]
        .assert_eq(&shown);
    }

    /// How each way a worker can end is read, from its exit status (`WorkerExit`), its stdout
    /// and the last word in its log: `Crashed` is counted and requeued, `JobError` fails the job.
    #[test]
    fn each_worker_exit_becomes_its_end() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("worker.log");
        std::fs::write(&log, "noise\nrlvr-worker: optimizer.lr: expected a number\n").unwrap();
        let exit = |exit: WorkerExit| ExitStatus::from_raw(i32::from(exit.code()) << 8);
        let outcome = serde_json::to_string(&Outcome { steps: 3, ..Outcome::default() }).unwrap();
        let cases = [
            (exit(WorkerExit::Finished), outcome.as_str(), "Finished"),
            (exit(WorkerExit::Finished), "", "Crashed: the worker exited 0 without its outcome line"),
            (exit(WorkerExit::Interrupted), "", "Interrupted"),
            (exit(WorkerExit::JobError), "", "JobError: optimizer.lr: expected a number"),
            // A grant failure anywhere, a panic: not the job's fault, requeued.
            (
                exit(WorkerExit::Transient),
                "",
                "Crashed: the worker exited with status 70: optimizer.lr: expected a number",
            ),
            (ExitStatus::from_raw(9), "", "Crashed: the worker was killed by SIGKILL"),
            // Its word on stdout wins over the log's (a full disk loses the log's last line).
            (
                exit(WorkerExit::JobError),
                r#"{"last_word":"writing /state/jobs/j/run: No space left on device (os error 28)"}"#,
                "JobError: writing /state/jobs/j/run: No space left on device (os error 28)",
            ),
        ];
        let aborted = tempfile::tempdir().unwrap();
        let abort_log = aborted.path().join("worker.log");
        std::fs::write(&abort_log, "INFO step 3/30\nterminate called without an active exception\n").unwrap();
        assert_eq!(
            classify(ExitStatus::from_raw(6), "", &abort_log),
            WorkerEnd::Crashed(
                "the worker was killed by SIGABRT: terminate called without an active exception".into()
            )
        );
        for (status, stdout, expected) in cases {
            let end = match classify(status, stdout, &log) {
                WorkerEnd::Finished(outcome) => {
                    assert_eq!(outcome.steps, 3);
                    "Finished".to_owned()
                }
                WorkerEnd::Interrupted => "Interrupted".to_owned(),
                WorkerEnd::JobError(why) => format!("JobError: {why}"),
                WorkerEnd::Crashed(why) => format!("Crashed: {why}"),
                other => format!("{other:?}"),
            };
            assert_eq!(end, expected, "{status:?}");
        }
        // Out of memory: not a crash; its report is read back from the worker's last line (a
        // line that is not one leaves the numbers unknown).
        let line = "rlvr-worker: out of memory on cpu in the update phase: peak 1.02 GB (1095761920 bytes), \
                    cap 1.00 GB (1073741824 bytes)";
        std::fs::write(&log, format!("noise\nrlvr-worker: step 3: CUDA out of memory\n{line}\n")).unwrap();
        let expected = OutOfMemory::from_line(line).expect("a report");
        assert_eq!(classify(exit(WorkerExit::OutOfMemory), "", &log), WorkerEnd::OutOfMemory(Some(expected)));
        std::fs::write(&log, "noise\n").unwrap();
        assert_eq!(classify(exit(WorkerExit::OutOfMemory), "", &log), WorkerEnd::OutOfMemory(None));
    }
}
