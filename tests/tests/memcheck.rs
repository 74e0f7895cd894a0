//! The worker's training path under valgrind's memcheck: a resume from a checkpoint (the model's
//! weights, the optimizer's state, the sampler's), then sampling, grading, forward and backward
//! (float32 linear layers through our oneDNN layer, `model/csrc/onednn_linear.cpp`, and
//! libtorch's kernels) and a checkpoint at every step to the end — with no invalid read, write or
//! free anywhere in the process: our Rust and C++, libtorch, oneDNN, glibc. The checkpoint it
//! resumes from is a stop's: a first worker, run as it is, stopped by SIGTERM at a step boundary.
//!
//! regression: workers aborted with "corrupted size vs. prev_size" after the checkpoint of a stop
//! (about one stop in 50): a SIGTERM handled on a thread inside oneDNN's AVX-512 GEMM kernel,
//! whose stack pointer points into its heap workspace, wrote its signal frame over the heap. Stop
//! signals are now taken by one thread of their own (`worker/src/lifecycle.rs`). Memcheck cannot
//! see that fault itself (valgrind's CPU has no AVX-512, so oneDNN runs its AVX2 kernels here, and
//! valgrind delivers signals on its own stack), but it sees every out-of-bounds access and bad
//! free on the same path, ours and the libraries'.
//!
//! Memcheck runs with `--undef-value-errors=no`: libtorch's pip build branches on bytes memcheck
//! cannot prove initialised (156 contexts in TensorIterator, cat and norm in a 3-step run, none in
//! our code); checking definedness there would report only those, at twice the time. A process
//! starts in ~70 s under memcheck (libtorch's static initialisers), so one process runs under it
//! (a second one, for the stop, took 100 s more of the suite), for a few steps of one prompt.

use std::fs;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use rlvr_protocol::worker::{Outcome, WorkerExit};
use rlvr_tests::{arith_data, drop_in, plugin_lib, wait_until, worker_command, workspace_root};

/// The run's steps: the first worker stops after one or two (a step takes ~0.3 s as it is), the
/// one under memcheck trains the rest (~5 s each).
const MAX_STEPS: u64 = 5;

/// Exit status memcheck gives a run with errors (none of the worker's own is 99).
const MEMCHECK_ERRORS: i32 = 99;

/// `rlvr-worker run` of `spec` under memcheck, its report in `report`.
fn under_memcheck(spec: &Path, state: &Path, plugins: &Path, report: &Path, extra: &[&str]) -> Command {
    let worker = worker_command(spec, state, plugins, &[extra, &["--threads", "1"]].concat());
    let mut command = Command::new("valgrind");
    command
        .arg(format!("--error-exitcode={MEMCHECK_ERRORS}"))
        .arg("--undef-value-errors=no")
        .arg("--leak-check=no")
        .arg("--num-callers=40")
        .arg("--read-inline-info=no")
        .arg(format!("--suppressions={}", workspace_root().join("tests/valgrind.supp").display()))
        .arg(format!("--log-file={}", report.display()))
        .arg(worker.get_program())
        .args(worker.get_args());
    for (name, value) in worker.get_envs() {
        if let Some(value) = value {
            command.env(name, value);
        }
    }
    command
}

/// Memcheck's verdict, or its report when it found errors.
fn assert_clean(report: &Path, run: &str) {
    let text =
        fs::read_to_string(report).unwrap_or_else(|error| panic!("{run}: no memcheck report: {error}"));
    assert!(text.contains("ERROR SUMMARY: 0 errors"), "{run}: memcheck found errors:\n{text}");
}

fn spawn(command: &mut Command, log: &Path) -> Child {
    let log = fs::File::create(log).unwrap();
    command.stdout(Stdio::piped()).stderr(log).spawn().unwrap_or_else(|error| {
        panic!("valgrind: {error} (scripts/setup.sh installs it from Debian's packages)")
    })
}

#[test]
fn the_training_path_stop_and_resume_have_no_invalid_access_or_free() {
    let dir = tempfile::tempdir().unwrap();
    let data =
        arith_data(dir.path(), &["--train", "16", "--heldout", "0", "--sft", "0", "--max-operand", "10"]);
    let plugins = dir.path().join("plugins");
    fs::create_dir_all(&plugins).unwrap();
    for name in ["rlvr-optimizer-grpo", "rlvr-verifier-math"] {
        drop_in(&plugin_lib(name), &plugins, &format!("lib{}.so", name.replace('-', "_")));
    }
    let spec = dir.path().join("job.toml");
    fs::write(
        &spec,
        format!(
            "[job]\nname = \"memcheck\"\nteam = \"tests\"\nmodel_line = \"tiny-arith\"\nseed = 7\n\
             [model]\npolicy = \"builtin:tiny-arith\"\n[data]\ntrain = \"{}/train.jsonl\"\n\
             [optimizer]\nplugin = \"grpo\"\ngroup_size = 2\nlr = 1e-3\nmicro_batch_size = 2\nkl_beta = 0.04\n\
             [[verifiers]]\nplugin = \"math\"\nfallback = \"last\"\n\
             [rollout]\nmax_new_tokens = 3\nprompts_per_step = 1\n\
             [budget]\nmax_steps = {MAX_STEPS}\n[checkpoint]\nevery_steps = 1\n",
            data.display()
        ),
    )
    .unwrap();
    let state = dir.path().join("state");

    // The first process, as it is: stopped by SIGTERM once its first step is logged; it
    // checkpoints at the step boundary and exits as interrupted.
    let log = dir.path().join("worker-1.log");
    let mut first = spawn(&mut worker_command(&spec, &state, &plugins, &["--threads", "1"]), &log);
    let stepped = wait_until(Duration::from_secs(120), || {
        fs::read_to_string(state.join("metrics.jsonl")).is_ok_and(|text| text.lines().count() >= 1)
    });
    let pid = Pid::from_raw(first.id() as i32);
    if !stepped {
        let _ = first.kill();
    }
    assert!(stepped, "no step in 120 s:\n{}", fs::read_to_string(&log).unwrap_or_default());
    kill(pid, Signal::SIGTERM).unwrap();
    let stopped = first.wait_with_output().unwrap();
    let worker_log = fs::read_to_string(&log).unwrap_or_default();
    assert_eq!(
        stopped.status.code(),
        Some(i32::from(WorkerExit::Interrupted.code())),
        "the stopped run: {}\n{worker_log}",
        stopped.status
    );
    let latest = fs::read_to_string(state.join("checkpoints/LATEST")).unwrap();
    let stopped_at: u64 = latest.trim().strip_prefix("step-").and_then(|step| step.parse().ok()).unwrap();
    assert!((1..MAX_STEPS).contains(&stopped_at), "the stop's checkpoint: {latest}");

    // The second, under memcheck, resumes from the stop's checkpoint and trains to the end.
    let (report, log) = (dir.path().join("memcheck.txt"), dir.path().join("worker-2.log"));
    let resumed = spawn(&mut under_memcheck(&spec, &state, &plugins, &report, &["--resume"]), &log);
    let resumed = resumed.wait_with_output().unwrap();
    let worker_log = fs::read_to_string(&log).unwrap_or_default();
    assert_clean(&report, "the resumed run");
    assert!(resumed.status.success(), "the resumed run: {}\n{worker_log}", resumed.status);
    let outcome: Outcome = serde_json::from_slice(&resumed.stdout).unwrap();
    assert_eq!(outcome.steps, MAX_STEPS, "{outcome:?}");
}
