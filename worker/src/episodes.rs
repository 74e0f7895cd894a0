//! Multi-turn rollouts: episodes against an OpenEnv environment (`rlvr_env`), token in, token out
//! (`rlvr_model::Episode`).
//!
//! Each episode has a session of its own. A round opens and resets every session at once; then,
//! turn by turn, every episode still running is sampled in one batch on the device (its whole
//! context so far as the prompt, one completion each), each turn is read as an action
//! (`rlvr_env::read_action`) and sent, all sessions' steps at once, and each reply is appended as
//! the next message. An episode ends when the environment says `done`, at `max_turns`, at a turn cut
//! by the token budget, at a turn that is not an action, at a prefix break, or at an environment
//! error; how it ended is kept, and an episode is trained on up to its end.
//!
//! Not yet wired into a job: `[env]` in the spec and the step that trains on these (issue in
//! progress); `tests/tests/env.rs` runs them against a real server.

use std::time::{Duration, Instant};

use rlvr_env::{ActionFormat, EnvError, Reply, Session, read_action};
use rlvr_model::{Episode, EpisodeError, Finish, LoadedModel, SamplerRng, SamplingParams, generate};
use rlvr_outbound::Policy;
use serde_json::{Map, Value};

/// How a round of episodes runs.
pub struct EpisodeSettings {
    /// The OpenEnv server (`http://host:port`).
    pub server: String,
    pub policy: Policy,
    /// Bounds opening a session and each `reset` and `step`.
    pub step_timeout: Duration,
    pub max_turns: u32,
    pub action: ActionFormat,
    /// The observation's field shown to the model (the first message, and each reply).
    pub observation_field: String,
    /// The replies' role in the chat template: `user`, or `tool` where the template has one.
    pub reply_role: String,
    pub reward: EpisodeReward,
}

/// How an episode's reward is made from the environment's step rewards.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EpisodeReward {
    Sum,
    Last,
}

/// How an episode ended.
#[derive(Debug, Clone, PartialEq)]
pub enum EpisodeEnd {
    /// The environment said `done`.
    Done,
    /// `max_turns` turns taken.
    MaxTurns,
    /// A turn reached the token budget before its end.
    TokenBudget,
    /// A turn that is not an action (the model's fault: no reward from there).
    NotAnAction(String),
    /// The template rendered the conversation otherwise (counted: `prefix_breaks`).
    PrefixBreak(String),
    /// The environment refused or failed a request.
    EnvError(String),
}

/// One episode, played.
pub struct Played {
    pub episode: Episode,
    /// The environment's reward of each step.
    pub rewards: Vec<f64>,
    pub reward: f64,
    pub end: EpisodeEnd,
    /// Seconds spent waiting on the environment (reset and steps, its share of the round).
    pub env_s: f64,
}

/// Why a round could not be played at all (an episode's own failure only ends that episode).
#[derive(Debug, thiserror::Error)]
pub enum RoundError {
    #[error("environment: {0}")]
    Env(#[from] EnvError),
    #[error("environment: the first observation has no {field:?} text: {observation}")]
    NoText { field: String, observation: String },
    #[error("sampling: {0}")]
    Model(#[from] rlvr_model::ModelError),
}

/// Plays one episode per entry of `resets` (`reset`'s arguments; a group's G episodes are G equal
/// entries), sampling with `model` from `rng`.
pub fn play(
    model: &LoadedModel,
    params: &SamplingParams,
    rng: &mut SamplerRng,
    resets: &[Map<String, Value>],
    settings: &EpisodeSettings,
) -> Result<Vec<Played>, RoundError> {
    let tokenizer = &model.tokenizer;
    let mut slots = vec![(); resets.len()];
    let opened: Vec<Result<(Session, Reply, f64), EnvError>> = each_mut(&mut slots, |i, ()| {
        let started = Instant::now();
        let mut session = Session::open(&settings.server, &settings.policy, settings.step_timeout)?;
        let first = session.reset(&resets[i])?;
        Ok((session, first, started.elapsed().as_secs_f64()))
    });
    // A round that cannot start (no server, a server at capacity) is not the episodes' to end.
    let mut sessions = Vec::with_capacity(resets.len());
    let mut played = Vec::with_capacity(resets.len());
    for opened in opened {
        let (session, first, env_s) = opened?;
        let text =
            observation_text(&first, &settings.observation_field).ok_or_else(|| RoundError::NoText {
                field: settings.observation_field.clone(),
                observation: Value::Object(first.observation.clone()).to_string(),
            })?;
        sessions.push(Some(session));
        played.push(Played {
            episode: Episode::start(tokenizer, &text)?,
            rewards: Vec::new(),
            reward: 0.0,
            end: EpisodeEnd::MaxTurns,
            env_s,
        });
    }
    // `None` while an episode runs.
    let mut ends: Vec<Option<EpisodeEnd>> = vec![None; played.len()];
    for turn in 1..=settings.max_turns {
        let running: Vec<usize> = (0..played.len()).filter(|&i| ends[i].is_none()).collect();
        if running.is_empty() {
            break;
        }
        let prompts: Vec<Vec<i64>> = running
            .iter()
            .map(|&i| played[i].episode.prompt.iter().chain(&played[i].episode.tokens).copied().collect())
            .collect();
        let sampled = tch::no_grad(|| generate(&model.model, tokenizer, &prompts, 1, params, rng))?;
        let mut actions = Vec::new();
        for (&i, turn_sampled) in running.iter().zip(&sampled) {
            played[i].episode.push_turn(tokenizer, &turn_sampled.tokens, &turn_sampled.logprobs);
            if turn_sampled.finish == Finish::Length {
                ends[i] = Some(EpisodeEnd::TokenBudget);
                continue;
            }
            match read_action(&settings.action, &turn_sampled.text) {
                Ok(action) => actions.push((i, action)),
                Err(error) => ends[i] = Some(EpisodeEnd::NotAnAction(error.to_string())),
            }
        }
        let mut taken: Vec<Option<Session>> = actions.iter().map(|(i, _)| sessions[*i].take()).collect();
        let replies: Vec<(Result<Reply, EnvError>, f64)> = each_mut(&mut taken, |j, session| {
            let started = Instant::now();
            let session = session.as_mut().expect("a running episode has its session");
            (session.step(&actions[j].1), started.elapsed().as_secs_f64())
        });
        for (((i, _), session), (reply, env_s)) in actions.iter().zip(taken).zip(replies) {
            let i = *i;
            sessions[i] = session;
            let game = &mut played[i];
            game.env_s += env_s;
            let reply = match reply {
                Ok(reply) => reply,
                Err(error) => {
                    ends[i] = Some(EpisodeEnd::EnvError(error.to_string()));
                    continue;
                }
            };
            game.rewards.push(reply.reward.unwrap_or(0.0));
            if reply.done {
                ends[i] = Some(EpisodeEnd::Done);
                continue;
            }
            if turn == settings.max_turns {
                ends[i] = Some(EpisodeEnd::MaxTurns);
                continue;
            }
            let text = observation_text(&reply, &settings.observation_field).unwrap_or_default();
            match game.episode.push_reply(tokenizer, &settings.reply_role, &text) {
                Ok(()) => {}
                Err(EpisodeError::PrefixBreak(problem)) => {
                    ends[i] = Some(EpisodeEnd::PrefixBreak(problem.to_string()))
                }
                Err(EpisodeError::Model(error)) => return Err(error.into()),
            }
        }
    }
    for (game, end) in played.iter_mut().zip(ends) {
        game.end = end.unwrap_or(EpisodeEnd::MaxTurns);
    }
    for game in &mut played {
        game.reward = match settings.reward {
            EpisodeReward::Sum => game.rewards.iter().sum(),
            EpisodeReward::Last => game.rewards.last().copied().unwrap_or(0.0),
        };
    }
    for session in sessions.into_iter().flatten() {
        session.close();
    }
    Ok(played)
}

/// The observation's text field, or its whole JSON when the field holds something else.
fn observation_text(reply: &Reply, field: &str) -> Option<String> {
    match reply.observation.get(field)? {
        Value::String(text) => Some(text.clone()),
        other => Some(other.to_string()),
    }
}

/// At most this many sessions are waited on at once (a thread each).
const AT_ONCE: usize = 64;

/// `f(j, item)` for every item, at most [`AT_ONCE`] at a time, in order.
fn each_mut<S: Send, T: Send>(items: &mut [S], f: impl Fn(usize, &mut S) -> T + Sync) -> Vec<T> {
    let mut out = Vec::with_capacity(items.len());
    for (chunk_index, chunk) in items.chunks_mut(AT_ONCE).enumerate() {
        std::thread::scope(|scope| {
            let handles: Vec<_> = chunk
                .iter_mut()
                .enumerate()
                .map(|(k, item)| {
                    let f = &f;
                    scope.spawn(move || f(chunk_index * AT_ONCE + k, item))
                })
                .collect();
            out.extend(
                handles.into_iter().map(|handle| handle.join().expect("an environment thread panicked")),
            );
        });
    }
    out
}
