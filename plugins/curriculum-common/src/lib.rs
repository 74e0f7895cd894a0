//! What the curriculum plugins share: per-prompt pass-rate estimates learned from each step's
//! groups ([`PassRates`]), a seeded generator ([`SplitMix64`]) so a step's choice depends only
//! on the job's seed and the step, and the parsing of a plugin's keys of the job's `[curriculum]`.
//!
//! An estimate is the posterior mean of a Beta prior (`prior_passes`, `prior_fails`) updated with
//! the prompt's passes and fails, older observations weighted down by `decay` each time the
//! prompt is seen again (the policy moves, so old outcomes say less). Unseen prompts sit at the
//! prior mean. Everything is plain data, saved with each checkpoint as JSON and restored exactly.

use std::collections::{BTreeMap, HashSet};
use std::fmt::Display;

use rlvr_plugin_api::{GroupOutcome, PluginError, RString};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

/// Parses a plugin's keys of `[curriculum]` (`config_json`, blank = none) into `T`; errors are
/// [`PluginError::invalid_config`] naming the key.
pub fn parse_config<T: DeserializeOwned>(plugin: &str, config_json: &str) -> Result<T, PluginError> {
    let text = if config_json.trim().is_empty() { "{}" } else { config_json };
    let refuse =
        |error: &dyn Display| PluginError::invalid_config(format!("{plugin} curriculum config: {error}"));
    let mut deserializer = serde_json::Deserializer::from_str(text);
    let config = serde_path_to_error::deserialize(&mut deserializer).map_err(|error| refuse(&error))?;
    deserializer.end().map_err(|error| refuse(&error))?;
    Ok(config)
}

/// Refuses `value` of `key` unless `ok`.
pub fn require(key: &str, value: f64, ok: bool, expected: &str) -> Result<(), PluginError> {
    if ok && value.is_finite() {
        Ok(())
    } else {
        Err(PluginError::invalid_config(format!("{key}: expected {expected}, got {value}")))
    }
}

/// The estimator's settings (keys of `[curriculum]`).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct EstimateConfig {
    /// Beta prior: passes assumed before any observation.
    pub prior_passes: f64,
    /// Beta prior: fails assumed before any observation.
    pub prior_fails: f64,
    /// Weight kept by a prompt's past observations each time it is observed again, in (0, 1].
    pub decay: f64,
}

impl Default for EstimateConfig {
    fn default() -> Self {
        EstimateConfig { prior_passes: 1.0, prior_fails: 1.0, decay: 0.7 }
    }
}

impl EstimateConfig {
    pub fn check(&self) -> Result<(), PluginError> {
        require("prior_passes", self.prior_passes, self.prior_passes > 0.0, "a number > 0")?;
        require("prior_fails", self.prior_fails, self.prior_fails > 0.0, "a number > 0")?;
        require("decay", self.decay, self.decay > 0.0 && self.decay <= 1.0, "a number in (0, 1]")
    }
}

/// A prompt's weighted observations.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Seen {
    pub passes: f64,
    pub total: f64,
}

/// Pass-rate estimates of every prompt of the job's training data.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PassRates {
    config: EstimateConfig,
    /// Prompt ids, in the data's order: sampling indexes into this.
    prompts: Vec<String>,
    /// Observed prompts only.
    seen: BTreeMap<String, Seen>,
    /// Steps observed: a step's seed is mixed with it.
    steps: u64,
    /// The prompt ids, for checking outcomes (derived from `prompts`).
    #[serde(skip)]
    known: HashSet<String>,
}

impl PassRates {
    pub fn new(config: EstimateConfig, prompt_ids: &[RString]) -> Result<Self, PluginError> {
        config.check()?;
        if prompt_ids.is_empty() {
            return Err(PluginError::invalid_input("no prompts to choose from"));
        }
        let prompts: Vec<String> = prompt_ids.iter().map(|id| id.as_str().to_owned()).collect();
        let known = prompts.iter().cloned().collect();
        Ok(PassRates { config, prompts, seen: BTreeMap::new(), steps: 0, known })
    }

    pub fn prompts(&self) -> &[String] {
        &self.prompts
    }

    /// The estimated pass rate of prompt `index`.
    pub fn estimate(&self, index: usize) -> f64 {
        let seen = self.seen.get(&self.prompts[index]).copied().unwrap_or_default();
        let EstimateConfig { prior_passes, prior_fails, .. } = self.config;
        (seen.passes + prior_passes) / (seen.total + prior_passes + prior_fails)
    }

    /// Folds in a step's groups. Unknown prompt ids and empty groups are refused.
    pub fn observe(&mut self, outcomes: &[GroupOutcome]) -> Result<(), PluginError> {
        for outcome in outcomes {
            let id = outcome.prompt_id.as_str();
            if outcome.total == 0 || outcome.passed > outcome.total {
                return Err(PluginError::invalid_input(format!(
                    "prompt {id}: {} passed of {}",
                    outcome.passed, outcome.total
                )));
            }
            if !self.known.contains(id) {
                return Err(PluginError::invalid_input(format!("prompt {id} is not in the training data")));
            }
        }
        for outcome in outcomes {
            let seen = self.seen.entry(outcome.prompt_id.as_str().to_owned()).or_default();
            seen.passes = seen.passes * self.config.decay + f64::from(outcome.passed);
            seen.total = seen.total * self.config.decay + f64::from(outcome.total);
        }
        self.steps += 1;
        Ok(())
    }

    /// A generator for a step: the job's seed, mixed with how many steps were observed.
    pub fn rng(&self, seed: u64) -> SplitMix64 {
        SplitMix64::new(seed ^ self.steps.wrapping_mul(0x9E37_79B9_7F4A_7C15))
    }

    /// `count` prompt ids from `candidates` (indexes), uniformly without replacement while they
    /// last (a step wants more than there are: another round of the same candidates).
    pub fn pick(&self, candidates: &[usize], count: usize, rng: &mut SplitMix64) -> Vec<RString> {
        let mut chosen = Vec::with_capacity(count);
        while chosen.len() < count && !candidates.is_empty() {
            let mut round = candidates.to_vec();
            rng.shuffle(&mut round);
            let take = (count - chosen.len()).min(round.len());
            chosen.extend(round[..take].iter().map(|&index| RString::from(self.prompts[index].as_str())));
        }
        chosen
    }

    /// The state as JSON.
    pub fn save(&self) -> Result<String, PluginError> {
        serde_json::to_string(self).map_err(|error| PluginError::internal(format!("state: {error}")))
    }

    /// Restores a saved state; it must be of the same prompts and settings.
    pub fn load(&mut self, state_json: &str) -> Result<(), PluginError> {
        let mut state: PassRates = serde_json::from_str(state_json)
            .map_err(|error| PluginError::invalid_input(format!("state: {error}")))?;
        if state.prompts != self.prompts {
            return Err(PluginError::invalid_input(
                "state: saved for other training data (its prompt ids differ)",
            ));
        }
        if state.config != self.config {
            return Err(PluginError::invalid_input(format!(
                "state: saved with other settings ({:?}, now {:?})",
                state.config, self.config
            )));
        }
        state.known = std::mem::take(&mut self.known);
        *self = state;
        Ok(())
    }
}

/// SplitMix64 (Steele, Lea and Flood, 2014): small, fast, and the same on every platform, so a
/// step's choice is reproducible from the seed alone.
#[derive(Debug, Clone)]
pub struct SplitMix64 {
    state: u64,
}

impl SplitMix64 {
    pub fn new(seed: u64) -> Self {
        SplitMix64 { state: seed }
    }

    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..bound` (`bound > 0`), without modulo bias.
    pub fn below(&mut self, bound: usize) -> usize {
        let bound = bound as u64;
        let zone = u64::MAX - u64::MAX % bound;
        loop {
            let value = self.next_u64();
            if value < zone {
                return (value % bound) as usize;
            }
        }
    }

    /// Fisher–Yates.
    pub fn shuffle<T>(&mut self, items: &mut [T]) {
        for last in (1..items.len()).rev() {
            items.swap(last, self.below(last + 1));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(n: usize) -> Vec<RString> {
        (0..n).map(|i| RString::from(format!("p{i}"))).collect()
    }

    fn outcome(id: &str, passed: u32, total: u32) -> GroupOutcome {
        GroupOutcome { prompt_id: RString::from(id), passed, total }
    }

    #[test]
    fn estimates_start_at_the_prior_and_weigh_recent_groups_more() {
        let config = EstimateConfig { prior_passes: 1.0, prior_fails: 1.0, decay: 0.5 };
        let mut rates = PassRates::new(config, &ids(2)).unwrap();
        assert_eq!(rates.estimate(0), 0.5);
        rates.observe(&[outcome("p0", 0, 4)]).unwrap();
        assert!((rates.estimate(0) - 1.0 / 6.0).abs() < 1e-12);
        // 4 of 4 now: old 0/4 counts half.
        rates.observe(&[outcome("p0", 4, 4)]).unwrap();
        assert!((rates.estimate(0) - 5.0 / 8.0).abs() < 1e-12);
        assert_eq!(rates.estimate(1), 0.5, "unseen prompts stay at the prior");
    }

    #[test]
    fn bad_outcomes_and_settings_are_refused_naming_what() {
        let mut rates = PassRates::new(EstimateConfig::default(), &ids(1)).unwrap();
        let error = rates.observe(&[outcome("nope", 1, 4)]).unwrap_err();
        assert!(error.message.contains("prompt nope is not in the training data"), "{error:?}");
        let error = rates.observe(&[outcome("p0", 5, 4)]).unwrap_err();
        assert!(error.message.contains("5 passed of 4"), "{error:?}");
        let bad = EstimateConfig { decay: 0.0, ..EstimateConfig::default() };
        let error = PassRates::new(bad, &ids(1)).unwrap_err();
        assert_eq!(error.message.as_str(), "decay: expected a number in (0, 1], got 0");
        let error = parse_config::<EstimateConfig>("frontier", r#"{"decai": 0.5}"#).unwrap_err();
        assert!(error.message.starts_with("frontier curriculum config: decai: unknown field"), "{error:?}");
    }

    #[test]
    fn picks_are_seeded_without_repeats_until_the_candidates_run_out() {
        let rates = PassRates::new(EstimateConfig::default(), &ids(5)).unwrap();
        let pick = |seed| rates.pick(&[0, 1, 2, 3, 4], 3, &mut SplitMix64::new(seed));
        assert_eq!(pick(7), pick(7));
        assert_ne!(pick(7), pick(8));
        let mut all = pick(7);
        all.sort();
        all.dedup();
        assert_eq!(all.len(), 3);
        let many = rates.pick(&[1, 2], 5, &mut SplitMix64::new(1));
        assert_eq!(many.len(), 5);
        assert!(many.iter().all(|id| id == "p1" || id == "p2"));
    }

    #[test]
    fn the_state_round_trips_and_refuses_other_data() {
        let mut rates = PassRates::new(EstimateConfig::default(), &ids(3)).unwrap();
        rates.observe(&[outcome("p1", 3, 4)]).unwrap();
        let saved = rates.save().unwrap();
        let mut restored = PassRates::new(EstimateConfig::default(), &ids(3)).unwrap();
        restored.load(&saved).unwrap();
        assert_eq!(restored, rates);
        let mut other = PassRates::new(EstimateConfig::default(), &ids(4)).unwrap();
        assert!(other.load(&saved).unwrap_err().message.contains("other training data"));
    }

    #[test]
    fn below_is_uniform_enough() {
        let mut rng = SplitMix64::new(3);
        let mut counts = [0usize; 4];
        for _ in 0..40_000 {
            counts[rng.below(4)] += 1;
        }
        assert!(counts.iter().all(|&c| (9_500..10_500).contains(&c)), "{counts:?}");
    }
}
