//! The circuit breaker: after `threshold` consecutive failed attempts, items fail fast for a
//! cooldown instead of piling onto a service that is down; then one probe request decides.
//!
//! A pure state machine: `now` is a parameter, so tests drive it without sleeping.

use std::time::{Duration, Instant};

/// Whether one attempt may go out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    /// Closed breaker: send.
    Allowed,
    /// The cooldown is over and this attempt is the one probe; its outcome closes or reopens.
    Probe,
    /// Open (or a probe is out): fail fast without a request.
    Refused,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Closed { failures: u32 },
    Open { until: Instant },
    HalfOpen { probe_since: Instant },
}

/// A circuit breaker, shared (behind a mutex) by every thread verifying with one config.
#[derive(Debug, Clone)]
pub struct Breaker {
    threshold: u32,
    cooldown: Duration,
    /// A probe that has not reported after this long is presumed lost (its thread died), and the
    /// next caller probes instead: without it, a lost probe would leave the breaker half-open forever.
    probe_timeout: Duration,
    state: State,
}

impl Breaker {
    /// A closed breaker that opens after `threshold` consecutive failures (0: never) for
    /// `cooldown`. `probe_timeout` is the longest one attempt can take.
    pub fn new(threshold: u32, cooldown: Duration, probe_timeout: Duration) -> Self {
        Breaker { threshold, cooldown, probe_timeout, state: State::Closed { failures: 0 } }
    }

    /// Asks to send one attempt at `now`.
    pub fn admit(&mut self, now: Instant) -> Admission {
        if self.threshold == 0 {
            return Admission::Allowed;
        }
        match self.state {
            State::Closed { .. } => Admission::Allowed,
            State::Open { until } if now >= until => {
                self.state = State::HalfOpen { probe_since: now };
                Admission::Probe
            }
            State::HalfOpen { probe_since }
                if now.saturating_duration_since(probe_since) > self.probe_timeout =>
            {
                self.state = State::HalfOpen { probe_since: now };
                Admission::Probe
            }
            State::Open { .. } | State::HalfOpen { .. } => Admission::Refused,
        }
    }

    /// Records the outcome of an attempt that was sent: `healthy` when the service answered with
    /// anything but 5xx or 429. Any healthy answer closes the breaker; a failure counts toward
    /// opening it, reopens it after a failed probe, and changes nothing while it is open.
    pub fn record(&mut self, healthy: bool, now: Instant) {
        if self.threshold == 0 {
            return;
        }
        self.state = match (self.state, healthy) {
            (_, true) => State::Closed { failures: 0 },
            (State::Closed { failures }, false) if failures + 1 >= self.threshold => {
                State::Open { until: now + self.cooldown }
            }
            (State::Closed { failures }, false) => State::Closed { failures: failures + 1 },
            (State::HalfOpen { .. }, false) => State::Open { until: now + self.cooldown },
            (open @ State::Open { .. }, false) => open,
        };
    }

    /// Whether the breaker is open or half-open at this moment (for messages).
    pub fn is_open(&self) -> bool {
        !matches!(self.state, State::Closed { .. })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One step of a scenario: at `at_ms`, either ask (`Ask`) and expect an admission, or
    /// report an outcome (`Ok` / `Fail`).
    #[derive(Debug, Clone, Copy)]
    enum Step {
        Ask(u64, Admission),
        Ok(u64),
        Fail(u64),
    }
    use Admission::{Allowed, Probe, Refused};
    use Step::{Ask, Fail, Ok};

    /// Runs `steps` on a breaker with `threshold`, cooldown 1000 ms and probe timeout 500 ms.
    fn check(threshold: u32, steps: &[Step]) {
        let start = Instant::now();
        let at = |ms: u64| start + Duration::from_millis(ms);
        let mut breaker = Breaker::new(threshold, Duration::from_millis(1000), Duration::from_millis(500));
        for (index, step) in steps.iter().enumerate() {
            match *step {
                Ask(ms, expected) => {
                    assert_eq!(breaker.admit(at(ms)), expected, "step {index} {step:?} in {steps:?}")
                }
                Ok(ms) => breaker.record(true, at(ms)),
                Fail(ms) => breaker.record(false, at(ms)),
            }
        }
    }

    #[test]
    fn scenarios() {
        // Opens after 3 consecutive failures, refuses during the cooldown.
        check(3, &[Fail(0), Fail(1), Ask(2, Allowed), Fail(2), Ask(3, Refused), Ask(1001, Refused)]);
        // A success in between resets the count.
        check(3, &[Fail(0), Fail(1), Ok(2), Fail(3), Fail(4), Ask(5, Allowed), Fail(5), Ask(6, Refused)]);
        // After the cooldown one probe goes out; others are refused while it is out.
        check(3, &[Fail(0), Fail(0), Fail(0), Ask(999, Refused), Ask(1000, Probe), Ask(1001, Refused)]);
        // A good probe closes it.
        check(
            3,
            &[Fail(0), Fail(0), Fail(0), Ask(1000, Probe), Ok(1010), Ask(1011, Allowed), Ask(1012, Allowed)],
        );
        // A failed probe reopens it for a full cooldown from the failure.
        check(
            3,
            &[
                Fail(0),
                Fail(0),
                Fail(0),
                Ask(1000, Probe),
                Fail(1100),
                Ask(2099, Refused),
                Ask(2100, Probe),
                Ok(2101),
                Ask(2102, Allowed),
            ],
        );
        // A probe that never reports is presumed lost after the probe timeout.
        check(3, &[Fail(0), Fail(0), Fail(0), Ask(1000, Probe), Ask(1500, Refused), Ask(1501, Probe)]);
        // A late failure of an attempt sent before the breaker opened does not extend the cooldown.
        check(3, &[Fail(0), Fail(0), Fail(0), Fail(900), Ask(1000, Probe)]);
        // A late success of an attempt sent before the breaker opened closes it: the service is up.
        check(3, &[Fail(0), Fail(0), Fail(0), Ok(10), Ask(11, Allowed)]);
        // Threshold 1: one failure opens it.
        check(1, &[Ask(0, Allowed), Fail(0), Ask(1, Refused)]);
        // Threshold 0: never opens.
        check(0, &[Fail(0), Fail(0), Fail(0), Fail(0), Ask(1, Allowed)]);
    }
}
