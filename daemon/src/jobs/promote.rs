//! The promotion use case: an admin publishes a candidate its gates refused, over them, through
//! the one publish path ([`publish`]) a finished job takes; who, why and when go into the
//! manifest's `gates.forced` and the job's reason. `POST /v1/jobs/{id}/promote` calls it and
//! turns each [`PromoteError`] into its status.

use std::sync::Arc;

use rlvr_protocol::gates::Forced;
use rlvr_protocol::job::{JobState, JobView};
use rlvr_protocol::worker::Outcome;
use rlvr_queue::store::StoreError;

use super::Queues;
use super::publish::{self, Verdict};
use crate::tenancy::Tenancy;

/// Longest promotion reason kept (it goes into the manifest and the job's reason).
pub const MAX_REASON: usize = 2000;

/// Who asks for a promotion, and why.
#[derive(Debug, Clone)]
pub struct Promotion<'a> {
    /// The asking token's team.
    pub team: &'a str,
    /// Whether the token is an admin's: only an admin promotes.
    pub admin: bool,
    /// The request says it overrides the gates.
    pub force: bool,
    pub reason: &'a str,
}

/// Why a promotion did not publish.
#[derive(Debug, thiserror::Error)]
pub enum PromoteError {
    /// Not an admin's token: a permission refusal.
    #[error("promoting over the gates needs an admin token; team {team}'s is not one")]
    NotAdmin { team: String },
    #[error("a promotion overrides the gates: expected force = true")]
    NotForced,
    #[error("expected a reason of 1 to {MAX_REASON} characters: it is recorded in the manifest")]
    Reason,
    /// Only a refused job has a candidate to promote.
    #[error("job {id} is {state}: only a candidate the gates refused can be promoted")]
    NotRefused { id: String, state: JobState },
    #[error("job {id} has no candidate")]
    NoCandidate { id: String },
    #[error("{0}")]
    Publish(String),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// What a promotion of `job` may go on with: its trimmed reason and the candidate; or why not, in
/// the order a caller hears it (permission first).
fn allowed<'a>(job: &JobView, promotion: &Promotion<'a>) -> Result<(&'a str, Outcome), PromoteError> {
    if !promotion.admin {
        return Err(PromoteError::NotAdmin { team: promotion.team.to_owned() });
    }
    if !promotion.force {
        return Err(PromoteError::NotForced);
    }
    let reason = promotion.reason.trim();
    if reason.is_empty() || reason.chars().count() > MAX_REASON {
        return Err(PromoteError::Reason);
    }
    if job.state != JobState::Refused {
        return Err(PromoteError::NotRefused { id: job.id.clone(), state: job.state });
    }
    let outcome = job.result.clone().ok_or_else(|| PromoteError::NoCandidate { id: job.id.clone() })?;
    Ok((reason, outcome))
}

/// Publishes refused job `job`'s candidate over its gates for `promotion`; the job as it is then.
/// The webhook, if the job names one, is delivered in the background: the job is published
/// whatever its answer.
pub async fn promote(
    queues: &Queues,
    tenancy: &Arc<Tenancy>,
    outbound: &rlvr_outbound::Client,
    job: &JobView,
    promotion: Promotion<'_>,
) -> Result<JobView, PromoteError> {
    let (reason, outcome) = allowed(job, &promotion)?;
    let id = job.id.as_str();
    let spec = queues.store.spec(id).await?;
    let forced = Forced {
        by: promotion.team.to_owned(),
        reason: reason.to_owned(),
        at: humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string(),
    };
    let (tenancy, spec2, id2) = (tenancy.clone(), spec.clone(), id.to_owned());
    let verdict = tokio::task::spawn_blocking(move || {
        publish::gate_and_publish(&spec2, &id2, &outcome, &tenancy.lines, Some(forced))
    })
    .await
    .map_err(|error| PromoteError::Publish(format!("publishing panicked: {error}")))?
    .map_err(|error| PromoteError::Publish(error.to_string()))?;
    let Verdict::Published(published) = verdict else {
        return Err(PromoteError::Publish("a forced promotion was refused".to_owned()));
    };
    let why = format!(
        "promoted by admin team {} over the gates ({reason}); published {} version {} at {}",
        promotion.team,
        spec.job.model_line,
        published.version,
        published.path.display()
    );
    publish::record(&queues.store, id, &published, &why).await?;
    tracing::warn!(job = %id, by = %promotion.team, %reason, version = published.version, "promoted over the gates");
    let (store, outbound, hook_id) = (queues.store.clone(), outbound.clone(), id.to_owned());
    tokio::spawn(async move {
        publish::deliver_webhook(&store, &outbound, &hook_id, &spec, &published).await;
    });
    Ok(queues.store.get(id).await?)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(state: JobState, candidate: bool) -> JobView {
        let text = format!(
            r#"{{"id": "j1", "team": "math", "name": "n", "model_line": "l", "priority": "normal",
                "state": "{state}", "step": 3, "max_steps": 3, "reason": "", "created_at": "",
                "updated_at": "", "crashes": 0, "cancel_requested": false}}"#
        );
        let mut job: JobView = serde_json::from_str(&text).unwrap();
        job.result = candidate.then(Outcome::default);
        job
    }

    // Each refusal, in the order a caller hears it: a token that may not promote is told so
    // whatever else is wrong.
    #[test]
    fn a_promotion_is_refused_for_the_first_thing_wrong_permission_first() {
        let promotion = |admin, force, reason| Promotion { team: "ops", admin, force, reason };
        let long = "x".repeat(MAX_REASON + 1);
        let cases: [(JobView, Promotion, &str); 7] = [
            (job(JobState::Running, false), promotion(false, false, ""), "NotAdmin"),
            (job(JobState::Refused, true), promotion(true, false, "why"), "NotForced"),
            (job(JobState::Refused, true), promotion(true, true, "  "), "Reason"),
            (job(JobState::Refused, true), promotion(true, true, &long), "Reason"),
            (job(JobState::Published, true), promotion(true, true, "why"), "NotRefused"),
            (job(JobState::Refused, false), promotion(true, true, "why"), "NoCandidate"),
            (job(JobState::Refused, true), promotion(true, true, " why "), "allowed"),
        ];
        for (job, promotion, expected) in cases {
            let got = match allowed(&job, &promotion) {
                Ok((reason, _)) => {
                    assert_eq!(reason, "why");
                    "allowed".to_owned()
                }
                Err(error) => format!("{error:?}").split([' ', '{', '(']).next().unwrap().to_owned(),
            };
            assert_eq!(got, expected, "{:?} {promotion:?}", job.state);
        }
    }
}
