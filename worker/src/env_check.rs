//! `rlvr-worker env-check`: an `[env]` spec's first episodes, played by its policy against its
//! environment and shown turn by turn with what is trained on, so a team sees what its job will
//! learn from before it spends a device hour. No training, no state directory. The daemon runs it
//! for `POST /v1/env/check` (`rlvrctl env check`) with the spec resolved in the team's namespace
//! and the team's outbound policy, and reads its [`EnvCheck`] line.

use std::time::Duration;

use rlvr_model::{SamplerRng, Tokenizer};
use rlvr_plugin_api::HostContext;
use rlvr_protocol::env::{CheckedEpisode, EnvCheck, EpisodeSpan, MAX_CHECK_EPISODES, SpanSource};
use rlvr_protocol::records::{self, PromptRecord};
use rlvr_protocol::spec::JobSpec;
use rlvr_protocol::worker::EnvCheckArgs;
use serde_json::{Map, Value};
use tch::{Device, Kind};

use crate::episodes::{EpisodeSettings, Played, play, resets};
use crate::sidecar::Sidecar;

/// Plays the spec's first episodes (its first training records, one episode each, sampled as its
/// rollouts are) and returns them as spans. A spec naming an installed environment gets it
/// started from `--env-script` with `--env-python`, in a temporary directory. `host`: where the
/// environment may be reached (the team's outbound policy under the daemon). Errors read
/// `FIELD: why`.
pub fn check(args: &EnvCheckArgs, host: &HostContext) -> Result<EnvCheck, String> {
    let spec_path = &args.spec;
    if !(1..=MAX_CHECK_EPISODES).contains(&args.episodes) {
        return Err(format!("episodes: expected 1 to {MAX_CHECK_EPISODES}, got {}", args.episodes));
    }
    let text =
        std::fs::read_to_string(spec_path).map_err(|error| format!("{}: {error}", spec_path.display()))?;
    let spec = JobSpec::parse_file_text(spec_path, &text)
        .map_err(|errors| format!("{}: {errors}", spec_path.display()))?;
    let env = spec.env.as_ref().ok_or_else(|| "env: the spec has no [env] section to check".to_owned())?;
    let policy = &spec.model.policy;
    if policy.starts_with("line:") || policy.starts_with("base:") {
        return Err(format!(
            "model.policy: {policy} is a name the daemon resolves (rlvrctl env check); give env-check a model directory or builtin:tiny-arith"
        ));
    }
    if let Some(threads) = args.threads {
        tch::set_num_threads(i32::try_from(threads.max(1)).unwrap_or(i32::MAX));
    }
    let model = rlvr_model::load(policy, Device::Cpu, Kind::Float)
        .map_err(|error| format!("model.policy: {error}"))?;
    let records = records::load_prompts("data.train", &spec.data.train).map_err(|error| error.to_string())?;
    let chosen: Vec<PromptRecord> = records.into_iter().take(args.episodes).collect();
    // Where an environment that cannot be played is said to be: the server named, or installed.
    let at = if env.environment.is_some() { "env.environment" } else { "env.url" };
    let mut settings =
        EpisodeSettings::from_spec(env, host, chosen.len()).map_err(|message| format!("{at}: {message}"))?;
    let workdir = tempfile::tempdir().map_err(|error| format!("a temporary directory: {error}"))?;
    let _sidecar = match (&env.environment, args.env_script.as_deref().zip(args.env_python.as_deref())) {
        (None, _) => None,
        (Some(name), None) => {
            return Err(format!("env.environment: {name} is started from --env-script with --env-python"));
        }
        (Some(_), Some((script, python))) => {
            let started = Sidecar::start(
                python,
                script,
                &env.args,
                &workdir.path().join("env"),
                Duration::from_secs(180),
            )
            .map_err(|message| format!("env.environment: {message}"))?;
            settings.server = started.server();
            Some(started)
        }
    };
    let params = crate::sampling_params(&spec.rollout);
    let mut rng = SamplerRng::new(spec.job.seed);
    let resets = resets(&chosen, 1)?;
    let round = play(&model, &params, &mut rng, &resets, (&settings, &mut Vec::new()), &mut |_| Ok(()))
        .map_err(|error| format!("{at}: {error}"))?;
    let episodes = round
        .played
        .iter()
        .zip(&chosen)
        .zip(resets)
        .map(|((game, record), reset)| checked(game, record, reset, &model.tokenizer))
        .collect();
    Ok(EnvCheck { episodes })
}

/// An episode as its spans: the prompt, each model turn (trained on) and each reply (masked out),
/// with their text (special tokens shown); then how it ended.
fn checked(
    game: &Played,
    record: &PromptRecord,
    reset: Map<String, Value>,
    tokenizer: &Tokenizer,
) -> CheckedEpisode {
    let episode = &game.episode;
    let span = |from, ids: &[i64]| EpisodeSpan {
        from,
        text: tokenizer.decode_with_specials(ids),
        tokens: ids.to_vec(),
    };
    let mut spans = vec![span(SpanSource::Prompt, &episode.prompt)];
    let mut start = 0;
    while start < episode.tokens.len() {
        let sampled = episode.mask[start] > 0.0;
        let end = (start..episode.tokens.len())
            .find(|&i| (episode.mask[i] > 0.0) != sampled)
            .unwrap_or(episode.tokens.len());
        let from = if sampled { SpanSource::Model } else { SpanSource::Env };
        spans.push(span(from, &episode.tokens[start..end]));
        start = end;
    }
    CheckedEpisode {
        record: record.id.clone(),
        reset,
        spans,
        end: game.end.name().to_owned(),
        problem: game.end.problem().map(str::to_owned),
        turns: episode.turns,
        rewards: game.rewards.clone(),
        reward: game.reward,
    }
}
