//! What a pipeline does next (**pure**): its record and its running stage's job in, one action
//! out. The shell ([`super::drive`]) reads both from Redis, applies the action, and asks again;
//! a daemon killed at any point asks again on restart and gets the action it had not finished,
//! because every action is keyed by the stage it is for and the store applies it only once.

use rlvr_protocol::job::JobState;
use rlvr_protocol::pipeline::{PipelineState, StageOutput};

/// A pipeline as its record says.
#[derive(Debug, Clone, PartialEq)]
pub struct Snapshot {
    pub state: PipelineState,
    /// How many stages it has.
    pub stages: u32,
    /// The stage it is at.
    pub stage: u32,
    pub cancel_requested: bool,
    /// The job recorded for that stage, if one is.
    pub job_id: Option<String>,
    /// That job, if it exists (`None`: none recorded, or recorded and never created).
    pub job: Option<StageJob>,
    /// What the stage before handed on.
    pub previous: Option<StageOutput>,
}

/// A stage's job, as far as the pipeline cares.
#[derive(Debug, Clone, PartialEq)]
pub struct StageJob {
    pub state: JobState,
    pub reason: String,
    /// What it handed on: its published version (or, for a job whose output is a dataset, the
    /// dataset it recorded).
    pub output: Option<StageOutput>,
}

/// The one thing to do.
#[derive(Debug, Clone, PartialEq)]
pub enum Next {
    /// Nothing now: the stage's job is on its way, or the pipeline has ended.
    Wait,
    /// Create stage `stage`'s job from its spec with `input` written in: as job `job_id` when
    /// one is recorded already (a daemon died between recording it and creating the job), else
    /// under a new id, recorded first.
    Submit { stage: u32, job_id: Option<String>, input: Option<StageOutput> },
    /// A cancel was asked for: stop the running stage's job.
    CancelJob { job_id: String },
    /// Stage `stage` succeeded: record its output and go on (or end `succeeded` after `last`).
    Advance { stage: u32, output: StageOutput, last: bool },
    /// End the pipeline.
    Finish { state: PipelineState, reason: String },
}

/// What `snapshot` calls for.
pub fn next(snapshot: &Snapshot) -> Next {
    let Snapshot { state, stages, stage, cancel_requested, job_id, job, previous } = snapshot;
    if state.is_terminal() {
        return Next::Wait;
    }
    let failed = |reason: String| Next::Finish { state: PipelineState::Failed, reason };
    if stage >= stages {
        return failed(format!("the record is at stage {stage} of {stages}; it cannot go on"));
    }
    let at = |job_id: &str| format!("stages[{stage}] (job {job_id})");
    if *cancel_requested {
        return match (job_id, job) {
            (Some(job_id), Some(job)) if !job.state.is_terminal() => {
                Next::CancelJob { job_id: job_id.clone() }
            }
            _ => Next::Finish { state: PipelineState::Cancelled, reason: "cancelled".into() },
        };
    }
    let (Some(job_id), Some(job)) = (job_id, job) else {
        if *stage > 0 && previous.is_none() {
            return failed(format!("stages[{}] succeeded but its output is not recorded", stage - 1));
        }
        return Next::Submit { stage: *stage, job_id: job_id.clone(), input: previous.clone() };
    };
    match job.state {
        JobState::Published => match &job.output {
            Some(output) => {
                Next::Advance { stage: *stage, output: output.clone(), last: stage + 1 == *stages }
            }
            None => failed(format!("{} ended published but recorded no output", at(job_id))),
        },
        JobState::Refused => failed(format!("{} refused by its gates: {}", at(job_id), job.reason)),
        JobState::Failed => failed(format!("{} failed: {}", at(job_id), job.reason)),
        JobState::Cancelled => Next::Finish {
            state: PipelineState::Cancelled,
            reason: format!("{} was cancelled: {}", at(job_id), job.reason),
        },
        JobState::Queued
        | JobState::Admitted
        | JobState::Running
        | JobState::Evaluating
        | JobState::Preempted => Next::Wait,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn checkpoint(version: u64) -> StageOutput {
        StageOutput::Checkpoint { line: "l".into(), version }
    }

    fn job(state: JobState, reason: &str, output: Option<StageOutput>) -> Option<StageJob> {
        Some(StageJob { state, reason: reason.into(), output })
    }

    /// A running pipeline of three stages at `stage`.
    fn at(
        stage: u32,
        job_id: Option<&str>,
        job: Option<StageJob>,
        previous: Option<StageOutput>,
    ) -> Snapshot {
        Snapshot {
            state: PipelineState::Running,
            stages: 3,
            stage,
            cancel_requested: false,
            job_id: job_id.map(str::to_owned),
            job,
            previous,
        }
    }

    fn check(snapshot: Snapshot, expected: Next) {
        assert_eq!(next(&snapshot), expected, "{snapshot:?}");
    }

    #[test]
    fn each_stage_is_submitted_once_and_hands_its_output_on() {
        // The first stage, before anything is recorded: a new job, no input.
        check(at(0, None, None, None), Next::Submit { stage: 0, job_id: None, input: None });
        // regression guard: a daemon killed between recording the job id and creating the job
        // creates that same job, never a second one.
        check(
            at(1, Some("J1"), None, Some(checkpoint(1))),
            Next::Submit { stage: 1, job_id: Some("J1".into()), input: Some(checkpoint(1)) },
        );
        for waiting in [
            JobState::Queued,
            JobState::Admitted,
            JobState::Running,
            JobState::Evaluating,
            JobState::Preempted,
        ] {
            check(at(1, Some("J1"), job(waiting, "", None), Some(checkpoint(1))), Next::Wait);
        }
        check(
            at(
                1,
                Some("J1"),
                job(JobState::Published, "published", Some(checkpoint(2))),
                Some(checkpoint(1)),
            ),
            Next::Advance { stage: 1, output: checkpoint(2), last: false },
        );
        check(
            at(
                2,
                Some("J2"),
                job(JobState::Published, "published", Some(checkpoint(3))),
                Some(checkpoint(2)),
            ),
            Next::Advance { stage: 2, output: checkpoint(3), last: true },
        );
    }

    #[test]
    fn a_stage_that_does_not_succeed_stops_the_pipeline_with_its_reason() {
        let failed = |reason: &str| Next::Finish { state: PipelineState::Failed, reason: reason.into() };
        check(
            at(1, Some("J1"), job(JobState::Refused, "heldout_gain: 0.1 < 0.2", None), Some(checkpoint(1))),
            failed("stages[1] (job J1) refused by its gates: heldout_gain: 0.1 < 0.2"),
        );
        check(
            at(0, Some("J0"), job(JobState::Failed, "worker exited 2: bad data", None), None),
            failed("stages[0] (job J0) failed: worker exited 2: bad data"),
        );
        check(
            at(0, Some("J0"), job(JobState::Cancelled, "cancelled by team t", None), None),
            Next::Finish {
                state: PipelineState::Cancelled,
                reason: "stages[0] (job J0) was cancelled: cancelled by team t".into(),
            },
        );
        check(
            at(0, Some("J0"), job(JobState::Published, "", None), None),
            failed("stages[0] (job J0) ended published but recorded no output"),
        );
        check(at(2, None, None, None), failed("stages[1] succeeded but its output is not recorded"));
        check(at(3, None, None, None), failed("the record is at stage 3 of 3; it cannot go on"));
    }

    #[test]
    fn a_cancel_stops_the_running_job_then_ends_the_pipeline_and_nothing_moves_an_ended_one() {
        let cancelled = |mut snapshot: Snapshot| {
            snapshot.cancel_requested = true;
            snapshot
        };
        check(
            cancelled(at(1, Some("J1"), job(JobState::Running, "", None), Some(checkpoint(1)))),
            Next::CancelJob { job_id: "J1".into() },
        );
        let ended = Next::Finish { state: PipelineState::Cancelled, reason: "cancelled".into() };
        check(
            cancelled(at(1, Some("J1"), job(JobState::Cancelled, "", None), Some(checkpoint(1)))),
            ended.clone(),
        );
        // Nothing submitted after a cancel, even a stage whose id is recorded.
        check(cancelled(at(1, None, None, Some(checkpoint(1)))), ended.clone());
        check(cancelled(at(1, Some("J1"), None, Some(checkpoint(1)))), ended);
        for state in [PipelineState::Succeeded, PipelineState::Failed, PipelineState::Cancelled] {
            let mut snapshot = at(1, None, None, Some(checkpoint(1)));
            snapshot.state = state;
            check(snapshot, Next::Wait);
        }
    }
}
