//! The keys that say how a plugin survives a slow, failing or dead peer (`timeout_ms`,
//! `retries`, `backoff_ms`, `backoff_max_ms`, `retry_on`, `breaker_failures`,
//! `breaker_cooldown_ms`, `max_response_bytes`), and the checks that keep every item's total
//! time under [`MAX_ITEM_BUDGET_MS`].
//!
//! Each plugin declares these keys in its own options struct (serde's `flatten` would lose
//! `deny_unknown_fields`, and with it the "unknown key; expected one of …" refusals) and hands
//! their values to [`ResilienceKeys::check`].

use std::time::Duration;

use rlvr_plugin_api::{HostContext, OptionError, Resource};
use serde::Deserialize;

/// The most one item may take, retries and backoff included, in the worst case the config allows.
///
/// Why 25 s: the host's default per-item deadline (`rlvrctl verify --deadline-ms`) is 30 s; the
/// plugin must give its own answer (a timeout verdict naming the cause) well before the host
/// cuts the call off.
pub const MAX_ITEM_BUDGET_MS: u64 = 25_000;

/// The largest `max_response_bytes` accepted.
pub const MAX_RESPONSE_BYTES_LIMIT: u64 = 64 * 1024 * 1024;

/// The most retries accepted.
pub const MAX_RETRIES: u32 = 10;

/// Which failures of one attempt are retried.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Deserialize)]
pub enum RetryOn {
    /// No connection, or the connection broke before a full response (refused, reset, closed).
    #[serde(rename = "connect")]
    Connect,
    /// The attempt ran past `timeout_ms`.
    #[serde(rename = "timeout")]
    Timeout,
    /// The peer answered 500–599.
    #[serde(rename = "5xx")]
    ServerError,
    /// The peer answered 429 Too Many Requests.
    #[serde(rename = "429")]
    TooManyRequests,
}

/// The keys' values as written (each plugin chooses its defaults).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResilienceKeys {
    /// `timeout_ms`: the limit of one attempt, from connecting until the last byte of the answer.
    pub timeout_ms: u64,
    /// `retries`: further attempts after a retryable failure.
    pub retries: u32,
    /// `backoff_ms`: the first backoff before a retry; doubled on each further retry.
    pub backoff_ms: u64,
    /// `backoff_max_ms`: the largest backoff.
    pub backoff_max_ms: u64,
    /// `retry_on`: which failures are retried.
    pub retry_on: Vec<RetryOn>,
    /// `breaker_failures`: consecutive failed attempts that open the breaker; 0 turns it off.
    pub breaker_failures: u32,
    /// `breaker_cooldown_ms`: how long an open breaker fails fast before one probe goes out.
    pub breaker_cooldown_ms: u64,
    /// `max_response_bytes`: the largest answer body accepted.
    pub max_response_bytes: u64,
}

/// Checked resilience settings, in the types the client uses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resilience {
    /// Limit of one attempt.
    pub timeout: Duration,
    /// Further attempts after a retryable failure.
    pub retries: u32,
    /// First backoff.
    pub backoff: Duration,
    /// Largest backoff.
    pub backoff_max: Duration,
    /// Retried failure classes.
    pub retry_on: Vec<RetryOn>,
    /// Breaker threshold (0: off).
    pub breaker_failures: u32,
    /// Breaker cooldown.
    pub breaker_cooldown: Duration,
    /// Largest answer body.
    pub max_response_bytes: u64,
}

/// Holds `limits.max_response_bytes` to the operator's cap when the host gives one (the daemon
/// always does): beyond it, refused at the key if the options (`config_json`) set it, else
/// lowered (`GraderCaps::hold`). A judge answering 60 MB an item took the daemon to 549 MB.
pub fn hold_to_caps(
    limits: &mut Resilience,
    host: &HostContext,
    config_json: &str,
) -> Result<(), OptionError> {
    let Some(caps) = &host.grader_caps else { return Ok(()) };
    let written: serde_json::Value = serde_json::from_str(config_json).unwrap_or_default();
    let set = written.get("max_response_bytes").is_some();
    caps.hold("max_response_bytes", Resource::ResponseBytes, &mut limits.max_response_bytes, set)
}

impl Resilience {
    /// The worst-case time of one item: every attempt times out and every backoff is the largest.
    pub fn item_budget(&self) -> Duration {
        self.timeout * (self.retries + 1) + self.backoff_max * self.retries
    }

    /// Whether failures of `class` are retried.
    pub fn retries_on(&self, class: RetryOn) -> bool {
        self.retry_on.contains(&class)
    }
}

impl ResilienceKeys {
    /// Checks the values; each refusal names its key, as the spec writes it.
    pub fn check(self) -> Result<Resilience, OptionError> {
        let refuse = |key: &str, message: String| OptionError::new(key, message);
        if !(1..=60_000).contains(&self.timeout_ms) {
            return Err(refuse("timeout_ms", format!("expected 1 to 60000, got {}", self.timeout_ms)));
        }
        if self.retries > MAX_RETRIES {
            return Err(refuse("retries", format!("expected 0 to {MAX_RETRIES}, got {}", self.retries)));
        }
        if self.backoff_ms > self.backoff_max_ms {
            return Err(refuse(
                "backoff_ms",
                format!("expected at most backoff_max_ms ({}), got {}", self.backoff_max_ms, self.backoff_ms),
            ));
        }
        // regression: a huge backoff_max_ms overflowed this sum (a panic in a debug build)
        let worst = (u64::from(self.retries + 1) * self.timeout_ms)
            .saturating_add(u64::from(self.retries).saturating_mul(self.backoff_max_ms));
        if worst > MAX_ITEM_BUDGET_MS {
            return Err(refuse(
                "timeout_ms",
                format!(
                    "the worst case per item, (retries + 1) × timeout_ms + retries × backoff_max_ms = {worst} \
                     ms, exceeds the {MAX_ITEM_BUDGET_MS} ms cap"
                ),
            ));
        }
        if self.breaker_failures > 0 && !(1..=600_000).contains(&self.breaker_cooldown_ms) {
            return Err(refuse(
                "breaker_cooldown_ms",
                format!("expected 1 to 600000, got {}", self.breaker_cooldown_ms),
            ));
        }
        if !(1..=MAX_RESPONSE_BYTES_LIMIT).contains(&self.max_response_bytes) {
            return Err(refuse(
                "max_response_bytes",
                format!("expected 1 to {MAX_RESPONSE_BYTES_LIMIT}, got {}", self.max_response_bytes),
            ));
        }
        Ok(Resilience {
            timeout: Duration::from_millis(self.timeout_ms),
            retries: self.retries,
            backoff: Duration::from_millis(self.backoff_ms),
            backoff_max: Duration::from_millis(self.backoff_max_ms),
            retry_on: self.retry_on,
            breaker_failures: self.breaker_failures,
            breaker_cooldown: Duration::from_millis(self.breaker_cooldown_ms),
            max_response_bytes: self.max_response_bytes,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys() -> ResilienceKeys {
        ResilienceKeys {
            timeout_ms: 5_000,
            retries: 2,
            backoff_ms: 100,
            backoff_max_ms: 1_000,
            retry_on: vec![RetryOn::Connect],
            breaker_failures: 5,
            breaker_cooldown_ms: 5_000,
            max_response_bytes: 1024,
        }
    }

    /// `expected`: `Ok(item budget in ms)` or the whole error, `"<key>: <message>"`.
    fn check(change: impl FnOnce(&mut ResilienceKeys), expected: Result<u64, &str>) {
        let mut keys = keys();
        change(&mut keys);
        let got = keys.clone().check().map(|r| r.item_budget().as_millis() as u64).map_err(|e| e.to_string());
        assert_eq!(got, expected.map_err(str::to_owned), "{keys:?}");
    }

    // regression: a judge answering 60 MB an item took the daemon from 104 to 549 MB
    #[test]
    fn the_operators_cap_holds_the_answer_size() {
        let caps = rlvr_plugin_api::GraderCaps {
            memory_mb: 2048,
            max_file_mb: 64,
            max_processes: 64,
            max_parallel: 4,
            max_response_bytes: 512,
            work_root: None,
        };
        let capped = HostContext { grader_caps: Some(caps), ..HostContext::default() };
        // (options as written, host, the size held or the refusal)
        let cases: [(&str, &HostContext, Result<u64, &str>); 4] = [
            // A default beyond the cap is lowered; one within it is kept; no caps, no change.
            ("{}", &capped, Ok(512)),
            (
                r#"{"max_response_bytes": 1024}"#,
                &capped,
                Err(
                    "max_response_bytes: expected at most 512 on this host (graders.max_response_bytes), got 1024",
                ),
            ),
            (r#"{"max_response_bytes": 1024}"#, &HostContext::default(), Ok(1024)),
            ("{}", &HostContext::default(), Ok(1024)),
        ];
        for (json, host, expected) in cases {
            let mut limits = keys().check().unwrap();
            let got = hold_to_caps(&mut limits, host, json)
                .map(|()| limits.max_response_bytes)
                .map_err(|e| e.to_string());
            assert_eq!(got, expected.map_err(str::to_owned), "{json}");
        }
    }

    #[test]
    fn accepted_and_refused_values_name_their_key() {
        check(|_| {}, Ok(17_000));
        check(|k| k.retries = 0, Ok(5_000));
        check(|k| (k.breaker_failures, k.breaker_cooldown_ms) = (0, 0), Ok(17_000));
        check(|k| k.timeout_ms = 0, Err("timeout_ms: expected 1 to 60000, got 0"));
        check(|k| k.retries = 11, Err("retries: expected 0 to 10, got 11"));
        check(|k| k.backoff_ms = 2_000, Err("backoff_ms: expected at most backoff_max_ms (1000), got 2000"));
        check(
            |k| k.timeout_ms = 10_000,
            Err(
                "timeout_ms: the worst case per item, (retries + 1) × timeout_ms + retries × backoff_max_ms = \
                 32000 ms, exceeds the 25000 ms cap",
            ),
        );
        check(|k| k.breaker_cooldown_ms = 0, Err("breaker_cooldown_ms: expected 1 to 600000, got 0"));
        check(|k| k.max_response_bytes = 0, Err("max_response_bytes: expected 1 to 67108864, got 0"));
        // The largest counts cannot overflow the worst-case sum.
        check(
            |k| (k.retries, k.backoff_max_ms, k.backoff_ms) = (10, u64::MAX, 0),
            Err(
                "timeout_ms: the worst case per item, (retries + 1) × timeout_ms + retries × backoff_max_ms = \
                 18446744073709551615 ms, exceeds the 25000 ms cap",
            ),
        );
    }
}
