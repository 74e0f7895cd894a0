//! Where a job's files are: the one owner of the job directory's layout, which the daemon (it
//! writes the spec and reads progress, metrics and logs), the worker (it writes the run) and the
//! curricula refresh (it reads rollouts) all go through.
//!
//! ```text
//! <state_dir>/jobs/<job id>/          JobDir
//!   spec.json                         the spec, written once by the daemon before the first run
//!   worker.log                        the workers' stderr, every run appended
//!   mlflow.json                       with `[tracking]`: the job's MLflow run and what it was sent
//!   run/                              RunDir: the worker's state (`rlvr-worker run --state-dir`)
//!     job.json                        the run's identity: spec hash, pinned plugins, reference
//!     metrics.jsonl                   one `MetricsLine` per step and held-out evaluation
//!     rollouts.jsonl                  one line per completion
//!     progress.json                   the live `Progress`, replaced after every step
//!     tensorboard/                    `events.out.tfevents.*`: metrics.jsonl's lines as scalars,
//!                                     a file per process (`rlvr-tensorboard`)
//!     checkpoints/LATEST              the name of the newest complete checkpoint
//!     checkpoints/step-00000010/      model/ (a loadable HF directory), optimizer state, state.json
//! ```

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use crate::job::MetricsHistory;
use crate::worker::{MetricsLine, Progress};

/// `<state_dir>/jobs`: every job's directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobsDir {
    root: PathBuf,
}

impl JobsDir {
    /// The jobs directory of a daemon whose state directory is `state_dir`.
    pub fn of_state_dir(state_dir: &Path) -> Self {
        JobsDir { root: state_dir.join("jobs") }
    }

    /// The directory itself.
    pub fn path(&self) -> &Path {
        &self.root
    }

    /// Job `id`'s directory (it may not exist yet).
    pub fn job(&self, id: &str) -> JobDir {
        JobDir { root: self.root.join(id) }
    }
}

/// One job's directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobDir {
    root: PathBuf,
}

impl JobDir {
    /// The job directory at `root`.
    pub fn at(root: PathBuf) -> Self {
        JobDir { root }
    }

    /// The directory itself.
    pub fn path(&self) -> &Path {
        &self.root
    }

    /// `spec.json`.
    pub fn spec(&self) -> PathBuf {
        self.root.join("spec.json")
    }

    /// `worker.log`.
    pub fn worker_log(&self) -> PathBuf {
        self.root.join("worker.log")
    }

    /// `mlflow.json`: the daemon's record of the job's MLflow run (`[tracking]`).
    pub fn mlflow(&self) -> PathBuf {
        self.root.join("mlflow.json")
    }

    /// `run/`, the worker's state directory.
    pub fn run(&self) -> RunDir {
        RunDir { root: self.root.join("run") }
    }
}

/// A worker's state directory: one run of one job, resumable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunDir {
    root: PathBuf,
}

impl RunDir {
    /// The state directory at `root` (`rlvr-worker run --state-dir`).
    pub fn at(root: PathBuf) -> Self {
        RunDir { root }
    }

    /// The directory itself.
    pub fn path(&self) -> &Path {
        &self.root
    }

    /// `job.json`.
    pub fn job_record(&self) -> PathBuf {
        self.root.join("job.json")
    }

    /// `metrics.jsonl`.
    pub fn metrics(&self) -> PathBuf {
        self.root.join("metrics.jsonl")
    }

    /// `rollouts.jsonl`.
    pub fn rollouts(&self) -> PathBuf {
        self.root.join("rollouts.jsonl")
    }

    /// `dataset.jsonl`: a rejection-sampling job's accepted rows (`builtin::SampledRow`).
    pub fn dataset(&self) -> PathBuf {
        self.root.join("dataset.jsonl")
    }

    /// `progress.json`.
    pub fn progress(&self) -> PathBuf {
        self.root.join("progress.json")
    }

    /// `tensorboard/`: the run's TensorBoard event files (`tensorboard --logdir` reads them).
    pub fn tensorboard(&self) -> PathBuf {
        self.root.join("tensorboard")
    }

    /// `engine/ray-submission`: the submission id of the Ray job this run's worker submitted
    /// last (an `[engine]` job launched on Ray), written before it is submitted, so that the
    /// daemon can stop the cluster's job once the worker is gone, however it went.
    pub fn ray_submission(&self) -> PathBuf {
        self.root.join("engine").join("ray-submission")
    }

    /// `checkpoints/`.
    pub fn checkpoints(&self) -> PathBuf {
        self.root.join("checkpoints")
    }

    /// `checkpoints/LATEST`.
    pub fn latest_file(&self) -> PathBuf {
        self.checkpoints().join("LATEST")
    }

    /// `checkpoints/step-00000010` for step 10.
    pub fn checkpoint(&self, step: u64) -> PathBuf {
        self.checkpoints().join(checkpoint_name(step))
    }

    /// The newest complete checkpoint, if any.
    pub fn latest_checkpoint(&self) -> io::Result<Option<PathBuf>> {
        match fs::read_to_string(self.latest_file()) {
            Ok(name) => Ok(Some(self.checkpoints().join(name.trim()))),
            Err(error) if error.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(error) => Err(error),
        }
    }

    /// The live progress, when a step has finished.
    pub fn read_progress(&self) -> Option<Progress> {
        serde_json::from_slice(&fs::read(self.progress()).ok()?).ok()
    }

    /// The complete lines of `metrics.jsonl` from byte `since`, as many as fit in `max_bytes` (at
    /// least one line, however long, so a reader always moves on); a `since` past the file's end
    /// (a resume cut the file back) reads from its start. Unreadable lines are skipped, a missing
    /// file is no lines. The file is read a window at a time: a long job's history is never held
    /// whole.
    pub fn read_metrics_window(&self, since: u64, max_bytes: u64) -> io::Result<MetricsHistory> {
        use std::io::{BufRead, BufReader, Seek, SeekFrom};
        let file = match fs::File::open(self.metrics()) {
            Ok(file) => file,
            Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(MetricsHistory::default()),
            Err(error) => return Err(error),
        };
        let size = file.metadata()?.len();
        let start = if since > size { 0 } else { since };
        let mut reader = BufReader::new(file);
        reader.seek(SeekFrom::Start(start))?;
        let (mut lines, mut end, mut line) = (Vec::new(), start, Vec::new());
        while end < size && (end == start || end - start < max_bytes) {
            line.clear();
            let read = reader.read_until(b'\n', &mut line)? as u64;
            // A line still being written is read next time, whole.
            if read == 0 || line.last() != Some(&b'\n') {
                break;
            }
            if end > start && end - start + read > max_bytes {
                break;
            }
            end += read;
            if let Ok(parsed) = serde_json::from_slice(&line) {
                lines.push(parsed);
            }
        }
        Ok(MetricsHistory { lines, start, end, size })
    }

    /// Every complete line of `metrics.jsonl`, in order; an unreadable line is skipped (a newer
    /// worker's, say), a missing file is no lines.
    pub fn read_metrics(&self) -> io::Result<Vec<MetricsLine>> {
        let text = match fs::read_to_string(self.metrics()) {
            Ok(text) => text,
            Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(error) => return Err(error),
        };
        let complete = text.rfind('\n').map_or("", |end| &text[..end]);
        Ok(complete.lines().filter_map(|line| serde_json::from_str(line).ok()).collect())
    }
}

/// `step-00000010` for step 10: names sort by step.
pub fn checkpoint_name(step: u64) -> String {
    format!("step-{step:08}")
}

/// The step of a checkpoint directory (`…/step-00000010` → 10).
pub fn checkpoint_step(path: &Path) -> Option<u64> {
    path.file_name()?.to_str()?.strip_prefix("step-")?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_layout_and_its_readers() {
        let state = tempfile::tempdir().unwrap();
        let job = JobsDir::of_state_dir(state.path()).job("01J");
        assert_eq!(job.spec(), state.path().join("jobs/01J/spec.json"));
        let run = job.run();
        assert_eq!(run.metrics(), state.path().join("jobs/01J/run/metrics.jsonl"));
        assert_eq!(run.tensorboard(), state.path().join("jobs/01J/run/tensorboard"));
        assert_eq!(run.latest_checkpoint().unwrap(), None);
        assert_eq!(run.read_metrics().unwrap(), []);
        fs::create_dir_all(run.checkpoints()).unwrap();
        fs::write(run.latest_file(), checkpoint_name(10)).unwrap();
        let latest = run.latest_checkpoint().unwrap().unwrap();
        assert_eq!(checkpoint_step(&latest), Some(10));
        // The last line is half-written: not read yet.
        fs::write(run.metrics(), "{\"step\": 1, \"loss\": 0.5}\nnot json\n{\"step\": 2, \"lo").unwrap();
        let lines = run.read_metrics().unwrap();
        assert_eq!(lines.len(), 1);
        assert_eq!((lines[0].step, lines[0].loss), (1, Some(0.5)));
    }

    /// `(since, max_bytes)` → the steps read, where the next window starts, the window's start.
    #[test]
    fn metrics_are_read_a_window_of_whole_lines_at_a_time() {
        let state = tempfile::tempdir().unwrap();
        let run = JobsDir::of_state_dir(state.path()).job("01J").run();
        assert_eq!(run.read_metrics_window(0, 100).unwrap(), MetricsHistory::default());
        fs::create_dir_all(run.metrics().parent().unwrap()).unwrap();
        // Three lines of 12 bytes, one unreadable, and one half-written.
        let text = "{\"step\": 1}\n{\"step\": 2}\nnot json!!!\n{\"step\": 3}\n{\"step\": 4";
        fs::write(run.metrics(), text).unwrap();
        type Row = ((u64, u64), (&'static [u64], u64, u64));
        let rows: [Row; 7] = [
            ((0, 1 << 20), (&[1, 2, 3], 48, 0)),
            ((0, 24), (&[1, 2], 24, 0)),
            // One line at least, however small the window.
            ((0, 1), (&[1], 12, 0)),
            ((24, 12), (&[], 36, 24)),
            ((36, 100), (&[3], 48, 36)),
            // At the end, or in the half-written line: nothing yet.
            ((48, 100), (&[], 48, 48)),
            // Past the file's end (it was cut back): from its start.
            ((500, 12), (&[1], 12, 0)),
        ];
        for ((since, max), (steps, end, start)) in rows {
            let window = run.read_metrics_window(since, max).unwrap();
            let got: Vec<u64> = window.lines.iter().map(|line| line.step).collect();
            assert_eq!(
                (got.as_slice(), window.end, window.start),
                (steps, end, start),
                "since {since}, max {max}"
            );
            assert_eq!(window.size, text.len() as u64);
        }
    }
}
