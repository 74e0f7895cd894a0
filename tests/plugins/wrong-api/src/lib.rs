//! Fixture: a plugin built against another `API_VERSION`.

use rlvr_plugin_api::abi_stable::std_types::RResult;
use rlvr_plugin_api::{PluginError, PluginInfo, PluginModRef};

extern "C" fn info() -> RResult<PluginInfo, PluginError> {
    RResult::ROk(rlvr_fixture_support::info("verifier", "wrong-api", 999, None))
}

/// The library's root module.
#[abi_stable::export_root_module]
pub fn root_module() -> PluginModRef {
    rlvr_fixture_support::handwritten_module(info)
}
