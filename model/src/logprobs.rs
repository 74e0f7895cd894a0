//! Log-probabilities of completion tokens for training (policy, old and reference passes).
//!
//! Logits are computed only at the positions that predict completion tokens (the last prompt
//! position and every completion position but the last), never on the rest of the prompt. A
//! prompt shared by several rows (the completions of one group) is run once: its KV cache is
//! expanded to its rows, under autograd too (the expansion is an `index_select`, so gradients
//! of all its rows flow back into the one prompt pass).

use std::collections::HashMap;

use tch::{Device, Kind, Tensor};

use crate::error::{ModelError, Result};
use crate::model::{KvCache, Llama, positions_from_mask};
use crate::sample::left_pad;

/// Prompt/completion pairs as tensors: distinct prompts left-padded, completions right-padded.
#[derive(Debug)]
pub struct SequenceBatch {
    /// Distinct prompts `[P, Lp]`, left-padded, and their mask.
    prompt_ids: Tensor,
    prompt_mask: Tensor,
    /// Real length of each distinct prompt `[P]`.
    prompt_lens: Tensor,
    /// For each row, the index of its prompt among the distinct ones `[B]`.
    prompt_of_row: Tensor,
    /// Completions `[B, C]`, right-padded.
    completion_ids: Tensor,
    /// 1.0 on completion tokens, 0.0 on padding `[B, C]`.
    mask: Tensor,
    completion_lens: Vec<usize>,
}

impl SequenceBatch {
    /// Builds a batch from `(prompt, completion)` pairs on `device`; `pad_id` fills padding
    /// (it is masked out, any valid id works). Prompts must not be empty; completions may be.
    pub fn new<P, C>(pairs: &[(P, C)], pad_id: i64, device: Device) -> Result<SequenceBatch>
    where
        P: AsRef<[i64]>,
        C: AsRef<[i64]>,
    {
        if pairs.is_empty() {
            return Err(ModelError::InvalidInput("a sequence batch needs at least one pair".into()));
        }
        let mut distinct: Vec<&[i64]> = Vec::new();
        let mut seen: HashMap<&[i64], i64> = HashMap::new();
        let mut prompt_of_row = Vec::with_capacity(pairs.len());
        for (i, (p, _)) in pairs.iter().enumerate() {
            let p = p.as_ref();
            if p.is_empty() {
                return Err(ModelError::InvalidInput(format!("prompt of pair {i} is empty")));
            }
            let idx = *seen.entry(p).or_insert_with(|| {
                distinct.push(p);
                distinct.len() as i64 - 1
            });
            prompt_of_row.push(idx);
        }
        let (prompt_ids, prompt_mask) = left_pad(&distinct, pad_id, device);
        let prompt_lens = Tensor::from_slice(&distinct.iter().map(|p| p.len() as i64).collect::<Vec<_>>());
        let c = pairs.iter().map(|(_, c)| c.as_ref().len()).max().unwrap_or(0);
        let mut ids = Vec::with_capacity(pairs.len() * c);
        let mut mask = Vec::with_capacity(pairs.len() * c);
        let mut completion_lens = Vec::with_capacity(pairs.len());
        for (_, comp) in pairs {
            let comp = comp.as_ref();
            ids.extend(comp.iter().copied().chain(std::iter::repeat_n(pad_id, c - comp.len())));
            mask.extend(
                std::iter::repeat_n(1f32, comp.len()).chain(std::iter::repeat_n(0f32, c - comp.len())),
            );
            completion_lens.push(comp.len());
        }
        let shape = [pairs.len() as i64, c as i64];
        Ok(SequenceBatch {
            prompt_ids,
            prompt_mask,
            prompt_lens: prompt_lens.to_device(device),
            prompt_of_row: Tensor::from_slice(&prompt_of_row).to_device(device),
            completion_ids: Tensor::from_slice(&ids).view(shape).to_device(device),
            mask: Tensor::from_slice(&mask).view(shape).to_device(device),
            completion_lens,
        })
    }

    /// 1.0 where a completion token is, 0.0 on padding: `[B, C]` f32.
    pub fn mask(&self) -> &Tensor {
        &self.mask
    }

    /// The completion ids, right-padded: `[B, C]`.
    pub fn completion_ids(&self) -> &Tensor {
        &self.completion_ids
    }

    /// Each row's completion length.
    pub fn completion_lens(&self) -> &[usize] {
        &self.completion_lens
    }

    /// Rows (B).
    pub fn len(&self) -> usize {
        self.completion_lens.len()
    }

    /// Whether there are no rows (never: `new` refuses that).
    pub fn is_empty(&self) -> bool {
        self.completion_lens.is_empty()
    }

    /// Padded completion length (C).
    pub fn completion_width(&self) -> i64 {
        self.completion_ids.size()[1]
    }

    /// How many distinct prompts the rows share (P ≤ B).
    pub fn num_prompts(&self) -> i64 {
        self.prompt_ids.size()[0]
    }
}

/// Log-probabilities of the completion tokens under `log_softmax(logits / temperature)`
/// (`[B, C]` f32, 0 on padding) and the hidden states at the positions that predict them
/// (`[B, C, hidden]`, in the model's dtype, for a value head). Temperature 0 counts as 1, as in
/// sampling. Differentiable; wrap in `tch::no_grad` for old/reference passes. The log-softmax
/// is computed in f32 whatever the model's dtype.
pub fn completion_logprobs(model: &Llama, batch: &SequenceBatch, temperature: f64) -> (Tensor, Tensor) {
    let hidden = predicting_hidden(model, batch);
    let logits = model.logits(&hidden).to_kind(Kind::Float);
    let logits = if temperature > 0.0 && temperature != 1.0 { logits / temperature } else { logits };
    // log_softmax(x)[t] = x[t] - logsumexp(x): no [B, C, V] log-softmax tensor is kept.
    let picked = logits.gather(2, &batch.completion_ids.unsqueeze(-1), false).squeeze_dim(-1);
    let logprobs = (picked - logits.logsumexp([-1], false)) * batch.mask();
    (logprobs, hidden)
}

/// Hidden states `[B, C, H]` at the positions predicting each completion token.
fn predicting_hidden(model: &Llama, batch: &SequenceBatch) -> Tensor {
    if model.checkpoints_activations() {
        return predicting_hidden_in_one_pass(model, batch);
    }
    let device = model.device();
    let (b, c) = (batch.len() as i64, batch.completion_width());
    let plen = batch.prompt_ids.size()[1];
    let mut cache = KvCache::new();
    let prompt_hidden = model.forward(
        &batch.prompt_ids,
        &positions_from_mask(&batch.prompt_mask),
        &batch.prompt_mask,
        Some(&mut cache),
    );
    // Left padding: the last column is every prompt's last real token.
    let last = prompt_hidden.select(1, plen - 1).index_select(0, &batch.prompt_of_row).unsqueeze(1);
    if c <= 1 {
        return if c == 1 { last } else { last.narrow(1, 0, 0) };
    }
    let shared = batch.num_prompts() < b;
    let mut cache = if shared { cache.index_select(&batch.prompt_of_row) } else { cache };
    let prompt_mask = if shared {
        batch.prompt_mask.index_select(0, &batch.prompt_of_row)
    } else {
        batch.prompt_mask.shallow_clone()
    };
    let prompt_lens = batch.prompt_lens.index_select(0, &batch.prompt_of_row);
    // Inputs: every completion token but the last (it predicts nothing we score).
    let inputs = batch.completion_ids.narrow(1, 0, c - 1);
    let comp_mask = batch.mask.narrow(1, 0, c - 1).to_kind(Kind::Int64);
    let mask = Tensor::cat(&[&prompt_mask, &comp_mask], 1);
    let positions = prompt_lens.unsqueeze(1) + Tensor::arange(c - 1, (Kind::Int64, device)).unsqueeze(0);
    let hidden = model.forward(&inputs, &positions, &mask, Some(&mut cache));
    Tensor::cat(&[&last, &hidden], 1)
}

/// [`predicting_hidden`] as one pass over each row's prompt and completion, with no KV cache:
/// what a checkpointed training pass needs (a cache shared between two passes would carry the
/// prompt's part of the graph, which checkpointing does not record). Each row runs its prompt.
fn predicting_hidden_in_one_pass(model: &Llama, batch: &SequenceBatch) -> Tensor {
    let c = batch.completion_width();
    let plen = batch.prompt_ids.size()[1];
    let prompt_ids = batch.prompt_ids.index_select(0, &batch.prompt_of_row);
    let prompt_mask = batch.prompt_mask.index_select(0, &batch.prompt_of_row);
    let fed = (c - 1).max(0);
    let inputs = Tensor::cat(&[&prompt_ids, &batch.completion_ids.narrow(1, 0, fed)], 1);
    let comp_mask = batch.mask.narrow(1, 0, fed).to_kind(prompt_mask.kind());
    let mask = Tensor::cat(&[&prompt_mask, &comp_mask], 1);
    let hidden = model.forward(&inputs, &positions_from_mask(&mask), &mask, None);
    hidden.narrow(1, plen - 1, c.min(1) + fed)
}
