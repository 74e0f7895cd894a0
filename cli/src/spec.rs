//! `rlvrctl submit`'s side of a spec: the file read, its data files' relative paths made absolute
//! against its own directory (they are uploaded as the team's datasets before the submit:
//! `rlvr_client::Client::upload_spec_data`; the daemon reads no path a spec writes), and a fresh
//! idempotency key so that the client's own retries never make a second job.
//!
//! A checked spec (`submit --dry-run`) is printed back as TOML.

use std::path::{Path, PathBuf};
use std::time::SystemTime;

use rlvr_client::SpecFormat;
use rlvr_client::settings::toml_error_line;
use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::BadInput;

/// A spec ready to send.
pub(crate) struct PreparedSpec {
    /// The spec's text, paths made absolute.
    pub(crate) body: String,
    pub(crate) format: SpecFormat,
}

impl PreparedSpec {
    /// Whether it is a pipeline spec (a `pipeline` table), which goes to the pipelines routes.
    pub(crate) fn is_pipeline(&self) -> bool {
        match self.format {
            SpecFormat::Toml => {
                self.body.parse::<toml::Table>().is_ok_and(|table| table.contains_key("pipeline"))
            }
            SpecFormat::Json => {
                serde_json::from_str::<Value>(&self.body).is_ok_and(|spec| spec.get("pipeline").is_some())
            }
        }
    }
}

/// Reads a spec file and makes its paths absolute (see [`prepare_spec`]).
pub(crate) fn read_spec(file: &Path) -> Result<PreparedSpec, BadInput> {
    let text = std::fs::read_to_string(file)
        .map_err(|error| BadInput(format!("cannot read {}: {error}", file.display())))?;
    let absolute = std::path::absolute(file)
        .map_err(|error| BadInput(format!("cannot resolve {}: {error}", file.display())))?;
    let base = absolute.parent().unwrap_or(Path::new("/"));
    let format = if file.extension().is_some_and(|ext| ext.eq_ignore_ascii_case("json")) {
        SpecFormat::Json
    } else {
        SpecFormat::Toml
    };
    let home = std::env::var_os("HOME").filter(|home| !home.is_empty()).map(PathBuf::from);
    let body = prepare_spec(&text, format, base, home.as_deref())
        .map_err(|message| BadInput(format!("{}: {message}", file.display())))?;
    Ok(PreparedSpec { body, format })
}

/// The spec fields that may name local files, as (section, key): the data, uploaded at submit.
/// Models are names (`builtin:`, `base:`, `line:`), never local paths.
const PATH_FIELDS: [(&str, &str); 3] = [("data", "train"), ("data", "heldout"), ("data", "canaries")];

/// The spec's text with every relative path of [`PATH_FIELDS`] made absolute against `base`
/// (the spec file's directory), in the same format. Everything else is left for the daemon to
/// judge, wrong types included.
fn prepare_spec(text: &str, format: SpecFormat, base: &Path, home: Option<&Path>) -> Result<String, String> {
    match format {
        SpecFormat::Toml => {
            let mut table: toml::Table = text.parse().map_err(|error: toml::de::Error| {
                let line =
                    toml_error_line(text, &error).map(|line| format!(" (line {line})")).unwrap_or_default();
                format!("not valid TOML{line}: {}", error.message())
            })?;
            // A job spec's fields, or each stage's of a pipeline spec.
            let specs: Vec<&mut toml::Table> = if table.contains_key("stages") {
                match table.get_mut("stages") {
                    Some(toml::Value::Array(stages)) => {
                        stages.iter_mut().filter_map(toml::Value::as_table_mut).collect()
                    }
                    _ => Vec::new(),
                }
            } else {
                vec![&mut table]
            };
            for spec in specs {
                for (section, key) in PATH_FIELDS {
                    if let Some(toml::Value::String(value)) =
                        spec.get_mut(section).and_then(|section| section.get_mut(key))
                        && let Some(absolute) = absolute_path(section, value, base, home)?
                    {
                        *value = absolute;
                    }
                }
            }
            toml::to_string(&table).map_err(|error| format!("cannot write the spec back as TOML: {error}"))
        }
        SpecFormat::Json => {
            let mut spec: Value =
                serde_json::from_str(text).map_err(|error| format!("not valid JSON: {error}"))?;
            let count = spec.get("stages").and_then(Value::as_array).map(Vec::len);
            let prefixes: Vec<String> = match count {
                Some(count) => (0..count).map(|i| format!("/stages/{i}")).collect(),
                None => vec![String::new()],
            };
            for prefix in prefixes {
                for (section, key) in PATH_FIELDS {
                    if let Some(Value::String(value)) = spec.pointer_mut(&format!("{prefix}/{section}/{key}"))
                        && let Some(absolute) = absolute_path(section, value, base, home)?
                    {
                        *value = absolute;
                    }
                }
            }
            Ok(spec.to_string())
        }
    }
}

/// The absolute form of one path field's value, or `None` to leave it as it is: already
/// absolute, empty, a URL, or a dataset or data-root name.
fn absolute_path(
    section: &str,
    value: &str,
    base: &Path,
    home: Option<&Path>,
) -> Result<Option<String>, String> {
    if value.is_empty() || value.contains("://") {
        return Ok(None);
    }
    // `previous`: a pipeline stage's input, the output of the stage before.
    if section == "data"
        && (value.starts_with("dataset:")
            || value.starts_with("root:")
            || value == rlvr_protocol::pipeline::PREVIOUS)
    {
        return Ok(None);
    }
    let path = if value == "~" {
        home.map(Path::to_path_buf)
    } else if let Some(rest) = value.strip_prefix("~/") {
        home.map(|home| home.join(rest))
    } else if Path::new(value).is_absolute() {
        None
    } else {
        Some(base.join(value))
    };
    let Some(path) = path else { return Ok(None) };
    // Drops `.` components (`./data/x` → `/base/data/x`); `..` stays (symlinks make it unsafe to fold).
    let path: PathBuf = path.components().collect();
    path.to_str()
        .map(|path| Some(path.to_owned()))
        .ok_or_else(|| format!("the absolute path of {value:?} is not UTF-8: {}", path.display()))
}

/// A key no other submit will use, so that rlvrctl's own retries are safe.
pub(crate) fn fresh_idempotency_key(file: &Path) -> String {
    let now = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default();
    let mut hash = Sha256::new();
    hash.update(std::process::id().to_le_bytes());
    hash.update(now.as_nanos().to_le_bytes());
    hash.update(file.as_os_str().as_encoded_bytes());
    format!("rlvrctl-{}", hex::encode(&hash.finalize()[..16]))
}

/// A spec the daemon answered with, as TOML: JSON's nulls (keys left at their defaults) have no
/// TOML form and are left out, as a spec file leaves them out. JSON when TOML cannot hold it.
pub(crate) fn spec_text(spec: &Value) -> String {
    fn without_nulls(value: &Value) -> Value {
        match value {
            Value::Object(map) => Value::Object(
                map.iter()
                    .filter(|(_, item)| !item.is_null())
                    .map(|(key, item)| (key.clone(), without_nulls(item)))
                    .collect(),
            ),
            Value::Array(items) => Value::Array(items.iter().map(without_nulls).collect()),
            other => other.clone(),
        }
    }
    toml::to_string(&without_nulls(spec))
        .unwrap_or_else(|_| serde_json::to_string_pretty(spec).unwrap_or_default() + "\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check_paths(format: SpecFormat, spec: &str, expected: &str) {
        let prepared =
            prepare_spec(spec, format, Path::new("/jobs/team-a"), Some(Path::new("/home/me"))).unwrap();
        match format {
            SpecFormat::Toml => {
                let got: toml::Table = prepared.parse().unwrap();
                let want: toml::Table = expected.parse().unwrap();
                assert_eq!(got, want, "sent:\n{prepared}");
            }
            SpecFormat::Json => {
                let got: Value = serde_json::from_str(&prepared).unwrap();
                let want: Value = serde_json::from_str(expected).unwrap();
                assert_eq!(got, want);
            }
        }
    }

    #[test]
    fn a_pipeline_specs_stage_paths_become_absolute_and_previous_stays() {
        check_paths(
            SpecFormat::Toml,
            r#"
            [pipeline]
            name = "p"
            [[stages]]
            data = { train = "data/sft.jsonl", heldout = "dataset:h" }
            [[stages]]
            data = { train = "previous", heldout = "./h.jsonl" }
            "#,
            r#"
            [pipeline]
            name = "p"
            [[stages]]
            data = { train = "/jobs/team-a/data/sft.jsonl", heldout = "dataset:h" }
            [[stages]]
            data = { train = "previous", heldout = "/jobs/team-a/h.jsonl" }
            "#,
        );
        check_paths(
            SpecFormat::Json,
            r#"{"pipeline": {"name": "p"}, "stages": [{"data": {"train": "a.jsonl"}}, {"data": {"train": "previous"}}]}"#,
            r#"{"pipeline": {"name": "p"}, "stages": [{"data": {"train": "/jobs/team-a/a.jsonl"}}, {"data": {"train": "previous"}}]}"#,
        );
    }

    #[test]
    fn relative_paths_become_absolute_against_the_spec_files_directory() {
        check_paths(
            SpecFormat::Toml,
            r#"
            [job]
            name = "x"
            [model]
            policy = "models/base"
            reference = "./ref"
            [data]
            train = "data/train.jsonl"
            heldout = "../shared/heldout.jsonl"
            canaries = "/abs/canaries.jsonl"
            [publish]
            registry = "~/registry"
            webhook = "relative/not/a/path"
            [[verifiers]]
            plugin = "math"
            "#,
            r#"
            [job]
            name = "x"
            [model]
            policy = "models/base"
            reference = "./ref"
            [data]
            train = "/jobs/team-a/data/train.jsonl"
            heldout = "/jobs/team-a/../shared/heldout.jsonl"
            canaries = "/abs/canaries.jsonl"
            [publish]
            registry = "~/registry"
            webhook = "relative/not/a/path"
            [[verifiers]]
            plugin = "math"
            "#,
        );
    }

    #[test]
    fn builtin_models_same_urls_and_wrong_types_are_left_for_the_daemon() {
        let untouched = r#"
            [model]
            policy = "builtin:tiny-arith"
            reference = "same"
            [data]
            train = 5
            heldout = ""
            [publish]
            registry = "s3://bucket/models"
        "#;
        check_paths(SpecFormat::Toml, untouched, untouched);
        // `same` and `builtin:` mean something only under [model].
        check_paths(SpecFormat::Toml, "[data]\ntrain = \"same\"", "[data]\ntrain = \"/jobs/team-a/same\"");
    }

    #[test]
    fn json_specs_are_resolved_and_sent_as_json() {
        check_paths(
            SpecFormat::Json,
            r#"{"model": {"policy": "m", "reference": "same"}, "data": {"train": "t.jsonl"}, "budget": {"max_steps": 3}}"#,
            r#"{"model": {"policy": "m", "reference": "same"}, "data": {"train": "/jobs/team-a/t.jsonl"}, "budget": {"max_steps": 3}}"#,
        );
    }

    #[test]
    fn a_spec_that_does_not_parse_names_the_line() {
        let error =
            prepare_spec("[job]\nname = \"x\"\nname = \"y\"\n", SpecFormat::Toml, Path::new("/"), None)
                .unwrap_err();
        assert!(error.starts_with("not valid TOML (line 3): "), "{error}");
        let error = prepare_spec("{", SpecFormat::Json, Path::new("/"), None).unwrap_err();
        assert!(error.starts_with("not valid JSON: "), "{error}");
    }

    #[test]
    fn home_is_left_alone_without_a_home() {
        assert_eq!(absolute_path("data", "~/x", Path::new("/b"), None), Ok(None));
        assert_eq!(
            absolute_path("data", "~", Path::new("/b"), Some(Path::new("/h"))),
            Ok(Some("/h".to_owned()))
        );
    }

    #[test]
    fn a_checked_spec_prints_as_toml_without_its_nulls() {
        let spec = serde_json::json!({"job": {"name": "a", "priority": null}, "verifiers": [{"plugin": "math", "x": null}]});
        assert_eq!(spec_text(&spec), "[job]\nname = \"a\"\n\n[[verifiers]]\nplugin = \"math\"\n");
    }
}
