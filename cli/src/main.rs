//! `rlvrctl`: the command line other teams use to talk to rlvr.
//!
//! The job commands (`submit`, `status`, `list`, `watch`, `cancel`, `gates`, `promote`, `report`,
//! `curriculum refresh`) speak the daemon's HTTP API through `rlvr-client` with the team's bearer
//! token, and so does `plugins`; `verify` needs no daemon at all. This crate keeps the
//! commands and what they print: `render` (tables, status block, figures), `watch` (the views of
//! a followed job), `spec` (a spec file made ready to send), `report` (the HTML report),
//! `verify`.
//!
//! Exit status ([`Exit`]): 0 done (for `watch` and `submit --wait`: the job was published); 1 the
//! job ended otherwise (refused, failed, cancelled), or `verify` failed; 2 the daemon refused the
//! request (4xx) or the input on this side is wrong (spec file, config file, server URL); 3 the
//! daemon cannot be reached, answers 5xx, or answers something rlvrctl cannot read.

mod init;
mod logs;
mod models;
mod pipeline;
mod render;
mod report;
mod spec;
mod verify;
mod watch;

use std::fmt;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};
use rlvr_client::settings::{Sources, read_config_text, resolve_settings};
use rlvr_client::{
    Auth, Client, ClientConfig, Exit, HttpError, JobQuery, SettingsError, SpecDataError, StatusCode,
};
use rlvr_protocol::job::{IDEMPOTENCY_KEY_RULE, JobState, valid_idempotency_key};
use rlvr_startup::logging::{self, LogFormat};

use crate::render::{
    LIST_HEADER, cancel_line, format_table, gate_table, list_rows, plugin_tables, status_block,
};
use crate::spec::{fresh_idempotency_key, read_spec};
use crate::verify::{VerifyOptions, verify};

/// Talk to rlvr: submit and follow training jobs, list plugins, verify completions offline.
///
/// The daemon's address and the team's token come from --server/--token, else RLVR_SERVER and
/// RLVR_TOKEN, else `server = "..."` and `token = "..."` in ~/.config/rlvr/cli.toml (under
/// $XDG_CONFIG_HOME when set). Exit status: 0 done (watch, submit --wait: published), 1 the job
/// ended otherwise, 2 the request or input was refused, 3 the daemon cannot be reached or failed.
#[derive(Parser)]
#[command(name = "rlvrctl", version)]
struct Cli {
    /// The daemon's API [env: RLVR_SERVER; else `server` in cli.toml; default:
    /// http://127.0.0.1:8470]. `verify --server` (the URL optional) grades on the daemon.
    #[arg(long, global = true, value_name = "URL", num_args = 0..=1, default_missing_value = "")]
    server: Option<String>,
    /// The team's bearer token [env: RLVR_TOKEN; else `token` in cli.toml]. Prefer the
    /// environment or the file: other users can read a process's arguments.
    #[arg(long, global = true, value_name = "TOKEN")]
    token: Option<String>,
    /// Print JSON instead of tables (watch, submit --wait: one JSON line per event).
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Submit a job spec (TOML, or JSON when FILE ends in .json) and print the job's id.
    ///
    /// Local files named by data.train, data.heldout and data.canaries (relative to FILE's
    /// directory; `~/` is your home directory) are uploaded first as your team's datasets,
    /// named after each file, and the spec sent names them by content (`dataset:NAME@SHA256`):
    /// the daemon reads no path a spec writes.
    Submit {
        /// The job spec.
        file: PathBuf,
        /// Then follow the job like `watch`: exit 0 when it is published, 1 when it ends
        /// otherwise.
        #[arg(long)]
        wait: bool,
        /// A key that makes a repeated submit answer with the job the first one made instead of
        /// making another (kept by the daemon for 24 h; 1 to 200 printable ASCII characters).
        /// Without it, rlvrctl sends a fresh key, so its own retries never make a second job.
        #[arg(long, value_name = "KEY", value_parser = parse_idempotency_key)]
        idempotency_key: Option<String>,
        /// Only check it: the daemon checks the spec as a submit does (its plugins and their
        /// options, data, names, resources) and prints it as the job would keep it (defaults
        /// filled, names pinned); nothing is queued. A file with a [pipeline] table is checked
        /// as a pipeline. Local data files are still uploaded as datasets (the check reads them).
        #[arg(long, conflicts_with_all = ["wait", "idempotency_key"])]
        dry_run: bool,
    },
    /// Write an example job spec of KIND (sft, grpo, rloo, ppo, dpo, lora, rm,
    /// rejection-sampling, distill, pipeline) to DIR/KIND.toml, with the data files it names
    /// under DIR/data/, commented and ready to run: `rlvrctl submit --wait DIR/KIND.toml`.
    Init {
        /// The job kind; `rlvrctl init --list` names them all.
        #[arg(required_unless_present = "list")]
        kind: Option<String>,
        /// Where to write [default: the current directory].
        #[arg(default_value = ".")]
        dir: PathBuf,
        /// List the kinds there is an example of.
        #[arg(long)]
        list: bool,
    },
    /// Model lines and their published versions. No LINE: the lines your team may see. LINE:
    /// its versions (job, step, held-out score, gates). LINE VERSION (a number or `latest`): that
    /// version's manifest; with --download DIR, its files and manifest.json written to DIR, each
    /// file checked against the manifest's SHA-256 (nothing is left behind when one differs).
    Models {
        /// The model line.
        line: Option<String>,
        /// A version number, or `latest`.
        version: Option<String>,
        /// Download the version (the newest when VERSION is left out) into DIR, which must be
        /// empty or missing.
        #[arg(long, value_name = "DIR", requires = "line")]
        download: Option<PathBuf>,
    },
    /// Print a job spec's memory estimate on the daemon's devices, part by part: what it holds
    /// between phases (weights, reference, optimizer state) and what each phase adds (KV cache,
    /// activations, logits, the gates' baseline). Submit fills `[resources] memory_gb` and
    /// `resident_gb` with it when the spec leaves `memory_gb` out. Local data files are uploaded
    /// first, as `submit` does (their lengths count). Queues nothing.
    Estimate {
        /// The job spec.
        file: PathBuf,
    },
    /// Show one job: state, step, reason, the latest step's figures and the result.
    Status {
        /// The job's id (as `submit` printed it).
        id: String,
    },
    /// List jobs, newest first: this token's team's, or any team's with an admin token.
    List {
        /// Only this team's jobs (admin tokens; a team token always lists its own).
        #[arg(long)]
        team: Option<String>,
        /// Only jobs in this state (queued, admitted, running, evaluating, published, refused,
        /// failed, cancelled, preempted).
        #[arg(long)]
        state: Option<JobState>,
        /// At most this many jobs a page [daemon's default: 100].
        #[arg(long, value_parser = clap::value_parser!(u64).range(1..=1000))]
        limit: Option<u64>,
        /// Only jobs submitted since then: a duration back from now (`90m`, `2h`, `7d`) or an
        /// RFC 3339 time (`2026-11-28T09:00:00Z`).
        #[arg(long, value_name = "WHEN", value_parser = parse_since)]
        since: Option<String>,
        /// The page after the one that printed this cursor (`more: --cursor ...`).
        #[arg(long, conflicts_with = "all")]
        cursor: Option<String>,
        /// Every page, not only the first.
        #[arg(long)]
        all: bool,
    },
    /// Follow a job until it ends: one line per change of state, and a live progress bar
    /// (step, reward, held-out score, KL, tokens/s, ETA) while it trains.
    ///
    /// Reconnects by itself when the daemon restarts. Exit 0 when the job is published, 1 when
    /// it ends otherwise (refused, failed, cancelled).
    Watch {
        /// The job's id.
        id: String,
    },
    /// Show a job's worker log (every run's stderr; your team's jobs only): its last lines, or
    /// all of it, or follow it until the job ends.
    Logs {
        /// The job's id.
        id: String,
        /// Print the whole log, not only its last 64 KiB.
        #[arg(long, conflicts_with = "follow")]
        all: bool,
        /// Keep printing new lines until the job ends (polls every second).
        #[arg(long, short)]
        follow: bool,
    },
    /// Cancel a job: at once when it waits, within a step when it runs.
    Cancel {
        /// The job's id.
        id: String,
    },
    /// Show a job's gate report: one line per criterion, pass or fail, with the measured value,
    /// the threshold and what it was compared with. Exit 0 when the gates passed (or an admin
    /// forced the promotion), 1 when they refused or the job ended without being gated (failed,
    /// cancelled; it says why), 2 when the job has not been gated yet.
    Gates {
        /// The job's id.
        id: String,
    },
    /// Publish a refused job's candidate over its gates (admin token only). The override, with
    /// the reason and the admin's team, is recorded in the published manifest.
    Promote {
        /// The job's id.
        id: String,
        /// Required: says that you override the gates.
        #[arg(long, required = true)]
        force: bool,
        /// Why (recorded in the manifest).
        #[arg(long)]
        reason: String,
    },
    /// Write a job's report to DIR: index.html with the gate table and plots (SVG) of the reward
    /// and its components, held-out score, KL, completion length, all-pass/all-fail fractions
    /// and the step time split.
    Report {
        /// The job's id.
        id: String,
        /// The directory to write (created when missing).
        #[arg(long)]
        out: PathBuf,
    },
    /// Shared curricula.
    Curriculum {
        #[command(subcommand)]
        command: CurriculumCommand,
    },
    /// Multi-stage pipelines: submit, status, watch, cancel, list.
    Pipeline {
        #[command(subcommand)]
        command: PipelineCommand,
    },
    /// Your team's datasets: upload, list, delete.
    Dataset {
        #[command(subcommand)]
        command: DatasetCommand,
    },
    /// Model lines your team owns or was granted: list, show, create or change.
    Line {
        #[command(subcommand)]
        command: LineCommand,
    },
    /// List the daemon's loaded plugins and the files it refused, with why.
    Plugins,
    /// Verify JSONL items with a verifier plugin, loaded here (no daemon needed); with --server,
    /// on the daemon, as your team's job would (its secrets, the operator's outbound policy).
    ///
    /// In: one {"id", "prompt", "completion", "reference"} per line ("pred" and "gold" accepted
    /// for completion and reference.answer). Out: one {"id", "score", "passed", "components",
    /// "extracted", "error", "timed_out", "latency_us", "verifier"} per line, same order.
    Verify {
        /// The verifier: NAME (newest version) or NAME@VERSION.
        #[arg(long, required_unless_present = "spec")]
        plugin: Option<String>,
        /// With --server: grade with a job spec's whole reward (its [[verifiers]] and [reward]
        /// formula) instead of one --plugin.
        #[arg(long, conflicts_with = "plugin", value_name = "FILE")]
        spec: Option<PathBuf>,
        /// With --server: only check the grader or reward (POST /v1/graders/validate).
        #[arg(long)]
        validate: bool,
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
        /// Give the verifier the secret NAME (what an option such as the http verifier's
        /// `bearer_token_secret` names) with the value of your environment variable ENV_VAR
        /// (repeatable). A job gets its secrets from the daemon's operator instead.
        #[arg(long = "secret", value_name = "NAME=ENV_VAR", value_parser = parse_secret_arg)]
        secrets: Vec<(String, String)>,
    },
}

#[derive(Subcommand)]
enum CurriculumCommand {
    /// Recompute per-prompt difficulty from the recent rollout records of the jobs naming
    /// curriculum NAME and write its next version, which jobs admitted later pin. Runs once per
    /// curriculum and UTC date however many hosts or timers ask: later asks print the version
    /// written that day (exit 0). The systemd timer rlvr-curriculum-refresh.timer calls it nightly.
    Refresh {
        /// The curriculum (`[curriculum] name` of the jobs).
        name: String,
    },
    /// Your team's curricula and those other teams shared with yours (a job names one of those
    /// `TEAM/NAME`).
    List,
    /// Share your team's curriculum NAME with other teams (replaces the list; no --readers takes
    /// every grant back). Their jobs start from its versions and never feed it.
    Share {
        name: String,
        /// The teams that may start jobs from it.
        #[arg(long, value_delimiter = ',')]
        readers: Vec<String>,
    },
}

#[derive(Subcommand)]
enum PipelineCommand {
    /// Submit a pipeline spec (TOML, or JSON when FILE ends in .json) and print its id:
    /// `[pipeline] name, team` and `[[stages]]`, each a whole job spec; a stage writes
    /// "previous" in model.policy or model.reference to start from the previous stage's
    /// published checkpoint (data.train: its dataset). Local data files of every stage are
    /// uploaded first, as `submit` does.
    Submit {
        /// The pipeline spec.
        file: PathBuf,
        /// Then follow it like `pipeline watch`.
        #[arg(long)]
        wait: bool,
        /// As `submit --idempotency-key`.
        #[arg(long, value_name = "KEY", value_parser = parse_idempotency_key)]
        idempotency_key: Option<String>,
    },
    /// Show one pipeline: its state and reason, and each stage's job, state and output.
    Status { id: String },
    /// Follow a pipeline until it ends: a line per change. Exit 0 when it succeeded, 1 when it
    /// ended otherwise (a stage refused or failed, or cancelled).
    Watch { id: String },
    /// Cancel a pipeline: no further stage starts, and the running stage's job is cancelled.
    Cancel { id: String },
    /// List your team's pipelines, newest first.
    List,
}

#[derive(Subcommand)]
enum DatasetCommand {
    /// Upload FILE (JSONL) as dataset NAME of your team; a spec then names it `dataset:NAME`.
    /// Uploading a name again points it at the new content; jobs already submitted keep theirs.
    Put {
        /// The dataset's name: letters, digits, '-', '_', '.'.
        name: String,
        /// The JSONL file.
        file: PathBuf,
    },
    /// List your team's datasets.
    List,
    /// Delete dataset NAME.
    Rm { name: String },
}

#[derive(Subcommand)]
enum LineCommand {
    /// The model lines your team may see.
    List,
    /// One line: owner, readers, publishers, gate policy, versions.
    Show { name: String },
    /// Create line NAME for your team, or change it (its owner or an admin): who may read it,
    /// who may publish into it, and its gate policy (a TOML [gates] table's keys as JSON,
    /// e.g. '{"heldout_gain_min": 0.01}'), which jobs may tighten but never loosen.
    Set {
        name: String,
        /// Teams that may start jobs from its versions (replaces the list).
        #[arg(long, value_delimiter = ',')]
        readers: Option<Vec<String>>,
        /// Teams that may publish into it (replaces the list).
        #[arg(long, value_delimiter = ',')]
        publishers: Option<Vec<String>>,
        /// The gate policy, as JSON.
        #[arg(long)]
        policy: Option<String>,
        /// Admins: hand the line to this team.
        #[arg(long)]
        owner: Option<String>,
    },
}

/// `list --since`: a duration back from now, or an RFC 3339 time; sent as RFC 3339.
fn parse_since(text: &str) -> Result<String, String> {
    since_at(text, std::time::SystemTime::now())
}

fn since_at(text: &str, now: std::time::SystemTime) -> Result<String, String> {
    if let Ok(at) = humantime::parse_rfc3339_weak(text) {
        return Ok(humantime::format_rfc3339_seconds(at).to_string());
    }
    let back = humantime::parse_duration(text).map_err(|_| {
        format!("expected a duration back from now (90m, 2h, 7d) or an RFC 3339 time, got {text:?}")
    })?;
    let at = now.checked_sub(back).ok_or_else(|| format!("{text:?} reaches back before 1970"))?;
    Ok(humantime::format_rfc3339_seconds(at).to_string())
}

/// `NAME=ENV_VAR` of `rlvrctl verify --secret`.
fn parse_secret_arg(text: &str) -> Result<(String, String), String> {
    match text.split_once('=') {
        Some((name, variable)) if !name.is_empty() && !variable.is_empty() => {
            Ok((name.to_owned(), variable.to_owned()))
        }
        _ => Err(format!(
            "expected NAME=ENV_VAR (a secret name, then the environment variable holding it), got {text:?}"
        )),
    }
}

fn parse_idempotency_key(key: &str) -> Result<String, String> {
    if valid_idempotency_key(key) {
        Ok(key.to_owned())
    } else {
        Err(format!("expected {IDEMPOTENCY_KEY_RULE}"))
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    logging::init(LogFormat::Human, "warn");
    rlvr_startup::install_crypto_provider();
    let exit = match run(cli) {
        Ok(exit) => exit,
        Err(error) => {
            eprintln!("rlvrctl: {error:#}");
            exit_status(&error)
        }
    };
    ExitCode::from(exit.code())
}

/// Runs one command. Long because it is the command table: one short arm per subcommand, each
/// calling the module that does the work; splitting it would only scatter the table.
/// How `--json` writes an answer: pretty over several lines, or one line (what a script reading
/// lines, or following a job, takes).
#[derive(Clone, Copy)]
enum Json {
    Block,
    Line,
}

/// Prints a command's answer: `value` as JSON with `--json`, else the text `text` makes (its
/// lines each ending in a newline). The one place a command's two forms are chosen between.
fn answer<T: serde::Serialize + ?Sized>(
    json: bool,
    value: &T,
    shape: Json,
    text: impl FnOnce() -> String,
) -> anyhow::Result<()> {
    if json {
        match shape {
            Json::Block => println!("{}", serde_json::to_string_pretty(value)?),
            Json::Line => println!("{}", serde_json::to_string(value)?),
        }
    } else {
        print!("{}", text());
    }
    Ok(())
}

fn run(cli: Cli) -> anyhow::Result<Exit> {
    let Cli { server, token, json, command } = cli;
    let connect = |auth: Auth| -> anyhow::Result<Client> {
        let sources = Sources::with_process_env(server.clone(), token.clone());
        let settings = resolve_settings(&sources, auth, read_config_text)?;
        Ok(Client::with_config(settings, client_config())?)
    };
    match command {
        Command::Submit { file, dry_run: true, .. } => {
            let spec = read_spec(&file)?;
            let api = connect(Auth::Token)?;
            // A dry run moves none of the team's dataset names: a queued job's data stays its own.
            let body = api.check_spec_data(&spec.body, spec.format, std::path::Path::new("/"))?;
            let checked = if spec.is_pipeline() {
                serde_json::to_value(api.dry_run_pipeline(&body, spec.format)?.spec)?
            } else {
                serde_json::to_value(api.dry_run(&body, spec.format)?.spec)?
            };
            answer(json, &checked, Json::Block, || spec::spec_text(&checked))?;
            eprintln!("rlvrctl: {} passes the daemon's checks; nothing was queued", file.display());
            Ok(Exit::Done)
        }
        Command::Submit { file, wait, idempotency_key, dry_run: false } => {
            // The spec first: a wrong file needs no daemon to be found out.
            let spec = read_spec(&file)?;
            let api = connect(Auth::Token)?;
            let key = idempotency_key.unwrap_or_else(|| fresh_idempotency_key(&file));
            // Local data files become the team's datasets; the spec then names them.
            let body = api.upload_spec_data(&spec.body, spec.format, std::path::Path::new("/"))?;
            let submitted = api.submit(&body, spec.format, Some(&key))?;
            answer(json, &submitted, Json::Line, || {
                if !submitted.created {
                    eprintln!(
                        "rlvrctl: an earlier submit with this idempotency key made this job; nothing new was queued"
                    );
                }
                format!("{}\n", submitted.id)
            })?;
            if wait { watch::watch(&api, &submitted.id, json) } else { Ok(Exit::Done) }
        }
        Command::Estimate { file } => {
            let spec = read_spec(&file)?;
            let api = connect(Auth::Token)?;
            let body = api.check_spec_data(&spec.body, spec.format, std::path::Path::new("/"))?;
            let estimate = api.estimate(&body, spec.format)?;
            answer(json, &estimate, Json::Block, || render::estimate_table(&estimate))?;
            Ok(Exit::Done)
        }
        Command::Status { id } => {
            let job = connect(Auth::Token)?.job(&id)?;
            answer(json, &job, Json::Block, || status_block(&job))?;
            Ok(Exit::Done)
        }
        Command::List { team, state, limit, since, cursor, all } => {
            let api = connect(Auth::Token)?;
            let mut query = JobQuery { team, state, limit, since, cursor };
            let mut list = api.jobs(&query)?;
            while all && let Some(next) = list.next.take() {
                query.cursor = Some(next);
                let page = api.jobs(&query)?;
                list.jobs.extend(page.jobs);
                list.next = page.next;
            }
            answer(json, &list, Json::Block, || {
                if list.jobs.is_empty() {
                    eprintln!("rlvrctl: no jobs");
                    return String::new();
                }
                format_table(LIST_HEADER, &list_rows(&list.jobs))
            })?;
            if let (false, Some(next)) = (json, &list.next) {
                eprintln!("rlvrctl: more: rlvrctl list --cursor {next} (or --all)");
            }
            Ok(Exit::Done)
        }
        Command::Init { list: true, .. } => {
            println!("{}", init::kinds().join("\n"));
            Ok(Exit::Done)
        }
        Command::Init { kind, dir, list: false } => {
            let kind = kind.unwrap_or_default();
            let written = init::init(&kind, &dir).map_err(|error| BadInput(error.to_string()))?;
            println!("{}", written.spec.display());
            for path in &written.data {
                eprintln!("rlvrctl: wrote {}", path.display());
            }
            for path in &written.kept {
                eprintln!("rlvrctl: kept {} (already there)", path.display());
            }
            eprintln!(
                "rlvrctl: check it with `rlvrctl submit --dry-run {0}`, run it with `rlvrctl submit --wait {0}`",
                written.spec.display()
            );
            Ok(Exit::Done)
        }
        Command::Models { line: None, .. } => {
            let list = connect(Auth::Token)?.model_lines()?;
            answer(json, &list, Json::Block, || {
                let rows: Vec<[String; 3]> = list
                    .lines
                    .iter()
                    .map(|line| {
                        let newest = line.versions.last().map_or("-".to_owned(), u64::to_string);
                        [
                            line.name.clone(),
                            line.owner.clone(),
                            format!("{} (newest {newest})", line.versions.len()),
                        ]
                    })
                    .collect();
                format_table(["LINE", "OWNER", "VERSIONS"], &rows)
            })?;
            Ok(Exit::Done)
        }
        Command::Models { line: Some(line), version: None, download: None } => {
            let api = connect(Auth::Token)?;
            let versions = api.model_line(&line)?.versions;
            let manifests = versions
                .iter()
                .map(|version| api.manifest(&line, Some(*version)))
                .collect::<Result<Vec<_>, _>>()?;
            answer(json, &manifests, Json::Block, || {
                if manifests.is_empty() {
                    eprintln!("rlvrctl: model line {line} has no published version yet");
                    return String::new();
                }
                models::versions_table(&manifests)
            })?;
            Ok(Exit::Done)
        }
        Command::Models { line: Some(line), version, download } => {
            let api = connect(Auth::Token)?;
            let version =
                version.as_deref().map(models::parse_version).transpose().map_err(BadInput)?.flatten();
            let manifest = api.manifest(&line, version)?;
            match download {
                Some(dir) => {
                    models::download(&api, &manifest, &dir).map_err(|error| match error {
                        models::DownloadError::Http(http) => anyhow::Error::from(http),
                        other => BadInput(other.to_string()).into(),
                    })?;
                    println!("{}", dir.display());
                }
                None => answer(json, &manifest, Json::Block, || models::manifest_block(&manifest))?,
            }
            Ok(Exit::Done)
        }
        Command::Watch { id } => watch::watch(&connect(Auth::Token)?, &id, json),
        Command::Logs { id, all, follow } => {
            logs::print(&connect(Auth::Token)?, &id, logs::Mode::new(all, follow))
        }
        Command::Cancel { id } => {
            let job = connect(Auth::Token)?.cancel(&id)?;
            answer(json, &job, Json::Block, || format!("{}\n", cancel_line(&job)))?;
            Ok(Exit::Done)
        }
        Command::Gates { id } => {
            let job = connect(Auth::Token)?.job(&id)?;
            let Some(report) = &job.gates else {
                eprintln!("rlvrctl: {}", render::not_gated(&job));
                // An ended job will never be gated: it ended otherwise.
                return Ok(if job.state.is_terminal() { Exit::Ended } else { Exit::Refused });
            };
            answer(json, report, Json::Block, || {
                let mut text = gate_table(&job.id, report);
                if let Some(path) = &job.published {
                    text += &format!("published: {path}\n");
                }
                if let Some(dataset) = &job.published_dataset {
                    text += &format!("dataset:   {dataset}\n");
                }
                if let Some(webhook) = &job.webhook {
                    text += &format!("webhook:   {webhook}\n");
                }
                text
            })?;
            Ok(if report.promoted() { Exit::Done } else { Exit::Ended })
        }
        // clap requires `--force`; the request says it.
        Command::Promote { id, force: _, reason } => {
            let job = connect(Auth::Token)?.promote(&id, &reason)?;
            answer(json, &job, Json::Block, || format!("{}\n", job.reason))?;
            Ok(Exit::Done)
        }
        Command::Report { id, out } => {
            let api = connect(Auth::Token)?;
            let job = api.job(&id)?;
            let metrics = api.metrics(&id)?;
            let report = report::write(&out, &job, &metrics)?;
            let written = serde_json::json!({"index": report.index, "plots": report.plots});
            answer(json, &written, Json::Line, || format!("{}\n", report.index.display()))?;
            Ok(Exit::Done)
        }
        Command::Curriculum { command: CurriculumCommand::Refresh { name } } => {
            let refreshed = connect(Auth::Token)?.curriculum_refresh(&name)?;
            answer(json, &refreshed, Json::Line, || format!("{}\n", refreshed.message))?;
            Ok(Exit::Done)
        }
        Command::Curriculum { command: CurriculumCommand::List } => {
            let list = connect(Auth::Token)?.curricula()?;
            answer(json, &list, Json::Line, || {
                let mut text = String::new();
                for c in &list.curricula {
                    let version =
                        c.latest_version.map_or("no version yet".to_owned(), |v| format!("version {v}"));
                    text += &format!("{}/{}	{version}	readers [{}]\n", c.owner, c.name, c.readers.join(","));
                }
                text
            })?;
            Ok(Exit::Done)
        }
        Command::Curriculum { command: CurriculumCommand::Share { name, readers } } => {
            let shared = connect(Auth::Token)?.share_curriculum(&name, &readers)?;
            answer(json, &shared, Json::Line, || match shared.readers.as_slice() {
                [] => format!("curriculum {name} is your team's alone\n"),
                readers => format!("curriculum {name} is shared with {}\n", readers.join(", ")),
            })?;
            Ok(Exit::Done)
        }
        Command::Pipeline { command } => {
            let print = |view: &rlvr_protocol::pipeline::PipelineView| {
                answer(json, view, Json::Block, || pipeline::status_block(view))
            };
            match command {
                PipelineCommand::Submit { file, wait, idempotency_key } => {
                    let spec = read_spec(&file)?;
                    let api = connect(Auth::Token)?;
                    let key = idempotency_key.unwrap_or_else(|| fresh_idempotency_key(&file));
                    let body = api.upload_spec_data(&spec.body, spec.format, std::path::Path::new("/"))?;
                    let submitted = api.submit_pipeline(&body, spec.format, Some(&key))?;
                    answer(json, &submitted, Json::Line, || format!("{}\n", submitted.id))?;
                    if wait { pipeline::watch(&api, &submitted.id, json) } else { Ok(Exit::Done) }
                }
                PipelineCommand::Status { id } => {
                    print(&connect(Auth::Token)?.pipeline(&id)?)?;
                    Ok(Exit::Done)
                }
                PipelineCommand::Watch { id } => pipeline::watch(&connect(Auth::Token)?, &id, json),
                PipelineCommand::Cancel { id } => {
                    print(&connect(Auth::Token)?.cancel_pipeline(&id)?)?;
                    Ok(Exit::Done)
                }
                PipelineCommand::List => {
                    let list = connect(Auth::Token)?.pipelines()?;
                    // regression: with --json the list's lines followed its JSON, which then did
                    // not parse
                    answer(json, &list, Json::Block, || {
                        if list.pipelines.is_empty() {
                            eprintln!("rlvrctl: no pipelines");
                        }
                        let mut text = String::new();
                        for view in &list.pipelines {
                            let stage = (view.stage as usize).min(view.stages.len());
                            text += &format!(
                                "{}  {:<20} {:<10} stage {stage}/{}  {}\n",
                                view.id,
                                view.name,
                                view.state,
                                view.stages.len(),
                                view.reason
                            );
                        }
                        text
                    })?;
                    Ok(Exit::Done)
                }
            }
        }
        Command::Dataset { command } => {
            let api = connect(Auth::Token)?;
            match command {
                DatasetCommand::Put { name, file } => {
                    let content = std::fs::read(&file)
                        .map_err(|error| BadInput(format!("cannot read {}: {error}", file.display())))?;
                    let dataset = api.put_dataset(&name, &content)?;
                    answer(json, &dataset, Json::Line, || {
                        format!(
                            "dataset:{}@{} ({} records, {} bytes)\n",
                            dataset.name, dataset.sha256, dataset.records, dataset.bytes
                        )
                    })?;
                }
                DatasetCommand::List => {
                    let list = api.datasets()?;
                    answer(json, &list, Json::Line, || {
                        let rows = list.datasets.iter().map(|d| {
                            format!(
                                "{}\t{}\t{} records\t{} bytes\t{}\n",
                                d.name, d.sha256, d.records, d.bytes, d.uploaded_at
                            )
                        });
                        rows.collect()
                    })?;
                }
                DatasetCommand::Rm { name } => api.delete_dataset(&name)?,
            }
            Ok(Exit::Done)
        }
        Command::Line { command } => {
            let api = connect(Auth::Token)?;
            let lines = match command {
                LineCommand::List => api.model_lines()?.lines,
                LineCommand::Show { name } => vec![api.model_line(&name)?],
                LineCommand::Set { name, readers, publishers, policy, owner } => {
                    let policy = policy
                        .map(|text| serde_json::from_str(&text))
                        .transpose()
                        .map_err(|error| BadInput(format!("--policy: {error}")))?;
                    let update = rlvr_protocol::api::ModelLineUpdate { owner, readers, publishers, policy };
                    vec![api.put_model_line(&name, &update)?]
                }
            };
            for line in &lines {
                let policy = serde_json::to_string(&line.policy)?;
                answer(json, line, Json::Line, || {
                    format!(
                        "{}\towner {}\treaders [{}]\tpublishers [{}]\tversions {:?}\tpolicy {policy}\n",
                        line.name,
                        line.owner,
                        line.readers.join(","),
                        line.publishers.join(","),
                        line.versions,
                    )
                })?;
            }
            Ok(Exit::Done)
        }
        Command::Plugins => {
            let list = connect(Auth::Token)?.plugins()?;
            answer(json, &list, Json::Block, || plugin_tables(&list))?;
            Ok(Exit::Done)
        }
        Command::Verify { plugin, spec, validate, jsonl, plugin_config, .. } if server.is_some() => {
            let request = crate::verify::server_request(plugin.as_deref(), spec.as_deref(), &plugin_config)?;
            let api = connect(Auth::Token)?;
            crate::verify::on_server(&api, request, jsonl, validate)?;
            Ok(Exit::Done)
        }
        Command::Verify { spec: Some(_), .. } | Command::Verify { validate: true, .. } => {
            Err(BadInput("--spec and --validate grade on the daemon: add --server".into()).into())
        }
        Command::Verify {
            plugin,
            jsonl,
            plugin_dirs,
            config,
            plugin_config,
            parallel,
            deadline_ms,
            explain,
            secrets,
            ..
        } => {
            let parallel = parallel
                .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, std::num::NonZero::get));
            let options = VerifyOptions {
                plugin_config,
                parallel,
                deadline: Duration::from_millis(deadline_ms),
                explain,
                secrets,
            };
            let plugin = plugin.expect("clap requires --plugin without --spec");
            verify(&plugin, jsonl, plugin_dirs, config, options)?;
            Ok(Exit::Done)
        }
    }
}

/// How rlvrctl talks to the daemon: as itself, saying when it waits out a busy daemon.
fn client_config() -> ClientConfig {
    ClientConfig {
        user_agent: concat!("rlvrctl/", env!("CARGO_PKG_VERSION")).to_owned(),
        on_busy: Some(say_busy),
        ..ClientConfig::default()
    }
}

fn say_busy(status: StatusCode, wait: Duration) {
    eprintln!("rlvrctl: the daemon is busy ({status}); retrying in {} s", wait.as_secs());
}

/// The exit status for an error (see the module docs).
fn exit_status(error: &anyhow::Error) -> Exit {
    for cause in error.chain() {
        if let Some(http) = cause.downcast_ref::<HttpError>() {
            return http.exit();
        }
        // A spec's data file that cannot be read is bad input; its upload fails as any request.
        match cause.downcast_ref::<SpecDataError>() {
            Some(SpecDataError::Upload { source, .. }) => return source.exit(),
            Some(SpecDataError::Read { .. } | SpecDataError::Parse(_)) => return Exit::Refused,
            None => {}
        }
        if cause.is::<BadInput>() || cause.is::<SettingsError>() {
            return Exit::Refused;
        }
    }
    Exit::Ended
}

/// Something wrong on this side (a spec file, a plugin directory): exit 2, like a 4xx.
#[derive(Debug)]
struct BadInput(String);

impl fmt::Display for BadInput {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for BadInput {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_codes_follow_the_kind_of_failure() {
        let code = |error: anyhow::Error| exit_status(&error).code();
        let refused = HttpError::Request { url: String::new(), detail: String::new() };
        assert_eq!(code(refused.into()), 2);
        let unreachable = HttpError::Unreachable { url: String::new(), detail: String::new() };
        assert_eq!(code(anyhow::Error::new(unreachable).context("following")), 3);
        assert_eq!(code(anyhow::Error::new(BadInput("x".to_owned())).context("reading")), 2);
        assert_eq!(code(SettingsError::Token { from: "--token".to_owned() }.into()), 2);
        assert_eq!(code(anyhow::anyhow!("plugin not found")), 1);
        let unreadable = SpecDataError::Read {
            key: "train".into(),
            path: "/dev/zero".into(),
            source: std::io::Error::other("not a regular file"),
        };
        assert_eq!(code(unreadable.into()), 2);
        assert!(client_config().user_agent.starts_with("rlvrctl/"));
    }

    #[test]
    fn idempotency_keys_that_cannot_go_into_a_request_are_refused_up_front() {
        assert_eq!(parse_idempotency_key("retry-1"), Ok("retry-1".to_owned()));
        for bad in ["", "with space", "ü", &"k".repeat(201)] {
            assert!(parse_idempotency_key(bad).is_err(), "{bad:?}");
        }
    }
}
