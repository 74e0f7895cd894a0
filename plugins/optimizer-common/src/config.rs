//! A plugin's keys of the job's `[optimizer]` table: parsing (unknown keys, wrong types and
//! unknown option values are refused by serde) and range checks, every message naming the key.
//!
//! The trainer strips its own keys (`plugin`, `lr`, `group_size`, `micro_batch_size`, ...) before
//! the plugin sees the table, so a plugin's config struct lists only its own keys and refuses the
//! rest with `#[serde(deny_unknown_fields)]`.

use std::fmt::Display;

use rlvr_plugin_api::{OptionError, PluginError, parse_options};
use serde::de::DeserializeOwned;

/// Parses `config_json` into `T`; blank text is an empty table. Errors name the key in the
/// spec's terms (`kl_estimator: expected one of k1, k2, k3, got "k4"`); the daemon prefixes
/// `optimizer.`.
pub fn parse<T: DeserializeOwned>(config_json: &str) -> Result<T, OptionError> {
    parse_options(config_json)
}

/// Refuses `value` of `key` unless `ok`: `"{key}: expected {expected}, got {value}"`.
pub fn require(key: &str, value: f64, ok: bool, expected: impl Display) -> Result<(), PluginError> {
    if ok && value.is_finite() {
        Ok(())
    } else {
        Err(PluginError::invalid_config(format!("{key}: expected {expected}, got {value}")))
    }
}

/// `value > 0`.
pub fn positive(key: &str, value: f64) -> Result<(), PluginError> {
    require(key, value, value > 0.0, "a number > 0")
}

/// `value ≥ 0`.
pub fn non_negative(key: &str, value: f64) -> Result<(), PluginError> {
    require(key, value, value >= 0.0, "a number ≥ 0")
}

/// `0 < value < 1`: a clipping range, so that `1 - value` stays a positive ratio.
pub fn open_unit(key: &str, value: f64) -> Result<(), PluginError> {
    require(key, value, value > 0.0 && value < 1.0, "a number in (0, 1)")
}

/// `0 ≤ value ≤ 1`: a discount or a mixing weight.
pub fn unit(key: &str, value: f64) -> Result<(), PluginError> {
    require(key, value, (0.0..=1.0).contains(&value), "a number in [0, 1]")
}

#[cfg(test)]
mod tests {
    use serde::Deserialize;

    use super::*;

    #[derive(Debug, Deserialize, PartialEq)]
    #[serde(deny_unknown_fields, default)]
    struct Keys {
        beta: f64,
    }

    impl Default for Keys {
        fn default() -> Self {
            Keys { beta: 0.1 }
        }
    }

    fn message(result: Result<Keys, OptionError>) -> String {
        PluginError::from(result.unwrap_err()).message.into()
    }

    #[test]
    fn blank_is_the_defaults() {
        assert_eq!(parse::<Keys>("").unwrap(), Keys { beta: 0.1 });
        assert_eq!(parse::<Keys>("{}").unwrap(), Keys { beta: 0.1 });
    }

    #[test]
    fn errors_name_the_key() {
        assert_eq!(message(parse(r#"{"bogus": 1}"#)), "bogus: unknown key; expected one of beta");
        assert_eq!(message(parse(r#"{"beta": "high"}"#)), "beta: expected f64, got string \"high\"");
        assert!(message(parse(r#"{"beta": 1} junk"#)).contains("trailing characters"));
        assert_eq!(
            require("clip_eps_high", 0.1, false, "a number ≥ clip_eps_low (0.2)").unwrap_err().message,
            "clip_eps_high: expected a number ≥ clip_eps_low (0.2), got 0.1"
        );
        assert!(open_unit("clip_eps", 1.0).is_err());
        assert!(unit("lam", 1.0).is_ok());
        assert!(positive("beta", 0.0).is_err());
        assert!(non_negative("kl_beta", 0.0).is_ok());
    }
}
