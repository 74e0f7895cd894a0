//! What the worker's libtorch can do on this host: `rlvr-worker doctor`'s one stdout line, read by
//! `rlvrd doctor` and logged by `rlvrd serve` at start, and the part of it a run records in
//! `job.json` so that a resume on other hardware or libraries is noticed.

use serde::{Deserialize, Serialize};

/// libtorch as loaded into `rlvr-worker`, and the CUDA it sees.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TorchRuntime {
    /// libtorch's version as its installation names it (`2.11.0+cu130`), when it does.
    pub libtorch_version: Option<String>,
    /// The directory `libtorch_cpu.so` was loaded from.
    pub libtorch_dir: Option<String>,
    /// Whether that directory has `libtorch_cuda.so`: a libtorch built with CUDA.
    pub cuda_built: bool,
    /// Whether `libtorch_cuda.so` is loaded into the process, so that libtorch has CUDA
    /// operators. A CUDA-built libtorch whose CUDA half is not loaded trains on the CPU only.
    pub cuda_loaded: bool,
    /// The CUDA runtime libtorch uses (`13.0`), when loaded.
    pub cuda_runtime: Option<String>,
    /// The newest CUDA version the installed driver supports (`13.0`), when there is a driver.
    pub cuda_driver: Option<String>,
    /// Whether CUDA can run here: loaded, a driver, and at least one visible device.
    pub cuda_available: bool,
    /// CUDA devices visible to the process (after `CUDA_VISIBLE_DEVICES`).
    pub cuda_devices: i64,
    /// cuDNN's version (`9.19.0`), when CUDA is loaded.
    pub cudnn: Option<String>,
    /// NCCL's version (`2.27.7`), when libtorch loaded it.
    pub nccl: Option<String>,
    /// cuBLASLt's version (`13.1.0`), when libtorch loaded it.
    pub cublas: Option<String>,
    /// How float32 linear layers run on the CPU: `onednn`, or `blas (reason)`.
    pub cpu_matmul: String,
    /// libtorch's CPU threads in this process.
    pub cpu_threads: i32,
    /// What is wrong, each a sentence an operator can act on (empty when nothing is).
    pub problems: Vec<String>,
}

/// The devices and libraries a run trained with, recorded in `job.json`: bit-exact resume holds
/// only on the same ones.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunPlatform {
    /// `cpu`, or the GPU's name (`NVIDIA H100 80GB HBM3`).
    pub device: String,
    pub libtorch: Option<String>,
    pub cuda_runtime: Option<String>,
    pub cuda_driver: Option<String>,
    pub cublas: Option<String>,
    pub cudnn: Option<String>,
}

impl RunPlatform {
    /// What differs from `earlier`, as `field: earlier → now` phrases (empty when nothing does).
    pub fn differences(&self, earlier: &RunPlatform) -> Vec<String> {
        let show = |value: &Option<String>| value.clone().unwrap_or_else(|| "none".to_owned());
        let mut differences = Vec::new();
        if self.device != earlier.device {
            differences.push(format!("device: {} → {}", earlier.device, self.device));
        }
        for (name, now, then) in [
            ("libtorch", &self.libtorch, &earlier.libtorch),
            ("CUDA runtime", &self.cuda_runtime, &earlier.cuda_runtime),
            ("CUDA driver", &self.cuda_driver, &earlier.cuda_driver),
            ("cuBLAS", &self.cublas, &earlier.cublas),
            ("cuDNN", &self.cudnn, &earlier.cudnn),
        ] {
            if now != then {
                differences.push(format!("{name}: {} → {}", show(then), show(now)));
            }
        }
        differences
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn platform(device: &str, cublas: Option<&str>) -> RunPlatform {
        RunPlatform {
            device: device.to_owned(),
            libtorch: Some("2.11.0+cu130".to_owned()),
            cuda_runtime: Some("13.0".to_owned()),
            cuda_driver: Some("13.0".to_owned()),
            cublas: cublas.map(str::to_owned),
            cudnn: Some("9.19.0".to_owned()),
        }
    }

    #[test]
    fn differences_name_each_changed_part_from_then_to_now() {
        let h100 = platform("NVIDIA H100 80GB HBM3", Some("13.1.0"));
        assert!(h100.differences(&h100).is_empty());
        let h200 = platform("NVIDIA H200", None);
        assert_eq!(
            h200.differences(&h100),
            ["device: NVIDIA H100 80GB HBM3 → NVIDIA H200", "cuBLAS: 13.1.0 → none"]
        );
    }
}
