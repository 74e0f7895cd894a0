//! Activation checkpointing: a training pass that keeps only each layer's input, then the
//! recomputing backward sweep, gives the gradients of the plain pass — for every weight of a full
//! model, and for LoRA adapters with dropout (the recomputed layers draw the same masks).

use crate::common;

use rlvr_model::{LoadedModel, LoraConfig, LoraTarget, SequenceBatch, load, training_logprobs};
use tch::{Device, Kind, Tensor};

/// The gradients of `model`'s trainable tensors of Σ completion log-probabilities over a batch of
/// three rows (two sharing a prompt, so the plain pass shares its KV cache), or with `whole`, of
/// a weighted sum of the logits of one pass over whole rows (the same shapes in both passes, so
/// the same dropout masks).
fn gradients(model: &LoadedModel, checkpointing: bool, whole: bool) -> Vec<(String, Tensor)> {
    let pairs: Vec<(Vec<i64>, Vec<i64>)> = vec![
        (vec![1, 20, 23, 21], vec![30, 22, 31, 24, 2]),
        (vec![1, 20, 23, 21], vec![33, 2]),
        (vec![1, 40, 41], vec![50, 51, 52, 53, 54, 55, 2]),
    ];
    let batch = SequenceBatch::new(&pairs, 0, Device::Cpu).unwrap();
    let trainable = model.trainable();
    for (_, t) in &trainable {
        let mut grad = t.grad();
        if grad.defined() {
            let _ = grad.zero_();
        }
    }
    model.model.set_activation_checkpointing(checkpointing);
    model.model.set_training(Some(17));
    let mut pass = None;
    let loss = if whole {
        let ids = Tensor::from_slice(&[1i64, 20, 23, 21, 30, 22, 31, 24, 1, 40, 41, 50, 51, 52, 53, 54])
            .view([2, 8]);
        let mask = Tensor::ones([2, 8], (Kind::Int64, Device::Cpu));
        let hidden = model.model.forward(&ids, &rlvr_model::positions_from_mask(&mask), &mask, None);
        let weights = Tensor::linspace(-1.0, 1.0, model.model.vocab_size(), (Kind::Float, Device::Cpu));
        (model.model.logits(&hidden) * weights).sum(Kind::Float)
    } else {
        pass.insert(training_logprobs(&model.model, &batch, 1.0)).logprobs().sum(Kind::Float)
    };
    model.model.set_training(None);
    loss.backward();
    match pass {
        Some(pass) => pass.backward(),
        None => model.model.backward_checkpointed(),
    }
    let mut grads: Vec<(String, Tensor)> = trainable.into_iter().map(|(n, t)| (n, t.grad().copy())).collect();
    grads.sort_by(|a, b| a.0.cmp(&b.0));
    grads
}

fn sorted(mut tensors: Vec<(String, Tensor)>) -> Vec<(String, Tensor)> {
    tensors.sort_by(|a, b| a.0.cmp(&b.0));
    tensors
}

fn assert_equal(plain: &[(String, Tensor)], checkpointed: &[(String, Tensor)], what: &str) {
    assert_eq!(plain.len(), checkpointed.len());
    let mut worst = 0f64;
    for ((name, a), (_, b)) in plain.iter().zip(checkpointed) {
        assert!(a.defined() && b.defined(), "{what}: {name} has no gradient");
        let scale = a.abs().max().double_value(&[]).max(1e-3);
        worst = worst.max(common::max_abs_diff(a, b) / scale);
    }
    println!("{what}: gradients with and without checkpointing differ by at most {worst:.2e} (relative)");
    assert!(worst <= 1e-5, "{what}: {worst:e}");
}

#[test]
fn checkpointed_gradients_equal_the_plain_ones_for_a_full_model_and_for_lora_with_dropout() {
    let model = load("builtin:tiny-arith?seed=4", Device::Cpu, Kind::Float).unwrap();
    let plain = gradients(&model, false, false);
    assert_equal(&plain, &gradients(&model, true, false), "full model");
    assert!(plain.iter().any(|(name, _)| name == "model.embed_tokens.weight"), "the embeddings train too");

    let mut lora = load("builtin:tiny-arith?seed=4", Device::Cpu, Kind::Float).unwrap();
    let config = LoraConfig {
        rank: 4,
        alpha: 8.0,
        dropout: 0.3,
        target_modules: LoraTarget::ALL.to_vec(),
        unembed: false,
    };
    lora.attach_lora(&config, 9).unwrap();
    // B away from zero, so that A's gradient is not zero either.
    tch::manual_seed(3);
    for (name, mut t) in sorted(lora.trainable()) {
        if name.ends_with("lora_B.weight") {
            tch::no_grad(|| t.copy_(&(Tensor::randn(t.size(), (Kind::Float, Device::Cpu)) * 0.05)));
        }
    }
    let plain = gradients(&lora, false, true);
    assert_equal(&plain, &gradients(&lora, true, true), "LoRA, dropout 0.3");
    // The masks are the seed's: the same seed gives the same gradients, and dropout changes them.
    assert!(plain.iter().zip(&gradients(&lora, false, true)).all(|((_, a), (_, b))| a.equal(b)));
    let mut no_dropout = load("builtin:tiny-arith?seed=4", Device::Cpu, Kind::Float).unwrap();
    no_dropout.attach_lora(&LoraConfig { dropout: 0.0, ..config }, 9).unwrap();
    for ((_, mut t), (_, source)) in sorted(no_dropout.trainable()).into_iter().zip(sorted(lora.trainable()))
    {
        tch::no_grad(|| t.copy_(&source));
    }
    let undropped = gradients(&no_dropout, false, true);
    assert!(plain.iter().zip(&undropped).any(|((_, a), (_, b))| common::max_abs_diff(a, b) > 1e-4));
}
