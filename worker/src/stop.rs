//! The `[stop]` conditions of a job, checked after every step on the step's metrics line (pure).
//! A tripped condition ends the job `failed` with the condition, the measured value, the
//! threshold and the step; the checkpoint of that step is not written, so the last good one stays.
//!
//! - `kl_max`: the step's KL to the reference (`kl_ref`) above it.
//! - `heldout_drop_max`: the held-out score fell more than this below the one before training
//!   while the training reward rose (mean of the last [`WINDOW`] steps above the first's): the
//!   model is learning the reward, not the task.
//! - `length_growth_max`: mean completion length of the last [`WINDOW`] steps over the first's
//!   above this factor.
//! - `verifier_timeout_rate_max`, `verifier_error_rate_max`: the share of verified completions
//!   that timed out, or came back with an error, over the last [`WINDOW`] steps.
//!
//! The watch rebuilds its history from `metrics.jsonl` on resume ([`StopWatch::observe`]), so a
//! resumed job judges exactly as an uninterrupted one.

use std::collections::VecDeque;

use rlvr_protocol::spec::StopSection;
use rlvr_protocol::worker::MetricsLine;
pub use rlvr_protocol::worker::Trend;

/// Steps averaged for the trends and rates.
pub const WINDOW: usize = 5;

/// The figures of one step the conditions need.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
struct Figures {
    reward: f64,
    length: f64,
    verified: f64,
    timeouts: f64,
    errors: f64,
    kl: Option<f64>,
}

/// What tripped.
#[derive(Debug, Clone, PartialEq)]
pub struct Tripped {
    /// `stop.kl_max`, …
    pub condition: &'static str,
    /// The condition, the measured value, the threshold and the step.
    pub message: String,
}

/// The conditions and what they need to remember.
#[derive(Debug, Clone)]
pub struct StopWatch {
    config: StopSection,
    first: Vec<Figures>,
    recent: VecDeque<Figures>,
    heldout_before: Option<f64>,
    /// Steps with a reward observed.
    steps: usize,
}

fn mean(values: impl Iterator<Item = f64>) -> f64 {
    let (sum, count) = values.fold((0.0, 0usize), |(sum, count), value| (sum + value, count + 1));
    if count == 0 { 0.0 } else { sum / count as f64 }
}

impl StopWatch {
    pub fn new(config: &StopSection) -> Self {
        StopWatch {
            config: config.clone(),
            first: Vec::new(),
            recent: VecDeque::new(),
            heldout_before: None,
            steps: 0,
        }
    }

    /// Takes in a metrics line without judging it (history on resume, the step-0 evaluation).
    pub fn observe(&mut self, line: &MetricsLine) {
        if let Some(heldout) = &line.heldout
            && self.heldout_before.is_none()
        {
            self.heldout_before = Some(heldout.accuracy);
        }
        let Some(reward) = line.reward_mean else { return };
        let figures = Figures {
            reward,
            length: line.completion_len_mean.unwrap_or(0.0),
            verified: line.verified.unwrap_or(0) as f64,
            timeouts: line.verifier_timeouts.unwrap_or(0) as f64,
            errors: line.verifier_errors.unwrap_or(0) as f64,
            kl: line.kl_ref,
        };
        self.steps += 1;
        if self.first.len() < WINDOW {
            self.first.push(figures);
        }
        self.recent.push_back(figures);
        if self.recent.len() > WINDOW {
            self.recent.pop_front();
        }
    }

    /// Training's trend so far; `None` before any training step (an SFT job logs no reward).
    pub fn trend(&self) -> Option<Trend> {
        let steps = self.steps;
        if self.first.is_empty() {
            return None;
        }
        let kls: Vec<f64> = self.recent.iter().filter_map(|f| f.kl).collect();
        Some(Trend {
            steps,
            reward_first: mean(self.first.iter().map(|f| f.reward)),
            reward_last: mean(self.recent.iter().map(|f| f.reward)),
            kl_last: (!kls.is_empty()).then(|| mean(kls.into_iter())),
            length_first: mean(self.first.iter().map(|f| f.length)),
            length_last: mean(self.recent.iter().map(|f| f.length)),
        })
    }

    /// Takes in step `step`'s metrics line and judges it: the first condition it trips, if any.
    pub fn check(&mut self, step: u64, line: &MetricsLine) -> Option<Tripped> {
        self.observe(line);
        let config = &self.config;
        let at = format!("at step {step}");
        if let (Some(max), Some(kl)) = (config.kl_max, line.kl_ref)
            && kl > max
        {
            return Some(Tripped {
                condition: "stop.kl_max",
                message: format!("stop.kl_max: KL to the reference {kl:.4} > {max} {at}"),
            });
        }
        let recent_reward = mean(self.recent.iter().map(|f| f.reward));
        let first_reward = mean(self.first.iter().map(|f| f.reward));
        if let (Some(max), Some(before), Some(now)) = (
            config.heldout_drop_max,
            self.heldout_before,
            line.heldout.as_ref().map(|heldout| heldout.accuracy),
        ) && before - now > max
            && recent_reward > first_reward
        {
            return Some(Tripped {
                condition: "stop.heldout_drop_max",
                message: format!(
                    "stop.heldout_drop_max: held-out score fell {:.4} (from {before:.4} to {now:.4}) > {max} while the \
                     training reward rose (mean {first_reward:.4} over the first {WINDOW} steps, {recent_reward:.4} over \
                     the last) {at}",
                    before - now
                ),
            });
        }
        let full = self.first.len() == WINDOW && self.recent.len() == WINDOW;
        let first_length = mean(self.first.iter().map(|f| f.length));
        if let Some(max) = config.length_growth_max
            && full
            && first_length > 0.0
        {
            let growth = mean(self.recent.iter().map(|f| f.length)) / first_length;
            if growth > max {
                return Some(Tripped {
                    condition: "stop.length_growth_max",
                    message: format!(
                        "stop.length_growth_max: mean completion length grew {growth:.2}× (last {WINDOW} steps over the \
                         first {WINDOW}) > {max} {at}"
                    ),
                });
            }
        }
        let verified: f64 = self.recent.iter().map(|f| f.verified).sum();
        let timeouts: fn(&Figures) -> f64 = |f| f.timeouts;
        let errors: fn(&Figures) -> f64 = |f| f.errors;
        let rates = [
            ("stop.verifier_timeout_rate_max", "timed out", config.verifier_timeout_rate_max, timeouts),
            ("stop.verifier_error_rate_max", "had a verifier error", config.verifier_error_rate_max, errors),
        ];
        for (condition, what, max, count) in rates {
            if let Some(max) = max
                && verified > 0.0
            {
                let rate = self.recent.iter().map(count).sum::<f64>() / verified;
                if rate > max {
                    return Some(Tripped {
                        condition,
                        message: format!(
                            "{condition}: {:.1}% of the completions of the last {} steps {what} > {:.1}% {at}",
                            rate * 100.0,
                            self.recent.len(),
                            max * 100.0
                        ),
                    });
                }
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn stop(toml: &str) -> StopSection {
        toml::from_str(toml).unwrap()
    }

    fn line(value: serde_json::Value) -> MetricsLine {
        serde_json::from_value(value).unwrap()
    }

    fn step(reward: f64, length: f64, kl: f64) -> MetricsLine {
        line(
            json!({"step": 0, "reward_mean": reward, "completion_len_mean": length, "kl_ref": kl, "verified": 16,
               "verifier_timeouts": 0, "verifier_errors": 0}),
        )
    }

    fn heldout(accuracy: f64) -> Option<rlvr_protocol::worker::ScoreFigures> {
        Some(rlvr_protocol::worker::ScoreFigures {
            accuracy,
            reward_mean: 0.0,
            completion_len_mean: 0.0,
            prompts: 1,
        })
    }

    /// Feeds lines from step 1; the first trip, as (step, message).
    fn run(config: &str, lines: &[MetricsLine]) -> Option<(u64, String)> {
        let mut watch = StopWatch::new(&stop(config));
        watch.observe(&MetricsLine { heldout: heldout(0.5), ..MetricsLine::default() });
        lines.iter().zip(1..).find_map(|(line, n)| watch.check(n, line).map(|tripped| (n, tripped.message)))
    }

    #[test]
    fn each_condition_trips_on_its_own_figure_and_says_what_it_measured() {
        let steady: Vec<MetricsLine> = (0..12).map(|_| step(0.5, 20.0, 0.01)).collect();
        for config in [
            "",
            "kl_max = 0.1",
            "length_growth_max = 1.5",
            "heldout_drop_max = 0.1",
            "verifier_timeout_rate_max = 0.05",
            "verifier_error_rate_max = 0.05",
        ] {
            assert_eq!(run(config, &steady), None, "{config}: a steady run never stops");
        }
        let mut kl = steady.clone();
        kl[6].kl_ref = Some(0.25);
        assert_eq!(
            run("kl_max = 0.1", &kl),
            Some((7, "stop.kl_max: KL to the reference 0.2500 > 0.1 at step 7".into()))
        );

        let growing: Vec<MetricsLine> = (0..12).map(|n| step(0.5, 20.0 + 4.0 * f64::from(n), 0.01)).collect();
        let (at, message) = run("length_growth_max = 1.5", &growing).unwrap();
        assert_eq!(at, 9, "{message}");
        assert!(
            message.starts_with("stop.length_growth_max: mean completion length grew 1.57×"),
            "{message}"
        );

        let mut hacked: Vec<MetricsLine> =
            (0..10).map(|n| step(0.3 + 0.05 * f64::from(n), 20.0, 0.01)).collect();
        hacked[9].heldout = heldout(0.35);
        let (at, message) = run("heldout_drop_max = 0.1", &hacked).unwrap();
        assert_eq!(at, 10);
        assert!(
            message.contains(
                "held-out score fell 0.1500 (from 0.5000 to 0.3500) > 0.1 while the training reward rose"
            ),
            "{message}"
        );
        // The same drop with a falling reward is not reward hacking: no stop.
        let mut falling = hacked.clone();
        for (n, line) in falling.iter_mut().enumerate() {
            line.reward_mean = Some(0.8 - 0.05 * n as f64);
        }
        assert_eq!(run("heldout_drop_max = 0.1", &falling), None);

        let mut timeouts = steady.clone();
        timeouts[3].verifier_timeouts = Some(8);
        let (at, message) = run("verifier_timeout_rate_max = 0.05", &timeouts).unwrap();
        assert_eq!(
            (at, message.as_str()),
            (
                4,
                "stop.verifier_timeout_rate_max: 12.5% of the completions of the last 4 steps timed out > 5.0% at step 4"
            )
        );
        let mut errors = steady;
        errors[0].verifier_errors = Some(2);
        let (at, message) = run("verifier_error_rate_max = 0.05", &errors).unwrap();
        assert_eq!(
            (at, message.as_str()),
            (
                1,
                "stop.verifier_error_rate_max: 12.5% of the completions of the last 1 steps had a verifier error > 5.0% at step 1"
            )
        );
    }

    #[test]
    fn a_watch_rebuilt_from_the_log_judges_as_the_uninterrupted_one() {
        let lines: Vec<MetricsLine> = (0..12).map(|n| step(0.5, 20.0 + 4.0 * f64::from(n), 0.01)).collect();
        let config = stop("length_growth_max = 1.5");
        let mut straight = StopWatch::new(&config);
        let mut resumed = StopWatch::new(&config);
        for (line, n) in lines[..5].iter().zip(1..) {
            assert_eq!(straight.check(n, line), None);
            resumed.observe(line);
        }
        for (line, n) in lines[5..].iter().zip(6..) {
            assert_eq!(straight.check(n, line), resumed.check(n, line), "step {n}");
        }
    }
}
