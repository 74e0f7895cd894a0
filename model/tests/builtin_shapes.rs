//! The built-in random models at published shapes: each loads with the parameter count its
//! config implies, and a saved one is a Hugging Face directory transformers computes the same
//! logits from. A test may take fewer layers (`layers=1`), never other widths: the embeddings,
//! the widest tensors, are whole.

use rlvr_model::builtin::BuiltinSource;
use rlvr_model::policy::{load, save_pretrained};
use rlvr_protocol::builtin_models::models;
use rlvr_protocol::memory::ModelShape;
use serde_json::json;
use tch::{Device, Kind};

use crate::common;

/// Every random model at one layer, in bf16 (the 8B shape's embeddings and head alone are a
/// billion parameters): its tensors hold the parameters the shape counts, its `config.json`
/// is the shape the memory estimate reads, and a step of its sampler yields ids its tokenizer
/// decodes.
#[test]
fn each_random_model_loads_with_the_parameter_count_its_config_implies() {
    for model in models().into_iter().filter(|model| model.shape_of.is_some()) {
        let source = format!("builtin:{}?seed=1&layers=1", model.name);
        let parsed = BuiltinSource::parse(&source).unwrap();
        let loaded = load(&source, Device::Cpu, Kind::BFloat16).unwrap();
        let held: i64 = loaded.vs.variables().values().map(|tensor| tensor.numel() as i64).sum();
        assert_eq!(held as u64, parsed.shape().parameters(), "{source}");
        assert!(loaded.vs.variables().values().all(|tensor| tensor.kind() == Kind::BFloat16), "{source}");
        assert_eq!(ModelShape::from_config_json(&loaded.config.to_json()), Ok(parsed.shape()), "{source}");
        assert_eq!(loaded.source, source, "{source}");
        assert_eq!(loaded.model.vocab_size() as u64, model.shape.vocab, "{source}");
        // Every id decodes: the tokenizer covers the vocabulary the model samples from.
        let last = model.shape.vocab as i64 - 1;
        assert_eq!(loaded.tokenizer.decode(&[5, last]), format!("\n<|r{last}|>"), "{source}");
        assert_eq!(loaded.tokenizer.encode("7+8=").unwrap().len(), 4, "{source}");
        drop(loaded);
    }
}

/// The same seed gives the same weights; another seed, others.
#[test]
fn a_random_models_weights_are_a_function_of_its_seed() {
    let weights = |source: &str| {
        let model = load(source, Device::Cpu, Kind::Float).unwrap();
        model.vs.variables()["model.layers.0.mlp.down_proj.weight"].shallow_clone()
    };
    let a = weights("builtin:random-qwen2.5-0.5b?seed=4&layers=1");
    let b = weights("builtin:random-qwen2.5-0.5b?layers=1&seed=4");
    let c = weights("builtin:random-qwen2.5-0.5b?seed=5&layers=1");
    assert!(a.equal(&b));
    assert!(!a.equal(&c));
    let std = a.std(true).double_value(&[]);
    assert!((std - 0.02).abs() < 1e-3, "std {std}");
}

/// Saved (as `rlvr-worker export-model` saves one), a Qwen2 shape (q/k/v biases) and a Llama 3
/// shape (RoPE frequencies scaled by `llama3`) load in transformers with the same logits.
#[test]
fn an_exported_random_model_loads_in_transformers_with_the_same_logits() {
    let tmp = tempfile::tempdir().unwrap();
    for name in ["random-qwen2.5-0.5b", "random-llama-3.2-1b"] {
        let source = format!("builtin:{name}?seed=2&layers=1");
        let model = load(&source, Device::Cpu, Kind::Float).unwrap();
        let dir = tmp.path().join(name);
        save_pretrained(&model, &dir).unwrap();
        let vocab = model.model.vocab_size();
        let ids: Vec<Vec<i64>> = vec![(0..12).map(|i| (i * 7919 + 13) % vocab).collect()];
        let ours = common::our_logits(&model.model, &ids);
        let reference = common::hf_reference(&["logits", dir.to_str().unwrap(), &json!(ids).to_string()]);
        let theirs = common::flat_tensor(&reference["logits"]);
        let diff = common::max_abs_diff(&ours, &theirs);
        let scale = theirs.abs().max().double_value(&[]);
        println!("{name}: max abs diff {diff:.3e} (logits up to {scale:.2})");
        assert!(diff <= 1e-4 * scale.max(1.0), "{name}: {diff}");
        // Loaded back by us, it is the same model.
        let back = load(dir.to_str().unwrap(), Device::Cpu, Kind::Float).unwrap();
        assert_eq!(common::max_abs_diff(&ours, &common::our_logits(&back.model, &ids)), 0.0, "{name}");
    }
}
