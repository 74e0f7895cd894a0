//! How a step's rows are split into micro-batches, the forward/backward passes of one update.
//!
//! Pure. A micro-batch is a run of consecutive rows: at most `[optimizer] micro_batch_size` of
//! them and, with `micro_batch_tokens`, at most that many padded tokens — its rows times the
//! longest prompt plus the longest completion among them, the shape its pass computes (and what
//! the memory estimate's update phase counts). A micro-batch takes whole units: a preference
//! pair's two rows go together, since the DPO loss compares them. A unit longer than the token
//! limit on its own still runs, alone.
//!
//! The rows stay in their order, not sorted by length as some trainers do to pack tighter:
//! consecutive rows of a group share a prompt (a pass computes each distinct prompt once), the
//! first update's log-probabilities are read back in row order, and each micro-batch's dropout
//! seed is its first row, so a split that depends only on the rows keeps a resumed run's masks.
//! The losses are scaled by whole-batch quantities, so any split gives the same gradients.

use std::ops::Range;

/// The limits of one micro-batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// At most this many rows (rounded down to whole units, at least one unit).
    pub rows: usize,
    /// At most this many padded tokens, when set.
    pub tokens: Option<u64>,
    /// Rows that must stay together: 2 for preference pairs, else 1.
    pub unit: usize,
}

/// Splits rows of these `(prompt, completion)` lengths into consecutive micro-batches that
/// cover every row once, in order.
pub fn split(lengths: &[(usize, usize)], limits: Limits) -> Vec<Range<usize>> {
    let unit = limits.unit.max(1);
    let max_rows = (limits.rows / unit * unit).max(unit);
    let mut batches = Vec::new();
    let mut start = 0;
    while start < lengths.len() {
        let (mut end, mut prompt, mut completion) = (start, 0, 0);
        while end < lengths.len() {
            let next = (end + unit).min(lengths.len());
            let (p, c) = lengths[end..next]
                .iter()
                .fold((prompt, completion), |(p, c), &(rp, rc)| (p.max(rp), c.max(rc)));
            let tokens = ((next - start) * (p + c)) as u64;
            let within = next - start <= max_rows && limits.tokens.is_none_or(|max| tokens <= max);
            if !within && end > start {
                break;
            }
            (end, prompt, completion) = (next, p, c);
            if !within {
                break;
            }
        }
        batches.push(start..end);
        start = end;
    }
    batches
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A case: its name, the rows' `(prompt, completion)` lengths, the limits, the micro-batches.
    type Case = (&'static str, Vec<(usize, usize)>, Limits, Vec<Range<usize>>);

    #[test]
    fn rows_split_by_count_tokens_and_units() {
        let rows = |rows, tokens, unit| Limits { rows, tokens, unit };
        let same = |n| vec![(10, 10); n];
        let cases: Vec<Case> = vec![
            ("no rows", vec![], rows(8, None, 1), vec![]),
            ("rows only", same(10), rows(4, None, 1), vec![0..4, 4..8, 8..10]),
            ("fewer rows than one micro-batch", same(3), rows(8, None, 1), vec![Range { start: 0, end: 3 }]),
            ("tokens bind before rows", same(10), rows(8, Some(60), 1), vec![0..3, 3..6, 6..9, 9..10]),
            (
                "rows bind before tokens",
                same(10),
                rows(2, Some(1000), 1),
                vec![0..2, 2..4, 4..6, 6..8, 8..10],
            ),
            (
                // Padded to the longest row: 3 rows × 40 = 120 fits, a fourth of 40 makes 160.
                "a long row pads its neighbours",
                vec![(10, 10), (10, 30), (10, 5), (10, 5), (10, 5)],
                rows(8, Some(120), 1),
                vec![0..3, 3..5],
            ),
            (
                "a row past the limit runs alone",
                vec![(5, 5), (50, 200), (5, 5)],
                rows(8, Some(40), 1),
                vec![0..1, 1..2, 2..3],
            ),
            ("pairs stay together", same(8), rows(3, None, 2), vec![0..2, 2..4, 4..6, 6..8]),
            ("pairs by tokens", same(8), rows(8, Some(90), 2), vec![0..4, 4..8]),
            ("a pair past the limit runs alone", same(4), rows(8, Some(10), 2), vec![0..2, 2..4]),
            ("one row per micro-batch", same(3), rows(1, None, 1), vec![0..1, 1..2, 2..3]),
        ];
        for (name, lengths, limits, expected) in cases {
            let got = split(&lengths, limits);
            assert_eq!(got, expected, "{name}");
            // Every row once, in order.
            let covered: Vec<usize> = got.iter().flat_map(Clone::clone).collect();
            assert_eq!(covered, (0..lengths.len()).collect::<Vec<_>>(), "{name}");
        }
    }
}
