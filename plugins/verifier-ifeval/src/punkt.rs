//! NLTK's Punkt sentence tokenizer (`PunktSentenceTokenizer.tokenize`, realigned boundaries) with
//! NLTK's pretrained English parameters — what IFEval's `count_sentences` and `word_tokenize` use.
//!
//! A port of the decision procedure of `nltk/tokenize/punkt.py` (NLTK 3.10, Apache-2.0): the
//! period-context scan, the word segmentation regex, the first (type-based) and second
//! (orthographic, collocation, sentence-starter) annotation passes, and the realignment of
//! closing quotes and brackets. The regexes are written out as character scans: every one of
//! them is a run of a character class, so the scans are linear and need no backtracking engine.
//!
//! The parameters in `data/punkt_english/` are NLTK's `punkt_tab` English model (the same four
//! tables as the older `english.pickle`), trained by Tibor Kiss and Jan Strunk.

use std::collections::{HashMap, HashSet};
use std::ops::Range;
use std::sync::OnceLock;

use regex::Regex;

use crate::pytext::{is_ascii_space, is_space, is_word};

const ORTHO_BEG_UC: u32 = 1 << 1;
const ORTHO_MID_UC: u32 = 1 << 2;
const ORTHO_UNK_UC: u32 = 1 << 3;
const ORTHO_BEG_LC: u32 = 1 << 4;
const ORTHO_MID_LC: u32 = 1 << 5;
const ORTHO_UNK_LC: u32 = 1 << 6;
const ORTHO_UC: u32 = ORTHO_BEG_UC | ORTHO_MID_UC | ORTHO_UNK_UC;
const ORTHO_LC: u32 = ORTHO_BEG_LC | ORTHO_MID_LC | ORTHO_UNK_LC;

/// The four learned tables of a Punkt model.
struct Params {
    abbrev_types: HashSet<String>,
    collocations: HashSet<(String, String)>,
    sent_starters: HashSet<String>,
    ortho_context: HashMap<String, u32>,
}

fn params() -> &'static Params {
    static PARAMS: OnceLock<Params> = OnceLock::new();
    PARAMS.get_or_init(|| {
        let lines = |text: &'static str| text.lines().filter(|line| !line.is_empty());
        Params {
            abbrev_types: lines(include_str!("../data/punkt_english/abbrev_types.txt"))
                .map(String::from)
                .collect(),
            sent_starters: lines(include_str!("../data/punkt_english/sent_starters.txt"))
                .map(String::from)
                .collect(),
            collocations: lines(include_str!("../data/punkt_english/collocations.tab"))
                .filter_map(|line| line.split_once('\t'))
                .map(|(a, b)| (a.to_owned(), b.to_owned()))
                .collect(),
            ortho_context: lines(include_str!("../data/punkt_english/ortho_context.tab"))
                .filter_map(|line| line.split_once('\t'))
                .filter_map(|(typ, flags)| Some((typ.to_owned(), flags.parse().ok()?)))
                .collect(),
        }
    })
}

/// Loads the model now (it is otherwise loaded on first use); cheap to call again.
pub fn warm_up() {
    params();
    numeric_re();
}

fn numeric_re() -> &'static Regex {
    static RE: OnceLock<Regex> = OnceLock::new();
    RE.get_or_init(|| Regex::new(r"^-?[.,]?\d[\d,.\-]*\.?$").expect("valid regex"))
}

/// `sent_end_chars`.
fn is_sent_end(c: char) -> bool {
    matches!(c, '.' | '?' | '!')
}

/// `_re_non_word_chars`: punctuation that cannot appear within a word (NLTK 3.10 adds the curly
/// quotes and guillemets).
fn is_non_word(c: char) -> bool {
    matches!(
        c,
        ')' | '"'
            | ';'
            | '}'
            | ']'
            | '*'
            | ':'
            | '@'
            | '\''
            | '('
            | '{'
            | '['
            | '\u{2018}'
            | '\u{2019}'
            | '\u{201c}'
            | '\u{201d}'
            | '\u{ab}'
            | '\u{bb}'
            | '?'
            | '!'
    )
}

/// `_re_word_start` is a negated class: these characters cannot start a word token.
fn cannot_start_word(c: char) -> bool {
    matches!(c, '(' | '"' | '`' | '{' | '[' | ':' | ';' | '&' | '#' | '*' | '@' | ')' | '}' | ']' | '-' | ',')
}

/// Closing punctuation moved onto the sentence before it by `re_boundary_realignment`.
fn is_closing(c: char) -> bool {
    matches!(
        c,
        '"' | '\''
            | ')'
            | ']'
            | '}'
            | '\u{2018}'
            | '\u{2019}'
            | '\u{201c}'
            | '\u{201d}'
            | '\u{ab}'
            | '\u{bb}'
    )
}

/// `_re_multi_char_punct` anchored at `i`: `-{2,}`, `\.{2,}` or `(?:\.\s){2,}\.`; the end of the
/// match.
fn multi_char_at(s: &[char], i: usize) -> Option<usize> {
    let at = |k: usize| s.get(k).copied();
    if at(i) == Some('-') && at(i + 1) == Some('-') {
        let mut end = i + 2;
        while at(end) == Some('-') {
            end += 1;
        }
        return Some(end);
    }
    if at(i) == Some('.') && at(i + 1) == Some('.') {
        let mut end = i + 2;
        while at(end) == Some('.') {
            end += 1;
        }
        return Some(end);
    }
    let mut pairs = 0;
    let mut p = i;
    while at(p) == Some('.') && at(p + 1).is_some_and(is_space) {
        p += 2;
        pairs += 1;
    }
    if pairs >= 2 && at(p) == Some('.') {
        Some(p + 1)
    } else if pairs >= 3 {
        // Backtrack one pair: its period closes the match.
        Some(p - 1)
    } else {
        None
    }
}

/// `_word_tokenizer_re().findall(line)`: Punkt's word segmentation of one line.
fn word_tokenize(line: &[char]) -> Vec<Range<usize>> {
    let n = line.len();
    // The lookahead that ends a word: whitespace, end, non-word punctuation, multi-character
    // punctuation, or a comma followed by one of those.
    let ends_word = |j: usize| -> bool {
        if j >= n {
            return true;
        }
        let c = line[j];
        if is_space(c) || is_non_word(c) || multi_char_at(line, j).is_some() {
            return true;
        }
        c == ','
            && (j + 1 >= n
                || is_space(line[j + 1])
                || is_non_word(line[j + 1])
                || multi_char_at(line, j + 1).is_some())
    };
    let mut tokens = Vec::new();
    let mut i = 0;
    while i < n {
        if let Some(end) = multi_char_at(line, i) {
            tokens.push(i..end);
            i = end;
            continue;
        }
        let c = line[i];
        if is_space(c) {
            i += 1;
            continue;
        }
        if cannot_start_word(c) {
            tokens.push(i..i + 1);
            i += 1;
            continue;
        }
        let mut j = i + 1;
        while !ends_word(j) {
            j += 1;
        }
        tokens.push(i..j);
        i = j;
    }
    tokens
}

/// A word token with its first-pass annotation (`PunktToken`).
struct Token {
    tok: String,
    typ: String,
    period_final: bool,
    sentbreak: bool,
    abbr: bool,
    ellipsis: bool,
}

impl Token {
    fn new(tok: String) -> Token {
        let lower = tok.to_lowercase();
        let typ = if numeric_re().is_match(&lower) { "##number##".to_owned() } else { lower };
        let period_final = tok.ends_with('.');
        let mut token = Token { tok, typ, period_final, sentbreak: false, abbr: false, ellipsis: false };
        token.first_pass();
        token
    }

    /// `_first_pass_annotation`.
    fn first_pass(&mut self) {
        let tok = self.tok.as_str();
        if tok == "." || tok == "?" || tok == "!" {
            self.sentbreak = true;
        } else if tok.len() >= 2 && tok.chars().all(|c| c == '.') {
            self.ellipsis = true;
        } else if self.period_final && !tok.ends_with("..") {
            let stem = tok[..tok.len() - 1].to_lowercase();
            let abbrevs = &params().abbrev_types;
            let last_part = stem.rsplit('-').next().unwrap_or_default();
            if abbrevs.contains(&stem) || abbrevs.contains(last_part) {
                self.abbr = true;
            } else {
                self.sentbreak = true;
            }
        }
    }

    fn type_no_period(&self) -> &str {
        if self.typ.chars().count() > 1 && self.typ.ends_with('.') {
            &self.typ[..self.typ.len() - 1]
        } else {
            &self.typ
        }
    }

    fn type_no_sentperiod(&self) -> &str {
        if self.sentbreak { self.type_no_period() } else { &self.typ }
    }

    fn first_upper(&self) -> bool {
        self.tok.chars().next().is_some_and(char::is_uppercase)
    }

    fn first_lower(&self) -> bool {
        self.tok.chars().next().is_some_and(char::is_lowercase)
    }

    /// `[^\W\d]\.$` from the start: one letter (a Python word character that is not a decimal
    /// digit) and a period.
    fn is_initial(&self) -> bool {
        let mut chars = self.tok.chars();
        match (chars.next(), chars.next(), chars.next()) {
            (Some(c), Some('.'), None) => is_word(c) && !is_decimal(c),
            _ => false,
        }
    }
}

fn is_decimal(c: char) -> bool {
    static RE: OnceLock<Regex> = OnceLock::new();
    let re = RE.get_or_init(|| Regex::new(r"^\d$").expect("valid regex"));
    c.is_numeric() && re.is_match(c.encode_utf8(&mut [0; 4]))
}

enum Ortho {
    Starter,
    NotStarter,
    Unknown,
}

/// `_ortho_heuristic`: does `token` look like the first word of a sentence?
fn ortho_heuristic(token: &Token) -> Ortho {
    if matches!(token.tok.as_str(), ";" | ":" | "," | "." | "!" | "?") {
        return Ortho::NotStarter;
    }
    let context = params().ortho_context.get(token.type_no_sentperiod()).copied().unwrap_or(0);
    if token.first_upper() && context & ORTHO_LC != 0 && context & ORTHO_MID_UC == 0 {
        return Ortho::Starter;
    }
    if token.first_lower() && (context & ORTHO_UC != 0 || context & ORTHO_BEG_LC == 0) {
        return Ortho::NotStarter;
    }
    Ortho::Unknown
}

/// `_second_pass_annotation` of `first` given the token after it.
fn second_pass(first: &mut Token, next: &Token) {
    if !first.period_final {
        return;
    }
    let p = params();
    let typ = first.type_no_period().to_owned();
    let next_typ = next.type_no_sentperiod();
    let is_initial = first.is_initial();
    if p.collocations.contains(&(typ.clone(), next_typ.to_owned())) {
        first.sentbreak = false;
        first.abbr = true;
        return;
    }
    if (first.abbr || first.ellipsis) && !is_initial {
        if matches!(ortho_heuristic(next), Ortho::Starter) {
            first.sentbreak = true;
            return;
        }
        if next.first_upper() && p.sent_starters.contains(next_typ) {
            first.sentbreak = true;
            return;
        }
    }
    if is_initial || typ == "##number##" {
        match ortho_heuristic(next) {
            Ortho::NotStarter => {
                first.sentbreak = false;
                first.abbr = true;
            }
            Ortho::Unknown
                if is_initial
                    && next.first_upper()
                    && p.ortho_context.get(next_typ).copied().unwrap_or(0) & ORTHO_LC == 0 =>
            {
                first.sentbreak = false;
                first.abbr = true;
            }
            _ => {}
        }
    }
}

/// `text_contains_sentbreak`: does a token other than the last one end a sentence?
fn contains_sentbreak(text: &[char]) -> bool {
    let mut tokens = Vec::new();
    for line in text.split(|&c| c == '\n') {
        if line.iter().all(|&c| is_space(c)) {
            continue;
        }
        tokens.extend(word_tokenize(line).into_iter().map(|range| Token::new(line[range].iter().collect())));
    }
    for i in 0..tokens.len() {
        let (head, tail) = tokens.split_at_mut(i + 1);
        let current = &mut head[i];
        let Some(next) = tail.first() else { return false };
        second_pass(current, next);
        if current.sentbreak {
            // `found` is set; the next token exists, so the text holds a break.
            return true;
        }
    }
    false
}

/// One match of `period_context_re`: a sentence-end character and what follows it.
struct EndContext {
    /// Index of the `.`, `?` or `!`; the match ends right after it.
    at: usize,
    /// `after_tok`: the punctuation or whitespace-and-token after it.
    after: Range<usize>,
    /// Start of `next_tok`, when whitespace and a token follow.
    next_tok: Option<usize>,
}

fn end_contexts(text: &[char]) -> Vec<EndContext> {
    let n = text.len();
    let mut found = Vec::new();
    for at in 0..n {
        if !is_sent_end(text[at]) || at + 1 >= n {
            continue;
        }
        let c = text[at + 1];
        if is_non_word(c) {
            found.push(EndContext { at, after: at + 1..at + 2, next_tok: None });
        } else if is_space(c) {
            let mut k = at + 1;
            while k < n && is_space(text[k]) {
                k += 1;
            }
            if k < n {
                let mut end = k;
                while end < n && !is_space(text[end]) {
                    end += 1;
                }
                found.push(EndContext { at, after: at + 1..end, next_tok: Some(k) });
            }
        }
    }
    found
}

/// `_match_potential_end_contexts`: each candidate with the word before it, overlaps removed.
fn potential_ends(text: &[char]) -> Vec<(EndContext, Vec<char>)> {
    let context = |slice: &Range<usize>, m: &EndContext| -> Vec<char> {
        let mut out: Vec<char> = text[slice.clone()].to_vec();
        out.push(text[m.at]);
        out.extend_from_slice(&text[m.after.clone()]);
        out
    };
    let mut result = Vec::new();
    let mut previous_slice = 0..0;
    let mut previous: Option<EndContext> = None;
    for m in end_contexts(text) {
        let before = &text[previous_slice.end..m.at];
        // `_get_last_whitespace_index`: 0 both when none is found and when it is the first
        // character; the reference treats both as "none".
        let last_ws = before.iter().rposition(|&c| is_ascii_space(c)).unwrap_or(0);
        let word_start = if last_ws != 0 { last_ws + previous_slice.end + 1 } else { previous_slice.start };
        let word = word_start..m.at;
        if let Some(prev) = previous.take() {
            if previous_slice.end <= word.start {
                let ctx = context(&previous_slice, &prev);
                result.push((prev, ctx));
            }
        }
        previous = Some(m);
        previous_slice = word;
    }
    if let Some(prev) = previous {
        let ctx = context(&previous_slice, &prev);
        result.push((prev, ctx));
    }
    result
}

/// `_slices_from_text`.
fn raw_slices(text: &[char]) -> Vec<Range<usize>> {
    let mut slices = Vec::new();
    let mut last_break = 0;
    for (m, context) in potential_ends(text) {
        if contains_sentbreak(&context) {
            slices.push(last_break..m.at + 1);
            last_break = m.next_tok.unwrap_or(m.at + 1);
        }
    }
    let trimmed_len = text.len() - text.iter().rev().take_while(|&&c| is_space(c)).count();
    slices.push(last_break..trimmed_len);
    slices
}

/// `re_boundary_realignment.match(text)`: closing punctuation at the start of the next sentence
/// that belongs to the previous one. Returns (length of the punctuation, length of the match).
fn realignment(text: &[char]) -> Option<(usize, usize)> {
    let run = text.iter().take_while(|&&c| is_closing(c)).count();
    for len in 1..=run {
        let rest = &text[len..];
        let spaces = rest.iter().take_while(|&&c| is_space(c)).count();
        if spaces > 0 {
            return Some((len, len + spaces));
        }
        if rest.starts_with(&['-', '-']) || rest.is_empty() {
            return Some((len, len));
        }
    }
    None
}

fn slice_of<'a>(text: &'a [char], range: &Range<usize>) -> &'a [char] {
    if range.start >= range.end || range.start >= text.len() {
        &[]
    } else {
        &text[range.start..range.end.min(text.len())]
    }
}

/// The sentences of `text` as character ranges (`span_tokenize` with realigned boundaries).
pub fn sentence_spans(text: &[char]) -> Vec<Range<usize>> {
    let slices = raw_slices(text);
    let mut spans = Vec::new();
    let mut realign = 0;
    for (i, current) in slices.iter().enumerate() {
        let sentence = current.start + realign..current.end;
        let Some(next) = slices.get(i + 1) else {
            if !slice_of(text, &sentence).is_empty() {
                spans.push(sentence);
            }
            continue;
        };
        match realignment(slice_of(text, next)) {
            Some((kept, matched)) => {
                spans.push(sentence.start..next.start + kept);
                realign = matched;
            }
            None => {
                realign = 0;
                if !slice_of(text, &sentence).is_empty() {
                    spans.push(sentence);
                }
            }
        }
    }
    spans
}

/// `sent_tokenize(text)`: the sentences of `text`.
pub fn sentences(text: &str) -> Vec<String> {
    let chars: Vec<char> = text.chars().collect();
    sentence_spans(&chars).iter().map(|span| slice_of(&chars, span).iter().collect()).collect()
}

/// IFEval's `count_sentences`.
pub fn count_sentences(text: &str) -> usize {
    let chars: Vec<char> = text.chars().collect();
    sentence_spans(&chars).len()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(text: &str, expected: &[&str]) {
        assert_eq!(sentences(text), expected, "{text:?}");
    }

    // Expected values from `nltk.sent_tokenize` (NLTK 3.10.4, punkt_tab english).
    #[test]
    fn splits_like_nltk() {
        check(
            "Mr. Smith went to Washington. He arrived at 5 p.m. on Jan. 3. Then he left!",
            &["Mr. Smith went to Washington.", "He arrived at 5 p.m. on Jan. 3.", "Then he left!"],
        );
        check("Hello world", &["Hello world"]);
        check("", &[]);
        check("   \n ", &[]);
        check("(How are you?) I am fine.", &["(How are you?)", "I am fine."]);
        check("He said \"stop.\" Then he left.", &["He said \"stop.\"", "Then he left."]);
        check("Wait... what? Really!!! Yes.", &["Wait... what?", "Really!!!", "Yes."]);
        check("The U.S. economy grew. It is big.", &["The U.S. economy grew.", "It is big."]);
        check("one.two. three", &["one.two.", "three"]);
        check("First line\n\nSecond line. Third", &["First line\n\nSecond line.", "Third"]);
        check("It costs $3.50. Cheap!", &["It costs $3.50.", "Cheap!"]);
        check("See section 3. It explains.", &["See section 3.", "It explains."]);
    }
}
