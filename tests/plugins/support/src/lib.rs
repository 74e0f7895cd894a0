//! Shared pieces of the fixture plugins: a hand-written root module for fixtures that must report
//! what the export macros never would (another API version, an unknown kind, another libtorch),
//! and the `echo` verifier that two fixtures export under two versions.

use rlvr_plugin_api::abi_stable::prefix_type::PrefixTypeTrait;
use rlvr_plugin_api::abi_stable::std_types::{ROption, RResult, RSlice, RStr, RString};
use rlvr_plugin_api::{
    Metadata, OptimizerInfo, PluginError, PluginInfo, PluginInstance, PluginMod, PluginModRef, Verdict,
    VerifierPlugin, VerifyItem,
};

/// The info a hand-written fixture reports.
pub fn info(kind: &str, name: &str, api_version: u32, optimizer: Option<OptimizerInfo>) -> PluginInfo {
    PluginInfo {
        kind: kind.into(),
        name: name.into(),
        version: "0.1.0".into(),
        api_version,
        description: "a fixture that reports what the export layer never would".into(),
        verifier: ROption::RNone,
        optimizer: optimizer.into(),
        curriculum: ROption::RNone,
        notes: Default::default(),
    }
}

extern "C" fn self_test() -> RResult<(), PluginError> {
    RResult::ROk(())
}

extern "C" fn create(
    _config: RStr<'_>,
    _prompts: RSlice<'_, RString>,
) -> RResult<PluginInstance, PluginError> {
    RResult::RErr(PluginError::internal("this fixture creates nothing"))
}

/// A root module around the fixture's own `info` function.
pub fn handwritten_module(info: extern "C" fn() -> RResult<PluginInfo, PluginError>) -> PluginModRef {
    PluginMod { info, self_test, create }.leak_into_prefix()
}

/// The `echo` verifier, version `MAJOR`.0.0: scores every item `MAJOR`, so a test can tell which
/// version answered.
pub struct Echo<const MAJOR: u8>;

impl<const MAJOR: u8> VerifierPlugin for Echo<MAJOR> {
    fn metadata() -> Metadata {
        let version = match MAJOR {
            1 => "1.0.0",
            _ => "2.0.0",
        };
        Metadata { name: "echo", version, description: "scores every item with its major version" }
    }

    fn from_config(_config_json: &str) -> Result<Self, PluginError> {
        Ok(Echo)
    }

    fn verify(&self, item: &VerifyItem<'_>) -> Result<Verdict, PluginError> {
        Ok(Verdict::new(f64::from(MAJOR), true).extracted(item.completion.as_str()))
    }
}
