//! The `reference` object of an IFEval item, read into typed instructions with every kwarg checked.
//!
//! Where the reference implementation's `build_description` draws a random value for a missing or
//! out-of-range kwarg, this is an error naming the kwarg instead: a verdict must not depend on a
//! dice roll. Keys whose value is `null` are ignored, as `lm-eval` does, so rows of the Hugging
//! Face `google/IFEval` dataset (which carry every key, mostly `null`) are read as they are.

use regex::{Regex, RegexBuilder};
use serde::Deserialize;
use serde_json::{Map, Value};

use crate::lang;
use crate::pytext::{SPACE_CLASS, strip};

/// The 25 instruction ids of Google's `instructions_registry.INSTRUCTION_DICT`.
pub const INSTRUCTION_IDS: [&str; 25] = [
    "keywords:existence",
    "keywords:frequency",
    "keywords:forbidden_words",
    "keywords:letter_frequency",
    "language:response_language",
    "length_constraints:number_sentences",
    "length_constraints:number_paragraphs",
    "length_constraints:number_words",
    "length_constraints:nth_paragraph_first_word",
    "detectable_content:number_placeholders",
    "detectable_content:postscript",
    "detectable_format:number_bullet_lists",
    "detectable_format:constrained_response",
    "detectable_format:number_highlighted_sections",
    "detectable_format:multiple_sections",
    "detectable_format:json_format",
    "detectable_format:title",
    "combination:two_responses",
    "combination:repeat_prompt",
    "startend:end_checker",
    "change_case:capital_word_frequency",
    "change_case:english_capital",
    "change_case:english_lowercase",
    "punctuation:no_comma",
    "startend:quotation",
];

/// `less than` or `at least`, the two relations of `_COMPARISON_RELATION`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Relation {
    /// `actual < threshold`.
    LessThan,
    /// `actual >= threshold`.
    AtLeast,
}

impl Relation {
    /// Whether `actual` satisfies the relation to `threshold`.
    pub fn holds(self, actual: usize, threshold: u64) -> bool {
        let actual = actual as u64;
        match self {
            Relation::LessThan => actual < threshold,
            Relation::AtLeast => actual >= threshold,
        }
    }

    /// The relation as the reference spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            Relation::LessThan => "less than",
            Relation::AtLeast => "at least",
        }
    }
}

/// A pattern the reference builds by pasting a kwarg into a Python regex, kept with its source.
#[derive(Debug, Clone)]
pub struct Pattern {
    /// The kwarg as given (after the reference's own stripping).
    pub source: String,
    /// The compiled regex.
    pub regex: Regex,
}

/// One instruction with its kwargs, ready to check.
#[derive(Debug, Clone)]
pub enum Instruction {
    KeywordsExistence { keywords: Vec<Pattern> },
    KeywordsFrequency { keyword: Pattern, frequency: u64, relation: Relation },
    ForbiddenWords { words: Vec<Pattern> },
    LetterFrequency { letter: String, frequency: u64, relation: Relation },
    ResponseLanguage { language: String },
    NumberSentences { num_sentences: u64, relation: Relation },
    NumberParagraphs { num_paragraphs: u64 },
    NumberWords { num_words: u64, relation: Relation },
    NthParagraphFirstWord { num_paragraphs: u64, nth_paragraph: u64, first_word: String },
    NumberPlaceholders { num_placeholders: u64 },
    Postscript { marker: String, pattern: Regex },
    NumberBulletLists { num_bullets: u64 },
    ConstrainedResponse,
    NumberHighlightedSections { num_highlights: u64 },
    MultipleSections { splitter: Pattern, num_sections: u64 },
    JsonFormat,
    Title,
    TwoResponses,
    RepeatPrompt { prompt_to_repeat: String },
    EndChecker { end_phrase: String },
    CapitalWordFrequency { capital_frequency: u64, capital_relation: Relation },
    EnglishCapital,
    EnglishLowercase,
    NoComma,
    Quotation,
}

/// An instruction of an item: its component name and the parsed kwargs.
#[derive(Debug, Clone)]
pub struct Entry {
    /// The component name: the id, or `<index>:<id>` when the id occurs more than once.
    pub name: String,
    /// What to check.
    pub instruction: Instruction,
}

/// The wire shape of `reference`. `key` and `prompt` are accepted (and ignored) so that a
/// dataset row can be passed as the reference unchanged.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawReference {
    instruction_id_list: Vec<String>,
    kwargs: Vec<Option<Map<String, Value>>>,
    #[serde(default, rename = "key")]
    _key: Option<Value>,
    #[serde(default, rename = "prompt")]
    _prompt: Option<Value>,
}

/// Longest regex the reference's kwargs may compile to; bounds the work one item can cause.
const REGEX_SIZE_LIMIT: usize = 1 << 20;

/// Reads `reference_json` into the item's instructions, in order.
pub fn parse(reference_json: &str) -> Result<Vec<Entry>, String> {
    let raw: RawReference = serde_json::from_str(reference_json).map_err(|error| {
        format!("reference: expected {{\"instruction_id_list\": [...], \"kwargs\": [{{...}}, ...]}}: {error}")
    })?;
    if raw.instruction_id_list.is_empty() {
        return Err("reference.instruction_id_list: expected at least one instruction id".into());
    }
    if raw.kwargs.len() != raw.instruction_id_list.len() {
        return Err(format!(
            "reference.kwargs: expected one object per instruction ({}), got {}",
            raw.instruction_id_list.len(),
            raw.kwargs.len()
        ));
    }
    let ids = &raw.instruction_id_list;
    let mut entries = Vec::with_capacity(ids.len());
    for (index, (id, kwargs)) in ids.iter().zip(raw.kwargs).enumerate() {
        let duplicate = ids.iter().filter(|other| *other == id).count() > 1;
        let name = if duplicate { format!("{index}:{id}") } else { id.clone() };
        let mut args = Kwargs::new(index, id, kwargs.unwrap_or_default());
        let instruction = build(id, &mut args)?;
        args.finish()?;
        entries.push(Entry { name, instruction });
    }
    Ok(entries)
}

/// The kwargs object of one instruction, consumed key by key so leftovers can be reported.
struct Kwargs<'a> {
    index: usize,
    id: &'a str,
    map: Map<String, Value>,
}

impl<'a> Kwargs<'a> {
    fn new(index: usize, id: &'a str, mut map: Map<String, Value>) -> Self {
        map.retain(|_, value| !value.is_null());
        Kwargs { index, id, map }
    }

    fn field(&self, key: &str) -> String {
        format!("reference.kwargs[{}].{key} ({})", self.index, self.id)
    }

    fn take(&mut self, key: &str) -> Result<Value, String> {
        self.map.remove(key).ok_or_else(|| format!("{}: missing; expected a value", self.field(key)))
    }

    fn count(&mut self, key: &str) -> Result<u64, String> {
        let value = self.take(key)?;
        let number = match &value {
            Value::Number(number) => number.as_u64().or_else(|| {
                number.as_f64().filter(|f| f.fract() == 0.0 && *f >= 0.0 && *f < 1e15).map(|f| f as u64)
            }),
            _ => None,
        };
        number.ok_or_else(|| format!("{}: expected a non-negative integer, got {value}", self.field(key)))
    }

    fn text(&mut self, key: &str) -> Result<String, String> {
        match self.take(key)? {
            Value::String(text) => Ok(text),
            other => Err(format!("{}: expected a string, got {other}", self.field(key))),
        }
    }

    /// A string the reference `.strip()`s, which must not be empty after that.
    fn stripped_text(&mut self, key: &str) -> Result<String, String> {
        let text = self.text(key)?;
        let stripped = strip(&text);
        if stripped.is_empty() {
            return Err(format!("{}: expected a non-empty string, got {text:?}", self.field(key)));
        }
        Ok(stripped.to_owned())
    }

    fn texts(&mut self, key: &str) -> Result<Vec<String>, String> {
        let items = match self.take(key)? {
            Value::Array(items) if !items.is_empty() => items,
            other => {
                return Err(format!(
                    "{}: expected a non-empty list of strings, got {other}",
                    self.field(key)
                ));
            }
        };
        items
            .into_iter()
            .enumerate()
            .map(|(i, item)| match item {
                Value::String(text) => Ok(text),
                other => {
                    Err(format!("{}: expected a string, got {other}", self.field(&format!("{key}[{i}]"))))
                }
            })
            .collect()
    }

    fn relation(&mut self, key: &str) -> Result<Relation, String> {
        match self.text(key)?.as_str() {
            "less than" => Ok(Relation::LessThan),
            "at least" => Ok(Relation::AtLeast),
            other => {
                Err(format!("{}: expected \"less than\" or \"at least\", got {other:?}", self.field(key)))
            }
        }
    }

    /// Compiles a pattern the reference builds as `prefix + kwarg + suffix` for Python's `re`.
    fn pattern(
        &self,
        key: &str,
        source: &str,
        prefix: &str,
        suffix: &str,
        ignore_case: bool,
    ) -> Result<Regex, String> {
        RegexBuilder::new(&format!("{prefix}{source}{suffix}"))
            .case_insensitive(ignore_case)
            .size_limit(REGEX_SIZE_LIMIT)
            .build()
            .map_err(|error| {
                let error = error.to_string();
                let reason = error.lines().last().unwrap_or("invalid");
                format!(
                    "{}: {source:?} does not compile as a regular expression (the reference matches it as a \
                     Python regex): {reason}",
                    self.field(key)
                )
            })
    }

    fn finish(self) -> Result<(), String> {
        let Some(key) = self.map.keys().next() else { return Ok(()) };
        let field = self.field(key);
        Err(format!("{field}: unknown kwarg for this instruction (a null value is ignored)"))
    }
}

fn build(id: &str, args: &mut Kwargs<'_>) -> Result<Instruction, String> {
    let space = SPACE_CLASS;
    Ok(match id {
        "keywords:existence" => {
            let keywords = args
                .texts("keywords")?
                .into_iter()
                .enumerate()
                .map(|(i, source)| {
                    let regex = args.pattern(&format!("keywords[{i}]"), &source, "", "", true)?;
                    Ok(Pattern { source, regex })
                })
                .collect::<Result<_, String>>()?;
            Instruction::KeywordsExistence { keywords }
        }
        "keywords:frequency" => {
            let source = args.stripped_text("keyword")?;
            let regex = args.pattern("keyword", &source, "", "", true)?;
            Instruction::KeywordsFrequency {
                keyword: Pattern { source, regex },
                frequency: args.count("frequency")?,
                relation: args.relation("relation")?,
            }
        }
        "keywords:forbidden_words" => {
            let words = args
                .texts("forbidden_words")?
                .into_iter()
                .enumerate()
                .map(|(i, source)| {
                    // `r"\b" + word + r"\b"`: pasted without a group, as the reference does.
                    let regex =
                        args.pattern(&format!("forbidden_words[{i}]"), &source, r"\b", r"\b", true)?;
                    Ok(Pattern { source, regex })
                })
                .collect::<Result<_, String>>()?;
            Instruction::ForbiddenWords { words }
        }
        "keywords:letter_frequency" => {
            let letter = args.text("letter")?;
            let mut chars = letter.chars();
            let single = matches!((chars.next(), chars.next()), (Some(c), None) if !c.is_whitespace());
            if !single {
                return Err(format!("{}: expected a single letter, got {letter:?}", args.field("letter")));
            }
            Instruction::LetterFrequency {
                letter: letter.to_lowercase(),
                frequency: args.count("let_frequency")?,
                relation: args.relation("let_relation")?,
            }
        }
        "language:response_language" => {
            let language = args.text("language")?;
            lang::check_code(&language).map_err(|reason| format!("{}: {reason}", args.field("language")))?;
            Instruction::ResponseLanguage { language }
        }
        "length_constraints:number_sentences" => Instruction::NumberSentences {
            num_sentences: args.count("num_sentences")?,
            relation: args.relation("relation")?,
        },
        "length_constraints:number_paragraphs" => {
            Instruction::NumberParagraphs { num_paragraphs: args.count("num_paragraphs")? }
        }
        "length_constraints:number_words" => Instruction::NumberWords {
            num_words: args.count("num_words")?,
            relation: args.relation("relation")?,
        },
        "length_constraints:nth_paragraph_first_word" => {
            let num_paragraphs = args.count("num_paragraphs")?;
            let nth_paragraph = args.count("nth_paragraph")?;
            if nth_paragraph == 0 || nth_paragraph > num_paragraphs {
                return Err(format!(
                    "{}: expected 1 to num_paragraphs ({num_paragraphs}), got {nth_paragraph}",
                    args.field("nth_paragraph")
                ));
            }
            let first_word = args.text("first_word")?.to_lowercase();
            Instruction::NthParagraphFirstWord { num_paragraphs, nth_paragraph, first_word }
        }
        "detectable_content:number_placeholders" => {
            Instruction::NumberPlaceholders { num_placeholders: args.count("num_placeholders")? }
        }
        "detectable_content:postscript" => {
            let marker = args.stripped_text("postscript_marker")?;
            let source = match marker.as_str() {
                "P.P.S" => format!(r"{space}*p\.{space}?p\.{space}?s.*$"),
                "P.S." => format!(r"{space}*p\.{space}?s\..*$"),
                other => format!(r"{space}*{}.*$", other.to_lowercase()),
            };
            let pattern = args.pattern("postscript_marker", &source, "(?m)", "", false)?;
            Instruction::Postscript { marker, pattern }
        }
        "detectable_format:number_bullet_lists" => {
            Instruction::NumberBulletLists { num_bullets: args.count("num_bullets")? }
        }
        "detectable_format:constrained_response" => Instruction::ConstrainedResponse,
        "detectable_format:number_highlighted_sections" => {
            Instruction::NumberHighlightedSections { num_highlights: args.count("num_highlights")? }
        }
        "detectable_format:multiple_sections" => {
            let source = args.stripped_text("section_spliter")?;
            let regex = args.pattern(
                "section_spliter",
                &source,
                &format!("{space}?"),
                &format!(r"{space}?\d+{space}?"),
                false,
            )?;
            Instruction::MultipleSections {
                splitter: Pattern { source, regex },
                num_sections: args.count("num_sections")?,
            }
        }
        "detectable_format:json_format" => Instruction::JsonFormat,
        "detectable_format:title" => Instruction::Title,
        "combination:two_responses" => Instruction::TwoResponses,
        "combination:repeat_prompt" => {
            let prompt_to_repeat = args.text("prompt_to_repeat")?;
            if prompt_to_repeat.is_empty() {
                return Err(format!("{}: expected a non-empty string", args.field("prompt_to_repeat")));
            }
            Instruction::RepeatPrompt { prompt_to_repeat }
        }
        "startend:end_checker" => Instruction::EndChecker { end_phrase: args.stripped_text("end_phrase")? },
        "change_case:capital_word_frequency" => Instruction::CapitalWordFrequency {
            capital_frequency: args.count("capital_frequency")?,
            capital_relation: args.relation("capital_relation")?,
        },
        "change_case:english_capital" => Instruction::EnglishCapital,
        "change_case:english_lowercase" => Instruction::EnglishLowercase,
        "punctuation:no_comma" => Instruction::NoComma,
        "startend:quotation" => Instruction::Quotation,
        other => {
            return Err(format!(
                "reference.instruction_id_list[{}]: unknown instruction id {other:?}; expected one of the 25 IFEval \
                 ids, e.g. \"keywords:existence\"",
                args.index
            ));
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `Ok(component names)` or `Err(error)`.
    fn check(reference: &str, expected: Result<&[&str], &str>) {
        let got =
            parse(reference).map(|entries| entries.into_iter().map(|entry| entry.name).collect::<Vec<_>>());
        match (got, expected) {
            (Ok(names), Ok(expected)) => assert_eq!(names, expected, "{reference}"),
            (Err(error), Err(expected)) => assert!(error.contains(expected), "{reference}: {error}"),
            (got, expected) => panic!("{reference}: got {got:?}, expected {expected:?}"),
        }
    }

    #[test]
    fn references() {
        let cases: &[(&str, Result<&[&str], &str>)] = &[
            (
                r#"{"instruction_id_list": ["punctuation:no_comma", "detectable_format:title"], "kwargs": [{}, {}]}"#,
                Ok(&["punctuation:no_comma", "detectable_format:title"]),
            ),
            // Duplicate ids are told apart by index.
            (
                r#"{"instruction_id_list": ["keywords:existence", "punctuation:no_comma", "keywords:existence"],
                    "kwargs": [{"keywords": ["a"]}, {}, {"keywords": ["b"]}]}"#,
                Ok(&["0:keywords:existence", "punctuation:no_comma", "2:keywords:existence"]),
            ),
            // A dataset row: key, prompt, null kwargs and null-valued keys.
            (
                r#"{"key": 1000, "prompt": "p", "instruction_id_list": ["startend:quotation", "length_constraints:number_words"],
                    "kwargs": [null, {"num_words": 300, "relation": "less than", "keyword": null, "language": null}]}"#,
                Ok(&["startend:quotation", "length_constraints:number_words"]),
            ),
            (r#"{"instruction_id_list": [], "kwargs": []}"#, Err("expected at least one instruction id")),
            (r#"{"instruction_id_list": ["punctuation:no_comma"]}"#, Err("missing field `kwargs`")),
            (
                r#"{"instruction_id_list": ["punctuation:no_comma"], "kwargs": []}"#,
                Err("expected one object per instruction (1), got 0"),
            ),
            (
                r#"{"instruction_id_list": ["punctuation:no_comma"], "kwargs": [{}], "extra": 1}"#,
                Err("unknown field `extra`"),
            ),
            (r#"[1, 2]"#, Err("reference: expected {")),
            (
                r#"{"instruction_id_list": ["keywords:existance"], "kwargs": [{}]}"#,
                Err(r#"reference.instruction_id_list[0]: unknown instruction id "keywords:existance""#),
            ),
            (
                r#"{"instruction_id_list": ["length_constraints:number_words"], "kwargs": [{"num_words": 10}]}"#,
                Err("reference.kwargs[0].relation (length_constraints:number_words): missing"),
            ),
            (
                r#"{"instruction_id_list": ["length_constraints:number_words"], "kwargs": [{"num_words": 10, "relation": "at most"}]}"#,
                Err(r#"expected "less than" or "at least", got "at most""#),
            ),
            (
                r#"{"instruction_id_list": ["length_constraints:number_words"], "kwargs": [{"num_words": -1, "relation": "at least"}]}"#,
                Err("num_words (length_constraints:number_words): expected a non-negative integer, got -1"),
            ),
            (
                r#"{"instruction_id_list": ["length_constraints:number_words"], "kwargs": [{"num_words": "10", "relation": "at least"}]}"#,
                Err("expected a non-negative integer, got \"10\""),
            ),
            (
                r#"{"instruction_id_list": ["length_constraints:number_words"], "kwargs": [{"num_words": 10.0, "relation": "at least"}]}"#,
                Ok(&["length_constraints:number_words"]),
            ),
            (
                r#"{"instruction_id_list": ["punctuation:no_comma"], "kwargs": [{"num_words": 10}]}"#,
                Err("reference.kwargs[0].num_words (punctuation:no_comma): unknown kwarg"),
            ),
            (
                r#"{"instruction_id_list": ["keywords:existence"], "kwargs": [{"keywords": []}]}"#,
                Err("keywords (keywords:existence): expected a non-empty list of strings"),
            ),
            (
                r#"{"instruction_id_list": ["keywords:existence"], "kwargs": [{"keywords": ["ok", 3]}]}"#,
                Err("keywords[1] (keywords:existence): expected a string, got 3"),
            ),
            (
                r#"{"instruction_id_list": ["keywords:existence"], "kwargs": [{"keywords": ["f(x"]}]}"#,
                Err(r#"keywords[0] (keywords:existence): "f(x" does not compile as a regular expression"#),
            ),
            (
                r#"{"instruction_id_list": ["keywords:letter_frequency"], "kwargs": [{"letter": "ab", "let_frequency": 2, "let_relation": "at least"}]}"#,
                Err(r#"letter (keywords:letter_frequency): expected a single letter, got "ab""#),
            ),
            (
                r#"{"instruction_id_list": ["language:response_language"], "kwargs": [{"language": "sw"}]}"#,
                Err("cannot identify"),
            ),
            (
                r#"{"instruction_id_list": ["length_constraints:nth_paragraph_first_word"], "kwargs": [{"num_paragraphs": 2, "nth_paragraph": 3, "first_word": "x"}]}"#,
                Err(
                    "nth_paragraph (length_constraints:nth_paragraph_first_word): expected 1 to num_paragraphs (2), got 3",
                ),
            ),
            (
                r#"{"instruction_id_list": ["startend:end_checker"], "kwargs": [{"end_phrase": "  "}]}"#,
                Err("end_phrase (startend:end_checker): expected a non-empty string"),
            ),
            (
                r#"{"instruction_id_list": ["detectable_content:postscript"], "kwargs": [{}]}"#,
                Err("postscript_marker (detectable_content:postscript): missing"),
            ),
        ];
        for (reference, expected) in cases {
            check(reference, *expected);
        }
    }

    #[test]
    fn every_id_is_known() {
        for id in INSTRUCTION_IDS {
            let error = parse(&format!(r#"{{"instruction_id_list": ["{id}"], "kwargs": [{{}}]}}"#)).err();
            assert!(
                !error.as_deref().unwrap_or_default().contains("unknown instruction id"),
                "{id}: {error:?}"
            );
        }
    }
}
