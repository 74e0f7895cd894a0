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

    /// Pings Redis once and records the outcome; logs when it changes.
    pub async fn check(&self) {
        let mut connection = self.connection.lock().await;
        let outcome = match tokio::time::timeout(PING_TIMEOUT, ping(&self.url, &mut connection)).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(error)) => Err(error.to_string()),
            Err(_) => Err(format!("no answer within {} s", PING_TIMEOUT.as_secs())),
        };
        if outcome.is_err() {
            *connection = None;
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

async fn ping(url: &str, connection: &mut Option<MultiplexedConnection>) -> redis::RedisResult<()> {
    let live = match connection {
        Some(live) => live,
        None => connection.insert(redis::Client::open(url)?.get_multiplexed_async_connection().await?),
    };
    let _: String = redis::cmd("PING").query_async(live).await?;
    Ok(())
}
