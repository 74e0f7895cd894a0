//! The `code` verifier through its real `.so` and `rlvrctl verify --plugin code`: honest
//! solutions score what they earn, and an exploit suite — each exploit a way a naive harness
//! would award credit or hurt the host — scores 0 and leaves the host untouched.

use std::fs;
use std::io::Write;
use std::net::TcpListener;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use rlvr_tests::{Daemon, artifact, plugin_lib};
use serde_json::{Value, json};

/// A plugin dir with the code verifier, a work root for its sandboxes, and a canary directory
/// outside both that anyone may write to (so only the sandbox stands between it and a solution).
struct Setup {
    _dir: tempfile::TempDir,
    plugins: PathBuf,
    work_root: PathBuf,
    canary_dir: PathBuf,
    /// Holds the secrets; rlvrctl inherits it open (not close-on-exec) as [`INHERITED_FD`], as a
    /// process may from a shell or a library, and no solution may read it through that fd.
    inherited: PathBuf,
}

/// The fd number rlvrctl inherits [`Setup::inherited`] on.
const INHERITED_FD: u32 = 200;

/// In rlvrctl's environment; no solution may ever see it.
const ENV_SECRET: &str = "env-secret-5b0f1c";
/// Expected values of hidden tests; no solution may ever see them.
const TEST_SECRET: &str = "test-secret-93d2aa";

impl Setup {
    fn new() -> Setup {
        let dir = tempfile::tempdir().unwrap();
        let plugins = dir.path().join("plugins");
        let work_root = dir.path().join("work");
        let canary_dir = dir.path().join("canary");
        for path in [&plugins, &work_root, &canary_dir] {
            fs::create_dir(path).unwrap();
        }
        // World-writable: the sandbox's uid could write here if the sandbox let it.
        for path in [dir.path(), &canary_dir] {
            fs::set_permissions(path, fs::Permissions::from_mode(0o777)).unwrap();
        }
        fs::set_permissions(&work_root, fs::Permissions::from_mode(0o711)).unwrap();
        let canary = rlvr_tests::sandbox::write_canary(&canary_dir);
        fs::set_permissions(&canary, fs::Permissions::from_mode(0o666)).unwrap();
        rlvr_tests::drop_in(&plugin_lib("rlvr-verifier-code"), &plugins, "librlvr_verifier_code.so");
        let inherited = dir.path().join("inherited.txt");
        fs::write(&inherited, format!("{TEST_SECRET} {ENV_SECRET}\n")).unwrap();
        Setup { _dir: dir, plugins, work_root, canary_dir, inherited }
    }

    /// Runs one batch; returns the output lines (by id) and stderr. A config with a
    /// `run_budget_ms` gets rlvrctl's per-item deadline 10 s past it, as the plugin asks.
    fn verify(&self, items: &[Value], config: Value) -> (Vec<Value>, String) {
        let mut config = config;
        config["work_root"] = json!(self.work_root);
        let deadline_ms = config["run_budget_ms"].as_u64().map_or(30_000, |budget| budget + 10_000);
        // bash opens the file on an fd that is not close-on-exec, then becomes rlvrctl.
        let mut child = Command::new("/bin/bash")
            .arg("-c")
            .arg(format!("exec {INHERITED_FD}<\"$0\" && exec \"$@\""))
            .arg(&self.inherited)
            .arg(artifact("rlvrctl"))
            .args(["verify", "--plugin", "code", "--explain", "--parallel", "2", "--plugin-dir"])
            .arg(&self.plugins)
            .arg("--plugin-config")
            .arg(config.to_string())
            .args(["--deadline-ms", &deadline_ms.to_string()])
            .env_remove("RLVR_SERVER")
            .env("RLVR_CODE_TEST_SECRET", ENV_SECRET)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let input: String = items.iter().map(|item| item.to_string() + "\n").collect();
        let mut stdin = child.stdin.take().unwrap();
        let writer = std::thread::spawn(move || stdin.write_all(input.as_bytes()));
        let output = child.wait_with_output().unwrap();
        writer.join().unwrap().unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
        assert!(output.status.success(), "rlvrctl failed: {stderr}");
        let lines = rlvr_tests::json_lines(&output.stdout);
        assert_eq!(lines.len(), items.len(), "{stderr}");
        (lines, stderr)
    }

    /// Asserts that no sandboxed or evaluator process is left: none has its cwd under our work
    /// root, and the work root is empty.
    fn assert_nothing_left(&self) {
        rlvr_tests::sandbox::assert_nothing_left(&self.work_root);
    }

    fn assert_canary_untouched(&self) {
        rlvr_tests::sandbox::assert_canary_untouched(&self.canary_dir);
    }
}

fn asserts(id: &str, completion: &str, tests: &[&str]) -> Value {
    json!({"id": id, "completion": completion, "reference": {"language": "python", "asserts": tests}})
}

fn io(id: &str, completion: &str, cases: &[(&str, &str)]) -> Value {
    let cases: Vec<Value> =
        cases.iter().map(|(stdin, stdout)| json!({"stdin": stdin, "stdout": stdout})).collect();
    json!({"id": id, "completion": completion, "reference": {"language": "python", "io": cases}})
}

/// Expected (score, tests_passed, timeout, unsafe) of one line.
fn check(line: &Value, expected: (f64, f64, f64, f64)) {
    let got = (
        line["score"].as_f64().unwrap(),
        line["components"]["tests_passed"].as_f64().unwrap(),
        line["components"]["timeout"].as_f64().unwrap(),
        line["components"]["unsafe"].as_f64().unwrap(),
    );
    assert_eq!(got, expected, "{}: {line:#}", line["id"]);
    assert_eq!(line["error"], Value::Null, "{line:#}");
    assert_eq!(line["components"]["weak_isolation"], 0.0, "{line:#}");
}

const ADD: &str = "def add(a, b):\n    return a + b\n";
const ADD_TESTS: &[&str] = &["assert add(1, 2) == 3", "assert add(-4, 4) == 0", "assert add(10, 5) == 15"];

#[test]
fn honest_solutions_score_what_they_earn() {
    let setup = Setup::new();
    let stack = "class Stack:\n    def __init__(self):\n        self.items = []\n    def push(self, x):\n        \
                 self.items.append(x)\n        return self\n    def pop(self):\n        return self.items.pop()\n    \
                 def __len__(self):\n        return len(self.items)\n";
    let items = [
        asserts("fenced", &format!("Here you go:\n```python\n{ADD}```\nIt adds."), ADD_TESTS),
        asserts("partial", "def add(a, b):\n    return a + b if a < 5 else 0\n", ADD_TESTS),
        asserts("wrong", "def add(a, b):\n    return a * b\n", ADD_TESTS),
        asserts("syntax-error", "def add(a, b) return a + b", ADD_TESTS),
        asserts(
            "values",
            "def f(n):\n    return {'big': 2 ** 200, 'f': 0.5, 't': (1, 'a'), 's': {3, 1}, 'b': b'x', 'n': None, \
             'l': [True, [2]]}\n",
            &[
                "assert f(0)['big'] == 2 ** 200",
                "assert f(0)['f'] == 0.5 and f(0)['t'] == (1, 'a') and f(0)['s'] == {1, 3}",
                "assert f(0)['b'] == b'x' and f(0)['n'] is None and f(0)['l'] == [True, [2]]",
            ],
        ),
        asserts(
            "objects",
            stack,
            &["s = Stack().push(1).push(2)\nassert len(s) == 2\nassert s.pop() == 2\nassert s.items == [1]"],
        ),
        asserts(
            "exceptions-and-kwargs",
            "def sqrt(x, *, strict=True):\n    if x < 0 and strict:\n        raise ValueError('negative')\n    \
             return abs(x) ** 0.5\n",
            &[
                "try:\n    sqrt(-1)\nexcept ValueError:\n    pass\nelse:\n    raise AssertionError('no error')",
                "assert sqrt(-4, strict=False) == 2.0",
                "assert math.isclose(sqrt(2), 1.41421, rel_tol=1e-4)",
            ],
        ),
        json!({
            "id": "humaneval-check",
            "completion": "def incr_list(l):\n    return [x + 1 for x in l]\n",
            "reference": {"asserts": ["check(incr_list)"], "setup":
                "def check(candidate):\n    assert candidate([]) == []\n    assert candidate([3, 2, 1]) == [4, 3, 2]\n"}
        }),
        io(
            "io",
            "a, b = map(int, input().split())\nprint(a + b)\n",
            &[("1 2\n", "3\n"), ("5 5\n", "10  \n\n")],
        ),
        io("io-partial", "print(int(input()) * 2)", &[("2\n", "4\n"), ("3\n", "7\n"), ("x\n", "0\n")]),
        io(
            "io-main-guard",
            "import sys\ndef main():\n    print(sys.stdin.read().upper(), end='')\nif __name__ == '__main__':\n    main()\n",
            &[("ab\ncd\n", "AB\nCD\n")],
        ),
    ];
    let (lines, stderr) = setup.verify(&items, json!({}));
    let third = 1.0 / 3.0;
    let expected = [
        (1.0, 1.0, 0.0, 0.0),
        (2.0 / 3.0, 2.0 / 3.0, 0.0, 0.0),
        (0.0, 0.0, 0.0, 0.0),
        (0.0, 0.0, 0.0, 0.0),
        (1.0, 1.0, 0.0, 0.0),
        (1.0, 1.0, 0.0, 0.0),
        (1.0, 1.0, 0.0, 0.0),
        (1.0, 1.0, 0.0, 0.0),
        (1.0, 1.0, 0.0, 0.0),
        (third, third, 0.0, 0.0),
        (1.0, 1.0, 0.0, 0.0),
    ];
    for (line, expected) in lines.iter().zip(expected) {
        check(line, expected);
        assert_eq!(line["verifier"], "code@0.1.0");
    }
    assert!(stderr.contains("11 item(s) verified with code@0.1.0: 7 passed"), "{stderr}");
    // `extracted` is the code that ran: the fenced block only.
    assert_eq!(lines[0]["extracted"], ADD);
    // Explanations say which test failed and why.
    let explanation: Vec<&str> =
        lines[1]["explanation"].as_array().unwrap().iter().map(|l| l.as_str().unwrap()).collect();
    assert!(
        explanation.contains(&"test 3 failed: assert add(10, 5) == 15 (got 0, expected 15)"),
        "{explanation:?}"
    );
    assert!(explanation.contains(&"2 of 3 tests passed"), "{explanation:?}");
    let explanation = lines[3]["explanation"].to_string();
    assert!(
        explanation.contains("solution failed to load") && explanation.contains("SyntaxError"),
        "{explanation}"
    );
    let explanation = lines[9]["explanation"].to_string();
    assert!(
        explanation.contains(r#"test 2 failed: stdin \"3\\n\", expected \"7\\n\", got \"6\\n\""#),
        "{explanation}"
    );
    assert!(explanation.contains("ValueError"), "stderr of test 3 is shown: {explanation}");
    setup.assert_nothing_left();
}

#[test]
fn scoring_all_or_nothing_and_reference_errors() {
    let setup = Setup::new();
    let items = [
        asserts("partial", "def add(a, b):\n    return 3\n", ADD_TESTS),
        asserts("all", ADD, ADD_TESTS),
        json!({"id": "bad-language", "completion": ADD, "reference": {"language": "ruby", "asserts": ["x"]}}),
        json!({"id": "no-tests", "completion": ADD, "reference": {"asserts": []}}),
        json!({"id": "too-slow-ref", "completion": ADD, "reference": {"asserts": ["x"], "timeout_ms": 999999}}),
    ];
    let (lines, _) = setup.verify(&items, json!({"scoring": "all_or_nothing"}));
    assert_eq!(lines[0]["score"], 0.0, "{}", lines[0]);
    assert_eq!(lines[0]["components"]["tests_passed"], 1.0 / 3.0);
    assert_eq!((lines[1]["score"].as_f64(), lines[1]["passed"].as_bool()), (Some(1.0), Some(true)));
    let errors: Vec<&str> = lines[2..].iter().map(|l| l["error"].as_str().unwrap()).collect();
    assert_eq!(
        errors,
        [
            "reference.language: expected \"python\", got \"ruby\"",
            "reference.asserts: expected at least one test",
            "reference.timeout_ms: expected at most 10000 (max_timeout_ms), got 999999",
        ]
    );
}

#[test]
fn bad_configs_are_refused_naming_the_field() {
    let setup = Setup::new();
    for (config, message) in [
        (json!({"scoring": "mean"}), "scoring: expected one of fraction, all_or_nothing, got \"mean\""),
        (json!({"timeout": 5}), "timeout: unknown key; expected one of python, scoring, max_parallel"),
        (json!({"max_parallel": 0}), "max_parallel: expected a positive number"),
        (json!({"timeout_ms": 20000}), "timeout_ms: expected at most max_timeout_ms (10000), got 20000"),
        (json!({"python": "/nonexistent/python3"}), "python: cannot run /nonexistent/python3"),
        (
            json!({"allow_missing_layers": ["landlock"]}),
            "allow_missing_layers[0]: expected one of user_namespace, pid_namespace",
        ),
        (json!({"evaluator_memory_mb": 10}), "evaluator_memory_mb: expected at least 64"),
    ] {
        let mut config = config;
        config["work_root"] = json!(setup.work_root);
        let output = rlvr_tests::rlvrctl(
            &[
                "verify",
                "--plugin",
                "code",
                "--plugin-dir",
                setup.plugins.to_str().unwrap(),
                "--plugin-config",
                &config.to_string(),
            ],
            b"",
        );
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success(), "{config}");
        assert!(stderr.contains(message), "{config}: {stderr}");
    }
}

#[test]
fn exploits_score_zero_and_leave_the_host_untouched() {
    let setup = Setup::new();
    let canary = setup.canary_dir.join("canary.txt");
    let canary = canary.display();
    let canary_dir = setup.canary_dir.display();
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let port = listener.local_addr().unwrap().port();
    // A path-named datagram socket anyone may write to, like the journal's or /dev/log.
    let host_socket_path = setup.canary_dir.parent().unwrap().join("host.sock");
    let host_socket = UnixDatagram::bind(&host_socket_path).unwrap();
    host_socket.set_nonblocking(true).unwrap();
    fs::set_permissions(&host_socket_path, fs::Permissions::from_mode(0o777)).unwrap();
    let test_pid = std::process::id();
    let secret_tests: &[&str] = &[&format!("assert find() == {TEST_SECRET:?}")];
    // Looks everywhere a naive harness leaves tests, expected outputs or secrets.
    let snoop = format!(
        r#"import os, glob
def find():
    seen = []
    for path in glob.glob("/tmp/**", recursive=True) + glob.glob("./**", recursive=True) + \
            ["/proc/self/environ", "/proc/1/environ", "/proc/{test_pid}/environ", "/proc/self/cmdline",
             "/proc/{test_pid}/cmdline", "{canary}"]:
        try:
            with open(path, "rb") as f:
                seen.append(f.read(1 << 20))
        except Exception:
            pass
    for fd in range(0, 256):
        try:
            os.set_blocking(fd, False)
            seen.append(os.read(fd, 1 << 20))
        except Exception:
            pass
    seen.append(repr(dict(os.environ)).encode())
    for blob in seen:
        for secret in (b"{TEST_SECRET}", b"{ENV_SECRET}"):
            if secret in blob:
                return secret.decode()
    return "not found"
"#
    );
    let quick = json!({"asserts": ADD_TESTS, "timeout_ms": 400});
    let with_ref = |id: &str, code: &str, reference: &Value| json!({"id": id, "completion": code, "reference": reference});
    let items = [
        asserts("os-exit-before-asserts", "import os\nos._exit(0)\n", ADD_TESTS),
        asserts("sys-exit-before-asserts", "import sys\nsys.exit(0)\n", ADD_TESTS),
        asserts("exit-in-call", "import os\ndef add(a, b):\n    os._exit(0)\n", ADD_TESTS),
        asserts(
            "eq-always-true",
            "class Anything:\n    def __eq__(self, other):\n        return True\n    __hash__ = None\n\
             def add(a, b):\n    return Anything()\n",
            ADD_TESTS,
        ),
        asserts(
            "int-subclass-eq",
            "class Int(int):\n    def __eq__(self, other):\n        return True\ndef add(a, b):\n    return Int(0)\n",
            ADD_TESTS,
        ),
        asserts(
            "patched-builtins-and-helpers",
            "import builtins, math, operator\nbuiltins.AssertionError = type('Never', (BaseException,), {})\n\
             builtins.isinstance = lambda *a: True\nbuiltins.len = lambda x: 3\nmath.isclose = lambda *a, **k: True\n\
             operator.eq = lambda a, b: True\ndef area(r):\n    return 0\n",
            &["assert math.isclose(area(1), 3.14159, rel_tol=1e-3)", "assert len(str(area(2))) == 3"],
        ),
        asserts(
            "conftest-drop",
            "open('conftest.py', 'w').write('import pytest\\n@pytest.hookimpl(tryfirst=True)\\n\
             def pytest_runtest_call(item):\\n    pass\\n')\ndef add(a, b):\n    return -1\n",
            ADD_TESTS,
        ),
        asserts("read-tests-and-expected", &snoop, secret_tests),
        io("read-expected-io", &format!("{snoop}\nprint(find())"), &[("", &format!("{TEST_SECRET}\n"))]),
        asserts(
            "socket",
            &format!(
                "import socket\ndef add(a, b):\n    if a == -4:\n        s = socket.create_connection(('127.0.0.1', {port}))\n\
                 \x20       s.sendall(b'pwned')\n    return a + b\n"
            ),
            ADD_TESTS,
        ),
        with_ref(
            "fork-bomb",
            "import os\ndef add(a, b):\n    while True:\n        try:\n            os.fork()\n        except OSError:\n\
             \x20           pass\n",
            &json!({"asserts": ["assert add(1, 2) == 3"], "timeout_ms": 1000}),
        ),
        asserts(
            "memory-bomb",
            "def add(a, b):\n    hog = []\n    while True:\n        hog.append(bytearray(1 << 26))\n",
            &["assert add(1, 2) == 3"],
        ),
        with_ref("infinite-loop", "def add(a, b):\n    while True:\n        pass\n", &quick),
        with_ref(
            "sleep-past-timeout",
            "import time\ntime.sleep(60)\ndef add(a, b):\n    return a + b\n",
            &quick,
        ),
        asserts(
            "write-outside",
            &format!(
                "import os\nfor path in ['{canary}', '{canary_dir}/pwned', '/tmp/rlvr-code-pwned', \
                 os.path.expanduser('~/../pwned'), '../pwned']:\n    try:\n        open(path, 'w').write('pwned')\n\
                 \x20   except Exception:\n        pass\n    try:\n        os.remove(path)\n    except Exception:\n\
                 \x20       pass\ndef add(a, b):\n    return -1\n"
            ),
            ADD_TESTS,
        ),
        io(
            "print-1gb",
            "import sys\nchunk = 'x' * (1 << 20)\nfor _ in range(1024):\n    sys.stdout.write(chunk)\n",
            &[("", "3\n")],
        ),
        asserts(
            "signal-parent",
            &format!(
                "import os, signal\nfor pid in (os.getppid(), {test_pid}, 1, -1, 0):\n    try:\n        \
                 os.kill(pid, signal.SIGKILL) if pid not in (0, 1) else None\n    except Exception:\n        pass\n\
                 try:\n    os.killpg(os.getpgid({test_pid}), signal.SIGKILL)\nexcept Exception:\n    pass\n\
                 def add(a, b):\n    return -1\n"
            ),
            ADD_TESTS,
        ),
        asserts(
            "daemon-files",
            &format!(
                "def find():\n    out = ''\n    for path in ['{plugins}/librlvr_verifier_code.so', '/proc/self/environ', \
                 '/etc/passwd', '/root/.bashrc']:\n        try:\n            out += open(path, 'rb').read(64).hex()\n\
                 \x20       except Exception:\n            pass\n    return out\n",
                plugins = setup.plugins.display()
            ),
            &["assert find() != ''"],
        ),
        // `in` on a solution object: asking the solution would tell it the value looked for.
        asserts(
            "contains-anything",
            "class Anything:\n    def __contains__(self, value):\n        return True\n\
             def divisors(n):\n    return Anything()\n",
            &["assert 3 in divisors(12)", "assert 'x' in divisors(1)"],
        ),
        // StopIteration from a call would end the test's own iteration: all(...) of nothing.
        asserts(
            "stop-iteration",
            "def is_prime(n):\n    raise StopIteration\n",
            &["assert all(map(is_prime, [2, 3, 5]))", "assert list(filter(is_prime, [4, 6])) == []"],
        ),
        asserts(
            "datagram-to-host-socket",
            &format!(
                "import socket\ndef add(a, b):\n    if a == -4:\n        s, _ = socket.socketpair(socket.AF_UNIX, \
                 socket.SOCK_DGRAM)\n        s.sendto(b'pwned', '{}')\n    return a + b\n",
                host_socket_path.display()
            ),
            ADD_TESTS,
        ),
        // The host still answers honest work after all of the above.
        asserts("honest-after", ADD, ADD_TESTS),
    ];
    let started = Instant::now();
    // A smaller address space keeps the memory bomb's page faults (and the test) short.
    let (lines, stderr) = setup.verify(&items, json!({"memory_mb": 256}));
    let elapsed = started.elapsed();
    let expectations: &[(&str, f64, f64)] = &[
        // (id, timeout, unsafe); every score is 0
        ("os-exit-before-asserts", 0.0, 0.0),
        ("sys-exit-before-asserts", 0.0, 0.0),
        ("exit-in-call", 0.0, 0.0),
        ("eq-always-true", 0.0, 0.0),
        ("int-subclass-eq", 0.0, 0.0),
        ("patched-builtins-and-helpers", 0.0, 0.0),
        ("conftest-drop", 0.0, 0.0),
        ("read-tests-and-expected", 0.0, 0.0),
        ("read-expected-io", 0.0, 0.0),
        ("socket", 0.0, 1.0),
        ("fork-bomb", 1.0, 0.0),
        ("memory-bomb", 0.0, 0.0),
        ("infinite-loop", 1.0, 0.0),
        ("sleep-past-timeout", 1.0, 0.0),
        ("write-outside", 0.0, 0.0),
        ("print-1gb", 0.0, 0.0),
        ("signal-parent", 0.0, 0.0),
        ("daemon-files", 0.0, 0.0),
        ("contains-anything", 0.0, 0.0),
        ("stop-iteration", 0.0, 0.0),
        ("datagram-to-host-socket", 0.0, 1.0),
    ];
    for (line, (id, timeout, unsafe_)) in lines.iter().zip(expectations) {
        assert_eq!(line["id"], *id);
        assert_eq!(line["score"], 0.0, "{id}: {line:#}");
        assert_eq!(line["passed"], false, "{id}: {line:#}");
        assert_eq!(line["error"], Value::Null, "{id}: {line:#}");
        assert_eq!(line["components"]["timeout"], *timeout, "{id}: {line:#}");
        assert_eq!(line["components"]["unsafe"], *unsafe_, "{id}: {line:#}");
    }
    // The socket exploit passed its first test before it tried to connect: unsafe zeroes it.
    assert_eq!(lines[9]["components"]["tests_passed"], 1.0 / 3.0, "{:#}", lines[9]);
    check(lines.last().unwrap(), (1.0, 1.0, 0.0, 0.0));
    assert!(elapsed < Duration::from_secs(60), "took {elapsed:?}: {stderr}");
    // Host untouched: no connection, canary intact, nothing left running or on disk.
    assert!(listener.accept().is_err(), "a solution connected to the host");
    assert!(host_socket.recv(&mut [0; 64]).is_err(), "a solution sent to a host socket");
    setup.assert_canary_untouched();
    assert!(!Path::new("/tmp/rlvr-code-pwned").exists());
    setup.assert_nothing_left();
}

#[test]
fn parallel_runs_are_deterministic() {
    let setup = Setup::new();
    // Set iteration order of strings depends on the hash seed: fixed, so the output repeats.
    let completion = "print(' '.join({'pear', 'apple', 'fig', 'kiwi', 'plum'}))";
    let first = setup.verify(&[io("probe", completion, &[("", "x\n")])], json!({})).0;
    let got = first[0]["explanation"].to_string();
    let items: Vec<Value> = (0..8).map(|i| io(&format!("run-{i}"), completion, &[("", "x\n")])).collect();
    let (lines, _) = setup.verify(&items, json!({"max_parallel": 2}));
    for line in &lines {
        let explanation = line["explanation"].to_string();
        let tail = |text: &str| text.split("got").nth(1).map(str::to_owned);
        assert_eq!(tail(&explanation), tail(&got), "{line}");
    }
}

#[test]
fn the_daemon_lists_the_isolation_layers_as_notes() {
    let daemon = Daemon::start(&["rlvr-verifier-code"], "redis://127.0.0.1:1");
    let list = daemon.get_json("/v1/plugins");
    let code =
        list["plugins"].as_array().unwrap().iter().find(|p| p["name"] == "code").unwrap_or_else(|| {
            panic!("code verifier not loaded: {list:#}\n{}", daemon.log());
        });
    let notes: Vec<&str> = code["notes"].as_array().unwrap().iter().map(|n| n.as_str().unwrap()).collect();
    assert!(notes.iter().any(|n| n.starts_with("python: /usr/bin/python3 (3.")), "{notes:?}");
    // This machine's kernel (6.18) allows every layer; elsewhere the note names what is missing.
    assert!(
        notes.contains(
            &"isolation layers available: user_namespace, pid_namespace, network_namespace, mount_namespace, \
              ipc_namespace, landlock_fs, landlock_net, landlock_scopes, seccomp"
        ),
        "{notes:?}"
    );
    assert!(daemon.log().contains("isolation layers available"), "{}", daemon.log());
}

/// The trusted evaluator is bounded by what the solution makes it do: values built to be costly
/// to take in (hash collisions) or to keep (memory) end as the solution's failure or timeout
/// within the test's time, never as a verifier error, and a fresh evaluator serves the next item.
/// Only `collision-list-into-set` is about time (its 1 s test); the others have time to spare on
/// a loaded machine (`keep-large-values` passes ~250 MB through the pipes: 11 s here while other
/// work ran, 32 s with both cores loaded as well, past the 10 s its MemoryError used to get).
#[test]
fn costly_values_are_the_solutions_failure_and_bounded() {
    let setup = Setup::new();
    // 36,000 distinct ints with one hash: building a set of them is quadratic (seconds).
    let collide = "[(2**61 - 1) * k + 5 for k in range(36000)]";
    let raw_set = format!(
        "import os\ndef f():\n    os.write(4, ('{{\"ok\":{{\"set\":[%s]}}}}\\n' % ','.join(map(str, {collide}))).encode())\n    \
         return 0\n"
    );
    let raw_dict = format!(
        "import os\ndef f():\n    os.write(4, ('{{\"ok\":{{\"dict\":[%s]}}}}\\n' % ','.join('[%d,0]' % v for v in {collide})).encode())\n    \
         return 0\n"
    );
    let mut into_set = asserts(
        "collision-list-into-set",
        &format!("def f():\n    return {collide}\n"),
        &["assert len(set(f())) == 1"],
    );
    into_set["reference"]["timeout_ms"] = json!(1000);
    // Keeps 1 MB strings until the evaluator's address space runs out: MemoryError. About memory,
    // not time: its one test gets 2 minutes, so that a slow machine cannot make it a timeout.
    let mut keep_large = asserts(
        "keep-large-values",
        "def f(i):\n    return 'x' * 1000000 + str(i)\n",
        &["kept = [f(i) for i in range(1000)]\nassert len(kept) == 1000"],
    );
    keep_large["reference"]["timeout_ms"] = json!(120_000);
    let items = [
        asserts("collision-set-raw-reply", &raw_set, &["assert f() == {5}"]),
        asserts("collision-dict-raw-reply", &raw_dict, &["assert f() == {5: 0}"]),
        into_set,
        keep_large,
        // Test code that kills the evaluator after the solution answered: the rest fail.
        asserts(
            "evaluator-dies",
            ADD,
            &["assert add(1, 2) == 3", "add(1, 1)\n__import__('os')._exit(3)", "assert add(2, 2) == 4"],
        ),
        asserts("honest-after", ADD, ADD_TESTS),
    ];
    let started = Instant::now();
    // The run budget (per item) above every test's time, so that no item ends on it.
    let budget = Duration::from_secs(150);
    let config = json!({
        "evaluator_memory_mb": 256,
        "max_reply_bytes": 4 << 20,
        "timeout_ms": 10000,
        "max_timeout_ms": 120_000,
        "run_budget_ms": budget.as_millis() as u64,
    });
    let (lines, stderr) = setup.verify(&items, config);
    let elapsed = started.elapsed();
    let expectations: &[(&str, f64, f64, &str)] = &[
        // (id, score, timeout, in the explanation)
        ("collision-set-raw-reply", 0.0, 0.0, "hashes collide"),
        ("collision-dict-raw-reply", 0.0, 0.0, "hashes collide"),
        ("collision-list-into-set", 0.0, 1.0, "time limit on the solution's values"),
        ("keep-large-values", 0.0, 0.0, "MemoryError"),
        ("evaluator-dies", 1.0 / 3.0, 0.0, "the evaluator ended"),
    ];
    for (line, (id, score, timeout, reason)) in lines.iter().zip(expectations) {
        assert_eq!(line["id"], *id);
        assert_eq!(line["score"], *score, "{id}: {line:#}");
        assert_eq!(line["error"], Value::Null, "{id}: {line:#}");
        assert_eq!(line["components"]["timeout"], *timeout, "{id}: {line:#}");
        assert!(line["explanation"].to_string().contains(reason), "{id}: {line:#}");
    }
    check(lines.last().unwrap(), (1.0, 1.0, 0.0, 0.0));
    // Each costly item ends within its test's time, not the run budget: the items run two at a
    // time, so one that ran into its budget would hold the batch past it.
    assert!(elapsed < budget, "took {elapsed:?}: {stderr}");
    println!("the six items took {elapsed:.1?}");
    setup.assert_nothing_left();
}
