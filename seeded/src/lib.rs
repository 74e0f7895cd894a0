//! Seeded random numbers that are the same on every platform, toolchain and release.
//!
//! Every seeded choice rlvr makes goes through here: the data order of an epoch, the curricula's
//! picks, the sampler, the built-in model's weights, the synthetic data sets, the fuzz replays.
//! The sequences are part of the checkpoint format (a resumed job must draw exactly the numbers
//! an uninterrupted one draws), so they are written here rather than taken from a crate whose
//! seeding or float conversion may change in a minor release. Never change an algorithm: the
//! tests pin the first values.
//!
//! - [`SplitMix64`] (Steele, Lea and Flood, "Fast splittable pseudorandom number generators",
//!   OOPSLA 2014): one `u64` of state; for small seeded choices.
//! - [`Xoshiro256pp`] (Blackman and Vigna, "Scrambled linear pseudorandom number generators",
//!   2021): four `u64`s, seeded by SplitMix64 as its authors recommend; for sampling.
//!
//! - [`fill_uniform`] / [`fill_uniform_bf16`]: SplitMix64's output function over a counter
//!   (value `i` of a stream is a function of its key and `i` alone), for billions of weights at
//!   once: any slice of a stream can be made on its own, by as many threads as there are.
//!
//! Why not `rand_xoshiro`: `rand_core`'s seeding and float conversions have changed between
//! releases; a few lines pinned by their first values cannot.
#![deny(missing_docs)]

/// The SplitMix64 increment (the golden ratio in 64 bits); also a good constant to mix a seed
/// with a second number.
pub const GOLDEN_GAMMA: u64 = 0x9E37_79B9_7F4A_7C15;

/// SplitMix64: small, fast and well mixed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SplitMix64 {
    state: u64,
}

impl SplitMix64 {
    /// A generator whose state is `seed`.
    pub fn new(seed: u64) -> Self {
        SplitMix64 { state: seed }
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(GOLDEN_GAMMA);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..bound` without modulo bias; 0 when `bound` is 0.
    pub fn below(&mut self, bound: usize) -> usize {
        if bound == 0 {
            return 0;
        }
        let bound = bound as u64;
        let zone = u64::MAX - u64::MAX % bound;
        loop {
            let value = self.next_u64();
            if value < zone {
                return (value % bound) as usize;
            }
        }
    }

    /// Shuffles `items` in place (Fisher–Yates, drawing with [`SplitMix64::below`]).
    pub fn shuffle<T>(&mut self, items: &mut [T]) {
        for last in (1..items.len()).rev() {
            items.swap(last, self.below(last + 1));
        }
    }
}

/// xoshiro256++: the sampler's generator, whose whole state is four `u64`s a checkpoint keeps.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct Xoshiro256pp {
    s: [u64; 4],
}

impl Xoshiro256pp {
    /// A generator seeded from one `u64`: the state is filled by SplitMix64, so it is never all
    /// zero.
    pub fn new(seed: u64) -> Self {
        let mut seeder = SplitMix64::new(seed);
        let s = [seeder.next_u64(), seeder.next_u64(), seeder.next_u64(), seeder.next_u64()];
        Xoshiro256pp { s }
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        let s = &mut self.s;
        let result = s[0].wrapping_add(s[3]).rotate_left(23).wrapping_add(s[0]);
        let t = s[1] << 17;
        s[2] ^= s[0];
        s[3] ^= s[1];
        s[1] ^= s[2];
        s[0] ^= s[3];
        s[2] ^= t;
        s[3] = s[3].rotate_left(45);
        result
    }

    /// A uniform draw in [0, 1) with 53 random bits.
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// A uniform draw in [0, 1) with 24 random bits, exactly representable as `f32`.
    pub fn next_f32(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 * (1.0 / (1u32 << 24) as f32)
    }

    /// An independent stream derived from this one (consumes one draw).
    pub fn fork(&mut self) -> Self {
        Xoshiro256pp::new(self.next_u64())
    }
}

/// Value `index` of stream `key`, uniform in `[-bound, bound)` with 24 random bits (an f32's
/// mantissa): SplitMix64's output for the state `key + (index + 1)·γ`.
#[inline]
fn uniform_at(key: u64, index: u64, bound: f32) -> f32 {
    let z = SplitMix64::new(key.wrapping_add(index.wrapping_mul(GOLDEN_GAMMA))).next_u64();
    let unit = (z >> 40) as f32 * (1.0 / (1u64 << 24) as f32);
    (unit * 2.0 - 1.0) * bound
}

/// Fills `out` with values `start..start + out.len()` of stream `key` ([`uniform_at`]).
pub fn fill_uniform(key: u64, start: u64, bound: f32, out: &mut [f32]) {
    for (i, value) in out.iter_mut().enumerate() {
        *value = uniform_at(key, start + i as u64, bound);
    }
}

/// [`fill_uniform`] as bfloat16 bit patterns, each value rounded to the nearest (ties to even),
/// as libtorch converts an f32.
pub fn fill_uniform_bf16(key: u64, start: u64, bound: f32, out: &mut [u16]) {
    for (i, value) in out.iter_mut().enumerate() {
        *value = bf16_bits(uniform_at(key, start + i as u64, bound));
    }
}

/// A finite f32 as the bfloat16 nearest to it (ties to even), as its bit pattern.
#[inline]
fn bf16_bits(value: f32) -> u16 {
    let bits = value.to_bits();
    ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) as u16
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_values_are_pinned() {
        // A change here breaks every checkpoint's resume and every seeded data set.
        assert_eq!(SplitMix64::new(0).next_u64(), 0xE220_A839_7B1D_CDAF);
        assert_eq!(Xoshiro256pp::new(0).next_u64(), 0x5317_5d61_490b_23df);
    }

    #[test]
    fn a_uniform_streams_values_depend_on_their_index_alone() {
        let mut whole = vec![0f32; 1000];
        fill_uniform(9, 0, 0.5, &mut whole);
        let mut tail = vec![0f32; 10];
        fill_uniform(9, 990, 0.5, &mut tail);
        assert_eq!(whole[990..], tail[..]);
        assert_eq!(whole[0], uniform_at(9, 0, 0.5));
        assert!(whole.iter().all(|v| (-0.5..0.5).contains(v)));
        let mean = whole.iter().sum::<f32>() / 1000.0;
        let std = (whole.iter().map(|v| (v - mean).powi(2)).sum::<f32>() / 1000.0).sqrt();
        assert!(mean.abs() < 0.03 && (std - 0.5 / 3f32.sqrt()).abs() < 0.02, "{mean} {std}");
        let mut other = vec![0f32; 1000];
        fill_uniform(10, 0, 0.5, &mut other);
        assert_ne!(whole, other);
        // bf16: f32's rounding to nearest even, as libtorch's conversion.
        let mut halves = vec![0u16; 1000];
        fill_uniform_bf16(9, 0, 0.5, &mut halves);
        for (h, f) in halves.iter().zip(&whole) {
            let back = f32::from_bits(u32::from(*h) << 16);
            assert!((back - f).abs() <= f.abs() / 128.0, "{f} -> {back}");
        }
        assert_eq!(bf16_bits(1.0 + 1.0 / 256.0), 0x3F80, "a tie rounds to the even neighbour");
        assert_eq!(bf16_bits(1.0 + 3.0 / 256.0), 0x3F82, "a tie rounds to the even neighbour");
        assert_eq!(bf16_bits(-2.0), 0xC000);
    }

    #[test]
    fn below_stays_below_and_zero_is_zero() {
        let mut rng = SplitMix64::new(3);
        assert!((0..1000).all(|_| rng.below(7) < 7));
        assert_eq!(rng.below(0), 0);
    }

    #[cfg(feature = "serde")]
    #[test]
    fn the_state_round_trips_through_json() {
        let mut a = Xoshiro256pp::new(7);
        a.next_u64();
        let mut b: Xoshiro256pp = serde_json::from_str(&serde_json::to_string(&a).unwrap()).unwrap();
        assert_eq!(a.next_u64(), b.next_u64());
        let u = a.next_f64();
        assert!((0.0..1.0).contains(&u));
    }
}
