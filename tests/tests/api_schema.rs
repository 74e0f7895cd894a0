//! The HTTP API against its own OpenAPI document: Schemathesis (installed by `scripts/setup.sh`
//! into its own venv) reads `/v1/openapi.json` from a real daemon, with real Redis and the real
//! plugins, and sends every route generated requests with team `tests`' token, then with an
//! admin's — valid ones, invalid ones, none at all, and sequences that follow one answer's ids
//! into the next request. Every answer must be no 5xx, of a documented status and content type,
//! with the documented headers and a body that matches the documented schema.
//!
//! Bounded and repeatable: at most `MAX_EXAMPLES` cases per operation and phase (fewer as an
//! admin), generated deterministically (the same requests on every run), one request at a time,
//! and each run killed and failed past `WALL_CLOCK`. A missing Schemathesis fails the test, naming `scripts/setup.sh`.
//!
//! What it found, each guarded by a test of its own as well (the second test here, and
//! `daemon/src/api/mod.rs`): 429 and 400 answers the document did not list, and an event stream
//! documented as bare `JobEvent`s.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use rlvr_protocol::job::{JobEvent, JobState, JobView};
use rlvr_tests::jobs::{client, ended, get, submit_ok, wait_job};
use rlvr_tests::{
    ADMIN_TOKEN, Daemon, PERMISSIVE_GATES, Redis, TEAM_TOKEN, arith_data, arith_grpo_spec, workspace_root,
};
use serde_json::Value;

const PLUGINS: [&str; 3] = ["rlvr-optimizer-grpo", "rlvr-verifier-math", "rlvr-curriculum-frontier"];
/// The checks every answer must pass (Schemathesis' names).
const CHECKS: &str = "not_a_server_error,status_code_conformance,content_type_conformance,\
                      response_headers_conformance,response_schema_conformance";
/// Generated cases per operation and phase, as team `tests`.
const MAX_EXAMPLES: u32 = 100;
/// As an admin: what differs for an admin is whose records a route shows and the promotion, which
/// the coverage phase, the stateful phase and the known ids reach; the random bulk of the fuzzing
/// phase is the team pass's. Schemathesis takes one core for the whole run (about 13 ms a case,
/// ~6,000 cases a pass at 100), the suite's largest single consumer of CPU.
const ADMIN_MAX_EXAMPLES: u32 = 25;
/// The longest one Schemathesis run may take: a bound for a hang, not a speed check. About 25 s on
/// 2 idle cores; its coverage phase alone took 100 s on a clean clone's suite with other tests
/// and builds beside it, past the 120 s this once was. Under nextest's 15-minute kill.
const WALL_CLOCK: Duration = Duration::from_secs(600);

/// The Schemathesis CLI `scripts/setup.sh` installs (`RLVR_SCHEMATHESIS` in its env file).
fn schemathesis() -> PathBuf {
    let path = std::env::var_os("RLVR_SCHEMATHESIS").map(PathBuf::from).unwrap_or_else(|| {
        let cache = std::env::var_os("RLVR_CACHE_DIR").map(PathBuf::from).unwrap_or_else(|| {
            let home = std::env::var_os("HOME").map(PathBuf::from).unwrap_or_default();
            home.join(".cache/rlvr")
        });
        cache.join("venvs/schemathesis/bin/st")
    });
    assert!(
        path.is_file(),
        "{} is missing: run scripts/setup.sh (it installs Schemathesis into its own venv; \
         scripts/test.sh runs it first)",
        path.display()
    );
    path
}

/// The names Schemathesis may put into `{id}` and `{name}` (half of the time; it invents the
/// rest), so that the routes behind them see things that exist: the jobs that ran, their model
/// line, the team's datasets.
fn config(dir: &Path, job_ids: &[String], names: &[String]) -> PathBuf {
    let quoted = |values: &[String]| values.iter().map(|v| format!("{v:?}")).collect::<Vec<_>>().join(", ");
    let text = format!(
        "[dictionaries.jobs]\nvalues = [{jobs}]\n\
         [dictionaries.names]\nvalues = [{names}]\n\
         [parameters]\n\
         \"path.id\" = {{ dictionary = \"jobs\", probability = 0.5 }}\n\
         \"path.name\" = {{ dictionary = \"names\", probability = 0.5 }}\n",
        jobs = quoted(job_ids),
        names = quoted(names),
    );
    let path = dir.join("schemathesis.toml");
    fs::write(&path, text).expect("write the Schemathesis config");
    path
}

#[test]
fn every_route_answers_as_the_openapi_document_says_under_generated_requests() {
    let st = schemathesis();
    let redis = Redis::start();
    // No rate limits in the way: they have tests of their own (http_hardening.rs), and here a 429
    // for most requests would leave the routes behind it unexercised (the document lists it).
    let api = "rate_limit_per_minute = 1000000\nauth_failures_per_minute = 10000\n";
    let daemon = Daemon::start_with_api(
        &PLUGINS,
        &redis.url(),
        api,
        "[queue]\nworker_threads = 1\n[tenancy]\nmax_queued_per_team = 5\n",
    );
    // Something to read: a published job (with its result, gates and metrics), a refused one for
    // an admin to promote, their model line, and the datasets they were submitted with.
    let dir = tempfile::tempdir().unwrap();
    let data = arith_data(dir.path(), &[]);
    let mut ids = Vec::new();
    for (name, gates, state) in [
        ("published", PERMISSIVE_GATES, JobState::Published),
        ("refused", "[gates]\nheldout_gain_min = 0.9\nrefuse_reward_hacking = false\n", JobState::Refused),
    ] {
        let spec = format!("{}\n{gates}", arith_grpo_spec(&data, name, "builtin:tiny-arith", 2, 1));
        let id = submit_ok(&daemon, &spec);
        let job = wait_job(&daemon, &id, Duration::from_secs(120), ended);
        let worker_log = fs::read_to_string(daemon.state.join("jobs").join(&id).join("worker.log"));
        assert_eq!(job.state, state, "{job}\nworker log: {worker_log:?}");
        ids.push(id);
    }
    let (status, datasets) = get(&daemon, TEAM_TOKEN, "/v1/datasets");
    assert_eq!(status, 200, "{datasets}");
    let mut names: Vec<String> = datasets["datasets"]
        .as_array()
        .expect("a dataset list")
        .iter()
        .map(|dataset| dataset["name"].as_str().expect("a name").to_owned())
        .collect();
    names.push("tiny-arith".to_owned());
    let config = config(dir.path(), &ids, &names);

    // As a team, then as an admin: the routes answer an admin differently (every team's jobs,
    // a promotion that reads its body).
    for (who, token, examples) in
        [("team tests", TEAM_TOKEN, MAX_EXAMPLES), ("an admin", ADMIN_TOKEN, ADMIN_MAX_EXAMPLES)]
    {
        let started = Instant::now();
        let output = run(&st, &daemon, dir.path(), &config, token, examples).unwrap_or_else(|output| {
            panic!(
                "Schemathesis as {who} found answers that are not as /v1/openapi.json says:\n{output}\n\
                 daemon log:\n{}",
                daemon.log()
            )
        });
        println!("Schemathesis as {who} passed in {:.1?}:\n{output}", started.elapsed());
    }
}

/// Runs Schemathesis against `daemon` with `token`, at most `examples` cases per operation and
/// phase: its output, as `Err` when it failed or ran past [`WALL_CLOCK`].
fn run(
    st: &Path,
    daemon: &Daemon,
    dir: &Path,
    config: &Path,
    token: &str,
    examples: u32,
) -> Result<String, String> {
    let log = dir.join("schemathesis.log");
    let mut child = Command::new(st)
        .arg("--config-file")
        .arg(config)
        .arg("run")
        .arg(format!("{}/v1/openapi.json", daemon.url))
        .args(["--header", &format!("Authorization: Bearer {token}")])
        .args(["--checks", CHECKS])
        .args(["--max-examples", &examples.to_string()])
        // Deterministic: the same cases on every run, and no example database written.
        .arg("--generation-deterministic")
        .args(["--workers", "1"])
        .args(["--request-timeout", "10"])
        .arg("--no-color")
        // PUT /v1/datasets/{name} takes JSONL, which needs a serializer of ours.
        .env("SCHEMATHESIS_HOOKS", workspace_root().join("tests/schemathesis/hooks.py"))
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(fs::File::create(&log).expect("log file"))
        .stderr(Stdio::from(fs::File::options().append(true).open(&log).expect("log file")))
        .spawn()
        .unwrap_or_else(|error| panic!("cannot run {}: {error}", st.display()));
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for Schemathesis") {
            break Some(status);
        }
        if started.elapsed() > WALL_CLOCK {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let output = fs::read_to_string(&log).unwrap_or_default();
    match status {
        Some(status) if status.success() => Ok(output),
        Some(status) => Err(format!("{output}\n({status})")),
        None => Err(format!("{output}\n(killed: it ran past {WALL_CLOCK:?})")),
    }
}

/// The statuses `/v1/openapi.json` lists for `route` (`"GET /v1/jobs"`).
fn documented(document: &Value, route: &str) -> Vec<u16> {
    let (method, path) = route.split_once(' ').unwrap();
    let responses = document["paths"][path][method.to_lowercase()]["responses"].as_object();
    let responses = responses.unwrap_or_else(|| panic!("{route} is not in the document"));
    responses.keys().map(|status| status.parse().expect("a status")).collect()
}

// regression: the answers Schemathesis found that the document did not list — 400 for a name
// that cannot be one, 400 for a promotion whose body is not JSON, 429 past the failed
// authentications — and an event stream whose events were not the documented bare JobEvents
#[test]
fn the_answers_found_undocumented_are_in_the_document() {
    let redis = Redis::start();
    let daemon = Daemon::start_with_api(
        &PLUGINS,
        &redis.url(),
        "auth_failures_per_minute = 1\n",
        "[queue]\nworker_threads = 1\n",
    );
    let (_, document) = get(&daemon, TEAM_TOKEN, "/v1/openapi.json");
    let dir = tempfile::tempdir().unwrap();
    let data = arith_data(dir.path(), &[]);
    let spec =
        format!("{}\n{PERMISSIVE_GATES}", arith_grpo_spec(&data, "events", "builtin:tiny-arith", 2, 1));
    let id = submit_ok(&daemon, &spec);
    let http = client();
    let send = |method: &str, path: &str, token: Option<&str>| {
        let request = http.request(method.parse().unwrap(), format!("{}{path}", daemon.url));
        let request = match token {
            Some(token) => request.bearer_auth(token),
            None => request,
        };
        let response = request.send().unwrap();
        let status = response.status().as_u16();
        (status, response.text().unwrap())
    };
    let check = |route: &str, path: &str, token: Option<&str>, expected: u16, code: &str| {
        let method = route.split_once(' ').unwrap().0;
        let (status, body) = send(method, path, token);
        assert_eq!(status, expected, "{route}: {body}");
        assert!(body.contains(&format!("\"code\":\"{code}\"")), "{route}: {body}");
        assert!(documented(&document, route).contains(&status), "{route} answers {status}, undocumented");
    };
    check("GET /v1/datasets/{name}", "/v1/datasets/%C3%9A", Some(TEAM_TOKEN), 400, "invalid_name");
    check("DELETE /v1/datasets/{name}", "/v1/datasets/%C3%9A", Some(TEAM_TOKEN), 400, "invalid_name");
    check("GET /v1/model-lines/{name}", "/v1/model-lines/%C3%9A", Some(TEAM_TOKEN), 400, "invalid_name");
    let promote = format!("/v1/jobs/{id}/promote");
    check("POST /v1/jobs/{id}/promote", &promote, Some(ADMIN_TOKEN), 400, "bad_request");
    check("GET /v1/model-lines", "/v1/model-lines", None, 401, "unauthorized");
    check("GET /v1/model-lines", "/v1/model-lines", None, 429, "too_many_failures");

    // Each event as the document describes it: `event`, `id` (required of a state) and `data`,
    // the JSON of the schema its `contentSchema` names.
    wait_job(&daemon, &id, Duration::from_secs(120), ended);
    let (status, stream) = send("GET", &format!("/v1/jobs/{id}/events"), Some(TEAM_TOKEN));
    assert_eq!(status, 200, "{stream}");
    let kinds = document["components"]["schemas"]["StreamEvent"]["oneOf"].as_array().expect("event kinds");
    let mut states = Vec::new();
    for block in stream.split("\n\n").filter(|block| block.contains("data:")) {
        let field = |name: &str| {
            block.lines().find_map(|line| line.strip_prefix(&format!("{name}:")).map(str::trim_start))
        };
        let event = field("event").expect("an event name");
        let kind = kinds.iter().find(|kind| kind["properties"]["event"]["enum"][0] == event);
        let kind = kind.unwrap_or_else(|| panic!("event {event:?} is not documented: {block}"));
        for required in kind["required"].as_array().unwrap() {
            assert!(field(required.as_str().unwrap()).is_some(), "{event} lacks {required}: {block}");
        }
        let data = field("data").unwrap();
        match kind["properties"]["data"]["contentSchema"]["$ref"].as_str().unwrap() {
            "#/components/schemas/JobEvent" => {
                let state: JobEvent = serde_json::from_str(data).expect("a JobEvent");
                assert_eq!(Some(state.id.as_str()), field("id"));
                states.push(state.state.to_string());
            }
            "#/components/schemas/JobView" => {
                serde_json::from_str::<JobView>(data).expect("a JobView");
            }
            other => panic!("{other}"),
        }
    }
    assert_eq!(states.last().map(String::as_str), Some("published"), "{stream}");
}
