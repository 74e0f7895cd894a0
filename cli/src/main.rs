//! `rlvrctl`: the command line other teams use to talk to rlvr.
//!
//! The job commands (`submit`, `status`, `list`, `watch`, `cancel`, `gates`, `promote`, `report`,
//! `curriculum refresh`) speak the daemon's HTTP API through `rlvr-client` with the team's bearer
//! token, and so does `plugins`; `verify` needs no daemon at all. `main` parses the command line
//! (clap), dispatches and maps the exit statuses; each command lives in the module of what it is
//! about — `jobs`, `models` (model lines and their versions, a version's verified download),
//! `pipeline`, `datasets`, `curriculum`, `init` (the specs of `examples/jobs/`, built in),
//! `verify`, `watch` and `logs` (following a job) — and prints its answer through `answer` (the
//! daemon a command talks to, and its answer as a table or block of text, or JSON with `--json`).
//! Beside them: `render` (tables, status block, figures), `spec` (a spec file made ready to send),
//! `report` (the HTML report, its charts in SVG).
//!
//! Exit status ([`Exit`]): 0 done (for `watch` and `submit --wait`: the job was published); 1 the
//! job ended otherwise (refused, failed, cancelled), or `verify` failed; 2 the daemon refused the
//! request (4xx) or the input on this side is wrong (spec file, config file, server URL); 3 the
//! daemon cannot be reached, answers 5xx, or answers something rlvrctl cannot read.

mod answer;
mod curriculum;
mod datasets;
mod init;
mod jobs;
mod logs;
mod models;
mod pipeline;
mod render;
mod report;
mod spec;
mod verify;
mod watch;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};
use rlvr_client::{Exit, HttpError, JobQuery, SettingsError, SpecDataError};
use rlvr_protocol::job::{IDEMPOTENCY_KEY_RULE, JobState, valid_idempotency_key};
use rlvr_startup::logging::{self, LogFormat};

use crate::answer::{BadInput, Context, Json};
use crate::render::plugin_tables;
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
    /// Multi-turn jobs' environments: `env check SPEC`.
    Env {
        #[command(subcommand)]
        command: EnvCommand,
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
enum EnvCommand {
    /// Play an [env] job spec's first episodes (one per training record from the first) with its
    /// policy against its environment, on the daemon, as its rollouts would be played, and print
    /// each span: the prompt, the model's turns (trained on), the environment's replies (masked
    /// out), how the episode ended and the environment's rewards. Checks the spec as `dry-run`
    /// does first (local data files are checked and kept, as for `estimate`). Queues nothing.
    Check {
        /// The job spec, with its [env] section.
        file: PathBuf,
        /// Episodes to play (1–8).
        #[arg(long, default_value_t = 2)]
        episodes: usize,
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

/// Runs one command: the command table, each arm calling the module that does the work and
/// prints its answer.
fn run(cli: Cli) -> anyhow::Result<Exit> {
    let Cli { server, token, json, command } = cli;
    let local_verify = server.is_none();
    let cx = Context { server, token, json };
    match command {
        Command::Submit { file, dry_run: true, .. } => jobs::dry_run(&cx, &file),
        Command::Submit { file, wait, idempotency_key, dry_run: false } => {
            jobs::submit(&cx, &file, wait, idempotency_key)
        }
        Command::Estimate { file } => jobs::estimate(&cx, &file),
        Command::Status { id } => jobs::status(&cx, &id),
        Command::List { team, state, limit, since, cursor, all } => {
            jobs::list(&cx, JobQuery { team, state, limit, since, cursor }, all)
        }
        Command::Init { kind, dir, list } => init::run(kind, &dir, list),
        Command::Models { line: None, .. } => models::list(&cx),
        Command::Models { line: Some(line), version: None, download: None } => models::versions(&cx, &line),
        Command::Models { line: Some(line), version, download } => {
            models::show(&cx, &line, version, download)
        }
        Command::Watch { id } => watch::watch(&cx.client()?, &id, json),
        Command::Logs { id, all, follow } => logs::print(&cx.client()?, &id, logs::Mode::new(all, follow)),
        Command::Cancel { id } => jobs::cancel(&cx, &id),
        Command::Gates { id } => jobs::gates(&cx, &id),
        Command::Promote { id, force: _, reason } => jobs::promote(&cx, &id, &reason),
        Command::Report { id, out } => jobs::report(&cx, &id, &out),
        Command::Env { command: EnvCommand::Check { file, episodes } } => {
            jobs::env_check(&cx, &file, episodes)
        }
        Command::Curriculum { command } => curriculum::run(&cx, command),
        Command::Pipeline { command } => pipeline::run(&cx, command),
        Command::Dataset { command } => datasets::run(&cx, command),
        Command::Line { command } => models::lines(&cx, command),
        Command::Plugins => {
            let list = cx.client()?.plugins()?;
            cx.answer(&list, Json::Block, || plugin_tables(&list))?;
            Ok(Exit::Done)
        }
        Command::Verify { plugin, spec, validate, jsonl, plugin_config, .. } if !local_verify => {
            let request = crate::verify::server_request(plugin.as_deref(), spec.as_deref(), &plugin_config)?;
            crate::verify::on_server(&cx.client()?, request, jsonl, validate)?;
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

#[cfg(test)]
mod tests {
    /// The book's reference of this program (`docs/src/reference/cli/rlvrctl.md`) is its help,
    /// rendered by clap-markdown: `UPDATE_EXPECT=1 cargo test -p rlvr-cli reference` after changing
    /// a command.
    #[test]
    fn the_books_reference_is_this_programs_help() {
        let options = clap_markdown::MarkdownOptions::new()
            .title("`rlvrctl`".to_owned())
            .show_footer(false)
            .show_table_of_contents(false);
        expect_test::expect_file!["../../docs/src/reference/cli/rlvrctl.md"]
            .assert_eq(&clap_markdown::help_markdown_custom::<super::Cli>(&options));
    }

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
        assert!(answer::client_config().user_agent.starts_with("rlvrctl/"));
    }

    #[test]
    fn idempotency_keys_that_cannot_go_into_a_request_are_refused_up_front() {
        assert_eq!(parse_idempotency_key("retry-1"), Ok("retry-1".to_owned()));
        for bad in ["", "with space", "ü", &"k".repeat(201)] {
            assert!(parse_idempotency_key(bad).is_err(), "{bad:?}");
        }
    }
}
