//! `rlvrctl`: the command line other teams use to talk to rlvr.
//!
//! The job commands (`submit`, `status`, `list`, `watch`, `cancel`) speak the daemon's HTTP API
//! with the team's bearer token; `plugins` needs no token; `verify` needs no daemon at all.
//!
//! Exit status: 0 done (for `watch` and `submit --wait`: the job was published); 1 the job ended
//! otherwise (refused, failed, cancelled), or `verify` failed; 2 the daemon refused the request
//! (4xx) or the input on this side is wrong (spec file, config file, server URL); 3 the daemon
//! cannot be reached, answers 5xx, or answers something rlvrctl cannot read.

mod report;

use std::fmt;
use std::fs::File;
use std::io::{self, BufRead, BufReader, IsTerminal};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use anyhow::Context;
use clap::{Parser, Subcommand};
use indicatif::{ProgressBar, ProgressStyle};
use reqwest::blocking::{Client, RequestBuilder, Response};
use reqwest::header::{ACCEPT, CONTENT_TYPE, RETRY_AFTER};
use reqwest::{Method, StatusCode, Url};
use rlvr_plugin_api::PluginKind;
use rlvr_plugin_host::metrics::PluginMetrics;
use rlvr_plugin_host::verify::{BatchOptions, run_batch};
use rlvr_plugin_host::{Isolation, Registry};
use rlvr_protocol::api::PluginList;
use rlvr_protocol::job::{
    ApiError, ErrorBody, IDEMPOTENCY_KEY_RULE, JobEvent, JobList, JobState, JobView, Submitted,
    valid_idempotency_key,
};
use rlvr_startup::logging::{self, LogFormat};
use serde::de::DeserializeOwned;
use serde_json::Value;
use sha2::{Digest, Sha256};

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
    /// http://127.0.0.1:8470].
    #[arg(long, global = true, value_name = "URL")]
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
    /// Relative paths in data.train, data.heldout, data.canaries, model.policy, model.reference
    /// and publish.registry are made absolute against FILE's directory before the spec is sent:
    /// the daemon reads them, and it does not run where you do. `~/` is your home directory.
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
        /// At most this many jobs [daemon's default: 100].
        #[arg(long, value_parser = clap::value_parser!(u64).range(1..=1000))]
        limit: Option<u64>,
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
    /// Cancel a job: at once when it waits, within a step when it runs.
    Cancel {
        /// The job's id.
        id: String,
    },
    /// Show a job's gate report: one line per criterion, pass or fail, with the measured value,
    /// the threshold and what it was compared with. Exit 0 when the gates passed (or an admin
    /// forced the promotion), 1 when they refused, 2 when the job has not been gated yet.
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
}

/// `--idempotency-key`: what the daemon accepts (it goes into a header).
fn parse_idempotency_key(key: &str) -> Result<String, String> {
    if valid_idempotency_key(key) {
        Ok(key.to_owned())
    } else {
        Err(format!("expected {IDEMPOTENCY_KEY_RULE}"))
    }
}

/// The job was published (or the command simply succeeded).
const EXIT_OK: u8 = 0;
/// The followed job ended without being published; also any failure not classified below.
const EXIT_ENDED: u8 = 1;
/// The daemon refused the request (4xx), or the input on this side is wrong.
const EXIT_REFUSED: u8 = 2;
/// The daemon cannot be reached, failed (5xx), or answered something unreadable.
const EXIT_UNREACHABLE: u8 = 3;

fn main() -> ExitCode {
    let cli = Cli::parse();
    logging::init(LogFormat::Human, "warn");
    rlvr_startup::install_crypto_provider();
    match run(cli) {
        Ok(code) => ExitCode::from(code),
        Err(error) => {
            eprintln!("rlvrctl: {error:#}");
            ExitCode::from(exit_code(&error))
        }
    }
}

fn run(cli: Cli) -> anyhow::Result<u8> {
    let Cli { server, token, json, command } = cli;
    let connect = |need_token: bool| -> anyhow::Result<Api> {
        let sources = Sources { flag_server: server.clone(), flag_token: token.clone(), env: &env_var };
        Api::new(resolve_settings(&sources, need_token, read_config_text)?)
    };
    match command {
        Command::Submit { file, wait, idempotency_key } => {
            // The spec first: a wrong file needs no daemon to be found out.
            let spec = read_spec(&file)?;
            let api = connect(true)?;
            let key = idempotency_key.unwrap_or_else(|| fresh_idempotency_key(&file));
            let submitted = submit(&api, &spec, &key)?;
            if json {
                println!("{}", serde_json::to_string(&submitted)?);
            } else {
                println!("{}", submitted.id);
                if !submitted.created {
                    eprintln!(
                        "rlvrctl: an earlier submit with this idempotency key made this job; nothing new was queued"
                    );
                }
            }
            if wait { watch(&api, &submitted.id, json) } else { Ok(EXIT_OK) }
        }
        Command::Status { id } => {
            let job: JobView = connect(true)?.get(&["v1", "jobs", &id], &[])?;
            if json {
                println!("{}", serde_json::to_string_pretty(&job)?);
            } else {
                print!("{}", status_block(&job));
            }
            Ok(EXIT_OK)
        }
        Command::List { team, state, limit } => {
            let mut query = Vec::new();
            query.extend(team.map(|team| ("team", team)));
            query.extend(state.map(|state| ("state", state.to_string())));
            query.extend(limit.map(|limit| ("limit", limit.to_string())));
            let list: JobList = connect(true)?.get(&["v1", "jobs"], &query)?;
            if json {
                println!("{}", serde_json::to_string_pretty(&list)?);
            } else if list.jobs.is_empty() {
                eprintln!("rlvrctl: no jobs");
            } else {
                print_table(LIST_HEADER, &list_rows(&list.jobs));
            }
            Ok(EXIT_OK)
        }
        Command::Watch { id } => watch(&connect(true)?, &id, json),
        Command::Cancel { id } => {
            let job: JobView = connect(true)?.call(Method::DELETE, &["v1", "jobs", &id], &[])?;
            if json {
                println!("{}", serde_json::to_string_pretty(&job)?);
            } else {
                println!("{}", cancel_line(&job));
            }
            Ok(EXIT_OK)
        }
        Command::Gates { id } => {
            let job: JobView = connect(true)?.get(&["v1", "jobs", &id], &[])?;
            let Some(report) = &job.gates else {
                eprintln!("rlvrctl: job {id} is {} and has not been gated yet", job.state);
                return Ok(EXIT_REFUSED);
            };
            if json {
                println!("{}", serde_json::to_string_pretty(report)?);
            } else {
                print!("{}", gate_table(&job.id, report));
                if let Some(path) = &job.published {
                    println!("published: {path}");
                }
                if let Some(webhook) = &job.webhook {
                    println!("webhook:   {webhook}");
                }
            }
            Ok(if report["passed"] == true || !report["forced"].is_null() { EXIT_OK } else { EXIT_ENDED })
        }
        Command::Promote { id, force, reason } => {
            let api = connect(true)?;
            let url = api.url(&["v1", "jobs", &id, "promote"], &[]);
            let body = serde_json::json!({"force": force, "reason": reason}).to_string();
            let response = api.send(&url, || {
                api.request(Method::POST, &url).header(CONTENT_TYPE, "application/json").body(body.clone())
            })?;
            let job: JobView = api.decode(&url, response)?;
            if json {
                println!("{}", serde_json::to_string_pretty(&job)?);
            } else {
                println!("{}", job.reason);
            }
            Ok(EXIT_OK)
        }
        Command::Report { id, out } => {
            let api = connect(true)?;
            let job: Value = api.get(&["v1", "jobs", &id], &[])?;
            let history: Value = api.get(&["v1", "jobs", &id, "metrics"], &[])?;
            let lines = history["lines"].as_array().cloned().unwrap_or_default();
            let report = report::write(&out, &job, &lines)?;
            if json {
                println!("{}", serde_json::json!({"index": report.index, "plots": report.plots}));
            } else {
                println!("{}", report.index.display());
            }
            Ok(EXIT_OK)
        }
        Command::Curriculum { command: CurriculumCommand::Refresh { name } } => {
            let api = connect(true)?;
            let url = api.url(&["v1", "curricula", &name, "refresh"], &[]);
            let response = api.send(&url, || api.request(Method::POST, &url))?;
            let answer: Value = api.decode(&url, response)?;
            if json {
                println!("{answer}");
            } else {
                println!("{}", plain_value(&answer["message"]));
            }
            Ok(EXIT_OK)
        }
        Command::Plugins => {
            plugins(&connect(false)?, json)?;
            Ok(EXIT_OK)
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
        } => {
            let parallel = parallel
                .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, std::num::NonZero::get));
            let options = VerifyOptions {
                plugin_config,
                parallel,
                deadline: Duration::from_millis(deadline_ms),
                explain,
            };
            verify(&plugin, jsonl, plugin_dirs, config, options)?;
            Ok(EXIT_OK)
        }
    }
}

/// The exit status for an error (see the module docs).
fn exit_code(error: &anyhow::Error) -> u8 {
    for cause in error.chain() {
        if let Some(http) = cause.downcast_ref::<HttpError>() {
            return http.exit_code();
        }
        if cause.is::<BadInput>() {
            return EXIT_REFUSED;
        }
    }
    EXIT_ENDED
}

// ---------------------------------------------------------------------------------------------
// Where the daemon is, and who we are

/// The daemon's address when nothing else names one.
const DEFAULT_SERVER: &str = "http://127.0.0.1:8470";

/// Something wrong on this side (a spec or config file, the server URL): exit 2, like a 4xx.
#[derive(Debug)]
struct BadInput(String);

impl fmt::Display for BadInput {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for BadInput {}

/// The places settings come from besides the config file, highest first.
struct Sources<'a> {
    flag_server: Option<String>,
    flag_token: Option<String>,
    /// Looks up an environment variable (injected, so tests need not touch the process's).
    env: &'a dyn Fn(&str) -> Option<String>,
}

impl Sources<'_> {
    /// A set, non-empty environment variable.
    fn env(&self, key: &str) -> Option<String> {
        (self.env)(key).filter(|value| !value.is_empty())
    }
}

/// The daemon's address and the team's token, each from the highest place that has it.
#[derive(Debug, Clone, PartialEq)]
struct Settings {
    server: Url,
    /// Absent: requests go without `Authorization` (fine for `plugins`).
    token: Option<Token>,
    /// The config file consulted (or that would be), for hints in errors.
    config_path: Option<PathBuf>,
}

/// A bearer token. Its `Debug` shows where it came from, never the token.
#[derive(Clone, PartialEq)]
struct Token {
    secret: String,
    /// `--token`, `RLVR_TOKEN` or the config file's path.
    from: String,
}

impl fmt::Debug for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Token(from {})", self.from)
    }
}

/// What `cli.toml` holds.
#[derive(Debug, Default, PartialEq)]
struct FileSettings {
    server: Option<String>,
    token: Option<String>,
}

fn env_var(key: &str) -> Option<String> {
    std::env::var(key).ok()
}

/// `$XDG_CONFIG_HOME/rlvr/cli.toml`, else `~/.config/rlvr/cli.toml`.
fn config_path(sources: &Sources<'_>) -> Option<PathBuf> {
    // The XDG spec: a relative $XDG_CONFIG_HOME is invalid and ignored.
    if let Some(dir) = sources.env("XDG_CONFIG_HOME").map(PathBuf::from).filter(|dir| dir.is_absolute()) {
        return Some(dir.join("rlvr").join("cli.toml"));
    }
    sources.env("HOME").map(|home| PathBuf::from(home).join(".config").join("rlvr").join("cli.toml"))
}

/// A config file's text; `None` when there is no such file.
fn read_config_text(path: &Path) -> anyhow::Result<Option<String>> {
    match std::fs::read_to_string(path) {
        Ok(text) => Ok(Some(text)),
        Err(error) if error.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(error) => Err(BadInput(format!("cannot read {}: {error}", path.display())).into()),
    }
}

/// Flag, else environment, else config file, else the default — per setting. The file is read
/// only when a flag or variable leaves something open, so a broken file does not stop a command
/// that names everything itself. The token is looked for only when `need_token`.
fn resolve_settings(
    sources: &Sources<'_>,
    need_token: bool,
    read_file: impl FnOnce(&Path) -> anyhow::Result<Option<String>>,
) -> anyhow::Result<Settings> {
    // An empty flag is no flag, as an empty variable is no variable.
    let flag = |value: &Option<String>| value.clone().filter(|value| !value.is_empty());
    let mut server = flag(&sources.flag_server)
        .map(|server| (server, "--server".to_owned()))
        .or_else(|| sources.env("RLVR_SERVER").map(|server| (server, "RLVR_SERVER".to_owned())));
    let mut token = if need_token {
        flag(&sources.flag_token).map(|secret| Token { secret, from: "--token".to_owned() }).or_else(|| {
            sources.env("RLVR_TOKEN").map(|secret| Token { secret, from: "RLVR_TOKEN".to_owned() })
        })
    } else {
        None
    };
    let config_path = config_path(sources);
    let missing = server.is_none() || (need_token && token.is_none());
    if missing
        && let Some(path) = &config_path
        && let Some(text) = read_file(path)?
    {
        let file = parse_config(path, &text)?;
        let from = path.display().to_string();
        if server.is_none() {
            server = file.server.map(|server| (server, from.clone()));
        }
        if need_token && token.is_none() {
            token = file.token.map(|secret| Token { secret, from });
        }
    }
    if let Some(token) = &token {
        check_token(token)?;
    }
    let (server, from) = server.unwrap_or_else(|| (DEFAULT_SERVER.to_owned(), "the default".to_owned()));
    Ok(Settings { server: parse_server(&server, &from)?, token, config_path })
}

/// A token goes into an HTTP header: visible ASCII only. The error says where it came from and
/// never shows it.
fn check_token(token: &Token) -> Result<(), BadInput> {
    if token.secret.bytes().all(|byte| byte.is_ascii_graphic()) {
        Ok(())
    } else {
        Err(BadInput(format!(
            "the token from {}: expected visible ASCII characters only (no spaces, line breaks or other text)",
            token.from
        )))
    }
}

/// `cli.toml`: only `server` and `token`, both strings. Errors name the file and the key, and
/// never quote the file's text (it holds the token).
fn parse_config(path: &Path, text: &str) -> Result<FileSettings, BadInput> {
    let table: toml::Table = text.parse().map_err(|error: toml::de::Error| {
        BadInput(format!(
            "{}: not valid TOML{}: {}",
            path.display(),
            line_of(text, error.span()),
            error.message()
        ))
    })?;
    let mut settings = FileSettings::default();
    for (key, value) in table {
        let slot = match key.as_str() {
            "server" => &mut settings.server,
            "token" => &mut settings.token,
            _ => {
                return Err(BadInput(format!(
                    "{}: unknown key `{key}` (expected `server` or `token`)",
                    path.display()
                )));
            }
        };
        match value {
            toml::Value::String(text) => *slot = Some(text),
            other => {
                return Err(BadInput(format!(
                    "{}: `{key}`: expected a string, got {}",
                    path.display(),
                    other.type_str()
                )));
            }
        }
    }
    Ok(settings)
}

/// ` (line N)` for an error's byte span.
fn line_of(text: &str, span: Option<std::ops::Range<usize>>) -> String {
    span.and_then(|span| text.get(..span.start))
        .map(|before| format!(" (line {})", before.matches('\n').count() + 1))
        .unwrap_or_default()
}

fn parse_server(text: &str, from: &str) -> Result<Url, BadInput> {
    let url = Url::parse(text).ok().filter(|url| matches!(url.scheme(), "http" | "https") && url.has_host());
    let Some(url) = url else {
        return Err(BadInput(format!("server {text:?} (from {from}): expected an http:// or https:// URL")));
    };
    // The URL is printed in errors; a password in it would be too. The token has its own place.
    if !url.username().is_empty() || url.password().is_some() {
        return Err(BadInput(format!(
            "server (from {from}): expected a URL without a user or password; the token goes in --token, \
             RLVR_TOKEN or cli.toml"
        )));
    }
    Ok(url)
}

// ---------------------------------------------------------------------------------------------
// HTTP

/// Longest a request waits for an answer or the next piece of it (a submit reads the data
/// files before it answers).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// An event stream this long silent is dead: the daemon sends a keep-alive every 10 s.
const STREAM_SILENCE: Duration = Duration::from_secs(35);
/// Busy answers (429, 503 with Retry-After) waited out per request, and the longest wait.
const BUSY_RETRIES: u32 = 3;
const BUSY_WAIT_MAX: Duration = Duration::from_secs(30);

/// A failed request.
#[derive(Debug)]
enum HttpError {
    /// No answer: refused connection, unknown host, timeout, a cut connection.
    Unreachable { url: String, detail: String },
    /// An answer rlvrctl cannot read (another version of the daemon, or not a daemon).
    BadAnswer { url: String, detail: String },
    /// An error status, with the daemon's error body (or one made from the status).
    /// `retry_after`: the answer's Retry-After (429, 503), when it has one.
    Status { status: StatusCode, error: Box<ApiError>, hint: Option<String>, retry_after: Option<Duration> },
}

impl HttpError {
    fn exit_code(&self) -> u8 {
        match self {
            HttpError::Status { status, .. } if !status.is_server_error() => EXIT_REFUSED,
            _ => EXIT_UNREACHABLE,
        }
    }

    /// Worth trying again later: the daemon is away, failing, or busy.
    fn is_transient(&self) -> bool {
        match self {
            HttpError::Status { status, .. } => {
                status.is_server_error() || *status == StatusCode::TOO_MANY_REQUESTS
            }
            _ => true,
        }
    }

    /// How long the daemon asked us to wait before trying again.
    fn retry_after(&self) -> Option<Duration> {
        match self {
            HttpError::Status { retry_after, .. } => *retry_after,
            _ => None,
        }
    }

    /// A few words for a status line: `Connection refused (os error 111)`, `503 redis_unavailable`.
    fn short(&self) -> String {
        match self {
            HttpError::Unreachable { detail, .. } => detail.rsplit(": ").next().unwrap_or(detail).to_owned(),
            HttpError::BadAnswer { .. } => "unexpected answer".to_owned(),
            HttpError::Status { status, error, .. } => format!("{} {}", status.as_u16(), error.code),
        }
    }
}

impl fmt::Display for HttpError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HttpError::Unreachable { url, detail } => write!(f, "cannot reach the daemon ({url}): {detail}"),
            HttpError::BadAnswer { url, detail } => write!(
                f,
                "unexpected answer from {url}: {detail} (is the server an rlvrd of this rlvrctl's version?)"
            ),
            HttpError::Status { error, hint, .. } => {
                f.write_str(&api_error_text(error))?;
                if let Some(hint) = hint {
                    write!(f, "\n  ({hint})")?;
                }
                Ok(())
            }
        }
    }
}

impl std::error::Error for HttpError {}

/// `code: field: message`, then one line per further problem. The daemon's messages for a spec
/// start with the field already; it is not said twice.
fn api_error_text(error: &ApiError) -> String {
    let mut text = error.code.clone();
    if let Some(field) = error.field.as_deref().filter(|field| !field.is_empty())
        && !error.message.starts_with(&format!("{field}: "))
    {
        text.push_str(": ");
        text.push_str(field);
    }
    text.push_str(": ");
    text.push_str(&error.message);
    for problem in &error.more {
        text.push_str("\n  ");
        if !problem.field.is_empty() && !problem.message.starts_with(&format!("{}: ", problem.field)) {
            text.push_str(&problem.field);
            text.push_str(": ");
        }
        text.push_str(&problem.message);
    }
    text
}

/// The error chain of a reqwest error below its "error sending request for url" top line, which
/// says nothing the URL next to it does not.
fn reqwest_detail(error: &reqwest::Error) -> String {
    let mut causes = Vec::new();
    let mut source = std::error::Error::source(error);
    while let Some(cause) = source {
        causes.push(cause.to_string());
        source = cause.source();
    }
    if causes.is_empty() { error.to_string() } else { causes.join(": ") }
}

/// The daemon's API, with this caller's token.
struct Api {
    client: Client,
    settings: Settings,
}

impl Api {
    fn new(settings: Settings) -> anyhow::Result<Api> {
        Api::with_timeout(settings, REQUEST_TIMEOUT)
    }

    /// A blocking client's timeout bounds each wait — for the answer's head, then for each read
    /// of its body — never the whole exchange, so it also detects a silent event stream.
    fn with_timeout(settings: Settings, timeout: Duration) -> anyhow::Result<Api> {
        let client = Client::builder()
            .user_agent(concat!("rlvrctl/", env!("CARGO_PKG_VERSION")))
            .connect_timeout(CONNECT_TIMEOUT)
            .timeout(timeout)
            .build()
            .context("cannot build the HTTP client")?;
        Ok(Api { client, settings })
    }

    /// The same API for event streams: a connection silent for [`STREAM_SILENCE`] is dead. (A
    /// per-request timeout would not do: reqwest applies it to the whole, endless, body.)
    fn for_streams(&self) -> anyhow::Result<Api> {
        Api::with_timeout(self.settings.clone(), STREAM_SILENCE)
    }

    fn url(&self, segments: &[&str], query: &[(&str, String)]) -> Url {
        api_url(&self.settings.server, segments, query)
    }

    fn request(&self, method: Method, url: &Url) -> RequestBuilder {
        let request = self.client.request(method, url.clone());
        match &self.settings.token {
            Some(token) => request.bearer_auth(&token.secret),
            None => request,
        }
    }

    /// Sends the request `build` makes, waits out a few busy answers (429, 503 with
    /// Retry-After), and turns an error status into [`HttpError::Status`].
    fn send(&self, url: &Url, build: impl Fn() -> RequestBuilder) -> Result<Response, HttpError> {
        let mut retries = 0;
        loop {
            let response = build().send().map_err(|error| HttpError::Unreachable {
                url: url.to_string(),
                detail: reqwest_detail(&error),
            })?;
            if let Some(wait) = busy_wait(&response)
                && retries < BUSY_RETRIES
                && wait <= BUSY_WAIT_MAX
            {
                retries += 1;
                eprintln!(
                    "rlvrctl: the daemon is busy ({}); retrying in {} s",
                    response.status(),
                    wait.as_secs()
                );
                std::thread::sleep(wait);
                continue;
            }
            return self.check(url, response);
        }
    }

    fn check(&self, url: &Url, response: Response) -> Result<Response, HttpError> {
        let status = response.status();
        if status.is_success() {
            return Ok(response);
        }
        let retry_after = busy_wait(&response);
        let text = response.text().unwrap_or_default();
        let error = serde_json::from_str::<ErrorBody>(&text).map(|body| body.error).unwrap_or_else(|_| {
            // Not the daemon's error body (a proxy, another server): say what there is.
            let snippet: String = text.trim().chars().take(200).collect();
            ApiError {
                code: status_code_name(status),
                message: if snippet.is_empty() { format!("{status} from {url}") } else { snippet },
                field: None,
                more: Vec::new(),
            }
        });
        let hint = (status == StatusCode::UNAUTHORIZED).then(|| self.token_hint());
        Err(HttpError::Status { status, error: Box::new(error), hint, retry_after })
    }

    /// Where the token came from, or where to put one.
    fn token_hint(&self) -> String {
        let file = self
            .settings
            .config_path
            .as_deref()
            .map_or_else(|| "~/.config/rlvr/cli.toml".to_owned(), |path| path.display().to_string());
        match &self.settings.token {
            Some(token) => format!("the token came from {}", token.from),
            None => format!("no token given: pass --token, set RLVR_TOKEN, or put token = \"...\" in {file}"),
        }
    }

    /// Reads a successful answer's JSON body.
    fn decode<T: DeserializeOwned>(&self, url: &Url, response: Response) -> Result<T, HttpError> {
        let text = response.text().map_err(|error| HttpError::Unreachable {
            url: url.to_string(),
            detail: reqwest_detail(&error),
        })?;
        serde_json::from_str(&text)
            .map_err(|error| HttpError::BadAnswer { url: url.to_string(), detail: error.to_string() })
    }

    fn get<T: DeserializeOwned>(&self, segments: &[&str], query: &[(&str, String)]) -> Result<T, HttpError> {
        self.call(Method::GET, segments, query)
    }

    /// A request without a body whose answer is JSON.
    fn call<T: DeserializeOwned>(
        &self,
        method: Method,
        segments: &[&str],
        query: &[(&str, String)],
    ) -> Result<T, HttpError> {
        let url = self.url(segments, query);
        let response = self.send(&url, || self.request(method.clone(), &url))?;
        self.decode(&url, response)
    }
}

/// The server's URL with these path segments (each percent-encoded) and query pairs.
fn api_url(server: &Url, segments: &[&str], query: &[(&str, String)]) -> Url {
    let mut url = server.clone();
    url.set_query(None);
    url.set_fragment(None);
    if let Ok(mut path) = url.path_segments_mut() {
        path.pop_if_empty().extend(segments);
    }
    if !query.is_empty() {
        url.query_pairs_mut().extend_pairs(query);
    }
    url
}

/// How long a 429 or 503 answer asks us to wait, when it says (in seconds).
fn busy_wait(response: &Response) -> Option<Duration> {
    if !matches!(response.status(), StatusCode::TOO_MANY_REQUESTS | StatusCode::SERVICE_UNAVAILABLE) {
        return None;
    }
    let seconds: u64 = response.headers().get(RETRY_AFTER)?.to_str().ok()?.trim().parse().ok()?;
    Some(Duration::from_secs(seconds))
}

/// `bad_gateway` for 502: an error code for answers without the daemon's error body.
fn status_code_name(status: StatusCode) -> String {
    status.canonical_reason().map_or_else(
        || format!("http_{}", status.as_u16()),
        |reason| reason.to_lowercase().replace([' ', '-'], "_"),
    )
}

// ---------------------------------------------------------------------------------------------
// submit

/// A spec ready to send.
struct PreparedSpec {
    body: String,
    content_type: &'static str,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum SpecFormat {
    Toml,
    Json,
}

/// Reads a spec file and makes its paths absolute (see [`prepare_spec`]).
fn read_spec(file: &Path) -> anyhow::Result<PreparedSpec> {
    let text = std::fs::read_to_string(file)
        .map_err(|error| BadInput(format!("cannot read {}: {error}", file.display())))?;
    let absolute = std::path::absolute(file)
        .map_err(|error| BadInput(format!("cannot resolve {}: {error}", file.display())))?;
    let base = absolute.parent().unwrap_or(Path::new("/"));
    let format = if file.extension().is_some_and(|ext| ext.eq_ignore_ascii_case("json")) {
        SpecFormat::Json
    } else {
        SpecFormat::Toml
    };
    let home = env_var("HOME").filter(|home| !home.is_empty()).map(PathBuf::from);
    let body = prepare_spec(&text, format, base, home.as_deref())
        .map_err(|message| BadInput(format!("{}: {message}", file.display())))?;
    let content_type = match format {
        SpecFormat::Toml => "application/toml",
        SpecFormat::Json => "application/json",
    };
    Ok(PreparedSpec { body, content_type })
}

/// The spec fields that name files or directories, as (section, key).
const PATH_FIELDS: [(&str, &str); 6] = [
    ("data", "train"),
    ("data", "heldout"),
    ("data", "canaries"),
    ("model", "policy"),
    ("model", "reference"),
    ("publish", "registry"),
];

/// The spec's text with every relative path of [`PATH_FIELDS`] made absolute against `base`
/// (the spec file's directory), in the same format. Everything else is left for the daemon to
/// judge, wrong types included.
fn prepare_spec(text: &str, format: SpecFormat, base: &Path, home: Option<&Path>) -> Result<String, String> {
    match format {
        SpecFormat::Toml => {
            let mut table: toml::Table = text.parse().map_err(|error: toml::de::Error| {
                format!("not valid TOML{}: {}", line_of(text, error.span()), error.message())
            })?;
            for (section, key) in PATH_FIELDS {
                if let Some(toml::Value::String(value)) =
                    table.get_mut(section).and_then(|section| section.get_mut(key))
                    && let Some(absolute) = absolute_path(section, value, base, home)?
                {
                    *value = absolute;
                }
            }
            toml::to_string(&table).map_err(|error| format!("cannot write the spec back as TOML: {error}"))
        }
        SpecFormat::Json => {
            let mut spec: Value =
                serde_json::from_str(text).map_err(|error| format!("not valid JSON: {error}"))?;
            for (section, key) in PATH_FIELDS {
                if let Some(Value::String(value)) = spec.pointer_mut(&format!("/{section}/{key}"))
                    && let Some(absolute) = absolute_path(section, value, base, home)?
                {
                    *value = absolute;
                }
            }
            Ok(spec.to_string())
        }
    }
}

/// The absolute form of one path field's value, or `None` to leave it as it is: already
/// absolute, empty, a URL, or (for `model.*`) `same` or `builtin:…`.
fn absolute_path(
    section: &str,
    value: &str,
    base: &Path,
    home: Option<&Path>,
) -> Result<Option<String>, String> {
    if value.is_empty() || value.contains("://") {
        return Ok(None);
    }
    if section == "model" && (value == "same" || value.starts_with("builtin:")) {
        return Ok(None);
    }
    let path = if value == "~" {
        home.map(Path::to_path_buf)
    } else if let Some(rest) = value.strip_prefix("~/") {
        home.map(|home| home.join(rest))
    } else if Path::new(value).is_absolute() {
        None
    } else {
        Some(base.join(value))
    };
    let Some(path) = path else { return Ok(None) };
    // Drops `.` components (`./data/x` → `/base/data/x`); `..` stays (symlinks make it unsafe to fold).
    let path: PathBuf = path.components().collect();
    path.to_str()
        .map(|path| Some(path.to_owned()))
        .ok_or_else(|| format!("the absolute path of {value:?} is not UTF-8: {}", path.display()))
}

/// A key no other submit will use, so that rlvrctl's own retries are safe.
fn fresh_idempotency_key(file: &Path) -> String {
    let now = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default();
    let mut hash = Sha256::new();
    hash.update(std::process::id().to_le_bytes());
    hash.update(now.as_nanos().to_le_bytes());
    hash.update(file.as_os_str().as_encoded_bytes());
    format!("rlvrctl-{}", hex::encode(&hash.finalize()[..16]))
}

fn submit(api: &Api, spec: &PreparedSpec, idempotency_key: &str) -> Result<Submitted, HttpError> {
    let url = api.url(&["v1", "jobs"], &[]);
    let response = api.send(&url, || {
        api.request(Method::POST, &url)
            .header(CONTENT_TYPE, spec.content_type)
            .header("Idempotency-Key", idempotency_key)
            .body(spec.body.clone())
    })?;
    api.decode(&url, response)
}

// ---------------------------------------------------------------------------------------------
// gates

/// `rlvrctl gates`: the verdict, the baseline, then one row per criterion.
fn gate_table(id: &str, report: &Value) -> String {
    let verdict = match (report["passed"].as_bool(), report["forced"].is_null()) {
        (Some(true), _) => "PASSED",
        (_, false) => "REFUSED, then promoted by an admin",
        _ => "REFUSED",
    };
    let baseline = &report["baseline"];
    let against = match (baseline["kind"].as_str(), baseline["version"].as_u64()) {
        (Some("published"), Some(version)) => {
            format!("the model line's published version {version} ({})", plain_value(&baseline["model"]))
        }
        (Some(_), _) => format!("the starting checkpoint ({})", plain_value(&baseline["model"])),
        (None, _) => "nothing: the candidate was not evaluated".to_owned(),
    };
    let number = |value: &Value| value.as_f64().map_or_else(|| "-".to_owned(), |v| format!("{v:.4}"));
    let rows: Vec<[String; 5]> = report["criteria"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default()
        .iter()
        .map(|criterion| {
            let threshold = criterion["threshold"]
                .as_f64()
                .map_or_else(|| "-".to_owned(), |t| format!("{} {t}", plain_value(&criterion["op"])));
            [
                plain_value(&criterion["name"]),
                if criterion["passed"] == true { "pass" } else { "FAIL" }.to_owned(),
                number(&criterion["measured"]),
                threshold,
                plain_value(&criterion["note"]),
            ]
        })
        .collect();
    let mut text = format!("gates of job {id}: {verdict}\ncompared with {against}\n");
    text.push_str(&format_table(["CRITERION", "RESULT", "MEASURED", "THRESHOLD", "NOTE"], &rows));
    if let Some(forced) = report["forced"].as_object() {
        text.push_str(&format!(
            "forced by admin team {} at {}: {}\n",
            plain_value(&forced["by"]),
            plain_value(&forced["at"]),
            plain_value(&forced["reason"])
        ));
    }
    text
}

// ---------------------------------------------------------------------------------------------
// status, list, cancel

/// `rlvrctl status`: one `label  value` line each, what is known only.
fn status_block(job: &JobView) -> String {
    let mut lines: Vec<(&str, String)> = vec![
        ("job", job.id.clone()),
        (
            "name",
            format!(
                "{} (team {}, {} priority, model line {})",
                job.name, job.team, job.priority, job.model_line
            ),
        ),
        ("state", job.state.to_string()),
    ];
    if !job.reason.is_empty() {
        lines.push(("reason", job.reason.clone()));
    }
    lines.push(("step", format!("{}/{}", job.step, job.max_steps)));
    if let Some(devices) = current_devices(job) {
        lines.push(("devices", devices));
    }
    if let Some(grant) = &job.grant {
        lines.push(("grant", grant.clone()));
    }
    if job.preemptions > 0 {
        lines.push(("preempted", format!("{} time(s)", job.preemptions)));
    }
    let figures = figures(job.progress.as_ref(), job.heldout, Detail::Full);
    if !figures.is_empty() {
        lines.push(("progress", figures));
    }
    if job.cancel_requested {
        lines.push(("cancel", "requested; the worker stops within a step".to_owned()));
    }
    if job.crashes > 0 {
        lines.push(("crashes", job.crashes.to_string()));
    }
    match &job.result {
        Some(Value::Object(result)) => {
            // The figures only: the evaluation, plugins and hashes are `gates` and `--json`'s.
            let scalars = result.iter().filter(|(_, value)| !value.is_object() && !value.is_array());
            for (index, (key, value)) in scalars.enumerate() {
                let label = if index == 0 { "result" } else { "" };
                lines.push((label, format!("{key}: {}", plain_value(value))));
            }
        }
        Some(result) => lines.push(("result", plain_value(result))),
        None => {}
    }
    if let Some(gates) = &job.gates {
        let failed =
            gates["criteria"].as_array().map_or(0, |c| c.iter().filter(|c| c["passed"] != true).count());
        let verdict = if gates["passed"] == true {
            "passed".to_owned()
        } else {
            format!("refused ({failed} criteria failed)")
        };
        lines.push(("gates", format!("{verdict}; rlvrctl gates {} shows the table", job.id)));
    }
    if let Some(path) = &job.published {
        lines.push(("published", path.clone()));
    }
    if let Some(webhook) = &job.webhook {
        lines.push(("webhook", webhook.clone()));
    }
    lines.push(("created", job.created_at.clone()));
    lines.push(("updated", job.updated_at.clone()));
    lines.into_iter().map(|(label, value)| format!("{label:<9} {value}\n")).collect()
}

/// A string as itself, anything else as compact JSON.
fn plain_value(value: &Value) -> String {
    match value {
        Value::String(text) => text.clone(),
        other => other.to_string(),
    }
}

/// The devices a job holds now (admitted, running or evaluating): `cpu:0`, `cuda:0,cuda:1`.
fn current_devices(job: &JobView) -> Option<String> {
    (job.state.is_active() && !job.devices.is_empty()).then(|| job.devices.join(","))
}

/// The columns of [`LIST_HEADER`].
fn list_rows(jobs: &[JobView]) -> Vec<[String; 10]> {
    jobs.iter()
        .map(|job| {
            // The grant's first word: `holding` or `waiting`.
            let grant = job.grant.as_deref().and_then(|grant| grant.split(' ').next()).unwrap_or("-");
            [
                job.id.clone(),
                job.team.clone(),
                job.name.clone(),
                job.state.to_string(),
                format!("{}/{}", job.step, job.max_steps),
                current_devices(job).unwrap_or_else(|| "-".to_owned()),
                grant.to_owned(),
                job.preemptions.to_string(),
                short_time(&job.updated_at),
                truncate(&job.reason, 50),
            ]
        })
        .collect()
}

const LIST_HEADER: [&str; 10] =
    ["ID", "TEAM", "NAME", "STATE", "STEP", "DEVICES", "GRANT", "PREEMPTED", "UPDATED", "REASON"];

fn cancel_line(job: &JobView) -> String {
    if job.state == JobState::Cancelled {
        format!("cancelled job {}", job.id)
    } else if job.cancel_requested {
        format!("cancel requested for job {} ({}): its worker stops within a step", job.id, job.state)
    } else {
        format!("job {} is {}", job.id, job.state)
    }
}

/// `2026-11-21 06:03:00` from RFC 3339 (`2026-11-21T06:03:00.123Z`); anything else as it is.
fn short_time(at: &str) -> String {
    match (at.get(..10), clock(at)) {
        (Some(date), time) if time != at => format!("{date} {time}"),
        _ => at.to_owned(),
    }
}

/// `06:03:00` from RFC 3339; anything else as it is.
fn clock(at: &str) -> &str {
    match at.get(11..19) {
        Some(time) if at.as_bytes()[10] == b'T' => time,
        _ => at,
    }
}

/// At most `max` characters on one line, `…` marking a cut.
fn truncate(text: &str, max: usize) -> String {
    let line = text.replace(['\n', '\r'], " ");
    if line.chars().count() <= max {
        return line;
    }
    let mut cut: String = line.chars().take(max.saturating_sub(1)).collect();
    cut.push('…');
    cut
}

/// The figures of a job's latest step: `reward 0.625 · held-out 0.810 · KL 0.0123 · 1234 tok/s ·
/// ETA 3m 12s`; in [`Detail::Full`], loss and seconds per step too. Unknown figures are left out.
fn figures(progress: Option<&Value>, heldout: Option<f64>, detail: Detail) -> String {
    let full = detail == Detail::Full;
    let number = |key: &str| progress.and_then(|progress| progress.get(key)).and_then(Value::as_f64);
    let mut parts = Vec::new();
    if let Some(reward) = number("reward") {
        parts.push(format!("reward {reward:.3}"));
    }
    if full && let Some(loss) = number("loss") {
        parts.push(format!("loss {loss:.4}"));
    }
    if let Some(heldout) = number("heldout").or(heldout) {
        parts.push(format!("held-out {heldout:.3}"));
    }
    if let Some(kl) = number("kl") {
        parts.push(format!("KL {kl:.4}"));
    }
    if let Some(rate) = number("tokens_per_s") {
        parts.push(format!("{rate:.0} tok/s"));
    }
    if full && let Some(step_s) = number("step_s") {
        parts.push(format!("{step_s:.2} s/step"));
    }
    if let Some(eta) = number("eta_s").filter(|eta| eta.is_finite() && *eta >= 0.0) {
        parts.push(format!("ETA {}", duration_text(eta)));
    }
    parts.join(" · ")
}

/// How many figures [`figures`] shows: a progress line's, or `status`'s.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Detail {
    Brief,
    Full,
}

/// `45s`, `3m 12s`, `2h 05m`.
fn duration_text(seconds: f64) -> String {
    let total = seconds.round() as u64;
    match total {
        0..60 => format!("{total}s"),
        60..3600 => format!("{}m {:02}s", total / 60, total % 60),
        _ => format!("{}h {:02}m", total / 3600, total % 3600 / 60),
    }
}

/// `12:00:01 running — worker pid 123 started`: one change of state.
fn state_line(event: &JobEvent) -> String {
    let mut line = format!("{} {}", clock(&event.at), event.state);
    if event.step > 0 {
        line.push_str(&format!(" at step {}", event.step));
    }
    if !event.reason.is_empty() {
        line.push_str(" — ");
        line.push_str(&event.reason);
    }
    line
}

// ---------------------------------------------------------------------------------------------
// watch

/// One server-sent event.
#[derive(Debug, Clone, PartialEq)]
struct SseEvent {
    /// `message` when the event named none.
    event: String,
    /// The data lines, joined with `\n`.
    data: String,
}

/// The server-sent events parser of the WHATWG HTML spec (§9.2.6), fed one line at a time.
#[derive(Debug, Default)]
struct SseParser {
    event: String,
    data: String,
    /// The id of the event being received; becomes `last_id` when the event is complete.
    id: Option<String>,
    /// The last complete event's id: what to send as `Last-Event-ID` when reconnecting.
    last_id: Option<String>,
}

impl SseParser {
    /// Feeds one line, without its line ending; a blank line completes an event.
    fn line(&mut self, line: &str) -> Option<SseEvent> {
        if line.is_empty() {
            return self.dispatch();
        }
        if line.starts_with(':') {
            return None; // a comment: the daemon's keep-alive
        }
        let (field, value) = match line.split_once(':') {
            Some((field, value)) => (field, value.strip_prefix(' ').unwrap_or(value)),
            None => (line, ""),
        };
        match field {
            "event" => self.event = value.to_owned(),
            "data" => {
                self.data.push_str(value);
                self.data.push('\n');
            }
            "id" if !value.contains('\0') => self.id = Some(value.to_owned()),
            _ => {} // `retry` (rlvrctl has its own backoff) and unknown fields
        }
        None
    }

    fn dispatch(&mut self) -> Option<SseEvent> {
        self.last_id.clone_from(&self.id);
        let event = std::mem::take(&mut self.event);
        let mut data = std::mem::take(&mut self.data);
        if data.is_empty() {
            return None;
        }
        data.pop(); // the last line's `\n`
        Some(SseEvent { event: if event.is_empty() { "message".to_owned() } else { event }, data })
    }

    /// Forgets a half-received event (the connection dropped in its middle); keeps `last_id`.
    fn reconnect(&mut self) {
        self.event.clear();
        self.data.clear();
        self.id.clone_from(&self.last_id);
    }
}

/// What a job event stream said.
#[derive(Debug)]
enum Update {
    State(JobEvent),
    Progress(Box<JobView>),
}

/// How `watch` shows a job.
trait View {
    fn state(&mut self, event: &JobEvent, raw: &str);
    fn progress(&mut self, job: &JobView, raw: &str);
    /// The stream dropped; the next try is in `wait`.
    fn reconnecting(&mut self, why: &str, wait: Duration) {
        eprintln!("rlvrctl: {why}; reconnecting in {:.1} s…", wait.as_secs_f64());
    }
    /// A stream is open (again).
    fn connected(&mut self) {}
    fn finish(&mut self) {}
}

/// Follows a job to its end; the exit status says how it ended.
fn watch(api: &Api, id: &str, json: bool) -> anyhow::Result<u8> {
    // The job first: a wrong id or token is a plain error, before any stream.
    let job: JobView = api.get(&["v1", "jobs", id], &[])?;
    let mut view: Box<dyn View> = if json {
        Box::new(JsonLines)
    } else if io::stderr().is_terminal() {
        Box::new(Bar::new(&job)?)
    } else {
        Box::new(Plain::default())
    };
    let end = follow(api, id, view.as_mut());
    view.finish();
    let end = end?;
    if end.state == JobState::Published {
        return Ok(EXIT_OK);
    }
    if !json {
        eprintln!("rlvrctl: {}", end_line(id, &end));
    }
    Ok(EXIT_ENDED)
}

/// `job ID refused: gate heldout_min: 0.41 < 0.5`, without saying the state twice when the
/// reason starts with it (`cancelled: the worker was stopped`).
fn end_line(id: &str, end: &JobEvent) -> String {
    let state = end.state.as_str();
    if end.reason.is_empty() {
        format!("job {id} {state}")
    } else if end.reason.starts_with(state) {
        format!("job {id}: {}", end.reason)
    } else {
        format!("job {id} {state}: {}", end.reason)
    }
}

/// How long `watch` tries to get a stream back (no stream opened) before it gives up.
const RECONNECT_GIVE_UP: Duration = Duration::from_secs(300);

/// Reconnect waits: 0.5 s, doubling to 10 s; back to the start once events flow again.
struct Backoff {
    next: Duration,
}

impl Backoff {
    const FIRST: Duration = Duration::from_millis(500);
    const MAX: Duration = Duration::from_secs(10);

    fn new() -> Self {
        Backoff { next: Self::FIRST }
    }

    fn next(&mut self) -> Duration {
        let wait = self.next;
        self.next = (self.next * 2).min(Self::MAX);
        wait
    }

    fn reset(&mut self) {
        self.next = Self::FIRST;
    }
}

/// Reads the job's event stream until its final state, reconnecting (with `Last-Event-ID`, so
/// nothing is missed or repeated) when the stream drops or the daemon restarts.
fn follow(api: &Api, id: &str, view: &mut dyn View) -> anyhow::Result<JobEvent> {
    let stream_api = api.for_streams()?;
    let url = api.url(&["v1", "jobs", id, "events"], &[]);
    let mut parser = SseParser::default();
    let mut backoff = Backoff::new();
    // The give-up clock runs from the first failure since a stream last said anything (events
    // or keep-alives): a job may wait queued for hours on one quiet, healthy stream.
    let mut down_since: Option<Instant> = None;
    loop {
        parser.reconnect();
        let opened = stream_api.send(&url, || {
            let request = stream_api.request(Method::GET, &url).header(ACCEPT, "text/event-stream");
            match &parser.last_id {
                Some(last) => request.header("Last-Event-ID", last),
                None => request,
            }
        });
        let mut server_wait = None;
        let why = match opened {
            Ok(response) => {
                view.connected();
                let (end, alive) = read_stream(response, &mut parser, view)?;
                // Only something read proves a stream works: one that closes at once must
                // neither retry hot nor keep the give-up clock from running.
                if alive {
                    backoff.reset();
                    down_since = None;
                }
                match end {
                    StreamEnd::Ended(event) => return Ok(event),
                    StreamEnd::Closed => "the daemon closed the stream".to_owned(),
                    StreamEnd::Broken(why) => why,
                }
            }
            Err(error) if error.is_transient() => {
                server_wait = error.retry_after();
                error.short()
            }
            Err(error) => return Err(error.into()),
        };
        if down_since.get_or_insert_with(Instant::now).elapsed() >= RECONNECT_GIVE_UP {
            return Err(HttpError::Unreachable {
                url: url.to_string(),
                detail: format!(
                    "no stream for {} s ({why}); the job goes on: `rlvrctl watch {id}` follows it again",
                    RECONNECT_GIVE_UP.as_secs()
                ),
            }
            .into());
        }
        // A busy daemon's Retry-After is the least we wait: hammering it spends the team's rate.
        let wait = backoff.next().max(server_wait.unwrap_or_default());
        view.reconnecting(&why, wait);
        std::thread::sleep(wait);
    }
}

enum StreamEnd {
    /// The job reached a final state.
    Ended(JobEvent),
    /// The stream ended without one (the daemon stopping).
    Closed,
    /// Reading failed (a cut connection, a silent one).
    Broken(String),
}

/// Reads events until the stream ends; also says whether any complete line came (an event or a
/// keep-alive: the stream was alive).
fn read_stream(
    response: Response,
    parser: &mut SseParser,
    view: &mut dyn View,
) -> anyhow::Result<(StreamEnd, bool)> {
    let url = response.url().to_string();
    let content_type = response.headers().get(CONTENT_TYPE).and_then(|value| value.to_str().ok());
    if !content_type.is_some_and(|value| value.starts_with("text/event-stream")) {
        let detail = format!("expected an event stream, got content type {:?}", content_type.unwrap_or(""));
        return Err(HttpError::BadAnswer { url, detail }.into());
    }
    let mut reader = BufReader::new(response);
    let mut line = Vec::new();
    let mut alive = false;
    let mut first = true;
    loop {
        line.clear();
        match reader.read_until(b'\n', &mut line) {
            Ok(0) => return Ok((StreamEnd::Closed, alive)),
            Ok(_) => {}
            Err(error) => return Ok((StreamEnd::Broken(format!("the stream broke: {error}")), alive)),
        }
        // A last line without its line ending was cut: its event is incomplete.
        if line.last() != Some(&b'\n') {
            return Ok((StreamEnd::Closed, alive));
        }
        let text = String::from_utf8_lossy(&line);
        let mut text = text.trim_end_matches(['\n', '\r']);
        if first {
            text = text.trim_start_matches('\u{feff}');
            first = false;
        }
        alive = true;
        let Some(event) = parser.line(text) else { continue };
        match parse_update(&event) {
            Ok(Some(Update::State(state))) => {
                view.state(&state, &event.data);
                if state.state.is_terminal() {
                    return Ok((StreamEnd::Ended(state), alive));
                }
            }
            Ok(Some(Update::Progress(job))) => view.progress(&job, &event.data),
            Ok(None) => {}
            Err(detail) => return Err(HttpError::BadAnswer { url, detail }.into()),
        }
    }
}

/// A `state` or `progress` event's data; other event names are ignored.
fn parse_update(event: &SseEvent) -> Result<Option<Update>, String> {
    match event.event.as_str() {
        "state" => serde_json::from_str(&event.data)
            .map(|state| Some(Update::State(state)))
            .map_err(|error| format!("a state event: {error}")),
        "progress" => serde_json::from_str(&event.data)
            .map(|job| Some(Update::Progress(Box::new(job))))
            .map_err(|error| format!("a progress event: {error}")),
        _ => Ok(None),
    }
}

/// `--json`: each event as one line, `{"event": "state"|"progress", "data": {...}}`.
struct JsonLines;

impl JsonLines {
    fn print(kind: &str, raw: &str) {
        // Compact, one line, `event` first (a json! map would sort it after `data`).
        let data: Value = serde_json::from_str(raw).unwrap_or(Value::Null);
        println!("{{\"event\":{},\"data\":{data}}}", Value::from(kind));
    }
}

impl View for JsonLines {
    fn state(&mut self, _: &JobEvent, raw: &str) {
        JsonLines::print("state", raw);
    }

    fn progress(&mut self, _: &JobView, raw: &str) {
        JsonLines::print("progress", raw);
    }
}

/// On a terminal: state lines on stdout, a live bar on stderr below them.
struct Bar {
    bar: ProgressBar,
    state: JobState,
    figures: String,
    reconnecting: bool,
}

impl Bar {
    fn new(job: &JobView) -> anyhow::Result<Bar> {
        let style = ProgressStyle::with_template("{spinner} {prefix:<10} [{bar:30}] {pos}/{len} {wide_msg}")
            .context("progress bar template")?
            .progress_chars("=> ");
        let bar = ProgressBar::new(job.max_steps).with_style(style);
        bar.set_position(job.step);
        bar.set_prefix(job.state.to_string());
        let figures = figures(job.progress.as_ref(), job.heldout, Detail::Brief);
        bar.set_message(figures.clone());
        bar.enable_steady_tick(Duration::from_millis(120));
        Ok(Bar { bar, state: job.state, figures, reconnecting: false })
    }
}

impl View for Bar {
    fn state(&mut self, event: &JobEvent, _: &str) {
        self.bar.suspend(|| println!("{}", state_line(event)));
        self.state = event.state;
        self.bar.set_prefix(event.state.to_string());
        if event.step > 0 {
            self.bar.set_position(event.step);
        }
    }

    fn progress(&mut self, job: &JobView, _: &str) {
        self.bar.set_length(job.max_steps);
        self.bar.set_position(job.step);
        self.figures = figures(job.progress.as_ref(), job.heldout, Detail::Brief);
        self.bar.set_message(self.figures.clone());
    }

    fn reconnecting(&mut self, why: &str, wait: Duration) {
        self.reconnecting = true;
        self.bar.set_prefix("reconnecting…");
        self.bar.set_message(format!("{why}; next try in {:.1} s", wait.as_secs_f64()));
    }

    fn connected(&mut self) {
        if std::mem::take(&mut self.reconnecting) {
            self.bar.set_prefix(self.state.to_string());
            self.bar.set_message(self.figures.clone());
        }
    }

    fn finish(&mut self) {
        self.bar.finish_and_clear();
    }
}

/// Not a terminal (a log, CI): plain lines, progress at most every 10 s.
#[derive(Default)]
struct Plain {
    last_progress: Option<Instant>,
}

impl Plain {
    const PROGRESS_EVERY: Duration = Duration::from_secs(10);
}

impl View for Plain {
    fn state(&mut self, event: &JobEvent, _: &str) {
        println!("{}", state_line(event));
    }

    fn progress(&mut self, job: &JobView, _: &str) {
        let last = job.step >= job.max_steps;
        if !last && self.last_progress.is_some_and(|at| at.elapsed() < Plain::PROGRESS_EVERY) {
            return;
        }
        self.last_progress = Some(Instant::now());
        let figures = figures(job.progress.as_ref(), job.heldout, Detail::Brief);
        let figures = if figures.is_empty() { String::new() } else { format!(" · {figures}") };
        println!("{} step {}/{}{figures}", clock(&job.updated_at), job.step, job.max_steps);
    }
}

// ---------------------------------------------------------------------------------------------
// plugins, verify

fn plugins(api: &Api, json: bool) -> anyhow::Result<()> {
    let list: PluginList = api.get(&["v1", "plugins"], &[])?;
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
    print!("{}", format_table(header, rows));
}

/// Columns padded to their widest cell, two spaces apart; the last one unpadded.
fn format_table<const N: usize>(header: [&str; N], rows: &[[String; N]]) -> String {
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
        format!("{}\n", text.trim_end())
    };
    let mut table = line(header);
    for row in rows {
        table.push_str(&line(std::array::from_fn(|index| row[index].as_str())));
    }
    table
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
    let dirs = rlvr_plugin_host::dirs::plugin_dirs(config_path.as_deref(), extra_dirs)
        .map_err(|error| BadInput(error.to_string()))?;
    // Content-addressed copies live only as long as this process; the libraries stay mapped.
    let cache =
        tempfile::Builder::new().prefix("rlvrctl-plugins-").tempdir().context("cannot create a temp dir")?;
    let registry = Registry::new(cache.path().to_owned(), Isolation::InProcess, PluginMetrics::unexported())?;
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

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use rlvr_protocol::job::FieldProblem;

    use super::*;

    // --- server-sent events

    /// Feeds `stream` line by line; expects `expected` as `(event, data)` and the last id.
    fn check_sse(stream: &str, expected: &[(&str, &str)], last_id: Option<&str>) {
        let mut parser = SseParser::default();
        let events: Vec<SseEvent> =
            stream.split('\n').filter_map(|line| parser.line(line.trim_end_matches('\r'))).collect();
        let events: Vec<(&str, &str)> = events.iter().map(|e| (e.event.as_str(), e.data.as_str())).collect();
        assert_eq!(events, expected, "stream {stream:?}");
        assert_eq!(parser.last_id.as_deref(), last_id, "stream {stream:?}");
    }

    #[test]
    fn sse_events_fields_and_comments() {
        // What axum sends: event, id, data, blank line; keep-alives are comments.
        check_sse(
            "event: state\nid: 17-0\ndata: {\"a\":1}\n\n:\n: keep-alive\nevent: progress\ndata: {}\n\n",
            &[("state", "{\"a\":1}"), ("progress", "{}")],
            Some("17-0"),
        );
        // Several data lines join with \n; no space after the colon; CRLF endings.
        check_sse("data:one\r\ndata: two\r\n\r\n", &[("message", "one\ntwo")], None);
        // Only one leading space is dropped; a field without a colon has an empty value.
        check_sse("data:  x\ndata\n\n", &[("message", " x\n")], None);
        // No data: nothing dispatched, but the id still counts; unknown fields and retry ignored.
        check_sse("id: 5-1\nretry: 100\nfoo: bar\n\n", &[], Some("5-1"));
        // An event is complete only at its blank line.
        check_sse("event: state\ndata: {}", &[], None);
        // An id with NUL is ignored.
        check_sse("id: a\0b\ndata: x\n\n", &[("message", "x")], None);
    }

    #[test]
    fn sse_reconnect_forgets_the_half_event_and_resumes_after_the_last_complete_one() {
        let mut parser = SseParser::default();
        for line in ["event: state", "id: 1-0", "data: {}", ""] {
            parser.line(line);
        }
        // The connection drops in the middle of the next event, after its id line.
        for line in ["event: state", "id: 2-0", "data: {\"half"] {
            assert_eq!(parser.line(line), None);
        }
        parser.reconnect();
        assert_eq!(parser.last_id.as_deref(), Some("1-0"), "event 2-0 never arrived whole");
        // The new connection's first event is not polluted by the half one.
        assert_eq!(parser.line("data: {}"), None);
        assert_eq!(parser.line(""), Some(SseEvent { event: "message".to_owned(), data: "{}".to_owned() }));
        assert_eq!(parser.last_id.as_deref(), Some("1-0"));
    }

    #[test]
    fn updates_parse_from_the_daemons_event_data() {
        let state = SseEvent {
            event: "state".to_owned(),
            data: r#"{"id":"1-0","at":"2026-11-21T12:00:01.000Z","state":"running","reason":"worker pid 123 started","step":0}"#.to_owned(),
        };
        let Ok(Some(Update::State(event))) = parse_update(&state) else { panic!("a state event") };
        assert_eq!(state_line(&event), "12:00:01 running — worker pid 123 started");
        assert_eq!(end_line("J", &event), "job J running: worker pid 123 started");
        let cancelled =
            JobEvent { state: JobState::Cancelled, reason: "cancelled: by team a".to_owned(), ..event };
        assert_eq!(end_line("J", &cancelled), "job J: cancelled: by team a");
        let bad = SseEvent { event: "state".to_owned(), data: "{}".to_owned() };
        assert!(parse_update(&bad).unwrap_err().starts_with("a state event: missing field"));
        let other = SseEvent { event: "hello".to_owned(), data: "{}".to_owned() };
        assert!(matches!(parse_update(&other), Ok(None)));
    }

    // --- spec paths

    fn check_paths(format: SpecFormat, spec: &str, expected: &str) {
        let prepared =
            prepare_spec(spec, format, Path::new("/jobs/team-a"), Some(Path::new("/home/me"))).unwrap();
        match format {
            SpecFormat::Toml => {
                let got: toml::Table = prepared.parse().unwrap();
                let want: toml::Table = expected.parse().unwrap();
                assert_eq!(got, want, "sent:\n{prepared}");
            }
            SpecFormat::Json => {
                let got: Value = serde_json::from_str(&prepared).unwrap();
                let want: Value = serde_json::from_str(expected).unwrap();
                assert_eq!(got, want);
            }
        }
    }

    #[test]
    fn relative_paths_become_absolute_against_the_spec_files_directory() {
        check_paths(
            SpecFormat::Toml,
            r#"
            [job]
            name = "x"
            [model]
            policy = "models/base"
            reference = "./ref"
            [data]
            train = "data/train.jsonl"
            heldout = "../shared/heldout.jsonl"
            canaries = "/abs/canaries.jsonl"
            [publish]
            registry = "~/registry"
            webhook = "relative/not/a/path"
            [[verifiers]]
            plugin = "math"
            "#,
            r#"
            [job]
            name = "x"
            [model]
            policy = "/jobs/team-a/models/base"
            reference = "/jobs/team-a/ref"
            [data]
            train = "/jobs/team-a/data/train.jsonl"
            heldout = "/jobs/team-a/../shared/heldout.jsonl"
            canaries = "/abs/canaries.jsonl"
            [publish]
            registry = "/home/me/registry"
            webhook = "relative/not/a/path"
            [[verifiers]]
            plugin = "math"
            "#,
        );
    }

    #[test]
    fn builtin_models_same_urls_and_wrong_types_are_left_for_the_daemon() {
        let untouched = r#"
            [model]
            policy = "builtin:tiny-arith"
            reference = "same"
            [data]
            train = 5
            heldout = ""
            [publish]
            registry = "s3://bucket/models"
        "#;
        check_paths(SpecFormat::Toml, untouched, untouched);
        // `same` and `builtin:` mean something only under [model].
        check_paths(SpecFormat::Toml, "[data]\ntrain = \"same\"", "[data]\ntrain = \"/jobs/team-a/same\"");
    }

    #[test]
    fn json_specs_are_resolved_and_sent_as_json() {
        check_paths(
            SpecFormat::Json,
            r#"{"model": {"policy": "m", "reference": "same"}, "data": {"train": "t.jsonl"}, "budget": {"max_steps": 3}}"#,
            r#"{"model": {"policy": "/jobs/team-a/m", "reference": "same"}, "data": {"train": "/jobs/team-a/t.jsonl"}, "budget": {"max_steps": 3}}"#,
        );
    }

    #[test]
    fn a_spec_that_does_not_parse_names_the_line() {
        let error =
            prepare_spec("[job]\nname = \"x\"\nname = \"y\"\n", SpecFormat::Toml, Path::new("/"), None)
                .unwrap_err();
        assert!(error.starts_with("not valid TOML (line 3): "), "{error}");
        let error = prepare_spec("{", SpecFormat::Json, Path::new("/"), None).unwrap_err();
        assert!(error.starts_with("not valid JSON: "), "{error}");
    }

    #[test]
    fn home_is_left_alone_without_a_home() {
        assert_eq!(absolute_path("data", "~/x", Path::new("/b"), None), Ok(None));
        assert_eq!(
            absolute_path("data", "~", Path::new("/b"), Some(Path::new("/h"))),
            Ok(Some("/h".to_owned()))
        );
    }

    // --- settings

    /// Resolves with these flags, environment and config file (at the path it would be read).
    fn settings(
        flags: (Option<&str>, Option<&str>),
        env: &[(&str, &str)],
        file: Option<&str>,
        need_token: bool,
    ) -> anyhow::Result<Settings> {
        let env: HashMap<String, String> =
            env.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect();
        let lookup = move |key: &str| env.get(key).cloned();
        let sources = Sources {
            flag_server: flags.0.map(str::to_owned),
            flag_token: flags.1.map(str::to_owned),
            env: &lookup,
        };
        resolve_settings(&sources, need_token, |_| Ok(file.map(str::to_owned)))
    }

    fn check_settings(settings: anyhow::Result<Settings>, server: &str, token: Option<(&str, &str)>) {
        let settings = settings.unwrap();
        assert_eq!(settings.server.as_str(), server);
        assert_eq!(settings.token.as_ref().map(|t| (t.secret.as_str(), t.from.as_str())), token);
    }

    const HOME: (&str, &str) = ("HOME", "/home/me");
    const FILE: &str = "server = \"http://file:1/\"\ntoken = \"file-token\"\n";

    #[test]
    fn flag_beats_env_beats_file_beats_default() {
        let env = [HOME, ("RLVR_SERVER", "http://env:1"), ("RLVR_TOKEN", "env-token")];
        check_settings(
            settings((Some("http://flag:1"), Some("flag-token")), &env, Some(FILE), true),
            "http://flag:1/",
            Some(("flag-token", "--token")),
        );
        check_settings(
            settings((None, None), &env, Some(FILE), true),
            "http://env:1/",
            Some(("env-token", "RLVR_TOKEN")),
        );
        check_settings(
            settings((None, None), &[HOME], Some(FILE), true),
            "http://file:1/",
            Some(("file-token", "/home/me/.config/rlvr/cli.toml")),
        );
        check_settings(settings((None, None), &[HOME], None, true), "http://127.0.0.1:8470/", None);
        // Per setting: the server from a flag, the token from the file.
        check_settings(
            settings((Some("http://flag:1"), None), &[HOME], Some(FILE), true),
            "http://flag:1/",
            Some(("file-token", "/home/me/.config/rlvr/cli.toml")),
        );
        // An empty variable or flag is none.
        check_settings(
            settings(
                (Some(""), Some("")),
                &[HOME, ("RLVR_SERVER", ""), ("RLVR_TOKEN", "")],
                Some(FILE),
                true,
            ),
            "http://file:1/",
            Some(("file-token", "/home/me/.config/rlvr/cli.toml")),
        );
        // No token wanted (plugins): none is read, not even from the file.
        check_settings(settings((None, None), &env, Some(FILE), false), "http://env:1/", None);
    }

    #[test]
    fn the_file_lives_under_xdg_config_home_when_it_is_set_and_absolute() {
        let path = |env: &[(&str, &str)]| {
            let env: HashMap<&str, &str> = env.iter().copied().collect();
            let lookup = move |key: &str| env.get(key).map(|v| (*v).to_owned());
            config_path(&Sources { flag_server: None, flag_token: None, env: &lookup })
        };
        assert_eq!(path(&[HOME]), Some(PathBuf::from("/home/me/.config/rlvr/cli.toml")));
        assert_eq!(path(&[HOME, ("XDG_CONFIG_HOME", "/xdg")]), Some(PathBuf::from("/xdg/rlvr/cli.toml")));
        assert_eq!(
            path(&[HOME, ("XDG_CONFIG_HOME", "rel")]),
            Some(PathBuf::from("/home/me/.config/rlvr/cli.toml"))
        );
        assert_eq!(path(&[]), None);
        let settings =
            settings((None, None), &[HOME, ("XDG_CONFIG_HOME", "/xdg")], Some(FILE), true).unwrap();
        assert_eq!(settings.token.unwrap().from, "/xdg/rlvr/cli.toml");
    }

    #[test]
    fn a_broken_file_is_named_with_its_key_and_never_quoted() {
        let error = |file: &str| settings((None, None), &[HOME], Some(file), true).unwrap_err().to_string();
        assert_eq!(
            error("token = 5\n"),
            "/home/me/.config/rlvr/cli.toml: `token`: expected a string, got integer"
        );
        assert_eq!(
            error("server = \"http://x\"\ntokn = \"s3cret\"\n"),
            "/home/me/.config/rlvr/cli.toml: unknown key `tokn` (expected `server` or `token`)"
        );
        let syntax = error("server = \"http://x\"\ntoken = \"s3cret\n");
        assert!(syntax.starts_with("/home/me/.config/rlvr/cli.toml: not valid TOML (line 2): "), "{syntax}");
        assert!(!syntax.contains("s3cret"), "the token leaked: {syntax}");
        assert_eq!(
            error("server = \"localhost:8470\"\n"),
            "server \"localhost:8470\" (from /home/me/.config/rlvr/cli.toml): expected an http:// or https:// URL"
        );
        // A broken file is not read when flags and environment say everything.
        check_settings(
            settings((Some("http://flag:1"), None), &[HOME, ("RLVR_TOKEN", "t")], Some("{{{"), true),
            "http://flag:1/",
            Some(("t", "RLVR_TOKEN")),
        );
    }

    #[test]
    fn tokens_keys_and_urls_that_cannot_go_into_a_request_are_refused_up_front() {
        let error = |flags, env: &[(&str, &str)]| settings(flags, env, None, true).unwrap_err().to_string();
        let refused = error((None, None), &[HOME, ("RLVR_TOKEN", "s3cret\n")]);
        assert_eq!(
            refused,
            "the token from RLVR_TOKEN: expected visible ASCII characters only (no spaces, line breaks or other text)"
        );
        assert!(error((None, Some("a b")), &[HOME]).starts_with("the token from --token: "));
        let with_password = error((Some("http://me:s3cret@h:1"), Some("t")), &[HOME]);
        assert!(
            with_password.starts_with("server (from --server): expected a URL without a user or password")
        );
        assert!(!with_password.contains("s3cret"), "{with_password}");
        assert_eq!(parse_idempotency_key("retry-1"), Ok("retry-1".to_owned()));
        for bad in ["", "with space", "ü", &"k".repeat(201)] {
            assert!(parse_idempotency_key(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn a_token_is_never_in_debug_output() {
        let token = Token { secret: "s3cret".to_owned(), from: "RLVR_TOKEN".to_owned() };
        assert_eq!(format!("{token:?}"), "Token(from RLVR_TOKEN)");
    }

    #[test]
    fn urls_encode_ids_and_keep_a_path_prefix() {
        let server = |server: &str| Url::parse(server).unwrap();
        let url = api_url(&server("http://h:1"), &["v1", "jobs", "a/b?c"], &[]);
        assert_eq!(url.as_str(), "http://h:1/v1/jobs/a%2Fb%3Fc");
        let query = [("team", "a b".to_owned()), ("limit", "5".to_owned())];
        let url = api_url(&server("https://h/rlvr/"), &["v1", "jobs"], &query);
        assert_eq!(url.as_str(), "https://h/rlvr/v1/jobs?team=a+b&limit=5");
    }

    // --- errors and output

    #[test]
    fn api_errors_read_like_the_spec_they_refuse() {
        let error = |field: Option<&str>, message: &str, more: Vec<FieldProblem>| ApiError {
            code: "invalid_spec".to_owned(),
            message: message.to_owned(),
            field: field.map(str::to_owned),
            more,
        };
        let text =
            api_error_text(&error(Some("rollout.top_p"), "expected a number in (0, 1], got 2", vec![]));
        assert_eq!(text, "invalid_spec: rollout.top_p: expected a number in (0, 1], got 2");
        // The daemon's spec messages name their field already.
        let text = api_error_text(&error(Some("rollout.top_p"), "rollout.top_p: expected a number", vec![]));
        assert_eq!(text, "invalid_spec: rollout.top_p: expected a number");
        let more = vec![FieldProblem {
            field: "budget.max_steps".to_owned(),
            message: "must be at least 1".to_owned(),
        }];
        let text = api_error_text(&error(None, "not a spec", more));
        assert_eq!(text, "invalid_spec: not a spec\n  budget.max_steps: must be at least 1");
    }

    #[test]
    fn exit_codes_follow_the_kind_of_failure() {
        let status = |status: u16| HttpError::Status {
            status: StatusCode::from_u16(status).unwrap(),
            error: Box::new(ApiError {
                code: "x".to_owned(),
                message: "y".to_owned(),
                field: None,
                more: Vec::new(),
            }),
            hint: None,
            retry_after: None,
        };
        let code = |error: anyhow::Error| exit_code(&error);
        assert_eq!(code(status(422).into()), EXIT_REFUSED);
        assert_eq!(code(status(409).into()), EXIT_REFUSED);
        assert_eq!(code(status(503).into()), EXIT_UNREACHABLE);
        assert_eq!(
            code(HttpError::Unreachable { url: String::new(), detail: String::new() }.into()),
            EXIT_UNREACHABLE
        );
        assert_eq!(code(anyhow::Error::new(BadInput("x".to_owned())).context("reading")), EXIT_REFUSED);
        assert_eq!(code(anyhow::anyhow!("plugin not found")), EXIT_ENDED);
        assert!(status(429).is_transient() && status(502).is_transient() && !status(404).is_transient());
        let refused = HttpError::Unreachable {
            url: "http://h/".to_owned(),
            detail: "client error (Connect): tcp connect error: Connection refused (os error 111)".to_owned(),
        };
        assert_eq!([refused.short(), status(503).short()], ["Connection refused (os error 111)", "503 x"]);
    }

    #[test]
    fn figures_show_what_is_known() {
        let progress = serde_json::json!({
            "step": 12, "max_steps": 100, "reward": 0.625, "loss": 0.1234, "kl": 0.01234,
            "heldout": null, "tokens_per_s": 1234.4, "step_s": 2.1, "eta_s": 192.0
        });
        assert_eq!(
            figures(Some(&progress), Some(0.81), Detail::Brief),
            "reward 0.625 · held-out 0.810 · KL 0.0123 · 1234 tok/s · ETA 3m 12s"
        );
        assert_eq!(
            figures(Some(&progress), None, Detail::Full),
            "reward 0.625 · loss 0.1234 · KL 0.0123 · 1234 tok/s · 2.10 s/step · ETA 3m 12s"
        );
        assert_eq!(figures(None, None, Detail::Full), "");
        assert_eq!(
            [duration_text(45.4), duration_text(60.0), duration_text(7500.0)],
            ["45s", "1m 00s", "2h 05m"]
        );
    }

    fn job() -> JobView {
        JobView {
            id: "01JDX".to_owned(),
            team: "math".to_owned(),
            name: "arith".to_owned(),
            model_line: "tiny".to_owned(),
            priority: "normal".to_owned(),
            state: JobState::Refused,
            step: 100,
            max_steps: 100,
            reason: "gate heldout_min: 0.41 < 0.5".to_owned(),
            created_at: "2026-11-21T06:00:00.000Z".to_owned(),
            updated_at: "2026-11-21T06:03:00.123Z".to_owned(),
            crashes: 0,
            cancel_requested: false,
            devices: vec!["cpu:0".to_owned()],
            preemptions: 0,
            grant: None,
            progress: None,
            heldout: Some(0.41),
            result: Some(serde_json::json!({"steps": 100, "checkpoint": "/s/ckpt"})),
            gates: None,
            published: None,
            webhook: None,
            curriculum_version: None,
        }
    }

    #[test]
    fn status_and_list_output() {
        assert_eq!(
            status_block(&job()),
            "job       01JDX\n\
             name      arith (team math, normal priority, model line tiny)\n\
             state     refused\n\
             reason    gate heldout_min: 0.41 < 0.5\n\
             step      100/100\n\
             progress  held-out 0.410\n\
             result    checkpoint: /s/ckpt\n\
             \x20         steps: 100\n\
             created   2026-11-21T06:00:00.000Z\n\
             updated   2026-11-21T06:03:00.123Z\n"
        );
        let mut long = job();
        long.reason = "x".repeat(60);
        let rows = list_rows(&[long]);
        assert_eq!(rows[0][4], "100/100");
        assert_eq!(rows[0][5..8], ["-", "-", "0"], "an ended job holds no devices");
        assert_eq!(rows[0][8], "2026-11-21 06:03:00");
        assert_eq!(rows[0][9], format!("{}…", "x".repeat(49)));
        let mut running = job();
        running.state = JobState::Running;
        running.grant = Some("waiting for update (0.4 s)".to_owned());
        running.preemptions = 2;
        assert_eq!(list_rows(std::slice::from_ref(&running))[0][5..8], ["cpu:0", "waiting", "2"]);
        let block = status_block(&running);
        assert!(
            block.contains("devices   cpu:0\ngrant     waiting for update (0.4 s)\npreempted 2 time(s)\n"),
            "{block}"
        );
        let mut cancelling = job();
        cancelling.state = JobState::Running;
        cancelling.cancel_requested = true;
        assert_eq!(
            cancel_line(&cancelling),
            "cancel requested for job 01JDX (running): its worker stops within a step"
        );
    }

    #[test]
    fn backoff_doubles_to_a_cap_and_resets() {
        let mut backoff = Backoff::new();
        let waits: Vec<u64> = (0..7).map(|_| backoff.next().as_millis() as u64).collect();
        assert_eq!(waits, [500, 1000, 2000, 4000, 8000, 10_000, 10_000]);
        backoff.reset();
        assert_eq!(backoff.next(), Duration::from_millis(500));
    }
}
