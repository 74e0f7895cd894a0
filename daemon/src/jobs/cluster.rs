//! An `[engine]` job's Ray job stops with its worker: once the worker is gone — finished, failed,
//! cancelled, preempted or killed — whatever cluster job it submitted last
//! (`RunDir::ray_submission`) is stopped through the cluster's Jobs API and waited for, so that
//! no cluster job outlives its job's run and the next run's engine never writes beside it.
//!
//! A worker that stopped its engine itself (a stop request, the engine's end) leaves a cluster
//! job that is already over: asking again changes nothing.

use std::time::{Duration, Instant};

use rlvr_protocol::jobdir::RunDir;
use tracing::{info, warn};

/// How long a stopped cluster job may take to end: Ray's own wait for its entrypoint
/// (`RAY_JOB_STOP_WAIT_TIME_S`, which the book's engines page asks operators to set long enough for a
/// checkpoint), and then some.
const STOP_WAIT: Duration = Duration::from_secs(180);

/// Statuses of a cluster job that has not ended.
fn running(status: &str) -> bool {
    matches!(status, "PENDING" | "RUNNING")
}

/// The submission id the worker recorded in `run`, if any (none: it submitted nothing).
fn recorded(run: &RunDir) -> Option<String> {
    let text = std::fs::read_to_string(run.ray_submission()).ok()?;
    let id = text.trim();
    (!id.is_empty()).then(|| id.to_owned())
}

/// Stops the cluster job the worker of `run` submitted last, if it has not ended, and waits for
/// its end (at most [`STOP_WAIT`], less if the cluster stops answering). Problems are logged, never raised: the job's own end does not
/// depend on the cluster's answer.
pub async fn stop_left_running(address: &str, run: &RunDir, job_id: &str) {
    let Some(submission) = recorded(run) else { return };
    let client = match reqwest::Client::builder().timeout(Duration::from_secs(30)).build() {
        Ok(client) => client,
        Err(error) => {
            warn!(%error, job = job_id, submission, "cannot reach the Ray cluster to stop the job's engine");
            return;
        }
    };
    let base = format!("{}/api/jobs/{submission}", address.trim_end_matches('/'));
    match status(&client, &base).await {
        Some(now) if running(&now) => {}
        Some(_) => return,
        None => warn!(job = job_id, submission, "cannot read the engine's Ray job; asking it to stop anyway"),
    }
    if let Err(error) =
        client.post(format!("{base}/stop")).send().await.and_then(reqwest::Response::error_for_status)
    {
        warn!(%error, job = job_id, submission, "cannot stop the engine's Ray job, which its worker left running");
        return;
    }
    let asked = Instant::now();
    // A cluster that stops answering is not waited for: a few unread statuses in a row end it.
    let mut unread = 0;
    while asked.elapsed() < STOP_WAIT && unread < 5 {
        match status(&client, &base).await {
            Some(now) if !running(&now) => {
                info!(
                    job = job_id,
                    submission,
                    status = now,
                    "stopped the engine's Ray job its worker left running"
                );
                return;
            }
            Some(_) => unread = 0,
            None => unread += 1,
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    warn!(
        job = job_id,
        submission,
        waited_s = asked.elapsed().as_secs(),
        "the engine's Ray job has not been seen to end after its stop"
    );
}

/// The cluster job's status (`GET /api/jobs/{id}`), `None` when it cannot be read.
async fn status(client: &reqwest::Client, url: &str) -> Option<String> {
    let answer = client.get(url).send().await.ok()?.error_for_status().ok()?;
    let info: serde_json::Value = answer.json().await.ok()?;
    info["status"].as_str().map(str::to_owned)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The id the worker wrote is read back trimmed; nothing written, or only blanks, is no
    /// submission (the worker submitted nothing), so no cluster is asked.
    #[test]
    fn a_run_names_the_submission_its_worker_recorded_or_none() {
        let dir = tempfile::tempdir().unwrap();
        let recorded_at = |path: &std::path::Path| recorded(&RunDir::at(path.to_owned()));
        assert_eq!(recorded_at(dir.path()), None);
        std::fs::create_dir_all(dir.path().join("engine")).unwrap();
        for (written, read) in [("rlvr-01J-17\n", Some("rlvr-01J-17")), ("  \n", None), ("", None)] {
            std::fs::write(dir.path().join("engine/ray-submission"), written).unwrap();
            assert_eq!(recorded_at(dir.path()).as_deref(), read, "{written:?}");
        }
        assert!(running("RUNNING") && running("PENDING"));
        assert!(!running("STOPPED") && !running("SUCCEEDED") && !running("FAILED"));
    }
}
