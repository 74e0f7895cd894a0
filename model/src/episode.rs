//! A multi-turn episode's tokens, token in, token out: the model's turns exactly as it sampled
//! them, the environment's replies rendered by the model's chat template and appended as the
//! tokens of the rendered text's new suffix only.
//!
//! Why: re-tokenizing a conversation after each reply puts the gradient on token sequences the
//! model never sampled (a byte-level BPE may split the same text otherwise), and a chat template
//! that renders earlier turns differently once a later one is added (one that trims a turn's
//! content, drops an earlier turn's reasoning, or ends a turn with another token than the model
//! sampled) would silently change what was trained on. So the sampled tokens are never encoded
//! again, and each reply is appended only when the template's rendering of the whole conversation
//! starts with the exact text the episode's tokens stand for; otherwise the episode ends there, a
//! [`PrefixBreak`], counted by the caller and not trained on in a re-rendered form.
//!
//! The mask is 1 on sampled tokens and 0 on the environment's, whose log-probabilities are 0: the
//! loss and every per-token figure count only what the model chose. A model without a chat
//! template (`builtin:tiny-arith`) gets the replies' text as it is, after its own turn.

use crate::chat::ChatMessage;
use crate::error::Result;
use crate::tokenizer::Tokenizer;

/// The template rendered the conversation so far otherwise than the episode's tokens read: the
/// reply is not appended and the episode ends.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "prefix break after turn {turn}: with the reply added, the chat template renders the conversation so \
     far as …{rendered:?}… where the episode's tokens read …{expected:?}…"
)]
pub struct PrefixBreak {
    /// Turns the model had taken.
    pub turn: usize,
    /// Around the first difference: the text of the episode's tokens, and the template's.
    pub expected: String,
    pub rendered: String,
}

/// Why a reply was not appended.
#[derive(Debug, thiserror::Error)]
pub enum EpisodeError {
    #[error(transparent)]
    PrefixBreak(#[from] PrefixBreak),
    #[error(transparent)]
    Model(#[from] crate::error::ModelError),
}

/// An episode so far.
#[derive(Debug, Clone)]
pub struct Episode {
    /// The conversation as the template is given it.
    messages: Vec<ChatMessage>,
    /// The text the prompt and the tokens after it stand for: the template's rendering up to the
    /// last reply, and each turn's tokens decoded with their special tokens.
    text: String,
    /// The first message rendered (with the generation prompt) and encoded.
    pub prompt: Vec<i64>,
    /// Everything after the prompt: turns and replies.
    pub tokens: Vec<i64>,
    /// Per token of `tokens`: 1 sampled, 0 the environment's.
    pub mask: Vec<f32>,
    /// Per token of `tokens`: the sampler's log-probability, 0 for the environment's.
    pub logprobs: Vec<f32>,
    /// The model's turns so far.
    pub turns: usize,
}

impl Episode {
    /// An episode whose first message is the user's `first` (the data's prompt, or the
    /// environment's first observation).
    pub fn start(tokenizer: &Tokenizer, first: &str) -> Result<Episode> {
        let messages = vec![ChatMessage::user(first)];
        let (text, prompt) = match tokenizer.has_chat_template() {
            true => {
                let text = tokenizer.render_chat(&messages, true)?;
                let prompt = tokenizer.encode(&text)?;
                (text, prompt)
            }
            false => (first.to_owned(), tokenizer.encode_prompt(first)?),
        };
        Ok(Episode {
            messages,
            text,
            prompt,
            tokens: Vec::new(),
            mask: Vec::new(),
            logprobs: Vec::new(),
            turns: 0,
        })
    }

    /// The model's turn, its tokens as sampled (an end-of-turn token last when it ended one).
    pub fn push_turn(&mut self, tokenizer: &Tokenizer, tokens: &[i64], logprobs: &[f32]) {
        debug_assert_eq!(tokens.len(), logprobs.len());
        self.tokens.extend_from_slice(tokens);
        self.mask.extend(std::iter::repeat_n(1.0, tokens.len()));
        self.logprobs.extend_from_slice(logprobs);
        self.text.push_str(&tokenizer.decode_with_specials(tokens));
        let content_end = tokens.iter().rposition(|&id| !tokenizer.is_eos(id)).map_or(0, |i| i + 1);
        self.messages.push(ChatMessage {
            role: "assistant".into(),
            content: tokenizer.decode(&tokens[..content_end]),
        });
        self.turns += 1;
    }

    /// The environment's reply as the next message (`role`: `user`, or `tool` where the template
    /// has one), its tokens the rendered conversation's new suffix; then the generation prompt
    /// of the model's next turn. A [`PrefixBreak`] leaves the episode as it was.
    pub fn push_reply(
        &mut self,
        tokenizer: &Tokenizer,
        role: &str,
        content: &str,
    ) -> Result<(), EpisodeError> {
        let suffix = match tokenizer.has_chat_template() {
            true => {
                self.messages.push(ChatMessage { role: role.into(), content: content.into() });
                let rendered = match tokenizer.render_chat(&self.messages, true) {
                    Ok(rendered) => rendered,
                    Err(error) => {
                        self.messages.pop();
                        return Err(error.into());
                    }
                };
                let Some(suffix) = rendered.strip_prefix(self.text.as_str()) else {
                    self.messages.pop();
                    return Err(prefix_break(self.turns, &self.text, &rendered).into());
                };
                suffix.to_owned()
            }
            false => content.to_owned(),
        };
        let ids = tokenizer.encode(&suffix)?;
        self.mask.extend(std::iter::repeat_n(0.0, ids.len()));
        self.logprobs.extend(std::iter::repeat_n(0.0, ids.len()));
        self.tokens.extend(ids);
        self.text.push_str(&suffix);
        Ok(())
    }

    /// Tokens the model sampled.
    pub fn sampled_tokens(&self) -> usize {
        self.mask.iter().filter(|&&m| m > 0.0).count()
    }
}

/// The [`PrefixBreak`] of `expected` (the episode's text) against `rendered`: 40 characters of
/// each around where they first differ.
fn prefix_break(turn: usize, expected: &str, rendered: &str) -> PrefixBreak {
    let common = expected
        .char_indices()
        .zip(rendered.chars())
        .find(|((_, a), b)| a != b)
        .map_or_else(|| expected.len().min(rendered.len()), |((at, _), _)| at);
    let around = |text: &str| {
        let start = text[..common.min(text.len())].char_indices().rev().nth(19).map_or(0, |(i, _)| i);
        text[start..].chars().take(40).collect::<String>()
    };
    PrefixBreak { turn, expected: around(expected), rendered: around(rendered) }
}
