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

/// Where the policy ratio is taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ImportanceRatio {
    /// `ρ_t = exp(logp_t − old_t)` on each token (PPO, GRPO).
    Token,
    /// GSPO's length-normalised sequence ratio `s_i = exp(mean_t(logp − old))` (Zheng et al.,
    /// arXiv:2507.18071, eq. 7), clipped per sequence; each token carries it in the GSPO-token
    /// form `sg(s_i)·exp(logp_t − sg(logp_t))` (eq. 13), whose value is `s_i` and which equals
    /// GSPO's objective and gradient under `seq-mean-token-mean` with one advantage per sequence.
    Sequence,
}

/// Which policy-gradient loss.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PolicyLoss {
    /// PPO's clipped surrogate `−min(ρA, clip(ρ, 1 − ε_low, 1 + ε_high)·A)`.
    PpoClip,
    /// CISPO (MiniMax-M1, arXiv:2506.13585, eq. 4): `−sg(clip(ρ, 1 − ε_low, 1 + ε_high))·A·logp`,
    /// the importance weight clipped and detached, so every token keeps a gradient.
    Cispo,
}

impl PolicyLoss {
    /// The config value.
    pub fn as_str(self) -> &'static str {
        match self {
            PolicyLoss::PpoClip => "ppo-clip",
            PolicyLoss::Cispo => "cispo",
        }
    }
}

/// What the policy loss is and how its ratio is clipped.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Surrogate {
    /// Which loss.
    pub loss: PolicyLoss,
    /// Where the ratio is taken.
    pub ratio: ImportanceRatio,
    /// ε_low: the ratio is clipped at `1 − low`.
    pub low: f64,
    /// ε_high: the ratio is clipped at `1 + high`.
    pub high: f64,
    /// Dual-clip's `c > 1` (Ye et al., arXiv:1912.09729, eq. 5): with `A < 0` the loss is at most
    /// `c·|A|`, so a token whose ratio has run far up cannot blow the update up. `None`: off.
    pub dual_clip: Option<f64>,
}

impl Surrogate {
    /// PPO's clipped surrogate on token ratios, `ε` on both sides, no dual clip.
    pub fn ppo(eps: f64) -> Self {
        Surrogate {
            loss: PolicyLoss::PpoClip,
            ratio: ImportanceRatio::Token,
            low: eps,
            high: eps,
            dual_clip: None,
        }
    }

    /// Refuses combinations no paper defines: CISPO weighs tokens, so it takes neither the
    /// sequence ratio nor the dual clip (its weight is already bounded by `1 + ε_high`).
    pub fn check(&self) -> Result<(), PluginError> {
        if self.loss == PolicyLoss::Cispo {
            if self.ratio == ImportanceRatio::Sequence {
                return Err(PluginError::invalid_config(
                    "importance_ratio: \"sequence\" applies to loss = \"ppo-clip\" only, got loss = \"cispo\"",
                ));
            }
            if self.dual_clip.is_some() {
                return Err(PluginError::invalid_config(
                    "clip_ratio_c: applies to loss = \"ppo-clip\" only, got loss = \"cispo\"",
                ));
            }
        }
        Ok(())
    }
}

/// Checks `clip_ratio_c`: when set, a number > 1 (at 1 it would cut below the clipped surrogate).
pub fn check_dual_clip(value: Option<f64>) -> Result<(), PluginError> {
    match value {
        Some(c) => crate::config::require("clip_ratio_c", c, c > 1.0, "a number > 1"),
        None => Ok(()),
    }
}

/// The policy loss per token and the ratio it used.
#[derive(Debug)]
pub struct ClippedPolicy {
    /// The per-token loss of [`Surrogate::loss`], `[B, T]`.
    pub loss: Tensor,
    /// The ratio the loss clips: `ρ = exp(logp − old)` per token, or GSPO's `s_i` on each of
    /// row `i`'s tokens, `[B, T]`.
    pub ratio: Tensor,
    surrogate: Surrogate,
    advantages: Tensor,
}

impl ClippedPolicy {
    /// From clean `logprobs` (with grad), `old_logprobs` and `advantages`.
    pub fn new(
        logprobs: &Tensor,
        old_logprobs: &Tensor,
        advantages: &Tensor,
        mask: &Mask,
        surrogate: Surrogate,
    ) -> Self {
        let (low, high) = (surrogate.low, surrogate.high);
        let ratio = match surrogate.ratio {
            ImportanceRatio::Token => (logprobs - old_logprobs).exp(),
            ImportanceRatio::Sequence => {
                let lengths: Vec<f64> = mask.lengths().iter().map(|&length| length.max(1) as f64).collect();
                let lengths =
                    Tensor::from_slice(&lengths).to_kind(logprobs.kind()).to_device(logprobs.device());
                let log_s = (mask.row_sums(&(logprobs - old_logprobs)) / lengths).detach().unsqueeze(1);
                // Value s_i on every token; the gradient of token t is s_i·∇logp_t (GSPO-token).
                mask.clean(&(logprobs - logprobs.detach() + log_s).exp())
            }
        };
        let loss = match surrogate.loss {
            PolicyLoss::PpoClip => {
                let unclipped = &ratio * advantages;
                let clipped = ratio.clamp(1.0 - low, 1.0 + high) * advantages;
                let loss = -unclipped.minimum(&clipped);
                match surrogate.dual_clip {
                    // −max(min(ρA, clip(ρ)A), cA) for A < 0 is min(loss, −cA).
                    Some(c) => loss.minimum(&(advantages * -c)).where_self(&advantages.lt(0.0), &loss),
                    None => loss,
                }
            }
            PolicyLoss::Cispo => -(ratio.detach().clamp(1.0 - low, 1.0 + high) * advantages * logprobs),
        };
        ClippedPolicy { loss, ratio, surrogate, advantages: advantages.shallow_clone() }
    }

    /// `clip_frac_low`, `clip_frac_high` and `ratio_mean` over the mask's tokens, plus
    /// `clip_frac_dual` with the dual clip. For `ppo-clip`: A < 0 and ρ < 1 − ε_low (the clip stops
    /// pushing a token further down), A > 0 and ρ > 1 + ε_high; for `cispo`, where the weight
    /// is clipped whatever the advantage's sign: ρ < 1 − ε_low, ρ > 1 + ε_high. `clip_frac_dual`:
    /// A < 0 and ρ > c (the loss is `c·|A|` there, with no gradient).
    pub fn metrics(&self, mask: &Mask) -> Vec<Metric> {
        let ratio = self.ratio.detach();
        let Surrogate { low, high, .. } = self.surrogate;
        let below = ratio.lt(1.0 - low);
        let above = ratio.gt(1.0 + high);
        let (below, above) = match self.surrogate.loss {
            PolicyLoss::PpoClip => {
                (self.advantages.lt(0.0).logical_and(&below), self.advantages.gt(0.0).logical_and(&above))
            }
            PolicyLoss::Cispo => (below, above),
        };
        let mut metrics = vec![
            metric("clip_frac_low", mask.fraction(&below)),
            metric("clip_frac_high", mask.fraction(&above)),
            metric("ratio_mean", mask.mean(&ratio)),
        ];
        if let Some(c) = self.surrogate.dual_clip {
            let dual = self.advantages.lt(0.0).logical_and(&ratio.gt(c));
            metrics.push(metric("clip_frac_dual", mask.fraction(&dual)));
        }
        metrics
    }
}

/// An estimate of the policy's entropy at each sampled token, from log-probabilities alone: the
/// full distribution over the vocabulary never crosses the plugin boundary.
///
/// `Ĥ_t = −ρ_t·logp_t` with `ρ_t = exp(logp_t − old_t)`: the token was drawn from the sampling
/// policy μ (`old`), so `E_μ[−ρ·log π] = −Σ_y π(y)·log π(y) = H(π(·|prefix))`, and its gradient
/// `−ρ·(log π + 1)·∇log π` has expectation `∇H` as well (the `+1` term averages to 0). The
/// naive `−logp` alone would have the right value at ρ = 1 but a gradient of mean 0, so a bonus
/// on it would add only noise. The prefix's own dependence on the policy is not counted, as in
/// every per-token entropy bonus.
pub fn entropy_estimate(logprobs: &Tensor, old_logprobs: &Tensor) -> Tensor {
    -((logprobs - old_logprobs).exp() * logprobs)
}

/// The entropy bonus: `−coef·Ĥ` per token (to be added to the per-token loss, so it is
/// aggregated like the policy loss), and the `entropy` metric (`Ĥ`'s mean over completion
/// tokens), always reported.
pub fn entropy_bonus(
    logprobs: &Tensor,
    old_logprobs: &Tensor,
    mask: &Mask,
    coef: f64,
) -> (Option<Tensor>, Metric) {
    let entropy = entropy_estimate(logprobs, old_logprobs);
    let metric = metric("entropy", mask.mean(&entropy));
    ((coef > 0.0).then(|| entropy * -coef), metric)
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

    fn one_token(logp: f64, old: f64, advantage: f64, surrogate: Surrogate) -> (f64, f64) {
        let logprobs = Tensor::from_slice(&[logp]).reshape([1, 1]).set_requires_grad(true);
        let (like, _) = Like::first("logprobs", TensorHandle::borrow(&logprobs)).unwrap();
        let mask =
            like.mask(TensorHandle::borrow(&Tensor::ones([1, 1], (Kind::Double, tch::Device::Cpu)))).unwrap();
        let old = Tensor::from_slice(&[old]).reshape([1, 1]);
        let advantages = Tensor::from_slice(&[advantage]).reshape([1, 1]);
        let loss = ClippedPolicy::new(&logprobs, &old, &advantages, &mask, surrogate).loss.sum(Kind::Double);
        loss.backward();
        (loss.double_value(&[]), logprobs.grad().double_value(&[0, 0]))
    }

    #[test]
    fn dual_clip_bounds_negative_advantages_and_cispo_keeps_the_gradient() {
        let ppo = Surrogate::ppo(0.2);
        let dual = Surrogate { dual_clip: Some(2.0), ..ppo };
        // ρ = e > c = 2, A = −1: PPO's loss is ρ·|A| = e; the dual clip makes it 2, flat.
        let (loss, grad) = one_token(0.0, -1.0, -1.0, ppo);
        assert!((loss - 1f64.exp()).abs() < 1e-12 && (grad - 1f64.exp()).abs() < 1e-12);
        assert_eq!(one_token(0.0, -1.0, -1.0, dual), (2.0, 0.0));
        // A > 0 is untouched by the dual clip.
        assert_eq!(one_token(0.0, -0.1, 1.0, dual), one_token(0.0, -0.1, 1.0, ppo));
        // CISPO: the weight is clipped at 1.2 yet the token keeps the gradient −1.2·A.
        let cispo = Surrogate { loss: PolicyLoss::Cispo, ..ppo };
        let (loss, grad) = one_token(-0.5, -1.5, 1.0, cispo);
        assert!((loss - 1.2 * 0.5).abs() < 1e-12 && (grad + 1.2).abs() < 1e-12);
        assert!(
            Surrogate { dual_clip: Some(3.0), ..cispo }
                .check()
                .unwrap_err()
                .message
                .starts_with("clip_ratio_c:")
        );
    }

    #[test]
    fn entropy_estimate_is_unbiased_in_value_and_gradient_on_a_small_vocabulary() {
        // π over three tokens, sampled from μ = π (ρ = 1): Σ_y π(y)·Ĥ(y) is H(π), and
        // Σ_y π(y)·∇Ĥ(y) is ∇H with respect to the logits.
        let logits = Tensor::from_slice(&[0.3f64, -1.0, 1.2]).set_requires_grad(true);
        let logp = logits.log_softmax(0, Kind::Double);
        let exact = -(logp.exp() * &logp).sum(Kind::Double);
        let old = logp.detach();
        let expected = (old.exp() * entropy_estimate(&logp, &old)).sum(Kind::Double);
        assert!((expected.double_value(&[]) - exact.double_value(&[])).abs() < 1e-12);
        let exact_grad = Tensor::run_backward(&[&exact], &[&logits], true, false).remove(0);
        let expected_grad = Tensor::run_backward(&[&expected], &[&logits], false, false).remove(0);
        assert!(exact_grad.allclose(&expected_grad, 1e-12, 1e-12, false));
    }

    #[test]
    fn a_multi_turn_rows_replies_get_no_gradient_and_count_in_no_aggregation() {
        // Row 0: a turn (2 tokens), the environment's reply (1, NaN under it), a turn (1); row 1 as
        // the same row's turns side by side, right-padded. Every aggregation is the same on both,
        // and no gradient reaches the reply's position.
        let values = [1.0, 2.0, f64::NAN, 3.0, 1.0, 2.0, 3.0, 0.0];
        let per_token = Tensor::from_slice(&values).reshape([2, 4]).set_requires_grad(true);
        let (like, _) = Like::first("loss", TensorHandle::borrow(&per_token)).unwrap();
        let ones = Tensor::from_slice(&[1.0, 1.0, 0.0, 1.0, 1.0, 1.0, 1.0, 0.0]).reshape([2, 4]);
        let mask = like.mask(TensorHandle::borrow(&ones)).unwrap();
        assert_eq!(mask.lengths(), [3, 3]);
        let scale = LossScale { batch_sequences: 2, batch_tokens: 6, max_new_tokens: 8 };
        for agg in [LossAgg::TokenMean, LossAgg::SeqMeanTokenMean, LossAgg::SeqMeanTokenSumNorm] {
            let clean = mask.clean(&per_token);
            let row = |i: i64| {
                let one = LossScale { batch_sequences: 1, batch_tokens: 3, max_new_tokens: 8 };
                let (row_like, _) =
                    Like::first("row", TensorHandle::borrow(&clean.get(i).unsqueeze(0))).unwrap();
                let row_mask = row_like.mask(TensorHandle::borrow(&ones.get(i).unsqueeze(0))).unwrap();
                agg.aggregate(&clean.get(i).unsqueeze(0), &row_mask, &one).unwrap().double_value(&[])
            };
            assert!((row(0) - row(1)).abs() < 1e-12, "{agg:?}: {} vs {}", row(0), row(1));
            let loss = agg.aggregate(&clean, &mask, &scale).unwrap();
            let grad = Tensor::run_backward(&[&loss], &[&per_token], false, false);
            let grad = Vec::<f64>::try_from(&grad[0].reshape([-1])).unwrap();
            assert_eq!(grad[2], 0.0, "{agg:?}: the reply's position got {grad:?}");
            assert!(grad.iter().all(|g| g.is_finite()), "{agg:?}: {grad:?}");
            assert_eq!(grad[0], grad[4], "{agg:?}: {grad:?}");
        }
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
