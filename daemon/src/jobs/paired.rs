//! The held-out gain's confidence interval: the candidate's and the baseline's verdicts on the same
//! prompts, compared pair by pair, with a seeded paired bootstrap over prompts. Pure: verdicts and
//! a seed in, an interval out; no IO, no clock.
//!
//! Why a bootstrap (Efron & Tibshirani 1993, *An Introduction to the Bootstrap*, ch. 13, the
//! percentile interval) rather than an exact McNemar (1947) test or Newcombe's (1998) score
//! interval for a paired difference of proportions: it resamples what the gates actually read —
//! whole prompts, each with both models' verdicts — so it carries over unchanged to any
//! per-prompt figure the gates may pair later (reward, a grader's component), and its one
//! assumption is that the prompts are a sample of the task. It needs a seed, which the job
//! has: the same job and verdicts give the same interval, in every daemon. Only discordant
//! prompts (passed by one model and failed by the other) move the gain, so a candidate that
//! changed no verdict has the interval [0, 0], whatever the accuracies.

use rlvr_protocol::gates::PairedInterval;
use rlvr_seeded::SplitMix64;

/// The interval's confidence level: 95%, two-sided (2.5% of the bootstrap's gains below it).
pub const CONFIDENCE: f64 = 0.95;

/// Bootstrap resamples. The percentile interval's ends are the 2.5% and 97.5% quantiles of the
/// resampled gains; with 2,000 the Monte Carlo error of a 2.5% quantile's rank is about
/// √(0.025 · 0.975 / 2000) ≈ 0.35% of the resamples, small against the 1/n steps a gain moves in
/// (Efron & Tibshirani recommend at least 1,000 for percentile intervals). The cost is one draw
/// per prompt per resample: 2,000 × n.
pub const RESAMPLES: usize = 2000;

/// Tags the job's seed so the bootstrap's stream is its own, not one the worker draws from.
const SEED_TAG: u64 = 0x6761_7465_735f_6369; // "gates_ci"

/// The paired interval of the gain `after − before` in pass rate, from each prompt's verdict
/// before (the baseline) and after (the candidate), in the same order. `None` when the two do
/// not pair up (different lengths) or there are no prompts.
pub fn gain_interval(before: &[bool], after: &[bool], seed: u64) -> Option<PairedInterval> {
    if before.len() != after.len() || before.is_empty() {
        return None;
    }
    let prompts = before.len();
    let improved = before.iter().zip(after).filter(|(b, a)| !**b && **a).count();
    let regressed = before.iter().zip(after).filter(|(b, a)| **b && !**a).count();
    let (low, high) = bootstrap(prompts, improved, regressed, CONFIDENCE, RESAMPLES, seed ^ SEED_TAG);
    Some(PairedInterval {
        estimate: (improved as f64 - regressed as f64) / prompts as f64,
        low,
        high,
        confidence: CONFIDENCE,
        prompts,
        improved,
        regressed,
    })
}

/// The percentile interval of the paired bootstrap: `resamples` times, `prompts` prompts drawn
/// with replacement, each +1 if it improved, −1 if it regressed, 0 otherwise; the gain of a
/// resample is its sum over `prompts`. Drawing a prompt uniformly and asking which of the three
/// kinds it is equals drawing from the prompts themselves: the order of prompts does not matter.
fn bootstrap(
    prompts: usize,
    improved: usize,
    regressed: usize,
    confidence: f64,
    resamples: usize,
    seed: u64,
) -> (f64, f64) {
    let mut rng = SplitMix64::new(seed);
    let mut gains: Vec<i64> = (0..resamples)
        .map(|_| {
            (0..prompts)
                .map(|_| {
                    let drawn = rng.below(prompts);
                    if drawn < improved {
                        1
                    } else if drawn < improved + regressed {
                        -1
                    } else {
                        0
                    }
                })
                .sum()
        })
        .collect();
    gains.sort_unstable();
    // The α/2 quantile's rank from each end (50 of 2,000 at 95%).
    let tail = (((1.0 - confidence) / 2.0) * resamples as f64).floor() as usize;
    let n = prompts as f64;
    (gains[tail] as f64 / n, gains[resamples - 1 - tail] as f64 / n)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `prompts` verdict pairs with `improved` 0→1, `regressed` 1→0 and `both` 1→1 (the rest 0→0).
    fn pairs(prompts: usize, improved: usize, regressed: usize, both: usize) -> (Vec<bool>, Vec<bool>) {
        let mut before = Vec::new();
        let mut after = Vec::new();
        for (b, a, count) in [(false, true, improved), (true, false, regressed), (true, true, both)] {
            before.extend(std::iter::repeat_n(b, count));
            after.extend(std::iter::repeat_n(a, count));
        }
        before.resize(prompts, false);
        after.resize(prompts, false);
        (before, after)
    }

    fn check(prompts: usize, improved: usize, regressed: usize, expected: (f64, f64, f64)) {
        let (before, after) = pairs(prompts, improved, regressed, prompts / 4);
        let interval = gain_interval(&before, &after, 7).unwrap();
        let (estimate, low, high) = expected;
        let close = |a: f64, b: f64| (a - b).abs() < 1e-12;
        assert!(
            close(interval.estimate, estimate) && close(interval.low, low) && close(interval.high, high),
            "{prompts} prompts, {improved} up, {regressed} down: {interval:?}, expected {expected:?}"
        );
        assert_eq!((interval.prompts, interval.improved, interval.regressed), (prompts, improved, regressed));
    }

    /// When every discordant prompt moved one way the resampled gain is k/n with k ~ Binomial(n, d/n)
    /// (d discordant of n): the interval's ends are that binomial's 2.5% and 97.5% quantiles over
    /// n, up to the bootstrap's Monte Carlo error (one step at most). Quantiles from scipy:
    /// `binom.ppf([0.025, 0.975], n, d/n)`.
    #[test]
    fn one_sided_changes_match_the_binomial_quantiles() {
        // binom.ppf(0.025, 48, 8/48) = 3, binom.ppf(0.975, 48, 8/48) = 13.
        let interval = gain_interval(&pairs(48, 8, 0, 10).0, &pairs(48, 8, 0, 10).1, 1).unwrap();
        let (low, high) = (interval.low * 48.0, interval.high * 48.0);
        assert!((2.0..=4.0).contains(&low.round()) && (12.0..=14.0).contains(&high.round()), "{interval:?}");
        // binom.ppf(0.025, 200, 0.1) = 12, binom.ppf(0.975, 200, 0.1) = 28.
        let interval = gain_interval(&pairs(200, 20, 0, 50).0, &pairs(200, 20, 0, 50).1, 1).unwrap();
        let (low, high) = (interval.low * 200.0, interval.high * 200.0);
        assert!(
            (11.0..=13.0).contains(&low.round()) && (27.0..=29.0).contains(&high.round()),
            "{interval:?}"
        );
        // Regressions only: the mirror image.
        let interval = gain_interval(&pairs(200, 0, 20, 50).0, &pairs(200, 0, 20, 50).1, 1).unwrap();
        let (low, high) = (interval.low * 200.0, interval.high * 200.0);
        assert!(
            (-29.0..=-27.0).contains(&low.round()) && (-13.0..=-11.0).contains(&high.round()),
            "{interval:?}"
        );
    }

    #[test]
    fn the_interval_of_constructed_cases() {
        // Nothing changed (held-out 0 → 0, or every verdict the same): the interval is [0, 0].
        check(48, 0, 0, (0.0, 0.0, 0.0));
        // Pinned values of this implementation and seed (a change of them is a change of every
        // gate's verdict; the binomial test above is their reference).
        check(48, 8, 0, (8.0 / 48.0, 3.0 / 48.0, 13.0 / 48.0));
        check(48, 8, 8, (0.0, -7.0 / 48.0, 8.0 / 48.0));
        check(100, 12, 2, (0.10, 0.03, 0.17));
        check(16, 1, 0, (1.0 / 16.0, 0.0, 3.0 / 16.0));
    }

    #[test]
    fn the_same_verdicts_and_seed_give_the_same_interval_and_another_seed_may_not() {
        let (before, after) = pairs(64, 9, 4, 20);
        let first = gain_interval(&before, &after, 42).unwrap();
        assert_eq!(gain_interval(&before, &after, 42), Some(first));
        // The order of prompts does not matter, only the pairs.
        let mut shuffled: Vec<(bool, bool)> = before.iter().copied().zip(after.iter().copied()).collect();
        shuffled.reverse();
        let (b, a): (Vec<bool>, Vec<bool>) = shuffled.into_iter().unzip();
        assert_eq!(gain_interval(&b, &a, 42), Some(first));
        let others: Vec<PairedInterval> =
            (0..8).filter_map(|seed| gain_interval(&before, &after, seed)).collect();
        assert!(others.iter().any(|other| (other.low, other.high) != (first.low, first.high)), "{others:?}");
        assert!(others.iter().all(|other| other.estimate == first.estimate));
    }

    #[test]
    fn verdicts_that_do_not_pair_have_no_interval() {
        assert_eq!(gain_interval(&[true, false], &[true], 1), None);
        assert_eq!(gain_interval(&[], &[], 1), None);
    }
}
