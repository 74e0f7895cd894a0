//! The daemon's API with this caller's settings: one typed method per route, busy answers (429,
//! 503 with Retry-After) waited out a few times, every failure an [`HttpError`].

use std::time::Duration;

use reqwest::blocking::{RequestBuilder, Response};
use reqwest::header::{CONTENT_TYPE, RETRY_AFTER};
use reqwest::{Method, StatusCode, Url};
use rlvr_protocol::api::{
    CurriculumList, CurriculumUpdate, Dataset, DatasetList, GradersValid, Health, ModelLine, ModelLineList,
    ModelLineUpdate, PluginList, PromoteRequest, Refreshed, VerifyRequest, VerifyResults,
};

use crate::spec_data::SpecDataError;
use rlvr_protocol::env::EnvCheck;
use rlvr_protocol::gates::Manifest;
use rlvr_protocol::job::{
    ApiError, DryRun, ErrorBody, Estimate, JobList, JobLog, JobState, JobView, MetricsHistory, Submitted,
};
use rlvr_protocol::pipeline::{PipelineDryRun, PipelineList, PipelineView};
use rlvr_protocol::worker::MetricsLine;
use serde::de::DeserializeOwned;

use crate::error::{HttpError, reqwest_detail, status_code_name};
use crate::settings::Settings;

/// Longest a request waits for an answer or the next piece of it (a submit reads the data
/// files before it answers).
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);
/// The longest `POST /v1/env/check` is waited for: above the daemon's default dry-run budget
/// (`api.dry_run_budget_s`, 300 s), past which it answers itself.
pub const ENV_CHECK_TIMEOUT: Duration = Duration::from_secs(360);
/// Longest a connection takes to open.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// An event stream this long silent is dead: the daemon sends a keep-alive every 10 s.
pub const STREAM_SILENCE: Duration = Duration::from_secs(35);
/// Busy answers (429, 503 with Retry-After) waited out per request.
pub const BUSY_RETRIES: u32 = 3;
/// The longest Retry-After waited out; a longer one is the caller's to judge.
pub const BUSY_WAIT_MAX: Duration = Duration::from_secs(30);

/// How a [`Client`] talks: timeouts, busy retries, who it says it is.
#[derive(Debug, Clone)]
pub struct ClientConfig {
    /// The `User-Agent` header.
    pub user_agent: String,
    /// Longest wait for an answer's head, then for each read of its body (never the whole
    /// exchange).
    pub timeout: Duration,
    /// Longest a connection takes to open.
    pub connect_timeout: Duration,
    /// An event stream silent this long is dead, and followed again.
    pub stream_silence: Duration,
    /// Busy answers waited out per request; 0 returns the first one as an error.
    pub busy_retries: u32,
    /// The longest Retry-After waited out.
    pub busy_wait_max: Duration,
    /// Called before each busy wait with the answer's status and the wait (a program says it
    /// on stderr).
    pub on_busy: Option<fn(StatusCode, Duration)>,
}

impl Default for ClientConfig {
    fn default() -> Self {
        ClientConfig {
            user_agent: concat!("rlvr-client/", env!("CARGO_PKG_VERSION")).to_owned(),
            timeout: REQUEST_TIMEOUT,
            connect_timeout: CONNECT_TIMEOUT,
            stream_silence: STREAM_SILENCE,
            busy_retries: BUSY_RETRIES,
            busy_wait_max: BUSY_WAIT_MAX,
            on_busy: None,
        }
    }
}

/// The format of a job spec's text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpecFormat {
    /// `application/toml`.
    Toml,
    /// `application/json`.
    Json,
}

impl SpecFormat {
    /// The `Content-Type` it is sent with.
    pub fn content_type(self) -> &'static str {
        match self {
            SpecFormat::Toml => "application/toml",
            SpecFormat::Json => "application/json",
        }
    }
}

/// Which jobs `GET /v1/jobs` lists; the daemon's defaults where `None`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct JobQuery {
    /// Only this team's jobs (admin tokens; a team token always lists its own).
    pub team: Option<String>,
    /// Only jobs in this state.
    pub state: Option<JobState>,
    /// At most this many (the daemon's default: 100).
    pub limit: Option<u64>,
    /// Only jobs submitted at or after this time (RFC 3339).
    pub since: Option<String>,
    /// The page after the one that answered with this `next`.
    pub cursor: Option<String>,
}

impl JobQuery {
    fn pairs(&self) -> Vec<(&'static str, String)> {
        let mut query = Vec::new();
        query.extend(self.team.clone().map(|team| ("team", team)));
        query.extend(self.state.map(|state| ("state", state.to_string())));
        query.extend(self.limit.map(|limit| ("limit", limit.to_string())));
        query.extend(self.since.clone().map(|since| ("since", since)));
        query.extend(self.cursor.clone().map(|cursor| ("cursor", cursor)));
        query
    }
}

/// The daemon's API, with this caller's token. Blocking; one per thread or shared (`&self`).
pub struct Client {
    http: reqwest::blocking::Client,
    settings: Settings,
    config: ClientConfig,
}

impl Client {
    /// A client with the default [`ClientConfig`].
    pub fn new(settings: Settings) -> Result<Client, HttpError> {
        Client::with_config(settings, ClientConfig::default())
    }

    /// A client with this config. Installs ring as the process's TLS provider when it has none.
    pub fn with_config(settings: Settings, config: ClientConfig) -> Result<Client, HttpError> {
        let http = build(&config, config.timeout)?;
        Ok(Client { http, settings, config })
    }

    /// Where it talks to, and with which token.
    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    /// The reqwest client for event streams: a connection silent for
    /// [`ClientConfig::stream_silence`] is dead. (A per-request timeout would not do: reqwest
    /// applies it to the whole, endless, body.)
    pub(crate) fn stream_http(&self) -> Result<reqwest::blocking::Client, HttpError> {
        build(&self.config, self.config.stream_silence)
    }

    /// The server's URL with these path segments (each percent-encoded) and query pairs.
    pub fn url(&self, segments: &[&str], query: &[(&str, String)]) -> Url {
        api_url(&self.settings.server, segments, query)
    }

    /// `request` with this caller's token.
    pub(crate) fn authorize(&self, request: RequestBuilder) -> RequestBuilder {
        match &self.settings.token {
            Some(token) => request.bearer_auth(token.secret()),
            None => request,
        }
    }

    fn request(&self, method: Method, url: &Url) -> RequestBuilder {
        self.authorize(self.http.request(method, url.clone()))
    }

    /// Sends the request `build` makes, waits out a few busy answers (429, 503 with
    /// Retry-After), and turns an error status into [`HttpError::Status`].
    ///
    /// A request that may be sent twice (GET, PUT, DELETE, or one with an `Idempotency-Key`)
    /// whose kept-alive connection the daemon had closed as it went out is sent again once, on a
    /// new connection: nothing of it was answered (a busy daemon's idle timeout meets a client's
    /// reuse of the connection; the submit benchmark saw it).
    pub(crate) fn send(&self, url: &Url, build: impl Fn() -> RequestBuilder) -> Result<Response, HttpError> {
        let (mut retries, mut resent) = (0, false);
        loop {
            let request = build().build().map_err(|error| HttpError::Request {
                url: url.to_string(),
                detail: reqwest_detail(&error),
            })?;
            let replayable = may_send_twice(&request);
            let response = match self.http.execute(request) {
                Ok(response) => response,
                Err(error) if replayable && !resent && closed_before_answering(&error) => {
                    resent = true;
                    continue;
                }
                Err(error) => {
                    let (url, detail) = (url.to_string(), reqwest_detail(&error));
                    return Err(if error.is_builder() {
                        HttpError::Request { url, detail }
                    } else {
                        HttpError::Unreachable { url, detail }
                    });
                }
            };
            if let Some(wait) = busy_wait(&response)
                && retries < self.config.busy_retries
                && wait <= self.config.busy_wait_max
            {
                retries += 1;
                if let Some(notice) = self.config.on_busy {
                    notice(response.status(), wait);
                }
                std::thread::sleep(wait);
                continue;
            }
            return self.check(url, response);
        }
    }

    fn check(&self, url: &Url, response: Response) -> Result<Response, HttpError> {
        let status = response.status();
        if status.is_success() {
            return Ok(response);
        }
        let retry_after = busy_wait(&response);
        let text = response.text().unwrap_or_default();
        let (error, from_daemon) = match serde_json::from_str::<ErrorBody>(&text) {
            Ok(body) => (body.error, true),
            Err(_) => {
                // Not the daemon's error body (a proxy, another server): say what there is.
                let snippet: String = text.trim().chars().take(200).collect();
                let error = ApiError {
                    code: status_code_name(status),
                    message: if snippet.is_empty() { format!("{status} from {url}") } else { snippet },
                    field: None,
                    more: Vec::new(),
                };
                (error, false)
            }
        };
        let hint = (status == StatusCode::UNAUTHORIZED).then(|| self.token_hint());
        Err(HttpError::Status { status, error: Box::new(error), from_daemon, hint, retry_after })
    }

    /// Where the token came from, or where to put one.
    fn token_hint(&self) -> String {
        let file = self
            .settings
            .config_path
            .as_deref()
            .map_or_else(|| "~/.config/rlvr/cli.toml".to_owned(), |path| path.display().to_string());
        match &self.settings.token {
            Some(token) => format!("the token came from {}", token.from()),
            None => format!("no token given: pass --token, set RLVR_TOKEN, or put token = \"...\" in {file}"),
        }
    }

    /// Reads a successful answer's status and JSON body.
    fn read<T: DeserializeOwned>(&self, url: &Url, response: Response) -> Result<(StatusCode, T), HttpError> {
        let status = response.status();
        let text = response.text().map_err(|error| HttpError::Unreachable {
            url: url.to_string(),
            detail: reqwest_detail(&error),
        })?;
        let value = serde_json::from_str(&text)
            .map_err(|error| HttpError::BadAnswer { url: url.to_string(), detail: error.to_string() })?;
        Ok((status, value))
    }

    /// A request without a body, or with a JSON one, whose answer is JSON with status 200.
    fn call<T: DeserializeOwned>(
        &self,
        method: Method,
        url: Url,
        body: Option<String>,
    ) -> Result<T, HttpError> {
        let response = self.send(&url, || {
            let request = self.request(method.clone(), &url);
            match &body {
                Some(body) => request.header(CONTENT_TYPE, "application/json").body(body.clone()),
                None => request,
            }
        })?;
        let (status, value) = self.read(&url, response)?;
        expect_status(&url, status, StatusCode::OK)?;
        Ok(value)
    }

    /// `GET` of any JSON route of the API (the typed methods cover the job API): `segments`
    /// are the path's, each percent-encoded.
    pub fn get<T: DeserializeOwned>(
        &self,
        segments: &[&str],
        query: &[(&str, String)],
    ) -> Result<T, HttpError> {
        self.call(Method::GET, self.url(segments, query), None)
    }

    /// `POST /v1/jobs`: submits a spec's text as it is. With an `idempotency_key`, a repeated
    /// submit answers with the job the first one made (`created: false`) instead of making
    /// another; the daemon judges the key. A 201 must say `created`, a 200 not.
    pub fn submit(
        &self,
        spec: &str,
        format: SpecFormat,
        idempotency_key: Option<&str>,
    ) -> Result<Submitted, HttpError> {
        self.post_spec(&["v1", "jobs"], spec, format, idempotency_key)
    }

    /// `POST /v1/jobs?dry_run=true`: the spec checked as a submit checks it and answered as the
    /// job would keep it; queues nothing.
    pub fn dry_run(&self, spec: &str, format: SpecFormat) -> Result<DryRun, HttpError> {
        self.post_dry_run(&["v1", "jobs"], spec, format)
    }

    /// `POST /v1/pipelines?dry_run=true`: every stage checked; queues nothing.
    pub fn dry_run_pipeline(&self, spec: &str, format: SpecFormat) -> Result<PipelineDryRun, HttpError> {
        self.post_dry_run(&["v1", "pipelines"], spec, format)
    }

    fn post_dry_run<T: DeserializeOwned>(
        &self,
        segments: &[&str],
        spec: &str,
        format: SpecFormat,
    ) -> Result<T, HttpError> {
        self.post_spec_text(segments, &[("dry_run", "true".to_owned())], spec, format, None)
    }

    /// A spec's text POSTed to `segments` with `query`, answered 200 with a `T`; `timeout`, the
    /// whole exchange's limit where it may take longer than a plain request.
    fn post_spec_text<T: DeserializeOwned>(
        &self,
        segments: &[&str],
        query: &[(&str, String)],
        spec: &str,
        format: SpecFormat,
        timeout: Option<Duration>,
    ) -> Result<T, HttpError> {
        let url = self.url(segments, query);
        let response = self.send(&url, || {
            let request = self
                .request(Method::POST, &url)
                .header(CONTENT_TYPE, format.content_type())
                .body(spec.to_owned());
            match timeout {
                Some(timeout) => request.timeout(timeout),
                None => request,
            }
        })?;
        let (status, answer) = self.read(&url, response)?;
        expect_status(&url, status, StatusCode::OK)?;
        Ok(answer)
    }

    /// A spec's text POSTed to `segments`, answered 201 (`created`) or 200 (an earlier submit
    /// with the same `idempotency_key`).
    fn post_spec(
        &self,
        segments: &[&str],
        spec: &str,
        format: SpecFormat,
        idempotency_key: Option<&str>,
    ) -> Result<Submitted, HttpError> {
        let url = self.url(segments, &[]);
        let response = self.send(&url, || {
            let request = self
                .request(Method::POST, &url)
                .header(CONTENT_TYPE, format.content_type())
                .body(spec.to_owned());
            match idempotency_key {
                Some(key) => request.header("Idempotency-Key", key),
                None => request,
            }
        })?;
        let (status, submitted): (StatusCode, Submitted) = self.read(&url, response)?;
        let expected = if submitted.created { StatusCode::CREATED } else { StatusCode::OK };
        expect_status(&url, status, expected)?;
        Ok(submitted)
    }

    /// `POST /v1/pipelines`: submits a pipeline spec's text as it is (with an
    /// `idempotency_key`, as [`Client::submit`]).
    pub fn submit_pipeline(
        &self,
        spec: &str,
        format: SpecFormat,
        idempotency_key: Option<&str>,
    ) -> Result<Submitted, HttpError> {
        self.post_spec(&["v1", "pipelines"], spec, format, idempotency_key)
    }

    /// `GET /v1/pipelines/{id}`.
    pub fn pipeline(&self, id: &str) -> Result<PipelineView, HttpError> {
        self.get(&["v1", "pipelines", id], &[])
    }

    /// `GET /v1/pipelines`: the team's pipelines, newest first.
    pub fn pipelines(&self) -> Result<PipelineList, HttpError> {
        self.get(&["v1", "pipelines"], &[])
    }

    /// `DELETE /v1/pipelines/{id}`: the pipeline being cancelled (`cancel_requested`), its
    /// running stage with it.
    pub fn cancel_pipeline(&self, id: &str) -> Result<PipelineView, HttpError> {
        self.call(Method::DELETE, self.url(&["v1", "pipelines", id], &[]), None)
    }

    /// `POST /v1/estimate`: the spec's memory estimate on the daemon's devices; queues nothing.
    pub fn estimate(&self, spec: &str, format: SpecFormat) -> Result<Estimate, HttpError> {
        self.post_spec_text(&["v1", "estimate"], &[], spec, format, None)
    }

    /// `POST /v1/env/check?episodes=N`: an `[env]` spec's first `episodes` played against its
    /// environment, each as the spans a step would train on; queues nothing. Waits as long as
    /// the daemon's dry-run budget may let a check run (a model to load, turns to play).
    pub fn env_check(&self, spec: &str, format: SpecFormat, episodes: usize) -> Result<EnvCheck, HttpError> {
        let query = [("episodes", episodes.to_string())];
        self.post_spec_text(&["v1", "env", "check"], &query, spec, format, Some(ENV_CHECK_TIMEOUT))
    }

    /// `GET /v1/jobs/{id}`.
    pub fn job(&self, id: &str) -> Result<JobView, HttpError> {
        self.get(&["v1", "jobs", id], &[])
    }

    /// `GET /v1/jobs`: newest first.
    pub fn jobs(&self, query: &JobQuery) -> Result<JobList, HttpError> {
        self.get(&["v1", "jobs"], &query.pairs())
    }

    /// `DELETE /v1/jobs/{id}`: the job cancelled, or being cancelled (`cancel_requested`).
    pub fn cancel(&self, id: &str) -> Result<JobView, HttpError> {
        self.call(Method::DELETE, self.url(&["v1", "jobs", id], &[]), None)
    }

    /// `POST /v1/jobs/{id}/promote` (admin tokens): publishes a refused job's candidate over
    /// its gates, recording `reason`.
    pub fn promote(&self, id: &str, reason: &str) -> Result<JobView, HttpError> {
        let url = self.url(&["v1", "jobs", id, "promote"], &[]);
        let body = serde_json::to_string(&PromoteRequest { force: true, reason: reason.to_owned() })
            .map_err(|error| HttpError::Request { url: url.to_string(), detail: error.to_string() })?;
        self.call(Method::POST, url, Some(body))
    }

    /// The job's metrics lines in order: every window of `GET /v1/jobs/{id}/metrics`.
    pub fn metrics(&self, id: &str) -> Result<Vec<MetricsLine>, HttpError> {
        let mut lines = Vec::new();
        let mut since = 0;
        loop {
            let window = self.metrics_window(id, since, None)?;
            // Cut back meanwhile (a resume): what was read before is not the history any more.
            if window.start < since {
                lines.clear();
            }
            lines.extend(window.lines);
            if window.end >= window.size || window.end <= since && window.start == since {
                return Ok(lines);
            }
            since = window.end;
        }
    }

    /// `GET /v1/jobs/{id}/metrics` from byte `since` (the `end` of the previous answer), at most
    /// `bytes` of lines (the daemon's default: 4 MiB).
    pub fn metrics_window(
        &self,
        id: &str,
        since: u64,
        bytes: Option<u64>,
    ) -> Result<MetricsHistory, HttpError> {
        let query: Vec<(&str, String)> = [("since", Some(since)), ("bytes", bytes)]
            .into_iter()
            .filter_map(|(key, value)| value.map(|value| (key, value.to_string())))
            .collect();
        self.get(&["v1", "jobs", id, "metrics"], &query)
    }

    /// `GET /v1/jobs/{id}/logs`: whole lines of the job's worker log from byte `since` (the `end`
    /// of the previous answer), or its tail; at most `bytes` of them (the daemon's default: 1 MiB).
    pub fn logs(&self, id: &str, since: Option<u64>, bytes: Option<u64>) -> Result<JobLog, HttpError> {
        let query: Vec<(&str, String)> = [("since", since), ("bytes", bytes)]
            .into_iter()
            .filter_map(|(key, value)| Some((key, value?.to_string())))
            .collect();
        self.get(&["v1", "jobs", id, "logs"], &query)
    }

    /// `GET /v1/plugins`: the loaded plugins and the refused files.
    pub fn plugins(&self) -> Result<PluginList, HttpError> {
        self.get(&["v1", "plugins"], &[])
    }

    /// `POST /v1/verify`: the daemon grades `request.items` with its grader or reward, as the
    /// caller's team's job would (its secrets, the operator's outbound policy).
    pub fn verify(&self, request: &VerifyRequest) -> Result<VerifyResults, HttpError> {
        let body = serde_json::to_string(request).expect("a request serializes");
        self.call(Method::POST, self.url(&["v1", "verify"], &[]), Some(body))
    }

    /// `POST /v1/graders/validate`: the grader or reward checked as a submit would, run nothing.
    pub fn validate_graders(&self, request: &VerifyRequest) -> Result<GradersValid, HttpError> {
        let body = serde_json::to_string(request).expect("a request serializes");
        self.call(Method::POST, self.url(&["v1", "graders", "validate"], &[]), Some(body))
    }

    /// `GET /healthz`.
    pub fn health(&self) -> Result<Health, HttpError> {
        self.get(&["healthz"], &[])
    }

    /// `POST /v1/curricula/{name}/refresh`: the day's refresh of a shared curriculum, run once
    /// however many ask.
    pub fn curriculum_refresh(&self, name: &str) -> Result<Refreshed, HttpError> {
        self.call(Method::POST, self.url(&["v1", "curricula", name, "refresh"], &[]), None)
    }

    /// `GET /v1/curricula`: the team's curricula and those shared with it.
    pub fn curricula(&self) -> Result<CurriculumList, HttpError> {
        self.get(&["v1", "curricula"], &[])
    }

    /// `PUT /v1/curricula/{name}`: the teams the team shares its curriculum `name` with (replacing
    /// the list); the list as stored.
    pub fn share_curriculum(&self, name: &str, readers: &[String]) -> Result<CurriculumUpdate, HttpError> {
        let url = self.url(&["v1", "curricula", name], &[]);
        let body = serde_json::to_string(&CurriculumUpdate { readers: readers.to_vec() })
            .map_err(|error| HttpError::Request { url: url.to_string(), detail: error.to_string() })?;
        let response = self.send(&url, || {
            self.request(Method::PUT, &url).header(CONTENT_TYPE, "application/json").body(body.clone())
        })?;
        Ok(self.read(&url, response)?.1)
    }

    /// `PUT /v1/datasets/{name}`: `content` (JSONL) becomes the team's dataset `name`.
    pub fn put_dataset(&self, name: &str, content: &[u8]) -> Result<Dataset, HttpError> {
        self.send_dataset(name, content, &[])
    }

    /// `PUT /v1/datasets/{name}?dry_run=true`: the content checked and kept for a dry run's spec
    /// to cite (`dataset:NAME@SHA256`); no name of the team moves.
    pub fn check_dataset(&self, name: &str, content: &[u8]) -> Result<Dataset, HttpError> {
        self.send_dataset(name, content, &[("dry_run", "true".to_owned())])
    }

    fn send_dataset(
        &self,
        name: &str,
        content: &[u8],
        query: &[(&str, String)],
    ) -> Result<Dataset, HttpError> {
        let url = self.url(&["v1", "datasets", name], query);
        let response = self.send(&url, || {
            self.request(Method::PUT, &url)
                .header(CONTENT_TYPE, "application/x-ndjson")
                .body(content.to_vec())
        })?;
        Ok(self.read(&url, response)?.1)
    }

    /// `GET /v1/datasets`: the team's datasets.
    pub fn datasets(&self) -> Result<DatasetList, HttpError> {
        self.get(&["v1", "datasets"], &[])
    }

    /// `DELETE /v1/datasets/{name}`.
    pub fn delete_dataset(&self, name: &str) -> Result<(), HttpError> {
        let url = self.url(&["v1", "datasets", name], &[]);
        self.send(&url, || self.request(Method::DELETE, &url))?;
        Ok(())
    }

    /// `GET /v1/model-lines`: the lines the team owns or was granted.
    pub fn model_lines(&self) -> Result<ModelLineList, HttpError> {
        self.get(&["v1", "model-lines"], &[])
    }

    /// `GET /v1/model-lines/{name}`.
    pub fn model_line(&self, name: &str) -> Result<ModelLine, HttpError> {
        self.get(&["v1", "model-lines", name], &[])
    }

    /// `GET /v1/model-lines/{name}/versions/{version}`: a published version's manifest (the
    /// newest when `version` is `None`).
    pub fn manifest(&self, line: &str, version: Option<u64>) -> Result<Manifest, HttpError> {
        let version = version.map_or_else(|| "latest".to_owned(), |number| number.to_string());
        self.get(&["v1", "model-lines", line, "versions", &version], &[])
    }

    /// `GET /v1/model-lines/{name}/versions/{version}/files/{file}`: streams one file of a
    /// published version into `sink`; its bytes are the caller's to check against the manifest.
    pub fn download_file(
        &self,
        line: &str,
        version: u64,
        file: &str,
        sink: &mut dyn std::io::Write,
    ) -> Result<u64, HttpError> {
        let url =
            self.url(&["v1", "model-lines", line, "versions", &version.to_string(), "files", file], &[]);
        let mut response = self.send(&url, || self.request(Method::GET, &url))?;
        response
            .copy_to(sink)
            .map_err(|error| HttpError::Unreachable { url: url.to_string(), detail: reqwest_detail(&error) })
    }

    /// `PUT /v1/model-lines/{name}`: creates the line for the team or changes it.
    pub fn put_model_line(&self, name: &str, update: &ModelLineUpdate) -> Result<ModelLine, HttpError> {
        let url = self.url(&["v1", "model-lines", name], &[]);
        let body = serde_json::to_string(update)
            .map_err(|error| HttpError::Request { url: url.to_string(), detail: error.to_string() })?;
        let response = self.send(&url, || {
            self.request(Method::PUT, &url).header(CONTENT_TYPE, "application/json").body(body.clone())
        })?;
        Ok(self.read(&url, response)?.1)
    }

    /// Uploads the local files a spec's data fields name (anything but `dataset:…` and
    /// `root:…`, read relative to `base_dir`) as the team's datasets, named after each file, and
    /// returns the spec naming them pinned (`dataset:NAME@SHA256`), in the same format. What
    /// `rlvrctl submit` does, so a spec may keep naming files on the submitter's machine.
    pub fn upload_spec_data(
        &self,
        spec: &str,
        format: SpecFormat,
        base_dir: &std::path::Path,
    ) -> Result<String, SpecDataError> {
        crate::spec_data::upload(self, spec, format, base_dir, crate::spec_data::Upload::Named)
    }

    /// [`upload_spec_data`](Self::upload_spec_data) for a spec that is only checked (a dry run,
    /// an estimate): each file's content is checked and kept for the spec to cite, and no name of
    /// the team moves ([`check_dataset`](Self::check_dataset)).
    pub fn check_spec_data(
        &self,
        spec: &str,
        format: SpecFormat,
        base_dir: &std::path::Path,
    ) -> Result<String, SpecDataError> {
        crate::spec_data::upload(self, spec, format, base_dir, crate::spec_data::Upload::DryRun)
    }
}

/// A reqwest client with `config`'s identity and this timeout (see [`ClientConfig::timeout`]).
fn build(config: &ClientConfig, timeout: Duration) -> Result<reqwest::blocking::Client, HttpError> {
    // reqwest is built without a TLS provider (see the root Cargo.toml): one must be installed
    // before the first client, or reqwest panics.
    rlvr_startup::install_crypto_provider();
    reqwest::blocking::Client::builder()
        .user_agent(config.user_agent.clone())
        .connect_timeout(config.connect_timeout)
        .timeout(timeout)
        .build()
        .map_err(|error| HttpError::Setup { detail: reqwest_detail(&error) })
}

/// A success of another status than the route's is another daemon's answer.
fn expect_status(url: &Url, got: StatusCode, expected: StatusCode) -> Result<(), HttpError> {
    if got == expected {
        Ok(())
    } else {
        Err(HttpError::BadAnswer { url: url.to_string(), detail: format!("expected {expected}, got {got}") })
    }
}

/// The server's URL with these path segments (each percent-encoded) and query pairs.
fn api_url(server: &Url, segments: &[&str], query: &[(&str, String)]) -> Url {
    let mut url = server.clone();
    url.set_query(None);
    url.set_fragment(None);
    if let Ok(mut path) = url.path_segments_mut() {
        path.pop_if_empty().extend(segments);
    }
    if !query.is_empty() {
        url.query_pairs_mut().extend_pairs(query);
    }
    url
}

/// How long a 429 or 503 answer asks us to wait, when it says (in seconds).
fn busy_wait(response: &Response) -> Option<Duration> {
    if !matches!(response.status(), StatusCode::TOO_MANY_REQUESTS | StatusCode::SERVICE_UNAVAILABLE) {
        return None;
    }
    let seconds: u64 = response.headers().get(RETRY_AFTER)?.to_str().ok()?.trim().parse().ok()?;
    Some(Duration::from_secs(seconds))
}

/// Whether `request` may reach the daemon twice with one effect: by its method (RFC 9110 §9.2.2)
/// or its `Idempotency-Key`.
fn may_send_twice(request: &reqwest::blocking::Request) -> bool {
    matches!(*request.method(), Method::GET | Method::HEAD | Method::PUT | Method::DELETE)
        || request.headers().contains_key("idempotency-key")
}

/// Whether `error` ended the request before any answer began, on a connection that had been
/// made (hyper's "connection closed before message completed" among them); not a timeout, which
/// may have left the daemon working on it.
fn closed_before_answering(error: &reqwest::Error) -> bool {
    error.is_request() && !error.is_connect() && !error.is_timeout()
}

#[cfg(test)]
mod tests {
    use std::io::{BufRead, BufReader, Read, Write};
    use std::net::TcpListener;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;
    use crate::settings::Token;

    /// A server on 127.0.0.1 that answers each connection with the next of `answers` (status
    /// line, headers, body) and closes it; the thread returns each request's head and body.
    fn serve(answers: &[&str]) -> (Url, std::thread::JoinHandle<Vec<String>>) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = Url::parse(&format!("http://{}/", listener.local_addr().unwrap())).unwrap();
        let answers: Vec<String> = answers.iter().map(|answer| (*answer).to_owned()).collect();
        let thread = std::thread::spawn(move || {
            let mut requests = Vec::new();
            for answer in answers {
                let (stream, _) = listener.accept().unwrap();
                let mut reader = BufReader::new(stream);
                let (mut request, mut length) = (String::new(), 0);
                loop {
                    let mut line = String::new();
                    reader.read_line(&mut line).unwrap();
                    if let Some((name, value)) = line.split_once(':')
                        && name.eq_ignore_ascii_case("content-length")
                    {
                        length = value.trim().parse().unwrap();
                    }
                    request.push_str(&line);
                    if line == "\r\n" {
                        break;
                    }
                }
                let mut body = vec![0; length];
                reader.read_exact(&mut body).unwrap();
                request.push_str(&String::from_utf8_lossy(&body));
                requests.push(request.to_lowercase());
                // No answer at all: the connection closed as a kept-alive one the server dropped.
                if answer.is_empty() {
                    continue;
                }
                let (head, body) = answer.split_once("\n\n").unwrap_or((&answer, ""));
                let head = head.replace('\n', "\r\n");
                let text =
                    format!("{head}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}", body.len());
                reader.into_inner().write_all(text.as_bytes()).unwrap();
            }
            requests
        });
        (url, thread)
    }

    fn client(server: Url, config: ClientConfig) -> Client {
        Client::with_config(Settings::new(server, Some(Token::new("s3cret", "the test"))), config).unwrap()
    }

    static BUSY: AtomicUsize = AtomicUsize::new(0);

    #[test]
    fn busy_answers_are_waited_out_a_few_times_then_returned() {
        let busy = "HTTP/1.1 429 Too Many Requests\nretry-after: 0\ncontent-type: application/json\n\n\
                    {\"error\":{\"code\":\"rate_limited\",\"message\":\"slow down\"}}";
        let (server, requests) = serve(&[busy, busy, busy, busy]);
        let notice: fn(StatusCode, Duration) = |status, wait| {
            assert_eq!((status, wait), (StatusCode::TOO_MANY_REQUESTS, Duration::ZERO));
            BUSY.fetch_add(1, Ordering::SeqCst);
        };
        let config = ClientConfig { on_busy: Some(notice), ..ClientConfig::default() };
        let error = client(server, config).job("01J").unwrap_err();
        assert_eq!(requests.join().unwrap().len(), 4, "three retries, then the answer");
        assert_eq!(BUSY.load(Ordering::SeqCst), 3);
        assert_eq!(error.to_string(), "rate_limited: slow down");
        assert_eq!(
            (error.status(), error.retry_after()),
            (Some(StatusCode::TOO_MANY_REQUESTS), Some(Duration::ZERO))
        );

        // Without retries, the first busy answer is the error.
        let (server, requests) = serve(&[busy]);
        let error = client(server, ClientConfig { busy_retries: 0, ..ClientConfig::default() }).job("x");
        assert!(error.is_err() && requests.join().unwrap().len() == 1);
    }

    // regression: the submit benchmark's clients failed with "connection closed before message
    // completed" when the daemon closed a kept-alive connection as a request went out
    #[test]
    fn a_request_that_may_be_sent_twice_is_sent_again_when_its_connection_closed_unanswered() {
        let job = "HTTP/1.1 200 OK\n\n{\"id\":\"01J\",\"team\":\"t\",\"name\":\"n\",\"model_line\":\"l\",\
                   \"priority\":\"normal\",\"state\":\"queued\",\"step\":0,\"max_steps\":1,\"reason\":\"\",\
                   \"created_at\":\"\",\"updated_at\":\"\",\"crashes\":0,\"cancel_requested\":false}";
        let (server, requests) = serve(&["", job]);
        let view = client(server, ClientConfig::default()).job("01J").unwrap();
        assert_eq!(view.id, "01J");
        assert_eq!(requests.join().unwrap().len(), 2, "sent again once");

        let created = "HTTP/1.1 201 Created\n\n{\"id\":\"01J\",\"created\":true}";
        let (server, requests) = serve(&["", created]);
        let api = client(server, ClientConfig::default());
        assert!(api.submit("[job]\n", SpecFormat::Toml, Some("key-1")).unwrap().created);
        assert_eq!(requests.join().unwrap().len(), 2, "an idempotency key makes a submit safe to resend");

        // Without a key a submit might have been taken: it is not sent again, and says so.
        let (server, requests) = serve(&[""]);
        let error = client(server, ClientConfig::default()).submit("[job]\n", SpecFormat::Toml, None);
        assert!(matches!(error, Err(HttpError::Unreachable { .. })), "{error:?}");
        assert_eq!(requests.join().unwrap().len(), 1);

        // Twice unanswered: the second closing is the error.
        let (server, requests) = serve(&["", ""]);
        assert!(matches!(
            client(server, ClientConfig::default()).job("01J"),
            Err(HttpError::Unreachable { .. })
        ));
        assert_eq!(requests.join().unwrap().len(), 2);
    }

    #[test]
    fn a_submit_sends_the_spec_as_it_is_and_its_status_must_say_what_created_says() {
        let (server, requests) = serve(&[
            "HTTP/1.1 201 Created\n\n{\"id\":\"01J\",\"created\":true}",
            "HTTP/1.1 200 OK\n\n{\"id\":\"01J\",\"created\":true}",
        ]);
        let api = client(server, ClientConfig::default());
        let submitted = api.submit("[job]\nname = \"x\"\n", SpecFormat::Toml, Some("key-1")).unwrap();
        assert_eq!(submitted, Submitted { id: "01J".to_owned(), created: true });
        let error = api.submit("{}", SpecFormat::Json, None).unwrap_err();
        assert!(error.to_string().contains("expected 201 Created, got 200 OK"), "{error}");
        let requests = requests.join().unwrap();
        for header in ["post /v1/jobs http/1.1", "authorization: bearer s3cret", "idempotency-key: key-1"] {
            assert!(requests[0].contains(header), "{header}: {}", requests[0]);
        }
        assert!(
            requests[0].contains("content-type: application/toml") && requests[0].ends_with("name = \"x\"\n")
        );
        assert!(
            requests[1].contains("content-type: application/json") && !requests[1].contains("idempotency")
        );
    }

    #[test]
    fn error_bodies_are_the_daemons_or_made_from_the_status() {
        let (server, _requests) = serve(&[
            "HTTP/1.1 422 Unprocessable Entity\n\n\
             {\"error\":{\"code\":\"invalid_spec\",\"message\":\"expected 1\",\"field\":\"budget\"}}",
            "HTTP/1.1 502 Bad Gateway\ncontent-type: text/html\n\n<html>upstream down</html>",
            "HTTP/1.1 401 Unauthorized\n\n{\"error\":{\"code\":\"unauthorized\",\"message\":\"unknown token\"}}",
        ]);
        let api = client(server, ClientConfig::default());
        let check = |error: HttpError, text: &str, daemons: bool| {
            let HttpError::Status { from_daemon, .. } = &error else { panic!("{error:?}") };
            assert_eq!((error.to_string().as_str(), *from_daemon), (text, daemons));
        };
        check(api.cancel("a").unwrap_err(), "invalid_spec: budget: expected 1", true);
        check(api.plugins().unwrap_err(), "bad_gateway: <html>upstream down</html>", false);
        check(
            api.job("a").unwrap_err(),
            "unauthorized: unknown token\n  (the token came from the test)",
            true,
        );
    }

    /// What a [`crate::View`] was shown.
    #[derive(Default)]
    struct Shown(Vec<String>);

    impl crate::View for Shown {
        fn state(&mut self, event: &rlvr_protocol::job::JobEvent, _: &str) {
            self.0.push(format!("state {}", event.state));
        }
        fn progress(&mut self, job: &JobView, _: &str) {
            self.0.push(format!("progress {}", job.step));
        }
        fn reconnecting(&mut self, why: &str, wait: Duration) {
            self.0.push(format!("reconnecting: {why} ({} ms)", wait.as_millis()));
        }
        fn connected(&mut self) {
            self.0.push("connected".to_owned());
        }
    }

    #[test]
    fn following_resumes_after_the_last_complete_event_when_the_stream_drops() {
        let event = |id: &str, state: &str| {
            format!(
                "event: state\nid: {id}\ndata: {{\"id\":\"{id}\",\"at\":\"2026-11-21T12:00:01Z\",\
                 \"state\":\"{state}\",\"reason\":\"\",\"step\":0}}\n\n"
            )
        };
        let stream = "HTTP/1.1 200 OK\ncontent-type: text/event-stream\n\n";
        // The first stream ends after one event, in the middle of the next one.
        let first = format!("{stream}: keep-alive\n\n{}event: state\nid: 2-0\n", event("1-0", "running"));
        let second = format!("{stream}{}", event("3-0", "published"));
        let (server, requests) = serve(&[&first, &second]);
        let mut shown = Shown::default();
        let end = client(server, ClientConfig::default()).follow("01J", &mut shown).unwrap();
        assert_eq!(end.state, JobState::Published);
        assert_eq!(
            shown.0,
            [
                "connected",
                "state running",
                "reconnecting: the daemon closed the stream (500 ms)",
                "connected",
                "state published"
            ]
        );
        let requests = requests.join().unwrap();
        assert!(
            requests[0].starts_with("get /v1/jobs/01j/events ") && !requests[0].contains("last-event-id")
        );
        assert!(requests[1].contains("last-event-id: 1-0"), "{}", requests[1]);
        assert!(requests[1].contains("accept: text/event-stream"), "{}", requests[1]);
    }

    #[test]
    fn urls_encode_ids_and_keep_a_path_prefix() {
        let server = |server: &str| Url::parse(server).unwrap();
        let url = api_url(&server("http://h:1"), &["v1", "jobs", "a/b?c"], &[]);
        assert_eq!(url.as_str(), "http://h:1/v1/jobs/a%2Fb%3Fc");
        let query = [("team", "a b".to_owned()), ("limit", "5".to_owned())];
        let url = api_url(&server("https://h/rlvr/"), &["v1", "jobs"], &query);
        assert_eq!(url.as_str(), "https://h/rlvr/v1/jobs?team=a+b&limit=5");
        let query = JobQuery {
            team: Some("t".to_owned()),
            state: Some(JobState::Running),
            limit: Some(3),
            ..JobQuery::default()
        };
        assert_eq!(
            api_url(&server("http://h"), &["v1", "jobs"], &query.pairs()).as_str(),
            "http://h/v1/jobs?team=t&state=running&limit=3"
        );
    }
}
