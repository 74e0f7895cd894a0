//! Decoding throughput of [`generate`] on CPU: completion tokens per second, the median of
//! several timed runs after a warm-up, for plain sampling, nucleus sampling and stop strings.
//!
//! cargo run --release -p rlvr-model --example decode_bench -- SOURCE PROMPTS GROUP MAX_NEW [RUNS [THREADS]]
//! e.g. `builtin:tiny-arith 8 8 128` or `$(scripts/fetch-smollm2.sh) 2 8 64 5 1`.
//!
//! Each configuration samples from the same seed in every run, so every run does the same work.

use std::time::Instant;

use rlvr_model::{SamplerRng, SamplingParams, generate, load};
use tch::{Device, Kind};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.len() < 5 {
        eprintln!("usage: decode_bench SOURCE PROMPTS GROUP MAX_NEW [RUNS [THREADS]]");
        std::process::exit(2);
    }
    let source = &args[1];
    let n_prompts: usize = args[2].parse().expect("PROMPTS is a number");
    let group: usize = args[3].parse().expect("GROUP is a number");
    let max_new: usize = args[4].parse().expect("MAX_NEW is a number");
    let runs: usize = args.get(5).map_or(5, |r| r.parse().expect("RUNS is a number"));
    if let Some(threads) = args.get(6) {
        tch::set_num_threads(threads.parse().expect("THREADS is a number"));
    }
    let m = load(source, Device::Cpu, Kind::Float).expect("the model loads");
    println!(
        "{} ({} parameters, vocabulary {}), {n_prompts} prompts × {group}, at most {max_new} new tokens, \
         {} threads, median of {runs} runs",
        m.source,
        m.num_parameters(),
        m.model.vocab_size(),
        tch::get_num_threads()
    );
    let texts =
        ["What is 12 + 30? Give the final answer as: Answer: <number>", "7*6=", "Compute 345 - 17.", "9+9="];
    let prompts: Vec<Vec<i64>> =
        (0..n_prompts).map(|i| m.tokenizer.encode_prompt(texts[i % texts.len()]).unwrap()).collect();
    let base = SamplingParams { max_new_tokens: max_new, temperature: 1.0, ..Default::default() };
    // A stop string no completion contains: every step checks it, none stops.
    let never = vec!["\u{1}never\u{2}".to_owned()];
    let configs = [
        ("T=1", base.clone()),
        ("T=1 top_p=0.95", SamplingParams { top_p: 0.95, ..base.clone() }),
        ("T=1 stop string", SamplingParams { stop: never.clone(), ..base.clone() }),
        ("T=1 top_p=0.95 stop string", SamplingParams { top_p: 0.95, stop: never, ..base.clone() }),
        ("T=0 (greedy)", SamplingParams { temperature: 0.0, ..base }),
    ];
    println!("| configuration | tokens | decoding steps | median s | tokens/s | ms/step |");
    println!("|---|---:|---:|---:|---:|---:|");
    for (name, params) in configs {
        let sample = || generate(&m.model, &m.tokenizer, &prompts, group, &params, &mut SamplerRng::new(7));
        let _ = sample().expect("warm-up");
        let mut times = Vec::with_capacity(runs);
        let mut out = Vec::new();
        for _ in 0..runs {
            let started = Instant::now();
            out = sample().expect("generate");
            times.push(started.elapsed().as_secs_f64());
        }
        times.sort_by(f64::total_cmp);
        let median = times[times.len() / 2];
        let tokens: usize = out.iter().map(|s| s.tokens.len()).sum();
        let steps = out.iter().map(|s| s.tokens.len()).max().unwrap_or(0);
        println!(
            "| {name} | {tokens} | {steps} | {median:.3} | {:.0} | {:.2} |",
            tokens as f64 / median,
            median * 1000.0 / steps.max(1) as f64
        );
    }
}
