//! The contract every rlvr plugin implements and the daemon relies on.
//!
//! A plugin is a `cdylib` that the daemon (`rlvrd`) and the CLI (`rlvrctl`) load at run time with
//! [`abi_stable`]. There are three kinds, each a trait a plugin author implements in plain Rust:
//!
//! - [`VerifierPlugin`]: scores one completion against its reference (math, code, format, ...).
//! - [`OptimizerPlugin`]: turns rewards into advantages and log-probabilities into a loss
//!   (GRPO, RLOO, PPO, DPO, SFT).
//! - [`CurriculumPlugin`]: decides which prompts each step trains on.
//!
//! One line exports the impl: [`export_verifier!`], [`export_optimizer!`] or
//! [`export_curriculum!`]. The export layer (module [`export`]) builds the root module, wraps
//! every call in `catch_unwind` — a panic that unwinds across `extern "C"` would abort the whole
//! daemon — and turns panics into [`PluginError`]s. Nobody writes abi_stable glue by hand.
//!
//! # Options, secrets and destinations
//!
//! A plugin's options are its keys of the job spec, handed over as a JSON object. Parse them
//! with [`parse_options`] into a `#[serde(deny_unknown_fields)]` struct: a refusal then names
//! the key (`fallbak: unknown key; expected one of fallback, precision_digits, work_budget`).
//! Each trait's `check_options` checks them without creating anything and reports the secret
//! names and URLs they refer to ([`OptionsReport`]); the daemon calls it at submit, so a typo
//! is a 4xx naming `verifiers[1].fallbak` instead of a failed job. The default creates the plugin
//! and reports nothing; override it when creating has a cost or side effects, or when an option
//! names a secret or a destination (module [`options`]).
//!
//! Credentials never come from the environment. An option names a secret
//! (`bearer_token_secret = "grader-token"`) and `from_config_in` receives the host's
//! [`HostContext`]: the values of the secrets this job may use (a [`Secret`], whose `Debug`
//! is redacted) and the destinations it may reach. See module [`host`] for its JSON form.
//!
//! # Stability rules
//!
//! - Loading checks layouts (abi_stable) and then [`API_VERSION`] (the daemon). A plugin built
//!   against another `API_VERSION` is refused with a message that names the file.
//! - This crate is append-only: new fields go after the last prefix field, nothing is reordered,
//!   and a change that breaks old plugins bumps [`API_VERSION`]. `check_options` and `create_in`
//!   were appended to [`PluginMod`]: a plugin built before them loads, is created with `create`
//!   and no context, and its options are checked when the worker creates it. What an optimizer
//!   trains ([`TrainedModel`]) is not in the root module at all but in a symbol beside it
//!   ([`TRAINS_SYMBOL`]): a library without it trains the policy.
//! - Optimizer plugins exchange tensors as [`TensorHandle`]s, pointers into the one libtorch that
//!   host and plugin both link dynamically; never a `tch::Tensor` by value. They also report the
//!   libtorch version they were built against ([`LIBTORCH_VERSION`]), which the daemon checks.
//!   The conversions to and from `tch::Tensor` are in the crate `rlvr-plugin-tensor`, not behind
//!   a feature here: Cargo unifies features across a workspace build, and a `tch` feature of this
//!   crate, enabled by any optimizer plugin, would link libtorch into `rlvrd` and `rlvrctl`.
//!
//! Why a symbol and not a field: abi_stable checks the root module's layout at load, and a sixth
//! field refused every library built before it (measured: "PluginMod: too many fields (expected 6,
//! found 5)"); the same holds for a method appended to a `#[sabi_trait]` ("VTable: too many fields
//! (expected 6, found 5)"). A symbol changes no checked layout; new facts for plugins travel in the
//! `HostContext`'s JSON (older plugins ignore unknown keys) or in symbols beside the root module.
//!
//! # Files
//!
//! A plugin author starts here. `module.rs` ([`PluginMod`]), `verifier.rs`, `optimizer.rs`,
//! `curriculum.rs` (the three contracts), `export.rs` (the export layer, `catch_unwind`),
//! `options.rs` ([`parse_options`], [`OptionsReport`]), `host.rs` ([`HostContext`], [`Secret`]),
//! `info.rs` (plugin metadata), `error.rs` ([`PluginError`]).
#![deny(missing_docs)]
// abi_stable 0.11's `#[sabi_trait]` expands to impls inside a const, which this lint flags.
#![allow(non_local_definitions)]

mod curriculum;
mod error;
pub mod export;
pub mod host;
mod info;
mod module;
mod optimizer;
pub mod options;
mod verifier;

pub use abi_stable;
pub use abi_stable::std_types::{ROption, RResult, RStr, RString, RVec};

pub use crate::curriculum::{Curriculum, Curriculum_TO, CurriculumBox, CurriculumPlugin, GroupOutcome};
pub use crate::error::{PluginError, PluginErrorKind};
pub use crate::host::{GraderCaps, HostContext, HostContextError, Resource, Secret};
pub use crate::info::{
    API_VERSION, CurriculumInfo, DataMode, LIBTORCH_VERSION, Metadata, OptimizerInfo, PluginInfo, PluginKind,
    TRAINS_SYMBOL, TrainedModel, VerifierInfo,
};
pub use crate::module::{PluginInstance, PluginMod, PluginModRef};
pub use crate::optimizer::{
    AdvantageInputs, AdvantageOutput, LossInputs, LossOutput, LossScale, Metric, Optimizer, Optimizer_TO,
    OptimizerBox, OptimizerPlugin, TensorHandle,
};
pub use crate::options::{OptionError, OptionsReport, PathRef, SecretRef, UrlRef, parse_options};
pub use crate::verifier::{
    Component, Verdict, Verifier, Verifier_TO, VerifierBox, VerifierPlugin, VerifyItem, check_known_answers,
};
