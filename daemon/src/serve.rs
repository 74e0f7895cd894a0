//! `rlvrd serve`: the control plane's main loop.
//!
//! `run` takes the config and a shutdown token, so tests run the whole server in-process. It
//! raises the open-file limit (or refuses to start when `api.max_connections` cannot fit under
//! it), loads the plugins, serves the API (`api::server`), rescans the plugin directories every
//! `plugins.scan_interval_ms`, and tells systemd it is ready and alive (sd_notify). The watchdog
//! is fed from the main loop itself: if the loop stalls, systemd stops getting pings and restarts
//! the daemon.
//!
//! In order: the open-file limit, the worker (`daemon.worker_exe`, else `rlvr-worker` beside
//! `rlvrd`), the book `/docs` serves (`api.docs_dir`, else `book/` above `rlvrd`'s directory), the
//! first plugin scan, bind, the scheduler, then `Services` (the grant socket, the HTTP
//! server, the job consumers); the main loop rescans plugins, pings Redis and feeds the watchdog
//! until the `CancellationToken` fires; then the drain: workers checkpoint, jobs are requeued. The
//! HTTP server stops last, with its own token, so an engine can grade the step it finishes before
//! it checkpoints.
//!
//! Nothing in the main loop blocks: scans run in `spawn_blocking`, Redis pings in their own task;
//! the loop only starts them and feeds the watchdog, so a stalled loop means a stalled daemon.

use std::io;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use sd_notify::NotifyState;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use rlvr_protocol::fs::write_atomic;
use rlvr_queue::pipelines::PipelineStore;
use rlvr_queue::store::JobStore;

use crate::api::auth::{self, Auth};
use crate::api::env_check::EnvChecks;
use crate::api::follow::{self, Readers};
use crate::api::jobs::JobsState;
use crate::api::lanes::{Caps, Lanes, Work};
use crate::api::server::{self as http, FdLimitError};
use crate::api::{AppState, router};
use crate::config::Config;
use crate::doctor::Doctor;
use crate::health::{PING_INTERVAL, RedisHealth};
use crate::jobs::submit::Submitter;
use crate::jobs::supervise::{Engines, Supervisor, SupervisorConfig};
use crate::jobs::{Queues, consumer};
use crate::metrics::Metrics;
use crate::sched::inventory;
use crate::sched::policy::PolicyConfig;
use crate::sched::service::Scheduler;
use crate::state_dir::StateDir;
use rlvr_plugin_host::registry::{Isolation, Registry, RegistryError, ScanSummary};

/// How long a new library may take to load and self-test in the probe process.
pub(crate) const PROBE_TIMEOUT: Duration = Duration::from_secs(30);
/// Files modified more recently than this are left for the next scan: they may still be copied.
const SETTLE: Duration = Duration::from_millis(500);

/// Why the server could not start or stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The state directory could not be created or written.
    #[error("state directory {path}: {source}")]
    StateDir {
        /// The directory.
        path: PathBuf,
        /// The cause.
        source: io::Error,
    },
    /// The plugin registry could not be set up.
    #[error(transparent)]
    Registry(#[from] RegistryError),
    /// The API address could not be bound.
    #[error("api.listen {addr}: cannot listen: {source}")]
    Listen {
        /// The configured address.
        addr: SocketAddr,
        /// The cause.
        source: io::Error,
    },
    /// The HTTP server failed.
    #[error("http server: {0}")]
    Http(io::Error),
    /// `api.max_connections` does not fit under the open-file limit.
    #[error(transparent)]
    FdLimit(#[from] FdLimitError),
    /// The Redis URL could not be used.
    #[error("redis.url: {0}")]
    Redis(rlvr_queue::store::StoreError),
    /// The worker executable (it runs jobs and probes plugins) could not be found.
    #[error("{0}")]
    WorkerExe(String),
    /// `api.docs_dir` holds no built book.
    #[error(transparent)]
    Book(#[from] crate::api::docs::NoBook),
    /// The devices are GPUs and the worker cannot use CUDA (`rlvrd doctor` says why).
    #[error("devices: {0}")]
    Devices(String),
    /// `[outbound]` holds an entry that is not a destination (only a config built in code can:
    /// the validator refuses one from a file), or the client could not be built.
    #[error("outbound: {0}")]
    Outbound(String),
}

/// Runs the daemon until `shutdown` is cancelled.
pub async fn run(config: Config, shutdown: CancellationToken) -> Result<(), ServeError> {
    http::raise_fd_limit(u64::from(config.api.max_connections))?;
    let state_dir = StateDir::new(config.daemon.state_dir.clone());
    std::fs::create_dir_all(state_dir.path())
        .map_err(|source| ServeError::StateDir { path: state_dir.path().to_owned(), source })?;
    // Graders' sandboxes refuse to start without their work directory.
    let grader_work = crate::tenancy::grader_work_dir(&config, &state_dir);
    std::fs::create_dir_all(&grader_work)
        .map_err(|source| ServeError::StateDir { path: grader_work, source })?;
    let metrics = Arc::new(Metrics::new());
    let worker = worker_exe(config.daemon.worker_exe.as_deref())?;
    tracing::info!(worker = %worker.display(), "worker executable");
    let book = served_book(config.api.docs_dir.as_deref())?;
    // Shared by daemons that name the same one: its copies and probe reports are content-addressed.
    let plugin_cache = config.plugins.cache_dir.clone().unwrap_or_else(|| state_dir.plugin_cache());
    let registry = Arc::new(Registry::new(
        plugin_cache,
        Isolation::Subprocess { exe: worker.clone(), timeout: PROBE_TIMEOUT },
        metrics.plugins.clone(),
    )?);
    first_scan(&registry, &config.plugins.dirs).await;
    let listener = TcpListener::bind(config.api.listen)
        .await
        .map_err(|source| ServeError::Listen { addr: config.api.listen, source })?;
    let addr = listener.local_addr().map_err(ServeError::Http)?;
    write_atomic(&state_dir.addr_file(), format!("{addr}\n").as_bytes())
        .map_err(|source| ServeError::StateDir { path: state_dir.path().to_owned(), source })?;
    tracing::info!(%addr, "api listening");
    let scheduler = start_scheduler(&config, &metrics, &worker).await?;
    let parts = Parts { worker, book, listener, registry, metrics, scheduler };
    let mut services = Services::start(&config, &state_dir, parts)?;
    let _ = sd_notify::notify(&[NotifyState::Ready]);
    let outcome = services.main_loop(&config, &shutdown).await;
    services.drain(&config, &shutdown).await;
    let _ = std::fs::remove_file(state_dir.addr_file());
    outcome
}

/// The first scan of the plugin directories, before the API answers.
async fn first_scan(registry: &Arc<Registry>, dirs: &[PathBuf]) {
    let (scanning, scanned) = (registry.clone(), dirs.to_vec());
    let summary = match tokio::task::spawn_blocking(move || scanning.scan(&scanned, Duration::ZERO)).await {
        Ok(summary) => summary,
        Err(error) => {
            // A panic in the scan is a bug of ours; the next scan tries again.
            tracing::error!(%error, "initial plugin scan failed");
            ScanSummary::default()
        }
    };
    tracing::info!(loaded = summary.loaded, refused = summary.refused, dirs = ?dirs, "initial plugin scan finished");
}

/// The client every webhook goes through, under the `[outbound]` policy.
fn outbound_client(config: &Config) -> Result<rlvr_outbound::Client, ServeError> {
    let policy = config.outbound.policy().map_err(|error| ServeError::Outbound(error.to_string()))?;
    tracing::info!(%policy, "outbound policy");
    rlvr_outbound::Client::new(policy, crate::jobs::webhook::client_builder())
        .map_err(|error| ServeError::Outbound(error.to_string()))
}

/// The device inventory (NVML calls block: off the async threads) and the scheduler over it.
/// With GPUs, the worker is asked first whether it can use them ([`Doctor`]); without, what it
/// answers is only logged, off the start's path.
async fn start_scheduler(
    config: &Config,
    metrics: &Arc<Metrics>,
    worker: &std::path::Path,
) -> Result<Arc<Scheduler>, ServeError> {
    let devices = config.devices.clone();
    let inventory = tokio::task::spawn_blocking(move || inventory::discover(&devices))
        .await
        .map_err(|error| ServeError::Http(io::Error::other(error.to_string())))?;
    for note in &inventory.notes {
        tracing::info!("devices: {note}");
    }
    for device in &inventory.devices {
        tracing::info!("device: {device}");
    }
    let names: Vec<&str> = inventory.devices.iter().map(|device| device.name.as_str()).collect();
    tracing::info!(devices = ?names, source = ?inventory.source, "device inventory");
    let gpus =
        inventory.devices.iter().any(|device| matches!(device.kind, inventory::DeviceKind::Cuda { .. }));
    let (asked, examined) = (worker.to_owned(), inventory.clone());
    let doctor = tokio::task::spawn_blocking(move || {
        let doctor = Doctor::examine(&asked, &examined);
        log_doctor(&doctor);
        doctor
    });
    if gpus {
        let doctor = doctor.await.map_err(|error| ServeError::Http(io::Error::other(error.to_string())))?;
        if let Some(problem) = doctor.gpu_problem() {
            return Err(ServeError::Devices(problem));
        }
    }
    let policy_config = PolicyConfig {
        shares: config.scheduler.shares.clone(),
        starvation_after_s: config.scheduler.starvation_after_s as f64,
        fair_share_half_life_s: config.scheduler.fair_share_half_life_s as f64,
    };
    Ok(Scheduler::new(inventory, policy_config, metrics.clone()))
}

/// The worker's libtorch, in the start's log.
fn log_doctor(doctor: &Doctor) {
    match (&doctor.torch, &doctor.torch_error) {
        (Some(torch), _) => tracing::info!(
            libtorch = torch.libtorch_version.as_deref().unwrap_or("unknown"),
            cuda_loaded = torch.cuda_loaded,
            cuda_available = torch.cuda_available,
            cuda_devices = torch.cuda_devices,
            cuda_runtime = torch.cuda_runtime.as_deref().unwrap_or("none"),
            cuda_driver = torch.cuda_driver.as_deref().unwrap_or("none"),
            cudnn = torch.cudnn.as_deref().unwrap_or("none"),
            nccl = torch.nccl.as_deref().unwrap_or("none"),
            cpu_matmul = %torch.cpu_matmul,
            problems = ?torch.problems,
            "worker libtorch"
        ),
        (None, error) => tracing::warn!(
            error = error.as_deref().unwrap_or(""),
            "cannot ask the worker what its libtorch can do"
        ),
    }
}

/// What the services are started from.
struct Parts {
    worker: PathBuf,
    /// The built book `/docs` serves, when there is one.
    book: Option<PathBuf>,
    listener: TcpListener,
    registry: Arc<Registry>,
    metrics: Arc<Metrics>,
    scheduler: Arc<Scheduler>,
}

/// What runs while the daemon serves, and what the shutdown waits for.
struct Services {
    registry: Arc<Registry>,
    redis: Arc<RedisHealth>,
    server: tokio::task::JoinHandle<()>,
    consumer: consumer::Consumer,
    grants: tokio::task::JoinHandle<io::Result<()>>,
    grants_stop: CancellationToken,
    /// Cancelled first on shutdown: workers checkpoint, jobs are requeued, event streams end.
    stopping: CancellationToken,
    /// Cancelled last: the API answers while jobs drain (an engine grades its last step through
    /// it before it can checkpoint; clients see the jobs requeued).
    server_stop: CancellationToken,
}

impl Services {
    /// Starts the grant socket, the HTTP server and the job consumers.
    fn start(config: &Config, state_dir: &StateDir, parts: Parts) -> Result<Services, ServeError> {
        let Parts { worker, book, listener, registry, metrics, scheduler } = parts;
        // Where an engine on this host reaches the API: the listener, by loopback when it listens
        // on every address.
        let mut listener_addr = listener.local_addr().map_err(ServeError::Http)?;
        if listener_addr.ip().is_unspecified() {
            listener_addr.set_ip(match listener_addr {
                std::net::SocketAddr::V4(_) => std::net::Ipv4Addr::LOCALHOST.into(),
                std::net::SocketAddr::V6(_) => std::net::Ipv6Addr::LOCALHOST.into(),
            });
        }
        let grant_socket = state_dir.grant_socket();
        let grants_stop = CancellationToken::new();
        let grants = tokio::spawn(scheduler.clone().serve_grants(grant_socket.clone(), grants_stop.clone()));
        let redis = Arc::new(RedisHealth::new(config.redis.url.clone()));
        // Two Redis connections: the API's (every client's reads, event streams' polls among them)
        // and the daemon's own (taking jobs, heartbeats, progress), which no client load can starve.
        let store = JobStore::connect_lazy(&config.redis.url).map_err(ServeError::Redis)?;
        let queues = Queues::new(store, &config.queue);
        let own_store = JobStore::connect_lazy(&config.redis.url).map_err(ServeError::Redis)?;
        let own_queues = Queues::new(own_store, &config.queue);
        let stopping = CancellationToken::new();
        let tenancy = Arc::new(crate::tenancy::Tenancy::new(config, state_dir));
        let outbound = outbound_client(config)?;
        // Engine jobs' tokens: minted by the supervisor per run, accepted by the API.
        let job_tokens = Arc::new(crate::jobs::tokens::JobTokens::default());
        let auth = Arc::new(Auth::new(
            &config.auth,
            job_tokens.clone(),
            auth::Limits {
                per_team: config.api.rate_limit_per_minute,
                failures_per_address: config.api.auth_failures_per_minute,
                requests_per_team: config.api.requests_per_team,
                sdk_per_team: config.tinker.rate_limit_per_minute,
                sdk_requests_per_team: config.tinker.requests_per_team,
            },
            metrics.api_auth_refusals.clone(),
        ));
        // Ended jobs' records: every team's by age now and then; a team's when one of its jobs ends.
        let retention = crate::jobs::retention::Retention {
            keep_per_team: config.queue.keep_ended_per_team as usize,
            keep_for: Duration::from_secs(u64::from(config.queue.keep_ended_days) * 24 * 3600),
            jobs: state_dir.jobs(),
        };
        tokio::spawn(crate::jobs::retention::run(queues.store.clone(), retention.clone(), stopping.clone()));
        let jobs_state = Arc::new(JobsState {
            queues: queues.clone(),
            registry: registry.clone(),
            stopping: stopping.clone(),
            max_body_bytes: config.api.max_body_bytes as usize,
            scheduler: scheduler.clone(),
            state_dir: state_dir.clone(),
            tenancy: tenancy.clone(),
            outbound: outbound.clone(),
            dry_runs: Lanes::new(
                Caps {
                    at_once: config.api.dry_runs_at_once as usize,
                    per_team: config.api.dry_runs_per_team as usize,
                },
                Work { taking: "dry-run(s) grading", per_team_setting: "api.dry_runs_per_team" },
            ),
            // Half the connections stay for plain requests (and /healthz) whatever streams are open.
            streams: Lanes::new(
                Caps {
                    at_once: (config.api.max_connections / 2) as usize,
                    per_team: config.api.streams_per_team as usize,
                },
                Work { taking: "event stream(s) open", per_team_setting: "api.streams_per_team" },
            ),
            job_readers: Readers::new(queues.store.clone(), follow::EVERY, stopping.clone()),
            pipeline_readers: Readers::new(
                PipelineStore::new(queues.store.connection()),
                follow::EVERY,
                stopping.clone(),
            ),
            dry_run_budget: Duration::from_secs(config.api.dry_run_budget_s),
            submitter: Arc::new(Submitter {
                queues: queues.clone(),
                registry: registry.clone(),
                scheduler: scheduler.clone(),
                tenancy: tenancy.clone(),
                outbound: outbound.clone(),
                trl_python: config.engines.trl_python.clone(),
                vllm_python: config.engines.vllm_python.clone(),
                ray_address: config.engines.ray_address.clone(),
                ray_python: config.engines.ray_python.clone(),
                environments: environments(config),
                checked_records: Arc::default(),
                retention: retention.clone(),
            }),
            env_checks: EnvChecks {
                worker: worker.clone(),
                threads: worker_threads(config.queue.worker_threads),
            },
        });
        // Every daemon drives every running pipeline: a restart takes up where a killed one stopped.
        tokio::spawn(crate::pipelines::drive::run(jobs_state.submitter.clone(), stopping.clone()));
        tokio::spawn(crate::tenancy::sweep::run(
            tenancy.clone(),
            queues.store.clone(),
            PipelineStore::new(queues.store.connection()),
            tenancy.dataset_grace(),
            stopping.clone(),
        ));
        let tinker_store = rlvr_queue::tinker::TinkerStore::new(queues.store.connection());
        let tinker = Arc::new(crate::api::tinker::TinkerState {
            store: tinker_store.clone(),
            tenancy: tenancy.clone(),
            clients: crate::tinker::clients::Clients::new(
                crate::tinker::clients::Launch {
                    worker: worker.clone(),
                    grant_socket: grant_socket.clone(),
                    scheduler: scheduler.clone(),
                    threads: worker_threads(config.queue.worker_threads),
                    clients_dir: state_dir.tinker_clients(),
                    store: tinker_store,
                    settings: crate::tinker::clients::Settings::of(&config.tinker),
                },
                stopping.clone(),
            ),
            samplers: Default::default(),
            root: state_dir.tinker(),
        });
        let app = router(
            AppState { registry: registry.clone(), metrics: metrics.clone(), redis: redis.clone() },
            jobs_state,
            tinker,
            auth,
            book,
            config.api.max_body_bytes as usize,
        );
        let supervisor = Arc::new(Supervisor::new(SupervisorConfig {
            queues: own_queues,
            worker,
            state_dir: state_dir.clone(),
            registry: registry.clone(),
            worker_threads: worker_threads(config.queue.worker_threads),
            max_crashes: config.queue.max_crashes,
            stop_timeout: Duration::from_secs(config.queue.stop_timeout_s),
            scheduler,
            grant_socket,
            preempt_grace: Duration::from_secs(config.scheduler.preempt_grace_s),
            stopping: stopping.clone(),
            tenancy,
            outbound,
            engines: Engines {
                trl_python: config.engines.trl_python.clone(),
                ray_address: config.engines.ray_address.clone(),
                ray_python: config.engines.ray_python.clone(),
                vllm_python: config.engines.vllm_python.clone(),
                environments: environments(config),
                verify_url: format!("http://{listener_addr}/v1/verify"),
                tokens: job_tokens,
            },
            retention,
        }));
        let consumer = consumer::start(supervisor, &config.queue, stopping.clone());
        // Its own token: the shutdown's stops taking work; this one, at `drain`'s end, the API.
        let server_stop = CancellationToken::new();
        let server = tokio::spawn(http::serve(
            listener,
            app,
            http::Limits::new(&config.api),
            metrics,
            server_stop.clone(),
        ));
        Ok(Services { registry, redis, server, consumer, grants, grants_stop, stopping, server_stop })
    }

    /// Until `shutdown` (or the HTTP server fails): rescans plugins, pings Redis, feeds the
    /// systemd watchdog. Nothing here blocks: scans and pings run in their own tasks.
    async fn main_loop(&mut self, config: &Config, shutdown: &CancellationToken) -> Result<(), ServeError> {
        let watchdog = sd_notify::watchdog_enabled().map(|interval| interval / 2);
        let mut last_ping = Instant::now();
        let mut scan: Option<tokio::task::JoinHandle<_>> = None;
        let mut redis_check: Option<tokio::task::JoinHandle<()>> = None;
        let mut last_redis_check: Option<Instant> = None;
        let mut ticker = tokio::time::interval(Duration::from_millis(config.plugins.scan_interval_ms));
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return Ok(()),
                result = &mut self.server => {
                    // The server only returns before shutdown when its task failed.
                    return result.map_err(|join| ServeError::Http(io::Error::other(join.to_string())));
                }
                _ = ticker.tick() => {}
            }
            if scan.as_ref().is_none_or(|handle| handle.is_finished()) {
                let (registry, dirs) = (self.registry.clone(), config.plugins.dirs.clone());
                scan = Some(tokio::task::spawn_blocking(move || registry.scan(&dirs, SETTLE)));
            }
            if redis_check.as_ref().is_none_or(|handle| handle.is_finished())
                && last_redis_check.is_none_or(|at| at.elapsed() >= PING_INTERVAL)
            {
                let redis = self.redis.clone();
                redis_check = Some(tokio::spawn(async move { redis.check().await }));
                last_redis_check = Some(Instant::now());
            }
            if let Some(interval) = watchdog
                && last_ping.elapsed() >= interval
            {
                let _ = sd_notify::notify(&[NotifyState::Watchdog]);
                last_ping = Instant::now();
            }
        }
    }

    /// Stops taking work; running jobs checkpoint and are requeued (within
    /// `queue.stop_timeout_s`); then the grant socket and the HTTP server stop.
    async fn drain(self, config: &Config, shutdown: &CancellationToken) {
        tracing::info!("shutting down: no new jobs; running ones checkpoint and are requeued");
        let _ = sd_notify::notify(&[NotifyState::Stopping]);
        self.stopping.cancel();
        // The supervisors give their workers queue.stop_timeout_s, then kill them; a little more
        // for the requeue writes.
        let drain = Duration::from_secs(config.queue.stop_timeout_s) + Duration::from_secs(10);
        if tokio::time::timeout(drain, self.consumer.stopped()).await.is_err() {
            tracing::warn!("jobs did not drain in time; their tasks come back to the next daemon");
        }
        self.grants_stop.cancel();
        match self.grants.await {
            Ok(Err(error)) => tracing::warn!(%error, "grant socket failed"),
            Err(error) => tracing::warn!(%error, "grant socket task failed"),
            Ok(Ok(())) => {}
        }
        shutdown.cancel();
        self.server_stop.cancel();
        // Finished already when the main loop ended on its failure (and took its result).
        if !self.server.is_finished()
            && let Err(error) = self.server.await
        {
            tracing::warn!(%error, "http server task failed");
        }
    }
}

/// The worker's file name, found next to `rlvrd` when `daemon.worker_exe` is not set.
pub const WORKER_EXE: &str = "rlvr-worker";

/// `daemon.worker_exe`, else `rlvr-worker` next to this executable; it must be a file.
pub fn worker_exe(configured: Option<&std::path::Path>) -> Result<PathBuf, ServeError> {
    let exe = match configured {
        Some(path) => path.to_owned(),
        None => {
            let own = std::env::current_exe().map_err(|error| {
                ServeError::WorkerExe(format!(
                    "cannot find this executable to look for {WORKER_EXE} beside it: {error}"
                ))
            })?;
            own.with_file_name(WORKER_EXE)
        }
    };
    match std::fs::metadata(&exe) {
        Ok(meta) if meta.is_file() => Ok(exe),
        Ok(_) => Err(ServeError::WorkerExe(format!("daemon.worker_exe {}: not a file", exe.display()))),
        Err(error) => Err(ServeError::WorkerExe(format!(
            "the worker executable {}: {error} (install {WORKER_EXE} beside rlvrd, or set daemon.worker_exe)",
            exe.display()
        ))),
    }
}

/// The book `/docs` serves (see [`crate::api::docs::book_dir`]), said in the log either way.
fn served_book(configured: Option<&std::path::Path>) -> Result<Option<PathBuf>, ServeError> {
    // No executable path (a deleted binary): only a configured book can be found.
    let exe = std::env::current_exe().unwrap_or_default();
    let book = crate::api::docs::book_dir(configured, &exe)?;
    match &book {
        Some(dir) => tracing::info!(book = %dir.display(), "the book is served at /docs"),
        None => tracing::info!("no built book beside rlvrd and api.docs_dir not set: /docs answers 404"),
    }
    Ok(book)
}

/// The installed `[env]` environments and their python, when both are configured.
fn environments(config: &Config) -> Option<(PathBuf, PathBuf)> {
    config.engines.environments.clone().zip(config.engines.environments_python.clone())
}

/// libtorch threads per worker: `queue.worker_threads`, or every core.
fn worker_threads(configured: u32) -> usize {
    if configured > 0 {
        configured as usize
    } else {
        std::thread::available_parallelism().map_or(1, std::num::NonZero::get)
    }
}
