//! The body of the ifeval verifier's fuzz target, shared with the stable replay test
//! (`tests/replay.rs`) so both check exactly the same things. The first byte picks the mode (bit
//! 0: loose), explanations (bit 1) and the think tag (bit 2: none); the rest is split at the first
//! newline into the reference JSON and the completion, and goes through the plugin's public
//! judging path (`from_config`, then `verify`). Must never panic; the score and every component
//! must be finite and in [0, 1]; a passed item has score 1 and no error.

use rlvr_plugin_api::{VerifierPlugin, VerifyItem};
use rlvr_verifier_ifeval::IfevalVerifier;

/// Score, passed, error and components (as bits), to check that verdicts repeat exactly.
pub type Outcome = (String, bool, Option<String>, Vec<(String, u64)>);

/// The verdict, or `None` for inputs the target skips.
pub fn judge(data: &[u8]) -> Option<Outcome> {
    let (&flags, rest) = data.split_first()?;
    let text = std::str::from_utf8(rest).ok()?;
    let (reference, completion) = text.split_once('\n').unwrap_or((text, ""));
    let mode = if flags & 1 == 1 { "loose" } else { "strict" };
    let think = if flags & 4 == 4 { "" } else { "</think>" };
    let config = format!(r#"{{"mode": "{mode}", "think_close": "{think}"}}"#);
    let verifier = IfevalVerifier::from_config(&config).expect("valid config");
    let mut item = VerifyItem::new("fuzz", "", completion, reference);
    item.explain = flags & 2 == 2;
    let verdict = verifier.verify(&item).expect("verify answers with a verdict");
    let score = verdict.score;
    assert!(score.is_finite() && (0.0..=1.0).contains(&score), "score {score}");
    for component in verdict.components.iter() {
        assert!(component.value.is_finite() && (0.0..=1.0).contains(&component.value), "{component:?}");
    }
    if verdict.passed {
        assert!(verdict.error.is_none() && score == 1.0, "passed with score {score}");
    }
    let components = verdict.components.iter().map(|c| (c.name.to_string(), c.value.to_bits())).collect();
    Some((
        score.to_string(),
        verdict.passed,
        verdict.error.into_option().map(|e| e.into_string()),
        components,
    ))
}
