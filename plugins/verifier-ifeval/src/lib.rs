//! `ifeval`: Google's IFEval instruction-following checks — 25 verifiable instructions, strict and
//! loose — as a verifier plugin.
//!
//! `reference` = `{"instruction_id_list": [...], "kwargs": [{...}, ...]}`, one kwargs object per
//! instruction (see `reference.rs`). The graded text is the completion after its last
//! `</think>` (all of it when there is none). Components, in this order:
//! - one per instruction, named by its id (`<index>:<id>` when an id repeats): 1 when followed
//!   under the configured mode, else 0;
//! - `strict` and `loose`: the fraction of instructions followed under each evaluation.
//!
//! `score` is the fraction followed under the configured `mode` (default strict) and `passed` is
//! whether all were. Semantics follow the reference implementation (google-research
//! `instruction_following_eval`, Apache-2.0) check by check; `README.md` lists where they cannot.

mod check;
mod lang;
mod punkt;
mod pytext;
mod reference;
mod treebank;

use rlvr_plugin_api::{
    Metadata, OptionError, OptionsReport, PluginError, Verdict, VerifierPlugin, VerifyItem,
    check_known_answers, export_verifier, parse_options,
};
use serde::Deserialize;

pub use reference::INSTRUCTION_IDS;

/// Which of the reference's two evaluations gives the score.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// The response as it is.
    #[default]
    Strict,
    /// Followed when any of eight relaxed variants of the response follows (an upper bound).
    Loose,
}

/// The plugin's keys in a job's `[[verifiers]]` entry.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct IfevalConfig {
    /// The evaluation that gives `score` and `passed`; both fractions are reported as components.
    pub mode: Mode,
    /// Text after the last occurrence of this tag is graded; empty grades the whole completion.
    pub think_close: String,
}

impl Default for IfevalConfig {
    fn default() -> Self {
        IfevalConfig { mode: Mode::Strict, think_close: "</think>".to_owned() }
    }
}

/// The IFEval verifier.
#[derive(Debug, Clone)]
pub struct IfevalVerifier {
    config: IfevalConfig,
}

/// The outcome of one instruction under both evaluations.
#[derive(Debug, Clone, PartialEq)]
pub struct InstructionResult {
    /// The component name.
    pub name: String,
    /// Followed under the strict evaluation.
    pub strict: bool,
    /// Followed under the loose evaluation.
    pub loose: bool,
}

impl IfevalVerifier {
    /// A verifier with `config`.
    pub fn new(config: IfevalConfig) -> Self {
        IfevalVerifier { config }
    }

    /// The text that is graded: after the last `think_close`, or all of `completion`.
    pub fn graded_text<'a>(&self, completion: &'a str) -> &'a str {
        let tag = self.config.think_close.as_str();
        if tag.is_empty() {
            return completion;
        }
        match completion.rfind(tag) {
            Some(at) => &completion[at + tag.len()..],
            None => completion,
        }
    }

    /// Checks `response` against `reference_json`; `Err` names what is wrong with the reference.
    /// With `explain`, also returns one line per instruction.
    pub fn evaluate(
        &self,
        response: &str,
        reference_json: &str,
        explain: bool,
    ) -> Result<(Vec<InstructionResult>, Vec<String>), String> {
        let entries = reference::parse(reference_json)?;
        let variants = check::loose_variants(response);
        let mut results = Vec::with_capacity(entries.len());
        let mut lines = Vec::new();
        for entry in &entries {
            let (strict, strict_measure) = check::strict(&entry.instruction, response);
            let (loose, loose_measure) = check::loose(&entry.instruction, &variants);
            if explain {
                let verdict = |ok: bool| if ok { "followed" } else { "not followed" };
                lines.push(format!(
                    "{}: strict {}: {strict_measure}; loose {}: {loose_measure}",
                    entry.name,
                    verdict(strict),
                    verdict(loose)
                ));
            }
            debug_assert!(!strict || loose, "the response itself is the first loose variant");
            results.push(InstructionResult { name: entry.name.clone(), strict, loose });
        }
        Ok((results, lines))
    }
}

fn fraction(results: &[InstructionResult], followed: impl Fn(&InstructionResult) -> bool) -> f64 {
    results.iter().filter(|r| followed(r)).count() as f64 / results.len() as f64
}

impl VerifierPlugin for IfevalVerifier {
    fn metadata() -> Metadata {
        Metadata {
            name: "ifeval",
            version: env!("CARGO_PKG_VERSION"),
            description: "IFEval: Google's 25 verifiable instructions, strict and loose; score = fraction followed",
        }
    }

    fn reference_schema() -> &'static str {
        r#"{"instruction_id_list": ["punctuation:no_comma", "length_constraints:number_words"], "kwargs": [{}, {"num_words": 100, "relation": "at least"}]}"#
    }

    fn from_config(config_json: &str) -> Result<Self, PluginError> {
        let config: IfevalConfig = parse_options(config_json)?;
        punkt::warm_up();
        lang::warm_up();
        Ok(IfevalVerifier::new(config))
    }

    /// Parsing only: creating warms up the sentence splitter and the language detector, which a
    /// check at submit has no use for.
    fn check_options(config_json: &str) -> Result<OptionsReport, OptionError> {
        parse_options::<IfevalConfig>(config_json)?;
        Ok(OptionsReport::default())
    }

    fn verify(&self, item: &VerifyItem<'_>) -> Result<Verdict, PluginError> {
        let response = self.graded_text(item.completion.as_str());
        let (results, lines) = match self.evaluate(response, item.reference_json.as_str(), item.explain) {
            Ok(evaluated) => evaluated,
            Err(message) => return Ok(Verdict::error(message)),
        };
        let strict = fraction(&results, |r| r.strict);
        let loose = fraction(&results, |r| r.loose);
        let followed = |r: &InstructionResult| match self.config.mode {
            Mode::Strict => r.strict,
            Mode::Loose => r.loose,
        };
        let score = match self.config.mode {
            Mode::Strict => strict,
            Mode::Loose => loose,
        };
        let mut verdict = Verdict::new(score, results.iter().all(followed)).extracted(response);
        for result in &results {
            verdict = verdict.component(&result.name, if followed(result) { 1.0 } else { 0.0 });
        }
        verdict = verdict.component("strict", strict).component("loose", loose);
        if item.explain {
            let mode = match self.config.mode {
                Mode::Strict => "strict",
                Mode::Loose => "loose",
            };
            verdict = verdict.explain(format!(
                "graded {} characters{}; score is the {mode} fraction",
                response.chars().count(),
                if response.len() == item.completion.len() { "" } else { " after the last think tag" }
            ));
            for line in lines {
                verdict = verdict.explain(line);
            }
        }
        Ok(verdict)
    }

    fn self_test() -> Result<(), PluginError> {
        let verifier = IfevalVerifier::new(IfevalConfig::default());
        let reference = r#"{"instruction_id_list": ["punctuation:no_comma", "length_constraints:number_sentences",
            "change_case:capital_word_frequency"], "kwargs": [{}, {"num_sentences": 2, "relation": "at least"},
            {"capital_frequency": 2, "capital_relation": "at least"}]}"#;
        check_known_answers(
            &verifier,
            &[
                ("<think>plan, draft</think>Mr. Smith left. He DID NOT return.", reference, 1.0),
                ("Mr. Smith left, then he returned.", reference, 0.0),
            ],
        )
    }
}

export_verifier!(IfevalVerifier);

#[cfg(test)]
mod tests {
    use super::*;

    /// Options → `Ok(())` (accepted, nothing to report) or `Err((key, message))`.
    fn check(json: &str, expected: Result<(), (&str, &str)>) {
        rlvr_plugin_api::options::assert_answers(json, [IfevalVerifier::check_options(json)], expected);
    }

    #[test]
    fn options_are_checked_naming_the_key() {
        check("{}", Ok(()));
        check(r#"{"mode": "loose", "think_close": ""}"#, Ok(()));
        check(r#"{"mod": "loose"}"#, Err(("mod", "unknown key; expected one of mode, think_close")));
        check(r#"{"mode": "lenient"}"#, Err(("mode", "expected one of strict, loose, got \"lenient\"")));
        let error = IfevalVerifier::from_config(r#"{"think_close": 5}"#).unwrap_err();
        assert_eq!(error.message.as_str(), "think_close: expected a string, got integer `5`");
    }
}
