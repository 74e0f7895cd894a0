//! The plugin's keys (`url`, `timeout_ms`, ...), their defaults, and the checks that keep every
//! item's total time under [`MAX_ITEM_BUDGET_MS`].

use std::collections::BTreeMap;
use std::time::Duration;

use reqwest::Url;
use reqwest::header::{
    AUTHORIZATION, CONTENT_LENGTH, CONTENT_TYPE, HOST, HeaderMap, HeaderName, HeaderValue,
};
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
    /// The service answered 500–599.
    #[serde(rename = "5xx")]
    ServerError,
    /// The service answered 429 Too Many Requests.
    #[serde(rename = "429")]
    TooManyRequests,
}

/// The plugin's keys in a job's `[[verifiers]]` entry (or `rlvrctl verify --plugin-config`).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HttpConfig {
    /// The service's endpoint, `http://` or `https://`; required.
    pub url: Option<String>,
    /// The limit of one attempt, from connecting until the last byte of the response.
    pub timeout_ms: u64,
    /// Further attempts after a retryable failure.
    pub retries: u32,
    /// The first backoff before a retry; doubled on each further retry.
    pub backoff_ms: u64,
    /// The largest backoff.
    pub backoff_max_ms: u64,
    /// Which failures are retried. A 4xx other than 429 and a malformed response never are.
    pub retry_on: Vec<RetryOn>,
    /// Consecutive failed attempts (connection errors, timeouts, 5xx, 429) that open the circuit
    /// breaker; 0 turns it off.
    pub breaker_failures: u32,
    /// How long an open breaker fails items fast before it lets one probe request through.
    pub breaker_cooldown_ms: u64,
    /// Extra request headers, e.g. `{"X-Team": "math"}`.
    pub headers: BTreeMap<String, String>,
    /// The name of an environment variable holding a bearer token, sent as
    /// `Authorization: Bearer <token>`; read once when the verifier is created, never logged.
    pub bearer_token_env: Option<String>,
    /// The largest response body accepted.
    pub max_response_bytes: u64,
}

impl Default for HttpConfig {
    fn default() -> Self {
        HttpConfig {
            url: None,
            timeout_ms: 5_000,
            retries: 2,
            backoff_ms: 100,
            backoff_max_ms: 1_000,
            retry_on: vec![RetryOn::Connect, RetryOn::ServerError, RetryOn::TooManyRequests],
            breaker_failures: 5,
            breaker_cooldown_ms: 5_000,
            headers: BTreeMap::new(),
            bearer_token_env: None,
            max_response_bytes: 1024 * 1024,
        }
    }
}

/// A checked config, in the types the client uses.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The endpoint.
    pub url: Url,
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
    /// Headers sent with every request, the bearer token (marked sensitive) included.
    pub headers: HeaderMap,
    /// Largest response body.
    pub max_response_bytes: u64,
}

impl Settings {
    /// The worst-case time of one item: every attempt times out and every backoff is the largest.
    pub fn item_budget(&self) -> Duration {
        self.timeout * (self.retries + 1) + self.backoff_max * self.retries
    }

    /// Whether failures of `class` are retried.
    pub fn retries_on(&self, class: RetryOn) -> bool {
        self.retry_on.contains(&class)
    }
}

/// Parses and checks the JSON config. `env` reads an environment variable (a parameter so tests
/// need not touch the process environment). Every error names the key and what was expected.
pub fn parse(json: &str, env: impl Fn(&str) -> Option<String>) -> Result<Settings, String> {
    let value: serde_json::Value =
        serde_json::from_str(json).map_err(|error| format!("expected a JSON object, {error}"))?;
    if !value.is_object() {
        return Err(format!("expected a JSON object of the plugin's keys, got {value}"));
    }
    let config: HttpConfig = serde_path_to_error::deserialize(value).map_err(|error| {
        let message = error.inner().to_string();
        let path = error.path().to_string();
        // For an unknown key the path ends with that key, which the message already names.
        if path == "." || message.starts_with("unknown field") {
            message
        } else {
            format!("{path}: {message}")
        }
    })?;
    check(config, env)
}

fn check(config: HttpConfig, env: impl Fn(&str) -> Option<String>) -> Result<Settings, String> {
    let url = check_url(config.url.as_deref())?;
    if !(1..=60_000).contains(&config.timeout_ms) {
        return Err(format!("timeout_ms: expected 1 to 60000, got {}", config.timeout_ms));
    }
    if config.retries > MAX_RETRIES {
        return Err(format!("retries: expected 0 to {MAX_RETRIES}, got {}", config.retries));
    }
    if config.backoff_ms > config.backoff_max_ms {
        return Err(format!(
            "backoff_ms: expected at most backoff_max_ms ({}), got {}",
            config.backoff_max_ms, config.backoff_ms
        ));
    }
    let worst = u64::from(config.retries + 1) * config.timeout_ms
        + u64::from(config.retries).saturating_mul(config.backoff_max_ms);
    if worst > MAX_ITEM_BUDGET_MS {
        return Err(format!(
            "timeout_ms, retries, backoff_max_ms: the worst case per item, (retries + 1) × timeout_ms + \
             retries × backoff_max_ms = {worst} ms, exceeds the {MAX_ITEM_BUDGET_MS} ms cap"
        ));
    }
    if config.breaker_failures > 0 && !(1..=600_000).contains(&config.breaker_cooldown_ms) {
        return Err(format!("breaker_cooldown_ms: expected 1 to 600000, got {}", config.breaker_cooldown_ms));
    }
    if !(1..=MAX_RESPONSE_BYTES_LIMIT).contains(&config.max_response_bytes) {
        return Err(format!(
            "max_response_bytes: expected 1 to {MAX_RESPONSE_BYTES_LIMIT}, got {}",
            config.max_response_bytes
        ));
    }
    let mut headers = HeaderMap::new();
    for (name, value) in &config.headers {
        let header = HeaderName::from_bytes(name.as_bytes())
            .map_err(|_| format!("headers: {name:?} is not a valid header name"))?;
        if [CONTENT_TYPE, CONTENT_LENGTH, HOST].contains(&header) {
            return Err(format!("headers.{name}: set by the plugin itself, expected another header"));
        }
        if header == AUTHORIZATION && config.bearer_token_env.is_some() {
            return Err(format!("headers.{name}: expected either this header or bearer_token_env, not both"));
        }
        // The value is never echoed: headers often carry credentials.
        let mut value = HeaderValue::from_str(value)
            .map_err(|_| format!("headers.{name}: expected a value of visible ASCII characters"))?;
        value.set_sensitive(true);
        headers.insert(header, value);
    }
    if let Some(variable) = &config.bearer_token_env {
        let token = env(variable).filter(|token| !token.trim().is_empty()).ok_or_else(|| {
            format!("bearer_token_env: environment variable {variable} is not set or empty")
        })?;
        let mut value = HeaderValue::from_str(&format!("Bearer {}", token.trim())).map_err(|_| {
            format!("bearer_token_env: the token in {variable} is not valid in a header (visible ASCII only)")
        })?;
        value.set_sensitive(true);
        headers.insert(AUTHORIZATION, value);
    }
    Ok(Settings {
        url,
        timeout: Duration::from_millis(config.timeout_ms),
        retries: config.retries,
        backoff: Duration::from_millis(config.backoff_ms),
        backoff_max: Duration::from_millis(config.backoff_max_ms),
        retry_on: config.retry_on,
        breaker_failures: config.breaker_failures,
        breaker_cooldown: Duration::from_millis(config.breaker_cooldown_ms),
        headers,
        max_response_bytes: config.max_response_bytes,
    })
}

fn check_url(url: Option<&str>) -> Result<Url, String> {
    let Some(text) = url else {
        return Err("url: missing (expected the service's http:// or https:// URL)".to_owned());
    };
    let url = Url::parse(text)
        .map_err(|error| format!("url: expected an http:// or https:// URL, got {text:?} ({error})"))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(format!("url: expected an http:// or https:// URL, got scheme {:?}", url.scheme()));
    }
    if url.host_str().is_none_or(str::is_empty) {
        return Err(format!("url: expected a host in {text:?}"));
    }
    // Credentials in a URL end up in logs and process listings; the message does not repeat them.
    if !url.username().is_empty() || url.password().is_some() {
        return Err("url: expected no user:password in the URL, use headers or bearer_token_env".to_owned());
    }
    Ok(url)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(name: &str) -> Option<String> {
        match name {
            "TOKEN" => Some("s3cret".to_owned()),
            "EMPTY" => Some(" ".to_owned()),
            _ => None,
        }
    }

    /// `expected`: `Ok(())` or the start of the error message.
    fn check(json: &str, expected: Result<(), &str>) {
        match (parse(json, env), expected) {
            (Ok(_), Ok(())) => {}
            (Err(got), Err(want)) => assert!(got.starts_with(want), "{json}: got {got:?}, want {want:?}…"),
            (got, want) => panic!("{json}: got {got:?}, want {want:?}"),
        }
    }

    #[test]
    fn accepted_and_refused_configs() {
        let cases: &[(&str, Result<(), &str>)] = &[
            (r#"{"url": "http://127.0.0.1:8000/verify"}"#, Ok(())),
            (r#"{"url": "https://verifier.example/v1"}"#, Ok(())),
            (
                r#"{"url": "http://h/", "timeout_ms": 200, "retries": 0, "retry_on": ["timeout", "5xx"],
                    "headers": {"X-Team": "math"}, "bearer_token_env": "TOKEN"}"#,
                Ok(()),
            ),
            (r#"{"url": "http://h/", "breaker_failures": 0, "breaker_cooldown_ms": 0}"#, Ok(())),
            ("{}", Err("url: missing (expected the service's http:// or https:// URL)")),
            (r#"{"url": "ftp://h/"}"#, Err("url: expected an http:// or https:// URL, got scheme \"ftp\"")),
            (r#"{"url": "not a url"}"#, Err("url: expected an http:// or https:// URL, got \"not a url\"")),
            (r#"{"url": "http://u:p@h/"}"#, Err("url: expected no user:password")),
            (r#"{"url": 7}"#, Err("url: invalid type: integer `7`, expected a string")),
            (r#"{"url": "http://h/", "timeout": 5}"#, Err("unknown field `timeout`, expected one of")),
            (r#"{"url": "http://h/", "timeout_ms": 0}"#, Err("timeout_ms: expected 1 to 60000, got 0")),
            (r#"{"url": "http://h/", "timeout_ms": -1}"#, Err("timeout_ms: invalid value: integer `-1`")),
            (r#"{"url": "http://h/", "retries": 11}"#, Err("retries: expected 0 to 10, got 11")),
            (
                r#"{"url": "http://h/", "retry_on": ["connect", "4xx"]}"#,
                Err("retry_on[1]: unknown variant `4xx`, expected one of `connect`, `timeout`, `5xx`, `429`"),
            ),
            (
                r#"{"url": "http://h/", "backoff_ms": 500, "backoff_max_ms": 100}"#,
                Err("backoff_ms: expected at most backoff_max_ms (100), got 500"),
            ),
            (
                r#"{"url": "http://h/", "timeout_ms": 10000, "retries": 2}"#,
                Err(
                    "timeout_ms, retries, backoff_max_ms: the worst case per item, (retries + 1) × timeout_ms + \
                     retries × backoff_max_ms = 32000 ms, exceeds the 25000 ms cap",
                ),
            ),
            (
                r#"{"url": "http://h/", "breaker_cooldown_ms": 0}"#,
                Err("breaker_cooldown_ms: expected 1 to 600000"),
            ),
            (
                r#"{"url": "http://h/", "max_response_bytes": 0}"#,
                Err("max_response_bytes: expected 1 to 67108864"),
            ),
            (
                r#"{"url": "http://h/", "headers": {"bad name": "x"}}"#,
                Err("headers: \"bad name\" is not a valid"),
            ),
            (
                r#"{"url": "http://h/", "headers": {"Content-Type": "x"}}"#,
                Err("headers.Content-Type: set by"),
            ),
            (
                r#"{"url": "http://h/", "headers": {"X-A": "a\nb"}}"#,
                Err("headers.X-A: expected a value of visible"),
            ),
            (
                r#"{"url": "http://h/", "headers": {"Authorization": "x"}, "bearer_token_env": "TOKEN"}"#,
                Err("headers.Authorization: expected either this header or bearer_token_env, not both"),
            ),
            (
                r#"{"url": "http://h/", "bearer_token_env": "MISSING"}"#,
                Err("bearer_token_env: environment variable MISSING is not set or empty"),
            ),
            (
                r#"{"url": "http://h/", "bearer_token_env": "EMPTY"}"#,
                Err("bearer_token_env: environment variable"),
            ),
            ("[]", Err("expected a JSON object of the plugin's keys, got []")),
            ("{", Err("expected a JSON object, EOF while parsing an object at line 1 column 1")),
        ];
        for (json, expected) in cases {
            check(json, *expected);
        }
    }

    #[test]
    fn defaults_fit_the_cap_and_the_token_is_sensitive() {
        let settings = parse(r#"{"url": "http://h/", "bearer_token_env": "TOKEN"}"#, env).unwrap();
        assert_eq!(settings.item_budget(), Duration::from_millis(3 * 5_000 + 2 * 1_000));
        assert!(settings.item_budget() <= Duration::from_millis(MAX_ITEM_BUDGET_MS));
        let authorization = &settings.headers[AUTHORIZATION];
        assert!(authorization.is_sensitive());
        assert!(!format!("{settings:?}").contains("s3cret"), "the token leaks through Debug");
        assert!(settings.retries_on(RetryOn::ServerError) && !settings.retries_on(RetryOn::Timeout));
    }
}
