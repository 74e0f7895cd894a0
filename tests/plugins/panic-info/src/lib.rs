//! Fixture: a verifier that panics in info().

use rlvr_plugin_api::{Metadata, PluginError, Verdict, VerifierPlugin, VerifyItem, export_verifier};

pub struct Fixture;

impl VerifierPlugin for Fixture {
    fn metadata() -> Metadata {
        panic!("metadata exploded")
    }

    fn from_config(_config_json: &str) -> Result<Self, PluginError> {
        Ok(Fixture)
    }

    fn verify(&self, _item: &VerifyItem<'_>) -> Result<Verdict, PluginError> {
        Ok(Verdict::new(1.0, true))
    }

    fn self_test() -> Result<(), PluginError> {
        Ok(())
    }
}

export_verifier!(Fixture);
