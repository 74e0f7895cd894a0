//! The daemon's side of a worker's grant socket, for tests that run `rlvr-worker` without a
//! daemon.

use std::path::Path;

/// The daemon's side of the grant socket, for one worker: grants every phase at once, records
/// the requests (`job ID`, `acquire PHASE`, `release`; each also sent to `log` before it is
/// answered), and closes the connection instead of answering when the worker asks for
/// `fail_at`. It speaks the protocol's own types.
pub fn grant_peer(
    socket: &Path,
    fail_at: Option<rlvr_protocol::grants::Phase>,
    log: Option<std::sync::mpsc::Sender<String>>,
) -> std::thread::JoinHandle<Vec<String>> {
    use std::io::{BufRead, BufReader, Write};

    use rlvr_protocol::grants::{Answer, Request};

    let listener = std::os::unix::net::UnixListener::bind(socket).unwrap();
    std::thread::spawn(move || {
        let (stream, _) = listener.accept().unwrap();
        let mut writer = stream.try_clone().unwrap();
        let mut requests = Vec::new();
        for line in BufReader::new(stream).lines() {
            let Ok(line) = line else { break };
            let seen = requests.len();
            let answer = match serde_json::from_str::<Request>(&line).unwrap() {
                Request::Job(id) => {
                    requests.push(format!("job {id}"));
                    Answer::Ok
                }
                Request::Acquire(phase) => {
                    requests.push(format!("acquire {phase}"));
                    if Some(phase) == fail_at {
                        break;
                    }
                    Answer::Granted(phase)
                }
                Request::Release => {
                    requests.push("release".to_owned());
                    Answer::Released
                }
            };
            if let Some(log) = &log {
                requests[seen..].iter().for_each(|request| drop(log.send(request.clone())));
            }
            let mut text = serde_json::to_string(&answer).unwrap();
            text.push('\n');
            if writer.write_all(text.as_bytes()).is_err() {
                break;
            }
        }
        requests
    })
}
