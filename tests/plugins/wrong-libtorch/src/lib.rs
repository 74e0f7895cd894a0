//! Fixture: an optimizer plugin built against another libtorch.

use rlvr_plugin_api::abi_stable::std_types::RResult;
use rlvr_plugin_api::{API_VERSION, DataMode, OptimizerInfo, PluginError, PluginInfo, PluginModRef};

extern "C" fn info() -> RResult<PluginInfo, PluginError> {
    let optimizer = OptimizerInfo {
        data_mode: DataMode::OnlineGroups,
        needs_reference: true,
        needs_value_head: false,
        needs_groups: true,
        libtorch_version: "2.3.0".into(),
    };
    RResult::ROk(rlvr_fixture_support::info("optimizer", "wrong-libtorch", API_VERSION, Some(optimizer)))
}

/// The library's root module.
#[abi_stable::export_root_module]
pub fn root_module() -> PluginModRef {
    rlvr_fixture_support::handwritten_module(info)
}
