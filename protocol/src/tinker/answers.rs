//! The protobuf answers of `retrieve_future`, built from what a training client computed: a
//! forward/backward pass's per-datum log-probabilities and metrics, a sample's sequences. Pure;
//! byte for byte what the SDK's own protobuf classes write for the same values (the tests
//! compare with `testdata/`, made by them).

use std::collections::BTreeMap;

use super::proto::{
    ArrayRecord, BatchedTensor, DType, ForwardBackwardOutput, SampleResponse, SampledSequence, StopReason,
};

/// The record type the SDK reads `loss_fn_outputs` as.
const ARRAY_RECORD: &str = "ArrayRecord";

/// A forward/backward pass's answer: each datum's target log-probabilities (`logprobs`, one
/// per token, in the request's order) and the metrics (`NAME:REDUCTION`, which the SDK requires
/// of every key).
pub fn forward_backward_output(
    logprobs: &[Vec<f32>],
    metrics: BTreeMap<String, f64>,
) -> ForwardBackwardOutput {
    let mut data = Vec::with_capacity(logprobs.iter().map(|row| row.len() * 4).sum());
    let mut offsets = Vec::with_capacity((logprobs.len() + 1) * 8);
    offsets.extend(0i64.to_le_bytes());
    for row in logprobs {
        data.extend(row.iter().flat_map(|v| v.to_le_bytes()));
        offsets.extend((data.len() as i64).to_le_bytes());
    }
    let field = BatchedTensor { data, offsets, dtype: DType::Float32 as i32, trailing_shape: Vec::new() };
    ForwardBackwardOutput {
        loss_fn_output_type: ARRAY_RECORD.to_owned(),
        loss_fn_outputs: vec![ArrayRecord {
            type_tag: ARRAY_RECORD.to_owned(),
            fields: [("logprobs".to_owned(), field)].into(),
            num_datums: logprobs.len() as i64,
        }],
        metrics,
    }
}

/// One sampled sequence: its tokens (the stop token or text included), their log-probabilities,
/// and whether it stopped (else it ran to `max_tokens`).
#[derive(Debug, Clone, PartialEq)]
pub struct Sequence {
    pub tokens: Vec<i64>,
    pub logprobs: Vec<f32>,
    pub stopped: bool,
}

/// A sample's answer: its sequences in order, and the prompt's log-probabilities when asked
/// (NaN for the first token, which has no context).
pub fn sample_response(sequences: &[Sequence], prompt_logprobs: Option<&[f32]>) -> SampleResponse {
    SampleResponse {
        sequences: sequences
            .iter()
            .map(|sequence| SampledSequence {
                stop_reason: if sequence.stopped { StopReason::Stop } else { StopReason::Length } as i32,
                // The SDK reads int32: a vocabulary's ids fit.
                tokens: sequence.tokens.iter().flat_map(|&t| (t as i32).to_le_bytes()).collect(),
                logprobs: Some(sequence.logprobs.iter().flat_map(|v| v.to_le_bytes()).collect()),
                topk_sampled_logprobs: None,
            })
            .collect(),
        prompt_logprobs: prompt_logprobs.map(|values| values.iter().flat_map(|v| v.to_le_bytes()).collect()),
        ..SampleResponse::default()
    }
}

#[cfg(test)]
mod tests {
    use prost::Message;

    use super::*;

    #[test]
    fn answers_are_byte_for_byte_what_the_sdks_protobuf_classes_write() {
        // protocol/proto/make-fixtures.py, with the SDK's tinker_public_pb2.
        let metrics = [("loss:sum".to_owned(), 6.875), ("ppo_clipped:sum".to_owned(), 1.0)].into();
        let output = forward_backward_output(&[vec![-0.5, -1.25, -2.0], vec![-3.0, -0.125]], metrics);
        assert_eq!(output.encode_to_vec(), include_bytes!("testdata/forward_backward_output.bin"));
        let sequences = [
            Sequence { tokens: vec![11, 12, 2], logprobs: vec![-0.25, -1.5, -0.75], stopped: true },
            Sequence { tokens: vec![13, 14, 15], logprobs: vec![-0.25, -1.5, -0.75], stopped: false },
        ];
        let sample = sample_response(&sequences, Some(&[f32::NAN, -2.0, -0.5]));
        assert_eq!(sample.encode_to_vec(), include_bytes!("testdata/sample_response.bin"));
    }
}
