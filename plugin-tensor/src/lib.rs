//! [`TensorHandle`]s to and from `tch::Tensor`: what optimizer plugins and the worker need to
//! pass tensors across the plugin boundary.
//!
//! A separate crate, not a feature of `rlvr-plugin-api`: Cargo unifies features across a
//! workspace build, so a `tch` feature there, turned on by any optimizer plugin, would make every
//! crate that depends on the plugin API link libtorch — the control plane and the CLI included.
#![deny(missing_docs)]

use std::ffi::c_void;

use rlvr_plugin_api::TensorHandle;

/// Conversions between [`TensorHandle`] and `tch::Tensor`.
pub trait TensorHandleExt: Sized {
    /// Borrows `tensor` for one call; the caller keeps ownership and must outlive the call.
    fn borrow(tensor: &tch::Tensor) -> Self;

    /// A `tch::Tensor` sharing storage with a borrowed handle; the handle's owner keeps its own.
    ///
    /// # Safety
    /// The handle must point to a live tensor (e.g. one received in `LossInputs`).
    unsafe fn to_tensor(self) -> tch::Tensor;

    /// Gives `tensor` away: the receiver must take it back with [`TensorHandleExt::into_tensor`].
    fn into_owned(tensor: tch::Tensor) -> Self;

    /// Takes ownership of a tensor given away with [`TensorHandleExt::into_owned`].
    ///
    /// # Safety
    /// The handle must be owned (from `LossOutput` or `AdvantageOutput`) and converted exactly
    /// once.
    unsafe fn into_tensor(self) -> tch::Tensor;
}

impl TensorHandleExt for TensorHandle {
    fn borrow(tensor: &tch::Tensor) -> Self {
        // SAFETY: the caller keeps `tensor` alive for as long as the handle is used.
        unsafe { TensorHandle::from_ptr(tensor.as_ptr() as *mut c_void) }
    }

    unsafe fn to_tensor(self) -> tch::Tensor {
        // SAFETY: the pointee is live; ManuallyDrop keeps us from freeing the owner's reference,
        // and shallow_clone takes a reference of our own.
        let view = std::mem::ManuallyDrop::new(unsafe { tch::Tensor::from_ptr(self.as_ptr().cast()) });
        view.shallow_clone()
    }

    fn into_owned(tensor: tch::Tensor) -> Self {
        let mut tensor = std::mem::ManuallyDrop::new(tensor);
        // SAFETY: the tensor's reference is released to the handle, taken back by into_tensor.
        unsafe { TensorHandle::from_ptr(tensor.as_mut_ptr().cast()) }
    }

    unsafe fn into_tensor(self) -> tch::Tensor {
        // SAFETY: ownership was released by into_owned and is taken back exactly once.
        unsafe { tch::Tensor::from_ptr(self.as_ptr().cast()) }
    }
}

#[cfg(test)]
mod tests {
    use tch::{Kind, Tensor};

    use super::*;

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
