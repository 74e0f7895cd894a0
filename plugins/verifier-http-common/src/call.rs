//! One item's exchange with the peer: attempts with retries, backoff and the shared circuit
//! breaker, ending in an answer or in the verdict that says why there is none.

use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Instant;

use rlvr_plugin_api::Verdict;

use crate::attempt::{Failure, backoff, jitter_unit};
use crate::breaker::{Admission, Breaker};
use crate::resilience::Resilience;

/// Explanation lines, built only when the caller asked: the closures are never run otherwise.
#[derive(Debug, Default)]
pub struct Trail(Option<Vec<String>>);

impl Trail {
    /// A trail that keeps lines only when `explain` is set.
    pub fn new(explain: bool) -> Self {
        Trail(explain.then(Vec::new))
    }

    /// Adds the line `line` builds, when explaining.
    pub fn note(&mut self, line: impl FnOnce() -> String) {
        if let Some(lines) = &mut self.0 {
            lines.push(line());
        }
    }

    /// Adds `other`'s lines after these.
    pub fn extend(&mut self, other: Trail) {
        if let (Some(lines), Some(more)) = (&mut self.0, other.0) {
            lines.extend(more);
        }
    }

    /// `verdict` with these lines put before its explanation.
    pub fn lead(self, mut verdict: Verdict) -> Verdict {
        let Some(mut lines) = self.0 else {
            return verdict;
        };
        lines.extend(verdict.explanation.iter().map(ToString::to_string));
        verdict.explanation = lines.into_iter().map(Into::into).collect();
        verdict
    }

    /// `verdict` with the lines appended to its explanation.
    pub fn into_verdict(self, mut verdict: Verdict) -> Verdict {
        for line in self.0.unwrap_or_default() {
            verdict = verdict.explain(line);
        }
        verdict
    }
}

/// Why a failed item stopped where it did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stop {
    /// Every attempt was used.
    Exhausted,
    /// The failure's class is not in `retry_on` (or never retryable).
    NotRetried,
    /// The breaker opened during the item's retries.
    BreakerOpened,
}

/// A valid answer and what it took.
#[derive(Debug)]
pub struct Answered<T> {
    /// What the plugin's parser made of the body.
    pub answer: T,
    /// The requests the item took, this one included.
    pub attempts: u32,
    /// The explanation so far.
    pub trail: Trail,
}

/// Calls one peer under one config: its limits and its breaker.
#[derive(Debug)]
pub struct Caller {
    limits: Resilience,
    /// Who is called, in messages ("the service").
    peer: &'static str,
    /// The component that counts requests per item (`http_attempts`).
    attempts_component: &'static str,
    /// Shared by every thread verifying with this config: the peer's health is one fact, and a
    /// breaker per thread would let N threads each pile N failures onto a peer that is down.
    breaker: Mutex<Breaker>,
}

impl Caller {
    /// A caller with a closed breaker.
    pub fn new(limits: Resilience, peer: &'static str, attempts_component: &'static str) -> Self {
        let breaker = Breaker::new(limits.breaker_failures, limits.breaker_cooldown, limits.timeout);
        Caller { limits, peer, attempts_component, breaker: Mutex::new(breaker) }
    }

    /// The limits it calls under.
    pub fn limits(&self) -> &Resilience {
        &self.limits
    }

    fn breaker(&self) -> MutexGuard<'_, Breaker> {
        // Nothing panics while holding the lock; recovering keeps one odd panic from failing every
        // later item.
        self.breaker.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Runs `attempt` (one request, cut at `timeout_ms`) with retries, backoff and the breaker, so
    /// the item ends within `item_budget()`. (No separate item deadline: one that could cut a
    /// last attempt short by a few microseconds of overhead would make the verdict depend on
    /// timing.) `Err` is the finished verdict of an item that got no valid answer; its message
    /// is deterministic: the failure, the attempt count and the limit, never a measured time.
    // The `Err` is the item's finished verdict, moved once per item: boxing it buys nothing.
    #[allow(clippy::result_large_err)]
    pub fn call<T>(
        &self,
        explain: bool,
        mut attempt: impl FnMut() -> Result<T, Failure>,
    ) -> Result<Answered<T>, Verdict> {
        let limits = &self.limits;
        let total = limits.retries + 1;
        let mut trail = Trail::new(explain);
        let mut last: Option<Failure> = None;
        for number in 1..=total {
            let admission = self.breaker().admit(Instant::now());
            match (admission, &last) {
                (Admission::Refused, None) => {
                    let verdict = Verdict::error(format!(
                        "circuit breaker open (breaker_failures = {} consecutive failed requests): failing fast \
                         without a request until a probe succeeds (breaker_cooldown_ms = {})",
                        limits.breaker_failures,
                        limits.breaker_cooldown.as_millis()
                    ))
                    .component(self.attempts_component, 0.0);
                    trail.note(|| "circuit breaker open: no request sent".to_owned());
                    return Err(trail.into_verdict(verdict));
                }
                (Admission::Refused, Some(failure)) => {
                    return Err(self.failed(failure, number - 1, Stop::BreakerOpened, trail));
                }
                (Admission::Probe, _) => trail.note(|| {
                    format!("attempt {number}: circuit breaker half-open, this request is its probe")
                }),
                (Admission::Allowed, _) => {}
            }
            let outcome = attempt();
            let health = outcome.as_ref().map_or_else(Failure::health, |_| Some(true));
            if let Some(healthy) = health {
                self.breaker().record(healthy, Instant::now());
            }
            let failure = match outcome {
                Ok(answer) => return Ok(Answered { answer, attempts: number, trail }),
                Err(failure) => failure,
            };
            trail.note(|| format!("attempt {number} of {total}: {}", failure.describe(self.peer, limits)));
            if !failure.class().is_some_and(|class| limits.retries_on(class)) {
                return Err(self.failed(&failure, number, Stop::NotRetried, trail));
            }
            if number == total {
                return Err(self.failed(&failure, number, Stop::Exhausted, trail));
            }
            std::thread::sleep(backoff(number, limits.backoff, limits.backoff_max, jitter_unit()));
            last = Some(failure);
        }
        // The loop returns on its last attempt; this is only reached with retries + 1 = 0 attempts.
        Err(Verdict::error("no attempt was made (retries + 1 = 0)"))
    }

    /// The verdict for an item whose last attempt failed.
    fn failed(&self, failure: &Failure, attempts: u32, stop: Stop, trail: Trail) -> Verdict {
        let total = self.limits.retries + 1;
        let why = match stop {
            Stop::Exhausted => "",
            Stop::NotRetried => ", not retried",
            Stop::BreakerOpened => ", retries stopped: circuit breaker open",
        };
        let message =
            format!("{} (attempt {attempts} of {total}{why})", failure.describe(self.peer, &self.limits));
        let verdict = match failure {
            Failure::Timeout => Verdict::timeout(message),
            _ => Verdict::error(message),
        };
        trail.into_verdict(verdict.component(self.attempts_component, f64::from(attempts)))
    }
}

#[cfg(test)]
mod tests {
    use std::cell::RefCell;
    use std::time::Duration;

    use super::*;
    use crate::resilience::RetryOn;

    fn caller(retries: u32, breaker_failures: u32) -> Caller {
        let limits = Resilience {
            timeout: Duration::from_millis(100),
            retries,
            backoff: Duration::ZERO,
            backoff_max: Duration::ZERO,
            retry_on: vec![RetryOn::Connect, RetryOn::Timeout, RetryOn::ServerError],
            breaker_failures,
            breaker_cooldown: Duration::from_secs(60),
            max_response_bytes: 1024,
        };
        Caller::new(limits, "the peer", "peer_attempts")
    }

    /// `(error, timed out, attempts component)` of a failed call, or `Ok(answer, attempts)`.
    type Got = Result<(&'static str, u32), (String, bool, f64)>;

    /// One outcome per attempt.
    type Script = Vec<Result<&'static str, Failure>>;

    /// Plays `script` (one outcome per attempt) through `caller`; returns what the call gave and
    /// how many attempts ran.
    fn play(caller: &Caller, script: &[Result<&'static str, Failure>]) -> (Got, usize) {
        let calls = RefCell::new(0);
        let got = caller.call(false, || {
            let index = *calls.borrow();
            *calls.borrow_mut() += 1;
            script.get(index).cloned().unwrap_or(Err(Failure::Invalid("script ran out".into())))
        });
        let got = match got {
            Ok(answered) => Ok((answered.answer, answered.attempts)),
            Err(verdict) => Err((
                verdict.error.into_option().map(String::from).unwrap_or_default(),
                verdict.timed_out,
                verdict.components.iter().map(|c| c.value).sum(),
            )),
        };
        (got, calls.into_inner())
    }

    #[test]
    fn retries_stop_at_success_exhaustion_a_non_retried_failure_or_an_open_breaker() {
        let refused = || Failure::Connect("refused".into());
        let cases: Vec<(Caller, Script, Got, usize)> = vec![
            (caller(2, 0), vec![Ok("a")], Ok(("a", 1)), 1),
            (caller(2, 0), vec![Err(refused()), Err(Failure::Timeout), Ok("b")], Ok(("b", 3)), 3),
            (
                caller(1, 0),
                vec![Err(refused()), Err(Failure::Timeout)],
                Err(("the peer did not answer within timeout_ms = 100 (attempt 2 of 2)".into(), true, 2.0)),
                2,
            ),
            (
                caller(2, 0),
                vec![Err(Failure::Invalid("bad body".into()))],
                Err(("bad body (attempt 1 of 3, not retried)".into(), false, 1.0)),
                1,
            ),
            (
                caller(2, 0),
                vec![Err(Failure::Status { code: 429, snippet: "slow".into() })],
                Err((
                    "the peer answered 429 Too Many Requests: slow (attempt 1 of 3, not retried)".into(),
                    false,
                    1.0,
                )),
                1,
            ),
            (
                caller(3, 2),
                vec![Err(refused()), Err(refused()), Ok("never")],
                Err((
                    "cannot reach the peer: refused (attempt 2 of 4, retries stopped: circuit breaker open)"
                        .into(),
                    false,
                    2.0,
                )),
                2,
            ),
        ];
        for (caller, script, expected, calls) in cases {
            assert_eq!(play(&caller, &script), (expected, calls), "{script:?}");
        }
    }

    #[test]
    fn an_open_breaker_answers_at_once_without_a_request() {
        let caller = caller(0, 1);
        let (first, _) = play(&caller, &[Err(Failure::Status { code: 503, snippet: String::new() })]);
        assert!(first.is_err());
        let (got, calls) = play(&caller, &[Ok("never")]);
        assert_eq!(calls, 0);
        assert_eq!(
            got,
            Err((
                "circuit breaker open (breaker_failures = 1 consecutive failed requests): failing fast without a \
                 request until a probe succeeds (breaker_cooldown_ms = 60000)"
                    .into(),
                false,
                0.0
            ))
        );
    }
}
