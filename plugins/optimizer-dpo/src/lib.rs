//! `dpo`: Direct Preference Optimization (Rafailov et al., arXiv:2305.18290), with the label
//! smoothing of conservative DPO (Mitchell, "A note on DPO with noisy preferences", 2023).
//!
//! Rows come in pairs: row `2i` is pair `i`'s chosen completion, row `2i + 1` its rejected one.
//! With sequence log-probabilities `π = Σ_t mask·logp` and the reference's `ref`,
//! `h = (π_c − ref_c) − (π_r − ref_r)` and each pair's loss is
//! `−(1 − ls)·log σ(βh) − ls·log σ(−βh)`; a micro-batch's loss is the sum over its pairs divided
//! by the batch's pairs. The formulas, with their sources, are in the README.

use rlvr_optimizer_common::config;
use rlvr_optimizer_common::inputs::Like;
use rlvr_optimizer_common::losses::check_scale;
use rlvr_optimizer_common::{expect_all_close, expect_close, loss_output, metric};
use rlvr_plugin_api::{
    DataMode, LossInputs, LossOutput, LossScale, Metadata, OptimizerInfo, OptimizerPlugin, OptionError,
    OptionsReport, PluginError, ROption, TensorHandle, export_optimizer,
};
use rlvr_plugin_tensor::TensorHandleExt;
use serde::Deserialize;
use tch::{Device, Kind, Tensor};

/// The plugin's keys of the job's `[optimizer]` table.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DpoConfig {
    /// β: the strength of the implicit KL constraint to the reference.
    pub beta: f64,
    /// The assumed probability that a pair's labels are flipped (cDPO); 0 is plain DPO.
    pub label_smoothing: f64,
}

impl Default for DpoConfig {
    fn default() -> Self {
        DpoConfig { beta: 0.1, label_smoothing: 0.0 }
    }
}

/// The DPO optimizer.
#[derive(Debug, Clone)]
pub struct Dpo {
    config: DpoConfig,
}

impl Dpo {
    /// An optimizer with `config`, its ranges checked.
    pub fn new(config: DpoConfig) -> Result<Self, PluginError> {
        config::positive("beta", config.beta)?;
        let smoothing = config.label_smoothing;
        // At 0.5 the labels carry no information; above it they would be believed backwards.
        config::require(
            "label_smoothing",
            smoothing,
            (0.0..0.5).contains(&smoothing),
            "a number in [0, 0.5)",
        )?;
        Ok(Dpo { config })
    }
}

impl OptimizerPlugin for Dpo {
    fn metadata() -> Metadata {
        Metadata {
            name: "dpo",
            version: env!("CARGO_PKG_VERSION"),
            description: "DPO on offline preference pairs against a frozen reference, with cDPO label smoothing",
        }
    }

    fn requirements() -> OptimizerInfo {
        OptimizerInfo {
            data_mode: DataMode::OfflinePairs,
            needs_reference: true,
            needs_value_head: false,
            needs_groups: false,
            libtorch_version: "filled in by the export layer".into(),
        }
    }

    fn from_config(config_json: &str) -> Result<Self, PluginError> {
        Dpo::new(config::parse(config_json)?)
    }

    fn check_options(config_json: &str) -> Result<OptionsReport, OptionError> {
        Dpo::new(config::parse(config_json)?)?;
        Ok(OptionsReport::default())
    }

    fn loss(&self, inputs: &LossInputs) -> Result<LossOutput, PluginError> {
        let (like, logprobs) = Like::first("logprobs", inputs.logprobs)?;
        if like.rows() % 2 != 0 {
            return Err(PluginError::invalid_input(format!(
                "logprobs: expected pairs of rows (2i chosen, 2i + 1 rejected), got {} rows",
                like.rows()
            )));
        }
        let mask = like.mask(inputs.mask)?;
        check_scale(&inputs.scale, &mask)?;
        if inputs.scale.batch_sequences % 2 != 0 {
            return Err(PluginError::invalid_input(format!(
                "scale.batch_sequences: expected an even number (a pair is two rows), got {}",
                inputs.scale.batch_sequences
            )));
        }
        let reference = like.required("ref_logprobs", inputs.ref_logprobs, "the reference log-ratios")?;

        let (beta, smoothing) = (self.config.beta, self.config.label_smoothing);
        let log_ratios = (mask.row_sums(&logprobs) - mask.row_sums(&reference)).reshape([-1, 2]);
        let (chosen, rejected) = (log_ratios.select(1, 0), log_ratios.select(1, 1));
        let margin = (&chosen - &rejected) * beta;
        let per_pair = -(margin.log_sigmoid() * (1.0 - smoothing)) - (-&margin).log_sigmoid() * smoothing;
        let pairs = (inputs.scale.batch_sequences / 2) as f64;
        let loss = per_pair.sum(like.kind()) / pairs;

        let mean = |x: &Tensor| x.detach().mean(Kind::Double).double_value(&[]);
        let metrics = vec![
            metric("reward_accuracy", mean(&chosen.gt_tensor(&rejected))),
            metric("reward_margin", mean(&margin)),
            metric("chosen_reward", mean(&(&chosen * beta))),
            metric("rejected_reward", mean(&(&rejected * beta))),
        ];
        Ok(loss_output(loss, metrics))
    }

    /// One pair of one token each, logp −1 (chosen) and −2 (rejected), ref −1.5 for both,
    /// defaults: `h = 1`, the loss is `−log σ(0.1)` and its gradient `∓0.1·σ(−0.1)`.
    fn self_test() -> Result<(), PluginError> {
        let dpo = Dpo::from_config("{}")?;
        let logprobs = Tensor::from_slice(&[-1.0f64, -2.0]).reshape([2, 1]).set_requires_grad(true);
        let reference = Tensor::from_slice(&[-1.5f64, -1.5]).reshape([2, 1]);
        let mask = Tensor::ones([2, 1], (Kind::Double, Device::Cpu));
        let output = dpo.loss(&LossInputs {
            logprobs: TensorHandle::borrow(&logprobs),
            mask: TensorHandle::borrow(&mask),
            old_logprobs: ROption::RNone,
            ref_logprobs: ROption::RSome(TensorHandle::borrow(&reference)),
            advantages: ROption::RNone,
            values: ROption::RNone,
            old_values: ROption::RNone,
            returns: ROption::RNone,
            scale: LossScale { batch_sequences: 2, batch_tokens: 2, max_new_tokens: 1 },
        })?;
        // SAFETY: the handle was given to us by `loss` and is taken back once.
        let loss = unsafe { output.loss.into_tensor() };
        loss.backward();
        let sigmoid = |x: f64| 1.0 / (1.0 + (-x).exp());
        expect_close("loss", loss.double_value(&[]), -sigmoid(0.1).ln())?;
        let slope = 0.1 * sigmoid(-0.1);
        expect_all_close("gradient", &logprobs.grad(), &[-slope, slope])
    }
}

export_optimizer!(Dpo);

#[cfg(test)]
mod tests {
    use super::*;

    /// Options → `Ok(())` (accepted, nothing to report) or `Err((key, message))`, through
    /// `check_options` and `from_config` alike.
    fn check(json: &str, expected: Result<(), (&str, &str)>) {
        let checked = Dpo::check_options(json);
        let created = Dpo::from_config(json).map(|_| OptionsReport::default()).map_err(OptionError::from);
        rlvr_plugin_api::options::assert_answers(json, [checked, created], expected);
    }

    #[test]
    fn options_are_checked_naming_the_key() {
        check("{}", Ok(()));
        check(r#"{"beta": 0.5}"#, Ok(()));
        check(r#"{"bta": 0.5}"#, Err(("bta", "unknown key; expected one of beta, label_smoothing")));
        check(r#"{"beta": 0}"#, Err(("beta", "expected a number > 0, got 0")));
    }

    #[test]
    fn self_test_passes() {
        Dpo::self_test().unwrap();
    }
}
