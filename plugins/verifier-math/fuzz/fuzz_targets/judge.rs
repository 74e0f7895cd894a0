//! Fuzz target: any bytes through the whole math judge (see `../check.rs`, its body, which the
//! stable replay test shares), with the default work budget.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rlvr_verifier_math::extract::Fallback;
use rlvr_verifier_math::{MathConfig, MathVerifier};

#[path = "../check.rs"]
mod check;

fuzz_target!(|data: &[u8]| {
    let config = MathConfig { fallback: Fallback::Last, ..MathConfig::default() };
    let verifier = MathVerifier::new(config).expect("default config is valid");
    let _ = check::judge(&verifier, data);
});
