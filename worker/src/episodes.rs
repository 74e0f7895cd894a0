//! Multi-turn rollouts: episodes against an OpenEnv environment (`rlvr_env`), token in, token out
//! (`rlvr_model::Episode`), for a job with `[env]` (`Rollouts::Env`).
//!
//! Each episode has a session of its own. A round opens and resets every session at once; then,
//! turn by turn, every episode still running is sampled in one batch on the device (its whole
//! context so far as the prompt, one completion each), each turn is read as an action
//! (`rlvr_env::read_action`) and sent, all sessions' steps at once, and each reply is appended as
//! the next message. An episode ends when the environment says `done`, at `max_turns`, at a turn cut
//! by the token budget, at a turn that is not an action, at a prefix break, or at an environment
//! error; how it ended is kept, and an episode is trained on up to its end.
//!
//! The device is needed only to sample: while every session waits on the environment, the round
//! gives its device grant back ([`DeviceUse`]) and asks for it again for the next turn.
//!
//! What the step trains on: each episode as a [`Sampled`] (its tokens after the prompt, turns and
//! replies, with the sampler's log-probabilities) and an [`EpisodeRow`] (its own prompt, the mask
//! that keeps the replies out of the loss, how it went); [`env_verdicts`] is the environment's
//! reward as the reward's last grader (`env`, which a `[reward] formula` may name).

use std::sync::Mutex;
use std::time::{Duration, Instant};

use rlvr_env::{ActionFormat, EnvError, Reply, Session, read_action};
use rlvr_model::{Episode, EpisodeError, Finish, LoadedModel, Sampled, SamplerRng, SamplingParams, generate};
use rlvr_outbound::Policy;
use rlvr_plugin_api::HostContext;
use rlvr_plugin_host::verify::{Components, OutputLine};
use rlvr_protocol::env::{ActionKind, EnvReward, EnvSection};
use rlvr_protocol::records::PromptRecord;
use serde_json::{Map, Value};

/// How a round of episodes runs.
#[derive(Debug, Clone)]
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
    pub reward: EnvReward,
    /// Sessions the server holds at once, as far as the job knows (a step's episodes): a
    /// held-out set is played that many at a time.
    pub sessions: usize,
}

impl EpisodeSettings {
    /// `[env]`'s, under the host's outbound policy (a run by hand has none), for a server that
    /// holds `sessions` at once.
    pub fn from_spec(
        env: &EnvSection,
        host: &HostContext,
        sessions: usize,
    ) -> Result<EpisodeSettings, String> {
        let url = env.url.clone().unwrap_or_default();
        let policy = match host.outbound_unrestricted {
            // A sidecar's socket is not a destination (its caller sets the server).
            _ if env.url.is_none() => Policy::deny_all(),
            // A run by hand, on its user's behalf: the spec's server, wherever it is, and only it.
            true => {
                let authority = url.trim_start_matches("http://").split('/').next().unwrap_or_default();
                Policy::new(&[authority.to_owned()], true)
                    .map_err(|error| format!("{url}: not a server's address: {error}"))?
            }
            false => Policy::new(&host.outbound_allow, host.outbound_allow_private)
                .map_err(|error| format!("the host's outbound policy: {error}"))?,
        };
        let action = match env.action {
            ActionKind::Json => ActionFormat::Json,
            ActionKind::Field => ActionFormat::Field(env.action_field.clone().unwrap_or_default()),
            ActionKind::Hermes => ActionFormat::Hermes(env.tool.clone()),
        };
        Ok(EpisodeSettings {
            server: url,
            policy,
            step_timeout: Duration::from_secs(env.step_timeout_s),
            max_turns: env.max_turns,
            action,
            observation_field: env.observation_field.clone(),
            reply_role: env.reply_role.clone(),
            reward: env.reward,
            sessions,
        })
    }
}

/// A job's environment: how its episodes run, and the sessions kept open between rounds. Each
/// episode starts with a `reset` on a session of its own; a session whose episode ended is kept
/// for the next round's, so a round opens only the sessions it lacks (opening one costs the server
/// a handshake and a new environment).
pub struct Environment {
    pub settings: EpisodeSettings,
    pub idle: Mutex<Vec<Session>>,
    /// The installed environment the job started (`env.environment`), stopped with the job.
    pub sidecar: Option<crate::sidecar::Sidecar>,
}

/// What a round's device is for, told to the caller as a round goes: the device grant is given
/// back while every session waits on the environment, and held again to sample.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceUse {
    /// Every running episode waits on the environment.
    Release,
    /// The next turn is sampled.
    Hold,
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
    /// A turn that is not an action, or an action the environment's schema refuses
    /// (`VALIDATION_ERROR`): the model's fault, no reward from there.
    NotAnAction(String),
    /// The template rendered the conversation otherwise (counted: `prefix_breaks`).
    PrefixBreak(String),
    /// The environment refused or failed a request.
    EnvError(String),
}

impl EpisodeEnd {
    /// Its name in metrics and rollout records.
    pub fn name(&self) -> &'static str {
        match self {
            EpisodeEnd::Done => "done",
            EpisodeEnd::MaxTurns => "max_turns",
            EpisodeEnd::TokenBudget => "token_budget",
            EpisodeEnd::NotAnAction(_) => "not_an_action",
            EpisodeEnd::PrefixBreak(_) => "prefix_break",
            EpisodeEnd::EnvError(_) => "env_error",
        }
    }

    /// What went wrong, when something did.
    pub fn problem(&self) -> Option<&str> {
        match self {
            EpisodeEnd::NotAnAction(what) | EpisodeEnd::PrefixBreak(what) | EpisodeEnd::EnvError(what) => {
                Some(what)
            }
            _ => None,
        }
    }
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
    /// The device grant could not be held again.
    #[error(transparent)]
    Device(#[from] crate::grants::GrantError),
}

/// A round's episodes and the wall-clock seconds it waited on the environment (sessions opened
/// and reset, and each turn's steps).
pub struct PlayedRound {
    pub played: Vec<Played>,
    pub env_s: f64,
}

/// Plays one episode per entry of `resets` (`reset`'s arguments; a group's G episodes are G equal
/// entries), sampling with `model` from `rng`, on sessions taken from `idle` (opened where it has
/// too few); the sessions of episodes that did not end in an environment error go back to it.
/// `device` is told when the device is needed and when it is not (it starts held).
pub fn play(
    model: &LoadedModel,
    params: &SamplingParams,
    rng: &mut SamplerRng,
    resets: &[Map<String, Value>],
    (settings, idle): (&EpisodeSettings, &mut Vec<Session>),
    device: &mut dyn FnMut(DeviceUse) -> Result<(), crate::grants::GrantError>,
) -> Result<PlayedRound, RoundError> {
    let tokenizer = &model.tokenizer;
    let mut slots: Vec<Option<Session>> = resets.iter().map(|_| idle.pop()).collect();
    device(DeviceUse::Release)?;
    let env_started = Instant::now();
    let opened: Vec<Result<(Session, Reply, f64), EnvError>> = each_mut(&mut slots, |i, kept| {
        let started = Instant::now();
        if let Some(mut session) = kept.take() {
            match session.reset(&resets[i]) {
                Ok(first) => return Ok((session, first, started.elapsed().as_secs_f64())),
                // The environment's own refusal of these arguments: a new session would get it too.
                Err(error @ EnvError::Env { .. }) => return Err(error),
                // The kept connection went away (an idle timeout, a restarted server): nothing of
                // an episode ran on it; a new one is opened.
                Err(_) => {}
            }
        }
        let mut session = Session::open(&settings.server, &settings.policy, settings.step_timeout)?;
        let first = session.reset(&resets[i])?;
        Ok((session, first, started.elapsed().as_secs_f64()))
    });
    let mut env_s = env_started.elapsed().as_secs_f64();
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
        device(DeviceUse::Hold)?;
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
        device(DeviceUse::Release)?;
        let mut taken: Vec<Option<Session>> = actions.iter().map(|(i, _)| sessions[*i].take()).collect();
        let stepped = Instant::now();
        let replies: Vec<(Result<Reply, EnvError>, f64)> = each_mut(&mut taken, |j, session| {
            let started = Instant::now();
            let session = session.as_mut().expect("a running episode has its session");
            (session.step(&actions[j].1), started.elapsed().as_secs_f64())
        });
        env_s += stepped.elapsed().as_secs_f64();
        for (((i, _), session), (reply, env_s)) in actions.iter().zip(taken).zip(replies) {
            let i = *i;
            sessions[i] = session;
            let game = &mut played[i];
            game.env_s += env_s;
            let reply = match reply {
                Ok(reply) => reply,
                // The action does not fit the environment's schema: the model's fault, like a
                // turn that is no action at all (its session goes on).
                Err(EnvError::Env { code, message, .. }) if code == "VALIDATION_ERROR" => {
                    ends[i] = Some(EpisodeEnd::NotAnAction(format!(
                        "the environment refused the action: {message}"
                    )));
                    continue;
                }
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
            // + 0.0: an empty sum is -0.0.
            EnvReward::Sum => game.rewards.iter().sum::<f64>() + 0.0,
            EnvReward::Last => game.rewards.last().copied().unwrap_or(0.0),
        };
    }
    for (session, game) in sessions.into_iter().zip(&played) {
        match (session, &game.end) {
            (Some(session), EpisodeEnd::EnvError(_)) => session.close(),
            (Some(session), _) if idle.len() < settings.sessions.max(resets.len()) => idle.push(session),
            (Some(session), _) => session.close(),
            (None, _) => {}
        }
    }
    Ok(PlayedRound { played, env_s })
}

/// Whether `error` is the environment's absence (no connection, no answer in time, a broken
/// session) rather than its refusal: the former is retried by requeueing the job.
pub fn unreachable(error: &EnvError) -> bool {
    matches!(error, EnvError::Connect { .. } | EnvError::Timeout { .. } | EnvError::Protocol { .. })
}

/// A played episode's rows beyond its [`Sampled`]: its own prompt (the environment's first
/// observation, rendered), which of its tokens the model sampled, and how it went.
#[derive(Debug, Clone)]
pub struct EpisodeRow {
    pub prompt: Vec<i64>,
    /// Per token after the prompt: 1 sampled, 0 the environment's reply.
    pub mask: Vec<f32>,
    pub turns: usize,
    /// The environment's reward of each step, and the episode's (`env.reward`).
    pub rewards: Vec<f64>,
    pub reward: f64,
    pub end: EpisodeEnd,
}

/// Each episode as what a step trains on: row `i` is group `i / group_size`'s.
pub fn into_rows(
    played: Vec<Played>,
    group_size: usize,
    model: &LoadedModel,
) -> (Vec<Sampled>, Vec<EpisodeRow>) {
    played
        .into_iter()
        .enumerate()
        .map(|(i, game)| {
            let Played { episode, rewards, reward, end, .. } = game;
            let finish = match end {
                EpisodeEnd::TokenBudget => Finish::Length,
                _ => Finish::Eos,
            };
            let sampled = Sampled {
                prompt_index: i / group_size.max(1),
                text: model.tokenizer.decode(&episode.tokens),
                tokens: episode.tokens,
                logprobs: episode.logprobs,
                finish,
            };
            let row = EpisodeRow {
                prompt: episode.prompt,
                mask: episode.mask,
                turns: episode.turns,
                rewards,
                reward,
                end,
            };
            (sampled, row)
        })
        .unzip()
}

/// `reset`'s arguments for each record, `copies` times each (a group's): its `reference` object
/// (none: no arguments).
pub fn resets(records: &[PromptRecord], copies: usize) -> Result<Vec<Map<String, Value>>, String> {
    let mut all = Vec::with_capacity(records.len() * copies);
    for record in records {
        let arguments = match serde_json::from_str::<Value>(&record.reference_json) {
            Ok(Value::Object(arguments)) => arguments,
            Ok(Value::Null) => Map::new(),
            Ok(other) => {
                return Err(format!(
                    "record {}: its reference is the environment's reset arguments: expected a JSON object, got {other}",
                    record.id
                ));
            }
            Err(error) => return Err(format!("record {}: reference: {error}", record.id)),
        };
        all.extend(std::iter::repeat_n(arguments, copies));
    }
    Ok(all)
}

/// The environment's verdict on each episode, as the reward's last grader (`term`, `env`): its
/// score the episode's reward (sum or last), passed when the environment rewarded it (> 0). The
/// combiner adds it to the graders' on the episode's text, or a formula names it. (How the episode
/// ended is the environment's figures' and its record's, not a grader error.)
pub fn env_verdicts(term: &str, rows: &[EpisodeRow]) -> Vec<OutputLine> {
    rows.iter()
        .map(|row| OutputLine {
            id: None,
            score: row.reward,
            passed: row.reward > 0.0,
            components: Components(Vec::new()),
            extracted: None,
            error: None,
            timed_out: false,
            latency_us: 0,
            verifier: term.to_owned(),
            explanation: None,
        })
        .collect()
}

/// Opens `sessions` sessions at once and resets each (no arguments): a server that cannot hold a
/// step's episodes is refused before the first step, naming its limit. (An OpenEnv server at
/// capacity accepts the connection and refuses at the first request.) The environment's own
/// refusal of a reset without arguments is not this check's: the steps' resets carry the data's.
/// The sessions are the job's first idle ones.
pub fn open_sessions(settings: &EpisodeSettings, sessions: usize) -> Result<Vec<Session>, EnvError> {
    let mut slots = vec![(); sessions];
    let opened = each_mut(&mut slots, |_, ()| {
        let mut session = Session::open(&settings.server, &settings.policy, settings.step_timeout)?;
        match session.reset(&Map::new()) {
            Ok(_) | Err(EnvError::Env { .. }) => Ok(session),
            Err(error) => Err(error),
        }
    });
    let mut first_error = None;
    let mut open = Vec::with_capacity(sessions);
    for session in opened {
        match session {
            Ok(session) => open.push(session),
            // The limit, when a server said it, is what the team acts on.
            Err(error)
                if first_error.as_ref().is_none_or(|first| !matches!(first, EnvError::Capacity { .. })) =>
            {
                first_error = Some(error);
            }
            Err(_) => {}
        }
    }
    match first_error {
        None => Ok(open),
        Some(error) => {
            open.into_iter().for_each(Session::close);
            Err(error)
        }
    }
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
