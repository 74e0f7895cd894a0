//! A job's run in the MLflow tracking server its spec names (`[tracking] mlflow_uri`): one run per
//! job, named by the job's id and tagged with its team, model line and optimizer; the spec as
//! params (`rollout.temperature`), each metrics line's figures as metrics while the job runs
//! (held-out as `heldout/...`), and at the job's end the run's status (FINISHED published,
//! FAILED refused or failed, KILLED cancelled), its gate result and the published version's files
//! and manifest as the run's artifacts (`model/`, through the server's `mlflow-artifacts` proxy).
//!
//! MLflow is the teams' view, never the job's truth: the tracker is a task of its own, every
//! failure to reach the server is logged and retried with backoff, and nothing it does fails,
//! delays or changes the job's outcome. A tenant wrote the url, so every request goes through the
//! daemon's outbound client (`[outbound]`: the url checked at submit and on each request, every
//! resolved address checked, no proxy, no redirect); a refusal is final. The daemon sends the
//! server nothing of its own: the job's spec as the team wrote it, its figures, its published
//! files, and, when `token_secret` names one, the team's secret as a bearer token.
//!
//! What was logged is kept in the job directory (`mlflow.json`: the run, the params, the bytes of
//! `metrics.jsonl` logged), so a resumed run — another worker, another daemon — continues the
//! same MLflow run and logs no line twice. A worker resumed from an earlier checkpoint writes the
//! lines after it again; those steps are logged again then (with the same values on an exact
//! resume).
//!
//! The tracker is a task per supervision, started beside the worker. What it sends is computed by
//! pure functions: [`params`], [`metrics`], [`end_of`].

use std::path::PathBuf;
use std::time::{Duration, SystemTime};

use reqwest::Method;
use rlvr_outbound::{Refusal, refusal_of};
use rlvr_protocol::job::{JobOutput, JobState, JobView};
use rlvr_protocol::spec::{JobSpec, TrackingSection};
use rlvr_protocol::worker::MetricsLine;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, debug, info, info_span, warn};

/// How often a running job's new metrics lines are sent.
pub const POLL: Duration = Duration::from_secs(2);
/// The longest wait between tries while the server does not answer.
const MAX_BACKOFF: Duration = Duration::from_secs(60);
/// Tries of the job's end (last metrics, artifacts, status) before it is given up, the waits
/// doubling from one second.
const END_ATTEMPTS: u32 = 5;
/// One call's limit; an artifact's upload gets [`UPLOAD_TIMEOUT`].
const CALL_TIMEOUT: Duration = Duration::from_secs(15);
const UPLOAD_TIMEOUT: Duration = Duration::from_secs(600);
/// A published file larger than this is not uploaded (it is read whole into memory) and the run
/// says so in its `rlvr.artifacts` tag; the manifest, with every file's sha256, always is.
pub const MAX_ARTIFACT_BYTES: u64 = 1 << 30;
/// MLflow's limits (`mlflow/utils/validation.py`): a param's value, a tag's value, a key, and
/// the entries of one `log-batch`.
const MAX_PARAM_VALUE: usize = 6000;
const MAX_TAG_VALUE: usize = 5000;
const MAX_KEY: usize = 250;
const PARAMS_PER_BATCH: usize = 100;
const METRICS_PER_BATCH: usize = 1000;

// ---------------------------------------------------------------------------------------------
// The pure core: what is logged, as MLflow's entities.

/// One metric point of `log-batch`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Metric {
    pub key: String,
    pub value: f64,
    /// Milliseconds since the epoch.
    pub timestamp: i64,
    pub step: u64,
}

/// The spec's values as MLflow params: each scalar at its dotted path (`rollout.temperature`,
/// `verifiers.0.plugin`), nulls and empty lists left out, values cut to MLflow's 6,000
/// characters, keys to the characters MLflow takes.
pub fn params(spec: &JobSpec) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let value = serde_json::to_value(spec).unwrap_or(Value::Null);
    flatten(&value, String::new(), '.', &mut |key, value| {
        let text = match value {
            Value::String(text) => text.clone(),
            Value::Number(_) | Value::Bool(_) => value.to_string(),
            _ => return,
        };
        out.push((key, cut(&text, MAX_PARAM_VALUE)));
    });
    out
}

/// A metrics line's numbers as metric points at its step: top-level figures by their name
/// (`reward_mean`, an optimizer's own `clip_frac`), nested ones joined with `/` (`heldout/accuracy`,
/// `time/rollout`, `components/exact`).
pub fn metrics(line: &MetricsLine, timestamp: i64) -> Vec<Metric> {
    line.figures()
        .into_iter()
        .map(|(name, value)| (name.split('/').map(key_chars).collect::<Vec<_>>().join("/"), value))
        .filter(|(key, value)| key.len() <= MAX_KEY && value.is_finite())
        .map(|(key, value)| Metric { key, value, timestamp, step: line.step })
        .collect()
}

/// Calls `leaf` with each scalar of `value` and its path, the parts joined by `separator`.
fn flatten(value: &Value, path: String, separator: char, leaf: &mut impl FnMut(String, &Value)) {
    let join = |part: &str| {
        let part = key_chars(part);
        if path.is_empty() { part } else { format!("{path}{separator}{part}") }
    };
    match value {
        Value::Object(fields) => {
            for (name, value) in fields {
                flatten(value, join(name), separator, leaf);
            }
        }
        Value::Array(items) => {
            for (i, value) in items.iter().enumerate() {
                flatten(value, join(&i.to_string()), separator, leaf);
            }
        }
        Value::Null => {}
        scalar if path.len() <= MAX_KEY => leaf(path, scalar),
        _ => {}
    }
}

/// `part` in the characters MLflow allows in a key (letters, digits, `_ - . /` and space).
fn key_chars(part: &str) -> String {
    part.chars().map(|c| if c.is_ascii_alphanumeric() || "_-. ".contains(c) { c } else { '_' }).collect()
}

/// At most `max` characters of `text`.
fn cut(text: &str, max: usize) -> String {
    text.chars().take(max).collect()
}

/// The complete lines of `bytes` (what follows the last newline is a line still being written)
/// with the end of each, counted from the start of `bytes`.
pub fn complete_lines(bytes: &[u8]) -> Vec<(&str, usize)> {
    let mut lines = Vec::new();
    let mut start = 0;
    while let Some(at) = bytes[start..].iter().position(|&b| b == b'\n') {
        let end = start + at + 1;
        lines.push((std::str::from_utf8(&bytes[start..end - 1]).unwrap_or(""), end));
        start = end;
    }
    lines
}

/// The MLflow run status and tags a job's end is, or `None` when the job has not ended (requeued:
/// its run stays RUNNING).
pub fn end_of(job: &JobView) -> Option<(&'static str, Vec<(String, String)>)> {
    let status = run_status(job.state)?;
    let mut tags = vec![("rlvr.state".to_owned(), job.state.to_string())];
    match job.state {
        JobState::Published => {
            tags.push(("rlvr.gates".into(), "passed".into()));
            match &job.output {
                Some(JobOutput::Checkpoint { line, version, .. }) => {
                    tags.push(("rlvr.published_version".into(), format!("{line}@{version}")));
                }
                Some(dataset @ JobOutput::Dataset { .. }) => {
                    tags.push(("rlvr.published_dataset".into(), dataset.handed_on().reference()));
                }
                None => {}
            }
        }
        JobState::Refused => {
            tags.push(("rlvr.gates".into(), cut(&format!("refused: {}", job.reason), MAX_TAG_VALUE)))
        }
        _ => tags.push(("rlvr.reason".into(), cut(&job.reason, MAX_TAG_VALUE))),
    }
    Some((status, tags))
}

/// The MLflow run status of a job in `state`: `None` while it has not ended.
pub fn run_status(state: JobState) -> Option<&'static str> {
    match state {
        JobState::Published => Some("FINISHED"),
        JobState::Refused | JobState::Failed => Some("FAILED"),
        JobState::Cancelled => Some("KILLED"),
        _ => None,
    }
}

/// The REST path of the run's artifact `relative` under the server's `mlflow-artifacts` proxy,
/// from the run's `artifact_uri` (`mlflow-artifacts:/1/<run>/artifacts`); `None` when the server
/// stores artifacts where it does not serve them (`s3://…`, a local path without
/// `--serve-artifacts`).
pub fn artifact_path(artifact_uri: &str, relative: &str) -> Option<String> {
    let rest = artifact_uri.strip_prefix("mlflow-artifacts:")?;
    // `mlflow-artifacts://host:port/path` names the server too; the path is what counts.
    let rest = match rest.strip_prefix("//") {
        Some(authority_and_path) => &authority_and_path[authority_and_path.find('/')?..],
        None => rest,
    };
    Some(format!("/api/2.0/mlflow-artifacts/artifacts/{}/{relative}", rest.trim_matches('/')))
}

/// `text` percent-encoded for a query string (every byte but the unreserved ones).
fn query_value(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

fn now_ms() -> i64 {
    SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64)
}

// ---------------------------------------------------------------------------------------------
// The REST edge.

/// Why a call to the server did not succeed.
#[derive(Debug, thiserror::Error)]
pub enum MlflowError {
    /// The outbound policy refused the url or an address it resolves to: final.
    #[error("{0}")]
    Refused(Refusal),
    /// The server answered a redirect, which is not followed: final.
    #[error("the server answered a redirect (HTTP {0}), which is not followed")]
    Redirect(u16),
    /// An error answer.
    #[error("HTTP {status} from {path}: {body}")]
    Http { status: u16, path: String, body: String },
    /// No answer (connection, timeout).
    #[error("{0}")]
    Transport(String),
    /// An answer without what MLflow's API says it has.
    #[error("{path}: unexpected answer: {message}")]
    Answer { path: String, message: String },
}

impl MlflowError {
    /// Whether retrying could change the answer.
    fn is_final(&self) -> bool {
        matches!(self, MlflowError::Refused(_) | MlflowError::Redirect(_))
    }
}

/// An MLflow tracking server, through the daemon's outbound client.
#[derive(Clone)]
pub struct Server {
    client: rlvr_outbound::Client,
    base: String,
    token: Option<String>,
}

impl Server {
    /// The server at `tracking.mlflow_uri`, with the bearer `token` when given.
    pub fn new(client: rlvr_outbound::Client, tracking: &TrackingSection, token: Option<String>) -> Self {
        Server { client, base: tracking.base_url().to_owned(), token }
    }

    async fn send(
        &self,
        method: Method,
        path: &str,
        body: Option<(&str, reqwest::Body)>,
        timeout: Duration,
    ) -> Result<Value, MlflowError> {
        let url = format!("{}{path}", self.base);
        let mut request = self.client.request(method, &url).map_err(MlflowError::Refused)?.timeout(timeout);
        if let Some(token) = &self.token {
            request = request.bearer_auth(token);
        }
        if let Some((content_type, body)) = body {
            request = request.header(reqwest::header::CONTENT_TYPE, content_type).body(body);
        }
        let answer = request.send().await.map_err(|error| match refusal_of(&error) {
            Some(refusal) => MlflowError::Refused(refusal.clone()),
            None => MlflowError::Transport(rlvr_outbound::describe(error)),
        })?;
        let status = answer.status();
        if status.is_redirection() {
            return Err(MlflowError::Redirect(status.as_u16()));
        }
        let text =
            answer.text().await.map_err(|error| MlflowError::Transport(rlvr_outbound::describe(error)))?;
        if !status.is_success() {
            return Err(MlflowError::Http {
                status: status.as_u16(),
                path: path.to_owned(),
                body: cut(&text, 500),
            });
        }
        if text.trim().is_empty() {
            return Ok(Value::Null);
        }
        serde_json::from_str(&text)
            .map_err(|error| MlflowError::Answer { path: path.to_owned(), message: error.to_string() })
    }

    /// A JSON call to `/api/2.0/mlflow/<route>`.
    async fn call(&self, method: Method, route: &str, body: Option<Value>) -> Result<Value, MlflowError> {
        let body = body.map(|body| ("application/json", reqwest::Body::from(body.to_string())));
        self.send(method, &format!("/api/2.0/mlflow/{route}"), body, CALL_TIMEOUT).await
    }

    /// The id of experiment `name`, created when missing.
    pub async fn experiment(&self, name: &str) -> Result<String, MlflowError> {
        let route = format!("experiments/get-by-name?experiment_name={}", query_value(name));
        let found = match self.call(Method::GET, &route, None).await {
            Ok(answer) => Some(answer),
            Err(MlflowError::Http { status: 404, .. }) => None,
            Err(error) => return Err(error),
        };
        if let Some(answer) = found {
            let experiment = &answer["experiment"];
            if experiment["lifecycle_stage"] == "deleted" {
                return Err(MlflowError::Answer {
                    path: route,
                    message: format!("experiment {name:?} is deleted; restore it or name another"),
                });
            }
            return id(experiment, "experiment_id", &route);
        }
        let answer = self.call(Method::POST, "experiments/create", Some(json!({ "name": name }))).await?;
        id(&answer, "experiment_id", "experiments/create")
    }

    /// The run of job `job_id` in `experiment`, if one was made (`rlvr.job_id` tag): its id and
    /// artifact uri.
    pub async fn find_run(
        &self,
        experiment: &str,
        job_id: &str,
    ) -> Result<Option<(String, String)>, MlflowError> {
        let filter = format!("tags.`rlvr.job_id` = '{}'", job_id.replace('\'', "\\'"));
        let body = json!({ "experiment_ids": [experiment], "filter": filter, "max_results": 1 });
        let answer = self.call(Method::POST, "runs/search", Some(body)).await?;
        let Some(run) = answer["runs"].get(0) else { return Ok(None) };
        Ok(Some(run_ids(&run["info"], "runs/search")?))
    }

    /// A new run named `name` in `experiment` with `tags`: its id and artifact uri.
    pub async fn create_run(
        &self,
        experiment: &str,
        name: &str,
        tags: &[(String, String)],
    ) -> Result<(String, String), MlflowError> {
        let tags: Vec<Value> =
            tags.iter().map(|(key, value)| json!({ "key": key, "value": value })).collect();
        let body =
            json!({ "experiment_id": experiment, "run_name": name, "start_time": now_ms(), "tags": tags });
        let answer = self.call(Method::POST, "runs/create", Some(body)).await?;
        run_ids(&answer["run"]["info"], "runs/create")
    }

    /// `runs/log-batch` of `params`, `metrics` and `tags` (each within MLflow's limits).
    pub async fn log_batch(
        &self,
        run: &str,
        params: &[(String, String)],
        metrics: &[Metric],
        tags: &[(String, String)],
    ) -> Result<(), MlflowError> {
        let pairs = |pairs: &[(String, String)]| -> Vec<Value> {
            pairs.iter().map(|(k, v)| json!({ "key": k, "value": v })).collect()
        };
        let body = json!({ "run_id": run, "params": pairs(params), "metrics": metrics, "tags": pairs(tags) });
        self.call(Method::POST, "runs/log-batch", Some(body)).await.map(drop)
    }

    /// `runs/update`: the run's end.
    pub async fn end_run(&self, run: &str, status: &str) -> Result<(), MlflowError> {
        let body = json!({ "run_id": run, "status": status, "end_time": now_ms() });
        self.call(Method::POST, "runs/update", Some(body)).await.map(drop)
    }

    /// Uploads `bytes` as the run's artifact `relative`, through the server's artifact proxy.
    pub async fn upload(
        &self,
        artifact_uri: &str,
        relative: &str,
        bytes: Vec<u8>,
    ) -> Result<(), MlflowError> {
        let path = artifact_path(artifact_uri, relative).ok_or_else(|| MlflowError::Answer {
            path: "runs/create".into(),
            message: format!(
                "the run's artifacts go to {artifact_uri}, which the server does not serve \
                 (mlflow server --serve-artifacts, its default, proxies them)"
            ),
        })?;
        let body = ("application/octet-stream", reqwest::Body::from(bytes));
        self.send(Method::PUT, &path, Some(body), UPLOAD_TIMEOUT).await.map(drop)
    }
}

fn id(value: &Value, field: &str, path: &str) -> Result<String, MlflowError> {
    value[field]
        .as_str()
        .map(str::to_owned)
        .ok_or_else(|| MlflowError::Answer { path: path.to_owned(), message: format!("no {field}") })
}

fn run_ids(info: &Value, path: &str) -> Result<(String, String), MlflowError> {
    Ok((id(info, "run_id", path)?, id(info, "artifact_uri", path)?))
}

// ---------------------------------------------------------------------------------------------
// The tracker: one task per supervision of a job that names `[tracking]`.

/// What was logged to the job's run so far: `<job dir>/mlflow.json`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
struct Logged {
    experiment_id: String,
    run_id: String,
    artifact_uri: String,
    /// The spec's params are in.
    params: bool,
    /// Bytes of `metrics.jsonl` whose lines are logged.
    metrics_bytes: u64,
}

/// The job a tracker follows.
pub struct TrackedJob {
    pub id: String,
    /// The spec as the team wrote it (the record's, never the worker's resolved paths).
    pub spec: JobSpec,
    /// `<job dir>/mlflow.json`.
    pub state_file: PathBuf,
    /// The run's `metrics.jsonl`.
    pub metrics: PathBuf,
}

/// The handle of a running tracker: [`Tracker::end`] with the job's record once the
/// supervision has written its end; dropped without, the tracker sends what is new and stops,
/// leaving the run RUNNING for the job's next run.
pub struct Tracker {
    ended: watch::Sender<Option<Box<JobView>>>,
}

impl Tracker {
    /// Starts following `job` into `server`, until its end or `stopping`.
    pub fn start(job: TrackedJob, server: Server, stopping: CancellationToken) -> Tracker {
        let (ended, receiver) = watch::channel(None);
        let span = info_span!("mlflow", job_id = %job.id);
        tokio::spawn(follow(job, server, receiver, stopping).instrument(span));
        Tracker { ended }
    }

    /// The supervision is over and `job` is the record it left (ended or requeued).
    pub fn end(self, job: JobView) {
        let _ = self.ended.send(Some(Box::new(job)));
    }
}

async fn follow(
    job: TrackedJob,
    server: Server,
    mut ended: watch::Receiver<Option<Box<JobView>>>,
    stopping: CancellationToken,
) {
    let mut logged = read_logged(&job);
    let mut backoff = POLL;
    // While the job runs: its new lines every POLL, or later while the server does not answer.
    let end = loop {
        tokio::select! {
            _ = stopping.cancelled() => return,
            changed = ended.changed() => break if changed.is_ok() { ended.borrow().clone() } else { None },
            _ = tokio::time::sleep(backoff) => {}
        }
        match sync(&job, &server, &mut logged).await {
            Ok(()) => backoff = POLL,
            Err(error) if error.is_final() => {
                warn!(%error, "mlflow: giving up on the job's run");
                return;
            }
            Err(error) => {
                warn!(%error, retry_in_s = backoff.as_secs(), "mlflow: cannot log to the job's run yet");
                backoff = (backoff * 2).min(MAX_BACKOFF);
            }
        }
    };
    // The supervision is over: the last lines, and the run's end when the job ended.
    let mut wait = Duration::from_secs(1);
    for attempt in 1..=END_ATTEMPTS {
        let result = match sync(&job, &server, &mut logged).await {
            Ok(()) => match end.as_deref() {
                Some(record) => finish(&job, &server, &logged, record).await,
                None => Ok(()),
            },
            Err(error) => Err(error),
        };
        match result {
            Ok(()) => return,
            Err(error) if error.is_final() || attempt == END_ATTEMPTS => {
                warn!(%error, attempt, "mlflow: the job's run is left as it is");
                return;
            }
            Err(error) => warn!(%error, attempt, "mlflow: cannot log the job's end yet"),
        }
        tokio::select! {
            _ = stopping.cancelled() => return,
            _ = tokio::time::sleep(wait) => wait *= 2,
        }
    }
}

fn read_logged(job: &TrackedJob) -> Logged {
    std::fs::read(&job.state_file)
        .ok()
        .and_then(|bytes| serde_json::from_slice(&bytes).ok())
        .unwrap_or_default()
}

fn save_logged(job: &TrackedJob, logged: &Logged) {
    if let Err(error) = rlvr_protocol::fs::write_json_atomic(&job.state_file, logged) {
        warn!(%error, path = %job.state_file.display(), "mlflow: cannot record what was logged");
    }
}

/// Makes sure the run exists with its params, then logs the metrics lines not logged yet.
async fn sync(job: &TrackedJob, server: &Server, logged: &mut Logged) -> Result<(), MlflowError> {
    let tracking = job.spec.tracking.as_ref().expect("a tracked job names [tracking]");
    if logged.run_id.is_empty() {
        let experiment = server.experiment(&tracking.experiment_of(&job.spec.job)).await?;
        // A daemon that died between making the run and recording it finds it by its tag.
        let (run_id, artifact_uri) = match server.find_run(&experiment, &job.id).await? {
            Some(found) => found,
            None => server.create_run(&experiment, &job.id, &run_tags(job)).await?,
        };
        info!(experiment = %experiment, run = %run_id, "mlflow: the job's run");
        *logged = Logged { experiment_id: experiment, run_id, artifact_uri, ..Logged::default() };
        save_logged(job, logged);
    }
    if !logged.params {
        for batch in params(&job.spec).chunks(PARAMS_PER_BATCH) {
            server.log_batch(&logged.run_id, batch, &[], &[]).await?;
        }
        logged.params = true;
        save_logged(job, logged);
    }
    sync_metrics(job, server, logged).await
}

fn run_tags(job: &TrackedJob) -> Vec<(String, String)> {
    let section = &job.spec.job;
    vec![
        ("rlvr.job_id".into(), job.id.clone()),
        ("rlvr.team".into(), section.team.clone()),
        ("rlvr.job_name".into(), section.name.clone()),
        ("rlvr.model_line".into(), section.model_line.clone()),
        ("rlvr.optimizer".into(), job.spec.optimizer.plugin.clone()),
        ("mlflow.source.name".into(), "rlvrd".into()),
    ]
}

/// Logs the complete lines of `metrics.jsonl` after `logged.metrics_bytes`, whole lines per
/// batch, recording the new length after each batch.
async fn sync_metrics(job: &TrackedJob, server: &Server, logged: &mut Logged) -> Result<(), MlflowError> {
    use tokio::io::{AsyncReadExt, AsyncSeekExt};
    let Ok(mut file) = tokio::fs::File::open(&job.metrics).await else { return Ok(()) };
    let Ok(length) = file.metadata().await.map(|meta| meta.len()) else { return Ok(()) };
    if length < logged.metrics_bytes {
        // A resume from an earlier checkpoint cut the file back; its lines come again.
        debug!(from = logged.metrics_bytes, to = length, "mlflow: metrics.jsonl was cut back");
        logged.metrics_bytes = length;
    }
    // Only what was appended since the last look: a long job's file is read once, not every 2 s.
    let start = logged.metrics_bytes;
    let mut bytes = Vec::new();
    if file.seek(std::io::SeekFrom::Start(start)).await.is_err()
        || file.read_to_end(&mut bytes).await.is_err()
    {
        return Ok(());
    }
    let timestamp = now_ms();
    let mut batch: Vec<Metric> = Vec::new();
    let mut batch_end = start;
    for (text, end) in complete_lines(&bytes) {
        let points = match serde_json::from_str::<MetricsLine>(text) {
            Ok(line) => metrics(&line, timestamp),
            Err(error) => {
                warn!(%error, "mlflow: a metrics line that is not one; skipped");
                Vec::new()
            }
        };
        if !batch.is_empty() && batch.len() + points.len() > METRICS_PER_BATCH {
            server.log_batch(&logged.run_id, &[], &batch, &[]).await?;
            logged.metrics_bytes = batch_end;
            save_logged(job, logged);
            batch.clear();
        }
        batch.extend(points.into_iter().take(METRICS_PER_BATCH));
        batch_end = start + end as u64;
    }
    if batch_end > start {
        if !batch.is_empty() {
            server.log_batch(&logged.run_id, &[], &batch, &[]).await?;
        }
        logged.metrics_bytes = batch_end;
        save_logged(job, logged);
    }
    Ok(())
}

/// The job's end: the published files as artifacts, the end's tags, the run's status.
async fn finish(
    job: &TrackedJob,
    server: &Server,
    logged: &Logged,
    record: &JobView,
) -> Result<(), MlflowError> {
    let Some((status, mut tags)) = end_of(record) else { return Ok(()) };
    if let Some(published) = record.published.as_deref().filter(|_| record.state == JobState::Published) {
        tags.push(("rlvr.artifacts".into(), upload_published(server, logged, published.as_ref()).await?));
    }
    server.log_batch(&logged.run_id, &[], &[], &tags).await?;
    server.end_run(&logged.run_id, status).await?;
    info!(status, run = %logged.run_id, job = %job.id, "mlflow: the job's run ended");
    Ok(())
}

/// Uploads each file of the published version's directory as `model/<name>`; what it did, in
/// words, for the run's `rlvr.artifacts` tag.
async fn upload_published(
    server: &Server,
    logged: &Logged,
    published: &std::path::Path,
) -> Result<String, MlflowError> {
    let local = |error: std::io::Error| MlflowError::Answer {
        path: published.display().to_string(),
        message: error.to_string(),
    };
    let mut entries: Vec<_> = std::fs::read_dir(published).map_err(local)?.flatten().collect();
    entries.sort_by_key(|entry| entry.file_name());
    let (mut uploaded, mut left) = (0, Vec::new());
    for entry in entries {
        let name = entry.file_name().to_string_lossy().into_owned();
        let metadata = entry.metadata().map_err(local)?;
        if !metadata.is_file() {
            continue;
        }
        let plain = name.chars().all(|c| c.is_ascii_alphanumeric() || "._-".contains(c));
        if !plain || metadata.len() > MAX_ARTIFACT_BYTES {
            left.push(name);
            continue;
        }
        let bytes = tokio::fs::read(entry.path()).await.map_err(local)?;
        server.upload(&logged.artifact_uri, &format!("model/{name}"), bytes).await?;
        uploaded += 1;
    }
    Ok(if left.is_empty() {
        format!("model/: {uploaded} files")
    } else {
        let limit = MAX_ARTIFACT_BYTES >> 20;
        cut(
            &format!(
                "model/: {uploaded} files; not uploaded (over {limit} MiB or an unusual name): {}",
                left.join(", ")
            ),
            MAX_TAG_VALUE,
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> JobSpec {
        JobSpec::from_toml(
            "[job]\nname = \"a\"\nteam = \"t\"\nmodel_line = \"line\"\n[model]\npolicy = \"builtin:tiny-arith\"\n\
             [data]\ntrain = \"dataset:train\"\n[optimizer]\nplugin = \"grpo\"\n[[verifiers]]\nplugin = \"exact\"\n\
             [budget]\nmax_steps = 2\n[tracking]\nmlflow_uri = \"http://127.0.0.1:5000\"\n",
        )
        .unwrap()
    }

    #[test]
    fn the_spec_becomes_dotted_params() {
        let params: std::collections::BTreeMap<_, _> = params(&spec()).into_iter().collect();
        let cases = [
            ("job.team", Some("t")),
            ("rollout.temperature", Some("1.0")),
            ("verifiers.0.plugin", Some("exact")),
            ("budget.max_steps", Some("2")),
            ("tracking.mlflow_uri", Some("http://127.0.0.1:5000")),
            // Nulls are not params.
            ("tracking.experiment", None),
        ];
        for (key, expected) in cases {
            assert_eq!(params.get(key).map(String::as_str), expected, "{key}");
        }
        let long = JobSpec {
            job: rlvr_protocol::spec::JobSection { name: "x".repeat(7000), ..spec().job },
            ..spec()
        };
        let name = params_of(&long, "job.name");
        assert_eq!(name.chars().count(), MAX_PARAM_VALUE);
    }

    fn params_of(spec: &JobSpec, key: &str) -> String {
        params(spec).into_iter().find(|(k, _)| k == key).unwrap().1
    }

    #[test]
    fn a_metrics_line_becomes_points_at_its_step() {
        let line: MetricsLine = serde_json::from_str(
            r#"{"step":3,"reward_mean":0.5,"components":{"exact":0.25},"heldout":{"accuracy":0.75,"reward_mean":0.7,"completion_len_mean":4.0,"prompts":16},"clip_frac":0.1,"kl_extra":null}"#,
        )
        .unwrap();
        let got: Vec<(String, f64, u64)> =
            metrics(&line, 7).into_iter().map(|m| (m.key, m.value, m.step)).collect();
        let expected = [
            ("clip_frac", 0.1),
            ("components/exact", 0.25),
            ("heldout/accuracy", 0.75),
            ("heldout/completion_len_mean", 4.0),
            ("heldout/prompts", 16.0),
            ("heldout/reward_mean", 0.7),
            ("reward_mean", 0.5),
        ];
        let mut got_sorted = got.clone();
        got_sorted.sort_by(|a, b| a.0.cmp(&b.0));
        let expected: Vec<(String, f64, u64)> =
            expected.iter().map(|(k, v)| (k.to_string(), *v, 3)).collect();
        assert_eq!(got_sorted, expected);
    }

    #[test]
    fn only_complete_lines_are_taken() {
        let cases: &[(&str, &[(&str, usize)])] = &[
            ("", &[]),
            ("{\"step\":0}", &[]),
            ("a\nb\nhalf", &[("a", 2), ("b", 4)]),
            ("a\n\n", &[("a", 2), ("", 3)]),
        ];
        for (text, expected) in cases {
            assert_eq!(complete_lines(text.as_bytes()), *expected, "{text:?}");
        }
    }

    #[test]
    fn artifact_paths_follow_the_runs_artifact_uri() {
        let cases = [
            (
                "mlflow-artifacts:/1/abc/artifacts",
                Some("/api/2.0/mlflow-artifacts/artifacts/1/abc/artifacts/model/x"),
            ),
            (
                "mlflow-artifacts://mlflow:5000/1/abc/artifacts",
                Some("/api/2.0/mlflow-artifacts/artifacts/1/abc/artifacts/model/x"),
            ),
            ("s3://bucket/1/abc/artifacts", None),
            ("/srv/mlruns/1/abc/artifacts", None),
        ];
        for (uri, expected) in cases {
            assert_eq!(artifact_path(uri, "model/x").as_deref(), expected, "{uri}");
        }
    }

    #[test]
    fn each_end_is_a_run_status() {
        let cases = [
            (JobState::Published, Some("FINISHED")),
            (JobState::Refused, Some("FAILED")),
            (JobState::Failed, Some("FAILED")),
            (JobState::Cancelled, Some("KILLED")),
            (JobState::Queued, None),
            (JobState::Preempted, None),
        ];
        for (state, expected) in cases {
            assert_eq!(run_status(state), expected, "{state}");
        }
    }

    #[test]
    fn query_values_are_percent_encoded() {
        assert_eq!(query_value("team a/line&x=1"), "team%20a%2Fline%26x%3D1");
    }
}
