//! An `[engine]` job's training: the steps run on an existing distributed engine (TRL under
//! torchrun), the rest of the run stays the worker's.
//!
//! Where the engine path leaves the native one and rejoins it (`drive::Loop::engine_steps`):
//! the worker loads the job as for a native run and scores held-out on the starting weights (or,
//! with `engine.heldout = "engine"`, keeps its copy on the CPU and scores the completions the
//! ranks write: [`EngineDir::completions`], `HeldoutContract`); then, instead of its step loop, it writes the contract (`<run>/engine/contract.json`, the
//! mapping of `rlvr_protocol::engine::trl_trainer`), frees its own copy of the model
//! (`models::release_weights`), starts one engine process per device (each holding the whole
//! model under DDP, a shard under FSDP2: `engine.strategy`) and follows the engine's metrics lines
//! into `metrics.jsonl` and `progress.json`. A stop request
//! (SIGTERM from the daemon: its stop, a preemption) goes to the launcher, which passes it to
//! every rank; they agree on a step, checkpoint there and exit, and the worker exits
//! interrupted. When the engine finishes, its final weights are loaded into the policy and the
//! run ends as a native one does: held-out scored, a checkpoint, the gates' evaluation.
//!
//! The engine's own checkpoints (`<run>/engine/output/checkpoint-N/`) are what a resume starts
//! from, on the layout that wrote them only ([`Layout`]); the native checkpoint is written once,
//! at the end, for the gates and publishing.
//!
//! The contract and `engines/trl/run.py` (built into the binary) are written to `<run>/engine/`; the
//! built-in model is exported as a Hugging Face directory. The launcher is torchrun on
//! `resources.devices` processes, a child dying with the worker (`LaunchAt::Local`), or the same
//! command line submitted to a Ray cluster's Jobs API (`LaunchAt::Ray`: submit, status, log, stop),
//! or for ranks on several nodes `engines/ray/launch.py` ([`AcrossNodes`]: a placement group,
//! torchrun on each node); a stop is SIGTERM, or the Ray job's stop.

use std::fs;
use std::io::{BufRead, BufReader, Read, Seek, SeekFrom, Write};
use std::os::fd::AsFd;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus};

use rlvr_protocol::api::RewardRequest;
use rlvr_protocol::engine::{
    EngineCompletion, EngineContract, HeldoutBy, HeldoutContract, JOB_TOKEN_ENV, Strategy, VerifyAccess,
    trl_trainer,
};
use rlvr_protocol::fs::replace_atomic;
use rlvr_protocol::jobdir::RunDir;
use rlvr_protocol::worker::MetricsLine;
use serde_json::json;
use tracing::{info, warn};

use crate::{Job, WorkerError};

/// The entry script, built into the worker so the engine always runs the script of the worker
/// that mapped its contract; written next to the contract at each launch.
const ENTRY_SCRIPT: &str = include_str!("../../engines/trl/run.py");

/// The launcher of a job on several nodes of a Ray cluster ([`AcrossNodes`]), written beside the
/// entry script when one is.
const RAY_LAUNCHER: &str = include_str!("../../engines/ray/launch.py");

/// What the worker needs to start an engine, from its arguments and environment.
#[derive(Debug, Clone)]
pub struct EngineSettings {
    /// The engine environment's python (`--engine-python`).
    pub python: PathBuf,
    /// The daemon's `POST /v1/verify` (`--verify-url`).
    pub verify_url: String,
    pub launcher: LaunchAt,
    /// The gates' published baseline (`--baseline`), which the ranks complete when they score
    /// held-out (`engine.heldout = "engine"`).
    pub baseline_model: Option<PathBuf>,
}

/// Where the engine's processes start.
#[derive(Debug, Clone)]
pub enum LaunchAt {
    /// torchrun, a child of this worker.
    Local,
    /// A job on a Ray cluster (its Jobs REST API at `address`), submitted as `submission`: the
    /// same torchrun command line, run by the cluster, which shares the run's directory with
    /// this host; or, for ranks on more than one node, the launcher that places them.
    Ray { address: String, submission: String, across_nodes: Option<AcrossNodes> },
}

/// A job whose ranks span nodes of a Ray cluster: its entrypoint is `engines/ray/launch.py`
/// (run by the cluster's own python, which has Ray), which reserves `per_node` devices on each
/// of `nodes` distinct nodes with a placement group (all at once or none) and starts torchrun on
/// each, rendezvousing at the first.
#[derive(Debug, Clone)]
pub struct AcrossNodes {
    pub ray_python: PathBuf,
    pub nodes: u32,
    pub per_node: u32,
}

/// The engine's files in the run directory.
pub struct EngineDir {
    root: PathBuf,
}

impl EngineDir {
    /// Absolute: the engine runs in it, and reads the contract's paths from there.
    pub fn of(run: &RunDir) -> Self {
        let root = run.path().join("engine");
        EngineDir { root: std::path::absolute(&root).unwrap_or(root) }
    }

    fn contract(&self) -> PathBuf {
        self.root.join("contract.json")
    }

    fn script(&self) -> PathBuf {
        self.root.join("run.py")
    }

    fn ray_launcher(&self) -> PathBuf {
        self.root.join("launch.py")
    }

    /// The built-in model, exported once as a Hugging Face directory.
    fn start_model(&self) -> PathBuf {
        self.root.join("start-model")
    }

    fn output(&self) -> PathBuf {
        self.root.join("output")
    }

    /// The job's token, for the ranks' verify calls (mode 0600; `VerifyAccess::token_file`).
    fn token_file(&self) -> PathBuf {
        self.root.join("job-token")
    }

    /// How the ranks that wrote the checkpoints were laid out ([`Layout`]).
    fn layout(&self) -> PathBuf {
        self.output().join("layout.json")
    }

    /// What rank 0 appends, one line per step.
    fn metrics(&self) -> PathBuf {
        self.root.join("metrics.jsonl")
    }

    /// The held-out prompts the worker encoded and the completions the ranks wrote
    /// (`HeldoutContract`).
    fn heldout(&self) -> PathBuf {
        self.root.join("heldout")
    }

    /// The completions of `set` (`heldout`, `canaries`) at `at` (`start`, `step-N`, `final`,
    /// `baseline`), once the ranks wrote every set of `at`; `None` before.
    pub fn completions(&self, at: &str, set: &str) -> Result<Option<Vec<Vec<i64>>>, WorkerError> {
        let dir = self.heldout().join(at);
        if !dir.join("DONE").is_file() {
            return Ok(None);
        }
        let path = dir.join(format!("{set}.jsonl"));
        let fail = |message: String| WorkerError::State { path: path.clone(), message };
        let text = fs::read_to_string(&path).map_err(|error| fail(error.to_string()))?;
        text.lines()
            .enumerate()
            .map(|(index, line)| {
                serde_json::from_str::<EngineCompletion>(line)
                    .map(|completion| completion.tokens)
                    .map_err(|error| fail(format!("line {}: {error}", index + 1)))
            })
            .collect::<Result<_, _>>()
            .map(Some)
    }

    /// The directory whose `model/` holds the finished engine's weights (a checkpoint's shape,
    /// for `models::load_trained_weights`).
    pub fn finished(&self) -> PathBuf {
        self.output().join("final")
    }

    /// Whether the engine finished: its final model is whole (`final/FINISHED`, which the entry
    /// script writes after it).
    pub fn has_finished(&self) -> bool {
        self.finished().join("FINISHED").is_file()
    }

    /// The step of the newest engine checkpoint (`checkpoint-N`), 0 when none.
    fn newest_checkpoint_step(&self) -> u64 {
        let Ok(entries) = fs::read_dir(self.output()) else { return 0 };
        entries
            .filter_map(|entry| entry.ok()?.file_name().to_str()?.strip_prefix("checkpoint-")?.parse().ok())
            .max()
            .unwrap_or(0)
    }
}

/// How many ranks wrote an engine's checkpoints, and how they held the model: a checkpoint
/// resumes on the layout that wrote it only (under FSDP2 each rank wrote its own shard; under DDP
/// each its own random state, and the data is split by rank).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Layout {
    pub ranks: u32,
    pub strategy: Strategy,
}

impl Layout {
    /// `None` when checkpoints written by `written` can resume as `self`; else why not, in a
    /// sentence naming both. A run with no checkpoint yet starts on any layout.
    pub fn refusal(self, written: Option<Layout>, newest_checkpoint: u64) -> Option<String> {
        let written = written.filter(|_| newest_checkpoint > 0)?;
        (written != self).then(|| {
            format!(
                "the engine's checkpoint-{newest_checkpoint} was written by {} ranks under {}, and this run has {} \
                 under {}: its shards and random states resume on the layout that wrote them only; \
                 submit the job again as a new one, or remove engine/output to start it over",
                written.ranks,
                written.strategy.name(),
                self.ranks,
                self.strategy.name()
            )
        })
    }
}

/// What a run of an engine job starts from: the engine's metrics lines a resumed run replays into
/// `metrics.jsonl`, and whether the engine has still to run.
pub struct Prepared {
    pub lines: Vec<MetricsLine>,
    /// The engine finished before this run (killed after it, say): its lines are all of them,
    /// and it is not started again.
    pub finished: bool,
}

/// Writes the contract, the script and (for the built-in model) the starting model; returns
/// the engine's metrics lines up to its newest checkpoint (the lines after it are dropped: the
/// engine runs those steps again), or all of them when it finished.
pub fn prepare(job: &Job, run: &RunDir, settings: &EngineSettings) -> Result<Prepared, WorkerError> {
    let dir = EngineDir::of(run);
    if dir.has_finished() {
        return Ok(Prepared { lines: read_lines(&dir.metrics()), finished: true });
    }
    let fail = |message: String| WorkerError::State { path: dir.root.clone(), message };
    fs::create_dir_all(dir.output()).map_err(|error| fail(format!("cannot create: {error}")))?;
    let spec = &job.spec;
    let trainer = trl_trainer(spec, spec.resources.ranks()).map_err(|refusals| WorkerError::Plugin {
        field: refusals.first().map(|r| r.field.clone()).unwrap_or_default(),
        message: refusals.iter().map(|r| r.message.clone()).collect::<Vec<_>>().join("; "),
    })?;
    let model = if spec.model.policy.starts_with("builtin:") {
        let exported = dir.start_model();
        if !exported.join("config.json").exists() {
            rlvr_model::policy::save_pretrained(&job.policy, &exported)
                .map_err(|error| fail(format!("cannot export {}: {error}", spec.model.policy)))?;
        }
        exported
    } else {
        absolute(Path::new(&spec.model.policy))
    };
    let reward = RewardRequest {
        graders: spec.verifiers.clone(),
        formula: spec.reward.as_ref().map(|reward| reward.formula.clone()),
    };
    let contract = EngineContract {
        trainer,
        model,
        train: absolute(&spec.data.train),
        output_dir: dir.output(),
        metrics: dir.metrics(),
        verify: VerifyAccess { url: settings.verify_url.clone(), reward, token_file: dir.token_file() },
        heldout: heldout_contract(job, &dir, settings).map_err(fail)?,
    };
    let text = serde_json::to_vec_pretty(&contract).map_err(|error| fail(error.to_string()))?;
    let resume_step = dir.newest_checkpoint_step();
    let layout = Layout { ranks: spec.resources.ranks(), strategy: spec.engine.strategy };
    let written = fs::read(dir.layout()).ok().and_then(|bytes| serde_json::from_slice(&bytes).ok());
    if let Some(message) = layout.refusal(written, resume_step) {
        return Err(fail(message));
    }
    let text_layout = serde_json::to_vec(&layout).map_err(|error| fail(error.to_string()))?;
    replace_atomic(&dir.layout(), &text_layout).map_err(|error| fail(format!("layout.json: {error}")))?;
    replace_atomic(&dir.contract(), &text).map_err(|error| fail(format!("contract.json: {error}")))?;
    replace_atomic(&dir.script(), ENTRY_SCRIPT.as_bytes())
        .map_err(|error| fail(format!("run.py: {error}")))?;
    // The engine's lines up to its checkpoint: what an uninterrupted run had logged by then.
    let kept: Vec<MetricsLine> =
        read_lines(&dir.metrics()).into_iter().filter(|line| line.step <= resume_step).collect();
    let mut text = String::new();
    for line in &kept {
        text.push_str(&serde_json::to_string(line).map_err(|error| fail(error.to_string()))?);
        text.push('\n');
    }
    replace_atomic(&dir.metrics(), text.as_bytes())
        .map_err(|error| fail(format!("metrics.jsonl: {error}")))?;
    if resume_step > 0 {
        info!(step = resume_step, "the engine resumes from its checkpoint");
    }
    Ok(Prepared { lines: kept, finished: false })
}

/// What the ranks complete for the worker to score, when they score held-out: the held-out
/// prompts and the canaries encoded as the native evaluation encodes them, and the published
/// baseline as a Hugging Face directory.
fn heldout_contract(
    job: &Job,
    dir: &EngineDir,
    settings: &EngineSettings,
) -> Result<Option<HeldoutContract>, String> {
    let spec = &job.spec;
    if spec.engine.heldout != HeldoutBy::Engine {
        return Ok(None);
    }
    let root = dir.heldout();
    fs::create_dir_all(&root).map_err(|error| format!("cannot create {}: {error}", root.display()))?;
    let write = |name: &str, records: &[rlvr_protocol::records::PromptRecord]| {
        let prompts = crate::step::encode_prompts(&job.policy.tokenizer, records, name)?;
        let mut text = String::new();
        for tokens in prompts {
            text.push_str(&serde_json::to_string(&EngineCompletion { tokens }).map_err(|e| e.to_string())?);
            text.push('\n');
        }
        let path = root.join(format!("{name}-prompts.jsonl"));
        replace_atomic(&path, text.as_bytes()).map_err(|error| format!("{}: {error}", path.display()))?;
        Ok::<_, String>(path)
    };
    let heldout = write("heldout", crate::eval::heldout_records(job)?)?;
    let canaries = match &spec.data.canaries {
        Some(path) => {
            let records = rlvr_protocol::records::load_prompts("data.canaries", path)
                .map_err(|error| error.to_string())?;
            Some(write("canaries", &records)?)
        }
        None => None,
    };
    let baseline_model = match &settings.baseline_model {
        Some(model) if model.join("config.json").is_file() => Some(absolute(model)),
        Some(model) => {
            // Not a Hugging Face directory (a built-in model): exported once, on the CPU.
            let exported = dir.root.join("baseline-model");
            if !exported.join("config.json").is_file() {
                crate::models::export(&model.to_string_lossy(), &exported, spec.model.dtype).map_err(
                    |error| format!("cannot export the gates' baseline {}: {error}", model.display()),
                )?;
            }
            Some(exported)
        }
        None => None,
    };
    Ok(Some(HeldoutContract {
        heldout,
        canaries,
        max_new_tokens: spec.rollout.max_new_tokens,
        every_steps: spec.eval.every_steps,
        dir: root,
        baseline_model,
    }))
}

/// `path` from the worker's directory, for an engine that runs in another.
fn absolute(path: &Path) -> PathBuf {
    std::path::absolute(path).unwrap_or_else(|_| path.to_owned())
}

/// The metrics lines of a file the engine writes; a line that does not parse (one cut short by
/// a kill) is skipped.
fn read_lines(path: &Path) -> Vec<MetricsLine> {
    let Ok(file) = fs::File::open(path) else { return Vec::new() };
    BufReader::new(file)
        .lines()
        .map_while(Result::ok)
        .filter_map(|line| serde_json::from_str(&line).ok())
        .collect()
}

/// A running engine: its launcher and where its metrics file has been read to.
pub struct Engine {
    launcher: Launched,
    metrics: PathBuf,
    read_to: u64,
    /// Text after the last newline read: a line the engine is still writing.
    partial: String,
    stop_sent: bool,
}

/// The engine's launcher, as started.
enum Launched {
    Local(Child),
    Ray(RayJob),
}

/// What [`Engine::poll`] found.
pub enum Poll {
    /// New step lines (maybe none); the engine runs on.
    Running(Vec<MetricsLine>),
    /// The launcher ended, with its last lines.
    Ended(EngineEnd, Vec<MetricsLine>),
}

/// How an engine's launcher ended.
#[derive(Debug, Clone, PartialEq)]
pub enum EngineEnd {
    Finished,
    /// Stopped on request (the Ray job stopped, or the ranks exited 75).
    Interrupted,
    /// Failed: the protocol's exit status when there is one, and what happened.
    Failed {
        code: Option<i32>,
        message: String,
    },
}

impl Engine {
    /// Starts `resources.devices` engine processes under torchrun: on this host's devices (the
    /// ones the daemon gave the worker: `CUDA_VISIBLE_DEVICES`, or CPU slots), or as a Ray job.
    pub fn launch(job: &Job, run: &RunDir, settings: &EngineSettings) -> Result<Engine, WorkerError> {
        let dir = EngineDir::of(run);
        let token = std::env::var(JOB_TOKEN_ENV).map_err(|_| WorkerError::Model {
            field: "--verify-url",
            message: format!("${JOB_TOKEN_ENV} is not set: the engine's rewards need the job's token"),
        })?;
        write_token(&dir.token_file(), &token)?;
        let read_to = fs::metadata(dir.metrics()).map_or(0, |meta| meta.len());
        let processes = job.spec.resources.ranks();
        let launcher = match &settings.launcher {
            LaunchAt::Local => Launched::Local(launch_local(&dir, settings, processes)?),
            LaunchAt::Ray { address, submission, across_nodes } => {
                // Recorded first: the daemon stops it if this worker dies, whatever the way.
                replace_atomic(&run.ray_submission(), submission.as_bytes()).map_err(|error| {
                    WorkerError::State { path: run.ray_submission(), message: error.to_string() }
                })?;
                let entrypoint = match across_nodes {
                    None => RayEntrypoint::Torchrun { processes },
                    Some(across) => {
                        replace_atomic(&dir.ray_launcher(), RAY_LAUNCHER.as_bytes()).map_err(|error| {
                            WorkerError::State { path: dir.ray_launcher(), message: error.to_string() }
                        })?;
                        let device = if job.device.is_cuda() { "gpu" } else { "cpu" };
                        RayEntrypoint::AcrossNodes { across: across.clone(), device }
                    }
                };
                Launched::Ray(RayJob::submit(address, submission, &dir, settings, &entrypoint)?)
            }
        };
        Ok(Engine { launcher, metrics: dir.metrics(), read_to, partial: String::new(), stop_sent: false })
    }

    /// The engine's new metrics lines, and whether it ended.
    pub fn poll(&mut self) -> Result<Poll, WorkerError> {
        let ended = match &mut self.launcher {
            Launched::Local(child) => child
                .try_wait()
                .map_err(|error| WorkerError::Engine {
                    transient: true,
                    message: format!("cannot watch the engine: {error}"),
                })?
                .map(local_end),
            Launched::Ray(ray) => ray.end()?,
        };
        let lines = self.read_new_lines();
        Ok(match ended {
            Some(end) => Poll::Ended(end, lines),
            None => Poll::Running(lines),
        })
    }

    /// Passes a stop request on once: SIGTERM to torchrun (which passes it to every rank), or
    /// the Ray job's stop (SIGTERM to its entrypoint, torchrun).
    pub fn ask_to_stop(&mut self) {
        if self.stop_sent {
            return;
        }
        self.stop_sent = true;
        match &self.launcher {
            Launched::Local(child) => {
                let pid = nix::unistd::Pid::from_raw(child.id() as i32);
                if let Err(error) = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM) {
                    warn!(%error, "cannot pass the stop request to the engine");
                }
            }
            Launched::Ray(ray) => ray.stop(),
        }
    }

    /// Whether a stop request was passed on.
    pub fn stop_sent(&self) -> bool {
        self.stop_sent
    }

    fn read_new_lines(&mut self) -> Vec<MetricsLine> {
        let Ok(mut file) = fs::File::open(&self.metrics) else { return Vec::new() };
        if file.seek(SeekFrom::Start(self.read_to)).is_err() {
            return Vec::new();
        }
        let mut text = String::new();
        let Ok(read) = file.read_to_string(&mut text) else { return Vec::new() };
        self.read_to += read as u64;
        self.partial.push_str(&text);
        let Some(end) = self.partial.rfind('\n') else { return Vec::new() };
        let complete: String = self.partial.drain(..=end).collect();
        complete
            .lines()
            .filter_map(|line| match serde_json::from_str(line) {
                Ok(parsed) => Some(parsed),
                Err(error) => {
                    warn!(%error, "the engine wrote a metrics line that does not parse: skipped");
                    None
                }
            })
            .collect()
    }
}

/// Writes the job's token to `path`, readable and writable by its owner only (created so: never
/// a moment with wider permissions), replacing an earlier run's.
fn write_token(path: &Path, token: &str) -> Result<(), WorkerError> {
    use std::os::unix::fs::OpenOptionsExt;
    let fail = |error: std::io::Error| WorkerError::State {
        path: path.to_owned(),
        message: format!("cannot write the job's token for the engine: {error}"),
    };
    let _ = fs::remove_file(path);
    let mut file =
        fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(path).map_err(fail)?;
    file.write_all(token.as_bytes()).map_err(fail)
}

/// torchrun on this host, dying with the worker.
fn launch_local(dir: &EngineDir, settings: &EngineSettings, processes: u32) -> Result<Child, WorkerError> {
    let mut command = Command::new(&settings.python);
    command
        .args(torchrun_args(dir, processes))
        // Its own home: nothing the engine's libraries cache lands outside the run.
        .env("HOME", &dir.root)
        // The ranks read the token from the contract's file, not from an environment any of
        // their own children would inherit.
        .env_remove(JOB_TOKEN_ENV)
        .env("OMP_NUM_THREADS", "1")
        .current_dir(&dir.root);
    // The worker's stdout is its outcome line only: the engine's prints go to its log.
    let log = std::io::stderr().as_fd().try_clone_to_owned().map_err(|error| WorkerError::Model {
        field: "--engine-python",
        message: format!("cannot hand the engine the log: {error}"),
    })?;
    command.stdout(log);
    // SAFETY: prctl and the signal mask only, between fork and exec. The launcher dies with this
    // worker (its ranks notice their launcher gone and exit: `watch_parent` in the script), and
    // hears the stop as SIGTERM, which this worker blocks on all its threads (`lifecycle`).
    unsafe {
        command.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            crate::lifecycle::unblock_stop_signals_in_child()
        });
    }
    let child = command.spawn().map_err(|error| WorkerError::Model {
        field: "--engine-python",
        message: format!("cannot start {}: {error}", settings.python.display()),
    })?;
    info!(pid = child.id(), processes, "the trl engine started");
    Ok(child)
}

/// torchrun's arguments after the python: one process per device, the script, the contract.
fn torchrun_args(dir: &EngineDir, processes: u32) -> Vec<String> {
    vec![
        "-m".into(),
        "torch.distributed.run".into(),
        "--standalone".into(),
        "--nproc-per-node".into(),
        processes.to_string(),
        dir.script().display().to_string(),
        dir.contract().display().to_string(),
    ]
}

/// How torchrun's exit reads: 75 (the ranks stopped) is an interruption.
fn local_end(status: ExitStatus) -> EngineEnd {
    match status.code() {
        Some(0) => EngineEnd::Finished,
        Some(75) => EngineEnd::Interrupted,
        code => EngineEnd::Failed { code, message: format!("the trl engine exited with {status}") },
    }
}

/// What a Ray job's entrypoint starts.
enum RayEntrypoint {
    /// torchrun with `processes` ranks on the node the cluster runs the entrypoint on.
    Torchrun { processes: u32 },
    /// `engines/ray/launch.py`: torchrun on each of several nodes (`device`: "cpu" or "gpu").
    AcrossNodes { across: AcrossNodes, device: &'static str },
}

/// A job on a Ray cluster, through its Jobs REST API (`/api/jobs/`).
struct RayJob {
    client: reqwest::blocking::Client,
    address: String,
    submission: String,
}

/// A Ray job's status (`GET /api/jobs/{id}`), the fields read.
#[derive(Debug, serde::Deserialize)]
struct RayJobInfo {
    status: String,
    #[serde(default)]
    message: Option<String>,
    #[serde(default)]
    driver_exit_code: Option<i32>,
}

impl RayJob {
    fn submit(
        address: &str,
        submission: &str,
        dir: &EngineDir,
        settings: &EngineSettings,
        entrypoint: &RayEntrypoint,
    ) -> Result<RayJob, WorkerError> {
        rlvr_startup::install_crypto_provider();
        let client = reqwest::blocking::Client::builder()
            .timeout(std::time::Duration::from_secs(30))
            .build()
            .map_err(|error| ray_error(address, error.to_string()))?;
        let address = address.trim_end_matches('/').to_owned();
        let (words, entrypoint_cpus) = match entrypoint {
            RayEntrypoint::Torchrun { processes } => (
                std::iter::once(settings.python.display().to_string())
                    .chain(torchrun_args(dir, *processes))
                    .collect::<Vec<_>>(),
                *processes,
            ),
            // The launcher itself holds nothing: its placement group holds every node's devices.
            RayEntrypoint::AcrossNodes { across, device } => (
                vec![
                    across.ray_python.display().to_string(),
                    dir.ray_launcher().display().to_string(),
                    "--nodes".into(),
                    across.nodes.to_string(),
                    "--per-node".into(),
                    across.per_node.to_string(),
                    "--device".into(),
                    (*device).to_owned(),
                    "--engine-python".into(),
                    settings.python.display().to_string(),
                    dir.script().display().to_string(),
                    dir.contract().display().to_string(),
                ],
                0,
            ),
        };
        let entrypoint = words.iter().map(|word| shell_quote(word)).collect::<Vec<_>>().join(" ");
        let body = json!({
            "submission_id": submission,
            "entrypoint": entrypoint,
            // The cluster holds the processes' CPUs (or GPUs) for the job's whole run.
            "entrypoint_num_cpus": entrypoint_cpus,
            "runtime_env": {
                // No token here: the dashboard shows a job's runtime environment to whoever
                // reaches it. The ranks read it from the contract's token file.
                "env_vars": {
                    "HOME": dir.root.display().to_string(),
                    "OMP_NUM_THREADS": "1",
                },
            },
            "metadata": { "rlvr": "engine" },
        });
        let answer = client
            .post(format!("{address}/api/jobs/"))
            .json(&body)
            .send()
            .map_err(|error| ray_error(&address, error.to_string()))?;
        if !answer.status().is_success() {
            let status = answer.status();
            let text = answer.text().unwrap_or_default();
            return Err(ray_error(&address, format!("submit: {status}: {text}")));
        }
        info!(%address, submission, %entrypoint, "the trl engine submitted to Ray");
        Ok(RayJob { client, address, submission: submission.to_owned() })
    }

    /// The job's end, when it ended; its log into the worker's.
    fn end(&self) -> Result<Option<EngineEnd>, WorkerError> {
        let url = format!("{}/api/jobs/{}", self.address, self.submission);
        let info: RayJobInfo = self
            .client
            .get(&url)
            .send()
            .and_then(reqwest::blocking::Response::error_for_status)
            .and_then(reqwest::blocking::Response::json)
            .map_err(|error| ray_error(&self.address, format!("status of {}: {error}", self.submission)))?;
        let end = match info.status.as_str() {
            "PENDING" | "RUNNING" => return Ok(None),
            "SUCCEEDED" => EngineEnd::Finished,
            "STOPPED" => EngineEnd::Interrupted,
            _ if info.driver_exit_code == Some(75) => EngineEnd::Interrupted,
            other => EngineEnd::Failed {
                code: info.driver_exit_code,
                message: format!(
                    "the Ray job {} ended {other}: {}",
                    self.submission,
                    info.message.as_deref().unwrap_or("no message")
                ),
            },
        };
        self.copy_log();
        Ok(Some(end))
    }

    /// The job's log (torchrun's and the ranks' output), into the worker's log.
    fn copy_log(&self) {
        let url = format!("{}/api/jobs/{}/logs", self.address, self.submission);
        #[derive(serde::Deserialize)]
        struct Logs {
            logs: String,
        }
        match self.client.get(&url).send().and_then(reqwest::blocking::Response::json::<Logs>) {
            Ok(logs) => eprint!("{}", logs.logs),
            Err(error) => warn!(%error, "cannot read the Ray job's log"),
        }
    }

    /// `POST /api/jobs/{id}/stop`: Ray sends the entrypoint SIGTERM (and SIGKILL after its
    /// `RAY_JOB_STOP_WAIT_TIME_S`, which an operator sets long enough for a checkpoint).
    fn stop(&self) {
        let url = format!("{}/api/jobs/{}/stop", self.address, self.submission);
        if let Err(error) =
            self.client.post(&url).send().and_then(reqwest::blocking::Response::error_for_status)
        {
            warn!(%error, "cannot stop the Ray job");
        }
    }
}

/// A word for the shell the Ray job's entrypoint runs in.
fn shell_quote(word: &str) -> String {
    format!("'{}'", word.replace('\'', "'\\''"))
}

fn ray_error(address: &str, message: String) -> WorkerError {
    // The cluster, not the job: the daemon requeues it.
    WorkerError::Engine { transient: true, message: format!("engines.ray_address {address}: {message}") }
}

/// How an engine that failed ends the worker: the engine's exit 70 is transient; anything else
/// is the job's fault or the engine's, and fails the job with the engine's log to read.
pub fn failed(code: Option<i32>, message: String) -> WorkerError {
    let message = format!("{message} (its log is the job's worker log)");
    WorkerError::Engine { transient: code == Some(70), message }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_checkpoint_resumes_on_the_layout_that_wrote_it_only() {
        let layout = |ranks, strategy| Layout { ranks, strategy };
        let fsdp2_on_2 = layout(2, Strategy::Fsdp2);
        // (written, newest checkpoint, this run, the refusal's words or none)
        let cases: &[(Option<Layout>, u64, Layout, Option<&str>)] = &[
            (None, 0, fsdp2_on_2, None),
            (Some(fsdp2_on_2), 4, fsdp2_on_2, None),
            // No checkpoint yet: nothing to resume, any layout starts.
            (Some(layout(4, Strategy::Fsdp2)), 0, fsdp2_on_2, None),
            // Written before layouts were recorded: taken as this run's.
            (None, 4, fsdp2_on_2, None),
            (
                Some(layout(4, Strategy::Fsdp2)),
                6,
                fsdp2_on_2,
                Some("checkpoint-6 was written by 4 ranks under fsdp2, and this run has 2 under fsdp2"),
            ),
            (
                Some(layout(2, Strategy::Ddp)),
                2,
                fsdp2_on_2,
                Some("2 ranks under ddp, and this run has 2 under fsdp2"),
            ),
        ];
        for (written, newest, now, words) in cases {
            let refusal = now.refusal(*written, *newest);
            match words {
                None => assert_eq!(refusal, None, "{written:?} {newest} {now:?}"),
                Some(words) => {
                    let refusal = refusal.unwrap_or_default();
                    assert!(refusal.contains(words) && refusal.contains("remove engine/output"), "{refusal}");
                }
            }
        }
    }
}
