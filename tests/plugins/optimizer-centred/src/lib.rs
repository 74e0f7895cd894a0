//! Fixture: a minimal optimizer — advantages are rewards minus their group's mean; it computes no
//! loss (that needs libtorch, which the fixtures do not link). Proves the optimizer kind loads,
//! reports its needs and passes the libtorch check through the real loader.

use rlvr_plugin_api::{
    DataMode, LossInputs, LossOutput, Metadata, OptimizerInfo, OptimizerPlugin, PluginError, RVec,
    RewardBatch, export_optimizer,
};

pub struct Centred;

impl OptimizerPlugin for Centred {
    fn metadata() -> Metadata {
        Metadata { name: "centred", version: "0.1.0", description: "rewards minus their group mean" }
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

    fn advantages(&self, batch: &RewardBatch<'_>) -> Result<RVec<f64>, PluginError> {
        let (rewards, groups) = (batch.rewards.as_slice(), batch.group_ids.as_slice());
        if rewards.len() != groups.len() {
            return Err(PluginError::invalid_input("rewards and group_ids differ in length"));
        }
        let mean = |group: u64| {
            let members: Vec<f64> =
                rewards.iter().zip(groups).filter(|(_, g)| **g == group).map(|(r, _)| *r).collect();
            members.iter().sum::<f64>() / members.len() as f64
        };
        Ok(rewards.iter().zip(groups).map(|(reward, group)| reward - mean(*group)).collect())
    }

    fn loss(&self, _inputs: &LossInputs) -> Result<LossOutput, PluginError> {
        Err(PluginError::internal("the centred fixture computes no loss"))
    }
}

export_optimizer!(Centred);
