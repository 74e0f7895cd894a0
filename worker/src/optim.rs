//! AdamW, the learning-rate schedule and gradient clipping, over plain tensors, with f32 master
//! weights for parameters held in a lower precision.
//!
//! Written here rather than using `tch::nn::Optimizer` because its state (the moments) lives inside
//! libtorch where tch cannot read or restore it, and exact resume needs both. The update is
//! `torch.optim.AdamW(fused=True)`'s kernel (decoupled weight decay, bias correction), reached
//! through `rlvr_model::optimizer`: one pass over each parameter's state, where the
//! single-tensor path makes eight.
//!
//! Mixed precision (`[model] dtype = "bf16"`): the model computes with bf16 weights, and AdamW
//! keeps what must not be rounded to bf16 in f32 — the moments, a master copy of every bf16
//! parameter, and the sum of its gradients over a step's micro-batches. Each update changes the
//! master, and the bf16 weights are the master rounded. Without the master an update smaller
//! than half a bf16 step (2⁻⁸ of the weight) would be rounded away every time: at lr 1e-6 on
//! N(0, 0.02) weights, most weights would never move. f32 parameters are their own master and
//! their `.grad` their own sum: they take no extra copy or pass.
//!
//! Updates equal `torch.optim.AdamW`'s to the bit (`tests/conformance/adamw.json`). Every backward
//! goes through [`AdamW::backward`], whose `finish` runs the training pass's
//! `TrainingLogprobs::backward`.

use std::collections::BTreeSet;

use rlvr_model::optimizer::{AdamWSlot, AdamWUpdate, clear_grad, fused_adamw};
use rlvr_model::weights::WeightFiles;
use rlvr_protocol::spec::{LrSchedule, OptimizerSection};
use tch::{Kind, Tensor};

/// AdamW's hyper-parameters.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AdamWConfig {
    pub beta1: f64,
    pub beta2: f64,
    pub eps: f64,
    pub weight_decay: f64,
}

impl AdamWConfig {
    /// From the job's `[optimizer]`.
    pub fn from_spec(optimizer: &OptimizerSection) -> Self {
        AdamWConfig {
            beta1: optimizer.adam_beta1,
            beta2: optimizer.adam_beta2,
            eps: optimizer.adam_eps,
            weight_decay: optimizer.weight_decay,
        }
    }
}

/// One parameter and AdamW's state for it.
struct Slot {
    name: String,
    /// The model's tensor: a leaf with grad, in the model's dtype.
    param: Tensor,
    /// The moments, f32 whatever the parameter's dtype.
    exp_avg: Tensor,
    exp_avg_sq: Tensor,
    /// What a parameter not in f32 keeps in f32; `None` for an f32 parameter.
    mixed: Option<Mixed>,
}

/// The f32 state of a parameter held in a lower precision (bf16).
struct Mixed {
    /// The weights the updates change; the parameter is this, rounded. Checkpointed as
    /// `master.NAME`, since the model directory's bf16 weights have lost its low bits.
    master: Tensor,
    /// The sum of the parameter's gradients since [`AdamW::zero_grad`], each micro-batch's
    /// added in f32 by [`AdamW::backward`] (autograd alone would sum them in bf16). Read only
    /// when `summed`: its memory is reused, not cleared, between updates.
    grad: Tensor,
    /// Whether a backward pass reached the parameter since `zero_grad`.
    summed: bool,
}

impl Slot {
    /// The f32 weights an update changes: the master of a mixed parameter, else the parameter
    /// (handles, not copies).
    fn weights(&self) -> Tensor {
        match &self.mixed {
            Some(mixed) => mixed.master.shallow_clone(),
            None => self.param.shallow_clone(),
        }
    }

    /// The f32 gradient an update reads: the f32 sum of a mixed parameter, else `.grad` (a
    /// handle, not a copy); `None` when no backward pass reached the parameter.
    fn gradient(&self) -> Option<Tensor> {
        match &self.mixed {
            Some(mixed) => mixed.summed.then(|| mixed.grad.shallow_clone()),
            None => Some(self.param.grad()).filter(Tensor::defined),
        }
    }
}

/// AdamW over named parameters: f32 moments, and f32 master weights and gradient sums for the
/// parameters that are not f32.
pub struct AdamW {
    /// In the order given to [`AdamW::new`] (the global norm's rounding depends on it).
    slots: Vec<Slot>,
    /// Updates taken so far.
    steps: i64,
    config: AdamWConfig,
}

impl AdamW {
    /// An optimizer with zero moments for `params` (leaf tensors with grad); a parameter not in
    /// f32 gets an f32 master copy of its weights.
    pub fn new(params: Vec<(String, Tensor)>, config: AdamWConfig) -> Self {
        let slots: Vec<Slot> = params
            .into_iter()
            .map(|(name, param)| {
                let f32_like = || Tensor::zeros(param.size(), (Kind::Float, param.device()));
                let mixed = (param.kind() != Kind::Float).then(|| Mixed {
                    master: tch::no_grad(|| param.detach().to_kind(Kind::Float)),
                    grad: Tensor::empty(param.size(), (Kind::Float, param.device())),
                    summed: false,
                });
                Slot { exp_avg: f32_like(), exp_avg_sq: f32_like(), mixed, name, param }
            })
            .collect();
        AdamW { slots, steps: 0, config }
    }

    /// The hyper-parameters of the next updates (a client that sets them per step: the Tinker
    /// front door's `optim_step`).
    pub fn set_config(&mut self, config: AdamWConfig) {
        self.config = config;
    }

    /// Updates taken so far.
    pub fn steps(&self) -> i64 {
        self.steps
    }

    /// Clears every parameter's gradient: sets it to none, as PyTorch's `zero_grad` does (so a
    /// parameter no backward pass reaches before the update is left alone by it, and the next
    /// backward pass hands its gradient over instead of adding it to zeros).
    pub fn zero_grad(&mut self) {
        for slot in &mut self.slots {
            clear_grad(&slot.param);
            if let Some(mixed) = &mut slot.mixed {
                mixed.summed = false;
            }
        }
    }

    /// Back-propagates `loss` (a scalar) into the gradients the next update reads: call it once
    /// per micro-batch between [`AdamW::zero_grad`] and the update. `finish` runs right after
    /// `loss.backward()`, for the part of the backward pass autograd did not record (a training
    /// pass's `TrainingLogprobs::backward`: the logits recomputed chunk by chunk, the model, and
    /// the recomputed layers of activation checkpointing). An f32 parameter's `.grad`
    /// sums the micro-batches itself; a bf16 parameter's micro-batch gradient is added to its
    /// f32 sum and its `.grad` set to none, so micro-batches are summed in f32, not in bf16.
    pub fn backward(&mut self, loss: &Tensor, finish: impl FnOnce()) {
        loss.backward();
        finish();
        tch::no_grad(|| {
            for slot in &mut self.slots {
                let Some(mixed) = &mut slot.mixed else { continue };
                let grad = slot.param.grad();
                if !grad.defined() {
                    continue;
                }
                if mixed.summed {
                    mixed.grad += &grad;
                } else {
                    mixed.grad.copy_(&grad);
                    mixed.summed = true;
                }
                clear_grad(&slot.param);
            }
        });
    }

    /// The global L2 norm of the gradients; when above `max_norm` (> 0), scales them down to it.
    /// Returns the norm before clipping. Op for op `torch.nn.utils.clip_grad_norm_` (the
    /// coefficient `max_norm / (norm + 1e-6)` computed in f32 as it does), so clipped gradients
    /// agree with it to the bit. Reads and scales the f32 gradients (a bf16 parameter's f32 sum).
    pub fn clip_grad_norm(&mut self, max_norm: f64) -> f64 {
        tch::no_grad(|| {
            let grads: Vec<Tensor> = self.slots.iter().filter_map(Slot::gradient).collect();
            if grads.is_empty() {
                return 0.0;
            }
            // `linalg.vector_norm` (what PyTorch uses) rounds differently from `norm`; a 1-D
            // input makes `linalg_norm` that vector norm whatever the gradient's shape.
            let vector_norm = |t: &Tensor| t.flatten(0, -1).linalg_norm(2.0, None::<&[i64]>, false, None);
            let norms: Vec<Tensor> = grads.iter().map(vector_norm).collect();
            let total = vector_norm(&Tensor::stack(&norms, 0));
            if max_norm > 0.0 {
                // Python's `max_norm / tensor` is `tensor.reciprocal() * max_norm`.
                let coef = ((&total + 1e-6).reciprocal() * max_norm).clamp_max(1.0);
                // Multiplying by exactly 1 changes nothing: skip the pass over every gradient.
                if coef.double_value(&[]) < 1.0 {
                    for mut grad in grads {
                        grad *= &coef;
                    }
                }
            }
            total.double_value(&[])
        })
    }

    /// One update with learning rate `lr`. Parameters without a gradient are left alone.
    /// Panics on a libtorch error (the worker reports a panic as an internal error): an update
    /// must never be skipped silently.
    ///
    /// `torch.optim.AdamW(fused=True)`'s kernel (decoupled weight decay, bias correction), so
    /// updates agree with it to the bit (tests/conformance/adamw.json): one pass over every
    /// parameter's state. An f32 parameter is updated in place; a bf16 one's master is, and the
    /// parameter becomes the master rounded to bf16.
    pub fn step(&mut self, lr: f64) {
        self.steps += 1;
        let AdamWConfig { beta1, beta2, eps, weight_decay } = self.config;
        let update = AdamWUpdate { step: self.steps, lr, beta1, beta2, weight_decay, eps };
        tch::no_grad(|| {
            // (slot, the f32 weights the update changes, their gradient)
            let updated: Vec<(&Slot, Tensor, Tensor)> = self
                .slots
                .iter()
                .filter_map(|slot| slot.gradient().map(|grad| (slot, slot.weights(), grad)))
                .collect();
            let parts: Vec<AdamWSlot<'_>> = updated
                .iter()
                .map(|(slot, weights, grad)| AdamWSlot {
                    weights,
                    grad,
                    exp_avg: &slot.exp_avg,
                    exp_avg_sq: &slot.exp_avg_sq,
                })
                .collect();
            if let Err(error) = fused_adamw(&parts, update) {
                panic!("AdamW update: {error}");
            }
            for (slot, _, _) in &updated {
                if let Some(mixed) = &slot.mixed {
                    slot.param.shallow_clone().copy_(&mixed.master);
                }
            }
        });
    }

    /// The optimizer's state as named f32 tensors, for a checkpoint: the moments
    /// (`exp_avg.NAME`, `exp_avg_sq.NAME`) and, for each parameter not in f32, its master
    /// weights (`master.NAME`).
    pub fn state_tensors(&self) -> Vec<(String, Tensor)> {
        let mut tensors = Vec::with_capacity(self.slots.len() * 3);
        for slot in &self.slots {
            let name = &slot.name;
            tensors.push((format!("exp_avg.{name}"), slot.exp_avg.shallow_clone()));
            tensors.push((format!("exp_avg_sq.{name}"), slot.exp_avg_sq.shallow_clone()));
            if let Some(mixed) = &slot.mixed {
                tensors.push((format!("master.{name}"), mixed.master.shallow_clone()));
            }
        }
        tensors
    }

    /// The gradients summed since [`AdamW::zero_grad`], f32, under their parameters' names: what a
    /// training client suspended between a backward pass and its update keeps. A parameter no
    /// backward pass reached has none.
    pub fn gradient_tensors(&self) -> Vec<(String, Tensor)> {
        self.slots
            .iter()
            .filter_map(|slot| slot.gradient().map(|grad| (slot.name.clone(), grad.to_kind(Kind::Float))))
            .collect()
    }

    /// Puts back gradients [`AdamW::gradient_tensors`] saved (after clearing any): the next update
    /// is the one the saved optimizer would have taken. Fails on a name of no parameter.
    pub fn restore_gradients(&mut self, saved: &WeightFiles) -> Result<(), String> {
        self.zero_grad();
        for name in saved.names() {
            let slot = self
                .slots
                .iter_mut()
                .find(|slot| slot.name == name)
                .ok_or_else(|| format!("gradient {name} matches no parameter"))?;
            let grad = saved
                .get(name, &slot.param.size(), slot.param.device(), Kind::Float)
                .map_err(|error| format!("gradient {name}: {error}"))?;
            match &mut slot.mixed {
                Some(mixed) => {
                    tch::no_grad(|| mixed.grad.copy_(&grad));
                    mixed.summed = true;
                }
                // d/dp Σ p·g = g exactly: the gradient lands in `.grad` as autograd would put it.
                None => (&slot.param * &grad).sum(Kind::Float).backward(),
            }
        }
        Ok(())
    }

    /// Restores a state saved by [`AdamW::state_tensors`] (a safetensors file, mapped) and the
    /// update count. Tensor by tensor: each is read from the mapping, moved to its parameter's
    /// device and copied into the state already allocated there, so a resume holds one tensor in
    /// host memory at a time — not the whole state (16 bytes a parameter: 113 GiB for 7B).
    ///
    /// The master weights of a bf16 parameter come from here, not from the model's weights
    /// (which are them rounded): they must be present, and round to the parameter as loaded. An
    /// f32 parameter must have none (the state of a bf16 run).
    pub fn load_state(&mut self, saved: &WeightFiles, steps: i64) -> Result<(), String> {
        let mut unused: BTreeSet<&str> = saved.names().collect();
        for slot in &mut self.slots {
            let name = &slot.name;
            let mut read = |key: &str, into: &mut Tensor| -> Result<bool, String> {
                if !unused.remove(key) {
                    return Ok(false);
                }
                let tensor = saved
                    .get(key, &into.size(), into.device(), Kind::Float)
                    .map_err(|error| format!("optimizer tensor {key}: {error}"))?;
                tch::no_grad(|| into.copy_(&tensor));
                Ok(true)
            };
            for (prefix, moment) in [("exp_avg", &mut slot.exp_avg), ("exp_avg_sq", &mut slot.exp_avg_sq)] {
                let key = format!("{prefix}.{name}");
                if !read(&key, moment)? {
                    return Err(format!("missing optimizer tensor {key}"));
                }
            }
            let key = format!("master.{name}");
            let kind = kind_name(slot.param.kind());
            match &mut slot.mixed {
                Some(mixed) => {
                    if !read(&key, &mut mixed.master)? {
                        return Err(format!(
                            "no master weights ({key}) for the {kind} parameter {name}: the checkpoint was \
                             written by a run whose weights were f32"
                        ));
                    }
                    if !tch::no_grad(|| mixed.master.to_kind(slot.param.kind()).equal(&slot.param)) {
                        return Err(format!(
                            "{key} does not round to the model's {name}: the optimizer state and the \
                             model are not of the same checkpoint"
                        ));
                    }
                    mixed.summed = false;
                }
                None if saved.contains(&key) => {
                    return Err(format!(
                        "master weights ({key}) for the {kind} parameter {name}: the checkpoint was \
                         written by a run whose weights were not f32"
                    ));
                }
                None => {}
            }
        }
        if let Some(extra) = unused.first() {
            return Err(format!("optimizer tensor {extra} matches no parameter"));
        }
        self.steps = steps;
        Ok(())
    }
}

/// A dtype as a spec writes it (`model.dtype`).
fn kind_name(kind: Kind) -> String {
    match kind {
        Kind::Float => "f32".to_owned(),
        Kind::BFloat16 => "bf16".to_owned(),
        Kind::Half => "f16".to_owned(),
        other => format!("{other:?}"),
    }
}

/// The learning rate at training step `step` (0-based) of `total`: linear warm-up from
/// `lr / warmup` to `lr` over the first `warmup` steps, then constant, linear decay to 0, or
/// cosine decay to 0 at `total`.
pub fn learning_rate(lr: f64, schedule: LrSchedule, warmup: u64, step: u64, total: u64) -> f64 {
    if step < warmup {
        return lr * (step + 1) as f64 / warmup as f64;
    }
    let span = total.saturating_sub(warmup).max(1) as f64;
    let progress = ((step - warmup) as f64 / span).min(1.0);
    match schedule {
        LrSchedule::Constant => lr,
        LrSchedule::Linear => lr * (1.0 - progress),
        LrSchedule::Cosine => lr * 0.5 * (1.0 + (std::f64::consts::PI * progress).cos()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    fn floats(value: &Value) -> Vec<f32> {
        value.as_array().expect("a list").iter().map(|x| x.as_f64().expect("a number") as f32).collect()
    }

    fn shaped(value: &Value, shape: &Value) -> Tensor {
        let shape: Vec<i64> = shape.as_array().unwrap().iter().map(|d| d.as_i64().unwrap()).collect();
        Tensor::from_slice(&floats(value)).view(shape.as_slice())
    }

    /// Every case of tests/conformance/adamw.json (made by `torch.optim.AdamW` and
    /// `clip_grad_norm_`): after each update the parameters, both moments and the reported norm
    /// equal PyTorch's to the bit.
    #[test]
    fn adamw_and_clipping_match_pytorch_to_the_bit() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/conformance/adamw.json");
        let document: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        let cases = document["cases"].as_array().unwrap();
        assert!(cases.len() >= 5);
        for case in cases {
            let name = case["name"].as_str().unwrap();
            let shapes = &case["shapes"];
            // In PyTorch's order: the global norm's rounding depends on it.
            let params: Vec<(String, Tensor)> = case["names"]
                .as_array()
                .unwrap()
                .iter()
                .map(|key| {
                    let key = key.as_str().unwrap();
                    (key.to_owned(), shaped(&case["params"][key], &shapes[key]).set_requires_grad(true))
                })
                .collect();
            let config = &case["config"];
            let number = |key: &str| config[key].as_f64().unwrap();
            let mut adamw = AdamW::new(
                params.iter().map(|(k, p)| (k.clone(), p.shallow_clone())).collect(),
                AdamWConfig {
                    beta1: number("beta1"),
                    beta2: number("beta2"),
                    eps: number("eps"),
                    weight_decay: number("weight_decay"),
                },
            );
            let max_norm = case["max_norm"].as_f64().unwrap();
            let lrs = case["lrs"].as_array().unwrap();
            for (update, expected) in case["expected"].as_array().unwrap().iter().enumerate() {
                for (key, param) in &params {
                    let mut grad = param.grad();
                    if !grad.defined() {
                        (param * 0.0).sum(Kind::Float).backward();
                        grad = param.grad();
                    }
                    grad.copy_(&shaped(&case["grads"][update][key], &shapes[key]));
                }
                let norm = adamw.clip_grad_norm(max_norm);
                let want_norm = expected["grad_norm"].as_f64().unwrap();
                assert_eq!(norm as f32, want_norm as f32, "{name} update {update}: gradient norm");
                adamw.step(lrs[update].as_f64().unwrap());
                for (index, (key, param)) in params.iter().enumerate() {
                    for (what, got) in [
                        ("params", param.detach()),
                        ("exp_avg", adamw.slots[index].exp_avg.shallow_clone()),
                        ("exp_avg_sq", adamw.slots[index].exp_avg_sq.shallow_clone()),
                    ] {
                        let got = Vec::<f32>::try_from(got.flatten(0, -1)).unwrap();
                        let want = floats(&expected[what][key]);
                        let worst = got.iter().zip(&want).map(|(g, w)| (g - w).abs()).fold(0f32, f32::max);
                        assert!(
                            got == want,
                            "{name} update {update}: {what}.{key} differs from PyTorch by up to {worst:e}"
                        );
                    }
                }
            }
        }
    }

    /// `n` draws of N(0, std²) from a seeded generator (Box–Muller), rounded to bf16: f32 values
    /// that a bf16 tensor holds exactly, so f32 and bf16 runs can start from the same weights
    /// and be handed the same gradients.
    fn bf16_normal(seed: u64, n: usize, std: f64) -> Tensor {
        let mut rng = rlvr_seeded::Xoshiro256pp::new(seed);
        let values: Vec<f32> = (0..n)
            .map(|_| {
                let (u1, u2) = (1.0 - rng.next_f64(), rng.next_f64());
                (std * (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()) as f32
            })
            .collect();
        Tensor::from_slice(&values).to_kind(Kind::BFloat16).to_kind(Kind::Float)
    }

    /// How a test run holds its weights.
    #[derive(Debug, Clone, Copy, PartialEq)]
    enum Precision {
        /// f32 weights.
        F32,
        /// bf16 weights, f32 master weights and f32 gradient sums: this optimizer.
        Mixed,
        /// The optimizer before master weights, reproduced: bf16 weights and bf16 gradient
        /// sums, each update made on an f32 copy of the bf16 weights and rounded back to bf16
        /// (an f32 tensor rounded after every update holds exactly those values). Without
        /// clipping only: that clipped in bf16.
        Rounded,
    }

    /// One parameter `w` trained by an [`AdamW`] of its own.
    struct Run {
        precision: Precision,
        param: Tensor,
        adamw: AdamW,
    }

    impl Run {
        fn new(precision: Precision, initial: &Tensor, config: AdamWConfig) -> Run {
            let kind = if precision == Precision::Mixed { Kind::BFloat16 } else { Kind::Float };
            let param = initial.copy().to_kind(kind).set_requires_grad(true);
            let adamw = AdamW::new(vec![("w".to_owned(), param.shallow_clone())], config);
            Run { precision, param, adamw }
        }

        /// The weights' gradient for one micro-batch is `grad` (f32 values bf16 holds exactly,
        /// which is what a bf16 parameter's gradient is).
        fn backward(&mut self, grad: &Tensor) {
            let loss = (self.param.to_kind(Kind::Float) * grad).sum(Kind::Float);
            self.adamw.backward(&loss, || ());
        }

        /// One update over micro-batches with gradients `grads`.
        fn update(&mut self, grads: &[Tensor], lr: f64, max_norm: f64) -> f64 {
            self.adamw.zero_grad();
            if self.precision == Precision::Rounded {
                assert_eq!(max_norm, 0.0, "the old optimizer clipped in bf16");
                let mut sum = Tensor::zeros(self.param.size(), (Kind::BFloat16, self.param.device()));
                for grad in grads {
                    sum += grad.to_kind(Kind::BFloat16);
                }
                self.backward(&sum.to_kind(Kind::Float));
            } else {
                for grad in grads {
                    self.backward(grad);
                }
            }
            let norm = self.adamw.clip_grad_norm(max_norm);
            self.adamw.step(lr);
            if self.precision == Precision::Rounded {
                tch::no_grad(|| self.param.copy_(&self.param.to_kind(Kind::BFloat16)));
            }
            norm
        }

        /// The f32 weights the updates change: the master of a mixed run, else the parameter.
        fn master(&self) -> Tensor {
            match &self.adamw.slots[0].mixed {
                Some(mixed) => mixed.master.copy(),
                None => self.param.detach().copy(),
            }
        }

        /// The weights the model computes with, as f32.
        fn weights(&self) -> Tensor {
            self.param.detach().to_kind(Kind::Float)
        }
    }

    /// The fraction of elements where `a` and `b` differ.
    fn changed(a: &Tensor, b: &Tensor) -> f64 {
        a.ne_tensor(b).to_kind(Kind::Double).mean(Kind::Double).double_value(&[])
    }

    /// A bf16 parameter's master weights take exactly the f32 run's updates — handed the same
    /// gradients, from the same weights, they equal its weights to the bit after every update,
    /// through weight decay, clipping and several micro-batches — and the bf16 weights are the
    /// master rounded. The first update moves every element of the master that has a gradient,
    /// even at lr 1e-6 on N(0, 0.02) weights, where a bf16 step is about 100 times the update.
    #[test]
    fn a_bf16_parameter_moves_through_its_master_exactly_as_an_f32_one_does() {
        struct Case {
            name: &'static str,
            lr: f64,
            weight_decay: f64,
            max_norm: f64,
            micro_batches: usize,
        }
        let cases = [
            Case { name: "lr 1e-6", lr: 1e-6, weight_decay: 0.0, max_norm: 0.0, micro_batches: 1 },
            Case { name: "clipped, decayed", lr: 1e-3, weight_decay: 0.1, max_norm: 1.0, micro_batches: 2 },
            Case {
                name: "three micro-batches",
                lr: 1e-4,
                weight_decay: 0.01,
                max_norm: 1e4,
                micro_batches: 3,
            },
        ];
        let n = 4096;
        let initial = bf16_normal(1, n, 0.02);
        // Every fifth element never gets a gradient.
        let has_grad = (Tensor::arange(n as i64, (Kind::Int64, tch::Device::Cpu)).remainder(5)).ne(0);
        for Case { name, lr, weight_decay, max_norm, micro_batches } in cases {
            let config = AdamWConfig { beta1: 0.9, beta2: 0.999, eps: 1e-8, weight_decay };
            let mut mixed = Run::new(Precision::Mixed, &initial, config);
            let mut f32 = Run::new(Precision::F32, &initial, config);
            for update in 0..20u64 {
                let grads: Vec<Tensor> = (0..micro_batches as u64)
                    .map(|m| bf16_normal(100 * update + m + 2, n, 1.0) * has_grad.to_kind(Kind::Float))
                    .collect();
                let before = mixed.master();
                let norms = (mixed.update(&grads, lr, max_norm), f32.update(&grads, lr, max_norm));
                assert_eq!(norms.0, norms.1, "{name}, update {update}: gradient norm");
                assert!(mixed.master().equal(&f32.master()), "{name}, update {update}: master ≠ f32 weights");
                assert!(
                    mixed.param.detach().equal(&f32.master().to_kind(Kind::BFloat16)),
                    "{name}, update {update}: the bf16 weights are not the master rounded"
                );
                let moved = mixed.master().ne_tensor(&before);
                // Adam's first update is ±lr·|g|/(|g| + eps) ≈ ±lr: every element with a gradient
                // moves (later, an element's first moment may cancel to almost nothing).
                if update == 0 {
                    assert!(
                        moved.logical_or(&has_grad.logical_not()).all().int64_value(&[]) == 1,
                        "{name}: an element with a gradient did not move"
                    );
                }
                if weight_decay == 0.0 {
                    assert!(
                        moved.logical_and(&has_grad.logical_not()).any().int64_value(&[]) == 0,
                        "{name}, update {update}: an element without a gradient moved"
                    );
                }
            }
        }
    }

    /// 100 updates at lr 1e-6 on N(0, 0.02) weights, the gradient a fixed direction plus as much
    /// noise (one micro-batch, no clipping, no decay): every f32 weight changes, and with master
    /// weights so do most bf16 weights (they are the f32 weights rounded); rounding every update
    /// to bf16, as the optimizer did before, changes about 2% of them (those so close to 0 that
    /// a bf16 step there is below 1e-6). Measured: f32 100%, bf16 with a master 61.5%, bf16
    /// rounded every update 2.0%.
    #[test]
    fn at_lr_1e_6_bf16_weights_move_with_a_master_and_hardly_without() {
        let n = 1 << 16;
        let initial = bf16_normal(1, n, 0.02);
        let direction = bf16_normal(2, n, 1.0);
        let config = AdamWConfig { beta1: 0.9, beta2: 0.999, eps: 1e-8, weight_decay: 0.0 };
        let mut runs =
            [Precision::F32, Precision::Mixed, Precision::Rounded].map(|p| Run::new(p, &initial, config));
        for update in 0..100 {
            let grad =
                (&direction + bf16_normal(update + 3, n, 1.0)).to_kind(Kind::BFloat16).to_kind(Kind::Float);
            for run in &mut runs {
                run.update(std::slice::from_ref(&grad), 1e-6, 0.0);
            }
        }
        let [f32, mixed, rounded] = [0, 1, 2].map(|i| changed(&runs[i].weights(), &initial));
        eprintln!(
            "weights changed after 100 updates at lr 1e-6: f32 {f32:.4}, bf16 with a master {mixed:.4}, bf16 rounded {rounded:.4}"
        );
        assert!(f32 > 0.999, "f32: {f32}");
        assert!(mixed > 0.5, "bf16 with a master: {mixed}");
        assert!(rounded < 0.05 && mixed > 20.0 * rounded, "bf16 rounded every update: {rounded}");
        assert!(
            runs[1].param.detach().equal(&runs[0].param.detach().to_kind(Kind::BFloat16)),
            "the bf16 weights are the f32 run's, rounded"
        );
    }

    /// The gradients of a step's micro-batches are summed in f32: the sum the update reads equals
    /// the f32 sum of the micro-batches' gradients, where summing in bf16 (what autograd does
    /// into a bf16 `.grad`) loses bits.
    #[test]
    fn micro_batch_gradients_are_summed_in_f32() {
        let n = 4096;
        let check = |micro_batches: u64, bf16_loses: bool| {
            let config = AdamWConfig { beta1: 0.9, beta2: 0.999, eps: 1e-8, weight_decay: 0.0 };
            let mut run = Run::new(Precision::Mixed, &bf16_normal(1, n, 0.02), config);
            let grads: Vec<Tensor> = (0..micro_batches).map(|m| bf16_normal(m + 10, n, 1.0)).collect();
            run.adamw.zero_grad();
            for grad in &grads {
                run.backward(grad);
            }
            let summed = run.adamw.slots[0].gradient().expect("a gradient");
            assert_eq!(summed.kind(), Kind::Float);
            let mut f32_sum = Tensor::zeros([n as i64], (Kind::Float, tch::Device::Cpu));
            let mut bf16_sum = Tensor::zeros([n as i64], (Kind::BFloat16, tch::Device::Cpu));
            for grad in &grads {
                f32_sum += grad;
                bf16_sum += grad.to_kind(Kind::BFloat16);
            }
            assert!(summed.equal(&f32_sum), "{micro_batches} micro-batches: not the f32 sum");
            let lost = changed(&bf16_sum.to_kind(Kind::Float), &f32_sum);
            assert_eq!(lost > 0.0, bf16_loses, "{micro_batches} micro-batches: bf16 sum differs at {lost}");
            // The bf16 `.grad` went into the sum and is none: the next micro-batch starts afresh.
            assert!(!run.param.grad().defined(), "{micro_batches} micro-batches: a bf16 .grad is left");
        };
        check(1, false);
        check(2, true);
        check(4, true);
    }

    /// A bf16 parameter's f32 master is saved with the moments (`master.NAME`; an f32 parameter
    /// has none) and restored from them: an optimizer rebuilt from the saved file and the bf16
    /// weights, as a resume does, continues exactly as the one that was never stopped.
    #[test]
    fn master_weights_are_saved_and_restored_to_the_bit() {
        let n = 4096;
        let config = AdamWConfig { beta1: 0.9, beta2: 0.999, eps: 1e-8, weight_decay: 0.01 };
        let params = || {
            vec![
                ("head".to_owned(), bf16_normal(5, 8, 0.02).set_requires_grad(true)),
                ("w".to_owned(), bf16_normal(1, n, 0.02).to_kind(Kind::BFloat16).set_requires_grad(true)),
            ]
        };
        let update = |adamw: &mut AdamW, params: &[(String, Tensor)], step: u64| {
            adamw.zero_grad();
            for micro_batch in 0..2 {
                let loss = params
                    .iter()
                    .enumerate()
                    .map(|(i, (_, p))| {
                        let grad = bf16_normal(10 * step + 2 * micro_batch + i as u64 + 7, p.numel(), 1.0);
                        (p.to_kind(Kind::Float) * grad).sum(Kind::Float)
                    })
                    .fold(Tensor::from(0f32), |a, b| a + b);
                adamw.backward(&loss, || ());
            }
            adamw.clip_grad_norm(1.0);
            adamw.step(1e-5);
        };
        let straight_params = params();
        let handles = |params: &[(String, Tensor)]| -> Vec<(String, Tensor)> {
            params.iter().map(|(name, p)| (name.clone(), p.shallow_clone())).collect()
        };
        let mut straight = AdamW::new(handles(&straight_params), config);
        for step in 0..3 {
            update(&mut straight, &straight_params, step);
        }
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("optimizer.safetensors");
        Tensor::write_safetensors(&straight.state_tensors(), &file).unwrap();
        let saved = WeightFiles::open_file(&file).unwrap();
        let mut names: Vec<&str> = saved.names().collect();
        names.sort_unstable();
        assert_eq!(names, ["exp_avg.head", "exp_avg.w", "exp_avg_sq.head", "exp_avg_sq.w", "master.w"]);
        // The model directory's weights: the bf16 weights as they are now.
        let resumed_params: Vec<(String, Tensor)> = straight_params
            .iter()
            .map(|(name, p)| (name.clone(), p.detach().copy().set_requires_grad(true)))
            .collect();
        let mut resumed = AdamW::new(handles(&resumed_params), config);
        resumed.load_state(&saved, straight.steps()).unwrap();
        for step in 3..6 {
            update(&mut straight, &straight_params, step);
            update(&mut resumed, &resumed_params, step);
        }
        for (a, b) in straight.state_tensors().iter().zip(resumed.state_tensors()) {
            assert!(a.1.equal(&b.1), "{} differs after resume", a.0);
        }
        for ((name, a), (_, b)) in straight_params.iter().zip(&resumed_params) {
            assert!(a.detach().equal(&b.detach()), "{name} differs after resume");
        }
    }

    /// A saved state that does not fit the run's dtype is refused, naming the tensor and why:
    /// a bf16 run needs master weights (the model's bf16 weights lack their low bits), an f32
    /// run has none, and the master must round to the weights it is restored beside.
    #[test]
    fn a_state_whose_master_weights_do_not_fit_the_dtype_is_refused() {
        let n = 64;
        let config = AdamWConfig { beta1: 0.9, beta2: 0.999, eps: 1e-8, weight_decay: 0.0 };
        let trained = |precision: Precision| {
            let mut run = Run::new(precision, &bf16_normal(1, n, 0.02), config);
            run.update(&[bf16_normal(2, n, 1.0)], 1e-3, 0.0);
            run
        };
        let check = |saved_by: Precision, loaded_by: Precision, weights_seed: u64, expected: &str| {
            let dir = tempfile::tempdir().unwrap();
            let file = dir.path().join("optimizer.safetensors");
            Tensor::write_safetensors(&trained(saved_by).adamw.state_tensors(), &file).unwrap();
            let saved = WeightFiles::open_file(&file).unwrap();
            let mut loading = Run::new(loaded_by, &bf16_normal(weights_seed, n, 0.02), config);
            let error = loading.adamw.load_state(&saved, 1).unwrap_err();
            assert_eq!(error, expected, "saved by {saved_by:?}, loaded by {loaded_by:?}");
        };
        check(
            Precision::F32,
            Precision::Mixed,
            1,
            "no master weights (master.w) for the bf16 parameter w: the checkpoint was written by a run \
             whose weights were f32",
        );
        check(
            Precision::Mixed,
            Precision::F32,
            1,
            "master weights (master.w) for the f32 parameter w: the checkpoint was written by a run whose \
             weights were not f32",
        );
        check(
            Precision::Mixed,
            Precision::Mixed,
            3,
            "master.w does not round to the model's w: the optimizer state and the model are not of the \
             same checkpoint",
        );
    }
}
