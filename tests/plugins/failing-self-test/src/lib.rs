//! Fixture: a verifier whose self-test fails.

use rlvr_plugin_api::{Metadata, PluginError, Verdict, VerifierPlugin, VerifyItem, export_verifier};

pub struct Fixture;

impl VerifierPlugin for Fixture {
    fn metadata() -> Metadata {
        Metadata {
            name: "failing-self-test",
            version: "0.1.0",
            description: "a verifier whose self-test fails",
        }
    }

    fn from_config(_config_json: &str) -> Result<Self, PluginError> {
        Ok(Fixture)
    }

    fn verify(&self, _item: &VerifyItem<'_>) -> Result<Verdict, PluginError> {
        Ok(Verdict::new(1.0, true))
    }

    fn self_test() -> Result<(), PluginError> {
        Err(PluginError::self_test_failed("expected score 1 for a known-good answer, got 0"))
    }
}

export_verifier!(Fixture);
