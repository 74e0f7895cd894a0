//! The HTTP API of `rlvrd serve` (axum): the routes of design.md §1, plus [`outcomes`]
//! (`POST /v1/jobs/{id}/promote`, `GET /v1/jobs/{id}/metrics`) and [`curricula`]
//! (`POST /v1/curricula/{name}/refresh`) that `rlvrctl promote`, `report` and `curriculum refresh`
//! need.
//!
//! - open: `GET /healthz`, `GET /metrics` (Prometheus text);
//! - every other route needs a team's bearer token, checked by one middleware
//!   ([`auth::require_token`]) before any extractor reads the request, so a refused request's body
//!   is never read: the job routes of [`jobs`], `GET /v1/plugins`, `GET /v1/openapi.json`.
//!
//! [`server`] serves the router: HTTP/1.1 with header, body and idle timeouts and a connection
//! limit.
//!
//! The wire types live in `rlvr-protocol` (`job` for the job routes, `api` for health and the
//! plugin listing), which rlvrctl reads too. The OpenAPI document is generated from the handlers' annotations and the
//! types' derives ([`ApiDoc`]), so it cannot drift from the routes; a test compares the two.

pub mod auth;
pub mod curricula;
pub mod follow;
pub mod jobs;
pub mod lanes;
pub mod logs;
pub mod outcomes;
pub mod pipelines;
pub mod server;
pub mod tenancy;
pub mod ui;
pub mod verify;

use std::sync::Arc;

use axum::Json;
use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::extract::State;
use axum::http::header;
use axum::middleware::from_fn_with_state;
use axum::response::IntoResponse;
use axum::routing::get;
use rlvr_plugin_host::Registry;
use rlvr_protocol::api::{Health, PluginList};
use rlvr_protocol::job::ErrorBody;
use utoipa::OpenApi;

use crate::health::RedisHealth;
use crate::metrics::Metrics;

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

/// The API's routes; request bodies above `max_body_bytes` get 413. Every route but `/healthz`
/// and `/metrics` goes through `auth`'s check first.
pub fn router(
    state: AppState,
    jobs: Arc<jobs::JobsState>,
    auth: Arc<auth::Auth>,
    max_body_bytes: usize,
) -> Router {
    let job_routes = Router::new()
        .route("/v1/jobs", get(jobs::list).post(jobs::submit))
        .route("/v1/estimate", axum::routing::post(jobs::estimate))
        .route("/v1/jobs/{id}", get(jobs::show).delete(jobs::cancel))
        .route("/v1/jobs/{id}/events", get(jobs::events))
        .route("/v1/jobs/{id}/promote", axum::routing::post(outcomes::promote))
        .route("/v1/jobs/{id}/metrics", get(outcomes::metrics))
        .route("/v1/jobs/{id}/logs", get(logs::logs))
        .route("/v1/pipelines", get(pipelines::list).post(pipelines::submit))
        .route("/v1/pipelines/{id}", get(pipelines::show).delete(pipelines::cancel))
        .route("/v1/pipelines/{id}/events", get(pipelines::events))
        .route("/v1/curricula", get(curricula::list))
        .route("/v1/curricula/{name}", axum::routing::put(curricula::share))
        .route("/v1/curricula/{name}/refresh", axum::routing::post(curricula::refresh))
        .route("/v1/datasets", get(tenancy::list_datasets))
        .route(
            "/v1/datasets/{name}",
            get(tenancy::get_dataset)
                .put(tenancy::put_dataset)
                .delete(tenancy::delete_dataset)
                // The upload streams to disk and counts against tenancy.max_dataset_bytes itself.
                .layer(DefaultBodyLimit::disable()),
        )
        .route("/v1/verify", axum::routing::post(verify::verify))
        .route("/v1/graders/validate", axum::routing::post(verify::validate))
        .route("/v1/model-lines", get(tenancy::list_lines))
        .route("/v1/model-lines/{name}", get(tenancy::get_line).put(tenancy::put_line))
        .route("/v1/model-lines/{name}/versions/{version}", get(tenancy::get_version))
        .route("/v1/model-lines/{name}/versions/{version}/files/{file}", get(tenancy::get_version_file))
        .with_state(jobs);
    let token_routes = Router::new()
        .route("/v1/plugins", get(plugins))
        .route("/v1/openapi.json", get(openapi))
        .with_state(state.clone())
        .merge(job_routes)
        // Per route, not around the router: a route added above is covered, and no path that is
        // not a route runs it.
        .route_layer(from_fn_with_state(auth, auth::require_token));
    Router::new()
        .route("/healthz", get(healthz))
        .route("/metrics", get(metrics))
        .with_state(state)
        .merge(token_routes)
        // The web page: static files, open like /healthz; its API calls carry the token.
        .merge(ui::routes())
        .layer(DefaultBodyLimit::max(max_body_bytes))
}

/// The OpenAPI document of every route.
#[derive(OpenApi)]
#[openapi(
    info(title = "rlvrd", description = "RL post-training jobs for many teams on shared GPUs"),
    paths(
        healthz, metrics, plugins, openapi, jobs::submit, jobs::estimate, jobs::list, jobs::show, jobs::cancel, jobs::events,
        outcomes::promote, outcomes::metrics, logs::logs, curricula::list, curricula::share, curricula::refresh,
        tenancy::put_dataset, tenancy::list_datasets, tenancy::get_dataset, tenancy::delete_dataset,
        tenancy::list_lines, tenancy::get_line, tenancy::put_line, tenancy::get_version, tenancy::get_version_file, verify::verify, verify::validate,
        pipelines::submit, pipelines::list, pipelines::show, pipelines::cancel, pipelines::events
    ),
    modifiers(&BearerAuth, &TokenAnswers),
    tags((name = "jobs", description = "Submit, follow and cancel jobs"), (name = "pipelines", description = "Multi-stage pipelines: each stage a job on the previous stage's output"), (name = "graders", description = "Dry-run and validate graders and rewards"), (name = "daemon", description = "Health, metrics, plugins"))
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

/// What `auth::require_token` may answer on every token route before its handler runs: 401
/// (no token, or an unknown one) and 429 (over the team's rate limit, or too many failed
/// authentications from the client's address). Added to each operation that names a security
/// requirement, so that no route's document can forget them.
struct TokenAnswers;

impl utoipa::Modify for TokenAnswers {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        use utoipa::openapi::{ContentBuilder, Ref, ResponseBuilder};
        let error = || ContentBuilder::new().schema(Some(Ref::from_schema_name("ErrorBody"))).build();
        let answers = [
            ("401", "No token, or one the daemon does not know"),
            (
                "429",
                "Over the team's api.rate_limit_per_minute, or too many failed authentications from \
                 this address (api.auth_failures_per_minute); Retry-After says when to come back",
            ),
        ];
        for item in openapi.paths.paths.values_mut() {
            let operations = [&mut item.get, &mut item.put, &mut item.post, &mut item.delete];
            for operation in operations.into_iter().flatten() {
                if operation.security.as_ref().is_none_or(Vec::is_empty) {
                    continue;
                }
                for (status, description) in answers {
                    operation.responses.responses.entry(status.to_owned()).or_insert_with(|| {
                        ResponseBuilder::new()
                            .description(description)
                            .content("application/json", error())
                            .build()
                            .into()
                    });
                }
            }
        }
    }
}

/// `GET /v1/openapi.json`.
#[utoipa::path(
    get,
    path = "/v1/openapi.json",
    responses((status = 200, description = "This document"), (status = 401, body = ErrorBody), (status = 429, body = ErrorBody)),
    security(("bearer" = [])),
    tag = "daemon"
)]
async fn openapi() -> impl IntoResponse {
    Json(ApiDoc::openapi())
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

#[utoipa::path(
    get,
    path = "/v1/plugins",
    responses((status = 200, body = PluginList), (status = 401, body = ErrorBody), (status = 429, body = ErrorBody)),
    security(("bearer" = [])),
    tag = "daemon"
)]
async fn plugins(State(state): State<AppState>) -> Json<PluginList> {
    Json(state.registry.listing())
}

#[cfg(test)]
mod tests {
    use super::ApiDoc;
    use utoipa::OpenApi;

    // regression: GET /v1/plugins needed no token though the README said it did
    #[test]
    fn every_route_but_health_and_metrics_declares_the_bearer_token() {
        let document = serde_json::to_value(ApiDoc::openapi()).unwrap();
        let mut seen = Vec::new();
        for (path, methods) in document["paths"].as_object().unwrap() {
            for (method, operation) in methods.as_object().unwrap() {
                let bearer = operation["security"]
                    .as_array()
                    .is_some_and(|list| list.iter().any(|requirement| requirement.get("bearer").is_some()));
                seen.push((format!("{} {path}", method.to_uppercase()), bearer));
            }
        }
        for (route, bearer) in &seen {
            let open = matches!(route.as_str(), "GET /healthz" | "GET /metrics");
            assert_eq!(*bearer, !open, "{route}");
        }
        assert_eq!(seen.len(), 32, "{seen:?}");
    }

    /// The statuses the document lists for `route` (`"GET /v1/jobs"`).
    fn documented(document: &serde_json::Value, route: &str) -> Vec<String> {
        let (method, path) = route.split_once(' ').unwrap();
        let responses = &document["paths"][path][method.to_lowercase()]["responses"];
        responses.as_object().unwrap_or_else(|| panic!("{route} is not documented")).keys().cloned().collect()
    }

    // regression: a request without a valid token past api.auth_failures_per_minute, or a team
    // over api.rate_limit_per_minute, got a 429 that the datasets' and model lines' routes did not
    // document
    #[test]
    fn every_token_route_documents_the_401_and_429_of_the_token_check() {
        let document = serde_json::to_value(ApiDoc::openapi()).unwrap();
        let error_body = serde_json::json!({"$ref": "#/components/schemas/ErrorBody"});
        for (path, methods) in document["paths"].as_object().unwrap() {
            for (method, operation) in methods.as_object().unwrap() {
                let route = format!("{} {path}", method.to_uppercase());
                if matches!(route.as_str(), "GET /healthz" | "GET /metrics") {
                    continue;
                }
                for status in ["401", "429"] {
                    let schema = &operation["responses"][status]["content"]["application/json"]["schema"];
                    assert_eq!(schema, &error_body, "{route} {status}");
                }
            }
        }
    }

    // regression: a name that cannot be one (`GET /v1/datasets/%C3%9A`) is 400 invalid_name,
    // and a promotion whose body is not JSON 400 bad_request, which the document did not list
    #[test]
    fn the_400s_of_names_and_bodies_are_documented() {
        let document = serde_json::to_value(ApiDoc::openapi()).unwrap();
        for route in [
            "GET /v1/datasets/{name}",
            "PUT /v1/datasets/{name}",
            "DELETE /v1/datasets/{name}",
            "GET /v1/model-lines/{name}",
            "PUT /v1/model-lines/{name}",
            "POST /v1/jobs/{id}/promote",
        ] {
            assert!(documented(&document, route).contains(&"400".to_owned()), "{route}");
        }
    }

    // regression: the event stream was documented as bare JobEvents, while each event is
    // `event`, `id` and `data` (a JobEvent or, for `progress`, a JobView, as JSON text)
    #[test]
    fn the_event_stream_documents_each_event_and_its_json_payload() {
        let document = serde_json::to_value(ApiDoc::openapi()).unwrap();
        let content = &document["paths"]["/v1/jobs/{id}/events"]["get"]["responses"]["200"]["content"];
        assert_eq!(content["text/event-stream"]["schema"]["$ref"], "#/components/schemas/StreamEvent");
        let events = document["components"]["schemas"]["StreamEvent"]["oneOf"].as_array().unwrap();
        let summary: Vec<_> = events
            .iter()
            .map(|event| {
                (
                    event["properties"]["event"]["enum"][0].as_str().unwrap(),
                    event["required"].to_string(),
                    event["properties"]["data"]["contentMediaType"].as_str().unwrap(),
                    event["properties"]["data"]["contentSchema"]["$ref"].as_str().unwrap(),
                )
            })
            .collect();
        assert_eq!(
            summary,
            [
                (
                    "state",
                    r#"["event","data","id"]"#.to_owned(),
                    "application/json",
                    "#/components/schemas/JobEvent"
                ),
                (
                    "progress",
                    r#"["event","data"]"#.to_owned(),
                    "application/json",
                    "#/components/schemas/JobView"
                ),
            ]
        );
    }

    /// Every `$ref` in `value`.
    fn refs<'a>(value: &'a serde_json::Value, found: &mut Vec<&'a str>) {
        match value {
            serde_json::Value::Object(map) => {
                if let Some(serde_json::Value::String(target)) = map.get("$ref") {
                    found.push(target);
                }
                map.values().for_each(|value| refs(value, found));
            }
            serde_json::Value::Array(items) => items.iter().for_each(|value| refs(value, found)),
            _ => {}
        }
    }

    // regression: a job's `progress`, `result` and `gates` were documented as any object, so the
    // Python client and the page wrote their models by hand
    #[test]
    fn only_free_form_fields_are_documented_as_any_object() {
        let document = serde_json::to_value(ApiDoc::openapi()).unwrap();
        // What is free-form by design: an item to grade (in any of the formats graders read), a
        // metrics line (an optimizer plugin adds figures under its own names). A plugin's options
        // are a map of its own keys (`additionalProperties`).
        let free_form = ["VerifyRequest.items", "MetricsHistory.lines"];
        let mut any_object = Vec::new();
        for (name, schema) in document["components"]["schemas"].as_object().unwrap() {
            for (field, property) in schema["properties"].as_object().into_iter().flatten() {
                let property = if property["type"] == "array" { &property["items"] } else { property };
                let typed = ["properties", "additionalProperties", "$ref", "oneOf", "allOf", "anyOf"]
                    .iter()
                    .any(|key| property.get(key).is_some());
                let object = property["type"] == "object"
                    || property["type"].as_array().is_some_and(|types| types.contains(&"object".into()));
                if object && !typed {
                    any_object.push(format!("{name}.{field}"));
                }
            }
        }
        any_object.sort();
        let mut expected = free_form.map(str::to_owned).to_vec();
        expected.sort();
        assert_eq!(any_object, expected);
    }

    // The references written by hand (the event stream's `contentSchema`) are invisible to
    // utoipa: each must still name a schema the document has.
    #[test]
    fn every_reference_names_a_schema_of_the_document() {
        let document = serde_json::to_value(ApiDoc::openapi()).unwrap();
        let mut found = Vec::new();
        refs(&document, &mut found);
        assert!(found.contains(&"#/components/schemas/JobEvent"), "{found:?}");
        for target in found {
            let name = target.strip_prefix("#/components/schemas/").unwrap_or_else(|| panic!("{target}"));
            assert!(document["components"]["schemas"].get(name).is_some(), "{target} is not in the document");
        }
    }
}
