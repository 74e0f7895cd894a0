//! The HTTP/1.1 server under the API: the accept loop, the connection limit, the timeouts, and
//! the open-file limit they must fit under.
//!
//! `axum::serve` had neither timeouts nor a limit: idle sockets and half-sent requests stayed
//! open until the process ran out of file descriptors, and then `/healthz` and the plugin rescan
//! failed too. Here each connection is in one [`Phase`] at a time, and each phase has its bound:
//! - idle (before its first request, or between two): closed after `api.idle_timeout_s`;
//! - a request head arriving (bytes read, the handler not called yet): closed after
//!   `api.header_timeout_s` from the first byte;
//! - busy (from the handler's call to the end of the response body): not bounded as a whole,
//!   since an event stream lasts as long as its job; the request body must arrive within
//!   `api.body_timeout_s` of the head, or the answer is 408 and the connection closes.
//!
//! At `api.max_connections`, a new connection makes the one quiet longest (idle, or sending its
//! head) close; when every connection is busy, new ones wait in the listen backlog. So idle
//! keep-alive sockets and slow heads never keep `/healthz` out, and event streams and requests
//! in flight are never cut to make room.
//!
//! hyper's own `header_read_timeout` is not used: its clock starts when the connection becomes
//! ready for a request, not at the request's first byte, so it would be the idle timeout too and
//! the two could not be set apart. Only HTTP/1.1 is served (`axum::serve` also took h2c with
//! prior knowledge, which no client of ours speaks): one protocol, one set of bounds.
//!
//! tower-http's body timeout bounds each wait for a frame, so a body trickled just under it never
//! ends; the body deadline here is for the whole body.

use std::collections::HashMap;
use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes, HttpBody};
use axum::extract::ConnectInfo;
use axum::http::{HeaderValue, Request, Response, StatusCode, header};
use axum::response::IntoResponse;
use futures::StreamExt;
use http_body::{Frame, SizeHint};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore, oneshot};
use tokio::time::{Instant, Sleep};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tower::ServiceExt;

use super::failure::Failure;
use crate::config::ApiConfig;
use crate::metrics::{Metrics, ReasonLabel};

/// The server's bounds, from `[api]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    pub max_connections: usize,
    pub header_timeout: Duration,
    pub body_timeout: Duration,
    pub idle_timeout: Duration,
}

impl Limits {
    pub fn new(api: &ApiConfig) -> Self {
        Limits {
            max_connections: api.max_connections as usize,
            header_timeout: Duration::from_secs(api.header_timeout_s),
            body_timeout: Duration::from_secs(api.body_timeout_s),
            idle_timeout: Duration::from_secs(api.idle_timeout_s),
        }
    }
}

/// Serves `app` on `listener` within `limits` until `shutdown`; then stops accepting, closes the
/// quiet connections, lets the busy ones finish their response, and returns when all are closed.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    limits: Limits,
    metrics: Arc<Metrics>,
    shutdown: CancellationToken,
) {
    let permits = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let table = Arc::new(Table::default());
    let tracker = TaskTracker::new();
    loop {
        let accepted = tokio::select! {
            () = shutdown.cancelled() => break,
            accepted = listener.accept() => accepted,
        };
        let (stream, peer) = match accepted {
            Ok(accepted) => accepted,
            Err(error) => {
                if !accept_failed(&error, &shutdown).await {
                    break;
                }
                continue;
            }
        };
        let permit = match permits.clone().try_acquire_owned() {
            Ok(permit) => permit,
            Err(_) => {
                if !table.evict_quietest() {
                    tracing::warn!(
                        max_connections = limits.max_connections,
                        "api.max_connections reached and every connection is busy: new ones wait"
                    );
                }
                tokio::select! {
                    () = shutdown.cancelled() => break,
                    permit = permits.clone().acquire_owned() => match permit {
                        Ok(permit) => permit,
                        // Never closed.
                        Err(_) => break,
                    },
                }
            }
        };
        let conn = Arc::new(Conn::new(shutdown.child_token()));
        let slot = Slot::take(table.clone(), conn.clone(), metrics.clone(), permit);
        tracker.spawn(serve_connection(stream, peer, app.clone(), limits, conn, metrics.clone(), slot));
    }
    tracker.close();
    tracker.wait().await;
}

/// After a failed `accept`: whether to go on. Errors of one connection are passed over at once;
/// others (out of file descriptors, most likely) are logged and waited out for a second, as
/// retrying at once would spin.
async fn accept_failed(error: &io::Error, shutdown: &CancellationToken) -> bool {
    use io::ErrorKind::{ConnectionAborted, ConnectionReset, Interrupted};
    if matches!(error.kind(), ConnectionAborted | ConnectionReset | Interrupted) {
        return true;
    }
    tracing::warn!(%error, "api: accept failed; retrying in 1 s");
    tokio::select! {
        () = shutdown.cancelled() => false,
        () = tokio::time::sleep(Duration::from_secs(1)) => true,
    }
}

/// What a connection is doing, as far as its bounds go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Waiting for a request (its first, or the next on a kept-alive connection) since then.
    Idle(Instant),
    /// Reading a request head whose first bytes came then.
    Head(Instant),
    /// This many requests between their handler's call and the end of their response body.
    Busy(usize),
}

/// Why the server closed a connection: the `reason` of `rlvr_api_connections_closed_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Closed {
    IdleTimeout,
    HeaderTimeout,
    BodyTimeout,
    Evicted,
}

impl Closed {
    fn reason(self) -> &'static str {
        match self {
            Closed::IdleTimeout => "idle_timeout",
            Closed::HeaderTimeout => "header_timeout",
            Closed::BodyTimeout => "body_timeout",
            Closed::Evicted => "evicted",
        }
    }

    /// Logs and counts it.
    fn emit(self, metrics: &Metrics, peer: SocketAddr) {
        tracing::debug!(%peer, reason = self.reason(), "api: connection closed");
        metrics.api_connections_closed.get_or_create(&ReasonLabel { reason: self.reason() }).inc();
    }
}

impl Phase {
    /// When the connection is closed if nothing happens first, and why; never while busy.
    fn deadline(self, limits: &Limits) -> Option<(Instant, Closed)> {
        match self {
            Phase::Idle(since) => Some((since + limits.idle_timeout, Closed::IdleTimeout)),
            Phase::Head(since) => Some((since + limits.header_timeout, Closed::HeaderTimeout)),
            Phase::Busy(_) => None,
        }
    }

    /// Bytes were read at `now`: an idle connection starts a head. (Bytes read while busy are a
    /// body's, or a pipelined request's, which is timed once the current one ends.)
    fn read(self, now: Instant) -> Phase {
        match self {
            Phase::Idle(_) => Phase::Head(now),
            other => other,
        }
    }

    /// A handler was called.
    fn request_started(self) -> Phase {
        match self {
            Phase::Busy(requests) => Phase::Busy(requests + 1),
            Phase::Idle(_) | Phase::Head(_) => Phase::Busy(1),
        }
    }

    /// A response body ended (or was dropped) at `now`.
    fn request_ended(self, now: Instant) -> Phase {
        match self {
            Phase::Busy(requests) if requests > 1 => Phase::Busy(requests - 1),
            Phase::Busy(_) => Phase::Idle(now),
            other => other,
        }
    }

    /// Since when a connection that may be closed to make room has had nothing in flight; `None`
    /// when it is busy, which is never closed for room.
    fn quiet_since(self) -> Option<Instant> {
        match self {
            Phase::Idle(since) | Phase::Head(since) => Some(since),
            Phase::Busy(_) => None,
        }
    }
}

/// The connection quiet longest of `connections`, if any is quiet.
fn quietest<K>(connections: impl Iterator<Item = (K, Phase)>) -> Option<K> {
    connections
        .filter_map(|(key, phase)| Some((phase.quiet_since()?, key)))
        .min_by_key(|(since, _)| *since)
        .map(|(_, key)| key)
}

/// One connection's state, shared by its task, its requests and the accept loop.
struct Conn {
    phase: Mutex<Phase>,
    /// Notified when `phase` changes, so the connection's task takes the new deadline.
    changed: Notify,
    /// Cancelled to ask the connection to close: to make room, or on shutdown.
    close: CancellationToken,
    /// Whether `close` was cancelled to make room.
    evicted: AtomicBool,
}

impl Conn {
    fn new(close: CancellationToken) -> Self {
        Conn {
            phase: Mutex::new(Phase::Idle(Instant::now())),
            changed: Notify::new(),
            close,
            evicted: AtomicBool::new(false),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Phase> {
        self.phase.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn phase(&self) -> Phase {
        *self.lock()
    }

    fn update(&self, change: impl FnOnce(Phase) -> Phase) {
        let mut phase = self.lock();
        let next = change(*phase);
        if next != *phase {
            *phase = next;
            drop(phase);
            self.changed.notify_one();
        }
    }
}

/// The open connections, for the accept loop to choose one to close.
#[derive(Default)]
struct Table {
    next: AtomicU64,
    open: Mutex<HashMap<u64, Arc<Conn>>>,
}

impl Table {
    fn lock(&self) -> MutexGuard<'_, HashMap<u64, Arc<Conn>>> {
        self.open.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Asks the connection quiet longest (and not asked already) to close; whether there was one.
    fn evict_quietest(&self) -> bool {
        let open = self.lock();
        let candidates =
            open.values().filter(|conn| !conn.close.is_cancelled()).map(|conn| (conn, conn.phase()));
        match quietest(candidates) {
            Some(conn) => {
                conn.evicted.store(true, Ordering::Relaxed);
                conn.close.cancel();
                true
            }
            None => false,
        }
    }
}

/// A connection's place: in the table, in the gauge, and its permit. Given back when dropped.
struct Slot {
    table: Arc<Table>,
    id: u64,
    metrics: Arc<Metrics>,
    _permit: OwnedSemaphorePermit,
}

impl Slot {
    fn take(table: Arc<Table>, conn: Arc<Conn>, metrics: Arc<Metrics>, permit: OwnedSemaphorePermit) -> Self {
        let id = table.next.fetch_add(1, Ordering::Relaxed);
        table.lock().insert(id, conn);
        metrics.api_connections.inc();
        Slot { table, id, metrics, _permit: permit }
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.table.lock().remove(&self.id);
        self.metrics.api_connections.dec();
    }
}

/// One connection, until the client closes it or it outlives its phase's bound.
async fn serve_connection(
    stream: TcpStream,
    peer: SocketAddr,
    app: Router,
    limits: Limits,
    conn: Arc<Conn>,
    metrics: Arc<Metrics>,
    _slot: Slot,
) {
    let io = TokioIo::new(Watched { stream, conn: conn.clone() });
    let service = {
        let (conn, metrics) = (conn.clone(), metrics.clone());
        hyper::service::service_fn(move |request| {
            handle(app.clone(), conn.clone(), peer, limits.body_timeout, metrics.clone(), request)
        })
    };
    let connection = http1::Builder::new()
        // Timed here instead (see the module docs); hyper's would need a timer besides.
        .header_read_timeout(None)
        .serve_connection(io, service);
    tokio::pin!(connection);
    let mut closing = false;
    loop {
        let deadline = conn.phase().deadline(&limits);
        tokio::select! {
            ended = connection.as_mut() => {
                if let Err(error) = ended {
                    tracing::debug!(%peer, %error, "api: connection ended with an error");
                }
                return;
            }
            () = conn.changed.notified() => {}
            () = sleep_until(deadline.map(|(at, _)| at)) => {
                // Dropping the connection closes the socket; nothing is in flight on it.
                if let Some((at, why)) = conn.phase().deadline(&limits)
                    && at <= Instant::now()
                {
                    why.emit(&metrics, peer);
                    return;
                }
            }
            () = conn.close.cancelled(), if !closing => {
                if conn.phase().quiet_since().is_some() {
                    if conn.evicted.load(Ordering::Relaxed) {
                        Closed::Evicted.emit(&metrics, peer);
                    }
                    return;
                }
                // Busy: it closes once its response is written.
                connection.as_mut().graceful_shutdown();
                closing = true;
            }
        }
    }
}

async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// The slowest upload rate a large body is given time for: 1 MiB/s.
const MIN_UPLOAD_BYTES_PER_S: u64 = 1 << 20;
/// The most a declared length extends the deadline: what a 256 MiB dataset needs at that rate.
const MAX_UPLOAD_EXTENSION: Duration = Duration::from_secs(256);

/// How long a request's body may take: `body_timeout`, plus time for its declared length at
/// [`MIN_UPLOAD_BYTES_PER_S`] (a dataset upload of hundreds of megabytes is not a slow body),
/// at most [`MAX_UPLOAD_EXTENSION`] more. Every route bounds the bytes it reads itself.
fn body_deadline(body_timeout: Duration, headers: &axum::http::HeaderMap) -> Duration {
    let declared = headers
        .get(axum::http::header::CONTENT_LENGTH)
        .and_then(|value| value.to_str().ok()?.parse::<u64>().ok())
        .unwrap_or(0);
    body_timeout + Duration::from_secs(declared / MIN_UPLOAD_BYTES_PER_S).min(MAX_UPLOAD_EXTENSION)
}

/// One request: the client's address and the body deadline in, a 408 out when the body came too
/// slowly, and the connection busy until the response body ends. A body the handler left unread
/// (a refusal before reading it, a 413 at the limit) is drained beside the answer.
async fn handle(
    app: Router,
    conn: Arc<Conn>,
    peer: SocketAddr,
    body_timeout: Duration,
    metrics: Arc<Metrics>,
    request: Request<Incoming>,
) -> Result<Response<Body>, Infallible> {
    let in_flight = InFlight::start(conn);
    let expired = Arc::new(AtomicBool::new(false));
    let (mut parts, body) = request.into_parts();
    parts.extensions.insert(ConnectInfo(peer));
    let (unread_tx, mut unread_rx) = oneshot::channel();
    let body = if body.is_end_stream() {
        Body::new(body)
    } else {
        let deadline = body_deadline(body_timeout, &parts.headers);
        Body::new(Deadline {
            body: Some(body),
            timer: Box::pin(tokio::time::sleep(deadline)),
            expired: expired.clone(),
            unread: Some(unread_tx),
        })
    };
    let response = match app.oneshot(Request::from_parts(parts, body)).await {
        Ok(response) => response,
        Err(never) => match never {},
    };
    let mut response = if expired.load(Ordering::Relaxed) {
        Closed::BodyTimeout.emit(&metrics, peer);
        body_timed_out(body_timeout)
    } else {
        response
    };
    // Not waited for: a body still held (by a response that streams, say) is not drained.
    if let Ok(unread) = unread_rx.try_recv() {
        if unread.size_hint().lower() > DRAIN_MAX_BYTES {
            response.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("close"));
        } else {
            tokio::spawn(drain(unread));
        }
    }
    Ok(response.map(|body| Body::new(Tracked { body, _in_flight: in_flight })))
}

/// The most of a request body its handler left unread that is still read and thrown away, and
/// for how long. A server that answers and closes while the client is still sending resets the
/// connection, and the client then sees "broken pipe" instead of the answer (a 413, a 401, a 429
/// to a large submit); nginx's lingering close drains for the same reason. A body declared longer
/// is not drained: its answer comes with `Connection: close`, and the client may see the reset.
const DRAIN_MAX_BYTES: u64 = 64 << 20;
const DRAIN_MAX_TIME: Duration = Duration::from_secs(10);

/// Reads `unread` to its end, or for [`DRAIN_MAX_TIME`] at most, while its answer is written:
/// hyper sends a response before its request's body has ended, and reads the body on as long as
/// someone holds it. Dropped early, the connection closes.
async fn drain(unread: Incoming) {
    let mut chunks = Body::new(unread).into_data_stream();
    let _ = tokio::time::timeout(DRAIN_MAX_TIME, async {
        let mut seen = 0u64;
        while let Some(Ok(chunk)) = chunks.next().await {
            seen = seen.saturating_add(chunk.len() as u64);
            if seen > DRAIN_MAX_BYTES {
                return;
            }
        }
    })
    .await;
}

/// Whatever the handler made of a body that timed out (a 400 of its reader, most likely), the
/// answer is this, and the connection closes: the rest of the body may still be on its way.
fn body_timed_out(body_timeout: Duration) -> Response<Body> {
    let mut response = Failure::new(
        StatusCode::REQUEST_TIMEOUT,
        "body_timeout",
        format!("the request body did not arrive within {} s (api.body_timeout_s)", body_timeout.as_secs()),
    )
    .into_response();
    response.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("close"));
    response
}

/// The request body ran past `api.body_timeout_s`.
#[derive(Debug, thiserror::Error)]
#[error("the request body did not arrive within api.body_timeout_s")]
struct BodyTimedOut;

/// A request body that fails once its deadline has passed. tower-http's `RequestBodyTimeout`
/// does not fit: it bounds the wait for each frame, so a body trickled a byte at a time just
/// under that bound would never end. Dropped before its end, it hands the rest back to
/// [`handle`] through `unread`, to be drained.
struct Deadline {
    /// `None` only once dropped.
    body: Option<Incoming>,
    timer: Pin<Box<Sleep>>,
    expired: Arc<AtomicBool>,
    unread: Option<oneshot::Sender<Incoming>>,
}

impl HttpBody for Deadline {
    type Data = Bytes;
    type Error = axum::BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = &mut *self;
        let Some(body) = this.body.as_mut() else { return Poll::Ready(None) };
        if let Poll::Ready(frame) = Pin::new(body).poll_frame(cx) {
            return Poll::Ready(frame.map(|frame| frame.map_err(Into::into)));
        }
        if this.timer.as_mut().poll(cx).is_ready() {
            this.expired.store(true, Ordering::Relaxed);
            return Poll::Ready(Some(Err(BodyTimedOut.into())));
        }
        Poll::Pending
    }

    fn is_end_stream(&self) -> bool {
        self.body.as_ref().is_none_or(Incoming::is_end_stream)
    }

    fn size_hint(&self) -> SizeHint {
        self.body.as_ref().map(Incoming::size_hint).unwrap_or_default()
    }
}

impl Drop for Deadline {
    fn drop(&mut self) {
        // A body that timed out is not drained: its connection closes (see `body_timed_out`).
        if let (Some(body), Some(unread)) = (self.body.take(), self.unread.take())
            && !body.is_end_stream()
            && !self.expired.load(Ordering::Relaxed)
        {
            let _ = unread.send(body);
        }
    }
}

/// Keeps its connection busy until dropped: at the end of the request's response body.
struct InFlight(Arc<Conn>);

impl InFlight {
    fn start(conn: Arc<Conn>) -> Self {
        conn.update(Phase::request_started);
        InFlight(conn)
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.update(|phase| phase.request_ended(Instant::now()));
    }
}

/// A response body that holds its request's [`InFlight`]: hyper drops it once it has sent the
/// last frame, or when the connection ends.
struct Tracked {
    body: Body,
    _in_flight: InFlight,
}

impl HttpBody for Tracked {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

/// The socket, telling its connection when bytes arrive: the first ones after idle start a
/// request head, and with it the header timeout.
struct Watched {
    stream: TcpStream,
    conn: Arc<Conn>,
}

impl AsyncRead for Watched {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let polled = Pin::new(&mut this.stream).poll_read(cx, buf);
        if buf.filled().len() > before {
            this.conn.update(|phase| phase.read(Instant::now()));
        }
        polled
    }
}

impl AsyncWrite for Watched {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().stream).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_shutdown(cx)
    }
}

/// File descriptors the daemon needs besides its API connections: the listener, Redis, each
/// worker's pipes, log and grant-socket connection, plugin libraries, files being read. A daemon
/// runs a few dozen workers at most; this leaves room for several times that.
pub const FD_HEADROOM: u64 = 256;
/// The highest soft limit asked for, when the hard one is higher still (or unlimited): Linux's
/// default `fs.nr_open`, past which `setrlimit` fails.
const FD_CEILING: u64 = 1 << 20;

/// Why the open-file limit cannot hold `api.max_connections`.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum FdLimitError {
    #[error(
        "api.max_connections {max_connections} needs {needed} open files ({FD_HEADROOM} besides the \
         connections), but this process may open at most {limit} (RLIMIT_NOFILE): raise LimitNOFILE= \
         in the systemd unit (or ulimit -n), or lower api.max_connections"
    )]
    TooLow { max_connections: u64, needed: u64, limit: u64 },
    #[error("cannot read or raise the open-file limit (RLIMIT_NOFILE): {0}")]
    Rlimit(#[from] nix::Error),
}

/// The soft open-file limit to run with, from the current `soft` and `hard` ones: the hard one
/// (up to [`FD_CEILING`]), never less than `soft`; refused when `max_connections` and
/// [`FD_HEADROOM`] do not fit under it.
fn fd_target(max_connections: u64, soft: u64, hard: u64) -> Result<u64, FdLimitError> {
    let target = hard.min(FD_CEILING).max(soft);
    let needed = max_connections.saturating_add(FD_HEADROOM);
    if needed > target {
        return Err(FdLimitError::TooLow { max_connections, needed, limit: target });
    }
    Ok(target)
}

/// Raises this process's soft open-file limit to its hard one (workers inherit it), or refuses
/// to start when `max_connections` cannot fit under it: a limit lowered without a word would
/// leave the operator's figure a promise the daemon cannot keep.
pub fn raise_fd_limit(max_connections: u64) -> Result<(), FdLimitError> {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE)?;
    let target = fd_target(max_connections, soft, hard)?;
    if target != soft {
        setrlimit(Resource::RLIMIT_NOFILE, target, hard)?;
    }
    tracing::info!(soft = target, was = soft, hard, max_connections, "open-file limit");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_large_declared_body_gets_time_at_the_slowest_upload_rate_within_a_bound() {
        let check = |length: Option<&str>, expected_s: u64| {
            let mut headers = axum::http::HeaderMap::new();
            if let Some(length) = length {
                headers.insert(axum::http::header::CONTENT_LENGTH, length.parse().unwrap());
            }
            assert_eq!(
                body_deadline(Duration::from_secs(30), &headers),
                Duration::from_secs(expected_s),
                "{length:?}"
            );
        };
        check(None, 30);
        check(Some("1000"), 30);
        check(Some("not a number"), 30);
        check(Some(&(100u64 << 20).to_string()), 130);
        check(Some(&(1u64 << 40).to_string()), 30 + 256);
    }

    #[test]
    fn the_soft_limit_goes_up_to_the_hard_one_and_must_hold_the_connections() {
        let check = |(max, soft, hard): (u64, u64, u64), expected: Result<u64, FdLimitError>| {
            assert_eq!(fd_target(max, soft, hard), expected, "max {max}, soft {soft}, hard {hard}");
        };
        let too_low =
            |max, limit| Err(FdLimitError::TooLow { max_connections: max, needed: max + 256, limit });
        check((512, 1024, 524_288), Ok(524_288));
        check((512, 1024, 1024), Ok(1024));
        check((512, 65_536, 65_536), Ok(65_536));
        check((768, 1024, 1024), Ok(1024));
        check((769, 1024, 1024), too_low(769, 1024));
        check((512, 512, 512), too_low(512, 512));
        // Unlimited: as high as Linux lets a process go by default.
        check((512, 1024, u64::MAX), Ok(1 << 20));
        // Never lowered.
        check((512, 2_000_000, u64::MAX), Ok(2_000_000));
        check(
            (u64::MAX, 1024, u64::MAX),
            Err(FdLimitError::TooLow { max_connections: u64::MAX, needed: u64::MAX, limit: 1 << 20 }),
        );
    }

    #[test]
    fn each_phase_has_its_bound_and_a_busy_connection_none() {
        let t0 = Instant::now();
        let s = Duration::from_secs;
        let limits =
            Limits { max_connections: 32, header_timeout: s(10), body_timeout: s(30), idle_timeout: s(60) };
        let check = |phase: Phase, expected: Option<(Instant, Closed)>| {
            assert_eq!(phase.deadline(&limits), expected, "{phase:?}");
        };
        check(Phase::Idle(t0), Some((t0 + s(60), Closed::IdleTimeout)));
        check(Phase::Head(t0), Some((t0 + s(10), Closed::HeaderTimeout)));
        check(Phase::Busy(1), None);
    }

    #[test]
    fn phases_follow_bytes_and_requests() {
        let t0 = Instant::now();
        let (t1, t2) = (t0 + Duration::from_secs(1), t0 + Duration::from_secs(2));
        let check = |from: Phase, event: &dyn Fn(Phase) -> Phase, expected: Phase| {
            assert_eq!(event(from), expected, "{from:?}");
        };
        let read = |phase: Phase| phase.read(t1);
        let started = Phase::request_started;
        let ended = |phase: Phase| phase.request_ended(t2);
        // The first byte after idle starts the head's clock; later ones do not restart it.
        check(Phase::Idle(t0), &read, Phase::Head(t1));
        check(Phase::Head(t0), &read, Phase::Head(t0));
        // A body's bytes leave a busy connection busy.
        check(Phase::Busy(1), &read, Phase::Busy(1));
        check(Phase::Head(t0), &started, Phase::Busy(1));
        check(Phase::Idle(t0), &started, Phase::Busy(1));
        check(Phase::Busy(1), &started, Phase::Busy(2));
        check(Phase::Busy(2), &ended, Phase::Busy(1));
        check(Phase::Busy(1), &ended, Phase::Idle(t2));
        check(Phase::Idle(t0), &ended, Phase::Idle(t0));
    }

    #[test]
    fn room_is_made_by_the_connection_quiet_longest_never_a_busy_one() {
        let t0 = Instant::now();
        let at = |s| t0 + Duration::from_secs(s);
        let check = |connections: &[(&str, Phase)], expected: Option<&str>| {
            assert_eq!(quietest(connections.iter().copied()), expected, "{connections:?}");
        };
        check(&[("a", Phase::Idle(at(5))), ("b", Phase::Head(at(3))), ("c", Phase::Busy(1))], Some("b"));
        check(&[("a", Phase::Idle(at(1))), ("b", Phase::Head(at(3)))], Some("a"));
        // An event stream is busy for as long as it lasts.
        check(&[("stream", Phase::Busy(1)), ("submit", Phase::Busy(1))], None);
        check(&[], None);
    }
}
