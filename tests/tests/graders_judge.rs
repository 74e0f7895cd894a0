//! The `judge` grader through the real `.so` and `rlvrctl verify`, against a real HTTP server in
//! the test that speaks OpenAI's chat-completions JSON (a peer, not our component): a judge that
//! answers well, answers garbage, answers slowly, never answers, is down, or is not there.
//!
//! The judge's prompt is `{{sample}}`, so each item's completion picks how the peer behaves.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rlvr_tests::{artifact, drop_in, json_lines, plugin_lib};
use serde_json::{Value, json};

/// A request as the peer received it.
#[derive(Debug, Clone)]
struct Received {
    authorization: Option<String>,
    body: Value,
}

/// The chat-completions peer on 127.0.0.1; it serves until the test process ends.
struct Judge {
    base: String,
    received: Arc<Mutex<Vec<Received>>>,
}

impl Judge {
    fn start() -> Judge {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let base = format!("http://{}/v1", listener.local_addr().unwrap());
        let received = Arc::new(Mutex::new(Vec::new()));
        let log = Arc::clone(&received);
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let log = Arc::clone(&log);
                std::thread::spawn(move || serve(stream, &log));
            }
        });
        Judge { base, received }
    }

    fn received(&self) -> Vec<Received> {
        self.received.lock().unwrap().clone()
    }
}

/// One request per connection: reads it, then answers as the last message's content says.
fn serve(stream: TcpStream, log: &Mutex<Vec<Received>>) {
    let mut reader = BufReader::new(stream);
    let (mut length, mut authorization) = (0, None);
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap_or(0) == 0 {
            return;
        }
        let lower = line.to_ascii_lowercase();
        if let Some(value) = lower.strip_prefix("content-length:") {
            length = value.trim().parse().unwrap_or(0);
        }
        if lower.starts_with("authorization:") {
            authorization = Some(line["authorization:".len()..].trim().to_owned());
        }
        if line == "\r\n" {
            break;
        }
    }
    let mut body = vec![0; length];
    if reader.read_exact(&mut body).is_err() {
        return;
    }
    let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let behaviour = body["messages"].as_array().and_then(|m| m.last()).and_then(|m| m["content"].as_str());
    let behaviour = behaviour.unwrap_or("").to_owned();
    log.lock().unwrap().push(Received { authorization, body });
    let content = match behaviour.as_str() {
        "score-8" => r#"{"reason": "right, but terse", "score": 8}"#.to_owned(),
        "score-3-fenced" => "```json\n{\"score\": 3}\n```".to_owned(),
        "correct" => r#"{"reason": "matches the reference", "label": "correct"}"#.to_owned(),
        "incorrect" => r#"{"label": "incorrect"}"#.to_owned(),
        "garbage" => "I would give this answer an 8 out of 10, it is mostly right.".to_owned(),
        "two-objects" => r#"{"score": 8} {"score": 2}"#.to_owned(),
        "out-of-range" => r#"{"score": 11}"#.to_owned(),
        "unknown-label" => r#"{"label": "mostly correct"}"#.to_owned(),
        "slow" => {
            std::thread::sleep(Duration::from_millis(1500));
            r#"{"score": 10}"#.to_owned()
        }
        "silent" => {
            // Accepts and reads the request, then never answers (holds the connection open).
            std::thread::sleep(Duration::from_secs(10));
            return;
        }
        "down" => return answer(reader.get_mut(), "503 Service Unavailable", "model is loading"),
        _ => return answer(reader.get_mut(), "400 Bad Request", "unknown behaviour"),
    };
    let completion = json!({
        "id": "chatcmpl-1", "object": "chat.completion", "model": "judge-test",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 42, "completion_tokens": 7, "total_tokens": 49},
    });
    answer(reader.get_mut(), "200 OK", &completion.to_string());
}

fn answer(stream: &mut TcpStream, status: &str, body: &str) {
    let response = format!(
        "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = stream.write_all(response.as_bytes());
}

/// A plugin directory holding only the judge.
fn plugin_dir() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    drop_in(&plugin_lib("rlvr-verifier-judge"), dir.path(), "librlvr_verifier_judge.so");
    let path = dir.path().to_owned();
    (dir, path)
}

/// A score rubric 0–10 passing at 7, short limits, the breaker off unless a test is about it.
fn config(base: &str) -> Value {
    json!({
        "url": base, "model": "judge-test", "prompt": "{{sample}}",
        "rubric": {"kind": "score", "min": 0, "max": 10, "pass_threshold": 7},
        "timeout_ms": 500, "retries": 1, "backoff_ms": 10, "backoff_max_ms": 20, "breaker_failures": 0,
    })
}

fn item(id: &str, completion: &str) -> String {
    json!({"id": id, "prompt": "2+2?", "completion": completion, "reference": {"answer": "4"}}).to_string()
        + "\n"
}

/// Runs `rlvrctl verify` on `items`; returns the output lines, stderr and how long it took.
fn verify(
    config: &Value,
    extra: &[&str],
    env: &[(&str, &str)],
    items: &[String],
) -> (Output, Vec<Value>, String, Duration) {
    let (_dir, plugins) = plugin_dir();
    let mut command = command(&plugins, config, extra);
    for (name, value) in env {
        command.env(name, value);
    }
    let started = Instant::now();
    let mut child =
        command.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    child.stdin.take().unwrap().write_all(items.concat().as_bytes()).unwrap();
    let output = child.wait_with_output().unwrap();
    let elapsed = started.elapsed();
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    let lines = if output.status.success() { json_lines(&output.stdout) } else { Vec::new() };
    (output, lines, stderr, elapsed)
}

fn command(plugins: &Path, config: &Value, extra: &[&str]) -> Command {
    let mut command = Command::new(artifact("rlvrctl"));
    command
        .args(["verify", "--plugin", "judge", "--plugin-dir"])
        .arg(plugins)
        .args(["--plugin-config", &config.to_string()])
        .args(extra)
        .env_remove("RLVR_SERVER")
        .env_remove("JUDGE_TEST_KEY");
    command
}

/// What a test expects of one output line.
#[derive(Debug, Clone, Copy)]
struct Expect {
    id: &'static str,
    score: f64,
    passed: bool,
    attempts: f64,
    /// The start of the error, or `None` for no error.
    error: Option<&'static str>,
    timed_out: bool,
}

fn ok(id: &'static str, score: f64, passed: bool) -> Expect {
    Expect { id, score, passed, attempts: 1.0, error: None, timed_out: false }
}

fn error(id: &'static str, attempts: f64, error: &'static str) -> Expect {
    Expect { id, score: 0.0, passed: false, attempts, error: Some(error), timed_out: false }
}

fn check(lines: &[Value], expected: &[Expect]) {
    assert_eq!(lines.len(), expected.len(), "{lines:#?}");
    for (line, want) in lines.iter().zip(expected) {
        assert_eq!(line["id"], want.id, "{line}");
        assert_eq!(line["score"], want.score, "{line}");
        assert_eq!(line["passed"], want.passed, "{line}");
        assert_eq!(line["components"]["judge_attempts"], want.attempts, "{line}");
        match (line["error"].as_str(), want.error) {
            (None, None) => {}
            (Some(got), Some(start)) => {
                assert!(got.starts_with(start), "{line}\nexpected error starting {start:?}")
            }
            (got, start) => panic!("{line}: error {got:?}, expected {start:?}"),
        }
        assert_eq!(line["timed_out"], want.timed_out, "{line}");
        assert_eq!(line["verifier"], "judge@0.1.0", "{line}");
    }
}

#[test]
fn good_answers_on_a_score_and_a_label_rubric_and_the_request_the_judge_sees() {
    let judge = Judge::start();
    let items = [item("a", "score-8"), item("b", "score-3-fenced")];
    let (output, lines, stderr, _) =
        verify(&config(&judge.base), &["--parallel", "1", "--explain"], &[], &items);
    assert!(output.status.success(), "{stderr}");
    check(&lines, &[ok("a", 0.8, true), ok("b", 0.3, false)]);
    assert_eq!(lines[0]["extracted"], "8");
    assert_eq!(
        lines[0]["components"],
        json!({"judge_attempts": 1.0, "judge_prompt_tokens": 42.0, "judge_completion_tokens": 7.0})
    );
    let explanation = lines[0]["explanation"].to_string();
    for part in [
        "judge: model \\\"judge-test\\\" at http://127.0.0.1:",
        "rubric: score 0 to 10, normalised (s − 0) / (10 − 0), passes at 7 or more",
        "reason: right, but terse",
    ] {
        assert!(explanation.contains(part), "{part} not in {explanation}");
    }

    let received = judge.received();
    let request = &received[0].body;
    let schema = json!({"type": "object", "properties": {"reason": {"type": "string"},
                        "score": {"type": "number", "minimum": 0.0, "maximum": 10.0}},
                        "required": ["reason", "score"], "additionalProperties": false});
    assert_eq!(
        request,
        &json!({
            "model": "judge-test",
            "messages": [
                {"role": "system", "content": "Answer with exactly one JSON object and nothing else: {\"reason\": \"<one or two sentences>\", \"score\": <a number from 0 to 10>}"},
                {"role": "user", "content": "score-8"},
            ],
            "temperature": 0.0,
            "max_tokens": 512,
            "response_format": {"type": "json_schema", "json_schema": {"name": "judge_verdict", "strict": true, "schema": schema}},
        })
    );

    let mut labels = config(&judge.base);
    labels["rubric"] =
        json!({"kind": "label", "labels": ["correct", "incorrect"], "passing_labels": ["correct"]});
    labels["messages"] = json!([{"role": "system", "content": "Reference: {{item.reference.answer}}"}, {"role": "user", "content": "{{sample}}"}]);
    labels.as_object_mut().unwrap().remove("prompt");
    let (output, lines, stderr, _) =
        verify(&labels, &["--parallel", "1"], &[], &[item("c", "correct"), item("d", "incorrect")]);
    assert!(output.status.success(), "{stderr}");
    check(&lines, &[ok("c", 1.0, true), ok("d", 0.0, false)]);
    assert_eq!(lines[0]["extracted"], "correct");
    let received = judge.received();
    let request = &received.last().unwrap().body;
    assert_eq!(
        request["messages"][0]["content"],
        "Reference: 4\n\nAnswer with exactly one JSON object and nothing else: {\"reason\": \"<one or two sentences>\", \"label\": <one of \"correct\", \"incorrect\">}"
    );
}

#[test]
fn garbage_is_an_error_verdict_naming_what_was_wrong_never_a_score() {
    let judge = Judge::start();
    let mut labels = config(&judge.base);
    labels["rubric"] =
        json!({"kind": "label", "labels": ["correct", "incorrect"], "passing_labels": ["correct"]});
    let items = [
        item("prose", "garbage"),
        item("two", "two-objects"),
        item("range", "out-of-range"),
        item("label", "unknown-label"),
    ];
    let (output, lines, stderr, _) = verify(&config(&judge.base), &["--parallel", "1"], &[], &items);
    assert!(output.status.success(), "{stderr}");
    check(
        &lines,
        &[
            error(
                "prose",
                1.0,
                "the judge's reply is not a valid verdict: expected one JSON object, got text that is not JSON (expected value); the reply began: \"I would give this answer an 8 out of 10, it is mostly right.\"",
            ),
            error(
                "two",
                1.0,
                "the judge's reply is not a valid verdict: expected exactly one JSON object, got more than one; the reply began: \"{\"score\": 8} {\"score\": 2}\"",
            ),
            error(
                "range",
                1.0,
                "the judge's reply is not a valid verdict: score 11 is outside the rubric's range 0 to 10",
            ),
            error(
                "label",
                1.0,
                "the judge's reply is not a valid verdict: unknown key \"label\", expected only \"score\" and \"reason\"",
            ),
        ],
    );
    // Not retried: the judge would most likely say the same again.
    assert_eq!(judge.received().len(), 4);
    let (output, lines, stderr, _) =
        verify(&labels, &["--parallel", "1"], &[], &[item("label", "unknown-label")]);
    assert!(output.status.success(), "{stderr}");
    check(
        &lines,
        &[error(
            "label",
            1.0,
            "the judge's reply is not a valid verdict: label \"mostly correct\" is not one of the rubric's labels \"correct\", \"incorrect\"",
        )],
    );
}

#[test]
fn a_slow_judge_a_silent_judge_and_no_judge_are_retried_then_timeout_or_error_verdicts() {
    let judge = Judge::start();
    let items = [item("slow", "slow"), item("silent", "silent")];
    let (output, lines, stderr, elapsed) = verify(&config(&judge.base), &["--parallel", "2"], &[], &items);
    assert!(output.status.success(), "{stderr}");
    let timeout = "the judge did not answer within timeout_ms = 500 (attempt 2 of 2)";
    check(
        &lines,
        &[
            Expect { timed_out: true, ..error("slow", 2.0, timeout) },
            Expect { timed_out: true, ..error("silent", 2.0, timeout) },
        ],
    );
    // Two attempts of 500 ms and a backoff of at most 20 ms, not the 1.5 s or 10 s of the peer.
    assert!(elapsed < Duration::from_secs(5), "{elapsed:?}");

    let closed = TcpListener::bind("127.0.0.1:0").unwrap();
    let base = format!("http://{}/v1", closed.local_addr().unwrap());
    drop(closed);
    let (output, lines, stderr, _) = verify(&config(&base), &[], &[], &[item("nobody", "score-8")]);
    assert!(output.status.success(), "{stderr}");
    check(&lines, &[error("nobody", 2.0, "cannot reach the judge: Connection refused")]);
    assert!(lines[0]["error"].as_str().unwrap().ends_with("(attempt 2 of 2)"), "{}", lines[0]);
}

#[test]
fn the_breaker_opens_on_a_judge_that_is_down_and_then_answers_at_once() {
    let judge = Judge::start();
    let mut config = config(&judge.base);
    config["retries"] = json!(0);
    config["breaker_failures"] = json!(2);
    config["breaker_cooldown_ms"] = json!(60_000);
    let items = [item("d1", "down"), item("d2", "down"), item("d3", "score-8"), item("d4", "score-8")];
    let (output, lines, stderr, _) = verify(&config, &["--parallel", "1"], &[], &items);
    assert!(output.status.success(), "{stderr}");
    let down = "the judge answered 503 Service Unavailable: model is loading (attempt 1 of 1)";
    let open = "circuit breaker open (breaker_failures = 2 consecutive failed requests): failing fast";
    check(
        &lines,
        &[error("d1", 1.0, down), error("d2", 1.0, down), error("d3", 0.0, open), error("d4", 0.0, open)],
    );
    assert_eq!(judge.received().len(), 2, "an open breaker sent requests");
}

#[test]
fn the_api_key_is_a_secret_by_name_sent_as_a_bearer_token_and_never_printed() {
    let judge = Judge::start();
    let mut config = config(&judge.base);
    config["api_key_secret"] = json!("judge-key");
    let key = "sk-judge-test-5f1c";
    let (output, lines, stderr, _) = verify(
        &config,
        &["--explain", "--secret", "judge-key=JUDGE_TEST_KEY"],
        &[("JUDGE_TEST_KEY", key)],
        &[item("a", "score-8"), item("b", "garbage")],
    );
    assert!(output.status.success(), "{stderr}");
    check(&lines, &[ok("a", 0.8, true), error("b", 1.0, "the judge's reply is not a valid verdict")]);
    let received = judge.received();
    assert_eq!(received.len(), 2);
    for request in &received {
        assert_eq!(request.authorization.as_deref(), Some(format!("Bearer {key}").as_str()));
    }
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(!stdout.contains(key) && !stderr.contains(key), "the key leaked");

    // Not given: the config is refused naming the key, and an environment variable is never read.
    let (output, _, stderr, _) = verify(&config, &[], &[("JUDGE_TEST_KEY", key)], &[item("a", "score-8")]);
    assert!(!output.status.success());
    assert!(
        stderr.contains("api_key_secret: no secret named \"judge-key\" is available to this job"),
        "{stderr}"
    );
    config["api_key_env"] = json!("JUDGE_TEST_KEY");
    let (output, _, stderr, _) = verify(&config, &[], &[("JUDGE_TEST_KEY", key)], &[item("a", "score-8")]);
    assert!(!output.status.success());
    assert!(stderr.contains("api_key_env: environment variable names are not accepted"), "{stderr}");
    assert!(!stderr.contains(key), "the key leaked: {stderr}");
    assert_eq!(judge.received().len(), 2, "a refused config sent a request");
}
