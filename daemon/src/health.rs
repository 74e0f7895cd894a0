//! What `GET /healthz` reports: whether the daemon's dependencies answer.
//!
//! Redis is pinged in the background (never on the request path, so a hung Redis cannot hang
//! health checks) over one kept connection, re-opened after a failure; the last answer is kept.

use std::sync::Mutex;
use std::time::Duration;

use redis::aio::MultiplexedConnection;

/// How long one Redis ping (including a reconnect) may take.
const PING_TIMEOUT: Duration = Duration::from_secs(2);
/// How often the main loop pings Redis.
pub const PING_INTERVAL: Duration = Duration::from_secs(2);

/// The Redis connection used for health pings, and the last known state.
pub struct RedisHealth {
    url: String,
    /// `None` before the first connection and after a failure.
    connection: tokio::sync::Mutex<Option<MultiplexedConnection>>,
    /// `None` before the first ping; then `Ok(())` or the error text.
    last: Mutex<Option<Result<(), String>>>,
}

impl RedisHealth {
    /// Health of the Redis at `url`; nothing is contacted until [`RedisHealth::check`].
    pub fn new(url: String) -> Self {
        RedisHealth { url, connection: tokio::sync::Mutex::new(None), last: Mutex::new(None) }
    }

    /// The last ping's outcome: `None` before the first.
    pub fn get(&self) -> Option<Result<(), String>> {
        self.last.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).clone()
    }

    /// Pings Redis and records the outcome; logs when it changes. A kept connection that fails
    /// is replaced and the ping tried once more at once: a Redis restarted since the last ping
    /// broke the old connection, and is not down.
    pub async fn check(&self) {
        let mut connection = self.connection.lock().await;
        let reused = connection.is_some();
        let mut outcome = self.ping_once(&mut connection).await;
        if outcome.is_err() && reused {
            outcome = self.ping_once(&mut connection).await;
        }
        let mut last = self.last.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if last.as_ref().is_none_or(|previous| previous.is_ok() != outcome.is_ok()) {
            match &outcome {
                Ok(()) => tracing::info!("redis reachable"),
                Err(error) => tracing::warn!(%error, "redis unreachable"),
            }
        }
        *last = Some(outcome);
    }
}

impl RedisHealth {
    /// One ping over `connection` (opened first when there is none); a failure drops it.
    async fn ping_once(&self, connection: &mut Option<MultiplexedConnection>) -> Result<(), String> {
        let outcome = match tokio::time::timeout(PING_TIMEOUT, ping(&self.url, connection)).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(error)) => Err(error.to_string()),
            Err(_) => Err(format!("no answer within {} s", PING_TIMEOUT.as_secs())),
        };
        if outcome.is_err() {
            *connection = None;
        }
        outcome
    }
}

async fn ping(url: &str, connection: &mut Option<MultiplexedConnection>) -> redis::RedisResult<()> {
    let live = match connection {
        Some(live) => live,
        None => connection.insert(redis::Client::open(url)?.get_multiplexed_async_connection().await?),
    };
    let _: String = redis::cmd("PING").query_async(live).await?;
    Ok(())
}
