//! `exact-match`: a complete verifier plugin in plain Rust; copy this crate to write your own.
//!
//! Passes when the completion, trimmed, equals `reference.answer`, trimmed.

use rlvr_plugin_api::{Metadata, PluginError, Verdict, VerifierPlugin, VerifyItem, export_verifier};

pub struct ExactMatch;

/// Its keys in a job's `[[verifiers]]`: none yet; unknown ones are refused by name.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Options {}

impl VerifierPlugin for ExactMatch {
    fn metadata() -> Metadata {
        Metadata {
            name: "exact-match",
            version: env!("CARGO_PKG_VERSION"),
            description: "completion equals reference.answer",
        }
    }

    fn reference_schema() -> &'static str {
        r#"{"answer": "<expected text>"}"#
    }

    fn from_config(config_json: &str) -> Result<Self, PluginError> {
        rlvr_plugin_api::parse_options::<Options>(config_json).map(|_| ExactMatch).map_err(Into::into)
    }

    fn verify(&self, item: &VerifyItem<'_>) -> Result<Verdict, PluginError> {
        let reference: serde_json::Value = serde_json::from_str(item.reference_json.as_str())
            .map_err(|error| PluginError::invalid_input(format!("reference: {error}")))?;
        let Some(answer) = reference["answer"].as_str() else {
            return Err(PluginError::invalid_input("reference.answer: expected a string"));
        };
        let extracted = item.completion.as_str().trim();
        let passed = extracted == answer.trim();
        Ok(Verdict::new(if passed { 1.0 } else { 0.0 }, passed).extracted(extracted))
    }
}

export_verifier!(ExactMatch);
