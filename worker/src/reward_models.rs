//! The built-in `reward-model` graders: learned reward models (Hugging Face sequence
//! classification, `rlvr_model::reward`) scored on the job's devices, batched, in their own grant
//! phase ([`Phase::Reward`]), while the plugin graders verify on the CPU. Their verdicts join the
//! plugins' in the spec's order and go through the one combiner (`rlvr_plugin_host::reward`), so
//! a formula or a weighted sum reads a reward model's score as any grader's.
//!
//! The text scored is the prompt followed by the completion: the user and assistant messages of
//! the reward model's chat template when its tokenizer has one, else `prompt + completion`
//! (`RewardModel::encode_exchange`). A row longer than `max_length` keeps its last `max_length`
//! tokens — the completion's end, where the model reads its score — and its verdict's component
//! `truncated` is 1 (else 0).
//!
//! They are loaded on the policy's device and in its dtype, and scored in one `Phase::Reward`
//! grant per step before the plugin graders run on the CPU; `rlvr_plugin_host::reward::Combiner`
//! folds all the verdicts in the spec's order.

use std::path::Path;
use std::time::Instant;

use rlvr_model::load_reward_model;
use rlvr_model::reward::RewardModel;
use rlvr_plugin_host::reward::{Scored, ToScore};
use rlvr_plugin_host::verify::{Components, OutputLine};
use rlvr_protocol::grants::Phase;
use rlvr_protocol::reward_model::{PLUGIN, RewardModelOptions, is_reward_model};
use rlvr_protocol::spec::JobSpec;
use tch::{Device, Kind};

use crate::Job;
use crate::WorkerError;
use crate::episodes::{EpisodeRow, env_verdicts};
use crate::step::StepError;

/// One reward-model grader of the job.
pub struct RewardModelGrader {
    /// Its index in `[[verifiers]]`.
    pub index: usize,
    pub options: RewardModelOptions,
    pub model: RewardModel,
    /// The logit that is its score.
    label: usize,
}

/// The job's reward-model graders, in the spec's order (empty when it has none).
#[derive(Default)]
pub struct RewardModels {
    pub graders: Vec<RewardModelGrader>,
}

impl RewardModels {
    /// Loads every `reward-model` grader of `spec` onto `device` in `kind` (the policy's), its
    /// `model` the directory the daemon resolved it to.
    pub fn load(spec: &JobSpec, device: Device, kind: Kind) -> Result<RewardModels, WorkerError> {
        let mut graders = Vec::new();
        for (index, section) in spec.verifiers.iter().enumerate() {
            if !is_reward_model(section) {
                continue;
            }
            let prefix = format!("verifiers[{index}].");
            let options = RewardModelOptions::from_section(section, &prefix)
                .map_err(|error| WorkerError::Plugin { field: error.field, message: error.message })?;
            let field = |key: &str| format!("{prefix}{key}");
            let model = load_reward_model(Path::new(&options.model), device, kind)
                .map_err(|error| WorkerError::Plugin { field: field("model"), message: error.to_string() })?;
            let label = match (&options.label, model.num_labels()) {
                (None, 1) => 0,
                (None, n) => {
                    return Err(WorkerError::Plugin {
                        field: field("label"),
                        message: format!(
                            "the model has {n} labels ({}): say which is the score",
                            model.labels().join(", ")
                        ),
                    });
                }
                (Some(label), _) => model.label_id(label).ok_or_else(|| WorkerError::Plugin {
                    field: field("label"),
                    message: format!(
                        "{label:?} is not one of the model's labels: {}",
                        model.labels().join(", ")
                    ),
                })?,
            };
            tracing::info!(
                grader = index,
                labels = model.num_labels(),
                params = model.num_parameters(),
                "reward model loaded"
            );
            graders.push(RewardModelGrader { index, options, model, label });
        }
        Ok(RewardModels { graders })
    }

    /// Whether the job has any.
    pub fn is_empty(&self) -> bool {
        self.graders.is_empty()
    }
}

impl RewardModelGrader {
    /// This grader's verdict on each item (device work: the caller holds the grant).
    fn verdicts(&self, items: &[ToScore<'_>]) -> Vec<OutputLine> {
        let started = Instant::now();
        let max = self.options.max_length as usize;
        let mut rows = Vec::with_capacity(items.len());
        let mut truncated = Vec::with_capacity(items.len());
        let mut errors: Vec<Option<String>> = Vec::with_capacity(items.len());
        for item in items {
            match self.model.encode_exchange(item.prompt, item.completion) {
                Ok(mut ids) => {
                    let cut = ids.len() > max;
                    if cut {
                        ids.drain(..ids.len() - max);
                    }
                    truncated.push(cut);
                    errors.push(if ids.is_empty() {
                        Some("nothing to score: no tokens".into())
                    } else {
                        None
                    });
                    rows.push(ids);
                }
                Err(error) => {
                    truncated.push(false);
                    errors.push(Some(error.to_string()));
                    rows.push(Vec::new());
                }
            }
        }
        // Rows that failed to encode are left out of the batch, not scored as empty.
        let scorable: Vec<usize> = (0..items.len()).filter(|&i| errors[i].is_none()).collect();
        let batch: Vec<Vec<i64>> = scorable.iter().map(|&i| std::mem::take(&mut rows[i])).collect();
        let mut logits = vec![None; items.len()];
        match self.model.score(&batch, self.options.batch_size as usize) {
            Ok(scores) => {
                for (&i, row) in scorable.iter().zip(scores) {
                    logits[i] = row.get(self.label).copied();
                }
            }
            Err(error) => {
                for &i in &scorable {
                    errors[i] = Some(error.to_string());
                }
            }
        }
        let per_item_us = (started.elapsed().as_micros() as u64) / (items.len().max(1) as u64);
        items
            .iter()
            .enumerate()
            .map(|(i, item)| {
                let logit = logits[i].map(f64::from);
                let score = logit.map_or(0.0, |l| self.options.normalized(l));
                // Always both, so a step's mean of `truncated` is the fraction of rows cut (a
                // component only on cut rows would average to 1 whenever any was).
                let components = vec![
                    ("logit".to_owned(), logit.unwrap_or(0.0)),
                    ("truncated".to_owned(), if truncated[i] { 1.0 } else { 0.0 }),
                ];
                OutputLine {
                    id: Some(item.id.to_owned()),
                    score,
                    passed: logit.is_some() && self.options.passes(score),
                    components: Components(components),
                    extracted: None,
                    error: errors[i].clone().or_else(|| logit.is_none().then(|| "no score".to_owned())),
                    timed_out: false,
                    latency_us: per_item_us,
                    verifier: PLUGIN.to_owned(),
                    explanation: None,
                }
            })
            .collect()
    }
}

/// Every item scored by every grader of the job: the reward models on the devices in one
/// [`Phase::Reward`] grant (none asked when the job has no reward model), then the plugins on
/// the CPU; their verdicts combined in the spec's order, then (a job with `[env]`) each episode's
/// environment reward, `episodes[i]` item i's.
pub fn score(
    job: &Job,
    items: &[ToScore<'_>],
    episodes: Option<&[EpisodeRow]>,
) -> Result<Vec<Scored>, StepError> {
    let mut model_lines = Vec::with_capacity(job.reward_models.graders.len());
    if !job.reward_models.is_empty() && !items.is_empty() {
        let grant = job.grants.hold(Phase::Reward)?;
        for grader in &job.reward_models.graders {
            model_lines.push((grader.index, grader.verdicts(items)));
        }
        grant.release(job.device);
    }
    let mut plugin_lines = job.rewarder.verdicts(items).into_iter();
    let mut model_lines = model_lines.into_iter().peekable();
    let graders = job.spec.verifiers.len();
    let mut per_grader = Vec::with_capacity(graders + 1);
    for index in 0..graders {
        match model_lines.next_if(|(at, _)| *at == index) {
            Some((_, lines)) => per_grader.push(lines),
            None => per_grader.push(plugin_lines.next().ok_or_else(|| {
                StepError::Failed(format!(
                    "verifiers[{index}]: no grader answered (the job's graders are not its spec's)"
                ))
            })?),
        }
    }
    match (job.spec.env_term(), episodes) {
        (None, None) => {}
        (Some(term), Some(rows)) if rows.len() == items.len() => per_grader.push(env_verdicts(term, rows)),
        (_, rows) => {
            return Err(StepError::Failed(format!(
                "{} items with {} episodes for a job {} [env]",
                items.len(),
                rows.map_or(0, <[_]>::len),
                if job.spec.env.is_some() { "with" } else { "without" }
            )));
        }
    }
    Ok(job.rewarder.combiner.combine(per_grader, items.len()))
}
