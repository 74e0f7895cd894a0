//! Fuzz target: the untrusted inputs of the http verifier (see `../check.rs`, its body, which
//! the stable replay test shares).
#![no_main]

use libfuzzer_sys::fuzz_target;

#[path = "../check.rs"]
mod check;

fuzz_target!(|data: &[u8]| {
    let _ = check::parse(data);
});
