//! Fixture: an optimizer library whose `rlvr_optimizer_trains` names a model no host knows
//! (`critic`): the loader refuses it by that name.

use rlvr_plugin_api::abi_stable::std_types::RResult;
use rlvr_plugin_api::{
    API_VERSION, DataMode, LIBTORCH_VERSION, OptimizerInfo, PluginError, PluginInfo, PluginModRef,
};

extern "C" fn info() -> RResult<PluginInfo, PluginError> {
    let optimizer = OptimizerInfo {
        data_mode: DataMode::OfflinePairs,
        needs_reference: false,
        needs_value_head: false,
        needs_groups: false,
        libtorch_version: LIBTORCH_VERSION.into(),
    };
    RResult::ROk(rlvr_fixture_support::info("optimizer", "unknown-trains", API_VERSION, Some(optimizer)))
}

/// The library's root module.
#[abi_stable::export_root_module]
pub fn root_module() -> PluginModRef {
    rlvr_fixture_support::handwritten_module(info)
}

/// What it says it trains.
#[unsafe(no_mangle)]
pub extern "C" fn rlvr_optimizer_trains() -> *const std::ffi::c_char {
    c"critic".as_ptr()
}
