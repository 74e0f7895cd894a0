//! Sampling and log-probabilities on the built-in model: batching with left padding, the
//! shared prompt prefix, agreement of the sampler's logprobs with `completion_logprobs`, stop
//! strings and EOS, and bit-exact resume of the sampler's RNG.

mod common;

use rlvr_model::{
    Finish, LoadedModel, SamplerRng, SamplingParams, SequenceBatch, completion_logprobs, generate, load,
    save_pretrained,
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
fn completion_logprobs_have_gradients() {
    let m = model(3);
    let ps = prompts(&m, &TEXTS[..2]);
    let pairs = vec![(ps[0].clone(), vec![20, 21, 22]), (ps[0].clone(), vec![30]), (ps[1].clone(), vec![])];
    let batch = SequenceBatch::new(&pairs, 0, Device::Cpu).unwrap();
    let (lp, _) = completion_logprobs(&m.model, &batch, 1.0);
    assert!(lp.requires_grad());
    let loss = -(lp.sum(Kind::Float));
    loss.backward();
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
