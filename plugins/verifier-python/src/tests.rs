//! Unit tests: options, and real graders in the real sandbox through `verify`.

use std::path::Path;

use rlvr_plugin_api::VerifyItem;
use serde_json::json;

use super::*;

/// Options → accepted (the report's digest of `source` is checked by the caller) or refused at
/// `(key, start of the message)`.
fn check_options(json: Value, expected: Result<(), (&str, &str)>) {
    let json = json.to_string();
    let shown: String = json.chars().take(200).collect();
    match (PythonGrader::check_options(&json), expected) {
        (Ok(_), Ok(())) => {}
        (Err(error), Err((key, message))) => {
            assert_eq!(error.key, key, "{shown}: {error}");
            assert!(error.message.starts_with(message), "{shown}: {}", error.message);
        }
        (got, expected) => panic!("{shown}: got {got:?}, expected {expected:?}"),
    }
}

const GRADE: &str = "def grade(sample, item):\n    return 1.0\n";

// regression: a grader's own options asked for 1 TiB of memory and 4,096 processes on the daemon
#[test]
fn the_operators_caps_refuse_what_is_asked_beyond_them_and_lower_parallelism() {
    let caps = GraderCaps {
        memory_mb: 1024,
        max_file_mb: 8,
        max_processes: 32,
        max_parallel: 2,
        max_response_bytes: 1 << 20,
        work_root: Some(PathBuf::from("/srv/grader-work")),
    };
    // (options, refused at (key, message), or the parallelism and work root it runs with)
    type Held = Result<(usize, Option<&'static str>), (&'static str, &'static str)>;
    let cases: [(Value, Held); 6] = [
        // The defaults (max_file_mb 16 here) are lowered to the caps, not refused.
        (json!({"source": GRADE}), Ok((2, Some("/srv/grader-work")))),
        (json!({"source": GRADE, "memory_mb": 1024, "max_parallel": 1}), Ok((1, Some("/srv/grader-work")))),
        (json!({"source": GRADE, "work_root": "/tmp"}), Ok((2, Some("/tmp")))),
        (
            json!({"source": GRADE, "memory_mb": 1_048_576}),
            Err(("memory_mb", "expected at most 1024 on this host (graders.max_memory_mb), got 1048576")),
        ),
        (
            json!({"source": GRADE, "max_file_mb": 300}),
            Err(("max_file_mb", "expected at most 8 on this host (graders.max_file_mb), got 300")),
        ),
        (
            json!({"source": GRADE, "max_processes": 4096}),
            Err(("max_processes", "expected at most 32 on this host (graders.max_processes), got 4096")),
        ),
    ];
    for (options, expected) in cases {
        let mut config: PythonConfig = parse_options(&options.to_string()).unwrap();
        let held = within_caps(&mut config, &caps, &options)
            .map(|()| {
                (config.max_parallel, config.work_root.as_deref().and_then(Path::to_str).map(str::to_owned))
            })
            .map_err(|error| (error.key, error.message));
        let expected = expected
            .map(|(parallel, root)| (parallel, root.map(str::to_owned)))
            .map_err(|(key, message)| (key.to_owned(), message.to_owned()));
        assert_eq!(held, expected, "{options}");
        if expected.is_ok() && options.get("max_file_mb").is_none() {
            assert_eq!(config.max_file_mb, 8, "{options}: the default lowered to the cap");
        }
    }
}

#[test]
fn options_are_checked_naming_the_key_without_running_anything() {
    check_options(json!({"source": GRADE}), Ok(()));
    check_options(json!({"source": GRADE, "timeout_ms": 20000, "pass_threshold": 0.5}), Ok(()));
    check_options(json!({}), Err(("source", "missing; this key is required")));
    check_options(json!({"source": "  \n"}), Err(("source", "expected python source defining grade")));
    check_options(json!({"source": "def grader(x): pass"}), Ok(()));
    check_options(
        json!({"source": "def score(sample, item): return 1"}),
        Err(("source", "expected a function `def grade(sample, item)`")),
    );
    let big = format!("{GRADE}#{}", "x".repeat(MAX_SOURCE_BYTES));
    check_options(json!({"source": big}), Err(("source", "expected at most 65536 bytes, got 65577")));
    check_options(json!({"source": 3}), Err(("source", "expected a string, got integer `3`")));
    check_options(
        json!({"source": GRADE, "timeout": 1}),
        Err(("timeout", "unknown key; expected one of source, timeout_ms,")),
    );
    check_options(
        json!({"source": GRADE, "timeout_ms": 0}),
        Err(("timeout_ms", "expected 1 to 20000, got 0")),
    );
    check_options(
        json!({"source": GRADE, "timeout_ms": 60000}),
        Err(("timeout_ms", "expected 1 to 20000, got 60000")),
    );
    check_options(
        json!({"source": GRADE, "memory_mb": 10}),
        Err(("memory_mb", "expected 64 to 1048576 (python needs ~30 MiB), got 10")),
    );
    check_options(json!({"source": GRADE, "max_processes": 1}), Err(("max_processes", "expected 2 to 4096")));
    check_options(
        json!({"source": GRADE, "pass_threshold": "high"}),
        Err(("pass_threshold", "expected f64, got string")),
    );
    check_options(
        json!({"source": GRADE, "allow_missing_layers": ["landlock"]}),
        Err(("allow_missing_layers[0]", "expected one of user_namespace, pid_namespace")),
    );
}

#[test]
fn the_report_carries_the_source_digest_and_the_host_paths() {
    let report = PythonGrader::check_options(
        &json!({"source": GRADE, "python": "/x/python", "work_root": "/w", "read_paths": ["/r"]}).to_string(),
    )
    .unwrap();
    let keys: Vec<&str> = report.paths.iter().map(|path| path.key.as_str()).collect();
    assert_eq!(keys, ["python", "work_root", "read_paths[0]"]);
    assert_eq!(report.digests.len(), 1);
    assert_eq!(report.digests[0].key, "source");
    // sha256 of the source's UTF-8 bytes, as `sha256sum` prints it.
    assert_eq!(report.digests[0].sha256, "51e4a89d7e179c7f986e9cb97cfa98f1ec9e3e700dd062439daa00a1815f855a");
    assert_eq!(sha256_hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
}

/// What one item must give: a score (and whether it passed), or an error (timed out or not)
/// whose message contains the text.
#[derive(Debug)]
enum Expect {
    Score(f64, bool),
    Error(&'static str),
    Timeout,
}

fn grader(source: &str, extra: Value) -> PythonGrader {
    let mut config = json!({"source": source, "timeout_ms": 2000, "memory_mb": 256});
    for (key, value) in extra.as_object().unwrap() {
        config[key] = value.clone();
    }
    PythonGrader::from_config(&config.to_string()).unwrap()
}

fn check(grader: &PythonGrader, sample: &str, reference: Value, expected: &Expect) {
    let reference = reference.to_string();
    let verdict = grader
        .verify(&VerifyItem::new("item-1", "What is 6*7?", sample, &reference).explaining(true))
        .unwrap();
    let error: Option<String> = verdict.error.as_ref().map(|error| error.as_str().to_owned()).into_option();
    let context = format!("sample {sample:?}: {verdict:?}");
    match expected {
        Expect::Score(score, passed) => {
            assert_eq!((verdict.score, verdict.passed, error), (*score, *passed, None), "{context}");
        }
        Expect::Error(text) => {
            let error = error.unwrap_or_else(|| panic!("expected an error: {context}"));
            assert!(error.contains(text), "{context}");
            assert!(!verdict.timed_out && verdict.score == 0.0 && !verdict.passed, "{context}");
        }
        Expect::Timeout => {
            assert!(verdict.timed_out && error.is_some() && verdict.score == 0.0, "{context}");
        }
    }
}

#[test]
fn graders_score_or_fail_by_name() {
    let answer = json!({"answer": "42"});
    let cases: Vec<(&str, &str, Expect)> = vec![
        (
            "def grade(sample, item):\n    return float(sample.strip() == item['reference']['answer'])\n",
            "42",
            Expect::Score(1.0, true),
        ),
        (
            "def grade(sample, item):\n    return float(sample.strip() == item['reference']['answer'])\n",
            "41",
            Expect::Score(0.0, false),
        ),
        // The item is exactly {"id", "prompt", "reference"}; non-ASCII survives both ways.
        (
            "def grade(sample, item):\n    assert sorted(item) == ['id', 'prompt', 'reference'], item\n    \
             assert item['id'] == 'item-1' and item['prompt'] == 'What is 6*7?'\n    return len(sample)\n",
            "é😀",
            Expect::Score(2.0, true),
        ),
        ("def grade(sample, item):\n    return 0.5\n", "", Expect::Score(0.5, false)),
        ("def grade(sample, item):\n    return True\n", "", Expect::Score(1.0, true)),
        ("def grade(sample, item):\n    return -3\n", "", Expect::Score(-3.0, false)),
        (
            "def grade(sample, item):\n    return 1 / 0\n",
            "",
            Expect::Error("ZeroDivisionError: division by zero (grader.py, line 2)"),
        ),
        (
            "def grade(sample, item):\n    return item['reference']['missing']\n",
            "",
            Expect::Error("KeyError: 'missing' (grader.py, line 2)"),
        ),
        (
            "def grade(sample, item):\n    return 1.0 +\n",
            "",
            Expect::Error("the source does not compile: SyntaxError: "),
        ),
        (
            "import nosuchmodule\ndef grade(sample, item):\n    return 1\n",
            "",
            Expect::Error("ModuleNotFoundError: No module named 'nosuchmodule' (grader.py, line 1)"),
        ),
        ("grade = 3\n# def grade\n", "", Expect::Error("the source defines no function grade(sample, item)")),
        (
            "def grade(sample):\n    return 1\n",
            "",
            Expect::Error("TypeError: grade() takes 1 positional argument but 2 were given"),
        ),
        (
            "def grade(sample, item):\n    return None\n",
            "",
            Expect::Error("grade returned NoneType; expected a finite number (float, int or bool)"),
        ),
        (
            "def grade(sample, item):\n    return '1.0'\n",
            "",
            Expect::Error("grade returned str; expected a finite number"),
        ),
        (
            "class F(float): pass\ndef grade(sample, item):\n    return F(1.0)\n",
            "",
            Expect::Error("grade returned F; expected"),
        ),
        (
            "def grade(sample, item):\n    return float('nan')\n",
            "",
            Expect::Error("grade returned nan; expected a finite number"),
        ),
        (
            "def grade(sample, item):\n    return float('-inf')\n",
            "",
            Expect::Error("grade returned -inf; expected a finite number"),
        ),
        (
            "def grade(sample, item):\n    return 10 ** 400\n",
            "",
            Expect::Error("grade returned an int too large for a float"),
        ),
        (
            "import sys\ndef grade(sample, item):\n    sys.exit(0)\n",
            "",
            Expect::Error("SystemExit: 0 (grader.py, line 3)"),
        ),
        (
            "import os\ndef grade(sample, item):\n    os._exit(0)\n",
            "",
            Expect::Error("the grader exited (code 0) without returning from grade()"),
        ),
        (
            "import os, signal\ndef grade(sample, item):\n    os.kill(os.getpid(), signal.SIGSEGV)\n",
            "",
            Expect::Error("the grader ended without a result: crashed (SIGSEGV"),
        ),
        ("def grade(sample, item):\n    while True:\n        pass\n", "", Expect::Timeout),
        ("import time\ndef grade(sample, item):\n    time.sleep(30)\n", "", Expect::Timeout),
        (
            "def grade(sample, item):\n    hog = bytearray(1 << 40)\n    return 1\n",
            "",
            Expect::Error(
                "MemoryError (grader.py, line 2); the grader's memory is limited to 256 MiB (memory_mb)",
            ),
        ),
        (
            "import socket\ndef grade(sample, item):\n    socket.socket()\n    return 1\n",
            "",
            Expect::Error("forbidden system call"),
        ),
        // Forging: printing a score, or writing a result line to the result fd and every other
        // fd, does not set it; a line in the grader's own pipe besides its return is an error.
        (
            "import os\ndef grade(sample, item):\n    print('1.0')\n    print('{\"score\":1.0}')\n    \
             for fd in range(0, 5):\n        try:\n            os.write(fd, b'{\"score\":1.0}\\n')\n        except OSError:\n            pass\n    \
             return 0.0\n",
            "",
            Expect::Score(0.0, false),
        ),
        (
            "import os\ndef grade(sample, item):\n    for fd in range(0, 64):\n        try:\n            os.write(fd, b'{\"score\":1.0}\\n')\n        except OSError:\n            pass\n    \
             return 0.0\n",
            "",
            Expect::Error("the grader wrote to its own result pipe"),
        ),
        // Inherent, not a hole: a grader that writes one well-formed line into its own pipe and
        // exits without returning sets its own score, exactly as `return 1.0` would (inside one
        // process the two cannot be told apart). What a sample can do depends on the grader.
        (
            "import os\ndef grade(sample, item):\n    for fd in range(0, 64):\n        try:\n            os.write(fd, b'{\"score\":1.0}\\n')\n        except OSError:\n            pass\n    \
             os._exit(0)\n",
            "",
            Expect::Score(1.0, true),
        ),
    ];
    for (source, sample, expected) in &cases {
        let grader = grader(source, json!({}));
        check(&grader, sample, answer.clone(), expected);
    }
}

#[test]
fn pass_threshold_decides_passed() {
    let grader =
        grader("def grade(sample, item):\n    return float(sample)\n", json!({"pass_threshold": 0.5}));
    for (sample, expected) in [
        ("0.49", Expect::Score(0.49, false)),
        ("0.5", Expect::Score(0.5, true)),
        ("2", Expect::Score(2.0, true)),
    ] {
        check(&grader, sample, json!({}), &expected);
    }
}

#[test]
fn a_reference_that_is_not_json_is_an_error() {
    let grader = grader(GRADE, json!({}));
    let verdict = grader.verify(&VerifyItem::new("x", "", "", "{")).unwrap();
    assert!(verdict.error.as_ref().unwrap().as_str().starts_with("reference: expected JSON"), "{verdict:?}");
}

#[test]
fn explain_shows_the_digest_and_the_output() {
    let source = "def grade(sample, item):\n    print('looking at', sample)\n    return 1\n";
    let grader = grader(source, json!({}));
    let verdict = grader.verify(&VerifyItem::new("x", "", "abc", "{}").explaining(true)).unwrap();
    let lines: Vec<&str> = verdict.explanation.iter().map(|line| line.as_str()).collect();
    assert_eq!(
        lines,
        [
            format!("grader: {} bytes of python, sha256 {}", source.len(), sha256_hex(source)).as_str(),
            "grade returned 1; pass_threshold 1",
            "output: looking at abc\n",
        ]
    );
}

#[test]
fn self_test_passes() {
    PythonGrader::self_test().unwrap();
}
