//! Checking a plugin's options without creating it: what they refer to ([`OptionsReport`]) and
//! what is wrong with them ([`OptionError`]), for the daemon to check at submit.
//!
//! # The contract
//!
//! `check_options(config_json)` gets the same JSON object `from_config` would (the plugin's own
//! keys of its spec section) and either
//! - accepts it, returning an [`OptionsReport`] as JSON text:
//!   `{"secrets": [{"key": "bearer_token_secret", "name": "grader-token"}],
//!   "urls": [{"key": "url", "url": "https://grader.example/v1"}], "paths": [{"key": "work_root",
//!   "path": "/srv/x"}], "digests": [{"key": "source", "sha256": "<hex>"}]}` — every secret name,
//!   outbound URL and server path the options refer to, and the digest of content they carry
//!   (to be recorded with the job), each with the key that names it, so the host can
//!   check them against the team's grants and the operator's allow-list without knowing the
//!   plugin (both lists may be empty or absent); or
//! - refuses it with a [`PluginError`] of kind `InvalidConfig` whose message is
//!   `"<key>: <what was wrong and what was expected>"` ([`OptionError`]'s `Display`), the key
//!   being the path inside the plugin's options (`fallbak`, `retry_on[1]`, `history.p0.passes`)
//!   or empty for a problem of the whole object. The host prefixes the spec's own path
//!   (`verifiers[1].fallbak: unknown key; expected one of fallback, precision_digits,
//!   work_budget`).
//!
//! It must be cheap and have no side effects: the daemon calls it on every submit, in its own
//! process. It creates no clients, starts no processes and reads no files or environment.
//!
//! Why JSON text and [`parse_options`]: plugin configs, the options report and the host context all
//! cross the boundary as JSON text, and each plugin parses its own keys with `deny_unknown_fields`
//! through `parse_options`, so every plugin's refusals read the same, a key and a message, never
//! serde's "line 1 column 9" of JSON the user did not write. That is why this crate depends on
//! serde, serde_json and serde_path_to_error (small, pure Rust).

use std::fmt;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::PluginError;

/// What a plugin's options refer to outside the plugin; `check_options`' answer.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct OptionsReport {
    /// Secret names the options use (resolved by the host into [`HostContext`](crate::HostContext)).
    #[serde(default)]
    pub secrets: Vec<SecretRef>,
    /// Destinations the plugin will send requests to.
    #[serde(default)]
    pub urls: Vec<UrlRef>,
    /// Server paths the options name (an interpreter, a directory to read or write): the host
    /// refuses them in a tenant's job, where only the operator chooses paths. Appended; absent in
    /// the reports of plugins built before it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub paths: Vec<PathRef>,
    /// Digests of content the options carry (a grader's source code), each with the key that
    /// holds it, for the host to record with the job and its manifest: what graded a run can be
    /// told apart from a later edit of the same options. Appended; absent in the reports of
    /// plugins built before it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub digests: Vec<DigestRef>,
}

/// The digest of content an option carries.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DigestRef {
    /// The option's key path, e.g. `source`.
    pub key: String,
    /// Lowercase hex SHA-256 of the option's value as UTF-8 bytes.
    pub sha256: String,
}

/// A server path named by an option.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PathRef {
    /// The option's key path, e.g. `work_root` or `read_paths[0]`.
    pub key: String,
    /// The path as written.
    pub path: String,
}

/// A secret named by an option.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SecretRef {
    /// The option's key path, e.g. `bearer_token_secret`.
    pub key: String,
    /// The secret's name, as the operator declared it.
    pub name: String,
}

/// An outbound URL named by an option.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UrlRef {
    /// The option's key path, e.g. `url`.
    pub key: String,
    /// The URL as written.
    pub url: String,
}

impl OptionsReport {
    /// Adds a secret name used by option `key`.
    pub fn secret(mut self, key: &str, name: &str) -> Self {
        self.secrets.push(SecretRef { key: key.to_owned(), name: name.to_owned() });
        self
    }

    /// Adds a server path named by option `key`.
    pub fn path(mut self, key: &str, path: &str) -> Self {
        self.paths.push(PathRef { key: key.to_owned(), path: path.to_owned() });
        self
    }

    /// Adds the SHA-256 (lowercase hex) of the content option `key` carries.
    pub fn digest(mut self, key: &str, sha256: &str) -> Self {
        self.digests.push(DigestRef { key: key.to_owned(), sha256: sha256.to_owned() });
        self
    }

    /// Adds an outbound URL named by option `key`.
    pub fn url(mut self, key: &str, url: &str) -> Self {
        self.urls.push(UrlRef { key: key.to_owned(), url: url.to_owned() });
        self
    }
}

/// A refused option: where it is in the plugin's options and what was wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OptionError {
    /// The key path inside the plugin's options (`retries`, `retry_on[1]`, `history.p0.passes`);
    /// empty when the problem is the whole object.
    pub key: String,
    /// What was wrong and what was expected, lowercase, e.g. `expected 0 to 10, got 99`.
    pub message: String,
}

impl OptionError {
    /// A problem with option `key`.
    pub fn new(key: impl Into<String>, message: impl Into<String>) -> Self {
        OptionError { key: key.into(), message: message.into() }
    }

    /// Reads the key back from a message of the form `"<key>: <message>"` — what crosses the ABI
    /// as a [`PluginError`]'s message. A prefix with whitespace in it is not a key (a sentence, or
    /// several keys at once): then the key is empty and the whole text is the message.
    pub fn parse(text: &str) -> Self {
        match text.split_once(": ") {
            Some((key, message)) if is_key_path(key) => OptionError::new(key, message),
            _ => OptionError::new("", text),
        }
    }
}

/// For a plugin's tests: each of `answers` about options `json` (what `check_options` said, and
/// what creating the plugin said, as `created.map(|_| OptionsReport::default())
/// .map_err(OptionError::from)`) is `expected`: accepted with nothing to report, or refused at
/// `(key, message)`. Panics with `json` in the message otherwise.
pub fn assert_answers(
    json: &str,
    answers: impl IntoIterator<Item = Result<OptionsReport, OptionError>>,
    expected: Result<(), (&str, &str)>,
) {
    for got in answers {
        match (got, expected) {
            (Ok(report), Ok(())) => assert_eq!(report, OptionsReport::default(), "{json}"),
            (Err(error), Err((key, message))) => {
                assert_eq!((error.key.as_str(), error.message.as_str()), (key, message), "{json}")
            }
            (got, expected) => panic!("{json}: got {got:?}, expected {expected:?}"),
        }
    }
}

/// Whether `text` reads as a key path: non-empty, no whitespace, no `:`.
fn is_key_path(text: &str) -> bool {
    !text.is_empty() && !text.chars().any(|c| c.is_whitespace() || c == ':' || c == ',')
}

impl fmt::Display for OptionError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.key.is_empty() {
            f.write_str(&self.message)
        } else {
            write!(f, "{}: {}", self.key, self.message)
        }
    }
}

impl std::error::Error for OptionError {}

impl From<OptionError> for PluginError {
    fn from(error: OptionError) -> Self {
        PluginError::invalid_config(error.to_string())
    }
}

impl From<PluginError> for OptionError {
    /// The key of an `InvalidConfig` error's `"<key>: <message>"`; other kinds keep their whole
    /// text (`panic: …`) with no key.
    fn from(error: PluginError) -> Self {
        match error.kind {
            crate::PluginErrorKind::InvalidConfig => OptionError::parse(error.message.as_str()),
            _ => OptionError::new("", error.to_string()),
        }
    }
}

/// Parses a plugin's options (`config_json`; blank text is `{}`) into `T`, refusing with the key
/// and a message in the spec's terms rather than serde's: `fallbak: unknown key; expected one of
/// fallback, precision_digits, work_budget`, `retries: expected u32, got a string "x"` — never a
/// position in JSON text the user did not write. `T` refuses unknown keys with
/// `#[serde(deny_unknown_fields)]`.
pub fn parse_options<T: DeserializeOwned>(config_json: &str) -> Result<T, OptionError> {
    let text = if config_json.trim().is_empty() { "{}" } else { config_json };
    let value: serde_json::Value =
        serde_json::from_str(text).map_err(|error| describe(String::new(), &error))?;
    if !value.is_object() {
        // serde reads a struct from an array too; options are keys, so only an object is.
        return Err(OptionError::new(
            "",
            format!("expected a JSON object of the plugin's options, got {value}"),
        ));
    }
    serde_path_to_error::deserialize(value).map_err(|error| describe(key_path(error.path()), error.inner()))
}

/// `a.b[0].c` from serde_path_to_error's segments (its own rendering writes `?` and `.`).
fn key_path(path: &serde_path_to_error::Path) -> String {
    use serde_path_to_error::Segment;
    let mut key = String::new();
    for segment in path {
        match segment {
            Segment::Seq { index } => key.push_str(&format!("[{index}]")),
            Segment::Map { key: name } | Segment::Enum { variant: name } => {
                if !key.is_empty() {
                    key.push('.');
                }
                key.push_str(name);
            }
            Segment::Unknown => {}
        }
    }
    key
}

/// serde_json's message for the value at `key`, in our words.
fn describe(key: String, error: &serde_json::Error) -> OptionError {
    if !error.is_data() {
        // Not a data error: the text is not JSON at all (a host's bug, or a hand-made call).
        return OptionError::new(
            "",
            format!("expected a JSON object of the plugin's options: {}", without_position(error)),
        );
    }
    let text = without_position(error);
    let names = |rest: &str| rest.split('`').skip(1).step_by(2).collect::<Vec<_>>().join(", ");
    if let Some(rest) = text.strip_prefix("unknown field `") {
        let expected = rest.split_once("`, ").map_or("", |(_, expected)| expected);
        let message = if expected.starts_with("there are no fields") {
            "unknown key; no keys are taken here".to_owned()
        } else {
            format!("unknown key; expected one of {}", names(expected))
        };
        return OptionError::new(key, message);
    }
    if let Some(rest) = text.strip_prefix("unknown variant `") {
        if let Some((got, expected)) = rest.split_once("`, ") {
            return OptionError::new(key, format!("expected one of {}, got {got:?}", names(expected)));
        }
    }
    if let Some(rest) = text.strip_prefix("missing field `") {
        let field = rest.split('`').next().unwrap_or_default();
        let key = if key.is_empty() { field.to_owned() } else { format!("{key}.{field}") };
        return OptionError::new(key, "missing; this key is required");
    }
    for prefix in ["invalid type: ", "invalid value: "] {
        if let Some(rest) = text.strip_prefix(prefix)
            && let Some((got, expected)) = rest.rsplit_once(", expected ")
        {
            return OptionError::new(key, format!("expected {expected}, got {got}"));
        }
    }
    if let Some((length, expected)) =
        text.strip_prefix("invalid length ").and_then(|rest| rest.split_once(", expected "))
    {
        return OptionError::new(key, format!("expected {expected}, got length {length}"));
    }
    OptionError::new(key, text)
}

/// serde_json's message without ` at line L column C`: the user wrote TOML or a JSON spec, not
/// the JSON object the host made of their keys.
fn without_position(error: &serde_json::Error) -> String {
    let text = error.to_string();
    if error.line() == 0 {
        return text;
    }
    let suffix = format!(" at line {} column {}", error.line(), error.column());
    text.strip_suffix(&suffix).map_or(text.clone(), str::to_owned)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use serde::Deserialize;

    use super::*;

    #[derive(Debug, Deserialize, PartialEq)]
    #[serde(deny_unknown_fields, default)]
    struct Keys {
        retries: u32,
        mode: Mode,
        list: Vec<Mode>,
        nested: BTreeMap<String, Inner>,
    }

    #[derive(Debug, Deserialize, PartialEq, Default)]
    #[serde(rename_all = "lowercase")]
    enum Mode {
        #[default]
        Strict,
        Loose,
    }

    #[derive(Debug, Deserialize, PartialEq)]
    #[serde(deny_unknown_fields)]
    struct Inner {
        passes: f64,
        attempts: f64,
    }

    impl Default for Keys {
        fn default() -> Self {
            Keys { retries: 2, mode: Mode::Strict, list: Vec::new(), nested: BTreeMap::new() }
        }
    }

    fn check(json: &str, expected: Result<(), (&str, &str)>) {
        match (parse_options::<Keys>(json), expected) {
            (Ok(_), Ok(())) => {}
            (Err(error), Err((key, message))) => {
                assert_eq!((error.key.as_str(), error.message.as_str()), (key, message), "{json}")
            }
            (got, expected) => panic!("{json}: got {got:?}, expected {expected:?}"),
        }
    }

    #[test]
    fn serde_errors_become_a_key_and_a_message_without_a_position() {
        check("", Ok(()));
        check("{}", Ok(()));
        check(r#"{"retries": 3, "mode": "loose"}"#, Ok(()));
        check(
            r#"{"retrys": 3}"#,
            Err(("retrys", "unknown key; expected one of retries, mode, list, nested")),
        );
        check(r#"{"retries": "x"}"#, Err(("retries", "expected u32, got string \"x\"")));
        check(r#"{"retries": -1}"#, Err(("retries", "expected u32, got integer `-1`")));
        check(r#"{"mode": "fuzzy"}"#, Err(("mode", "expected one of strict, loose, got \"fuzzy\"")));
        check(
            r#"{"list": ["strict", "lax"]}"#,
            Err(("list[1]", "expected one of strict, loose, got \"lax\"")),
        );
        check(
            r#"{"nested": {"p 1": {"passes": 1}}}"#,
            Err(("nested.p 1.attempts", "missing; this key is required")),
        );
        check(
            r#"{"nested": {"p1": {"passes": 1, "attempts": 2, "rate": 0}}}"#,
            Err(("nested.p1.rate", "unknown key; expected one of passes, attempts")),
        );
        check(r#"{"list": 1}"#, Err(("list", "expected a sequence, got integer `1`")));
        check("[]", Err(("", "expected a JSON object of the plugin's options, got []")));
        check("{", Err(("", "expected a JSON object of the plugin's options: EOF while parsing an object")));
        check(r#"{} x"#, Err(("", "expected a JSON object of the plugin's options: trailing characters")));
    }

    #[test]
    fn a_key_survives_the_plugin_error_that_carries_it() {
        let cases = [
            ("retries: expected 0 to 10, got 99", ("retries", "expected 0 to 10, got 99")),
            ("retry_on[1]: expected one of a, b", ("retry_on[1]", "expected one of a, b")),
            (
                "think_open, think_close: expected two tags",
                ("", "think_open, think_close: expected two tags"),
            ),
            ("math verifier config: x", ("", "math verifier config: x")),
            ("no colon here", ("", "no colon here")),
        ];
        for (text, (key, message)) in cases {
            let error = OptionError::from(PluginError::invalid_config(text));
            assert_eq!((error.key.as_str(), error.message.as_str()), (key, message));
            assert_eq!(PluginError::from(error).message.as_str(), text);
        }
        let panic = OptionError::from(PluginError::new(crate::PluginErrorKind::Panic, "boom: here"));
        assert_eq!((panic.key.as_str(), panic.message.as_str()), ("", "panic: boom: here"));
    }

    #[test]
    fn a_report_round_trips_as_the_documented_json() {
        let report =
            OptionsReport::default().secret("bearer_token_secret", "grader-token").url("url", "https://g/");
        let json = serde_json::to_string(&report).unwrap();
        assert_eq!(
            json,
            r#"{"secrets":[{"key":"bearer_token_secret","name":"grader-token"}],"urls":[{"key":"url","url":"https://g/"}]}"#
        );
        assert_eq!(serde_json::from_str::<OptionsReport>(&json).unwrap(), report);
        assert_eq!(serde_json::from_str::<OptionsReport>("{}").unwrap(), OptionsReport::default());
        let with_path = OptionsReport::default().path("work_root", "/w");
        let json = serde_json::to_string(&with_path).unwrap();
        assert_eq!(json, r#"{"secrets":[],"urls":[],"paths":[{"key":"work_root","path":"/w"}]}"#);
        assert_eq!(serde_json::from_str::<OptionsReport>(&json).unwrap(), with_path);
        let with_digest = OptionsReport::default().digest("source", "ab12");
        let json = serde_json::to_string(&with_digest).unwrap();
        assert_eq!(json, r#"{"secrets":[],"urls":[],"digests":[{"key":"source","sha256":"ab12"}]}"#);
        assert_eq!(serde_json::from_str::<OptionsReport>(&json).unwrap(), with_digest);
    }
}
