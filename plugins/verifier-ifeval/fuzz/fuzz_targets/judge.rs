//! Fuzz target: the first byte picks the mode (bit 0: loose), explanations (bit 1) and the think
//! tag (bit 2: none); the rest is split at the first newline into the reference JSON and the
//! completion, and goes through the plugin's public judging path (`from_config`, then `verify`:
//! reference parsing and every instruction's strict and loose check). Must never panic, and the
//! score must be finite and in [0, 1].
#![no_main]

use libfuzzer_sys::fuzz_target;
use rlvr_plugin_api::{VerifierPlugin, VerifyItem};
use rlvr_verifier_ifeval::IfevalVerifier;

fuzz_target!(|data: &[u8]| {
    let Some((&flags, rest)) = data.split_first() else { return };
    let Ok(text) = std::str::from_utf8(rest) else { return };
    let (reference, completion) = text.split_once('\n').unwrap_or((text, ""));
    let mode = if flags & 1 == 1 { "loose" } else { "strict" };
    let think = if flags & 4 == 4 { "" } else { "</think>" };
    let config = format!(r#"{{"mode": "{mode}", "think_close": "{think}"}}"#);
    let verifier = IfevalVerifier::from_config(&config).expect("valid config");
    let mut item = VerifyItem::new("fuzz", "", completion, reference);
    item.explain = flags & 2 == 2;
    let verdict = verifier.verify(&item).expect("verify answers with a verdict");
    assert!(verdict.score.is_finite() && (0.0..=1.0).contains(&verdict.score), "score {}", verdict.score);
    for component in verdict.components.iter() {
        assert!(component.value.is_finite() && (0.0..=1.0).contains(&component.value), "{component:?}");
    }
    if verdict.passed {
        assert!(verdict.error.is_none() && verdict.score == 1.0, "passed with score {}", verdict.score);
    }
});
