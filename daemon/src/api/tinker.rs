//! The Tinker SDK's front door under `/api/v1` (`rlvr_protocol::tinker`): a team points the SDK
//! (`tinker.ServiceClient(base_url=…, api_key="tml-…")`) or tinker-cookbook at `rlvrd serve` and
//! runs its own training loop on rlvr's devices.
//!
//! The key is the team's token (`rlvrd token new --tinker`), read from `X-API-Key` by the same
//! check as every token route (`auth`: hashed, rate-limited, the team's open requests bounded).
//! These routes are the SDK's protocol, not rlvr's: they are not in `openapi.json`.
//!
//! Served here: the handshake (`client/config` with conservative flags, `client/dynamic_config`),
//! sessions (`create_session`, warning when the SDK is not the tested one; `session_heartbeat`,
//! 410 once finished; `sessions/{id}/finish`), `telemetry` (taken, not kept), `healthz`, and
//! `get_server_capabilities` (the base models the team may use).

use std::sync::Arc;

use axum::extract::{FromRequest, Path, Request, State};
use axum::http::StatusCode;
use axum::routing::{get, post};
use axum::{Extension, Json, Router};
use rlvr_protocol::builtin_models;
use rlvr_protocol::tinker::wire::{
    ClientConfigResponse, CreateSessionRequest, CreateSessionResponse, DynamicConfigResponse,
    FinishSessionRequest, HealthResponse, ServerCapabilities, SessionHeartbeatRequest, SupportedModel,
    TelemetryResponse,
};
use rlvr_protocol::tinker::{API_PREFIX, TESTED_SDK};
use rlvr_queue::dispatch::new_task_id;
use rlvr_queue::tinker::{Beat, TinkerStore};
use serde_json::{Value, json};

use super::auth::Caller;
use super::failure::{Answer, Failure};
use super::tinker_models as models;

/// A JSON body of the SDK's; one it cannot have sent is refused as a JSON error naming what is
/// wrong (axum's own rejection is plain text), 400 or 415.
pub struct SdkJson<T>(pub T);

impl<S: Send + Sync, T: serde::de::DeserializeOwned> FromRequest<S> for SdkJson<T> {
    type Rejection = Failure;

    async fn from_request(request: Request, state: &S) -> Result<Self, Failure> {
        match Json::<T>::from_request(request, state).await {
            Ok(Json(value)) => Ok(SdkJson(value)),
            Err(rejection) => Err(Failure::new(rejection.status(), "bad_request", rejection.body_text())),
        }
    }
}

/// The longest `sdk_version` a session's record keeps.
const MAX_SDK_VERSION: usize = 64;

/// Datums per forward/backward request the SDK is told to send at most.
const MAX_CHUNK_DATUMS: u32 = 256;

/// What the Tinker routes share.
pub struct TinkerState {
    pub store: TinkerStore,
    pub tenancy: Arc<crate::tenancy::Tenancy>,
    /// The training clients open on this daemon, and every operation's future.
    pub clients: Arc<crate::tinker::clients::Clients>,
    pub samplers: crate::tinker::samplers::Samplers,
    /// Where `tinker://` paths are saved (`TEAM/RUN/KIND/NAME`).
    pub root: std::path::PathBuf,
}

/// The routes, under [`API_PREFIX`].
pub fn routes(state: Arc<TinkerState>) -> Router {
    let route = |path: &str| format!("{API_PREFIX}/{path}");
    Router::new()
        .route(&route("client/config"), post(client_config))
        .route(&route("client/dynamic_config"), post(dynamic_config))
        .route(&route("create_session"), post(create_session))
        .route(&route("session_heartbeat"), post(session_heartbeat))
        .route(&route("sessions/{id}/finish"), post(finish_session))
        .route(&route("telemetry"), post(telemetry))
        .route(&route("healthz"), get(healthz))
        .route(&route("get_server_capabilities"), get(capabilities))
        .route(&route("create_model"), post(models::create_model))
        .route(&route("get_info"), post(models::get_info))
        .route(&route("forward_backward"), post(models::forward_backward))
        .route(&route("optim_step"), post(models::optim_step))
        .route(&route("save_weights"), post(models::save_weights))
        .route(&route("save_weights_for_sampler"), post(models::save_weights_for_sampler))
        .route(&route("load_weights"), post(models::load_weights))
        .route(&route("create_sampling_session"), post(models::create_sampling_session))
        .route(&route("samplers/{id}"), get(models::get_sampler))
        .route(&route("asample"), post(models::asample))
        .route(&route("retrieve_future"), post(models::retrieve_future))
        .with_state(state)
}

/// The SDK's code paths rlvr serves: one forward/backward chunk after another, uncompressed,
/// futures polled one by one, no JWT exchange, no server-side custom loss.
async fn client_config() -> Json<ClientConfigResponse> {
    Json(ClientConfigResponse {
        pjwt_auth_enabled: false,
        use_pyqwest_transport: false,
        parallel_fwdbwd_chunks: false,
        proto_compress_fwdbwd: false,
        fwdbwd_max_chunk_len: MAX_CHUNK_DATUMS,
        sample_use_retrieve_futures: false,
        custom_loss_server_side: false,
        sample_join_sampling_session: false,
    })
}

async fn dynamic_config() -> Json<DynamicConfigResponse> {
    Json(DynamicConfigResponse { refresh_interval_sec: 300, sample_cancel_enabled: false })
}

async fn create_session(
    State(state): State<Arc<TinkerState>>,
    Extension(caller): Extension<Caller>,
    SdkJson(request): SdkJson<CreateSessionRequest>,
) -> Answer<Json<CreateSessionResponse>> {
    // What the record keeps of the request: bounded, printable (it is logged too).
    let version = &request.sdk_version;
    if version.len() > MAX_SDK_VERSION || version.chars().any(|c| c.is_control()) {
        return Err(Failure::new(
            StatusCode::BAD_REQUEST,
            "bad_request",
            format!("sdk_version: expected at most {MAX_SDK_VERSION} printable characters"),
        )
        .field("sdk_version"));
    }
    let id = new_task_id();
    state.store.create_session(&id, &caller.team, version).await?;
    let warning_message = (request.sdk_version != TESTED_SDK).then(|| {
        format!(
            "rlvr serves the Tinker SDK as version {TESTED_SDK} speaks it; this is {:?}: pin tinker=={TESTED_SDK} \
             if a call fails",
            request.sdk_version
        )
    });
    tracing::info!(session = %id, team = %caller.team, sdk = %request.sdk_version, "tinker session opened");
    Ok(Json(CreateSessionResponse {
        session_id: id,
        warning_message,
        info_message: None,
        kind: "create_session".into(),
    }))
}

async fn session_heartbeat(
    State(state): State<Arc<TinkerState>>,
    Extension(caller): Extension<Caller>,
    SdkJson(request): SdkJson<SessionHeartbeatRequest>,
) -> Answer<Json<Value>> {
    match state.store.heartbeat(&request.session_id, &caller.team).await? {
        Beat::Alive => Ok(Json(json!({"type": "session_heartbeat"}))),
        // The SDK stops its heartbeats on 410.
        Beat::Finished(why) => Err(Failure::new(
            StatusCode::GONE,
            "session_finished",
            format!("session {} has finished ({why})", request.session_id),
        )),
        Beat::Unknown => Err(no_session(&request.session_id)),
    }
}

async fn finish_session(
    State(state): State<Arc<TinkerState>>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    SdkJson(request): SdkJson<FinishSessionRequest>,
) -> Answer<Json<Value>> {
    let why = request.reason.map_or_else(|| "success".to_owned(), |reason| reason.kind);
    if !state.store.finish(&id, &caller.team, &why).await? {
        return Err(no_session(&id));
    }
    state.clients.close_session(&id, &caller.team);
    state.samplers.close_session(&id, &caller.team);
    tracing::info!(session = %id, team = %caller.team, %why, "tinker session finished");
    Ok(Json(json!({})))
}

fn no_session(id: &str) -> Failure {
    Failure::new(StatusCode::NOT_FOUND, "not_found", format!("no session {id} of this key's team"))
}

/// The SDK's telemetry: taken and dropped (the body is bounded by `api.max_body_bytes`).
async fn telemetry() -> Json<TelemetryResponse> {
    Json(TelemetryResponse { status: "accepted".into() })
}

async fn healthz() -> Json<HealthResponse> {
    Json(HealthResponse { status: "ok".into() })
}

/// The base models the key's team may train and sample: `base_model` names for `create_model`.
async fn capabilities(
    State(state): State<Arc<TinkerState>>,
    Extension(caller): Extension<Caller>,
) -> Json<ServerCapabilities> {
    let supported_models = state
        .tenancy
        .base_model_names(&caller.team)
        .into_iter()
        .chain([builtin_models::TINY_ARITH.to_owned()])
        .map(|model_name| SupportedModel {
            model_name,
            max_context_length: None,
            trainable: true,
            sampleable: true,
        })
        .collect();
    Json(ServerCapabilities { supported_models })
}
