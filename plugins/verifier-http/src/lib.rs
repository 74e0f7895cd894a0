//! `http`: a remote verifier — POSTs each item as JSON to a service a team runs (in any language)
//! and turns its validated answer into a verdict.
//!
//! Per item: one request `{"id", "prompt", "completion", "reference", "explain"}`; the answer must
//! be `{"score", "passed", "components"?, "extracted"?, "error"?, "explanation"?}` (see
//! [`response`]). Failed attempts are retried with exponential backoff and jitter when their
//! class is in `retry_on`; a circuit breaker shared by all threads fails items fast while the
//! service is down. Whatever the service does, an item ends within the budget of
//! [`config::Settings::item_budget`] (at most [`config::MAX_ITEM_BUDGET_MS`]): a wrong or slow
//! service gives verdicts with `error` (a timeout verdict when time ran out), never a hang.
//!
//! Components: the service's own, unprefixed (names starting with `http_` are refused), then
//! `http_attempts`, the number of requests the item took.
//!
//! Secrets and destinations: the bearer token is a secret the host passes by name
//! (`bearer_token_secret`, [`rlvr_plugin_api::HostContext`]), never an environment variable.
//! Requests follow no redirect and use no proxy; the host's outbound policy meets the client in
//! one place, [`outbound`].
//!
//! Threads: `reqwest::blocking::Client` runs its own runtime thread; the plugin library links its
//! own copy of tokio, so calling `verify` from any host thread — a tokio `spawn_blocking` thread
//! included — cannot meet the host's runtime. (A host must not call it on an async worker thread,
//! as with any blocking call.) Connections are pooled and reused across items and threads.

pub mod attempt;
pub mod breaker;
pub mod config;
pub mod response;

use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use reqwest::Url;
use reqwest::blocking::{Client, ClientBuilder};
use rlvr_plugin_api::{
    HostContext, Metadata, OptionError, OptionsReport, PluginError, Verdict, VerifierPlugin, VerifyItem,
    export_verifier,
};
use serde_json::{Value, json};

use crate::attempt::{Failure, backoff, jitter_unit};
use crate::breaker::{Admission, Breaker};
use crate::config::Settings;
use crate::response::ServiceVerdict;

/// The component that counts requests per item.
pub const ATTEMPTS_COMPONENT: &str = "http_attempts";

/// The http verifier: one client, one breaker, one config.
#[derive(Debug)]
pub struct HttpVerifier {
    settings: Settings,
    client: Sender,
    /// Shared by every thread verifying with this config: the service's health is one fact, and
    /// a breaker per thread would let N threads each pile N failures onto a service that is down.
    breaker: Mutex<Breaker>,
}

/// Explanation lines, built only when the caller asked: the closures are never run otherwise.
struct Trail(Option<Vec<String>>);

impl Trail {
    fn note(&mut self, line: impl FnOnce() -> String) {
        if let Some(lines) = &mut self.0 {
            lines.push(line());
        }
    }

    fn into_verdict(self, mut verdict: Verdict) -> Verdict {
        for line in self.0.unwrap_or_default() {
            verdict = verdict.explain(line);
        }
        verdict
    }
}

/// Why a failed item stopped where it did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stop {
    /// Every attempt was used.
    Exhausted,
    /// The failure's class is not in `retry_on` (or never retryable).
    NotRetried,
    /// The breaker opened during the item's retries.
    BreakerOpened,
}

/// The client the verifier posts with, under the host's outbound policy.
///
/// Always: no redirects (a redirect would reach a destination nobody checked; a redirected POST
/// also turns into a GET on 301/302, and a verdict from wherever that lands would be wrong — a
/// 3xx is reported instead) and no proxy from the environment (the worker's environment is not
/// the job's to choose, and a proxy would see every request). Under the daemon, `url` must be on
/// the operator's allow-list (a refusal is an `OptionError` at key `url`) and every address its
/// host resolves to is checked again when it connects (`rlvr_outbound`). A run by hand
/// (`rlvrctl verify`, a worker without a daemon) is unrestricted.
pub fn outbound(builder: ClientBuilder, url: &Url, host: &HostContext) -> Result<Sender, OptionError> {
    let build_error = |error: &dyn std::fmt::Display| {
        OptionError::new("url", format!("cannot build an HTTP client: {error}"))
    };
    if host.outbound_unrestricted {
        let client = builder.redirect(reqwest::redirect::Policy::none()).no_proxy().build();
        return client.map(Sender::Unrestricted).map_err(|error| build_error(&error));
    }
    let policy = rlvr_outbound::Policy::new(&host.outbound_allow, host.outbound_allow_private)
        .map_err(|error| OptionError::new("url", format!("the host's outbound policy: {error}")))?;
    policy.check_url(url.as_str()).map_err(|refusal| OptionError::new("url", refusal.to_string()))?;
    let client =
        rlvr_outbound::blocking::Client::new(policy, builder).map_err(|error| build_error(&error))?;
    Ok(Sender::Checked(client))
}

/// What requests go out through: the outbound policy's client, or, run by hand, a plain one.
#[derive(Debug)]
pub enum Sender {
    Checked(rlvr_outbound::blocking::Client),
    Unrestricted(Client),
}

impl Sender {
    /// `POST url`; `None` when the policy refuses it (never for the url checked at creation).
    pub fn post(&self, url: &Url) -> Option<reqwest::blocking::RequestBuilder> {
        match self {
            Sender::Checked(client) => client.post(url.as_str()).ok(),
            Sender::Unrestricted(client) => Some(client.post(url.clone())),
        }
    }
}

impl HttpVerifier {
    /// A verifier with checked `settings`, its requests under `host`'s outbound policy.
    pub fn new(settings: Settings, host: &HostContext) -> Result<Self, PluginError> {
        // The plugin links rustls without a default provider; ring is the one it ships. Installing
        // twice (a second config) is refused by rustls and harmless.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let builder = Client::builder()
            .timeout(settings.timeout)
            .connect_timeout(settings.timeout)
            // Retries are ours alone, so `http_attempts` counts every request the service saw.
            .retry(reqwest::retry::never())
            .default_headers(settings.headers.clone())
            .user_agent(concat!("rlvr-verifier-http/", env!("CARGO_PKG_VERSION")));
        let client = outbound(builder, &settings.url, host)?;
        let breaker = Breaker::new(settings.breaker_failures, settings.breaker_cooldown, settings.timeout);
        Ok(HttpVerifier { settings, client, breaker: Mutex::new(breaker) })
    }

    fn breaker(&self) -> std::sync::MutexGuard<'_, Breaker> {
        // Nothing panics while holding the lock; recovering keeps one odd panic from failing every
        // later item.
        self.breaker.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Sends `body` with retries, backoff and the breaker. Each attempt is cut at `timeout_ms` and
    /// each backoff is at most `backoff_max_ms`, so the item ends within `item_budget()`. (No
    /// separate item deadline: one that could cut a last attempt short by a few microseconds of
    /// overhead would make the verdict depend on timing.)
    fn call(&self, body: &[u8], explain: bool) -> Verdict {
        let settings = &self.settings;
        let total = settings.retries + 1;
        let mut trail = Trail(explain.then(Vec::new));
        let mut last: Option<Failure> = None;
        for attempt in 1..=total {
            let admission = self.breaker().admit(Instant::now());
            match (admission, &last) {
                (Admission::Refused, None) => {
                    let verdict = Verdict::error(format!(
                        "circuit breaker open (breaker_failures = {} consecutive failed requests): failing fast \
                         without a request until a probe succeeds (breaker_cooldown_ms = {})",
                        settings.breaker_failures,
                        settings.breaker_cooldown.as_millis()
                    ))
                    .component(ATTEMPTS_COMPONENT, 0.0);
                    trail.note(|| "circuit breaker open: no request sent".to_owned());
                    return trail.into_verdict(verdict);
                }
                (Admission::Refused, Some(failure)) => {
                    return self.failed(failure, attempt - 1, Stop::BreakerOpened, trail);
                }
                (Admission::Probe, _) => trail.note(|| {
                    format!("attempt {attempt}: circuit breaker half-open, this request is its probe")
                }),
                (Admission::Allowed, _) => {}
            }
            let outcome = attempt::send(&self.client, settings, body, settings.timeout);
            let health = outcome.as_ref().map_or_else(Failure::health, |_| Some(true));
            if let Some(healthy) = health {
                self.breaker().record(healthy, Instant::now());
            }
            let failure = match outcome {
                Ok(answer) => return self.answered(answer, attempt, trail),
                Err(failure) => failure,
            };
            trail.note(|| format!("attempt {attempt} of {total}: {}", failure.describe(settings)));
            if !failure.class().is_some_and(|class| settings.retries_on(class)) {
                return self.failed(&failure, attempt, Stop::NotRetried, trail);
            }
            if attempt == total {
                return self.failed(&failure, attempt, Stop::Exhausted, trail);
            }
            std::thread::sleep(backoff(attempt, settings.backoff, settings.backoff_max, jitter_unit()));
            last = Some(failure);
        }
        // The loop returns on its last attempt; this is only reached with retries + 1 = 0 attempts.
        Verdict::error("no attempt was made (retries + 1 = 0)")
    }

    /// The verdict for an item whose last attempt failed. The message is deterministic: it names
    /// the failure, the attempt count and the limit, never a measured time.
    fn failed(&self, failure: &Failure, attempts: u32, stop: Stop, trail: Trail) -> Verdict {
        let total = self.settings.retries + 1;
        let why = match stop {
            Stop::Exhausted => "",
            Stop::NotRetried => ", not retried",
            Stop::BreakerOpened => ", retries stopped: circuit breaker open",
        };
        let message = format!("{} (attempt {attempts} of {total}{why})", failure.describe(&self.settings));
        let verdict = match failure {
            Failure::Timeout => Verdict::timeout(message),
            _ => Verdict::error(message),
        };
        trail.into_verdict(verdict.component(ATTEMPTS_COMPONENT, f64::from(attempts)))
    }

    /// The verdict from a valid answer. A service `error` wins over its score: the item counts as
    /// not judged (score 0, not passed), as the verdict contract says.
    fn answered(&self, answer: ServiceVerdict, attempts: u32, mut trail: Trail) -> Verdict {
        let ServiceVerdict { score, passed, components, extracted, error, explanation } = answer;
        trail.note(|| format!("attempt {attempts}: valid verdict from the service"));
        let mut verdict = match &error {
            Some(message) => Verdict::error(format!("service: {message}")),
            None => Verdict::new(score, passed),
        };
        if let Some(message) = &error {
            trail
                .note(|| format!("the service reported an error ({message}); its score {score} is not used"));
        }
        for (name, value) in &components {
            verdict = verdict.component(name, *value);
        }
        verdict = verdict.component(ATTEMPTS_COMPONENT, f64::from(attempts));
        if let Some(extracted) = extracted {
            verdict = verdict.extracted(extracted);
        }
        for line in explanation {
            trail.note(|| format!("service: {line}"));
        }
        trail.into_verdict(verdict)
    }
}

impl VerifierPlugin for HttpVerifier {
    fn metadata() -> Metadata {
        Metadata {
            name: "http",
            version: env!("CARGO_PKG_VERSION"),
            description: "remote verifier: POSTs each item to a team's service and validates its verdict",
        }
    }

    fn reference_schema() -> &'static str {
        // Any object: the service reads it.
        "{\"type\": \"object\", \"description\": \"passed to the service unchanged\"}"
    }

    fn notes() -> Vec<String> {
        // The same store rustls-platform-verifier reads on Linux: an empty one means every https
        // service fails its handshake, which an operator should learn at load, not per item.
        let roots = rustls_native_certs::load_native_certs();
        let source = match (std::env::var_os("SSL_CERT_FILE"), std::env::var_os("SSL_CERT_DIR")) {
            (None, None) => "the system store".to_owned(),
            (file, dir) => format!(
                "SSL_CERT_FILE={} SSL_CERT_DIR={}",
                file.map_or_else(|| "(unset)".into(), |f| f.to_string_lossy().into_owned()),
                dir.map_or_else(|| "(unset)".into(), |d| d.to_string_lossy().into_owned())
            ),
        };
        let mut notes = vec![format!(
            "https: rustls (ring), {} trusted root certificate(s) from {source}",
            roots.certs.len()
        )];
        if roots.certs.is_empty() {
            notes.push(
                "https: no root certificates found, every https service will fail its handshake; install \
                 ca-certificates or set SSL_CERT_FILE"
                    .to_owned(),
            );
        }
        notes.extend(
            roots.errors.iter().take(3).map(|error| format!("https: reading root certificates: {error}")),
        );
        notes
    }

    /// Without a host context: no secrets, so a `bearer_token_secret` is refused.
    fn from_config(config_json: &str) -> Result<Self, PluginError> {
        Self::from_config_in(config_json, &HostContext::default())
    }

    fn from_config_in(config_json: &str, host: &HostContext) -> Result<Self, PluginError> {
        let settings = config::parse(config_json)?.settings(host)?;
        HttpVerifier::new(settings, host)
    }

    fn check_options(config_json: &str) -> Result<OptionsReport, OptionError> {
        Ok(config::parse(config_json)?.report())
    }

    fn verify(&self, item: &VerifyItem<'_>) -> Result<Verdict, PluginError> {
        let reference: Value = serde_json::from_str(item.reference_json.as_str())
            .map_err(|error| PluginError::invalid_input(format!("reference: expected JSON, {error}")))?;
        let body = json!({
            "id": item.id.as_str(),
            "prompt": item.prompt.as_str(),
            "completion": item.completion.as_str(),
            "reference": reference,
            "explain": item.explain,
        });
        let body = serde_json::to_vec(&body)
            .map_err(|error| PluginError::internal(format!("cannot encode the request: {error}")))?;
        Ok(self.call(&body, item.explain))
    }

    fn self_test() -> Result<(), PluginError> {
        let fail = |what: String| Err(PluginError::self_test_failed(what));
        let good = response::parse_response(br#"{"score": 1, "passed": true, "components": {"exact": 1}}"#);
        if good.as_ref().map(|verdict| (verdict.score, verdict.passed)) != Ok((1.0, true)) {
            return fail(format!("a valid response was not accepted: {good:?}"));
        }
        let bad = response::parse_response(br#"{"score": "high", "passed": true}"#);
        if bad != Err("response field score: expected a finite number, got \"high\"".to_owned()) {
            return fail(format!("a malformed response was not refused as expected: {bad:?}"));
        }
        let start = Instant::now();
        let mut breaker = Breaker::new(1, Duration::from_secs(1), Duration::from_secs(1));
        breaker.record(false, start);
        if breaker.admit(start) != Admission::Refused {
            return fail("the breaker did not open after its threshold".to_owned());
        }
        if config::parse("{}").is_ok() {
            return fail("a config without url was accepted".to_owned());
        }
        Ok(())
    }
}

export_verifier!(HttpVerifier);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn self_test_passes() {
        HttpVerifier::self_test().unwrap();
    }

    #[test]
    fn notes_count_the_root_certificates() {
        let notes = HttpVerifier::notes();
        assert!(notes[0].starts_with("https: rustls (ring), "), "{notes:?}");
        assert!(notes[0].contains("trusted root certificate(s) from"), "{notes:?}");
    }

    #[test]
    fn config_errors_name_the_key() {
        let error = HttpVerifier::from_config(r#"{"url": "http://127.0.0.1:1/", "retrys": 1}"#).unwrap_err();
        assert!(error.message.starts_with("retrys: unknown key; expected one of url, timeout_ms"), "{error}");
        assert!(!error.message.contains("line 1"), "{error}");
        let error = HttpVerifier::from_config("{}").unwrap_err();
        assert_eq!(error.message.as_str(), "url: missing (expected the service's http:// or https:// URL)");
    }

    /// `check_options` of the export layer: options → their report, or the refused key.
    fn check(json: &str, expected: Result<OptionsReport, (&str, &str)>) {
        match (HttpVerifier::check_options(json), expected) {
            (Ok(report), Ok(expected)) => assert_eq!(report, expected, "{json}"),
            (Err(error), Err((key, start))) => {
                assert_eq!(error.key, key, "{json}: {error}");
                assert!(error.message.starts_with(start), "{json}: {error}");
            }
            (got, expected) => panic!("{json}: got {got:?}, expected {expected:?}"),
        }
    }

    #[test]
    fn check_options_reports_the_url_and_the_secret_name_and_refuses_env_names() {
        let report = OptionsReport::default();
        check(r#"{"url": "https://g.example/v1"}"#, Ok(report.clone().url("url", "https://g.example/v1")));
        check(
            r#"{"url": "http://h/", "bearer_token_secret": "grader-token"}"#,
            Ok(report.url("url", "http://h/").secret("bearer_token_secret", "grader-token")),
        );
        check(
            r#"{"url": "http://h/", "bearer_token_env": "HOME"}"#,
            Err(("bearer_token_env", "environment variable names are not accepted")),
        );
        check(r#"{"url": "http://h/", "retries": 99}"#, Err(("retries", "expected 0 to 10, got 99")));
        check(r#"{"urll": "http://h/"}"#, Err(("urll", "unknown key; expected one of url, ")));
        check("{}", Err(("url", "missing")));
    }

    #[test]
    fn the_token_comes_from_the_host_context_only() {
        let config = r#"{"url": "http://127.0.0.1:1/", "bearer_token_secret": "grader-token"}"#;
        let error = HttpVerifier::from_config(config).unwrap_err();
        assert_eq!(
            error.message.as_str(),
            "bearer_token_secret: no secret named \"grader-token\" is available to this job"
        );
        let mut host = loopback();
        host.secrets.insert("grader-token".into(), rlvr_plugin_api::Secret::new("s3cret"));
        let verifier = HttpVerifier::from_config_in(config, &host).unwrap();
        assert!(!format!("{verifier:?}").contains("s3cret"));
    }

    /// A host context whose operator allows loopback only (the test servers').
    fn loopback() -> HostContext {
        HostContext { outbound_allow: vec!["127.0.0.1/32".into()], ..HostContext::default() }
    }

    #[test]
    fn the_url_must_be_on_the_operators_allow_list() {
        let config = r#"{"url": "http://127.0.0.1:1/"}"#;
        // regression: the http verifier sent requests to any url a spec named
        let refused = HttpVerifier::from_config_in(config, &HostContext::default()).unwrap_err();
        assert!(refused.message.starts_with("url: "), "{refused}");
        let elsewhere = r#"{"url": "http://169.254.169.254/latest/meta-data/"}"#;
        assert!(HttpVerifier::from_config_in(elsewhere, &loopback()).is_err());
        HttpVerifier::from_config_in(config, &loopback()).unwrap();
        HttpVerifier::from_config_in(elsewhere, &HostContext::unrestricted()).unwrap();
    }

    /// A one-connection-per-answer HTTP server on a real socket that plays `answers` in order.
    fn serve(answers: Vec<&'static str>) -> String {
        use std::io::{BufRead, BufReader, Read, Write};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}/", listener.local_addr().unwrap());
        std::thread::spawn(move || {
            for answer in answers {
                let (stream, _) = listener.accept().unwrap();
                let mut reader = BufReader::new(stream);
                let mut length = 0;
                loop {
                    let mut line = String::new();
                    reader.read_line(&mut line).unwrap();
                    if let Some(value) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                        length = value.trim().parse().unwrap();
                    }
                    if line == "\r\n" {
                        break;
                    }
                }
                reader.read_exact(&mut vec![0; length]).unwrap();
                let (status, body) = answer.split_once(' ').unwrap();
                let response = format!(
                    "HTTP/1.1 {status} X\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
                reader.get_mut().write_all(response.as_bytes()).unwrap();
            }
        });
        url
    }

    // The daemon calls verifiers from tokio's blocking pool. There the plugin's client (whose
    // tokio, in this unit test, is the same copy as the caller's) must neither panic nor hang.
    #[test]
    fn verifies_from_a_tokio_spawn_blocking_thread() {
        let url = serve(vec!["500 busy", r#"200 {"score": 1, "passed": true}"#]);
        let config = json!({"url": url, "backoff_ms": 1, "backoff_max_ms": 1}).to_string();
        let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).build().unwrap();
        let verdict = runtime
            .block_on(async move {
                tokio::task::spawn_blocking(move || {
                    let verifier = HttpVerifier::from_config_in(&config, &loopback()).unwrap();
                    verifier.verify(&VerifyItem::new("a", "p", "c", "{}")).unwrap()
                })
                .await
            })
            .unwrap();
        assert_eq!(verdict.error.into_option(), None);
        assert!(verdict.passed);
        assert_eq!(
            verdict.components.iter().map(|c| (c.name.as_str(), c.value)).collect::<Vec<_>>(),
            [("http_attempts", 2.0)]
        );
    }

    #[test]
    fn a_malformed_reference_is_an_input_error() {
        let verifier =
            HttpVerifier::from_config_in(r#"{"url": "http://127.0.0.1:1/"}"#, &loopback()).unwrap();
        let error = verifier.verify(&VerifyItem::new("a", "p", "c", "{not json")).unwrap_err();
        assert_eq!(error.kind, rlvr_plugin_api::PluginErrorKind::InvalidInput);
        assert!(error.message.starts_with("reference: expected JSON"), "{error}");
    }
}
