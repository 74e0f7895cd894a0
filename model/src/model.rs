//! The Llama-family decoder (Llama, SmolLM, Mistral, Qwen2): forward pass, KV cache, RoPE.
//!
//! The computation follows transformers' `LlamaForCausalLM` op for op (RMSNorm in f32, RoPE
//! angles in f32, SiLU-gated MLP), so logits agree with it to float rounding. Attention is
//! libtorch's `scaled_dot_product_attention`; padding is handled with a boolean mask in which
//! every query may also see itself, so rows of pure left padding stay finite instead of NaN.
//!
//! `Llama` carries a [`KvCache`]; `forward_with` takes the mask's [`Padding`] from the caller instead
//! of reading the mask back from the device. LoRA adapters sit on its linear layers and are switched
//! off with `without_adapters` for the base. Training passes (`set_training`) with activation
//! checkpointing keep each layer's input, and `backward_checkpointed` recomputes the layers after
//! `loss.backward()`: tch binds no `torch.utils.checkpoint`, so the sweep is ours. Dropout masks
//! come from libtorch's generator seeded per layer (`seed + layer`), the one use of torch's RNG.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};

use tch::nn::VarStore;
use tch::{Device, Kind, Tensor};

use crate::config::{ModelSpec, RopeScaling};
use crate::error::{ModelError, Result};
use crate::lora::{LoraConfig, LoraTarget};
use crate::onednn;

struct Linear {
    weight: Tensor,
    bias: Option<Tensor>,
    adapter: Option<Adapter>,
}

/// A LoRA adapter on a linear layer: `x ↦ scaling · B·A·dropout(x)`, added to the layer's output.
struct Adapter {
    /// `[rank, in]`.
    a: Tensor,
    /// `[out, rank]`.
    b: Tensor,
    scaling: f64,
    dropout: f64,
}

impl Adapter {
    /// `scaling · B·A·x`: what the adapter adds to its layer's output.
    fn delta(&self, x: &Tensor) -> Tensor {
        x.linear(&self.a, None::<Tensor>).linear(&self.b, None::<Tensor>) * self.scaling
    }

    /// `scaling · B·A` in f32: what merging adds to the weight.
    fn merged_delta(&self) -> Tensor {
        self.b.to_kind(Kind::Float).matmul(&self.a.to_kind(Kind::Float)) * self.scaling
    }
}

/// How a forward pass treats adapters: whether they are on, and whether it trains (dropout).
#[derive(Clone, Copy)]
struct Mode {
    adapters: bool,
    training: bool,
    /// Seeds libtorch's generator before each layer of a training pass (`seed + layer`), so the
    /// dropout masks of a layer are the same when a checkpointed pass recomputes it.
    seed: Option<u64>,
}

impl Linear {
    fn forward(&self, x: &Tensor, mode: Mode) -> Tensor {
        let y = linear(x, &self.weight, self.bias.as_ref());
        match &self.adapter {
            Some(adapter) if mode.adapters => {
                // PEFT's order: dropout, A, B, then the scale.
                let x = if mode.training && adapter.dropout > 0.0 {
                    x.dropout(adapter.dropout, true)
                } else {
                    x.shallow_clone()
                };
                y + adapter.delta(&x)
            }
            _ => y,
        }
    }

    /// The weight with the adapter merged in (`W + scaling · B·A`, summed in f32), or the weight.
    fn merged_weight(&self) -> Tensor {
        match &self.adapter {
            None => self.weight.shallow_clone(),
            Some(adapter) => merged(&self.weight, adapter),
        }
    }
}

/// `weight + scaling · B·A`, summed in f32, in the weight's kind.
fn merged(weight: &Tensor, adapter: &Adapter) -> Tensor {
    tch::no_grad(|| (weight.to_kind(Kind::Float) + adapter.merged_delta()).to_kind(weight.kind()))
}

/// `x · weightᵀ + bias`: through oneDNN for float32 on CPU (see [`crate::onednn`]), else libtorch's.
fn linear(x: &Tensor, weight: &Tensor, bias: Option<&Tensor>) -> Tensor {
    if onednn::applies(x, weight) { onednn::linear(x, weight, bias) } else { x.linear(weight, bias) }
}

type Param<'a> = &'a mut dyn FnMut(&str, &[i64]) -> Result<Tensor>;

struct Layer {
    input_norm: Tensor,
    post_norm: Tensor,
    q: Linear,
    k: Linear,
    v: Linear,
    o: Linear,
    gate: Linear,
    up: Linear,
    down: Linear,
}

impl Layer {
    /// The linear layers LoRA can adapt, with their targets.
    fn modules(&self) -> [(LoraTarget, &Linear); 7] {
        [
            (LoraTarget::QProj, &self.q),
            (LoraTarget::KProj, &self.k),
            (LoraTarget::VProj, &self.v),
            (LoraTarget::OProj, &self.o),
            (LoraTarget::GateProj, &self.gate),
            (LoraTarget::UpProj, &self.up),
            (LoraTarget::DownProj, &self.down),
        ]
    }

    fn module_mut(&mut self, target: LoraTarget) -> &mut Linear {
        match target {
            LoraTarget::QProj => &mut self.q,
            LoraTarget::KProj => &mut self.k,
            LoraTarget::VProj => &mut self.v,
            LoraTarget::OProj => &mut self.o,
            LoraTarget::GateProj => &mut self.gate,
            LoraTarget::UpProj => &mut self.up,
            LoraTarget::DownProj => &mut self.down,
        }
    }
}

/// Keys and values of every layer for the tokens seen so far: per layer K and V of shape
/// `[B, kv_heads, T, head_dim]` (not repeated for grouped-query attention).
///
/// Appending concatenates (differentiable, so a cache may be used under autograd, e.g. for a
/// shared prompt in a logprob pass); after [`KvCache::reserve`] appends of tensors that do not
/// require grad are written in place into preallocated buffers, which is what sampling does.
#[derive(Default)]
pub struct KvCache {
    /// Per layer (K, V) buffers `[B, kv_heads, capacity, head_dim]`, the first `len` positions filled.
    layers: Vec<(Tensor, Tensor)>,
    len: i64,
}

impl KvCache {
    /// An empty cache; the first forward pass that gets it fills it.
    pub fn new() -> KvCache {
        KvCache::default()
    }

    /// How many positions it holds (T).
    pub fn len(&self) -> i64 {
        self.len
    }

    /// Whether it holds nothing yet.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Rows (B), once filled.
    pub fn batch_size(&self) -> Option<i64> {
        self.layers.first().map(|(k, _)| k.size()[0])
    }

    /// The filled part of layer `i`'s K and V.
    pub fn layer(&self, i: usize) -> (Tensor, Tensor) {
        let (k, v) = &self.layers[i];
        (k.narrow(2, 0, self.len), v.narrow(2, 0, self.len))
    }

    /// Each row repeated `n` times in place (row r becomes rows r·n … r·n+n−1): one prefilled
    /// prompt shared by the `n` completions of its group.
    pub fn repeat_interleave(&self, n: i64) -> KvCache {
        match self.batch_size() {
            None => KvCache::new(),
            Some(b) => {
                let device = self.layers[0].0.device();
                let rows =
                    Tensor::arange(b, (Kind::Int64, device)).repeat_interleave_self_int(n, 0, None::<i64>);
                self.index_select(&rows)
            }
        }
    }

    /// The cache of the given rows (int64 indices, repeats allowed). Room reserved for more
    /// positions is kept, so decoding goes on writing in place.
    pub fn index_select(&self, rows: &Tensor) -> KvCache {
        let layers =
            self.layers.iter().map(|(k, v)| (k.index_select(0, rows), v.index_select(0, rows))).collect();
        KvCache { layers, len: self.len }
    }

    /// Preallocates room for `extra` more positions, so later no-grad appends write in place
    /// instead of copying the whole cache at every step.
    pub fn reserve(&mut self, extra: i64) {
        let len = self.len;
        for (k, v) in &mut self.layers {
            let cap = k.size()[2];
            if cap >= len + extra {
                continue;
            }
            let grow = |t: &Tensor| {
                let mut size = t.size();
                size[2] = len + extra;
                let buf = Tensor::zeros(&size, (t.kind(), t.device()));
                buf.narrow(2, 0, len).copy_(&t.narrow(2, 0, len));
                buf
            };
            *k = grow(k);
            *v = grow(v);
        }
    }

    /// Adds this call's K/V for layer `i` (positions `len..len+t`) and returns the filled part,
    /// new positions included. `len` itself moves when the whole forward pass is done.
    fn append(&mut self, i: usize, k_new: &Tensor, v_new: &Tensor) -> (Tensor, Tensor) {
        let t = k_new.size()[2];
        let len = self.len;
        if i == self.layers.len() {
            // First pass through this layer: the new K/V are the cache.
            assert_eq!(len, 0, "KvCache: layer {i} missing from a cache of length {len}");
            self.layers.push((k_new.shallow_clone(), v_new.shallow_clone()));
            return (k_new.shallow_clone(), v_new.shallow_clone());
        }
        let (k, v) = &mut self.layers[i];
        let in_place = k.size()[2] >= len + t && !k_new.requires_grad() && !v_new.requires_grad();
        if in_place {
            k.narrow(2, len, t).copy_(k_new);
            v.narrow(2, len, t).copy_(v_new);
        } else {
            *k = Tensor::cat(&[&k.narrow(2, 0, len), k_new], 2);
            *v = Tensor::cat(&[&v.narrow(2, 0, len), v_new], 2);
        }
        (k.narrow(2, 0, len + t), v.narrow(2, 0, len + t))
    }
}

/// Whether an attention mask has padding: what [`Llama::forward_with`] is told instead of
/// reading the mask back from the device (a read waits for every kernel queued before it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Padding {
    /// Every position is a real token: the mask is all ones.
    Absent,
    /// At least one position is padding.
    Present,
}

impl Padding {
    /// `Present` when `padded`.
    pub fn from_bool(padded: bool) -> Padding {
        if padded { Padding::Present } else { Padding::Absent }
    }

    /// Reads the mask (`[B, S]`, 1 real, 0 padding) back from its device: one wait on a GPU.
    pub fn of_mask(attention_mask: &Tensor) -> Padding {
        Padding::from_bool(attention_mask.numel() > 0 && attention_mask.min().int64_value(&[]) == 0)
    }
}

/// How attention is masked in one forward pass.
enum Mask {
    /// Every key is visible (one new token, no padding).
    None,
    /// Plain causal attention from position 0, no padding.
    Causal,
    /// `[B, 1, T, S]` booleans, true = may attend.
    Explicit(Tensor),
}

/// The real positions of a right-padded `[B, T]` batch, known on the host: row `r`'s first
/// `lengths[r]` positions. A pass given them ([`Llama::forward_real`]) runs its position-wise work
/// (norms, projections, MLP: nearly all of a layer's arithmetic) on those `N` rows alone, and
/// only attention on the padded `[B, T]` layout, so its cost follows the tokens it computes.
pub struct RealPositions {
    /// `[N]` i64: the real positions' indices in the flattened `[B · T]`.
    index: Tensor,
    b: i64,
    t: i64,
}

impl RealPositions {
    /// Row `r` of a `[lengths.len(), t]` batch has its first `min(lengths[r], t)` positions real.
    pub fn of_lengths(lengths: &[usize], t: i64, device: Device) -> RealPositions {
        let index: Vec<i64> = lengths
            .iter()
            .enumerate()
            .flat_map(|(r, &len)| (0..(len as i64).min(t)).map(move |j| r as i64 * t + j))
            .collect();
        RealPositions { index: Tensor::from_slice(&index).to_device(device), b: lengths.len() as i64, t }
    }

    /// How many positions are real.
    pub fn len(&self) -> i64 {
        self.index.size()[0]
    }

    /// Whether none is.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether every position is real (no padding: gathering and scattering only reshape).
    fn all(&self) -> bool {
        self.len() == self.b * self.t
    }

    /// `[B, T, W]` → `[N, W]`: the real positions' rows.
    pub fn gather(&self, x: &Tensor) -> Tensor {
        let width = x.size().last().copied().unwrap_or(1);
        let rows = x.reshape([self.b * self.t, width]);
        if self.all() { rows } else { rows.index_select(0, &self.index) }
    }

    /// `[N, W]` → `[B, T, W]`, zeros at the padding.
    pub fn scatter(&self, x: &Tensor) -> Tensor {
        let width = x.size()[1];
        if self.all() {
            return x.view([self.b, self.t, width]);
        }
        Tensor::zeros([self.b * self.t, width], (x.kind(), x.device()))
            .index_copy(0, &self.index, x)
            .view([self.b, self.t, width])
    }
}

/// A Llama-family decoder. Its tensors are the variables of the `VarStore` it was built in,
/// under their Hugging Face names.
pub struct Llama {
    spec: ModelSpec,
    embed: Tensor,
    layers: Vec<Layer>,
    norm: Tensor,
    /// `None`: tied to the embeddings.
    lm_head: Option<Tensor>,
    /// A LoRA adapter on the unembedding (`lm_head`, or the tied embeddings as the output layer;
    /// PEFT's target `lm_head`): added to the logits, never to the input embeddings. It takes no
    /// dropout, so the logits a training pass recomputes in its backward are the forward's.
    unembed: Option<Adapter>,
    /// RoPE inverse frequencies, `[head_dim / 2]`, f32.
    inv_freq: Tensor,
    device: Device,
    kind: Kind,
    /// Whether LoRA adapters (when attached) take part in forward passes: off, the model is its
    /// base, which is how a LoRA job's reference is computed without a second copy.
    adapters_on: AtomicBool,
    /// Whether attached adapters apply dropout in training passes (their config's `dropout > 0`).
    adapter_dropout: bool,
    /// Whether forward passes train: adapter dropout applies, and with checkpointing on, layers
    /// keep only their inputs.
    training: AtomicBool,
    /// The dropout seed of the training pass (see [`Mode::seed`]).
    training_seed: Mutex<Option<u64>>,
    /// Whether training passes checkpoint activations per decoder layer.
    checkpointing: AtomicBool,
    /// What the checkpointed training passes since the last [`Llama::backward_checkpointed`] kept.
    recompute: Mutex<Vec<Recompute>>,
    /// Positions whose logits the log-probability passes compute at once (see
    /// [`crate::logprobs`]): from the byte budget unless set.
    logits_chunk: AtomicI64,
}

/// What a checkpointed forward pass keeps for its backward pass: each decoder layer's input and
/// what the layers read besides it; the layers' output is cut from the graph at a leaf (`top`),
/// whose gradient the sweep back through the recomputed layers starts from.
struct Recompute {
    inputs: Vec<Tensor>,
    top: Tensor,
    input_ids: Tensor,
    rope: (Tensor, Tensor),
    mask: Mask,
    mode: Mode,
}

impl Llama {
    /// Builds the model in `vs`, taking each tensor by its Hugging Face name and shape from
    /// `get` (which converts it to the model's device and kind). Parameters are trainable.
    pub fn build(
        vs: &VarStore,
        spec: &ModelSpec,
        kind: Kind,
        get: impl FnMut(&str, &[i64]) -> Result<Tensor>,
    ) -> Result<Llama> {
        Self::build_with(vs, spec, kind, true, get)
    }

    /// [`Llama::build`] without the language-model head: the `model.*` tensors only, as a
    /// sequence-classification checkpoint holds them (its own head is `score.weight`). Such a
    /// backbone is for [`Llama::forward`]; its [`Llama::logits`] would be the tied embeddings'.
    pub fn build_backbone(
        vs: &VarStore,
        spec: &ModelSpec,
        kind: Kind,
        get: impl FnMut(&str, &[i64]) -> Result<Tensor>,
    ) -> Result<Llama> {
        Self::build_with(vs, spec, kind, false, get)
    }

    fn build_with(
        vs: &VarStore,
        spec: &ModelSpec,
        kind: Kind,
        lm_head: bool,
        mut get: impl FnMut(&str, &[i64]) -> Result<Tensor>,
    ) -> Result<Llama> {
        let mut param =
            |name: &str, shape: &[i64]| -> Result<Tensor> { Ok(add_variable(vs, name, get(name, shape)?)) };
        let p = &mut param as &mut dyn FnMut(&str, &[i64]) -> Result<Tensor>;
        fn linear(p: Param<'_>, name: &str, out: i64, inp: i64, bias: bool) -> Result<Linear> {
            let weight = p(&format!("{name}.weight"), &[out, inp])?;
            let bias = if bias { Some(p(&format!("{name}.bias"), &[out])?) } else { None };
            Ok(Linear { weight, bias, adapter: None })
        }
        let (h, d, ff) = (spec.hidden_size, spec.head_dim, spec.intermediate_size);
        let (nq, nkv) = (spec.num_heads * d, spec.num_kv_heads * d);
        let embed = p("model.embed_tokens.weight", &[spec.vocab_size, h])?;
        let mut layers = Vec::with_capacity(spec.num_layers as usize);
        for i in 0..spec.num_layers {
            let n = format!("model.layers.{i}");
            layers.push(Layer {
                input_norm: p(&format!("{n}.input_layernorm.weight"), &[h])?,
                q: linear(p, &format!("{n}.self_attn.q_proj"), nq, h, spec.qkv_bias)?,
                k: linear(p, &format!("{n}.self_attn.k_proj"), nkv, h, spec.qkv_bias)?,
                v: linear(p, &format!("{n}.self_attn.v_proj"), nkv, h, spec.qkv_bias)?,
                o: linear(p, &format!("{n}.self_attn.o_proj"), h, nq, spec.o_bias)?,
                post_norm: p(&format!("{n}.post_attention_layernorm.weight"), &[h])?,
                gate: linear(p, &format!("{n}.mlp.gate_proj"), ff, h, spec.mlp_bias)?,
                up: linear(p, &format!("{n}.mlp.up_proj"), ff, h, spec.mlp_bias)?,
                down: linear(p, &format!("{n}.mlp.down_proj"), h, ff, spec.mlp_bias)?,
            });
        }
        let norm = p("model.norm.weight", &[h])?;
        let lm_head = if spec.tie_word_embeddings || !lm_head {
            None
        } else {
            Some(p("lm_head.weight", &[spec.vocab_size, h])?)
        };
        let device = embed.device();
        let inv_freq = inv_freq(spec, device);
        Ok(Llama {
            spec: spec.clone(),
            embed,
            layers,
            norm,
            lm_head,
            unembed: None,
            inv_freq,
            device,
            kind,
            adapters_on: AtomicBool::new(true),
            adapter_dropout: false,
            training: AtomicBool::new(false),
            training_seed: Mutex::new(None),
            checkpointing: AtomicBool::new(false),
            recompute: Mutex::new(Vec::new()),
            logits_chunk: AtomicI64::new(crate::logprobs::default_logits_chunk(spec.vocab_size)),
        })
    }

    /// Attaches LoRA adapters to the layers `config` targets, their tensors variables of `vs`
    /// (trainable) under PEFT's names without its prefix (`model.layers.0.self_attn.q_proj.lora_A.weight`),
    /// each taken by name and shape from `get`. Fails if the model has adapters already.
    pub fn attach_lora(
        &mut self,
        vs: &VarStore,
        config: &LoraConfig,
        mut get: impl FnMut(&str, &[i64]) -> Result<Tensor>,
    ) -> Result<()> {
        if self.has_adapters() {
            return Err(ModelError::InvalidInput("the model has LoRA adapters already".into()));
        }
        let scaling = config.scaling();
        for (i, layer) in self.layers.iter_mut().enumerate() {
            for &target in &config.target_modules {
                let name = format!("model.layers.{i}.{}", crate::lora::module_path(target));
                let module = layer.module_mut(target);
                let (out, inp) = module.weight.size2().expect("a linear weight is 2-D");
                let mut add = |leaf: &str, shape: &[i64]| -> Result<Tensor> {
                    let full = format!("{name}.{leaf}.weight");
                    Ok(add_variable(vs, &full, get(&full, shape)?))
                };
                let a = add("lora_A", &[config.rank, inp])?;
                let b = add("lora_B", &[out, config.rank])?;
                module.adapter = Some(Adapter { a, b, scaling, dropout: config.dropout });
            }
        }
        if config.unembed {
            let (out, inp) =
                self.lm_head.as_ref().unwrap_or(&self.embed).size2().expect("the unembedding is 2-D");
            let mut add = |leaf: &str, shape: &[i64]| -> Result<Tensor> {
                let full = format!("{}.{leaf}.weight", crate::lora::UNEMBED);
                Ok(add_variable(vs, &full, get(&full, shape)?))
            };
            let a = add("lora_A", &[config.rank, inp])?;
            let b = add("lora_B", &[out, config.rank])?;
            self.unembed = Some(Adapter { a, b, scaling, dropout: 0.0 });
        }
        self.adapter_dropout = config.dropout > 0.0;
        Ok(())
    }

    /// Merges the adapters into the weights they adapt and removes them: the model computes the
    /// same (to rounding) with plain weights. An unembedding adapter over tied embeddings unties
    /// them: the output layer becomes the embeddings with the adapter merged, returned so the
    /// caller keeps it as the `lm_head.weight` it now is (the input embeddings are unchanged).
    #[must_use = "an untied output layer must be kept as lm_head.weight"]
    pub fn merge_adapters(&mut self) -> Option<Tensor> {
        for layer in &mut self.layers {
            for target in LoraTarget::ALL {
                let module = layer.module_mut(target);
                if module.adapter.is_some() {
                    let merged = module.merged_weight();
                    tch::no_grad(|| module.weight.copy_(&merged));
                    module.adapter = None;
                }
            }
        }
        self.adapter_dropout = false;
        let adapter = self.unembed.take()?;
        match &self.lm_head {
            Some(head) => {
                let merged = merged(head, &adapter);
                tch::no_grad(|| head.shallow_clone().copy_(&merged));
                None
            }
            None => {
                let head = merged(&self.embed, &adapter);
                self.spec.tie_word_embeddings = false;
                self.lm_head = Some(head.shallow_clone());
                Some(head)
            }
        }
    }

    /// Makes `head` the output layer (an untied one [`Llama::merge_adapters`] returned, now a
    /// variable of the caller's store).
    pub fn set_lm_head(&mut self, head: Tensor) {
        self.lm_head = Some(head);
    }

    /// Whether LoRA adapters are attached.
    pub fn has_adapters(&self) -> bool {
        self.unembed.is_some()
            || self.layers.iter().any(|layer| layer.modules().iter().any(|(_, m)| m.adapter.is_some()))
    }

    /// Runs `f` with the adapters off (the base model), then turns them back on.
    pub fn without_adapters<R>(&self, f: impl FnOnce() -> R) -> R {
        struct On<'a>(&'a AtomicBool);
        impl Drop for On<'_> {
            fn drop(&mut self) {
                self.0.store(true, Ordering::Relaxed);
            }
        }
        self.adapters_on.store(false, Ordering::Relaxed);
        let _on = On(&self.adapters_on);
        f()
    }

    /// Whether forward passes train; off by default. In a training pass adapter dropout applies,
    /// its masks drawn from libtorch's generator seeded with `seed + layer` before each layer (so
    /// repeatable, and the same when a checkpointed layer is recomputed), and with
    /// [`Llama::set_activation_checkpointing`] the layers keep only their inputs. Turning
    /// training on drops what earlier checkpointed passes kept and no backward pass used.
    pub fn set_training(&self, training: Option<u64>) {
        if training.is_some() {
            self.recompute.lock().expect("recompute lock").clear();
        }
        *self.training_seed.lock().expect("seed lock") = training;
        self.training.store(training.is_some(), Ordering::Relaxed);
    }

    /// Activation checkpointing per decoder layer in training passes: a pass without a KV cache
    /// runs its layers without recording a graph, keeping each layer's input, and
    /// [`Llama::backward_checkpointed`] recomputes each layer (last first) to back-propagate
    /// through it. Gradients are those of the plain pass (to rounding); activation memory is one
    /// layer's instead of every layer's, for about one more forward pass of compute.
    pub fn set_activation_checkpointing(&self, on: bool) {
        self.checkpointing.store(on, Ordering::Relaxed);
    }

    /// Whether the next training pass without a cache checkpoints its layers.
    pub fn checkpoints_activations(&self) -> bool {
        self.checkpointing.load(Ordering::Relaxed) && self.training.load(Ordering::Relaxed)
    }

    /// How many positions' logits the log-probability passes compute at once: by default as many
    /// as [`rlvr_protocol::memory::LOGITS_CHUNK_BYTES`] of f32 logits hold.
    pub fn logits_chunk(&self) -> i64 {
        self.logits_chunk.load(Ordering::Relaxed)
    }

    /// Sets [`Llama::logits_chunk`] (at least 1 position). Log-probabilities and gradients do
    /// not depend on it beyond rounding; memory and the number of kernels do.
    pub fn set_logits_chunk(&self, positions: i64) {
        assert!(positions > 0, "a logits chunk holds at least one position, not {positions}");
        self.logits_chunk.store(positions, Ordering::Relaxed);
    }

    /// Finishes the backward pass of the checkpointed training passes since training was turned
    /// on: call it after `loss.backward()`, which stopped at each pass's cut (for the passes of
    /// [`crate::training_logprobs`], [`crate::TrainingLogprobs::backward`] calls it). Each layer is
    /// recomputed from its kept input with the pass's dropout masks and back-propagated with the
    /// gradient of its output, last layer first, then the embeddings. A pass whose output the
    /// loss did not use is skipped.
    pub fn backward_checkpointed(&self) {
        let passes = std::mem::take(&mut *self.recompute.lock().expect("recompute lock"));
        for pass in passes.into_iter().rev() {
            let mut grad = pass.top.grad();
            if !grad.defined() {
                continue;
            }
            let rope = (&pass.rope.0, &pass.rope.1);
            for (i, input) in pass.inputs.iter().enumerate().rev() {
                let x = input.detach().set_requires_grad(true);
                let y = self.layer_forward(i, &x, rope, &pass.mask, None, pass.mode, None);
                // d/dy Σ(y·g) = g: back-propagates exactly the output's gradient.
                (y * &grad).sum(Kind::Float).backward();
                grad = x.grad();
            }
            if self.embed.requires_grad() {
                let embedded = Tensor::embedding(&self.embed, &pass.input_ids, -1, false, false);
                (embedded * &grad).sum(Kind::Float).backward();
            }
        }
    }

    /// Every weight under its Hugging Face name with the adapters merged in: what a merged model
    /// directory holds. Without adapters, the weights themselves.
    pub fn merged_weights(&self, vs: &VarStore) -> Vec<(String, Tensor)> {
        let mut merged: std::collections::HashMap<String, Tensor> = vs.variables();
        for (i, layer) in self.layers.iter().enumerate() {
            for (target, module) in layer.modules() {
                if module.adapter.is_some() {
                    let name = format!("model.layers.{i}.{}.weight", crate::lora::module_path(target));
                    merged.insert(name, module.merged_weight());
                }
            }
        }
        // Over tied embeddings the merged output layer is a weight of its own (the saved
        // config unties them: `config_as_saved`).
        if let Some(adapter) = &self.unembed {
            let head = self.lm_head.as_ref().unwrap_or(&self.embed);
            merged.insert(format!("{}.weight", crate::lora::UNEMBED), self::merged(head, adapter));
        }
        let mut merged: Vec<(String, Tensor)> = merged.into_iter().collect();
        merged.sort_by(|a, b| a.0.cmp(&b.0));
        merged
    }

    fn mode(&self) -> Mode {
        let training = self.training.load(Ordering::Relaxed);
        let seed = if training && self.adapter_dropout {
            *self.training_seed.lock().expect("seed lock")
        } else {
            None
        };
        Mode { adapters: self.adapters_on.load(Ordering::Relaxed), training, seed }
    }

    /// The resolved architecture.
    pub fn spec(&self) -> &ModelSpec {
        &self.spec
    }

    /// Width of the hidden states.
    pub fn hidden_size(&self) -> i64 {
        self.spec.hidden_size
    }

    /// Number of logits per position.
    pub fn vocab_size(&self) -> i64 {
        self.spec.vocab_size
    }

    /// Number of decoder layers.
    pub fn num_layers(&self) -> usize {
        self.layers.len()
    }

    /// Where the weights are.
    pub fn device(&self) -> Device {
        self.device
    }

    /// The weights' dtype.
    pub fn kind(&self) -> Kind {
        self.kind
    }

    /// Hidden states after the final norm, `[B, T, hidden]`. `attention_mask` is
    /// `[B, T_past + T]` (1 real, 0 padding, left padding allowed); `positions` `[B, T]`.
    /// With a cache, appends this call's K/V.
    ///
    /// Reads the mask's values to learn whether it has padding: on a GPU that waits for every
    /// kernel queued before. A caller that knows it from the lengths it padded to says so with
    /// [`Llama::forward_with`].
    pub fn forward(
        &self,
        input_ids: &Tensor,
        positions: &Tensor,
        attention_mask: &Tensor,
        cache: Option<&mut KvCache>,
    ) -> Tensor {
        self.forward_with(input_ids, positions, attention_mask, Padding::of_mask(attention_mask), cache)
    }

    /// [`Llama::forward`] with the mask's padding as the caller knows it, so that nothing is read
    /// back from the device. `padding` must be the truth (the attention kernel chosen depends on
    /// it, and with it the rounding); debug builds check it on CPU.
    pub fn forward_with(
        &self,
        input_ids: &Tensor,
        positions: &Tensor,
        attention_mask: &Tensor,
        padding: Padding,
        mut cache: Option<&mut KvCache>,
    ) -> Tensor {
        let (b, t) = input_ids.size2().expect("input_ids is [B, T]");
        let past = cache.as_ref().map_or(0, |c| c.len);
        assert_eq!(
            attention_mask.size(),
            [b, past + t],
            "attention_mask must be [B, T_past + T] = [{b}, {}]",
            past + t
        );
        assert_eq!(positions.size(), [b, t], "positions must be [B, T] = [{b}, {t}]");
        if cfg!(debug_assertions) && attention_mask.device() == Device::Cpu {
            assert_eq!(padding, Padding::of_mask(attention_mask), "the caller's padding is not the mask's");
        }
        let mask = build_mask(attention_mask, padding, past, t, self.spec.sliding_window);
        let (cos, sin) = self.rope(positions);
        let mode = self.mode();
        if cache.is_none() && self.checkpoints_activations() {
            return self.forward_checkpointed(input_ids, (cos, sin), mask, mode);
        }
        let mut x = Tensor::embedding(&self.embed, input_ids, -1, false, false);
        for i in 0..self.layers.len() {
            let kv = cache.as_deref_mut().map(|c| (c, i));
            x = self.layer_forward(i, &x, (&cos, &sin), &mask, kv, mode, None);
        }
        if let Some(c) = cache {
            c.len += t;
        }
        rms_norm(&x, &self.norm, self.spec.rms_norm_eps)
    }

    /// [`Llama::forward_with`] over a right-padded batch whose real positions are `real`: the
    /// hidden states of those positions only, `[N, hidden]` in `real`'s order. Padding costs
    /// attention's share of a layer and nothing else. `attention_mask` must mark exactly `real`
    /// (and the past's real positions) as 1, and `padding` say whether it has a 0; not for
    /// checkpointed training passes.
    pub fn forward_real(
        &self,
        input_ids: &Tensor,
        positions: &Tensor,
        (attention_mask, padding): (&Tensor, Padding),
        real: &RealPositions,
        mut cache: Option<&mut KvCache>,
    ) -> Tensor {
        let (b, t) = input_ids.size2().expect("input_ids is [B, T]");
        assert_eq!([b, t], [real.b, real.t], "real positions of a [{}, {}] batch", real.b, real.t);
        let past = cache.as_ref().map_or(0, |c| c.len);
        assert_eq!(attention_mask.size(), [b, past + t], "attention_mask must be [B, T_past + T]");
        assert!(
            cache.is_some() || !self.checkpoints_activations(),
            "forward_real is not for checkpointed training passes"
        );
        if cfg!(debug_assertions) && attention_mask.device() == Device::Cpu {
            assert_eq!(padding, Padding::of_mask(attention_mask), "the caller's padding is not the mask's");
        }
        let mask = build_mask(attention_mask, padding, past, t, self.spec.sliding_window);
        let (cos, sin) = self.rope(positions);
        let mode = self.mode();
        let mut x = real.gather(&Tensor::embedding(&self.embed, input_ids, -1, false, false));
        for i in 0..self.layers.len() {
            let kv = cache.as_deref_mut().map(|c| (c, i));
            x = self.layer_forward(i, &x, (&cos, &sin), &mask, kv, mode, Some(real));
        }
        if let Some(c) = cache {
            c.len += t;
        }
        rms_norm(&x, &self.norm, self.spec.rms_norm_eps)
    }

    /// The layers without a graph, each one's input kept, the output cut at a leaf that the final
    /// norm (and whatever the caller computes) is recorded from: see [`Llama::backward_checkpointed`].
    fn forward_checkpointed(
        &self,
        input_ids: &Tensor,
        rope: (Tensor, Tensor),
        mask: Mask,
        mode: Mode,
    ) -> Tensor {
        let mut inputs = Vec::with_capacity(self.layers.len());
        let top = tch::no_grad(|| {
            let mut x = Tensor::embedding(&self.embed, input_ids, -1, false, false);
            for i in 0..self.layers.len() {
                let next = self.layer_forward(i, &x, (&rope.0, &rope.1), &mask, None, mode, None);
                inputs.push(x);
                x = next;
            }
            x
        })
        .set_requires_grad(true);
        let out = rms_norm(&top, &self.norm, self.spec.rms_norm_eps);
        let pass = Recompute { inputs, top, input_ids: input_ids.shallow_clone(), rope, mask, mode };
        self.recompute.lock().expect("recompute lock").push(pass);
        out
    }

    /// Logits of hidden states `[..., hidden]` → `[..., vocab]`, in the model's dtype.
    pub fn logits(&self, hidden: &Tensor) -> Tensor {
        let logits = linear(hidden, self.lm_head.as_ref().unwrap_or(&self.embed), None);
        match &self.unembed {
            Some(adapter) if self.adapters_on.load(Ordering::Relaxed) => logits + adapter.delta(hidden),
            _ => logits,
        }
    }

    /// Whether an unembedding adapter is attached (its merged model has an untied output layer).
    pub fn has_unembed_adapter(&self) -> bool {
        self.unembed.is_some()
    }

    /// cos and sin of the RoPE angles, `[B, 1, T, head_dim]` in the model's kind.
    fn rope(&self, positions: &Tensor) -> (Tensor, Tensor) {
        let freqs = positions.to_kind(Kind::Float).unsqueeze(-1) * &self.inv_freq;
        let emb = Tensor::cat(&[&freqs, &freqs], -1);
        (emb.cos().to_kind(self.kind).unsqueeze(1), emb.sin().to_kind(self.kind).unsqueeze(1))
    }

    /// Decoder layer `index` over `x`: `[B, T, H]`, or with `real` the real positions' `[N, H]`
    /// (projections and MLP on those rows, attention on the padded layout).
    #[allow(clippy::too_many_arguments)]
    fn layer_forward(
        &self,
        index: usize,
        x: &Tensor,
        (cos, sin): (&Tensor, &Tensor),
        mask: &Mask,
        cache: Option<(&mut KvCache, usize)>,
        mode: Mode,
        real: Option<&RealPositions>,
    ) -> Tensor {
        let layer = &self.layers[index];
        if let Some(seed) = mode.seed {
            tch::manual_seed(seed.wrapping_add(index as u64) as i64);
        }
        let (b, t) = match real {
            Some(real) => (real.b, real.t),
            None => x.size3().map(|(b, t, _)| (b, t)).expect("hidden is [B, T, H]"),
        };
        let padded = |y: Tensor| match real {
            Some(real) => real.scatter(&y),
            None => y,
        };
        let (nh, nkv, d) = (self.spec.num_heads, self.spec.num_kv_heads, self.spec.head_dim);
        let h = rms_norm(x, &layer.input_norm, self.spec.rms_norm_eps);
        let q = padded(layer.q.forward(&h, mode)).view([b, t, nh, d]).transpose(1, 2);
        let k = padded(layer.k.forward(&h, mode)).view([b, t, nkv, d]).transpose(1, 2);
        let v = padded(layer.v.forward(&h, mode)).view([b, t, nkv, d]).transpose(1, 2);
        let q = apply_rope(&q, cos, sin);
        let k = apply_rope(&k, cos, sin);
        let (k, v) = match cache {
            Some((c, i)) => c.append(i, &k, &v),
            None => (k, v),
        };
        let attn = attention(&q, &k, &v, mask, nh / nkv);
        let attn = attn.transpose(1, 2).reshape([b, t, nh * d]);
        let attn = match real {
            Some(real) => real.gather(&attn),
            None => attn,
        };
        let x = x + layer.o.forward(&attn, mode);
        let h = rms_norm(&x, &layer.post_norm, self.spec.rms_norm_eps);
        let mlp =
            layer.down.forward(&(layer.gate.forward(&h, mode).silu() * layer.up.forward(&h, mode)), mode);
        x + mlp
    }
}

/// Adds `tensor` to `vs` as a trainable variable named `name`: tch names a variable by its path
/// components joined with '.', so the variable's name is the Hugging Face one.
pub(crate) fn add_variable(vs: &VarStore, name: &str, tensor: Tensor) -> Tensor {
    let (dir, leaf) = name.rsplit_once('.').unwrap_or(("", name));
    let path = dir.split('.').filter(|c| !c.is_empty()).fold(vs.root(), |p, c| p.sub(c));
    path.add(leaf, tensor, true)
}

/// Attention of `q [B, H, T, D]` over `k, v [B, KV, S, D]`, `rep = H / KV`; returns `[B, H, T, D]`.
fn attention(q: &Tensor, k: &Tensor, v: &Tensor, mask: &Mask, rep: i64) -> Tensor {
    let (b, nh, t, d) = q.size4().expect("q is [B, H, T, D]");
    let sdpa = |q: &Tensor, k: &Tensor, v: &Tensor| match mask {
        Mask::None => Tensor::scaled_dot_product_attention(q, k, v, None::<Tensor>, 0.0, false, None, false),
        Mask::Causal => Tensor::scaled_dot_product_attention(q, k, v, None::<Tensor>, 0.0, true, None, false),
        Mask::Explicit(m) => Tensor::scaled_dot_product_attention(q, k, v, Some(m), 0.0, false, None, false),
    };
    if rep == 1 {
        return sdpa(q, k, v);
    }
    let (_, nkv, s, _) = k.size4().expect("k is [B, KV, S, D]");
    if t == 1 {
        // One query per head: fold the `rep` heads sharing a KV head into the query axis, so
        // K and V are used as they are in the cache instead of being copied `rep` times per
        // step. A [B, 1, 1, S] mask broadcasts over the folded axis.
        let qf = q.reshape([b, nkv, rep, d]);
        return sdpa(&qf, k, v).reshape([b, nh, 1, d]);
    }
    let expand = |x: &Tensor| x.unsqueeze(2).expand([b, nkv, rep, s, d], false).reshape([b, nh, s, d]);
    sdpa(q, &expand(k), &expand(v))
}

fn build_mask(attention_mask: &Tensor, padding: Padding, past: i64, t: i64, window: Option<i64>) -> Mask {
    let (b, s) = attention_mask.size2().expect("attention_mask is [B, S]");
    let windowed = window.is_some_and(|w| s > w);
    if padding == Padding::Absent && !windowed {
        if t == 1 {
            return Mask::None;
        }
        if past == 0 {
            return Mask::Causal;
        }
    }
    let device = attention_mask.device();
    let q = Tensor::arange_start(past, s, (Kind::Int64, device)).unsqueeze(1);
    let k = Tensor::arange(s, (Kind::Int64, device)).unsqueeze(0);
    let mut allowed = k.le_tensor(&q);
    if let Some(w) = window {
        allowed = allowed.logical_and(&(&q - &k).lt(w));
    }
    let real = attention_mask.ne(0).view([b, 1, 1, s]);
    // A query may always see itself: a row of left padding then has one finite score instead
    // of none (which gives NaN that would reach real rows through V at masked positions).
    let itself = k.eq_tensor(&q);
    Mask::Explicit(allowed.view([1, 1, t, s]).logical_and(&real).logical_or(&itself.view([1, 1, t, s])))
}

fn rms_norm(x: &Tensor, weight: &Tensor, eps: f64) -> Tensor {
    let kind = x.kind();
    let xf = x.to_kind(Kind::Float);
    let variance = xf.square().mean_dim(-1, true, Kind::Float);
    let normed = xf * (variance + eps).rsqrt();
    weight * normed.to_kind(kind)
}

fn apply_rope(x: &Tensor, cos: &Tensor, sin: &Tensor) -> Tensor {
    let half = x.size()[3] / 2;
    let x1 = x.narrow(3, 0, half);
    let x2 = x.narrow(3, half, half);
    let rotated = Tensor::cat(&[&x2.neg(), &x1], 3);
    x * cos + rotated * sin
}

/// RoPE inverse frequencies as transformers computes them (f32), with the configured scaling.
fn inv_freq(spec: &ModelSpec, device: Device) -> Tensor {
    let d = spec.head_dim;
    let exponent =
        Tensor::arange_start_step(0, d, 2, (Kind::Int64, Device::Cpu)).to_kind(Kind::Float) / d as f64;
    let inv = Tensor::pow_scalar(spec.rope_theta, &exponent).reciprocal();
    let inv = match spec.rope_scaling {
        RopeScaling::None => inv,
        RopeScaling::Linear { factor } => inv / factor,
        RopeScaling::Llama3 {
            factor,
            low_freq_factor,
            high_freq_factor,
            original_max_position_embeddings,
        } => {
            let low_freq_wavelen = original_max_position_embeddings / low_freq_factor;
            let high_freq_wavelen = original_max_position_embeddings / high_freq_factor;
            let wavelen = inv.reciprocal() * (2.0 * std::f64::consts::PI);
            let scaled = (&inv / factor).where_self(&wavelen.gt(low_freq_wavelen), &inv);
            let smooth = (wavelen.reciprocal() * original_max_position_embeddings - low_freq_factor)
                / (high_freq_factor - low_freq_factor);
            let smoothed = (smooth.neg() + 1.0) * &scaled / factor + &smooth * &scaled;
            let medium = wavelen
                .lt(high_freq_wavelen)
                .logical_not()
                .logical_and(&wavelen.gt(low_freq_wavelen).logical_not());
            smoothed.where_self(&medium, &scaled)
        }
    };
    inv.to_device(device)
}

/// Positions from an attention mask `[B, S]`: the index among real tokens, 0 on padding
/// (transformers' `cumsum - 1`, padding filled).
pub fn positions_from_mask(attention_mask: &Tensor) -> Tensor {
    let pos = attention_mask.to_kind(Kind::Int64).cumsum(-1, Kind::Int64) - 1;
    pos.clamp_min(0)
}
