//! Stable-toolchain guard for what the fuzzer found: replays the seed corpus and every crash
//! or slow input the fuzzer reported (`fuzz/seeds/`, `fuzz/regressions/`), then a few thousand
//! seeded mutations of them, through the whole judge (extraction, parsing, comparison,
//! explanations) under a work budget. Nothing may panic, and verdicts must repeat exactly.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::Path;

use rlvr_verifier_math::extract::Fallback;
use rlvr_verifier_math::{MathConfig, MathVerifier};

/// Smaller than the default so the worst mutations stay fast in a debug build.
const BUDGET: u64 = 2_000_000;
const MUTATIONS: usize = 3_000;

const TOKENS: &[&str] = &[
    "\\boxed{",
    "\\frac{",
    "\\sqrt[",
    "}",
    "{",
    "(",
    ")",
    "[",
    "]",
    "\\{",
    "\\}",
    "^{",
    "_{",
    "\\left(",
    "\\right)",
    "\\le",
    "\\pm",
    "\\cup",
    "\\in",
    "\\\\",
    "&",
    "\\begin{pmatrix}",
    "\\end{pmatrix}",
    "!",
    "\\%",
    "^\\circ",
    "</think>",
    "<think>",
    "Final Answer:",
    "$",
    "{,}",
    ",\\!",
    "1e-30",
    "0.333333",
    " or ",
    "=",
    "<",
    "\\text{",
    "10^{10^{10}}",
    "99999999999999999999",
    "\\pi",
    "x",
    "\\sin",
    "\\log_",
    "/",
    "-",
    ",",
    ";",
    ":",
    "|",
    "é",
    "\u{c}",
];

fn inputs(dir: &Path) -> Vec<(String, String)> {
    let mut found = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else { return found };
    let mut paths: Vec<_> = entries.filter_map(|e| e.ok().map(|e| e.path())).collect();
    paths.sort();
    for path in paths {
        let bytes = std::fs::read(&path).unwrap_or_default();
        found.push((path.display().to_string(), String::from_utf8_lossy(&bytes).into_owned()));
    }
    found
}

/// SplitMix64: deterministic mutations on every platform.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: usize) -> usize {
        if n == 0 { 0 } else { (self.next() % n as u64) as usize }
    }
}

fn mutate(text: &str, other: &str, rng: &mut Rng) -> String {
    let mut chars: Vec<char> = text.chars().collect();
    for _ in 0..1 + rng.below(4) {
        let at = rng.below(chars.len() + 1);
        match rng.below(5) {
            0 => {
                let token = TOKENS[rng.below(TOKENS.len())];
                let times = if rng.below(8) == 0 { 1 + rng.below(300) } else { 1 };
                let insert: Vec<char> = token.repeat(times).chars().collect();
                chars.splice(at..at, insert);
            }
            1 => {
                let end = (at + 1 + rng.below(8)).min(chars.len());
                if at < end {
                    chars.drain(at..end);
                }
            }
            2 => {
                let end = (at + 1 + rng.below(16)).min(chars.len());
                let copy: Vec<char> = chars[at.min(end)..end].to_vec();
                chars.splice(at..at, copy);
            }
            3 => {
                if at < chars.len() {
                    chars[at] = char::from(b"0123456789x{}()\\^_,.$"[rng.below(21)]);
                }
            }
            _ => {
                let other: Vec<char> = other.chars().collect();
                let from = rng.below(other.len());
                let end = (from + rng.below(40)).min(other.len());
                chars.splice(at..at, other[from..end].iter().copied());
            }
        }
    }
    chars.into_iter().collect()
}

fn judge_all(verifier: &MathVerifier, label: &str, text: &str) -> (bool, bool, Option<String>) {
    let (gold, completion) = text.split_once('\n').unwrap_or((text, text));
    let result = catch_unwind(AssertUnwindSafe(|| verifier.judge(completion, "", gold, 6, true)));
    let verdict = result.unwrap_or_else(|_| panic!("panic on {label}: {text:?}"));
    (verdict.passed, verdict.timed_out, verdict.error.into_option().map(|e| e.into_string()))
}

#[test]
fn corpus_and_mutations_never_panic_and_repeat() {
    let config = MathConfig { fallback: Fallback::Last, work_budget: BUDGET, ..MathConfig::default() };
    let verifier = MathVerifier::new(config).unwrap();
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz");
    let mut corpus = inputs(&root.join("seeds"));
    assert!(corpus.len() >= 86, "seed corpus missing: {}", root.display());
    corpus.extend(inputs(&root.join("regressions")));
    for (label, text) in &corpus {
        let first = judge_all(&verifier, label, text);
        let second = judge_all(&verifier, label, text);
        assert_eq!(first, second, "verdict changed between runs on {label}");
    }
    let mut rng = Rng(0x0ddba11);
    for k in 0..MUTATIONS {
        let (_, base) = &corpus[rng.below(corpus.len())];
        let (_, other) = &corpus[rng.below(corpus.len())];
        let text = mutate(base, other, &mut rng);
        let label = format!("mutation {k}");
        let first = judge_all(&verifier, &label, &text);
        if k % 10 == 0 {
            assert_eq!(first, judge_all(&verifier, &label, &text), "verdict changed between runs: {text:?}");
        }
    }
}
