//! What `GET /healthz` reports: whether the daemon's dependencies answer.
//!
//! Redis is pinged in the background (never on the request path, so a hung Redis cannot hang
//! health checks) and the last answer is kept here.

use std::sync::Mutex;
use std::time::Duration;

/// How long one Redis ping may take.
const PING_TIMEOUT: Duration = Duration::from_secs(2);

/// The last known state of Redis.
#[derive(Debug, Default)]
pub struct RedisHealth {
    /// `None` before the first ping; then `Ok(())` or the error text.
    last: Mutex<Option<Result<(), String>>>,
}

impl RedisHealth {
    /// The last ping's outcome: `None` before the first.
    pub fn get(&self) -> Option<Result<(), String>> {
        self.last.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).clone()
    }

    /// Pings Redis at `url` once and records the outcome; logs when it changes.
    pub async fn check(&self, url: &str) {
        let outcome = match tokio::time::timeout(PING_TIMEOUT, ping(url)).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(error)) => Err(error.to_string()),
            Err(_) => Err(format!("no answer within {} s", PING_TIMEOUT.as_secs())),
        };
        let mut last = self.last.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let changed = last.as_ref().is_none_or(|previous| previous.is_ok() != outcome.is_ok());
        if changed {
            match &outcome {
                Ok(()) => tracing::info!("redis reachable"),
                Err(error) => tracing::warn!(%error, "redis unreachable"),
            }
        }
        *last = Some(outcome);
    }
}

async fn ping(url: &str) -> redis::RedisResult<()> {
    let client = redis::Client::open(url)?;
    let mut connection = client.get_multiplexed_async_connection().await?;
    let _: String = redis::cmd("PING").query_async(&mut connection).await?;
    Ok(())
}
