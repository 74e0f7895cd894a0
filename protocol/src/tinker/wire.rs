//! The Tinker SDK's JSON messages under `/api/v1`, as the `tinker` 0.38.0 SDK writes and reads
//! them (its pydantic models under `tinker/types/`). Requests are read leniently where the SDK
//! may add fields (unknown keys are ignored, as the SDK's own models ignore the server's), and
//! strictly where a value means something (a loss's name, a chunk's type). Answers carry every
//! field the SDK requires; the SDK validates them strictly.
//!
//! The operation routes answer at once with an [`UntypedFuture`]; the result comes from
//! `retrieve_future`: [`TryAgain`] while it waits (the daemon holds each poll open first: the
//! SDK polls again at once), [`RequestFailed`] when it failed, or the operation's own answer.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// `POST /api/v1/client/config` and `client/dynamic_config`: the SDK's version.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ClientConfigRequest {
    #[serde(default)]
    pub sdk_version: String,
}

/// `client/config`'s answer: the flags that choose the SDK's code paths. rlvr's are the
/// conservative ones — no JWT exchange, no compressed or parallel forward/backward chunks, no
/// batched future polling, no server-side custom losses — so the SDK uses only the routes rlvr
/// serves, one chunk after the other.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ClientConfigResponse {
    pub pjwt_auth_enabled: bool,
    /// The SDK's plain HTTP client for every request.
    pub use_pyqwest_transport: bool,
    /// Chunks of one forward/backward sent one after another, each when the previous is taken.
    pub parallel_fwdbwd_chunks: bool,
    pub proto_compress_fwdbwd: bool,
    /// Datums per forward/backward request at most.
    pub fwdbwd_max_chunk_len: u32,
    pub sample_use_retrieve_futures: bool,
    pub custom_loss_server_side: bool,
    pub sample_join_sampling_session: bool,
}

/// `client/dynamic_config`'s answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DynamicConfigResponse {
    pub refresh_interval_sec: u64,
    pub sample_cancel_enabled: bool,
}

/// `POST /api/v1/create_session`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CreateSessionRequest {
    #[serde(default)]
    pub tags: Vec<String>,
    #[serde(default)]
    pub user_metadata: serde_json::Map<String, Value>,
    #[serde(default)]
    pub sdk_version: String,
    #[serde(default)]
    pub project_id: Option<String>,
    #[serde(default)]
    pub display_name: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CreateSessionResponse {
    pub session_id: String,
    /// Logged by the SDK as a warning: an SDK version outside the tested range.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub warning_message: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub info_message: Option<String>,
    #[serde(rename = "type")]
    pub kind: String,
}

/// `POST /api/v1/session_heartbeat`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SessionHeartbeatRequest {
    pub session_id: String,
}

/// `POST /api/v1/sessions/{id}/finish`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FinishSessionRequest {
    #[serde(default)]
    pub reason: Option<FinishReason>,
    #[serde(default)]
    pub detail: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FinishReason {
    /// `success`, `errored` or `interrupted`.
    #[serde(rename = "type")]
    pub kind: String,
}

/// A training client's LoRA adapter: its rank, and which layers it adapts.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LoraConfig {
    pub rank: u32,
    #[serde(default)]
    pub seed: Option<u64>,
    #[serde(default = "yes")]
    pub train_unembed: bool,
    #[serde(default = "yes")]
    pub train_mlp: bool,
    #[serde(default = "yes")]
    pub train_attn: bool,
}

fn yes() -> bool {
    true
}

/// `{"type": "adamw"}` (the only optimizer served).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OptimizerConfig {
    #[serde(rename = "type")]
    pub kind: String,
}

/// `POST /api/v1/create_model`: a training client of `base_model` with a LoRA adapter.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CreateModelRequest {
    pub session_id: String,
    pub model_seq_id: u64,
    pub base_model: String,
    #[serde(default)]
    pub user_metadata: Option<serde_json::Map<String, Value>>,
    #[serde(default)]
    pub lora_config: Option<LoraConfig>,
    #[serde(default)]
    pub optimizer_config: Option<OptimizerConfig>,
}

/// An operation's immediate answer: its request id (then `retrieve_future`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct UntypedFuture {
    pub request_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model_id: Option<String>,
    /// A sample's sequences' ids, one per sample asked for (the SDK requires them).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sample_sequence_ids: Option<Vec<String>>,
}

/// `POST /api/v1/retrieve_future`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RetrieveFutureRequest {
    pub request_id: String,
    #[serde(default)]
    pub allow_metadata_only: bool,
}

/// Why an operation is not done yet, as the SDK names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum QueueState {
    /// Queued or running.
    Active,
    /// Waiting for a device (the scheduler's reason in `queue_state_reason`).
    PausedCapacity,
    PausedRateLimit,
}

/// `retrieve_future`'s answer while the operation is not done.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TryAgain {
    /// Always `try_again`.
    #[serde(rename = "type")]
    pub kind: String,
    pub request_id: String,
    pub queue_state: QueueState,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue_state_reason: Option<String>,
}

impl TryAgain {
    pub fn new(request_id: &str, queue_state: QueueState, reason: Option<String>) -> TryAgain {
        TryAgain {
            kind: "try_again".into(),
            request_id: request_id.to_owned(),
            queue_state,
            queue_state_reason: reason,
        }
    }
}

/// Whose fault a failed operation is: `user` (the request's: the SDK says so and stops that
/// client), `server`, `unknown`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorCategory {
    User,
    Server,
    Unknown,
}

/// `retrieve_future`'s answer for a failed operation (HTTP 200).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RequestFailed {
    pub error: String,
    pub category: ErrorCategory,
}

/// `create_model`'s result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CreateModelResponse {
    pub model_id: String,
    #[serde(rename = "type")]
    pub kind: String,
}

/// `POST /api/v1/get_info`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GetInfoRequest {
    pub model_id: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelData {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub arch: Option<String>,
    /// The base model's name (the SDK asserts it).
    pub model_name: String,
    /// What the SDK hands `AutoTokenizer.from_pretrained`: a directory on the client's host, or
    /// a Hub name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokenizer_id: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GetInfoResponse {
    pub model_id: String,
    pub model_data: ModelData,
    pub is_lora: bool,
    pub lora_rank: u32,
    pub model_name: String,
    pub optimizer_config: OptimizerConfig,
    #[serde(rename = "type")]
    pub kind: String,
}

/// AdamW's settings for one step (decoupled weight decay; `grad_clip_norm` 0: none).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct AdamParams {
    #[serde(default = "defaults::learning_rate")]
    pub learning_rate: f64,
    #[serde(default = "defaults::beta1")]
    pub beta1: f64,
    #[serde(default = "defaults::beta2")]
    pub beta2: f64,
    #[serde(default = "defaults::eps")]
    pub eps: f64,
    #[serde(default)]
    pub weight_decay: f64,
    #[serde(default)]
    pub grad_clip_norm: f64,
}

impl Default for AdamParams {
    /// The SDK's defaults.
    fn default() -> Self {
        AdamParams {
            learning_rate: defaults::learning_rate(),
            beta1: defaults::beta1(),
            beta2: defaults::beta2(),
            eps: defaults::eps(),
            weight_decay: 0.0,
            grad_clip_norm: 0.0,
        }
    }
}

mod defaults {
    pub fn learning_rate() -> f64 {
        1e-4
    }
    pub fn beta1() -> f64 {
        0.9
    }
    pub fn beta2() -> f64 {
        0.95
    }
    pub fn eps() -> f64 {
        1e-12
    }
}

/// `POST /api/v1/optim_step`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OptimStepRequest {
    pub model_id: String,
    pub seq_id: u64,
    #[serde(default)]
    pub adam_params: Option<AdamParams>,
    /// Another optimizer's settings (refused: AdamW only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub optimizer_params: Option<Value>,
}

#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct OptimStepResponse {
    pub metrics: BTreeMap<String, f64>,
}

/// `POST /api/v1/save_weights` (the SDK's `save_state`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SaveWeightsRequest {
    pub model_id: String,
    pub seq_id: u64,
    #[serde(default)]
    pub path: Option<String>,
    #[serde(default)]
    pub overwrite: bool,
    #[serde(default)]
    pub ttl_seconds: Option<u64>,
    #[serde(default)]
    pub user_metadata: Option<serde_json::Map<String, Value>>,
}

/// `save_weights`' result, and `load_weights`'.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WeightsPathResponse {
    pub path: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model_id: Option<String>,
}

/// `POST /api/v1/save_weights_for_sampler`: named (`path`), or unnamed with the session's next
/// sampler number (`sampling_session_seq_id`) for a sampling client on the weights as they are.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SaveWeightsForSamplerRequest {
    pub model_id: String,
    pub seq_id: u64,
    #[serde(default)]
    pub path: Option<String>,
    #[serde(default)]
    pub sampling_session_seq_id: Option<u64>,
    #[serde(default)]
    pub kind: Option<String>,
    #[serde(default)]
    pub ttl_seconds: Option<u64>,
    #[serde(default)]
    pub user_metadata: Option<serde_json::Map<String, Value>>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SaveWeightsForSamplerResponse {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sampling_session_id: Option<String>,
}

/// `POST /api/v1/load_weights`: into a training client (`model_id`, `seq_id`), or a new one
/// made from a saved state (`session_id`, `model_seq_id`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LoadWeightsRequest {
    pub path: String,
    #[serde(default)]
    pub optimizer: bool,
    #[serde(default)]
    pub model_id: Option<String>,
    #[serde(default)]
    pub seq_id: Option<u64>,
    #[serde(default)]
    pub session_id: Option<String>,
    #[serde(default)]
    pub model_seq_id: Option<u64>,
    #[serde(default)]
    pub base_model: Option<String>,
}

/// `POST /api/v1/create_sampling_session`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CreateSamplingSessionRequest {
    pub session_id: String,
    pub sampling_session_seq_id: u64,
    #[serde(default)]
    pub base_model: Option<String>,
    #[serde(default)]
    pub model_path: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CreateSamplingSessionResponse {
    pub sampling_session_id: String,
    #[serde(rename = "type")]
    pub kind: String,
}

/// `GET /api/v1/samplers/{id}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GetSamplerResponse {
    pub sampler_id: String,
    pub base_model: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model_path: Option<String>,
}

/// A prompt: its chunks, whose tokens concatenated are the prompt.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelInput {
    pub chunks: Vec<InputChunk>,
}

/// One chunk of a prompt. Only text is served (images and DMel are refused by name).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum InputChunk {
    EncodedText {
        tokens: Vec<i64>,
    },
    Image {
        #[serde(flatten)]
        rest: serde_json::Map<String, Value>,
    },
    ImageAssetPointer {
        #[serde(flatten)]
        rest: serde_json::Map<String, Value>,
    },
    Dmel {
        #[serde(flatten)]
        rest: serde_json::Map<String, Value>,
    },
}

/// Where sampling stops: the model's end of sequence when unset; `[]` nowhere but `max_tokens`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum StopSpec {
    Text(String),
    Tokens(Vec<i64>),
    Texts(Vec<String>),
}

/// How to sample (the SDK's `SamplingParams`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SampleParams {
    #[serde(default)]
    pub max_tokens: Option<u32>,
    #[serde(default)]
    pub seed: Option<u64>,
    #[serde(default)]
    pub stop: Option<StopSpec>,
    #[serde(default = "one")]
    pub temperature: f64,
    /// -1: no limit.
    #[serde(default = "no_limit")]
    pub top_k: i64,
    #[serde(default = "one")]
    pub top_p: f64,
}

fn one() -> f64 {
    1.0
}

fn no_limit() -> i64 {
    -1
}

/// `POST /api/v1/asample`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SampleRequest {
    pub num_samples: u32,
    pub prompt: ModelInput,
    pub sampling_params: SampleParams,
    #[serde(default)]
    pub sampling_session_id: Option<String>,
    #[serde(default)]
    pub seq_id: Option<u64>,
    #[serde(default)]
    pub prompt_logprobs: bool,
    #[serde(default)]
    pub topk_prompt_logprobs: u32,
    #[serde(default)]
    pub topk_sample_logprobs: u32,
    #[serde(default)]
    pub prompt_alt_tokens_k: u32,
    #[serde(default)]
    pub prompt_logprobs_last_n: Option<u32>,
    #[serde(default)]
    pub target_prompt_logprobs: Option<Value>,
    #[serde(default)]
    pub record_stability_info: bool,
    #[serde(default)]
    pub base_model: Option<String>,
    #[serde(default)]
    pub model_path: Option<String>,
}

/// `telemetry`'s answer (the events are not kept).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TelemetryResponse {
    pub status: String,
}

/// `GET /api/v1/healthz`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HealthResponse {
    pub status: String,
}

/// `GET /api/v1/get_server_capabilities`: the base models a team may train.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ServerCapabilities {
    pub supported_models: Vec<SupportedModel>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SupportedModel {
    pub model_name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_context_length: Option<u64>,
    pub trainable: bool,
    pub sampleable: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sdks_requests_as_it_wrote_them_read() {
        // Bodies as the SDK 0.38.0 sent them to a logging server (exactly these bytes).
        let create: CreateModelRequest = serde_json::from_str(
            r#"{"session_id":"sess-probe","model_seq_id":0,"base_model":"Qwen/Qwen3-8B","lora_config":{"rank":8,
               "train_unembed":true,"train_mlp":true,"train_attn":true},"optimizer_config":{"type":"adamw"},"type":"create_model"}"#,
        )
        .unwrap();
        assert_eq!(create.lora_config.unwrap().rank, 8);
        let step: OptimStepRequest = serde_json::from_str(
            r#"{"model_id":"sess-probe:train:0","seq_id":2,"type":"optim_step","adam_params":{"learning_rate":0.0001,
               "beta1":0.9,"beta2":0.95,"eps":1e-08,"weight_decay":0.0,"grad_clip_norm":0.0}}"#,
        )
        .unwrap();
        assert_eq!((step.seq_id, step.adam_params.unwrap().eps), (2, 1e-8));
        let sample: SampleRequest = serde_json::from_str(
            r#"{"num_samples":2,"prompt":{"chunks":[{"tokens":[11,12,13],"type":"encoded_text"}]},
               "sampling_params":{"max_tokens":4,"stop":["\n\nUser:"],"temperature":1.0,"top_k":-1,"top_p":1.0},
               "sampling_session_id":"sess-probe:sample:0","seq_id":0,"prompt_logprobs":false,"topk_prompt_logprobs":0,
               "topk_sample_logprobs":0,"prompt_alt_tokens_k":0,"record_stability_info":true,"type":"sample"}"#,
        )
        .unwrap();
        assert_eq!(sample.prompt.chunks, vec![InputChunk::EncodedText { tokens: vec![11, 12, 13] }]);
        assert_eq!(sample.sampling_params.stop, Some(StopSpec::Texts(vec!["\n\nUser:".into()])));
        let tokens: SampleParams = serde_json::from_str(r#"{"stop":[7, 9]}"#).unwrap();
        assert_eq!(tokens.stop, Some(StopSpec::Tokens(vec![7, 9])));
        let save: SaveWeightsForSamplerRequest = serde_json::from_str(
            r#"{"model_id":"sess-probe:train:0","sampling_session_seq_id":0,"kind":"snapshot","seq_id":3,"type":"save_weights_for_sampler"}"#,
        )
        .unwrap();
        assert_eq!((save.path, save.sampling_session_seq_id), (None, Some(0)));
        let image: ModelInput =
            serde_json::from_str(r#"{"chunks":[{"type":"image","data":"AA==","format":"png"}]}"#).unwrap();
        assert!(matches!(image.chunks[0], InputChunk::Image { .. }));
    }

    #[test]
    fn pending_and_failed_answers_are_the_sdks_shapes() {
        let pending =
            serde_json::to_value(TryAgain::new("r1", QueueState::PausedCapacity, Some("waiting".into())))
                .unwrap();
        assert_eq!(
            pending,
            serde_json::json!({"type": "try_again", "request_id": "r1", "queue_state": "paused_capacity", "queue_state_reason": "waiting"})
        );
        let failed =
            serde_json::to_value(RequestFailed { error: "no".into(), category: ErrorCategory::User })
                .unwrap();
        assert_eq!(failed, serde_json::json!({"error": "no", "category": "user"}));
    }
}
