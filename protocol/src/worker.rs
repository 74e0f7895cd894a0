//! The worker protocol: how `rlvrd serve` starts a worker and learns how it ended.
//!
//! The worker (`rlvr-worker run`) crosses the process boundary on these channels, each typed here
//! and used by both sides:
//! - its arguments: [`WorkerArgs`] (the daemon writes them with [`WorkerArgs::command_line`],
//!   the worker parses them with clap);
//! - the job's spec: `spec.json` in the job directory ([`crate::spec::JobSpec`]);
//! - its exit status: [`WorkerExit`], and for [`WorkerExit::OutOfMemory`] its last stderr line,
//!   an [`OutOfMemory`] report;
//! - its outcome, one JSON line on stdout when it finishes: [`Outcome`], with the gates'
//!   evaluation ([`GateEvaluation`]) that the daemon judges; when it fails, its error as a
//!   [`LastWord`] line on stdout, a pipe, so that the reason reaches the daemon when the disk its
//!   log is on is full;
//! - its training log, `metrics.jsonl`: one [`MetricsLine`] per step and held-out evaluation;
//! - its live state, `progress.json`: [`Progress`], rewritten after every step;
//! - the grant socket: [`crate::grants`];
//! - with `--host-context-stdin`, its first stdin line: the [`HostContext`] its plugins are
//!   created with (the job's secrets, the outbound policy);
//! - `rlvr-worker check-options`' one stdout line: [`OptionsCheck`], a plugin's answer about
//!   its options, for the daemon's submit checks (optimizer plugins are never loaded in the
//!   daemon).
//!
//! Where these files are is [`crate::jobdir::JobDir`]'s.
//!
//! Exit statuses: 0 finished, 2 the job's fault, 70 transient, 71 out of memory, 75 interrupted.
//! The `OutOfMemory` line (device, phase, peak, cap) is written with `Display` and read back with
//! [`OutOfMemory::from_line`]. `rollouts.jsonl` holds one [`RolloutRecord`] per completion.
//! [`HostContext`] is re-exported from `rlvr-plugin-api`, its one definition. A test round-trips
//! every field of [`WorkerArgs`] through `command_line` and clap.
//!
//! Why `progress.json` and not the daemon tailing `metrics.jsonl`: the worker knows its budget, so
//! the ETA it computes (steps left at this run's pace, capped by `budget.max_wall_minutes`) is the
//! one users see; the daemon used to compute a second one from the log that ignored the wall
//! budget.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::PathBuf;

pub use rlvr_plugin_api::{GraderCaps, HostContext, OptionsReport, Secret};
use serde::{Deserialize, Serialize};

use crate::memory::BYTES_PER_GB;

/// The worker's arguments for one run of one job.
#[derive(Debug, Clone, PartialEq, Default)]
#[cfg_attr(feature = "cli", derive(clap::Args))]
pub struct WorkerArgs {
    /// The job spec (TOML, or JSON by extension).
    #[cfg_attr(feature = "cli", arg(long))]
    pub spec: PathBuf,
    /// Where checkpoints, metrics.jsonl and rollouts.jsonl go.
    #[cfg_attr(feature = "cli", arg(long))]
    pub state_dir: PathBuf,
    /// Continue from the newest checkpoint in the state dir.
    #[cfg_attr(feature = "cli", arg(long))]
    pub resume: bool,
    /// A directory to load plugins from, besides the config's plugins.dirs (repeatable).
    #[cfg_attr(feature = "cli", arg(long = "plugin-dir"))]
    pub plugin_dirs: Vec<PathBuf>,
    /// A plugin library of the job's (repeatable). When given, the worker loads these files and
    /// nothing else: no --plugin-dir, no plugins.dirs. The daemon passes its content-addressed
    /// copies of the libraries the spec names (every loaded version of each name, so a resume
    /// finds the version its record pinned).
    #[cfg_attr(feature = "cli", arg(long = "plugin-file", value_name = "LIBRARY"))]
    pub plugin_files: Vec<PathBuf>,
    /// The daemon config whose plugins.dirs to use [default: /etc/rlvr/rlvrd.toml when it
    /// exists].
    #[cfg_attr(feature = "cli", arg(long, short))]
    pub config: Option<PathBuf>,
    /// `cpu`, `cuda` or `cuda:N` [default: cuda when available (CUDA_VISIBLE_DEVICES applies),
    /// else cpu].
    #[cfg_attr(feature = "cli", arg(long))]
    pub device: Option<String>,
    /// Verifier calls at once [default: the number of cores].
    #[cfg_attr(feature = "cli", arg(long))]
    pub verify_parallel: Option<usize>,
    /// libtorch's CPU threads [default: the number of cores]. Results are bit-exact only for the
    /// same thread count: resume with the one the run started with.
    #[cfg_attr(feature = "cli", arg(long))]
    pub threads: Option<usize>,
    /// Die with this process (the daemon passes its pid): SIGKILL when it exits.
    #[cfg_attr(feature = "cli", arg(long, value_name = "PID"))]
    pub exit_with_parent: Option<u32>,
    /// Ask the daemon's scheduler on this socket for the devices before each device phase (the
    /// daemon passes it, with --job-id).
    #[cfg_attr(feature = "cli", arg(long, value_name = "SOCKET", requires = "job_id"))]
    pub grant_socket: Option<PathBuf>,
    /// This job's id at the grant socket.
    #[cfg_attr(feature = "cli", arg(long, value_name = "ID", requires = "grant_socket"))]
    pub job_id: Option<String>,
    /// The gates compare the trained model with this published checkpoint (the model line's
    /// current version; the daemon passes it) instead of the starting one.
    #[cfg_attr(feature = "cli", arg(long, value_name = "DIR", requires = "baseline_version"))]
    pub baseline: Option<PathBuf>,
    /// The version number of --baseline.
    #[cfg_attr(feature = "cli", arg(long, value_name = "N", requires = "baseline"))]
    pub baseline_version: Option<u64>,
    /// Where the shared curricula are (the daemon's `<state_dir>/curricula`).
    #[cfg_attr(feature = "cli", arg(long, value_name = "DIR", requires = "curriculum_version"))]
    pub curricula_dir: Option<PathBuf>,
    /// The version of `[curriculum] name` pinned at admission: the estimates start from it.
    #[cfg_attr(feature = "cli", arg(long, value_name = "N", requires = "curricula_dir"))]
    pub curriculum_version: Option<u64>,
    /// Read the plugins' host context (the job's secrets, where plugins may send requests) as
    /// one JSON line from stdin before anything else (the daemon writes it). Without it: no
    /// secrets and no restriction on outbound requests, as for a run by hand.
    #[cfg_attr(feature = "cli", arg(long))]
    pub host_context_stdin: bool,
    /// The memory the job may use on its device, in bytes (the daemon passes its
    /// `[resources] memory_gb`, or the device's memory for a whole device). On a CPU the worker
    /// ends itself with exit 71 (out of memory) once its resident size passes it; on CUDA the
    /// daemon caps libtorch's allocator (`PYTORCH_CUDA_ALLOC_CONF`) and this names the cap in
    /// the report. Without it: no cap.
    #[cfg_attr(feature = "cli", arg(long, value_name = "BYTES"))]
    pub memory_cap: Option<u64>,
    /// An `[engine] kind = "trl"` job: the python of the engine's environment (the daemon's
    /// `engines.trl_python`; `scripts/engine-venv.sh trl` makes one).
    #[cfg_attr(feature = "cli", arg(long))]
    pub engine_python: Option<PathBuf>,
    /// A `[rollout] engine = "vllm"` job: the python of the vLLM environment (the daemon's
    /// `engines.vllm_python`; `scripts/vllm-venv.sh` makes one).
    #[cfg_attr(feature = "cli", arg(long))]
    pub vllm_python: Option<PathBuf>,
    /// An `[env] environment = "NAME"` job: the installed environment's script (the daemon's
    /// `engines.environments`/NAME.py) and the python that runs it as the job's sidecar
    /// (`engines.environments_python`).
    #[cfg_attr(feature = "cli", arg(long))]
    pub env_script: Option<PathBuf>,
    #[cfg_attr(feature = "cli", arg(long))]
    pub env_python: Option<PathBuf>,
    /// An engine job: the daemon's `POST /v1/verify`, where the engine gets its rewards with the
    /// job's token (`$RLVR_JOB_TOKEN`, in the worker's environment, never in argv).
    #[cfg_attr(feature = "cli", arg(long))]
    pub verify_url: Option<String>,
    /// An `[engine] launcher = "ray"` job: the Ray cluster's Jobs API (the daemon's
    /// `engines.ray_address`, e.g. `http://127.0.0.1:8265`).
    #[cfg_attr(feature = "cli", arg(long))]
    pub ray_address: Option<String>,
    /// An `[engine]` job on more than one node: the python with Ray on the cluster (the daemon's
    /// `engines.ray_python`), which runs its launcher.
    #[cfg_attr(feature = "cli", arg(long))]
    pub ray_python: Option<PathBuf>,
    /// The kind the daemon decided at submit (`rlvr_protocol::kind::JobKind`); the worker refuses
    /// to run the job as another (its optimizer library would have to have changed under it).
    /// Without it (a run by hand, a job submitted before kinds were recorded): the worker's own.
    #[cfg_attr(feature = "cli", arg(long, value_name = "KIND"))]
    pub kind: Option<crate::kind::JobKind>,
}

impl WorkerArgs {
    /// The worker's command line (after the program's name) that parses back into `self`: the
    /// `run` subcommand and its flags.
    pub fn command_line(&self) -> Vec<OsString> {
        let mut argv = Argv::new("run");
        argv.flag("spec", &self.spec);
        argv.flag("state-dir", &self.state_dir);
        for dir in &self.plugin_dirs {
            argv.flag("plugin-dir", dir);
        }
        for file in &self.plugin_files {
            argv.flag("plugin-file", file);
        }
        argv.opt("config", self.config.as_ref());
        argv.opt("device", self.device.as_ref());
        argv.opt("verify-parallel", self.verify_parallel.map(|n| n.to_string()));
        argv.opt("threads", self.threads.map(|n| n.to_string()));
        argv.opt("exit-with-parent", self.exit_with_parent.map(|pid| pid.to_string()));
        argv.opt("grant-socket", self.grant_socket.as_ref());
        argv.opt("job-id", self.job_id.as_ref());
        argv.opt("baseline", self.baseline.as_ref());
        argv.opt("baseline-version", self.baseline_version.map(|v| v.to_string()));
        argv.opt("curricula-dir", self.curricula_dir.as_ref());
        argv.opt("curriculum-version", self.curriculum_version.map(|v| v.to_string()));
        argv.opt("memory-cap", self.memory_cap.map(|bytes| bytes.to_string()));
        argv.opt("engine-python", self.engine_python.as_ref());
        argv.opt("vllm-python", self.vllm_python.as_ref());
        argv.opt("env-script", self.env_script.as_ref());
        argv.opt("env-python", self.env_python.as_ref());
        argv.opt("verify-url", self.verify_url.as_ref());
        argv.opt("ray-address", self.ray_address.as_ref());
        argv.opt("ray-python", self.ray_python.as_ref());
        argv.opt("kind", self.kind.map(|kind| kind.as_str()));
        argv.switch("resume", self.resume);
        argv.switch("host-context-stdin", self.host_context_stdin);
        argv.0
    }
}

/// A command line being written: `--name value` flags and `--name` switches after a subcommand.
struct Argv(Vec<OsString>);

impl Argv {
    fn new(subcommand: &str) -> Argv {
        Argv(vec![subcommand.into()])
    }

    fn flag(&mut self, name: &str, value: impl AsRef<std::ffi::OsStr>) {
        self.0.push(format!("--{name}").into());
        self.0.push(value.as_ref().to_owned());
    }

    /// The flag when there is a value.
    fn opt(&mut self, name: &str, value: Option<impl AsRef<std::ffi::OsStr>>) {
        if let Some(value) = value {
            self.flag(name, value);
        }
    }

    fn switch(&mut self, name: &str, on: bool) {
        if on {
            self.0.push(format!("--{name}").into());
        }
    }
}

/// The worker's arguments for a Tinker training client (`rlvr-worker tinker-client`): a base
/// model with the client's LoRA adapter, serving the daemon's commands on stdin
/// (`tinker::process`) until its stdin closes or a suspend.
#[derive(Debug, Clone, PartialEq, Default)]
#[cfg_attr(feature = "cli", derive(clap::Args))]
pub struct TinkerClientArgs {
    /// The base model: a model directory or a built-in model (`builtin:NAME`).
    #[cfg_attr(feature = "cli", arg(long))]
    pub base: String,
    /// What saved adapters name as their base (`base_model_name_or_path`): the SDK's name of it.
    #[cfg_attr(feature = "cli", arg(long))]
    pub base_name: String,
    /// The client's `lora_config`, as the SDK's JSON.
    #[cfg_attr(feature = "cli", arg(long))]
    pub lora: String,
    /// Seeds the adapter's first values.
    #[cfg_attr(feature = "cli", arg(long, default_value_t = 0))]
    pub seed: u64,
    /// Start from what a suspend wrote here instead of a fresh adapter.
    #[cfg_attr(feature = "cli", arg(long, value_name = "DIR", conflicts_with = "from_state"))]
    pub resume: Option<PathBuf>,
    /// Start from a saved state (`save_weights`' or `save_weights_for_sampler`'s directory): its
    /// adapter, and with --with-optimizer its AdamW state.
    #[cfg_attr(feature = "cli", arg(long, value_name = "DIR"))]
    pub from_state: Option<PathBuf>,
    #[cfg_attr(feature = "cli", arg(long, requires = "from_state"))]
    pub with_optimizer: bool,
    /// `cpu`, `cuda` or `cuda:N` [default: cuda when available, else cpu].
    #[cfg_attr(feature = "cli", arg(long))]
    pub device: Option<String>,
    /// libtorch's CPU threads [default: the number of cores].
    #[cfg_attr(feature = "cli", arg(long))]
    pub threads: Option<usize>,
    /// Die with this process (the daemon passes its pid).
    #[cfg_attr(feature = "cli", arg(long, value_name = "PID"))]
    pub exit_with_parent: Option<u32>,
    /// Ask the daemon's scheduler for the device before each command (with --job-id).
    #[cfg_attr(feature = "cli", arg(long, value_name = "SOCKET", requires = "job_id"))]
    pub grant_socket: Option<PathBuf>,
    #[cfg_attr(feature = "cli", arg(long, value_name = "ID", requires = "grant_socket"))]
    pub job_id: Option<String>,
}

impl TinkerClientArgs {
    /// The worker's command line (after the program's name) that parses back into `self`.
    pub fn command_line(&self) -> Vec<OsString> {
        let mut argv = Argv::new("tinker-client");
        argv.flag("base", &self.base);
        argv.flag("base-name", &self.base_name);
        argv.flag("lora", &self.lora);
        argv.flag("seed", self.seed.to_string());
        argv.opt("resume", self.resume.as_ref());
        argv.opt("from-state", self.from_state.as_ref());
        argv.switch("with-optimizer", self.with_optimizer);
        argv.opt("device", self.device.as_ref());
        argv.opt("threads", self.threads.map(|n| n.to_string()));
        argv.opt("exit-with-parent", self.exit_with_parent.map(|pid| pid.to_string()));
        argv.opt("grant-socket", self.grant_socket.as_ref());
        argv.opt("job-id", self.job_id.as_ref());
        argv.0
    }
}

/// The worker's arguments for an environment check (`rlvr-worker env-check`): an `[env]` spec's
/// first episodes played against its environment with its policy, sampled as its rollouts are,
/// each turn shown with what is trained on. Nothing is trained or written. The daemon runs it
/// for `POST /v1/env/check`; a team can run it by hand where its model and server are.
#[derive(Debug, Clone, PartialEq, Default)]
#[cfg_attr(feature = "cli", derive(clap::Args))]
pub struct EnvCheckArgs {
    /// The job spec (TOML, or JSON by extension); its [data] train records start the episodes.
    /// Its policy is a model directory or a built-in model (the daemon resolves line: and base:
    /// names first).
    #[cfg_attr(feature = "cli", arg(long))]
    pub spec: PathBuf,
    /// Episodes to play, one per training record from the first (at most 8).
    #[cfg_attr(feature = "cli", arg(long, default_value_t = 2))]
    pub episodes: usize,
    /// A spec naming an installed environment (`env.environment`): its script, started as a
    /// sandboxed sidecar with --env-python.
    #[cfg_attr(feature = "cli", arg(long, requires = "env_python"))]
    pub env_script: Option<PathBuf>,
    #[cfg_attr(feature = "cli", arg(long, requires = "env_script"))]
    pub env_python: Option<PathBuf>,
    /// Print the check as one JSON line (`EnvCheck`) instead of text.
    #[cfg_attr(feature = "cli", arg(long))]
    pub json: bool,
    /// libtorch's CPU threads [default: the number of cores].
    #[cfg_attr(feature = "cli", arg(long))]
    pub threads: Option<usize>,
    /// Die with this process (the daemon passes its pid): SIGKILL when it exits.
    #[cfg_attr(feature = "cli", arg(long, value_name = "PID"))]
    pub exit_with_parent: Option<u32>,
    /// Read the host context (where the environment may be reached: the team's outbound
    /// policy) as one JSON line from stdin first, as `run` does. Without it: no restriction.
    #[cfg_attr(feature = "cli", arg(long))]
    pub host_context_stdin: bool,
}

impl EnvCheckArgs {
    /// The worker's command line (after the program's name) that parses back into `self`.
    pub fn command_line(&self) -> Vec<OsString> {
        let mut argv = Argv::new("env-check");
        argv.flag("spec", &self.spec);
        argv.flag("episodes", self.episodes.to_string());
        argv.opt("env-script", self.env_script.as_ref());
        argv.opt("env-python", self.env_python.as_ref());
        argv.opt("threads", self.threads.map(|n| n.to_string()));
        argv.opt("exit-with-parent", self.exit_with_parent.map(|pid| pid.to_string()));
        argv.switch("json", self.json);
        argv.switch("host-context-stdin", self.host_context_stdin);
        argv.0
    }
}

/// `rlvr-worker check-options`' one stdout line: what a plugin said of a configuration. The
/// daemon asks a worker process for optimizer plugins, whose code it never maps.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OptionsCheck {
    /// Accepted; the secret names and URLs the options refer to.
    Checked(OptionsReport),
    /// The plugin was built before `check_options`: its options are checked when a worker
    /// creates it.
    NotChecked,
    /// Refused: the key path inside the plugin's options (empty: the whole object) and why.
    Refused {
        /// The key path, e.g. `kl_bta`.
        key: String,
        /// What was wrong and what was expected.
        message: String,
    },
    /// The plugin failed to answer (it panicked, or reported something unreadable).
    Failed {
        /// What happened.
        message: String,
    },
    /// The check could not be made: the library did not load in the worker process.
    Unavailable {
        /// Why.
        message: String,
    },
}

/// The worker's error, the line it also writes to its log as `rlvr-worker: …`, sent on stdout
/// as `{"last_word": "…"}`. Its log is a file on the state directory's disk, and the error that
/// ends a run there is often that disk being full (the line to the log is then lost); stdout is a
/// pipe to the daemon. The daemon takes the last of these over the log's last line.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LastWord {
    pub last_word: String,
}

impl LastWord {
    /// The last `LastWord` line in `stdout`.
    pub fn last_in(stdout: &str) -> Option<String> {
        stdout
            .lines()
            .rev()
            .find_map(|line| serde_json::from_str::<LastWord>(line).ok())
            .map(|word| word.last_word)
    }
}

/// How a worker process ends: its exit status, which the daemon turns into the job's next state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WorkerExit {
    /// Trained to its end (or a budget); the outcome is on stdout. The job is gated.
    Finished,
    /// The job cannot start or go on (its spec, plugins, data, model, or a tripped `[stop]`
    /// condition): the job fails with the worker's last error line.
    JobError,
    /// Not the job's fault (the grant socket failed, a panic in our own code): the daemon counts
    /// a crash and requeues the job, which resumes from its last checkpoint.
    Transient,
    /// Stopped on request (SIGTERM: the daemon is stopping, or preempted the job) after
    /// checkpointing at a step boundary: the job resumes later.
    Interrupted,
    /// The job needed more memory than it may use on its device: its resident size passed
    /// `--memory-cap` (CPU), or libtorch could not allocate (CUDA past the daemon's allocator
    /// cap, or any allocation libtorch reports failed). The last stderr line is an
    /// [`OutOfMemory`] report. Not a crash: the daemon asks for more memory once, or fails the
    /// job naming the numbers.
    OutOfMemory,
}

impl WorkerExit {
    /// Every exit.
    pub const ALL: [WorkerExit; 5] = [
        WorkerExit::Finished,
        WorkerExit::JobError,
        WorkerExit::Transient,
        WorkerExit::Interrupted,
        WorkerExit::OutOfMemory,
    ];

    /// The process exit status (70 is sysexits' EX_SOFTWARE, 75 its EX_TEMPFAIL).
    ///
    /// Out of memory is 71, sysexits' EX_OSERR ("an operating system error … such as the
    /// inability to fork"): the nearest of its kinds to a resource running out. Nothing else that
    /// can end a worker gives 71: not the worker's other exits, not clap (2 for bad arguments),
    /// Rust's runtime (101 for an uncaught panic), the dynamic loader (127) or a signal (128 + n
    /// in a shell, a signal status otherwise); libtorch's own aborts are SIGABRT.
    pub fn code(self) -> u8 {
        match self {
            WorkerExit::Finished => 0,
            WorkerExit::JobError => 2,
            WorkerExit::Transient => 70,
            WorkerExit::OutOfMemory => 71,
            WorkerExit::Interrupted => 75,
        }
    }

    /// The exit a status means; `None` for a status no worker gives (a crash of another kind).
    pub fn from_code(code: i32) -> Option<WorkerExit> {
        WorkerExit::ALL.into_iter().find(|exit| i32::from(exit.code()) == code)
    }
}

/// What a worker that ran out of memory reports: its last stderr line (after `rlvr-worker: `)
/// when it exits [`WorkerExit::OutOfMemory`], written with `Display` and read back with
/// [`OutOfMemory::from_line`]:
///
/// ```text
/// out of memory on cpu in the update phase: peak 1.02 GB (1095761920 bytes), cap 1.00 GB (1073741824 bytes)
/// out of memory on cuda:0 before its first device phase: peak 0.31 GB (332800000 bytes), cap none
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutOfMemory {
    /// The device as the worker names it (`cpu`, `cuda:0`: its own view, under the daemon's
    /// `CUDA_VISIBLE_DEVICES`).
    pub device: String,
    /// The device phase it was in, or the last one it began (verifying on the CPU after a
    /// rollout counts to the rollout); `None` before its first (loading plugins, data and
    /// models).
    pub phase: Option<crate::grants::Phase>,
    /// The most it held: its resident size on a CPU (sampled every 50 ms), libtorch's
    /// allocator's peak on CUDA (`torch.cuda.max_memory_allocated`; the CUDA context is outside).
    pub peak_bytes: u64,
    /// `--memory-cap`; `None` when it ran without one.
    pub cap_bytes: Option<u64>,
}

impl OutOfMemory {
    /// Reads a report back from the line `Display` wrote (with or without `rlvr-worker: `).
    pub fn from_line(line: &str) -> Option<OutOfMemory> {
        let line = line.trim();
        let line = line.strip_prefix("rlvr-worker: ").unwrap_or(line);
        let rest = line.strip_prefix("out of memory on ")?;
        let (device, rest) = rest.split_once(' ')?;
        let (phase, rest) = match rest.strip_prefix("before its first device phase: ") {
            Some(rest) => (None, rest),
            None => {
                let (name, rest) = rest.strip_prefix("in the ")?.split_once(" phase: ")?;
                (Some(crate::grants::Phase::from_name(name)?), rest)
            }
        };
        let (peak, cap) = rest.strip_prefix("peak ")?.split_once(", cap ")?;
        let cap_bytes = if cap == "none" { None } else { Some(bytes_in(cap)?) };
        Some(OutOfMemory { device: device.to_owned(), phase, peak_bytes: bytes_in(peak)?, cap_bytes })
    }

    /// Where it ran out, in words: `in the update phase`, `before its first device phase`.
    pub fn when(&self) -> String {
        match self.phase {
            Some(phase) => format!("in the {phase} phase"),
            None => "before its first device phase".to_owned(),
        }
    }
}

impl std::fmt::Display for OutOfMemory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let gb = |bytes: u64| format!("{:.2} GB ({bytes} bytes)", bytes as f64 / BYTES_PER_GB);
        let cap = self.cap_bytes.map_or_else(|| "none".to_owned(), gb);
        write!(f, "out of memory on {} {}: peak {}, cap {cap}", self.device, self.when(), gb(self.peak_bytes))
    }
}

/// The byte count of `1.02 GB (1095761920 bytes)`.
fn bytes_in(text: &str) -> Option<u64> {
    text.split_once(" (")?.1.strip_suffix(" bytes)")?.parse().ok()
}

/// How a run ended: the worker's one stdout line when it exits [`WorkerExit::Finished`] or
/// [`WorkerExit::Interrupted`].
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Outcome {
    /// Steps completed.
    pub steps: u64,
    /// SHA-256 over the policy's tensors (names sorted, raw bytes): equal runs give equal hashes.
    pub weights_sha256: String,
    /// Held-out accuracy before the first step, when the job has a held-out set.
    pub heldout_before: Option<f64>,
    /// Held-out accuracy of the weights it ended with, when scored in this run.
    pub heldout_after: Option<f64>,
    /// The last checkpoint's directory (its `model/` is what gets published); empty when none.
    #[cfg_attr(feature = "openapi", schema(value_type = String))]
    pub checkpoint: PathBuf,
    /// Why it ended before `budget.max_steps`, if it did.
    pub stopped: Option<String>,
    /// It stopped on a stop request (SIGTERM) with its state checkpointed: resume it to go on.
    pub interrupted: bool,
    /// Training's trend (first steps against the last), when it logged rewards.
    pub training: Option<Trend>,
    /// The gates' evaluation of the candidate against its baseline; not made for an interrupted
    /// run, nor for a job with neither held-out set nor canaries.
    pub evaluation: Option<GateEvaluation>,
    /// The plugins it trained with.
    pub plugins: Vec<PluginUse>,
    /// SHA-256 of each data file, by name (`train`, `heldout`, `canaries`).
    pub data_sha256: BTreeMap<String, String>,
    /// The most memory this run held on its device (as [`OutOfMemory::peak_bytes`] counts it):
    /// what `[resources] memory_gb` must cover. `None` when it could not be read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peak_memory_bytes: Option<u64>,
    /// What a rejection-sampling job wrote (its rows' file and counts): the dataset the daemon
    /// gates and publishes. `None` for a job that trains.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dataset: Option<crate::builtin::SampledDataset>,
    /// The checkpoint offered to the gates (the one `checkpoint` names) and why: the best-scoring
    /// retained one. `None` from a worker that predates the choice (it offered the last).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub candidate: Option<CandidateCheckpoint>,
}

/// Which checkpoint a run offered the gates: the best held-out score among its retained scored
/// checkpoints (ties: the earlier; `crate::checkpoints::best`), or the last when none was scored.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct CandidateCheckpoint {
    /// The chosen checkpoint's step.
    pub step: u64,
    /// Its held-out accuracy when it was scored during training; `None` when the job scored
    /// nothing (no held-out set) and the last checkpoint was offered.
    pub heldout: Option<f64>,
    /// The scored checkpoints it was chosen from (those retained), in step order.
    pub scored: Vec<crate::checkpoints::ScoredCheckpoint>,
}

/// A plugin a run used: what the manifest records.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct PluginUse {
    /// `name@version`.
    pub id: String,
    /// SHA-256 of the library, hex.
    pub sha256: String,
    /// SHA-256 of content its options carry (a `python` grader's `source`), hex, by option key,
    /// as the plugin's `check_options` reports them.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub digests: BTreeMap<String, String>,
}

/// Training's trend: the mean of the first steps against the mean of the last ones (a window of
/// five each), what the gates' reward-hacking and KL criteria read.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Trend {
    /// Training steps that logged a reward.
    pub steps: usize,
    /// Mean reward of the first steps.
    pub reward_first: f64,
    /// Mean reward of the last steps.
    pub reward_last: f64,
    /// Mean `kl_ref` of the last steps that measured it; `None` when none did.
    pub kl_last: Option<f64>,
    /// Mean completion length of the first steps.
    pub length_first: f64,
    /// Mean completion length of the last steps.
    pub length_last: f64,
}

/// What the candidate is compared with (design.md §6).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum BaselineKind {
    /// The model line's published version when the run started.
    Published,
    /// The job's starting checkpoint (the line has no version yet, or a run by hand).
    Start,
}

/// The candidate's baseline.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Baseline {
    /// Published version or starting checkpoint.
    pub kind: BaselineKind,
    /// The model directory (or `builtin:…`) scored.
    pub model: String,
    /// The published version, for [`BaselineKind::Published`].
    pub version: Option<u64>,
}

/// The gates' evaluation, made by the worker once training ends: held-out and canary scores of
/// the candidate and of its baseline, the canaries the baseline passed and the candidate fails,
/// and training's trend. The daemon judges it (`jobs::gate::judge`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct GateEvaluation {
    /// What the candidate was compared with.
    pub baseline: Baseline,
    /// The trained model's scores.
    pub candidate: ModelScores,
    /// The baseline's scores.
    pub baseline_scores: ModelScores,
    /// Canaries the baseline passed and the candidate fails.
    pub canary_regressions: CanaryRegressions,
    /// Training's trend.
    pub training: Option<Trend>,
}

/// One model's scores on the gates' sets.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ModelScores {
    /// On the held-out set (its first `eval.max_prompts`), when the job has one.
    pub heldout: Option<GateScore>,
    /// On the canaries, when the job has them.
    pub canaries: Option<GateScore>,
}

/// A score as the gates see it: the figures, and how the verifiers fared.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct GateScore {
    /// Accuracy, reward, length, prompts.
    #[serde(flatten)]
    pub figures: ScoreFigures,
    /// Verifier calls made.
    pub verifier_calls: usize,
    /// Calls that came back with an error (timeouts not included).
    pub verifier_errors: usize,
    /// Calls that timed out.
    pub verifier_timeouts: usize,
    /// Whether each prompt passed, in the set's order: what pairs the candidate's verdicts with
    /// the baseline's for the held-out gain's interval. Empty in records made before it.
    #[serde(default, skip_serializing_if = "Verdicts::is_empty")]
    #[cfg_attr(feature = "openapi", schema(value_type = String))]
    pub passed: Verdicts,
}

/// Per-prompt verdicts in a set's order, written as a string of `1` (passed) and `0`: a held-out
/// set of thousands of prompts stays a short field of the outcome line and of the job record.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Verdicts(pub Vec<bool>);

/// As a count (`Verdicts(312 of 400 passed)`): the gates' evaluation is logged with its scores,
/// and a line of 400 booleans said less than the count.
impl std::fmt::Debug for Verdicts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let passed = self.0.iter().filter(|passed| **passed).count();
        write!(f, "Verdicts({passed} of {} passed)", self.0.len())
    }
}

impl Verdicts {
    /// No verdicts (a record made before they were reported).
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl Serialize for Verdicts {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let text: String = self.0.iter().map(|passed| if *passed { '1' } else { '0' }).collect();
        serializer.serialize_str(&text)
    }
}

impl<'de> Deserialize<'de> for Verdicts {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        text.chars()
            .map(|c| match c {
                '1' => Ok(true),
                '0' => Ok(false),
                other => Err(serde::de::Error::custom(format!("a verdict is 0 or 1, not {other:?}"))),
            })
            .collect::<Result<Vec<bool>, _>>()
            .map(Verdicts)
    }
}

/// A model's greedy score on a set of prompts.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ScoreFigures {
    /// Fraction of prompts whose completion passed every weighted verifier.
    pub accuracy: f64,
    /// Mean weighted reward.
    pub reward_mean: f64,
    /// Mean completion length, in tokens.
    pub completion_len_mean: f64,
    /// Prompts scored.
    pub prompts: usize,
}

/// The canaries that regressed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct CanaryRegressions {
    /// How many.
    pub count: usize,
    /// The first 20 ids.
    pub ids: Vec<String>,
}

/// One line of `metrics.jsonl`: a training step's figures, a held-out evaluation, or both.
///
/// Not `deny_unknown_fields`, and every figure optional: a line is read by a newer daemon or
/// report than the worker that wrote it. Figures an optimizer plugin reports under its own
/// names (its loss terms, `opt.*` from its advantages) are in `optimizer`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct MetricsLine {
    /// The step (0: before training).
    pub step: u64,
    /// Mean reward of the batch trained on (online training).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reward_mean: Option<f64>,
    /// Its standard deviation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reward_std: Option<f64>,
    /// Fraction of completions that passed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub passed_frac: Option<f64>,
    /// Mean score of each verifier, by name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub components: Option<BTreeMap<String, f64>>,
    /// Fraction of the step's first round of groups whose completions all passed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub all_pass_frac: Option<f64>,
    /// … all failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub all_fail_frac: Option<f64>,
    /// Mean completion length, in tokens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completion_len_mean: Option<f64>,
    /// Longest completion, in tokens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completion_len_max: Option<f64>,
    /// Fraction of completions cut at `rollout.max_new_tokens`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cut_frac: Option<f64>,
    /// Completion tokens sampled this step, every round.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens_generated: Option<u64>,
    /// Estimated entropy of the sampling distribution (mean −log p of sampled tokens).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub entropy: Option<f64>,
    /// KL to the reference (k3 estimator), when the job has a reference.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kl_ref: Option<f64>,
    /// The first update's importance ratio against the sampler: the mean over the batch's
    /// tokens of exp(training log-probability − sampler's), 1 where the two computations agree.
    /// With μ = 1 the sampler's log-probabilities are the old policy's, so this is the ratio the
    /// first clipped objective starts from; decoding and training kernels round differently (on
    /// a GPU, in bf16 most of all).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ratio_first_update_mean: Option<f64>,
    /// … the largest |training − sampler's log-probability| over those tokens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub log_ratio_first_update_max_abs: Option<f64>,
    /// `rollout.engine = "vllm"`: how far the server's log-probabilities of the sampled tokens
    /// are from the trainer's, and the truncated importance weights that correct for it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sampler_gap: Option<SamplerGap>,
    /// `rollout.off_policy_steps`: updates between the weights that sampled this step's batch
    /// and the weights it trains (0: the first step of a process, sampled before anything
    /// overlapped; 1: sampled while the step before updated). The sampler gap and the ratio's
    /// denominator are those weights'.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy_lag: Option<u64>,
    /// Completions verified.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verified: Option<usize>,
    /// Verifier calls that timed out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verifier_timeouts: Option<u64>,
    /// Completions with a verifier error.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verifier_errors: Option<usize>,
    /// An `[engine]` job's: the most answers of "busy" (429, or 503) any rank's grading requests
    /// met this step, each waited out and retried (its grading lane is sized by its ranks).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verifier_busy: Option<u64>,
    /// What dynamic sampling did, when on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dynamic_sampling: Option<DynamicSampling>,
    /// A multi-turn job's episodes (`[env]`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub env: Option<EnvFigures>,
    /// Rows trained on (offline training).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rows: Option<usize>,
    /// Completion tokens trained on (offline training).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub train_tokens: Option<u64>,
    /// Forward/backward passes of each update (`[optimizer] micro_batch_size` and
    /// `micro_batch_tokens` decide them).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub micro_batches: Option<usize>,
    /// The loss of the step's last update.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub loss: Option<f64>,
    /// The gradient norm before clipping.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grad_norm: Option<f64>,
    /// The learning rate of the step.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lr: Option<f64>,
    /// Where the step's time went.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time: Option<StepTimes>,
    /// The most the job's process has held on its device up to the end of this step: libtorch's
    /// allocator peak on CUDA (`max_memory_allocated`), the largest resident size sampled on a
    /// CPU. A measurement, like `time`: it differs between a run and its resume.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peak_memory_bytes: Option<u64>,
    /// An `[engine]` job's: the bytes of model its largest rank holds at the step's end, its
    /// parameters and optimizer state (a whole copy under `engine.strategy = "ddp"`, a shard of
    /// 1/ranks under `"fsdp2"`). There `peak_memory_bytes` is the largest rank's since its
    /// training began (the model loaded, and sharded under FSDP2).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rank_state_bytes: Option<u64>,
    /// The held-out score of the weights after this step (or before training, at step 0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub heldout: Option<ScoreFigures>,
    /// The optimizer plugin's own figures, by the names it gives them (`null` where one was not
    /// a finite number: JSON has no NaN).
    #[serde(flatten)]
    pub optimizer: BTreeMap<String, Option<f64>>,
}

impl MetricsLine {
    /// Whether the line is a training step's (not a held-out evaluation alone).
    pub fn is_step(&self) -> bool {
        self.reward_mean.is_some() || self.loss.is_some()
    }

    /// Every number of the line but `step`, named by its path in the line's JSON joined with
    /// `/` (`reward_mean`, `heldout/accuracy`, `components/math`, `time/verifier_latency_us/p50`),
    /// sorted by name: what the TensorBoard files and MLflow runs chart, so a figure added here
    /// reaches both and neither renames one by hand. Nulls, strings and lists are not figures.
    pub fn figures(&self) -> Vec<(String, f64)> {
        fn collect(path: String, value: &serde_json::Value, out: &mut Vec<(String, f64)>) {
            match value {
                serde_json::Value::Number(number) => out.extend(number.as_f64().map(|value| (path, value))),
                serde_json::Value::Object(fields) => {
                    for (key, value) in fields {
                        let path = if path.is_empty() { key.clone() } else { format!("{path}/{key}") };
                        collect(path, value, out);
                    }
                }
                _ => {}
            }
        }
        let mut out = Vec::new();
        if let Ok(serde_json::Value::Object(mut fields)) = serde_json::to_value(self) {
            fields.remove("step");
            collect(String::new(), &serde_json::Value::Object(fields), &mut out);
        }
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out
    }
}

/// One line of `rollouts.jsonl`: one sampled completion with everything that decided its reward
/// and its update, so a run can be audited and replayed; the shared curricula's refresh reads the
/// prompt and the verdict.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RolloutRecord {
    /// The step that trained on it.
    pub step: u64,
    /// The step whose weights sampled it.
    pub checkpoint_step: u64,
    /// The data record's id.
    pub prompt_id: String,
    /// `<step>-<group index>`: the completions of one prompt in one step.
    pub group_id: String,
    /// Unique per completion.
    pub completion_id: String,
    /// The prompt, as the data gave it.
    pub prompt: String,
    /// The completion's text.
    pub completion: String,
    /// Tokens of the rendered prompt.
    pub prompt_tokens: usize,
    /// Tokens of the completion.
    pub completion_tokens: usize,
    /// `eos`, `stop` or `length`; an episode's end (`episode.end`).
    pub finish: String,
    /// The weighted reward.
    pub reward: f64,
    /// Whether it passed every weighted verifier.
    pub passed: bool,
    /// Each verifier's score, by name.
    pub components: BTreeMap<String, f64>,
    /// What each verifier graded, by name.
    pub extracted: BTreeMap<String, Option<String>>,
    /// Verifier errors, in words.
    pub errors: Vec<String>,
    /// The verifiers' `name@version`s.
    pub verifiers: Vec<String>,
    /// The advantage it was trained with (mean over its tokens).
    pub advantage: f64,
    /// Σ log-probability of its tokens.
    pub logprob: RolloutLogprobs,
    /// How it was sampled.
    pub sampling: RolloutSampling,
    /// A multi-turn job's episode (`[env]`): `completion` is its text, turns and replies.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub episode: Option<EpisodeRecord>,
}

/// A completion's summed log-probabilities.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RolloutLogprobs {
    /// Under the policy being trained, at its first update.
    pub policy: Option<f64>,
    /// At sampling time.
    pub old: f64,
    /// Under the reference, when there is one.
    pub reference: Option<f64>,
}

/// The sampling settings of a completion.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RolloutSampling {
    /// `rollout.temperature`.
    pub temperature: f64,
    /// `rollout.top_p`.
    pub top_p: f64,
    /// `rollout.top_k`.
    pub top_k: u32,
    /// `rollout.max_new_tokens`.
    pub max_new_tokens: u32,
}

/// A step's gap between the log-probabilities of its sampled tokens as the rollout engine
/// reported them (the behaviour policy) and as the trainer computes them before its update (the
/// old policy), over every token trained on. With the engine's weights synced, the two differ
/// only by kernels' rounding; a sync that did not take shows as a jump (`rollout.max_logprob_gap`).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct SamplerGap {
    /// Mean |trainer − engine|: what `rollout.max_logprob_gap` bounds.
    pub mean_abs: f64,
    /// Largest |trainer − engine|.
    pub max_abs: f64,
    /// KL(engine ‖ trainer), k3 estimator over the sampled tokens: mean of exp(d) − 1 − d with
    /// d = trainer − engine.
    pub k3: f64,
    /// Mean truncated importance weight min(exp(d), `rollout.importance_cap`) (1 when off).
    pub importance_weight_mean: f64,
    /// Fraction of tokens whose weight the cap cut.
    pub importance_capped_frac: f64,
}

/// What dynamic sampling did in a step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct DynamicSampling {
    /// Rounds sampled after the first.
    pub extra_rounds: u32,
    /// Groups sampled, every round.
    pub groups_sampled: usize,
    /// Groups trained on.
    pub groups_trained: usize,
}

/// What a step's episodes did against the environment (`[env]`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct EnvFigures {
    /// Episodes played.
    pub episodes: usize,
    /// Model turns per episode, on average.
    pub turns_mean: f64,
    /// The environment's reward per episode, on average (`env.reward`, before any grader's).
    pub reward_mean: f64,
    /// Wall-clock seconds the rollout waited on the environment (sessions opened and reset, each
    /// turn's steps), and that time's share of the rollout's.
    pub env_s: f64,
    pub env_share: f64,
    /// Episodes the environment ended (`done`).
    pub done: usize,
    /// Episodes that reached `env.max_turns`, or a turn cut at `rollout.max_new_tokens`.
    pub max_turns: usize,
    pub token_budget: usize,
    /// Episodes ended by a turn that was not an action, or an action the environment's schema
    /// refused (the model's fault: the tool errors).
    pub not_an_action: usize,
    /// Episodes ended because the chat template rendered the conversation otherwise than its
    /// tokens (never trained on re-tokenized).
    pub prefix_breaks: usize,
    /// Episodes ended by the environment's failure (its code's error, a timeout, a lost session).
    pub env_errors: usize,
}

/// One episode of a multi-turn job (`[env]`): every token after the prompt, which of them the
/// model sampled, and how it went.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct EpisodeRecord {
    pub turns: usize,
    /// `done`, `max_turns`, `token_budget`, `not_an_action`, `prefix_break` or `env_error`.
    pub end: String,
    /// What went wrong, for the last three.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub problem: Option<String>,
    /// The environment's reward of each step.
    pub rewards: Vec<f64>,
    /// The rendered prompt's tokens (the environment's first observation).
    pub prompt_tokens: Vec<i64>,
    /// Turns and replies, as trained on.
    pub tokens: Vec<i64>,
    /// Per token: 1 sampled by the model (trained on), 0 the environment's reply (masked out).
    pub mask: Vec<u8>,
    /// Per token: the sampler's log-probability (0 for the environment's).
    pub logprobs: Vec<f32>,
}

/// Where a step's time went, in seconds.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct StepTimes {
    /// Sampling.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollout_s: Option<f64>,
    /// Verification.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verify_s: Option<f64>,
    /// Log-probabilities, losses and optimizer steps.
    pub update_s: f64,
    /// `rollout.engine = "vllm"`: writing the updated weights and loading them into the server.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sync_s: Option<f64>,
    /// The whole step.
    pub step_s: f64,
    /// Sampled tokens per second of rollout.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generation_tokens_per_s: Option<f64>,
    /// Verifier latency quantiles, in microseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verifier_latency_us: Option<Latency>,
}

/// Latency quantiles; `None` when nothing was measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Latency {
    /// Median.
    pub p50: Option<u64>,
    /// 99th percentile.
    pub p99: Option<u64>,
}

/// A running job's live state: `progress.json`, rewritten (atomically) by the worker after each
/// step and read by the daemon for the job record and its events.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Progress {
    /// Steps completed.
    pub step: u64,
    /// `budget.max_steps`.
    pub max_steps: u64,
    /// The last step's mean reward (online training).
    pub reward: Option<f64>,
    /// The last step's loss.
    pub loss: Option<f64>,
    /// The last step's KL to the reference.
    pub kl: Option<f64>,
    /// The latest held-out accuracy.
    pub heldout: Option<f64>,
    /// The last step's sampling speed.
    pub tokens_per_s: Option<f64>,
    /// The last step's duration.
    pub step_s: Option<f64>,
    /// Seconds until the job ends: the steps left at this run's pace, capped by what is left of
    /// `budget.max_wall_minutes`; `None` before this run's first step.
    pub eta_s: Option<f64>,
    /// Why the job may not be learning: steps whose every group was all-fail or all-pass.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<crate::signals::GroupWarning>,
    /// An `[engine]` job launched by Ray: the cluster job this run submitted (its Jobs API
    /// submission id: `ray job status`, `ray job logs`, and what the daemon stops when the worker
    /// is gone).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub engine_submission: Option<String>,
}

#[cfg(test)]
mod tests {

    #[test]
    fn verdicts_show_as_a_count_in_logs() {
        let verdicts = Verdicts([true, false, true].repeat(100));
        assert_eq!(format!("{verdicts:?}"), "Verdicts(200 of 300 passed)");
    }

    use super::*;

    #[test]
    fn every_exit_status_reads_back_as_itself() {
        for exit in WorkerExit::ALL {
            assert_eq!(WorkerExit::from_code(i32::from(exit.code())), Some(exit));
        }
        assert_eq!(WorkerExit::from_code(1), None);
    }

    /// The out-of-memory line reads back as the report it was written from, in every shape.
    #[test]
    fn an_out_of_memory_report_reads_back_from_its_line() {
        use crate::grants::Phase;
        let reports = [
            OutOfMemory {
                device: "cpu".into(),
                phase: Some(Phase::Update),
                peak_bytes: 1_095_761_920,
                cap_bytes: Some(1 << 30),
            },
            OutOfMemory { device: "cuda:0".into(), phase: None, peak_bytes: 332_800_000, cap_bytes: None },
            OutOfMemory {
                device: "cpu".into(),
                phase: Some(Phase::Rollout),
                peak_bytes: 0,
                cap_bytes: Some(0),
            },
            OutOfMemory {
                device: "cuda:1".into(),
                phase: Some(Phase::Eval),
                peak_bytes: u64::MAX,
                cap_bytes: None,
            },
        ];
        for report in reports {
            let line = report.to_string();
            assert_eq!(OutOfMemory::from_line(&line), Some(report.clone()), "{line}");
            assert_eq!(OutOfMemory::from_line(&format!("rlvr-worker: {line}\n")), Some(report), "{line}");
        }
        assert_eq!(
            OutOfMemory {
                device: "cpu".into(),
                phase: Some(Phase::Update),
                peak_bytes: 1_095_761_920,
                cap_bytes: Some(1 << 30)
            }
            .to_string(),
            "out of memory on cpu in the update phase: peak 1.02 GB (1095761920 bytes), cap 1.00 GB (1073741824 bytes)"
        );
        for other in [
            "",
            "internal error (a panic, reported above); the last checkpoint is intact",
            "out of memory on cpu in the warmup phase: peak 1.00 GB (1 bytes), cap none",
            "out of memory on cpu in the update phase: peak 1.00 GB (x bytes), cap none",
            "out of memory on cpu in the update phase: peak 1.00 GB (1 bytes)",
        ] {
            assert_eq!(OutOfMemory::from_line(other), None, "{other}");
        }
    }

    #[test]
    fn verdicts_are_a_string_of_ones_and_zeros_and_nothing_else() {
        let verdicts = Verdicts(vec![true, false, true]);
        assert_eq!(serde_json::to_string(&verdicts).unwrap(), r#""101""#);
        assert_eq!(serde_json::from_str::<Verdicts>(r#""101""#).unwrap(), verdicts);
        assert_eq!(serde_json::from_str::<Verdicts>(r#""""#).unwrap(), Verdicts::default());
        let error = serde_json::from_str::<Verdicts>(r#""10x""#).unwrap_err().to_string();
        assert!(error.contains("a verdict is 0 or 1, not 'x'"), "{error}");
        // A score written before verdicts were reported reads with none.
        let old = r#"{"accuracy": 0.5, "reward_mean": 0.5, "completion_len_mean": 3.0, "prompts": 2,
            "verifier_calls": 2, "verifier_errors": 0, "verifier_timeouts": 0}"#;
        assert!(serde_json::from_str::<GateScore>(old).unwrap().passed.is_empty());
    }

    /// Every file and stdout message of the worker, fully populated, written as the worker
    /// writes it and read back as the daemon reads it: nothing is lost or renamed on the way.
    #[test]
    fn every_worker_message_round_trips() {
        fn check<T: Serialize + serde::de::DeserializeOwned + PartialEq + std::fmt::Debug>(message: T) {
            let line = serde_json::to_string(&message).unwrap();
            assert!(!line.contains('\n'), "one line: {line}");
            assert_eq!(serde_json::from_str::<T>(&line).unwrap(), message, "{line}");
        }
        let figures =
            ScoreFigures { accuracy: 0.5, reward_mean: 0.625, completion_len_mean: 3.25, prompts: 8 };
        let score = GateScore {
            figures: figures.clone(),
            verifier_calls: 16,
            verifier_errors: 1,
            verifier_timeouts: 2,
            passed: Verdicts(vec![true, false, false, true, true, false, true, false]),
        };
        let trend = Trend {
            steps: 12,
            reward_first: 0.1,
            reward_last: 0.4,
            kl_last: Some(0.02),
            length_first: 3.0,
            length_last: 3.5,
        };
        check(Outcome {
            steps: 12,
            weights_sha256: "ab".repeat(32),
            heldout_before: Some(0.25),
            heldout_after: None,
            checkpoint: "/jobs/a/run/checkpoints/step-00000012".into(),
            stopped: Some("budget.max_wall_minutes: 1 reached".into()),
            interrupted: false,
            training: Some(trend),
            evaluation: Some(GateEvaluation {
                baseline: Baseline {
                    kind: BaselineKind::Published,
                    model: "/registry/line/3".into(),
                    version: Some(3),
                },
                candidate: ModelScores { heldout: Some(score.clone()), canaries: Some(score.clone()) },
                baseline_scores: ModelScores { heldout: Some(score), canaries: None },
                canary_regressions: CanaryRegressions { count: 1, ids: vec!["c7".into()] },
                training: Some(trend),
            }),
            plugins: vec![PluginUse {
                id: "grpo@0.1.0".into(),
                sha256: "cd".repeat(32),
                digests: BTreeMap::new(),
            }],
            data_sha256: [("train".to_owned(), "ef".repeat(32))].into(),
            peak_memory_bytes: Some(1_095_761_920),
            candidate: Some(CandidateCheckpoint {
                step: 8,
                heldout: Some(0.5),
                scored: vec![
                    crate::checkpoints::ScoredCheckpoint { step: 8, accuracy: 0.5 },
                    crate::checkpoints::ScoredCheckpoint { step: 12, accuracy: 0.25 },
                ],
            }),
            dataset: None,
        });
        check(MetricsLine {
            step: 3,
            reward_mean: Some(0.5),
            reward_std: Some(0.25),
            passed_frac: Some(0.5),
            components: Some([("math".to_owned(), 0.5)].into()),
            all_pass_frac: Some(0.125),
            all_fail_frac: Some(0.25),
            completion_len_mean: Some(3.5),
            completion_len_max: Some(5.0),
            cut_frac: Some(0.0),
            tokens_generated: Some(112),
            env: Some(EnvFigures {
                episodes: 8,
                turns_mean: 1.5,
                reward_mean: 0.25,
                env_s: 0.5,
                env_share: 0.125,
                done: 5,
                max_turns: 1,
                token_budget: 1,
                not_an_action: 1,
                prefix_breaks: 0,
                env_errors: 0,
            }),
            entropy: Some(0.66),
            kl_ref: Some(0.01),
            ratio_first_update_mean: Some(1.0000003),
            log_ratio_first_update_max_abs: Some(2.4e-6),
            sampler_gap: Some(SamplerGap {
                mean_abs: 1.2e-5,
                max_abs: 3.1e-4,
                k3: 1e-9,
                importance_weight_mean: 1.0,
                importance_capped_frac: 0.0,
            }),
            policy_lag: Some(1),
            verified: Some(32),
            verifier_timeouts: Some(0),
            verifier_errors: Some(1),
            verifier_busy: Some(2),
            dynamic_sampling: Some(DynamicSampling {
                extra_rounds: 1,
                groups_sampled: 12,
                groups_trained: 8,
            }),
            rows: None,
            train_tokens: None,
            micro_batches: Some(2),
            loss: Some(-0.0125),
            grad_norm: Some(0.75),
            lr: Some(1e-3),
            time: Some(StepTimes {
                rollout_s: Some(0.05),
                verify_s: Some(0.01),
                update_s: 0.2,
                sync_s: Some(0.04),
                step_s: 0.3,
                generation_tokens_per_s: Some(2240.0),
                verifier_latency_us: Some(Latency { p50: Some(13), p99: None }),
            }),
            peak_memory_bytes: Some(1 << 30),
            rank_state_bytes: Some(1 << 28),
            heldout: Some(figures),
            optimizer: [("opt.clip_frac_low".to_owned(), Some(0.0)), ("opt.ratio_mean".to_owned(), None)]
                .into(),
        });
        check(MetricsLine { step: 2, rows: Some(64), train_tokens: Some(300), ..MetricsLine::default() });
        check(Progress {
            engine_submission: Some("rlvr-01J-1796074198853".to_owned()),
            step: 3,
            max_steps: 60,
            reward: Some(0.5),
            loss: None,
            kl: Some(0.01),
            heldout: Some(0.25),
            tokens_per_s: Some(2240.0),
            step_s: Some(0.3),
            eta_s: Some(17.1),
            warnings: crate::signals::GroupSignals::of(&[MetricsLine {
                step: 3,
                all_fail_frac: Some(1.0),
                all_pass_frac: Some(0.0),
                ..MetricsLine::default()
            }])
            .warnings(),
        });
        check(RolloutRecord {
            step: 3,
            checkpoint_step: 2,
            prompt_id: "p1".into(),
            group_id: "3-0".into(),
            completion_id: "3-0-1".into(),
            prompt: "2+2=".into(),
            completion: "4".into(),
            prompt_tokens: 6,
            completion_tokens: 2,
            finish: "eos".into(),
            reward: 1.0,
            passed: true,
            components: [("math".to_owned(), 1.0)].into(),
            extracted: [("math".to_owned(), Some("4".to_owned())), ("format".to_owned(), None)].into(),
            errors: vec!["http: timed out".into()],
            verifiers: vec!["math@0.1.0".into()],
            advantage: 0.5,
            logprob: RolloutLogprobs { policy: Some(-1.5), old: -1.5, reference: None },
            sampling: RolloutSampling { temperature: 1.0, top_p: 1.0, top_k: 0, max_new_tokens: 5 },
            episode: Some(EpisodeRecord {
                turns: 2,
                end: "done".into(),
                problem: None,
                rewards: vec![0.0, 1.0],
                prompt_tokens: vec![5, 6],
                tokens: vec![7, 8, 9, 10],
                mask: vec![1, 0, 0, 1],
                logprobs: vec![-0.5, 0.0, 0.0, -0.25],
            }),
        });
    }
}
