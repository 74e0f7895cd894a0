//! The job lifecycle on the daemon's side: submit-time checks, the dispatch queues, and the
//! supervision of each job's worker process from admission to its end.
//!
//! - [`submit`]: the submit use case — a spec checked ([`checks`], names resolved by `tenancy`),
//!   its job recorded and its task pushed — for `POST /v1/jobs` and pipelines' stages alike.
//! - [`cancel`]: the cancel use case, for a team's request and a pipeline's.
//! - [`checks`]: what `POST /v1/jobs` checks beyond the spec (plugins, files, budgets).
//! - [`Queues`] (here): the job store plus the per-priority dispatch queues; every (re)queue of a
//!   job goes through [`Queues::enqueue`].
//! - [`supervise`]: one job's run — admission, the worker process, progress, cancel, requeue,
//!   crash counting and dead letters.
//! - [`estimate`]: a submitted job's memory estimate from its models' configs and its data.
//! - [`consumer`]: the apalis workers that fetch dispatch tasks and hand them to `supervise`.
//! - [`gate`]: the gates — the worker's evaluation judged, one criterion at a time (pure).
//! - [`publish`]: the one publish path (a finished job's, an admin's forced promotion): judge,
//!   copy into the model line, manifest, record, webhook.
//! - [`promote`]: the promotion use case — an admin publishes a refused candidate over its
//!   gates — with its own errors (which are permission refusals); the API maps them to statuses.
//! - [`webhook`]: the published manifest POSTed to the job's webhook, retried with backoff.
//! - [`mlflow`]: the job's run in the MLflow server its `[tracking]` names — params, metrics
//!   while it runs, its end and the published files —, a task of its own beside the supervision.
//! - [`out_of_memory`]: a worker that ran out of memory — the larger request, once (pure).
//! - [`paired`]: the held-out gain's paired confidence interval, a seeded bootstrap (pure).
//! - [`tokens`]: the tokens an engine job's ranks grade with, each living as long as its run.
//! - [`retention`]: how many ended jobs' records a team keeps in Redis, and how long.

pub mod cancel;
pub mod checks;
pub mod cluster;
pub mod consumer;
pub mod dataset_output;
pub mod estimate;
pub mod gate;
pub mod mlflow;
pub mod out_of_memory;
pub mod paired;
pub mod promote;
pub mod publish;
pub mod retention;
pub mod submit;
pub mod supervise;
pub mod tokens;
pub mod webhook;

use std::time::Duration;

use rlvr_protocol::spec::Priority;
use rlvr_queue::dispatch::{self, DispatchError};
use rlvr_queue::store::JobStore;

use crate::config::QueueConfig;

/// The job records and the dispatch queues of one Redis.
#[derive(Clone)]
pub struct Queues {
    /// Job records, events, idempotency keys, dead letters.
    pub store: JobStore,
    heartbeat: Duration,
    missed_heartbeats: usize,
}

impl Queues {
    /// Over `store`, with the heartbeat settings of `[queue]`.
    pub fn new(store: JobStore, config: &QueueConfig) -> Self {
        Queues {
            store,
            heartbeat: Duration::from_millis(config.heartbeat_ms),
            missed_heartbeats: config.missed_heartbeats as usize,
        }
    }

    /// The backend settings of a priority class's queue.
    pub fn backend_config(&self, priority: Priority) -> apalis_redis::Config {
        dispatch::config(priority, self.heartbeat, self.missed_heartbeats)
    }

    /// Pushes the dispatch task `task_id` of job `id` (already recorded in the job).
    pub async fn enqueue(&self, id: &str, task_id: &str, priority: Priority) -> Result<(), DispatchError> {
        let config = self.backend_config(priority);
        dispatch::push(&mut self.store.connection(), &config, &[(id.to_owned(), task_id.to_owned())]).await
    }

    /// Whether the backend still holds dispatch task `task_id` (pending, scheduled or running).
    pub async fn task_exists(&self, task_id: &str, priority: Priority) -> Result<bool, redis::RedisError> {
        let config = self.backend_config(priority);
        redis::cmd("HEXISTS")
            .arg(config.job_data_hash())
            .arg(task_id)
            .query_async(&mut self.store.connection())
            .await
    }
}
