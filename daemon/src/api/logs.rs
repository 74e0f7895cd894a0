//! `GET /v1/jobs/{id}/logs`: a job's worker log (every run's stderr), to the job's team only, in
//! windows of whole lines so a client can follow it by asking again from where the last ended.
//!
//! A client follows with `since`.

use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom};
use std::path::Path as FsPath;
use std::sync::Arc;

use axum::Json;
use axum::extract::{Extension, Path, Query, State};
use axum::http::StatusCode;
use rlvr_protocol::job::{ErrorBody, JobLog};
use serde::Deserialize;

use super::auth::Caller;
use super::failure::{Answer, Failure};
use super::jobs::{JobsState, shown_text, visible_job};

/// The most bytes one answer carries: a follower asks again for the rest.
const MAX_WINDOW: u64 = 1 << 20;

/// `GET /v1/jobs/{id}/logs` query.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
pub struct LogQuery {
    /// Byte offset to read from (the `end` of the previous answer); unset: the log's last
    /// `bytes`.
    since: Option<u64>,
    /// At most this many bytes (default and most: 1 MiB), cut back to whole lines.
    bytes: Option<u64>,
}

/// `GET /v1/jobs/{id}/logs`: whole lines of the job's worker log — from `since`, or its tail.
/// Empty before the job's first run.
#[utoipa::path(
    get,
    path = "/v1/jobs/{id}/logs",
    params(("id" = String, Path, description = "Job id"), LogQuery),
    responses(
        (status = 200, body = JobLog), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
        (status = 404, body = ErrorBody), (status = 429, body = ErrorBody),
    ),
    security(("bearer" = [])),
    tag = "jobs"
)]
pub async fn logs(
    State(state): State<Arc<JobsState>>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    query: Result<Query<LogQuery>, axum::extract::rejection::QueryRejection>,
) -> Answer<Json<JobLog>> {
    let Query(query) = query
        .map_err(|rejection| Failure::new(StatusCode::BAD_REQUEST, "bad_query", rejection.body_text()))?;
    let max = window_bytes(query.bytes, MAX_WINDOW)?;
    visible_job(&state, &caller, &id).await?;
    let path = state.state_dir.jobs().job(&id).worker_log();
    let since = query.since;
    let mut log =
        tokio::task::spawn_blocking(move || read_window(&path, since, max).map_err(|error| (path, error)))
            .await
            .map_err(|error| Failure::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", error.to_string()))?
            .map_err(|(path, error)| {
                let message = shown_text(&state, caller.admin, format!("{}: {error}", path.display()));
                Failure::new(StatusCode::INTERNAL_SERVER_ERROR, "unreadable", message)
            })?;
    // The worker logs its paths; a team reads names in their place. The offsets stay the file's.
    log.text = shown_text(&state, caller.admin, log.text);
    Ok(Json(log))
}

/// A read window's `bytes` query (logs, metrics): 1 to `most`, `most` when unset.
pub(super) fn window_bytes(asked: Option<u64>, most: u64) -> Answer<u64> {
    match asked {
        None => Ok(most),
        Some(bytes) if (1..=most).contains(&bytes) => Ok(bytes),
        Some(_) => Err(Failure::new(
            StatusCode::BAD_REQUEST,
            "bad_query",
            format!("expected bytes from 1 to {most}"),
        )
        .field("bytes")),
    }
}

/// Whole lines of the file at `path`: from `since` (at most `max` bytes, up to the last newline
/// in them), or the last lines within `max` bytes. A missing file is an empty log. A single line
/// longer than `max` is cut at `max`, so a follower always moves on.
fn read_window(path: &FsPath, since: Option<u64>, max: u64) -> io::Result<JobLog> {
    let mut file = match File::open(path) {
        Ok(file) => file,
        Err(error) if error.kind() == io::ErrorKind::NotFound => {
            return Ok(JobLog { start: 0, end: 0, size: 0, text: String::new() });
        }
        Err(error) => return Err(error),
    };
    let size = file.metadata()?.len();
    // A tail reads one byte more than it shows: when that byte is a newline, the window starts
    // on a whole line.
    let (start, take, cut_front) = match since {
        Some(since) => (since.min(size), max, false),
        None if size > max => (size - max - 1, max + 1, true),
        None => (0, max, false),
    };
    let mut bytes = Vec::new();
    file.seek(SeekFrom::Start(start))?;
    file.take(take.min(size - start)).read_to_end(&mut bytes)?;
    let (skip, keep) = whole_lines(&bytes, cut_front, start + bytes.len() as u64 == size);
    let window = &bytes[skip..keep];
    Ok(JobLog {
        start: start + skip as u64,
        end: start + keep as u64,
        size,
        text: String::from_utf8_lossy(window).into_owned(),
    })
}

/// The part of `bytes` that is whole lines: past the first newline when the window starts
/// mid-line (`cut_front`), up to and including the last newline unless the window reaches the
/// end of the log (`at_end`: a line being written is shown as it is). A window without any
/// newline is kept whole, so a follower always moves on.
fn whole_lines(bytes: &[u8], cut_front: bool, at_end: bool) -> (usize, usize) {
    let newline = |position: Option<usize>| position.map(|at| at + 1);
    let skip = if cut_front { newline(bytes.iter().position(|&b| b == b'\n')).unwrap_or(0) } else { 0 };
    let keep = if at_end {
        bytes.len()
    } else {
        newline(bytes.iter().rposition(|&b| b == b'\n')).unwrap_or(bytes.len())
    };
    if keep <= skip { (0, bytes.len()) } else { (skip, keep) }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The log `log`, read with `since` and `max`: (start, end, text).
    fn check(log: &str, since: Option<u64>, max: u64, expected: (u64, u64, &str)) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("worker.log");
        std::fs::write(&path, log).unwrap();
        let window = read_window(&path, since, max).unwrap();
        assert_eq!(
            (window.start, window.end, window.text.as_str()),
            expected,
            "{log:?} since {since:?} max {max}"
        );
        assert_eq!(window.size, log.len() as u64);
    }

    #[test]
    fn windows_are_whole_lines_and_follow_on() {
        let log = "one\ntwo\nthree\n";
        check(log, None, 100, (0, 14, "one\ntwo\nthree\n"));
        // The tail within 9 bytes starts mid-line ("o\nthree\n"): from the next line.
        check(log, None, 9, (8, 14, "three\n"));
        check(log, None, 10, (4, 14, "two\nthree\n"));
        check(log, Some(0), 6, (0, 4, "one\n"));
        check(log, Some(4), 6, (4, 8, "two\n"));
        check(log, Some(14), 6, (14, 14, ""));
        check(log, Some(99), 6, (14, 14, ""));
        // A line being written shows at the end; a line longer than the window is cut to it.
        check("done\nhalf", Some(5), 100, (5, 9, "half"));
        check("abcdefghij\n", Some(0), 4, (0, 4, "abcd"));
        check("", None, 100, (0, 0, ""));
    }

    #[test]
    fn a_job_that_never_ran_has_an_empty_log() {
        let dir = tempfile::tempdir().unwrap();
        let window = read_window(&dir.path().join("worker.log"), None, MAX_WINDOW).unwrap();
        assert_eq!(window, JobLog { start: 0, end: 0, size: 0, text: String::new() });
    }
}
