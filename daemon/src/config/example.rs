//! The documented example config, `configs/rlvrd.toml`, rendered from the field table: every key
//! with its doc, its type and range, its default, and the key set to it (or, for a key not set by
//! default, a commented-out example). `rlvrd config-example` prints it; a test keeps the file equal
//! to it.

use std::fmt::Write;

use super::fields::{Example, Field, Kind, SECTIONS, SHARE, in_section, toml_text};
use super::{DEFAULT_CONFIG_PATH, ENV_PREFIX};

/// Comment lines are wrapped to this many characters.
const WIDTH: usize = 100;

/// The documented example config, as `configs/rlvrd.toml` holds it.
pub fn example_toml() -> String {
    let mut out = header();
    for section in &SECTIONS {
        let fields: Vec<&Field> = in_section(section.name).collect();
        // A key under its own `[[…]]` or `[…]` header goes after the plain keys, which would
        // otherwise land in that table.
        let (own_header, plain): (Vec<&Field>, Vec<&Field>) =
            fields.into_iter().partition(|field| matches!(field.kind, Kind::Tables { .. } | Kind::Shares));
        if !plain.is_empty() {
            let _ = write!(out, "\n[{}]\n", section.name);
        }
        if !section.doc.is_empty() {
            comment(&mut out, "", section.doc);
        }
        for (i, field) in plain.iter().enumerate() {
            if i == 0 && !section.doc.is_empty() {
                out.push('\n');
            }
            key(&mut out, field);
        }
        for field in own_header {
            out.push('\n');
            key(&mut out, field);
        }
    }
    out
}

/// The configuration reference, `docs/src/reference/config.md`, rendered from the same table: a
/// section per `[section]`, each key with its doc, type and range, default and environment
/// variable. A test keeps the page equal to it (`UPDATE_EXPECT=1` writes it).
#[cfg(test)]
pub fn reference_markdown() -> String {
    let mut out = format!(
        "# Configuration keys\n\n\
         <!-- Rendered from the daemon's field table (daemon/src/config/fields.rs); a test keeps it equal: \
         change the table, then `UPDATE_EXPECT=1 cargo test -p rlvr-daemon config`. -->\n\n\
         rlvrd reads `{DEFAULT_CONFIG_PATH}` if it exists, or the file given with `--config`. Every key \
         is optional: one left out takes its default. Every key can also be set with an environment \
         variable `{ENV_PREFIX}SECTION__KEY` (read like a TOML value), which wins over the file. \
         `rlvrd validate --config FILE` lists every problem at once, each with its key and where its \
         value came from; `rlvrd config-example` prints the commented example, `configs/rlvrd.toml`.\n"
    );
    for section in &SECTIONS {
        let fields: Vec<&Field> = in_section(section.name).collect();
        if fields.is_empty() {
            continue;
        }
        let _ = write!(out, "\n## `[{}]`\n\n", section.name);
        if !section.doc.is_empty() {
            let _ = write!(out, "{}\n\n", section.doc);
        }
        for field in fields {
            let variable = format!("{ENV_PREFIX}{}", field.path.replace('.', "__").to_uppercase());
            let _ = write!(
                out,
                "### `{}`\n\n{}\n\n- {}.\n- Default: {}.\n- Environment: `{variable}`.\n",
                field.path,
                field.doc,
                capitalized(&what(field)),
                match default_text(&field.kind, false).as_str() {
                    text @ ("none" | "not set") => text.to_owned(),
                    text => format!("`{text}`"),
                },
            );
            if let Kind::Tables { fields, .. } = &field.kind {
                out.push_str("- Each entry:\n");
                for entry_field in *fields {
                    let _ = writeln!(
                        out,
                        "  - `{}`: {} {}. {}.",
                        entry_field.path,
                        entry_field.doc,
                        capitalized(&what(entry_field)),
                        default_text(&entry_field.kind, true)
                    );
                }
            }
            out.push('\n');
        }
    }
    out.truncate(out.trim_end().len());
    out.push('\n');
    out
}

fn header() -> String {
    let name = DEFAULT_CONFIG_PATH.rsplit('/').next().unwrap_or(DEFAULT_CONFIG_PATH);
    format!(
        "# {name} — example configuration of the rlvr daemon.
#
# rlvrd reads {DEFAULT_CONFIG_PATH} if it exists, or the file given with --config. Every key is
# optional: a key left out takes the default shown in its comment.
#
# Every key can also be set with an environment variable {ENV_PREFIX}SECTION__KEY, which wins over this
# file, e.g.
#     {ENV_PREFIX}API__LISTEN=0.0.0.0:8470
#     {ENV_PREFIX}PLUGINS__DIRS='[\"/usr/lib/rlvr/plugins\", \"/opt/rlvr/plugins\"]'
#     {ENV_PREFIX}DEVICES__CPU_SLOTS=4
# Env values are read like TOML values (lists, numbers, booleans, {{key = \"value\"}} tables).
#
# Check a config, with the environment applied, before starting the daemon:
#     rlvrd validate --config configs/rlvrd.toml
# It lists every problem at once, each with its key and where the value came from.
#
# This file is rendered from the daemon's field table (daemon/src/config/fields.rs) by
# `rlvrd config-example`, and a test keeps the two equal: change the table, not this file.
"
    )
}

/// One key: its doc, its type, range and default, then the key itself or its example.
fn key(out: &mut String, field: &Field) {
    comment(out, "", field.doc);
    let range = format!("{}.", capitalized(&what(field)));
    let default = format!("Default: {}", default_text(&field.kind, false));
    comment_words(out, "", range.split_whitespace().chain([default.as_str()]));
    if let Kind::Tables { fields, .. } = &field.kind {
        comment(out, "", "Each entry:");
        for entry_field in *fields {
            comment(out, "  ", &format!("{}: {}", entry_field.path, entry_field.doc));
            let range = format!("{}.", capitalized(&what(entry_field)));
            let default = default_text(&entry_field.kind, true);
            comment_words(out, "    ", range.split_whitespace().chain([default.as_str()]));
        }
    }
    match field.example {
        Example::Default => {
            let value = field.kind.default_value().map(|value| toml_text(&value)).unwrap_or_default();
            let _ = writeln!(out, "{} = {value}", field.key());
        }
        Example::Commented(lines) => {
            for line in lines.lines() {
                let _ = writeln!(out, "# {line}");
            }
        }
    }
}

/// The type and range of a key, in the words of the validator's messages.
fn what(field: &Field) -> String {
    match &field.kind {
        Kind::Tables { unique, .. } => {
            format!("{}; no two entries with the same {}", field.kind.what(field.path), unique.key)
        }
        Kind::Shares => format!("a table: team name = {}; their sum at most 1", SHARE.what()),
        kind => kind.what(field.path),
    }
}

/// `Default: …`'s value: the default as TOML, or what stands for it.
fn default_text(kind: &Kind, in_entry: bool) -> String {
    match (kind, kind.default_value()) {
        (Kind::Tables { .. } | Kind::Shares, _) => "none".to_owned(),
        (Kind::Optional(_), _) if in_entry => "Optional".to_owned(),
        (Kind::Optional(_), _) => "not set".to_owned(),
        (_, Some(value)) if in_entry => format!("Default: {}", toml_text(&value)),
        (_, Some(value)) => toml_text(&value),
        (_, None) if in_entry => "Required".to_owned(),
        (_, None) => "not set".to_owned(),
    }
}

fn capitalized(s: &str) -> String {
    let mut chars = s.chars();
    match chars.next() {
        Some(first) => first.to_uppercase().chain(chars).collect(),
        None => String::new(),
    }
}

/// `text` as `# ` comment lines of at most [`WIDTH`] characters, each after `indent`.
fn comment(out: &mut String, indent: &str, text: &str) {
    comment_words(out, indent, text.split_whitespace());
}

/// Like [`comment`], with the words given: a word may hold spaces (`Default: 250`) and is never
/// broken.
fn comment_words<'a>(out: &mut String, indent: &str, words: impl Iterator<Item = &'a str>) {
    let mut line = String::new();
    for word in words {
        if !line.is_empty() && 2 + indent.len() + line.chars().count() + 1 + word.chars().count() > WIDTH {
            let _ = writeln!(out, "# {indent}{line}");
            line.clear();
        }
        if !line.is_empty() {
            line.push(' ');
        }
        line.push_str(word);
    }
    if !line.is_empty() {
        let _ = writeln!(out, "# {indent}{line}");
    }
}
