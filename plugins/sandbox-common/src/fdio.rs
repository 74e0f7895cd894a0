//! Pipes with deadlines: every read and write toward a sandboxed or helper process is bounded in
//! time and size, so a child that stops reading, never answers or floods us cannot hang a run.

use std::io;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::time::Instant;

/// Why a bounded read or write stopped.
#[derive(Debug)]
pub enum PipeError {
    /// The deadline passed.
    Timeout,
    /// The other end was closed.
    Closed,
    /// A line grew past the size limit.
    TooLong,
    /// Any other error.
    Io(io::Error),
}

impl std::fmt::Display for PipeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PipeError::Timeout => write!(f, "timed out"),
            PipeError::Closed => write!(f, "closed"),
            PipeError::TooLong => write!(f, "over the size limit"),
            PipeError::Io(error) => write!(f, "{error}"),
        }
    }
}

/// A pipe, both ends close-on-exec: `(read, write)`.
pub fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0; 2];
    // SAFETY: `fds` has room for the two fds pipe2 writes.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: pipe2 just returned these two fds, owned by nobody else.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// A close-on-exec duplicate of `fd` numbered 10 or above, so that moving it onto fds 3–5 in a
/// child never overwrites another fd still to be moved.
pub fn dup_high(fd: &OwnedFd) -> io::Result<OwnedFd> {
    // SAFETY: F_DUPFD_CLOEXEC on an open fd returns a new fd we own.
    let new = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_DUPFD_CLOEXEC, 10) };
    if new < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fcntl just returned it.
    Ok(unsafe { OwnedFd::from_raw_fd(new) })
}

/// Makes our end of a pipe non-blocking (the child's end, a separate open file, stays blocking).
pub fn set_nonblocking(fd: &impl AsFd) -> io::Result<()> {
    let raw = fd.as_fd().as_raw_fd();
    // SAFETY: F_GETFL/F_SETFL on an open fd.
    unsafe {
        let flags = libc::fcntl(raw, libc::F_GETFL);
        if flags < 0 || libc::fcntl(raw, libc::F_SETFL, flags | libc::O_NONBLOCK) < 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// Waits until `fd` is ready for `events` or `deadline` passes.
pub fn wait_ready(fd: &impl AsFd, events: libc::c_short, deadline: Instant) -> Result<(), PipeError> {
    loop {
        // A passed deadline still gets one look: what is already there is not a timeout.
        let millis =
            deadline.saturating_duration_since(Instant::now()).as_millis().min(i32::MAX as u128) as i32;
        let mut poll = libc::pollfd { fd: fd.as_fd().as_raw_fd(), events, revents: 0 };
        // SAFETY: one valid pollfd.
        let ready = unsafe { libc::poll(&mut poll, 1, millis) };
        if ready < 0 {
            let error = io::Error::last_os_error();
            if error.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(PipeError::Io(error));
        }
        if ready > 0 {
            return Ok(());
        }
        if millis == 0 {
            return Err(PipeError::Timeout);
        }
    }
}

/// One `read` into `buffer`: `Ok(0)` at end of file, `WouldBlock` when nothing is there.
pub fn read_some(fd: &impl AsFd, buffer: &mut [u8]) -> io::Result<usize> {
    // SAFETY: `buffer` is valid for writes of its length.
    let read = unsafe { libc::read(fd.as_fd().as_raw_fd(), buffer.as_mut_ptr().cast(), buffer.len()) };
    if read < 0 { Err(io::Error::last_os_error()) } else { Ok(read as usize) }
}

/// One `write` from `data`; `WouldBlock` when the pipe is full.
pub fn write_some(fd: &impl AsFd, data: &[u8]) -> io::Result<usize> {
    // SAFETY: `data` is valid for reads of its length.
    let written = unsafe { libc::write(fd.as_fd().as_raw_fd(), data.as_ptr().cast(), data.len()) };
    if written < 0 { Err(io::Error::last_os_error()) } else { Ok(written as usize) }
}

/// Writes all of `data` to a non-blocking `fd` before `deadline`.
pub fn write_all_until(fd: &impl AsFd, mut data: &[u8], deadline: Instant) -> Result<(), PipeError> {
    while !data.is_empty() {
        match write_some(fd, data) {
            Ok(written) => data = &data[written..],
            Err(error) if error.kind() == io::ErrorKind::WouldBlock => {
                wait_ready(fd, libc::POLLOUT, deadline)?
            }
            Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
            Err(error) if error.kind() == io::ErrorKind::BrokenPipe => return Err(PipeError::Closed),
            Err(error) => return Err(PipeError::Io(error)),
        }
    }
    Ok(())
}

/// Fills `buffer` from a blocking or non-blocking `fd` before `deadline`.
pub fn read_exact_until(fd: &impl AsFd, buffer: &mut [u8], deadline: Instant) -> Result<(), PipeError> {
    let mut filled = 0;
    while filled < buffer.len() {
        wait_ready(fd, libc::POLLIN, deadline)?;
        match read_some(fd, &mut buffer[filled..]) {
            Ok(0) => return Err(PipeError::Closed),
            Ok(read) => filled += read,
            Err(error) if matches!(error.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted) => {}
            Err(error) => return Err(PipeError::Io(error)),
        }
    }
    Ok(())
}

/// Reads newline-terminated lines from a non-blocking fd, each bounded in time and size.
#[derive(Debug)]
pub struct LineReader {
    fd: OwnedFd,
    buffer: Vec<u8>,
}

impl LineReader {
    /// A reader of `fd`, which it makes non-blocking.
    pub fn new(fd: OwnedFd) -> io::Result<Self> {
        set_nonblocking(&fd)?;
        Ok(LineReader { fd, buffer: Vec::new() })
    }

    /// The next line without its newline, read before `deadline`, at most `limit` bytes long.
    pub fn read_line(&mut self, deadline: Instant, limit: usize) -> Result<Vec<u8>, PipeError> {
        let mut scanned = 0;
        loop {
            if let Some(end) = self.buffer[scanned..].iter().position(|&b| b == b'\n') {
                let end = scanned + end;
                let mut line: Vec<u8> = self.buffer.drain(..=end).collect();
                line.pop();
                return Ok(line);
            }
            scanned = self.buffer.len();
            if self.buffer.len() > limit {
                return Err(PipeError::TooLong);
            }
            let mut chunk = [0u8; 64 * 1024];
            match read_some(&self.fd, &mut chunk) {
                Ok(0) => return Err(PipeError::Closed),
                Ok(read) => self.buffer.extend_from_slice(&chunk[..read]),
                Err(error) if error.kind() == io::ErrorKind::WouldBlock => {
                    wait_ready(&self.fd, libc::POLLIN, deadline)?
                }
                Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
                Err(error) => return Err(PipeError::Io(error)),
            }
        }
    }
}
