//! One training step.
//!
//! Online (GRPO, RLOO, PPO): choose prompts → sample G completions each (no grad) → score them
//! with the verifiers → old, reference (and value) passes without grad, once per batch → the
//! plugin's advantages → μ updates, each over every micro-batch (the plugin's loss is the
//! micro-batch's share of the batch's, so the summed gradients equal one pass over the whole
//! batch; a bf16 model's are summed in f32, by `AdamW::backward`) → clip → AdamW. With μ = 1 the
//! old log-probabilities are the sampler's own.
//! Offline (SFT, DPO): the next records → the same update with the plugin's loss.

use std::collections::BTreeMap;
use std::time::Instant;

use rlvr_model::TrainableSnapshot;
use rlvr_model::logprobs::{SequenceBatch, completion_logprobs, training_logprobs};
use rlvr_model::sample::{Finish, Sampled, generate, logprob_temperature};
use rlvr_plugin_api::{
    AdvantageInputs, DataMode, GroupOutcome, LossInputs, LossScale, RResult, RString, TensorHandle,
};
use rlvr_plugin_tensor::TensorHandleExt;
use rlvr_protocol::grants::Phase;
use rlvr_protocol::worker::{
    DynamicSampling, EnvFigures, EpisodeRecord, Latency, MetricsLine, RolloutLogprobs, RolloutRecord,
    RolloutSampling, SamplerGap, StepTimes,
};
use tch::{Device, Kind, Tensor};
use tracing::{info, warn};

use super::episodes::{DeviceUse, EpisodeEnd, EpisodeRow, RoundError};
use super::grants::{Grant, GrantError};
use super::models::Reference;
use super::{Job, Rollouts, TrainData, Work};
use rlvr_plugin_host::reward::{Scored, ToScore};
use rlvr_protocol::records::PromptRecord;

/// What a step produced.
pub struct StepOutput {
    /// The metrics line.
    pub metrics: MetricsLine,
    /// One rollout record per completion (online).
    pub records: Vec<RolloutRecord>,
    pub tokens_generated: u64,
}

/// Why a step (or a held-out evaluation) could not finish.
#[derive(Debug, thiserror::Error)]
pub enum StepError {
    /// The daemon's grant socket failed: not the job's fault; the job is requeued.
    #[error(transparent)]
    Grants(#[from] GrantError),
    /// The job's fault or the model's: a plugin error, a non-finite loss, a bad record.
    #[error("{0}")]
    Failed(String),
    /// The job's environment could not be reached or went silent (`[env]`): the job is
    /// requeued, as far as the daemon's crash limit allows.
    #[error("environment: {0}")]
    Environment(String),
}

impl From<String> for StepError {
    fn from(message: String) -> Self {
        StepError::Failed(message)
    }
}

/// Rows of one update: prompt and completion tokens per row, group ids and, online, rewards.
pub(crate) struct Rows {
    pub(crate) prompts: Vec<Vec<i64>>,
    pub(crate) completions: Vec<Vec<i64>>,
}

impl Rows {
    fn len(&self) -> usize {
        self.completions.len()
    }

    fn width(&self, range: std::ops::Range<usize>) -> usize {
        self.completions[range].iter().map(Vec::len).max().unwrap_or(0).max(1)
    }

    /// This step's micro-batches under the job's `[optimizer]` limits.
    pub(crate) fn micro_batches(&self, job: &Job) -> Vec<std::ops::Range<usize>> {
        let lengths: Vec<(usize, usize)> =
            self.prompts.iter().zip(&self.completions).map(|(p, c)| (p.len(), c.len())).collect();
        let limits = crate::micro_batches::Limits {
            rows: job.spec.optimizer.micro_batch_size as usize,
            tokens: job.spec.optimizer.micro_batch_tokens,
            unit: if job.optimizer_info.data_mode == DataMode::OfflinePairs { 2 } else { 1 },
        };
        crate::micro_batches::split(&lengths, limits)
    }

    pub(crate) fn batch(
        &self,
        range: std::ops::Range<usize>,
        pad_id: i64,
        device: Device,
    ) -> Result<SequenceBatch, String> {
        let pairs: Vec<(&[i64], &[i64])> =
            range.map(|i| (self.prompts[i].as_slice(), self.completions[i].as_slice())).collect();
        SequenceBatch::new(&pairs, pad_id, device).map_err(|error| error.to_string())
    }
}

/// The first phase of a step, whose grant the step is started with: the rollout, or for offline
/// data the update (offline steps are one device phase).
pub fn first_phase(job: &Job) -> Phase {
    // One step off policy holds its devices for the whole step: the server samples the next
    // step on its device all the while.
    if off_policy(job) {
        return Phase::Update;
    }
    match job.optimizer_info.data_mode {
        DataMode::OnlineGroups | DataMode::OnlineWithCritic => Phase::Rollout,
        DataMode::OfflineSft | DataMode::OfflinePairs => Phase::Update,
    }
}

/// Runs training step `step` (1-based); `weights_step` is the step whose weights sample it.
/// `grant` holds the devices for [`first_phase`]; the step asks for the others itself.
pub fn run_step(job: &mut Job, step: u64, weights_step: u64, grant: Grant) -> Result<StepOutput, StepError> {
    match &job.work {
        Work::RejectionSampling(_) => crate::sampling::step(job, step, grant),
        Work::Distill { .. } => crate::distill::step(job, step, grant),
        Work::RewardModel { .. } => crate::reward_training::step(job, step, grant),
        Work::Engine(_) => Err(StepError::Failed("an [engine] job's steps are its engine's".into())),
        Work::Policy => match job.optimizer_info.data_mode {
            DataMode::OnlineGroups | DataMode::OnlineWithCritic if off_policy(job) => {
                off_policy_step(job, step, weights_step, grant)
            }
            DataMode::OnlineGroups | DataMode::OnlineWithCritic => {
                online_step(job, step, weights_step, grant)
            }
            DataMode::OfflineSft | DataMode::OfflinePairs => offline_step(job, step, grant),
        },
    }
}

fn online_step(
    job: &mut Job,
    step: u64,
    weights_step: u64,
    rollout_grant: Grant,
) -> Result<StepOutput, StepError> {
    let step_started = Instant::now();
    let sampled = sample_step(job, step, rollout_grant)?;
    let update_grant = job.grants.hold(Phase::Update)?;
    let update_started = Instant::now();
    let trained = train_online(job, &sampled.batch, step, None)?;
    // The next step samples from these weights.
    let sync_s = match &mut job.rollouts {
        Rollouts::Native | Rollouts::Env(_) => None,
        Rollouts::Vllm(server) => server.sync(&job.policy, step).map_err(|error| error.to_string())?,
    };
    update_grant.release(job.device);
    let update_s = update_started.elapsed().as_secs_f64() - sync_s.unwrap_or(0.0);
    finish_online(job, step, weights_step, &sampled, &trained, (update_s, sync_s, step_started))
}

/// What an online step hands back once trained: the curriculum told, the records, the metrics
/// line with the step's times (`update_s`, `sync_s`, and when the step started).
fn finish_online(
    job: &mut Job,
    step: u64,
    weights_step: u64,
    sampled: &SampledStep,
    trained: &OnlineUpdate,
    (update_s, sync_s, step_started): (f64, Option<f64>, Instant),
) -> Result<StepOutput, StepError> {
    observe_groups(job, step, sampled)?;
    let records = rollout_records(job, step, weights_step, &sampled.batch, trained);
    let mut metrics = online_metrics(step, sampled, trained);
    metrics.time = Some(StepTimes {
        rollout_s: Some(sampled.rollout_s),
        verify_s: Some(sampled.verify_s),
        update_s,
        sync_s,
        step_s: step_started.elapsed().as_secs_f64(),
        generation_tokens_per_s: Some(sampled.tokens as f64 / sampled.rollout_s.max(1e-9)),
        verifier_latency_us: Some(latency(&sampled.batch.scored)),
    });
    Ok(StepOutput { metrics, records, tokens_generated: sampled.tokens })
}

/// `rollout.off_policy_steps`: whether the server samples the next step while this one updates.
fn off_policy(job: &Job) -> bool {
    job.spec.rollout.off_policy_steps > 0 && matches!(job.rollouts, Rollouts::Vllm(_))
}

/// One step off policy: the next step's round, sampled on the server while this step updated.
pub struct NextRound {
    step: u64,
    picked: Vec<PromptRecord>,
    prompt_tokens: Vec<Vec<i64>>,
    sampled: Vec<Sampled>,
    rollout_s: f64,
    /// The step whose weights sampled it, and a copy of those weights (the trainer's at the
    /// start of the step before): its log-probabilities are recomputed with them.
    weights_step: u64,
    behaviour: TrainableSnapshot,
}

/// A step of a job one step off policy (`rollout.off_policy_steps = 1`), holding `grant` — its
/// devices, the trainer's and the server's — throughout: its round was sampled while the step
/// before updated (at a process's first step, nothing has: it samples now, on policy); the next
/// step's round is sampled on the server, from the weights this step starts from, while this one
/// is graded and trained. The ratio's denominator and the sync check are the log-probabilities
/// of the weights that sampled the round, recomputed from the trainer's copy of them.
fn off_policy_step(
    job: &mut Job,
    step: u64,
    weights_step: u64,
    grant: Grant,
) -> Result<StepOutput, StepError> {
    let step_started = Instant::now();
    let count = job.spec.rollout.prompts_per_step as usize;
    let group_size = job.spec.optimizer.group_size as usize;
    let (picked, prompt_tokens, sampled, rollout_s, mut behaviour, weights_step) = match job.next_round.take()
    {
        Some(next) if next.step == step => (
            next.picked,
            next.prompt_tokens,
            next.sampled,
            next.rollout_s,
            Some(next.behaviour),
            next.weights_step,
        ),
        _ => {
            let (picked, prompt_tokens) = choose_prompts(job, step, 0, count)?;
            let started = Instant::now();
            let Rollouts::Vllm(server) = &mut job.rollouts else {
                unreachable!("off_policy checked the engine")
            };
            let sampled = server
                .generate(&prompt_tokens, group_size, &job.sampling, &job.policy.tokenizer, &mut job.rng)
                .map_err(|error| error.to_string())?;
            (picked, prompt_tokens, sampled, started.elapsed().as_secs_f64(), None, weights_step)
        }
    };
    // The next step's round, from the weights the server has: the ones this step starts from.
    let next = match step < job.spec.budget.max_steps {
        true => {
            let (picked, prompt_tokens) = choose_prompts(job, step + 1, 0, count)?;
            let Rollouts::Vllm(server) = &mut job.rollouts else {
                unreachable!("off_policy checked the engine")
            };
            let generation = server
                .generate_in_background(prompt_tokens.clone(), group_size, &job.sampling, &mut job.rng)
                .map_err(|error| error.to_string())?;
            Some((picked, prompt_tokens, generation))
        }
        false => None,
    };
    let drawn = Drawn { picked, prompt_tokens, sampled, rollout_s, episodes: None };
    let batch = score_round(job, step, 0, drawn)?;
    let sampled_step = SampledStep::of_round(batch, group_size);
    let update_started = Instant::now();
    // The weights the next round samples are this step's starting ones: a step sampled on policy
    // copies them; a step sampled one behind gets them from the swap that computes its own.
    let current = match (&behaviour, &next) {
        (None, Some(_)) => Some(job.policy.snapshot_trainable()),
        _ => None,
    };
    let trained = train_online(job, &sampled_step.batch, step, behaviour.as_mut())?;
    let update_s = update_started.elapsed().as_secs_f64();
    let sync_s = match next {
        Some((picked, prompt_tokens, generation)) => {
            let (sampled, rollout_s) =
                generation.finish(&job.sampling, &job.policy.tokenizer).map_err(|error| error.to_string())?;
            let Rollouts::Vllm(server) = &mut job.rollouts else {
                unreachable!("off_policy checked the engine")
            };
            // Its own device: never asleep, so the sync is now.
            let sync_s = server.sync(&job.policy, step).map_err(|error| error.to_string())?;
            let behaviour = current.or(behaviour).expect("a snapshot of this step's starting weights");
            job.next_round = Some(NextRound {
                step: step + 1,
                picked,
                prompt_tokens,
                sampled,
                rollout_s,
                weights_step: step - 1,
                behaviour,
            });
            sync_s
        }
        None => None,
    };
    grant.release(job.device);
    let times = (update_s, sync_s, step_started);
    let mut output = finish_online(job, step, weights_step, &sampled_step, &trained, times)?;
    output.metrics.policy_lag = Some((step - 1) - weights_step);
    Ok(output)
}

/// A step's sampling: the batch trained on, and what every round sampled.
struct SampledStep {
    /// The groups trained on (with dynamic sampling, the informative ones of every round).
    batch: Round,
    /// Every group sampled, every round, for the curriculum.
    outcomes: Vec<GroupOutcome>,
    /// Groups of the first round: the fractions of all-pass and all-fail groups are theirs, what
    /// the policy faced.
    first_groups: usize,
    /// Completion tokens sampled, every round.
    tokens: u64,
    /// Rounds after the first; `None` without dynamic sampling.
    extra_rounds: Option<u32>,
    rollout_s: f64,
    verify_s: f64,
}

impl SampledStep {
    /// A step of one round: `round` is what it trains on and all it sampled.
    fn of_round(round: Round, group_size: usize) -> SampledStep {
        SampledStep {
            outcomes: round.outcomes(group_size),
            first_groups: round.picked.len(),
            tokens: round.tokens(),
            extra_rounds: None,
            rollout_s: round.rollout_s,
            verify_s: round.verify_s,
            batch: round,
        }
    }
}

/// The step's prompts, then — with dynamic sampling — more rounds while groups that teach
/// nothing (all pass or all fail) leave the batch short.
fn sample_step(job: &mut Job, step: u64, rollout_grant: Grant) -> Result<SampledStep, StepError> {
    let count = job.spec.rollout.prompts_per_step as usize;
    let group_size = job.spec.optimizer.group_size as usize;
    let mut sampled = SampledStep::of_round(sample_round(job, step, 0, count, rollout_grant)?, group_size);
    let rounds = job.spec.rollout.dynamic_sampling_rounds;
    if rounds == 0 {
        return Ok(sampled);
    }
    let first = std::mem::take(&mut sampled.batch);
    let mut kept = Round::default();
    kept.take_informative(&first, group_size, count);
    let mut extra_rounds = 0;
    while kept.picked.len() < count && extra_rounds < rounds {
        extra_rounds += 1;
        let grant = job.grants.hold(Phase::Rollout)?;
        let more = sample_round(job, step, extra_rounds, count - kept.picked.len(), grant)?;
        sampled.rollout_s += more.rollout_s;
        sampled.verify_s += more.verify_s;
        sampled.tokens += more.tokens();
        sampled.outcomes.extend(more.outcomes(group_size));
        kept.take_informative(&more, group_size, count);
    }
    sampled.extra_rounds = Some(extra_rounds);
    // Nothing informative within the budget: train on the first round (zero advantages).
    sampled.batch = if kept.picked.is_empty() { first } else { kept };
    Ok(sampled)
}

/// What the update of an online step measured.
struct OnlineUpdate {
    update: UpdateResult,
    /// The plugin's figures, advantages' and losses' (`opt.*`).
    metrics: BTreeMap<String, f64>,
    /// Per row: mean advantage, Σ old log-probability, Σ reference log-probability.
    advantage_rows: Vec<f64>,
    old_sums: Vec<f64>,
    ref_sums: Option<Vec<f64>>,
    /// Estimated entropy of the sampling distribution.
    entropy: f64,
    /// KL to the reference (k3), when there is one.
    kl_ref: Option<f64>,
    /// The first update's log-probabilities against the sampler's: mean ratio, largest |log-ratio|.
    sampler_ratio: (f64, f64),
    /// Another engine's sampling: its gap to the trainer.
    sampler_gap: Option<SamplerGap>,
}

/// The update phase: old, reference (and value) passes, the plugin's advantages, μ updates.
/// `behaviour`: the weights that sampled `batch` when they are not the trainer's now (one step
/// off policy); the old log-probabilities are theirs, and the snapshot holds the trainer's
/// weights from before this update afterwards.
fn train_online(
    job: &mut Job,
    batch: &Round,
    step: u64,
    behaviour: Option<&mut TrainableSnapshot>,
) -> Result<OnlineUpdate, StepError> {
    let Round { sampled, scored, .. } = batch;
    let rows = Rows {
        prompts: (0..sampled.len()).map(|i| batch.row_prompt(i).to_vec()).collect(),
        completions: sampled.iter().map(|s| s.tokens.clone()).collect(),
    };
    let rewards: Vec<f64> = scored.iter().map(|s| s.reward).collect();
    let group_ids: Vec<u64> = sampled.iter().map(|s| s.prompt_index as u64).collect();
    let width = rows.width(0..rows.len());
    let mask = padded(&(0..sampled.len()).map(|i| batch.row_mask(i)).collect::<Vec<_>>(), width, job.device);
    let sampling_logprobs =
        padded(&sampled.iter().map(|s| s.logprobs.clone()).collect::<Vec<_>>(), width, job.device);
    let needs_values = job.optimizer_info.needs_value_head;
    let temperature = logprob_temperature(job.spec.rollout.temperature);
    // The native sampler's log-probabilities are the policy's own; another engine's are the
    // behaviour policy's, which the trainer recomputes and checks them against.
    let native = matches!(job.rollouts, Rollouts::Native | Rollouts::Env(_));
    let (old_logprobs, old_values) = if let Some(earlier) = behaviour {
        // The values are the critic's now; the log-probabilities the sampling weights'.
        let values = if needs_values { no_grad_pass(job, &rows, width, true)?.1 } else { None };
        let logprobs = job
            .policy
            .with_earlier_weights(earlier, || no_grad_pass(job, &rows, width, true))
            .map_err(|error| format!("the sampling weights: {error}"))??
            .0;
        (logprobs, values)
    } else if native && job.spec.optimizer.mu == 1 && !needs_values {
        (sampling_logprobs.shallow_clone(), None)
    } else {
        let (logprobs, values) = no_grad_pass(job, &rows, width, true)?;
        // With μ = 1 the sampler's log-probabilities are the old ones even when values are needed.
        let logprobs =
            if native && job.spec.optimizer.mu == 1 { sampling_logprobs.shallow_clone() } else { logprobs };
        (logprobs, values)
    };
    let sampler_gap = match native {
        true => None,
        false => Some(check_sampler_gap(job, step, &old_logprobs, &sampling_logprobs, &mask)?),
    };
    let ref_logprobs = match job.reference.is_some() {
        true => Some(no_grad_pass(job, &rows, width, false)?.0),
        false => None,
    };
    let inputs = AdvantageInputs {
        rewards: rewards.as_slice().into(),
        group_ids: group_ids.as_slice().into(),
        old_logprobs: TensorHandle::borrow(&old_logprobs),
        ref_logprobs: ref_logprobs.as_ref().map(TensorHandle::borrow).into(),
        mask: TensorHandle::borrow(&mask),
        values: old_values.as_ref().map(TensorHandle::borrow).into(),
    };
    let advantages = job
        .optimizer
        .advantages(&inputs)
        .into_result()
        .map_err(|error| format!("optimizer advantages: {error}"))?;
    // SAFETY: the plugin hands these tensors over (LossOutput/AdvantageOutput contract).
    let advantage_tensor = unsafe { advantages.advantages.into_tensor() };
    let advantage_rows = row_means(&advantage_tensor, &mask);
    let advantage_tensor = match &sampler_gap {
        Some((_, Some(weights))) => importance_weighted(&advantage_tensor, weights),
        _ => advantage_tensor,
    };
    let returns = advantages.returns.into_option().map(|handle| unsafe { handle.into_tensor() });
    let mut metrics = BTreeMap::new();
    for metric in &advantages.metrics {
        metrics.insert(format!("opt.{}", metric.name), metric.value);
    }
    let tensors = BatchTensors {
        mask: &mask,
        old_logprobs: Some(&old_logprobs),
        ref_logprobs: ref_logprobs.as_ref(),
        advantages: Some(&advantage_tensor),
        old_values: old_values.as_ref(),
        returns: returns.as_ref(),
    };
    let update = update(job, &rows, &tensors, step, temperature)?;
    metrics.extend(update.metrics.clone());
    let sampler_ratio = sampler_ratio(&update.first_logprobs, &sampling_logprobs, &mask);
    Ok(OnlineUpdate {
        update,
        metrics,
        advantage_rows,
        old_sums: row_sums(&old_logprobs, &mask),
        ref_sums: ref_logprobs.as_ref().map(|r| row_sums(r, &mask)),
        // E[-log p(x)] over sampled tokens estimates the sampling distribution's entropy.
        entropy: -masked_mean(&sampling_logprobs, &mask),
        kl_ref: ref_logprobs.as_ref().map(|r| k3_mean(&old_logprobs, r, &mask)),
        sampler_ratio,
        sampler_gap: sampler_gap.map(|(gap, _)| gap),
    })
}

/// The gap between the behaviour policy's log-probabilities (`sampler`, the engine's) and the
/// old policy's (`old`, the trainer's, before this step's update), over the batch's tokens: a
/// step whose mean gap passes `rollout.max_logprob_gap` fails, since its samples are not of the
/// trainer's weights. Also the truncated importance weights min(exp(old − sampler), C), zero
/// on padding, when `rollout.importance_cap` is on.
fn check_sampler_gap(
    job: &Job,
    step: u64,
    old: &Tensor,
    sampler: &Tensor,
    mask: &Tensor,
) -> Result<(SamplerGap, Option<Tensor>), StepError> {
    let rollout = &job.spec.rollout;
    let (gap, weights) = tch::no_grad(|| sampler_gap(old, sampler, mask, rollout.importance_cap));
    // A NaN gap fails too.
    if gap.mean_abs.is_nan() || gap.mean_abs > rollout.max_logprob_gap {
        return Err(StepError::Failed(format!(
            "the rollout engine's log-probabilities of the sampled tokens are {:.3e} from the trainer's on \
             average (largest {:.3e}; rollout.max_logprob_gap = {}): vLLM did not sample the trainer's \
             weights, so the weight sync before this step did not take (at a run's first step: the server's \
             load of the weights it started on); nothing was trained on these samples",
            gap.mean_abs, gap.max_abs, rollout.max_logprob_gap
        )));
    }
    info!(step, mean_abs = gap.mean_abs, max_abs = gap.max_abs, k3 = gap.k3, "sampler gap");
    Ok((gap, weights))
}

/// [`SamplerGap`]'s figures over the tokens of `mask`, and the capped weights (`None` when the
/// cap is 0, off).
pub(crate) fn sampler_gap(
    old: &Tensor,
    sampler: &Tensor,
    mask: &Tensor,
    cap: f64,
) -> (SamplerGap, Option<Tensor>) {
    let mask_f64 = mask.to_kind(Kind::Double);
    let delta = (old.to_kind(Kind::Double) - sampler.to_kind(Kind::Double)) * &mask_f64;
    let ratio = delta.exp();
    let max_abs = if mask_f64.sum(Kind::Double).double_value(&[]) > 0.0 {
        delta.abs().max().double_value(&[])
    } else {
        0.0
    };
    let (weights, importance_weight_mean, importance_capped_frac) = if cap > 0.0 {
        let capped = ratio.gt(cap).to_kind(Kind::Double);
        let weights = ratio.clamp_max(cap) * &mask_f64;
        let mean = masked_mean(&weights, mask);
        (Some(weights), mean, masked_mean(&capped, mask))
    } else {
        (None, 1.0, 0.0)
    };
    let gap = SamplerGap {
        mean_abs: masked_mean(&delta.abs(), mask),
        max_abs,
        k3: masked_mean(&(&ratio - &delta - 1.0), mask),
        importance_weight_mean,
        importance_capped_frac,
    };
    (gap, weights)
}

/// `advantages` (per token `[rows, width]`, or per row `[rows]`) times the per-token weights.
fn importance_weighted(advantages: &Tensor, weights: &Tensor) -> Tensor {
    let weights = weights.to_kind(advantages.kind());
    if advantages.dim() == 1 { advantages.unsqueeze(-1) * weights } else { advantages * weights }
}

/// Tells the curriculum about every group sampled (the dropped ones too), and warns when every
/// group failed: nothing is learned then.
fn observe_groups(job: &mut Job, step: u64, sampled: &SampledStep) -> Result<(), StepError> {
    if let Some(curriculum) = &mut job.curriculum {
        curriculum
            .observe(sampled.outcomes.as_slice().into())
            .into_result()
            .map_err(|e| format!("curriculum: {e}"))?;
    }
    let first = &sampled.outcomes[..sampled.first_groups];
    // Said on the first such step and every tenth after, not on every step.
    if first.iter().all(|o| o.passed == 0) && (step == 1 || step % 10 == 0) {
        warn!(
            groups = sampled.first_groups,
            "every group is all-fail: every advantage is zero and nothing is learned; start from an SFT \
             cold start, add a format reward, or choose easier prompts"
        );
    }
    Ok(())
}

/// One record per completion trained on.
fn rollout_records(
    job: &Job,
    step: u64,
    weights_step: u64,
    batch: &Round,
    trained: &OnlineUpdate,
) -> Vec<RolloutRecord> {
    let verifiers = job.rewarder.ids();
    let rollout = &job.spec.rollout;
    let sampling = RolloutSampling {
        temperature: rollout.temperature,
        top_p: rollout.top_p,
        top_k: rollout.top_k,
        max_new_tokens: rollout.max_new_tokens,
    };
    batch
        .sampled
        .iter()
        .zip(&batch.scored)
        .zip(&batch.completion_ids)
        .enumerate()
        .map(|(i, ((sample, scored), completion_id))| {
            let prompt = &batch.picked[sample.prompt_index];
            RolloutRecord {
                step,
                checkpoint_step: weights_step,
                prompt_id: prompt.id.clone(),
                group_id: format!("{step}-{}", sample.prompt_index),
                completion_id: completion_id.clone(),
                prompt: prompt.prompt.clone(),
                completion: sample.text.clone(),
                prompt_tokens: batch.row_prompt(i).len(),
                completion_tokens: sample.tokens.len(),
                // An episode's is how it ended (`done`, `max_turns`, ...).
                finish: match &batch.episodes {
                    Some(episodes) => episodes.rows[i].end.name().to_owned(),
                    None => finish_name(sample.finish).to_owned(),
                },
                reward: scored.reward,
                passed: scored.passed,
                components: scored.components.iter().cloned().collect(),
                extracted: scored.extracted.iter().cloned().collect(),
                errors: scored.errors.clone(),
                verifiers: verifiers.clone(),
                advantage: trained.advantage_rows[i],
                logprob: RolloutLogprobs {
                    policy: trained.update.policy_sums.get(i).copied(),
                    old: trained.old_sums[i],
                    reference: trained.ref_sums.as_ref().map(|sums| sums[i]),
                },
                sampling: sampling.clone(),
                episode: batch.episodes.as_ref().map(|episodes| episode_record(&episodes.rows[i], sample)),
            }
        })
        .collect()
}

/// A row's episode as its rollout record carries it.
fn episode_record(row: &EpisodeRow, sample: &Sampled) -> EpisodeRecord {
    EpisodeRecord {
        turns: row.turns,
        end: row.end.name().to_owned(),
        problem: row.end.problem().map(str::to_owned),
        rewards: row.rewards.clone(),
        prompt_tokens: row.prompt.clone(),
        tokens: sample.tokens.clone(),
        mask: row.mask.iter().map(|&m| u8::from(m > 0.0)).collect(),
        logprobs: sample.logprobs.clone(),
    }
}

/// The metrics of an online step: of the batch trained on; tokens of every round sampled.
fn online_metrics(step: u64, sampled: &SampledStep, trained: &OnlineUpdate) -> MetricsLine {
    let Round { sampled: samples, scored, picked, .. } = &sampled.batch;
    let groups = sampled.first_groups.max(1) as f64;
    let first = &sampled.outcomes[..sampled.first_groups];
    let rewards: Vec<f64> = scored.iter().map(|s| s.reward).collect();
    let lengths: Vec<f64> = samples.iter().map(|s| s.tokens.len() as f64).collect();
    let (reward_mean, reward_std) = mean_std(&rewards);
    let mut line = MetricsLine {
        step,
        reward_mean: Some(reward_mean),
        reward_std: Some(reward_std),
        passed_frac: Some(scored.iter().filter(|s| s.passed).count() as f64 / scored.len().max(1) as f64),
        components: Some(component_means(scored)),
        all_pass_frac: Some(first.iter().filter(|o| o.passed == o.total).count() as f64 / groups),
        all_fail_frac: Some(first.iter().filter(|o| o.passed == 0).count() as f64 / groups),
        completion_len_mean: Some(mean_std(&lengths).0),
        completion_len_max: Some(lengths.iter().copied().fold(0.0, f64::max)),
        cut_frac: Some(
            samples.iter().filter(|s| s.finish == Finish::Length).count() as f64
                / samples.len().max(1) as f64,
        ),
        tokens_generated: Some(sampled.tokens),
        entropy: Some(trained.entropy),
        kl_ref: trained.kl_ref,
        ratio_first_update_mean: Some(trained.sampler_ratio.0),
        log_ratio_first_update_max_abs: Some(trained.sampler_ratio.1),
        sampler_gap: trained.sampler_gap,
        verified: Some(scored.len()),
        verifier_timeouts: Some(scored.iter().map(|s| u64::from(s.timeouts)).sum()),
        verifier_errors: Some(scored.iter().filter(|s| !s.errors.is_empty()).count()),
        env: sampled.batch.episodes.as_ref().map(|episodes| env_figures(episodes, sampled.rollout_s)),
        dynamic_sampling: sampled.extra_rounds.map(|extra_rounds| DynamicSampling {
            extra_rounds,
            groups_sampled: sampled.outcomes.len(),
            groups_trained: picked.len(),
        }),
        ..MetricsLine::default()
    };
    add_update_metrics(&mut line, &trained.metrics, &trained.update);
    line
}

/// What a step's episodes did against the environment.
fn env_figures(episodes: &Episodes, rollout_s: f64) -> EnvFigures {
    let rows = &episodes.rows;
    let n = rows.len().max(1) as f64;
    let ended = |name: &str| rows.iter().filter(|row| row.end.name() == name).count();
    EnvFigures {
        episodes: rows.len(),
        turns_mean: rows.iter().map(|row| row.turns as f64).sum::<f64>() / n,
        reward_mean: rows.iter().map(|row| row.reward).sum::<f64>() / n,
        env_s: episodes.env_s,
        env_share: episodes.env_s / rollout_s.max(1e-9),
        done: ended(EpisodeEnd::Done.name()),
        max_turns: ended(EpisodeEnd::MaxTurns.name()),
        token_budget: ended(EpisodeEnd::TokenBudget.name()),
        not_an_action: rows.iter().filter(|row| matches!(row.end, EpisodeEnd::NotAnAction(_))).count(),
        prefix_breaks: rows.iter().filter(|row| matches!(row.end, EpisodeEnd::PrefixBreak(_))).count(),
        env_errors: rows.iter().filter(|row| matches!(row.end, EpisodeEnd::EnvError(_))).count(),
    }
}

/// A multi-turn round's episodes beyond their `Sampled` rows (`[env]`), in the rows' order.
pub(crate) struct Episodes {
    pub(crate) rows: Vec<EpisodeRow>,
    /// Wall-clock seconds the round waited on the environment.
    pub(crate) env_s: f64,
}

/// What a round sampled, before it is graded.
struct Drawn {
    picked: Vec<PromptRecord>,
    prompt_tokens: Vec<Vec<i64>>,
    sampled: Vec<Sampled>,
    rollout_s: f64,
    episodes: Option<Episodes>,
}

/// One round of a step's sampling: its prompts (one per group, in group order), their tokens,
/// the G completions of each (group-contiguous) and their scores.
#[derive(Default)]
pub(crate) struct Round {
    pub(crate) picked: Vec<PromptRecord>,
    prompt_tokens: Vec<Vec<i64>>,
    pub(crate) sampled: Vec<Sampled>,
    pub(crate) scored: Vec<Scored>,
    completion_ids: Vec<String>,
    pub(crate) rollout_s: f64,
    pub(crate) verify_s: f64,
    /// A multi-turn round's episodes (`[env]`): each row's own prompt and mask.
    pub(crate) episodes: Option<Episodes>,
}

impl Round {
    /// Row `i`'s prompt: its episode's (the environment's first observation), else its group's.
    fn row_prompt(&self, i: usize) -> &[i64] {
        match &self.episodes {
            Some(episodes) => &episodes.rows[i].prompt,
            None => &self.prompt_tokens[self.sampled[i].prompt_index],
        }
    }

    /// Which of row `i`'s tokens are trained on: an episode's turns, else every token.
    fn row_mask(&self, i: usize) -> Vec<f32> {
        match &self.episodes {
            Some(episodes) => episodes.rows[i].mask.clone(),
            None => vec![1.0; self.sampled[i].tokens.len()],
        }
    }

    fn tokens(&self) -> u64 {
        self.sampled.iter().map(|s| s.tokens.len() as u64).sum()
    }

    /// Each group's passes, for the curriculum.
    fn outcomes(&self, group_size: usize) -> Vec<GroupOutcome> {
        self.picked
            .iter()
            .zip(self.scored.chunks(group_size))
            .map(|(prompt, members)| GroupOutcome {
                prompt_id: RString::from(prompt.id.as_str()),
                passed: members.iter().filter(|s| s.passed).count() as u32,
                total: members.len() as u32,
            })
            .collect()
    }

    /// Moves `other`'s groups whose completions neither all pass nor all fail into this
    /// round, until it holds `limit` groups (DAPO's dynamic sampling).
    fn take_informative(&mut self, other: &Round, group_size: usize, limit: usize) {
        for (group, members) in other.scored.chunks(group_size).enumerate() {
            if self.picked.len() >= limit {
                return;
            }
            let passed = members.iter().filter(|s| s.passed).count();
            if passed == 0 || passed == members.len() {
                continue;
            }
            let rows = group * group_size..(group + 1) * group_size;
            let index = self.picked.len();
            self.picked.push(other.picked[group].clone());
            self.prompt_tokens.push(other.prompt_tokens[group].clone());
            self.sampled.extend(
                other.sampled[rows.clone()].iter().map(|s| Sampled { prompt_index: index, ..s.clone() }),
            );
            self.scored.extend_from_slice(&other.scored[rows.clone()]);
            self.completion_ids.extend_from_slice(&other.completion_ids[rows.clone()]);
            if let Some(theirs) = &other.episodes {
                let episodes = self.episodes.get_or_insert(Episodes { rows: Vec::new(), env_s: 0.0 });
                episodes.rows.extend_from_slice(&theirs.rows[rows]);
            }
        }
    }
}

/// Samples round `round` of step `step`: `count` prompts (the curriculum's, or the next of the
/// epoch), G completions each on the devices of `grant` (given back before verification, which
/// is CPU work), scored by the job's verifiers.
pub(crate) fn sample_round(
    job: &mut Job,
    step: u64,
    round: u32,
    count: usize,
    grant: Grant,
) -> Result<Round, StepError> {
    let group_size = job.spec.optimizer.group_size as usize;
    let (picked, prompt_tokens) = choose_prompts(job, step, round, count)?;
    if matches!(job.rollouts, Rollouts::Env(_)) {
        let drawn = play_round(job, picked, grant)?;
        return score_round(job, step, round, drawn);
    }
    let tokenizer = &job.policy.tokenizer;
    let rollout_started = Instant::now();
    let sampled: Vec<Sampled> = match &mut job.rollouts {
        Rollouts::Native => tch::no_grad(|| {
            generate(&job.policy.model, tokenizer, &prompt_tokens, group_size, &job.sampling, &mut job.rng)
        })
        .map_err(|error| format!("sampling: {error}"))?,
        Rollouts::Vllm(server) => {
            // A server asleep between rollouts wakes (and loads the last update's weights) for
            // this one, under its grant, and sleeps again before the grant goes back.
            server.wake(&job.policy).map_err(|error| error.to_string())?;
            let sampled = server
                .generate(&prompt_tokens, group_size, &job.sampling, tokenizer, &mut job.rng)
                .map_err(|error| error.to_string())?;
            server.sleep().map_err(|error| error.to_string())?;
            sampled
        }
        Rollouts::Env(_) => unreachable!("episodes are played above"),
    };
    let rollout_s = rollout_started.elapsed().as_secs_f64();
    // Verification is CPU work: the devices serve another job's phase meanwhile.
    grant.release(job.device);
    score_round(job, step, round, Drawn { picked, prompt_tokens, sampled, rollout_s, episodes: None })
}

/// A multi-turn round: G episodes of each of `picked` against the job's environment, the device
/// held (`grant` at first) only while turns are sampled.
fn play_round(job: &mut Job, picked: Vec<PromptRecord>, grant: Grant) -> Result<Drawn, StepError> {
    let group_size = job.spec.optimizer.group_size as usize;
    let resets = crate::episodes::resets(&picked, group_size)?;
    let Rollouts::Env(environment) = &job.rollouts else { unreachable!("the caller checked the rollouts") };
    let mut idle = environment.idle.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let on = (&environment.settings, &mut *idle);
    let (grants, device) = (&job.grants, job.device);
    let mut held = Some(grant);
    let mut use_device = |used: DeviceUse| -> Result<(), GrantError> {
        match used {
            DeviceUse::Release => {
                if let Some(grant) = held.take() {
                    grant.release(device);
                }
            }
            DeviceUse::Hold if held.is_none() => held = Some(grants.hold(Phase::Rollout)?),
            DeviceUse::Hold => {}
        }
        Ok(())
    };
    let started = Instant::now();
    let played =
        crate::episodes::play(&job.policy, &job.sampling, &mut job.rng, &resets, on, &mut use_device);
    drop(idle);
    if let Some(grant) = held.take() {
        grant.release(device);
    }
    let round = played.map_err(|error| match error {
        RoundError::Device(error) => StepError::Grants(error),
        RoundError::Env(error) if crate::episodes::unreachable(&error) => {
            StepError::Environment(error.to_string())
        }
        other => StepError::Failed(other.to_string()),
    })?;
    let rollout_s = started.elapsed().as_secs_f64();
    let (sampled, rows) = crate::episodes::into_rows(round.played, group_size, &job.policy);
    // A group's prompt, for its records: its first episode's (a deterministic environment gives
    // every episode of a group the same).
    let prompt_tokens = rows.iter().step_by(group_size.max(1)).map(|row| row.prompt.clone()).collect();
    let episodes = Some(Episodes { rows, env_s: round.env_s });
    Ok(Drawn { picked, prompt_tokens, sampled, rollout_s, episodes })
}

/// Round `round` of step `step`'s `count` prompts — the curriculum's, or the next of the epoch —
/// and their tokens.
fn choose_prompts(
    job: &mut Job,
    step: u64,
    round: u32,
    count: usize,
) -> Result<(Vec<PromptRecord>, Vec<Vec<i64>>), StepError> {
    let TrainData::Prompts(prompts) = &job.train else {
        return Err(StepError::Failed("an online step samples prompts; this job's data has none".into()));
    };
    let chosen: Vec<usize> = match &mut job.curriculum {
        Some(curriculum) => {
            let mut seed_state = job.spec.job.seed ^ step.wrapping_mul(0xA076_1D64_78BD_642F);
            // Round 0 draws as a step without dynamic sampling does.
            seed_state ^= u64::from(round).wrapping_mul(0xE703_7ED1_A0B4_28DB);
            let seed = rlvr_seeded::SplitMix64::new(seed_state).next_u64();
            let ids = curriculum
                .sample(count as u32, seed)
                .into_result()
                .map_err(|e| format!("curriculum: {e}"))?;
            let index: BTreeMap<&str, usize> =
                prompts.iter().enumerate().map(|(i, p)| (p.id.as_str(), i)).collect();
            ids.iter()
                .map(|id| {
                    index
                        .get(id.as_str())
                        .copied()
                        .ok_or_else(|| format!("curriculum chose unknown prompt id {id:?}"))
                })
                .collect::<Result<_, _>>()?
        }
        None => job.cursor.take(count, prompts.len(), job.spec.job.seed),
    };
    let picked: Vec<PromptRecord> = chosen.iter().map(|&index| prompts[index].clone()).collect();
    let prompt_tokens = encode_prompts(&job.policy.tokenizer, &picked, "prompt")?;
    Ok((picked, prompt_tokens))
}

/// A round's completions scored by the job's verifiers (CPU work).
fn score_round(job: &mut Job, step: u64, round: u32, drawn: Drawn) -> Result<Round, StepError> {
    let Drawn { picked, prompt_tokens, sampled, rollout_s, episodes } = drawn;
    let group_size = job.spec.optimizer.group_size as usize;
    let verify_started = Instant::now();
    let round_tag = if round == 0 { String::new() } else { format!("r{round}-") };
    let completion_ids: Vec<String> = (0..sampled.len())
        .map(|i| format!("{step}-{round_tag}{}-{}", i / group_size, i % group_size))
        .collect();
    let items: Vec<ToScore<'_>> = sampled
        .iter()
        .zip(&completion_ids)
        .map(|(sample, id)| {
            let prompt = &picked[sample.prompt_index];
            ToScore {
                id,
                prompt: &prompt.prompt,
                completion: &sample.text,
                reference_json: &prompt.reference_json,
            }
        })
        .collect();
    // An episode's reward: the environment's, with the graders' on its text.
    let scored = crate::reward_models::score(job, &items, episodes.as_ref().map(|e| e.rows.as_slice()))?;
    let verify_s = verify_started.elapsed().as_secs_f64();
    Ok(Round { picked, prompt_tokens, sampled, scored, completion_ids, rollout_s, verify_s, episodes })
}

fn offline_step(job: &mut Job, step: u64, update_grant: Grant) -> Result<StepOutput, StepError> {
    let step_started = Instant::now();
    let count = job.spec.rollout.prompts_per_step as usize;
    let seed = job.spec.job.seed;
    let tokenizer = &job.policy.tokenizer;
    let eos = tokenizer.eos_ids().first().copied();
    let encode_prompt = |text: &str| -> Result<Vec<i64>, String> {
        tokenizer
            .encode(&tokenizer.render_prompt(text).map_err(|e| e.to_string())?)
            .map_err(|e| e.to_string())
    };
    // A demonstration ends where the model should stop: with its end-of-sequence token.
    let encode_completion = |text: &str| -> Result<Vec<i64>, String> {
        let mut tokens = tokenizer.encode(text).map_err(|e| e.to_string())?;
        tokens.extend(eos);
        Ok(tokens)
    };
    let mut rows = Rows { prompts: Vec::new(), completions: Vec::new() };
    match &job.train {
        TrainData::Sft(records) => {
            for index in job.cursor.take(count, records.len(), seed) {
                let record = &records[index];
                rows.prompts
                    .push(encode_prompt(&record.prompt).map_err(|e| format!("record {}: {e}", record.id))?);
                rows.completions.push(
                    encode_completion(&record.completion)
                        .map_err(|e| format!("record {}: {e}", record.id))?,
                );
            }
        }
        TrainData::Pairs(records) => {
            for index in job.cursor.take(count, records.len(), seed) {
                let record = &records[index];
                let prompt =
                    encode_prompt(&record.prompt).map_err(|e| format!("record {}: {e}", record.id))?;
                for completion in [&record.chosen, &record.rejected] {
                    rows.prompts.push(prompt.clone());
                    rows.completions.push(
                        encode_completion(completion).map_err(|e| format!("record {}: {e}", record.id))?,
                    );
                }
            }
        }
        TrainData::Prompts(_) => {
            return Err(StepError::Failed(
                "an offline step trains on demonstrations or pairs, not prompts".into(),
            ));
        }
    }
    let width = rows.width(0..rows.len());
    let mask =
        padded(&rows.completions.iter().map(|c| vec![1f32; c.len()]).collect::<Vec<_>>(), width, job.device);
    let ref_logprobs = match job.reference.is_some() {
        true => Some(no_grad_pass(job, &rows, width, false)?.0),
        false => None,
    };
    let tensors = BatchTensors {
        mask: &mask,
        old_logprobs: None,
        ref_logprobs: ref_logprobs.as_ref(),
        advantages: None,
        old_values: None,
        returns: None,
    };
    let update = update(job, &rows, &tensors, step, 1.0)?;
    update_grant.release(job.device);
    let tokens: u64 = rows.completions.iter().map(|c| c.len() as u64).sum();
    let mut line =
        MetricsLine { step, rows: Some(rows.len()), train_tokens: Some(tokens), ..MetricsLine::default() };
    add_update_metrics(&mut line, &update.metrics, &update);
    let step_s = step_started.elapsed().as_secs_f64();
    line.time = Some(StepTimes { update_s: step_s, step_s, ..StepTimes::default() });
    Ok(StepOutput { metrics: line, records: Vec::new(), tokens_generated: 0 })
}

/// Batch-level tensors, `[B, width]`, that micro-batches slice.
struct BatchTensors<'a> {
    mask: &'a Tensor,
    old_logprobs: Option<&'a Tensor>,
    ref_logprobs: Option<&'a Tensor>,
    advantages: Option<&'a Tensor>,
    old_values: Option<&'a Tensor>,
    returns: Option<&'a Tensor>,
}

pub(crate) struct UpdateResult {
    pub(crate) metrics: BTreeMap<String, f64>,
    pub(crate) loss: f64,
    pub(crate) grad_norm: f64,
    pub(crate) lr: f64,
    /// Σ policy log-probability per row, from the first update's forward.
    pub(crate) policy_sums: Vec<f64>,
    /// The first update's log-probabilities, per micro-batch (`[rows, its width]`, no grad).
    pub(crate) first_logprobs: Vec<Tensor>,
    /// Forward/backward passes per update.
    pub(crate) micro_batches: usize,
}

/// μ optimizer updates over the rows, micro-batched.
fn update(
    job: &mut Job,
    rows: &Rows,
    tensors: &BatchTensors<'_>,
    step: u64,
    temperature: f64,
) -> Result<UpdateResult, String> {
    let total = rows.len();
    let micro_batches = rows.micro_batches(job);
    let scale = LossScale {
        batch_sequences: total as u64,
        batch_tokens: rows.completions.iter().map(|c| c.len() as u64).sum(),
        max_new_tokens: job.spec.rollout.max_new_tokens,
    };
    let lr = learning_rate_at(job, step);
    let mut metric_sums: BTreeMap<String, f64> = BTreeMap::new();
    let mut loss_total = 0.0;
    let mut grad_norm = 0.0;
    let mut policy_sums = Vec::new();
    let mut first_logprobs = Vec::new();
    let updates = if tensors.advantages.is_some() { job.spec.optimizer.mu } else { 1 };
    for iteration in 0..updates {
        job.adamw.zero_grad();
        for std::ops::Range { start, end } in micro_batches.iter().cloned() {
            let batch = rows.batch(start..end, job.policy.tokenizer.pad_id(), job.device)?;
            // LoRA dropout draws from libtorch's generator, seeded from where the pass is in the
            // job: a resumed run draws the masks an uninterrupted one would.
            job.policy.model.set_training(Some(dropout_seed(job.spec.job.seed, step, iteration, start)));
            // Log-probabilities and hidden states cut from the model's graph: the backward pass
            // through the logits and the model is `pass.backward()`, after the loss's.
            let pass = training_logprobs(&job.policy.model, &batch, temperature);
            job.policy.model.set_training(None);
            let logprobs = pass.logprobs().shallow_clone();
            let columns = logprobs.size()[1];
            let slice = |t: &Tensor| t.narrow(0, start as i64, (end - start) as i64).narrow(1, 0, columns);
            let values = job.value_head.as_ref().map(|(_, head)| {
                tch::nn::Module::forward(head, &pass.hidden().to_kind(Kind::Float)).squeeze_dim(-1)
            });
            let mask = slice(tensors.mask);
            let parts: [Option<Tensor>; 5] = [
                tensors.old_logprobs.map(slice),
                tensors.ref_logprobs.map(slice),
                tensors.advantages.map(slice),
                tensors.old_values.map(slice),
                tensors.returns.map(slice),
            ];
            let [old, reference, advantages, old_values, returns] = &parts;
            let inputs = LossInputs {
                logprobs: TensorHandle::borrow(&logprobs),
                mask: TensorHandle::borrow(&mask),
                old_logprobs: old.as_ref().map(TensorHandle::borrow).into(),
                ref_logprobs: reference.as_ref().map(TensorHandle::borrow).into(),
                advantages: advantages.as_ref().map(TensorHandle::borrow).into(),
                values: values.as_ref().map(TensorHandle::borrow).into(),
                old_values: old_values.as_ref().map(TensorHandle::borrow).into(),
                returns: returns.as_ref().map(TensorHandle::borrow).into(),
                scale,
            };
            let output = match job.optimizer.loss(&inputs) {
                RResult::ROk(output) => output,
                RResult::RErr(error) => return Err(format!("optimizer loss: {error}")),
            };
            // SAFETY: the loss is handed over by the plugin (LossOutput contract).
            let loss = unsafe { output.loss.into_tensor() };
            let value = loss.double_value(&[]);
            if !value.is_finite() {
                return Err(format!("the loss is {value} (update {iteration}, rows {start}..{end})"));
            }
            job.adamw.backward(&loss, || pass.backward());
            loss_total += value / f64::from(updates);
            let weight = (end - start) as f64 / total as f64 / f64::from(updates);
            for metric in output.metrics.iter() {
                *metric_sums.entry(format!("opt.{}", metric.name)).or_default() += metric.value * weight;
            }
            if iteration == 0 {
                policy_sums.extend(row_sums(&logprobs.detach(), &mask));
                first_logprobs.push(logprobs.detach());
            }
        }
        grad_norm = clip_and_update(job, lr)?;
    }
    Ok(UpdateResult {
        metrics: metric_sums,
        loss: loss_total,
        grad_norm,
        lr,
        policy_sums,
        first_logprobs,
        micro_batches: micro_batches.len(),
    })
}

/// The first update's log-probabilities (per micro-batch, in row order) against the sampler's
/// (`[B, width]`), over the tokens of `mask`: the mean of exp(training − sampler's) and the
/// largest |training − sampler's|.
fn sampler_ratio(first: &[Tensor], sampler: &Tensor, mask: &Tensor) -> (f64, f64) {
    let width = sampler.size()[1];
    let parts: Vec<Tensor> = first
        .iter()
        .map(|part| part.to_kind(Kind::Double).constant_pad_nd([0, width - part.size()[1]]))
        .collect();
    let log_ratio = (Tensor::cat(&parts, 0) - sampler.to_kind(Kind::Double)) * mask.to_kind(Kind::Double);
    let max_abs = if log_ratio.numel() == 0 { 0.0 } else { log_ratio.abs().max().double_value(&[]) };
    (masked_mean(&log_ratio.exp(), mask), max_abs)
}

/// The seed of the dropout masks of one training pass (LoRA's): a function of the job's seed,
/// the step, the update within it and the micro-batch's first row (SplitMix64 over them).
pub(crate) fn dropout_seed(seed: u64, step: u64, iteration: u32, first_row: usize) -> u64 {
    let mut mixer = rlvr_seeded::SplitMix64::new(seed ^ 0x6c6f_7261_5f64_726f);
    [step, u64::from(iteration), first_row as u64]
        .into_iter()
        .fold(mixer.next_u64(), |acc, part| rlvr_seeded::SplitMix64::new(acc ^ part).next_u64())
        >> 1
}

/// Log-probabilities (and values) of every row without grad, micro-batched, as `[B, width]`.
fn no_grad_pass(
    job: &Job,
    rows: &Rows,
    width: usize,
    policy: bool,
) -> Result<(Tensor, Option<Tensor>), String> {
    // The reference's pass runs the policy with its adapters off when that is the reference.
    let (model, base) = match (policy, &job.reference) {
        (true, _) => (&job.policy.model, false),
        (false, Some(Reference::Model(reference))) => (&reference.model, false),
        (false, Some(Reference::PolicyBase)) => (&job.policy.model, true),
        (false, None) => return Err("a reference pass without a reference".into()),
    };
    let temperature = logprob_temperature(job.spec.rollout.temperature);
    let pass = || {
        let mut logprob_parts = Vec::new();
        let mut value_parts = Vec::new();
        for range in rows.micro_batches(job) {
            let batch = rows.batch(range, job.policy.tokenizer.pad_id(), job.device)?;
            let (logprobs, hidden) = completion_logprobs(model, &batch, temperature);
            let pad = width as i64 - logprobs.size()[1];
            logprob_parts.push(logprobs.constant_pad_nd([0, pad]));
            if policy && let Some((_, head)) = &job.value_head {
                let values = tch::nn::Module::forward(head, &hidden.to_kind(Kind::Float)).squeeze_dim(-1);
                value_parts.push(values.constant_pad_nd([0, pad]));
            }
        }
        let values = (!value_parts.is_empty()).then(|| Tensor::cat(&value_parts, 0));
        Ok((Tensor::cat(&logprob_parts, 0), values))
    };
    tch::no_grad(|| if base { model.without_adapters(pass) } else { pass() })
}

/// Rows of unequal length as a zero-padded `[B, width]` f32 tensor.
fn padded(rows: &[Vec<f32>], width: usize, device: Device) -> Tensor {
    let mut flat = vec![0f32; rows.len() * width];
    for (i, row) in rows.iter().enumerate() {
        flat[i * width..i * width + row.len()].copy_from_slice(row);
    }
    Tensor::from_slice(&flat).view([rows.len() as i64, width as i64]).to_device(device)
}

fn row_sums(values: &Tensor, mask: &Tensor) -> Vec<f64> {
    let sums =
        (values.to_kind(Kind::Double) * mask.to_kind(Kind::Double)).sum_dim_intlist(-1, false, Kind::Double);
    Vec::<f64>::try_from(sums.to_device(Device::Cpu)).unwrap_or_default()
}

fn row_means(values: &Tensor, mask: &Tensor) -> Vec<f64> {
    let counts = mask.to_kind(Kind::Double).sum_dim_intlist(-1, false, Kind::Double).clamp_min(1.0);
    let sums =
        (values.to_kind(Kind::Double) * mask.to_kind(Kind::Double)).sum_dim_intlist(-1, false, Kind::Double);
    Vec::<f64>::try_from((sums / counts).to_device(Device::Cpu)).unwrap_or_default()
}

fn masked_mean(values: &Tensor, mask: &Tensor) -> f64 {
    let mask = mask.to_kind(Kind::Double);
    let count = mask.sum(Kind::Double).double_value(&[]);
    if count == 0.0 {
        0.0
    } else {
        (values.to_kind(Kind::Double) * &mask).sum(Kind::Double).double_value(&[]) / count
    }
}

/// The k3 estimate of KL(policy ‖ reference) per token (Schulman), averaged over tokens.
fn k3_mean(logprobs: &Tensor, ref_logprobs: &Tensor, mask: &Tensor) -> f64 {
    let delta = ref_logprobs.to_kind(Kind::Double) - logprobs.to_kind(Kind::Double);
    masked_mean(&(delta.exp() - &delta - 1.0), mask)
}

fn mean_std(values: &[f64]) -> (f64, f64) {
    if values.is_empty() {
        return (0.0, 0.0);
    }
    let mean = values.iter().sum::<f64>() / values.len() as f64;
    let var = values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / values.len() as f64;
    (mean, var.sqrt())
}

/// Each verifier component's mean over the scored completions.
fn component_means(scored: &[Scored]) -> BTreeMap<String, f64> {
    let mut sums: BTreeMap<&str, (f64, usize)> = BTreeMap::new();
    for item in scored {
        for (name, value) in &item.components {
            let entry = sums.entry(name).or_default();
            entry.0 += value;
            entry.1 += 1;
        }
    }
    sums.into_iter().map(|(name, (sum, n))| (name.to_owned(), sum / n as f64)).collect()
}

fn latency(scored: &[Scored]) -> Latency {
    let mut latencies: Vec<u64> = scored.iter().flat_map(|s| s.latencies_us.iter().copied()).collect();
    latencies.sort_unstable();
    let pick = |q: f64| latencies.get(((latencies.len() as f64 - 1.0) * q).round() as usize).copied();
    Latency { p50: pick(0.5), p99: pick(0.99) }
}

pub(crate) fn add_update_metrics(
    line: &mut MetricsLine,
    metrics: &BTreeMap<String, f64>,
    update: &UpdateResult,
) {
    line.loss = Some(update.loss);
    line.micro_batches = Some(update.micro_batches);
    line.grad_norm = Some(update.grad_norm);
    line.lr = Some(update.lr);
    // JSON has no NaN: a figure that is not finite is written as null.
    line.optimizer
        .extend(metrics.iter().map(|(name, value)| (name.clone(), Some(*value).filter(|v| v.is_finite()))));
}

fn finish_name(finish: Finish) -> &'static str {
    match finish {
        Finish::Eos => "eos",
        Finish::Stop => "stop",
        Finish::Length => "length",
    }
}

/// One human line per step on stderr: step k of N, reward, held-out, KL, tokens/s, ETA.
pub fn log_progress(line: &MetricsLine, max_steps: u64, eta_s: Option<f64>) {
    info!(
        reward = line.reward_mean,
        loss = line.loss,
        heldout = line.heldout.as_ref().map(|heldout| heldout.accuracy),
        kl = line.kl_ref,
        tokens_per_s = line.time.as_ref().and_then(|time| time.generation_tokens_per_s),
        eta_s = eta_s.map(f64::round),
        "step {}/{max_steps}",
        line.step
    );
}

/// The prompts' token ids, each rendered with the tokenizer's chat template; an error names the
/// record (`prompt ID: …`, `held-out ID: …`).
pub(crate) fn encode_prompts<'a>(
    tokenizer: &rlvr_model::Tokenizer,
    prompts: impl IntoIterator<Item = &'a PromptRecord>,
    what: &str,
) -> Result<Vec<Vec<i64>>, String> {
    prompts
        .into_iter()
        .map(|prompt| {
            let rendered =
                tokenizer.render_prompt(&prompt.prompt).map_err(|e| format!("{what} {}: {e}", prompt.id))?;
            tokenizer.encode(&rendered).map_err(|e| format!("{what} {}: {e}", prompt.id))
        })
        .collect()
}

/// Step `step`'s learning rate (1-based): `[optimizer] lr` on its schedule and warm-up.
pub(crate) fn learning_rate_at(job: &Job, step: u64) -> f64 {
    super::optim::learning_rate(
        job.spec.optimizer.lr,
        job.spec.optimizer.lr_schedule,
        job.spec.optimizer.warmup_steps,
        step - 1,
        job.spec.budget.max_steps,
    )
}

/// Clips the gradients summed over the step's micro-batches and takes the update at `lr`; a
/// norm that is not finite takes none (the step fails instead). Returns the norm before clipping.
pub(crate) fn clip_and_update(job: &mut Job, lr: f64) -> Result<f64, String> {
    let grad_norm = job.adamw.clip_grad_norm(job.spec.optimizer.grad_clip);
    if !grad_norm.is_finite() {
        return Err(format!("the gradient norm is {grad_norm}; no update taken"));
    }
    job.adamw.step(lr);
    Ok(grad_norm)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rows(values: &[&[f32]]) -> Tensor {
        let width = values.iter().map(|row| row.len()).max().unwrap_or(0);
        padded(&values.iter().map(|row| row.to_vec()).collect::<Vec<_>>(), width, Device::Cpu)
    }

    /// The gap's figures over the mask's tokens only, the weights capped and zero on padding:
    /// (old, sampler, mask, cap) → (mean |d|, max |d|, weight mean, capped fraction).
    #[test]
    fn the_sampler_gap_counts_the_masks_tokens_and_caps_the_weights() {
        let ln3 = 3f32.ln();
        type Rows<'a> = &'a [&'a [f32]];
        let cases: &[(Rows, Rows, Rows, f64, [f64; 4])] = &[
            // Synced: no gap, every weight 1.
            (&[&[-1.0, -2.0]], &[&[-1.0, -2.0]], &[&[1.0, 1.0]], 2.0, [0.0, 0.0, 1.0, 0.0]),
            // One token 3× likelier under the trainer: its weight capped at 2; padding ignored
            // however far apart its values are.
            (
                &[&[-1.0 + ln3, -2.0], &[-1.0, 50.0]],
                &[&[-1.0, -2.0], &[-1.0, -50.0]],
                &[&[1.0, 1.0], &[1.0, 0.0]],
                2.0,
                [ln3 as f64 / 3.0, ln3 as f64, 4.0 / 3.0, 1.0 / 3.0],
            ),
            // Cap 0: the gap measured, the weights off.
            (&[&[-1.0 + ln3]], &[&[-1.0]], &[&[1.0]], 0.0, [ln3 as f64, ln3 as f64, 1.0, 0.0]),
            // Nothing masked in: zeros, not NaN.
            (&[&[-1.0]], &[&[-3.0]], &[&[0.0]], 2.0, [0.0, 0.0, 0.0, 0.0]),
        ];
        for (i, &(old, sampler, mask, cap, expected)) in cases.iter().enumerate() {
            let (gap, weights) = sampler_gap(&rows(old), &rows(sampler), &rows(mask), cap);
            let got = [gap.mean_abs, gap.max_abs, gap.importance_weight_mean, gap.importance_capped_frac];
            for (g, e) in got.iter().zip(expected) {
                assert!((g - e).abs() < 1e-5, "case {i}: got {got:?}, expected {expected:?}");
            }
            assert!(gap.k3 >= 0.0 && gap.k3.is_finite(), "case {i}: k3 {}", gap.k3);
            assert_eq!(weights.is_some(), cap > 0.0, "case {i}");
            if let Some(weights) = weights {
                let outside: Tensor = rows(mask).to_kind(Kind::Double).neg() + 1.0;
                let masked_out = (weights * outside).abs().sum(Kind::Double);
                assert_eq!(masked_out.double_value(&[]), 0.0, "case {i}: weight on padding");
            }
        }
    }

    /// Per-token and per-row advantages both take the per-token weights.
    #[test]
    fn importance_weights_scale_per_token_and_per_row_advantages() {
        let weights = rows(&[&[0.5, 2.0], &[1.0, 0.0]]).to_kind(Kind::Double);
        let per_token = importance_weighted(&rows(&[&[1.0, 1.0], &[-2.0, -2.0]]), &weights);
        let per_row = importance_weighted(&Tensor::from_slice(&[1.0f32, -2.0]), &weights);
        let expected = vec![0.5f32, 2.0, -2.0, 0.0];
        for weighted in [per_token, per_row] {
            assert_eq!(weighted.size(), vec![2, 2]);
            assert_eq!(Vec::<f32>::try_from(weighted.flatten(0, -1)).unwrap(), expected);
        }
    }
}
