//! Fixture: the `legacy` verifier, its root module shaped as a library built before
//! `check_options` and `create_in` were appended: it loads, its options are not checked at
//! submit, and it is created with `create` (no host context). It scores every item `score` (1 by
//! default) and refuses unknown keys when created, so a test sees where its options are checked.

use rlvr_fixture_support::{LegacyMod, legacy_module};
use rlvr_plugin_api::{
    Metadata, PluginError, PluginModRef, Verdict, VerifierPlugin, VerifyItem, parse_options,
};
use serde::Deserialize;

#[derive(Deserialize)]
#[serde(deny_unknown_fields, default)]
struct Options {
    score: f64,
}

impl Default for Options {
    fn default() -> Self {
        Options { score: 1.0 }
    }
}

struct Legacy {
    score: f64,
}

impl VerifierPlugin for Legacy {
    fn metadata() -> Metadata {
        Metadata { name: "legacy", version: "1.0.0", description: "a verifier built before check_options" }
    }

    fn from_config(config_json: &str) -> Result<Self, PluginError> {
        let Options { score } = parse_options(config_json)?;
        Ok(Legacy { score })
    }

    fn verify(&self, item: &VerifyItem<'_>) -> Result<Verdict, PluginError> {
        Ok(Verdict::new(self.score, self.score > 0.0).extracted(item.completion.as_str()))
    }
}

/// The library's root module: the export layer's three prefix functions, without the rest.
#[abi_stable::export_root_module]
pub fn root_module() -> PluginModRef {
    let full = rlvr_plugin_api::export::verifier_module::<Legacy>();
    legacy_module(LegacyMod { info: full.info(), self_test: full.self_test(), create: full.create() })
}
