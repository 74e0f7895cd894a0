//! A job's life: its states, which changes are allowed, and the wire types the API and `rlvrctl`
//! share (design.md §1).
//!
//! ```text
//! queued → admitted → running(step k of N) → evaluating → published | refused
//!    ↑         │            │      │
//!    └─ preempted ←─────────┘      └→ failed | cancelled      (and queued → cancelled, …)
//! ```
//! Everything here is pure; `store` applies it to Redis atomically.
//!
//! [`JobOutput`] is what a job published, as data: a line version (with its directory) or a team
//! dataset (`JobView.output`).

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::gates::GateReport;
use crate::worker::{MetricsLine, Outcome, Progress};

/// Where a job is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "lowercase")]
pub enum JobState {
    /// Accepted and waiting for a daemon to take it.
    Queued,
    /// Taken by a daemon and given its devices; the worker is starting.
    Admitted,
    /// The worker is training (`step` of `max_steps`).
    Running,
    /// Training ended; the candidate is being gated.
    Evaluating,
    /// Passed its gates; the checkpoint is in the registry.
    Published,
    /// Trained, but its gates refused the checkpoint.
    Refused,
    /// Could not run or go on; `reason` says why.
    Failed,
    /// Cancelled by its team or an admin.
    Cancelled,
    /// Stopped at a checkpoint to make room (or because the daemon stopped); goes back to `queued`.
    Preempted,
}

impl JobState {
    /// Every state, in life order.
    pub const ALL: [JobState; 9] = [
        JobState::Queued,
        JobState::Admitted,
        JobState::Running,
        JobState::Evaluating,
        JobState::Published,
        JobState::Refused,
        JobState::Failed,
        JobState::Cancelled,
        JobState::Preempted,
    ];

    /// The name on the wire and in Redis.
    pub fn as_str(self) -> &'static str {
        match self {
            JobState::Queued => "queued",
            JobState::Admitted => "admitted",
            JobState::Running => "running",
            JobState::Evaluating => "evaluating",
            JobState::Published => "published",
            JobState::Refused => "refused",
            JobState::Failed => "failed",
            JobState::Cancelled => "cancelled",
            JobState::Preempted => "preempted",
        }
    }

    /// An end: nothing happens to the job any more.
    pub fn is_terminal(self) -> bool {
        matches!(self, JobState::Published | JobState::Refused | JobState::Failed | JobState::Cancelled)
    }

    /// Whether a daemon holds the job (it has, or is about to have, a worker).
    pub fn is_active(self) -> bool {
        matches!(self, JobState::Admitted | JobState::Running | JobState::Evaluating)
    }

    /// The states a job may come from to enter `self`. The store refuses any other change, so two
    /// daemons (or a daemon and a cancel) racing on one job cannot both win.
    pub fn allowed_from(self) -> &'static [JobState] {
        use JobState::*;
        match self {
            Queued => &[Preempted, Admitted, Running],
            Admitted => &[Queued],
            Running => &[Admitted, Running],
            Evaluating => &[Running],
            // Refused → published: an admin's forced promotion.
            Published => &[Evaluating, Refused],
            Refused => &[Evaluating],
            Failed => &[Queued, Admitted, Running, Evaluating, Preempted],
            Cancelled => &[Queued, Admitted, Running, Evaluating, Preempted],
            Preempted => &[Admitted, Running],
        }
    }
}

impl fmt::Display for JobState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for JobState {
    type Err = String;
    fn from_str(text: &str) -> Result<Self, String> {
        JobState::ALL.into_iter().find(|state| state.as_str() == text).ok_or_else(|| {
            format!("expected one of {}, got {text:?}", JobState::ALL.map(JobState::as_str).join(", "))
        })
    }
}

/// A job as the API shows it (`GET /v1/jobs/{id}`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct JobView {
    pub id: String,
    pub team: String,
    pub name: String,
    pub model_line: String,
    /// What kind of job it is, decided at submit; absent from jobs submitted before the daemon
    /// recorded it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<crate::kind::JobKind>,
    pub priority: crate::spec::Priority,
    pub state: JobState,
    /// Steps done.
    pub step: u64,
    pub max_steps: u64,
    /// Why it is in this state (empty when nothing needs saying).
    pub reason: String,
    /// RFC 3339.
    pub created_at: String,
    /// RFC 3339, the last change of state or progress.
    pub updated_at: String,
    /// Times a worker of this job died without ending it (dead-lettered at the daemon's limit).
    pub crashes: u32,
    /// A cancel was asked for and the daemon is stopping the worker.
    pub cancel_requested: bool,
    /// The devices it was last admitted to (`cuda:0`, `cpu:0`); current while it is admitted,
    /// running or evaluating.
    #[serde(default)]
    pub devices: Vec<String>,
    /// Times it was preempted to make room for another job.
    #[serde(default)]
    pub preemptions: u32,
    /// Its worker's device grant now (`holding rollout`, `waiting for update (0.4 s)`), when the
    /// daemon answering runs it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grant: Option<String>,
    /// The latest step's figures (reward, KL, tokens/s, ETA, …), when training has begun.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub progress: Option<Progress>,
    /// The latest held-out score, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub heldout: Option<f64>,
    /// How training ended (steps, weights hash, held-out before and after, checkpoint).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<Outcome>,
    /// The gate report (design.md §6): `passed`, `baseline`, one line per criterion with its
    /// measured value and threshold, and `forced` when an admin promoted the job.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gates: Option<GateReport>,
    /// What it published: a checkpoint as a version of its model line, or a team dataset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output: Option<JobOutput>,
    /// `output`'s checkpoint directory (for clients that read it before `output` existed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub published: Option<String>,
    /// `output`'s model line and version (for clients that read it before `output` existed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub published_version: Option<LineVersion>,
    /// `output`'s dataset as a later spec names it in `data.train`, `dataset:NAME@SHA256` (for
    /// clients that read it before `output` existed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub published_dataset: Option<String>,
    /// What became of the webhook's delivery of the manifest.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub webhook: Option<String>,
    /// The version of its shared curriculum (`[curriculum] name`) pinned at its first admission;
    /// 0 when the curriculum had no version yet.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub curriculum_version: Option<u64>,
    /// Memory it asks for on each device at its peak, in GB (`[resources] memory_gb`, as its
    /// spec wrote it or submit filled it from its estimate); 0: whole devices.
    #[serde(default)]
    pub memory_gb: f64,
    /// Of that, what it holds between phases (`[resources] resident_gb`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resident_gb: Option<f64>,
}

impl JobView {
    /// Sets what the job published: `output` and the fields that repeat it for older clients.
    pub fn set_output(&mut self, output: Option<JobOutput>) {
        self.published = None;
        self.published_version = None;
        self.published_dataset = None;
        match &output {
            Some(JobOutput::Checkpoint { line, version, path }) => {
                self.published = Some(path.clone());
                self.published_version = Some(LineVersion { line: line.clone(), version: *version });
            }
            Some(dataset @ JobOutput::Dataset { .. }) => {
                self.published_dataset = Some(dataset.handed_on().reference());
            }
            None => {}
        }
        self.output = output;
    }
}

/// A published version of a model line.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct LineVersion {
    pub line: String,
    pub version: u64,
}

/// What a job published, whatever its kind: one field of its record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum JobOutput {
    /// Version `version` of model line `line`, in the directory `path` (a team reads
    /// `registry:/LINE/VERSION`, never the server's path).
    Checkpoint { line: String, version: u64, path: String },
    /// A team dataset (a rejection-sampling job's accepted completions), pinned to its content.
    Dataset { name: String, sha256: String },
}

impl JobOutput {
    /// What a pipeline's next stage takes from it.
    pub fn handed_on(&self) -> crate::pipeline::StageOutput {
        use crate::pipeline::StageOutput;
        match self {
            JobOutput::Checkpoint { line, version, .. } => {
                StageOutput::Checkpoint { line: line.clone(), version: *version }
            }
            JobOutput::Dataset { name, sha256 } => {
                StageOutput::Dataset { name: name.clone(), sha256: sha256.clone() }
            }
        }
    }
}

/// `GET /v1/jobs/{id}/metrics` answer: a window of the job's metrics lines. Follow the history by
/// asking again with `since` = `end` until `end` = `size`; a `start` of 0 after a `since` > 0 means
/// the file was cut back (a resume from an earlier checkpoint) and was read again from its start.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct MetricsHistory {
    /// The lines in order: one per step, and the held-out evaluations.
    #[cfg_attr(feature = "openapi", schema(value_type = Vec<Object>))]
    pub lines: Vec<MetricsLine>,
    /// Byte offset in `metrics.jsonl` where `lines` start.
    #[serde(default)]
    pub start: u64,
    /// Byte offset just past `lines`: where the next window starts.
    #[serde(default)]
    pub end: u64,
    /// The file's length in bytes when it was read.
    #[serde(default)]
    pub size: u64,
}

/// `GET /v1/jobs/{id}/logs` answer: a window of whole lines of the job's worker log (every run's
/// stderr). Follow the log by asking again with `since` = `end`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct JobLog {
    /// Byte offset in the log where `text` starts.
    pub start: u64,
    /// Byte offset just past `text`: where the next window starts.
    pub end: u64,
    /// The log's length in bytes when it was read.
    pub size: u64,
    /// The lines, as UTF-8 (bytes that are not are replaced with U+FFFD).
    pub text: String,
}

/// One change of state, as stored on the job's event stream and sent over server-sent events.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct JobEvent {
    /// The stream entry id (`<ms>-<seq>`); pass it as `Last-Event-ID` to resume.
    pub id: String,
    /// RFC 3339.
    pub at: String,
    pub state: JobState,
    pub reason: String,
    pub step: u64,
}

/// The `Idempotency-Key` header's rule, checked by the daemon and by rlvrctl before it sends one.
pub const IDEMPOTENCY_KEY_RULE: &str = "1 to 200 printable ASCII characters without spaces";

/// Whether `key` follows [`IDEMPOTENCY_KEY_RULE`] (it goes into a header and a Redis key).
pub fn valid_idempotency_key(key: &str) -> bool {
    (1..=200).contains(&key.len()) && key.bytes().all(|byte| byte.is_ascii_graphic())
}

/// `POST /v1/jobs` answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Submitted {
    pub id: String,
    /// `false` when an earlier submit with the same `Idempotency-Key` made the job.
    pub created: bool,
}

/// `POST /v1/estimate` answer: a spec's memory on each of its devices.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Estimate {
    /// What submit would fill `[resources] memory_gb` with: resident plus the largest phase, in
    /// GB rounded up to a tenth.
    pub memory_gb: f64,
    /// And `resident_gb`.
    pub resident_gb: f64,
    /// Why it fits no device of this daemon; `None` when it fits one.
    pub fits: Option<String>,
    /// The parts.
    pub estimate: crate::memory::MemoryEstimate,
}

/// `GET /v1/jobs` answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct JobList {
    /// Newest first.
    pub jobs: Vec<JobView>,
    /// Pass it as `cursor` for the next page; absent when there is none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next: Option<String>,
}

/// Where a page of `GET /v1/jobs` ends: the creation time and id of its last job (ids created in
/// the same millisecond are told apart by id). Sent as `MS.ID`; clients treat it as opaque.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListCursor {
    /// Creation time, ms since the Unix epoch.
    pub created_ms: u64,
    pub id: String,
}

impl fmt::Display for ListCursor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.created_ms, self.id)
    }
}

impl FromStr for ListCursor {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let bad = || format!("{text:?} is not a cursor a job list answered with");
        let (ms, id) = text.split_once('.').ok_or_else(bad)?;
        let created_ms = ms.parse().map_err(|_| bad())?;
        if id.is_empty() || id.len() > 64 || !id.bytes().all(|byte| byte.is_ascii_alphanumeric()) {
            return Err(bad());
        }
        Ok(ListCursor { created_ms, id: id.to_owned() })
    }
}

/// `POST /v1/jobs`' 200 answers: the job an earlier submit with the same `Idempotency-Key` made,
/// or, with `dry_run=true`, the checked spec.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(untagged)]
pub enum SubmitAnswer {
    Submitted(Submitted),
    DryRun(Box<DryRun>),
}

/// `POST /v1/jobs?dry_run=true` answer: the spec checked as a submit checks it, queued nowhere.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct DryRun {
    /// The spec as the job's record would keep it: defaults filled, names pinned, resources
    /// filled from the estimate.
    pub spec: crate::spec::JobSpec,
}

/// Every error of the API: `{"error": {...}}` with a 4xx or 5xx status.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ErrorBody {
    pub error: ApiError,
}

/// What went wrong, and where.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ApiError {
    /// Stable, for programs: `invalid_spec`, `unauthorized`, `not_found`, …
    pub code: String,
    pub message: String,
    /// The field at fault (`rollout.top_p`), when there is one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub field: Option<String>,
    /// Every other problem found at once (a spec with several faults).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub more: Vec<FieldProblem>,
}

/// One more problem of a refused spec.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct FieldProblem {
    pub field: String,
    pub message: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_unknown_names_are_refused_with_the_list() {
        for state in JobState::ALL {
            assert_eq!(state.as_str().parse::<JobState>().unwrap(), state);
            assert_eq!(serde_json::to_string(&state).unwrap(), format!("\"{state}\""));
        }
        let error = "done".parse::<JobState>().unwrap_err();
        assert!(error.contains("queued, admitted"), "{error}");
    }

    #[test]
    fn ends_are_final_and_every_state_but_queued_is_reached_from_somewhere() {
        for state in JobState::ALL {
            for from in state.allowed_from() {
                // The one exception: an admin's forced promotion of a refused candidate.
                if (*from, state) == (JobState::Refused, JobState::Published) {
                    continue;
                }
                assert!(!from.is_terminal(), "{from} → {state}: an end must stay an end");
            }
        }
        // The life of design.md §1, step by step.
        let life = [JobState::Queued, JobState::Admitted, JobState::Running, JobState::Evaluating];
        for pair in life.windows(2) {
            assert!(pair[1].allowed_from().contains(&pair[0]), "{} → {}", pair[0], pair[1]);
        }
        assert!(JobState::Published.allowed_from().contains(&JobState::Evaluating));
        assert!(JobState::Queued.allowed_from().contains(&JobState::Preempted));
        assert!(JobState::Preempted.allowed_from().contains(&JobState::Running));
        assert!(!JobState::Running.allowed_from().contains(&JobState::Queued), "admission comes first");
        assert!(!JobState::Published.allowed_from().contains(&JobState::Running), "gates come first");
    }
}
