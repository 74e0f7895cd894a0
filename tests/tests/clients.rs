//! Other teams' tools against a real `rlvrd serve` and Redis: `rlvrctl` (submit --wait, status,
//! list, watch, cancel; server and token from flags, the environment and cli.toml) and the
//! standard-library Python example `examples/python/submit_job.py`. Each submits a spec whose
//! paths are relative to its file, as a user writes it, and follows the job to its end.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};
use std::time::Duration;

use rlvr_tests::cli::{command, run, text};
use rlvr_tests::{
    Daemon, PERMISSIVE_GATES, Redis, TEAM_TOKEN, arith_data, arith_grpo_spec, artifact, wait_until,
};
use serde_json::Value;
use sha2::Digest;

const PLUGINS: [&str; 2] = ["rlvr-optimizer-grpo", "rlvr-verifier-math"];
const QUEUE: &str = "[queue]\nheartbeat_ms = 500\nmissed_heartbeats = 6\nworker_threads = 1\n";
/// A grace period of a second for unnamed dataset content, so that a sweep runs within the test.
const QUICK_SWEEPS: &str = "[tenancy]\ndataset_grace_s = 1\n";

/// A directory holding `data/` and a job spec `NAME.toml` that names the data as `data/…`,
/// relative to the spec's own directory.
fn job_file(dir: &Path, name: &str, steps: u32) -> PathBuf {
    if !dir.join("data").is_dir() {
        arith_data(dir, &[]);
    }
    let spec = arith_grpo_spec(Path::new("data"), name, "builtin:tiny-arith", steps, 5);
    let file = dir.join(format!("{name}.toml"));
    fs::write(&file, format!("{spec}\n{PERMISSIVE_GATES}")).unwrap();
    file
}

fn json(output: &Output) -> Value {
    assert_eq!(output.status.code(), Some(0), "{}", text(output));
    serde_json::from_slice(&output.stdout).unwrap_or_else(|error| panic!("{error}: {}", text(output)))
}

#[test]
fn rlvrctl_submits_follows_lists_and_cancels_jobs_against_a_real_daemon() {
    let redis = Redis::start();
    let mut daemon = Daemon::start_with(&PLUGINS, &redis.url(), &format!("{QUEUE}{QUICK_SWEEPS}"));
    let dir = tempfile::tempdir().unwrap();
    let cwd = dir.path();
    let rlvrctl = artifact("rlvrctl");
    // The daemon comes back on the same address after a restart.
    let server = daemon.url.clone();
    let env = [("RLVR_SERVER", server.as_str()), ("RLVR_TOKEN", TEAM_TOKEN)];
    let file = job_file(cwd, "by-rlvrctl", 6);

    // submit --wait, from the spec's directory with its relative paths: published, exit 0.
    let submitted = run(&rlvrctl, &["submit", "--wait", "by-rlvrctl.toml"], cwd, &env);
    assert_eq!(submitted.status.code(), Some(0), "{}\n{}", text(&submitted), daemon.log());
    let stdout = String::from_utf8_lossy(&submitted.stdout);
    let id = stdout.lines().next().unwrap().trim().to_owned();
    for state in ["queued", "running", "evaluating", "published"] {
        assert!(stdout.contains(state), "the {state} line is shown: {}", text(&submitted));
    }

    // status and list, the server and token given as flags this time.
    let flags = ["--server", server.as_str(), "--token", TEAM_TOKEN, "--json"];
    let status = json(&run(&rlvrctl, &[&flags[..], &["status", &id]].concat(), cwd, &[]));
    assert_eq!((status["state"].as_str(), status["step"].as_u64()), (Some("published"), Some(6)), "{status}");
    // The spec's relative data paths were read from its directory and uploaded as the team's
    // datasets: its worker read those bytes, by content.
    let sha = hex::encode(sha2::Sha256::digest(fs::read(cwd.join("data/train.jsonl")).unwrap()));
    let read: Value =
        serde_json::from_slice(&fs::read(daemon.state.join(format!("jobs/{id}/spec.json"))).unwrap())
            .unwrap();
    let blob = daemon.state.join(format!("datasets/tests/blobs/{sha}.jsonl"));
    assert_eq!(read["data"]["train"].as_str(), blob.to_str(), "{read}");
    let list = json(&run(&rlvrctl, &[&flags[..], &["list", "--state", "published"]].concat(), cwd, &[]));
    let ids: Vec<&str> =
        list["jobs"].as_array().unwrap().iter().filter_map(|job| job["id"].as_str()).collect();
    assert_eq!(ids, [id.as_str()]);

    // estimate: the parts, and what submit filled in (the job shows the same).
    let estimate = run(&rlvrctl, &["estimate", "by-rlvrctl.toml"], cwd, &env);
    let printed = String::from_utf8_lossy(&estimate.stdout);
    assert_eq!(estimate.status.code(), Some(0), "{}", text(&estimate));
    for words in ["memory on a CPU slot", "policy weights", "KV cache", "activations", "it fits a device"] {
        assert!(printed.contains(words), "{words}: {printed}");
    }
    let filled = format!("memory_gb = {} and resident_gb = {}", status["memory_gb"], status["resident_gb"]);
    assert!(printed.contains(&filled), "{filled}: {printed}");

    // watch of an ended job returns at once with its outcome.
    let watched = run(&rlvrctl, &["--json", "watch", &id], cwd, &env);
    assert_eq!(watched.status.code(), Some(0), "{}", text(&watched));

    // logs: the worker's log, to the job's team only.
    let logs = run(&rlvrctl, &["logs", &id], cwd, &env);
    assert_eq!(logs.status.code(), Some(0), "{}", text(&logs));
    let printed = String::from_utf8_lossy(&logs.stdout);
    assert!(printed.contains("held-out before training"), "{printed}");
    let followed = run(&rlvrctl, &["logs", "--follow", &id], cwd, &env);
    assert_eq!((followed.status.code(), &followed.stdout), (Some(0), &logs.stdout), "{}", text(&followed));
    let other = [("RLVR_SERVER", server.as_str()), ("RLVR_TOKEN", rlvr_tests::OTHER_TOKEN)];
    let refused = run(&rlvrctl, &["logs", &id], cwd, &other);
    assert_eq!(refused.status.code(), Some(2), "another team's job is not found: {}", text(&refused));
    assert!(refused.stdout.is_empty(), "{}", text(&refused));

    // The warnings of steps without signal in status are the ones its metrics give.
    let api = rlvr_tests::jobs::api(&daemon, Some(TEAM_TOKEN));
    let metrics = api.metrics(&id).unwrap();
    let expected = rlvr_protocol::signals::GroupSignals::of(&metrics).warnings();
    let warnings: Vec<rlvr_protocol::signals::GroupWarning> =
        serde_json::from_value(status["progress"]["warnings"].clone()).unwrap_or_default();
    assert_eq!(warnings, expected, "{status}");
    let shown = text(&run(&rlvrctl, &["status", &id], cwd, &env));
    for warning in &expected {
        assert!(shown.contains(&warning.message), "{shown}");
    }

    // The settings from cli.toml alone; a long job submitted, cancelled while it runs.
    let config_home = cwd.join("config");
    fs::create_dir_all(config_home.join("rlvr")).unwrap();
    fs::write(
        config_home.join("rlvr/cli.toml"),
        format!("server = \"{server}\"\ntoken = \"{TEAM_TOKEN}\"\n"),
    )
    .unwrap();
    let from_file = [("XDG_CONFIG_HOME", config_home.to_str().unwrap())];
    // Its own data (more prompts): content only this job cites.
    let long_dir = cwd.join("long");
    arith_data(&long_dir, &["--train", "48"]);
    job_file(&long_dir, "long", 100_000);
    let long = run(&rlvrctl, &["submit", "long.toml"], &long_dir, &from_file);
    assert_eq!(long.status.code(), Some(0), "{}", text(&long));
    let long = String::from_utf8_lossy(&long.stdout).trim().to_owned();
    let running = || {
        let job = json(&run(&rlvrctl, &["--json", "status", &long], cwd, &from_file));
        job["step"].as_u64() >= Some(2)
    };
    assert!(wait_until(Duration::from_secs(120), running), "the long job trains\n{}", daemon.log());

    // Issue 36: nothing a job pinned disappears. A dry run of the spec with other data moves no
    // name; the name moved by a real upload, and swept (a grace of 1 s here), the running job's
    // content stays, and the first job's, which its published version cites; the dry run's goes.
    let content = |file: &Path| hex::encode(sha2::Sha256::digest(fs::read(file).unwrap()));
    let blobs = daemon.state.join("datasets/tests/blobs");
    let blob = |sha: &str| blobs.join(format!("{sha}.jsonl"));
    let (first_train, long_train) =
        (content(&cwd.join("data/train.jsonl")), content(&long_dir.join("data/train.jsonl")));
    let named_train = |daemon: &Daemon| {
        let datasets = rlvr_tests::jobs::api(daemon, Some(TEAM_TOKEN)).datasets().unwrap().datasets;
        datasets.into_iter().find(|dataset| dataset.name == "train").map(|dataset| dataset.sha256)
    };
    let long_train_named = Some(long_train.clone());
    assert_eq!(named_train(&daemon), long_train_named);
    let mut edited = fs::read_to_string(long_dir.join("data/train.jsonl")).unwrap();
    edited.push_str("{\"id\": \"edited-1\", \"prompt\": \"1+1=\", \"reference\": {\"answer\": \"2\"}}\n");
    fs::write(long_dir.join("data/train.jsonl"), &edited).unwrap();
    let dry = run(&rlvrctl, &["submit", "--dry-run", "long.toml"], &long_dir, &from_file);
    assert_eq!(dry.status.code(), Some(0), "{}", text(&dry));
    let dry_train = content(&long_dir.join("data/train.jsonl"));
    assert!(blob(&dry_train).is_file(), "the dry run's content is kept for its check");
    assert_eq!(named_train(&daemon), long_train_named, "a dry run moves no name");
    rlvr_tests::jobs::api(&daemon, Some(TEAM_TOKEN)).put_dataset("train", edited.as_bytes()).unwrap();
    rlvr_tests::jobs::api(&daemon, Some(TEAM_TOKEN))
        .put_dataset("train", b"{\"prompt\": \"1+1=\", \"answer\": \"2\"}\n")
        .unwrap();
    assert!(
        wait_until(Duration::from_secs(30), || !blob(&dry_train).exists()),
        "content nothing cites is swept after its grace period\n{}",
        daemon.log()
    );
    assert!(blob(&long_train).is_file(), "the running job's data outlives its name");
    assert!(blob(&first_train).is_file(), "a published version's data outlives its name");

    // watch follows it across a kill -9 and restart of the daemon, to its cancel.
    let watcher = command(&rlvrctl, &["watch", &long], cwd, &from_file)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(500));
    daemon.kill();
    daemon.restart();
    let step_before =
        json(&run(&rlvrctl, &["--json", "status", &long], cwd, &from_file))["step"].as_u64().unwrap();
    let resumed = || {
        let job = json(&run(&rlvrctl, &["--json", "status", &long], cwd, &from_file));
        job["state"] == "running" && job["step"].as_u64() > Some(step_before)
    };
    assert!(wait_until(Duration::from_secs(60), resumed), "the long job resumes\n{}", daemon.log());
    let cancelled = run(&rlvrctl, &["cancel", &long], cwd, &from_file);
    assert_eq!(cancelled.status.code(), Some(0), "{}", text(&cancelled));
    let watched = watcher.wait_with_output().unwrap();
    assert_eq!(watched.status.code(), Some(1), "a cancelled job's watch exits 1: {}", text(&watched));
    let (stdout, stderr) =
        (String::from_utf8_lossy(&watched.stdout), String::from_utf8_lossy(&watched.stderr));
    assert!(stderr.contains("reconnecting"), "the drop is shown: {}", text(&watched));
    assert!(stdout.contains("running at step"), "the resumed run is shown: {}", text(&watched));
    assert!(stderr.contains("cancelled"), "{}", text(&watched));
    // Ended, the job cites its data no more: the next sweeps delete it; the published one's stays.
    assert!(
        wait_until(Duration::from_secs(30), || !blob(&long_train).exists()),
        "an ended job's unnamed data is swept\n{}",
        daemon.log()
    );
    assert!(blob(&first_train).is_file());

    // Refusals exit 2 and name the field; no daemon exits 3.
    fs::write(
        cwd.join("bad.toml"),
        fs::read_to_string(&file).unwrap().replace("group_size = 4", "group_size = 1"),
    )
    .unwrap();
    let bad = run(&rlvrctl, &["submit", "bad.toml"], cwd, &env);
    assert_eq!(bad.status.code(), Some(2), "{}", text(&bad));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("optimizer.group_size"), "{}", text(&bad));
    let nowhere = [("RLVR_SERVER", "http://127.0.0.1:9"), ("RLVR_TOKEN", TEAM_TOKEN)];
    let unreachable = run(&rlvrctl, &["status", &id], cwd, &nowhere);
    assert_eq!(unreachable.status.code(), Some(3), "{}", text(&unreachable));
}

// The attacker's variations through rlvrctl: a spec's data paths are the submitter's own files,
// read on its side and uploaded as its team's datasets; the daemon never receives a path.
#[test]
fn rlvrctl_sends_no_path_a_spec_writes_and_refuses_what_is_not_a_readable_file() {
    let redis = Redis::start();
    let daemon = Daemon::start_with(&PLUGINS, &redis.url(), QUEUE);
    let dir = tempfile::tempdir().unwrap();
    let cwd = dir.path();
    let rlvrctl = artifact("rlvrctl");
    let env = [("RLVR_SERVER", daemon.url.as_str()), ("RLVR_TOKEN", TEAM_TOKEN)];
    let good = fs::read_to_string(job_file(cwd, "variant", 2)).unwrap();
    // (train as written, words of the refusal)
    let cases = [
        ("../elsewhere/train.jsonl", "data.train: cannot read"),
        ("/nonexistent/train.jsonl", "data.train: cannot read"),
        ("data", "not a regular file"),
        // regression: a device was read until memory ran out
        ("/dev/zero", "not a regular file"),
        ("dataset:../train", "data.train"),
        ("root:../etc/passwd", "data.train"),
    ];
    for (train, words) in cases {
        fs::write(cwd.join("variant.toml"), good.replace("\"data/train.jsonl\"", &format!("{train:?}")))
            .unwrap();
        let mut child = command(&rlvrctl, &["submit", "variant.toml"], cwd, &env)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let ended = wait_until(Duration::from_secs(30), || child.try_wait().unwrap().is_some());
        if !ended {
            child.kill().unwrap();
        }
        let output = child.wait_with_output().unwrap();
        assert!(ended, "{train}: rlvrctl did not return\n{}", text(&output));
        assert_eq!(output.status.code(), Some(2), "{train}: {}", text(&output));
        assert!(String::from_utf8_lossy(&output.stderr).contains(words), "{train}: {}", text(&output));
    }
    // Nothing was queued; only the spec's own heldout file (read before train failed, or not)
    // may have become a dataset.
    let list = json(&run(&rlvrctl, &["--json", "list"], cwd, &env));
    assert_eq!(list["jobs"].as_array().map(Vec::len), Some(0), "{list}");
    let datasets = json(&run(&rlvrctl, &["--json", "dataset", "list"], cwd, &env));
    for dataset in datasets["datasets"].as_array().unwrap() {
        assert_eq!(dataset["name"], "heldout", "{datasets}");
    }
}

#[test]
fn the_python_example_submits_a_toml_job_and_follows_it_to_published() {
    let redis = Redis::start();
    let daemon = Daemon::start_with(&PLUGINS, &redis.url(), QUEUE);
    let dir = tempfile::tempdir().unwrap();
    let cwd = dir.path();
    job_file(cwd, "by-python", 6);
    // The venv's interpreter when setup.sh made one (CI), else the system's.
    let python =
        std::env::var_os("PYTHON_SYS_EXECUTABLE").map_or_else(|| PathBuf::from("python3"), PathBuf::from);
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/python/submit_job.py");
    let env = [("RLVR_SERVER", daemon.url.as_str()), ("RLVR_TOKEN", TEAM_TOKEN)];

    let output = run(&python, &[example.to_str().unwrap(), "by-python.toml"], cwd, &env);
    assert_eq!(output.status.code(), Some(0), "{}\n{}", text(&output), daemon.log());
    let stdout = String::from_utf8_lossy(&output.stdout);
    let id = stdout.lines().next().unwrap().trim();
    assert!(stdout.contains("published"), "{}", text(&output));
    let published = daemon.state.join("registry/tiny-arith/1/manifest.json");
    let manifest: Value = serde_json::from_slice(&fs::read(published).unwrap()).unwrap();
    assert_eq!(manifest["job_id"], id, "the example's job is the one published");

    // A refused spec: exit 2 with the field.
    let bad = fs::read_to_string(cwd.join("by-python.toml")).unwrap().replace("lr = 1e-3", "lr = -1.0");
    fs::write(cwd.join("bad.toml"), bad).unwrap();
    let refused = run(&python, &[example.to_str().unwrap(), "bad.toml"], cwd, &env);
    assert_eq!(refused.status.code(), Some(2), "{}", text(&refused));
    assert!(String::from_utf8_lossy(&refused.stderr).contains("optimizer.lr"), "{}", text(&refused));
}
