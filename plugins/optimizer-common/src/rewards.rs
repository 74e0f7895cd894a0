//! Sequence-level pieces of the online methods: the batch's checked inputs, groups, statistics
//! of rewards, and the KL penalty folded into the reward.
//!
//! Group statistics are computed on the host in `f64` (a batch has at most a few thousand
//! rewards); only the result goes back to the device, in the call's dtype.

use std::ops::Range;

use rlvr_plugin_api::{AdvantageInputs, Metric, PluginError};
use serde::Deserialize;
use tch::Tensor;

use crate::inputs::{Like, Mask};
use crate::losses::KlEstimator;
use crate::metric;

/// The checked inputs of [`AdvantageInputs`] every online method uses.
#[derive(Debug)]
pub struct OnlineBatch {
    /// Shape, dtype and device of the batch (those of `old_logprobs`).
    pub like: Like,
    /// `old_logprobs`, padding cleaned.
    pub old_logprobs: Tensor,
    /// The mask.
    pub mask: Mask,
    /// One finite reward per row.
    pub rewards: Vec<f64>,
}

impl OnlineBatch {
    /// Checks `old_logprobs`, `mask`, and that `rewards` and `group_ids` have one finite entry
    /// per row.
    pub fn new(inputs: &AdvantageInputs<'_>) -> Result<OnlineBatch, PluginError> {
        let (like, old_logprobs) = Like::first("old_logprobs", inputs.old_logprobs)?;
        let mask = like.mask(inputs.mask)?;
        let rows = like.rows();
        for (name, length) in [("rewards", inputs.rewards.len()), ("group_ids", inputs.group_ids.len())] {
            if length != rows {
                return Err(PluginError::invalid_input(format!(
                    "{name}: expected one per row of old_logprobs ({rows}), got {length}"
                )));
            }
        }
        let rewards = inputs.rewards.to_vec();
        if let Some(row) = rewards.iter().position(|reward| !reward.is_finite()) {
            return Err(PluginError::invalid_input(format!("rewards: row {row} is {}", rewards[row])));
        }
        let old_logprobs = mask.clean(&old_logprobs);
        Ok(OnlineBatch { like, old_logprobs, mask, rewards })
    }

    /// The reference log-probabilities, padding cleaned: required when `required_for` says what
    /// needs them, else used when given.
    pub fn reference(
        &self,
        inputs: &AdvantageInputs<'_>,
        required_for: Option<&str>,
    ) -> Result<Option<Tensor>, PluginError> {
        let reference = self.like.needed("ref_logprobs", inputs.ref_logprobs, required_for)?;
        Ok(reference.map(|reference| self.mask.clean(&reference)))
    }

    /// The KL penalty of the reward, `β·k(old, ref)` on every completion token.
    pub fn kl_penalty(
        &self,
        estimator: KlEstimator,
        beta: f64,
        reference: &Tensor,
    ) -> Result<KlPenalty, PluginError> {
        let kl = estimator.per_token(&self.old_logprobs, reference);
        let per_token = self.mask.clean(&(&kl * beta));
        let per_row = Vec::<f64>::try_from(&self.mask.row_sums(&per_token).to_kind(tch::Kind::Double))
            .map_err(|error| PluginError::internal(format!("cannot read the KL back: {error}")))?;
        let metrics = vec![metric("kl", self.mask.mean(&kl)), metric("kl_penalty", mean(&per_row))];
        Ok(KlPenalty { per_token, per_row, metrics })
    }
}

/// The KL to the reference as a reward penalty (InstructGPT-style), `β·k(old, ref)` per token.
#[derive(Debug)]
pub struct KlPenalty {
    /// `β·k(old, ref)` on each completion token, 0 on padding, `[B, T]`.
    pub per_token: Tensor,
    /// `β·Σ_t mask·k(old, ref)` of each row: what sequence-level methods subtract from the reward.
    pub per_row: Vec<f64>,
    /// `kl` (the estimator's mean over the batch's completion tokens) and `kl_penalty` (the
    /// per-row penalty's mean over rows).
    pub metrics: Vec<Metric>,
}

impl KlPenalty {
    /// `rewards − per_row`.
    pub fn apply(&self, rewards: &mut [f64]) {
        for (reward, penalty) in rewards.iter_mut().zip(&self.per_row) {
            *reward -= penalty;
        }
    }
}

/// DAPO's soft overlong punishment (Yu et al., arXiv:2503.14476, §3.4, eq. 13), added to each
/// completion's reward before advantages: with `L_max` the job's `max_new_tokens` and `L_cache`
/// the buffer, `R_len(y) = 0` for `|y| ≤ L_max − L_cache`, `((L_max − L_cache) − |y|) / L_cache`
/// up to `L_max`, and `−1` beyond; scaled by `penalty` (verl's `penalty_factor`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct OverlongShaping {
    /// `L_cache`, in tokens (`overlong_buffer`).
    pub buffer: u32,
    /// The factor of `R_len` (`overlong_penalty`).
    pub penalty: f64,
}

impl OverlongShaping {
    /// From the keys `overlong_buffer` (unset: no shaping) and `overlong_penalty` (default 1).
    pub fn from_keys(buffer: Option<u32>, penalty: Option<f64>) -> Result<Option<Self>, PluginError> {
        if let Some(penalty) = penalty {
            crate::config::non_negative("overlong_penalty", penalty)?;
        }
        match buffer {
            None if penalty.is_some() => Err(PluginError::invalid_config(
                "overlong_penalty: needs overlong_buffer (the length of the soft penalty's ramp, in tokens)",
            )),
            None => Ok(None),
            Some(0) => {
                Err(PluginError::invalid_config("overlong_buffer: expected a number of tokens ≥ 1, got 0"))
            }
            Some(buffer) => Ok(Some(OverlongShaping { buffer, penalty: penalty.unwrap_or(1.0) })),
        }
    }

    /// `R_len` of a completion of `length` tokens under a budget of `max_tokens` (`≥ buffer`).
    pub fn reward(&self, length: usize, max_tokens: u32) -> f64 {
        let (length, max, buffer) = (length as f64, f64::from(max_tokens), f64::from(self.buffer));
        let free = max - buffer;
        let value = if length <= free {
            0.0
        } else if length <= max {
            (free - length) / buffer
        } else {
            -1.0
        };
        self.penalty * value
    }

    /// Adds `R_len` to each row's reward; `max_new_tokens` is the job's (`None` from a host that
    /// does not pass it: refused). Metrics: `overlong_shaping` (the mean added reward) and
    /// `overlong_frac` (the fraction of completions it touched).
    pub fn apply(
        &self,
        rewards: &mut [f64],
        lengths: &[usize],
        max_new_tokens: Option<u32>,
    ) -> Result<Vec<Metric>, PluginError> {
        let Some(max_new_tokens) = max_new_tokens else {
            return Err(PluginError::invalid_input(
                "overlong_buffer: needs the job's max_new_tokens, which this host did not give in its context (a host older than HostContext::max_new_tokens)",
            ));
        };
        if self.buffer > max_new_tokens {
            return Err(PluginError::invalid_config(format!(
                "overlong_buffer: expected at most the job's max_new_tokens ({max_new_tokens}), got {}",
                self.buffer
            )));
        }
        let shaping: Vec<f64> = lengths.iter().map(|&length| self.reward(length, max_new_tokens)).collect();
        for (reward, shaping) in rewards.iter_mut().zip(&shaping) {
            *reward += shaping;
        }
        let touched = shaping.iter().filter(|value| **value != 0.0).count();
        Ok(vec![
            metric("overlong_shaping", mean(&shaping)),
            metric("overlong_frac", touched as f64 / shaping.len().max(1) as f64),
        ])
    }
}

/// Each group's rows: the runs of equal ids in `group_ids`. A group must be contiguous.
pub fn groups(group_ids: &[u64]) -> Result<Vec<Range<usize>>, PluginError> {
    let mut groups: Vec<Range<usize>> = Vec::new();
    for (row, id) in group_ids.iter().enumerate() {
        match groups.last_mut() {
            Some(last) if group_ids[last.start] == *id => last.end = row + 1,
            _ => {
                if let Some(earlier) = groups.iter().find(|group| group_ids[group.start] == *id) {
                    return Err(PluginError::invalid_input(format!(
                        "group_ids: group {id} is split (rows {}..{} and row {row}); a group's completions must be contiguous",
                        earlier.start, earlier.end
                    )));
                }
                groups.push(row..row + 1);
            }
        }
    }
    Ok(groups)
}

/// The fraction of groups whose rewards are all equal (all-pass, all-fail, or one completion):
/// they carry no learning signal.
pub fn uniform_group_fraction(rewards: &[f64], groups: &[Range<usize>]) -> f64 {
    let uniform = groups
        .iter()
        .filter(|group| rewards[group.start..group.end].iter().all(|reward| *reward == rewards[group.start]))
        .count();
    uniform as f64 / groups.len().max(1) as f64
}

/// Which standard deviation: `sample` divides by n − 1, `population` by n.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StdKind {
    /// Bessel-corrected, `/ (n − 1)`.
    Sample,
    /// `/ n`.
    Population,
}

/// The mean; 0 for no values.
pub fn mean(values: &[f64]) -> f64 {
    values.iter().sum::<f64>() / values.len().max(1) as f64
}

/// The standard deviation; 0 for fewer than two values (a group of one has no spread).
pub fn std(values: &[f64], kind: StdKind) -> f64 {
    let n = values.len();
    if n < 2 {
        return 0.0;
    }
    let mean = mean(values);
    let squares: f64 = values.iter().map(|value| (value - mean).powi(2)).sum();
    let divisor = match kind {
        StdKind::Sample => n - 1,
        StdKind::Population => n,
    };
    (squares / divisor as f64).sqrt()
}

/// `(x − mean) / (std + eps)` over all `values`, population std: batch whitening of
/// advantages. With no spread every value becomes 0.
pub fn whiten(values: &mut [f64], eps: f64) {
    let (mean, std) = (mean(values), std(values, StdKind::Population));
    for value in values {
        *value = (*value - mean) / (std + eps);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_are_contiguous_runs() {
        assert_eq!(groups(&[7, 7, 3, 9, 9, 9]).unwrap(), [0..2, 2..3, 3..6]);
        let error = groups(&[1, 1, 2, 1]).unwrap_err();
        assert!(error.message.contains("group 1 is split (rows 0..2 and row 3)"), "{}", error.message);
    }

    #[test]
    fn overlong_shaping_follows_dapo() {
        // L_max = 10, L_cache = 4: free up to 6 tokens, then a ramp to −1 at 10, −1 beyond.
        let shaping = OverlongShaping { buffer: 4, penalty: 1.0 };
        let at: Vec<f64> = [0, 6, 7, 8, 10, 11].iter().map(|&length| shaping.reward(length, 10)).collect();
        assert_eq!(at, [0.0, 0.0, -0.25, -0.5, -1.0, -1.0]);
        let halved = OverlongShaping { penalty: 0.5, ..shaping };
        assert_eq!(halved.reward(8, 10), -0.25);
        let mut rewards = [1.0, 1.0];
        let metrics = shaping.apply(&mut rewards, &[3, 8], Some(10)).unwrap();
        assert_eq!(rewards, [1.0, 0.5]);
        assert_eq!(metrics[1].value, 0.5);
        assert!(
            shaping.apply(&mut rewards, &[3], Some(3)).unwrap_err().message.starts_with("overlong_buffer:")
        );
        assert!(shaping.apply(&mut rewards, &[3], None).unwrap_err().message.starts_with("overlong_buffer:"));
        let refused = |buffer, penalty| OverlongShaping::from_keys(buffer, penalty).unwrap_err().message;
        assert!(refused(Some(0), None).starts_with("overlong_buffer:"));
        assert!(refused(None, Some(1.0)).starts_with("overlong_penalty: needs overlong_buffer"));
        assert!(refused(Some(4), Some(-1.0)).starts_with("overlong_penalty: expected a number ≥ 0"));
        assert_eq!(OverlongShaping::from_keys(None, None).unwrap(), None);
    }

    #[test]
    fn std_conventions() {
        assert_eq!(std(&[1.0, 0.0], StdKind::Population), 0.5);
        assert!((std(&[1.0, 0.0], StdKind::Sample) - 0.5f64.sqrt()).abs() < 1e-15);
        assert_eq!(std(&[4.0], StdKind::Sample), 0.0);
        assert_eq!(uniform_group_fraction(&[1.0, 1.0, 0.0, 1.0, 5.0], &[0..2, 2..4, 4..5]), 2.0 / 3.0);
    }
}
