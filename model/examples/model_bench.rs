//! Times the trainer's tensor work on this machine: batched sampling and a policy
//! forward+backward of `training_logprobs`.
//!
//! cargo run --release -p rlvr-model --example model_bench -- SOURCE PROMPTS GROUP MAX_NEW [THREADS [bf16]]
//! e.g. `builtin:tiny-arith 8 8 32` (64 completions × 32 tokens) or `$(scripts/fetch-smollm2.sh) 1 8 64`.

use std::time::Instant;

use rlvr_model::{
    SamplerRng, SamplingParams, SequenceBatch, completion_logprobs, generate, load, training_logprobs,
};
use tch::{Device, Kind};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.len() < 5 {
        eprintln!("usage: model_bench SOURCE PROMPTS GROUP MAX_NEW [THREADS [bf16]]");
        std::process::exit(2);
    }
    let (source, n_prompts, group, max_new) = (
        &args[1],
        args[2].parse::<usize>().unwrap(),
        args[3].parse::<usize>().unwrap(),
        args[4].parse().unwrap(),
    );
    if let Some(t) = args.get(5) {
        tch::set_num_threads(t.parse().unwrap());
    }
    let t0 = Instant::now();
    let kind = if args.get(6).is_some_and(|k| k == "bf16") { Kind::BFloat16 } else { Kind::Float };
    let m = load(source, Device::Cpu, kind).unwrap();
    println!(
        "loaded {} ({} parameters, {kind:?}) in {:.2}s, {} threads",
        m.source,
        m.num_parameters(),
        t0.elapsed().as_secs_f64(),
        tch::get_num_threads()
    );
    let texts =
        ["What is 12 + 30? Give the final answer as: Answer: <number>", "7*6=", "Compute 345 - 17.", "9+9="];
    let prompts: Vec<Vec<i64>> =
        (0..n_prompts).map(|i| m.tokenizer.encode_prompt(texts[i % texts.len()]).unwrap()).collect();
    let params =
        SamplingParams { max_new_tokens: max_new, temperature: 1.0, top_p: 1.0, ..Default::default() };
    let mut rng = SamplerRng::new(0);
    // Warm-up (allocator, kernels), then the timed runs.
    let _ = generate(
        &m.model,
        &m.tokenizer,
        &prompts,
        group,
        &SamplingParams { max_new_tokens: 4, ..params.clone() },
        &mut rng,
    );
    let mut best = f64::MAX;
    let mut out = Vec::new();
    for _ in 0..3 {
        let t = Instant::now();
        out = generate(&m.model, &m.tokenizer, &prompts, group, &params, &mut rng).unwrap();
        best = best.min(t.elapsed().as_secs_f64());
    }
    let tokens: usize = out.iter().map(|s| s.tokens.len()).sum();
    let steps = out.iter().map(|s| s.tokens.len()).max().unwrap_or(0);
    println!(
        "generate: {} completions, {tokens} tokens ({steps} decoding steps) in {best:.3}s (best of 3) = {:.0} tokens/s, {:.1} ms/step",
        out.len(),
        tokens as f64 / best,
        best * 1000.0 / steps as f64
    );
    // The logprob passes on the sampled completions, or (RLVR_BENCH_FULL=1) on completions of
    // exactly MAX_NEW tokens, to compare with other trainers at a fixed shape.
    let full = std::env::var_os("RLVR_BENCH_FULL").is_some();
    let pairs: Vec<(Vec<i64>, Vec<i64>)> = out
        .iter()
        .map(|s| {
            let completion =
                if full { (0..max_new as i64).map(|i| 100 + i).collect() } else { s.tokens.clone() };
            (prompts[s.prompt_index].clone(), completion)
        })
        .collect();
    let batch = SequenceBatch::new(&pairs, m.tokenizer.pad_id(), Device::Cpu).unwrap();
    let mut best_nograd = f64::MAX;
    let mut best_fb = f64::MAX;
    for _ in 0..3 {
        let t = Instant::now();
        let _ = completion_logprobs(&m.model, &batch, 1.0);
        best_nograd = best_nograd.min(t.elapsed().as_secs_f64());
        let t = Instant::now();
        let pass = training_logprobs(&m.model, &batch, 1.0);
        (pass.logprobs() * batch.mask()).sum(Kind::Float).backward();
        pass.backward();
        best_fb = best_fb.min(t.elapsed().as_secs_f64());
        for v in m.vs.trainable_variables() {
            let mut g = v.grad();
            let _ = g.zero_();
        }
    }
    println!(
        "completion_logprobs: no-grad {best_nograd:.3}s; training_logprobs: forward+backward {best_fb:.3}s (best of 3)"
    );
}
