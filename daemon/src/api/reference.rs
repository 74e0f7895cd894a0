//! The book's references generated from the OpenAPI document ([`super::ApiDoc`]), which is
//! itself generated from the wire types: `docs/src/reference/job-spec.md`, every key of a job spec
//! (its doc comment, its type, its range as submit checks it — `rlvr_protocol::spec::key_ranges`
//! — and its default, read off a minimal spec as the daemon parses it), and
//! `docs/src/reference/http-routes.md`, every route with its answers. Tests keep both pages equal
//! to these renderings: `UPDATE_EXPECT=1 cargo test -p rlvr-daemon reference` after changing a
//! type.
//!
//! Pure: a document in, Markdown out.

use std::collections::BTreeMap;
use std::fmt::Write;

use rlvr_protocol::spec::{JobSpec, key_ranges};
use serde_json::{Map, Value};
use utoipa::OpenApi;

/// The smallest spec submit takes: what is not in it shows its default.
const MINIMAL_SPEC: &str = r#"
[job]
name = "n"
team = "t"
model_line = "m"
[model]
policy = "builtin:tiny-arith"
[data]
train = "train.jsonl"
[optimizer]
plugin = "grpo"
[[verifiers]]
plugin = "math"
[budget]
max_steps = 1
"#;

/// `docs/src/reference/job-spec.md`.
pub fn job_spec_markdown() -> String {
    let document = serde_json::to_value(super::ApiDoc::openapi()).unwrap_or_default();
    let schemas = document["components"]["schemas"].as_object().cloned().unwrap_or_default();
    let parsed = JobSpec::from_toml(MINIMAL_SPEC).map(|spec| serde_json::to_value(spec).unwrap_or_default());
    let defaults = parsed.unwrap_or_default();
    let ranges: BTreeMap<String, String> = key_ranges().into_iter().collect();
    let walker = Walker { schemas: &schemas, defaults: &defaults, ranges: &ranges };
    let mut out = String::from(
        "# The job spec, every key\n\n\
         <!-- Rendered from the OpenAPI document's JobSpec schema (the spec's types and their doc \
         comments), the ranges submit checks and a minimal spec's defaults \
         (daemon/src/api/reference.rs); a test keeps it equal: `UPDATE_EXPECT=1 cargo test -p \
         rlvr-daemon reference`. -->\n\n\
         A job spec is a TOML file (or its JSON) with the sections below. `rlvrctl submit --dry-run \
         FILE` checks one as submit does and names every key it refuses; `rlvrctl init KIND` writes a \
         commented one for each kind of job. A key left out takes its default; a section marked \
         optional is left out unless set. The optimizer's and each grader's own keys (beyond those \
         listed) are their plugin's: see its page under Plugin authors.\n",
    );
    let root = walker.object(&schemas["JobSpec"]);
    for (name, schema, required) in root.properties {
        walker.section(&mut out, name, schema, required);
    }
    out.truncate(out.trim_end().len());
    out.push('\n');
    out
}

/// `docs/src/reference/http-routes.md`.
pub fn routes_markdown() -> String {
    let document = serde_json::to_value(super::ApiDoc::openapi()).unwrap_or_default();
    let mut out = String::from(
        "# HTTP routes, every one\n\n\
         <!-- Rendered from the OpenAPI document (daemon/src/api/reference.rs); a test keeps it equal: \
         `UPDATE_EXPECT=1 cargo test -p rlvr-daemon reference`. -->\n\n\
         `rlvrd serve` answers these; `GET /v1/openapi.json` is the whole document, with every body's \
         schema. A route that needs a token says so (`Authorization: Bearer TOKEN`); [the HTTP \
         API](http-api.md) says what the answers mean.\n",
    );
    let Some(paths) = document["paths"].as_object() else { return out };
    for (path, methods) in paths {
        for (method, operation) in methods.as_object().into_iter().flatten() {
            let _ = write!(out, "\n## `{} {path}`\n\n", method.to_uppercase());
            if let Some(summary) = operation["summary"].as_str() {
                let _ = writeln!(out, "{}\n", one_paragraph(summary));
            }
            if let Some(description) = operation["description"].as_str() {
                let _ = writeln!(out, "{}\n", one_paragraph(description));
            }
            let secured = operation["security"].as_array().is_some_and(|s| !s.is_empty());
            let _ = writeln!(out, "- Token: {}.", if secured { "required" } else { "none" });
            if let Some(body) = operation["requestBody"]["content"].as_object() {
                for (kind, content) in body {
                    let _ = writeln!(out, "- Body: `{kind}`{}.", schema_name(&content["schema"]));
                }
            }
            for (code, answer) in operation["responses"].as_object().into_iter().flatten() {
                let text = answer["description"].as_str().map(one_paragraph).unwrap_or_default();
                let _ = writeln!(out, "- {code}: {text}");
            }
        }
    }
    out
}

/// ` (Name)` for a schema that is a reference, else nothing.
fn schema_name(schema: &Value) -> String {
    let reference = schema["$ref"].as_str().or_else(|| schema["items"]["$ref"].as_str());
    reference.and_then(|r| r.rsplit('/').next()).map(|name| format!(", {name}")).unwrap_or_default()
}

/// A doc comment's lines joined into one paragraph per blank-line-separated block.
fn one_paragraph(text: &str) -> String {
    text.split("\n\n")
        .map(|block| block.split_whitespace().collect::<Vec<_>>().join(" "))
        .collect::<Vec<_>>()
        .join("\n\n")
}

struct Walker<'a> {
    schemas: &'a Map<String, Value>,
    defaults: &'a Value,
    ranges: &'a BTreeMap<String, String>,
}

/// A schema followed through references, nullability and `allOf`.
struct Resolved<'a> {
    /// The schema's own parts (more than one for `allOf`).
    parts: Vec<&'a Value>,
    description: Option<&'a str>,
    nullable: bool,
}

/// An object schema's keys, in the document's order, and its description.
struct Object<'a> {
    properties: Vec<(&'a str, &'a Value, bool)>,
}

impl<'a> Walker<'a> {
    fn resolve(&self, schema: &'a Value) -> Resolved<'a> {
        let mut description = schema["description"].as_str();
        let mut nullable = false;
        let mut current = schema;
        loop {
            if let Some(name) = current["$ref"].as_str().and_then(|r| r.rsplit('/').next()) {
                current = self.schemas.get(name).unwrap_or(&Value::Null);
                description = description.or(current["description"].as_str());
                continue;
            }
            if let Some(options) = current["oneOf"].as_array()
                && options.len() == 2
                && let Some(other) = options.iter().find(|option| option["type"] != "null")
                && options.iter().any(|option| option["type"] == "null")
            {
                nullable = true;
                description = description.or(other["description"].as_str());
                current = other;
                continue;
            }
            break;
        }
        if current["type"].as_array().is_some_and(|types| types.iter().any(|t| t == "null")) {
            nullable = true;
        }
        let parts = match current["allOf"].as_array() {
            Some(parts) => parts.iter().flat_map(|part| self.resolve(part).parts).collect(),
            None => vec![current],
        };
        Resolved { parts, description, nullable }
    }

    fn object(&self, schema: &'a Value) -> Object<'a> {
        let resolved = self.resolve(schema);
        let mut properties = Vec::new();
        for part in &resolved.parts {
            let required: Vec<&str> =
                part["required"].as_array().into_iter().flatten().filter_map(Value::as_str).collect();
            for (name, property) in part["properties"].as_object().into_iter().flatten() {
                properties.push((name.as_str(), property, required.contains(&name.as_str())));
            }
        }
        Object { properties }
    }

    /// Whether `schema` is a table of keys (a section), not a value.
    fn is_table(&self, schema: &'a Value) -> bool {
        self.resolve(schema).parts.iter().any(|part| part["properties"].is_object())
    }

    /// A top-level key: a `[section]`, an `[[array]]` of tables, or a plain key.
    fn section(&self, out: &mut String, name: &str, schema: &'a Value, required: bool) {
        let resolved = self.resolve(schema);
        let items = resolved.parts.first().and_then(|part| part.get("items"));
        let (header, path, body) = match items {
            Some(items) if self.is_table(items) => (format!("[[{name}]]"), format!("{name}[]"), items),
            _ if self.is_table(schema) => (format!("[{name}]"), name.to_owned(), schema),
            _ => {
                self.key(out, name, schema, required);
                return;
            }
        };
        let _ = write!(out, "\n## `{header}`\n\n");
        if let Some(description) = resolved.description.or(self.resolve(body).description) {
            let _ = write!(out, "{}\n\n", one_paragraph(description));
        }
        let _ = writeln!(
            out,
            "{}.",
            if required {
                "Required"
            } else if resolved.nullable || items.is_some() {
                "Optional"
            } else {
                "Optional: every key has a default"
            }
        );
        self.keys(out, &path, body);
    }

    fn keys(&self, out: &mut String, prefix: &str, schema: &'a Value) {
        for (name, property, required) in self.object(schema).properties {
            let path = format!("{prefix}.{name}");
            if self.is_table(property) {
                // A table inside a section (`model.lora`): its keys follow, under its own path.
                let resolved = self.resolve(property);
                let _ = write!(out, "\n### `{path}`\n\n");
                if let Some(description) = resolved.description {
                    let _ = write!(out, "{}\n\n", one_paragraph(description));
                }
                let _ = writeln!(out, "A table{}.", if resolved.nullable { ", optional" } else { "" });
                self.keys(out, &path, property);
            } else {
                self.key(out, &path, property, required);
            }
        }
    }

    fn key(&self, out: &mut String, path: &str, schema: &'a Value, required: bool) {
        let resolved = self.resolve(schema);
        let _ = write!(out, "\n### `{path}`\n\n");
        if let Some(description) = resolved.description {
            let _ = write!(out, "{}\n\n", one_paragraph(description));
        }
        let mut facts = vec![self.type_text(&resolved)];
        if let Some(range) = self.ranges.get(path) {
            facts.push(range.clone());
        }
        facts.push(if required { "required".to_owned() } else { self.default_text(path, resolved.nullable) });
        let _ = writeln!(out, "{}.", facts.join(" · "));
    }

    fn type_text(&self, resolved: &Resolved<'a>) -> String {
        let Some(part) = resolved.parts.first() else { return "any".to_owned() };
        let names: Vec<String> = part["enum"]
            .as_array()
            .into_iter()
            .flatten()
            .chain(part["oneOf"].as_array().into_iter().flatten().flat_map(|option| {
                option["enum"].as_array().into_iter().flatten().chain(option.get("const"))
            }))
            .filter_map(Value::as_str)
            .map(|name| format!("`\"{name}\"`"))
            .collect();
        if !names.is_empty() {
            return format!("one of {}", names.join(", "));
        }
        let kind = part["type"]
            .as_str()
            .or_else(|| part["type"].as_array()?.iter().filter_map(Value::as_str).find(|t| *t != "null"));
        match kind {
            Some("array") => {
                let items = self.resolve(&part["items"]);
                format!("a list of {}", self.type_text(&items))
            }
            Some("object") => "a table".to_owned(),
            Some("integer") => "an integer".to_owned(),
            Some("number") => "a number".to_owned(),
            Some("boolean") => "true or false".to_owned(),
            Some("string") => "a string".to_owned(),
            _ => "any".to_owned(),
        }
    }

    /// The minimal spec's value at `path` (`verifiers[].weight` reads its first grader's).
    fn default_text(&self, path: &str, nullable: bool) -> String {
        let mut value = self.defaults;
        for part in path.split('.') {
            value = match part.strip_suffix("[]") {
                Some(name) => &value[name][0],
                None => &value[part],
            };
        }
        match value {
            Value::Null if nullable => "optional, not set by default".to_owned(),
            Value::Null => "no default".to_owned(),
            Value::Array(items) if items.is_empty() => "default: none".to_owned(),
            Value::Object(map) if map.is_empty() => "default: none".to_owned(),
            value => format!("default: `{value}`"),
        }
    }
}

#[cfg(test)]
mod tests {
    /// The job spec's reference page is the rendering of the document.
    #[test]
    fn the_books_job_spec_reference_is_rendered_from_the_document() {
        expect_test::expect_file!["../../../docs/src/reference/job-spec.md"]
            .assert_eq(&super::job_spec_markdown());
    }

    /// The routes' reference page is the rendering of the document.
    #[test]
    fn the_books_routes_reference_is_rendered_from_the_document() {
        expect_test::expect_file!["../../../docs/src/reference/http-routes.md"]
            .assert_eq(&super::routes_markdown());
    }
}
