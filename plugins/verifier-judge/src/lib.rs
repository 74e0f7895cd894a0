//! `judge`: an LLM judge — asks any OpenAI-compatible `/v1/chat/completions` endpoint to grade
//! each item on a rubric (a score in a range, or a label), and parses its answer strictly.
//!
//! Per item: the messages' templates are filled (`{{sample}}` is the completion, `{{item.PATH}}`
//! the item, as in every grader with templates), the rubric's answer form is added
//! (`answer_instruction`), and one chat completion is requested at `temperature` 0 by default,
//! with `response_format` the rubric's JSON schema. The reply must be exactly one JSON object
//! ([`reply`]); anything else is an error verdict naming what was wrong and quoting the start of
//! the reply — never a silent 0, never a guess.
//!
//! Retries, backoff, the circuit breaker, the secret by name and the host's outbound policy are
//! the http verifier's, from `rlvr-verifier-http-common`: a slow, failing or dead endpoint gives
//! error or timeout verdicts within the item budget (at most 25 s), never a hang. A reply that
//! is not a valid verdict is not retried: at the default temperature 0 the judge would most
//! likely say the same again.
//!
//! Components: `judge_attempts` (requests the item took) and, when the endpoint reports usage,
//! `judge_prompt_tokens` and `judge_completion_tokens`. Explanation (when asked): the model, the
//! rubric, the attempts, the judge's choice and its reason.

pub mod config;
pub mod reply;
pub mod rubric;

use reqwest::blocking::Client;
use rlvr_plugin_api::{
    HostContext, Metadata, OptionError, OptionsReport, PluginError, Verdict, VerifierPlugin, VerifyItem,
    export_verifier,
};
use rlvr_verifier_http_common::attempt::snippet;
use rlvr_verifier_http_common::{Answered, Caller, Sender, Trail, attempt, outbound, tls};
use serde_json::{Value, json};

use crate::config::{ResponseFormat, Role, Settings};
use crate::reply::{Completion, parse_completion, parse_reply};
use crate::rubric::{Choice, Rubric};

/// The component that counts requests per item.
pub const ATTEMPTS_COMPONENT: &str = "judge_attempts";

/// The judge: one client, one caller (limits and breaker), one config.
#[derive(Debug)]
pub struct JudgeVerifier {
    settings: Settings,
    client: Sender,
    caller: Caller,
}

impl JudgeVerifier {
    /// A judge with checked `settings`, its requests under `host`'s outbound policy.
    pub fn new(settings: Settings, host: &HostContext) -> Result<Self, PluginError> {
        tls::install_provider();
        let builder = Client::builder()
            .timeout(settings.limits.timeout)
            .connect_timeout(settings.limits.timeout)
            // Retries are ours alone, so `judge_attempts` counts every request the endpoint saw.
            .retry(reqwest::retry::never())
            .default_headers(settings.headers.clone())
            .user_agent(concat!("rlvr-verifier-judge/", env!("CARGO_PKG_VERSION")));
        let client = outbound(builder, "url", &settings.endpoint, host)?;
        let caller = Caller::new(settings.limits.clone(), "the judge", ATTEMPTS_COMPONENT);
        Ok(JudgeVerifier { settings, client, caller })
    }

    /// The request body for one item, or the error verdict of a template the item cannot fill.
    // The `Err` is the item's finished verdict, moved once per item: boxing it buys nothing.
    #[allow(clippy::result_large_err)]
    fn request(&self, item: &VerifyItem<'_>, item_json: &Value) -> Result<Vec<u8>, Verdict> {
        let settings = &self.settings;
        let mut messages = Vec::with_capacity(settings.messages.len() + 1);
        for message in &settings.messages {
            let content = message
                .content
                .render(item.completion.as_str(), item_json)
                .map_err(|error| Verdict::error(format!("{}: {error}", message.key)))?;
            messages.push((message.role, content));
        }
        if settings.answer_instruction {
            let instruction = settings.rubric.instruction();
            match messages.first_mut() {
                Some((Role::System | Role::Developer, content)) => {
                    content.push_str("\n\n");
                    content.push_str(&instruction);
                }
                _ => messages.insert(0, (Role::System, instruction)),
            }
        }
        let messages: Vec<Value> = messages
            .into_iter()
            .map(|(role, content)| json!({"role": role.as_str(), "content": content}))
            .collect();
        let mut body = json!({
            "model": settings.model,
            "messages": messages,
            "temperature": settings.temperature,
            "max_tokens": settings.max_tokens,
        });
        match settings.response_format {
            ResponseFormat::JsonSchema => {
                body["response_format"] = json!({
                    "type": "json_schema",
                    "json_schema": {"name": "judge_verdict", "strict": true, "schema": settings.rubric.schema()},
                });
            }
            ResponseFormat::JsonObject => body["response_format"] = json!({"type": "json_object"}),
            ResponseFormat::None => {}
        }
        serde_json::to_vec(&body)
            .map_err(|error| Verdict::error(format!("cannot encode the request: {error}")))
    }

    /// The lines every explanation starts with: who judged, on what rubric.
    fn header(&self, explain: bool) -> Trail {
        let mut trail = Trail::new(explain);
        trail.note(|| format!("judge: model {:?} at {}", self.settings.model, self.settings.endpoint));
        trail.note(|| format!("rubric: {}", self.settings.rubric.summary()));
        trail
    }

    /// The verdict from a chat completion the endpoint gave.
    fn answered(&self, completion: Completion, attempts: u32, mut trail: Trail) -> Verdict {
        let Completion { content, model, usage } = completion;
        trail.note(|| format!("attempt {attempts}: a chat completion from the judge"));
        if let Some(model) = &model {
            trail.note(|| format!("the endpoint says model {model:?} answered"));
        }
        let rubric = &self.settings.rubric;
        let mut verdict = match parse_reply(&content, rubric) {
            Err(error) => {
                trail.note(|| format!("the judge's reply: {content}"));
                Verdict::error(format!(
                    "the judge's reply is not a valid verdict: {error}; the reply began: \"{}\"",
                    snippet(content.as_bytes())
                ))
            }
            Ok(reply) => {
                let (score, passed) = rubric.grade(&reply.choice);
                let extracted = match &reply.choice {
                    Choice::Score(score) => score.to_string(),
                    Choice::Label(label) => label.clone(),
                };
                trail.note(|| match rubric {
                    Rubric::Score { .. } => {
                        format!("the judge's score {extracted} → {score}, passed: {passed}")
                    }
                    Rubric::Label { .. } => {
                        format!("the judge's label {extracted:?} → {score}, passed: {passed}")
                    }
                });
                if let Some(reason) = &reply.reason {
                    trail.note(|| format!("reason: {reason}"));
                }
                Verdict::new(score, passed).extracted(extracted)
            }
        };
        verdict = verdict.component(ATTEMPTS_COMPONENT, f64::from(attempts));
        if let Some((prompt, completion)) = usage {
            verdict = verdict
                .component("judge_prompt_tokens", prompt)
                .component("judge_completion_tokens", completion);
        }
        trail.into_verdict(verdict)
    }
}

impl VerifierPlugin for JudgeVerifier {
    fn metadata() -> Metadata {
        Metadata {
            name: "judge",
            version: env!("CARGO_PKG_VERSION"),
            description: "LLM judge: any OpenAI-compatible chat-completions endpoint grades each item on a score or \
                          label rubric, its answer parsed strictly",
        }
    }

    fn reference_schema() -> &'static str {
        "{\"type\": \"object\", \"description\": \"read by the messages' {{item.reference.PATH}} templates\"}"
    }

    fn notes() -> Vec<String> {
        tls::notes()
    }

    /// Without a host context: no secrets, so an `api_key_secret` is refused.
    fn from_config(config_json: &str) -> Result<Self, PluginError> {
        Self::from_config_in(config_json, &HostContext::default())
    }

    fn from_config_in(config_json: &str, host: &HostContext) -> Result<Self, PluginError> {
        let mut settings = config::parse(config_json)?.settings(host)?;
        rlvr_verifier_http_common::hold_to_caps(&mut settings.limits, host, config_json)?;
        JudgeVerifier::new(settings, host)
    }

    fn check_options(config_json: &str) -> Result<OptionsReport, OptionError> {
        Ok(config::parse(config_json)?.report())
    }

    fn verify(&self, item: &VerifyItem<'_>) -> Result<Verdict, PluginError> {
        let item_json = rlvr_grader_common::item_json(item)
            .map_err(|error| PluginError::invalid_input(error.to_string()))?;
        let explain = item.explain;
        let body = match self.request(item, &item_json) {
            Ok(body) => body,
            Err(verdict) => return Ok(self.header(explain).into_verdict(verdict)),
        };
        let sent = self.caller.call(explain, || {
            attempt::send(
                &self.client,
                &self.settings.endpoint,
                &self.settings.limits,
                &body,
                parse_completion,
            )
        });
        Ok(match sent {
            Ok(Answered { answer, attempts, trail }) => {
                let mut all = self.header(explain);
                all.extend(trail);
                self.answered(answer, attempts, all)
            }
            Err(verdict) => self.header(explain).lead(verdict),
        })
    }

    fn self_test() -> Result<(), PluginError> {
        let fail = |what: String| Err(PluginError::self_test_failed(what));
        let rubric = Rubric::Score { min: 0.0, max: 10.0, pass_threshold: 7.0 };
        let good = parse_reply("```json\n{\"reason\": \"fine\", \"score\": 8}\n```", &rubric);
        if good.as_ref().map(|reply| rubric.grade(&reply.choice)) != Ok((0.8, true)) {
            return fail(format!("a valid reply was not accepted: {good:?}"));
        }
        for garbage in
            ["The score is 8.", "{\"score\": 8} {\"score\": 2}", "{\"score\": 11}", "{\"score\": \"8\"}"]
        {
            if parse_reply(garbage, &rubric).is_ok() {
                return fail(format!("a malformed reply was accepted: {garbage}"));
            }
        }
        if config::parse("{}").is_ok() {
            return fail("a config without url was accepted".to_owned());
        }
        Ok(())
    }
}

export_verifier!(JudgeVerifier);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn self_test_passes() {
        JudgeVerifier::self_test().unwrap();
    }

    #[test]
    fn the_endpoint_must_be_on_the_operators_allow_list() {
        let config = r#"{"url": "http://127.0.0.1:1/v1", "model": "m", "prompt": "{{sample}}",
                         "rubric": {"kind": "label", "labels": ["a", "b"], "passing_labels": ["a"]}}"#;
        let refused = JudgeVerifier::from_config_in(config, &HostContext::default()).unwrap_err();
        assert!(refused.message.starts_with("url: "), "{refused}");
        let loopback = HostContext { outbound_allow: vec!["127.0.0.1/32".into()], ..HostContext::default() };
        JudgeVerifier::from_config_in(config, &loopback).unwrap();
    }
}
