//! `[engine] kind = "trl"` through `rlvrd serve` with a real Redis: a GRPO job on
//! `builtin:tiny-arith` (exported to a Hugging Face directory by the worker) trains on TRL's
//! GRPOTrainer with 2 gloo ranks on 2 CPU slots, its rewards from the daemon's `math` grader over
//! `POST /v1/verify` with a token of its own, the ranks sharding the model with FSDP2; a SIGTERM
//! of the daemon mid-run checkpoints the engine at a step every rank agrees on (each rank its
//! shard) and requeues the job, which resumes from the engine's checkpoint and is published. SFT
//! and DPO jobs on DDP ranks, and DPO again sharded, ending on DDP's weights. The same through a Ray head the test starts (its Jobs API: submit,
//! status, logs, stop). The engines' environments are `scripts/engine-venv.sh`'s.

use std::fs;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use rlvr_protocol::job::JobState;
use rlvr_tests::jobs::{client, ended, states, submit, submit_ok, wait_job, worker_pids};
use rlvr_tests::{
    Daemon, OTHER_TOKEN, PERMISSIVE_GATES, Redis, TEAM_TOKEN, arith_data, arith_grpo_spec, free_port,
    wait_until,
};
use serde_json::{Value, json};

const PLUGINS: [&str; 2] = ["rlvr-optimizer-grpo", "rlvr-verifier-math"];
const PLUGINS_SFT: [&str; 2] = ["rlvr-optimizer-sft", "rlvr-verifier-math"];
const PLUGINS_DPO: [&str; 2] = ["rlvr-optimizer-dpo", "rlvr-verifier-math"];

/// An engine's python (`trl` or `ray`), its venv made (or found) by the project's own script.
fn engine_python(engine: &str) -> PathBuf {
    rlvr_tests::peer_python("scripts/engine-venv.sh", &[engine])
}

/// Four CPU slots (one per rank), the engine (`engines` lines), and the default heartbeat (2 s,
/// 3 missed): no test here kills a daemon, and with 0.5 s ones a loaded machine lapsed a queue
/// worker's heartbeats mid-job (it restarted, "worker not registered"), which let a SIGTERM's
/// drain end without the job (the daemon exited in 0.1 s, the Ray job left running).
fn config(engines: &str) -> String {
    let engines = if engines.is_empty() { String::new() } else { format!("[engines]\n{engines}") };
    format!(
        "[queue]\nheartbeat_ms = 2000\nmissed_heartbeats = 3\nworker_threads = 1\nmax_crashes = 3\n\
         stop_timeout_s = 60\n[devices]\ncpu_slots = 4\ncpu_slot_memory_gb = 8\n{engines}"
    )
}

/// A GRPO job of `steps` on the arithmetic data, checkpointed every 5, on the trl engine with one
/// process on each of 2 devices, started by `launcher`, the model held by `strategy`.
fn spec(data: &std::path::Path, steps: u32, launcher: &str, strategy: &str) -> String {
    format!(
        "{}\n{PERMISSIVE_GATES}[resources]\ndevices = 2\nmemory_gb = 2\n[engine]\nkind = \"trl\"\nlauncher = \"{launcher}\"\n\
         strategy = \"{strategy}\"\n",
        arith_grpo_spec(data, "on-trl", "builtin:tiny-arith", steps, 5)
    )
}

/// A `POST /v1/verify` body: one completion for the math grader.
fn one_graded_item() -> Value {
    json!({"grader": {"plugin": "math", "fallback": "last"}, "items": [{"id": "a", "completion": "4", "reference": {"answer": "4"}}]})
}

/// `RLVR_JOB_TOKEN` of the running worker of job `id`, read from its environment as its own
/// user can.
fn job_token(id: &str) -> String {
    let pid = *worker_pids(id).first().expect("the worker runs");
    let environ = fs::read(format!("/proc/{pid}/environ")).unwrap();
    environ
        .split(|&byte| byte == 0)
        .find_map(|entry| entry.strip_prefix(b"RLVR_JOB_TOKEN="))
        .map(|token| String::from_utf8(token.to_vec()).unwrap())
        .expect("an engine job's worker has RLVR_JOB_TOKEN")
}

/// Four FSDP2 ranks grade in their job's own lane while two teams' dry-runs run in theirs: no
/// 429 on either side.
#[test]
fn a_trl_job_on_four_sharded_ranks_grades_beside_dry_runs_and_a_daemon_sigterm_resumes_it_from_the_engines_checkpoint()
 {
    let python = engine_python("trl");
    let redis = Redis::start();
    let mut daemon =
        Daemon::start_with(&PLUGINS, &redis.url(), &config(&format!("trl_python = {python:?}\n")));
    let dir = tempfile::tempdir().unwrap();
    let data = arith_data(dir.path(), &[]);
    // 4 ranks: a step's 16 completions in passes of 4 on each.
    let spec = spec(&data, 30, "local", "fsdp2")
        .replace("devices = 2\n", "devices = 4\n")
        .replace("micro_batch_size = 8\n", "micro_batch_size = 4\n");
    let id = submit_ok(&daemon, &spec);
    let running = wait_job(&daemon, &id, Duration::from_secs(240), |job| job.step >= 3 || ended(job));
    let run = daemon.state.join("jobs").join(&id).join("run");
    let worker_log = || fs::read_to_string(run.with_file_name("worker.log")).unwrap_or_default();
    assert!(!ended(&running), "{running}\n{}", worker_log());

    // Two teams' dry-runs at once, round after round, while the ranks grade their steps: each
    // answered, none 429 (the dry-runs' limit is theirs, the job's lane its own).
    let dry_run = |token: &'static str| {
        let url = format!("{}/v1/verify", daemon.url);
        move || {
            client().post(url).bearer_auth(token).json(&one_graded_item()).send().unwrap().status().as_u16()
        }
    };
    for _ in 0..8 {
        let (ours, theirs) =
            (std::thread::spawn(dry_run(TEAM_TOKEN)), std::thread::spawn(dry_run(OTHER_TOKEN)));
        assert_eq!(
            (ours.join().unwrap(), theirs.join().unwrap()),
            (200, 200),
            "dry-runs beside a 4-rank job"
        );
    }
    let graded_beside = wait_job(&daemon, &id, Duration::from_secs(10), |_| true).step;

    // The job's token grades as its team on the verify route, and reaches nothing else.
    let token = job_token(&id);
    // The engine's ranks grade on the same route, in their job's lane of one request per rank
    // (no team's dry-runs take it): a fifth is 429 "busy" with Retry-After, waited out as the
    // ranks do.
    let mut verify = None;
    for _ in 0..30 {
        let answer = client()
            .post(format!("{}/v1/verify", daemon.url))
            .bearer_auth(&token)
            .json(&one_graded_item())
            .send()
            .unwrap();
        if answer.status().as_u16() != 429 {
            verify = Some(answer);
            break;
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    let verify = verify.expect("the verify route was busy for 15 s");
    assert_eq!(verify.status().as_u16(), 200);
    let graded: Value = verify.json().unwrap();
    assert_eq!(graded["results"][0]["passed"], true, "{graded}");
    let elsewhere = client().get(format!("{}/v1/jobs", daemon.url)).bearer_auth(&token).send().unwrap();
    assert_eq!(elsewhere.status().as_u16(), 403);

    // SIGTERM: the ranks agree on a step, checkpoint there, the worker exits interrupted.
    let status = daemon.stop();
    assert!(status.success(), "{status}\n{}", worker_log());
    let checkpoints: Vec<u64> = fs::read_dir(run.join("engine/output"))
        .unwrap()
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.strip_prefix("checkpoint-")?.parse().ok())
        .collect();
    let stopped_at = checkpoints.iter().copied().max().expect("an engine checkpoint");
    assert!((3..30).contains(&stopped_at), "checkpoints {checkpoints:?}");

    daemon.restart();
    let done = wait_job(&daemon, &id, Duration::from_secs(300), ended);
    let log = fs::read_to_string(daemon.state.join("jobs").join(&id).join("worker.log")).unwrap_or_default();
    assert_eq!(done.state, JobState::Published, "{done}\n{log}");
    assert_eq!(done.crashes, 0, "a clean stop is no crash: {done}");
    assert!(
        log.contains(&format!("checkpoint-{stopped_at}")) && log.contains("resuming from the newest"),
        "{log}"
    );
    let states = states(&daemon, &id);
    let stop = states.iter().position(|s| *s == JobState::Preempted).expect("preempted");
    assert_eq!(states[stop + 1], JobState::Queued, "{states:?}");
    assert!(states.ends_with(&[JobState::Evaluating, JobState::Published]), "{states:?}");

    // Every step once, as an uninterrupted run logs them.
    let lines = every_step_once(&run, 30);
    // No rank waited on a busy grading route while the dry-runs ran (after them, the test's own
    // request in the job's lane may have made one wait).
    for line in &lines[1..=graded_beside as usize] {
        assert_eq!(line["verifier_busy"], 0, "a rank met a 429 beside the dry-runs: {line}");
    }
    // The engine's steps carry the daemon's verdicts (passed comes from the math grader), and the
    // largest rank's memory.
    for line in &lines[1..31] {
        assert!(line["reward_mean"].is_f64() && line["passed_frac"].is_f64(), "{line}");
        assert!(line["time"]["step_s"].as_f64().unwrap() > 0.0, "{line}");
        assert!(line["rank_state_bytes"].as_u64() > Some(0) && line["peak_memory_bytes"].as_u64() > Some(0));
    }
    // The FSDP2 ranks wrote their shards of each checkpoint, resumed from them, and the final
    // model was gathered into one Hugging Face directory.
    let kept: Vec<PathBuf> = fs::read_dir(run.join("engine/output"))
        .unwrap()
        .flatten()
        .map(|entry| entry.path())
        .filter(|path| path.file_name().unwrap().to_string_lossy().starts_with("checkpoint-"))
        .collect();
    assert!(
        !kept.is_empty() && kept.iter().all(|checkpoint| checkpoint.join("pytorch_model_fsdp_0").is_dir()),
        "{kept:?}"
    );
    assert!(lines[0]["heldout"]["accuracy"].is_f64() && lines[31]["heldout"]["accuracy"].is_f64());
    // Published as any job: the manifest, the model a HF directory.
    let published = done.published_dir();
    let manifest: Value =
        serde_json::from_slice(&fs::read(published.join("manifest.json")).unwrap()).unwrap();
    assert_eq!(manifest["job_id"], id.as_str());
    assert_eq!(manifest["step"], 30);
    assert_eq!(manifest["weights_sha256"], done.weights());
    for file in ["config.json", "model.safetensors", "tokenizer.json"] {
        assert!(published.join(file).is_file(), "{file} published");
    }
    // The job's token ended with its run.
    let after = client()
        .post(format!("{}/v1/verify", daemon.url))
        .bearer_auth(&token)
        .json(&json!({"grader": {"plugin": "math"}, "items": []}))
        .send()
        .unwrap();
    assert_eq!(after.status().as_u16(), 401);
    assert!(wait_until(Duration::from_secs(10), || processes_of(&id) == 0), "no rank left behind");
}

/// Submits `spec`, waits for it to be published, and checks its `metrics.jsonl`
/// ([`every_step_once`]). Returns those lines, the worker's log and the run directory.
fn published_with_every_step(daemon: &Daemon, spec: &str, steps: u64) -> (Vec<Value>, String, PathBuf) {
    let id = submit_ok(daemon, spec);
    let done = wait_job(daemon, &id, Duration::from_secs(300), ended);
    let run = daemon.state.join("jobs").join(&id).join("run");
    let worker_log = fs::read_to_string(run.with_file_name("worker.log")).unwrap_or_default();
    assert_eq!(done.state, JobState::Published, "{done}\n{worker_log}");
    (every_step_once(&run, steps), worker_log, run)
}

/// The run's `metrics.jsonl`, which must log what an uninterrupted run logs: held-out before, each
/// of the engine's `steps` once (a resume drops the lines after the engine's checkpoint, whose
/// steps run again), held-out after.
fn every_step_once(run: &std::path::Path, steps: u64) -> Vec<Value> {
    let text = fs::read_to_string(run.join("metrics.jsonl")).unwrap();
    let lines: Vec<Value> = text.lines().map(|line| serde_json::from_str(line).unwrap()).collect();
    let logged: Vec<u64> = lines.iter().map(|line| line["step"].as_u64().unwrap()).collect();
    let expected: Vec<u64> = std::iter::once(0).chain(1..=steps).chain(std::iter::once(steps)).collect();
    assert_eq!(logged, expected);
    lines
}

/// The environments of job `id`'s engine processes (torchrun and the ranks: those whose command
/// line names the job's contract), as their own user reads them.
fn ranks_environments(id: &str) -> Vec<String> {
    let needle = format!("/jobs/{id}/run/engine/contract.json");
    let Ok(entries) = fs::read_dir("/proc") else { return Vec::new() };
    let environments: Vec<String> = entries
        .flatten()
        .filter(|entry| {
            fs::read(entry.path().join("cmdline"))
                .is_ok_and(|cmdline| String::from_utf8_lossy(&cmdline).contains(&needle))
        })
        .filter_map(|entry| fs::read(entry.path().join("environ")).ok())
        .map(|environ| String::from_utf8_lossy(&environ).into_owned())
        .collect();
    assert!(!environments.is_empty(), "no engine process of job {id} found");
    environments
}

/// Processes whose command line names job `id`'s directory: its worker, torchrun, the ranks.
fn processes_of(id: &str) -> usize {
    let Ok(entries) = fs::read_dir("/proc") else { return 0 };
    let needle = format!("/jobs/{id}/");
    entries
        .flatten()
        .filter(|entry| {
            fs::read(entry.path().join("cmdline"))
                .is_ok_and(|cmdline| String::from_utf8_lossy(&cmdline).contains(&needle))
        })
        .count()
}

/// SFT on the engine: the cold start of the learning tests, on TRL's SFTTrainer with 2 ranks,
/// through the daemon to published; the loss falls and held-out rises from the untrained model.
/// The worker is killed (SIGKILL) at both points after its engine's last step: before it has a
/// checkpoint of its own (the resume finds the engine's final model whole and does not start the
/// engine again), and in the gates' evaluation after it (the resume only ends the job); each time
/// the daemon requeues it, and it is published with every step logged once.
#[test]
fn an_sft_job_on_the_trl_engine_trains_on_two_ranks_resumes_from_a_kill_at_each_point_after_it_and_is_published()
 {
    let python = engine_python("trl");
    let redis = Redis::start();
    let daemon =
        Daemon::start_with(&PLUGINS_SFT, &redis.url(), &config(&format!("trl_python = {python:?}\n")));
    let dir = tempfile::tempdir().unwrap();
    let data = arith_data(dir.path(), &[]);
    // 150 held-out prompts (arith_data's): the gates' evaluation, the second point, as long as it
    // can be.
    let spec = format!(
        "[job]\nname = \"sft-on-trl\"\nteam = \"tests\"\nmodel_line = \"tiny-arith\"\nseed = 7\n\
         [model]\npolicy = \"builtin:tiny-arith\"\n[data]\ntrain = \"{data}/sft.jsonl\"\nheldout = \"{data}/heldout.jsonl\"\n\
         [optimizer]\nplugin = \"sft\"\nlr = 1e-3\nmicro_batch_size = 8\n[[verifiers]]\nplugin = \"math\"\nfallback = \"last\"\n\
         [rollout]\nprompts_per_step = 16\nmax_new_tokens = 5\n[budget]\nmax_steps = 30\n[checkpoint]\nevery_steps = 10\n\
         [eval]\nmax_prompts = 150\n{PERMISSIVE_GATES}[resources]\ndevices = 2\nmemory_gb = 2\n[engine]\nkind = \"trl\"\n",
        data = data.display()
    );
    let id = submit_ok(&daemon, &spec);
    let job_dir = daemon.state.join("jobs").join(&id);
    let run = job_dir.join("run");
    let worker_log = || fs::read_to_string(job_dir.join("worker.log")).unwrap_or_default();
    let latest = run.join("checkpoints/LATEST");
    let signal_all = |pids: &[u32], signal: nix::sys::signal::Signal| {
        for pid in pids {
            nix::sys::signal::kill(nix::unistd::Pid::from_raw(*pid as i32), signal).unwrap();
        }
    };
    let requeued_after = |killed: &[u32], point: &str| {
        let restarted = || worker_pids(&id).iter().any(|pid| !killed.contains(pid));
        assert!(wait_until(Duration::from_secs(60), restarted), "not requeued after the kill {point}");
    };
    // The first point, with no race: the worker frozen (SIGSTOP) while its engine still trains;
    // the engine ends and writes its whole final model; the worker, which never saw it end (no
    // weights loaded, no held-out score, no checkpoint of its own), is killed.
    wait_job(&daemon, &id, Duration::from_secs(240), |job| job.step >= 5);
    let first = worker_pids(&id);
    assert!(!first.is_empty(), "no worker to freeze:\n{}", worker_log());
    signal_all(&first, nix::sys::signal::Signal::SIGSTOP);
    let finished = run.join("engine/output/final/FINISHED");
    assert!(
        wait_until(Duration::from_secs(300), || finished.exists()),
        "the engine never finished:\n{}",
        worker_log()
    );
    assert!(!latest.exists(), "the worker checkpointed before it was frozen: the first point was missed");
    signal_all(&first, nix::sys::signal::Signal::SIGKILL);
    requeued_after(&first, "before the worker's checkpoint");
    // The second point: the resumed worker killed the moment its checkpoint is whole (LATEST is
    // written last), in the gates' evaluation that follows. Polled closely: that evaluation
    // lasts about a tenth of a second here.
    let checkpointed = Instant::now();
    while !latest.exists() {
        assert!(
            checkpointed.elapsed() < Duration::from_secs(300),
            "the resumed worker never checkpointed:\n{}",
            worker_log()
        );
        std::thread::sleep(Duration::from_millis(2));
    }
    let second: Vec<u32> = worker_pids(&id).into_iter().filter(|pid| !first.contains(pid)).collect();
    assert!(!second.is_empty(), "the resumed worker ended before it could be killed:\n{}", worker_log());
    signal_all(&second, nix::sys::signal::Signal::SIGKILL);
    requeued_after(&second, "after the worker's checkpoint");
    // The first resume found the engine finished (its final model whole) and did not start it
    // again; the second found the job's checkpoint and only ended the job.
    assert!(
        worker_log().contains("the engine had finished before this run; it is not started again"),
        "{}",
        worker_log()
    );
    let done = wait_job(&daemon, &id, Duration::from_secs(300), ended);
    let log = worker_log();
    assert_eq!(done.state, JobState::Published, "{done}\n{log}");
    assert_eq!(done.crashes, 2, "{done}");
    assert!(log.contains("resumed after the engine's end"), "{log}");
    let lines = every_step_once(&run, 30);
    let loss = |line: &Value| line["loss"].as_f64().unwrap();
    let (first, last) = (loss(&lines[1]), loss(&lines[30]));
    assert!(last < first * 0.8, "SFT loss {first:.3} → {last:.3}\n{log}");
    assert_eq!(lines[1]["rows"], 16, "{}", lines[1]);
    let manifest: Value =
        serde_json::from_slice(&fs::read(done.published_dir().join("manifest.json")).unwrap()).unwrap();
    assert_eq!(
        (manifest["step"].as_u64(), manifest["weights_sha256"].as_str()),
        (Some(30), Some(done.weights().as_str()))
    );
    let accuracy = |line: &Value| line["heldout"]["accuracy"].as_f64().unwrap();
    eprintln!(
        "SFT on trl: loss {first:.3} → {last:.3}, held-out {:.3} → {:.3}",
        accuracy(&lines[0]),
        accuracy(&lines[31])
    );
}

/// DPO on the engine: pairs preferring `a+1`'s true answer over one 3 off, on TRL's DPOTrainer
/// with 2 ranks (its reference the starting model), through the daemon to published; the
/// implicit reward's margin grows. The same job again with the ranks sharding the model (FSDP2)
/// ends on DDP's weights, each rank holding half the model.
#[test]
fn a_dpo_job_on_the_trl_engine_trains_on_two_ranks_and_is_published_and_sharded_ends_on_the_same_weights() {
    let python = engine_python("trl");
    let redis = Redis::start();
    let daemon =
        Daemon::start_with(&PLUGINS_DPO, &redis.url(), &config(&format!("trl_python = {python:?}\n")));
    let dir = tempfile::tempdir().unwrap();
    let pairs = dir.path().join("pairs.jsonl");
    let lines: Vec<String> = (0..64)
        .map(|i| {
            format!(r#"{{"id": "p{i}", "prompt": "{i}+1=", "chosen": "{}", "rejected": "{}"}}"#, i + 1, i + 4)
        })
        .collect();
    fs::write(&pairs, lines.join("\n") + "\n").unwrap();
    let heldout = dir.path().join("heldout.jsonl");
    let lines: Vec<String> = (64..80)
        .map(|i| format!(r#"{{"id": "h{i}", "prompt": "{i}+1=", "reference": {{"answer": "{}"}}}}"#, i + 1))
        .collect();
    fs::write(&heldout, lines.join("\n") + "\n").unwrap();
    let spec = format!(
        "[job]\nname = \"dpo-on-trl\"\nteam = \"tests\"\nmodel_line = \"tiny-arith\"\nseed = 7\n\
         [model]\npolicy = \"builtin:tiny-arith\"\n[data]\ntrain = {pairs:?}\nheldout = {heldout:?}\n\
         [optimizer]\nplugin = \"dpo\"\nlr = 1e-3\nmicro_batch_size = 8\nbeta = 0.1\n\
         [[verifiers]]\nplugin = \"math\"\nfallback = \"last\"\n\
         [rollout]\nprompts_per_step = 8\nmax_new_tokens = 5\n[budget]\nmax_steps = 12\n[checkpoint]\nevery_steps = 6\n\
         {PERMISSIVE_GATES}[resources]\ndevices = 2\nmemory_gb = 2\n[engine]\nkind = \"trl\"\n",
        pairs = pairs.display().to_string(),
        heldout = heldout.display().to_string()
    );
    let (lines, worker_log, ddp) = published_with_every_step(&daemon, &spec, 12);
    let margin = |line: &Value| line["reward_margin"].as_f64().unwrap();
    let (first, last) = (margin(&lines[1]), margin(&lines[12]));
    assert!(last > first, "DPO margin {first:.4} → {last:.4}\n{worker_log}");
    assert_eq!(lines[1]["rows"], 8, "{}", lines[1]);
    eprintln!("DPO on trl: margin {first:.4} → {last:.4}, loss {} → {}", lines[1]["loss"], lines[12]["loss"]);

    let sharded = spec.replace("dpo-on-trl", "dpo-on-trl-fsdp2") + "strategy = \"fsdp2\"\n";
    let (sharded_lines, worker_log, fsdp2) = published_with_every_step(&daemon, &sharded, 12);
    let state = |line: &Value| line["rank_state_bytes"].as_u64().unwrap();
    let (whole, shard) = (state(&lines[12]), state(&sharded_lines[12]));
    // Parameters and AdamW's two moments, split over 2 ranks (each layer's shard padded to an
    // even split).
    assert!(shard * 2 <= whole * 21 / 20 && shard < whole, "a rank's model: DDP {whole} B, FSDP2 {shard} B");
    for (a, b) in lines[1..=12].iter().zip(&sharded_lines[1..=12]) {
        let loss = |line: &Value| line["loss"].as_f64().unwrap();
        assert!(
            (loss(a) - loss(b)).abs() <= 1e-3 * loss(a).abs().max(1.0),
            "losses part: {a}\n{b}\n{worker_log}"
        );
    }
    let drift = same_training(&ddp, &fsdp2);
    eprintln!(
        "DPO under FSDP2: a rank's model {shard} B against DDP's {whole} B; weights apart by {drift:.1e} of DDP's update"
    );
}

/// How far apart the final weights of two engine runs (`ddp`, `fsdp2`) are, relative to how far
/// training moved them: the largest, over tensors, of ‖fsdp2 − ddp‖ / ‖ddp − start‖. Asserts
/// it is within float tolerance: the two reduce gradients in different orders, and AdamW's
/// normalised step turns a last-bit difference of a near-zero gradient into one of the step's
/// size, so the weights part by a little every step, not bitwise.
fn same_training(ddp: &std::path::Path, fsdp2: &std::path::Path) -> f64 {
    let read = |run: &std::path::Path, path: &str| -> std::collections::BTreeMap<String, tch::Tensor> {
        tch::Tensor::read_safetensors(run.join(path)).unwrap().into_iter().collect()
    };
    let (start, a, b) = (
        read(ddp, "engine/start-model/model.safetensors"),
        read(ddp, "engine/output/final/model/model.safetensors"),
        read(fsdp2, "engine/output/final/model/model.safetensors"),
    );
    assert_eq!(
        a.keys().collect::<Vec<_>>(),
        b.keys().collect::<Vec<_>>(),
        "the same tensors, tied ones left out"
    );
    let mut worst = 0.0f64;
    for (name, trained) in &a {
        let moved = (trained - &start[name]).norm().double_value(&[]);
        let apart = (trained - &b[name]).norm().double_value(&[]);
        assert!(moved > 0.0, "{name} did not train");
        worst = worst.max(apart / moved);
    }
    assert!(worst <= 0.05, "FSDP2's weights part from DDP's by {worst:.4} of the update");
    worst
}

#[test]
fn a_daemon_without_an_engine_refuses_its_jobs_naming_the_key_and_a_cpu_daemon_a_trl_job_on_vllm() {
    let redis = Redis::start();
    let daemon = Daemon::start_with(&PLUGINS, &redis.url(), &config(""));
    let dir = tempfile::tempdir().unwrap();
    let data = arith_data(dir.path(), &[]);
    let (status, answer) = submit(&daemon, TEAM_TOKEN, &spec(&data, 4, "local", "ddp"), None);
    assert_eq!(status, 422, "{answer}");
    assert_eq!(answer["error"]["field"], "engine.kind", "{answer}");
    assert!(answer["error"]["message"].as_str().unwrap().contains("engines.trl_python"), "{answer}");
    // A Ray job on two nodes, with neither the cluster nor its python configured.
    let two_nodes = spec(&data, 4, "ray", "ddp").replace("devices = 2\n", "devices = 1\nnodes = 2\n");
    let (status, answer) = submit(&daemon, TEAM_TOKEN, &two_nodes, None);
    assert_eq!(status, 422, "{answer}");
    let more = answer["error"]["more"].as_array().cloned().unwrap_or_default();
    let problems: Vec<(&str, &str)> = std::iter::once(&answer["error"])
        .chain(more.iter())
        .map(|problem| (problem["field"].as_str().unwrap(), problem["message"].as_str().unwrap()))
        .collect();
    assert!(problems.iter().any(|(field, _)| *field == "engine.launcher"), "{answer}");
    assert!(
        problems
            .iter()
            .any(|(field, message)| *field == "resources.nodes" && message.contains("engines.ray_python")),
        "{answer}"
    );
    // And a job whose rollouts are vLLM's, without engines.vllm_python.
    let vllm = rlvr_tests::arith_grpo_spec(&data, "on-vllm", "builtin:tiny-arith", 2, 1)
        .replace("[rollout]\n", "[rollout]\nengine = \"vllm\"\n");
    let (status, answer) = submit(&daemon, TEAM_TOKEN, &vllm, None);
    assert_eq!(status, 422, "{answer}");
    assert_eq!(answer["error"]["field"], "rollout.engine", "{answer}");
    assert!(answer["error"]["message"].as_str().unwrap().contains("engines.vllm_python"), "{answer}");
    // A trl job's vLLM is TRL's, colocated on CUDA devices: a daemon of CPU slots refuses it
    // there, whatever engines.vllm_python says.
    let trl_vllm = spec(&data, 4, "local", "ddp").replace("[rollout]\n", "[rollout]\nengine = \"vllm\"\n");
    let (status, answer) = submit(&daemon, TEAM_TOKEN, &trl_vllm, None);
    assert_eq!(status, 422, "{answer}");
    let more = answer["error"]["more"].as_array().cloned().unwrap_or_default();
    let refused = std::iter::once(&answer["error"])
        .chain(more.iter())
        .find(|problem| problem["field"] == "rollout.engine")
        .unwrap_or_else(|| panic!("rollout.engine not refused: {answer}"));
    assert!(refused["message"].as_str().unwrap().contains("CUDA devices only"), "{answer}");
}

/// A Ray cluster of its own for the test, two nodes on this machine (two `ray start`s, one CPU
/// each): the head, with its Jobs API on a free port and a stop that waits 60 s for the
/// entrypoint to checkpoint, and a second node joined to it; `ray stop` when dropped.
struct RayHead {
    ray: PathBuf,
    address: String,
}

impl RayHead {
    fn start() -> RayHead {
        let ray = engine_python("ray").with_file_name("ray");
        let (gcs, dashboard) = (free_port(), free_port());
        let started = Command::new(&ray)
            .args(["start", "--head", "--num-cpus=1", "--include-dashboard=true", "--disable-usage-stats"])
            .args([
                "--dashboard-host=127.0.0.1",
                &format!("--dashboard-port={dashboard}"),
                &format!("--port={gcs}"),
            ])
            // Worker ports away from the ephemeral range the two above came from.
            .args(["--min-worker-port=20000", "--max-worker-port=20999"])
            .env("RAY_JOB_STOP_WAIT_TIME_S", "60")
            .output()
            .expect("ray start");
        assert!(started.status.success(), "ray start:\n{}", String::from_utf8_lossy(&started.stderr));
        let joined = Command::new(&ray)
            .args(["start", &format!("--address=127.0.0.1:{gcs}"), "--num-cpus=1", "--disable-usage-stats"])
            .args(["--min-worker-port=21000", "--max-worker-port=21999"])
            .output()
            .expect("ray start --address");
        assert!(joined.status.success(), "ray start --address:\n{}", String::from_utf8_lossy(&joined.stderr));
        let address = format!("http://127.0.0.1:{dashboard}");
        let up = wait_until(Duration::from_secs(60), || {
            client()
                .get(format!("{address}/api/version"))
                .send()
                .is_ok_and(|answer| answer.status().is_success())
        });
        assert!(up, "the Ray head's Jobs API did not answer at {address}");
        RayHead { ray, address }
    }

    /// The cluster's record of its jobs (`GET /api/jobs/`: entrypoints, runtime environments,
    /// metadata), as the dashboard shows it.
    fn jobs_record(&self) -> String {
        client().get(format!("{}/api/jobs/", self.address)).send().unwrap().text().unwrap()
    }

    /// A cluster job's log so far (its entrypoint's output).
    fn logs(&self, submission: &str) -> String {
        let answer: Value = client()
            .get(format!("{}/api/jobs/{submission}/logs", self.address))
            .send()
            .unwrap()
            .json()
            .unwrap();
        answer["logs"].as_str().unwrap_or_default().to_owned()
    }

    /// The cluster's jobs that rlvr submitted: (submission id, status), oldest first.
    fn rlvr_jobs(&self) -> Vec<(String, String)> {
        let jobs: Vec<Value> = serde_json::from_str(&self.jobs_record()).unwrap();
        let mut ours: Vec<(u64, String, String)> = jobs
            .iter()
            .filter(|job| job["metadata"]["rlvr"] == "engine")
            .map(|job| {
                let started = job["start_time"].as_u64().unwrap_or(0);
                (
                    started,
                    job["submission_id"].as_str().unwrap().to_owned(),
                    job["status"].as_str().unwrap().to_owned(),
                )
            })
            .collect();
        ours.sort();
        ours.into_iter().map(|(_, id, status)| (id, status)).collect()
    }
}

impl Drop for RayHead {
    fn drop(&mut self) {
        let _ = Command::new(&self.ray).args(["stop", "--force"]).output();
    }
}

/// A job whose two ranks span the two nodes of a Ray cluster (one each: `resources.nodes = 2`),
/// placed by the launcher's placement group, torchrun on each node: stopped through the Jobs API
/// by a daemon's SIGTERM, resumed, its worker killed (the daemon stops the cluster job), resumed
/// again, published.
#[test]
fn a_ray_launched_trl_job_on_two_nodes_is_stopped_through_the_jobs_api_resumed_and_published() {
    let python = engine_python("trl");
    let ray = RayHead::start();
    let redis = Redis::start();
    let engines = format!(
        "trl_python = {python:?}\nray_address = {:?}\nray_python = {:?}\n",
        ray.address,
        ray.ray.with_file_name("python")
    );
    let mut daemon = Daemon::start_with(&PLUGINS, &redis.url(), &config(&engines));
    let dir = tempfile::tempdir().unwrap();
    let data = arith_data(dir.path(), &[]);
    // 40 steps: on two ranks a step of the untrained model takes ~0.1 s, and the stops below must
    // come before the engine's end.
    let spec = spec(&data, 40, "ray", "ddp").replace("devices = 2\n", "devices = 1\nnodes = 2\n");
    let id = submit_ok(&daemon, &spec);
    let running = wait_job(&daemon, &id, Duration::from_secs(240), |job| job.step >= 6 || ended(job));
    let run = daemon.state.join("jobs").join(&id).join("run");
    let worker_log = || fs::read_to_string(run.with_file_name("worker.log")).unwrap_or_default();
    assert!(!ended(&running), "{running}\n{}", worker_log());
    // Placed on both nodes at once (one CPU each: no node could hold both ranks), torchrun on each.
    let submission = ray.rlvr_jobs()[0].0.clone();
    let launched = ray.logs(&submission);
    assert!(launched.contains("placed; torchrun rendezvous at"), "{launched}");
    // The ranks grade with the job's token, read from a file only its owner can read: it is in
    // neither the cluster's record of the job (its runtime environment) nor any rank's
    // environment.
    let token = job_token(&id);
    assert!(!ray.jobs_record().contains(&token), "the job's token is in the Ray job's record");
    let token_file = daemon.state.join("jobs").join(&id).join("run/engine/job-token");
    let mode = std::os::unix::fs::PermissionsExt::mode(&fs::metadata(&token_file).unwrap().permissions());
    assert_eq!(mode & 0o777, 0o600, "{}", token_file.display());
    assert_eq!(fs::read_to_string(&token_file).unwrap(), token);
    assert!(
        ranks_environments(&id).iter().all(|environ| !environ.contains(&token)),
        "a rank has the token in its environment"
    );

    // The daemon's SIGTERM reaches the ranks as the Ray job's stop. The stop waits for the
    // daemon's exit as long as its own drain may take (its jobs' checkpoint at a step the ranks
    // agree on, through Ray), not a fixed few seconds a loaded machine can outlast.
    let stopping = Instant::now();
    let status = daemon.stop();
    eprintln!("the daemon stopped in {:.1?}", stopping.elapsed());
    assert!(status.success(), "{status}\n{}", worker_log());
    // The drain reached the job: without this, the Ray job left running says only that.
    assert!(
        daemon.log().contains("daemon stopping: asking the worker to checkpoint"),
        "the daemon exited {:.1?} after SIGTERM without asking its job's worker to checkpoint; its log:\n{}",
        stopping.elapsed(),
        daemon.log()
    );
    let submitted = ray.rlvr_jobs();
    assert_eq!(submitted.len(), 1, "{submitted:?}");
    assert_eq!(submitted[0].1, "STOPPED", "{submitted:?}\n{}\ndaemon log:\n{}", worker_log(), daemon.log());
    assert!(submitted[0].0.starts_with(&format!("rlvr-{id}-")), "{submitted:?}");

    daemon.restart();
    // The resumed run's worker killed (SIGKILL) while its cluster job runs: the daemon stops the
    // cluster job the worker recorded (it checkpoints, as for any stop), then requeues the job.
    // Killed as soon as its cluster job runs, so that the stop comes long before the last step.
    let second_running = || ray.rlvr_jobs().get(1).is_some_and(|(_, status)| status == "RUNNING");
    assert!(
        wait_until(Duration::from_secs(240), second_running),
        "no second cluster job: {:?}\n{}\ndaemon log:\n{}",
        ray.rlvr_jobs(),
        worker_log(),
        daemon.log()
    );
    let running = ray.rlvr_jobs();
    // The job's record names its cluster job (as the run directory does, for the daemon's stop).
    let submitted = |job: &rlvr_tests::jobs::Job| {
        job.progress.as_ref().and_then(|progress| progress.engine_submission.clone())
    };
    let resumed = wait_job(&daemon, &id, Duration::from_secs(10), |job| {
        job.state == JobState::Running && submitted(job).as_ref() == Some(&running[1].0)
    });
    assert_eq!(
        fs::read_to_string(run.join("engine/ray-submission")).unwrap(),
        running[1].0,
        "the worker records the cluster job it submits"
    );
    for pid in worker_pids(&id) {
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), nix::sys::signal::Signal::SIGKILL)
            .unwrap();
    }
    let stopped = wait_until(Duration::from_secs(150), || ray.rlvr_jobs()[1].1 == "STOPPED");
    assert!(
        stopped,
        "the killed worker's cluster job was not stopped: {:?}\n{}",
        ray.rlvr_jobs(),
        daemon.log()
    );
    let done = wait_job(&daemon, &id, Duration::from_secs(300), ended);
    assert_eq!(done.state, JobState::Published, "{done}\n{}", worker_log());
    assert_eq!(done.crashes, resumed.crashes + 1, "the kill is a crash: {done}");
    assert!(worker_log().contains("resuming from the newest"), "{}", worker_log());
    let submitted = ray.rlvr_jobs();
    let statuses: Vec<&str> = submitted.iter().map(|(_, status)| status.as_str()).collect();
    assert_eq!(statuses, ["STOPPED", "STOPPED", "SUCCEEDED"], "{submitted:?}");
    every_step_once(&run, 40);
}
