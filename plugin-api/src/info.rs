//! Plugin metadata: what a plugin is, which contract version it speaks, and what it needs.
//!
//! A plugin's `kind` is a string, not an enum: a plugin of a kind this host does not know is then
//! refused by name (`unknown plugin kind "reranker"`) instead of being an out-of-range enum.

use abi_stable::StableAbi;
use abi_stable::std_types::{ROption, RString, RVec};

/// The version of this contract. The daemon refuses plugins built against another one.
///
/// Bump it for any change that old plugins cannot honour; appending a prefix field is not one.
pub const API_VERSION: u32 = 3;

/// The libtorch version the pinned `tch` (0.24) binds. Optimizer plugins report the version they
/// were built against and the daemon refuses a mismatch: two libtorch builds in one process do not
/// share tensors.
pub const LIBTORCH_VERSION: &str = "2.11.0";

/// The three kinds of plugin, by their wire names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum PluginKind {
    /// Scores completions.
    Verifier,
    /// Computes advantages and losses.
    Optimizer,
    /// Chooses prompts.
    Curriculum,
}

impl PluginKind {
    /// Every kind, in display order.
    pub const ALL: [PluginKind; 3] = [PluginKind::Verifier, PluginKind::Optimizer, PluginKind::Curriculum];

    /// The name used in [`PluginInfo::kind`], in configs and in the API.
    pub fn as_str(self) -> &'static str {
        match self {
            PluginKind::Verifier => "verifier",
            PluginKind::Optimizer => "optimizer",
            PluginKind::Curriculum => "curriculum",
        }
    }

    /// Parses a wire name; `None` for anything else.
    pub fn parse(name: &str) -> Option<PluginKind> {
        Self::ALL.into_iter().find(|kind| kind.as_str() == name)
    }
}

/// What a plugin author states about the plugin, in plain Rust. The export layer turns it into a
/// [`PluginInfo`].
#[derive(Debug, Clone, Copy)]
pub struct Metadata {
    /// Short name jobs use to ask for the plugin, e.g. `"format"`; lowercase, digits, `-`, `_`.
    pub name: &'static str,
    /// Semantic version, e.g. `env!("CARGO_PKG_VERSION")`. Jobs pin `name@version`.
    pub version: &'static str,
    /// One line for `rlvrctl plugins`.
    pub description: &'static str,
}

/// What a verifier expects in an item's `reference` object.
#[repr(C)]
#[derive(StableAbi, Debug, Clone, PartialEq)]
pub struct VerifierInfo {
    /// A JSON example or schema of `reference`, e.g. `{"answer": "<gold>"}`; `{}` when unused.
    pub reference_schema: RString,
}

/// The data an optimizer trains on.
#[repr(u8)]
#[derive(StableAbi, Debug, Clone, Copy, PartialEq, Eq)]
pub enum DataMode {
    /// Sampled groups of completions per prompt, scored by verifiers (GRPO, RLOO).
    OnlineGroups,
    /// Sampled completions with a learned critic (PPO).
    OnlineWithCritic,
    /// Offline preference pairs `{prompt, chosen, rejected}` (DPO).
    OfflinePairs,
    /// Offline demonstrations `{prompt, completion}` (SFT cold start).
    OfflineSft,
}

impl DataMode {
    /// The name used in configs and the API.
    pub fn as_str(self) -> &'static str {
        match self {
            DataMode::OnlineGroups => "online-groups",
            DataMode::OnlineWithCritic => "online-with-critic",
            DataMode::OfflinePairs => "offline-pairs",
            DataMode::OfflineSft => "offline-sft",
        }
    }
}

/// The model an optimizer trains, by its wire name: what [`LossInputs::logprobs`] holds.
///
/// A library reports it through a symbol of its own, [`TRAINS_SYMBOL`] (written by
/// [`export_optimizer!`](crate::export_optimizer)), a function returning the wire name as a
/// static C string; a library without the symbol (built before it) trains a
/// [`TrainedModel::Policy`], and a name this host does not know is refused by name (as
/// [`PluginInfo::kind`] is).
///
/// Why not a [`DataMode`] variant, a field of [`OptimizerInfo`] or a field appended to
/// [`PluginMod`](crate::PluginMod): abi_stable checks the root module's whole layout at load and
/// refuses a library whose exhaustive enum has another number of variants, whose struct has other
/// fields, or whose prefix type has *fewer* fields than the host's (measured: a library built
/// before a sixth `PluginMod` field was refused with "PluginMod: too many fields (expected 6,
/// found 5)"). Each would have refused every library built before it; a symbol beside the root
/// module changes no checked layout.
///
/// [`LossInputs::logprobs`]: crate::LossInputs::logprobs
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum TrainedModel {
    /// A causal language model: `logprobs` holds the policy's per-token log-probabilities.
    #[default]
    Policy,
    /// A sequence-classification reward model (a backbone and a `score` head), trained on
    /// [`DataMode::OfflinePairs`]: `logprobs` holds one score per sequence, `[B, 1]`, with a
    /// mask of ones, and `returns` each pair's margin (see [`LossInputs`](crate::LossInputs)).
    RewardModel,
}

/// The symbol an optimizer library exports for [`TrainedModel`]: an
/// `extern "C" fn() -> *const c_char` returning a static NUL-terminated wire name.
pub const TRAINS_SYMBOL: &[u8] = b"rlvr_optimizer_trains\0";

impl TrainedModel {
    /// The wire name as a C string (what [`TRAINS_SYMBOL`]'s function returns).
    pub fn as_cstr(self) -> &'static std::ffi::CStr {
        match self {
            TrainedModel::Policy => c"policy",
            TrainedModel::RewardModel => c"reward-model",
        }
    }

    /// Every model, in display order.
    pub const ALL: [TrainedModel; 2] = [TrainedModel::Policy, TrainedModel::RewardModel];

    /// The wire name: `policy` or `reward-model`.
    pub fn as_str(self) -> &'static str {
        match self {
            TrainedModel::Policy => "policy",
            TrainedModel::RewardModel => "reward-model",
        }
    }

    /// Parses a wire name; `None` for anything else.
    pub fn parse(name: &str) -> Option<TrainedModel> {
        Self::ALL.into_iter().find(|model| model.as_str() == name)
    }
}

/// What an optimizer needs from the trainer.
#[repr(C)]
#[derive(StableAbi, Debug, Clone, PartialEq)]
pub struct OptimizerInfo {
    /// The data it trains on.
    pub data_mode: DataMode,
    /// Whether the trainer must keep a frozen reference model and pass its log-probabilities.
    pub needs_reference: bool,
    /// Whether the trainer must add a value head on the policy trunk and pass its values.
    pub needs_value_head: bool,
    /// Whether completions must come in groups of at least two per prompt.
    pub needs_groups: bool,
    /// The libtorch version the plugin was built against; filled in by the export layer.
    pub libtorch_version: RString,
}

/// What a curriculum needs; nothing yet beyond its kind.
#[repr(C)]
#[derive(StableAbi, Debug, Clone, PartialEq)]
pub struct CurriculumInfo {
    /// Whether it uses per-prompt pass rates from each step's groups.
    pub uses_pass_rates: bool,
}

/// Everything the daemon learns about a plugin before it creates one.
#[repr(C)]
#[derive(StableAbi, Debug, Clone, PartialEq)]
pub struct PluginInfo {
    /// `"verifier"`, `"optimizer"` or `"curriculum"` (see [`PluginKind`]). A string, so that a
    /// plugin of a kind this daemon does not know is refused by name instead of misread.
    pub kind: RString,
    /// The plugin's short name.
    pub name: RString,
    /// The plugin's semantic version.
    pub version: RString,
    /// The [`API_VERSION`] the plugin was built against.
    pub api_version: u32,
    /// One line for humans.
    pub description: RString,
    /// Set for verifiers.
    pub verifier: ROption<VerifierInfo>,
    /// Set for optimizers.
    pub optimizer: ROption<OptimizerInfo>,
    /// Set for curricula.
    pub curriculum: ROption<CurriculumInfo>,
    /// Facts about the host the plugin found when it loaded, e.g. which sandbox layers the kernel
    /// allows; the daemon logs them at load and `rlvrctl plugins` shows them.
    pub notes: RVec<RString>,
}
