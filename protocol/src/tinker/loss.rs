//! Which loss a `forward_backward` asks for, with its settings checked: the SDK's `loss_fn` and
//! `loss_fn_config` (the v2 map, which wins, else the legacy float map). Pure. The arithmetic is
//! the training client's (`rlvr_worker::tinker::loss`); each loss is a **sum** over every token of
//! every datum of the request, as Tinker defines them (<https://tinker-docs.thinkingmachines.ai/losses>):
//!
//! - `cross_entropy`: `-Σ weights · logp(target)` (inputs `target_tokens`, `weights`; a matrix of
//!   several targets per position with their weights is summed the same way);
//! - `importance_sampling`: `-Σ exp(logp - q) · A` (inputs `target_tokens`, `logprobs` = q the
//!   sampler's, `advantages` = A);
//! - `ppo`: `-Σ min(r · A, clip(r, low, high) · A)`, r = exp(logp - q);
//! - `cispo`: `-Σ sg(clip(r, low, high)) · logp · A` (the clipped ratio a constant);
//! - `dro`: `-Σ (logp · A - β/2 · (logp - q)²)`;
//! - `gspo` (GSPO-token, Zheng et al. 2025, as Tinker implements it): `-Σ min(s_t · A, clip(s_t,
//!   low, high) · A)`, where every token's ratio `s_t` has the sequence ratio's value — `exp` of the
//!   mean of `logp - q` over the tokens `sequence_ratio_mask` marks — and its own log-probability's
//!   gradient.
//!
//! `clip_low_threshold` and `clip_high_threshold` default to 0.8 and 1.2 (ε = 0.2, Tinker's), for
//! `gspo` too (the GSPO paper's are far tighter: 1 - 3e-4 and 1 + 4e-4; pass them);
//! `dro` needs `beta`. `stable_reinforce` and server-side `custom` are refused as the
//! request's fault, saying to pass `loss_fn=importance_sampling` (the SDK's `forward_backward_custom`
//! needs no server support: it sends `cross_entropy` with its own weights).

use std::collections::BTreeMap;

use super::proto::{LossConfigValue, loss_config_value};

/// A loss and its settings.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Loss {
    CrossEntropy,
    ImportanceSampling,
    Ppo { low: f64, high: f64 },
    Cispo { low: f64, high: f64 },
    Dro { beta: f64 },
    Gspo { low: f64, high: f64 },
}

/// The default clip thresholds: ε = 0.2 each side.
pub const DEFAULT_CLIP: (f64, f64) = (0.8, 1.2);

/// Why a loss was refused: shown to the team as the request's fault.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct LossError(pub String);

impl Loss {
    /// `loss_fn` with its options: `config_v2` wins over the legacy `config` where both are set.
    pub fn parse(
        name: &str,
        config: &BTreeMap<String, f64>,
        config_v2: &BTreeMap<String, LossConfigValue>,
    ) -> Result<Loss, LossError> {
        let mut options: BTreeMap<&str, f64> = config.iter().map(|(k, v)| (k.as_str(), *v)).collect();
        for (key, value) in config_v2 {
            match &value.value {
                Some(loss_config_value::Value::Number(number)) => {
                    options.insert(key, *number);
                }
                Some(loss_config_value::Value::Text(text)) => {
                    return Err(LossError(format!(
                        "loss_fn_config.{key}: expected a number, got the text {text:?}"
                    )));
                }
                None => {}
            }
        }
        let known: &[&str] = match name {
            "cross_entropy" | "importance_sampling" => &[],
            "ppo" | "cispo" | "gspo" => &["clip_low_threshold", "clip_high_threshold"],
            "dro" => &["beta"],
            "stable_reinforce" | "custom" => {
                return Err(LossError(format!(
                    "loss_fn {name:?} is not served here: pass loss_fn=importance_sampling (or ppo, cispo, \
                     gspo, dro, cross_entropy); forward_backward_custom works as it is"
                )));
            }
            other => {
                return Err(LossError(format!(
                    "unknown loss_fn {other:?}: expected cross_entropy, importance_sampling, ppo, cispo, gspo \
                     or dro"
                )));
            }
        };
        if let Some(key) = options.keys().find(|key| !known.contains(key)) {
            let expected = if known.is_empty() { "none".to_owned() } else { known.join(", ") };
            return Err(LossError(format!(
                "loss_fn_config.{key}: not an option of {name} (its options: {expected})"
            )));
        }
        let finite = |key: &str, value: f64| {
            if value.is_finite() {
                Ok(value)
            } else {
                Err(LossError(format!("loss_fn_config.{key}: expected a finite number")))
            }
        };
        let clip = || -> Result<(f64, f64), LossError> {
            let low = finite(
                "clip_low_threshold",
                options.get("clip_low_threshold").copied().unwrap_or(DEFAULT_CLIP.0),
            )?;
            let high = finite(
                "clip_high_threshold",
                options.get("clip_high_threshold").copied().unwrap_or(DEFAULT_CLIP.1),
            )?;
            if !(0.0..=1.0).contains(&low) || high < 1.0 {
                return Err(LossError(format!(
                    "loss_fn_config: expected 0 ≤ clip_low_threshold ≤ 1 ≤ clip_high_threshold, got {low} and {high}"
                )));
            }
            Ok((low, high))
        };
        Ok(match name {
            "cross_entropy" => Loss::CrossEntropy,
            "importance_sampling" => Loss::ImportanceSampling,
            "ppo" => {
                let (low, high) = clip()?;
                Loss::Ppo { low, high }
            }
            "cispo" => {
                let (low, high) = clip()?;
                Loss::Cispo { low, high }
            }
            "gspo" => {
                let (low, high) = clip()?;
                Loss::Gspo { low, high }
            }
            _ => {
                let beta = options.get("beta").copied().ok_or_else(|| {
                    LossError("loss_fn_config.beta: dro needs it (β of its quadratic penalty)".into())
                })?;
                let beta = finite("beta", beta)?;
                if beta < 0.0 {
                    return Err(LossError(format!("loss_fn_config.beta: expected ≥ 0, got {beta}")));
                }
                Loss::Dro { beta }
            }
        })
    }

    /// The SDK's name of the loss.
    pub fn name(&self) -> &'static str {
        match self {
            Loss::CrossEntropy => "cross_entropy",
            Loss::ImportanceSampling => "importance_sampling",
            Loss::Ppo { .. } => "ppo",
            Loss::Cispo { .. } => "cispo",
            Loss::Dro { .. } => "dro",
            Loss::Gspo { .. } => "gspo",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v2(pairs: &[(&str, LossConfigValue)]) -> BTreeMap<String, LossConfigValue> {
        pairs.iter().map(|(k, v)| ((*k).to_owned(), v.clone())).collect()
    }

    fn number(value: f64) -> LossConfigValue {
        LossConfigValue { value: Some(loss_config_value::Value::Number(value)) }
    }

    #[test]
    fn each_loss_reads_its_options_and_refuses_with_a_sentence() {
        let legacy = |pairs: &[(&str, f64)]| -> BTreeMap<String, f64> {
            pairs.iter().map(|(k, v)| ((*k).to_owned(), *v)).collect()
        };
        let none = BTreeMap::new();
        assert_eq!(Loss::parse("cross_entropy", &none, &BTreeMap::new()), Ok(Loss::CrossEntropy));
        assert_eq!(Loss::parse("ppo", &none, &BTreeMap::new()), Ok(Loss::Ppo { low: 0.8, high: 1.2 }));
        assert_eq!(
            Loss::parse(
                "gspo",
                &legacy(&[("clip_low_threshold", 0.9997), ("clip_high_threshold", 1.0004)]),
                &BTreeMap::new()
            ),
            Ok(Loss::Gspo { low: 0.9997, high: 1.0004 })
        );
        // v2 wins over the legacy map where both say.
        assert_eq!(
            Loss::parse(
                "cispo",
                &legacy(&[("clip_low_threshold", 0.5)]),
                &v2(&[("clip_low_threshold", number(0.7)), ("clip_high_threshold", number(1.3))])
            ),
            Ok(Loss::Cispo { low: 0.7, high: 1.3 })
        );
        assert_eq!(
            Loss::parse("dro", &legacy(&[("beta", 0.05)]), &BTreeMap::new()),
            Ok(Loss::Dro { beta: 0.05 })
        );
        // (name, legacy options, the refusal)
        type Case<'a> = (&'a str, &'a [(&'a str, f64)], &'a str);
        let cases: &[Case] = &[
            ("stable_reinforce", &[], "pass loss_fn=importance_sampling"),
            ("custom", &[], "is not served here"),
            ("reinforce", &[], "unknown loss_fn \"reinforce\""),
            (
                "ppo",
                &[("clip_low_threshold", 1.5)],
                "expected 0 ≤ clip_low_threshold ≤ 1 ≤ clip_high_threshold",
            ),
            ("ppo", &[("clip_high_threshold", 0.9)], "got 0.8 and 0.9"),
            ("ppo", &[("beta", 1.0)], "loss_fn_config.beta: not an option of ppo"),
            ("importance_sampling", &[("clip_low_threshold", 0.9)], "(its options: none)"),
            ("dro", &[], "loss_fn_config.beta: dro needs it"),
            ("dro", &[("beta", -1.0)], "expected ≥ 0"),
            ("ppo", &[("clip_high_threshold", f64::INFINITY)], "expected a finite number"),
        ];
        for (name, options, expected) in cases {
            let refused = Loss::parse(name, &legacy(options), &BTreeMap::new()).unwrap_err().0;
            assert!(refused.contains(expected), "{name} {options:?}: {refused}");
        }
        let text =
            v2(&[("beta", LossConfigValue { value: Some(loss_config_value::Value::Text("x".into())) })]);
        assert!(Loss::parse("dro", &none, &text).unwrap_err().0.contains("expected a number, got the text"));
    }
}
