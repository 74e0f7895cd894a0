//! The built-in models: made on the fly from a seed, with no files and no download. A job, a
//! Tinker client or a benchmark names one as `builtin:NAME`, optionally with `?seed=N` (default
//! 0) and `layers=K` (`builtin:random-qwen2.5-0.5b?seed=3&layers=2`).
//!
//! - `tiny-arith`: a small Llama-architecture model with a character tokenizer, for the demo and
//!   the tests (its weights are the same bits on every machine).
//! - `random-*`: the configurations of published models — layers, widths, heads, KV heads,
//!   vocabulary, tied embeddings, RoPE settings as their `config.json` give them — with random
//!   weights, so that speed and memory can be measured at the shapes teams train, on any device,
//!   with nothing to carry there. `layers=K` keeps K decoder layers of the same widths (what a
//!   test can afford on a CPU); nothing else can be changed, so a figure measured on one is a
//!   figure for that shape.
//!
//! This module says what each one is (the daemon's memory estimate reads the shapes; it links no
//! libtorch); `rlvr_model::builtin` makes them.

use std::fmt;

use crate::memory::ModelShape;

/// How every built-in source starts.
pub const PREFIX: &str = "builtin:";

/// The demo's and the tests' model.
pub const TINY_ARITH: &str = "builtin:tiny-arith";

/// The architecture a built-in model's `config.json` names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    /// `LlamaForCausalLM`.
    Llama,
    /// `Qwen2ForCausalLM` (biases on q, k and v).
    Qwen2,
}

/// Llama 3.1's frequency-dependent RoPE scaling (`rope_type = "llama3"`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Llama3Rope {
    pub factor: f64,
    pub low_freq_factor: f64,
    pub high_freq_factor: f64,
    pub original_max_position_embeddings: u64,
}

/// One built-in model.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BuiltinModel {
    /// What follows `builtin:`.
    pub name: &'static str,
    /// The published model whose `config.json` gave the shape and settings, if any.
    pub shape_of: Option<&'static str>,
    pub family: Family,
    pub shape: ModelShape,
    pub rope_theta: f64,
    pub rope_scaling: Option<Llama3Rope>,
    pub rms_norm_eps: f64,
}

/// A Qwen2.5 model's settings (RoPE θ 10⁶, no scaling, ε 10⁻⁶).
fn qwen2_5(name: &'static str, shape_of: &'static str, shape: ModelShape) -> BuiltinModel {
    BuiltinModel {
        name,
        shape_of: Some(shape_of),
        family: Family::Qwen2,
        shape,
        rope_theta: 1_000_000.0,
        rope_scaling: None,
        rms_norm_eps: 1e-6,
    }
}

/// A Llama 3.1/3.2 model's settings (RoPE θ 500 000 with llama3 scaling by `factor`, ε 10⁻⁵).
fn llama3(name: &'static str, shape_of: &'static str, shape: ModelShape, factor: f64) -> BuiltinModel {
    BuiltinModel {
        name,
        shape_of: Some(shape_of),
        family: Family::Llama,
        shape,
        rope_theta: 500_000.0,
        rope_scaling: Some(Llama3Rope {
            factor,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_max_position_embeddings: 8192,
        }),
        rms_norm_eps: 1e-5,
    }
}

/// A decoder's shape without biases beyond Qwen2's q/k/v ones.
#[allow(clippy::too_many_arguments)]
const fn shape(
    hidden: u64,
    intermediate: u64,
    layers: u64,
    heads: u64,
    kv_heads: u64,
    head_dim: u64,
    vocab: u64,
    tied_embeddings: bool,
    qkv_bias: bool,
    max_positions: u64,
) -> ModelShape {
    ModelShape {
        hidden,
        intermediate,
        layers,
        heads,
        kv_heads,
        head_dim,
        vocab,
        tied_embeddings,
        qkv_bias,
        o_bias: false,
        mlp_bias: false,
        max_positions: Some(max_positions),
    }
}

/// Every built-in model, the demo's first. The `random-*` shapes are those of the models'
/// `config.json` on the Hugging Face Hub (Qwen/Qwen2.5-*, meta-llama/Llama-3.*); a test checks
/// each one's parameter count against the count its publisher gives.
pub fn models() -> [BuiltinModel; 8] {
    [
        BuiltinModel {
            name: "tiny-arith",
            shape_of: None,
            family: Family::Llama,
            shape: ModelShape::BUILTIN,
            rope_theta: 10_000.0,
            rope_scaling: None,
            rms_norm_eps: 1e-5,
        },
        qwen2_5(
            "random-qwen2.5-0.5b",
            "Qwen/Qwen2.5-0.5B",
            shape(896, 4864, 24, 14, 2, 64, 151_936, true, true, 32_768),
        ),
        qwen2_5(
            "random-qwen2.5-1.5b",
            "Qwen/Qwen2.5-1.5B",
            shape(1536, 8960, 28, 12, 2, 128, 151_936, true, true, 131_072),
        ),
        qwen2_5(
            "random-qwen2.5-3b",
            "Qwen/Qwen2.5-3B",
            shape(2048, 11_008, 36, 16, 2, 128, 151_936, true, true, 32_768),
        ),
        qwen2_5(
            "random-qwen2.5-7b",
            "Qwen/Qwen2.5-7B",
            shape(3584, 18_944, 28, 28, 4, 128, 152_064, false, true, 131_072),
        ),
        llama3(
            "random-llama-3.2-1b",
            "meta-llama/Llama-3.2-1B",
            shape(2048, 8192, 16, 32, 8, 64, 128_256, true, false, 131_072),
            32.0,
        ),
        llama3(
            "random-llama-3.2-3b",
            "meta-llama/Llama-3.2-3B",
            shape(3072, 8192, 28, 24, 8, 128, 128_256, true, false, 131_072),
            32.0,
        ),
        llama3(
            "random-llama-3.1-8b",
            "meta-llama/Llama-3.1-8B",
            shape(4096, 14_336, 32, 32, 8, 128, 128_256, false, false, 131_072),
            8.0,
        ),
    ]
}

/// A parsed `builtin:` source.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BuiltinSource {
    pub model: BuiltinModel,
    pub seed: u64,
    /// Decoder layers: the model's own count unless `layers=K` asked for fewer.
    pub layers: u64,
}

impl BuiltinSource {
    /// Parses `builtin:NAME[?seed=N][&layers=K]` (the keys in any order, each at most once); the
    /// error says what was expected, naming the built-in models.
    pub fn parse(source: &str) -> Result<BuiltinSource, String> {
        let names = || models().iter().map(|m| format!("{PREFIX}{}", m.name)).collect::<Vec<_>>().join(", ");
        let rest = source.strip_prefix(PREFIX).ok_or_else(|| format!("expected one of {}", names()))?;
        let (name, query) = match rest.split_once('?') {
            Some((name, query)) => (name, Some(query)),
            None => (rest, None),
        };
        let model = models()
            .into_iter()
            .find(|m| m.name == name)
            .ok_or_else(|| format!("no built-in model {source:?}: expected one of {}", names()))?;
        let mut parsed = BuiltinSource { model, seed: 0, layers: model.shape.layers };
        let (mut seen_seed, mut seen_layers) = (false, false);
        for pair in query.into_iter().flat_map(|query| query.split('&')) {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            let number =
                || value.parse::<u64>().map_err(|_| format!("{key}: expected a whole number, got {value:?}"));
            match key {
                "seed" if !seen_seed => {
                    parsed.seed = number()?;
                    seen_seed = true;
                }
                "layers" if !seen_layers => {
                    let layers = number()?;
                    if !(1..=model.shape.layers).contains(&layers) {
                        return Err(format!(
                            "layers: expected 1–{} ({name}'s own count), got {layers}",
                            model.shape.layers
                        ));
                    }
                    parsed.layers = layers;
                    seen_layers = true;
                }
                "seed" | "layers" => return Err(format!("{key}: given twice")),
                _ => return Err(format!("unknown option {key:?} after '?': expected seed=N and layers=K")),
            }
        }
        Ok(parsed)
    }

    /// The shape this source loads: the model's, with its layer count.
    pub fn shape(&self) -> ModelShape {
        ModelShape { layers: self.layers, ..self.model.shape }
    }

    /// Whether this is the demo's model (its weights and tokenizer are made differently).
    pub fn is_tiny_arith(&self) -> bool {
        self.model.name == "tiny-arith"
    }
}

/// The source as the worker records it: `builtin:NAME?seed=N`, with `&layers=K` when reduced.
impl fmt::Display for BuiltinSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{PREFIX}{}?seed={}", self.model.name, self.seed)?;
        if self.layers != self.model.shape.layers {
            write!(f, "&layers={}", self.layers)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each shape's parameter count is its publisher's (the model cards' and the safetensors
    /// index's totals).
    #[test]
    fn each_shape_has_its_published_parameter_count() {
        let published = [
            ("tiny-arith", 800_512),
            ("random-qwen2.5-0.5b", 494_032_768),
            ("random-qwen2.5-1.5b", 1_543_714_304),
            ("random-qwen2.5-3b", 3_085_938_688),
            ("random-qwen2.5-7b", 7_615_616_512),
            ("random-llama-3.2-1b", 1_235_814_400),
            ("random-llama-3.2-3b", 3_212_749_824),
            ("random-llama-3.1-8b", 8_030_261_248),
        ];
        let models = models();
        assert_eq!(models.len(), published.len());
        for (model, (name, parameters)) in models.iter().zip(published) {
            assert_eq!(model.name, name);
            assert_eq!(model.shape.parameters(), parameters, "{name}");
        }
    }

    #[test]
    fn sources_parse_and_print_back() {
        /// A source, and what it reads as (printed back, seed, layers) or the error's start.
        type Case = (&'static str, Result<(&'static str, u64, u64), &'static str>);
        let cases: &[Case] = &[
            ("builtin:tiny-arith", Ok(("builtin:tiny-arith?seed=0", 0, 4))),
            ("builtin:tiny-arith?seed=7", Ok(("builtin:tiny-arith?seed=7", 7, 4))),
            (
                "builtin:random-qwen2.5-0.5b?layers=2",
                Ok(("builtin:random-qwen2.5-0.5b?seed=0&layers=2", 0, 2)),
            ),
            (
                "builtin:random-llama-3.1-8b?layers=32&seed=1",
                Ok(("builtin:random-llama-3.1-8b?seed=1", 1, 32)),
            ),
            ("builtin:tiny-arith?", Err("unknown option \"\"")),
            (
                "builtin:tiny",
                Err(
                    "no built-in model \"builtin:tiny\": expected one of builtin:tiny-arith, builtin:random-qwen2.5-0.5b",
                ),
            ),
            ("builtin:tiny-arith?seed=x", Err("seed: expected a whole number, got \"x\"")),
            ("builtin:tiny-arith?seed=1&seed=2", Err("seed: given twice")),
            ("builtin:random-qwen2.5-0.5b?layers=0", Err("layers: expected 1–24")),
            ("builtin:random-qwen2.5-0.5b?layers=25", Err("layers: expected 1–24")),
            ("builtin:tiny-arith?temperature=1", Err("unknown option \"temperature\"")),
            ("model/dir", Err("expected one of builtin:tiny-arith,")),
        ];
        for (source, expected) in cases {
            let parsed = BuiltinSource::parse(source);
            match (parsed, expected) {
                (Ok(parsed), Ok((printed, seed, layers))) => {
                    assert_eq!(parsed.to_string(), *printed, "{source}");
                    assert_eq!(
                        (parsed.seed, parsed.layers, parsed.shape().layers),
                        (*seed, *layers, *layers)
                    );
                    assert_eq!(BuiltinSource::parse(printed), Ok(parsed), "{printed} reads back");
                }
                (Err(message), Err(start)) => assert!(message.starts_with(start), "{source}: {message}"),
                (got, want) => panic!("{source}: got {got:?}, expected {want:?}"),
            }
        }
    }
}
