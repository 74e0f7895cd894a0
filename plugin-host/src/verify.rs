//! Batch verification over JSONL, the engine of `rlvrctl verify` (design.md §1 formats).
//!
//! In, one object per line: `{"id", "prompt", "completion", "reference": {...}}`, with `"pred"`
//! accepted for `completion` and `"gold"` for `reference.answer`; other fields are ignored.
//! Out, one object per input line, same order: `{"id", "score", "passed", "components",
//! "extracted", "error", "timed_out", "latency_us", "verifier"}`, plus `"explanation"` when asked
//! for. A line that cannot be read (invalid UTF-8, bad JSON, a missing field) gets an output line
//! with `error` set; the other lines are still answered. Blank lines are skipped.
//!
//! Items run on `parallel` threads and the host enforces a deadline per item, whatever the
//! plugin does: a call still running at its deadline is answered with a timeout and left behind
//! (a thread inside a plugin cannot be stopped safely), and a fresh thread takes its place. When
//! too many calls are stuck this way, the rest of the batch is answered with an error instead of
//! piling up threads. A batch may also be given a [`Stop`] (a request gone, a budget spent): from
//! then on no item is handed to the plugin, each is answered with the stop's reason at once.
//!
//! Past 16 stuck calls the batch stops handing out work. Plugins that run untrusted or slow things
//! (code, http) enforce their own timeouts well inside the host's deadline; the host's is the
//! backstop. Running every verification in a child process instead would cost a spawn per item,
//! and the math verifier answers in microseconds.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::{self, BufRead, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rlvr_plugin_api::abi_stable::std_types::RResult;
use rlvr_plugin_api::{Verdict, VerifierBox, VerifyItem};
pub use rlvr_protocol::batch::{Components, OutputLine};
use serde_json::{Map, Value};

/// Calls left running past their deadline before the batch stops handing out work: each one holds
/// a thread (and maybe a core) until the process exits.
const MAX_STUCK_CALLS: usize = 16;

/// Counts of one batch.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct BatchSummary {
    /// Output lines written.
    pub items: usize,
    /// Items that passed.
    pub passed: usize,
    /// Items with `error` set (unreadable lines, verifier errors and timeouts).
    pub errors: usize,
    /// Items whose time ran out, in the plugin's own budget or at the host's deadline.
    pub timeouts: usize,
}

impl BatchSummary {
    fn count(&mut self, line: &OutputLine) {
        self.items += 1;
        self.passed += usize::from(line.passed);
        self.errors += usize::from(line.error.is_some());
        self.timeouts += usize::from(line.timed_out);
    }
}

/// When the work of a batch (or of several, a reward's graders) stops being wanted: its caller
/// cancelled, or its wall-clock budget ran out. Items not yet handed to a plugin are then answered
/// with the reason instead; calls already inside a plugin end at their own deadline.
#[derive(Debug)]
pub struct Stop {
    cancelled: AtomicBool,
    /// The budget and when it runs out; `None`: only a cancel stops the work.
    budget: Option<(Duration, Instant)>,
}

impl Stop {
    /// Stops when cancelled or once `budget` has passed from now.
    pub fn within(budget: Duration) -> Self {
        let ends = Instant::now().checked_add(budget);
        Stop { cancelled: AtomicBool::new(false), budget: ends.map(|ends| (budget, ends)) }
    }

    /// Stops only when cancelled.
    pub fn on_cancel() -> Self {
        Stop { cancelled: AtomicBool::new(false), budget: None }
    }

    /// No more work is wanted (the request that asked for it went away).
    pub fn cancel(&self) {
        self.cancelled.store(true, Ordering::Relaxed);
    }

    /// Why no more work is wanted; `None` while it is.
    pub fn reason(&self) -> Option<String> {
        if self.cancelled.load(Ordering::Relaxed) {
            return Some("not graded: the request was cancelled".to_owned());
        }
        let (budget, ends) = self.budget?;
        (Instant::now() >= ends)
            .then(|| format!("not graded: the request's budget of {} s ran out", budget.as_secs_f64()))
    }
}

/// How a batch runs.
#[derive(Debug, Clone)]
pub struct BatchOptions {
    /// The verifier's `name@version`, written into every output line.
    pub verifier_id: String,
    /// Items verified at once (at least 1).
    pub parallel: usize,
    /// The longest one call may take before the host answers the item with a timeout.
    pub deadline: Duration,
    /// Ask the verifier to explain each verdict, and write its lines as `explanation`.
    pub explain: bool,
    /// When to stop handing items to the plugin; `None`: never, every item is graded.
    pub stop: Option<Arc<Stop>>,
}

/// The constructors of an output line from what a plugin (or the host) answered.
trait Answered {
    fn failed(id: Option<String>, error: String) -> Self;
    fn from_verdict(id: Option<String>, verdict: Verdict, latency_us: u64) -> Self;
    fn deadline_passed(id: Option<String>, deadline: Duration) -> Self;
}

impl Answered for OutputLine {
    fn failed(id: Option<String>, error: String) -> Self {
        OutputLine {
            id,
            score: 0.0,
            passed: false,
            components: Components::default(),
            extracted: None,
            error: Some(error),
            timed_out: false,
            latency_us: 0,
            verifier: String::new(),
            explanation: None,
        }
    }

    fn from_verdict(id: Option<String>, verdict: Verdict, latency_us: u64) -> Self {
        let error = verdict.error.into_option().map(|error| error.into_string());
        if !verdict.score.is_finite() {
            return OutputLine::failed(id, format!("verifier returned a non-finite score {}", verdict.score));
        }
        let explanation = verdict.explanation.into_iter().map(|line| line.into_string()).collect();
        OutputLine {
            id,
            score: verdict.score,
            passed: verdict.passed && error.is_none(),
            components: Components(
                verdict.components.into_iter().map(|c| (c.name.into_string(), c.value)).collect(),
            ),
            extracted: verdict.extracted.into_option().map(|answer| answer.into_string()),
            timed_out: verdict.timed_out && error.is_some(),
            error,
            latency_us,
            verifier: String::new(),
            explanation: Some(explanation),
        }
    }

    fn deadline_passed(id: Option<String>, deadline: Duration) -> Self {
        let mut line = OutputLine::failed(
            id,
            format!("no verdict within the host's deadline of {} ms", deadline.as_millis()),
        );
        line.timed_out = true;
        line.latency_us = u64::try_from(deadline.as_micros()).unwrap_or(u64::MAX);
        line
    }
}

/// A parsed input line.
#[derive(Debug, PartialEq)]
pub struct InputItem {
    /// The caller's id.
    pub id: Option<String>,
    /// The prompt.
    pub prompt: String,
    /// The completion (or `pred`).
    pub completion: String,
    /// The reference object as JSON text, with `gold` folded in as `answer`.
    pub reference_json: String,
}

/// Parses one input line. On error, returns the id when it could be read, and the message.
pub fn parse_line(bytes: &[u8]) -> Result<InputItem, (Option<String>, String)> {
    let text = std::str::from_utf8(bytes)
        .map_err(|error| (None, format!("invalid UTF-8 at byte {}", error.valid_up_to())))?;
    let value: Value =
        serde_json::from_str(text).map_err(|error| (None, format!("invalid JSON: {error}")))?;
    let Value::Object(mut object) = value else {
        return Err((None, "expected a JSON object".to_owned()));
    };
    let id = match object.remove("id") {
        None | Some(Value::Null) => None,
        Some(Value::String(id)) => Some(id),
        Some(Value::Number(id)) => Some(id.to_string()),
        Some(_) => return Err((None, "id: expected a string".to_owned())),
    };
    let fail = |message: String| (id.clone(), message);
    let text_field = |object: &mut Map<String, Value>, name: &str| match object.remove(name) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(text)) => Ok(Some(text)),
        Some(_) => Err(format!("{name}: expected a string")),
    };
    let prompt = text_field(&mut object, "prompt").map_err(fail)?.unwrap_or_default();
    let completion = match (
        text_field(&mut object, "completion").map_err(fail)?,
        text_field(&mut object, "pred").map_err(fail)?,
    ) {
        (Some(completion), None) | (None, Some(completion)) => completion,
        (Some(_), Some(_)) => {
            return Err(fail("completion and pred both given: expected one of them".to_owned()));
        }
        (None, None) => {
            return Err(fail("completion: missing (expected a string, or its alias pred)".to_owned()));
        }
    };
    let mut reference = match object.remove("reference") {
        None | Some(Value::Null) => Map::new(),
        Some(Value::Object(reference)) => reference,
        Some(_) => return Err(fail("reference: expected a JSON object".to_owned())),
    };
    match object.remove("gold") {
        None | Some(Value::Null) => {}
        Some(gold @ (Value::String(_) | Value::Number(_))) => match reference.get("answer") {
            None => {
                reference.insert("answer".to_owned(), gold);
            }
            Some(answer) if *answer == gold => {}
            Some(_) => {
                return Err(fail(
                    "gold and reference.answer both given and differ: expected one of them".to_owned(),
                ));
            }
        },
        Some(_) => return Err(fail("gold: expected a string".to_owned())),
    }
    Ok(InputItem { id, prompt, completion, reference_json: Value::Object(reference).to_string() })
}

/// Verifies one parsed item on the calling thread (no deadline).
pub fn verify_item(verifier: &VerifierBox, item: &InputItem, explain: bool) -> OutputLine {
    let request = VerifyItem::new(
        item.id.as_deref().unwrap_or(""),
        &item.prompt,
        &item.completion,
        &item.reference_json,
    )
    .explaining(explain);
    let started = Instant::now();
    let result = verifier.verify(request);
    let latency_us = u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX);
    match result {
        RResult::ROk(verdict) => OutputLine::from_verdict(item.id.clone(), verdict, latency_us),
        RResult::RErr(error) => {
            let mut line = OutputLine::failed(item.id.clone(), error.to_string());
            line.latency_us = latency_us;
            line
        }
    }
}

/// What the reader, the workers and the writer tell the batch's main loop.
enum Event {
    /// Input line `index` (0-based among non-blank lines), parsed or not.
    Line(usize, Result<InputItem, (Option<String>, String)>),
    /// The input ended.
    Eof,
    /// The input could not be read.
    ReadError(io::Error),
    /// A worker began item `index`.
    Started(usize, Instant),
    /// A worker finished item `index`.
    Finished(usize, OutputLine),
}

/// Reads JSONL from `input`, verifies each line with `verifier`, writes JSONL to `output` in input
/// order. Only IO errors on `input` or `output` stop the batch.
pub fn run_batch(
    verifier: Arc<VerifierBox>,
    input: impl BufRead + Send + 'static,
    mut output: impl Write,
    options: &BatchOptions,
) -> io::Result<BatchSummary> {
    // Lines read ahead of the writer; bounds memory on a huge input.
    let window = options.parallel.max(1) * 4;
    let (events, inbox) = mpsc::channel::<Event>();
    let (credits, credit_inbox) = mpsc::channel::<()>();
    for _ in 0..window {
        let _ = credits.send(());
    }
    spawn_reader(input, events.clone(), credit_inbox);
    drive(verifier, events, inbox, credits, options, |line| {
        serde_json::to_writer(&mut output, &line)?;
        output.write_all(b"\n")?;
        output.flush()
    })
}

/// Verifies parsed items with the same threads and deadline as [`run_batch`]; one line per item,
/// in order. The trainer's reward phase.
pub fn verify_items(
    verifier: Arc<VerifierBox>,
    items: Vec<InputItem>,
    options: &BatchOptions,
) -> Vec<OutputLine> {
    let (events, inbox) = mpsc::channel::<Event>();
    // Items are already in memory: no read-ahead window to bound.
    let (credits, _) = mpsc::channel::<()>();
    let count = items.len();
    for (index, item) in items.into_iter().enumerate() {
        let _ = events.send(Event::Line(index, Ok(item)));
    }
    let _ = events.send(Event::Eof);
    let mut lines = Vec::with_capacity(count);
    let result = drive(verifier, events, inbox, credits, options, |line| {
        lines.push(line);
        Ok(())
    });
    // The sink never fails and there is no reader to fail.
    debug_assert!(result.is_ok());
    lines
}

/// The batch's main loop: hands parsed lines to workers, answers calls past their deadline, and
/// gives results to `sink` in input order.
fn drive(
    verifier: Arc<VerifierBox>,
    events: Sender<Event>,
    inbox: Receiver<Event>,
    credits: Sender<()>,
    options: &BatchOptions,
    mut sink: impl FnMut(OutputLine) -> io::Result<()>,
) -> io::Result<BatchSummary> {
    let parallel = options.parallel.max(1);
    let (jobs, job_inbox) = mpsc::channel::<(usize, InputItem)>();
    let job_inbox = Arc::new(Mutex::new(job_inbox));
    for _ in 0..parallel {
        spawn_worker(Arc::clone(&verifier), Arc::clone(&job_inbox), events.clone(), options);
    }

    let mut summary = BatchSummary::default();
    let mut ready: BTreeMap<usize, OutputLine> = BTreeMap::new();
    let mut running: HashMap<usize, Instant> = HashMap::new();
    // Ids of items handed to workers, for answering one at its deadline.
    let mut ids: HashMap<usize, Option<String>> = HashMap::new();
    // Timed-out calls still inside the plugin.
    let mut stuck: HashSet<usize> = HashSet::new();
    let mut next_to_write = 0usize;
    let mut lines_read = 0usize;
    let mut input_done = false;
    loop {
        while let Some(mut line) = ready.remove(&next_to_write) {
            line.verifier.clone_from(&options.verifier_id);
            if !options.explain {
                line.explanation = None;
            }
            summary.count(&line);
            sink(line)?;
            next_to_write += 1;
            let _ = credits.send(());
        }
        if input_done && next_to_write == lines_read {
            return Ok(summary);
        }
        let wait = running
            .values()
            .min()
            .map(|started| (*started + options.deadline).saturating_duration_since(Instant::now()));
        let event = match wait {
            Some(wait) => match inbox.recv_timeout(wait) {
                Ok(event) => event,
                Err(RecvTimeoutError::Timeout) => {
                    let now = Instant::now();
                    let late: Vec<usize> = running
                        .iter()
                        .filter(|(_, started)| now.duration_since(**started) >= options.deadline)
                        .map(|(index, _)| *index)
                        .collect();
                    for index in late {
                        running.remove(&index);
                        stuck.insert(index);
                        let id = ids.remove(&index).flatten();
                        ready.insert(index, OutputLine::deadline_passed(id, options.deadline));
                        // The stuck thread keeps its place; a fresh one keeps the batch moving.
                        spawn_worker(Arc::clone(&verifier), Arc::clone(&job_inbox), events.clone(), options);
                    }
                    continue;
                }
                Err(RecvTimeoutError::Disconnected) => unreachable_disconnect(),
            },
            None => inbox.recv().unwrap_or_else(|_| unreachable_disconnect()),
        };
        match event {
            Event::Line(index, parsed) => {
                lines_read = index + 1;
                match parsed {
                    Err((id, message)) => {
                        ready.insert(index, OutputLine::failed(id, message));
                    }
                    Ok(item) if stuck.len() >= MAX_STUCK_CALLS => {
                        let message = format!(
                            "verifier unresponsive: {} calls still running past the {} ms deadline",
                            stuck.len(),
                            options.deadline.as_millis()
                        );
                        ready.insert(index, OutputLine::failed(item.id, message));
                    }
                    Ok(item) => {
                        ids.insert(index, item.id.clone());
                        let _ = jobs.send((index, item));
                    }
                }
            }
            Event::Eof => input_done = true,
            Event::ReadError(error) => return Err(error),
            Event::Started(index, at) => {
                running.insert(index, at);
            }
            Event::Finished(index, line) => {
                if !stuck.remove(&index) {
                    running.remove(&index);
                    ids.remove(&index);
                    ready.insert(index, line);
                }
            }
        }
    }
}

/// The main loop holds a sender itself, so the channel never disconnects while it runs.
fn unreachable_disconnect() -> ! {
    unreachable!("the batch loop holds a sender of its own inbox")
}

fn spawn_worker(
    verifier: Arc<VerifierBox>,
    jobs: Arc<Mutex<Receiver<(usize, InputItem)>>>,
    events: Sender<Event>,
    options: &BatchOptions,
) {
    let explain = options.explain;
    let stop = options.stop.clone();
    std::thread::spawn(move || {
        loop {
            // The lock is held only while waiting for the next job, never during a call.
            let job = match jobs.lock() {
                Ok(inbox) => inbox.recv(),
                Err(_) => return,
            };
            let Ok((index, item)) = job else { return };
            if let Some(reason) = stop.as_deref().and_then(Stop::reason) {
                if events.send(Event::Finished(index, OutputLine::failed(item.id, reason))).is_err() {
                    return;
                }
                continue;
            }
            if events.send(Event::Started(index, Instant::now())).is_err() {
                return;
            }
            let line = verify_item(&verifier, &item, explain);
            if events.send(Event::Finished(index, line)).is_err() {
                return;
            }
        }
    });
}

fn spawn_reader(mut input: impl BufRead + Send + 'static, events: Sender<Event>, credits: Receiver<()>) {
    std::thread::spawn(move || {
        let mut buffer = Vec::new();
        let mut line_number = 0usize;
        let mut index = 0usize;
        loop {
            buffer.clear();
            match input.read_until(b'\n', &mut buffer) {
                Ok(0) => {
                    let _ = events.send(Event::Eof);
                    return;
                }
                Ok(_) => {}
                Err(error) => {
                    let _ = events.send(Event::ReadError(error));
                    return;
                }
            }
            line_number += 1;
            let line = buffer.strip_suffix(b"\n").unwrap_or(&buffer);
            let line = line.strip_suffix(b"\r").unwrap_or(line);
            if line.iter().all(u8::is_ascii_whitespace) {
                continue;
            }
            if credits.recv().is_err() {
                return;
            }
            let parsed =
                parse_line(line).map_err(|(id, message)| (id, format!("line {line_number}: {message}")));
            if events.send(Event::Line(index, parsed)).is_err() {
                return;
            }
            index += 1;
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stop_says_why_once_cancelled_or_past_its_budget_and_an_unbudgeted_one_only_when_cancelled() {
        let spent = Stop::within(Duration::ZERO);
        assert_eq!(spent.reason().as_deref(), Some("not graded: the request's budget of 0 s ran out"));
        let budgeted = Stop::within(Duration::from_secs(3600));
        assert_eq!(budgeted.reason(), None);
        budgeted.cancel();
        assert_eq!(budgeted.reason().as_deref(), Some("not graded: the request was cancelled"));
        // An engine job's own grading: no budget, however long; a budget too far to count is none.
        for unbudgeted in [Stop::on_cancel(), Stop::within(Duration::MAX)] {
            assert_eq!(unbudgeted.reason(), None);
            unbudgeted.cancel();
            assert_eq!(unbudgeted.reason().as_deref(), Some("not graded: the request was cancelled"));
        }
    }
}
