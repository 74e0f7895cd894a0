//! Replays a plugin's fuzz corpus (`fuzz/seeds/`, `fuzz/regressions/`) and seeded mutations of it
//! on the stable toolchain, so `cargo test` guards what the fuzzer found without nightly.
//!
//! Each plugin's `tests/replay.rs` supplies the target's body (shared with its `cargo fuzz`
//! target) and the tokens worth splicing in; this crate owns reading the corpus, the
//! deterministic mutations, catching panics and checking that results repeat.

use std::fmt::Debug;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::Path;

/// How to mutate inputs.
pub struct Mutations<'a> {
    /// How many mutated inputs to run.
    pub count: usize,
    /// The RNG seed, so every run tries the same inputs.
    pub seed: u64,
    /// Strings worth splicing in (syntax, keywords, extreme numbers).
    pub tokens: &'a [String],
    /// Single bytes worth overwriting with.
    pub bytes: &'a [u8],
    /// Leading bytes left alone (e.g. a selector byte that picks the parser).
    pub keep_prefix: usize,
}

/// One corpus input: where it came from, and its bytes.
pub type Input = (String, Vec<u8>);

/// The seeds and regressions under `fuzz_dir`, in name order; dot files (`.gitkeep`) are skipped.
pub fn corpus(fuzz_dir: &Path) -> Vec<Input> {
    let mut paths: Vec<_> = ["seeds", "regressions"]
        .iter()
        .filter_map(|sub| std::fs::read_dir(fuzz_dir.join(sub)).ok())
        .flat_map(|entries| entries.filter_map(|entry| entry.ok().map(|entry| entry.path())))
        .filter(|path| !path.file_name().is_some_and(|name| name.to_string_lossy().starts_with('.')))
        .collect();
    paths.sort();
    paths
        .into_iter()
        .map(|path| (path.display().to_string(), std::fs::read(&path).unwrap_or_default()))
        .collect()
}

/// Runs `target` on every corpus input twice (the results must be equal), then on
/// `mutations.count` mutated inputs (every tenth twice). A panic fails with the input. Returns the
/// corpus results, in corpus order, for the caller's own checks.
pub fn replay<T: PartialEq + Debug>(
    corpus: &[Input],
    mutations: &Mutations<'_>,
    target: impl Fn(&[u8]) -> T,
) -> Vec<T> {
    assert!(!corpus.is_empty(), "empty fuzz corpus");
    let run = |label: &str, data: &[u8]| {
        catch_unwind(AssertUnwindSafe(|| target(data)))
            .unwrap_or_else(|_| panic!("panic on {label}: {:?}", String::from_utf8_lossy(data)))
    };
    let mut results = Vec::with_capacity(corpus.len());
    for (label, data) in corpus {
        let first = run(label, data);
        assert_eq!(first, run(label, data), "result changed between runs on {label}");
        results.push(first);
    }
    let mut rng = Rng(rlvr_seeded::SplitMix64::new(mutations.seed));
    for k in 0..mutations.count {
        let (_, base) = &corpus[rng.below(corpus.len())];
        let (_, other) = &corpus[rng.below(corpus.len())];
        let data = mutate(base, other, mutations, &mut rng);
        let label = format!("mutation {k}");
        let first = run(&label, &data);
        if k % 10 == 0 {
            assert_eq!(first, run(&label, &data), "result changed between runs: {data:?}");
        }
    }
    results
}

/// The mutations' generator (SplitMix64 from `rlvr-seeded`): the same mutations on every
/// platform and toolchain. Modulo draws, as the recorded regressions were found with.
struct Rng(rlvr_seeded::SplitMix64);

impl Rng {
    fn below(&mut self, n: usize) -> usize {
        if n == 0 { 0 } else { (self.0.next_u64() % n as u64) as usize }
    }
}

/// One to four edits of `base`: splice a token (sometimes repeated hundreds of times), delete a
/// run, duplicate a run, overwrite a byte, or splice in a piece of `other`.
fn mutate(base: &[u8], other: &[u8], mutations: &Mutations<'_>, rng: &mut Rng) -> Vec<u8> {
    let mut out = base.to_vec();
    let keep = mutations.keep_prefix.min(out.len());
    for _ in 0..1 + rng.below(4) {
        let at = keep + rng.below(out.len() - keep + 1);
        match rng.below(5) {
            0 if !mutations.tokens.is_empty() => {
                let token = &mutations.tokens[rng.below(mutations.tokens.len())];
                let times = if rng.below(8) == 0 { 1 + rng.below(300) } else { 1 };
                out.splice(at..at, token.repeat(times).into_bytes());
            }
            1 => {
                let end = (at + 1 + rng.below(8)).min(out.len());
                out.drain(at.min(end)..end);
            }
            2 => {
                let end = (at + 1 + rng.below(16)).min(out.len());
                let copy = out[at.min(end)..end].to_vec();
                out.splice(at..at, copy);
            }
            3 if at < out.len() && !mutations.bytes.is_empty() => {
                out[at] = mutations.bytes[rng.below(mutations.bytes.len())];
            }
            _ => {
                let from = rng.below(other.len());
                let end = (from + rng.below(60)).min(other.len());
                out.splice(at..at, other[from.min(end)..end].iter().copied());
            }
        }
    }
    out
}
