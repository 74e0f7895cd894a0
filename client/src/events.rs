//! Following a job: its server-sent event stream (`GET /v1/jobs/{id}/events`) read to the job's
//! final state, reconnecting with `Last-Event-ID` (nothing missed, nothing repeated) when the
//! stream drops or the daemon restarts. What each event looks like on screen is the caller's:
//! a [`View`].

use std::io::{BufRead, BufReader};
use std::time::{Duration, Instant};

use reqwest::blocking::Response;
use reqwest::header::{ACCEPT, CONTENT_TYPE};
use rlvr_protocol::job::{JobEvent, JobView};
use rlvr_protocol::pipeline::PipelineEvent;

use crate::client::Client;
use crate::error::HttpError;

/// One server-sent event.
#[derive(Debug, Clone, PartialEq)]
pub struct SseEvent {
    /// `message` when the event named none.
    pub event: String,
    /// The data lines, joined with `\n`.
    pub data: String,
}

/// The server-sent events parser of the WHATWG HTML spec (§9.2.6), fed one line at a time.
#[derive(Debug, Default)]
pub struct SseParser {
    event: String,
    data: String,
    /// The id of the event being received; becomes `last_id` when the event is complete.
    id: Option<String>,
    /// The last complete event's id: what to send as `Last-Event-ID` when reconnecting.
    last_id: Option<String>,
}

impl SseParser {
    /// Feeds one line, without its line ending; a blank line completes an event.
    pub fn line(&mut self, line: &str) -> Option<SseEvent> {
        if line.is_empty() {
            return self.dispatch();
        }
        if line.starts_with(':') {
            return None; // a comment: the daemon's keep-alive
        }
        let (field, value) = match line.split_once(':') {
            Some((field, value)) => (field, value.strip_prefix(' ').unwrap_or(value)),
            None => (line, ""),
        };
        match field {
            "event" => self.event = value.to_owned(),
            "data" => {
                self.data.push_str(value);
                self.data.push('\n');
            }
            "id" if !value.contains('\0') => self.id = Some(value.to_owned()),
            _ => {} // `retry` (the follower has its own backoff) and unknown fields
        }
        None
    }

    fn dispatch(&mut self) -> Option<SseEvent> {
        self.last_id.clone_from(&self.id);
        let event = std::mem::take(&mut self.event);
        let mut data = std::mem::take(&mut self.data);
        if data.is_empty() {
            return None;
        }
        data.pop(); // the last line's `\n`
        Some(SseEvent { event: if event.is_empty() { "message".to_owned() } else { event }, data })
    }

    /// Forgets a half-received event (the connection dropped in its middle); keeps `last_id`.
    pub fn reconnect(&mut self) {
        self.event.clear();
        self.data.clear();
        self.id.clone_from(&self.last_id);
    }

    /// The last complete event's id, sent as `Last-Event-ID` when reconnecting.
    pub fn last_id(&self) -> Option<&str> {
        self.last_id.as_deref()
    }
}

/// What a job event stream said.
#[derive(Debug)]
pub enum Update {
    /// A change of state (`state` event).
    State(JobEvent),
    /// The job after a step (`progress` event).
    Progress(Box<JobView>),
}

/// A `state` or `progress` event's data; other event names are ignored.
pub fn parse_update(event: &SseEvent) -> Result<Option<Update>, String> {
    match event.event.as_str() {
        "state" => serde_json::from_str(&event.data)
            .map(|state| Some(Update::State(state)))
            .map_err(|error| format!("a state event: {error}")),
        "progress" => serde_json::from_str(&event.data)
            .map(|job| Some(Update::Progress(Box::new(job))))
            .map_err(|error| format!("a progress event: {error}")),
        _ => Ok(None),
    }
}

/// How a follower shows a job. `raw` is the event's data as the daemon sent it.
pub trait View {
    /// A change of state.
    fn state(&mut self, event: &JobEvent, raw: &str);
    /// The job after a step.
    fn progress(&mut self, job: &JobView, raw: &str);
    /// The stream dropped; the next try is in `wait`.
    fn reconnecting(&mut self, _why: &str, _wait: Duration) {}
    /// A stream is open (again).
    fn connected(&mut self) {}
}

/// How long [`Client::follow`] tries to get a stream back (no stream opened) before it gives up.
pub const RECONNECT_GIVE_UP: Duration = Duration::from_secs(300);

/// Reconnect waits: 0.5 s, doubling to 10 s; back to the start once events flow again.
struct Backoff {
    next: Duration,
}

impl Backoff {
    const FIRST: Duration = Duration::from_millis(500);
    const MAX: Duration = Duration::from_secs(10);

    fn new() -> Self {
        Backoff { next: Self::FIRST }
    }

    fn next(&mut self) -> Duration {
        let wait = self.next;
        self.next = (self.next * 2).min(Self::MAX);
        wait
    }

    fn reset(&mut self) {
        self.next = Self::FIRST;
    }
}

impl Client {
    /// Reads job `id`'s event stream until its final state, which it returns, showing each
    /// event on `view`; reconnects (with `Last-Event-ID`) when the stream drops or the daemon
    /// restarts, and gives up after [`RECONNECT_GIVE_UP`] without a stream.
    pub fn follow<V: View + ?Sized>(&self, id: &str, view: &mut V) -> Result<JobEvent, HttpError> {
        let streams = self.stream_http()?;
        let url = self.url(&["v1", "jobs", id, "events"], &[]);
        let mut parser = SseParser::default();
        let mut backoff = Backoff::new();
        // The give-up clock runs from the first failure since a stream last said anything
        // (events or keep-alives): a job may wait queued for hours on one quiet, healthy stream.
        let mut down_since: Option<Instant> = None;
        loop {
            parser.reconnect();
            let opened = self.send(&url, || {
                let request = self.authorize(streams.get(url.clone())).header(ACCEPT, "text/event-stream");
                match parser.last_id() {
                    Some(last) => request.header("Last-Event-ID", last),
                    None => request,
                }
            });
            let mut server_wait = None;
            let why = match opened {
                Ok(response) => {
                    view.connected();
                    let (end, alive) = read_stream(response, &mut parser, view)?;
                    // Only something read proves a stream works: one that closes at once must
                    // neither retry hot nor keep the give-up clock from running.
                    if alive {
                        backoff.reset();
                        down_since = None;
                    }
                    match end {
                        StreamEnd::Ended(event) => return Ok(event),
                        StreamEnd::Closed => "the daemon closed the stream".to_owned(),
                        StreamEnd::Broken(why) => why,
                    }
                }
                Err(error) if error.is_transient() => {
                    server_wait = error.retry_after();
                    error.short()
                }
                Err(error) => return Err(error),
            };
            if down_since.get_or_insert_with(Instant::now).elapsed() >= RECONNECT_GIVE_UP {
                return Err(HttpError::Unreachable {
                    url: url.to_string(),
                    detail: format!(
                        "no stream for {} s ({why}); the job goes on: `rlvrctl watch {id}` follows it again",
                        RECONNECT_GIVE_UP.as_secs()
                    ),
                });
            }
            // A busy daemon's Retry-After is the least we wait: hammering it spends the team's
            // rate.
            let wait = backoff.next().max(server_wait.unwrap_or_default());
            view.reconnecting(&why, wait);
            std::thread::sleep(wait);
        }
    }
}

impl Client {
    /// Pipeline `id`'s events (`GET /v1/pipelines/{id}/events`) from the first, read from one
    /// stream until the daemon ends it, which it does after the pipeline's final event: for a
    /// pipeline that has ended, or a caller that waits for its end. No reconnecting: a stream
    /// cut short answers the events read so far.
    pub fn pipeline_events(&self, id: &str) -> Result<Vec<PipelineEvent>, HttpError> {
        let streams = self.stream_http()?;
        let url = self.url(&["v1", "pipelines", id, "events"], &[]);
        let response =
            self.send(&url, || self.authorize(streams.get(url.clone())).header(ACCEPT, "text/event-stream"))?;
        let mut parser = SseParser::default();
        let mut events = Vec::new();
        for line in BufReader::new(response).lines() {
            let Ok(line) = line else { break };
            let Some(event) = parser.line(line.trim_end_matches('\r')) else { continue };
            if event.event == "state" {
                let event = serde_json::from_str(&event.data).map_err(|error| HttpError::BadAnswer {
                    url: url.to_string(),
                    detail: format!("a pipeline event that is not a PipelineEvent: {error}"),
                })?;
                events.push(event);
            }
        }
        Ok(events)
    }
}

enum StreamEnd {
    /// The job reached a final state.
    Ended(JobEvent),
    /// The stream ended without one (the daemon stopping).
    Closed,
    /// Reading failed (a cut connection, a silent one).
    Broken(String),
}

/// Reads events until the stream ends; also says whether any complete line came (an event or a
/// keep-alive: the stream was alive).
fn read_stream<V: View + ?Sized>(
    response: Response,
    parser: &mut SseParser,
    view: &mut V,
) -> Result<(StreamEnd, bool), HttpError> {
    let url = response.url().to_string();
    let content_type = response.headers().get(CONTENT_TYPE).and_then(|value| value.to_str().ok());
    if !content_type.is_some_and(|value| value.starts_with("text/event-stream")) {
        let detail = format!("expected an event stream, got content type {:?}", content_type.unwrap_or(""));
        return Err(HttpError::BadAnswer { url, detail });
    }
    let mut reader = BufReader::new(response);
    let mut line = Vec::new();
    let mut alive = false;
    let mut first = true;
    loop {
        line.clear();
        match reader.read_until(b'\n', &mut line) {
            Ok(0) => return Ok((StreamEnd::Closed, alive)),
            Ok(_) => {}
            Err(error) => return Ok((StreamEnd::Broken(format!("the stream broke: {error}")), alive)),
        }
        // A last line without its line ending was cut: its event is incomplete.
        if line.last() != Some(&b'\n') {
            return Ok((StreamEnd::Closed, alive));
        }
        let text = String::from_utf8_lossy(&line);
        let mut text = text.trim_end_matches(['\n', '\r']);
        if first {
            text = text.trim_start_matches('\u{feff}');
            first = false;
        }
        alive = true;
        let Some(event) = parser.line(text) else { continue };
        match parse_update(&event) {
            Ok(Some(Update::State(state))) => {
                view.state(&state, &event.data);
                if state.state.is_terminal() {
                    return Ok((StreamEnd::Ended(state), alive));
                }
            }
            Ok(Some(Update::Progress(job))) => view.progress(&job, &event.data),
            Ok(None) => {}
            Err(detail) => return Err(HttpError::BadAnswer { url, detail }),
        }
    }
}

#[cfg(test)]
mod tests {
    use rlvr_protocol::job::JobState;

    use super::*;

    /// Feeds `stream` line by line; expects `expected` as `(event, data)` and the last id.
    fn check_sse(stream: &str, expected: &[(&str, &str)], last_id: Option<&str>) {
        let mut parser = SseParser::default();
        let events: Vec<SseEvent> =
            stream.split('\n').filter_map(|line| parser.line(line.trim_end_matches('\r'))).collect();
        let events: Vec<(&str, &str)> = events.iter().map(|e| (e.event.as_str(), e.data.as_str())).collect();
        assert_eq!(events, expected, "stream {stream:?}");
        assert_eq!(parser.last_id(), last_id, "stream {stream:?}");
    }

    #[test]
    fn sse_events_fields_and_comments() {
        // What axum sends: event, id, data, blank line; keep-alives are comments.
        check_sse(
            "event: state\nid: 17-0\ndata: {\"a\":1}\n\n:\n: keep-alive\nevent: progress\ndata: {}\n\n",
            &[("state", "{\"a\":1}"), ("progress", "{}")],
            Some("17-0"),
        );
        // Several data lines join with \n; no space after the colon; CRLF endings.
        check_sse("data:one\r\ndata: two\r\n\r\n", &[("message", "one\ntwo")], None);
        // Only one leading space is dropped; a field without a colon has an empty value.
        check_sse("data:  x\ndata\n\n", &[("message", " x\n")], None);
        // No data: nothing dispatched, but the id still counts; unknown fields and retry ignored.
        check_sse("id: 5-1\nretry: 100\nfoo: bar\n\n", &[], Some("5-1"));
        // An event is complete only at its blank line.
        check_sse("event: state\ndata: {}", &[], None);
        // An id with NUL is ignored.
        check_sse("id: a\0b\ndata: x\n\n", &[("message", "x")], None);
    }

    #[test]
    fn sse_reconnect_forgets_the_half_event_and_resumes_after_the_last_complete_one() {
        let mut parser = SseParser::default();
        for line in ["event: state", "id: 1-0", "data: {}", ""] {
            parser.line(line);
        }
        // The connection drops in the middle of the next event, after its id line.
        for line in ["event: state", "id: 2-0", "data: {\"half"] {
            assert_eq!(parser.line(line), None);
        }
        parser.reconnect();
        assert_eq!(parser.last_id(), Some("1-0"), "event 2-0 never arrived whole");
        // The new connection's first event is not polluted by the half one.
        assert_eq!(parser.line("data: {}"), None);
        assert_eq!(parser.line(""), Some(SseEvent { event: "message".to_owned(), data: "{}".to_owned() }));
        assert_eq!(parser.last_id(), Some("1-0"));
    }

    #[test]
    fn updates_parse_from_the_daemons_event_data() {
        let state = SseEvent {
            event: "state".to_owned(),
            data: r#"{"id":"1-0","at":"2026-11-21T12:00:01.000Z","state":"running","reason":"worker pid 123 started","step":0}"#.to_owned(),
        };
        let Ok(Some(Update::State(event))) = parse_update(&state) else { panic!("a state event") };
        assert_eq!((event.state, event.reason.as_str()), (JobState::Running, "worker pid 123 started"));
        let bad = SseEvent { event: "state".to_owned(), data: "{}".to_owned() };
        assert!(parse_update(&bad).unwrap_err().starts_with("a state event: missing field"));
        let other = SseEvent { event: "hello".to_owned(), data: "{}".to_owned() };
        assert!(matches!(parse_update(&other), Ok(None)));
    }

    #[test]
    fn backoff_doubles_to_a_cap_and_resets() {
        let mut backoff = Backoff::new();
        let waits: Vec<u64> = (0..7).map(|_| backoff.next().as_millis() as u64).collect();
        assert_eq!(waits, [500, 1000, 2000, 4000, 8000, 10_000, 10_000]);
        backoff.reset();
        assert_eq!(backoff.next(), Duration::from_millis(500));
    }
}
