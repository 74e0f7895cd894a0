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
///
/// The fields after `create` were appended later: a library built before them has none, and
/// their accessors return `None` for it (`#[sabi(missing_field(option))]`). A host then checks
/// the plugin's options only when it creates it, and creates it with `create`, without a
/// [`HostContext`](crate::HostContext).
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
    /// Checks a configuration without creating anything; returns an
    /// [`OptionsReport`](crate::OptionsReport) as JSON text, or an `InvalidConfig` error whose
    /// message is `"<key>: <problem>"` (see [`crate::options`]).
    #[sabi(missing_field(option))]
    pub check_options: extern "C" fn(config_json: RStr<'_>) -> RResult<RString, PluginError>,
    /// [`create`](Self::create) with the host's context, a [`HostContext`](crate::HostContext)
    /// as JSON text: the job's secrets and where the plugin may send requests.
    #[sabi(missing_field(option))]
    pub create_in: extern "C" fn(
        config_json: RStr<'_>,
        prompt_ids: RSlice<'_, RString>,
        host_json: RStr<'_>,
    ) -> RResult<PluginInstance, PluginError>,
}

impl RootModule for PluginModRef {
    declare_root_module_statics! {PluginModRef}
    const BASE_NAME: &'static str = "rlvr_plugin";
    const NAME: &'static str = "rlvr_plugin";
    const VERSION_STRINGS: VersionStrings = package_version_strings!();
}
