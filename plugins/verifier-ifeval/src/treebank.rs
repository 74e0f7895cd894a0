//! NLTK's `word_tokenize`: Punkt sentences, then `NLTKWordTokenizer` (the improved Treebank
//! tokenizer) on each — what IFEval's `change_case:capital_word_frequency` counts words with.
//!
//! A port of the substitution pipeline of `nltk/tokenize/destructive.py` (NLTK 3.10,
//! Apache-2.0), in its order. The three rules written with look-around or a possessive
//! quantifier in NLTK are written out as scans here (`quote_before_word`, `final_period`);
//! the rest are the same patterns on the `regex` crate, whose leftmost-first, non-overlapping
//! replacement is what Python's `re.sub` does. Python's `\s` and `\w` are spelled out as classes
//! (see `pytext`) so that they match what Python's match.

use std::sync::OnceLock;

use regex::Regex;

use crate::punkt;
use crate::pytext::{SPACE_CLASS, is_space, is_word, split_whitespace};

struct Rules {
    starting: Vec<(Regex, &'static str)>,
    punctuation_middle: Vec<(Regex, &'static str)>,
    punctuation_late: Vec<(Regex, &'static str)>,
    parens: Regex,
    double_dashes: Regex,
    ending: Vec<(Regex, &'static str)>,
    contractions: Vec<Regex>,
}

fn rules() -> &'static Rules {
    static RULES: OnceLock<Rules> = OnceLock::new();
    RULES.get_or_init(|| {
        let re = |pattern: &str| Regex::new(pattern).expect("valid tokenizer regex");
        let space = SPACE_CLASS;
        Rules {
            starting: vec![
                (re(r"([«“‘„]|[`]+)"), " ${1} "),
                (re(r#"^""#), "``"),
                (re(r"(``)"), " ${1} "),
                (re(r#"([ (\[{<])("|'{2})"#), "${1} `` "),
            ],
            punctuation_middle: vec![
                (re(r"([:,])([^\d])"), " ${1} ${2}"),
                (re(r"([:,])(\n?)\z"), " ${1} ${2}"),
                (re(r"\.{2,}"), " ${0} "),
                (re(r"[;@#$%&]"), " ${0} "),
                (re(r"[\x{2012}-\x{2015}]"), " ${0} "),
            ],
            punctuation_late: vec![
                (re(r"[?!]"), " ${0} "),
                (re(r"([^'])' "), "${1} ' "),
                (re(r"[*]"), " ${0} "),
            ],
            parens: re(r"[\]\[(){}<>]"),
            double_dashes: re(r"--"),
            ending: vec![
                (re(r"([»”’])"), " ${1} "),
                (re(r"''"), " '' "),
                (re(r#"""#), " '' "),
                (re(&format!("{space}+")), " "),
                (re(r"([^' ])('[sS]|'[mM]|'[dD]|') "), "${1} ${2} "),
                (re(r"([^' ])('ll|'LL|'re|'RE|'ve|'VE|n't|N'T) "), "${1} ${2} "),
            ],
            contractions: [
                r"(?i)\b(can)(not)\b",
                r"(?i)\b(d)('ye)\b",
                r"(?i)\b(gim)(me)\b",
                r"(?i)\b(gon)(na)\b",
                r"(?i)\b(got)(ta)\b",
                r"(?i)\b(lem)(me)\b",
                r"(?i)\b(more)('n)\b",
                // `(?=\s)` in NLTK: the whitespace is captured and put back.
                &format!(r"(?i)\b(wan)(na)({space})"),
                r"(?i) ('t)(is)\b",
                r"(?i) ('t)(was)\b",
            ]
            .iter()
            .map(|pattern| re(pattern))
            .collect(),
        }
    })
}

/// `(?i)(?<!\w)(\')(?!(?:re|ve|ll|m|t|s|d|n)\b)(?=\w)` → `' `: an opening single quote glued to
/// a word gets a space after it, unless it starts a contraction suffix.
fn quote_before_word(text: &str) -> String {
    let chars: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len() + 8);
    for (i, &c) in chars.iter().enumerate() {
        out.push(c);
        if c != '\'' {
            continue;
        }
        let before_ok = i == 0 || !is_word(chars[i - 1]);
        let after_ok = chars.get(i + 1).is_some_and(|&next| is_word(next));
        let suffix = ["re", "ve", "ll", "m", "t", "s", "d", "n"].iter().any(|suffix| {
            let len = suffix.len();
            chars.len() >= i + 1 + len
                && chars[i + 1..i + 1 + len]
                    .iter()
                    .zip(suffix.chars())
                    .all(|(a, b)| a.to_ascii_lowercase() == b)
                && chars.get(i + 1 + len).is_none_or(|&next| !is_word(next))
        });
        if before_ok && after_ok && !suffix {
            out.push(' ');
        }
    }
    out
}

/// `([^\.])(\.)([closers]*)\s*$` → `\1 \2 \3 ` (`spaced`) or `\1 \2\3 `: the period that ends
/// the text, after any closing brackets and quotes, split from the word before it.
fn final_period(text: &str, closers: &[char], spaced: bool) -> String {
    let Some(dot) = text.rfind('.') else { return text.to_owned() };
    let Some(before) = text[..dot].chars().next_back() else { return text.to_owned() };
    if before == '.' {
        return text.to_owned();
    }
    let tail = &text[dot + 1..];
    let closing_len: usize = tail.chars().take_while(|c| closers.contains(c)).map(char::len_utf8).sum();
    if !tail[closing_len..].chars().all(is_space) {
        return text.to_owned();
    }
    let mut out = String::with_capacity(text.len() + 4);
    out.push_str(&text[..dot]);
    out.push_str(if spaced { " . " } else { " ." });
    out.push_str(&tail[..closing_len]);
    out.push(' ');
    out
}

const CLOSERS_SPACED: &[char] = &[']', ')', '}', '>', '"', '\'', '»', '”', '’', ' '];
const CLOSERS: &[char] = &[']', ')', '}', '>', '"', '\''];

/// `NLTKWordTokenizer().tokenize(sentence)`.
pub fn tokenize_sentence(sentence: &str) -> Vec<String> {
    let rules = rules();
    let apply = |text: String, rules: &[(Regex, &str)]| {
        rules.iter().fold(text, |text, (re, with)| re.replace_all(&text, *with).into_owned())
    };
    let mut text = apply(sentence.to_owned(), &rules.starting);
    text = quote_before_word(&text);
    text = final_period(&text, CLOSERS_SPACED, true);
    text = apply(text, &rules.punctuation_middle);
    text = final_period(&text, CLOSERS, false);
    text = apply(text, &rules.punctuation_late);
    text = rules.parens.replace_all(&text, " ${0} ").into_owned();
    text = rules.double_dashes.replace_all(&text, " -- ").into_owned();
    text = format!(" {text} ");
    text = apply(text, &rules.ending);
    for re in &rules.contractions {
        let with = if re.captures_len() == 4 { " ${1} ${2} ${3}" } else { " ${1} ${2} " };
        text = re.replace_all(&text, with).into_owned();
    }
    split_whitespace(&text).map(str::to_owned).collect()
}

/// `nltk.word_tokenize(text)`.
pub fn word_tokenize(text: &str) -> Vec<String> {
    punkt::sentences(text).iter().flat_map(|sentence| tokenize_sentence(sentence)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(text: &str, expected: &[&str]) {
        assert_eq!(word_tokenize(text), expected, "{text:?}");
    }

    // Expected values from `nltk.word_tokenize` (NLTK 3.10.4).
    #[test]
    fn tokenizes_like_nltk() {
        check(
            "I DON'T think CANNOT work. HELLO-WORLD, U.S.A. isn't 'quoted' \"here\".",
            &[
                "I",
                "DO",
                "N'T",
                "think",
                "CAN",
                "NOT",
                "work",
                ".",
                "HELLO-WORLD",
                ",",
                "U.S.A.",
                "is",
                "n't",
                "'",
                "quoted",
                "'",
                "``",
                "here",
                "''",
                ".",
            ],
        );
        check(
            "Good muffins cost $3.88 in New York.",
            &["Good", "muffins", "cost", "$", "3.88", "in", "New", "York", "."],
        );
        check(
            "(Hello) [world] {x} <y>",
            &["(", "Hello", ")", "[", "world", "]", "{", "x", "}", "<", "y", ">"],
        );
        check(
            "wait... no--yes; a@b #c 50% & d",
            &["wait", "...", "no", "--", "yes", ";", "a", "@", "b", "#", "c", "50", "%", "&", "d"],
        );
        check(
            "I'm gonna wanna go, y'know?",
            &["I", "'m", "gon", "na", "wan", "na", "go", ",", "y'know", "?"],
        );
        check("", &[]);
    }
}
