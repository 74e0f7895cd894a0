//! What libtorch can do in this process: its version and directory, whether its CUDA half is
//! loaded, the CUDA, cuDNN, NCCL and cuBLAS it uses, the devices it sees. `rlvr-worker doctor`
//! prints it; a run checks the device it was given against it and records its platform.
//!
//! The loaded libraries are read from `/proc/self/maps` rather than trusted from the build: the
//! question is what the dynamic loader found, on this host, with its `LD_LIBRARY_PATH`. The
//! versions of libraries libtorch loads (cudart, NCCL, cuBLASLt) are asked of those libraries
//! through their C entry points, found with `dlsym` in the process's global scope, since libtorch
//! has no call for them; each is asked only when it is loaded.

use std::ffi::{CStr, c_int, c_void};
use std::path::{Path, PathBuf};

use rlvr_protocol::runtime::{RunPlatform, TorchRuntime};
use tch::Device;

use crate::WorkerError;

/// The report of this process.
pub fn report() -> TorchRuntime {
    let libraries = loaded_libraries();
    let libtorch_cpu = libraries.iter().find(|path| file_name_starts(path, "libtorch_cpu.so"));
    let libtorch_dir = libtorch_cpu.and_then(|path| path.parent()).map(Path::to_path_buf);
    let cuda_built = libtorch_dir.as_ref().is_some_and(|dir| dir.join("libtorch_cuda.so").exists());
    let cuda_loaded = libraries.iter().any(|path| file_name_starts(path, "libtorch_cuda.so"));
    // libtorch answers CUDA questions through hooks its CUDA half registers; without them the
    // version calls throw (tch's wrappers would panic), so they are asked only when it is loaded
    // and through `torch_call`.
    let cuda_runtime = cuda_loaded
        // SAFETY: argument-less calls of torch-sys' C API; errors are caught by torch_call.
        .then(|| torch_call(|| unsafe { torch_sys::at_context_version_cudart() }))
        .flatten()
        .map(|code| dotted_version(code, 1000, 10));
    let cudnn = cuda_loaded
        // SAFETY: as above.
        .then(|| torch_call(|| unsafe { torch_sys::at_context_version_cudnn() }))
        .flatten()
        .filter(|code| *code > 0)
        .map(|code| dotted_triple(code, 10_000, 100));
    let cuda_driver = cuda_loaded.then(driver_version).flatten();
    let cuda_available = cuda_loaded && tch::Cuda::is_available();
    let cuda_devices = if cuda_available { tch::Cuda::device_count() } else { 0 };
    let mut runtime = TorchRuntime {
        libtorch_version: libtorch_dir.as_deref().and_then(libtorch_version),
        libtorch_dir: libtorch_dir.as_ref().map(|dir| dir.display().to_string()),
        cuda_built,
        cuda_loaded,
        cuda_runtime,
        cuda_driver,
        cuda_available,
        cuda_devices,
        cudnn,
        nccl: nccl_version(),
        cublas: cublas_version(),
        cpu_matmul: cpu_matmul(),
        cpu_threads: tch::utils::get_num_threads(),
        problems: Vec::new(),
    };
    runtime.problems = problems(&runtime, Path::new("/dev/nvidiactl").exists());
    runtime
}

/// What is wrong with `runtime`, given whether this host has an NVIDIA device node.
fn problems(runtime: &TorchRuntime, nvidia_device: bool) -> Vec<String> {
    let dir = runtime.libtorch_dir.as_deref().unwrap_or("(not found)");
    let mut problems = Vec::new();
    if runtime.libtorch_dir.is_none() {
        problems.push("libtorch_cpu.so is not among this process's libraries".to_owned());
    }
    if runtime.cuda_built && !runtime.cuda_loaded {
        problems.push(format!(
            "libtorch in {dir} has CUDA but rlvr-worker did not load libtorch_cuda.so: rebuild \
             rlvr-worker (its build links libtorch.so so that CUDA is loaded)"
        ));
    }
    if !runtime.cuda_built && nvidia_device {
        problems.push(format!(
            "this host has an NVIDIA device but libtorch in {dir} is built without CUDA: install a \
             CUDA build of torch 2.11.0 and point LD_LIBRARY_PATH at its torch/lib"
        ));
    }
    // Without an NVIDIA device, CUDA's absence is this host's nature, not a problem.
    if nvidia_device && runtime.cuda_loaded && !runtime.cuda_available {
        problems.push(why_no_cuda(runtime));
    }
    problems
}

/// Why CUDA cannot run, for a runtime where it cannot.
fn why_no_cuda(runtime: &TorchRuntime) -> String {
    if !runtime.cuda_built {
        "libtorch is built without CUDA".to_owned()
    } else if !runtime.cuda_loaded {
        "libtorch_cuda.so is not loaded".to_owned()
    } else if runtime.cuda_driver.is_none() {
        "CUDA is loaded but no NVIDIA driver answers (libcuda.so.1 missing, or no GPU)".to_owned()
    } else {
        "CUDA is loaded and the driver answers, but no device is visible (CUDA_VISIBLE_DEVICES, \
         device permissions)"
            .to_owned()
    }
}

/// Refuses a CUDA device this process cannot use, saying why: never a silent CPU run.
pub fn check_device(device: Device, runtime: &TorchRuntime) -> Result<(), WorkerError> {
    let Device::Cuda(index) = device else { return Ok(()) };
    if runtime.cuda_available && (index as i64) < runtime.cuda_devices {
        return Ok(());
    }
    let why = if runtime.cuda_available {
        format!("CUDA sees {} device(s)", runtime.cuda_devices)
    } else if runtime.problems.is_empty() {
        why_no_cuda(runtime)
    } else {
        runtime.problems.join("; ")
    };
    Err(WorkerError::Device(format!("cuda:{index} was asked for but cannot be used: {why}")))
}

/// The platform a run on `device` trains with, for `job.json`.
pub fn platform(device: Device, runtime: &TorchRuntime) -> RunPlatform {
    let cuda = device.is_cuda();
    RunPlatform {
        device: match device {
            Device::Cuda(index) => device_name(index).unwrap_or_else(|| format!("cuda:{index}")),
            _ => "cpu".to_owned(),
        },
        libtorch: runtime.libtorch_version.clone(),
        cuda_runtime: runtime.cuda_runtime.clone().filter(|_| cuda),
        cuda_driver: runtime.cuda_driver.clone().filter(|_| cuda),
        cublas: runtime.cublas.clone().filter(|_| cuda),
        cudnn: runtime.cudnn.clone().filter(|_| cuda),
    }
}

/// One call into torch-sys' C API, `None` when libtorch raised (its error text is dropped: the
/// caller's report says what is missing).
fn torch_call(call: impl FnOnce() -> i64) -> Option<i64> {
    let value = call();
    // SAFETY: the error slot is thread-local in torch-sys; a non-null pointer is a malloc'd
    // string this call owns and frees.
    let error = unsafe { torch_sys::get_and_reset_last_err() };
    if error.is_null() {
        return Some(value);
    }
    // SAFETY: as above.
    unsafe { libc::free(error.cast()) };
    None
}

/// How float32 linear layers run on the CPU.
fn cpu_matmul() -> String {
    match rlvr_model::onednn::status() {
        Ok(()) => "onednn".to_owned(),
        Err(reason) => format!("blas ({reason})"),
    }
}

/// The files mapped into this process that look like shared libraries.
fn loaded_libraries() -> Vec<PathBuf> {
    let Ok(maps) = std::fs::read_to_string("/proc/self/maps") else { return Vec::new() };
    let mut paths: Vec<PathBuf> = maps
        .lines()
        .filter_map(|line| line.split_whitespace().nth(5))
        .filter(|path| path.starts_with('/') && path.contains(".so"))
        .map(PathBuf::from)
        .collect();
    paths.dedup();
    paths
}

fn file_name_starts(path: &Path, prefix: &str) -> bool {
    path.file_name().and_then(|name| name.to_str()).is_some_and(|name| name.starts_with(prefix))
}

/// libtorch's version from its installation: a Python package's `torch/version.py`
/// (`__version__ = '2.11.0+cu130'`), or a libtorch archive's `build-version`.
fn libtorch_version(lib_dir: &Path) -> Option<String> {
    let root = lib_dir.parent()?;
    if let Ok(text) = std::fs::read_to_string(root.join("version.py")) {
        let line = text.lines().find(|line| line.starts_with("__version__"))?;
        return Some(line.split_once('=')?.1.trim().trim_matches(['\'', '"']).to_owned());
    }
    let text = std::fs::read_to_string(root.join("build-version")).ok()?;
    Some(text.trim().to_owned()).filter(|version| !version.is_empty())
}

/// `13000` with `major_unit` 1000 and `minor_unit` 10 → `13.0` (CUDA's encoding).
fn dotted_version(code: i64, major_unit: i64, minor_unit: i64) -> String {
    format!("{}.{}", code / major_unit, (code % major_unit) / minor_unit)
}

/// `91900` with units 10000 and 100 → `9.19.0` (cuDNN 9's, NCCL's and cuBLAS's encoding).
fn dotted_triple(code: i64, major_unit: i64, minor_unit: i64) -> String {
    format!("{}.{}.{}", code / major_unit, (code % major_unit) / minor_unit, code % minor_unit)
}

/// A C function of a library already loaded into the process's global scope.
fn global_symbol(name: &CStr) -> Option<*mut c_void> {
    // SAFETY: dlsym with RTLD_DEFAULT only looks a name up; it loads nothing.
    let symbol = unsafe { libc::dlsym(libc::RTLD_DEFAULT, name.as_ptr()) };
    (!symbol.is_null()).then_some(symbol)
}

/// Asks an `int f(int *)` entry point (CUDA's and NCCL's version calls) for its number; `None`
/// when it is not loaded, fails, or answers 0.
fn int_out_call(name: &CStr) -> Option<i64> {
    let symbol = global_symbol(name)?;
    // SAFETY: the named functions (cudaDriverGetVersion, ncclGetVersion) have exactly this
    // signature in their C headers and write one int.
    let function: extern "C" fn(*mut c_int) -> c_int = unsafe { std::mem::transmute(symbol) };
    let mut value: c_int = 0;
    (function(&mut value) == 0 && value > 0).then_some(i64::from(value))
}

/// The newest CUDA version the driver supports, asked of the CUDA runtime libtorch loaded.
fn driver_version() -> Option<String> {
    int_out_call(c"cudaDriverGetVersion").map(|code| dotted_version(code, 1000, 10))
}

fn nccl_version() -> Option<String> {
    int_out_call(c"ncclGetVersion").map(|code| dotted_triple(code, 10_000, 100))
}

fn cublas_version() -> Option<String> {
    let symbol = global_symbol(c"cublasLtGetVersion")?;
    // SAFETY: `size_t cublasLtGetVersion(void)` in cublasLt.h.
    let function: extern "C" fn() -> usize = unsafe { std::mem::transmute(symbol) };
    Some(dotted_triple(function() as i64, 10_000, 100))
}

/// The GPU's name, from the driver's `cuDeviceGetName` (tch binds no device properties, and
/// `cudaGetDeviceProperties` would need its struct's layout). The CUDA runtime opens libcuda
/// privately, so it is looked up in that library, never loaded here.
fn device_name(index: usize) -> Option<String> {
    // SAFETY: RTLD_NOLOAD only returns a handle to a library already loaded; dlsym looks a name
    // up in it. The handle's reference is released right after.
    let symbol = unsafe {
        let handle = libc::dlopen(c"libcuda.so.1".as_ptr(), libc::RTLD_LAZY | libc::RTLD_NOLOAD);
        if handle.is_null() {
            return None;
        }
        let symbol = libc::dlsym(handle, c"cuDeviceGetName".as_ptr());
        libc::dlclose(handle);
        symbol
    };
    if symbol.is_null() {
        return None;
    }
    // SAFETY: `CUresult cuDeviceGetName(char *name, int len, CUdevice dev)` in cuda.h; a CUdevice
    // is the ordinal once the runtime has initialised the driver, which is_available() did.
    let function: extern "C" fn(*mut libc::c_char, c_int, c_int) -> c_int =
        unsafe { std::mem::transmute(symbol) };
    let mut buffer = [0 as libc::c_char; 256];
    if function(buffer.as_mut_ptr(), buffer.len() as c_int, index as c_int) != 0 {
        return None;
    }
    // SAFETY: the driver writes a NUL-terminated string within the buffer.
    let name = unsafe { CStr::from_ptr(buffer.as_ptr()) };
    Some(name.to_string_lossy().into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_decode_as_their_libraries_encode_them() {
        for (code, major, minor, want) in [(13000, 1000, 10, "13.0"), (12080, 1000, 10, "12.8")] {
            assert_eq!(dotted_version(code, major, minor), want);
        }
        for (code, want) in [(91900, "9.19.0"), (22707, "2.27.7"), (130100, "13.1.0")] {
            assert_eq!(dotted_triple(code, 10_000, 100), want);
        }
    }

    fn runtime(cuda_built: bool, cuda_loaded: bool, driver: bool, devices: i64) -> TorchRuntime {
        TorchRuntime {
            libtorch_version: Some("2.11.0+cu130".into()),
            libtorch_dir: Some("/opt/torch/lib".into()),
            cuda_built,
            cuda_loaded,
            cuda_runtime: cuda_loaded.then(|| "13.0".into()),
            cuda_driver: driver.then(|| "13.0".into()),
            cuda_available: devices > 0,
            cuda_devices: devices,
            cudnn: None,
            nccl: None,
            cublas: None,
            cpu_matmul: "onednn".into(),
            cpu_threads: 2,
            problems: Vec::new(),
        }
    }

    /// Each way CUDA can be missing is a problem that says which, and a CUDA device is refused
    /// with it; a working CUDA and the CPU have none.
    #[test]
    fn each_missing_part_of_cuda_is_named_and_refuses_a_cuda_device() {
        // (runtime, an NVIDIA device node on the host, a problem reported, the refusal's words)
        let cases: [(TorchRuntime, bool, bool, &str); 7] = [
            (runtime(true, true, true, 1), true, false, ""),
            (runtime(true, false, false, 0), true, true, "did not load libtorch_cuda.so"),
            (runtime(false, false, false, 0), true, true, "built without CUDA"),
            (runtime(false, false, false, 0), false, false, "built without CUDA"),
            (runtime(true, true, false, 0), true, true, "no NVIDIA driver answers"),
            (runtime(true, true, false, 0), false, false, "no NVIDIA driver answers"),
            (runtime(true, true, true, 0), true, true, "no device is visible"),
        ];
        for (mut runtime, nvidia_device, reported, want) in cases {
            runtime.problems = problems(&runtime, nvidia_device);
            let refusal = check_device(Device::Cuda(0), &runtime);
            if want.is_empty() {
                assert!(refusal.is_ok());
            } else {
                let message = refusal.expect_err(want).to_string();
                assert!(message.contains("cuda:0 was asked for") && message.contains(want), "{message}");
            }
            assert_eq!(!runtime.problems.is_empty(), reported, "{want}: {:?}", runtime.problems);
            if reported {
                assert!(runtime.problems.iter().any(|p| p.contains(want)), "{want}: {:?}", runtime.problems);
            }
            assert!(check_device(Device::Cpu, &runtime).is_ok());
        }
        let one = runtime(true, true, true, 1);
        assert!(check_device(Device::Cuda(1), &one).unwrap_err().to_string().contains("CUDA sees 1 device"));
    }

    /// In this test binary: libtorch is found with its version, and CUDA is loaded exactly when
    /// its libtorch has it (the test binaries are linked like rlvr-worker).
    #[test]
    fn this_process_reports_its_libtorch() {
        let runtime = report();
        assert!(runtime.libtorch_dir.is_some(), "{runtime:?}");
        assert!(runtime.libtorch_version.as_deref().is_some_and(|v| v.starts_with("2.11.0")), "{runtime:?}");
        assert_eq!(runtime.cuda_loaded, runtime.cuda_built, "{runtime:?}");
    }
}
