//! The worker's side of the daemon's device grants (`sched::service` has the protocol): before
//! each device phase — rollout, update, evaluation — the worker asks `rlvrd serve` for its
//! devices and gives them back after, so another job's phase can use them while this one
//! verifies on the CPU. A worker started by hand (no `--grant-socket`) runs without grants.
//!
//! A [`Grant`] gives its devices back when dropped. Waiting for the first grant of a step can be
//! cut short by a stop request (SIGTERM): the step has not begun, so the worker checkpoints
//! and leaves at that boundary.
//!
//! [`Grant::release`] gives the devices back once the device's queued kernels have run, with
//! libtorch's CUDA cache emptied. A [`GrantError`] anywhere in a step ends the worker `Transient`.

use std::io::{BufRead, BufReader, ErrorKind, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rlvr_protocol::grants::Phase;
use rlvr_protocol::grants::{Answer, Request};

use super::lifecycle;

/// The grant socket failed: the daemon closed it, answered nonsense, or refused a request. Not
/// the job's fault: the worker exits `Transient` and the daemon requeues the job.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("grant socket: {0}")]
pub struct GrantError(String);

/// How often a wait for a grant looks at the stop flag.
const STOP_POLL: Duration = Duration::from_millis(100);

/// The connection to the daemon's scheduler, or none.
#[derive(Clone, Default)]
pub struct Grants {
    connection: Option<Arc<Mutex<Connection>>>,
}

struct Connection {
    reader: BufReader<UnixStream>,
    writer: UnixStream,
}

/// Devices held for a phase; given back on drop.
pub struct Grant {
    connection: Option<Arc<Mutex<Connection>>>,
}

impl Connection {
    fn send(&mut self, request: &Request) -> Result<(), GrantError> {
        let mut line = serde_json::to_string(request).map_err(|error| GrantError(error.to_string()))?;
        line.push('\n');
        self.writer.write_all(line.as_bytes()).map_err(|error| GrantError(error.to_string()))
    }

    /// The next answer; `None` when the read timed out (a wait goes on).
    fn answer(&mut self) -> Result<Option<Answer>, GrantError> {
        let mut line = String::new();
        match self.reader.read_line(&mut line) {
            Ok(0) => Err(GrantError("the daemon closed it".to_owned())),
            Ok(_) => serde_json::from_str(&line)
                .map(Some)
                .map_err(|error| GrantError(format!("unreadable answer {line:?}: {error}"))),
            Err(error) if matches!(error.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => Ok(None),
            Err(error) => Err(GrantError(error.to_string())),
        }
    }

    /// Waits for an answer, however long.
    fn wait_answer(&mut self) -> Result<Answer, GrantError> {
        loop {
            if let Some(answer) = self.answer()? {
                return Ok(answer);
            }
        }
    }
}

impl Grants {
    /// No daemon: every phase runs at once.
    pub fn none() -> Self {
        Grants::default()
    }

    /// Connects to the daemon's grant socket as job `job`.
    pub fn connect(path: &Path, job: &str) -> Result<Self, GrantError> {
        let stream =
            UnixStream::connect(path).map_err(|error| GrantError(format!("{}: {error}", path.display())))?;
        stream.set_read_timeout(Some(STOP_POLL)).map_err(|error| GrantError(error.to_string()))?;
        let writer = stream.try_clone().map_err(|error| GrantError(error.to_string()))?;
        let mut connection = Connection { reader: BufReader::new(stream), writer };
        connection.send(&Request::Job(job.to_owned()))?;
        match connection.wait_answer()? {
            Answer::Ok => Ok(Grants { connection: Some(Arc::new(Mutex::new(connection))) }),
            Answer::Error(message) => Err(GrantError(message)),
            other => Err(GrantError(format!("unexpected answer {other:?}"))),
        }
    }

    /// Waits for this job's devices for `phase`.
    pub fn hold(&self, phase: Phase) -> Result<Grant, GrantError> {
        self.acquire(phase, false).map(|grant| grant.expect("only a boundary wait is cut short"))
    }

    /// As [`Grants::hold`] at a step boundary: `None` when a stop was requested while waiting.
    pub fn hold_at_boundary(&self, phase: Phase) -> Result<Option<Grant>, GrantError> {
        self.acquire(phase, true)
    }

    fn acquire(&self, phase: Phase, stoppable: bool) -> Result<Option<Grant>, GrantError> {
        // An out-of-memory from here on is this phase's.
        crate::memory::enter(phase);
        let Some(shared) = &self.connection else { return Ok(Some(Grant { connection: None })) };
        let mut connection = shared.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        connection.send(&Request::Acquire(phase))?;
        loop {
            match connection.answer()? {
                Some(Answer::Granted(_)) => return Ok(Some(Grant { connection: Some(shared.clone()) })),
                Some(Answer::Error(message)) => {
                    return Err(GrantError(format!("grant for {phase}: {message}")));
                }
                Some(other) => {
                    return Err(GrantError(format!("grant for {phase}: unexpected answer {other:?}")));
                }
                None if stoppable && lifecycle::stop_requested() => {
                    // Withdraw the request. A grant that crossed it is given back by the same
                    // release: the daemon reads it after sending the grant.
                    connection.send(&Request::Release)?;
                    loop {
                        match connection.wait_answer()? {
                            Answer::Released => return Ok(None),
                            Answer::Error(message) => {
                                return Err(GrantError(format!("grant for {phase}: {message}")));
                            }
                            Answer::Granted(_) | Answer::Ok => {}
                        }
                    }
                }
                None => {}
            }
        }
    }
}

impl Grant {
    /// Gives the devices back once the work queued on `device` has run, and with them the
    /// memory libtorch cached there. CUDA kernels run after the calls that launch them return:
    /// a grant given back with kernels still queued would let the next phase (another job's)
    /// start on a device still busy with this one's, and its timings and memory would carry
    /// this phase's tail. The cache goes back too (`torch.cuda.empty_cache()`): the blocks this
    /// phase freed would otherwise stay reserved for this process while the next job's phase
    /// runs out of room. Only a daemon's grant: a run by hand shares its device with no one, and
    /// keeps its cache. (Not in `drop`: a grant dropped while an error unwinds must not wait on,
    /// or fail in, a CUDA call; the process ends then, and its memory with it.)
    pub fn release(self, device: tch::Device) {
        if let tch::Device::Cuda(index) = device {
            tch::Cuda::synchronize(index as i64);
            if self.connection.is_some() {
                crate::memory::release(device);
            }
        }
    }
}

impl Drop for Grant {
    fn drop(&mut self) {
        let Some(shared) = self.connection.take() else { return };
        let mut connection = shared.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        // A broken connection gives everything back on the daemon's side anyway.
        if connection.send(&Request::Release).is_ok() {
            let _ = connection.wait_answer();
        }
    }
}
