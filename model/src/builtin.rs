//! The built-in models (`rlvr_protocol::builtin_models` says which there are), made on the fly
//! — no files, no download.
//!
//! `builtin:tiny-arith`, for the demo and the tests. Architecture: 4 layers, hidden 128, 4 query
//! heads of 32 over 2 KV heads (GQA), SwiGLU 384, tied embeddings, RoPE θ = 10 000, 512
//! positions; 800 512 parameters (3.2 MB in f32).
//! Tokenizer: one token per character of printable ASCII plus tab and newline, and four
//! specials (`<|pad|>` 0, `<|bos|>` 1, `<|eos|>` 2, `<|unk|>` 3; any other character is
//! `<|unk|>`), built as a real `tokenizer.json` (BPE without merges, `Fuse` decoder) so a
//! checkpoint loads through the directory path, and in transformers, like any HF model.
//! No chat template: prompts are the raw text.
//! Weights: a pure function of the seed. Each tensor is drawn from its own [`SamplerRng`]
//! stream seeded from (seed, tensor name), uniform with std 0.02 (no transcendental functions,
//! so the bits are the same on every machine); norms are 1.
//!
//! `builtin:random-*`, for measuring speed and memory at published models' shapes: their
//! `config.json` as the publisher's (architecture, widths, heads, vocabulary, tied embeddings,
//! RoPE), the same character tokenizer padded to the vocabulary with tokens `<|rN|>` that
//! decoding yields and encoding never makes (the models sample every id), no chat template.
//! Weights are uniform with std 0.02 (norms 1), value `i` of a tensor a function of (seed,
//! tensor name, `i`) alone (`rlvr_seeded::fill_uniform`): made by libtorch's CPU threads (the
//! job's `--threads`) straight into a host tensor of the job's dtype (no f32 copy of a bf16
//! model), one tensor at a time, then moved to the device — the same bits on every machine and
//! device, whatever the thread count. libtorch's own `uniform_` draws 6 ns a value on one core
//! here (50 s for the 8B shape); this about 2 ns on one core, 1 ns on two. A peer that needs
//! the same weights reads them from the directory `rlvr-worker export-model` writes.

use serde_json::{Value, json};
use tch::{Device, Kind, Tensor};

use crate::config::LlamaConfig;
use crate::rng::SamplerRng;

/// The source syntax is the job spec's, so `rlvr-protocol`'s.
pub use rlvr_protocol::builtin_models::{BuiltinSource, Family, TINY_ARITH as NAME};

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

/// The `config.json` of `source`, with its layer count: what `rlvr_protocol::builtin_models`
/// says the model is.
pub fn source_config(source: &BuiltinSource) -> LlamaConfig {
    let model = &source.model;
    let shape = source.shape();
    let (architecture, model_type) = match model.family {
        Family::Llama => ("LlamaForCausalLM", "llama"),
        Family::Qwen2 => ("Qwen2ForCausalLM", "qwen2"),
    };
    let mut value = json!({
        "architectures": [architecture],
        "model_type": model_type,
        "hidden_size": shape.hidden,
        "intermediate_size": shape.intermediate,
        "num_hidden_layers": shape.layers,
        "num_attention_heads": shape.heads,
        "num_key_value_heads": shape.kv_heads,
        "head_dim": shape.head_dim,
        "vocab_size": shape.vocab,
        "max_position_embeddings": shape.max_positions,
        "rms_norm_eps": model.rms_norm_eps,
        "rope_theta": model.rope_theta,
        "tie_word_embeddings": shape.tied_embeddings,
        "mlp_bias": false,
        "hidden_act": "silu",
        "initializer_range": 0.02,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "pad_token_id": 0,
        "torch_dtype": "float32",
        "rlvr_builtin": model.name,
        "rlvr_seed": source.seed,
    });
    match model.family {
        Family::Llama => value["attention_bias"] = json!(false),
        Family::Qwen2 => value["use_sliding_window"] = json!(false),
    }
    if let Some(scaling) = model.rope_scaling {
        value["rope_scaling"] = json!({
            "rope_type": "llama3",
            "factor": scaling.factor,
            "low_freq_factor": scaling.low_freq_factor,
            "high_freq_factor": scaling.high_freq_factor,
            "original_max_position_embeddings": scaling.original_max_position_embeddings,
        });
    }
    serde_json::from_value(value).expect("a built-in config is valid")
}

/// `builtin:tiny-arith`'s `config.json` with weights of `seed`.
pub fn config(seed: u64) -> LlamaConfig {
    let source = format!("{NAME}?seed={seed}");
    source_config(&BuiltinSource::parse(&source).expect("tiny-arith's source parses"))
}

/// The `tokenizer.json` of a model of `size` tokens: the character tokenizer, padded with
/// tokens that only decoding meets (`<|rN|>` for id N).
pub fn tokenizer_json(size: i64) -> String {
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
    for id in vocab_size()..size {
        vocab.insert(format!("<|r{id}|>"), json!(id));
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

/// The `tokenizer_config.json` (what transformers' `AutoTokenizer` needs) of a model that
/// reads `max_length` tokens.
pub fn tokenizer_config_json(max_length: u64) -> String {
    let value = json!({
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": SPECIALS[1],
        "eos_token": SPECIALS[2],
        "pad_token": SPECIALS[0],
        "unk_token": SPECIALS[3],
        "model_max_length": max_length,
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

/// The initial value of tensor `name` of `shape` of the model `source` names: ones for norms,
/// uniform with std 0.02 for everything else, on `device` in `kind`.
pub fn init_tensor(source: &BuiltinSource, name: &str, shape: &[i64], device: Device, kind: Kind) -> Tensor {
    if name.ends_with("norm.weight") {
        return Tensor::ones(shape, (kind, device));
    }
    // uniform(-a, a) has std a/√3; a = 0.02·√3.
    let bound = 0.02 * 3f64.sqrt();
    if source.is_tiny_arith() {
        return seeded_uniform(source.seed, name, shape, bound as f32, device, kind);
    }
    random_tensor(source.seed ^ fnv1a(name).rotate_left(17), shape, bound as f32, device, kind)
}

/// A tensor of `shape` holding stream `key` of `rlvr_seeded::fill_uniform`, in `kind`, on
/// `device`: the values written by the CPU threads straight into the host tensor's memory.
fn random_tensor(key: u64, shape: &[i64], bound: f32, device: Device, kind: Kind) -> Tensor {
    let (fill_kind, size) = match kind {
        Kind::BFloat16 => (Kind::BFloat16, 2),
        _ => (Kind::Float, 4),
    };
    let tensor = Tensor::empty(shape, (fill_kind, Device::Cpu));
    let n = tensor.numel();
    assert_eq!(tensor.kind().elt_size_in_bytes(), size);
    let data = tensor.data_ptr();
    if size == 2 {
        // SAFETY: a new contiguous CPU tensor of `n` bf16 elements owns this memory, and nothing
        // else reads or writes it until the slice is dropped.
        let out = unsafe { std::slice::from_raw_parts_mut(data.cast::<u16>(), n) };
        in_parallel(out, |start, part| rlvr_seeded::fill_uniform_bf16(key, start, bound, part));
    } else {
        // SAFETY: as above, `n` f32 elements.
        let out = unsafe { std::slice::from_raw_parts_mut(data.cast::<f32>(), n) };
        in_parallel(out, |start, part| rlvr_seeded::fill_uniform(key, start, bound, part));
    }
    tensor.to_kind(kind).to_device(device)
}

/// Runs `fill(first index, part)` over `out` in one part per libtorch CPU thread (the job's
/// thread budget).
fn in_parallel<T: Send>(out: &mut [T], fill: impl Fn(u64, &mut [T]) + Sync) {
    let threads = usize::try_from(tch::get_num_threads()).unwrap_or(1).max(1);
    let part = out.len().div_ceil(threads).max(1 << 20);
    std::thread::scope(|scope| {
        for (i, chunk) in out.chunks_mut(part).enumerate() {
            let fill = &fill;
            scope.spawn(move || fill((i * part) as u64, chunk));
        }
    });
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
