//! Logits in chunks: log-probabilities computed a few positions at a time equal those of the
//! whole `[B × C × V]` logits, and a training pass — log-probabilities from a leaf of the hidden
//! states, each chunk's logits recomputed in the backward pass, one backward pass through the
//! model — gives the gradients of plain autograd over the whole logits: for a full model (tied
//! and untied `lm_head`), LoRA adapters with dropout, with and without activation checkpointing,
//! with temperature, with a value head on the hidden states, and with chunks that end inside a
//! row and go on into the next.

use crate::common;

use std::path::Path;

use rlvr_model::model::{Padding, RealPositions};
use rlvr_model::{
    KvCache, Llama, LoadedModel, LoraConfig, LoraTarget, SequenceBatch, completion_logprobs, load,
    positions_from_mask, training_logprobs,
};
use tch::nn::{Linear, Module, VarStore};
use tch::{Device, Kind, Tensor};

/// Rows sharing a prompt, prompts of two lengths (left padding), completions of several
/// lengths (right padding) and one empty: C = 7, 35 positions.
fn pairs() -> Vec<(Vec<i64>, Vec<i64>)> {
    vec![
        (vec![1, 20, 23, 21], vec![30, 22, 31, 24, 2]),
        (vec![1, 20, 23, 21], vec![33, 2]),
        (vec![1, 40, 41], vec![50, 51, 52, 53, 54, 55, 2]),
        (vec![1, 40, 41], vec![]),
        (vec![1, 60, 61, 62], vec![70]),
    ]
}

/// One chunk for the whole batch: the logits of every position at once.
const WHOLE: i64 = 1 << 20;

/// Chunk sizes checked against [`WHOLE`]: one position, chunks that end inside a row (3 of a
/// row of 7), and chunks longer than a row (9, the last one shorter).
const CHUNKS: [i64; 3] = [1, 3, 9];

/// The log-probabilities as `completion_logprobs` computed them before chunks, from the whole
/// logits of `hidden` `[B, C, H]` at once: those of the real positions, as the library's pass
/// computes no logits for padding (a matmul over other rows would round otherwise).
fn whole_logprobs(model: &Llama, hidden: &Tensor, batch: &SequenceBatch, temperature: f64) -> Tensor {
    let real = RealPositions::of_lengths(batch.completion_lens(), batch.completion_width(), Device::Cpu);
    let logits = model.logits(&real.gather(hidden)).to_kind(Kind::Float);
    let logits = if temperature > 0.0 && temperature != 1.0 { logits / temperature } else { logits };
    let ids = real.gather(&batch.completion_ids().unsqueeze(-1));
    let picked = logits.gather(1, &ids, false).squeeze_dim(-1);
    let logprobs = picked - logits.logsumexp([-1], false);
    real.scatter(&logprobs.unsqueeze(-1)).squeeze_dim(-1) * batch.mask()
}

/// Largest |a - b| over the largest |a| (at least 1e-3).
fn relative(a: &Tensor, b: &Tensor) -> f64 {
    let scale = a.abs().max().double_value(&[]).max(1e-3);
    common::max_abs_diff(a, b) / scale
}

#[test]
fn log_probabilities_in_chunks_equal_the_whole_logits() {
    let check = |source: &str, kind: Kind, temperature: f64, tolerance: f64| {
        let model = load(source, Device::Cpu, kind).unwrap();
        let batch = SequenceBatch::new(&pairs(), 0, Device::Cpu).unwrap();
        model.model.set_logits_chunk(WHOLE);
        let (whole, hidden) = completion_logprobs(&model.model, &batch, temperature);
        let reference = tch::no_grad(|| whole_logprobs(&model.model, &hidden, &batch, temperature));
        assert!(!whole.requires_grad() && !hidden.requires_grad(), "no graph in a no-grad pass");
        assert_eq!(whole.size(), [5, 7]);
        assert_eq!(relative(&reference, &whole), 0.0, "{source} {kind:?} T={temperature}: one chunk");
        let mut worst = 0f64;
        for chunk in CHUNKS {
            model.model.set_logits_chunk(chunk);
            let (chunked, chunked_hidden) = completion_logprobs(&model.model, &batch, temperature);
            assert!(chunked_hidden.equal(&hidden));
            assert_eq!(
                Vec::<f32>::try_from(chunked.get(3)).unwrap(),
                vec![0.0; 7],
                "the empty row is masked"
            );
            worst = worst.max(relative(&reference, &chunked));
        }
        println!(
            "{source} {kind:?} T={temperature}: chunked log-probabilities differ by {worst:.2e} (relative)"
        );
        assert!(worst <= tolerance, "{source} {kind:?} T={temperature}: {worst:e}");
    };
    check("builtin:tiny-arith?seed=4", Kind::Float, 1.0, 1e-6);
    check("builtin:tiny-arith?seed=4", Kind::Float, 0.7, 1e-6);
    check("builtin:tiny-arith?seed=5", Kind::BFloat16, 0.7, 1e-6);
}

/// A model whose gradients are compared, with what trains.
struct Subject {
    model: Llama,
    trainable: Vec<(String, Tensor)>,
    /// Tensors that must get no gradient (a LoRA job's base).
    frozen: Vec<(String, Tensor)>,
    _stores: Vec<VarStore>,
}

fn full(seed: u64) -> Subject {
    let LoadedModel { vs, model, .. } =
        load(&format!("builtin:tiny-arith?seed={seed}"), Device::Cpu, Kind::Float).unwrap();
    Subject { model, trainable: sorted(vs.variables()), frozen: Vec::new(), _stores: vec![vs] }
}

/// The built-in architecture with its own `lm_head` and a larger vocabulary (1000), random
/// weights.
fn untied() -> Subject {
    let mut config = rlvr_model::builtin::config(0);
    config.tie_word_embeddings = Some(false);
    config.vocab_size = 1000;
    let spec = config.spec(Path::new("config.json")).unwrap();
    let vs = VarStore::new(Device::Cpu);
    tch::manual_seed(21);
    let model = Llama::build(&vs, &spec, Kind::Float, |name, shape| {
        Ok(if name.ends_with("norm.weight") {
            Tensor::ones(shape, (Kind::Float, Device::Cpu))
        } else {
            Tensor::randn(shape, (Kind::Float, Device::Cpu)) * 0.05
        })
    })
    .unwrap();
    Subject { model, trainable: sorted(vs.variables()), frozen: Vec::new(), _stores: vec![vs] }
}

/// LoRA on every layer, and on the unembedding when `unembed` (whose adapter the chunked backward
/// recomputes with the logits).
fn lora(dropout: f64, unembed: bool) -> Subject {
    let mut loaded = load("builtin:tiny-arith?seed=4", Device::Cpu, Kind::Float).unwrap();
    let config =
        LoraConfig { rank: 4, alpha: 8.0, dropout, target_modules: LoraTarget::ALL.to_vec(), unembed };
    loaded.attach_lora(&config, 9).unwrap();
    // B away from zero, so that A's gradient is not zero either.
    tch::manual_seed(3);
    let trainable = sorted(loaded.trainable());
    for (name, t) in &trainable {
        if name.ends_with("lora_B.weight") {
            let mut t = t.shallow_clone();
            tch::no_grad(|| t.copy_(&(Tensor::randn(t.size(), (Kind::Float, Device::Cpu)) * 0.05)));
        }
    }
    let LoadedModel { vs, model, adapters, .. } = loaded;
    let adapters = adapters.unwrap();
    Subject { model, trainable, frozen: sorted(vs.variables()), _stores: vec![vs, adapters.vs] }
}

fn sorted(tensors: impl IntoIterator<Item = (String, Tensor)>) -> Vec<(String, Tensor)> {
    let mut tensors: Vec<_> = tensors.into_iter().collect();
    tensors.sort_by(|a, b| a.0.cmp(&b.0));
    tensors
}

/// A PPO-like value head on the hidden states.
fn value_head(model: &Llama) -> (VarStore, Linear) {
    let vs = VarStore::new(Device::Cpu);
    tch::manual_seed(5);
    let head = tch::nn::linear(vs.root() / "v", model.hidden_size(), 1, Default::default());
    (vs, head)
}

/// How a training pass runs, and the value head its loss reads, if any.
struct Case<'a> {
    checkpointing: bool,
    temperature: f64,
    head: Option<&'a (VarStore, Linear)>,
}

/// A loss on the log-probabilities (weighted per token, so each position's gradient differs) and,
/// with a head, the values' squared error to fixed returns.
fn loss(logprobs: &Tensor, hidden: &Tensor, head: Option<&Linear>, batch: &SequenceBatch) -> Tensor {
    let weights =
        Tensor::linspace(-1.0, 2.0, logprobs.numel() as i64, (Kind::Float, Device::Cpu)).view_as(logprobs);
    let mut loss = (logprobs * weights * batch.mask()).sum(Kind::Float);
    if let Some(head) = head {
        let values = head.forward(&hidden.to_kind(Kind::Float)).squeeze_dim(-1);
        let returns =
            Tensor::linspace(0.5, -0.5, values.numel() as i64, (Kind::Float, Device::Cpu)).view_as(&values);
        loss += ((values - returns).square() * batch.mask()).sum(Kind::Float);
    }
    loss
}

/// Log-probabilities and every trainable tensor's gradient (the head's last) of a training pass
/// with `chunk` positions per chunk.
fn chunked(subject: &Subject, case: &Case<'_>, chunk: i64) -> Vec<(String, Tensor)> {
    let head = case.head;
    let batch = SequenceBatch::new(&pairs(), 0, Device::Cpu).unwrap();
    zero_grads(subject, head);
    let model = &subject.model;
    model.set_logits_chunk(chunk);
    model.set_activation_checkpointing(case.checkpointing);
    model.set_training(Some(17));
    let pass = training_logprobs(model, &batch, case.temperature);
    model.set_training(None);
    assert!(pass.logprobs().is_leaf() && pass.logprobs().requires_grad());
    assert!(pass.hidden().is_leaf() && pass.hidden().requires_grad());
    let loss = loss(pass.logprobs(), pass.hidden(), head.map(|(_, h)| h), &batch);
    let logprobs = pass.logprobs().detach().copy();
    loss.backward();
    pass.backward();
    collect(subject, head, logprobs)
}

/// The same with plain autograd over the whole logits, from the passes the library runs: without
/// checkpointing, each distinct prompt once and the completions from its cache expanded to its
/// rows; with it, one pass over each row's prompt and completion (not checkpointed here). The
/// same shapes and seed, so the same dropout masks.
fn plain(subject: &Subject, case: &Case<'_>) -> Vec<(String, Tensor)> {
    let head = case.head;
    let batch = SequenceBatch::new(&pairs(), 0, Device::Cpu).unwrap();
    zero_grads(subject, head);
    let model = &subject.model;
    model.set_activation_checkpointing(false);
    model.set_training(Some(17));
    let hidden =
        if case.checkpointing { whole_rows_hidden(model, &batch) } else { cached_hidden(model, &batch) };
    model.set_training(None);
    let logprobs = whole_logprobs(model, &hidden, &batch, case.temperature);
    loss(&logprobs, &hidden, head.map(|(_, h)| h), &batch).backward();
    collect(subject, head, logprobs.detach())
}

/// [`pairs`]' distinct prompts, left-padded (ids, mask), and each row's prompt.
fn distinct_prompts() -> (Tensor, Tensor, Tensor) {
    let prompts: [&[i64]; 3] = [&[1, 20, 23, 21], &[1, 40, 41], &[1, 60, 61, 62]];
    let (mut ids, mut mask) = (Vec::new(), Vec::new());
    for p in prompts {
        let pad = 4 - p.len();
        ids.extend(std::iter::repeat_n(0, pad).chain(p.iter().copied()));
        mask.extend(std::iter::repeat_n(0i64, pad).chain(std::iter::repeat_n(1, p.len())));
    }
    let rows = Tensor::from_slice(&[0i64, 0, 1, 1, 2]);
    (Tensor::from_slice(&ids).view([3, 4]), Tensor::from_slice(&mask).view([3, 4]), rows)
}

fn cached_hidden(model: &Llama, batch: &SequenceBatch) -> Tensor {
    let (ids, mask, rows) = distinct_prompts();
    let c = batch.completion_width();
    let mut cache = KvCache::new();
    let prompt_hidden = model.forward(&ids, &positions_from_mask(&mask), &mask, Some(&mut cache));
    let last = prompt_hidden.select(1, 3).index_select(0, &rows).unsqueeze(1);
    let mut cache = cache.index_select(&rows);
    let prompt_mask = mask.index_select(0, &rows);
    let lens = prompt_mask.sum_dim_intlist(1, false, Kind::Int64);
    let mask = Tensor::cat(&[prompt_mask, batch.mask().narrow(1, 0, c - 1).to_kind(Kind::Int64)], 1);
    let positions = lens.unsqueeze(1) + Tensor::arange(c - 1, (Kind::Int64, Device::Cpu)).unsqueeze(0);
    let inputs = batch.completion_ids().narrow(1, 0, c - 1);
    // The completions' real positions only, as the library's pass computes them (the padded
    // layout rounds the projections' matmuls otherwise: tests/unpadded.rs).
    let fed: Vec<usize> = batch.completion_lens().iter().map(|len| len.saturating_sub(1)).collect();
    let real = RealPositions::of_lengths(&fed, c - 1, Device::Cpu);
    let hidden = model.forward_real(&inputs, &positions, (&mask, Padding::Present), &real, Some(&mut cache));
    Tensor::cat(&[last, real.scatter(&hidden)], 1)
}

fn whole_rows_hidden(model: &Llama, batch: &SequenceBatch) -> Tensor {
    let (ids, mask, rows) = distinct_prompts();
    let c = batch.completion_width();
    let ids = Tensor::cat(&[ids.index_select(0, &rows), batch.completion_ids().narrow(1, 0, c - 1)], 1);
    let completion_mask = batch.mask().narrow(1, 0, c - 1).to_kind(Kind::Int64);
    let mask = Tensor::cat(&[mask.index_select(0, &rows), completion_mask], 1);
    model.forward(&ids, &positions_from_mask(&mask), &mask, None).narrow(1, 3, c)
}

fn zero_grads(subject: &Subject, head: Option<&(VarStore, Linear)>) {
    let head_vars = head.map(|(vs, _)| vs.trainable_variables()).unwrap_or_default();
    for t in subject.trainable.iter().map(|(_, t)| t).chain(&head_vars) {
        let mut grad = t.grad();
        if grad.defined() {
            let _ = grad.zero_();
        }
    }
}

fn collect(subject: &Subject, head: Option<&(VarStore, Linear)>, logprobs: Tensor) -> Vec<(String, Tensor)> {
    for (name, t) in &subject.frozen {
        assert!(!t.grad().defined(), "{name} is frozen but got a gradient");
    }
    let mut out = vec![("logprobs".to_owned(), logprobs)];
    out.extend(subject.trainable.iter().map(|(name, t)| (name.clone(), t.grad().copy())));
    if let Some((vs, _)) = head {
        out.extend(
            sorted(vs.variables()).into_iter().map(|(name, t)| (format!("head.{name}"), t.grad().copy())),
        );
    }
    out
}

/// The largest relative difference between two sets of gradients, each tensor against its own
/// largest value; every gradient must be there and, but for the empty head, not all zero.
fn worst(a: &[(String, Tensor)], b: &[(String, Tensor)], what: &str) -> f64 {
    assert_eq!(a.len(), b.len());
    let mut worst = 0f64;
    for ((name, x), (other, y)) in a.iter().zip(b) {
        assert_eq!(name, other);
        assert!(x.defined() && y.defined(), "{what}: {name} has no gradient");
        assert!(x.abs().max().double_value(&[]) > 0.0, "{what}: {name} is all zero");
        worst = worst.max(relative(x, y));
    }
    worst
}

#[test]
fn training_gradients_in_chunks_equal_plain_autograd_over_the_whole_logits() {
    let subjects = [
        ("full model", full(4)),
        ("untied lm_head, V=1000", untied()),
        ("LoRA, dropout 0.1", lora(0.1, false)),
        ("LoRA with the unembedding, dropout 0.1", lora(0.1, true)),
    ];
    let mut figures = Vec::new();
    for (name, subject) in subjects {
        let head = value_head(&subject.model);
        for checkpointing in [false, true] {
            for temperature in [1.0, 0.7] {
                for value_head in [false, true] {
                    let case = Case { checkpointing, temperature, head: value_head.then_some(&head) };
                    let what = format!(
                        "{name}, checkpointing {checkpointing}, T={temperature}, value head {value_head}"
                    );
                    let whole = chunked(&subject, &case, WHOLE);
                    let mut chunks = 0f64;
                    for chunk in CHUNKS {
                        chunks = chunks.max(worst(&whole, &chunked(&subject, &case, chunk), &what));
                    }
                    let plain = worst(&plain(&subject, &case), &whole, &what);
                    println!(
                        "{what}: chunks vs one chunk {chunks:.2e}, one chunk vs plain autograd {plain:.2e}"
                    );
                    figures.push((what, chunks, plain));
                }
            }
        }
    }
    // One chunk is plain autograd's computation: the same bits. Chunks round the lm_head's
    // matmuls differently (fewer rows each, the weight's gradient summed chunk by chunk), about
    // 1e-7 in the hidden states' gradient, which the layers below amplify to about 1e-6. With an
    // unembedding adapter and a value head, the hidden states' gradient sums three matmuls'
    // (the head's, the adapter's, the value head's), which the recomputing pass adds in another
    // order than autograd: up to 1.1e-6 measured, one chunk or many (0 without the value head).
    for (what, chunks, plain) in figures {
        assert!(chunks <= 2e-6, "{what}: chunks vs one chunk {chunks:e}");
        if what.contains("unembedding") {
            assert!(plain <= 2e-6, "{what}: one chunk vs plain autograd {plain:e}");
        } else {
            assert!(plain == 0.0, "{what}: one chunk vs plain autograd {plain:e}");
        }
    }
}

#[test]
#[should_panic(expected = "TrainingLogprobs::backward never ran")]
fn a_training_pass_back_propagated_but_never_finished_panics() {
    let model = load("builtin:tiny-arith?seed=4", Device::Cpu, Kind::Float).unwrap();
    let batch = SequenceBatch::new(&pairs(), 0, Device::Cpu).unwrap();
    let pass = training_logprobs(&model.model, &batch, 1.0);
    pass.logprobs().sum(Kind::Float).backward();
    drop(pass);
}
