//! The math verifier through `rlvrctl verify --plugin math`, loaded from its real `.so`: the 86
//! shared Math-Verify dev cases (Apache-2.0, from the Math-Verify test suite), our own table of
//! adversarial and cheating completions, and hostile inputs that must end in a bounded-time
//! timeout verdict rather than a hang.

use std::time::{Duration, Instant};

use rlvr_tests::{json_lines, plugin_lib, rlvrctl, workspace_root};
use serde_json::{Value, json};

/// Runs `rlvrctl verify --plugin math` with `config` on `input`; returns lines, stderr, success.
fn verify(config: &str, input: &str, extra: &[&str]) -> (Vec<Value>, String, bool) {
    let dir = tempfile::tempdir().unwrap();
    rlvr_tests::drop_in(&plugin_lib("rlvr-verifier-math"), dir.path(), "librlvr_verifier_math.so");
    let mut args = vec!["verify", "--plugin-dir", dir.path().to_str().unwrap(), "--plugin", "math"];
    args.extend_from_slice(&["--plugin-config", config]);
    args.extend_from_slice(extra);
    let output = rlvrctl(&args, input.as_bytes());
    (
        json_lines(&output.stdout),
        String::from_utf8_lossy(&output.stderr).into_owned(),
        output.status.success(),
    )
}

/// Dev cases whose `expected` we disagree with: (id, our answer, why the expectation is wrong).
/// Empty: we agree on all 86.
const DISAGREEMENTS: &[(&str, bool, &str)] = &[];

#[test]
fn agrees_with_every_math_verify_dev_case() {
    let path = workspace_root().join("tests/data/verifier_math/math-dev.jsonl");
    let input = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let cases: Vec<Value> = input.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(cases.len(), 86, "the shared dev set has 86 lines");
    // Evaluation mode: these completions were not trained to box their answers.
    let (lines, stderr, ok) = verify(r#"{"fallback": "last"}"#, &input, &[]);
    assert!(ok, "{stderr}");
    assert_eq!(lines.len(), cases.len(), "{stderr}");
    let mut wrong = Vec::new();
    for (line, case) in lines.iter().zip(&cases) {
        assert_eq!(line["id"], case["id"]);
        assert_eq!(line["error"], Value::Null, "{line}");
        let expected = case["expected"].as_bool().unwrap();
        let id = case["id"].as_str().unwrap();
        let passed = line["passed"].as_bool().unwrap();
        match DISAGREEMENTS.iter().find(|(known, ..)| *known == id) {
            Some((_, ours, _)) => assert_eq!(passed, *ours, "{id}: known disagreement changed: {line}"),
            None if passed != expected => wrong.push(format!("{id}: expected {expected}, got {line}")),
            None => {}
        }
    }
    assert!(wrong.is_empty(), "{} disagreements:\n{}", wrong.len(), wrong.join("\n"));
}

/// (id, gold, completion, passed)
type Case<'a> = (&'static str, Value, &'a str, bool);

#[test]
fn adversarial_and_cheating_completions() {
    let huge = "7".repeat(20_000);
    let huge_other = format!("{}8", "7".repeat(19_999));
    let huge_boxed = format!("\\boxed{{{huge}}}");
    let huge_other_boxed = format!("\\boxed{{{huge_other}}}");
    let cases: Vec<Case<'_>> = vec![
        ("plain", json!("42"), "so the result is \\boxed{42}.", true),
        ("numeric-reference", json!(42), "\\boxed{42}", true),
        ("hedge-two-boxes", json!("1"), "\\boxed{1} \\boxed{2}", false),
        ("hedge-or", json!("1"), "\\boxed{1 \\text{ or } 2 \\text{ or } 3}", false),
        ("hedge-plain-or", json!("1"), "\\boxed{1 or 2}", false),
        ("same-box-twice", json!("5"), "\\boxed{5}, that is \\boxed{5}", true),
        ("box-inside-think-only", json!("5"), "<think>it is \\boxed{5}</think> I am not sure.", false),
        ("think-never-closes", json!("5"), "<think>it is \\boxed{5}", false),
        ("box-after-think", json!("5"), "<think>maybe \\boxed{4}</think> \\boxed{5}", true),
        ("wrong-after-think", json!("5"), "<think>so \\boxed{5}</think> \\boxed{4}", false),
        ("factorial-2004-vs-2006", json!("\\frac{1}{2004!}"), "\\boxed{\\frac{1}{2006!}}", false),
        ("factorial-2004-same", json!("\\frac{1}{2004!}"), "\\boxed{\\dfrac{1}{2004!}}", true),
        ("third-6-digits", json!("\\frac{1}{3}"), "\\boxed{0.333333}", true),
        ("third-4-digits", json!("\\frac{1}{3}"), "\\boxed{0.3333}", false),
        ("terminating-needs-exact", json!("\\frac{1}{8}"), "\\boxed{0.1250001}", false),
        ("tiny-vs-zero", json!("0"), "\\boxed{1e-30}", false),
        ("zero-vs-tiny", json!("10^{-30}"), "\\boxed{0}", false),
        ("tiny-not-rounded-away", json!("\\frac{1}{3 \\cdot 10^{9}}"), "\\boxed{0.000000}", false),
        ("huge-equal", json!(huge.clone()), huge_boxed.as_str(), true),
        ("huge-last-digit", json!(huge.clone()), huge_other_boxed.as_str(), false),
        ("assignment", json!("2"), "\\boxed{x=2}", true),
        ("assignment-gold", json!("x = 2"), "\\boxed{2}", true),
        ("set-order", json!("\\{1, 2, 3\\}"), "\\boxed{\\{3, 1, 2\\}}", true),
        ("set-missing", json!("\\{1, 2, 3\\}"), "\\boxed{\\{3, 1\\}}", false),
        ("tuple-order", json!("(1, 2)"), "\\boxed{(2, 1)}", false),
        ("interval-open", json!("[0, 1)"), "\\boxed{(0, 1)}", false),
        ("inequality-flipped", json!("x \\le 5"), "\\boxed{5 \\ge x}", true),
        ("inequality-strict", json!("x \\le 5"), "\\boxed{x < 5}", false),
        ("equation-scaled", json!("2x + 4y = 6"), "\\boxed{x + 2y = 3}", true),
        ("polynomial-form", json!("x^2 - 1"), "\\boxed{(x-1)(x+1)}", true),
        ("radical-forms", json!("\\frac{\\sqrt{2}}{2}"), "\\boxed{\\frac{1}{\\sqrt{2}}}", true),
        ("pi-rounded", json!("\\pi"), "\\boxed{3.141593}", true),
        ("pi-coarse", json!("\\pi"), "\\boxed{3.14}", false),
        ("multiple-choice", json!("C"), "The answer is \\boxed{C}", true),
        ("multiple-choice-paren", json!("C"), "\\boxed{(C)}", true),
        ("multiple-choice-wrong", json!("C"), "\\boxed{B}", false),
        ("marker", json!("42"), "Reasoning.\nFinal answer: 42", true),
        ("no-answer-no-fallback", json!("42"), "the result is 42", false),
        ("empty-box", json!("42"), "\\boxed{}", false),
        ("unbalanced-box", json!("\\frac{1}{2}"), "\\boxed{\\frac{1}{2}", false),
        ("percent", json!("28\\%"), "\\boxed{28}", true),
        ("string-tricks", json!("4"), "\\boxed{\\text{4}}", true),
        ("chat-template-tail", json!("3"), "\\boxed{3}<|im_start|>user \\boxed{4}", true),
        ("think-reopened", json!("5"), "<think>a</think> <think>so \\boxed{5}", false),
        ("abs-vs-identity", json!("x"), "\\boxed{|x|}", false),
        ("sqrt-square-vs-identity", json!("x"), "\\boxed{\\sqrt{x^2}}", false),
        ("max-vs-identity", json!("x"), "\\boxed{\\max(x, 0)}", false),
        ("abs-forms", json!("|x|"), "\\boxed{\\sqrt{x^2}}", true),
        ("union-extra-point", json!("[0, 1]"), "\\boxed{[0, 1] \\cup \\{3.7\\}}", false),
        ("union-extra-interval", json!("[0, 1]"), "\\boxed{[0, 1] \\cup [100, 200]}", false),
        // Text after a value is dropped only when it reads as a unit after a quantity.
        ("text-or-after-value", json!("5"), "\\boxed{5 \\text{ or 6}}", false),
        ("text-possibly-after-value", json!("5"), "\\boxed{5 \\text{ possibly 6}}", false),
        ("text-paren-or", json!("1"), "\\boxed{1 \\text{ (or 2)}}", false),
        ("text-correction", json!("1"), "\\boxed{1\\text{ is wrong, the answer is 2}}", false),
        ("text-after-letter", json!("A"), "\\boxed{A \\text{ B}}", false),
        ("text-after-word", json!("Yes"), "\\boxed{\\text{Yes} \\text{No}}", false),
        ("unit-text", json!("5"), "\\boxed{5 \\text{ cm}}", true),
        ("unit-text-power", json!("15"), "\\boxed{15\\mbox{ cm}^2}", true),
        ("unit-text-words", json!("5"), "\\boxed{5 \\text{ sq. units}}", true),
        // Named values: the prediction must give the gold's names, unless they are one family.
        ("named-bare", json!("x=1, y=2"), "\\boxed{2, 1}", false),
        ("named-other-names", json!("x=1, y=2"), "\\boxed{x=2, z=1}", false),
        ("named-renamed", json!("x=1, y=2"), "\\boxed{a=2, b=1}", false),
        ("named-same", json!("x=1, y=2"), "\\boxed{y=2, x=1}", true),
        ("roots-bare", json!("x_1=1, x_2=2"), "\\boxed{2, 1}", true),
        ("roots-swapped", json!("x_1=1, x_2=2"), "\\boxed{x_1=2, x_2=1}", true),
        // A short gold decimal does not loosen the rounding rule.
        ("gold-decimal-third", json!("0.3"), "\\boxed{1/3}", false),
        ("gold-decimal-pi", json!("3.14"), "\\boxed{\\pi}", false),
        ("gold-decimal-near-half", json!("0.5"), "\\boxed{\\frac{1000}{1999}}", false),
        // After an answer marker the first answer counts; alternatives are hedging.
        ("marker-first-answer", json!("4"), "The answer is 5, not 4", false),
        ("marker-first-answer-right", json!("4"), "The answer is 4, not 5", true),
        ("marker-alternatives", json!("4"), "The answer is 4 or maybe 5.", false),
        ("marker-subject", json!("34"), "Final Answer: The largest $n$ is 34.", true),
        // Every value of a chain must equal the gold.
        ("chain-distinct", json!("1"), "\\boxed{x = 2 = 1}", false),
        ("chain-approx-exact", json!("1"), "\\boxed{x = 1 \\approx 2}", false),
        ("chain-equal", json!("2"), "\\boxed{x = 2 = 2}", true),
        // A stray `</think>` after the answer: the text between the last two, outside any block.
        ("stray-think-close", json!("4"), "<think>\\boxed{3}</think>\\boxed{4}</think>", true),
        ("stray-think-close-not-inside", json!("3"), "<think>\\boxed{3}</think>\\boxed{4}</think>", false),
        ("stray-think-close-block", json!("4"), "<think>a</think><think>\\boxed{4}</think>", false),
    ];
    let input: String = cases
        .iter()
        .map(|(id, gold, completion, _)| {
            json!({"id": id, "prompt": "", "completion": completion, "reference": {"answer": gold}})
                .to_string()
                + "\n"
        })
        .collect();
    let (lines, stderr, ok) = verify("{}", &input, &[]);
    assert!(ok, "{stderr}");
    assert_eq!(lines.len(), cases.len(), "{stderr}");
    for (line, (id, _, _, passed)) in lines.iter().zip(&cases) {
        assert_eq!(line["id"], *id);
        assert_eq!(line["error"], Value::Null, "{id}: {line}");
        assert_eq!(line["passed"], *passed, "{id}: {line}");
        assert_eq!(line["components"]["correct"], if *passed { 1.0 } else { 0.0 }, "{id}: {line}");
    }
}

#[test]
fn prompt_echo_and_per_item_precision() {
    let items = [
        // The completion only repeats the prompt, which holds a worked example's answer.
        json!({"id": "echo", "prompt": "Example: 2+3 gives Answer: \\boxed{5}. Now compute 4+1.",
               "completion": "Example: 2+3 gives Answer: \\boxed{5}. Now compute 4+1.", "reference": {"answer": "5"}}),
        json!({"id": "digits-3", "prompt": "", "completion": "\\boxed{0.333}",
               "reference": {"answer": "\\frac{1}{3}", "precision_digits": 3}}),
        json!({"id": "digits-default", "prompt": "", "completion": "\\boxed{0.333}",
               "reference": {"answer": "\\frac{1}{3}"}}),
    ];
    let input: String = items.iter().map(|i| i.to_string() + "\n").collect();
    let (lines, stderr, ok) = verify("{}", &input, &[]);
    assert!(ok, "{stderr}");
    let passed: Vec<bool> = lines.iter().map(|l| l["passed"].as_bool().unwrap()).collect();
    assert_eq!(passed, [false, true, false], "{lines:?}");
    // Config-level digits apply when the reference has none.
    let (lines, stderr, _) = verify(r#"{"precision_digits": 3}"#, &input, &[]);
    let passed: Vec<bool> = lines.iter().map(|l| l["passed"].as_bool().unwrap()).collect();
    assert_eq!(passed, [false, true, true], "{stderr}");
}

#[test]
fn hostile_inputs_time_out_deterministically_and_fast() {
    let deep = format!("\\boxed{{{}1{}}}", "(".repeat(50_000), ")".repeat(50_000));
    let deep_frac = format!("\\boxed{{{}1{}}}", "\\frac{1}{".repeat(5_000), "}".repeat(5_000));
    let million_digits = format!("\\boxed{{{}}}", "9".repeat(1_000_000));
    let cases: Vec<(&str, String, bool)> = vec![
        // (id, completion, must time out)
        ("power-tower", "\\boxed{10^{10^{10}}}".into(), true),
        ("power-of-sum", "\\boxed{(x+1)^{100000}}".into(), true),
        ("big-factorial", "\\boxed{100000!}".into(), true),
        ("deep-parens", deep, true),
        ("deep-fracs", deep_frac, true),
        ("million-digits", million_digits, true),
        // Each product copies entries into sums of products: 2^k nodes (22 were 6.7 GB, 30 s).
        (
            "matrix-product-chain",
            format!("\\boxed{{{}}}", "\\begin{pmatrix}1&1\\\\1&1\\end{pmatrix}".repeat(200)),
            true,
        ),
        ("unbalanced", "\\boxed{\\frac{1}{2".into(), false),
        ("stray-closers", "\\boxed{1}}}}} ))) ]]]".into(), false),
        ("long-prose", "word ".repeat(200_000), false),
    ];
    let input: String = cases
        .iter()
        .map(|(id, completion, _)| {
            json!({"id": id, "completion": completion, "reference": {"answer": "5"}}).to_string() + "\n"
        })
        .collect();
    let started = Instant::now();
    let (first, stderr, ok) = verify("{}", &input, &[]);
    let elapsed = started.elapsed();
    assert!(ok, "{stderr}");
    assert_eq!(first.len(), cases.len(), "{stderr}");
    for (line, (id, _, times_out)) in first.iter().zip(&cases) {
        assert_eq!(line["passed"], false, "{id}: {line}");
        assert_eq!(line["timed_out"], *times_out, "{id}: {line}");
        if *times_out {
            let error = line["error"].as_str().unwrap_or_default();
            assert!(error.contains("work budget") || error.contains("nesting"), "{id}: {line}");
        } else {
            assert_eq!(line["error"], Value::Null, "{id}: {line}");
        }
        // Well inside the host's 30 s deadline, in a debug build.
        assert!(line["latency_us"].as_u64().unwrap() < 5_000_000, "{id}: {line}");
    }
    assert!(elapsed < Duration::from_secs(60), "{elapsed:?}");
    // Budgets count work, not time: the same verdicts every run.
    let (second, _, _) = verify("{}", &input, &[]);
    let strip = |lines: &[Value]| -> Vec<Value> {
        lines.iter().map(|l| json!([l["passed"], l["timed_out"], l["error"], l["extracted"]])).collect()
    };
    assert_eq!(strip(&first), strip(&second));
}

#[test]
fn explanations_only_when_asked() {
    let input =
        json!({"id": "e", "completion": "\\boxed{0.5}", "reference": {"answer": "1/2"}}).to_string() + "\n";
    let (lines, stderr, ok) = verify("{}", &input, &["--explain"]);
    assert!(ok, "{stderr}");
    let explanation: Vec<&str> =
        lines[0]["explanation"].as_array().unwrap().iter().map(|l| l.as_str().unwrap()).collect();
    assert!(explanation.iter().any(|l| l.contains("\\boxed{}")), "{explanation:?}");
    assert!(explanation.iter().any(|l| l.starts_with("equal: equal as exact values")), "{explanation:?}");
    assert_eq!(lines[0]["extracted"], "0.5");
    let (lines, _, _) = verify("{}", &input, &[]);
    assert!(
        lines[0].get("explanation").is_none_or(|e| e.as_array().is_none_or(Vec::is_empty)),
        "{}",
        lines[0]
    );
}

#[test]
fn bad_references_and_configs_name_the_field() {
    let input = [
        json!({"id": "missing", "completion": "\\boxed{1}", "reference": {}}),
        json!({"id": "unknown", "completion": "\\boxed{1}", "reference": {"answer": "1", "anser": "1"}}),
        json!({"id": "type", "completion": "\\boxed{1}", "reference": {"answer": [1]}}),
    ]
    .iter()
    .map(|i| i.to_string() + "\n")
    .collect::<String>();
    let (lines, stderr, ok) = verify("{}", &input, &[]);
    assert!(ok, "{stderr}");
    let errors: Vec<&str> = lines.iter().map(|l| l["error"].as_str().unwrap_or("")).collect();
    assert!(errors[0].starts_with("reference.answer: missing"), "{errors:?}");
    assert!(errors[1].contains("unknown field `anser`"), "{errors:?}");
    assert!(errors[2].starts_with("reference.answer: expected a string or a number"), "{errors:?}");
    let (_, stderr, ok) = verify(r#"{"fallbak": "last"}"#, "", &[]);
    assert!(!ok);
    assert!(
        stderr.contains("fallbak: unknown key; expected one of fallback, precision_digits, work_budget"),
        "{stderr}"
    );
}
