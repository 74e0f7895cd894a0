//! Peak resident memory of one training pass's log-probabilities and backward, with the logits in
//! chunks (`training_logprobs`) or whole under plain autograd (how training computed them before
//! chunks), on a random model of the built-in architecture with a vocabulary of `VOCAB`.
//!
//! cargo run -p rlvr-model --example logits_memory -- (chunked|whole) VOCAB ROWS TOKENS
//! e.g. `chunked 151936 4 512`. Prints the process's peak resident memory (`VmHWM`) before the
//! pass (model and batch) and after it, and the pass's time. Run each mode in its own process.

use std::path::Path;
use std::time::Instant;

use rlvr_model::{Llama, SequenceBatch, positions_from_mask, training_logprobs};
use tch::nn::VarStore;
use tch::{Device, Kind, Tensor};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let usage = "usage: logits_memory (chunked|whole) VOCAB ROWS TOKENS";
    let [mode, vocab, rows, tokens] = args.as_slice() else { panic!("{usage}") };
    let number = |s: &str| s.parse::<i64>().unwrap_or_else(|_| panic!("{usage}"));
    let (vocab, rows, tokens) = (number(vocab), number(rows), number(tokens));
    tch::set_num_threads(2);

    let mut config = rlvr_model::builtin::config(0);
    config.vocab_size = vocab;
    config.tie_word_embeddings = Some(false);
    config.max_position_embeddings = Some(tokens + 16);
    let spec = config.spec(Path::new("config.json")).unwrap();
    let vs = VarStore::new(Device::Cpu);
    tch::manual_seed(0);
    let model = Llama::build(&vs, &spec, Kind::Float, |name, shape| {
        Ok(if name.ends_with("norm.weight") {
            Tensor::ones(shape, (Kind::Float, Device::Cpu))
        } else {
            Tensor::randn(shape, (Kind::Float, Device::Cpu)) * 0.02
        })
    })
    .unwrap();
    let pairs: Vec<(Vec<i64>, Vec<i64>)> =
        (0..rows).map(|r| (vec![1, 4 + r], (0..tokens).map(|t| (7 * t + r) % vocab).collect())).collect();
    let batch = SequenceBatch::new(&pairs, 0, Device::Cpu).unwrap();
    let before = peak_mib();

    let started = Instant::now();
    model.set_training(Some(0));
    match mode.as_str() {
        "chunked" => {
            let pass = training_logprobs(&model, &batch, 1.0);
            model.set_training(None);
            pass.logprobs().sum(Kind::Float).backward();
            pass.backward();
        }
        "whole" => {
            // One pass over each row's prompt and completion, the whole logits under autograd.
            let c = batch.completion_width();
            let ids: Vec<i64> =
                pairs.iter().flat_map(|(p, comp)| p.iter().chain(&comp[..c as usize - 1]).copied()).collect();
            let ids = Tensor::from_slice(&ids).view([rows, c + 1]);
            let mask = Tensor::ones([rows, c + 1], (Kind::Int64, Device::Cpu));
            let hidden = model.forward(&ids, &positions_from_mask(&mask), &mask, None).narrow(1, 1, c);
            model.set_training(None);
            let logits = model.logits(&hidden).to_kind(Kind::Float);
            let picked = logits.gather(2, &batch.completion_ids().unsqueeze(-1), false).squeeze_dim(-1);
            let logprobs = (picked - logits.logsumexp([-1], false)) * batch.mask();
            logprobs.sum(Kind::Float).backward();
        }
        _ => panic!("{usage}"),
    }
    let seconds = started.elapsed().as_secs_f64();
    println!(
        "{mode}: V={vocab}, {rows} rows × {tokens} tokens, chunk {}: peak {before:.0} MiB before the pass, \
         {:.0} MiB after; {seconds:.2} s",
        model.logits_chunk(),
        peak_mib()
    );
}

/// The process's peak resident memory so far (`VmHWM`), in MiB.
fn peak_mib() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("read /proc/self/status");
    let line = status.lines().find(|l| l.starts_with("VmHWM:")).expect("VmHWM in /proc/self/status");
    let kib: f64 = line.split_whitespace().nth(1).and_then(|v| v.parse().ok()).expect("VmHWM in kB");
    kib / 1024.0
}
