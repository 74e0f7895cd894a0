//! `rlvrd doctor`, and the same facts at `rlvrd serve`'s start: the devices this daemon would
//! schedule over, and what its worker's libtorch can do with them (asked of `rlvr-worker doctor`
//! in a child process, with the environment jobs get, since the daemon never links libtorch).
//!
//! A daemon whose devices are GPUs while its worker cannot use CUDA would run every job on a
//! device the worker refuses: [`Doctor::gpu_problem`] says so, and `serve` refuses to start on it.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use rlvr_protocol::runtime::TorchRuntime;
use serde::Serialize;

use crate::sched::inventory::{DeviceKind, Inventory};

/// How long `rlvr-worker doctor` may take: loading libtorch and initialising CUDA.
const WORKER_DOCTOR_TIMEOUT: Duration = Duration::from_secs(120);

/// What `rlvrd doctor` found.
#[derive(Debug, Clone, Serialize)]
pub struct Doctor {
    /// The worker executable asked.
    pub worker: PathBuf,
    /// Its answer, or why there is none (`torch_error`).
    pub torch: Option<TorchRuntime>,
    pub torch_error: Option<String>,
    /// The devices, as `rlvrd serve` would schedule over them.
    pub devices: Vec<DoctorDevice>,
    /// How the inventory was found.
    pub device_notes: Vec<String>,
}

/// One device of the inventory, for people and for `--json`.
#[derive(Debug, Clone, Serialize)]
pub struct DoctorDevice {
    /// `cuda:0`, `cpu:0`.
    pub id: String,
    pub name: String,
    pub memory_gb: f64,
    pub gpu: bool,
    /// A GPU's or MIG instance's UUID (what a worker's `CUDA_VISIBLE_DEVICES` names).
    pub uuid: Option<String>,
    /// For people: UUID, model, memory, compute mode and MIG state.
    pub summary: String,
}

impl Doctor {
    /// Asks `worker` and takes `inventory` as found.
    pub fn examine(worker: &Path, inventory: &Inventory) -> Doctor {
        let (torch, torch_error) = match ask_worker(worker, inventory) {
            Ok(torch) => (Some(torch), None),
            Err(error) => (None, Some(error)),
        };
        Doctor {
            worker: worker.to_owned(),
            torch,
            torch_error,
            devices: inventory
                .devices
                .iter()
                .map(|device| DoctorDevice {
                    id: device.kind.to_string(),
                    name: device.name.clone(),
                    memory_gb: device.memory_gb,
                    gpu: matches!(device.kind, DeviceKind::Cuda { .. }),
                    uuid: device.gpu.as_ref().map(|gpu| gpu.uuid.clone()),
                    summary: device.to_string(),
                })
                .collect(),
            device_notes: inventory.notes.clone(),
        }
    }

    /// Why jobs could not run on this daemon's GPUs, when they could not.
    pub fn gpu_problem(&self) -> Option<String> {
        if !self.devices.iter().any(|device| device.gpu) {
            return None;
        }
        match (&self.torch, &self.torch_error) {
            (Some(torch), _) if torch.cuda_available => None,
            (Some(torch), _) => Some(format!(
                "the devices are GPUs but {} cannot use CUDA: {}",
                self.worker.display(),
                if torch.problems.is_empty() {
                    "CUDA is not available".to_owned()
                } else {
                    torch.problems.join("; ")
                }
            )),
            (None, error) => Some(format!(
                "the devices are GPUs but {}",
                error.as_deref().unwrap_or("the worker was not asked")
            )),
        }
    }

    /// The report for people.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let none = |value: &Option<String>| value.clone().unwrap_or_else(|| "none".to_owned());
        let _ = writeln!(out, "worker     {}", self.worker.display());
        match (&self.torch, &self.torch_error) {
            (Some(torch), _) => {
                let _ = writeln!(
                    out,
                    "libtorch   {} ({})",
                    torch.libtorch_version.as_deref().unwrap_or("version unknown"),
                    torch.libtorch_dir.as_deref().unwrap_or("directory unknown")
                );
                let built = if torch.cuda_built { "built with CUDA" } else { "built without CUDA" };
                let loaded = if torch.cuda_loaded { "loaded" } else { "not loaded" };
                let available = if torch.cuda_available {
                    format!("available, {} device(s)", torch.cuda_devices)
                } else {
                    "not available".to_owned()
                };
                let _ = writeln!(out, "CUDA       {built}, {loaded}, {available}");
                let _ = writeln!(
                    out,
                    "           runtime {}, driver supports {}, cuDNN {}, NCCL {}, cuBLAS {}",
                    none(&torch.cuda_runtime),
                    none(&torch.cuda_driver),
                    none(&torch.cudnn),
                    none(&torch.nccl),
                    none(&torch.cublas)
                );
                let _ =
                    writeln!(out, "CPU        matmul {}, {} thread(s)", torch.cpu_matmul, torch.cpu_threads);
                for problem in &torch.problems {
                    let _ = writeln!(out, "problem    {problem}");
                }
            }
            (None, error) => {
                let _ = writeln!(out, "libtorch   unknown: {}", error.as_deref().unwrap_or("not asked"));
            }
        }
        let _ = writeln!(out, "devices");
        for device in &self.devices {
            let _ = writeln!(out, "  {}", device.summary);
        }
        for note in &self.device_notes {
            let _ = writeln!(out, "  note: {note}");
        }
        if let Some(problem) = self.gpu_problem() {
            let _ = writeln!(out, "problem    {problem}");
        }
        out
    }
}

/// `rlvr-worker doctor`'s answer, asked as a job on every device of `inventory` would be (a job
/// taking the whole devices: no allocator cap).
fn ask_worker(worker: &Path, inventory: &Inventory) -> Result<TorchRuntime, String> {
    let mut command = Command::new(worker);
    command.arg("doctor");
    command.env_clear().envs(crate::jobs::supervise::worker_environment(
        std::env::vars_os(),
        &inventory.devices,
        0.0,
    ));
    let output = rlvr_plugin_host::child::run(command, WORKER_DOCTOR_TIMEOUT)
        .map_err(|error| format!("{} doctor: {error}", worker.display()))?;
    output
        .last_line()
        .ok_or_else(|| format!("{} doctor gave no report: {}", worker.display(), output.describe()))
}
