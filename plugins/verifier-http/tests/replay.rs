//! Stable-toolchain guard for what the fuzzer found: replays the seed corpus and every crash or
//! slow input the fuzzer reported (`fuzz/seeds/`, `fuzz/regressions/`), then seeded mutations of
//! them, through the two untrusted-input parsers exactly as `fuzz/fuzz_targets/parse.rs` decodes
//! them (first byte even: a service's response body; odd: the plugin's JSON config). Nothing may
//! panic, an accepted response must hold what the validation promises, and results must repeat.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::Path;

use rlvr_verifier_http::{config, response};

const MUTATIONS: usize = 5_000;

const TOKENS: &[&str] = &[
    "\"score\":",
    "\"passed\":",
    "\"components\":",
    "\"extracted\":",
    "\"error\":",
    "\"explanation\":",
    "true",
    "false",
    "null",
    "NaN",
    "1e999",
    "-0",
    "\"http_",
    "{",
    "}",
    "[",
    "]",
    ",",
    ":",
    "\"\\ud800\"",
    "\"url\":",
    "\"timeout_ms\":",
    "\"retries\":",
    "\"backoff_max_ms\":",
    "\"retry_on\":",
    "\"headers\":",
    "\"bearer_token_env\":",
    "\"max_response_bytes\":",
    "\"5xx\"",
    "\"http://",
    "[::1]",
    "@",
    "\"Authorization\"",
    "\"UNSET\"",
    "18446744073709551615",
    "4294967295",
    "-1",
    "\r\n",
    "é",
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
        // Never the selector byte: a mutation stays a response or a config.
        let at = 1 + rng.below(out.len());
        match rng.below(5) {
            0 => {
                let token = TOKENS[rng.below(TOKENS.len())];
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
                    let bytes = b"0123456789\"{}[],:.-e\\";
                    out[at] = bytes[rng.below(bytes.len())];
                }
            }
            _ => {
                let from = 1 + rng.below(other.len().saturating_sub(1));
                let end = (from + rng.below(40)).min(other.len());
                out.splice(at..at, other[from.min(end)..end].iter().copied());
            }
        }
    }
    out
}

/// The fuzz target's body, as text to compare between runs; `None` for inputs it skips.
fn parse(label: &str, data: &[u8]) -> Option<String> {
    let (&which, rest) = data.split_first()?;
    let result = catch_unwind(AssertUnwindSafe(|| {
        if which & 1 == 0 {
            let parsed = response::parse_response(rest);
            if let Ok(verdict) = &parsed {
                assert!(verdict.score.is_finite(), "score {}", verdict.score);
                assert!(verdict.components.len() <= response::MAX_COMPONENTS);
                for (name, value) in &verdict.components {
                    assert!(value.is_finite(), "{name}: {value}");
                    assert!(!name.starts_with(response::RESERVED_PREFIX), "{name}");
                    assert!(name.len() <= response::MAX_COMPONENT_NAME, "{name}");
                }
            }
            Some(format!("{parsed:?}"))
        } else {
            let json = std::str::from_utf8(rest).ok()?;
            let env = |name: &str| (name != "UNSET").then(|| name.to_owned());
            let parsed = config::parse(json, env);
            if let Ok(settings) = &parsed {
                assert!(settings.item_budget().as_millis() <= u128::from(config::MAX_ITEM_BUDGET_MS));
                assert!(settings.retries <= config::MAX_RETRIES);
            }
            Some(format!("{parsed:?}"))
        }
    }));
    result.unwrap_or_else(|_| panic!("panic on {label}: {:?}", String::from_utf8_lossy(data)))
}

#[test]
fn corpus_and_mutations_never_panic_and_repeat() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz");
    let mut corpus = inputs(&root.join("seeds"));
    assert!(corpus.len() >= 50, "seed corpus missing: {}", root.display());
    corpus.extend(inputs(&root.join("regressions")));
    let accepted =
        corpus.iter().filter(|(label, data)| parse(label, data).is_some_and(|r| r.starts_with("Ok"))).count();
    assert!(accepted >= 10, "only {accepted} seeds accepted");
    for (label, data) in &corpus {
        assert_eq!(parse(label, data), parse(label, data), "result changed between runs on {label}");
    }
    let mut rng = Rng(0x477e57);
    for k in 0..MUTATIONS {
        let (_, base) = &corpus[rng.below(corpus.len())];
        let (_, other) = &corpus[rng.below(corpus.len())];
        let data = mutate(base, other, &mut rng);
        let label = format!("mutation {k}");
        let first = parse(&label, &data);
        if k % 10 == 0 {
            assert_eq!(first, parse(&label, &data), "result changed between runs: {data:?}");
        }
    }
}
