//! `uniform`: samples prompts uniformly (seeded, without repeats within a step while prompts
//! last) and keeps per-prompt pass-rate estimates from each step's groups, like `frontier`.
//! Keys of `[curriculum]`: the estimator's `prior_passes`, `prior_fails`, `decay` and `history`
//! (counts that seed the estimates: the pinned version of a shared curriculum). Its state is
//! saved with each checkpoint and resumes exactly.

use rlvr_curriculum_common::{EstimateConfig, PassRates, parse_config};
use rlvr_plugin_api::{
    CurriculumInfo, CurriculumPlugin, GroupOutcome, Metadata, OptionError, OptionsReport, PluginError,
    RString, RVec, export_curriculum,
};

/// The uniform curriculum.
#[derive(Debug, Clone)]
pub struct Uniform {
    rates: PassRates,
}

impl CurriculumPlugin for Uniform {
    fn metadata() -> Metadata {
        Metadata {
            name: "uniform",
            version: env!("CARGO_PKG_VERSION"),
            description: "samples prompts uniformly, seeded; keeps per-prompt pass-rate estimates",
        }
    }

    fn requirements() -> CurriculumInfo {
        CurriculumInfo { uses_pass_rates: false }
    }

    fn from_config(config_json: &str, prompt_ids: &[RString]) -> Result<Self, PluginError> {
        let config: EstimateConfig = parse_config(config_json)?;
        Ok(Uniform { rates: PassRates::new(config, prompt_ids)? })
    }

    fn check_options(config_json: &str) -> Result<OptionsReport, OptionError> {
        parse_config::<EstimateConfig>(config_json)?.check()?;
        Ok(OptionsReport::default())
    }

    fn sample(&mut self, count: u32, seed: u64) -> Result<RVec<RString>, PluginError> {
        let mut rng = self.rates.rng(seed);
        let all: Vec<usize> = (0..self.rates.prompts().len()).collect();
        Ok(self.rates.pick(&all, count as usize, &mut rng).into_iter().collect())
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
        let ids: Vec<RString> = ["a", "b", "c"].iter().map(|id| RString::from(*id)).collect();
        let mut uniform = Uniform::from_config("{}", &ids)?;
        let mut picked: Vec<String> = uniform.sample(3, 1)?.iter().map(|id| id.as_str().to_owned()).collect();
        picked.sort();
        if picked != ["a", "b", "c"] {
            return Err(PluginError::internal(format!(
                "self-test: picked {picked:?}, expected each prompt once"
            )));
        }
        Ok(())
    }
}

export_curriculum!(Uniform);

#[cfg(test)]
mod tests {
    use super::*;

    /// Options → `Ok(())` (accepted, nothing to report) or `Err((key, message))`, through
    /// `check_options` (no prompts) and `from_config` (two prompts) alike.
    fn check(json: &str, expected: Result<(), (&str, &str)>) {
        let prompts = [RString::from("p0"), RString::from("p1")];
        let checked = Uniform::check_options(json);
        let created =
            Uniform::from_config(json, &prompts).map(|_| OptionsReport::default()).map_err(OptionError::from);
        rlvr_plugin_api::options::assert_answers(json, [checked, created], expected);
    }

    #[test]
    fn options_are_checked_naming_the_key_without_the_prompts() {
        check("{}", Ok(()));
        check(r#"{"prior_passes": 2}"#, Ok(()));
        check(
            r#"{"prior_pass": 2}"#,
            Err(("prior_pass", "unknown key; expected one of prior_passes, prior_fails, decay, history")),
        );
        check(r#"{"prior_fails": 0}"#, Err(("prior_fails", "expected a number > 0, got 0")));
    }

    #[test]
    fn it_covers_the_prompts_evenly_and_passes_its_self_test() {
        let ids: Vec<RString> = (0..10).map(|i| RString::from(format!("p{i}"))).collect();
        let mut uniform = Uniform::from_config("", &ids).unwrap();
        let mut counts = std::collections::BTreeMap::new();
        for step in 0..500u32 {
            let picked = uniform.sample(4, 11).unwrap();
            let outcomes: Vec<GroupOutcome> = picked
                .iter()
                .map(|id| GroupOutcome { prompt_id: id.clone(), passed: step % 2, total: 1 })
                .collect();
            uniform.observe(&outcomes).unwrap();
            for id in picked {
                *counts.entry(id.as_str().to_owned()).or_insert(0) += 1;
            }
        }
        assert_eq!(counts.len(), 10);
        assert!(counts.values().all(|&n| (150..250).contains(&n)), "{counts:?}");
        assert_eq!(Uniform::self_test(), Ok(()));
    }
}
