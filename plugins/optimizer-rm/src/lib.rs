//! `rm`: a reward model trained on preference pairs with the Bradley–Terry loss of InstructGPT
//! (Ouyang et al., arXiv:2203.02155, eq. 1) and the margin of Llama 2 (Touvron et al.,
//! arXiv:2307.09288, §3.2.2).
//!
//! It trains a [`TrainedModel::RewardModel`]: rows come in pairs (row `2i` is pair `i`'s chosen
//! completion, row `2i + 1` its rejected one), `logprobs` holds each row's scalar score `[B, 1]`,
//! `mask` ones, and `returns` each pair's margin `m_i` from the data (on both rows). With the
//! constant `margin` key `c`, each pair's loss is `−log σ(r_c − r_r − m_i − c)`; a micro-batch's
//! loss is the sum over its pairs divided by the batch's pairs. The README has the sources.
//!
//! Its golden values come from `tests/conformance/make_rm_goldens.py`.

use rlvr_optimizer_common::config;
use rlvr_optimizer_common::inputs::Like;
use rlvr_optimizer_common::losses::check_scale;
use rlvr_optimizer_common::{expect_all_close, expect_close, loss_output, metric};
use rlvr_plugin_api::{
    DataMode, LossInputs, LossOutput, LossScale, Metadata, OptimizerInfo, OptimizerPlugin, OptionError,
    OptionsReport, PluginError, ROption, TensorHandle, TrainedModel, export_optimizer,
};
use rlvr_plugin_tensor::TensorHandleExt;
use serde::Deserialize;
use tch::{Device, Kind, Tensor};

/// The plugin's keys of the job's `[optimizer]` table.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RmConfig {
    /// A margin every pair must clear, added to the pair's own margin from the data.
    pub margin: f64,
}

impl Default for RmConfig {
    fn default() -> Self {
        RmConfig { margin: 0.0 }
    }
}

/// The reward-model optimizer.
#[derive(Debug, Clone)]
pub struct Rm {
    config: RmConfig,
}

impl Rm {
    /// An optimizer with `config`, its ranges checked.
    pub fn new(config: RmConfig) -> Result<Self, PluginError> {
        // Llama 2's margins are ≥ 0: a pair rated "significantly better" asks for a wider gap; a
        // negative one would let a rejected completion score higher at no cost.
        config::non_negative("margin", config.margin)?;
        config::require("margin", config.margin, config.margin.is_finite(), "a finite number")?;
        Ok(Rm { config })
    }
}

impl OptimizerPlugin for Rm {
    fn metadata() -> Metadata {
        Metadata {
            name: "rm",
            version: env!("CARGO_PKG_VERSION"),
            description: "a reward model on preference pairs: Bradley–Terry loss with an optional margin",
        }
    }

    fn requirements() -> OptimizerInfo {
        OptimizerInfo {
            data_mode: DataMode::OfflinePairs,
            needs_reference: false,
            needs_value_head: false,
            needs_groups: false,
            libtorch_version: "filled in by the export layer".into(),
        }
    }

    fn trains() -> TrainedModel {
        TrainedModel::RewardModel
    }

    fn from_config(config_json: &str) -> Result<Self, PluginError> {
        Rm::new(config::parse(config_json)?)
    }

    fn check_options(config_json: &str) -> Result<OptionsReport, OptionError> {
        Rm::new(config::parse(config_json)?)?;
        Ok(OptionsReport::default())
    }

    fn loss(&self, inputs: &LossInputs) -> Result<LossOutput, PluginError> {
        let (like, scores) = Like::first("logprobs", inputs.logprobs)?;
        if like.cols() != 1 {
            return Err(PluginError::invalid_input(format!(
                "logprobs: expected one score per row, [B, 1], got [{}, {}]",
                like.rows(),
                like.cols()
            )));
        }
        if like.rows() % 2 != 0 {
            return Err(PluginError::invalid_input(format!(
                "logprobs: expected pairs of rows (2i chosen, 2i + 1 rejected), got {} rows",
                like.rows()
            )));
        }
        let mask = like.mask(inputs.mask)?;
        if mask.tokens() != like.rows() {
            return Err(PluginError::invalid_input(
                "mask: a reward model scores every row once; expected ones on every row",
            ));
        }
        check_scale(&inputs.scale, &mask)?;
        if inputs.scale.batch_sequences % 2 != 0 {
            return Err(PluginError::invalid_input(format!(
                "scale.batch_sequences: expected an even number (a pair is two rows), got {}",
                inputs.scale.batch_sequences
            )));
        }
        let margins = like.required("returns", inputs.returns, "each pair's margin")?.reshape([-1, 2]);
        let (chosen_margin, rejected_margin) = (margins.select(1, 0), margins.select(1, 1));
        if chosen_margin.isfinite().all().int64_value(&[]) == 0
            || chosen_margin.ne_tensor(&rejected_margin).any().int64_value(&[]) == 1
        {
            return Err(PluginError::invalid_input(
                "returns: expected each pair's margin, finite and the same on both of its rows",
            ));
        }

        let pairs = scores.reshape([-1, 2]);
        let (chosen, rejected) = (pairs.select(1, 0), pairs.select(1, 1));
        let gap = &chosen - &rejected;
        let per_pair = -(&gap - &chosen_margin - self.config.margin).log_sigmoid();
        let batch_pairs = (inputs.scale.batch_sequences / 2) as f64;
        let loss = per_pair.sum(like.kind()) / batch_pairs;

        let mean = |x: &Tensor| x.detach().mean(Kind::Double).double_value(&[]);
        let metrics = vec![
            metric("accuracy", mean(&gap.gt(0.0))),
            metric("score_gap", mean(&gap)),
            metric("chosen_score", mean(&chosen)),
            metric("rejected_score", mean(&rejected)),
        ];
        Ok(loss_output(loss, metrics))
    }

    /// One pair scored 1 (chosen) and −1 (rejected), a data margin of 0.5 and the key's 0.5:
    /// `d = 2 − 1 = 1`, the loss is `−log σ(1)` and its gradient `∓σ(−1)`.
    fn self_test() -> Result<(), PluginError> {
        let rm = Rm::from_config(r#"{"margin": 0.5}"#)?;
        let scores = Tensor::from_slice(&[1.0f64, -1.0]).reshape([2, 1]).set_requires_grad(true);
        let margins = Tensor::from_slice(&[0.5f64, 0.5]).reshape([2, 1]);
        let mask = Tensor::ones([2, 1], (Kind::Double, Device::Cpu));
        let output = rm.loss(&LossInputs {
            logprobs: TensorHandle::borrow(&scores),
            mask: TensorHandle::borrow(&mask),
            old_logprobs: ROption::RNone,
            ref_logprobs: ROption::RNone,
            advantages: ROption::RNone,
            values: ROption::RNone,
            old_values: ROption::RNone,
            returns: ROption::RSome(TensorHandle::borrow(&margins)),
            scale: LossScale { batch_sequences: 2, batch_tokens: 2, max_new_tokens: 1 },
        })?;
        // SAFETY: the handle was given to us by `loss` and is taken back once.
        let loss = unsafe { output.loss.into_tensor() };
        loss.backward();
        let sigmoid = |x: f64| 1.0 / (1.0 + (-x).exp());
        expect_close("loss", loss.double_value(&[]), -sigmoid(1.0).ln())?;
        let slope = sigmoid(-1.0);
        expect_all_close("gradient", &scores.grad(), &[-slope, slope])
    }
}

export_optimizer!(Rm);

#[cfg(test)]
mod tests {
    use super::*;

    /// Options → `Ok(())` (accepted, nothing to report) or `Err((key, message))`, through
    /// `check_options` and `from_config` alike.
    fn check(json: &str, expected: Result<(), (&str, &str)>) {
        let checked = Rm::check_options(json);
        let created = Rm::from_config(json).map(|_| OptionsReport::default()).map_err(OptionError::from);
        rlvr_plugin_api::options::assert_answers(json, [checked, created], expected);
    }

    #[test]
    fn options_are_checked_naming_the_key() {
        check("{}", Ok(()));
        check(r#"{"margin": 1.5}"#, Ok(()));
        check(r#"{"margn": 1}"#, Err(("margn", "unknown key; expected one of margin")));
        check(r#"{"margin": -0.5}"#, Err(("margin", "expected a number ≥ 0, got -0.5")));
        check(r#"{"beta": 0.1}"#, Err(("beta", "unknown key; expected one of margin")));
    }

    #[test]
    fn self_test_passes() {
        Rm::self_test().unwrap();
    }
}
