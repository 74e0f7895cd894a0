//! `ppo`: Proximal Policy Optimization with a value head (Schulman et al., arXiv:1707.06347),
//! generalized advantage estimation (Schulman et al., arXiv:1506.02438), and the per-token KL
//! penalty of InstructGPT (Ouyang et al., arXiv:2203.02155).
//!
//! Per-token reward: `−β·k(old, ref)` on every completion token, plus the verifiers' reward on
//! the last one. GAE runs backwards over each row's completion tokens, with the value after the
//! last token 0; returns are `A + V_old`; advantages are then whitened over the batch. The loss
//! is the clipped policy loss plus `vf_coef` times the clipped value loss, both token means. The
//! formulas, with their sources, are in the README. Options add the dual clip (`clip_ratio_c`),
//! DAPO's soft overlong punishment on the verifiers' reward (`overlong_buffer`,
//! `overlong_penalty`) and an entropy bonus (`entropy_coef`).

use rlvr_optimizer_common::config;
use rlvr_optimizer_common::inputs::Like;
use rlvr_optimizer_common::losses::{
    ClippedPolicy, KlEstimator, LossAgg, Surrogate, check_dual_clip, check_scale, entropy_bonus,
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

/// Added to the std when whitening advantages.
const WHITEN_EPS: f64 = 1e-8;

/// The plugin's keys of the job's `[optimizer]` table.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PpoConfig {
    /// Discount γ.
    pub gamma: f64,
    /// GAE's λ.
    pub lam: f64,
    /// Clip range ε of the policy ratio, both sides.
    pub clip_eps: f64,
    /// How far the value may move from its sampling-time value before its loss is clipped.
    pub vf_clip: f64,
    /// Weight of the value loss.
    pub vf_coef: f64,
    /// Weight β of the per-token KL penalty in the reward.
    pub kl_beta: f64,
    /// Which estimator of the KL.
    pub kl_estimator: KlEstimator,
    /// Whether advantages are whitened over the batch's completion tokens.
    pub whiten_advantages: bool,
    /// Dual-clip's bound `c > 1` on the loss of negative advantages; unset: off.
    pub clip_ratio_c: Option<f64>,
    /// DAPO's overlong buffer `L_cache`, in tokens; unset: no length shaping.
    pub overlong_buffer: Option<u32>,
    /// The factor of DAPO's length penalty; 1 when unset.
    pub overlong_penalty: Option<f64>,
    /// Weight of the entropy bonus `−entropy_coef·Ĥ` in the loss.
    pub entropy_coef: f64,
}

impl Default for PpoConfig {
    fn default() -> Self {
        PpoConfig {
            gamma: 1.0,
            lam: 0.95,
            clip_eps: 0.2,
            vf_clip: 0.2,
            vf_coef: 0.1,
            kl_beta: 0.05,
            kl_estimator: KlEstimator::K1,
            whiten_advantages: true,
            clip_ratio_c: None,
            overlong_buffer: None,
            overlong_penalty: None,
            entropy_coef: 0.0,
        }
    }
}

/// The PPO optimizer.
#[derive(Debug, Clone)]
pub struct Ppo {
    config: PpoConfig,
    overlong: Option<OverlongShaping>,
    /// The job's `max_new_tokens` (DAPO's `L_max`), from the host context at creation.
    max_new_tokens: Option<u32>,
}

impl Ppo {
    /// An optimizer with `config`, its ranges checked.
    pub fn new(config: PpoConfig) -> Result<Self, PluginError> {
        config::unit("gamma", config.gamma)?;
        config::unit("lam", config.lam)?;
        config::open_unit("clip_eps", config.clip_eps)?;
        config::positive("vf_clip", config.vf_clip)?;
        config::non_negative("vf_coef", config.vf_coef)?;
        config::non_negative("kl_beta", config.kl_beta)?;
        check_dual_clip(config.clip_ratio_c)?;
        config::non_negative("entropy_coef", config.entropy_coef)?;
        let overlong = OverlongShaping::from_keys(config.overlong_buffer, config.overlong_penalty)?;
        Ok(Ppo { config, overlong, max_new_tokens: None })
    }

    /// Advantages and returns; DAPO's `L_max` is the job's `max_new_tokens` from the host context.
    fn batch_advantages(&self, inputs: &AdvantageInputs<'_>) -> Result<AdvantageOutput, PluginError> {
        let batch = OnlineBatch::new(inputs)?;
        batch.mask.contiguous("PPO's rewards and GAE are by position over columns 0..len; train multi-turn episodes with GRPO or RLOO")?;
        let values = batch.like.required("values", inputs.values, "GAE needs the value head's outputs")?;
        let values = batch.mask.to_host(&values)?;
        let cols = batch.like.cols();
        let mut token_rewards = vec![0.0; values.len()];
        let mut metrics = Vec::new();
        let mut sequence_rewards = batch.rewards.clone();
        if let Some(overlong) = &self.overlong {
            metrics.extend(overlong.apply(
                &mut sequence_rewards,
                batch.mask.lengths(),
                self.max_new_tokens,
            )?);
        }
        let required = (self.config.kl_beta > 0.0).then_some("the per-token KL penalty, kl_beta > 0");
        if let Some(reference) = batch.reference(inputs, required)? {
            let penalty = batch.kl_penalty(self.config.kl_estimator, self.config.kl_beta, &reference)?;
            for (reward, penalty) in token_rewards.iter_mut().zip(batch.mask.to_host(&penalty.per_token)?) {
                *reward = -penalty;
            }
            metrics.extend(penalty.metrics);
        }
        for (row, &length) in batch.mask.lengths().iter().enumerate() {
            if length > 0 {
                token_rewards[row * cols + length - 1] += sequence_rewards[row];
            }
        }
        let (mut advantages, returns) = self.gae(&token_rewards, &values, batch.mask.lengths(), cols);
        if self.config.whiten_advantages {
            let on_tokens: Vec<usize> = batch
                .mask
                .lengths()
                .iter()
                .enumerate()
                .flat_map(|(row, &length)| (0..length).map(move |t| row * cols + t))
                .collect();
            let mut whitened: Vec<f64> = on_tokens.iter().map(|&at| advantages[at]).collect();
            rewards::whiten(&mut whitened, WHITEN_EPS);
            for (at, value) in on_tokens.into_iter().zip(whitened) {
                advantages[at] = value;
            }
        }
        let advantages = batch.mask.from_host(&advantages);
        Ok(advantage_output(advantages, Some(batch.mask.from_host(&returns)), metrics))
    }

    /// GAE over each row's first `length` tokens of row-major `[B, T]` host values: returns
    /// `(advantages, returns)`, 0 on padding.
    fn gae(&self, rewards: &[f64], values: &[f64], lengths: &[usize], cols: usize) -> (Vec<f64>, Vec<f64>) {
        let (gamma, lam) = (self.config.gamma, self.config.lam);
        let mut advantages = vec![0.0; values.len()];
        let mut returns = vec![0.0; values.len()];
        for (row, &length) in lengths.iter().enumerate() {
            let at = |t: usize| row * cols + t;
            let mut running = 0.0;
            for t in (0..length).rev() {
                let next_value = if t + 1 < length { values[at(t + 1)] } else { 0.0 };
                let delta = rewards[at(t)] + gamma * next_value - values[at(t)];
                running = delta + gamma * lam * running;
                advantages[at(t)] = running;
                returns[at(t)] = running + values[at(t)];
            }
        }
        (advantages, returns)
    }
}

impl OptimizerPlugin for Ppo {
    fn metadata() -> Metadata {
        Metadata {
            name: "ppo",
            version: env!("CARGO_PKG_VERSION"),
            description: "PPO with a value head: per-token KL penalty, GAE(γ, λ), whitened advantages, clipped policy and value losses",
        }
    }

    fn requirements() -> OptimizerInfo {
        OptimizerInfo {
            data_mode: DataMode::OnlineWithCritic,
            needs_reference: true,
            needs_value_head: true,
            needs_groups: false,
            libtorch_version: "filled in by the export layer".into(),
        }
    }

    fn from_config(config_json: &str) -> Result<Self, PluginError> {
        Ppo::new(config::parse(config_json)?)
    }

    /// The job's `max_new_tokens` comes with the host's context (a host that does not give it
    /// leaves overlong shaping refused at the first advantages).
    fn from_config_in(config_json: &str, host: &HostContext) -> Result<Self, PluginError> {
        Ok(Ppo { max_new_tokens: host.max_new_tokens, ..Self::from_config(config_json)? })
    }

    fn check_options(config_json: &str) -> Result<OptionsReport, OptionError> {
        Ppo::new(config::parse(config_json)?)?;
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
        let tensor = |name: &str, handle, why: &str| {
            Ok::<_, PluginError>(mask.clean(&like.required(name, handle, why)?))
        };
        let old = tensor("old_logprobs", inputs.old_logprobs, "the policy ratio")?;
        let advantages = tensor("advantages", inputs.advantages, "the policy loss")?;
        let values = tensor("values", inputs.values, "the value loss")?;
        let old_values = tensor("old_values", inputs.old_values, "value clipping")?;
        let returns = tensor("returns", inputs.returns, "the value loss's target")?;
        let reference = like.optional("ref_logprobs", inputs.ref_logprobs)?;
        let logprobs = mask.clean(&logprobs);

        let surrogate =
            Surrogate { dual_clip: self.config.clip_ratio_c, ..Surrogate::ppo(self.config.clip_eps) };
        let policy = ClippedPolicy::new(&logprobs, &old, &advantages, &mask, surrogate);
        let (bonus, entropy) = entropy_bonus(&logprobs, &old, &mask, self.config.entropy_coef);
        let clip = self.config.vf_clip;
        // clamp with tensor bounds leaves a value inside the band exactly as it is, so the two
        // errors tie there and `value_clip_frac` counts only tokens the clip changed.
        let clipped_values = values.clamp_tensor(Some(&old_values - clip), Some(&old_values + clip));
        let unclipped_error = (&values - &returns).square();
        let clipped_error = (clipped_values - &returns).square();
        let value_loss = unclipped_error.maximum(&clipped_error) * 0.5;

        let mut metrics = policy.metrics(&mask);
        metrics.push(metric("pg_loss", mask.mean(&policy.loss)));
        metrics.push(metric("vf_loss", mask.mean(&value_loss)));
        metrics.push(metric("value_clip_frac", mask.fraction(&clipped_error.gt_tensor(&unclipped_error))));
        metrics.push(entropy);
        if let Some(reference) = reference {
            let kl = self.config.kl_estimator.per_token(&logprobs, &mask.clean(&reference));
            metrics.push(metric("kl", mask.mean(&kl)));
        }
        let per_token = match bonus {
            Some(bonus) => policy.loss + bonus,
            None => policy.loss,
        };
        let policy_loss = LossAgg::TokenMean.aggregate(&per_token, &mask, &inputs.scale)?;
        let value_loss = LossAgg::TokenMean.aggregate(&value_loss, &mask, &inputs.scale)?;
        Ok(loss_output(policy_loss + value_loss * self.config.vf_coef, metrics))
    }

    /// One row of two tokens, reward 1, `V_old = (0.5, 0.5)`, no KL (ref = old), defaults:
    /// `δ = (0, 0.5)`, `A = (0.475, 0.5)`, returns `(0.975, 1)`, whitened `A = ∓0.0125 / (0.0125 +
    /// 1e-8)`. At ρ = 1 the policy loss is 0 with gradient `−A_t / 2`; at V = returns the value
    /// moved further than `vf_clip` from V_old, so the clipped error `(0.7 − R)²` wins the max:
    /// the loss is `0.1 · ½ · (0.275² + 0.3²) / 2` and flat in V.
    fn self_test() -> Result<(), PluginError> {
        let ppo = Ppo::from_config("{}")?;
        let options = (Kind::Double, Device::Cpu);
        let old = Tensor::from_slice(&[-1.0f64, -2.0]).reshape([1, 2]);
        let mask = Tensor::ones([1, 2], options);
        let old_values = Tensor::from_slice(&[0.5f64, 0.5]).reshape([1, 2]);
        let output = ppo.advantages(&AdvantageInputs {
            rewards: [1.0][..].into(),
            group_ids: [0][..].into(),
            old_logprobs: TensorHandle::borrow(&old),
            ref_logprobs: ROption::RSome(TensorHandle::borrow(&old)),
            mask: TensorHandle::borrow(&mask),
            values: ROption::RSome(TensorHandle::borrow(&old_values)),
        })?;
        // SAFETY: the handles were given to us by `advantages` and are taken back once.
        let (advantages, returns) = unsafe {
            let returns =
                output.returns.into_option().ok_or_else(|| PluginError::self_test_failed("no returns"))?;
            (output.advantages.into_tensor(), returns.into_tensor())
        };
        expect_all_close("returns", &returns, &[0.975, 1.0])?;
        let a = 0.0125 / (0.0125 + WHITEN_EPS);
        expect_all_close("advantages", &advantages, &[-a, a])?;

        let logprobs = old.copy().set_requires_grad(true);
        let values = returns.copy().set_requires_grad(true);
        let output = ppo.loss(&LossInputs {
            logprobs: TensorHandle::borrow(&logprobs),
            mask: TensorHandle::borrow(&mask),
            old_logprobs: ROption::RSome(TensorHandle::borrow(&old)),
            ref_logprobs: ROption::RSome(TensorHandle::borrow(&old)),
            advantages: ROption::RSome(TensorHandle::borrow(&advantages)),
            values: ROption::RSome(TensorHandle::borrow(&values)),
            old_values: ROption::RSome(TensorHandle::borrow(&old_values)),
            returns: ROption::RSome(TensorHandle::borrow(&returns)),
            scale: LossScale { batch_sequences: 1, batch_tokens: 2, max_new_tokens: 2 },
        })?;
        // SAFETY: as above.
        let loss = unsafe { output.loss.into_tensor() };
        loss.backward();
        expect_close("loss", loss.double_value(&[]), 0.1 * 0.5 * (0.275f64.powi(2) + 0.3f64.powi(2)) / 2.0)?;
        expect_all_close("gradient", &logprobs.grad(), &[a / 2.0, -a / 2.0])?;
        expect_all_close("value gradient", &values.grad(), &[0.0, 0.0])
    }
}

export_optimizer!(Ppo);

#[cfg(test)]
mod tests {
    use super::*;

    /// Options → `Ok(())` (accepted, nothing to report) or `Err((key, message))`, through
    /// `check_options` and `from_config` alike.
    fn check(json: &str, expected: Result<(), (&str, &str)>) {
        let checked = Ppo::check_options(json);
        let created = Ppo::from_config(json).map(|_| OptionsReport::default()).map_err(OptionError::from);
        rlvr_plugin_api::options::assert_answers(json, [checked, created], expected);
    }

    #[test]
    fn options_are_checked_naming_the_key() {
        check("{}", Ok(()));
        check(r#"{"gamma": 0.99, "lam": 0.95}"#, Ok(()));
        check(
            r#"{"lambda": 0.9}"#,
            Err((
                "lambda",
                "unknown key; expected one of gamma, lam, clip_eps, vf_clip, vf_coef, kl_beta, kl_estimator, \
                 whiten_advantages, clip_ratio_c, overlong_buffer, overlong_penalty, entropy_coef",
            )),
        );
        check(r#"{"lam": 2}"#, Err(("lam", "expected a number in [0, 1], got 2")));
        check(r#"{"clip_ratio_c": 3, "overlong_buffer": 4, "entropy_coef": 0.01}"#, Ok(()));
        check(r#"{"clip_ratio_c": 0.5}"#, Err(("clip_ratio_c", "expected a number > 1, got 0.5")));
        check(r#"{"entropy_coef": -1}"#, Err(("entropy_coef", "expected a number ≥ 0, got -1")));
        check(
            r#"{"overlong_buffer": 0}"#,
            Err(("overlong_buffer", "expected a number of tokens ≥ 1, got 0")),
        );
    }

    #[test]
    fn self_test_passes() {
        Ppo::self_test().unwrap();
    }

    #[test]
    fn gae_stops_at_each_rows_last_token() {
        let ppo = Ppo::new(PpoConfig { gamma: 0.5, lam: 1.0, ..PpoConfig::default() }).unwrap();
        // Row 0: two tokens, reward 1 on the last; row 1: no tokens.
        let (advantages, returns) = ppo.gae(&[0.0, 1.0, 9.0, 9.0, 9.0, 9.0], &[0.0; 6], &[2, 0], 3);
        assert_eq!(advantages, [0.5, 1.0, 0.0, 0.0, 0.0, 0.0]);
        assert_eq!(returns, advantages);
    }
}
