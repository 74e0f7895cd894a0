//! Jobs on Redis: the record of each job, its event stream, the per-team index, idempotency keys
//! and the dead-letter set. This record is the truth about a job; the dispatch queue (apalis,
//! `dispatch`) only carries job ids to the daemons that run them.
//!
//! Every change of state is one Lua script: it checks the current state against
//! [`JobState::allowed_from`], writes the new one and appends the event, atomically. Two daemons,
//! or a daemon and a cancel, racing on one job cannot both win.
//!
//! Keys (all under `rlvr:`):
//! - `job:{id}` hash — the record (fields below, `F_*`); its `spec` is the submitted one, but for
//!   `[resources]` grown by a requeue after an out-of-memory;
//! - `events:{id}` stream — one entry per change of state: `state`, `reason`, `step`, `at` (ms);
//! - `jobs` and `team:{team}:jobs` sorted sets — ids by creation time (ms);
//! - `idem:{team}:{key}` string with a TTL — the job id a submit with that `Idempotency-Key` made;
//! - `dead` sorted set — dead-lettered job ids by time.
//!
//! [`Store::page`] lists by the index's scores (submit time) from a cursor (the last job's time and
//! id), not by rank: a job submitted between two pages would shift ranks and repeat a job.
//! Idempotency keys live 24 h ([`IDEMPOTENCY_TTL`]).

use std::collections::HashMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use redis::aio::ConnectionManager;
use redis::{AsyncCommands, Script, Value as RedisValue};

use rlvr_protocol::gates::GateReport;
use rlvr_protocol::job::{JobEvent, JobOutput, JobState, JobView, ListCursor};
use rlvr_protocol::kind::JobKind;
use rlvr_protocol::names::PinnedSpec;
use rlvr_protocol::spec::{JobSpec, ResourcesSection};
use rlvr_protocol::worker::{Outcome, Progress};

/// How long an `Idempotency-Key` is remembered: a client may retry a submit for a day.
pub const IDEMPOTENCY_TTL: Duration = Duration::from_secs(24 * 3600);

const PREFIX: &str = "rlvr";
const F_STATE: &str = "state";
const F_REASON: &str = "reason";
const F_STEP: &str = "step";
const F_UPDATED: &str = "updated_at";
const F_CREATED: &str = "created_at";
const F_SPEC: &str = "spec";
const F_TASK: &str = "task_id";
const F_CRASHES: &str = "crashes";
const F_CANCEL: &str = "cancel";
const F_PROGRESS: &str = "progress";
const F_RESULT: &str = "result";
const F_DEVICES: &str = "devices";
const F_PREEMPTIONS: &str = "preemptions";
const F_MEMORY_REQUEUES: &str = "memory_requeues";
const F_KIND: &str = "kind";
const F_PRIORITY: &str = "priority";
const F_GATES: &str = "gates";
const F_OUTPUT: &str = "output";
const F_WEBHOOK: &str = "webhook";
const F_CURRICULUM_VERSION: &str = "curriculum_version";

/// What a change of state (or [`JobStore::set_fields`]) writes into a job's record beside its
/// state: the store owns each field's name and encoding, so no caller writes a field name or a
/// JSON text, and [`JobStore::get`] reads back what was written or says the record is corrupt.
#[derive(Debug, Clone)]
pub enum RecordField {
    /// The devices it was admitted to.
    Devices(Vec<String>),
    /// The version of its shared curriculum pinned at its first admission.
    CurriculumVersion(u64),
    /// How its training ended.
    Result(Box<Outcome>),
    /// The gates' report.
    Gates(Box<GateReport>),
    /// What it published.
    Output(JobOutput),
    /// What became of its webhook's delivery.
    Webhook(String),
    /// Its dispatch task (a requeue's new one).
    TaskId(String),
    /// Its spec with `[resources]` grown after running out of memory, and how many such requeues
    /// it has had: what the scheduler admits it by from then on, across daemon restarts.
    GrownSpec { spec: Box<PinnedSpec>, requeues: u32 },
}

impl RecordField {
    /// Its fields and their values as the record holds them.
    fn encode(&self, id: &str) -> Result<Vec<(&'static str, String)>, StoreError> {
        fn json<T: serde::Serialize>(id: &str, field: &'static str, value: &T) -> Result<String, StoreError> {
            serde_json::to_string(value).map_err(|error| StoreError::Corrupt {
                id: id.to_owned(),
                field,
                message: error.to_string(),
            })
        }
        Ok(match self {
            RecordField::Devices(devices) => vec![(F_DEVICES, devices.join(","))],
            RecordField::CurriculumVersion(version) => vec![(F_CURRICULUM_VERSION, version.to_string())],
            RecordField::Result(outcome) => vec![(F_RESULT, json(id, F_RESULT, outcome)?)],
            RecordField::Gates(report) => vec![(F_GATES, json(id, F_GATES, report)?)],
            RecordField::Output(output) => vec![(F_OUTPUT, json(id, F_OUTPUT, output)?)],
            RecordField::Webhook(answer) => vec![(F_WEBHOOK, answer.clone())],
            RecordField::TaskId(task) => vec![(F_TASK, task.clone())],
            RecordField::GrownSpec { spec, requeues } => {
                vec![(F_SPEC, json(id, F_SPEC, spec)?), (F_MEMORY_REQUEUES, requeues.to_string())]
            }
        })
    }
}

/// Every field of `fields`, encoded.
fn encode_all(id: &str, fields: &[RecordField]) -> Result<Vec<(&'static str, String)>, StoreError> {
    let mut encoded = Vec::new();
    for field in fields {
        encoded.extend(field.encode(id)?);
    }
    Ok(encoded)
}

/// Most job records one [`Store::page`] reads before it answers.
pub const PAGE_SCAN: usize = 10_000;
/// Ids read from the index at once by [`Store::page`].
const PAGE_CHUNK: usize = 200;

/// What [`Store::page`] lists.
#[derive(Debug, Clone, Default)]
pub struct PageQuery {
    /// Only jobs created at or after this time (ms since the Unix epoch).
    pub since_ms: Option<u64>,
    /// Only jobs older than this one (the previous page's `next`).
    pub after: Option<ListCursor>,
    /// Only jobs in this state.
    pub state: Option<JobState>,
    /// At most this many.
    pub limit: usize,
}

/// A page of [`Store::page`].
#[derive(Debug)]
pub struct JobPage {
    /// Newest first.
    pub jobs: Vec<JobView>,
    /// Where the next page starts; `None` when no job is left.
    pub next: Option<ListCursor>,
}

/// Why a store call failed.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// Redis did not answer or refused the command.
    #[error("redis: {0}")]
    Redis(#[from] redis::RedisError),
    /// No job has this id.
    #[error("no job {0}")]
    NotFound(String),
    /// The job is not in a state the change may come from.
    #[error("job {id} is {current}; cannot become {wanted}")]
    Conflict {
        /// The job.
        id: String,
        /// Its state now.
        current: JobState,
        /// The state asked for.
        wanted: JobState,
    },
    /// A record in Redis that this version cannot read (written by hand, or by a newer version).
    #[error("job {id}: field {field}: {message}")]
    Corrupt {
        /// The job.
        id: String,
        /// The hash field.
        field: &'static str,
        /// What was wrong.
        message: String,
    },
}

/// What a cancel did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CancelOutcome {
    /// The job was waiting: it is cancelled now.
    Cancelled,
    /// A daemon runs it: it is told to stop its worker, and the job ends `cancelled` when it has.
    Requested,
    /// It had ended already, in this state.
    AlreadyEnded(JobState),
}

/// What a submit did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SubmitOutcome {
    /// A new job, with the dispatch task id to push.
    Created { id: String, task_id: String },
    /// The `Idempotency-Key` was used before, for this job.
    Existing { id: String },
}

/// The job records on one Redis.
#[derive(Clone)]
pub struct JobStore {
    conn: ConnectionManager,
}

impl JobStore {
    /// A store over `conn` (a `ConnectionManager` reconnects by itself after Redis comes back).
    pub fn new(conn: ConnectionManager) -> Self {
        JobStore { conn }
    }

    /// A store for `url` that connects on first use and reconnects by itself (with backoff)
    /// whenever Redis comes back: a daemon starts, and stays up, while Redis is away.
    pub fn connect_lazy(url: &str) -> Result<Self, StoreError> {
        let client = redis::Client::open(url)?;
        let config = redis::aio::ConnectionManagerConfig::new()
            .set_connection_timeout(Some(Duration::from_secs(2)))
            .set_response_timeout(Some(Duration::from_secs(5)))
            .set_max_delay(Duration::from_secs(2))
            .set_number_of_retries(2);
        Ok(JobStore::new(ConnectionManager::new_lazy_with_config(client, config)?))
    }

    /// The connection, for callers that push to the dispatch queue over the same one.
    pub fn connection(&self) -> ConnectionManager {
        self.conn.clone()
    }

    /// Records a new job (state `queued`, its first event) and returns its ids; or, when
    /// `idempotency_key` was used by this team within [`IDEMPOTENCY_TTL`], the job it made then.
    /// The caller pushes `task_id` to the dispatch queue next; `queued_without_task` finds jobs
    /// whose push never happened (a daemon killed between the two).
    pub async fn submit(
        &self,
        id: &str,
        task_id: &str,
        spec: &PinnedSpec,
        kind: JobKind,
        idempotency_key: Option<&str>,
    ) -> Result<SubmitOutcome, StoreError> {
        static SUBMIT: std::sync::LazyLock<Script> = std::sync::LazyLock::new(|| {
            Script::new(
                r#"
-- KEYS: job hash, events stream, all jobs, team jobs, idempotency key ("" = none)
-- ARGV: id, now ms, idempotency ttl s, then field/value pairs of the record
if KEYS[5] ~= "" then
  local existing = redis.call("GET", KEYS[5])
  if existing then return {0, existing} end
end
if redis.call("EXISTS", KEYS[1]) == 1 then return {0, ARGV[1]} end
local fields = {}
for i = 4, #ARGV do fields[#fields + 1] = ARGV[i] end
redis.call("HSET", KEYS[1], unpack(fields))
redis.call("ZADD", KEYS[3], ARGV[2], ARGV[1])
redis.call("ZADD", KEYS[4], ARGV[2], ARGV[1])
redis.call("XADD", KEYS[2], "*", "state", "queued", "reason", "submitted", "step", "0", "at", ARGV[2])
if KEYS[5] ~= "" then redis.call("SET", KEYS[5], ARGV[1], "EX", ARGV[3]) end
return {1, ARGV[1]}
"#,
            )
        });
        let now = now_ms();
        let team = &spec.job.team;
        let spec_json = serde_json::to_string(spec).map_err(|error| StoreError::Corrupt {
            id: id.to_owned(),
            field: F_SPEC,
            message: error.to_string(),
        })?;
        let idem_key = idempotency_key.map(|key| format!("{PREFIX}:idem:{team}:{key}")).unwrap_or_default();
        let mut invocation = SUBMIT.prepare_invoke();
        invocation
            .key(job_key(id))
            .key(events_key(id))
            .key(format!("{PREFIX}:jobs"))
            .key(team_key(team))
            .key(idem_key)
            .arg(id)
            .arg(now)
            .arg(IDEMPOTENCY_TTL.as_secs());
        let fields: [(&str, String); 14] = [
            ("id", id.to_owned()),
            (F_KIND, kind.as_str().to_owned()),
            ("team", team.clone()),
            ("name", spec.job.name.clone()),
            ("model_line", spec.job.model_line.clone()),
            (F_PRIORITY, spec.job.priority.as_str().to_owned()),
            (F_STATE, JobState::Queued.as_str().to_owned()),
            (F_REASON, "submitted".to_owned()),
            (F_STEP, "0".to_owned()),
            ("max_steps", spec.budget.max_steps.to_string()),
            (F_CREATED, now.to_string()),
            (F_UPDATED, now.to_string()),
            (F_SPEC, spec_json),
            (F_TASK, task_id.to_owned()),
        ];
        for (field, value) in fields {
            invocation.arg(field).arg(value);
        }
        let (created, existing): (i64, String) = invocation.invoke_async(&mut self.conn.clone()).await?;
        Ok(if created == 1 {
            SubmitOutcome::Created { id: id.to_owned(), task_id: task_id.to_owned() }
        } else {
            SubmitOutcome::Existing { id: existing }
        })
    }

    /// The job, as the API shows it.
    pub async fn get(&self, id: &str) -> Result<JobView, StoreError> {
        let fields: HashMap<String, String> = self.conn.clone().hgetall(job_key(id)).await?;
        if fields.is_empty() {
            return Err(StoreError::NotFound(id.to_owned()));
        }
        view_from_fields(id, &fields)
    }

    /// The job's spec as submitted, with `[resources]` as a requeue after an out-of-memory grew
    /// them ([`RecordField::GrownSpec`]).
    pub async fn spec(&self, id: &str) -> Result<PinnedSpec, StoreError> {
        let text: Option<String> = self.conn.clone().hget(job_key(id), F_SPEC).await?;
        let text = text.ok_or_else(|| StoreError::NotFound(id.to_owned()))?;
        let spec = JobSpec::from_json(&text).map_err(|error| StoreError::Corrupt {
            id: id.to_owned(),
            field: F_SPEC,
            message: error.to_string(),
        })?;
        // The submit script wrote it pinned (its only writer but a grown spec, pinned too).
        Ok(PinnedSpec::from_record(spec))
    }

    /// The dispatch task that currently stands for the job: only that task may run it.
    pub async fn task_id(&self, id: &str) -> Result<Option<String>, StoreError> {
        Ok(self.conn.clone().hget(job_key(id), F_TASK).await?)
    }

    /// One page of jobs, newest first: of `team` or of every team, created at or after
    /// `page.since_ms`, older than `page.after`, in `page.state` when given; and where the next
    /// page starts when there may be more. Reads ids by creation time in chunks, so a filter
    /// that matches few jobs reads at most [`PAGE_SCAN`] records before it answers with what it
    /// found and a cursor at the last one it read.
    pub async fn page(&self, team: Option<&str>, page: &PageQuery) -> Result<JobPage, StoreError> {
        let index = team.map_or_else(|| format!("{PREFIX}:jobs"), team_key);
        let max = page.after.as_ref().map_or_else(|| "+inf".to_owned(), |after| after.created_ms.to_string());
        let min = page.since_ms.map_or_else(|| "-inf".to_owned(), |since| since.to_string());
        let limit = page.limit.max(1);
        let mut jobs = Vec::new();
        let mut offset = 0;
        let mut last_read: Option<ListCursor> = None;
        loop {
            let chunk: Vec<(String, f64)> = redis::cmd("ZREVRANGEBYSCORE")
                .arg(&index)
                .arg(&max)
                .arg(&min)
                .arg("WITHSCORES")
                .arg("LIMIT")
                .arg(offset)
                .arg(PAGE_CHUNK)
                .query_async(&mut self.conn.clone())
                .await?;
            let exhausted = chunk.len() < PAGE_CHUNK;
            offset += chunk.len();
            // Ties on the cursor's millisecond come in descending id order: those not below the
            // cursor's id were on an earlier page.
            let chunk: Vec<(String, u64)> = chunk
                .into_iter()
                .map(|(id, score)| (id, score as u64))
                .filter(|(id, created_ms)| {
                    page.after.as_ref().is_none_or(|after| *created_ms < after.created_ms || *id < after.id)
                })
                .collect();
            let mut pipe = redis::pipe();
            for (id, _) in &chunk {
                pipe.hgetall(job_key(id));
            }
            let records: Vec<HashMap<String, String>> =
                if chunk.is_empty() { Vec::new() } else { pipe.query_async(&mut self.conn.clone()).await? };
            for ((id, created_ms), fields) in chunk.into_iter().zip(records) {
                if fields.is_empty() {
                    continue;
                }
                let view = view_from_fields(&id, &fields)?;
                let cursor = ListCursor { created_ms, id };
                last_read = Some(cursor.clone());
                if page.state.is_none_or(|wanted| view.state == wanted) {
                    if jobs.len() == limit {
                        // One more than the page: there is a next page, after the page's last.
                        let next = jobs.last().map(|(cursor, _): &(ListCursor, JobView)| cursor.clone());
                        return Ok(JobPage { jobs: jobs.into_iter().map(|(_, view)| view).collect(), next });
                    }
                    jobs.push((cursor, view));
                }
            }
            let jobs_only =
                |jobs: Vec<(ListCursor, JobView)>| jobs.into_iter().map(|(_, view)| view).collect();
            if exhausted {
                return Ok(JobPage { jobs: jobs_only(jobs), next: None });
            }
            if offset >= PAGE_SCAN {
                return Ok(JobPage { jobs: jobs_only(jobs), next: last_read });
            }
        }
    }

    /// How many of `team`'s jobs wait to run (queued or preempted), counting up to `limit`: what
    /// the per-team queue limit is checked against. Reads only states, newest jobs first, in
    /// pipelined pages; a team's history of finished jobs costs a page per 500.
    pub async fn waiting(&self, team: &str, limit: usize) -> Result<usize, StoreError> {
        const PAGE: isize = 500;
        let mut waiting = 0;
        // The ids a page at a time too: a team with thousands of jobs queued costs a submit the
        // pages up to its limit, not its whole list (`scripts/bench/submit.sh` queues 18,000).
        for start in (0..).step_by(PAGE as usize) {
            let ids: Vec<String> =
                self.conn.clone().zrevrange(team_key(team), start, start + PAGE - 1).await?;
            if ids.is_empty() {
                break;
            }
            let mut pipe = redis::pipe();
            for id in &ids {
                pipe.hget(job_key(id), F_STATE);
            }
            let states: Vec<Option<String>> = pipe.query_async(&mut self.conn.clone()).await?;
            waiting += states
                .iter()
                .flatten()
                .filter(|state| matches!(state.parse(), Ok(JobState::Queued | JobState::Preempted)))
                .count();
            if waiting >= limit || ids.len() < PAGE as usize {
                break;
            }
        }
        Ok(waiting)
    }

    /// Ids of jobs in `state`, oldest first, at most `limit` (for recovery sweeps).
    pub async fn ids_in_state(&self, state: JobState, limit: usize) -> Result<Vec<String>, StoreError> {
        // The index is by time; states are read in pages. Fine for the sweeps at start-up.
        let ids: Vec<String> = self.conn.clone().zrange(format!("{PREFIX}:jobs"), 0, -1).await?;
        let mut found = Vec::new();
        for chunk in ids.chunks(500) {
            let mut pipe = redis::pipe();
            for id in chunk {
                pipe.hget(job_key(id), F_STATE);
            }
            let states: Vec<Option<String>> = pipe.query_async(&mut self.conn.clone()).await?;
            for (id, current) in chunk.iter().zip(states) {
                if current.as_deref() == Some(state.as_str()) {
                    found.push(id.clone());
                    if found.len() >= limit {
                        return Ok(found);
                    }
                }
            }
        }
        Ok(found)
    }

    /// The specs of every job that is not in an end state (queued, preempted, admitted, running,
    /// evaluating): what may still read the data it pinned. Reads states in chunks, and specs
    /// only of those jobs; a record whose spec does not parse is an error, so a caller deciding
    /// what nothing cites never decides on part of the answer.
    pub async fn unfinished_specs(&self) -> Result<Vec<(String, PinnedSpec)>, StoreError> {
        let ids: Vec<String> = self.conn.clone().zrange(format!("{PREFIX}:jobs"), 0, -1).await?;
        let mut specs = Vec::new();
        for chunk in ids.chunks(500) {
            let mut pipe = redis::pipe();
            for id in chunk {
                pipe.hget(job_key(id), F_STATE);
            }
            let states: Vec<Option<String>> = pipe.query_async(&mut self.conn.clone()).await?;
            // A state that does not parse counts as unfinished: the safe side for the caller.
            let unfinished = chunk.iter().zip(states).filter_map(|(id, state)| {
                let ended = state?.parse::<JobState>().is_ok_and(JobState::is_terminal);
                (!ended).then_some(id)
            });
            for id in unfinished {
                match self.spec(id).await {
                    Ok(spec) => specs.push((id.clone(), spec)),
                    // Deleted since its state was read.
                    Err(StoreError::NotFound(_)) => {}
                    Err(error) => return Err(error),
                }
            }
        }
        Ok(specs)
    }

    /// The jobs of `team` (every team's with `None`) as `(team, id, ended at)`: `ended at` (ms)
    /// for a job in a final state (its last change), `None` for one not ended. For the retention
    /// of ended records.
    pub async fn ended_times(
        &self,
        team: Option<&str>,
    ) -> Result<Vec<(String, String, Option<u64>)>, StoreError> {
        let index = team.map_or_else(|| format!("{PREFIX}:jobs"), team_key);
        let ids: Vec<String> = self.conn.clone().zrange(index, 0, -1).await?;
        let mut jobs = Vec::with_capacity(ids.len());
        for chunk in ids.chunks(500) {
            let mut pipe = redis::pipe();
            for id in chunk {
                pipe.cmd("HMGET").arg(job_key(id)).arg(F_STATE).arg(F_UPDATED).arg("team");
            }
            let rows: Vec<(Option<String>, Option<String>, Option<String>)> =
                pipe.query_async(&mut self.conn.clone()).await?;
            for (id, (state, updated, team)) in chunk.iter().zip(rows) {
                let Some(team) = team else { continue };
                // A state or time that does not parse counts as not ended: never forgotten.
                let ended =
                    state.and_then(|state| state.parse::<JobState>().ok()).is_some_and(JobState::is_terminal);
                let at = updated.and_then(|at| at.parse::<u64>().ok());
                jobs.push((team, id.clone(), if ended { at } else { None }));
            }
        }
        Ok(jobs)
    }

    /// Deletes the record, events and index entries of job `id` if it has ended (checked in the
    /// same script: a job that is not ended is never touched). Whether it was deleted.
    pub async fn forget_ended(&self, id: &str, team: &str) -> Result<bool, StoreError> {
        static FORGET: std::sync::LazyLock<Script> = std::sync::LazyLock::new(|| {
            Script::new(
                r#"
-- KEYS: job hash, events stream, all jobs, team jobs, dead set
-- ARGV: id, ",final,states,"
local state = redis.call("HGET", KEYS[1], "state")
if not state or not string.find(ARGV[2], "," .. state .. ",", 1, true) then return 0 end
redis.call("DEL", KEYS[1], KEYS[2])
redis.call("ZREM", KEYS[3], ARGV[1])
redis.call("ZREM", KEYS[4], ARGV[1])
redis.call("ZREM", KEYS[5], ARGV[1])
return 1
"#,
            )
        });
        let terminal = [JobState::Published, JobState::Refused, JobState::Failed, JobState::Cancelled];
        let states = format!(",{},", terminal.map(|state| state.as_str()).join(","));
        let deleted: i64 = FORGET
            .key(job_key(id))
            .key(events_key(id))
            .key(format!("{PREFIX}:jobs"))
            .key(team_key(team))
            .key(format!("{PREFIX}:dead"))
            .arg(id)
            .arg(states)
            .invoke_async(&mut self.conn.clone())
            .await?;
        Ok(deleted == 1)
    }

    /// Moves the job to `to` if its state allows it ([`JobState::allowed_from`]), with `reason`
    /// and any `extra` record fields, and appends the event. Returns the state it left.
    pub async fn transition(
        &self,
        id: &str,
        to: JobState,
        reason: &str,
        extra: &[RecordField],
    ) -> Result<JobState, StoreError> {
        let extra = encode_all(id, extra)?;
        static TRANSITION: std::sync::LazyLock<Script> = std::sync::LazyLock::new(|| {
            Script::new(
                r#"
-- KEYS: job hash, events stream
-- ARGV: new state, reason, now ms, ",allowed,from,", then field/value pairs
local current = redis.call("HGET", KEYS[1], "state")
if not current then return {-1, ""} end
if not string.find(ARGV[4], "," .. current .. ",", 1, true) then return {0, current} end
local fields = {"state", ARGV[1], "reason", ARGV[2], "updated_at", ARGV[3]}
for i = 5, #ARGV do fields[#fields + 1] = ARGV[i] end
redis.call("HSET", KEYS[1], unpack(fields))
local step = redis.call("HGET", KEYS[1], "step") or "0"
redis.call("XADD", KEYS[2], "*", "state", ARGV[1], "reason", ARGV[2], "step", step, "at", ARGV[3])
return {1, current}
"#,
            )
        });
        let allowed: String =
            to.allowed_from().iter().fold(",".to_owned(), |acc, state| format!("{acc}{state},"));
        let mut invocation = TRANSITION.prepare_invoke();
        invocation
            .key(job_key(id))
            .key(events_key(id))
            .arg(to.as_str())
            .arg(reason)
            .arg(now_ms())
            .arg(allowed);
        for (field, value) in &extra {
            invocation.arg(*field).arg(value);
        }
        let (done, current): (i64, String) = invocation.invoke_async(&mut self.conn.clone()).await?;
        let current = parse_state(id, &current);
        match done {
            -1 => Err(StoreError::NotFound(id.to_owned())),
            1 => current,
            _ => Err(StoreError::Conflict { id: id.to_owned(), current: current?, wanted: to }),
        }
    }

    /// Records the latest step and its figures, while the job runs.
    pub async fn set_progress(&self, id: &str, progress: &Progress) -> Result<(), StoreError> {
        static PROGRESS: std::sync::LazyLock<Script> = std::sync::LazyLock::new(|| {
            Script::new(
                r#"
-- KEYS: job hash; ARGV: step, progress json, now ms
if redis.call("HGET", KEYS[1], "state") ~= "running" then return 0 end
redis.call("HSET", KEYS[1], "step", ARGV[1], "progress", ARGV[2], "updated_at", ARGV[3])
return 1
"#,
            )
        });
        let text = serde_json::to_string(progress).map_err(|error| StoreError::Corrupt {
            id: id.to_owned(),
            field: F_PROGRESS,
            message: error.to_string(),
        })?;
        let _: i64 = PROGRESS
            .key(job_key(id))
            .arg(progress.step)
            .arg(text)
            .arg(now_ms())
            .invoke_async(&mut self.conn.clone())
            .await?;
        Ok(())
    }

    /// Sets record fields without a change of state (the dispatch task id of a requeue, the
    /// webhook's answer).
    pub async fn set_fields(&self, id: &str, fields: &[RecordField]) -> Result<(), StoreError> {
        let fields = encode_all(id, fields)?;
        let _: () = self.conn.clone().hset_multiple(job_key(id), &fields).await?;
        Ok(())
    }

    /// Claims `key` for `ttl` when nobody holds it (SET NX): `Ok(None)` when claimed, else the
    /// holder's value. The once-a-day guard of shared work (a curriculum's nightly refresh).
    pub async fn claim(&self, key: &str, value: &str, ttl: Duration) -> Result<Option<String>, StoreError> {
        let options = redis::SetOptions::default()
            .conditional_set(redis::ExistenceCheck::NX)
            .with_expiration(redis::SetExpiry::PX(ttl.as_millis() as u64));
        let set: Option<String> = self.conn.clone().set_options(key, value, options).await?;
        if set.is_some() {
            return Ok(None);
        }
        let holder: Option<String> = self.conn.clone().get(key).await?;
        // Expired between the two calls: nobody holds it now; say so as a holder the caller
        // reports, rather than claiming it behind another asker's back.
        Ok(Some(holder.unwrap_or_else(|| "released just now".to_owned())))
    }

    /// Sets a claimed `key` to `value` for `ttl` (the outcome of the claimed work).
    pub async fn settle_claim(&self, key: &str, value: &str, ttl: Duration) -> Result<(), StoreError> {
        let _: () = self.conn.clone().pset_ex(key, value, ttl.as_millis() as u64).await?;
        Ok(())
    }

    /// Gives a claim up (the work failed: the next asker may try).
    pub async fn release_claim(&self, key: &str) -> Result<(), StoreError> {
        let _: () = self.conn.clone().del(key).await?;
        Ok(())
    }

    /// Counts one more crash of the job's worker; returns the count.
    pub async fn count_crash(&self, id: &str) -> Result<u32, StoreError> {
        Ok(self.conn.clone().hincr(job_key(id), F_CRASHES, 1).await?)
    }

    /// Counts one more preemption of the job; the new count.
    pub async fn count_preemption(&self, id: &str) -> Result<u32, StoreError> {
        Ok(self.conn.clone().hincr(job_key(id), F_PREEMPTIONS, 1).await?)
    }

    /// How often the job was requeued with a larger memory request after running out of memory.
    pub async fn memory_requeues(&self, id: &str) -> Result<u32, StoreError> {
        let count: Option<String> = self.conn.clone().hget(job_key(id), F_MEMORY_REQUEUES).await?;
        match count {
            None => Ok(0),
            Some(text) => text.parse().map_err(|_| StoreError::Corrupt {
                id: id.to_owned(),
                field: F_MEMORY_REQUEUES,
                message: format!("expected a whole number, got {text:?}"),
            }),
        }
    }

    /// Puts the job on the dead-letter set (its state is set by the caller: `failed`).
    pub async fn dead_letter(&self, id: &str) -> Result<(), StoreError> {
        let _: () = self.conn.clone().zadd(format!("{PREFIX}:dead"), id, now_ms()).await?;
        Ok(())
    }

    /// Cancels a waiting job at once, or asks the daemon that runs it to stop it.
    pub async fn cancel(&self, id: &str, reason: &str) -> Result<CancelOutcome, StoreError> {
        static CANCEL: std::sync::LazyLock<Script> = std::sync::LazyLock::new(|| {
            Script::new(
                r#"
-- KEYS: job hash, events stream; ARGV: reason, now ms
local current = redis.call("HGET", KEYS[1], "state")
if not current then return {-1, ""} end
if current == "queued" or current == "preempted" then
  redis.call("HSET", KEYS[1], "state", "cancelled", "reason", ARGV[1], "updated_at", ARGV[2])
  local step = redis.call("HGET", KEYS[1], "step") or "0"
  redis.call("XADD", KEYS[2], "*", "state", "cancelled", "reason", ARGV[1], "step", step, "at", ARGV[2])
  return {1, "cancelled"}
end
if current == "admitted" or current == "running" or current == "evaluating" then
  redis.call("HSET", KEYS[1], "cancel", "1", "updated_at", ARGV[2])
  return {2, current}
end
return {0, current}
"#,
            )
        });
        let (done, current): (i64, String) = CANCEL
            .key(job_key(id))
            .key(events_key(id))
            .arg(reason)
            .arg(now_ms())
            .invoke_async(&mut self.conn.clone())
            .await?;
        match done {
            -1 => Err(StoreError::NotFound(id.to_owned())),
            1 => Ok(CancelOutcome::Cancelled),
            2 => Ok(CancelOutcome::Requested),
            _ => Ok(CancelOutcome::AlreadyEnded(parse_state(id, &current)?)),
        }
    }

    /// Whether a cancel was asked for.
    pub async fn cancel_requested(&self, id: &str) -> Result<bool, StoreError> {
        let flag: Option<String> = self.conn.clone().hget(job_key(id), F_CANCEL).await?;
        Ok(flag.as_deref() == Some("1"))
    }

    /// Up to 100 events after stream id `after` (`"0"` = from the first). It does not block: a
    /// blocking read would hold up every other command on the shared multiplexed connection, so
    /// followers poll.
    pub async fn events(&self, id: &str, after: &str) -> Result<Vec<JobEvent>, StoreError> {
        let value: RedisValue = redis::cmd("XREAD")
            .arg("COUNT")
            .arg(100)
            .arg("STREAMS")
            .arg(events_key(id))
            .arg(after)
            .query_async(&mut self.conn.clone())
            .await?;
        let reply: Option<redis::streams::StreamReadReply> =
            redis::FromRedisValue::from_redis_value(value).ok();
        let mut events = Vec::new();
        for key in reply.map(|r| r.keys).unwrap_or_default() {
            for entry in key.ids {
                let field = |name: &str| -> String {
                    entry
                        .map
                        .get(name)
                        .and_then(|v| redis::from_redis_value::<String>(v.clone()).ok())
                        .unwrap_or_default()
                };
                let state = parse_state(id, &field("state"))?;
                events.push(JobEvent {
                    id: entry.id.clone(),
                    at: rfc3339(field("at").parse().unwrap_or(0)),
                    state,
                    reason: field("reason"),
                    step: field("step").parse().unwrap_or(0),
                });
            }
        }
        Ok(events)
    }
}

/// The record's key.
pub fn job_key(id: &str) -> String {
    format!("{PREFIX}:job:{id}")
}

fn events_key(id: &str) -> String {
    format!("{PREFIX}:events:{id}")
}

fn team_key(team: &str) -> String {
    format!("{PREFIX}:team:{team}:jobs")
}

fn parse_state(id: &str, text: &str) -> Result<JobState, StoreError> {
    text.parse().map_err(|message| StoreError::Corrupt { id: id.to_owned(), field: F_STATE, message })
}

fn view_from_fields(id: &str, fields: &HashMap<String, String>) -> Result<JobView, StoreError> {
    let text = |name: &str| fields.get(name).cloned().unwrap_or_default();
    let number = |name: &'static str| -> Result<u64, StoreError> {
        match fields.get(name) {
            None => Ok(0),
            Some(value) => value.parse().map_err(|_| StoreError::Corrupt {
                id: id.to_owned(),
                field: name,
                message: format!("expected a whole number, got {value:?}"),
            }),
        }
    };
    // A field written by `RecordField::encode` that does not read back is a corrupt record:
    // a report that does not parse must not read as "not gated".
    fn json<T: serde::de::DeserializeOwned>(
        id: &str,
        fields: &HashMap<String, String>,
        name: &'static str,
    ) -> Result<Option<T>, StoreError> {
        fields
            .get(name)
            .map(|text| {
                serde_json::from_str(text).map_err(|error| StoreError::Corrupt {
                    id: id.to_owned(),
                    field: name,
                    message: error.to_string(),
                })
            })
            .transpose()
    }
    // What it asks the scheduler for, from its spec.
    let resources = fields
        .get(F_SPEC)
        .and_then(|text| serde_json::from_str::<serde_json::Value>(text).ok())
        .and_then(|spec| serde_json::from_value::<ResourcesSection>(spec.get("resources")?.clone()).ok());
    let progress: Option<Progress> = json(id, fields, F_PROGRESS)?;
    let mut view = JobView {
        id: id.to_owned(),
        team: text("team"),
        name: text("name"),
        model_line: text("model_line"),
        // A record made before kinds were recorded has none; one that does not parse is corrupt.
        kind: fields
            .get(F_KIND)
            .map(|kind| {
                kind.parse().map_err(|message| StoreError::Corrupt {
                    id: id.to_owned(),
                    field: F_KIND,
                    message,
                })
            })
            .transpose()?,
        priority: text(F_PRIORITY).parse().map_err(|message| StoreError::Corrupt {
            id: id.to_owned(),
            field: F_PRIORITY,
            message,
        })?,
        state: parse_state(id, &text(F_STATE))?,
        step: number(F_STEP)?,
        max_steps: number("max_steps")?,
        reason: text(F_REASON),
        created_at: rfc3339(number(F_CREATED)?),
        updated_at: rfc3339(number(F_UPDATED)?),
        crashes: number(F_CRASHES)? as u32,
        cancel_requested: fields.get(F_CANCEL).is_some_and(|flag| flag == "1"),
        devices: fields
            .get(F_DEVICES)
            .map(|list| list.split(',').filter(|d| !d.is_empty()).map(str::to_owned).collect())
            .unwrap_or_default(),
        preemptions: number(F_PREEMPTIONS)? as u32,
        grant: None,
        // The latest held-out score is the progress's (a resumed run carries it on); a record
        // written before kept it in a field of its own.
        heldout: match progress.as_ref().and_then(|progress| progress.heldout) {
            Some(heldout) => Some(heldout),
            None => before_output::heldout(id, fields)?,
        },
        progress,
        result: json(id, fields, F_RESULT)?,
        gates: json(id, fields, F_GATES)?,
        output: None,
        published: None,
        published_version: None,
        published_dataset: None,
        webhook: fields.get(F_WEBHOOK).cloned(),
        curriculum_version: match fields.get(F_CURRICULUM_VERSION) {
            None => None,
            Some(_) => Some(number(F_CURRICULUM_VERSION)?),
        },
        memory_gb: resources.as_ref().map_or(0.0, |r| r.memory_gb),
        resident_gb: resources.and_then(|r| r.resident_gb),
    };
    let output = match json(id, fields, F_OUTPUT)? {
        Some(output) => Some(output),
        None => before_output::output(id, fields)?,
    };
    view.set_output(output);
    Ok(view)
}

/// Records written before a job's output and held-out score were one field each: the output was
/// `published` (a path) with `published_version` (JSON), or `published_dataset`
/// (`dataset:NAME@SHA256`); the held-out score a number in `heldout`. Read, never written.
mod before_output {
    use std::collections::HashMap;

    use rlvr_protocol::job::{JobOutput, LineVersion};
    use rlvr_protocol::names::DataRef;

    use super::StoreError;

    const F_HELDOUT: &str = "heldout";
    const F_PUBLISHED: &str = "published";
    const F_PUBLISHED_VERSION: &str = "published_version";
    const F_PUBLISHED_DATASET: &str = "published_dataset";

    fn corrupt(id: &str, field: &'static str, message: String) -> StoreError {
        StoreError::Corrupt { id: id.to_owned(), field, message }
    }

    pub(super) fn heldout(id: &str, fields: &HashMap<String, String>) -> Result<Option<f64>, StoreError> {
        fields
            .get(F_HELDOUT)
            .map(|text| {
                text.parse().map_err(|_| corrupt(id, F_HELDOUT, format!("expected a number, got {text:?}")))
            })
            .transpose()
    }

    pub(super) fn output(
        id: &str,
        fields: &HashMap<String, String>,
    ) -> Result<Option<JobOutput>, StoreError> {
        if let Some(text) = fields.get(F_PUBLISHED_VERSION) {
            let LineVersion { line, version } = serde_json::from_str(text)
                .map_err(|error| corrupt(id, F_PUBLISHED_VERSION, error.to_string()))?;
            let path = fields.get(F_PUBLISHED).cloned().unwrap_or_default();
            return Ok(Some(JobOutput::Checkpoint { line, version, path }));
        }
        match fields.get(F_PUBLISHED_DATASET).map(|text| (text, DataRef::parse(text))) {
            None => Ok(None),
            Some((_, Ok(DataRef::Dataset { name, sha256: Some(sha256) }))) => {
                Ok(Some(JobOutput::Dataset { name, sha256 }))
            }
            Some((text, _)) => {
                Err(corrupt(id, F_PUBLISHED_DATASET, format!("expected dataset:NAME@SHA256, got {text:?}")))
            }
        }
    }
}

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

/// RFC 3339 with milliseconds, UTC.
pub fn rfc3339(ms: u64) -> String {
    humantime::format_rfc3339_millis(UNIX_EPOCH + Duration::from_millis(ms)).to_string()
}

#[cfg(test)]
mod tests {
    use rlvr_protocol::job::LineVersion;

    use super::*;

    /// A record's fields as the submit script writes them, without `kind` unless given.
    fn record(kind: Option<&str>) -> HashMap<String, String> {
        let mut fields: HashMap<String, String> = [
            ("team", "math"),
            ("name", "arith"),
            ("model_line", "tiny"),
            ("priority", "normal"),
            (F_STATE, "queued"),
            (F_REASON, "submitted"),
            (F_STEP, "0"),
            ("max_steps", "10"),
            (F_CREATED, "1700000000000"),
            (F_UPDATED, "1700000000000"),
        ]
        .into_iter()
        .map(|(field, value)| (field.to_owned(), value.to_owned()))
        .collect();
        if let Some(kind) = kind {
            fields.insert(F_KIND.to_owned(), kind.to_owned());
        }
        fields
    }

    // Each typed field reads back as written; one that does not parse is a corrupt record (a
    // gate report that did not parse used to read as "not gated").
    #[test]
    fn record_fields_read_back_as_written_and_a_corrupt_one_is_an_error() {
        let report = GateReport::new(None, Vec::new());
        let outcome = Outcome { steps: 7, weights_sha256: "ab".repeat(32), ..Outcome::default() };
        let output =
            JobOutput::Checkpoint { line: "tiny".into(), version: 3, path: "/registry/tiny/3".into() };
        let written = [
            RecordField::Devices(vec!["cpu:0".into(), "cuda:1".into()]),
            RecordField::CurriculumVersion(5),
            RecordField::Result(Box::new(outcome.clone())),
            RecordField::Gates(Box::new(report.clone())),
            RecordField::Output(output.clone()),
            RecordField::Webhook("delivered (200)".into()),
        ];
        let mut fields = record(Some("online_groups"));
        fields.extend(encode_all("01J", &written).unwrap().into_iter().map(|(k, v)| (k.to_owned(), v)));
        let view = view_from_fields("01J", &fields).unwrap();
        assert_eq!(view.devices, ["cpu:0", "cuda:1"]);
        assert_eq!(view.curriculum_version, Some(5));
        assert_eq!(view.result, Some(outcome));
        assert_eq!(view.gates, Some(report));
        assert_eq!(view.output, Some(output));
        // The fields older clients read repeat it.
        assert_eq!(view.published.as_deref(), Some("/registry/tiny/3"));
        assert_eq!(view.published_version, Some(LineVersion { line: "tiny".into(), version: 3 }));
        assert_eq!(view.published_dataset, None);
        assert_eq!(view.webhook.as_deref(), Some("delivered (200)"));
        for (field, text) in [
            (F_GATES, "{\"passed\": tru"),
            (F_RESULT, "[]"),
            (F_PROGRESS, "null"),
            (F_OUTPUT, "{\"kind\": \"checkpoint\"}"),
            ("published_version", "{}"),
            ("published_dataset", "rows.jsonl"),
            ("heldout", "high"),
            (F_CURRICULUM_VERSION, "-1"),
        ] {
            let mut corrupt = record(None);
            corrupt.insert(field.to_owned(), text.to_owned());
            match view_from_fields("01C", &corrupt) {
                Err(StoreError::Corrupt { field: named, .. }) => assert_eq!(named, field, "{text}"),
                other => panic!("{field} = {text}: {other:?}"),
            }
        }
    }

    // A dataset output reads back as the reference a later spec names; the held-out score is the
    // progress's, one number wherever it is shown.
    #[test]
    fn a_dataset_output_and_the_heldout_score_read_back_once() {
        let output = JobOutput::Dataset { name: "rows".into(), sha256: "ab".repeat(32) };
        let progress = Progress {
            step: 4,
            max_steps: 10,
            reward: None,
            loss: None,
            kl: None,
            heldout: Some(0.25),
            tokens_per_s: None,
            step_s: None,
            eta_s: None,
            warnings: Vec::new(),
            engine_submission: None,
        };
        let mut fields = record(None);
        fields.extend(
            encode_all("01D", &[RecordField::Output(output.clone())])
                .unwrap()
                .into_iter()
                .map(|(k, v)| (k.to_owned(), v)),
        );
        fields.insert(F_PROGRESS.to_owned(), serde_json::to_string(&progress).unwrap());
        let view = view_from_fields("01D", &fields).unwrap();
        assert_eq!(view.output, Some(output));
        assert_eq!(view.published_dataset, Some(format!("dataset:rows@{}", "ab".repeat(32))));
        assert_eq!((view.published, view.published_version), (None, None));
        assert_eq!(view.heldout, Some(0.25));
    }

    // A record written before a job's output and held-out score were one field each (as a daemon
    // before this one left it in Redis) reads as the same job.
    #[test]
    fn a_record_written_before_the_output_field_reads_as_the_same_job() {
        let mut checkpoint = record(Some("online_groups"));
        for (field, value) in [
            ("state", "published"),
            ("published", "/srv/registry/tiny/3"),
            ("published_version", "{\"line\":\"tiny\",\"version\":3}"),
            ("heldout", "0.5"),
            (
                "progress",
                "{\"step\":10,\"max_steps\":10,\"reward\":0.4,\"loss\":null,\"kl\":null,\"heldout\":null,\"tokens_per_s\":null,\"step_s\":null,\"eta_s\":null}",
            ),
        ] {
            checkpoint.insert(field.to_owned(), value.to_owned());
        }
        let view = view_from_fields("01OLD", &checkpoint).unwrap();
        assert_eq!(
            view.output,
            Some(JobOutput::Checkpoint {
                line: "tiny".into(),
                version: 3,
                path: "/srv/registry/tiny/3".into()
            })
        );
        assert_eq!(view.published.as_deref(), Some("/srv/registry/tiny/3"));
        assert_eq!(view.heldout, Some(0.5));
        let mut dataset = record(Some("rejection_sampling"));
        dataset.insert("published_dataset".to_owned(), format!("dataset:rows@{}", "cd".repeat(32)));
        assert_eq!(
            view_from_fields("01OLDD", &dataset).unwrap().output,
            Some(JobOutput::Dataset { name: "rows".into(), sha256: "cd".repeat(32) })
        );
    }

    // A record written before kinds were recorded still reads, with no kind; a kind that does not
    // parse is a corrupt record, never a job of no kind.
    #[test]
    fn a_records_kind_reads_back_and_an_old_record_has_none() {
        assert_eq!(view_from_fields("01OLD", &record(None)).unwrap().kind, None);
        assert_eq!(
            view_from_fields("01NEW", &record(Some("offline_sft"))).unwrap().kind,
            Some(JobKind::OfflineSft)
        );
        match view_from_fields("01BAD", &record(Some("sft"))) {
            Err(StoreError::Corrupt { id, field, message }) => {
                assert_eq!((id.as_str(), field), ("01BAD", F_KIND));
                assert!(message.contains("offline_sft"), "{message}");
            }
            other => panic!("{other:?}"),
        }
    }
}
