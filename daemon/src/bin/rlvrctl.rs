//! `rlvrctl`: the command line other teams use to talk to rlvr.

use std::fs::File;
use std::io::{self, BufReader};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use clap::{Parser, Subcommand};
use rlvr_daemon::api::PluginList;
use rlvr_daemon::config;
use rlvr_daemon::logging::{self, LogFormat};
use rlvr_daemon::metrics::Metrics;
use rlvr_daemon::registry::{Isolation, Registry};
use rlvr_daemon::verify::{BatchOptions, run_batch};
use rlvr_plugin_api::PluginKind;

/// Talk to rlvr: list plugins, verify completions offline.
#[derive(Parser)]
#[command(name = "rlvrctl", version)]
struct Cli {
    /// The daemon's API.
    #[arg(long, env = "RLVR_SERVER", default_value = "http://127.0.0.1:8470", global = true)]
    server: String,
    /// Print JSON instead of tables.
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// List the daemon's loaded plugins and the files it refused, with why.
    Plugins,
    /// Verify JSONL items with a verifier plugin, loaded here (no daemon needed).
    ///
    /// In: one {"id", "prompt", "completion", "reference"} per line ("pred" and "gold" accepted
    /// for completion and reference.answer). Out: one {"id", "score", "passed", "components",
    /// "extracted", "error", "timed_out", "latency_us", "verifier"} per line, same order.
    Verify {
        /// The verifier: NAME (newest version) or NAME@VERSION.
        #[arg(long)]
        plugin: String,
        /// Input file; stdin when absent.
        #[arg(long)]
        jsonl: Option<PathBuf>,
        /// A directory to load plugins from, besides the config's plugins.dirs (repeatable).
        #[arg(long = "plugin-dir")]
        plugin_dirs: Vec<PathBuf>,
        /// The daemon config whose plugins.dirs to use [default: /etc/rlvr/rlvrd.toml when it
        /// exists].
        #[arg(long)]
        config: Option<PathBuf>,
        /// The verifier's own options, as a JSON object (the keys of a job's [[verifiers]]).
        #[arg(long, default_value = "{}")]
        plugin_config: String,
        /// Items verified at once [default: the number of cores].
        #[arg(long)]
        parallel: Option<usize>,
        /// Answer an item with a timeout when the verifier has not judged it within this many
        /// milliseconds, whatever the plugin does.
        #[arg(long, default_value_t = 30_000, value_parser = clap::value_parser!(u64).range(1..))]
        deadline_ms: u64,
        /// Add an "explanation" to each line: what was extracted and why it matched or not.
        #[arg(long)]
        explain: bool,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    logging::init(LogFormat::Human, "warn");
    rlvr_daemon::tls::install_crypto_provider();
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("rlvrctl: {error:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Plugins => plugins(&cli.server, cli.json),
        Command::Verify {
            plugin,
            jsonl,
            plugin_dirs,
            config,
            plugin_config,
            parallel,
            deadline_ms,
            explain,
        } => {
            let parallel = parallel
                .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, std::num::NonZero::get));
            let options = VerifyOptions {
                plugin_config,
                parallel,
                deadline: Duration::from_millis(deadline_ms),
                explain,
            };
            verify(&plugin, jsonl, plugin_dirs, config, options)
        }
    }
}

fn plugins(server: &str, json: bool) -> anyhow::Result<()> {
    let url = format!("{}/v1/plugins", server.trim_end_matches('/'));
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let list: PluginList = runtime.block_on(async {
        let response =
            reqwest::get(&url).await.with_context(|| format!("cannot reach the daemon at {url}"))?;
        let status = response.status();
        if !status.is_success() {
            bail!("GET {url}: {status}: {}", response.text().await.unwrap_or_default());
        }
        response.json().await.with_context(|| format!("GET {url}: unexpected response"))
    })?;
    if json {
        println!("{}", serde_json::to_string_pretty(&list)?);
        return Ok(());
    }
    let rows: Vec<[String; 5]> = list
        .plugins
        .iter()
        .map(|p| {
            let sha = p.sha256.get(..12).unwrap_or(&p.sha256).to_owned();
            [p.name.clone(), p.version.clone(), p.kind.clone(), sha, p.description.clone()]
        })
        .collect();
    print_table(["NAME", "VERSION", "KIND", "SHA256", "DESCRIPTION"], &rows);
    let notes: Vec<[String; 2]> =
        list.plugins.iter().flat_map(|p| p.notes.iter().map(|note| [p.id.clone(), note.clone()])).collect();
    if !notes.is_empty() {
        println!();
        print_table(["PLUGIN", "NOTE"], &notes);
    }
    if !list.refused.is_empty() {
        println!();
        let rows: Vec<[String; 3]> =
            list.refused.iter().map(|r| [r.source.clone(), r.reason.clone(), r.message.clone()]).collect();
        print_table(["REFUSED FILE", "REASON", "MESSAGE"], &rows);
    }
    Ok(())
}

fn print_table<const N: usize>(header: [&str; N], rows: &[[String; N]]) {
    let mut widths = header.map(str::len);
    for row in rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let line = |cells: [&str; N]| {
        let mut text = String::new();
        for (index, cell) in cells.iter().enumerate() {
            if index + 1 == N {
                text.push_str(cell);
            } else {
                text.push_str(&format!("{cell:<width$}  ", width = widths[index]));
            }
        }
        println!("{}", text.trim_end());
    };
    line(header);
    for row in rows {
        line(std::array::from_fn(|index| row[index].as_str()));
    }
}

/// The knobs of `rlvrctl verify` besides where to find the plugin and the input.
struct VerifyOptions {
    plugin_config: String,
    parallel: usize,
    deadline: Duration,
    explain: bool,
}

fn verify(
    plugin: &str,
    jsonl: Option<PathBuf>,
    extra_dirs: Vec<PathBuf>,
    config_path: Option<PathBuf>,
    options: VerifyOptions,
) -> anyhow::Result<()> {
    let dirs = config::plugin_dirs(config_path.as_deref(), extra_dirs).map_err(anyhow::Error::msg)?;
    // Content-addressed copies live only as long as this process; the libraries stay mapped.
    let cache =
        tempfile::Builder::new().prefix("rlvrctl-plugins-").tempdir().context("cannot create a temp dir")?;
    let registry = Registry::new(cache.path().to_owned(), Isolation::InProcess, Arc::new(Metrics::new()))?;
    registry.scan(&dirs, std::time::Duration::ZERO);
    let loaded = registry.find(plugin, Some(PluginKind::Verifier)).with_context(|| {
        format!(
            "looked in {}",
            dirs.iter().map(|dir| dir.display().to_string()).collect::<Vec<_>>().join(", ")
        )
    })?;
    let verifier =
        Arc::new(loaded.verifier(&options.plugin_config).with_context(|| format!("plugin {}", loaded.id()))?);
    let batch = BatchOptions {
        verifier_id: loaded.id(),
        parallel: options.parallel,
        deadline: options.deadline,
        explain: options.explain,
    };
    let stdout = io::BufWriter::new(io::stdout().lock());
    let summary = match jsonl {
        Some(path) => {
            let file = File::open(&path).with_context(|| format!("cannot open {}", path.display()))?;
            run_batch(verifier, BufReader::new(file), stdout, &batch)
        }
        None => run_batch(verifier, BufReader::new(io::stdin()), stdout, &batch),
    }
    .context("reading input or writing output")?;
    eprintln!(
        "rlvrctl: {} item(s) verified with {}: {} passed, {} with errors ({} timed out)",
        summary.items,
        loaded.id(),
        summary.passed,
        summary.errors,
        summary.timeouts
    );
    Ok(())
}
