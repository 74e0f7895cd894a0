//! The load side of `scripts/bench/submit.sh`: submissions per second through the HTTP API,
//! submit-to-running latency on an idle daemon, and bulk pushes of dispatch tasks straight into
//! Redis through `rlvr_queue::dispatch::push` (what the daemon's recovery sweep does).
//! Each mode prints one JSON object on stdout.
//!
//!     submit_bench api --server URL --token T --spec JOB.toml --count N --concurrency C
//!     submit_bench latency --server URL --token T --spec JOB.toml --count N
//!     submit_bench push --redis URL --count N

use std::path::PathBuf;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, bail, ensure};
use clap::{Parser, Subcommand};
use futures::StreamExt;
use rlvr_protocol::spec::Priority;
use rlvr_queue::dispatch;
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

#[derive(Subcommand)]
enum Mode {
    /// `count` POST /v1/jobs, `concurrency` in flight at once.
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
    /// Pushes `count` dispatch tasks into a scratch queue in chunks of `dispatch::PUSH_CHUNK`,
    /// then promotes them all to the active list (the promoter's work); deletes the queue after.
    Push {
        #[arg(long)]
        redis: String,
        #[arg(long)]
        count: usize,
    },
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    // reqwest is built without a default TLS provider (see the root Cargo.toml).
    rlvr_startup::install_crypto_provider();
    let report = match Cli::parse().mode {
        Mode::Api { target, count, concurrency } => {
            let spec = std::fs::read_to_string(&target.spec)?;
            api(&target.server, &target.token, &spec, count, concurrency).await?
        }
        Mode::Latency { target, count } => {
            let spec = std::fs::read_to_string(&target.spec)?;
            latency(&target.server, &target.token, &spec, count).await?
        }
        Mode::Push { redis, count } => push(&redis, count).await?,
    };
    println!("{report}");
    Ok(())
}

fn client() -> anyhow::Result<reqwest::Client> {
    Ok(reqwest::Client::builder().timeout(Duration::from_secs(60)).build()?)
}

/// POSTs one spec; the new job's id.
async fn submit(client: &reqwest::Client, server: &str, token: &str, spec: &str) -> anyhow::Result<String> {
    let response = client
        .post(format!("{server}/v1/jobs"))
        .bearer_auth(token)
        .header("content-type", "application/toml")
        .body(spec.to_owned())
        .send()
        .await?;
    let status = response.status();
    let body: Value = response.json().await?;
    ensure!(status.as_u16() == 201, "submit answered {status}: {body}");
    body["id"].as_str().map(str::to_owned).context("no id in the answer")
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

async fn api(
    server: &str,
    token: &str,
    spec: &str,
    count: usize,
    concurrency: usize,
) -> anyhow::Result<Value> {
    let client = client()?;
    let started = Instant::now();
    let latencies: Vec<f64> = futures::stream::iter(0..count)
        .map(|_| {
            let client = client.clone();
            async move {
                let sent = Instant::now();
                submit(&client, server, token, spec).await?;
                anyhow::Ok(sent.elapsed().as_secs_f64() * 1e3)
            }
        })
        .buffer_unordered(concurrency)
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .collect::<anyhow::Result<_>>()?;
    let seconds = started.elapsed().as_secs_f64();
    Ok(json!({
        "mode": "api",
        "count": count,
        "concurrency": concurrency,
        "seconds": seconds,
        "per_second": count as f64 / seconds,
        "request_ms": summary(latencies),
    }))
}

fn epoch_ms() -> f64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64() * 1e3)
}

/// Follows a job's events until it ends; (ms of the `admitted` event, ms of `running`, end state).
async fn follow(
    client: &reqwest::Client,
    server: &str,
    token: &str,
    id: &str,
) -> anyhow::Result<(f64, f64, String)> {
    let mut response = client.get(format!("{server}/v1/jobs/{id}/events")).bearer_auth(token).send().await?;
    ensure!(response.status().is_success(), "events of {id}: {}", response.status());
    let (mut admitted, mut running, mut buffer) = (None, None, String::new());
    while let Some(chunk) = response.chunk().await? {
        buffer.push_str(&String::from_utf8_lossy(&chunk));
        while let Some(end) = buffer.find("\n\n") {
            let block: String = buffer.drain(..end + 2).collect();
            let field = |name: &str| block.lines().find_map(|line| line.strip_prefix(name)).map(str::trim);
            if field("event:") != Some("state") {
                continue;
            }
            // A stream id is `<ms>-<seq>`, stamped by Redis when the state changed.
            let at: f64 =
                field("id:").and_then(|id| id.split('-').next()).context("state event id")?.parse()?;
            let event: Value = serde_json::from_str(field("data:").context("state event data")?)?;
            match event["state"].as_str() {
                Some("admitted") => admitted = Some(at),
                Some("running") => running = Some(at),
                Some(state @ ("published" | "refused" | "failed" | "cancelled")) => {
                    let (Some(admitted), Some(running)) = (admitted, running) else {
                        bail!("job {id} ended {state} without running: {event}");
                    };
                    return Ok((admitted, running, state.to_owned()));
                }
                _ => {}
            }
        }
    }
    bail!("the event stream of {id} ended before the job did")
}

async fn latency(server: &str, token: &str, spec: &str, count: usize) -> anyhow::Result<Value> {
    let client = client()?;
    let (mut to_admitted, mut to_running) = (Vec::new(), Vec::new());
    for done in 0..count {
        let sent = epoch_ms();
        let id = submit(&client, server, token, spec).await?;
        let (admitted, running, state) = follow(&client, server, token, &id).await?;
        ensure!(state == "published", "job {id} ended {state}");
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

async fn push(url: &str, count: usize) -> anyhow::Result<Value> {
    let client = redis::Client::open(url)?;
    let mut conn = client.get_multiplexed_async_connection().await?;
    // A scratch queue of its own: the daemon's queues are untouched.
    let queue = format!("rlvr:bench:{}", std::process::id());
    let config = dispatch::config(Priority::Normal, Duration::from_secs(2), 3).queue(queue.clone());
    let tasks: Vec<(String, String)> =
        (0..count).map(|n| (format!("bench-job-{n}"), dispatch::new_task_id())).collect();

    let started = Instant::now();
    dispatch::push(&mut conn, &config, &tasks).await?;
    let push_seconds = started.elapsed().as_secs_f64();

    let started = Instant::now();
    let mut promoted = 0;
    while promoted < count {
        let moved = dispatch::promote_due(&mut conn, &config, dispatch::PUSH_CHUNK).await?;
        ensure!(moved > 0, "only {promoted} of {count} tasks were due");
        promoted += moved;
    }
    let promote_seconds = started.elapsed().as_secs_f64();
    let active: usize = redis::cmd("LLEN").arg(config.active_jobs_list()).query_async(&mut conn).await?;
    ensure!(active == count, "{active} of {count} tasks reached the active list");

    let keys: Vec<String> = redis::cmd("KEYS").arg(format!("{queue}*")).query_async(&mut conn).await?;
    for chunk in keys.chunks(500) {
        let () = redis::cmd("UNLINK").arg(chunk).query_async(&mut conn).await?;
    }
    Ok(json!({
        "mode": "push",
        "count": count,
        "chunk": dispatch::PUSH_CHUNK,
        "push_per_second": count as f64 / push_seconds,
        "promote_per_second": count as f64 / promote_seconds,
    }))
}
