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
pub use rlvr_verifier_http_common::resilience::{
    MAX_ITEM_BUDGET_MS, MAX_RESPONSE_BYTES_LIMIT, MAX_RETRIES, Resilience, RetryOn,
};
use rlvr_verifier_http_common::{ResilienceKeys, options};
use serde::Deserialize;

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
    /// Timeouts, retries, breaker, response size.
    pub limits: Resilience,
    /// Headers sent with every request, the bearer token (marked sensitive) included.
    pub headers: HeaderMap,
}

impl Settings {
    /// The worst-case time of one item: every attempt times out and every backoff is the largest.
    pub fn item_budget(&self) -> Duration {
        self.limits.item_budget()
    }

    /// Whether failures of `class` are retried.
    pub fn retries_on(&self, class: RetryOn) -> bool {
        self.limits.retries_on(class)
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
    options::refuse_env_key(json, BEARER_TOKEN_ENV, "bearer_token_secret")?;
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
            let value = options::bearer_header("bearer_token_secret", name, host)?;
            settings.headers.insert(AUTHORIZATION, value);
        }
        Ok(settings)
    }
}

fn check(config: HttpConfig) -> Result<Options, OptionError> {
    let refuse = |key: &str, message: String| OptionError::new(key, message);
    let url = options::check_url("url", config.url.as_deref(), "the service's")?;
    let limits = ResilienceKeys {
        timeout_ms: config.timeout_ms,
        retries: config.retries,
        backoff_ms: config.backoff_ms,
        backoff_max_ms: config.backoff_max_ms,
        retry_on: config.retry_on,
        breaker_failures: config.breaker_failures,
        breaker_cooldown_ms: config.breaker_cooldown_ms,
        max_response_bytes: config.max_response_bytes,
    }
    .check()?;
    options::check_secret_name("bearer_token_secret", config.bearer_token_secret.as_deref())?;
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
        settings: Settings { url, limits, headers },
    })
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
