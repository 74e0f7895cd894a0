//! `rlvrctl logs ID`: a job's worker log, through `GET /v1/jobs/{id}/logs` (the job's team only).
//!
//! The tail, the whole log (`--all`), or the tail then new lines until the job ends (`--follow`).

use std::io::{self, Write};
use std::time::Duration;

use rlvr_client::{Client, Exit};
use rlvr_protocol::job::JobState;

/// The tail `rlvrctl logs` prints without `--all`.
const TAIL_BYTES: u64 = 64 * 1024;
/// How often `--follow` asks for new lines.
const POLL: Duration = Duration::from_secs(1);

/// What to print.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    /// The last 64 KiB, in whole lines.
    Tail,
    /// The whole log.
    All,
    /// The tail, then new lines until the job ends.
    Follow,
}

impl Mode {
    pub(crate) fn new(all: bool, follow: bool) -> Mode {
        match (all, follow) {
            (_, true) => Mode::Follow,
            (true, false) => Mode::All,
            (false, false) => Mode::Tail,
        }
    }
}

/// Prints job `id`'s log as `mode` says. Exit 0; with `--follow`, the job's end as `watch` gives
/// it (0 published, 1 any other end).
pub(crate) fn print(api: &Client, id: &str, mode: Mode) -> anyhow::Result<Exit> {
    let mut out = io::stdout().lock();
    let mut since = match mode {
        Mode::All => Some(0),
        Mode::Tail | Mode::Follow => None,
    };
    let mut window = if mode == Mode::All { None } else { Some(TAIL_BYTES) };
    // Set once a followed job has ended: one more read takes the lines written meanwhile.
    let mut ended = None;
    loop {
        let log = api.logs(id, since, window)?;
        out.write_all(log.text.as_bytes())?;
        out.flush()?;
        since = Some(log.end);
        window = None;
        if log.end < log.size {
            continue; // more than one window's worth is waiting
        }
        if let Some(exit) = ended {
            return Ok(exit);
        }
        if mode != Mode::Follow {
            return Ok(Exit::Done);
        }
        let job = api.job(id)?;
        if job.state.is_terminal() {
            ended = Some(if job.state == JobState::Published { Exit::Done } else { Exit::Ended });
        } else {
            std::thread::sleep(POLL);
        }
    }
}
