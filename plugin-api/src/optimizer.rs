//! The optimizer contract: advantages from rewards, a loss from log-probabilities.
//!
//! Tensors cross the boundary as [`TensorHandle`]s: pointers to libtorch tensors owned by one side
//! at a time. Host and plugin link the same libtorch dynamically (the daemon checks the version),
//! so a pointer from one side is a valid tensor on the other.

use std::ffi::c_void;

use abi_stable::StableAbi;
use abi_stable::sabi_trait;
use abi_stable::std_types::{RBox, ROption, RResult, RSlice, RString, RVec};

use crate::{HostContext, Metadata, OptimizerInfo, OptionError, OptionsReport, PluginError, TrainedModel};

/// An opaque pointer to a libtorch tensor (`C_tensor*`), passed across the ABI boundary.
///
/// A handle in [`LossInputs`] is borrowed: the host owns the tensor for the call. A handle in
/// [`LossOutput`] is owned: the plugin gives the tensor to the host, which frees it. The crate
/// `rlvr-plugin-tensor` converts handles to and from `tch::Tensor` (`TensorHandleExt`).
#[repr(transparent)]
#[derive(StableAbi, Debug, Clone, Copy, PartialEq, Eq)]
pub struct TensorHandle {
    ptr: *mut c_void,
}

// The pointee is a libtorch tensor, whose reference count is atomic.
unsafe impl Send for TensorHandle {}
unsafe impl Sync for TensorHandle {}

impl TensorHandle {
    /// The raw `C_tensor*`.
    pub fn as_ptr(self) -> *mut c_void {
        self.ptr
    }

    /// A handle from a raw `C_tensor*`.
    ///
    /// # Safety
    /// `ptr` must point to a live libtorch tensor for as long as the handle is used.
    pub unsafe fn from_ptr(ptr: *mut c_void) -> Self {
        TensorHandle { ptr }
    }
}

/// What the trainer passes to compute advantages, once per batch, before any update. Every tensor
/// is borrowed and has no grad. Rows are completions; completions of a group are contiguous.
/// Completions are right-padded: row `i`'s tokens are columns `0..len_i`, where `mask` is 1; the
/// mask is 0 elsewhere (any float dtype). A multi-turn episode's row (a job with `[env]`) also has
/// 0s between its 1s, on the environment's replies, which are not trained on. Values under a 0 of
/// the mask are unspecified.
/// Tensors the plugin returns must have the dtype and device of `old_logprobs`.
#[repr(C)]
#[derive(StableAbi, Debug, Clone, Copy)]
pub struct AdvantageInputs<'a> {
    /// One scalar reward per completion: the weighted sum of the job's verifiers.
    pub rewards: RSlice<'a, f64>,
    /// The group (prompt) of each completion.
    pub group_ids: RSlice<'a, u64>,
    /// Log-probabilities of the sampled tokens at sampling time, `[B, T]`.
    pub old_logprobs: TensorHandle,
    /// Reference log-probabilities, `[B, T]`, when the plugin needs a reference.
    pub ref_logprobs: ROption<TensorHandle>,
    /// 1 on completion tokens (a multi-turn episode's turns), 0 on padding (and on an episode's
    /// replies), `[B, T]`.
    pub mask: TensorHandle,
    /// Value-head outputs at sampling time, `[B, T]`, when the plugin needs a value head.
    pub values: ROption<TensorHandle>,
}

/// Advantages (and returns, for a value head) of one batch; the tensors are owned by the host once
/// returned (`TensorHandleExt::into_tensor` in `rlvr-plugin-tensor`).
#[repr(C)]
#[derive(StableAbi, Debug)]
pub struct AdvantageOutput {
    /// Per-token advantages, `[B, T]`; sequence-level methods repeat a completion's advantage on
    /// each of its tokens.
    pub advantages: TensorHandle,
    /// Per-token returns, `[B, T]`, the value head's target; `RNone` without a value head.
    pub returns: ROption<TensorHandle>,
    /// Named scalars for the step's metrics (e.g. the KL penalty folded into the reward).
    pub metrics: RVec<Metric>,
}

/// The whole batch's size, so that a micro-batch's loss is its share of the batch's loss: the host
/// sums the micro-batch losses of one optimizer step, whatever the split.
#[repr(C)]
#[derive(StableAbi, Debug, Clone, Copy, PartialEq)]
pub struct LossScale {
    /// Sequences in the batch (pairs count as two rows each).
    pub batch_sequences: u64,
    /// Completion tokens (mask ones) in the batch.
    pub batch_tokens: u64,
    /// The job's `max_new_tokens`: the constant normaliser of Dr. GRPO's aggregation.
    pub max_new_tokens: u32,
}

/// What the trainer passes to compute the loss of one micro-batch. Every tensor is borrowed.
///
/// For offline pairs (DPO), rows come in pairs: row `2i` is pair `i`'s chosen completion and row
/// `2i + 1` its rejected one.
///
/// An optimizer that trains a reward model ([`TrainedModel::RewardModel`](crate::TrainedModel))
/// gets the same pairs, scored: `logprobs` is each row's scalar score `[B, 1]` (the score head at
/// the row's last token, with grad), `mask` is `[B, 1]` of ones, `returns` is `[B, 1]` with each
/// pair's margin from the data on both its rows (0 where the pair gives none), and the other
/// tensors are `RNone`; `scale.batch_tokens` is then the batch's rows. The existing slots carry
/// them because [`LossInputs`] has a fixed layout that old libraries were built against: a new
/// field would refuse every one of them (see [`TrainedModel`](crate::TrainedModel)).
#[repr(C)]
#[derive(StableAbi, Debug, Clone)]
pub struct LossInputs {
    /// Policy log-probabilities of the completion tokens, `[B, T]`, with grad.
    pub logprobs: TensorHandle,
    /// 1 on completion tokens, 0 on padding, `[B, T]`.
    pub mask: TensorHandle,
    /// Log-probabilities at sampling time (μ = 1) or before this batch's first update, `[B, T]`,
    /// no grad; `RNone` offline.
    pub old_logprobs: ROption<TensorHandle>,
    /// Reference log-probabilities, `[B, T]`, no grad, when the plugin needs a reference.
    pub ref_logprobs: ROption<TensorHandle>,
    /// Advantages from [`Optimizer::advantages`], `[B, T]`; `RNone` offline.
    pub advantages: ROption<TensorHandle>,
    /// Value-head outputs, `[B, T]`, with grad, when the plugin needs a value head.
    pub values: ROption<TensorHandle>,
    /// Values at sampling time, `[B, T]`, for value clipping.
    pub old_values: ROption<TensorHandle>,
    /// Returns from [`Optimizer::advantages`], `[B, T]`, the value loss's target; for a reward
    /// model, each pair's margin, `[B, 1]`.
    pub returns: ROption<TensorHandle>,
    /// The whole batch's size.
    pub scale: LossScale,
}

/// One named scalar reported by the plugin (clip fraction, KL, ...).
#[repr(C)]
#[derive(StableAbi, Debug, Clone, PartialEq)]
pub struct Metric {
    /// Name, e.g. `clip_frac_low`.
    pub name: RString,
    /// Value.
    pub value: f64,
}

/// A loss, owned by the host once returned, and the plugin's metrics. Metrics are per micro-batch;
/// the host averages them over a step's micro-batches, weighted by rows.
#[repr(C)]
#[derive(StableAbi, Debug)]
pub struct LossOutput {
    /// Scalar loss with grad; owned (`TensorHandleExt::into_tensor` in `rlvr-plugin-tensor`).
    pub loss: TensorHandle,
    /// Named scalars for the step's metrics.
    pub metrics: RVec<Metric>,
}

/// An optimizer, as the daemon sees it across the ABI boundary. Plugin authors implement
/// [`OptimizerPlugin`]; the export layer implements this.
#[sabi_trait]
pub trait Optimizer: Send + Sync {
    /// Whether this instance, with its options, reads reference log-probabilities; when not, the
    /// trainer keeps no reference model and passes `RNone`.
    fn uses_reference(&self) -> bool;

    /// Advantages (and returns) of one batch; online modes only.
    fn advantages(&self, inputs: &AdvantageInputs<'_>) -> RResult<AdvantageOutput, PluginError>;

    /// The loss of one micro-batch.
    ///
    /// No method may be appended after it: abi_stable refuses a library whose vtable has fewer
    /// entries than the host's (measured: "VTable: too many fields (expected 6, found 5)" for a
    /// library built before a sixth), so a method added here would lock out every optimizer
    /// built before it. What a plugin needs to know about its job comes in the
    /// [`HostContext`] at creation ([`HostContext::max_new_tokens`]).
    #[sabi(last_prefix_field)]
    fn loss(&self, inputs: &LossInputs) -> RResult<LossOutput, PluginError>;
}

/// An owned optimizer object from a plugin.
pub type OptimizerBox = Optimizer_TO<'static, RBox<()>>;

/// What an optimizer plugin author implements; export it with
/// [`export_optimizer!`](crate::export_optimizer).
pub trait OptimizerPlugin: Sized + Send + Sync + 'static {
    /// Name, version and description.
    fn metadata() -> Metadata;

    /// Data mode and needs. `libtorch_version` is overwritten by the export layer.
    fn requirements() -> OptimizerInfo;

    /// The model it trains; the default, the policy. A reward model's optimizer trains on
    /// [`DataMode::OfflinePairs`](crate::DataMode) and reads scores, not log-probabilities
    /// (see [`LossInputs`]).
    fn trains() -> TrainedModel {
        TrainedModel::Policy
    }

    /// Builds an optimizer from its keys of the job spec's `[optimizer]`, as a JSON object.
    /// Errors are [`PluginError::invalid_config`] with the message `"<key>: <problem>"`.
    fn from_config(config_json: &str) -> Result<Self, PluginError>;

    /// [`from_config`](Self::from_config) with the host's context; the default ignores it.
    fn from_config_in(config_json: &str, host: &HostContext) -> Result<Self, PluginError> {
        let _ = host;
        Self::from_config(config_json)
    }

    /// Checks the options without creating anything (see [`crate::options`]); the daemon asks
    /// at submit, through a worker process. The default creates the optimizer and reports
    /// nothing.
    fn check_options(config_json: &str) -> Result<OptionsReport, OptionError> {
        Self::from_config(config_json).map(|_| OptionsReport::default()).map_err(OptionError::from)
    }

    /// Whether this instance reads reference log-probabilities. [`OptimizerInfo::needs_reference`]
    /// says whether any configuration may; override this when the options decide (e.g. a KL
    /// coefficient of 0), so the trainer skips the reference model and its forward pass.
    fn uses_reference(&self) -> bool {
        Self::requirements().needs_reference
    }

    /// Advantages (and returns) of one batch. Offline plugins (DPO, SFT) are never asked and
    /// keep the default, which refuses.
    fn advantages(&self, _inputs: &AdvantageInputs<'_>) -> Result<AdvantageOutput, PluginError> {
        Err(PluginError::invalid_input("this optimizer trains offline and computes no advantages"))
    }

    /// The loss of one micro-batch.
    fn loss(&self, inputs: &LossInputs) -> Result<LossOutput, PluginError>;

    /// Run once at load; a failure refuses the plugin.
    fn self_test() -> Result<(), PluginError> {
        Ok(())
    }
}
