//! Reward-model training with the `rm` optimizer, and RLHF's four models end to end.
//!
//! - The real worker trains a reward model on preference pairs made from the built-in arithmetic
//!   data (chosen: the right answer; rejected: a wrong one): its loss falls, its held-out pairwise
//!   accuracy rises, the gates' evaluation compares it with the starting model's fresh head, and
//!   its checkpoint is a sequence-classification directory the `reward-model` grader loads.
//! - Through `rlvrd serve`: an `rm` job publishes a reward model into a line, then a PPO job
//!   (policy, frozen reference, value head) rewarded by `[[verifiers]] plugin = "reward-model",
//!   model = "line:…"` runs to published.
//! - What does not fit an `rm` job is refused at submit, naming the key.

use std::fs;
use std::path::{Path, PathBuf};
use std::time::Duration;

use rlvr_model::reward::load_reward_model;
use rlvr_protocol::job::JobState;
use rlvr_protocol::jobdir::RunDir;
use rlvr_protocol::worker::{Outcome, WorkerExit};
use rlvr_tests::jobs::{ended, submit, submit_ok, wait_job};
use rlvr_tests::{Daemon, PERMISSIVE_GATES, Redis, TEAM_TOKEN, arith_data, worker_command, worker_plugins};
use serde_json::{Value, json};
use tch::{Device, Kind};

/// Preference pairs from a file of arithmetic prompts (`{"prompt", "reference": {"answer"}}`):
/// chosen, the right answer; rejected, a wrong one (the answer with a `0` appended: ten times it).
fn pairs_from(prompts: &Path, out: &Path) -> PathBuf {
    let text = fs::read_to_string(prompts).unwrap();
    let lines: Vec<String> = text
        .lines()
        .map(|line| {
            let record: Value = serde_json::from_str(line).unwrap();
            let answer = record["reference"]["answer"].as_str().unwrap();
            json!({
                "id": record["id"],
                "prompt": record["prompt"],
                "chosen": answer,
                "rejected": format!("{answer}0"),
            })
            .to_string()
        })
        .collect();
    fs::write(out, lines.join("\n") + "\n").unwrap();
    out.to_owned()
}

/// Train and held-out pairs in `dir`, from `rlvrd data arith`.
fn arith_pairs(dir: &Path, train: usize, heldout: usize) -> (PathBuf, PathBuf) {
    let data =
        arith_data(dir, &["--train", &train.to_string(), "--heldout", &heldout.to_string(), "--sft", "0"]);
    (
        pairs_from(&data.join("train.jsonl"), &dir.join("pairs-train.jsonl")),
        pairs_from(&data.join("heldout.jsonl"), &dir.join("pairs-heldout.jsonl")),
    )
}

/// An `rm` job on `train` (16 pairs a step), held-out pairs scored every `eval_every` steps.
fn rm_spec(train: &Path, heldout: &Path, line: &str, steps: u32, eval_every: u32) -> String {
    format!(
        r#"
[job]
name = "arith-rm"
team = "tests"
model_line = "{line}"
seed = 3

[model]
policy = "builtin:tiny-arith"

[data]
train = "{train}"
heldout = "{heldout}"

[optimizer]
plugin = "rm"
lr = 3e-3
micro_batch_size = 8

[rollout]
prompts_per_step = 16

[budget]
max_steps = {steps}

[checkpoint]
every_steps = {steps}

[eval]
every_steps = {eval_every}
"#,
        train = train.display(),
        heldout = heldout.display(),
    )
}

fn mean(values: &[f64]) -> f64 {
    values.iter().sum::<f64>() / values.len() as f64
}

#[test]
fn a_reward_model_learns_arith_pairs_its_loss_falls_and_pairwise_accuracy_rises() {
    let dir = tempfile::tempdir().unwrap();
    let plugins = worker_plugins(dir.path());
    let (train, heldout) = arith_pairs(dir.path(), 128, 48);
    let spec = dir.path().join("rm.toml");
    fs::write(&spec, rm_spec(&train, &heldout, "arith-rm", 40, 20) + PERMISSIVE_GATES).unwrap();
    let state = dir.path().join("state");
    let output = worker_command(&spec, &state, &plugins, &["--threads", "1"]).output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(i32::from(WorkerExit::Finished.code())), "{stderr}");

    let metrics = RunDir::at(state.clone()).read_metrics().unwrap();
    let losses: Vec<f64> = metrics.iter().filter(|l| l.is_step()).map(|l| l.loss.unwrap()).collect();
    assert_eq!(losses.len(), 40, "{metrics:?}");
    let (first, last) = (mean(&losses[..5]), mean(&losses[35..]));
    assert!(
        last < 0.7 * first,
        "the run did not learn: the loss should fall: first steps {first:.3}, last steps {last:.3}"
    );
    let accuracy: Vec<(u64, f64)> =
        metrics.iter().filter_map(|l| l.heldout.as_ref().map(|h| (l.step, h.accuracy))).collect();
    assert_eq!(accuracy.iter().map(|(step, _)| *step).collect::<Vec<_>>(), [0, 20, 40], "{accuracy:?}");
    let (before, after) = (accuracy[0].1, accuracy[2].1);
    assert!(
        after >= before + 0.25 && after >= 0.8,
        "the run did not learn: held-out pairwise accuracy {before} → {after}"
    );
    // Each step's plugin figures: the pairs it ranked right.
    assert!(metrics.iter().any(|l| l.optimizer.contains_key("opt.accuracy")), "{metrics:?}");

    // The gates compare the candidate with the start: the same backbone, the same fresh head.
    let outcome: Outcome = serde_json::from_str(String::from_utf8_lossy(&output.stdout).trim()).unwrap();
    let evaluation = outcome.evaluation.expect("the gates' evaluation");
    let candidate = evaluation.candidate.heldout.unwrap().figures.accuracy;
    let baseline = evaluation.baseline_scores.heldout.unwrap().figures;
    assert_eq!((baseline.accuracy, baseline.prompts), (before, 48), "the start, scored again");
    assert_eq!(candidate, after);

    // The checkpoint is what the reward-model grader loads: a sequence-classification directory.
    let model = RunDir::at(state).latest_checkpoint().unwrap().expect("a checkpoint").join("model");
    let config: Value = serde_json::from_slice(&fs::read(model.join("config.json")).unwrap()).unwrap();
    assert_eq!(config["architectures"], json!(["LlamaForSequenceClassification"]), "{config}");
    let loaded = load_reward_model(&model, Device::Cpu, Kind::Float).unwrap();
    assert_eq!(loaded.num_labels(), 1);
}

/// RLHF's four models: a reward model trained and published by an `rm` job, then a PPO job —
/// policy, frozen reference, value head — rewarded by it through the `reward-model` grader.
#[test]
fn rlhf_a_reward_model_then_ppo_rewarded_by_it_run_to_published() {
    let redis = Redis::start();
    let daemon = Daemon::start_with(
        &["rlvr-optimizer-rm", "rlvr-optimizer-ppo"],
        &redis.url(),
        "[queue]\nworker_threads = 1\n[devices]\ncpu_slots = 1\ncpu_slot_memory_gb = 8\n",
    );
    let dir = tempfile::tempdir().unwrap();
    let (train, heldout) = arith_pairs(dir.path(), 64, 16);
    let data = dir.path().join("data");

    let rm_job = submit_ok(&daemon, &(rm_spec(&train, &heldout, "arith-rm", 12, 12) + PERMISSIVE_GATES));
    let done = wait_job(&daemon, &rm_job, Duration::from_secs(180), ended);
    assert_eq!(done.state, JobState::Published, "{done}\n{}", daemon.log());
    let version = daemon.state.join("registry/arith-rm/1");
    let config: Value = serde_json::from_slice(&fs::read(version.join("config.json")).unwrap()).unwrap();
    assert_eq!(config["architectures"], json!(["LlamaForSequenceClassification"]), "{config}");

    let ppo = format!(
        r#"
[job]
name = "arith-rlhf"
team = "tests"
model_line = "tiny-arith"
seed = 5

[model]
policy = "builtin:tiny-arith"

[data]
train = "{data}/train.jsonl"
heldout = "{data}/heldout.jsonl"

[optimizer]
plugin = "ppo"
group_size = 1
lr = 1e-3
micro_batch_size = 8

[[verifiers]]
plugin = "reward-model"
name = "rm"
model = "line:arith-rm"
normalize = "sigmoid"

[rollout]
max_new_tokens = 4
prompts_per_step = 4

[budget]
max_steps = 3

[eval]
max_prompts = 8
"#,
        data = data.display()
    ) + PERMISSIVE_GATES;
    let ppo_job = submit_ok(&daemon, &ppo);
    let done = wait_job(&daemon, &ppo_job, Duration::from_secs(180), ended);
    assert_eq!(done.state, JobState::Published, "{done}\n{}", daemon.log());
    assert_eq!(done.step, 3, "{done}");
    // The reward model's scores were the reward: its component in every step's metrics.
    let run = RunDir::at(daemon.state.join("jobs").join(&ppo_job).join("run"));
    let steps: Vec<_> = run.read_metrics().unwrap().into_iter().filter(|l| l.is_step()).collect();
    assert_eq!(steps.len(), 3);
    for line in &steps {
        let rm = line.components.as_ref().unwrap()["rm"];
        assert!(rm > 0.0 && rm < 1.0, "{line:?}");
    }
}

/// What an `rm` job cannot use is refused at submit, naming the key as the spec writes it.
#[test]
fn an_rm_job_refuses_verifiers_canaries_and_lora_naming_the_key() {
    let redis = Redis::start();
    let daemon = Daemon::start_with(
        &["rlvr-optimizer-rm", "rlvr-verifier-math"],
        &redis.url(),
        "[devices]\ncpu_slots = 1\ncpu_slot_memory_gb = 8\n",
    );
    let dir = tempfile::tempdir().unwrap();
    let (train, heldout) = arith_pairs(dir.path(), 8, 4);
    let base = rm_spec(&train, &heldout, "arith-rm", 2, 1) + "[resources]\nmemory_gb = 8\n";
    let canaries = format!("[data]\ncanaries = \"{}\"", dir.path().join("data/heldout.jsonl").display());
    // (what is added or changed, field, words of the message)
    let cases = [
        (base.clone() + "[[verifiers]]\nplugin = \"math\"\n", "verifiers", "no verifier grades it"),
        (base.replace("[data]", &canaries), "data.canaries", "canaries are prompts"),
        (base.replace("[model]", "[model]\nlora = { rank = 4 }"), "model.lora", "LoRA is not supported"),
        (base.replace("lr = 3e-3", "lr = 3e-3\nmargin = -1"), "optimizer.margin", "≥ 0"),
    ];
    for (spec, field, words) in cases {
        let (status, body) = submit(&daemon, TEAM_TOKEN, &spec, None);
        assert_eq!(status, 422, "{field}: {body}");
        assert_eq!(body["error"]["field"], field, "{body}");
        let message = body["error"]["message"].as_str().unwrap_or_default();
        assert!(message.contains(words), "{field}: {message:?} lacks {words:?}");
    }
}

/// metrics.jsonl lines without their measurements (`time`, `peak_memory_bytes`: the only fields
/// allowed to differ between a run and its resume).
fn metrics_without_measurements(state: &Path) -> Vec<Value> {
    fs::read_to_string(state.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|line| {
            let mut value: Value = serde_json::from_str(line).unwrap();
            let line = value.as_object_mut().unwrap();
            line.remove("time");
            line.remove("peak_memory_bytes");
            value
        })
        .collect()
}

/// An `rm` job killed with SIGKILL past its step-4 checkpoint and resumed ends with the weights
/// and the metrics of an uninterrupted run, to the bit: the reward model, AdamW's state and the
/// data cursor are all in the checkpoint.
#[test]
fn an_rm_job_killed_and_resumed_ends_exactly_like_an_uninterrupted_one() {
    let dir = tempfile::tempdir().unwrap();
    let plugins = worker_plugins(dir.path());
    let (train, heldout) = arith_pairs(dir.path(), 40, 16);
    let spec = dir.path().join("rm.toml");
    let text = rm_spec(&train, &heldout, "arith-rm", 24, 6).replace("every_steps = 24", "every_steps = 4");
    fs::write(&spec, text + PERMISSIVE_GATES).unwrap();
    let outcome = |output: std::process::Output| -> Outcome {
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(output.status.success(), "{}: {stderr}", output.status);
        serde_json::from_slice(&output.stdout).unwrap()
    };
    let straight = dir.path().join("straight");
    let reference =
        outcome(worker_command(&spec, &straight, &plugins, &["--threads", "1"]).output().unwrap());

    let killed = dir.path().join("killed");
    let mut child = worker_command(&spec, &killed, &plugins, &["--threads", "1"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // Step 0's held-out line, then steps 1..=5: past the step-4 checkpoint.
    let past_step_5 = rlvr_tests::wait_until(Duration::from_secs(300), || {
        fs::read_to_string(killed.join("metrics.jsonl")).is_ok_and(|text| text.lines().count() >= 6)
    });
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(past_step_5, "the run never reached step 5");
    let resumed =
        outcome(worker_command(&spec, &killed, &plugins, &["--threads", "1", "--resume"]).output().unwrap());
    assert_eq!(resumed.weights_sha256, reference.weights_sha256, "weights differ after resume");
    assert_eq!(
        metrics_without_measurements(&killed),
        metrics_without_measurements(&straight),
        "metrics differ after resume"
    );
}
