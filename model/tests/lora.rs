//! LoRA adapters: what they compute with B zero and with the adapters off, their PEFT directory
//! and the merged model read back, and parity with Hugging Face PEFT (logits, adapter gradients,
//! adapters written by either side loaded by the other).

use crate::common;

use std::path::Path;

use rlvr_model::{LoadedModel, LoraConfig, LoraTarget, load, save_adapter, save_pretrained};
use tch::{Device, Kind, Tensor};

const IDS: [[i64; 9]; 2] = [[1, 20, 23, 21, 30, 22, 31, 24, 2], [1, 60, 61, 62, 63, 64, 65, 66, 67]];

fn ids() -> Vec<Vec<i64>> {
    IDS.iter().map(|row| row.to_vec()).collect()
}

fn config(targets: &[LoraTarget]) -> LoraConfig {
    LoraConfig { rank: 4, alpha: 8.0, dropout: 0.0, target_modules: targets.to_vec(), unembed: false }
}

/// `targets` and the unembedding (PEFT's `lm_head`, here over tied embeddings).
fn with_unembed(targets: &[LoraTarget]) -> LoraConfig {
    LoraConfig { unembed: true, ..config(targets) }
}

/// The built-in model saved as a directory, then loaded from it: the base PEFT reads.
fn base_dir(dir: &Path) -> LoadedModel {
    let builtin = load("builtin:tiny-arith?seed=3", Device::Cpu, Kind::Float).unwrap();
    save_pretrained(&builtin, dir).unwrap();
    load(dir.to_str().unwrap(), Device::Cpu, Kind::Float).unwrap()
}

/// Draws every B at random, so that the adapters change the model.
fn perturb_b(model: &LoadedModel) {
    tch::manual_seed(11);
    for (name, mut tensor) in model.adapters.as_ref().unwrap().vs.variables() {
        if name.ends_with("lora_B.weight") {
            tch::no_grad(|| tensor.copy_(&(Tensor::randn(tensor.size(), (Kind::Float, Device::Cpu)) * 0.05)));
        }
    }
}

#[test]
fn fresh_adapters_compute_the_base_and_off_is_the_base() {
    let tmp = tempfile::tempdir().unwrap();
    let mut model = base_dir(&tmp.path().join("base"));
    let before = common::our_logits(&model.model, &ids());
    model.attach_lora(&config(&LoraTarget::ALL), 5).unwrap();
    assert_eq!(model.trainable().len(), 4 * 7 * 2, "A and B on 7 modules of 4 layers");
    assert!(model.vs.variables().values().all(|t| !t.requires_grad()), "the base is frozen");
    assert!(model.trainable().iter().all(|(_, t)| t.requires_grad()));
    assert_eq!(common::max_abs_diff(&common::our_logits(&model.model, &ids()), &before), 0.0, "B = 0");
    perturb_b(&model);
    let adapted = common::our_logits(&model.model, &ids());
    assert!(common::max_abs_diff(&adapted, &before) > 1e-3, "the adapters change the logits");
    let off = model.model.without_adapters(|| common::our_logits(&model.model, &ids()));
    assert_eq!(common::max_abs_diff(&off, &before), 0.0, "adapters off is the base");
    assert_eq!(common::max_abs_diff(&common::our_logits(&model.model, &ids()), &adapted), 0.0, "back on");
    // The same seed draws the same A on any machine.
    let mut again = base_dir(&tmp.path().join("base2"));
    again.attach_lora(&config(&LoraTarget::ALL), 5).unwrap();
    let a = |m: &LoadedModel| {
        m.adapters.as_ref().unwrap().vs.variables()["model.layers.2.mlp.up_proj.lora_A.weight"].copy()
    };
    assert!(a(&model).equal(&a(&again)));
}

#[test]
fn adapter_directory_and_merged_model_load_back() {
    let tmp = tempfile::tempdir().unwrap();
    let base = tmp.path().join("base");
    let mut model = base_dir(&base);
    model
        .attach_lora(&with_unembed(&[LoraTarget::QProj, LoraTarget::VProj, LoraTarget::DownProj]), 1)
        .unwrap();
    perturb_b(&model);
    let adapted = common::our_logits(&model.model, &ids());
    // The unembedding's adapter alone changes the logits too.
    let without_unembed = tch::no_grad(|| {
        let b = model.adapters.as_ref().unwrap().vs.variables()["lm_head.lora_B.weight"].shallow_clone();
        let kept = b.copy();
        let _ = b.shallow_clone().zero_();
        let logits = common::our_logits(&model.model, &ids());
        b.shallow_clone().copy_(&kept);
        logits
    });
    assert!(
        common::max_abs_diff(&without_unembed, &adapted) > 1e-4,
        "the lm_head adapter adds to the logits"
    );

    let adapter = tmp.path().join("adapter");
    save_adapter(&model, base.to_str().unwrap(), &adapter).unwrap();
    for file in ["adapter_config.json", "adapter_model.safetensors", "tokenizer.json"] {
        assert!(adapter.join(file).is_file(), "{file}");
    }
    let back = load(adapter.to_str().unwrap(), Device::Cpu, Kind::Float).unwrap();
    assert_eq!(back.adapters.as_ref().unwrap().config, model.adapters.as_ref().unwrap().config);
    assert_eq!(common::max_abs_diff(&common::our_logits(&back.model, &ids()), &adapted), 0.0);

    let merged = tmp.path().join("merged");
    save_pretrained(&model, &merged).unwrap();
    let merged = load(merged.to_str().unwrap(), Device::Cpu, Kind::Float).unwrap();
    assert!(merged.adapters.is_none());
    // Its output layer is its own now (the embeddings it was tied to are the base's).
    assert_eq!(merged.config.tie_word_embeddings, Some(false));
    let diff = common::max_abs_diff(&common::our_logits(&merged.model, &ids()), &adapted);
    assert!(diff < 1e-5, "merged logits differ by {diff:e}");
    // Merged in memory, likewise: then saved, it loads as the same model.
    let mut in_memory = load(adapter.to_str().unwrap(), Device::Cpu, Kind::Float).unwrap();
    in_memory.merge_adapters();
    let diff = common::max_abs_diff(&common::our_logits(&in_memory.model, &ids()), &adapted);
    assert!(diff < 1e-5, "logits merged in memory differ by {diff:e}");
    assert!(
        in_memory.vs.variables().contains_key("lm_head.weight"),
        "the untied head is a weight of the model"
    );
    let resaved = tmp.path().join("resaved");
    save_pretrained(&in_memory, &resaved).unwrap();
    let resaved = load(resaved.to_str().unwrap(), Device::Cpu, Kind::Float).unwrap();
    let diff = common::max_abs_diff(&common::our_logits(&resaved.model, &ids()), &adapted);
    assert!(diff < 1e-5, "merged, saved and loaded, logits differ by {diff:e}");

    // The base alone, as an engine that applies the adapters itself loads it: the base's weights.
    let base_only = tmp.path().join("base-only");
    rlvr_model::save_base(&model, &base_only).unwrap();
    let base_only = load(base_only.to_str().unwrap(), Device::Cpu, Kind::Float).unwrap();
    assert!(base_only.adapters.is_none());
    let original = load(base.to_str().unwrap(), Device::Cpu, Kind::Float).unwrap();
    let diff = common::max_abs_diff(
        &common::our_logits(&base_only.model, &ids()),
        &common::our_logits(&original.model, &ids()),
    );
    assert_eq!(diff, 0.0, "the base written alone differs from the base");
}

#[test]
fn an_adapter_directory_that_is_not_plain_lora_is_refused_naming_the_field() {
    let tmp = tempfile::tempdir().unwrap();
    let base = tmp.path().join("base");
    let mut model = base_dir(&base);
    model.attach_lora(&config(&[LoraTarget::QProj]), 1).unwrap();
    let adapter = tmp.path().join("adapter");
    save_adapter(&model, base.to_str().unwrap(), &adapter).unwrap();
    let path = adapter.join("adapter_config.json");
    let text = std::fs::read_to_string(&path).unwrap();
    std::fs::write(&path, text.replace("\"use_dora\": false", "\"use_dora\": true")).unwrap();
    let error = load(adapter.to_str().unwrap(), Device::Cpu, Kind::Float).unwrap_err().to_string();
    assert!(error.contains("adapter_config.json: field \"use_dora\": not supported"), "{error}");
}

/// Our loss of [`peft_reference.py grads`]: −Σ log p(next id).
fn next_token_loss(model: &LoadedModel) -> (Tensor, Tensor) {
    let flat: Vec<i64> = IDS.iter().flatten().copied().collect();
    let input = Tensor::from_slice(&flat).view([2, 9]);
    let mask = Tensor::ones([2, 9], (Kind::Int64, Device::Cpu));
    let positions = rlvr_model::positions_from_mask(&mask);
    let logits = model.model.logits(&model.model.forward(&input, &positions, &mask, None));
    let logprobs = logits.narrow(1, 0, 8).log_softmax(-1, Kind::Float);
    let loss = -logprobs.gather(-1, &input.narrow(1, 1, 8).unsqueeze(-1), false).sum(Kind::Float);
    (logits, loss)
}

#[test]
fn peft_gives_our_logits_and_adapter_gradients_over_our_adapter() {
    let tmp = tempfile::tempdir().unwrap();
    let base = tmp.path().join("base");
    let mut model = base_dir(&base);
    // Every layer target and the unembedding (`lm_head`, tied to the embeddings here).
    model.attach_lora(&with_unembed(&LoraTarget::ALL), 2).unwrap();
    perturb_b(&model);
    let adapter = tmp.path().join("adapter");
    save_adapter(&model, base.to_str().unwrap(), &adapter).unwrap();
    let ids_json = serde_json::to_string(&IDS).unwrap();
    let peft =
        common::peft_reference(&["grads", base.to_str().unwrap(), adapter.to_str().unwrap(), &ids_json]);

    let (logits, loss) = next_token_loss(&model);
    let diff = common::max_abs_diff(&logits.detach(), &common::flat_tensor(&peft["logits"]));
    println!("logits: max abs diff vs PEFT = {diff:.3e}");
    assert!(diff <= 1e-5, "logits differ from PEFT's by {diff:e}");
    loss.backward();
    let grads = peft["grads"].as_object().unwrap();
    let ours = model.trainable();
    assert_eq!(grads.len(), ours.len(), "PEFT trains the same adapter tensors");
    let mut worst = 0f64;
    for (name, tensor) in ours {
        let theirs = common::flat_tensor(grads.get(&name).unwrap_or_else(|| panic!("PEFT has no {name}")));
        let scale = theirs.abs().max().double_value(&[]).max(1.0);
        worst = worst.max(common::max_abs_diff(&tensor.grad(), &theirs) / scale);
    }
    println!("adapter gradients: max abs diff vs PEFT (relative to the largest) = {worst:.3e}");
    assert!(worst <= 1e-5, "adapter gradients differ from PEFT's by {worst:e}");
}

#[test]
fn an_adapter_peft_wrote_gives_peft_logits_here() {
    let tmp = tempfile::tempdir().unwrap();
    let base = tmp.path().join("base");
    base_dir(&base);
    let adapter = tmp.path().join("peft-adapter");
    let (b, a) = (base.to_str().unwrap(), adapter.to_str().unwrap());
    common::peft_reference(&["make", b, a, "8", "16", "q_proj,k_proj,o_proj,gate_proj", "4"]);
    let peft = common::peft_reference(&["grads", b, a, &serde_json::to_string(&IDS).unwrap()]);
    let ours = load(a, Device::Cpu, Kind::Float).unwrap();
    let config = &ours.adapters.as_ref().unwrap().config;
    assert_eq!((config.rank, config.alpha), (8, 16.0));
    let diff =
        common::max_abs_diff(&common::our_logits(&ours.model, &ids()), &common::flat_tensor(&peft["logits"]));
    println!("PEFT's adapter: max abs logit diff = {diff:.3e}");
    assert!(diff <= 1e-5, "logits of PEFT's adapter differ by {diff:e}");
}
