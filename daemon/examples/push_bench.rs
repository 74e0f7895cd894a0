//! The Redis side of `scripts/bench/submit.sh`: bulk pushes of dispatch tasks straight into
//! Redis through `rlvr_queue::dispatch::push` (what the daemon's recovery sweep does), then
//! promoted to the active list. Prints one JSON object on stdout. (The API side, submissions
//! per second and submit-to-running latency, is `client/examples/submit_bench.rs`.)
//!
//!     push_bench --redis URL --count N

use std::time::{Duration, Instant};

use anyhow::ensure;
use clap::Parser;
use rlvr_protocol::spec::Priority;
use rlvr_queue::dispatch;
use serde_json::json;

/// Pushes `count` dispatch tasks into a scratch queue in chunks of `dispatch::PUSH_CHUNK`, then
/// promotes them all to the active list (the promoter's work); deletes the queue after.
#[derive(Parser)]
struct Cli {
    #[arg(long)]
    redis: String,
    #[arg(long)]
    count: usize,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let Cli { redis: url, count } = Cli::parse();
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
    let report = json!({
        "mode": "push",
        "count": count,
        "chunk": dispatch::PUSH_CHUNK,
        "push_per_second": count as f64 / push_seconds,
        "promote_per_second": count as f64 / promote_seconds,
    });
    println!("{report}");
    Ok(())
}
