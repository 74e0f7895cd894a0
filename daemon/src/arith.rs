//! Synthetic arithmetic data for `builtin:tiny-arith`: the demo's and the tests' data, made here
//! so nothing is downloaded. `rlvrd data arith --out DIR` writes:
//!
//! - `sft.jsonl` — `{"id", "prompt": "12+7=", "completion": "19"}` demonstrations (cold start);
//! - `train.jsonl`, `heldout.jsonl` — `{"id", "prompt", "reference": {"answer": "19"}}` for the
//!   math verifier; held-out problems never appear in the training files.
//!
//! Problems are `a+b=` and `a-b=` with operands below `max_operand`, drawn from a seeded SplitMix64.

use std::collections::HashSet;
use std::fs;
use std::io;
use std::path::Path;

use serde_json::json;

use crate::worker::data::splitmix64;

/// How much data to make.
#[derive(Debug, Clone, Copy)]
pub struct ArithOptions {
    pub seed: u64,
    pub sft: usize,
    pub train: usize,
    pub heldout: usize,
    /// Operands are drawn from `0..max_operand`.
    pub max_operand: u64,
}

/// Writes the three files into `out` (created if missing); returns how many problems each holds.
pub fn write(out: &Path, options: &ArithOptions) -> io::Result<[usize; 3]> {
    let distinct = options.max_operand * options.max_operand * 2;
    let wanted = (options.sft + options.train + options.heldout) as u64;
    if wanted > distinct {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "{wanted} problems asked for, but operands below {} give only {distinct}",
                options.max_operand
            ),
        ));
    }
    let mut state = options.seed;
    let mut seen = HashSet::new();
    let mut problems = Vec::with_capacity(wanted as usize);
    while problems.len() < wanted as usize {
        let a = splitmix64(&mut state) % options.max_operand;
        let b = splitmix64(&mut state) % options.max_operand;
        let add = splitmix64(&mut state) % 2 == 0;
        if seen.insert((a, b, add)) {
            let (prompt, answer) = if add {
                (format!("{a}+{b}="), (a + b) as i64)
            } else {
                (format!("{a}-{b}="), a as i64 - b as i64)
            };
            problems.push((prompt, answer.to_string()));
        }
    }
    fs::create_dir_all(out)?;
    let (heldout, rest) = problems.split_at(options.heldout);
    let (train, sft) = rest.split_at(options.train);
    let lines = |prefix: &str, items: &[(String, String)], sft: bool| -> String {
        items
            .iter()
            .enumerate()
            .map(|(i, (prompt, answer))| {
                let line = if sft {
                    json!({"id": format!("{prefix}-{i}"), "prompt": prompt, "completion": answer})
                } else {
                    json!({"id": format!("{prefix}-{i}"), "prompt": prompt, "reference": {"answer": answer}})
                };
                line.to_string() + "\n"
            })
            .collect()
    };
    fs::write(out.join("sft.jsonl"), lines("sft", sft, true))?;
    fs::write(out.join("train.jsonl"), lines("train", train, false))?;
    fs::write(out.join("heldout.jsonl"), lines("heldout", heldout, false))?;
    Ok([sft.len(), train.len(), heldout.len()])
}
