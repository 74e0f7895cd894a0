//! SmolLM2-135M-Instruct through this crate and through Hugging Face transformers, on the same
//! chat-templated prompt: the rendered template, the prompt's ids, the last-position logits
//! (max abs difference ≤ 1e-4) and 32 greedy tokens must agree.

use crate::common;

use rlvr_model::{Finish, SamplerRng, SamplingParams, generate, load};
use tch::{Device, Kind};

const PROMPT: &str = "What is 17 + 25? Give the final answer as: Answer: <number>";

#[test]
fn smollm2_matches_transformers() {
    let dir = common::smollm2_dir();
    let reference = common::hf_reference(&["chat", dir.to_str().unwrap(), PROMPT, "32"]);
    let loaded = load(dir.to_str().unwrap(), Device::Cpu, Kind::Float).unwrap();

    let rendered = loaded.tokenizer.render_prompt(PROMPT).unwrap();
    assert_eq!(rendered, reference["rendered"].as_str().unwrap(), "chat template rendering");
    let ids = loaded.tokenizer.encode_prompt(PROMPT).unwrap();
    let ref_ids: Vec<i64> =
        reference["ids"].as_array().unwrap().iter().map(|v| v.as_i64().unwrap()).collect();
    assert_eq!(ids, ref_ids, "prompt token ids");

    let logits = common::our_logits(&loaded.model, std::slice::from_ref(&ids));
    let last = logits.select(1, ids.len() as i64 - 1).squeeze_dim(0);
    let diff = common::max_abs_diff(&last, &common::flat_tensor(&reference["last_logits"]));
    println!("smollm2 last-position logits: max abs diff vs transformers = {diff:.3e}");
    assert!(diff <= 1e-4, "last-position logits differ by {diff:e} (> 1e-4)");

    let params = SamplingParams { max_new_tokens: 32, temperature: 0.0, ..SamplingParams::default() };
    let out =
        generate(&loaded.model, &loaded.tokenizer, &[ids], 1, &params, &mut SamplerRng::new(0)).unwrap();
    let ref_new: Vec<i64> =
        reference["greedy_ids"].as_array().unwrap().iter().map(|v| v.as_i64().unwrap()).collect();
    println!("greedy: {:?} ({:?})", out[0].text, out[0].finish);
    assert_eq!(out[0].text, reference["greedy_text"].as_str().unwrap(), "greedy text");
    assert_eq!(out[0].tokens, ref_new, "greedy ids");
    let expected_finish = if ref_new.len() < 32 { Finish::Eos } else { Finish::Length };
    assert_eq!(out[0].finish, expected_finish);
}

#[test]
fn smollm2_batched_left_padding_equals_one_by_one() {
    let dir = common::smollm2_dir();
    let m = load(dir.to_str().unwrap(), Device::Cpu, Kind::Float).unwrap();
    let texts = ["What is 2+3?", "Name a prime number larger than ten, and explain why it is prime.", "Hi"];
    let ps: Vec<Vec<i64>> = texts.iter().map(|t| m.tokenizer.encode_prompt(t).unwrap()).collect();
    let params = SamplingParams { max_new_tokens: 12, temperature: 0.0, ..SamplingParams::default() };
    let batched = generate(&m.model, &m.tokenizer, &ps, 1, &params, &mut SamplerRng::new(0)).unwrap();
    for (i, p) in ps.iter().enumerate() {
        let alone =
            generate(&m.model, &m.tokenizer, std::slice::from_ref(p), 1, &params, &mut SamplerRng::new(0))
                .unwrap();
        assert_eq!(
            batched[i].tokens, alone[0].tokens,
            "prompt {i}: {:?} vs {:?}",
            batched[i].text, alone[0].text
        );
        let d = batched[i]
            .logprobs
            .iter()
            .zip(&alone[0].logprobs)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        assert!(d <= 1e-4, "prompt {i}: logprobs differ by {d}");
    }
}

#[test]
fn smollm2_tokenizer_matches_transformers() {
    let dir = common::smollm2_dir();
    let m = load(dir.to_str().unwrap(), Device::Cpu, Kind::Float).unwrap();
    let texts = [
        "What is 12345 + 678?",
        "  leading spaces, trailing spaces  \n\nand\ttabs",
        "naïve café — 東京 🙂",
        "<|im_start|>user\nhi<|im_end|>\n",
        "Answer: \\boxed{42}",
        "",
    ];
    let reference =
        common::hf_reference(&["tokenize", dir.to_str().unwrap(), &serde_json::json!(texts).to_string()]);
    for (i, text) in texts.iter().enumerate() {
        let ids = m.tokenizer.encode(text).unwrap();
        let ref_ids: Vec<i64> =
            reference["ids"][i].as_array().unwrap().iter().map(|v| v.as_i64().unwrap()).collect();
        assert_eq!(ids, ref_ids, "ids of {text:?}");
        assert_eq!(
            m.tokenizer.decode(&ids),
            reference["decoded"][i].as_str().unwrap(),
            "decoding of {text:?}"
        );
    }
}
