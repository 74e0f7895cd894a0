//! The Tinker front door's training client process (`rlvr-worker tinker-client`), driven as the
//! daemon drives it: commands on its stdin, events on its stdout, the SDK's protobuf bodies and
//! answers inside. On `builtin:tiny-arith` with a LoRA adapter on every layer and the
//! unembedding.

use std::fs;
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

use rlvr_protocol::tinker::process::{Answer, ClientCommand, ClientEvent};
use rlvr_protocol::tinker::proto::{
    Chunk, DType, Datum, EncodedTextChunk, ForwardBackwardOutput, ForwardBackwardRequest, Message,
    SampleResponse, Tensor, chunk, tensor,
};
use rlvr_protocol::tinker::wire::{
    AdamParams, ErrorCategory, InputChunk, ModelInput, SampleParams, SampleRequest,
};
use rlvr_protocol::worker::TinkerClientArgs;
use rlvr_tests::artifact;

/// A training client's process and its pipes.
struct Process {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl Process {
    fn start(resume: Option<&std::path::Path>) -> Process {
        let args = TinkerClientArgs {
            base: "builtin:tiny-arith".into(),
            base_name: "builtin:tiny-arith".into(),
            lora: r#"{"rank": 4, "train_unembed": true, "train_mlp": true, "train_attn": true}"#.into(),
            seed: 5,
            resume: resume.map(ToOwned::to_owned),
            device: Some("cpu".into()),
            threads: Some(1),
            ..TinkerClientArgs::default()
        };
        let mut child = Command::new(artifact("rlvr-worker"))
            .args(args.command_line())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let stdin = child.stdin.take().unwrap();
        let stdout = BufReader::new(child.stdout.take().unwrap());
        let mut process = Process { child, stdin, stdout };
        assert!(matches!(process.event(), ClientEvent::Ready { vocab_size, .. } if vocab_size > 0));
        process
    }

    fn event(&mut self) -> ClientEvent {
        let mut line = String::new();
        assert!(self.stdout.read_line(&mut line).unwrap() > 0, "the process closed its stdout");
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line}"))
    }

    /// Sends `command` and returns its answer.
    fn ask(&mut self, command: &ClientCommand) -> ClientEvent {
        writeln!(self.stdin, "{}", serde_json::to_string(command).unwrap()).unwrap();
        self.stdin.flush().unwrap();
        self.event()
    }

    fn answer(&mut self, command: &ClientCommand) -> Answer {
        match self.ask(command) {
            ClientEvent::Done { answer, .. } => answer,
            other => panic!("{command:?}: {other:?}"),
        }
    }
}

/// `text`'s tokens on the built-in model.
fn tokens(text: &str) -> Vec<i64> {
    let model = rlvr_model::load("builtin:tiny-arith", tch::Device::Cpu, tch::Kind::Float).unwrap();
    model.tokenizer.encode(text).unwrap()
}

/// A supervised datum of `text`, as the SDK makes one: input all but the last token, targets all
/// but the first, weight 1 everywhere.
fn datum(text: &str) -> Datum {
    let full = tokens(text);
    let n = full.len() - 1;
    let ints = |values: &[i64]| values.iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<u8>>();
    let input: Vec<u8> = full[..n].iter().flat_map(|&t| (t as i32).to_le_bytes()).collect();
    Datum {
        model_input: vec![Chunk {
            chunk: Some(chunk::Kind::EncodedText(EncodedTextChunk { tokens: input })),
        }],
        loss_fn_inputs: [
            (
                "target_tokens".to_owned(),
                Tensor {
                    encoding: Some(tensor::Encoding::Dense(ints(&full[1..]))),
                    dtype: DType::Int64 as i32,
                    shape: vec![n as i64],
                },
            ),
            (
                "weights".to_owned(),
                Tensor {
                    encoding: Some(tensor::Encoding::Dense(
                        vec![1f32; n].iter().flat_map(|v| v.to_le_bytes()).collect(),
                    )),
                    dtype: DType::Float32 as i32,
                    shape: vec![n as i64],
                },
            ),
        ]
        .into(),
        ..Datum::default()
    }
}

fn forward_backward(id: &str, loss: &str, forward_only: bool) -> ClientCommand {
    let request = ForwardBackwardRequest {
        model_id: "s:train:0".into(),
        seq_id: 1,
        data: vec![datum("12+30=42"), datum("7+7=14")],
        loss_fn: loss.into(),
        forward_only,
        ..ForwardBackwardRequest::default()
    };
    ClientCommand::ForwardBackward { request_id: id.into(), body: request.encode_to_vec() }
}

fn step(id: &str) -> ClientCommand {
    let params = AdamParams {
        learning_rate: 1e-2,
        beta1: 0.9,
        beta2: 0.95,
        eps: 1e-12,
        weight_decay: 0.0,
        grad_clip_norm: 0.0,
    };
    ClientCommand::OptimStep { request_id: id.into(), params }
}

fn loss_of(answer: Answer) -> (f64, Vec<usize>) {
    let Answer::Proto { bytes } = answer else { panic!("a forward pass answers protobuf") };
    let output = ForwardBackwardOutput::decode(bytes.as_slice()).unwrap();
    let record = &output.loss_fn_outputs[0];
    let offsets: Vec<i64> = record.fields["logprobs"]
        .offsets
        .chunks_exact(8)
        .map(|b| i64::from_le_bytes(b.try_into().unwrap()))
        .collect();
    let lengths = offsets.windows(2).map(|w| ((w[1] - w[0]) / 4) as usize).collect();
    (output.metrics["loss:sum"], lengths)
}

/// A process trains, samples and refuses as the SDK's requests ask; one suspended between a
/// backward pass and its step, then resumed from what it wrote, ends where one never suspended
/// does (the same next loss, to the bit).
#[test]
fn a_training_client_process_serves_the_sdks_requests_and_resumes_exactly_after_a_suspend() {
    let mut straight = Process::start(None);
    let (first, lengths) = loss_of(straight.answer(&forward_backward("r1", "cross_entropy", false)));
    assert_eq!(lengths, [tokens("12+30=42").len() - 1, tokens("7+7=14").len() - 1]);
    let Answer::Json { value } = straight.answer(&step("r2")) else { panic!() };
    assert!(value["metrics"]["grad_norm:mean"].as_f64().unwrap() > 0.0, "{value}");
    // The request's fault, named, and the process goes on.
    match straight.ask(&forward_backward("r3", "ppo", false)) {
        ClientEvent::Failed { request_id, error, category } => {
            assert_eq!((request_id.as_str(), category), ("r3", ErrorCategory::User));
            assert!(error.contains("loss_fn_inputs.logprobs: ppo needs it"), "{error}");
        }
        other => panic!("{other:?}"),
    }
    let sample = SampleRequest {
        num_samples: 2,
        prompt: ModelInput { chunks: vec![InputChunk::EncodedText { tokens: tokens("12+30=") }] },
        sampling_params: SampleParams {
            max_tokens: Some(4),
            seed: Some(3),
            stop: None,
            temperature: 1.0,
            top_k: -1,
            top_p: 1.0,
        },
        sampling_session_id: None,
        seq_id: Some(0),
        prompt_logprobs: true,
        topk_prompt_logprobs: 0,
        topk_sample_logprobs: 0,
        prompt_alt_tokens_k: 0,
        prompt_logprobs_last_n: None,
        target_prompt_logprobs: None,
        record_stability_info: false,
        base_model: None,
        model_path: None,
    };
    let Answer::Proto { bytes } = straight.answer(&ClientCommand::Sample {
        request_id: "r4".into(),
        request: Box::new(sample),
        weights: None,
    }) else {
        panic!("a sample answers protobuf")
    };
    let sampled = SampleResponse::decode(bytes.as_slice()).unwrap();
    assert_eq!(sampled.sequences.len(), 2);
    for sequence in &sampled.sequences {
        assert_eq!(sequence.tokens.len(), sequence.logprobs.as_ref().unwrap().len(), "a logprob per token");
    }
    assert_eq!(sampled.prompt_logprobs.unwrap().len(), 4 * tokens("12+30=").len());

    let mut suspended = Process::start(None);
    let (again, _) = loss_of(suspended.answer(&forward_backward("r1", "cross_entropy", false)));
    assert_eq!(again, first, "the same seed, the same client");
    suspended.answer(&step("r2"));
    for process in [&mut straight, &mut suspended] {
        process.answer(&forward_backward("r5", "cross_entropy", false));
    }
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("suspended");
    assert_eq!(suspended.ask(&ClientCommand::Suspend { dir: state.clone() }), ClientEvent::Suspended);
    assert!(suspended.child.wait().unwrap().success());
    let mut resumed = Process::start(Some(&state));
    for process in [&mut straight, &mut resumed] {
        process.answer(&step("r6"));
    }
    let (next, _) = loss_of(straight.answer(&forward_backward("r7", "cross_entropy", true)));
    let (resumed_next, _) = loss_of(resumed.answer(&forward_backward("r7", "cross_entropy", true)));
    assert_eq!(resumed_next, next, "resumed, the same next loss");
    assert!(next < first, "two steps lowered the loss: {first} → {next}");
    drop(straight.stdin);
    assert!(straight.child.wait().unwrap().success(), "stdin closed, the process ends");
}

/// The real Tinker SDK (`tinker==0.38.0`, its own venv) against `rlvrd serve` and real Redis:
/// `tests/tinker/sdk_driver.py` trains (SFT whose loss falls; each RL loss equal to its formula on
/// the returned logprobs; `stable_reinforce` refused naming `importance_sampling`), checks a
/// chunked forward/backward against one call, posts a step twice and finds it run once, saves and
/// loads with and without AdamW's state, samples from snapshots that keep their weights, kills a
/// client's process (SIGKILL) and finds its next step equal to an untouched twin's, and finds
/// another team's key refused. Checkpoints every two state changes, so the kill resumes from one
/// and replays what came after.
#[test]
fn the_tinker_sdk_trains_samples_saves_and_survives_a_killed_process_through_rlvrd_serve() {
    let python = rlvr_tests::peer_python("scripts/tinker-venv.sh", &[]);
    let redis = rlvr_tests::Redis::start();
    let daemon = rlvr_tests::Daemon::start_with(
        &["rlvr-optimizer-grpo", "rlvr-verifier-math"],
        &redis.url(),
        "[queue]\nworker_threads = 1\n[tinker]\ncheckpoint_every = 2\nmemory_gb = 1\nidle_release_s = 5\n",
    );
    // The gate bridge's problems: the team trains on these and is judged on the same ones.
    let dir = tempfile::tempdir().unwrap();
    let data = rlvr_tests::arith_data(
        dir.path(),
        &["--train", "16", "--heldout", "16", "--sft", "0", "--max-operand", "4"],
    );
    fs::write(data.join("heldout.jsonl"), fs::read_to_string(data.join("train.jsonl")).unwrap()).unwrap();
    let output = Command::new(python)
        .arg(rlvr_tests::workspace_root().join("tests/tinker/sdk_driver.py"))
        .env("RLVR_URL", &daemon.url)
        .env("TINKER_API_KEY", rlvr_tests::TINKER_KEY)
        .env("OTHER_TINKER_KEY", rlvr_tests::OTHER_TINKER_KEY)
        .env("TINKER_TELEMETRY", "0")
        .env("ARITH_TRAIN", data.join("train.jsonl"))
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    println!("{stdout}");
    assert!(
        output.status.success() && stdout.contains(r#"{"check": "done"}"#),
        "the SDK driver failed:\n{}\n{}",
        String::from_utf8_lossy(&output.stderr),
        daemon.log()
    );
    let checks: Vec<serde_json::Value> =
        stdout.lines().filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok()).collect();
    let adapters = checks.iter().find(|line| line["check"] == "gate_adapters").unwrap();
    gate_bridge(&daemon, &data, adapters);
    let parked = checks.iter().find(|line| line["check"] == "parked").unwrap();
    a_parked_client_resumes_on_its_next_request(&daemon, parked);
}

/// `POST /api/v1/PATH` with team `tests`'s Tinker key, as the SDK sends it: the JSON answer (200).
fn sdk_post(daemon: &rlvr_tests::Daemon, path: &str, body: serde_json::Value) -> serde_json::Value {
    let response = rlvr_tests::jobs::client()
        .post(format!("{}/api/v1/{path}", daemon.url))
        .header("x-api-key", rlvr_tests::TINKER_KEY)
        .json(&body)
        .send()
        .unwrap();
    assert_eq!(response.status().as_u16(), 200, "{path}: {}", daemon.log());
    response.json().unwrap()
}

/// An operation's result: `retrieve_future` polled until it says more than `try_again`.
fn sdk_result(daemon: &rlvr_tests::Daemon, request_id: &serde_json::Value) -> serde_json::Value {
    loop {
        let answer = sdk_post(daemon, "retrieve_future", serde_json::json!({"request_id": request_id}));
        if answer["type"] != "try_again" {
            return answer;
        }
    }
}

/// The driver has ended, and with it its session's heartbeats: its clients are suspended and give
/// their device back (`tinker.idle_release_s`); a request for one resumes it and is answered.
fn a_parked_client_resumes_on_its_next_request(daemon: &rlvr_tests::Daemon, victim: &serde_json::Value) {
    let client = format!("client={} ", victim["model_id"].as_str().unwrap());
    let parked = rlvr_tests::wait_until(std::time::Duration::from_secs(60), || {
        daemon
            .log()
            .lines()
            .any(|line| line.contains(&client) && line.contains("heartbeats stopped: suspending"))
    });
    assert!(parked, "no client was parked:\n{}", daemon.log());
    let resumed = || {
        daemon.log().lines().filter(|line| line.contains(&client) && line.contains("resumed=true")).count()
    };
    let resumed_before = resumed();
    let post = |path: &str, body: serde_json::Value| sdk_post(daemon, path, body);
    let step = post(
        "optim_step",
        serde_json::json!({"model_id": victim["model_id"], "seq_id": victim["next_seq"],
                           "adam_params": {"learning_rate": 1e-3}}),
    );
    let answer = sdk_result(daemon, &step["request_id"]);
    assert!(answer["metrics"].is_object(), "{answer}");
    // A request refused takes its turn as a failure of its own (its seq_id is spent): the next
    // one does not wait for it.
    let next = victim["next_seq"].as_u64().unwrap();
    let refused = post(
        "optim_step",
        serde_json::json!({"model_id": victim["model_id"], "seq_id": next + 1, "adam_params": {"beta1": 2.0}}),
    );
    let failure = sdk_result(daemon, &refused["request_id"]);
    assert_eq!(failure["category"], "user", "{failure}");
    assert!(failure["error"].as_str().unwrap().contains("adam_params.beta1"), "{failure}");
    let after = post(
        "optim_step",
        serde_json::json!({"model_id": victim["model_id"], "seq_id": next + 2, "adam_params": {"learning_rate": 1e-3}}),
    );
    assert!(sdk_result(daemon, &after["request_id"])["metrics"].is_object());
    assert!(resumed() > resumed_before, "{}", daemon.log());
}

/// The gate bridge: an evaluation job (`budget.max_steps = 0`) whose `model.policy` is a
/// `tinker://` sampler path is judged by its line's gates against the line's published version
/// (here the base model, published first): the untrained adapter is refused, the trained one
/// published (its adapter merged into the base).
fn gate_bridge(daemon: &rlvr_tests::Daemon, data: &std::path::Path, adapters: &serde_json::Value) {
    use rlvr_protocol::job::JobState;
    use rlvr_tests::jobs::{ended, submit_ok, wait_job};
    let evaluation = |name: &str, policy: &str, gates: &str| {
        let spec = rlvr_tests::arith_grpo_spec(data, name, policy, 0, 1)
            .replace("model_line = \"tiny-arith\"", "model_line = \"tinker-gate\"");
        let id = submit_ok(daemon, &format!("{spec}\n{gates}"));
        wait_job(daemon, &id, std::time::Duration::from_secs(180), ended)
    };
    let base = evaluation("base", "builtin:tiny-arith", rlvr_tests::PERMISSIVE_GATES);
    assert_eq!(base.state, JobState::Published, "{base}\n{}", daemon.log());
    let gates = "[gates]\nheldout_gain_min = 0.05\nrefuse_reward_hacking = false\nlength_ratio_max = 100.0\n";
    let untrained = evaluation("untrained", adapters["untrained"].as_str().unwrap(), gates);
    assert_eq!(untrained.state, JobState::Refused, "{untrained}\n{}", daemon.log());
    let trained = evaluation("trained", adapters["trained"].as_str().unwrap(), gates);
    assert_eq!(trained.state, JobState::Published, "{trained}\n{}", daemon.log());
    let judged = serde_json::to_value(&trained.0).unwrap()["gates"]["criteria"][0]["note"].clone();
    println!("gate bridge: untrained {}; trained {} ({judged})", untrained.reason, trained.reason);
}

/// tinker-cookbook's `math_rl` recipe (0.6.1, unmodified) on its arithmetic environment, for three
/// steps against `rlvrd serve`: the team's base model `tiny-arith` is `builtin:tiny-arith` exported
/// as a Hugging Face directory, and the recipe runs in the directory that holds it, so that its
/// `model_name=tiny-arith` is the name the daemon knows and the tokenizer directory the cookbook
/// loads. It runs to its end (its final save) and logs each step's metrics.
#[test]
fn the_cookbooks_math_rl_recipe_runs_to_its_end_against_rlvrd_serve() {
    let python = rlvr_tests::peer_python("scripts/tinker-venv.sh", &[]);
    let dir = tempfile::tempdir().unwrap();
    let model = rlvr_model::load("builtin:tiny-arith", tch::Device::Cpu, tch::Kind::Float).unwrap();
    let exported = dir.path().join("tiny-arith");
    rlvr_model::save_pretrained(&model, &exported).unwrap();
    let redis = rlvr_tests::Redis::start();
    let daemon = rlvr_tests::Daemon::start_with(
        &[],
        &redis.url(),
        &format!(
            "[queue]\nworker_threads = 1\n[tinker]\nmemory_gb = 1\n[[tenancy.base_models]]\nname = \"tiny-arith\"\n\
             path = {:?}\n",
            exported.display().to_string()
        ),
    );
    let log = dir.path().join("run");
    let steps = 3;
    let started = std::time::Instant::now();
    let output = Command::new(python)
        .current_dir(dir.path())
        .args(["-m", "tinker_cookbook.recipes.math_rl.train"])
        .arg(format!("base_url={}", daemon.url))
        .args([
            "model_name=tiny-arith",
            "renderer_name=role_colon",
            "env=arithmetic",
            "loss_fn=importance_sampling",
        ])
        .args(["group_size=4", "groups_per_batch=4", "max_tokens=6", "learning_rate=1e-4", "lora_rank=4"])
        .arg(format!("max_steps={steps}"))
        .arg(format!("log_path={}", log.display()))
        .arg("behavior_if_log_dir_exists=delete")
        .env("TINKER_API_KEY", rlvr_tests::TINKER_KEY)
        .env("TINKER_TELEMETRY", "0")
        .env("HF_HUB_OFFLINE", "1")
        .output()
        .unwrap();
    let seconds = started.elapsed().as_secs_f64();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "the recipe failed:\n{stderr}\n{}", daemon.log());
    let metrics = fs::read_to_string(log.join("metrics.jsonl")).unwrap_or_default();
    // One line per step with its timings, and a last one of totals.
    let logged: Vec<serde_json::Value> = metrics
        .lines()
        .map(|line| serde_json::from_str::<serde_json::Value>(line).unwrap())
        .filter(|line| line.get("time/total").is_some())
        .collect();
    assert_eq!(logged.len(), steps, "{metrics}");
    let step_s: Vec<f64> = logged.iter().map(|line| line["time/total"].as_f64().unwrap()).collect();
    let checkpoints = fs::read_to_string(log.join("checkpoints.jsonl")).unwrap_or_default();
    assert!(checkpoints.contains("tinker://") && checkpoints.contains("final"), "{checkpoints}");
    println!("math_rl: {steps} steps in {seconds:.1} s with start-up; each step (time/total): {step_s:?}");
}

/// An SDK loop's process, killed if the test ends before it does.
struct Loop(Child);

impl Drop for Loop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Two teams' SDK loops (`tests/tinker/share_driver.py`, the same steps from the same seed) and a
/// native GRPO job of higher priority on one CPU slot that fits two clients and not the job too:
/// the job preempts a client (it suspends, its loop waits), runs and publishes; the clients
/// resume and both loops run to their end with the same weights (each resumed exactly), none
/// failing for capacity.
#[test]
fn two_teams_sdk_loops_and_an_urgent_native_job_share_one_device_and_all_finish() {
    use std::io::BufRead as _;
    let python = rlvr_tests::peer_python("scripts/tinker-venv.sh", &[]);
    let redis = rlvr_tests::Redis::start();
    let daemon = rlvr_tests::Daemon::start_with(
        &["rlvr-optimizer-grpo", "rlvr-verifier-math"],
        &redis.url(),
        "[queue]\nworker_threads = 1\n[devices]\ncpu_slots = 1\ncpu_slot_memory_gb = 3\n\
         [[tenancy.teams]]\nname = \"tests\"\npriorities = [\"low\", \"normal\", \"high\"]\n\
         [tinker]\nmemory_gb = 1\ncheckpoint_every = 4\n",
    );
    // A native job holding the whole slot: a client waits for a device, and its future says so
    // (`paused_capacity`, with the scheduler's reason) instead of failing; the job cancelled, the
    // client is admitted and its future ends.
    let dir = tempfile::tempdir().unwrap();
    let data = rlvr_tests::arith_data(dir.path(), &["--train", "64", "--heldout", "16", "--sft", "0"]);
    let holder = rlvr_tests::arith_grpo_spec(&data, "holder", "builtin:tiny-arith", 100_000, 1000);
    let holder = rlvr_tests::jobs::submit_ok(
        &daemon,
        &format!("{holder}\n{}[resources]\nmemory_gb = 3\n", rlvr_tests::PERMISSIVE_GATES),
    );
    rlvr_tests::jobs::wait_job(&daemon, &holder, std::time::Duration::from_secs(120), |job| job.step >= 1);
    let http = rlvr_tests::jobs::client();
    let post = |path: &str, body: serde_json::Value| sdk_post(&daemon, path, body);
    let session = post("create_session", serde_json::json!({"sdk_version": "0.38.0"}))["session_id"].clone();
    let created = post(
        "create_model",
        serde_json::json!({"session_id": session, "model_seq_id": 0, "base_model": "builtin:tiny-arith",
                           "lora_config": {"rank": 4}}),
    );
    let waiting = post("retrieve_future", serde_json::json!({"request_id": created["request_id"]}));
    assert_eq!(
        (&waiting["type"], &waiting["queue_state"]),
        (&"try_again".into(), &"paused_capacity".into()),
        "{waiting}\n{}",
        daemon.log()
    );
    assert!(waiting["queue_state_reason"].as_str().unwrap().contains("waiting for a device"), "{waiting}");
    let cancelled = http
        .delete(format!("{}/v1/jobs/{holder}", daemon.url))
        .bearer_auth(rlvr_tests::TEAM_TOKEN)
        .send()
        .unwrap();
    assert!(cancelled.status().is_success(), "{:?}", cancelled.status());
    let opened = sdk_result(&daemon, &created["request_id"]);
    assert_eq!(opened["type"], "create_model", "{opened}");
    post(&format!("sessions/{}/finish", session.as_str().unwrap()), serde_json::json!({}));
    let loop_of = |key: &str| {
        Command::new(&python)
            .arg(rlvr_tests::workspace_root().join("tests/tinker/share_driver.py"))
            .env("RLVR_URL", &daemon.url)
            .env("TINKER_API_KEY", key)
            .env("TINKER_TELEMETRY", "0")
            .env("STEPS", "200")
            .stdout(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let mut loops = [Loop(loop_of(rlvr_tests::TINKER_KEY)), Loop(loop_of(rlvr_tests::OTHER_TINKER_KEY))];
    let mut outputs: Vec<BufReader<ChildStdout>> =
        loops.iter_mut().map(|child| BufReader::new(child.0.stdout.take().unwrap())).collect();
    // Both clients hold their gigabyte once each loop has stepped.
    let mut lines: Vec<Vec<String>> = vec![Vec::new(), Vec::new()];
    for (output, seen) in outputs.iter_mut().zip(&mut lines) {
        let mut line = String::new();
        output.read_line(&mut line).unwrap();
        assert!(line.contains("\"step\": 0"), "{line}\n{}", daemon.log());
        seen.push(line);
    }
    let spec = rlvr_tests::arith_grpo_spec(&data, "urgent", "builtin:tiny-arith", 2, 2)
        .replace("team = \"tests\"", "team = \"tests\"\npriority = \"high\"");
    let urgent = rlvr_tests::jobs::submit_ok(
        &daemon,
        &format!("{spec}\n{}[resources]\nmemory_gb = 2\n", rlvr_tests::PERMISSIVE_GATES),
    );
    let done = rlvr_tests::jobs::wait_job(
        &daemon,
        &urgent,
        std::time::Duration::from_secs(300),
        rlvr_tests::jobs::ended,
    );
    assert_eq!(done.state, rlvr_protocol::job::JobState::Published, "{done}\n{}", daemon.log());
    for ((child, output), seen) in loops.iter_mut().zip(outputs).zip(&mut lines) {
        seen.extend(output.lines().map(Result::unwrap));
        assert!(child.0.wait().unwrap().success(), "a loop failed: {seen:?}\n{}", daemon.log());
    }
    println!("tests: {:?}\nothers: {:?}", lines[0], lines[1]);
    let probe =
        |seen: &[String]| seen.last().filter(|line| line.contains("probe")).cloned().unwrap_or_default();
    assert!(!probe(&lines[0]).is_empty() && probe(&lines[0]) == probe(&lines[1]), "{lines:?}");
    // Fair share: the two teams' loops took turns on the slot, neither starved (each loop's time
    // to its last step within twice the other's, one of them preempted for the urgent job).
    let last_at = |seen: &[String]| -> f64 {
        let line = seen.iter().rev().find(|line| line.contains("at_s")).unwrap();
        serde_json::from_str::<serde_json::Value>(line).unwrap()["at_s"].as_f64().unwrap()
    };
    let (a, b) = (last_at(&lines[0]), last_at(&lines[1]));
    assert!(a.max(b) <= 2.0 * a.min(b), "the loops' times: {a} s and {b} s");
    let log = daemon.log();
    assert!(log.contains("preempted: suspending"), "no client was preempted:\n{log}");
    assert!(log.contains("resumed=true"), "no client resumed:\n{log}");
}
