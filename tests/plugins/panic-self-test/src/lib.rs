//! Fixture: a verifier that panics in its self-test.

use rlvr_plugin_api::{Metadata, PluginError, Verdict, VerifierPlugin, VerifyItem, export_verifier};

pub struct Fixture;

impl VerifierPlugin for Fixture {
    fn metadata() -> Metadata {
        Metadata {
            name: "panic-self-test",
            version: "0.1.0",
            description: "a verifier that panics in its self-test",
        }
    }

    fn from_config(_config_json: &str) -> Result<Self, PluginError> {
        Ok(Fixture)
    }

    fn verify(&self, _item: &VerifyItem<'_>) -> Result<Verdict, PluginError> {
        Ok(Verdict::new(1.0, true))
    }

    fn self_test() -> Result<(), PluginError> {
        panic!("self-test exploded")
    }
}

export_verifier!(Fixture);
