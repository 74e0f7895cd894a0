//! The export layer: turns a plain Rust impl into a plugin library's root module.
//!
//! Plugin authors use the macros ([`export_verifier!`](crate::export_verifier) and friends); the
//! functions here are what the macros instantiate. Every call that crosses the boundary runs
//! under [`guard`], which turns a panic into a [`PluginError`] of kind
//! [`PluginErrorKind::Panic`](crate::PluginErrorKind::Panic): a panic unwinding across
//! `extern "C"` would abort the daemon.

use std::any::Any;
use std::panic::{AssertUnwindSafe, catch_unwind};

use abi_stable::prefix_type::PrefixTypeTrait;
use abi_stable::sabi_trait::TD_Opaque;
use abi_stable::std_types::{RResult, RSlice, RStr, RString, RVec};

use crate::{
    API_VERSION, AdvantageInputs, AdvantageOutput, Curriculum, Curriculum_TO, CurriculumPlugin, GroupOutcome,
    HostContext, LIBTORCH_VERSION, LossInputs, LossOutput, Metadata, Optimizer, Optimizer_TO,
    OptimizerPlugin, OptionError, OptionsReport, PluginError, PluginErrorKind, PluginInfo, PluginInstance,
    PluginKind, PluginMod, PluginModRef, Verdict, Verifier, Verifier_TO, VerifierPlugin, VerifyItem,
};

/// Runs `call`, turning a panic into a [`PluginError`] that names where it happened.
pub fn guard<T>(what: &str, call: impl FnOnce() -> Result<T, PluginError>) -> RResult<T, PluginError> {
    match catch_unwind(AssertUnwindSafe(call)) {
        Ok(Ok(value)) => RResult::ROk(value),
        Ok(Err(error)) => RResult::RErr(error),
        Err(payload) => RResult::RErr(PluginError::new(
            PluginErrorKind::Panic,
            format!("plugin panicked in {what}: {}", panic_message(payload.as_ref())),
        )),
    }
}

fn panic_message(payload: &(dyn Any + Send)) -> String {
    if let Some(message) = payload.downcast_ref::<&str>() {
        (*message).to_owned()
    } else if let Some(message) = payload.downcast_ref::<String>() {
        message.clone()
    } else {
        "non-string panic payload".to_owned()
    }
}

/// `check_options`' answer as it crosses the boundary: the report as JSON, or the refusal as an
/// `InvalidConfig` error reading `"<key>: <problem>"`.
fn report_json(checked: Result<OptionsReport, OptionError>) -> Result<RString, PluginError> {
    let report = checked.map_err(PluginError::from)?;
    serde_json::to_string(&report)
        .map(RString::from)
        .map_err(|error| PluginError::internal(format!("cannot encode the options report: {error}")))
}

/// The host's context from its JSON text; a host that sent something unreadable is the host's
/// problem, and the message never quotes the text (it holds secrets).
fn host_context(host_json: RStr<'_>) -> Result<HostContext, PluginError> {
    HostContext::from_json(host_json.as_str()).map_err(|error| PluginError::internal(error.to_string()))
}

fn base_info(kind: PluginKind, metadata: Metadata) -> PluginInfo {
    PluginInfo {
        kind: kind.as_str().into(),
        name: metadata.name.into(),
        version: metadata.version.into(),
        api_version: API_VERSION,
        description: metadata.description.into(),
        verifier: abi_stable::std_types::ROption::RNone,
        optimizer: abi_stable::std_types::ROption::RNone,
        curriculum: abi_stable::std_types::ROption::RNone,
        notes: RVec::new(),
    }
}

// --- verifiers -------------------------------------------------------------------------------

struct VerifierAdapter<T>(T);

impl<T: VerifierPlugin> Verifier for VerifierAdapter<T> {
    fn verify(&self, item: VerifyItem<'_>) -> RResult<Verdict, PluginError> {
        guard("verify()", || self.0.verify(&item))
    }
}

extern "C" fn verifier_info<T: VerifierPlugin>() -> RResult<PluginInfo, PluginError> {
    guard("info()", || {
        let mut info = base_info(PluginKind::Verifier, T::metadata());
        info.verifier = abi_stable::std_types::ROption::RSome(crate::VerifierInfo {
            reference_schema: T::reference_schema().into(),
        });
        info.notes = T::notes().into_iter().map(RString::from).collect();
        Ok(info)
    })
}

extern "C" fn verifier_self_test<T: VerifierPlugin>() -> RResult<(), PluginError> {
    guard("self_test()", T::self_test)
}

extern "C" fn verifier_create<T: VerifierPlugin>(
    config_json: RStr<'_>,
    _prompt_ids: RSlice<'_, RString>,
) -> RResult<PluginInstance, PluginError> {
    guard("from_config()", || {
        let plugin = T::from_config(config_json.as_str())?;
        Ok(PluginInstance::Verifier(Verifier_TO::from_value(VerifierAdapter(plugin), TD_Opaque)))
    })
}

extern "C" fn verifier_check_options<T: VerifierPlugin>(
    config_json: RStr<'_>,
) -> RResult<RString, PluginError> {
    guard("check_options()", || report_json(T::check_options(config_json.as_str())))
}

extern "C" fn verifier_create_in<T: VerifierPlugin>(
    config_json: RStr<'_>,
    _prompt_ids: RSlice<'_, RString>,
    host_json: RStr<'_>,
) -> RResult<PluginInstance, PluginError> {
    guard("from_config_in()", || {
        let plugin = T::from_config_in(config_json.as_str(), &host_context(host_json)?)?;
        Ok(PluginInstance::Verifier(Verifier_TO::from_value(VerifierAdapter(plugin), TD_Opaque)))
    })
}

/// The root module of a verifier plugin; used by [`export_verifier!`](crate::export_verifier).
pub fn verifier_module<T: VerifierPlugin>() -> PluginModRef {
    PluginMod {
        info: verifier_info::<T>,
        self_test: verifier_self_test::<T>,
        create: verifier_create::<T>,
        check_options: verifier_check_options::<T>,
        create_in: verifier_create_in::<T>,
    }
    .leak_into_prefix()
}

// --- optimizers ------------------------------------------------------------------------------

struct OptimizerAdapter<T>(T);

impl<T: OptimizerPlugin> Optimizer for OptimizerAdapter<T> {
    fn uses_reference(&self) -> bool {
        // A panic here would cross the boundary; a plugin that cannot answer gets a reference.
        catch_unwind(AssertUnwindSafe(|| self.0.uses_reference())).unwrap_or(true)
    }

    fn advantages(&self, inputs: &AdvantageInputs<'_>) -> RResult<AdvantageOutput, PluginError> {
        guard("advantages()", || self.0.advantages(inputs))
    }

    fn loss(&self, inputs: &LossInputs) -> RResult<LossOutput, PluginError> {
        guard("loss()", || self.0.loss(inputs))
    }
}

extern "C" fn optimizer_info<T: OptimizerPlugin>() -> RResult<PluginInfo, PluginError> {
    guard("info()", || {
        let mut info = base_info(PluginKind::Optimizer, T::metadata());
        let mut requirements = T::requirements();
        requirements.libtorch_version = LIBTORCH_VERSION.into();
        info.optimizer = abi_stable::std_types::ROption::RSome(requirements);
        Ok(info)
    })
}

/// The model `T` trains, as the NUL-terminated wire name that [`export_optimizer!`]'s
/// [`TRAINS_SYMBOL`](crate::TRAINS_SYMBOL) function returns.
///
/// [`export_optimizer!`]: crate::export_optimizer
pub fn trains_name<T: OptimizerPlugin>() -> &'static std::ffi::CStr {
    // A panic must not cross the boundary; the default is what a library without the symbol says.
    catch_unwind(T::trains).unwrap_or_default().as_cstr()
}

extern "C" fn optimizer_self_test<T: OptimizerPlugin>() -> RResult<(), PluginError> {
    guard("self_test()", T::self_test)
}

extern "C" fn optimizer_create<T: OptimizerPlugin>(
    config_json: RStr<'_>,
    _prompt_ids: RSlice<'_, RString>,
) -> RResult<PluginInstance, PluginError> {
    guard("from_config()", || {
        let plugin = T::from_config(config_json.as_str())?;
        Ok(PluginInstance::Optimizer(Optimizer_TO::from_value(OptimizerAdapter(plugin), TD_Opaque)))
    })
}

extern "C" fn optimizer_check_options<T: OptimizerPlugin>(
    config_json: RStr<'_>,
) -> RResult<RString, PluginError> {
    guard("check_options()", || report_json(T::check_options(config_json.as_str())))
}

extern "C" fn optimizer_create_in<T: OptimizerPlugin>(
    config_json: RStr<'_>,
    _prompt_ids: RSlice<'_, RString>,
    host_json: RStr<'_>,
) -> RResult<PluginInstance, PluginError> {
    guard("from_config_in()", || {
        let plugin = T::from_config_in(config_json.as_str(), &host_context(host_json)?)?;
        Ok(PluginInstance::Optimizer(Optimizer_TO::from_value(OptimizerAdapter(plugin), TD_Opaque)))
    })
}

/// The root module of an optimizer plugin; used by [`export_optimizer!`](crate::export_optimizer).
pub fn optimizer_module<T: OptimizerPlugin>() -> PluginModRef {
    PluginMod {
        info: optimizer_info::<T>,
        self_test: optimizer_self_test::<T>,
        create: optimizer_create::<T>,
        check_options: optimizer_check_options::<T>,
        create_in: optimizer_create_in::<T>,
    }
    .leak_into_prefix()
}

// --- curricula -------------------------------------------------------------------------------

struct CurriculumAdapter<T>(T);

impl<T: CurriculumPlugin> Curriculum for CurriculumAdapter<T> {
    fn sample(&mut self, count: u32, seed: u64) -> RResult<RVec<RString>, PluginError> {
        guard("sample()", || self.0.sample(count, seed))
    }

    fn observe(&mut self, outcomes: RSlice<'_, GroupOutcome>) -> RResult<(), PluginError> {
        guard("observe()", || self.0.observe(outcomes.as_slice()))
    }

    fn save_state(&self) -> RResult<RString, PluginError> {
        guard("save_state()", || self.0.save_state().map(RString::from))
    }

    fn load_state(&mut self, state_json: RStr<'_>) -> RResult<(), PluginError> {
        guard("load_state()", || self.0.load_state(state_json.as_str()))
    }
}

extern "C" fn curriculum_info<T: CurriculumPlugin>() -> RResult<PluginInfo, PluginError> {
    guard("info()", || {
        let mut info = base_info(PluginKind::Curriculum, T::metadata());
        info.curriculum = abi_stable::std_types::ROption::RSome(T::requirements());
        Ok(info)
    })
}

extern "C" fn curriculum_self_test<T: CurriculumPlugin>() -> RResult<(), PluginError> {
    guard("self_test()", T::self_test)
}

extern "C" fn curriculum_create<T: CurriculumPlugin>(
    config_json: RStr<'_>,
    prompt_ids: RSlice<'_, RString>,
) -> RResult<PluginInstance, PluginError> {
    guard("from_config()", || {
        let plugin = T::from_config(config_json.as_str(), prompt_ids.as_slice())?;
        Ok(PluginInstance::Curriculum(Curriculum_TO::from_value(CurriculumAdapter(plugin), TD_Opaque)))
    })
}

extern "C" fn curriculum_check_options<T: CurriculumPlugin>(
    config_json: RStr<'_>,
) -> RResult<RString, PluginError> {
    guard("check_options()", || report_json(T::check_options(config_json.as_str())))
}

extern "C" fn curriculum_create_in<T: CurriculumPlugin>(
    config_json: RStr<'_>,
    prompt_ids: RSlice<'_, RString>,
    host_json: RStr<'_>,
) -> RResult<PluginInstance, PluginError> {
    guard("from_config_in()", || {
        let host = host_context(host_json)?;
        let plugin = T::from_config_in(config_json.as_str(), prompt_ids.as_slice(), &host)?;
        Ok(PluginInstance::Curriculum(Curriculum_TO::from_value(CurriculumAdapter(plugin), TD_Opaque)))
    })
}

/// The root module of a curriculum plugin; used by
/// [`export_curriculum!`](crate::export_curriculum).
pub fn curriculum_module<T: CurriculumPlugin>() -> PluginModRef {
    PluginMod {
        info: curriculum_info::<T>,
        self_test: curriculum_self_test::<T>,
        create: curriculum_create::<T>,
        check_options: curriculum_check_options::<T>,
        create_in: curriculum_create_in::<T>,
    }
    .leak_into_prefix()
}

// --- macros ----------------------------------------------------------------------------------

/// Exports a [`VerifierPlugin`] impl as this library's plugin: `export_verifier!(MyVerifier);`.
///
/// The plugin crate is a `cdylib` that depends on `rlvr-plugin-api` and `abi_stable` (the
/// attribute that writes the library header refers to it by name).
#[macro_export]
macro_rules! export_verifier {
    ($plugin:ty) => {
        /// The plugin library's root module, read by the daemon's loader.
        #[::abi_stable::export_root_module]
        pub fn rlvr_plugin_root_module() -> $crate::PluginModRef {
            $crate::export::verifier_module::<$plugin>()
        }
    };
}

/// Exports an [`OptimizerPlugin`] impl as this library's plugin: `export_optimizer!(Grpo);`.
///
/// Besides the root module it exports [`TRAINS_SYMBOL`](crate::TRAINS_SYMBOL), the model the
/// optimizer trains (see [`TrainedModel`](crate::TrainedModel) for why a symbol of its own).
#[macro_export]
macro_rules! export_optimizer {
    ($plugin:ty) => {
        /// The plugin library's root module, read by the daemon's loader.
        #[::abi_stable::export_root_module]
        pub fn rlvr_plugin_root_module() -> $crate::PluginModRef {
            $crate::export::optimizer_module::<$plugin>()
        }

        /// The model this optimizer trains: a static NUL-terminated wire name
        /// (`rlvr_plugin_api::TrainedModel`), read by the daemon's loader.
        #[unsafe(no_mangle)]
        pub extern "C" fn rlvr_optimizer_trains() -> *const ::std::ffi::c_char {
            $crate::export::trains_name::<$plugin>().as_ptr()
        }
    };
}

/// Exports a [`CurriculumPlugin`] impl as this library's plugin: `export_curriculum!(Frontier);`.
#[macro_export]
macro_rules! export_curriculum {
    ($plugin:ty) => {
        /// The plugin library's root module, read by the daemon's loader.
        #[::abi_stable::export_root_module]
        pub fn rlvr_plugin_root_module() -> $crate::PluginModRef {
            $crate::export::curriculum_module::<$plugin>()
        }
    };
}
