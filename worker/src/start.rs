//! What a run starts from: the spec, and what an earlier run of the job left (its record, its
//! newest checkpoint's state). A resume must use the same spec; nothing is written here.

use std::path::PathBuf;

use rlvr_protocol::jobdir::RunDir;
use rlvr_protocol::spec::JobSpec;
use sha2::{Digest, Sha256};
use tracing::warn;

use crate::state::{JobRecord, TrainState};
use crate::{WorkerError, WorkerOptions};

/// The spec and the run's past.
pub struct Start {
    /// The spec, parsed.
    pub spec: JobSpec,
    /// SHA-256 of the spec file's bytes: a resume must use the same file.
    pub spec_sha256: String,
    /// The record of an earlier run in the state directory, if any: its pinned plugins.
    pub previous: Option<JobRecord>,
    /// The newest checkpoint to resume from (only with `--resume`).
    pub checkpoint: Option<PathBuf>,
    /// That checkpoint's state.
    pub saved: Option<TrainState>,
}

impl Start {
    /// Reads the spec and the state directory's past, refusing a resume that cannot be one.
    pub fn read(options: &WorkerOptions, run: &RunDir) -> Result<Start, WorkerError> {
        let spec_error = |message: String| WorkerError::Spec { path: options.spec.clone(), message };
        let spec_bytes =
            std::fs::read(&options.spec).map_err(|error| spec_error(format!("cannot read: {error}")))?;
        let spec_text = std::str::from_utf8(&spec_bytes).map_err(|_| spec_error("not UTF-8".into()))?;
        let spec = JobSpec::parse_file_text(&options.spec, spec_text)
            .map_err(|errors| spec_error(errors.to_string()))?;
        let spec_sha256 = hex::encode(Sha256::digest(&spec_bytes));
        let state_error = |message: String| WorkerError::State { path: options.state_dir.clone(), message };

        let previous =
            JobRecord::read(run).map_err(|error| state_error(format!("cannot read job.json: {error}")))?;
        if let Some(previous) = &previous {
            if !options.resume {
                return Err(state_error(
                    "holds a run already; pass --resume to continue it, or use an empty directory".into(),
                ));
            }
            if previous.spec_sha256 != spec_sha256 {
                return Err(state_error(format!(
                    "the run there started from a different spec (sha256 {}); resume with the same file",
                    previous.spec_sha256
                )));
            }
            if previous.threads != options.threads {
                warn!(
                    started_with = previous.threads,
                    now = options.threads,
                    "resuming with another thread count: CPU results will differ from an uninterrupted run in the last bits"
                );
            }
        }
        let checkpoint = if options.resume {
            run.latest_checkpoint()
                .map_err(|error| state_error(format!("cannot read checkpoints/LATEST: {error}")))?
        } else {
            None
        };
        let saved = checkpoint.as_deref().map(TrainState::read).transpose().map_err(state_error)?;
        Ok(Start { spec, spec_sha256, previous, checkpoint, saved })
    }
}
