//! Tensors from the host's handles, checked before any arithmetic: every `[B, T]` tensor of a call
//! must have the shape, dtype and device of the call's first tensor, and the mask must be 0/1 with
//! every row's ones from column 0 (a multi-turn episode's may have zeros between them: the
//! environment's replies). A mismatch is an error that names the tensor and both shapes, never a
//! panic inside libtorch.

use rlvr_plugin_api::{PluginError, ROption, TensorHandle};
use rlvr_plugin_tensor::TensorHandleExt;
use tch::{Device, Kind, Tensor};

/// A tensor of the current call from its borrowed handle.
fn borrowed(handle: TensorHandle) -> Tensor {
    // SAFETY: every handle in `AdvantageInputs` and `LossInputs` is a live tensor the host keeps
    // for the whole call (the plugin-api contract); `to_tensor` takes a reference of its own and
    // leaves the host's intact.
    unsafe { handle.to_tensor() }
}

/// What every `[B, T]` tensor of one call must match: the first tensor's shape, dtype and device.
#[derive(Debug)]
pub struct Like {
    name: &'static str,
    size: Vec<i64>,
    kind: Kind,
    device: Device,
}

impl Like {
    /// The first tensor of a call (`logprobs`, or `old_logprobs` for advantages): `[B, T]` with
    /// `B ≥ 1`, floating point.
    pub fn first(name: &'static str, handle: TensorHandle) -> Result<(Like, Tensor), PluginError> {
        let tensor = borrowed(handle);
        let size = tensor.size();
        if size.len() != 2 {
            return Err(PluginError::invalid_input(format!(
                "{name}: expected a [B, T] tensor, got shape {size:?}"
            )));
        }
        if size[0] == 0 {
            return Err(PluginError::invalid_input(format!(
                "{name}: expected at least one row, got shape {size:?}"
            )));
        }
        if !tensor.is_floating_point() {
            return Err(PluginError::invalid_input(format!(
                "{name}: expected a floating-point tensor, got dtype {:?}",
                tensor.kind()
            )));
        }
        let like = Like { name, size, kind: tensor.kind(), device: tensor.device() };
        Ok((like, tensor))
    }

    /// Rows (`B`).
    pub fn rows(&self) -> usize {
        self.size[0] as usize
    }

    /// Columns (`T`).
    pub fn cols(&self) -> usize {
        self.size[1] as usize
    }

    /// The dtype every tensor of the call has.
    pub fn kind(&self) -> Kind {
        self.kind
    }

    /// The device every tensor of the call is on.
    pub fn device(&self) -> Device {
        self.device
    }

    /// Another `[B, T]` tensor of the call, checked.
    pub fn tensor(&self, name: &str, handle: TensorHandle) -> Result<Tensor, PluginError> {
        let tensor = borrowed(handle);
        self.check_shape(name, &tensor)?;
        if tensor.kind() != self.kind {
            return Err(PluginError::invalid_input(format!(
                "{name}: expected dtype {:?} like {}, got {:?}",
                self.kind,
                self.name,
                tensor.kind()
            )));
        }
        Ok(tensor)
    }

    /// A tensor the plugin cannot do without; `why` says what it is for.
    pub fn required(
        &self,
        name: &str,
        handle: ROption<TensorHandle>,
        why: &str,
    ) -> Result<Tensor, PluginError> {
        match handle {
            ROption::RSome(handle) => self.tensor(name, handle),
            ROption::RNone => Err(PluginError::invalid_input(format!("{name}: required ({why}), got none"))),
        }
    }

    /// A tensor the plugin uses when given (e.g. the reference, for a metric only).
    pub fn optional(&self, name: &str, handle: ROption<TensorHandle>) -> Result<Option<Tensor>, PluginError> {
        match handle {
            ROption::RSome(handle) => self.tensor(name, handle).map(Some),
            ROption::RNone => Ok(None),
        }
    }

    /// A tensor required when `required_for` says what needs it, else used when given.
    pub fn needed(
        &self,
        name: &str,
        handle: ROption<TensorHandle>,
        required_for: Option<&str>,
    ) -> Result<Option<Tensor>, PluginError> {
        match required_for {
            Some(why) => self.required(name, handle, why).map(Some),
            None => self.optional(name, handle),
        }
    }

    /// The call's mask: any dtype holding only 0 and 1. A row's ones are its trained tokens: a
    /// completion's first `len` columns, or a multi-turn episode's turns, with zeros between them
    /// where the environment's replies are; zeros after its last one are padding.
    pub fn mask(&self, handle: TensorHandle) -> Result<Mask, PluginError> {
        let mask = borrowed(handle);
        self.check_shape("mask", &mask)?;
        let (rows, cols) = (self.rows(), self.cols());
        let host = Vec::<f64>::try_from(&mask.to_kind(Kind::Double).to_device(Device::Cpu).reshape([-1]))
            .map_err(|error| PluginError::internal(format!("mask: cannot read it back: {error}")))?;
        let mut lengths = Vec::with_capacity(rows);
        let mut first_gap = None;
        for (row, values) in host.chunks(cols.max(1)).take(rows).enumerate() {
            if let Some(value) = values.iter().find(|&&value| value != 0.0 && value != 1.0) {
                return Err(PluginError::invalid_input(format!(
                    "mask: expected only 0 and 1, got {value} in row {row}"
                )));
            }
            lengths.push(values.iter().filter(|&&value| value == 1.0).count());
            let leading = values.iter().take_while(|&&value| value == 1.0).count();
            if values[leading..].contains(&1.0) && first_gap.is_none() {
                first_gap = Some(row);
            }
        }
        if cols == 0 {
            lengths = vec![0; rows];
        }
        let ones = mask.to_kind(self.kind);
        let padding = ones.eq(0.0);
        Ok(Mask { ones, padding, lengths, first_gap, kind: self.kind, device: self.device })
    }

    fn check_shape(&self, name: &str, tensor: &Tensor) -> Result<(), PluginError> {
        let size = tensor.size();
        if size != self.size {
            return Err(PluginError::invalid_input(format!(
                "{name}: expected shape {:?} like {}, got {size:?}",
                self.size, self.name
            )));
        }
        if tensor.device() != self.device {
            return Err(PluginError::invalid_input(format!(
                "{name}: expected device {:?} like {}, got {:?}",
                self.device,
                self.name,
                tensor.device()
            )));
        }
        Ok(())
    }
}

/// A checked mask, in the call's dtype, with each row's length read back once.
#[derive(Debug)]
pub struct Mask {
    ones: Tensor,
    padding: Tensor,
    lengths: Vec<usize>,
    /// The first row with a zero between ones (a multi-turn episode's), if any.
    first_gap: Option<usize>,
    kind: Kind,
    device: Device,
}

impl Mask {
    /// 1 on completion tokens, 0 on padding, in the call's dtype.
    pub fn ones(&self) -> &Tensor {
        &self.ones
    }

    /// Trained tokens (ones) of each row.
    pub fn lengths(&self) -> &[usize] {
        &self.lengths
    }

    /// Refuses a mask with a zero between ones: for a plugin whose arithmetic is by position
    /// (a row's tokens are its columns `0..len`), such as PPO's per-token credit.
    pub fn contiguous(&self, why: &str) -> Result<(), PluginError> {
        match self.first_gap {
            None => Ok(()),
            Some(row) => Err(PluginError::invalid_input(format!(
                "mask: row {row} has a 0 between its 1s (a multi-turn episode's turns); {why}"
            ))),
        }
    }

    /// Completion tokens of this call.
    pub fn tokens(&self) -> usize {
        self.lengths.iter().sum()
    }

    /// `x` with padding set to 0, so whatever the host left there (even NaN) reaches neither the
    /// loss nor its gradient.
    pub fn clean(&self, x: &Tensor) -> Tensor {
        x.masked_fill(&self.padding, 0.0)
    }

    /// `Σ_t mask·x` of each row, `[B]`.
    pub fn row_sums(&self, x: &Tensor) -> Tensor {
        (self.clean(x) * &self.ones).sum_dim_intlist(1, false, self.kind)
    }

    /// The mean of `x` over this call's completion tokens, for a metric; 0 without tokens.
    pub fn mean(&self, x: &Tensor) -> f64 {
        let total = (self.clean(&x.detach()) * &self.ones).sum(Kind::Double).double_value(&[]);
        total / self.tokens().max(1) as f64
    }

    /// The fraction of completion tokens where the boolean `condition` holds; 0 without tokens.
    pub fn fraction(&self, condition: &Tensor) -> f64 {
        self.mean(&condition.to_kind(self.kind))
    }

    /// A `[B, T]` tensor in the call's dtype and device from row-major host values.
    pub fn from_host(&self, values: &[f64]) -> Tensor {
        let shape = [self.lengths.len() as i64, self.ones.size()[1]];
        Tensor::from_slice(values).reshape(shape).to_kind(self.kind).to_device(self.device)
    }

    /// Row-major host values of a `[B, T]` tensor, padding read as 0.
    pub fn to_host(&self, x: &Tensor) -> Result<Vec<f64>, PluginError> {
        Vec::<f64>::try_from(&self.clean(x).to_kind(Kind::Double).to_device(Device::Cpu).reshape([-1]))
            .map_err(|error| PluginError::internal(format!("cannot read a tensor back: {error}")))
    }

    /// One value per row repeated over the row's completion tokens (0 on padding), `[B, T]`.
    pub fn repeat_rows(&self, per_row: &[f64]) -> Tensor {
        let column = Tensor::from_slice(per_row).to_kind(self.kind).to_device(self.device).unsqueeze(1);
        column * &self.ones
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn like(tensor: &Tensor) -> Like {
        Like::first("logprobs", TensorHandle::borrow(tensor)).unwrap().0
    }

    #[test]
    fn shape_dtype_and_padding_are_checked_by_name() {
        let logprobs = Tensor::zeros([2, 3], (Kind::Double, Device::Cpu));
        let like = like(&logprobs);
        let short = Tensor::zeros([2, 2], (Kind::Double, Device::Cpu));
        assert_eq!(
            like.tensor("old_logprobs", TensorHandle::borrow(&short)).unwrap_err().message,
            "old_logprobs: expected shape [2, 3] like logprobs, got [2, 2]"
        );
        let single = Tensor::zeros([2, 3], (Kind::Float, Device::Cpu));
        assert!(
            like.tensor("ref_logprobs", TensorHandle::borrow(&single)).unwrap_err().message.contains("dtype")
        );
        let mask = Tensor::from_slice(&[1i64, 1, 0, 0, 0, 0]).reshape([2, 3]);
        let read = like.mask(TensorHandle::borrow(&mask)).unwrap();
        assert_eq!(read.lengths(), [2, 0]);
        assert!(read.contiguous("why").is_ok());
        // A multi-turn episode's: a turn, a reply (0), a turn; its length counts the turns' tokens.
        let gaps = Tensor::from_slice(&[1.0, 1.0, 0.0, 1.0, 0.0, 1.0]).reshape([2, 3]);
        let read = like.mask(TensorHandle::borrow(&gaps)).unwrap();
        assert_eq!(read.lengths(), [2, 2]);
        assert_eq!(
            read.contiguous("PPO assigns credit by position").unwrap_err().message,
            "mask: row 1 has a 0 between its 1s (a multi-turn episode's turns); PPO assigns credit by position"
        );
        let not_binary = Tensor::from_slice(&[1.0, 0.5, 0.0, 0.0, 0.0, 0.0]).reshape([2, 3]);
        assert!(
            like.mask(TensorHandle::borrow(&not_binary)).unwrap_err().message.contains("got 0.5 in row 0")
        );
        let flat = Tensor::zeros([3], (Kind::Double, Device::Cpu));
        assert!(Like::first("logprobs", TensorHandle::borrow(&flat)).unwrap_err().message.contains("[B, T]"));
    }

    #[test]
    fn nan_on_padding_reaches_neither_value_nor_gradient() {
        let logprobs = Tensor::from_slice(&[-1.0, f64::NAN]).reshape([1, 2]).set_requires_grad(true);
        let like = like(&logprobs);
        let mask = like.mask(TensorHandle::borrow(&Tensor::from_slice(&[1.0, 0.0]).reshape([1, 2]))).unwrap();
        // Plugins clean their inputs before any arithmetic: exp(NaN) would poison the gradient.
        let sum = mask.row_sums(&mask.clean(&logprobs).exp()).sum(Kind::Double);
        sum.backward();
        assert!((sum.double_value(&[]) - (-1.0f64).exp()).abs() < 1e-12);
        assert_eq!(Vec::<f64>::try_from(&logprobs.grad().reshape([-1])).unwrap()[1], 0.0);
    }
}
