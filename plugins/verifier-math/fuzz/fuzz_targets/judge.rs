//! Fuzz target: any bytes, split at the first newline into a gold answer and a completion, through
//! extraction, parsing of both sides and the comparison, with explanations on. Must never panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rlvr_verifier_math::extract::Fallback;
use rlvr_verifier_math::{MathConfig, MathVerifier};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let (gold, completion) = text.split_once('\n').unwrap_or((text, text));
    let config = MathConfig { fallback: Fallback::Last, ..MathConfig::default() };
    let verifier = MathVerifier::new(config).expect("default config is valid");
    let _ = verifier.judge(completion, "", gold, 6, true);
});
