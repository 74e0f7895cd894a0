//! The built-in `distill` optimizer (`rlvr_protocol::builtin::DistillOptions`): the student
//! (`model.policy`) learns from a teacher (`optimizer.teacher`) that shares its tokenizer. Each
//! step samples `optimizer.group_size` completions of the next `rollout.prompts_per_step`
//! prompts and takes one AdamW step on them:
//! - `traces`: the teacher samples, the student is trained on them by SFT (token-mean negative
//!   log-likelihood);
//! - `forward_kl`: the teacher samples (forward KL is an expectation under the teacher), and the
//!   loss is τ²·KL(teacher_τ ‖ student_τ) per token over the whole vocabulary (Hinton et al.
//!   2015; GKD's supervised KD, arXiv:2306.13649);
//! - `reverse_kl`: the student samples (on-policy), and the loss is τ²·KL(student_τ ‖ teacher_τ)
//!   per token (GKD with λ = 1; MiniLLM, arXiv:2306.08543, whose sequence-level policy gradient
//!   this token-level form leaves out, as GKD does).
//!
//! The KL never holds a batch's logits: `rlvr_model::logprobs::training_kl` computes the
//! teacher's and the student's logits a chunk of positions at a time, forward and backward.
//! Nothing is graded in a step (no reward is read); the held-out scoring and the gates are any
//! job's.
//!
//! The teacher is loaded frozen on the student's device and in its dtype.

use std::time::Instant;

use rlvr_model::logprobs::{KlDirection, training_kl, training_logprobs};
use rlvr_model::sample::{Sampled, generate};
use rlvr_protocol::builtin::{DistillMode, DistillOptions};
use rlvr_protocol::grants::Phase;
use rlvr_protocol::worker::{MetricsLine, StepTimes};
use tch::Kind;

use crate::Work;
use crate::grants::Grant;
use crate::step::{
    Rows, StepError, StepOutput, clip_and_update, dropout_seed, encode_prompts, learning_rate_at,
};
use crate::{Job, TrainData, WorkerError};

/// Loads the teacher on the student's device and in its dtype, frozen, and checks that it reads
/// the student's tokens (the daemon compared their files at submit; this compares what loaded).
pub fn load_teacher(
    options: &DistillOptions,
    student: &rlvr_model::LoadedModel,
) -> Result<rlvr_model::LoadedModel, WorkerError> {
    let field = "optimizer.teacher";
    let kind = student.vs.variables().values().next().map_or(Kind::Float, tch::Tensor::kind);
    let mut teacher = rlvr_model::load(&options.teacher, student.vs.device(), kind)
        .map_err(|error| WorkerError::Plugin { field: field.into(), message: error.to_string() })?;
    teacher.merge_adapters();
    teacher.vs.freeze();
    let (a, b) = (&student.tokenizer, &teacher.tokenizer);
    if a.vocab_size() != b.vocab_size() || a.eos_ids() != b.eos_ids() || a.pad_id() != b.pad_id() {
        return Err(WorkerError::Plugin {
            field: field.into(),
            message: format!(
                "the teacher's tokenizer differs from model.policy's: {} tokens against {}",
                b.vocab_size(),
                a.vocab_size()
            ),
        });
    }
    Ok(teacher)
}

/// One distillation step; `grant` holds the rollout's devices.
pub fn step(job: &mut Job, step: u64, grant: Grant) -> Result<StepOutput, StepError> {
    let started = Instant::now();
    let Work::Distill { options, teacher } = &job.work else {
        return Err(StepError::Failed("not a distillation job".into()));
    };
    // Read after the update, which borrows the whole job.
    let mode = options.mode;
    let TrainData::Prompts(prompts) = &job.train else {
        return Err(StepError::Failed("a distillation job trains on prompts".into()));
    };
    let count = job.spec.rollout.prompts_per_step as usize;
    let group_size = job.spec.optimizer.group_size as usize;
    let picked: Vec<usize> = job.cursor.take(count, prompts.len(), job.spec.job.seed);
    let tokenizer = &job.policy.tokenizer;
    let prompt_tokens = encode_prompts(tokenizer, picked.iter().map(|&index| &prompts[index]), "prompt")?;
    let sampler = match options.mode {
        DistillMode::Traces | DistillMode::ForwardKl => &teacher.model,
        DistillMode::ReverseKl => &job.policy.model,
    };
    let rollout_started = Instant::now();
    let sampled: Vec<Sampled> = tch::no_grad(|| {
        generate(sampler, tokenizer, &prompt_tokens, group_size, &job.sampling, &mut job.rng)
    })
    .map_err(|error| format!("sampling: {error}"))?;
    let rollout_s = rollout_started.elapsed().as_secs_f64();
    grant.release(job.device);

    let update_grant = job.grants.hold(Phase::Update)?;
    let update_started = Instant::now();
    let rows = Rows {
        prompts: sampled.iter().map(|s| prompt_tokens[s.prompt_index].clone()).collect(),
        completions: sampled.iter().map(|s| s.tokens.clone()).collect(),
    };
    let tokens: u64 = rows.completions.iter().map(|c| c.len() as u64).sum();
    let lr = learning_rate_at(job, step);
    let tau = options.temperature;
    // The loss is a token mean over the whole step: each micro-batch's sum over this count, so
    // the micro-batches' gradients add up to one pass over the batch.
    let denominator = tokens.max(1) as f64;
    let mut loss_total = 0.0;
    let mut per_token = 0.0;
    job.adamw.zero_grad();
    for range in rows.micro_batches(job) {
        let start = range.start;
        let batch = rows.batch(range, job.policy.tokenizer.pad_id(), job.device)?;
        job.policy.model.set_training(Some(dropout_seed(job.spec.job.seed, step, 0, start)));
        let loss = match options.mode {
            DistillMode::Traces => {
                let pass = training_logprobs(&job.policy.model, &batch, 1.0);
                job.policy.model.set_training(None);
                let nll = -(pass.logprobs() * batch.mask()).sum(Kind::Float);
                per_token += nll.double_value(&[]);
                let loss = nll / denominator;
                job.adamw.backward(&loss, || pass.backward());
                loss
            }
            DistillMode::ForwardKl | DistillMode::ReverseKl => {
                let direction = if options.mode == DistillMode::ForwardKl {
                    KlDirection::Forward
                } else {
                    KlDirection::Reverse
                };
                let pass = training_kl(&job.policy.model, &teacher.model, &batch, tau, direction);
                job.policy.model.set_training(None);
                let kl = pass.kl().sum(Kind::Float);
                per_token += kl.double_value(&[]);
                // τ² keeps the gradients' size as τ changes (Hinton et al. 2015 §2).
                let loss = kl * (tau * tau / denominator);
                job.adamw.backward(&loss, || pass.backward());
                loss
            }
        };
        let value = loss.double_value(&[]);
        if !value.is_finite() {
            return Err(StepError::Failed(format!("the loss is {value} (rows from {start})")));
        }
        loss_total += value;
    }
    let grad_norm = clip_and_update(job, lr)?;
    update_grant.release(job.device);
    let update_s = update_started.elapsed().as_secs_f64();

    let lengths: Vec<f64> = sampled.iter().map(|s| s.tokens.len() as f64).collect();
    let n = lengths.len().max(1) as f64;
    let mut figures = std::collections::BTreeMap::new();
    // Per token, before this step's update: the KL (at τ, unscaled) or the NLL of the traces.
    let name = match mode {
        DistillMode::Traces => "distill.nll",
        DistillMode::ForwardKl | DistillMode::ReverseKl => "distill.kl",
    };
    figures.insert(name.to_owned(), Some(per_token / denominator));
    let metrics = MetricsLine {
        step,
        loss: Some(loss_total),
        grad_norm: Some(grad_norm),
        lr: Some(lr),
        rows: Some(rows.completions.len()),
        train_tokens: Some(tokens),
        tokens_generated: Some(tokens),
        completion_len_mean: Some(lengths.iter().sum::<f64>() / n),
        completion_len_max: Some(lengths.iter().copied().fold(0.0, f64::max)),
        time: Some(StepTimes {
            rollout_s: Some(rollout_s),
            verify_s: None,
            update_s,
            sync_s: None,
            step_s: started.elapsed().as_secs_f64(),
            generation_tokens_per_s: Some(tokens as f64 / rollout_s.max(1e-9)),
            verifier_latency_us: None,
        }),
        optimizer: figures,
        ..MetricsLine::default()
    };
    Ok(StepOutput { metrics, records: Vec::new(), tokens_generated: tokens })
}
