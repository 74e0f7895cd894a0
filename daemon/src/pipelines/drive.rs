//! Driving pipelines: every [`TICK`], each running pipeline's record and its stage's job are
//! read from Redis, [`super::next::next`] says what to do, and it is done. Nothing is kept in
//! memory between ticks, so a daemon killed at any point (or two daemons at once) leaves nothing
//! to recover: a restart reads the same records and does what was left.
//!
//! Why no stage is submitted twice: its job id is recorded in the pipeline (`claim_stage`, a
//! script that records one id per stage) before the job is created under that id, and the job
//! store creates a job only once per id. A daemon killed between the two creates that same job
//! on restart. A stage's job is created by the same checks and code path as `POST /v1/jobs`.

use std::sync::Arc;
use std::time::Duration;

use rlvr_protocol::job::{JobOutput, JobView};
use rlvr_protocol::pipeline::{PipelineState, StageOutput, bind};
use rlvr_queue::dispatch::new_task_id;
use rlvr_queue::pipelines::{Claim, PipelineStore};
use rlvr_queue::store::StoreError;
use tokio_util::sync::CancellationToken;

use super::next::{Next, Snapshot, StageJob, next};
use crate::jobs::cancel::cancel;
use crate::jobs::submit::{StandIn, SubmitError, Submitter};

/// How often the running pipelines are looked at: a stage starts within this of the one before
/// it ending.
pub const TICK: Duration = Duration::from_millis(500);

/// Most actions taken for one pipeline in one tick (an advance and the next stage's submit).
const ACTIONS_PER_TICK: usize = 4;

/// Drives the running pipelines until `stopping`.
pub async fn run(state: Arc<Submitter>, stopping: CancellationToken) {
    let store = PipelineStore::new(state.queues.store.connection());
    loop {
        tokio::select! {
            _ = stopping.cancelled() => return,
            _ = tokio::time::sleep(TICK) => {}
        }
        let ids = match store.running().await {
            Ok(ids) => ids,
            Err(error) => {
                tracing::debug!(%error, "cannot read the running pipelines; trying again");
                continue;
            }
        };
        for id in ids {
            for _ in 0..ACTIONS_PER_TICK {
                match step(&state, &store, &id).await {
                    Ok(true) => continue,
                    Ok(false) => break,
                    Err(error) => {
                        tracing::warn!(pipeline = %id, %error, "cannot drive the pipeline now; trying again");
                        break;
                    }
                }
            }
        }
    }
}

/// The pipeline's stage's job as the pipeline sees it: its state, reason and output.
pub fn stage_job(job: &JobView) -> StageJob {
    // A job that trains hands on the line version it published; a rejection-sampling job the
    // team dataset it wrote, pinned to its content.
    let output = job.output.as_ref().map(JobOutput::handed_on);
    StageJob { state: job.state, reason: job.reason.clone(), output }
}

/// Reads pipeline `id` and does the one thing it calls for; `true` when it did something (and
/// may call for more at once).
async fn step(state: &Arc<Submitter>, store: &PipelineStore, id: &str) -> Result<bool, StoreError> {
    let view = store.get(id).await?;
    let stage = view.stages.get(view.stage as usize);
    let job_id = stage.and_then(|stage| stage.job.clone());
    let job = match &job_id {
        Some(job_id) => match state.queues.store.get(job_id).await {
            Ok(job) => Some(stage_job(&job)),
            Err(StoreError::NotFound(_)) => None,
            Err(error) => return Err(error),
        },
        None => None,
    };
    let previous = view
        .stage
        .checked_sub(1)
        .and_then(|before| view.stages.get(before as usize))
        .and_then(|stage| stage.output.clone());
    let snapshot = Snapshot {
        state: view.state,
        stages: view.stages.len() as u32,
        stage: view.stage,
        cancel_requested: view.cancel_requested,
        job_id,
        job,
        previous,
    };
    match next(&snapshot) {
        Next::Wait => Ok(false),
        Next::CancelJob { job_id } => {
            let reason = format!("cancelled with pipeline {id}");
            cancel(&state.queues.store, &state.retention, &job_id, &view.team, &reason).await?;
            Ok(false)
        }
        Next::Advance { stage, output, last } => {
            let reason = format!("stages[{stage}] handed on {}", output.reference());
            let advanced = store.advance(id, stage, &output, last, &reason).await?;
            tracing::info!(pipeline = %id, stage, output = %output.reference(), last, "pipeline stage succeeded");
            Ok(advanced && !last)
        }
        Next::Finish { state: end, reason } => {
            let finished = store.finish(id, end, &reason).await?;
            if finished {
                tracing::info!(pipeline = %id, state = %end, %reason, "pipeline ended");
            }
            Ok(false)
        }
        Next::Submit { stage, job_id, input } => submit(state, store, id, stage, job_id, input).await,
    }
}

/// Creates stage `stage`'s job, with `input` written into it, as `job_id` or under a new id
/// recorded first.
async fn submit(
    state: &Arc<Submitter>,
    store: &PipelineStore,
    id: &str,
    stage: u32,
    job_id: Option<String>,
    input: Option<StageOutput>,
) -> Result<bool, StoreError> {
    let pipeline = store.spec(id).await?;
    let Some(written) = pipeline.stages.get(stage as usize) else {
        let reason = format!("stages[{stage}] is not in the pipeline's spec");
        return store.finish(id, PipelineState::Failed, &reason).await;
    };
    let spec = match &input {
        Some(output) => match bind(written, output) {
            Ok(spec) => spec,
            Err(error) => {
                let reason = format!("stages[{stage}].{error}");
                return store.finish(id, PipelineState::Failed, &reason).await;
            }
        },
        None => written.clone(),
    };
    let job_id = match job_id {
        Some(job_id) => job_id,
        None => {
            let fresh = new_task_id();
            let reason = format!("stages[{stage}] ({}) submitted as job {fresh}", spec.job.name);
            match store.claim_stage(id, stage, &fresh, &reason).await? {
                Claim::Job(job_id) => job_id,
                // Cancelled, ended, or moved on meanwhile: the next read says what to do.
                Claim::Stale => return Ok(true),
            }
        }
    };
    // The checks of a job submit; the model line is claimed now, by the stage that publishes.
    let created = match state.check(spec, false, StandIn::Nothing).await {
        Ok(checked) => state.create(&job_id, &checked, None).await.map(|_| ()),
        Err(error) => Err(error),
    };
    match created {
        Ok(()) => {
            tracing::info!(pipeline = %id, stage, job = %job_id, "pipeline stage submitted");
            Ok(false)
        }
        Err(error) if error.is_transient() => {
            let reason = under(stage, &error);
            tracing::info!(pipeline = %id, stage, %reason, "stage not submitted yet; trying again");
            Ok(false)
        }
        Err(error) => {
            let reason = format!("refused at submit: {}", under(stage, &error));
            store.finish(id, PipelineState::Failed, &reason).await?;
            tracing::info!(pipeline = %id, stage, %reason, "pipeline ended");
            Ok(false)
        }
    }
}

/// What a submit's error says, its field written under stage `stage` (`stages[1].model.policy:
/// …`, or `stages[1]: …` without a field).
fn under(stage: u32, error: &SubmitError) -> String {
    match error {
        SubmitError::Refused(refusal) => match refusal.problems.first() {
            Some(problem) if !problem.field.is_empty() => {
                format!("stages[{stage}].{}: {}", problem.field, problem.message)
            }
            Some(problem) => format!("stages[{stage}]: {}", problem.message),
            None => format!("stages[{stage}]: refused"),
        },
        error => format!("stages[{stage}]: {error}"),
    }
}
