//! The plugin's keys, their defaults and checks.
//!
//! Two steps, so the daemon can check a job's options at submit without its secrets: [`parse`]
//! checks every key and says what the options refer to ([`Options::report`]: the endpoint and
//! the API key's secret name); [`Options::settings`] then takes the key from the host's context.

use reqwest::Url;
use reqwest::header::{AUTHORIZATION, HeaderMap};
use rlvr_grader_common::Template;
pub use rlvr_plugin_api::{HostContext, Secret};
use rlvr_plugin_api::{OptionError, OptionsReport, parse_options};
use rlvr_verifier_http_common::options;
use rlvr_verifier_http_common::resilience::{Resilience, ResilienceKeys, RetryOn};
use serde::Deserialize;

use crate::rubric::Rubric;

/// The path the plugin adds to `url`.
pub const CHAT_COMPLETIONS: &str = "/chat/completions";

/// The key that would name an environment variable; refused before anything else is read.
pub const API_KEY_ENV: &str = "api_key_env";

/// The most labels a label rubric may have.
pub const MAX_LABELS: usize = 64;

/// The plugin's keys in a job's `[[verifiers]]` entry (or `rlvrctl verify --plugin-config`).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct JudgeConfig {
    /// The API's base URL, as OpenAI's clients take it (`https://api.openai.com/v1`,
    /// `http://127.0.0.1:8000/v1`); the plugin posts to `<url>/chat/completions`.
    pub url: Option<String>,
    /// The judge model's name, sent as `model`.
    pub model: Option<String>,
    /// The name of a secret holding the API key, sent as `Authorization: Bearer <key>`.
    pub api_key_secret: Option<String>,
    /// The conversation, each content a template; or `prompt`.
    pub messages: Option<Vec<MessageConfig>>,
    /// One user message, a template; or `messages`.
    pub prompt: Option<Template>,
    /// What the judge answers.
    pub rubric: Option<RubricConfig>,
    /// Whether to tell the judge the exact answer form (see [`Rubric::instruction`]).
    pub answer_instruction: bool,
    /// Sampling temperature, 0 to 2.
    pub temperature: f64,
    /// The most tokens the judge may write.
    pub max_tokens: u32,
    /// `response_format` sent: `json_schema`, `json_object` or `none`.
    pub response_format: ResponseFormat,
    /// See [`ResilienceKeys`].
    pub timeout_ms: u64,
    /// See [`ResilienceKeys`].
    pub retries: u32,
    /// See [`ResilienceKeys`].
    pub backoff_ms: u64,
    /// See [`ResilienceKeys`].
    pub backoff_max_ms: u64,
    /// See [`ResilienceKeys`].
    pub retry_on: Vec<RetryOn>,
    /// See [`ResilienceKeys`].
    pub breaker_failures: u32,
    /// See [`ResilienceKeys`].
    pub breaker_cooldown_ms: u64,
    /// See [`ResilienceKeys`].
    pub max_response_bytes: u64,
}

impl Default for JudgeConfig {
    fn default() -> Self {
        JudgeConfig {
            url: None,
            model: None,
            api_key_secret: None,
            messages: None,
            prompt: None,
            rubric: None,
            answer_instruction: true,
            temperature: 0.0,
            max_tokens: 512,
            response_format: ResponseFormat::JsonSchema,
            // A judge model takes seconds: 10 s per attempt, one retry, within the 25 s cap.
            timeout_ms: 10_000,
            retries: 1,
            backoff_ms: 200,
            backoff_max_ms: 2_000,
            retry_on: vec![
                RetryOn::Connect,
                RetryOn::Timeout,
                RetryOn::ServerError,
                RetryOn::TooManyRequests,
            ],
            breaker_failures: 5,
            breaker_cooldown_ms: 10_000,
            max_response_bytes: 1024 * 1024,
        }
    }
}

/// One message of `messages`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MessageConfig {
    /// Who speaks.
    pub role: Role,
    /// What is said, a template.
    pub content: Template,
}

/// A chat role.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Instructions.
    System,
    /// OpenAI's newer name for instructions.
    Developer,
    /// The asker.
    User,
    /// An earlier answer (a few-shot example).
    Assistant,
}

impl Role {
    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::System => "system",
            Role::Developer => "developer",
            Role::User => "user",
            Role::Assistant => "assistant",
        }
    }
}

/// `rubric` as written.
#[derive(Debug, Clone, Deserialize)]
#[serde(tag = "kind", deny_unknown_fields)]
pub enum RubricConfig {
    /// `{"kind": "score", "min": 0, "max": 10, "pass_threshold": 7}`.
    #[serde(rename = "score")]
    Score {
        /// The lowest score.
        min: f64,
        /// The highest score.
        max: f64,
        /// The lowest passing score.
        pass_threshold: f64,
    },
    /// `{"kind": "label", "labels": [...], "passing_labels": [...]}`.
    #[serde(rename = "label")]
    Label {
        /// Every label.
        labels: Vec<String>,
        /// Those that pass.
        passing_labels: Vec<String>,
    },
}

/// What `response_format` the request carries. Many servers ignore it, so the parser never
/// relies on it; some refuse it, hence `none`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub enum ResponseFormat {
    /// The rubric's JSON schema, strict ([`Rubric::schema`]).
    #[serde(rename = "json_schema")]
    JsonSchema,
    /// Any JSON object.
    #[serde(rename = "json_object")]
    JsonObject,
    /// No `response_format` key.
    #[serde(rename = "none")]
    None,
}

/// A message, checked: its role, its template, and the key it came from (for render errors).
#[derive(Debug, Clone)]
pub struct Message {
    /// Who speaks.
    pub role: Role,
    /// What is said.
    pub content: Template,
    /// `messages[1].content` or `prompt`.
    pub key: String,
}

/// A checked config.
#[derive(Debug, Clone)]
pub struct Settings {
    /// `<url>/chat/completions`.
    pub endpoint: Url,
    /// The judge model.
    pub model: String,
    /// The conversation.
    pub messages: Vec<Message>,
    /// The rubric.
    pub rubric: Rubric,
    /// Whether the rubric's instruction is added.
    pub answer_instruction: bool,
    /// Sampling temperature.
    pub temperature: f64,
    /// Largest reply.
    pub max_tokens: u32,
    /// What `response_format` is sent.
    pub response_format: ResponseFormat,
    /// Timeouts, retries, breaker, response size.
    pub limits: Resilience,
    /// The API key (marked sensitive), when there is one.
    pub headers: HeaderMap,
}

/// Options that passed every check but the secret's: what [`parse`] gives.
#[derive(Debug, Clone)]
pub struct Options {
    settings: Settings,
    url: String,
    api_key_secret: Option<String>,
}

/// Parses and checks the JSON config; every error names the key as the spec writes it.
pub fn parse(json: &str) -> Result<Options, OptionError> {
    options::refuse_env_key(json, API_KEY_ENV, "api_key_secret")?;
    check(parse_options(json)?)
}

impl Options {
    /// What the options refer to outside the plugin: the endpoint and the API key's secret.
    pub fn report(&self) -> OptionsReport {
        let report = OptionsReport::default().url("url", &self.url);
        match &self.api_key_secret {
            Some(name) => report.secret("api_key_secret", name),
            None => report,
        }
    }

    /// The settings, with the API key from `host`.
    pub fn settings(self, host: &HostContext) -> Result<Settings, OptionError> {
        let mut settings = self.settings;
        if let Some(name) = &self.api_key_secret {
            settings.headers.insert(AUTHORIZATION, options::bearer_header("api_key_secret", name, host)?);
        }
        Ok(settings)
    }
}

fn check(config: JudgeConfig) -> Result<Options, OptionError> {
    let refuse = |key: &str, message: String| OptionError::new(key, message);
    let endpoint = endpoint(config.url.as_deref())?;
    let model = match config.model.as_deref().map(str::trim) {
        None => return Err(refuse("model", "missing (expected the judge model's name)".into())),
        Some("") => {
            return Err(refuse("model", "expected the judge model's name, got an empty string".into()));
        }
        Some(model) => model.to_owned(),
    };
    options::check_secret_name("api_key_secret", config.api_key_secret.as_deref())?;
    let messages = match (config.messages, config.prompt) {
        (Some(_), Some(_)) => {
            return Err(refuse("prompt", "expected either messages or prompt, not both".into()));
        }
        (None, None) => {
            return Err(refuse(
                "messages",
                "missing (expected messages, a list of {role, content}, or prompt)".into(),
            ));
        }
        (None, Some(prompt)) => vec![Message { role: Role::User, content: prompt, key: "prompt".into() }],
        (Some(messages), None) => {
            if messages.is_empty() {
                return Err(refuse("messages", "expected at least one message".into()));
            }
            let messages: Vec<Message> = messages
                .into_iter()
                .enumerate()
                .map(|(index, m)| Message {
                    role: m.role,
                    content: m.content,
                    key: format!("messages[{index}].content"),
                })
                .collect();
            if !messages.iter().any(|m| m.role == Role::User) {
                return Err(refuse("messages", "expected at least one message with role \"user\"".into()));
            }
            messages
        }
    };
    if !messages.iter().any(|m| m.content.uses_sample()) {
        let key = if messages.len() == 1 && messages[0].key == "prompt" { "prompt" } else { "messages" };
        return Err(refuse(
            key,
            "no template reads {{sample}}: the judge would never see the completion".into(),
        ));
    }
    let rubric = rubric(config.rubric)?;
    if !(config.temperature.is_finite() && (0.0..=2.0).contains(&config.temperature)) {
        return Err(refuse("temperature", format!("expected 0 to 2, got {}", config.temperature)));
    }
    if !(1..=65_536).contains(&config.max_tokens) {
        return Err(refuse("max_tokens", format!("expected 1 to 65536, got {}", config.max_tokens)));
    }
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
    Ok(Options {
        url: config.url.unwrap_or_default(),
        api_key_secret: config.api_key_secret,
        settings: Settings {
            endpoint,
            model,
            messages,
            rubric,
            answer_instruction: config.answer_instruction,
            temperature: config.temperature,
            max_tokens: config.max_tokens,
            response_format: config.response_format,
            limits,
            headers: HeaderMap::new(),
        },
    })
}

/// `<url>/chat/completions`. `url` is the base, as OpenAI's clients take it; a url that already
/// ends in `/chat/completions` is refused rather than guessed at, so one spelling means one thing.
fn endpoint(url: Option<&str>) -> Result<Url, OptionError> {
    let mut url = options::check_url("url", url, "the API's base (e.g. https://api.openai.com/v1), an")?;
    let path = url.path().trim_end_matches('/').to_owned();
    if path.ends_with(CHAT_COMPLETIONS) {
        return Err(OptionError::new(
            "url",
            format!(
                "expected the API's base URL without {CHAT_COMPLETIONS} (e.g. https://api.openai.com/v1): the plugin \
                 adds it"
            ),
        ));
    }
    url.set_path(&format!("{path}{CHAT_COMPLETIONS}"));
    Ok(url)
}

fn rubric(config: Option<RubricConfig>) -> Result<Rubric, OptionError> {
    let refuse = |key: &str, message: String| OptionError::new(key, message);
    match config {
        None => Err(refuse(
            "rubric",
            "missing (expected {\"kind\": \"score\", \"min\", \"max\", \"pass_threshold\"} or {\"kind\": \"label\", \
             \"labels\", \"passing_labels\"})"
                .into(),
        )),
        Some(RubricConfig::Score { min, max, pass_threshold }) => {
            if !min.is_finite() || !max.is_finite() || min >= max {
                return Err(refuse("rubric.max", format!("expected a number above min ({min}), got {max}")));
            }
            if !(pass_threshold >= min && pass_threshold <= max) {
                return Err(refuse(
                    "rubric.pass_threshold",
                    format!("expected a number from min ({min}) to max ({max}), got {pass_threshold}"),
                ));
            }
            Ok(Rubric::Score { min, max, pass_threshold })
        }
        Some(RubricConfig::Label { labels, passing_labels }) => {
            if labels.len() < 2 || labels.len() > MAX_LABELS {
                return Err(refuse("rubric.labels", format!("expected 2 to {MAX_LABELS} labels, got {}", labels.len())));
            }
            for (index, label) in labels.iter().enumerate() {
                if label.trim().is_empty() || label.trim() != label {
                    return Err(refuse(
                        &format!("rubric.labels[{index}]"),
                        format!("expected a label without surrounding whitespace, got {label:?}"),
                    ));
                }
                if labels[..index].contains(label) {
                    return Err(refuse(&format!("rubric.labels[{index}]"), format!("{label:?} appears twice")));
                }
            }
            if passing_labels.is_empty() {
                return Err(refuse("rubric.passing_labels", "expected at least one of the labels".into()));
            }
            for (index, label) in passing_labels.iter().enumerate() {
                if !labels.contains(label) {
                    return Err(refuse(
                        &format!("rubric.passing_labels[{index}]"),
                        format!("{label:?} is not one of the labels"),
                    ));
                }
            }
            Ok(Rubric::Label { labels, passing_labels })
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn base() -> serde_json::Value {
        json!({"url": "http://127.0.0.1:8000/v1", "model": "judge-1", "prompt": "Grade: {{sample}} against {{item.reference.answer}}",
               "rubric": {"kind": "score", "min": 0, "max": 10, "pass_threshold": 7}})
    }

    /// `change` edits the base config; `expected`: `Ok(endpoint)` or the start of `"<key>: <message>"`.
    fn check(change: impl FnOnce(&mut serde_json::Value), expected: Result<&str, &str>) {
        let mut config = base();
        change(&mut config);
        let mut host = HostContext::default();
        host.secrets.insert("judge-key".into(), Secret::new("sk-test"));
        let got = parse(&config.to_string()).and_then(|options| options.settings(&host));
        match (got, expected) {
            (Ok(settings), Ok(endpoint)) => assert_eq!(settings.endpoint.as_str(), endpoint, "{config}"),
            (Err(error), Err(start)) => assert!(error.to_string().starts_with(start), "{config}: {error}"),
            (got, expected) => panic!("{config}: got {got:?}, expected {expected:?}"),
        }
    }

    #[test]
    fn accepted_and_refused_configs_name_the_key() {
        let endpoint = "http://127.0.0.1:8000/v1/chat/completions";
        check(|_| {}, Ok(endpoint));
        check(|c| c["url"] = json!("http://127.0.0.1:8000/v1/"), Ok(endpoint));
        check(
            |c| c["url"] = json!("https://api.example/openai/v1?api-version=1"),
            Ok("https://api.example/openai/v1/chat/completions?api-version=1"),
        );
        check(|c| c["api_key_secret"] = json!("judge-key"), Ok(endpoint));
        check(
            |c| {
                c.as_object_mut().unwrap().remove("prompt");
                c["messages"] = json!([{"role": "system", "content": "You grade."}, {"role": "user", "content": "{{sample}}"}]);
            },
            Ok(endpoint),
        );
        check(
            |c| {
                c["rubric"] = json!({"kind": "label", "labels": ["correct", "incorrect"], "passing_labels": ["correct"]})
            },
            Ok(endpoint),
        );
        let cases: &[(serde_json::Value, &str)] = &[
            (json!({"url": null}), "url: missing"),
            (
                json!({"url": "http://h/v1/chat/completions"}),
                "url: expected the API's base URL without /chat/completions",
            ),
            (json!({"url": "http://k:p@h/v1"}), "url: expected no user:password"),
            (json!({"model": null}), "model: missing (expected the judge model's name)"),
            (json!({"model": " "}), "model: expected the judge model's name, got an empty string"),
            (
                json!({"api_key_secret": "other"}),
                "api_key_secret: no secret named \"other\" is available to this job",
            ),
            (json!({"api_key_secret": ""}), "api_key_secret: expected the name of a secret"),
            (
                json!({"api_key_env": "OPENAI_API_KEY"}),
                "api_key_env: environment variable names are not accepted",
            ),
            (json!({"modle": "x"}), "modle: unknown key; expected one of url, model, "),
            (
                json!({"prompt": null}),
                "messages: missing (expected messages, a list of {role, content}, or prompt)",
            ),
            (
                json!({"messages": [{"role": "user", "content": "{{sample}}"}]}),
                "prompt: expected either messages or prompt, not both",
            ),
            (json!({"prompt": "Grade this."}), "prompt: no template reads {{sample}}"),
            (json!({"prompt": "{{sample}} {{item.reference.answer"}), "prompt: unclosed `{{` at byte 11"),
            (json!({"prompt": "{{samples}}"}), "prompt: unknown placeholder `samples`"),
            (json!({"prompt": null, "messages": []}), "messages: expected at least one message"),
            (
                json!({"prompt": null, "messages": [{"role": "system", "content": "{{sample}}"}]}),
                "messages: expected at least one message with role \"user\"",
            ),
            (
                json!({"prompt": null, "messages": [{"role": "tool", "content": "{{sample}}"}]}),
                "messages[0].role: ",
            ),
            (
                json!({"prompt": null, "messages": [{"role": "user", "content": "{{sample}}", "name": "x"}]}),
                "messages[0].name: unknown key",
            ),
            (json!({"rubric": null}), "rubric: missing"),
            (json!({"rubric": {"kind": "stars"}}), "rubric"),
            (json!({"rubric": {"kind": "score", "min": 0, "max": 10}}), "rubric"),
            (
                json!({"rubric": {"kind": "score", "min": 5, "max": 5, "pass_threshold": 5}}),
                "rubric.max: expected a number above min (5), got 5",
            ),
            (
                json!({"rubric": {"kind": "score", "min": 0, "max": 10, "pass_threshold": 11}}),
                "rubric.pass_threshold: expected a number from min (0) to max (10), got 11",
            ),
            (
                json!({"rubric": {"kind": "label", "labels": ["yes"], "passing_labels": ["yes"]}}),
                "rubric.labels: expected 2 to 64 labels, got 1",
            ),
            (
                json!({"rubric": {"kind": "label", "labels": ["yes", "yes"], "passing_labels": ["yes"]}}),
                "rubric.labels[1]: \"yes\" appears twice",
            ),
            (
                json!({"rubric": {"kind": "label", "labels": ["yes", " no"], "passing_labels": ["yes"]}}),
                "rubric.labels[1]: expected a label without surrounding whitespace",
            ),
            (
                json!({"rubric": {"kind": "label", "labels": ["yes", "no"], "passing_labels": []}}),
                "rubric.passing_labels: expected at least one of the labels",
            ),
            (
                json!({"rubric": {"kind": "label", "labels": ["yes", "no"], "passing_labels": ["maybe"]}}),
                "rubric.passing_labels[0]: \"maybe\" is not one of the labels",
            ),
            (json!({"temperature": 3}), "temperature: expected 0 to 2, got 3"),
            (json!({"max_tokens": 0}), "max_tokens: expected 1 to 65536, got 0"),
            (json!({"response_format": "xml"}), "response_format: "),
            (json!({"timeout_ms": 20000}), "timeout_ms: the worst case per item"),
            (json!({"retry_on": ["4xx"]}), "retry_on[0]: expected one of connect, timeout, 5xx, 429"),
        ];
        for (change, expected) in cases {
            check(
                |config| {
                    for (key, value) in change.as_object().unwrap() {
                        if value.is_null() {
                            config.as_object_mut().unwrap().remove(key);
                        } else {
                            config[key] = value.clone();
                        }
                    }
                },
                Err(expected),
            );
        }
    }

    #[test]
    fn the_report_names_the_endpoint_and_the_secret_and_the_key_is_sensitive() {
        let mut config = base();
        config["api_key_secret"] = json!("judge-key");
        let options = parse(&config.to_string()).unwrap();
        assert_eq!(
            options.report(),
            OptionsReport::default()
                .url("url", "http://127.0.0.1:8000/v1")
                .secret("api_key_secret", "judge-key")
        );
        let mut host = HostContext::default();
        host.secrets.insert("judge-key".into(), Secret::new("sk-test"));
        let settings = options.settings(&host).unwrap();
        assert!(settings.headers[AUTHORIZATION].is_sensitive());
        assert!(!format!("{settings:?}").contains("sk-test"), "the key leaks through Debug");
    }
}
