//! Fixture: version 1.0.0 of the `echo` verifier; it scores every item 1.0 so a test can tell
//! which version answered.

use rlvr_plugin_api::{Metadata, PluginError, Verdict, VerifierPlugin, VerifyItem, export_verifier};

pub struct Echo;

impl VerifierPlugin for Echo {
    fn metadata() -> Metadata {
        Metadata { name: "echo", version: "1.0.0", description: "scores every item 1.0" }
    }

    fn from_config(_config_json: &str) -> Result<Self, PluginError> {
        Ok(Echo)
    }

    fn verify(&self, item: &VerifyItem<'_>) -> Result<Verdict, PluginError> {
        Ok(Verdict::new(1.0, true).extracted(item.completion.as_str()))
    }
}

export_verifier!(Echo);
