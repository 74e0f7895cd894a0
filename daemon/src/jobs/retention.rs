//! How long ended jobs' records stay in Redis: a team's newest `queue.keep_ended_per_team` ended
//! jobs, none ended more than `queue.keep_ended_days` ago. Every record holds its spec (up to
//! `api.max_body_bytes`) and its events; without a bound, a team submitting and cancelling jobs
//! in a loop grew Redis by its specs' size every time, outside any quota. Jobs not ended are
//! never touched (the store checks in the script that deletes). What a published version
//! needs is on disk (its manifest carries the spec), not in the record. A job's directory
//! (`jobs/<id>/`: its logs, and its last checkpoint with the optimizer's state, several times its
//! model's size) goes with its record: nothing reaches it after that, and without this the
//! directories of ended jobs filled the state directory's disk (196 tiny jobs of a soak run left
//! 1.7 GB).
//!
//! [`to_forget`] is the rule (**pure**); [`run`] applies it every [`PERIOD`] to every team, and
//! [`sweep_team`] to one team when one of its jobs ends.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rlvr_protocol::jobdir::JobsDir;
use rlvr_queue::store::{JobStore, StoreError};
use tokio_util::sync::CancellationToken;

/// How often every team's ended records are looked at (their age).
pub const PERIOD: Duration = Duration::from_secs(3600);

/// The bound on ended records, and where their jobs' directories are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Retention {
    /// Ended jobs kept per team, the newest.
    pub keep_per_team: usize,
    /// None older than this (since it ended).
    pub keep_for: Duration,
    /// The jobs' directories, each deleted with its record.
    pub jobs: JobsDir,
}

/// The `(team, id)` of the ended jobs to forget among `jobs` (`(team, id, ended at ms)`, `None`
/// for a job not ended) at `now_ms`.
pub fn to_forget(
    jobs: &[(String, String, Option<u64>)],
    retention: &Retention,
    now_ms: u64,
) -> Vec<(String, String)> {
    let cutoff = now_ms.saturating_sub(retention.keep_for.as_millis() as u64);
    let mut ended: BTreeMap<&str, Vec<(u64, &str)>> = BTreeMap::new();
    for (team, id, at) in jobs {
        if let Some(at) = at {
            ended.entry(team).or_default().push((*at, id));
        }
    }
    let mut forget = Vec::new();
    for (team, mut jobs) in ended {
        // Newest first; ties by id, so that the choice does not depend on the store's order.
        jobs.sort_by(|a, b| b.cmp(a));
        for (rank, (at, id)) in jobs.into_iter().enumerate() {
            if rank >= retention.keep_per_team || at < cutoff {
                forget.push((team.to_owned(), id.to_owned()));
            }
        }
    }
    forget
}

/// Applies the rule to `team`'s jobs (every team's with `None`); how many records went.
pub async fn sweep(store: &JobStore, retention: &Retention, team: Option<&str>) -> Result<usize, StoreError> {
    let jobs = store.ended_times(team).await?;
    let now_ms = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |now| now.as_millis() as u64);
    let mut forgotten = 0;
    for (team, id) in to_forget(&jobs, retention, now_ms) {
        if store.forget_ended(&id, &team).await? {
            forgotten += 1;
            let dir = retention.jobs.job(&id);
            match tokio::fs::remove_dir_all(dir.path()).await {
                Ok(()) => {}
                Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
                Err(error) => {
                    tracing::warn!(%error, job = %id, dir = %dir.path().display(), "cannot delete an ended job's directory")
                }
            }
        }
    }
    if forgotten > 0 {
        tracing::info!(
            forgotten,
            team = team.unwrap_or("every team"),
            "ended jobs' records past their retention deleted"
        );
    }
    Ok(forgotten)
}

/// [`sweep`] of one team, after one of its jobs ended: its Redis errors are logged, the next
/// sweep tries again.
pub async fn sweep_team(store: &JobStore, retention: &Retention, team: &str) {
    if let Err(error) = sweep(store, retention, Some(team)).await {
        tracing::warn!(%error, team, "cannot apply the ended jobs' retention now");
    }
}

/// Sweeps every team every [`PERIOD`] until `stopping`, the first time at once.
pub async fn run(store: JobStore, retention: Retention, stopping: CancellationToken) {
    loop {
        if let Err(error) = sweep(&store, &retention, None).await {
            tracing::warn!(%error, "cannot apply the ended jobs' retention now");
        }
        tokio::select! {
            _ = stopping.cancelled() => return,
            _ = tokio::time::sleep(PERIOD) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DAY: u64 = 24 * 3600 * 1000;

    /// `(team, id, ended at)` rows → what goes, at day 100, keeping 2 a team and 30 days.
    #[test]
    fn a_team_keeps_its_newest_ended_jobs_within_the_age_and_every_job_not_ended() {
        let job =
            |team: &str, id: &str, at: Option<u64>| (team.to_owned(), id.to_owned(), at.map(|day| day * DAY));
        let jobs = [
            job("a", "a1", Some(99)),
            job("a", "a2", Some(98)),
            // Third newest of team a: over the count.
            job("a", "a3", Some(97)),
            // Not ended, however old: kept, and not counted.
            job("a", "a4", None),
            job("b", "b1", Some(95)),
            // Within the count, past the age.
            job("b", "b2", Some(60)),
            // Exactly at the age: kept.
            job("c", "c1", Some(70)),
        ];
        let retention = Retention {
            keep_per_team: 2,
            keep_for: Duration::from_secs(30 * 24 * 3600),
            jobs: JobsDir::of_state_dir(std::path::Path::new("/state")),
        };
        let mut gone = to_forget(&jobs, &retention, 100 * DAY);
        gone.sort();
        assert_eq!(gone, [("a".to_owned(), "a3".to_owned()), ("b".to_owned(), "b2".to_owned())]);
        let none = Retention { keep_per_team: 0, ..retention };
        assert_eq!(to_forget(&jobs, &none, 100 * DAY).len(), 6, "keeping none forgets every ended job");
    }
}
