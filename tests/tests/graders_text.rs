//! `rlvrctl verify --plugin string-check|text-similarity --jsonl FILE`: the two text graders
//! loaded from their `.so` through the real loader — templates over the batch format's items,
//! each operation and metric, options refused at load naming the key, and an error verdict (not a
//! silent 0) for a template path the item lacks.

use std::path::PathBuf;

use rlvr_tests::{json_lines, plugin_lib, rlvrctl};
use serde_json::{Value, json};

/// A plugin directory holding both graders.
fn graders_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for name in ["rlvr-verifier-string-check", "rlvr-verifier-text-similarity"] {
        let file = format!("lib{}.so", name.replace('-', "_"));
        rlvr_tests::drop_in(&plugin_lib(name), dir.path(), &file);
    }
    dir
}

/// Runs `items` through `plugin` with `options` from a JSONL file; (output lines, stderr, success).
fn verify(plugin: &str, options: &Value, items: &[Value]) -> (Vec<Value>, String, bool) {
    let plugins = graders_dir();
    let input: PathBuf = plugins.path().join("items.jsonl");
    std::fs::write(&input, items.iter().map(|item| item.to_string() + "\n").collect::<String>()).unwrap();
    let options = options.to_string();
    let args = [
        "verify",
        "--plugin",
        plugin,
        "--plugin-dir",
        plugins.path().to_str().unwrap(),
        "--plugin-config",
        &options,
        "--jsonl",
        input.to_str().unwrap(),
    ];
    let output = rlvrctl(&args, b"");
    (
        json_lines(&output.stdout),
        String::from_utf8_lossy(&output.stderr).into_owned(),
        output.status.success(),
    )
}

fn item(id: &str, completion: &str, reference: Value) -> Value {
    json!({"id": id, "prompt": "What is the capital of France?", "completion": completion, "reference": reference})
}

/// (id, score, passed, extracted, error) of each output line.
fn summary(lines: &[Value]) -> Vec<(String, f64, bool, Value, Value)> {
    lines
        .iter()
        .map(|line| {
            (
                line["id"].as_str().unwrap_or_default().to_owned(),
                line["score"].as_f64().unwrap_or(f64::NAN),
                line["passed"].as_bool().unwrap_or_default(),
                line["extracted"].clone(),
                line["error"].clone(),
            )
        })
        .collect()
}

#[test]
fn string_check_grades_each_operation_through_the_loader() {
    let items = [
        item("exact", "Paris", json!({"answer": "Paris"})),
        item("case", "paris", json!({"answer": "Paris"})),
        item("sentence", "The capital is PARIS.", json!({"answer": "Paris"})),
        // The batch format's convenience field: "gold" is reference.answer.
        json!({"id": "gold", "prompt": "p", "completion": "Paris", "gold": "Paris"}),
        // regression: a template path the item lacks is an error verdict, never a silent 0
        item("missing", "Paris", json!({"label": "Paris"})),
    ];
    let missing_error = json!(
        "reference: item.reference.answer: not found in the item (item.reference has no key \"answer\")"
    );
    // (operation, passed for exact, case, sentence, gold)
    let cases: &[(&str, [bool; 4])] = &[
        ("eq", [true, false, false, true]),
        ("ne", [false, true, true, false]),
        ("like", [true, false, false, true]),
        ("ilike", [true, true, true, true]),
    ];
    for (operation, passed) in cases {
        let (lines, stderr, ok) = verify("string-check", &json!({"operation": operation}), &items);
        assert!(ok, "{operation}: {stderr}");
        let got = summary(&lines);
        let mut expected: Vec<_> = ["exact", "case", "sentence", "gold"]
            .iter()
            .zip(passed)
            .map(|(id, passed)| {
                let completion = items.iter().find(|item| item["id"] == *id).unwrap();
                let completion = completion.get("completion").cloned().unwrap();
                (id.to_string(), if *passed { 1.0 } else { 0.0 }, *passed, completion, Value::Null)
            })
            .collect();
        expected.push(("missing".to_owned(), 0.0, false, Value::Null, missing_error.clone()));
        assert_eq!(got, expected, "{operation}");
        assert_eq!(lines[0]["verifier"], "string-check@0.1.0");
    }
}

#[test]
fn string_check_templates_read_the_prompt_and_nested_reference_fields() {
    let options = json!({"operation": "eq", "input": "{{ item.prompt }} -> {{sample}}",
                         "reference": "{{item.prompt}} -> {{item.reference.labels.1}}", "trim": true});
    let items = [
        item("second-label", "Paris\n ", json!({"labels": ["Lyon", "Paris"]})),
        // `trim` strips the ends of the rendered text, not of each value put into it.
        item("inner-space", "  Paris", json!({"labels": ["Lyon", "Paris"]})),
        item("short-list", "Paris", json!({"labels": ["Paris"]})),
    ];
    let (lines, stderr, ok) = verify("string-check", &options, &items);
    assert!(ok, "{stderr}");
    assert_eq!(lines[0]["passed"], true, "{}", lines[0]);
    assert_eq!(lines[0]["extracted"], "What is the capital of France? -> Paris");
    assert_eq!(lines[1]["passed"], false, "{}", lines[1]);
    assert_eq!(lines[1]["extracted"], "What is the capital of France? ->   Paris");
    assert_eq!(
        lines[2]["error"],
        "reference: item.reference.labels.1: not found in the item (item.reference.labels is an array of 1 and \"1\" is not an index in it)"
    );
}

#[test]
fn text_similarity_scores_each_metric_through_the_loader() {
    let items = [
        item("same", "the cat sat on the mat", json!({"answer": "the cat sat on the mat"})),
        item("close", "the cat sat on a mat", json!({"answer": "the cat sat on the mat"})),
        item("far", "dogs bark", json!({"answer": "the cat sat on the mat"})),
        item("missing", "the cat", json!({})),
    ];
    // (metric, threshold, scores of same, close, far); the scores are the Python references'
    // (rapidfuzz 3.14.6, sacrebleu 2.6.0, rouge-score 0.1.2) for these pairs.
    let cases: &[(&str, f64, [f64; 3])] = &[
        ("fuzzy_match", 0.9, [1.0, 0.9047619047619048, 0.19354838709677424]),
        // BLEU of identical texts is 1.0000000000000004 in sacrebleu; the grader keeps scores in [0, 1].
        ("bleu", 0.5, [1.0, 0.537284965911771, 0.0]),
        ("rouge_l", 0.8, [1.0, 0.8333333333333334, 0.0]),
        ("rouge_2", 0.6, [1.0, 0.6, 0.0]),
    ];
    for (metric, threshold, scores) in cases {
        let (lines, stderr, ok) =
            verify("text-similarity", &json!({"metric": metric, "pass_threshold": threshold}), &items);
        assert!(ok, "{metric}: {stderr}");
        for (line, score) in lines.iter().zip(scores) {
            let got = line["score"].as_f64().unwrap();
            assert!((got - score).abs() < 1e-12, "{metric}: {line}");
            assert_eq!(line["passed"], got >= *threshold, "{metric}: {line}");
            let component = line["components"][metric].as_f64().unwrap_or(f64::NAN);
            assert!((component - got).abs() < 1e-12, "{metric}: {line}");
            assert_eq!(line["error"], Value::Null);
        }
        assert_eq!(lines[3]["score"], 0.0);
        assert_eq!(lines[3]["passed"], false);
        assert_eq!(
            lines[3]["error"],
            "reference: item.reference.answer: not found in the item (item.reference has no key \"answer\")",
            "{metric}"
        );
    }
}

#[test]
fn bad_options_are_refused_at_load_naming_the_key() {
    let items = [item("a", "x", json!({"answer": "x"}))];
    let cases: &[(&str, Value, &str)] = &[
        ("string-check", json!({}), "operation: missing; this key is required"),
        ("string-check", json!({"operation": "contains"}), "operation: expected one of eq, ne, like, ilike"),
        ("string-check", json!({"operation": "eq", "input": "{{sample"}), "input: unclosed `{{` at byte 0"),
        ("text-similarity", json!({"metric": "bleu"}), "pass_threshold: missing; this key is required"),
        (
            "text-similarity",
            json!({"metric": "meteor", "pass_threshold": 0.5}),
            "metric: meteor is not offered",
        ),
        (
            "text-similarity",
            json!({"metric": "bleu", "pass_threshold": 2}),
            "pass_threshold: expected a number from 0 to 1, got 2",
        ),
    ];
    for (plugin, options, expected) in cases {
        let (lines, stderr, ok) = verify(plugin, options, &items);
        assert!(!ok && lines.is_empty(), "{plugin} {options}: {lines:?}");
        assert!(stderr.contains(expected), "{plugin} {options}: {stderr}");
    }
}
