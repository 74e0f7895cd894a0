//! `rlvrd simulate`: replays a trace of jobs with phase durations through the real policy
//! ([`Policy`]), next to a first-come-first-served baseline that gives each job whole devices for
//! its whole run, and reports each device's busy fraction and each job's wait and completion.
//!
//! A simulated job does what a worker does: after each admission it loads (`restart_s`), then
//! per step asks for its devices for the rollout, gives them back to verify on the CPU, asks again
//! for the update; every `eval_every` steps it asks for an evaluation. A preempted job finishes
//! its step, leaves, and is queued again with its progress and its original queue time.
//!
//! Pure: the clock is simulated; [`Trace::from_toml`] and the report's text are the only
//! formats. The daemon's own driver of the policy is in the serve loop.

use std::cmp::Ordering;
use std::collections::{BTreeMap, BinaryHeap};

use rlvr_protocol::spec::Priority;
use serde::{Deserialize, Serialize};

use super::policy::{Decision, Demand, Device, Phase, Policy, PolicyConfig};

/// A trace file (TOML).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Trace {
    pub devices: Vec<TraceDevice>,
    #[serde(default)]
    pub scheduler: TraceScheduler,
    pub jobs: Vec<TraceJob>,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TraceDevice {
    pub name: String,
    pub memory_gb: f64,
}

/// The policy's settings (as `[scheduler]` of the daemon's config).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TraceScheduler {
    pub starvation_after_s: f64,
    pub fair_share_half_life_s: f64,
    pub shares: BTreeMap<String, f64>,
}

impl Default for TraceScheduler {
    fn default() -> Self {
        let defaults = PolicyConfig::default();
        TraceScheduler {
            starvation_after_s: defaults.starvation_after_s,
            fair_share_half_life_s: defaults.fair_share_half_life_s,
            shares: defaults.shares,
        }
    }
}

/// One job: what it asks for and how long its phases take.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TraceJob {
    pub id: String,
    pub team: String,
    #[serde(default)]
    pub priority: Priority,
    pub submit_s: f64,
    #[serde(default = "one")]
    pub devices: u32,
    /// Per device, at the job's peak; absent: whole devices.
    pub memory_gb: Option<f64>,
    /// Of `memory_gb`, what it holds between phases; absent: all of it.
    #[serde(default)]
    pub resident_gb: Option<f64>,
    pub steps: u32,
    pub rollout_s: f64,
    /// CPU time between rollout and update: the devices are free for others meanwhile.
    #[serde(default)]
    pub verify_s: f64,
    pub update_s: f64,
    /// Steps between evaluations (0: none).
    #[serde(default)]
    pub eval_every: u32,
    #[serde(default)]
    pub eval_s: f64,
    /// Start-up after each admission (loading the model, resuming a checkpoint).
    #[serde(default)]
    pub restart_s: f64,
}

fn one() -> u32 {
    1
}

/// Why a trace cannot be replayed.
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    #[error("not a valid trace: {0}")]
    Parse(String),
    #[error("{0}")]
    Invalid(String),
}

impl Trace {
    pub fn from_toml(text: &str) -> Result<Trace, TraceError> {
        let trace: Trace = toml::from_str(text).map_err(|error: toml::de::Error| {
            let line = error
                .span()
                .and_then(|span| text.get(..span.start))
                .map(|before| before.matches('\n').count() + 1);
            let at = line.map(|line| format!(" (line {line})")).unwrap_or_default();
            TraceError::Parse(format!("{}{at}", error.message()))
        })?;
        trace.check()?;
        Ok(trace)
    }

    fn check(&self) -> Result<(), TraceError> {
        let invalid = |what: String| Err(TraceError::Invalid(what));
        if self.devices.is_empty() {
            return invalid("devices: expected at least one [[devices]]".to_owned());
        }
        for (n, device) in self.devices.iter().enumerate() {
            if !(device.memory_gb.is_finite() && device.memory_gb > 0.0) {
                return invalid(format!("devices[{n}].memory_gb: expected a number of GB above 0"));
            }
        }
        let policy = self.policy();
        let mut ids = std::collections::BTreeSet::new();
        for job in &self.jobs {
            let id = &job.id;
            if !ids.insert(id) {
                return invalid(format!("jobs: the id {id:?} is used twice"));
            }
            let times = [
                ("submit_s", job.submit_s),
                ("rollout_s", job.rollout_s),
                ("verify_s", job.verify_s),
                ("update_s", job.update_s),
                ("eval_s", job.eval_s),
                ("restart_s", job.restart_s),
            ];
            for (field, value) in times {
                if !(value.is_finite() && value >= 0.0) {
                    return invalid(format!("job {id}: {field}: expected seconds, at least 0, got {value}"));
                }
            }
            if job.steps == 0 {
                return invalid(format!("job {id}: steps: expected at least 1"));
            }
            policy.can_ever_fit(&demand(job)).or_else(|why| invalid(format!("job {id}: {why}")))?;
        }
        if self.jobs.is_empty() {
            return invalid("jobs: expected at least one [[jobs]]".to_owned());
        }
        Ok(())
    }

    fn policy(&self) -> Policy {
        let devices = self
            .devices
            .iter()
            .map(|device| Device { name: device.name.clone(), memory_gb: device.memory_gb, exclusive: false })
            .collect();
        let config = PolicyConfig {
            shares: self.scheduler.shares.clone(),
            starvation_after_s: self.scheduler.starvation_after_s,
            fair_share_half_life_s: self.scheduler.fair_share_half_life_s,
        };
        Policy::new(devices, config)
    }
}

fn demand(job: &TraceJob) -> Demand {
    Demand {
        job: job.id.clone(),
        team: job.team.clone(),
        priority: job.priority,
        devices: job.devices,
        memory_gb: job.memory_gb,
        resident_gb: job.resident_gb,
        queued_at: job.submit_s,
    }
}

/// How a schedule went.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Report {
    /// From the first submission to the last completion.
    pub makespan_s: f64,
    pub devices: Vec<DeviceReport>,
    pub jobs: Vec<JobReport>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DeviceReport {
    pub name: String,
    /// Time spent in rollout, update and evaluation phases.
    pub busy_s: f64,
    /// `busy_s` over the makespan.
    pub busy_fraction: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct JobReport {
    pub id: String,
    /// Submission to first admission.
    pub wait_s: f64,
    /// Submission to its last step.
    pub completion_s: f64,
    pub preemptions: u32,
}

impl Report {
    /// The devices' busy fractions averaged.
    pub fn mean_busy_fraction(&self) -> f64 {
        self.devices.iter().map(|device| device.busy_fraction).sum::<f64>() / self.devices.len().max(1) as f64
    }

    fn new(trace: &Trace, busy_s: Vec<f64>, jobs: Vec<JobReport>, end: f64) -> Report {
        let start = trace.jobs.iter().map(|job| job.submit_s).fold(f64::INFINITY, f64::min);
        let makespan_s = (end - start).max(0.0);
        let devices = trace
            .devices
            .iter()
            .zip(busy_s)
            .map(|(device, busy_s)| DeviceReport {
                name: device.name.clone(),
                busy_s,
                busy_fraction: if makespan_s > 0.0 { busy_s / makespan_s } else { 0.0 },
            })
            .collect();
        Report { makespan_s, devices, jobs }
    }
}

/// What a simulated job is doing.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Stage {
    Queued,
    Loading,
    Asking(Phase),
    Holding(Phase),
    Verifying,
    Done,
}

#[derive(Debug, Clone)]
struct SimJob {
    spec: TraceJob,
    stage: Stage,
    steps_done: u32,
    /// Asked to leave at its next step boundary.
    leaving: bool,
    first_admitted: Option<f64>,
    finished: Option<f64>,
    preemptions: u32,
}

#[derive(Debug, Clone, PartialEq)]
enum Event {
    Submit,
    Loaded,
    PhaseDone(Phase),
    VerifyDone,
}

/// An event at a time; the heap pops the earliest, then the first scheduled.
#[derive(Debug, Clone, PartialEq)]
struct Timed {
    at: f64,
    seq: u64,
    job: String,
    event: Event,
}

impl Eq for Timed {}

impl PartialOrd for Timed {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Timed {
    fn cmp(&self, other: &Self) -> Ordering {
        other.at.total_cmp(&self.at).then(other.seq.cmp(&self.seq))
    }
}

/// The replay of a trace through the policy.
struct Simulation {
    policy: Policy,
    jobs: BTreeMap<String, SimJob>,
    events: BinaryHeap<Timed>,
    seq: u64,
    busy_s: Vec<f64>,
}

impl Simulation {
    fn at(&mut self, at: f64, job: &str, event: Event) {
        self.seq += 1;
        self.events.push(Timed { at, seq: self.seq, job: job.to_owned(), event });
    }

    fn ask(&mut self, job: &str, phase: Phase, now: f64) {
        self.jobs.get_mut(job).expect("a simulated job").stage = Stage::Asking(phase);
        self.policy.request(job, phase, now).expect("an admitted job asks once at a time");
    }

    /// The job is at a step boundary: it leaves if asked to, ends after its last step, or goes on.
    fn step_boundary(&mut self, id: &str, now: f64) {
        let job = self.jobs.get_mut(id).expect("a simulated job");
        if job.steps_done >= job.spec.steps {
            job.stage = Stage::Done;
            job.finished = Some(now);
            self.policy.leave(id, now);
        } else if job.leaving {
            job.leaving = false;
            job.stage = Stage::Queued;
            job.preemptions += 1;
            let demand = demand(&job.spec);
            self.policy.leave(id, now);
            self.policy.enqueue(demand, now).expect("a job that left can queue again");
        } else {
            self.ask(id, Phase::Rollout, now);
        }
    }

    fn handle(&mut self, timed: Timed) {
        let Timed { at: now, job: id, event, .. } = timed;
        match event {
            Event::Submit => {
                let demand = demand(&self.jobs[&id].spec);
                self.policy.enqueue(demand, now).expect("each job is submitted once");
            }
            Event::Loaded => self.step_boundary(&id, now),
            Event::PhaseDone(phase) => {
                self.policy.release(&id, now);
                let job = self.jobs.get_mut(&id).expect("a simulated job");
                match phase {
                    Phase::Rollout => {
                        job.stage = Stage::Verifying;
                        let verify_s = job.spec.verify_s;
                        self.at(now + verify_s, &id, Event::VerifyDone);
                    }
                    Phase::Update => {
                        job.steps_done += 1;
                        let evaluate = job.spec.eval_every > 0 && job.steps_done % job.spec.eval_every == 0;
                        if evaluate {
                            self.ask(&id, Phase::Eval, now);
                        } else {
                            self.step_boundary(&id, now);
                        }
                    }
                    Phase::Eval => self.step_boundary(&id, now),
                    // The simulated jobs grade on the CPU only (`verify_s`): never asked for.
                    Phase::Reward => self.ask(&id, Phase::Update, now),
                }
            }
            Event::VerifyDone => self.ask(&id, Phase::Update, now),
        }
    }

    fn apply(&mut self, decisions: Vec<Decision>, now: f64) {
        for decision in decisions {
            match decision {
                Decision::Admit { job: id, .. } => {
                    let job = self.jobs.get_mut(&id).expect("a simulated job");
                    job.stage = Stage::Loading;
                    job.first_admitted.get_or_insert(now);
                    let restart_s = job.spec.restart_s;
                    self.at(now + restart_s, &id, Event::Loaded);
                }
                Decision::Preempt { job: id, .. } => {
                    let job = self.jobs.get_mut(&id).expect("a simulated job");
                    job.leaving = true;
                    // Waiting for its first phase of a step, it is at a boundary already.
                    if job.stage == Stage::Asking(Phase::Rollout) {
                        self.policy.release(&id, now);
                        self.step_boundary(&id, now);
                    }
                }
                Decision::Grant { job: id, phase } => {
                    let job = self.jobs.get_mut(&id).expect("a simulated job");
                    job.stage = Stage::Holding(phase);
                    let spec = &job.spec;
                    let hold = match phase {
                        Phase::Rollout => spec.rollout_s,
                        Phase::Update => spec.update_s,
                        Phase::Eval => spec.eval_s,
                        Phase::Reward => 0.0,
                    };
                    for &device in self.policy.devices_of(&id).unwrap_or_default() {
                        self.busy_s[device] += hold;
                    }
                    self.at(now + hold, &id, Event::PhaseDone(phase));
                }
            }
        }
    }
}

/// Replays `trace` through the policy.
pub fn simulate(trace: &Trace) -> Report {
    let mut sim = Simulation {
        policy: trace.policy(),
        jobs: BTreeMap::new(),
        events: BinaryHeap::new(),
        seq: 0,
        busy_s: vec![0.0; trace.devices.len()],
    };
    for job in &trace.jobs {
        let state = SimJob {
            spec: job.clone(),
            stage: Stage::Queued,
            steps_done: 0,
            leaving: false,
            first_admitted: None,
            finished: None,
            preemptions: 0,
        };
        sim.jobs.insert(job.id.clone(), state);
        sim.at(job.submit_s, &job.id, Event::Submit);
    }
    while let Some(timed) = sim.events.pop() {
        let now = timed.at;
        sim.handle(timed);
        // Everything at this instant first, then the policy decides once for all of it.
        if sim.events.peek().is_some_and(|next| next.at == now) {
            continue;
        }
        loop {
            let decisions = sim.policy.decide(now);
            if decisions.is_empty() {
                break;
            }
            sim.apply(decisions, now);
        }
    }
    let end = sim.jobs.values().filter_map(|job| job.finished).fold(f64::NEG_INFINITY, f64::max);
    let jobs = trace
        .jobs
        .iter()
        .map(|spec| {
            let job = &sim.jobs[&spec.id];
            let finished = job.finished.expect("every job of a checked trace ends");
            JobReport {
                id: spec.id.clone(),
                wait_s: job.first_admitted.unwrap_or(finished) - spec.submit_s,
                completion_s: finished - spec.submit_s,
                preemptions: job.preemptions,
            }
        })
        .collect();
    Report::new(trace, sim.busy_s, jobs, end)
}

/// First come, first served, each job on whole devices from its start to its end: the way
/// jobs share a machine without a scheduler. A job starts when enough devices are free and
/// never before one submitted earlier.
pub fn baseline(trace: &Trace) -> Report {
    let mut order: Vec<&TraceJob> = trace.jobs.iter().collect();
    order.sort_by(|a, b| a.submit_s.total_cmp(&b.submit_s));
    let mut free_at = vec![f64::NEG_INFINITY; trace.devices.len()];
    let mut busy_s = vec![0.0; trace.devices.len()];
    let mut last_start = f64::NEG_INFINITY;
    let mut reports = BTreeMap::new();
    let mut end = f64::NEG_INFINITY;
    for job in order {
        let evals = job.steps.checked_div(job.eval_every).unwrap_or(0) as f64;
        let device_time = job.steps as f64 * (job.rollout_s + job.update_s) + evals * job.eval_s;
        let duration = job.restart_s + job.steps as f64 * job.verify_s + device_time;
        // The earliest-free devices, as many as it needs.
        let mut devices: Vec<usize> = (0..free_at.len()).collect();
        devices.sort_by(|&a, &b| free_at[a].total_cmp(&free_at[b]).then(a.cmp(&b)));
        devices.truncate(job.devices as usize);
        let ready = devices.iter().map(|&d| free_at[d]).fold(f64::NEG_INFINITY, f64::max);
        let start = job.submit_s.max(ready).max(last_start);
        last_start = start;
        for &device in &devices {
            free_at[device] = start + duration;
            busy_s[device] += device_time;
        }
        end = end.max(start + duration);
        let report = JobReport {
            id: job.id.clone(),
            wait_s: start - job.submit_s,
            completion_s: start + duration - job.submit_s,
            preemptions: 0,
        };
        reports.insert(job.id.clone(), report);
    }
    let jobs = trace.jobs.iter().map(|job| reports[&job.id].clone()).collect();
    Report::new(trace, busy_s, jobs, end)
}

/// The two reports side by side, as markdown tables.
pub fn render(policy: &Report, baseline: &Report) -> String {
    let percent = |fraction: f64| format!("{:.1}%", fraction * 100.0);
    let mut out = String::new();
    out.push_str("| device | busy (rlvr policy) | busy (FCFS whole devices) |\n|---|---:|---:|\n");
    for (ours, theirs) in policy.devices.iter().zip(&baseline.devices) {
        out.push_str(&format!(
            "| {} | {} | {} |\n",
            ours.name,
            percent(ours.busy_fraction),
            percent(theirs.busy_fraction)
        ));
    }
    out.push_str(&format!(
        "| **mean** | **{}** | **{}** |\n",
        percent(policy.mean_busy_fraction()),
        percent(baseline.mean_busy_fraction())
    ));
    out.push_str(&format!("| makespan | {:.1} s | {:.1} s |\n\n", policy.makespan_s, baseline.makespan_s));
    out.push_str(
        "| job | wait (policy) | completion (policy) | preemptions | wait (FCFS) | completion (FCFS) |\n\
         |---|---:|---:|---:|---:|---:|\n",
    );
    for (ours, theirs) in policy.jobs.iter().zip(&baseline.jobs) {
        out.push_str(&format!(
            "| {} | {:.1} s | {:.1} s | {} | {:.1} s | {:.1} s |\n",
            ours.id, ours.wait_s, ours.completion_s, ours.preemptions, theirs.wait_s, theirs.completion_s
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const THREE_ON_ONE: &str = r#"
        [[devices]]
        name = "gpu0"
        memory_gb = 80

        [[jobs]]
        id = "a"
        team = "t1"
        submit_s = 0
        memory_gb = 20
        steps = 10
        rollout_s = 2.0
        verify_s = 1.5
        update_s = 1.0

        [[jobs]]
        id = "b"
        team = "t2"
        submit_s = 0
        memory_gb = 20
        steps = 10
        rollout_s = 2.0
        verify_s = 1.5
        update_s = 1.0

        [[jobs]]
        id = "c"
        team = "t3"
        submit_s = 0
        memory_gb = 20
        steps = 10
        rollout_s = 2.0
        verify_s = 1.5
        update_s = 1.0
    "#;

    #[test]
    fn interleaved_phases_keep_the_device_busy_where_whole_device_fcfs_idles_in_verification() {
        let trace = Trace::from_toml(THREE_ON_ONE).unwrap();
        let ours = simulate(&trace);
        let fcfs = baseline(&trace);
        // Device work is 3 jobs × 10 steps × 3 s = 90 s either way.
        assert!((ours.devices[0].busy_s - 90.0).abs() < 1e-9);
        assert!((fcfs.devices[0].busy_s - 90.0).abs() < 1e-9);
        // FCFS: 3 × 10 × 4.5 s back to back; the device idles in each 1.5 s of verification.
        assert!((fcfs.makespan_s - 135.0).abs() < 1e-9, "{fcfs:?}");
        // The policy: the device is the bottleneck; only the last job's last verification
        // (1.5 s) can leave it idle.
        assert!(ours.makespan_s <= 91.5 + 1e-9, "{ours:?}");
        assert!(ours.mean_busy_fraction() >= 0.98, "{ours:?}");
        assert_eq!(ours.jobs.iter().map(|job| job.wait_s).collect::<Vec<_>>(), [0.0, 0.0, 0.0]);
    }

    #[test]
    fn a_preempted_job_finishes_its_step_leaves_and_resumes_where_it_stopped() {
        let trace = Trace::from_toml(
            r#"
            [[devices]]
            name = "gpu0"
            memory_gb = 80

            [[jobs]]
            id = "low"
            team = "t"
            priority = "low"
            submit_s = 0
            steps = 4
            rollout_s = 1.0
            update_s = 1.0
            restart_s = 0.5

            [[jobs]]
            id = "high"
            team = "t"
            priority = "high"
            submit_s = 1.2
            steps = 1
            rollout_s = 1.0
            update_s = 1.0
            "#,
        )
        .unwrap();
        let report = simulate(&trace);
        let low = &report.jobs[0];
        let high = &report.jobs[1];
        // low: loads 0–0.5, step 1 0.5–2.5 (preempted at 1.2, finishes the step), leaves.
        // high: 2.5–4.5. low: reloads 4.5–5.0, steps 2–4 5.0–11.0.
        assert_eq!(low.preemptions, 1);
        assert!((high.wait_s - 1.3).abs() < 1e-9, "{high:?}");
        assert!((low.completion_s - 11.0).abs() < 1e-9, "{low:?}");
        assert!((report.devices[0].busy_s - 10.0).abs() < 1e-9);
    }

    #[test]
    fn a_trace_that_cannot_run_names_the_job_and_field() {
        let error = |text: &str| Trace::from_toml(text).unwrap_err().to_string();
        let device = "[[devices]]\nname = \"gpu0\"\nmemory_gb = 40\n";
        let job = |extra: &str| {
            format!(
                "{device}[[jobs]]\nid = \"j\"\nteam = \"t\"\nsubmit_s = 0\nsteps = 1\nrollout_s = 1\nupdate_s = 1\n{extra}"
            )
        };
        assert!(
            error(&job("memory_gb = 80\n")).starts_with("job j: resources.memory_gb: 1 device(s) with 80 GB")
        );
        assert_eq!(error(&job("verify_s = -1\n")), "job j: verify_s: expected seconds, at least 0, got -1");
        assert!(
            error(&job("colour = 1\n")).contains("unknown field `colour`"),
            "{}",
            error(&job("colour = 1\n"))
        );
        assert_eq!(error(device), "not a valid trace: missing field `jobs` (line 1)");
        assert_eq!(
            error("devices = 3"),
            "not a valid trace: invalid type: integer `3`, expected a sequence (line 1)"
        );
    }
}
