//! The cancel use case, for a team's request and for a pipeline's: a waiting job ends
//! `cancelled` at once, a running one is told to stop through the daemon that runs it. A job that
//! ends here has no supervision to apply its team's retention of ended records, so it is applied
//! here.

use rlvr_queue::store::{CancelOutcome, JobStore, StoreError};

use super::retention::{self, Retention};

/// Cancels job `id` of `team` with `reason` (its record's reason and event).
pub async fn cancel(
    store: &JobStore,
    retention: &Retention,
    id: &str,
    team: &str,
    reason: &str,
) -> Result<CancelOutcome, StoreError> {
    let outcome = store.cancel(id, reason).await?;
    match &outcome {
        CancelOutcome::Cancelled => {
            tracing::info!(job = %id, %reason, "cancelled");
            let (store, retention, team) = (store.clone(), retention.clone(), team.to_owned());
            tokio::spawn(async move { retention::sweep_team(&store, &retention, &team).await });
        }
        CancelOutcome::Requested => tracing::info!(job = %id, %reason, "cancel asked of its worker"),
        CancelOutcome::AlreadyEnded(_) => {}
    }
    Ok(outcome)
}
