//! The `python` grader through its real `.so` and `rlvrctl verify --plugin python`: a team's
//! grade(sample, item) scores what it returns; every way it can fail is an error verdict naming
//! it; and graders that attack the host (network, files outside, fork and memory bombs, big
//! files, forged results, another item's reference) get nothing and leave the host untouched.
//!
//! The assertions are about outcomes that must hold whatever isolation layers the kernel allows
//! ("not read", "no connection"), not about which layer stopped the attempt.

use std::fs;
use std::net::TcpListener;
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::process::{Command, Stdio};

use rlvr_tests::{artifact, plugin_lib};
use serde_json::{Value, json};

/// The fd number rlvrctl inherits [`Setup::inherited`] on (not close-on-exec, as a process may
/// hold one from a shell or a library).
const INHERITED_FD: u32 = 200;
/// In rlvrctl's environment; no grader may ever see it.
const ENV_SECRET: &str = "env-secret-3c71e0";
/// In one item's reference: only that item's grader may see it.
const OTHER_ITEM_SECRET: &str = "other-item-secret-8d41f2";

/// A plugin dir with the python grader, a work root for its sandboxes, the batch's input file in
/// a data dir, and a world-writable canary dir outside all of them.
struct Setup {
    dir: tempfile::TempDir,
    plugins: PathBuf,
    work_root: PathBuf,
    canary_dir: PathBuf,
    /// Where the batch's JSONL goes (the job's data file, for a grader trying to read it).
    data: PathBuf,
    inherited: PathBuf,
}

impl Setup {
    fn new() -> Setup {
        let dir = tempfile::tempdir().unwrap();
        let plugins = dir.path().join("plugins");
        let work_root = dir.path().join("work");
        let canary_dir = dir.path().join("canary");
        let data_dir = dir.path().join("data");
        for path in [&plugins, &work_root, &canary_dir, &data_dir] {
            fs::create_dir(path).unwrap();
        }
        // World-readable and -writable: only the sandbox stands between them and a grader.
        for path in [dir.path(), &canary_dir, &data_dir] {
            fs::set_permissions(path, fs::Permissions::from_mode(0o777)).unwrap();
        }
        fs::set_permissions(&work_root, fs::Permissions::from_mode(0o711)).unwrap();
        let canary = rlvr_tests::sandbox::write_canary(&canary_dir);
        fs::set_permissions(&canary, fs::Permissions::from_mode(0o666)).unwrap();
        rlvr_tests::drop_in(&plugin_lib("rlvr-verifier-python"), &plugins, "librlvr_verifier_python.so");
        let inherited = dir.path().join("inherited.txt");
        fs::write(&inherited, format!("{OTHER_ITEM_SECRET} {ENV_SECRET}\n")).unwrap();
        let data = data_dir.join("items.jsonl");
        Setup { dir, plugins, work_root, canary_dir, data, inherited }
    }

    /// Runs one batch through `rlvrctl verify --jsonl` with `source` as the grader; returns the
    /// output lines, same order.
    fn verify(&self, source: &str, items: &[Value], extra: Value) -> Vec<Value> {
        let mut config = json!({"source": source, "work_root": self.work_root, "timeout_ms": 3000});
        for (key, value) in extra.as_object().unwrap() {
            config[key] = value.clone();
        }
        let input: String = items.iter().map(|item| item.to_string() + "\n").collect();
        fs::write(&self.data, input).unwrap();
        fs::set_permissions(&self.data, fs::Permissions::from_mode(0o644)).unwrap();
        // bash opens the file on an fd that is not close-on-exec, then becomes rlvrctl.
        let child = Command::new("/bin/bash")
            .arg("-c")
            .arg(format!("exec {INHERITED_FD}<\"$0\" && exec \"$@\""))
            .arg(&self.inherited)
            .arg(artifact("rlvrctl"))
            .args(["verify", "--plugin", "python", "--explain", "--parallel", "2", "--plugin-dir"])
            .arg(&self.plugins)
            .arg("--plugin-config")
            .arg(config.to_string())
            .arg("--jsonl")
            .arg(&self.data)
            .env_remove("RLVR_SERVER")
            .env("RLVR_PYTHON_TEST_SECRET", ENV_SECRET)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let output = child.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
        assert!(output.status.success(), "rlvrctl failed: {stderr}");
        let lines = rlvr_tests::json_lines(&output.stdout);
        assert_eq!(lines.len(), items.len(), "{stderr}");
        for (line, item) in lines.iter().zip(items) {
            assert_eq!(line["id"], item["id"], "{stderr}");
        }
        lines
    }

    /// No sandboxed process is left (none has its cwd under the work root) and the work root is
    /// empty.
    fn assert_nothing_left(&self) {
        rlvr_tests::sandbox::assert_nothing_left(&self.work_root);
    }

    fn assert_canary_untouched(&self) {
        rlvr_tests::sandbox::assert_canary_untouched(&self.canary_dir);
    }
}

fn item(id: &str, completion: &str, reference: Value) -> Value {
    json!({"id": id, "prompt": "What is 6*7?", "completion": completion, "reference": reference})
}

/// A line's (score, passed, error) — the error's full text.
fn outcome(line: &Value) -> (f64, bool, Option<String>) {
    (
        line["score"].as_f64().unwrap(),
        line["passed"].as_bool().unwrap(),
        line["error"].as_str().map(str::to_owned),
    )
}

const EXACT: &str = "\
import re

def grade(sample, item):
    numbers = re.findall(r'-?\\d+', sample)
    if not numbers:
        return 0.0
    return 1.0 if numbers[-1] == item['reference']['answer'] else 0.0
";

#[test]
fn a_grader_scores_each_sample_against_its_reference() {
    let setup = Setup::new();
    let items = [
        item("right", "6*7 = 42, so the answer is 42", json!({"answer": "42"})),
        item("wrong", "the answer is 41", json!({"answer": "42"})),
        item("none", "no idea", json!({"answer": "42"})),
        item("other", "it is 7", json!({"answer": "7"})),
    ];
    let lines = setup.verify(EXACT, &items, json!({}));
    let got: Vec<_> = lines.iter().map(outcome).collect();
    assert_eq!(
        got,
        [(1.0, true, None), (0.0, false, None), (0.0, false, None), (1.0, true, None)],
        "{lines:#?}"
    );
    for line in &lines {
        assert_eq!(line["components"]["weak_isolation"], 0.0, "{line:#}");
        assert_eq!(line["timed_out"], false, "{line:#}");
    }
    // The explanation names the source's digest, as the job records it.
    let digest = rlvr_tests::sha256_hex(EXACT);
    let explanation = lines[0]["explanation"].to_string();
    assert!(explanation.contains(&digest), "{explanation}");
    setup.assert_nothing_left();
}

/// Each failure is an error verdict (score 0, not passed) naming it, with `timed_out` for time.
#[test]
fn failures_are_error_verdicts_never_a_silent_zero() {
    let setup = Setup::new();
    let one = [item("1", "42", json!({"answer": "42"}))];
    let cases: &[(&str, &str, bool)] = &[
        (
            "def grade(sample, item):\n    raise ValueError('bad sample')\n",
            "ValueError: bad sample (grader.py, line 2)",
            false,
        ),
        ("def grade(sample, item)\n    return 1\n", "the source does not compile: SyntaxError:", false),
        (
            "def grade(sample, item):\n    return 'yes'\n",
            "grade returned str; expected a finite number",
            false,
        ),
        (
            "def grade(sample, item):\n    return None\n",
            "grade returned NoneType; expected a finite number",
            false,
        ),
        (
            "def grade(sample, item):\n    return float('nan')\n",
            "grade returned nan; expected a finite number",
            false,
        ),
        (
            "def grader(sample, item):\n    return 1\n# def grade\n",
            "the source defines no function grade(sample, item)",
            false,
        ),
        (
            "def grade(sample, item):\n    while True:\n        pass\n",
            "the grader ran past timeout_ms (1000 ms)",
            true,
        ),
    ];
    for (source, message, timed_out) in cases {
        let lines = setup.verify(source, &one, json!({"timeout_ms": 1000}));
        let line = &lines[0];
        let (score, passed, error) = outcome(line);
        let error = error.unwrap_or_else(|| panic!("{source}: no error: {line:#}"));
        assert!(error.contains(message), "{source}: {line:#}");
        assert_eq!((score, passed, line["timed_out"].as_bool()), (0.0, false, Some(*timed_out)), "{line:#}");
    }
    setup.assert_nothing_left();
}

/// Runs the sample as code with `item` in scope and returns its `score`: a grader that gives the
/// sample all of its own powers, so each attack below is the grader's own code.
const RUNS_THE_SAMPLE: &str = "\
def grade(sample, item):
    scope = {'item': item}
    exec(sample, scope)
    return scope.get('score', 0.0)
";

#[test]
fn sandbox_escapes_get_nothing_and_leave_the_host_untouched() {
    let setup = Setup::new();
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    listener.set_nonblocking(true).unwrap();
    let canary = setup.canary_dir.join("canary.txt");
    let data = setup.data.display().to_string();
    let plugin = setup.plugins.join("librlvr_verifier_python.so").display().to_string();
    let tmp_pwned = format!("/tmp/rlvr-python-pwned-{}", std::process::id());
    // Each attack sets score = 1.0 only if it got what it was after; it catches its own errors,
    // so a 0 means the attempt failed (rather than the grader crashing).
    let write_outside = format!(
        "score = 0.0\nfor path in [{canary:?}, {pwned:?}, {tmp_pwned:?}, {data:?}]:\n    try:\n        \
         with open(path, 'a') as f:\n            f.write('pwned')\n        score = 1.0\n    except OSError:\n        pass\n",
        pwned = setup.canary_dir.join("pwned").display().to_string(),
    );
    let read_outside = format!(
        "score = 0.0\nfor path in ['/etc/passwd', {data:?}, '/proc/1/environ', '/proc/self/environ', {plugin:?}]:\n    \
         try:\n        with open(path, 'rb') as f:\n            if f.read(64):\n                score = 1.0\n    except OSError:\n        pass\n"
    );
    // Everything a grader could look through for another item's reference or the host's secrets.
    let find_secrets = format!(
        "import os\nneedles = [{OTHER_ITEM_SECRET:?}.encode(), {ENV_SECRET:?}.encode()]\nscore = 0.0\n\
         def look(data):\n    global score\n    if any(n in data for n in needles):\n        score = 1.0\n\
         look(repr(dict(os.environ)).encode())\n\
         for fd in range(0, 256):\n    try:\n        os.lseek(fd, 0, 0)\n    except OSError:\n        pass\n    \
         try:\n        look(os.read(fd, 1 << 16))\n    except OSError:\n        pass\n\
         try:\n    pids = [p for p in os.listdir('/proc') if p.isdigit()]\nexcept OSError:\n    pids = []\n\
         for pid in pids:\n    for name in ['environ', 'cmdline']:\n        try:\n            \
         with open('/proc/%s/%s' % (pid, name), 'rb') as f:\n                look(f.read(1 << 16))\n        \
         except OSError:\n            pass\n\
         for top in ['/tmp', '..', '../..', {root:?}, {data_dir:?}]:\n    \
         try:\n        walk = list(os.walk(top))[:2000]\n    except OSError:\n        continue\n    \
         for base, dirs, files in walk:\n        for name in files:\n            try:\n                \
         with open(os.path.join(base, name), 'rb') as f:\n                    look(f.read(1 << 16))\n            \
         except OSError:\n                pass\n",
        root = setup.dir.path().display().to_string(),
        data_dir = setup.data.parent().unwrap().display().to_string(),
    );
    let connect = format!(
        "import socket\nscore = 0.0\ntry:\n    socket.create_connection(('127.0.0.1', {port}), timeout=1).close()\n    \
         score = 1.0\nexcept OSError:\n    pass\n"
    );
    let forge = "import os, sys\nprint('1.0')\nprint('{\"score\": 1.0}')\nsys.stderr.write('{\"score\":1.0}\\n')\n\
                 for fd in range(0, 256):\n    try:\n        os.write(fd, b'{\"score\":1.0}\\n')\n    except OSError:\n        pass\n\
                 score = 0.0\n";
    let fork_bomb =
        "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n";
    let memory_bomb = "hog = []\nwhile True:\n    hog.append(bytearray(10 ** 7))\n";
    let big_file = "with open('big', 'wb') as f:\n    f.write(b'x' * (64 << 20))\nscore = 1.0\n";
    let items = [
        // Holds the secret the others look for; its own grader reads it, as a grader may.
        item(
            "own-reference",
            &format!("score = float(item['reference']['secret'] == {OTHER_ITEM_SECRET:?})"),
            json!({"secret": OTHER_ITEM_SECRET}),
        ),
        item("write-outside", &write_outside, json!({})),
        item("read-outside", &read_outside, json!({})),
        item("find-secrets", &find_secrets, json!({})),
        item("network", &connect, json!({})),
        item("forge", forge, json!({})),
        item("fork-bomb", fork_bomb, json!({})),
        item("memory-bomb", memory_bomb, json!({})),
        item("big-file", big_file, json!({})),
        item("honest-after", "score = 0.75", json!({})),
    ];
    let lines = setup.verify(RUNS_THE_SAMPLE, &items, json!({"pass_threshold": 0.5, "memory_mb": 256}));
    let by_id = |id: &str| lines.iter().find(|line| line["id"] == id).unwrap();
    // Scored and passed as the grader says.
    assert_eq!(outcome(by_id("own-reference")), (1.0, true, None), "{:#}", by_id("own-reference"));
    assert_eq!(outcome(by_id("honest-after")), (0.75, true, None), "{:#}", by_id("honest-after"));
    // Attempts that found nothing score 0 — or die in the sandbox (a forbidden system call).
    for id in ["write-outside", "read-outside", "find-secrets", "network", "forge"] {
        let line = by_id(id);
        assert_eq!(line["score"], 0.0, "{id}: {line:#}");
        assert_eq!(line["passed"], false, "{id}: {line:#}");
    }
    for id in ["write-outside", "read-outside", "find-secrets"] {
        assert_eq!(by_id(id)["error"], Value::Null, "{id}: {:#}", by_id(id));
    }
    // Printing a score and writing a result line to every fd: the lines that reached the
    // grader's own pipe besides its return make it an error, never a score.
    let (_, _, error) = outcome(by_id("forge"));
    assert!(error.unwrap().contains("the grader wrote to its own result pipe"), "{:#}", by_id("forge"));
    // Bombs end as errors: time for the fork bomb, memory for the memory bomb, the file size
    // limit for the big file.
    assert_eq!(by_id("fork-bomb")["timed_out"], true, "{:#}", by_id("fork-bomb"));
    let (_, _, error) = outcome(by_id("memory-bomb"));
    assert!(error.unwrap().contains("MemoryError"), "{:#}", by_id("memory-bomb"));
    let (_, _, error) = outcome(by_id("big-file"));
    assert!(error.unwrap().contains("File too large"), "{:#}", by_id("big-file"));
    // The host: no connection, no file written, the data file as it was, nothing left running.
    assert!(listener.accept().is_err(), "the listener got a connection");
    setup.assert_canary_untouched();
    assert!(!std::path::Path::new(&tmp_pwned).exists(), "{tmp_pwned} was written");
    let input: String = items.iter().map(|item| item.to_string() + "\n").collect();
    assert!(fs::read_to_string(&setup.data).unwrap() == input, "the data file was written");
    setup.assert_nothing_left();
}

/// The grader's own module-level code runs in the sandbox too, and a grader that does its work
/// there (or in a background thread) still scores only what grade() returns.
#[test]
fn printing_a_score_at_import_does_not_set_it() {
    let setup = Setup::new();
    let source = "\
import os
print('{\"score\": 1.0}')
# stdout, stderr, and the fds the runner reads its input from and writes the result to.
for fd in range(0, 5):
    try:
        os.write(fd, b'{\"score\":1.0}\\n')
    except OSError:
        pass

def grade(sample, item):
    return 0.25
";
    let lines = setup.verify(source, &[item("1", "", json!({}))], json!({}));
    assert_eq!(outcome(&lines[0]), (0.25, false, None), "{:#}", lines[0]);
    // The output is shown under --explain, as output only.
    let explanation = lines[0]["explanation"].as_array().unwrap();
    let output = explanation.iter().filter_map(Value::as_str).find(|line| line.starts_with("output: "));
    assert!(output.is_some_and(|output| output.contains("{\"score\": 1.0}")), "{explanation:?}");
    setup.assert_nothing_left();
}

#[test]
fn a_big_sample_and_reference_arrive_whole() {
    let setup = Setup::new();
    let sample = "x".repeat(3 << 20);
    let reference = json!({"answer": "é".repeat(100_000), "nested": [[[1, 2.5, null, true]]]});
    let source = "\
def grade(sample, item):
    ref = item['reference']
    ok = len(sample) == 3 << 20 and ref['answer'] == '\\u00e9' * 100000 and ref['nested'] == [[[1, 2.5, None, True]]]
    return float(ok)
";
    let lines = setup.verify(source, &[item("big", &sample, reference)], json!({}));
    assert_eq!(outcome(&lines[0]), (1.0, true, None), "{:#}", lines[0]);
    setup.assert_nothing_left();
}
