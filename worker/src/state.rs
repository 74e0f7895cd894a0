//! What a run leaves in its state directory, and how it is written so a kill at any moment leaves
//! either the old state or the new one, never half of either.
//!
//! ```text
//! STATE_DIR/
//!   job.json                 the spec as started, pinned plugin name@versions, reference identity
//!   metrics.jsonl            one line per step (and per held-out evaluation)
//!   rollouts.jsonl           one line per completion
//!   checkpoints/LATEST       the name of the newest complete checkpoint
//!   checkpoints/step-00000010/
//!       model/               config.json, model.safetensors, tokenizer.json: a loadable HF dir
//!       value_head.safetensors   (optimizers with a value head)
//!       optimizer.safetensors    AdamW moments
//!       state.json           step, RNG, data cursor, curriculum, byte lengths of the JSONL files
//! ```
//! A checkpoint is written under a temporary name, fsynced and renamed; then `LATEST` is replaced
//! the same way. On resume the JSONL files are cut back to the lengths the checkpoint recorded, so
//! lines a killed run wrote after its last checkpoint are written again, identically.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::data::Cursor;

/// How many complete checkpoints stay on disk; older ones are removed after a new one lands.
pub const KEEP_CHECKPOINTS: usize = 2;

/// The run's identity, written once when it starts.
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
}

/// Everything besides tensors that a checkpoint restores.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrainState {
    /// Steps completed.
    pub step: u64,
    /// AdamW updates taken (μ per step).
    pub optimizer_updates: i64,
    /// The sampler's RNG.
    pub sampler_rng: serde_json::Value,
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
    /// `name@version`s, as in job.json (a check on resume).
    pub plugins: Vec<String>,
}

/// Paths of one run.
#[derive(Debug, Clone)]
pub struct StateDir {
    pub root: PathBuf,
}

impl StateDir {
    pub fn job(&self) -> PathBuf {
        self.root.join("job.json")
    }
    pub fn metrics(&self) -> PathBuf {
        self.root.join("metrics.jsonl")
    }
    pub fn rollouts(&self) -> PathBuf {
        self.root.join("rollouts.jsonl")
    }
    pub fn checkpoints(&self) -> PathBuf {
        self.root.join("checkpoints")
    }

    /// The newest complete checkpoint, if any.
    pub fn latest(&self) -> io::Result<Option<PathBuf>> {
        match fs::read_to_string(self.checkpoints().join("LATEST")) {
            Ok(name) => Ok(Some(self.checkpoints().join(name.trim()))),
            Err(error) if error.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(error) => Err(error),
        }
    }

    /// Reads job.json, if the run has started.
    pub fn read_job(&self) -> io::Result<Option<JobRecord>> {
        match fs::read(self.job()) {
            Ok(bytes) => serde_json::from_slice(&bytes).map(Some).map_err(io::Error::other),
            Err(error) if error.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(error) => Err(error),
        }
    }

    /// Writes job.json atomically.
    pub fn write_job(&self, job: &JobRecord) -> io::Result<()> {
        fs::create_dir_all(&self.root)?;
        write_atomic(&self.job(), &serde_json::to_vec_pretty(job).map_err(io::Error::other)?)
    }

    /// The step of a checkpoint directory (`step-00000010` → 10).
    pub fn checkpoint_step(path: &Path) -> Option<u64> {
        path.file_name()?.to_str()?.strip_prefix("step-")?.parse().ok()
    }

    /// Makes `checkpoints/step-N` from a directory the caller filled (see [`StateDir::staging`]),
    /// points LATEST at it and removes checkpoints beyond [`KEEP_CHECKPOINTS`].
    pub fn commit_checkpoint(&self, staging: &Path, step: u64) -> io::Result<PathBuf> {
        let name = format!("step-{step:08}");
        let target = self.checkpoints().join(&name);
        sync_tree(staging)?;
        if target.exists() {
            // A run killed between this rename and LATEST's left it; it is not referenced.
            fs::remove_dir_all(&target)?;
        }
        fs::rename(staging, &target)?;
        write_atomic(&self.checkpoints().join("LATEST"), name.as_bytes())?;
        self.prune(&name)?;
        Ok(target)
    }

    /// A fresh temporary directory inside checkpoints/ to write a checkpoint into.
    pub fn staging(&self, step: u64) -> io::Result<PathBuf> {
        let path = self.checkpoints().join(format!(".staging-step-{step:08}-{}", std::process::id()));
        if path.exists() {
            fs::remove_dir_all(&path)?;
        }
        fs::create_dir_all(&path)?;
        Ok(path)
    }

    fn prune(&self, latest: &str) -> io::Result<()> {
        let mut complete = Vec::new();
        for entry in fs::read_dir(self.checkpoints())? {
            let name = entry?.file_name().to_string_lossy().into_owned();
            if name.starts_with("step-") {
                complete.push(name);
            } else if name.starts_with(".staging-") {
                // Left by a killed run.
                fs::remove_dir_all(self.checkpoints().join(&name))?;
            }
        }
        complete.sort();
        let keep_from = complete.len().saturating_sub(KEEP_CHECKPOINTS);
        for name in &complete[..keep_from] {
            if name != latest {
                fs::remove_dir_all(self.checkpoints().join(name))?;
            }
        }
        Ok(())
    }
}

/// Writes `bytes` to `path` through a temporary file, fsync and rename.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let parent = path.parent().unwrap_or(Path::new("."));
    let temp = parent.join(format!(
        ".{}.tmp-{}",
        path.file_name().map(|n| n.to_string_lossy()).unwrap_or_default(),
        std::process::id()
    ));
    {
        let mut file = File::create(&temp)?;
        file.write_all(bytes)?;
        file.sync_all()?;
    }
    fs::rename(&temp, path)?;
    File::open(parent)?.sync_all()
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
    File::open(dir)?.sync_all()
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
        use std::io::Seek;
        log.file.seek(io::SeekFrom::End(0))?;
        Ok(log)
    }

    /// Appends one line.
    pub fn append(&mut self, value: &serde_json::Value) -> io::Result<()> {
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
