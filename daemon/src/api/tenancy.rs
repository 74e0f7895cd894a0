//! The routes of a team's namespace: its datasets (`PUT|GET|DELETE /v1/datasets/{name}`,
//! `GET /v1/datasets`) and the model lines it owns or was granted (`GET /v1/model-lines`,
//! `GET|PUT /v1/model-lines/{name}`).
//!
//! The team is always the token's: no request names a team's namespace, so none can reach
//! another's. Another team's line is "not found", as another team's job is.
//!
//! A published version's manifest and its files are served too: only names the manifest lists,
//! streamed.

use std::path::PathBuf;
use std::sync::Arc;

use axum::Json;
use axum::body::Body;
use axum::extract::{Extension, Path, Query, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::IntoResponse;
use futures::StreamExt;
use rlvr_protocol::api::{Dataset, DatasetList, ModelLine, ModelLineList, ModelLineUpdate};
use rlvr_protocol::gates::Manifest;
use rlvr_protocol::job::ErrorBody;
use sha2::{Digest, Sha256};
use tokio::io::AsyncWriteExt;

use super::auth::Caller;
use super::failure::{Answer, Failure};
use super::jobs::JobsState;
use crate::tenancy::datasets::DatasetError;
use crate::tenancy::lines::{Actor, LineError};

impl From<DatasetError> for Failure {
    fn from(error: DatasetError) -> Self {
        let (status, code, field) = match &error {
            DatasetError::BadName => (StatusCode::BAD_REQUEST, "invalid_name", "name"),
            DatasetError::TooLarge { .. } => (StatusCode::PAYLOAD_TOO_LARGE, "body_too_large", ""),
            DatasetError::NotJsonl { .. } | DatasetError::Empty => {
                (StatusCode::UNPROCESSABLE_ENTITY, "invalid_dataset", "")
            }
            DatasetError::TooMany { .. } => (StatusCode::CONFLICT, "too_many_datasets", ""),
            DatasetError::NotFound { .. } | DatasetError::Gone { .. } => {
                (StatusCode::NOT_FOUND, "not_found", "name")
            }
            DatasetError::Io(io) => return Failure::storage("the dataset store", io),
        };
        Failure::new(status, code, error.to_string()).field(field)
    }
}

impl From<LineError> for Failure {
    fn from(error: LineError) -> Self {
        let (status, code, field) = match &error {
            LineError::BadName => (StatusCode::BAD_REQUEST, "invalid_name", "name"),
            LineError::BadTeam { field, .. } => (StatusCode::BAD_REQUEST, "invalid_team", *field),
            LineError::NotFound(_) | LineError::NoVersion { .. } | LineError::NoVersions { .. } => {
                (StatusCode::NOT_FOUND, "not_found", "name")
            }
            LineError::NotPublisher { .. } | LineError::NotOwner { .. } | LineError::OwnerNeedsAdmin => {
                (StatusCode::FORBIDDEN, "forbidden", "")
            }
            LineError::Quota { .. } => (StatusCode::FORBIDDEN, "line_quota", "name"),
            LineError::Unowned { .. } => (StatusCode::CONFLICT, "unowned", "name"),
            LineError::Io(io) => return Failure::storage("the registry", io),
        };
        Failure::new(status, code, error.to_string()).field(field)
    }
}

fn join_error(error: tokio::task::JoinError) -> Failure {
    Failure::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", error.to_string())
}

/// `PUT /v1/datasets/{name}` options.
#[derive(Debug, serde::Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
pub struct PutDatasetQuery {
    /// Check the body as an upload does and keep its content for a dry run's spec to cite
    /// (`dataset:NAME@SHA256`, the answer's `sha256`), but point no name at it: the team's names
    /// stay as they are, and the content goes once unused for `tenancy.dataset_grace_s`.
    #[serde(default)]
    pub dry_run: bool,
}

/// `PUT /v1/datasets/{name}`: the body (JSONL) becomes dataset `name` of the caller's team (with
/// `dry_run=true`, content a dry run may cite, and no name moves). The content a name pointed at
/// before stays while a job, pipeline or published version cites it.
#[utoipa::path(
    put,
    path = "/v1/datasets/{name}",
    params(("name" = String, Path, description = "Dataset name"), PutDatasetQuery),
    request_body(content = String, description = "JSONL: one JSON object per line", content_type = "application/x-ndjson"),
    responses(
        (status = 201, description = "A new name", body = Dataset),
        (status = 200, description = "The name now points at this content; with dry_run=true, the content is checked and kept, and no name points at it", body = Dataset),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 409, body = ErrorBody),
        (status = 413, body = ErrorBody), (status = 422, body = ErrorBody), (status = 429, body = ErrorBody),
    ),
    security(("bearer" = [])),
    tag = "datasets"
)]
pub async fn put_dataset(
    State(state): State<Arc<JobsState>>,
    Extension(caller): Extension<Caller>,
    headers: axum::http::HeaderMap,
    Path(name): Path<String>,
    Query(query): Query<PutDatasetQuery>,
    body: Body,
) -> Answer<(StatusCode, Json<Dataset>)> {
    if !rlvr_protocol::names::valid_name(&name) {
        return Err(DatasetError::BadName.into());
    }
    let datasets = &state.tenancy.datasets;
    let declared = headers
        .get(axum::http::header::CONTENT_LENGTH)
        .and_then(|value| value.to_str().ok()?.parse::<u64>().ok());
    if declared.is_some_and(|length| length > datasets.max_bytes()) {
        // Refused before a byte is read.
        return Err(DatasetError::TooLarge { limit: datasets.max_bytes() }.into());
    }
    let incoming = datasets.incoming(&caller.team).map_err(DatasetError::from)?;
    let received = receive(body, &incoming, datasets.max_bytes()).await;
    let (sha256, bytes) = match received {
        Ok(received) => received,
        Err(failure) => {
            let _ = tokio::fs::remove_file(&incoming).await;
            return Err(failure);
        }
    };
    let tenancy = state.tenancy.clone();
    let team = caller.team.clone();
    if query.dry_run {
        let dataset = tokio::task::spawn_blocking(move || {
            tenancy.datasets.keep_content(&team, &name, &incoming, &sha256, bytes)
        })
        .await
        .map_err(join_error)??;
        tracing::info!(team = %caller.team, dataset = %dataset.name, bytes, "dataset checked for a dry run");
        return Ok((StatusCode::OK, Json(dataset)));
    }
    let (dataset, created) = tokio::task::spawn_blocking(move || {
        tenancy.datasets.finish(&team, &name, &incoming, &sha256, bytes, tenancy.max_datasets())
    })
    .await
    .map_err(join_error)??;
    tracing::info!(team = %caller.team, dataset = %dataset.name, bytes, "dataset uploaded");
    Ok((if created { StatusCode::CREATED } else { StatusCode::OK }, Json(dataset)))
}

/// Streams `body` into `file`, hashing it; at most `limit` bytes.
async fn receive(body: Body, file: &std::path::Path, limit: u64) -> Answer<(String, u64)> {
    let mut out = tokio::fs::File::create(file).await.map_err(DatasetError::from)?;
    let mut hasher = Sha256::new();
    let mut bytes = 0u64;
    let mut stream = body.into_data_stream();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|error| {
            Failure::new(StatusCode::BAD_REQUEST, "bad_body", format!("cannot read the body: {error}"))
        })?;
        bytes = bytes.saturating_add(chunk.len() as u64);
        if bytes > limit {
            return Err(DatasetError::TooLarge { limit }.into());
        }
        hasher.update(&chunk);
        out.write_all(&chunk).await.map_err(DatasetError::from)?;
    }
    out.flush().await.map_err(DatasetError::from)?;
    Ok((hex::encode(hasher.finalize()), bytes))
}

/// `GET /v1/datasets`: the caller's team's datasets.
#[utoipa::path(get, path = "/v1/datasets", responses((status = 200, body = DatasetList), (status = 401, body = ErrorBody)), security(("bearer" = [])), tag = "datasets")]
pub async fn list_datasets(
    State(state): State<Arc<JobsState>>,
    Extension(caller): Extension<Caller>,
) -> Answer<Json<DatasetList>> {
    let tenancy = state.tenancy.clone();
    let datasets = tokio::task::spawn_blocking(move || tenancy.datasets.list(&caller.team))
        .await
        .map_err(join_error)??;
    Ok(Json(DatasetList { datasets }))
}

/// `GET /v1/datasets/{name}`.
#[utoipa::path(get, path = "/v1/datasets/{name}", params(("name" = String, Path, description = "Dataset name")), responses((status = 200, body = Dataset), (status = 400, description = "Not a dataset name", body = ErrorBody), (status = 401, body = ErrorBody), (status = 404, body = ErrorBody)), security(("bearer" = [])), tag = "datasets")]
pub async fn get_dataset(
    State(state): State<Arc<JobsState>>,
    Extension(caller): Extension<Caller>,
    Path(name): Path<String>,
) -> Answer<Json<Dataset>> {
    let tenancy = state.tenancy.clone();
    let dataset = tokio::task::spawn_blocking(move || {
        tenancy.datasets.get(&caller.team, &name)?.ok_or(DatasetError::NotFound { team: caller.team, name })
    })
    .await
    .map_err(join_error)??;
    Ok(Json(dataset))
}

/// `DELETE /v1/datasets/{name}`: the name goes; its content stays while a job, pipeline or
/// published version cites it (`tenancy.dataset_grace_s`).
#[utoipa::path(delete, path = "/v1/datasets/{name}", params(("name" = String, Path, description = "Dataset name")), responses((status = 204, description = "Deleted"), (status = 400, description = "Not a dataset name", body = ErrorBody), (status = 401, body = ErrorBody), (status = 404, body = ErrorBody)), security(("bearer" = [])), tag = "datasets")]
pub async fn delete_dataset(
    State(state): State<Arc<JobsState>>,
    Extension(caller): Extension<Caller>,
    Path(name): Path<String>,
) -> Answer<StatusCode> {
    let tenancy = state.tenancy.clone();
    tokio::task::spawn_blocking(move || tenancy.datasets.delete(&caller.team, &name))
        .await
        .map_err(join_error)??;
    Ok(StatusCode::NO_CONTENT)
}

/// `GET /v1/model-lines`: the lines the caller's team owns or was granted (every line for admins).
#[utoipa::path(get, path = "/v1/model-lines", responses((status = 200, body = ModelLineList), (status = 401, body = ErrorBody)), security(("bearer" = [])), tag = "model lines")]
pub async fn list_lines(
    State(state): State<Arc<JobsState>>,
    Extension(caller): Extension<Caller>,
) -> Answer<Json<ModelLineList>> {
    let tenancy = state.tenancy.clone();
    let lines = tokio::task::spawn_blocking(move || {
        tenancy.lines.list(Actor { team: &caller.team, admin: caller.admin })
    })
    .await
    .map_err(join_error)??;
    Ok(Json(ModelLineList { lines }))
}

/// `GET /v1/model-lines/{name}`.
#[utoipa::path(get, path = "/v1/model-lines/{name}", params(("name" = String, Path, description = "Model line")), responses((status = 200, body = ModelLine), (status = 400, description = "Not a model line name", body = ErrorBody), (status = 401, body = ErrorBody), (status = 404, body = ErrorBody)), security(("bearer" = [])), tag = "model lines")]
pub async fn get_line(
    State(state): State<Arc<JobsState>>,
    Extension(caller): Extension<Caller>,
    Path(name): Path<String>,
) -> Answer<Json<ModelLine>> {
    let tenancy = state.tenancy.clone();
    let line = tokio::task::spawn_blocking(move || {
        tenancy.lines.get(Actor { team: &caller.team, admin: caller.admin }, &name)
    })
    .await
    .map_err(join_error)??;
    Ok(Json(line))
}

/// A version in a route: a number, or `latest`.
fn version_number(text: &str) -> Answer<Option<u64>> {
    match text {
        "latest" => Ok(None),
        number => number.parse().map(Some).map_err(|_| {
            Failure::new(
                StatusCode::BAD_REQUEST,
                "bad_version",
                format!("{text:?} is not a version number or `latest`"),
            )
            .field("version")
        }),
    }
}

/// The manifest and directory of a version the caller may read.
async fn published(
    state: &JobsState,
    caller: Caller,
    name: String,
    version: &str,
) -> Answer<(Manifest, PathBuf)> {
    let version = version_number(version)?;
    let tenancy = state.tenancy.clone();
    Ok(tokio::task::spawn_blocking(move || {
        tenancy.lines.published(Actor { team: &caller.team, admin: caller.admin }, &name, version)
    })
    .await
    .map_err(join_error)??)
}

/// `GET /v1/model-lines/{name}/versions/{version}`: a published version's manifest.
#[utoipa::path(
    get,
    path = "/v1/model-lines/{name}/versions/{version}",
    params(("name" = String, Path, description = "Model line"), ("version" = String, Path, description = "A version number, or `latest`")),
    responses(
        (status = 200, description = "The version's manifest.json: the job, step, plugins, data, metrics, gates, spec, and each file's SHA-256 (`files`)", content_type = "application/json"),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 404, body = ErrorBody),
    ),
    security(("bearer" = [])),
    tag = "model lines"
)]
pub async fn get_version(
    State(state): State<Arc<JobsState>>,
    Extension(caller): Extension<Caller>,
    Path((name, version)): Path<(String, String)>,
) -> Answer<Json<Manifest>> {
    let admin = caller.admin;
    let (manifest, _) = published(&state, caller, name, &version).await?;
    Ok(Json(super::jobs::shown_to(&state, admin, manifest)))
}

/// `GET /v1/model-lines/{name}/versions/{version}/files/{file}`: one file of a published version,
/// as its manifest names it (check it against the manifest's `files` SHA-256).
#[utoipa::path(
    get,
    path = "/v1/model-lines/{name}/versions/{version}/files/{file}",
    params(
        ("name" = String, Path, description = "Model line"), ("version" = String, Path, description = "A version number, or `latest`"),
        ("file" = String, Path, description = "A file the version's manifest names in `files`"),
    ),
    responses(
        (status = 200, description = "The file's bytes", content_type = "application/octet-stream"),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 404, body = ErrorBody),
    ),
    security(("bearer" = [])),
    tag = "model lines"
)]
pub async fn get_version_file(
    State(state): State<Arc<JobsState>>,
    Extension(caller): Extension<Caller>,
    Path((name, version, file)): Path<(String, String, String)>,
) -> Answer<axum::response::Response> {
    let (manifest, dir) = published(&state, caller, name, &version).await?;
    // Only names the manifest lists: never a path the request makes up.
    if !manifest.files.contains_key(&file) {
        return Err(Failure::new(
            StatusCode::NOT_FOUND,
            "not_found",
            format!("version {} of {:?} has no file {file:?}", manifest.version, manifest.model_line),
        )
        .field("file"));
    }
    let opened = tokio::fs::File::open(dir.join(&file)).await.map_err(|error| {
        tracing::error!(%error, file, "a published file");
        Failure::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", "the registry failed; retry later")
    })?;
    let length = opened.metadata().await.map(|meta| meta.len()).ok();
    let mut response = Body::from_stream(tokio_util::io::ReaderStream::new(opened)).into_response();
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/octet-stream"));
    if let Some(length) = length {
        headers.insert(header::CONTENT_LENGTH, HeaderValue::from(length));
    }
    Ok(response)
}

/// `PUT /v1/model-lines/{name}`: creates the line for the caller's team, or changes its readers,
/// publishers or gate policy (its owner or an admin; only an admin hands it to another team).
#[utoipa::path(
    put,
    path = "/v1/model-lines/{name}",
    params(("name" = String, Path, description = "Model line")),
    request_body = ModelLineUpdate,
    responses(
        (status = 201, description = "Created", body = ModelLine), (status = 200, description = "Changed", body = ModelLine),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody),
        (status = 404, body = ErrorBody), (status = 409, body = ErrorBody),
    ),
    security(("bearer" = [])),
    tag = "model lines"
)]
pub async fn put_line(
    State(state): State<Arc<JobsState>>,
    Extension(caller): Extension<Caller>,
    Path(name): Path<String>,
    update: Result<Json<ModelLineUpdate>, axum::extract::rejection::JsonRejection>,
) -> Answer<(StatusCode, Json<ModelLine>)> {
    let Json(update) = update
        .map_err(|rejection| Failure::new(StatusCode::BAD_REQUEST, "invalid_body", rejection.body_text()))?;
    let tenancy = state.tenancy.clone();
    let (line, created) = tokio::task::spawn_blocking(move || {
        tenancy.lines.update(Actor { team: &caller.team, admin: caller.admin }, &name, update)
    })
    .await
    .map_err(join_error)??;
    Ok((if created { StatusCode::CREATED } else { StatusCode::OK }, Json(line)))
}
