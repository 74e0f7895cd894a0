//! The HTTP API of `rlvrd serve` (axum): the routes of design.md §1, plus [`outcomes`]
//! (`POST /v1/jobs/{id}/promote`, `GET /v1/jobs/{id}/metrics`) and [`curricula`]
//! (`POST /v1/curricula/{name}/refresh`) that `rlvrctl promote`, `report` and `curriculum refresh`
//! need.
//!
//! - open: `GET /healthz`, `GET /metrics` (Prometheus text), `GET /v1/plugins`,
//!   `GET /v1/openapi.json`;
//! - bearer token per team ([`auth`]): the job routes of [`jobs`].
//!
//! The job routes' wire types live in `rlvr_queue::job` (rlvrctl reads them too); the plugin
//! listing's are here. The OpenAPI document is generated from the handlers' annotations and the
//! types' derives ([`ApiDoc`]), so it cannot drift from the routes; a test compares the two.

pub mod auth;
pub mod curricula;
pub mod jobs;
pub mod outcomes;

use std::sync::Arc;

use axum::Json;
use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::get;
use serde::{Deserialize, Serialize};
use utoipa::OpenApi;

use crate::health::RedisHealth;
use crate::metrics::Metrics;
use crate::registry::{LoadedPlugin, Refused, Registry};

/// What the handlers share.
#[derive(Clone)]
pub struct AppState {
    /// Loaded and refused plugins.
    pub registry: Arc<Registry>,
    /// Every exported metric.
    pub metrics: Arc<Metrics>,
    /// The last Redis ping.
    pub redis: Arc<RedisHealth>,
}

/// The API's routes; request bodies above `max_body_bytes` get 413.
pub fn router(state: AppState, jobs: Arc<jobs::JobsState>, max_body_bytes: usize) -> Router {
    let job_routes = Router::new()
        .route("/v1/jobs", get(jobs::list).post(jobs::submit))
        .route("/v1/jobs/{id}", get(jobs::show).delete(jobs::cancel))
        .route("/v1/jobs/{id}/events", get(jobs::events))
        .route("/v1/jobs/{id}/promote", axum::routing::post(outcomes::promote))
        .route("/v1/jobs/{id}/metrics", get(outcomes::metrics))
        .route("/v1/curricula/{name}/refresh", axum::routing::post(curricula::refresh))
        .with_state(jobs);
    Router::new()
        .route("/healthz", get(healthz))
        .route("/metrics", get(metrics))
        .route("/v1/plugins", get(plugins))
        .route("/v1/openapi.json", get(openapi))
        .with_state(state)
        .merge(job_routes)
        .layer(DefaultBodyLimit::max(max_body_bytes))
}

/// The OpenAPI document of every route.
#[derive(OpenApi)]
#[openapi(
    info(title = "rlvrd", description = "RL post-training jobs for many teams on shared GPUs"),
    paths(
        healthz, metrics, plugins, openapi, jobs::submit, jobs::list, jobs::show, jobs::cancel, jobs::events,
        outcomes::promote, outcomes::metrics, curricula::refresh
    ),
    modifiers(&BearerAuth),
    tags((name = "jobs", description = "Submit, follow and cancel jobs"), (name = "daemon", description = "Health, metrics, plugins"))
)]
pub struct ApiDoc;

struct BearerAuth;

impl utoipa::Modify for BearerAuth {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
        );
    }
}

/// `GET /v1/openapi.json`.
#[utoipa::path(get, path = "/v1/openapi.json", responses((status = 200, description = "This document")), tag = "daemon")]
async fn openapi() -> impl IntoResponse {
    Json(ApiDoc::openapi())
}

/// `GET /healthz`: always 200 while the daemon serves; `status` says whether all is well.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Health {
    /// `ok`, or `degraded` while Redis does not answer.
    pub status: String,
    /// `ok`, `unknown` before the first ping, or why Redis does not answer.
    pub redis: String,
    /// Plugins loaded.
    pub plugins: usize,
}

#[utoipa::path(get, path = "/healthz", responses((status = 200, body = Health)), tag = "daemon")]
async fn healthz(State(state): State<AppState>) -> Json<Health> {
    let (status, redis) = match state.redis.get() {
        Some(Ok(())) => ("ok", "ok".to_owned()),
        Some(Err(error)) => ("degraded", error),
        None => ("ok", "unknown".to_owned()),
    };
    Json(Health { status: status.to_owned(), redis, plugins: state.registry.plugins().len() })
}

#[utoipa::path(get, path = "/metrics", responses((status = 200, description = "Prometheus text format", content_type = "text/plain")), tag = "daemon")]
async fn metrics(State(state): State<AppState>) -> impl IntoResponse {
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], state.metrics.encode())
}

/// A loaded plugin, as `GET /v1/plugins` lists it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, utoipa::ToSchema)]
pub struct PluginView {
    /// `name@version`, what jobs pin.
    pub id: String,
    /// Short name.
    pub name: String,
    /// Semantic version.
    pub version: String,
    /// `verifier`, `optimizer` or `curriculum`.
    pub kind: String,
    /// One line.
    pub description: String,
    /// SHA-256 of the library, hex.
    pub sha256: String,
    /// Where it was found.
    pub source: String,
    /// Verifiers: the `reference` object they read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reference_schema: Option<String>,
    /// Optimizers: their data mode.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data_mode: Option<String>,
    /// What the plugin found about this host when it loaded (e.g. sandbox layers).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
    /// When it was loaded, RFC 3339.
    pub loaded_at: String,
}

impl From<&LoadedPlugin> for PluginView {
    fn from(plugin: &LoadedPlugin) -> Self {
        PluginView {
            id: plugin.id(),
            name: plugin.meta.name.clone(),
            version: plugin.meta.version.to_string(),
            kind: plugin.meta.kind.as_str().to_owned(),
            description: plugin.meta.description.clone(),
            sha256: plugin.sha256.clone(),
            source: plugin.source.display().to_string(),
            reference_schema: plugin.meta.reference_schema.clone(),
            data_mode: plugin.meta.data_mode.clone(),
            notes: plugin.meta.notes.clone(),
            loaded_at: humantime::format_rfc3339_millis(plugin.loaded_at).to_string(),
        }
    }
}

/// A refused library, as `GET /v1/plugins` lists it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, utoipa::ToSchema)]
pub struct RefusedView {
    /// The file.
    pub source: String,
    /// The class of problem (the `reason` label of `rlvr_plugin_refusals_total`).
    pub reason: String,
    /// What was wrong.
    pub message: String,
    /// When, RFC 3339.
    pub at: String,
}

impl From<&Refused> for RefusedView {
    fn from(refused: &Refused) -> Self {
        RefusedView {
            source: refused.source.display().to_string(),
            reason: refused.reason.as_str().to_owned(),
            message: refused.message.clone(),
            at: humantime::format_rfc3339_millis(refused.at).to_string(),
        }
    }
}

/// `GET /v1/plugins`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, utoipa::ToSchema)]
pub struct PluginList {
    /// Loaded plugins, by name then version.
    pub plugins: Vec<PluginView>,
    /// Refused files that are still present.
    pub refused: Vec<RefusedView>,
}

impl PluginList {
    /// The registry's current listing.
    pub fn from_registry(registry: &Registry) -> Self {
        PluginList {
            plugins: registry.plugins().iter().map(|plugin| PluginView::from(plugin.as_ref())).collect(),
            refused: registry.refusals().iter().map(RefusedView::from).collect(),
        }
    }
}

#[utoipa::path(get, path = "/v1/plugins", responses((status = 200, body = PluginList)), tag = "daemon")]
async fn plugins(State(state): State<AppState>) -> Json<PluginList> {
    Json(PluginList::from_registry(&state.registry))
}
