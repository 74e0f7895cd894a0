//! The datasets' sweep: what each team's unfinished jobs, running pipelines and published
//! versions cite is read — jobs and pipelines from Redis, then manifests from the registry — and
//! handed to [`Datasets::sweep`](super::Datasets::sweep), which deletes the team's content that
//! no name points at, nothing cites and nothing used within the grace period. A pass that cannot
//! read all of it deletes nothing: content is only ever lost on a complete answer.
//!
//! Why Redis before the registry: a job publishing now is unfinished in Redis until its version
//! is on disk, so reading in this order sees its data cited in one place or the other.
//!
//! A pass runs every `tenancy.dataset_grace_s`, at most every 10 minutes.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use rlvr_queue::pipelines::PipelineStore;
use rlvr_queue::store::JobStore;
use tokio_util::sync::CancellationToken;

use super::Tenancy;
use super::resolve::pinned_datasets;

/// The longest time between two sweeps: content no one cites is deleted at most this long after
/// its grace period ends.
const MOST_BETWEEN_SWEEPS: Duration = Duration::from_secs(600);

/// How often sweeps run for a grace period: as often as the grace period (a test's grace of a
/// second is swept every second), at most [`MOST_BETWEEN_SWEEPS`] apart.
pub fn period(grace: Duration) -> Duration {
    grace.clamp(Duration::from_secs(1), MOST_BETWEEN_SWEEPS)
}

/// Sweeps every [`period`] until `stopping`, the first time at once.
pub async fn run(
    tenancy: Arc<Tenancy>,
    jobs: JobStore,
    pipelines: PipelineStore,
    grace: Duration,
    stopping: CancellationToken,
) {
    loop {
        if let Err(error) = pass(&tenancy, &jobs, &pipelines, grace).await {
            tracing::warn!(%error, "the datasets' sweep deleted nothing this time");
        }
        tokio::select! {
            _ = stopping.cancelled() => return,
            _ = tokio::time::sleep(period(grace)) => {}
        }
    }
}

/// One sweep of every team.
async fn pass(
    tenancy: &Arc<Tenancy>,
    jobs: &JobStore,
    pipelines: &PipelineStore,
    grace: Duration,
) -> Result<(), String> {
    let mut cited: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let specs = jobs.unfinished_specs().await.map_err(|error| format!("reading the jobs: {error}"))?;
    for (_, spec) in &specs {
        cited.entry(spec.job.team.clone()).or_default().extend(pinned_datasets(spec));
    }
    let running = pipelines.running().await.map_err(|error| format!("reading the pipelines: {error}"))?;
    for id in running {
        let spec = pipelines.spec(&id).await.map_err(|error| format!("reading pipeline {id}: {error}"))?;
        let team = cited.entry(spec.pipeline.team.clone()).or_default();
        for stage in &spec.stages {
            team.extend(pinned_datasets(stage));
        }
    }
    let tenancy = tenancy.clone();
    tokio::task::spawn_blocking(move || {
        let manifests =
            tenancy.lines.manifests().map_err(|error| format!("reading the registry: {error}"))?;
        for manifest in &manifests {
            let team = cited.entry(manifest.spec.job.team.clone()).or_default();
            team.extend(pinned_datasets(&manifest.spec));
            team.extend(manifest.data_sha256.values().cloned());
        }
        let teams =
            tenancy.datasets.teams().map_err(|error| format!("listing the teams' datasets: {error}"))?;
        let nothing = BTreeSet::new();
        for team in teams {
            let cited = cited.get(&team).unwrap_or(&nothing);
            match tenancy.datasets.sweep(&team, cited, SystemTime::now(), grace) {
                Ok(swept) => {
                    let bytes: u64 = swept.deleted.iter().map(|blob| blob.bytes).sum();
                    if !swept.deleted.is_empty() {
                        tracing::info!(
                            %team,
                            deleted = swept.deleted.len(),
                            bytes,
                            kept_unnamed = swept.kept_unnamed.len(),
                            "datasets' content no name, job, pipeline or version cites deleted"
                        );
                    }
                }
                Err(error) => tracing::warn!(%team, %error, "cannot sweep the team's datasets"),
            }
        }
        Ok(())
    })
    .await
    .map_err(|error| format!("the sweep's task: {error}"))?
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sweeps_come_as_often_as_the_grace_period_within_bounds() {
        let cases = [(0, 1), (1, 1), (30, 30), (3600, 600)];
        for (grace, expected) in cases {
            assert_eq!(period(Duration::from_secs(grace)), Duration::from_secs(expected), "grace {grace} s");
        }
    }
}
