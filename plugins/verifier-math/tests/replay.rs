//! Stable-toolchain guard for what the fuzzer found: replays the seed corpus and every crash
//! or slow input the fuzzer reported (`fuzz/seeds/`, `fuzz/regressions/`), then a few thousand
//! seeded mutations of them, through the fuzz target's own body (`fuzz/check.rs`: extraction,
//! parsing, comparison, explanations) under a work budget. Nothing may panic, and verdicts must
//! repeat exactly.

use std::path::Path;

use rlvr_fuzz_replay::{Mutations, corpus, replay};
use rlvr_verifier_math::extract::Fallback;
use rlvr_verifier_math::{MathConfig, MathVerifier};

#[path = "../fuzz/check.rs"]
mod check;

/// Smaller than the default so the worst mutations stay fast in a debug build.
const BUDGET: u64 = 2_000_000;

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

#[test]
fn corpus_and_mutations_never_panic_and_repeat() {
    let config = MathConfig { fallback: Fallback::Last, work_budget: BUDGET, ..MathConfig::default() };
    let verifier = MathVerifier::new(config).unwrap();
    let corpus = corpus(&Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz"));
    assert!(corpus.len() >= 86, "seed corpus missing");
    let tokens: Vec<String> = TOKENS.iter().map(|token| (*token).to_owned()).collect();
    let mutations = Mutations {
        count: 3_000,
        seed: 0x0ddba11,
        tokens: &tokens,
        bytes: b"0123456789x{}()\\^_,.$",
        keep_prefix: 0,
    };
    // Byte edits can split a multi-byte character; judge what a completion could be, its lossy text.
    replay(&corpus, &mutations, |data| check::judge(&verifier, String::from_utf8_lossy(data).as_bytes()));
}
