//! Fixture: an optimizer that kills its worker process (abort, SIGABRT) the first time it is
//! asked for advantages (or a loss). A job naming it crashes every worker it gets: the poison job of the
//! dead-letter test. Loading and the self-test are fine, so the daemon accepts the job.

use rlvr_plugin_api::{
    AdvantageInputs, AdvantageOutput, DataMode, LossInputs, LossOutput, Metadata, OptimizerInfo,
    OptimizerPlugin, PluginError, export_optimizer,
};

pub struct Poison;

impl OptimizerPlugin for Poison {
    fn metadata() -> Metadata {
        Metadata { name: "poison", version: "0.1.0", description: "aborts the worker at every step" }
    }

    fn requirements() -> OptimizerInfo {
        OptimizerInfo {
            data_mode: DataMode::OnlineGroups,
            needs_reference: false,
            needs_value_head: false,
            needs_groups: true,
            libtorch_version: "filled in by the export layer".into(),
        }
    }

    fn from_config(_config_json: &str) -> Result<Self, PluginError> {
        Ok(Poison)
    }

    fn advantages(&self, _inputs: &AdvantageInputs<'_>) -> Result<AdvantageOutput, PluginError> {
        // Not a panic: the export layer would catch that. This is a crash no guard survives.
        std::process::abort()
    }

    fn loss(&self, _inputs: &LossInputs) -> Result<LossOutput, PluginError> {
        // Not a panic: the export layer would catch that. This is a crash no guard survives.
        std::process::abort()
    }
}

export_optimizer!(Poison);
