//! Loading and saving: the built-in model's determinism, checkpoints that load back (here and
//! in transformers), sharded weights, Qwen2 / RoPE-scaling / Mistral layouts against
//! transformers, bf16, and errors that name the file.

use crate::common;

use std::path::Path;

use rlvr_model::weights::write_safetensors;
use rlvr_model::{ModelError, load, save_pretrained};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use tch::{Device, Kind, Tensor};

fn weights_hash(m: &rlvr_model::LoadedModel) -> String {
    let mut vars: Vec<(String, Tensor)> = m.vs.variables().into_iter().collect();
    vars.sort_by(|a, b| a.0.cmp(&b.0));
    let mut h = Sha256::new();
    for (name, t) in vars {
        let t = t.to_kind(Kind::Float).contiguous();
        let mut bytes = vec![0u8; t.numel() * 4];
        t.copy_data_u8(&mut bytes, t.numel());
        h.update(name.as_bytes());
        h.update(&bytes);
    }
    hex::encode(h.finalize())
}

fn ids(text: &str, m: &rlvr_model::LoadedModel) -> Vec<i64> {
    m.tokenizer.encode(text).unwrap()
}

#[test]
fn builtin_is_deterministic_and_sized() {
    let a = load("builtin:tiny-arith", Device::Cpu, Kind::Float).unwrap();
    let b = load("builtin:tiny-arith?seed=0", Device::Cpu, Kind::Float).unwrap();
    let c = load("builtin:tiny-arith?seed=1", Device::Cpu, Kind::Float).unwrap();
    assert_eq!(weights_hash(&a), weights_hash(&b));
    assert_ne!(weights_hash(&a), weights_hash(&c));
    // Pinned: the built-in weights are the same bits on every machine and every run; a change
    // here changes every demo and test that starts from them.
    assert_eq!(weights_hash(&a), "620a783d8d0a962563c7b12f9e629c2b3bc5f1f453f3550f7acaa5fd692272a1");
    println!("builtin:tiny-arith: {} parameters, vocab {}", a.num_parameters(), a.tokenizer.vocab_size());
    assert_eq!(a.tokenizer.vocab_size(), 101);
    assert_eq!(a.tokenizer.eos_ids(), &[2]);
    assert_eq!(a.tokenizer.pad_id(), 0);
    assert!(!a.tokenizer.has_chat_template());
    assert_eq!(a.tokenizer.render_prompt("12+7=").unwrap(), "12+7=");
    let enc = a.tokenizer.encode("12+7=\t\né").unwrap();
    assert_eq!(enc.len(), 8);
    assert_eq!(enc[7], 3, "a character outside printable ASCII is <|unk|>");
    assert_eq!(a.tokenizer.decode(&enc[..7]), "12+7=\t\n");
    assert_eq!(a.tokenizer.decode(&[1, 5, 2]), "\n", "specials are left out of text");
    assert!(matches!(
        load("builtin:tiny-arith?seed=x", Device::Cpu, Kind::Float),
        Err(ModelError::UnknownSource { .. })
    ));
    assert!(matches!(load("builtin:other", Device::Cpu, Kind::Float), Err(ModelError::UnknownSource { .. })));
}

#[test]
fn checkpoint_round_trip_gives_identical_logits() {
    let tmp = tempfile::tempdir().unwrap();
    let m = load("builtin:tiny-arith?seed=3", Device::Cpu, Kind::Float).unwrap();
    let dir = tmp.path().join("ckpt");
    save_pretrained(&m, &dir).unwrap();
    let mut files: Vec<String> =
        std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    files.sort();
    assert_eq!(files, ["config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"]);
    // Nothing else is left in the parent (the temporary directory was renamed).
    assert_eq!(std::fs::read_dir(tmp.path()).unwrap().count(), 1);
    let err = save_pretrained(&m, &dir).unwrap_err();
    assert!(matches!(err, ModelError::AlreadyExists { .. }), "{err}");

    let back = load(dir.to_str().unwrap(), Device::Cpu, Kind::Float).unwrap();
    assert_eq!(weights_hash(&m), weights_hash(&back));
    assert_eq!(back.config, m.config);
    let x = vec![ids("12+30=42\n7*6=", &m)];
    let (a, b) = (common::our_logits(&m.model, &x), common::our_logits(&back.model, &x));
    assert_eq!(common::max_abs_diff(&a, &b), 0.0);
    // Tied embeddings: no lm_head tensor in the file, as transformers writes it.
    let header = safetensors_names(&dir.join("model.safetensors"));
    assert!(!header.contains(&"lm_head.weight".to_string()));
    assert!(header.contains(&"model.layers.3.self_attn.q_proj.weight".to_string()));

    // transformers loads the checkpoint and computes the same logits.
    let reference = common::hf_reference(&["logits", dir.to_str().unwrap(), &json!(x).to_string()]);
    let diff = common::max_abs_diff(&a, &common::flat_tensor(&reference["logits"]));
    println!("builtin checkpoint vs transformers: max abs diff {diff:.3e}");
    assert!(diff <= 1e-5, "{diff}");
    // ... and its tokenizer (AutoTokenizer over our tokenizer.json) agrees with ours.
    let texts = ["12+30=42\n", "x <|eos|> y\t~"];
    let reference = common::hf_reference(&["tokenize", dir.to_str().unwrap(), &json!(texts).to_string()]);
    for (i, text) in texts.iter().enumerate() {
        let ids = back.tokenizer.encode(text).unwrap();
        assert_eq!(json!(ids), reference["ids"][i], "{text:?}");
        assert_eq!(back.tokenizer.decode(&ids), reference["decoded"][i].as_str().unwrap());
    }
}

/// A checkpoint's config names the dtype of the weights it holds, in the keys the model's config
/// had (transformers 5's `dtype`, 4's `torch_dtype`), whatever the source said: bf16 weights of an
/// f32 source said `float32`.
#[test]
fn a_checkpoints_config_names_its_weights_dtype() {
    /// The weights' kind, the source config's dtype keys, what the checkpoint's config then has.
    type Case = (Kind, &'static [&'static str], &'static [(&'static str, &'static str)]);
    let cases: [Case; 4] = [
        (Kind::Float, &["torch_dtype"], &[("torch_dtype", "float32")]),
        (Kind::BFloat16, &["torch_dtype"], &[("torch_dtype", "bfloat16")]),
        (Kind::BFloat16, &["dtype"], &[("dtype", "bfloat16")]),
        (Kind::BFloat16, &[], &[("torch_dtype", "bfloat16")]),
    ];
    let tmp = tempfile::tempdir().unwrap();
    for (i, (kind, keys, expected)) in cases.into_iter().enumerate() {
        let mut m = load("builtin:tiny-arith?seed=2", Device::Cpu, kind).unwrap();
        m.config.extra.remove("torch_dtype");
        for key in keys {
            m.config.extra.insert(key.to_string(), json!("float32"));
        }
        let dir = tmp.path().join(format!("case-{i}"));
        save_pretrained(&m, &dir).unwrap();
        let config: Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).unwrap()).unwrap();
        for key in ["dtype", "torch_dtype"] {
            let want = expected.iter().find(|(k, _)| *k == key).map(|(_, v)| json!(v));
            assert_eq!(config.get(key), want.as_ref(), "case {i}: {key} in {config}");
        }
        let back = load(dir.to_str().unwrap(), Device::Cpu, kind).unwrap();
        assert_eq!(weights_hash(&m), weights_hash(&back), "case {i}");
    }
}

fn safetensors_names(path: &Path) -> Vec<String> {
    let bytes = std::fs::read(path).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    assert_eq!(header["__metadata__"]["format"], "pt");
    header.as_object().unwrap().keys().filter(|k| *k != "__metadata__").cloned().collect()
}

#[test]
fn sharded_weights_load_through_the_index() {
    let tmp = tempfile::tempdir().unwrap();
    let m = load("builtin:tiny-arith?seed=5", Device::Cpu, Kind::Float).unwrap();
    let dir = tmp.path().join("sharded");
    save_pretrained(&m, &dir).unwrap();
    std::fs::remove_file(dir.join("model.safetensors")).unwrap();
    let mut vars: Vec<(String, Tensor)> = m.vs.variables().into_iter().collect();
    vars.sort_by(|a, b| a.0.cmp(&b.0));
    let half = vars.len() / 2;
    let mut weight_map = serde_json::Map::new();
    for (i, shard) in [&vars[..half], &vars[half..]].into_iter().enumerate() {
        let file = format!("model-{:05}-of-00002.safetensors", i + 1);
        write_safetensors(&dir.join(&file), shard).unwrap();
        for (name, _) in shard {
            weight_map.insert(name.clone(), json!(file));
        }
    }
    let index = json!({"metadata": {"total_size": 0}, "weight_map": weight_map});
    std::fs::write(dir.join("model.safetensors.index.json"), index.to_string()).unwrap();
    let back = load(dir.to_str().unwrap(), Device::Cpu, Kind::Float).unwrap();
    assert_eq!(weights_hash(&m), weights_hash(&back));

    // An index naming a tensor its shard lacks: the error names the tensor and the shard.
    let (moved, _) = &vars[0];
    let mut bad = index.clone();
    bad["weight_map"][moved] = json!("model-00002-of-00002.safetensors");
    std::fs::write(dir.join("model.safetensors.index.json"), bad.to_string()).unwrap();
    let err = load(dir.to_str().unwrap(), Device::Cpu, Kind::Float).unwrap_err().to_string();
    assert!(
        err.starts_with(&format!("missing tensor {moved} in "))
            && err.ends_with("model-00002-of-00002.safetensors"),
        "{err}"
    );
}

#[test]
fn errors_name_the_file_and_the_key() {
    let tmp = tempfile::tempdir().unwrap();
    let m = load("builtin:tiny-arith", Device::Cpu, Kind::Float).unwrap();
    let dir = tmp.path().join("m");
    save_pretrained(&m, &dir).unwrap();
    let src = dir.to_str().unwrap();

    let missing = tmp.path().join("nope");
    let err = load(missing.to_str().unwrap(), Device::Cpu, Kind::Float).unwrap_err();
    assert_eq!(err.to_string(), format!("missing file {}", missing.display()));

    std::fs::rename(dir.join("tokenizer.json"), tmp.path().join("t.json")).unwrap();
    let err = load(src, Device::Cpu, Kind::Float).unwrap_err();
    assert_eq!(err.to_string(), format!("missing file {}", dir.join("tokenizer.json").display()));
    std::fs::rename(tmp.path().join("t.json"), dir.join("tokenizer.json")).unwrap();

    // A tensor missing from the weights, and one of the wrong shape.
    let mut vars: Vec<(String, Tensor)> = m.vs.variables().into_iter().collect();
    vars.sort_by(|a, b| a.0.cmp(&b.0));
    let weights = dir.join("model.safetensors");
    let without: Vec<_> = vars
        .iter()
        .filter(|(n, _)| n != "model.norm.weight")
        .map(|(n, t)| (n.clone(), t.shallow_clone()))
        .collect();
    std::fs::remove_file(&weights).unwrap();
    write_safetensors(&weights, &without).unwrap();
    let err = load(src, Device::Cpu, Kind::Float).unwrap_err();
    assert_eq!(err.to_string(), format!("missing tensor model.norm.weight in {}", weights.display()));
    let mut wrong = without;
    wrong.push(("model.norm.weight".into(), Tensor::ones([64], (Kind::Float, Device::Cpu))));
    std::fs::remove_file(&weights).unwrap();
    write_safetensors(&weights, &wrong).unwrap();
    let err = load(src, Device::Cpu, Kind::Float).unwrap_err();
    assert_eq!(
        err.to_string(),
        format!(
            "tensor model.norm.weight in {}: shape mismatch, expected [128], found [64]",
            weights.display()
        )
    );
    std::fs::remove_file(&weights).unwrap();
    let err = load(src, Device::Cpu, Kind::Float).unwrap_err();
    assert!(matches!(err, ModelError::NoWeights { .. }), "{err}");

    let config = dir.join("config.json");
    let mut c: Value = serde_json::from_str(&std::fs::read_to_string(&config).unwrap()).unwrap();
    c["model_type"] = json!("gemma");
    std::fs::write(&config, c.to_string()).unwrap();
    let err = load(src, Device::Cpu, Kind::Float).unwrap_err();
    assert_eq!(
        err.to_string(),
        format!("{}: unsupported model_type \"gemma\" (supported: llama, mistral, qwen2)", config.display())
    );
    c["model_type"] = json!("llama");
    c["rope_scaling"] = json!({"rope_type": "dynamic", "factor": 2.0});
    std::fs::write(&config, c.to_string()).unwrap();
    let err = load(src, Device::Cpu, Kind::Float).unwrap_err();
    assert_eq!(
        err.to_string(),
        format!(
            "{}: unsupported rope type \"dynamic\" (supported: default, linear, llama3)",
            config.display()
        )
    );

    let err = load("builtin:tiny-arith", Device::Cpu, Kind::Half).unwrap_err();
    assert!(matches!(err, ModelError::UnsupportedKind { .. }), "{err}");
}

/// A tiny random model of `kind` made and saved by transformers, loaded here: logits agree.
fn check_against_transformers(kind: &str, len: usize) {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join(kind);
    let x: Vec<Vec<i64>> =
        (0..2).map(|r| (0..len as i64).map(|i| (i * 7919 + r * 104729) % 49152).collect()).collect();
    let reference = common::hf_reference(&["tiny", kind, dir.to_str().unwrap(), &json!(x).to_string()]);
    let m = load(dir.to_str().unwrap(), Device::Cpu, Kind::Float).unwrap();
    let ours = common::our_logits(&m.model, &x);
    let theirs = common::flat_tensor(&reference["logits"]);
    let diff = common::max_abs_diff(&ours, &theirs);
    let scale = theirs.abs().max().double_value(&[]);
    println!("{kind}: max abs diff {diff:.3e} (logits up to {scale:.1})");
    assert!(diff <= 1e-4, "{kind}: {diff}");
}

#[test]
fn qwen2_with_qkv_bias_matches_transformers() {
    check_against_transformers("qwen2", 24);
}

#[test]
fn rope_scaling_matches_transformers() {
    check_against_transformers("llama-linear", 40);
    check_against_transformers("llama-llama3", 40);
}

#[test]
fn mistral_sliding_window_matches_transformers() {
    check_against_transformers("mistral", 20);
}

#[test]
fn bf16_loads_runs_and_saves_bf16() {
    let f = load("builtin:tiny-arith?seed=2", Device::Cpu, Kind::Float).unwrap();
    let b = load("builtin:tiny-arith?seed=2", Device::Cpu, Kind::BFloat16).unwrap();
    assert!(b.vs.variables().values().all(|t| t.kind() == Kind::BFloat16));
    let x = vec![ids("3+4=7", &f)];
    let diff = common::max_abs_diff(&common::our_logits(&f.model, &x), &common::our_logits(&b.model, &x));
    assert!(diff < 0.05, "bf16 vs f32 logits differ by {diff}");
    let tmp = tempfile::tempdir().unwrap();
    save_pretrained(&b, &tmp.path().join("b")).unwrap();
    let bytes = std::fs::read(tmp.path().join("b/model.safetensors")).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    assert_eq!(header["model.norm.weight"]["dtype"], "BF16");
    let back = load(tmp.path().join("b").to_str().unwrap(), Device::Cpu, Kind::BFloat16).unwrap();
    assert_eq!(weights_hash(&b), weights_hash(&back));
}

#[test]
fn duplicate_is_independent_and_frozen() {
    let m = load("builtin:tiny-arith", Device::Cpu, Kind::Float).unwrap();
    let r = m.duplicate(false).unwrap();
    assert_eq!(weights_hash(&m), weights_hash(&r));
    assert!(r.vs.trainable_variables().iter().all(|t| !t.requires_grad()));
    tch::no_grad(|| {
        let mut w = m.vs.variables()["model.norm.weight"].shallow_clone();
        let _ = w.fill_(2.0);
    });
    assert_ne!(weights_hash(&m), weights_hash(&r));
}
