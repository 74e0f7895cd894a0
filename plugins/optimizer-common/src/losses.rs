//! The per-token pieces of the losses, each written once: KL estimators, the clipped policy loss,
//! and aggregation of per-token losses into a micro-batch's share of the batch's loss.

use rlvr_plugin_api::{LossScale, Metric, PluginError};
use serde::Deserialize;
use tch::Tensor;

use crate::inputs::Mask;
use crate::metric;

/// Estimators of KL(π ‖ π_ref) from one sampled token (J. Schulman, "Approximating KL
/// divergence", 2020). With `log r = ref − logp` (the sample drawn from π):
/// k1 = −log r, k2 = ½(log r)², k3 = (r − 1) − log r.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum KlEstimator {
    /// `logp − ref`: unbiased, high variance, can be negative.
    K1,
    /// `½(logp − ref)²`: biased, low variance, never negative.
    K2,
    /// `exp(ref − logp) − (ref − logp) − 1`: unbiased, low variance, never negative.
    K3,
}

impl KlEstimator {
    /// The estimate on every token, `[B, T]`, from clean (padding-free) inputs.
    pub fn per_token(self, logprobs: &Tensor, reference: &Tensor) -> Tensor {
        let log_ratio = reference - logprobs;
        match self {
            KlEstimator::K1 => -log_ratio,
            KlEstimator::K2 => log_ratio.square() * 0.5,
            KlEstimator::K3 => log_ratio.exp() - &log_ratio - 1.0,
        }
    }
}

/// How per-token losses become a micro-batch's share of the batch's loss. Each divides by a
/// whole-batch quantity from [`LossScale`], so the host may sum micro-batch losses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum LossAgg {
    /// `Σ mask·ℓ / batch_tokens`: every token weighs the same (DAPO).
    TokenMean,
    /// `Σ_i (Σ_t mask·ℓ / max(len_i, 1)) / batch_sequences`: every sequence weighs the same (GRPO).
    SeqMeanTokenMean,
    /// `Σ mask·ℓ / (batch_sequences · max_new_tokens)`: a constant normaliser (Dr. GRPO).
    SeqMeanTokenSumNorm,
}

impl LossAgg {
    /// The config value.
    pub fn as_str(self) -> &'static str {
        match self {
            LossAgg::TokenMean => "token-mean",
            LossAgg::SeqMeanTokenMean => "seq-mean-token-mean",
            LossAgg::SeqMeanTokenSumNorm => "seq-mean-token-sum-norm",
        }
    }

    /// This micro-batch's share of the batch's loss, from per-token losses that are finite on
    /// completion tokens (padding is ignored). [`check_scale`] must have passed.
    pub fn aggregate(
        self,
        per_token: &Tensor,
        mask: &Mask,
        scale: &LossScale,
    ) -> Result<Tensor, PluginError> {
        let kind = per_token.kind();
        let sequences = scale.batch_sequences as f64;
        Ok(match self {
            LossAgg::TokenMean => mask.row_sums(per_token).sum(kind) / (scale.batch_tokens.max(1) as f64),
            LossAgg::SeqMeanTokenMean => {
                let lengths: Vec<f64> = mask.lengths().iter().map(|&length| length.max(1) as f64).collect();
                let lengths = Tensor::from_slice(&lengths).to_kind(kind).to_device(per_token.device());
                (mask.row_sums(per_token) / lengths).sum(kind) / sequences
            }
            LossAgg::SeqMeanTokenSumNorm => {
                let budget = scale.max_new_tokens as usize;
                if budget == 0 {
                    return Err(PluginError::invalid_input(
                        "scale.max_new_tokens: expected ≥ 1 for loss_agg seq-mean-token-sum-norm, got 0",
                    ));
                }
                if let Some((row, length)) =
                    mask.lengths().iter().enumerate().find(|(_, length)| **length > budget)
                {
                    return Err(PluginError::invalid_input(format!(
                        "scale.max_new_tokens: {budget} is less than row {row}'s {length} completion tokens"
                    )));
                }
                mask.row_sums(per_token).sum(kind) / (sequences * budget as f64)
            }
        })
    }
}

/// Refuses a [`LossScale`] that cannot hold this micro-batch: fewer batch rows or tokens than
/// the micro-batch has.
pub fn check_scale(scale: &LossScale, mask: &Mask) -> Result<(), PluginError> {
    let rows = mask.lengths().len();
    if (scale.batch_sequences as usize) < rows {
        return Err(PluginError::invalid_input(format!(
            "scale.batch_sequences: {} is fewer than this micro-batch's {rows} rows",
            scale.batch_sequences
        )));
    }
    if (scale.batch_tokens as usize) < mask.tokens() {
        return Err(PluginError::invalid_input(format!(
            "scale.batch_tokens: {} is fewer than this micro-batch's {} completion tokens",
            scale.batch_tokens,
            mask.tokens()
        )));
    }
    Ok(())
}

/// The clipped surrogate of PPO (Schulman et al. 2017, eq. 7) per token, and the ratio.
#[derive(Debug)]
pub struct ClippedPolicy {
    /// `−min(ρA, clip(ρ, 1 − ε_low, 1 + ε_high)·A)`, `[B, T]`.
    pub loss: Tensor,
    /// `ρ = exp(logp − old)`, `[B, T]`.
    pub ratio: Tensor,
    low: f64,
    high: f64,
    advantages: Tensor,
}

impl ClippedPolicy {
    /// From clean `logprobs` (with grad), `old_logprobs` and `advantages`.
    pub fn new(logprobs: &Tensor, old_logprobs: &Tensor, advantages: &Tensor, low: f64, high: f64) -> Self {
        let ratio = (logprobs - old_logprobs).exp();
        let unclipped = &ratio * advantages;
        let clipped = ratio.clamp(1.0 - low, 1.0 + high) * advantages;
        let loss = -unclipped.minimum(&clipped);
        ClippedPolicy { loss, ratio, low, high, advantages: advantages.shallow_clone() }
    }

    /// `clip_frac_low` (A < 0 and ρ < 1 − ε_low: the clip stops pushing a token further down),
    /// `clip_frac_high` (A > 0 and ρ > 1 + ε_high) and `ratio_mean`, over the mask's tokens.
    pub fn metrics(&self, mask: &Mask) -> Vec<Metric> {
        let ratio = self.ratio.detach();
        let low = self.advantages.lt(0.0).logical_and(&ratio.lt(1.0 - self.low));
        let high = self.advantages.gt(0.0).logical_and(&ratio.gt(1.0 + self.high));
        vec![
            metric("clip_frac_low", mask.fraction(&low)),
            metric("clip_frac_high", mask.fraction(&high)),
            metric("ratio_mean", mask.mean(&ratio)),
        ]
    }
}

#[cfg(test)]
mod tests {
    use rlvr_plugin_api::TensorHandle;
    use rlvr_plugin_tensor::TensorHandleExt;
    use tch::Kind;

    use super::*;
    use crate::inputs::Like;

    #[test]
    fn estimators_match_their_definitions() {
        let logp = Tensor::from_slice(&[-1.0f64]);
        let reference = Tensor::from_slice(&[-1.5f64]);
        let at = |estimator: KlEstimator| estimator.per_token(&logp, &reference).double_value(&[0]);
        assert!((at(KlEstimator::K1) - 0.5).abs() < 1e-15);
        assert!((at(KlEstimator::K2) - 0.125).abs() < 1e-15);
        assert!((at(KlEstimator::K3) - ((-0.5f64).exp() + 0.5 - 1.0)).abs() < 1e-15);
    }

    #[test]
    fn aggregations_divide_by_whole_batch_quantities() {
        let per_token = Tensor::from_slice(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]).reshape([2, 3]);
        let (like, _) = Like::first("loss", TensorHandle::borrow(&per_token)).unwrap();
        let ones = Tensor::from_slice(&[1.0, 1.0, 0.0, 1.0, 0.0, 0.0]).reshape([2, 3]);
        let mask = like.mask(TensorHandle::borrow(&ones)).unwrap();
        let scale = LossScale { batch_sequences: 4, batch_tokens: 10, max_new_tokens: 5 };
        let value = |agg: LossAgg| agg.aggregate(&per_token, &mask, &scale).unwrap().double_value(&[]);
        assert_eq!(value(LossAgg::TokenMean), 7.0 / 10.0);
        assert_eq!(value(LossAgg::SeqMeanTokenMean), (1.5 + 4.0) / 4.0);
        assert_eq!(value(LossAgg::SeqMeanTokenSumNorm), 7.0 / 20.0);
        let short = LossScale { batch_sequences: 1, ..scale };
        assert!(check_scale(&short, &mask).unwrap_err().message.contains("batch_sequences"));
        let budget = LossScale { max_new_tokens: 1, ..scale };
        assert!(LossAgg::SeqMeanTokenSumNorm.aggregate(&per_token, &mask, &budget).is_err());
        assert_eq!(per_token.kind(), Kind::Double);
    }
}
