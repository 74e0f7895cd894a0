//! What the worker's optimizer needs of libtorch that tch does not bind (`csrc/optimizer.cpp`):
//! [`fused_adamw`], libtorch's `_fused_adamw_`, the kernel behind
//! `torch.optim.AdamW(fused=True)`; and [`clear_grad`], a gradient set to none.
//!
//! The fused update makes one pass over each parameter's weights, gradient and moments, vectorised and threaded on CPU
//! and a few kernel launches on CUDA, where the single-tensor update makes eight passes and
//! eight dispatches per parameter (and a GPU step is bound by launches). It needs no scratch
//! memory.

use std::ffi::{c_char, c_int};

use tch::{Kind, Tensor};
use torch_sys::C_tensor;

use crate::error::{ModelError, Result};
use crate::ffi::checked;

unsafe extern "C" {
    fn rlvr_fused_adamw(
        params: *const *const C_tensor,
        grads: *const *const C_tensor,
        exp_avgs: *const *const C_tensor,
        exp_avg_sqs: *const *const C_tensor,
        count: usize,
        step: f64,
        lr: f64,
        beta1: f64,
        beta2: f64,
        weight_decay: f64,
        eps: f64,
        error: *mut *mut c_char,
    ) -> c_int;
    fn rlvr_clear_grad(tensor: *const C_tensor, error: *mut *mut c_char) -> c_int;
}

/// Sets `tensor`'s gradient to none (`zero_grad(set_to_none=True)`, PyTorch's default): the next
/// backward pass hands its gradient over as it is, where a zeroed gradient costs a pass writing
/// zeros and another adding to them. Panics on a libtorch error, as tch's `zero_grad` does.
pub fn clear_grad(tensor: &Tensor) {
    let mut error = std::ptr::null_mut();
    // SAFETY: a live at::Tensor handle, borrowed for the call; `error` is written only on failure.
    let status = unsafe { rlvr_clear_grad(tensor.as_ptr(), &mut error) };
    if let Err(error) = checked("clearing a gradient", status, error) {
        panic!("{error}");
    }
}

/// One parameter's part in an update: its f32 weights (changed in place), its f32 gradient, and
/// its f32 moments (changed in place).
#[derive(Clone, Copy)]
pub struct AdamWSlot<'a> {
    pub weights: &'a Tensor,
    pub grad: &'a Tensor,
    pub exp_avg: &'a Tensor,
    pub exp_avg_sq: &'a Tensor,
}

/// AdamW's hyper-parameters for one update.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AdamWUpdate {
    /// The update's number, from 1 (bias correction).
    pub step: i64,
    pub lr: f64,
    pub beta1: f64,
    pub beta2: f64,
    pub weight_decay: f64,
    pub eps: f64,
}

/// Updates every slot in place as `torch.optim.AdamW(fused=True)` does (decoupled weight decay,
/// bias correction, no AMSGrad). Every tensor must be contiguous float32, all on one device, with
/// a gradient and moments shaped like their weights: refused with the slot's index otherwise,
/// before anything changes. (Autograd lays a parameter's gradient out as the parameter.)
pub fn fused_adamw(slots: &[AdamWSlot<'_>], update: AdamWUpdate) -> Result<()> {
    let Some(first) = slots.first() else { return Ok(()) };
    let device = first.weights.device();
    for (index, slot) in slots.iter().enumerate() {
        let shape = slot.weights.size();
        for (what, tensor) in [
            ("weights", slot.weights),
            ("gradient", slot.grad),
            ("exp_avg", slot.exp_avg),
            ("exp_avg_sq", slot.exp_avg_sq),
        ] {
            // The kernel walks each tensor's memory in order: a strided one would be updated at
            // the wrong elements without a word (measured in torch 2.11 on CPU).
            let contiguous = tensor.is_contiguous();
            if tensor.kind() != Kind::Float
                || tensor.device() != device
                || tensor.size() != shape
                || !contiguous
            {
                return Err(ModelError::InvalidInput(format!(
                    "fused AdamW, parameter {index}: its {what} is {:?} {:?} on {:?}{}; the update needs \
                     contiguous float32 {shape:?} on {device:?}",
                    tensor.kind(),
                    tensor.size(),
                    tensor.device(),
                    if contiguous { "" } else { ", strided" }
                )));
            }
        }
    }
    let mut handles: [Vec<*const C_tensor>; 4] = Default::default();
    for slot in slots {
        for (list, tensor) in handles.iter_mut().zip([slot.weights, slot.grad, slot.exp_avg, slot.exp_avg_sq])
        {
            list.push(tensor.as_ptr());
        }
    }
    let [params, grads, exp_avgs, exp_avg_sqs] = handles;
    let AdamWUpdate { step, lr, beta1, beta2, weight_decay, eps } = update;
    let mut error = std::ptr::null_mut();
    // SAFETY: four arrays of `slots.len()` live at::Tensor handles (borrowed for the call);
    // `error` is written only on failure.
    let status = unsafe {
        rlvr_fused_adamw(
            params.as_ptr(),
            grads.as_ptr(),
            exp_avgs.as_ptr(),
            exp_avg_sqs.as_ptr(),
            slots.len(),
            step as f64,
            lr,
            beta1,
            beta2,
            weight_decay,
            eps,
            &mut error,
        )
    };
    checked("fused AdamW", status, error)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn update() -> AdamWUpdate {
        AdamWUpdate { step: 1, lr: 1e-2, beta1: 0.9, beta2: 0.999, weight_decay: 0.1, eps: 1e-8 }
    }

    /// A tensor that is not float32, not shaped like its weights or strided, is refused with the slot's
    /// index and what it is, and no slot changes (the check comes before the kernel).
    #[test]
    fn a_slot_the_kernel_cannot_take_is_refused_before_anything_changes() {
        let weights = Tensor::ones([3], (Kind::Float, tch::Device::Cpu));
        let moments = [(); 2].map(|()| Tensor::zeros([3], (Kind::Float, tch::Device::Cpu)));
        let grad = Tensor::ones([3], (Kind::Float, tch::Device::Cpu));
        let good =
            AdamWSlot { weights: &weights, grad: &grad, exp_avg: &moments[0], exp_avg_sq: &moments[1] };
        let cases = [
            ("bf16 gradient", grad.to_kind(Kind::BFloat16), "parameter 1: its gradient is BFloat16"),
            (
                "short gradient",
                Tensor::ones([2], (Kind::Float, tch::Device::Cpu)),
                "parameter 1: its gradient is Float [2]",
            ),
            (
                "strided gradient",
                Tensor::ones([3, 2], (Kind::Float, tch::Device::Cpu)).select(1, 0),
                "parameter 1: its gradient is Float [3] on Cpu, strided",
            ),
        ];
        for (what, bad_grad, expected) in cases {
            let second = AdamWSlot { grad: &bad_grad, ..good };
            let error = fused_adamw(&[good, second], update()).expect_err(what).to_string();
            assert!(error.contains(expected), "{what}: {error}");
            assert!(
                weights.equal(&Tensor::ones([3], (Kind::Float, tch::Device::Cpu))),
                "{what}: weights changed"
            );
        }
        fused_adamw(&[], update()).expect("no parameters: nothing to do");
    }

    /// A cleared gradient is none, and the next backward pass sets it to its own gradient (not
    /// added to the old one).
    #[test]
    fn a_cleared_gradient_is_none_until_the_next_backward() {
        let w = Tensor::ones([2], (Kind::Float, tch::Device::Cpu)).set_requires_grad(true);
        (&w * 3.0).sum(Kind::Float).backward();
        clear_grad(&w);
        assert!(!w.grad().defined());
        clear_grad(&w);
        (&w * 2.0).sum(Kind::Float).backward();
        assert_eq!(Vec::<f32>::try_from(w.grad()).unwrap(), [2.0, 2.0]);
    }

    /// One update from zero moments moves every weight against its gradient's sign by about
    /// `lr` (Adam's first step is lr·sign(g)), after decay.
    #[test]
    fn a_first_update_moves_each_weight_by_about_lr() {
        let weights = Tensor::from_slice(&[1.0f32, -2.0, 0.5]);
        let grad = Tensor::from_slice(&[0.3f32, -4.0, 1e-3]);
        let moments = [(); 2].map(|()| Tensor::zeros([3], (Kind::Float, tch::Device::Cpu)));
        let slot =
            AdamWSlot { weights: &weights, grad: &grad, exp_avg: &moments[0], exp_avg_sq: &moments[1] };
        fused_adamw(&[slot], update()).unwrap();
        let got = Vec::<f32>::try_from(&weights).unwrap();
        let decay = 1.0 - 1e-2 * 0.1;
        for ((now, before), g) in got.iter().zip([1.0f32, -2.0, 0.5]).zip([0.3f32, -4.0, 1e-3]) {
            let want = before * decay - 1e-2 * g.signum();
            assert!((now - want).abs() < 1e-5, "{before} with gradient {g}: {now}, want {want}");
        }
    }
}
