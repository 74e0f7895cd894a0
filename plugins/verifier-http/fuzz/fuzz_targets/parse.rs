//! Fuzz target: the untrusted inputs of the http verifier. The first byte picks the parser: even,
//! the rest is a service's response body for `response::parse_response`; odd, it is the plugin's
//! JSON config for `config::parse` (environment variables read as their own name, but `UNSET`
//! as unset). Must never panic; an accepted response must hold what the validation promises.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rlvr_verifier_http::{config, response};

fuzz_target!(|data: &[u8]| {
    let Some((&which, rest)) = data.split_first() else { return };
    if which & 1 == 0 {
        if let Ok(verdict) = response::parse_response(rest) {
            assert!(verdict.score.is_finite(), "score {}", verdict.score);
            assert!(verdict.components.len() <= response::MAX_COMPONENTS);
            for (name, value) in &verdict.components {
                assert!(value.is_finite(), "{name}: {value}");
                assert!(!name.starts_with(response::RESERVED_PREFIX), "{name}");
                assert!(name.len() <= response::MAX_COMPONENT_NAME, "{name}");
            }
        }
    } else {
        let Ok(json) = std::str::from_utf8(rest) else { return };
        let env = |name: &str| (name != "UNSET").then(|| name.to_owned());
        if let Ok(settings) = config::parse(json, env) {
            assert!(settings.item_budget().as_millis() <= u128::from(config::MAX_ITEM_BUDGET_MS));
            assert!(settings.retries <= config::MAX_RETRIES);
        }
    }
});
