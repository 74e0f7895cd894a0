//! The body of the math verifier's fuzz target, shared with the stable replay test
//! (`tests/replay.rs`): any text, split at the first newline into a gold answer and a completion,
//! through extraction, parsing of both sides and the comparison, with explanations on. Must
//! never panic.

use rlvr_verifier_math::MathVerifier;

/// Passed, timed out and error, to check that verdicts repeat exactly; `None` for bytes that are
/// not UTF-8 (a completion always is).
pub fn judge(verifier: &MathVerifier, data: &[u8]) -> Option<(bool, bool, Option<String>)> {
    let text = std::str::from_utf8(data).ok()?;
    let (gold, completion) = text.split_once('\n').unwrap_or((text, text));
    let verdict = verifier.judge(completion, "", gold, 6, true);
    Some((verdict.passed, verdict.timed_out, verdict.error.into_option().map(|e| e.into_string())))
}
