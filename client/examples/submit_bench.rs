//! The API side of `scripts/bench/submit.sh`: submissions per second through the HTTP API and
//! submit-to-running latency on an idle daemon, spoken through `rlvr-client` as `rlvrctl` speaks
//! it. (The bulk push of dispatch tasks into Redis is `daemon/examples/push_bench.rs`: this
//! crate knows nothing of Redis.) Each mode prints one JSON object on stdout.
//!
//!     submit_bench api --server URL --token T --spec JOB.toml --count N --concurrency C
//!     submit_bench latency --server URL --token T --spec JOB.toml --count N

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, bail, ensure};
use clap::{Parser, Subcommand};
use rlvr_client::{Client, ClientConfig, Settings, SpecFormat, Token, Url, View};
use rlvr_protocol::job::{JobEvent, JobState, JobView};
use serde_json::{Value, json};

#[derive(Parser)]
struct Cli {
    #[command(subcommand)]
    mode: Mode,
}

/// Where and what to submit.
#[derive(clap::Args)]
struct Target {
    #[arg(long)]
    server: String,
    #[arg(long)]
    token: String,
    /// The job spec (TOML) every submission sends.
    #[arg(long)]
    spec: PathBuf,
}

impl Target {
    /// The API, every answer seen as it is: a busy daemon is a failed run, not a slow one.
    fn client(&self) -> anyhow::Result<Client> {
        let server = Url::parse(&self.server).with_context(|| format!("--server {}", self.server))?;
        let settings = Settings::new(server, Some(Token::new(self.token.clone(), "--token")));
        Ok(Client::with_config(settings, ClientConfig { busy_retries: 0, ..ClientConfig::default() })?)
    }

    fn spec(&self) -> anyhow::Result<String> {
        std::fs::read_to_string(&self.spec).with_context(|| format!("cannot read {}", self.spec.display()))
    }
}

#[derive(Subcommand)]
enum Mode {
    /// `count` POST /v1/jobs, `concurrency` in flight at once (one thread each, one shared
    /// connection pool).
    Api {
        #[command(flatten)]
        target: Target,
        #[arg(long)]
        count: usize,
        #[arg(long)]
        concurrency: usize,
    },
    /// `count` jobs one after another, each followed to its end: the time from sending the
    /// POST to the job's `admitted` and `running` events (the events' Redis stream ids carry the
    /// server's clock in ms; client and server share this machine's clock).
    Latency {
        #[command(flatten)]
        target: Target,
        #[arg(long)]
        count: usize,
    },
}

fn main() -> anyhow::Result<()> {
    let report = match Cli::parse().mode {
        Mode::Api { target, count, concurrency } => api(&target, count, concurrency)?,
        Mode::Latency { target, count } => latency(&target, count)?,
    };
    println!("{report}");
    Ok(())
}

/// Submits one spec; the new job's id.
fn submit(client: &Client, spec: &str) -> anyhow::Result<String> {
    let submitted = client.submit(spec, SpecFormat::Toml, None)?;
    ensure!(submitted.created, "submit answered with an earlier job: {}", submitted.id);
    Ok(submitted.id)
}

/// The value at quantile `q` (nearest rank) of sorted `values`.
fn quantile(sorted: &[f64], q: f64) -> f64 {
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

fn summary(mut values: Vec<f64>) -> Value {
    values.sort_by(f64::total_cmp);
    json!({
        "p50": quantile(&values, 0.5),
        "p99": quantile(&values, 0.99),
        "max": values.last().copied().unwrap_or(0.0),
    })
}

fn api(target: &Target, count: usize, concurrency: usize) -> anyhow::Result<Value> {
    ensure!(concurrency > 0, "--concurrency must be at least 1");
    let (client, spec) = (target.client()?, target.spec()?);
    let next = AtomicUsize::new(0);
    let started = Instant::now();
    let per_thread: Vec<Vec<f64>> = std::thread::scope(|scope| {
        let threads: Vec<_> = (0..concurrency)
            .map(|_| {
                scope.spawn(|| {
                    let mut latencies = Vec::new();
                    while next.fetch_add(1, Ordering::Relaxed) < count {
                        let sent = Instant::now();
                        submit(&client, &spec)?;
                        latencies.push(sent.elapsed().as_secs_f64() * 1e3);
                    }
                    anyhow::Ok(latencies)
                })
            })
            .collect();
        threads
            .into_iter()
            .map(|thread| thread.join().expect("a submitting thread panicked"))
            .collect::<anyhow::Result<_>>()
    })?;
    let seconds = started.elapsed().as_secs_f64();
    Ok(json!({
        "mode": "api",
        "count": count,
        "concurrency": concurrency,
        "seconds": seconds,
        "per_second": count as f64 / seconds,
        "request_ms": summary(per_thread.into_iter().flatten().collect()),
    }))
}

fn epoch_ms() -> f64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64() * 1e3)
}

/// When a followed job was admitted and started running, in ms since the epoch: a stream id is
/// `<ms>-<seq>`, stamped by Redis when the state changed.
#[derive(Default)]
struct Milestones {
    admitted: Option<f64>,
    running: Option<f64>,
}

impl View for Milestones {
    fn state(&mut self, event: &JobEvent, _: &str) {
        let at = event.id.split('-').next().and_then(|ms| ms.parse().ok());
        match event.state {
            JobState::Admitted => self.admitted = at,
            JobState::Running => self.running = at,
            _ => {}
        }
    }

    fn progress(&mut self, _: &JobView, _: &str) {}
}

fn latency(target: &Target, count: usize) -> anyhow::Result<Value> {
    let (client, spec) = (target.client()?, target.spec()?);
    let (mut to_admitted, mut to_running) = (Vec::new(), Vec::new());
    for done in 0..count {
        let sent = epoch_ms();
        let id = submit(&client, &spec)?;
        let mut seen = Milestones::default();
        let end = client.follow(&id, &mut seen)?;
        let (Some(admitted), Some(running)) = (seen.admitted, seen.running) else {
            bail!("job {id} ended {} without running: {}", end.state, end.reason);
        };
        ensure!(end.state == JobState::Published, "job {id} ended {}: {}", end.state, end.reason);
        to_admitted.push(admitted - sent);
        to_running.push(running - sent);
        if (done + 1) % 10 == 0 {
            eprintln!("latency: {}/{count} jobs", done + 1);
        }
    }
    Ok(json!({
        "mode": "latency",
        "count": count,
        "submit_to_admitted_ms": summary(to_admitted),
        "submit_to_running_ms": summary(to_running),
    }))
}
