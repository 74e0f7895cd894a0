//! The built-in `rejection-sampling` optimizer (`rlvr_protocol::builtin`): each step samples
//! `optimizer.group_size` completions of the next prompts of `data.train` (one pass, in the
//! seeded epoch order), scores them with the job's graders — the reward training uses, reward
//! models included — and appends the best `keep` accepted, distinct completions of each prompt to
//! `run/dataset.jsonl`. No weight changes, so a checkpoint holds no model: the prompt cursor, the
//! sampler's generator, the tally and the output file's length (cut back on resume, as
//! `metrics.jsonl` is), so a killed job resumes without losing or repeating a row.
//!
//! Best-of-N (Touvron et al. 2023, Llama 2 §3.2.3 "Rejection Sampling"; the R1 recipe's
//! rejection-sampling stage, DeepSeek-AI 2025 §2.3.3): keep the highest-reward samples of each
//! prompt that clear a threshold, deduplicated.

use std::collections::{BTreeMap, HashSet};
use std::path::Path;
use std::time::Instant;

use rlvr_plugin_api::{
    AdvantageInputs, AdvantageOutput, DataMode, LossInputs, LossOutput, OptimizerBox, OptimizerInfo,
    PluginError, PluginErrorKind, RResult,
};
use rlvr_protocol::builtin::{RejectionSamplingOptions, SampledDataset, SampledRow};
use rlvr_protocol::worker::{MetricsLine, StepTimes};

use crate::Work;
use crate::grants::Grant;
use crate::state::JsonlLog;
use crate::step::{StepError, StepOutput, sample_round};
use crate::{Job, TrainData, WorkerError};

/// The `optimizer` of a rejection-sampling job: the step loop never asks it for a loss (the
/// job's steps are [`step`]'s). It exists so the job's record and plugins read as any job's.
struct NoUpdate;

impl rlvr_plugin_api::Optimizer for NoUpdate {
    fn uses_reference(&self) -> bool {
        false
    }

    fn advantages(&self, _: &AdvantageInputs<'_>) -> RResult<AdvantageOutput, PluginError> {
        RResult::RErr(no_update())
    }

    fn loss(&self, _: &LossInputs) -> RResult<LossOutput, PluginError> {
        RResult::RErr(no_update())
    }
}

fn no_update() -> PluginError {
    PluginError::new(PluginErrorKind::Internal, "rejection-sampling updates no weights")
}

/// The stand-in optimizer and what it needs: prompts with references, no reference model.
pub fn builtin_optimizer() -> (OptimizerBox, OptimizerInfo) {
    use rlvr_plugin_api::abi_stable::sabi_trait::TD_Opaque;
    let optimizer = rlvr_plugin_api::Optimizer_TO::from_value(NoUpdate, TD_Opaque);
    let info = OptimizerInfo {
        data_mode: DataMode::OnlineGroups,
        needs_reference: false,
        needs_value_head: false,
        needs_groups: false,
        libtorch_version: rlvr_plugin_api::LIBTORCH_VERSION.into(),
    };
    (optimizer, info)
}

/// A rejection-sampling run's own state: its keys, the output file, the rows written so far (by
/// prompt and text, for deduplication) and the tally.
pub struct Rejection {
    pub options: RejectionSamplingOptions,
    log: JsonlLog,
    seen: HashSet<(String, String)>,
    pub tally: SampledDataset,
}

impl Rejection {
    /// Opens `dataset.jsonl` in `run_dir` cut back to `keep` bytes (the checkpoint's length; 0
    /// fresh) and reads back the rows it keeps; `tally` is the checkpoint's.
    pub fn open(
        options: RejectionSamplingOptions,
        path: &Path,
        keep: u64,
        tally: Option<SampledDataset>,
    ) -> Result<Rejection, WorkerError> {
        let fail = |message: String| WorkerError::State {
            path: path.to_owned(),
            message: format!("dataset: {message}"),
        };
        let log = JsonlLog::open(path, keep).map_err(|error| fail(error.to_string()))?;
        let mut seen = HashSet::new();
        let text = std::fs::read_to_string(path).map_err(|error| fail(error.to_string()))?;
        for line in text.lines() {
            let row: SampledRow = serde_json::from_str(line).map_err(|error| fail(error.to_string()))?;
            seen.insert((row.prompt_id, row.completion));
        }
        let tally = tally.unwrap_or_default();
        if tally.accepted != seen.len() as u64 {
            return Err(fail(format!(
                "holds {} rows where the checkpoint counted {}",
                seen.len(),
                tally.accepted
            )));
        }
        Ok(Rejection { options, log, seen, tally })
    }

    /// Bytes written so far, after an fsync: what a checkpoint records.
    pub fn synced_len(&mut self) -> std::io::Result<u64> {
        self.log.synced_len()
    }

    /// What the run produced, for its `Outcome`.
    pub fn produced(&self) -> SampledDataset {
        self.tally.clone()
    }
}

/// The prompts not sampled yet (one pass over `data.train`).
fn remaining(job: &Job) -> usize {
    let TrainData::Prompts(prompts) = &job.train else { return 0 };
    if job.cursor.epoch > 0 { 0 } else { prompts.len().saturating_sub(job.cursor.index as usize) }
}

/// Whether every prompt has been sampled.
pub fn done(job: &Job) -> bool {
    matches!(job.work, Work::RejectionSampling(_)) && remaining(job) == 0
}

/// One step: the next `rollout.prompts_per_step` prompts (fewer at the end of the pass), G
/// completions each, scored; the accepted rows appended.
pub fn step(job: &mut Job, step: u64, grant: Grant) -> Result<StepOutput, StepError> {
    let started = Instant::now();
    let count = (job.spec.rollout.prompts_per_step as usize).min(remaining(job));
    if count == 0 {
        grant.release(job.device);
        return Ok(StepOutput {
            metrics: MetricsLine { step, ..MetricsLine::default() },
            records: Vec::new(),
            tokens_generated: 0,
        });
    }
    let round = sample_round(job, step, 0, count, grant)?;
    let group_size = job.spec.optimizer.group_size as usize;
    let Work::RejectionSampling(rejection) = &mut job.work else {
        return Err(StepError::Failed("not a rejection-sampling job".into()));
    };
    let keep = rejection.options.keep as usize;
    let mut rows = Vec::new();
    let mut duplicates = 0u64;
    let mut prompts_accepted = 0u64;
    for (group, prompt) in round.picked.iter().enumerate() {
        let members = group * group_size..(group + 1) * group_size;
        // An empty completion teaches SFT nothing, and the SFT data loader refuses one: the
        // dataset this job publishes must be one a later SFT job can train on.
        let mut accepted: Vec<usize> = members
            .filter(|&i| !round.sampled[i].text.trim().is_empty())
            .filter(|&i| rejection.options.accepts(round.scored[i].reward, round.scored[i].passed))
            .collect();
        // Best reward first; ties keep the sampling order (stable), so a run is reproducible.
        accepted.sort_by(|&a, &b| round.scored[b].reward.total_cmp(&round.scored[a].reward));
        let mut kept = 0;
        for i in accepted {
            if kept == keep {
                break;
            }
            let text = &round.sampled[i].text;
            if !rejection.seen.insert((prompt.id.clone(), text.clone())) {
                duplicates += 1;
                continue;
            }
            rows.push(SampledRow {
                id: format!("{}-{kept}", prompt.id),
                prompt: prompt.prompt.clone(),
                completion: text.clone(),
                reward: round.scored[i].reward,
                prompt_id: prompt.id.clone(),
            });
            kept += 1;
        }
        prompts_accepted += u64::from(kept > 0);
    }
    for row in &rows {
        rejection.log.append(row).map_err(|error| format!("dataset.jsonl: {error}"))?;
    }
    let rewards: Vec<f64> = round.scored.iter().map(|s| s.reward).collect();
    let tally = &mut rejection.tally;
    tally.prompts += round.picked.len() as u64;
    tally.completions += round.scored.len() as u64;
    tally.accepted += rows.len() as u64;
    tally.prompts_accepted += prompts_accepted;
    tally.duplicates += duplicates;
    tally.reward_sum += rows.iter().map(|row| row.reward).sum::<f64>();
    tally.all_reward_sum += rewards.iter().sum::<f64>();

    let tokens: u64 = round.sampled.iter().map(|s| s.tokens.len() as u64).sum();
    let lengths: Vec<f64> = round.sampled.iter().map(|s| s.tokens.len() as f64).collect();
    let n = rewards.len().max(1) as f64;
    let mean = rewards.iter().sum::<f64>() / n;
    let std = (rewards.iter().map(|r| (r - mean).powi(2)).sum::<f64>() / n).sqrt();
    let mut figures = BTreeMap::new();
    figures.insert("rs.rows".to_owned(), Some(rows.len() as f64));
    figures.insert("rs.prompts_accepted".to_owned(), Some(prompts_accepted as f64));
    figures.insert("rs.duplicates".to_owned(), Some(duplicates as f64));
    figures.insert("rs.rows_total".to_owned(), Some(tally.accepted as f64));
    let metrics = MetricsLine {
        step,
        reward_mean: Some(mean),
        reward_std: Some(std),
        passed_frac: Some(round.scored.iter().filter(|s| s.passed).count() as f64 / n),
        completion_len_mean: Some(lengths.iter().sum::<f64>() / n),
        completion_len_max: Some(lengths.iter().copied().fold(0.0, f64::max)),
        tokens_generated: Some(tokens),
        verified: Some(round.scored.len()),
        verifier_timeouts: Some(round.scored.iter().map(|s| u64::from(s.timeouts)).sum()),
        verifier_errors: Some(round.scored.iter().filter(|s| !s.errors.is_empty()).count()),
        rows: Some(rows.len()),
        time: Some(StepTimes {
            rollout_s: Some(round.rollout_s),
            verify_s: Some(round.verify_s),
            update_s: 0.0,
            sync_s: None,
            step_s: started.elapsed().as_secs_f64(),
            generation_tokens_per_s: Some(tokens as f64 / round.rollout_s.max(1e-9)),
            verifier_latency_us: None,
        }),
        optimizer: figures,
        ..MetricsLine::default()
    };
    Ok(StepOutput { metrics, records: Vec::new(), tokens_generated: tokens })
}
