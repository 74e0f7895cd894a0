//! Stable-toolchain guard for what the fuzzer found: replays the seed corpus and every crash or
//! slow input the fuzzer reported (`fuzz/seeds/`, `fuzz/regressions/`), then seeded mutations of
//! them, through the plugin's public judging path exactly as `fuzz/fuzz_targets/judge.rs` decodes
//! them (first byte: mode, explain, think tag; then reference JSON, a newline, the completion).
//! Nothing may panic, the score must be finite and in [0, 1], and verdicts must repeat exactly.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::Path;

use rlvr_plugin_api::{VerifierPlugin, VerifyItem};
use rlvr_verifier_ifeval::{INSTRUCTION_IDS, IfevalVerifier};

const MUTATIONS: usize = 600;

const TOKENS: &[&str] = &[
    "{}",
    "null",
    "\"less than\"",
    "\"at least\"",
    "\n\n",
    "\n",
    "* ",
    "- ",
    "*x*",
    "**",
    "<<t>>",
    "P.S.",
    "P.P.S",
    "******",
    "SECTION 1",
    "[name]",
    "```json",
    "```",
    "\"",
    ",",
    ".",
    "!",
    "?",
    "Mr.",
    "</think>",
    "My answer is yes.",
    "ABC",
    "é",
    "日本語",
    "\t",
    "\r\n",
    "-1",
    "0",
    "99999999999999999999",
    "1e308",
    "[",
    "]",
    "{",
    "}",
    ":",
];

fn inputs(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut found = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else { return found };
    // Dot files (`.gitkeep`) are not inputs.
    let mut paths: Vec<_> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|path| !path.file_name().is_some_and(|name| name.to_string_lossy().starts_with('.')))
        .collect();
    paths.sort();
    for path in paths {
        found.push((path.display().to_string(), std::fs::read(&path).unwrap_or_default()));
    }
    found
}

/// SplitMix64: deterministic mutations on every platform.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: usize) -> usize {
        if n == 0 { 0 } else { (self.next() % n as u64) as usize }
    }
}

fn mutate(bytes: &[u8], other: &[u8], rng: &mut Rng) -> Vec<u8> {
    let mut out = bytes.to_vec();
    for _ in 0..1 + rng.below(4) {
        let at = rng.below(out.len() + 1);
        match rng.below(5) {
            0 => {
                let token = if rng.below(3) == 0 {
                    format!("\"{}\"", INSTRUCTION_IDS[rng.below(INSTRUCTION_IDS.len())])
                } else {
                    TOKENS[rng.below(TOKENS.len())].to_owned()
                };
                let times = if rng.below(8) == 0 { 1 + rng.below(200) } else { 1 };
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
            3 => {
                if at < out.len() {
                    let bytes = b"0123456789\"{}[],:\n. *-";
                    out[at] = bytes[rng.below(bytes.len())];
                }
            }
            _ => {
                let from = rng.below(other.len());
                let end = (from + rng.below(60)).min(other.len());
                out.splice(at..at, other[from..end].iter().copied());
            }
        }
    }
    out
}

type Outcome = (String, bool, Option<String>, Vec<(String, u64)>);

/// The fuzz target's body; `None` for inputs it skips.
fn judge(label: &str, data: &[u8]) -> Option<Outcome> {
    let (&flags, rest) = data.split_first()?;
    let text = std::str::from_utf8(rest).ok()?;
    let result = catch_unwind(AssertUnwindSafe(|| {
        let (reference, completion) = text.split_once('\n').unwrap_or((text, ""));
        let mode = if flags & 1 == 1 { "loose" } else { "strict" };
        let think = if flags & 4 == 4 { "" } else { "</think>" };
        let config = format!(r#"{{"mode": "{mode}", "think_close": "{think}"}}"#);
        let verifier = IfevalVerifier::from_config(&config).expect("valid config");
        let mut item = VerifyItem::new("replay", "", completion, reference);
        item.explain = flags & 2 == 2;
        verifier.verify(&item).expect("a verdict")
    }));
    let verdict = result.unwrap_or_else(|_| panic!("panic on {label}: {data:?}"));
    let score = verdict.score;
    assert!(score.is_finite() && (0.0..=1.0).contains(&score), "score {score} on {label}: {text:?}");
    for component in verdict.components.iter() {
        let value = component.value;
        assert!(value.is_finite() && (0.0..=1.0).contains(&value), "{component:?} on {label}: {text:?}");
    }
    let components =
        verdict.components.iter().map(|c| (c.name.to_string(), c.value.to_bits())).collect::<Vec<_>>();
    Some((
        score.to_string(),
        verdict.passed,
        verdict.error.into_option().map(|e| e.into_string()),
        components,
    ))
}

#[test]
fn corpus_and_mutations_never_panic_stay_bounded_and_repeat() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz");
    let mut corpus = inputs(&root.join("seeds"));
    assert!(corpus.len() >= 68, "seed corpus missing: {}", root.display());
    corpus.extend(inputs(&root.join("regressions")));
    let mut judged = 0;
    for (label, data) in &corpus {
        let first = judge(label, data);
        assert_eq!(first, judge(label, data), "verdict changed between runs on {label}");
        judged += usize::from(first.is_some_and(|(_, _, error, _)| error.is_none()));
    }
    assert!(judged >= 68, "only {judged} inputs judged without error");
    let mut rng = Rng(0x1fe7a1);
    for k in 0..MUTATIONS {
        let (_, base) = &corpus[rng.below(corpus.len())];
        let (_, other) = &corpus[rng.below(corpus.len())];
        let data = mutate(base, other, &mut rng);
        let label = format!("mutation {k}");
        let first = judge(&label, &data);
        if k % 10 == 0 {
            assert_eq!(first, judge(&label, &data), "verdict changed between runs: {data:?}");
        }
    }
}
