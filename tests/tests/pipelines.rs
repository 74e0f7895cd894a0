//! Multi-stage pipelines through `rlvrd serve` with real Redis, real plugins and real workers:
//! three stages on tiny-arith (SFT → GRPO → SFT), each starting from the checkpoint the stage
//! before published, surviving a SIGKILL of the daemon mid-stage with every stage run once; a
//! refused stage stops the pipeline with the reason; cancel; tenancy.

use std::fs;
use std::path::Path;
use std::time::{Duration, Instant};

use rlvr_client::{HttpError, SpecFormat};
use rlvr_protocol::gates::Manifest;
use rlvr_protocol::job::{JobState, LineVersion};
use rlvr_protocol::pipeline::{PipelineState, PipelineView, StageOutput};
use rlvr_tests::jobs::{api, job, wait_job};
use rlvr_tests::{
    ADMIN_TOKEN, Daemon, OTHER_TOKEN, PERMISSIVE_GATES, Redis, STAGE_GRPO as GRPO, STAGE_SFT as SFT,
    TEAM_TOKEN, arith_data, pipeline, stage,
};

const PLUGINS: [&str; 3] = ["rlvr-optimizer-sft", "rlvr-optimizer-grpo", "rlvr-verifier-math"];
/// Fast heartbeats so a killed daemon's job comes back within seconds; one libtorch thread.
const QUEUE: &str =
    "[queue]\nheartbeat_ms = 500\nmissed_heartbeats = 6\nworker_threads = 1\nmax_crashes = 3\n";

/// Submits as team `tests` (data files uploaded first, as `rlvrctl pipeline submit` does).
fn submit(daemon: &Daemon, token: &str, toml: &str) -> Result<String, HttpError> {
    let api = api(daemon, Some(token));
    let toml =
        api.upload_spec_data(toml, SpecFormat::Toml, Path::new("/")).unwrap_or_else(|_| toml.to_owned());
    api.submit_pipeline(&toml, SpecFormat::Toml, None).map(|submitted| submitted.id)
}

fn refusal(result: Result<String, HttpError>) -> (u16, String, String) {
    match result {
        Err(HttpError::Status { status, error, .. }) => {
            (status.as_u16(), error.field.unwrap_or_default(), error.message)
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
}

fn view(daemon: &Daemon, id: &str) -> PipelineView {
    api(daemon, Some(TEAM_TOKEN)).pipeline(id).unwrap_or_else(|error| panic!("pipeline {id}: {error}"))
}

fn wait_pipeline(
    daemon: &Daemon,
    id: &str,
    timeout: Duration,
    done: impl Fn(&PipelineView) -> bool,
) -> PipelineView {
    let deadline = Instant::now() + timeout;
    loop {
        let current = view(daemon, id);
        if done(&current) {
            return current;
        }
        assert!(Instant::now() < deadline, "pipeline {id} timed out at {current:?}\n{}", daemon.log());
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The team's jobs, as an admin lists them.
fn team_jobs(daemon: &Daemon) -> Vec<rlvr_protocol::job::JobView> {
    let query = rlvr_client::JobQuery { team: Some("tests".into()), ..Default::default() };
    api(daemon, Some(ADMIN_TOKEN)).jobs(&query).unwrap().jobs
}

#[test]
fn a_three_stage_pipeline_survives_a_daemon_kill_mid_stage_and_runs_each_stage_once() {
    let redis = Redis::start();
    let mut daemon = Daemon::start_with(&PLUGINS, &redis.url(), QUEUE);
    let dir = tempfile::tempdir().unwrap();
    let data = arith_data(dir.path(), &[]);
    let spec = pipeline(
        "r1-order",
        &[
            stage(&data, "cold-start", "builtin:tiny-arith", SFT, 4, PERMISSIVE_GATES),
            stage(&data, "grpo", "previous", GRPO, 6, PERMISSIVE_GATES),
            stage(&data, "sft-again", "previous", SFT, 4, PERMISSIVE_GATES),
        ],
    );
    let id = submit(&daemon, TEAM_TOKEN, &spec).unwrap();

    // SIGKILL the daemon while the second stage trains.
    let running = wait_pipeline(&daemon, &id, Duration::from_secs(600), |view| {
        view.stage == 1 && view.stages[1].job.as_deref().is_some_and(|job_id| job(&daemon, job_id).step >= 1)
    });
    let grpo_job = running.stages[1].job.clone().unwrap();
    daemon.kill();
    daemon.restart();

    let ended = wait_pipeline(&daemon, &id, Duration::from_secs(900), |view| view.state.is_terminal());
    assert_eq!(ended.state, PipelineState::Succeeded, "{ended:?}\n{}", daemon.log());
    assert_eq!(ended.stage, 3);
    assert_eq!(
        ended.stages[1].job.as_deref(),
        Some(grpo_job.as_str()),
        "the killed stage went on as the same job"
    );
    // Each stage ran once: one job per stage, and the team has no other.
    let jobs = team_jobs(&daemon);
    let mut names: Vec<&str> = jobs.iter().map(|job| job.name.as_str()).collect();
    names.sort();
    assert_eq!(names, ["cold-start", "grpo", "sft-again"], "{jobs:?}");
    for (i, stage) in ended.stages.iter().enumerate() {
        let job_id = stage.job.as_deref().unwrap();
        let record = job(&daemon, job_id);
        assert_eq!(record.state, JobState::Published, "stage {i}: {record}");
        // The typed output is the job's published line and version.
        let version = i as u64 + 1;
        assert_eq!(stage.output, Some(StageOutput::Checkpoint { line: "tiny-arith".into(), version }));
        assert_eq!(record.published_version, Some(LineVersion { line: "tiny-arith".into(), version }));
        // Each stage started from the one before's published checkpoint.
        let manifest: Manifest = serde_json::from_slice(
            &fs::read(daemon.state.join(format!("registry/tiny-arith/{version}/manifest.json"))).unwrap(),
        )
        .unwrap();
        assert_eq!(manifest.job_id, job_id);
        let expected_policy =
            if i == 0 { "builtin:tiny-arith".to_owned() } else { format!("line:tiny-arith@{i}") };
        assert_eq!(manifest.spec.model.policy, expected_policy, "stage {i}");
    }
    // The events tell the story in order.
    let events = api(&daemon, Some(TEAM_TOKEN)).pipeline_events(&id).unwrap();
    let reasons: Vec<String> = events.iter().map(|event| event.reason.clone()).collect();
    assert_eq!(reasons.first().map(String::as_str), Some("submitted"), "{reasons:?}");
    assert_eq!(events.last().unwrap().state, PipelineState::Succeeded, "{reasons:?}");
    assert_eq!(reasons.iter().filter(|reason| reason.contains("submitted as job")).count(), 3, "{reasons:?}");
    assert!(reasons.contains(&"stages[1] handed on line:tiny-arith@2".to_owned()), "{reasons:?}");
}

#[test]
fn a_refused_stage_stops_the_pipeline_with_the_reason_and_submit_refuses_what_would_fail_later() {
    let redis = Redis::start();
    let daemon = Daemon::start_with(&PLUGINS, &redis.url(), QUEUE);
    let dir = tempfile::tempdir().unwrap();
    let data = arith_data(dir.path(), &[]);
    let good = stage(&data, "sft", "builtin:tiny-arith", SFT, 2, PERMISSIVE_GATES);
    let next = stage(&data, "grpo", "previous", GRPO, 2, PERMISSIVE_GATES);

    // At submit: each stage checked as a job submit checks it, the field named under its stage.
    // (body, status, field, words in the message)
    let cases = [
        (
            pipeline("p", &[good.clone(), next.replace("plugin = \"grpo\"", "plugin = \"nope\"")]),
            422,
            "stages[1].optimizer.plugin",
            "nope",
        ),
        (pipeline("p", std::slice::from_ref(&next)), 422, "stages[0].model.policy", "no previous stage"),
        (
            pipeline("p", &[good.clone(), next.replace("team = \"tests\"", "team = \"others\"")]),
            422,
            "stages[1].job.team",
            "pipeline's team",
        ),
        (
            pipeline("p", &[good.clone(), next.replace("max_steps = 2", "max_steps = 99999999999")]),
            422,
            "stages[1].budget.max_steps",
            "expected 0 to",
        ),
        (
            pipeline(
                "p",
                &[
                    good.clone(),
                    next.replace("[stages.model]", "[stages.model]\nreference = \"line:nobody@1\""),
                ],
            ),
            422,
            "stages[1].model.reference",
            "",
        ),
    ];
    for (body, status, field, words) in cases {
        let (got_status, got_field, message) = refusal(submit(&daemon, TEAM_TOKEN, &body));
        assert_eq!((got_status, got_field.as_str()), (status, field), "{message}");
        assert!(message.contains(words), "{field}: {message}");
    }
    let (status, field, _) =
        refusal(submit(&daemon, OTHER_TOKEN, &pipeline("p", std::slice::from_ref(&good))));
    assert_eq!((status, field.as_str()), (403, "pipeline.team"));
    assert!(team_jobs(&daemon).is_empty(), "a refused pipeline leaves no job");

    // At run time: the first stage's gates refuse its candidate; the second never starts.
    let strict = "[gates]\nheldout_gain_min = 0.9\n";
    let id = submit(
        &daemon,
        TEAM_TOKEN,
        &pipeline("refused", &[stage(&data, "sft", "builtin:tiny-arith", SFT, 2, strict), next]),
    )
    .unwrap();
    let ended = wait_pipeline(&daemon, &id, Duration::from_secs(600), |view| view.state.is_terminal());
    assert_eq!(ended.state, PipelineState::Failed, "{ended:?}");
    let job_id = ended.stages[0].job.clone().unwrap();
    assert!(
        ended.reason.starts_with(&format!("stages[0] (job {job_id}) refused by its gates: ")),
        "{}",
        ended.reason
    );
    assert!(ended.reason.contains("heldout"), "{}", ended.reason);
    assert_eq!(ended.stages[1].job, None);
    assert_eq!(team_jobs(&daemon).len(), 1);
}

#[test]
fn a_cancel_stops_the_running_stage_and_the_rest_and_another_team_sees_nothing() {
    let redis = Redis::start();
    let daemon = Daemon::start_with(&PLUGINS, &redis.url(), QUEUE);
    let dir = tempfile::tempdir().unwrap();
    let data = arith_data(dir.path(), &[]);
    let spec = pipeline(
        "long",
        &[
            stage(&data, "long-sft", "builtin:tiny-arith", SFT, 10_000, PERMISSIVE_GATES),
            stage(&data, "never", "previous", GRPO, 2, PERMISSIVE_GATES),
        ],
    );
    let id = submit(&daemon, TEAM_TOKEN, &spec).unwrap();
    let running = wait_pipeline(&daemon, &id, Duration::from_secs(120), |view| {
        view.stages[0].job.as_deref().is_some_and(|job_id| job(&daemon, job_id).state == JobState::Running)
    });
    let job_id = running.stages[0].job.clone().unwrap();

    // Another team: not found, not listed, cannot cancel.
    let others = api(&daemon, Some(OTHER_TOKEN));
    for result in [others.pipeline(&id).map(drop), others.cancel_pipeline(&id).map(drop)] {
        match result {
            Err(HttpError::Status { status, .. }) => assert_eq!(status.as_u16(), 404),
            other => panic!("another team's token: {other:?}"),
        }
    }
    assert!(others.pipelines().unwrap().pipelines.is_empty());
    assert_eq!(api(&daemon, Some(TEAM_TOKEN)).pipelines().unwrap().pipelines.len(), 1);
    // `rlvrctl pipeline list`, as text and as JSON.
    // regression: with --json the list's text lines followed its JSON, which then did not parse
    let env = [("RLVR_SERVER", daemon.url.as_str()), ("RLVR_TOKEN", TEAM_TOKEN)];
    let rlvrctl = rlvr_tests::artifact("rlvrctl");
    let listed = rlvr_tests::cli::run(&rlvrctl, &["pipeline", "list"], dir.path(), &env);
    let text = String::from_utf8_lossy(&listed.stdout);
    assert!(listed.status.success() && text.starts_with(&id) && text.contains("long"), "{text}");
    let listed = rlvr_tests::cli::run(&rlvrctl, &["--json", "pipeline", "list"], dir.path(), &env);
    let list: serde_json::Value = serde_json::from_slice(&listed.stdout)
        .unwrap_or_else(|error| panic!("{error}: {}", String::from_utf8_lossy(&listed.stdout)));
    assert_eq!(list["pipelines"][0]["id"], id.as_str(), "{list}");

    let answer = api(&daemon, Some(TEAM_TOKEN)).cancel_pipeline(&id).unwrap();
    assert!(answer.cancel_requested);
    let ended = wait_pipeline(&daemon, &id, Duration::from_secs(120), |view| view.state.is_terminal());
    assert_eq!(ended.state, PipelineState::Cancelled, "{ended:?}");
    wait_job(&daemon, &job_id, Duration::from_secs(60), |job| job.state == JobState::Cancelled);
    assert_eq!(ended.stages[1].job, None, "no stage starts after a cancel");
    // A second cancel: it has ended.
    match api(&daemon, Some(TEAM_TOKEN)).cancel_pipeline(&id) {
        Err(HttpError::Status { status, .. }) => assert_eq!(status.as_u16(), 409),
        other => panic!("{other:?}"),
    }
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(team_jobs(&daemon).len(), 1);
}

/// A rejection-sampling stage (`"previous"` its policy) between two SFT stages: DeepSeek-R1's
/// hand-off of a checkpoint into sampling and of the sampled rows into SFT. The rows are the
/// team's dataset, pinned to their content in the next stage's `data.train`.
#[test]
fn a_rejection_sampling_stage_hands_its_dataset_to_the_next_stages_data() {
    let redis = Redis::start();
    let daemon = Daemon::start_with(&PLUGINS, &redis.url(), QUEUE);
    let dir = tempfile::tempdir().unwrap();
    let data = arith_data(dir.path(), &[]);
    let sampling = format!(
        r#"
[[stages]]
[stages.job]
name = "sample"
team = "tests"
model_line = "tiny-arith"
seed = 3
[stages.model]
policy = "previous"
[stages.data]
train = "{data}/train.jsonl"
[stages.optimizer]
plugin = "rejection-sampling"
group_size = 4
output = "r1-rows"
threshold = 0.0
keep = 1
[[stages.verifiers]]
plugin = "math"
fallback = "last"
[stages.rollout]
max_new_tokens = 4
prompts_per_step = 8
[stages.budget]
max_steps = 2
"#,
        data = data.display()
    );
    let on_rows = stage(&data, "sft-on-rows", "builtin:tiny-arith", SFT, 2, PERMISSIVE_GATES)
        .replace(&format!("train = \"{}/sft.jsonl\"", data.display()), "train = \"previous\"");
    let spec = pipeline(
        "r1-rows",
        &[stage(&data, "cold-start", "builtin:tiny-arith", SFT, 2, PERMISSIVE_GATES), sampling, on_rows],
    );
    let id = submit(&daemon, TEAM_TOKEN, &spec).unwrap();
    let ended = wait_pipeline(&daemon, &id, Duration::from_secs(900), |view| view.state.is_terminal());
    assert_eq!(ended.state, PipelineState::Succeeded, "{ended:?}\n{}", daemon.log());
    let Some(StageOutput::Dataset { name, sha256 }) = ended.stages[1].output.clone() else {
        panic!("the sampling stage hands on a dataset: {ended:?}");
    };
    assert_eq!(name, "r1-rows");
    // The sampling stage started from the cold start's checkpoint; the last trained on its rows.
    let sampled = job(&daemon, ended.stages[1].job.as_deref().unwrap());
    assert_eq!(sampled.published_dataset.clone().unwrap(), format!("dataset:r1-rows@{sha256}"), "{sampled}");
    let last = ended.stages[2].job.as_deref().unwrap();
    let spec: serde_json::Value =
        serde_json::from_slice(&fs::read(daemon.state.join(format!("jobs/{last}/spec.json"))).unwrap())
            .unwrap();
    let blob = daemon.state.join(format!("datasets/tests/blobs/{sha256}.jsonl"));
    assert_eq!(spec["data"]["train"].as_str(), blob.to_str(), "{spec}");
    assert_eq!(job(&daemon, last).state, JobState::Published);
}
