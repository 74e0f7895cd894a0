//! `rlvrctl verify --plugin ifeval`: the IFEval verifier loaded from its `.so` through the real
//! loader — strict and loose modes, think stripping, malformed references, determinism, the
//! reference implementation's verdicts, and real-looking IFEval prompts.

use std::path::PathBuf;

use rlvr_tests::{json_lines, plugin_lib, rlvrctl};
use serde_json::{Value, json};

fn ifeval_dir() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    rlvr_tests::drop_in(&plugin_lib("rlvr-verifier-ifeval"), dir.path(), "librlvr_verifier_ifeval.so");
    let path = dir.path().to_owned();
    (dir, path)
}

/// Runs `items` through the plugin with `plugin_config` (and `extra` arguments); the output lines.
fn verify(items: &[Value], plugin_config: &str, extra: &[&str]) -> Vec<Value> {
    let (_dir, plugins) = ifeval_dir();
    let mut args = vec![
        "verify",
        "--plugin",
        "ifeval",
        "--plugin-dir",
        plugins.to_str().unwrap(),
        "--plugin-config",
        plugin_config,
    ];
    args.extend_from_slice(extra);
    let input: String = items.iter().map(|item| item.to_string() + "\n").collect();
    let output = rlvrctl(&args, input.as_bytes());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    let lines = json_lines(&output.stdout);
    assert_eq!(lines.len(), items.len(), "{stderr}");
    lines
}

fn item(id: &str, completion: &str, ids: &[&str], kwargs: Value) -> Value {
    json!({"id": id, "prompt": "p", "completion": completion,
           "reference": {"instruction_id_list": ids, "kwargs": kwargs}})
}

#[test]
fn strict_and_loose_modes_score_their_own_fraction() {
    // Strict: the leading line breaks the JSON and the comma is there; loose passes the JSON (first
    // line removed) but the comma inside the JSON stays.
    let completion = "Here is the JSON, as asked:\n{\"a\": 1, \"b\": 2}";
    let items = [item(
        "mixed",
        completion,
        &["detectable_format:json_format", "punctuation:no_comma", "startend:end_checker"],
        json!([{}, {}, {"end_phrase": "\"b\": 2}"}]),
    )];
    let strict = verify(&items, "{}", &[]);
    let loose = verify(&items, r#"{"mode": "loose"}"#, &[]);
    for lines in [&strict, &loose] {
        assert_eq!(lines[0]["components"]["strict"], json!(1.0 / 3.0), "{}", lines[0]);
        assert_eq!(lines[0]["components"]["loose"], json!(2.0 / 3.0), "{}", lines[0]);
        assert_eq!(lines[0]["verifier"], "ifeval@0.1.0");
        assert_eq!(lines[0]["error"], Value::Null);
    }
    assert_eq!(strict[0]["score"], json!(1.0 / 3.0));
    assert_eq!(strict[0]["passed"], false);
    assert_eq!(
        strict[0]["components"],
        json!({"detectable_format:json_format": 0.0, "punctuation:no_comma": 0.0, "startend:end_checker": 1.0,
               "strict": 1.0 / 3.0, "loose": 2.0 / 3.0})
    );
    assert_eq!(loose[0]["score"], json!(2.0 / 3.0));
    assert_eq!(loose[0]["components"]["detectable_format:json_format"], 1.0);
    assert_eq!(loose[0]["components"]["punctuation:no_comma"], 0.0);
}

#[test]
fn grades_the_text_after_the_last_think_block() {
    let ids = ["punctuation:no_comma", "change_case:english_lowercase"];
    let items = [
        item(
            "think",
            "<think>First, plan. Then, write.</think>\nall lowercase and no commas here",
            &ids,
            json!([{}, {}]),
        ),
        item(
            "two-thinks",
            "<think>a</think>Draft, Bad</think>the final answer is written in lowercase letters for the reader",
            &ids,
            json!([{}, {}]),
        ),
        item("no-think", "Visible, Text", &ids, json!([{}, {}])),
    ];
    let lines = verify(&items, "{}", &[]);
    assert_eq!(lines[0]["extracted"], "\nall lowercase and no commas here");
    assert_eq!(lines[0]["passed"], true, "{}", lines[0]);
    assert_eq!(lines[1]["extracted"], "the final answer is written in lowercase letters for the reader");
    assert_eq!(lines[1]["passed"], true, "{}", lines[1]);
    assert_eq!(lines[2]["extracted"], "Visible, Text");
    assert_eq!(lines[2]["score"], 0.0);
    // With think stripping off, the whole completion (commas in the reasoning) is graded.
    let whole = verify(&items[..1], r#"{"think_close": ""}"#, &[]);
    assert_eq!(whole[0]["components"]["punctuation:no_comma"], 0.0, "{}", whole[0]);
}

#[test]
fn malformed_references_are_per_item_errors_naming_the_field() {
    let cases: &[(Value, &str)] = &[
        (json!({}), "reference: expected {\"instruction_id_list\""),
        (json!({"instruction_id_list": ["punctuation:no_comma"]}), "missing field `kwargs`"),
        (json!({"instruction_id_list": [], "kwargs": []}), "expected at least one instruction id"),
        (
            json!({"instruction_id_list": ["punctuation:no_coma"], "kwargs": [{}]}),
            "reference.instruction_id_list[0]: unknown instruction id \"punctuation:no_coma\"",
        ),
        (
            json!({"instruction_id_list": ["length_constraints:number_words"], "kwargs": [{"num_words": 5}]}),
            "reference.kwargs[0].relation (length_constraints:number_words): missing",
        ),
        (
            json!({"instruction_id_list": ["keywords:frequency"],
                   "kwargs": [{"keyword": "x", "frequency": "3", "relation": "at least"}]}),
            "reference.kwargs[0].frequency (keywords:frequency): expected a non-negative integer, got \"3\"",
        ),
        (
            json!({"instruction_id_list": ["punctuation:no_comma", "detectable_format:title"], "kwargs": [{}]}),
            "reference.kwargs: expected one object per instruction (2), got 1",
        ),
        (
            json!({"instruction_id_list": ["keywords:existence"], "kwargs": [{"keywords": ["(unclosed"]}]}),
            "reference.kwargs[0].keywords[0] (keywords:existence): \"(unclosed\" does not compile",
        ),
        (
            json!({"instruction_id_list": ["language:response_language"], "kwargs": [{"language": "klingon"}]}),
            "reference.kwargs[0].language (language:response_language): expected an ISO 639-1 code",
        ),
    ];
    let items: Vec<Value> = cases
        .iter()
        .enumerate()
        .map(|(i, (reference, _))| json!({"id": i, "completion": "text", "reference": reference}))
        .collect();
    let lines = verify(&items, "{}", &[]);
    for (line, (_, expected)) in lines.iter().zip(cases) {
        let error = line["error"].as_str().unwrap_or_else(|| panic!("no error in {line}"));
        assert!(error.contains(expected), "{error:?} lacks {expected:?}");
        assert_eq!(line["score"], 0.0);
        assert_eq!(line["passed"], false);
    }
}

#[test]
fn same_input_twice_gives_the_same_output() {
    let text =
        std::fs::read_to_string(rlvr_tests::workspace_root().join("tests/data/verifier_ifeval/oracle.jsonl"))
            .unwrap();
    let items: Vec<Value> = text
        .lines()
        .take(30)
        .map(|line| {
            let case: Value = serde_json::from_str(line).unwrap();
            json!({"id": case["id"], "completion": case["completion"], "reference": case["reference"]})
        })
        .collect();
    let strip_latency = |mut lines: Vec<Value>| {
        for line in &mut lines {
            line.as_object_mut().unwrap().remove("latency_us");
        }
        lines
    };
    let first = strip_latency(verify(&items, "{}", &["--parallel", "4"]));
    let second = strip_latency(verify(&items, "{}", &["--parallel", "1"]));
    assert_eq!(first, second);
}

/// Language checks where whatlang and the reference's langdetect disagree on these responses:
/// all short, Latin-script texts whatlang itself flags as unreliable. Asserted as they are.
// FIXME: a detector closer to langdetect on short texts would remove these.
const KNOWN_LANGUAGE_DIVERGENCES: &[(&str, &str)] = &[
    ("r-1", "language:response_language"),
    ("r-7", "language:response_language"),
    ("r-9", "change_case:english_lowercase"),
    ("r-9", "language:response_language"),
    ("r-11", "change_case:english_lowercase"),
    ("r-11", "language:response_language"),
    ("r-12", "language:response_language"),
    ("r-14", "change_case:english_lowercase"),
    ("r-14", "language:response_language"),
    ("r-18", "change_case:english_lowercase"),
    ("r-18", "language:response_language"),
    ("r-24", "language:response_language"),
    ("r-29", "change_case:english_lowercase"),
    ("r-46", "language:response_language"),
    ("r-49", "change_case:english_capital"),
    ("r-49", "language:response_language"),
];

#[test]
fn verdicts_match_the_reference_implementation_in_both_modes() {
    let text =
        std::fs::read_to_string(rlvr_tests::workspace_root().join("tests/data/verifier_ifeval/oracle.jsonl"))
            .unwrap();
    let cases: Vec<Value> = text.lines().map(|line| serde_json::from_str(line).unwrap()).collect();
    let items: Vec<Value> = cases
        .iter()
        .map(|case| json!({"id": case["id"], "completion": case["completion"], "reference": case["reference"]}))
        .collect();
    let strict = verify(&items, r#"{"mode": "strict"}"#, &[]);
    let loose = verify(&items, r#"{"mode": "loose"}"#, &[]);
    let mut checks = 0;
    let mut divergent = Vec::new();
    for (case, (strict, loose)) in cases.iter().zip(strict.iter().zip(&loose)) {
        let ids = case["reference"]["instruction_id_list"].as_array().unwrap();
        let duplicates = |id: &Value| ids.iter().filter(|other| *other == id).count() > 1;
        for (i, id) in ids.iter().enumerate() {
            let id = id.as_str().unwrap();
            let name = if duplicates(&ids[i]) { format!("{i}:{id}") } else { id.to_owned() };
            let got = (strict["components"][&name] == 1.0, loose["components"][&name] == 1.0);
            let expected = (case["strict"][i] == true, case["loose"][i] == true);
            checks += 1;
            if got != expected {
                divergent.push((case["id"].as_str().unwrap().to_owned(), id.to_owned()));
            }
        }
        let fraction = |list: &Value| {
            list.as_array().unwrap().iter().filter(|v| **v == true).count() as f64 / ids.len() as f64
        };
        if !divergent.iter().any(|(id, _)| id == case["id"].as_str().unwrap()) {
            let close = |got: &Value, expected: f64| (got.as_f64().unwrap() - expected).abs() < 1e-12;
            assert!(
                close(&strict["score"], fraction(&case["strict"])),
                "{}: {}",
                case["id"],
                strict["score"]
            );
            assert!(close(&loose["score"], fraction(&case["loose"])), "{}: {}", case["id"], loose["score"]);
            assert_eq!(strict["passed"], case["strict"].as_array().unwrap().iter().all(|v| *v == true));
        }
    }
    assert!(checks > 2000, "{checks}");
    let known: Vec<(String, String)> =
        KNOWN_LANGUAGE_DIVERGENCES.iter().map(|(id, name)| (id.to_string(), name.to_string())).collect();
    assert_eq!(divergent, known, "checks that differ from the reference (of {checks})");
}

#[test]
fn real_looking_ifeval_prompts() {
    // Shaped like rows of google/IFEval, passed as the reference unchanged (key, prompt and null
    // kwargs included).
    let row = |key: u64, prompt: &str, ids: &[&str], kwargs: Value| json!({"key": key, "prompt": prompt, "instruction_id_list": ids, "kwargs": kwargs});
    let nulls = json!({"num_highlights": null, "relation": null, "num_words": null, "keywords": null});
    let resume = row(
        1001,
        "Write a resume for a fresh high school graduate who is seeking their first job. Make sure to include at \
         least 12 placeholder represented by square brackets, such as [address], [name].",
        &["detectable_content:number_placeholders"],
        json!([{"num_placeholders": 12, "num_highlights": null}]),
    );
    let limerick = row(
        1002,
        "Write a limerick about a cat. Your entire response should be in English, and in all lowercase letters. \
         Do not use any commas.",
        &["change_case:english_lowercase", "punctuation:no_comma"],
        json!([nulls, {}]),
    );
    let essay = row(
        1003,
        "Write an essay about wilderness. Highlight at least 2 sections with markdown, i.e. *highlighted section*. \
         Finish with the exact phrase: Is there anything else I can help with?",
        &["detectable_format:number_highlighted_sections", "startend:end_checker"],
        json!([{"num_highlights": 2}, {"end_phrase": "Is there anything else I can help with?"}]),
    );
    let placeholders: String = (1..=12).map(|i| format!("[field {i}] ")).collect();
    let items = [
        json!({"id": "resume", "completion": format!("<think>list fields</think>Resume\n{placeholders}"), "reference": resume}),
        json!({"id": "resume-short", "completion": "Resume: [name], [address]", "reference": resume}),
        json!({"id": "limerick", "completion": "there once was a cat from the bay\nwho napped in the sun every day\nshe purred at the light\nthen slept through the night\nand dreamed all her troubles away", "reference": limerick}),
        json!({"id": "limerick-commas", "completion": "there once was a cat, so they say,\nwho napped in the sun every day", "reference": limerick}),
        json!({"id": "essay", "completion": "The wild is vast. *Silence* rules there, and *time* slows.\nIs there anything else I can help with?", "reference": essay}),
        json!({"id": "essay-loose-only", "completion": "**The wild** is vast and *silent*.\nIs there anything else I can help with?\n(end)", "reference": essay}),
    ];
    let lines = verify(&items, "{}", &["--explain"]);
    let passed: Vec<(&str, bool, f64)> = lines
        .iter()
        .map(|line| {
            (line["id"].as_str().unwrap(), line["passed"].as_bool().unwrap(), line["score"].as_f64().unwrap())
        })
        .collect();
    assert_eq!(
        passed,
        [
            ("resume", true, 1.0),
            ("resume-short", false, 0.0),
            ("limerick", true, 1.0),
            ("limerick-commas", false, 0.5),
            ("essay", true, 1.0),
            ("essay-loose-only", false, 0.5),
        ]
    );
    assert_eq!(lines[5]["components"]["loose"], 1.0, "{}", lines[5]);
    let explanation: Vec<&str> =
        lines[1]["explanation"].as_array().unwrap().iter().map(|line| line.as_str().unwrap()).collect();
    assert_eq!(explanation.len(), 2, "{explanation:?}");
    assert!(
        explanation[1]
            .contains("detectable_content:number_placeholders: strict not followed: 2 [placeholders]"),
        "{explanation:?}"
    );
}
