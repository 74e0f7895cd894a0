//! libtorch's CUDA caching allocator, where tch does not bind it (`csrc/cuda_memory.cpp`):
//! emptying its cache, and a device's allocation statistics; and recognising libtorch's
//! out-of-memory errors, on any device.
//!
//! Each call first asks c10's allocator registry for the CUDA allocator and says what it found
//! ([`AllocatorState`]): a process without libtorch's CUDA half has none, one without a GPU (or
//! that has not used CUDA yet) has one that is not initialised, and only an initialised one is
//! called. So every function is safe, and a no-op, on a CPU-only machine.

use std::ffi::{c_char, c_int};

use crate::error::{ModelError, Result};
use crate::ffi::checked;

unsafe extern "C" {
    fn rlvr_cuda_allocator_state(state: *mut c_int, error: *mut *mut c_char) -> c_int;
    fn rlvr_cuda_empty_cache(state: *mut c_int, error: *mut *mut c_char) -> c_int;
    fn rlvr_cuda_memory_stats(
        device: c_int,
        state: *mut c_int,
        allocated: *mut i64,
        peak_allocated: *mut i64,
        reserved: *mut i64,
        peak_reserved: *mut i64,
        error: *mut *mut c_char,
    ) -> c_int;
    fn rlvr_cuda_reset_peak(device: c_int, state: *mut c_int, error: *mut *mut c_char) -> c_int;
}

/// What c10's registry holds for CUDA in this process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AllocatorState {
    /// No CUDA allocator: libtorch's CUDA half is not loaded (a CPU-only libtorch, or a binary
    /// linked without it).
    Absent,
    /// Registered, not initialised: no GPU, or CUDA not used yet in this process.
    NotInitialized,
    /// Initialised: it has devices, caches and statistics.
    Initialized,
}

impl AllocatorState {
    fn from_code(code: c_int) -> AllocatorState {
        match code {
            2 => AllocatorState::Initialized,
            1 => AllocatorState::NotInitialized,
            _ => AllocatorState::Absent,
        }
    }
}

/// A device's figures from libtorch's caching allocator, in bytes, over all its pools.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceMemory {
    /// Held by tensors now (`torch.cuda.memory_allocated`).
    pub allocated: u64,
    /// The most held by tensors since the start or the last [`reset_peak`]
    /// (`torch.cuda.max_memory_allocated`).
    pub peak_allocated: u64,
    /// Taken from the device now: allocated plus cached (`torch.cuda.memory_reserved`).
    pub reserved: u64,
    /// The most taken from the device (`torch.cuda.max_memory_reserved`).
    pub peak_reserved: u64,
}

fn device_index(device: usize) -> Result<c_int> {
    c_int::try_from(device).map_err(|_| ModelError::Torch {
        what: "read CUDA memory".to_owned(),
        source: tch::TchError::Torch(format!("no CUDA device {device}")),
    })
}

/// What c10's registry holds for CUDA in this process.
pub fn allocator_state() -> Result<AllocatorState> {
    let (mut state, mut error) = (0, std::ptr::null_mut());
    // SAFETY: plain call writing `state`, or `error` on failure.
    let status = unsafe { rlvr_cuda_allocator_state(&mut state, &mut error) };
    checked("find the CUDA allocator", status, error).map(|()| AllocatorState::from_code(state))
}

/// Gives the allocator's cached, unused blocks back to the device (`torch.cuda.empty_cache()`),
/// so that another process (another job's phase) can use them; the tensors alive keep theirs.
/// Waits for the device's queued work, as freeing device memory does. The state it found: the
/// cache was emptied only when [`AllocatorState::Initialized`].
pub fn empty_cache() -> Result<AllocatorState> {
    let (mut state, mut error) = (0, std::ptr::null_mut());
    // SAFETY: plain call writing `state`, or `error` on failure.
    let status = unsafe { rlvr_cuda_empty_cache(&mut state, &mut error) };
    checked("empty the CUDA cache", status, error).map(|()| AllocatorState::from_code(state))
}

/// CUDA device `device`'s allocation figures (its index in this process); `None` when the
/// allocator is absent or not initialised (nothing was allocated on a GPU here).
pub fn device_memory(device: usize) -> Result<Option<DeviceMemory>> {
    let device = device_index(device)?;
    let (mut state, mut error) = (0, std::ptr::null_mut());
    let (mut allocated, mut peak_allocated, mut reserved, mut peak_reserved) = (0i64, 0i64, 0i64, 0i64);
    // SAFETY: plain call writing the figures and `state`, or `error` on failure.
    let status = unsafe {
        rlvr_cuda_memory_stats(
            device,
            &mut state,
            &mut allocated,
            &mut peak_allocated,
            &mut reserved,
            &mut peak_reserved,
            &mut error,
        )
    };
    checked("read CUDA memory", status, error)?;
    let bytes = |value: i64| u64::try_from(value).unwrap_or(0);
    Ok((AllocatorState::from_code(state) == AllocatorState::Initialized).then(|| DeviceMemory {
        allocated: bytes(allocated),
        peak_allocated: bytes(peak_allocated),
        reserved: bytes(reserved),
        peak_reserved: bytes(peak_reserved),
    }))
}

/// Starts CUDA device `device`'s peaks again from its current figures
/// (`torch.cuda.reset_peak_memory_stats`); the state it found (reset only when initialised).
pub fn reset_peak(device: usize) -> Result<AllocatorState> {
    let device = device_index(device)?;
    let (mut state, mut error) = (0, std::ptr::null_mut());
    // SAFETY: plain call writing `state`, or `error` on failure.
    let status = unsafe { rlvr_cuda_reset_peak(device, &mut state, &mut error) };
    checked("reset the CUDA memory peaks", status, error).map(|()| AllocatorState::from_code(state))
}

/// Whether `message` (a libtorch error, or a panic carrying one) says an allocation failed, on
/// any device. libtorch 2.11's words for it:
/// - CUDA's caching allocator: `CUDA out of memory. Tried to allocate …` (past the device or the
///   `per_process_memory_fraction` cap), the cudaMallocAsync backend `… would exceed allowed
///   memory. (out of memory)`, a CUDA call's `CUDA error: out of memory`;
/// - the CPU allocator: `DefaultCPUAllocator: can't allocate memory: you tried to allocate …`,
///   c10's `C10 Out of Memory. Trying to allocate …`, oneMKL's `Not enough memory to allocate`;
/// - C++'s own `std::bad_alloc`.
pub fn is_out_of_memory(message: &str) -> bool {
    let message = message.to_lowercase();
    ["out of memory", "can't allocate memory", "not enough memory", "std::bad_alloc"]
        .iter()
        .any(|words| message.contains(words))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// On a machine without a GPU every call answers, none throws or aborts, and nothing is
    /// read: the CUDA allocator is absent (this test binary does not load libtorch's CUDA half)
    /// or not initialised (CUDA never ran here). The worker's own test checks the second with the
    /// CUDA half loaded.
    #[test]
    fn without_a_gpu_every_call_is_a_safe_no_op() {
        if tch::Cuda::is_available() {
            return;
        }
        let state = allocator_state().unwrap();
        assert_ne!(state, AllocatorState::Initialized);
        assert_eq!(empty_cache().unwrap(), state);
        assert_eq!(device_memory(0).unwrap(), None);
        assert_eq!(device_memory(7).unwrap(), None);
        assert_eq!(reset_peak(0).unwrap(), state);
    }

    /// A real allocation failure of libtorch's CPU allocator (a petabyte) is recognised, through
    /// tch's error and through the panic of tch's unchecked call; other errors are not.
    #[test]
    fn libtorch_allocation_failures_are_recognised() {
        let huge = [1i64 << 48];
        let error = tch::Tensor::f_empty(huge, (tch::Kind::Float, tch::Device::Cpu))
            .expect_err("a petabyte cannot be allocated");
        assert!(is_out_of_memory(&error.to_string()), "{error}");
        let panic =
            std::panic::catch_unwind(|| tch::Tensor::empty(huge, (tch::Kind::Float, tch::Device::Cpu)))
                .expect_err("tch's unchecked call panics");
        let text = panic.downcast_ref::<String>().cloned().unwrap_or_default();
        assert!(is_out_of_memory(&text), "{text}");
        for words in [
            "CUDA out of memory. Tried to allocate 20.00 MiB. GPU 0 has a total capacity of 79.19 GiB",
            "CUDA error: out of memory",
            "Not enough memory to allocate",
            "std::bad_alloc",
        ] {
            assert!(is_out_of_memory(words), "{words}");
        }
        for other in ["the loss is NaN", "index 7 is out of bounds for dimension 0", "shape mismatch"] {
            assert!(!is_out_of_memory(other), "{other}");
        }
    }
}
