//! `frontier`: trains where the policy is learning. Each prompt's pass rate is estimated from the
//! groups of earlier steps (`rlvr_curriculum_common::PassRates`); a step samples, seeded, among
//! the prompts whose estimate lies in `band` (default 0.1 to 0.9): all-pass and all-fail prompts
//! teach a group-relative optimizer nothing, their advantages being zero. When fewer prompts than
//! a step needs are in the band, the ones closest to it fill the step.
//!
//! Keys of `[curriculum]`: `band = [low, high]`, and the estimator's `prior_passes`,
//! `prior_fails`, `decay`, `history` (see `EstimateConfig`). Its state (estimates and step
//! count) is saved with each checkpoint and resumes exactly.

use rlvr_curriculum_common::{EstimateConfig, PassRates, known_keys, parse_config, require};
use rlvr_plugin_api::{
    CurriculumInfo, CurriculumPlugin, GroupOutcome, Metadata, OptionError, OptionsReport, PluginError,
    RString, RVec, export_curriculum,
};
use serde::Deserialize;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct FrontierConfig {
    #[serde(default = "default_band")]
    band: [f64; 2],
    #[serde(flatten)]
    estimates: EstimateConfig,
}

fn default_band() -> [f64; 2] {
    [0.1, 0.9]
}

/// The frontier curriculum.
#[derive(Debug, Clone)]
pub struct Frontier {
    band: [f64; 2],
    rates: PassRates,
}

impl FrontierConfig {
    /// Its keys with the estimator's: `#[serde(flatten)]` loses the list an unknown key's
    /// refusal should give.
    const KEYS: [&'static str; 5] = ["band", "prior_passes", "prior_fails", "decay", "history"];

    /// Parsed and checked; nothing depends on the job's prompts.
    fn parse(config_json: &str) -> Result<Self, PluginError> {
        known_keys(config_json, &Self::KEYS)?;
        let config: FrontierConfig = parse_config(config_json)?;
        let [low, high] = config.band;
        require("band[0]", low, (0.0..1.0).contains(&low), "a pass rate in [0, 1)")?;
        require("band[1]", high, high > low && high <= 1.0, "a pass rate above band[0], at most 1")?;
        config.estimates.check()?;
        Ok(config)
    }
}

impl Frontier {
    fn new(config_json: &str, prompt_ids: &[RString]) -> Result<Self, PluginError> {
        let config = FrontierConfig::parse(config_json)?;
        Ok(Frontier { band: config.band, rates: PassRates::new(config.estimates, prompt_ids)? })
    }

    /// How far an estimate lies outside the band (0 inside).
    fn distance(&self, estimate: f64) -> f64 {
        let [low, high] = self.band;
        (low - estimate).max(estimate - high).max(0.0)
    }
}

impl CurriculumPlugin for Frontier {
    fn metadata() -> Metadata {
        Metadata {
            name: "frontier",
            version: env!("CARGO_PKG_VERSION"),
            description: "samples prompts whose estimated pass rate lies in a band (the policy's frontier)",
        }
    }

    fn requirements() -> CurriculumInfo {
        CurriculumInfo { uses_pass_rates: true }
    }

    fn from_config(config_json: &str, prompt_ids: &[RString]) -> Result<Self, PluginError> {
        Frontier::new(config_json, prompt_ids)
    }

    fn check_options(config_json: &str) -> Result<OptionsReport, OptionError> {
        FrontierConfig::parse(config_json)?;
        Ok(OptionsReport::default())
    }

    fn sample(&mut self, count: u32, seed: u64) -> Result<RVec<RString>, PluginError> {
        let count = count as usize;
        let mut rng = self.rates.rng(seed);
        let distances: Vec<f64> =
            (0..self.rates.prompts().len()).map(|i| self.distance(self.rates.estimate(i))).collect();
        let (in_band, mut others): (Vec<usize>, Vec<usize>) =
            (0..distances.len()).partition(|&i| distances[i] == 0.0);
        if in_band.len() >= count {
            return Ok(self.rates.pick(&in_band, count, &mut rng).into_iter().collect());
        }
        // Too few at the frontier: every one of them, then the nearest others (ties seeded).
        rng.shuffle(&mut others);
        others.sort_by(|&a, &b| distances[a].total_cmp(&distances[b]));
        let mut chosen = self.rates.pick(&in_band, in_band.len(), &mut rng);
        let nearest = &others[..(count - chosen.len()).min(others.len())];
        chosen.extend(self.rates.pick(nearest, count - chosen.len(), &mut rng));
        Ok(chosen.into_iter().collect())
    }

    fn observe(&mut self, outcomes: &[GroupOutcome]) -> Result<(), PluginError> {
        self.rates.observe(outcomes)
    }

    fn save_state(&self) -> Result<String, PluginError> {
        self.rates.save()
    }

    fn load_state(&mut self, state_json: &str) -> Result<(), PluginError> {
        self.rates.load(state_json)
    }

    fn self_test() -> Result<(), PluginError> {
        let ids: Vec<RString> = ["easy", "hard", "edge"].iter().map(|id| RString::from(*id)).collect();
        let mut frontier = Frontier::new(r#"{"decay": 1.0}"#, &ids)?;
        let outcome = |id: &str, passed| GroupOutcome { prompt_id: RString::from(id), passed, total: 8 };
        frontier.observe(&[outcome("easy", 8), outcome("hard", 0), outcome("edge", 4)])?;
        let picked = frontier.sample(1, 42)?;
        if picked.as_slice() != [RString::from("edge")] {
            return Err(PluginError::internal(format!("self-test: picked {picked:?}, expected [\"edge\"]")));
        }
        Ok(())
    }
}

export_curriculum!(Frontier);

#[cfg(test)]
mod tests {
    use super::*;

    /// Options → `Ok(())` (accepted, nothing to report) or `Err((key, message))`, through
    /// `check_options` (no prompts) and `from_config` (two prompts) alike.
    fn check(json: &str, expected: Result<(), (&str, &str)>) {
        let prompts = [RString::from("p0"), RString::from("p1")];
        let checked = Frontier::check_options(json);
        let created = Frontier::from_config(json, &prompts)
            .map(|_| OptionsReport::default())
            .map_err(OptionError::from);
        rlvr_plugin_api::options::assert_answers(json, [checked, created], expected);
    }

    #[test]
    fn options_are_checked_naming_the_key_without_the_prompts() {
        check("{}", Ok(()));
        check(r#"{"band": [0.2, 0.8], "decay": 0.5}"#, Ok(()));
        check(
            r#"{"decai": 0.5}"#,
            Err(("decai", "unknown key; expected one of band, prior_passes, prior_fails, decay, history")),
        );
        check(
            r#"{"band": [0.8, 0.2]}"#,
            Err(("band[1]", "expected a pass rate above band[0], at most 1, got 0.2")),
        );
        check(r#"{"band": [0.1]}"#, Err(("band", "expected an array of length 2, got length 1")));
        check(r#"{"decay": 0}"#, Err(("decay", "expected a number in (0, 1], got 0")));
        check(
            r#"{"history": {"p0": {"passes": 3, "attempts": 2}}}"#,
            Err(("history.p0.passes", "expected a number in [0, attempts] (attempts = 2), got 3")),
        );
    }

    fn ids(n: usize) -> Vec<RString> {
        (0..n).map(|i| RString::from(format!("p{i}"))).collect()
    }

    fn outcome(id: &str, passed: u32) -> GroupOutcome {
        GroupOutcome { prompt_id: RString::from(id), passed, total: 8 }
    }

    #[test]
    fn it_samples_inside_the_band_once_the_extremes_are_known() {
        let mut frontier = Frontier::new(r#"{"band": [0.2, 0.8], "decay": 1.0}"#, &ids(6)).unwrap();
        // p0, p1 always pass; p2, p3 never; p4, p5 half the time.
        let step: Vec<GroupOutcome> = [("p0", 8), ("p1", 8), ("p2", 0), ("p3", 0), ("p4", 4), ("p5", 4)]
            .iter()
            .map(|&(id, p)| outcome(id, p))
            .collect();
        frontier.observe(&step).unwrap();
        frontier.observe(&step).unwrap();
        for seed in 0..20 {
            let mut picked: Vec<String> =
                frontier.sample(2, seed).unwrap().iter().map(|id| id.as_str().to_owned()).collect();
            picked.sort();
            assert_eq!(picked, ["p4", "p5"], "seed {seed}");
        }
        // Asked for more than the band holds: the band, then the nearest.
        let picked = frontier.sample(4, 1).unwrap();
        assert!(picked.iter().any(|id| id == "p4") && picked.iter().any(|id| id == "p5"), "{picked:?}");
        assert_eq!(picked.len(), 4);
    }

    #[test]
    fn a_resumed_curriculum_chooses_what_the_uninterrupted_one_does() {
        let mut running = Frontier::new("{}", &ids(20)).unwrap();
        let mut steps = Vec::new();
        for step in 0..5u32 {
            let picked = running.sample(4, 7).unwrap();
            let outcomes: Vec<GroupOutcome> =
                picked.iter().map(|id| outcome(id.as_str(), (step * 3 + id.len() as u32) % 9)).collect();
            running.observe(&outcomes).unwrap();
            steps.push(picked);
        }
        let saved = running.save_state().unwrap();
        let mut resumed = Frontier::new("{}", &ids(20)).unwrap();
        resumed.load_state(&saved).unwrap();
        assert_eq!(resumed.sample(4, 7).unwrap(), running.sample(4, 7).unwrap());
        assert_ne!(steps[0], steps[1], "each step draws afresh");
    }

    #[test]
    fn a_pinned_history_steers_the_first_step() {
        // p0 and p1 are known easy and hard from the curriculum's history; p2 is new (prior 0.5).
        let config = r#"{"band": [0.2, 0.8], "history": {
            "p0": {"passes": 8, "attempts": 8}, "p1": {"passes": 0, "attempts": 8},
            "other-jobs-prompt": {"passes": 1, "attempts": 2}}}"#;
        let mut frontier = Frontier::new(config, &ids(3)).unwrap();
        assert_eq!(frontier.rates.history_use().ignored, 1);
        for seed in 0..10 {
            assert_eq!(frontier.sample(1, seed).unwrap().as_slice(), [RString::from("p2")], "seed {seed}");
        }
        let refused = Frontier::new(r#"{"history": {"p0": {"passes": 9, "attempts": 8}}}"#, &ids(3));
        assert_eq!(
            refused.unwrap_err().message.as_str(),
            "history.p0.passes: expected a number in [0, attempts] (attempts = 8), got 9"
        );
    }

    #[test]
    fn bad_keys_are_refused_by_name() {
        let error = |json: &str| Frontier::new(json, &ids(2)).unwrap_err().message.to_string();
        assert_eq!(
            error(r#"{"band": [0.9, 0.1]}"#),
            "band[1]: expected a pass rate above band[0], at most 1, got 0.1"
        );
        assert_eq!(error(r#"{"band": [-0.1, 0.5]}"#), "band[0]: expected a pass rate in [0, 1), got -0.1");
        assert_eq!(
            error(r#"{"bands": [0.1, 0.9]}"#),
            "bands: unknown key; expected one of band, prior_passes, prior_fails, decay, history"
        );
        assert_eq!(Frontier::self_test(), Ok(()));
    }
}
