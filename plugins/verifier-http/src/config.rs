//! The plugin's keys (`url`, `timeout_ms`, ...), their defaults, and the checks that keep every
//! item's total time under [`MAX_ITEM_BUDGET_MS`].
//!
//! Two steps, so the daemon can check a job's options at submit without its secrets: [`parse`]
//! checks every key and says what the options refer to ([`Options::report`]: the URL and the
//! secret's name); [`Options::settings`] then takes the bearer token from the host's context.
//! A token never comes from the environment: `bearer_token_env` is refused without looking at
//! the environment, so the message is the same whether the variable exists or not.

use std::collections::BTreeMap;
use std::time::Duration;

use reqwest::Url;
use reqwest::header::{
    AUTHORIZATION, CONTENT_LENGTH, CONTENT_TYPE, HOST, HeaderMap, HeaderName, HeaderValue,
};
/// What [`Options::settings`] takes the bearer token from.
pub use rlvr_plugin_api::{HostContext, Secret};
use rlvr_plugin_api::{OptionError, OptionsReport, parse_options};
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
    /// The name of a secret (declared by the daemon's operator for the job's team) holding a
    /// bearer token, sent as `Authorization: Bearer <token>`; never logged.
    pub bearer_token_secret: Option<String>,
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
            bearer_token_secret: None,
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

/// Options that passed every check but the secret's: what [`parse`] gives.
#[derive(Debug, Clone)]
pub struct Options {
    /// The settings, without the bearer token.
    settings: Settings,
    /// `url` as written, for the report.
    url: String,
    /// `bearer_token_secret`: the secret's name.
    bearer_token_secret: Option<String>,
}

/// The key that once named an environment variable; refused before anything else is read.
pub const BEARER_TOKEN_ENV: &str = "bearer_token_env";

/// Parses and checks the JSON config. Every error names the key and what was expected; none
/// depends on the process environment.
pub fn parse(json: &str) -> Result<Options, OptionError> {
    let value = serde_json::from_str::<serde_json::Value>(json).ok();
    if value.is_some_and(|value| value.get(BEARER_TOKEN_ENV).is_some()) {
        return Err(OptionError::new(
            BEARER_TOKEN_ENV,
            "environment variable names are not accepted; ask the daemon's operator for the name of a \
             secret your team may use and set bearer_token_secret to it",
        ));
    }
    check(parse_options(json)?)
}

impl Options {
    /// What the options refer to outside the plugin: the service's URL and the token's secret.
    pub fn report(&self) -> OptionsReport {
        let report = OptionsReport::default().url("url", &self.url);
        match &self.bearer_token_secret {
            Some(name) => report.secret("bearer_token_secret", name),
            None => report,
        }
    }

    /// The settings, with the bearer token from `host`. A missing secret reads the same whether
    /// it does not exist or the job's team may not use it, and no message shows a value.
    pub fn settings(self, host: &HostContext) -> Result<Settings, OptionError> {
        let mut settings = self.settings;
        if let Some(name) = &self.bearer_token_secret {
            let refuse = |message: String| OptionError::new("bearer_token_secret", message);
            let secret = host
                .secret(name)
                .ok_or_else(|| refuse(format!("no secret named {name:?} is available to this job")))?;
            let token = secret.expose().trim();
            if token.is_empty() {
                return Err(refuse(format!("the secret {name:?} is empty")));
            }
            let mut value = HeaderValue::from_str(&format!("Bearer {token}")).map_err(|_| {
                refuse(format!("the secret {name:?} is not valid in a header (visible ASCII only)"))
            })?;
            value.set_sensitive(true);
            settings.headers.insert(AUTHORIZATION, value);
        }
        Ok(settings)
    }
}

fn check(config: HttpConfig) -> Result<Options, OptionError> {
    let refuse = |key: &str, message: String| OptionError::new(key, message);
    let url = check_url(config.url.as_deref())?;
    if !(1..=60_000).contains(&config.timeout_ms) {
        return Err(refuse("timeout_ms", format!("expected 1 to 60000, got {}", config.timeout_ms)));
    }
    if config.retries > MAX_RETRIES {
        return Err(refuse("retries", format!("expected 0 to {MAX_RETRIES}, got {}", config.retries)));
    }
    if config.backoff_ms > config.backoff_max_ms {
        return Err(refuse(
            "backoff_ms",
            format!("expected at most backoff_max_ms ({}), got {}", config.backoff_max_ms, config.backoff_ms),
        ));
    }
    let worst = u64::from(config.retries + 1) * config.timeout_ms
        + u64::from(config.retries).saturating_mul(config.backoff_max_ms);
    if worst > MAX_ITEM_BUDGET_MS {
        return Err(refuse(
            "timeout_ms",
            format!(
                "the worst case per item, (retries + 1) × timeout_ms + retries × backoff_max_ms = {worst} ms, \
                 exceeds the {MAX_ITEM_BUDGET_MS} ms cap"
            ),
        ));
    }
    if config.breaker_failures > 0 && !(1..=600_000).contains(&config.breaker_cooldown_ms) {
        return Err(refuse(
            "breaker_cooldown_ms",
            format!("expected 1 to 600000, got {}", config.breaker_cooldown_ms),
        ));
    }
    if !(1..=MAX_RESPONSE_BYTES_LIMIT).contains(&config.max_response_bytes) {
        return Err(refuse(
            "max_response_bytes",
            format!("expected 1 to {MAX_RESPONSE_BYTES_LIMIT}, got {}", config.max_response_bytes),
        ));
    }
    if config.bearer_token_secret.as_deref().is_some_and(|name| name.trim().is_empty()) {
        return Err(refuse(
            "bearer_token_secret",
            "expected the name of a secret, got an empty string".into(),
        ));
    }
    let mut headers = HeaderMap::new();
    for (name, value) in &config.headers {
        let key = format!("headers.{name}");
        let header = HeaderName::from_bytes(name.as_bytes())
            .map_err(|_| refuse("headers", format!("{name:?} is not a valid header name")))?;
        if [CONTENT_TYPE, CONTENT_LENGTH, HOST].contains(&header) {
            return Err(refuse(&key, "set by the plugin itself, expected another header".into()));
        }
        if header == AUTHORIZATION && config.bearer_token_secret.is_some() {
            return Err(refuse(&key, "expected either this header or bearer_token_secret, not both".into()));
        }
        // The value is never echoed: headers often carry credentials.
        let mut value = HeaderValue::from_str(value)
            .map_err(|_| refuse(&key, "expected a value of visible ASCII characters".into()))?;
        value.set_sensitive(true);
        headers.insert(header, value);
    }
    Ok(Options {
        url: config.url.clone().unwrap_or_default(),
        bearer_token_secret: config.bearer_token_secret,
        settings: Settings {
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
        },
    })
}

fn check_url(url: Option<&str>) -> Result<Url, OptionError> {
    let refuse = |message: String| OptionError::new("url", message);
    let Some(text) = url else {
        return Err(refuse("missing (expected the service's http:// or https:// URL)".to_owned()));
    };
    let url = Url::parse(text)
        .map_err(|error| refuse(format!("expected an http:// or https:// URL, got {text:?} ({error})")))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(refuse(format!("expected an http:// or https:// URL, got scheme {:?}", url.scheme())));
    }
    if url.host_str().is_none_or(str::is_empty) {
        return Err(refuse(format!("expected a host in {text:?}")));
    }
    // Credentials in a URL end up in logs and process listings; the message does not repeat them.
    if !url.username().is_empty() || url.password().is_some() {
        return Err(refuse(
            "expected no user:password in the URL, use headers or bearer_token_secret".to_owned(),
        ));
    }
    Ok(url)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The host context of the tests: the secret `token` is `s3cret`, `blank` is blank.
    fn host() -> HostContext {
        let mut host = HostContext::default();
        host.secrets.insert("token".into(), Secret::new("s3cret"));
        host.secrets.insert("blank".into(), Secret::new(" "));
        host
    }

    /// `expected`: `Ok(())` or the start of the error, `"<key>: <message>"`.
    fn check(json: &str, expected: Result<(), &str>) {
        let parsed = parse(json).and_then(|options| options.settings(&host()));
        match (parsed, expected) {
            (Ok(_), Ok(())) => {}
            (Err(got), Err(want)) => {
                let got = got.to_string();
                assert!(got.starts_with(want), "{json}: got {got:?}, want {want:?}…")
            }
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
                    "headers": {"X-Team": "math"}, "bearer_token_secret": "token"}"#,
                Ok(()),
            ),
            (r#"{"url": "http://h/", "breaker_failures": 0, "breaker_cooldown_ms": 0}"#, Ok(())),
            ("{}", Err("url: missing (expected the service's http:// or https:// URL)")),
            (r#"{"url": "ftp://h/"}"#, Err("url: expected an http:// or https:// URL, got scheme \"ftp\"")),
            (r#"{"url": "not a url"}"#, Err("url: expected an http:// or https:// URL, got \"not a url\"")),
            (r#"{"url": "http://u:p@h/"}"#, Err("url: expected no user:password")),
            (r#"{"url": 7}"#, Err("url: expected a string, got integer `7`")),
            (
                r#"{"url": "http://h/", "timeout": 5}"#,
                Err("timeout: unknown key; expected one of url, timeout_ms"),
            ),
            (r#"{"url": "http://h/", "timeout_ms": 0}"#, Err("timeout_ms: expected 1 to 60000, got 0")),
            (r#"{"url": "http://h/", "timeout_ms": -1}"#, Err("timeout_ms: expected u64, got integer `-1`")),
            (r#"{"url": "http://h/", "retries": 11}"#, Err("retries: expected 0 to 10, got 11")),
            (
                r#"{"url": "http://h/", "retry_on": ["connect", "4xx"]}"#,
                Err("retry_on[1]: expected one of connect, timeout, 5xx, 429, got \"4xx\""),
            ),
            (
                r#"{"url": "http://h/", "backoff_ms": 500, "backoff_max_ms": 100}"#,
                Err("backoff_ms: expected at most backoff_max_ms (100), got 500"),
            ),
            (
                r#"{"url": "http://h/", "timeout_ms": 10000, "retries": 2}"#,
                Err(
                    "timeout_ms: the worst case per item, (retries + 1) × timeout_ms + retries × backoff_max_ms = \
                     32000 ms, exceeds the 25000 ms cap",
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
                r#"{"url": "http://h/", "headers": {"Authorization": "x"}, "bearer_token_secret": "token"}"#,
                Err("headers.Authorization: expected either this header or bearer_token_secret, not both"),
            ),
            (
                r#"{"url": "http://h/", "bearer_token_secret": "other-teams-token"}"#,
                Err("bearer_token_secret: no secret named \"other-teams-token\" is available to this job"),
            ),
            (
                r#"{"url": "http://h/", "bearer_token_secret": "blank"}"#,
                Err("bearer_token_secret: the secret \"blank\" is empty"),
            ),
            (
                r#"{"url": "http://h/", "bearer_token_secret": ""}"#,
                Err("bearer_token_secret: expected the name of a secret"),
            ),
            (
                r#"{"url": "http://h/", "bearer_token_env": "HOME"}"#,
                Err(
                    "bearer_token_env: environment variable names are not accepted; ask the daemon's operator",
                ),
            ),
            ("[]", Err("expected a JSON object of the plugin's options, got []")),
            ("{", Err("expected a JSON object of the plugin's options: EOF while parsing an object")),
        ];
        for (json, expected) in cases {
            check(json, *expected);
        }
    }

    // regression: "environment variable X is not set" told a tenant which variables the daemon has
    #[test]
    fn bearer_token_env_is_refused_alike_whether_the_variable_exists_or_not() {
        let set = std::env::vars().next().map(|(name, _)| name).unwrap_or_else(|| "PATH".to_owned());
        let unset = "RLVR_NO_SUCH_VARIABLE_4F2A";
        assert!(std::env::var_os(unset).is_none());
        let refusal = |name: &str| {
            parse(&format!(r#"{{"url": "http://h/", "bearer_token_env": "{name}"}}"#)).unwrap_err()
        };
        let (with_set, with_unset) = (refusal(&set), refusal(unset));
        assert_eq!(with_set, with_unset);
        assert!(!with_set.to_string().contains(&set) && !with_unset.to_string().contains(unset));
    }

    #[test]
    fn the_report_names_the_url_and_the_secret_and_the_token_comes_from_the_host_only() {
        let options = parse(r#"{"url": "https://g.example/v1", "bearer_token_secret": "token"}"#).unwrap();
        assert_eq!(
            options.report(),
            OptionsReport::default()
                .url("url", "https://g.example/v1")
                .secret("bearer_token_secret", "token")
        );
        assert_eq!(
            parse(r#"{"url": "http://h/"}"#).unwrap().report(),
            OptionsReport::default().url("url", "http://h/")
        );
        let settings = options.clone().settings(&host()).unwrap();
        assert_eq!(settings.item_budget(), Duration::from_millis(3 * 5_000 + 2 * 1_000));
        assert!(settings.item_budget() <= Duration::from_millis(MAX_ITEM_BUDGET_MS));
        let authorization = &settings.headers[AUTHORIZATION];
        assert_eq!(authorization.to_str().unwrap(), "Bearer s3cret");
        assert!(authorization.is_sensitive());
        assert!(!format!("{settings:?}").contains("s3cret"), "the token leaks through Debug");
        assert!(settings.retries_on(RetryOn::ServerError) && !settings.retries_on(RetryOn::Timeout));
        // Without the secret in the context: refused, the value nowhere in the message.
        let error = options.settings(&HostContext::default()).unwrap_err().to_string();
        assert_eq!(error, "bearer_token_secret: no secret named \"token\" is available to this job");
    }

    #[test]
    fn no_message_shows_a_secret_value() {
        let mut host = host();
        host.secrets.insert("bad".into(), Secret::new("s3cret\nvalue"));
        let error = parse(r#"{"url": "http://h/", "bearer_token_secret": "bad"}"#)
            .unwrap()
            .settings(&host)
            .unwrap_err()
            .to_string();
        assert_eq!(
            error,
            "bearer_token_secret: the secret \"bad\" is not valid in a header (visible ASCII only)"
        );
    }
}
