//! The built-in `reward-model` grader end to end: a GRPO job on `builtin:tiny-arith` whose reward
//! is the math verifier and a tiny reward model made here (`rlvr_model::reward`), run by the real
//! worker to its end with a grant socket, the reward model's scores in the metrics' components and
//! its own `reward` grant phase asked for and given back; and specs whose reward model is a
//! server path, another team's line or the built-in language model refused at submit, naming
//! `verifiers[1].model`.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Output;

use rlvr_model::reward::RewardModel;
use rlvr_protocol::jobdir::RunDir;
use rlvr_protocol::worker::WorkerExit;
use rlvr_tests::jobs::submit;
use rlvr_tests::{
    Daemon, OTHER_TOKEN, PERMISSIVE_GATES, Redis, arith_data, arith_grpo_spec, worker_command, worker_plugins,
};
use tch::{Device, Kind};

/// A one-label reward model on the built-in model's backbone (its tokenizer: one token a
/// character), saved as transformers saves one.
fn tiny_reward_model(dir: &Path) -> PathBuf {
    let base = rlvr_model::load("builtin:tiny-arith?seed=5", Device::Cpu, Kind::Float).unwrap();
    let path = dir.join("rm");
    RewardModel::from_base(&base, 1, 3).unwrap().save_pretrained(&path).unwrap();
    path
}

/// The arithmetic GRPO spec with a second grader: the reward model at `model`.
fn spec_with_reward_model(data: &Path, model: &str, steps: u32) -> String {
    arith_grpo_spec(data, "arith-rm", "builtin:tiny-arith", steps, 1).replace(
        "fallback = \"last\"\n",
        &format!(
            "fallback = \"last\"\n\n[[verifiers]]\nplugin = \"reward-model\"\nname = \"rm\"\nweight = 0.5\n\
             model = {model:?}\nnormalize = \"sigmoid\"\nbatch_size = 3\nmax_length = 6\n"
        ),
    ) + PERMISSIVE_GATES
}

#[test]
fn a_grpo_job_rewarded_by_a_reward_model_runs_to_its_end_in_a_reward_phase() {
    let dir = tempfile::tempdir().unwrap();
    let plugins = worker_plugins(dir.path());
    let data = arith_data(dir.path(), &["--train", "16", "--heldout", "4", "--sft", "0"]);
    let model = tiny_reward_model(dir.path());
    let spec = dir.path().join("rm.toml");
    fs::write(&spec, spec_with_reward_model(&data, model.to_str().unwrap(), 2)).unwrap();
    let socket = dir.path().join("sched.sock");
    let peer = rlvr_tests::grants::grant_peer(&socket, None, None);
    let state = dir.path().join("state");
    let output: Output = worker_command(&spec, &state, &plugins, &[])
        .arg("--grant-socket")
        .arg(&socket)
        .args(["--job-id", "J1"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(i32::from(WorkerExit::Finished.code())), "{stderr}");
    let requests = peer.join().unwrap();

    let metrics = RunDir::at(state).read_metrics().unwrap();
    let steps: Vec<_> = metrics.iter().filter(|line| line.is_step()).collect();
    assert_eq!(steps.len(), 2, "{metrics:?}");
    for line in &steps {
        let components = line.components.as_ref().expect("a step's reward components");
        // The sigmoid of a logit: in (0, 1), and the logit beside it.
        let rm = components["rm"];
        assert!(rm > 0.0 && rm < 1.0, "{components:?}");
        assert!(components.contains_key("rm.logit") && components.contains_key("math"), "{components:?}");
        // Tiny-arith's prompts and completions are longer than 6 characters: every row cut from
        // the left, so the step's fraction of cut rows is 1.
        assert_eq!(components.get("rm.truncated"), Some(&1.0), "{components:?}");
    }
    // The reward model scored in its own phase, once per step and per evaluation at least,
    // each grant given back.
    let rewards = requests.iter().filter(|r| *r == "acquire reward").count();
    assert!(rewards >= 2, "{requests:?}");
    let acquired = requests.iter().filter(|r| r.starts_with("acquire")).count();
    assert_eq!(requests.iter().filter(|r| *r == "release").count(), acquired, "{requests:?}");
}

#[test]
fn a_reward_model_named_by_a_server_path_or_another_teams_line_is_refused_at_submit() {
    let redis = Redis::start();
    let daemon = Daemon::start_with(
        &["rlvr-optimizer-grpo", "rlvr-verifier-math"],
        &redis.url(),
        "[devices]\ncpu_slots = 1\ncpu_slot_memory_gb = 8\n",
    );
    let dir = tempfile::tempdir().unwrap();
    let data = arith_data(dir.path(), &[]);
    let model = tiny_reward_model(dir.path());
    let spec = |to: &str| {
        spec_with_reward_model(&data, to, 1)
            .replace("team = \"tests\"", "team = \"others\"")
            .replace("model_line = \"tiny-arith\"", "model_line = \"others-line\"")
            + "[resources]\nmemory_gb = 8\n"
    };
    // (model, field, words of the message)
    let cases = [
        // regression-to-be: a reward model named by the server path of a checkpoint
        (model.to_str().unwrap(), "verifiers[1].model", "server path"),
        ("/etc", "verifiers[1].model", "server path"),
        ("line:tiny-arith@1", "verifiers[1].model", "no model line"),
        ("base:anything", "verifiers[1].model", "no base model"),
        ("builtin:tiny-arith", "verifiers[1].model", "not a reward model"),
    ];
    for (model, field, words) in cases {
        let (status, body) = submit(&daemon, OTHER_TOKEN, &spec(model), None);
        assert_eq!(status, 422, "{model}: {body}");
        assert_eq!(body["error"]["field"], field, "{model}: {body}");
        let message = body["error"]["message"].as_str().unwrap_or_default();
        assert!(message.contains(words), "{model}: {message:?} lacks {words:?}");
    }
    // Its keys are checked without a plugin lookup, each refusal naming the key.
    let keys = [
        ("batch_size = 3", "batch_size = 0", "verifiers[1].batch_size"),
        ("normalize = \"sigmoid\"", "normalize = \"tanh\"", "verifiers[1].normalize"),
        ("max_length = 6", "max_length = 6\nmodle = 1", "verifiers[1].modle"),
    ];
    for (from, to, field) in keys {
        let (status, body) = submit(&daemon, OTHER_TOKEN, &spec("base:anything").replace(from, to), None);
        assert_eq!(status, 422, "{to}: {body}");
        assert_eq!(body["error"]["field"], field, "{to}: {body}");
    }
}
