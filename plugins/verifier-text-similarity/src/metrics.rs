//! The similarity metrics, each a pure function of two texts, faithful to a Python reference
//! implementation (the parity test, `tests/parity.rs`, runs both on the same pairs):
//! - [`fuzzy_ratio`]: rapidfuzz's `fuzz.ratio`, through the `rapidfuzz` crate;
//! - [`sentence_bleu`]: sacrebleu's `sentence_bleu` with its defaults (tokenizer `13a`,
//!   smoothing `exp`, effective order), written here: no Rust crate reproduces sacrebleu;
//! - [`rouge_l`] and [`rouge_n`]: rouge-score's `RougeScorer(["rougeL"])` and `["rougeN"]` with
//!   its default `use_stemmer=False`, written here for the same reason.

use std::collections::HashMap;
use std::sync::LazyLock;

use regex::Regex;

/// The most cells (input characters × reference characters) one item's [`fuzzy_ratio`] may cost.
/// rapidfuzz's Indel distance is bit-parallel (64 cells a machine word): measured in a release
/// build on the 2-core development machine, two 65,000-character texts (4.2 G cells) took 158 ms,
/// two 130,000-character texts 642 ms; two 450 KB texts had kept a core busy for minutes.
pub const MAX_FUZZY_CELLS: usize = 4 << 30;

/// rapidfuzz's `fuzz.ratio(input, reference) / 100`: the normalized Indel similarity of the two
/// texts' code points, `1 - (insertions + deletions) / (len(a) + len(b))`; 1 for two empty texts.
/// No preprocessing (rapidfuzz's `processor` is `None` by default), so case and spaces count.
pub fn fuzzy_ratio(input: &str, reference: &str) -> f64 {
    rapidfuzz::fuzz::ratio(input.chars(), reference.chars())
}

/// Sentence BLEU's parts, each as sacrebleu reports it but on a 0–1 scale.
#[derive(Debug, Clone, PartialEq)]
pub struct Bleu {
    /// The score, sacrebleu's `score / 100`.
    pub score: f64,
    /// The 1- to 4-gram precisions (smoothed as the score uses them), `precisions[n] / 100`.
    pub precisions: [f64; 4],
    /// The brevity penalty.
    pub brevity_penalty: f64,
    /// Tokens in the input (hypothesis) after tokenizing.
    pub input_tokens: usize,
    /// Tokens in the reference after tokenizing.
    pub reference_tokens: usize,
}

/// sacrebleu 2.x `sentence_bleu(input, [reference])` with its defaults: the `13a` tokenizer, no
/// lowercasing, n-grams up to 4, `exp` smoothing (each order with no match gets precision
/// `1 / (2^k · total)`, k counting such orders), effective order (orders the input is too short
/// for are left out), and no match at all scoring 0.
pub fn sentence_bleu(input: &str, reference: &str) -> Bleu {
    const ORDER: usize = 4;
    let hypothesis = tokenize_13a(python_rstrip(input));
    let reference = tokenize_13a(python_rstrip(reference));
    let (hyp_len, ref_len) = (hypothesis.len(), reference.len());
    let reference_counts = ngram_counts(&reference, ORDER);
    let mut correct = [0usize; ORDER];
    let mut total = [0usize; ORDER];
    for (ngram, count) in ngram_counts(&hypothesis, ORDER) {
        total[ngram.len() - 1] += count;
        if let Some(in_reference) = reference_counts.get(&ngram) {
            correct[ngram.len() - 1] += count.min(*in_reference);
        }
    }
    let brevity_penalty = if hyp_len < ref_len {
        if hyp_len > 0 { (1.0 - ref_len as f64 / hyp_len as f64).exp() } else { 0.0 }
    } else {
        1.0
    };
    let mut precisions = [0.0f64; ORDER];
    let done = |score: f64, precisions: [f64; ORDER]| Bleu {
        score: score / 100.0,
        precisions: precisions.map(|p| p / 100.0),
        brevity_penalty,
        input_tokens: hyp_len,
        reference_tokens: ref_len,
    };
    if correct.iter().all(|&c| c == 0) {
        return done(0.0, precisions);
    }
    // The same operations in the same order as sacrebleu's `compute_bleu`, so the floats agree.
    let mut smooth_mteval = 1.0f64;
    let mut effective_order = ORDER;
    for n in 0..ORDER {
        if total[n] == 0 {
            break;
        }
        effective_order = n + 1;
        if correct[n] == 0 {
            smooth_mteval *= 2.0;
            precisions[n] = 100.0 / (smooth_mteval * total[n] as f64);
        } else {
            precisions[n] = 100.0 * correct[n] as f64 / total[n] as f64;
        }
    }
    let log_sum: f64 = precisions[..effective_order].iter().map(|&p| my_log(p)).sum();
    done(brevity_penalty * (log_sum / effective_order as f64).exp(), precisions)
}

/// sacrebleu's `my_log`: log, floored for 0.
fn my_log(value: f64) -> f64 {
    if value == 0.0 { -9_999_999_999.0 } else { value.ln() }
}

/// Counts of every 1- to `max`-gram of `tokens`.
fn ngram_counts(tokens: &[String], max: usize) -> HashMap<&[String], usize> {
    let mut counts = HashMap::new();
    for n in 1..=max {
        for ngram in tokens.windows(n) {
            *counts.entry(ngram).or_insert(0) += 1;
        }
    }
    counts
}

/// The four substitutions of sacrebleu's `TokenizerRegexp`, in its order.
static TOKENIZER_RULES: LazyLock<[(Regex, &'static str); 4]> = LazyLock::new(|| {
    let rule = |pattern: &str, replacement: &'static str| {
        // The patterns are constants, tested on every run of the tests.
        (Regex::new(pattern).unwrap_or_else(|error| panic!("13a pattern {pattern}: {error}")), replacement)
    };
    [
        // Punctuation and symbols of ASCII become tokens of their own.
        rule(r"([\{-~\[-`\x20-\&\(-\+:-@/])", " ${1} "),
        // Period and comma, unless preceded by a digit.
        rule(r"([^0-9])([\.,])", "${1} ${2} "),
        // Period and comma, unless followed by a digit.
        rule(r"([\.,])([^0-9])", " ${1} ${2}"),
        // A dash preceded by a digit.
        rule(r"([0-9])(-)", "${1} ${2} "),
    ]
});

/// sacrebleu's `13a` tokenizer (mteval-v13a.pl's, as WMT uses): the tokens of `line`.
pub fn tokenize_13a(line: &str) -> Vec<String> {
    let mut line = line.replace("<skipped>", "").replace("-\n", "").replace('\n', " ");
    if line.contains('&') {
        line = line.replace("&quot;", "\"").replace("&amp;", "&").replace("&lt;", "<").replace("&gt;", ">");
    }
    let mut line = format!(" {line} ");
    for (pattern, replacement) in TOKENIZER_RULES.iter() {
        line = pattern.replace_all(&line, *replacement).into_owned();
    }
    python_split(&line).map(str::to_owned).collect()
}

/// ROUGE-L's (or ROUGE-N's) parts, as rouge-score reports them.
#[derive(Debug, Clone, PartialEq)]
pub struct RougeL {
    /// LCS length (shared n-grams) over the input's token (n-gram) count.
    pub precision: f64,
    /// LCS length (shared n-grams) over the reference's token (n-gram) count.
    pub recall: f64,
    /// Their harmonic mean; the score.
    pub fmeasure: f64,
}

/// Why ROUGE-L was not computed: the LCS table would exceed the work bound.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TooLong {
    /// Tokens in the input.
    pub input_tokens: usize,
    /// Tokens in the reference.
    pub reference_tokens: usize,
}

/// The most LCS cells (input tokens × reference tokens) one item may cost: 64 M cells is about
/// 0.1 s; two 8,000-token texts fit.
pub const MAX_LCS_CELLS: usize = 64 << 20;

/// rouge-score 0.1.2 `RougeScorer(["rougeL"]).score(reference, input)["rougeL"]`, default
/// tokenizer without stemming: lowercase, every run of characters other than `a-z0-9` is a
/// separator (so letters outside ASCII are dropped, as rouge-score does), then the longest common
/// subsequence of the token lists.
pub fn rouge_l(input: &str, reference: &str) -> Result<RougeL, TooLong> {
    let prediction = tokenize_rouge(input);
    let target = tokenize_rouge(reference);
    if prediction.is_empty() || target.is_empty() {
        return Ok(RougeL { precision: 0.0, recall: 0.0, fmeasure: 0.0 });
    }
    if prediction.len().saturating_mul(target.len()) > MAX_LCS_CELLS {
        return Err(TooLong { input_tokens: prediction.len(), reference_tokens: target.len() });
    }
    let lcs = lcs_length(&target, &prediction) as f64;
    let precision = lcs / prediction.len() as f64;
    let recall = lcs / target.len() as f64;
    let fmeasure =
        if precision + recall > 0.0 { 2.0 * precision * recall / (precision + recall) } else { 0.0 };
    Ok(RougeL { precision, recall, fmeasure })
}

/// rouge-score 0.1.2 `RougeScorer([f"rouge{n}"]).score(reference, input)[f"rouge{n}"]`: the
/// clipped count of `n`-grams the two token lists share, over the input's `n`-grams (precision)
/// and the reference's (recall), each count at least 1; same tokenizer as [`rouge_l`]. Linear in
/// the texts.
pub fn rouge_n(input: &str, reference: &str, n: usize) -> RougeL {
    let prediction = tokenize_rouge(input);
    let target = tokenize_rouge(reference);
    let counts = |tokens: &[String]| {
        let mut counts: HashMap<Vec<String>, usize> = HashMap::new();
        if n > 0 {
            for ngram in tokens.windows(n) {
                *counts.entry(ngram.to_vec()).or_insert(0) += 1;
            }
        }
        counts
    };
    let (target_counts, prediction_counts) = (counts(&target), counts(&prediction));
    let shared: usize = target_counts
        .iter()
        .map(|(ngram, count)| (*count).min(prediction_counts.get(ngram).copied().unwrap_or(0)))
        .sum();
    let precision = shared as f64 / prediction_counts.values().sum::<usize>().max(1) as f64;
    let recall = shared as f64 / target_counts.values().sum::<usize>().max(1) as f64;
    let fmeasure =
        if precision + recall > 0.0 { 2.0 * precision * recall / (precision + recall) } else { 0.0 };
    RougeL { precision, recall, fmeasure }
}

/// rouge-score's `tokenize.tokenize(text, stemmer=None)`.
pub fn tokenize_rouge(text: &str) -> Vec<String> {
    text.to_lowercase()
        .split(|c: char| !(c.is_ascii_lowercase() || c.is_ascii_digit()))
        .filter(|token| !token.is_empty())
        .map(str::to_owned)
        .collect()
}

/// The length of the longest common subsequence, in two rows of the usual table.
fn lcs_length(a: &[String], b: &[String]) -> usize {
    let mut previous = vec![0usize; b.len() + 1];
    let mut current = vec![0usize; b.len() + 1];
    for x in a {
        for (j, y) in b.iter().enumerate() {
            current[j + 1] = if x == y { previous[j] + 1 } else { previous[j + 1].max(current[j]) };
        }
        std::mem::swap(&mut previous, &mut current);
    }
    previous[b.len()]
}

/// Python's `str.isspace`: Unicode White_Space plus the four ASCII separators U+001C–U+001F,
/// which Python counts as whitespace and Rust's `char::is_whitespace` does not.
fn python_isspace(c: char) -> bool {
    c.is_whitespace() || ('\u{1c}'..='\u{1f}').contains(&c)
}

/// Python's `str.split()`: runs of whitespace separate, none at the ends.
fn python_split(text: &str) -> impl Iterator<Item = &str> {
    text.split(python_isspace).filter(|token| !token.is_empty())
}

/// Python's `str.rstrip()`.
fn python_rstrip(text: &str) -> &str {
    text.trim_end_matches(python_isspace)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_13a_tokenizer_splits_as_sacrebleu() {
        let cases: &[(&str, &[&str])] = &[
            ("Hello, world!", &["Hello", ",", "world", "!"]),
            ("It costs $3.50, or 3,000 yen.", &["It", "costs", "$", "3.50", ",", "or", "3,000", "yen", "."]),
            ("state-of-the-art 1990-2000", &["state-of-the-art", "1990", "-", "2000"]),
            ("a.. b", &["a", ".", ".", "b"]),
            ("&quot;x&quot; &amp; y", &["\"", "x", "\"", "&", "y"]),
            ("line-\nbreak\nnext", &["linebreak", "next"]),
            ("<skipped>kept", &["kept"]),
            ("tab\there\u{a0}nbsp\u{1c}sep", &["tab", "here", "nbsp", "sep"]),
            ("", &[]),
            ("   ", &[]),
            ("日本語のテキスト。", &["日本語のテキスト。"]),
        ];
        for (line, expected) in cases {
            assert_eq!(tokenize_13a(line), *expected, "{line:?}");
        }
    }

    #[test]
    fn the_rouge_tokenizer_keeps_ascii_letters_and_digits_only() {
        let cases: &[(&str, &[&str])] = &[
            ("The quick-brown FOX, 2x!", &["the", "quick", "brown", "fox", "2x"]),
            ("café naïve", &["caf", "na", "ve"]),
            ("İstanbul", &["i", "stanbul"]),
            ("\u{212a}elvin", &["kelvin"]),
            ("", &[]),
            ("!!!", &[]),
        ];
        for (text, expected) in cases {
            assert_eq!(tokenize_rouge(text), *expected, "{text:?}");
        }
    }

    #[test]
    fn known_scores() {
        assert_eq!(fuzzy_ratio("this is a test", "this is a test"), 1.0);
        assert!((fuzzy_ratio("this is a test", "this is a test!") - 28.0 / 29.0).abs() < 1e-12);
        assert_eq!(fuzzy_ratio("", ""), 1.0);
        assert_eq!(fuzzy_ratio("abc", ""), 0.0);
        let same = sentence_bleu("the cat sat on the mat", "the cat sat on the mat");
        assert!((same.score - 1.0).abs() < 1e-12, "{same:?}");
        assert_eq!(sentence_bleu("", "the cat").score, 0.0);
        assert_eq!(sentence_bleu("dog", "the cat").score, 0.0);
        let rouge = rouge_l("the cat sat", "the cat sat on the mat").unwrap();
        assert_eq!((rouge.precision, rouge.recall), (1.0, 0.5));
        assert!((rouge.fmeasure - 2.0 / 3.0).abs() < 1e-12);
        assert_eq!(rouge_l("", "x").unwrap().fmeasure, 0.0);
        let bigrams = rouge_n("the cat sat", "the cat sat on the mat", 2);
        assert_eq!((bigrams.precision, bigrams.recall), (1.0, 0.4));
        assert_eq!(rouge_n("a a a", "a", 1).precision, 1.0 / 3.0);
        assert_eq!(rouge_n("", "", 1).fmeasure, 0.0);
        let long = "w ".repeat(9000);
        assert_eq!(rouge_l(&long, &long), Err(TooLong { input_tokens: 9000, reference_tokens: 9000 }));
    }
}
