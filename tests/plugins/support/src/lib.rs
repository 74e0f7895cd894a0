//! Shared pieces of the fixture plugins: a hand-written root module for fixtures that must report
//! what the export macros never would (another API version, an unknown kind, another libtorch),
//! the root module as a library built before `check_options` and `create_in` has it, and the
//! `echo` verifier that two fixtures export under two versions.

use rlvr_plugin_api::abi_stable::StableAbi;
use rlvr_plugin_api::abi_stable::prefix_type::{PrefixRefTrait, PrefixTypeTrait};
use rlvr_plugin_api::abi_stable::std_types::{ROption, RResult, RSlice, RStr, RString};
use rlvr_plugin_api::{
    Metadata, OptimizerInfo, PluginError, PluginInfo, PluginInstance, PluginModRef, Verdict, VerifierPlugin,
    VerifyItem,
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
    legacy_module(LegacyMod { info, self_test, create })
}

/// `PluginMod` as it was before `check_options` and `create_in` were appended: its prefix
/// fields only. What a plugin library built against that `rlvr-plugin-api` exports.
#[repr(C)]
#[derive(StableAbi)]
#[sabi(kind(Prefix(prefix_ref = LegacyModRef)))]
#[sabi(missing_field(panic))]
pub struct LegacyMod {
    /// What the plugin is.
    pub info: extern "C" fn() -> RResult<PluginInfo, PluginError>,
    /// Its self-test.
    pub self_test: extern "C" fn() -> RResult<(), PluginError>,
    /// Creates a plugin object.
    #[sabi(last_prefix_field)]
    pub create: extern "C" fn(RStr<'_>, RSlice<'_, RString>) -> RResult<PluginInstance, PluginError>,
}

/// The root module of an old library: `module`'s three functions, with the field accessibility
/// of a three-field `PluginMod`, so the host's accessors of the appended fields answer `None`
/// as they do for a library built before them.
pub fn legacy_module(module: LegacyMod) -> PluginModRef {
    let legacy: LegacyModRef = module.leak_into_prefix();
    // SAFETY: `LegacyMod` is `PluginMod`'s prefix, field for field (same types, same order,
    // `repr(C)`): the memory an old library's root module has. Its metadata marks only those
    // three fields accessible, so no accessor reads past them.
    let prefix = unsafe { legacy.0.cast::<<PluginModRef as PrefixRefTrait>::PrefixFields>() };
    PluginModRef::from_prefix_ref(prefix)
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
