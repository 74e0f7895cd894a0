//! The sampler's random numbers: xoshiro256++ from `rlvr-seeded`, used for sampling and for the
//! built-in model's weights.
//!
//! Our own generator rather than torch's global one: its whole state is four `u64`s that the
//! worker checkpoints with serde, so a resumed job draws exactly the numbers it would have drawn,
//! and nothing depends on libtorch's RNG implementation or on who else used it.

/// The sampler's random-number generator. Same seed ⇒ same sequence, on any machine.
pub type SamplerRng = rlvr_seeded::Xoshiro256pp;
