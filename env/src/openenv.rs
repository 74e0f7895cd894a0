//! OpenEnv's stateful interface, client side (openenv 0.10.0,
//! `openenv.core.env_server.http_server`): one environment per WebSocket connection to
//! `<server>/ws`, JSON text frames —
//! `{"type": "reset", "data": {...}}`, `{"type": "step", "data": ACTION}`, `{"type": "close"}` in;
//! `{"type": "observation", "data": {"observation": {...}, "reward": r, "done": d}}` or
//! `{"type": "error", "data": {"message": ..., "code": ...}}` out, one answer per request.
//! A server holds at most `max_concurrent_envs` sessions (1 unless its code says otherwise) and
//! answers one more with a `CAPACITY_REACHED` error frame and a close: GRPO's G sessions of a
//! group at once need a server that holds them, so that error says the limit.
//!
//! Plain `http://` servers only for now (a sidecar on loopback, a team's server on its network):
//! `https://` is refused at [`Session::open`] naming the url.

use std::io::{ErrorKind, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::os::unix::net::UnixStream;
use std::time::Duration;

use rlvr_outbound::{Policy, Refusal};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use tungstenite::{Message, WebSocket};

/// What an environment answered to `reset` or `step`.
#[derive(Debug, Clone, PartialEq)]
pub struct Reply {
    /// The observation's fields (the environment's own; `metadata` among them).
    pub observation: Map<String, Value>,
    /// Its reward for the step (`None`: it gave none).
    pub reward: Option<f64>,
    pub done: bool,
}

/// Why a session could not open or a request got no reply.
#[derive(Debug, thiserror::Error)]
pub enum EnvError {
    #[error(transparent)]
    Refused(#[from] Refusal),
    #[error("{url}: {message}")]
    Connect { url: String, message: String },
    #[error("{url}: no answer to {what} within {seconds} s")]
    Timeout { url: String, what: &'static str, seconds: f64 },
    #[error(
        "{url}: the server holds {} sessions at once and refused another{}: a step's groups need one \
         session per completion at once (start it with more, e.g. max_concurrent_envs)",
        max.map_or_else(|| "no more".to_owned(), |max| format!("at most {max}")),
        active.map_or_else(String::new, |active| format!(" ({active} open)"))
    )]
    Capacity { url: String, active: Option<u64>, max: Option<u64> },
    /// The environment refused the request or failed on it (`VALIDATION_ERROR`: the action does
    /// not fit its schema; `EXECUTION_ERROR`: its code raised).
    #[error("{url}: {what} failed ({code}): {message}")]
    Env { url: String, what: &'static str, code: String, message: String },
    #[error("{url}: {message}")]
    Protocol { url: String, message: String },
}

/// A request frame.
#[derive(Debug, Serialize)]
#[serde(tag = "type", content = "data", rename_all = "lowercase")]
enum Request<'a> {
    Reset(&'a Map<String, Value>),
    Step(&'a Value),
    Close,
}

/// An answer frame.
#[derive(Debug, Deserialize)]
#[serde(tag = "type", content = "data", rename_all = "lowercase")]
enum Answer {
    Observation(ObservationData),
    Error(ErrorData),
    State(#[allow(dead_code, reason = "read for its shape; state is never asked for")] Value),
}

#[derive(Debug, Deserialize)]
struct ObservationData {
    #[serde(default)]
    observation: Map<String, Value>,
    #[serde(default)]
    reward: Option<Value>,
    #[serde(default)]
    done: bool,
}

#[derive(Debug, Deserialize)]
struct ErrorData {
    #[serde(default)]
    message: String,
    #[serde(default)]
    code: Option<String>,
    #[serde(default)]
    active_sessions: Option<u64>,
    #[serde(default)]
    max_sessions: Option<u64>,
    /// A validation error's details (pydantic's).
    #[serde(default)]
    errors: Option<Value>,
}

/// One environment: a WebSocket session on an OpenEnv server.
pub struct Session {
    socket: WebSocket<Stream>,
    url: String,
    timeout: Duration,
}

/// A session's connection: to a server's address, or to a sidecar's Unix socket.
#[derive(Debug)]
pub enum Stream {
    Tcp(TcpStream),
    Unix(UnixStream),
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match self {
            Stream::Tcp(stream) => stream.read(buf),
            Stream::Unix(stream) => stream.read(buf),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match self {
            Stream::Tcp(stream) => stream.write(buf),
            Stream::Unix(stream) => stream.write(buf),
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        match self {
            Stream::Tcp(stream) => stream.flush(),
            Stream::Unix(stream) => stream.flush(),
        }
    }
}

/// The prefix of a sidecar's server: `unix:` and its socket's path. Only the worker writes one
/// (a spec's url is http); a local file, not a destination the outbound policy governs.
pub const UNIX: &str = "unix:";

impl Session {
    /// Opens a session on the server at `server` (`http://host:port`, its `/ws` route; or
    /// `unix:PATH`, a sidecar's socket) within `timeout`, which also bounds every later request.
    pub fn open(server: &str, policy: &Policy, timeout: Duration) -> Result<Session, EnvError> {
        if let Some(path) = server.strip_prefix(UNIX) {
            let connect = |message: String| EnvError::Connect { url: server.to_owned(), message };
            let stream = UnixStream::connect(path).map_err(|error| connect(error.to_string()))?;
            for set in [UnixStream::set_read_timeout, UnixStream::set_write_timeout] {
                set(&stream, Some(timeout)).map_err(|error| connect(error.to_string()))?;
            }
            return Self::handshake("ws://localhost/ws", Stream::Unix(stream), server, timeout);
        }
        let checked = policy.check_url(server)?;
        let url = server.to_owned();
        let connect = |message: String| EnvError::Connect { url: url.clone(), message };
        if checked.scheme() != "http" {
            return Err(connect("only http:// environment servers are supported (no TLS yet)".into()));
        }
        let host = checked.host_str().ok_or_else(|| connect("the url has no host".into()))?.to_owned();
        let port = checked.port_or_known_default().unwrap_or(80);
        let addrs = (host.as_str(), port).to_socket_addrs().map_err(|error| connect(error.to_string()))?;
        let mut last = None;
        let mut stream = None;
        // A name's addresses are checked as DNS gives them; an address written in the url was
        // checked, with its port, by check_url.
        let named = matches!(checked.host(), Some(url::Host::Domain(_)));
        for addr in addrs {
            if named {
                policy.check_addr(&host, addr.ip())?;
            }
            match TcpStream::connect_timeout(&addr, timeout) {
                Ok(connected) => {
                    stream = Some(connected);
                    break;
                }
                Err(error) => last = Some(error),
            }
        }
        let stream = stream.ok_or_else(|| {
            connect(last.map_or_else(|| "the host resolves to no address".to_owned(), |e| e.to_string()))
        })?;
        for set in [TcpStream::set_read_timeout, TcpStream::set_write_timeout] {
            set(&stream, Some(timeout)).map_err(|error| connect(error.to_string()))?;
        }
        let mut ws = checked.clone();
        ws.set_scheme("ws").map_err(|()| connect("not a url a WebSocket can take".into()))?;
        let path = format!("{}/ws", ws.path().trim_end_matches('/'));
        ws.set_path(&path);
        Self::handshake(ws.as_str(), Stream::Tcp(stream), &url, timeout)
    }

    /// The WebSocket handshake for `ws` on a connected `stream` to `server`.
    fn handshake(ws: &str, stream: Stream, server: &str, timeout: Duration) -> Result<Session, EnvError> {
        let url = server.to_owned();
        let (socket, _) = tungstenite::client::client(ws, stream).map_err(|error| match error {
            tungstenite::HandshakeError::Failure(error) => {
                EnvError::Connect { url: url.clone(), message: format!("WebSocket handshake: {error}") }
            }
            tungstenite::HandshakeError::Interrupted(_) => EnvError::Timeout {
                url: url.clone(),
                what: "the WebSocket handshake",
                seconds: timeout.as_secs_f64(),
            },
        })?;
        Ok(Session { socket, url, timeout })
    }

    /// Starts an episode; `args` are `reset`'s keyword arguments (`seed`, the environment's own).
    pub fn reset(&mut self, args: &Map<String, Value>) -> Result<Reply, EnvError> {
        self.exchange("reset", &Request::Reset(args))
    }

    /// One action.
    pub fn step(&mut self, action: &Value) -> Result<Reply, EnvError> {
        self.exchange("step", &Request::Step(action))
    }

    /// Ends the session (the server frees its environment).
    pub fn close(mut self) {
        self.close_quietly();
    }

    fn close_quietly(&mut self) {
        if let Ok(text) = serde_json::to_string(&Request::Close) {
            let _ = self.socket.send(Message::text(text));
        }
        let _ = self.socket.close(None);
        let _ = self.socket.flush();
    }

    fn exchange(&mut self, what: &'static str, request: &Request<'_>) -> Result<Reply, EnvError> {
        let text = serde_json::to_string(request).map_err(|error| self.protocol(error.to_string()))?;
        // A server at capacity answers the connection with an error frame and closes it: what it
        // said is still there to read when the send fails.
        let sent = self.socket.send(Message::text(text));
        loop {
            match self.socket.read() {
                Ok(Message::Text(frame)) => return read_answer(&self.url, what, frame.as_str()),
                Ok(Message::Binary(_)) => {
                    return Err(self.protocol(format!("a binary frame in answer to {what}")));
                }
                Ok(Message::Close(frame)) => {
                    let why =
                        frame.map_or_else(String::new, |frame| format!(": {} {}", frame.code, frame.reason));
                    return Err(
                        self.protocol(format!("the server closed the session in answer to {what}{why}"))
                    );
                }
                Ok(Message::Ping(_) | Message::Pong(_) | Message::Frame(_)) => {}
                Err(tungstenite::Error::Io(error))
                    if matches!(error.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) =>
                {
                    return Err(EnvError::Timeout {
                        url: self.url.clone(),
                        what,
                        seconds: self.timeout.as_secs_f64(),
                    });
                }
                Err(error) => {
                    let message = match &sent {
                        Err(send) => format!("{what}: {send}; then {error}"),
                        Ok(()) => format!("{what}: {error}"),
                    };
                    return Err(self.protocol(message));
                }
            }
        }
    }

    fn protocol(&self, message: String) -> EnvError {
        EnvError::Protocol { url: self.url.clone(), message }
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        if self.socket.can_write() {
            self.close_quietly();
        }
    }
}

/// The reply in `frame`, an answer to `what` from the server at `url`, or the error it says.
fn read_answer(url: &str, what: &'static str, frame: &str) -> Result<Reply, EnvError> {
    let protocol = |message: String| EnvError::Protocol { url: url.to_owned(), message };
    let answer: Answer = serde_json::from_str(frame).map_err(|error| {
        protocol(format!("an answer to {what} that does not read ({error}): {}", cut(frame)))
    })?;
    match answer {
        Answer::Observation(data) => Ok(Reply {
            observation: data.observation,
            reward: match data.reward {
                None | Some(Value::Null) => None,
                Some(Value::Bool(value)) => Some(f64::from(u8::from(value))),
                Some(Value::Number(number)) => number.as_f64(),
                Some(other) => return Err(protocol(format!("a reward that is not a number: {other}"))),
            },
            done: data.done,
        }),
        Answer::Error(error) if error.code.as_deref() == Some("CAPACITY_REACHED") => {
            Err(EnvError::Capacity {
                url: url.to_owned(),
                active: error.active_sessions,
                max: error.max_sessions,
            })
        }
        Answer::Error(error) => {
            let details =
                error.errors.map_or_else(String::new, |errors| format!(" {}", cut(&errors.to_string())));
            Err(EnvError::Env {
                url: url.to_owned(),
                what,
                code: error.code.unwrap_or_else(|| "no code".to_owned()),
                message: format!("{}{details}", error.message),
            })
        }
        Answer::State(_) => Err(protocol(format!("a state frame in answer to {what}"))),
    }
}

/// At most 500 bytes of `text`, cut at a character.
fn cut(text: &str) -> &str {
    let mut end = text.len().min(500);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// The frames as OpenEnv 0.10.0's server reads them (`WSResetMessage`, `WSStepMessage`,
    /// `WSCloseMessage`: `type` and, but for close, `data`).
    #[test]
    fn requests_are_openenvs_frames() {
        let args = json!({"a": 12, "seed": 3});
        let cases = [
            (
                Request::Reset(args.as_object().unwrap()),
                json!({"type": "reset", "data": {"a": 12, "seed": 3}}),
            ),
            (Request::Step(&json!({"answer": "42"})), json!({"type": "step", "data": {"answer": "42"}})),
            (Request::Close, json!({"type": "close"})),
        ];
        for (request, expected) in cases {
            assert_eq!(serde_json::to_value(&request).unwrap(), expected);
        }
    }

    /// Answers as OpenEnv 0.10.0's server writes them (taken from a real server's frames), and
    /// the error each of its refusals becomes.
    #[test]
    fn answers_read_as_replies_and_errors() {
        let frames = [
            (
                r#"{"type":"observation","data":{"observation":{"metadata":{},"text":" no:42 12+30="},"reward":0.0,"done":false}}"#,
                "reply reward Some(0.0) done false",
            ),
            (
                r#"{"type":"observation","data":{"observation":{"text":""},"reward":true,"done":true}}"#,
                "reply reward Some(1.0) done true",
            ),
            (
                r#"{"type":"observation","data":{"observation":{},"reward":null,"done":false}}"#,
                "reply reward None done false",
            ),
            (
                r#"{"type":"error","data":{"message":"Server at capacity","code":"CAPACITY_REACHED","active_sessions":2,"max_sessions":2}}"#,
                "http://env:8000: the server holds at most 2 sessions at once and refused another (2 open)",
            ),
            (
                r#"{"type":"error","data":{"message":"Invalid message","code":"VALIDATION_ERROR","errors":[{"type":"missing","loc":["answer"]}]}}"#,
                "http://env:8000: step failed (VALIDATION_ERROR): Invalid message [{\"loc\":[\"answer\"],\"type\":\"missing\"}]",
            ),
            (r#"{"type":"observation","data":{"reward":"high"}}"#, "a reward that is not a number"),
            (r#"{"type":"surprise"}"#, "does not read"),
        ];
        for (frame, expected) in frames {
            let got = match read_answer("http://env:8000", "step", frame) {
                Ok(reply) => format!("reply reward {:?} done {}", reply.reward, reply.done),
                Err(error) => error.to_string(),
            };
            assert!(got.contains(expected), "{frame}: {got}");
        }
    }
}
