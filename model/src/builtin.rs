//! `builtin:tiny-arith`: a small Llama-architecture model made on the fly, for the demo and
//! the tests — no files, no download.
//!
//! Architecture: 4 layers, hidden 128, 4 query heads of 32 over 2 KV heads (GQA), SwiGLU 384,
//! tied embeddings, RoPE θ = 10 000, 512 positions; 800 512 parameters (3.2 MB in f32).
//! Tokenizer: one token per character of printable ASCII plus tab and newline, and four
//! specials (`<|pad|>` 0, `<|bos|>` 1, `<|eos|>` 2, `<|unk|>` 3; any other character is
//! `<|unk|>`), built as a real `tokenizer.json` (BPE without merges, `Fuse` decoder) so a
//! checkpoint loads through the directory path, and in transformers, like any HF model.
//! No chat template: prompts are the raw text.
//! Weights: a pure function of the seed. Each tensor is drawn from its own [`SamplerRng`]
//! stream seeded from (seed, tensor name), uniform with std 0.02 (no transcendental functions,
//! so the bits are the same on every machine); norms are 1.

use serde_json::{Value, json};
use tch::{Device, Kind, Tensor};

use crate::config::LlamaConfig;
use crate::rng::SamplerRng;

/// The source name, and how a spec names a seed: the job spec's syntax, so `rlvr-protocol`'s.
pub use rlvr_protocol::spec::{BUILTIN_MODEL as NAME, builtin_seed as parse_source};

/// Special tokens, in id order.
pub const SPECIALS: [&str; 4] = ["<|pad|>", "<|bos|>", "<|eos|>", "<|unk|>"];

/// The characters with their own token, in id order after the specials.
fn alphabet() -> Vec<char> {
    let mut chars = vec!['\t', '\n'];
    chars.extend((0x20u8..=0x7e).map(char::from));
    chars
}

/// Vocabulary size: 4 specials + tab + newline + 95 printable characters.
pub fn vocab_size() -> i64 {
    (SPECIALS.len() + alphabet().len()) as i64
}

/// The model's `config.json`.
pub fn config(seed: u64) -> LlamaConfig {
    let value = json!({
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": 128,
        "intermediate_size": 384,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 32,
        "vocab_size": vocab_size(),
        "max_position_embeddings": 512,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "tie_word_embeddings": true,
        "attention_bias": false,
        "mlp_bias": false,
        "hidden_act": "silu",
        "initializer_range": 0.02,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "pad_token_id": 0,
        "torch_dtype": "float32",
        "rlvr_builtin": "tiny-arith",
        "rlvr_seed": seed,
    });
    serde_json::from_value(value).expect("the built-in config is valid")
}

/// The model's `tokenizer.json`.
pub fn tokenizer_json() -> String {
    let added: Vec<Value> = SPECIALS
        .iter()
        .enumerate()
        .map(|(id, content)| {
            json!({"id": id, "content": content, "single_word": false, "lstrip": false, "rstrip": false,
                   "normalized": false, "special": true})
        })
        .collect();
    let mut vocab = serde_json::Map::new();
    for (id, s) in SPECIALS.iter().enumerate() {
        vocab.insert((*s).into(), json!(id));
    }
    for (i, c) in alphabet().into_iter().enumerate() {
        vocab.insert(c.to_string(), json!(SPECIALS.len() + i));
    }
    let value = json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added,
        "normalizer": null,
        "pre_tokenizer": null,
        "post_processor": null,
        "decoder": {"type": "Fuse"},
        "model": {
            "type": "BPE", "dropout": null, "unk_token": "<|unk|>", "continuing_subword_prefix": null,
            "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
            "vocab": vocab, "merges": [],
        },
    });
    let mut text = serde_json::to_string_pretty(&value).expect("serializes");
    text.push('\n');
    text
}

/// The model's `tokenizer_config.json` (what transformers' `AutoTokenizer` needs).
pub fn tokenizer_config_json() -> String {
    let value = json!({
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": SPECIALS[1],
        "eos_token": SPECIALS[2],
        "pad_token": SPECIALS[0],
        "unk_token": SPECIALS[3],
        "model_max_length": 512,
        "clean_up_tokenization_spaces": false,
    });
    let mut text = serde_json::to_string_pretty(&value).expect("serializes");
    text.push('\n');
    text
}

/// 64-bit FNV-1a of a tensor name: a stable, platform-independent hash.
fn fnv1a(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3))
}

/// The initial value of tensor `name` of `shape`: ones for norms, uniform with std 0.02 for
/// everything else, on `device` in `kind`.
pub fn init_tensor(seed: u64, name: &str, shape: &[i64], device: Device, kind: Kind) -> Tensor {
    if name.ends_with("norm.weight") {
        return Tensor::ones(shape, (kind, device));
    }
    // uniform(-a, a) has std a/√3; a = 0.02·√3.
    seeded_uniform(seed, name, shape, 0.02 * 3f32.sqrt(), device, kind)
}

/// Tensor `name` of `shape` drawn uniformly from (-bound, bound) by its own [`SamplerRng`] stream
/// seeded from (seed, name): the same bits on every machine.
pub(crate) fn seeded_uniform(
    seed: u64,
    name: &str,
    shape: &[i64],
    bound: f32,
    device: Device,
    kind: Kind,
) -> Tensor {
    let n: i64 = shape.iter().product();
    let mut rng = SamplerRng::new(seed ^ fnv1a(name).rotate_left(17));
    let values: Vec<f32> = (0..n).map(|_| (rng.next_f32() * 2.0 - 1.0) * bound).collect();
    Tensor::from_slice(&values).view(shape).to_device(device).to_kind(kind)
}

#[cfg(test)]
mod tests {
    use rlvr_protocol::memory::ModelShape;

    /// The memory estimate's copy of this model's shape (the daemon links no libtorch) is this
    /// config's.
    #[test]
    fn the_estimates_shape_is_this_config() {
        let shape = ModelShape::from_config_json(&super::config(0).to_json()).unwrap();
        assert_eq!(shape, ModelShape::BUILTIN);
    }
}
