//! The plugins' host context on stdin (`--host-context-stdin`): one JSON line the daemon writes
//! before anything else — the job's secrets and the outbound policy.
//!
//! It is read before anything else; a closed or cut-short stdin ends the worker `Transient`,
//! naming it. Every plugin of a run is created with that context (`create_in`); a run by hand gets
//! no secrets and no outbound restriction.

use std::io::BufRead;

use rlvr_plugin_api::HostContext;

use crate::WorkerError;

/// The longest context line read; a longer one is refused rather than read into memory.
pub const MAX_LINE_BYTES: u64 = 1 << 20;

/// Reads exactly one line from `input` as a [`HostContext`]. A closed or cut-short stream is an
/// error naming that, never a wait; no message quotes the line (it holds secret values).
pub fn read_host_context(input: impl BufRead) -> Result<HostContext, WorkerError> {
    let mut line = Vec::new();
    let read = input
        .take(MAX_LINE_BYTES + 1)
        .read_until(b'\n', &mut line)
        .map_err(|error| WorkerError::HostContext(format!("cannot read stdin: {error}")))?;
    if read == 0 {
        return Err(WorkerError::HostContext("stdin closed before the host context line".into()));
    }
    if line.last() != Some(&b'\n') {
        return Err(WorkerError::HostContext(if read as u64 > MAX_LINE_BYTES {
            format!("the host context line is longer than {MAX_LINE_BYTES} bytes")
        } else {
            "stdin closed before the end of the host context line".into()
        }));
    }
    let text = std::str::from_utf8(&line)
        .map_err(|_| WorkerError::HostContext("the host context line is not UTF-8".into()))?;
    HostContext::from_json(text).map_err(|error| WorkerError::HostContext(error.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(input: &[u8], expected: Result<&str, &str>) {
        match (read_host_context(input), expected) {
            (Ok(context), Ok(json)) => assert_eq!(context, HostContext::from_json(json).unwrap()),
            (Err(error), Err(message)) => {
                assert_eq!(error.to_string(), format!("--host-context-stdin: {message}"))
            }
            (got, expected) => {
                panic!("{:?}: got {got:?}, expected {expected:?}", String::from_utf8_lossy(input))
            }
        }
    }

    #[test]
    fn one_line_is_read_and_a_closed_stream_is_named() {
        let line = r#"{"secrets": {"t": "s3cret"}, "outbound_allow": ["g.example"], "outbound_allow_private": false}"#;
        check(format!("{line}\n").as_bytes(), Ok(line));
        check(format!("{line}\nmore input\n").as_bytes(), Ok(line));
        check(b"{}\n", Ok("{}"));
        check(b"", Err("stdin closed before the host context line"));
        check(br#"{"secrets": {"t": "s3cr"#, Err("stdin closed before the end of the host context line"));
        check(b"{\"secrets\": 5}\n", Err("host context: not the host context's shape at line 1 column 13"));
        check(b"\xff\n", Err("the host context line is not UTF-8"));
        let long = vec![b' '; MAX_LINE_BYTES as usize + 10];
        check(&long, Err("the host context line is longer than 1048576 bytes"));
    }

    #[test]
    fn errors_never_quote_the_line() {
        for input in
            [&b"{\"secrets\": {\"t\": \"s3cret\"}\n"[..], b"{\"secrets\": {\"t\": \"s3cret\", \"u\": 1}}\n"]
        {
            let error = read_host_context(input).unwrap_err().to_string();
            assert!(!error.contains("s3cret"), "{error}");
        }
    }
}
