//! libtorch's process-wide numerics settings that tch does not bind (`csrc/cuda_settings.cpp`):
//! TF32 for float32 matrix products on CUDA, and deterministic algorithms only.
//!
//! Both are global to the process (libtorch's `at::globalContext()`), so a worker sets them once,
//! before its first tensor operation. They can be set and read without a GPU; on a CPU, TF32
//! changes no result.

use std::ffi::{c_char, c_int};

use crate::error::Result;
use crate::ffi::checked;

unsafe extern "C" {
    fn rlvr_set_tf32(allow: c_int, error: *mut *mut c_char) -> c_int;
    fn rlvr_tf32(allowed: *mut c_int, error: *mut *mut c_char) -> c_int;
    fn rlvr_set_deterministic(on: c_int, error: *mut *mut c_char) -> c_int;
    fn rlvr_deterministic(on: *mut c_int, error: *mut *mut c_char) -> c_int;
}

/// Allows or forbids TF32 tensor cores for float32 matrix products on CUDA
/// (`torch.backends.cuda.matmul.allow_tf32`). libtorch's default is forbidden.
pub fn set_tf32(allow: bool) -> Result<()> {
    let mut error = std::ptr::null_mut();
    // SAFETY: plain call; `error` is written only on failure.
    let status = unsafe { rlvr_set_tf32(c_int::from(allow), &mut error) };
    checked("set TF32", status, error)
}

/// Whether TF32 is allowed for float32 matrix products on CUDA.
pub fn tf32() -> Result<bool> {
    let (mut allowed, mut error) = (0, std::ptr::null_mut());
    // SAFETY: plain call writing `allowed`, or `error` on failure.
    let status = unsafe { rlvr_tf32(&mut allowed, &mut error) };
    checked("read TF32", status, error).map(|()| allowed != 0)
}

/// Makes every operation without a deterministic implementation fail instead of running
/// (`torch.use_deterministic_algorithms(on)`, not warn-only). On CUDA, cuBLAS is deterministic
/// only with `CUBLAS_WORKSPACE_CONFIG=:4096:8` (or `:16:8`) in the environment before the first
/// product; without it libtorch refuses cuBLAS products while this is on.
pub fn set_deterministic(on: bool) -> Result<()> {
    let mut error = std::ptr::null_mut();
    // SAFETY: plain call; `error` is written only on failure.
    let status = unsafe { rlvr_set_deterministic(c_int::from(on), &mut error) };
    checked("set deterministic algorithms", status, error)
}

/// Whether `message` (a libtorch error, or a panic carrying one) is the refusal of an operation
/// that has no deterministic implementation while [`set_deterministic`] is on. libtorch words
/// every such refusal the same way (`Context::alertNotDeterministic`).
pub fn is_determinism_refusal(message: &str) -> bool {
    message.contains("does not have a deterministic implementation")
}

/// Whether only deterministic algorithms may run.
pub fn deterministic() -> Result<bool> {
    let (mut on, mut error) = (0, std::ptr::null_mut());
    // SAFETY: plain call writing `on`, or `error` on failure.
    let status = unsafe { rlvr_deterministic(&mut on, &mut error) };
    checked("read deterministic algorithms", status, error).map(|()| on != 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each setting reads back what was set, both ways, on a machine without a GPU too; the
    /// defaults are restored. (The settings are global: one test touches them.)
    #[test]
    fn settings_round_trip() {
        let before = (tf32().unwrap(), deterministic().unwrap());
        assert_eq!(before, (false, false), "libtorch's defaults");
        for on in [true, false, true] {
            set_tf32(on).unwrap();
            assert_eq!(tf32().unwrap(), on);
            set_deterministic(on).unwrap();
            assert_eq!(deterministic().unwrap(), on);
        }
        // With it on, an operation without a deterministic kernel fails (`put_` without
        // accumulation, on a CPU too) in the words the worker recognises.
        set_deterministic(true).unwrap();
        let target = tch::Tensor::zeros([4], (tch::Kind::Float, tch::Device::Cpu));
        let refusal = target
            .f_put(&tch::Tensor::from_slice(&[1i64]), &tch::Tensor::from_slice(&[2f32]), false)
            .expect_err("put_ is refused");
        assert!(is_determinism_refusal(&refusal.to_string()), "{refusal}");
        assert!(!is_determinism_refusal("the loss is NaN"));
        set_tf32(before.0).unwrap();
        set_deterministic(before.1).unwrap();
        assert_eq!((tf32().unwrap(), deterministic().unwrap()), before);
    }
}
