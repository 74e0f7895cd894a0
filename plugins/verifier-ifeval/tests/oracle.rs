//! The plugin against the reference implementation: every item of
//! `tests/data/verifier_ifeval/oracle.jsonl` (expected values written by `oracle/make_cases.py`
//! from IFEval's own Python checks) must get the same strict and loose result per instruction,
//! except 16 language checks where whatlang and langdetect disagree on short texts (README.md;
//! `tests/tests/verifier_ifeval.rs` lists them one by one).

use rlvr_verifier_ifeval::{IfevalConfig, IfevalVerifier};
use serde_json::Value;

#[test]
fn every_instruction_matches_the_reference() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/data/verifier_ifeval/oracle.jsonl");
    let text = std::fs::read_to_string(path).expect("oracle file");
    let verifier = IfevalVerifier::new(IfevalConfig::default());
    let mut mismatches = Vec::new();
    let mut checks = 0;
    for line in text.lines() {
        let case: Value = serde_json::from_str(line).expect("oracle line");
        let completion = case["completion"].as_str().expect("completion");
        let (results, _) =
            verifier.evaluate(completion, &case["reference"].to_string(), false).expect("valid reference");
        for (i, result) in results.iter().enumerate() {
            checks += 1;
            let expected = (case["strict"][i].as_bool().unwrap(), case["loose"][i].as_bool().unwrap());
            if (result.strict, result.loose) != expected {
                let kwargs = &case["reference"]["kwargs"][i];
                mismatches.push(format!(
                    "{} {} {kwargs}: got strict/loose {}/{}, reference {}/{} on {completion:?}",
                    case["id"], result.name, result.strict, result.loose, expected.0, expected.1
                ));
            }
        }
    }
    assert!(checks > 2000, "only {checks} checks read");
    let language =
        ["language:response_language", "change_case:english_capital", "change_case:english_lowercase"];
    let (known, other): (Vec<&String>, Vec<&String>) =
        mismatches.iter().partition(|line| language.iter().any(|id| line.contains(&format!(" {id} "))));
    assert!(other.is_empty(), "{} of {checks} differ:\n{}", other.len(), mismatches.join("\n"));
    // FIXME: the language detector differs from langdetect on short texts; asserted as it is.
    assert_eq!(known.len(), 16, "language checks that differ:\n{}", mismatches.join("\n"));
}
