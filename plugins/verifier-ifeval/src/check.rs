//! `check_following` of each instruction, and the strict and loose evaluations around it.
//!
//! Each check follows the reference implementation (google-research `instruction_following_eval`,
//! as vendored by `lm-eval`; Apache-2.0): the same regexes, the same case handling, the same
//! counting quirks. Comments mark the quirks that are kept on purpose.

use std::sync::OnceLock;

use regex::Regex;

use crate::lang;
use crate::pytext::{SPACE_CLASS, WORD_CLASS, is_lower, is_python_json, is_upper, split_whitespace, strip};
use crate::reference::Instruction;
use crate::{punkt, treebank};

/// What a check measured, for the explanation: e.g. `"7 words"`.
pub type Measure = String;

fn regex(cell: &'static OnceLock<Regex>, pattern: impl FnOnce() -> String) -> &'static Regex {
    cell.get_or_init(|| Regex::new(&pattern()).expect("valid check regex"))
}

/// `RegexpTokenizer(r"\w+")` with Python's `\w`.
fn count_words(text: &str) -> usize {
    static RE: OnceLock<Regex> = OnceLock::new();
    regex(&RE, || format!("{WORD_CLASS}+")).find_iter(text).count()
}

/// Whether `value` follows `instruction`, and what was measured.
pub fn follows(instruction: &Instruction, value: &str) -> (bool, Measure) {
    use Instruction::*;
    let space = SPACE_CLASS;
    match instruction {
        KeywordsExistence { keywords } => {
            let missing: Vec<&str> =
                keywords.iter().filter(|k| !k.regex.is_match(value)).map(|k| k.source.as_str()).collect();
            let measure =
                if missing.is_empty() { "all keywords found".into() } else { format!("missing {missing:?}") };
            (missing.is_empty(), measure)
        }
        KeywordsFrequency { keyword, frequency, relation } => {
            let count = keyword.regex.find_iter(value).count();
            (relation.holds(count, *frequency), format!("{:?} found {count} times", keyword.source))
        }
        ForbiddenWords { words } => {
            let found: Vec<&str> =
                words.iter().filter(|w| w.regex.is_match(value)).map(|w| w.source.as_str()).collect();
            let measure =
                if found.is_empty() { "no forbidden word".into() } else { format!("found {found:?}") };
            (found.is_empty(), measure)
        }
        LetterFrequency { letter, frequency, relation } => {
            // `Counter(value.lower())[letter]`: a letter whose lowercase is two characters never
            // counts, as in the reference.
            let count = match letter.chars().collect::<Vec<_>>().as_slice() {
                [c] => value.to_lowercase().chars().filter(|x| x == c).count(),
                _ => 0,
            };
            (relation.holds(count, *frequency), format!("letter {letter:?} appears {count} times"))
        }
        ResponseLanguage { language } => match lang::detect(value) {
            Some(detected) => (detected == language, format!("detected language {detected}")),
            // langdetect raises on a text with nothing to go on; the reference counts that as followed.
            None => (true, "no language detectable (counted as followed)".into()),
        },
        NumberSentences { num_sentences, relation } => {
            let count = punkt::count_sentences(value);
            (
                relation.holds(count, *num_sentences),
                format!("{count} sentences, {} {num_sentences}", relation.as_str()),
            )
        }
        NumberParagraphs { num_paragraphs } => {
            static RE: OnceLock<Regex> = OnceLock::new();
            let splitter = regex(&RE, || format!(r"{space}?\*\*\*{space}?"));
            let paragraphs: Vec<&str> = splitter.split(value).collect();
            let mut count = paragraphs.len();
            for (index, paragraph) in paragraphs.iter().enumerate() {
                if strip(paragraph).is_empty() {
                    if index == 0 || index == paragraphs.len() - 1 {
                        count -= 1;
                    } else {
                        return (false, format!("empty paragraph {} between dividers", index + 1));
                    }
                }
            }
            (count as u64 == *num_paragraphs, format!("{count} paragraphs separated by ***"))
        }
        NumberWords { num_words, relation } => {
            let count = count_words(value);
            (relation.holds(count, *num_words), format!("{count} words, {} {num_words}", relation.as_str()))
        }
        NthParagraphFirstWord { num_paragraphs, nth_paragraph, first_word } => {
            nth_paragraph_first_word(value, *num_paragraphs, *nth_paragraph, first_word)
        }
        NumberPlaceholders { num_placeholders } => {
            static RE: OnceLock<Regex> = OnceLock::new();
            let count = regex(&RE, || r"\[.*?\]".to_owned()).find_iter(value).count();
            (count as u64 >= *num_placeholders, format!("{count} [placeholders]"))
        }
        Postscript { marker, pattern } => {
            let found = pattern.is_match(&value.to_lowercase());
            (found, format!("postscript {marker:?} {}", if found { "found" } else { "not found" }))
        }
        NumberBulletLists { num_bullets } => {
            static STAR: OnceLock<Regex> = OnceLock::new();
            static DASH: OnceLock<Regex> = OnceLock::new();
            let stars = regex(&STAR, || format!(r"(?m)^{space}*\*[^*].*$")).find_iter(value).count();
            let dashes = regex(&DASH, || format!(r"(?m)^{space}*-.*$")).find_iter(value).count();
            let count = stars + dashes;
            (count as u64 == *num_bullets, format!("{count} bullet points"))
        }
        ConstrainedResponse => {
            let value = strip(value);
            let found = ["My answer is yes.", "My answer is no.", "My answer is maybe."]
                .iter()
                .find(|option| value.contains(*option));
            match found {
                Some(option) => (true, format!("contains {option:?}")),
                None => (false, "none of the allowed answers".into()),
            }
        }
        NumberHighlightedSections { num_highlights } => {
            static SINGLE: OnceLock<Regex> = OnceLock::new();
            static DOUBLE: OnceLock<Regex> = OnceLock::new();
            let single = regex(&SINGLE, || r"\*[^\n*]*\*".to_owned())
                .find_iter(value)
                .filter(|m| !strip(m.as_str().trim_matches('*')).is_empty())
                .count();
            // `**bold**` counts again through its own pattern, as in the reference.
            let double = regex(&DOUBLE, || r"\*\*[^\n*]*\*\*".to_owned())
                .find_iter(value)
                .filter(|m| !strip(&m.as_str()[2..m.as_str().len() - 2]).is_empty())
                .count();
            let count = single + double;
            (count as u64 >= *num_highlights, format!("{count} highlighted sections"))
        }
        MultipleSections { splitter, num_sections } => {
            // `len(re.split(pattern, value)) - 1`: the number of splitter matches.
            let count = splitter.regex.find_iter(value).count();
            (count as u64 >= *num_sections, format!("{count} sections marked {:?}", splitter.source))
        }
        JsonFormat => {
            let mut text = strip(value);
            for prefix in ["```json", "```Json", "```JSON", "```"] {
                text = text.strip_prefix(prefix).unwrap_or(text);
            }
            let text = strip(text.strip_suffix("```").unwrap_or(text));
            let ok = is_python_json(text);
            (ok, if ok { "valid JSON".into() } else { "not valid JSON".into() })
        }
        Title => {
            static RE: OnceLock<Regex> = OnceLock::new();
            let title = regex(&RE, || r"<<[^\n]+>>".to_owned())
                .find_iter(value)
                .map(|m| m.as_str().trim_start_matches('<').trim_end_matches('>'))
                .find(|title| !strip(title).is_empty());
            match title {
                Some(title) => (true, format!("title <<{title}>>")),
                None => (false, "no <<title>>".into()),
            }
        }
        TwoResponses => {
            let responses: Vec<&str> = value.split("******").collect();
            let mut valid = Vec::new();
            for (index, response) in responses.iter().enumerate() {
                if strip(response).is_empty() {
                    if index != 0 && index != responses.len() - 1 {
                        return (false, "an empty response between separators".into());
                    }
                } else {
                    valid.push(*response);
                }
            }
            let ok = valid.len() == 2 && strip(valid[0]) != strip(valid[1]);
            (ok, format!("{} non-empty responses separated by ******", valid.len()))
        }
        RepeatPrompt { prompt_to_repeat } => {
            let ok = strip(value).to_lowercase().starts_with(&strip(prompt_to_repeat).to_lowercase());
            (ok, if ok { "starts with the prompt".into() } else { "does not start with the prompt".into() })
        }
        EndChecker { end_phrase } => {
            let ok = strip(value).trim_matches('"').to_lowercase().ends_with(&end_phrase.to_lowercase());
            (ok, format!("{} with {end_phrase:?}", if ok { "ends" } else { "does not end" }))
        }
        CapitalWordFrequency { capital_frequency, capital_relation } => {
            let count = treebank::word_tokenize(value).iter().filter(|word| is_upper(word)).count();
            (capital_relation.holds(count, *capital_frequency), format!("{count} all-capital words"))
        }
        EnglishCapital => english_case(value, is_upper(value), "all capitals"),
        EnglishLowercase => english_case(value, is_lower(value), "all lowercase"),
        NoComma => {
            let count = value.matches(',').count();
            (count == 0, format!("{count} commas"))
        }
        Quotation => {
            let value = strip(value);
            let ok = value.chars().count() > 1 && value.starts_with('"') && value.ends_with('"');
            (ok, if ok { "wrapped in double quotes".into() } else { "not wrapped in double quotes".into() })
        }
    }
}

/// `value.isupper() and langdetect.detect(value) == "en"` (or `islower`), with an undetectable
/// language counted as followed.
fn english_case(value: &str, case_ok: bool, case: &str) -> (bool, Measure) {
    if !case_ok {
        return (false, format!("not {case}"));
    }
    match lang::detect(value) {
        Some("en") => (true, format!("{case}, detected language en")),
        Some(other) => (false, format!("{case}, but detected language {other}")),
        None => (true, format!("{case}, no language detectable (counted as followed)")),
    }
}

fn nth_paragraph_first_word(
    value: &str,
    expected_count: u64,
    nth: u64,
    expected_word: &str,
) -> (bool, Measure) {
    let paragraphs: Vec<&str> = value.split("\n\n").collect();
    let count = paragraphs.iter().filter(|p| !strip(p).is_empty()).count();
    // The reference compares `nth` with the count of non-empty paragraphs but then indexes the list
    // that still holds the empty ones; kept as it is.
    let nth = nth as usize;
    if nth > count {
        return (false, format!("{count} paragraphs, no paragraph {nth}"));
    }
    let paragraph = strip(paragraphs[nth - 1]);
    let Some(word) = split_whitespace(paragraph).next() else {
        return (false, format!("paragraph {nth} is empty"));
    };
    let word = strip(word).trim_start_matches('\'').trim_start_matches('"');
    let mut first_word = String::new();
    for c in word.chars() {
        if matches!(c, '.' | ',' | '?' | '!' | '\'' | '"') {
            break;
        }
        first_word.extend(c.to_lowercase());
    }
    let ok = count as u64 == expected_count && first_word == expected_word;
    (ok, format!("{count} paragraphs, paragraph {nth} starts with {first_word:?}"))
}

/// The responses the loose evaluation tries, in the reference's order: the response, without
/// `*`, without its first line, last line, both, and those three without `*`.
pub fn loose_variants(response: &str) -> [String; 8] {
    let lines: Vec<&str> = response.split('\n').collect();
    let join = |lines: &[&str]| strip(&lines.join("\n")).to_owned();
    let n = lines.len();
    let remove_first = join(&lines[1.min(n)..]);
    let remove_last = join(&lines[..n.saturating_sub(1)]);
    let remove_both = if n >= 2 { join(&lines[1..n - 1]) } else { String::new() };
    let no_stars = |text: &str| text.replace('*', "");
    [
        response.to_owned(),
        no_stars(response),
        remove_first.clone(),
        remove_last.clone(),
        remove_both.clone(),
        no_stars(&remove_first),
        no_stars(&remove_last),
        no_stars(&remove_both),
    ]
}

/// Strict: the response as it is, and an empty (whitespace-only) response follows nothing.
pub fn strict(instruction: &Instruction, response: &str) -> (bool, Measure) {
    if strip(response).is_empty() {
        return (false, "empty response".into());
    }
    follows(instruction, response)
}

/// Loose: followed when any of the eight variants (non-empty) follows. Returns which one did.
pub fn loose(instruction: &Instruction, variants: &[String; 8]) -> (bool, Measure) {
    const NAMES: [&str; 8] = [
        "as is",
        "without *",
        "without its first line",
        "without its last line",
        "without its first and last lines",
        "without its first line and *",
        "without its last line and *",
        "without its first and last lines and *",
    ];
    let mut first_measure = None;
    for (variant, name) in variants.iter().zip(NAMES) {
        if strip(variant).is_empty() {
            continue;
        }
        let (ok, measure) = follows(instruction, variant);
        if ok {
            return (true, format!("{measure} (response {name})"));
        }
        first_measure.get_or_insert(measure);
    }
    (false, first_measure.unwrap_or_else(|| "empty response".into()))
}
