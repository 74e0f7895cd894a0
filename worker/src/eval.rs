//! Held-out scoring: greedy completions of the held-out prompts, scored by the job's verifiers;
//! and the gates' evaluation of the candidate against its baseline on held-out and canaries.
//! Greedy, so a score depends on the weights only — and uses no randomness that resume tracks.
//! Every completion of an evaluation is generated first, and the device grant given back before
//! the verifiers (CPU work) score them. A multi-turn job's (`[env]`) are greedy episodes against
//! its environment, each record's `reference` its `reset` arguments, scored as its training
//! episodes are (the environment's reward plus the graders'); the grant is held while they play.
//!
//! An engine job whose ranks complete held-out (`engine.heldout = "engine"`) is scored here too,
//! from the ids they generated ([`heldout_from_engine`], [`for_gates_from_engine`]): ended and
//! decoded by the native sampler's rules, so only the forward passes differ.
//!
//! The reward itself is `rlvr_plugin_host::reward`'s.

use rlvr_model::{LoadedModel, Sampled, SamplerRng, SamplingParams, generate, load as load_model};
use rlvr_protocol::worker::{
    Baseline, BaselineKind, CanaryRegressions, GateEvaluation, GateScore, ModelScores, ScoreFigures, Trend,
    Verdicts,
};
use tch::{Kind, Tensor};

use super::episodes::{EpisodeRow, into_rows, play, resets};
use super::step::StepError;
use super::{Job, Rollouts, Work};
use rlvr_plugin_host::reward::ToScore;
use rlvr_protocol::grants::Phase;
use rlvr_protocol::records::PromptRecord;

/// Prompts generated at once.
const EVAL_BATCH: usize = rlvr_protocol::memory::EVAL_BATCH as usize;

/// A model's score on a set of prompts.
#[derive(Debug, Clone, PartialEq)]
pub struct HeldoutScore {
    /// Fraction of prompts whose completion passed every weighted verifier.
    pub accuracy: f64,
    pub reward_mean: f64,
    pub completion_len_mean: f64,
    pub prompts: usize,
    /// Whether each prompt's completion passed, in the set's order (for canary regressions and
    /// the held-out gain's paired interval).
    pub passed: Vec<bool>,
    /// Verifier calls, and those that came back with an error or timed out.
    pub verifier_calls: usize,
    pub verifier_errors: usize,
    pub verifier_timeouts: usize,
}

impl HeldoutScore {
    /// The figures of a metrics line (the per-prompt verdicts stay out of the log).
    pub fn figures(&self) -> ScoreFigures {
        ScoreFigures {
            accuracy: self.accuracy,
            reward_mean: self.reward_mean,
            completion_len_mean: self.completion_len_mean,
            prompts: self.prompts,
        }
    }

    /// The figures the gates judge.
    pub fn gate_score(&self) -> GateScore {
        GateScore {
            figures: self.figures(),
            verifier_calls: self.verifier_calls,
            verifier_errors: self.verifier_errors,
            verifier_timeouts: self.verifier_timeouts,
            passed: Verdicts(self.passed.clone()),
        }
    }
}

/// The held-out prompts every evaluation uses: the set, or its first `eval.max_prompts`.
pub(crate) fn heldout_records(job: &Job) -> Result<&[PromptRecord], String> {
    let Some(heldout) = &job.heldout else { return Err("no held-out set".into()) };
    let limit = job.spec.eval.max_prompts.map_or(heldout.len(), |m| (m as usize).min(heldout.len()));
    Ok(&heldout[..limit])
}

/// Scores the policy on the held-out set (or its first `eval.max_prompts`); a reward model's
/// job scores its pairs instead (`reward_training::heldout`).
pub fn heldout(job: &Job) -> Result<HeldoutScore, StepError> {
    if matches!(job.work, Work::RewardModel { .. }) {
        return crate::reward_training::heldout(job);
    }
    let records = heldout_records(job)?;
    let grant = job.grants.hold(Phase::Eval)?;
    let completed = complete(job, &job.policy, records, "held-out")?;
    grant.release(job.device);
    score(job, records, &completed)
}

/// The gates' evaluation of the candidate (the policy: the checkpoint the run chose) and of `baseline`: held-out
/// and canary scores of both, the canaries the baseline passed and the candidate fails, and the
/// training trend. The daemon judges it (`jobs::gate::judge`).
pub fn for_gates(
    job: &Job,
    baseline: &Baseline,
    canaries: Option<&[PromptRecord]>,
    trend: Option<Trend>,
) -> Result<GateEvaluation, StepError> {
    let grant = job.grants.hold(Phase::Eval)?;
    let heldout = job.heldout.as_ref().map(|_| heldout_records(job)).transpose()?;
    let completions = |model: &LoadedModel| -> Result<Completions, String> {
        let heldout = heldout.map(|records| complete(job, model, records, "held-out")).transpose()?;
        let canaries = canaries.map(|records| complete(job, model, records, "canary")).transpose()?;
        Ok((heldout, canaries))
    };
    let candidate = completions(&job.policy)?;
    let before = if baseline.kind == BaselineKind::Start && job.policy.adapters.is_some() {
        // The start of a LoRA job is its base: the policy with its adapters off, no third copy.
        job.policy.model.without_adapters(|| completions(&job.policy))?
    } else {
        let kind = job.policy.vs.variables().values().next().map_or(Kind::Float, Tensor::kind);
        let mut model = load_model(&baseline.model, job.device, kind)
            .map_err(|error| format!("the gates' baseline {}: {error}", baseline.model))?;
        model.vs.freeze();
        completions(&model)?
    };
    // The baseline's weights left the device with its block; the verifiers need no device.
    grant.release(job.device);
    judged(job, baseline, (heldout, canaries), trend, &candidate, &before)
}

/// The gates' evaluation from the completions an engine's ranks generated
/// (`engine.heldout = "engine"`): `candidate`'s and `before`'s are (held-out, canaries), each the
/// generated ids of every prompt in the set's order; a set the job has must be there.
pub fn for_gates_from_engine(
    job: &Job,
    baseline: &Baseline,
    canaries: Option<&[PromptRecord]>,
    trend: Option<Trend>,
    candidate: EngineSets,
    before: EngineSets,
) -> Result<GateEvaluation, StepError> {
    let heldout = job.heldout.as_ref().map(|_| heldout_records(job)).transpose()?;
    let completed = |(heldout_tokens, canary_tokens): EngineSets| -> Result<Completions, String> {
        let heldout =
            heldout.map(|records| from_engine(job, records, heldout_tokens, "held-out")).transpose()?;
        let canaries =
            canaries.map(|records| from_engine(job, records, canary_tokens, "canary")).transpose()?;
        Ok((heldout, canaries))
    };
    let (candidate, before) = (completed(candidate)?, completed(before)?);
    judged(job, baseline, (heldout, canaries), trend, &candidate, &before)
}

/// The held-out score of completions an engine's ranks generated (`tokens[i]`: the generated ids
/// of held-out prompt i).
pub fn heldout_from_engine(job: &Job, tokens: Option<Vec<Vec<i64>>>) -> Result<HeldoutScore, StepError> {
    let records = heldout_records(job)?;
    let completed = from_engine(job, records, tokens, "held-out")?;
    score(job, records, &completed)
}

/// Generated ids of a set's prompts (held-out, canaries), as an engine's ranks wrote them.
pub type EngineSets = (Option<Vec<Vec<i64>>>, Option<Vec<Vec<i64>>>);

/// A held-out or canary set (held-out, canaries), its completions as generated.
type Completions = (Option<Completed>, Option<Completed>);

/// An engine's completions of `records`, ended by the native sampler's rules at greedy decoding
/// (the first EOS kept, `rollout.stop`, `rollout.max_new_tokens`) and decoded by the policy's
/// tokenizer: what the native evaluation would score for the same ids.
fn from_engine(
    job: &Job,
    records: &[PromptRecord],
    tokens: Option<Vec<Vec<i64>>>,
    what: &str,
) -> Result<Completed, String> {
    let tokens = tokens.ok_or_else(|| format!("the engine left no {what} completions"))?;
    if tokens.len() != records.len() {
        return Err(format!("the engine completed {} {what} prompts of {}", tokens.len(), records.len()));
    }
    let params = greedy(job);
    let sampled = tokens
        .into_iter()
        .enumerate()
        .map(|(index, ids)| {
            let logprobs = vec![0.0; ids.len()];
            Sampled::ended(index, ids, logprobs, &job.policy.tokenizer, &params)
                .map_err(|error| format!("{what} completion {}: {error}", records[index].id))
        })
        .collect::<Result<_, _>>()?;
    Ok(Completed { sampled, episodes: None })
}

/// Greedy decoding with the job's sampling limits: every evaluation's.
fn greedy(job: &Job) -> SamplingParams {
    SamplingParams { temperature: 0.0, top_p: 1.0, top_k: 0, ignore_eos: false, ..job.sampling.clone() }
}

/// Scores both models' completions and assembles what the daemon judges.
fn judged(
    job: &Job,
    baseline: &Baseline,
    (heldout, canaries): (Option<&[PromptRecord]>, Option<&[PromptRecord]>),
    trend: Option<Trend>,
    candidate: &Completions,
    before: &Completions,
) -> Result<GateEvaluation, StepError> {
    let scores = |(heldout_done, canaries_done): &Completions| {
        let heldout = heldout
            .zip(heldout_done.as_ref())
            .map(|(records, done)| score(job, records, done))
            .transpose()?;
        let canaries = canaries
            .zip(canaries_done.as_ref())
            .map(|(records, done)| score(job, records, done))
            .transpose()?;
        Ok::<_, StepError>((heldout, canaries))
    };
    let (candidate, before) = (scores(candidate)?, scores(before)?);
    let regressions: Vec<String> = match (canaries, &candidate.1, &before.1) {
        (Some(records), Some(now), Some(then)) => records
            .iter()
            .zip(now.passed.iter().zip(&then.passed))
            .filter(|(_, (now, then))| **then && !**now)
            .map(|(record, _)| record.id.clone())
            .collect(),
        _ => Vec::new(),
    };
    let scores_of = |(heldout, canaries): &(Option<HeldoutScore>, Option<HeldoutScore>)| ModelScores {
        heldout: heldout.as_ref().map(HeldoutScore::gate_score),
        canaries: canaries.as_ref().map(HeldoutScore::gate_score),
    };
    Ok(GateEvaluation {
        baseline: baseline.clone(),
        candidate: scores_of(&candidate),
        baseline_scores: scores_of(&before),
        canary_regressions: CanaryRegressions {
            count: regressions.len(),
            ids: regressions.into_iter().take(20).collect(),
        },
        training: trend,
    })
}

/// A set's completions in its order, and for a multi-turn job each one's episode.
struct Completed {
    sampled: Vec<Sampled>,
    episodes: Option<Vec<EpisodeRow>>,
}

/// Greedy completions of `records` by `model`, in their order (device work).
fn complete(
    job: &Job,
    model: &LoadedModel,
    records: &[PromptRecord],
    what: &str,
) -> Result<Completed, String> {
    let params = greedy(job);
    // Greedy decoding draws nothing; a throwaway generator keeps the training one untouched.
    let mut rng = SamplerRng::new(0);
    if let Rollouts::Env(environment) = &job.rollouts {
        let (mut sampled, mut episodes) = (Vec::new(), Vec::new());
        let settings = &environment.settings;
        let mut idle = environment.idle.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        // No more sessions at once than the server was seen to hold.
        for chunk in records.chunks(EVAL_BATCH.min(settings.sessions.max(1))) {
            let resets = resets(chunk, 1)?;
            let round = play(model, &params, &mut rng, &resets, (settings, &mut *idle), &mut |_| Ok(()))
                .map_err(|error| format!("{what} episodes: {error}"))?;
            let (chunk_sampled, rows) = into_rows(round.played, 1, model);
            let offset = sampled.len();
            sampled.extend(
                chunk_sampled.into_iter().map(|s| Sampled { prompt_index: offset + s.prompt_index, ..s }),
            );
            episodes.extend(rows);
        }
        return Ok(Completed { sampled, episodes: Some(episodes) });
    }
    let tokenizer = &model.tokenizer;
    let mut completions = Vec::with_capacity(records.len());
    for (chunk_index, chunk) in records.chunks(EVAL_BATCH).enumerate() {
        let prompts = crate::step::encode_prompts(tokenizer, chunk, what)?;
        let sampled = tch::no_grad(|| generate(&model.model, tokenizer, &prompts, 1, &params, &mut rng))
            .map_err(|error| format!("{what} sampling: {error}"))?;
        let offset = chunk_index * EVAL_BATCH;
        completions
            .extend(sampled.into_iter().map(|s| Sampled { prompt_index: offset + s.prompt_index, ..s }));
    }
    Ok(Completed { sampled: completions, episodes: None })
}

/// `records` scored by the job's verifiers on their completions (`completions[i]` is record i's).
fn score(job: &Job, records: &[PromptRecord], completed: &Completed) -> Result<HeldoutScore, StepError> {
    let completions = &completed.sampled;
    let (mut reward, mut length) = (0.0, 0usize);
    let mut passed = Vec::with_capacity(records.len());
    let (mut errors, mut timeouts) = (0usize, 0usize);
    // In batches as before: a verifier's parallelism and limits are per call.
    for (chunk, sampled) in records.chunks(EVAL_BATCH).zip(completions.chunks(EVAL_BATCH)) {
        let items: Vec<ToScore<'_>> = chunk
            .iter()
            .zip(sampled)
            .map(|(record, sample)| ToScore {
                id: &record.id,
                prompt: &record.prompt,
                completion: &sample.text,
                reference_json: &record.reference_json,
            })
            .collect();
        let episodes = completed.episodes.as_ref().map(|episodes| {
            let first = sampled.first().map_or(0, |s| s.prompt_index);
            &episodes[first..first + sampled.len()]
        });
        let verdicts = crate::reward_models::score(job, &items, episodes)?;
        for (scored, sample) in verdicts.iter().zip(sampled) {
            passed.push(scored.passed);
            reward += scored.reward;
            length += sample.tokens.len();
            errors += scored.errors.len().saturating_sub(scored.timeouts as usize);
            timeouts += scored.timeouts as usize;
        }
    }
    let n = records.len().max(1) as f64;
    Ok(HeldoutScore {
        accuracy: passed.iter().filter(|p| **p).count() as f64 / n,
        reward_mean: reward / n,
        completion_len_mean: length as f64 / n,
        prompts: records.len(),
        passed,
        // The graders' calls (an `[env]` job's environment reward, the combiner's last term, is none).
        verifier_calls: records.len() * job.spec.verifiers.len(),
        verifier_errors: errors,
        verifier_timeouts: timeouts,
    })
}
