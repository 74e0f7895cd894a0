//! The job's memory on its device: the cap the daemon gives (`--memory-cap`), the watchdog that
//! holds a CPU worker to it, the run's peak, and the report of a worker that ran out.
//!
//! - **CPU**: a thread samples the process's resident size (`/proc/self/statm`) every
//!   [`SAMPLE_EVERY`]; past the cap it writes the [`OutOfMemory`] line and ends the process at once
//!   with [`WorkerExit::OutOfMemory`] (`_exit`, as SIGKILL would: checkpoints are written under a
//!   temporary name and renamed, and a resume cuts the logs back to the last one, so nothing is
//!   left half-written). The resident size counts libtorch's own pages too (about 0.4 GB of a
//!   CPU worker before any model), as the scheduler's `memory_gb` does.
//! - **CUDA**: the daemon caps libtorch's caching allocator for the worker's process
//!   (`PYTORCH_CUDA_ALLOC_CONF=per_process_memory_fraction:…`); an allocation past it fails in
//!   libtorch with `CUDA out of memory`. The peak is the allocator's (`max_memory_allocated`).
//! - **Either**: an error or panic whose text is libtorch's allocation failure
//!   ([`rlvr_model::cuda_memory::is_out_of_memory`]) ends the worker the same way, with the same
//!   line ([`out_of_memory`], called by `main`).
//!
//! The phase a report names is the one the worker last asked a grant for ([`enter`], from
//! `grants`). One job per process, so the state is the process's.
//!
//! Why a watchdog and not `RLIMIT_AS` or a cgroup: `RLIMIT_AS` bounds address space, not memory
//! (libtorch and its CUDA half map far more than they touch), and a failed `mmap` surfaces wherever
//! it happens, often an abort, without the numbers. A memory cgroup per worker needs a delegated
//! cgroup tree the daemon may not have, and its OOM killer's SIGKILL would read as a crash. Reading
//! `/proc/self/statm` every 50 ms costs microseconds; what it can miss is a spike shorter than that,
//! which the kernel's own OOM killer still bounds. `main.rs` turns an error or panic in libtorch's
//! out-of-memory words into the same exit.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::time::Duration;

use rlvr_protocol::grants::Phase;
use rlvr_protocol::worker::{OutOfMemory, WorkerExit};
use tch::Device;
use tracing::{error, warn};

/// How often the CPU watchdog reads the resident size.
pub const SAMPLE_EVERY: Duration = Duration::from_millis(50);

/// The device and cap of this process's job, once [`watch`] has run.
struct Watch {
    device: Device,
    cap: Option<u64>,
    /// The largest resident size sampled (CPU).
    peak: AtomicU64,
}

static WATCH: OnceLock<Watch> = OnceLock::new();
/// The device phase last begun: 0 none yet, else 1 + its index in [`Phase::ALL`].
static PHASE: AtomicU8 = AtomicU8::new(0);

/// Holds this process to `cap` bytes on `device`: on a CPU a watchdog thread ends the process
/// past it (and measures the peak, with or without a cap). Called once, first thing in a run;
/// later calls change nothing.
pub fn watch(device: Device, cap: Option<u64>) -> std::io::Result<()> {
    if WATCH.set(Watch { device, cap, peak: AtomicU64::new(0) }).is_err() {
        return Ok(());
    }
    if device != Device::Cpu {
        return Ok(());
    }
    // Sampled once here, so the peak and a cap already passed are seen before anything else.
    sample();
    std::thread::Builder::new().name("memory-watch".into()).spawn(|| {
        loop {
            std::thread::sleep(SAMPLE_EVERY);
            sample();
        }
    })?;
    Ok(())
}

/// Notes the device phase the worker begins (it is about to ask for, or holds, its grant).
pub fn enter(phase: Phase) {
    let code = Phase::ALL.iter().position(|p| *p == phase).map_or(0, |index| index as u8 + 1);
    PHASE.store(code, Ordering::SeqCst);
}

/// The device phase last begun; `None` before the first.
pub fn phase() -> Option<Phase> {
    let code = PHASE.load(Ordering::SeqCst);
    code.checked_sub(1).and_then(|index| Phase::ALL.get(usize::from(index)).copied())
}

/// The most this run has held on its device so far: the largest resident size sampled on a
/// CPU, libtorch's allocator's peak on CUDA; `None` before [`watch`] or when it cannot be read.
pub fn peak_bytes() -> Option<u64> {
    let watch = WATCH.get()?;
    match watch.device {
        Device::Cuda(index) => match rlvr_model::cuda_memory::device_memory(index) {
            Ok(memory) => memory.map(|memory| memory.peak_allocated),
            Err(error) => {
                warn!(%error, "cannot read the CUDA allocator's peak");
                None
            }
        },
        _ => {
            let now = resident_bytes().unwrap_or(0);
            Some(watch.peak.fetch_max(now, Ordering::SeqCst).max(now)).filter(|peak| *peak > 0)
        }
    }
}

/// The report for a worker that ends on `message` when it is libtorch's allocation failure
/// (`None` for any other message).
pub fn out_of_memory(message: &str) -> Option<OutOfMemory> {
    rlvr_model::cuda_memory::is_out_of_memory(message).then(report)
}

/// Gives libtorch's cached device memory back after a phase (a no-op on a CPU, and where CUDA
/// was never initialised), so the next job's phase on the device finds it free.
pub fn release(device: Device) {
    if !matches!(device, Device::Cuda(_)) {
        return;
    }
    if let Err(error) = rlvr_model::cuda_memory::empty_cache() {
        warn!(%error, "cannot empty libtorch's CUDA cache; the next phase on this device has less memory");
    }
}

/// Where this process stands now, as a report.
fn report() -> OutOfMemory {
    let watch = WATCH.get();
    OutOfMemory {
        device: watch.map_or_else(|| "unknown".to_owned(), |watch| device_name(watch.device)),
        phase: phase(),
        peak_bytes: peak_bytes().unwrap_or(0),
        cap_bytes: watch.and_then(|watch| watch.cap),
    }
}

/// `cpu`, `cuda:0`.
fn device_name(device: Device) -> String {
    match device {
        Device::Cuda(index) => format!("cuda:{index}"),
        Device::Cpu => "cpu".to_owned(),
        other => format!("{other:?}").to_lowercase(),
    }
}

/// One look at the resident size: the peak moves, and past the cap the process ends.
fn sample() {
    let (Some(watch), Some(now)) = (WATCH.get(), resident_bytes()) else { return };
    let peak = watch.peak.fetch_max(now, Ordering::SeqCst).max(now);
    if let Some(cap) = watch.cap
        && now > cap
    {
        let report = OutOfMemory {
            device: device_name(watch.device),
            phase: phase(),
            peak_bytes: peak,
            cap_bytes: Some(cap),
        };
        error!(peak = peak, cap = cap, "resident size past --memory-cap: ending the worker");
        // The worker's last word, which the daemon reads back; then out at once.
        eprintln!("rlvr-worker: {report}");
        // SAFETY: _exit ends the process without running destructors or atexit handlers, as
        // SIGKILL would; the run's files are safe against that (module docs).
        unsafe { libc::_exit(i32::from(WorkerExit::OutOfMemory.code())) };
    }
}

/// The process's resident size, in bytes (`/proc/self/statm`'s second field, in pages).
fn resident_bytes() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = text.split_whitespace().nth(1)?.parse().ok()?;
    // SAFETY: sysconf reads a constant of the system.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    Some(pages * u64::try_from(page).ok().filter(|page| *page > 0)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Phases read back as entered; the resident size is a plausible figure.
    #[test]
    fn phases_and_the_resident_size_read_back() {
        for phase_ in Phase::ALL {
            enter(phase_);
            assert_eq!(phase(), Some(phase_));
        }
        let resident = resident_bytes().expect("statm");
        assert!(resident > 1 << 20 && resident < 1 << 40, "{resident}");
    }

    /// In this binary libtorch's CUDA half is loaded (`build.rs` links it as the worker's): its
    /// allocator is registered but, with no GPU, never initialised, and giving a phase's memory
    /// back or reading its peak on `cuda:0` is a no-op that neither throws nor aborts.
    #[test]
    fn without_a_gpu_the_cuda_allocator_is_registered_and_left_alone() {
        use rlvr_model::cuda_memory::{
            AllocatorState, allocator_state, device_memory, empty_cache, reset_peak,
        };
        if tch::Cuda::is_available() {
            return;
        }
        assert_eq!(allocator_state().unwrap(), AllocatorState::NotInitialized);
        assert_eq!(empty_cache().unwrap(), AllocatorState::NotInitialized);
        assert_eq!(reset_peak(0).unwrap(), AllocatorState::NotInitialized);
        assert_eq!(device_memory(0).unwrap(), None);
        release(Device::Cuda(0));
        release(Device::Cpu);
    }
}
