//! The curriculum contract: which prompts to train on next, learned from each step's groups.

use abi_stable::StableAbi;
use abi_stable::sabi_trait;
use abi_stable::std_types::{RBox, RResult, RSlice, RStr, RString, RVec};

use crate::{CurriculumInfo, HostContext, Metadata, OptionError, OptionsReport, PluginError};

/// How one prompt's group fared in a step.
#[repr(C)]
#[derive(StableAbi, Debug, Clone, PartialEq)]
pub struct GroupOutcome {
    /// The prompt's id in the job's training data.
    pub prompt_id: RString,
    /// Completions that passed.
    pub passed: u32,
    /// Completions in the group.
    pub total: u32,
}

/// A curriculum, as the daemon sees it across the ABI boundary. Plugin authors implement
/// [`CurriculumPlugin`]; the export layer implements this.
#[sabi_trait]
pub trait Curriculum: Send {
    /// Chooses `count` prompt ids for the next step, deterministically from `seed`.
    fn sample(&mut self, count: u32, seed: u64) -> RResult<RVec<RString>, PluginError>;

    /// Updates estimates from a step's groups.
    fn observe(&mut self, outcomes: RSlice<'_, GroupOutcome>) -> RResult<(), PluginError>;

    /// The whole state as JSON, saved with each checkpoint.
    fn save_state(&self) -> RResult<RString, PluginError>;

    /// Restores a state from [`Curriculum::save_state`], for exact resume.
    #[sabi(last_prefix_field)]
    fn load_state(&mut self, state_json: RStr<'_>) -> RResult<(), PluginError>;
}

/// An owned curriculum object from a plugin.
pub type CurriculumBox = Curriculum_TO<'static, RBox<()>>;

/// What a curriculum plugin author implements; export it with
/// [`export_curriculum!`](crate::export_curriculum).
pub trait CurriculumPlugin: Sized + Send + 'static {
    /// Name, version and description.
    fn metadata() -> Metadata;

    /// What it needs.
    fn requirements() -> CurriculumInfo;

    /// Builds a curriculum over `prompt_ids` from its keys of the job spec, as a JSON object.
    /// Errors are [`PluginError::invalid_config`] with the message `"<key>: <problem>"`.
    fn from_config(config_json: &str, prompt_ids: &[RString]) -> Result<Self, PluginError>;

    /// [`from_config`](Self::from_config) with the host's context; the default ignores it.
    fn from_config_in(
        config_json: &str,
        prompt_ids: &[RString],
        host: &HostContext,
    ) -> Result<Self, PluginError> {
        let _ = host;
        Self::from_config(config_json, prompt_ids)
    }

    /// Checks the options without the job's prompts and without creating anything (see
    /// [`crate::options`]); the daemon calls it at submit. The default creates the curriculum
    /// over no prompts and reports nothing.
    fn check_options(config_json: &str) -> Result<OptionsReport, OptionError> {
        Self::from_config(config_json, &[]).map(|_| OptionsReport::default()).map_err(OptionError::from)
    }

    /// Chooses `count` prompt ids, deterministically from `seed`.
    fn sample(&mut self, count: u32, seed: u64) -> Result<RVec<RString>, PluginError>;

    /// Updates estimates from a step's groups.
    fn observe(&mut self, outcomes: &[GroupOutcome]) -> Result<(), PluginError>;

    /// The whole state as JSON.
    fn save_state(&self) -> Result<String, PluginError>;

    /// Restores a saved state.
    fn load_state(&mut self, state_json: &str) -> Result<(), PluginError>;

    /// Run once at load; a failure refuses the plugin.
    fn self_test() -> Result<(), PluginError> {
        Ok(())
    }
}
