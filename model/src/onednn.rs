//! Float32 linear layers on CPU through oneDNN (`csrc/onednn_linear.cpp`), with their backward.
//!
//! libtorch 2.11's pip build computes float32 `linear` on CPU with MKL, which on AMD processors
//! runs its AVX2 kernels; oneDNN, in the same libtorch, runs AVX-512 where the CPU has it:
//! about 2× faster products on the AMD EPYC (Zen 4) development machine
//! (`scripts/bench/cpu-matmul.py`; the whole-step effect is in the README's trainer benchmark).
//! Results are float32 products summed in another order than MKL's: they differ from
//! `Tensor::linear` by float rounding only.
//!
//! [`linear`] is used for float32 CPU tensors when [`enabled`]; everything else (CUDA, bf16)
//! keeps `Tensor::linear`. `RLVR_CPU_MATMUL=blas` turns it off (to compare, or as a way out).
//!
//! bf16 layers keep libtorch's kernels.

use std::ffi::{c_char, c_int};
use std::sync::OnceLock;

use tch::{Device, Kind, Tensor};
use torch_sys::C_tensor;

use crate::ffi::take_message;

unsafe extern "C" {
    fn rlvr_onednn_available(error: *mut *mut c_char) -> c_int;
    fn rlvr_onednn_linear(
        x: *const C_tensor,
        w: *const C_tensor,
        b: *const C_tensor,
        out: *mut *mut C_tensor,
        error: *mut *mut c_char,
    ) -> c_int;
}

/// Which products float32 CPU linear layers use, decided once per process: oneDNN, or
/// libtorch's BLAS with the reason (`RLVR_CPU_MATMUL=blas`, or this libtorch lacks the operator).
pub fn status() -> &'static Result<(), String> {
    static STATUS: OnceLock<Result<(), String>> = OnceLock::new();
    STATUS.get_or_init(|| {
        if std::env::var("RLVR_CPU_MATMUL").is_ok_and(|v| v == "blas") {
            return Err("RLVR_CPU_MATMUL=blas".to_owned());
        }
        let mut error = std::ptr::null_mut();
        // SAFETY: plain call; `error` is written only on failure.
        match unsafe { rlvr_onednn_available(&mut error) } {
            1 => Ok(()),
            _ => Err(format!("this libtorch has no oneDNN linear operator: {}", take_message(error))),
        }
    })
}

/// Whether float32 CPU linear layers go through oneDNN (see [`status`]).
pub fn enabled() -> bool {
    status().is_ok()
}

/// Whether [`linear`] applies to these tensors.
pub fn applies(x: &Tensor, weight: &Tensor) -> bool {
    x.device() == Device::Cpu && x.kind() == Kind::Float && weight.kind() == Kind::Float && enabled()
}

/// `x · weightᵀ + bias` through oneDNN, differentiable in all three; `x [..., K]`,
/// `weight [N, K]`, `bias [N]`. Panics on a libtorch error, as `Tensor::linear` does.
pub fn linear(x: &Tensor, weight: &Tensor, bias: Option<&Tensor>) -> Tensor {
    let mut out = std::ptr::null_mut();
    let mut error = std::ptr::null_mut();
    let bias_ptr = bias.map_or(std::ptr::null(), Tensor::as_ptr);
    // SAFETY: the tensors outlive the call; on success `out` is a new at::Tensor that the
    // returned Tensor owns (and frees with at_free, i.e. delete).
    let status = unsafe { rlvr_onednn_linear(x.as_ptr(), weight.as_ptr(), bias_ptr, &mut out, &mut error) };
    if status != 0 {
        panic!("oneDNN linear layer: {}", take_message(error));
    }
    unsafe { Tensor::from_ptr(out) }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Forward and every gradient equal `Tensor::linear`'s within float32 rounding, with and
    /// without bias, on 2-D and 3-D inputs.
    #[test]
    fn matches_tensor_linear_forward_and_backward() {
        assert!(enabled(), "this libtorch has mkldnn::_linear_pointwise");
        tch::manual_seed(0);
        for (shape, bias) in [(vec![5i64, 7], false), (vec![2, 3, 7], true), (vec![1, 7], true)] {
            let x = Tensor::randn(shape.as_slice(), (Kind::Float, Device::Cpu)).set_requires_grad(true);
            let w = Tensor::randn([4, 7], (Kind::Float, Device::Cpu)).set_requires_grad(true);
            let b = bias.then(|| Tensor::randn([4], (Kind::Float, Device::Cpu)).set_requires_grad(true));
            let upstream = Tensor::randn_like(&x.linear(&w, b.as_ref()));
            let run = |ours: bool| {
                for t in [Some(&x), Some(&w), b.as_ref()].into_iter().flatten() {
                    let mut g = t.grad();
                    if g.defined() {
                        let _ = g.zero_();
                    }
                }
                let y = if ours { linear(&x, &w, b.as_ref()) } else { x.linear(&w, b.as_ref()) };
                (&y * &upstream).sum(Kind::Float).backward();
                let grads: Vec<Tensor> =
                    [Some(&x), Some(&w), b.as_ref()].into_iter().flatten().map(|t| t.grad().copy()).collect();
                (y.detach(), grads)
            };
            let (y_ref, g_ref) = run(false);
            let (y, g) = run(true);
            assert_eq!(y.size(), y_ref.size());
            let close = |a: &Tensor, b: &Tensor| a.allclose(b, 1e-5, 1e-5, false);
            assert!(close(&y, &y_ref), "forward, shape {shape:?}");
            for (i, (a, b)) in g.iter().zip(&g_ref).enumerate() {
                assert!(close(a, b), "gradient {i}, shape {shape:?}");
            }
        }
    }
}
