//! Places for long-running work a team's token starts, so that no team takes every place: a lane
//! per team (`per_team` at once) under a daemon-wide cap (`at_once`), and for an engine job's own
//! token a lane of its own, as wide as the job's ranks, that no team's work can fill. Three kinds of
//! work take places:
//! - graders' dry-runs on `POST /v1/verify` (`api.dry_runs_per_team`, `api.dry_runs_at_once`;
//!   an engine's ranks grade in their job's lane), each place held until the grading it admitted
//!   ends, not until the request that asked for it goes away;
//! - event streams (`api.streams_per_team`, half of `api.max_connections` over the daemon, the
//!   other half kept for plain requests), each held while its stream is open;
//! - every request of a team token (`api.requests_per_team`, `auth::require_token`), held until
//!   its answer is sent or dropped.
//!
//! [`admit`] is the rule, on counts; [`Lanes`] keeps the counts, a [`Ticket`] holds one place.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// Whose grading a request is.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Lane {
    /// A team token's dry-run.
    Team(String),
    /// An engine job's ranks grading, with the job's own token.
    Job { id: String, ranks: usize },
}

/// The caps of one kind of work, from `[api]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Caps {
    /// Places over the daemon, teams' lanes together (jobs' lanes are not counted).
    pub at_once: usize,
    /// Places per team.
    pub per_team: usize,
}

/// Why a request waits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Busy {
    Host { at_once: usize },
    Team { per_team: usize },
    Job { ranks: usize },
}

/// What a kind of work is called in a 429's message, and the setting of its per-team cap.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Work {
    /// `dry-run(s) grading`, `event stream(s) open`.
    pub taking: &'static str,
    /// `api.dry_runs_per_team`.
    pub per_team_setting: &'static str,
}

impl Busy {
    /// The 429's message.
    pub fn message(&self, work: Work) -> String {
        let Work { taking, per_team_setting } = work;
        match self {
            Busy::Host { at_once } => format!("{at_once} {taking} on this daemon already; retry in a second"),
            Busy::Team { per_team } => {
                format!("your team has {per_team} {taking} already ({per_team_setting}); retry when one ends")
            }
            Busy::Job { ranks } => {
                format!("this job's {ranks} rank(s) have one each of {taking} already; retry in a second")
            }
        }
    }
}

/// What is grading now.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Running {
    by_lane: HashMap<Lane, usize>,
    /// Team dry-runs over all teams (job lanes are not counted: they are reserved).
    teams_total: usize,
}

/// Whether `lane` may start one more grading now.
pub fn admit(running: &Running, caps: Caps, lane: &Lane) -> Result<(), Busy> {
    let mine = running.by_lane.get(lane).copied().unwrap_or(0);
    match lane {
        Lane::Job { ranks, .. } => {
            let ranks = (*ranks).max(1);
            if mine >= ranks { Err(Busy::Job { ranks }) } else { Ok(()) }
        }
        Lane::Team(_) if mine >= caps.per_team.max(1) => Err(Busy::Team { per_team: caps.per_team.max(1) }),
        Lane::Team(_) if running.teams_total >= caps.at_once.max(1) => {
            Err(Busy::Host { at_once: caps.at_once.max(1) })
        }
        Lane::Team(_) => Ok(()),
    }
}

impl Running {
    fn start(&mut self, lane: &Lane) {
        *self.by_lane.entry(lane.clone()).or_default() += 1;
        if matches!(lane, Lane::Team(_)) {
            self.teams_total += 1;
        }
    }

    fn end(&mut self, lane: &Lane) {
        if let Some(count) = self.by_lane.get_mut(lane) {
            *count -= 1;
            if *count == 0 {
                self.by_lane.remove(lane);
            }
            if matches!(lane, Lane::Team(_)) {
                self.teams_total -= 1;
            }
        }
    }
}

/// The counts of one kind of work, shared by its requests.
#[derive(Debug)]
pub struct Lanes {
    caps: Caps,
    work: Work,
    running: Mutex<Running>,
}

/// A place in a lane, given back when dropped.
#[derive(Debug)]
pub struct Ticket {
    lanes: Arc<Lanes>,
    lane: Lane,
}

impl Lanes {
    pub fn new(caps: Caps, work: Work) -> Arc<Self> {
        Arc::new(Lanes { caps, work, running: Mutex::new(Running::default()) })
    }

    /// A place for `lane`, or the 429's message.
    pub fn try_take(self: &Arc<Self>, lane: Lane) -> Result<Ticket, String> {
        let mut running = self.running.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        admit(&running, self.caps, &lane).map_err(|busy| busy.message(self.work))?;
        running.start(&lane);
        Ok(Ticket { lanes: Arc::clone(self), lane })
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        self.lanes.running.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).end(&self.lane);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn team(name: &str) -> Lane {
        Lane::Team(name.to_owned())
    }

    fn job(id: &str, ranks: usize) -> Lane {
        Lane::Job { id: id.to_owned(), ranks }
    }

    #[test]
    fn each_lane_is_capped_and_a_jobs_lane_is_reserved() {
        let caps = Caps { at_once: 2, per_team: 1 };
        // (running before, the one asking, the answer)
        let cases: Vec<(Vec<Lane>, Lane, Result<(), Busy>)> = vec![
            (vec![], team("a"), Ok(())),
            (vec![team("a")], team("a"), Err(Busy::Team { per_team: 1 })),
            (vec![team("a")], team("b"), Ok(())),
            (vec![team("a"), team("b")], team("c"), Err(Busy::Host { at_once: 2 })),
            // Every team slot taken: a job's ranks still grade, up to one request per rank.
            (vec![team("a"), team("b")], job("j", 2), Ok(())),
            (vec![team("a"), team("b"), job("j", 2)], job("j", 2), Ok(())),
            (vec![job("j", 2), job("j", 2)], job("j", 2), Err(Busy::Job { ranks: 2 })),
            (vec![job("j", 2), job("j", 2)], job("k", 1), Ok(())),
            // Jobs' grading takes no team's place.
            (vec![job("j", 2), job("k", 1)], team("a"), Ok(())),
            // A job of the same team as a dry-run: separate lanes.
            (vec![team("a")], job("j", 1), Ok(())),
            // Zero caps and ranks mean one.
            (vec![], job("z", 0), Ok(())),
            (vec![job("z", 0)], job("z", 0), Err(Busy::Job { ranks: 1 })),
        ];
        for (before, asking, want) in cases {
            let mut running = Running::default();
            for lane in &before {
                running.start(lane);
            }
            assert_eq!(admit(&running, caps, &asking), want, "{before:?} then {asking:?}");
        }
        let zero = Caps { at_once: 0, per_team: 0 };
        assert_eq!(admit(&Running::default(), zero, &team("a")), Ok(()));
    }

    #[test]
    fn a_ticket_holds_its_place_until_dropped() {
        let work = Work { taking: "dry-run(s) grading", per_team_setting: "api.dry_runs_per_team" };
        let lanes = Lanes::new(Caps { at_once: 2, per_team: 1 }, work);
        let first = lanes.try_take(team("a")).unwrap();
        assert_eq!(
            lanes.try_take(team("a")).unwrap_err(),
            "your team has 1 dry-run(s) grading already (api.dry_runs_per_team); retry when one ends"
        );
        let other = lanes.try_take(team("b")).unwrap();
        assert_eq!(
            lanes.try_take(team("c")).unwrap_err(),
            "2 dry-run(s) grading on this daemon already; retry in a second"
        );
        drop(first);
        let again = lanes.try_take(team("a")).unwrap();
        drop((again, other));
        assert_eq!(*lanes.running.lock().unwrap(), Running::default(), "every place given back");
    }
}
