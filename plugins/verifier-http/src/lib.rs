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

pub mod config;
pub mod response;

use std::time::{Duration, Instant};

use reqwest::blocking::Client;
use rlvr_plugin_api::{
    HostContext, Metadata, OptionError, OptionsReport, PluginError, Verdict, VerifierPlugin, VerifyItem,
    export_verifier,
};
pub use rlvr_verifier_http_common::outbound::{Sender, outbound};
use rlvr_verifier_http_common::{Admission, Answered, Breaker, Caller, Trail, attempt, tls};
use serde_json::{Value, json};

use crate::config::Settings;
use crate::response::ServiceVerdict;

/// The component that counts requests per item.
pub const ATTEMPTS_COMPONENT: &str = "http_attempts";

/// The http verifier: one client, one caller (limits and breaker), one config.
#[derive(Debug)]
pub struct HttpVerifier {
    settings: Settings,
    client: Sender,
    caller: Caller,
}

impl HttpVerifier {
    /// A verifier with checked `settings`, its requests under `host`'s outbound policy.
    pub fn new(settings: Settings, host: &HostContext) -> Result<Self, PluginError> {
        tls::install_provider();
        let builder = Client::builder()
            .timeout(settings.limits.timeout)
            .connect_timeout(settings.limits.timeout)
            // Retries are ours alone, so `http_attempts` counts every request the service saw.
            .retry(reqwest::retry::never())
            .default_headers(settings.headers.clone())
            .user_agent(concat!("rlvr-verifier-http/", env!("CARGO_PKG_VERSION")));
        let client = outbound(builder, "url", &settings.url, host)?;
        let caller = Caller::new(settings.limits.clone(), "the service", ATTEMPTS_COMPONENT);
        Ok(HttpVerifier { settings, client, caller })
    }

    /// Sends `body` with retries, backoff and the breaker; the item ends within `item_budget()`.
    fn call(&self, body: &[u8], explain: bool) -> Verdict {
        let sent = self.caller.call(explain, || {
            attempt::send(
                &self.client,
                &self.settings.url,
                &self.settings.limits,
                body,
                response::parse_response,
            )
        });
        match sent {
            Ok(Answered { answer, attempts, trail }) => self.answered(answer, attempts, trail),
            Err(verdict) => verdict,
        }
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
        tls::notes()
    }

    /// Without a host context: no secrets, so a `bearer_token_secret` is refused.
    fn from_config(config_json: &str) -> Result<Self, PluginError> {
        Self::from_config_in(config_json, &HostContext::default())
    }

    fn from_config_in(config_json: &str, host: &HostContext) -> Result<Self, PluginError> {
        let mut settings = config::parse(config_json)?.settings(host)?;
        rlvr_verifier_http_common::hold_to_caps(&mut settings.limits, host, config_json)?;
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
