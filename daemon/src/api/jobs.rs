//! The job routes of design.md §1: submit, list, show, cancel, and follow a job's events.
//!
//! Every route needs a bearer token, checked before the handler runs ([`super::auth::require_token`],
//! which leaves the [`Caller`] in the request's extensions); a team sees and cancels only its own
//! jobs (another team's job is "not found", so ids leak nothing) and admins see all. Every refusal is
//! `{"error": {"code", "message", "field"}}` with a 4xx status, and 503 while Redis is away.
//!
//! Submit is `jobs::submit`'s: the route only turns its `SubmitError` into a status (403 for a
//! refusal of permission, 422 for a spec that cannot run); `?dry_run=true` runs every check and
//! answers the spec, queueing nothing. The list pages through `Store::page`.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::Json;
use axum::body::{Body, Bytes};
use axum::extract::{Extension, Path, Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures::{Stream, StreamExt};
use rlvr_protocol::job::{
    DryRun, ErrorBody, Estimate, IDEMPOTENCY_KEY_RULE, JobEvent, JobList, JobState, JobView, ListCursor,
    SubmitAnswer, Submitted, valid_idempotency_key,
};
use rlvr_protocol::spec::{JobSpec, SpecError};
use rlvr_queue::dispatch::new_task_id;
use rlvr_queue::store::{CancelOutcome, JobPage, PageQuery, SubmitOutcome};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use super::auth::Caller;
use super::failure::{Answer, Failure};
use crate::jobs::Queues;
use crate::jobs::submit::{StandIn, Submitter};
use rlvr_plugin_host::Registry;

/// What the job routes share.
pub struct JobsState {
    pub queues: Queues,
    pub registry: Arc<Registry>,
    /// Cancelled when the daemon stops: event streams end so the server can.
    pub stopping: tokio_util::sync::CancellationToken,
    /// `api.max_body_bytes`: the largest job spec taken.
    pub max_body_bytes: usize,
    /// This daemon's scheduler: submit checks the inventory; views show devices and grants.
    pub scheduler: Arc<crate::sched::service::Scheduler>,
    /// The jobs' directories (metrics), the curricula.
    pub state_dir: crate::state_dir::StateDir,
    /// What each team may name: datasets, model lines, base models, data roots, secrets.
    pub tenancy: Arc<crate::tenancy::Tenancy>,
    /// The client webhooks go through; its policy checks a spec's webhook at submit.
    pub outbound: rlvr_outbound::Client,
    /// The graders' dry-runs grading now (`POST /v1/verify`), by team and job (`api::lanes`).
    pub dry_runs: Arc<super::lanes::Lanes>,
    /// The event streams open now (`GET /v1/jobs/{id}/events`, `GET /v1/pipelines/{id}/events`),
    /// by team.
    pub streams: Arc<super::lanes::Lanes>,
    /// One Redis reader per job followed by event streams (`api::follow`).
    pub job_readers: Arc<super::follow::Readers<rlvr_queue::store::JobStore>>,
    /// One Redis reader per pipeline followed by event streams.
    pub pipeline_readers: Arc<super::follow::Readers<rlvr_queue::pipelines::PipelineStore>>,
    /// `api.dry_run_budget_s`: the longest one `POST /v1/verify` grades.
    pub dry_run_budget: std::time::Duration,
    /// The submit use case (`POST /v1/jobs`, a pipeline's checks).
    pub submitter: Arc<Submitter>,
    /// What `POST /v1/env/check` runs.
    pub env_checks: super::env_check::EnvChecks,
}

/// Most jobs one `GET /v1/jobs` returns.
pub(super) const MAX_LIST: usize = 1000;

/// `POST /v1/jobs`: a job spec as JSON, or TOML with `Content-Type: application/toml`.
#[utoipa::path(
    post,
    path = "/v1/jobs",
    request_body(content = JobSpec, description = "The job spec (design.md §1), as JSON or as TOML with Content-Type: application/toml"),
    params(SubmitQuery, ("Idempotency-Key" = Option<String>, Header, description = "A retry with the same key (within 24 h) gets the same job")),
    responses(
        (status = 201, description = "Queued", body = Submitted),
        (status = 200, description = "The job an earlier submit with this Idempotency-Key made; with dry_run=true, the spec as the job would keep it (nothing queued)", body = SubmitAnswer),
        (status = 400, description = "Not a spec (syntax, types, unknown fields)", body = ErrorBody),
        (status = 401, body = ErrorBody), (status = 403, body = ErrorBody),
        (status = 408, description = "The body came slower than api.body_timeout_s", body = ErrorBody),
        (status = 409, description = "Idempotency-Key reused for another spec", body = ErrorBody),
        (status = 413, body = ErrorBody),
        (status = 422, description = "A spec that cannot run here (values, plugins, files)", body = ErrorBody),
        (status = 429, body = ErrorBody), (status = 503, body = ErrorBody),
    ),
    security(("bearer" = [])),
    tag = "jobs"
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
    let spec = read_spec(&state, &caller, &headers, body).await?;
    let idempotency_key = idempotency_key(&headers)?;
    if query.dry_run {
        let spec = state.submitter.check(spec, true, StandIn::Nothing).await?;
        return Ok(Json(DryRun { spec: spec.into_spec() }).into_response());
    }
    let spec = state.submitter.check(spec, false, StandIn::Nothing).await?;
    let id = new_task_id();
    let submitted = |status, id, created| (status, Json(Submitted { id, created })).into_response();
    match state.submitter.create(&id, &spec, idempotency_key.as_deref()).await? {
        SubmitOutcome::Created { id, .. } => Ok(submitted(StatusCode::CREATED, id, true)),
        SubmitOutcome::Existing { id } => {
            let earlier = state.queues.store.spec(&id).await?;
            if earlier != spec {
                return Err(Failure::new(
                    StatusCode::CONFLICT,
                    "idempotency_key_reused",
                    format!("this Idempotency-Key made job {id} from a different spec; use a new key"),
                )
                .field("Idempotency-Key"));
            }
            Ok(submitted(StatusCode::OK, id, false))
        }
    }
}

/// `POST /v1/jobs` options.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
pub struct SubmitQuery {
    /// Check the spec as a submit does (plugins and their options, files, names, resources)
    /// and answer 200 with it as the job would keep it; queue nothing.
    #[serde(default)]
    pub(super) dry_run: bool,
}

/// The spec of a request body (JSON, or TOML with `Content-Type: application/toml`), valid and
/// of a team the caller may act for (the caller's own when it names none).
pub(super) async fn read_spec(
    state: &JobsState,
    caller: &Caller,
    headers: &HeaderMap,
    body: Body,
) -> Answer<JobSpec> {
    // What a refusal leaves of the body unread, the server drains before answering (see
    // `server::after_draining`).
    let body = read_body(body, state.max_body_bytes).await?;
    let text = std::str::from_utf8(&body)
        .map_err(|_| Failure::new(StatusCode::BAD_REQUEST, "invalid_spec", "expected a UTF-8 body"))?;
    let content_type = headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or("");
    let is_toml = content_type.starts_with("application/toml") || content_type.starts_with("text/toml");
    let parsed = if is_toml { JobSpec::from_toml(text) } else { JobSpec::from_json(text) };
    let mut spec =
        parsed.map_err(|error| Failure::spec(StatusCode::BAD_REQUEST, "invalid_spec", vec![error]))?;
    spec.fill_team(&caller.team);
    spec.validate()
        .map_err(|errors| Failure::spec(StatusCode::UNPROCESSABLE_ENTITY, "invalid_spec", errors.0))?;
    if !caller.may_act_for(&spec.job.team) {
        return Err(Failure::new(
            StatusCode::FORBIDDEN,
            "forbidden",
            format!("this token submits for team {:?}, not {:?}", caller.team, spec.job.team),
        )
        .field("job.team"));
    }
    Ok(spec)
}

/// `POST /v1/estimate`: a spec's memory estimate on this daemon's devices — what submit fills
/// `[resources] memory_gb` and `resident_gb` with when the spec leaves them out — and whether
/// it fits a device here. Queues nothing.
#[utoipa::path(
    post,
    path = "/v1/estimate",
    request_body(content = JobSpec, description = "The job spec, as JSON or as TOML with Content-Type: application/toml"),
    responses(
        (status = 200, description = "The estimate", body = Estimate),
        (status = 400, description = "Not a spec", body = ErrorBody),
        (status = 401, body = ErrorBody), (status = 403, body = ErrorBody),
        (status = 413, body = ErrorBody),
        (status = 422, description = "A spec whose models, data or optimizer cannot be read", body = ErrorBody),
        (status = 429, body = ErrorBody),
    ),
    security(("bearer" = [])),
    tag = "jobs"
)]
pub async fn estimate(
    State(state): State<Arc<JobsState>>,
    Extension(caller): Extension<Caller>,
    headers: HeaderMap,
    body: Body,
) -> Answer<Json<Estimate>> {
    let spec = read_spec(&state, &caller, &headers, body).await?;
    let (registry, scheduler, tenancy) =
        (state.registry.clone(), state.scheduler.clone(), state.tenancy.clone());
    let answer = tokio::task::spawn_blocking(move || {
        // Names resolve as at submit (a dry run claims no model line).
        let pinned =
            crate::tenancy::resolve::admit(&tenancy, &spec, true).map_err(|refused| refused.problems)?;
        // `worker_spec` says `FIELD: why`.
        let resolved = crate::tenancy::resolve::worker_spec(&tenancy, &pinned).map_err(|message| {
            let (field, why) = message.split_once(": ").unwrap_or(("model.policy", &message));
            vec![SpecError { field: field.to_owned(), message: why.to_owned() }]
        })?;
        let device = scheduler.device_kind();
        let estimate =
            crate::jobs::estimate::estimate(&resolved, &registry, device).map_err(|problem| vec![problem])?;
        let mut filled = pinned.into_spec();
        crate::jobs::estimate::fill_resources(&mut filled, &estimate);
        let fits = scheduler.can_ever_fit(&scheduler.demand("estimate", &filled, Duration::ZERO));
        Ok::<_, Vec<SpecError>>(Estimate {
            memory_gb: filled.resources.memory_gb,
            resident_gb: filled.resources.resident(),
            fits: fits.as_ref().err().map(|why| why.message.clone()),
            estimate,
        })
    })
    .await
    .map_err(|error| Failure::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", error.to_string()))?;
    answer
        .map(Json)
        .map_err(|problems| Failure::spec(StatusCode::UNPROCESSABLE_ENTITY, "cannot_run", problems))
}

/// Reads a request body of at most `limit` bytes; past it, a 413 (the server drains the rest
/// before the answer goes out: see `server::after_draining`).
pub(super) async fn read_body(body: Body, limit: usize) -> Answer<Bytes> {
    let mut stream = body.into_data_stream();
    let mut kept = Vec::new();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|error| {
            Failure::new(StatusCode::BAD_REQUEST, "bad_body", format!("cannot read the body: {error}"))
        })?;
        if kept.len().saturating_add(chunk.len()) > limit {
            return Err(Failure::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "body_too_large",
                format!("the body is over {limit} bytes (api.max_body_bytes sets the limit)"),
            ));
        }
        kept.extend_from_slice(&chunk);
    }
    Ok(Bytes::from(kept))
}

pub(super) fn idempotency_key(headers: &HeaderMap) -> Answer<Option<String>> {
    let Some(value) = headers.get("idempotency-key") else { return Ok(None) };
    let key = value.to_str().ok().filter(|key| valid_idempotency_key(key));
    match key {
        Some(key) => Ok(Some(key.to_owned())),
        None => Err(Failure::new(
            StatusCode::BAD_REQUEST,
            "bad_header",
            format!("expected {IDEMPOTENCY_KEY_RULE}"),
        )
        .field("Idempotency-Key")),
    }
}

/// `GET /v1/jobs` filters.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
pub struct ListQuery {
    /// Only this team's jobs (admins; a team token always sees its own).
    team: Option<String>,
    /// Only jobs in this state.
    state: Option<String>,
    /// At most this many, newest first (default 100, at most 1000).
    limit: Option<usize>,
    /// Only jobs submitted at or after this time (RFC 3339, e.g. `2026-11-28T09:00:00Z`).
    since: Option<String>,
    /// The page after the one that answered with this `next`.
    cursor: Option<String>,
}

/// `GET /v1/jobs`: the caller's jobs, newest first, a page at a time.
#[utoipa::path(
    get,
    path = "/v1/jobs",
    params(ListQuery),
    responses(
        (status = 200, body = JobList), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
        (status = 429, body = ErrorBody),
    ),
    security(("bearer" = [])),
    tag = "jobs"
)]
pub async fn list(
    State(state): State<Arc<JobsState>>,
    Extension(caller): Extension<Caller>,
    query: Result<Query<ListQuery>, axum::extract::rejection::QueryRejection>,
) -> Answer<Json<JobList>> {
    let Query(query) = query
        .map_err(|rejection| Failure::new(StatusCode::BAD_REQUEST, "bad_query", rejection.body_text()))?;
    let bad_query = |field: &str, message: String| {
        Failure::new(StatusCode::BAD_REQUEST, "bad_query", message).field(field)
    };
    let wanted_state = query
        .state
        .as_deref()
        .map(str::parse::<JobState>)
        .transpose()
        .map_err(|message| bad_query("state", message))?;
    let since_ms = query
        .since
        .as_deref()
        .map(|since| {
            humantime::parse_rfc3339_weak(since)
                .map(|at| at.duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64))
                .map_err(|error| bad_query("since", format!("{since:?} is not an RFC 3339 time: {error}")))
        })
        .transpose()?;
    let after = query
        .cursor
        .as_deref()
        .map(str::parse::<ListCursor>)
        .transpose()
        .map_err(|message| bad_query("cursor", message))?;
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
    let page = PageQuery {
        since_ms,
        after,
        state: wanted_state,
        limit: query.limit.unwrap_or(100).clamp(1, MAX_LIST),
    };
    let JobPage { mut jobs, next } = state.queues.store.page(team.as_deref(), &page).await?;
    for job in &mut jobs {
        job.grant = state.scheduler.grant_state(&job.id);
    }
    let jobs = jobs.into_iter().map(|job| shown_to(&state, caller.admin, job)).collect();
    Ok(Json(JobList { jobs, next: next.map(|cursor| cursor.to_string()) }))
}

/// `GET /v1/jobs/{id}`.
#[utoipa::path(
    get,
    path = "/v1/jobs/{id}",
    params(("id" = String, Path, description = "Job id")),
    responses(
        (status = 200, body = JobView), (status = 401, body = ErrorBody), (status = 404, body = ErrorBody),
        (status = 429, body = ErrorBody),
    ),
    security(("bearer" = [])),
    tag = "jobs"
)]
pub async fn show(
    State(state): State<Arc<JobsState>>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Answer<Json<JobView>> {
    Ok(Json(shown_to(&state, caller.admin, visible_job(&state, &caller, &id).await?)))
}

/// `record` as its reader reads it: a team token names in place of the server's paths
/// (`tenancy::shown`), an `admin` the paths.
pub(super) fn shown_to<T: Serialize + DeserializeOwned>(state: &JobsState, admin: bool, record: T) -> T {
    if admin { record } else { state.tenancy.shown.record(record) }
}

/// `text` as its reader reads it (see [`shown_to`]).
pub(super) fn shown_text(state: &JobsState, admin: bool, text: String) -> String {
    if admin { text } else { state.tenancy.shown.text(&text).into_owned() }
}

pub(super) async fn visible_job(state: &JobsState, caller: &Caller, id: &str) -> Answer<JobView> {
    if !valid_id(id) {
        return Err(Failure::not_found(id));
    }
    let mut job = state.queues.store.get(id).await?;
    if !caller.may_act_for(&job.team) {
        return Err(Failure::not_found(id));
    }
    job.grant = state.scheduler.grant_state(id);
    Ok(job)
}

/// Job ids are ULIDs: anything else is no job (and never becomes a Redis key).
pub(super) fn valid_id(id: &str) -> bool {
    id.len() == 26 && id.bytes().all(|b| b.is_ascii_alphanumeric())
}

/// `DELETE /v1/jobs/{id}`: cancel. A waiting job is cancelled at once; a running one when its
/// daemon has stopped the worker (within a step).
#[utoipa::path(
    delete,
    path = "/v1/jobs/{id}",
    params(("id" = String, Path, description = "Job id")),
    responses(
        (status = 200, description = "Cancelled, or being cancelled (cancel_requested)", body = JobView),
        (status = 401, body = ErrorBody), (status = 404, body = ErrorBody),
        (status = 409, description = "It had ended already", body = ErrorBody),
        (status = 429, body = ErrorBody),
    ),
    security(("bearer" = [])),
    tag = "jobs"
)]
pub async fn cancel(
    State(state): State<Arc<JobsState>>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Answer<Json<JobView>> {
    let job = visible_job(&state, &caller, &id).await?;
    let reason = format!("cancelled by team {}", caller.team);
    let retention = &state.submitter.retention;
    match crate::jobs::cancel::cancel(&state.queues.store, retention, &id, &job.team, &reason).await? {
        CancelOutcome::Cancelled | CancelOutcome::Requested => {
            Ok(Json(shown_to(&state, caller.admin, state.queues.store.get(&id).await?)))
        }
        CancelOutcome::AlreadyEnded(ended) => Err(Failure::new(
            StatusCode::CONFLICT,
            "already_ended",
            format!("job {id} has ended already: {ended}"),
        )),
    }
}

/// `GET /v1/jobs/{id}/events` filters.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
pub struct EventsQuery {
    /// Only events after this event id (as the `Last-Event-ID` header).
    pub(super) after: Option<String>,
}

/// `GET /v1/jobs/{id}/events`: server-sent events. `state` events (a [`JobEvent`]) from the first
/// one (or after `Last-Event-ID`), `progress` events (the [`JobView`]) when the step or figures
/// change; the stream ends once the job has ended and no event is left after the client's
/// position, whatever that position is (one past the last event included). A team has at most
/// `api.streams_per_team` open (429 past it), all teams half of `api.max_connections`.
#[utoipa::path(
    get,
    path = "/v1/jobs/{id}/events",
    params(("id" = String, Path, description = "Job id"), EventsQuery),
    responses(
        (status = 200, description = "text/event-stream of `state` (JobEvent) and `progress` (JobView) events", content_type = "text/event-stream", body = StreamEvent),
        (status = 400, description = "Not an event id", body = ErrorBody),
        (status = 401, body = ErrorBody), (status = 404, body = ErrorBody), (status = 429, body = ErrorBody),
    ),
    security(("bearer" = [])),
    tag = "jobs"
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
    visible_job(&state, &caller, &id).await?;
    let after = stream_position(&headers, query.after)?;
    let place = state
        .streams
        .try_take(super::lanes::Lane::Team(caller.team.clone()))
        .map_err(|message| Failure::new(StatusCode::TOO_MANY_REQUESTS, "busy", message).retry(1))?;
    let follower = Follower {
        _place: place,
        admin: caller.admin,
        seeing: state.job_readers.follow(&id),
        state,
        after,
        last_progress: None,
        pending: Vec::new(),
        ended: false,
    };
    let stream = futures::stream::unfold(follower, |mut follower| async move {
        let event = follower.next().await?;
        Some((Ok(event), follower))
    });
    Ok(Sse::new(stream).keep_alive(KeepAlive::new().interval(Duration::from_secs(10))))
}

/// One event of `GET /v1/jobs/{id}/events` as the OpenAPI document describes it, for the
/// document only (the handler writes axum's `Event`s): an object of the event's fields, as OpenAPI
/// 3.2 models an event stream, whose `data` is the JSON text of a [`JobEvent`] (`event: state`,
/// with its `id`) or of a [`JobView`] (`event: progress`; a client that tracks the last event id
/// sees the last state's).
pub struct StreamEvent;

impl utoipa::PartialSchema for StreamEvent {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        use utoipa::openapi::extensions::Extensions;
        use utoipa::openapi::schema::{ObjectBuilder, OneOfBuilder, Type};
        let string = || ObjectBuilder::new().schema_type(Type::String);
        // utoipa's schema types have no `contentMediaType`/`contentSchema` (JSON Schema 2020-12,
        // which OpenAPI 3.1 documents are): they go in as extra keys, which it writes as they are.
        let data = |payload: &str| {
            let keywords = [
                ("contentMediaType", serde_json::json!("application/json")),
                ("contentSchema", serde_json::json!({ "$ref": format!("#/components/schemas/{payload}") })),
            ];
            string()
                .description(Some(format!("A {payload} as JSON")))
                .extensions(Some(Extensions::from_iter(keywords)))
        };
        let event = |name: &str, payload: &str, id_required: bool| {
            let object = ObjectBuilder::new()
                .schema_type(Type::Object)
                .property("event", string().enum_values(Some([name])))
                .required("event")
                .property("id", string().description(Some("The state event's stream id (`<ms>-<seq>`)")))
                .property("data", data(payload))
                .required("data");
            if id_required { object.required("id") } else { object }
        };
        OneOfBuilder::new()
            .item(event("state", "JobEvent", true))
            .item(event("progress", "JobView", false))
            .description(Some("One server-sent event: a state change, or the job's progress"))
            .into()
    }
}

impl utoipa::ToSchema for StreamEvent {
    fn schemas(schemas: &mut Vec<(String, utoipa::openapi::RefOr<utoipa::openapi::schema::Schema>)>) {
        // The payloads `contentSchema` names, which utoipa cannot see through the extra keys.
        use utoipa::PartialSchema;
        schemas.push(("JobEvent".to_owned(), JobEvent::schema()));
        <JobEvent as utoipa::ToSchema>::schemas(schemas);
        schemas.push(("JobView".to_owned(), JobView::schema()));
        <JobView as utoipa::ToSchema>::schemas(schemas);
    }
}

/// Where an event stream starts: after the `Last-Event-ID` header's event, else `?after=`, else
/// from the first; 400 naming `after` for anything that is not a stream id.
pub(super) fn stream_position(headers: &HeaderMap, after: Option<String>) -> Answer<String> {
    let after = headers
        .get("last-event-id")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
        .or(after)
        .unwrap_or_else(|| "0".to_owned());
    if !valid_stream_id(&after) {
        return Err(Failure::new(
            StatusCode::BAD_REQUEST,
            "bad_query",
            "expected an event id like 1700000000000-0",
        )
        .field("after"));
    }
    Ok(after)
}

/// A Redis stream id, `MS-SEQ` or `MS`, each part a decimal `u64`: what `XREAD` takes. Anything
/// else would fail in Redis on every poll, and since Redis errors end no stream, it would never
/// end.
fn valid_stream_id(id: &str) -> bool {
    let (ms, seq) = id.split_once('-').unwrap_or((id, "0"));
    let number = |part: &str| {
        !part.is_empty() && part.bytes().all(|b| b.is_ascii_digit()) && part.parse::<u64>().is_ok()
    };
    number(ms) && number(seq)
}

/// Follows one job for an event stream, from what its job's reader reads (`api::follow`).
struct Follower {
    /// The stream's place in its team's lane, given back when the stream is dropped.
    _place: super::lanes::Ticket,
    /// Whether the caller reads the server's paths (`shown_to`).
    admin: bool,
    seeing: super::follow::Seeing<rlvr_queue::store::JobStore>,
    state: Arc<JobsState>,
    after: String,
    /// `(step, updated_at)` of the last progress sent.
    last_progress: Option<(u64, String)>,
    pending: Vec<JobEvent>,
    /// The job's final state was sent.
    ended: bool,
}

impl Follower {
    /// The next event to send; `None` ends the stream (after the final state).
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
                match &seen.view {
                    // At or past the last event (a `Last-Event-ID` beyond the end included) of a
                    // job that had ended before its events were read.
                    Some(job) if job.state.is_terminal() => return None,
                    Some(job) if job.state == JobState::Running => {
                        let mark = (job.step, job.updated_at.clone());
                        if self.last_progress.as_ref() != Some(&mark) {
                            self.last_progress = Some(mark);
                            let data = serde_json::to_string(&shown_to(&self.state, self.admin, job.clone()))
                                .unwrap_or_default();
                            return Some(Event::default().event("progress").data(data));
                        }
                    }
                    _ => {}
                }
            }
            if !super::follow::changed(&mut self.seeing, &self.state.stopping).await {
                return None;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::valid_stream_id;

    // regression: an event id of 20 digits passed and failed in Redis on every poll, so its
    // stream never ended
    #[test]
    fn event_ids_are_what_redis_takes() {
        let check = |id: &str, expected: bool| assert_eq!(valid_stream_id(id), expected, "{id:?}");
        for id in ["0", "1700000000000-0", "1700000000000", "18446744073709551615-18446744073709551615"] {
            check(id, true);
        }
        for id in [
            "",
            "-",
            "1-",
            "-1",
            "+1-0",
            "1-+0",
            "1-2-3",
            "a-0",
            "18446744073709551616-0",
            "1-99999999999999999999",
            "1 -0",
            "１-0",
        ] {
            check(id, false);
        }
    }
}
