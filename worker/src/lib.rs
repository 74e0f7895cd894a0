//! `rlvr-worker run`: runs one job end to end — rollout, verification, update, checkpoint — in its
//! own process (design.md §2); `rlvrd serve` starts one for each admitted job.
//!
//! Everything that can be checked is checked before the first byte is written to the state
//! directory: the spec, the plugins (and whether they fit each other and the data), the data
//! files, the model. A run that cannot start leaves nothing behind.
//!
//! - `setup`-like code lives here: [`run`] loads everything and drives the steps.
//! - [`step`]: one training step, online (rollout → verify → advantages → μ updates) or offline.
//! - [`eval`]: held-out scoring (greedy).
//! - [`grants`]: the daemon's device grants, asked for before each device phase.
//! - [`stop`]: the `[stop]` conditions, judged on each step's metrics.
//! - [`state`]: checkpoints and the JSONL logs, written atomically.
//! - [`optim`]: AdamW, the schedule, gradient clipping.
//! - [`data`], [`reward`]: the data files and the weighted verifier reward.

pub mod data;
pub mod eval;
pub mod grants;
pub mod lifecycle;
pub mod optim;
pub mod reward;
pub mod state;
pub mod step;
pub mod stop;

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use rlvr_model::{LoadedModel, load as load_model, save_pretrained};
use rlvr_model::{SamplerRng, SamplingParams};
use rlvr_plugin_api::{CurriculumBox, DataMode, OptimizerBox, OptimizerInfo, PluginInstance, PluginKind};
use serde_json::json;
use sha2::{Digest, Sha256};
use tch::{Device, Kind, Tensor, nn};
use tracing::{info, info_span, warn};

use self::data::{Cursor, PairRecord, PromptRecord, SftRecord};
use self::optim::{AdamW, AdamWConfig};
use self::reward::{Rewarder, WeightedVerifier};
use self::state::{JobRecord, JsonlLog, StateDir, TrainState};
use rlvr_plugin_host::fit::{fit_problems, optimizer_needs};
use rlvr_plugin_host::metrics::PluginMetrics;
use rlvr_plugin_host::{Isolation, LoadedPlugin, Registry};
use rlvr_protocol::spec::{Dtype, JobSpec};
use rlvr_protocol::worker::{WorkerArgs, WorkerExit};

/// How to run.
#[derive(Debug, Clone)]
pub struct WorkerOptions {
    pub spec: PathBuf,
    pub state_dir: PathBuf,
    /// Continue from the newest checkpoint in `state_dir` (a fresh start when there is none).
    pub resume: bool,
    /// Directories to load plugins from.
    pub plugin_dirs: Vec<PathBuf>,
    /// `None`: CUDA when available, else CPU.
    pub device: Option<Device>,
    /// Verifier calls at once.
    pub verify_parallel: usize,
    /// libtorch's CPU threads. CPU results are bit-exact for one thread count: the run records
    /// it, and a resume with another count says so in the log.
    pub threads: usize,
    /// The daemon's grant socket and this job's id there; `None`: no grants (a run by hand).
    pub grants: Option<(PathBuf, String)>,
    /// The model line's published version the gates compare with (its directory and number);
    /// `None`: the job's starting checkpoint (the line has none yet, or a run by hand).
    pub baseline: Option<(PathBuf, u64)>,
    /// The directory of shared curricula and the version of `[curriculum] name` the daemon
    /// pinned at admission: the curriculum's estimates start from its counts.
    pub curriculum_version: Option<(PathBuf, u64)>,
}

impl WorkerOptions {
    /// The options of `rlvr-worker run`: plugin directories resolved, the device parsed, cores as
    /// the defaults.
    pub fn from_args(args: WorkerArgs) -> Result<Self, WorkerError> {
        let plugin_dirs =
            rlvr_plugin_host::dirs::plugin_dirs(args.config.as_deref(), args.plugin_dirs).map_err(
                |error| WorkerError::Plugin { field: "plugins.dirs".into(), message: error.to_string() },
            )?;
        let device = args.device.as_deref().map(parse_device).transpose()?;
        let cores = std::thread::available_parallelism().map_or(1, std::num::NonZero::get);
        Ok(WorkerOptions {
            spec: args.spec,
            state_dir: args.state_dir,
            resume: args.resume,
            plugin_dirs,
            device,
            verify_parallel: args.verify_parallel.unwrap_or(cores),
            threads: args.threads.unwrap_or(cores).max(1),
            grants: args.grant_socket.zip(args.job_id),
            baseline: args.baseline.zip(args.baseline_version),
            curriculum_version: args.curricula_dir.zip(args.curriculum_version),
        })
    }
}

/// `cpu`, `cuda` or `cuda:N`.
fn parse_device(text: &str) -> Result<Device, WorkerError> {
    match text {
        "cpu" => Ok(Device::Cpu),
        "cuda" => Ok(Device::Cuda(0)),
        other => match other.strip_prefix("cuda:").and_then(|n| n.parse().ok()) {
            Some(index) => Ok(Device::Cuda(index)),
            None => Err(WorkerError::Model {
                field: "--device",
                message: format!("expected cpu, cuda or cuda:N, got {other:?}"),
            }),
        },
    }
}

/// How a run ended.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Outcome {
    pub steps: u64,
    /// SHA-256 over the policy's tensors (names sorted, raw bytes): equal runs give equal hashes.
    pub weights_sha256: String,
    pub heldout_before: Option<f64>,
    pub heldout_after: Option<f64>,
    pub checkpoint: PathBuf,
    /// Why it ended before max_steps, if it did.
    pub stopped: Option<String>,
    /// It stopped on a stop request (SIGTERM) with its state checkpointed: resume it to go on.
    pub interrupted: bool,
    /// Training's trend (first steps against the last), when it logged rewards.
    pub training: Option<stop::Trend>,
    /// The gates' evaluation of the candidate against its baseline ([`eval::for_gates`]); not
    /// made for an interrupted run.
    pub evaluation: Option<serde_json::Value>,
    /// The plugins it trained with: `{"id": "name@version", "sha256": …}`.
    pub plugins: Vec<serde_json::Value>,
    /// SHA-256 of each data file (`train`, `heldout`, `canaries`).
    pub data_sha256: BTreeMap<String, String>,
}

/// Why a run could not start or go on. Each names the field or file at fault.
#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    #[error("{path}: {message}")]
    Spec { path: PathBuf, message: String },
    #[error("{field}: {message}")]
    Plugin { field: String, message: String },
    #[error(transparent)]
    Data(#[from] data::DataError),
    #[error("{field}: {message}")]
    Model { field: &'static str, message: String },
    #[error("state dir {path}: {message}")]
    State { path: PathBuf, message: String },
    #[error("step {step}: {message}")]
    Step { step: u64, message: String },
    /// The daemon's grant socket failed: not the job's fault (the worker exits 70 and the
    /// daemon requeues the job).
    #[error("{0}")]
    Grants(String),
    /// A `[stop]` condition tripped: what, the measured value, the step, the checkpoint kept.
    #[error("{0}")]
    Stopped(String),
}

impl WorkerError {
    /// How the process ends on this error: a failed grant is not the job's fault (the daemon
    /// requeues it); everything else is.
    pub fn exit(&self) -> WorkerExit {
        match self {
            WorkerError::Grants(_) => WorkerExit::Transient,
            _ => WorkerExit::JobError,
        }
    }
}

/// The training data, by the optimizer's data mode.
pub enum TrainData {
    Prompts(Vec<PromptRecord>),
    Sft(Vec<SftRecord>),
    Pairs(Vec<PairRecord>),
}

/// Everything a step needs.
pub struct Job {
    pub spec: JobSpec,
    pub device: Device,
    pub policy: LoadedModel,
    pub reference: Option<LoadedModel>,
    pub value_head: Option<(nn::VarStore, nn::Linear)>,
    pub optimizer: OptimizerBox,
    pub optimizer_info: OptimizerInfo,
    pub rewarder: Rewarder,
    pub curriculum: Option<CurriculumBox>,
    pub train: TrainData,
    pub heldout: Option<Vec<PromptRecord>>,
    pub adamw: AdamW,
    pub rng: SamplerRng,
    pub cursor: Cursor,
    pub sampling: SamplingParams,
    pub grants: grants::Grants,
}

/// Runs the job of `options.spec` until its budget ends; see the module docs.
pub fn run(options: &WorkerOptions) -> Result<Outcome, WorkerError> {
    // Held until the process ends: no second worker runs this directory meanwhile.
    let _lock = lifecycle::lock_run(&options.state_dir, RUN_LOCK_WAIT).map_err(|error| {
        WorkerError::State { path: options.state_dir.clone(), message: error.to_string() }
    })?;
    let spec_bytes = std::fs::read(&options.spec).map_err(|error| WorkerError::Spec {
        path: options.spec.clone(),
        message: format!("cannot read: {error}"),
    })?;
    let spec_text = String::from_utf8(spec_bytes.clone())
        .map_err(|_| WorkerError::Spec { path: options.spec.clone(), message: "not UTF-8".into() })?;
    let spec = JobSpec::parse_file_text(&options.spec, &spec_text)
        .map_err(|errors| WorkerError::Spec { path: options.spec.clone(), message: errors.to_string() })?;
    let spec_sha256 = hex::encode(Sha256::digest(&spec_bytes));
    let dir = StateDir { root: options.state_dir.clone() };
    let state_error = |message: String| WorkerError::State { path: options.state_dir.clone(), message };

    // What a previous run of this job left, if anything.
    let previous = dir.read_job().map_err(|error| state_error(format!("cannot read job.json: {error}")))?;
    if let Some(previous) = &previous {
        if !options.resume {
            return Err(state_error(
                "holds a run already; pass --resume to continue it, or use an empty directory".into(),
            ));
        }
        if previous.spec_sha256 != spec_sha256 {
            return Err(state_error(format!(
                "the run there started from a different spec (sha256 {}); resume with the same file",
                previous.spec_sha256
            )));
        }
        if previous.threads != options.threads {
            warn!(
                started_with = previous.threads,
                now = options.threads,
                "resuming with another thread count: CPU results will differ from an uninterrupted run in the last bits"
            );
        }
    }
    tch::set_num_threads(options.threads as i32);
    keep_freed_memory();
    let checkpoint = if options.resume {
        dir.latest().map_err(|error| state_error(format!("cannot read checkpoints/LATEST: {error}")))?
    } else {
        None
    };
    let saved_state: Option<TrainState> = match &checkpoint {
        Some(path) => Some(
            std::fs::read(path.join("state.json"))
                .map_err(io_msg)
                .and_then(|bytes| serde_json::from_slice(&bytes).map_err(|e| e.to_string()))
                .map_err(|message| {
                    state_error(format!("{}: {message}", path.join("state.json").display()))
                })?,
        ),
        None => None,
    };

    // Plugins: pinned versions on resume, newest otherwise.
    let span = info_span!("job", name = %spec.job.name, team = %spec.job.team);
    let _entered = span.enter();
    sweep_stale_plugin_copies(&std::env::temp_dir());
    let cache = tempfile::Builder::new()
        .prefix(&format!("{PLUGIN_COPIES_PREFIX}{}-", std::process::id()))
        .tempdir()
        .map_err(|error| state_error(format!("cannot create a temp dir for plugins: {error}")))?;
    let registry = Registry::new(cache.path().to_owned(), Isolation::InProcess, PluginMetrics::unexported())
        .map_err(|error| state_error(error.to_string()))?;
    registry.scan(&options.plugin_dirs, std::time::Duration::ZERO);
    let pinned = previous.as_ref();
    let find = |field: String, wanted: &str, pin: Option<&str>, kind: PluginKind| {
        registry.find(pin.unwrap_or(wanted), Some(kind)).map_err(|error| WorkerError::Plugin {
            field,
            message: format!(
                "{error} (looked in {})",
                options.plugin_dirs.iter().map(|d| d.display().to_string()).collect::<Vec<_>>().join(", ")
            ),
        })
    };
    let optimizer_plugin = find(
        "optimizer.plugin".into(),
        &spec.optimizer.plugin,
        pinned.map(|p| p.optimizer.as_str()),
        PluginKind::Optimizer,
    )?;
    let optimizer_info = optimizer_needs(&optimizer_plugin.meta).ok_or_else(|| WorkerError::Plugin {
        field: "optimizer.plugin".into(),
        message: format!("{} reports no data mode this worker knows", optimizer_plugin.id()),
    })?;
    let optimizer = match optimizer_plugin.create(&spec.optimizer_plugin_config(), &[]) {
        Ok(PluginInstance::Optimizer(optimizer)) => optimizer,
        Ok(other) => {
            return Err(WorkerError::Plugin {
                field: "optimizer.plugin".into(),
                message: format!("{} created a {}", optimizer_plugin.id(), other.kind().as_str()),
            });
        }
        Err(error) => {
            return Err(WorkerError::Plugin {
                field: "optimizer".into(),
                message: format!("{} refused its options: {error}", optimizer_plugin.id()),
            });
        }
    };
    let mut verifiers = Vec::new();
    let mut verifier_plugins: Vec<Arc<LoadedPlugin>> = Vec::new();
    for (i, section) in spec.verifiers.iter().enumerate() {
        let pin = pinned.and_then(|p| p.verifiers.get(i)).map(String::as_str);
        let plugin = find(format!("verifiers[{i}].plugin"), &section.plugin, pin, PluginKind::Verifier)?;
        let verifier = plugin.verifier(&section.plugin_config()).map_err(|error| WorkerError::Plugin {
            field: format!("verifiers[{i}]"),
            message: format!("{} refused its options: {error}", plugin.id()),
        })?;
        verifiers.push(WeightedVerifier {
            name: plugin.meta.name.clone(),
            id: plugin.id(),
            weight: section.weight,
            verifier: Arc::new(verifier),
        });
        verifier_plugins.push(plugin);
    }
    check_fit(&spec, &optimizer_info, optimizer_plugin.id())?;
    let mut plugin_hashes: Vec<serde_json::Value> = std::iter::once(&optimizer_plugin)
        .chain(&verifier_plugins)
        .map(|plugin| json!({"id": plugin.id(), "sha256": plugin.sha256}))
        .collect();

    // Data.
    let train = match optimizer_info.data_mode {
        DataMode::OnlineGroups | DataMode::OnlineWithCritic => {
            TrainData::Prompts(data::load_prompts("data.train", &spec.data.train)?)
        }
        DataMode::OfflineSft => TrainData::Sft(data::load_sft("data.train", &spec.data.train)?),
        DataMode::OfflinePairs => TrainData::Pairs(data::load_pairs("data.train", &spec.data.train)?),
    };
    let heldout =
        spec.data.heldout.as_ref().map(|path| data::load_prompts("data.heldout", path)).transpose()?;
    let canaries =
        spec.data.canaries.as_ref().map(|path| data::load_prompts("data.canaries", path)).transpose()?;
    let curriculum = match &spec.curriculum {
        None => None,
        Some(section) => {
            // check_fit refused a curriculum on offline data above; this only names the prompts.
            let TrainData::Prompts(prompts) = &train else {
                return Err(WorkerError::Plugin {
                    field: "curriculum".into(),
                    message: "needs prompt data".into(),
                });
            };
            let pin = pinned.and_then(|p| p.curriculum.as_deref());
            let plugin = find("curriculum.plugin".into(), &section.plugin, pin, PluginKind::Curriculum)?;
            plugin_hashes.push(json!({"id": plugin.id(), "sha256": plugin.sha256}));
            let ids: Vec<String> = prompts.iter().map(|p| p.id.clone()).collect();
            let config = pinned_curriculum_config(section, options.curriculum_version.as_ref())?;
            match plugin.create(&config, &ids) {
                Ok(PluginInstance::Curriculum(curriculum)) => Some((plugin.id(), curriculum)),
                Ok(other) => {
                    return Err(WorkerError::Plugin {
                        field: "curriculum.plugin".into(),
                        message: format!("{} created a {}", plugin.id(), other.kind().as_str()),
                    });
                }
                Err(error) => {
                    return Err(WorkerError::Plugin {
                        field: "curriculum".into(),
                        message: format!("{} refused its options: {error}", plugin.id()),
                    });
                }
            }
        }
    };

    // Models.
    let device = options.device.unwrap_or_else(Device::cuda_if_available);
    let kind = match spec.model.dtype {
        Dtype::F32 => Kind::Float,
        Dtype::Bf16 if device.is_cuda() => Kind::BFloat16,
        Dtype::Bf16 => {
            return Err(WorkerError::Model {
                field: "model.dtype",
                message: "bf16 is for CUDA devices; this worker runs on the CPU (use f32)".into(),
            });
        }
    };
    let policy_source = match &checkpoint {
        Some(path) => path.join("model").to_string_lossy().into_owned(),
        None => spec.model.policy.clone(),
    };
    let mut policy = load_model(&policy_source, device, kind)
        .map_err(|error| WorkerError::Model { field: "model.policy", message: error.to_string() })?;
    // Only when this instance reads it: e.g. GRPO with kl_beta = 0 needs no reference pass.
    let reference = if optimizer_info.needs_reference && optimizer.uses_reference() {
        let source = if spec.model.reference == "same" { &spec.model.policy } else { &spec.model.reference };
        let mut reference = load_model(source, device, kind)
            .map_err(|error| WorkerError::Model { field: "model.reference", message: error.to_string() })?;
        reference.vs.freeze();
        if reference.tokenizer.vocab_size() != policy.tokenizer.vocab_size() {
            return Err(WorkerError::Model {
                field: "model.reference",
                message: format!(
                    "tokenizer mismatch: the reference has {} tokens, the policy {}",
                    reference.tokenizer.vocab_size(),
                    policy.tokenizer.vocab_size()
                ),
            });
        }
        Some(reference)
    } else {
        None
    };
    let reference_identity = reference.as_ref().map(|reference| {
        let source = if spec.model.reference == "same" { &spec.model.policy } else { &spec.model.reference };
        format!("{source} sha256:{}", weights_sha256(&reference.vs))
    });
    if let (Some(previous), Some(identity)) = (&previous, &reference_identity)
        && previous.reference.as_ref() != Some(identity)
    {
        return Err(state_error(format!(
            "the reference changed since the run started: was {:?}, now {identity}",
            previous.reference
        )));
    }
    let value_head = optimizer_info.needs_value_head.then(|| {
        let vs = nn::VarStore::new(device);
        // Zero-initialized: deterministic, and the first values predict nothing.
        let config = nn::LinearConfig {
            ws_init: nn::Init::Const(0.0),
            bs_init: Some(nn::Init::Const(0.0)),
            bias: true,
        };
        let head = nn::linear(vs.root() / "value_head", policy.model.hidden_size(), 1, config);
        (vs, head)
    });
    if let (Some(path), Some((vs, _))) = (&checkpoint, &value_head) {
        vs.read_safetensors(path.join("value_head.safetensors"))
            .map_err(|error| state_error(format!("value_head.safetensors: {error}")))?;
    }

    // The optimizer over every trainable tensor, in a fixed (name) order.
    let mut params: Vec<(String, Tensor)> = policy.vs.variables().into_iter().collect();
    if let Some((vs, _)) = &value_head {
        params.extend(vs.variables());
    }
    params.sort_by(|a, b| a.0.cmp(&b.0));
    let mut adamw = AdamW::new(params, AdamWConfig::from_spec(&spec.optimizer));
    let mut train_state = TrainState {
        step: 0,
        optimizer_updates: 0,
        sampler_rng: serde_json::Value::Null,
        cursor: Cursor::default(),
        curriculum: None,
        tokens_generated: 0,
        elapsed_s: 0.0,
        heldout_baseline: None,
        metrics_bytes: 0,
        rollouts_bytes: 0,
        plugins: Vec::new(),
    };
    let mut rng = SamplerRng::new(spec.job.seed);
    let mut curriculum = curriculum;
    if let (Some(path), Some(saved)) = (&checkpoint, &saved_state) {
        let tensors = Tensor::read_safetensors(path.join("optimizer.safetensors"))
            .map_err(|error| state_error(format!("optimizer.safetensors: {error}")))?;
        adamw
            .load_state(tensors.into_iter().collect::<HashMap<_, _>>(), saved.optimizer_updates)
            .map_err(|message| state_error(format!("optimizer.safetensors: {message}")))?;
        rng = serde_json::from_value(saved.sampler_rng.clone())
            .map_err(|error| state_error(format!("state.json sampler_rng: {error}")))?;
        if let (Some((_, curriculum)), Some(saved)) = (&mut curriculum, &saved.curriculum) {
            curriculum
                .load_state(saved.as_str().into())
                .into_result()
                .map_err(|error| state_error(format!("curriculum state: {error}")))?;
        }
        train_state = saved.clone();
    }
    policy.vs.unfreeze();

    check_lengths(&spec, &policy, &train, heldout.as_deref())?;

    // Nothing above wrote to the state dir; from here on the run exists.
    let plugin_ids: Vec<String> = std::iter::once(optimizer_plugin.id())
        .chain(verifier_plugins.iter().map(|p| p.id()))
        .chain(curriculum.as_ref().map(|(id, _)| id.clone()))
        .collect();
    if previous.is_none() {
        std::fs::create_dir_all(dir.checkpoints()).map_err(|error| state_error(io_msg(error)))?;
        dir.write_job(&JobRecord {
            spec_sha256,
            spec: spec.clone(),
            optimizer: optimizer_plugin.id(),
            verifiers: verifier_plugins.iter().map(|p| p.id()).collect(),
            curriculum: curriculum.as_ref().map(|(id, _)| id.clone()),
            reference: reference_identity,
            threads: options.threads,
        })
        .map_err(|error| state_error(format!("cannot write job.json: {error}")))?;
    }
    train_state.plugins = plugin_ids;
    let mut metrics_log = JsonlLog::open(&dir.metrics(), train_state.metrics_bytes)
        .map_err(|error| state_error(format!("metrics.jsonl: {error}")))?;
    let mut rollouts_log = JsonlLog::open(&dir.rollouts(), train_state.rollouts_bytes)
        .map_err(|error| state_error(format!("rollouts.jsonl: {error}")))?;

    let sampling = SamplingParams {
        max_new_tokens: spec.rollout.max_new_tokens as usize,
        temperature: spec.rollout.temperature,
        top_p: spec.rollout.top_p,
        top_k: spec.rollout.top_k as usize,
        stop: spec.rollout.stop.clone(),
    };
    let rewarder =
        Rewarder { verifiers, parallel: options.verify_parallel.max(1), deadline: reward::VERIFY_DEADLINE };
    let grants = match &options.grants {
        Some((socket, job)) => grants::Grants::connect(socket, job).map_err(WorkerError::Grants)?,
        None => grants::Grants::none(),
    };
    let mut job = Job {
        cursor: train_state.cursor,
        spec,
        device,
        policy,
        reference,
        value_head,
        optimizer,
        optimizer_info,
        rewarder,
        curriculum: curriculum.map(|(_, c)| c),
        train,
        heldout,
        adamw,
        rng,
        sampling,
        grants,
    };
    let cpu_matmul = match rlvr_model::onednn::status() {
        Ok(()) => "onednn".to_owned(),
        Err(reason) => format!("blas ({reason})"),
    };
    info!(
        policy = %job.spec.model.policy,
        device = ?device,
        cpu_matmul,
        plugins = ?train_state.plugins,
        from_step = train_state.step,
        "worker starting"
    );
    let mut outcome = drive(&mut job, &dir, &mut train_state, &mut metrics_log, &mut rollouts_log)?;
    outcome.plugins = plugin_hashes;
    outcome.data_sha256 = data_sha256(&job.spec)?;
    if !outcome.interrupted && (job.heldout.is_some() || canaries.is_some()) {
        let baseline = match &options.baseline {
            Some((path, version)) => eval::Baseline {
                kind: "published".into(),
                model: path.to_string_lossy().into_owned(),
                version: Some(*version),
            },
            None => {
                eval::Baseline { kind: "start".into(), model: job.spec.model.policy.clone(), version: None }
            }
        };
        let span = info_span!("gates", baseline = %baseline.model);
        let _entered = span.enter();
        let evaluation = eval::for_gates(&job, &baseline, canaries.as_deref(), outcome.training)
            .map_err(|message| WorkerError::Step { step: outcome.steps, message })?;
        info!(
            candidate = %evaluation["candidate"],
            baseline = %evaluation["baseline_scores"],
            "the gates' evaluation"
        );
        outcome.evaluation = Some(evaluation);
    }
    Ok(outcome)
}

/// How long a worker waits for the previous holder of its run lock to exit: the worker of a
/// daemon that was killed dies within a second (PR_SET_PDEATHSIG, the parent watch).
const RUN_LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(30);

/// Prefix of the temp directory holding a worker's content-addressed plugin copies, followed by
/// the worker's pid and `-`.
const PLUGIN_COPIES_PREFIX: &str = "rlvrd-worker-plugins-";

/// Removes plugin-copy directories left in `temp` by workers that no longer run.
///
/// A worker removes its own when it returns, but one killed (SIGKILL, OOM, a cancelled job)
/// cannot, and each holds a copy of every plugin it loaded (about 150 MB for four plugins): a
/// machine that kills workers as a matter of course would fill its temp dir. A directory is
/// stale when the pid in its name has no `/proc` entry; names without a pid are left alone.
fn sweep_stale_plugin_copies(temp: &Path) {
    let Ok(entries) = std::fs::read_dir(temp) else { return };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_prefix(PLUGIN_COPIES_PREFIX))
            .and_then(|rest| rest.split_once('-'))
            .and_then(|(pid, _)| pid.parse::<u32>().ok())
        else {
            continue;
        };
        if !Path::new("/proc").join(pid.to_string()).exists() {
            match std::fs::remove_dir_all(entry.path()) {
                Ok(()) => {
                    info!(path = %entry.path().display(), pid, "removed the plugin copies of a worker that is gone")
                }
                Err(error) => {
                    warn!(path = %entry.path().display(), %error, "cannot remove a stale plugin-copy directory")
                }
            }
        }
    }
}

/// Makes glibc's allocator keep memory that libtorch frees, for the process's lifetime.
///
/// A training step allocates and frees the same large tensors every time (activations, logits
/// of 50k-token vocabularies, gradients). By default glibc serves blocks above its mmap
/// threshold (at most 32 MiB) with fresh `mmap`s and trims the heap on free, so each step pays
/// the kernel for zeroed pages again: on the SmolLM2 benchmark job (one thread) 3.6 million
/// page faults in 5 steps and 16% of the run in the kernel. Served from a heap that is never
/// trimmed, 4 steps took 1.2 million (most of them loading the two models) and the update phase
/// went from 10.3 s to 8.6 s a step; the peak resident size stayed within 1%. A worker is one
/// job's process, so what it keeps is returned when the job ends.
fn keep_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only changes allocator parameters; called before the models are loaded.
    unsafe {
        libc::mallopt(libc::M_MMAP_MAX, 0);
        libc::mallopt(libc::M_TRIM_THRESHOLD, -1);
    }
}

/// The step loop, held-out evaluations and checkpoints.
fn drive(
    job: &mut Job,
    dir: &StateDir,
    state: &mut TrainState,
    metrics_log: &mut JsonlLog,
    rollouts_log: &mut JsonlLog,
) -> Result<Outcome, WorkerError> {
    let started = Instant::now();
    let elapsed_before = state.elapsed_s;
    let max_steps = job.spec.budget.max_steps;
    let state_error = |message: String| WorkerError::State { path: dir.root.clone(), message };
    let mut heldout_after = None;
    // A resumed run's history is its log up to the checkpoint: the conditions judge as they would
    // have in one run.
    let mut stop_watch = stop::StopWatch::new(&job.spec.stop);
    for line in std::fs::read_to_string(dir.metrics()).unwrap_or_default().lines() {
        if let Ok(value) = serde_json::from_str::<serde_json::Value>(line) {
            stop_watch.observe(&value);
        }
    }
    if state.step == 0 && job.heldout.is_some() {
        let score = eval::heldout(job).map_err(|message| WorkerError::Step { step: 0, message })?;
        info!(accuracy = score.accuracy, reward = score.reward_mean, "held-out before training");
        state.heldout_baseline = Some(score.accuracy);
        let line = json!({"step": 0, "heldout": score.to_json()});
        stop_watch.observe(&line);
        metrics_log.append(&line).map_err(|error| state_error(format!("metrics.jsonl: {error}")))?;
    }
    let mut stopped = None;
    let mut last_checkpoint = dir.latest().ok().flatten();
    // For the ETA: steps and time of this process's loop (not of held-out scoring or of a run
    // before a resume).
    let (first_step, loop_started) = (state.step, Instant::now());
    // The last step whose weights were scored on the held-out set in this process.
    let mut scored_step = None;
    let mut interrupted = false;
    while state.step < max_steps {
        if lifecycle::stop_requested() {
            interrupted = true;
            stopped = Some("stopped on request (SIGTERM) at a step boundary".to_owned());
            break;
        }
        if let Some(limit) = job.spec.budget.max_generated_tokens
            && state.tokens_generated >= limit
        {
            stopped = Some(format!("budget.max_generated_tokens: {} ≥ {limit}", state.tokens_generated));
            break;
        }
        if let Some(minutes) = job.spec.budget.max_wall_minutes
            && elapsed_before + started.elapsed().as_secs_f64() >= minutes * 60.0
        {
            stopped = Some(format!("budget.max_wall_minutes: {minutes} reached"));
            break;
        }
        let step = state.step + 1;
        let span = info_span!("step", step);
        let _entered = span.enter();
        // The step's first device phase; a stop asked for while waiting for it leaves here.
        let Some(grant) = job.grants.hold_at_boundary(step::first_phase(job)).map_err(WorkerError::Grants)?
        else {
            interrupted = true;
            stopped = Some("stopped on request (SIGTERM) at a step boundary".to_owned());
            break;
        };
        let output = step::run_step(job, step, state.step, grant)
            .map_err(|message| WorkerError::Step { step, message })?;
        state.step = step;
        state.tokens_generated += output.tokens_generated;
        let mut line = output.metrics;
        let eval_every = job.spec.eval.every_steps;
        let last = step == max_steps;
        if job.heldout.is_some() && (last || (eval_every > 0 && step % eval_every == 0)) {
            let score = eval::heldout(job).map_err(|message| WorkerError::Step { step, message })?;
            heldout_after = Some(score.accuracy);
            scored_step = Some(step);
            line["heldout"] = score.to_json();
        }
        if let Some(tripped) = stop_watch.check(step, &line) {
            // The line that tripped stays in the log for the report; this step's weights are not
            // checkpointed.
            metrics_log.append(&line).map_err(|error| state_error(format!("metrics.jsonl: {error}")))?;
            let kept = last_checkpoint.as_deref().and_then(StateDir::checkpoint_step);
            let kept = kept.map_or_else(|| "none yet".to_owned(), |at| format!("step {at}"));
            warn!(condition = tripped.condition, "stopped: {}", tripped.message);
            return Err(WorkerError::Stopped(format!(
                "{}; the last good checkpoint is {kept}",
                tripped.message
            )));
        }
        metrics_log.append(&line).map_err(|error| state_error(format!("metrics.jsonl: {error}")))?;
        for record in &output.records {
            rollouts_log.append(record).map_err(|error| state_error(format!("rollouts.jsonl: {error}")))?;
        }
        let per_step = loop_started.elapsed().as_secs_f64() / (step - first_step) as f64;
        let mut eta_s = per_step * (max_steps - step) as f64;
        if let Some(minutes) = job.spec.budget.max_wall_minutes {
            let left = minutes * 60.0 - (elapsed_before + started.elapsed().as_secs_f64());
            eta_s = eta_s.min(left.max(0.0));
        }
        step::log_progress(&line, step, max_steps, eta_s);
        if last || step % job.spec.checkpoint.every_steps == 0 {
            state.elapsed_s = elapsed_before + started.elapsed().as_secs_f64();
            last_checkpoint = Some(checkpoint(job, dir, state, metrics_log, rollouts_log)?);
        }
    }
    if interrupted {
        // Only a checkpoint: scoring or logging anything here would make the resumed run's logs
        // differ from an uninterrupted one's.
        let at = last_checkpoint.as_ref().and_then(|path| StateDir::checkpoint_step(path));
        if state.step > 0 && at != Some(state.step) {
            state.elapsed_s = elapsed_before + started.elapsed().as_secs_f64();
            last_checkpoint = Some(checkpoint(job, dir, state, metrics_log, rollouts_log)?);
        }
    } else if stopped.is_some() && state.step > 0 {
        // A budget ends the job between evaluations: score the weights it ends with, as the
        // last step does, so every job reports where it got to. Not when this process ran no
        // step (a resume of a job already stopped): that process scored them.
        if job.heldout.is_some() && state.step > first_step && scored_step != Some(state.step) {
            let score =
                eval::heldout(job).map_err(|message| WorkerError::Step { step: state.step, message })?;
            heldout_after = Some(score.accuracy);
            info!(accuracy = score.accuracy, step = state.step, "held-out at the stop");
            metrics_log
                .append(&json!({"step": state.step, "heldout": score.to_json()}))
                .map_err(|error| state_error(format!("metrics.jsonl: {error}")))?;
        }
        state.elapsed_s = elapsed_before + started.elapsed().as_secs_f64();
        last_checkpoint = Some(checkpoint(job, dir, state, metrics_log, rollouts_log)?);
    }
    if let Some(reason) = &stopped {
        warn!(%reason, step = state.step, "stopped before max_steps");
    }
    Ok(Outcome {
        steps: state.step,
        weights_sha256: weights_sha256(&job.policy.vs),
        heldout_before: state.heldout_baseline,
        heldout_after,
        checkpoint: last_checkpoint.unwrap_or_default(),
        stopped,
        interrupted,
        training: stop_watch.trend(),
        evaluation: None,
        plugins: Vec::new(),
        data_sha256: BTreeMap::new(),
    })
}

/// The curriculum plugin's keys, with `history` from the pinned version of the shared curriculum
/// when the job names one and the daemon pinned a version.
fn pinned_curriculum_config(
    section: &rlvr_protocol::spec::CurriculumSection,
    pinned: Option<&(PathBuf, u64)>,
) -> Result<String, WorkerError> {
    let (Some(name), Some((dir, version))) = (&section.name, pinned) else {
        return Ok(section.plugin_config());
    };
    let version = rlvr_protocol::curricula::load(dir, name, *version).map_err(|error| {
        WorkerError::Plugin { field: "curriculum.name".into(), message: error.to_string() }
    })?;
    let mut options = section.options.clone();
    options.insert("history".into(), version.history());
    info!(curriculum = %name, version = version.version, prompts = version.prompts.len(), "curriculum pinned");
    Ok(serde_json::Value::Object(options).to_string())
}

/// SHA-256 of each of the job's data files, for the published manifest.
fn data_sha256(spec: &JobSpec) -> Result<BTreeMap<String, String>, WorkerError> {
    let files = [
        ("train", Some(&spec.data.train)),
        ("heldout", spec.data.heldout.as_ref()),
        ("canaries", spec.data.canaries.as_ref()),
    ];
    let mut hashes = BTreeMap::new();
    for (name, path) in files {
        let Some(path) = path else { continue };
        let mut file = std::fs::File::open(path).map_err(|error| WorkerError::Spec {
            path: path.clone(),
            message: format!("data.{name}: cannot read: {error}"),
        })?;
        let mut hasher = Sha256::new();
        std::io::copy(&mut file, &mut hasher).map_err(|error| WorkerError::Spec {
            path: path.clone(),
            message: format!("data.{name}: cannot read: {error}"),
        })?;
        hashes.insert(name.to_owned(), hex::encode(hasher.finalize()));
    }
    Ok(hashes)
}

/// Writes a checkpoint of the current state; returns its directory.
fn checkpoint(
    job: &mut Job,
    dir: &StateDir,
    state: &mut TrainState,
    metrics_log: &mut JsonlLog,
    rollouts_log: &mut JsonlLog,
) -> Result<PathBuf, WorkerError> {
    let fail = |message: String| WorkerError::State {
        path: dir.root.clone(),
        message: format!("checkpoint: {message}"),
    };
    let staging = dir.staging(state.step).map_err(|error| fail(io_msg(error)))?;
    save_pretrained(&job.policy, &staging.join("model")).map_err(|error| fail(error.to_string()))?;
    if let Some((vs, _)) = &job.value_head {
        vs.save_safetensors_sorted(&staging.join("value_head.safetensors")).map_err(fail)?;
    }
    let moments = job.adamw.state_tensors();
    Tensor::write_safetensors(&moments, staging.join("optimizer.safetensors"))
        .map_err(|error| fail(error.to_string()))?;
    state.optimizer_updates = job.adamw.steps();
    state.sampler_rng = serde_json::to_value(&job.rng).map_err(|error| fail(error.to_string()))?;
    state.cursor = job.cursor;
    state.curriculum = match &job.curriculum {
        Some(curriculum) => Some(
            curriculum
                .save_state()
                .into_result()
                .map_err(|error| fail(format!("curriculum: {error}")))?
                .into(),
        ),
        None => None,
    };
    state.metrics_bytes = metrics_log.synced_len().map_err(|error| fail(io_msg(error)))?;
    state.rollouts_bytes = rollouts_log.synced_len().map_err(|error| fail(io_msg(error)))?;
    let bytes = serde_json::to_vec_pretty(&state).map_err(|error| fail(error.to_string()))?;
    std::fs::write(staging.join("state.json"), bytes).map_err(|error| fail(io_msg(error)))?;
    let path = dir.commit_checkpoint(&staging, state.step).map_err(|error| fail(io_msg(error)))?;
    info!(step = state.step, path = %path.display(), "checkpoint written");
    Ok(path)
}

/// Refuses a job whose optimizer does not fit its other parts (at start): the first of
/// [`fit_problems`].
pub fn check_fit(spec: &JobSpec, info: &OptimizerInfo, optimizer_id: String) -> Result<(), WorkerError> {
    match fit_problems(spec, info, &optimizer_id).into_iter().next() {
        Some((field, message)) => Err(WorkerError::Plugin { field, message }),
        None => Ok(()),
    }
}

/// Refuses data whose prompt (and completion, offline) would run past the model's positions, naming
/// the first record that does: found at start, not at the step that draws it.
fn check_lengths(
    spec: &JobSpec,
    policy: &LoadedModel,
    train: &TrainData,
    heldout: Option<&[PromptRecord]>,
) -> Result<(), WorkerError> {
    let Some(limit) = policy.config.max_position_embeddings else { return Ok(()) };
    let tokenizer = &policy.tokenizer;
    let budget = i64::from(spec.rollout.max_new_tokens);
    let prompt_len = |text: &str| -> Result<i64, String> {
        let rendered = tokenizer.render_prompt(text).map_err(|e| e.to_string())?;
        Ok(tokenizer.encode(&rendered).map_err(|e| e.to_string())?.len() as i64)
    };
    let text_len = |text: &str| -> Result<i64, String> {
        // The completion, and the end-of-sequence token the trainer appends.
        Ok(tokenizer.encode(text).map_err(|e| e.to_string())?.len() as i64 + 1)
    };
    let mut records: Vec<(&'static str, &str, Result<i64, String>)> = Vec::new();
    match train {
        TrainData::Prompts(prompts) => {
            records.extend(
                prompts
                    .iter()
                    .map(|p| ("data.train", p.id.as_str(), prompt_len(&p.prompt).map(|n| n + budget))),
            );
        }
        TrainData::Sft(items) => records.extend(items.iter().map(|r| {
            (
                "data.train",
                r.id.as_str(),
                prompt_len(&r.prompt).and_then(|p| Ok(p + text_len(&r.completion)?)),
            )
        })),
        TrainData::Pairs(items) => records.extend(items.iter().map(|r| {
            let longest = |p: i64| Ok(p + text_len(&r.chosen)?.max(text_len(&r.rejected)?));
            ("data.train", r.id.as_str(), prompt_len(&r.prompt).and_then(longest))
        })),
    }
    for record in heldout.unwrap_or_default() {
        records.push(("data.heldout", record.id.as_str(), prompt_len(&record.prompt).map(|n| n + budget)));
    }
    for (field, id, length) in records {
        match length {
            Ok(length) if length <= limit => {}
            Ok(length) => {
                return Err(WorkerError::Model {
                    field,
                    message: format!(
                        "record {id:?} needs {length} positions (prompt, completion or rollout.max_new_tokens), \
                         more than the model's max_position_embeddings ({limit})"
                    ),
                });
            }
            Err(message) => {
                return Err(WorkerError::Model { field, message: format!("record {id:?}: {message}") });
            }
        }
    }
    Ok(())
}

/// SHA-256 over a VarStore's tensors: names sorted, each name then its raw bytes.
pub fn weights_sha256(vs: &nn::VarStore) -> String {
    let mut named: Vec<(String, Tensor)> = vs.variables().into_iter().collect();
    named.sort_by(|a, b| a.0.cmp(&b.0));
    let mut hasher = Sha256::new();
    for (name, tensor) in named {
        hasher.update(name.as_bytes());
        let tensor = tensor.to_device(Device::Cpu).contiguous();
        let mut buffer = vec![0u8; tensor.numel() * tensor.kind().elt_size_in_bytes()];
        tensor.copy_data_u8(&mut buffer, tensor.numel());
        hasher.update(&buffer);
    }
    hex::encode(hasher.finalize())
}

fn io_msg(error: std::io::Error) -> String {
    error.to_string()
}

/// Writes a VarStore's tensors (names sorted) to a safetensors file.
trait SaveSorted {
    fn save_safetensors_sorted(&self, path: &Path) -> Result<(), String>;
}

impl SaveSorted for nn::VarStore {
    fn save_safetensors_sorted(&self, path: &Path) -> Result<(), String> {
        let mut named: Vec<(String, Tensor)> = self.variables().into_iter().collect();
        named.sort_by(|a, b| a.0.cmp(&b.0));
        Tensor::write_safetensors(&named, path).map_err(|error| error.to_string())
    }
}
