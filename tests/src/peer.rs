//! A local HTTP peer for the daemon's outbound requests (webhooks, the http verifier's grader):
//! one thread on `127.0.0.1`, one request per connection, the same answer to each, and every
//! request it received kept for the test to look at.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// A request as the peer received it.
#[derive(Debug, Clone, Default)]
pub struct Received {
    /// Header lines as `(lowercase name, value)`.
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Received {
    /// The first header named `name` (lowercase).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(n, _)| n == name).map(|(_, value)| value.as_str())
    }
}

/// The peer; it serves until the test process ends.
pub struct Peer {
    /// `127.0.0.1:PORT`.
    pub addr: String,
    received: Arc<Mutex<Vec<Received>>>,
}

impl Peer {
    /// A peer answering every request with `response`, a whole HTTP/1.1 response.
    pub fn start(response: String) -> Peer {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind a local port");
        let addr = listener.local_addr().expect("local address").to_string();
        let received = Arc::new(Mutex::new(Vec::new()));
        let log = received.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let mut reader = BufReader::new(stream);
                let mut request = Received::default();
                loop {
                    let mut line = String::new();
                    if reader.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
                        break;
                    }
                    if let Some((name, value)) = line.split_once(':') {
                        request.headers.push((name.trim().to_ascii_lowercase(), value.trim().to_owned()));
                    }
                }
                let length = request.header("content-length").and_then(|n| n.parse().ok()).unwrap_or(0);
                request.body = vec![0; length];
                if reader.read_exact(&mut request.body).is_err() {
                    continue;
                }
                log.lock().expect("peer log").push(request);
                let _ = reader.into_inner().write_all(response.as_bytes());
            }
        });
        Peer { addr, received }
    }

    /// A peer answering 200 with `body` (JSON).
    pub fn ok(body: &str) -> Peer {
        Peer::start(format!(
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
            body.len()
        ))
    }

    /// A peer answering 302 to `location`.
    pub fn redirecting_to(location: &str) -> Peer {
        Peer::start(format!(
            "HTTP/1.1 302 Found\r\nlocation: {location}\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
        ))
    }

    /// `http://127.0.0.1:PORT{path}`.
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// The requests received so far.
    pub fn received(&self) -> Vec<Received> {
        self.received.lock().expect("peer log").clone()
    }

    /// The first request, waiting up to `timeout` for it.
    pub fn first(&self, timeout: Duration) -> Option<Received> {
        crate::wait_until(timeout, || !self.received().is_empty());
        self.received().into_iter().next()
    }
}
