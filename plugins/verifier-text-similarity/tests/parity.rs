//! Parity with the Python reference implementations: rapidfuzz's `fuzz.ratio`, sacrebleu's
//! `sentence_bleu` and rouge-score's ROUGE-L and ROUGE-1 to ROUGE-5, run by `tests/reference.py` in the venv of
//! `scripts/text-metrics-venv.sh`, on a table of pairs chosen to reach every branch of the
//! tokenizers and the smoothing: Unicode, empty texts, punctuation, numbers, repeated words.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use rlvr_verifier_text_similarity::metrics::{fuzzy_ratio, rouge_l, rouge_n, sentence_bleu};
use serde_json::Value;

/// Floats may differ in the last bits where the two sides round differently (`fuzz.ratio` is
/// scaled by 100 and back; `exp` and `ln` come from the same libm); 1e-12 is far below any
/// threshold a team would set.
const TOLERANCE: f64 = 1e-12;

/// (input, reference): the hypothesis first, as the grader passes them.
const PAIRS: &[(&str, &str)] = &[
    ("the cat sat on the mat", "the cat sat on the mat"),
    ("the cat sat on the mat", "the cat is on the mat"),
    ("The cat sat on the mat.", "the cat sat on the mat"),
    ("a cat", "the cat sat on the mat"),
    ("cat", "the cat sat on the mat"),
    ("", ""),
    ("", "the reference"),
    ("the hypothesis", ""),
    ("   ", "  "),
    ("the the the the the the the", "the cat is on the mat"),
    ("on the mat the cat sat", "the cat sat on the mat"),
    ("It costs $3.50, or 3,000 yen.", "It costs $3.50 or 3000 yen"),
    ("state-of-the-art results in 1990-2000", "state of the art results from 1990 to 2000"),
    ("Hello, world!!! How are you???", "Hello world. How are you?"),
    ("&quot;quoted&quot; &amp; escaped &lt;tag&gt;", "\"quoted\" & escaped <tag>"),
    ("line one-\ncontinued\nline two", "line onecontinued line two"),
    ("<skipped> kept words here", "kept words here"),
    ("café naïve résumé", "cafe naive resume"),
    ("Ünïcödé façade", "Unicode facade"),
    ("日本語のテキストです。", "日本語のテキストです。"),
    ("日本語 の テキスト", "日本語 の 文章"),
    ("Привет, мир! Как дела?", "Привет мир как дела"),
    ("ΟΔΟΣ οδός", "οδος ΟΔΟΣ"),
    ("İstanbul is big", "istanbul is big"),
    ("emoji 😀 party 🎉 time", "emoji party time 🎉"),
    ("tabs\tand\u{a0}non-breaking\u{2003}spaces", "tabs and non-breaking spaces"),
    ("sep\u{1c}arated\u{1f}fields", "sep arated fields"),
    ("x = 5 + 5 + 1 = 11", "x = 11"),
    ("\\boxed{42}", "42"),
    ("The answer is 42.", "42"),
    ("42", "The answer is 42."),
    ("a b c d e f g h i j k l m n o p", "a b c d x f g h i j y l m n o p"),
    ("one two three four five six", "six five four three two one"),
    ("Machine learning is fun and machine learning is useful", "machine learning is useful and fun"),
    ("A quick brown fox jumps over the lazy dog", "The quick brown fox jumped over the lazy dogs"),
    ("repeated repeated repeated words words", "repeated words"),
    ("UPPER CASE TEXT", "upper case text"),
    ("trailing spaces   \n\n", "trailing spaces"),
    ("1,000,000.50 dollars", "1000000.50 dollars"),
    (
        "e-mail: someone@example.com; url: https://example.com/a?b=c",
        "email someone@example.com url https://example.com/a?b=c",
    ),
    ("(parenthesized) [bracketed] {braced}", "parenthesized bracketed braced"),
    ("K\u{212a}elvin", "kkelvin"),
];

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The venv's python: the set-up script makes it on the first run and prints its path.
fn python() -> PathBuf {
    let out = Command::new("bash")
        .arg(workspace_root().join("scripts/text-metrics-venv.sh"))
        .output()
        .expect("run scripts/text-metrics-venv.sh");
    assert!(out.status.success(), "text-metrics-venv.sh failed:\n{}", String::from_utf8_lossy(&out.stderr));
    PathBuf::from(String::from_utf8(out.stdout).expect("a path").trim())
}

/// What the Python libraries say for every pair.
fn reference_scores() -> Vec<Value> {
    let mut child = Command::new(python())
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/reference.py"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start reference.py");
    let pairs: Vec<[&str; 2]> = PAIRS.iter().map(|(a, b)| [*a, *b]).collect();
    child.stdin.take().expect("stdin").write_all(serde_json::to_string(&pairs).unwrap().as_bytes()).unwrap();
    let out = child.wait_with_output().expect("reference.py");
    assert!(out.status.success(), "reference.py failed:\n{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("reference.py's JSON")
}

/// Checks one number against the reference's; returns the difference.
fn close(what: &str, pair: &(&str, &str), ours: f64, theirs: &Value) -> f64 {
    let theirs = theirs.as_f64().unwrap_or_else(|| panic!("{what} {pair:?}: not a number: {theirs}"));
    let difference = (ours - theirs).abs();
    assert!(difference <= TOLERANCE, "{what} {pair:?}: ours {ours}, reference {theirs}");
    difference
}

#[test]
fn every_metric_agrees_with_its_python_reference() {
    assert!(PAIRS.len() >= 30);
    let expected = reference_scores();
    assert_eq!(expected.len(), PAIRS.len());
    let mut worst = [0.0f64; 4];
    for (pair, theirs) in PAIRS.iter().zip(&expected) {
        let (input, reference) = *pair;
        worst[0] =
            worst[0].max(close("fuzzy_match", pair, fuzzy_ratio(input, reference), &theirs["fuzzy_match"]));

        let bleu = sentence_bleu(input, reference);
        worst[1] = worst[1].max(close("bleu", pair, bleu.score, &theirs["bleu"]));
        for (n, precision) in bleu.precisions.iter().enumerate() {
            close(&format!("bleu precision {}", n + 1), pair, *precision, &theirs["precisions"][n]);
        }
        close("bleu brevity penalty", pair, bleu.brevity_penalty, &theirs["brevity_penalty"]);
        assert_eq!(bleu.input_tokens as u64, theirs["input_tokens"].as_u64().unwrap(), "{pair:?}");
        assert_eq!(bleu.reference_tokens as u64, theirs["reference_tokens"].as_u64().unwrap(), "{pair:?}");

        let rouge = rouge_l(input, reference).expect("short pairs");
        close("rouge_l precision", pair, rouge.precision, &theirs["rouge_l"][0]);
        close("rouge_l recall", pair, rouge.recall, &theirs["rouge_l"][1]);
        worst[2] = worst[2].max(close("rouge_l fmeasure", pair, rouge.fmeasure, &theirs["rouge_l"][2]));

        for n in 1..=5 {
            let rouge = rouge_n(input, reference, n);
            let theirs = &theirs["rouge_n"][n - 1];
            close(&format!("rouge_{n} precision"), pair, rouge.precision, &theirs[0]);
            close(&format!("rouge_{n} recall"), pair, rouge.recall, &theirs[1]);
            worst[3] = worst[3].max(close(&format!("rouge_{n} fmeasure"), pair, rouge.fmeasure, &theirs[2]));
        }
    }
    // The README's parity numbers.
    eprintln!(
        "{} pairs; largest difference: fuzzy_match {:e}, bleu {:e}, rouge_l {:e}, rouge_1..5 {:e}",
        PAIRS.len(),
        worst[0],
        worst[1],
        worst[2],
        worst[3]
    );
}
