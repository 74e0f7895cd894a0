//! `rlvr-worker`: one job's training process, started by `rlvrd serve` for each admitted job (or
//! by hand, without Redis). `run` trains; `probe-plugin` loads one plugin library for the
//! daemon's registry, in a process that can crash without harm.

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use rlvr_protocol::worker::{WorkerArgs, WorkerExit};
use rlvr_startup::logging::{self, LogFormat};
use rlvr_worker::{Outcome, WorkerError, WorkerOptions, lifecycle};

/// The rlvr worker: trains one job end to end (rollout, verification, updates, checkpoints).
#[derive(Parser)]
#[command(name = "rlvr-worker", version)]
struct Cli {
    /// Log line format on stderr (level from RLVR_LOG, default info).
    #[arg(long, value_enum, default_value_t, global = true)]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run one job end to end without Redis: rollout, verification, updates, checkpoints. Prints
    /// the outcome (steps, weights hash, held-out before/after, checkpoint) as JSON on stdout.
    Run(Box<WorkerArgs>),
    /// Load one plugin library, check it and run its self-test; print a JSON report. The daemon
    /// runs this in a child process so a crashing library cannot take it down.
    #[command(hide = true)]
    ProbePlugin {
        /// The library.
        library: std::path::PathBuf,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // The http verifier's client needs a rustls provider in the process that loads it.
    rlvr_startup::install_crypto_provider();
    match cli.command {
        Command::ProbePlugin { library } => {
            // stdout carries the report; logs stay off it.
            let report = rlvr_plugin_host::registry::probe_main(&library);
            match serde_json::to_string(&report) {
                Ok(line) => {
                    println!("{line}");
                    ExitCode::SUCCESS
                }
                Err(error) => {
                    eprintln!("rlvr-worker probe-plugin: cannot encode the report: {error}");
                    ExitCode::FAILURE
                }
            }
        }
        Command::Run(args) => {
            logging::init(cli.log_format, "info");
            ExitCode::from(run(*args).code())
        }
    }
}

/// Trains, prints the outcome and says how the process ends.
fn run(args: WorkerArgs) -> WorkerExit {
    if let Some(parent) = args.exit_with_parent {
        lifecycle::exit_with_parent(parent);
    }
    lifecycle::install_stop_handlers();
    let train = || -> Result<Outcome, WorkerError> {
        let options = WorkerOptions::from_args(args)?;
        rlvr_worker::run(&options)
    };
    // A panic in libtorch glue is a bug, but it still ends as one line and an exit status.
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(train)) {
        Ok(Ok(outcome)) => {
            println!("{}", serde_json::to_string(&outcome).unwrap_or_default());
            if outcome.interrupted { WorkerExit::Interrupted } else { WorkerExit::Finished }
        }
        Ok(Err(error)) => {
            eprintln!("rlvr-worker: {error}");
            error.exit()
        }
        Err(_) => {
            eprintln!("rlvr-worker: internal error (a panic, reported above); the last checkpoint is intact");
            WorkerExit::Transient
        }
    }
}

#[cfg(test)]
mod tests {
    use std::ffi::OsString;

    use super::*;

    /// The daemon writes the arguments ([`WorkerArgs::command_line`]) and this binary parses them:
    /// every field survives.
    #[test]
    fn the_arguments_round_trip_through_the_command_line() {
        let full = WorkerArgs {
            spec: "/jobs/a/spec.json".into(),
            state_dir: "/jobs/a/run".into(),
            resume: true,
            plugin_dirs: vec!["/p1".into(), "/p 2".into()],
            config: Some("/etc/rlvr/rlvrd.toml".into()),
            device: Some("cuda".into()),
            verify_parallel: Some(3),
            threads: Some(2),
            exit_with_parent: Some(42),
            grant_socket: Some("/state/sched.sock".into()),
            job_id: Some("01J".into()),
            baseline: Some("/registry/line/3".into()),
            baseline_version: Some(3),
            curricula_dir: Some("/state/curricula".into()),
            curriculum_version: Some(5),
        };
        let bare = WorkerArgs { spec: "s.toml".into(), state_dir: "run".into(), ..WorkerArgs::default() };
        for args in [full, bare] {
            let line = std::iter::once(OsString::from("rlvr-worker")).chain(args.command_line());
            match Cli::try_parse_from(line).unwrap().command {
                Command::Run(parsed) => assert_eq!(*parsed, args),
                Command::ProbePlugin { .. } => panic!("parsed as probe-plugin"),
            }
        }
    }
}
