//! `sft`: supervised fine-tuning on demonstrations, the cold start before RL: the negative
//! log-likelihood of the completion tokens (the prompt is never in the mask), aggregated per
//! token or per sequence, as each micro-batch's share of the batch's loss.

use rlvr_optimizer_common::config;
use rlvr_optimizer_common::inputs::Like;
use rlvr_optimizer_common::losses::{LossAgg, check_scale};
use rlvr_optimizer_common::{expect_all_close, expect_close, loss_output, metric};
use rlvr_plugin_api::{
    DataMode, LossInputs, LossOutput, LossScale, Metadata, OptimizerInfo, OptimizerPlugin, OptionError,
    OptionsReport, PluginError, ROption, TensorHandle, export_optimizer,
};
use rlvr_plugin_tensor::TensorHandleExt;
use serde::Deserialize;
use tch::Tensor;

/// The aggregations SFT offers: a constant normaliser (Dr. GRPO's) has no use here.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SftAgg {
    /// Every completion token weighs the same.
    TokenMean,
    /// Every demonstration weighs the same, whatever its length.
    SeqMeanTokenMean,
}

impl From<SftAgg> for LossAgg {
    fn from(agg: SftAgg) -> LossAgg {
        match agg {
            SftAgg::TokenMean => LossAgg::TokenMean,
            SftAgg::SeqMeanTokenMean => LossAgg::SeqMeanTokenMean,
        }
    }
}

/// The plugin's keys of the job's `[optimizer]` table.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SftConfig {
    /// How per-token losses are aggregated.
    pub loss_agg: SftAgg,
}

impl Default for SftConfig {
    fn default() -> Self {
        SftConfig { loss_agg: SftAgg::TokenMean }
    }
}

/// The SFT optimizer.
#[derive(Debug, Clone)]
pub struct Sft {
    config: SftConfig,
}

impl OptimizerPlugin for Sft {
    fn metadata() -> Metadata {
        Metadata {
            name: "sft",
            version: env!("CARGO_PKG_VERSION"),
            description: "SFT: negative log-likelihood of demonstration completions, token or sequence mean",
        }
    }

    fn requirements() -> OptimizerInfo {
        OptimizerInfo {
            data_mode: DataMode::OfflineSft,
            needs_reference: false,
            needs_value_head: false,
            needs_groups: false,
            libtorch_version: "filled in by the export layer".into(),
        }
    }

    fn from_config(config_json: &str) -> Result<Self, PluginError> {
        Ok(Sft { config: config::parse(config_json)? })
    }

    fn check_options(config_json: &str) -> Result<OptionsReport, OptionError> {
        config::parse::<SftConfig>(config_json)?;
        Ok(OptionsReport::default())
    }

    fn loss(&self, inputs: &LossInputs) -> Result<LossOutput, PluginError> {
        let (like, logprobs) = Like::first("logprobs", inputs.logprobs)?;
        let mask = like.mask(inputs.mask)?;
        check_scale(&inputs.scale, &mask)?;
        let nll = -mask.clean(&logprobs);
        let metrics = vec![metric("nll", mask.mean(&nll))];
        let loss = LossAgg::from(self.config.loss_agg).aggregate(&nll, &mask, &inputs.scale)?;
        Ok(loss_output(loss, metrics))
    }

    /// Rows `(−1, −2)` and `(−3, padding)`, token mean: the loss is 2 and its gradient −⅓ on
    /// each completion token, 0 on the padding.
    fn self_test() -> Result<(), PluginError> {
        let sft = Sft::from_config("{}")?;
        let logprobs =
            Tensor::from_slice(&[-1.0f64, -2.0, -3.0, -9.0]).reshape([2, 2]).set_requires_grad(true);
        let mask = Tensor::from_slice(&[1.0f64, 1.0, 1.0, 0.0]).reshape([2, 2]);
        let output = sft.loss(&LossInputs {
            logprobs: TensorHandle::borrow(&logprobs),
            mask: TensorHandle::borrow(&mask),
            old_logprobs: ROption::RNone,
            ref_logprobs: ROption::RNone,
            advantages: ROption::RNone,
            values: ROption::RNone,
            old_values: ROption::RNone,
            returns: ROption::RNone,
            scale: LossScale { batch_sequences: 2, batch_tokens: 3, max_new_tokens: 2 },
        })?;
        // SAFETY: the handle was given to us by `loss` and is taken back once.
        let loss = unsafe { output.loss.into_tensor() };
        loss.backward();
        expect_close("loss", loss.double_value(&[]), 2.0)?;
        let third = 1.0 / 3.0;
        expect_all_close("gradient", &logprobs.grad(), &[-third, -third, -third, 0.0])
    }
}

export_optimizer!(Sft);

#[cfg(test)]
mod tests {
    use super::*;

    /// Options → `Ok(())` (accepted, nothing to report) or `Err((key, message))`, through
    /// `check_options` and `from_config` alike.
    fn check(json: &str, expected: Result<(), (&str, &str)>) {
        let checked = Sft::check_options(json);
        let created = Sft::from_config(json).map(|_| OptionsReport::default()).map_err(OptionError::from);
        rlvr_plugin_api::options::assert_answers(json, [checked, created], expected);
    }

    #[test]
    fn options_are_checked_naming_the_key() {
        check("{}", Ok(()));
        check(r#"{"loss_ag": "token-mean"}"#, Err(("loss_ag", "unknown key; expected one of loss_agg")));
    }

    #[test]
    fn self_test_passes() {
        Sft::self_test().unwrap();
    }

    #[test]
    fn the_constant_normaliser_is_refused_by_name() {
        let error = Sft::from_config(r#"{"loss_agg": "seq-mean-token-sum-norm"}"#).unwrap_err();
        assert!(error.message.starts_with("loss_agg: expected one of "), "{}", error.message);
        assert!(error.message.ends_with(", got \"seq-mean-token-sum-norm\""), "{}", error.message);
    }
}
