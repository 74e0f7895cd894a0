//! The built-in random models at published shapes: each builds with the parameter count its
//! config implies, its tokenizer covers its vocabulary, and a saved one is a Hugging Face
//! directory transformers computes the same logits from. A test that computes may take fewer
//! layers (`layers=1`), never other widths: the embeddings, the widest tensors, are whole.

use std::path::Path;

use rlvr_model::Llama;
use rlvr_model::builtin::{self, BuiltinSource};
use rlvr_model::policy::{load, save_pretrained};
use rlvr_protocol::builtin_models::models;
use rlvr_protocol::memory::ModelShape;
use serde_json::json;
use tch::nn::VarStore;
use tch::{Device, Kind, Tensor};

use crate::common;

/// Every built-in model, at its full depth, builds the parameters its publisher counts: the
/// model code (`Llama::build` from the built-in `config.json`, which is also the shape the
/// memory estimate reads) over tensors left unwritten (`empty`: no page is touched, so the 8B
/// shape costs nothing here; the worker's test trains each one at one layer on real weights).
/// The smallest model of each vocabulary size loads, and its tokenizer decodes every id.
#[test]
fn each_random_model_builds_the_parameter_count_its_config_implies_and_decodes_every_id() {
    let mut vocabularies = std::collections::BTreeMap::new();
    for model in models() {
        let source = BuiltinSource::parse(&format!("builtin:{}", model.name)).unwrap();
        let config = builtin::source_config(&source);
        assert_eq!(ModelShape::from_config_json(&config.to_json()), Ok(source.shape()), "{}", model.name);
        let spec = config.spec(Path::new(model.name)).unwrap();
        let vs = VarStore::new(Device::Cpu);
        Llama::build(&vs, &spec, Kind::BFloat16, |_, shape| {
            Ok(Tensor::empty(shape, (Kind::BFloat16, Device::Cpu)))
        })
        .unwrap();
        let held: u64 = vs.variables().values().map(|tensor| tensor.numel() as u64).sum();
        assert_eq!(held, source.shape().parameters(), "{}", model.name);
        let smallest = vocabularies.entry(model.shape.vocab).or_insert(model);
        if model.shape.parameters() < smallest.shape.parameters() {
            *smallest = model;
        }
    }
    for (vocab, model) in vocabularies {
        let source = format!("builtin:{}?seed=1&layers=1", model.name);
        let loaded = load(&source, Device::Cpu, Kind::BFloat16).unwrap();
        assert!(loaded.vs.variables().values().all(|tensor| tensor.kind() == Kind::BFloat16), "{source}");
        assert_eq!(loaded.source, source);
        assert_eq!(loaded.model.vocab_size() as u64, vocab, "{source}");
        let last = vocab as i64 - 1;
        let decoded = loaded.tokenizer.decode(&[5, last]);
        let expected = if model.name == "tiny-arith" { "\n~".to_owned() } else { format!("\n<|r{last}|>") };
        assert_eq!(decoded, expected, "{source}");
        assert_eq!(loaded.tokenizer.encode("7+8=").unwrap().len(), 4, "{source}");
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
