//! No proxy from the environment: `HTTP_PROXY` would connect on the client's behalf to wherever
//! the url says, past the resolver's checks. Its own test binary, as it sets the process's env.

use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use rlvr_outbound::Policy;

/// A server on 127.0.0.1 that answers 200 to everything and counts the connections.
fn server() -> (u16, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let count = Arc::new(AtomicUsize::new(0));
    let counted = count.clone();
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
            let answer = "HTTP/1.1 200 OK\r\ncontent-length: 0\r\nconnection: close\r\n\r\n";
            let _ = reader.into_inner().write_all(answer.as_bytes());
        }
    });
    (port, count)
}

// regression: an env proxy would bypass the outbound checks (the proxy connects, not us)
#[test]
fn an_environment_proxy_is_not_used() {
    let (proxy_port, proxied) = server();
    let (port, direct) = server();
    let proxy = format!("http://127.0.0.1:{proxy_port}");
    // SAFETY: this test binary has this one test; nothing else reads the environment meanwhile.
    unsafe {
        for name in ["HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"] {
            std::env::set_var(name, &proxy);
        }
        std::env::remove_var("NO_PROXY");
        std::env::remove_var("no_proxy");
    }
    let _ = rustls::crypto::ring::default_provider().install_default();
    let url = format!("http://127.0.0.1:{port}/hook");

    // A plain client goes through the proxy: what the environment does when nothing stops it.
    let plain = reqwest::blocking::Client::builder().timeout(Duration::from_secs(10)).build().unwrap();
    plain.post(&url).send().unwrap();
    assert_eq!((proxied.load(Ordering::SeqCst), direct.load(Ordering::SeqCst)), (1, 0));

    let policy = Policy::new(&["127.0.0.1/32".to_owned()], false).unwrap();
    let builder = reqwest::blocking::Client::builder().timeout(Duration::from_secs(10));
    let client = rlvr_outbound::blocking::Client::new(policy, builder).unwrap();
    client.post(&url).unwrap().send().unwrap();
    assert_eq!((proxied.load(Ordering::SeqCst), direct.load(Ordering::SeqCst)), (1, 1));
}
