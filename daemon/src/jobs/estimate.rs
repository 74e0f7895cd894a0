//! A submitted job's memory estimate (`rlvr_protocol::memory`, pure) from what only the daemon
//! can read: the `config.json` of the models its spec names (after `tenancy` resolved them to
//! the server's directories), the lengths of its data, what its optimizer plugin keeps, and the
//! kind of this daemon's devices. `POST /v1/jobs` fills `[resources] memory_gb` and
//! `resident_gb` from it when the spec leaves them out; `POST /v1/estimate` shows it.
//!
//! [`fill_at_submit`] fills `[resources]`, or refuses naming the numbers.

use std::path::Path;

use rlvr_plugin_api::{DataMode, TrainedModel};
use rlvr_plugin_host::Registry;
use rlvr_plugin_host::fit::{optimizer_needs, trained_model};
use rlvr_protocol::builtin::DistillOptions;
use rlvr_protocol::builtin_models;
use rlvr_protocol::kind::JobKind;
use rlvr_protocol::memory::{
    self, DataLengths, DeviceKind, Inputs, MemoryEstimate, ModelShape, OptimizerNeeds, RewardModelInput,
};
use rlvr_protocol::reward_model::{RewardModelOptions, is_reward_model};
use rlvr_protocol::spec::{JobSpec, SpecError};

use crate::sched::service::Scheduler;
use crate::tenancy::Tenancy;
use crate::tenancy::resolve::worker_spec;

/// PEFT's adapter config, whose `base_model_name_or_path` names the model the adapters go on.
const ADAPTER_CONFIG: &str = "adapter_config.json";

/// The estimate for `resolved` (a spec whose model and data names `tenancy::resolve::worker_spec`
/// replaced with the server's paths) on devices of `device` kind; an error names the field whose
/// model or data could not be read.
pub fn estimate(
    resolved: &JobSpec,
    registry: &Registry,
    device: DeviceKind,
) -> Result<MemoryEstimate, SpecError> {
    let problem = |field: &str, message: String| SpecError { field: field.to_owned(), message };
    // A built-in's kind is the spec's alone; a plugin's needs are asked of the plugin below.
    let builtin = JobKind::of(resolved, None);
    let needs = match builtin {
        // Samples like an online job, keeps no reference. The estimate still counts AdamW's state
        // for the policy, which this job never allocates: an over-estimate, never an under one.
        Some(JobKind::RejectionSampling) => OptimizerNeeds::default(),
        // The teacher is counted as a reference copy of its own shape (below): resident weights
        // and a no-grad pass, as a reference's.
        Some(JobKind::Distill) => OptimizerNeeds { reference: true, ..OptimizerNeeds::default() },
        _ => {
            let plugin = registry
                .find(&resolved.optimizer.plugin, Some(rlvr_plugin_api::PluginKind::Optimizer))
                .map_err(|error| problem("optimizer.plugin", error.to_string()))?;
            let info = optimizer_needs(&plugin.meta).ok_or_else(|| {
                problem("optimizer.plugin", format!("{} reports no data mode", plugin.id()))
            })?;
            OptimizerNeeds {
                reference: info.needs_reference,
                value_head: info.needs_value_head,
                pairs: info.data_mode == DataMode::OfflinePairs,
                offline: matches!(info.data_mode, DataMode::OfflinePairs | DataMode::OfflineSft),
                reward_model: trained_model(&plugin.meta) == TrainedModel::RewardModel,
            }
        }
    };
    let policy = shape_of(&resolved.model.policy).map_err(|message| problem("model.policy", message))?;
    let reference = match resolved.model.reference.as_str() {
        _ if builtin == Some(JobKind::Distill) => {
            let teacher = DistillOptions::from_spec(resolved)?.teacher;
            Some(shape_of(&teacher).map_err(|message| problem("optimizer.teacher", message))?)
        }
        "same" => None,
        source => Some(shape_of(source).map_err(|message| problem("model.reference", message))?),
    };
    // A line at a time: a dataset may be as large as tenancy.max_dataset_bytes.
    let read_lengths = |field: &str, path: &Path| {
        std::fs::File::open(path)
            .and_then(|file| DataLengths::scan_jsonl(std::io::BufReader::new(file)))
            .map_err(|error| problem(field, format!("cannot read the data for the memory estimate: {error}")))
    };
    let (prompt_tokens, completion_tokens) = read_lengths("data.train", &resolved.data.train)?;
    let heldout_prompt_tokens = match &resolved.data.heldout {
        Some(path) => read_lengths("data.heldout", path)?.0,
        None => 0,
    };
    let data = DataLengths { prompt_tokens, completion_tokens, heldout_prompt_tokens };
    // The gates' baseline is a model loaded for the evaluation, except a LoRA job's start,
    // which is the policy with its adapters off.
    let baseline = resolved.model.lora.is_none().then_some(policy);
    let mut reward_models = Vec::new();
    for (i, section) in resolved.verifiers.iter().enumerate() {
        if !is_reward_model(section) {
            continue;
        }
        let prefix = format!("verifiers[{i}].");
        let options = RewardModelOptions::from_section(section, &prefix)?;
        let shape =
            shape_of(&options.model).map_err(|message| problem(&format!("{prefix}model"), message))?;
        reward_models.push(RewardModelInput {
            shape,
            batch_size: options.batch_size,
            max_length: options.max_length,
        });
    }
    let inputs = Inputs { policy, reference, baseline, needs, data, device, reward_models };
    Ok(memory::estimate(resolved, &inputs))
}

/// `rlvrd estimate`: the estimate of a job spec for a run outside the daemon (`rlvr-worker run`,
/// the benchmark scripts): its models and data as the spec names them (paths, as the worker
/// reads them), its optimizer from the plugin libraries in `plugin_dirs`, probed by `worker` as
/// the daemon probes them (into a temporary cache, so nothing is left behind). With the estimate,
/// the policy's parameter count it assumed.
pub fn offline(
    spec: &JobSpec,
    plugin_dirs: &[std::path::PathBuf],
    worker: &Path,
    device: DeviceKind,
) -> Result<(MemoryEstimate, u64), String> {
    let cache = tempfile::tempdir().map_err(|error| format!("cannot make a plugin cache: {error}"))?;
    let registry = Registry::new(
        cache.path().to_owned(),
        rlvr_plugin_host::Isolation::Subprocess {
            exe: worker.to_owned(),
            timeout: crate::serve::PROBE_TIMEOUT,
        },
        rlvr_plugin_host::metrics::PluginMetrics::default(),
    )
    .map_err(|error| error.to_string())?;
    registry.scan(plugin_dirs, std::time::Duration::ZERO);
    let parameters =
        shape_of(&spec.model.policy).map_err(|message| format!("model.policy: {message}"))?.parameters();
    let estimate = estimate(spec, &registry, device)
        .map_err(|problem| format!("{}: {}", problem.field, problem.message))?;
    Ok((estimate, parameters))
}

/// The shape of the model at `source`: the built-in model, a directory with `config.json`, or a
/// PEFT adapter directory (its base's).
fn shape_of(source: &str) -> Result<ModelShape, String> {
    if source.starts_with(builtin_models::PREFIX) {
        return builtin_models::BuiltinSource::parse(source).map(|source| source.shape());
    }
    let dir = Path::new(source);
    if dir.join(ADAPTER_CONFIG).is_file() {
        let base = adapter_base(dir)?;
        if Path::new(&base).join(ADAPTER_CONFIG).is_file() {
            return Err(format!("{ADAPTER_CONFIG}: its base is an adapter directory itself"));
        }
        return shape_of(&base);
    }
    let text = std::fs::read_to_string(dir.join("config.json"))
        .map_err(|error| format!("cannot read the model's config.json: {error}"))?;
    ModelShape::from_config_json(&text).map_err(|message| format!("config.json: {message}"))
}

/// The base a PEFT adapter directory names: the built-in model, or a directory (relative to the
/// adapter's when not absolute, as the worker reads it).
fn adapter_base(dir: &Path) -> Result<String, String> {
    let text = std::fs::read_to_string(dir.join(ADAPTER_CONFIG))
        .map_err(|error| format!("cannot read {ADAPTER_CONFIG}: {error}"))?;
    let value: serde_json::Value =
        serde_json::from_str(&text).map_err(|error| format!("{ADAPTER_CONFIG}: {error}"))?;
    let base = value
        .get("base_model_name_or_path")
        .and_then(serde_json::Value::as_str)
        .ok_or_else(|| format!("{ADAPTER_CONFIG}: no base_model_name_or_path"))?;
    if base.starts_with("builtin:") || Path::new(base).is_absolute() {
        Ok(base.to_owned())
    } else {
        Ok(dir.join(base).to_string_lossy().into_owned())
    }
}

/// What submit writes into `[resources]` when the spec leaves `memory_gb` out.
pub fn fill_resources(spec: &mut JobSpec, estimate: &MemoryEstimate) {
    spec.resources.memory_gb = estimate.total_gb();
    spec.resources.resident_gb = Some(estimate.resident_gb());
}

/// The estimate in one line, for refusals and logs: `5.3 GB (resident 3.1 GB + update 2.2 GB)`.
pub fn summary(estimate: &MemoryEstimate) -> String {
    let gb = |bytes: u64| format!("{:.1} GB", bytes as f64 / memory::BYTES_PER_GB);
    match estimate.largest_phase() {
        Some(phase) => format!(
            "{} (resident {} + {} {})",
            gb(estimate.total_bytes()),
            gb(estimate.resident_bytes()),
            phase.phase,
            gb(phase.bytes())
        ),
        None => gb(estimate.total_bytes()),
    }
}

/// At submit: when `spec` leaves
/// `[resources] memory_gb` out, fills it and `resident_gb` from the job's estimate, and refuses
/// the job when that fits no device of this daemon, naming the numbers.
pub fn fill_at_submit(
    spec: &mut JobSpec,
    tenancy: &Tenancy,
    registry: &Registry,
    scheduler: &Scheduler,
) -> Result<(), SpecError> {
    if spec.resources.memory_gb > 0.0 {
        return Ok(());
    }
    // A name that does not resolve is `tenancy::resolve::admit`'s to refuse, with its field.
    let Ok(resolved) = worker_spec(tenancy, spec) else { return Ok(()) };
    let estimate = estimate(&resolved, registry, scheduler.device_kind())?;
    fill_resources(spec, &estimate);
    let demand = scheduler.demand("submitted", spec, std::time::Duration::ZERO);
    scheduler.can_ever_fit(&demand).map_err(|why| SpecError {
        field: "resources.memory_gb".to_owned(),
        message: format!(
            "the job needs about {} by its memory estimate (rlvrctl estimate shows the parts); {}",
            summary(&estimate),
            why.message
        ),
    })
}
