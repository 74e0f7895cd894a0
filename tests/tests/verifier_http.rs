//! The http verifier through the real `.so` and `rlvrctl verify`, against a real HTTP service: a
//! Python stdlib server started per test whose behaviour is chosen by each item's id.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Output, Stdio};
use std::time::{Duration, Instant};

use rlvr_tests::{artifact, drop_in, free_port, json_lines, plugin_lib};
use serde_json::{Value, json};

/// The service. The item id's prefix (before the first `-`) picks the behaviour; `GET /` returns
/// how many requests each id got and how many distinct connections there were.
const SERVER: &str = r#"
import json, sys, threading, time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

LOCK = threading.Lock()
REQUESTS = {}
CONNECTIONS = set()

def graded(request):
    answer = str(request["reference"].get("answer", ""))
    got = request["completion"].strip()
    good = got == answer
    body = {"score": 1.0 if good else 0.0, "passed": good,
            "components": {"exact": 1.0 if good else 0.0}, "extracted": got}
    if request["explain"]:
        body["explanation"] = ["gold %s, pred %s" % (answer, got)]
    return json.dumps(body)

HUGE = json.dumps({"score": 1, "passed": True, "extracted": "x" * (2 << 20)})

class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True

    def log_message(self, *args):
        pass

    def reply(self, status, body, length=True, headers=()):
        data = body.encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        for name, value in headers:
            self.send_header(name, value)
        if length:
            self.send_header("Content-Length", str(len(data)))
        else:
            self.send_header("Connection", "close")
            self.close_connection = True
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        with LOCK:
            stats = {"requests": dict(REQUESTS), "connections": len(CONNECTIONS)}
        self.reply(200, json.dumps(stats))

    def do_POST(self):
        request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        item = request["id"]
        kind = item.split("-")[0]
        with LOCK:
            count = REQUESTS[item] = REQUESTS.get(item, 0) + 1
            CONNECTIONS.add(self.client_address)
        if kind == "ok":
            self.reply(200, graded(request))
        elif kind == "flaky":
            self.reply(500, "warming up") if count == 1 else self.reply(200, graded(request))
        elif kind == "ratelimited":
            self.reply(429, "slow down") if count == 1 else self.reply(200, graded(request))
        elif kind == "down":
            self.reply(503, "down for maintenance")
        elif kind == "notfound":
            self.reply(404, "no such route")
        elif kind == "moved":
            self.reply(302, "", headers=[("Location", "/elsewhere")])
        elif kind == "slow":
            time.sleep(int(item.split("-")[1]) / 1000)
            self.reply(200, graded(request))
        elif kind == "drip":
            self.send_response(200)
            self.send_header("Content-Length", "1000")
            self.end_headers()
            for _ in range(1000):
                self.wfile.write(b" ")
                self.wfile.flush()
                time.sleep(0.01)
        elif kind == "hangup":
            self.close_connection = True
        elif kind == "garbage":
            self.reply(200, "<html>not json</html>")
        elif kind == "types":
            self.reply(200, '{"score": "high", "passed": true}')
        elif kind == "nan":
            self.reply(200, json.dumps({"score": float("nan"), "passed": True}))
        elif kind == "unknown":
            self.reply(200, json.dumps({"score": 1, "passed": True, "pass": True}))
        elif kind == "huge":
            self.reply(200, HUGE)
        elif kind == "hugestream":
            self.reply(200, HUGE, length=False)
        elif kind == "serviceerror":
            self.reply(200, json.dumps({"score": 0.7, "passed": True, "extracted": "7",
                                        "components": {"exact": 1}, "error": "reference has no answer"}))
        elif kind == "echo":
            seen = {"request": request, "authorization": self.headers.get("Authorization"),
                    "team": self.headers.get("X-Team"), "content_type": self.headers.get("Content-Type")}
            self.reply(200, json.dumps({"score": 0.5, "passed": False, "extracted": json.dumps(seen)}))
        else:
            self.reply(400, "unknown behaviour " + kind)

class Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address):
        pass  # clients that gave up (the timeout tests) break the pipe; nothing to report

server = Server(("127.0.0.1", 0), Handler)
if len(sys.argv) == 3:
    import ssl
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(sys.argv[1], sys.argv[2])
    server.socket = context.wrap_socket(server.socket, server_side=True)
print(server.server_address[1], flush=True)
server.serve_forever()
"#;

/// The Python service on a port of its own, killed on drop.
struct Service {
    child: Child,
    url: String,
    _dir: tempfile::TempDir,
}

impl Service {
    fn start() -> Service {
        Service::spawn(&[], "http")
    }

    /// The same service over TLS, with the test certificate for 127.0.0.1 from `tests/data`.
    fn start_tls() -> Service {
        let data = tls_data();
        Service::spawn(&[data.join("server.pem"), data.join("server.key")], "https")
    }

    fn spawn(args: &[PathBuf], scheme: &str) -> Service {
        let dir = tempfile::tempdir().unwrap();
        let script = dir.path().join("service.py");
        std::fs::write(&script, SERVER).unwrap();
        let mut child = Command::new("python3")
            .arg(&script)
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("python3 runs the test service");
        let mut port = String::new();
        BufReader::new(child.stdout.take().unwrap()).read_line(&mut port).unwrap();
        let port: u16 = port.trim().parse().unwrap_or_else(|_| panic!("service port: {port:?}"));
        Service { child, url: format!("{scheme}://127.0.0.1:{port}/verify"), _dir: dir }
    }

    /// (requests per item id, distinct connections) so far; plain HTTP services only.
    fn stats(&self) -> (Value, u64) {
        let stats: Value = rlvr_tests::http_get(&self.url).unwrap().json().unwrap();
        (stats["requests"].clone(), stats["connections"].as_u64().unwrap())
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A test CA and a certificate for 127.0.0.1 it signed (valid 2000–2100; see the README there).
fn tls_data() -> PathBuf {
    rlvr_tests::workspace_root().join("tests/data/verifier_http")
}

/// A plugin directory holding only the http verifier.
fn plugin_dir() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    drop_in(&plugin_lib("rlvr-verifier-http"), dir.path(), "librlvr_verifier_http.so");
    let path = dir.path().to_owned();
    (dir, path)
}

fn command(plugins: &Path, config: &Value, extra: &[&str]) -> Command {
    let mut command = Command::new(artifact("rlvrctl"));
    command
        .args(["verify", "--plugin", "http", "--plugin-dir"])
        .arg(plugins)
        .args(["--plugin-config", &config.to_string()])
        .args(extra)
        .env_remove("RLVR_SERVER")
        .env_remove("HTTP_TEST_TOKEN")
        .env_remove("SSL_CERT_FILE")
        .env_remove("SSL_CERT_DIR");
    command
}

/// One item line: the id picks the service's behaviour; `answer` is the gold.
fn item(id: &str, completion: &str) -> String {
    json!({"id": id, "prompt": "2+2?", "completion": completion, "reference": {"answer": "4"}}).to_string()
        + "\n"
}

/// Runs a whole batch; returns the output lines, stderr and how long it took.
fn verify(config: &Value, extra: &[&str], items: &[String]) -> (Vec<Value>, String, Duration) {
    let (_dir, plugins) = plugin_dir();
    let started = Instant::now();
    let output = run(&mut command(&plugins, config, extra), items.concat().as_bytes());
    let elapsed = started.elapsed();
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert!(output.status.success(), "rlvrctl failed: {stderr}");
    (json_lines(&output.stdout), stderr, elapsed)
}

fn run(command: &mut Command, stdin: &[u8]) -> Output {
    let mut child =
        command.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    child.stdin.take().unwrap().write_all(stdin).unwrap();
    child.wait_with_output().unwrap()
}

/// What a test expects of one output line.
#[derive(Debug, Clone, Copy)]
struct Expect {
    id: &'static str,
    passed: bool,
    score: f64,
    attempts: f64,
    /// The exact error, or `None` for no error.
    error: Option<&'static str>,
    timed_out: bool,
}

impl Expect {
    fn pass(id: &'static str, attempts: f64) -> Self {
        Expect { id, passed: true, score: 1.0, attempts, error: None, timed_out: false }
    }

    fn error(id: &'static str, attempts: f64, error: &'static str) -> Self {
        Expect { id, passed: false, score: 0.0, attempts, error: Some(error), timed_out: false }
    }

    fn timeout(id: &'static str, attempts: f64, error: &'static str) -> Self {
        Expect { timed_out: true, ..Expect::error(id, attempts, error) }
    }
}

fn check(lines: &[Value], expected: &[Expect]) {
    assert_eq!(lines.len(), expected.len(), "{lines:#?}");
    for (line, want) in lines.iter().zip(expected) {
        assert_eq!(line["id"], want.id, "{line}");
        assert_eq!(line["passed"], want.passed, "{line}");
        assert_eq!(line["score"], want.score, "{line}");
        assert_eq!(line["components"]["http_attempts"], want.attempts, "{line}");
        assert_eq!(line["error"].as_str(), want.error, "{line}");
        assert_eq!(line["timed_out"], want.timed_out, "{line}");
        assert_eq!(line["verifier"], "http@0.1.0", "{line}");
    }
}

/// Small backoffs keep the tests fast; the breaker is off unless a test is about it.
fn config(service: &Service) -> Value {
    json!({"url": service.url, "timeout_ms": 2000, "backoff_ms": 10, "backoff_max_ms": 40, "breaker_failures": 0})
}

#[test]
fn verdicts_components_and_the_request_as_the_service_sees_it() {
    let service = Service::start();
    let mut config = config(&service);
    config["bearer_token_secret"] = json!("grader-token");
    config["headers"] = json!({"X-Team": "math"});
    let (_dir, plugins) = plugin_dir();
    let input = [item("ok-right", " 4\n"), item("ok-wrong", "5"), item("echo-1", "completion text")].concat();
    let output = run(
        command(&plugins, &config, &["--parallel", "1", "--secret", "grader-token=HTTP_TEST_TOKEN"])
            .env("HTTP_TEST_TOKEN", "s3cret-token"),
        input.as_bytes(),
    );
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    let lines = json_lines(&output.stdout);
    check(
        &lines,
        &[
            Expect::pass("ok-right", 1.0),
            Expect { passed: false, score: 0.0, ..Expect::pass("ok-wrong", 1.0) },
            Expect { passed: false, score: 0.5, ..Expect::pass("echo-1", 1.0) },
        ],
    );
    assert_eq!(lines[0]["components"], json!({"exact": 1.0, "http_attempts": 1.0}));
    assert_eq!(lines[0]["extracted"], "4");
    assert_eq!(lines[1]["components"], json!({"exact": 0.0, "http_attempts": 1.0}));
    assert_eq!(lines[1]["extracted"], "5");
    let seen: Value = serde_json::from_str(lines[2]["extracted"].as_str().unwrap()).unwrap();
    assert_eq!(
        seen,
        json!({
            "request": {"id": "echo-1", "prompt": "2+2?", "completion": "completion text",
                        "reference": {"answer": "4"}, "explain": false},
            "authorization": "Bearer s3cret-token",
            "team": "math",
            "content_type": "application/json",
        })
    );
    assert!(!stderr.contains("s3cret"), "the token leaked: {stderr}");

    // The secret not given: the config is refused naming the key, not the environment.
    let output = run(command(&plugins, &config, &[]).env("HTTP_TEST_TOKEN", "s3cret-token"), b"");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success());
    assert!(
        stderr.contains("bearer_token_secret: no secret named \"grader-token\" is available to this job"),
        "{stderr}"
    );
    assert!(!stderr.contains("s3cret"), "the token leaked: {stderr}");
}

// regression: a spec's bearer_token_env sent any variable of the daemon's environment to any
// server, and "environment variable X is not set" told which variables exist
#[test]
fn an_environment_variable_is_never_a_token_and_the_refusal_says_nothing_of_the_environment() {
    let service = Service::start();
    let (_dir, plugins) = plugin_dir();
    let refusal = |variable: &str| {
        let mut config = config(&service);
        config["bearer_token_env"] = json!(variable);
        let output = run(command(&plugins, &config, &[]).env("HTTP_TEST_TOKEN", "s3cret-token"), b"");
        assert!(!output.status.success(), "{variable}");
        String::from_utf8_lossy(&output.stderr).replace(variable, "VARIABLE")
    };
    let (set, unset) = (refusal("HTTP_TEST_TOKEN"), refusal("RLVR_TEST_NO_SUCH_VARIABLE"));
    assert_eq!(set, unset);
    assert!(
        set.contains(
            "bearer_token_env: environment variable names are not accepted; ask the daemon's operator"
        ),
        "{set}"
    );
    assert!(!set.contains("s3cret"), "{set}");
    // Nothing reached the service.
    assert_eq!(service.stats().0, json!({}));
}

#[test]
fn config_errors_name_the_key() {
    let (_dir, plugins) = plugin_dir();
    let cases: &[(Value, &str)] = &[
        (json!({}), "url: missing (expected the service's http:// or https:// URL)"),
        (json!({"url": "ftp://h/"}), "url: expected an http:// or https:// URL, got scheme \"ftp\""),
        (
            json!({"url": "http://h/", "retry_on": ["4xx"]}),
            "retry_on[0]: expected one of connect, timeout, 5xx, 429, got \"4xx\"",
        ),
        (json!({"url": "http://h/", "timeout_ms": 20000}), "exceeds the 25000 ms cap"),
        (
            json!({"url": "http://h/", "time_out": 1}),
            "time_out: unknown key; expected one of url, timeout_ms",
        ),
    ];
    for (config, message) in cases {
        let output = run(&mut command(&plugins, config, &[]), b"");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success(), "{config}");
        assert!(stderr.contains(message), "{config}: {stderr}");
    }
}

#[test]
fn transient_failures_are_retried_and_the_rest_are_not() {
    let service = Service::start();
    let items = [
        "flaky-1",
        "ratelimited-1",
        "notfound-1",
        "moved-1",
        "garbage-1",
        "types-1",
        "nan-1",
        "unknown-1",
        "serviceerror-1",
        "ok-after",
    ]
    .map(|id| item(id, "4"));
    let (lines, stderr, _) = verify(&config(&service), &["--parallel", "3"], &items);
    check(
        &lines,
        &[
            Expect::pass("flaky-1", 2.0),
            Expect::pass("ratelimited-1", 2.0),
            Expect::error(
                "notfound-1",
                1.0,
                "the service answered 404 Not Found: no such route (attempt 1 of 3, not retried)",
            ),
            Expect::error(
                "moved-1",
                1.0,
                "the service answered 302 Found (redirects are not followed) (attempt 1 of 3, not retried)",
            ),
            Expect::error(
                "garbage-1",
                1.0,
                "response: invalid JSON: expected value at line 1 column 1 (attempt 1 of 3, not retried)",
            ),
            Expect::error(
                "types-1",
                1.0,
                "response field score: expected a finite number, got \"high\" (attempt 1 of 3, not retried)",
            ),
            Expect::error(
                "nan-1",
                1.0,
                "response: invalid JSON: expected value at line 1 column 11 (NaN and Infinity are not JSON: numbers \
                 must be finite) (attempt 1 of 3, not retried)",
            ),
            Expect::error(
                "unknown-1",
                1.0,
                "response field pass: unknown (expected only score, passed, components, extracted, error, \
                 explanation) (attempt 1 of 3, not retried)",
            ),
            Expect::error("serviceerror-1", 1.0, "service: reference has no answer"),
            Expect::pass("ok-after", 1.0),
        ],
    );
    // A service error keeps what the service said it graded, but not its score.
    assert_eq!(lines[8]["extracted"], "7");
    assert_eq!(lines[8]["components"], json!({"exact": 1.0, "http_attempts": 1.0}));
    assert!(stderr.contains("10 item(s) verified with http@0.1.0: 3 passed, 7 with errors"), "{stderr}");
    let (requests, _) = service.stats();
    assert_eq!(requests["flaky-1"], 2);
    assert_eq!(requests["notfound-1"], 1);
    assert_eq!(requests["nan-1"], 1);
}

#[test]
fn a_service_that_is_down_gives_an_error_after_bounded_retries() {
    let service = Service::start();
    let refused = format!("http://127.0.0.1:{}/verify", free_port());
    let mut unreachable = config(&service);
    unreachable["url"] = json!(refused);
    let (lines, _, elapsed) = verify(&config(&service), &[], &[item("down-1", "4"), item("hangup-1", "4")]);
    check(
        &lines[..1],
        &[Expect::error(
            "down-1",
            3.0,
            "the service answered 503 Service Unavailable: down for maintenance (attempt 3 of 3)",
        )],
    );
    // The connection closed without an answer: hyper's wording of it is not ours to pin.
    let hangup = lines[1]["error"].as_str().unwrap();
    assert!(
        hangup.starts_with("cannot reach the service: ") && hangup.ends_with("(attempt 3 of 3)"),
        "{hangup}"
    );
    assert_eq!(lines[1]["components"]["http_attempts"], 3.0);
    let (requests, _) = service.stats();
    assert_eq!(requests, json!({"down-1": 3, "hangup-1": 3}));
    // 2 backoffs of at most 40 ms each; the bound only catches a hang.
    assert!(elapsed < Duration::from_secs(10), "took {elapsed:?}");

    let (lines, _, elapsed) = verify(&unreachable, &[], &[item("ok-1", "4")]);
    check(
        &lines,
        &[Expect::error(
            "ok-1",
            3.0,
            "cannot reach the service: Connection refused (os error 111) (attempt 3 of 3)",
        )],
    );
    assert!(elapsed < Duration::from_secs(10), "took {elapsed:?}");
}

#[test]
fn a_slow_service_gives_timeout_verdicts_within_the_item_budget() {
    let service = Service::start();
    let mut config = config(&service);
    config["timeout_ms"] = json!(300);
    config["retries"] = json!(1);
    let items = [item("slow-3000", "4"), item("drip-1", "4"), item("slow-10", "4")];

    // Timeouts are not retried by default: one attempt each.
    let (lines, _, _) = verify(&config, &["--parallel", "3"], &items);
    check(
        &lines,
        &[
            Expect::timeout(
                "slow-3000",
                1.0,
                "the service did not answer within timeout_ms = 300 (attempt 1 of 2, not retried)",
            ),
            Expect::timeout(
                "drip-1",
                1.0,
                "the service did not answer within timeout_ms = 300 (attempt 1 of 2, not retried)",
            ),
            Expect::pass("slow-10", 1.0),
        ],
    );
    // The host's measure of each call: cut at timeout_ms, whether the service is silent or drips
    // its body a byte at a time (10 s in all).
    for line in &lines[..2] {
        let latency = line["latency_us"].as_u64().unwrap();
        assert!((300_000..1_500_000).contains(&latency), "{line}");
    }

    // With "timeout" in retry_on: two attempts, still within (retries + 1) × timeout_ms + backoff.
    config["retry_on"] = json!(["timeout"]);
    let (lines, _, _) = verify(&config, &[], &[item("slow-3000", "4")]);
    check(
        &lines,
        &[Expect::timeout(
            "slow-3000",
            2.0,
            "the service did not answer within timeout_ms = 300 (attempt 2 of 2)",
        )],
    );
    let latency = lines[0]["latency_us"].as_u64().unwrap();
    assert!((600_000..2_000_000).contains(&latency), "{}", lines[0]);
}

#[test]
fn responses_over_max_response_bytes_are_refused() {
    let service = Service::start();
    let mut config = config(&service);
    config["max_response_bytes"] = json!(65536);
    let items = [item("huge-1", "4"), item("hugestream-1", "4"), item("ok-1", "4")];
    let (lines, _, _) = verify(&config, &["--parallel", "1"], &items);
    let too_large = "response body larger than max_response_bytes = 65536 (attempt 1 of 3, not retried)";
    check(
        &lines,
        &[
            Expect::error("huge-1", 1.0, too_large),
            Expect::error("hugestream-1", 1.0, too_large),
            Expect::pass("ok-1", 1.0),
        ],
    );
    // The default limit (1 MiB) refuses the 2 MiB answer too.
    let (lines, _, _) = verify(&json!({"url": service.url}), &[], &[item("huge-2", "4")]);
    assert_eq!(
        lines[0]["error"],
        "response body larger than max_response_bytes = 1048576 (attempt 1 of 3, not retried)"
    );
}

/// `rlvrctl verify` fed line by line, so that time can pass between items.
struct Session {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    _dir: tempfile::TempDir,
}

impl Session {
    fn start(config: &Value) -> Session {
        let (dir, plugins) = plugin_dir();
        let mut child = command(&plugins, config, &["--parallel", "1"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let stdin = child.stdin.take().unwrap();
        let stdout = BufReader::new(child.stdout.take().unwrap());
        Session { child, stdin, stdout, _dir: dir }
    }

    /// Sends one item and waits for its line.
    fn verify(&mut self, id: &str) -> Value {
        self.stdin.write_all(item(id, "4").as_bytes()).unwrap();
        self.stdin.flush().unwrap();
        let mut line = String::new();
        self.stdout.read_line(&mut line).unwrap();
        serde_json::from_str(&line).unwrap_or_else(|error| panic!("{line:?}: {error}"))
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn the_breaker_opens_fails_fast_probes_and_recovers() {
    let service = Service::start();
    let mut config = config(&service);
    config["retries"] = json!(0);
    config["breaker_failures"] = json!(3);
    config["breaker_cooldown_ms"] = json!(1000);
    let mut session = Session::start(&config);
    let down = "the service answered 503 Service Unavailable: down for maintenance (attempt 1 of 1)";
    let open = "circuit breaker open (breaker_failures = 3 consecutive failed requests): failing fast without a \
                request until a probe succeeds (breaker_cooldown_ms = 1000)";
    let mut lines = Vec::new();
    for id in ["down-1", "down-2", "down-3", "ok-refused-1"] {
        lines.push(session.verify(id));
    }
    // The cooldown passes; the probe fails and reopens the breaker.
    std::thread::sleep(Duration::from_millis(1100));
    for id in ["down-probe-1", "ok-refused-2"] {
        lines.push(session.verify(id));
    }
    // The cooldown passes again; the probe succeeds and closes it.
    std::thread::sleep(Duration::from_millis(1100));
    for id in ["ok-probe-2", "ok-closed"] {
        lines.push(session.verify(id));
    }
    check(
        &lines,
        &[
            Expect::error("down-1", 1.0, down),
            Expect::error("down-2", 1.0, down),
            Expect::error("down-3", 1.0, down),
            Expect::error("ok-refused-1", 0.0, open),
            Expect::error("down-probe-1", 1.0, down),
            Expect::error("ok-refused-2", 0.0, open),
            Expect::pass("ok-probe-2", 1.0),
            Expect::pass("ok-closed", 1.0),
        ],
    );
    // Refused items never reached the service, and failed fast.
    let (requests, _) = service.stats();
    assert_eq!(
        requests,
        json!({"down-1": 1, "down-2": 1, "down-3": 1, "down-probe-1": 1, "ok-probe-2": 1, "ok-closed": 1})
    );
    assert!(lines[3]["latency_us"].as_u64().unwrap() < 50_000, "{}", lines[3]);
}

#[test]
fn the_breaker_stops_an_items_retries() {
    let service = Service::start();
    let mut config = config(&service);
    config["retries"] = json!(3);
    config["breaker_failures"] = json!(2);
    let (lines, _, _) = verify(&config, &["--parallel", "1"], &[item("down-1", "4"), item("ok-1", "4")]);
    check(
        &lines,
        &[
            Expect::error(
                "down-1",
                2.0,
                "the service answered 503 Service Unavailable: down for maintenance (attempt 2 of 4, retries \
                 stopped: circuit breaker open)",
            ),
            Expect::error(
                "ok-1",
                0.0,
                "circuit breaker open (breaker_failures = 2 consecutive failed requests): failing fast without a \
                 request until a probe succeeds (breaker_cooldown_ms = 5000)",
            ),
        ],
    );
}

#[test]
fn verdicts_are_deterministic_across_runs_and_thread_counts_and_connections_are_reused() {
    let mut items: Vec<String> =
        (0..40).map(|i| item(&format!("ok-{i}"), if i % 3 == 0 { "5" } else { "4" })).collect();
    items.extend(
        ["flaky-1", "ratelimited-1", "notfound-1", "types-1", "serviceerror-1"].map(|id| item(id, "4")),
    );
    let mut outputs = Vec::new();
    for parallel in ["1", "8", "8"] {
        // A fresh service each run: flaky and ratelimited fail their first request again.
        let service = Service::start();
        let (mut lines, _, _) = verify(&config(&service), &["--parallel", parallel], &items);
        for line in &mut lines {
            line.as_object_mut().unwrap().remove("latency_us");
        }
        let (_, connections) = service.stats();
        // Reused connections: about one per thread, not one per request (47 requests). Not exactly
        // one per thread: a connection goes back to the pool a moment after its body was read,
        // and a thread quick enough to send again first opens another.
        let most = 2 * parallel.parse::<u64>().unwrap();
        assert!((1..=most).contains(&connections), "{connections} connections with --parallel {parallel}");
        outputs.push(lines);
    }
    assert_eq!(outputs[0].len(), 45);
    assert_eq!(outputs[0], outputs[1]);
    assert_eq!(outputs[1], outputs[2]);
}

#[test]
fn explanations_only_when_asked() {
    let service = Service::start();
    let items = [item("flaky-1", "4"), item("echo-1", "4")];
    let (lines, _, _) = verify(&config(&service), &["--parallel", "1", "--explain"], &items);
    assert_eq!(
        lines[0]["explanation"],
        json!([
            "attempt 1 of 3: the service answered 500 Internal Server Error: warming up",
            "attempt 2: valid verdict from the service",
            "service: gold 4, pred 4",
        ])
    );
    let seen: Value = serde_json::from_str(lines[1]["extracted"].as_str().unwrap()).unwrap();
    assert_eq!(seen["request"]["explain"], true);

    let (lines, _, _) = verify(&config(&service), &["--parallel", "1"], &[item("flaky-2", "4")]);
    assert!(lines[0].get("explanation").is_none(), "{}", lines[0]);
}

#[test]
fn https_with_the_trusted_roots_and_a_clear_error_without() {
    let service = Service::start_tls();
    let (_dir, plugins) = plugin_dir();
    let config = json!({"url": service.url, "breaker_failures": 0});
    let trusted = run(
        command(&plugins, &config, &[]).env("SSL_CERT_FILE", tls_data().join("ca.pem")),
        item("ok-1", "4").as_bytes(),
    );
    let lines = json_lines(&trusted.stdout);
    check(&lines, &[Expect::pass("ok-1", 1.0)]);

    // The system's roots do not know the test CA: the handshake fails and says why.
    let untrusted = run(&mut command(&plugins, &config, &[]), item("ok-2", "4").as_bytes());
    let lines = json_lines(&untrusted.stdout);
    let error = lines[0]["error"].as_str().unwrap();
    assert_eq!(
        error,
        "TLS handshake with the service failed: invalid peer certificate: UnknownIssuer (attempt 1 of 3, not retried)"
    );
    assert_eq!(lines[0]["components"]["http_attempts"], 1.0);
}

#[test]
fn the_readme_example_service_works_as_documented() {
    let readme =
        std::fs::read_to_string(rlvr_tests::workspace_root().join("plugins/verifier-http/README.md"))
            .unwrap();
    let section = &readme[readme.find("## An example service").expect("the example's section")..];
    let start = section.find("```python\n").expect("a python block") + "```python\n".len();
    let code = &section[start..start + section[start..].find("```").unwrap()];
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("verifier_service.py");
    std::fs::write(&script, code).unwrap();
    let port = free_port();
    let mut child =
        Command::new("python3").arg(&script).arg(port.to_string()).stderr(Stdio::null()).spawn().unwrap();
    let up = rlvr_tests::wait_until(Duration::from_secs(10), || {
        std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
    });
    let items = [item("right", "Let me think.\n4"), item("wrong", "five")];
    let config = json!({"url": format!("http://127.0.0.1:{port}/")});
    let result = up.then(|| verify(&config, &["--parallel", "2", "--explain"], &items));
    let _ = child.kill();
    let _ = child.wait();
    let (lines, _, _) = result.expect("the example service listens");
    check(
        &lines,
        &[Expect::pass("right", 1.0), Expect { passed: false, score: 0.0, ..Expect::pass("wrong", 1.0) }],
    );
    assert_eq!(lines[0]["components"], json!({"exact": 1.0, "http_attempts": 1.0}));
    assert_eq!(lines[1]["extracted"], "five");
    assert_eq!(lines[0]["explanation"][1], "service: gold '4', pred '4' (last line)");
}

#[test]
fn the_daemon_loads_it_and_shows_its_note_on_tls_roots() {
    // No Redis is needed to load plugins.
    let daemon = rlvr_tests::Daemon::start(&["rlvr-verifier-http"], "redis://127.0.0.1:1");
    let mut listed = Value::Null;
    let loaded = rlvr_tests::wait_until(Duration::from_secs(20), || {
        listed = daemon.get_json("/v1/plugins");
        listed["plugins"].as_array().is_some_and(|plugins| !plugins.is_empty())
    });
    assert!(loaded, "{listed}\n{}", daemon.log());
    let plugin = &listed["plugins"][0];
    assert_eq!(plugin["id"], "http@0.1.0", "{plugin}");
    let note = plugin["notes"][0].as_str().unwrap_or_default();
    assert!(
        note.starts_with("https: rustls (ring), ") && note.contains(" trusted root certificate(s) from "),
        "{plugin}"
    );
}
