//! The built-in `reward-model` grader's keys (`[[verifiers]] plugin = "reward-model"`): a learned
//! outcome reward model in Hugging Face sequence-classification format, scored by the worker on
//! the job's devices in its own grant phase. Not a plugin library: the daemon checks these keys
//! at submit without a registry lookup, and resolves `model` as it resolves `[model] policy`.

use serde::Deserialize;

use crate::spec::{PluginSection, SpecError};

/// The `plugin` value that names the built-in grader.
pub const PLUGIN: &str = crate::spec::REWARD_MODEL_GRADER;

/// Whether a `[[verifiers]]` section is the built-in reward-model grader (a version after `@`
/// is ignored, as the dry-run ignores it).
pub fn is_reward_model(section: &PluginSection) -> bool {
    section.plugin.split('@').next() == Some(PLUGIN)
}

/// How a logit becomes the grader's score.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Normalize {
    /// The logit as it is.
    #[default]
    None,
    /// `1 / (1 + e^-logit)`, in (0, 1).
    Sigmoid,
}

/// Longest input a spec may ask for, in tokens: a bound on the reward phase's memory.
pub const MAX_LENGTH_LIMIT: u64 = 32_768;
/// Most rows per forward pass a spec may ask for.
pub const BATCH_SIZE_LIMIT: u64 = 1_024;

/// The grader's keys.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RewardModelOptions {
    /// A model name, resolved as `[model] policy` is: an operator-listed base model or a model
    /// line's version the team may read (never a server path). The worker gets its directory.
    pub model: String,
    /// Rows per forward pass.
    #[serde(default = "default_batch_size")]
    pub batch_size: u64,
    /// Tokens per row: a longer prompt + completion keeps its last `max_length` tokens (the
    /// completion's end, where the model reads its score), and its verdict says so.
    #[serde(default = "default_max_length")]
    pub max_length: u64,
    /// Which logit is the score when the model has more than one: a label of its `id2label`, or
    /// its index. Required then; with one label, that one.
    #[serde(default)]
    pub label: Option<String>,
    #[serde(default)]
    pub normalize: Normalize,
    /// A completion passes when its score is at least this; without it, every scored completion
    /// passes.
    #[serde(default)]
    pub pass_threshold: Option<f64>,
}

fn default_batch_size() -> u64 {
    8
}

fn default_max_length() -> u64 {
    1_024
}

impl RewardModelOptions {
    /// The section's keys, checked; errors name the key as `{prefix}key` (`verifiers[1].model`).
    pub fn from_section(section: &PluginSection, prefix: &str) -> Result<RewardModelOptions, SpecError> {
        let error = |key: &str, message: String| SpecError { field: format!("{prefix}{key}"), message };
        let options: RewardModelOptions = rlvr_plugin_api::options::parse_options(&section.plugin_config())
            .map_err(|e| error(&e.key, e.message))?;
        if options.model.trim().is_empty() {
            return Err(error("model", "expected a model name (a base model or line:NAME[@VERSION])".into()));
        }
        if !(1..=BATCH_SIZE_LIMIT).contains(&options.batch_size) {
            return Err(error(
                "batch_size",
                format!("expected 1 to {BATCH_SIZE_LIMIT}, got {}", options.batch_size),
            ));
        }
        if !(1..=MAX_LENGTH_LIMIT).contains(&options.max_length) {
            return Err(error(
                "max_length",
                format!("expected 1 to {MAX_LENGTH_LIMIT}, got {}", options.max_length),
            ));
        }
        if let Some(threshold) = options.pass_threshold
            && !threshold.is_finite()
        {
            return Err(error("pass_threshold", format!("expected a finite number, got {threshold}")));
        }
        Ok(options)
    }

    /// The score of a logit.
    pub fn normalized(&self, logit: f64) -> f64 {
        match self.normalize {
            Normalize::None => logit,
            Normalize::Sigmoid => 1.0 / (1.0 + (-logit).exp()),
        }
    }

    /// Whether a score passes.
    pub fn passes(&self, score: f64) -> bool {
        self.pass_threshold.is_none_or(|threshold| score >= threshold)
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::*;

    fn section(options: Value) -> PluginSection {
        PluginSection {
            plugin: PLUGIN.into(),
            name: None,
            weight: 1.0,
            options: options.as_object().unwrap().clone(),
        }
    }

    #[test]
    fn keys_checked_and_named() {
        let check = |options: Value, expected: Result<(u64, u64, Normalize), (&str, &str)>| {
            let got = RewardModelOptions::from_section(&section(options.clone()), "verifiers[1].")
                .map(|o| (o.batch_size, o.max_length, o.normalize));
            let expected = expected
                .map_err(|(field, message)| SpecError { field: field.into(), message: message.into() });
            assert_eq!(got, expected, "{options}");
        };
        check(json!({"model": "line:rm"}), Ok((8, 1024, Normalize::None)));
        check(
            json!({"model": "rm-base", "batch_size": 2, "max_length": 64, "normalize": "sigmoid"}),
            Ok((2, 64, Normalize::Sigmoid)),
        );
        check(json!({}), Err(("verifiers[1].model", "missing; this key is required")));
        check(
            json!({"model": " "}),
            Err(("verifiers[1].model", "expected a model name (a base model or line:NAME[@VERSION])")),
        );
        check(
            json!({"model": "m", "batch_size": 0}),
            Err(("verifiers[1].batch_size", "expected 1 to 1024, got 0")),
        );
        check(
            json!({"model": "m", "max_length": 100000}),
            Err(("verifiers[1].max_length", "expected 1 to 32768, got 100000")),
        );
        check(
            json!({"model": "m", "normalize": "tanh"}),
            Err(("verifiers[1].normalize", "expected one of none, sigmoid, got \"tanh\"")),
        );
        let unknown =
            RewardModelOptions::from_section(&section(json!({"model": "m", "modle": 1})), "verifiers[0].")
                .unwrap_err();
        assert!(unknown.field == "verifiers[0].modle" || unknown.message.contains("modle"), "{unknown:?}");
    }

    #[test]
    fn scores_and_passes() {
        let mut options = RewardModelOptions::from_section(&section(json!({"model": "m"})), "").unwrap();
        assert_eq!(options.normalized(2.5), 2.5);
        assert!(options.passes(-100.0));
        options.normalize = Normalize::Sigmoid;
        options.pass_threshold = Some(0.5);
        assert_eq!(options.normalized(0.0), 0.5);
        assert!(options.passes(options.normalized(0.1)) && !options.passes(options.normalized(-0.1)));
    }
}
