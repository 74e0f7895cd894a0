//! `grpo`: Group Relative Policy Optimization (DeepSeekMath, arXiv:2402.03300), with the DAPO
//! (arXiv:2503.14476) and Dr. GRPO (arXiv:2503.20783) variants as options.
//!
//! Advantages: each completion's reward against its group, `A_i = (r_i − mean_g) / (std + eps)`,
//! the std over the group, over the batch or not at all (`scale_rewards`), repeated over the
//! completion's tokens. Loss: the clipped surrogate with separate low/high clip ranges, plus
//! `β·k(logp, ref)` per token unless the KL is folded into the reward (`kl_in`), aggregated
//! by `loss_agg`. Options add GSPO's sequence-level ratio (`importance_ratio`), CISPO's clipped,
//! detached importance weights (`loss`), the dual clip (`clip_ratio_c`), DAPO's soft overlong
//! punishment (`overlong_buffer`, `overlong_penalty`) and an entropy bonus (`entropy_coef`). The
//! formulas, with their sources, are in the README.

use rlvr_optimizer_common::config;
use rlvr_optimizer_common::inputs::Like;
use rlvr_optimizer_common::losses::{
    ClippedPolicy, ImportanceRatio, KlEstimator, LossAgg, PolicyLoss, Surrogate, check_dual_clip,
    check_scale, entropy_bonus,
};
use rlvr_optimizer_common::rewards::{self, OnlineBatch, OverlongShaping, StdKind};
use rlvr_optimizer_common::{advantage_output, expect_all_close, expect_close, loss_output, metric};
use rlvr_plugin_api::{
    AdvantageInputs, AdvantageOutput, DataMode, HostContext, LossInputs, LossOutput, LossScale, Metadata,
    OptimizerInfo, OptimizerPlugin, OptionError, OptionsReport, PluginError, ROption, TensorHandle,
    export_optimizer,
};
use rlvr_plugin_tensor::TensorHandleExt;
use serde::Deserialize;
use tch::{Device, Kind, Tensor};

/// What the reward is divided by after the group mean is subtracted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ScaleRewards {
    /// The group's std (GRPO).
    Group,
    /// The std of the whole batch's rewards.
    Batch,
    /// Nothing: `A = r − mean_g` (Dr. GRPO).
    None,
}

/// Where the KL to the reference goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum KlIn {
    /// `+ β·k(logp, ref)` on every token of the loss (GRPO).
    Loss,
    /// `r_i − β·Σ_t k(old, ref)` before the advantage; no KL term in the loss.
    Reward,
}

/// The plugin's keys of the job's `[optimizer]` table.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct GrpoConfig {
    /// What the centred reward is divided by.
    pub scale_rewards: ScaleRewards,
    /// The std convention of `scale_rewards`.
    pub std: StdKind,
    /// Added to the std before dividing.
    pub eps: f64,
    /// Lower clip range: ρ is clipped at `1 − clip_eps_low`.
    pub clip_eps_low: f64,
    /// Upper clip range: ρ is clipped at `1 + clip_eps_high`; `clip_eps_low` when unset.
    pub clip_eps_high: Option<f64>,
    /// Weight β of the KL to the reference.
    pub kl_beta: f64,
    /// Which estimator of the KL.
    pub kl_estimator: KlEstimator,
    /// Whether the KL is a loss term or a reward penalty.
    pub kl_in: KlIn,
    /// How per-token losses are aggregated.
    pub loss_agg: LossAgg,
    /// The policy loss: PPO's clipped surrogate or CISPO.
    pub loss: PolicyLoss,
    /// Where the ratio is taken: per token, or per sequence (GSPO).
    pub importance_ratio: ImportanceRatio,
    /// Dual-clip's bound `c > 1` on the loss of negative advantages; unset: off.
    pub clip_ratio_c: Option<f64>,
    /// DAPO's overlong buffer `L_cache`, in tokens; unset: no length shaping.
    pub overlong_buffer: Option<u32>,
    /// The factor of DAPO's length penalty; 1 when unset.
    pub overlong_penalty: Option<f64>,
    /// Weight of the entropy bonus `−entropy_coef·Ĥ` in the loss.
    pub entropy_coef: f64,
}

impl Default for GrpoConfig {
    fn default() -> Self {
        GrpoConfig {
            scale_rewards: ScaleRewards::Group,
            std: StdKind::Sample,
            eps: 1e-4,
            clip_eps_low: 0.2,
            clip_eps_high: None,
            kl_beta: 0.04,
            kl_estimator: KlEstimator::K3,
            kl_in: KlIn::Loss,
            loss_agg: LossAgg::SeqMeanTokenMean,
            loss: PolicyLoss::PpoClip,
            importance_ratio: ImportanceRatio::Token,
            clip_ratio_c: None,
            overlong_buffer: None,
            overlong_penalty: None,
            entropy_coef: 0.0,
        }
    }
}

/// The GRPO optimizer.
#[derive(Debug, Clone)]
pub struct Grpo {
    config: GrpoConfig,
    surrogate: Surrogate,
    overlong: Option<OverlongShaping>,
    /// The job's `max_new_tokens` (DAPO's `L_max`), from the host context at creation.
    max_new_tokens: Option<u32>,
}

impl Grpo {
    /// An optimizer with `config`, its ranges checked.
    pub fn new(config: GrpoConfig) -> Result<Self, PluginError> {
        config::positive("eps", config.eps)?;
        config::open_unit("clip_eps_low", config.clip_eps_low)?;
        let clip_eps_high = config.clip_eps_high.unwrap_or(config.clip_eps_low);
        // Clip-higher (DAPO) never clips the upper side tighter; CISPO does on purpose: its
        // weights keep a wide lower range (MiniMax-M1 leaves it out of play) and a tuned upper one.
        let ok = match config.loss {
            PolicyLoss::PpoClip => clip_eps_high >= config.clip_eps_low,
            PolicyLoss::Cispo => clip_eps_high > 0.0,
        };
        let expected = match config.loss {
            PolicyLoss::PpoClip => format!("a number ≥ clip_eps_low ({})", config.clip_eps_low),
            PolicyLoss::Cispo => "a number > 0".to_owned(),
        };
        config::require("clip_eps_high", clip_eps_high, ok, expected)?;
        config::non_negative("kl_beta", config.kl_beta)?;
        check_dual_clip(config.clip_ratio_c)?;
        config::non_negative("entropy_coef", config.entropy_coef)?;
        let surrogate = Surrogate {
            loss: config.loss,
            ratio: config.importance_ratio,
            low: config.clip_eps_low,
            high: clip_eps_high,
            dual_clip: config.clip_ratio_c,
        };
        surrogate.check()?;
        let overlong = OverlongShaping::from_keys(config.overlong_buffer, config.overlong_penalty)?;
        Ok(Grpo { config, surrogate, overlong, max_new_tokens: None })
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
        if self.config.kl_in == KlIn::Reward {
            let required = (self.config.kl_beta > 0.0).then_some("kl_in = \"reward\" with kl_beta > 0");
            if let Some(reference) = batch.reference(inputs, required)? {
                let penalty = batch.kl_penalty(self.config.kl_estimator, self.config.kl_beta, &reference)?;
                penalty.apply(&mut shaped);
                metrics.extend(penalty.metrics);
            }
        }
        let advantages = self.group_advantages(&shaped, &groups);
        Ok(advantage_output(batch.mask.repeat_rows(&advantages), None, metrics))
    }

    /// Per-completion advantages from (possibly KL-penalised) rewards and the batch's groups.
    fn group_advantages(&self, rewards: &[f64], groups: &[std::ops::Range<usize>]) -> Vec<f64> {
        let batch_std = rewards::std(rewards, self.config.std);
        let mut advantages = vec![0.0; rewards.len()];
        for group in groups {
            let values = &rewards[group.start..group.end];
            let mean = rewards::mean(values);
            let denominator = match self.config.scale_rewards {
                ScaleRewards::Group => rewards::std(values, self.config.std) + self.config.eps,
                ScaleRewards::Batch => batch_std + self.config.eps,
                ScaleRewards::None => 1.0,
            };
            for row in group.clone() {
                advantages[row] = (rewards[row] - mean) / denominator;
            }
        }
        advantages
    }
}

impl OptimizerPlugin for Grpo {
    fn metadata() -> Metadata {
        Metadata {
            name: "grpo",
            version: env!("CARGO_PKG_VERSION"),
            description: "GRPO with group/batch/no reward scaling, low/high clipping, KL k1/k2/k3 in the loss or the reward (DAPO, Dr. GRPO by options)",
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
        Grpo::new(config::parse(config_json)?)
    }

    /// The job's `max_new_tokens` comes with the host's context (a host that does not give it
    /// leaves overlong shaping refused at the first advantages).
    fn from_config_in(config_json: &str, host: &HostContext) -> Result<Self, PluginError> {
        Ok(Grpo { max_new_tokens: host.max_new_tokens, ..Self::from_config(config_json)? })
    }

    fn check_options(config_json: &str) -> Result<OptionsReport, OptionError> {
        Grpo::new(config::parse(config_json)?)?;
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
        let kl_in_loss = self.config.kl_in == KlIn::Loss && self.config.kl_beta > 0.0;
        let required = kl_in_loss.then_some("kl_in = \"loss\" with kl_beta > 0");
        let reference = like.needed("ref_logprobs", inputs.ref_logprobs, required)?;
        let logprobs = mask.clean(&logprobs);

        let policy = ClippedPolicy::new(&logprobs, &old, &advantages, &mask, self.surrogate);
        let mut metrics = policy.metrics(&mask);
        let (bonus, entropy) = entropy_bonus(&logprobs, &old, &mask, self.config.entropy_coef);
        metrics.push(entropy);
        let kl =
            reference.map(|reference| self.config.kl_estimator.per_token(&logprobs, &mask.clean(&reference)));
        if let Some(kl) = &kl {
            metrics.push(metric("kl", mask.mean(kl)));
        }
        let mut per_token = match kl {
            Some(kl) if kl_in_loss => policy.loss + kl * self.config.kl_beta,
            _ => policy.loss,
        };
        if let Some(bonus) = bonus {
            per_token += bonus;
        }
        let loss = self.config.loss_agg.aggregate(&per_token, &mask, &inputs.scale)?;
        Ok(loss_output(loss, metrics))
    }

    /// One group of two, rewards 1 and 0, defaults: `A = ±0.5 / (√0.5 + 1e-4)`; at ρ = 1 and
    /// logp = ref the loss is 0 and its gradient `−A_i / 2`.
    fn self_test() -> Result<(), PluginError> {
        let grpo = Grpo::from_config("{}")?;
        let options = (Kind::Double, Device::Cpu);
        let old = Tensor::from_slice(&[-1.0f64, -2.0]).reshape([2, 1]);
        let mask = Tensor::ones([2, 1], options);
        let output = grpo.advantages(&AdvantageInputs {
            rewards: [1.0, 0.0][..].into(),
            group_ids: [7, 7][..].into(),
            old_logprobs: TensorHandle::borrow(&old),
            ref_logprobs: ROption::RSome(TensorHandle::borrow(&old)),
            mask: TensorHandle::borrow(&mask),
            values: ROption::RNone,
        })?;
        // SAFETY: the handle was given to us by `advantages` and is taken back once.
        let advantages = unsafe { output.advantages.into_tensor() };
        let a = 0.5 / (0.5f64.sqrt() + 1e-4);
        expect_all_close("advantages", &advantages, &[a, -a])?;

        let logprobs = old.copy().set_requires_grad(true);
        let output = grpo.loss(&LossInputs {
            logprobs: TensorHandle::borrow(&logprobs),
            mask: TensorHandle::borrow(&mask),
            old_logprobs: ROption::RSome(TensorHandle::borrow(&old)),
            ref_logprobs: ROption::RSome(TensorHandle::borrow(&old)),
            advantages: ROption::RSome(TensorHandle::borrow(&advantages)),
            values: ROption::RNone,
            old_values: ROption::RNone,
            returns: ROption::RNone,
            scale: LossScale { batch_sequences: 2, batch_tokens: 2, max_new_tokens: 1 },
        })?;
        // SAFETY: as above.
        let loss = unsafe { output.loss.into_tensor() };
        loss.backward();
        expect_close("loss", loss.double_value(&[]), 0.0)?;
        expect_all_close("gradient", &logprobs.grad(), &[-a / 2.0, a / 2.0])
    }
}

export_optimizer!(Grpo);

#[cfg(test)]
mod tests {
    use super::*;

    /// Options → `Ok(())` (accepted, nothing to report) or `Err((key, message))`, through
    /// `check_options` and `from_config` alike.
    fn check(json: &str, expected: Result<(), (&str, &str)>) {
        let checked = Grpo::check_options(json);
        let created = Grpo::from_config(json).map(|_| OptionsReport::default()).map_err(OptionError::from);
        rlvr_plugin_api::options::assert_answers(json, [checked, created], expected);
    }

    #[test]
    fn options_are_checked_naming_the_key() {
        check("{}", Ok(()));
        check(r#"{"kl_beta": 0, "clip_eps_high": 0.28, "loss_agg": "token-mean"}"#, Ok(()));
        // regression: `kl_bta` passed submit and failed after the job started
        check(
            r#"{"kl_bta": 0.1}"#,
            Err((
                "kl_bta",
                "unknown key; expected one of scale_rewards, std, eps, clip_eps_low, clip_eps_high, kl_beta, \
                 kl_estimator, kl_in, loss_agg, loss, importance_ratio, clip_ratio_c, overlong_buffer, \
                 overlong_penalty, entropy_coef",
            )),
        );
        check(r#"{"kl_estimator": "k4"}"#, Err(("kl_estimator", "expected one of k1, k2, k3, got \"k4\"")));
        check(
            r#"{"clip_eps_high": 0.1}"#,
            Err(("clip_eps_high", "expected a number ≥ clip_eps_low (0.2), got 0.1")),
        );
        check(r#"{"kl_beta": -1}"#, Err(("kl_beta", "expected a number ≥ 0, got -1")));
        check(r#"{"importance_ratio": "sequence", "clip_eps_low": 3e-4, "clip_eps_high": 4e-4}"#, Ok(()));
        check(
            r#"{"importance_ratio": "seq"}"#,
            Err(("importance_ratio", "expected one of token, sequence, got \"seq\"")),
        );
        check(r#"{"loss": "cispo", "clip_eps_high": 4.0, "loss_agg": "token-mean"}"#, Ok(()));
        check(r#"{"loss": "cispo", "clip_eps_low": 0.9, "clip_eps_high": 0.28}"#, Ok(()));
        check(
            r#"{"loss": "cispo", "clip_eps_high": 0}"#,
            Err(("clip_eps_high", "expected a number > 0, got 0")),
        );
        check(r#"{"loss": "grpo"}"#, Err(("loss", "expected one of ppo-clip, cispo, got \"grpo\"")));
        check(
            r#"{"loss": "cispo", "importance_ratio": "sequence"}"#,
            Err((
                "importance_ratio",
                "\"sequence\" applies to loss = \"ppo-clip\" only, got loss = \"cispo\"",
            )),
        );
        check(
            r#"{"loss": "cispo", "clip_ratio_c": 3}"#,
            Err(("clip_ratio_c", "applies to loss = \"ppo-clip\" only, got loss = \"cispo\"")),
        );
        check(r#"{"clip_ratio_c": 3}"#, Ok(()));
        check(r#"{"clip_ratio_c": 1}"#, Err(("clip_ratio_c", "expected a number > 1, got 1")));
        check(r#"{"overlong_buffer": 256, "overlong_penalty": 0.5}"#, Ok(()));
        check(r#"{"overlong_buffer": -1}"#, Err(("overlong_buffer", "expected u32, got integer `-1`")));
        check(
            r#"{"overlong_buffer": 0}"#,
            Err(("overlong_buffer", "expected a number of tokens ≥ 1, got 0")),
        );
        check(
            r#"{"overlong_penalty": 1}"#,
            Err((
                "overlong_penalty",
                "needs overlong_buffer (the length of the soft penalty's ramp, in tokens)",
            )),
        );
        check(r#"{"entropy_coef": 0.001}"#, Ok(()));
        check(r#"{"entropy_coef": -0.001}"#, Err(("entropy_coef", "expected a number ≥ 0, got -0.001")));
    }

    #[test]
    fn self_test_passes() {
        Grpo::self_test().unwrap();
    }

    #[test]
    fn clip_eps_high_defaults_to_clip_eps_low_and_may_not_be_below_it() {
        let grpo = Grpo::from_config(r#"{"clip_eps_low": 0.1}"#).unwrap();
        assert_eq!(grpo.surrogate.high, 0.1);
        let error = Grpo::from_config(r#"{"clip_eps_high": 0.1}"#).unwrap_err();
        assert_eq!(error.message, "clip_eps_high: expected a number ≥ clip_eps_low (0.2), got 0.1");
    }
}
