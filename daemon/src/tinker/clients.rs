//! Training clients on the daemon's side: each is a process (`rlvr-worker tinker-client`) that
//! the scheduler admits as a job of its team, fed its requests in `seq_id` order, whose answers
//! end the SDK's futures.
//!
//! A client's life, run by one task ([`drive`]):
//! - **queued**: it asks the scheduler for one device (`tinker.memory_gb` of it); its pending
//!   operations answer `try_again` with `paused_capacity` and why;
//! - **running**: admitted, its process loads the base model and the adapter (fresh, from a saved
//!   state, or from its last checkpoint) and runs each command, asking for the device's grant
//!   per command (update for forward/backward and steps, rollout for sampling);
//! - **preempted**: the process writes everything (adapter, AdamW's state, the gradients
//!   accumulated since the last step) and exits; the client is queued again and resumes from
//!   what it wrote — the SDK sees a longer wait;
//! - **parked**: its session's heartbeats stopped for `tinker.idle_release_s`: it is suspended
//!   the same way and its device is released until a request comes;
//! - **crashed**: the process died; it is restarted from its last checkpoint and the
//!   state-changing commands since are run again (in order, their answers already given are not
//!   given twice), then the unanswered ones. A checkpoint is written every
//!   `tinker.checkpoint_every` state-changing commands, which bounds what is run again.
//!   [`MAX_CRASHES`] in a row fail the client's pending operations as the server's.
//!
//! Clients live in this daemon's memory: a session's clients are served by the daemon that
//! created them (the SDK keeps talking to the address it was given).

use std::collections::{HashMap, VecDeque};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rlvr_protocol::spec::Priority;
use rlvr_protocol::tinker::process::{Answer, ClientCommand, ClientEvent};
use rlvr_protocol::tinker::wire::{ErrorCategory, LoraConfig, QueueState};
use rlvr_protocol::worker::TinkerClientArgs;
use rlvr_queue::tinker::TinkerStore;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, info, info_span, warn};

use super::futures::{FutureState, Futures};
use super::order::{Arrival, OrderError, SeqOrder};
use crate::sched::inventory::InventoryDevice;
use crate::sched::policy::Demand;
use crate::sched::service::{Scheduler, Seat};

/// Crashes in a row (no command answered in between) before a client gives up.
pub const MAX_CRASHES: u32 = 3;

/// How often a parked client looks whether its session still is.
const PARKED_SESSION_CHECK: Duration = Duration::from_secs(60);

/// Whether `spec`'s session is there and not finished (a Redis error counts as alive: it is
/// asked again).
async fn session_alive(store: &TinkerStore, spec: &ClientSpec) -> bool {
    match store.session(&spec.session, &spec.team).await {
        Ok(Some(session)) => session.finished.is_none(),
        Ok(None) => false,
        Err(error) => {
            warn!(%error, "cannot read the session's record; will try again");
            true
        }
    }
}

/// How often a running client looks at its session's heartbeats.
const SESSION_CHECK: Duration = Duration::from_secs(5);

/// `[tinker]`'s settings.
#[derive(Debug, Clone, PartialEq)]
pub struct Settings {
    /// What each client asks the scheduler for on its device, in GB.
    pub memory_gb: f64,
    /// A session's heartbeats stopped this long: its clients are suspended and release their
    /// devices.
    pub idle_release: Duration,
    /// State-changing commands between two checkpoints.
    pub checkpoint_every: usize,
    /// Clients (training and sampling) one team may have open at once.
    pub clients_per_team: usize,
}

impl Settings {
    pub fn of(config: &crate::config::TinkerConfig) -> Settings {
        Settings {
            memory_gb: config.memory_gb,
            idle_release: Duration::from_secs(config.idle_release_s),
            checkpoint_every: config.checkpoint_every as usize,
            clients_per_team: config.clients_per_team as usize,
        }
    }
}

/// What starting a client's process takes.
pub struct Launch {
    /// The daemon's worker executable.
    pub worker: PathBuf,
    pub grant_socket: PathBuf,
    pub scheduler: Arc<Scheduler>,
    /// libtorch threads of each process.
    pub threads: usize,
    /// Where each client keeps its checkpoints and its process's log (`ID/`).
    pub clients_dir: PathBuf,
    pub store: TinkerStore,
    pub settings: Settings,
}

/// Where a client's adapter starts.
#[derive(Debug, Clone, PartialEq)]
pub enum Start {
    /// A fresh adapter (LoRA B zero: the base model's outputs).
    Fresh,
    /// A saved state's adapter, with `optimizer` its AdamW state too.
    FromState { dir: PathBuf, optimizer: bool },
}

/// What a client is.
#[derive(Debug, Clone, PartialEq)]
pub struct ClientSpec {
    /// `SESSION:train:N` (a training client) or `SESSION:sampler:N` (a sampler's own process).
    pub id: String,
    pub team: String,
    pub session: String,
    /// The base model as the SDK names it, and where it is (a directory, or `builtin:…`).
    pub base_name: String,
    pub base: String,
    pub lora: LoraConfig,
    pub start: Start,
    /// The first `seq_id` its requests carry.
    pub first_seq: u64,
}

/// A request refused once its turn comes (its `seq_id` is used, so later ones must not wait
/// for it): its future fails with this, in order.
#[derive(Debug, Clone, PartialEq)]
pub struct Refusal {
    pub error: String,
    pub category: ErrorCategory,
}

impl Refusal {
    /// The request's fault.
    pub fn user(error: impl Into<String>) -> Refusal {
        Refusal { error: error.into(), category: ErrorCategory::User }
    }
}

/// A request in its client's `seq_id` order: a command for the process, or a refusal.
enum Queued {
    Run(ClientCommand),
    Refuse { request_id: String, refusal: Refusal },
}

/// An open client.
pub struct Client {
    pub spec: ClientSpec,
    order: Mutex<SeqOrder<Queued>>,
    commands: mpsc::UnboundedSender<ClientCommand>,
    closed: CancellationToken,
}

impl Client {
    /// The scheduler's name for it (apart from jobs' ids).
    fn job(&self) -> String {
        format!("tinker:{}", self.spec.id)
    }
}

/// Why a client could not be opened.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OpenError {
    #[error(
        "team {team} has {open} training and sampling clients open (tinker.clients_per_team); finish a session first"
    )]
    TooMany { team: String, open: usize },
    #[error("the daemon is stopping")]
    Stopping,
    #[error("client {id} is another team's")]
    Taken { id: String },
}

/// Why an operation could not be queued.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SubmitError {
    #[error(transparent)]
    Order(#[from] OrderError),
    #[error(transparent)]
    Full(#[from] super::futures::Full),
}

/// Every open client, and every operation's future.
pub struct Clients {
    launch: Launch,
    pub futures: Futures,
    open: Mutex<HashMap<String, Arc<Client>>>,
    /// What a command's answer is to the SDK when the daemon knows better than the process (a
    /// save's `tinker://` path): by request id, taken when the answer comes.
    answers: Mutex<HashMap<String, serde_json::Value>>,
    stopping: CancellationToken,
}

impl Clients {
    pub fn new(launch: Launch, stopping: CancellationToken) -> Arc<Clients> {
        Arc::new(Clients {
            launch,
            futures: Futures::default(),
            open: Mutex::default(),
            answers: Mutex::default(),
            stopping,
        })
    }

    /// Where client `id` keeps its checkpoints (and its samplers' snapshots).
    pub fn dir(&self, id: &str) -> PathBuf {
        self.launch.clients_dir.join(id)
    }

    /// Request `id`'s answer, once its command succeeds, is `value`.
    pub fn answer_as(&self, id: &str, value: serde_json::Value) {
        self.answers.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).insert(id.to_owned(), value);
    }

    /// The answer for request `id` the process gave as `given`.
    fn answer_for(&self, id: &str, given: Answer) -> Answer {
        match self.answers.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).remove(id) {
            Some(value) => Answer::Json { value },
            None => given,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<Client>>> {
        self.open.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Opens a client and starts its task; the future `opened` ends with `answer` once its process
    /// has loaded (or with the reason it could not). A client of that id already open (a retried
    /// create) is returned as it is, `opened` ended at once; a refusal ends it too.
    pub fn open(
        self: &Arc<Self>,
        spec: ClientSpec,
        opened: &str,
        answer: Answer,
    ) -> Result<Arc<Client>, OpenError> {
        let refused = |error: OpenError| {
            let failed = FutureState::Failed { error: error.to_string(), category: ErrorCategory::User };
            self.futures.set(opened, failed);
            Err(error)
        };
        if self.stopping.is_cancelled() {
            return refused(OpenError::Stopping);
        }
        let mut open = self.lock();
        match open.get(&spec.id) {
            // A retried create: the client is there; its opening answers at once.
            Some(client) if client.spec.team == spec.team => {
                let client = client.clone();
                drop(open);
                self.futures.set(opened, FutureState::Done(answer));
                return Ok(client);
            }
            // Ids hold their session's, which is one team's: never reached, and never replaced.
            Some(_) => return refused(OpenError::Taken { id: spec.id.clone() }),
            None => {}
        }
        let of_team = open.values().filter(|client| client.spec.team == spec.team).count();
        if of_team >= self.launch.settings.clients_per_team {
            drop(open);
            return refused(OpenError::TooMany { team: spec.team.clone(), open: of_team });
        }
        let (commands, receiver) = mpsc::unbounded_channel();
        let client = Arc::new(Client {
            order: Mutex::new(SeqOrder::new(spec.first_seq)),
            spec,
            commands,
            closed: CancellationToken::new(),
        });
        open.insert(client.spec.id.clone(), client.clone());
        drop(open);
        let span = info_span!("tinker_client", client = %client.spec.id, team = %client.spec.team);
        let opened = Some((opened.to_owned(), answer));
        tokio::spawn(drive(self.clone(), client.clone(), receiver, opened).instrument(span));
        Ok(client)
    }

    /// `team`'s open client `id`.
    pub fn get(&self, id: &str, team: &str) -> Option<Arc<Client>> {
        self.lock().get(id).filter(|client| client.spec.team == team).cloned()
    }

    /// Queues request `seq` of `client` (`fingerprint`: its body's hash); `make` makes its
    /// command from the request id, or refuses it (failed in its turn). `answer`: what the SDK
    /// reads once the command succeeds, when the daemon knows better than the process (a save's
    /// path). The id the SDK polls: a new one, or a retry's first (then nothing is made).
    pub fn submit(
        &self,
        client: &Client,
        seq: u64,
        fingerprint: [u8; 32],
        make: impl FnOnce(&str) -> Result<ClientCommand, Refusal>,
        answer: Option<serde_json::Value>,
    ) -> Result<String, SubmitError> {
        let mut order = client.order.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let queued = |id: &str| match make(id) {
            Ok(command) => Queued::Run(command),
            Err(refusal) => Queued::Refuse { request_id: id.to_owned(), refusal },
        };
        match order.arrive(seq, fingerprint, rlvr_queue::dispatch::new_task_id, queued)? {
            Arrival::Again(first) => Ok(first),
            Arrival::New(id) => {
                if let Err(full) = self.futures.open_for(&id, &client.spec.team, Some(&client.job())) {
                    // Not taken: the request goes, so that its retry can come again.
                    let _ = order.forget(seq);
                    return Err(full.into());
                }
                if let Some(value) = answer {
                    self.answer_as(&id, value);
                }
                // Under the order's lock, so that two requests released at once go in order.
                for (_, _, queued) in order.ready() {
                    self.release(client, queued);
                }
                Ok(id)
            }
        }
    }

    /// A request whose turn came: to the client's task, or failed at once.
    fn release(&self, client: &Client, queued: Queued) {
        match queued {
            Queued::Run(command) => {
                let id = command.request_id().map(str::to_owned);
                if client.commands.send(command).is_err()
                    && let Some(id) = id
                {
                    self.closed_under(&id);
                }
            }
            Queued::Refuse { request_id, refusal } => {
                self.answer_for(&request_id, Answer::Json { value: serde_json::Value::Null });
                self.futures.set(
                    &request_id,
                    FutureState::Failed { error: refusal.error, category: refusal.category },
                );
            }
        }
    }

    /// Operation `id` met its client closed.
    fn closed_under(&self, id: &str) {
        self.answer_for(id, Answer::Json { value: serde_json::Value::Null });
        self.futures.set(
            id,
            FutureState::Failed {
                error: "the client was closed (its session finished, or its process could not go on)".into(),
                category: ErrorCategory::Server,
            },
        );
    }

    /// Why operation `id`, given to its client's process, waits: the scheduler's word when the
    /// process is waiting for its device's grant (`waiting for update (1.2 s)`).
    pub fn grant_wait(&self, id: &str) -> Option<String> {
        let state = self.launch.scheduler.grant_state(&self.futures.job_of(id)?)?;
        state.starts_with("waiting").then(|| format!("{state}: the device is serving other jobs' phases"))
    }

    /// Queues `command` (made from its new request id) on `client` now, outside the `seq_id`
    /// order: a sample, which a sampler's own counter numbers.
    pub fn submit_now(
        &self,
        client: &Client,
        command: impl FnOnce(String) -> ClientCommand,
    ) -> Result<String, SubmitError> {
        let id = rlvr_queue::dispatch::new_task_id();
        self.futures.open_for(&id, &client.spec.team, Some(&client.job()))?;
        if client.commands.send(command(id.clone())).is_err() {
            self.closed_under(&id);
        }
        Ok(id)
    }

    /// Closes every client of `team`'s session `session`: their processes are stopped, their
    /// pending operations fail, their checkpoints go.
    pub fn close_session(&self, session: &str, team: &str) {
        let mut open = self.lock();
        open.retain(|_, client| {
            let of_session = client.spec.session == session && client.spec.team == team;
            if of_session {
                client.closed.cancel();
            }
            !of_session
        });
    }

    fn forget(&self, client: &Client) {
        let mut open = self.lock();
        if open.get(&client.spec.id).is_some_and(|c| std::ptr::eq(Arc::as_ptr(c), client)) {
            open.remove(&client.spec.id);
        }
    }
}

/// What a client's task keeps between its processes.
struct Run {
    /// Commands not yet given to a process.
    backlog: VecDeque<ClientCommand>,
    /// Commands given to the process since its last checkpoint (or its start), in order: the
    /// state-changing ones, and the others until answered — what a restart runs again.
    since_checkpoint: Vec<Given>,
    /// Numbers the commands given, for [`Given::no`].
    given: u64,
    /// The last checkpoint (or suspend) written: where the next process starts.
    checkpoint: Option<PathBuf>,
    /// Numbers the checkpoints' directories.
    checkpoints: u64,
    /// The future that ends when the first process has loaded, and its answer.
    opened: Option<(String, Answer)>,
    /// Crashes since a command was last answered.
    crashes: u32,
}

impl Run {
    /// The request ids waiting for a process: those not given to one yet, and the opening.
    fn waiting_ids(&self) -> Vec<String> {
        let backlog = self.backlog.iter().filter_map(|command| command.request_id().map(str::to_owned));
        backlog.chain(self.opened.iter().map(|(id, _)| id.clone())).collect()
    }

    /// After a lost process: what the next one runs before the backlog — the state-changing
    /// commands since the checkpoint, and the unanswered ones, in their order.
    fn replay(&mut self) {
        let again: Vec<ClientCommand> = self
            .since_checkpoint
            .drain(..)
            .filter(|given| given.command.changes_state() || !given.answered)
            .map(|given| given.command)
            .collect();
        for command in again.into_iter().rev() {
            self.backlog.push_front(command);
        }
    }
}

/// A command given to a process.
struct Given {
    /// Its place among every command given to this client's processes.
    no: u64,
    command: ClientCommand,
    answered: bool,
}

/// How a process's time ended.
enum Ended {
    /// Suspended (preempted, or its session idle): everything is in the checkpoint.
    Suspended { preempted: bool },
    /// Died; the run replays what it lost.
    Crashed(String),
    /// The client was closed (its session finished) or the daemon stops.
    Closed,
}

/// A client's task: queue, run, suspend, resume, until it is closed.
async fn drive(
    clients: Arc<Clients>,
    client: Arc<Client>,
    mut commands: mpsc::UnboundedReceiver<ClientCommand>,
    opened: Option<(String, Answer)>,
) {
    let dir = clients.launch.clients_dir.join(&client.spec.id);
    let mut run = Run {
        backlog: VecDeque::new(),
        since_checkpoint: Vec::new(),
        given: 0,
        checkpoint: None,
        checkpoints: 0,
        opened,
        crashes: 0,
    };
    if let Err(error) = std::fs::create_dir_all(&dir) {
        fail_all(&clients, &mut run, &format!("cannot make {}: {error}", dir.display()));
        clients.forget(&client);
        return;
    }
    loop {
        // Parked: nothing to do until a command comes, or its session ends (finished, or its
        // record expired an hour after its last heartbeat: nothing will come for it then).
        while run.backlog.is_empty() && run.opened.is_none() {
            tokio::select! {
                command = commands.recv() => match command {
                    Some(command) => run.backlog.push_back(command),
                    None => break,
                },
                () = client.closed.cancelled() => break,
                () = clients.stopping.cancelled() => break,
                () = tokio::time::sleep(PARKED_SESSION_CHECK) => {
                    if !session_alive(&clients.launch.store, &client.spec).await {
                        break;
                    }
                }
            }
        }
        if run.backlog.is_empty() && run.opened.is_none() {
            break;
        }
        let Some((mut seat, devices)) = admit(&clients, &client, &mut run, &mut commands).await else {
            break;
        };
        match serve(&clients, &client, &mut run, &mut commands, &mut seat, &devices, &dir).await {
            Ended::Suspended { preempted } => {
                info!(preempted, "suspended; the device is released");
                run.crashes = 0;
            }
            Ended::Crashed(why) => {
                run.crashes += 1;
                warn!(crashes = run.crashes, %why, "the client's process died");
                run.replay();
                // A second start, and a third, a moment later: the next may meet what ended the last.
                tokio::time::sleep(Duration::from_secs(u64::from(run.crashes))).await;
                if run.crashes >= MAX_CRASHES {
                    let why =
                        format!("the client's process died {MAX_CRASHES} times in a row; the last: {why}");
                    fail_all(&clients, &mut run, &why);
                    break;
                }
            }
            Ended::Closed => break,
        }
        drop(seat);
    }
    // Closed: what is pending fails (held for an earlier request too); nothing of it is kept.
    clients.forget(&client);
    commands.close();
    run.backlog.extend(commands_left(&mut commands));
    fail_all(
        &clients,
        &mut run,
        "the client was closed (its session finished, or its process could not go on)",
    );
    let held = client.order.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).take_held();
    for (id, _) in held {
        clients.closed_under(&id);
    }
    let _ = std::fs::remove_dir_all(&dir);
    info!("closed");
}

/// Commands still in the channel.
fn commands_left(commands: &mut mpsc::UnboundedReceiver<ClientCommand>) -> Vec<ClientCommand> {
    let mut left = Vec::new();
    while let Ok(command) = commands.try_recv() {
        left.push(command);
    }
    left
}

/// Fails every operation the run still holds.
fn fail_all(clients: &Clients, run: &mut Run, why: &str) {
    let failed = || FutureState::Failed { error: why.to_owned(), category: ErrorCategory::Server };
    let given = run.since_checkpoint.iter().filter_map(|given| given.command.request_id().map(str::to_owned));
    for id in run.waiting_ids().into_iter().chain(given.collect::<Vec<_>>()) {
        clients.futures.set(&id, failed());
        // A save's answer the daemon kept for it goes with it.
        clients.answer_for(&id, Answer::Json { value: serde_json::Value::Null });
    }
    run.backlog.clear();
    run.opened = None;
}

/// Queues the client with the scheduler until it is admitted; its waiting operations say why
/// meanwhile. `None`: closed while it waited.
async fn admit(
    clients: &Clients,
    client: &Client,
    run: &mut Run,
    commands: &mut mpsc::UnboundedReceiver<ClientCommand>,
) -> Option<(Seat, Vec<InventoryDevice>)> {
    let scheduler = &clients.launch.scheduler;
    let demand = Demand {
        job: client.job(),
        team: client.spec.team.clone(),
        priority: Priority::Normal,
        devices: 1,
        memory_gb: Some(clients.launch.settings.memory_gb).filter(|gb| *gb > 0.0),
        resident_gb: None,
        queued_at: scheduler.now_s(),
    };
    let mut seat = match scheduler.enqueue(demand) {
        Ok(seat) => seat,
        Err(error) => {
            fail_all(clients, run, &format!("the scheduler refused the training client: {error}"));
            return None;
        }
    };
    let paused = || FutureState::Waiting {
        queue_state: QueueState::PausedCapacity,
        reason: Some(
            "waiting for a device: the scheduler admits this training client when one has room \
             within the team's share"
                .into(),
        ),
    };
    for id in run.waiting_ids() {
        clients.futures.set(&id, paused());
    }
    let devices = loop {
        tokio::select! {
            devices = seat.admitted() => break devices,
            command = commands.recv() => match command {
                Some(command) => {
                    if let Some(id) = command.request_id() {
                        clients.futures.set(id, paused());
                    }
                    run.backlog.push_back(command);
                }
                None => return None,
            },
            () = client.closed.cancelled() => return None,
            () = clients.stopping.cancelled() => return None,
        }
    };
    let active = || FutureState::Waiting { queue_state: QueueState::Active, reason: None };
    for id in run.waiting_ids() {
        clients.futures.set(&id, active());
    }
    Some((seat, scheduler.inventory_devices(&devices)))
}

/// Starts the client's process and serves commands until it is suspended, dies, or is closed.
async fn serve(
    clients: &Clients,
    client: &Client,
    run: &mut Run,
    commands: &mut mpsc::UnboundedReceiver<ClientCommand>,
    seat: &mut Seat,
    devices: &[InventoryDevice],
    dir: &Path,
) -> Ended {
    let launch = &clients.launch;
    let (start_from, with_optimizer) = match (&run.checkpoint, &client.spec.start) {
        (Some(checkpoint), _) => (Some(checkpoint.clone()), false),
        (None, Start::FromState { dir, optimizer }) => (Some(dir.clone()), *optimizer),
        (None, Start::Fresh) => (None, false),
    };
    let resumed = run.checkpoint.is_some();
    let args = TinkerClientArgs {
        base: client.spec.base.clone(),
        base_name: client.spec.base_name.clone(),
        lora: serde_json::to_string(&client.spec.lora).unwrap_or_default(),
        seed: client.spec.lora.seed.unwrap_or(0),
        resume: start_from.clone().filter(|_| resumed),
        from_state: start_from.filter(|_| !resumed),
        with_optimizer,
        // The process sees only its GPU (CUDA_VISIBLE_DEVICES), as a job's worker does.
        device: Some(
            if devices.iter().any(|device| device.gpu.is_some()) { "cuda" } else { "cpu" }.to_owned(),
        ),
        threads: Some(launch.threads),
        exit_with_parent: Some(std::process::id()),
        grant_socket: Some(launch.grant_socket.clone()),
        job_id: Some(client.job()),
    };
    let log = match std::fs::OpenOptions::new().create(true).append(true).open(dir.join("client.log")) {
        Ok(log) => log,
        Err(error) => {
            return Ended::Crashed(format!("cannot open {}: {error}", dir.join("client.log").display()));
        }
    };
    let mut command = tokio::process::Command::new(&launch.worker);
    command.args(args.command_line());
    command.env_clear().envs(crate::jobs::supervise::worker_environment(
        std::env::vars_os(),
        devices,
        launch.settings.memory_gb,
    ));
    command.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(log).kill_on_drop(true);
    let mut child = match command.spawn() {
        Ok(child) => child,
        Err(error) => {
            warn!(worker = %launch.worker.display(), %error, "cannot start the client's process");
            return Ended::Crashed(format!("the daemon cannot start the client's process: {error}"));
        }
    };
    let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
        return Ended::Crashed("the process has no pipes".into());
    };
    info!(pid = child.id().unwrap_or(0), resumed, "started");
    let mut events = BufReader::new(stdout).lines();
    // Its stdin is written by a task of its own, so that its answers are always read: a process
    // blocked writing a large answer while the daemon blocks writing it the next command would
    // wait forever. A write that fails ends the task; the process's end is seen on its stdout.
    let stdin = writer(stdin);
    // Commands given to the process and not answered, in order.
    let mut in_flight: VecDeque<String> = VecDeque::new();
    // A checkpoint being written: its directory and the number of the first command after it.
    let mut writing: Option<(PathBuf, u64)> = None;
    let mut suspending: Option<(PathBuf, bool)> = None;
    let mut changes = 0usize;
    let mut ready = false;
    let mut session_check = tokio::time::interval(SESSION_CHECK);
    loop {
        // Give the process what is waiting, once it is ready and unless it is leaving.
        while ready && suspending.is_none() {
            let Some(command) = run.backlog.pop_front() else { break };
            if stdin.send(command.clone()).is_err() {
                run.backlog.push_front(command);
                let _ = child.kill().await;
                return Ended::Crashed("the process stopped reading its commands".into());
            }
            if let Some(id) = command.request_id() {
                in_flight.push_back(id.to_owned());
            }
            changes += usize::from(command.changes_state());
            run.given += 1;
            run.since_checkpoint.push(Given { no: run.given, command, answered: false });
            if changes >= launch.settings.checkpoint_every && writing.is_none() {
                run.checkpoints += 1;
                let next = dir.join(format!("checkpoint-{}", run.checkpoints));
                let _ = std::fs::remove_dir_all(&next);
                if stdin.send(ClientCommand::Checkpoint { dir: next.clone() }).is_ok() {
                    writing = Some((next, run.given + 1));
                    changes = 0;
                }
            }
        }
        tokio::select! {
            line = events.next_line() => {
                let line = match line {
                    Ok(Some(line)) => line,
                    Ok(None) | Err(_) => {
                        let status = child.wait().await;
                        let exited = status.as_ref().is_ok_and(|status| status.success());
                        if let Some((checkpoint, preempted)) = suspending.take().filter(|_| exited) {
                            // It ran every command it was given before writing the checkpoint.
                            run.since_checkpoint.clear();
                            adopt(run, checkpoint);
                            return Ended::Suspended { preempted };
                        }
                        let status = status.map_or_else(|e| e.to_string(), |s| s.to_string());
                        return Ended::Crashed(format!("the process ended ({status}); its log: {}", dir.join("client.log").display()));
                    }
                };
                let event: ClientEvent = match serde_json::from_str(&line) {
                    Ok(event) => event,
                    Err(error) => {
                        let _ = child.kill().await;
                        return Ended::Crashed(format!("the process said something that is not an event ({error}): {line}"));
                    }
                };
                match event {
                    ClientEvent::Ready { .. } => {
                        ready = true;
                        if let Some((id, answer)) = run.opened.take() {
                            clients.futures.set(&id, FutureState::Done(answer));
                        }
                    }
                    ClientEvent::Done { request_id, answer } => {
                        answered(run, &mut in_flight, &request_id);
                        let answer = clients.answer_for(&request_id, answer);
                        // A command run again after a crash was answered before: only a new
                        // answer shows the process gets further than the last one did.
                        if clients.futures.set(&request_id, FutureState::Done(answer)) {
                            run.crashes = 0;
                        }
                    }
                    ClientEvent::Failed { request_id, error, category } => {
                        answered(run, &mut in_flight, &request_id);
                        clients.answer_for(&request_id, Answer::Json { value: serde_json::Value::Null });
                        if clients.futures.set(&request_id, FutureState::Failed { error, category }) {
                            run.crashes = 0;
                        }
                    }
                    ClientEvent::Checkpointed => {
                        if let Some((checkpoint, first_after)) = writing.take() {
                            run.since_checkpoint.retain(|given| given.no >= first_after);
                            adopt(run, checkpoint);
                        }
                    }
                    ClientEvent::Suspended => {}
                }
            }
            command = commands.recv(), if suspending.is_none() => match command {
                Some(command) => run.backlog.push_back(command),
                None => {
                    let _ = child.kill().await;
                    return Ended::Closed;
                }
            },
            for_job = seat.preempted(), if suspending.is_none() => {
                info!(for_job = %for_job, "preempted: suspending");
                suspending = suspend(&stdin, dir, run, true);
                if suspending.is_none() {
                    let _ = child.kill().await;
                    return Ended::Crashed("cannot ask the process to suspend".into());
                }
            }
            _ = session_check.tick(), if suspending.is_none() && ready => {
                match launch.store.session(&client.spec.session, &client.spec.team).await {
                    Ok(Some(session)) if session.finished.is_none() => {
                        let quiet_ms = rlvr_queue::store::now_ms().saturating_sub(session.heartbeat_at_ms);
                        let idle = in_flight.is_empty() && run.backlog.is_empty();
                        if idle && quiet_ms > launch.settings.idle_release.as_millis() as u64 {
                            info!(quiet_s = quiet_ms / 1000, "the session's heartbeats stopped: suspending");
                            suspending = suspend(&stdin, dir, run, false);
                            if suspending.is_none() {
                                let _ = child.kill().await;
                                return Ended::Crashed("cannot ask the process to suspend".into());
                            }
                        }
                    }
                    // Finished, or expired: nothing will come for it.
                    Ok(_) => {
                        let _ = child.kill().await;
                        return Ended::Closed;
                    }
                    Err(error) => warn!(%error, "cannot read the session's record; will try again"),
                }
            }
            () = client.closed.cancelled() => {
                let _ = child.kill().await;
                return Ended::Closed;
            }
            () = clients.stopping.cancelled() => {
                let _ = child.kill().await;
                return Ended::Closed;
            }
        }
    }
}

/// Asks the process to write everything to the next checkpoint and exit.
fn suspend(
    stdin: &mpsc::UnboundedSender<ClientCommand>,
    dir: &Path,
    run: &mut Run,
    preempted: bool,
) -> Option<(PathBuf, bool)> {
    run.checkpoints += 1;
    let next = dir.join(format!("checkpoint-{}", run.checkpoints));
    let _ = std::fs::remove_dir_all(&next);
    stdin.send(ClientCommand::Suspend { dir: next.clone() }).ok()?;
    Some((next, preempted))
}

/// `checkpoint` is where the next process starts; the one before it goes.
fn adopt(run: &mut Run, checkpoint: PathBuf) {
    if let Some(old) = run.checkpoint.replace(checkpoint) {
        let _ = std::fs::remove_dir_all(old);
    }
}

/// Marks `id` answered: a command that changes nothing is not run again after a crash, so it
/// goes from the list (a sampler's own process takes no checkpoint to clear it).
fn answered(run: &mut Run, in_flight: &mut VecDeque<String>, id: &str) {
    in_flight.retain(|pending| pending != id);
    run.since_checkpoint
        .retain(|given| given.command.changes_state() || given.command.request_id() != Some(id));
    if let Some(given) = run.since_checkpoint.iter_mut().find(|given| given.command.request_id() == Some(id))
    {
        given.answered = true;
    }
}

/// A task writing each command given to it to the process's stdin, one JSON line each, until
/// the process stops reading (or the sender is dropped).
fn writer(mut stdin: tokio::process::ChildStdin) -> mpsc::UnboundedSender<ClientCommand> {
    let (sender, mut commands) = mpsc::unbounded_channel::<ClientCommand>();
    tokio::spawn(async move {
        while let Some(command) = commands.recv().await {
            let Ok(line) = serde_json::to_string(&command) else { break };
            let written = stdin.write_all((line + "\n").as_bytes()).await;
            if written.is_err() || stdin.flush().await.is_err() {
                break;
            }
        }
    });
    sender
}
