//! Tinker SDK sessions on Redis: who opened each, when it last showed it is alive, whether it
//! finished. Every daemon answers every session (the SDK may reach any of them behind one
//! address), so a session lives here, not in a daemon's memory. Each change is one command or
//! one Lua script, so a heartbeat racing a finish cannot bring a finished session back.
//!
//! Keys (under `rlvr:`):
//! - `tinker:session:{id}` hash — `team`, `sdk_version`, `created_at`, `heartbeat_at` (ms), and
//!   once it ended `finished` (`success`, `errored`, `interrupted`, or `heartbeats stopped`);
//!   kept [`SESSION_TTL`] after its last heartbeat or change. The SDK beats every 10 s, so a live
//!   session never expires, and what a team can keep is bounded by its request rate over that
//!   hour (`api.rate_limit_per_minute` × 60 records of ~200 bytes: 7 MB at the default 600).

use redis::aio::ConnectionManager;
use redis::{AsyncCommands, Script};

use crate::store::{StoreError, now_ms};

/// How long a session's record is kept after its last heartbeat or change.
pub const SESSION_TTL: std::time::Duration = std::time::Duration::from_secs(3600);

fn session_key(id: &str) -> String {
    format!("rlvr:tinker:session:{id}")
}

/// A session as its record says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Session {
    pub id: String,
    pub team: String,
    pub sdk_version: String,
    pub created_at_ms: u64,
    pub heartbeat_at_ms: u64,
    /// Why it ended, once it did.
    pub finished: Option<String>,
}

/// What a heartbeat found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Beat {
    /// Alive: its time is now.
    Alive,
    /// It ended (the SDK stops its heartbeats on 410).
    Finished(String),
    /// No session of the team's has this id.
    Unknown,
}

/// The sessions on one Redis.
#[derive(Clone)]
pub struct TinkerStore {
    conn: ConnectionManager,
}

impl TinkerStore {
    /// A store over `conn` (the job store's: `JobStore::connection`).
    pub fn new(conn: ConnectionManager) -> Self {
        TinkerStore { conn }
    }

    /// Records a new session `id` of `team`.
    pub async fn create_session(&self, id: &str, team: &str, sdk_version: &str) -> Result<(), StoreError> {
        let now = now_ms().to_string();
        let key = session_key(id);
        let mut conn = self.conn.clone();
        redis::pipe()
            .atomic()
            .hset_multiple(
                &key,
                &[("team", team), ("sdk_version", sdk_version), ("created_at", &now), ("heartbeat_at", &now)],
            )
            .ignore()
            .expire(&key, SESSION_TTL.as_secs() as i64)
            .ignore()
            .query_async::<()>(&mut conn)
            .await?;
        Ok(())
    }

    /// Session `id` if it is `team`'s (another team's is not found, as an absent one).
    pub async fn session(&self, id: &str, team: &str) -> Result<Option<Session>, StoreError> {
        let mut conn = self.conn.clone();
        let fields: std::collections::HashMap<String, String> = conn.hgetall(session_key(id)).await?;
        if fields.get("team").map(String::as_str) != Some(team) {
            return Ok(None);
        }
        let number = |name: &str| fields.get(name).and_then(|value| value.parse().ok()).unwrap_or(0);
        Ok(Some(Session {
            id: id.to_owned(),
            team: team.to_owned(),
            sdk_version: fields.get("sdk_version").cloned().unwrap_or_default(),
            created_at_ms: number("created_at"),
            heartbeat_at_ms: number("heartbeat_at"),
            finished: fields.get("finished").cloned(),
        }))
    }

    /// A heartbeat of `team`'s session `id`: its time moves on unless it ended.
    pub async fn heartbeat(&self, id: &str, team: &str) -> Result<Beat, StoreError> {
        // KEYS[1] the session; ARGV team, now, ttl. Returns {"alive"} | {"finished", why} | {"unknown"}.
        let script = Script::new(
            r"
            local team = redis.call('HGET', KEYS[1], 'team')
            if team ~= ARGV[1] then return {'unknown'} end
            local finished = redis.call('HGET', KEYS[1], 'finished')
            if finished then return {'finished', finished} end
            redis.call('HSET', KEYS[1], 'heartbeat_at', ARGV[2])
            redis.call('EXPIRE', KEYS[1], ARGV[3])
            return {'alive'}
            ",
        );
        let mut conn = self.conn.clone();
        let answer: Vec<String> = script
            .key(session_key(id))
            .arg(team)
            .arg(now_ms())
            .arg(SESSION_TTL.as_secs())
            .invoke_async(&mut conn)
            .await?;
        Ok(match answer.as_slice() {
            [alive] if alive == "alive" => Beat::Alive,
            [_, why] => Beat::Finished(why.clone()),
            _ => Beat::Unknown,
        })
    }

    /// Ends `team`'s session `id` for `why` (the first end stands). False when it has no such
    /// session.
    pub async fn finish(&self, id: &str, team: &str, why: &str) -> Result<bool, StoreError> {
        let script = Script::new(
            r"
            if redis.call('HGET', KEYS[1], 'team') ~= ARGV[1] then return 0 end
            redis.call('HSETNX', KEYS[1], 'finished', ARGV[2])
            redis.call('EXPIRE', KEYS[1], ARGV[3])
            return 1
            ",
        );
        let mut conn = self.conn.clone();
        let found: i64 = script
            .key(session_key(id))
            .arg(team)
            .arg(why)
            .arg(SESSION_TTL.as_secs())
            .invoke_async(&mut conn)
            .await?;
        Ok(found == 1)
    }
}
