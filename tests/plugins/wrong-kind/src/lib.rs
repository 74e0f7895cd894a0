//! Fixture: a plugin of a kind the daemon does not know.

use rlvr_plugin_api::abi_stable::std_types::RResult;
use rlvr_plugin_api::{PluginError, PluginInfo, PluginModRef};

extern "C" fn info() -> RResult<PluginInfo, PluginError> {
    RResult::ROk(rlvr_fixture_support::info("reranker", "wrong-kind", rlvr_plugin_api::API_VERSION, None))
}

/// The library's root module.
#[abi_stable::export_root_module]
pub fn root_module() -> PluginModRef {
    rlvr_fixture_support::handwritten_module(info)
}
