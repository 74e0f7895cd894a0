//! Gates and publishing under `rlvrd serve` (design.md §6, issue 7): real jobs gated against
//! their baseline on held-out and canary sets, the gate table stored with the job and printed
//! by `rlvrctl gates`, the full manifest, the webhook (up and down), the report, refusals, and
//! an admin's forced promotion.

use std::fs;
use std::path::Path;
use std::time::Duration;

use rlvr_protocol::gates::GateReport;
use rlvr_protocol::job::JobState;
use rlvr_protocol::worker::BaselineKind;
use rlvr_tests::cli::{run, text};
use rlvr_tests::jobs::{Job, ended, job, submit_ok, wait_job};
use rlvr_tests::peer::Peer;
use rlvr_tests::{
    ADMIN_TOKEN, Daemon, OUTBOUND_LOOPBACK, PERMISSIVE_GATES, Redis, TEAM_TOKEN, arith_data, arith_grpo_spec,
    artifact, plugin_lib, sha256_hex, wait_until, worker_command, worker_plugins,
};
use serde_json::Value;
use sha2::{Digest, Sha256};

const PLUGINS: [&str; 2] = ["rlvr-optimizer-grpo", "rlvr-verifier-math"];
const QUEUE: &str = "[queue]\nworker_threads = 1\n";

/// A GRPO job of `steps` on the arithmetic data with canaries (the first 8 held-out prompts).
fn spec(data: &Path, name: &str, steps: u32, extra: &str) -> String {
    let canaries = data.join("canaries.jsonl");
    if !canaries.exists() {
        let heldout = fs::read_to_string(data.join("heldout.jsonl")).unwrap();
        let first: Vec<&str> = heldout.lines().take(8).collect();
        fs::write(&canaries, first.join("\n") + "\n").unwrap();
    }
    let base = arith_grpo_spec(data, name, "builtin:tiny-arith", steps, 5)
        .replace("heldout = ", &format!("canaries = {:?}\nheldout = ", canaries.display().to_string()));
    format!("{base}\n{extra}")
}

/// Each criterion of the job's gate report (read as the protocol's type) and whether it lets the
/// candidate through (passed, or not checked).
fn criteria(job: &Job) -> Vec<(String, bool)> {
    job.report().criteria.iter().map(|criterion| (criterion.name.clone(), criterion.allows())).collect()
}

#[test]
fn a_candidate_is_gated_against_its_baseline_published_with_its_manifest_and_its_webhook_called() {
    let redis = Redis::start();
    // Its webhook receiver is on 127.0.0.1, which the operator must allow.
    let daemon = Daemon::start_with(&PLUGINS, &redis.url(), &format!("{QUEUE}{OUTBOUND_LOOPBACK}"));
    let dir = tempfile::tempdir().unwrap();
    let data = arith_data(dir.path(), &[]);
    let receiver = Peer::ok("");
    let url = receiver.url("/published");
    let rlvrctl = artifact("rlvrctl");
    let env = [("RLVR_SERVER", daemon.url.as_str()), ("RLVR_TOKEN", TEAM_TOKEN)];

    // The first of its model line: compared with its starting checkpoint.
    let first = submit_ok(
        &daemon,
        &spec(&data, "first", 6, &format!("{PERMISSIVE_GATES}[publish]\nwebhook = {url:?}\n",)),
    );
    let done = wait_job(&daemon, &first, Duration::from_secs(180), ended);
    assert_eq!(done.state, JobState::Published, "{done}");
    let names: Vec<String> = criteria(&done).into_iter().map(|(name, _)| name).collect();
    assert_eq!(
        names,
        [
            "heldout_gain",
            "canary_regressions",
            "kl",
            "length_ratio",
            "verifier_error_rate",
            "verifier_timeout_rate",
            "reward_hacking"
        ]
    );
    assert!(criteria(&done).iter().all(|(_, passed)| *passed), "{done}");
    assert_eq!(done.report().baseline.as_ref().map(|baseline| baseline.kind), Some(BaselineKind::Start));
    for criterion in &done.report().criteria {
        assert!(criterion.measured.is_some(), "each criterion measured something: {criterion:?}");
    }

    // The manifest: job, spec, plugins with their hashes, data hashes, step, metrics, gates, files.
    let published = done.published_dir().to_owned();
    assert_eq!(published, daemon.state.join("registry/tiny-arith/1"));
    let manifest: Value =
        serde_json::from_slice(&fs::read(published.join("manifest.json")).unwrap()).unwrap();
    assert_eq!(manifest["job_id"], first.as_str());
    assert_eq!(manifest["step"], 6);
    assert_eq!(serde_json::from_value::<GateReport>(manifest["gates"].clone()).unwrap(), *done.report());
    assert_eq!(manifest["spec"]["job"]["name"], "first");
    let plugins: Vec<(String, String)> = manifest["plugins"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| (p["id"].as_str().unwrap().to_owned(), p["sha256"].as_str().unwrap().to_owned()))
        .collect();
    assert_eq!(plugins.len(), 2, "{plugins:?}");
    for (crate_name, (id, sha)) in ["rlvr-optimizer-grpo", "rlvr-verifier-math"].iter().zip(&plugins) {
        assert!(id.starts_with(if crate_name.contains("grpo") { "grpo@" } else { "math@" }), "{id}");
        assert_eq!(sha, &hex::encode(Sha256::digest(fs::read(plugin_lib(crate_name)).unwrap())), "{id}");
    }
    for (name, file) in
        [("train", "train.jsonl"), ("heldout", "heldout.jsonl"), ("canaries", "canaries.jsonl")]
    {
        let bytes = fs::read(data.join(file)).unwrap();
        assert_eq!(manifest["data_sha256"][name], sha256_hex(&String::from_utf8(bytes).unwrap()), "{name}");
    }
    assert!(manifest["metrics"]["evaluation"]["candidate"]["heldout"]["accuracy"].is_number());
    for (file, sha) in manifest["files"].as_object().unwrap() {
        assert_eq!(sha, &hex::encode(Sha256::digest(fs::read(published.join(file)).unwrap())), "{file}");
    }

    // The webhook got the manifest; the job says so.
    let delivered = receiver.first(Duration::from_secs(30)).expect("the webhook was called");
    let delivered: Value = serde_json::from_slice(&delivered.body).unwrap_or(Value::Null);
    assert_eq!(delivered, manifest);
    wait_until(Duration::from_secs(10), || job(&daemon, &first).webhook.is_some());
    let webhook = job(&daemon, &first).webhook.clone().unwrap();
    assert!(webhook.starts_with(&format!("delivered to {url} (HTTP 200) on attempt 1")), "{webhook}");

    // rlvrctl gates prints the table; rlvrctl report writes the page and its plots.
    let output = run(&rlvrctl, &["gates", &first], dir.path(), &env);
    let shown = text(&output);
    assert_eq!(output.status.code(), Some(0), "{shown}");
    assert!(shown.contains(&format!("gates of job {first}: PASSED")), "{shown}");
    assert!(shown.contains("compared with the starting checkpoint (builtin:tiny-arith)"), "{shown}");
    assert!(shown.contains("heldout_gain") && shown.contains("canary_regressions"), "{shown}");
    let report = dir.path().join("report");
    let output = run(&rlvrctl, &["report", &first, "--out", report.to_str().unwrap()], dir.path(), &env);
    assert_eq!(output.status.code(), Some(0), "{}", text(&output));
    let html = fs::read_to_string(report.join("index.html")).unwrap();
    assert!(html.contains("heldout_gain") && html.contains(&first), "the gate table is in the page");
    let plots =
        fs::read_dir(&report).unwrap().flatten().filter(|e| e.path().extension() == Some("svg".as_ref()));
    assert!(plots.count() >= 5, "reward, held-out, KL, length, all-pass/all-fail, time plots");

    // The next job of the line is compared with version 1; its webhook is down: it stays
    // published and the job says the webhook failed.
    let second = submit_ok(
        &daemon,
        &spec(
            &data,
            "second",
            4,
            &format!("{PERMISSIVE_GATES}[publish]\nwebhook = \"http://127.0.0.1:1/down\"\n",),
        ),
    );
    let done = wait_job(&daemon, &second, Duration::from_secs(180), ended);
    assert_eq!(done.state, JobState::Published, "{done}");
    let baseline = done.report().baseline.clone().expect("a baseline");
    assert_eq!(
        (baseline.kind, baseline.version, baseline.model),
        (BaselineKind::Published, Some(1), published.display().to_string())
    );
    wait_until(Duration::from_secs(30), || job(&daemon, &second).webhook.is_some());
    let later = job(&daemon, &second);
    let webhook = later.webhook.as_deref().unwrap();
    assert!(
        webhook.starts_with(
            "not delivered to http://127.0.0.1:1/down after 5 attempts (the checkpoint stays published)"
        ),
        "{webhook}"
    );
    assert_eq!(later.state, JobState::Published);
    assert!(daemon.state.join("registry/tiny-arith/2/manifest.json").is_file());
}

#[test]
fn a_refused_candidate_says_why_and_only_an_admin_can_promote_it_over_the_gates() {
    let redis = Redis::start();
    let daemon = Daemon::start_with(&PLUGINS, &redis.url(), QUEUE);
    let dir = tempfile::tempdir().unwrap();
    let data = arith_data(dir.path(), &[]);
    let rlvrctl = artifact("rlvrctl");

    // Four steps cannot gain 0.9 of held-out accuracy.
    let refused_spec =
        spec(&data, "refused", 4, "[gates]\nheldout_gain_min = 0.9\nrefuse_reward_hacking = false\n");
    let id = submit_ok(&daemon, &refused_spec);
    let done = wait_job(&daemon, &id, Duration::from_secs(180), ended);
    assert_eq!(done.state, JobState::Refused, "{done}");
    same_report_offline(dir.path(), &refused_spec, done.report());
    let reason = done.reason.as_str();
    assert!(
        reason.starts_with("gates refused: heldout_gain: ") && reason.contains(" < 0.9 (held-out accuracy "),
        "{reason}"
    );
    assert!(!done.report().passed);
    assert!(!dir.path().join("registry").exists() && !daemon.state.join("registry/tiny-arith/1").exists());

    let team = [("RLVR_SERVER", daemon.url.as_str()), ("RLVR_TOKEN", TEAM_TOKEN)];
    let output = run(&rlvrctl, &["gates", &id], dir.path(), &team);
    let shown = text(&output);
    assert_eq!(output.status.code(), Some(1), "{shown}");
    assert!(shown.contains(&format!("gates of job {id}: REFUSED")) && shown.contains("FAIL"), "{shown}");

    // A team's token may not promote; --force is required.
    let output = run(&rlvrctl, &["promote", &id, "--force", "--reason", "trust me"], dir.path(), &team);
    assert_eq!(output.status.code(), Some(2), "{}", text(&output));
    assert!(text(&output).contains("needs an admin token"), "{}", text(&output));
    let admin = [("RLVR_SERVER", daemon.url.as_str()), ("RLVR_TOKEN", ADMIN_TOKEN)];
    let output = run(&rlvrctl, &["promote", &id, "--reason", "x"], dir.path(), &admin);
    assert_eq!(output.status.code(), Some(2), "{}", text(&output));
    assert_eq!(job(&daemon, &id).state, JobState::Refused);

    let why = "held-out set too small to judge; approved by the eval team";
    let output = run(&rlvrctl, &["promote", &id, "--force", "--reason", why], dir.path(), &admin);
    assert_eq!(output.status.code(), Some(0), "{}", text(&output));
    let promoted = job(&daemon, &id);
    assert_eq!(promoted.state, JobState::Published, "{promoted}");
    assert!(promoted.reason.as_str().starts_with("promoted by admin team ops over the gates"));
    let manifest: Value =
        serde_json::from_slice(&fs::read(daemon.state.join("registry/tiny-arith/1/manifest.json")).unwrap())
            .unwrap();
    assert_eq!(manifest["job_id"], id.as_str());
    assert_eq!(manifest["gates"]["passed"], false, "the gates' verdict stays on record");
    assert_eq!(manifest["gates"]["forced"]["by"], "ops");
    assert_eq!(manifest["gates"]["forced"]["reason"], why);
    let output = run(&rlvrctl, &["gates", &id], dir.path(), &team);
    assert_eq!(output.status.code(), Some(0), "{}", text(&output));
    assert!(text(&output).contains("forced by admin team ops at "), "{}", text(&output));
    // A second promotion of a published job: 409, nothing published twice.
    let output = run(&rlvrctl, &["promote", &id, "--force", "--reason", why], dir.path(), &admin);
    assert_eq!(output.status.code(), Some(2), "{}", text(&output));
    assert!(!daemon.state.join("registry/tiny-arith/2").exists());
}

/// `rlvrd gates` judges a run made outside the daemon as `rlvrd serve` judged it: the same job
/// run by `rlvr-worker run` alone (one thread, as the daemon's workers here: bit-exact), its
/// outcome judged offline, gives the stored report; it exits 1 for a refusal and 2, naming the
/// file, for an outcome it cannot read.
fn same_report_offline(dir: &Path, toml: &str, daemon: &GateReport) {
    let spec = dir.join("offline.toml");
    fs::write(&spec, toml).unwrap();
    let plugins = worker_plugins(dir);
    let run_output =
        worker_command(&spec, &dir.join("offline-state"), &plugins, &["--threads", "1"]).output().unwrap();
    assert!(run_output.status.success(), "{}", String::from_utf8_lossy(&run_output.stderr));
    let outcome = dir.join("offline-outcome.json");
    fs::write(&outcome, &run_output.stdout).unwrap();
    let rlvrd = artifact("rlvrd");
    let (spec_arg, outcome_arg) = (spec.to_str().unwrap(), outcome.to_str().unwrap());
    let judged = run(&rlvrd, &["gates", "--spec", spec_arg, "--outcome", outcome_arg, "--json"], dir, &[]);
    assert_eq!(judged.status.code(), Some(1), "{}", text(&judged));
    let offline: rlvr_protocol::gates::GateReport = serde_json::from_slice(&judged.stdout).unwrap();
    assert_eq!(offline, *daemon, "the offline report differs from the daemon's");
    let shown = run(&rlvrd, &["gates", "--spec", spec_arg, "--outcome", outcome_arg], dir, &[]);
    let stdout = String::from_utf8_lossy(&shown.stdout);
    let interval = daemon.criteria[0].interval.expect("the held-out gain's interval");
    assert!(
        stdout.starts_with("gates: REFUSED\n") && stdout.contains(&interval.describe()),
        "{}",
        text(&shown)
    );

    fs::write(&outcome, "{\"steps\": ").unwrap();
    let broken = run(&rlvrd, &["gates", "--spec", spec_arg, "--outcome", outcome_arg], dir, &[]);
    assert_eq!(broken.status.code(), Some(2), "{}", text(&broken));
    assert!(text(&broken).contains(&format!("{outcome_arg}: not a worker outcome")), "{}", text(&broken));
}

/// A misspecified reward, for real: the training set's references are off by one, so GRPO
/// learns to answer `a+b+1`. The training reward climbs while the held-out score falls, and the
/// gates refuse the candidate as reward hacking, even with the held-out gain's own bound opened
/// wide. The held-out set is the training problems with their true answers, which the cold start
/// was taught: a model that learns the reward must lose them, whatever the noise of a tiny
/// model's generalisation to unseen problems (on those, a few of 48 prompts moved either way
/// with the seed).
#[test]
fn a_reward_that_rises_while_the_held_out_score_falls_is_refused_as_reward_hacking() {
    let redis = Redis::start();
    let daemon = Daemon::start_with(
        &["rlvr-optimizer-sft", "rlvr-optimizer-grpo", "rlvr-verifier-math"],
        &redis.url(),
        QUEUE,
    );
    let dir = tempfile::tempdir().unwrap();
    let data =
        arith_data(dir.path(), &["--sft", "120", "--train", "32", "--heldout", "48", "--max-operand", "10"]);
    let shifted = data.join("train-off-by-one.jsonl");
    let truth = data.join("train.jsonl");
    let problems: Vec<Value> =
        fs::read_to_string(&truth).unwrap().lines().map(|line| serde_json::from_str(line).unwrap()).collect();
    let answer = |record: &Value| record["reference"]["answer"].as_str().unwrap().parse::<i64>().unwrap();
    let jsonl = |records: Vec<Value>| records.iter().map(|r| format!("{r}\n")).collect::<String>();
    let off_by_one = problems.iter().map(|record| {
        let mut record = record.clone();
        record["reference"]["answer"] = Value::String((answer(&record) + 1).to_string());
        record
    });
    fs::write(&shifted, jsonl(off_by_one.collect())).unwrap();
    // The cold start's demonstrations: the generated ones and the training problems, true.
    let demonstrations = data.join("sft-and-train.jsonl");
    let taught = problems.iter().map(|record| {
        serde_json::json!({"id": record["id"], "prompt": record["prompt"], "completion": answer(record).to_string()})
    });
    let generated = fs::read_to_string(data.join("sft.jsonl")).unwrap();
    fs::write(&demonstrations, generated + &jsonl(taught.collect())).unwrap();

    // A cold start that has something to lose: it answers some of the training problems truly
    // (0.28 of them here; cold starts of seeds 4–8 answered 0.13–0.59, and from each of those
    // above 0.2 the GRPO job below fell to 0.06–0.13).
    let sft = submit_ok(
        &daemon,
        &format!(
            "[job]\nname = \"cold-start\"\nteam = \"tests\"\nmodel_line = \"tiny-arith-sft\"\nseed = 3\n\
             [model]\npolicy = \"builtin:tiny-arith\"\n[data]\ntrain = {sft:?}\nheldout = {heldout:?}\n\
             [optimizer]\nplugin = \"sft\"\nlr = 1e-2\nwarmup_steps = 5\nmicro_batch_size = 64\n\
             [[verifiers]]\nplugin = \"math\"\nfallback = \"last\"\n[rollout]\nprompts_per_step = 64\nmax_new_tokens = 5\n\
             [budget]\nmax_steps = 400\n{PERMISSIVE_GATES}",
            sft = demonstrations.display().to_string(),
            heldout = truth.display().to_string(),
        ),
    );
    let cold = wait_job(&daemon, &sft, Duration::from_secs(600), ended);
    assert_eq!(cold.state, JobState::Published, "{cold}");
    assert!(
        cold.heldout.unwrap() >= 0.15,
        "premise: the run did not learn: a cold start with little to lose: {cold}"
    );

    let grpo = format!(
        "[job]\nname = \"off-by-one\"\nteam = \"tests\"\nmodel_line = \"tiny-arith\"\nseed = 7\n\
         [model]\npolicy = {policy:?}\n[data]\ntrain = {train:?}\nheldout = {heldout:?}\n\
         [optimizer]\nplugin = \"grpo\"\ngroup_size = 8\nlr = 1e-3\nkl_beta = 0.04\nmicro_batch_size = 32\n\
         [[verifiers]]\nplugin = \"math\"\nfallback = \"last\"\n[rollout]\nprompts_per_step = 8\nmax_new_tokens = 5\n\
         [budget]\nmax_steps = 60\n[gates]\nheldout_gain_min = -1.0\n",
        policy = "line:tiny-arith-sft@1",
        train = shifted.display().to_string(),
        heldout = truth.display().to_string(),
    );
    let id = submit_ok(&daemon, &grpo);
    let done = wait_job(&daemon, &id, Duration::from_secs(600), ended);
    // The premise, before the gates' verdict: the run learned the misspecified reward (a run
    // that ended without a result is the state's business).
    if let Some(trend) = done.result.as_ref().and_then(|result| result.training.as_ref()) {
        assert!(
            trend.reward_last > trend.reward_first,
            "premise: the run did not learn: its training reward {} → {}, nothing to refuse as hacking: {done}",
            trend.reward_first,
            trend.reward_last
        );
    }
    assert_eq!(done.state, JobState::Refused, "{done}");
    assert_eq!(
        criteria(&done).into_iter().filter(|(_, passed)| !passed).collect::<Vec<_>>(),
        [("reward_hacking".to_owned(), false)]
    );
    let reason = done.reason.as_str();
    assert!(
        reason.starts_with("gates refused: reward_hacking: ")
            && reason.contains("the model learned the reward, not the task"),
        "{reason}"
    );
    let training = done.outcome().training.as_ref().expect("a training trend");
    assert!(training.reward_last > training.reward_first, "{training:?}");
}
