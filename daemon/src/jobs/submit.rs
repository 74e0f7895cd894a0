//! The submit use case: a valid spec checked for what it needs beyond itself, then recorded as a
//! job and its dispatch task pushed. `POST /v1/jobs` (and its dry run), a pipeline's submit (each
//! stage checked) and a pipeline's driver (each stage's job made when its turn comes) all go
//! through [`Submitter`]; the API only turns a [`SubmitError`] into its status.
//!
//! `check`: the spec's `checks`, the engine this daemon has, the data's records, the graders, the
//! memory estimate, `tenancy::resolve::admit`; then `create`: the team's queue limit, the record, the
//! dispatch task. A [`SubmitError::Refused`] says whether one of its problems is a permission the
//! team lacks (403) rather than a spec that cannot run (422).

use std::path::PathBuf;
use std::sync::Arc;

use rlvr_plugin_host::Registry;
use rlvr_protocol::engine::{EngineKind, Launcher};
use rlvr_protocol::names::PinnedSpec;
use rlvr_protocol::spec::{JobSpec, RolloutEngine, SpecError};
use rlvr_queue::dispatch::new_task_id;
use rlvr_queue::store::{StoreError, SubmitOutcome};

use super::checks::{self, CheckedRecords};
use super::{Queues, estimate};
use crate::sched::service::Scheduler;
use crate::tenancy::Tenancy;
use crate::tenancy::resolve::{self, NotAdmitted};

/// What a submit needs of the daemon.
pub struct Submitter {
    pub queues: Queues,
    pub registry: Arc<Registry>,
    pub scheduler: Arc<Scheduler>,
    pub tenancy: Arc<Tenancy>,
    /// Its policy decides which URLs a spec may name.
    pub outbound: rlvr_outbound::Client,
    /// `engines.trl_python`: whether `[engine] kind = "trl"` jobs can run here.
    pub trl_python: Option<PathBuf>,
    /// `engines.vllm_python`: whether `[rollout] engine = "vllm"` jobs can run here.
    pub vllm_python: Option<PathBuf>,
    /// `engines.ray_address`: whether `launcher = "ray"` jobs can run here.
    pub ray_address: Option<String>,
    /// `engines.ray_python`: whether jobs on more than one node can run here.
    pub ray_python: Option<PathBuf>,
    /// `engines.environments` and `engines.environments_python`: the installed `[env]`
    /// environments.
    pub environments: Option<(PathBuf, PathBuf)>,
    /// Dataset contents read through already ([`checks::data_problems`]).
    pub checked_records: Arc<CheckedRecords>,
    /// Ended jobs' records a team keeps: applied when a cancel ends a job ([`super::cancel`]).
    pub retention: super::retention::Retention,
}

/// What in a spec only stands in for what an earlier pipeline stage will make (and so is not
/// read through at submit).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StandIn {
    Nothing,
    /// `data.train`: the previous stage's dataset will be the real one.
    TrainData,
}

/// A spec's problems beyond itself, as submit found them.
#[derive(Debug)]
pub struct Refusal {
    /// Every problem, the first in front; never empty.
    pub problems: Vec<SpecError>,
    /// One of them is a permission the team lacks (a priority, a model line), not a spec that
    /// cannot run.
    pub forbidden: bool,
}

/// Why a submit made no job.
#[derive(Debug, thiserror::Error)]
pub enum SubmitError {
    #[error("{}", .0.problems.first().map(ToString::to_string).unwrap_or_default())]
    Refused(Refusal),
    #[error(
        "team {team} has {waiting} jobs waiting, its limit (tenancy.max_queued_per_team or its [[tenancy.teams]] entry); \
         submit again when one starts"
    )]
    QueueFull { team: String, waiting: usize },
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The checks' thread ended without an answer (it panicked).
    #[error("the submit checks failed: {0}")]
    Internal(String),
}

impl SubmitError {
    /// Whether the same submit may succeed later: a full queue, Redis away, a fault of ours.
    pub fn is_transient(&self) -> bool {
        match self {
            SubmitError::Refused(_) => false,
            SubmitError::QueueFull { .. } | SubmitError::Internal(_) => true,
            SubmitError::Store(error) => {
                !matches!(error, StoreError::NotFound(_) | StoreError::Conflict { .. })
            }
        }
    }
}

impl Submitter {
    /// What a submit checks of a valid spec of the caller's team beyond the spec itself: plugins
    /// and their options, secrets, files, resources (filled from the estimate when the spec
    /// leaves them out), and the names it writes resolved in the team's namespace. Returns the
    /// spec as the job record keeps it (names pinned). A `dry_run` claims no model line: a
    /// pipeline's later stages are checked so at the pipeline's submit. The records of every data
    /// file are read as the job will read them, but for a `data.train` that only `stands_in` for
    /// the dataset an earlier pipeline stage will make.
    pub async fn check(
        self: &Arc<Self>,
        spec: JobSpec,
        dry_run: bool,
        stands_in: StandIn,
    ) -> Result<PinnedSpec, SubmitError> {
        // Reads files and the registry, and may wait for a worker process asking an optimizer
        // about its options: off the async threads.
        let submitter = self.clone();
        tokio::task::spawn_blocking(move || submitter.check_blocking(spec, dry_run, stands_in))
            .await
            .map_err(|error| SubmitError::Internal(error.to_string()))?
            .map_err(SubmitError::Refused)
    }

    fn check_blocking(
        &self,
        spec: JobSpec,
        dry_run: bool,
        stands_in: StandIn,
    ) -> Result<PinnedSpec, Refusal> {
        let (registry, tenancy, scheduler) = (&self.registry, &self.tenancy, &self.scheduler);
        let mut checked = spec;
        let mut problems = match checks::check_runnable(&checked, registry, scheduler, self.outbound.policy())
        {
            // The secrets the options name must be the team's.
            Ok(refs) => tenancy.ungranted_secrets(&checked.job.team, &refs.secrets),
            Err(problems) => problems,
        };
        problems.extend(self.engine_problems(&checked));
        if problems.is_empty() {
            let skipped: &[&str] = match stands_in {
                StandIn::Nothing => &[],
                StandIn::TrainData => &["data.train"],
            };
            problems = checks::data_problems(&checked, registry, tenancy, &self.checked_records, skipped);
        }
        if problems.is_empty() {
            match tenancy.host_context(&checked.job.team, self.outbound.policy()) {
                Ok(host) => problems = checks::grader_problems(&checked, registry, &host),
                // The operator's to fix (the daemon's log says which secret); the worker meets it.
                Err(message) => {
                    tracing::warn!(team = %checked.job.team, %message, "no host context to check the graders with")
                }
            }
        }
        if problems.is_empty()
            && let Err(problem) = estimate::fill_at_submit(&mut checked, tenancy, registry, scheduler)
        {
            problems.push(problem);
        }
        // The model line is claimed only for a job that is otherwise taken: a refused submit
        // leaves nothing behind.
        match resolve::admit(tenancy, &checked, dry_run || !problems.is_empty()) {
            Ok(pinned) if problems.is_empty() => Ok(pinned),
            Ok(_) => Err(Refusal { problems, forbidden: false }),
            Err(NotAdmitted { problems: more, forbidden }) => {
                problems.extend(more);
                Err(Refusal { problems, forbidden })
            }
        }
    }

    /// An engine job's engine or launcher this daemon has not got.
    fn engine_problems(&self, spec: &JobSpec) -> Vec<SpecError> {
        let mut problems = Vec::new();
        if spec.engine.kind == EngineKind::Trl && self.trl_python.is_none() {
            problems.push(SpecError {
                field: "engine.kind".to_owned(),
                message: "this daemon runs no trl engine (its engines.trl_python is not set)".to_owned(),
            });
        }
        // A trl job's vLLM is TRL's own, colocated in its ranks on CUDA devices, from the trl
        // environment; a native job's is the worker's server, from engines.vllm_python.
        if spec.rollout.engine == RolloutEngine::Vllm {
            if spec.engine.kind == EngineKind::Trl {
                if self.scheduler.device_kind() != rlvr_protocol::memory::DeviceKind::Cuda {
                    problems.push(SpecError {
                        field: "rollout.engine".to_owned(),
                        message:
                            "TRL runs vLLM colocated on CUDA devices only, and this daemon schedules CPU \
                                  slots: leave it out (TRL then generates itself)"
                                .to_owned(),
                    });
                }
            } else if self.vllm_python.is_none() {
                problems.push(SpecError {
                    field: "rollout.engine".to_owned(),
                    message: "this daemon runs no vLLM (its engines.vllm_python is not set)".to_owned(),
                });
            }
        }
        if let Some(name) = spec.env.as_ref().and_then(|env| env.environment.as_ref())
            && let Err(message) = super::supervise::installed_environment(self.environments.as_ref(), name)
        {
            let (field, message) =
                message.split_once(": ").map_or(("env.environment", message.as_str()), |(f, m)| (f, m));
            problems.push(SpecError { field: field.to_owned(), message: message.to_owned() });
        }
        if spec.engine.is_engine() && spec.engine.launcher == Launcher::Ray && self.ray_address.is_none() {
            problems.push(SpecError {
                field: "engine.launcher".to_owned(),
                message: "this daemon knows no Ray cluster (its engines.ray_address is not set)".to_owned(),
            });
        }
        if spec.engine.is_engine() && spec.resources.nodes > 1 && self.ray_python.is_none() {
            problems.push(SpecError {
                field: "resources.nodes".to_owned(),
                message: "a job on more than one node is launched by Ray's python on the cluster, and this \
                          daemon's engines.ray_python is not set"
                    .to_owned(),
            });
        }
        problems
    }

    /// Creates job `id` of a checked `spec` (its team's queue limit allowing) and pushes its
    /// task; or finds the job `id` or `idempotency_key` made before, creating nothing.
    pub async fn create(
        &self,
        id: &str,
        spec: &PinnedSpec,
        idempotency_key: Option<&str>,
    ) -> Result<SubmitOutcome, SubmitError> {
        let team = &spec.job.team;
        let allowance = self.tenancy.allowance(team);
        let waiting = self.queues.store.waiting(team, allowance.max_queued as usize + 1).await?;
        if waiting >= allowance.max_queued as usize {
            return Err(SubmitError::QueueFull { team: team.clone(), waiting });
        }
        // Its optimizer was found at the check: only a plugin removed since leaves it kindless.
        let kind = checks::job_kind(spec, &self.registry).ok_or_else(|| {
            SubmitError::Refused(Refusal {
                problems: vec![SpecError {
                    field: "optimizer.plugin".to_owned(),
                    message: format!("{} is not loaded here (any more)", spec.optimizer.plugin),
                }],
                forbidden: false,
            })
        })?;
        let task_id = new_task_id();
        let outcome = self.queues.store.submit(id, &task_id, spec, kind, idempotency_key).await?;
        if let SubmitOutcome::Created { id, task_id } = &outcome {
            // The record holds the task id: if this push fails, the daemon's sweep pushes it.
            if let Err(error) = self.queues.enqueue(id, task_id, spec.job.priority).await {
                tracing::warn!(job = %id, %error, "dispatch push failed; the recovery sweep will push it");
            }
            tracing::info!(job = %id, team = %spec.job.team, name = %spec.job.name, "job submitted");
        }
        Ok(outcome)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_what_may_pass_later_is_transient() {
        let refused = SubmitError::Refused(Refusal {
            problems: vec![SpecError { field: "job.priority".into(), message: "no".into() }],
            forbidden: true,
        });
        assert!(!refused.is_transient());
        assert_eq!(refused.to_string(), "job.priority: no");
        assert!(SubmitError::QueueFull { team: "a".into(), waiting: 3 }.is_transient());
        assert!(SubmitError::Internal("panicked".into()).is_transient());
        assert!(!SubmitError::Store(StoreError::NotFound("j".into())).is_transient());
    }
}
