//! The item's JSON as a Python literal, so the sandboxed side reads it with `eval` on text only
//! the host wrote, without importing `json` (which costs more than the interpreter's start).

use std::fmt::Write;

use serde_json::Value;

/// `value` as a Python expression of dicts, lists, str, int, float, bool and None that evaluates
/// (with no builtins) to what `json.loads` would make of the same JSON.
pub fn python_literal(value: &Value) -> String {
    let mut out = String::new();
    write_value(&mut out, value);
    out
}

fn write_value(out: &mut String, value: &Value) {
    match value {
        Value::Null => out.push_str("None"),
        Value::Bool(true) => out.push_str("True"),
        Value::Bool(false) => out.push_str("False"),
        Value::Number(number) => write_number(out, number),
        Value::String(text) => write_str(out, text),
        Value::Array(items) => {
            out.push('[');
            for item in items {
                write_value(out, item);
                out.push(',');
            }
            out.push(']');
        }
        Value::Object(map) => {
            out.push('{');
            for (key, item) in map {
                write_str(out, key);
                out.push(':');
                write_value(out, item);
                out.push(',');
            }
            out.push('}');
        }
    }
}

fn write_number(out: &mut String, number: &serde_json::Number) {
    if let Some(int) = number.as_i64() {
        let _ = write!(out, "{int}");
    } else if let Some(int) = number.as_u64() {
        let _ = write!(out, "{int}");
    } else {
        // JSON has no NaN or infinity, so this is finite; Rust's `{:?}` of an f64 is a Python
        // float literal (`1.0`, `1e-7`, `1e300`) that reads back to the same value.
        let float = number.as_f64().unwrap_or(0.0);
        let _ = write!(out, "{float:?}");
    }
}

/// A double-quoted Python str: printable ASCII as is, everything else escaped, so the literal is
/// pure ASCII and no character can end the string or the line early.
fn write_str(out: &mut String, text: &str) {
    out.push('"');
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            ' '..='~' => out.push(c),
            c if (c as u32) < 0x100 => {
                let _ = write!(out, "\\x{:02x}", c as u32);
            }
            c if (c as u32) < 0x10000 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => {
                let _ = write!(out, "\\U{:08x}", c as u32);
            }
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(json: &str, expected: &str) {
        let value: Value = serde_json::from_str(json).unwrap();
        assert_eq!(python_literal(&value), expected, "{json}");
    }

    #[test]
    fn json_becomes_an_ascii_python_literal() {
        let cases = [
            ("null", "None"),
            ("[true, false]", "[True,False,]"),
            ("-12", "-12"),
            ("18446744073709551615", "18446744073709551615"),
            ("0.5", "0.5"),
            ("1e300", "1e300"),
            ("1.0", "1.0"),
            (r#""a\"b\\c""#, r#""a\"b\\c""#),
            (r#""line\nbreak\u0000""#, r#""line\x0abreak\x00""#),
            (r#""é€😀""#, r#""\xe9\u20ac\U0001f600""#),
            (
                r#"{"id": "1", "reference": {"answer": [1, 2.5]}}"#,
                r#"{"id":"1","reference":{"answer":[1,2.5,],},}"#,
            ),
            ("{}", "{}"),
            ("[]", "[]"),
        ];
        for (json, expected) in cases {
            check(json, expected);
        }
    }
}
