//! The environment's dry-run, so a team sees what a multi-turn job will train on before it spends
//! a device hour: `POST /v1/env/check` plays an `[env]` spec's first episodes (its first training
//! records) with its policy against its environment, sampled as its rollouts are, and answers each
//! as spans — the prompt, the model's turns (trained on), the environment's replies (masked out) —
//! with how it ended and the environment's rewards. `rlvrctl env check SPEC` prints it.
//!
//! The spec is checked as a submit checks it (names resolved in the team's namespace, `env.url`
//! under the outbound policy, an installed `env.environment`), then a worker process plays the
//! episodes (`rlvr-worker env-check`, the spec resolved to the server's paths, the team's outbound
//! policy on its stdin, an installed environment started as its sandboxed sidecar) on the CPU, with
//! `queue.worker_threads` libtorch threads and no device grant: a check is a few episodes.
//!
//! Why a worker process and not the daemon's: the policy is a libtorch model (the daemon loads
//! none), and an environment that hangs or a model that is slow to load costs that process, never
//! the daemon. What one request may cost is bounded as a grader dry-run's is: a place in the
//! team's lane of dry-runs (`api.dry_runs_per_team`, `api.dry_runs_at_once`), at most
//! [`MAX_CHECK_EPISODES`] episodes, and `api.dry_run_budget_s`, past which the process is killed;
//! a client that goes away kills it at once (and its sidecar with it).

use std::path::PathBuf;
use std::process::Stdio;
use std::sync::Arc;

use axum::Json;
use axum::body::Body;
use axum::extract::{Extension, Query, State};
use axum::http::{HeaderMap, StatusCode};
use rlvr_plugin_host::child::ChildOutput;
use rlvr_protocol::env::{EnvCheck, MAX_CHECK_EPISODES};
use rlvr_protocol::job::ErrorBody;
use rlvr_protocol::spec::{JobSpec, SpecError};
use rlvr_protocol::worker::{EnvCheckArgs, HostContext};
use serde::Deserialize;
use tokio::io::AsyncWriteExt;

use super::auth::Caller;
use super::failure::{Answer, Failure};
use super::jobs::{JobsState, read_spec};
use super::lanes::Lane;
use crate::jobs::submit::StandIn;

/// What an environment check runs: the worker and its libtorch threads.
#[derive(Debug, Clone)]
pub struct EnvChecks {
    /// The daemon's worker executable (`daemon.worker_exe`).
    pub worker: PathBuf,
    /// `queue.worker_threads`.
    pub threads: usize,
}

/// `POST /v1/env/check` options.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
pub struct CheckQuery {
    /// Episodes to play, one per training record from the first (1–8, default 2).
    #[serde(default = "default_episodes")]
    episodes: usize,
}

fn default_episodes() -> usize {
    2
}

/// `POST /v1/env/check`: plays an `[env]` spec's first episodes against its environment.
#[utoipa::path(
    post,
    path = "/v1/env/check",
    request_body(content = JobSpec, description = "The job spec with its [env] section, as JSON or as TOML with Content-Type: application/toml"),
    params(CheckQuery),
    responses(
        (status = 200, description = "Each episode as its spans, in order", body = EnvCheck),
        (status = 400, description = "Not a spec, or not a query", body = ErrorBody),
        (status = 401, body = ErrorBody), (status = 403, body = ErrorBody),
        (status = 413, body = ErrorBody),
        (status = 422, description = "A spec that cannot run here, or an environment that could not be played (each refusal names its field)", body = ErrorBody),
        (status = 429, description = "Too many dry-runs at once, over the daemon or the team's; retry", body = ErrorBody),
    ),
    security(("bearer" = [])),
    tag = "jobs"
)]
pub async fn check(
    State(state): State<Arc<JobsState>>,
    Extension(caller): Extension<Caller>,
    query: Result<Query<CheckQuery>, axum::extract::rejection::QueryRejection>,
    headers: HeaderMap,
    body: Body,
) -> Answer<Json<EnvCheck>> {
    let Query(query) = query
        .map_err(|rejection| Failure::new(StatusCode::BAD_REQUEST, "bad_query", rejection.body_text()))?;
    let refused = |field: &str, message: String| {
        Failure::spec(
            StatusCode::UNPROCESSABLE_ENTITY,
            "cannot_run",
            vec![SpecError { field: field.to_owned(), message }],
        )
    };
    if !(1..=MAX_CHECK_EPISODES).contains(&query.episodes) {
        return Err(refused(
            "episodes",
            format!("expected 1 to {MAX_CHECK_EPISODES} episodes, got {}", query.episodes),
        ));
    }
    let spec = read_spec(&state, &caller, &headers, body).await?;
    let Some(env) = spec.env.clone() else {
        return Err(refused(
            "env",
            "the spec has no [env] section: only a multi-turn job has an environment to check".into(),
        ));
    };
    let team = spec.job.team.clone();
    // Held until the process is gone: this handler's end, or its drop when the client goes away.
    let _ticket = state
        .dry_runs
        .try_take(Lane::Team(team.clone()))
        .map_err(|message| Failure::new(StatusCode::TOO_MANY_REQUESTS, "busy", message).retry(1))?;
    let pinned = state.submitter.check(spec, true, StandIn::Nothing).await?;
    let tenancy = state.tenancy.clone();
    let resolved =
        tokio::task::spawn_blocking(move || crate::tenancy::resolve::worker_spec(&tenancy, &pinned))
            .await
            .map_err(|error| Failure::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", error.to_string()))?
            .map_err(|message| {
                let (field, why) = message.split_once(": ").unwrap_or(("model.policy", &message));
                refused(field, why.to_owned())
            })?;
    let installed = match &env.environment {
        Some(name) => Some(
            crate::jobs::supervise::installed_environment(state.submitter.environments.as_ref(), name)
                .map_err(|message| refused("env.environment", message))?,
        ),
        None => None,
    };
    let internal = |what: &str, error: std::io::Error| {
        Failure::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", format!("{what}: {error}"))
    };
    let dir = tempfile::tempdir().map_err(|error| internal("a temporary directory", error))?;
    let spec_path = dir.path().join("spec.json");
    let spec_json = serde_json::to_vec(&*resolved)
        .map_err(|error| internal("the resolved spec", std::io::Error::other(error)))?;
    tokio::fs::write(&spec_path, spec_json).await.map_err(|error| internal("the resolved spec", error))?;
    let args = EnvCheckArgs {
        spec: spec_path,
        episodes: query.episodes,
        env_script: installed.as_ref().map(|(script, _)| script.clone()),
        env_python: installed.map(|(_, python)| python),
        json: true,
        threads: Some(state.env_checks.threads),
        exit_with_parent: Some(std::process::id()),
        host_context_stdin: true,
    };
    // The environment's reach is the team's outbound policy; the check runs no plugin, so it
    // is handed no secret.
    let policy = state.outbound.policy();
    let host = HostContext {
        outbound_allow: policy.entries().iter().map(ToString::to_string).collect(),
        outbound_allow_private: policy.allow_private(),
        ..HostContext::default()
    };
    let mut command = tokio::process::Command::new(&state.env_checks.worker);
    command
        .args(args.command_line())
        .env_clear()
        .envs(crate::jobs::supervise::worker_environment(std::env::vars_os(), &[], 0.0))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let mut child = command.spawn().map_err(|error| internal("cannot start the worker process", error))?;
    if let Some(mut stdin) = child.stdin.take() {
        let line = host.to_json() + "\n";
        // A worker that died before reading says why on stderr, read below.
        let _ = stdin.write_all(line.as_bytes()).await;
    }
    let budget = state.dry_run_budget;
    let output = tokio::time::timeout(budget, child.wait_with_output()).await.map_err(|_| {
        refused(
            "env",
            format!(
                "the check did not end within api.dry_run_budget_s ({} s): ask for fewer episodes or fewer \
                 turns, or look at the environment's speed",
                budget.as_secs()
            ),
        )
    })?;
    let output = output.map_err(|error| internal("the worker process", error))?;
    // The helper processes' one reading of an answer and of a failure (`plugin_host::child`).
    let output = ChildOutput {
        status: output.status,
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    };
    if output.status.success()
        && let Some(check) = output.last_line::<EnvCheck>()
    {
        return Ok(Json(check));
    }
    // The worker's refusal reads `rlvr-worker env-check: FIELD: why`.
    match output.stderr.lines().rev().find_map(|line| line.strip_prefix("rlvr-worker env-check: ")) {
        Some(said) => {
            let (field, why) = said.split_once(": ").unwrap_or(("env", said));
            Err(refused(field, why.to_owned()))
        }
        None => Err(Failure::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            format!("the environment check's worker ended: {}", output.describe()),
        )),
    }
}
