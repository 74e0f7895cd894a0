//! What the curriculum plugins share: per-prompt pass-rate estimates learned from each step's
//! groups ([`PassRates`]), a seeded generator ([`SplitMix64`]) so a step's choice depends only
//! on the job's seed and the step, and the parsing of a plugin's keys of the job's `[curriculum]`.
//!
//! An estimate is the posterior mean of a Beta prior (`prior_passes`, `prior_fails`) updated with
//! the prompt's passes and fails, older observations weighted down by `decay` each time the
//! prompt is seen again (the policy moves, so old outcomes say less). Unseen prompts sit at the
//! prior mean. Everything is plain data, saved with each checkpoint as JSON and restored exactly.
//!
//! A job may start from counts learned by earlier jobs instead of from nothing: the `history`
//! key (a pinned version of a shared curriculum, put there by the worker, or set by hand) seeds
//! each listed prompt as if its passes and attempts had been observed. It seeds the initial state
//! only; a resumed job restores its saved estimates, which already hold the seeded counts.

use std::borrow::Cow;
use std::collections::{BTreeMap, HashSet};
use std::fmt::{self, Display};

use rlvr_plugin_api::{GroupOutcome, OptionError, PluginError, RString, parse_options};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

/// The seeded generator of every pick (`rlvr-seeded`), so a step's choice depends only on the seed.
pub use rlvr_seeded::SplitMix64;

/// Parses a plugin's keys of `[curriculum]` (`config_json`, blank = none) into `T`; errors name
/// the key in the spec's terms (the daemon prefixes `curriculum.`).
pub fn parse_config<T: DeserializeOwned>(config_json: &str) -> Result<T, OptionError> {
    parse_options(config_json)
}

/// Refuses the first key of `config_json` (an object) that is not in `known`, listing them. For
/// a config that flattens another: serde refuses an unknown key there without the outer keys.
pub fn known_keys(config_json: &str, known: &[&str]) -> Result<(), OptionError> {
    let Ok(serde_json::Value::Object(map)) = serde_json::from_str(config_json) else {
        // Not an object: `parse_config` says what is wrong with it.
        return Ok(());
    };
    match map.keys().find(|key| !known.contains(&key.as_str())) {
        Some(key) => {
            Err(OptionError::new(key.as_str(), format!("unknown key; expected one of {}", known.join(", "))))
        }
        None => Ok(()),
    }
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
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct EstimateConfig {
    /// Beta prior: passes assumed before any observation.
    pub prior_passes: f64,
    /// Beta prior: fails assumed before any observation.
    pub prior_fails: f64,
    /// Weight kept by a prompt's past observations each time it is observed again, in (0, 1].
    pub decay: f64,
    /// Counts each listed prompt starts from, by prompt id, as if observed before the first
    /// step: `{"<prompt id>": {"passes": p, "attempts": a}}`. How a job starts from a pinned
    /// version of a shared curriculum; prompts not in the job's training data are ignored
    /// (counted in [`HistoryUse::ignored`]), since a curriculum spans the data of many jobs.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub history: BTreeMap<String, HistoryCounts>,
}

/// A prompt's counts in `history`: weighted completions attempted and passed, 0 ≤ passes ≤
/// attempts (weighted, so not necessarily whole numbers).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HistoryCounts {
    pub passes: f64,
    pub attempts: f64,
}

impl Default for EstimateConfig {
    fn default() -> Self {
        EstimateConfig { prior_passes: 1.0, prior_fails: 1.0, decay: 0.7, history: BTreeMap::new() }
    }
}

impl EstimateConfig {
    /// Its keys, for a config that flattens it ([`known_keys`]).
    pub const KEYS: [&'static str; 4] = ["prior_passes", "prior_fails", "decay", "history"];

    pub fn check(&self) -> Result<(), PluginError> {
        require("prior_passes", self.prior_passes, self.prior_passes > 0.0, "a number > 0")?;
        require("prior_fails", self.prior_fails, self.prior_fails > 0.0, "a number > 0")?;
        require("decay", self.decay, self.decay > 0.0 && self.decay <= 1.0, "a number in (0, 1]")?;
        for (id, HistoryCounts { passes, attempts }) in &self.history {
            require(&format!("history.{id}.attempts"), *attempts, *attempts >= 0.0, "a number >= 0")?;
            require(
                &format!("history.{id}.passes"),
                *passes,
                (0.0..=*attempts).contains(passes),
                &format!("a number in [0, attempts] (attempts = {attempts})"),
            )?;
        }
        Ok(())
    }

    /// The settings a saved state records: `history` as a digest only.
    fn saved(&self) -> SavedSettings {
        let history = (!self.history.is_empty()).then(|| HistoryDigest {
            prompts: self.history.len(),
            fnv1a64: format!("{:016x}", fnv1a64(&self.history)),
        });
        SavedSettings {
            prior_passes: self.prior_passes,
            prior_fails: self.prior_fails,
            decay: self.decay,
            history,
        }
    }
}

/// How a [`PassRates`] used its config's `history`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HistoryUse {
    /// Listed prompts of the job's training data: their estimates start from the counts.
    pub seeded: usize,
    /// Listed prompts not in the job's training data.
    pub ignored: usize,
}

/// A prompt's weighted observations.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Seen {
    pub passes: f64,
    pub total: f64,
}

/// Pass-rate estimates of every prompt of the job's training data.
#[derive(Debug, Clone, PartialEq)]
pub struct PassRates {
    config: EstimateConfig,
    /// Prompt ids, in the data's order: sampling indexes into this.
    prompts: Vec<String>,
    /// Observed or seeded (`history`) prompts only.
    seen: BTreeMap<String, Seen>,
    /// Steps observed: a step's seed is mixed with it.
    steps: u64,
    /// The prompt ids, for checking outcomes (derived from `prompts`).
    known: HashSet<String>,
    /// Derived from `config.history` and `prompts`.
    history_use: HistoryUse,
}

/// What [`PassRates::save`] writes. Without `history` it is the format saved before `history`
/// existed, so states of earlier checkpoints load.
#[derive(Serialize, Deserialize)]
struct SavedState<'a> {
    config: SavedSettings,
    prompts: Cow<'a, [String]>,
    seen: Cow<'a, BTreeMap<String, Seen>>,
    steps: u64,
}

/// The settings a state was saved with. `history` only as a digest: its counts are in `seen`
/// already from the start, and a curriculum version (one entry per prompt of every job of the
/// curriculum) copied into every checkpoint would be dead weight.
#[derive(Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct SavedSettings {
    prior_passes: f64,
    prior_fails: f64,
    decay: f64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    history: Option<HistoryDigest>,
}

#[derive(Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct HistoryDigest {
    prompts: usize,
    fnv1a64: String,
}

impl Display for SavedSettings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let SavedSettings { prior_passes, prior_fails, decay, history } = self;
        write!(f, "prior_passes = {prior_passes}, prior_fails = {prior_fails}, decay = {decay}, history = ")?;
        match history {
            Some(HistoryDigest { prompts, fnv1a64 }) => write!(f, "{prompts} prompts (fnv1a64 {fnv1a64})"),
            None => f.write_str("none"),
        }
    }
}

/// FNV-1a (64 bits) of a history's ids and exact counts, in id order: a check that a resume
/// was given the history the job started with, not a defence against forgery (no hash
/// dependency needed). 0xff, which UTF-8 never contains, ends each id.
fn fnv1a64(history: &BTreeMap<String, HistoryCounts>) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    let mut eat = |bytes: &[u8]| {
        for &byte in bytes {
            hash = (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3);
        }
    };
    for (id, counts) in history {
        eat(id.as_bytes());
        eat(&[0xff]);
        eat(&counts.passes.to_bits().to_le_bytes());
        eat(&counts.attempts.to_bits().to_le_bytes());
    }
    hash
}

impl PassRates {
    pub fn new(config: EstimateConfig, prompt_ids: &[RString]) -> Result<Self, PluginError> {
        config.check()?;
        if prompt_ids.is_empty() {
            return Err(PluginError::invalid_input("no prompts to choose from"));
        }
        let prompts: Vec<String> = prompt_ids.iter().map(|id| id.as_str().to_owned()).collect();
        let known: HashSet<String> = prompts.iter().cloned().collect();
        let mut seen = BTreeMap::new();
        let mut history_use = HistoryUse::default();
        for (id, counts) in &config.history {
            if known.contains(id) {
                seen.insert(id.clone(), Seen { passes: counts.passes, total: counts.attempts });
                history_use.seeded += 1;
            } else {
                history_use.ignored += 1;
            }
        }
        Ok(PassRates { config, prompts, seen, steps: 0, known, history_use })
    }

    pub fn prompts(&self) -> &[String] {
        &self.prompts
    }

    /// How many prompts of `history` were seeded, and how many ignored (not in the data).
    pub fn history_use(&self) -> HistoryUse {
        self.history_use
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
        SplitMix64::new(seed ^ self.steps.wrapping_mul(rlvr_seeded::GOLDEN_GAMMA))
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
        let state = SavedState {
            config: self.config.saved(),
            prompts: Cow::Borrowed(&self.prompts),
            seen: Cow::Borrowed(&self.seen),
            steps: self.steps,
        };
        serde_json::to_string(&state).map_err(|error| PluginError::internal(format!("state: {error}")))
    }

    /// Restores a saved state; it must be of the same prompts and settings, `history` included
    /// (a resume is given the history the job started with; the saved estimates replace what it
    /// seeded).
    pub fn load(&mut self, state_json: &str) -> Result<(), PluginError> {
        let state: SavedState = serde_json::from_str(state_json)
            .map_err(|error| PluginError::invalid_input(format!("state: {error}")))?;
        if *state.prompts != *self.prompts {
            return Err(PluginError::invalid_input(
                "state: saved for other training data (its prompt ids differ)",
            ));
        }
        let settings = self.config.saved();
        if state.config != settings {
            return Err(PluginError::invalid_input(format!(
                "state: saved with other settings ({}; now {settings})",
                state.config
            )));
        }
        self.seen = state.seen.into_owned();
        self.steps = state.steps;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    impl PassRates {
        /// Every prompt's estimate, for comparing two estimators.
        fn sample_of_estimates(&self) -> Vec<f64> {
            (0..self.prompts.len()).map(|index| self.estimate(index)).collect()
        }
    }

    fn ids(n: usize) -> Vec<RString> {
        (0..n).map(|i| RString::from(format!("p{i}"))).collect()
    }

    fn outcome(id: &str, passed: u32, total: u32) -> GroupOutcome {
        GroupOutcome { prompt_id: RString::from(id), passed, total }
    }

    #[test]
    fn estimates_start_at_the_prior_and_weigh_recent_groups_more() {
        let config =
            EstimateConfig { prior_passes: 1.0, prior_fails: 1.0, decay: 0.5, ..EstimateConfig::default() };
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
        let error = parse_config::<EstimateConfig>(r#"{"decai": 0.5}"#).unwrap_err();
        assert_eq!(
            error.to_string(),
            "decai: unknown key; expected one of prior_passes, prior_fails, decay, history"
        );
        let error = known_keys(r#"{"band": [0, 1], "decai": 0.5}"#, &["band", "decay"]).unwrap_err();
        assert_eq!(error.to_string(), "decai: unknown key; expected one of band, decay");
        assert!(known_keys(r#"{"band": [0, 1]}"#, &["band"]).is_ok());
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

    /// Estimates seeded by `history_json` (the `history` key) under prior (`prior_passes`,
    /// `prior_fails`): `(prompt id, expected estimate)` for each prompt of `prompts`.
    fn check(prior: (f64, f64), history_json: &str, prompts: usize, expected: &[(&str, f64)]) {
        let json = format!(
            r#"{{"prior_passes": {}, "prior_fails": {}, "history": {history_json}}}"#,
            prior.0, prior.1
        );
        let config: EstimateConfig = parse_config(&json).unwrap();
        let rates = PassRates::new(config, &ids(prompts)).unwrap();
        for &(id, estimate) in expected {
            let index = rates.prompts().iter().position(|p| p == id).unwrap();
            assert!(
                (rates.estimate(index) - estimate).abs() < 1e-12,
                "{id}: {} != {estimate}",
                rates.estimate(index)
            );
        }
    }

    #[test]
    fn history_seeds_the_beta_posterior_mean() {
        // (passes + prior_passes) / (attempts + prior_passes + prior_fails), by hand.
        check((1.0, 1.0), r#"{"p0": {"passes": 3, "attempts": 4}}"#, 2, &[("p0", 4.0 / 6.0), ("p1", 0.5)]);
        check(
            (2.0, 3.0),
            r#"{"p1": {"passes": 1.5, "attempts": 2.5}}"#,
            2,
            &[("p0", 0.4), ("p1", 3.5 / 7.5)],
        );
        check((1.0, 1.0), r#"{"p0": {"passes": 0, "attempts": 0}}"#, 1, &[("p0", 0.5)]);
        check(
            (1.0, 1.0),
            r#"{"p0": {"passes": 0, "attempts": 10}, "p1": {"passes": 10, "attempts": 10}}"#,
            2,
            &[("p0", 1.0 / 12.0), ("p1", 11.0 / 12.0)],
        );
    }

    #[test]
    fn seeded_counts_decay_like_observed_ones() {
        let history = BTreeMap::from([("p0".to_owned(), HistoryCounts { passes: 3.0, attempts: 4.0 })]);
        let config = EstimateConfig { decay: 0.5, history, ..EstimateConfig::default() };
        let mut rates = PassRates::new(config, &ids(1)).unwrap();
        rates.observe(&[outcome("p0", 0, 4)]).unwrap();
        // (3 × 0.5 + 0 + 1) / (4 × 0.5 + 4 + 2)
        assert!((rates.estimate(0) - 2.5 / 8.0).abs() < 1e-12);
    }

    #[test]
    fn history_of_prompts_outside_the_data_is_ignored_and_counted() {
        let json = r#"{"history": {"p1": {"passes": 2, "attempts": 2}, "elsewhere": {"passes": 1, "attempts": 9},
                       "p9": {"passes": 0, "attempts": 1}}}"#;
        let config: EstimateConfig = parse_config(json).unwrap();
        let rates = PassRates::new(config, &ids(2)).unwrap();
        assert_eq!(rates.history_use(), HistoryUse { seeded: 1, ignored: 2 });
        assert_eq!(rates.estimate(0), 0.5);
        assert_eq!(rates.estimate(1), 0.75);
        let none = PassRates::new(EstimateConfig::default(), &ids(2)).unwrap();
        assert_eq!(none.history_use(), HistoryUse::default());
    }

    #[test]
    fn bad_history_is_refused_naming_the_key() {
        let error = |history: &str| {
            let json = format!(r#"{{"history": {history}}}"#);
            match parse_config::<EstimateConfig>(&json) {
                Ok(config) => PassRates::new(config, &ids(1)).unwrap_err().message.to_string(),
                Err(error) => error.to_string(),
            }
        };
        let cases = [
            (
                r#"{"p0": {"passes": 5, "attempts": 4}}"#,
                "history.p0.passes: expected a number in [0, attempts] (attempts = 4), got 5",
            ),
            (
                r#"{"p0": {"passes": -1, "attempts": 4}}"#,
                "history.p0.passes: expected a number in [0, attempts] (attempts = 4), got -1",
            ),
            (
                r#"{"p0": {"passes": 0, "attempts": -2}}"#,
                "history.p0.attempts: expected a number >= 0, got -2",
            ),
            (r#"{"zz": {"passes": 1}}"#, "history.zz.attempts: missing; this key is required"),
            (
                r#"{"p0": {"passes": 1, "attempts": 2, "pass_rate": 0.5}}"#,
                "history.p0.pass_rate: unknown key; expected one of passes, attempts",
            ),
            (
                r#"{"p0": {"passes": "1", "attempts": 2}}"#,
                "history.p0.passes: expected f64, got string \"1\"",
            ),
            (r#"[1]"#, "history: expected a map, got sequence"),
        ];
        for (history, expected) in cases {
            assert_eq!(error(history), expected, "{history}");
        }
    }

    #[test]
    fn a_seeded_state_resumes_with_the_same_history_only() {
        let history = |passes| {
            let counts = HistoryCounts { passes, attempts: 4.0 };
            BTreeMap::from([("p0".to_owned(), counts), ("elsewhere".to_owned(), counts)])
        };
        let config = |passes| EstimateConfig { history: history(passes), ..EstimateConfig::default() };
        let mut rates = PassRates::new(config(3.0), &ids(3)).unwrap();
        rates.observe(&[outcome("p0", 1, 4), outcome("p2", 2, 4)]).unwrap();
        let saved = rates.save().unwrap();
        assert!(!saved.contains("elsewhere"), "the history is saved as a digest: {saved}");
        assert!(saved.contains(r#""history":{"prompts":2,"fnv1a64":""#), "{saved}");

        let mut resumed = PassRates::new(config(3.0), &ids(3)).unwrap();
        resumed.load(&saved).unwrap();
        assert_eq!(resumed, rates);
        assert_eq!(resumed.sample_of_estimates(), rates.sample_of_estimates());

        let refused = |config: EstimateConfig| {
            PassRates::new(config, &ids(3)).unwrap().load(&saved).unwrap_err().message.to_string()
        };
        let other = refused(config(2.0));
        assert!(
            other.starts_with(
                "state: saved with other settings (prior_passes = 1, prior_fails = 1, decay = 0.7, \
                 history = 2 prompts (fnv1a64 "
            ),
            "{other}"
        );
        assert_ne!(config(2.0).saved(), config(3.0).saved());
        let without = refused(EstimateConfig::default());
        assert!(
            without.ends_with("; now prior_passes = 1, prior_fails = 1, decay = 0.7, history = none)"),
            "{without}"
        );
    }

    #[test]
    fn states_saved_before_history_existed_still_load() {
        // regression: the state format without `history` is the one earlier builds saved.
        let old = r#"{"config":{"prior_passes":1.0,"prior_fails":1.0,"decay":0.7},"prompts":["p0","p1","p2"],"seen":{"p1":{"passes":3.0,"total":4.0}},"steps":1}"#;
        let mut rates = PassRates::new(EstimateConfig::default(), &ids(3)).unwrap();
        rates.load(old).unwrap();
        assert_eq!(rates.save().unwrap(), old);
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
