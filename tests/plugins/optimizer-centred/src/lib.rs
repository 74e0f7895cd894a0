//! Fixture: a minimal optimizer that computes nothing (that needs libtorch, which the fixtures do
//! not link). Proves the optimizer kind loads, reports its needs and passes the libtorch check
//! through the real loader.

use rlvr_plugin_api::{
    DataMode, LossInputs, LossOutput, Metadata, OptimizerInfo, OptimizerPlugin, PluginError, export_optimizer,
};

pub struct Centred;

impl OptimizerPlugin for Centred {
    fn metadata() -> Metadata {
        Metadata { name: "centred", version: "0.1.0", description: "loads and computes nothing" }
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
        Ok(Centred)
    }

    fn loss(&self, _inputs: &LossInputs) -> Result<LossOutput, PluginError> {
        Err(PluginError::internal("the centred fixture computes no loss"))
    }
}

export_optimizer!(Centred);
