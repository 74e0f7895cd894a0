//! The grant socket's messages (design.md §7): a worker asks `rlvrd serve` for its devices before
//! each device phase and gives them back after. JSON lines over a Unix socket
//! (`<state_dir>/sched.sock`); the daemon's side is `sched::service`, the worker's `grants.rs`.
//!
//! Phases: rollout, update, eval, and `reward` for the built-in reward-model graders.

use std::fmt;

use serde::{Deserialize, Serialize};

/// The grant socket's file name in the daemon's state directory.
pub const SOCKET_FILE: &str = "sched.sock";

/// A phase that needs the job's devices.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Phase {
    /// Sampling completions.
    Rollout,
    /// Log-probabilities, losses and optimizer steps.
    Update,
    /// Held-out scoring and the gates' evaluation.
    Eval,
    /// Scoring completions with a learned reward model (`[[verifiers]] plugin = "reward-model"`).
    Reward,
}

impl Phase {
    /// Every phase.
    pub const ALL: [Phase; 4] = [Phase::Rollout, Phase::Update, Phase::Eval, Phase::Reward];

    /// The phase of a name [`Phase::as_str`] gives.
    pub fn from_name(name: &str) -> Option<Phase> {
        Phase::ALL.into_iter().find(|phase| phase.as_str() == name)
    }

    /// The phase's name on the wire and in logs.
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Rollout => "rollout",
            Phase::Update => "update",
            Phase::Eval => "eval",
            Phase::Reward => "reward",
        }
    }
}

impl fmt::Display for Phase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One message from a worker.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Request {
    /// The first message: this connection is job `id`'s.
    Job(String),
    /// Wait for the job's devices for a phase.
    Acquire(Phase),
    /// Give the devices back (or withdraw a pending request).
    Release,
}

/// The daemon's answers, one per request (an `Acquire` is answered when granted).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Answer {
    /// The job is known; grants may be asked for.
    Ok,
    /// The devices are the worker's for this phase until it releases them.
    Granted(Phase),
    /// The devices (or the pending request) are given back.
    Released,
    /// The request was refused: why.
    Error(String),
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every message, written by one side and read by the other.
    #[test]
    fn every_message_round_trips() {
        let requests = [
            Request::Job("01J".into()),
            Request::Acquire(Phase::Update),
            Request::Acquire(Phase::Reward),
            Request::Release,
        ];
        for request in requests {
            let line = serde_json::to_string(&request).unwrap();
            assert_eq!(serde_json::from_str::<Request>(&line).unwrap(), request, "{line}");
        }
        let answers =
            [Answer::Ok, Answer::Granted(Phase::Eval), Answer::Released, Answer::Error("no such job".into())];
        for answer in answers {
            let line = serde_json::to_string(&answer).unwrap();
            assert_eq!(serde_json::from_str::<Answer>(&line).unwrap(), answer, "{line}");
        }
    }
}
