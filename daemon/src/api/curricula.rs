//! A team's curricula: `GET /v1/curricula` (its own and those shared with it),
//! `PUT /v1/curricula/{name}` (the teams it shares one with), and
//! `POST /v1/curricula/{name}/refresh`, the nightly update, run at most once per curriculum and
//! UTC date however many hosts or timers ask.
//!
//! The first asker of the day claims `rlvr:curriculum-refresh:{name}:{date}` in Redis and runs
//! [`crate::curricula::refresh`]; the claim then holds the version it wrote for two days. Later
//! askers get that version back (`ran: false`). While the refresh runs the claim expires after an
//! hour, so a daemon that died mid-refresh does not block the day; a refresh that fails gives
//! the claim up at once, so a retry runs.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use axum::Json;
use axum::extract::{Extension, Path, State};
use axum::http::StatusCode;
use rlvr_protocol::api::{CurriculumList, CurriculumUpdate, Refreshed};
use rlvr_protocol::job::ErrorBody;

use super::auth::Caller;
use super::failure::{Answer, Failure};
use super::jobs::JobsState;
use crate::curricula;
use crate::tenancy::curricula::CurriculumError;

impl From<CurriculumError> for Failure {
    fn from(error: CurriculumError) -> Self {
        match &error {
            CurriculumError::BadName(_) => {
                Failure::new(StatusCode::BAD_REQUEST, "invalid_name", error.to_string()).field("name")
            }
            CurriculumError::BadReader { index, .. } => {
                Failure::new(StatusCode::BAD_REQUEST, "invalid_team", error.to_string())
                    .field(&format!("readers[{index}]"))
            }
            CurriculumError::Io(io) => Failure::storage("the curricula directory", io),
        }
    }
}

fn join_error(error: tokio::task::JoinError) -> Failure {
    Failure::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", format!("the request failed: {error}"))
}

/// `GET /v1/curricula`: the caller's team's curricula and those other teams shared with it
/// (every team's for an admin).
#[utoipa::path(get, path = "/v1/curricula", responses((status = 200, body = CurriculumList), (status = 401, body = ErrorBody), (status = 429, body = ErrorBody)), security(("bearer" = [])), tag = "curricula")]
pub async fn list(
    State(state): State<Arc<JobsState>>,
    Extension(caller): Extension<Caller>,
) -> Answer<Json<CurriculumList>> {
    let tenancy = state.tenancy.clone();
    let curricula = tokio::task::spawn_blocking(move || tenancy.curricula.list(&caller.team, caller.admin))
        .await
        .map_err(join_error)??;
    Ok(Json(CurriculumList { curricula }))
}

/// `PUT /v1/curricula/{name}`: the teams the caller's team shares its curriculum `name` with.
/// Their jobs may start from it (`[curriculum] name = "TEAM/NAME"`); they never feed it.
#[utoipa::path(
    put,
    path = "/v1/curricula/{name}",
    params(("name" = String, Path, description = "Curriculum name")),
    request_body = CurriculumUpdate,
    responses(
        (status = 201, description = "Shared before its first version", body = CurriculumUpdate),
        (status = 200, description = "Changed", body = CurriculumUpdate),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 429, body = ErrorBody),
    ),
    security(("bearer" = [])),
    tag = "curricula"
)]
pub async fn share(
    State(state): State<Arc<JobsState>>,
    Extension(caller): Extension<Caller>,
    Path(name): Path<String>,
    update: Result<Json<CurriculumUpdate>, axum::extract::rejection::JsonRejection>,
) -> Answer<(StatusCode, Json<CurriculumUpdate>)> {
    let Json(update) = update
        .map_err(|rejection| Failure::new(StatusCode::BAD_REQUEST, "invalid_body", rejection.body_text()))?;
    let tenancy = state.tenancy.clone();
    let (created, readers) = tokio::task::spawn_blocking(move || {
        let created = tenancy.curricula.set_readers(&caller.team, &name, &update.readers)?;
        tracing::info!(team = %caller.team, curriculum = %name, readers = ?update.readers, "curriculum shared");
        Ok::<_, CurriculumError>((created, tenancy.curricula.readers(&caller.team, &name)?))
    })
    .await
    .map_err(join_error)??;
    Ok((if created { StatusCode::CREATED } else { StatusCode::OK }, Json(CurriculumUpdate { readers })))
}

/// Old evidence's weight at each refresh: a prompt's counts halve every night, so the
/// difficulty follows the models trained on it within days.
pub const REFRESH_DECAY: f64 = 0.5;
/// How long a running refresh holds the day's claim (it renews nothing: see the module docs).
const RUNNING_CLAIM: Duration = Duration::from_secs(3600);
/// How long the day's claim remembers the version written: past the end of the day anywhere.
const DONE_CLAIM: Duration = Duration::from_secs(2 * 86_400);

/// `POST /v1/curricula/{name}/refresh`: recompute per-prompt difficulty from the recent rollout
/// records of the jobs naming curriculum `name` and write its next version — once a day.
#[utoipa::path(
    post,
    path = "/v1/curricula/{name}/refresh",
    params(("name" = String, Path, description = "Curriculum name")),
    responses(
        (status = 200, body = Refreshed),
        (status = 401, body = ErrorBody), (status = 429, body = ErrorBody),
        (status = 422, description = "Not a curriculum name", body = ErrorBody),
        (status = 500, description = "The refresh failed (the next request retries)", body = ErrorBody),
    ),
    security(("bearer" = [])),
    tag = "jobs"
)]
pub async fn refresh(
    State(state): State<Arc<JobsState>>,
    Extension(caller): Extension<Caller>,
    Path(name): Path<String>,
) -> Answer<Json<Refreshed>> {
    if !curricula::valid_name(&name) {
        return Err(Failure::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_name",
            format!("expected a curriculum name of {}, got {name:?}", curricula::NAME_RULE),
        )
        .field("name"));
    }
    let now = SystemTime::now();
    let date = rlvr_protocol::time::utc_date(now);
    // Curricula are the team's: its refresh, its day's claim.
    let key = format!("rlvr:curriculum-refresh:{}:{name}:{date}", caller.team);
    let store = &state.queues.store;
    let me = format!("running on {} pid {} for team {}", host_name(), std::process::id(), caller.team);
    if let Some(holder) = store.claim(&key, &me, RUNNING_CLAIM).await? {
        let version = holder.strip_prefix("version ").and_then(|v| v.parse().ok());
        let message = match version {
            Some(version) => format!("curriculum {name} was refreshed already on {date}: version {version}"),
            None => format!("a refresh of curriculum {name} for {date} is {holder}"),
        };
        return Ok(Json(Refreshed { name, date, ran: false, version, records: None, message }));
    }
    let (jobs_dir, curricula_dir, name2, team) = (
        state.state_dir.jobs().path().to_owned(),
        state.state_dir.curricula().join(&caller.team),
        name.clone(),
        caller.team.clone(),
    );
    let outcome = tokio::task::spawn_blocking(move || {
        curricula::refresh(&jobs_dir, &curricula_dir, &team, &name2, REFRESH_DECAY, now)
            .map_err(|e| e.to_string())
    })
    .await
    .unwrap_or_else(|panic| Err(format!("the refresh panicked: {panic}")));
    match outcome {
        Ok(version) => {
            store.settle_claim(&key, &format!("version {}", version.version), DONE_CLAIM).await?;
            let message = format!(
                "curriculum {name} version {} written from {} rollout records of {} jobs ({} prompts)",
                version.version,
                version.records.count,
                version.records.jobs.len(),
                version.prompts.len()
            );
            tracing::info!(curriculum = %name, version = version.version, records = version.records.count, "curriculum refreshed");
            Ok(Json(Refreshed {
                name,
                date,
                ran: true,
                version: Some(version.version),
                records: Some(version.records.count),
                message,
            }))
        }
        Err(message) => {
            store.release_claim(&key).await?;
            Err(Failure::new(StatusCode::INTERNAL_SERVER_ERROR, "refresh_failed", message))
        }
    }
}

fn host_name() -> String {
    let name = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    if name.trim().is_empty() { "?".to_owned() } else { name.trim().to_owned() }
}
