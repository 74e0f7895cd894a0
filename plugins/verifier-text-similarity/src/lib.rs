//! `text-similarity`: OpenAI's `text_similarity` grader — a similarity metric between an `input`
//! template and a `reference` template, `passed` when it reaches `pass_threshold`.
//!
//! Metrics (see [`metrics`]): `fuzzy_match` (rapidfuzz's `fuzz.ratio`), `bleu` (sacrebleu's
//! sentence BLEU), `rouge_1` … `rouge_5` and `rouge_l` (rouge-score's ROUGE-N and ROUGE-L
//! F-measures), each in `[0, 1]` and checked against its Python reference implementation.
//! `meteor` is refused with the reason: its synonym stage needs WordNet data that is not packaged
//! where this project installs from, and METEOR without it is not METEOR.

pub mod metrics;

use rlvr_grader_common::{Template, item_json};
use rlvr_plugin_api::{
    Metadata, OptionError, OptionsReport, PluginError, Verdict, VerifierPlugin, VerifyItem, export_verifier,
};

/// The metric; OpenAI's names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Metric {
    /// [`metrics::fuzzy_ratio`].
    FuzzyMatch,
    /// [`metrics::sentence_bleu`].
    Bleu,
    /// [`metrics::rouge_l`].
    RougeL,
    /// [`metrics::rouge_n`] for n from 1 to 5 (OpenAI's `rouge_1` … `rouge_5`).
    RougeN(usize),
}

/// What `metric` takes, for messages.
const METRICS: &str = "fuzzy_match, bleu, rouge_1, rouge_2, rouge_3, rouge_4, rouge_5, rouge_l";

impl Metric {
    fn parse(name: &str) -> Result<Metric, OptionError> {
        match name {
            "fuzzy_match" => Ok(Metric::FuzzyMatch),
            "bleu" => Ok(Metric::Bleu),
            "rouge_l" => Ok(Metric::RougeL),
            "rouge_1" => Ok(Metric::RougeN(1)),
            "rouge_2" => Ok(Metric::RougeN(2)),
            "rouge_3" => Ok(Metric::RougeN(3)),
            "rouge_4" => Ok(Metric::RougeN(4)),
            "rouge_5" => Ok(Metric::RougeN(5)),
            "meteor" => Err(OptionError::new(
                "metric",
                format!(
                    "meteor is not offered: its synonym stage needs WordNet data, which is not \
                     packaged where this project installs from, and a METEOR without it would not \
                     match the reference; expected one of {METRICS}"
                ),
            )),
            other => Err(OptionError::new("metric", format!("expected one of {METRICS}, got {other:?}"))),
        }
    }

    fn name(self) -> &'static str {
        match self {
            Metric::FuzzyMatch => "fuzzy_match",
            Metric::Bleu => "bleu",
            Metric::RougeL => "rouge_l",
            Metric::RougeN(1) => "rouge_1",
            Metric::RougeN(2) => "rouge_2",
            Metric::RougeN(3) => "rouge_3",
            Metric::RougeN(4) => "rouge_4",
            Metric::RougeN(_) => "rouge_5",
        }
    }
}

/// Its keys in a job's `[[verifiers]]`; unknown ones are refused by name.
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Options {
    /// Default [`DEFAULT_INPUT`].
    input: Option<Template>,
    /// Default [`DEFAULT_REFERENCE`].
    reference: Option<Template>,
    /// Read as a string and checked by [`Metric::parse`], so `meteor` is refused with its reason.
    metric: String,
    /// Required, as in OpenAI's grader: a default would pass or fail items by a number the team
    /// never chose.
    pass_threshold: f64,
}

/// What `input` is when the options do not say: the completion.
pub const DEFAULT_INPUT: &str = "{{sample}}";
/// What `reference` is when the options do not say: the batch format's gold answer.
pub const DEFAULT_REFERENCE: &str = "{{item.reference.answer}}";

/// `template`, or the default `text` when the options gave none.
fn or_default(template: Option<Template>, key: &str, text: &str) -> Result<Template, OptionError> {
    match template {
        Some(template) => Ok(template),
        None => {
            Template::parse(text).map_err(|error| OptionError::new(key, format!("default {text:?}: {error}")))
        }
    }
}

/// A metric's score and its named parts.
struct Measured {
    score: f64,
    components: Vec<(&'static str, f64)>,
}

/// The `text-similarity` grader, built from its options.
#[derive(Debug)]
pub struct TextSimilarity {
    input: Template,
    reference: Template,
    metric: Metric,
    pass_threshold: f64,
}

impl TextSimilarity {
    fn parse(config_json: &str) -> Result<Self, OptionError> {
        let options: Options = rlvr_plugin_api::parse_options(config_json)?;
        let metric = Metric::parse(&options.metric)?;
        let threshold = options.pass_threshold;
        if !(0.0..=1.0).contains(&threshold) {
            return Err(OptionError::new(
                "pass_threshold",
                format!("expected a number from 0 to 1, got {threshold}"),
            ));
        }
        Ok(TextSimilarity {
            input: or_default(options.input, "input", DEFAULT_INPUT)?,
            reference: or_default(options.reference, "reference", DEFAULT_REFERENCE)?,
            metric,
            pass_threshold: threshold,
        })
    }

    /// The rendered input and reference for one item; an error names the key whose template
    /// failed.
    fn texts(&self, item: &VerifyItem<'_>) -> Result<(String, String), String> {
        let item_value = item_json(item).map_err(|error| error.to_string())?;
        let sample = item.completion.as_str();
        let input = self.input.render(sample, &item_value).map_err(|error| format!("input: {error}"))?;
        let reference =
            self.reference.render(sample, &item_value).map_err(|error| format!("reference: {error}"))?;
        Ok((input, reference))
    }

    /// The score and its components for two rendered texts, or why the work bound stopped it.
    fn measure(&self, input: &str, reference: &str) -> Result<Measured, String> {
        let (score, components) = match self.metric {
            Metric::FuzzyMatch => {
                let (input_chars, reference_chars) = (input.chars().count(), reference.chars().count());
                if input_chars.saturating_mul(reference_chars) > metrics::MAX_FUZZY_CELLS {
                    return Err(format!(
                        "fuzzy_match: {input_chars} input characters × {reference_chars} reference characters is more than the {} cells one item may cost",
                        metrics::MAX_FUZZY_CELLS
                    ));
                }
                let ratio = metrics::fuzzy_ratio(input, reference);
                (ratio, vec![("fuzzy_match", ratio)])
            }
            Metric::Bleu => {
                let bleu = metrics::sentence_bleu(input, reference);
                let [p1, p2, p3, p4] = bleu.precisions;
                // exp(ln 100) / 100 is 1.0000000000000004 for identical texts (sacrebleu says
                // 100.00000000000004): the score is kept in [0, 1], the component as computed.
                (
                    bleu.score.min(1.0),
                    vec![
                        ("bleu", bleu.score),
                        ("precision_1", p1),
                        ("precision_2", p2),
                        ("precision_3", p3),
                        ("precision_4", p4),
                        ("brevity_penalty", bleu.brevity_penalty),
                    ],
                )
            }
            Metric::RougeL => match metrics::rouge_l(input, reference) {
                Ok(rouge) => (
                    rouge.fmeasure,
                    vec![
                        ("rouge_l", rouge.fmeasure),
                        ("precision", rouge.precision),
                        ("recall", rouge.recall),
                    ],
                ),
                Err(too_long) => {
                    // The LCS and the fuzzy ratio have work bounds; BLEU and ROUGE-N are linear.
                    return Err(format!(
                        "rouge_l: {} input tokens × {} reference tokens is more than the {} cells one item may cost",
                        too_long.input_tokens,
                        too_long.reference_tokens,
                        metrics::MAX_LCS_CELLS
                    ));
                }
            },
            Metric::RougeN(n) => {
                let rouge = metrics::rouge_n(input, reference, n);
                (
                    rouge.fmeasure,
                    vec![
                        (self.metric.name(), rouge.fmeasure),
                        ("precision", rouge.precision),
                        ("recall", rouge.recall),
                    ],
                )
            }
        };
        Ok(Measured { score, components })
    }
}

impl VerifierPlugin for TextSimilarity {
    fn metadata() -> Metadata {
        Metadata {
            name: "text-similarity",
            version: env!("CARGO_PKG_VERSION"),
            description: "fuzzy ratio, sentence BLEU, ROUGE-N or ROUGE-L between two templates, passed at a threshold",
        }
    }

    fn reference_schema() -> &'static str {
        r#"{"answer": "<text>"} — or any fields the reference template reads as {{item.reference.PATH}}"#
    }

    fn from_config(config_json: &str) -> Result<Self, PluginError> {
        TextSimilarity::parse(config_json).map_err(Into::into)
    }

    fn check_options(config_json: &str) -> Result<OptionsReport, OptionError> {
        TextSimilarity::parse(config_json).map(|_| OptionsReport::default())
    }

    fn verify(&self, item: &VerifyItem<'_>) -> Result<Verdict, PluginError> {
        let (input, reference) = match self.texts(item) {
            Ok(texts) => texts,
            Err(message) => return Ok(Verdict::error(message)),
        };
        let Measured { score, components } = match self.measure(&input, &reference) {
            Ok(measured) => measured,
            Err(message) => return Ok(Verdict::timeout(message)),
        };
        let passed = score >= self.pass_threshold;
        let mut verdict = Verdict::new(score, passed);
        for (name, value) in components {
            verdict = verdict.component(name, value);
        }
        if item.explain {
            verdict = verdict
                .explain(format!("input: {input:?}"))
                .explain(format!("reference: {reference:?}"))
                .explain(format!(
                    "{} = {score} {} pass_threshold {}",
                    self.metric.name(),
                    if passed { ">=" } else { "<" },
                    self.pass_threshold
                ));
        }
        Ok(verdict.extracted(input))
    }

    fn self_test() -> Result<(), PluginError> {
        let cases = [
            (r#"{"metric": "fuzzy_match", "pass_threshold": 0.9}"#, "this is a test", 1.0),
            (r#"{"metric": "bleu", "pass_threshold": 0.5}"#, "this is a test", 1.0),
            (r#"{"metric": "rouge_l", "pass_threshold": 0.5}"#, "a test this is", 0.5),
        ];
        for (options, completion, expected) in cases {
            let grader = TextSimilarity::from_config(options)?;
            rlvr_plugin_api::check_known_answers(
                &grader,
                &[(completion, r#"{"answer": "this is a test"}"#, expected)],
            )?;
        }
        Ok(())
    }
}

export_verifier!(TextSimilarity);

#[cfg(test)]
mod tests {
    use rlvr_plugin_api::options::assert_answers;
    use serde_json::{Value, json};

    use super::*;

    /// Options and what checking them answers: accepted, or refused at (key, message).
    type OptionsCase<'a> = (&'a str, Result<(), (&'a str, &'a str)>);

    fn verdict(options: Value, completion: &str, reference: Value) -> Verdict {
        let grader = TextSimilarity::from_config(&options.to_string())
            .unwrap_or_else(|error| panic!("{options}: {error}"));
        grader.verify(&VerifyItem::new("i", "p", completion, &reference.to_string())).unwrap()
    }

    fn components(verdict: &Verdict) -> Vec<(String, f64)> {
        verdict.components.iter().map(|c| (c.name.to_string(), c.value)).collect()
    }

    #[test]
    fn passed_is_score_at_or_above_the_threshold() {
        // fuzz.ratio("kitten", "sitting") = 1 - 5/13 (Indel: 3 deletions + ... over 13 chars).
        let ratio = metrics::fuzzy_ratio("kitten", "sitting");
        // (metric, threshold, completion, answer, score, passed)
        let cases: &[(&str, f64, &str, &str, f64, bool)] = &[
            ("fuzzy_match", 0.0, "kitten", "sitting", ratio, true),
            ("fuzzy_match", ratio, "kitten", "sitting", ratio, true),
            ("fuzzy_match", ratio + 1e-9, "kitten", "sitting", ratio, false),
            ("fuzzy_match", 1.0, "same", "same", 1.0, true),
            ("bleu", 1.0, "the cat sat on the mat", "the cat sat on the mat", 1.0, true),
            ("bleu", 0.01, "dog", "the cat sat on the mat", 0.0, false),
            ("bleu", 0.0, "dog", "the cat sat on the mat", 0.0, true),
            ("rouge_l", 0.5, "the cat", "the cat sat on", 2.0 / 3.0, true),
            ("rouge_l", 0.7, "the cat", "the cat sat on", 2.0 / 3.0, false),
            ("rouge_2", 0.5, "the cat sat", "the cat sat on the mat", 0.5714285714285715, true),
            ("rouge_5", 0.5, "the cat sat", "the cat sat on the mat", 0.0, false),
        ];
        for (metric, threshold, completion, answer, score, passed) in cases {
            let got = verdict(
                json!({"metric": metric, "pass_threshold": threshold}),
                completion,
                json!({"answer": answer}),
            );
            assert!((got.score - score).abs() < 1e-12, "{metric} {completion:?}: {} vs {score}", got.score);
            assert_eq!(got.passed, *passed, "{metric} {threshold} {completion:?}");
            assert_eq!(got.extracted.as_ref().map(|text| text.as_str()).into_option(), Some(*completion));
            assert!(got.error.is_none());
        }
    }

    #[test]
    fn each_metric_reports_its_parts() {
        let fuzzy = verdict(
            json!({"metric": "fuzzy_match", "pass_threshold": 0.5}),
            "abcd",
            json!({"answer": "abce"}),
        );
        assert_eq!(components(&fuzzy), [("fuzzy_match".to_owned(), 0.75)]);
        let bleu = verdict(
            json!({"metric": "bleu", "pass_threshold": 0.5}),
            "a b c d",
            json!({"answer": "a b c d e"}),
        );
        let names: Vec<String> = components(&bleu).into_iter().map(|(name, _)| name).collect();
        assert_eq!(
            names,
            ["bleu", "precision_1", "precision_2", "precision_3", "precision_4", "brevity_penalty"]
        );
        assert_eq!(components(&bleu)[1].1, 1.0);
        assert!((components(&bleu)[5].1 - (1.0f64 - 5.0 / 4.0).exp()).abs() < 1e-15);
        let rouge =
            verdict(json!({"metric": "rouge_l", "pass_threshold": 0.5}), "a b", json!({"answer": "a b c d"}));
        assert_eq!(
            components(&rouge),
            [("rouge_l".to_owned(), 2.0 / 3.0), ("precision".to_owned(), 1.0), ("recall".to_owned(), 0.5)]
        );
    }

    #[test]
    fn a_render_failure_or_too_much_work_is_an_error_verdict() {
        let missing = verdict(json!({"metric": "bleu", "pass_threshold": 0.5}), "x", json!({"gold": "x"}));
        assert_eq!(
            missing.error.as_ref().map(|text| text.as_str()).into_option(),
            Some(
                r#"reference: item.reference.answer: not found in the item (item.reference has no key "answer")"#
            )
        );
        assert_eq!((missing.score, missing.passed), (0.0, false));
        let long = "w ".repeat(9000);
        let slow =
            verdict(json!({"metric": "rouge_l", "pass_threshold": 0.5}), &long, json!({"answer": long}));
        assert!(slow.timed_out, "{slow:?}");
        assert!(
            slow.error
                .as_ref()
                .into_option()
                .is_some_and(|text| text.starts_with("rouge_l: 9000 input tokens × 9000 reference tokens"))
        );
        // regression: a fuzzy_match of two 450 KB texts ran past the 30 s deadline in the daemon
        let huge = "ab".repeat(225_000);
        let fuzzy =
            verdict(json!({"metric": "fuzzy_match", "pass_threshold": 0.5}), &huge, json!({"answer": huge}));
        assert!(fuzzy.timed_out, "{fuzzy:?}");
        assert!(
            fuzzy
                .error
                .as_ref()
                .into_option()
                .is_some_and(|text| text
                    .starts_with("fuzzy_match: 450000 input characters × 450000 reference characters")),
            "{fuzzy:?}"
        );
    }

    #[test]
    fn options_are_checked_naming_the_key() {
        let cases: &[OptionsCase] = &[
            (r#"{"metric": "bleu", "pass_threshold": 0.3}"#, Ok(())),
            (
                r#"{"metric": "rouge_l", "pass_threshold": 0, "input": "{{sample}}", "reference": "{{item.prompt}}"}"#,
                Ok(()),
            ),
            (r#"{"metric": "fuzzy_match", "pass_threshold": 1}"#, Ok(())),
            (r#"{"pass_threshold": 0.5}"#, Err(("metric", "missing; this key is required"))),
            (r#"{"metric": "bleu"}"#, Err(("pass_threshold", "missing; this key is required"))),
            (
                r#"{"metric": "bleu", "pass_threshold": 1.5}"#,
                Err(("pass_threshold", "expected a number from 0 to 1, got 1.5")),
            ),
            (
                r#"{"metric": "bleu", "pass_threshold": -0.1}"#,
                Err(("pass_threshold", "expected a number from 0 to 1, got -0.1")),
            ),
            (
                r#"{"metric": "bleu", "pass_threshold": "high"}"#,
                Err(("pass_threshold", r#"expected f64, got string "high""#)),
            ),
            (
                r#"{"metric": "cosine", "pass_threshold": 0.5}"#,
                Err((
                    "metric",
                    r#"expected one of fuzzy_match, bleu, rouge_1, rouge_2, rouge_3, rouge_4, rouge_5, rouge_l, got "cosine""#,
                )),
            ),
            (r#"{"metric": "rouge_2", "pass_threshold": 0.5}"#, Ok(())),
            (
                r#"{"metric": "rouge_6", "pass_threshold": 0.5}"#,
                Err((
                    "metric",
                    r#"expected one of fuzzy_match, bleu, rouge_1, rouge_2, rouge_3, rouge_4, rouge_5, rouge_l, got "rouge_6""#,
                )),
            ),
            (
                r#"{"metric": "meteor", "pass_threshold": 0.5}"#,
                Err((
                    "metric",
                    "meteor is not offered: its synonym stage needs WordNet data, which is not packaged where this project installs from, and a METEOR without it would not match the reference; expected one of fuzzy_match, bleu, rouge_1, rouge_2, rouge_3, rouge_4, rouge_5, rouge_l",
                )),
            ),
            (
                r#"{"metric": "bleu", "pass_threshold": 0.5, "evaluation_metric": "bleu"}"#,
                Err((
                    "evaluation_metric",
                    "unknown key; expected one of input, reference, metric, pass_threshold",
                )),
            ),
            (
                r#"{"metric": "bleu", "pass_threshold": 0.5, "input": "{{ output }}"}"#,
                Err((
                    "input",
                    "unknown placeholder `output` at byte 0; expected {{sample}} or {{item.PATH}}",
                )),
            ),
        ];
        for (json, expected) in cases {
            let created = TextSimilarity::from_config(json)
                .map(|_| OptionsReport::default())
                .map_err(OptionError::from);
            assert_answers(json, [TextSimilarity::check_options(json), created], *expected);
        }
    }

    #[test]
    fn the_self_test_passes() {
        TextSimilarity::self_test().unwrap();
    }
}
