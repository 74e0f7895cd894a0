//! `[rollout] engine = "vllm"` through the real worker and vLLM's real server (the CPU build from
//! `scripts/vllm-venv.sh`), one job whose runs show, in turn:
//! - the sync check catching each of the two ways a reload leaves vLLM on stale weights while its
//!   text stays fluent: the prefix cache kept (prompts longer than one of vLLM's 128-token CPU
//!   blocks, sampled again, reuse keys and values of the old weights) and a tied output layer left
//!   as vLLM's own reload leaves it — each fails the step after the broken sync, naming the sync;
//! - the server's processes dying with the worker however it ends: a failed step, `kill -9`, and a
//!   stop request (SIGTERM: the daemon's cancel and preemption), after which the run resumes;
//! - a synced run agreeing with the trainer after every real update: each step's largest
//!   |trainer − vLLM| log-probability of a sampled token under 1e-3, the sync timed;
//! - a job one step off policy (`off_policy_steps = 1`) through a daemon of two CPU slots,
//!   admitted onto both and published: each step after the first sampled while the step before
//!   updated, from exactly the weights that step started from (their log-probabilities,
//!   recomputed from the trainer's copy, within 1e-3 of vLLM's; the newer weights it trains
//!   further off), its records naming those weights' step.
//!
//! Each run starts its own server (about 40 s on 2 cores); learning on vLLM is shown by
//! `learning.rs`, beside the same job on the native sampler.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use rlvr_protocol::job::JobState;
use rlvr_protocol::worker::MetricsLine;
use rlvr_tests::jobs::{ended, submit_ok, wait_job};
use rlvr_tests::{
    Daemon, PERMISSIVE_GATES, Redis, arith_data, drop_in, plugin_lib, wait_until, worker_command,
};

/// Longer than one 128-token block of vLLM's CPU prefix cache: with the built-in model's one
/// token per character, every prompt's first block is this text alone, and cached.
const PREAMBLE: &str = "Add the two numbers below and write their sum alone: digits only, no words, no spaces, \
                        nothing before it and nothing after it, then stop writing at once. The sum: ";

/// A GRPO job on vLLM: all 8 prompts, 8 completions each, every step (64 sequences of ~170
/// prompt tokens: more than one of vLLM's scheduling steps takes, which once crashed a seeded
/// request's prefill on CPU), graded by fuzzy match so that rewards differ within groups and every
/// step updates the weights; a checkpoint every step; the sync check at 1e-3.
fn spec(data: &Path, steps: u32) -> String {
    format!(
        r#"
[job]
name = "vllm-sync"
team = "tests"
model_line = "tiny-arith"
seed = 7
[model]
policy = "builtin:tiny-arith"
[data]
train = "{data}/long.jsonl"
[optimizer]
plugin = "grpo"
group_size = 8
lr = 1e-3
micro_batch_size = 64
kl_beta = 0.0
[[verifiers]]
plugin = "text-similarity"
metric = "fuzzy_match"
pass_threshold = 0.5
[rollout]
engine = "vllm"
max_new_tokens = 5
prompts_per_step = 8
max_logprob_gap = 1e-3
[budget]
max_steps = {steps}
[checkpoint]
every_steps = 1
"#,
        data = data.display()
    )
}

/// The same job one step off policy, the server on a device of its own, as a daemon takes it: a
/// held-out prompt and gates that pass it, to be published.
fn off_policy_spec(data: &Path, steps: u32) -> String {
    let heldout = format!("[data]\nheldout = \"{}/heldout.jsonl\"", data.display());
    spec(data, steps)
        .replace("engine = \"vllm\"", "engine = \"vllm\"\noff_policy_steps = 1")
        .replace("[data]", &heldout)
        + "[resources]\ndevices = 2\n"
        + PERMISSIVE_GATES
}

/// The processes of the server started for the run in `state`: every process whose home is the
/// run's `vllm/` directory (the worker gives the server that home; its children inherit it).
fn server_processes(state: &Path) -> Vec<u32> {
    let home = format!("HOME={}", state.join("vllm").display());
    let Ok(entries) = fs::read_dir("/proc") else { return Vec::new() };
    entries
        .flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            fs::read(format!("/proc/{pid}/environ"))
                .is_ok_and(|environ| environ.split(|&b| b == 0).any(|var| var == home.as_bytes()))
        })
        .collect()
}

/// Waits until the server of `state` has no process left; panics naming them after 20 s.
fn assert_server_gone(state: &Path, after: &str) {
    let gone = wait_until(Duration::from_secs(20), || server_processes(state).is_empty());
    let left: Vec<String> = server_processes(state)
        .iter()
        .map(|pid| fs::read_to_string(format!("/proc/{pid}/cmdline")).unwrap_or_default().replace('\0', " "))
        .collect();
    assert!(gone, "the vllm server outlived its worker {after}: {left:?}");
}

fn metrics(state: &Path) -> Vec<MetricsLine> {
    fs::read_to_string(state.join("metrics.jsonl"))
        .unwrap_or_default()
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect()
}

fn steps_done(state: &Path) -> u64 {
    metrics(state).iter().filter(|line| line.is_step()).map(|line| line.step).max().unwrap_or(0)
}

struct Run {
    spec: PathBuf,
    state: PathBuf,
    plugins: PathBuf,
    python: PathBuf,
}

impl Run {
    /// The worker, resuming when `resume`, with `fault` (`RLVR_VLLM_SYNC_FAULT`) when given.
    fn command(&self, resume: bool, fault: Option<&str>) -> Command {
        let mut extra = vec!["--threads", "1", "--vllm-python", self.python.to_str().unwrap()];
        if resume {
            extra.push("--resume");
        }
        let mut command = worker_command(&self.spec, &self.state, &self.plugins, &extra);
        if let Some(fault) = fault {
            command.env("RLVR_VLLM_SYNC_FAULT", fault);
        }
        command
    }

    /// Runs to its end; (exit code, stderr).
    fn finish(&self, resume: bool, fault: Option<&str>) -> (Option<i32>, String) {
        let output = self.command(resume, fault).output().unwrap();
        (output.status.code(), String::from_utf8_lossy(&output.stderr).into_owned())
    }

    /// Starts it, and returns it once it has done step `step`.
    fn until_step(&self, step: u64) -> Child {
        let mut child =
            self.command(true, None).stdout(Stdio::null()).stderr(Stdio::piped()).spawn().unwrap();
        let reached = wait_until(Duration::from_secs(300), || {
            steps_done(&self.state) >= step || child.try_wait().unwrap().is_some()
        });
        assert!(reached && child.try_wait().unwrap().is_none(), "the run did not reach step {step}");
        child
    }
}

#[test]
fn broken_syncs_fail_the_step_after_them_the_server_dies_with_its_worker_and_synced_runs_agree_to_1e_3_on_and_off_policy()
 {
    let dir = tempfile::tempdir().unwrap();
    let data = arith_data(dir.path(), &["--seed", "3", "--sft", "1", "--train", "8", "--heldout", "1"]);
    let long: String = fs::read_to_string(data.join("train.jsonl"))
        .unwrap()
        .lines()
        .map(|line| {
            let mut record: serde_json::Value = serde_json::from_str(line).unwrap();
            record["prompt"] = format!("{PREAMBLE}{}", record["prompt"].as_str().unwrap()).into();
            format!("{record}\n")
        })
        .collect();
    fs::write(data.join("long.jsonl"), long).unwrap();
    let plugins = dir.path().join("plugins");
    fs::create_dir_all(&plugins).unwrap();
    for name in ["rlvr-optimizer-grpo", "rlvr-verifier-text-similarity"] {
        drop_in(&plugin_lib(name), &plugins, &format!("lib{}.so", name.replace('-', "_")));
    }
    let steps = 8;
    let spec_path = dir.path().join("job.toml");
    fs::write(&spec_path, spec(&data, steps)).unwrap();
    let run = Run {
        spec: spec_path,
        state: dir.path().join("state"),
        plugins,
        python: rlvr_tests::peer_python("scripts/vllm-venv.sh", &[]),
    };
    let sync_failed = "the weight sync before this step did not take";

    // The prefix cache kept: step 1 samples on the start's weights, step 2 on a reload whose
    // cache still holds step 1's prompts.
    let (code, stderr) = run.finish(false, Some("prefix-cache"));
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("step 2: ") && stderr.contains(sync_failed), "{stderr}");
    assert_server_gone(&run.state, "after a failed step");

    // The output layer left stale: the resumed run starts its server on step 1's checkpoint, samples
    // step 2 with it, and the reload after step 2 is the broken one.
    let (code, stderr) = run.finish(true, Some("tied-output"));
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("step 3: ") && stderr.contains(sync_failed), "{stderr}");
    assert_server_gone(&run.state, "after a failed step");

    // kill -9 of the worker: nothing of it runs, the kernel ends the server.
    let mut child = run.until_step(3);
    assert!(!server_processes(&run.state).is_empty(), "no server found for the running worker");
    child.kill().unwrap();
    child.wait().unwrap();
    assert_server_gone(&run.state, "killed with SIGKILL");

    // A stop request (the daemon's cancel or preemption): checkpoint, exit 75, server gone.
    let child = run.until_step(5);
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(child.id() as i32), nix::sys::signal::Signal::SIGTERM)
        .unwrap();
    let output = child.wait_with_output().unwrap();
    assert_eq!(output.status.code(), Some(75), "{}", String::from_utf8_lossy(&output.stderr));
    assert_server_gone(&run.state, "stopped with SIGTERM");

    // Resumed to the end: every step's samples are the trainer's weights' to 1e-3.
    let (code, stderr) = run.finish(true, None);
    assert_eq!(code, Some(0), "{stderr}");
    assert_server_gone(&run.state, "at the end of its run");
    let lines: Vec<MetricsLine> = metrics(&run.state).into_iter().filter(MetricsLine::is_step).collect();
    assert_eq!(
        lines.iter().map(|line| line.step).collect::<Vec<_>>(),
        (1..=u64::from(steps)).collect::<Vec<_>>()
    );
    for line in &lines {
        let gap = line.sampler_gap.unwrap_or_else(|| panic!("step {}: no sampler gap", line.step));
        assert!(gap.max_abs < 1e-3 && gap.mean_abs < 1e-4, "step {}: {gap:?}", line.step);
        assert!((gap.importance_weight_mean - 1.0).abs() < 1e-3, "step {}: {gap:?}", line.step);
        let time = line.time.as_ref().unwrap();
        assert!(time.sync_s.is_some_and(|s| s > 0.0), "step {}: {time:?}", line.step);
        // The updates are real: the policy moved (the trainer's loss and gradient are its own).
        assert!(line.grad_norm.is_some_and(|norm| norm > 0.0), "step {}: {line:?}", line.step);
    }
    // The record says how the run samples.
    let record: serde_json::Value =
        serde_json::from_str(&fs::read_to_string(run.state.join("job.json")).unwrap()).unwrap();
    assert_eq!(record["spec"]["rollout"]["engine"], "vllm", "{record}");

    // One step off policy, through a daemon of two CPU slots: admitted onto both (the trainer's
    // and the server's), each step holding them from start to end. Step 1 samples the starting
    // weights; each later step's round was sampled while the step before it updated, from exactly
    // the weights that step started from (their log-probabilities, recomputed from the trainer's
    // copy, within 1e-3 of vLLM's), not the newer ones it trains (further off).
    let redis = Redis::start();
    let config = format!(
        "[queue]\nworker_threads = 1\n[devices]\ncpu_slots = 2\ncpu_slot_memory_gb = 8\n[engines]\nvllm_python = {:?}\n",
        run.python
    );
    let daemon =
        Daemon::start_with(&["rlvr-optimizer-grpo", "rlvr-verifier-text-similarity"], &redis.url(), &config);
    let off_steps = 4;
    let id = submit_ok(&daemon, &off_policy_spec(&data, off_steps));
    let done = wait_job(&daemon, &id, Duration::from_secs(600), ended);
    let state = daemon.state.join("jobs").join(&id).join("run");
    let worker_log = fs::read_to_string(state.with_file_name("worker.log")).unwrap_or_default();
    assert_eq!(done.state, JobState::Published, "{done}\n{worker_log}");
    assert_eq!(done.devices, ["cpu:0", "cpu:1"], "{done}");
    assert_server_gone(&state, "at the end of its run");
    let lines: Vec<MetricsLine> = metrics(&state).into_iter().filter(MetricsLine::is_step).collect();
    assert_eq!(lines.len(), off_steps as usize);
    for line in &lines {
        let lag = u64::from(line.step > 1);
        assert_eq!(line.policy_lag, Some(lag), "step {}", line.step);
        let gap = line.sampler_gap.unwrap_or_else(|| panic!("step {}: no sampler gap", line.step));
        assert!(gap.max_abs < 1e-3 && gap.mean_abs < 1e-4, "step {}: {gap:?}", line.step);
        let newer = line.log_ratio_first_update_max_abs.unwrap();
        if lag == 1 {
            assert!(
                newer > 1e-3,
                "step {}: the trained weights are the sampling ones ({newer:e})",
                line.step
            );
        }
    }
    for line in fs::read_to_string(state.join("rollouts.jsonl")).unwrap().lines() {
        let record: serde_json::Value = serde_json::from_str(line).unwrap();
        let step = record["step"].as_u64().unwrap();
        assert_eq!(record["checkpoint_step"].as_u64(), Some(step.saturating_sub(2)), "{record}");
    }
}
