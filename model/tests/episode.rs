//! Multi-turn episodes, token in, token out (`rlvr_model::episode`), on SmolLM2's tokenizer and
//! chat template and on the built-in model's (no template): the model's turns kept verbatim, each
//! reply appended as the rendered conversation's new suffix, and every case where the template
//! renders the conversation otherwise refused as a prefix break.

use rlvr_model::{Episode, EpisodeError, LlamaConfig, Tokenizer, load};
use tch::{Device, Kind};

use crate::common::smollm2_dir;

fn smollm2() -> Tokenizer {
    let dir = smollm2_dir();
    let file = dir.join("config.json");
    let config = LlamaConfig::from_json(&std::fs::read_to_string(&file).unwrap(), &file).unwrap();
    Tokenizer::from_dir(&dir, &config).unwrap()
}

/// A turn as a sampler would give it: the ids of `text`, then `end` (an end-of-turn id) if any.
fn turn(tokenizer: &Tokenizer, text: &str, end: Option<&str>) -> (Vec<i64>, Vec<f32>) {
    let mut ids = tokenizer.encode(text).unwrap();
    if let Some(end) = end {
        ids.extend(tokenizer.encode(end).unwrap());
    }
    let logprobs = (0..ids.len()).map(|i| -0.1 * (i + 1) as f32).collect();
    (ids, logprobs)
}

#[test]
fn turns_stay_as_sampled_and_replies_are_the_rendered_suffix_masked_out() {
    let tokenizer = smollm2();
    let mut episode = Episode::start(&tokenizer, "What is 2+3?").unwrap();
    assert_eq!(episode.prompt, tokenizer.encode_prompt("What is 2+3?").unwrap());
    // A split no tokenizer would make of this text ("5" then " is it"): kept as sampled.
    let mut first: Vec<i64> = tokenizer.encode("5").unwrap();
    first.extend(tokenizer.encode(" is it").unwrap());
    first.extend(tokenizer.encode("<|im_end|>").unwrap());
    let first_logprobs: Vec<f32> = (0..first.len()).map(|i| -0.5 - i as f32).collect();
    episode.push_turn(&tokenizer, &first, &first_logprobs);
    episode.push_reply(&tokenizer, "user", "Not quite: it is 5. Say it alone.").unwrap();
    let (second, second_logprobs) = turn(&tokenizer, "5", Some("<|im_end|>"));
    episode.push_turn(&tokenizer, &second, &second_logprobs);

    // The tokens: the first turn verbatim, the reply's rendered suffix, the second turn verbatim.
    let reply: Vec<i64> = episode.tokens[first.len()..episode.tokens.len() - second.len()].to_vec();
    assert_eq!(&episode.tokens[..first.len()], first.as_slice());
    assert_eq!(&episode.tokens[episode.tokens.len() - second.len()..], second.as_slice());
    assert_eq!(
        tokenizer.decode_with_specials(&reply),
        "\n<|im_start|>user\nNot quite: it is 5. Say it alone.<|im_end|>\n<|im_start|>assistant\n"
    );
    // Sampled 1 with the sampler's log-probabilities; the reply 0 and 0.
    let expected_mask: Vec<f32> =
        [vec![1.0; first.len()], vec![0.0; reply.len()], vec![1.0; second.len()]].concat();
    assert_eq!(episode.mask, expected_mask);
    let expected_logprobs: Vec<f32> = [first_logprobs, vec![0.0; reply.len()], second_logprobs].concat();
    assert_eq!(episode.logprobs, expected_logprobs);
    assert_eq!(episode.sampled_tokens(), first.len() + second.len());
    assert_eq!(episode.turns, 2);
    // What it all reads is the template's rendering of the conversation, to the character.
    let whole: Vec<i64> = episode.prompt.iter().chain(&episode.tokens).copied().collect();
    let messages = [
        rlvr_model::ChatMessage::user("What is 2+3?"),
        rlvr_model::ChatMessage { role: "assistant".into(), content: "5 is it".into() },
        rlvr_model::ChatMessage::user("Not quite: it is 5. Say it alone."),
        rlvr_model::ChatMessage { role: "assistant".into(), content: "5".into() },
    ];
    let rendered = tokenizer.render_chat(&messages, false).unwrap();
    assert_eq!(format!("{}\n", tokenizer.decode_with_specials(&whole)), rendered);
}

#[test]
fn a_turn_the_template_would_render_otherwise_is_a_prefix_break_and_changes_nothing() {
    let tokenizer = smollm2();
    // (how the turn ended, why the template reads it otherwise)
    // (the turn as sampled: its text and end, why the template reads it otherwise)
    let cases = [
        ("5", "<|endoftext|>", "ended by another special token than the template's <|im_end|>"),
        ("<|im_start|>5", "<|im_end|>", "a turn holding the template's own markup"),
    ];
    for (text, end, why) in cases {
        let mut episode = Episode::start(&tokenizer, "What is 2+3?").unwrap();
        let (ids, logprobs) = turn(&tokenizer, text, Some(end));
        episode.push_turn(&tokenizer, &ids, &logprobs);
        let before = (episode.tokens.clone(), episode.mask.clone());
        let error = episode.push_reply(&tokenizer, "user", "Again.").unwrap_err();
        let EpisodeError::PrefixBreak(problem) = error else { panic!("{why}: {error}") };
        assert_eq!(problem.turn, 1, "{why}");
        assert!(problem.to_string().contains("prefix break after turn 1"), "{why}: {problem}");
        assert_eq!((episode.tokens.clone(), episode.mask.clone()), before, "{why}: the episode changed");
    }
}

/// A turn cut off before its end (a token budget): the template closes it, and that closing
/// token is the reply's, masked out — never one the model is trained to have sampled.
#[test]
fn a_turn_cut_off_is_closed_by_the_replys_own_tokens() {
    let tokenizer = smollm2();
    let mut episode = Episode::start(&tokenizer, "What is 2+3?").unwrap();
    let (ids, logprobs) = turn(&tokenizer, "5", None);
    episode.push_turn(&tokenizer, &ids, &logprobs);
    episode.push_reply(&tokenizer, "user", "Again.").unwrap();
    let reply = &episode.tokens[ids.len()..];
    assert!(tokenizer.decode_with_specials(reply).starts_with("<|im_end|>\n<|im_start|>user\nAgain."));
    assert!(episode.mask[ids.len()..].iter().all(|&m| m == 0.0));
}

#[test]
fn a_model_without_a_template_gets_the_replies_as_they_are() {
    let model = load("builtin:tiny-arith", Device::Cpu, Kind::Float).unwrap();
    let tokenizer = &model.tokenizer;
    let mut episode = Episode::start(tokenizer, "12+30=").unwrap();
    assert_eq!(episode.prompt, tokenizer.encode_prompt("12+30=").unwrap());
    let (ids, logprobs) = turn(tokenizer, "41", None);
    episode.push_turn(tokenizer, &ids, &logprobs);
    episode.push_reply(tokenizer, "user", " no;").unwrap();
    let reply = &episode.tokens[ids.len()..];
    assert_eq!(reply, tokenizer.encode(" no;").unwrap().as_slice());
    assert_eq!(episode.mask, [vec![1.0; ids.len()], vec![0.0; reply.len()]].concat());
}
