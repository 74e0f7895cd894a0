//! AdamW, the learning-rate schedule and gradient clipping, over plain tensors.
//!
//! Written here rather than using `tch::nn::Optimizer` because its state (the moments) lives inside
//! libtorch where tch cannot read or restore it, and exact resume needs both. The update follows
//! `torch.optim.AdamW` (decoupled weight decay, bias correction) operation for operation.

use std::collections::HashMap;

use rlvr_queue::spec::{LrSchedule, OptimizerSection};
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
        AdamW { params, exp_avg, exp_avg_sq, steps: 0, config }
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

    /// The global L2 norm of the gradients; when above `max_norm` (> 0), scales them down to it
    /// like `torch.nn.utils.clip_grad_norm_`. Returns the norm before clipping.
    pub fn clip_grad_norm(&mut self, max_norm: f64) -> f64 {
        tch::no_grad(|| {
            let grads: Vec<Tensor> =
                self.params.iter().map(|(_, p)| p.grad()).filter(Tensor::defined).collect();
            if grads.is_empty() {
                return 0.0;
            }
            let norms: Vec<Tensor> = grads.iter().map(|g| g.to_kind(Kind::Float).norm()).collect();
            let total = Tensor::stack(&norms, 0).norm().double_value(&[]);
            if max_norm > 0.0 {
                let coef = (max_norm / (total + 1e-6)).min(1.0);
                if coef < 1.0 {
                    for mut grad in grads {
                        let _ = grad.f_mul_scalar_(coef);
                    }
                }
            }
            total
        })
    }

    /// One update with learning rate `lr`. Parameters without a gradient are left alone.
    pub fn step(&mut self, lr: f64) {
        self.steps += 1;
        let AdamWConfig { beta1, beta2, eps, weight_decay } = self.config;
        let bias_correction1 = 1.0 - beta1.powi(self.steps as i32);
        let bias_correction2 = 1.0 - beta2.powi(self.steps as i32);
        let step_size = lr / bias_correction1;
        tch::no_grad(|| {
            for (((_, param), exp_avg), exp_avg_sq) in
                self.params.iter_mut().zip(&mut self.exp_avg).zip(&mut self.exp_avg_sq)
            {
                let grad = param.grad();
                if !grad.defined() {
                    continue;
                }
                let grad = grad.to_kind(Kind::Float);
                let mut master = param.to_kind(Kind::Float);
                let _ = master.f_mul_scalar_(1.0 - lr * weight_decay);
                let _ = exp_avg.lerp_(&grad, 1.0 - beta1);
                let _ = exp_avg_sq.f_mul_scalar_(beta2);
                let _ = exp_avg_sq.f_add_(&(&grad * &grad * (1.0 - beta2)));
                let denom = exp_avg_sq.sqrt() / bias_correction2.sqrt() + eps;
                let _ = master.addcdiv_(&(&*exp_avg * -step_size), &denom);
                param.copy_(&master.to_kind(param.kind()));
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
