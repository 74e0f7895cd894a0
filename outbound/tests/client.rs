//! The clients against real local servers: redirects are answers, a name that resolves to a
//! refused address is never connected to, an address url is checked before any IO; async and
//! blocking alike.

use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use rlvr_outbound::{Policy, Refusal, blocking, refusal_of};

/// A server on 127.0.0.1 that answers every request with `answer` and counts them.
struct Server {
    port: u16,
    requests: Arc<AtomicUsize>,
}

impl Server {
    fn start(answer: String) -> Server {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let requests = Arc::new(AtomicUsize::new(0));
        let counted = requests.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                counted.fetch_add(1, Ordering::SeqCst);
                let mut reader = BufReader::new(stream);
                loop {
                    let mut line = String::new();
                    if reader.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
                        break;
                    }
                }
                let _ = reader.into_inner().write_all(answer.as_bytes());
            }
        });
        Server { port, requests }
    }

    fn ok() -> Server {
        Server::start("HTTP/1.1 200 OK\r\ncontent-length: 0\r\nconnection: close\r\n\r\n".to_owned())
    }

    /// Answers 302 to `target`.
    fn redirecting_to(target: &str) -> Server {
        Server::start(format!(
            "HTTP/1.1 302 Found\r\nlocation: {target}\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
        ))
    }

    fn requests(&self) -> usize {
        self.requests.load(Ordering::SeqCst)
    }
}

fn policy(allow: &[&str], allow_private: bool) -> Policy {
    let allow: Vec<String> = allow.iter().map(|entry| (*entry).to_owned()).collect();
    Policy::new(&allow, allow_private).unwrap()
}

fn client(policy: Policy) -> rlvr_outbound::Client {
    let builder = reqwest::Client::builder().timeout(Duration::from_secs(10));
    rlvr_outbound::Client::new(policy, builder).unwrap()
}

fn blocking_client(policy: Policy) -> blocking::Client {
    let builder = reqwest::blocking::Client::builder().timeout(Duration::from_secs(10));
    blocking::Client::new(policy, builder).unwrap()
}

const RESOLVES_TO_LOOPBACK: &str = "localhost resolves to a non-public address (private, loopback, \
                                    link-local or reserved); outbound requests go only to public addresses";

#[tokio::test]
async fn a_redirect_is_the_answer_and_its_target_gets_nothing() {
    let target = Server::ok();
    let redirect = Server::redirecting_to(&format!("http://127.0.0.1:{}/", target.port));
    let client = client(policy(&["127.0.0.1/32"], false));
    let answer =
        client.post(&format!("http://127.0.0.1:{}/hook", redirect.port)).unwrap().send().await.unwrap();
    assert_eq!(answer.status().as_u16(), 302);
    assert_eq!((redirect.requests(), target.requests()), (1, 0));
}

#[tokio::test]
async fn a_listed_name_that_resolves_to_loopback_is_never_connected_to() {
    let server = Server::ok();
    let client = client(policy(&["localhost"], false));
    let error = client.post(&format!("http://localhost:{}/", server.port)).unwrap().send().await.unwrap_err();
    assert_eq!(refusal_of(&error).map(ToString::to_string).as_deref(), Some(RESOLVES_TO_LOOPBACK));
    assert_eq!(server.requests(), 0);

    // The operator may open private addresses for listed names.
    let client = self::client(policy(&["localhost"], true));
    let answer = client.post(&format!("http://localhost:{}/", server.port)).unwrap().send().await.unwrap();
    assert_eq!(answer.status().as_u16(), 200);
    assert_eq!(server.requests(), 1);
}

#[tokio::test]
async fn an_address_url_is_refused_before_any_io() {
    let server = Server::ok();
    let client = client(policy(&["localhost", "10.0.0.0/8"], false));
    let url = format!("http://127.0.0.1:{}/", server.port);
    let refusal = client.post(&url).unwrap_err();
    assert_eq!(refusal, Refusal::NonPublicAddress { address: [127, 0, 0, 1].into(), what: "loopback" });
    // A private network the operator listed is allowed (not sent here: nothing listens there).
    assert!(client.post("http://10.0.0.1/").is_ok());
    assert!(matches!(client.get("file:///etc/passwd"), Err(Refusal::Scheme { .. })));
    assert_eq!(server.requests(), 0);
}

#[test]
fn the_blocking_client_checks_the_same() {
    let target = Server::ok();
    let redirect = Server::redirecting_to(&format!("http://127.0.0.1:{}/", target.port));
    let client = blocking_client(policy(&["127.0.0.1/32"], false));
    let answer = client.post(&format!("http://127.0.0.1:{}/", redirect.port)).unwrap().send().unwrap();
    assert_eq!(answer.status().as_u16(), 302);
    assert_eq!(target.requests(), 0);

    let client = blocking_client(policy(&["localhost"], false));
    let error = client.post(&format!("http://localhost:{}/", target.port)).unwrap().send().unwrap_err();
    assert_eq!(refusal_of(&error).map(ToString::to_string).as_deref(), Some(RESOLVES_TO_LOOPBACK));
    assert!(client.post("http://[::ffff:127.0.0.1]/").is_err());
    assert_eq!(target.requests(), 0);
}
