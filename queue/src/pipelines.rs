//! Pipelines on Redis: the record of each pipeline, its event stream, the per-team index, the set
//! of running pipelines the daemons drive, and idempotency keys — done as job records are
//! (`store`): every change is one Lua script that checks where the pipeline is, writes and
//! appends the event atomically, so two daemons driving one pipeline (or a daemon and a cancel)
//! cannot both win.
//!
//! Keys (all under `rlvr:`):
//! - `pipeline:{id}` hash — the record: `team`, `name`, `state`, `reason`, `stage` (the stage it
//!   is at), `stages` (how many), `cancel`, `spec` (the submitted pipeline spec, JSON),
//!   `created_at`, `updated_at`, and per stage `job.{i}` (its job id, recorded *before* the job is
//!   created, so a daemon killed between the two creates that same job on restart and never a
//!   second one) and `output.{i}` (what it handed on, a `StageOutput` as JSON);
//! - `pipeline-events:{id}` stream — `state`, `stage`, `job`, `reason`, `at` (ms);
//! - `pipelines` and `team:{team}:pipelines` sorted sets — ids by creation time (ms);
//! - `pipelines:running` set — the ids the daemons drive (a pipeline leaves it at its end);
//! - `idem:{team}:pipeline:{key}` string with a TTL — the pipeline a submit with that
//!   `Idempotency-Key` made.

use std::collections::HashMap;

use redis::aio::ConnectionManager;
use redis::{AsyncCommands, Script, Value as RedisValue};

use rlvr_protocol::pipeline::{
    PipelineEvent, PipelineSpec, PipelineState, PipelineView, StageOutput, StageView,
};

use crate::store::{IDEMPOTENCY_TTL, StoreError, SubmitOutcome, now_ms, rfc3339};

const PREFIX: &str = "rlvr";
const RUNNING: &str = "rlvr:pipelines:running";

/// What [`PipelineStore::claim_stage`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Claim {
    /// The stage's job id: the one just recorded, or the one recorded before.
    Job(String),
    /// The pipeline is not running any more, has moved past the stage, or a cancel was asked
    /// for: nothing is to be submitted.
    Stale,
}

/// The pipeline records on one Redis.
#[derive(Clone)]
pub struct PipelineStore {
    conn: ConnectionManager,
}

impl PipelineStore {
    /// A store over `conn` (the job store's: `JobStore::connection`).
    pub fn new(conn: ConnectionManager) -> Self {
        PipelineStore { conn }
    }

    /// Records a new pipeline (state `running` at stage 0, its first event, in the running set);
    /// or, when `idempotency_key` was used by this team within a day, the pipeline it made then.
    pub async fn submit(
        &self,
        id: &str,
        spec: &PipelineSpec,
        idempotency_key: Option<&str>,
    ) -> Result<SubmitOutcome, StoreError> {
        static SUBMIT: std::sync::LazyLock<Script> = std::sync::LazyLock::new(|| {
            Script::new(
                r#"
-- KEYS: hash, events, all pipelines, team pipelines, idempotency key ("" = none), running set
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
redis.call("SADD", KEYS[6], ARGV[1])
redis.call("XADD", KEYS[2], "*", "state", "running", "stage", "0", "job", "", "reason", "submitted", "at", ARGV[2])
if KEYS[5] ~= "" then redis.call("SET", KEYS[5], ARGV[1], "EX", ARGV[3]) end
return {1, ARGV[1]}
"#,
            )
        });
        let now = now_ms();
        let team = &spec.pipeline.team;
        let spec_json =
            serde_json::to_string(spec).map_err(|error| corrupt(id, "spec", error.to_string()))?;
        let idem_key =
            idempotency_key.map(|key| format!("{PREFIX}:idem:{team}:pipeline:{key}")).unwrap_or_default();
        let mut invocation = SUBMIT.prepare_invoke();
        invocation
            .key(pipeline_key(id))
            .key(events_key(id))
            .key(format!("{PREFIX}:pipelines"))
            .key(team_key(team))
            .key(idem_key)
            .key(RUNNING)
            .arg(id)
            .arg(now)
            .arg(IDEMPOTENCY_TTL.as_secs());
        let fields: [(&str, String); 10] = [
            ("id", id.to_owned()),
            ("team", team.clone()),
            ("name", spec.pipeline.name.clone()),
            ("state", PipelineState::Running.as_str().to_owned()),
            ("reason", "submitted".to_owned()),
            ("stage", "0".to_owned()),
            ("stages", spec.stages.len().to_string()),
            ("created_at", now.to_string()),
            ("updated_at", now.to_string()),
            ("spec", spec_json),
        ];
        for (field, value) in fields {
            invocation.arg(field).arg(value);
        }
        let (created, existing): (i64, String) = invocation.invoke_async(&mut self.conn.clone()).await?;
        Ok(if created == 1 {
            SubmitOutcome::Created { id: id.to_owned(), task_id: String::new() }
        } else {
            SubmitOutcome::Existing { id: existing }
        })
    }

    /// The pipeline as the API shows it (its stages' job states left for the caller to read).
    pub async fn get(&self, id: &str) -> Result<PipelineView, StoreError> {
        let fields: HashMap<String, String> = self.conn.clone().hgetall(pipeline_key(id)).await?;
        if fields.is_empty() {
            return Err(StoreError::NotFound(id.to_owned()));
        }
        view_from_fields(id, &fields)
    }

    /// The pipeline's spec as submitted.
    pub async fn spec(&self, id: &str) -> Result<PipelineSpec, StoreError> {
        let text: Option<String> = self.conn.clone().hget(pipeline_key(id), "spec").await?;
        let text = text.ok_or_else(|| StoreError::NotFound(id.to_owned()))?;
        PipelineSpec::from_json(&text).map_err(|error| corrupt(id, "spec", error.to_string()))
    }

    /// The newest `limit` pipelines, of `team` or of every team.
    pub async fn list(&self, team: Option<&str>, limit: usize) -> Result<Vec<PipelineView>, StoreError> {
        let index = team.map_or_else(|| format!("{PREFIX}:pipelines"), team_key);
        let stop = limit.max(1) as isize - 1;
        let ids: Vec<String> = self.conn.clone().zrevrange(index, 0, stop).await?;
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let mut pipe = redis::pipe();
        for id in &ids {
            pipe.hgetall(pipeline_key(id));
        }
        let records: Vec<HashMap<String, String>> = pipe.query_async(&mut self.conn.clone()).await?;
        ids.iter()
            .zip(records)
            .filter(|(_, fields)| !fields.is_empty())
            .map(|(id, fields)| view_from_fields(id, &fields))
            .collect()
    }

    /// The ids of the pipelines that are running: what the daemons drive.
    pub async fn running(&self) -> Result<Vec<String>, StoreError> {
        Ok(self.conn.clone().smembers(RUNNING).await?)
    }

    /// Records `job_id` as stage `stage`'s job, unless one is recorded already (then that one),
    /// while the pipeline runs at that stage with no cancel asked for. Appends the event `reason`
    /// when it records.
    pub async fn claim_stage(
        &self,
        id: &str,
        stage: u32,
        job_id: &str,
        reason: &str,
    ) -> Result<Claim, StoreError> {
        static CLAIM: std::sync::LazyLock<Script> = std::sync::LazyLock::new(|| {
            Script::new(
                r#"
-- KEYS: hash, events; ARGV: stage, job id, now ms, reason
local state = redis.call("HGET", KEYS[1], "state")
if not state then return {-1, ""} end
if state ~= "running" or redis.call("HGET", KEYS[1], "stage") ~= ARGV[1] then return {0, ""} end
local existing = redis.call("HGET", KEYS[1], "job." .. ARGV[1])
if existing then return {1, existing} end
if redis.call("HGET", KEYS[1], "cancel") == "1" then return {0, ""} end
redis.call("HSET", KEYS[1], "job." .. ARGV[1], ARGV[2], "updated_at", ARGV[3])
redis.call("XADD", KEYS[2], "*", "state", "running", "stage", ARGV[1], "job", ARGV[2], "reason", ARGV[4], "at", ARGV[3])
return {1, ARGV[2]}
"#,
            )
        });
        let (done, job): (i64, String) = CLAIM
            .key(pipeline_key(id))
            .key(events_key(id))
            .arg(stage)
            .arg(job_id)
            .arg(now_ms())
            .arg(reason)
            .invoke_async(&mut self.conn.clone())
            .await?;
        match done {
            -1 => Err(StoreError::NotFound(id.to_owned())),
            1 => Ok(Claim::Job(job)),
            _ => Ok(Claim::Stale),
        }
    }

    /// Records stage `stage`'s output and moves the pipeline to the next stage, or to
    /// `succeeded` after the last, with the event `reason`. `false` when the pipeline is not
    /// running at that stage (another daemon advanced it, or it ended).
    pub async fn advance(
        &self,
        id: &str,
        stage: u32,
        output: &StageOutput,
        last: bool,
        reason: &str,
    ) -> Result<bool, StoreError> {
        static ADVANCE: std::sync::LazyLock<Script> = std::sync::LazyLock::new(|| {
            Script::new(
                r#"
-- KEYS: hash, events, running set; ARGV: stage, output json, now ms, reason, last ("1"/"0"), id
local state = redis.call("HGET", KEYS[1], "state")
if state ~= "running" or redis.call("HGET", KEYS[1], "stage") ~= ARGV[1] then return 0 end
local next = tostring(tonumber(ARGV[1]) + 1)
redis.call("HSET", KEYS[1], "output." .. ARGV[1], ARGV[2], "stage", next, "updated_at", ARGV[3])
local new_state = "running"
if ARGV[5] == "1" then
  new_state = "succeeded"
  redis.call("HSET", KEYS[1], "state", new_state, "reason", ARGV[4])
  redis.call("SREM", KEYS[3], ARGV[6])
end
local job = redis.call("HGET", KEYS[1], "job." .. ARGV[1]) or ""
redis.call("XADD", KEYS[2], "*", "state", new_state, "stage", ARGV[1], "job", job, "reason", ARGV[4], "at", ARGV[3])
return 1
"#,
            )
        });
        let output =
            serde_json::to_string(output).map_err(|error| corrupt(id, "output", error.to_string()))?;
        let done: i64 = ADVANCE
            .key(pipeline_key(id))
            .key(events_key(id))
            .key(RUNNING)
            .arg(stage)
            .arg(output)
            .arg(now_ms())
            .arg(reason)
            .arg(if last { "1" } else { "0" })
            .arg(id)
            .invoke_async(&mut self.conn.clone())
            .await?;
        Ok(done == 1)
    }

    /// Ends a running pipeline in `state` (failed or cancelled) with `reason`; `false` when it
    /// had ended already.
    pub async fn finish(&self, id: &str, state: PipelineState, reason: &str) -> Result<bool, StoreError> {
        static FINISH: std::sync::LazyLock<Script> = std::sync::LazyLock::new(|| {
            Script::new(
                r#"
-- KEYS: hash, events, running set; ARGV: state, reason, now ms, id
if redis.call("HGET", KEYS[1], "state") ~= "running" then return 0 end
redis.call("HSET", KEYS[1], "state", ARGV[1], "reason", ARGV[2], "updated_at", ARGV[3])
redis.call("SREM", KEYS[3], ARGV[4])
local stage = redis.call("HGET", KEYS[1], "stage") or "0"
local job = redis.call("HGET", KEYS[1], "job." .. stage) or ""
redis.call("XADD", KEYS[2], "*", "state", ARGV[1], "stage", stage, "job", job, "reason", ARGV[2], "at", ARGV[3])
return 1
"#,
            )
        });
        let done: i64 = FINISH
            .key(pipeline_key(id))
            .key(events_key(id))
            .key(RUNNING)
            .arg(state.as_str())
            .arg(reason)
            .arg(now_ms())
            .arg(id)
            .invoke_async(&mut self.conn.clone())
            .await?;
        Ok(done == 1)
    }

    /// Asks a running pipeline to stop: no further stage is submitted, and the daemon driving it
    /// cancels the running stage's job and ends the pipeline `cancelled`. Returns the state it
    /// was in and the running stage's job, when it has one.
    pub async fn cancel(&self, id: &str) -> Result<(PipelineState, Option<String>), StoreError> {
        static CANCEL: std::sync::LazyLock<Script> = std::sync::LazyLock::new(|| {
            Script::new(
                r#"
-- KEYS: hash; ARGV: now ms
local state = redis.call("HGET", KEYS[1], "state")
if not state then return {"", ""} end
if state ~= "running" then return {state, ""} end
redis.call("HSET", KEYS[1], "cancel", "1", "updated_at", ARGV[1])
local stage = redis.call("HGET", KEYS[1], "stage") or "0"
return {state, redis.call("HGET", KEYS[1], "job." .. stage) or ""}
"#,
            )
        });
        let (state, job): (String, String) =
            CANCEL.key(pipeline_key(id)).arg(now_ms()).invoke_async(&mut self.conn.clone()).await?;
        if state.is_empty() {
            return Err(StoreError::NotFound(id.to_owned()));
        }
        let state = state.parse().map_err(|message| corrupt(id, "state", message))?;
        Ok((state, Some(job).filter(|job| !job.is_empty())))
    }

    /// Up to 100 events after stream id `after` (`"0"` = from the first); it does not block
    /// (see `JobStore::events`).
    pub async fn events(&self, id: &str, after: &str) -> Result<Vec<PipelineEvent>, StoreError> {
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
                events.push(PipelineEvent {
                    id: entry.id.clone(),
                    at: rfc3339(field("at").parse().unwrap_or(0)),
                    state: field("state").parse().map_err(|message| corrupt(id, "state", message))?,
                    stage: field("stage").parse().unwrap_or(0),
                    job: field("job"),
                    reason: field("reason"),
                });
            }
        }
        Ok(events)
    }
}

fn pipeline_key(id: &str) -> String {
    format!("{PREFIX}:pipeline:{id}")
}

fn events_key(id: &str) -> String {
    format!("{PREFIX}:pipeline-events:{id}")
}

fn team_key(team: &str) -> String {
    format!("{PREFIX}:team:{team}:pipelines")
}

fn corrupt(id: &str, field: &'static str, message: String) -> StoreError {
    StoreError::Corrupt { id: id.to_owned(), field, message }
}

fn view_from_fields(id: &str, fields: &HashMap<String, String>) -> Result<PipelineView, StoreError> {
    let text = |name: &str| fields.get(name).cloned().unwrap_or_default();
    let number = |name: &'static str| -> Result<u64, StoreError> {
        match fields.get(name) {
            None => Ok(0),
            Some(value) => value
                .parse()
                .map_err(|_| corrupt(id, name, format!("expected a whole number, got {value:?}"))),
        }
    };
    let spec: Option<PipelineSpec> = fields.get("spec").and_then(|text| serde_json::from_str(text).ok());
    let count = number("stages")? as u32;
    let stages = (0..count)
        .map(|i| StageView {
            index: i,
            name: spec
                .as_ref()
                .and_then(|spec| spec.stages.get(i as usize))
                .map(|stage| stage.job.name.clone())
                .unwrap_or_default(),
            job: fields.get(&format!("job.{i}")).cloned(),
            job_state: None,
            output: fields.get(&format!("output.{i}")).and_then(|text| serde_json::from_str(text).ok()),
        })
        .collect();
    Ok(PipelineView {
        id: id.to_owned(),
        team: text("team"),
        name: text("name"),
        state: text("state").parse().map_err(|message| corrupt(id, "state", message))?,
        stage: number("stage")? as u32,
        reason: text("reason"),
        cancel_requested: fields.get("cancel").is_some_and(|flag| flag == "1"),
        created_at: rfc3339(number("created_at")?),
        updated_at: rfc3339(number("updated_at")?),
        stages,
    })
}
