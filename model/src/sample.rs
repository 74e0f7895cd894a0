//! Batched sampling of every completion of a step, with a KV cache and a shared prompt prefix.
//!
//! Each distinct prompt is prefilled once (left padding, attention mask, positions from the
//! mask) and its cache is expanded to its `group_size` completions. Rows that finish stop
//! growing; when half the rows of the running batch have finished, the batch is compacted.
//!
//! **Logprobs.** `Sampled::logprobs[i]` is `log_softmax(logits / temperature)` of the sampled
//! token: the model's distribution at the sampling temperature, before top-k/top-p filtering.
//! That is what [`crate::completion_logprobs`] computes for the same tokens at the same
//! temperature (it is the "old" policy of a PPO/GRPO ratio). Greedy decoding (temperature 0)
//! records `log_softmax(logits)` (temperature 1).
//!
//! **Stop strings.** A completion stops at the token whose text completes a stop string. That
//! token is kept (with its logprob) and nothing after it is generated; `text` ends with the
//! stop string (any characters the last token adds beyond it are cut from `text`, so `text`
//! can then be shorter than `decode(tokens)`). EOS tokens are kept in `tokens` (the policy
//! learns to stop) and left out of `text`.
//!
//! **Randomness.** Every completion draws from its own [`SamplerRng`] stream, forked from the
//! caller's generator in row order (one draw per completion per call), and a token is sampled
//! by inverse CDF (in f64) of one uniform over the filtered distribution; torch's generator is
//! never used. Same seed + same model + same inputs ⇒ same completions, on the same machine
//! and libtorch build with the same number of threads (CPU kernels are deterministic, but
//! their float rounding can depend on the thread count and on the CPU's vector units).

use tch::{Kind, Tensor};

use crate::error::{ModelError, Result};
use crate::model::{KvCache, Llama, positions_from_mask};
use crate::rng::SamplerRng;
use crate::tokenizer::Tokenizer;

/// How to sample.
#[derive(Clone, Debug, PartialEq)]
pub struct SamplingParams {
    /// Most tokens generated per completion.
    pub max_new_tokens: usize,
    /// Softmax temperature; 0 means greedy.
    pub temperature: f64,
    /// Nucleus sampling: keep the smallest set of tokens whose probability reaches `top_p` (1 = off).
    pub top_p: f64,
    /// Keep only the `top_k` most likely tokens (0 = off).
    pub top_k: usize,
    /// Strings that end a completion (kept at the end of `text`).
    pub stop: Vec<String>,
}

impl Default for SamplingParams {
    fn default() -> SamplingParams {
        SamplingParams { max_new_tokens: 64, temperature: 1.0, top_p: 1.0, top_k: 0, stop: Vec::new() }
    }
}

/// Why a completion ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Finish {
    /// It sampled an EOS token (kept as its last token).
    Eos,
    /// Its text reached a stop string.
    Stop,
    /// It reached `max_new_tokens`.
    Length,
}

/// One sampled completion.
#[derive(Clone, Debug, PartialEq)]
pub struct Sampled {
    /// Index of its prompt in the `prompts` given to [`generate`].
    pub prompt_index: usize,
    /// The generated ids (EOS included when it ended on one).
    pub tokens: Vec<i64>,
    /// Per token, its log-probability under `log_softmax(logits / temperature)`.
    pub logprobs: Vec<f32>,
    /// The decoded text, special tokens left out, cut after a stop string.
    pub text: String,
    pub finish: Finish,
}

/// Samples `group_size` completions of every prompt, batched; returns `prompts.len() ×
/// group_size` items, group-contiguous (all completions of prompt 0, then of prompt 1, ...).
pub fn generate(
    model: &Llama,
    tokenizer: &Tokenizer,
    prompts: &[Vec<i64>],
    group_size: usize,
    params: &SamplingParams,
    rng: &mut SamplerRng,
) -> Result<Vec<Sampled>> {
    check_params(params)?;
    if group_size == 0 {
        return Err(ModelError::InvalidInput("group_size must be at least 1".into()));
    }
    if let Some(i) = prompts.iter().position(Vec::is_empty) {
        return Err(ModelError::InvalidInput(format!("prompt {i} is empty")));
    }
    let vocab = model.vocab_size();
    if let Some(id) = prompts.iter().flatten().find(|&&id| !(0..vocab).contains(&id)) {
        return Err(ModelError::InvalidInput(format!(
            "prompt token {id} is outside the vocabulary (0..{vocab})"
        )));
    }
    let n = prompts.len() * group_size;
    // One stream per completion, forked in row order: a completion's draws do not depend on
    // when its siblings finish.
    let mut row_rngs: Vec<SamplerRng> = (0..n).map(|_| rng.fork()).collect();
    let mut rows_out: Vec<Sampled> = (0..n)
        .map(|r| Sampled {
            prompt_index: r / group_size,
            tokens: Vec::new(),
            logprobs: Vec::new(),
            text: String::new(),
            finish: Finish::Length,
        })
        .collect();
    if n == 0 || params.max_new_tokens == 0 {
        return Ok(rows_out);
    }
    tch::no_grad(|| sample_loop(model, tokenizer, prompts, group_size, params, &mut row_rngs, &mut rows_out));
    Ok(rows_out)
}

fn check_params(params: &SamplingParams) -> Result<()> {
    if !(params.temperature.is_finite() && params.temperature >= 0.0) {
        return Err(ModelError::InvalidInput(format!(
            "temperature must be ≥ 0, found {}",
            params.temperature
        )));
    }
    if !(params.top_p > 0.0 && params.top_p <= 1.0) {
        return Err(ModelError::InvalidInput(format!("top_p must be in (0, 1], found {}", params.top_p)));
    }
    if params.stop.iter().any(String::is_empty) {
        return Err(ModelError::InvalidInput("stop strings must not be empty".into()));
    }
    Ok(())
}

/// Left-pads `prompts` into `[P, L]` ids and mask.
pub(crate) fn left_pad(prompts: &[&[i64]], pad_id: i64, device: tch::Device) -> (Tensor, Tensor) {
    let len = prompts.iter().map(|p| p.len()).max().unwrap_or(0);
    let mut ids = Vec::with_capacity(prompts.len() * len);
    let mut mask = Vec::with_capacity(prompts.len() * len);
    for p in prompts {
        let pad = len - p.len();
        ids.extend(std::iter::repeat_n(pad_id, pad).chain(p.iter().copied()));
        mask.extend(std::iter::repeat_n(0i64, pad).chain(std::iter::repeat_n(1i64, p.len())));
    }
    let shape = [prompts.len() as i64, len as i64];
    (
        Tensor::from_slice(&ids).view(shape).to_device(device),
        Tensor::from_slice(&mask).view(shape).to_device(device),
    )
}

fn sample_loop(
    model: &Llama,
    tokenizer: &Tokenizer,
    prompts: &[Vec<i64>],
    group_size: usize,
    params: &SamplingParams,
    row_rngs: &mut [SamplerRng],
    out: &mut [Sampled],
) {
    let device = model.device();
    let g = group_size as i64;
    let max_new = params.max_new_tokens;
    let refs: Vec<&[i64]> = prompts.iter().map(Vec::as_slice).collect();
    let (ids, mask) = left_pad(&refs, tokenizer.pad_id(), device);
    let plen = ids.size()[1];

    // Prefill each distinct prompt once, then share its cache with its group.
    let mut cache = KvCache::new();
    let hidden = model.forward(&ids, &positions_from_mask(&mask), &mask, Some(&mut cache));
    let mut logits = model.logits(&hidden.select(1, plen - 1)).to_kind(Kind::Float);
    let mut mask = mask;
    let mut next_pos =
        Tensor::from_slice(&prompts.iter().map(|p| p.len() as i64).collect::<Vec<_>>()).to_device(device);
    // Room for the completions first, on the P prompt rows: the expansion copies it along.
    cache.reserve(max_new as i64);
    if g > 1 {
        cache = cache.repeat_interleave(g);
        logits = logits.repeat_interleave_self_int(g, 0, None::<i64>);
        mask = mask.repeat_interleave_self_int(g, 0, None::<i64>);
        next_pos = next_pos.repeat_interleave_self_int(g, 0, None::<i64>);
    }

    // rows[b] = which completion batch row b is.
    let mut rows: Vec<usize> = (0..out.len()).collect();
    let mut done = vec![false; out.len()];
    let max_stop = params.stop.iter().map(String::len).max().unwrap_or(0);
    for step in 0..max_new {
        let uniforms: Vec<f64> = if params.temperature > 0.0 {
            rows.iter().map(|&r| row_rngs[r].next_f64()).collect()
        } else {
            Vec::new()
        };
        let (tokens, logprobs) = sample_step(&logits, params, &uniforms);
        let token_vec = Vec::<i64>::try_from(&tokens).expect("int64 tokens");
        let logprob_vec = Vec::<f32>::try_from(&logprobs).expect("f32 logprobs");
        for (b, &r) in rows.iter().enumerate() {
            if done[r] {
                continue;
            }
            let row = &mut out[r];
            row.tokens.push(token_vec[b]);
            row.logprobs.push(logprob_vec[b]);
            if tokenizer.is_eos(token_vec[b]) {
                row.finish = Finish::Eos;
                done[r] = true;
            } else if max_stop > 0 {
                let text = tokenizer.decode(&row.tokens);
                // Only a match that ends in this token's text is new: search the tail.
                let from = floor_char_boundary(&text, text.len().saturating_sub(max_stop + 32));
                let hit = params
                    .stop
                    .iter()
                    .filter_map(|s| text[from..].find(s.as_str()).map(|i| from + i + s.len()))
                    .min();
                if let Some(end) = hit {
                    row.text = text[..end].to_owned();
                    row.finish = Finish::Stop;
                    done[r] = true;
                }
            }
            if !done[r] && step + 1 == max_new {
                row.finish = Finish::Length;
                done[r] = true;
            }
        }
        let active: Vec<usize> = (0..rows.len()).filter(|&b| !done[rows[b]]).collect();
        if active.is_empty() {
            break;
        }
        let mut tokens = tokens;
        if active.len() * 2 <= rows.len() {
            // Compact: drop finished rows from the batch (and their cache).
            let idx =
                Tensor::from_slice(&active.iter().map(|&b| b as i64).collect::<Vec<_>>()).to_device(device);
            cache = cache.index_select(&idx);
            mask = mask.index_select(0, &idx);
            next_pos = next_pos.index_select(0, &idx);
            tokens = tokens.index_select(0, &idx);
            rows = active.iter().map(|&b| rows[b]).collect();
        }
        let nb = rows.len() as i64;
        mask = Tensor::cat(&[&mask, &Tensor::ones([nb, 1], (Kind::Int64, device))], 1);
        let hidden = model.forward(&tokens.view([nb, 1]), &next_pos.view([nb, 1]), &mask, Some(&mut cache));
        logits = model.logits(&hidden.squeeze_dim(1)).to_kind(Kind::Float);
        next_pos += 1;
    }
    for row in out.iter_mut() {
        match row.finish {
            Finish::Stop => {}
            // The EOS token is not text, special token or not.
            Finish::Eos => row.text = tokenizer.decode(&row.tokens[..row.tokens.len() - 1]),
            Finish::Length => row.text = tokenizer.decode(&row.tokens),
        }
    }
}

fn floor_char_boundary(s: &str, mut i: usize) -> usize {
    while i > 0 && !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

/// One token per row from `logits [N, V]` (f32): the token and its log-probability under
/// `log_softmax(logits / T)` (T = 1 for greedy).
fn sample_step(logits: &Tensor, params: &SamplingParams, uniforms: &[f64]) -> (Tensor, Tensor) {
    if params.temperature == 0.0 {
        let tokens = logits.argmax(-1, false);
        let logprobs =
            logits.log_softmax(-1, Kind::Float).gather(1, &tokens.unsqueeze(1), false).squeeze_dim(1);
        return (tokens, logprobs);
    }
    let device = logits.device();
    let vocab = logits.size()[1];
    let scaled = logits / params.temperature;
    let logp = scaled.log_softmax(-1, Kind::Float);
    let top_k = params.top_k as i64;
    let filter = (top_k > 0 && top_k < vocab) || params.top_p < 1.0;
    // The candidates, most likely first when filtering, and their probabilities.
    let (probs, order) = if filter {
        let (values, order) = if top_k > 0 && top_k < vocab {
            scaled.topk(top_k, -1, true, true)
        } else {
            scaled.sort(-1, true)
        };
        let mut probs = values.softmax(-1, Kind::Double);
        if params.top_p < 1.0 {
            // Keep a token while the mass before it is below top_p (the first always stays).
            let before = probs.cumsum(-1, Kind::Double) - &probs;
            probs *= before.lt(params.top_p).to_kind(Kind::Double);
        }
        (probs, Some(order))
    } else {
        (logp.to_kind(Kind::Double).exp(), None)
    };
    // Inverse CDF: the first index whose cumulative mass exceeds u · total.
    let cdf = probs.cumsum(-1, Kind::Double);
    let width = cdf.size()[1];
    let total = cdf.select(1, width - 1);
    let u = Tensor::from_slice(uniforms).to_device(device);
    let target = (u * &total).unsqueeze(1);
    // Binary search: the number of entries ≤ target (first index whose mass exceeds it).
    let mut idx = target.searchsorted(&cdf, false, true, "right", None::<Tensor>).squeeze_dim(1);
    // u · total rounding up to total would point past the end: take the last token with mass.
    let last = cdf.argmax(-1, false);
    idx = last.where_self(&idx.ge(width), &idx);
    let tokens = match order {
        Some(order) => order.gather(1, &idx.unsqueeze(1), false).squeeze_dim(1),
        None => idx,
    };
    let logprobs = logp.gather(1, &tokens.unsqueeze(1), false).squeeze_dim(1);
    (tokens, logprobs)
}
