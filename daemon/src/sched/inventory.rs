//! The devices this daemon schedules over (design.md §7), found once at start from `[devices]`,
//! NVML, or the machine's memory.
//!
//! The first rule that applies decides:
//! 1. `[[devices.gpus]]` lists GPUs: exactly those, with the memory the config gives them. NVML,
//!    when it answers, only names them.
//! 2. `devices.cpu_slots` is set: that many CPU slots.
//! 3. NVML reports at least one GPU it can read: those.
//! 4. Otherwise one CPU slot, with a note saying why.
//!
//! A CPU slot's memory is `devices.cpu_slot_memory_gb`, else the machine's memory (`MemTotal` of
//! /proc/meminfo, or 16 GB when that cannot be read) divided among the slots.
//!
//! Memory is in GB of 2^30 bytes here, as in the policy and in a job's `[resources]`.
//!
//! Finding the inventory never fails: NVML is loaded at run time (libnvidia-ml.so.1), so the daemon
//! builds and runs where there is no driver, and any NVML error is a note and a fallback. A GPU's
//! index is NVML's, which is the CUDA index only under `CUDA_DEVICE_ORDER=PCI_BUS_ID` and without
//! `CUDA_VISIBLE_DEVICES`: workers must be started that way.

use std::fmt;

use nvml_wrapper::Nvml;

use crate::config::DevicesConfig;
use crate::sched::policy::Device;

/// Bytes in one GB, the memory unit of the inventory.
const BYTES_PER_GB: f64 = (1u64 << 30) as f64;
/// The machine's memory when /proc/meminfo cannot be read.
const FALLBACK_MACHINE_MEMORY_GB: f64 = 16.0;
const MEMINFO: &str = "/proc/meminfo";

/// What a device is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DeviceKind {
    /// A GPU, by its NVML index.
    Cuda { index: u32 },
    /// A share of the CPU and memory, numbered from 0.
    Cpu { slot: u32 },
}

/// The short name: `cuda:0`, `cpu:0`.
impl fmt::Display for DeviceKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DeviceKind::Cuda { index } => write!(f, "cuda:{index}"),
            DeviceKind::Cpu { slot } => write!(f, "cpu:{slot}"),
        }
    }
}

/// One device of the inventory.
#[derive(Debug, Clone, PartialEq)]
pub struct InventoryDevice {
    pub kind: DeviceKind,
    /// For people: `cuda:0 (NVIDIA H100 80GB HBM3)`, `cuda:0` when NVML does not name it, `cpu:0`.
    pub name: String,
    /// Memory jobs may use on it, in GB (2^30 bytes).
    pub memory_gb: f64,
}

/// Which rule the inventory came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InventorySource {
    /// `[[devices.gpus]]`.
    Config,
    /// The GPUs NVML reported.
    Nvml,
    /// CPU slots: `devices.cpu_slots`, or one slot because no GPU was found.
    CpuSlots,
}

/// The devices this daemon schedules over. Never empty.
#[derive(Debug, Clone, PartialEq)]
pub struct Inventory {
    pub devices: Vec<InventoryDevice>,
    pub source: InventorySource,
    /// What an operator should know about how it was found, e.g. `NVML not available: <error>;
    /// using 1 CPU slot`. Meant to be logged at start.
    pub notes: Vec<String>,
}

impl Inventory {
    /// The devices as the policy sees them, named by their short names (`cuda:0`, `cpu:0`).
    pub fn policy_devices(&self) -> Vec<Device> {
        self.devices
            .iter()
            .map(|device| Device {
                name: device.kind.to_string(),
                memory_gb: device.memory_gb,
                exclusive: false,
            })
            .collect()
    }
}

/// One GPU as NVML reports it.
#[derive(Debug, Clone, PartialEq)]
pub struct NvmlGpu {
    pub index: u32,
    /// NVML's name, e.g. `NVIDIA H100 80GB HBM3`.
    pub name: String,
    /// Total memory, in GB (2^30 bytes).
    pub memory_gb: f64,
}

/// A GPU NVML counted but could not read.
#[derive(Debug, Clone, PartialEq)]
pub struct NvmlDeviceError {
    pub index: u32,
    pub error: String,
}

/// What NVML answered: `Err` when it could not start or count its GPUs, else one entry per GPU it
/// counted.
pub type NvmlAnswer = Result<Vec<Result<NvmlGpu, NvmlDeviceError>>, String>;

/// Finds the inventory of this machine: [`discover_with`] on NVML and /proc/meminfo.
///
/// Blocks on NVML (loading the library, asking the driver): call it at start, before the runtime
/// or from `spawn_blocking`.
pub fn discover(config: &DevicesConfig) -> Inventory {
    discover_with(config, nvml_probe, meminfo_total_gb)
}

/// The rules of the module docs. `nvml` is asked at most once and only when a rule needs it (not
/// when `devices.cpu_slots` decides); `machine_memory_gb` only when a CPU slot's memory is not
/// configured.
pub fn discover_with(
    config: &DevicesConfig,
    nvml: impl FnOnce() -> NvmlAnswer,
    machine_memory_gb: impl FnOnce() -> Result<f64, String>,
) -> Inventory {
    let mut notes = Vec::new();
    if !config.gpus.is_empty() {
        let devices = configured_gpus(config, nvml(), &mut notes);
        return Inventory { devices, source: InventorySource::Config, notes };
    }
    if let Some(slots) = config.cpu_slots {
        let devices = cpu_slots(config, slots, machine_memory_gb, &mut notes);
        return Inventory { devices, source: InventorySource::CpuSlots, notes };
    }
    let why_none = match nvml() {
        Err(error) => format!("NVML not available: {error}"),
        Ok(answers) => {
            let counted = answers.len();
            let mut devices = Vec::new();
            for answer in answers {
                match answer {
                    Ok(gpu) => devices.push(InventoryDevice {
                        kind: DeviceKind::Cuda { index: gpu.index },
                        name: format!("cuda:{} ({})", gpu.index, gpu.name),
                        memory_gb: gpu.memory_gb,
                    }),
                    Err(e) => notes.push(format!("NVML cannot read cuda:{}: {}; skipped", e.index, e.error)),
                }
            }
            if !devices.is_empty() {
                return Inventory { devices, source: InventorySource::Nvml, notes };
            }
            if counted == 0 {
                "NVML found no GPU".to_owned()
            } else {
                format!("NVML could read none of its {counted} GPU(s)")
            }
        }
    };
    notes.push(format!("{why_none}; using 1 CPU slot"));
    let devices = cpu_slots(config, 1, machine_memory_gb, &mut notes);
    Inventory { devices, source: InventorySource::CpuSlots, notes }
}

/// Rule 1: the configured GPUs, named by NVML where it can.
fn configured_gpus(
    config: &DevicesConfig,
    nvml: NvmlAnswer,
    notes: &mut Vec<String>,
) -> Vec<InventoryDevice> {
    if config.cpu_slots.is_some() {
        notes.push("devices.cpu_slots is ignored: devices.gpus is set".to_owned());
    }
    let answers = match nvml {
        Ok(answers) => Some(answers),
        Err(error) => {
            notes.push(format!("NVML not available: {error}; using devices.gpus as configured, unnamed"));
            None
        }
    };
    let mut devices = Vec::new();
    for gpu in &config.gpus {
        let index = gpu.index;
        let mut name = format!("cuda:{index}");
        if let Some(answers) = &answers {
            let answer = answers.iter().find(|a| match a {
                Ok(found) => found.index == index,
                Err(e) => e.index == index,
            });
            match answer {
                Some(Ok(found)) => name = format!("cuda:{index} ({})", found.name),
                Some(Err(e)) => notes.push(format!("NVML cannot read cuda:{index}: {}", e.error)),
                None => notes.push(format!(
                    "devices.gpus lists cuda:{index}, but NVML reports {} GPU(s)",
                    answers.len()
                )),
            }
        }
        devices.push(InventoryDevice { kind: DeviceKind::Cuda { index }, name, memory_gb: gpu.memory_gb });
    }
    devices
}

/// `slots` CPU slots (at least 1), each with the configured memory or its part of the machine's.
fn cpu_slots(
    config: &DevicesConfig,
    slots: u32,
    machine_memory_gb: impl FnOnce() -> Result<f64, String>,
    notes: &mut Vec<String>,
) -> Vec<InventoryDevice> {
    // The config validator refuses 0; the type does not.
    let slots = slots.max(1);
    let memory_gb = match config.cpu_slot_memory_gb {
        Some(memory_gb) => memory_gb,
        None => {
            let machine = machine_memory_gb().unwrap_or_else(|error| {
                notes.push(format!(
                    "cannot read the machine's memory: {error}; assuming {FALLBACK_MACHINE_MEMORY_GB} GB"
                ));
                FALLBACK_MACHINE_MEMORY_GB
            });
            machine / f64::from(slots)
        }
    };
    (0..slots)
        .map(|slot| InventoryDevice {
            kind: DeviceKind::Cpu { slot },
            name: format!("cpu:{slot}"),
            memory_gb,
        })
        .collect()
}

/// Asks NVML for every GPU's name and total memory. Blocks; never panics on a machine without the
/// library or the driver (that is an `Err`).
pub fn nvml_probe() -> NvmlAnswer {
    let nvml = Nvml::init().map_err(|e| e.to_string())?;
    let count = nvml.device_count().map_err(|e| e.to_string())?;
    let gpu = |index: u32| -> Result<NvmlGpu, nvml_wrapper::error::NvmlError> {
        let device = nvml.device_by_index(index)?;
        let name = device.name()?;
        let total = device.memory_info()?.total;
        Ok(NvmlGpu { index, name, memory_gb: total as f64 / BYTES_PER_GB })
    };
    Ok((0..count)
        .map(|index| gpu(index).map_err(|e| NvmlDeviceError { index, error: e.to_string() }))
        .collect())
}

/// The machine's memory, `MemTotal` of /proc/meminfo, in GB (2^30 bytes).
pub fn meminfo_total_gb() -> Result<f64, String> {
    let text = std::fs::read_to_string(MEMINFO).map_err(|e| format!("{MEMINFO}: {e}"))?;
    mem_total_gb(&text).ok_or_else(|| format!("{MEMINFO}: no MemTotal line in kB"))
}

/// `MemTotal:  131891372 kB` (kB there are KiB) in GB.
fn mem_total_gb(meminfo: &str) -> Option<f64> {
    let line = meminfo.lines().find_map(|line| line.strip_prefix("MemTotal:"))?;
    let kib: u64 = line.trim().strip_suffix("kB")?.trim().parse().ok()?;
    Some(kib as f64 / (1u64 << 20) as f64)
}

#[cfg(test)]
mod tests {
    use std::cell::RefCell;
    use std::fmt::Write as _;
    use std::path::Path;

    use expect_test::{Expect, expect};

    use super::*;
    use crate::config::GpuConfig;

    const H100: &str = "NVIDIA H100 80GB HBM3";

    fn gpu(index: u32, name: &str, memory_gb: f64) -> Result<NvmlGpu, NvmlDeviceError> {
        Ok(NvmlGpu { index, name: name.to_owned(), memory_gb })
    }

    fn broken(index: u32, error: &str) -> Result<NvmlGpu, NvmlDeviceError> {
        Err(NvmlDeviceError { index, error: error.to_owned() })
    }

    fn devices(
        cpu_slots: Option<u32>,
        cpu_slot_memory_gb: Option<f64>,
        gpus: &[(u32, f64)],
    ) -> DevicesConfig {
        let gpus = gpus.iter().map(|&(index, memory_gb)| GpuConfig { index, memory_gb }).collect();
        DevicesConfig { cpu_slots, cpu_slot_memory_gb, gpus }
    }

    /// Runs the rules on `config` with NVML answering `nvml` and the machine having
    /// `machine_memory_gb`, and shows what was asked, the source, each device (policy name,
    /// memory, kind, full name) and the notes.
    fn check(
        config: DevicesConfig,
        nvml: NvmlAnswer,
        machine_memory_gb: Result<f64, String>,
        expected: Expect,
    ) {
        let asked = RefCell::new(Vec::new());
        let inventory = discover_with(
            &config,
            || {
                asked.borrow_mut().push("nvml");
                nvml
            },
            || {
                asked.borrow_mut().push("meminfo");
                machine_memory_gb
            },
        );
        let mut shown = format!("{:?}, asked [{}]\n", inventory.source, asked.borrow().join(", "));
        for (device, policy) in inventory.devices.iter().zip(inventory.policy_devices()) {
            assert_eq!(policy.memory_gb, device.memory_gb);
            writeln!(shown, "{} {} GB {:?} {:?}", policy.name, policy.memory_gb, device.kind, device.name)
                .unwrap();
        }
        for note in &inventory.notes {
            writeln!(shown, "note: {note}").unwrap();
        }
        assert!(!inventory.devices.is_empty(), "an inventory is never empty:\n{shown}");
        expected.assert_eq(&shown);
    }

    #[test]
    fn configured_gpus_win_and_nvml_names_them() {
        check(
            devices(None, None, &[(1, 40.0), (0, 80.0)]),
            Ok(vec![gpu(0, H100, 79.6), gpu(1, H100, 79.6)]),
            Ok(64.0),
            expect![[r#"
                Config, asked [nvml]
                cuda:1 40 GB Cuda { index: 1 } "cuda:1 (NVIDIA H100 80GB HBM3)"
                cuda:0 80 GB Cuda { index: 0 } "cuda:0 (NVIDIA H100 80GB HBM3)"
            "#]],
        );
    }

    #[test]
    fn configured_gpus_without_nvml_are_unnamed() {
        check(
            devices(Some(4), Some(8.0), &[(0, 80.0)]),
            Err("a libloading error occurred: libnvidia-ml.so.1: cannot open shared object file".to_owned()),
            Ok(64.0),
            expect![[r#"
                Config, asked [nvml]
                cuda:0 80 GB Cuda { index: 0 } "cuda:0"
                note: devices.cpu_slots is ignored: devices.gpus is set
                note: NVML not available: a libloading error occurred: libnvidia-ml.so.1: cannot open shared object file; using devices.gpus as configured, unnamed
            "#]],
        );
    }

    #[test]
    fn configured_gpus_nvml_does_not_know_are_kept_with_a_note() {
        check(
            devices(None, None, &[(0, 80.0), (1, 80.0), (3, 80.0)]),
            Ok(vec![gpu(0, H100, 79.6), broken(1, "GPU is lost")]),
            Err("unused".to_owned()),
            expect![[r#"
                Config, asked [nvml]
                cuda:0 80 GB Cuda { index: 0 } "cuda:0 (NVIDIA H100 80GB HBM3)"
                cuda:1 80 GB Cuda { index: 1 } "cuda:1"
                cuda:3 80 GB Cuda { index: 3 } "cuda:3"
                note: NVML cannot read cuda:1: GPU is lost
                note: devices.gpus lists cuda:3, but NVML reports 2 GPU(s)
            "#]],
        );
    }

    #[test]
    fn cpu_slots_when_set_even_with_gpus_and_nvml_is_not_asked() {
        check(
            devices(Some(2), Some(8.0), &[]),
            Ok(vec![gpu(0, H100, 79.6)]),
            Ok(64.0),
            expect![[r#"
                CpuSlots, asked []
                cpu:0 8 GB Cpu { slot: 0 } "cpu:0"
                cpu:1 8 GB Cpu { slot: 1 } "cpu:1"
            "#]],
        );
        // Without their memory, the slots share the machine's.
        check(
            devices(Some(4), None, &[]),
            Ok(vec![]),
            Ok(62.5),
            expect![[r#"
                CpuSlots, asked [meminfo]
                cpu:0 15.625 GB Cpu { slot: 0 } "cpu:0"
                cpu:1 15.625 GB Cpu { slot: 1 } "cpu:1"
                cpu:2 15.625 GB Cpu { slot: 2 } "cpu:2"
                cpu:3 15.625 GB Cpu { slot: 3 } "cpu:3"
            "#]],
        );
        check(
            devices(Some(2), None, &[]),
            Ok(vec![]),
            Err("/proc/meminfo: permission denied".to_owned()),
            expect![[r#"
                CpuSlots, asked [meminfo]
                cpu:0 8 GB Cpu { slot: 0 } "cpu:0"
                cpu:1 8 GB Cpu { slot: 1 } "cpu:1"
                note: cannot read the machine's memory: /proc/meminfo: permission denied; assuming 16 GB
            "#]],
        );
    }

    #[test]
    fn nvml_gpus_by_default_skipping_the_unreadable() {
        check(
            devices(None, None, &[]),
            Ok(vec![gpu(0, H100, 79.6), broken(1, "Unknown Error"), gpu(2, "NVIDIA A10", 22.5)]),
            Ok(64.0),
            expect![[r#"
                Nvml, asked [nvml]
                cuda:0 79.6 GB Cuda { index: 0 } "cuda:0 (NVIDIA H100 80GB HBM3)"
                cuda:2 22.5 GB Cuda { index: 2 } "cuda:2 (NVIDIA A10)"
                note: NVML cannot read cuda:1: Unknown Error; skipped
            "#]],
        );
        // cpu_slot_memory_gb alone does not stop NVML's GPUs.
        check(
            devices(None, Some(8.0), &[]),
            Ok(vec![gpu(0, H100, 79.6)]),
            Ok(64.0),
            expect![[r#"
                Nvml, asked [nvml]
                cuda:0 79.6 GB Cuda { index: 0 } "cuda:0 (NVIDIA H100 80GB HBM3)"
            "#]],
        );
    }

    #[test]
    fn one_cpu_slot_when_no_gpu_is_found_saying_why() {
        check(
            devices(None, None, &[]),
            Err("NVIDIA driver is not loaded".to_owned()),
            Ok(125.8),
            expect![[r#"
                CpuSlots, asked [nvml, meminfo]
                cpu:0 125.8 GB Cpu { slot: 0 } "cpu:0"
                note: NVML not available: NVIDIA driver is not loaded; using 1 CPU slot
            "#]],
        );
        check(
            devices(None, Some(8.0), &[]),
            Ok(vec![]),
            Ok(125.8),
            expect![[r#"
                CpuSlots, asked [nvml]
                cpu:0 8 GB Cpu { slot: 0 } "cpu:0"
                note: NVML found no GPU; using 1 CPU slot
            "#]],
        );
        check(
            devices(None, None, &[]),
            Ok(vec![broken(0, "Unknown Error"), broken(1, "Unknown Error")]),
            Err("/proc/meminfo: no MemTotal line in kB".to_owned()),
            expect![[r#"
                CpuSlots, asked [nvml, meminfo]
                cpu:0 16 GB Cpu { slot: 0 } "cpu:0"
                note: NVML cannot read cuda:0: Unknown Error; skipped
                note: NVML cannot read cuda:1: Unknown Error; skipped
                note: NVML could read none of its 2 GPU(s); using 1 CPU slot
                note: cannot read the machine's memory: /proc/meminfo: no MemTotal line in kB; assuming 16 GB
            "#]],
        );
    }

    #[test]
    fn mem_total_is_read_in_kib() {
        let meminfo = "MemTotal:       131891372 kB\nMemFree:        1 kB\n";
        assert_eq!(mem_total_gb(meminfo), Some(131_891_372.0 / 1_048_576.0));
        assert_eq!(mem_total_gb("MemTotal: 16777216 kB"), Some(16.0));
        assert_eq!(mem_total_gb("MemFree: 1 kB\n"), None);
        assert_eq!(mem_total_gb("MemTotal: 12 MB\n"), None);
        assert_eq!(mem_total_gb("MemTotal: lots kB\n"), None);
    }

    /// On any machine, with or without a GPU or NVML, the real probe answers and the rules give
    /// an inventory.
    #[test]
    fn discover_runs_on_this_machine() {
        assert!(meminfo_total_gb().is_ok_and(|gb| gb > 0.0) || !Path::new(MEMINFO).exists());
        let inventory = discover(&DevicesConfig::default());
        assert!(!inventory.devices.is_empty());
        assert!(inventory.devices.iter().all(|d| d.memory_gb > 0.0), "{inventory:?}");
    }
}
