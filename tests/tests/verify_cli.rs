//! `rlvrctl verify`: the JSONL batch format of design.md §1, with the real format verifier
//! loaded from its `.so`, on ordinary and adversarial inputs.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use rlvr_tests::{json_lines, plugin_lib, rlvrctl};
use serde_json::{Value, json};

/// A plugin directory holding only the format verifier.
fn format_dir() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    rlvr_tests::drop_in(&plugin_lib("rlvr-verifier-format"), dir.path(), "librlvr_verifier_format.so");
    let path = dir.path().to_owned();
    (dir, path)
}

fn verify(args: &[&str], stdin: &[u8]) -> (Vec<Value>, String, bool) {
    let (_dir, plugins) = format_dir();
    let mut all = vec!["verify", "--plugin-dir", plugins.to_str().unwrap()];
    all.extend_from_slice(args);
    let output = rlvrctl(&all, stdin);
    (
        json_lines(&output.stdout),
        String::from_utf8_lossy(&output.stderr).into_owned(),
        output.status.success(),
    )
}

/// (id, completion, passed, think_block component, answer component, extracted)
type FormatCase = (&'static str, &'static str, bool, f64, f64, Option<&'static str>);

#[test]
fn format_verifier_on_ordinary_and_adversarial_completions() {
    let cases: &[FormatCase] = &[
        ("ok", "<think>2+2=4</think> 4", true, 1.0, 1.0, Some("4")),
        (
            "ok-leading-space",
            "\n  <think>x</think>\nThe answer is 4.",
            true,
            1.0,
            1.0,
            Some("The answer is 4."),
        ),
        ("missing-close", "<think>2+2=4 so 4", false, 0.0, 0.0, None),
        ("missing-open", "2+2=4</think> 4", false, 0.0, 0.0, None),
        ("two-blocks", "<think>a</think><think>b</think> 4", false, 0.0, 0.0, None),
        ("nested", "<think>a<think>b</think></think> 4", false, 0.0, 0.0, None),
        ("answer-only-inside-think", "<think>the answer is 4</think>", false, 1.0, 0.0, None),
        ("empty-answer", "<think>x</think>  \n ", false, 1.0, 0.0, None),
        ("text-before-think", "Sure! <think>x</think> 4", false, 0.0, 0.0, None),
        ("no-tags", "4", false, 0.0, 0.0, None),
        ("empty", "", false, 0.0, 0.0, None),
    ];
    let input: String = cases
        .iter()
        .map(|(id, completion, ..)| {
            json!({"id": id, "prompt": "2+2?", "completion": completion, "reference": {}}).to_string() + "\n"
        })
        .collect();
    let (lines, stderr, ok) = verify(&["--plugin", "format"], input.as_bytes());
    assert!(ok, "{stderr}");
    assert_eq!(lines.len(), cases.len(), "{stderr}");
    for (line, (id, _, passed, think, answer, extracted)) in lines.iter().zip(cases) {
        assert_eq!(line["id"], *id);
        assert_eq!(line["passed"], *passed, "{line}");
        assert_eq!(line["score"], if *passed { 1.0 } else { 0.0 }, "{line}");
        assert_eq!(line["components"], json!({"think_block": think, "answer": answer}), "{line}");
        assert_eq!(line["extracted"], json!(extracted), "{line}");
        assert_eq!(line["error"], Value::Null, "{line}");
    }
}

#[test]
fn output_lines_have_exactly_the_documented_fields_in_order() {
    let (lines, stderr, ok) = verify(
        &["--plugin", "format@0.1.0"],
        b"{\"id\":\"a\",\"prompt\":\"p\",\"completion\":\"<think>t</think>x\",\"reference\":{}}\n",
    );
    assert!(ok, "{stderr}");
    let keys: Vec<&str> = lines[0].as_object().unwrap().keys().map(String::as_str).collect();
    // serde_json's map is sorted; the order on the wire is checked on the raw line below.
    assert_eq!(keys.len(), 9, "{keys:?}");
    let (_dir, plugins) = format_dir();
    let raw = rlvrctl(
        &["verify", "--plugin", "format", "--plugin-dir", plugins.to_str().unwrap()],
        b"{\"id\":\"a\",\"completion\":\"<think>t</think>x\"}\n",
    );
    let raw = String::from_utf8(raw.stdout).unwrap();
    let order: Vec<usize> = [
        "\"id\"",
        "\"score\"",
        "\"passed\"",
        "\"components\"",
        "\"extracted\"",
        "\"error\"",
        "\"timed_out\"",
        "\"latency_us\"",
        "\"verifier\"",
    ]
    .iter()
    .map(|key| raw.find(key).unwrap_or_else(|| panic!("{key} missing in {raw}")))
    .collect();
    assert!(order.windows(2).all(|w| w[0] < w[1]), "fields out of order: {raw}");
    assert!(lines[0]["latency_us"].is_u64());
    assert_eq!(lines[0]["verifier"], "format@0.1.0");
    assert_eq!(lines[0]["timed_out"], false);
    assert!(lines[0].get("explanation").is_none(), "explanations only with --explain: {}", lines[0]);
}

#[test]
fn bad_lines_get_a_per_line_error_and_the_other_lines_are_answered() {
    let mut input = Vec::new();
    input.extend_from_slice(b"{\"id\":\"before\",\"completion\":\"<think>t</think>x\"}\n");
    input.extend_from_slice(b"{\"id\":\"bad-utf8\",\"completion\":\"<think>t</think>\xff\xfe\"}\n");
    input.extend_from_slice(b"not json at all\n");
    input.extend_from_slice(b"\n");
    input.extend_from_slice(b"[1, 2]\n");
    input.extend_from_slice(b"{\"id\":\"no-completion\",\"prompt\":\"p\"}\n");
    input.extend_from_slice(b"{\"id\":\"both\",\"completion\":\"a\",\"pred\":\"b\"}\n");
    input.extend_from_slice(
        b"{\"id\":\"pred-alias\",\"pred\":\"<think>t</think>y\",\"gold\":\"y\",\"extra\":1}\n",
    );
    input.extend_from_slice(b"{\"id\":7,\"completion\":\"<think>t</think>z\"}\r\n");
    input.extend_from_slice(b"{\"id\":\"last-no-newline\",\"completion\":\"nope\"}");
    let (lines, stderr, ok) = verify(&["--plugin", "format"], &input);
    assert!(ok, "{stderr}");
    let summary: Vec<(Value, bool, Option<&str>)> = lines
        .iter()
        .map(|l| (l["id"].clone(), l["passed"].as_bool().unwrap(), l["error"].as_str()))
        .collect();
    assert_eq!(
        summary,
        [
            (json!("before"), true, None),
            (Value::Null, false, Some("line 2: invalid UTF-8 at byte 47")),
            (Value::Null, false, Some("line 3: invalid JSON: expected ident at line 1 column 2")),
            (Value::Null, false, Some("line 5: expected a JSON object")),
            (
                json!("no-completion"),
                false,
                Some("line 6: completion: missing (expected a string, or its alias pred)")
            ),
            (json!("both"), false, Some("line 7: completion and pred both given: expected one of them")),
            (json!("pred-alias"), true, None),
            (json!("7"), true, None),
            (json!("last-no-newline"), false, None),
        ]
    );
    assert!(stderr.contains("9 item(s) verified with format@0.1.0: 3 passed, 5 with errors"), "{stderr}");
}

#[test]
fn a_10_mb_completion_is_answered_in_bounded_time() {
    let reasoning = "step ".repeat(2 * 1024 * 1024);
    let completion = format!("<think>{reasoning}</think> 42");
    let mut input = json!({"id": "huge", "completion": completion}).to_string();
    input.push('\n');
    input.push_str(&json!({"id": "after", "completion": "<think>t</think> 1"}).to_string());
    assert!(input.len() > 10_000_000);
    let started = Instant::now();
    let (lines, stderr, ok) = verify(&["--plugin", "format"], input.as_bytes());
    let elapsed = started.elapsed();
    assert!(ok, "{stderr}");
    assert_eq!(lines[0]["passed"], true);
    assert_eq!(lines[0]["extracted"], "42");
    assert_eq!(lines[1]["passed"], true);
    // Linear-time checks take milliseconds; this bound only catches a hang or a quadratic blow-up.
    assert!(elapsed < Duration::from_secs(30), "took {elapsed:?}");
    assert!(lines[0]["latency_us"].as_u64().unwrap() < 5_000_000, "{}", lines[0]["latency_us"]);
}

#[test]
fn reads_from_a_file_and_plugin_options_reach_the_plugin() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("items.jsonl");
    std::fs::write(&file, "{\"id\":\"a\",\"completion\":\"<t>x</t> 1\"}\n{\"id\":\"b\",\"completion\":\"<think>x</think> 1\"}\n").unwrap();
    let (lines, stderr, ok) = verify(
        &[
            "--plugin",
            "format",
            "--jsonl",
            file.to_str().unwrap(),
            "--plugin-config",
            r#"{"think_open":"<t>","think_close":"</t>"}"#,
        ],
        b"",
    );
    assert!(ok, "{stderr}");
    assert_eq!(lines.iter().map(|l| l["passed"].as_bool().unwrap()).collect::<Vec<_>>(), [true, false]);
}

#[test]
fn clear_errors_for_a_missing_plugin_bad_options_and_missing_files() {
    let (_, stderr, ok) = verify(&["--plugin", "math"], b"");
    assert!(!ok);
    assert!(stderr.contains("no verifier plugin \"math\" is loaded; loaded: format@0.1.0"), "{stderr}");

    let (_, stderr, ok) = verify(&["--plugin", "format@9.9.9"], b"");
    assert!(!ok);
    assert!(stderr.contains("no verifier plugin \"format@9.9.9\" is loaded"), "{stderr}");

    let (_, stderr, ok) = verify(&["--plugin", "format", "--plugin-config", r#"{"think_tag":"x"}"#], b"");
    assert!(!ok);
    assert!(stderr.contains("think_tag: unknown key; expected one of think_open, think_close"), "{stderr}");

    // `--secret NAME=ENV_VAR`: the user's own environment, so naming the variable is fine here.
    let (_, stderr, ok) = verify(&["--plugin", "format", "--secret", "grader-token"], b"");
    assert!(!ok);
    assert!(stderr.contains("expected NAME=ENV_VAR"), "{stderr}");
    let (_, stderr, ok) =
        verify(&["--plugin", "format", "--secret", "grader-token=RLVR_TEST_NO_SUCH_VARIABLE"], b"");
    assert!(!ok);
    assert!(
        stderr.contains("--secret grader-token=RLVR_TEST_NO_SUCH_VARIABLE: the environment variable"),
        "{stderr}"
    );

    let (_, stderr, ok) = verify(&["--plugin", "format", "--jsonl", "/nonexistent/items.jsonl"], b"");
    assert!(!ok);
    assert!(stderr.contains("cannot open /nonexistent/items.jsonl"), "{stderr}");

    let output = rlvrctl(&["verify", "--plugin", "format", "--plugin-dir", "/nonexistent/plugins"], b"");
    assert!(!output.status.success());
    assert!(
        String::from_utf8_lossy(&output.stderr)
            .contains("--plugin-dir /nonexistent/plugins: not a directory")
    );
}

/// A plugin directory holding only the `stall` fixture.
fn stall(args: &[&str], items: &[(&str, &str)]) -> (Vec<Value>, String) {
    let dir = tempfile::tempdir().unwrap();
    rlvr_tests::drop_in(&plugin_lib("rlvr-fixture-stall"), dir.path(), "librlvr_fixture_stall.so");
    let mut all = vec!["verify", "--plugin", "stall", "--plugin-dir", dir.path().to_str().unwrap()];
    all.extend_from_slice(args);
    let input: String = items
        .iter()
        .map(|(id, completion)| json!({"id": id, "completion": completion}).to_string() + "\n")
        .collect();
    let output = rlvrctl(&all, input.as_bytes());
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert!(output.status.success(), "{stderr}");
    (json_lines(&output.stdout), stderr)
}

#[test]
fn the_host_answers_a_hanging_plugin_at_its_deadline_and_goes_on() {
    let items = [("a", "ok"), ("hung-1", "hang"), ("b", "sleep:10"), ("hung-2", "hang"), ("c", "ok")];
    let (lines, stderr) = stall(&["--deadline-ms", "300", "--parallel", "2"], &items);
    let got: Vec<(&str, bool, bool)> = lines
        .iter()
        .map(|l| {
            (l["id"].as_str().unwrap(), l["passed"].as_bool().unwrap(), l["timed_out"].as_bool().unwrap())
        })
        .collect();
    assert_eq!(
        got,
        [
            ("a", true, false),
            ("hung-1", false, true),
            ("b", true, false),
            ("hung-2", false, true),
            ("c", true, false)
        ]
    );
    assert_eq!(lines[1]["error"], "no verdict within the host's deadline of 300 ms");
    assert_eq!(lines[1]["verifier"], "stall@0.1.0");
    assert!(
        stderr.contains("5 item(s) verified with stall@0.1.0: 3 passed, 2 with errors (2 timed out)"),
        "{stderr}"
    );
}

#[test]
fn a_plugin_s_own_timeout_is_counted_as_a_timeout() {
    let (lines, stderr) = stall(&[], &[("t", "timeout"), ("ok", "ok")]);
    assert_eq!(lines[0]["timed_out"], true);
    assert_eq!(lines[0]["error"], "stall: budget of 0 work units spent");
    assert_eq!(lines[1]["timed_out"], false);
    assert!(stderr.contains("(1 timed out)"), "{stderr}");
}

#[test]
fn once_too_many_calls_are_stuck_the_rest_is_refused_instead_of_piling_up_threads() {
    let items: Vec<(String, &str)> = (0..20).map(|index| (format!("h{index}"), "hang")).collect();
    let items: Vec<(&str, &str)> = items.iter().map(|(id, completion)| (id.as_str(), *completion)).collect();
    let (lines, _) = stall(&["--deadline-ms", "100", "--parallel", "4"], &items);
    assert_eq!(lines.len(), 20);
    let timed_out = lines.iter().filter(|l| l["timed_out"] == true).count();
    let refused: Vec<&Value> = lines.iter().filter(|l| l["timed_out"] == false).collect();
    // Every refused item comes after the 16th stuck call; none is answered twice or lost.
    assert!(timed_out >= 16, "{lines:?}");
    for line in &refused {
        let error = line["error"].as_str().unwrap();
        assert!(
            error.starts_with("verifier unresponsive: 16 calls still running past the 100 ms deadline"),
            "{error}"
        );
    }
    let ids: Vec<&str> = lines.iter().map(|l| l["id"].as_str().unwrap()).collect();
    assert_eq!(ids, items.iter().map(|(id, _)| *id).collect::<Vec<_>>());
}

#[test]
fn parallel_items_come_back_in_input_order() {
    // Later items finish first; the output must still follow the input.
    let items = [("slowest", "sleep:300"), ("slow", "sleep:200"), ("quick", "sleep:100"), ("now", "ok")];
    let (lines, _) = stall(&["--parallel", "4"], &items);
    let ids: Vec<&str> = lines.iter().map(|l| l["id"].as_str().unwrap()).collect();
    assert_eq!(ids, ["slowest", "slow", "quick", "now"]);
    assert!(lines.iter().all(|l| l["passed"] == true));
}

#[test]
fn explain_adds_the_plugin_s_explanation_lines() {
    let (lines, _) = stall(&["--explain"], &[("a", "ok")]);
    assert_eq!(lines[0]["explanation"], json!(["stall: did as told by \"ok\""]));
    let (lines, _) = stall(&[], &[("a", "ok")]);
    assert!(lines[0].get("explanation").is_none());
}
