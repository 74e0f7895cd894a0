//! Which checkpoints a run keeps, and which one it offers the gates (pure: steps and scores in,
//! steps out; the worker's `state` module does the IO).
//!
//! Held-out is scored every `eval.every_steps` (and at the end), and a checkpoint is written at
//! each of those steps. [`retained`] keeps, of the checkpoints on disk, the best `keep_best`
//! scored ones and the last `keep_last` (for resume), and always the one `LATEST` names;
//! [`best`] picks the candidate among the scored ones kept. The scores of the retained
//! checkpoints travel in each checkpoint's `state.json`, so a resumed run decides as an
//! uninterrupted one would.
//!
//! On a tie of scores [`best`] takes the earlier step.

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

/// A checkpoint whose weights were scored on the held-out set.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ScoredCheckpoint {
    /// Its step.
    pub step: u64,
    /// Its held-out accuracy (greedy, the gates' prompts).
    pub accuracy: f64,
}

/// `[checkpoint] keep_best` and `keep_last`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retention {
    /// Scored checkpoints kept for their score: the best this many.
    pub keep_best: usize,
    /// The newest this many checkpoints, scored or not (what a resume needs, and a fallback).
    pub keep_last: usize,
}

/// Orders scores best first: higher accuracy, then the **earlier** step. On a tie the held-out
/// set shows no gain for the extra steps, and the earlier weights are the nearer to the
/// reference (less KL, less drift in length or style for the other gates to catch).
fn better(a: &ScoredCheckpoint, b: &ScoredCheckpoint) -> std::cmp::Ordering {
    b.accuracy.total_cmp(&a.accuracy).then(a.step.cmp(&b.step))
}

/// The steps of the checkpoints to keep, given the complete checkpoints on disk (`on_disk`,
/// including the one just written), the scores known (`scored`; scores of steps not on disk are
/// ignored), and `latest`, the step `LATEST` names. A checkpoint after `latest` is a leftover of
/// a run killed before it named it, never kept.
pub fn retained(on_disk: &[u64], scored: &[ScoredCheckpoint], latest: u64, rule: Retention) -> BTreeSet<u64> {
    let present: BTreeSet<u64> = on_disk.iter().copied().filter(|step| *step <= latest).collect();
    let mut keep: BTreeSet<u64> = present.iter().rev().take(rule.keep_last).copied().collect();
    keep.insert(latest);
    let mut ranked: Vec<ScoredCheckpoint> =
        scored.iter().filter(|score| present.contains(&score.step)).copied().collect();
    ranked.sort_by(better);
    keep.extend(ranked.iter().take(rule.keep_best).map(|score| score.step));
    keep
}

/// The candidate for the gates: the best of `scored` (higher accuracy, then the earlier step);
/// `None` when nothing was scored.
pub fn best(scored: &[ScoredCheckpoint]) -> Option<ScoredCheckpoint> {
    scored.iter().copied().min_by(better)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scores(pairs: &[(u64, f64)]) -> Vec<ScoredCheckpoint> {
        pairs.iter().map(|&(step, accuracy)| ScoredCheckpoint { step, accuracy }).collect()
    }

    fn check(
        on_disk: &[u64],
        scored: &[(u64, f64)],
        latest: u64,
        best_last: (usize, usize),
        expected: &[u64],
    ) {
        let rule = Retention { keep_best: best_last.0, keep_last: best_last.1 };
        let kept: Vec<u64> = retained(on_disk, &scores(scored), latest, rule).into_iter().collect();
        assert_eq!(kept, expected, "on disk {on_disk:?}, scored {scored:?}, latest {latest}, {rule:?}");
    }

    #[test]
    fn the_best_scored_and_the_last_are_kept_and_nothing_else() {
        // The defaults (1, 2): the best scored one, and the last two.
        check(&[5, 10, 15, 20], &[(5, 0.3), (10, 0.5), (15, 0.4), (20, 0.2)], 20, (1, 2), &[10, 15, 20]);
        // The best is among the last: only the last two stay.
        check(&[5, 10, 15, 20], &[(5, 0.3), (10, 0.2), (15, 0.6), (20, 0.2)], 20, (1, 2), &[15, 20]);
        // Unscored checkpoints (checkpoint.every_steps between evaluations) are kept only as last.
        check(&[2, 4, 5, 6, 8, 10], &[(5, 0.7), (10, 0.1)], 10, (1, 2), &[5, 8, 10]);
        // Ties: the earlier step is the better.
        check(&[5, 10, 15, 20], &[(5, 0.5), (10, 0.5), (15, 0.1), (20, 0.1)], 20, (1, 1), &[5, 20]);
        // keep_best 2.
        check(
            &[5, 10, 15, 20, 25],
            &[(5, 0.3), (10, 0.5), (15, 0.4), (20, 0.2), (25, 0.1)],
            25,
            (2, 1),
            &[10, 15, 25],
        );
        // keep_best 0: the last ones only (the candidate is then the best of those).
        check(&[5, 10, 15], &[(5, 0.9), (10, 0.1), (15, 0.1)], 15, (0, 1), &[15]);
        // LATEST is always kept, even with keep_last 0 (the spec refuses it; the rule holds anyway).
        check(&[5, 10], &[(5, 0.9), (10, 0.1)], 10, (1, 0), &[5, 10]);
        // A leftover beyond LATEST (a killed run renamed it and died before LATEST) goes.
        check(&[5, 10, 15], &[(5, 0.9)], 10, (1, 1), &[5, 10]);
        // A score whose checkpoint is gone is ignored, not resurrected.
        check(&[10, 15], &[(5, 0.9), (10, 0.2), (15, 0.1)], 15, (1, 1), &[10, 15]);
        // Nothing scored (no held-out set): the last ones.
        check(&[1, 2, 3, 4], &[], 4, (1, 2), &[3, 4]);
    }

    #[test]
    fn the_candidate_is_the_best_score_and_the_earlier_of_a_tie() {
        assert_eq!(best(&[]), None);
        let cases: [(&[(u64, f64)], u64); 4] = [
            (&[(5, 0.3), (10, 0.5), (15, 0.4)], 10),
            (&[(5, 0.5), (10, 0.5), (15, 0.4)], 5),
            (&[(15, 0.5), (10, 0.5)], 10),
            (&[(20, 0.0)], 20),
        ];
        for (scored, expected) in cases {
            assert_eq!(best(&scores(scored)).map(|b| b.step), Some(expected), "{scored:?}");
        }
    }
}
