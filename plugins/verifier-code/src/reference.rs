//! The item's `reference` (design.md §1) and the solution taken from the completion.

use serde::Deserialize;

/// `{"language": "python", "asserts": [...]}` or `{"language": "python", "io": [...]}`, with
/// optional `timeout_ms` (per test) and `setup` (run by the trusted evaluator before the asserts,
/// not counted as a test: imports and helpers the asserts use).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Reference {
    /// Only `python`; absent means python.
    #[serde(default)]
    pub language: Option<String>,
    /// Python statements, one test each; a test passes when it raises nothing.
    #[serde(default)]
    pub asserts: Option<Vec<String>>,
    /// Stdin/stdout pairs, one test each.
    #[serde(default)]
    pub io: Option<Vec<IoCase>>,
    /// Time for each test, milliseconds.
    #[serde(default)]
    pub timeout_ms: Option<u64>,
    /// Code the evaluator runs before the asserts (never sent to the sandbox).
    #[serde(default)]
    pub setup: Option<String>,
}

/// One stdin/stdout test.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IoCase {
    /// What the solution reads.
    #[serde(default)]
    pub stdin: String,
    /// What it must print.
    pub stdout: String,
}

/// The tests of one item.
#[derive(Debug, Clone, PartialEq)]
pub enum Tests {
    /// Assert statements, with the setup code.
    Asserts { setup: String, tests: Vec<String> },
    /// Stdin/stdout pairs.
    Io(Vec<IoCase>),
}

impl Tests {
    /// How many tests (never 0: [`parse`] refuses an empty list).
    pub fn count(&self) -> usize {
        match self {
            Tests::Asserts { tests, .. } => tests.len(),
            Tests::Io(cases) => cases.len(),
        }
    }
}

/// Parses and checks a reference; errors name the field and what was expected.
pub fn parse(reference_json: &str) -> Result<(Tests, Option<u64>), String> {
    let reference: Reference =
        serde_json::from_str(reference_json).map_err(|error| format!("reference: {error}"))?;
    if let Some(language) = &reference.language
        && language != "python"
    {
        return Err(format!("reference.language: expected \"python\", got {language:?}"));
    }
    if reference.timeout_ms == Some(0) {
        return Err("reference.timeout_ms: expected a positive number of milliseconds".to_owned());
    }
    let tests = match (reference.asserts, reference.io) {
        (Some(asserts), None) if !asserts.is_empty() => {
            Tests::Asserts { setup: reference.setup.unwrap_or_default(), tests: asserts }
        }
        (None, Some(io)) if !io.is_empty() => {
            if reference.setup.is_some() {
                return Err("reference.setup: only used with asserts, not with io".to_owned());
            }
            Tests::Io(io)
        }
        (Some(_), Some(_)) => return Err("reference: expected either asserts or io, not both".to_owned()),
        (Some(_), None) => return Err("reference.asserts: expected at least one test".to_owned()),
        (None, Some(_)) => return Err("reference.io: expected at least one test".to_owned()),
        (None, None) => {
            return Err(
                "reference: expected asserts (a list of statements) or io (stdin/stdout pairs)".to_owned()
            );
        }
    };
    Ok((tests, reference.timeout_ms))
}

/// The solution: the body of the last fenced code block of the completion (an unclosed last
/// fence runs to the end, as when generation stopped at the token limit), or the whole
/// completion when it has no fence.
pub fn extract_code(completion: &str) -> &str {
    let mut last: Option<&str> = None;
    let mut open: Option<(usize, &str)> = None; // (body start, fence)
    let mut offset = 0;
    for line in completion.split_inclusive('\n') {
        let trimmed = line.trim_start_matches(' ');
        let indent = line.len() - trimmed.len();
        let fence_len = trimmed.chars().take_while(|&c| c == '`').count();
        if indent <= 3 && fence_len >= 3 {
            let fence = &trimmed[..fence_len];
            match open {
                None => open = Some((offset + line.len(), fence)),
                Some((start, opening))
                    if fence.len() >= opening.len() && trimmed[fence_len..].trim().is_empty() =>
                {
                    last = Some(&completion[start..offset]);
                    open = None;
                }
                Some(_) => {}
            }
        }
        offset += line.len();
    }
    if let Some((start, _)) = open {
        return &completion[start.min(completion.len())..];
    }
    last.unwrap_or(completion)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(completion: &str, expected: &str) {
        assert_eq!(extract_code(completion), expected, "completion: {completion:?}");
    }

    #[test]
    fn code_extraction() {
        let cases: &[(&str, &str)] = &[
            ("print(1)\n", "print(1)\n"),
            ("Here:\n```python\nx = 1\n```\nDone.", "x = 1\n"),
            ("```\na\n```\ntext\n```py\nb\n```", "b\n"),
            // unclosed last fence: the rest of the completion
            ("```python\ndef f():\n    return 1\n", "def f():\n    return 1\n"),
            // a longer fence holds shorter ones
            ("````md\n```python\ninner\n```\n````", "```python\ninner\n```\n"),
            // a fence line with text after it does not close
            ("```python\na = '```x'\n```\n", "a = '```x'\n"),
            ("", ""),
            ("```", ""),
        ];
        for (completion, expected) in cases {
            check(completion, expected);
        }
    }

    fn check_reference(json: &str, expected: Result<usize, &str>) {
        let got = parse(json).map(|(tests, _)| tests.count());
        match (&got, &expected) {
            (Ok(n), Ok(m)) => assert_eq!(n, m, "{json}"),
            (Err(message), Err(prefix)) => assert!(message.starts_with(prefix), "{json}: {message}"),
            _ => panic!("{json}: got {got:?}, expected {expected:?}"),
        }
    }

    #[test]
    fn references() {
        let cases: &[(&str, Result<usize, &str>)] = &[
            (r#"{"language":"python","asserts":["assert f(1) == 2","assert f(2) == 3"]}"#, Ok(2)),
            (r#"{"io":[{"stdin":"1\n","stdout":"2\n"}],"timeout_ms":500}"#, Ok(1)),
            (r#"{"language":"rust","asserts":["x"]}"#, Err("reference.language: expected \"python\"")),
            (r#"{"asserts":[]}"#, Err("reference.asserts: expected at least one test")),
            (r#"{"io":[]}"#, Err("reference.io: expected at least one test")),
            (r#"{"asserts":["a"],"io":[{"stdout":""}]}"#, Err("reference: expected either asserts or io")),
            (r#"{}"#, Err("reference: expected asserts")),
            (r#"{"asserts":["a"],"timeout_ms":0}"#, Err("reference.timeout_ms: expected a positive")),
            (r#"{"asserts":["a"],"tests":1}"#, Err("reference: unknown field `tests`")),
            (r#"{"io":[{"stdin":"1"}]}"#, Err("reference: missing field `stdout`")),
            (
                r#"{"io":[{"stdout":"1"}],"setup":"import math"}"#,
                Err("reference.setup: only used with asserts"),
            ),
        ];
        for (json, expected) in cases {
            check_reference(json, *expected);
        }
    }
}
