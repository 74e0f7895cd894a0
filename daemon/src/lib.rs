//! The control plane, `rlvrd serve`: the HTTP API, the queue consumer and the supervision of
//! each job's worker process, the scheduler, the gates and publishing, the shared curricula.
//! It never touches a tensor: this crate does not depend on libtorch, and its plugin registry
//! only probes optimizer plugins in a worker process (see ARCHITECTURE.md).
//!
//! `main` is thin: it parses arguments and calls into here, so the whole server runs in-process
//! in tests.
//!
//! # Code map
//!
//! **Pure**: no IO, no clock.
//!
//! - `bin/rlvrd.rs`: the subcommands. [`serve`]: `run` — start, main loop, drain.
//! - [`state_dir`]: the state directory's layout. [`doctor`], [`metrics`], [`health`].
//! - [`config`]: `fields.rs` the one field table, `check.rs`, `layers.rs`, `example.rs`.
//! - [`curricula`]: a team's curriculum refreshed into version N+1.
//! - [`arith`]: the built-in model's synthetic data.
//! - [`jobs`]: the job use cases, which the API and the pipelines call; nothing here imports
//!   `api/`: `submit.rs` (`Submitter`, `SubmitError`), `cancel.rs`, `promote.rs`
//!   (`PromoteError`). Beside them: `checks.rs` (what submit checks beyond the spec),
//!   `estimate.rs` (the memory estimate's IO edge), `consumer.rs` (apalis workers per priority,
//!   the recovery sweep), `supervise.rs` (one job from its task to an end or a requeue),
//!   `out_of_memory.rs` (**pure**: the one larger requeue), `gate.rs` (**pure**: `judge`),
//!   `paired.rs` (**pure**: the held-out gain's bootstrap interval), `publish.rs` (the one
//!   publish path, a finished job's and a promotion's), `dataset_output.rs` (a
//!   rejection-sampling job's dataset judged and published), `webhook.rs`, `mlflow.rs`
//!   (`[tracking]`), `tokens.rs` (engine ranks' tokens), `cluster.rs` (a Ray engine job's cluster
//!   job stopped once its worker is gone), `retention.rs` (how long ended jobs' records stay).
//! - [`tenancy`] (SECURITY.md): `mod.rs` (`Tenancy`), `resolve.rs` (`admit` at submit,
//!   `worker_spec` at the first spawn), `datasets.rs` (content-addressed, per team), `sweep.rs`
//!   (the datasets' sweep), `lines.rs` (model lines with owners), `curricula.rs` (who may start
//!   from a curriculum), `shown.rs` (**pure**: server paths replaced by names in what a team
//!   reads).
//! - [`pipelines`]: `next.rs` (**pure**: one action out) and `drive.rs` (every running pipeline,
//!   read from Redis each tick).
//! - [`tinker`] (the Tinker front door's training clients): `order.rs` (**pure**: a client's
//!   requests in `seq_id` order, each run once), `futures.rs` (each operation's future, a poll
//!   held until it ends), `clients.rs` (each client a task: queued with the scheduler, its
//!   `rlvr-worker tinker-client` process fed in order, preempted and parked by suspend/resume,
//!   restarted from its last checkpoint with the state-changing requests since replayed),
//!   `samplers.rs` (which process serves each sampler, with which adapter). Sessions live in
//!   Redis (`rlvr-queue`'s `tinker.rs`).
//! - [`sched`] (design.md §7): `inventory.rs` (devices found once; names meet UUIDs),
//!   `policy.rs` (**pure**: admission, packing, fair share, quotas, preemption, grant order;
//!   `policy_tests.rs` its scripts), `service.rs` (the live driver: seats and the grant socket),
//!   `simulate.rs` (`rlvrd simulate`). The worker's side of grants is `worker/src/grants.rs`.
//! - [`api`] (axum): `mod.rs` (router, the open routes, `ApiDoc`), `server.rs` (the HTTP/1.1
//!   accept loop, connection limit, timeouts), `auth.rs` (`require_token`), `jobs.rs`,
//!   `pipelines.rs`, `follow.rs` (one Redis reader per followed job), `logs.rs`, `tenancy.rs`
//!   (datasets, model lines), `curricula.rs`, `outcomes.rs` (promotion, metrics history),
//!   `verify.rs` (the graders' dry-run), `env_check.rs` (an `[env]` spec's episodes played by a
//!   `rlvr-worker env-check` process), `tinker.rs` (the Tinker SDK's routes under `/api/v1`, keys
//!   from `X-API-Key`), `lanes.rs` (per-team places for long work), `ui.rs` (the page at `/ui`).
pub mod api;
pub mod arith;
pub mod config;
pub mod curricula;
pub mod doctor;
pub mod health;
pub mod jobs;
pub mod metrics;
pub mod pipelines;
pub mod sched;
pub mod serve;
pub mod state_dir;
pub mod tenancy;
pub mod tinker;

#[cfg(test)]
mod layering {
    use std::path::Path;

    /// Every `.rs` file under `dir`, with its text.
    fn sources(dir: &Path) -> Vec<(String, String)> {
        let mut files = Vec::new();
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                files.extend(sources(&path));
            } else if path.extension().is_some_and(|ext| ext == "rs") {
                files.push((path.display().to_string(), std::fs::read_to_string(&path).unwrap()));
            }
        }
        files
    }

    // The use cases (jobs, pipelines) and the policies under them are called by the HTTP layer,
    // never the other way round: a use case that reached into `api` would answer in statuses.
    #[test]
    fn nothing_under_the_http_layer_imports_from_it() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        for layer in ["jobs", "pipelines", "tenancy", "sched", "tinker"] {
            for (file, text) in sources(&root.join(layer)) {
                for (number, line) in text.lines().enumerate() {
                    let code = line.split("//").next().unwrap_or_default();
                    assert!(
                        !code.contains("crate::api") && !code.contains("super::super::api"),
                        "{file}:{}: {line}",
                        number + 1
                    );
                }
            }
        }
    }
}
