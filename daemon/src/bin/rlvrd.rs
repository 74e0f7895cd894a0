//! `rlvrd`: the daemon. `serve` runs the control plane; `validate` checks a config.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::{Parser, Subcommand};
use rlvr_daemon::config;
use rlvr_daemon::logging::{self, LogFormat};
use tokio_util::sync::CancellationToken;

/// The rlvr daemon: runs RL post-training jobs for many teams on shared devices.
#[derive(Parser)]
#[command(name = "rlvrd", version)]
struct Cli {
    /// Log line format on stderr (level from RLVR_LOG, default info).
    #[arg(long, value_enum, default_value_t, global = true)]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the daemon: plugin registry, HTTP API; stops cleanly on SIGTERM or Ctrl-C.
    Serve {
        /// Config file [default: /etc/rlvr/rlvrd.toml when it exists]; env RLVR__SECTION__KEY
        /// overrides it.
        #[arg(long, short)]
        config: Option<PathBuf>,
    },
    /// Check the config and report every problem at once, each with where its value came from.
    Validate {
        /// Config file [default: /etc/rlvr/rlvrd.toml when it exists].
        #[arg(long, short)]
        config: Option<PathBuf>,
    },
    /// Run one job end to end without Redis: rollout, verification, updates, checkpoints. Prints
    /// the outcome (steps, weights hash, held-out before/after, checkpoint) as JSON on stdout.
    Worker {
        /// The job spec (TOML, or JSON by extension).
        #[arg(long)]
        spec: PathBuf,
        /// Where checkpoints, metrics.jsonl and rollouts.jsonl go.
        #[arg(long)]
        state_dir: PathBuf,
        /// Continue from the newest checkpoint in the state dir.
        #[arg(long)]
        resume: bool,
        /// A directory to load plugins from, besides the config's plugins.dirs (repeatable).
        #[arg(long = "plugin-dir")]
        plugin_dirs: Vec<PathBuf>,
        /// The daemon config whose plugins.dirs to use [default: /etc/rlvr/rlvrd.toml when it
        /// exists].
        #[arg(long, short)]
        config: Option<PathBuf>,
        /// `cpu`, `cuda` or `cuda:N` [default: cuda when available (CUDA_VISIBLE_DEVICES
        /// applies), else cpu].
        #[arg(long)]
        device: Option<String>,
        /// Verifier calls at once [default: the number of cores].
        #[arg(long)]
        verify_parallel: Option<usize>,
        /// libtorch's CPU threads [default: the number of cores]. Results are bit-exact only
        /// for the same thread count: resume with the one the run started with.
        #[arg(long)]
        threads: Option<usize>,
        /// Die with this process (the daemon passes its pid): SIGKILL when it exits.
        #[arg(long, value_name = "PID")]
        exit_with_parent: Option<u32>,
        /// Ask the daemon's scheduler on this socket for the devices before each device phase
        /// (the daemon passes it, with --job-id).
        #[arg(long, value_name = "SOCKET", requires = "job_id")]
        grant_socket: Option<PathBuf>,
        /// This job's id at the grant socket.
        #[arg(long, value_name = "ID", requires = "grant_socket")]
        job_id: Option<String>,
        /// The gates compare the trained model with this published checkpoint (the model
        /// line's current version; the daemon passes it) instead of the starting one.
        #[arg(long, value_name = "DIR", requires = "baseline_version")]
        baseline: Option<PathBuf>,
        /// The version number of --baseline.
        #[arg(long, value_name = "N", requires = "baseline")]
        baseline_version: Option<u64>,
        /// Where the shared curricula are (the daemon's `<state_dir>/curricula`).
        #[arg(long, value_name = "DIR", requires = "curriculum_version")]
        curricula_dir: Option<PathBuf>,
        /// The version of `[curriculum] name` pinned at admission: the estimates start from it.
        #[arg(long, value_name = "N", requires = "curricula_dir")]
        curriculum_version: Option<u64>,
    },
    /// Replay a trace of jobs (their phases' durations) through the scheduling policy, next to a
    /// first-come-first-served baseline that gives each job whole devices for its whole run; print
    /// each device's busy fraction and each job's wait and completion.
    Simulate {
        /// The trace (TOML: [[devices]], optional [scheduler], [[jobs]]; see
        /// scripts/bench/traces/).
        #[arg(long)]
        trace: PathBuf,
        /// Print {"policy": report, "baseline": report} as JSON instead of tables.
        #[arg(long)]
        json: bool,
    },
    /// Write synthetic data sets for the built-in model (no download).
    Data {
        #[command(subcommand)]
        kind: DataKind,
    },
    /// Load one plugin library, check it and run its self-test; print a JSON report. The daemon
    /// runs this in a child process so a crashing library cannot take it down.
    #[command(hide = true)]
    ProbePlugin {
        /// The library.
        library: PathBuf,
    },
}

#[derive(Subcommand)]
enum DataKind {
    /// `a+b=` / `a-b=` problems: sft.jsonl (demonstrations), train.jsonl and heldout.jsonl
    /// (prompts with references for the math verifier); no held-out problem is in the others.
    Arith {
        /// The directory to write into.
        #[arg(long)]
        out: PathBuf,
        #[arg(long, default_value_t = 0)]
        seed: u64,
        #[arg(long, default_value_t = 2000)]
        sft: usize,
        #[arg(long, default_value_t = 2000)]
        train: usize,
        #[arg(long, default_value_t = 200)]
        heldout: usize,
        /// Operands are drawn below this.
        #[arg(long, default_value_t = 50)]
        max_operand: u64,
        /// The operations: `+`, `-` or both (`+-`).
        #[arg(long, default_value = "+-")]
        ops: String,
        /// Zero-pad operands to the width of `max-operand - 1` (`07+31=`).
        #[arg(long)]
        pad: bool,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    rlvr_daemon::tls::install_crypto_provider();
    match cli.command {
        Command::ProbePlugin { library } => {
            // stdout carries the report; logs stay off it.
            let report = rlvr_daemon::registry::probe_main(&library);
            match serde_json::to_string(&report) {
                Ok(line) => {
                    println!("{line}");
                    ExitCode::SUCCESS
                }
                Err(error) => {
                    eprintln!("rlvrd probe-plugin: cannot encode the report: {error}");
                    ExitCode::FAILURE
                }
            }
        }
        Command::Validate { config } => match config::load(config.as_deref()) {
            Ok(loaded) => {
                println!(
                    "config ok: state_dir {}, api {}, redis {}, {} plugin dir(s), {} token(s)",
                    loaded.daemon.state_dir.display(),
                    loaded.api.listen,
                    loaded.redis.url,
                    loaded.plugins.dirs.len(),
                    loaded.auth.tokens.len()
                );
                ExitCode::SUCCESS
            }
            Err(errors) => {
                eprintln!("{errors}");
                ExitCode::from(2)
            }
        },
        Command::Worker {
            spec,
            state_dir,
            resume,
            plugin_dirs,
            config,
            device,
            verify_parallel,
            threads,
            exit_with_parent,
            grant_socket,
            job_id,
            baseline,
            baseline_version,
            curricula_dir,
            curriculum_version,
        } => {
            logging::init(cli.log_format, "info");
            if let Some(parent) = exit_with_parent {
                rlvr_daemon::worker::lifecycle::exit_with_parent(parent);
            }
            rlvr_daemon::worker::lifecycle::install_stop_handlers();
            let run = || -> anyhow::Result<rlvr_daemon::worker::Outcome> {
                let plugin_dirs =
                    config::plugin_dirs(config.as_deref(), plugin_dirs).map_err(anyhow::Error::msg)?;
                let device = device.as_deref().map(parse_device).transpose()?;
                let cores = std::thread::available_parallelism().map_or(1, std::num::NonZero::get);
                let options = rlvr_daemon::worker::WorkerOptions {
                    spec,
                    state_dir,
                    resume,
                    plugin_dirs,
                    device,
                    verify_parallel: verify_parallel.unwrap_or(cores),
                    threads: threads.unwrap_or(cores).max(1),
                    grants: grant_socket.zip(job_id),
                    baseline: baseline.zip(baseline_version),
                    curriculum_version: curricula_dir.zip(curriculum_version),
                };
                Ok(rlvr_daemon::worker::run(&options)?)
            };
            // A panic in libtorch glue is a bug, but it still ends as one line and an exit code.
            match std::panic::catch_unwind(std::panic::AssertUnwindSafe(run)) {
                Ok(Ok(outcome)) => {
                    println!("{}", serde_json::to_string(&outcome).unwrap_or_default());
                    if outcome.interrupted {
                        ExitCode::from(rlvr_daemon::worker::lifecycle::EXIT_INTERRUPTED)
                    } else {
                        ExitCode::SUCCESS
                    }
                }
                Ok(Err(error)) => {
                    eprintln!("rlvrd worker: {error:#}");
                    // Not the job's fault: the daemon counts a crash and requeues it.
                    let grants = error
                        .downcast_ref::<rlvr_daemon::worker::WorkerError>()
                        .is_some_and(|error| matches!(error, rlvr_daemon::worker::WorkerError::Grants(_)));
                    ExitCode::from(if grants { 70 } else { 2 })
                }
                Err(_) => {
                    eprintln!(
                        "rlvrd worker: internal error (a panic, reported above); the last checkpoint is intact"
                    );
                    ExitCode::from(70)
                }
            }
        }
        Command::Data { kind: DataKind::Arith { out, seed, sft, train, heldout, max_operand, ops, pad } } => {
            let ops = match rlvr_daemon::arith::Op::parse_list(&ops) {
                Ok(ops) => ops,
                Err(error) => {
                    eprintln!("rlvrd data arith: --ops: {error}");
                    return ExitCode::from(2);
                }
            };
            let options =
                rlvr_daemon::arith::ArithOptions { seed, sft, train, heldout, max_operand, ops, pad };
            match rlvr_daemon::arith::write(&out, &options) {
                Ok([sft, train, heldout]) => {
                    println!("{}: {sft} sft, {train} train, {heldout} held-out problems", out.display());
                    ExitCode::SUCCESS
                }
                Err(error) => {
                    eprintln!("rlvrd data arith: {}: {error}", out.display());
                    ExitCode::from(2)
                }
            }
        }
        Command::Simulate { trace, json } => {
            use rlvr_daemon::sched::simulate::{Trace, baseline, render, simulate};
            let parsed = std::fs::read_to_string(&trace)
                .map_err(|error| error.to_string())
                .and_then(|text| Trace::from_toml(&text).map_err(|error| error.to_string()));
            let parsed = match parsed {
                Ok(parsed) => parsed,
                Err(error) => {
                    eprintln!("rlvrd simulate: {}: {error}", trace.display());
                    return ExitCode::from(2);
                }
            };
            let (ours, fcfs) = (simulate(&parsed), baseline(&parsed));
            if json {
                println!("{}", serde_json::json!({ "policy": ours, "baseline": fcfs }));
            } else {
                print!("{}", render(&ours, &fcfs));
            }
            ExitCode::SUCCESS
        }
        Command::Serve { config } => {
            logging::init(cli.log_format, "info");
            match serve(config) {
                Ok(()) => ExitCode::SUCCESS,
                Err(error) => {
                    tracing::error!("{error:#}");
                    ExitCode::FAILURE
                }
            }
        }
    }
}

fn serve(config_path: Option<PathBuf>) -> anyhow::Result<()> {
    let config = config::load(config_path.as_deref()).map_err(|errors| anyhow::anyhow!("{errors}"))?;
    let runtime = tokio::runtime::Runtime::new().context("cannot start the async runtime")?;
    runtime.block_on(async {
        let shutdown = CancellationToken::new();
        let signals = shutdown.clone();
        tokio::spawn(async move {
            wait_for_signal().await;
            tracing::info!("signal received, stopping");
            signals.cancel();
        });
        rlvr_daemon::serve::run(config, shutdown).await.context("rlvrd serve")
    })
}

/// `cpu`, `cuda` or `cuda:N`.
fn parse_device(text: &str) -> anyhow::Result<tch::Device> {
    match text {
        "cpu" => Ok(tch::Device::Cpu),
        "cuda" => Ok(tch::Device::Cuda(0)),
        other => match other.strip_prefix("cuda:").and_then(|n| n.parse().ok()) {
            Some(index) => Ok(tch::Device::Cuda(index)),
            None => anyhow::bail!("--device: expected cpu, cuda or cuda:N, got {other:?}"),
        },
    }
}

async fn wait_for_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut term), Ok(mut int)) = (signal(SignalKind::terminate()), signal(SignalKind::interrupt()))
    else {
        // Without signal handlers the daemon can still be stopped by SIGKILL; keep running.
        std::future::pending::<()>().await;
        return;
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
}
