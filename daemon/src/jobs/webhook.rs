//! The published manifest, POSTed to the job's `[publish] webhook` (design.md §6).
//!
//! Publication comes first and stands: a webhook that is down, slow or answering errors is
//! retried with backoff and then reported on the job (`webhook`), never un-publishing anything.
//!
//! Every request goes through the daemon's outbound client (`[outbound]`, `rlvr_outbound`): the
//! url was checked at submit and is checked again here (the operator's list may have changed),
//! each address the host resolves to is checked before the connection, no proxy is used and no
//! redirect followed. A refusal or a redirect is final: retrying would get the same answer.

use std::time::Duration;

use rlvr_outbound::{Refusal, refusal_of};
use rlvr_protocol::gates::Manifest;
use tracing::{info, warn};

/// Tries per delivery; the waits between them double from [`FIRST_BACKOFF`]: 0.5 + 1 + 2 + 4 s,
/// enough to ride out a receiver's restart without holding a job's record open for minutes.
pub const ATTEMPTS: u32 = 5;
pub const FIRST_BACKOFF: Duration = Duration::from_millis(500);
/// One attempt's limit, connection included.
pub const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(10);

/// The builder of the daemon's outbound client: each attempt's limit. `rlvr_outbound::Client`
/// adds the resolver, no redirects and no proxy.
pub fn client_builder() -> reqwest::ClientBuilder {
    reqwest::Client::builder().timeout(ATTEMPT_TIMEOUT)
}

/// POSTs `manifest` to `url` through `client` until a 2xx answer or [`ATTEMPTS`] tries; returns
/// what happened, in words, for the job record.
pub async fn deliver(client: &rlvr_outbound::Client, url: &str, manifest: &Manifest) -> String {
    let mut backoff = FIRST_BACKOFF;
    let mut last = String::new();
    for attempt in 1..=ATTEMPTS {
        let request = match client.post(url) {
            Ok(request) => request,
            Err(refusal) => return refused(url, &refusal),
        };
        match request.json(manifest).send().await {
            Ok(answer) if answer.status().is_success() => {
                let status = answer.status().as_u16();
                info!(url, status, attempt, "webhook delivered");
                return format!("delivered to {url} (HTTP {status}) on attempt {attempt}");
            }
            Ok(answer) if answer.status().is_redirection() => {
                let status = answer.status().as_u16();
                warn!(url, status, "webhook answered a redirect; not followed");
                return format!(
                    "not delivered to {url}: the webhook answered a redirect (HTTP {status}), which is not followed"
                );
            }
            Ok(answer) => last = format!("HTTP {}", answer.status()),
            Err(error) => match refusal_of(&error) {
                Some(refusal) => return refused(url, refusal),
                None => last = rlvr_outbound::describe(error),
            },
        }
        warn!(url, attempt, error = %last, "webhook not delivered");
        if attempt < ATTEMPTS {
            tokio::time::sleep(backoff).await;
            backoff *= 2;
        }
    }
    format!("not delivered to {url} after {ATTEMPTS} attempts (the checkpoint stays published): {last}")
}

/// What a refusal by the outbound policy (at the url or after DNS) records: no retry would
/// change it.
fn refused(url: &str, refusal: &Refusal) -> String {
    warn!(url, %refusal, "webhook refused by the outbound policy");
    format!("not delivered to {url}: {refusal}")
}
