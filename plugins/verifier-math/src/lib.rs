//! `math`: grades a completion's final answer against a gold answer by mathematical equivalence.
//!
//! The pipeline is three pure functions with no IO: [`extract::extract`] finds the answer the
//! model committed to, [`parse::parse`] reads it (and the gold) into an [`parse::Expr`], and
//! [`equiv::equivalent`] decides equality — exact rational arithmetic whenever both sides are
//! exact, a documented rounding rule for decimal approximations, seeded numeric evaluation only
//! for what has no exact form. All of it runs under one [`budget::Budget`] of counted work units
//! per item, so a hostile completion (deep nesting, 20,000-digit numbers, `10^{10^{10}}`) ends
//! in a deterministic timeout verdict, never a hang.
//!
//! Why a hand-written tokenizer and recursive-descent parser rather than a CAS or a grammar
//! crate: the language is a small, messy subset (LaTeX and plain text mixed, units, thousands
//! separators, JSON mis-escapes) whose repairs are decisions about what a model meant, and each
//! one is a line here with a test; the parser charges the budget per token and refuses nesting
//! beyond [`parse::MAX_DEPTH`], which no general parser lets us do; and it has no dependency but
//! `num-*`, so the plugin builds in seconds and its behaviour is all in this crate.
//!
//! Components of the verdict: `correct` (1 when equivalent) and `extracted` (1 when an answer
//! was found). The score is `correct`.
//!
//! `equivalent` finds exact canonical forms in `exact.rs` and uses seeded numeric evaluation
//! (`numeric.rs`) only where there is none. `fuzz/` is a cargo-fuzz crate outside the workspace;
//! `tests/replay.rs` replays its seeds and regressions on stable. `tests/corpus/` is the plugin's own
//! answer corpus (cited answer conventions and adversarial cases, verdicts for both fallback modes);
//! `tests/corpus.rs` requires every case and the dev set and checks the README's counts. Invariant:
//! extraction grades the answer the completion stated last (boxes and answer markers compete by
//! position).

pub mod budget;
pub mod equiv;
pub mod exact;
pub mod extract;
pub mod lexer;
pub mod numeric;
pub mod parse;

use rlvr_plugin_api::{
    Metadata, OptionError, OptionsReport, PluginError, Verdict, VerifierPlugin, VerifyItem,
    check_known_answers, export_verifier, parse_options,
};
use serde::Deserialize;

use crate::budget::Budget;
use crate::equiv::{Options, equivalent};
use crate::extract::{Fallback, Source, extract, extract_gold};
use crate::parse::{ParseError, parse};

/// Default work budget per item, in units (about one machine-word operation each): about 20 ms
/// of arithmetic on one core, far above what any real answer needs (the 86 dev cases peak at
/// well under 1% of it).
pub const DEFAULT_WORK_BUDGET: u64 = 20_000_000;

/// The plugin's keys in a job's `[[verifiers]]` entry.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MathConfig {
    /// What to grade when a completion has no `\boxed{}` and no answer marker: `"none"`
    /// (default; right for training) or `"last"` (the bare answer or the last math span or
    /// number; for evaluation).
    pub fallback: Fallback,
    /// Decimal places (or significant digits below 1) to which a decimal approximation must
    /// agree with a non-terminating exact value; a reference's own `precision_digits` wins.
    pub precision_digits: u32,
    /// Work units per item before the item is answered with a timeout.
    pub work_budget: u64,
}

impl Default for MathConfig {
    fn default() -> Self {
        MathConfig { fallback: Fallback::None, precision_digits: 6, work_budget: DEFAULT_WORK_BUDGET }
    }
}

/// An item's `reference`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct Reference {
    answer: Option<serde_json::Value>,
    precision_digits: Option<u32>,
}

/// The math verifier.
#[derive(Debug, Clone)]
pub struct MathVerifier {
    config: MathConfig,
}

/// Most precision digits accepted (beyond that, rounding is exact comparison anyway).
const MAX_PRECISION_DIGITS: u32 = 1000;

impl MathVerifier {
    /// A verifier with `config`, checked.
    pub fn new(config: MathConfig) -> Result<Self, OptionError> {
        if config.precision_digits > MAX_PRECISION_DIGITS {
            return Err(OptionError::new(
                "precision_digits",
                format!("expected at most {MAX_PRECISION_DIGITS}, got {}", config.precision_digits),
            ));
        }
        if config.work_budget < 10_000 {
            return Err(OptionError::new(
                "work_budget",
                format!("expected at least 10000 units, got {}", config.work_budget),
            ));
        }
        Ok(MathVerifier { config })
    }

    /// Judges one completion against a gold answer text.
    pub fn judge(
        &self,
        completion: &str,
        prompt: &str,
        gold: &str,
        precision_digits: u32,
        explain: bool,
    ) -> Verdict {
        let mut notes: Vec<String> = Vec::new();
        let mut budget = Budget::new(self.config.work_budget);
        let gold_extraction = extract_gold(gold);
        let extraction = match extract(completion, prompt, self.config.fallback) {
            Ok(extraction) => extraction,
            Err(why) => {
                let mut verdict =
                    Verdict::new(0.0, false).component("correct", 0.0).component("extracted", 0.0);
                if explain {
                    verdict = verdict.explain(format!("no answer extracted: {why}"));
                }
                return verdict;
            }
        };
        if explain {
            notes.push(format!(
                "pred answer {:?} taken from {}",
                extraction.answer,
                describe(&extraction.source)
            ));
            notes.push(format!(
                "gold answer {:?} taken from {}",
                gold_extraction.answer,
                describe(&gold_extraction.source)
            ));
        }
        let answered = |correct: bool, notes: Vec<String>| {
            let score = if correct { 1.0 } else { 0.0 };
            let mut verdict = Verdict::new(score, correct)
                .component("correct", score)
                .component("extracted", 1.0)
                .extracted(extraction.answer.clone());
            for note in notes {
                verdict = verdict.explain(note);
            }
            verdict
        };
        let gold_expr = match parse(&gold_extraction.answer, &mut budget) {
            Ok(expr) => expr,
            Err(ParseError::Exhausted(e)) => {
                return Verdict::timeout(format!("reference.answer: {e}"))
                    .extracted(extraction.answer.clone());
            }
            Err(ParseError::Syntax(why)) => {
                // A gold outside the answer language: only the same text (spacing aside) matches.
                let same = squash(&gold_extraction.answer) == squash(&extraction.answer);
                if explain {
                    notes.push(format!(
                        "gold could not be parsed ({why}): compared as text, {}",
                        if same { "identical" } else { "different" }
                    ));
                }
                return answered(same, notes);
            }
        };
        let pred_expr = match parse(&extraction.answer, &mut budget) {
            Ok(expr) => expr,
            Err(ParseError::Exhausted(e)) => {
                return Verdict::timeout(format!("completion: {e}")).extracted(extraction.answer.clone());
            }
            Err(ParseError::Syntax(why)) => {
                if explain {
                    notes.push(format!("gold parsed as {gold_expr}"));
                    notes.push(format!("pred could not be parsed: {why}"));
                }
                return answered(false, notes);
            }
        };
        if explain {
            notes.push(format!("gold parsed as {gold_expr}"));
            notes.push(format!("pred parsed as {pred_expr}"));
        }
        let options = Options { precision_digits };
        match equivalent(&gold_expr, &pred_expr, &options, &mut budget) {
            Ok(outcome) => {
                if explain {
                    notes.push(format!(
                        "{}: {}",
                        if outcome.equal { "equal" } else { "not equal" },
                        outcome.reason
                    ));
                    notes.push(format!("work: {} of {} units", budget.used(), self.config.work_budget));
                }
                answered(outcome.equal, notes)
            }
            Err(e) => Verdict::timeout(format!("comparison: {e}")).extracted(extraction.answer.clone()),
        }
    }
}

fn describe(source: &Source) -> String {
    match source {
        Source::Boxed { count: 1 } => "the last \\boxed{}".into(),
        Source::Boxed { count } => format!("the last {count} adjacent \\boxed{{}}"),
        Source::Marker(marker) => format!("after the marker {marker:?}"),
        Source::Fallback => "the fallback (last math span or number)".into(),
        Source::Whole => "the whole text".into(),
    }
}

fn squash(text: &str) -> String {
    text.chars().filter(|c| !c.is_whitespace() && *c != '$').collect()
}

impl VerifierPlugin for MathVerifier {
    fn metadata() -> Metadata {
        Metadata {
            name: "math",
            version: env!("CARGO_PKG_VERSION"),
            description: "final-answer equivalence: \\boxed{} extraction, LaTeX/plain parsing, exact rational arithmetic under a work budget",
        }
    }

    fn reference_schema() -> &'static str {
        r#"{"answer": "\\frac{1}{2}", "precision_digits": 6}"#
    }

    fn from_config(config_json: &str) -> Result<Self, PluginError> {
        Ok(MathVerifier::new(parse_options(config_json)?)?)
    }

    fn check_options(config_json: &str) -> Result<OptionsReport, OptionError> {
        MathVerifier::new(parse_options(config_json)?)?;
        Ok(OptionsReport::default())
    }

    fn verify(&self, item: &VerifyItem<'_>) -> Result<Verdict, PluginError> {
        let reference: Reference = match serde_json::from_str(item.reference_json.as_str()) {
            Ok(reference) => reference,
            Err(error) => return Ok(Verdict::error(format!("reference: {error}"))),
        };
        let gold = match reference.answer {
            Some(serde_json::Value::String(text)) if !text.trim().is_empty() => text,
            Some(serde_json::Value::Number(number)) => number.to_string(),
            Some(serde_json::Value::String(_)) => {
                return Ok(Verdict::error("reference.answer: expected a non-empty answer"));
            }
            Some(_) => return Ok(Verdict::error("reference.answer: expected a string or a number")),
            None => return Ok(Verdict::error("reference.answer: missing (expected the gold answer)")),
        };
        let digits = reference.precision_digits.unwrap_or(self.config.precision_digits);
        if digits > MAX_PRECISION_DIGITS {
            return Ok(Verdict::error(format!(
                "reference.precision_digits: expected at most {MAX_PRECISION_DIGITS}, got {digits}"
            )));
        }
        Ok(self.judge(item.completion.as_str(), item.prompt.as_str(), &gold, digits, item.explain))
    }

    fn self_test() -> Result<(), PluginError> {
        let verifier = MathVerifier::new(MathConfig::default())?;
        check_known_answers(
            &verifier,
            &[
                ("so \\boxed{0.5}", r#"{"answer": "\\frac{1}{2}"}"#, 1.0),
                ("\\boxed{0.3333}", r#"{"answer": "\\frac{1}{3}"}"#, 0.0),
                ("\\boxed{1} or \\boxed{2}", r#"{"answer": "2"}"#, 0.0),
                ("\\boxed{2, 1}", r#"{"answer": "\\{1,2\\}"}"#, 1.0),
            ],
        )
    }
}

export_verifier!(MathVerifier);

#[cfg(test)]
mod tests {
    use super::*;

    /// Options → `Ok(())` (accepted, nothing to report) or `Err((key, message))`, through
    /// `check_options` and `from_config` alike.
    fn check(json: &str, expected: Result<(), (&str, &str)>) {
        let checked = MathVerifier::check_options(json);
        let created =
            MathVerifier::from_config(json).map(|_| OptionsReport::default()).map_err(OptionError::from);
        rlvr_plugin_api::options::assert_answers(json, [checked, created], expected);
    }

    // regression: a typo'd key passed submit and failed at start pointing at "line 1 column 9"
    #[test]
    fn options_are_checked_naming_the_key() {
        check("{}", Ok(()));
        check(r#"{"fallback": "last", "precision_digits": 4}"#, Ok(()));
        check(
            r#"{"fallbak": "last"}"#,
            Err(("fallbak", "unknown key; expected one of fallback, precision_digits, work_budget")),
        );
        check(r#"{"fallback": "first"}"#, Err(("fallback", "expected one of none, last, got \"first\"")));
        check(r#"{"precision_digits": 5000}"#, Err(("precision_digits", "expected at most 1000, got 5000")));
        check(r#"{"precision_digits": -1}"#, Err(("precision_digits", "expected u32, got integer `-1`")));
        check(r#"{"work_budget": 5}"#, Err(("work_budget", "expected at least 10000 units, got 5")));
    }

    #[test]
    fn self_test_passes() {
        MathVerifier::self_test().unwrap();
    }
}
