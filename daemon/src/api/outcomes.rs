//! The routes past training (issue 7, beyond design.md §1's list): an admin's forced promotion of
//! a refused candidate, and a job's metrics history for reports.

use std::sync::Arc;

use axum::Json;
use axum::extract::{Extension, Path, Query, State};
use axum::http::StatusCode;
use rlvr_protocol::api::PromoteRequest;
use rlvr_protocol::job::{ErrorBody, JobView, MetricsHistory};

use super::auth::Caller;
use super::failure::{Answer, Failure};
use super::jobs::{JobsState, visible_job};
use crate::jobs::promote::{self, PromoteError, Promotion};

/// `POST /v1/jobs/{id}/promote`: publishes a refused job's candidate over its gates. Admin tokens
/// only; the override (who, why, when) is recorded in the manifest and the job's gate report.
#[utoipa::path(
    post,
    path = "/v1/jobs/{id}/promote",
    params(("id" = String, Path, description = "Job id")),
    request_body = PromoteRequest,
    responses(
        (status = 200, description = "Published", body = JobView),
        (status = 400, description = "Not a PromoteRequest as JSON", body = ErrorBody),
        (status = 401, body = ErrorBody), (status = 403, description = "Not an admin token", body = ErrorBody),
        (status = 404, body = ErrorBody),
        (status = 409, description = "Not a refused job", body = ErrorBody),
        (status = 408, description = "The body came slower than api.body_timeout_s", body = ErrorBody),
        (status = 422, description = "force is not true, or no reason", body = ErrorBody),
        (status = 429, body = ErrorBody),
    ),
    security(("bearer" = [])),
    tag = "jobs"
)]
pub async fn promote(
    State(state): State<Arc<JobsState>>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    body: Result<Json<PromoteRequest>, axum::extract::rejection::JsonRejection>,
) -> Answer<Json<JobView>> {
    let job = visible_job(&state, &caller, &id).await?;
    let request = match body {
        Ok(Json(request)) => request,
        // A token that may not promote hears that first, whatever it sent.
        Err(_) if !caller.admin => {
            return Err(promote_failure(PromoteError::NotAdmin { team: caller.team.clone() }));
        }
        Err(rejection) => {
            return Err(Failure::new(StatusCode::BAD_REQUEST, "bad_request", rejection.body_text()));
        }
    };
    let promotion =
        Promotion { team: &caller.team, admin: caller.admin, force: request.force, reason: &request.reason };
    match promote::promote(&state.queues, &state.tenancy, &state.outbound, &job, promotion).await {
        Ok(job) => Ok(Json(job)),
        Err(error) => Err(promote_failure(error)),
    }
}

/// The answer to a promotion that did not publish.
fn promote_failure(error: PromoteError) -> Failure {
    let message = error.to_string();
    match error {
        PromoteError::NotAdmin { .. } => Failure::new(StatusCode::FORBIDDEN, "forbidden", message),
        PromoteError::NotForced => {
            Failure::new(StatusCode::UNPROCESSABLE_ENTITY, "invalid_request", message).field("force")
        }
        PromoteError::Reason => {
            Failure::new(StatusCode::UNPROCESSABLE_ENTITY, "invalid_request", message).field("reason")
        }
        PromoteError::NotRefused { .. } | PromoteError::NoCandidate { .. } => {
            Failure::new(StatusCode::CONFLICT, "not_refused", message)
        }
        PromoteError::Publish(_) => {
            Failure::new(StatusCode::INTERNAL_SERVER_ERROR, "publish_failed", message)
        }
        PromoteError::Store(error) => error.into(),
    }
}

/// The most bytes of `metrics.jsonl` one `GET /v1/jobs/{id}/metrics` reads: 4 MiB (some 10,000
/// steps' lines); the default.
pub const MAX_METRICS_WINDOW: u64 = 4 << 20;

/// `GET /v1/jobs/{id}/metrics` query.
#[derive(Debug, serde::Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
pub struct MetricsQuery {
    /// Byte offset to read from (the `end` of the previous answer); unset: the first line.
    since: Option<u64>,
    /// At most this many bytes of lines (default and most: 4 MiB); always one line at least.
    bytes: Option<u64>,
}

/// `GET /v1/jobs/{id}/metrics`: the metrics lines the job's worker logged (none before its
/// first step), a window at a time: from `since`, at most `bytes`. The whole history is the
/// windows up to `end` = `size`; a follower asks from its last `end`.
#[utoipa::path(
    get,
    path = "/v1/jobs/{id}/metrics",
    params(("id" = String, Path, description = "Job id"), MetricsQuery),
    responses(
        (status = 200, body = MetricsHistory), (status = 400, body = ErrorBody),
        (status = 401, body = ErrorBody), (status = 404, body = ErrorBody), (status = 429, body = ErrorBody),
    ),
    security(("bearer" = [])),
    tag = "jobs"
)]
pub async fn metrics(
    State(state): State<Arc<JobsState>>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    query: Result<Query<MetricsQuery>, axum::extract::rejection::QueryRejection>,
) -> Answer<Json<MetricsHistory>> {
    let Query(query) = query
        .map_err(|rejection| Failure::new(StatusCode::BAD_REQUEST, "bad_query", rejection.body_text()))?;
    let max = super::logs::window_bytes(query.bytes, MAX_METRICS_WINDOW)?;
    visible_job(&state, &caller, &id).await?;
    let run = state.state_dir.jobs().job(&id).run();
    let since = query.since.unwrap_or(0);
    let history = tokio::task::spawn_blocking(move || run.read_metrics_window(since, max))
        .await
        .map_err(|error| Failure::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", error.to_string()))?
        .map_err(|error| {
            tracing::error!(job = %id, %error, "the job's metrics.jsonl cannot be read");
            Failure::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "unreadable",
                "the job's metrics cannot be read now",
            )
        })?;
    Ok(Json(history))
}
