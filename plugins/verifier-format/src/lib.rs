//! `format`: the R1-Zero-style format reward — one `<think>…</think>` block, then a non-empty answer.
//!
//! A completion passes when, after optional leading whitespace, it holds exactly one reasoning
//! block (`think_open` … `think_close`, no other occurrence of either tag anywhere) followed by a
//! non-empty answer. With `answer_open`/`answer_close` set, the answer must be exactly one such
//! block with non-empty content. Components, logged separately by the trainer:
//! - `think_block`: 1 when the reasoning block is the single, well-formed, leading block;
//! - `answer`: 1 when a non-empty answer follows it (in its tags, when those are configured).
//!
//! The score is 1 when both are 1, else 0. Everything is linear in the input's length: a 10 MB
//! completion is answered in milliseconds.

use rlvr_plugin_api::{
    Metadata, OptionError, OptionsReport, PluginError, Verdict, VerifierPlugin, VerifyItem,
    check_known_answers, export_verifier, parse_options,
};
use serde::Deserialize;

/// The plugin's keys in a job's `[[verifiers]]` entry.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct FormatConfig {
    /// Opening tag of the reasoning block.
    pub think_open: String,
    /// Closing tag of the reasoning block.
    pub think_close: String,
    /// Opening tag the answer must be wrapped in, e.g. `<answer>`; none by default.
    pub answer_open: Option<String>,
    /// Closing tag of the answer; set together with `answer_open`.
    pub answer_close: Option<String>,
}

impl Default for FormatConfig {
    fn default() -> Self {
        FormatConfig {
            think_open: "<think>".to_owned(),
            think_close: "</think>".to_owned(),
            answer_open: None,
            answer_close: None,
        }
    }
}

/// The format verifier.
#[derive(Debug, Clone)]
pub struct FormatVerifier {
    config: FormatConfig,
}

/// The outcome of checking one completion, before it becomes a [`Verdict`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FormatCheck<'a> {
    /// Exactly one leading reasoning block.
    pub think_block: bool,
    /// The non-empty answer after it, if any.
    pub answer: Option<&'a str>,
}

impl FormatVerifier {
    /// A verifier with `config`, checked for empty or half-given tags.
    pub fn new(config: FormatConfig) -> Result<Self, OptionError> {
        for (key, tag) in [("think_open", &config.think_open), ("think_close", &config.think_close)] {
            if tag.trim().is_empty() {
                return Err(OptionError::new(key, "expected a non-empty tag"));
            }
        }
        if config.think_open == config.think_close {
            return Err(OptionError::new("think_close", "expected a tag other than think_open's"));
        }
        let blank = |tag: &Option<String>| tag.as_deref().is_some_and(|tag| tag.trim().is_empty());
        match (&config.answer_open, &config.answer_close) {
            (Some(_), Some(_)) | (None, None) => {}
            (Some(_), None) => return Err(OptionError::new("answer_close", "missing; set with answer_open")),
            (None, Some(_)) => return Err(OptionError::new("answer_open", "missing; set with answer_close")),
        }
        for (key, tag) in [("answer_open", &config.answer_open), ("answer_close", &config.answer_close)] {
            if blank(tag) {
                return Err(OptionError::new(key, "expected a non-empty tag"));
            }
        }
        Ok(FormatVerifier { config })
    }

    /// Checks one completion.
    pub fn check<'a>(&self, completion: &'a str) -> FormatCheck<'a> {
        let open = self.config.think_open.as_str();
        let close = self.config.think_close.as_str();
        let single_tags = completion.matches(open).count() == 1 && completion.matches(close).count() == 1;
        let rest = completion
            .trim_start()
            .strip_prefix(open)
            .and_then(|after_open| after_open.split_once(close))
            .map(|(_reasoning, rest)| rest.trim());
        let Some(rest) = rest.filter(|_| single_tags) else {
            return FormatCheck { think_block: false, answer: None };
        };
        let answer = match (&self.config.answer_open, &self.config.answer_close) {
            (Some(a_open), Some(a_close)) => rest
                .strip_prefix(a_open.as_str())
                .and_then(|inner| inner.strip_suffix(a_close.as_str()))
                .filter(|inner| !inner.contains(a_open.as_str()) && !inner.contains(a_close.as_str()))
                .map(str::trim),
            _ => Some(rest),
        };
        FormatCheck { think_block: true, answer: answer.filter(|answer| !answer.is_empty()) }
    }
}

impl VerifierPlugin for FormatVerifier {
    fn metadata() -> Metadata {
        Metadata {
            name: "format",
            version: env!("CARGO_PKG_VERSION"),
            description: "one <think>…</think> block followed by a non-empty answer (R1-Zero format reward)",
        }
    }

    fn from_config(config_json: &str) -> Result<Self, PluginError> {
        Ok(FormatVerifier::new(parse_options(config_json)?)?)
    }

    fn check_options(config_json: &str) -> Result<OptionsReport, OptionError> {
        FormatVerifier::new(parse_options(config_json)?)?;
        Ok(OptionsReport::default())
    }

    fn verify(&self, item: &VerifyItem<'_>) -> Result<Verdict, PluginError> {
        let check = self.check(item.completion.as_str());
        let answer_ok = check.think_block && check.answer.is_some();
        let score = if answer_ok { 1.0 } else { 0.0 };
        let mut verdict = Verdict::new(score, answer_ok)
            .component("think_block", if check.think_block { 1.0 } else { 0.0 })
            .component("answer", if answer_ok { 1.0 } else { 0.0 });
        if let Some(answer) = check.answer {
            verdict = verdict.extracted(answer);
        }
        Ok(verdict)
    }

    fn self_test() -> Result<(), PluginError> {
        let verifier = FormatVerifier::new(FormatConfig::default())?;
        check_known_answers(
            &verifier,
            &[
                ("<think>2+2 is 4</think> 4", "{}", 1.0),
                ("4", "{}", 0.0),
                ("<think>a</think><think>b</think> 4", "{}", 0.0),
            ],
        )
    }
}

export_verifier!(FormatVerifier);

#[cfg(test)]
mod tests {
    use super::*;

    fn check(config: FormatConfig, completion: &str, expected: Option<Option<&str>>) {
        let verifier = FormatVerifier::new(config).unwrap();
        let got = verifier.check(completion);
        let got = if got.think_block { Some(got.answer) } else { None };
        assert_eq!(got, expected, "completion: {completion:?}");
    }

    #[test]
    fn default_tags() {
        let cases: &[(&str, Option<Option<&str>>)] = &[
            ("<think>x</think>42", Some(Some("42"))),
            ("  \n<think>reason</think>\n\nThe answer is 42.  ", Some(Some("The answer is 42."))),
            ("<think></think>42", Some(Some("42"))),
            // missing close tag
            ("<think>reasoning 42", None),
            // two think blocks
            ("<think>a</think><think>b</think>42", None),
            // nested open tag
            ("<think>a<think>b</think>42", None),
            // stray close tag in the answer
            ("<think>a</think>42</think>", None),
            // answer only inside think
            ("<think>the answer is 42</think>", Some(None)),
            // empty answer
            ("<think>a</think>   \n\t", Some(None)),
            // text before the block
            ("sure! <think>a</think>42", None),
            // close before open
            ("</think>a<think>42", None),
            ("", None),
        ];
        for (completion, expected) in cases {
            check(FormatConfig::default(), completion, *expected);
        }
    }

    #[test]
    fn answer_tags() {
        let config = FormatConfig {
            answer_open: Some("<answer>".into()),
            answer_close: Some("</answer>".into()),
            ..FormatConfig::default()
        };
        let cases: &[(&str, Option<Option<&str>>)] = &[
            ("<think>x</think><answer> 42 </answer>", Some(Some("42"))),
            ("<think>x</think>42", Some(None)),
            ("<think>x</think><answer></answer>", Some(None)),
            ("<think>x</think><answer>1</answer><answer>2</answer>", Some(None)),
            ("<think>x</think><answer>42</answer> trailing", Some(None)),
        ];
        for (completion, expected) in cases {
            check(config.clone(), completion, *expected);
        }
    }

    /// Options → `Ok(())` (accepted, nothing to report) or `Err((key, message))`, through
    /// `check_options` and `from_config` alike.
    fn check_options(json: &str, expected: Result<(), (&str, &str)>) {
        let checked = FormatVerifier::check_options(json);
        let created =
            FormatVerifier::from_config(json).map(|_| OptionsReport::default()).map_err(OptionError::from);
        rlvr_plugin_api::options::assert_answers(json, [checked, created], expected);
    }

    #[test]
    fn options_are_checked_naming_the_key() {
        check_options("{}", Ok(()));
        check_options(r#"{"answer_open": "<a>", "answer_close": "</a>"}"#, Ok(()));
        check_options(
            r#"{"think_opn": "<t>"}"#,
            Err((
                "think_opn",
                "unknown key; expected one of think_open, think_close, answer_open, answer_close",
            )),
        );
        check_options(r#"{"think_open": " "}"#, Err(("think_open", "expected a non-empty tag")));
        check_options(
            r#"{"think_close": "<think>"}"#,
            Err(("think_close", "expected a tag other than think_open's")),
        );
        check_options(r#"{"answer_open": "<a>"}"#, Err(("answer_close", "missing; set with answer_open")));
        check_options(r#"{"answer_close": "</a>"}"#, Err(("answer_open", "missing; set with answer_close")));
        check_options(
            r#"{"answer_open": "<a>", "answer_close": ""}"#,
            Err(("answer_close", "expected a non-empty tag")),
        );
        check_options(r#"{"think_open": 1}"#, Err(("think_open", "expected a string, got integer `1`")));
    }

    #[test]
    fn self_test_passes() {
        FormatVerifier::self_test().unwrap();
    }
}
