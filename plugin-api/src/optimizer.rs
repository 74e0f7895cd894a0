//! The optimizer contract: advantages from rewards, a loss from log-probabilities.
//!
//! Tensors cross the boundary as [`TensorHandle`]s: pointers to libtorch tensors owned by one side
//! at a time. Host and plugin link the same libtorch dynamically (the daemon checks the version),
//! so a pointer from one side is a valid tensor on the other.

use std::ffi::c_void;

use abi_stable::StableAbi;
use abi_stable::sabi_trait;
use abi_stable::std_types::{RBox, ROption, RResult, RSlice, RString, RVec};

use crate::{Metadata, OptimizerInfo, PluginError};

/// An opaque pointer to a libtorch tensor (`C_tensor*`), passed across the ABI boundary.
///
/// A handle in [`LossInputs`] is borrowed: the host owns the tensor for the call. A handle in
/// [`LossOutput`] is owned: the plugin gives the tensor to the host, which frees it. With the
/// `tch` feature, [`TensorHandle::borrow`], [`TensorHandle::to_tensor`] and
/// [`TensorHandle::into_owned`] / [`TensorHandle::into_tensor`] convert to and from `tch::Tensor`.
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

#[cfg(feature = "tch")]
impl TensorHandle {
    /// Borrows `tensor` for one call; the caller keeps ownership and must outlive the call.
    pub fn borrow(tensor: &tch::Tensor) -> Self {
        TensorHandle { ptr: tensor.as_ptr() as *mut c_void }
    }

    /// A `tch::Tensor` sharing storage with a borrowed handle; the handle's owner keeps its own.
    ///
    /// # Safety
    /// The handle must point to a live tensor (e.g. one received in [`LossInputs`]).
    pub unsafe fn to_tensor(self) -> tch::Tensor {
        // SAFETY: the pointee is live; ManuallyDrop keeps us from freeing the owner's reference,
        // and shallow_clone takes a reference of our own.
        let view = std::mem::ManuallyDrop::new(unsafe { tch::Tensor::from_ptr(self.ptr.cast()) });
        view.shallow_clone()
    }

    /// Gives `tensor` away: the receiver must take it back with [`TensorHandle::into_tensor`].
    pub fn into_owned(tensor: tch::Tensor) -> Self {
        let mut tensor = std::mem::ManuallyDrop::new(tensor);
        TensorHandle { ptr: tensor.as_mut_ptr().cast() }
    }

    /// Takes ownership of a tensor given away with [`TensorHandle::into_owned`].
    ///
    /// # Safety
    /// The handle must be owned (from [`LossOutput`]) and converted exactly once.
    pub unsafe fn into_tensor(self) -> tch::Tensor {
        // SAFETY: ownership was released by into_owned and is taken back exactly once.
        unsafe { tch::Tensor::from_ptr(self.ptr.cast()) }
    }
}

/// Rewards of one step, with the group each completion belongs to.
#[repr(C)]
#[derive(StableAbi, Debug, Clone, Copy)]
pub struct RewardBatch<'a> {
    /// One reward per completion.
    pub rewards: RSlice<'a, f64>,
    /// The group (prompt) of each completion; completions of a group are contiguous.
    pub group_ids: RSlice<'a, u64>,
}

/// What the trainer passes to compute a loss. Every tensor is borrowed.
#[repr(C)]
#[derive(StableAbi, Debug, Clone)]
pub struct LossInputs {
    /// Policy log-probabilities of the sampled tokens, `[B, T]`, with grad.
    pub logprobs: TensorHandle,
    /// Log-probabilities at sampling time (or of the previous μ-iteration), `[B, T]`, no grad.
    pub old_logprobs: TensorHandle,
    /// Reference log-probabilities, `[B, T]`, when the plugin needs a reference.
    pub ref_logprobs: ROption<TensorHandle>,
    /// Advantages, `[B]` or `[B, T]`.
    pub advantages: TensorHandle,
    /// 1 on completion tokens, 0 on padding, `[B, T]`.
    pub mask: TensorHandle,
    /// Value-head outputs, `[B, T]`, when the plugin needs a value head.
    pub values: ROption<TensorHandle>,
    /// Values at sampling time, `[B, T]`, for value clipping.
    pub old_values: ROption<TensorHandle>,
    /// Returns, `[B, T]`, for the value loss.
    pub returns: ROption<TensorHandle>,
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

/// A loss, owned by the host once returned, and the plugin's metrics.
#[repr(C)]
#[derive(StableAbi, Debug)]
pub struct LossOutput {
    /// Scalar loss with grad; owned (see [`TensorHandle::into_tensor`]).
    pub loss: TensorHandle,
    /// Named scalars for the step's metrics.
    pub metrics: RVec<Metric>,
}

/// An optimizer, as the daemon sees it across the ABI boundary. Plugin authors implement
/// [`OptimizerPlugin`]; the export layer implements this.
#[sabi_trait]
pub trait Optimizer: Send + Sync {
    /// One advantage per completion.
    fn advantages(&self, batch: RewardBatch<'_>) -> RResult<RVec<f64>, PluginError>;

    /// The loss of one micro-batch.
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

    /// Builds an optimizer from its keys of the job spec's `[optimizer]`, as a JSON object.
    fn from_config(config_json: &str) -> Result<Self, PluginError>;

    /// One advantage per completion.
    fn advantages(&self, batch: &RewardBatch<'_>) -> Result<RVec<f64>, PluginError>;

    /// The loss of one micro-batch.
    fn loss(&self, inputs: &LossInputs) -> Result<LossOutput, PluginError>;

    /// Run once at load; a failure refuses the plugin.
    fn self_test() -> Result<(), PluginError> {
        Ok(())
    }
}

#[cfg(all(test, feature = "tch"))]
mod tests {
    use tch::{Kind, Tensor};

    use super::TensorHandle;

    #[test]
    fn borrowed_handles_share_storage_and_leave_the_owner_intact() {
        let owner = Tensor::from_slice(&[1.0f32, 2.0, 3.0]).set_requires_grad(true);
        let handle = TensorHandle::borrow(&owner);
        // SAFETY: `owner` outlives the view.
        let view = unsafe { handle.to_tensor() };
        let loss = (&view * 2.0).sum(Kind::Float);
        drop(view);
        loss.backward();
        assert_eq!(owner.grad().iter::<f64>().unwrap().collect::<Vec<_>>(), [2.0, 2.0, 2.0]);
        assert_eq!(owner.size(), [3]);
    }

    #[test]
    fn owned_handles_hand_the_tensor_over_exactly_once() {
        let input = Tensor::from_slice(&[1.0f32, 2.0]).set_requires_grad(true);
        let loss = (&input * &input).sum(Kind::Float);
        let handle = TensorHandle::into_owned(loss);
        // SAFETY: the handle came from into_owned and is converted once.
        let loss = unsafe { handle.into_tensor() };
        assert_eq!(loss.double_value(&[]), 5.0);
        loss.backward();
        assert_eq!(input.grad().iter::<f64>().unwrap().collect::<Vec<_>>(), [2.0, 4.0]);
    }
}
