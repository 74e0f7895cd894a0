//! `rlvr-worker run`: runs one job end to end — rollout, verification, update, checkpoint — in its
//! own process (design.md §2); `rlvrd serve` starts one for each admitted job.
//!
//! Everything that can be checked is checked before the first byte is written to the state
//! directory: the spec, the plugins (and whether they fit each other and the data), the data
//! files, the model. A run that cannot start leaves nothing behind.
//!
//! [`run`] is the outline; each part has its module (**pure**: no IO, no clock):
//! - [`start`]: the spec and what an earlier run left (resume checks).
//! - [`plugins`]: the job's plugins (its libraries), pinned on resume, checked against the spec.
//! - [`data`]: the data files and their record order. [`models`]: the models (policy, reference,
//!   value head) on the job's device.
//! - [`state`]: the run's record (`job.json`), checkpoints and the JSONL logs, written atomically.
//! - [`drive`]: the step loop — budgets, held-out evaluations, `[stop]` ([`stop`], **pure**),
//!   progress.
//! - [`step`]: one training step, online (rollout → verify → advantages → μ updates) or offline;
//!   [`optim`] AdamW and the schedule: its state, master weights and resume (the update is
//!   libtorch's fused kernel); [`micro_batches`] (**pure**) the split of a step's rows. The
//!   reward itself is `rlvr_plugin_host::reward`'s, the built-in `reward-model` graders'
//!   [`reward_models`].
//! - [`sampling`], [`distill`]: the built-in `rejection-sampling` and `distill` optimizers.
//! - [`runtime`]: what libtorch can do in this process.
//! - [`engine`]: an `[engine]` job's steps on an existing distributed engine (TRL).
//! - [`vllm`]: `[rollout] engine = "vllm"`: the rollouts on a vLLM server, synced every step (the
//!   server, its sampling and its sync).
//! - [`episodes`]: `[env]`: a round of episodes against the job's environment (`play`: one
//!   session each, kept between rounds, turns batched, steps at once, with `rlvr-env` and
//!   `rlvr_model::episode`), the rows and rewards a step trains on; [`step`] trains on them with
//!   the replies masked out, [`eval`] plays the held-out set through them.
//! - [`sidecar`]: an installed environment, sandboxed. [`env_check`]: `rlvr-worker env-check`.
//! - [`eval`]: held-out scoring and the gates' evaluation, greedy.
//! - [`reward_training`]: an optimizer that trains a reward model (`rm`, `trains = reward-model`):
//!   its step on preference pairs, held-out pairwise accuracy, the gates' evaluation against the
//!   start's fresh head or the line's published reward model.
//! - [`tinker`]: a Tinker training client — `loss` the Tinker losses as sums, `client` the base
//!   model with its LoRA adapter and AdamW, `serve` `rlvr-worker tinker-client`'s command loop.
//! - [`grants`]: the daemon's device grants, asked for before each device phase.
//! - [`memory`]: the memory cap (`--memory-cap`), the run's peak, out-of-memory reports.
//! - [`lifecycle`]: stop requests (signals), dying with the daemon (parent death), the run's lock.
//! - [`host`]: the plugins' host context, read from stdin (`--host-context-stdin`).
//!
//! Beside them, `main.rs` adds `probe-plugin`, `check-options` and `doctor`; `build.rs` keeps
//! libtorch's CUDA half linked and records its run path.

pub mod data;
pub mod distill;
pub mod drive;
pub mod engine;
pub mod env_check;
pub mod episodes;
pub mod eval;
pub mod grants;
pub mod host;
pub mod lifecycle;
pub mod memory;
pub mod micro_batches;
pub mod models;
pub mod optim;
pub mod plugins;
pub mod reward_models;
pub mod reward_training;
pub mod runtime;
pub mod sampling;
pub mod sidecar;
pub mod start;
pub mod state;
pub mod step;
pub mod stop;
pub mod tinker;
pub mod vllm;

use std::collections::BTreeMap;
use std::path::PathBuf;

use rlvr_model::{LoadedModel, SamplerRng, SamplingParams};
use rlvr_plugin_api::{CurriculumBox, DataMode, HostContext, OptimizerBox, OptimizerInfo, TrainedModel};
use rlvr_plugin_host::reward::{Reward, VERIFY_DEADLINE};
use rlvr_protocol::builtin::{
    DistillOptions, RejectionSamplingOptions, distill_problems, rejection_sampling_problems,
};
use rlvr_protocol::jobdir::RunDir;
use rlvr_protocol::kind::{JobKind, OptimizerTraits};
use rlvr_protocol::spec::JobSpec;
pub use rlvr_protocol::worker::Outcome;
use rlvr_protocol::worker::{Baseline, BaselineKind, WorkerArgs, WorkerExit};
use sha2::{Digest, Sha256};
use tch::Device;
use tracing::{info, info_span, warn};

use self::data::Cursor;
use self::models::{Models, ValueHead};
use self::optim::{AdamW, AdamWConfig};
use self::plugins::JobPlugins;
pub use self::plugins::PluginSource;
use self::start::Start;
use self::state::{JobRecord, Logs, TrainState};
use rlvr_protocol::records::{self, PairRecord, PromptRecord, RecordKind, SftRecord};

/// How to run.
#[derive(Debug, Clone)]
pub struct WorkerOptions {
    pub spec: PathBuf,
    pub state_dir: PathBuf,
    /// Continue from the newest checkpoint in `state_dir` (a fresh start when there is none).
    pub resume: bool,
    /// Where the job's plugin libraries are: the files the daemon named, or directories.
    pub plugins: PluginSource,
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
    /// What every plugin is created with: the job's secrets and the outbound policy. The
    /// daemon's line on stdin (`--host-context-stdin`); a run by hand gets
    /// [`HostContext::unrestricted`] (no secrets, no outbound restriction).
    pub host: HostContext,
    /// The memory the job may use on its device, in bytes (`--memory-cap`); `None`: no cap.
    pub memory_cap: Option<u64>,
    /// An `[engine]` job's engine python and the daemon's verify route.
    pub engine_python: Option<PathBuf>,
    /// A `[rollout] engine = "vllm"` job's vLLM python.
    pub vllm_python: Option<PathBuf>,
    /// An `[env] environment = "NAME"` job's installed script and the python that runs it.
    pub env_sidecar: Option<(PathBuf, PathBuf)>,
    pub verify_url: Option<String>,
    /// A `launcher = "ray"` job's Ray Jobs API.
    pub ray_address: Option<String>,
    /// A job on more than one node: the python with Ray on the cluster, running its launcher.
    pub ray_python: Option<PathBuf>,
    /// This run's job id (the daemon's), naming its Ray submissions.
    pub job_id: Option<String>,
    /// The kind the daemon decided at submit.
    pub kind: Option<JobKind>,
}

impl WorkerOptions {
    /// The options of `rlvr-worker run`: plugin directories resolved, the device parsed, cores as
    /// the defaults; `host` is the context read from stdin, or `None` for a run by hand.
    pub fn from_args(args: WorkerArgs, host: Option<HostContext>) -> Result<Self, WorkerError> {
        // The daemon names the job's libraries; a run by hand scans directories.
        let plugins = if args.plugin_files.is_empty() {
            PluginSource::Dirs(
                rlvr_plugin_host::dirs::plugin_dirs(args.config.as_deref(), args.plugin_dirs).map_err(
                    |error| WorkerError::Plugin { field: "plugins.dirs".into(), message: error.to_string() },
                )?,
            )
        } else {
            PluginSource::Files(args.plugin_files)
        };
        let device = args.device.as_deref().map(parse_device).transpose()?;
        let cores = std::thread::available_parallelism().map_or(1, std::num::NonZero::get);
        Ok(WorkerOptions {
            spec: args.spec,
            state_dir: args.state_dir,
            resume: args.resume,
            plugins,
            device,
            verify_parallel: args.verify_parallel.unwrap_or(cores),
            threads: args.threads.unwrap_or(cores).max(1),
            grants: args.grant_socket.zip(args.job_id.clone()),
            baseline: args.baseline.zip(args.baseline_version),
            curriculum_version: args.curricula_dir.zip(args.curriculum_version),
            host: host.unwrap_or_else(HostContext::unrestricted),
            memory_cap: args.memory_cap,
            engine_python: args.engine_python,
            vllm_python: args.vllm_python,
            env_sidecar: args.env_script.zip(args.env_python),
            verify_url: args.verify_url,
            ray_address: args.ray_address,
            ray_python: args.ray_python,
            job_id: args.job_id.clone(),
            kind: args.kind,
        })
    }
}

/// `cpu`, `cuda` or `cuda:N`.
pub(crate) fn parse_device(text: &str) -> Result<Device, WorkerError> {
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

/// Why a run could not start or go on. Each names the field or file at fault.
#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    #[error("{path}: {message}")]
    Spec { path: PathBuf, message: String },
    #[error("{field}: {message}")]
    Plugin { field: String, message: String },
    #[error(transparent)]
    Data(#[from] records::DataError),
    #[error("{field}: {message}")]
    Model { field: &'static str, message: String },
    #[error("state dir {path}: {message}")]
    State { path: PathBuf, message: String },
    #[error("step {step}: {message}")]
    Step { step: u64, message: String },
    /// The daemon's grant socket failed: not the job's fault (the worker exits 70 and the
    /// daemon requeues the job).
    #[error(transparent)]
    Grants(#[from] grants::GrantError),
    /// A `[stop]` condition tripped: what, the measured value, the step, the checkpoint kept.
    #[error("{0}")]
    Stopped(String),
    /// `--host-context-stdin` and no readable context on stdin: the daemon's side failed, not
    /// the job (the worker exits 70 and the daemon requeues the job).
    #[error("--host-context-stdin: {0}")]
    HostContext(String),
    /// The device the run was given cannot be used here (CUDA missing, no driver, no such
    /// device): the host's fault, not the job's (the worker exits 70). The daemon refuses to
    /// start when its GPUs are out of its worker's reach, so this is a host that changed.
    #[error("--device: {0}")]
    Device(String),
    /// The memory watchdog could not start: the host's fault (the worker exits 70).
    #[error("--memory-cap: {0}")]
    MemoryWatch(String),
    /// An `[engine]` job's engine failed: its own fault or the job's (exit 2), or transient
    /// (exit 70: it could not reach the daemon).
    #[error("{message}")]
    Engine { transient: bool, message: String },
    /// The job's environment (`[env]`) could not be reached or went silent: exit 70, the daemon
    /// requeues the job (an environment server restarting is not the job's fault; one that stays
    /// away ends it at the daemon's crash limit).
    #[error("env.url: {0}")]
    Environment(String),
}

impl WorkerError {
    /// How the process ends on this error: a failed grant is not the job's fault (the daemon
    /// requeues it); everything else is.
    pub fn exit(&self) -> WorkerExit {
        match self {
            WorkerError::Grants(_)
            | WorkerError::HostContext(_)
            | WorkerError::Device(_)
            | WorkerError::MemoryWatch(_)
            | WorkerError::Engine { transient: true, .. }
            | WorkerError::Environment(_) => WorkerExit::Transient,
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

/// The job's data files.
pub struct JobData {
    /// `data.train`, as the optimizer's data mode reads it.
    pub train: TrainData,
    /// `data.heldout`.
    pub heldout: Option<Vec<PromptRecord>>,
    /// `data.heldout` of a reward model's job: preference pairs, scored by pairwise accuracy.
    pub heldout_pairs: Option<Vec<PairRecord>>,
    /// `data.canaries`.
    pub canaries: Option<Vec<PromptRecord>>,
}

impl JobData {
    /// Reads the spec's data files; every record error names the file, the line and the field.
    pub fn load(spec: &JobSpec, mode: DataMode, trains: TrainedModel) -> Result<JobData, WorkerError> {
        // The kinds the daemon checked at submit (`rlvr_protocol::records::RecordKind`).
        let train = match RecordKind::of_train(mode) {
            RecordKind::Prompts => TrainData::Prompts(records::load_prompts("data.train", &spec.data.train)?),
            RecordKind::Demonstrations => TrainData::Sft(records::load_sft("data.train", &spec.data.train)?),
            RecordKind::Pairs => TrainData::Pairs(records::load_pairs("data.train", &spec.data.train)?),
        };
        let prompts = |field, path: &Option<PathBuf>| {
            path.as_ref().map(|path| records::load_prompts(field, path)).transpose()
        };
        let (heldout, heldout_pairs) = match RecordKind::of_heldout(trains) {
            RecordKind::Pairs => {
                let pairs = spec.data.heldout.as_ref().map(|path| records::load_pairs("data.heldout", path));
                (None, pairs.transpose()?)
            }
            _ => (prompts("data.heldout", &spec.data.heldout)?, None),
        };
        Ok(JobData {
            train,
            heldout,
            heldout_pairs,
            canaries: prompts("data.canaries", &spec.data.canaries)?,
        })
    }
}

/// Everything a step needs.
pub struct Job {
    pub spec: JobSpec,
    pub device: Device,
    pub policy: LoadedModel,
    pub reference: Option<models::Reference>,
    pub value_head: Option<ValueHead>,
    pub optimizer: OptimizerBox,
    pub optimizer_info: OptimizerInfo,
    /// The plugin graders and the combiner of every grader's verdicts.
    pub rewarder: Reward,
    /// The `reward-model` graders, scored on the devices (`reward_models::score`).
    pub reward_models: reward_models::RewardModels,
    pub curriculum: Option<CurriculumBox>,
    pub train: TrainData,
    pub heldout: Option<Vec<PromptRecord>>,
    pub adamw: AdamW,
    pub rng: SamplerRng,
    pub cursor: Cursor,
    pub sampling: SamplingParams,
    /// What samples the completions.
    pub rollouts: Rollouts,
    /// One step off policy: the next step's round, sampled while this step updated.
    pub next_round: Option<step::NextRound>,
    pub grants: grants::Grants,
    /// Where the plugins' code comes from, kept for the run.
    pub libraries: plugins::Libraries,
    /// What its kind does, with what only that kind has.
    pub work: Work,
}

/// What samples an online job's completions (`rollout.engine`).
pub enum Rollouts {
    /// `rlvr_model::generate` on the policy itself.
    Native,
    /// The job's vLLM server, synced after every update.
    Vllm(Box<vllm::VllmServer>),
    /// Episodes against the job's environment (`[env]`), each turn sampled by `generate`.
    Env(Box<episodes::Environment>),
}

/// What a job does beyond what every job has, by its kind (`rlvr_protocol::kind::JobKind`,
/// decided once at start): a kind's own parts live in its variant, so a job is one kind, never
/// a kind without its parts.
pub enum Work {
    /// The optimizer plugin trains the policy: online (sampled and graded, in groups or with a
    /// critic) or offline (demonstrations or pairs), as its data mode says.
    Policy,
    /// The optimizer plugin trains a reward model on pairs; `policy` only lends it its tokenizer
    /// and config.
    RewardModel {
        model: rlvr_model::RewardModel,
        /// The held-out pairs, scored by pairwise accuracy.
        heldout_pairs: Option<Vec<PairRecord>>,
    },
    /// The built-in rejection sampling: its output and tally; no weight changes.
    RejectionSampling(sampling::Rejection),
    /// The built-in distillation: its keys and its teacher (frozen, on the policy's device).
    Distill { options: DistillOptions, teacher: LoadedModel },
    /// An `[engine]` job: how to start its engine, which trains instead of the step loop.
    Engine(engine::EngineSettings),
}

impl Job {
    /// Whether the job has a held-out set to score: prompts, or a reward model's pairs.
    pub fn has_heldout(&self) -> bool {
        match &self.work {
            Work::RewardModel { heldout_pairs, .. } => heldout_pairs.is_some(),
            _ => self.heldout.is_some(),
        }
    }

    /// Whether an engine's ranks complete the held-out prompts and canaries
    /// (`engine.heldout = "engine"`), the worker scoring what they wrote.
    pub fn engine_scores_heldout(&self) -> bool {
        matches!(self.work, Work::Engine(_))
            && self.spec.engine.heldout == rlvr_protocol::engine::HeldoutBy::Engine
    }

    /// SHA-256 over the trained model's tensors (names sorted, raw bytes).
    pub fn weights_sha256(&self) -> String {
        match &self.work {
            Work::RewardModel { model, .. } => models::weights_sha256(&model.vs),
            _ => models::model_sha256(&self.policy),
        }
    }

    /// A rejection-sampling job's output and tally.
    pub fn rejection(&self) -> Option<&sampling::Rejection> {
        match &self.work {
            Work::RejectionSampling(rejection) => Some(rejection),
            _ => None,
        }
    }
}

/// How a job's rollouts sample: its `[rollout]` keys.
pub(crate) fn sampling_params(rollout: &rlvr_protocol::spec::RolloutSection) -> SamplingParams {
    SamplingParams {
        max_new_tokens: rollout.max_new_tokens as usize,
        temperature: rollout.temperature,
        top_p: rollout.top_p,
        top_k: rollout.top_k as usize,
        stop: rollout.stop.clone(),
        ignore_eos: rollout.ignore_eos,
    }
}

/// Runs the job of `options.spec` until its budget ends; see the module docs.
pub fn run(options: &WorkerOptions) -> Result<Outcome, WorkerError> {
    let device = options.device.unwrap_or_else(Device::cuda_if_available);
    // First: loading the plugins, the data and the models counts against the cap too.
    memory::watch(device, options.memory_cap).map_err(|error| WorkerError::MemoryWatch(error.to_string()))?;
    // Held until the process ends: no second worker runs this directory meanwhile.
    let _lock = lifecycle::lock_run(&options.state_dir, RUN_LOCK_WAIT).map_err(|error| {
        WorkerError::State { path: options.state_dir.clone(), message: error.to_string() }
    })?;
    let run_dir = RunDir::at(options.state_dir.clone());
    let start = Start::read(options, &run_dir)?;
    // Before anything is written: an engine job without its engine leaves nothing behind.
    let engine = engine_settings(options, &start.spec)?;
    let vllm_python = vllm_python(options, &start.spec)?;
    tch::set_num_threads(options.threads as i32);
    keep_freed_memory();
    let span = info_span!("job", name = %start.spec.job.name, team = %start.spec.job.team);
    let _entered = span.enter();

    let mut plugins =
        JobPlugins::load(&start.spec, start.previous.as_ref(), &options.plugins, &options.host)?;
    let data = JobData::load(&start.spec, plugins.optimizer_info.data_mode, plugins.trains)?;
    let traits = OptimizerTraits { data_mode: plugins.optimizer_info.data_mode, trains: plugins.trains };
    let kind = JobKind::of(&start.spec, Some(traits)).ok_or_else(|| WorkerError::Plugin {
        field: "optimizer.plugin".into(),
        message: format!("{} says nothing this worker can run", plugins.optimizer_id),
    })?;
    if vllm_python.is_some() && !matches!(kind, JobKind::OnlineGroups | JobKind::OnlineWithCritic) {
        return Err(WorkerError::Model {
            field: "rollout.engine",
            message: format!(
                "\"vllm\" samples the rollouts of online jobs (GRPO, RLOO, PPO); {} makes this job {kind}",
                plugins.optimizer_id
            ),
        });
    }
    if let Some(submitted) = options.kind
        && submitted != kind
    {
        return Err(WorkerError::Plugin {
            field: "optimizer.plugin".into(),
            message: format!(
                "the job was submitted as {submitted}, but {} makes it {kind} now",
                plugins.optimizer_id
            ),
        });
    }
    let rejection = match kind {
        JobKind::RejectionSampling => {
            let spec_problem = |error: rlvr_protocol::spec::SpecError| WorkerError::Plugin {
                field: error.field,
                message: error.message,
            };
            if let Some(problem) = rejection_sampling_problems(&start.spec).into_iter().next() {
                return Err(spec_problem(problem));
            }
            Some(RejectionSamplingOptions::from_spec(&start.spec).map_err(spec_problem)?)
        }
        _ => None,
    };
    let distill = match kind {
        JobKind::Distill => {
            let spec_problem = |error: rlvr_protocol::spec::SpecError| WorkerError::Plugin {
                field: error.field,
                message: error.message,
            };
            if let Some(problem) = distill_problems(&start.spec).into_iter().next() {
                return Err(spec_problem(problem));
            }
            Some(DistillOptions::from_spec(&start.spec).map_err(spec_problem)?)
        }
        _ => None,
    };
    let curriculum = match (&start.spec.curriculum, &data.train) {
        (Some(section), TrainData::Prompts(prompts)) => Some(plugins.curriculum(
            section,
            prompts,
            start.previous.as_ref(),
            options.curriculum_version.as_ref(),
        )?),
        // The fit rules refused a curriculum on offline data already.
        _ => None,
    };
    let torch = runtime::report();
    runtime::check_device(device, &torch)?;
    let platform = runtime::platform(device, &torch);
    if let Some(earlier) = start.previous.as_ref().and_then(|previous| previous.platform.as_ref()) {
        let differences = platform.differences(earlier);
        if !differences.is_empty() {
            warn!(
                differences = %differences.join("; "),
                "resuming on another device or other libraries: results will differ from an uninterrupted run"
            );
        }
    }
    // An engine job whose ranks score held-out never needs the model on the worker's device
    // (it may not fit there): the worker's copy, exported for the ranks and loaded back from
    // them for the checkpoint, stays on the CPU.
    let models_device =
        if kind == JobKind::Engine && start.spec.engine.heldout == rlvr_protocol::engine::HeldoutBy::Engine {
            Device::Cpu
        } else {
            device
        };
    // A rejection-sampling checkpoint holds no model: the spec's is the one it samples from.
    let models = Models::load(
        &start.spec,
        start.checkpoint.as_deref().filter(|_| kind != JobKind::RejectionSampling),
        models_device,
        &plugins.optimizer_info,
        plugins.trains,
        &plugins.optimizer,
    )?;
    check_reference(&start, &models, options)?;
    let teacher =
        distill.as_ref().map(|distill| distill::load_teacher(distill, &models.policy)).transpose()?;
    models::check_lengths(&start.spec, &models.policy, &data.train, data.heldout.as_deref())?;

    // Nothing above wrote to the state dir; from here on the run exists.
    let record = JobRecord {
        spec_sha256: start.spec_sha256.clone(),
        spec: start.spec.clone(),
        optimizer: plugins.optimizer_id.clone(),
        verifiers: plugins.graders.iter().map(|grader| grader.id.clone()).collect(),
        curriculum: curriculum.as_ref().map(|(id, _)| id.clone()),
        reference: models.reference_identity.clone(),
        threads: options.threads,
        platform: Some(platform),
    };
    if start.previous.is_none() {
        record
            .create(&run_dir)
            .map_err(|error| state_error(options, format!("cannot write job.json: {error}")))?;
    }
    let canaries = data.canaries.clone();
    let uses = std::mem::take(&mut plugins.uses);
    let parts = KindParts { kind, rejection, distill: distill.zip(teacher), engine };
    let (mut job, mut state) =
        assemble(options, start, plugins, data, curriculum.map(|(_, c)| c), models, parts)?;
    state.plugins = record.plugin_ids();
    let mut logs = Logs::open(&run_dir, &state).map_err(|message| state_error(options, message))?;
    if let Some(python) = &vllm_python {
        if state.step > 0 {
            // Said where a team reads it: the run is exact to the checkpoint, not past it.
            info!(
                from_step = state.step,
                "resuming a job whose rollouts are vLLM's: the same prompts and seeds are drawn, but vLLM's \
                 kernels do not repeat to the bit across batchings, so its samples (and the weights) differ \
                 from an uninterrupted run's from here on"
            );
        }
        job.rollouts = Rollouts::Vllm(Box::new(start_vllm(&job, python, options, &run_dir, state.step)?));
    }
    if let Some(env) = &job.spec.env {
        job.rollouts = Rollouts::Env(Box::new(start_env(env, &job.spec, options, &run_dir)?));
    }
    info!(
        policy = %job.spec.model.policy,
        device = ?device,
        libtorch = torch.libtorch_version.as_deref().unwrap_or("unknown"),
        cuda = torch.cuda_runtime.as_deref().unwrap_or("none"),
        cpu_matmul = %torch.cpu_matmul,
        plugins = ?state.plugins,
        from_step = state.step,
        "worker starting"
    );
    let mut outcome = drive::drive(&mut job, &run_dir, &mut state, &mut logs)?;
    // The gates judge, and publishing copies, the checkpoint the run chose: when that is not the
    // weights it ended with, its weights replace the trained model's in place (no second model).
    if let Some(candidate) = &outcome.candidate
        && candidate.step != outcome.steps
    {
        match &job.work {
            Work::RewardModel { model, .. } => models::load_trained_reward_model(model, &outcome.checkpoint)?,
            _ => models::load_trained_weights(&job.policy, &outcome.checkpoint)?,
        }
        outcome.weights_sha256 = job.weights_sha256();
        info!(step = candidate.step, heldout = ?candidate.heldout, "the gates' candidate is an earlier checkpoint");
    }
    outcome.plugins = uses;
    outcome.data_sha256 = data_sha256(&job.spec)?;
    outcome.dataset = job.rejection().map(sampling::Rejection::produced);
    if !outcome.interrupted && (job.has_heldout() || canaries.is_some()) {
        let baseline = baseline(options, &job.spec);
        let span = info_span!("gates", baseline = %baseline.model);
        let _entered = span.enter();
        let evaluation = match &job.work {
            Work::RewardModel { .. } => reward_training::for_gates(&job, &baseline, outcome.training),
            _ if job.engine_scores_heldout() => {
                let completions = engine::EngineDir::of(&run_dir);
                // The sets the job has: the ranks complete those only.
                let sets = |at: &str| -> Result<eval::EngineSets, WorkerError> {
                    let set = |name: &str, has: bool| {
                        if has { completions.completions(at, name) } else { Ok(None) }
                    };
                    Ok((set("heldout", job.has_heldout())?, set("canaries", canaries.is_some())?))
                };
                let before = match baseline.kind {
                    BaselineKind::Start => "start",
                    BaselineKind::Published => "baseline",
                };
                eval::for_gates_from_engine(
                    &job,
                    &baseline,
                    canaries.as_deref(),
                    outcome.training,
                    sets("final")?,
                    sets(before)?,
                )
            }
            _ => eval::for_gates(&job, &baseline, canaries.as_deref(), outcome.training),
        }
        .map_err(|error| WorkerError::from_step(outcome.steps, error))?;
        info!(
            candidate = ?evaluation.candidate,
            baseline = ?evaluation.baseline_scores,
            "the gates' evaluation"
        );
        outcome.evaluation = Some(evaluation);
    }
    outcome.peak_memory_bytes = memory::peak_bytes();
    Ok(outcome)
}

/// How an `[engine]` job starts its engine: both flags are the daemon's to give.
fn engine_settings(
    options: &WorkerOptions,
    spec: &JobSpec,
) -> Result<Option<engine::EngineSettings>, WorkerError> {
    if !spec.engine.is_engine() {
        return Ok(None);
    }
    let missing = |field: &'static str, what: &str| WorkerError::Model {
        field,
        message: format!("an [engine] kind = \"{}\" job needs {what}", spec.engine.kind.name()),
    };
    let launcher = match spec.engine.launcher {
        rlvr_protocol::engine::Launcher::Local => engine::LaunchAt::Local,
        rlvr_protocol::engine::Launcher::Ray => engine::LaunchAt::Ray {
            address: options
                .ray_address
                .clone()
                .ok_or_else(|| missing("--ray-address", "a Ray cluster's Jobs API"))?,
            // Unique per run: a resumed job submits again.
            submission: format!(
                "rlvr-{}-{}",
                options.job_id.as_deref().unwrap_or("run"),
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_millis())
            ),
            across_nodes: match spec.resources.nodes {
                1 => None,
                nodes => Some(engine::AcrossNodes {
                    ray_python: options.ray_python.clone().ok_or_else(|| {
                        missing("--ray-python", "the Ray cluster's python for its launcher")
                    })?,
                    nodes,
                    per_node: spec.resources.devices,
                }),
            },
        },
    };
    Ok(Some(engine::EngineSettings {
        launcher,
        python: options
            .engine_python
            .clone()
            .ok_or_else(|| missing("--engine-python", "the engine environment's python"))?,
        verify_url: options
            .verify_url
            .clone()
            .ok_or_else(|| missing("--verify-url", "the daemon's POST /v1/verify"))?,
        baseline_model: options.baseline.as_ref().map(|(model, _)| model.clone()),
    }))
}

/// A `rollout.engine = "vllm"` job's vLLM python, which the daemon must have given.
fn vllm_python(options: &WorkerOptions, spec: &JobSpec) -> Result<Option<PathBuf>, WorkerError> {
    // An [engine] job's vLLM is its engine's own (TRL's use_vllm).
    if spec.rollout.engine != rlvr_protocol::spec::RolloutEngine::Vllm || spec.engine.is_engine() {
        return Ok(None);
    }
    let python = options.vllm_python.clone().ok_or_else(|| WorkerError::Model {
        field: "--vllm-python",
        message: "a rollout.engine = \"vllm\" job needs the vLLM environment's python (scripts/vllm-venv.sh)"
            .into(),
    })?;
    if !python.is_file() {
        return Err(WorkerError::Model {
            field: "--vllm-python",
            message: format!(
                "{} is not a file (scripts/vllm-venv.sh makes the environment)",
                python.display()
            ),
        });
    }
    Ok(Some(python))
}

/// Starts the job's vLLM server on the policy's weights of `step`, sized for its longest prompt.
fn start_vllm(
    job: &Job,
    python: &std::path::Path,
    options: &WorkerOptions,
    run_dir: &RunDir,
    step: u64,
) -> Result<vllm::VllmServer, WorkerError> {
    let longest_prompt = match &job.train {
        TrainData::Prompts(prompts) => step::encode_prompts(&job.policy.tokenizer, prompts, "prompt")
            .map_err(|message| WorkerError::Model { field: "data.train", message })?
            .iter()
            .map(Vec::len)
            .max()
            .unwrap_or(0),
        _ => 0,
    };
    let max_model_len = longest_prompt + job.spec.rollout.max_new_tokens as usize;
    let shape = rlvr_protocol::memory::ModelShape::from_config_json(&job.policy.config.to_json())
        .map_err(|message| WorkerError::Model { field: "model.policy", message })?;
    let spec = vllm::ServerSpec {
        python,
        run_dir: run_dir.path(),
        dtype: job.spec.model.dtype,
        max_model_len,
        kv_cache_bytes: rlvr_protocol::memory::vllm_kv_cache_bytes(
            &job.spec,
            &shape,
            max_model_len as u64,
            match job.device.is_cuda() {
                true => rlvr_protocol::memory::DeviceKind::Cuda,
                false => rlvr_protocol::memory::DeviceKind::Cpu,
            },
        ),
        rows: job.spec.rollout.prompts_per_step as usize * job.spec.optimizer.group_size as usize,
        seed: job.spec.job.seed,
        threads: options.threads,
        own_device: job.spec.rollout.off_policy_steps > 0,
        sleeps: vllm::sleeps_between_rollouts(job.device, job.spec.rollout.off_policy_steps > 0),
    };
    Ok(vllm::VllmServer::start(&spec, &job.policy, step)?)
}

/// A resumed run's reference must be the one it started with.
fn check_reference(start: &Start, models: &Models, options: &WorkerOptions) -> Result<(), WorkerError> {
    if let (Some(previous), Some(identity)) = (&start.previous, &models.reference_identity)
        && previous.reference.as_ref() != Some(identity)
    {
        return Err(state_error(
            options,
            format!(
                "the reference changed since the run started: was {:?}, now {identity}",
                previous.reference
            ),
        ));
    }
    Ok(())
}

/// The job a step works on, and the training state to start from (restored from the checkpoint
/// when resuming).
/// What a job's kind brings to [`assemble`], loaded before it: each kind takes its own.
struct KindParts {
    kind: JobKind,
    rejection: Option<RejectionSamplingOptions>,
    distill: Option<(DistillOptions, LoadedModel)>,
    engine: Option<engine::EngineSettings>,
}

fn assemble(
    options: &WorkerOptions,
    start: Start,
    plugins: JobPlugins,
    data: JobData,
    curriculum: Option<CurriculumBox>,
    mut models: Models,
    parts: KindParts,
) -> Result<(Job, TrainState), WorkerError> {
    let Start { spec, checkpoint, saved, .. } = start;
    // Nothing trains in a rejection-sampling job: no moments to hold.
    let trainable = if parts.kind == JobKind::RejectionSampling { Vec::new() } else { models.trainable() };
    let missing = |what: &str| WorkerError::Plugin {
        field: "optimizer.plugin".into(),
        message: format!("a {:?} job without its {what}", parts.kind),
    };
    let work = match parts.kind {
        JobKind::RejectionSampling => {
            // The output file cut back to the checkpoint's length, before the checkpoint is
            // restored.
            let (keep, tally) = match (&checkpoint, &saved) {
                (Some(_), Some(saved)) => (saved.dataset_bytes, saved.sampled.clone()),
                _ => (0, None),
            };
            let path = RunDir::at(options.state_dir.clone()).dataset();
            let rejection_options = parts.rejection.ok_or_else(|| missing("options"))?;
            Work::RejectionSampling(sampling::Rejection::open(rejection_options, &path, keep, tally)?)
        }
        JobKind::Distill => {
            let (options, teacher) = parts.distill.ok_or_else(|| missing("teacher"))?;
            Work::Distill { options, teacher }
        }
        JobKind::RewardModel => Work::RewardModel {
            model: models.reward_model.take().ok_or_else(|| missing("reward model"))?,
            heldout_pairs: data.heldout_pairs,
        },
        JobKind::Engine => Work::Engine(parts.engine.ok_or_else(|| missing("engine"))?),
        JobKind::OnlineGroups | JobKind::OnlineWithCritic | JobKind::OfflineSft | JobKind::OfflinePairs => {
            Work::Policy
        }
    };
    let adamw = AdamW::new(trainable, AdamWConfig::from_spec(&spec.optimizer));
    let grants = match &options.grants {
        Some((socket, job)) => grants::Grants::connect(socket, job)?,
        None => grants::Grants::none(),
    };
    // On the policy's device and in its dtype (bf16 jobs score in bf16).
    let kind = models.policy.vs.variables().values().next().map_or(tch::Kind::Float, tch::Tensor::kind);
    let reward_models = reward_models::RewardModels::load(&spec, models.policy.vs.device(), kind)?;
    let mut job = Job {
        rollouts: Rollouts::Native,
        next_round: None,
        sampling: sampling_params(&spec.rollout),
        rng: SamplerRng::new(spec.job.seed),
        device: models.policy.vs.device(),
        policy: models.policy,
        reference: models.reference,
        value_head: models.value_head,
        optimizer: plugins.optimizer,
        optimizer_info: plugins.optimizer_info,
        rewarder: Reward {
            graders: plugins.graders,
            combiner: plugins.combiner,
            parallel: options.verify_parallel.max(1),
            deadline: VERIFY_DEADLINE,
            stop: None,
        },
        reward_models,
        curriculum,
        train: data.train,
        heldout: data.heldout,
        adamw,
        cursor: Cursor::default(),
        grants,
        libraries: plugins.libraries,
        work,
        spec,
    };
    let state = match (&checkpoint, saved) {
        (Some(path), Some(saved)) => {
            state::restore(&mut job, path, &saved)?;
            saved
        }
        _ => TrainState::default(),
    };
    if job.policy.adapters.is_none() && !matches!(job.work, Work::RejectionSampling(_)) {
        job.policy.vs.unfreeze();
    }
    Ok((job, state))
}

/// `[env]`'s environment, once its server has been seen to hold a step's episodes at once (one
/// session each), so that a server too small is refused before the first step, naming its limit.
/// An installed environment (`env.environment`) is started first, as the job's sidecar.
fn start_env(
    env: &rlvr_protocol::env::EnvSection,
    spec: &JobSpec,
    options: &WorkerOptions,
    run_dir: &RunDir,
) -> Result<episodes::Environment, WorkerError> {
    let sessions = (spec.rollout.prompts_per_step * spec.optimizer.group_size) as usize;
    let sidecar = match &env.environment {
        None => None,
        Some(name) => {
            let (script, python) = options.env_sidecar.as_ref().ok_or_else(|| WorkerError::Model {
                field: "env.environment",
                message: format!(
                    "{name} is started from --env-script with --env-python (the daemon gives both)"
                ),
            })?;
            let workdir = run_dir.path().join("env-sidecar");
            let sidecar = sidecar::Sidecar::start(python, script, &env.args, &workdir, SIDECAR_START)
                .map_err(|message| WorkerError::Model { field: "env.environment", message })?;
            info!(environment = %name, layers = %sidecar.layers, "the environment's sidecar serves");
            Some(sidecar)
        }
    };
    let problem = |message: String| WorkerError::Model { field: "env.url", message };
    let mut settings = episodes::EpisodeSettings::from_spec(env, &options.host, sessions).map_err(problem)?;
    if let Some(sidecar) = &sidecar {
        settings.server = sidecar.server();
    }
    let idle = episodes::open_sessions(&settings, sessions).map_err(|error| {
        match episodes::unreachable(&error) {
            true => WorkerError::Environment(error.to_string()),
            false => problem(error.to_string()),
        }
    })?;
    info!(server = %settings.server, sessions, "the environment holds a step's episodes at once");
    Ok(episodes::Environment { settings, idle: std::sync::Mutex::new(idle), sidecar })
}

/// How long a sidecar may take to serve (importing an OpenEnv server takes seconds).
const SIDECAR_START: std::time::Duration = std::time::Duration::from_secs(180);

/// What the gates compare the candidate with: the model line's published version the daemon
/// passed, else the job's starting checkpoint.
fn baseline(options: &WorkerOptions, spec: &JobSpec) -> Baseline {
    match &options.baseline {
        Some((path, version)) => Baseline {
            kind: BaselineKind::Published,
            model: path.to_string_lossy().into_owned(),
            version: Some(*version),
        },
        None => Baseline { kind: BaselineKind::Start, model: spec.model.policy.clone(), version: None },
    }
}

fn state_error(options: &WorkerOptions, message: String) -> WorkerError {
    WorkerError::State { path: options.state_dir.clone(), message }
}

/// How long a worker waits for the previous holder of its run lock to exit: the worker of a
/// daemon that was killed dies within a second (PR_SET_PDEATHSIG, the parent watch).
const RUN_LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(30);

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
