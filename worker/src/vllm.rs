//! `[rollout] engine = "vllm"`: a job's completions sampled by a vLLM server, a child of the
//! worker, whose weights follow the trainer's after every update.
//!
//! **The server.** vLLM's own OpenAI-compatible server (`python -m
//! vllm.entrypoints.openai.api_server`) from the environment `scripts/vllm-venv.sh` makes (the
//! daemon's `engines.vllm_python`, `--vllm-python`), started once per worker run, its API on a Unix socket in a
//! private directory of its own (only the worker may call its weight-loading routes), with the
//! run's directory as its home: `<run>/vllm/` holds its log, the
//! worker extension (`engines/vllm/rlvr_vllm_worker.py`, built into this binary so the server
//! always runs the extension of the worker that drives it) and the weights it serves. It runs in
//! its own process group and dies with the worker: the group is killed when the run ends, is
//! stopped or fails, and a `kill -9` of the worker kills the server (`PR_SET_PDEATHSIG`) and the
//! server its children (`engines/vllm/sitecustomize.py`: vLLM's engine core outlives its server
//! otherwise).
//!
//! **Our tokens stay the truth.** Prompts go as token ids (our tokenizer and chat template
//! encoded them); the completions come back as token ids with the log-probability of each, and
//! are ended by our sampler's rules (`rlvr_model::Sampled::ended`: EOS, stop strings, length),
//! never re-tokenized. Each prompt is one request of `n = group_size` with a seed drawn from the
//! job's seeded stream, so a resume draws the same seeds; vLLM's kernels are not bit-exact across
//! batchings, so a vLLM job resumes exactly only up to sampling.
//!
//! **Sync, checked.** After each update the trainer's weights are written as a Hugging Face
//! directory, the extension reloads them in place (and rebuilds a tied output layer from the
//! embeddings, which vLLM's own reload leaves stale on CPU) and the prefix cache is emptied
//! (cached prompts would keep the old weights' keys and values). Neither is assumed to have
//! worked: the step that samples next compares vLLM's log-probabilities of its tokens with the
//! trainer's (`step::sampler_gap`, `rollout.max_logprob_gap`).
//!
//! A LoRA job loads its base once and each step's adapters under a new name (`step-N`): vLLM keys
//! its prefix cache by adapter, so nothing cached survives a sync, and the base is never reloaded.
//!
//! **Sized, and whole prompts.** The server's KV cache is a step's rows at their longest, in whole
//! blocks (`rlvr_protocol::memory::vllm_kv_cache_bytes`, which the job's memory estimate counts),
//! not vLLM's default share of the device, and a step's rows decode as one batch; prompts are
//! prefilled whole (vLLM 0.26's CPU build crashes
//! rewinding a seeded request's generator after a chunked prefill).
//!
//! `RLVR_VLLM_SYNC_FAULT` (tests only) leaves out one part of the sync, `prefix-cache` or
//! `tied-output`, to show the check catches each.

use std::io::Write;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use rlvr_model::{LoadedModel, Sampled, SamplerRng, SamplingParams, Tokenizer};
use rlvr_protocol::spec::Dtype;
use serde::Deserialize;
use serde_json::json;
use tracing::{info, warn};

use crate::WorkerError;

/// The extension, written next to the run at each start.
const WORKER_EXTENSION: &str = include_str!("../../engines/vllm/rlvr_vllm_worker.py");
/// Makes each of the server's processes die with its parent: written next to the extension, on the
/// server's PYTHONPATH, so every python process of the server imports it first.
const SITE_CUSTOMIZE: &str = include_str!("../../engines/vllm/sitecustomize.py");
/// Its module and class, as `--worker-extension-cls` names them.
const WORKER_EXTENSION_CLASS: &str = "rlvr_vllm_worker.RlvrWorkerExtension";
/// The name the server serves the policy under.
const SERVED_NAME: &str = "policy";
/// How long the server may take to answer `/health` after its start (37–66 s on 2 cores).
const START_TIMEOUT: Duration = Duration::from_secs(900);
/// One sampling request's limit: a step's prompts are sampled at once, each a request.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(1800);
/// One prompt's group, or why it has none.
type GroupAnswer = Result<RawGroup, VllmError>;

/// Sampling requests in flight at once (one per prompt).
const REQUESTS_AT_ONCE: usize = 64;
/// The fault a test asks for (`RLVR_VLLM_SYNC_FAULT`).
pub const SYNC_FAULT_ENV: &str = "RLVR_VLLM_SYNC_FAULT";

/// Which part of the sync a test leaves out, to see the check trip.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SyncFault {
    /// The prefix cache is not emptied after a reload.
    PrefixCache,
    /// vLLM's own reload: a tied output layer keeps the old embeddings.
    TiedOutput,
}

impl SyncFault {
    fn from_env() -> Option<SyncFault> {
        match std::env::var(SYNC_FAULT_ENV).ok()?.as_str() {
            "prefix-cache" => Some(SyncFault::PrefixCache),
            "tied-output" => Some(SyncFault::TiedOutput),
            other => {
                warn!(value = other, "{SYNC_FAULT_ENV}: expected prefix-cache or tied-output; ignored");
                None
            }
        }
    }
}

/// The vLLM server of a run.
pub struct VllmServer {
    child: Child,
    api: Api,
    dir: PathBuf,
    /// Where its socket is; removed when the server is (after `drop` has killed it).
    _socket_dir: tempfile::TempDir,
    /// What the server samples from.
    served: Served,
    fault: Option<SyncFault>,
    /// Sleeps between rollouts ([`sleeps_between_rollouts`]), is asleep now, and the step whose
    /// weights it loads when it wakes.
    sleeps: bool,
    asleep: bool,
    behind: Option<u64>,
}

/// What the server samples from now.
enum Served {
    /// The whole model, reloaded in place after each update (`weights-N/`).
    Weights,
    /// A LoRA job: the base, loaded once (`base/`), and each step's adapters under a new name
    /// (`adapter-N/`, served as `step-N`): vLLM keys its prefix cache by adapter, so a new name
    /// starts with none, and the base is never touched again.
    Adapter { base: PathBuf, name: String },
}

impl Served {
    /// The `model` a request names.
    fn model(&self) -> &str {
        match self {
            Served::Weights => SERVED_NAME,
            Served::Adapter { name, .. } => name,
        }
    }
}

/// The server's HTTP API (on its Unix socket); cheap to clone into a thread that samples.
#[derive(Clone)]
struct Api {
    client: reqwest::blocking::Client,
    /// The URLs' scheme and host (the client connects to the server's Unix socket).
    base: String,
}

/// A prompt's completions as the server sent them: each one's token ids and their
/// log-probabilities, in the group's order, not yet ended by our rules.
type RawGroup = Vec<(Vec<i64>, Vec<f32>)>;

/// Sampling under way in a thread of its own ([`VllmServer::generate_in_background`]).
pub struct Generation {
    thread: std::thread::JoinHandle<(Result<Vec<RawGroup>, VllmError>, f64)>,
}

/// The LoRA ranks vLLM 0.26 can be started for (`--max-lora-rank`).
const VLLM_LORA_RANKS: [i64; 9] = [1, 8, 16, 32, 64, 128, 256, 320, 512];

/// Why the server could not start, sample or sync.
#[derive(Debug, thiserror::Error)]
pub enum VllmError {
    #[error("vllm: cannot write {path}: {message}")]
    Files { path: PathBuf, message: String },
    #[error("vllm: cannot start {python}: {message}")]
    Spawn { python: PathBuf, message: String },
    #[error("vllm: the server {0}{cause}; its log: {log}", cause = cause(.1), log = .1.display())]
    Exited(String, PathBuf),
    #[error("vllm: {0}")]
    Request(String),
}

impl From<VllmError> for WorkerError {
    fn from(error: VllmError) -> WorkerError {
        WorkerError::Model { field: "rollout.engine", message: error.to_string() }
    }
}

/// What the server's start takes from the job.
pub struct ServerSpec<'a> {
    pub python: &'a Path,
    pub run_dir: &'a Path,
    pub dtype: Dtype,
    /// The longest prompt plus `max_new_tokens`: the longest sequence the server takes.
    pub max_model_len: usize,
    /// Its KV cache (`rlvr_protocol::memory::vllm_kv_cache_bytes`, which the job's estimate
    /// counts too): a step's rows at their longest, not vLLM's default share of the device.
    pub kv_cache_bytes: u64,
    /// A step's rows (prompts × group size): the sequences the server decodes at once (see
    /// [`MAX_NUM_SEQS`]).
    pub rows: usize,
    pub seed: u64,
    pub threads: usize,
    /// One step off policy: the server takes the last of the worker's devices, the trainer the
    /// first (`rollout.off_policy_steps`, `resources.devices = 2`).
    pub own_device: bool,
    /// Sleeps between rollouts ([`sleeps_between_rollouts`]).
    pub sleeps: bool,
}

/// Whether the server sleeps between rollouts: on a GPU it shares with the trainer (vLLM's sleep
/// mode is CUDA's), so the update gets the device's memory; not with a device of its own (it
/// samples the next step all through the update), and not on CPU.
pub fn sleeps_between_rollouts(device: tch::Device, own_device: bool) -> bool {
    device.is_cuda() && !own_device
}

impl VllmServer {
    /// Writes `policy` (the weights of `step`) and the extension to `<run>/vllm/`, starts the
    /// server on them and waits until it answers.
    pub fn start(spec: &ServerSpec, policy: &LoadedModel, step: u64) -> Result<VllmServer, VllmError> {
        let dir =
            std::path::absolute(spec.run_dir.join("vllm")).unwrap_or_else(|_| spec.run_dir.join("vllm"));
        // What an earlier run left: its weights are stale, its log is kept below the new one.
        remove_written(&dir, None);
        std::fs::create_dir_all(&dir).map_err(files(&dir))?;
        for (name, text) in [("rlvr_vllm_worker.py", WORKER_EXTENSION), ("sitecustomize.py", SITE_CUSTOMIZE)]
        {
            let path = dir.join(name);
            std::fs::write(&path, text).map_err(files(&path))?;
        }
        let lora_rank = match &policy.adapters {
            Some(adapters) => {
                Some(VLLM_LORA_RANKS.into_iter().find(|&rank| rank >= adapters.config.rank).ok_or_else(
                    || VllmError::Spawn {
                        python: spec.python.into(),
                        message: format!(
                            "vLLM serves LoRA adapters of rank up to 512; this job's is {}",
                            adapters.config.rank
                        ),
                    },
                )?)
            }
            None => None,
        };
        let weights = match lora_rank {
            Some(_) => {
                let base = dir.join("base");
                if base.exists() {
                    std::fs::remove_dir_all(&base).map_err(files(&base))?;
                }
                rlvr_model::save_base(policy, &base)
                    .map_err(|error| VllmError::Files { path: base.clone(), message: error.to_string() })?;
                base
            }
            None => write_weights(&dir, policy, step)?,
        };
        // The API on a Unix socket in a directory only this user can enter (made 0700), not a
        // loopback port: the server's development routes (`/collective_rpc` loads any directory
        // as weights) must be the worker's alone, and there is no port to race for. Under the
        // system's temporary directory, since a socket's path has at most 107 bytes.
        let socket_dir = tempfile::Builder::new()
            .prefix("rlvr-vllm-")
            .tempdir()
            .map_err(|error| VllmError::Spawn { python: spec.python.into(), message: error.to_string() })?;
        let socket = socket_dir.path().join("api.sock");
        let log_path = dir.join("server.log");
        let mut log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .map_err(files(&log_path))?;
        let _ = writeln!(log, "--- the server for step {step}'s weights on {}", socket.display());
        let log_err = log.try_clone().map_err(files(&log_path))?;
        let mut command = Command::new(spec.python);
        command
            .args(["-m", "vllm.entrypoints.openai.api_server"])
            .arg("--model")
            .arg(&weights)
            .args(server_args(spec, &socket, lora_rank))
            .env("VLLM_ALLOW_RUNTIME_LORA_UPDATING", "1")
            .env("PYTHONPATH", &dir)
            // Its own home: nothing vLLM's libraries cache lands outside the run.
            .env("HOME", &dir)
            .env("XDG_CACHE_HOME", dir.join("cache"))
            .env("VLLM_SERVER_DEV_MODE", "1")
            // The worker is the server's parent: the first process checks against it.
            .env("RLVR_VLLM_PARENT_PID", std::process::id().to_string())
            // The model runs in the engine's process, not a third one.
            .env("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
            .env("VLLM_NO_USAGE_STATS", "1")
            .env("DO_NOT_TRACK", "1")
            .env("HF_HUB_OFFLINE", "1")
            .env("TOKENIZERS_PARALLELISM", "false")
            .env("OMP_NUM_THREADS", spec.threads.to_string())
            .env("VLLM_CPU_OMP_THREADS_BIND", "nobind")
            .current_dir(&dir)
            .envs(
                spec.own_device
                    .then(|| server_devices(std::env::var("CUDA_VISIBLE_DEVICES").ok().as_deref()))
                    .flatten()
                    .map(|devices| ("CUDA_VISIBLE_DEVICES", devices)),
            )
            .stdin(std::process::Stdio::null())
            .stdout(log)
            .stderr(log_err)
            .process_group(0);
        // SAFETY: prctl and the signal mask only, between fork and exec: the server dies with
        // this worker however it ends.
        unsafe {
            command.pre_exec(|| {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                crate::lifecycle::unblock_stop_signals_in_child()
            });
        }
        let child = command
            .spawn()
            .map_err(|error| VllmError::Spawn { python: spec.python.into(), message: error.to_string() })?;
        info!(pid = child.id(), socket = %socket.display(), weights = %weights.display(), "the vllm server is starting");
        let client = reqwest::blocking::Client::builder()
            .timeout(REQUEST_TIMEOUT)
            .unix_socket(socket)
            .build()
            .map_err(|error| VllmError::Request(error.to_string()))?;
        let mut server = VllmServer {
            child,
            api: Api { client, base: "http://vllm".to_owned() },
            dir,
            _socket_dir: socket_dir,
            served: Served::Weights,
            fault: SyncFault::from_env(),
            sleeps: spec.sleeps,
            asleep: false,
            behind: None,
        };
        server.wait_ready(&log_path)?;
        if lora_rank.is_some() {
            server.load_adapter(policy, &weights, step)?;
        }
        server.sleep()?;
        Ok(server)
    }

    fn wait_ready(&mut self, log: &Path) -> Result<(), VllmError> {
        let started = Instant::now();
        let mut said = 0;
        loop {
            if let Some(status) =
                self.child.try_wait().map_err(|error| VllmError::Request(error.to_string()))?
            {
                return Err(VllmError::Exited(
                    format!("exited with {status} before it answered"),
                    log.into(),
                ));
            }
            let health = self
                .api
                .client
                .get(format!("{}/health", self.api.base))
                .timeout(Duration::from_secs(2))
                .send();
            if health.is_ok_and(|answer| answer.status().is_success()) {
                info!(seconds = started.elapsed().as_secs_f64(), "the vllm server answers");
                return Ok(());
            }
            let waited = started.elapsed();
            if waited > START_TIMEOUT {
                return Err(VllmError::Exited(
                    format!("did not answer within {} s", START_TIMEOUT.as_secs()),
                    log.into(),
                ));
            }
            if waited.as_secs() >= said + 15 {
                said = waited.as_secs();
                info!(seconds = said, "waiting for the vllm server");
            }
            std::thread::sleep(Duration::from_millis(250));
        }
    }

    /// `group_size` completions of each prompt, group-contiguous as `rlvr_model::generate`
    /// returns them, each ended by our rules. One request per prompt, all at once (vLLM batches
    /// them), each with its own seed from `rng`.
    pub fn generate(
        &mut self,
        prompts: &[Vec<i64>],
        group_size: usize,
        params: &SamplingParams,
        tokenizer: &Tokenizer,
        rng: &mut SamplerRng,
    ) -> Result<Vec<Sampled>, VllmError> {
        self.check_alive()?;
        let seeds = seeds(prompts.len(), rng);
        let groups = request_groups(&self.api, self.served.model(), prompts, group_size, params, &seeds)?;
        ended(groups, params, tokenizer)
    }

    /// As [`Self::generate`], in a thread of its own while the caller goes on (one step off
    /// policy: the next step's rollouts while this one updates); the seeds are drawn from `rng`
    /// now, so a run draws the same ones as ever. Its completions are of the weights the server
    /// has now: nothing may [`Self::sync`] until [`Generation::finish`] has returned.
    pub fn generate_in_background(
        &mut self,
        prompts: Vec<Vec<i64>>,
        group_size: usize,
        params: &SamplingParams,
        rng: &mut SamplerRng,
    ) -> Result<Generation, VllmError> {
        self.check_alive()?;
        let seeds = seeds(prompts.len(), rng);
        let (api, model, params) = (self.api.clone(), self.served.model().to_owned(), params.clone());
        let thread = std::thread::Builder::new()
            .name("vllm-rollouts".into())
            .spawn(move || {
                let started = Instant::now();
                let groups = request_groups(&api, &model, &prompts, group_size, &params, &seeds);
                (groups, started.elapsed().as_secs_f64())
            })
            .map_err(|error| VllmError::Request(format!("cannot start the sampling thread: {error}")))?;
        Ok(Generation { thread })
    }

    /// Loads `policy` (the weights after step `step`) into the server — its weights, reloaded in
    /// place with the prefix cache emptied, or a LoRA job's adapters under a new name — and
    /// returns the seconds it took. What it served before is deleted. A server asleep between
    /// rollouts loads them when it wakes for the next one ([`Self::wake`]): waking it here would
    /// put its weights on the device during the update, which the job's estimate does not count;
    /// `None` then.
    pub fn sync(&mut self, policy: &LoadedModel, step: u64) -> Result<Option<f64>, VllmError> {
        if self.asleep {
            self.behind = Some(step);
            return Ok(None);
        }
        self.load(policy, step).map(Some)
    }

    /// Wakes a server asleep between rollouts (`POST /wake_up`) and loads the weights of the
    /// update it slept through; a server that does not sleep is awake already.
    pub fn wake(&mut self, policy: &LoadedModel) -> Result<(), VllmError> {
        if !self.asleep {
            return Ok(());
        }
        self.check_alive()?;
        self.post_text("/wake_up", None)?;
        self.asleep = false;
        match self.behind.take() {
            Some(step) => self.load(policy, step).map(|_| ()),
            None => Ok(()),
        }
    }

    /// After a rollout, on a device shared with the trainer: the server's weights go to host
    /// memory and its KV cache is dropped (`POST /sleep?level=1`), so the update has the device's
    /// memory. A server with a device of its own, or on CPU (sleep mode is CUDA's), stays up.
    pub fn sleep(&mut self) -> Result<(), VllmError> {
        if !self.sleeps || self.asleep {
            return Ok(());
        }
        self.check_alive()?;
        self.post_text("/sleep?level=1", None)?;
        self.asleep = true;
        Ok(())
    }

    fn load(&mut self, policy: &LoadedModel, step: u64) -> Result<f64, VllmError> {
        let started = Instant::now();
        self.check_alive()?;
        if let Served::Adapter { base, .. } = &self.served {
            let base = base.clone();
            self.load_adapter(policy, &base, step)?;
            return Ok(started.elapsed().as_secs_f64());
        }
        let weights = write_weights(&self.dir, policy, step)?;
        let method = match self.fault {
            Some(SyncFault::TiedOutput) => "rlvr_load_weights_untied",
            _ => "rlvr_load_weights",
        };
        let body = json!({"method": method, "args": [weights.display().to_string()]});
        let _: serde_json::Value = self.post("/collective_rpc", &body)?;
        if self.fault != Some(SyncFault::PrefixCache) {
            self.post_text("/reset_prefix_cache", None)?;
        }
        remove_written(&self.dir, Some(&weights));
        self.served = Served::Weights;
        Ok(started.elapsed().as_secs_f64())
    }

    /// Writes `policy`'s adapters (of step `step`, over `base`) and serves them as `step-N`; the
    /// adapters served before are unloaded and deleted.
    fn load_adapter(&mut self, policy: &LoadedModel, base: &Path, step: u64) -> Result<(), VllmError> {
        let dir = self.dir.join(format!("adapter-{step}"));
        if dir.exists() {
            std::fs::remove_dir_all(&dir).map_err(files(&dir))?;
        }
        rlvr_model::save_adapter(policy, &base.display().to_string(), &dir)
            .map_err(|error| VllmError::Files { path: dir.clone(), message: error.to_string() })?;
        let name = format!("step-{step}");
        let body = json!({"lora_name": name, "lora_path": dir.display().to_string()});
        self.post_text("/v1/load_lora_adapter", Some(&body))?;
        if let Served::Adapter { name: before, .. } = &self.served {
            self.post_text("/v1/unload_lora_adapter", Some(&json!({"lora_name": before})))?;
        }
        remove_written(&self.dir, Some(&dir));
        self.served = Served::Adapter { base: base.to_owned(), name };
        Ok(())
    }

    fn check_alive(&mut self) -> Result<(), VllmError> {
        match self.child.try_wait() {
            Ok(Some(status)) => {
                Err(VllmError::Exited(format!("exited with {status}"), self.dir.join("server.log")))
            }
            Ok(None) => Ok(()),
            Err(error) => Err(VllmError::Request(error.to_string())),
        }
    }
}

impl VllmServer {
    fn post<T: serde::de::DeserializeOwned>(
        &self,
        route: &str,
        body: &serde_json::Value,
    ) -> Result<T, VllmError> {
        self.api.post(route, body)
    }

    fn post_text(&self, route: &str, body: Option<&serde_json::Value>) -> Result<(), VllmError> {
        self.api.post_text(route, body)
    }
}

impl Api {
    fn post<T: serde::de::DeserializeOwned>(
        &self,
        route: &str,
        body: &serde_json::Value,
    ) -> Result<T, VllmError> {
        let answer = self
            .client
            .post(format!("{}{route}", self.base))
            .json(body)
            .send()
            .map_err(|error| VllmError::Request(format!("POST {route}: {error}")))?;
        let status = answer.status();
        let text = answer.text().map_err(|error| VllmError::Request(format!("POST {route}: {error}")))?;
        if !status.is_success() {
            return Err(VllmError::Request(format!("POST {route} answered {status}: {}", cut(&text, 2000))));
        }
        serde_json::from_str(&text).map_err(|error| {
            VllmError::Request(format!(
                "POST {route}: the answer does not parse ({error}): {}",
                cut(&text, 500)
            ))
        })
    }

    /// A POST whose answer is text (or nothing), not read past its status.
    fn post_text(&self, route: &str, body: Option<&serde_json::Value>) -> Result<(), VllmError> {
        let request = self.client.post(format!("{}{route}", self.base));
        let request = match body {
            Some(body) => request.json(body),
            None => request,
        };
        let answer = request.send().map_err(|error| VllmError::Request(format!("POST {route}: {error}")))?;
        let status = answer.status();
        if !status.is_success() {
            let text = answer.text().unwrap_or_default();
            return Err(VllmError::Request(format!("POST {route} answered {status}: {}", cut(&text, 2000))));
        }
        Ok(())
    }
}

impl Generation {
    /// Waits for the completions, ends each by our rules, and returns them with the seconds
    /// their sampling took.
    pub fn finish(
        self,
        params: &SamplingParams,
        tokenizer: &Tokenizer,
    ) -> Result<(Vec<Sampled>, f64), VllmError> {
        let (groups, seconds) =
            self.thread.join().map_err(|_| VllmError::Request("the sampling thread panicked".into()))?;
        Ok((ended(groups?, params, tokenizer)?, seconds))
    }
}

/// A seed per prompt. vLLM's seed is a Python int handed to torch's generator: 63 bits keep it
/// positive.
fn seeds(prompts: usize, rng: &mut SamplerRng) -> Vec<u64> {
    (0..prompts).map(|_| rng.next_u64() >> 1).collect()
}

/// Each prompt's group from the server: one request per prompt, sent from at most
/// [`REQUESTS_AT_ONCE`] threads, each taking the next prompt (vLLM batches whatever is in
/// flight, and a step of thousands of prompts needs no more).
fn request_groups(
    api: &Api,
    model: &str,
    prompts: &[Vec<i64>],
    group_size: usize,
    params: &SamplingParams,
    seeds: &[u64],
) -> Result<Vec<RawGroup>, VllmError> {
    let next = std::sync::atomic::AtomicUsize::new(0);
    let answers: Vec<std::sync::Mutex<Option<GroupAnswer>>> =
        prompts.iter().map(|_| std::sync::Mutex::new(None)).collect();
    std::thread::scope(|scope| {
        for _ in 0..prompts.len().min(REQUESTS_AT_ONCE) {
            scope.spawn(|| {
                loop {
                    let index = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let Some(prompt) = prompts.get(index) else { break };
                    let body = completion_request(model, prompt, group_size, params, seeds[index]);
                    let answer = api
                        .post("/v1/completions", &body)
                        .and_then(|answer| raw_group(answer, index, group_size));
                    *answers[index].lock().unwrap_or_else(std::sync::PoisonError::into_inner) = Some(answer);
                }
            });
        }
    });
    answers
        .into_iter()
        .map(|answer| {
            answer
                .into_inner()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .unwrap_or_else(|| Err(VllmError::Request("a request thread ended without an answer".into())))
        })
        .collect()
}

/// The groups' completions, group-contiguous, each ended by our rules (`Sampled::ended`).
fn ended(
    groups: Vec<RawGroup>,
    params: &SamplingParams,
    tokenizer: &Tokenizer,
) -> Result<Vec<Sampled>, VllmError> {
    let mut sampled = Vec::with_capacity(groups.iter().map(Vec::len).sum());
    for (prompt_index, group) in groups.into_iter().enumerate() {
        for (tokens, logprobs) in group {
            sampled.push(
                Sampled::ended(prompt_index, tokens, logprobs, tokenizer, params)
                    .map_err(|error| VllmError::Request(error.to_string()))?,
            );
        }
    }
    Ok(sampled)
}

impl Drop for VllmServer {
    /// The server's whole process group, killed and reaped.
    fn drop(&mut self) {
        if let Ok(pid) = i32::try_from(self.child.id()) {
            // SAFETY: kill on the group this worker made for its child; no memory is passed.
            unsafe { libc::kill(-pid, libc::SIGKILL) };
        }
        let _ = self.child.wait();
    }
}

/// The server's arguments after `--model`; a LoRA job's with the rank its adapters need.
/// The most sequences the server decodes at once: vLLM's largest default (a GPU of 70 GB or
/// more); a step with more rows decodes them in waves rather than ask a smaller device's engine
/// for buffers of that many.
const MAX_NUM_SEQS: usize = 1024;

fn server_args(spec: &ServerSpec, socket: &Path, lora_rank: Option<i64>) -> Vec<String> {
    let max_num_seqs = spec.rows.clamp(1, MAX_NUM_SEQS);
    let dtype = match spec.dtype {
        Dtype::F32 => "float32",
        Dtype::Bf16 => "bfloat16",
    };
    [
        "--served-model-name",
        SERVED_NAME,
        "--uds",
        &socket.display().to_string(),
        "--dtype",
        dtype,
        // The log-probabilities of the distribution sampled from (after the temperature): what
        // the trainer's old log-probabilities are.
        "--logprobs-mode",
        "processed_logprobs",
        "--worker-extension-cls",
        WORKER_EXTENSION_CLASS,
        "--max-model-len",
        &spec.max_model_len.to_string(),
        "--kv-cache-memory-bytes",
        &spec.kv_cache_bytes.to_string(),
        // A prompt prefilled in chunks makes vLLM rewind a seeded request's generator, which a
        // CPU generator cannot ("CPU Generator does not use offset": every step whose prompts pass
        // one step's token budget failed). Whole prompts only; the budget fits the longest.
        "--no-enable-chunked-prefill",
        // A step's rows decode as one batch, as the native sampler's do and as the KV cache is
        // sized for: vLLM's own default (128 sequences on CPU, 256 or 1024 on GPUs) decoded a
        // step of 64 prompts × 8 in four waves, each paying the engine's per-step overhead.
        "--max-num-seqs",
        &max_num_seqs.to_string(),
        // At least one token a sequence (vLLM's rule), and the longest whole prompt.
        "--max-num-batched-tokens",
        &spec.max_model_len.max(2048).max(max_num_seqs).to_string(),
        "--seed",
        &(spec.seed >> 1).to_string(),
        "--generation-config",
        "vllm",
        "--enforce-eager",
        "--disable-log-stats",
        "--disable-uvicorn-access-log",
    ]
    .iter()
    .map(|s| s.to_string())
    .chain(spec.sleeps.then(|| "--enable-sleep-mode".to_owned()))
    .chain(lora_rank.into_iter().flat_map(|rank| {
        // Two: the step's adapters and, while they load, the last step's.
        [
            "--enable-lora".to_owned(),
            "--max-lora-rank".to_owned(),
            rank.to_string(),
            "--max-loras".to_owned(),
            "2".to_owned(),
        ]
    }))
    .collect()
}

/// The server's `CUDA_VISIBLE_DEVICES` when it has a device of its own: the last of the
/// worker's (the trainer computes on the first), or nothing to change when the worker sees fewer
/// than two (CPU slots: the two are threads of one machine).
fn server_devices(visible: Option<&str>) -> Option<String> {
    let devices: Vec<&str> = visible?.split(',').map(str::trim).filter(|d| !d.is_empty()).collect();
    (devices.len() >= 2).then(|| devices[devices.len() - 1].to_owned())
}

/// The request of one prompt's group.
fn completion_request(
    model: &str,
    prompt: &[i64],
    group_size: usize,
    params: &SamplingParams,
    seed: u64,
) -> serde_json::Value {
    json!({
        "model": model,
        "prompt": prompt,
        "n": group_size,
        "seed": seed,
        "temperature": params.temperature,
        "top_p": 1.0,
        "top_k": -1,
        "max_tokens": params.max_new_tokens,
        "logprobs": 0,
        "return_tokens_as_token_ids": true,
        "skip_special_tokens": false,
        // Stop strings are ours to apply (`Sampled::ended`); vLLM's own would cut the tokens by
        // its detokenizer's text.
        "stop": params.stop,
        "include_stop_str_in_output": true,
        "ignore_eos": params.ignore_eos,
    })
}

/// `POST /v1/completions`'s answer, the fields read.
#[derive(Debug, Deserialize)]
struct CompletionAnswer {
    choices: Vec<Choice>,
}

#[derive(Debug, Deserialize)]
struct Choice {
    index: usize,
    logprobs: Option<ChoiceLogprobs>,
}

#[derive(Debug, Deserialize)]
struct ChoiceLogprobs {
    /// `token_id:N` (with `return_tokens_as_token_ids`).
    tokens: Vec<String>,
    token_logprobs: Vec<Option<f64>>,
}

/// One prompt's answer as its group of completions, in the order of their `index`.
fn raw_group(
    answer: CompletionAnswer,
    prompt_index: usize,
    group_size: usize,
) -> Result<RawGroup, VllmError> {
    let mut choices = answer.choices;
    choices.sort_by_key(|choice| choice.index);
    if choices.len() != group_size || choices.iter().enumerate().any(|(i, choice)| choice.index != i) {
        return Err(VllmError::Request(format!(
            "asked for {group_size} completions of prompt {prompt_index}, got indices {:?}",
            choices.iter().map(|choice| choice.index).collect::<Vec<_>>()
        )));
    }
    choices
        .into_iter()
        .map(|choice| {
            let logprobs = choice.logprobs.ok_or_else(|| {
                VllmError::Request("a completion came without its log-probabilities".into())
            })?;
            let tokens = logprobs
                .tokens
                .iter()
                .map(|token| {
                    token
                        .strip_prefix("token_id:")
                        .and_then(|id| id.parse::<i64>().ok())
                        .ok_or_else(|| VllmError::Request(format!("expected token_id:N, got {token:?}")))
                })
                .collect::<Result<Vec<i64>, _>>()?;
            let values = logprobs
                .token_logprobs
                .iter()
                .map(|value| {
                    value.filter(|value| value.is_finite()).map(|value| value as f32).ok_or_else(|| {
                        VllmError::Request("a sampled token without a finite log-probability".into())
                    })
                })
                .collect::<Result<Vec<f32>, _>>()?;
            Ok((tokens, values))
        })
        .collect()
}

/// Writes `policy` as `<dir>/weights-<step>` (a Hugging Face directory; one left by a run that
/// died mid-write is replaced).
fn write_weights(dir: &Path, policy: &LoadedModel, step: u64) -> Result<PathBuf, VllmError> {
    let weights = dir.join(format!("weights-{step}"));
    if weights.exists() {
        std::fs::remove_dir_all(&weights).map_err(files(&weights))?;
    }
    rlvr_model::save_pretrained(policy, &weights)
        .map_err(|error| VllmError::Files { path: weights.clone(), message: error.to_string() })?;
    Ok(weights)
}

/// Deletes every `weights-*` and `adapter-*` directory in `dir` but `keep`.
fn remove_written(dir: &Path, keep: Option<&Path>) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for entry in entries.flatten() {
        let path = entry.path();
        let stale = entry
            .file_name()
            .to_str()
            .is_some_and(|name| name.starts_with("weights-") || name.starts_with("adapter-"));
        if stale && Some(path.as_path()) != keep {
            if let Err(error) = std::fs::remove_dir_all(&path) {
                warn!(path = %path.display(), %error, "cannot delete weights the vllm server no longer serves");
            }
        }
    }
}

/// ` (the log's last error)`, or nothing when the log names none.
fn cause(log: &Path) -> String {
    last_error(log).map(|error| format!(" ({error})")).unwrap_or_default()
}

/// The server log's last Python error line (`AttributeError: …`) that is not vLLM's summary of
/// an earlier one, its process prefix cut: why a start failed. Read from the log's last 256 KiB.
fn last_error(log: &Path) -> Option<String> {
    use std::io::{Read, Seek, SeekFrom};
    let mut file = std::fs::File::open(log).ok()?;
    let length = file.metadata().ok()?.len();
    file.seek(SeekFrom::Start(length.saturating_sub(256 * 1024))).ok()?;
    let mut bytes = Vec::new();
    file.read_to_end(&mut bytes).ok()?;
    let text = String::from_utf8_lossy(&bytes);
    let line = text.lines().rev().find_map(|line| {
        // `(EngineCore pid=12) ERROR 11-29 21:20:59 [core.py:1330] AttributeError: …`
        let message = line.rsplit_once("] ").map_or(line, |(_, rest)| rest);
        let message =
            message.strip_prefix('(').and_then(|m| m.split_once(") ")).map_or(message, |(_, rest)| rest);
        let name = message.split_once(": ")?.0;
        // vLLM's own summary points back at the cause: the cause is the line to show.
        let summary = message.contains("root cause above");
        (name.ends_with("Error") && !name.contains(' ') && !summary).then(|| message.trim().to_owned())
    })?;
    Some(cut(&line, 500).to_owned())
}

fn files(path: &Path) -> impl Fn(std::io::Error) -> VllmError + '_ {
    move |error| VllmError::Files { path: path.to_owned(), message: error.to_string() }
}

fn cut(text: &str, bytes: usize) -> &str {
    let mut end = text.len().min(bytes);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tiny() -> LoadedModel {
        rlvr_model::load("builtin:tiny-arith", tch::Device::Cpu, tch::Kind::Float).unwrap()
    }

    fn answer(json: serde_json::Value) -> CompletionAnswer {
        serde_json::from_value(json).unwrap()
    }

    /// Prompt `prompt_index`'s answer read and ended as a step's sampling reads it, after the
    /// (empty) groups of the prompts before it.
    fn completions(
        answer: CompletionAnswer,
        prompt_index: usize,
        group_size: usize,
        params: &SamplingParams,
        tokenizer: &Tokenizer,
    ) -> Result<Vec<Sampled>, VllmError> {
        let mut groups = vec![Vec::new(); prompt_index];
        groups.push(raw_group(answer, prompt_index, group_size)?);
        ended(groups, params, tokenizer)
    }

    /// An answer as vLLM writes it (choices in any order, token ids as `token_id:N`) reads back
    /// as the group in index order, each completion ended by our rules.
    #[test]
    fn an_answer_reads_as_its_group_in_index_order() {
        let model = tiny();
        let eos = model.tokenizer.eos_ids()[0];
        let a = model.tokenizer.encode("a").unwrap()[0];
        let b = model.tokenizer.encode("b").unwrap()[0];
        let params = SamplingParams { max_new_tokens: 8, ..Default::default() };
        let choice = |index: usize, ids: &[i64]| {
            json!({
                "index": index,
                "text": "ignored",
                "finish_reason": "stop",
                "logprobs": {
                    "tokens": ids.iter().map(|id| format!("token_id:{id}")).collect::<Vec<_>>(),
                    "token_logprobs": ids.iter().map(|_| -0.5).collect::<Vec<_>>(),
                },
            })
        };
        let read = completions(
            answer(json!({"choices": [choice(1, &[b, eos]), choice(0, &[a, a, eos, b])]})),
            4,
            2,
            &params,
            &model.tokenizer,
        )
        .unwrap();
        assert_eq!(read.len(), 2);
        assert_eq!(read[0].tokens, vec![a, a, eos]);
        assert_eq!(read[0].text, "aa");
        assert_eq!(read[1].tokens, vec![b, eos]);
        assert!(read.iter().all(|s| s.prompt_index == 4 && s.logprobs.iter().all(|&l| l == -0.5)));
    }

    /// The server sleeps between rollouts on a GPU it shares with the trainer, and only there;
    /// started so.
    #[test]
    fn a_server_sleeps_between_rollouts_only_on_a_gpu_it_shares() {
        let cases = [
            (tch::Device::Cuda(0), false, true),
            (tch::Device::Cuda(0), true, false),
            (tch::Device::Cpu, false, false),
            (tch::Device::Cpu, true, false),
        ];
        for (device, own_device, sleeps) in cases {
            assert_eq!(
                sleeps_between_rollouts(device, own_device),
                sleeps,
                "{device:?}, own device {own_device}"
            );
        }
        let spec = |sleeps| ServerSpec {
            python: Path::new("python"),
            run_dir: Path::new("run"),
            dtype: Dtype::Bf16,
            max_model_len: 100,
            kv_cache_bytes: 1 << 20,
            rows: 512,
            seed: 1,
            threads: 1,
            own_device: false,
            sleeps,
        };
        let sleep_mode = |sleeps| {
            server_args(&spec(sleeps), Path::new("api.sock"), None)
                .contains(&"--enable-sleep-mode".to_owned())
        };
        assert!(sleep_mode(true) && !sleep_mode(false));
    }

    /// A step's rows decode as one batch, up to vLLM's largest default; the token budget takes
    /// one token a sequence and the longest whole prompt (vLLM refuses a start otherwise).
    #[test]
    fn a_steps_rows_are_one_batch_within_the_token_budget() {
        let cases = [
            // (rows, max_model_len, --max-num-seqs, --max-num-batched-tokens)
            (512, 10, "512", "2048"),
            (16, 10, "16", "2048"),
            (4096, 10, "1024", "2048"),
            (1024, 5000, "1024", "5000"),
        ];
        for (rows, max_model_len, seqs, tokens) in cases {
            let spec = ServerSpec {
                python: Path::new("python"),
                run_dir: Path::new("run"),
                dtype: Dtype::F32,
                max_model_len,
                kv_cache_bytes: 1 << 20,
                rows,
                seed: 1,
                threads: 1,
                own_device: false,
                sleeps: false,
            };
            let args = server_args(&spec, Path::new("api.sock"), None);
            let value = |flag: &str| args[args.iter().position(|arg| arg == flag).unwrap() + 1].clone();
            assert_eq!(value("--max-num-seqs"), seqs, "{rows} rows");
            assert_eq!(value("--max-num-batched-tokens"), tokens, "{rows} rows, {max_model_len} tokens");
        }
    }

    /// One step off policy, the server computes on the last of the worker's GPUs.
    #[test]
    fn a_server_with_a_device_of_its_own_takes_the_last_visible_one() {
        let cases = [
            (Some("GPU-a,GPU-b"), Some("GPU-b")),
            (Some("0, 1"), Some("1")),
            (Some("3"), None),
            (Some(""), None),
            (None, None),
        ];
        for (visible, expected) in cases {
            assert_eq!(server_devices(visible).as_deref(), expected, "{visible:?}");
        }
    }

    /// A failed start names the server's last Python error, from its log.
    #[test]
    fn a_failed_start_names_the_last_error_of_the_log() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("server.log");
        std::fs::write(
            &log,
            "INFO 11-29 [importing.py:53] Triton is installed\n\
             (EngineCore pid=23888) ERROR 11-29 21:20:59 [core.py:1330] AttributeError: module 'x' has no attribute 'Y'\n\
             (APIServer pid=23648)     raise RuntimeError(\n\
             (APIServer pid=23648) RuntimeError: Engine core initialization failed. See root cause above.\n\
             (APIServer pid=23648) INFO shutting down\n",
        )
        .unwrap();
        let error = VllmError::Exited("exited with exit status: 1 before it answered".into(), log.clone());
        assert_eq!(
            error.to_string(),
            format!(
                "vllm: the server exited with exit status: 1 before it answered (AttributeError: module 'x' has \
                 no attribute 'Y'); its log: {}",
                log.display()
            )
        );
        let quiet = VllmError::Exited("did not answer within 900 s".into(), dir.path().join("none.log"));
        assert!(
            quiet.to_string().starts_with("vllm: the server did not answer within 900 s; its log: "),
            "{quiet}"
        );
    }

    /// Answers the worker cannot train on are refused with what is wrong, never read in part.
    #[test]
    fn a_malformed_answer_is_refused_with_what_is_wrong() {
        let model = tiny();
        let params = SamplingParams::default();
        let cases = [
            (
                json!({"choices": [{"index": 0, "logprobs": {"tokens": ["token_id:5"], "token_logprobs": [-1.0]}}]}),
                "asked for 2 completions",
            ),
            (
                json!({"choices": [{"index": 0, "logprobs": null}, {"index": 1, "logprobs": null}]}),
                "without its log-probabilities",
            ),
            (
                json!({"choices": [
                {"index": 0, "logprobs": {"tokens": ["a"], "token_logprobs": [-1.0]}},
                {"index": 1, "logprobs": {"tokens": ["token_id:5"], "token_logprobs": [-1.0]}}]}),
                "expected token_id:N",
            ),
            (
                json!({"choices": [
                {"index": 0, "logprobs": {"tokens": ["token_id:5"], "token_logprobs": [null]}},
                {"index": 1, "logprobs": {"tokens": ["token_id:5"], "token_logprobs": [-1.0]}}]}),
                "finite log-probability",
            ),
            (
                json!({"choices": [
                {"index": 0, "logprobs": {"tokens": ["token_id:5", "token_id:6"], "token_logprobs": [-1.0]}},
                {"index": 1, "logprobs": {"tokens": ["token_id:5"], "token_logprobs": [-1.0]}}]}),
                "2 tokens but 1",
            ),
        ];
        for (json, expected) in cases {
            let error = completions(answer(json.clone()), 0, 2, &params, &model.tokenizer).unwrap_err();
            assert!(error.to_string().contains(expected), "{json}: {error}");
        }
    }

    /// The request asks for what the trainer needs: token-id prompt, the group, our seed,
    /// processed log-probabilities of the sampled tokens as ids, stops kept for our rules.
    #[test]
    fn a_request_asks_for_token_ids_and_their_logprobs() {
        let params = SamplingParams {
            max_new_tokens: 12,
            temperature: 0.7,
            stop: vec!["\n".into()],
            ..Default::default()
        };
        let body = completion_request("step-3", &[5, 6, 7], 4, &params, 99);
        assert_eq!(body["model"], "step-3");
        assert_eq!(body["prompt"], json!([5, 6, 7]));
        assert_eq!(body["n"], 4);
        assert_eq!(body["seed"], 99);
        assert_eq!(body["temperature"], 0.7);
        assert_eq!(body["max_tokens"], 12);
        assert_eq!(body["logprobs"], 0);
        assert_eq!(body["return_tokens_as_token_ids"], true);
        assert_eq!(body["stop"], json!(["\n"]));
        assert_eq!(body["include_stop_str_in_output"], true);
    }
}
