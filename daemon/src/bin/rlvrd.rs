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
    /// Load one plugin library, check it and run its self-test; print a JSON report. The daemon
    /// runs this in a child process so a crashing library cannot take it down.
    #[command(hide = true)]
    ProbePlugin {
        /// The library.
        library: PathBuf,
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
