//! What the grader plugins share: the template syntax (`{{sample}}`, `{{item.PATH}}`) and the
//! item JSON a template reads.
//!
//! Graders in the style of OpenAI's reinforcement fine-tuning graders (`string-check`,
//! `text-similarity`, `judge`) compare or show text built from the completion and the item. They
//! all read their templates through [`Template`], so one syntax, one set of errors and one
//! definition of the item hold for every grader.

pub mod template;

pub use template::{RenderError, Template, TemplateError};

use rlvr_plugin_api::VerifyItem;
use serde_json::{Map, Value};

/// The item a template's `{{item.PATH}}` reads: `{"id": ..., "prompt": ..., "reference": {...}}`,
/// the batch format's input less the completion (that is `{{sample}}`).
///
/// Fails only when the item's reference is not JSON, which the host never sends; the message
/// names `reference`.
pub fn item_json(item: &VerifyItem<'_>) -> Result<Value, ItemError> {
    let reference_text = item.reference_json.as_str();
    let reference: Value = if reference_text.trim().is_empty() {
        Value::Object(Map::new())
    } else {
        serde_json::from_str(reference_text).map_err(|error| ItemError(error.to_string()))?
    };
    let mut map = Map::new();
    map.insert("id".to_owned(), Value::String(item.id.as_str().to_owned()));
    map.insert("prompt".to_owned(), Value::String(item.prompt.as_str().to_owned()));
    map.insert("reference".to_owned(), reference);
    Ok(Value::Object(map))
}

/// The item's reference is not JSON.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("reference: not JSON: {0}")]
pub struct ItemError(String);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_item_holds_id_prompt_and_reference_but_not_the_completion() {
        let cases: &[(&str, Result<Value, &str>)] = &[
            (
                r#"{"answer": "4"}"#,
                Ok(serde_json::json!({"id": "a", "prompt": "2+2?", "reference": {"answer": "4"}})),
            ),
            ("", Ok(serde_json::json!({"id": "a", "prompt": "2+2?", "reference": {}}))),
            ("[1]", Ok(serde_json::json!({"id": "a", "prompt": "2+2?", "reference": [1]}))),
            ("{", Err("reference: not JSON: EOF while parsing an object at line 1 column 1")),
        ];
        for (reference, expected) in cases {
            let item = VerifyItem::new("a", "2+2?", "four", reference);
            let got = item_json(&item).map_err(|error| error.to_string());
            assert_eq!(got, expected.clone().map_err(str::to_owned), "{reference}");
        }
    }
}
