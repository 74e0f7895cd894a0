//! Log-probabilities of completion tokens for training (policy, old and reference passes).
//!
//! Logits are computed only at the positions that predict completion tokens (the last prompt
//! position and every completion position but the last), never on the rest of the prompt. A
//! prompt shared by several rows (the completions of one group) is run once: its KV cache is
//! expanded to its rows, under autograd too (the expansion is an `index_select`, so gradients
//! of all its rows flow back into the one prompt pass).
//!
//! The logits themselves are computed a chunk of positions at a time ([`Llama::logits_chunk`],
//! over the batch's positions flattened row by row), never as the whole `[B × C × V]`: without
//! grad each chunk's logits are gone before the next chunk's, and a training pass
//! ([`training_logprobs`]) cuts the graph at the hidden states and recomputes each chunk's logits
//! in its backward pass, as activation checkpointing does for the layers.
//!
//! Why: `[rows × completion tokens × vocabulary]` is 1.1–1.4 GiB of f32 per 1k tokens at a 152k
//! vocabulary. A chunk is `rlvr_protocol::memory::LOGITS_CHUNK_BYTES` (64 MiB) of f32.
//! [`completion_logprobs`] is the pass without grad; [`training_logprobs`] returns a
//! [`TrainingLogprobs`] whose `backward` (after the loss's) recomputes each chunk's logits with grad,
//! sends the hidden states' summed gradient (a value head's too) through the model once, then runs
//! `Llama::backward_checkpointed`. A pass dropped after the loss's backward without it panics rather
//! than train without it. [`training_kl`] is distillation's per-position KL over the vocabulary by
//! the same scheme: the teacher's hidden states without grad, both models' logits a chunk at a time.

use std::collections::HashMap;

use tch::{Device, Kind, Tensor};

use crate::error::{ModelError, Result};
use crate::model::{KvCache, Llama, Padding, RealPositions, positions_from_mask};
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
    /// Whether a distinct prompt is shorter than the longest (so left-padded), known on the host.
    prompts_padded: bool,
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
        let longest_prompt = distinct.iter().map(|p| p.len()).max().unwrap_or(0);
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
            prompts_padded: distinct.iter().any(|p| p.len() < longest_prompt),
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

/// Positions per chunk for a vocabulary of `vocab` logits:
/// [`rlvr_protocol::memory::LOGITS_CHUNK_BYTES`] of f32 (why that much: there), at least one.
/// The memory estimate counts the same chunk.
pub fn default_logits_chunk(vocab: i64) -> i64 {
    let positions = rlvr_protocol::memory::logits_chunk_positions(vocab.max(1).unsigned_abs());
    i64::try_from(positions).unwrap_or(i64::MAX)
}

/// Log-probabilities of the completion tokens under `log_softmax(logits / temperature)`
/// (`[B, C]` f32, 0 on padding) and the hidden states at the positions that predict them
/// (`[B, C, hidden]`, in the model's dtype, for a value head). Temperature 0 counts as 1, as in
/// sampling. Without grad (it runs under `tch::no_grad` whatever the caller's mode): the old,
/// reference and value passes; a training pass is [`training_logprobs`]. The logits are
/// computed [`Llama::logits_chunk`] positions at a time, never for the whole batch at once;
/// the log-softmax is computed in f32 whatever the model's dtype.
pub fn completion_logprobs(model: &Llama, batch: &SequenceBatch, temperature: f64) -> (Tensor, Tensor) {
    tch::no_grad(|| {
        let hidden = predicting_hidden(model, batch);
        let logprobs = Positions::of(model, batch, &hidden, temperature).logprobs();
        (logprobs, hidden)
    })
}

/// The training pass: [`completion_logprobs`] with grad, with no more than
/// [`Llama::logits_chunk`] positions' logits alive at once in the forward or the backward pass.
///
/// The log-probabilities are computed chunk by chunk without grad from a leaf copy of the hidden
/// states, and are a leaf themselves: a loss built on them (and on [`TrainingLogprobs::hidden`],
/// for a value head) back-propagates only to those two leaves. [`TrainingLogprobs::backward`],
/// called right after `loss.backward()`, finishes the pass: each chunk's logits are recomputed
/// with grad and back-propagated with its log-probabilities' gradient (which also reaches the
/// `lm_head` or tied embedding weight), then the hidden states' summed gradient goes through the
/// model once, and through [`Llama::backward_checkpointed`] for checkpointed layers.
/// Gradients are those of one pass over the whole `[B × C × V]` logits, to rounding.
pub fn training_logprobs<'m>(
    model: &'m Llama,
    batch: &SequenceBatch,
    temperature: f64,
) -> TrainingLogprobs<'m> {
    let hidden = predicting_hidden(model, batch);
    let leaf = hidden.detach().set_requires_grad(true);
    let positions = tch::no_grad(|| Positions::of(model, batch, &leaf, temperature));
    let logprobs = tch::no_grad(|| positions.logprobs()).set_requires_grad(true);
    TrainingLogprobs { model_hidden: hidden, hidden: leaf, logprobs, positions, finished: false }
}

/// A training pass's log-probabilities and the backward pass they still owe: see
/// [`training_logprobs`]. Dropped after `loss.backward()` without [`TrainingLogprobs::backward`],
/// it panics, since the model's gradients would silently lack this pass.
#[must_use = "the backward pass through the logits and the model runs in TrainingLogprobs::backward"]
pub struct TrainingLogprobs<'m> {
    /// The hidden states with the model's graph behind them.
    model_hidden: Tensor,
    /// `model_hidden` cut from that graph, a leaf: what the log-probabilities and a value head
    /// read.
    hidden: Tensor,
    /// `[B, C]` f32, a leaf with grad.
    logprobs: Tensor,
    /// The leaf's positions (without its grad), which the backward pass recomputes.
    positions: Positions<'m>,
    /// Whether [`TrainingLogprobs::backward`] ran.
    finished: bool,
}

impl TrainingLogprobs<'_> {
    /// Log-probabilities of the completion tokens, `[B, C]` f32, 0 on padding: a leaf with grad.
    pub fn logprobs(&self) -> &Tensor {
        &self.logprobs
    }

    /// The hidden states at the positions predicting the completion tokens, `[B, C, hidden]` in
    /// the model's dtype: a leaf with grad, for a value head, whose gradient joins the
    /// log-probabilities' in [`TrainingLogprobs::backward`].
    pub fn hidden(&self) -> &Tensor {
        &self.hidden
    }

    /// Finishes the backward pass; call it right after `loss.backward()`. Recomputes each chunk's
    /// logits with grad and back-propagates its log-probabilities' gradient into the `lm_head`
    /// (or tied embedding) weight and that chunk of the hidden states, adds the value head's
    /// gradient of the hidden states, back-propagates the sum through the model with one
    /// backward pass, then runs [`Llama::backward_checkpointed`]. Chunks run in order, so the
    /// gradients are the same on every run.
    pub fn backward(mut self) {
        self.finished = true;
        let from_head = self.hidden.grad();
        let grad = self.logprobs.grad();
        let from_logprobs = grad.defined().then(|| self.positions.backward(&grad));
        let grad = match (from_logprobs, from_head.defined()) {
            (Some(logprobs), true) => Some(logprobs + from_head),
            (Some(logprobs), false) => Some(logprobs),
            (None, true) => Some(from_head),
            (None, false) => None,
        };
        if let Some(grad) = grad
            && self.model_hidden.requires_grad()
        {
            // d/dh Σ(h·g) = g: back-propagates exactly the hidden states' gradient.
            (&self.model_hidden * grad).sum(Kind::Float).backward();
        }
        self.positions.model.backward_checkpointed();
    }
}

impl Drop for TrainingLogprobs<'_> {
    fn drop(&mut self) {
        if self.finished || std::thread::panicking() {
            return;
        }
        assert!(
            !self.logprobs.grad().defined() && !self.hidden.grad().defined(),
            "a training pass's log-probabilities were back-propagated, but TrainingLogprobs::backward \
             never ran: the model's gradients lack this pass"
        );
    }
}

/// Which way a distillation KL runs, per position over the whole vocabulary, both
/// distributions at temperature τ: `Forward` is KL(teacher ‖ student) (Hinton et al. 2015,
/// "Distilling the Knowledge in a Neural Network"; GKD's supervised KD, Agarwal et al. 2023,
/// arXiv:2306.13649), `Reverse` is KL(student ‖ teacher) (MiniLLM, Gu et al. 2023,
/// arXiv:2306.08543; GKD's on-policy reverse KL).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KlDirection {
    Forward,
    Reverse,
}

/// A distillation training pass: per completion position, the KL between the teacher's and the
/// student's next-token distributions over the whole vocabulary (`[B, C]` f32, 0 on padding),
/// with the pass's graph stopping at the student's hidden states as [`training_logprobs`]'s
/// does. No more than [`Llama::logits_chunk`] positions' logits (the student's and the
/// teacher's) are alive at once: the teacher's hidden states are computed once without grad,
/// its logits recomputed per chunk, never kept for the batch. The KL is a leaf with grad; a loss
/// built on it back-propagates through [`TrainingKl::backward`], which recomputes each chunk with
/// grad for the student. The teacher and the student share a tokenizer (the caller checks).
pub fn training_kl<'m>(
    student: &'m Llama,
    teacher: &'m Llama,
    batch: &SequenceBatch,
    temperature: f64,
    direction: KlDirection,
) -> TrainingKl<'m> {
    let hidden = predicting_hidden(student, batch);
    let leaf = hidden.detach().set_requires_grad(true);
    let teacher_hidden = tch::no_grad(|| predicting_hidden(teacher, batch));
    let student_positions = tch::no_grad(|| Positions::of(student, batch, &leaf, 1.0));
    let pass = KlPositions {
        teacher_hidden: tch::no_grad(|| student_positions.real.gather(&teacher_hidden)),
        student: student_positions,
        teacher,
        temperature: if temperature > 0.0 { temperature } else { 1.0 },
        direction,
    };
    let kl = tch::no_grad(|| pass.kl()).set_requires_grad(true);
    TrainingKl { model_hidden: hidden, kl, pass, finished: false }
}

/// A distillation pass's KL and the backward pass it still owes: see [`training_kl`]. Dropped
/// after `loss.backward()` without [`TrainingKl::backward`], it panics, as
/// [`TrainingLogprobs`] does.
#[must_use = "the backward pass through the logits and the model runs in TrainingKl::backward"]
pub struct TrainingKl<'m> {
    model_hidden: Tensor,
    /// `[B, C]` f32, a leaf with grad.
    kl: Tensor,
    pass: KlPositions<'m>,
    finished: bool,
}

impl TrainingKl<'_> {
    /// The per-position KL, `[B, C]` f32, 0 on padding: a leaf with grad.
    pub fn kl(&self) -> &Tensor {
        &self.kl
    }

    /// Finishes the backward pass; call it right after `loss.backward()`: each chunk's KL is
    /// recomputed with grad for the student and back-propagated with the KL's gradient, then the
    /// student's hidden states' gradient goes through the model once.
    pub fn backward(mut self) {
        self.finished = true;
        let grad = self.kl.grad();
        if grad.defined() && self.model_hidden.requires_grad() {
            let from_kl = self.pass.backward(&grad);
            (&self.model_hidden * from_kl).sum(Kind::Float).backward();
        }
        self.pass.student.model.backward_checkpointed();
    }
}

impl Drop for TrainingKl<'_> {
    fn drop(&mut self) {
        if self.finished || std::thread::panicking() {
            return;
        }
        assert!(
            !self.kl.grad().defined(),
            "a distillation pass's KL was back-propagated, but TrainingKl::backward never ran"
        );
    }
}

/// The student's positions (a leaf of its hidden states) and the teacher's hidden states at the
/// same positions.
struct KlPositions<'a> {
    student: Positions<'a>,
    teacher: &'a Llama,
    /// `[N, teacher hidden]` at the student's real positions, without grad.
    teacher_hidden: Tensor,
    temperature: f64,
    direction: KlDirection,
}

impl KlPositions<'_> {
    /// `[N]` f32: the KL at each of `len` positions from `start`, from the student's hidden
    /// states `x` (with or without grad); the teacher's side without grad.
    fn chunk_kl(&self, x: &Tensor, start: i64, len: i64) -> Tensor {
        let tau = self.temperature;
        let student = (self.student.model.logits(x).to_kind(Kind::Float) / tau).log_softmax(-1, Kind::Float);
        let teacher = tch::no_grad(|| {
            let hidden = self.teacher_hidden.narrow(0, start, len);
            (self.teacher.logits(&hidden).to_kind(Kind::Float) / tau).log_softmax(-1, Kind::Float)
        });
        let (p, q) = match self.direction {
            KlDirection::Forward => (&teacher, &student),
            KlDirection::Reverse => (&student, &teacher),
        };
        // KL(p ‖ q) = Σ_v p(v) (log p(v) − log q(v)).
        let kl = (p.exp() * (p - q)).sum_dim_intlist([-1i64].as_slice(), false, Kind::Float);
        kl * self.student.mask.narrow(0, start, len)
    }

    fn kl(&self) -> Tensor {
        let student = &self.student;
        let parts: Vec<Tensor> = chunks(student.hidden.size()[0], student.chunk)
            .map(|(start, len)| self.chunk_kl(&student.hidden.narrow(0, start, len), start, len))
            .collect();
        if parts.is_empty() {
            return Tensor::zeros(student.shape, (Kind::Float, student.model.device()));
        }
        student.padded(&Tensor::cat(&parts, 0))
    }

    fn backward(&self, grad: &Tensor) -> Tensor {
        let student = &self.student;
        let grad = student.real.gather(&grad.unsqueeze(-1)).squeeze_dim(-1);
        let parts: Vec<Tensor> = chunks(student.hidden.size()[0], student.chunk)
            .map(|(start, len)| {
                let x = student.hidden.narrow(0, start, len).detach().set_requires_grad(true);
                (self.chunk_kl(&x, start, len) * grad.narrow(0, start, len)).sum(Kind::Float).backward();
                x.grad()
            })
            .collect();
        let [b, c] = student.shape;
        if parts.is_empty() {
            return Tensor::zeros(
                [b, c, student.hidden.size()[1]],
                (student.hidden.kind(), student.hidden.device()),
            );
        }
        student.real.scatter(&Tensor::cat(&parts, 0))
    }
}

/// A batch's completion positions, the real ones only (a row's first `len` of its `C`),
/// flattened row-major (a chunk may end inside one row and go on into the next), with what
/// their log-probabilities read: no logits are computed for padding.
struct Positions<'a> {
    model: &'a Llama,
    /// `[N, hidden]`.
    hidden: Tensor,
    /// `[N]`.
    ids: Tensor,
    mask: Tensor,
    /// Where the `N` positions are in the `[B, C]` layout.
    real: RealPositions,
    /// `[B, C]`.
    shape: [i64; 2],
    temperature: f64,
    /// Positions per chunk, the model's when these were made.
    chunk: i64,
}

impl<'a> Positions<'a> {
    fn of(model: &'a Llama, batch: &SequenceBatch, hidden: &Tensor, temperature: f64) -> Positions<'a> {
        let shape = [batch.len() as i64, batch.completion_width()];
        let real = RealPositions::of_lengths(&batch.completion_lens, shape[1], model.device());
        let column = |t: &Tensor| real.gather(&t.unsqueeze(-1)).squeeze_dim(-1);
        Positions {
            model,
            hidden: real.gather(hidden),
            ids: column(&batch.completion_ids),
            mask: column(&batch.mask),
            real,
            shape,
            temperature,
            chunk: model.logits_chunk(),
        }
    }

    /// `[N]` values of the real positions in the `[B, C]` layout, 0 at the padding.
    fn padded(&self, values: &Tensor) -> Tensor {
        self.real.scatter(&values.unsqueeze(-1)).view(self.shape)
    }

    /// `[B, C]` f32, chunk by chunk.
    fn logprobs(&self) -> Tensor {
        let parts: Vec<Tensor> = chunks(self.hidden.size()[0], self.chunk)
            .map(|(start, len)| {
                position_logprobs(
                    self.model,
                    &self.hidden.narrow(0, start, len),
                    &self.ids.narrow(0, start, len),
                    &self.mask.narrow(0, start, len),
                    self.temperature,
                )
            })
            .collect();
        if parts.is_empty() {
            return Tensor::zeros(self.shape, (Kind::Float, self.model.device()));
        }
        self.padded(&Tensor::cat(&parts, 0))
    }

    /// The hidden states' gradient `[B, C, hidden]` from the log-probabilities' `grad` `[B, C]`:
    /// each chunk recomputed with grad from its own leaf and back-propagated, in order; the
    /// `lm_head` weight's gradient accumulates on the way.
    fn backward(&self, grad: &Tensor) -> Tensor {
        let grad = self.real.gather(&grad.unsqueeze(-1)).squeeze_dim(-1);
        let parts: Vec<Tensor> = chunks(self.hidden.size()[0], self.chunk)
            .map(|(start, len)| {
                let x = self.hidden.narrow(0, start, len).detach().set_requires_grad(true);
                let ids = self.ids.narrow(0, start, len);
                let mask = self.mask.narrow(0, start, len);
                let logprobs = position_logprobs(self.model, &x, &ids, &mask, self.temperature);
                // d/dx Σ(logprobs·g) back-propagates exactly this chunk's gradient.
                (logprobs * grad.narrow(0, start, len)).sum(Kind::Float).backward();
                x.grad()
            })
            .collect();
        let [b, c] = self.shape;
        if parts.is_empty() {
            return Tensor::zeros([b, c, self.hidden.size()[1]], (self.hidden.kind(), self.hidden.device()));
        }
        self.real.scatter(&Tensor::cat(&parts, 0))
    }
}

/// `(start, len)` of each chunk of `chunk` positions (the last one shorter) over `total`.
fn chunks(total: i64, chunk: i64) -> impl Iterator<Item = (i64, i64)> {
    (0..total).step_by(chunk as usize).map(move |start| (start, chunk.min(total - start)))
}

/// Log-probabilities `[N]` (f32, 0 where `mask` is) of `ids` `[N]` under
/// `log_softmax(logits(hidden) / temperature)`, `hidden` `[N, H]`.
fn position_logprobs(
    model: &Llama,
    hidden: &Tensor,
    ids: &Tensor,
    mask: &Tensor,
    temperature: f64,
) -> Tensor {
    let logits = model.logits(hidden).to_kind(Kind::Float);
    let logits = if temperature > 0.0 && temperature != 1.0 { logits / temperature } else { logits };
    // log_softmax(x)[t] = x[t] - logsumexp(x): no [N, V] log-softmax tensor is kept.
    let picked = logits.gather(1, &ids.unsqueeze(-1), false).squeeze_dim(-1);
    (picked - logits.logsumexp([-1], false)) * mask
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
    let prompt_hidden = model.forward_with(
        &batch.prompt_ids,
        &positions_from_mask(&batch.prompt_mask),
        &batch.prompt_mask,
        Padding::from_bool(batch.prompts_padded),
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
    // Inputs: every completion token but the last (it predicts nothing we score): row r feeds
    // its first len − 1 tokens, and the rest of its width is padding, which only the attention
    // of this pass sees (RealPositions): the update's cost follows the tokens trained.
    let inputs = batch.completion_ids.narrow(1, 0, c - 1);
    let fed: Vec<usize> = batch.completion_lens.iter().map(|len| len.saturating_sub(1)).collect();
    let fed_mask: Vec<i64> =
        fed.iter().flat_map(|&fed| (0..c - 1).map(move |j| i64::from((j as usize) < fed))).collect();
    let comp_mask = Tensor::from_slice(&fed_mask).view([b, c - 1]).to_device(device);
    let mask = Tensor::cat(&[&prompt_mask, &comp_mask], 1);
    let positions = prompt_lens.unsqueeze(1) + Tensor::arange(c - 1, (Kind::Int64, device)).unsqueeze(0);
    let real = RealPositions::of_lengths(&fed, c - 1, device);
    let padding = Padding::from_bool(batch.prompts_padded || real.len() < b * (c - 1));
    let hidden =
        real.scatter(&model.forward_real(&inputs, &positions, (&mask, padding), &real, Some(&mut cache)));
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_chunk_holds_64_mib_of_f32_logits() {
        let check =
            |vocab: i64, positions: i64| assert_eq!(default_logits_chunk(vocab), positions, "V={vocab}");
        check(151_936, 110); // Qwen2.5
        check(49_152, 341); // SmolLM2
        check(101, 166_111); // builtin:tiny-arith
        check(1 << 25, 1); // never none
    }

    #[test]
    fn chunks_cover_every_position_once_in_order() {
        let check = |total: i64, chunk: i64, expected: &[(i64, i64)]| {
            assert_eq!(chunks(total, chunk).collect::<Vec<_>>(), expected, "{total} by {chunk}");
        };
        check(0, 3, &[]);
        check(7, 3, &[(0, 3), (3, 3), (6, 1)]);
        check(6, 3, &[(0, 3), (3, 3)]);
        check(2, 110, &[(0, 2)]);
    }
}
