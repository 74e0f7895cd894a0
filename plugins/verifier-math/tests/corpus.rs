//! The answer corpus (`tests/corpus/*.jsonl`) and the shared dev cases, through the plugin's own
//! judge: every corpus case must get its expected verdict in both modes (`fallback = "last"`
//! for evaluation, `"none"` for training), every dev case its expected verdict in evaluation
//! mode, and the README's table of counts per category must match the corpus.
//!
//! The corpus is ours, grown from cited answer conventions (the plugin README lists them); its
//! verdicts are decided by the mathematics, not by what this verifier or another one says.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use rlvr_verifier_math::extract::Fallback;
use rlvr_verifier_math::{MathConfig, MathVerifier};
use serde::Deserialize;

/// One corpus line.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Case {
    id: String,
    category: String,
    source: String,
    gold: String,
    pred: String,
    /// The verdict with `fallback = "last"`.
    expected: bool,
    /// The verdict with `fallback = "none"`.
    expected_none: bool,
    /// Why the verdict is what it is, when it is not obvious.
    #[serde(default)]
    note: Option<String>,
}

/// One dev line (the shared Math-Verify dev cases; extra fields are theirs).
#[derive(Debug, Deserialize)]
struct DevCase {
    id: String,
    gold: String,
    pred: String,
    expected: bool,
}

fn manifest() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn corpus_files() -> Vec<PathBuf> {
    let dir = manifest().join("tests/corpus");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "jsonl"))
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no corpus files in {}", dir.display());
    files
}

fn read_lines<T: for<'de> Deserialize<'de>>(path: &Path) -> Vec<T> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    text.lines()
        .enumerate()
        .filter(|(_, line)| !line.trim().is_empty())
        .map(|(n, line)| {
            serde_json::from_str(line).unwrap_or_else(|e| panic!("{}:{}: {e}", path.display(), n + 1))
        })
        .collect()
}

fn corpus() -> Vec<Case> {
    corpus_files().iter().flat_map(|path| read_lines::<Case>(path)).collect()
}

fn verifier(fallback: Fallback) -> MathVerifier {
    MathVerifier::new(MathConfig { fallback, ..MathConfig::default() }).unwrap()
}

/// Judges `pred` against `gold` and says how it went when the verdict is not `expected`.
fn check(
    verifier: &MathVerifier,
    mode: &str,
    id: &str,
    gold: &str,
    pred: &str,
    expected: bool,
) -> Option<String> {
    let verdict = verifier.judge(pred, "", gold, 6, true);
    if verdict.error.is_some() || verdict.passed != expected {
        let why: Vec<String> = verdict.explanation.iter().map(|line| line.to_string()).collect();
        return Some(format!(
            "{id} ({mode}): expected {expected}, got {} (error {:?})\n  gold {gold:?}\n  pred {pred:?}\n  {}",
            verdict.passed,
            verdict.error,
            why.join("\n  ")
        ));
    }
    None
}

#[test]
fn every_corpus_case_gets_its_verdict_in_both_modes() {
    let cases = corpus();
    let (last, none) = (verifier(Fallback::Last), verifier(Fallback::None));
    let mut failures = Vec::new();
    for case in &cases {
        failures.extend(check(&last, "last", &case.id, &case.gold, &case.pred, case.expected));
        failures.extend(check(&none, "none", &case.id, &case.gold, &case.pred, case.expected_none));
    }
    assert!(
        failures.is_empty(),
        "{} of {} corpus checks failed:\n{}",
        failures.len(),
        2 * cases.len(),
        failures.join("\n")
    );
}

#[test]
fn every_dev_case_gets_its_verdict() {
    let path = manifest().join("../../tests/data/verifier_math/math-dev.jsonl");
    let cases: Vec<DevCase> = read_lines(&path);
    assert_eq!(cases.len(), 86);
    let last = verifier(Fallback::Last);
    let failures: Vec<String> = cases
        .iter()
        .filter_map(|case| check(&last, "last", &case.id, &case.gold, &case.pred, case.expected))
        .collect();
    assert!(failures.is_empty(), "{} of 86 dev cases failed:\n{}", failures.len(), failures.join("\n"));
}

/// The corpus is well formed: unique ids, a known category and a source on every line, and
/// both verdicts present in every category (a category of only passes cannot catch a hack).
#[test]
fn corpus_is_well_formed() {
    let cases = corpus();
    let mut ids = BTreeSet::new();
    for case in &cases {
        assert!(ids.insert(case.id.as_str()), "duplicate id {}", case.id);
        assert!(!case.source.trim().is_empty(), "{}: empty source", case.id);
        assert!(
            case.category.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
                && !case.category.is_empty(),
            "{}: category {:?} is not kebab-case",
            case.id,
            case.category
        );
        assert!(case.note.as_deref().is_none_or(|n| !n.trim().is_empty()), "{}: empty note", case.id);
        // Training mode is never more lenient than evaluation mode.
        assert!(!case.expected_none || case.expected, "{}: passes only without the fallback", case.id);
    }
}

/// The README's table of counts per category is the corpus's.
#[test]
fn readme_counts_match_the_corpus() {
    let mut counts: BTreeMap<String, (usize, usize)> = BTreeMap::new();
    for case in corpus() {
        let entry = counts.entry(case.category).or_default();
        entry.0 += 1;
        entry.1 += usize::from(case.expected);
    }
    let readme = std::fs::read_to_string(manifest().join("README.md")).unwrap();
    let start = readme.find("<!-- corpus-counts -->").expect("README: corpus-counts marker");
    let mut table: BTreeMap<String, (usize, usize)> = BTreeMap::new();
    for line in readme[start..].lines().skip(1).skip_while(|l| l.trim().is_empty()).skip(2) {
        if !line.starts_with('|') {
            break;
        }
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        let name = cells[1].trim_matches('`').to_owned();
        if name == "total" || name == "**total**" {
            continue;
        }
        let number =
            |cell: &str| cell.trim_matches('*').parse::<usize>().unwrap_or_else(|e| panic!("{line}: {e}"));
        table.insert(name, (number(cells[2]), number(cells[3])));
    }
    assert_eq!(table, counts, "README table (category → cases, expected to pass) against the corpus");
}
