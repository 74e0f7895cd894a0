//! The scheduling policy (design.md §7): which waiting job is admitted onto which devices, which
//! worker gets the device for its next phase, and which jobs are preempted to make room.
//!
//! Pure: events in ([`Policy::enqueue`], [`Policy::request`], [`Policy::leave`], …), decisions
//! out ([`Policy::decide`]); time is a parameter; no IO, no clock. The daemon's scheduler and
//! `rlvrd simulate` drive this same type, so the simulator's figures are the policy's.
//!
//! - **Admission**: a job asks for `devices` devices with `memory_gb` on each at its peak, of
//!   which it holds `resident_gb` between phases (none: whole devices; on an exclusive device,
//!   always the whole device). Since a device serves one phase at a time, the jobs on a device
//!   need their resident parts plus the largest of their phase parts. A job is admitted when all
//!   its devices fit at once (best-fit memory packing), most urgent
//!   first, then the team furthest below its fair share, then the oldest. A team's fair-share
//!   standing is the capacity it holds now plus its recent use, over its weight; use is capacity
//!   held plus devices granted, fading with a half-life of `fair_share_half_life_s`. So after one
//!   team's job another's goes first, and jobs sharing a device even out their device time. A job that cannot fit
//!   lets smaller ones behind it run (backfill), unless it has waited `starvation_after_s`: then
//!   nothing passes it until it runs.
//! - **Quotas**: a team's guaranteed share is a fraction of the inventory's capacity (memory on
//!   each device, summed over devices). A team may borrow idle capacity beyond it; its jobs past
//!   its share, newest first, are *borrowing* and are the first taken back when another team
//!   claims its share.
//! - **Preemption**: a job that cannot fit may take the room of jobs that are borrowing while it
//!   is within its own share, or of lower-priority jobs (of its own team, borrowing ones, or any
//!   when it is within its share). The cheapest set is chosen: lowest priority, borrowing first,
//!   newest first; then any victim not needed is spared. Victims leave at their next step boundary
//!   (the driver's job); until then the preempting job holds the line.
//! - **Grants**: an admitted job's worker asks for its devices before each device phase (rollout,
//!   update, evaluation) and gives them back after; a device serves one phase at a time. Requests
//!   are served in the admission order's terms (priority, fair share, then the oldest request);
//!   a request that must wait reserves its devices, so a later one never overtakes it there.

use std::collections::{BTreeMap, BTreeSet};

use rlvr_protocol::spec::Priority;

/// Slack for comparing sums of floating-point shares and memory.
const EPSILON: f64 = 1e-9;

/// One device of the inventory (a GPU, or a CPU slot).
#[derive(Debug, Clone, PartialEq)]
pub struct Device {
    pub name: String,
    pub memory_gb: f64,
    /// One job at a time, whatever its memory: a GPU in exclusive-process compute mode, where a
    /// second worker could not open the device. Its job holds all of it.
    pub exclusive: bool,
}

/// What a job asks for.
#[derive(Debug, Clone, PartialEq)]
pub struct Demand {
    pub job: String,
    pub team: String,
    pub priority: Priority,
    /// Devices it needs at once.
    pub devices: u32,
    /// Memory it needs on each at its peak; `None` takes whole devices.
    pub memory_gb: Option<f64>,
    /// Of `memory_gb`, what it holds between its phases; the rest only while a phase of its runs
    /// (a device serves one phase at a time). `None`: all of `memory_gb`.
    pub resident_gb: Option<f64>,
    /// When it was first queued, in seconds: the age order. A preempted job keeps its own.
    pub queued_at: f64,
}

/// The policy's settings.
#[derive(Debug, Clone, PartialEq)]
pub struct PolicyConfig {
    /// Guaranteed shares of the inventory's capacity by team (each in (0, 1], summing to ≤ 1).
    /// Teams not named share what is left equally, for fair-share order only.
    pub shares: BTreeMap<String, f64>,
    /// A job waiting this long (seconds) stops backfill past it.
    pub starvation_after_s: f64,
    /// How fast a team's past use of the devices fades from its fair-share standing.
    pub fair_share_half_life_s: f64,
}

impl Default for PolicyConfig {
    fn default() -> Self {
        PolicyConfig { shares: BTreeMap::new(), starvation_after_s: 600.0, fair_share_half_life_s: 3600.0 }
    }
}

pub use rlvr_protocol::grants::Phase;

/// What the driver must do.
#[derive(Debug, Clone, PartialEq)]
pub enum Decision {
    /// Start the job on these devices (indexes into the inventory).
    Admit { job: String, devices: Vec<usize> },
    /// Ask the job to checkpoint at its next step boundary and leave, to make room for `for_job`;
    /// then call [`Policy::leave`] (and [`Policy::enqueue`] to requeue it).
    Preempt { job: String, for_job: String },
    /// The job's worker may run `phase` on its devices now; it calls [`Policy::release`] after.
    Grant { job: String, phase: Phase },
}

/// A place in line; smaller goes first.
#[derive(Debug, Clone, PartialEq)]
struct Rank {
    priority: Priority,
    fair_share: f64,
    since: f64,
    job: String,
}

impl Eq for Rank {}

impl PartialOrd for Rank {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Rank {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        other
            .priority
            .cmp(&self.priority)
            .then(self.fair_share.total_cmp(&other.fair_share))
            .then(self.since.total_cmp(&other.since))
            .then_with(|| self.job.cmp(&other.job))
    }
}

/// An admitted job.
#[derive(Debug, Clone)]
struct Admitted {
    demand: Demand,
    devices: Vec<usize>,
    /// Memory it needs on each of its devices at its peak.
    memory_gb: f64,
    /// Of that, what it holds between phases.
    resident_gb: f64,
    admitted_at: f64,
    /// Asked to leave (preempted); its room is not free until it has.
    leaving: bool,
    granted: Option<Phase>,
    /// A phase asked for, and when.
    request: Option<(Phase, f64)>,
}

/// The scheduling state of one daemon's devices.
#[derive(Debug, Clone)]
pub struct Policy {
    devices: Vec<Device>,
    config: PolicyConfig,
    waiting: BTreeMap<String, Demand>,
    admitted: BTreeMap<String, Admitted>,
    /// Each team's recent use: its holdings averaged with exponentially fading weights.
    recent_use: BTreeMap<String, f64>,
    /// The time the state was last brought up to ([`Policy::advance`]).
    clock: f64,
}

/// Why a job can never run on an inventory: the `[resources]` field at fault and why.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct FitProblem {
    pub field: &'static str,
    pub message: String,
}

/// Why an event does not apply.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum PolicyError {
    #[error("job {0} is already waiting or admitted")]
    Known(String),
    #[error("job {0} is not admitted")]
    NotAdmitted(String),
    #[error("job {0} has a phase granted or asked for already")]
    Busy(String),
}

impl Policy {
    pub fn new(devices: Vec<Device>, config: PolicyConfig) -> Self {
        Policy {
            devices,
            config,
            waiting: BTreeMap::new(),
            admitted: BTreeMap::new(),
            recent_use: BTreeMap::new(),
            clock: f64::NEG_INFINITY,
        }
    }

    /// Why `demand` can never run on this inventory, even alone; `Ok` when it can.
    pub fn can_ever_fit(&self, demand: &Demand) -> Result<(), FitProblem> {
        let wanted = demand.devices as usize;
        if wanted == 0 {
            return Err(FitProblem { field: "resources.devices", message: "expected at least 1".to_owned() });
        }
        let big_enough = match demand.memory_gb {
            None => self.devices.len(),
            Some(memory) => self.devices.iter().filter(|device| device.memory_gb + EPSILON >= memory).count(),
        };
        if big_enough >= wanted {
            return Ok(());
        }
        let inventory = self
            .devices
            .iter()
            .map(|device| format!("{} {} GB", device.name, device.memory_gb))
            .collect::<Vec<_>>()
            .join(", ");
        Err(match demand.memory_gb {
            Some(memory) if big_enough < self.devices.len().min(wanted) => FitProblem {
                field: "resources.memory_gb",
                message: format!(
                    "{wanted} device(s) with {memory} GB each never fit here: {big_enough} of this daemon's devices \
                     have that much ({inventory})"
                ),
            },
            _ => FitProblem {
                field: "resources.devices",
                message: format!(
                    "{wanted} devices never fit here: this daemon has {} ({inventory})",
                    self.devices.len()
                ),
            },
        })
    }

    /// A job wants admission.
    pub fn enqueue(&mut self, demand: Demand, now: f64) -> Result<(), PolicyError> {
        self.advance(now);
        if self.waiting.contains_key(&demand.job) || self.admitted.contains_key(&demand.job) {
            return Err(PolicyError::Known(demand.job));
        }
        self.waiting.insert(demand.job.clone(), demand);
        Ok(())
    }

    /// A job leaves: a waiting one stops waiting, an admitted one frees its devices and grant
    /// (it ended, crashed, was cancelled or preempted). Unknown jobs are ignored.
    pub fn leave(&mut self, job: &str, now: f64) {
        self.advance(now);
        self.waiting.remove(job);
        self.admitted.remove(job);
    }

    /// An admitted job's worker asks for its devices for `phase`.
    pub fn request(&mut self, job: &str, phase: Phase, now: f64) -> Result<(), PolicyError> {
        self.advance(now);
        let admitted = self.admitted.get_mut(job).ok_or_else(|| PolicyError::NotAdmitted(job.to_owned()))?;
        if admitted.granted.is_some() || admitted.request.is_some() {
            return Err(PolicyError::Busy(job.to_owned()));
        }
        admitted.request = Some((phase, now));
        Ok(())
    }

    /// The job's worker is done with its grant (or gave up asking). Returns whether it held or
    /// asked for one.
    pub fn release(&mut self, job: &str, now: f64) -> bool {
        self.advance(now);
        match self.admitted.get_mut(job) {
            Some(admitted) => admitted.granted.take().is_some() | admitted.request.take().is_some(),
            None => false,
        }
    }

    /// The devices of an admitted job.
    pub fn devices_of(&self, job: &str) -> Option<&[usize]> {
        self.admitted.get(job).map(|admitted| admitted.devices.as_slice())
    }

    /// Whether the job is waiting for a grant.
    pub fn is_waiting_for_grant(&self, job: &str) -> bool {
        self.admitted.get(job).is_some_and(|admitted| admitted.request.is_some())
    }

    /// Grant requests not served yet.
    pub fn grants_waiting(&self) -> usize {
        self.admitted.values().filter(|admitted| admitted.request.is_some()).count()
    }

    /// Everything that can happen now: admissions, preemptions, grants — already applied to the
    /// state (a preempted job stays admitted, leaving, until [`Policy::leave`]).
    pub fn decide(&mut self, now: f64) -> Vec<Decision> {
        self.advance(now);
        let mut decisions = self.admit(now);
        decisions.extend(self.grant());
        decisions
    }

    /// Brings each team's recent use up to `now`: over the time since the last event the team
    /// held, and was granted, what it is now (both change only at events). Time never runs
    /// backwards here.
    fn advance(&mut self, now: f64) {
        let elapsed = now - self.clock;
        self.clock = self.clock.max(now);
        if !(elapsed > 0.0 && elapsed.is_finite()) {
            return;
        }
        let kept = 0.5f64.powf(elapsed / self.config.fair_share_half_life_s.max(EPSILON));
        let teams: BTreeSet<String> = self
            .recent_use
            .keys()
            .cloned()
            .chain(self.admitted.values().map(|admitted| admitted.demand.team.clone()))
            .collect();
        for team in teams {
            let holding = self.team_usage(&team) + self.team_granted(&team);
            let recent = self.recent_use.entry(team).or_insert(0.0);
            *recent = *recent * kept + holding * (1.0 - kept);
        }
        self.recent_use.retain(|_, recent| *recent > EPSILON);
    }

    fn admit(&mut self, now: f64) -> Vec<Decision> {
        let mut decisions = Vec::new();
        // Looked at this round and let others pass (backfill).
        let mut passed: BTreeSet<String> = BTreeSet::new();
        // Ranked afresh each time: every admission moves its team's fair share.
        while let Some(demand) = self
            .waiting
            .values()
            .filter(|demand| !passed.contains(&demand.job))
            .min_by_key(|demand| self.rank(&demand.team, demand.priority, demand.queued_at, &demand.job))
            .cloned()
        {
            if let Some(devices) = self.place(&demand, &BTreeSet::new(), false) {
                let memory_gb = self.memory_per_device(&demand, &devices);
                let resident_gb = demand.resident_gb.map_or(memory_gb, |resident| resident.min(memory_gb));
                self.waiting.remove(&demand.job);
                decisions.push(Decision::Admit { job: demand.job.clone(), devices: devices.clone() });
                let admitted = Admitted {
                    demand,
                    devices,
                    memory_gb,
                    resident_gb,
                    admitted_at: now,
                    leaving: false,
                    granted: None,
                    request: None,
                };
                self.admitted.insert(admitted.demand.job.clone(), admitted);
                continue;
            }
            // Room is being made for it already: nothing passes it meanwhile.
            if self.place(&demand, &BTreeSet::new(), true).is_some() {
                break;
            }
            if let Some(victims) = self.victims(&demand) {
                for victim in victims {
                    if let Some(admitted) = self.admitted.get_mut(&victim) {
                        admitted.leaving = true;
                    }
                    decisions.push(Decision::Preempt { job: victim, for_job: demand.job.clone() });
                }
                break;
            }
            if now - demand.queued_at >= self.config.starvation_after_s {
                break;
            }
            passed.insert(demand.job);
        }
        decisions
    }

    fn grant(&mut self) -> Vec<Decision> {
        let mut busy: BTreeSet<usize> = BTreeSet::new();
        for admitted in self.admitted.values().filter(|admitted| admitted.granted.is_some()) {
            busy.extend(&admitted.devices);
        }
        let mut requests: Vec<Rank> = self
            .admitted
            .iter()
            .filter_map(|(job, admitted)| {
                let (_, at) = admitted.request?;
                Some(self.rank(&admitted.demand.team, admitted.demand.priority, at, job))
            })
            .collect();
        requests.sort();
        let mut decisions = Vec::new();
        let mut reserved: BTreeSet<usize> = BTreeSet::new();
        for Rank { job, .. } in requests {
            let admitted = self.admitted.get_mut(&job).expect("a request of an admitted job");
            let devices = &admitted.devices;
            if devices.iter().any(|device| busy.contains(device) || reserved.contains(device)) {
                reserved.extend(devices);
                continue;
            }
            busy.extend(devices);
            let (phase, _) = admitted.request.take().expect("a request");
            admitted.granted = Some(phase);
            decisions.push(Decision::Grant { job, phase });
        }
        decisions
    }

    /// The order of admissions and of grants: most urgent, then the team furthest below its
    /// share, then the oldest (`since`: queued, or asked for the grant).
    fn rank(&self, team: &str, priority: Priority, since: f64, job: &str) -> Rank {
        Rank { priority, fair_share: self.fair_share_key(team), since, job: job.to_owned() }
    }

    /// A team's standing: what it holds now and held recently, over its weight; lower goes first.
    fn fair_share_key(&self, team: &str) -> f64 {
        let recent = self.recent_use.get(team).copied().unwrap_or(0.0);
        (self.team_usage(team) + recent) / self.weight(team).max(EPSILON)
    }

    /// A team's guaranteed share, or for a team without one an equal part of what is left.
    fn weight(&self, team: &str) -> f64 {
        if let Some(share) = self.config.shares.get(team) {
            return *share;
        }
        let reserved: f64 = self.config.shares.values().sum();
        let unnamed: BTreeSet<&str> = self
            .waiting
            .values()
            .map(|demand| demand.team.as_str())
            .chain(self.admitted.values().map(|admitted| admitted.demand.team.as_str()))
            .chain([team])
            .filter(|team| !self.config.shares.contains_key(*team))
            .collect();
        (1.0 - reserved).max(0.0) / unnamed.len() as f64
    }

    /// The fraction of the inventory's capacity a team holds.
    fn team_usage(&self, team: &str) -> f64 {
        self.admitted.values().filter(|admitted| admitted.demand.team == team).map(|a| self.usage(a)).sum()
    }

    /// The fraction of the inventory's devices serving a team's phases now.
    fn team_granted(&self, team: &str) -> f64 {
        let granted: usize = self
            .admitted
            .values()
            .filter(|admitted| admitted.demand.team == team && admitted.granted.is_some())
            .map(|admitted| admitted.devices.len())
            .sum();
        granted as f64 / self.devices.len() as f64
    }

    /// The fraction of the inventory's capacity an admitted job holds.
    fn usage(&self, admitted: &Admitted) -> f64 {
        self.held(admitted.memory_gb, &admitted.devices)
    }

    /// What `demand` would hold, placed on `devices`.
    fn usage_on(&self, demand: &Demand, devices: &[usize]) -> f64 {
        self.held(self.memory_per_device(demand, devices), devices)
    }

    /// The fraction of the inventory's capacity `memory_gb` on each of `devices` holds: all of an
    /// exclusive device.
    fn held(&self, memory_gb: f64, devices: &[usize]) -> f64 {
        let fraction = |d: usize| {
            let device = &self.devices[d];
            if device.exclusive { 1.0 } else { memory_gb / device.memory_gb }
        };
        devices.iter().map(|&d| fraction(d)).sum::<f64>() / self.devices.len() as f64
    }

    /// The memory a job holds on each of its devices: what it asked for, or a whole device.
    fn memory_per_device(&self, demand: &Demand, devices: &[usize]) -> f64 {
        match demand.memory_gb {
            Some(memory) => memory,
            None => devices.iter().map(|&d| self.devices[d].memory_gb).fold(0.0, f64::max),
        }
    }

    /// Admitted jobs past their team's share, newest first within a team.
    fn borrowing(&self) -> BTreeSet<String> {
        let mut by_team: BTreeMap<&str, Vec<&Admitted>> = BTreeMap::new();
        for admitted in self.admitted.values() {
            by_team.entry(admitted.demand.team.as_str()).or_default().push(admitted);
        }
        let mut borrowing = BTreeSet::new();
        for (team, mut jobs) in by_team {
            let share = self.config.shares.get(team).copied().unwrap_or(0.0);
            jobs.sort_by(|a, b| {
                a.admitted_at.total_cmp(&b.admitted_at).then_with(|| a.demand.job.cmp(&b.demand.job))
            });
            let mut used = 0.0;
            for admitted in jobs {
                used += self.usage(admitted);
                if used > share + EPSILON {
                    borrowing.insert(admitted.demand.job.clone());
                }
            }
        }
        borrowing
    }

    /// Whether `demand`, placed as it would be, keeps its team within its guaranteed share.
    fn within_share(&self, demand: &Demand) -> bool {
        let Some(share) = self.config.shares.get(&demand.team) else { return false };
        let all: BTreeSet<String> = self.admitted.keys().cloned().collect();
        // Its size as if the inventory were empty: where it lands does not change its share.
        let size =
            self.place(demand, &all, false).map_or(f64::INFINITY, |devices| self.usage_on(demand, &devices));
        self.team_usage(&demand.team) + size <= share + EPSILON
    }

    /// Devices for `demand`: best fit (the least free memory that is enough), all or none.
    /// `ignoring`: admitted jobs counted as gone; `leaving_gone`: jobs asked to leave too.
    ///
    /// A device serves one phase at a time, so its jobs need the sum of what each holds between
    /// phases (resident) plus the largest of what one phase adds (peak − resident).
    fn place(&self, demand: &Demand, ignoring: &BTreeSet<String>, leaving_gone: bool) -> Option<Vec<usize>> {
        let count = self.devices.len();
        let (mut resident, mut phase, mut used) = (vec![0.0; count], vec![0.0f64; count], vec![false; count]);
        for (job, admitted) in &self.admitted {
            if ignoring.contains(job) || (leaving_gone && admitted.leaving) {
                continue;
            }
            for &device in &admitted.devices {
                resident[device] += admitted.resident_gb;
                phase[device] = phase[device].max(admitted.memory_gb - admitted.resident_gb);
                used[device] = true;
            }
        }
        let free: Vec<f64> = (0..count).map(|d| self.devices[d].memory_gb - resident[d] - phase[d]).collect();
        let fits = |d: usize, memory: f64| {
            let own_resident = demand.resident_gb.map_or(memory, |r| r.min(memory));
            let needed = resident[d] + own_resident + phase[d].max(memory - own_resident);
            needed <= self.devices[d].memory_gb + EPSILON
        };
        let mut candidates: Vec<usize> = (0..count)
            .filter(|&d| match demand.memory_gb {
                _ if self.devices[d].exclusive && used[d] => false,
                Some(memory) => fits(d, memory),
                None => !used[d],
            })
            .collect();
        candidates.sort_by(|&a, &b| free[a].total_cmp(&free[b]).then(a.cmp(&b)));
        let wanted = demand.devices as usize;
        if wanted == 0 || candidates.len() < wanted {
            return None;
        }
        let mut chosen = candidates[..wanted].to_vec();
        chosen.sort_unstable();
        Some(chosen)
    }

    /// The cheapest set of admitted jobs whose leaving lets `demand` in, if any.
    fn victims(&self, demand: &Demand) -> Option<Vec<String>> {
        let borrowing = self.borrowing();
        let within_share = self.within_share(demand);
        let mut candidates: Vec<&Admitted> = self
            .admitted
            .values()
            .filter(|admitted| !admitted.leaving)
            .filter(|admitted| {
                let victim = &admitted.demand;
                let borrows = borrowing.contains(&victim.job);
                let lower = victim.priority < demand.priority;
                (within_share && borrows)
                    || (lower && (within_share || borrows || victim.team == demand.team))
            })
            .collect();
        // Cheapest first: lowest priority, borrowing, newest.
        candidates.sort_by(|a, b| {
            a.demand
                .priority
                .cmp(&b.demand.priority)
                .then_with(|| borrowing.contains(&b.demand.job).cmp(&borrowing.contains(&a.demand.job)))
                .then(b.admitted_at.total_cmp(&a.admitted_at))
                .then_with(|| a.demand.job.cmp(&b.demand.job))
        });
        let mut chosen: Vec<String> = Vec::new();
        let mut gone: BTreeSet<String> = BTreeSet::new();
        for candidate in candidates {
            gone.insert(candidate.demand.job.clone());
            chosen.push(candidate.demand.job.clone());
            if self.place(demand, &gone, true).is_some() {
                // Spare any victim the others make unnecessary, the costliest first.
                for job in chosen.clone().iter().rev() {
                    gone.remove(job);
                    if self.place(demand, &gone, true).is_some() {
                        chosen.retain(|kept| kept != job);
                    } else {
                        gone.insert(job.clone());
                    }
                }
                return Some(chosen);
            }
        }
        None
    }
}

#[cfg(test)]
#[path = "policy_tests.rs"]
mod tests;
