//! Rejection-sampling jobs (`[optimizer] plugin = "rejection-sampling"`, issue 21) through
//! `rlvrd serve`: a job samples tiny-arith completions, keeps the best of each prompt's group,
//! and publishes them as its team's dataset (`published_dataset`, `dataset:NAME@SHA256`), which
//! an SFT job of the same team then trains on and another team cannot name; a job that accepts
//! too few rows is refused by its gate; its keys are refused at submit by name; and a killed job
//! resumes to exactly the rows of an uninterrupted one.

use std::collections::HashSet;
use std::fs;
use std::path::Path;
use std::time::Duration;

use rlvr_protocol::builtin::SampledRow;
use rlvr_protocol::gates::Status;
use rlvr_protocol::job::JobState;
use rlvr_protocol::jobdir::RunDir;
use rlvr_protocol::worker::WorkerExit;
use rlvr_tests::jobs::{ended, get, submit, submit_ok, wait_job};
use rlvr_tests::{Daemon, OTHER_TOKEN, Redis, TEAM_TOKEN, arith_data, worker_command, worker_plugins};

const PLUGINS: [&str; 3] = ["rlvr-optimizer-sft", "rlvr-verifier-math", "rlvr-verifier-format"];

/// A rejection-sampling job of team `tests` over `data`'s training prompts: group 4, 4 prompts a
/// step, its own `[optimizer]` keys `keys` (the output name included).
fn rejection_spec(data: &Path, name: &str, keys: &str, steps: u32) -> String {
    format!(
        "[job]\nname = {name:?}\nteam = \"tests\"\nmodel_line = \"tiny-rs\"\nseed = 3\n\
         [model]\npolicy = \"builtin:tiny-arith\"\n\
         [data]\ntrain = \"{data}/train.jsonl\"\n\
         [optimizer]\nplugin = \"rejection-sampling\"\ngroup_size = 4\n{keys}\n\
         [[verifiers]]\nplugin = \"math\"\nfallback = \"last\"\n\
         [rollout]\nmax_new_tokens = 5\nprompts_per_step = 4\n\
         [budget]\nmax_steps = {steps}\n[checkpoint]\nevery_steps = 1\n[resources]\nmemory_gb = 4\n",
        data = data.display()
    )
}

/// The rows of a dataset file.
fn rows(text: &str) -> Vec<SampledRow> {
    text.lines().map(|line| serde_json::from_str(line).expect("a row")).collect()
}

#[test]
fn a_rejection_sampling_job_publishes_its_teams_dataset_that_an_sft_job_trains_on() {
    let redis = Redis::start();
    let dir = tempfile::tempdir().unwrap();
    let data = arith_data(dir.path(), &["--train", "10", "--heldout", "4", "--sft", "0"]);
    let daemon =
        Daemon::start_with(&PLUGINS, &redis.url(), "[devices]\ncpu_slots = 1\ncpu_slot_memory_gb = 8\n");

    // threshold 0: every completion clears it, so each prompt keeps its best two distinct ones.
    let id = submit_ok(
        &daemon,
        &rejection_spec(&data, "rs", "output = \"arith-best\"\nthreshold = 0.0\nkeep = 2", 10),
    );
    let job = wait_job(&daemon, &id, Duration::from_secs(180), ended);
    assert_eq!(job.state, JobState::Published, "{job}\n{}", daemon.log());
    let reference = job.published_dataset.clone().expect("published_dataset");
    let sha = reference.strip_prefix("dataset:arith-best@").expect("dataset:arith-best@SHA");
    assert_eq!(sha.len(), 64, "{reference}");
    // 10 prompts at 4 a step: 3 steps, the last one short; then it ends (max_steps is 10).
    assert_eq!(job.step, 3, "{job}");
    let produced = job.outcome().dataset.as_ref().expect("a sampled dataset");
    assert_eq!((produced.prompts, produced.completions), (10, 40), "{job}");
    let accepted = produced.accepted;
    assert!((10..=20).contains(&accepted), "{job}");
    let criteria: Vec<&str> = job.report().criteria.iter().map(|criterion| criterion.name.as_str()).collect();
    assert_eq!(criteria, ["accepted_rows", "acceptance_rate", "accepted_reward_mean"]);
    assert_eq!(job.report().criteria[0].status, Status::Pass, "{job}");

    // The team's dataset, with the job's rows: each prompt at most twice, no row twice.
    let (status, listed) = get(&daemon, TEAM_TOKEN, "/v1/datasets");
    assert_eq!(status, 200, "{listed}");
    let entry = listed["datasets"].as_array().unwrap().iter().find(|d| d["name"] == "arith-best").cloned();
    let entry = entry.unwrap_or_else(|| panic!("no arith-best in {listed}"));
    assert_eq!((entry["sha256"].as_str(), entry["records"].as_u64()), (Some(sha), Some(accepted)), "{entry}");
    let run = RunDir::at(daemon.state.join("jobs").join(&id).join("run"));
    let written = rows(&fs::read_to_string(run.dataset()).unwrap());
    assert_eq!(written.len() as u64, accepted);
    let distinct: HashSet<(&str, &str)> =
        written.iter().map(|row| (row.prompt_id.as_str(), row.completion.as_str())).collect();
    assert_eq!(distinct.len(), written.len(), "a row twice: {written:?}");
    let prompts: HashSet<&str> = written.iter().map(|row| row.prompt_id.as_str()).collect();
    assert_eq!(prompts.len(), 10, "every prompt got a row at threshold 0: {written:?}");

    // An SFT job of the same team trains on it by that name.
    let sft = format!(
        "[job]\nname = \"sft-on-rs\"\nteam = \"tests\"\nmodel_line = \"tiny-rs-sft\"\n\
         [model]\npolicy = \"builtin:tiny-arith\"\n[data]\ntrain = \"{reference}\"\n\
         [optimizer]\nplugin = \"sft\"\nlr = 1e-3\n[rollout]\nprompts_per_step = 4\n[budget]\nmax_steps = 2\n\
         [resources]\nmemory_gb = 4\n"
    );
    let sft_id = submit_ok(&daemon, &sft);
    let sft_job = wait_job(&daemon, &sft_id, Duration::from_secs(180), ended);
    assert_eq!(sft_job.state, JobState::Published, "{sft_job}\n{}", daemon.log());
    assert_eq!(sft_job.step, 2, "{sft_job}");

    // regression: a spec named another team's dataset as data.train
    let stolen = sft.replace("team = \"tests\"", "team = \"others\"").replace("tiny-rs-sft", "others-line");
    let (status, body) = submit(&daemon, OTHER_TOKEN, &stolen, None);
    assert_eq!(status, 422, "{body}");
    assert_eq!(body["error"]["field"], "data.train", "{body}");
}

#[test]
fn a_rejection_sampling_job_below_its_gate_publishes_nothing_and_bad_keys_are_refused_by_name() {
    let redis = Redis::start();
    let dir = tempfile::tempdir().unwrap();
    let data = arith_data(dir.path(), &["--train", "4", "--heldout", "4", "--sft", "0"]);
    let daemon =
        Daemon::start_with(&PLUGINS, &redis.url(), "[devices]\ncpu_slots = 1\ncpu_slot_memory_gb = 8\n");

    let check = |keys: &str, extra: &str, field: &str, words: &str| {
        let spec = rejection_spec(&data, "bad", keys, 2) + extra;
        let (status, body) = submit(&daemon, TEAM_TOKEN, &spec, None);
        assert!((400..500).contains(&status), "{keys} {extra}: {body}");
        assert_eq!(body["error"]["field"], field, "{keys} {extra}: {body}");
        let message = body["error"]["message"].as_str().unwrap_or_default();
        assert!(message.contains(words), "{keys} {extra}: {message:?} lacks {words:?}");
    };
    check("", "", "optimizer.output", "missing");
    check("output = \"x\"\nkeep = 9", "", "optimizer.keep", "expected 1 to optimizer.group_size (4), got 9");
    check("output = \"x\"\nthreshhold = 1.0", "", "optimizer.threshhold", "unknown");
    check("output = \"../up\"", "", "optimizer.output", "expected a dataset name");
    let with_heldout = rejection_spec(&data, "bad", "output = \"x\"", 2)
        .replace("[optimizer]", &format!("heldout = \"{}/heldout.jsonl\"\n[optimizer]", data.display()));
    let (status, body) = submit(&daemon, TEAM_TOKEN, &with_heldout, None);
    assert_eq!((status, body["error"]["field"].as_str()), (422, Some("data.heldout")), "{body}");

    // Every completion accepted, but the gate asks for more rows than 4 prompts can give.
    let id = submit_ok(
        &daemon,
        &rejection_spec(&data, "few", "output = \"few\"\nthreshold = 0.0\nmin_accepted = 100", 5),
    );
    let job = wait_job(&daemon, &id, Duration::from_secs(180), ended);
    assert_eq!(job.state, JobState::Refused, "{job}\n{}", daemon.log());
    let reason = job.reason.as_str();
    assert!(reason.contains("accepted_rows: 4.0000 < 100"), "{reason}");
    assert!(job.published_dataset.is_none() && job.output.is_none(), "{job}");
    let (_, listed) = get(&daemon, TEAM_TOKEN, "/v1/datasets");
    assert!(!listed.to_string().contains("\"few\""), "{listed}");
}

#[test]
fn a_killed_rejection_sampling_run_resumes_to_exactly_the_rows_of_an_uninterrupted_one() {
    let dir = tempfile::tempdir().unwrap();
    let plugins = worker_plugins(dir.path());
    let data = arith_data(dir.path(), &["--train", "12", "--heldout", "4", "--sft", "0"]);
    let spec = dir.path().join("rs.toml");
    let text = rejection_spec(&data, "rs", "output = \"o\"\nthreshold = 0.0\nkeep = 3", 20)
        .replace("prompts_per_step = 4", "prompts_per_step = 1");
    fs::write(&spec, text).unwrap();
    let finished = i32::from(WorkerExit::Finished.code());

    let straight = dir.path().join("straight");
    let output = worker_command(&spec, &straight, &plugins, &[]).output().unwrap();
    assert_eq!(output.status.code(), Some(finished), "{}", String::from_utf8_lossy(&output.stderr));
    let expected = fs::read(RunDir::at(straight.clone()).dataset()).unwrap();
    assert!(!expected.is_empty());
    judged_offline_by_the_dataset_criteria(dir.path(), &spec, &output.stdout);

    // Killed once its first checkpoint is down (one prompt a step: many steps to go), half a row
    // past the checkpoint appended as a kill mid-write would leave it, then resumed.
    let resumed = dir.path().join("resumed");
    let mut child = worker_command(&spec, &resumed, &plugins, &[]).spawn().unwrap();
    let run = RunDir::at(resumed.clone());
    assert!(
        rlvr_tests::wait_until(Duration::from_secs(120), || run.latest_checkpoint().ok().flatten().is_some()),
        "no checkpoint"
    );
    child.kill().unwrap();
    child.wait().unwrap();
    let killed_at = fs::read(run.dataset()).unwrap().len();
    assert!(killed_at < expected.len(), "the run ended before the kill: nothing resumed");
    let mut file = fs::OpenOptions::new().append(true).open(run.dataset()).unwrap();
    std::io::Write::write_all(&mut file, b"{\"id\": \"half-writ").unwrap();
    let output = worker_command(&spec, &resumed, &plugins, &["--resume"]).output().unwrap();
    assert_eq!(output.status.code(), Some(finished), "{}", String::from_utf8_lossy(&output.stderr));
    assert_eq!(
        String::from_utf8(fs::read(run.dataset()).unwrap()).unwrap(),
        String::from_utf8(expected).unwrap()
    );
}

/// `rlvrd gates` judges a standalone rejection-sampling run as the daemon does, by its dataset's
/// criteria, not a policy's held-out gain: its outcome passes, and fails with the gate raised.
fn judged_offline_by_the_dataset_criteria(dir: &Path, spec: &Path, outcome: &[u8]) {
    let outcome_file = dir.join("rs-outcome.json");
    fs::write(&outcome_file, outcome).unwrap();
    let judge = |spec: &Path| {
        std::process::Command::new(rlvr_tests::artifact("rlvrd"))
            .args(["gates", "--json", "--spec"])
            .arg(spec)
            .arg("--outcome")
            .arg(&outcome_file)
            .output()
            .unwrap()
    };
    let passed = judge(spec);
    assert_eq!(passed.status.code(), Some(0), "{}", String::from_utf8_lossy(&passed.stderr));
    let report: rlvr_protocol::gates::GateReport = serde_json::from_slice(&passed.stdout).unwrap();
    let names: Vec<&str> = report.criteria.iter().map(|criterion| criterion.name.as_str()).collect();
    assert_eq!(names, ["accepted_rows", "acceptance_rate", "accepted_reward_mean"]);

    let raised = dir.join("rs-raised.toml");
    fs::write(
        &raised,
        fs::read_to_string(spec).unwrap().replace("keep = 3", "keep = 3\nmin_accepted = 1000"),
    )
    .unwrap();
    let refused = judge(&raised);
    assert_eq!(refused.status.code(), Some(1), "{}", String::from_utf8_lossy(&refused.stderr));
    let report: rlvr_protocol::gates::GateReport = serde_json::from_slice(&refused.stdout).unwrap();
    assert!(
        report.refusal().contains("accepted_rows: ") && report.refusal().contains(" < 1000"),
        "{}",
        report.refusal()
    );
}
