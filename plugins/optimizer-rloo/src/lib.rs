//! `rloo`: REINFORCE Leave-One-Out (Ahmadian et al., arXiv:2402.14740; Kool et al. 2019).
//!
//! Each completion's baseline is the mean reward of the other completions of its group:
//! `A_i = r_i − Σ_{j≠i} r_j / (G − 1)`, after the KL to the reference is subtracted from each
//! reward (`r_i − β·Σ_t k(old, ref)`), repeated over the completion's tokens. The loss is the
//! clipped surrogate (which is plain REINFORCE while ρ = 1, i.e. for the first update of a
//! batch), aggregated by `loss_agg`. Options add DAPO's soft overlong punishment
//! (`overlong_buffer`, `overlong_penalty`) and an entropy bonus (`entropy_coef`). The formulas,
//! with their sources, are in the README.

use rlvr_optimizer_common::config;
use rlvr_optimizer_common::inputs::Like;
use rlvr_optimizer_common::losses::{
    ClippedPolicy, KlEstimator, LossAgg, Surrogate, check_scale, entropy_bonus,
};
use rlvr_optimizer_common::rewards::{self, OnlineBatch, OverlongShaping};
use rlvr_optimizer_common::{advantage_output, expect_all_close, expect_close, loss_output, metric};
use rlvr_plugin_api::{
    AdvantageInputs, AdvantageOutput, DataMode, HostContext, LossInputs, LossOutput, LossScale, Metadata,
    OptimizerInfo, OptimizerPlugin, OptionError, OptionsReport, PluginError, ROption, TensorHandle,
    export_optimizer,
};
use rlvr_plugin_tensor::TensorHandleExt;
use serde::Deserialize;
use tch::{Device, Kind, Tensor};

/// Added to the batch std when `normalize_advantages` divides by it.
const NORMALIZE_EPS: f64 = 1e-8;

/// The plugin's keys of the job's `[optimizer]` table.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RlooConfig {
    /// Weight β of the KL penalty in the reward.
    pub kl_beta: f64,
    /// Which estimator of the KL.
    pub kl_estimator: KlEstimator,
    /// Clip range ε of the ratio, both sides.
    pub clip_eps: f64,
    /// Whether advantages are whitened over the batch (mean 0, population std 1).
    pub normalize_advantages: bool,
    /// How per-token losses are aggregated.
    pub loss_agg: LossAgg,
    /// DAPO's overlong buffer `L_cache`, in tokens; unset: no length shaping.
    pub overlong_buffer: Option<u32>,
    /// The factor of DAPO's length penalty; 1 when unset.
    pub overlong_penalty: Option<f64>,
    /// Weight of the entropy bonus `−entropy_coef·Ĥ` in the loss.
    pub entropy_coef: f64,
}

impl Default for RlooConfig {
    fn default() -> Self {
        RlooConfig {
            kl_beta: 0.05,
            kl_estimator: KlEstimator::K1,
            clip_eps: 0.2,
            normalize_advantages: false,
            loss_agg: LossAgg::TokenMean,
            overlong_buffer: None,
            overlong_penalty: None,
            entropy_coef: 0.0,
        }
    }
}

/// The RLOO optimizer.
#[derive(Debug, Clone)]
pub struct Rloo {
    config: RlooConfig,
    overlong: Option<OverlongShaping>,
    /// The job's `max_new_tokens` (DAPO's `L_max`), from the host context at creation.
    max_new_tokens: Option<u32>,
}

impl Rloo {
    /// An optimizer with `config`, its ranges checked.
    pub fn new(config: RlooConfig) -> Result<Self, PluginError> {
        config::non_negative("kl_beta", config.kl_beta)?;
        config::open_unit("clip_eps", config.clip_eps)?;
        config::non_negative("entropy_coef", config.entropy_coef)?;
        let overlong = OverlongShaping::from_keys(config.overlong_buffer, config.overlong_penalty)?;
        Ok(Rloo { config, overlong, max_new_tokens: None })
    }

    /// Advantages; DAPO's `L_max` is the job's `max_new_tokens` from the host context.
    fn batch_advantages(&self, inputs: &AdvantageInputs<'_>) -> Result<AdvantageOutput, PluginError> {
        let batch = OnlineBatch::new(inputs)?;
        let groups = rewards::groups(inputs.group_ids.as_slice())?;
        let mut metrics =
            vec![metric("uniform_group_frac", rewards::uniform_group_fraction(&batch.rewards, &groups))];
        let mut shaped = batch.rewards.clone();
        if let Some(overlong) = &self.overlong {
            metrics.extend(overlong.apply(&mut shaped, batch.mask.lengths(), self.max_new_tokens)?);
        }
        let required = (self.config.kl_beta > 0.0).then_some("the KL penalty of the reward, kl_beta > 0");
        if let Some(reference) = batch.reference(inputs, required)? {
            let penalty = batch.kl_penalty(self.config.kl_estimator, self.config.kl_beta, &reference)?;
            penalty.apply(&mut shaped);
            metrics.extend(penalty.metrics);
        }
        let mut advantages = leave_one_out(&shaped, &groups);
        if self.config.normalize_advantages {
            rewards::whiten(&mut advantages, NORMALIZE_EPS);
        }
        Ok(advantage_output(batch.mask.repeat_rows(&advantages), None, metrics))
    }
}

/// `r_i − Σ_{j≠i} r_j / (G − 1)` in each group; 0 for a group of one (no other completion).
fn leave_one_out(rewards: &[f64], groups: &[std::ops::Range<usize>]) -> Vec<f64> {
    let mut advantages = vec![0.0; rewards.len()];
    for group in groups.iter().filter(|group| group.len() > 1) {
        let total: f64 = rewards[group.start..group.end].iter().sum();
        let others = (group.len() - 1) as f64;
        for row in group.clone() {
            advantages[row] = rewards[row] - (total - rewards[row]) / others;
        }
    }
    advantages
}

impl OptimizerPlugin for Rloo {
    fn metadata() -> Metadata {
        Metadata {
            name: "rloo",
            version: env!("CARGO_PKG_VERSION"),
            description: "RLOO: leave-one-out baseline within each group, KL to the reference in the reward, clipped ratio",
        }
    }

    fn requirements() -> OptimizerInfo {
        OptimizerInfo {
            data_mode: DataMode::OnlineGroups,
            needs_reference: true,
            needs_value_head: false,
            needs_groups: true,
            libtorch_version: "filled in by the export layer".into(),
        }
    }

    fn from_config(config_json: &str) -> Result<Self, PluginError> {
        Rloo::new(config::parse(config_json)?)
    }

    /// The job's `max_new_tokens` comes with the host's context (a host that does not give it
    /// leaves overlong shaping refused at the first advantages).
    fn from_config_in(config_json: &str, host: &HostContext) -> Result<Self, PluginError> {
        Ok(Rloo { max_new_tokens: host.max_new_tokens, ..Self::from_config(config_json)? })
    }

    fn check_options(config_json: &str) -> Result<OptionsReport, OptionError> {
        Rloo::new(config::parse(config_json)?)?;
        Ok(OptionsReport::default())
    }

    /// The reference only enters through the KL term.
    fn uses_reference(&self) -> bool {
        self.config.kl_beta > 0.0
    }

    fn advantages(&self, inputs: &AdvantageInputs<'_>) -> Result<AdvantageOutput, PluginError> {
        self.batch_advantages(inputs)
    }

    fn loss(&self, inputs: &LossInputs) -> Result<LossOutput, PluginError> {
        let (like, logprobs) = Like::first("logprobs", inputs.logprobs)?;
        let mask = like.mask(inputs.mask)?;
        check_scale(&inputs.scale, &mask)?;
        let old = mask.clean(&like.required("old_logprobs", inputs.old_logprobs, "the policy ratio")?);
        let advantages = mask.clean(&like.required("advantages", inputs.advantages, "the policy loss")?);
        let reference = like.optional("ref_logprobs", inputs.ref_logprobs)?;
        let logprobs = mask.clean(&logprobs);

        let policy =
            ClippedPolicy::new(&logprobs, &old, &advantages, &mask, Surrogate::ppo(self.config.clip_eps));
        let mut metrics = policy.metrics(&mask);
        let (bonus, entropy) = entropy_bonus(&logprobs, &old, &mask, self.config.entropy_coef);
        metrics.push(entropy);
        if let Some(reference) = reference {
            let kl = self.config.kl_estimator.per_token(&logprobs, &mask.clean(&reference));
            metrics.push(metric("kl", mask.mean(&kl)));
        }
        let per_token = match bonus {
            Some(bonus) => policy.loss + bonus,
            None => policy.loss,
        };
        let loss = self.config.loss_agg.aggregate(&per_token, &mask, &inputs.scale)?;
        Ok(loss_output(loss, metrics))
    }

    /// One group of three, rewards 1, 0, 0, no KL (ref = old): `A = 1, −½, −½`; at ρ = 1 the
    /// token-mean loss over three tokens is `−Σ A / 3 = 0` with gradient `−A_i / 3`.
    fn self_test() -> Result<(), PluginError> {
        let rloo = Rloo::from_config("{}")?;
        let old = Tensor::from_slice(&[-1.0f64, -2.0, -0.5]).reshape([3, 1]);
        let mask = Tensor::ones([3, 1], (Kind::Double, Device::Cpu));
        let output = rloo.advantages(&AdvantageInputs {
            rewards: [1.0, 0.0, 0.0][..].into(),
            group_ids: [3, 3, 3][..].into(),
            old_logprobs: TensorHandle::borrow(&old),
            ref_logprobs: ROption::RSome(TensorHandle::borrow(&old)),
            mask: TensorHandle::borrow(&mask),
            values: ROption::RNone,
        })?;
        // SAFETY: the handle was given to us by `advantages` and is taken back once.
        let advantages = unsafe { output.advantages.into_tensor() };
        expect_all_close("advantages", &advantages, &[1.0, -0.5, -0.5])?;

        let logprobs = old.copy().set_requires_grad(true);
        let output = rloo.loss(&LossInputs {
            logprobs: TensorHandle::borrow(&logprobs),
            mask: TensorHandle::borrow(&mask),
            old_logprobs: ROption::RSome(TensorHandle::borrow(&old)),
            ref_logprobs: ROption::RSome(TensorHandle::borrow(&old)),
            advantages: ROption::RSome(TensorHandle::borrow(&advantages)),
            values: ROption::RNone,
            old_values: ROption::RNone,
            returns: ROption::RNone,
            scale: LossScale { batch_sequences: 3, batch_tokens: 3, max_new_tokens: 1 },
        })?;
        // SAFETY: as above.
        let loss = unsafe { output.loss.into_tensor() };
        loss.backward();
        expect_close("loss", loss.double_value(&[]), 0.0)?;
        expect_all_close("gradient", &logprobs.grad(), &[-1.0 / 3.0, 0.5 / 3.0, 0.5 / 3.0])
    }
}

export_optimizer!(Rloo);

#[cfg(test)]
mod tests {
    use super::*;

    /// Options → `Ok(())` (accepted, nothing to report) or `Err((key, message))`, through
    /// `check_options` and `from_config` alike.
    fn check(json: &str, expected: Result<(), (&str, &str)>) {
        let checked = Rloo::check_options(json);
        let created = Rloo::from_config(json).map(|_| OptionsReport::default()).map_err(OptionError::from);
        rlvr_plugin_api::options::assert_answers(json, [checked, created], expected);
    }

    #[test]
    fn options_are_checked_naming_the_key() {
        check("{}", Ok(()));
        check(r#"{"normalize_advantages": true}"#, Ok(()));
        check(
            r#"{"normalise_advantages": true}"#,
            Err((
                "normalise_advantages",
                "unknown key; expected one of kl_beta, kl_estimator, clip_eps, normalize_advantages, loss_agg, \
                 overlong_buffer, overlong_penalty, entropy_coef",
            )),
        );
        check(r#"{"clip_eps": 1.5}"#, Err(("clip_eps", "expected a number in (0, 1), got 1.5")));
        check(r#"{"overlong_buffer": 4, "overlong_penalty": 0.5, "entropy_coef": 0.01}"#, Ok(()));
        check(r#"{"entropy_coef": -1}"#, Err(("entropy_coef", "expected a number ≥ 0, got -1")));
    }

    #[test]
    fn self_test_passes() {
        Rloo::self_test().unwrap();
    }

    #[test]
    fn a_group_of_one_has_no_baseline_and_no_advantage() {
        assert_eq!(leave_one_out(&[5.0, 1.0, 3.0], &[0..1, 1..3]), [0.0, -2.0, 2.0]);
    }
}
