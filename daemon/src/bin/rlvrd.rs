//! `rlvrd`: the daemon. `serve` runs the control plane; `validate` checks a config; `simulate`
//! and `data arith` are tools for operators and developers.
//!
//! Also `doctor` (devices and what the worker's libtorch can do), `token new` (a fresh token for a
//! team), `gates` (a standalone run's outcome judged by its spec's gates, as `serve` judges) and
//! `config-example` (the documented example config), `estimate` (a standalone run's memory
//! estimate, as `serve` makes it at submit).

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use clap::{Parser, Subcommand};
use rlvr_daemon::api::auth::TokenKind;
use rlvr_daemon::config;
use rlvr_protocol::builtin::RejectionSamplingOptions;
use rlvr_protocol::kind::JobKind;
use rlvr_protocol::spec::JobSpec;
use rlvr_protocol::worker::Outcome;
use rlvr_startup::logging::{self, LogFormat};
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
    /// Print the documented example config, rendered from the config's field table: what
    /// configs/rlvrd.toml holds (`rlvrd config-example > configs/rlvrd.toml` after changing a key).
    #[command(hide = true)]
    ConfigExample,
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
    /// Print the devices this daemon would schedule over and what its worker's libtorch can do
    /// with them: libtorch and CUDA versions, whether CUDA is built in, loaded and available,
    /// cuDNN, NCCL and cuBLAS, the CPU matmul path, and every problem found. Exits 1 when the
    /// devices are GPUs the worker cannot use (`rlvrd serve` refuses to start then).
    Doctor {
        /// Config file [default: /etc/rlvr/rlvrd.toml when it exists].
        #[arg(long, short)]
        config: Option<PathBuf>,
        /// Print the report as JSON.
        #[arg(long)]
        json: bool,
    },
    /// API tokens.
    Token {
        #[command(subcommand)]
        action: TokenAction,
    },
    /// Judge a worker's outcome (the JSON `rlvr-worker run` prints) by its job's gates, as `rlvrd
    /// serve` does before it publishes: the verdict, then each criterion with what it measured
    /// (the held-out gain with its paired interval). For runs made outside the daemon, such as
    /// the benchmark scripts'. Exits 0 when the candidate passes, 1 when it is refused.
    Gates {
        /// The job spec (TOML or JSON) the worker ran.
        #[arg(long)]
        spec: PathBuf,
        /// The worker's outcome JSON.
        #[arg(long)]
        outcome: PathBuf,
        /// Print the gate report as JSON (the `gates` of `rlvrctl status --json`).
        #[arg(long)]
        json: bool,
    },
    /// Print a job spec's memory estimate for a run outside the daemon (`rlvr-worker run`, the
    /// benchmark scripts), as `rlvrctl estimate` prints a submitted one's: what it holds between
    /// phases and what each phase adds. Its models and data are the spec's paths (or built-in
    /// models); its optimizer's needs come from the plugin libraries in --plugin-dir, probed by
    /// the worker beside this executable. Exits 2 when the spec or a file cannot be read.
    Estimate {
        /// The job spec (TOML or JSON).
        #[arg(long)]
        spec: PathBuf,
        /// A directory of plugin libraries (repeatable): the job's optimizer plugin is among them.
        #[arg(long, required = true)]
        plugin_dir: Vec<PathBuf>,
        /// The device kind the job runs on.
        #[arg(long, value_enum, default_value = "cpu")]
        device: EstimateDevice,
        /// Print `{estimate, parameters}` as JSON (`estimate` as in `rlvrctl estimate --json`;
        /// `parameters`, the policy's).
        #[arg(long)]
        json: bool,
    },
    /// Write synthetic data sets for the built-in model (no download).
    Data {
        #[command(subcommand)]
        kind: DataKind,
    },
}

/// `estimate --device`.
#[derive(Clone, Copy, clap::ValueEnum)]
enum EstimateDevice {
    Cpu,
    Cuda,
}

#[derive(Subcommand)]
enum TokenAction {
    /// Make a fresh token for a team: prints the token (give it to the team; it is not stored
    /// anywhere) on stdout and, on stderr, the [[auth.tokens]] entry to paste into the config.
    New {
        /// The team the token acts for: lowercase letters, digits, '_' and '-'.
        #[arg(long)]
        team: String,
        /// An admin token: sees every team's jobs and may force promotions.
        #[arg(long)]
        admin: bool,
        /// A key for the Tinker SDK (`tml-…`, sent as X-API-Key to the routes under /api/v1): the
        /// team's token all the same.
        #[arg(long)]
        tinker: bool,
    },
}

#[derive(Subcommand)]
enum DataKind {
    /// `a+b=` / `a-b=` / `a*d=` problems: sft.jsonl (demonstrations), train.jsonl and heldout.jsonl
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
        /// The operations: `+`, `-`, `*` (multiplication by one digit) or several (`+-`).
        #[arg(long, default_value = "+-")]
        ops: String,
        /// Zero-pad operands to the width of `max-operand - 1` (`07+31=`).
        #[arg(long)]
        pad: bool,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    rlvr_startup::install_crypto_provider();
    match cli.command {
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
        Command::Token { action: TokenAction::New { team, admin, tinker } } => {
            if !rlvr_protocol::names::valid_team_name(&team) {
                eprintln!("--team: expected {}, got {team:?}", rlvr_protocol::names::TEAM_RULE);
                return ExitCode::from(2);
            }
            let kind = if tinker { TokenKind::Tinker } else { TokenKind::Rlvr };
            match rlvr_daemon::api::auth::new_token(&team, admin, kind) {
                Ok(new) => {
                    println!("{}", new.token);
                    eprintln!();
                    eprintln!("# paste into the daemon's config, then restart it:\n{}", new.entry);
                    ExitCode::SUCCESS
                }
                Err(error) => {
                    eprintln!("cannot get randomness from the OS: {error}");
                    ExitCode::FAILURE
                }
            }
        }
        Command::Doctor { config, json } => doctor(config, json),
        Command::ConfigExample => {
            print!("{}", config::example_toml());
            ExitCode::SUCCESS
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
        Command::Gates { spec, outcome, json } => gates(&spec, &outcome, json),
        Command::Estimate { spec, plugin_dir, device, json } => estimate(&spec, &plugin_dir, device, json),
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

/// Prints `report` as pretty JSON on stdout; false (with `command`'s error on stderr) when it
/// cannot be encoded.
fn print_json(command: &str, report: &impl serde::Serialize) -> bool {
    match serde_json::to_string_pretty(report) {
        Ok(text) => {
            println!("{text}");
            true
        }
        Err(error) => {
            eprintln!("{command}: cannot encode the report: {error}");
            false
        }
    }
}

/// `rlvrd gates`: the report on stdout; exit 2 when the spec or the outcome cannot be read.
fn estimate(spec_path: &Path, plugin_dirs: &[PathBuf], device: EstimateDevice, json: bool) -> ExitCode {
    use rlvr_protocol::memory::{BYTES_PER_GB, DeviceKind};
    let device = match device {
        EstimateDevice::Cpu => DeviceKind::Cpu,
        EstimateDevice::Cuda => DeviceKind::Cuda,
    };
    let estimate = std::fs::read_to_string(spec_path)
        .map_err(|error| error.to_string())
        .and_then(|text| JobSpec::parse_file_text(spec_path, &text).map_err(|errors| errors.to_string()))
        .and_then(|spec| {
            let worker = rlvr_daemon::serve::worker_exe(None).map_err(|error| error.to_string())?;
            rlvr_daemon::jobs::estimate::offline(&spec, plugin_dirs, &worker, device)
        });
    let (estimate, parameters) = match estimate {
        Ok(answer) => answer,
        Err(error) => {
            eprintln!("rlvrd estimate: {}: {error}", spec_path.display());
            return ExitCode::from(2);
        }
    };
    if json {
        println!("{}", serde_json::json!({ "estimate": estimate, "parameters": parameters }));
        return ExitCode::SUCCESS;
    }
    let gb = |bytes: u64| format!("{:.2} GB", bytes as f64 / BYTES_PER_GB);
    println!("{} for a policy of {parameters} parameters", rlvr_daemon::jobs::estimate::summary(&estimate));
    println!("resident {}", gb(estimate.resident_bytes()));
    for part in &estimate.resident {
        println!("  {:<40} {}", part.name, gb(part.bytes));
    }
    for phase in &estimate.phases {
        println!("{} (+) {}", phase.phase, gb(phase.bytes()));
        for part in &phase.parts {
            println!("  {:<40} {}", part.name, gb(part.bytes));
        }
    }
    ExitCode::SUCCESS
}

fn gates(spec_path: &Path, outcome_path: &Path, json: bool) -> ExitCode {
    let read = |path: &Path| {
        std::fs::read_to_string(path).map_err(|error| format!("rlvrd gates: {}: {error}", path.display()))
    };
    let spec = read(spec_path).and_then(|text| {
        JobSpec::parse_file_text(spec_path, &text)
            .map_err(|errors| format!("rlvrd gates: {}: {errors}", spec_path.display()))
    });
    let outcome = read(outcome_path).and_then(|text| {
        serde_json::from_str::<Outcome>(&text).map_err(|error| {
            format!("rlvrd gates: {}: not a worker outcome: {error}", outcome_path.display())
        })
    });
    let (spec, outcome) = match (spec, outcome) {
        (Ok(spec), Ok(outcome)) => (spec, outcome),
        (Err(error), _) | (_, Err(error)) => {
            eprintln!("{error}");
            return ExitCode::from(2);
        }
    };
    // As the daemon does: a rejection-sampling job's dataset has its own criteria.
    let report = if JobKind::of(&spec, None) == Some(JobKind::RejectionSampling) {
        match RejectionSamplingOptions::from_spec(&spec) {
            Ok(options) => rlvr_daemon::jobs::dataset_output::judge(&options, outcome.dataset.as_ref()),
            Err(error) => {
                eprintln!("rlvrd gates: {}: {}: {}", spec_path.display(), error.field, error.message);
                return ExitCode::from(2);
            }
        }
    } else {
        rlvr_daemon::jobs::gate::judge(&spec, &outcome)
    };
    if json {
        if !print_json("rlvrd gates", &report) {
            return ExitCode::FAILURE;
        }
    } else {
        let verdict = if report.passed { "PASSED" } else { "REFUSED" };
        println!("gates: {verdict}");
        if let Some(candidate) = &report.candidate {
            println!("candidate: {}", candidate.describe());
        }
        for criterion in &report.criteria {
            let label = criterion.status.label();
            let threshold = criterion
                .threshold
                .map_or(String::new(), |t| format!(" (threshold {} {t})", criterion.op.as_str()));
            // A note may open with the status itself ("not checked: the job has no …").
            let note = criterion.note.strip_prefix(&format!("{label}: ")).unwrap_or(&criterion.note);
            println!("{}: {label}{threshold}: {note}", criterion.name);
        }
    }
    if report.passed { ExitCode::SUCCESS } else { ExitCode::FAILURE }
}

/// `rlvrd doctor`: the report on stdout; exit 2 on a bad config, 1 when the GPUs are out of the
/// worker's reach.
fn doctor(config_path: Option<PathBuf>, json: bool) -> ExitCode {
    let config = match config::load(config_path.as_deref()) {
        Ok(config) => config,
        Err(errors) => {
            eprintln!("{errors}");
            return ExitCode::from(2);
        }
    };
    let worker = match rlvr_daemon::serve::worker_exe(config.daemon.worker_exe.as_deref()) {
        Ok(worker) => worker,
        Err(error) => {
            eprintln!("rlvrd doctor: {error}");
            return ExitCode::from(2);
        }
    };
    eprintln!("asking {} what its libtorch can do (loads libtorch and CUDA)...", worker.display());
    let inventory = rlvr_daemon::sched::inventory::discover(&config.devices);
    let report = rlvr_daemon::doctor::Doctor::examine(&worker, &inventory);
    if json {
        if !print_json("rlvrd doctor", &report) {
            return ExitCode::FAILURE;
        }
    } else {
        print!("{}", report.render());
    }
    if report.gpu_problem().is_some() { ExitCode::FAILURE } else { ExitCode::SUCCESS }
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

#[cfg(test)]
mod tests {
    /// The book's reference of this program (`docs/src/reference/cli/rlvrd.md`) is its help,
    /// rendered by clap-markdown: `UPDATE_EXPECT=1 cargo test -p rlvr-daemon reference` after changing
    /// a command.
    #[test]
    fn the_books_reference_is_this_programs_help() {
        let options = clap_markdown::MarkdownOptions::new()
            .title("`rlvrd`".to_owned())
            .show_footer(false)
            .show_table_of_contents(false);
        expect_test::expect_file!["../../../docs/src/reference/cli/rlvrd.md"]
            .assert_eq(&clap_markdown::help_markdown_custom::<super::Cli>(&options));
    }
}
