//! The Tinker SDK's training and sampling routes under `/api/v1` (the handshake and sessions are
//! `api::tinker`'s): `create_model`, `get_info`, `forward_backward`, `optim_step`,
//! `save_weights`, `save_weights_for_sampler`, `load_weights`, `create_sampling_session`,
//! `samplers/{id}`, `asample` and `retrieve_future`.
//!
//! Each operation answers at once with the request id the SDK polls; the client's process
//! (`tinker::clients`) runs it in `seq_id` order, and `retrieve_future` holds a poll until it
//! ends or [`POLL_HOLD`] passes (then `try_again`, with `paused_capacity` and the reason while
//! the client waits for a device). A request's fault is a `user` failure of its future, or a 4xx
//! naming the field when it cannot become an operation at all.

use std::path::{Path as FsPath, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use rlvr_protocol::builtin_models;
use rlvr_protocol::tinker::process::{Answer as OperationAnswer, ClientCommand, SDK_BASE_FILE};
use rlvr_protocol::tinker::proto::{ForwardBackwardHead, Message};
use rlvr_protocol::tinker::wire::{
    AdamParams, CreateModelRequest, CreateSamplingSessionRequest, CreateSamplingSessionResponse,
    ErrorCategory, GetInfoRequest, GetInfoResponse, GetSamplerResponse, LoadWeightsRequest, LoraConfig,
    ModelData, OptimStepRequest, OptimizerConfig, QueueState, RequestFailed, RetrieveFutureRequest,
    SampleRequest, SaveWeightsForSamplerRequest, SaveWeightsRequest, TryAgain, UntypedFuture,
};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use super::auth::Caller;
use super::failure::{Answer, Failure};
use super::tinker::{SdkJson, TinkerState};
use crate::tinker::clients::{Client, ClientSpec, OpenError, Refusal, Start, SubmitError};
use crate::tinker::futures::FutureState;
use crate::tinker::order::OrderError;
use crate::tinker::samplers::{KEPT_SNAPSHOTS, Sampler, Samplers};
use rlvr_protocol::tinker::paths::{PathKind, TinkerPath};

/// How long `retrieve_future` holds a poll for its operation (the SDK gives up at 45 s, and
/// polls again at once after a `try_again`).
pub const POLL_HOLD: Duration = Duration::from_secs(20);

/// How long a poll is held for an operation waiting for a device: shorter, so that the SDK
/// hears the reason soon (it logs it), and still a poll every few seconds at most.
pub const PAUSED_POLL_HOLD: Duration = Duration::from_secs(3);

/// The LoRA rank a client gets when `create_model` names none (the SDK's default).
const DEFAULT_RANK: u32 = 32;
/// The largest LoRA rank served.
const MAX_RANK: u32 = 256;

/// The base model the team names, where it is: a base model of the team's, or the demo's
/// built-in one. Not the random models at published shapes: a client process is scheduled with
/// `[tinker] memory_gb` (4 GB by default), far below what an 8B shape needs.
fn base_model(state: &TinkerState, team: &str, name: &str) -> Result<String, Failure> {
    if name == builtin_models::TINY_ARITH {
        return Ok(name.to_owned());
    }
    state.tenancy.base_model(team, name).map(|path| path.display().to_string()).map_err(|message| {
        Failure::new(
            StatusCode::BAD_REQUEST,
            "bad_request",
            format!("{message}; get_server_capabilities lists the team's base models"),
        )
        .field("base_model")
    })
}

fn bad(field: &str, message: impl Into<String>) -> Failure {
    Failure::new(StatusCode::BAD_REQUEST, "bad_request", message).field(field)
}

fn not_found(what: &str) -> Failure {
    Failure::new(StatusCode::NOT_FOUND, "not_found", format!("no {what} of this key's team"))
}

/// The session must be the team's and not finished.
async fn live_session(state: &TinkerState, id: &str, team: &str) -> Result<(), Failure> {
    match state.store.session(id, team).await? {
        Some(session) if session.finished.is_none() => Ok(()),
        Some(session) => Err(Failure::new(
            StatusCode::GONE,
            "session_finished",
            format!("session {id} has finished ({})", session.finished.unwrap_or_default()),
        )),
        None => Err(not_found(&format!("session {id}"))),
    }
}

fn client(state: &TinkerState, id: &str, team: &str) -> Result<Arc<Client>, Failure> {
    state.clients.get(id, team).ok_or_else(|| not_found(&format!("training client {id} open on this daemon")))
}

fn open_failure(error: OpenError) -> Failure {
    match error {
        OpenError::TooMany { .. } => {
            Failure::new(StatusCode::TOO_MANY_REQUESTS, "too_many_clients", error.to_string()).retry(60)
        }
        OpenError::Stopping => Failure::new(StatusCode::SERVICE_UNAVAILABLE, "stopping", error.to_string()),
        OpenError::Taken { .. } => Failure::new(StatusCode::CONFLICT, "conflict", error.to_string()),
    }
}

fn submit_failure(error: SubmitError) -> Failure {
    match error {
        SubmitError::Order(
            OrderError::Reused { .. } | OrderError::Forgotten { .. } | OrderError::TooFarAhead { .. },
        ) => bad("seq_id", error.to_string()),
        // The SDK waits and sends it again: pending operations end.
        SubmitError::Full(_) => {
            Failure::new(StatusCode::TOO_MANY_REQUESTS, "busy", error.to_string()).retry(5)
        }
    }
}

fn fingerprint(parts: &[&[u8]]) -> [u8; 32] {
    let mut hash = Sha256::new();
    for part in parts {
        hash.update((part.len() as u64).to_le_bytes());
        hash.update(part);
    }
    hash.finalize().into()
}

fn json_fingerprint(value: &impl serde::Serialize) -> [u8; 32] {
    fingerprint(&[&serde_json::to_vec(value).unwrap_or_default()])
}

fn future(request_id: String, model_id: Option<&str>) -> Json<UntypedFuture> {
    Json(UntypedFuture { request_id, model_id: model_id.map(str::to_owned), sample_sequence_ids: None })
}

/// The LoRA config of a saved state's adapter (its rank and layers), read from its PEFT
/// `adapter_config.json`.
fn saved_lora(dir: &FsPath) -> Result<(LoraConfig, String), String> {
    let file = dir.join("adapter").join("adapter_config.json");
    let text = std::fs::read_to_string(&file).map_err(|e| format!("the saved state is unreadable: {e}"))?;
    let config: Value =
        serde_json::from_str(&text).map_err(|e| format!("the saved state's adapter config: {e}"))?;
    let rank = config["r"]
        .as_u64()
        .and_then(|r| u32::try_from(r).ok())
        .ok_or("the saved state's adapter has no rank")?;
    let targets: Vec<String> = config["target_modules"]
        .as_array()
        .map(|list| list.iter().filter_map(|t| t.as_str().map(str::to_owned)).collect())
        .unwrap_or_default();
    let any = |names: &[&str]| targets.iter().any(|t| names.contains(&t.as_str()));
    let lora = LoraConfig {
        rank,
        seed: None,
        train_unembed: any(&["lm_head"]),
        train_mlp: any(&["gate_proj", "up_proj", "down_proj"]),
        train_attn: any(&["q_proj", "k_proj", "v_proj", "o_proj"]),
    };
    // The SDK's name of the base, kept beside the adapter (which names where it is).
    let base = std::fs::read_to_string(dir.join(SDK_BASE_FILE))
        .map_err(|e| format!("the saved state has no {SDK_BASE_FILE}: {e}"))?;
    Ok((lora, base.trim().to_owned()))
}

/// A `tinker://` path of the team's that exists: its parsed form and directory.
fn saved(state: &TinkerState, team: &str, text: &str, field: &str) -> Result<(TinkerPath, PathBuf), Failure> {
    let path = TinkerPath::parse(text).map_err(|e| bad(field, e.0))?;
    let dir = path.dir(&state.root, team);
    if !dir.is_dir() {
        return Err(not_found(&format!("saved state {path}")));
    }
    Ok((path, dir))
}

/// `POST create_model`: a training client, queued for a device; its future ends once its
/// process has loaded the base model and the adapter.
pub async fn create_model(
    State(state): State<Arc<TinkerState>>,
    Extension(caller): Extension<Caller>,
    SdkJson(request): SdkJson<CreateModelRequest>,
) -> Answer<Json<UntypedFuture>> {
    live_session(&state, &request.session_id, &caller.team).await?;
    let base = base_model(&state, &caller.team, &request.base_model)?;
    let lora = request.lora_config.unwrap_or(LoraConfig {
        rank: DEFAULT_RANK,
        seed: None,
        train_unembed: true,
        train_mlp: true,
        train_attn: true,
    });
    if !(1..=MAX_RANK).contains(&lora.rank) {
        return Err(bad("lora_config.rank", format!("expected 1 to {MAX_RANK}, got {}", lora.rank)));
    }
    if !(lora.train_mlp || lora.train_attn || lora.train_unembed) {
        return Err(bad(
            "lora_config",
            "at least one of train_mlp, train_attn and train_unembed must be true",
        ));
    }
    if let Some(optimizer) = request.optimizer_config.as_ref().filter(|o| o.kind != "adamw") {
        return Err(bad(
            "optimizer_config.type",
            format!("only adamw is served here, not {:?}", optimizer.kind),
        ));
    }
    let id = format!("{}:train:{}", request.session_id, request.model_seq_id);
    let spec = ClientSpec {
        id: id.clone(),
        team: caller.team.clone(),
        session: request.session_id.clone(),
        base_name: request.base_model.clone(),
        base,
        lora,
        start: Start::Fresh,
        first_seq: 1,
    };
    open_client(&state, spec, json!({"model_id": id, "type": "create_model"}))
}

/// Opens a client whose opening future ends with `answer`: its request id.
fn open_client(state: &TinkerState, spec: ClientSpec, answer: Value) -> Answer<Json<UntypedFuture>> {
    let request_id = rlvr_queue::dispatch::new_task_id();
    state.clients.futures.open(&request_id, &spec.team).map_err(|e| submit_failure(e.into()))?;
    let id = spec.id.clone();
    state.clients.open(spec, &request_id, OperationAnswer::Json { value: answer }).map_err(open_failure)?;
    Ok(future(request_id, Some(&id)))
}

/// `POST get_info`: the client's base model (which the SDK's tokenizer is loaded by) and rank.
pub async fn get_info(
    State(state): State<Arc<TinkerState>>,
    Extension(caller): Extension<Caller>,
    SdkJson(request): SdkJson<GetInfoRequest>,
) -> Answer<Json<GetInfoResponse>> {
    let client = client(&state, &request.model_id, &caller.team)?;
    let name = client.spec.base_name.clone();
    Ok(Json(GetInfoResponse {
        model_id: client.spec.id.clone(),
        model_data: ModelData { arch: None, model_name: name.clone(), tokenizer_id: Some(name.clone()) },
        is_lora: true,
        lora_rank: client.spec.lora.rank,
        model_name: name,
        optimizer_config: OptimizerConfig { kind: "adamw".into() },
        kind: "get_info".into(),
    }))
}

/// `POST forward_backward`: a protobuf `ForwardBackwardRequest` (forward-only too), run by the
/// client's process; its head (client, turn) is read here, its data there.
pub async fn forward_backward(
    State(state): State<Arc<TinkerState>>,
    Extension(caller): Extension<Caller>,
    headers: HeaderMap,
    body: Bytes,
) -> Answer<Json<UntypedFuture>> {
    if headers.get(header::CONTENT_ENCODING).is_some_and(|e| e.as_bytes() != b"identity") {
        return Err(Failure::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "unsupported_encoding",
            "forward_backward bodies are taken uncompressed (client/config says proto_compress_fwdbwd: false)",
        ));
    }
    let head = ForwardBackwardHead::decode(body.as_ref())
        .map_err(|e| bad("body", format!("not a tinker_public.ForwardBackwardRequest: {e}")))?;
    let seq = u64::try_from(head.seq_id)
        .map_err(|_| bad("seq_id", format!("expected ≥ 0, got {}", head.seq_id)))?;
    let client = client(&state, &head.model_id, &caller.team)?;
    let print = fingerprint(&[b"forward_backward", &body]);
    let body = body.to_vec();
    let id = state
        .clients
        .submit(
            &client,
            seq,
            print,
            |request_id| Ok(ClientCommand::ForwardBackward { request_id: request_id.to_owned(), body }),
            None,
        )
        .map_err(submit_failure)?;
    Ok(future(id, Some(&head.model_id)))
}

/// `POST optim_step`: AdamW's step with this request's settings.
pub async fn optim_step(
    State(state): State<Arc<TinkerState>>,
    Extension(caller): Extension<Caller>,
    SdkJson(request): SdkJson<OptimStepRequest>,
) -> Answer<Json<UntypedFuture>> {
    if request.optimizer_params.is_some() {
        return Err(bad("optimizer_params", "only AdamW (adam_params) is served here"));
    }
    let client = client(&state, &request.model_id, &caller.team)?;
    let params = request.adam_params.unwrap_or_default();
    // Refused in its turn, not here: its seq_id is spent, and later requests must not wait for it.
    let checked = adam_problem(&params).map_or(Ok(params), |problem| Err(Refusal::user(problem)));
    let print = json_fingerprint(&("optim_step", &request));
    let id = state
        .clients
        .submit(
            &client,
            request.seq_id,
            print,
            |request_id| {
                checked.map(|params| ClientCommand::OptimStep { request_id: request_id.to_owned(), params })
            },
            None,
        )
        .map_err(submit_failure)?;
    Ok(future(id, Some(&request.model_id)))
}

/// What is wrong with AdamW's settings, naming the field.
fn adam_problem(params: &AdamParams) -> Option<String> {
    for (name, value) in [("beta1", params.beta1), ("beta2", params.beta2)] {
        if !(0.0..1.0).contains(&value) {
            return Some(format!("adam_params.{name}: expected a number in [0, 1), got {value}"));
        }
    }
    [
        ("learning_rate", params.learning_rate),
        ("eps", params.eps),
        ("weight_decay", params.weight_decay),
        ("grad_clip_norm", params.grad_clip_norm),
    ]
    .into_iter()
    .find(|(_, value)| !value.is_finite() || *value < 0.0)
    .map(|(name, value)| format!("adam_params.{name}: expected a finite number ≥ 0, got {value}"))
}

/// Where a save named `name` of client `model_id` goes: its path and directory (its parents
/// made). One that exists is refused unless `overwrite` (the process replaces it in its turn).
fn save_target(
    state: &TinkerState,
    team: &str,
    model_id: &str,
    kind: PathKind,
    name: &str,
    overwrite: bool,
) -> Result<(TinkerPath, PathBuf), Refusal> {
    let path = TinkerPath::new(model_id, kind, name).map_err(|e| Refusal::user(format!("path: {}", e.0)))?;
    let dir = path.dir(&state.root, team);
    if dir.exists() && !overwrite {
        return Err(Refusal::user(format!(
            "path: {path} exists; save under another name, or with overwrite"
        )));
    }
    if let Some(parent) = dir.parent() {
        std::fs::create_dir_all(parent).map_err(|error| storage_refused(&path.to_string(), &error))?;
    }
    Ok((path, dir))
}

/// The server's storage refused to prepare a save of `what`: the server's fault, in its turn.
fn storage_refused(what: &str, error: &std::io::Error) -> Refusal {
    tracing::error!(%what, %error, "tinker: cannot prepare a save");
    Refusal {
        error: format!("cannot save {what}: the server's storage refused"),
        category: ErrorCategory::Server,
    }
}

/// `POST save_weights` (the SDK's `save_state`): the adapter and AdamW's state.
pub async fn save_weights(
    State(state): State<Arc<TinkerState>>,
    Extension(caller): Extension<Caller>,
    SdkJson(request): SdkJson<SaveWeightsRequest>,
) -> Answer<Json<UntypedFuture>> {
    let client = client(&state, &request.model_id, &caller.team)?;
    let name = request.path.clone().unwrap_or_else(|| format!("{:06}", request.seq_id));
    let print = json_fingerprint(&("save_weights", &request));
    let shown = TinkerPath::new(&request.model_id, PathKind::Weights, &name).map(|path| path.to_string());
    let answer = shown.ok().map(|path| json!({"path": path, "type": "save_weights"}));
    let overwrite = request.overwrite;
    let id = state
        .clients
        .submit(
            &client,
            request.seq_id,
            print,
            |request_id| {
                let (_, dir) = save_target(
                    &state,
                    &caller.team,
                    &request.model_id,
                    PathKind::Weights,
                    &name,
                    overwrite,
                )?;
                Ok(ClientCommand::SaveState {
                    request_id: request_id.to_owned(),
                    dir,
                    optimizer: true,
                    overwrite,
                })
            },
            answer,
        )
        .map_err(submit_failure)?;
    Ok(future(id, Some(&request.model_id)))
}

/// Removes a client's snapshots older than its newest [`KEPT_SNAPSHOTS`] (`dir` is the new one's,
/// beside them) and their samplers.
fn forget_old_snapshots(samplers: &Samplers, session: &str, dir: &FsPath, newest: u64) {
    let Some(parent) = dir.parent() else { return };
    let Ok(entries) = std::fs::read_dir(parent) else { return };
    for entry in entries.flatten() {
        let number = entry.file_name().to_str().and_then(|name| name.parse::<u64>().ok());
        if let Some(number) = number.filter(|number| number + KEPT_SNAPSHOTS <= newest) {
            samplers.remove(&format!("{session}:sample:{number}"));
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

/// What makes a request's command from its id, or refuses it in its turn.
type MakeCommand<'a> = dyn FnOnce(&str) -> Result<ClientCommand, Refusal> + Send + 'a;

/// `POST save_weights_for_sampler`: named (a `sampler_weights` path), or unnamed (a sampler on
/// the weights as they are, `SESSION:sample:N`).
pub async fn save_weights_for_sampler(
    State(state): State<Arc<TinkerState>>,
    Extension(caller): Extension<Caller>,
    SdkJson(request): SdkJson<SaveWeightsForSamplerRequest>,
) -> Answer<Json<UntypedFuture>> {
    let client = client(&state, &request.model_id, &caller.team)?;
    let print = json_fingerprint(&("save_weights_for_sampler", &request));
    let samplers = &state.samplers;
    let (answer, make): (_, Box<MakeCommand>) = match (&request.path, request.sampling_session_seq_id) {
        (Some(name), _) => {
            let shown =
                TinkerPath::new(&request.model_id, PathKind::SamplerWeights, name).map(|p| p.to_string());
            let answer = shown.ok().map(|path| json!({"path": path, "type": "save_weights_for_sampler"}));
            let make = |request_id: &str| {
                // A sampler's weights of the same name are replaced: the SDK has no overwrite for them.
                let (_, dir) = save_target(
                    &state,
                    &caller.team,
                    &request.model_id,
                    PathKind::SamplerWeights,
                    name,
                    true,
                )?;
                Ok(ClientCommand::SaveSampler { request_id: request_id.to_owned(), dir, overwrite: true })
            };
            (answer, Box::new(make))
        }
        (None, Some(number)) => {
            let sampler_id = format!("{}:sample:{number}", client.spec.session);
            let dir = state.clients.dir(&client.spec.id).join("samplers").join(number.to_string());
            let answer = Some(json!({"sampling_session_id": sampler_id, "type": "save_weights_for_sampler"}));
            let client = &client;
            let team = &caller.team;
            let make = move |request_id: &str| {
                if let Some(parent) = dir.parent() {
                    std::fs::create_dir_all(parent)
                        .map_err(|error| storage_refused("the sampler", &error))?;
                }
                samplers.insert(
                    &sampler_id,
                    Sampler {
                        team: team.clone(),
                        session: client.spec.session.clone(),
                        base_name: client.spec.base_name.clone(),
                        model_path: None,
                        served_by: client.spec.id.clone(),
                        weights: Some(dir.join("adapter")),
                        number,
                    },
                );
                forget_old_snapshots(samplers, &client.spec.session, &dir, number);
                Ok(ClientCommand::SaveSampler { request_id: request_id.to_owned(), dir, overwrite: true })
            };
            (answer, Box::new(make))
        }
        (None, None) => return Err(bad("path", "expected a path (a name) or a sampling_session_seq_id")),
    };
    let id = state.clients.submit(&client, request.seq_id, print, make, answer).map_err(submit_failure)?;
    Ok(future(id, Some(&request.model_id)))
}

/// `POST load_weights`: a saved state into a training client (`model_id`, `seq_id`), or a new
/// training client made from one (`session_id`, `model_seq_id`).
pub async fn load_weights(
    State(state): State<Arc<TinkerState>>,
    Extension(caller): Extension<Caller>,
    SdkJson(request): SdkJson<LoadWeightsRequest>,
) -> Answer<Json<UntypedFuture>> {
    match (&request.model_id, request.seq_id, &request.session_id, request.model_seq_id) {
        (Some(model_id), Some(seq), _, _) => {
            let client = client(&state, model_id, &caller.team)?;
            let print = json_fingerprint(&("load_weights", &request));
            let optimizer = request.optimizer;
            let answer = Some(json!({"path": request.path, "type": "load_weights"}));
            let make = |request_id: &str| {
                let (_, dir) = saved(&state, &caller.team, &request.path, "path").map_err(|_| {
                    Refusal::user(format!("path: no saved state {} of this key's team", request.path))
                })?;
                Ok(ClientCommand::LoadState { request_id: request_id.to_owned(), dir, optimizer })
            };
            let id = state.clients.submit(&client, seq, print, make, answer).map_err(submit_failure)?;
            Ok(future(id, Some(model_id)))
        }
        (None, _, Some(session), Some(number)) => {
            let (_, dir) = saved(&state, &caller.team, &request.path, "path")?;
            live_session(&state, session, &caller.team).await?;
            let (lora, saved_base) = saved_lora(&dir).map_err(|message| bad("path", message))?;
            let base_name = request.base_model.clone().unwrap_or(saved_base);
            let base = base_model(&state, &caller.team, &base_name)?;
            let id = format!("{session}:train:{number}");
            let spec = ClientSpec {
                id: id.clone(),
                team: caller.team.clone(),
                session: session.clone(),
                base_name,
                base,
                lora,
                start: Start::FromState { dir, optimizer: request.optimizer },
                first_seq: 1,
            };
            open_client(&state, spec, json!({"path": request.path, "model_id": id, "type": "load_weights"}))
        }
        _ => Err(bad("model_id", "expected model_id and seq_id, or session_id and model_seq_id")),
    }
}

/// `POST create_sampling_session`: a sampler on a saved path, or on the base model alone.
pub async fn create_sampling_session(
    State(state): State<Arc<TinkerState>>,
    Extension(caller): Extension<Caller>,
    SdkJson(request): SdkJson<CreateSamplingSessionRequest>,
) -> Answer<Json<CreateSamplingSessionResponse>> {
    live_session(&state, &request.session_id, &caller.team).await?;
    let sampler_id = format!("{}:sample:{}", request.session_id, request.sampling_session_seq_id);
    if state.samplers.get(&sampler_id, &caller.team).is_some() {
        return Ok(Json(CreateSamplingSessionResponse {
            sampling_session_id: sampler_id,
            kind: "create_sampling_session".into(),
        }));
    }
    // Who samples: the training client that saved the path, if it is open here (the same base
    // and adapter shape, no second copy of the model) with the saved adapter swapped in; else a
    // process of the sampler's own, started from the path or, for the base alone, from a fresh
    // adapter (its LoRA B is zero: it changes nothing).
    let fresh = LoraConfig { rank: 1, seed: None, train_unembed: false, train_mlp: false, train_attn: true };
    let (base_name, served) = match (&request.model_path, &request.base_model) {
        (Some(text), _) => {
            let (path, dir) = saved(&state, &caller.team, text, "model_path")?;
            let (lora, saved_base) = saved_lora(&dir).map_err(|message| bad("model_path", message))?;
            let base_name = request.base_model.clone().unwrap_or(saved_base);
            match state.clients.get(&path.run, &caller.team).filter(|c| c.spec.base_name == base_name) {
                Some(trainer) => (base_name, Err((trainer.spec.id.clone(), dir.join("adapter")))),
                None => (base_name, Ok((lora, Start::FromState { dir, optimizer: false }))),
            }
        }
        (None, Some(base_name)) => (base_name.clone(), Ok((fresh, Start::Fresh))),
        (None, None) => return Err(bad("model_path", "expected a model_path or a base_model")),
    };
    let own_id = format!("{}:sampler:{}", request.session_id, request.sampling_session_seq_id);
    let (served_by, weights, own) = match served {
        Err((trainer, adapter)) => (trainer, Some(adapter), None),
        Ok((lora, start)) => {
            let spec = ClientSpec {
                id: own_id.clone(),
                team: caller.team.clone(),
                session: request.session_id.clone(),
                base_name: base_name.clone(),
                base: base_model(&state, &caller.team, &base_name)?,
                lora,
                start,
                first_seq: 1,
            };
            (own_id, None, Some(spec))
        }
    };
    let sampler = Sampler {
        team: caller.team.clone(),
        session: request.session_id.clone(),
        base_name,
        model_path: request.model_path.clone(),
        served_by,
        weights,
        number: request.sampling_session_seq_id,
    };
    if let Some(spec) = own {
        // Nobody polls its opening: the samples wait for it as queued commands.
        let opening = rlvr_queue::dispatch::new_task_id();
        state.clients.futures.open(&opening, &spec.team).map_err(|e| submit_failure(e.into()))?;
        state
            .clients
            .open(spec, &opening, OperationAnswer::Json { value: json!({}) })
            .map_err(open_failure)?;
    }
    state.samplers.insert(&sampler_id, sampler);
    Ok(Json(CreateSamplingSessionResponse {
        sampling_session_id: sampler_id,
        kind: "create_sampling_session".into(),
    }))
}

/// `GET samplers/{id}`: a sampler's base model and path.
pub async fn get_sampler(
    State(state): State<Arc<TinkerState>>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Answer<Json<GetSamplerResponse>> {
    let sampler = state.samplers.get(&id, &caller.team).ok_or_else(|| not_found(&format!("sampler {id}")))?;
    Ok(Json(GetSamplerResponse {
        sampler_id: id,
        base_model: sampler.base_name,
        model_path: sampler.model_path,
    }))
}

/// `POST asample`: `num_samples` sequences from a sampler, each with its id.
pub async fn asample(
    State(state): State<Arc<TinkerState>>,
    Extension(caller): Extension<Caller>,
    SdkJson(request): SdkJson<SampleRequest>,
) -> Answer<Json<UntypedFuture>> {
    let Some(sampler_id) = request.sampling_session_id.clone() else {
        return Err(bad("sampling_session_id", "expected a sampler's id (create a sampling client first)"));
    };
    let sampler = state
        .samplers
        .get(&sampler_id, &caller.team)
        .ok_or_else(|| not_found(&format!("sampler {sampler_id}")))?;
    let client = client(&state, &sampler.served_by, &caller.team)?;
    let samples = request.num_samples;
    if !(1..=MAX_SAMPLES).contains(&samples) {
        return Err(bad("num_samples", format!("expected 1 to {MAX_SAMPLES}, got {samples}")));
    }
    let weights = sampler.weights.clone();
    let request = Box::new(request);
    let id = state
        .clients
        .submit_now(&client, |request_id| ClientCommand::Sample { request_id, request, weights })
        .map_err(submit_failure)?;
    let ids = (0..samples).map(|i| format!("{id}:{i}")).collect();
    Ok(Json(UntypedFuture { request_id: id, model_id: None, sample_sequence_ids: Some(ids) }))
}

/// Samples one request may ask for.
const MAX_SAMPLES: u32 = 256;

/// `POST retrieve_future`: the operation's result (protobuf for forward/backward and samples,
/// JSON otherwise), its failure (`{"error", "category"}`), or `try_again` after [`POLL_HOLD`].
pub async fn retrieve_future(
    State(state): State<Arc<TinkerState>>,
    Extension(caller): Extension<Caller>,
    SdkJson(request): SdkJson<RetrieveFutureRequest>,
) -> Answer<Response> {
    let paused = state.clients.futures.is_paused(&request.request_id)
        || state.clients.grant_wait(&request.request_id).is_some();
    let hold = if paused { PAUSED_POLL_HOLD } else { POLL_HOLD };
    let found = state.clients.futures.wait(&request.request_id, &caller.team, hold).await;
    let Some(found) = found else {
        return Err(not_found(&format!("request {}", request.request_id)));
    };
    Ok(match found {
        FutureState::Waiting { queue_state, reason } => {
            let (queue_state, reason) = match (queue_state, state.clients.grant_wait(&request.request_id)) {
                (QueueState::Active, Some(wait)) => (QueueState::PausedCapacity, Some(wait)),
                other => (other.0, reason),
            };
            Json(TryAgain::new(&request.request_id, queue_state, reason)).into_response()
        }
        FutureState::Done(OperationAnswer::Proto { bytes }) => {
            ([(header::CONTENT_TYPE, "application/x-protobuf")], bytes).into_response()
        }
        FutureState::Done(OperationAnswer::Json { value }) => Json(value).into_response(),
        // A process's or the daemon's sentence may quote a server path: the team reads its name.
        FutureState::Failed { error, category } => {
            let error = state.tenancy.shown.text(&error).into_owned();
            Json(RequestFailed { error, category }).into_response()
        }
    })
}
