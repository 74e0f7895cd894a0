//! Training a reward model (an optimizer whose `trains` is `reward-model`, e.g. `rm`): its step,
//! its held-out score and the gates' evaluation.
//!
//! A step takes the next `rollout.prompts_per_step` preference pairs, scores each pair's two
//! exchanges (`RewardModel::encode_exchange`: what the `reward-model` grader scores later) with
//! grad, micro-batch by micro-batch with pairs kept whole, and hands the plugin the scores as
//! `[B, 1]` with a mask of ones and each pair's margin in `returns` (plugin-api's `LossInputs`);
//! then AdamW as for a policy. One score per sequence: no chunked logits, no activation
//! checkpointing, no reference, no sampling.
//!
//! The held-out score is pairwise accuracy: the fraction of held-out pairs whose chosen
//! completion the model scores above the rejected one (ties count as wrong), the same figure the
//! gates compare with the baseline's — the starting model with its fresh head, or the line's
//! published reward model.

use std::time::Instant;

use rlvr_model::RewardModel;
use rlvr_model::reward::load_reward_model;
use rlvr_plugin_api::{LossInputs, LossScale, RResult, TensorHandle};
use rlvr_plugin_tensor::TensorHandleExt;
use rlvr_protocol::grants::Phase;
use rlvr_protocol::worker::{
    Baseline, BaselineKind, CanaryRegressions, GateEvaluation, MetricsLine, ModelScores, StepTimes, Trend,
};
use tch::{Kind, Tensor};

use crate::Job;
use crate::TrainData;
use crate::Work;
use crate::eval::HeldoutScore;
use crate::grants::Grant;
use crate::step::{StepError, StepOutput, UpdateResult, add_update_metrics};
use rlvr_protocol::records::PairRecord;

/// Rows scored at once when scoring without grad (held-out, the gates).
const SCORE_BATCH: usize = rlvr_protocol::memory::EVAL_BATCH as usize;

/// Each pair's two rows, chosen then rejected, as the reward model's tokens.
fn encode_pairs(model: &RewardModel, pairs: &[&PairRecord], what: &str) -> Result<Vec<Vec<i64>>, String> {
    let mut rows = Vec::with_capacity(2 * pairs.len());
    for pair in pairs {
        for completion in [&pair.chosen, &pair.rejected] {
            let ids = model
                .encode_exchange(&pair.prompt, completion)
                .map_err(|error| format!("{what} {}: {error}", pair.id))?;
            if ids.is_empty() {
                return Err(format!("{what} {}: the exchange has no tokens", pair.id));
            }
            rows.push(ids);
        }
    }
    Ok(rows)
}

/// One training step of a reward model; `update_grant` holds the devices for it.
pub fn step(job: &mut Job, step: u64, update_grant: Grant) -> Result<StepOutput, StepError> {
    let started = Instant::now();
    let TrainData::Pairs(records) = &job.train else {
        return Err(StepError::Failed("a reward model trains on preference pairs".into()));
    };
    let Work::RewardModel { model, .. } = &job.work else {
        return Err(StepError::Failed("not a reward model's job".into()));
    };
    let count = job.spec.rollout.prompts_per_step as usize;
    let picked: Vec<&PairRecord> =
        job.cursor.take(count, records.len(), job.spec.job.seed).into_iter().map(|i| &records[i]).collect();
    let rows = encode_pairs(model, &picked, "record")?;
    let margins: Vec<f32> = picked.iter().flat_map(|pair| [pair.margin as f32; 2]).collect();
    let lengths: Vec<(usize, usize)> = rows.iter().map(|row| (0, row.len())).collect();
    let micro_batches = crate::micro_batches::split(
        &lengths,
        crate::micro_batches::Limits {
            rows: job.spec.optimizer.micro_batch_size as usize,
            tokens: job.spec.optimizer.micro_batch_tokens,
            unit: 2,
        },
    );
    let total = rows.len();
    let scale = LossScale {
        batch_sequences: total as u64,
        batch_tokens: total as u64,
        max_new_tokens: job.spec.rollout.max_new_tokens,
    };
    let lr = crate::step::learning_rate_at(job, step);
    let device = job.device;
    let mut metric_sums = std::collections::BTreeMap::<String, f64>::new();
    let mut loss_total = 0.0;
    job.adamw.zero_grad();
    for range in micro_batches.iter().cloned() {
        let batch: Vec<&[i64]> = rows[range.clone()].iter().map(Vec::as_slice).collect();
        let logits = model.training_logits(&batch).map_err(|error| format!("reward model pass: {error}"))?;
        // One label: its logit is the score.
        let scores = logits.narrow(1, 0, 1);
        let n = batch.len() as i64;
        let mask = Tensor::ones([n, 1], (Kind::Float, device));
        let margin = Tensor::from_slice(&margins[range.clone()]).view([n, 1]).to_device(device);
        let inputs = LossInputs {
            logprobs: TensorHandle::borrow(&scores),
            mask: TensorHandle::borrow(&mask),
            old_logprobs: None.into(),
            ref_logprobs: None.into(),
            advantages: None.into(),
            values: None.into(),
            old_values: None.into(),
            returns: Some(TensorHandle::borrow(&margin)).into(),
            scale,
        };
        let output = match job.optimizer.loss(&inputs) {
            RResult::ROk(output) => output,
            RResult::RErr(error) => return Err(format!("optimizer loss: {error}").into()),
        };
        // SAFETY: the loss is handed over by the plugin (LossOutput contract).
        let loss = unsafe { output.loss.into_tensor() };
        let value = loss.double_value(&[]);
        if !value.is_finite() {
            return Err(format!("the loss is {value} (rows {}..{})", range.start, range.end).into());
        }
        // No chunked logits to recompute: the loss's backward reaches every weight.
        job.adamw.backward(&loss, || {});
        loss_total += value;
        let weight = range.len() as f64 / total as f64;
        for metric in output.metrics.iter() {
            *metric_sums.entry(format!("opt.{}", metric.name)).or_default() += metric.value * weight;
        }
    }
    let grad_norm = crate::step::clip_and_update(job, lr)?;
    update_grant.release(device);
    let update = UpdateResult {
        metrics: metric_sums,
        loss: loss_total,
        grad_norm,
        lr,
        policy_sums: Vec::new(),
        first_logprobs: Vec::new(),
        micro_batches: micro_batches.len(),
    };
    let tokens: u64 = rows.iter().map(|row| row.len() as u64).sum();
    let mut line =
        MetricsLine { step, rows: Some(total), train_tokens: Some(tokens), ..MetricsLine::default() };
    add_update_metrics(&mut line, &update.metrics, &update);
    let step_s = started.elapsed().as_secs_f64();
    line.time = Some(StepTimes { update_s: step_s, step_s, ..StepTimes::default() });
    Ok(StepOutput { metrics: line, records: Vec::new(), tokens_generated: 0 })
}

/// The reward model the job trains.
fn reward_model(job: &Job) -> Result<&RewardModel, StepError> {
    match &job.work {
        Work::RewardModel { model, .. } => Ok(model),
        _ => Err(StepError::Failed("not a reward model's job".into())),
    }
}

/// The held-out pairs every evaluation uses: the set, or its first `eval.max_prompts`.
fn heldout_pairs(job: &Job) -> Result<Vec<&PairRecord>, String> {
    let Work::RewardModel { heldout_pairs: Some(pairs), .. } = &job.work else {
        return Err("no held-out set".into());
    };
    let limit = job.spec.eval.max_prompts.map_or(pairs.len(), |m| (m as usize).min(pairs.len()));
    Ok(pairs[..limit].iter().collect())
}

/// `model`'s pairwise accuracy on `pairs` (device work, without grad): per pair, whether the
/// chosen row scores above the rejected one; `reward_mean` is the mean score gap and
/// `completion_len_mean` the mean tokens of a pair's two rows.
fn pairwise(model: &RewardModel, pairs: &[&PairRecord]) -> Result<HeldoutScore, String> {
    let rows = encode_pairs(model, pairs, "held-out pair")?;
    let scores = model.score(&rows, SCORE_BATCH).map_err(|error| format!("held-out scoring: {error}"))?;
    let passed: Vec<bool> = scores.chunks(2).map(|pair| pair[0][0] > pair[1][0]).collect();
    let n = pairs.len().max(1) as f64;
    let gap: f64 = scores.chunks(2).map(|pair| f64::from(pair[0][0]) - f64::from(pair[1][0])).sum();
    let tokens: usize = rows.iter().map(Vec::len).sum();
    Ok(HeldoutScore {
        accuracy: passed.iter().filter(|p| **p).count() as f64 / n,
        reward_mean: gap / n,
        completion_len_mean: tokens as f64 / 2.0 / n,
        prompts: pairs.len(),
        passed,
        verifier_calls: 0,
        verifier_errors: 0,
        verifier_timeouts: 0,
    })
}

/// The reward model's held-out pairwise accuracy, in an eval grant.
pub fn heldout(job: &Job) -> Result<HeldoutScore, StepError> {
    let pairs = heldout_pairs(job)?;
    let model = reward_model(job)?;
    let grant = job.grants.hold(Phase::Eval)?;
    let score = pairwise(model, &pairs)?;
    grant.release(job.device);
    Ok(score)
}

/// The gates' evaluation of a reward model: held-out pairwise accuracy of the candidate and of
/// `baseline` — the published reward model of the line, or the job's start (the spec's model with
/// the head the job started with, drawn from its seed again). No canaries: the fit rules refuse
/// them for a reward model.
pub fn for_gates(job: &Job, baseline: &Baseline, trend: Option<Trend>) -> Result<GateEvaluation, StepError> {
    let pairs = heldout_pairs(job)?;
    let candidate = reward_model(job)?;
    let grant = job.grants.hold(Phase::Eval)?;
    let now = pairwise(candidate, &pairs)?;
    let before = {
        let kind = candidate.kind();
        let model = match baseline.kind {
            BaselineKind::Start => {
                let base = rlvr_model::load(&baseline.model, job.device, kind)
                    .map_err(|error| format!("the gates' baseline {}: {error}", baseline.model))?;
                crate::models::start_reward_model(&base, job.spec.job.seed)
            }
            BaselineKind::Published => {
                load_reward_model(std::path::Path::new(&baseline.model), job.device, kind)
            }
        }
        .map_err(|error| format!("the gates' baseline {}: {error}", baseline.model))?;
        pairwise(&model, &pairs)?
    };
    grant.release(job.device);
    let scores = |score: &HeldoutScore| ModelScores { heldout: Some(score.gate_score()), canaries: None };
    Ok(GateEvaluation {
        baseline: baseline.clone(),
        candidate: scores(&now),
        baseline_scores: scores(&before),
        canary_regressions: CanaryRegressions { count: 0, ids: Vec::new() },
        training: trend,
    })
}
