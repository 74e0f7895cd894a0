//! What a run leaves in its state directory (`rlvr_protocol::jobdir::RunDir` has the layout), and
//! how it is written so that a kill at any moment leaves either the old state or the new one,
//! never half of either.
//!
//! A checkpoint (`checkpoints/step-N/`: `model/`, a loadable HF directory (with LoRA, a PEFT
//! adapter directory or the merged model), and for LoRA `adapter/`; `value_head.safetensors`
//! for optimizers with a value head; `optimizer.safetensors`, the AdamW moments and, for bf16
//! weights, their f32 master copy (the model's bf16 weights have lost its low bits); `state.json`,
//! [`TrainState`]) is written under a temporary name, fsynced and renamed; then `LATEST` is
//! replaced atomically. On resume the JSONL files are cut back to the lengths the checkpoint
//! recorded, so lines a killed run wrote after its last checkpoint are written again, identically.
//!
//! Which checkpoints stay is `rlvr_protocol::checkpoints::retained`'s rule (`[checkpoint]
//! keep_best`, `keep_last`), decided before the new checkpoint's `state.json` is written: that
//! file then holds the scores of exactly the checkpoints kept, so a resumed run goes on deciding
//! as an uninterrupted one does. Deletion follows the rename of `LATEST`; a kill in between
//! leaves a checkpoint too many, which the next one removes.
//!
//! A reward model's job writes `model/` with `RewardModel::save_pretrained`.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Seek, Write};
use std::path::{Path, PathBuf};

use std::collections::BTreeSet;

use rlvr_model::weights::{WeightFiles, write_safetensors};
use rlvr_model::{SamplerRng, save_adapter, save_pretrained};
use rlvr_protocol::checkpoints::{ScoredCheckpoint, retained};
use rlvr_protocol::fs::{naming, write_atomic, write_json_atomic};
use rlvr_protocol::jobdir::{RunDir, checkpoint_name, checkpoint_step};
use rlvr_protocol::runtime::RunPlatform;
use serde::{Deserialize, Serialize};
use tch::{Tensor, nn};
use tracing::info;

use crate::Work;
use crate::data::Cursor;
use crate::{Job, WorkerError};

/// The run's identity, written once when it starts (`job.json`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobRecord {
    /// SHA-256 of the spec file's bytes: a resume must use the same spec.
    pub spec_sha256: String,
    /// The spec as parsed, for readers of the state dir.
    pub spec: rlvr_protocol::spec::JobSpec,
    /// `name@version` of the optimizer, the verifiers (job order) and the curriculum.
    pub optimizer: String,
    pub verifiers: Vec<String>,
    pub curriculum: Option<String>,
    /// Where the reference came from and the SHA-256 of its weights.
    pub reference: Option<String>,
    /// libtorch CPU threads of the run (see `WorkerOptions::threads`).
    pub threads: usize,
    /// The device and libraries the run started on; a resume on others is warned about. Absent
    /// in runs started before it was recorded.
    #[serde(default)]
    pub platform: Option<RunPlatform>,
}

impl JobRecord {
    /// The record of an earlier run, if the run has started.
    pub fn read(run: &RunDir) -> io::Result<Option<JobRecord>> {
        match fs::read(run.job_record()) {
            Ok(bytes) => serde_json::from_slice(&bytes).map(Some).map_err(io::Error::other),
            Err(error) if error.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(error) => Err(error),
        }
    }

    /// Creates the run: its checkpoints directory and `job.json`.
    pub fn create(&self, run: &RunDir) -> io::Result<()> {
        fs::create_dir_all(run.checkpoints())?;
        write_json_atomic(&run.job_record(), self)
    }

    /// The pinned `name@version`s, in the order of [`TrainState::plugins`].
    pub fn plugin_ids(&self) -> Vec<String> {
        std::iter::once(self.optimizer.clone())
            .chain(self.verifiers.iter().cloned())
            .chain(self.curriculum.clone())
            .collect()
    }
}

/// Everything besides tensors that a checkpoint restores (`state.json`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TrainState {
    /// Steps completed.
    pub step: u64,
    /// AdamW updates taken (μ per step).
    pub optimizer_updates: i64,
    /// The sampler's RNG.
    pub sampler_rng: Option<SamplerRng>,
    /// Where the training data order stands.
    pub cursor: Cursor,
    /// The curriculum plugin's own state.
    pub curriculum: Option<String>,
    /// Completion tokens generated so far.
    pub tokens_generated: u64,
    /// Wall-clock seconds spent so far, over every run of the job.
    pub elapsed_s: f64,
    /// Held-out accuracy before the first step, for comparisons.
    pub heldout_baseline: Option<f64>,
    /// Byte lengths of metrics.jsonl and rollouts.jsonl at this checkpoint.
    pub metrics_bytes: u64,
    pub rollouts_bytes: u64,
    /// A rejection-sampling job's: `dataset.jsonl`'s byte length, and the tally of what it
    /// sampled and kept, at this checkpoint.
    #[serde(default)]
    pub dataset_bytes: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sampled: Option<rlvr_protocol::builtin::SampledDataset>,
    /// `name@version`s, as in job.json (a check on resume).
    pub plugins: Vec<String>,
    /// The held-out scores of the retained checkpoints scored so far (this one's included when
    /// it was scored): what retention and the gates' candidate are chosen from. Absent in
    /// checkpoints written before it.
    #[serde(default)]
    pub scored: Vec<ScoredCheckpoint>,
}

impl TrainState {
    /// The state of the checkpoint at `checkpoint`.
    pub fn read(checkpoint: &Path) -> Result<TrainState, String> {
        let path = checkpoint.join("state.json");
        fs::read(&path)
            .map_err(|error| error.to_string())
            .and_then(|bytes| serde_json::from_slice(&bytes).map_err(|error| error.to_string()))
            .map_err(|message| format!("{}: {message}", path.display()))
    }
}

/// Restores the tensors and generators of `checkpoint` into `job` (the models were loaded from
/// it already): the optimizer's moments and master weights, the sampler's RNG, the curriculum's
/// state.
pub fn restore(job: &mut Job, checkpoint: &Path, saved: &TrainState) -> Result<(), WorkerError> {
    let fail = |message: String| WorkerError::State { path: checkpoint.to_owned(), message };
    // A rejection-sampling checkpoint holds no weights and no optimizer state: none changed.
    if !matches!(job.work, Work::RejectionSampling(_)) {
        // Mapped, and read tensor by tensor into the optimizer's own state.
        let tensors = WeightFiles::open_file(&checkpoint.join("optimizer.safetensors"))
            .map_err(|error| fail(format!("optimizer.safetensors: {error}")))?;
        job.adamw
            .load_state(&tensors, saved.optimizer_updates)
            .map_err(|message| fail(format!("optimizer.safetensors: {message}")))?;
    }
    job.rng = saved.sampler_rng.clone().ok_or_else(|| fail("state.json has no sampler_rng".into()))?;
    job.cursor = saved.cursor;
    if let (Some(curriculum), Some(saved)) = (&mut job.curriculum, &saved.curriculum) {
        curriculum
            .load_state(saved.as_str().into())
            .into_result()
            .map_err(|error| fail(format!("curriculum state: {error}")))?;
    }
    Ok(())
}

/// The run's two logs.
pub struct Logs {
    /// `metrics.jsonl`.
    pub metrics: JsonlLog,
    /// `rollouts.jsonl`.
    pub rollouts: JsonlLog,
}

impl Logs {
    /// Opens both logs, cut back to the lengths `state` recorded.
    pub fn open(run: &RunDir, state: &TrainState) -> Result<Logs, String> {
        Ok(Logs {
            metrics: JsonlLog::open(&run.metrics(), state.metrics_bytes)
                .map_err(|error| format!("metrics.jsonl: {error}"))?,
            rollouts: JsonlLog::open(&run.rollouts(), state.rollouts_bytes)
                .map_err(|error| format!("rollouts.jsonl: {error}"))?,
        })
    }
}

/// Writes a checkpoint of `job` at `state.step` (recording the logs' lengths); returns its
/// directory.
pub fn write_checkpoint(
    job: &Job,
    run: &RunDir,
    state: &mut TrainState,
    logs: &mut Logs,
) -> Result<PathBuf, WorkerError> {
    let fail = |message: String| WorkerError::State {
        path: run.path().to_owned(),
        message: format!("checkpoint: {message}"),
    };
    let staging = staging(run, state.step).map_err(|error| fail(error.to_string()))?;
    let written = stage_and_commit(job, run, state, logs, &staging, fail);
    if written.is_err() {
        // A full disk or a read-only directory leaves no half checkpoint, and frees what it took.
        let _ = fs::remove_dir_all(&staging);
    }
    written
}

/// [`write_checkpoint`]'s work once `staging` exists: fill it, then commit it.
fn stage_and_commit(
    job: &Job,
    run: &RunDir,
    state: &mut TrainState,
    logs: &mut Logs,
    staging: &Path,
    fail: impl Fn(String) -> WorkerError,
) -> Result<PathBuf, WorkerError> {
    // A rejection-sampling job changes no weight: its checkpoint is its state.json.
    if !matches!(job.work, Work::RejectionSampling(_)) {
        write_model(job, staging).map_err(|error| fail(error.to_string()))?;
        if let Some((vs, _)) = &job.value_head {
            save_sorted(vs, &staging.join("value_head.safetensors")).map_err(&fail)?;
        }
        let optimizer = staging.join("optimizer.safetensors");
        write_safetensors(&optimizer, &job.adamw.state_tensors()).map_err(|error| fail(error.to_string()))?;
    }
    state.optimizer_updates = job.adamw.steps();
    state.sampler_rng = Some(job.rng.clone());
    state.cursor = job.cursor;
    state.curriculum = match &job.curriculum {
        Some(curriculum) => Some(
            curriculum
                .save_state()
                .into_result()
                .map_err(|error| fail(format!("curriculum: {error}")))?
                .into(),
        ),
        None => None,
    };
    state.metrics_bytes = logs.metrics.synced_len().map_err(|error| fail(error.to_string()))?;
    state.rollouts_bytes = logs.rollouts.synced_len().map_err(|error| fail(error.to_string()))?;
    let mut on_disk = complete_checkpoints(run).map_err(|error| fail(error.to_string()))?;
    on_disk.push(state.step);
    let keep = retained(&on_disk, &state.scored, state.step, job.spec.checkpoint.retention());
    state.scored.retain(|scored| keep.contains(&scored.step));
    if let Some(rejection) = job.rejection() {
        state.sampled = Some(rejection.tally.clone());
    }
    let bytes = serde_json::to_vec_pretty(&state).map_err(|error| fail(error.to_string()))?;
    let state_file = staging.join("state.json");
    fs::write(&state_file, bytes).map_err(|error| fail(naming(&state_file)(error).to_string()))?;
    let path = commit(run, staging, state.step, &keep).map_err(|error| fail(error.to_string()))?;
    info!(step = state.step, path = %path.display(), "checkpoint written");
    Ok(path)
}

/// The checkpoint's models: `model/`, what is published (the policy's weights, or a reward
/// model's sequence-classification checkpoint; with LoRA its
/// PEFT adapter directory over the spec's base, or with `[publish] merge_lora` the base with the
/// adapters merged), and for LoRA `adapter/`, what a resume attaches to the base.
fn write_model(job: &Job, staging: &Path) -> Result<(), rlvr_model::ModelError> {
    let model = staging.join("model");
    // A reward model's job publishes its sequence-classification directory.
    if let Work::RewardModel { model: reward_model, .. } = &job.work {
        return reward_model.save_pretrained(&model);
    }
    if job.policy.adapters.is_none() {
        return save_pretrained(&job.policy, &model);
    }
    let base = &job.spec.model.policy;
    save_adapter(&job.policy, base, &staging.join(crate::models::ADAPTER_DIR))?;
    if job.spec.publish.as_ref().is_some_and(|publish| publish.merge_lora) {
        save_pretrained(&job.policy, &model)
    } else {
        save_adapter(&job.policy, base, &model)
    }
}

/// Writes a VarStore's tensors (names sorted) to a safetensors file.
fn save_sorted(vs: &nn::VarStore, path: &Path) -> Result<(), String> {
    let mut named: Vec<(String, Tensor)> = vs.variables().into_iter().collect();
    named.sort_by(|a, b| a.0.cmp(&b.0));
    write_safetensors(path, &named).map_err(|error| error.to_string())
}

/// A fresh temporary directory inside checkpoints/ to write step `step`'s checkpoint into.
fn staging(run: &RunDir, step: u64) -> io::Result<PathBuf> {
    let path = run.checkpoints().join(format!(".staging-{}-{}", checkpoint_name(step), std::process::id()));
    if path.exists() {
        fs::remove_dir_all(&path)?;
    }
    fs::create_dir_all(&path)?;
    Ok(path)
}

/// The steps of the complete checkpoints in `checkpoints/`.
fn complete_checkpoints(run: &RunDir) -> io::Result<Vec<u64>> {
    let mut steps = Vec::new();
    for entry in fs::read_dir(run.checkpoints())? {
        if let Some(step) = checkpoint_step(&entry?.path()) {
            steps.push(step);
        }
    }
    Ok(steps)
}

/// Makes `checkpoints/step-N` from a filled staging directory, points LATEST at it and removes
/// the checkpoints not in `keep`.
fn commit(run: &RunDir, staging: &Path, step: u64, keep: &BTreeSet<u64>) -> io::Result<PathBuf> {
    let name = checkpoint_name(step);
    let target = run.checkpoint(step);
    sync_tree(staging).map_err(naming(staging))?;
    if target.exists() {
        // A run killed between this rename and LATEST's left it; it is not referenced.
        fs::remove_dir_all(&target).map_err(naming(&target))?;
    }
    fs::rename(staging, &target).map_err(naming(&target))?;
    let latest = run.latest_file();
    write_atomic(&latest, name.as_bytes()).map_err(naming(&latest))?;
    prune(run, keep)?;
    Ok(target)
}

/// Removes the checkpoints not in `keep` (LATEST's always is), and staging directories a killed
/// run left.
fn prune(run: &RunDir, keep: &BTreeSet<u64>) -> io::Result<()> {
    for entry in fs::read_dir(run.checkpoints())? {
        let path = entry?.path();
        let name = path.file_name().map(|name| name.to_string_lossy().into_owned()).unwrap_or_default();
        match checkpoint_step(&path) {
            Some(step) if !keep.contains(&step) => fs::remove_dir_all(&path)?,
            Some(_) => {}
            None if name.starts_with(".staging-") => fs::remove_dir_all(&path)?,
            None => {}
        }
    }
    Ok(())
}

/// fsyncs every file under `dir` and the directories themselves.
fn sync_tree(dir: &Path) -> io::Result<()> {
    for entry in fs::read_dir(dir)? {
        let entry = entry?;
        if entry.file_type()?.is_dir() {
            sync_tree(&entry.path())?;
        } else {
            File::open(entry.path())?.sync_all()?;
        }
    }
    rlvr_protocol::fs::sync_dir(dir)
}

/// An append-only JSONL file whose length is known, so a checkpoint can record it.
pub struct JsonlLog {
    file: File,
    bytes: u64,
}

impl JsonlLog {
    /// Opens `path` for appending, first cutting it to `keep` bytes (the length a checkpoint
    /// recorded; 0 for a fresh run).
    pub fn open(path: &Path, keep: u64) -> io::Result<JsonlLog> {
        let file = OpenOptions::new().create(true).read(true).write(true).truncate(false).open(path)?;
        let length = file.metadata()?.len();
        if length < keep {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{} has {length} bytes, fewer than the checkpoint recorded ({keep})", path.display()),
            ));
        }
        file.set_len(keep)?;
        let mut log = JsonlLog { file, bytes: keep };
        log.file.sync_all()?;
        log.file.seek(io::SeekFrom::End(0))?;
        Ok(log)
    }

    /// Appends one line.
    pub fn append<T: Serialize>(&mut self, value: &T) -> io::Result<()> {
        let mut line = serde_json::to_vec(value).map_err(io::Error::other)?;
        line.push(b'\n');
        self.file.write_all(&line)?;
        self.bytes += line.len() as u64;
        Ok(())
    }

    /// Bytes written so far, after an fsync (what a checkpoint records).
    pub fn synced_len(&mut self) -> io::Result<u64> {
        self.file.sync_data()?;
        Ok(self.bytes)
    }
}
