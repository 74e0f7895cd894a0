//! Fixture: a minimal curriculum — cycles through the prompts in order. Proves the curriculum kind
//! loads through the real loader.

use rlvr_plugin_api::{
    CurriculumInfo, CurriculumPlugin, GroupOutcome, Metadata, PluginError, RString, RVec, export_curriculum,
};

pub struct Cycle {
    prompts: Vec<RString>,
    next: usize,
}

impl CurriculumPlugin for Cycle {
    fn metadata() -> Metadata {
        Metadata { name: "cycle", version: "0.1.0", description: "every prompt in turn" }
    }

    fn requirements() -> CurriculumInfo {
        CurriculumInfo { uses_pass_rates: false }
    }

    fn from_config(_config_json: &str, prompt_ids: &[RString]) -> Result<Self, PluginError> {
        Ok(Cycle { prompts: prompt_ids.to_vec(), next: 0 })
    }

    fn sample(&mut self, count: u32, _seed: u64) -> Result<RVec<RString>, PluginError> {
        if self.prompts.is_empty() {
            return Err(PluginError::invalid_input("no prompts to sample from"));
        }
        let picked =
            (0..count as usize).map(|i| self.prompts[(self.next + i) % self.prompts.len()].clone()).collect();
        self.next = (self.next + count as usize) % self.prompts.len();
        Ok(picked)
    }

    fn observe(&mut self, _outcomes: &[GroupOutcome]) -> Result<(), PluginError> {
        Ok(())
    }

    fn save_state(&self) -> Result<String, PluginError> {
        Ok(self.next.to_string())
    }

    fn load_state(&mut self, state_json: &str) -> Result<(), PluginError> {
        self.next = state_json
            .trim()
            .parse()
            .map_err(|_| PluginError::invalid_input("state: expected an integer"))?;
        Ok(())
    }
}

export_curriculum!(Cycle);
