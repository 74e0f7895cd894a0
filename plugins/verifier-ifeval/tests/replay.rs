//! Stable-toolchain guard for what the fuzzer found: replays the seed corpus and every crash or
//! slow input the fuzzer reported (`fuzz/seeds/`, `fuzz/regressions/`), then seeded mutations of
//! them, through the fuzz target's own body (`fuzz/check.rs`): reference parsing and every
//! instruction's check. Nothing may panic, scores stay in [0, 1], and verdicts repeat exactly.

use std::path::Path;

use rlvr_fuzz_replay::{Mutations, corpus, replay};
use rlvr_verifier_ifeval::INSTRUCTION_IDS;

#[path = "../fuzz/check.rs"]
mod check;

const TOKENS: &[&str] = &[
    "{}",
    "null",
    "\"less than\"",
    "\"at least\"",
    "\n\n",
    "\n",
    "* ",
    "- ",
    "*x*",
    "**",
    "<<t>>",
    "P.S.",
    "P.P.S",
    "******",
    "SECTION 1",
    "[name]",
    "```json",
    "```",
    "\"",
    ",",
    ".",
    "!",
    "?",
    "Mr.",
    "</think>",
    "My answer is yes.",
    "ABC",
    "é",
    "日本語",
    "\t",
    "\r\n",
    "-1",
    "0",
    "99999999999999999999",
    "1e308",
    "[",
    "]",
    "{",
    "}",
    ":",
];

#[test]
fn corpus_and_mutations_never_panic_stay_bounded_and_repeat() {
    let corpus = corpus(&Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz"));
    assert!(corpus.len() >= 68, "seed corpus missing");
    // Instruction ids (quoted, as in a reference) are spliced in as often as the other tokens.
    let tokens: Vec<String> = TOKENS
        .iter()
        .map(|token| (*token).to_owned())
        .chain(INSTRUCTION_IDS.iter().map(|id| format!("\"{id}\"")))
        .collect();
    let mutations = Mutations {
        count: 600,
        seed: 0x1fe7a1,
        tokens: &tokens,
        bytes: b"0123456789\"{}[],:\n. *-",
        keep_prefix: 0,
    };
    let results = replay(&corpus, &mutations, check::judge);
    let judged = results
        .iter()
        .filter(|result| result.as_ref().is_some_and(|(_, _, error, _)| error.is_none()))
        .count();
    assert!(judged >= 68, "only {judged} inputs judged without error");
}
