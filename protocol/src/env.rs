//! `[env]`: the environment a multi-turn job's rollouts talk to, and what the spec can say about
//! it by itself (pure).
//!
//! A job with `[env]` samples episodes instead of single completions: the environment's first
//! observation is the prompt, each model turn is read as an action and sent, each reply becomes
//! the next message, until the environment says done or `max_turns`. The environment's rewards
//! (summed, or the last) are the episode's reward, plus the job's graders' on the episode's text
//! when it names any. Each data row's `reference` object is `reset`'s keyword arguments, so a
//! dataset says which task each episode starts (`{"a": 12, "b": 30}`, `{"seed": 7}`).

use serde::{Deserialize, Serialize};

use crate::engine::EngineKind;
use crate::spec::{JobSpec, RolloutEngine, SpecError};

/// `[env]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct EnvSection {
    pub kind: EnvKind,
    /// The server the team runs, `http://host:port` (under the operator's outbound policy); or:
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// An environment the operator installed (`environments.dir`/NAME.py), which the worker
    /// starts for the job as its sidecar, sandboxed, and stops with it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub environment: Option<String>,
    /// The sidecar's own arguments, after those the worker gives it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<String>,
    /// Model turns an episode takes at most.
    #[serde(default = "defaults::max_turns")]
    pub max_turns: u32,
    /// Bounds opening a session, `reset` and each `step`.
    #[serde(default = "defaults::step_timeout_s")]
    pub step_timeout_s: u64,
    /// How a model turn is read as an action.
    #[serde(default)]
    pub action: ActionKind,
    /// `action = "field"`: the action's one field, which the turn's text fills.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub action_field: Option<String>,
    /// `action = "hermes"`: the one tool the job offers (any name when left out).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool: Option<String>,
    /// The observation's field shown to the model: the first message and each reply.
    #[serde(default = "defaults::observation_field")]
    pub observation_field: String,
    /// The replies' role in the chat template: `user`, or `tool` where the template has one.
    #[serde(default = "defaults::reply_role")]
    pub reply_role: String,
    /// How the episode's reward is made from the environment's step rewards.
    #[serde(default)]
    pub reward: EnvReward,
}

/// `env.kind`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "lowercase")]
pub enum EnvKind {
    /// OpenEnv's stateful WebSocket interface (`/ws`), openenv 0.10.0.
    Openenv,
}

/// `env.action`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "lowercase")]
pub enum ActionKind {
    /// The first JSON object in the turn.
    #[default]
    Json,
    /// The turn's text as the action's one field (`action_field`).
    Field,
    /// One Hermes-style `<tool_call>{"name": …, "arguments": {…}}</tool_call>` (Qwen2.5, Qwen3,
    /// Hermes, and the other families whose templates use that tag): its arguments are the action.
    Hermes,
}

/// `env.reward`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "lowercase")]
pub enum EnvReward {
    /// The sum of every step's reward.
    #[default]
    Sum,
    /// The last step's reward.
    Last,
}

/// The longest episode a spec may ask for, in turns.
pub const MAX_TURNS: u32 = 64;
/// The longest a step may take, in seconds.
pub const MAX_STEP_TIMEOUT_S: u64 = 3600;

mod defaults {
    pub fn max_turns() -> u32 {
        4
    }
    pub fn step_timeout_s() -> u64 {
        30
    }
    pub fn observation_field() -> String {
        "text".into()
    }
    pub fn reply_role() -> String {
        "user".into()
    }
}

/// What is wrong with `spec`'s `[env]`, each naming its field; nothing without one.
pub fn problems(spec: &JobSpec) -> Vec<SpecError> {
    let Some(env) = &spec.env else { return Vec::new() };
    let mut errors = Vec::new();
    let mut check = |ok: bool, field: &str, message: String| {
        if !ok {
            errors.push(SpecError { field: format!("env.{field}"), message });
        }
    };
    match (&env.url, &env.environment) {
        (Some(url), None) => check(
            url.strip_prefix("http://").is_some_and(|rest| !rest.is_empty()),
            "url",
            format!("expected an OpenEnv server's http://host:port (its WebSocket is /ws), got {url:?}"),
        ),
        (None, Some(name)) => check(
            !name.is_empty()
                && name.len() <= 64
                && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-'),
            "environment",
            format!("expected the name of an installed environment (1–64 of [A-Za-z0-9_-]), got {name:?}"),
        ),
        _ => check(
            false,
            "url",
            "give either url (a server the team runs) or environment (one the operator installed), not both"
                .into(),
        ),
    }
    check(
        env.args.is_empty() || env.environment.is_some(),
        "args",
        "are the sidecar's arguments: they need environment".into(),
    );
    check(
        env.args.len() <= 32 && env.args.iter().all(|arg| arg.len() <= 256 && !arg.contains('\0')),
        "args",
        "expected at most 32 arguments of at most 256 bytes each".into(),
    );
    check(
        (1..=MAX_TURNS).contains(&env.max_turns),
        "max_turns",
        format!("expected 1 to {MAX_TURNS} turns, got {}", env.max_turns),
    );
    check(
        (1..=MAX_STEP_TIMEOUT_S).contains(&env.step_timeout_s),
        "step_timeout_s",
        format!("expected 1 to {MAX_STEP_TIMEOUT_S} seconds, got {}", env.step_timeout_s),
    );
    let named = |name: &Option<String>| name.as_deref().is_some_and(|name| !name.trim().is_empty());
    match env.action {
        ActionKind::Field => check(
            named(&env.action_field),
            "action_field",
            "action = \"field\" sends the turn's text as one field of the action: name it".into(),
        ),
        _ => check(
            env.action_field.is_none(),
            "action_field",
            format!("is for action = \"field\" (this job's action is \"{}\")", env.action.name()),
        ),
    }
    check(
        env.tool.is_none() || env.action == ActionKind::Hermes && named(&env.tool),
        "tool",
        "names the one tool of action = \"hermes\" (a non-empty name)".into(),
    );
    check(
        !env.observation_field.trim().is_empty(),
        "observation_field",
        "expected the name of the observation's field the model reads".into(),
    );
    check(
        ["user", "tool"].contains(&env.reply_role.as_str()),
        "reply_role",
        format!("expected \"user\" or \"tool\", got {:?}", env.reply_role),
    );
    // The native worker plays the episodes: its own sampler, turn by turn.
    let mut refuse = |ok: bool, field: &str, message: &str| {
        if !ok {
            errors.push(SpecError { field: field.into(), message: message.into() });
        }
    };
    refuse(
        crate::builtin::Builtin::of(spec).is_none(),
        "optimizer.plugin",
        "[env] episodes are the rollouts of online training (GRPO, RLOO, PPO): a built-in job does not play them",
    );
    refuse(
        spec.engine.kind == EngineKind::Native,
        "engine.kind",
        "[env] episodes are played by the native worker: an [engine] job cannot have one",
    );
    refuse(
        spec.rollout.engine == RolloutEngine::Native,
        "rollout.engine",
        "[env] episodes are sampled turn by turn by the native sampler: \"vllm\" cannot play them yet",
    );
    refuse(
        spec.rollout.dynamic_sampling_rounds == 0,
        "rollout.dynamic_sampling_rounds",
        "cannot be combined with [env] (each extra round would replay the environment's episodes)",
    );
    errors
}

impl ActionKind {
    pub fn name(self) -> &'static str {
        match self {
            ActionKind::Json => "json",
            ActionKind::Field => "field",
            ActionKind::Hermes => "hermes",
        }
    }
}

/// Most episodes one environment check plays (`POST /v1/env/check`, `rlvr-worker env-check`).
pub const MAX_CHECK_EPISODES: usize = 8;

/// An environment check: a spec's first episodes played against its environment as its rollouts
/// are, each as the spans a step would train on — `POST /v1/env/check`'s answer, and the line
/// `rlvr-worker env-check --json` writes for the daemon.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct EnvCheck {
    pub episodes: Vec<CheckedEpisode>,
}

/// One episode of an environment check.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct CheckedEpisode {
    /// The training record it started from (its `id`).
    pub record: String,
    /// `reset`'s arguments: the record's `reference`.
    #[cfg_attr(feature = "openapi", schema(value_type = Object))]
    pub reset: serde_json::Map<String, serde_json::Value>,
    /// The prompt, then each model turn and each reply, in order.
    pub spans: Vec<EpisodeSpan>,
    /// `done`, `max_turns`, `token_budget`, `not_an_action`, `prefix_break` or `env_error`.
    pub end: String,
    /// What went wrong, for the last three.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub problem: Option<String>,
    pub turns: usize,
    /// The environment's reward of each step, and the episode's (`env.reward`: sum or last).
    pub rewards: Vec<f64>,
    pub reward: f64,
}

/// A run of an episode's tokens from one side.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct EpisodeSpan {
    pub from: SpanSource,
    /// The tokens' text, special tokens shown.
    pub text: String,
    pub tokens: Vec<i64>,
}

/// Who wrote a span, and so whether it is trained on: only the model's turns are (mask 1); the
/// prompt and the environment's replies are not (mask 0, log-probability 0).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum SpanSource {
    Prompt,
    Model,
    Env,
}

impl EnvCheck {
    /// The check as a person reads it: per episode its record and reset, each span with its text,
    /// its token count and whether it is trained on, then how it ended.
    pub fn render(&self) -> String {
        use std::fmt::Write;
        let mut out = String::new();
        for (i, episode) in self.episodes.iter().enumerate() {
            let reset = serde_json::Value::Object(episode.reset.clone());
            let _ = writeln!(
                out,
                "episode {} of {}: record {}, reset {reset}",
                i + 1,
                self.episodes.len(),
                episode.record
            );
            for span in &episode.spans {
                let (who, what) = match span.from {
                    SpanSource::Prompt => ("prompt", "not trained"),
                    SpanSource::Model => ("model", "trained"),
                    SpanSource::Env => ("env", "masked out"),
                };
                let text = format!("{:?}", span.text);
                let _ = writeln!(out, "  {who:<6} {text:<40} {} tokens, {what}", span.tokens.len());
            }
            let problem = episode.problem.as_ref().map(|problem| format!(": {problem}")).unwrap_or_default();
            let _ = writeln!(
                out,
                "  end    {}{problem} after {} turn(s); the environment's rewards {:?}, the episode's {}",
                episode.end, episode.turns, episode.rewards, episode.reward
            );
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(env: &str, more: &str) -> Result<JobSpec, String> {
        spec_of("grpo", env, more)
    }

    fn spec_of(optimizer: &str, env: &str, more: &str) -> Result<JobSpec, String> {
        let text = format!(
            "[job]\nname = \"e\"\nteam = \"t\"\nmodel_line = \"e\"\nseed = 1\n[model]\npolicy = \"builtin:tiny-arith\"\n\
             [data]\ntrain = \"d.jsonl\"\n[optimizer]\nplugin = \"{optimizer}\"\n[budget]\nmax_steps = 2\n\
             {more}\n[env]\n{env}\n"
        );
        let spec = JobSpec::from_toml(&text).map_err(|error| error.to_string())?;
        let problems = problems(&spec);
        match problems.is_empty() {
            true => Ok(spec),
            false => Err(problems.iter().map(ToString::to_string).collect::<Vec<_>>().join("; ")),
        }
    }

    const SERVER: &str = "kind = \"openenv\"\nurl = \"http://127.0.0.1:8000\"";

    #[test]
    fn an_env_section_reads_with_its_defaults_and_each_wrong_key_is_named() {
        let env = spec(SERVER, "").unwrap().env.unwrap();
        assert_eq!(
            (env.max_turns, env.step_timeout_s, env.action, env.reward),
            (4, 30, ActionKind::Json, EnvReward::Sum)
        );
        assert_eq!((env.observation_field.as_str(), env.reply_role.as_str()), ("text", "user"));
        let field = format!("{SERVER}\naction = \"field\"\naction_field = \"answer\"\nreward = \"last\"");
        let env = spec(&field, "").unwrap().env.unwrap();
        assert_eq!((env.action_field.as_deref(), env.reward), (Some("answer"), EnvReward::Last));
        // (the section's keys, the refusal)
        let cases: &[(&str, &str, &str)] = &[
            (
                "kind = \"openenv\"\nurl = \"https://envs.example\"",
                "",
                "env.url: expected an OpenEnv server's http://host:port",
            ),
            ("kind = \"openenv\"\nurl = \"http://\"", "", "env.url: expected"),
            (&format!("{SERVER}\nmax_turns = 0"), "", "env.max_turns: expected 1 to 64 turns, got 0"),
            (&format!("{SERVER}\nmax_turns = 65"), "", "env.max_turns: expected 1 to 64 turns, got 65"),
            (
                &format!("{SERVER}\nstep_timeout_s = 0"),
                "",
                "env.step_timeout_s: expected 1 to 3600 seconds, got 0",
            ),
            (&format!("{SERVER}\naction = \"field\""), "", "env.action_field: action = \"field\" sends"),
            (
                &format!("{SERVER}\naction_field = \"x\""),
                "",
                "env.action_field: is for action = \"field\" (this job's action is \"json\")",
            ),
            (
                &format!("{SERVER}\ntool = \"calc\""),
                "",
                "env.tool: names the one tool of action = \"hermes\"",
            ),
            (&format!("{SERVER}\naction = \"hermes\"\ntool = \" \""), "", "env.tool: names the one tool"),
            (
                &format!("{SERVER}\nreply_role = \"system\""),
                "",
                "env.reply_role: expected \"user\" or \"tool\", got \"system\"",
            ),
            (&format!("{SERVER}\nobservation_field = \"\""), "", "env.observation_field: expected the name"),
            (
                SERVER,
                "[rollout]\nengine = \"vllm\"",
                "rollout.engine: [env] episodes are sampled turn by turn",
            ),
            (
                SERVER,
                "[rollout]\ndynamic_sampling_rounds = 2",
                "rollout.dynamic_sampling_rounds: cannot be combined with [env]",
            ),
            (
                SERVER,
                "[engine]\nkind = \"trl\"",
                "engine.kind: [env] episodes are played by the native worker",
            ),
        ];
        for (env, more, expected) in cases {
            let refused = spec(env, more).expect_err(env);
            assert!(refused.contains(expected), "{env} {more}: {refused}");
        }
        let builtin = spec_of("rejection-sampling", SERVER, "").unwrap_err();
        assert!(
            builtin.contains("optimizer.plugin: [env] episodes are the rollouts of online training"),
            "{builtin}"
        );
        let parse = |env: &str| spec(env, "").unwrap_err();
        assert!(parse("kind = \"gym\"\nurl = \"http://h:1\"").contains("unknown variant `gym`"));
        let sidecar =
            spec("kind = \"openenv\"\nenvironment = \"arith_feedback\"\nargs = [\"--pad\"]", "").unwrap();
        let env = sidecar.env.unwrap();
        assert_eq!(
            (env.url, env.environment.as_deref(), env.args),
            (None, Some("arith_feedback"), vec!["--pad".to_owned()])
        );
        assert!(parse(&format!("{SERVER}\nturns = 3")).contains("unknown field `turns`"));
    }

    #[test]
    fn a_formula_may_name_the_environments_reward_and_no_grader_may_take_its_name() {
        let job = |env: bool, more: &str| {
            let env = if env { format!("[env]\n{SERVER}\n") } else { String::new() };
            format!(
                "[job]\nname = \"e\"\nteam = \"t\"\nmodel_line = \"e\"\n[model]\npolicy = \"builtin:tiny-arith\"\n\
                 [data]\ntrain = \"d.jsonl\"\n[optimizer]\nplugin = \"grpo\"\n[budget]\nmax_steps = 2\n{more}\n{env}"
            )
        };
        let format = "[[verifiers]]\nplugin = \"format\"\n";
        // (has [env], graders and [reward], the refusals)
        let cases: &[(bool, String, &[&str])] = &[
            (true, format!("{format}[reward]\nformula = \"format > 0 ? env : 0\"\n"), &[]),
            (true, "[reward]\nformula = \"min(env, 1)\"\n".to_owned(), &[]),
            (
                false,
                format!("{format}[[verifiers]]\nplugin = \"math\"\n[reward]\nformula = \"format * env\"\n"),
                &["reward.formula: at column 10, `env`: not a grader of this reward (graders: format, math)"],
            ),
            (
                true,
                format!("{format}[reward]\nformula = \"envv\"\n"),
                &["reward.formula: at column 1, `envv`: not a grader of this reward (graders: format, env)"],
            ),
            (
                true,
                "[[verifiers]]\nplugin = \"format\"\nname = \"env\"\n".to_owned(),
                &[
                    r#"verifiers[0].name: "env" is the environment's reward in a job with [env]; give this grader another `name`"#,
                ],
            ),
        ];
        for (env, more, refused) in cases {
            let spec = JobSpec::from_toml(&job(*env, more)).unwrap();
            let got: Vec<String> = match spec.validate() {
                Ok(()) => Vec::new(),
                Err(errors) => errors.0.iter().map(ToString::to_string).collect(),
            };
            assert_eq!(got, *refused, "{more}");
            if refused.is_empty() && *env {
                assert!(spec.reward_formula().unwrap().is_some(), "{more}");
            }
        }
    }
}
