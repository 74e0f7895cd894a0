//! `string-check`: OpenAI's `string_check` grader — `eq`, `ne`, `like` (contains) or `ilike`
//! (contains, ignoring case) between an `input` template and a `reference` template.
//!
//! Both templates are read when the options are checked (`rlvr_grader_common::Template`), so a
//! bad template is refused at submit, naming the key. Per item both are rendered; a path that is
//! not in the item is an error verdict naming the key and the path — never a silent 0, which
//! would train the policy against a grader bug.

use rlvr_grader_common::{Template, item_json};
use rlvr_plugin_api::{Metadata, PluginError, Verdict, VerifierPlugin, VerifyItem, export_verifier};

/// The comparison; OpenAI's names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Operation {
    /// The two texts are equal, byte for byte.
    Eq,
    /// The two texts differ.
    Ne,
    /// The input contains the reference (case-sensitive).
    Like,
    /// The input contains the reference once both are lowercased (Unicode lowercase mapping,
    /// `str::to_lowercase`, as Python's `str.lower`).
    Ilike,
}

impl Operation {
    /// Whether `input` and `reference` satisfy the operation.
    pub fn holds(self, input: &str, reference: &str) -> bool {
        match self {
            Operation::Eq => input == reference,
            Operation::Ne => input != reference,
            Operation::Like => input.contains(reference),
            Operation::Ilike => input.to_lowercase().contains(&reference.to_lowercase()),
        }
    }

    fn name(self) -> &'static str {
        match self {
            Operation::Eq => "eq",
            Operation::Ne => "ne",
            Operation::Like => "like",
            Operation::Ilike => "ilike",
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
    operation: Operation,
    /// Strip leading and trailing whitespace from both rendered texts before comparing. Off by
    /// default, as in OpenAI's grader: a trailing newline then makes `eq` fail, which is what a
    /// team asking for exact equality asked for.
    #[serde(default)]
    trim: bool,
}

/// What `input` is when the options do not say: the completion.
pub const DEFAULT_INPUT: &str = "{{sample}}";
/// What `reference` is when the options do not say: the batch format's gold answer.
pub const DEFAULT_REFERENCE: &str = "{{item.reference.answer}}";

/// `template`, or the default `text` when the options gave none.
fn or_default(template: Option<Template>, key: &str, text: &str) -> Result<Template, PluginError> {
    match template {
        Some(template) => Ok(template),
        None => Template::parse(text)
            .map_err(|error| PluginError::internal(format!("{key}: default {text:?}: {error}"))),
    }
}

/// The `string-check` grader, built from its options.
#[derive(Debug)]
pub struct StringCheck {
    input: Template,
    reference: Template,
    operation: Operation,
    trim: bool,
}

impl StringCheck {
    /// The rendered input and reference for one item, trimmed when `trim` is set; an error names
    /// the key whose template failed.
    fn texts(&self, item: &VerifyItem<'_>) -> Result<(String, String), String> {
        let item_value = item_json(item).map_err(|error| error.to_string())?;
        let sample = item.completion.as_str();
        let input = self.input.render(sample, &item_value).map_err(|error| format!("input: {error}"))?;
        let reference =
            self.reference.render(sample, &item_value).map_err(|error| format!("reference: {error}"))?;
        if self.trim {
            Ok((input.trim().to_owned(), reference.trim().to_owned()))
        } else {
            Ok((input, reference))
        }
    }
}

impl VerifierPlugin for StringCheck {
    fn metadata() -> Metadata {
        Metadata {
            name: "string-check",
            version: env!("CARGO_PKG_VERSION"),
            description: "eq, ne, like or ilike between two templates of the completion and the item",
        }
    }

    fn reference_schema() -> &'static str {
        r#"{"answer": "<text>"} — or any fields the reference template reads as {{item.reference.PATH}}"#
    }

    fn from_config(config_json: &str) -> Result<Self, PluginError> {
        let options: Options = rlvr_plugin_api::parse_options(config_json)?;
        Ok(StringCheck {
            input: or_default(options.input, "input", DEFAULT_INPUT)?,
            reference: or_default(options.reference, "reference", DEFAULT_REFERENCE)?,
            operation: options.operation,
            trim: options.trim,
        })
    }

    fn verify(&self, item: &VerifyItem<'_>) -> Result<Verdict, PluginError> {
        let (input, reference) = match self.texts(item) {
            Ok(texts) => texts,
            Err(message) => return Ok(Verdict::error(message)),
        };
        let passed = self.operation.holds(&input, &reference);
        let mut verdict = Verdict::new(if passed { 1.0 } else { 0.0 }, passed);
        if item.explain {
            verdict = verdict
                .explain(format!("input: {input:?}"))
                .explain(format!("reference: {reference:?}"))
                .explain(format!(
                    "{}: {}",
                    self.operation.name(),
                    if passed { "holds" } else { "does not hold" }
                ));
        }
        Ok(verdict.extracted(input))
    }

    fn self_test() -> Result<(), PluginError> {
        for (options, cases) in [
            (
                r#"{"operation": "eq"}"#,
                &[("Paris", r#"{"answer": "Paris"}"#, 1.0), ("paris", r#"{"answer": "Paris"}"#, 0.0)][..],
            ),
            (
                r#"{"operation": "ilike"}"#,
                &[("It is PARIS.", r#"{"answer": "paris"}"#, 1.0), ("Lyon", r#"{"answer": "paris"}"#, 0.0)][..],
            ),
        ] {
            rlvr_plugin_api::check_known_answers(&StringCheck::from_config(options)?, cases)?;
        }
        Ok(())
    }
}

export_verifier!(StringCheck);

#[cfg(test)]
mod tests {
    use rlvr_plugin_api::options::assert_answers;
    use rlvr_plugin_api::{OptionError, OptionsReport};
    use serde_json::{Value, json};

    use super::*;

    /// (options, completion, reference, passed, extracted, error).
    type Case<'a> = (Value, &'a str, Value, bool, Option<&'a str>, Option<&'a str>);
    /// Options and what checking them answers: accepted, or refused at (key, message).
    type OptionsCase<'a> = (&'a str, Result<(), (&'a str, &'a str)>);

    /// Verifies `completion` against `reference` with `options`; (score, passed, extracted, error).
    fn run(options: &str, completion: &str, reference: Value) -> (f64, bool, Option<String>, Option<String>) {
        let grader = StringCheck::from_config(options).unwrap_or_else(|error| panic!("{options}: {error}"));
        let reference = reference.to_string();
        let verdict =
            grader.verify(&VerifyItem::new("i", "What is the capital?", completion, &reference)).unwrap();
        (
            verdict.score,
            verdict.passed,
            verdict.extracted.into_option().map(String::from),
            verdict.error.into_option().map(String::from),
        )
    }

    #[test]
    fn each_operation_compares_as_documented() {
        let answer = |text: &str| json!({"answer": text});
        // (operation, completion, answer, passed)
        let cases: &[(&str, &str, &str, bool)] = &[
            ("eq", "Paris", "Paris", true),
            ("eq", "Paris ", "Paris", false),
            ("eq", "paris", "Paris", false),
            ("eq", "", "", true),
            ("eq", "café", "cafe\u{301}", false), // no Unicode normalization: NFC vs NFD differ
            ("ne", "Paris", "Paris", false),
            ("ne", "Lyon", "Paris", true),
            ("ne", "Paris\n", "Paris", true),
            ("like", "The capital is Paris.", "Paris", true),
            ("like", "The capital is paris.", "Paris", false),
            ("like", "Par is", "Paris", false),
            ("like", "anything", "", true), // an empty reference is in every input, as Python's `in`
            ("like", "", "x", false),
            ("ilike", "The capital is PARIS.", "paris", true),
            ("ilike", "ÉCOLE normale", "école", true),
            // A final capital sigma lowercases to ς, as Python's `str.lower` does.
            ("ilike", "ΟΔΟΣ", "οδος", true),
            ("ilike", "ΟΔΟΣ", "οδοσ", false),
            ("ilike", "STRASSE", "straße", false), // lowercase, not case folding
            ("ilike", "İstanbul", "i̇stanbul", true), // U+0130 lowercases to i + combining dot
            ("ilike", "Lyon", "paris", false),
        ];
        for (operation, completion, reference, passed) in cases {
            let options = json!({"operation": operation}).to_string();
            let (score, got, extracted, error) = run(&options, completion, answer(reference));
            assert_eq!(
                (got, score),
                (*passed, if *passed { 1.0 } else { 0.0 }),
                "{operation} {completion:?} {reference:?}"
            );
            assert_eq!(extracted.as_deref(), Some(*completion));
            assert_eq!(error, None);
        }
    }

    #[test]
    fn templates_choose_what_is_compared() {
        // (options, completion, reference, passed, extracted, error)
        let cases: &[Case] = &[
            (
                json!({"operation": "eq", "input": "{{ sample.output_text }}"}),
                "4",
                json!({"answer": "4"}),
                true,
                Some("4"),
                None,
            ),
            // A number in the reference is compared as its JSON text.
            (json!({"operation": "eq"}), "4", json!({"answer": 4}), true, Some("4"), None),
            (
                json!({"operation": "eq", "reference": "{{item.reference.label}}"}),
                "yes",
                json!({"label": "yes"}),
                true,
                Some("yes"),
                None,
            ),
            (
                json!({"operation": "like", "input": "{{item.prompt}} {{sample}}", "reference": "capital? Paris"}),
                "Paris",
                json!({}),
                true,
                Some("What is the capital? Paris"),
                None,
            ),
            (
                json!({"operation": "eq", "input": "<{{sample}}>", "reference": "<{{item.reference.answer}}>"}),
                "a",
                json!({"answer": "a"}),
                true,
                Some("<a>"),
                None,
            ),
            // A path the item lacks is an error verdict naming the key and the path.
            (
                json!({"operation": "eq"}),
                "4",
                json!({"gold": "4"}),
                false,
                None,
                Some(
                    r#"reference: item.reference.answer: not found in the item (item.reference has no key "answer")"#,
                ),
            ),
            (
                json!({"operation": "ne"}),
                "4",
                json!({"answer": null}),
                false,
                None,
                Some("reference: item.reference.answer: is null in the item"),
            ),
            (
                json!({"operation": "eq", "input": "{{item.reference.steps.2}}"}),
                "4",
                json!({"answer": "4", "steps": ["a"]}),
                false,
                None,
                Some(
                    r#"input: item.reference.steps.2: not found in the item (item.reference.steps is an array of 1 and "2" is not an index in it)"#,
                ),
            ),
            // trim: whitespace around both texts goes; inside stays.
            (
                json!({"operation": "eq", "trim": true}),
                "  Paris\n",
                json!({"answer": "Paris "}),
                true,
                Some("Paris"),
                None,
            ),
            (
                json!({"operation": "eq", "trim": true}),
                "Pa ris",
                json!({"answer": "Paris"}),
                false,
                Some("Pa ris"),
                None,
            ),
            (
                json!({"operation": "eq", "trim": false}),
                "Paris\n",
                json!({"answer": "Paris"}),
                false,
                Some("Paris\n"),
                None,
            ),
        ];
        for (options, completion, reference, passed, extracted, error) in cases {
            let got = run(&options.to_string(), completion, reference.clone());
            let expected = (
                if *passed { 1.0 } else { 0.0 },
                *passed,
                extracted.map(str::to_owned),
                error.map(str::to_owned),
            );
            assert_eq!(got, expected, "{options} {completion:?} {reference}");
        }
    }

    #[test]
    fn options_are_checked_naming_the_key() {
        let cases: &[OptionsCase] = &[
            (r#"{"operation": "eq"}"#, Ok(())),
            (r#"{"operation": "ilike", "input": "{{sample}}", "reference": "x", "trim": true}"#, Ok(())),
            ("{}", Err(("operation", "missing; this key is required"))),
            (
                r#"{"operation": "contains"}"#,
                Err(("operation", r#"expected one of eq, ne, like, ilike, got "contains""#)),
            ),
            (
                r#"{"operation": "EQ"}"#,
                Err(("operation", r#"expected one of eq, ne, like, ilike, got "EQ""#)),
            ),
            (
                r#"{"operation": "eq", "opertion": "eq"}"#,
                Err(("opertion", "unknown key; expected one of input, reference, operation, trim")),
            ),
            (
                r#"{"operation": "eq", "input": "{{sample"}"#,
                Err(("input", "unclosed `{{` at byte 0; expected `}}` after it")),
            ),
            (
                r#"{"operation": "eq", "reference": "{{answer}}"}"#,
                Err((
                    "reference",
                    "unknown placeholder `answer` at byte 0; expected {{sample}} or {{item.PATH}}",
                )),
            ),
            (
                r#"{"operation": "eq", "reference": "{{item}}"}"#,
                Err((
                    "reference",
                    "placeholder `item` at byte 0 names no path; expected item.PATH, e.g. item.reference.answer",
                )),
            ),
            (r#"{"operation": "eq", "input": 3}"#, Err(("input", "expected a string, got integer `3`"))),
            (
                r#"{"operation": "eq", "trim": "yes"}"#,
                Err(("trim", r#"expected a boolean, got string "yes""#)),
            ),
        ];
        for (json, expected) in cases {
            let created =
                StringCheck::from_config(json).map(|_| OptionsReport::default()).map_err(OptionError::from);
            assert_answers(json, [StringCheck::check_options(json), created], *expected);
        }
    }

    #[test]
    fn the_self_test_passes_and_explanations_say_what_was_compared() {
        StringCheck::self_test().unwrap();
        let grader = StringCheck::from_config(r#"{"operation": "like"}"#).unwrap();
        let verdict = grader
            .verify(&VerifyItem::new("i", "p", "it is 4", r#"{"answer": "4"}"#).explaining(true))
            .unwrap();
        let lines: Vec<String> = verdict.explanation.iter().map(|line| line.to_string()).collect();
        assert_eq!(lines, [r#"input: "it is 4""#, r#"reference: "4""#, "like: holds"]);
        let quiet = grader.verify(&VerifyItem::new("i", "p", "it is 4", r#"{"answer": "4"}"#)).unwrap();
        assert!(quiet.explanation.is_empty());
    }
}
