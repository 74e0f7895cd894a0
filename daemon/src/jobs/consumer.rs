//! Fetches dispatch tasks off the per-priority queues (apalis-redis) and hands each to the
//! supervisor, which holds the task until the job ends or is requeued.
//!
//! design.md §4, edge by edge:
//! - **Poll interval**: a push lands in the backend's scheduled set; an idle worker sees it at its
//!   next poll, every `queue.poll_interval_ms` (`poll_with_interval`).
//! - **Unique worker names**: `<host>-<pid>-<start ms>-<priority>`, new for every (re)start, so a
//!   restart within the heartbeat window registers.
//! - **No blocking in handlers**: the handler only awaits (the worker is a child process; file
//!   reads of the gate run on `spawn_blocking`), so heartbeats never stop while a job trains.
//! - **Crash counter and one retry policy**: in [`super::supervise`]; the handler always
//!   returns `Ok` and the backend retries nothing.
//! - **Recovery sweep** ([`sweep`]): at start and every [`SWEEP_INTERVAL`], a queued job whose
//!   current task the backend does not hold (a daemon killed between recording a job and pushing
//!   its task) is pushed again.
//!
//! Beside the workers runs the promoter of due tasks (`rlvr_queue::dispatch::promote_due`), and
//! the recovery sweep also forgets finished tasks' backend records
//! (`rlvr_queue::dispatch::forget_done`).

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use apalis_core::backend::ext::BackendExt;
use apalis_core::error::BoxDynError;
use apalis_core::task::data::Data;
use apalis_core::task::task_id::TaskId;
use apalis_core::worker::builder::WorkerBuilder;
use apalis_redis::RedisStorage;
use rlvr_protocol::job::JobState;
use rlvr_protocol::spec::Priority;
use rlvr_queue::dispatch::{DispatchTask, PRIORITIES, PUSH_CHUNK};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::supervise::Supervisor;
use crate::config::QueueConfig;

/// How often due dispatch tasks are moved to the active lists, ahead of the backend's fetch.
const PROMOTE_INTERVAL: Duration = Duration::from_millis(100);
/// How often queued jobs are checked for a missing dispatch task.
const SWEEP_INTERVAL: Duration = Duration::from_secs(30);
/// Jobs a daemon takes off each priority's queue at once, admitted or waiting for admission:
/// enough for the scheduler to pack devices and rank what waits, few enough that one daemon
/// does not hold a shared queue's jobs away from others.
const JOBS_IN_HAND: usize = 32;

/// The running consumers; [`Consumer::stopped`] resolves when every one has drained.
pub struct Consumer {
    tasks: JoinSet<()>,
    supervisor: Arc<Supervisor>,
}

impl Consumer {
    /// Waits until every queue's worker has stopped and its handlers have returned, and every
    /// supervision has ended — also those whose handler a worker rebuilt after a Redis error
    /// dropped.
    pub async fn stopped(mut self) {
        while self.tasks.join_next().await.is_some() {}
        self.supervisor.supervisions_ended().await;
    }
}

/// Starts one apalis worker per priority class, and the recovery sweep, until `stopping`.
pub fn start(supervisor: Arc<Supervisor>, config: &QueueConfig, stopping: CancellationToken) -> Consumer {
    let mut tasks = JoinSet::new();
    let consumer_supervisor = supervisor.clone();
    let poll = Duration::from_millis(config.poll_interval_ms);
    let in_flight = JOBS_IN_HAND;
    for priority in PRIORITIES {
        let supervisor = supervisor.clone();
        let stopping = stopping.clone();
        tasks.spawn(async move { consume(priority, supervisor, poll, in_flight, stopping).await });
    }
    let promoter = supervisor.clone();
    let promote_stop = stopping.clone();
    tasks.spawn(async move {
        loop {
            for priority in PRIORITIES {
                let config = promoter.queues.backend_config(priority);
                let mut conn = promoter.queues.store.connection();
                // Until a chunk comes back short: the backlog is moved.
                while let Ok(moved) = rlvr_queue::dispatch::promote_due(&mut conn, &config, PUSH_CHUNK).await
                {
                    if moved < PUSH_CHUNK {
                        break;
                    }
                }
            }
            tokio::select! {
                _ = tokio::time::sleep(PROMOTE_INTERVAL) => {}
                _ = promote_stop.cancelled() => return,
            }
        }
    });
    let sweeper = supervisor.clone();
    let sweep_stop = stopping.clone();
    tasks.spawn(async move {
        loop {
            if let Err(error) = sweep(&sweeper).await {
                warn!(%error, "recovery sweep failed; trying again later");
            }
            for priority in PRIORITIES {
                let config = sweeper.queues.backend_config(priority);
                let mut conn = sweeper.queues.store.connection();
                let keep = rlvr_queue::dispatch::KEEP_DONE;
                match rlvr_queue::dispatch::forget_done(&mut conn, &config, keep).await {
                    Ok(0) => {}
                    Ok(forgotten) => {
                        info!(forgotten, priority = ?priority, "finished dispatch tasks forgotten")
                    }
                    Err(error) => warn!(%error, "cannot forget finished dispatch tasks now"),
                }
            }
            tokio::select! {
                _ = tokio::time::sleep(SWEEP_INTERVAL) => {}
                _ = sweep_stop.cancelled() => return,
            }
        }
    });
    Consumer { tasks, supervisor: consumer_supervisor }
}

/// Runs the worker of one queue, rebuilding it (with a new name) whenever it stops on an error,
/// e.g. Redis going away; returns when `stopping` fires and its handlers have returned.
async fn consume(
    priority: Priority,
    supervisor: Arc<Supervisor>,
    poll: Duration,
    in_flight: usize,
    stopping: CancellationToken,
) {
    const FIRST_DELAY: Duration = Duration::from_millis(200);
    let mut delay = FIRST_DELAY;
    while !stopping.is_cancelled() {
        let name = worker_name(priority);
        let config = supervisor.queues.backend_config(priority).batch_size(in_flight.max(1));
        let storage =
            RedisStorage::<DispatchTask, _>::new(supervisor.queues.store.connection()).with_config(config);
        let worker = WorkerBuilder::new(name.clone())
            .backend(storage.poll_with_interval(poll))
            .data(supervisor.clone())
            .layer(tower::limit::ConcurrencyLimitLayer::new(in_flight.max(1)))
            .build(handle);
        info!(worker = %name, queue = rlvr_queue::dispatch::queue_name(priority), "consuming");
        let stop = stopping.clone();
        let started = std::time::Instant::now();
        let outcome = worker
            .run_until(async move {
                stop.cancelled().await;
                Ok::<(), std::io::Error>(())
            })
            .await;
        match outcome {
            Ok(()) => return,
            Err(error) => {
                warn!(worker = %name, %error, "queue worker stopped; restarting it");
                // A worker that ran a while is a new failure, not the same one again: without
                // this the delay stayed at its 5 s cap for the daemon's life, the queue unread
                // that long at every later restart.
                if started.elapsed() > Duration::from_secs(30) {
                    delay = FIRST_DELAY;
                }
                tokio::select! {
                    _ = tokio::time::sleep(delay) => {}
                    _ = stopping.cancelled() => return,
                }
                delay = (delay * 2).min(Duration::from_secs(5));
            }
        }
    }
}

/// The handler: the job runs to its end (or a requeue) under this task; never an error, so the
/// backend completes the task and retries nothing.
///
/// The supervision runs on a task of its own ([`Supervisor::supervise`]): when Redis goes away the
/// backend's worker stops and drops its handlers, and that must not stop a training job. The task
/// comes back to the rebuilt worker once the old one's heartbeats have lapsed, and its handler
/// then waits for the supervision still under way ([`Supervisor::handle`]) before acknowledging
/// it; a stop before then still waits for it ([`Consumer::stopped`]).
async fn handle(
    task: DispatchTask,
    id: TaskId,
    supervisor: Data<Arc<Supervisor>>,
) -> Result<(), BoxDynError> {
    let _ = supervisor.supervise(task.job_id, id.to_string()).await;
    Ok(())
}

/// `<host>-<pid>-<start ms>-<priority>`: unique per process and start.
fn worker_name(priority: Priority) -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    let host = host.trim();
    let ms = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis());
    let class = rlvr_queue::dispatch::queue_name(priority).rsplit(':').next().unwrap_or("normal");
    format!("{}-{}-{ms}-{class}", if host.is_empty() { "host" } else { host }, std::process::id())
}

/// Pushes again the task of every queued job whose task the backend does not hold.
pub async fn sweep(supervisor: &Supervisor) -> Result<usize, rlvr_queue::store::StoreError> {
    let store = &supervisor.queues.store;
    let mut pushed = 0;
    for id in store.ids_in_state(JobState::Queued, usize::MAX).await? {
        let Some(task_id) = store.task_id(&id).await? else { continue };
        let job = store.get(&id).await?;
        let priority = job.priority;
        if supervisor.queues.task_exists(&task_id, priority).await? {
            continue;
        }
        warn!(job = %id, task = %task_id, "queued job without its dispatch task; pushing it again");
        if let Err(error) = supervisor.queues.enqueue(&id, &task_id, priority).await {
            warn!(job = %id, %error, "cannot push it yet");
        } else {
            pushed += 1;
        }
    }
    Ok(pushed)
}
