//! The devices this daemon schedules over (design.md §7), found once at start from `[devices]`,
//! NVML, the daemon's `CUDA_VISIBLE_DEVICES`, or the machine's memory.
//!
//! The first rule that applies decides:
//! 1. `[[devices.gpus]]` lists GPUs: those of them that can be used (below), with the memory the
//!    config gives them. None can: `devices.cpu_slots` CPU slots, else one, with a note.
//! 2. `devices.cpu_slots` is set: that many CPU slots.
//! 3. NVML reports at least one GPU that can be used: those.
//! 4. Otherwise one CPU slot, with a note saying why.
//!
//! **Identity.** A worker is given its GPU by UUID (`CUDA_VISIBLE_DEVICES=GPU-…`, or `MIG-…` for
//! a MIG instance), never by an index, so no ordering variable changes which GPU it runs on. The
//! names the policy, the job events and the metrics use stay short: `cuda:N` is NVML's (and
//! nvidia-smi's) GPU N, `cuda:N/mig:M` MIG device M of it, `cpu:N` a CPU slot. Each
//! [`InventoryDevice`] holds its name and its UUID together: the one place they are mapped.
//!
//! **Which GPUs** (rules 1 and 3):
//! - The daemon's `CUDA_VISIBLE_DEVICES`, when set, bounds them, read as CUDA reads it: a
//!   comma-separated list of `GPU-…` UUIDs (in full, or a prefix only one GPU has), `MIG-…` UUIDs
//!   (as `nvidia-smi -L` prints them) or indexes. The list ends at its first entry that names no
//!   device: that entry and those after it are ignored, with a note, as CUDA ignores them; so an
//!   empty value, `-1` or `NoDevFiles` leaves no GPU. A note, not a refusal to start: nothing
//!   outside the list is ever used either way. Indexes are CUDA's: in PCI bus order under
//!   `CUDA_DEVICE_ORDER=PCI_BUS_ID`; otherwise CUDA puts the fastest GPU first and leaves the rest
//!   unspecified, so indexes are taken only when they name every GPU (the same set in any order),
//!   and else end the list with a note asking for UUIDs or `PCI_BUS_ID`. A device named twice is
//!   taken once. Not set: every GPU.
//! - A GPU in MIG mode is scheduled as its MIG instances, each with its own UUID and memory; one
//!   whose instances NVML cannot list is skipped, with a note. Naming the GPU names all its
//!   instances; naming an instance, only it.
//! - Compute mode `Prohibited`: skipped, with a note (no process may use it). `ExclusiveProcess`
//!   (and the retired `ExclusiveThread`): one process at a time may use it, so the policy puts one
//!   job at a time on it ([`Device::exclusive`]), with a note. Unreadable: taken as `Default`, with
//!   a note.
//! - A `[[devices.gpus]]` entry names one device by `index` (NVML's) or `uuid` (a GPU's or a MIG
//!   instance's, in full or a prefix only it has). An entry NVML does not know or cannot read,
//!   one naming a GPU in MIG mode (the note lists its instances' UUIDs to name instead), one
//!   outside `CUDA_VISIBLE_DEVICES`, and one naming a device an earlier entry named, are skipped
//!   with a note. Without NVML, an entry by `uuid` is used as written (when `CUDA_VISIBLE_DEVICES`
//!   is set, only if it lists the UUID as written), named `cuda:N` by its place in the list; an
//!   entry by `index` is skipped: no UUID can be found for it.
//!
//! A CPU slot's memory is `devices.cpu_slot_memory_gb`, else the machine's memory (`MemTotal` of
//! /proc/meminfo, or 16 GB when that cannot be read) divided among the slots.
//!
//! Memory is in GB of 2^30 bytes here, as in the policy and in a job's `[resources]`.
//!
//! Finding the inventory never fails: NVML is loaded at run time (libnvidia-ml.so.1), so the daemon
//! builds and runs where there is no driver, and any NVML error is a note and a fallback.
//! [`discover_with`] is pure: NVML's answer, the environment and the machine's memory are its
//! inputs; only [`discover`] reads them.

use std::collections::BTreeSet;
use std::fmt;

use nvml_wrapper::Nvml;
use nvml_wrapper::error::NvmlError;

use rlvr_protocol::memory::BYTES_PER_GB;

use crate::config::{DevicesConfig, GpuConfig};
use crate::sched::policy::Device;

/// The machine's memory when /proc/meminfo cannot be read.
const FALLBACK_MACHINE_MEMORY_GB: f64 = 16.0;
const MEMINFO: &str = "/proc/meminfo";
/// NVML's `NVML_DEVICE_MIG_ENABLE`: a GPU's current MIG mode when it is on.
const NVML_MIG_ENABLED: u32 = 1;
/// The `CUDA_DEVICE_ORDER` under which CUDA's indexes follow the PCI bus.
const PCI_BUS_ORDER: &str = "PCI_BUS_ID";
/// Where an operator finds the UUIDs, for notes.
const UUID_HINT: &str = "nvidia-smi -L prints them";

/// What a device is, and its short name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DeviceKind {
    /// A whole GPU, by NVML's index (nvidia-smi's).
    Cuda { index: u32 },
    /// MIG device `instance` of GPU `gpu` (NVML's indexes).
    Mig { gpu: u32, instance: u32 },
    /// A share of the CPU and memory, numbered from 0.
    Cpu { slot: u32 },
}

/// The short name: `cuda:0`, `cuda:1/mig:0`, `cpu:0`.
impl fmt::Display for DeviceKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DeviceKind::Cuda { index } => write!(f, "cuda:{index}"),
            DeviceKind::Mig { gpu, instance } => write!(f, "cuda:{gpu}/mig:{instance}"),
            DeviceKind::Cpu { slot } => write!(f, "cpu:{slot}"),
        }
    }
}

/// A GPU's compute mode (NVML's; the retired `ExclusiveThread` is read as `ExclusiveProcess`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ComputeMode {
    /// Any number of processes.
    Default,
    /// One process at a time.
    ExclusiveProcess,
    /// No process.
    Prohibited,
}

impl fmt::Display for ComputeMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

/// Where a scheduled GPU stands with MIG.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MigState {
    /// The GPU has no MIG mode.
    Unsupported,
    /// The GPU can run MIG, and does not.
    Disabled,
    /// NVML could not tell (noted); scheduled as a whole GPU.
    Unknown,
    /// A MIG instance of the GPU with this UUID.
    Instance { parent: String },
}

/// A GPU or MIG instance of the inventory: who CUDA knows it as, and what NVML says of it.
#[derive(Debug, Clone, PartialEq)]
pub struct GpuInfo {
    /// `GPU-…`, or a MIG instance's `MIG-…`: what the worker's `CUDA_VISIBLE_DEVICES` names. NVML's,
    /// or as `[[devices.gpus]]` writes it when NVML is not available.
    pub uuid: String,
    /// NVML's name (`NVIDIA H100 80GB HBM3`; a MIG instance's names its profile); `None` without
    /// NVML.
    pub model: Option<String>,
    /// Its memory as NVML reports it, in GB; `None` without NVML.
    pub total_memory_gb: Option<f64>,
    /// `None` when NVML could not tell (noted) or is not available.
    pub compute_mode: Option<ComputeMode>,
    /// `None` without NVML.
    pub mig: Option<MigState>,
}

impl GpuInfo {
    /// One process at a time may use it, so one job at a time.
    pub fn exclusive(&self) -> bool {
        self.compute_mode == Some(ComputeMode::ExclusiveProcess)
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
    /// A GPU's or MIG instance's identity; `None` for a CPU slot.
    pub gpu: Option<GpuInfo>,
}

/// One line for people, with the UUID, memory, compute mode and MIG state:
/// `cuda:0 GPU-8f3c…: NVIDIA H100 80GB HBM3, 79.6 GB, compute mode Default, MIG disabled`.
impl fmt::Display for InventoryDevice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let Some(gpu) = &self.gpu else {
            return write!(f, "{}: {} GB", self.kind, short_gb(self.memory_gb));
        };
        write!(f, "{} {}:", self.kind, gpu.uuid)?;
        if let Some(model) = &gpu.model {
            write!(f, " {model},")?;
        }
        write!(f, " {} GB", short_gb(self.memory_gb))?;
        match gpu.total_memory_gb {
            Some(total) if short_gb(total) != short_gb(self.memory_gb) => {
                write!(f, " (of {} GB)", short_gb(total))?
            }
            _ => {}
        }
        match gpu.compute_mode {
            Some(mode) => write!(f, ", compute mode {mode}")?,
            None => write!(f, ", compute mode unknown")?,
        }
        match &gpu.mig {
            Some(MigState::Unsupported) => write!(f, ", no MIG"),
            Some(MigState::Disabled) => write!(f, ", MIG disabled"),
            Some(MigState::Unknown) | None => write!(f, ", MIG unknown"),
            Some(MigState::Instance { parent }) => write!(f, ", MIG instance of {parent}"),
        }
    }
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
                exclusive: device.gpu.as_ref().is_some_and(GpuInfo::exclusive),
            })
            .collect()
    }
}

/// One GPU as NVML reports it.
#[derive(Debug, Clone, PartialEq)]
pub struct NvmlGpu {
    pub index: u32,
    /// `GPU-…`.
    pub uuid: String,
    /// NVML's name, e.g. `NVIDIA H100 80GB HBM3`.
    pub name: String,
    /// Total memory, in GB (2^30 bytes).
    pub memory_gb: f64,
    /// `00000000:3B:00.0`: sorted, CUDA's order under `CUDA_DEVICE_ORDER=PCI_BUS_ID`.
    pub pci_bus_id: String,
    /// `Err`: why NVML could not tell.
    pub compute_mode: Result<ComputeMode, String>,
    pub mig: NvmlMig,
}

/// A GPU's MIG mode as NVML reports it.
#[derive(Debug, Clone, PartialEq)]
pub enum NvmlMig {
    /// The GPU has no MIG mode (NVML: not supported).
    Unsupported,
    Disabled,
    /// MIG is on: its instances, or why NVML could not list them.
    Enabled(Result<Vec<NvmlMigDevice>, String>),
    /// NVML could not tell, and why.
    Unknown(String),
}

/// One MIG instance of a GPU, as NVML reports it.
#[derive(Debug, Clone, PartialEq)]
pub struct NvmlMigDevice {
    /// Its index on its GPU.
    pub index: u32,
    /// `MIG-…`.
    pub uuid: String,
    /// NVML's name, e.g. `NVIDIA A100-SXM4-80GB MIG 1g.10gb`.
    pub name: String,
    /// Its memory, in GB (2^30 bytes).
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

/// What the daemon's environment says about the GPUs CUDA may use; read by
/// [`CudaEnv::from_env`], a parameter everywhere else.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CudaEnv {
    /// `CUDA_VISIBLE_DEVICES`; `None` when not set.
    pub visible_devices: Option<String>,
    /// `CUDA_DEVICE_ORDER`; `None` when not set.
    pub device_order: Option<String>,
}

impl CudaEnv {
    /// The daemon's own `CUDA_VISIBLE_DEVICES` and `CUDA_DEVICE_ORDER` (a value that is not
    /// unicode is read lossily, and so names no device).
    pub fn from_env() -> Self {
        let var = |name: &str| std::env::var_os(name).map(|value| value.to_string_lossy().into_owned());
        CudaEnv { visible_devices: var("CUDA_VISIBLE_DEVICES"), device_order: var("CUDA_DEVICE_ORDER") }
    }
}

/// Finds the inventory of this machine: [`discover_with`] on the daemon's environment, NVML and
/// /proc/meminfo. Each device's `Display` is a line for people (UUID, memory, compute mode, MIG),
/// and the notes say what was skipped and why.
///
/// Blocks on NVML (loading the library, asking the driver): call it at start, before the runtime
/// or from `spawn_blocking`.
pub fn discover(config: &DevicesConfig) -> Inventory {
    discover_with(config, &CudaEnv::from_env(), nvml_probe, meminfo_total_gb)
}

/// The rules of the module docs. `nvml` is asked at most once and only when a rule needs it (not
/// when `devices.cpu_slots` decides); `machine_memory_gb` only when a CPU slot's memory is not
/// configured.
pub fn discover_with(
    config: &DevicesConfig,
    cuda: &CudaEnv,
    nvml: impl FnOnce() -> NvmlAnswer,
    machine_memory_gb: impl FnOnce() -> Result<f64, String>,
) -> Inventory {
    let mut notes = Vec::new();
    if !config.gpus.is_empty() {
        let devices = configured_gpus(config, cuda, nvml(), &mut notes);
        if !devices.is_empty() {
            if config.cpu_slots.is_some() {
                notes.push("devices.cpu_slots is ignored: devices.gpus is set".to_owned());
            }
            return Inventory { devices, source: InventorySource::Config, notes };
        }
        let slots = config.cpu_slots.unwrap_or(1);
        notes.push(format!("none of devices.gpus can be used; using {slots} CPU slot(s)"));
        let devices = cpu_slots(config, slots, machine_memory_gb, &mut notes);
        return Inventory { devices, source: InventorySource::CpuSlots, notes };
    }
    if let Some(slots) = config.cpu_slots {
        let devices = cpu_slots(config, slots, machine_memory_gb, &mut notes);
        return Inventory { devices, source: InventorySource::CpuSlots, notes };
    }
    let why_none = match nvml() {
        Err(error) => format!("NVML not available: {error}"),
        Ok(answers) => {
            let devices = nvml_gpus(&answers, cuda, &mut notes);
            if !devices.is_empty() {
                return Inventory { devices, source: InventorySource::Nvml, notes };
            }
            if answers.is_empty() {
                "NVML found no GPU".to_owned()
            } else {
                format!("none of the {} GPU(s) NVML reports can be used", answers.len())
            }
        }
    };
    notes.push(format!("{why_none}; using 1 CPU slot"));
    let devices = cpu_slots(config, 1, machine_memory_gb, &mut notes);
    Inventory { devices, source: InventorySource::CpuSlots, notes }
}

/// A device NVML knows: a whole GPU (`instance: None`) or one of its MIG instances, by NVML's
/// indexes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Unit {
    gpu: u32,
    instance: Option<u32>,
}

impl fmt::Display for Unit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.instance {
            None => DeviceKind::Cuda { index: self.gpu }.fmt(f),
            Some(instance) => DeviceKind::Mig { gpu: self.gpu, instance }.fmt(f),
        }
    }
}

/// What the daemon's `CUDA_VISIBLE_DEVICES` leaves visible: everything, or these devices (a GPU
/// named makes all its MIG instances visible).
#[derive(Debug, Clone, PartialEq)]
enum Visible {
    All,
    Only(BTreeSet<Unit>),
}

impl Visible {
    fn admits(&self, unit: Unit) -> bool {
        match self {
            Visible::All => true,
            Visible::Only(units) => {
                units.contains(&unit) || units.contains(&Unit { gpu: unit.gpu, instance: None })
            }
        }
    }
}

/// Rule 3: NVML's GPUs, within `CUDA_VISIBLE_DEVICES`, each as itself or its MIG instances.
fn nvml_gpus(
    answers: &[Result<NvmlGpu, NvmlDeviceError>],
    cuda: &CudaEnv,
    notes: &mut Vec<String>,
) -> Vec<InventoryDevice> {
    let mut gpus = Vec::new();
    for answer in answers {
        match answer {
            Ok(gpu) => gpus.push(gpu),
            Err(e) => notes.push(format!("NVML cannot read cuda:{}: {}; skipped", e.index, e.error)),
        }
    }
    let visible = visible(cuda, &gpus, answers.len(), notes);
    let mut devices = Vec::new();
    for gpu in gpus {
        let whole = Unit { gpu: gpu.index, instance: None };
        let named = |instance: &NvmlMigDevice| {
            visible.admits(Unit { gpu: gpu.index, instance: Some(instance.index) })
        };
        let any_named = visible.admits(whole)
            || matches!(&gpu.mig, NvmlMig::Enabled(Ok(instances)) if instances.iter().any(named));
        if !any_named {
            continue;
        }
        let Some(compute_mode) = usable_compute_mode(gpu, notes) else { continue };
        match &gpu.mig {
            NvmlMig::Enabled(Ok(instances)) => {
                if instances.is_empty() {
                    notes.push(format!("{whole} is in MIG mode without MIG instances; skipped"));
                }
                for instance in instances.iter().filter(|instance| named(instance)) {
                    devices.push(mig_device(gpu, instance, compute_mode, instance.memory_gb, notes));
                }
            }
            NvmlMig::Enabled(Err(error)) => notes.push(format!(
                "{whole} is in MIG mode, but NVML cannot list its MIG instances: {error}; skipped"
            )),
            _ => devices.push(gpu_device(gpu, compute_mode, gpu.memory_gb, notes)),
        }
    }
    devices
}

/// Rule 1: the configured GPUs that can be used, each with the config's memory.
fn configured_gpus(
    config: &DevicesConfig,
    cuda: &CudaEnv,
    nvml: NvmlAnswer,
    notes: &mut Vec<String>,
) -> Vec<InventoryDevice> {
    let answers = match nvml {
        Ok(answers) => answers,
        Err(error) => return configured_without_nvml(config, cuda, &error, notes),
    };
    let gpus: Vec<&NvmlGpu> = answers.iter().filter_map(|answer| answer.as_ref().ok()).collect();
    let visible = visible(cuda, &gpus, answers.len(), notes);
    let mut devices = Vec::new();
    // Each device taken, with the entry that took it.
    let mut taken: Vec<(Unit, usize)> = Vec::new();
    for (i, entry) in config.gpus.iter().enumerate() {
        let key = format!("devices.gpus[{i}]");
        let named = match (&entry.uuid, entry.index) {
            (Some(uuid), _) => by_uuid(&gpus, uuid).map_err(|why| format!("uuid {uuid:?} {why}")),
            (None, Some(index)) => match answers.iter().find(|answer| answer_index(answer) == index) {
                Some(Ok(gpu)) => Ok(Named::Gpu(gpu)),
                Some(Err(e)) => Err(format!("NVML cannot read cuda:{index}: {}", e.error)),
                None => Err(format!("names cuda:{index}, but NVML reports {} GPU(s)", answers.len())),
            },
            (None, None) => Err("names no GPU: set index or uuid".to_owned()),
        };
        let named = match named {
            Ok(named) => named,
            Err(why) => {
                notes.push(format!("{key}: {why}; skipped"));
                continue;
            }
        };
        let unit = named.unit();
        if !visible.admits(unit) {
            notes.push(format!("{key}: {unit} is not in CUDA_VISIBLE_DEVICES; skipped"));
            continue;
        }
        if let Some((_, first)) = taken.iter().find(|(seen, _)| *seen == unit) {
            notes.push(format!("{key}: {unit} is devices.gpus[{first}] already; skipped"));
            continue;
        }
        let gpu = named.gpu();
        let Some(compute_mode) = usable_compute_mode(gpu, notes) else { continue };
        let device = match named {
            Named::Instance(gpu, instance) => mig_device(gpu, instance, compute_mode, entry.memory_gb, notes),
            Named::Gpu(gpu) => match &gpu.mig {
                NvmlMig::Enabled(instances) => {
                    let instead = match instances {
                        Ok(instances) if !instances.is_empty() => {
                            let uuids: Vec<&str> = instances.iter().map(|m| m.uuid.as_str()).collect();
                            format!("name its MIG instances by uuid instead ({})", uuids.join(", "))
                        }
                        Ok(_) => "it has no MIG instance".to_owned(),
                        Err(error) => format!("NVML cannot list its MIG instances: {error}"),
                    };
                    notes.push(format!("{key}: {unit} is in MIG mode: {instead}; skipped"));
                    continue;
                }
                _ => gpu_device(gpu, compute_mode, entry.memory_gb, notes),
            },
        };
        taken.push((unit, i));
        devices.push(device);
    }
    devices
}

/// Rule 1 when NVML is not available: the entries by `uuid`, as written.
fn configured_without_nvml(
    config: &DevicesConfig,
    cuda: &CudaEnv,
    error: &str,
    notes: &mut Vec<String>,
) -> Vec<InventoryDevice> {
    notes.push(format!("NVML not available: {error}; using the devices.gpus entries by uuid as written"));
    // Without NVML only UUIDs written out can be matched: the list ends at anything else.
    let listed: Option<Vec<&str>> = cuda
        .visible_devices
        .as_deref()
        .map(|value| value.split(',').map(str::trim).take_while(|entry| is_uuid_form(entry)).collect());
    let mut devices = Vec::new();
    let mut taken: Vec<(&str, usize)> = Vec::new();
    for (i, GpuConfig { index, uuid, memory_gb }) in config.gpus.iter().enumerate() {
        let key = format!("devices.gpus[{i}]");
        let Some(uuid) = uuid else {
            let index = index.map_or_else(|| "no GPU".to_owned(), |index| format!("cuda:{index}"));
            notes.push(format!(
                "{key}: cannot tell which GPU {index} is without NVML; skipped (give its uuid: {UUID_HINT})"
            ));
            continue;
        };
        if listed.as_ref().is_some_and(|listed| !listed.contains(&uuid.as_str())) {
            notes.push(format!("{key}: {uuid} is not in CUDA_VISIBLE_DEVICES as written; skipped"));
            continue;
        }
        if let Some((_, first)) = taken.iter().find(|(seen, _)| *seen == uuid.as_str()) {
            notes.push(format!("{key}: {uuid} is devices.gpus[{first}] already; skipped"));
            continue;
        }
        taken.push((uuid, i));
        let kind = DeviceKind::Cuda { index: i as u32 };
        devices.push(InventoryDevice {
            kind,
            name: kind.to_string(),
            memory_gb: *memory_gb,
            gpu: Some(GpuInfo {
                uuid: uuid.clone(),
                model: None,
                total_memory_gb: None,
                compute_mode: None,
                mig: None,
            }),
        });
    }
    devices
}

/// A device named by a UUID or an index.
#[derive(Debug, Clone, Copy)]
enum Named<'a> {
    Gpu(&'a NvmlGpu),
    Instance(&'a NvmlGpu, &'a NvmlMigDevice),
}

impl<'a> Named<'a> {
    fn unit(self) -> Unit {
        match self {
            Named::Gpu(gpu) => Unit { gpu: gpu.index, instance: None },
            Named::Instance(gpu, instance) => Unit { gpu: gpu.index, instance: Some(instance.index) },
        }
    }

    fn gpu(self) -> &'a NvmlGpu {
        match self {
            Named::Gpu(gpu) | Named::Instance(gpu, _) => gpu,
        }
    }
}

fn answer_index(answer: &Result<NvmlGpu, NvmlDeviceError>) -> u32 {
    match answer {
        Ok(gpu) => gpu.index,
        Err(e) => e.index,
    }
}

/// `GPU-…` or `MIG-…` with something after it.
fn is_uuid_form(text: &str) -> bool {
    ["GPU-", "MIG-"].iter().any(|prefix| text.len() > prefix.len() && text.starts_with(prefix))
}

/// The one GPU or MIG instance whose UUID is `text` or starts with it, as CUDA matches them.
fn by_uuid<'a>(gpus: &[&'a NvmlGpu], text: &str) -> Result<Named<'a>, String> {
    if !is_uuid_form(text) {
        return Err(format!("is not a GPU-… or MIG-… UUID ({UUID_HINT})"));
    }
    let mut found = Vec::new();
    for gpu in gpus {
        if gpu.uuid.starts_with(text) {
            found.push(Named::Gpu(gpu));
        }
        if let NvmlMig::Enabled(Ok(instances)) = &gpu.mig {
            found.extend(
                instances.iter().filter(|m| m.uuid.starts_with(text)).map(|m| Named::Instance(gpu, m)),
            );
        }
    }
    match found.as_slice() {
        [one] => Ok(*one),
        [] if text.starts_with("MIG-GPU-") => Err(format!(
            "is the old MIG-GPU-…/GI/CI form, which is not read here: name its MIG-… UUID ({UUID_HINT})"
        )),
        [] => Err(format!("matches no GPU or MIG instance ({UUID_HINT})")),
        many => {
            let units: Vec<String> = many.iter().map(|named| named.unit().to_string()).collect();
            Err(format!("matches more than one device ({})", units.join(", ")))
        }
    }
}

/// What the daemon's `CUDA_VISIBLE_DEVICES` leaves of NVML's readable `gpus` (of `counted`), by
/// the rules of the module docs; notes what it ignores.
fn visible(cuda: &CudaEnv, gpus: &[&NvmlGpu], counted: usize, notes: &mut Vec<String>) -> Visible {
    let Some(value) = cuda.visible_devices.as_deref() else { return Visible::All };
    let entries: Vec<&str> =
        if value.trim().is_empty() { Vec::new() } else { value.split(',').map(str::trim).collect() };
    let pci_order = cuda.device_order.as_deref() == Some(PCI_BUS_ORDER);
    // Every GPU by index, each once: the same GPUs in whatever order CUDA numbers them.
    let all_by_index = {
        let indexes: BTreeSet<usize> = entries.iter().filter_map(|entry| entry.parse().ok()).collect();
        !entries.is_empty() && indexes.len() == entries.len() && indexes.iter().copied().eq(0..counted)
    };
    if all_by_index && !pci_order {
        notes.push(format!("CUDA_VISIBLE_DEVICES={value:?} names every GPU by index: scheduling them all"));
        return Visible::All;
    }
    let mut by_bus: Vec<&NvmlGpu> = gpus.to_vec();
    by_bus.sort_by(|a, b| a.pci_bus_id.cmp(&b.pci_bus_id));
    let by_index = |entry: &str| -> Option<Result<Named, String>> {
        let index: usize = entry.parse().ok()?;
        Some(if !pci_order {
            Err(format!(
                "is an index, and without CUDA_DEVICE_ORDER={PCI_BUS_ORDER} CUDA numbers the GPUs fastest first, \
                 in an order the daemon cannot tell: set CUDA_DEVICE_ORDER={PCI_BUS_ORDER} or name GPUs by UUID \
                 ({UUID_HINT})"
            ))
        } else if by_bus.len() < counted {
            Err("is an index, but NVML cannot read every GPU to put them in PCI bus order".to_owned())
        } else {
            by_bus
                .get(index)
                .map(|gpu| Named::Gpu(gpu))
                .ok_or_else(|| format!("is an index past the last of the {counted} GPU(s)"))
        })
    };
    let mut units = BTreeSet::new();
    for (i, entry) in entries.iter().enumerate() {
        let named = match by_index(entry) {
            Some(named) => named,
            None if *entry == "-1" || *entry == "NoDevFiles" => {
                Err("names no device (CUDA's way to hide the GPUs)".to_owned())
            }
            None => by_uuid(gpus, entry),
        };
        match named {
            Ok(named) => {
                if !units.insert(named.unit()) {
                    notes.push(format!("CUDA_VISIBLE_DEVICES names {} twice; taken once", named.unit()));
                }
            }
            Err(why) => {
                let ignored = if i + 1 < entries.len() { " and the entries after it" } else { "" };
                notes.push(format!(
                    "CUDA_VISIBLE_DEVICES={value:?}: {entry:?} {why}; CUDA ignores it{ignored}, and so does the daemon"
                ));
                break;
            }
        }
    }
    let shown: Vec<String> = units.iter().map(ToString::to_string).collect();
    let shown = if shown.is_empty() { "no GPU".to_owned() } else { shown.join(", ") };
    notes.push(format!("CUDA_VISIBLE_DEVICES={value:?}: scheduling {shown}"));
    Visible::Only(units)
}

/// The GPU's compute mode, when a process may use it: `Some(None)` when NVML could not tell;
/// `None` (noted) when it is `Prohibited`.
fn usable_compute_mode(gpu: &NvmlGpu, notes: &mut Vec<String>) -> Option<Option<ComputeMode>> {
    let name = DeviceKind::Cuda { index: gpu.index };
    match &gpu.compute_mode {
        Ok(ComputeMode::Prohibited) => {
            notes.push(format!(
                "{name} ({}) is in compute mode Prohibited: no process may use it; skipped",
                gpu.uuid
            ));
            None
        }
        Ok(mode) => Some(Some(*mode)),
        Err(error) => {
            notes.push(format!("NVML cannot read {name}'s compute mode: {error}; taken as Default"));
            Some(None)
        }
    }
}

/// A whole GPU with `memory_gb` for jobs.
fn gpu_device(
    gpu: &NvmlGpu,
    compute_mode: Option<ComputeMode>,
    memory_gb: f64,
    notes: &mut Vec<String>,
) -> InventoryDevice {
    let kind = DeviceKind::Cuda { index: gpu.index };
    let mig = match &gpu.mig {
        NvmlMig::Unsupported => MigState::Unsupported,
        NvmlMig::Disabled => MigState::Disabled,
        NvmlMig::Unknown(error) => {
            notes.push(format!("NVML cannot tell whether {kind} is in MIG mode: {error}; using it whole"));
            MigState::Unknown
        }
        // Callers never ask for a GPU in MIG mode whole.
        NvmlMig::Enabled(_) => MigState::Unknown,
    };
    note_exclusive(kind, compute_mode, notes);
    InventoryDevice {
        kind,
        name: format!("{kind} ({})", gpu.name),
        memory_gb,
        gpu: Some(GpuInfo {
            uuid: gpu.uuid.clone(),
            model: Some(gpu.name.clone()),
            total_memory_gb: Some(gpu.memory_gb),
            compute_mode,
            mig: Some(mig),
        }),
    }
}

/// Says that a device in exclusive-process mode takes one job at a time.
fn note_exclusive(kind: DeviceKind, compute_mode: Option<ComputeMode>, notes: &mut Vec<String>) {
    if compute_mode == Some(ComputeMode::ExclusiveProcess) {
        notes.push(format!("{kind} is in compute mode ExclusiveProcess: one job at a time runs on it"));
    }
}

/// A MIG instance of `gpu` with `memory_gb` for jobs.
fn mig_device(
    gpu: &NvmlGpu,
    instance: &NvmlMigDevice,
    compute_mode: Option<ComputeMode>,
    memory_gb: f64,
    notes: &mut Vec<String>,
) -> InventoryDevice {
    let kind = DeviceKind::Mig { gpu: gpu.index, instance: instance.index };
    note_exclusive(kind, compute_mode, notes);
    InventoryDevice {
        kind,
        name: format!("{kind} ({})", instance.name),
        memory_gb,
        gpu: Some(GpuInfo {
            uuid: instance.uuid.clone(),
            model: Some(instance.name.clone()),
            total_memory_gb: Some(instance.memory_gb),
            compute_mode,
            mig: Some(MigState::Instance { parent: gpu.uuid.clone() }),
        }),
    }
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
            gpu: None,
        })
        .collect()
}

/// GB with at most one decimal, for people: `79.6`, `80`.
fn short_gb(gb: f64) -> String {
    let text = format!("{gb:.1}");
    text.strip_suffix(".0").map(str::to_owned).unwrap_or(text)
}

/// Asks NVML for every GPU's UUID, name, memory, PCI bus, compute mode and MIG mode (with its
/// MIG instances). Blocks; never panics on a machine without the library or the driver (that is
/// an `Err`).
pub fn nvml_probe() -> NvmlAnswer {
    let nvml = Nvml::init().map_err(|e| e.to_string())?;
    let count = nvml.device_count().map_err(|e| e.to_string())?;
    Ok((0..count)
        .map(|index| probe_gpu(&nvml, index).map_err(|e| NvmlDeviceError { index, error: e.to_string() }))
        .collect())
}

fn probe_gpu(nvml: &Nvml, index: u32) -> Result<NvmlGpu, NvmlError> {
    use nvml_wrapper::enum_wrappers::device::ComputeMode as Mode;
    let device = nvml.device_by_index(index)?;
    let compute_mode = device.compute_mode().map_err(|e| e.to_string()).map(|mode| match mode {
        Mode::Default => ComputeMode::Default,
        Mode::ExclusiveThread | Mode::ExclusiveProcess => ComputeMode::ExclusiveProcess,
        Mode::Prohibited => ComputeMode::Prohibited,
    });
    let mig = match device.mig_mode() {
        Err(NvmlError::NotSupported) => NvmlMig::Unsupported,
        Err(e) => NvmlMig::Unknown(e.to_string()),
        Ok(mode) if mode.current == NVML_MIG_ENABLED => NvmlMig::Enabled(probe_mig(&device)),
        Ok(_) => NvmlMig::Disabled,
    };
    Ok(NvmlGpu {
        index,
        uuid: device.uuid()?,
        name: device.name()?,
        memory_gb: device.memory_info()?.total as f64 / BYTES_PER_GB,
        pci_bus_id: device.pci_info()?.bus_id,
        compute_mode,
        mig,
    })
}

/// The MIG instances of a GPU in MIG mode; an empty slot is not one.
fn probe_mig(device: &nvml_wrapper::Device<'_>) -> Result<Vec<NvmlMigDevice>, String> {
    let slots = device.mig_device_count().map_err(|e| e.to_string())?;
    let mut instances = Vec::new();
    for index in 0..slots {
        let instance = match device.mig_device_by_index(index) {
            Ok(instance) => instance,
            Err(NvmlError::NotFound) => continue,
            Err(e) => return Err(format!("MIG device {index}: {e}")),
        };
        let read = || -> Result<NvmlMigDevice, NvmlError> {
            Ok(NvmlMigDevice {
                index,
                uuid: instance.uuid()?,
                name: instance.name()?,
                memory_gb: instance.memory_info()?.total as f64 / BYTES_PER_GB,
            })
        };
        instances.push(read().map_err(|e| format!("MIG device {index}: {e}"))?);
    }
    Ok(instances)
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

    const H100: &str = "NVIDIA H100 80GB HBM3";
    const A100: &str = "NVIDIA A100-SXM4-80GB";

    /// A GPU in compute mode Default, MIG off, its PCI bus following its index.
    fn gpu(index: u32, uuid: &str, name: &str, memory_gb: f64) -> NvmlGpu {
        NvmlGpu {
            index,
            uuid: uuid.to_owned(),
            name: name.to_owned(),
            memory_gb,
            pci_bus_id: format!("00000000:{:02X}:00.0", 0x18 + 0x10 * index),
            compute_mode: Ok(ComputeMode::Default),
            mig: NvmlMig::Disabled,
        }
    }

    fn mig(index: u32, uuid: &str, profile: &str, memory_gb: f64) -> NvmlMigDevice {
        NvmlMigDevice { index, uuid: uuid.to_owned(), name: format!("{A100} MIG {profile}"), memory_gb }
    }

    fn broken(index: u32, error: &str) -> Result<NvmlGpu, NvmlDeviceError> {
        Err(NvmlDeviceError { index, error: error.to_owned() })
    }

    /// A GPU in MIG mode with two instances.
    fn a100_in_mig_mode(index: u32) -> NvmlGpu {
        let instances =
            vec![mig(0, "MIG-aaaaaaaa-0000", "3g.40gb", 39.5), mig(1, "MIG-bbbbbbbb-0000", "1g.10gb", 9.75)];
        NvmlGpu { mig: NvmlMig::Enabled(Ok(instances)), ..gpu(index, "GPU-33333333-0000", A100, 79.3) }
    }

    /// Four GPUs: two H100s, an A100 in MIG mode, and an H100 first on the PCI bus whose UUID
    /// starts as the second's does.
    fn machine() -> NvmlAnswer {
        Ok(vec![
            Ok(gpu(0, "GPU-11111111-0000", H100, 79.6)),
            Ok(gpu(1, "GPU-22222222-0000", H100, 79.6)),
            Ok(a100_in_mig_mode(2)),
            Ok(NvmlGpu {
                pci_bus_id: "00000000:0F:00.0".to_owned(),
                ..gpu(3, "GPU-22229999-0000", H100, 79.6)
            }),
        ])
    }

    fn devices(
        cpu_slots: Option<u32>,
        cpu_slot_memory_gb: Option<f64>,
        gpus: &[(u32, f64)],
    ) -> DevicesConfig {
        let gpus = gpus
            .iter()
            .map(|&(index, memory_gb)| GpuConfig { index: Some(index), uuid: None, memory_gb })
            .collect();
        DevicesConfig { cpu_slots, cpu_slot_memory_gb, gpus }
    }

    /// `[[devices.gpus]]` entries by uuid (`GPU-…`, `MIG-…`) or, for a number, by index.
    fn gpus(entries: &[(&str, f64)]) -> DevicesConfig {
        let gpus = entries
            .iter()
            .map(|&(name, memory_gb)| match name.parse() {
                Ok(index) => GpuConfig { index: Some(index), uuid: None, memory_gb },
                Err(_) => GpuConfig { index: None, uuid: Some(name.to_owned()), memory_gb },
            })
            .collect();
        DevicesConfig { cpu_slots: None, cpu_slot_memory_gb: None, gpus }
    }

    fn env(visible_devices: Option<&str>, device_order: Option<&str>) -> CudaEnv {
        CudaEnv {
            visible_devices: visible_devices.map(str::to_owned),
            device_order: device_order.map(str::to_owned),
        }
    }

    /// Runs the rules and shows what was asked, the source, each device as people see it (with
    /// `[exclusive]` when the policy keeps it to one job) and the notes.
    fn show(
        config: &DevicesConfig,
        cuda: &CudaEnv,
        nvml: NvmlAnswer,
        machine_memory_gb: Result<f64, String>,
    ) -> String {
        let asked = RefCell::new(Vec::new());
        let inventory = discover_with(
            config,
            cuda,
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
            assert_eq!(policy.name, device.kind.to_string());
            assert_eq!(policy.memory_gb, device.memory_gb);
            let exclusive = if policy.exclusive { " [exclusive]" } else { "" };
            writeln!(shown, "{device}{exclusive}").unwrap();
        }
        for note in &inventory.notes {
            writeln!(shown, "note: {note}").unwrap();
        }
        assert!(!inventory.devices.is_empty(), "an inventory is never empty:\n{shown}");
        shown
    }

    fn check(
        config: DevicesConfig,
        cuda: CudaEnv,
        nvml: NvmlAnswer,
        machine_memory_gb: Result<f64, String>,
        expected: Expect,
    ) {
        expected.assert_eq(&show(&config, &cuda, nvml, machine_memory_gb));
    }

    /// Each value of the daemon's `CUDA_VISIBLE_DEVICES` (and `CUDA_DEVICE_ORDER`) on [`machine`].
    #[test]
    fn cuda_visible_devices_bounds_the_gpus() {
        let pci = Some("PCI_BUS_ID");
        let cases: &[(Option<&str>, Option<&str>)] = &[
            (None, None),
            (Some("GPU-11111111-0000"), None),
            // Prefixes; a GPU in MIG mode is all its instances.
            (Some("GPU-1111,GPU-3333"), None),
            (Some("GPU-2222"), None),
            (Some("MIG-bbbb"), None),
            // Indexes in PCI bus order: cuda:3 is first on the bus.
            (Some("0,1"), pci),
            (Some("0,1"), None),
            (Some("3,1,0,2"), None),
            (Some("7"), pci),
            (Some(""), None),
            (Some("-1"), None),
            (Some("NoDevFiles"), None),
            // CUDA reads up to the first entry that names no device.
            (Some("1,GPU-9999,0"), pci),
            (Some("GPU-11111111-0000,GPU-1111"), None),
            (Some("MIG-GPU-33333333-0000/1/0"), None),
        ];
        let mut shown = String::new();
        for (visible_devices, device_order) in cases {
            let cuda = env(*visible_devices, *device_order);
            writeln!(shown, "== CUDA_VISIBLE_DEVICES={visible_devices:?} CUDA_DEVICE_ORDER={device_order:?}")
                .unwrap();
            shown.push_str(&show(&DevicesConfig::default(), &cuda, machine(), Ok(64.0)));
        }
        expect![[r#"
            == CUDA_VISIBLE_DEVICES=None CUDA_DEVICE_ORDER=None
            Nvml, asked [nvml]
            cuda:0 GPU-11111111-0000: NVIDIA H100 80GB HBM3, 79.6 GB, compute mode Default, MIG disabled
            cuda:1 GPU-22222222-0000: NVIDIA H100 80GB HBM3, 79.6 GB, compute mode Default, MIG disabled
            cuda:2/mig:0 MIG-aaaaaaaa-0000: NVIDIA A100-SXM4-80GB MIG 3g.40gb, 39.5 GB, compute mode Default, MIG instance of GPU-33333333-0000
            cuda:2/mig:1 MIG-bbbbbbbb-0000: NVIDIA A100-SXM4-80GB MIG 1g.10gb, 9.8 GB, compute mode Default, MIG instance of GPU-33333333-0000
            cuda:3 GPU-22229999-0000: NVIDIA H100 80GB HBM3, 79.6 GB, compute mode Default, MIG disabled
            == CUDA_VISIBLE_DEVICES=Some("GPU-11111111-0000") CUDA_DEVICE_ORDER=None
            Nvml, asked [nvml]
            cuda:0 GPU-11111111-0000: NVIDIA H100 80GB HBM3, 79.6 GB, compute mode Default, MIG disabled
            note: CUDA_VISIBLE_DEVICES="GPU-11111111-0000": scheduling cuda:0
            == CUDA_VISIBLE_DEVICES=Some("GPU-1111,GPU-3333") CUDA_DEVICE_ORDER=None
            Nvml, asked [nvml]
            cuda:0 GPU-11111111-0000: NVIDIA H100 80GB HBM3, 79.6 GB, compute mode Default, MIG disabled
            cuda:2/mig:0 MIG-aaaaaaaa-0000: NVIDIA A100-SXM4-80GB MIG 3g.40gb, 39.5 GB, compute mode Default, MIG instance of GPU-33333333-0000
            cuda:2/mig:1 MIG-bbbbbbbb-0000: NVIDIA A100-SXM4-80GB MIG 1g.10gb, 9.8 GB, compute mode Default, MIG instance of GPU-33333333-0000
            note: CUDA_VISIBLE_DEVICES="GPU-1111,GPU-3333": scheduling cuda:0, cuda:2
            == CUDA_VISIBLE_DEVICES=Some("GPU-2222") CUDA_DEVICE_ORDER=None
            CpuSlots, asked [nvml, meminfo]
            cpu:0: 64 GB
            note: CUDA_VISIBLE_DEVICES="GPU-2222": "GPU-2222" matches more than one device (cuda:1, cuda:3); CUDA ignores it, and so does the daemon
            note: CUDA_VISIBLE_DEVICES="GPU-2222": scheduling no GPU
            note: none of the 4 GPU(s) NVML reports can be used; using 1 CPU slot
            == CUDA_VISIBLE_DEVICES=Some("MIG-bbbb") CUDA_DEVICE_ORDER=None
            Nvml, asked [nvml]
            cuda:2/mig:1 MIG-bbbbbbbb-0000: NVIDIA A100-SXM4-80GB MIG 1g.10gb, 9.8 GB, compute mode Default, MIG instance of GPU-33333333-0000
            note: CUDA_VISIBLE_DEVICES="MIG-bbbb": scheduling cuda:2/mig:1
            == CUDA_VISIBLE_DEVICES=Some("0,1") CUDA_DEVICE_ORDER=Some("PCI_BUS_ID")
            Nvml, asked [nvml]
            cuda:0 GPU-11111111-0000: NVIDIA H100 80GB HBM3, 79.6 GB, compute mode Default, MIG disabled
            cuda:3 GPU-22229999-0000: NVIDIA H100 80GB HBM3, 79.6 GB, compute mode Default, MIG disabled
            note: CUDA_VISIBLE_DEVICES="0,1": scheduling cuda:0, cuda:3
            == CUDA_VISIBLE_DEVICES=Some("0,1") CUDA_DEVICE_ORDER=None
            CpuSlots, asked [nvml, meminfo]
            cpu:0: 64 GB
            note: CUDA_VISIBLE_DEVICES="0,1": "0" is an index, and without CUDA_DEVICE_ORDER=PCI_BUS_ID CUDA numbers the GPUs fastest first, in an order the daemon cannot tell: set CUDA_DEVICE_ORDER=PCI_BUS_ID or name GPUs by UUID (nvidia-smi -L prints them); CUDA ignores it and the entries after it, and so does the daemon
            note: CUDA_VISIBLE_DEVICES="0,1": scheduling no GPU
            note: none of the 4 GPU(s) NVML reports can be used; using 1 CPU slot
            == CUDA_VISIBLE_DEVICES=Some("3,1,0,2") CUDA_DEVICE_ORDER=None
            Nvml, asked [nvml]
            cuda:0 GPU-11111111-0000: NVIDIA H100 80GB HBM3, 79.6 GB, compute mode Default, MIG disabled
            cuda:1 GPU-22222222-0000: NVIDIA H100 80GB HBM3, 79.6 GB, compute mode Default, MIG disabled
            cuda:2/mig:0 MIG-aaaaaaaa-0000: NVIDIA A100-SXM4-80GB MIG 3g.40gb, 39.5 GB, compute mode Default, MIG instance of GPU-33333333-0000
            cuda:2/mig:1 MIG-bbbbbbbb-0000: NVIDIA A100-SXM4-80GB MIG 1g.10gb, 9.8 GB, compute mode Default, MIG instance of GPU-33333333-0000
            cuda:3 GPU-22229999-0000: NVIDIA H100 80GB HBM3, 79.6 GB, compute mode Default, MIG disabled
            note: CUDA_VISIBLE_DEVICES="3,1,0,2" names every GPU by index: scheduling them all
            == CUDA_VISIBLE_DEVICES=Some("7") CUDA_DEVICE_ORDER=Some("PCI_BUS_ID")
            CpuSlots, asked [nvml, meminfo]
            cpu:0: 64 GB
            note: CUDA_VISIBLE_DEVICES="7": "7" is an index past the last of the 4 GPU(s); CUDA ignores it, and so does the daemon
            note: CUDA_VISIBLE_DEVICES="7": scheduling no GPU
            note: none of the 4 GPU(s) NVML reports can be used; using 1 CPU slot
            == CUDA_VISIBLE_DEVICES=Some("") CUDA_DEVICE_ORDER=None
            CpuSlots, asked [nvml, meminfo]
            cpu:0: 64 GB
            note: CUDA_VISIBLE_DEVICES="": scheduling no GPU
            note: none of the 4 GPU(s) NVML reports can be used; using 1 CPU slot
            == CUDA_VISIBLE_DEVICES=Some("-1") CUDA_DEVICE_ORDER=None
            CpuSlots, asked [nvml, meminfo]
            cpu:0: 64 GB
            note: CUDA_VISIBLE_DEVICES="-1": "-1" names no device (CUDA's way to hide the GPUs); CUDA ignores it, and so does the daemon
            note: CUDA_VISIBLE_DEVICES="-1": scheduling no GPU
            note: none of the 4 GPU(s) NVML reports can be used; using 1 CPU slot
            == CUDA_VISIBLE_DEVICES=Some("NoDevFiles") CUDA_DEVICE_ORDER=None
            CpuSlots, asked [nvml, meminfo]
            cpu:0: 64 GB
            note: CUDA_VISIBLE_DEVICES="NoDevFiles": "NoDevFiles" names no device (CUDA's way to hide the GPUs); CUDA ignores it, and so does the daemon
            note: CUDA_VISIBLE_DEVICES="NoDevFiles": scheduling no GPU
            note: none of the 4 GPU(s) NVML reports can be used; using 1 CPU slot
            == CUDA_VISIBLE_DEVICES=Some("1,GPU-9999,0") CUDA_DEVICE_ORDER=Some("PCI_BUS_ID")
            Nvml, asked [nvml]
            cuda:0 GPU-11111111-0000: NVIDIA H100 80GB HBM3, 79.6 GB, compute mode Default, MIG disabled
            note: CUDA_VISIBLE_DEVICES="1,GPU-9999,0": "GPU-9999" matches no GPU or MIG instance (nvidia-smi -L prints them); CUDA ignores it and the entries after it, and so does the daemon
            note: CUDA_VISIBLE_DEVICES="1,GPU-9999,0": scheduling cuda:0
            == CUDA_VISIBLE_DEVICES=Some("GPU-11111111-0000,GPU-1111") CUDA_DEVICE_ORDER=None
            Nvml, asked [nvml]
            cuda:0 GPU-11111111-0000: NVIDIA H100 80GB HBM3, 79.6 GB, compute mode Default, MIG disabled
            note: CUDA_VISIBLE_DEVICES names cuda:0 twice; taken once
            note: CUDA_VISIBLE_DEVICES="GPU-11111111-0000,GPU-1111": scheduling cuda:0
            == CUDA_VISIBLE_DEVICES=Some("MIG-GPU-33333333-0000/1/0") CUDA_DEVICE_ORDER=None
            CpuSlots, asked [nvml, meminfo]
            cpu:0: 64 GB
            note: CUDA_VISIBLE_DEVICES="MIG-GPU-33333333-0000/1/0": "MIG-GPU-33333333-0000/1/0" is the old MIG-GPU-…/GI/CI form, which is not read here: name its MIG-… UUID (nvidia-smi -L prints them); CUDA ignores it, and so does the daemon
            note: CUDA_VISIBLE_DEVICES="MIG-GPU-33333333-0000/1/0": scheduling no GPU
            note: none of the 4 GPU(s) NVML reports can be used; using 1 CPU slot
        "#]].assert_eq(&shown);
    }

    #[test]
    fn compute_modes_and_mig_modes() {
        let mode =
            |index: u32, uuid: &str, compute_mode| NvmlGpu { compute_mode, ..gpu(index, uuid, H100, 79.6) };
        let mig_mode = |index: u32, uuid: &str, mig| NvmlGpu { mig, ..gpu(index, uuid, A100, 79.3) };
        check(
            DevicesConfig::default(),
            CudaEnv::default(),
            Ok(vec![
                Ok(mode(0, "GPU-00000000-0000", Ok(ComputeMode::Prohibited))),
                Ok(mode(1, "GPU-11111111-0000", Ok(ComputeMode::ExclusiveProcess))),
                Ok(mode(2, "GPU-22222222-0000", Err("Not Supported".to_owned()))),
                Ok(mig_mode(
                    3,
                    "GPU-33333333-0000",
                    NvmlMig::Enabled(Err("Insufficient Permissions".to_owned())),
                )),
                Ok(mig_mode(4, "GPU-44444444-0000", NvmlMig::Enabled(Ok(vec![])))),
                Ok(mig_mode(5, "GPU-55555555-0000", NvmlMig::Unknown("Unknown Error".to_owned()))),
                Ok(mig_mode(6, "GPU-66666666-0000", NvmlMig::Unsupported)),
                Ok(NvmlGpu { compute_mode: Ok(ComputeMode::ExclusiveProcess), ..a100_in_mig_mode(7) }),
            ]),
            Ok(64.0),
            expect![[r#"
                Nvml, asked [nvml]
                cuda:1 GPU-11111111-0000: NVIDIA H100 80GB HBM3, 79.6 GB, compute mode ExclusiveProcess, MIG disabled [exclusive]
                cuda:2 GPU-22222222-0000: NVIDIA H100 80GB HBM3, 79.6 GB, compute mode unknown, MIG disabled
                cuda:5 GPU-55555555-0000: NVIDIA A100-SXM4-80GB, 79.3 GB, compute mode Default, MIG unknown
                cuda:6 GPU-66666666-0000: NVIDIA A100-SXM4-80GB, 79.3 GB, compute mode Default, no MIG
                cuda:7/mig:0 MIG-aaaaaaaa-0000: NVIDIA A100-SXM4-80GB MIG 3g.40gb, 39.5 GB, compute mode ExclusiveProcess, MIG instance of GPU-33333333-0000 [exclusive]
                cuda:7/mig:1 MIG-bbbbbbbb-0000: NVIDIA A100-SXM4-80GB MIG 1g.10gb, 9.8 GB, compute mode ExclusiveProcess, MIG instance of GPU-33333333-0000 [exclusive]
                note: cuda:0 (GPU-00000000-0000) is in compute mode Prohibited: no process may use it; skipped
                note: cuda:1 is in compute mode ExclusiveProcess: one job at a time runs on it
                note: NVML cannot read cuda:2's compute mode: Not Supported; taken as Default
                note: cuda:3 is in MIG mode, but NVML cannot list its MIG instances: Insufficient Permissions; skipped
                note: cuda:4 is in MIG mode without MIG instances; skipped
                note: NVML cannot tell whether cuda:5 is in MIG mode: Unknown Error; using it whole
                note: cuda:7/mig:0 is in compute mode ExclusiveProcess: one job at a time runs on it
                note: cuda:7/mig:1 is in compute mode ExclusiveProcess: one job at a time runs on it
            "#]],
        );
        // Nothing usable: one CPU slot, saying why.
        check(
            DevicesConfig::default(),
            CudaEnv::default(),
            Ok(vec![Ok(mode(0, "GPU-00000000-0000", Ok(ComputeMode::Prohibited)))]),
            Ok(64.0),
            expect![[r#"
                CpuSlots, asked [nvml, meminfo]
                cpu:0: 64 GB
                note: cuda:0 (GPU-00000000-0000) is in compute mode Prohibited: no process may use it; skipped
                note: none of the 1 GPU(s) NVML reports can be used; using 1 CPU slot
            "#]],
        );
    }

    #[test]
    fn configured_gpus_win_and_nvml_names_them() {
        check(
            devices(None, None, &[(1, 40.0), (0, 80.0)]),
            CudaEnv::default(),
            Ok(vec![
                Ok(gpu(0, "GPU-00000000-0000", H100, 79.6)),
                Ok(gpu(1, "GPU-11111111-0000", H100, 79.6)),
            ]),
            Ok(64.0),
            expect![[r#"
                Config, asked [nvml]
                cuda:1 GPU-11111111-0000: NVIDIA H100 80GB HBM3, 40 GB (of 79.6 GB), compute mode Default, MIG disabled
                cuda:0 GPU-00000000-0000: NVIDIA H100 80GB HBM3, 80 GB (of 79.6 GB), compute mode Default, MIG disabled
            "#]],
        );
    }

    #[test]
    fn configured_gpus_by_uuid_index_or_mig_instance_within_cuda_visible_devices() {
        let config = gpus(&[
            ("GPU-1111", 70.0),
            ("MIG-aaaaaaaa-0000", 30.0),
            // The A100 in MIG mode, whole.
            ("2", 80.0),
            // cuda:0 again.
            ("0", 80.0),
            ("GPU-2222", 80.0),
            ("GPU-9999", 80.0),
            ("7", 80.0),
            ("3", 80.0),
        ]);
        check(
            config.clone(),
            CudaEnv::default(),
            machine(),
            Ok(64.0),
            expect![[r#"
            Config, asked [nvml]
            cuda:0 GPU-11111111-0000: NVIDIA H100 80GB HBM3, 70 GB (of 79.6 GB), compute mode Default, MIG disabled
            cuda:2/mig:0 MIG-aaaaaaaa-0000: NVIDIA A100-SXM4-80GB MIG 3g.40gb, 30 GB (of 39.5 GB), compute mode Default, MIG instance of GPU-33333333-0000
            cuda:3 GPU-22229999-0000: NVIDIA H100 80GB HBM3, 80 GB (of 79.6 GB), compute mode Default, MIG disabled
            note: devices.gpus[2]: cuda:2 is in MIG mode: name its MIG instances by uuid instead (MIG-aaaaaaaa-0000, MIG-bbbbbbbb-0000); skipped
            note: devices.gpus[3]: cuda:0 is devices.gpus[0] already; skipped
            note: devices.gpus[4]: uuid "GPU-2222" matches more than one device (cuda:1, cuda:3); skipped
            note: devices.gpus[5]: uuid "GPU-9999" matches no GPU or MIG instance (nvidia-smi -L prints them); skipped
            note: devices.gpus[6]: names cuda:7, but NVML reports 4 GPU(s); skipped
        "#]],
        );
        // The daemon's CUDA_VISIBLE_DEVICES bounds them too.
        check(
            config,
            env(Some("GPU-33333333-0000,GPU-22229999-0000"), None),
            machine(),
            Ok(64.0),
            expect![[r#"
                Config, asked [nvml]
                cuda:2/mig:0 MIG-aaaaaaaa-0000: NVIDIA A100-SXM4-80GB MIG 3g.40gb, 30 GB (of 39.5 GB), compute mode Default, MIG instance of GPU-33333333-0000
                cuda:3 GPU-22229999-0000: NVIDIA H100 80GB HBM3, 80 GB (of 79.6 GB), compute mode Default, MIG disabled
                note: CUDA_VISIBLE_DEVICES="GPU-33333333-0000,GPU-22229999-0000": scheduling cuda:2, cuda:3
                note: devices.gpus[0]: cuda:0 is not in CUDA_VISIBLE_DEVICES; skipped
                note: devices.gpus[2]: cuda:2 is in MIG mode: name its MIG instances by uuid instead (MIG-aaaaaaaa-0000, MIG-bbbbbbbb-0000); skipped
                note: devices.gpus[3]: cuda:0 is not in CUDA_VISIBLE_DEVICES; skipped
                note: devices.gpus[4]: uuid "GPU-2222" matches more than one device (cuda:1, cuda:3); skipped
                note: devices.gpus[5]: uuid "GPU-9999" matches no GPU or MIG instance (nvidia-smi -L prints them); skipped
                note: devices.gpus[6]: names cuda:7, but NVML reports 4 GPU(s); skipped
            "#]],
        );
    }

    #[test]
    fn configured_gpus_without_nvml_are_taken_by_uuid_only() {
        let no_nvml = || {
            Err("a libloading error occurred: libnvidia-ml.so.1: cannot open shared object file".to_owned())
        };
        let config = DevicesConfig {
            cpu_slots: Some(4),
            ..gpus(&[("0", 80.0), ("GPU-11111111-0000", 80.0), ("MIG-aaaaaaaa-0000", 40.0)])
        };
        check(
            config.clone(),
            CudaEnv::default(),
            no_nvml(),
            Ok(64.0),
            expect![[r#"
            Config, asked [nvml]
            cuda:1 GPU-11111111-0000: 80 GB, compute mode unknown, MIG unknown
            cuda:2 MIG-aaaaaaaa-0000: 40 GB, compute mode unknown, MIG unknown
            note: NVML not available: a libloading error occurred: libnvidia-ml.so.1: cannot open shared object file; using the devices.gpus entries by uuid as written
            note: devices.gpus[0]: cannot tell which GPU cuda:0 is without NVML; skipped (give its uuid: nvidia-smi -L prints them)
            note: devices.cpu_slots is ignored: devices.gpus is set
        "#]],
        );
        // Matched against CUDA_VISIBLE_DEVICES as written, up to its first entry that is no UUID.
        check(
            config.clone(),
            env(Some("MIG-aaaaaaaa-0000,0,GPU-11111111-0000"), None),
            no_nvml(),
            Ok(64.0),
            expect![[r#"
            Config, asked [nvml]
            cuda:2 MIG-aaaaaaaa-0000: 40 GB, compute mode unknown, MIG unknown
            note: NVML not available: a libloading error occurred: libnvidia-ml.so.1: cannot open shared object file; using the devices.gpus entries by uuid as written
            note: devices.gpus[0]: cannot tell which GPU cuda:0 is without NVML; skipped (give its uuid: nvidia-smi -L prints them)
            note: devices.gpus[1]: GPU-11111111-0000 is not in CUDA_VISIBLE_DEVICES as written; skipped
            note: devices.cpu_slots is ignored: devices.gpus is set
        "#]],
        );
        // None left: the configured CPU slots.
        check(
            config,
            env(Some("-1"), None),
            no_nvml(),
            Ok(64.0),
            expect![[r#"
            CpuSlots, asked [nvml, meminfo]
            cpu:0: 16 GB
            cpu:1: 16 GB
            cpu:2: 16 GB
            cpu:3: 16 GB
            note: NVML not available: a libloading error occurred: libnvidia-ml.so.1: cannot open shared object file; using the devices.gpus entries by uuid as written
            note: devices.gpus[0]: cannot tell which GPU cuda:0 is without NVML; skipped (give its uuid: nvidia-smi -L prints them)
            note: devices.gpus[1]: GPU-11111111-0000 is not in CUDA_VISIBLE_DEVICES as written; skipped
            note: devices.gpus[2]: MIG-aaaaaaaa-0000 is not in CUDA_VISIBLE_DEVICES as written; skipped
            note: none of devices.gpus can be used; using 4 CPU slot(s)
        "#]],
        );
    }

    #[test]
    fn configured_gpus_nvml_does_not_know_are_skipped_with_a_note() {
        check(
            devices(None, None, &[(0, 80.0), (1, 80.0), (3, 80.0)]),
            CudaEnv::default(),
            Ok(vec![Ok(gpu(0, "GPU-00000000-0000", H100, 79.6)), broken(1, "GPU is lost")]),
            Err("unused".to_owned()),
            expect![[r#"
                Config, asked [nvml]
                cuda:0 GPU-00000000-0000: NVIDIA H100 80GB HBM3, 80 GB (of 79.6 GB), compute mode Default, MIG disabled
                note: devices.gpus[1]: NVML cannot read cuda:1: GPU is lost; skipped
                note: devices.gpus[2]: names cuda:3, but NVML reports 2 GPU(s); skipped
            "#]],
        );
    }

    #[test]
    fn cpu_slots_when_set_even_with_gpus_and_nvml_is_not_asked() {
        check(
            devices(Some(2), Some(8.0), &[]),
            CudaEnv::default(),
            Ok(vec![Ok(gpu(0, "GPU-00000000-0000", H100, 79.6))]),
            Ok(64.0),
            expect![[r#"
                CpuSlots, asked []
                cpu:0: 8 GB
                cpu:1: 8 GB
            "#]],
        );
        // Without their memory, the slots share the machine's.
        check(
            devices(Some(4), None, &[]),
            CudaEnv::default(),
            Ok(vec![]),
            Ok(62.5),
            expect![[r#"
            CpuSlots, asked [meminfo]
            cpu:0: 15.6 GB
            cpu:1: 15.6 GB
            cpu:2: 15.6 GB
            cpu:3: 15.6 GB
        "#]],
        );
        check(
            devices(Some(2), None, &[]),
            CudaEnv::default(),
            Ok(vec![]),
            Err("/proc/meminfo: permission denied".to_owned()),
            expect![[r#"
                CpuSlots, asked [meminfo]
                cpu:0: 8 GB
                cpu:1: 8 GB
                note: cannot read the machine's memory: /proc/meminfo: permission denied; assuming 16 GB
            "#]],
        );
    }

    #[test]
    fn nvml_gpus_by_default_skipping_the_unreadable() {
        check(
            devices(None, None, &[]),
            CudaEnv::default(),
            Ok(vec![
                Ok(gpu(0, "GPU-00000000-0000", H100, 79.6)),
                broken(1, "Unknown Error"),
                Ok(NvmlGpu { mig: NvmlMig::Unsupported, ..gpu(2, "GPU-22222222-0000", "NVIDIA A10", 22.5) }),
            ]),
            Ok(64.0),
            expect![[r#"
                Nvml, asked [nvml]
                cuda:0 GPU-00000000-0000: NVIDIA H100 80GB HBM3, 79.6 GB, compute mode Default, MIG disabled
                cuda:2 GPU-22222222-0000: NVIDIA A10, 22.5 GB, compute mode Default, no MIG
                note: NVML cannot read cuda:1: Unknown Error; skipped
            "#]],
        );
        // cpu_slot_memory_gb alone does not stop NVML's GPUs.
        check(
            devices(None, Some(8.0), &[]),
            CudaEnv::default(),
            Ok(vec![Ok(gpu(0, "GPU-00000000-0000", H100, 79.6))]),
            Ok(64.0),
            expect![[r#"
                Nvml, asked [nvml]
                cuda:0 GPU-00000000-0000: NVIDIA H100 80GB HBM3, 79.6 GB, compute mode Default, MIG disabled
            "#]],
        );
    }

    #[test]
    fn one_cpu_slot_when_no_gpu_is_found_saying_why() {
        check(
            devices(None, None, &[]),
            CudaEnv::default(),
            Err("NVIDIA driver is not loaded".to_owned()),
            Ok(125.8),
            expect![[r#"
                CpuSlots, asked [nvml, meminfo]
                cpu:0: 125.8 GB
                note: NVML not available: NVIDIA driver is not loaded; using 1 CPU slot
            "#]],
        );
        check(
            devices(None, Some(8.0), &[]),
            CudaEnv::default(),
            Ok(vec![]),
            Ok(125.8),
            expect![[r#"
            CpuSlots, asked [nvml]
            cpu:0: 8 GB
            note: NVML found no GPU; using 1 CPU slot
        "#]],
        );
        check(
            devices(None, None, &[]),
            CudaEnv::default(),
            Ok(vec![broken(0, "Unknown Error"), broken(1, "Unknown Error")]),
            Err("/proc/meminfo: no MemTotal line in kB".to_owned()),
            expect![[r#"
                CpuSlots, asked [nvml, meminfo]
                cpu:0: 16 GB
                note: NVML cannot read cuda:0: Unknown Error; skipped
                note: NVML cannot read cuda:1: Unknown Error; skipped
                note: none of the 2 GPU(s) NVML reports can be used; using 1 CPU slot
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
    /// an inventory; every GPU in it has a UUID.
    #[test]
    fn discover_runs_on_this_machine() {
        assert!(meminfo_total_gb().is_ok_and(|gb| gb > 0.0) || !Path::new(MEMINFO).exists());
        let inventory = discover(&DevicesConfig::default());
        assert!(!inventory.devices.is_empty());
        assert!(inventory.devices.iter().all(|d| d.memory_gb > 0.0), "{inventory:?}");
        for device in &inventory.devices {
            let uuid = device.gpu.as_ref().map(|gpu| gpu.uuid.as_str());
            assert!(uuid.is_none_or(is_uuid_form), "{device}");
        }
    }
}
