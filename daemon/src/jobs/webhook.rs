//! The published manifest, POSTed to the job's `[publish] webhook` (design.md §6).
//!
//! Publication comes first and stands: a webhook that is down, slow or answering errors is
//! retried with backoff and then reported on the job (`webhook`), never un-publishing anything.

use std::time::Duration;

use rlvr_protocol::gates::Manifest;
use tracing::{info, warn};

/// Tries per delivery; the waits between them double from [`FIRST_BACKOFF`]: 0.5 + 1 + 2 + 4 s,
/// enough to ride out a receiver's restart without holding a job's record open for minutes.
pub const ATTEMPTS: u32 = 5;
pub const FIRST_BACKOFF: Duration = Duration::from_millis(500);
/// One attempt's limit, connection included.
pub const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(10);

/// POSTs `manifest` to `url` until a 2xx answer or [`ATTEMPTS`] tries; returns what happened,
/// in words, for the job record.
pub async fn deliver(url: &str, manifest: &Manifest) -> String {
    let client = match reqwest::Client::builder().timeout(ATTEMPT_TIMEOUT).build() {
        Ok(client) => client,
        Err(error) => return format!("not delivered: cannot build an HTTP client: {error}"),
    };
    let mut backoff = FIRST_BACKOFF;
    let mut last = String::new();
    for attempt in 1..=ATTEMPTS {
        match client.post(url).json(manifest).send().await {
            Ok(answer) if answer.status().is_success() => {
                let status = answer.status().as_u16();
                info!(url, status, attempt, "webhook delivered");
                return format!("delivered to {url} (HTTP {status}) on attempt {attempt}");
            }
            Ok(answer) => last = format!("HTTP {}", answer.status()),
            Err(error) => last = describe(error),
        }
        warn!(url, attempt, error = %last, "webhook not delivered");
        if attempt < ATTEMPTS {
            tokio::time::sleep(backoff).await;
            backoff *= 2;
        }
    }
    format!("not delivered to {url} after {ATTEMPTS} attempts (the checkpoint stays published): {last}")
}

/// reqwest's message and its causes, without the URL it repeats (the caller names it once).
fn describe(error: reqwest::Error) -> String {
    let error = error.without_url();
    let mut text = error.to_string();
    let mut source = std::error::Error::source(&error);
    while let Some(cause) = source {
        text = format!("{text}: {cause}");
        source = cause.source();
    }
    text
}
