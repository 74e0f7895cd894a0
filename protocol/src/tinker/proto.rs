//! The Tinker SDK's protobuf messages (`protocol/proto/tinker_public.proto`, package
//! `tinker_public`, rebuilt from the descriptor in the Apache-2.0 `tinker` 0.38.0 wheel: see
//! `protocol/proto/NOTICE-tinker`), written as prost derives field for field — as the TensorBoard
//! records are — rather than generated at build time, which would need `protoc` or a protobuf
//! compiler crate in every build for two dozen messages that change only with the SDK. The SDK's
//! own decoder reads what these encode: the SDK test drives every message through it.
//!
//! What travels as protobuf: a `forward_backward` request's body ([`ForwardBackwardRequest`]),
//! and the results of forward/backward ([`ForwardBackwardOutput`]) and sampling
//! ([`SampleResponse`]) answered by `retrieve_future`. Everything else is JSON ([`super::wire`]).
//! Arrays are raw little-endian bytes (`np.int32(...).tobytes()`): [`super::arrays`] reads them,
//! checking every length before it allocates.

use std::collections::BTreeMap;

/// The messages' encode and decode (prost's trait), for their users.
pub use prost::Message;

/// `SampleResponse`: one sampling request's sequences.
#[derive(Clone, PartialEq, prost::Message)]
pub struct SampleResponse {
    #[prost(message, repeated, tag = "1")]
    pub sequences: Vec<SampledSequence>,
    /// float32 little-endian, one per prompt token; NaN where none (the first).
    #[prost(bytes = "vec", optional, tag = "2")]
    pub prompt_logprobs: Option<Vec<u8>>,
    #[prost(message, optional, tag = "3")]
    pub topk_prompt_logprobs: Option<TopkLogprobs>,
    #[prost(int32, tag = "4")]
    pub prompt_cache_hit_tokens: i32,
    #[prost(message, optional, tag = "5")]
    pub target_prompt_logprobs: Option<Tensor>,
    #[prost(message, optional, tag = "6")]
    pub prompt_alt_tokens: Option<PromptAltTokens>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct PromptAltTokens {
    #[prost(message, optional, tag = "1")]
    pub tokens: Option<Tensor>,
    #[prost(message, optional, tag = "2")]
    pub logprobs: Option<Tensor>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct SampledSequence {
    #[prost(enumeration = "StopReason", tag = "1")]
    pub stop_reason: i32,
    /// int32 little-endian.
    #[prost(bytes = "vec", tag = "2")]
    pub tokens: Vec<u8>,
    /// float32 little-endian, one per token.
    #[prost(bytes = "vec", optional, tag = "3")]
    pub logprobs: Option<Vec<u8>>,
    #[prost(message, optional, tag = "4")]
    pub topk_sampled_logprobs: Option<TopkLogprobs>,
}

/// Row-major `length × k` top-k matrices (empty cells: token 0, log-probability -99999).
#[derive(Clone, PartialEq, prost::Message)]
pub struct TopkLogprobs {
    #[prost(bytes = "vec", tag = "1")]
    pub token_ids: Vec<u8>,
    #[prost(bytes = "vec", tag = "2")]
    pub logprobs: Vec<u8>,
    #[prost(uint32, tag = "3")]
    pub k: u32,
    #[prost(uint32, tag = "4")]
    pub length: u32,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct SparseCsr {
    #[prost(bytes = "vec", tag = "1")]
    pub values: Vec<u8>,
    /// int64 little-endian.
    #[prost(bytes = "vec", tag = "2")]
    pub crow_indices: Vec<u8>,
    /// int64 little-endian.
    #[prost(bytes = "vec", tag = "3")]
    pub col_indices: Vec<u8>,
}

/// A tensor: its values dense (row-major) or as CSR, its dtype and shape.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Tensor {
    #[prost(oneof = "tensor::Encoding", tags = "1, 2")]
    pub encoding: Option<tensor::Encoding>,
    #[prost(enumeration = "DType", tag = "3")]
    pub dtype: i32,
    #[prost(int64, repeated, tag = "4")]
    pub shape: Vec<i64>,
}

pub mod tensor {
    #[derive(Clone, PartialEq, prost::Oneof)]
    pub enum Encoding {
        #[prost(bytes, tag = "1")]
        Dense(Vec<u8>),
        #[prost(message, tag = "2")]
        SparseCsr(super::SparseCsr),
    }
}

/// Every datum's values of one field, concatenated: `offsets` are int64 byte offsets into
/// `data`, one more than the datums.
#[derive(Clone, PartialEq, prost::Message)]
pub struct BatchedTensor {
    #[prost(bytes = "vec", tag = "1")]
    pub data: Vec<u8>,
    #[prost(bytes = "vec", tag = "2")]
    pub offsets: Vec<u8>,
    #[prost(enumeration = "DType", tag = "3")]
    pub dtype: i32,
    #[prost(int64, repeated, tag = "4")]
    pub trailing_shape: Vec<i64>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ArrayRecord {
    #[prost(string, tag = "1")]
    pub type_tag: String,
    #[prost(btree_map = "string, message", tag = "2")]
    pub fields: BTreeMap<String, BatchedTensor>,
    #[prost(int64, tag = "3")]
    pub num_datums: i64,
}

/// A forward (or forward/backward) pass's result: per datum its outputs (`logprobs`), and the
/// metrics, each named `NAME:REDUCTION` (`loss:sum`).
#[derive(Clone, PartialEq, prost::Message)]
pub struct ForwardBackwardOutput {
    #[prost(string, tag = "1")]
    pub loss_fn_output_type: String,
    #[prost(message, repeated, tag = "2")]
    pub loss_fn_outputs: Vec<ArrayRecord>,
    #[prost(btree_map = "string, double", tag = "3")]
    pub metrics: BTreeMap<String, f64>,
}

/// A `forward_backward` request's body.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ForwardBackwardRequest {
    #[prost(string, tag = "1")]
    pub model_id: String,
    #[prost(int32, tag = "2")]
    pub seq_id: i32,
    #[prost(message, repeated, tag = "3")]
    pub data: Vec<Datum>,
    #[prost(string, tag = "4")]
    pub loss_fn: String,
    /// The legacy float-only loss options (mirrored into `loss_fn_config_v2`, which wins).
    #[prost(btree_map = "string, double", tag = "5")]
    pub loss_fn_config: BTreeMap<String, f64>,
    /// The loss and its outputs without a backward pass.
    #[prost(bool, tag = "6")]
    pub forward_only: bool,
    #[prost(btree_map = "string, message", tag = "7")]
    pub loss_fn_config_v2: BTreeMap<String, LossConfigValue>,
}

/// A `ForwardBackwardRequest`'s head: which client and which turn, read without its data (prost
/// skips the fields a message does not name).
#[derive(Clone, PartialEq, prost::Message)]
pub struct ForwardBackwardHead {
    #[prost(string, tag = "1")]
    pub model_id: String,
    #[prost(int32, tag = "2")]
    pub seq_id: i32,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct LossConfigValue {
    #[prost(oneof = "loss_config_value::Value", tags = "1, 2")]
    pub value: Option<loss_config_value::Value>,
}

pub mod loss_config_value {
    #[derive(Clone, PartialEq, prost::Oneof)]
    pub enum Value {
        #[prost(double, tag = "1")]
        Number(f64),
        #[prost(string, tag = "2")]
        Text(String),
    }
}

/// One training example: its input chunks (concatenated, they are the tokens) and its loss's
/// inputs, each as long as the tokens.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Datum {
    #[prost(message, repeated, tag = "1")]
    pub model_input: Vec<Chunk>,
    #[prost(btree_map = "string, message", tag = "2")]
    pub loss_fn_inputs: BTreeMap<String, Tensor>,
    #[prost(message, repeated, tag = "3")]
    pub model_input_spans: Vec<ProvenanceSpan>,
    #[prost(message, repeated, tag = "4")]
    pub loss_fn_input_spans: Vec<ProvenanceSpan>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ProvenanceSpan {
    #[prost(oneof = "provenance_span::Span", tags = "1, 2")]
    pub span: Option<provenance_span::Span>,
}

pub mod provenance_span {
    #[derive(Clone, PartialEq, prost::Oneof)]
    pub enum Span {
        #[prost(message, tag = "1")]
        PromptTokens(super::PromptProvenanceSpan),
        #[prost(message, tag = "2")]
        SampledTokens(super::SampledProvenanceSpan),
    }
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct PromptProvenanceSpan {
    #[prost(string, tag = "1")]
    pub sequence_id: String,
    #[prost(int64, tag = "2")]
    pub offset: i64,
    #[prost(int64, tag = "3")]
    pub length: i64,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct SampledProvenanceSpan {
    #[prost(string, tag = "1")]
    pub sequence_id: String,
    #[prost(int64, tag = "2")]
    pub offset: i64,
    #[prost(int64, tag = "3")]
    pub length: i64,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Chunk {
    #[prost(oneof = "chunk::Kind", tags = "1, 2, 3")]
    pub chunk: Option<chunk::Kind>,
}

pub mod chunk {
    #[derive(Clone, PartialEq, prost::Oneof)]
    pub enum Kind {
        #[prost(message, tag = "1")]
        EncodedText(super::EncodedTextChunk),
        #[prost(message, tag = "2")]
        Image(super::ImageChunk),
        #[prost(message, tag = "3")]
        Dmel(super::DmelChunk),
    }
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct EncodedTextChunk {
    /// int32 little-endian.
    #[prost(bytes = "vec", tag = "1")]
    pub tokens: Vec<u8>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ImageChunk {
    #[prost(bytes = "vec", tag = "1")]
    pub data: Vec<u8>,
    #[prost(string, tag = "2")]
    pub format: String,
    #[prost(int32, optional, tag = "3")]
    pub expected_tokens: Option<i32>,
    #[prost(message, optional, tag = "4")]
    pub override_dimensions: Option<ImageDimensions>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ImageDimensions {
    #[prost(uint32, tag = "1")]
    pub width: u32,
    #[prost(uint32, tag = "2")]
    pub height: u32,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct DmelChunk {
    #[prost(bytes = "vec", tag = "1")]
    pub dmel: Vec<u8>,
}

/// In the .proto, unused on the SDK's wire (its sample requests are JSON); kept so the mirror
/// is whole.
#[derive(Clone, PartialEq, prost::Message)]
pub struct SamplingParams {
    #[prost(int32, optional, tag = "1")]
    pub max_tokens: Option<i32>,
    #[prost(uint64, optional, tag = "2")]
    pub seed: Option<u64>,
    #[prost(float, optional, tag = "3")]
    pub temperature: Option<f32>,
    #[prost(int32, optional, tag = "4")]
    pub top_k: Option<i32>,
    #[prost(float, optional, tag = "5")]
    pub top_p: Option<f32>,
    #[prost(oneof = "sampling_params::Stop", tags = "6, 7")]
    pub stop: Option<sampling_params::Stop>,
}

pub mod sampling_params {
    #[derive(Clone, PartialEq, prost::Oneof)]
    pub enum Stop {
        #[prost(message, tag = "6")]
        StopStrs(super::StopStrings),
        #[prost(message, tag = "7")]
        StopTokens(super::StopTokens),
    }
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct StopStrings {
    #[prost(string, repeated, tag = "1")]
    pub values: Vec<String>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct StopTokens {
    #[prost(int32, repeated, tag = "1")]
    pub values: Vec<i32>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
#[repr(i32)]
pub enum StopReason {
    Stop = 0,
    Length = 1,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
#[repr(i32)]
pub enum DType {
    Unspecified = 0,
    Float32 = 1,
    Int64 = 2,
    Int32 = 3,
    Bfloat16 = 4,
}
