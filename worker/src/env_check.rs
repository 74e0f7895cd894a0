//! `rlvr-worker env-check`: an `[env]` spec's first episodes, played by its policy against its
//! environment and shown turn by turn with what is trained on, so a team sees what its job will
//! learn from before it spends a device hour. No training, no state directory.

use std::fmt::Write;
use std::path::Path;
use std::time::Duration;

use rlvr_model::{SamplerRng, SamplingParams, Tokenizer};
use rlvr_plugin_api::HostContext;
use rlvr_protocol::records::{self, PromptRecord};
use rlvr_protocol::spec::JobSpec;
use tch::{Device, Kind};

use crate::episodes::{EpisodeSettings, Played, play, resets};
use crate::sidecar::Sidecar;

/// Plays `count` episodes of the spec at `spec_path` (its first training records, one episode
/// each, sampled as its rollouts are) and describes them. A spec naming an installed environment
/// gets it started from `sidecar` (its script and python), in a temporary directory.
pub fn check(spec_path: &Path, count: usize, sidecar: Option<(&Path, &Path)>) -> Result<String, String> {
    let text =
        std::fs::read_to_string(spec_path).map_err(|error| format!("{}: {error}", spec_path.display()))?;
    let spec = JobSpec::parse_file_text(spec_path, &text)
        .map_err(|errors| format!("{}: {errors}", spec_path.display()))?;
    let env =
        spec.env.as_ref().ok_or_else(|| format!("{}: no [env] section to check", spec_path.display()))?;
    let policy = &spec.model.policy;
    if policy.starts_with("line:") || policy.starts_with("base:") {
        return Err(format!(
            "model.policy: {policy} is a name the daemon resolves; give env-check a model directory or builtin:tiny-arith"
        ));
    }
    let model = rlvr_model::load(policy, Device::Cpu, Kind::Float)
        .map_err(|error| format!("model.policy: {error}"))?;
    let records = records::load_prompts("data.train", &spec.data.train).map_err(|error| error.to_string())?;
    let chosen: Vec<PromptRecord> = records.into_iter().take(count.max(1)).collect();
    let mut settings = EpisodeSettings::from_spec(env, &HostContext::unrestricted(), chosen.len())
        .map_err(|message| format!("env.url: {message}"))?;
    let workdir = tempfile::tempdir().map_err(|error| format!("a temporary directory: {error}"))?;
    let _sidecar = match (&env.environment, sidecar) {
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
    let rollout = &spec.rollout;
    let params = SamplingParams {
        max_new_tokens: rollout.max_new_tokens as usize,
        temperature: rollout.temperature,
        top_p: rollout.top_p,
        top_k: rollout.top_k as usize,
        stop: rollout.stop.clone(),
    };
    let mut rng = SamplerRng::new(spec.job.seed);
    let resets = resets(&chosen, 1)?;
    let round = play(&model, &params, &mut rng, &resets, (&settings, &mut Vec::new()), &mut |_| Ok(()))
        .map_err(|error| error.to_string())?;
    let mut out = String::new();
    for (i, (game, record)) in round.played.iter().zip(&chosen).enumerate() {
        let arguments = serde_json::Value::Object(resets[i].clone());
        let _ =
            writeln!(out, "episode {} of {}: record {}, reset {arguments}", i + 1, chosen.len(), record.id);
        out.push_str(&describe(game, &model.tokenizer));
    }
    Ok(out)
}

/// An episode as its spans: the prompt, each model turn (trained on) and each reply (masked out),
/// with their text (special tokens shown) and token counts; then how it ended.
pub fn describe(game: &Played, tokenizer: &Tokenizer) -> String {
    let episode = &game.episode;
    let mut out = String::new();
    let line = |out: &mut String, who: &str, ids: &[i64], what: &str| {
        let text = format!("{:?}", tokenizer.decode_with_specials(ids));
        let _ = writeln!(out, "  {who:<6} {text:<40} {} tokens, {what}", ids.len());
    };
    line(&mut out, "prompt", &episode.prompt, "not trained");
    let mut start = 0;
    while start < episode.tokens.len() {
        let sampled = episode.mask[start] > 0.0;
        let end = (start..episode.tokens.len())
            .find(|&i| (episode.mask[i] > 0.0) != sampled)
            .unwrap_or(episode.tokens.len());
        let (who, what) = if sampled { ("model", "trained") } else { ("env", "masked out") };
        line(&mut out, who, &episode.tokens[start..end], what);
        start = end;
    }
    let problem = game.end.problem().map(|problem| format!(": {problem}")).unwrap_or_default();
    let _ = writeln!(
        out,
        "  end    {}{problem} after {} turn(s); the environment's rewards {:?}, the episode's {}",
        game.end.name(),
        episode.turns,
        game.rewards,
        game.reward
    );
    out
}
