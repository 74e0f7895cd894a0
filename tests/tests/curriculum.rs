//! Shared curricula under `rlvrd serve` (issue 7): the nightly refresh runs once per curriculum
//! and day however many ask at once, writes version N+1 from the rollout records of the jobs
//! naming the curriculum, and jobs pin the version that was current at their admission.

use std::fs;
use std::path::Path;
use std::time::Duration;

use rlvr_protocol::job::JobState;
use rlvr_tests::cli::{command, run, text};
use rlvr_tests::jobs::{ended, submit_ok, wait_job};
use rlvr_tests::{Daemon, PERMISSIVE_GATES, Redis, TEAM_TOKEN, arith_data, arith_grpo_spec, artifact};
use serde_json::Value;

const PLUGINS: [&str; 3] = ["rlvr-optimizer-grpo", "rlvr-verifier-math", "rlvr-curriculum-frontier"];
const QUEUE: &str = "[queue]\nworker_threads = 1\n";

fn spec(data: &Path, name: &str) -> String {
    let base = arith_grpo_spec(data, name, "builtin:tiny-arith", 5, 5);
    format!("{base}\n{PERMISSIVE_GATES}[curriculum]\nplugin = \"frontier\"\nname = \"arith\"\n")
}

#[test]
fn a_refresh_asked_twice_the_same_day_runs_once_and_later_jobs_pin_its_version() {
    let redis = Redis::start();
    let daemon = Daemon::start_with(&PLUGINS, &redis.url(), QUEUE);
    let dir = tempfile::tempdir().unwrap();
    let data = arith_data(dir.path(), &[]);
    let rlvrctl = artifact("rlvrctl");
    let env = [("RLVR_SERVER", daemon.url.as_str()), ("RLVR_TOKEN", TEAM_TOKEN)];

    // Before any refresh: the job runs from the plugin's prior and records version 0.
    let first = submit_ok(&daemon, &spec(&data, "first"));
    let done = wait_job(&daemon, &first, Duration::from_secs(180), ended);
    assert_eq!(done.state, JobState::Published, "{done}");
    assert_eq!(done.curriculum_version, Some(0));
    let rollouts =
        fs::read_to_string(daemon.state.join("jobs").join(&first).join("run/rollouts.jsonl")).unwrap();
    let records = rollouts.lines().count();
    assert!(records > 0);

    // Two timers at once: one refresh runs, the other is told about it.
    let asks: Vec<_> = (0..2)
        .map(|_| {
            command(&rlvrctl, &["--json", "curriculum", "refresh", "arith"], dir.path(), &env)
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let answers: Vec<Value> = asks
        .into_iter()
        .map(|child| {
            let output = child.wait_with_output().unwrap();
            assert_eq!(output.status.code(), Some(0), "{}", text(&output));
            serde_json::from_slice(&output.stdout).unwrap()
        })
        .collect();
    let ran: Vec<&Value> = answers.iter().filter(|a| a["ran"] == true).collect();
    assert_eq!(ran.len(), 1, "exactly one ran: {answers:?}");
    assert_eq!(ran[0]["version"], 1);
    assert_eq!(ran[0]["records"], records, "every record of the job, once");

    // Later the same day: nothing runs; the day's version is named.
    let output = run(&rlvrctl, &["curriculum", "refresh", "arith"], dir.path(), &env);
    assert_eq!(output.status.code(), Some(0), "{}", text(&output));
    let said = String::from_utf8_lossy(&output.stdout);
    assert!(
        said.contains("curriculum arith was refreshed already on ") && said.contains(": version 1"),
        "{said}"
    );
    let versions: Vec<String> = fs::read_dir(daemon.state.join("curricula/tests/arith"))
        .unwrap()
        .flatten()
        .map(|entry| entry.file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(versions, ["1.json"], "one version, no temporary file left");
    let version: Value =
        serde_json::from_slice(&fs::read(daemon.state.join("curricula/tests/arith/1.json")).unwrap())
            .unwrap();
    assert_eq!(version["records"]["jobs"][0]["job"], first.as_str());
    assert_eq!(version["records"]["jobs"][0]["to_line"], records);

    // A job admitted now pins version 1 and starts from its counts.
    let second = submit_ok(&daemon, &spec(&data, "second"));
    let done = wait_job(&daemon, &second, Duration::from_secs(180), ended);
    assert_eq!(done.state, JobState::Published, "{done}");
    assert_eq!(done.curriculum_version, Some(1));
    let log = fs::read_to_string(daemon.state.join("jobs").join(&second).join("worker.log")).unwrap();
    assert!(log.contains("curriculum pinned"), "{log}");

    // A name that cannot be a curriculum is refused, naming the rule.
    let output = run(&rlvrctl, &["curriculum", "refresh", ".hidden"], dir.path(), &env);
    assert_eq!(output.status.code(), Some(2), "{}", text(&output));
    assert!(text(&output).contains("curriculum name"), "{}", text(&output));
}
