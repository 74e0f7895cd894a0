//! A `forward_backward` request's datums as a trainer reads them: each datum's tokens (its text
//! chunks concatenated) and its loss's inputs as typed arrays, each as long as the tokens — read
//! from the SDK's protobuf ([`super::proto`]) with every size checked against [`Limits`] and
//! against the bytes it claims before anything is allocated for it. Pure: the daemon reads a
//! request so before it queues it (a refusal is the request's, answered at once), and the
//! training client's worker reads it again from the same bytes.

use std::collections::BTreeMap;

use super::proto::{self, Chunk, DType, Datum, Tensor, chunk, tensor};

/// The most one request may carry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Datums in one request (the SDK sends at most 1024 a chunk).
    pub datums: usize,
    /// Tokens in one datum (the model's context).
    pub tokens_per_datum: usize,
    /// Tokens over the request's datums.
    pub tokens: usize,
    /// Values per token of a matrix input (several targets per position).
    pub columns: usize,
}

/// One datum, read: its tokens and its loss's inputs, each with a row per token.
#[derive(Debug, Clone, PartialEq)]
pub struct TrainDatum {
    pub tokens: Vec<i64>,
    pub inputs: BTreeMap<String, Input>,
}

/// A loss input: one row per token of `columns` values each (1 for a vector; several target
/// tokens and their weights per position for a matrix), row-major.
#[derive(Debug, Clone, PartialEq)]
pub struct Input {
    pub columns: usize,
    pub values: Values,
}

/// An input's values, in its dtype.
#[derive(Debug, Clone, PartialEq)]
pub enum Values {
    Int(Vec<i64>),
    Float(Vec<f32>),
}

impl Values {
    /// As floats (token ids as their numbers).
    pub fn floats(&self) -> Vec<f32> {
        match self {
            Values::Float(values) => values.clone(),
            Values::Int(values) => values.iter().map(|&v| v as f32).collect(),
        }
    }
}

/// Why a request cannot be trained on: which datum and input, and what is wrong. The SDK shows
/// it to the team as a `user` error.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{at}: {message}")]
pub struct DatumError {
    /// `data[3].loss_fn_inputs.weights`, `data`.
    pub at: String,
    pub message: String,
}

fn refuse(at: impl Into<String>, message: impl Into<String>) -> DatumError {
    DatumError { at: at.into(), message: message.into() }
}

/// Every datum of a request, read and checked.
pub fn read(data: &[Datum], limits: &Limits) -> Result<Vec<TrainDatum>, DatumError> {
    if data.is_empty() {
        return Err(refuse("data", "expected at least one datum"));
    }
    if data.len() > limits.datums {
        return Err(refuse(
            "data",
            format!("expected at most {} datums a request, got {}", limits.datums, data.len()),
        ));
    }
    let mut total = 0usize;
    let mut read = Vec::with_capacity(data.len());
    for (i, datum) in data.iter().enumerate() {
        let at = format!("data[{i}]");
        let length = token_count(&datum.model_input, &at)?;
        if length == 0 || length > limits.tokens_per_datum {
            return Err(refuse(
                format!("{at}.model_input"),
                format!(
                    "expected 1 to {} tokens (the model's context), got {length}",
                    limits.tokens_per_datum
                ),
            ));
        }
        total += length;
        if total > limits.tokens {
            return Err(refuse("data", format!("expected at most {} tokens a request", limits.tokens)));
        }
        let mut tokens = Vec::with_capacity(length);
        for chunk in &datum.model_input {
            if let Some(chunk::Kind::EncodedText(text)) = &chunk.chunk {
                tokens.extend(
                    text.tokens
                        .chunks_exact(4)
                        .map(|b| i64::from(i32::from_le_bytes([b[0], b[1], b[2], b[3]]))),
                );
            }
        }
        let mut inputs = BTreeMap::new();
        for (name, tensor) in &datum.loss_fn_inputs {
            let at = format!("{at}.loss_fn_inputs.{name}");
            inputs.insert(name.clone(), input(tensor, length, limits.columns, &at)?);
        }
        read.push(TrainDatum { tokens, inputs });
    }
    Ok(read)
}

/// A datum's token count from its chunks' byte lengths: text only.
fn token_count(chunks: &[Chunk], at: &str) -> Result<usize, DatumError> {
    let mut count = 0usize;
    for (j, chunk) in chunks.iter().enumerate() {
        let at = format!("{at}.model_input[{j}]");
        match &chunk.chunk {
            Some(chunk::Kind::EncodedText(text)) => {
                if text.tokens.len() % 4 != 0 {
                    return Err(refuse(
                        at,
                        format!("{} bytes of int32 tokens is not a whole number of them", text.tokens.len()),
                    ));
                }
                count += text.tokens.len() / 4;
            }
            Some(chunk::Kind::Image(_)) => {
                return Err(refuse(at, "image chunks are not served here: text models only"));
            }
            Some(chunk::Kind::Dmel(_)) => {
                return Err(refuse(at, "DMel (audio) chunks are not served here: text models only"));
            }
            None => return Err(refuse(at, "an empty chunk")),
        }
    }
    Ok(count)
}

/// A loss input of one row per token: a vector (`[n]`) or a matrix (`[n, k]`), dense or CSR
/// (absent cells 0).
fn input(tensor: &Tensor, length: usize, max_columns: usize, at: &str) -> Result<Input, DatumError> {
    let dtype = DType::try_from(tensor.dtype)
        .map_err(|_| refuse(at, format!("an unknown dtype {}", tensor.dtype)))?;
    let width = match dtype {
        DType::Float32 | DType::Int32 => 4,
        DType::Int64 => 8,
        DType::Bfloat16 => return Err(refuse(at, "bfloat16 inputs are not taken: send float32")),
        DType::Unspecified => return Err(refuse(at, "no dtype")),
    };
    let shape: Vec<usize> = match tensor.shape.as_slice() {
        [] => vec![length],
        dims => dims
            .iter()
            .map(|&d| usize::try_from(d).map_err(|_| refuse(at, format!("a negative dimension in {dims:?}"))))
            .collect::<Result<_, _>>()?,
    };
    let columns = match shape.as_slice() {
        [rows] if *rows == length => 1,
        [rows, columns] if *rows == length && (1..=max_columns).contains(columns) => *columns,
        _ => {
            return Err(refuse(
                at,
                format!(
                    "expected shape [{length}] or [{length}, 1..={max_columns}] (a row per token), got {shape:?}"
                ),
            ));
        }
    };
    let cells = length * columns;
    let bytes: Vec<u8> = match &tensor.encoding {
        Some(tensor::Encoding::Dense(bytes)) => {
            if bytes.len() != cells * width {
                return Err(refuse(at, format!("{} bytes for {cells} values of {width} bytes", bytes.len())));
            }
            bytes.clone()
        }
        Some(tensor::Encoding::SparseCsr(csr)) => dense(csr, length, columns, width, at)?,
        None => return Err(refuse(at, "no values")),
    };
    let values = match dtype {
        DType::Float32 => Values::Float(
            bytes.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect(),
        ),
        DType::Int32 => Values::Int(
            bytes.chunks_exact(4).map(|b| i64::from(i32::from_le_bytes([b[0], b[1], b[2], b[3]]))).collect(),
        ),
        _ => Values::Int(
            bytes.chunks_exact(8).map(|b| i64::from_le_bytes(b.try_into().unwrap_or([0; 8]))).collect(),
        ),
    };
    Ok(Input { columns, values })
}

/// A CSR matrix of `rows × columns`, dense (absent cells 0), after checking its indices.
fn dense(
    csr: &proto::SparseCsr,
    rows: usize,
    columns: usize,
    width: usize,
    at: &str,
) -> Result<Vec<u8>, DatumError> {
    let longs = |bytes: &[u8], what: &str| -> Result<Vec<i64>, DatumError> {
        if bytes.len() % 8 != 0 {
            return Err(refuse(at, format!("{what}: {} bytes is not a whole number of int64", bytes.len())));
        }
        Ok(bytes.chunks_exact(8).map(|b| i64::from_le_bytes(b.try_into().unwrap_or([0; 8]))).collect())
    };
    if csr.crow_indices.len() != (rows + 1) * 8 {
        return Err(refuse(
            at,
            format!("expected {} row offsets, got {} bytes of them", rows + 1, csr.crow_indices.len()),
        ));
    }
    let crow = longs(&csr.crow_indices, "crow_indices")?;
    let cols = longs(&csr.col_indices, "col_indices")?;
    if csr.values.len() != cols.len() * width {
        return Err(refuse(at, format!("{} bytes of values for {} cells", csr.values.len(), cols.len())));
    }
    let mut dense = vec![0u8; rows * columns * width];
    for row in 0..rows {
        let (start, end) = (crow[row], crow[row + 1]);
        if start < 0 || end < start || end as usize > cols.len() {
            return Err(refuse(
                at,
                format!("row {row}'s offsets {start}..{end} are outside its {} cells", cols.len()),
            ));
        }
        let (start, end) = (start as usize, end as usize);
        let values = csr.values[start * width..end * width].chunks_exact(width);
        for (&column, value) in cols[start..end].iter().zip(values) {
            let Some(column) = usize::try_from(column).ok().filter(|&c| c < columns) else {
                return Err(refuse(at, format!("column {column} outside {columns}")));
            };
            let to = (row * columns + column) * width;
            dense[to..to + width].copy_from_slice(value);
        }
    }
    Ok(dense)
}

#[cfg(test)]
mod tests {
    use prost::Message;

    use super::*;
    use crate::tinker::proto::{EncodedTextChunk, ForwardBackwardRequest, SparseCsr, loss_config_value};

    const LIMITS: Limits = Limits { datums: 4, tokens_per_datum: 8, tokens: 12, columns: 3 };

    #[test]
    fn a_request_as_the_sdk_encoded_it_reads_token_for_token() {
        // protocol/proto/make-fixtures.py: the SDK's own encoder.
        let bytes = include_bytes!("testdata/forward_backward_request.bin");
        let request = ForwardBackwardRequest::decode(bytes.as_slice()).unwrap();
        assert_eq!(
            (request.model_id.as_str(), request.seq_id, request.loss_fn.as_str()),
            ("sess:train:0", 7, "ppo")
        );
        assert_eq!(request.loss_fn_config.get("clip_high_threshold"), Some(&1.2));
        assert_eq!(
            request.loss_fn_config_v2.get("note").and_then(|v| v.value.clone()),
            Some(loss_config_value::Value::Text("x".into()))
        );
        let data = read(&request.data, &LIMITS).unwrap();
        assert_eq!(data[0].tokens, [5, 6, 7]);
        let vector = |values| Input { columns: 1, values };
        assert_eq!(data[0].inputs["target_tokens"], vector(Values::Int(vec![6, 7, 8])));
        assert_eq!(data[0].inputs["logprobs"], vector(Values::Float(vec![-0.5, -1.25, -2.0])));
        assert_eq!(data[0].inputs["advantages"], vector(Values::Float(vec![0.0, 1.5, 1.5])));
        assert_eq!(data[1].tokens, [1, 2]);
        // The CSR weights, a row per token: [[0, 0, 0.25], [4, 0, 0]].
        assert_eq!(
            data[1].inputs["weights"],
            Input { columns: 3, values: Values::Float(vec![0.0, 0.0, 0.25, 4.0, 0.0, 0.0]) }
        );
    }

    fn text(tokens: &[i32]) -> Chunk {
        Chunk {
            chunk: Some(chunk::Kind::EncodedText(EncodedTextChunk {
                tokens: tokens.iter().flat_map(|t| t.to_le_bytes()).collect(),
            })),
        }
    }

    fn floats(values: &[f32], shape: &[i64]) -> Tensor {
        Tensor {
            encoding: Some(tensor::Encoding::Dense(values.iter().flat_map(|v| v.to_le_bytes()).collect())),
            dtype: DType::Float32 as i32,
            shape: shape.to_vec(),
        }
    }

    fn datum(tokens: &[i32], inputs: Vec<(&str, Tensor)>) -> Datum {
        Datum {
            model_input: vec![text(tokens)],
            loss_fn_inputs: inputs.into_iter().map(|(k, v)| (k.to_owned(), v)).collect(),
            ..Datum::default()
        }
    }

    #[test]
    fn every_size_is_checked_before_it_is_read_and_each_refusal_names_its_place() {
        let weights =
            |values: &[f32], shape: &[i64]| datum(&[1, 2], vec![("weights", floats(values, shape))]);
        let csr = |crow: &[i64], cols: &[i64], values: &[f32]| Tensor {
            encoding: Some(tensor::Encoding::SparseCsr(SparseCsr {
                values: values.iter().flat_map(|v| v.to_le_bytes()).collect(),
                crow_indices: crow.iter().flat_map(|v| v.to_le_bytes()).collect(),
                col_indices: cols.iter().flat_map(|v| v.to_le_bytes()).collect(),
            })),
            dtype: DType::Float32 as i32,
            shape: vec![2, 3],
        };
        let image = Datum {
            model_input: vec![Chunk { chunk: Some(chunk::Kind::Image(proto::ImageChunk::default())) }],
            ..Datum::default()
        };
        let odd = Datum {
            model_input: vec![Chunk {
                chunk: Some(chunk::Kind::EncodedText(EncodedTextChunk { tokens: vec![1, 2, 3] })),
            }],
            ..Datum::default()
        };
        // (the datums, the refusal)
        let cases: Vec<(Vec<Datum>, &str)> = vec![
            (vec![], "data: expected at least one datum"),
            (vec![weights(&[1.0, 1.0], &[2]); 5], "data: expected at most 4 datums a request, got 5"),
            (
                vec![datum(&[1; 9], vec![])],
                "data[0].model_input: expected 1 to 8 tokens (the model's context), got 9",
            ),
            (
                vec![datum(&[1; 7], vec![]), datum(&[1; 7], vec![])],
                "data: expected at most 12 tokens a request",
            ),
            (vec![image], "data[0].model_input[0]: image chunks are not served here"),
            (vec![odd], "data[0].model_input[0]: 3 bytes of int32 tokens"),
            (vec![weights(&[1.0], &[2])], "data[0].loss_fn_inputs.weights: 4 bytes for 2 values of 4 bytes"),
            (
                vec![weights(&[1.0, 1.0, 1.0], &[3])],
                "expected shape [2] or [2, 1..=3] (a row per token), got [3]",
            ),
            (vec![weights(&[1.0; 8], &[2, 4])], "got [2, 4]"),
            (vec![weights(&[1.0; 4], &[2, 3])], "16 bytes for 6 values of 4 bytes"),
            (vec![weights(&[1.0, 1.0], &[2, -1])], "a negative dimension"),
            (
                vec![datum(&[1, 2], vec![("weights", csr(&[0, 1], &[0], &[1.0]))])],
                "expected 3 row offsets, got 16 bytes of them",
            ),
            (
                vec![datum(&[1, 2], vec![("weights", csr(&[0, 1, 5], &[0], &[1.0]))])],
                "row 1's offsets 1..5 are outside its 1 cells",
            ),
            (vec![datum(&[1, 2], vec![("weights", csr(&[0, 1, 1], &[3], &[1.0]))])], "column 3 outside 3"),
            (
                vec![datum(&[1, 2], vec![("weights", csr(&[0, 1, 1], &[0], &[]))])],
                "0 bytes of values for 1 cells",
            ),
            (
                vec![datum(&[1, 2], vec![("weights", Tensor { dtype: 9, ..floats(&[1.0, 1.0], &[2]) })])],
                "an unknown dtype 9",
            ),
        ];
        for (data, expected) in cases {
            let refused = read(&data, &LIMITS).expect_err(expected).to_string();
            assert!(refused.contains(expected), "{expected:?}: {refused}");
        }
        let unshaped = read(&[weights(&[0.5, 2.0], &[])], &LIMITS).unwrap();
        assert_eq!(
            unshaped[0].inputs["weights"],
            Input { columns: 1, values: Values::Float(vec![0.5, 2.0]) }
        );
    }
}
