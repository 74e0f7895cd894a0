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
//! - bulk pushes go in chunks of [`PUSH_CHUNK`], and [`promote_due`] moves due tasks to the
//!   active list in chunks: the backend's fetch script breaks at 8,000 due tasks at once;
//! - the backend's own idempotency marker gets a TTL ([`config`]): without one it is deleted at once.

use std::time::Duration;

use apalis_core::task::builder::TaskBuilder;
use apalis_core::task::task_id::TaskId;
use apalis_redis::{Config, RedisTask};
use redis::aio::ConnectionLike;
use serde::{Deserialize, Serialize};

use crate::store::IDEMPOTENCY_TTL;
use rlvr_protocol::spec::Priority;

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
    // persist_results stays on: without it the backend never acks a task, which then stays in
    // the worker's inflight set and comes back after every restart.
}

/// Moves up to `chunk` due tasks of a queue from its scheduled set to its active list; returns
/// how many. The backend's fetch script moves *all* due tasks with one `RPUSH unpack(...)`, which
/// fails at 8,000 (measured: 7,999 work), killing every worker on its first fetch; moving them in
/// bounded chunks ahead of it keeps the fetch's share small.
pub async fn promote_due<C: ConnectionLike>(
    conn: &mut C,
    config: &Config,
    chunk: usize,
) -> redis::RedisResult<usize> {
    static PROMOTE: std::sync::LazyLock<redis::Script> = std::sync::LazyLock::new(|| {
        redis::Script::new(
            r#"
local ids = redis.call('ZRANGEBYSCORE', KEYS[1], 0, ARGV[1], 'LIMIT', 0, tonumber(ARGV[2]))
if #ids > 0 then
  redis.call('RPUSH', KEYS[2], unpack(ids))
  redis.call('ZREM', KEYS[1], unpack(ids))
end
return #ids
"#,
        )
    });
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    PROMOTE
        .key(config.scheduled_jobs_set())
        .key(config.active_jobs_list())
        .arg(now)
        .arg(chunk)
        .invoke_async(conn)
        .await
}

/// How long a finished dispatch task's record stays in the backend (see [`forget_done`]): nothing
/// of rlvr reads it once the task is acknowledged (the job's record holds what happened); a
/// minute leaves the backend's own bookkeeping of the acknowledgement well alone.
pub const KEEP_DONE: std::time::Duration = std::time::Duration::from_secs(60);

/// Deletes what the backend keeps of each finished task of a queue (its data, its meta hash, its
/// result and its entry in the done set) that finished at least `keep` ago; returns how many.
/// The backend never deletes them itself: they grew Redis by ~0.6 KB a job for ever (a soak run
/// of 200 jobs: 203 of each left, against the 80 job records the retention kept). A job's own
/// record, its events and its outcome are the job store's, not these; the backend's own vacuum
/// leaves the done set.
pub async fn forget_done<C: ConnectionLike>(
    conn: &mut C,
    config: &Config,
    keep: std::time::Duration,
) -> redis::RedisResult<usize> {
    static FORGET: std::sync::LazyLock<redis::Script> = std::sync::LazyLock::new(|| {
        redis::Script::new(
            r#"
-- KEYS: done set, data hash, meta prefix; ARGV: finished at or before (s)
local forgotten = 0
for _, id in ipairs(redis.call('SMEMBERS', KEYS[1])) do
  local meta = KEYS[3] .. ':' .. id
  local done_at = redis.call('HGET', meta, 'done_at')
  if not done_at or tonumber(done_at) <= tonumber(ARGV[1]) then
    redis.call('HDEL', KEYS[2], id)
    redis.call('HDEL', KEYS[3] .. ':result', id)
    redis.call('DEL', meta)
    redis.call('SREM', KEYS[1], id)
    forgotten = forgotten + 1
  end
end
return forgotten
"#,
        )
    });
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    FORGET
        .key(config.done_jobs_set())
        .key(config.job_data_hash())
        .key(config.job_meta_hash())
        .arg(now.saturating_sub(keep.as_secs()))
        .invoke_async(conn)
        .await
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
