//! The body of the http verifier's fuzz target, shared with the stable replay test
//! (`tests/replay.rs`) so both check exactly the same things. The first byte picks the parser:
//! even, the rest is a service's response body for `response::parse_response`; odd, it is the
//! plugin's JSON config for `config::parse`, then `Options::settings` with a host context that
//! holds the named secret (its value is its own name), unless it is named `UNSET`. Must never
//! panic; an accepted response or config must hold what the validation promises.

use rlvr_verifier_http::config::{self, HostContext, Secret};
use rlvr_verifier_http::response;

/// The parse result as text, to check that results repeat; `None` for inputs the target skips.
pub fn parse(data: &[u8]) -> Option<String> {
    let (&which, rest) = data.split_first()?;
    if which & 1 == 0 {
        let parsed = response::parse_response(rest);
        if let Ok(verdict) = &parsed {
            assert!(verdict.score.is_finite(), "score {}", verdict.score);
            assert!(verdict.components.len() <= response::MAX_COMPONENTS);
            for (name, value) in &verdict.components {
                assert!(value.is_finite(), "{name}: {value}");
                assert!(!name.starts_with(response::RESERVED_PREFIX), "{name}");
                assert!(name.len() <= response::MAX_COMPONENT_NAME, "{name}");
            }
        }
        Some(format!("{parsed:?}"))
    } else {
        let json = std::str::from_utf8(rest).ok()?;
        let parsed = config::parse(json).and_then(|options| {
            let mut host = HostContext::default();
            for secret in options.report().secrets.into_iter().filter(|secret| secret.name != "UNSET") {
                host.secrets.insert(secret.name.clone(), Secret::new(secret.name));
            }
            options.settings(&host)
        });
        if let Ok(settings) = &parsed {
            assert!(settings.item_budget().as_millis() <= u128::from(config::MAX_ITEM_BUDGET_MS));
            assert!(settings.limits.retries <= config::MAX_RETRIES);
        }
        Some(format!("{parsed:?}"))
    }
}
