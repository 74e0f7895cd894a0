//! One HTTP attempt: send the request, read a bounded body, hand it to the plugin's parser, and
//! classify what went wrong; plus the backoff between attempts.

use std::io::Read;
use std::time::{Duration, Instant};

use reqwest::blocking::Response;
use reqwest::header::{ACCEPT, CONTENT_TYPE};
use reqwest::{StatusCode, Url};

use crate::outbound::Sender;
use crate::resilience::{Resilience, RetryOn};

/// How much of an error response's body goes into the message.
const ERROR_SNIPPET_CHARS: usize = 200;

/// Why one attempt did not give a valid answer.
#[derive(Debug, Clone, PartialEq)]
pub enum Failure {
    /// No connection, or it broke before a full response; the lowest-level cause.
    Connect(String),
    /// The TLS handshake failed (an unknown issuer, a wrong name, an expired certificate): a
    /// setup problem that a retry cannot fix and that says nothing about the service's health.
    Tls(String),
    /// The attempt ran past its time limit.
    Timeout,
    /// A status other than 2xx, with the start of the body.
    Status {
        /// The status code.
        code: u16,
        /// The start of the body, one line.
        snippet: String,
    },
    /// The body is larger than `max_response_bytes`.
    TooLarge,
    /// The body is not a valid answer (the plugin's parser says why).
    Invalid(String),
}

impl Failure {
    /// The retry class of this failure; `None` for failures a retry cannot fix.
    pub fn class(&self) -> Option<RetryOn> {
        match self {
            Failure::Connect(_) => Some(RetryOn::Connect),
            Failure::Timeout => Some(RetryOn::Timeout),
            Failure::Status { code: 429, .. } => Some(RetryOn::TooManyRequests),
            Failure::Status { code: 500..=599, .. } => Some(RetryOn::ServerError),
            Failure::Status { .. } | Failure::Tls(_) | Failure::TooLarge | Failure::Invalid(_) => None,
        }
    }

    /// What this failure tells the circuit breaker: `Some(false)` (unavailable) for connection
    /// errors, timeouts, 5xx and 429; `Some(true)` (up and answering) for a 4xx or a malformed
    /// body; `None` for a TLS failure, which is about the client's setup.
    pub fn health(&self) -> Option<bool> {
        match self {
            Failure::Tls(_) => None,
            other => Some(other.class().is_none()),
        }
    }

    /// The message, naming the limit that was hit where there is one; `peer` names who was
    /// called ("the service", "the judge").
    pub fn describe(&self, peer: &str, limits: &Resilience) -> String {
        match self {
            Failure::Connect(cause) => format!("cannot reach {peer}: {cause}"),
            Failure::Tls(cause) => format!("TLS handshake with {peer} failed: {cause}"),
            Failure::Timeout => {
                format!("{peer} did not answer within timeout_ms = {}", limits.timeout.as_millis())
            }
            Failure::Status { code, snippet } => {
                let status = StatusCode::from_u16(*code).map_or_else(|_| code.to_string(), |s| s.to_string());
                let redirect = if (300..400).contains(code) { " (redirects are not followed)" } else { "" };
                if snippet.is_empty() {
                    format!("{peer} answered {status}{redirect}")
                } else {
                    format!("{peer} answered {status}{redirect}: {snippet}")
                }
            }
            Failure::TooLarge => {
                format!("response body larger than max_response_bytes = {}", limits.max_response_bytes)
            }
            Failure::Invalid(message) => message.clone(),
        }
    }
}

/// POSTs the JSON `body` to `url` once, with at most `limits.timeout` for the whole exchange,
/// and hands a 2xx body to `parse` (its error is [`Failure::Invalid`]).
pub fn send<T>(
    client: &Sender,
    url: &Url,
    limits: &Resilience,
    body: &[u8],
    parse: impl FnOnce(&[u8]) -> Result<T, String>,
) -> Result<T, Failure> {
    let limit = limits.timeout;
    let deadline = Instant::now() + limit;
    let request =
        client.post(url).ok_or_else(|| Failure::Invalid("the outbound policy refuses the url".to_owned()))?;
    let response = request
        // The request timeout covers connecting, sending and the whole body; `read_bounded` checks
        // the deadline between reads as well.
        .timeout(limit)
        .header(CONTENT_TYPE, "application/json")
        .header(ACCEPT, "application/json")
        .body(body.to_vec())
        .send()
        .map_err(|error| classify(&error))?;
    let status = response.status();
    if status.is_success() {
        let bytes = read_bounded(response, limits.max_response_bytes, deadline)?;
        return parse(&bytes).map_err(Failure::Invalid);
    }
    // The body of an error answer only feeds the message: a little of it, and no failure of its own.
    let snippet = read_bounded(response, 4096, deadline).map(|bytes| snippet(&bytes)).unwrap_or_default();
    Err(Failure::Status { code: status.as_u16(), snippet })
}

/// Reads at most `max` bytes of the body before `deadline`; more is [`Failure::TooLarge`].
fn read_bounded(mut response: Response, max: u64, deadline: Instant) -> Result<Vec<u8>, Failure> {
    if response.content_length().is_some_and(|length| length > max) {
        return Err(Failure::TooLarge);
    }
    let mut bytes = Vec::new();
    let mut chunk = vec![0u8; 64 * 1024];
    loop {
        if Instant::now() >= deadline {
            return Err(Failure::Timeout);
        }
        let read = match response.read(&mut chunk) {
            Ok(0) => return Ok(bytes),
            Ok(read) => read,
            Err(error) if error.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(error) => return Err(classify_io(&error)),
        };
        if bytes.len() as u64 + read as u64 > max {
            return Err(Failure::TooLarge);
        }
        bytes.extend_from_slice(&chunk[..read]);
    }
}

fn classify(error: &reqwest::Error) -> Failure {
    if error.is_timeout() {
        return Failure::Timeout;
    }
    if let Some(tls) = causes(error).find_map(|cause| cause.downcast_ref::<rustls::Error>()) {
        return Failure::Tls(tls.to_string());
    }
    Failure::Connect(root_cause(error))
}

fn classify_io(error: &std::io::Error) -> Failure {
    let timed_out = causes(error).any(|cause| {
        cause.downcast_ref::<reqwest::Error>().is_some_and(reqwest::Error::is_timeout)
            || cause
                .downcast_ref::<std::io::Error>()
                .is_some_and(|io| io.kind() == std::io::ErrorKind::TimedOut)
    });
    if timed_out { Failure::Timeout } else { Failure::Connect(root_cause(error)) }
}

/// `error` and its causes, innermost last. An `io::Error`'s `source()` skips the error it wraps
/// (hyper nests rustls's error two `io::Error`s deep), so those are unwrapped with `get_ref`.
fn causes<'a>(
    error: &'a (dyn std::error::Error + 'static),
) -> impl Iterator<Item = &'a (dyn std::error::Error + 'static)> {
    std::iter::successors(Some(error), |current| {
        match current.downcast_ref::<std::io::Error>().and_then(std::io::Error::get_ref) {
            Some(wrapped) => Some(wrapped as &(dyn std::error::Error + 'static)),
            None => current.source(),
        }
    })
    // A cycle is not possible in practice; the bound makes sure.
    .take(32)
}

/// The innermost cause's message: "Connection refused (os error 111)" rather than reqwest's
/// "error sending request for url (...)".
fn root_cause(error: &(dyn std::error::Error + 'static)) -> String {
    causes(error).last().map_or_else(String::new, ToString::to_string)
}

/// The start of a body as one line, at most 200 characters and an ellipsis.
pub fn snippet(bytes: &[u8]) -> String {
    let text = String::from_utf8_lossy(bytes);
    let line: String = text
        .trim()
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .take(ERROR_SNIPPET_CHARS + 1)
        .collect();
    match line.char_indices().nth(ERROR_SNIPPET_CHARS) {
        Some((end, _)) => format!("{}…", &line[..end]),
        None => line,
    }
}

/// The wait before retry number `retry` (1 for the first): `base × 2^(retry−1)`, capped at `max`,
/// then "equal jitter" — half fixed, half scaled by `unit` in `[0, 1)` — so that many items
/// failing together do not retry in lockstep. Never more than `max`.
pub fn backoff(retry: u32, base: Duration, max: Duration, unit: f64) -> Duration {
    let exponential = base.saturating_mul(2u32.saturating_pow(retry.saturating_sub(1))).min(max);
    exponential / 2 + (exponential / 2).mul_f64(unit.clamp(0.0, 1.0))
}

/// A number in `[0, 1)` for jitter. Only the timing of retries depends on it, never a verdict.
pub fn jitter_unit() -> f64 {
    use std::hash::{BuildHasher, Hasher};
    use std::sync::atomic::{AtomicU64, Ordering};
    static CALLS: AtomicU64 = AtomicU64::new(0);
    // std's RandomState is seeded from the OS once per thread and stepped per instance: enough for
    // jitter, and no dependency for it.
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u64(CALLS.fetch_add(1, Ordering::Relaxed));
    (hasher.finish() >> 11) as f64 / (1u64 << 53) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(ms: u64) -> Duration {
        Duration::from_millis(ms)
    }

    fn check(retry: u32, unit: f64, expected: Duration) {
        assert_eq!(backoff(retry, ms(100), ms(1000), unit), expected, "retry {retry}, unit {unit}");
    }

    #[test]
    fn backoff_doubles_is_capped_and_jittered_within_bounds() {
        check(1, 0.0, ms(50));
        check(1, 0.999_999, ms(100) - Duration::from_nanos(50));
        check(2, 0.0, ms(100));
        check(2, 0.5, ms(150));
        check(3, 0.0, ms(200));
        check(4, 0.0, ms(400));
        check(5, 0.0, ms(500));
        check(5, 1.0, ms(1000));
        check(30, 1.0, ms(1000));
        check(u32::MAX, 1.0, ms(1000));
        check(0, 0.0, ms(50));
        assert_eq!(backoff(3, Duration::ZERO, Duration::ZERO, 0.7), Duration::ZERO);
        for _ in 0..1000 {
            let unit = jitter_unit();
            assert!((0.0..1.0).contains(&unit), "{unit}");
        }
    }

    #[test]
    fn failure_classes_and_breaker_relevance() {
        assert_eq!(Failure::Tls("invalid peer certificate: UnknownIssuer".into()).class(), None);
        assert_eq!(Failure::Tls("invalid peer certificate: UnknownIssuer".into()).health(), None);
        let cases: &[(Failure, Option<RetryOn>)] = &[
            (Failure::Connect("refused".into()), Some(RetryOn::Connect)),
            (Failure::Timeout, Some(RetryOn::Timeout)),
            (Failure::Status { code: 500, snippet: String::new() }, Some(RetryOn::ServerError)),
            (Failure::Status { code: 503, snippet: String::new() }, Some(RetryOn::ServerError)),
            (Failure::Status { code: 429, snippet: String::new() }, Some(RetryOn::TooManyRequests)),
            (Failure::Status { code: 400, snippet: String::new() }, None),
            (Failure::Status { code: 404, snippet: String::new() }, None),
            (Failure::Status { code: 302, snippet: String::new() }, None),
            (Failure::TooLarge, None),
            (Failure::Invalid("response: x".into()), None),
        ];
        for (failure, class) in cases {
            assert_eq!(failure.class(), *class, "{failure:?}");
            assert_eq!(failure.health(), Some(class.is_none()), "{failure:?}");
        }
    }

    #[test]
    fn error_snippets_are_one_bounded_line() {
        assert_eq!(snippet(b"  boom\r\nsecond line\n"), "boom  second line");
        assert_eq!(snippet(&[b'x'; 500]), format!("{}…", "x".repeat(200)));
        assert_eq!(snippet(b"\xff\xfe ok"), "\u{fffd}\u{fffd} ok");
        assert_eq!(snippet(b""), "");
    }
}
