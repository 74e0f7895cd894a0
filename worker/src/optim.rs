//! AdamW, the learning-rate schedule and gradient clipping, over plain tensors.
//!
//! Written here rather than using `tch::nn::Optimizer` because its state (the moments) lives inside
//! libtorch where tch cannot read or restore it, and exact resume needs both. The update follows
//! `torch.optim.AdamW` (decoupled weight decay, bias correction) operation for operation.

use std::collections::HashMap;

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

/// AdamW over named parameters; the moments are f32 whatever the parameters' dtype.
pub struct AdamW {
    params: Vec<(String, Tensor)>,
    exp_avg: Vec<Tensor>,
    exp_avg_sq: Vec<Tensor>,
    /// Two f32 buffers as large as the largest parameter: every update's intermediates are
    /// written into views of these instead of fresh tensors, since a fresh tensor of a large
    /// parameter costs an allocation and its page faults on every step.
    scratch: [Tensor; 2],
    /// Updates taken so far.
    steps: i64,
    config: AdamWConfig,
}

impl AdamW {
    /// An optimizer with zero moments for `params` (leaf tensors with grad).
    pub fn new(params: Vec<(String, Tensor)>, config: AdamWConfig) -> Self {
        let zeros = |p: &Tensor| Tensor::zeros(p.size(), (Kind::Float, p.device()));
        let exp_avg = params.iter().map(|(_, p)| zeros(p)).collect();
        let exp_avg_sq = params.iter().map(|(_, p)| zeros(p)).collect();
        let largest = params.iter().map(|(_, p)| p.numel()).max().unwrap_or(0) as i64;
        let device = params.first().map_or(tch::Device::Cpu, |(_, p)| p.device());
        let scratch = [(); 2].map(|()| Tensor::empty([largest], (Kind::Float, device)));
        AdamW { params, exp_avg, exp_avg_sq, scratch, steps: 0, config }
    }

    /// Updates taken so far.
    pub fn steps(&self) -> i64 {
        self.steps
    }

    /// Clears every parameter's gradient.
    pub fn zero_grad(&mut self) {
        for (_, param) in &mut self.params {
            param.zero_grad();
        }
    }

    /// The global L2 norm of the gradients; when above `max_norm` (> 0), scales them down to it.
    /// Returns the norm before clipping. Op for op `torch.nn.utils.clip_grad_norm_` (the
    /// coefficient `max_norm / (norm + 1e-6)` computed in f32 as it does), so clipped gradients
    /// agree with it to the bit.
    pub fn clip_grad_norm(&mut self, max_norm: f64) -> f64 {
        tch::no_grad(|| {
            let grads: Vec<Tensor> =
                self.params.iter().map(|(_, p)| p.grad()).filter(Tensor::defined).collect();
            if grads.is_empty() {
                return 0.0;
            }
            // `linalg.vector_norm` (what PyTorch uses) rounds differently from `norm`; a 1-D
            // input makes `linalg_norm` that vector norm whatever the gradient's shape.
            let vector_norm = |t: &Tensor| {
                t.to_kind(Kind::Float).flatten(0, -1).linalg_norm(2.0, None::<&[i64]>, false, None)
            };
            let norms: Vec<Tensor> = grads.iter().map(vector_norm).collect();
            let total = vector_norm(&Tensor::stack(&norms, 0));
            if max_norm > 0.0 {
                // Python's `max_norm / tensor` is `tensor.reciprocal() * max_norm`.
                let coef = ((&total + 1e-6).reciprocal() * max_norm).clamp_max(1.0);
                // Multiplying by exactly 1 changes nothing: skip the pass over every gradient.
                if coef.double_value(&[]) < 1.0 {
                    for mut grad in grads {
                        grad *= coef.to_kind(grad.kind());
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
    /// Op for op `torch.optim.AdamW`'s single-tensor path (decoupled weight decay, bias
    /// correction), so updates agree with it to the bit (tests/conformance/adamw.json); each
    /// intermediate goes to a scratch view, and the weight-decay pass is skipped when it would
    /// multiply by exactly 1.
    pub fn step(&mut self, lr: f64) {
        self.steps += 1;
        let AdamWConfig { beta1, beta2, eps, weight_decay } = self.config;
        // `powf`, not `powi`: Python's `beta ** step` is C's `pow` on floats.
        let bias_correction1 = 1.0 - beta1.powf(self.steps as f64);
        let bias_correction2_sqrt = (1.0 - beta2.powf(self.steps as f64)).powf(0.5);
        let step_size = lr / bias_correction1;
        let decay = 1.0 - lr * weight_decay;
        tch::no_grad(|| {
            for (((_, param), exp_avg), exp_avg_sq) in
                self.params.iter_mut().zip(&mut self.exp_avg).zip(&mut self.exp_avg_sq)
            {
                let grad = param.grad();
                if !grad.defined() {
                    continue;
                }
                // A view of scratch buffer `i` shaped like the parameter.
                let view = |i: usize| {
                    self.scratch[i].narrow(0, 0, param.numel() as i64).view(param.size().as_slice())
                };
                let (mut first, second) = (view(0), view(1));
                let grad = grad.to_kind(Kind::Float);
                // f32 parameters are updated in place; others through an f32 master copy. Each
                // in-place call returns an alias of its target (dropped: `let _`) and panics on
                // a libtorch error.
                let mut master = param.to_kind(Kind::Float);
                if decay != 1.0 {
                    master *= decay;
                }
                let _ = exp_avg.lerp_(&grad, 1.0 - beta1);
                // exp_avg_sq = beta2 · exp_avg_sq + (1 − beta2) · grad²
                *exp_avg_sq *= beta2;
                let _ = grad.mul_scalar_out(&first, 1.0 - beta2);
                let _ = exp_avg_sq.addcmul_(&first, &grad);
                // denom = sqrt(exp_avg_sq) / sqrt(bias_correction2) + eps
                let _ = exp_avg_sq.sqrt_out(&first);
                first /= bias_correction2_sqrt;
                first += eps;
                // param += (−step_size · exp_avg) / denom
                let _ = exp_avg.mul_scalar_out(&second, -step_size);
                let _ = master.addcdiv_(&second, &first);
                if param.kind() != Kind::Float {
                    param.copy_(&master);
                }
            }
        });
    }

    /// The moments as named tensors (`exp_avg.NAME`, `exp_avg_sq.NAME`), for a checkpoint.
    pub fn state_tensors(&self) -> Vec<(String, Tensor)> {
        let mut tensors = Vec::with_capacity(self.params.len() * 2);
        for ((name, _), (m, v)) in self.params.iter().zip(self.exp_avg.iter().zip(&self.exp_avg_sq)) {
            tensors.push((format!("exp_avg.{name}"), m.shallow_clone()));
            tensors.push((format!("exp_avg_sq.{name}"), v.shallow_clone()));
        }
        tensors
    }

    /// Restores moments saved by [`AdamW::state_tensors`] and the update count.
    pub fn load_state(&mut self, mut tensors: HashMap<String, Tensor>, steps: i64) -> Result<(), String> {
        for ((name, param), (m, v)) in
            self.params.iter().zip(self.exp_avg.iter_mut().zip(&mut self.exp_avg_sq))
        {
            for (prefix, slot) in [("exp_avg", m), ("exp_avg_sq", v)] {
                let key = format!("{prefix}.{name}");
                let saved = tensors.remove(&key).ok_or_else(|| format!("missing optimizer tensor {key}"))?;
                if saved.size() != param.size() {
                    return Err(format!(
                        "optimizer tensor {key}: expected shape {:?}, found {:?}",
                        param.size(),
                        saved.size()
                    ));
                }
                *slot = saved.to_device(param.device()).to_kind(Kind::Float);
            }
        }
        if let Some(extra) = tensors.keys().next() {
            return Err(format!("optimizer tensor {extra} matches no parameter"));
        }
        self.steps = steps;
        Ok(())
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
                        ("exp_avg", adamw.exp_avg[index].shallow_clone()),
                        ("exp_avg_sq", adamw.exp_avg_sq[index].shallow_clone()),
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
}
