//! The order the training data is visited in: a seeded shuffle per epoch, so a [`Cursor`]
//! (epoch, index) is all a checkpoint needs to continue exactly. The records themselves, and the
//! reading of the job's data files, are `rlvr_protocol::records` (the daemon checks them at
//! submit with the same code).

use rlvr_seeded::SplitMix64;
use serde::{Deserialize, Serialize};

/// Where the data order stands: the next record is `order(epoch)[index]`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Cursor {
    pub epoch: u64,
    pub index: u64,
}

impl Cursor {
    /// The next `count` record indices of a data set of `len` records, advancing the cursor
    /// (into the next epoch when needed; an epoch never repeats a record).
    pub fn take(&mut self, count: usize, len: usize, seed: u64) -> Vec<usize> {
        let mut picked = Vec::with_capacity(count);
        let mut order = epoch_order(len, seed, self.epoch);
        while picked.len() < count {
            if self.index as usize >= len {
                self.epoch += 1;
                self.index = 0;
                order = epoch_order(len, seed, self.epoch);
            }
            picked.push(order[self.index as usize]);
            self.index += 1;
        }
        picked
    }
}

/// A permutation of `0..len` from `seed` and `epoch` (Fisher–Yates over SplitMix64, modulo
/// draws: the order of every recorded run).
pub fn epoch_order(len: usize, seed: u64, epoch: u64) -> Vec<usize> {
    let mut rng =
        SplitMix64::new(seed ^ epoch.wrapping_mul(rlvr_seeded::GOLDEN_GAMMA) ^ 0xD1B5_4A32_D192_ED03);
    let mut order: Vec<usize> = (0..len).collect();
    for i in (1..len).rev() {
        let j = (rng.next_u64() % (i as u64 + 1)) as usize;
        order.swap(i, j);
    }
    order
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cursor_visits_every_record_once_per_epoch_and_resumes_exactly() {
        let mut cursor = Cursor::default();
        let first: Vec<usize> = cursor.take(7, 7, 42);
        let mut sorted = first.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, (0..7).collect::<Vec<_>>());
        let mut saved = cursor;
        let mut straight = cursor;
        assert_eq!(straight.take(10, 7, 42), saved.take(10, 7, 42));
        assert_ne!(epoch_order(50, 42, 0), epoch_order(50, 42, 1));
    }
}
