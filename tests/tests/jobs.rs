//! The job lifecycle under `rlvrd serve` with a real Redis, real plugins and real worker
//! processes: submit → run → gate → publish through the API, and every crash of issue 5 —
//! `kill -9` of the daemon, SIGTERM, Redis stopped and restarted, a poison job, cancel, and
//! malformed specs. Jobs train `builtin:tiny-arith` for a few dozen steps (tens of ms each).

use std::collections::BTreeSet;
use std::fs;
use std::path::Path;
use std::time::{Duration, Instant};

use rlvr_protocol::job::JobState;
use rlvr_protocol::kind::JobKind;
use rlvr_tests::jobs::{
    WorkerWatch, api, client, ended, get, job, job_as, state_events, states, submit, submit_ok,
    threads_taking, uninterrupted_weights, wait_job, worker_pids, workers_of,
};
use rlvr_tests::{
    ADMIN_TOKEN, Daemon, OTHER_TOKEN, PERMISSIVE_GATES, Redis, TEAM_TOKEN, arith_data, arith_grpo_spec,
    drop_in, long_sft_spec, plugin_lib, wait_until,
};
use serde_json::Value;

const PLUGINS: [&str; 2] = ["rlvr-optimizer-grpo", "rlvr-verifier-math"];
/// Fast heartbeats so a killed daemon's tasks come back within seconds; one libtorch thread so
/// results are bit-exact across runs.
const QUEUE: &str =
    "[queue]\nheartbeat_ms = 500\nmissed_heartbeats = 6\nworker_threads = 1\nmax_crashes = 3\n";

/// A GRPO job on the arithmetic data (checkpoints every 5 steps) whose gate always passes;
/// `extra` is appended (more sections).
fn spec(data: &Path, name: &str, steps: u32, extra: &str) -> String {
    let base = arith_grpo_spec(data, name, "builtin:tiny-arith", steps, 5);
    format!("{base}\n{PERMISSIVE_GATES}{extra}")
}

#[test]
fn a_job_runs_to_published_through_the_api_with_its_events_idempotency_and_team_isolation() {
    let redis = Redis::start();
    let daemon = Daemon::start_with(&PLUGINS, &redis.url(), QUEUE);
    let dir = tempfile::tempdir().unwrap();
    let data = arith_data(dir.path(), &[]);
    let toml = spec(&data, "first", 6, "");

    let (status, first) = submit(&daemon, TEAM_TOKEN, &toml, Some("retry-1"));
    assert_eq!(status, 201, "{first}");
    let id = first["id"].as_str().unwrap().to_owned();
    let (status, again) = submit(&daemon, TEAM_TOKEN, &toml, Some("retry-1"));
    assert_eq!(
        (status, again["id"].as_str(), again["created"].as_bool()),
        (200, Some(id.as_str()), Some(false))
    );
    let (status, reused) = submit(&daemon, TEAM_TOKEN, &spec(&data, "other", 6, ""), Some("retry-1"));
    assert_eq!((status, reused["error"]["code"].as_str()), (409, Some("idempotency_key_reused")), "{reused}");

    // Another team sees nothing of it; an admin sees it.
    assert_eq!(get(&daemon, OTHER_TOKEN, &format!("/v1/jobs/{id}")).0, 404);
    let response =
        client().delete(format!("{}/v1/jobs/{id}", daemon.url)).bearer_auth(OTHER_TOKEN).send().unwrap();
    assert_eq!(response.status().as_u16(), 404);
    assert_eq!(get(&daemon, OTHER_TOKEN, "/v1/jobs").1["jobs"].as_array().map(Vec::len), Some(0));
    assert_eq!(get(&daemon, ADMIN_TOKEN, &format!("/v1/jobs/{id}")).0, 200);
    assert_eq!(get(&daemon, "not-a-token", "/v1/jobs").0, 401);

    // Its spec left [resources] out: submit filled them from its memory estimate, which
    // POST /v1/estimate shows.
    let view = job_as(&daemon, TEAM_TOKEN, &id);
    // Its kind, decided at submit from its optimizer (grpo samples groups).
    assert_eq!(view.kind, Some(JobKind::OnlineGroups), "{view}");
    let (memory, resident) = (view.memory_gb, view.resident_gb.unwrap());
    assert!(0.0 < resident && resident <= memory && memory < 4.0, "{view}");
    // The spec as submit sent it: its data uploaded as the team's datasets.
    let sent = rlvr_tests::jobs::api(&daemon, Some(TEAM_TOKEN))
        .upload_spec_data(&toml, rlvr_client::SpecFormat::Toml, Path::new("/"))
        .unwrap();
    let response = client()
        .post(format!("{}/v1/estimate", daemon.url))
        .bearer_auth(TEAM_TOKEN)
        .header("content-type", "application/toml")
        .body(sent.clone())
        .send()
        .unwrap();
    let status = response.status().as_u16();
    let estimate: Value = response.json().unwrap();
    assert_eq!(status, 200, "{estimate}");
    assert_eq!(
        (estimate["memory_gb"].as_f64(), estimate["resident_gb"].as_f64()),
        (Some(memory), Some(resident))
    );
    assert_eq!(estimate["fits"], Value::Null, "{estimate}");
    let phases: Vec<&str> = estimate["estimate"]["phases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|phase| phase["phase"].as_str().unwrap())
        .collect();
    assert_eq!(phases, ["rollout", "update", "eval"]);
    // Another team's token may not ask for this team's spec.
    let response = client()
        .post(format!("{}/v1/estimate", daemon.url))
        .bearer_auth(OTHER_TOKEN)
        .header("content-type", "application/toml")
        .body(sent)
        .send()
        .unwrap();
    assert_eq!(response.status().as_u16(), 403);

    let done = wait_job(&daemon, &id, Duration::from_secs(120), ended);
    assert_eq!(done.state, JobState::Published, "{done}");
    assert_eq!(done.step, 6);
    assert_eq!(
        states(&daemon, &id),
        [JobState::Queued, JobState::Admitted, JobState::Running, JobState::Evaluating, JobState::Published]
    );
    let version = daemon.state.join("registry/tiny-arith/1");
    let manifest: Value = serde_json::from_slice(&fs::read(version.join("manifest.json")).unwrap()).unwrap();
    assert_eq!(manifest["job_id"], id.as_str());
    assert_eq!(manifest["weights_sha256"], done.weights());
    for file in ["config.json", "model.safetensors", "tokenizer.json"] {
        assert!(version.join(file).is_file(), "{file} published");
    }
    // The record keeps the server's paths (`wait_job` reads as an admin); the team reads names
    // in their place, in its job, its events and its worker's log.
    let state_dir = daemon.state.display().to_string();
    assert!(done.outcome().checkpoint.starts_with(&state_dir), "{done}");
    let seen = job_as(&daemon, TEAM_TOKEN, &id);
    let checkpoint = &seen.outcome().checkpoint;
    assert!(checkpoint.starts_with(format!("state:/jobs/{id}/run/checkpoints/")), "{seen}");
    assert_eq!(seen.published_dir(), Path::new("registry:/tiny-arith/1"), "{seen}");
    let events = client()
        .get(format!("{}/v1/jobs/{id}/events", daemon.url))
        .bearer_auth(TEAM_TOKEN)
        .send()
        .unwrap()
        .text()
        .unwrap();
    let (_, log) = get(&daemon, TEAM_TOKEN, &format!("/v1/jobs/{id}/logs"));
    let log = log["text"].as_str().unwrap();
    assert!(log.contains("path=state:/jobs/"), "{log}");
    for (what, text) in [("job", seen.to_string()), ("events", events), ("log", log.to_owned())] {
        assert!(!text.contains(&state_dir), "the team reads a server path in its {what}: {text}");
    }
    // Its metrics a window at a time: the windows, followed from each `end`, are the history.
    let team = rlvr_tests::jobs::api(&daemon, Some(TEAM_TOKEN));
    let history = team.metrics(&id).unwrap();
    assert_eq!(history.iter().filter(|line| line.is_step()).count(), 6);
    let (mut followed, mut since) = (Vec::new(), 0);
    loop {
        let window = team.metrics_window(&id, since, Some(1)).unwrap();
        assert_eq!((window.start, window.lines.len()), (since, 1), "one whole line at least");
        followed.extend(window.lines);
        since = window.end;
        if window.end == window.size {
            break;
        }
    }
    assert_eq!(followed, history);
    let too_large = client()
        .get(format!("{}/v1/jobs/{id}/metrics?bytes=999999999", daemon.url))
        .bearer_auth(TEAM_TOKEN)
        .send()
        .unwrap();
    assert_eq!(too_large.status().as_u16(), 400);
}

#[test]
fn the_openapi_document_lists_exactly_the_routes_the_daemon_serves() {
    let redis = Redis::start();
    let daemon = Daemon::start_with(&PLUGINS, &redis.url(), QUEUE);
    let (status, document) = get(&daemon, TEAM_TOKEN, "/v1/openapi.json");
    assert_eq!(status, 200);
    let mut documented = BTreeSet::new();
    for (path, methods) in document["paths"].as_object().unwrap() {
        for method in methods.as_object().unwrap().keys() {
            documented.insert(format!("{} {path}", method.to_uppercase()));
        }
    }
    // design.md §1, plus issue 7's promotion, metrics history and curriculum refresh, the
    // team's namespace (datasets and model lines), the graders' dry-run, issue 21's pipelines, and
    // issue 23's published versions (manifest and files), and issue 40's environment check.
    let routes: BTreeSet<String> = [
        "POST /v1/jobs",
        "POST /v1/estimate",
        "POST /v1/env/check",
        "GET /v1/jobs/{id}",
        "GET /v1/jobs",
        "DELETE /v1/jobs/{id}",
        "GET /v1/jobs/{id}/events",
        "GET /v1/plugins",
        "GET /healthz",
        "GET /metrics",
        "GET /v1/openapi.json",
        "POST /v1/jobs/{id}/promote",
        "GET /v1/jobs/{id}/metrics",
        "GET /v1/jobs/{id}/logs",
        "GET /v1/curricula",
        "PUT /v1/curricula/{name}",
        "POST /v1/curricula/{name}/refresh",
        "PUT /v1/datasets/{name}",
        "GET /v1/datasets/{name}",
        "DELETE /v1/datasets/{name}",
        "GET /v1/datasets",
        "GET /v1/model-lines",
        "GET /v1/model-lines/{name}",
        "PUT /v1/model-lines/{name}",
        "GET /v1/model-lines/{name}/versions/{version}",
        "GET /v1/model-lines/{name}/versions/{version}/files/{file}",
        "POST /v1/verify",
        "POST /v1/graders/validate",
        "POST /v1/pipelines",
        "GET /v1/pipelines",
        "GET /v1/pipelines/{id}",
        "DELETE /v1/pipelines/{id}",
        "GET /v1/pipelines/{id}/events",
    ]
    .map(str::to_owned)
    .into();
    assert_eq!(documented, routes);
    // Each one is served (an unknown id is 404 from the handler, in the API's error shape).
    for route in &routes {
        let (method, path) = route.split_once(' ').unwrap();
        let path = path.replace("{id}", "01ARZ3NDEKTSV4RRFFQ69G5FAV").replace("{name}", "no-such-curriculum");
        let url = format!("{}{path}", daemon.url);
        let request = match method {
            "GET" => client().get(&url),
            "POST" => client().post(&url).header("content-type", "application/json").body("{}"),
            "PUT" => client().put(&url).header("content-type", "application/json").body("{}\n"),
            _ => client().delete(&url),
        };
        let response = request.bearer_auth(TEAM_TOKEN).send().unwrap();
        let status = response.status().as_u16();
        if status == 404 {
            let body: Value = response.json().unwrap();
            assert_eq!(body["error"]["code"], "not_found", "{route}: {body}");
        } else {
            assert_ne!(status, 405, "{route}");
        }
    }
}

#[test]
fn malformed_specs_get_a_4xx_naming_the_field_and_the_daemon_carries_on() {
    let redis = Redis::start();
    let daemon = Daemon::start_with(&PLUGINS, &redis.url(), QUEUE);
    let dir = tempfile::tempdir().unwrap();
    let data = arith_data(dir.path(), &[]);
    let good = spec(&data, "good", 2, "");
    let train = fs::read(data.join("train.jsonl")).unwrap();
    api(&daemon, Some(TEAM_TOKEN)).put_dataset("train", &train).unwrap();
    // Data the job cannot read: records without `prompt` (a question under another key), and
    // held-out records with one id twice. Submit reads them as the worker would.
    let questions = dir.path().join("questions.jsonl");
    fs::write(
        &questions,
        "{\"id\": \"q1\", \"prompt\": \"1+1=\"}\n{\"id\": \"q2\", \"question\": \"2+2=\"}\n",
    )
    .unwrap();
    let twice = dir.path().join("twice.jsonl");
    fs::write(&twice, "{\"id\": \"q1\", \"prompt\": \"1+1=\"}\n{\"id\": \"q1\", \"prompt\": \"2+2=\"}\n")
        .unwrap();
    let with = |from: &str, to: &str| {
        assert!(good.contains(from), "{from}");
        good.replacen(from, to, 1)
    };
    // The rows here are what only the daemon decides: the caller's team (403), the team's
    // priority allowance, datasets and data roots in the team's namespace, server paths refused
    // by `tenancy::resolve`, the loaded plugins and their kinds and versions, what an optimizer
    // needs of the spec (its groups, its verifiers), the budget a daemon honours, the memory
    // estimate against this daemon's devices, the engine mapping and the records of its data
    // files at submit; plus three rows for the wiring of what the spec decides alone (a parse
    // error is 400, a rule is 422).
    // The rest of the spec's own rules, each with its field and message, are tables in
    // protocol/src/spec.rs's tests: `what_does_not_parse_is_refused_before_validation_naming_the_key`
    // (the 400s: type errors, unknown fields and variants, a missing section, [publish] registry),
    // `each_rule_says_its_range` (the 422 ranges of [optimizer], [rollout], [budget], [stop],
    // [gates], [resources], [checkpoint]), `names_lists_and_relations` (job.name,
    // job.model_line, verifiers[i].weight, budget.max_steps) and `errors_name_the_field`.
    // (body, status, field or "" for none, words in the message)
    let cases: Vec<(String, u16, &str, &str)> = vec![
        // The spec alone: the wiring of its 400s and 422s.
        ("[job\nname = 1".into(), 400, "", "not valid TOML"),
        (with("max_steps = 2", "max_steps = \"two\""), 400, "budget.max_steps", "invalid type"),
        // A rule of the spec is 422, on job.model_line too (403 is for a line the team may not claim).
        (
            with("model_line = \"tiny-arith\"", "model_line = \"../escape\""),
            422,
            "job.model_line",
            "expected 1–128",
        ),
        // What a daemon honours: at most 30 days of wall clock.
        (
            with("max_steps = 2", "max_steps = 2\nmax_wall_minutes = 1e9"),
            422,
            "budget.max_wall_minutes",
            "30 days",
        ),
        (with("team = \"tests\"", "team = \"others\""), 403, "job.team", "submits for team"),
        (
            with("policy = \"builtin:tiny-arith\"", "policy = \"builtin:huge\""),
            422,
            "model.policy",
            "builtin:tiny-arith",
        ),
        (
            with("policy = \"builtin:tiny-arith\"", "policy = \"/nonexistent/model\""),
            422,
            "model.policy",
            "cannot name a server path",
        ),
        (
            with(&format!("{}/train.jsonl", data.display()), "/nonexistent/train.jsonl"),
            422,
            "data.train",
            "cannot name a server path",
        ),
        (with(&format!("{}/train.jsonl", data.display()), "train.jsonl"), 422, "data.train", "server path"),
        // regression: a spec trained on another team's files by naming their absolute paths
        (
            with(&format!("{}/heldout.jsonl", data.display()), &data.display().to_string())
                .replace(&format!("{}/train.jsonl", data.display()), "dataset:train"),
            422,
            "data.heldout",
            "cannot name a server path",
        ),
        (
            with(&format!("{}/train.jsonl", data.display()), "dataset:missing"),
            422,
            "data.train",
            "no dataset",
        ),
        (
            with(&format!("{}/train.jsonl", data.display()), "root:nope/x.jsonl"),
            422,
            "data.train",
            "no data root",
        ),
        (
            with("seed = 7", "seed = 7\npriority = \"high\""),
            403,
            "job.priority",
            "may use priorities low, normal",
        ),
        (with("plugin = \"grpo\"", "plugin = \"nope\""), 422, "optimizer.plugin", "grpo@0.1.0"),
        (with("plugin = \"grpo\"", "plugin = \"math\""), 422, "optimizer.plugin", "loaded optimizer plugins"),
        (
            with("plugin = \"math\"", "plugin = \"grpo\""),
            422,
            "verifiers[0].plugin",
            "loaded verifier plugins",
        ),
        (with("plugin = \"grpo\"", "plugin = \"grpo@9.9.9\""), 422, "optimizer.plugin", "grpo@0.1.0"),
        // What the loaded optimizer needs of the spec (`rlvr_plugin_host::fit`).
        (with("group_size = 4", "group_size = 1"), 422, "optimizer.group_size", "at least 2"),
        (
            with("[[verifiers]]\nplugin = \"math\"\nfallback = \"last\"\n", ""),
            422,
            "verifiers",
            "at least one",
        ),
        // An environment's server is a destination like any other (the daemon's outbound policy
        // allows none here).
        (
            format!("{good}\n[env]\nkind = \"openenv\"\nurl = \"http://envs.example:8000\"\n"),
            422,
            "env.url",
            "not in the operator's outbound allow-list",
        ),
        (
            format!("{good}\n[env]\nkind = \"openenv\"\nenvironment = \"arith_feedback\"\n"),
            422,
            "env.environment",
            "this daemon has no installed environments (engines.environments)",
        ),
        (format!("{good}\n[resources]\nmemory_gb = 1e12\n"), 422, "resources.memory_gb", "never fit here"),
        // Left out, memory_gb is the job's estimate: 4 prompts × 1024 completions, each with a
        // KV cache of 32k tokens (2 KiB a token), is 256 GB at its rollout.
        (
            with("group_size = 4", "group_size = 1024")
                .replace("max_new_tokens = 5", "max_new_tokens = 32768"),
            422,
            "resources.memory_gb",
            "by its memory estimate (rlvrctl estimate shows the parts); 1 device(s) with ",
        ),
        // An engine job asking its engine for what it cannot do: refused at the key.
        (
            with("group_size = 4", "group_size = 4\nkl_in = \"reward\"") + "\n[engine]\nkind = \"trl\"\n",
            422,
            "optimizer.kl_in",
            "TRL has no KL in the reward",
        ),
        (
            format!("{good}\n[curriculum]\nplugin = \"frontier\"\n"),
            422,
            "curriculum.plugin",
            "loaded curriculum plugins",
        ),
        // Records the job cannot read, refused with their line and key, never a server path.
        (
            with(&format!("{}/train.jsonl", data.display()), &questions.display().to_string()),
            422,
            "data.train",
            "line 2: prompt: missing (expected a string); this job reads prompts",
        ),
        (
            with(&format!("{}/heldout.jsonl", data.display()), &twice.display().to_string()),
            422,
            "data.heldout",
            "line 2: id: \"q1\" appears twice",
        ),
    ];
    // The 22 rows the daemon decides and the 3 wiring rows above: fewer means one was dropped
    // without its rule moving to a table.
    assert!(cases.len() >= 25, "{} cases", cases.len());
    for (body, status, field, words) in &cases {
        let (got, answer) = submit(&daemon, TEAM_TOKEN, body, None);
        assert_eq!(got, *status, "{field}: {answer}");
        let error = &answer["error"];
        assert_eq!(error["field"].as_str().unwrap_or(""), *field, "{answer}");
        assert!(error["message"].as_str().unwrap().contains(words), "{field}: {answer}");
        assert!(!error["message"].as_str().unwrap().contains(&dir.path().display().to_string()), "{answer}");
    }
    // JSON too, and bodies that are not specs at all.
    let json_cases: [(&str, &str, u16, &str); 4] = [
        ("{\"job\": 3}", "application/json", 400, "job"),
        ("{", "application/json", 400, ""),
        ("[]", "application/json", 400, ""),
        ("\u{0}\u{1}binary", "application/octet-stream", 400, ""),
    ];
    for (body, content_type, status, field) in json_cases {
        let response = client()
            .post(format!("{}/v1/jobs", daemon.url))
            .bearer_auth(TEAM_TOKEN)
            .header("content-type", content_type)
            .body(body)
            .send()
            .unwrap();
        assert_eq!(response.status().as_u16(), status, "{body:?}");
        let answer: Value = response.json().unwrap();
        assert_eq!(answer["error"]["field"].as_str().unwrap_or(""), field, "{answer}");
    }
    // 10 MB: refused by size, in the API's error shape.
    // (Data by dataset name: the harness sends the spec as it is, comment included.)
    let by_name = good
        .replace(&format!("{}/train.jsonl", data.display()), "dataset:train")
        .replace(&format!("{}/heldout.jsonl", data.display()), "dataset:train");
    let huge = format!("{by_name}\n# {}\n", "x".repeat(10 << 20));
    let (status, answer) = submit(&daemon, TEAM_TOKEN, &huge, None);
    assert_eq!((status, answer["error"]["code"].as_str()), (413, Some("body_too_large")), "{answer}");
    // No token, bad idempotency key.
    assert_eq!(submit(&daemon, "", &good, None).0, 401);
    let (status, answer) = submit(&daemon, TEAM_TOKEN, &good, Some(&"k".repeat(500)));
    assert_eq!((status, answer["error"]["field"].as_str()), (400, Some("Idempotency-Key")));

    // Nothing was queued, and the daemon still takes a good job.
    assert_eq!(get(&daemon, TEAM_TOKEN, "/v1/jobs").1["jobs"].as_array().map(Vec::len), Some(0));
    let id = submit_ok(&daemon, &good);
    assert_eq!(wait_job(&daemon, &id, Duration::from_secs(120), ended).state, JobState::Published);
}

#[test]
fn kill_9_of_the_daemon_loses_no_job_runs_none_twice_and_resumes_to_an_uninterrupted_result() {
    let redis = Redis::start();
    let mut daemon = Daemon::start_with(&PLUGINS, &redis.url(), QUEUE);
    let dir = tempfile::tempdir().unwrap();
    let data = arith_data(dir.path(), &[]);
    let long = spec(&data, "long", 60, "");
    let id = submit_ok(&daemon, &long);
    let watch = WorkerWatch::start(&id);
    wait_job(&daemon, &id, Duration::from_secs(120), |job| job.state == JobState::Running);
    // Behind it on the one slot (submitted together, either could have started first).
    let queued: Vec<String> =
        (0..2).map(|i| submit_ok(&daemon, &spec(&data, &format!("queued-{i}"), 3, ""))).collect();
    wait_job(&daemon, &id, Duration::from_secs(120), |job| job.step >= 12);

    daemon.kill();
    // The worker dies with its daemon: nothing trains a job the next daemon will start again.
    assert!(wait_until(Duration::from_secs(5), || workers_of(&id) == 0), "the worker outlived its daemon");
    daemon.restart();
    // The queued jobs are all there (they may start at once: the killed daemon's task only
    // comes back after its heartbeats lapse).
    for queued_id in &queued {
        let state = job(&daemon, queued_id).state.as_str().to_owned();
        assert!(
            ["queued", "admitted", "running", "evaluating", "published"].contains(&state.as_str()),
            "{state}"
        );
    }
    let done = wait_job(&daemon, &id, Duration::from_secs(180), ended);
    assert_eq!(done.state, JobState::Published, "{done}");
    assert_eq!(done.crashes, 1, "the daemon's death counts once");
    for queued_id in &queued {
        assert_eq!(wait_job(&daemon, queued_id, Duration::from_secs(120), ended).state, JobState::Published);
    }
    assert_eq!(watch.most(), 1, "never two workers of one job at once");
    let weights = done.weights();
    assert_eq!(weights, uninterrupted_weights(&daemon, dir.path(), &long), "resumed run = uninterrupted run");
}

#[test]
fn sigterm_checkpoints_the_running_job_requeues_it_and_exits_in_time() {
    let redis = Redis::start();
    let mut daemon = Daemon::start_with(&PLUGINS, &redis.url(), QUEUE);
    let dir = tempfile::tempdir().unwrap();
    let data = arith_data(dir.path(), &[]);
    // Checkpoints every 5 steps: the stop's own checkpoint is what keeps the steps since.
    let long = spec(&data, "long", 60, "");
    let id = submit_ok(&daemon, &long);
    wait_job(&daemon, &id, Duration::from_secs(120), |job| job.step >= 12);
    // regression: a SIGTERM handled on a thread inside oneDNN's AVX-512 GEMM kernel (which
    // points the stack pointer into its heap workspace) corrupted the heap, and about one stop
    // in 50 aborted the worker. Only the worker's own signal thread may take a stop signal.
    let pids = worker_pids(&id);
    assert_eq!(pids.len(), 1, "one worker");
    for signal in [nix::sys::signal::Signal::SIGTERM, nix::sys::signal::Signal::SIGINT] {
        assert_eq!(threads_taking(pids[0], signal), ["stop-signals"], "{signal:?}");
    }

    let started = Instant::now();
    let status = daemon.stop();
    assert!(status.success(), "{status}\n{}", daemon.log());
    assert!(started.elapsed() < Duration::from_secs(30), "stopped in {:?}", started.elapsed());
    daemon.restart();
    let done = wait_job(&daemon, &id, Duration::from_secs(180), ended);
    assert_eq!(done.state, JobState::Published, "{done}");
    assert_eq!(done.crashes, 0, "a clean stop is no crash: {done}\n{}", daemon.log());
    let states = states(&daemon, &id);
    let stop = states.iter().position(|s| *s == JobState::Preempted).expect("preempted");
    assert_eq!(states[stop + 1], JobState::Queued, "{states:?}");
    let weights = done.weights();
    assert_eq!(weights, uninterrupted_weights(&daemon, dir.path(), &long));
}

#[test]
fn cancel_stops_a_running_worker_within_a_step_and_a_queued_job_at_once() {
    let redis = Redis::start();
    // One 8 GB slot, and jobs that ask for all of it (left out, each would get its estimate and
    // both would share the slot).
    let daemon = Daemon::start_with(
        &PLUGINS,
        &redis.url(),
        &format!("{QUEUE}keep_ended_per_team = 10\n[devices]\ncpu_slots = 1\ncpu_slot_memory_gb = 8\n"),
    );
    // More libraries than the job uses, in the directory before its worker starts (dropped in
    // rather than loaded at start: the daemon probes them meanwhile, off the test's path).
    for other in
        ["rlvr-verifier-format", "rlvr-optimizer-sft", "rlvr-curriculum-uniform", "rlvr-fixture-echo-v1"]
    {
        let lib = plugin_lib(other);
        drop_in(&lib, &daemon.plugins, lib.file_name().and_then(|name| name.to_str()).unwrap());
    }
    let whole_slot = "[resources]\nmemory_gb = 8\n";
    let dir = tempfile::tempdir().unwrap();
    let data = arith_data(dir.path(), &[]);
    let running = submit_ok(&daemon, &spec(&data, "running", 100_000, whole_slot));
    wait_job(&daemon, &running, Duration::from_secs(120), |job| job.step >= 3);
    // The worker maps its job's libraries and no other: the daemon names them (`--plugin-file`),
    // and the worker no longer scans the directory (it loaded, hashed, copied and self-tested
    // every library there).
    let pid = worker_pids(&running)[0];
    let maps = fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
    let mapped: BTreeSet<&str> = maps
        .lines()
        .filter_map(|line| line.split_whitespace().nth(5)?.rsplit('/').next())
        .filter(|file| file.starts_with("librlvr_"))
        .filter_map(|file| file.split('-').next())
        .collect();
    assert_eq!(mapped, BTreeSet::from(["librlvr_optimizer_grpo", "librlvr_verifier_math"]), "{maps}");
    // The one slot is taken: this one waits (submitted together, either could have started).
    let waiting = submit_ok(&daemon, &spec(&data, "waiting", 3, whole_slot));
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(job(&daemon, &waiting).state, JobState::Queued);

    let cancel = |id: &str| {
        client().delete(format!("{}/v1/jobs/{id}", daemon.url)).bearer_auth(TEAM_TOKEN).send().unwrap()
    };
    let answer: Value = cancel(&waiting).json().unwrap();
    assert_eq!(answer["state"], "cancelled", "a queued job is cancelled at once: {answer}");
    // regression: ended jobs' records (each with its spec) stayed in Redis for ever, outside any
    // quota. Ten more submitted and cancelled: the team keeps its 10 newest ended records.
    let mut cancelled = vec![waiting.clone()];
    for n in 0..10 {
        let id = submit_ok(&daemon, &spec(&data, &format!("cancelled-{n}"), 3, whole_slot));
        assert_eq!(cancel(&id).status().as_u16(), 200);
        cancelled.push(id);
    }
    let forgotten = || get(&daemon, TEAM_TOKEN, &format!("/v1/jobs/{waiting}")).0 == 404;
    assert!(
        wait_until(Duration::from_secs(30), forgotten),
        "the 11th ended job's record stays\n{}",
        daemon.log()
    );
    for id in &cancelled[1..] {
        assert_eq!(get(&daemon, TEAM_TOKEN, &format!("/v1/jobs/{id}")).0, 200, "a newer ended job is kept");
    }
    assert_eq!(job(&daemon, &running).state, JobState::Running, "a job not ended is never forgotten");
    let asked = Instant::now();
    let answer: Value = cancel(&running).json().unwrap();
    assert_eq!(answer["cancel_requested"], true, "{answer}");
    let done = wait_job(&daemon, &running, Duration::from_secs(30), ended);
    assert_eq!(done.state, JobState::Cancelled, "{done}");
    assert!(wait_until(Duration::from_secs(5), || workers_of(&running) == 0), "worker stopped");
    assert!(asked.elapsed() < Duration::from_secs(10), "cancelled in {:?}", asked.elapsed());
    assert_eq!(cancel(&running).status().as_u16(), 409, "cancelling an ended job");
    // The slot is free: the next job runs.
    let next = submit_ok(&daemon, &spec(&data, "next", 2, whole_slot));
    assert_eq!(wait_job(&daemon, &next, Duration::from_secs(120), ended).state, JobState::Published);
    // regression: an ended job's directory (its last checkpoint with the optimizer's state) stayed
    // on disk after its record went. Ten more ended jobs: the cancelled running job's record goes,
    // and its directory with it.
    let running_dir = daemon.state.join("jobs").join(&running);
    assert!(running_dir.join("spec.json").is_file(), "{}", running_dir.display());
    for n in 0..10 {
        let id = submit_ok(&daemon, &spec(&data, &format!("more-{n}"), 3, whole_slot));
        assert_eq!(cancel(&id).status().as_u16(), 200);
    }
    assert!(
        wait_until(Duration::from_secs(30), || !running_dir.exists()),
        "{} stays after its record\n{}",
        running_dir.display(),
        daemon.log()
    );
}

#[test]
fn a_poison_job_is_dead_lettered_after_its_crashes_and_other_jobs_carry_on() {
    let redis = Redis::start();
    let plugins = ["rlvr-optimizer-grpo", "rlvr-verifier-math", "rlvr-fixture-optimizer-poison"];
    let daemon =
        Daemon::start_with(&plugins, &redis.url(), &QUEUE.replace("max_crashes = 3", "max_crashes = 2"));
    assert!(plugin_lib("rlvr-fixture-optimizer-poison").exists());
    let dir = tempfile::tempdir().unwrap();
    let data = arith_data(dir.path(), &[]);
    let poison =
        submit_ok(&daemon, &spec(&data, "poison", 5, "").replace("plugin = \"grpo\"", "plugin = \"poison\""));
    let healthy = submit_ok(&daemon, &spec(&data, "healthy", 3, ""));
    let dead = wait_job(&daemon, &poison, Duration::from_secs(120), ended);
    assert_eq!(dead.state, JobState::Failed, "{dead}");
    assert_eq!(dead.crashes, 2, "{dead}");
    let reason = dead.reason.as_str();
    assert!(reason.contains("dead-lettered after 2 crashes") && reason.contains("SIGABRT"), "{reason}");
    assert_eq!(wait_job(&daemon, &healthy, Duration::from_secs(120), ended).state, JobState::Published);
    let (status, health) = get(&daemon, TEAM_TOKEN, "/healthz");
    assert_eq!((status, health["status"].as_str()), (200, Some("ok")));
}

#[test]
fn redis_stopped_and_restarted_loses_nothing_acknowledged_and_the_daemon_reconnects() {
    let mut redis = Redis::start_with_aof();
    let mut daemon = Daemon::start_with(&PLUGINS, &redis.url(), QUEUE);
    let dir = tempfile::tempdir().unwrap();
    let data = arith_data(dir.path(), &[]);
    let running = submit_ok(&daemon, &spec(&data, "running", 80, ""));
    wait_job(&daemon, &running, Duration::from_secs(120), |job| job.state == JobState::Running);
    let queued: Vec<String> =
        (0..3).map(|i| submit_ok(&daemon, &spec(&data, &format!("queued-{i}"), 3, ""))).collect();
    wait_job(&daemon, &running, Duration::from_secs(120), |job| job.step >= 5);

    redis.stop();
    let degraded = wait_until(Duration::from_secs(10), || {
        rlvr_tests::http_get(&format!("{}/healthz", daemon.url))
            .ok()
            .and_then(|response| response.json::<Value>().ok())
            .is_some_and(|health| health["status"] == "degraded")
    });
    assert!(degraded, "healthz reports the outage\n{}", daemon.log());
    let (status, answer) = submit(&daemon, TEAM_TOKEN, &spec(&data, "during", 2, ""), None);
    assert_eq!((status, answer["error"]["code"].as_str()), (503, Some("redis_unavailable")), "{answer}");
    std::thread::sleep(Duration::from_secs(2));
    redis.restart();
    // The same daemon goes on: the running job's progress is recorded again.
    wait_job(&daemon, &running, Duration::from_secs(120), |job| job.step >= 10);

    // A second outage, and SIGTERM as soon as Redis is back: the queue workers are being rebuilt
    // (their restart backs off) and the task of the running job has not come back to any, so
    // only the supervision itself holds the job. The stop still waits for it to checkpoint and
    // requeue (before, the drain waited for the queue workers' handlers alone, and the daemon
    // exited with the job left running: its next start counted a crash).
    redis.stop();
    std::thread::sleep(Duration::from_secs(2));
    redis.restart();
    let status = daemon.stop();
    assert!(status.success(), "{status}\n{}", daemon.log());
    assert_eq!(workers_of(&running), 0, "no worker outlives a stopped daemon");
    daemon.restart();

    let done = wait_job(&daemon, &running, Duration::from_secs(180), ended);
    assert_eq!(done.state, JobState::Published, "{done}");
    assert_eq!(done.crashes, 0, "the stop requeued the job, nothing crashed: {done}\n{}", daemon.log());
    for id in &queued {
        assert_eq!(wait_job(&daemon, id, Duration::from_secs(120), ended).state, JobState::Published, "{id}");
    }
}

/// The `--memory-cap` of each worker running job `id` now, in bytes.
fn memory_caps(id: &str) -> Vec<u64> {
    worker_pids(id)
        .into_iter()
        .filter_map(|pid| {
            let cmdline = fs::read(format!("/proc/{pid}/cmdline")).ok()?;
            let args: Vec<String> =
                cmdline.split(|b| *b == 0).map(|arg| String::from_utf8_lossy(arg).into_owned()).collect();
            let at = args.iter().position(|arg| arg == "--memory-cap")?;
            args.get(at + 1)?.parse().ok()
        })
        .collect()
}

/// `gb` as the worker's `--memory-cap`.
fn cap_bytes(gb: f64) -> u64 {
    (gb * (1u64 << 30) as f64).round() as u64
}

/// A job that asks for less memory than it uses ends `OutOfMemory` on its CPU slot; it is
/// requeued once, not as a crash, with a larger request (1.5 ×, to the tenth of a GB, its
/// resident part too) that its events name, that the next worker's cap is, and that a daemon restart keeps (the record's
/// spec); then it either fits and trains to its end, or runs out again and fails naming the
/// request, the peak, the cap and the phase. Long-completion SFT jobs (`long_sft_spec`): 0.4 GB
/// loaded, 1.3–1.45 GB through their updates.
#[test]
fn a_job_out_of_memory_is_requeued_once_with_a_larger_request_then_fits_or_fails_naming_the_numbers() {
    let redis = Redis::start();
    let config = QUEUE.to_owned() + "[devices]\ncpu_slots = 2\ncpu_slot_memory_gb = 8\n";
    let mut daemon = Daemon::start_with(&["rlvr-optimizer-sft"], &redis.url(), &config);
    let dir = tempfile::tempdir().unwrap();
    let resources = |gb: f64| format!("[resources]\nmemory_gb = {gb}\n");
    // 0.8 GB: out in its first update; 1.2 GB: out again, by its first update's end.
    let small = submit_ok(&daemon, &long_sft_spec(dir.path(), "too-small", 3, false, &resources(0.8)));
    // 1.2 GB: out by its first update's end, as the other's second run; 1.8 GB fits (1.5 GB
    // measured, resumed from a checkpoint). Its resident part grows with it.
    let grows_resources = resources(1.2) + "resident_gb = 0.6\n";
    let grows = submit_ok(&daemon, &long_sft_spec(dir.path(), "grows", 3, false, &grows_resources));

    // Its second worker runs with the larger cap; a daemon stopped and started meanwhile keeps it.
    let larger = cap_bytes(1.8);
    let second = wait_until(Duration::from_secs(120), || memory_caps(&grows).contains(&larger));
    assert!(
        second,
        "no worker of {grows} with --memory-cap {larger}: {}\n{}",
        job(&daemon, &grows),
        daemon.log()
    );
    let status = daemon.stop();
    assert!(status.success(), "{status}\n{}", daemon.log());
    daemon.restart();
    let caps = std::cell::RefCell::new(BTreeSet::new());
    let done = wait_job(&daemon, &grows, Duration::from_secs(180), |job| {
        caps.borrow_mut().extend(memory_caps(&grows));
        ended(job)
    });
    assert_eq!(caps.into_inner(), BTreeSet::from([larger]), "the caps after the restart");
    // Trained to its end (no held-out set: the gates check nothing and publish it).
    assert_eq!((done.state, done.step), (JobState::Published, 3), "{done}");
    assert_eq!(done.crashes, 0, "an out-of-memory is no crash: {done}");
    // Its status shows the larger request.
    assert_eq!((done.memory_gb, done.resident_gb), (1.8, Some(0.9)), "{done}");
    assert!(done.outcome().peak_memory_bytes > Some(cap_bytes(1.2)), "{done}");
    let events = state_events(&daemon, &grows);
    let requeue = events
        .iter()
        .find(|event| event.reason.starts_with("requeued after running out"))
        .unwrap_or_else(|| panic!("no out-of-memory requeue: {events:#?}"));
    let reason = requeue.reason.as_str();
    println!("grows: {reason}");
    assert!(
        reason.contains(" in the update phase (peak 1.")
            && reason.contains(", cap 1.2")
            && reason.ends_with(" GB): resources.memory_gb 1.2 → 1.8 GB, resident_gb 0.6 → 0.9 GB"),
        "{reason}"
    );
    assert_eq!(requeue.state, JobState::Queued);

    let failed = wait_job(&daemon, &small, Duration::from_secs(180), ended);
    assert_eq!(failed.state, JobState::Failed, "{failed}");
    assert_eq!(
        (failed.crashes, failed.memory_gb),
        (0, 1.2),
        "{failed}\n{:#?}",
        state_events(&daemon, &small)
    );
    let reason = failed.reason.as_str();
    println!("too-small: {reason}");
    assert!(
        reason.starts_with("out of memory again on cpu:")
            && reason.contains(" in the update phase (peak 1.")
            && reason.contains(", cap 1.2")
            && reason.contains(" GB), with resources.memory_gb 1.2 GB, raised once already"),
        "{reason}"
    );
    let events = state_events(&daemon, &small);
    let shown: Vec<(&str, &str)> =
        events.iter().map(|event| (event.state.as_str(), event.reason.as_str())).collect();
    let requeues: Vec<&str> = shown
        .iter()
        .filter(|(_, reason)| reason.starts_with("requeued after running out of memory"))
        .map(|(_, reason)| *reason)
        .collect();
    assert_eq!(requeues.len(), 1, "{shown:#?}");
    assert!(
        requeues[0].contains(" in the update phase (peak 0.8")
            && requeues[0].contains(", cap 0.8")
            && requeues[0].ends_with(" GB): resources.memory_gb 0.8 → 1.2 GB"),
        "{}",
        requeues[0]
    );
    assert_eq!(shown.last().map(|(state, _)| *state), Some("failed"), "{shown:#?}");
}

/// A job out of memory whose larger request would fit no device of this daemon fails at once,
/// naming the request, the peak, the cap, the phase and the devices there are.
#[test]
fn a_job_out_of_memory_whose_larger_request_fits_nowhere_fails_at_once() {
    let redis = Redis::start();
    let config = QUEUE.to_owned() + "[devices]\ncpu_slots = 1\ncpu_slot_memory_gb = 0.8\n";
    let daemon = Daemon::start_with(&["rlvr-optimizer-sft"], &redis.url(), &config);
    let dir = tempfile::tempdir().unwrap();
    let id =
        submit_ok(&daemon, &long_sft_spec(dir.path(), "slot", 2, false, "[resources]\nmemory_gb = 0.8\n"));
    let failed = wait_job(&daemon, &id, Duration::from_secs(120), ended);
    assert_eq!((failed.state, failed.crashes), (JobState::Failed, 0), "{failed}");
    let reason = failed.reason.as_str();
    println!("slot: {reason}");
    assert!(
        reason.starts_with("out of memory on cpu:0 in the update phase (peak 0.")
            && reason.contains(", cap 0.8")
            && reason.contains(
                " GB), with resources.memory_gb 0.8 GB; the larger request of 1.2 GB fits no device here: "
            )
            && reason.contains("(cpu:0 0.8 GB)"),
        "{reason}"
    );
    assert_eq!(
        states(&daemon, &id),
        [JobState::Queued, JobState::Admitted, JobState::Running, JobState::Failed]
    );
}
