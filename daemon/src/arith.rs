//! Synthetic arithmetic data for `builtin:tiny-arith`: the demo's and the tests' data, made here
//! so nothing is downloaded. `rlvrd data arith --out DIR` writes:
//!
//! - `sft.jsonl` — `{"id", "prompt": "12+7=", "completion": "19"}` demonstrations (cold start);
//! - `train.jsonl`, `heldout.jsonl` — `{"id", "prompt", "reference": {"answer": "19"}}` for the
//!   math verifier; held-out problems never appear in the training files.
//!
//! Two task families, chosen by `ops`: `a+b=` and/or `a-b=` with both operands below
//! `max_operand`; and multiplication by one digit, `a*d=` with `a` below `max_operand` and `d` in
//! 0–9 (a second family for learning tests: the answer's digits need carries from a times table,
//! not from a sum of two digits). Problems are all distinct, drawn from a seeded SplitMix64. With
//! `pad`, the operands below `max_operand` are zero-padded to the width of `max_operand - 1`
//! (`07+31=` for operands below 50, `042*7=` below 1000), so each digit has a fixed place in the
//! prompt; answers are never padded (`38`, `-4`, `294`), as the math verifier reads them.
//!
//! Disjointness: every problem is drawn once into one list (a set rejects repeats), and the files
//! are consecutive slices of it — held-out first, then training, then demonstrations — so no
//! prompt is in two files whatever the sizes.

use std::collections::HashSet;
use std::fs;
use std::io;
use std::path::Path;

use serde_json::json;

use rlvr_seeded::SplitMix64;

/// How much data to make, and what it looks like.
#[derive(Debug, Clone)]
pub struct ArithOptions {
    pub seed: u64,
    pub sft: usize,
    pub train: usize,
    pub heldout: usize,
    /// Operands are drawn from `0..max_operand`.
    pub max_operand: u64,
    /// The operations, each drawn with equal probability: `+`, `-`, `*` or several (`+-`, the
    /// default).
    pub ops: Vec<Op>,
    /// Zero-pad the operands below `max_operand` to the width of `max_operand - 1`.
    pub pad: bool,
}

/// An operation of a problem.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Op {
    Add,
    Sub,
    /// Multiplication by one digit: `a*d=`, `d` in 0–9.
    Mul,
}

/// The multiplier's choices for [`Op::Mul`]: one digit.
const DIGITS: u64 = 10;

impl Op {
    /// How many distinct problems of this operation operands below `max_operand` give.
    fn distinct(self, max_operand: u64) -> u64 {
        match self {
            Op::Add | Op::Sub => max_operand * max_operand,
            // The multiplier is drawn below `max_operand` too, so below 10 it has fewer choices.
            Op::Mul => max_operand * DIGITS.min(max_operand),
        }
    }

    /// Parses a list of `+`, `-` and `*` (`+-`, `*`; each operation at most once).
    pub fn parse_list(text: &str) -> Result<Vec<Op>, String> {
        let mut ops = Vec::new();
        for c in text.chars() {
            let op = match c {
                '+' => Op::Add,
                '-' => Op::Sub,
                '*' => Op::Mul,
                _ => return Err(format!("unknown operation {c:?} in {text:?} (expected +, - or *)")),
            };
            if ops.contains(&op) {
                return Err(format!("operation {c:?} given twice in {text:?}"));
            }
            ops.push(op);
        }
        if ops.is_empty() {
            return Err("no operation given (expected +, - or *)".into());
        }
        Ok(ops)
    }
}

impl Default for ArithOptions {
    fn default() -> Self {
        ArithOptions {
            seed: 0,
            sft: 2000,
            train: 2000,
            heldout: 200,
            max_operand: 50,
            ops: vec![Op::Add, Op::Sub],
            pad: false,
        }
    }
}

/// Writes the three files into `out` (created if missing); returns how many problems each holds.
pub fn write(out: &Path, options: &ArithOptions) -> io::Result<[usize; 3]> {
    if options.ops.is_empty() || options.max_operand == 0 {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "no operation or no operand to draw"));
    }
    let distinct: u64 = options.ops.iter().map(|op| op.distinct(options.max_operand)).sum();
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
    let width = if options.pad { (options.max_operand - 1).to_string().len() } else { 0 };
    let mut rng = SplitMix64::new(options.seed);
    let mut seen = HashSet::new();
    let mut problems = Vec::with_capacity(wanted as usize);
    while problems.len() < wanted as usize {
        let a = rng.next_u64() % options.max_operand;
        let b = rng.next_u64() % options.max_operand;
        // One draw per problem whatever the operations, so `+-` keeps the sets it always made.
        let op = options.ops[(rng.next_u64() % options.ops.len() as u64) as usize];
        let (prompt, answer) = match op {
            Op::Add => (format!("{a:0width$}+{b:0width$}="), (a + b) as i64),
            Op::Sub => (format!("{a:0width$}-{b:0width$}="), a as i64 - b as i64),
            // The multiplier is one digit: never padded, and drawn from the same number so
            // the other operations' sets stay what they were.
            Op::Mul => (format!("{a:0width$}*{}=", b % DIGITS), (a * (b % DIGITS)) as i64),
        };
        if seen.insert(prompt.clone()) {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn prompts(dir: &Path, file: &str) -> Vec<String> {
        fs::read_to_string(dir.join(file))
            .unwrap()
            .lines()
            .map(|line| {
                serde_json::from_str::<serde_json::Value>(line).unwrap()["prompt"]
                    .as_str()
                    .unwrap()
                    .to_owned()
            })
            .collect()
    }

    #[test]
    fn the_three_files_are_disjoint_and_a_pure_function_of_the_options() {
        let dir = tempfile::tempdir().unwrap();
        let options =
            ArithOptions { sft: 300, train: 300, heldout: 150, max_operand: 20, ..Default::default() };
        assert_eq!(write(&dir.path().join("a"), &options).unwrap(), [300, 300, 150]);
        write(&dir.path().join("b"), &options).unwrap();
        let mut all = HashSet::new();
        for file in ["sft.jsonl", "train.jsonl", "heldout.jsonl"] {
            let a = fs::read(dir.path().join("a").join(file)).unwrap();
            assert_eq!(a, fs::read(dir.path().join("b").join(file)).unwrap(), "{file}");
            for prompt in prompts(&dir.path().join("a"), file) {
                assert!(all.insert(prompt.clone()), "{prompt} appears twice");
            }
        }
        assert!(all.iter().any(|p| p.contains('+')) && all.iter().any(|p| p.contains('-')));
        assert!(write(&dir.path().join("c"), &ArithOptions { max_operand: 10, ..options }).is_err());
    }

    #[test]
    fn ops_and_pad_choose_the_problems_form() {
        let dir = tempfile::tempdir().unwrap();
        let options = ArithOptions {
            sft: 20,
            train: 20,
            heldout: 20,
            max_operand: 50,
            ops: vec![Op::Add],
            pad: true,
            ..Default::default()
        };
        write(dir.path(), &options).unwrap();
        let text = fs::read_to_string(dir.path().join("heldout.jsonl")).unwrap();
        for line in text.lines() {
            let value: serde_json::Value = serde_json::from_str(line).unwrap();
            let prompt = value["prompt"].as_str().unwrap();
            let (a, b) = prompt.trim_end_matches('=').split_once('+').unwrap();
            assert!(a.len() == 2 && b.len() == 2, "{prompt}");
            let sum: u64 = a.parse::<u64>().unwrap() + b.parse::<u64>().unwrap();
            assert_eq!(value["reference"]["answer"], sum.to_string(), "{prompt}");
        }
        assert_eq!(Op::parse_list("+-"), Ok(vec![Op::Add, Op::Sub]));
        assert_eq!(Op::parse_list("*"), Ok(vec![Op::Mul]));
        assert!(Op::parse_list("++").is_err() && Op::parse_list("/").is_err() && Op::parse_list("").is_err());
    }

    /// Writes `options`' files; checks each problem's form and answer (`a OP b`, each operand's
    /// width, the multiplier one digit), that no prompt is in two files, and that every distinct
    /// problem can be asked for and one more cannot.
    fn check(ops: &str, max_operand: u64, pad: bool, widths: (usize, usize)) {
        let dir = tempfile::tempdir().unwrap();
        let ops_list = Op::parse_list(ops).unwrap();
        let distinct: u64 = ops_list.iter().map(|op| op.distinct(max_operand)).sum();
        let heldout = (distinct / 4) as usize;
        let options = ArithOptions {
            sft: heldout,
            train: distinct as usize - 2 * heldout,
            heldout,
            max_operand,
            ops: ops_list,
            pad,
            seed: 5,
        };
        // All of them: the draw ends (no problem is missing from the count).
        let made = write(dir.path(), &options).unwrap();
        assert_eq!(made.iter().sum::<usize>() as u64, distinct, "{ops} below {max_operand}");
        let mut all = HashSet::new();
        for (file, reference) in
            [("sft.jsonl", "completion"), ("train.jsonl", "reference"), ("heldout.jsonl", "reference")]
        {
            for line in fs::read_to_string(dir.path().join(file)).unwrap().lines() {
                let value: serde_json::Value = serde_json::from_str(line).unwrap();
                let prompt = value["prompt"].as_str().unwrap().to_owned();
                let answer = if reference == "completion" {
                    &value["completion"]
                } else {
                    &value["reference"]["answer"]
                };
                let body = prompt.strip_suffix('=').unwrap();
                let at = body.find(['+', '-', '*']).unwrap();
                let (a, b) = (&body[..at], &body[at + 1..]);
                let (x, y): (i64, i64) = (a.parse().unwrap(), b.parse().unwrap());
                let expected = match &body[at..at + 1] {
                    "+" => x + y,
                    "-" => x - y,
                    _ => {
                        assert!(y < 10 && b.len() == 1, "{prompt}: the multiplier is one digit");
                        x * y
                    }
                };
                assert!(x < max_operand as i64 && y < max_operand as i64, "{prompt}");
                if widths.0 > 0 {
                    assert_eq!(a.len(), widths.0, "{prompt}");
                }
                if widths.1 > 0 {
                    assert_eq!(b.len(), widths.1, "{prompt}");
                }
                assert_eq!(answer, &expected.to_string(), "{prompt}");
                assert!(all.insert(prompt.clone()), "{prompt} appears twice");
            }
        }
        let more = ArithOptions { sft: options.sft + 1, ..options };
        assert!(
            write(&dir.path().join("more"), &more).is_err(),
            "{ops} below {max_operand}: {distinct} at most"
        );
    }

    #[test]
    fn each_family_writes_right_answers_in_its_form_and_every_distinct_problem_once() {
        check("*", 100, true, (2, 1));
        check("*", 1000, true, (3, 1));
        check("*", 30, false, (0, 1));
        check("*", 7, false, (1, 1));
        check("+", 20, true, (2, 2));
        check("-", 12, true, (2, 2));
        check("+-*", 15, false, (0, 0));
    }
}
