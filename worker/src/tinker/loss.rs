//! The Tinker losses (`rlvr_protocol::tinker::loss::Loss`) on one datum: from the model's
//! log-probabilities of its target tokens (`[N]`, or `[N, K]` for several targets per position,
//! differentiable) and its inputs, the datum's loss as a **sum** over its tokens — a request's loss
//! is the sum of its datums', reported as `loss:sum`, and gradients accumulate across requests
//! until `optim_step`. The formulas are Tinker's (see the protocol module); the tests hold each to
//! an independent computation of its value and of its gradient.

use rlvr_protocol::tinker::datums::{Input, TrainDatum, Values};
use rlvr_protocol::tinker::loss::Loss;
use tch::{Device, Kind, Tensor};

/// A datum's loss inputs as tensors, each with a row per token.
#[derive(Debug)]
pub struct LossInputs {
    /// `target_tokens`: `[N]` or `[N, K]` int64.
    pub targets: Tensor,
    /// `weights` (cross_entropy): the targets' shape.
    pub weights: Option<Tensor>,
    /// `logprobs`: the sampler's, `[N]`.
    pub sampling: Option<Tensor>,
    /// `advantages`: `[N]`.
    pub advantages: Option<Tensor>,
    /// `sequence_ratio_mask` (gspo): `[N]`, the tokens whose log-ratios the sequence ratio averages.
    pub ratio_mask: Option<Tensor>,
}

impl LossInputs {
    /// The inputs `loss` needs of `datum`, checked (present, shaped as its targets); errors name
    /// the input.
    pub fn of(datum: &TrainDatum, loss: &Loss, device: Device) -> Result<LossInputs, String> {
        let rows = datum.tokens.len() as i64;
        let take = |name: &str| {
            datum.inputs.get(name).ok_or_else(|| format!("loss_fn_inputs.{name}: {} needs it", loss.name()))
        };
        let targets = take("target_tokens")?;
        let Values::Int(ids) = &targets.values else {
            return Err("loss_fn_inputs.target_tokens: expected integers (token ids)".into());
        };
        let float = |name: &str, input: &Input, columns: usize| -> Result<Tensor, String> {
            if input.columns != columns {
                return Err(format!(
                    "loss_fn_inputs.{name}: expected {columns} value(s) per token (as target_tokens), got {}",
                    input.columns
                ));
            }
            let shape = if columns == 1 { vec![rows] } else { vec![rows, columns as i64] };
            Ok(Tensor::from_slice(&input.values.floats()).reshape(&shape).to_device(device))
        };
        let target_shape = if targets.columns == 1 { vec![rows] } else { vec![rows, targets.columns as i64] };
        let mut inputs = LossInputs {
            targets: Tensor::from_slice(ids).reshape(&target_shape).to_device(device),
            weights: None,
            sampling: None,
            advantages: None,
            ratio_mask: None,
        };
        match loss {
            Loss::CrossEntropy => inputs.weights = Some(float("weights", take("weights")?, targets.columns)?),
            _ => {
                if targets.columns != 1 {
                    return Err(format!(
                        "loss_fn_inputs.target_tokens: {} takes one target per token, got {}",
                        loss.name(),
                        targets.columns
                    ));
                }
                inputs.sampling = Some(float("logprobs", take("logprobs")?, 1)?);
                inputs.advantages = Some(float("advantages", take("advantages")?, 1)?);
                if let Loss::Gspo { .. } = loss {
                    inputs.ratio_mask = Some(float("sequence_ratio_mask", take("sequence_ratio_mask")?, 1)?);
                }
            }
        }
        Ok(inputs)
    }
}

/// The datum's loss (a scalar, in `target_logprobs`' kind) from its target log-probabilities,
/// shaped as `inputs.targets`.
pub fn datum_loss(loss: &Loss, target_logprobs: &Tensor, inputs: &LossInputs) -> Tensor {
    let needs = |input: &Option<Tensor>| {
        input.as_ref().expect("LossInputs::of gave the loss's inputs").shallow_clone()
    };
    if let Loss::CrossEntropy = loss {
        return -(target_logprobs * needs(&inputs.weights)).sum(Kind::Float);
    }
    let (sampling, advantages) = (needs(&inputs.sampling), needs(&inputs.advantages));
    let ratio = || (target_logprobs - &sampling).exp();
    let objective = match *loss {
        Loss::ImportanceSampling => ratio() * &advantages,
        Loss::Ppo { low, high } => {
            let ratio = ratio();
            let clipped = ratio.clamp(low, high);
            (&ratio * &advantages).minimum(&(clipped * &advantages))
        }
        Loss::Cispo { low, high } => ratio().clamp(low, high).detach() * target_logprobs * &advantages,
        Loss::Dro { beta } => {
            let drift = target_logprobs - &sampling;
            target_logprobs * &advantages - (&drift * &drift) * (0.5 * beta)
        }
        Loss::Gspo { low, high } => {
            // The sequence ratio's value on every token, with that token's own gradient.
            let mask = needs(&inputs.ratio_mask).ne(0.0).to_kind(target_logprobs.kind());
            let count = mask.sum(Kind::Float).clamp_min(1.0);
            let log_ratio = ((target_logprobs.detach() - &sampling) * &mask).sum(Kind::Float) / count;
            let ratio = (log_ratio + target_logprobs - target_logprobs.detach()).exp();
            let clipped = ratio.clamp(low, high);
            (&ratio * &advantages).minimum(&(clipped * &advantages))
        }
        Loss::CrossEntropy => unreachable!("returned above"),
    };
    -objective.sum(Kind::Float)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Per token: (target logprob, sampler logprob, advantage, weight) — ratios inside, below and
    /// above the clip range, advantages of both signs and zero (a prompt token).
    const TOKENS: [(f64, f64, f64, f64); 6] = [
        (-1.0, -1.0, 0.5, 1.0),
        (-0.5, -1.5, 1.0, 1.0),
        (-2.0, -0.5, -1.0, 0.0),
        (-0.7, -0.2, 2.0, 0.5),
        (-3.0, -3.4, -0.5, 1.0),
        (-1.2, -1.1, 0.0, 1.0),
    ];

    /// The value and the gradient with respect to each target logprob, computed here token by
    /// token in f64 from the formulas, not through the tensors.
    fn expected(loss: &Loss) -> (f64, Vec<f64>) {
        let mut value = 0.0;
        let mut gradient = Vec::new();
        for (lp, q, a, w) in TOKENS {
            let r = (lp - q).exp();
            let (term, slope) = match *loss {
                Loss::CrossEntropy => (-w * lp, -w),
                Loss::ImportanceSampling => (-r * a, -r * a),
                Loss::Ppo { low, high } => {
                    let clipped = r.clamp(low, high);
                    // The smaller objective is taken; a clipped ratio passes no gradient.
                    if r * a <= clipped * a { (-r * a, -r * a) } else { (-clipped * a, 0.0) }
                }
                Loss::Cispo { low, high } => {
                    let weight = r.clamp(low, high);
                    (-weight * lp * a, -weight * a)
                }
                Loss::Dro { beta } => (-(lp * a - 0.5 * beta * (lp - q) * (lp - q)), -(a - beta * (lp - q))),
                Loss::Gspo { low, high } => {
                    // Every token carries the sequence ratio (all six tokens in its mask here).
                    let s = (TOKENS.iter().map(|t| t.0 - t.1).sum::<f64>() / TOKENS.len() as f64).exp();
                    let clipped = s.clamp(low, high);
                    if s * a <= clipped * a { (-s * a, -s * a) } else { (-clipped * a, 0.0) }
                }
            };
            value += term;
            gradient.push(slope);
        }
        (value, gradient)
    }

    #[test]
    fn each_loss_is_its_formula_in_value_and_gradient() {
        let column = |pick: fn(&(f64, f64, f64, f64)) -> f64| {
            Tensor::from_slice(&TOKENS.iter().map(pick).map(|v| v as f32).collect::<Vec<_>>())
        };
        let losses = [
            Loss::CrossEntropy,
            Loss::ImportanceSampling,
            Loss::Ppo { low: 0.8, high: 1.2 },
            Loss::Cispo { low: 0.9, high: 1.1 },
            Loss::Dro { beta: 0.3 },
            Loss::Gspo { low: 0.8, high: 1.2 },
            // The sequence ratio (0.89) below the clip range: tokens of negative advantage take the
            // clipped objective and pass no gradient.
            Loss::Gspo { low: 0.95, high: 1.05 },
        ];
        for loss in losses {
            let logprobs = column(|t| t.0).set_requires_grad(true);
            let inputs = LossInputs {
                targets: Tensor::from_slice(&[0i64; 6]),
                weights: Some(column(|t| t.3)),
                sampling: Some(column(|t| t.1)),
                advantages: Some(column(|t| t.2)),
                ratio_mask: Some(Tensor::ones([6], (Kind::Float, Device::Cpu))),
            };
            let value = datum_loss(&loss, &logprobs, &inputs);
            value.backward();
            let (want, slopes) = expected(&loss);
            let got = value.double_value(&[]);
            assert!((got - want).abs() < 1e-5, "{loss:?}: {got} ≠ {want}");
            let gradient = Vec::<f32>::try_from(logprobs.grad()).unwrap();
            for (i, (g, s)) in gradient.iter().zip(&slopes).enumerate() {
                assert!((f64::from(*g) - s).abs() < 1e-5, "{loss:?} token {i}: gradient {g} ≠ {s}");
            }
        }
    }

    #[test]
    fn a_datums_inputs_are_checked_against_the_loss_and_the_targets() {
        use std::collections::BTreeMap;
        let vector = |values: Values| Input { columns: 1, values };
        let datum = |inputs: Vec<(&str, Input)>| TrainDatum {
            tokens: vec![1, 2],
            inputs: inputs.into_iter().map(|(k, v)| (k.to_owned(), v)).collect::<BTreeMap<_, _>>(),
        };
        let targets = ("target_tokens", vector(Values::Int(vec![2, 3])));
        let half = |name| (name, vector(Values::Float(vec![0.5, 0.5])));
        let ok =
            LossInputs::of(&datum(vec![targets.clone(), half("weights")]), &Loss::CrossEntropy, Device::Cpu);
        assert!(ok.is_ok());
        // (inputs, loss, the refusal)
        type Case<'a> = (Vec<(&'a str, Input)>, Loss, &'a str);
        let cases: Vec<Case> = vec![
            (
                vec![half("weights")],
                Loss::CrossEntropy,
                "loss_fn_inputs.target_tokens: cross_entropy needs it",
            ),
            (vec![targets.clone()], Loss::CrossEntropy, "loss_fn_inputs.weights: cross_entropy needs it"),
            (
                vec![targets.clone(), half("logprobs")],
                Loss::ImportanceSampling,
                "loss_fn_inputs.advantages: importance_sampling needs it",
            ),
            (vec![half("target_tokens"), half("weights")], Loss::CrossEntropy, "expected integers"),
            (
                vec![
                    ("target_tokens", Input { columns: 2, values: Values::Int(vec![1, 2, 3, 4]) }),
                    half("logprobs"),
                    half("advantages"),
                ],
                Loss::Ppo { low: 0.8, high: 1.2 },
                "ppo takes one target per token, got 2",
            ),
            (
                vec![
                    ("target_tokens", Input { columns: 2, values: Values::Int(vec![1, 2, 3, 4]) }),
                    half("weights"),
                ],
                Loss::CrossEntropy,
                "loss_fn_inputs.weights: expected 2 value(s) per token (as target_tokens), got 1",
            ),
        ];
        for (inputs, loss, expected) in cases {
            let refused = LossInputs::of(&datum(inputs), &loss, Device::Cpu).unwrap_err();
            assert!(refused.contains(expected), "{expected:?}: {refused}");
        }
    }
}
