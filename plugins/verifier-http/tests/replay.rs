//! Stable-toolchain guard for what the fuzzer found: replays the seed corpus and every crash or
//! slow input the fuzzer reported (`fuzz/seeds/`, `fuzz/regressions/`), then seeded mutations of
//! them, through the fuzz target's own body (`fuzz/check.rs`): the two untrusted-input parsers.
//! Nothing may panic, an accepted response must hold what the validation promises, and results
//! must repeat.

use std::path::Path;

use rlvr_fuzz_replay::{Mutations, corpus, replay};

#[path = "../fuzz/check.rs"]
mod check;

const TOKENS: &[&str] = &[
    "\"score\":",
    "\"passed\":",
    "\"components\":",
    "\"extracted\":",
    "\"error\":",
    "\"explanation\":",
    "true",
    "false",
    "null",
    "NaN",
    "1e999",
    "-0",
    "\"http_",
    "{",
    "}",
    "[",
    "]",
    ",",
    ":",
    "\"\\ud800\"",
    "\"url\":",
    "\"timeout_ms\":",
    "\"retries\":",
    "\"backoff_max_ms\":",
    "\"retry_on\":",
    "\"headers\":",
    "\"bearer_token_secret\":",
    "\"bearer_token_env\":",
    "\"max_response_bytes\":",
    "\"5xx\"",
    "\"http://",
    "[::1]",
    "@",
    "\"Authorization\"",
    "\"UNSET\"",
    "18446744073709551615",
    "4294967295",
    "-1",
    "\r\n",
    "é",
];

#[test]
fn corpus_and_mutations_never_panic_and_repeat() {
    let corpus = corpus(&Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz"));
    assert!(corpus.len() >= 50, "seed corpus missing");
    let tokens: Vec<String> = TOKENS.iter().map(|token| (*token).to_owned()).collect();
    // The selector byte is kept: a mutation stays a response or a config.
    let mutations = Mutations {
        count: 5_000,
        seed: 0x477e57,
        tokens: &tokens,
        bytes: b"0123456789\"{}[],:.-e\\",
        keep_prefix: 1,
    };
    let results = replay(&corpus, &mutations, check::parse);
    let accepted =
        results.iter().filter(|result| result.as_ref().is_some_and(|r| r.starts_with("Ok"))).count();
    assert!(accepted >= 10, "only {accepted} seeds accepted");
}
