//! Fixture: a plugin of a kind the daemon does not know. Writes its root module by hand to report what the export layer never would.

use rlvr_plugin_api::abi_stable::prefix_type::PrefixTypeTrait;
use rlvr_plugin_api::abi_stable::std_types::{ROption, RResult, RSlice, RStr, RString};
use rlvr_plugin_api::{PluginError, PluginInfo, PluginInstance, PluginMod, PluginModRef};

extern "C" fn info() -> RResult<PluginInfo, PluginError> {
    RResult::ROk(PluginInfo {
        kind: "reranker".into(),
        name: "wrong-kind".into(),
        version: "0.1.0".into(),
        api_version: rlvr_plugin_api::API_VERSION,
        description: "a plugin of a kind the daemon does not know".into(),
        verifier: ROption::RNone,
        optimizer: ROption::RNone,
        curriculum: ROption::RNone,
    })
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

/// The library's root module.
#[abi_stable::export_root_module]
pub fn root_module() -> PluginModRef {
    PluginMod { info, self_test, create }.leak_into_prefix()
}
