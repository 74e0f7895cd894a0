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
    fn std_conventions() {
        assert_eq!(std(&[1.0, 0.0], StdKind::Population), 0.5);
        assert!((std(&[1.0, 0.0], StdKind::Sample) - 0.5f64.sqrt()).abs() < 1e-15);
        assert_eq!(std(&[4.0], StdKind::Sample), 0.0);
        assert_eq!(uniform_group_fraction(&[1.0, 1.0, 0.0, 1.0, 5.0], &[0..2, 2..4, 4..5]), 2.0 / 3.0);
    }
}
