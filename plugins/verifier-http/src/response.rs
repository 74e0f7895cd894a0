//! The service's answer: strict validation of the response body against the verdict schema.
//!
//! `{"score": number, "passed": bool, "components"?: {name: number}, "extracted"?: string|null,
//! "error"?: string|null, "explanation"?: [string]|null}`. Unknown fields are refused: a typo such
//! as `"component"` or `"explanations"` would otherwise be dropped without a word, and a reward
//! silently missing a part is worse than an error the service's authors see on their first item.

use serde_json::{Map, Value};

/// Component names starting with this are the plugin's own (`http_attempts`); a service may not
/// send them.
pub const RESERVED_PREFIX: &str = "http_";

/// The most components a response may carry: each is logged per step by the trainer.
pub const MAX_COMPONENTS: usize = 64;

/// The longest component name, in bytes.
pub const MAX_COMPONENT_NAME: usize = 64;

/// The fields a response may have.
pub const FIELDS: [&str; 6] = ["score", "passed", "components", "extracted", "error", "explanation"];

/// A validated response.
#[derive(Debug, Clone, PartialEq)]
pub struct ServiceVerdict {
    /// The reward, finite.
    pub score: f64,
    /// Whether the completion counts as correct.
    pub passed: bool,
    /// The service's components, in name order.
    pub components: Vec<(String, f64)>,
    /// The answer it graded.
    pub extracted: Option<String>,
    /// Why the service could not judge the item; never empty.
    pub error: Option<String>,
    /// Its lines for a human.
    pub explanation: Vec<String>,
}

/// Validates a response body. The error names the field and says what was expected and what came.
pub fn parse_response(body: &[u8]) -> Result<ServiceVerdict, String> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Err("response: empty body (expected a JSON object)".to_owned());
    }
    let value: Value = serde_json::from_slice(body).map_err(|error| {
        // Python's json.dumps writes NaN and Infinity by default; say so instead of only "expected value".
        let text = String::from_utf8_lossy(body);
        let hint = if text.contains("NaN") || text.contains("Infinity") {
            " (NaN and Infinity are not JSON: numbers must be finite)"
        } else {
            ""
        };
        format!("response: invalid JSON: {error}{hint}")
    })?;
    let Value::Object(mut object) = value else {
        return Err(format!("response: expected a JSON object, got {}", describe(&value)));
    };
    if let Some(unknown) = object.keys().find(|key| !FIELDS.contains(&key.as_str())) {
        return Err(format!("response field {unknown}: unknown (expected only {})", FIELDS.join(", ")));
    }
    let score = match object.remove("score") {
        None => return Err("response field score: missing (expected a finite number)".to_owned()),
        Some(value) => finite(&value).ok_or_else(|| expected("score", "a finite number", &value))?,
    };
    let passed = match object.remove("passed") {
        None => return Err("response field passed: missing (expected true or false)".to_owned()),
        Some(Value::Bool(passed)) => passed,
        Some(value) => return Err(expected("passed", "true or false", &value)),
    };
    let components = match object.remove("components") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Object(components)) => parse_components(components)?,
        Some(value) => return Err(expected("components", "an object of name: number", &value)),
    };
    let extracted = match object.remove("extracted") {
        None | Some(Value::Null) => None,
        Some(Value::String(extracted)) => Some(extracted),
        Some(value) => return Err(expected("extracted", "a string or null", &value)),
    };
    let error = match object.remove("error") {
        None | Some(Value::Null) => None,
        Some(Value::String(error)) if !error.trim().is_empty() => Some(error),
        Some(value) => return Err(expected("error", "null or a non-empty string", &value)),
    };
    let explanation = match object.remove("explanation") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(lines)) => lines
            .into_iter()
            .enumerate()
            .map(|(index, line)| match line {
                Value::String(line) => Ok(line),
                other => Err(expected(&format!("explanation[{index}]"), "a string", &other)),
            })
            .collect::<Result<_, _>>()?,
        Some(value) => return Err(expected("explanation", "an array of strings or null", &value)),
    };
    Ok(ServiceVerdict { score, passed, components, extracted, error, explanation })
}

fn parse_components(components: Map<String, Value>) -> Result<Vec<(String, f64)>, String> {
    if components.len() > MAX_COMPONENTS {
        return Err(format!(
            "response field components: expected at most {MAX_COMPONENTS} entries, got {}",
            components.len()
        ));
    }
    components
        .into_iter()
        .map(|(name, value)| {
            if name.is_empty() || name.len() > MAX_COMPONENT_NAME {
                return Err(format!(
                    "response field components: expected names of 1 to {MAX_COMPONENT_NAME} bytes, got {:?}",
                    shorten(&name)
                ));
            }
            if name.starts_with(RESERVED_PREFIX) {
                return Err(format!(
                    "response field components.{name}: names starting with {RESERVED_PREFIX} are reserved \
                     for the plugin's own components"
                ));
            }
            let number = finite(&value)
                .ok_or_else(|| expected(&format!("components.{name}"), "a finite number", &value))?;
            Ok((name, number))
        })
        .collect()
}

fn finite(value: &Value) -> Option<f64> {
    value.as_f64().filter(|number| number.is_finite())
}

fn expected(field: &str, what: &str, got: &Value) -> String {
    format!("response field {field}: expected {what}, got {}", describe(got))
}

/// A value as JSON text, shortened: enough to recognise, never a whole huge value.
fn describe(value: &Value) -> String {
    match value {
        Value::Object(_) => "an object".to_owned(),
        Value::Array(_) => "an array".to_owned(),
        other => shorten(&other.to_string()),
    }
}

fn shorten(text: &str) -> String {
    const LIMIT: usize = 40;
    match text.char_indices().nth(LIMIT) {
        Some((end, _)) => format!("{}…", &text[..end]),
        None => text.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(score: f64, passed: bool) -> ServiceVerdict {
        ServiceVerdict {
            score,
            passed,
            components: Vec::new(),
            extracted: None,
            error: None,
            explanation: Vec::new(),
        }
    }

    fn check(body: &str, expected: Result<ServiceVerdict, &str>) {
        assert_eq!(parse_response(body.as_bytes()), expected.map_err(str::to_owned), "body: {body}");
    }

    #[test]
    fn valid_responses() {
        check(r#"{"score": 1, "passed": true}"#, Ok(ok(1.0, true)));
        check(
            r#" {"score": 0.25, "passed": false, "components": null, "extracted": null, "error": null,
                 "explanation": null} "#,
            Ok(ok(0.25, false)),
        );
        check(
            r#"{"score": -2.5e3, "passed": false, "components": {"b": 1, "a": 0.5}, "extracted": "42",
                "explanation": ["gold 42", "pred 41"]}"#,
            Ok(ServiceVerdict {
                components: vec![("a".to_owned(), 0.5), ("b".to_owned(), 1.0)],
                extracted: Some("42".to_owned()),
                explanation: vec!["gold 42".to_owned(), "pred 41".to_owned()],
                ..ok(-2500.0, false)
            }),
        );
        check(
            r#"{"score": 0, "passed": false, "error": "reference has no tests"}"#,
            Ok(ServiceVerdict { error: Some("reference has no tests".to_owned()), ..ok(0.0, false) }),
        );
    }

    #[test]
    fn malformed_responses_name_what_was_wrong() {
        let long_name = "c".repeat(65);
        let too_many: String = (0..65).map(|i| format!("\"c{i}\": 1")).collect::<Vec<_>>().join(", ");
        let cases: Vec<(String, &str)> = vec![
            ("".into(), "response: empty body (expected a JSON object)"),
            ("  \n".into(), "response: empty body (expected a JSON object)"),
            ("<html>oops</html>".into(), "response: invalid JSON: expected value at line 1 column 1"),
            (
                "{\"score\": 1, \"passed\": tru".into(),
                "response: invalid JSON: EOF while parsing a value at line 1 column 26",
            ),
            (
                r#"{"score": NaN, "passed": true}"#.into(),
                "response: invalid JSON: expected value at line 1 column 11 (NaN and Infinity are not JSON: \
                 numbers must be finite)",
            ),
            (
                r#"{"score": Infinity, "passed": true}"#.into(),
                "response: invalid JSON: expected value at line 1 column 11 (NaN and Infinity are not JSON: \
                 numbers must be finite)",
            ),
            (
                r#"{"score": 1e999, "passed": true}"#.into(),
                "response: invalid JSON: number out of range at line 1 column 15",
            ),
            ("[1, 2]".into(), "response: expected a JSON object, got an array"),
            ("\"ok\"".into(), "response: expected a JSON object, got \"ok\""),
            (
                r#"{"score": 1, "passed": true, "pass": true}"#.into(),
                "response field pass: unknown (expected only score, passed, components, extracted, error, \
                 explanation)",
            ),
            (r#"{"passed": true}"#.into(), "response field score: missing (expected a finite number)"),
            (
                r#"{"score": "high", "passed": true}"#.into(),
                "response field score: expected a finite number, got \"high\"",
            ),
            (
                r#"{"score": null, "passed": true}"#.into(),
                "response field score: expected a finite number, got null",
            ),
            (
                r#"{"score": [1], "passed": true}"#.into(),
                "response field score: expected a finite number, got an array",
            ),
            (r#"{"score": 1}"#.into(), "response field passed: missing (expected true or false)"),
            (
                r#"{"score": 1, "passed": "yes"}"#.into(),
                "response field passed: expected true or false, got \"yes\"",
            ),
            (r#"{"score": 1, "passed": 1}"#.into(), "response field passed: expected true or false, got 1"),
            (
                r#"{"score": 1, "passed": true, "components": [1]}"#.into(),
                "response field components: expected an object of name: number, got an array",
            ),
            (
                r#"{"score": 1, "passed": true, "components": {"a": "1"}}"#.into(),
                "response field components.a: expected a finite number, got \"1\"",
            ),
            (
                r#"{"score": 1, "passed": true, "components": {"http_attempts": 1}}"#.into(),
                "response field components.http_attempts: names starting with http_ are reserved for the \
                 plugin's own components",
            ),
            (
                r#"{"score": 1, "passed": true, "components": {"": 1}}"#.into(),
                "response field components: expected names of 1 to 64 bytes, got \"\"",
            ),
            (
                format!(r#"{{"score": 1, "passed": true, "components": {{"{long_name}": 1}}}}"#),
                "response field components: expected names of 1 to 64 bytes, got \"cccccccccccccccccccccccccccccccccccccccc…\"",
            ),
            (
                format!(r#"{{"score": 1, "passed": true, "components": {{{too_many}}}}}"#),
                "response field components: expected at most 64 entries, got 65",
            ),
            (
                r#"{"score": 1, "passed": true, "extracted": 42}"#.into(),
                "response field extracted: expected a string or null, got 42",
            ),
            (
                r#"{"score": 1, "passed": true, "error": ""}"#.into(),
                "response field error: expected null or a non-empty string, got \"\"",
            ),
            (
                r#"{"score": 1, "passed": true, "error": false}"#.into(),
                "response field error: expected null or a non-empty string, got false",
            ),
            (
                r#"{"score": 1, "passed": true, "explanation": "one line"}"#.into(),
                "response field explanation: expected an array of strings or null, got \"one line\"",
            ),
            (
                r#"{"score": 1, "passed": true, "explanation": ["a", 2]}"#.into(),
                "response field explanation[1]: expected a string, got 2",
            ),
            (
                format!(r#"{{"score": "{}", "passed": true}}"#, "x".repeat(100)),
                "response field score: expected a finite number, got \"xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx…",
            ),
        ];
        for (body, expected) in &cases {
            check(body, Err(expected));
        }
    }

    #[test]
    fn deep_nesting_is_an_error_not_a_stack_overflow() {
        let body = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
        let error = parse_response(body.as_bytes()).unwrap_err();
        assert!(error.starts_with("response: invalid JSON: recursion limit exceeded"), "{error}");
    }
}
