//! The tenancy boundary under `rlvrd serve` (issue 17, SECURITY.md): team `others` attacks team
//! `tests` through the API as an outside team would — another team's data, model lines,
//! registry, priorities, curricula, the daemon's environment — and each attempt is a 4xx naming
//! the field, with nothing read, queued or written, and the victim's line intact.

use std::fs;
use std::path::Path;
use std::time::Duration;

use rlvr_client::HttpError;
use rlvr_protocol::api::ModelLineUpdate;
use rlvr_protocol::job::JobState;
use rlvr_tests::jobs::{api, ended, get, submit, submit_ok, wait_job, worker_pids};
use rlvr_tests::peer::Peer;
use rlvr_tests::{
    ADMIN_TOKEN, Daemon, OTHER_TOKEN, OUTBOUND_LOOPBACK, PERMISSIVE_GATES, Redis, TEAM_TOKEN, arith_data,
    arith_grpo_spec, wait_until,
};
use serde_json::Value;

const PLUGINS: [&str; 2] = ["rlvr-optimizer-grpo", "rlvr-verifier-math"];

/// A data root granted to `tests` only, a queue limit of 3 for `others`.
fn config(root: &Path) -> String {
    format!(
        "[queue]\nworker_threads = 1\n\
         [[tenancy.data_roots]]\nname = \"tests-data\"\npath = {root:?}\nteams = [\"tests\"]\n\
         [[tenancy.teams]]\nname = \"others\"\nmax_queued = 3\n\
         [devices]\ncpu_slots = 1\ncpu_slot_memory_gb = 8\n",
        root = root.display().to_string()
    )
}

/// A job of team `team` on `data` (paths, uploaded by the harness), publishing to `line`, on the
/// whole 8 GB slot (left out, each job would get its estimate, and the jobs would share the slot
/// instead of queueing).
fn job(data: &Path, name: &str, team: &str, line: &str, steps: u32) -> String {
    arith_grpo_spec(data, name, "builtin:tiny-arith", steps, 5)
        .replace("team = \"tests\"", &format!("team = \"{team}\""))
        .replace("model_line = \"tiny-arith\"", &format!("model_line = \"{line}\""))
        + PERMISSIVE_GATES
        + "[resources]\nmemory_gb = 8\n"
}

/// Submits as `others` and expects a refusal of `status` naming `field`, with `words` in it.
fn refused(daemon: &Daemon, toml: &str, status: u16, field: &str, words: &str) {
    let (got, body) = submit(daemon, OTHER_TOKEN, toml, None);
    assert_eq!(got, status, "{body}");
    assert_eq!(body["error"]["field"], field, "{body}");
    let message = body["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains(words), "{message:?} lacks {words:?}");
}

fn jobs_of(daemon: &Daemon, token: &str) -> usize {
    get(daemon, token, "/v1/jobs").1["jobs"].as_array().map_or(0, Vec::len)
}

#[test]
fn another_teams_data_lines_registry_and_priorities_are_out_of_reach() {
    let redis = Redis::start();
    let root = tempfile::tempdir().unwrap();
    let daemon = Daemon::start_with(&PLUGINS, &redis.url(), &config(root.path()));
    let dir = tempfile::tempdir().unwrap();
    let data = arith_data(dir.path(), &[]);
    // The victim's data: a root of its own, an uploaded dataset, a published line.
    fs::copy(data.join("train.jsonl"), root.path().join("train.jsonl")).unwrap();
    std::os::unix::fs::symlink("/etc/passwd", root.path().join("escape.jsonl")).unwrap();
    let victim = api(&daemon, Some(TEAM_TOKEN));
    victim.put_dataset("secret-train", &fs::read(data.join("train.jsonl")).unwrap()).unwrap();
    let first = submit_ok(&daemon, &job(&data, "victim", "tests", "tiny-arith", 2));
    assert_eq!(wait_job(&daemon, &first, Duration::from_secs(120), ended).state, JobState::Published);
    let line = daemon.state.join("registry/tiny-arith");
    let before: Vec<_> = fs::read_dir(&line).unwrap().flatten().map(|e| e.file_name()).collect();

    let ours = job(&data, "attack", "others", "others-line", 2);
    let train = format!("{}/train.jsonl", data.display());
    let with_train = |to: &str| ours.replace(&format!("train = {train:?}"), &format!("train = {to:?}"));
    // regression: one team trained on another team's train.jsonl by its absolute path
    refused(&daemon, &with_train("/srv/tests/train.jsonl"), 422, "data.train", "cannot name a server path");
    refused(&daemon, &with_train("/proc/self/environ"), 422, "data.train", "cannot name a server path");
    refused(&daemon, &with_train("../tests/train.jsonl"), 422, "data.train", "cannot name a server path");
    // Another team's dataset by name, pinned or not, and another team's data root.
    refused(&daemon, &with_train("dataset:secret-train"), 422, "data.train", "no dataset");
    refused(&daemon, &with_train("root:tests-data/train.jsonl"), 422, "data.train", "no data root");
    refused(&daemon, &with_train("root:tests-data/../x"), 422, "data.train", "relative path");
    // regression: model.policy accepted another team's published checkpoint
    let policy = |to: &str| ours.replace("policy = \"builtin:tiny-arith\"", &format!("policy = {to:?}"));
    refused(&daemon, &policy(&line.join("1").display().to_string()), 422, "model.policy", "server path");
    refused(&daemon, &policy("line:tiny-arith@1"), 422, "model.policy", "no model line");
    refused(&daemon, &policy("base:anything"), 422, "model.policy", "no base model");
    // A name that is a path, wherever a name goes.
    refused(&daemon, &policy("line:../tiny-arith"), 422, "model.policy", "model line name");
    refused(&daemon, &policy("base:../../etc"), 422, "model.policy", "base model name");
    let reference = ours.replace(
        "policy = \"builtin:tiny-arith\"",
        "policy = \"builtin:tiny-arith\"\nreference = \"/srv/tests/checkpoint\"",
    );
    refused(&daemon, &reference, 422, "model.reference", "server path");
    // regression: one team published into another team's line, once with heldout_gain_min = -1
    let into_victims = ours.replace("model_line = \"others-line\"", "model_line = \"tiny-arith\"");
    refused(&daemon, &into_victims, 403, "job.model_line", "belongs to another team");
    // regression: publish.registry was any absolute path (registry = "/etc", model_line = "cron.d")
    let registry = ours.replace("model_line = \"others-line\"", "model_line = \"cron.d\"")
        + "[publish]\nregistry = \"/etc\"\n";
    refused(&daemon, &registry, 400, "publish.registry", "unknown field");
    refused(
        &daemon,
        &ours.replace("model_line = \"others-line\"", "model_line = \"../x\""),
        422,
        "job.model_line",
        "",
    );
    // regression: any team preempted any other by writing priority = "high"
    let high = ours.replace("seed = 7", "seed = 7\npriority = \"high\"");
    refused(&daemon, &high, 403, "job.priority", "may use priorities low, normal");
    // The victim's own root works for the victim, and a link out of it does not.
    let (status, body) = submit(
        &daemon,
        TEAM_TOKEN,
        &job(&data, "escape", "tests", "tiny-arith", 2)
            .replace(&format!("train = {train:?}"), "train = \"root:tests-data/escape.jsonl\""),
        None,
    );
    assert_eq!((status, body["error"]["field"].as_str()), (422, Some("data.train")), "{body}");
    assert!(body["error"]["message"].as_str().unwrap().contains("outside the data root"), "{body}");

    // Nothing was queued for the attacker, nothing published, nothing read into its namespace.
    assert_eq!(jobs_of(&daemon, OTHER_TOKEN), 0);
    let after: Vec<_> = fs::read_dir(&line).unwrap().flatten().map(|e| e.file_name()).collect();
    assert_eq!(after, before, "the victim's line is as it was");
    let attacker = api(&daemon, Some(OTHER_TOKEN));
    // Its own uploads (the harness uploads the files its specs name) are all it has.
    let names: Vec<String> = attacker.datasets().unwrap().datasets.into_iter().map(|d| d.name).collect();
    assert!(names.iter().all(|name| name == "train" || name == "heldout"), "{names:?}");
    assert!(
        matches!(attacker.model_line("tiny-arith"), Err(HttpError::Status { status, .. }) if status == 404)
    );
    assert!(attacker.model_lines().unwrap().lines.is_empty());
    let change = ModelLineUpdate { publishers: Some(vec!["others".into()]), ..ModelLineUpdate::default() };
    assert!(
        matches!(attacker.put_model_line("tiny-arith", &change), Err(HttpError::Status { status, .. }) if status == 404)
    );
    assert!(
        matches!(attacker.delete_dataset("secret-train"), Err(HttpError::Status { status, .. }) if status == 404)
    );
    for name in ["../tests/secret-train", "tests/secret-train", ".hidden"] {
        let put = attacker.put_dataset(name, b"{}\n");
        assert!(matches!(put, Err(HttpError::Status { status, .. }) if status == 400), "{name}: {put:?}");
    }
    assert!(
        victim.datasets().unwrap().datasets.iter().any(|d| d.name == "secret-train"),
        "the victim's dataset is intact"
    );

    // The owner's gate policy is a floor its own jobs may tighten, never loosen.
    let floor = ModelLineUpdate {
        policy: Some(serde_json::from_value(serde_json::json!({"heldout_gain_min": 0.0})).unwrap()),
        ..ModelLineUpdate::default()
    };
    victim.put_model_line("tiny-arith", &floor).unwrap();
    let (status, body) = submit(&daemon, TEAM_TOKEN, &job(&data, "loose", "tests", "tiny-arith", 2), None);
    assert_eq!((status, body["error"]["field"].as_str()), (422, Some("gates.heldout_gain_min")), "{body}");
    // A reader may start from the line's versions, and still not publish into it.
    let grant = ModelLineUpdate { readers: Some(vec!["others".into()]), ..ModelLineUpdate::default() };
    victim.put_model_line("tiny-arith", &grant).unwrap();
    let from_victims = submit_ok_as(&daemon, OTHER_TOKEN, &policy("line:tiny-arith@1"));
    assert_eq!(wait_job(&daemon, &from_victims, Duration::from_secs(120), ended).state, JobState::Published);
    refused(&daemon, &into_victims, 403, "job.model_line", "belongs to another team");
    // An admin hands the line over; the old owner is then a stranger to it.
    let handover =
        ModelLineUpdate { owner: Some("others".into()), readers: Some(vec![]), ..ModelLineUpdate::default() };
    assert!(victim.put_model_line("tiny-arith", &handover).is_err());
    api(&daemon, Some(ADMIN_TOKEN)).put_model_line("tiny-arith", &handover).unwrap();
    assert_eq!(attacker.model_line("tiny-arith").unwrap().owner, "others");
}

fn submit_ok_as(daemon: &Daemon, token: &str, toml: &str) -> String {
    let (status, body) = submit(daemon, token, toml, None);
    assert_eq!(status, 201, "{body}\n{}", daemon.log());
    body["id"].as_str().unwrap().to_owned()
}

#[test]
fn a_workers_environment_holds_none_of_the_daemons_secrets_and_a_team_queue_is_bounded() {
    let redis = Redis::start();
    let root = tempfile::tempdir().unwrap();
    let daemon = Daemon::start_with(&PLUGINS, &redis.url(), &config(root.path()));
    let dir = tempfile::tempdir().unwrap();
    let data = arith_data(dir.path(), &[]);
    let long = submit_ok_as(&daemon, OTHER_TOKEN, &job(&data, "long", "others", "others-line", 100_000));
    assert!(wait_until(Duration::from_secs(60), || !worker_pids(&long).is_empty()), "{}", daemon.log());
    // regression: the worker inherited the daemon's whole environment (another team's verifier
    // token among it): the daemon's environment here holds cargo's CARGO_* variables.
    let pid = worker_pids(&long)[0];
    let environ = fs::read(format!("/proc/{pid}/environ")).unwrap();
    let names: Vec<String> = environ
        .split(|b| *b == 0)
        .filter_map(|entry| std::str::from_utf8(entry).ok()?.split_once('=').map(|(name, _)| name.to_owned()))
        .collect();
    assert!(std::env::vars().any(|(name, _)| name.starts_with("CARGO_")), "the daemon had CARGO_* to leak");
    assert!(!names.iter().any(|name| name.starts_with("CARGO_") || name.starts_with("RLVR__")), "{names:?}");
    assert!(names.iter().any(|name| name == "PATH"), "{names:?}");

    // At most 3 of `others`' jobs wait (one runs; this daemon has one slot).
    let mut waiting = 0;
    let refusal = loop {
        let (status, body) =
            submit(&daemon, OTHER_TOKEN, &job(&data, "more", "others", "others-line", 2), None);
        if status != 201 {
            break (status, body);
        }
        waiting += 1;
        assert!(waiting <= 3, "more than 3 jobs waiting");
    };
    assert_eq!(waiting, 3);
    assert_eq!(refusal.0, 429, "{}", refusal.1);
    assert_eq!(refusal.1["error"]["code"], "queue_full");
    // Another team's queue is its own.
    submit_ok_as(&daemon, TEAM_TOKEN, &job(&data, "mine", "tests", "tiny-arith", 2));
    api(&daemon, Some(OTHER_TOKEN)).cancel(&long).unwrap();
}

#[test]
fn curricula_are_each_teams_own() {
    let redis = Redis::start();
    let root = tempfile::tempdir().unwrap();
    let daemon = Daemon::start_with(&PLUGINS, &redis.url(), &config(root.path()));
    // regression: one team used up another's daily refresh of a curriculum of the same name
    let ours = api(&daemon, Some(TEAM_TOKEN)).curriculum_refresh("arith").unwrap();
    let theirs = api(&daemon, Some(OTHER_TOKEN)).curriculum_refresh("arith").unwrap();
    assert!(ours.ran && theirs.ran, "{ours:?} {theirs:?}");
    assert_eq!((ours.version, theirs.version), (Some(1), Some(1)));
    assert!(daemon.state.join("curricula/tests/arith/1.json").is_file());
    assert!(daemon.state.join("curricula/others/arith/1.json").is_file());
    let again: Value =
        serde_json::to_value(api(&daemon, Some(TEAM_TOKEN)).curriculum_refresh("arith").unwrap()).unwrap();
    assert_eq!(again["ran"], false);
}

#[test]
fn a_curriculum_is_shared_only_by_its_owners_grant_and_its_readers_never_feed_it() {
    let redis = Redis::start();
    let dir = tempfile::tempdir().unwrap();
    let plugins = ["rlvr-optimizer-grpo", "rlvr-verifier-math", "rlvr-curriculum-frontier"];
    let daemon = Daemon::start_with(&plugins, &redis.url(), "[queue]\nworker_threads = 1\n");
    let data = arith_data(dir.path(), &[]);
    let (owner, reader) = (api(&daemon, Some(TEAM_TOKEN)), api(&daemon, Some(OTHER_TOKEN)));
    let with_curriculum = |toml: String, name: &str| {
        toml + &format!("\n[curriculum]\nplugin = \"frontier\"\nname = {name:?}\n")
    };
    let starting_from = |name: &str| with_curriculum(job(&data, "curious", "others", "others-line", 2), name);
    // Not shared, and not there, read the same; a path is no name.
    refused(
        &daemon,
        &starting_from("tests/arith"),
        422,
        "curriculum.name",
        "no curriculum tests/arith is shared",
    );
    refused(
        &daemon,
        &starting_from("tests/nope"),
        422,
        "curriculum.name",
        "no curriculum tests/nope is shared",
    );
    refused(&daemon, &starting_from("../tests/arith"), 422, "curriculum.name", "TEAM/NAME");
    assert!(reader.curricula().unwrap().curricula.iter().all(|c| c.owner != "tests"));
    // Only the owner's token shares its own (another team's PUT makes its own curriculum).
    let bad = owner.share_curriculum("arith", &["others".into(), "Not A Team".into()]).unwrap_err();
    assert!(bad.to_string().contains("readers[1]"), "{bad}");
    // Shared before its first version.
    assert_eq!(owner.share_curriculum("arith", &["others".into()]).unwrap().readers, ["others"]);
    let seen = reader.curricula().unwrap().curricula;
    let shared = seen.iter().find(|c| c.owner == "tests" && c.name == "arith").expect("shared with others");
    assert_eq!((shared.latest_version, shared.readers.len()), (None, 0), "readers are the owner's to see");

    // The owner's job and the reader's both start from it ...
    let own = submit_ok_as(
        &daemon,
        TEAM_TOKEN,
        &with_curriculum(job(&data, "own", "tests", "tiny-arith", 2), "arith"),
    );
    let read = submit_ok_as(&daemon, OTHER_TOKEN, &starting_from("tests/arith"));
    for id in [&own, &read] {
        let done = wait_job(&daemon, id, Duration::from_secs(120), ended);
        assert_eq!((done.state, done.curriculum_version), (JobState::Published, Some(0)), "{done}");
    }
    // ... and only the owner's feeds it; the reader's feeds its own of the same name neither.
    let refreshed = owner.curriculum_refresh("arith").unwrap();
    assert!(refreshed.records.unwrap() > 0, "{refreshed:?}");
    let version: Value =
        serde_json::from_slice(&fs::read(daemon.state.join("curricula/tests/arith/1.json")).unwrap())
            .unwrap();
    let fed_by: Vec<&str> =
        version["records"]["jobs"].as_array().unwrap().iter().map(|j| j["job"].as_str().unwrap()).collect();
    assert_eq!(fed_by, [own.as_str()], "{version}");
    assert_eq!(reader.curriculum_refresh("arith").unwrap().records, Some(0));

    // Taken back: refused again.
    assert!(owner.share_curriculum("arith", &[]).unwrap().readers.is_empty());
    refused(
        &daemon,
        &starting_from("tests/arith"),
        422,
        "curriculum.name",
        "no curriculum tests/arith is shared",
    );
}

#[test]
fn a_secret_reaches_only_its_teams_grader_by_name_and_graders_only_allowed_destinations() {
    let redis = Redis::start();
    let dir = tempfile::tempdir().unwrap();
    let secret_file = dir.path().join("grader-token");
    fs::write(&secret_file, "s3cret-grader-value\n").unwrap();
    let config = format!(
        "[queue]\nworker_threads = 1\n{OUTBOUND_LOOPBACK}\
         [[tenancy.secrets]]\nname = \"grader-token\"\nteams = [\"tests\"]\nfile = {file:?}\n",
        file = secret_file.display().to_string()
    );
    let daemon = Daemon::start_with(&["rlvr-optimizer-grpo", "rlvr-verifier-http"], &redis.url(), &config);
    let data = arith_data(dir.path(), &[]);
    let grader = Peer::ok(r#"{"score": 1, "passed": true}"#);
    let url = grader.url("/grade");
    let seen = || {
        grader
            .received()
            .iter()
            .map(|r| r.header("authorization").unwrap_or("").to_owned())
            .collect::<Vec<_>>()
    };
    let with_grader = |team: &str, line: &str, url: &str| {
        job(&data, "graded", team, line, 2).replace(
            "[[verifiers]]\nplugin = \"math\"\nfallback = \"last\"",
            &format!(
                "[[verifiers]]\nplugin = \"http\"\nurl = {url:?}\nbearer_token_secret = \"grader-token\""
            ),
        )
    };
    // regression: one team's spec sent another team's verifier token to a server of its choosing
    refused(
        &daemon,
        &with_grader("others", "others-line", &url),
        422,
        "verifiers[0].bearer_token_secret",
        "no secret",
    );
    // regression: the http verifier posted to any url a spec named
    let (status, body) =
        submit(&daemon, TEAM_TOKEN, &with_grader("tests", "graded", "http://169.254.169.254/latest/"), None);
    assert_eq!((status, body["error"]["field"].as_str()), (422, Some("verifiers[0].url")), "{body}");
    let env = with_grader("tests", "graded", &url)
        .replace("bearer_token_secret = \"grader-token\"", "bearer_token_env = \"PATH\"");
    let (status, body) = submit(&daemon, TEAM_TOKEN, &env, None);
    assert_eq!(
        (status, body["error"]["field"].as_str()),
        (422, Some("verifiers[0].bearer_token_env")),
        "{body}"
    );
    assert!(seen().is_empty(), "nothing reached the grader");

    // The owner's job: its grader gets the token, handed to the worker on its standard input only.
    let id = submit_ok_as(&daemon, TEAM_TOKEN, &with_grader("tests", "graded", &url));
    let done = wait_job(&daemon, &id, Duration::from_secs(120), ended);
    assert_eq!(done.state, JobState::Published, "{done}\n{}", daemon.log());
    let received = seen();
    assert!(
        !received.is_empty() && received.iter().all(|auth| auth == "Bearer s3cret-grader-value"),
        "{received:?}"
    );
    for file in walk(&daemon.state.join(format!("jobs/{id}"))) {
        let text = fs::read(&file).unwrap_or_default();
        assert!(
            !String::from_utf8_lossy(&text).contains("s3cret-grader-value"),
            "{} holds the secret",
            file.display()
        );
    }
    assert!(!daemon.log().contains("s3cret-grader-value"));
}

/// Every file under `dir`.
fn walk(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut files = Vec::new();
    for entry in fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if path.is_dir() { files.extend(walk(&path)) } else { files.push(path) }
    }
    files
}
