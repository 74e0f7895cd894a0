//! The dispatch queues: apalis-redis queues that carry job ids to the daemons that run them
//! (design.md §4). The job record in [`crate::store`] is the truth; a dispatch task only says
//! "job X wants a daemon".
//!
//! How §4's sharp edges are met here:
//! - one queue per priority class (`rlvr:queue:high|normal|low`): the Redis backend ignores a
//!   task's priority;
//! - a job's task id is chosen before the push and recorded in the job first: a push repeated
//!   after a crash lands on the same id, which the backend stores once (`HSETNX`), and a stale
//!   task (an older id than the record's) is dropped by the daemon that fetches it;
//! - bulk pushes go in chunks of [`PUSH_CHUNK`]: more than ~8,000 due tasks at once break the
//!   backend's fetch script;
//! - the backend's own idempotency marker gets a TTL ([`config`]): without one it is deleted at once.

use std::time::Duration;

use apalis_core::task::builder::TaskBuilder;
use apalis_core::task::task_id::TaskId;
use apalis_redis::{Config, RedisTask};
use redis::aio::ConnectionLike;
use serde::{Deserialize, Serialize};

use crate::spec::Priority;
use crate::store::IDEMPOTENCY_TTL;

/// Tasks per push: well under the ~8,000 due tasks at which the backend's fetch script breaks.
pub const PUSH_CHUNK: usize = 1000;

/// What a dispatch task carries.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DispatchTask {
    /// The job to run.
    pub job_id: String,
}

/// Every priority class, most urgent first: the order daemons serve the queues in.
pub const PRIORITIES: [Priority; 3] = [Priority::High, Priority::Normal, Priority::Low];

/// The queue of a priority class.
pub fn queue_name(priority: Priority) -> &'static str {
    match priority {
        Priority::High => "rlvr:queue:high",
        Priority::Normal => "rlvr:queue:normal",
        Priority::Low => "rlvr:queue:low",
    }
}

/// The backend's settings for the queue of `priority`.
///
/// `heartbeat` × `missed_heartbeats` is how long a daemon that died (SIGKILL, power) keeps its
/// tasks before another daemon, or its own restart, takes them back.
pub fn config(priority: Priority, heartbeat: Duration, missed_heartbeats: usize) -> Config {
    Config::default()
        .queue(queue_name(priority))
        .heartbeat_interval(heartbeat)
        .missed_heartbeats(missed_heartbeats)
        .idempotency_ttl(Some(IDEMPOTENCY_TTL))
        // Results are in the job record; the backend need not keep them.
        .persist_results(false)
}

/// A new dispatch task id (a ULID, as the backend's own).
pub fn new_task_id() -> String {
    ulid::Ulid::generate().to_string()
}

/// Why a push failed.
#[derive(Debug, thiserror::Error)]
pub enum DispatchError {
    /// The task could not be encoded.
    #[error("dispatch task: {0}")]
    Encode(#[from] serde_json::Error),
    /// The backend's push failed.
    #[error("dispatch push: {0}")]
    Push(#[from] apalis_redis::Error),
}

/// Pushes `(job id, task id)` pairs to the queue of `priority`, in chunks of [`PUSH_CHUNK`].
pub async fn push<C: ConnectionLike>(
    conn: &mut C,
    config: &Config,
    jobs: &[(String, String)],
) -> Result<(), DispatchError> {
    for chunk in jobs.chunks(PUSH_CHUNK) {
        let tasks = chunk
            .iter()
            .map(|(job_id, task_id)| {
                let args = serde_json::to_vec(&DispatchTask { job_id: job_id.clone() })?;
                Ok(TaskBuilder::new(args)
                    .task_id(TaskId::from_string(task_id.clone()))
                    // The backend's retries are off: the daemon's crash counter is the one policy.
                    .max_attempts(1)
                    .build())
            })
            .collect::<Result<Vec<RedisTask>, serde_json::Error>>()?;
        apalis_redis::queries::push_tasks(conn, config, &tasks).await?;
    }
    Ok(())
}
