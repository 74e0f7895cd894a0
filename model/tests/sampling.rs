//! Sampling and log-probabilities on the built-in model: batching with left padding, the
//! shared prompt prefix, agreement of the sampler's logprobs with `completion_logprobs`, stop
//! strings and EOS, and bit-exact resume of the sampler's RNG. Then the decoding loop against
//! the one it replaced (on the built-in model and SmolLM2), nucleus sampling against a sort of
//! the whole vocabulary, greedy decoding against the model's argmax, and stop strings found in
//! decoded tails against a full decode.

use crate::common;

use rlvr_model::{
    Finish, LlamaConfig, LoadedModel, SamplerRng, SamplingParams, SequenceBatch, StopScan, Tokenizer,
    completion_logprobs, generate, load, logprob_temperature, sample_logits, save_pretrained,
    training_logprobs,
};
use tch::{Device, Kind, Tensor};

fn model(seed: u64) -> LoadedModel {
    load(&format!("builtin:tiny-arith?seed={seed}"), Device::Cpu, Kind::Float).unwrap()
}

fn prompts(m: &LoadedModel, texts: &[&str]) -> Vec<Vec<i64>> {
    texts.iter().map(|t| m.tokenizer.encode_prompt(t).unwrap()).collect()
}

const TEXTS: [&str; 3] = ["12+7=", "What is 345 * 2? ", "9-3="];

fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max)
}

#[test]
fn batched_greedy_with_left_padding_equals_one_by_one() {
    let m = model(0);
    let ps = prompts(&m, &TEXTS);
    let params = SamplingParams { max_new_tokens: 24, temperature: 0.0, ..Default::default() };
    let batched = generate(&m.model, &m.tokenizer, &ps, 1, &params, &mut SamplerRng::new(1)).unwrap();
    assert_eq!(batched.len(), 3);
    for (i, p) in ps.iter().enumerate() {
        let alone =
            generate(&m.model, &m.tokenizer, std::slice::from_ref(p), 1, &params, &mut SamplerRng::new(1))
                .unwrap();
        assert_eq!(batched[i].prompt_index, i);
        assert_eq!(batched[i].tokens, alone[0].tokens, "prompt {i}");
        assert_eq!(batched[i].text, alone[0].text);
        assert!(max_diff(&batched[i].logprobs, &alone[0].logprobs) <= 1e-5);
        assert_eq!(batched[i].tokens.len(), 24);
        assert_eq!(batched[i].finish, Finish::Length);
    }
}

/// `ignore_eos`: every completion runs to `max_new_tokens`, its EOS tokens kept as any others
/// (hot sampling makes them common here: without it, completions end early).
#[test]
fn with_ignore_eos_every_completion_runs_to_its_length() {
    let m = model(0);
    let ps = prompts(&m, &TEXTS);
    let params = SamplingParams { max_new_tokens: 48, temperature: 4.0, ..Default::default() };
    let ending = generate(&m.model, &m.tokenizer, &ps, 8, &params, &mut SamplerRng::new(3)).unwrap();
    assert!(ending.iter().any(|row| row.finish == Finish::Eos), "a completion sampled its EOS");
    let params = SamplingParams { ignore_eos: true, ..params };
    let running = generate(&m.model, &m.tokenizer, &ps, 8, &params, &mut SamplerRng::new(3)).unwrap();
    assert!(running.iter().all(|row| row.finish == Finish::Length && row.tokens.len() == 48));
    let eos = m.tokenizer.eos_ids()[0];
    assert!(running.iter().any(|row| row.tokens.contains(&eos)), "an EOS token kept");
    // Another engine's tokens are cut by the same rule.
    let tokens = ending.iter().find(|row| row.finish == Finish::Eos).unwrap().tokens.clone();
    let mut longer = tokens.clone();
    longer.extend([5, 6]);
    let kept = rlvr_model::Sampled::ended(0, longer.clone(), vec![0.0; longer.len()], &m.tokenizer, &params)
        .unwrap();
    assert_eq!((kept.tokens, kept.finish), (longer, Finish::Length));
}

#[test]
fn shared_prefix_equals_repeated_prompts() {
    let m = model(1);
    let ps = prompts(&m, &TEXTS[..2]);
    let params = SamplingParams { max_new_tokens: 20, temperature: 1.0, top_p: 0.95, ..Default::default() };
    let shared = generate(&m.model, &m.tokenizer, &ps, 4, &params, &mut SamplerRng::new(9)).unwrap();
    let repeated: Vec<Vec<i64>> = ps.iter().flat_map(|p| std::iter::repeat_n(p.clone(), 4)).collect();
    let plain = generate(&m.model, &m.tokenizer, &repeated, 1, &params, &mut SamplerRng::new(9)).unwrap();
    assert_eq!(shared.len(), 8);
    for (i, (a, b)) in shared.iter().zip(&plain).enumerate() {
        assert_eq!(a.prompt_index, i / 4, "group-contiguous");
        assert_eq!(a.tokens, b.tokens, "row {i}");
        let d = max_diff(&a.logprobs, &b.logprobs);
        assert!(d <= 1e-5, "row {i}: {d}");
    }
    // Sampling at T = 1 differs between the completions of a group.
    assert!(shared[..4].windows(2).any(|w| w[0].tokens != w[1].tokens));
}

/// The sampler's logprobs equal what `completion_logprobs` computes for the same tokens.
fn check_logprobs_agree(m: &LoadedModel, params: &SamplingParams, group: usize) {
    let ps = prompts(m, &TEXTS);
    let out = generate(&m.model, &m.tokenizer, &ps, group, params, &mut SamplerRng::new(4)).unwrap();
    let pairs: Vec<(Vec<i64>, Vec<i64>)> =
        out.iter().map(|s| (ps[s.prompt_index].clone(), s.tokens.clone())).collect();
    let batch = SequenceBatch::new(&pairs, m.tokenizer.pad_id(), Device::Cpu).unwrap();
    assert_eq!(batch.num_prompts(), 3);
    let (lp, hidden) = tch::no_grad(|| completion_logprobs(&m.model, &batch, params.temperature));
    let c = batch.completion_width();
    assert_eq!(lp.size(), [out.len() as i64, c]);
    assert_eq!(hidden.size(), [out.len() as i64, c, m.model.hidden_size()]);
    let mut worst = 0f32;
    for (r, s) in out.iter().enumerate() {
        let row = Vec::<f32>::try_from(lp.get(r as i64)).unwrap();
        worst = worst.max(max_diff(&row[..s.tokens.len()], &s.logprobs));
        assert!(row[s.tokens.len()..].iter().all(|&x| x == 0.0), "padding is masked");
    }
    println!(
        "T={} top_p={} top_k={}: max |sampler - completion_logprobs| = {worst:.2e}",
        params.temperature, params.top_p, params.top_k
    );
    assert!(worst <= 1e-5, "{worst}");
    let mask = Vec::<f32>::try_from(batch.mask().sum_dim_intlist(1, false, Kind::Float)).unwrap();
    assert_eq!(mask, out.iter().map(|s| s.tokens.len() as f32).collect::<Vec<_>>());

    // Without sharing (each pair alone) the numbers are the same.
    for (r, pair) in pairs.iter().enumerate().step_by(5) {
        let alone =
            SequenceBatch::new(std::slice::from_ref(pair), m.tokenizer.pad_id(), Device::Cpu).unwrap();
        let (lp1, _) = tch::no_grad(|| completion_logprobs(&m.model, &alone, params.temperature));
        let a = Vec::<f32>::try_from(lp1.get(0)).unwrap();
        let b = Vec::<f32>::try_from(lp.get(r as i64)).unwrap();
        assert!(max_diff(&a, &b[..a.len()]) <= 1e-5);
    }
}

#[test]
fn completion_logprobs_equal_sampler_logprobs() {
    let m = model(2);
    check_logprobs_agree(
        &m,
        &SamplingParams { max_new_tokens: 16, temperature: 0.7, top_p: 0.9, ..Default::default() },
        4,
    );
    check_logprobs_agree(
        &m,
        &SamplingParams { max_new_tokens: 12, temperature: 1.3, top_k: 5, ..Default::default() },
        2,
    );
    check_logprobs_agree(
        &m,
        &SamplingParams { max_new_tokens: 12, temperature: 0.0, ..Default::default() },
        1,
    );
}

#[test]
fn training_logprobs_have_gradients() {
    let m = model(3);
    let ps = prompts(&m, &TEXTS[..2]);
    let pairs = vec![(ps[0].clone(), vec![20, 21, 22]), (ps[0].clone(), vec![30]), (ps[1].clone(), vec![])];
    let batch = SequenceBatch::new(&pairs, 0, Device::Cpu).unwrap();
    let pass = training_logprobs(&m.model, &batch, 1.0);
    assert!(pass.logprobs().requires_grad());
    let loss = -(pass.logprobs().sum(Kind::Float));
    loss.backward();
    pass.backward();
    let grads: Vec<Tensor> = m.vs.trainable_variables().iter().map(|v| v.grad()).collect();
    assert!(grads.iter().all(|g| g.defined()));
    let total: f64 = grads.iter().map(|g| g.abs().sum(Kind::Float).double_value(&[])).sum();
    assert!(total > 0.0 && total.is_finite());
    // An empty completion has an all-zero mask row.
    assert_eq!(Vec::<f32>::try_from(batch.mask().get(2)).unwrap(), vec![0.0; 3]);
}

#[test]
fn stop_strings_and_eos() {
    let m = model(0);
    let ps = prompts(&m, &TEXTS[..1]);
    // Sampled (a random model's greedy text is one character repeated); the same seed draws
    // the same tokens as long as the logits are the same.
    let greedy = SamplingParams { max_new_tokens: 24, temperature: 1.0, ..Default::default() };
    let free = generate(&m.model, &m.tokenizer, &ps, 1, &greedy, &mut SamplerRng::new(0)).unwrap().remove(0);
    println!("free-running: {:?}", free.text);
    assert_eq!(free.text, m.tokenizer.decode(&free.tokens));

    // A stop string that ends inside the free-running text: the completion stops at the token
    // completing it, the stop string ends `text`.
    let stop: String = free.text.chars().skip(5).take(2).collect();
    let first = free.text.find(&stop).unwrap();
    let params = SamplingParams { stop: vec!["\u{1}never".into(), stop.clone()], ..greedy.clone() };
    let s = generate(&m.model, &m.tokenizer, &ps, 1, &params, &mut SamplerRng::new(0)).unwrap().remove(0);
    assert_eq!(s.finish, Finish::Stop);
    assert_eq!(s.text, free.text[..first + stop.len()]);
    assert!(s.text.ends_with(&stop));
    assert_eq!(s.tokens[..], free.tokens[..s.tokens.len()]);
    assert_eq!(s.tokens.len(), first + stop.len(), "one token per character: nothing after the stop string");

    // EOS: declare a token the model first emits a few steps in an EOS id (through a
    // checkpoint whose config says so); the completion ends there, EOS kept in tokens, left
    // out of text.
    let tmp = tempfile::tempdir().unwrap();
    let mut m2 = model(0);
    let eos = *free.tokens.iter().find(|&&t| free.tokens.iter().position(|&u| u == t).unwrap() >= 3).unwrap();
    m2.config.eos_token_id = Some(serde_json::json!([2, eos]));
    let dir = tmp.path().join("eos");
    save_pretrained(&m2, &dir).unwrap();
    let m3 = load(dir.to_str().unwrap(), Device::Cpu, Kind::Float).unwrap();
    assert_eq!(m3.tokenizer.eos_ids(), &[2, eos]);
    let e = generate(&m3.model, &m3.tokenizer, &ps, 1, &greedy, &mut SamplerRng::new(0)).unwrap().remove(0);
    let at = free.tokens.iter().position(|&t| t == eos).unwrap();
    assert!(at >= 3);
    assert_eq!(e.finish, Finish::Eos);
    assert_eq!(e.tokens, free.tokens[..=at]);
    assert_eq!(e.logprobs.len(), e.tokens.len());
    assert_eq!(e.text, m.tokenizer.decode(&free.tokens[..at]));
}

#[test]
fn rows_finish_independently_in_one_batch() {
    // Rows that stop early do not change the rows that go on (the batch is compacted).
    let m = model(6);
    let ps = prompts(&m, &TEXTS);
    let params = SamplingParams {
        max_new_tokens: 30,
        temperature: 1.0,
        stop: vec!["1".into(), "e".into()],
        ..Default::default()
    };
    let out = generate(&m.model, &m.tokenizer, &ps, 8, &params, &mut SamplerRng::new(11)).unwrap();
    assert_eq!(out.len(), 24);
    let stopped = out.iter().filter(|s| s.finish == Finish::Stop).count();
    assert!(stopped > 0 && stopped < 24, "{stopped}");
    for s in &out {
        match s.finish {
            Finish::Stop => assert!(s.text.ends_with('1') || s.text.ends_with('e'), "{:?}", s.text),
            Finish::Length => assert_eq!(s.tokens.len(), 30),
            Finish::Eos => {}
        }
        assert_eq!(s.tokens.len(), s.logprobs.len());
    }
    // Each row against the same row sampled without stop strings: identical up to its end.
    let free = SamplingParams { stop: vec![], ..params.clone() };
    let all = generate(&m.model, &m.tokenizer, &ps, 8, &free, &mut SamplerRng::new(11)).unwrap();
    for (a, b) in out.iter().zip(&all) {
        assert_eq!(a.tokens[..], b.tokens[..a.tokens.len()]);
        assert!(max_diff(&a.logprobs, &b.logprobs[..a.logprobs.len()]) <= 1e-5);
    }
}

#[test]
fn same_seed_same_completions_and_rng_resume_is_exact() {
    let m = model(0);
    let ps = prompts(&m, &TEXTS);
    let params =
        SamplingParams { max_new_tokens: 16, temperature: 0.9, top_p: 0.8, top_k: 20, ..Default::default() };
    let mut rng = SamplerRng::new(42);
    let first = generate(&m.model, &m.tokenizer, &ps, 2, &params, &mut rng).unwrap();
    let saved = serde_json::to_string(&rng).unwrap();
    let second = generate(&m.model, &m.tokenizer, &ps, 2, &params, &mut rng).unwrap();
    assert_ne!(first, second, "the generator moved on");

    let again = generate(&m.model, &m.tokenizer, &ps, 2, &params, &mut SamplerRng::new(42)).unwrap();
    assert_eq!(first, again);
    let mut resumed: SamplerRng = serde_json::from_str(&saved).unwrap();
    let second_again = generate(&m.model, &m.tokenizer, &ps, 2, &params, &mut resumed).unwrap();
    assert_eq!(second, second_again);
}

#[test]
fn invalid_requests_are_refused() {
    let m = model(0);
    let ok = prompts(&m, &TEXTS[..1]);
    let p = SamplingParams::default();
    let mut rng = SamplerRng::new(0);
    assert!(generate(&m.model, &m.tokenizer, &[vec![]], 1, &p, &mut rng).is_err());
    assert!(generate(&m.model, &m.tokenizer, &[vec![500]], 1, &p, &mut rng).is_err());
    assert!(generate(&m.model, &m.tokenizer, &ok, 0, &p, &mut rng).is_err());
    assert!(
        generate(&m.model, &m.tokenizer, &ok, 1, &SamplingParams { top_p: 0.0, ..p.clone() }, &mut rng)
            .is_err()
    );
    assert!(
        generate(
            &m.model,
            &m.tokenizer,
            &ok,
            1,
            &SamplingParams { temperature: -1.0, ..p.clone() },
            &mut rng
        )
        .is_err()
    );
    let none = generate(&m.model, &m.tokenizer, &ok, 2, &SamplingParams { max_new_tokens: 0, ..p }, &mut rng)
        .unwrap();
    assert!(none.iter().all(|s| s.tokens.is_empty() && s.finish == Finish::Length));
    assert!(SequenceBatch::new::<Vec<i64>, Vec<i64>>(&[], 0, Device::Cpu).is_err());
}

// --- The decoding loop against the one it replaced -------------------------------------------

/// The sampler as it was before its decoding loop read one thing per token from the device: a
/// full decode of every completion after each token for stop strings, a whole-vocabulary sort
/// for nucleus sampling, tokens and log-probabilities read back at every step, the mask's
/// padding read from the device at every forward pass. Kept as the reference the new loop must
/// equal, token for token and bit for bit.
mod legacy {
    use rlvr_model::{
        Finish, KvCache, Llama, Sampled, SamplerRng, SamplingParams, Tokenizer, positions_from_mask,
    };
    use tch::{Kind, Tensor};

    pub fn generate(
        model: &Llama,
        tokenizer: &Tokenizer,
        prompts: &[Vec<i64>],
        group_size: usize,
        params: &SamplingParams,
        rng: &mut SamplerRng,
    ) -> Vec<Sampled> {
        let n = prompts.len() * group_size;
        let mut row_rngs: Vec<SamplerRng> = (0..n).map(|_| rng.fork()).collect();
        let mut out: Vec<Sampled> = (0..n)
            .map(|r| Sampled {
                prompt_index: r / group_size,
                tokens: Vec::new(),
                logprobs: Vec::new(),
                text: String::new(),
                finish: Finish::Length,
            })
            .collect();
        tch::no_grad(|| sample_loop(model, tokenizer, prompts, group_size, params, &mut row_rngs, &mut out));
        out
    }

    fn left_pad(prompts: &[&[i64]], pad_id: i64, device: tch::Device) -> (Tensor, Tensor) {
        let len = prompts.iter().map(|p| p.len()).max().unwrap_or(0);
        let mut ids = Vec::with_capacity(prompts.len() * len);
        let mut mask = Vec::with_capacity(prompts.len() * len);
        for p in prompts {
            let pad = len - p.len();
            ids.extend(std::iter::repeat_n(pad_id, pad).chain(p.iter().copied()));
            mask.extend(std::iter::repeat_n(0i64, pad).chain(std::iter::repeat_n(1i64, p.len())));
        }
        let shape = [prompts.len() as i64, len as i64];
        (
            Tensor::from_slice(&ids).view(shape).to_device(device),
            Tensor::from_slice(&mask).view(shape).to_device(device),
        )
    }

    fn sample_loop(
        model: &Llama,
        tokenizer: &Tokenizer,
        prompts: &[Vec<i64>],
        group_size: usize,
        params: &SamplingParams,
        row_rngs: &mut [SamplerRng],
        out: &mut [Sampled],
    ) {
        let device = model.device();
        let g = group_size as i64;
        let max_new = params.max_new_tokens;
        let refs: Vec<&[i64]> = prompts.iter().map(Vec::as_slice).collect();
        let (ids, mask) = left_pad(&refs, tokenizer.pad_id(), device);
        let plen = ids.size()[1];

        // Prefill each distinct prompt once, then share its cache with its group.
        let mut cache = KvCache::new();
        let hidden = model.forward(&ids, &positions_from_mask(&mask), &mask, Some(&mut cache));
        let mut logits = model.logits(&hidden.select(1, plen - 1)).to_kind(Kind::Float);
        let mut mask = mask;
        let mut next_pos =
            Tensor::from_slice(&prompts.iter().map(|p| p.len() as i64).collect::<Vec<_>>()).to_device(device);
        // Room for the completions first, on the P prompt rows: the expansion copies it along.
        cache.reserve(max_new as i64);
        if g > 1 {
            cache = cache.repeat_interleave(g);
            logits = logits.repeat_interleave_self_int(g, 0, None::<i64>);
            mask = mask.repeat_interleave_self_int(g, 0, None::<i64>);
            next_pos = next_pos.repeat_interleave_self_int(g, 0, None::<i64>);
        }

        // rows[b] = which completion batch row b is.
        let mut rows: Vec<usize> = (0..out.len()).collect();
        let mut done = vec![false; out.len()];
        let max_stop = params.stop.iter().map(String::len).max().unwrap_or(0);
        for step in 0..max_new {
            let uniforms: Vec<f64> = if params.temperature > 0.0 {
                rows.iter().map(|&r| row_rngs[r].next_f64()).collect()
            } else {
                Vec::new()
            };
            let (tokens, logprobs) = sample_step(&logits, params, &uniforms);
            let token_vec = Vec::<i64>::try_from(&tokens).expect("int64 tokens");
            let logprob_vec = Vec::<f32>::try_from(&logprobs).expect("f32 logprobs");
            for (b, &r) in rows.iter().enumerate() {
                if done[r] {
                    continue;
                }
                let row = &mut out[r];
                row.tokens.push(token_vec[b]);
                row.logprobs.push(logprob_vec[b]);
                if tokenizer.is_eos(token_vec[b]) {
                    row.finish = Finish::Eos;
                    done[r] = true;
                } else if max_stop > 0 {
                    let text = tokenizer.decode(&row.tokens);
                    // Only a match that ends in this token's text is new: search the tail.
                    let from = floor_char_boundary(&text, text.len().saturating_sub(max_stop + 32));
                    let hit = params
                        .stop
                        .iter()
                        .filter_map(|s| text[from..].find(s.as_str()).map(|i| from + i + s.len()))
                        .min();
                    if let Some(end) = hit {
                        row.text = text[..end].to_owned();
                        row.finish = Finish::Stop;
                        done[r] = true;
                    }
                }
                if !done[r] && step + 1 == max_new {
                    row.finish = Finish::Length;
                    done[r] = true;
                }
            }
            let active: Vec<usize> = (0..rows.len()).filter(|&b| !done[rows[b]]).collect();
            if active.is_empty() {
                break;
            }
            let mut tokens = tokens;
            if active.len() * 2 <= rows.len() {
                // Compact: drop finished rows from the batch (and their cache).
                let idx = Tensor::from_slice(&active.iter().map(|&b| b as i64).collect::<Vec<_>>())
                    .to_device(device);
                cache = cache.index_select(&idx);
                mask = mask.index_select(0, &idx);
                next_pos = next_pos.index_select(0, &idx);
                tokens = tokens.index_select(0, &idx);
                rows = active.iter().map(|&b| rows[b]).collect();
            }
            let nb = rows.len() as i64;
            mask = Tensor::cat(&[&mask, &Tensor::ones([nb, 1], (Kind::Int64, device))], 1);
            let hidden =
                model.forward(&tokens.view([nb, 1]), &next_pos.view([nb, 1]), &mask, Some(&mut cache));
            logits = model.logits(&hidden.squeeze_dim(1)).to_kind(Kind::Float);
            next_pos += 1;
        }
        for row in out.iter_mut() {
            match row.finish {
                Finish::Stop => {}
                // The EOS token is not text, special token or not.
                Finish::Eos => row.text = tokenizer.decode(&row.tokens[..row.tokens.len() - 1]),
                Finish::Length => row.text = tokenizer.decode(&row.tokens),
            }
        }
    }

    fn floor_char_boundary(s: &str, mut i: usize) -> usize {
        while i > 0 && !s.is_char_boundary(i) {
            i -= 1;
        }
        i
    }

    /// One token per row from `logits [N, V]` (f32): the token and its log-probability under
    /// `log_softmax(logits / T)` (T = 1 for greedy).
    pub fn sample_step(logits: &Tensor, params: &SamplingParams, uniforms: &[f64]) -> (Tensor, Tensor) {
        if params.temperature == 0.0 {
            let tokens = logits.argmax(-1, false);
            let logprobs =
                logits.log_softmax(-1, Kind::Float).gather(1, &tokens.unsqueeze(1), false).squeeze_dim(1);
            return (tokens, logprobs);
        }
        let device = logits.device();
        let vocab = logits.size()[1];
        let scaled = logits / params.temperature;
        let logp = scaled.log_softmax(-1, Kind::Float);
        let top_k = params.top_k as i64;
        let filter = (top_k > 0 && top_k < vocab) || params.top_p < 1.0;
        // The candidates, most likely first when filtering, and their probabilities.
        let (probs, order) = if filter {
            let (values, order) = if top_k > 0 && top_k < vocab {
                scaled.topk(top_k, -1, true, true)
            } else {
                scaled.sort(-1, true)
            };
            let mut probs = values.softmax(-1, Kind::Double);
            if params.top_p < 1.0 {
                // Keep a token while the mass before it is below top_p (the first always stays).
                let before = probs.cumsum(-1, Kind::Double) - &probs;
                probs *= before.lt(params.top_p).to_kind(Kind::Double);
            }
            (probs, Some(order))
        } else {
            (logp.to_kind(Kind::Double).exp(), None)
        };
        // Inverse CDF: the first index whose cumulative mass exceeds u · total.
        let cdf = probs.cumsum(-1, Kind::Double);
        let width = cdf.size()[1];
        let total = cdf.select(1, width - 1);
        let u = Tensor::from_slice(uniforms).to_device(device);
        let target = (u * &total).unsqueeze(1);
        // Binary search: the number of entries ≤ target (first index whose mass exceeds it).
        let mut idx = target.searchsorted(&cdf, false, true, "right", None::<Tensor>).squeeze_dim(1);
        // u · total rounding up to total would point past the end: take the last token with mass.
        let last = cdf.argmax(-1, false);
        idx = last.where_self(&idx.ge(width), &idx);
        let tokens = match order {
            Some(order) => order.gather(1, &idx.unsqueeze(1), false).squeeze_dim(1),
            None => idx,
        };
        let logprobs = logp.gather(1, &tokens.unsqueeze(1), false).squeeze_dim(1);
        (tokens, logprobs)
    }
}

/// Both loops on the same inputs: identical completions, log-probabilities to the bit.
fn check_same_as_legacy(m: &LoadedModel, texts: &[&str], group: usize, params: &SamplingParams, seed: u64) {
    let ps = prompts(m, texts);
    let new = generate(&m.model, &m.tokenizer, &ps, group, params, &mut SamplerRng::new(seed)).unwrap();
    let old = legacy::generate(&m.model, &m.tokenizer, &ps, group, params, &mut SamplerRng::new(seed));
    assert_eq!(new.len(), old.len());
    for (r, (a, b)) in new.iter().zip(&old).enumerate() {
        let what = format!("{params:?}, group {group}, row {r}");
        assert_eq!((a.prompt_index, &a.tokens, a.finish), (b.prompt_index, &b.tokens, b.finish), "{what}");
        assert_eq!(a.text, b.text, "{what}");
        let bits = |l: &[f32]| l.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&a.logprobs), bits(&b.logprobs), "{what}");
    }
    let finishes = |f: Finish| new.iter().filter(|s| s.finish == f).count();
    println!(
        "{params:?} × {group}: {} completions, {} tokens, stop/eos/length {}/{}/{}",
        new.len(),
        new.iter().map(|s| s.tokens.len()).sum::<usize>(),
        finishes(Finish::Stop),
        finishes(Finish::Eos),
        finishes(Finish::Length)
    );
}

#[test]
fn the_decoding_loop_equals_the_one_it_replaced() {
    let stop = |s: &[&str]| s.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let p = |max_new_tokens, temperature, top_p, top_k, stop: Vec<String>| SamplingParams {
        max_new_tokens,
        temperature,
        top_p,
        top_k,
        stop,
        ignore_eos: false,
    };
    // (model seed, prompts, group, params, sampler seed); prompts of unequal length are left-padded.
    let cases: Vec<(u64, &[&str], usize, SamplingParams, u64)> = vec![
        (0, &TEXTS, 1, p(24, 0.0, 1.0, 0, vec![]), 1),
        (1, &TEXTS, 4, p(20, 1.0, 1.0, 0, vec![]), 9),
        (2, &TEXTS, 4, p(16, 0.7, 0.9, 0, vec![]), 4),
        (2, &TEXTS, 2, p(12, 1.3, 1.0, 5, vec![]), 4),
        (0, &TEXTS, 2, p(16, 0.9, 0.8, 20, vec![]), 42),
        // Rows stopping at different steps: the batch is compacted.
        (6, &TEXTS, 8, p(30, 1.0, 1.0, 0, stop(&["1", "e"])), 11),
        // Prompts of one length: no padding anywhere.
        (3, &["1+1=", "2+2=", "9-9="], 3, p(20, 1.0, 0.95, 0, vec![]), 5),
        // Past the 64 steps of one copy of random numbers, compacting on the way.
        (4, &TEXTS, 3, p(100, 1.0, 0.95, 0, stop(&["7"])), 3),
    ];
    for (model_seed, texts, group, params, seed) in cases {
        check_same_as_legacy(&model(model_seed), texts, group, &params, seed);
    }
    // Stop strings of several tokens (one character each), taken from completions sampled
    // without them so that they are met.
    let m = model(6);
    let free = p(40, 1.0, 0.95, 0, vec![]);
    let out =
        legacy::generate(&m.model, &m.tokenizer, &prompts(&m, &TEXTS), 4, &free, &mut SamplerRng::new(12));
    let pieces: Vec<String> = out
        .iter()
        .step_by(3)
        .filter_map(|s| s.text.get(12..12 + 2 + s.tokens.len() % 2).map(str::to_owned))
        .collect();
    check_same_as_legacy(&m, &TEXTS, 4, &SamplingParams { stop: pieces, ..free }, 12);
}

/// SmolLM2's 49,152-token vocabulary (byte-level BPE): nucleus sampling ranks 256 candidates
/// (more when a nucleus is wider: likely at T = 1.2, top-p 0.98) instead of sorting, and a stop
/// string is found across a token boundary in decoded tails.
#[test]
fn on_a_byte_level_bpe_model_the_decoding_loop_equals_the_one_it_replaced() {
    let dir = common::smollm2_dir();
    let m = load(dir.to_str().unwrap(), Device::Cpu, Kind::Float).unwrap();
    let texts = ["What is 2+3?", "Name a prime number larger than ten, and say why.", "Hi"];
    let free = SamplingParams { max_new_tokens: 12, temperature: 1.2, top_p: 0.98, ..Default::default() };
    check_same_as_legacy(&m, &texts, 2, &free, 0);
    // A stop string that spans a token boundary in the first completion's text.
    let ps = prompts(&m, &texts);
    let first = generate(&m.model, &m.tokenizer, &ps, 2, &free, &mut SamplerRng::new(0)).unwrap().remove(0);
    let chars: Vec<char> = first.text.chars().collect();
    let spanning = (0..chars.len().saturating_sub(6))
        .map(|i| chars[i..i + 6].iter().collect::<String>())
        .find(|s| !first.tokens.iter().any(|&t| m.tokenizer.decode(&[t]).contains(s.as_str())))
        .expect("a 6-character piece of the text no one token holds");
    println!("stop string {spanning:?} in {:?}", first.text);
    let stopped = SamplingParams { stop: vec![spanning, "\n\n".into()], ..free.clone() };
    check_same_as_legacy(&m, &texts, 2, &stopped, 0);
}

// --- Nucleus sampling without a sort of the vocabulary ----------------------------------------

/// Nucleus sampling by a stable descending sort of the whole row: ties in token-id order,
/// probabilities the row's softmax (f64), a token kept while the mass before it is below top_p,
/// then the inverse CDF of `u`.
fn full_sort_nucleus(logits: &Tensor, temperature: f64, top_p: f64, uniforms: &[f64]) -> Vec<i64> {
    let scaled = logits / temperature;
    let (_, order) = scaled.sort_stable(true, -1, true);
    let probs = scaled.softmax(-1, Kind::Double).gather(1, &order, false);
    let before = probs.cumsum(-1, Kind::Double) - &probs;
    let probs = probs * before.lt(top_p).to_kind(Kind::Double);
    let cdf = probs.cumsum(-1, Kind::Double);
    let width = cdf.size()[1];
    let target = (Tensor::from_slice(uniforms) * cdf.select(1, width - 1)).unsqueeze(1);
    let idx = target.searchsorted(&cdf, false, true, "right", None::<Tensor>).squeeze_dim(1);
    let idx = cdf.argmax(-1, false).where_self(&idx.ge(width), &idx);
    Vec::<i64>::try_from(order.gather(1, &idx.unsqueeze(1), false).squeeze_dim(1)).unwrap()
}

/// How many tokens the nucleus of each row keeps.
fn nucleus_sizes(logits: &Tensor, temperature: f64, top_p: f64) -> Vec<i64> {
    let (values, _) = (logits / temperature).sort(-1, true);
    let probs = values.softmax(-1, Kind::Double);
    let before = probs.cumsum(-1, Kind::Double) - &probs;
    Vec::<i64>::try_from(before.lt(top_p).sum_dim_intlist(1, false, Kind::Int64)).unwrap()
}

#[test]
fn nucleus_sampling_gives_the_tokens_of_a_sort_of_the_whole_vocabulary() {
    let (rows, vocab) = (32, 3000);
    let mut rng = SamplerRng::new(17);
    let (mut draws, mut wide, mut legacy_compared, mut legacy_differ) = (0, 0, 0, 0);
    for seed in 0..2 {
        tch::manual_seed(seed);
        let normal = Tensor::randn([rows, vocab], (Kind::Float, Device::Cpu));
        // Sharp to flat distributions; bf16-rounded logits have many equal values.
        for (scale, bf16) in
            [(8.0, false), (2.0, false), (0.5, false), (0.05, false), (2.0, true), (0.5, true)]
        {
            let mut logits = &normal * scale;
            if bf16 {
                logits = logits.to_kind(Kind::BFloat16).to_kind(Kind::Float);
            }
            for top_p in [0.05, 0.5, 0.9, 0.95, 0.999, 1.0 - 1e-12] {
                let temperature = if bf16 { 1.0 } else { 0.8 };
                let mut uniforms: Vec<f64> = (0..rows).map(|_| rng.next_f64()).collect();
                // The ends of [0, 1).
                uniforms[0] = 0.0;
                uniforms[1] = 1.0 - f64::EPSILON / 2.0;
                let params = SamplingParams { temperature, top_p, ..Default::default() };
                let (tokens, logprobs) = sample_logits(&logits, &params, &uniforms).unwrap();
                let expected = full_sort_nucleus(&logits, temperature, top_p, &uniforms);
                assert_eq!(tokens, expected, "seed {seed}, scale {scale}, bf16 {bf16}, top_p {top_p}");
                let logp = (&logits / temperature).log_softmax(-1, Kind::Float);
                let picked = logp.gather(1, &Tensor::from_slice(&tokens).unsqueeze(1), false).squeeze_dim(1);
                assert_eq!(logprobs, Vec::<f32>::try_from(picked).unwrap());
                draws += rows as usize;
                wide += nucleus_sizes(&logits, temperature, top_p).iter().filter(|&&k| k > 256).count();
                // Against the sampler as it was (an unstable sort, the softmax of the sorted
                // row), where no two logits of a row are equal.
                if !bf16 {
                    let (old, _) = legacy::sample_step(&logits, &params, &uniforms);
                    let old = Vec::<i64>::try_from(old).unwrap();
                    legacy_compared += rows as usize;
                    legacy_differ += old.iter().zip(&tokens).filter(|(a, b)| a != b).count();
                }
            }
        }
    }
    println!(
        "{draws} draws equal to the full sort's, {wide} of them with a nucleus wider than 256 tokens; \
         {legacy_differ} of {legacy_compared} differ from the former sampler's"
    );
    assert!(wide > draws / 10, "the test must reach nuclei wider than the first candidates");
    assert_eq!(legacy_differ, 0);
}

// --- Greedy decoding ---------------------------------------------------------------------------

#[test]
fn greedy_decoding_takes_the_argmax_with_untempered_logprobs() {
    assert_eq!(logprob_temperature(0.0), 1.0);
    assert_eq!(logprob_temperature(0.7), 0.7);
    let m = model(5);
    let ps = prompts(&m, &TEXTS);
    // top_p and top_k are ignored when greedy.
    let params =
        SamplingParams { max_new_tokens: 16, temperature: 0.0, top_p: 0.5, top_k: 3, ..Default::default() };
    let out = generate(&m.model, &m.tokenizer, &ps, 2, &params, &mut SamplerRng::new(0)).unwrap();
    for s in &out {
        let prompt = &ps[s.prompt_index];
        let full: Vec<i64> = prompt.iter().chain(&s.tokens).copied().collect();
        let logits = common::our_logits(&m.model, &[full]).squeeze_dim(0);
        for (i, (&token, &logprob)) in s.tokens.iter().zip(&s.logprobs).enumerate() {
            let row = logits.get(prompt.len() as i64 - 1 + i as i64);
            assert_eq!(row.argmax(-1, false).int64_value(&[]), token, "position {i}");
            let untempered = row.log_softmax(-1, Kind::Float).double_value(&[token]) as f32;
            assert!((untempered - logprob).abs() <= 1e-5, "position {i}: {untempered} vs {logprob}");
        }
    }
    // The completions of a group are the same tokens, text and finish. Their log-probabilities
    // are equal only up to rounding, not to the bit: the two are different rows of one batch,
    // and a GEMM may take another micro-kernel or summation order for a row by where it falls
    // in its blocks (or how its memory is aligned), which depends on the CPU and the BLAS or
    // oneDNN path. Bit-equal on Intel AVX-512 with either path; on AMD Zen 4 they differed
    // (both paths); here MKL's SSE4.2 and AVX kernels (`MKL_CBWR=SSE4_2` or `AVX`,
    // `RLVR_CPU_MATMUL=blas`, one thread) put them 2.4e-7 apart, tokens equal.
    let mut worst = 0f32;
    for (p, g) in out.chunks(2).enumerate() {
        let (a, b) = (&g[0], &g[1]);
        assert_eq!(
            (a.prompt_index, &a.tokens, &a.text, a.finish),
            (b.prompt_index, &b.tokens, &b.text, b.finish),
            "prompt {p}: the two greedy completions differ"
        );
        let d = max_diff(&a.logprobs, &b.logprobs);
        let bits = a.logprobs.iter().zip(&b.logprobs).filter(|(x, y)| x.to_bits() != y.to_bits()).count();
        println!(
            "prompt {p}: tokens equal; logprobs differ by up to {d:.1e} ({bits} of {} not bit-equal)",
            a.logprobs.len()
        );
        worst = worst.max(d);
    }
    assert!(worst <= 1e-5, "the greedy completions of a group differ in log-probability by {worst}");

    // One step on its own: exactly the argmax and the log-softmax at temperature 1.
    tch::manual_seed(3);
    let logits = Tensor::randn([16, 500], (Kind::Float, Device::Cpu)) * 3.0;
    let (tokens, logprobs) = sample_logits(&logits, &params, &[]).unwrap();
    assert_eq!(tokens, Vec::<i64>::try_from(logits.argmax(-1, false)).unwrap());
    let picked =
        logits.log_softmax(-1, Kind::Float).gather(1, &Tensor::from_slice(&tokens).unsqueeze(1), false);
    assert_eq!(logprobs, Vec::<f32>::try_from(picked.squeeze_dim(1)).unwrap());
}

// --- Stop strings from decoded tails -----------------------------------------------------------

/// The rule applied to the full decode of `tokens`: where the first stop string found in the
/// last `longest + 32` bytes ends, and the text up to there.
fn full_decode_rule(tokenizer: &Tokenizer, tokens: &[i64], stops: &[String]) -> Option<String> {
    let text = tokenizer.decode(tokens);
    let tail = stops.iter().map(String::len).max().unwrap_or(0) + 32;
    let mut from = text.len().saturating_sub(tail);
    while !text.is_char_boundary(from) {
        from -= 1;
    }
    let end = stops.iter().filter_map(|s| text[from..].find(s.as_str()).map(|i| from + i + s.len())).min()?;
    Some(text[..end].to_owned())
}

/// `text`'s tokens fed to a [`StopScan`] one at a time stop where a full decode after each token
/// stops, with the same text.
fn check_stop_scan(tokenizer: &Tokenizer, text: &str, stops: &[&str]) {
    let tokens = tokenizer.encode(text).unwrap();
    let stops: Vec<String> = stops.iter().map(|s| s.to_string()).collect();
    let expected =
        (1..=tokens.len()).find_map(|n| full_decode_rule(tokenizer, &tokens[..n], &stops).map(|t| (n, t)));
    let mut scan = StopScan::new(&stops, 1);
    let found = (1..=tokens.len()).find_map(|n| scan.check(tokenizer, 0, &tokens[..n]).map(|t| (n, t)));
    assert_eq!(found, expected, "{text:?} ({} tokens), stops {stops:?}", tokens.len());
}

#[test]
fn stop_strings_found_in_decoded_tails_are_those_of_a_full_decode() {
    let dir = common::smollm2_dir();
    let config = LlamaConfig::from_file(&dir.join("config.json")).unwrap();
    let smollm2 = Tokenizer::from_dir(&dir, &config).unwrap();
    let tiny = model(0);
    let long = "The quick brown fox jumps over the lazy dog. ".repeat(20);
    let emoji = "naïve café — 東京 🙂 and 🙂🙂 again, ".repeat(6);
    let cases: Vec<(&Tokenizer, String, Vec<&str>)> = vec![
        // Across token boundaries.
        (&smollm2, "The answer is 42.\n\nQuestion: what next?".into(), vec!["\n\nQuestion"]),
        (&smollm2, "The answer is 42.\n\nQuestion: what next?".into(), vec!["42.\n", "never"]),
        // Multi-byte characters split across byte-level tokens.
        (&smollm2, emoji.clone(), vec!["🙂🙂"]),
        (&smollm2, emoji.clone(), vec!["京 🙂 and 🙂🙂 a"]),
        (&smollm2, emoji.clone(), vec!["é", "🙂"]),
        // Far into a long completion: only its tail is decoded.
        (&smollm2, format!("{long}and then STOP-HERE it ended"), vec!["STOP-HERE"]),
        (&smollm2, format!("{long}{emoji}"), vec!["東京 🙂 and 🙂🙂 again, naï"]),
        (&smollm2, long.clone(), vec!["nowhere"]),
        // A skipped special token between the two halves of a stop string.
        (&smollm2, "say hello<|im_end|> world now".into(), vec!["hello world"]),
        // One character per token.
        (&tiny.tokenizer, "12+7=19 and 3*3=9 so".into(), vec!["=9"]),
        (&tiny.tokenizer, format!("{}bc", "a".repeat(120)), vec!["abc", "zz"]),
        (&tiny.tokenizer, "x".repeat(200), vec!["y"]),
    ];
    for (tokenizer, text, stops) in &cases {
        check_stop_scan(tokenizer, text, stops);
    }
}

/// Another engine's tokens end where the sampler's own would: each row is (tokens as text, the
/// stop strings, max_new_tokens) → (tokens kept, finish, text). The built-in tokenizer has one
/// token per character; `#` stands for EOS.
#[test]
fn an_engines_completion_ends_by_the_samplers_rules() {
    let m = model(0);
    let eos = m.tokenizer.eos_ids()[0];
    let ids = |text: &str| -> Vec<i64> {
        text.chars()
            .map(|c| if c == '#' { eos } else { m.tokenizer.encode(&c.to_string()).unwrap()[0] })
            .collect()
    };
    // (tokens, stop strings, max_new_tokens, tokens kept, finish, text)
    type Case<'a> = (&'a str, &'a [&'a str], usize, usize, Finish, &'a str);
    let cases: &[Case] = &[
        ("12#34", &[], 16, 3, Finish::Eos, "12"),
        ("1234", &[], 16, 4, Finish::Length, "1234"),
        ("123456", &[], 4, 4, Finish::Length, "1234"),
        ("ab\nc#", &["\n"], 16, 3, Finish::Stop, "ab\n"),
        ("a=>b=>c", &["=>"], 16, 3, Finish::Stop, "a=>"),
        // The first end wins, whichever rule it is.
        ("a#=>", &["=>"], 16, 2, Finish::Eos, "a"),
        ("ab=>#", &["=>"], 3, 3, Finish::Length, "ab="),
    ];
    for &(tokens, stops, max_new_tokens, kept, finish, text) in cases {
        let tokens = ids(tokens);
        let logprobs: Vec<f32> = (0..tokens.len()).map(|i| -(i as f32)).collect();
        let params = SamplingParams {
            max_new_tokens,
            stop: stops.iter().map(|s| s.to_string()).collect(),
            ..Default::default()
        };
        let ended =
            rlvr_model::Sampled::ended(3, tokens.clone(), logprobs.clone(), &m.tokenizer, &params).unwrap();
        let case = format!("{tokens:?} stop {stops:?} max {max_new_tokens}");
        assert_eq!(ended.prompt_index, 3, "{case}");
        assert_eq!(ended.tokens, tokens[..kept], "{case}");
        assert_eq!(ended.logprobs, logprobs[..kept], "{case}");
        assert_eq!(ended.finish, finish, "{case}");
        assert_eq!(ended.text, text, "{case}");
    }
    let params = SamplingParams::default();
    let error = rlvr_model::Sampled::ended(0, vec![5, 6], vec![-1.0], &m.tokenizer, &params).unwrap_err();
    assert!(error.to_string().contains("2 tokens but 1 log-probabilities"), "{error}");
}
