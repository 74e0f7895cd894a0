//! `rlvrctl watch` (and `submit --wait`): a job followed to its end through
//! [`rlvr_client::Client::follow`], shown as JSON lines (`--json`), a live bar on a terminal, or
//! plain lines in a log.

use std::io::{self, IsTerminal};
use std::time::{Duration, Instant};

use anyhow::Context;
use indicatif::{ProgressBar, ProgressStyle};
use rlvr_client::{Client, Exit, View};
use rlvr_protocol::job::{JobEvent, JobState, JobView};
use serde_json::Value;

use crate::render::{Detail, clock, end_line, figures, state_line};

/// A [`View`] with something to put away when the job ends (the bar).
trait Screen: View {
    fn finish(&mut self) {}
}

/// Follows a job to its end; the exit status says how it ended.
pub(crate) fn watch(api: &Client, id: &str, json: bool) -> anyhow::Result<Exit> {
    // The job first: a wrong id or token is a plain error, before any stream.
    let job = api.job(id)?;
    let mut view: Box<dyn Screen> = if json {
        Box::new(JsonLines)
    } else if io::stderr().is_terminal() {
        Box::new(Bar::new(&job)?)
    } else {
        Box::new(Plain::default())
    };
    let end = api.follow(id, view.as_mut());
    view.finish();
    let end = end?;
    if end.state == JobState::Published {
        return Ok(Exit::Done);
    }
    if !json {
        eprintln!("rlvrctl: {}", end_line(id, &end));
    }
    Ok(Exit::Ended)
}

/// The line the views without a bar print when the stream dropped.
fn say_reconnecting(why: &str, wait: Duration) {
    eprintln!("rlvrctl: {why}; reconnecting in {:.1} s…", wait.as_secs_f64());
}

/// `--json`: each event as one line, `{"event": "state"|"progress", "data": {...}}`.
struct JsonLines;

impl JsonLines {
    fn print(kind: &str, raw: &str) {
        // Compact, one line, `event` first (a json! map would sort it after `data`).
        let data: Value = serde_json::from_str(raw).unwrap_or(Value::Null);
        println!("{{\"event\":{},\"data\":{data}}}", Value::from(kind));
    }
}

impl View for JsonLines {
    fn state(&mut self, _: &JobEvent, raw: &str) {
        JsonLines::print("state", raw);
    }

    fn progress(&mut self, _: &JobView, raw: &str) {
        JsonLines::print("progress", raw);
    }

    fn reconnecting(&mut self, why: &str, wait: Duration) {
        say_reconnecting(why, wait);
    }
}

impl Screen for JsonLines {}

/// On a terminal: state lines on stdout, a live bar on stderr below them.
struct Bar {
    bar: ProgressBar,
    state: JobState,
    figures: String,
    reconnecting: bool,
}

impl Bar {
    fn new(job: &JobView) -> anyhow::Result<Bar> {
        let style = ProgressStyle::with_template("{spinner} {prefix:<10} [{bar:30}] {pos}/{len} {wide_msg}")
            .context("progress bar template")?
            .progress_chars("=> ");
        let bar = ProgressBar::new(job.max_steps).with_style(style);
        bar.set_position(job.step);
        bar.set_prefix(job.state.to_string());
        let figures = figures(job.progress.as_ref(), job.heldout, Detail::Brief);
        bar.set_message(figures.clone());
        bar.enable_steady_tick(Duration::from_millis(120));
        Ok(Bar { bar, state: job.state, figures, reconnecting: false })
    }
}

impl View for Bar {
    fn state(&mut self, event: &JobEvent, _: &str) {
        self.bar.suspend(|| println!("{}", state_line(event)));
        self.state = event.state;
        self.bar.set_prefix(event.state.to_string());
        if event.step > 0 {
            self.bar.set_position(event.step);
        }
    }

    fn progress(&mut self, job: &JobView, _: &str) {
        self.bar.set_length(job.max_steps);
        self.bar.set_position(job.step);
        self.figures = figures(job.progress.as_ref(), job.heldout, Detail::Brief);
        self.bar.set_message(self.figures.clone());
    }

    fn reconnecting(&mut self, why: &str, wait: Duration) {
        self.reconnecting = true;
        self.bar.set_prefix("reconnecting…");
        self.bar.set_message(format!("{why}; next try in {:.1} s", wait.as_secs_f64()));
    }

    fn connected(&mut self) {
        if std::mem::take(&mut self.reconnecting) {
            self.bar.set_prefix(self.state.to_string());
            self.bar.set_message(self.figures.clone());
        }
    }
}

impl Screen for Bar {
    fn finish(&mut self) {
        self.bar.finish_and_clear();
    }
}

/// Not a terminal (a log, CI): plain lines, progress at most every 10 s.
#[derive(Default)]
struct Plain {
    last_progress: Option<Instant>,
}

impl Plain {
    const PROGRESS_EVERY: Duration = Duration::from_secs(10);
}

impl View for Plain {
    fn state(&mut self, event: &JobEvent, _: &str) {
        println!("{}", state_line(event));
    }

    fn progress(&mut self, job: &JobView, _: &str) {
        let last = job.step >= job.max_steps;
        if !last && self.last_progress.is_some_and(|at| at.elapsed() < Plain::PROGRESS_EVERY) {
            return;
        }
        self.last_progress = Some(Instant::now());
        let figures = figures(job.progress.as_ref(), job.heldout, Detail::Brief);
        let figures = if figures.is_empty() { String::new() } else { format!(" · {figures}") };
        println!("{} step {}/{}{figures}", clock(&job.updated_at), job.step, job.max_steps);
    }

    fn reconnecting(&mut self, why: &str, wait: Duration) {
        say_reconnecting(why, wait);
    }
}

impl Screen for Plain {}
