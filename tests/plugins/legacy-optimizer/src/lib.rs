//! Fixture: an optimizer library as built before `rlvr_optimizer_trains` existed — a root module
//! and nothing beside it. The loader takes it for a policy trainer.

use rlvr_plugin_api::abi_stable::std_types::RResult;
use rlvr_plugin_api::{
    API_VERSION, DataMode, LIBTORCH_VERSION, OptimizerInfo, PluginError, PluginInfo, PluginModRef,
};

extern "C" fn info() -> RResult<PluginInfo, PluginError> {
    let optimizer = OptimizerInfo {
        data_mode: DataMode::OfflinePairs,
        needs_reference: true,
        needs_value_head: false,
        needs_groups: false,
        libtorch_version: LIBTORCH_VERSION.into(),
    };
    RResult::ROk(rlvr_fixture_support::info("optimizer", "legacy-optimizer", API_VERSION, Some(optimizer)))
}

/// The library's root module.
#[abi_stable::export_root_module]
pub fn root_module() -> PluginModRef {
    rlvr_fixture_support::handwritten_module(info)
}
