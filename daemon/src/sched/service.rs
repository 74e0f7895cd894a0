//! The live scheduler of `rlvrd serve`: the [`Policy`] over this daemon's inventory, driven by the
//! jobs' supervisors (admission, leaving) and by the workers' grant requests on a local socket.
//!
//! Every event takes the lock, updates the policy, and settles its decisions at once: an
//! admission wakes its supervisor, a grant answers its worker, a preemption tells the victim's
//! supervisor to have its worker checkpoint and leave. Nothing waits while holding the lock.
//!
//! Grant protocol (one JSON object per line, on `<state_dir>/sched.sock`, mode 0600):
//! ```text
//! worker → {"job": "ID"}                daemon → {"ok": true} | {"error": "..."}
//! worker → {"acquire": "rollout"}       daemon → {"granted": "rollout"}     (when granted)
//! worker → {"release": true}            daemon → {"released": true}
//! ```
//! A connection that closes returns its grant and drops its request: a worker that dies never
//! holds a device.
//!
//! Busy time, waits and preemptions go to `/metrics`.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::{oneshot, watch};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::inventory::{Inventory, InventoryDevice};
use rlvr_protocol::spec::JobSpec;

use super::policy::{Decision, Demand, FitProblem, Phase, Policy, PolicyConfig, PolicyError};
use crate::metrics::{DeviceLabel, Metrics, PriorityLabel};

pub use rlvr_protocol::grants::{Answer, Request, SOCKET_FILE};

/// The live scheduler.
pub struct Scheduler {
    inventory: Inventory,
    started: Instant,
    metrics: Arc<Metrics>,
    state: Mutex<State>,
}

struct State {
    policy: Policy,
    jobs: HashMap<String, Seated>,
    /// Per device: since when it serves a grant.
    busy_since: Vec<Option<Instant>>,
}

/// What the scheduler keeps for a job it knows.
struct Seated {
    priority: rlvr_protocol::spec::Priority,
    queued: Instant,
    admitted: Option<oneshot::Sender<Vec<usize>>>,
    granted: Option<oneshot::Sender<()>>,
    /// The job it must make room for, once preempted.
    preempted: watch::Sender<Option<String>>,
    /// Phase asked for and since when; for `grant_state`.
    asking: Option<(Phase, Instant)>,
    holding: Option<Phase>,
}

impl Scheduler {
    pub fn new(inventory: Inventory, config: PolicyConfig, metrics: Arc<Metrics>) -> Arc<Self> {
        let devices = inventory.policy_devices();
        let busy_since = vec![None; devices.len()];
        for device in &devices {
            let _ = metrics.device_busy_seconds.get_or_create(&DeviceLabel { device: device.name.clone() });
        }
        Arc::new(Scheduler {
            inventory,
            started: Instant::now(),
            metrics,
            state: Mutex::new(State {
                policy: Policy::new(devices, config),
                jobs: HashMap::new(),
                busy_since,
            }),
        })
    }

    /// Why a job asking for this could never run here; `Ok` when it can.
    pub fn can_ever_fit(&self, demand: &Demand) -> Result<(), FitProblem> {
        self.lock().policy.can_ever_fit(demand)
    }

    /// What a job of `spec` asks the policy for, queued `age` ago.
    pub fn demand(&self, id: &str, spec: &JobSpec, age: Duration) -> Demand {
        let memory = spec.resources.memory_gb;
        Demand {
            job: id.to_owned(),
            team: spec.job.team.clone(),
            priority: spec.job.priority,
            devices: spec.resources.devices,
            // 0 (unset, and submit could not estimate it): whole devices.
            memory_gb: (memory > 0.0).then_some(memory),
            // A CPU worker keeps what libtorch frees for its lifetime (the worker's
            // `keep_freed_memory`), so after its first step it holds its peak between phases too:
            // on CPU slots a job's resident part is all of its memory_gb.
            resident_gb: match self.device_kind() {
                rlvr_protocol::memory::DeviceKind::Cuda => spec.resources.resident_gb,
                rlvr_protocol::memory::DeviceKind::Cpu => None,
            },
            queued_at: self.now() - age.as_secs_f64(),
        }
    }

    /// Seconds on the policy's clock: a demand's `queued_at` now.
    pub fn now_s(&self) -> f64 {
        self.now()
    }

    /// Seconds on the policy's clock.
    fn now(&self) -> f64 {
        self.started.elapsed().as_secs_f64()
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Queues a job for admission. Dropping the [`Seat`] (at any time) takes the job out.
    pub fn enqueue(self: &Arc<Self>, demand: Demand) -> Result<Seat, PolicyError> {
        let (admitted_tx, admitted_rx) = oneshot::channel();
        let (preempted_tx, preempted_rx) = watch::channel(None);
        let job = demand.job.clone();
        let mut state = self.lock();
        let seated = Seated {
            priority: demand.priority,
            queued: Instant::now(),
            admitted: Some(admitted_tx),
            granted: None,
            preempted: preempted_tx,
            asking: None,
            holding: None,
        };
        state.policy.enqueue(demand, self.now())?;
        state.jobs.insert(job.clone(), seated);
        self.settle(&mut state);
        Ok(Seat { scheduler: self.clone(), job, admitted: Some(admitted_rx), preempted: preempted_rx })
    }

    /// Takes a job out: it stopped waiting, ended, or left.
    fn leave(&self, job: &str) {
        let mut state = self.lock();
        let now = Instant::now();
        self.stop_busy(&mut state, job, now);
        state.policy.leave(job, self.now());
        state.jobs.remove(job);
        self.settle(&mut state);
    }

    /// A worker asks for its job's devices for `phase`; the receiver fires when granted.
    fn acquire(&self, job: &str, phase: Phase) -> Result<oneshot::Receiver<()>, String> {
        let mut state = self.lock();
        let (sender, receiver) = oneshot::channel();
        let now = self.now();
        let seated = state.jobs.get_mut(job).ok_or_else(|| format!("job {job} is not admitted here"))?;
        seated.granted = Some(sender);
        seated.asking = Some((phase, Instant::now()));
        state.policy.request(job, phase, now).map_err(|error| error.to_string())?;
        self.settle(&mut state);
        if state.policy.is_waiting_for_grant(job) {
            self.metrics.grant_waits.inc();
        }
        Ok(receiver)
    }

    /// A worker is done with its grant, or stops asking.
    fn release(&self, job: &str) {
        let mut state = self.lock();
        self.stop_busy(&mut state, job, Instant::now());
        if let Some(seated) = state.jobs.get_mut(job) {
            seated.granted = None;
            seated.asking = None;
            seated.holding = None;
        }
        state.policy.release(job, self.now());
        self.settle(&mut state);
    }

    /// `waiting for rollout (1.2 s)` or `holding update`, for a job running here.
    pub fn grant_state(&self, job: &str) -> Option<String> {
        let state = self.lock();
        let seated = state.jobs.get(job)?;
        if let Some(phase) = seated.holding {
            return Some(format!("holding {phase}"));
        }
        seated
            .asking
            .map(|(phase, since)| format!("waiting for {phase} ({:.1} s)", since.elapsed().as_secs_f64()))
    }

    /// What a job's memory estimate counts this daemon's devices as: CUDA when it has a GPU.
    pub fn device_kind(&self) -> rlvr_protocol::memory::DeviceKind {
        let gpu = self.inventory.devices.iter().any(|device| device.gpu.is_some());
        if gpu { rlvr_protocol::memory::DeviceKind::Cuda } else { rlvr_protocol::memory::DeviceKind::Cpu }
    }

    /// The inventory's devices for the worker of an admitted job.
    pub fn inventory_devices(&self, indexes: &[usize]) -> Vec<InventoryDevice> {
        indexes.iter().map(|&d| self.inventory.devices[d].clone()).collect()
    }

    /// Applies the policy's decisions until it has none: admissions and grants go to whoever
    /// waits for them (one nobody waits for any more is undone), preemptions to the victims.
    fn settle(&self, state: &mut State) {
        loop {
            let decisions = state.policy.decide(self.now());
            if decisions.is_empty() {
                break;
            }
            for decision in decisions {
                match decision {
                    Decision::Admit { job, devices } => {
                        let sender = state.jobs.get_mut(&job).and_then(|seated| seated.admitted.take());
                        let waited =
                            state.jobs.get(&job).map(|seated| (seated.queued.elapsed(), seated.priority));
                        match sender.map(|sender| sender.send(devices)) {
                            Some(Ok(())) => {
                                if let Some((waited, priority)) = waited {
                                    let label = PriorityLabel { priority: priority.as_str() };
                                    self.metrics
                                        .queue_wait_seconds
                                        .get_or_create(&label)
                                        .observe(waited.as_secs_f64());
                                }
                            }
                            _ => {
                                state.policy.leave(&job, self.now());
                                state.jobs.remove(&job);
                            }
                        }
                    }
                    Decision::Grant { job, phase } => {
                        let sender = state.jobs.get_mut(&job).and_then(|seated| seated.granted.take());
                        if sender.is_some_and(|sender| sender.send(()).is_ok()) {
                            if let Some(seated) = state.jobs.get_mut(&job) {
                                seated.asking = None;
                                seated.holding = Some(phase);
                            }
                            let devices =
                                state.policy.devices_of(&job).map(<[usize]>::to_vec).unwrap_or_default();
                            let now = Instant::now();
                            for device in devices {
                                state.busy_since[device] = Some(now);
                            }
                        } else {
                            state.policy.release(&job, self.now());
                        }
                    }
                    Decision::Preempt { job, for_job } => {
                        if let Some(seated) = state.jobs.get(&job) {
                            info!(job = %job, for_job = %for_job, "preempting");
                            self.metrics
                                .preemptions
                                .get_or_create(&PriorityLabel { priority: seated.priority.as_str() })
                                .inc();
                            let _ = seated.preempted.send(Some(for_job));
                        }
                    }
                }
            }
        }
        self.metrics.grants_waiting.set(state.policy.grants_waiting() as i64);
    }

    /// Adds the time since a job's grant began to its devices' busy time.
    fn stop_busy(&self, state: &mut State, job: &str, now: Instant) {
        let Some(devices) = state.policy.devices_of(job).map(<[usize]>::to_vec) else { return };
        let holding = state.jobs.get(job).is_some_and(|seated| seated.holding.is_some());
        if !holding {
            return;
        }
        for device in devices {
            if let Some(since) = state.busy_since[device].take() {
                let name = self.inventory.devices[device].kind.to_string();
                let busy = now.duration_since(since).as_secs_f64();
                self.metrics.device_busy_seconds.get_or_create(&DeviceLabel { device: name }).inc_by(busy);
            }
        }
    }

    /// Serves the grant protocol on `path` until `stop` fires.
    pub async fn serve_grants(
        self: Arc<Self>,
        path: PathBuf,
        stop: CancellationToken,
    ) -> std::io::Result<()> {
        let _ = std::fs::remove_file(&path);
        let listener = UnixListener::bind(&path)?;
        restrict_to_owner(&path)?;
        loop {
            let accepted = tokio::select! {
                accepted = listener.accept() => accepted,
                _ = stop.cancelled() => break,
            };
            match accepted {
                Ok((stream, _)) => {
                    let scheduler = self.clone();
                    tokio::spawn(async move { scheduler.serve_worker(stream).await });
                }
                Err(error) => {
                    warn!(%error, "grant socket: accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
        let _ = std::fs::remove_file(&path);
        Ok(())
    }

    /// One worker's connection: its job first, then acquire/release until it closes.
    async fn serve_worker(self: Arc<Self>, stream: UnixStream) {
        let (read, mut write) = stream.into_split();
        let mut lines = BufReader::new(read).lines();
        let mut job: Option<String> = None;
        loop {
            let line = match lines.next_line().await {
                Ok(Some(line)) => line,
                Ok(None) | Err(_) => break,
            };
            let answer = match (serde_json::from_str::<Request>(&line), &job) {
                (Ok(Request::Job(id)), None) => {
                    if self.lock().jobs.contains_key(&id) {
                        job = Some(id);
                        Answer::Ok
                    } else {
                        Answer::Error(format!("job {id} is not admitted here"))
                    }
                }
                (Ok(Request::Acquire(phase)), Some(id)) => match self.acquire(id, phase) {
                    Ok(granted) => {
                        // The worker waits; so does this connection. A closed connection (the
                        // worker died) ends the wait through the read side below.
                        let closed = lines.next_line();
                        tokio::select! {
                            result = granted => match result {
                                Ok(()) => Answer::Granted(phase),
                                Err(_) => Answer::Error("the job left before its grant".to_owned()),
                            },
                            next = closed => {
                                // Anything but a release while waiting is a protocol error; all
                                // of them end the request.
                                self.release(id);
                                match next {
                                    Ok(Some(line)) if matches!(serde_json::from_str(&line), Ok(Request::Release)) => {
                                        Answer::Released
                                    }
                                    Ok(Some(_)) => Answer::Error("expected a release while waiting".to_owned()),
                                    _ => break,
                                }
                            }
                        }
                    }
                    Err(message) => Answer::Error(message),
                },
                (Ok(Request::Release), Some(id)) => {
                    self.release(id);
                    Answer::Released
                }
                (Ok(_), _) => {
                    Answer::Error("expected {\"job\": ID} first, then acquire and release".to_owned())
                }
                (Err(error), _) => Answer::Error(format!("not a grant request: {error}")),
            };
            let mut text = serde_json::to_string(&answer).unwrap_or_default();
            text.push('\n');
            if write.write_all(text.as_bytes()).await.is_err() {
                break;
            }
        }
        if let Some(id) = job {
            // A closed connection returns what it held.
            if self.lock().jobs.contains_key(&id) {
                self.release(&id);
            }
        }
    }
}

fn restrict_to_owner(path: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
}

/// A job's place with the scheduler, from its queueing to its leaving; dropping it takes the
/// job out (stops waiting, or frees its devices and grant).
pub struct Seat {
    scheduler: Arc<Scheduler>,
    job: String,
    admitted: Option<oneshot::Receiver<Vec<usize>>>,
    preempted: watch::Receiver<Option<String>>,
}

impl Seat {
    /// Waits for admission; the devices (inventory indexes). Cancel-safe: a wait cut short
    /// (a `select!`) keeps the seat's place, and the next call goes on waiting.
    pub async fn admitted(&mut self) -> Vec<usize> {
        if let Some(receiver) = &mut self.admitted {
            match receiver.await {
                Ok(devices) => {
                    self.admitted = None;
                    return devices;
                }
                // The scheduler drops the sender only when the seat leaves: not while it waits.
                Err(_) => std::future::pending::<()>().await,
            }
        }
        self.scheduler.lock().policy.devices_of(&self.job).map(<[usize]>::to_vec).unwrap_or_default()
    }

    /// Resolves with the job to make room for once this job is preempted.
    pub async fn preempted(&mut self) -> String {
        loop {
            if let Some(for_job) = self.preempted.borrow_and_update().clone() {
                return for_job;
            }
            if self.preempted.changed().await.is_err() {
                std::future::pending::<()>().await;
            }
        }
    }
}

impl Drop for Seat {
    fn drop(&mut self) {
        self.scheduler.leave(&self.job);
    }
}
