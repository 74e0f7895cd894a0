//! The SDK's futures: each operation's state by its request id, which `retrieve_future` polls. The
//! SDK polls again as soon as it is told to try again, so [`Futures::wait`] holds a poll until the
//! operation ends or a while passes (well under the SDK's 45 s read timeout), instead of answering
//! at once. A future is its team's: another team's key finds none. Ended futures are kept a while
//! for a poll retried after a lost answer, then forgotten; at most [`MAX_FUTURES`] are kept.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use rlvr_protocol::tinker::process::Answer;
use rlvr_protocol::tinker::wire::{ErrorCategory, QueueState};
use tokio::sync::Notify;

/// How long an ended future is kept for a repeated poll.
pub const KEEP_ENDED: Duration = Duration::from_secs(600);

/// The most futures kept; past it the oldest ended ones go first.
pub const MAX_FUTURES: usize = 100_000;

/// Where an operation is.
#[derive(Debug, Clone, PartialEq)]
pub enum FutureState {
    /// Not done: queued or running (`Active`), or waiting for a device (`PausedCapacity`, with the
    /// scheduler's reason).
    Waiting {
        queue_state: QueueState,
        reason: Option<String>,
    },
    Done(Answer),
    Failed {
        error: String,
        category: ErrorCategory,
    },
}

impl FutureState {
    fn ended(&self) -> bool {
        !matches!(self, FutureState::Waiting { .. })
    }
}

struct Entry {
    team: String,
    /// The scheduler's name of the client that runs it, if one does.
    job: Option<String>,
    state: FutureState,
    /// When it ended (for forgetting).
    ended_at: Option<Instant>,
}

/// Every operation's future.
#[derive(Default)]
pub struct Futures {
    entries: Mutex<HashMap<String, Entry>>,
    changed: Notify,
}

/// The most operations one team may have pending at once: one team cannot take every place.
pub const PENDING_PER_TEAM: usize = 10_000;

/// Why a future could not be opened: too many pending, the daemon's or the team's.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Full(pub String);

impl Futures {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Entry>> {
        self.entries.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// A new future `id` of `team`, waiting.
    pub fn open(&self, id: &str, team: &str) -> Result<(), Full> {
        self.open_for(id, team, None)
    }

    /// A new future `id` of `team`, waiting, that the scheduler's job `job` runs.
    pub fn open_for(&self, id: &str, team: &str, job: Option<&str>) -> Result<(), Full> {
        let mut entries = self.lock();
        if entries.len() >= MAX_FUTURES {
            forget(&mut entries, Duration::ZERO);
            if entries.len() >= MAX_FUTURES {
                return Err(Full(format!(
                    "{MAX_FUTURES} operations are pending on this daemon; retry when some have ended"
                )));
            }
        }
        // Counted only when there are enough entries for it to matter.
        if entries.len() >= PENDING_PER_TEAM
            && entries.values().filter(|entry| entry.team == team && !entry.state.ended()).count()
                >= PENDING_PER_TEAM
        {
            return Err(Full(format!(
                "your team has {PENDING_PER_TEAM} operations pending; retry when some have ended"
            )));
        }
        let waiting = FutureState::Waiting { queue_state: QueueState::Active, reason: None };
        let entry =
            Entry { team: team.to_owned(), job: job.map(str::to_owned), state: waiting, ended_at: None };
        entries.insert(id.to_owned(), entry);
        Ok(())
    }

    /// Future `id` is now `state`; an ended future does not change again. Whether it changed.
    pub fn set(&self, id: &str, state: FutureState) -> bool {
        let mut entries = self.lock();
        forget(&mut entries, KEEP_ENDED);
        let Some(entry) = entries.get_mut(id).filter(|entry| !entry.state.ended()) else {
            return false;
        };
        entry.ended_at = state.ended().then(Instant::now);
        entry.state = state;
        drop(entries);
        self.changed.notify_waiters();
        true
    }

    /// Whether future `id` waits for a device.
    pub fn is_paused(&self, id: &str) -> bool {
        self.lock().get(id).is_some_and(|entry| {
            matches!(entry.state, FutureState::Waiting { queue_state: QueueState::PausedCapacity, .. })
        })
    }

    /// The scheduler's name of the client that runs future `id`.
    pub fn job_of(&self, id: &str) -> Option<String> {
        self.lock().get(id).and_then(|entry| entry.job.clone())
    }

    /// Future `id`'s state once it has ended or changed (from working to waiting for a device, or
    /// back), or after `hold` (then as it was); `None` when `team` has no such future.
    pub async fn wait(&self, id: &str, team: &str, hold: Duration) -> Option<FutureState> {
        let deadline = tokio::time::Instant::now() + hold;
        let mut first = None;
        loop {
            // Registered before the state is read, so a change in between still wakes it.
            let changed = self.changed.notified();
            let state =
                self.lock().get(id).filter(|entry| entry.team == team).map(|entry| entry.state.clone())?;
            let moved = first.as_ref().is_some_and(|first| *first != state);
            if state.ended() || moved || tokio::time::Instant::now() >= deadline {
                return Some(state);
            }
            first.get_or_insert(state);
            if tokio::time::timeout_at(deadline, changed).await.is_err() {
                return self.lock().get(id).map(|entry| entry.state.clone());
            }
        }
    }
}

/// Drops futures ended more than `kept` ago.
fn forget(entries: &mut HashMap<String, Entry>, kept: Duration) {
    entries.retain(|_, entry| entry.ended_at.is_none_or(|at| at.elapsed() < kept));
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    fn done() -> FutureState {
        FutureState::Done(Answer::Json { value: serde_json::json!({"metrics": {}}) })
    }

    #[tokio::test]
    async fn a_poll_is_held_until_its_operation_changes_or_the_hold_passes() {
        let futures = Arc::new(Futures::default());
        futures.open("r1", "math").unwrap();
        // Nothing happens: the poll comes back after its hold, still waiting.
        let started = Instant::now();
        let state = futures.wait("r1", "math", Duration::from_millis(200)).await.unwrap();
        assert!(matches!(state, FutureState::Waiting { queue_state: QueueState::Active, .. }));
        assert!(started.elapsed() >= Duration::from_millis(200));
        // It ends while a poll is held: the poll answers at once.
        let setter = Arc::clone(&futures);
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(50)).await;
            setter.set(
                "r1",
                FutureState::Waiting {
                    queue_state: QueueState::PausedCapacity,
                    reason: Some("devices busy".into()),
                },
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
            setter.set("r1", done());
        });
        // It waits for a device, then ends, while polls are held: a poll answers at a change,
        // long before its hold (the first sees the pause, or the end if it began after the pause).
        let started = Instant::now();
        let first = futures.wait("r1", "math", Duration::from_secs(20)).await.unwrap();
        assert!(
            first == done()
                || matches!(first, FutureState::Waiting { queue_state: QueueState::PausedCapacity, .. }),
            "{first:?}"
        );
        assert_eq!(futures.wait("r1", "math", Duration::from_secs(20)).await, Some(done()));
        assert!(started.elapsed() < Duration::from_secs(5));
        // An ended future stays as it ended; another team's key, or an unknown id, finds none.
        futures.set("r1", FutureState::Failed { error: "late".into(), category: ErrorCategory::Server });
        assert_eq!(futures.wait("r1", "math", Duration::ZERO).await, Some(done()));
        assert_eq!(futures.wait("r1", "vision", Duration::ZERO).await, None);
        assert_eq!(futures.wait("r9", "math", Duration::ZERO).await, None);
    }
}
