//! What the optimizer plugins (grpo, rloo, ppo, dpo, sft) share, written once: config parsing and
//! range checks with messages that name the key ([`config`]), checked tensors from the host's
//! handles ([`inputs`]), the KL estimators, masked aggregation and the clipped policy loss
//! ([`losses`]), and the sequence-level pieces of online methods: groups, KL folded into the
//! reward, per-row advantages repeated over a row's tokens ([`rewards`]).
//!
//! This is an `rlib` linked into each plugin, not a plugin: it builds no `.so`, so the registry
//! (which loads only `*.so` files) never sees it. Every formula lives here or in exactly one
//! plugin; the plugins' READMEs cite the papers.
//!
//! The golden values come from `tests/conformance/make_goldens.py`, an independent PyTorch
//! implementation written from the papers; `tests/tests/conformance.rs` checks every plugin against
//! them in f64 and f32, and `verl_computes_the_same_losses_and_gradients` holds dual clip, GSPO and
//! CISPO to verl's own functions.
#![deny(missing_docs)]

pub mod config;
pub mod inputs;
pub mod losses;
pub mod rewards;

use rlvr_plugin_api::{AdvantageOutput, LossOutput, Metric, PluginError, ROption, RVec, TensorHandle};
use rlvr_plugin_tensor::TensorHandleExt;
use tch::Tensor;

/// A named scalar for the step's metrics.
pub fn metric(name: &str, value: f64) -> Metric {
    Metric { name: name.into(), value }
}

/// Hands a loss and its metrics to the host.
pub fn loss_output(loss: Tensor, metrics: Vec<Metric>) -> LossOutput {
    LossOutput { loss: TensorHandle::into_owned(loss), metrics: RVec::from(metrics) }
}

/// Hands advantages (and returns) and their metrics to the host; the tensors carry no grad.
pub fn advantage_output(
    advantages: Tensor,
    returns: Option<Tensor>,
    metrics: Vec<Metric>,
) -> AdvantageOutput {
    AdvantageOutput {
        advantages: TensorHandle::into_owned(advantages.detach()),
        returns: match returns {
            Some(returns) => ROption::RSome(TensorHandle::into_owned(returns.detach())),
            None => ROption::RNone,
        },
        metrics: RVec::from(metrics),
    }
}

/// For self-tests: fails unless `got` is within `1e-9` (absolute or relative) of `want`.
pub fn expect_close(what: &str, got: f64, want: f64) -> Result<(), PluginError> {
    if (got - want).abs() <= 1e-9 * want.abs().max(1.0) {
        Ok(())
    } else {
        Err(PluginError::self_test_failed(format!("{what}: expected {want}, got {got}")))
    }
}

/// For self-tests: the values of a tensor, flattened, as `f64`.
pub fn values(tensor: &Tensor) -> Result<Vec<f64>, PluginError> {
    Vec::<f64>::try_from(&tensor.to_kind(tch::Kind::Double).to_device(tch::Device::Cpu).reshape([-1]))
        .map_err(|error| PluginError::internal(format!("cannot read a tensor back: {error}")))
}

/// For self-tests: compares every value of `got` with `want`.
pub fn expect_all_close(what: &str, got: &Tensor, want: &[f64]) -> Result<(), PluginError> {
    let got = values(got)?;
    if got.len() != want.len() {
        return Err(PluginError::self_test_failed(format!(
            "{what}: expected {} values, got {}",
            want.len(),
            got.len()
        )));
    }
    for (index, (got, want)) in got.iter().zip(want).enumerate() {
        expect_close(&format!("{what}[{index}]"), *got, *want)?;
    }
    Ok(())
}
