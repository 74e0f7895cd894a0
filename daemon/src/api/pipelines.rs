//! The pipeline routes (issue 21): submit, list, show, cancel, and follow a pipeline's events.
//! Tenancy as for jobs: a team sees and cancels only its own pipelines (another team's is "not
//! found"), admins see all. A submit checks every stage as `POST /v1/jobs` checks a job, with a
//! stand-in of the right kind where a stage takes the previous stage's output, so what would
//! fail later is refused now, each problem under its stage (`stages[2].model.policy`).
//!
//! The stand-in is what the stage before was pinned to: a stage taking the previous checkpoint is
//! checked against the model the stage before starts from, one taking its dataset against the
//! prompts that stage reads.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::Json;
use axum::body::Body;
use axum::extract::{Extension, Path, Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures::Stream;
use rlvr_protocol::job::{ErrorBody, Submitted};
use rlvr_protocol::pipeline::{
    OutputKind, PipelineDryRun, PipelineEvent, PipelineList, PipelineSpec, PipelineState,
    PipelineSubmitAnswer, PipelineView, fill, inputs,
};
use rlvr_protocol::spec::SpecError;
use rlvr_queue::dispatch::new_task_id;
use rlvr_queue::pipelines::PipelineStore;
use rlvr_queue::store::{StoreError, SubmitOutcome};
use serde::Deserialize;

use super::auth::Caller;
use super::failure::{Answer, Failure};
use super::jobs::{
    EventsQuery, JobsState, MAX_LIST, SubmitQuery, idempotency_key, read_body, shown_to, stream_position,
    valid_id,
};
use crate::jobs::submit::{StandIn, SubmitError};

fn store(state: &JobsState) -> PipelineStore {
    PipelineStore::new(state.queues.store.connection())
}

fn not_found(id: &str) -> Failure {
    Failure::new(StatusCode::NOT_FOUND, "not_found", format!("no pipeline {id} visible to this token"))
}

fn from_store(id: &str, error: StoreError) -> Failure {
    match error {
        StoreError::NotFound(_) => not_found(id),
        error => error.into(),
    }
}

/// `POST /v1/pipelines`: a pipeline spec as JSON, or TOML with `Content-Type: application/toml`.
#[utoipa::path(
    post,
    path = "/v1/pipelines",
    request_body(content = PipelineSpec, description = "The pipeline spec: [pipeline] name, team and [[stages]], each a job spec; \"previous\" in model.policy, model.reference or data.train takes the previous stage's output"),
    params(SubmitQuery, ("Idempotency-Key" = Option<String>, Header, description = "A retry with the same key (within 24 h) gets the same pipeline")),
    responses(
        (status = 201, description = "Running", body = Submitted),
        (status = 200, description = "The pipeline an earlier submit with this Idempotency-Key made; with dry_run=true, the spec with every stage checked (nothing queued)", body = PipelineSubmitAnswer),
        (status = 400, description = "Not a pipeline spec (syntax, types, unknown fields)", body = ErrorBody),
        (status = 401, body = ErrorBody), (status = 403, body = ErrorBody),
        (status = 408, description = "The body came slower than api.body_timeout_s", body = ErrorBody),
        (status = 409, description = "Idempotency-Key reused for another spec", body = ErrorBody),
        (status = 413, body = ErrorBody),
        (status = 422, description = "A stage that cannot run here (values, plugins, files, names)", body = ErrorBody),
        (status = 429, body = ErrorBody), (status = 503, body = ErrorBody),
    ),
    security(("bearer" = [])),
    tag = "pipelines"
)]
pub async fn submit(
    State(state): State<Arc<JobsState>>,
    Extension(caller): Extension<Caller>,
    query: Result<Query<SubmitQuery>, axum::extract::rejection::QueryRejection>,
    headers: HeaderMap,
    body: Body,
) -> Answer<Response> {
    let Query(query) = query
        .map_err(|rejection| Failure::new(StatusCode::BAD_REQUEST, "bad_query", rejection.body_text()))?;
    let body = read_body(body, state.max_body_bytes).await?;
    let text = std::str::from_utf8(&body)
        .map_err(|_| Failure::new(StatusCode::BAD_REQUEST, "invalid_spec", "expected a UTF-8 body"))?;
    let content_type = headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or("");
    let is_toml = content_type.starts_with("application/toml") || content_type.starts_with("text/toml");
    let parsed = if is_toml { PipelineSpec::from_toml(text) } else { PipelineSpec::from_json(text) };
    let mut spec =
        parsed.map_err(|error| Failure::spec(StatusCode::BAD_REQUEST, "invalid_spec", vec![error]))?;
    spec.fill_team(&caller.team);
    spec.validate()
        .map_err(|errors| Failure::spec(StatusCode::UNPROCESSABLE_ENTITY, "invalid_spec", errors.0))?;
    if !caller.may_act_for(&spec.pipeline.team) {
        return Err(Failure::new(
            StatusCode::FORBIDDEN,
            "forbidden",
            format!("this token submits for team {:?}, not {:?}", caller.team, spec.pipeline.team),
        )
        .field("pipeline.team"));
    }
    let idempotency_key = idempotency_key(&headers)?;
    check_stages(&state, &spec).await?;
    if query.dry_run {
        return Ok(Json(PipelineDryRun { spec }).into_response());
    }
    let store = store(&state);
    match store.submit(&new_task_id(), &spec, idempotency_key.as_deref()).await? {
        SubmitOutcome::Created { id, .. } => {
            tracing::info!(pipeline = %id, team = %spec.pipeline.team, name = %spec.pipeline.name, stages = spec.stages.len(), "pipeline submitted");
            Ok((StatusCode::CREATED, Json(Submitted { id, created: true })).into_response())
        }
        SubmitOutcome::Existing { id } => {
            if store.spec(&id).await? != spec {
                return Err(Failure::new(
                    StatusCode::CONFLICT,
                    "idempotency_key_reused",
                    format!("this Idempotency-Key made pipeline {id} from a different spec; use a new key"),
                )
                .field("Idempotency-Key"));
            }
            Ok((StatusCode::OK, Json(Submitted { id, created: false })).into_response())
        }
    }
}

/// Every stage checked as a job submit checks it (claiming no model line), a stage that takes
/// the previous stage's checkpoint seeing the model that stage starts from: the same shape, so
/// the same plugins' fit and memory estimate. Every problem at once, under its stage.
async fn check_stages(state: &JobsState, spec: &PipelineSpec) -> Answer<()> {
    let mut problems: Vec<SpecError> = Vec::new();
    let mut status = StatusCode::UNPROCESSABLE_ENTITY;
    // What the previous stage starts from and reads, as its check pinned them: a stage taking
    // its checkpoint is checked against the model it started from (the same shape), one taking
    // its dataset (rejection sampling's rows) against the prompts it read (the team's own data).
    let mut stand_in_model: Option<String> = None;
    let mut stand_in_data: Option<String> = None;
    for (i, stage) in spec.stages.iter().enumerate() {
        let takes = |kind: OutputKind| inputs(stage).iter().any(|(_, taken)| *taken == kind);
        let (filled, stands_in) = match (&stand_in_model, &stand_in_data) {
            (Some(model), _) if takes(OutputKind::Checkpoint) => {
                (fill(stage, OutputKind::Checkpoint, model), StandIn::Nothing)
            }
            (_, Some(data)) if takes(OutputKind::Dataset) => {
                (fill(stage, OutputKind::Dataset, data), StandIn::TrainData)
            }
            _ => (stage.clone(), StandIn::Nothing),
        };
        let (starts_from, reads) = (filled.model.policy.clone(), filled.data.train.display().to_string());
        match state.submitter.check(filled, true, stands_in).await {
            Ok(pinned) => {
                stand_in_model = Some(pinned.model.policy.clone());
                stand_in_data = Some(pinned.data.train.display().to_string());
            }
            Err(SubmitError::Refused(refusal)) => {
                if refusal.forbidden {
                    status = StatusCode::FORBIDDEN;
                }
                problems.extend(refusal.problems.into_iter().map(|problem| SpecError {
                    field: format!("stages[{i}].{}", problem.field),
                    message: problem.message,
                }));
                stand_in_model = Some(starts_from);
                stand_in_data = Some(reads);
            }
            Err(error) => return Err(error.into()),
        }
    }
    if problems.is_empty() { Ok(()) } else { Err(Failure::spec(status, "cannot_run", problems)) }
}

/// The pipeline, if the caller may see it, with each stage's job state.
async fn visible(state: &JobsState, caller: &Caller, id: &str) -> Answer<PipelineView> {
    if !valid_id(id) {
        return Err(not_found(id));
    }
    let mut view = store(state).get(id).await.map_err(|error| from_store(id, error))?;
    if !caller.may_act_for(&view.team) {
        return Err(not_found(id));
    }
    with_job_states(state, &mut view).await;
    Ok(view)
}

async fn with_job_states(state: &JobsState, view: &mut PipelineView) {
    for stage in &mut view.stages {
        if let Some(job) = &stage.job {
            stage.job_state = state.queues.store.get(job).await.ok().map(|job| job.state);
        }
    }
}

/// `GET /v1/pipelines` filters.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
pub struct ListQuery {
    /// Only this team's pipelines (admins; a team token always sees its own).
    team: Option<String>,
    /// At most this many, newest first (default 100, at most 1000).
    limit: Option<usize>,
}

/// `GET /v1/pipelines`: the caller's pipelines, newest first.
#[utoipa::path(
    get,
    path = "/v1/pipelines",
    params(ListQuery),
    responses(
        (status = 200, body = PipelineList), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
        (status = 403, body = ErrorBody), (status = 429, body = ErrorBody),
    ),
    security(("bearer" = [])),
    tag = "pipelines"
)]
pub async fn list(
    State(state): State<Arc<JobsState>>,
    Extension(caller): Extension<Caller>,
    query: Result<Query<ListQuery>, axum::extract::rejection::QueryRejection>,
) -> Answer<Json<PipelineList>> {
    let Query(query) = query
        .map_err(|rejection| Failure::new(StatusCode::BAD_REQUEST, "bad_query", rejection.body_text()))?;
    let team = match (&query.team, caller.admin) {
        (Some(team), true) => Some(team.clone()),
        (None, true) => None,
        (Some(team), false) if *team != caller.team => {
            return Err(Failure::new(
                StatusCode::FORBIDDEN,
                "forbidden",
                "a team token lists only its own team",
            )
            .field("team"));
        }
        _ => Some(caller.team.clone()),
    };
    let limit = query.limit.unwrap_or(100).clamp(1, MAX_LIST);
    let pipelines = store(&state).list(team.as_deref(), limit).await?;
    let pipelines = pipelines.into_iter().map(|pipeline| shown_to(&state, caller.admin, pipeline)).collect();
    Ok(Json(PipelineList { pipelines }))
}

/// `GET /v1/pipelines/{id}`.
#[utoipa::path(
    get,
    path = "/v1/pipelines/{id}",
    params(("id" = String, Path, description = "Pipeline id")),
    responses(
        (status = 200, body = PipelineView), (status = 401, body = ErrorBody), (status = 404, body = ErrorBody),
        (status = 429, body = ErrorBody),
    ),
    security(("bearer" = [])),
    tag = "pipelines"
)]
pub async fn show(
    State(state): State<Arc<JobsState>>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Answer<Json<PipelineView>> {
    Ok(Json(shown_to(&state, caller.admin, visible(&state, &caller, &id).await?)))
}

/// `DELETE /v1/pipelines/{id}`: cancel. No further stage is submitted; the running stage's job
/// is cancelled (at once when it waits, within a step when it runs), and the pipeline ends
/// `cancelled` once it has.
#[utoipa::path(
    delete,
    path = "/v1/pipelines/{id}",
    params(("id" = String, Path, description = "Pipeline id")),
    responses(
        (status = 200, description = "Being cancelled (cancel_requested)", body = PipelineView),
        (status = 401, body = ErrorBody), (status = 404, body = ErrorBody),
        (status = 409, description = "It had ended already", body = ErrorBody),
        (status = 429, body = ErrorBody),
    ),
    security(("bearer" = [])),
    tag = "pipelines"
)]
pub async fn cancel(
    State(state): State<Arc<JobsState>>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Answer<Json<PipelineView>> {
    let pipeline = visible(&state, &caller, &id).await?;
    let (was, job) = store(&state).cancel(&id).await.map_err(|error| from_store(&id, error))?;
    if was.is_terminal() {
        return Err(Failure::new(
            StatusCode::CONFLICT,
            "already_ended",
            format!("pipeline {id} has ended already: {was}"),
        ));
    }
    // The driving daemon cancels it too; doing it now saves the wait for its tick.
    if let Some(job) = job {
        let reason = format!("cancelled with pipeline {id} by team {}", caller.team);
        let retention = &state.submitter.retention;
        crate::jobs::cancel::cancel(&state.queues.store, retention, &job, &pipeline.team, &reason).await?;
    }
    tracing::info!(pipeline = %id, by = %caller.team, "pipeline cancel");
    Ok(Json(shown_to(&state, caller.admin, visible(&state, &caller, &id).await?)))
}

/// `GET /v1/pipelines/{id}/events`: server-sent events, one `state` event (a [`PipelineEvent`])
/// per change — submitted, each stage's job, each stage's output, the end — from the first one
/// (or after `Last-Event-ID`); the stream ends after the pipeline's final event.
#[utoipa::path(
    get,
    path = "/v1/pipelines/{id}/events",
    params(("id" = String, Path, description = "Pipeline id"), EventsQuery),
    responses(
        (status = 200, description = "text/event-stream of `state` events, each a PipelineEvent as JSON", content_type = "text/event-stream", body = PipelineEvent),
        (status = 400, description = "Not an event id", body = ErrorBody),
        (status = 401, body = ErrorBody), (status = 404, body = ErrorBody), (status = 429, body = ErrorBody),
    ),
    security(("bearer" = [])),
    tag = "pipelines"
)]
pub async fn events(
    State(state): State<Arc<JobsState>>,
    Extension(caller): Extension<Caller>,
    headers: HeaderMap,
    Path(id): Path<String>,
    query: Result<Query<EventsQuery>, axum::extract::rejection::QueryRejection>,
) -> Answer<Sse<impl Stream<Item = Result<Event, Infallible>>>> {
    let Query(query) = query
        .map_err(|rejection| Failure::new(StatusCode::BAD_REQUEST, "bad_query", rejection.body_text()))?;
    visible(&state, &caller, &id).await?;
    let after = stream_position(&headers, query.after)?;
    let place = state
        .streams
        .try_take(super::lanes::Lane::Team(caller.team.clone()))
        .map_err(|message| Failure::new(StatusCode::TOO_MANY_REQUESTS, "busy", message).retry(1))?;
    let follower = Follower {
        _place: place,
        admin: caller.admin,
        seeing: state.pipeline_readers.follow(&id),
        state,
        after,
        pending: Vec::new(),
        ended: false,
    };
    let stream = futures::stream::unfold(follower, |mut follower| async move {
        let event = follower.next().await?;
        Some((Ok(event), follower))
    });
    Ok(Sse::new(stream).keep_alive(KeepAlive::new().interval(Duration::from_secs(10))))
}

/// Follows one pipeline for an event stream (as `jobs::Follower` does a job).
struct Follower {
    /// The stream's place in its team's lane, given back when the stream is dropped.
    _place: super::lanes::Ticket,
    /// Whether the caller reads the server's paths (`shown_to`).
    admin: bool,
    seeing: super::follow::Seeing<PipelineStore>,
    state: Arc<JobsState>,
    after: String,
    pending: Vec<PipelineEvent>,
    /// The final event was sent.
    ended: bool,
}

impl Follower {
    async fn next(&mut self) -> Option<Event> {
        loop {
            if let Some(event) = self.pending.pop() {
                self.after = event.id.clone();
                if event.state.is_terminal() {
                    self.ended = true;
                }
                let data = serde_json::to_string(&shown_to(&self.state, self.admin, event.clone()))
                    .unwrap_or_default();
                return Some(Event::default().event("state").id(event.id).data(data));
            }
            if self.ended {
                return None;
            }
            let seen = self.seeing.borrow_and_update().clone();
            if let Some(seen) = seen {
                let mut events = seen.events_after(&self.after);
                if !events.is_empty() {
                    events.reverse();
                    self.pending = events;
                    continue;
                }
                // Ended before its events were read: every event is in them, and sent.
                if seen.view.as_ref().is_some_and(|view| view.state != PipelineState::Running) {
                    return None;
                }
            }
            if !super::follow::changed(&mut self.seeing, &self.state.stopping).await {
                return None;
            }
        }
    }
}
