//! The graders' dry-run through a real `rlvrd serve`: `POST /v1/verify` grades items with one
//! grader or a reward formula through the daemon's loaded plugins, `POST /v1/graders/validate`
//! checks without running, both under the tenancy rules (secrets by the caller's team, the
//! operator's outbound policy), and `rlvrctl verify --server` speaks them.

use std::fs;

use rlvr_client::HttpError;
use rlvr_protocol::api::{RewardRequest, VerifyRequest};
use rlvr_protocol::spec::PluginSection;
use rlvr_tests::cli::{run, text};
use rlvr_tests::jobs::api;
use rlvr_tests::peer::Peer;
use rlvr_tests::{Daemon, OTHER_TOKEN, OUTBOUND_LOOPBACK, Redis, TEAM_TOKEN, artifact};
use serde_json::{Value, json};

fn grader(entry: Value) -> PluginSection {
    serde_json::from_value(entry).expect("a grader entry")
}

fn items() -> Vec<Value> {
    vec![
        json!({"id": "right", "prompt": "2+2=", "completion": "<think>four</think> The answer is \\boxed{4}.", "reference": {"answer": "4"}}),
        json!({"id": "wrong", "prompt": "2+2=", "completion": "<think>hmm</think> \\boxed{5}", "reference": {"answer": "4"}}),
        json!({"id": "untagged", "pred": "4", "gold": "4"}),
    ]
}

/// The refusal of a request: status, field, message.
fn refusal(result: Result<impl std::fmt::Debug, HttpError>) -> (u16, String, String) {
    match result {
        Err(HttpError::Status { status, error, .. }) => {
            (status.as_u16(), error.field.clone().unwrap_or_default(), error.message.clone())
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
}

/// Grading sample items, and what one dry-run may cost the others: a team's second dry-run waits
/// (429) while its first grades and another team's is served; a dry-run whose client goes away
/// stops grading and gives its place back; one past `api.dry_run_budget_s` answers its remaining
/// items as not graded.
#[test]
fn a_grader_and_a_reward_formula_grade_sample_items_on_the_daemon_and_each_dry_run_is_bounded() {
    let redis = Redis::start();
    let mut daemon = Daemon::start_with_api(
        &["rlvr-verifier-math", "rlvr-verifier-format", "rlvr-fixture-stall"],
        &redis.url(),
        &format!("dry_run_budget_s = {BUDGET_S}\n"),
        "",
    );
    let team = api(&daemon, Some(TEAM_TOKEN));

    // One grader: its own lines, in the items' order, ids kept.
    let request = VerifyRequest {
        grader: Some(grader(json!({"plugin": "math", "fallback": "last"}))),
        reward: None,
        items: items(),
    };
    let results = team.verify(&request).unwrap().results;
    let got: Vec<(Option<&str>, f64, bool)> =
        results.iter().map(|line| (line.id.as_deref(), line.score, line.passed)).collect();
    assert_eq!(got, [(Some("right"), 1.0, true), (Some("wrong"), 0.0, false), (Some("untagged"), 1.0, true)]);
    assert!(results[0].verifier.starts_with("math@"), "{:?}", results[0]);
    assert_eq!(results[1].extracted.as_deref(), Some("5"));

    // A reward: the formula's value, each grader's score and components by name.
    let reward = |formula: &str| VerifyRequest {
        grader: None,
        reward: Some(RewardRequest {
            formula: Some(formula.to_owned()),
            graders: vec![
                grader(json!({"plugin": "math", "fallback": "last"})),
                grader(json!({"plugin": "format"})),
            ],
        }),
        items: items(),
    };
    let results = team.verify(&reward("0.7 * math + 0.3 * format")).unwrap().results;
    let scores: Vec<f64> = results.iter().map(|line| (line.score * 1e9).round() / 1e9).collect();
    assert_eq!(scores, [1.0, 0.3, 0.7], "{results:?}");
    let names: Vec<&str> = results[0].components.0.iter().map(|(name, _)| name.as_str()).collect();
    assert!(names.starts_with(&["math", "math.correct"]) && names.contains(&"format"), "{names:?}");
    assert_eq!(results[0].verifier, "reward");
    let gated = team.verify(&reward("format > 0 ? math : 0")).unwrap().results;
    let scores: Vec<f64> = gated.iter().map(|line| line.score).collect();
    assert_eq!(scores, [1.0, 0.0, 0.0], "{gated:?}");
    assert_eq!(gated.iter().map(|line| line.passed).collect::<Vec<_>>(), [true, false, false]);

    // Validate: the plugins a job would pin; nothing graded.
    let valid = team.validate_graders(&reward("min(math, format)")).unwrap();
    let names: Vec<(&str, bool)> =
        valid.graders.iter().map(|g| (g.name.as_str(), g.plugin.contains('@'))).collect();
    assert_eq!(names, [("math", true), ("format", true)]);

    // Refusals name the key as the request wrote it.
    let cases: Vec<(VerifyRequest, u16, &str, &str)> = vec![
        (
            VerifyRequest {
                grader: Some(grader(json!({"plugin": "math", "fallbak": "last"}))),
                reward: None,
                items: items(),
            },
            422,
            "grader.fallbak",
            "unknown",
        ),
        (reward("0.7 * math + 0.3 * fromat"), 422, "reward.formula", "`fromat`: not a grader"),
        (
            VerifyRequest {
                grader: None,
                reward: Some(RewardRequest {
                    formula: None,
                    graders: vec![grader(json!({"plugin": "math"})), grader(json!({"plugin": "nope"}))],
                }),
                items: items(),
            },
            422,
            "reward.graders[1].plugin",
            "nope",
        ),
        (
            VerifyRequest {
                grader: Some(grader(json!({"plugin": "reward-model", "model": "base:rm"}))),
                reward: None,
                items: items(),
            },
            422,
            "grader.plugin",
            "reward-model grader scores on a device inside a job",
        ),
        (VerifyRequest { grader: None, reward: None, items: items() }, 422, "grader", "expected either"),
        (
            VerifyRequest { grader: Some(grader(json!({"plugin": "math"}))), reward: None, items: vec![] },
            422,
            "items",
            "expected 1–256 items",
        ),
        (
            VerifyRequest {
                grader: Some(grader(json!({"plugin": "math"}))),
                reward: None,
                items: vec![items()[0].clone(), json!({"id": "x", "prompt": "p"})],
            },
            422,
            "items[1]",
            "completion",
        ),
        (
            VerifyRequest {
                grader: Some(grader(json!({"plugin": "math"}))),
                reward: None,
                items: vec![json!("text"); 257],
            },
            422,
            "items",
            "expected 1–256 items",
        ),
    ];
    for (request, status, field, message) in cases {
        let (got_status, got_field, got_message) = refusal(team.verify(&request));
        assert_eq!((got_status, got_field.as_str()), (status, field), "{got_message}");
        assert!(got_message.contains(message), "{field}: {got_message}");
    }
    // A reward-model grader is validated as a submit checks it (its keys, its model under the
    // tenancy rules), never run here.
    let rm = |entry: Value| VerifyRequest { grader: Some(grader(entry)), reward: None, items: vec![] };
    let cases = [
        (
            json!({"plugin": "reward-model", "model": "builtin:tiny-arith"}),
            "grader.model",
            "not a reward model",
        ),
        (json!({"plugin": "reward-model", "model": "/etc"}), "grader.model", ""),
        (json!({"plugin": "reward-model", "model": "line:someone-elses"}), "grader.model", ""),
        (json!({"plugin": "reward-model", "model": "base:rm", "batch_size": 0}), "grader.batch_size", ""),
    ];
    for (entry, field, message) in cases {
        let Err(HttpError::Status { status, error, .. }) = team.validate_graders(&rm(entry)) else {
            panic!("{field}: not refused");
        };
        let mut problems = vec![(error.field.clone().unwrap_or_default(), error.message.clone())];
        problems.extend(error.more.iter().map(|p| (p.field.clone(), p.message.clone())));
        assert_eq!(status.as_u16(), 422);
        assert!(problems.iter().any(|(f, m)| f == field && m.contains(message)), "{field}: {problems:?}");
    }

    // Not a request at all: the client never sends these.
    let raw = |body: &str, token: Option<&str>| {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let mut request =
            reqwest::blocking::Client::new().post(format!("{}/v1/verify", daemon.url)).body(body.to_owned());
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        let response = request.send().unwrap();
        let status = response.status().as_u16();
        (status, response.json::<Value>().unwrap_or(Value::Null))
    };
    let (status, body) = raw(r#"{"grader": {"plugin": "math"}, "items": [], "extra": 1}"#, Some(TEAM_TOKEN));
    assert_eq!(status, 400, "{body}");
    assert!(body["error"]["message"].as_str().unwrap().contains("unknown field `extra`"), "{body}");
    assert_eq!(raw(r#"{"grader": {"plugin": "math"}}"#, None).0, 401);

    dry_runs_are_bounded(&daemon);
    a_sigterm_stops_the_grading(&mut daemon);
}

// regression: with dry-runs grading, a SIGTERM left the daemon alive after 130 s
/// A dry-run of minutes is grading when the daemon gets SIGTERM: the grading stops (its running
/// calls end at their 3 s), and the daemon exits well before the request's budget would have.
fn a_sigterm_stops_the_grading(daemon: &mut Daemon) {
    use std::time::{Duration, Instant};
    let url = format!("{}/v1/verify", daemon.url);
    // The dry-runs before may still hold the team's lane (an abandoned one's running calls end
    // at their 3 s): the long one starts once a short one is let through, or it is refused too.
    let probe = |items, sleep_ms| {
        reqwest::blocking::Client::new()
            .post(&url)
            .bearer_auth(TEAM_TOKEN)
            .json(&sleeping(items, sleep_ms))
            .send()
            .map_or(0, |answer| answer.status().as_u16())
    };
    let free = rlvr_tests::wait_until(Duration::from_secs(30), || probe(1, 0) == 200);
    assert!(free, "the team's lane never came free after the dry-runs before");
    let start_long = || {
        let url = url.clone();
        std::thread::spawn(move || {
            reqwest::blocking::Client::new()
                .post(url)
                .bearer_auth(TEAM_TOKEN)
                .json(&sleeping(256, 3000))
                .timeout(Duration::from_secs(60))
                .send()
                .map(|answer| answer.status().as_u16())
        })
    };
    // The team's lane is taken once the long dry-run grades: the same team's next one waits.
    let mut refused = 0;
    let long = loop {
        let long = start_long();
        let grading =
            rlvr_tests::wait_until(Duration::from_secs(30), || long.is_finished() || probe(1, 0) == 429);
        if !long.is_finished() {
            assert!(grading, "the long dry-run never started grading");
            break long;
        }
        // regression (of this test): a probe of ours reached the lane first and the long one was
        // refused (429); the probe grades nothing and leaves at once, so the long one goes again.
        let answer = long.join().unwrap();
        refused += 1;
        assert!(
            matches!(answer, Ok(429)) && refused < 5,
            "the long dry-run ended before the daemon stopped: {answer:?} (try {refused})"
        );
    };
    let signalled = Instant::now();
    let status = daemon.stop();
    let took = signalled.elapsed();
    assert!(status.success(), "{status}");
    assert!(took < Duration::from_secs(BUDGET_S - 2), "the daemon took {took:?} to stop: {}", daemon.log());
    eprintln!(
        "SIGTERM with a dry-run grading: the daemon exited in {took:?}; the request got {:?}",
        long.join()
    );
}

/// `api.dry_run_budget_s` of the daemon above.
const BUDGET_S: u64 = 8;

/// The `stall` fixture told to sleep `millis` on each of `count` items.
fn sleeping(count: usize, millis: u64) -> Value {
    let items: Vec<Value> =
        (0..count).map(|i| json!({"id": format!("{i}"), "completion": format!("sleep:{millis}")})).collect();
    json!({"grader": {"plugin": "stall"}, "items": items})
}

fn dry_runs_are_bounded(daemon: &Daemon) {
    use std::time::{Duration, Instant};
    let client = reqwest::blocking::Client::new();
    let post = |token: &str, body: &Value, timeout: Duration| {
        client.post(format!("{}/v1/verify", daemon.url)).bearer_auth(token).json(body).timeout(timeout).send()
    };
    let quick = sleeping(1, 0);
    let patient = Duration::from_secs(60);

    // Team A's dry-run of 256 items of 3 s (over 3 minutes at 4 at a time) is given up by its
    // client after 1 s.
    let gone = post(TEAM_TOKEN, &sleeping(256, 3000), Duration::from_secs(1));
    let left = Instant::now();
    assert!(gone.as_ref().is_err_and(reqwest::Error::is_timeout), "{gone:?}");
    // Its grading has not ended the moment the client left (its first 4 calls are inside the
    // grader for 2 s more): its place is held until they end, so team A's next dry-run waits,
    // while team B's is served.
    let waits = post(TEAM_TOKEN, &quick, patient).unwrap();
    assert_eq!(waits.status().as_u16(), 429, "{}", waits.text().unwrap_or_default());
    let other = post(OTHER_TOKEN, &quick, patient).unwrap();
    assert_eq!(other.status().as_u16(), 200, "another team's dry-run is served");
    // Stopped, not graded to its end: A's place comes back once the running calls end, well
    // before the minutes of grading (and the budget of 8 s) it asked for.
    let readmitted = loop {
        let answer = post(TEAM_TOKEN, &quick, patient).unwrap();
        match answer.status().as_u16() {
            200 => break left.elapsed(),
            429 => {
                let body: Value = answer.json().unwrap();
                let message = body["error"]["message"].as_str().unwrap_or_default().to_owned();
                assert!(message.contains("your team has 1 dry-run(s) grading already"), "{body}");
                assert!(left.elapsed() < Duration::from_secs(BUDGET_S - 2), "still refused: {message}");
                std::thread::sleep(Duration::from_millis(100));
            }
            status => panic!("{status}: {}", answer.text().unwrap_or_default()),
        }
    };
    eprintln!("team A's place came back {readmitted:?} after its client left");

    // The budget: 48 items of 1 s at 4 at a time would take 12 s; after 8 the rest are not graded.
    let started = Instant::now();
    let answer = post(TEAM_TOKEN, &sleeping(48, 1000), patient).unwrap();
    assert_eq!(answer.status().as_u16(), 200);
    let lines = answer.json::<Value>().unwrap()["results"].as_array().unwrap().clone();
    assert_eq!(lines.len(), 48);
    let budget_ran_out = format!("not graded: the request's budget of {BUDGET_S} s ran out");
    let not_graded = lines.iter().filter(|line| line["error"] == budget_ran_out.as_str()).count();
    assert!(
        lines.iter().all(|line| line["passed"] == true || line["error"] == budget_ran_out.as_str()),
        "each item graded or answered as not graded: {lines:?}"
    );
    assert!(not_graded >= 48 - 4 * BUDGET_S as usize, "{not_graded} not graded: {lines:?}");
    assert_eq!(lines[47]["error"], budget_ran_out.as_str(), "the last item cannot have been reached");
    eprintln!("{not_graded} of 48 items not graded, answered after {:?}", started.elapsed());
}

#[test]
fn a_dry_run_uses_only_the_callers_secrets_and_the_operators_destinations() {
    let redis = Redis::start();
    let dir = tempfile::tempdir().unwrap();
    let secret_file = dir.path().join("grader-token");
    fs::write(&secret_file, "s3cret-grader-value\n").unwrap();
    let config = format!(
        "{OUTBOUND_LOOPBACK}[[tenancy.secrets]]\nname = \"grader-token\"\nteams = [\"tests\"]\nfile = {file:?}\n",
        file = secret_file.display().to_string()
    );
    let daemon = Daemon::start_with(&["rlvr-verifier-http", "rlvr-verifier-math"], &redis.url(), &config);
    let peer = Peer::ok(r#"{"score": 1, "passed": true}"#);
    let http = |url: &str| VerifyRequest {
        grader: Some(grader(json!({"plugin": "http", "url": url, "bearer_token_secret": "grader-token"}))),
        reward: None,
        items: items(),
    };

    // Another team names the secret: refused before anything is called.
    let (status, field, message) =
        refusal(api(&daemon, Some(OTHER_TOKEN)).verify(&http(&peer.url("/grade"))));
    assert_eq!((status, field.as_str()), (422, "grader.bearer_token_secret"), "{message}");
    let (status, field, _) =
        refusal(api(&daemon, Some(OTHER_TOKEN)).validate_graders(&http(&peer.url("/grade"))));
    assert_eq!((status, field.as_str()), (422, "grader.bearer_token_secret"));
    // A destination the operator did not allow.
    let (status, field, _) =
        refusal(api(&daemon, Some(TEAM_TOKEN)).verify(&http("http://169.254.169.254/latest/")));
    assert_eq!((status, field.as_str()), (422, "grader.url"));
    assert!(peer.received().is_empty(), "nothing reached the grader");

    // The owner: the grader gets the token, and the answer never shows it.
    let team = api(&daemon, Some(TEAM_TOKEN));
    let valid = team.validate_graders(&http(&peer.url("/grade"))).unwrap();
    assert_eq!(valid.graders[0].secrets, ["grader-token"]);
    assert_eq!(valid.graders[0].urls, [peer.url("/grade")]);
    assert!(peer.received().is_empty(), "validate runs nothing");
    let results = team.verify(&http(&peer.url("/grade"))).unwrap().results;
    assert!(results.iter().all(|line| line.passed && line.error.is_none()), "{results:?}");
    let received = peer.received();
    assert_eq!(received.len(), 3);
    assert!(received.iter().all(|r| r.header("authorization") == Some("Bearer s3cret-grader-value")));
    assert!(!serde_json::to_string(&results).unwrap().contains("s3cret"));
    assert!(!daemon.log().contains("s3cret-grader-value"));
}

#[test]
fn rlvrctl_verify_server_grades_with_a_plugin_or_a_specs_whole_reward() {
    let redis = Redis::start();
    let daemon = Daemon::start(&["rlvr-verifier-math", "rlvr-verifier-format"], &redis.url());
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("items.jsonl");
    let lines: Vec<String> = items().iter().map(Value::to_string).collect();
    fs::write(&input, lines.join("\n") + "\n\n").unwrap();
    let spec = dir.path().join("job.toml");
    fs::write(
        &spec,
        "[job]\nname = \"x\"\n[[verifiers]]\nplugin = \"math\"\nfallback = \"last\"\n\
         [[verifiers]]\nplugin = \"format\"\nname = \"tags\"\n[reward]\nformula = \"math * tags\"\n",
    )
    .unwrap();
    let env = [("RLVR_SERVER", daemon.url.as_str()), ("RLVR_TOKEN", TEAM_TOKEN)];
    let rlvrctl = artifact("rlvrctl");
    let input_arg = input.display().to_string();
    let output =
        run(&rlvrctl, &["verify", "--server", "--plugin", "math", "--jsonl", &input_arg], dir.path(), &env);
    assert!(output.status.success(), "{}", text(&output));
    let lines = rlvr_tests::json_lines(&output.stdout);
    let passed: Vec<bool> = lines.iter().map(|line| line["passed"].as_bool().unwrap()).collect();
    // The default fallback ("none") grades only a box or an answer marker: the bare "4" is no answer.
    assert_eq!(passed, [true, false, false], "{lines:?}");

    let spec_arg = spec.display().to_string();
    let output =
        run(&rlvrctl, &["verify", "--server", "--spec", &spec_arg, "--jsonl", &input_arg], dir.path(), &env);
    assert!(output.status.success(), "{}", text(&output));
    let scores: Vec<f64> =
        rlvr_tests::json_lines(&output.stdout).iter().map(|line| line["score"].as_f64().unwrap()).collect();
    assert_eq!(scores, [1.0, 0.0, 0.0]);

    let output = run(&rlvrctl, &["verify", "--server", "--spec", &spec_arg, "--validate"], dir.path(), &env);
    assert!(output.status.success(), "{}", text(&output));
    let valid: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(valid["graders"][1]["name"], "tags", "{valid}");
    assert_eq!(valid["formula"], "math * tags");

    // Without --server, --spec is refused naming what to add.
    let output = run(&rlvrctl, &["verify", "--spec", &spec_arg], dir.path(), &[]);
    assert_eq!(output.status.code(), Some(2), "{}", text(&output));
    assert!(text(&output).contains("add --server"), "{}", text(&output));
}

/// A team's python grader, in the dry-run and in a real worker's reward: the dry-run shows the
/// source's digest, the worker records it with the run's plugins (the manifest's), and a formula
/// over the grader's name makes the reward its metrics log.
#[test]
fn a_python_grader_is_dry_run_then_trained_on_with_its_source_recorded() {
    use rlvr_protocol::worker::{MetricsLine, Outcome};
    let source =
        "def grade(sample, item):\n    return 1.0 if item['reference']['answer'] in sample else 0.0\n";
    let redis = Redis::start();
    let daemon =
        Daemon::start(&["rlvr-verifier-python", "rlvr-verifier-math", "rlvr-optimizer-grpo"], &redis.url());
    let team = api(&daemon, Some(TEAM_TOKEN));
    let request = VerifyRequest {
        grader: Some(grader(json!({"plugin": "python", "source": source}))),
        reward: None,
        items: items(),
    };
    let valid = team.validate_graders(&request).unwrap();
    assert_eq!(valid.graders[0].digests.get("source"), Some(&rlvr_tests::sha256_hex(source)), "{valid:?}");
    let results = team.verify(&request).unwrap().results;
    let scores: Vec<f64> = results.iter().map(|line| line.score).collect();
    assert_eq!(scores, [1.0, 0.0, 1.0], "{results:?}");
    let broken = VerifyRequest {
        grader: Some(grader(
            json!({"plugin": "python", "source": "def grade(sample, item):\n    return 1 / 0\n"}),
        )),
        reward: None,
        items: items(),
    };
    let results = team.verify(&broken).unwrap().results;
    assert!(
        results.iter().all(
            |line| !line.passed && line.error.as_deref().is_some_and(|e| e.contains("ZeroDivisionError"))
        ),
        "an exception is an error verdict, never a silent 0: {results:?}"
    );
    // regression: a grader's options took 1.5 GB and 4,096 processes of the daemon's host
    // The operator's caps ([graders], 2048 MiB by default) hold what a grader's options ask.
    let greedy = VerifyRequest {
        grader: Some(grader(json!({"plugin": "python", "source": source, "memory_mb": 4096}))),
        reward: None,
        items: items(),
    };
    let (status, field, message) = refusal(team.verify(&greedy));
    assert_eq!((status, field.as_str()), (422, "grader"), "{message}");
    assert!(
        message.contains("memory_mb: expected at most 2048 on this host (graders.max_memory_mb), got 4096"),
        "{message}"
    );
    // The sandboxes' work root (the state directory's grader-work/, made at start) holds nothing
    // once the runs are over.
    let work = daemon.state.join("grader-work");
    assert_eq!(fs::read_dir(&work).map(Iterator::count).ok(), Some(0), "{}", work.display());

    // The same grader in a real worker's reward, under a formula over its name.
    let dir = tempfile::tempdir().unwrap();
    let data = rlvr_tests::arith_data(dir.path(), &["--train", "8", "--heldout", "4", "--sft", "0"]);
    let plugins = rlvr_tests::worker_plugins(dir.path());
    rlvr_tests::drop_in(
        &rlvr_tests::plugin_lib("rlvr-verifier-python"),
        &plugins,
        "librlvr_verifier_python.so",
    );
    let spec = rlvr_tests::arith_grpo_spec(&data, "py", "builtin:tiny-arith", 1, 1).replace(
        "[[verifiers]]\nplugin = \"math\"\nfallback = \"last\"\n",
        &format!(
            "[[verifiers]]\nplugin = \"math\"\nfallback = \"last\"\n[[verifiers]]\nplugin = \"python\"\nname = \"py\"\n\
             source = {source:?}\n[reward]\nformula = \"0.5 * math + 0.5 * py\"\n"
        ),
    );
    let spec_path = dir.path().join("job.toml");
    fs::write(&spec_path, &spec).unwrap();
    // A job's graders meet the caps at submit too (its worker met them, and failed, before).
    let greedy_job = spec.replace(
        "plugin = \"python\"\nname = \"py\"\n",
        "plugin = \"python\"\nname = \"py\"\nmemory_mb = 4096\n",
    );
    let (status, answer) = rlvr_tests::jobs::submit(&daemon, TEAM_TOKEN, &greedy_job, None);
    let error = &answer["error"];
    assert_eq!((status, error["field"].as_str()), (422, Some("verifiers[1]")), "{answer}");
    assert!(error["message"].as_str().unwrap().contains("memory_mb: expected at most 2048"), "{answer}");
    let state = dir.path().join("state");
    let output = rlvr_tests::worker_command(&spec_path, &state, &plugins, &[]).output().unwrap();
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let outcome: Outcome = serde_json::from_slice(&output.stdout).unwrap();
    let python =
        outcome.plugins.iter().find(|p| p.id.starts_with("python@")).expect("the python grader's use");
    assert_eq!(python.digests.get("source"), Some(&rlvr_tests::sha256_hex(source)));
    let metrics = fs::read_to_string(state.join("metrics.jsonl")).unwrap();
    assert!(metrics.contains("\"py\""), "the grader's name in the components: {metrics}");
    let step: MetricsLine = metrics
        .lines()
        .map(|line| serde_json::from_str::<MetricsLine>(line).unwrap())
        .find(|line| line.reward_mean.is_some())
        .expect("a training step");
    let component = |name: &str| {
        step.components
            .as_ref()
            .and_then(|c| c.get(name))
            .copied()
            .unwrap_or_else(|| panic!("{name}: {metrics}"))
    };
    let want = 0.5 * component("math") + 0.5 * component("py");
    assert!((step.reward_mean.unwrap() - want).abs() < 1e-9, "{metrics}");
}
