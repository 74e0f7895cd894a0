//! The root module every plugin library exports, and what it creates.

use abi_stable::StableAbi;
use abi_stable::declare_root_module_statics;
use abi_stable::library::RootModule;
use abi_stable::package_version_strings;
use abi_stable::sabi_types::VersionStrings;
use abi_stable::std_types::{RResult, RSlice, RStr, RString};

use crate::{CurriculumBox, OptimizerBox, PluginError, PluginInfo, PluginKind, VerifierBox};

/// A plugin object, created from a configuration.
#[repr(C)]
#[derive(StableAbi)]
pub enum PluginInstance {
    /// A verifier.
    Verifier(VerifierBox),
    /// An optimizer.
    Optimizer(OptimizerBox),
    /// A curriculum.
    Curriculum(CurriculumBox),
}

impl PluginInstance {
    /// The kind of object this is; a loader compares it with [`PluginInfo::kind`].
    pub fn kind(&self) -> PluginKind {
        match self {
            PluginInstance::Verifier(_) => PluginKind::Verifier,
            PluginInstance::Optimizer(_) => PluginKind::Optimizer,
            PluginInstance::Curriculum(_) => PluginKind::Curriculum,
        }
    }
}

/// The functions a plugin library exports. Built by the `export_*!` macros; append-only.
#[repr(C)]
#[derive(StableAbi)]
#[sabi(kind(Prefix(prefix_ref = PluginModRef)))]
#[sabi(missing_field(panic))]
pub struct PluginMod {
    /// What the plugin is and needs.
    pub info: extern "C" fn() -> RResult<PluginInfo, PluginError>,
    /// Checks the plugin works; run once at load.
    pub self_test: extern "C" fn() -> RResult<(), PluginError>,
    /// Creates a plugin object from its configuration (a JSON object) and, for curricula, the
    /// job's prompt ids (empty for the other kinds).
    #[sabi(last_prefix_field)]
    pub create: extern "C" fn(
        config_json: RStr<'_>,
        prompt_ids: RSlice<'_, RString>,
    ) -> RResult<PluginInstance, PluginError>,
}

impl RootModule for PluginModRef {
    declare_root_module_statics! {PluginModRef}
    const BASE_NAME: &'static str = "rlvr_plugin";
    const NAME: &'static str = "rlvr_plugin";
    const VERSION_STRINGS: VersionStrings = package_version_strings!();
}
