//! The config's field table: every key once, with its kind (which carries its range and its
//! default) and its doc.
//!
//! Everything else about a key is read from here: the validator (`check.rs`) takes the known keys,
//! ranges and "expected …" texts; the built-in defaults layer and so `Config::default()` take the
//! defaults; the documented example `configs/rlvrd.toml` (`example.rs`) takes all of it. The serde
//! structs in `mod.rs` only name the fields for the rest of the daemon, and a test checks that
//! they agree with the table.

use figment::value::{Dict, Value};
use rlvr_plugin_host::dirs::DEFAULT_PLUGIN_DIR;

use super::check::{float_of, integer_of};

/// A `[section]`: the sections in the order messages list them and the example shows them.
pub(super) struct Section {
    pub name: &'static str,
    /// What the section is for, under its header in the example; empty for nothing.
    pub doc: &'static str,
}

/// One key.
pub(super) struct Field {
    /// `section.key`; in the fields of a [`Kind::Tables`] entry, just the key.
    pub path: &'static str,
    pub kind: Kind,
    /// What the key means, for the example; its range and default are not repeated here (the kind
    /// has them).
    pub doc: &'static str,
    pub example: Example,
}

/// How the example file shows a key.
pub(super) enum Example {
    /// `key = <default>`.
    Default,
    /// These TOML lines, commented out: the key is not set by default, this is how one sets it.
    Commented(&'static str),
}

/// What a key may hold. Each variant carries the key's default where it has one; `None` means
/// not set (the serde field is an `Option`). In a [`Kind::Tables`] entry, a key without a
/// default is required.
pub(super) enum Kind {
    /// An absolute path.
    AbsolutePath(Option<&'static str>),
    /// A url starting with one of `schemes`, something after it and no whitespace.
    Url {
        schemes: &'static [&'static str],
        default: &'static str,
    },
    /// `IP:PORT`: a host name is not resolved.
    SocketAddr(&'static str),
    Integer(Integers),
    Number(Positive),
    /// A list of non-empty paths, relative or absolute; they need not exist.
    Dirs(&'static [&'static str]),
    /// A list of strings, each `item` (for messages: "a host, host:port, …") and passing `check`,
    /// whose error says why one does not (empty: nothing more to say). `default` when not set
    /// (`None`: empty, or required in a [`Kind::Tables`] entry).
    Strings {
        item: &'static str,
        check: fn(&str) -> Result<(), String>,
        default: Option<&'static [&'static str]>,
    },
    TeamName,
    /// The hex sha256 of a secret: never quoted back.
    Sha256,
    Bool(bool),
    /// `[[path]]`: a list of tables with these `fields`; no two entries share `unique`'s key, and
    /// each sets exactly one of the keys in `one_of` (when not empty). None by default.
    Tables {
        fields: &'static [Field],
        unique: Unique,
        one_of: &'static [&'static str],
    },
    /// A name of something the operator declares (a secret, a base model, a data root): see
    /// [`rlvr_protocol::names::NAME_RULE`].
    Name,
    /// The name of an environment variable of the daemon's: uppercase letters, digits and `_`.
    EnvName,
    /// A GPU's `GPU-…` or a MIG instance's `MIG-…` UUID, or a prefix of one: letters, digits, `-`.
    GpuUuid,
    /// An entry's key that may be left out (its serde field is an `Option`): `kind` when set.
    Optional(&'static Kind),
    /// `[path]`: team name → a [`SHARE`] of the capacity, summing to at most 1. None by default.
    Shares,
}

/// An integer from `min` to `max`.
pub(super) struct Integers {
    pub min: u64,
    /// `None`: as large as the field's type allows, which is `u32` for every such key.
    pub max: Option<u64>,
    /// Said after the range: `(milliseconds)`.
    pub unit: Option<&'static str>,
    pub default: Option<u64>,
}

/// A finite number greater than 0 and at most `max`.
pub(super) struct Positive {
    /// The noun with its article: "a number of gigabytes".
    pub what: &'static str,
    pub max: Option<f64>,
    pub default: Option<f64>,
}

/// The key no two entries of a [`Kind::Tables`] may share, and what is said when two do:
/// `{first}` stands for the earlier entry's path, `{value}` for the value (never for a secret's).
pub(super) struct Unique {
    pub key: &'static str,
    pub message: &'static str,
}

/// What a team name is, for messages: `[[auth.tokens]]` teams and `[scheduler.shares]` keys alike.
pub(super) const TEAM_NAME: &str = rlvr_protocol::names::TEAM_RULE;
/// What an environment variable name is, for messages.
pub(super) const ENV_NAME: &str = "an environment variable name of uppercase letters, digits and '_'";
/// What a GPU's UUID is, for messages.
const GPU_UUID: &str = "a GPU-… or MIG-… UUID as nvidia-smi -L prints it, or a prefix of one";
/// What a sha256 is, for messages and the example.
const SHA256: &str =
    "the hex sha256 of the token (64 lowercase hex characters: printf %s \"$TOKEN\" | sha256sum)";
/// Each value of `[scheduler.shares]`.
pub(super) const SHARE: Positive =
    Positive { what: "a fraction of the capacity", max: Some(1.0), default: None };
const GIGABYTES: Positive = Positive { what: "a number of gigabytes", max: None, default: None };
const MS: Option<&str> = Some("milliseconds");
const SECONDS: Option<&str> = Some("seconds");
const DAYS: Option<&str> = Some("days");

pub(super) const SECTIONS: [Section; 13] = [
    Section { name: "daemon", doc: "" },
    Section { name: "redis", doc: "" },
    Section { name: "api", doc: "" },
    Section { name: "plugins", doc: "" },
    Section { name: "auth", doc: "" },
    Section {
        name: "tenancy",
        doc: "What each team may name in a job spec, and how much it may ask for (SECURITY.md). A spec \
              names datasets, model lines and curricula inside its team's namespace, and the base \
              models, data roots and secrets declared here that are granted to its team; never a \
              server path or an environment variable.",
    },
    Section {
        name: "outbound",
        doc: "Where outbound requests (a job's [publish] webhook, its graders' and judges' urls, its [env] \
              server) may go. Only http and https, never a redirect, never through a proxy; each \
              destination is checked when the job is submitted and each address its host resolves to \
              again when the request is made.",
    },
    Section {
        name: "devices",
        doc: "The devices the scheduler packs jobs onto: [[devices.gpus]] when set, else cpu_slots when \
              set, else the GPUs NVML reports, else one CPU slot. When the daemon's CUDA_VISIBLE_DEVICES \
              is set, only the GPUs it leaves are used (GPU-… and MIG-… UUIDs; indexes only under \
              CUDA_DEVICE_ORDER=PCI_BUS_ID or naming every GPU; empty or -1: none). A GPU in MIG mode is \
              used as its MIG instances, one in compute mode Prohibited not at all, one in \
              ExclusiveProcess by one job at a time. A worker is given its GPU by UUID. rlvrd logs the \
              devices at start, with a note for each one it skipped.",
    },
    Section { name: "queue", doc: "How the daemon takes jobs off Redis and looks after their workers." },
    Section { name: "scheduler", doc: "How jobs share the devices (design.md §7)." },
    Section {
        name: "graders",
        doc: "Caps on what a grader's own options may ask of this host (a python or code grader's \
              sandbox: memory, file size, processes; items at once; an http or judge grader's answer \
              size), in the daemon's dry-runs and in \
              jobs' workers. A grader asking for more is refused at the key (422 in a dry-run; a job \
              fails at start naming it); parallelism is lowered to the cap.",
    },
    Section {
        name: "engines",
        doc: "Existing distributed engines a job may train on ([engine] in its spec) instead of the \
              native worker. rlvr keeps the queue, the graders, the gates and publishing.",
    },
    Section {
        name: "tinker",
        doc: "The Tinker SDK's training clients (a team's own loop, under /api/v1 with a tml- key from \
              rlvrd token new --tinker): each is a process the scheduler admits like a job of its team, \
              holding the base model and the client's LoRA adapter.",
    },
];

/// Shorthand for the table's rows that show their default.
const fn field(path: &'static str, kind: Kind, doc: &'static str) -> Field {
    Field { path, kind, doc, example: Example::Default }
}

const fn integer(min: u64, max: u64, unit: Option<&'static str>, default: u64) -> Kind {
    Kind::Integer(Integers { min, max: Some(max), unit, default: Some(default) })
}

/// Every key, by section in [`SECTIONS`] order; within a section, in the order messages list them.
pub(super) const FIELDS: &[Field] = &[
    field(
        "daemon.state_dir",
        Kind::AbsolutePath(Some("/var/lib/rlvr")),
        "Where the daemon keeps job state, checkpoints and its copies of loaded plugins.",
    ),
    Field {
        path: "daemon.worker_exe",
        kind: Kind::AbsolutePath(None),
        doc: "The worker executable, which runs each job and probes plugins. Not set: rlvr-worker next \
              to rlvrd.",
        example: Example::Commented("worker_exe = \"/usr/local/bin/rlvr-worker\""),
    },
    Field {
        path: "daemon.registry",
        kind: Kind::AbsolutePath(None),
        doc: "Where gated checkpoints are published, one directory per model line. Set by the operator \
              only: a job spec cannot name a registry. Not set: STATE_DIR/registry.",
        example: Example::Commented("registry = \"/srv/rlvr/registry\""),
    },
    field(
        "redis.url",
        Kind::Url { schemes: &["redis://", "rediss://", "unix://"], default: "redis://127.0.0.1:6379" },
        "The Redis that holds the job queues: rediss:// is TLS, unix:///PATH/TO/redis.sock a socket.",
    ),
    field(
        "api.listen",
        Kind::SocketAddr("127.0.0.1:8470"),
        "Address of the HTTP API; a host name is not accepted.",
    ),
    field(
        "api.max_body_bytes",
        integer(1024, 64 << 20, Some("bytes"), 1 << 20),
        "Largest request body accepted; larger ones get 413.",
    ),
    field(
        "api.rate_limit_per_minute",
        integer(1, 1_000_000, None, 600),
        "Requests per minute each team may make to the API (every route but /healthz and /metrics); \
         more get 429 with Retry-After. A team may spend a whole minute's allowance at once.",
    ),
    field(
        "api.auth_failures_per_minute",
        integer(1, 10_000, None, 10),
        "Requests with a missing, malformed or unknown token each client address (an IPv6 /64) may \
         make per minute, all at once at most; more get 429 with Retry-After instead of 401. A \
         valid token is never held back by this, so one client cannot lock another out.",
    ),
    field(
        "api.max_connections",
        integer(16, 1_000_000, None, 512),
        "Open API connections at most, event streams included. At the limit a new connection closes \
         the one idle (or sending its request head) longest; when every one is busy, new ones wait \
         in the listen backlog. rlvrd raises its soft open-file limit to the hard one at start and \
         refuses to start when this plus 256 (Redis, workers, plugins, files) does not fit under it: \
         see LimitNOFILE= in systemd/rlvrd.service.",
    ),
    field(
        "api.header_timeout_s",
        integer(1, 300, SECONDS, 10),
        "From a request's first byte to the end of its head (request line and headers); a slower \
         client is disconnected. A head is at most a few kilobytes.",
    ),
    field(
        "api.body_timeout_s",
        integer(1, 3600, SECONDS, 30),
        "From the end of a request's head to the end of its body; a slower body gets 408 and the \
         connection closes. 30 s moves the default max_body_bytes at 35 kB/s; raise it with \
         max_body_bytes for slow links.",
    ),
    field(
        "api.idle_timeout_s",
        integer(1, 3600, SECONDS, 60),
        "How long a connection may wait for its next request (keep-alive) before it is closed. A \
         request in flight, such as an event stream, is never idle.",
    ),
    field(
        "api.dry_runs_at_once",
        integer(1, 1024, None, 2),
        "Graders' dry-runs (POST /v1/verify with a team's token) and environment checks (POST \
         /v1/env/check, each a worker process on the CPU) running at once over the daemon; more \
         get 429 with Retry-After. Grading runs in the daemon's process, four items at a time \
         per grader. An engine job's ranks grade their completions in a lane of their own (one \
         request per rank), which no dry-run takes.",
    ),
    field(
        "api.dry_runs_per_team",
        integer(1, 1024, None, 1),
        "Graders' dry-runs and environment checks one team may have running at once; more get 429, \
         so one team's dry-runs never take every place of dry_runs_at_once.",
    ),
    field(
        "api.dry_run_budget_s",
        integer(1, 86_400, SECONDS, 300),
        "The longest one team's dry-run (POST /v1/verify) grades: items not started by then are \
         answered as not graded (error set), and calls already running end at the grader's own \
         deadline (30 s). A request whose client goes away stops the same way at once; its place \
         is given back only when its last call has ended. An engine job's ranks grading their \
         completions have no budget. An environment check (POST /v1/env/check) is killed at it.",
    ),
    field(
        "api.streams_per_team",
        integer(1, 1_000_000, None, 32),
        "Event streams (GET /v1/jobs/ID/events) one team may have open at once; more get 429. Over \
         all teams, streams take at most half of max_connections: the other half is kept for plain \
         requests and /healthz.",
    ),
    field(
        "api.requests_per_team",
        integer(1, 1_000_000, None, 64),
        "Requests one team may have open at once, from the end of a request's head to the last byte \
         of its answer (event streams and downloads included); more get 429. A connection has no \
         team until its request is read: max_connections bounds connections over all teams.",
    ),
    Field {
        path: "api.docs_dir",
        kind: Kind::AbsolutePath(None),
        doc: "The built book (docs/, built by mdBook: the directory holding its index.html), served \
              open at /docs so that teams read the docs of the version the daemon runs. Set: it must \
              hold index.html, or rlvrd does not start. Not set: book/ in the directory above \
              rlvrd's own (target/book for a build tree's target/release/rlvrd, where \
              scripts/test.sh builds it) when it holds index.html; else /docs answers 404.",
        example: Example::Commented("docs_dir = \"/usr/local/share/doc/rlvr/book\""),
    },
    field(
        "plugins.dirs",
        Kind::Dirs(&[DEFAULT_PLUGIN_DIR]),
        "Directories watched for plugin libraries (*.so). A directory that does not exist is not an \
         error: the registry warns when it scans.",
    ),
    field(
        "plugins.scan_interval_ms",
        integer(100, 60_000, MS, 1000),
        "How often those directories are scanned for new plugins.",
    ),
    Field {
        path: "plugins.cache_dir",
        kind: Kind::AbsolutePath(None),
        doc: "Where the daemon keeps its content-addressed copies of the plugin libraries it loaded, \
              and what probing each one in a worker process reported (by the library's sha256 and \
              the worker's build), so that a restart probes only new libraries. Daemons may share \
              one: every file in it is written under a temporary name and renamed. Under systemd, \
              a directory outside the state directory needs a ReadWritePaths= line. Not set: \
              STATE_DIR/plugin-cache.",
        example: Example::Commented("cache_dir = \"/var/cache/rlvr/plugins\""),
    },
    Field {
        path: "auth.tokens",
        kind: Kind::Tables {
            fields: TOKEN_FIELDS,
            unique: Unique {
                key: "sha256",
                message: "same sha256 as {first}, every token must be different",
            },
            one_of: &[],
        },
        doc: "Bearer tokens, one [[auth.tokens]] entry per token; with none, no one can submit jobs. The \
              token itself never goes in this file, only its sha256. Give each team its own token; a \
              team may have several (to rotate them). `rlvrd token new --team NAME [--admin]` makes a \
              token and prints the entry to paste here.",
        // No working token in an example: a copied example must not let anyone in.
        example: Example::Commented(
            "[[auth.tokens]]
team = \"research\"
sha256 = \"0000000000000000000000000000000000000000000000000000000000000000\"
admin = false",
        ),
    },
    field(
        "tenancy.max_dataset_bytes",
        Kind::Integer(Integers {
            min: 1024,
            max: Some(1 << 36),
            unit: Some("bytes"),
            default: Some(256 << 20),
        }),
        "Largest dataset a team may upload (PUT /v1/datasets/NAME); larger ones get 413.",
    ),
    field(
        "tenancy.max_datasets_per_team",
        integer(1, 100_000, None, 1000),
        "How many named datasets each team may keep.",
    ),
    field(
        "tenancy.dataset_grace_s",
        integer(1, 30 * 24 * 3600, Some("seconds"), 3600),
        "How long a dataset's content that no name points at is kept after its last upload or use \
         before a sweep deletes it. Content a queued or running job, a running pipeline or a \
         published version cites is kept regardless; a dry run's upload points no name, so its \
         content goes after this time. Sweeps run as often as this, at most 10 minutes apart.",
    ),
    field(
        "tenancy.max_queued_per_team",
        integer(1, 100_000, None, 100),
        "How many jobs a team may have waiting (queued or preempted) at once, unless its \
         [[tenancy.teams]] entry says otherwise; more get 429.",
    ),
    field(
        "tenancy.max_lines_per_team",
        integer(1, 1_000_000, None, 100),
        "How many model lines a team may own: a job publishing into a new line, or a PUT of one, past \
         it is refused (403). Line names are shared by every team on the daemon, so this bounds how \
         many one team can take. An admin may make lines for a team beyond it.",
    ),
    field(
        "tenancy.priorities",
        PRIORITIES.with_default(&["low", "normal"]),
        "The priorities a team may give its jobs, unless its [[tenancy.teams]] entry says otherwise. \
         A job of a higher priority may preempt a lower one's, so high is for teams given it.",
    ),
    Field {
        path: "tenancy.teams",
        kind: Kind::Tables {
            fields: TEAM_FIELDS,
            unique: Unique { key: "name", message: "team {value} is already listed at {first}" },
            one_of: &[],
        },
        doc: "Per-team allowances, one [[tenancy.teams]] entry per team that differs from the defaults \
              above. A team's guaranteed share of the devices is [scheduler.shares].",
        example: Example::Commented(
            "[[tenancy.teams]]\nname = \"research\"\npriorities = [\"low\", \"normal\", \"high\"]\nmax_queued = 20",
        ),
    },
    Field {
        path: "tenancy.base_models",
        kind: Kind::Tables {
            fields: BASE_MODEL_FIELDS,
            unique: Unique { key: "name", message: "base model {value} is already listed at {first}" },
            one_of: &[],
        },
        doc: "Base models a spec may start from as model.policy = \"base:NAME\": Hugging Face model \
              directories on this host.",
        example: Example::Commented(
            "[[tenancy.base_models]]\nname = \"smollm2-135m\"\npath = \"/srv/models/SmolLM2-135M-Instruct\"",
        ),
    },
    Field {
        path: "tenancy.data_roots",
        kind: Kind::Tables {
            fields: DATA_ROOT_FIELDS,
            unique: Unique { key: "name", message: "data root {value} is already listed at {first}" },
            one_of: &[],
        },
        doc: "Directories of JSONL files some teams may train on without uploading them: a spec names \
              a file in one as \"root:NAME/relative/path.jsonl\". Nothing outside the directory is \
              reachable through it (no '..', symbolic links are resolved and must stay inside).",
        example: Example::Commented(
            "[[tenancy.data_roots]]\nname = \"research-data\"\npath = \"/srv/data/research\"\nteams = [\"research\"]",
        ),
    },
    Field {
        path: "tenancy.secrets",
        kind: Kind::Tables {
            fields: SECRET_FIELDS,
            unique: Unique { key: "name", message: "secret {value} is already listed at {first}" },
            one_of: &["env", "file"],
        },
        doc: "Secrets plugins may use on behalf of the teams granted them, named in plugin options by \
              name (e.g. the http verifier's bearer_token_secret). The value comes from the daemon's \
              environment variable env or from file; it is handed to the job's worker only, never \
              written to the job's directory or echoed.",
        example: Example::Commented(
            "[[tenancy.secrets]]\nname = \"grader-token\"\nteams = [\"research\"]\nenv = \"RLVR_GRADER_TOKEN\"",
        ),
    },
    Field {
        path: "outbound.allow",
        kind: Kind::Strings { item: rlvr_outbound::ENTRY_FORMS, check: outbound_entry, default: Some(&[]) },
        doc: "Destinations outbound requests may go to: a host (any port), host:port, *.example.com (every \
              subdomain, not example.com itself), an IP address, IP:port, or a CIDR network. Empty, the \
              default: no outbound request at all (a spec naming a webhook or an [env] server is refused \
              at submit).",
        example: Example::Commented(
            "allow = [\"hooks.example.com\", \"*.graders.example.com:443\", \"203.0.113.0/24\"]",
        ),
    },
    field(
        "outbound.allow_private",
        Kind::Bool(false),
        "Whether a listed destination may be a private, loopback, link-local or other non-public address \
         (IPv6 forms of them included). Off: such an address is reached only through an IP or CIDR entry \
         inside its range (\"127.0.0.1/32\", \"10.20.0.0/16\"), and a listed host name that resolves to one \
         is refused. The daemon's own API on loopback is thus out of reach unless an entry names it.",
    ),
    Field {
        path: "devices.cpu_slots",
        kind: Kind::Integer(Integers { min: 1, max: None, unit: None, default: None }),
        doc: "CPU slots, used when no GPU is found or when set: devices of cpu_slot_memory_gb each that \
              the scheduler packs jobs onto, as it packs GPUs. A slot holds as many running jobs as its \
              memory fits, and they take turns at their device phases (rollout, update), one at a time \
              per slot: cpu_slots is how many device phases run on the CPU at once, not how many jobs \
              run. Not set: the GPUs NVML finds, else one slot.",
        example: Example::Commented("cpu_slots = 2"),
    },
    Field {
        path: "devices.cpu_slot_memory_gb",
        kind: Kind::Number(GIGABYTES),
        doc: "Memory of each CPU slot. Not set: the machine's memory divided among the slots.",
        example: Example::Commented("cpu_slot_memory_gb = 8"),
    },
    Field {
        path: "devices.gpus",
        kind: Kind::Tables {
            fields: GPU_FIELDS,
            unique: Unique { key: "index", message: "gpu {value} is already listed at {first}" },
            one_of: &["index", "uuid"],
        },
        doc: "The GPUs to use, with the memory jobs may use on each, instead of every GPU NVML reports: \
              one [[devices.gpus]] entry per GPU or MIG instance, by its index or its UUID. An entry \
              that cannot be used (unknown, outside CUDA_VISIBLE_DEVICES, a GPU in MIG mode) is \
              skipped, with a note in the log.",
        example: Example::Commented(
            "[[devices.gpus]]\nindex = 0\nmemory_gb = 80\n[[devices.gpus]]\nuuid = \"MIG-8932f937-d72c-4106-c12f-20bd9faed9f6\"\nmemory_gb = 40",
        ),
    },
    field(
        "queue.poll_interval_ms",
        integer(50, 10_000, MS, 250),
        "How often an idle daemon looks for new jobs.",
    ),
    field("queue.heartbeat_ms", integer(200, 60_000, MS, 2000), "The daemon's heartbeat on Redis."),
    field(
        "queue.missed_heartbeats",
        integer(2, 100, None, 3),
        "Heartbeats missed before a daemon counts as dead and its jobs go to another daemon or to its \
         own restart: a killed daemon's running job resumes after heartbeat_ms × missed_heartbeats, \
         which must be at least 3000 ms (the dispatch queue counts heartbeats in whole seconds).",
    ),
    field(
        "queue.max_crashes",
        integer(1, 100, None, 3),
        "Crashes of a job's worker (signal, panic, or the daemon dying under it) before the job is \
         dead-lettered: it ends failed with the last crash as its reason.",
    ),
    field(
        "queue.stop_timeout_s",
        integer(1, 3600, SECONDS, 100),
        "On SIGTERM, how long running jobs get to checkpoint at a step boundary before their workers \
         are killed. Keep it under systemd's TimeoutStopSec (120 s in systemd/rlvrd.service).",
    ),
    field(
        "queue.worker_threads",
        integer(0, 1024, None, 0),
        "libtorch threads of each worker; 0 = every core.",
    ),
    field(
        "queue.keep_ended_per_team",
        integer(10, 10_000_000, None, 1000),
        "Ended jobs (published, refused, failed, cancelled) whose records each team keeps in Redis, \
         the newest; older ones are deleted (their spec and events; a published version keeps its \
         manifest on disk). Bounds what a team's finished jobs cost Redis.",
    ),
    field(
        "queue.keep_ended_days",
        integer(1, 36_500, DAYS, 90),
        "No ended job's record is kept longer than this after it ended.",
    ),
    field(
        "scheduler.starvation_after_s",
        integer(1, 604_800, SECONDS, 600),
        "A job that has waited this long stops smaller jobs from backfilling past it: nothing behind it \
         starts until it runs.",
    ),
    field(
        "scheduler.fair_share_half_life_s",
        integer(1, 2_592_000, SECONDS, 3600),
        "How fast a team's past device use fades from its fair-share standing: the half-life.",
    ),
    field(
        "scheduler.preempt_grace_s",
        integer(1, 3600, SECONDS, 120),
        "How long a preempted job's worker gets to checkpoint at its next step boundary before it is \
         killed. The job is requeued and resumes from that checkpoint.",
    ),
    Field {
        path: "scheduler.shares",
        kind: Kind::Shares,
        doc: "Guaranteed shares of the devices' capacity (memory, summed over devices), by team (named as \
              in [[auth.tokens]]); with none, no team has a guaranteed share. A team may borrow idle \
              capacity beyond its share; borrowed capacity is taken back (its jobs preempted) when \
              another team claims its share.",
        example: Example::Commented("[scheduler.shares]\nresearch = 0.5\nadmin = 0.25"),
    },
    field(
        "graders.max_memory_mb",
        integer(64, 1 << 20, Some("MiB"), 2048),
        "Largest address space a grader's sandboxed process may ask for (memory_mb).",
    ),
    field(
        "graders.max_file_mb",
        integer(1, 1 << 20, Some("MiB"), 64),
        "Largest file a grader's sandboxed process may ask to write (max_file_mb).",
    ),
    field(
        "graders.max_processes",
        integer(2, 4096, None, 64),
        "Most processes and threads one sandboxed grading run may ask for (max_processes).",
    ),
    field(
        "graders.max_parallel",
        integer(1, 1024, None, 4),
        "Most items one grader grades at once (max_parallel is lowered to it).",
    ),
    field(
        "graders.max_response_bytes",
        integer(1024, 64 << 20, Some("bytes"), 4 << 20),
        "Largest answer body an http or judge grader may accept (max_response_bytes): each item's \
         answer is held in memory while it is graded.",
    ),
    Field {
        path: "graders.work_dir",
        kind: Kind::AbsolutePath(None),
        doc: "Where graders' sandboxes make their work directories, each removed after its run: put it \
              on a filesystem of bounded size (a quota or its own mount) so that a grader writing \
              max_file_mb into many files cannot fill the state directory's. Not set: \
              STATE_DIR/grader-work.",
        example: Example::Commented("work_dir = \"/srv/rlvr/grader-work\""),
    },
    Field {
        path: "engines.trl_python",
        kind: Kind::AbsolutePath(None),
        doc: "The python of the trl engine's environment (scripts/engine-venv.sh trl makes it and prints \
              its path). Not set: [engine] kind = \"trl\" jobs are refused at submit.",
        example: Example::Commented("trl_python = \"/var/cache/rlvr/venvs/engine-trl/bin/python\""),
    },
    Field {
        path: "engines.ray_address",
        kind: Kind::Optional(&Kind::Url { schemes: &["http://", "https://"], default: "" }),
        doc: "A Ray cluster's Jobs API (its dashboard address) for [engine] launcher = \"ray\" jobs. The \
              cluster runs the engine's python from the same path and reads and writes the job's \
              directory at the same path (a shared filesystem); set RAY_JOB_STOP_WAIT_TIME_S on it long \
              enough for a checkpoint (the engine stops at its next step end). Not set: such jobs are \
              refused at submit.",
        example: Example::Commented("ray_address = \"http://127.0.0.1:8265\""),
    },
    Field {
        path: "engines.ray_python",
        kind: Kind::AbsolutePath(None),
        doc: "The python with Ray installed on the Ray cluster's nodes (the one its `ray start` runs): it \
              runs the launcher of a job whose ranks span more than one node (resources.nodes > 1), which \
              places them with a placement group and starts torchrun on each node. Not set: such jobs \
              are refused at submit.",
        example: Example::Commented("ray_python = \"/var/cache/rlvr/venvs/engine-ray/bin/python\""),
    },
    Field {
        path: "engines.vllm_python",
        kind: Kind::AbsolutePath(None),
        doc: "The python of the vLLM environment (scripts/vllm-venv.sh makes it and prints its path): a \
              [rollout] engine = \"vllm\" job's worker starts vLLM's server with it. Not set: such jobs \
              are refused at submit.",
        example: Example::Commented("vllm_python = \"/var/cache/rlvr/venvs/vllm/bin/python\""),
    },
    Field {
        path: "engines.environments",
        kind: Kind::AbsolutePath(None),
        doc: "A directory of installed [env] environments, one OpenEnv server script each (NAME.py, \
              serving on the Unix socket given as --uds PATH): a job naming env.environment = \"NAME\" \
              gets it started as its sidecar, sandboxed (no network, nothing of the file system but its \
              interpreter, its libraries, this directory read-only and a work directory of its own), \
              and stopped with it. Not set: such jobs are refused at submit.",
        example: Example::Commented("environments = \"/opt/rlvr/environments\""),
    },
    Field {
        path: "engines.environments_python",
        kind: Kind::AbsolutePath(None),
        doc: "The python that runs the installed environments, in a venv with openenv (scripts/openenv-venv.sh \
              makes one and prints its path). Its files must be readable by the daemon's user (and, when \
              the daemon runs as root, by nobody: sandboxes drop to it).",
        example: Example::Commented("environments_python = \"/var/cache/rlvr/venvs/openenv/bin/python\""),
    },
    Field {
        path: "tinker.memory_gb",
        kind: Kind::Number(Positive { what: "a number of gigabytes", max: None, default: Some(4.0) }),
        doc: "Memory each training or sampling client asks the scheduler for on its device (the base \
              model, its adapter, AdamW's state, the working set of one request): clients and jobs \
              share a device as their memory fits, and take turns at its phases.",
        example: Example::Default,
    },
    field(
        "tinker.idle_release_s",
        integer(5, 86_400, SECONDS, 120),
        "A session whose heartbeats stop this long (the SDK beats every 10 s while its program runs) \
         has its clients suspended: adapter, AdamW's state and accumulated gradients written, device \
         released. A later request resumes them exactly.",
    ),
    field(
        "tinker.checkpoint_every",
        integer(1, 100_000, None, 32),
        "State-changing requests (forward_backward, optim_step, load_weights) between a client's \
         checkpoints: a client whose process dies resumes from the last one and runs those since \
         again, so this bounds the repeated work (and what the daemon keeps to repeat).",
    ),
    field(
        "tinker.clients_per_team",
        integer(1, 10_000, None, 16),
        "Training and sampling clients one team may have open on this daemon at once; more are \
         refused with 429 until a session finishes.",
    ),
    field(
        "tinker.rate_limit_per_minute",
        integer(1, 10_000_000, None, 30_000),
        "Requests per minute each team may make to the Tinker SDK's routes (/api/v1/…), counted \
         apart from api.rate_limit_per_minute: a training loop makes a few requests per operation \
         (its post, its polls; each sample its own), so a step of 64 samples is some 150. More get \
         429 with Retry-After, which the SDK waits out.",
    ),
    field(
        "tinker.requests_per_team",
        integer(1, 1_000_000, None, 256),
        "Requests one team may have open at once on the Tinker SDK's routes, apart from \
         api.requests_per_team: each pending operation's poll is held open (up to 20 s), and a \
         loop's samples are all pending at once (past it the SDK waits and polls again). Keep it under \
         api.max_connections, which bounds every connection of every team.",
    ),
];

/// An `[outbound] allow` entry: parsed as the daemon will use it.
/// A list of team names.
const TEAM_NAMES: Kind = Kind::Strings { item: TEAM_NAME, check: team_name, default: None };
/// A list of priorities.
const PRIORITIES: Kind = Kind::Strings { item: PRIORITY, check: priority, default: None };
/// What a priority is, for messages.
const PRIORITY: &str = "\"low\", \"normal\" or \"high\"";

impl Kind {
    /// This list kind with `default` as its default.
    const fn with_default(self, default: &'static [&'static str]) -> Kind {
        match self {
            Kind::Strings { item, check, .. } => Kind::Strings { item, check, default: Some(default) },
            other => other,
        }
    }
}

fn team_name(name: &str) -> Result<(), String> {
    if rlvr_protocol::names::valid_team_name(name) { Ok(()) } else { Err(String::new()) }
}

fn priority(name: &str) -> Result<(), String> {
    if matches!(name, "low" | "normal" | "high") { Ok(()) } else { Err(String::new()) }
}

fn outbound_entry(entry: &str) -> Result<(), String> {
    entry.parse::<rlvr_outbound::AllowEntry>().map(drop).map_err(|error| error.to_string())
}

/// The keys of an `[[auth.tokens]]` entry.
const TOKEN_FIELDS: &[Field] = &[
    field("team", Kind::TeamName, "The team the token acts for."),
    field("sha256", Kind::Sha256, "The token's sha256; never the token itself."),
    field("admin", Kind::Bool(false), "Admin tokens may also force a promotion (rlvrctl promote --force)."),
];

/// The keys of a `[[tenancy.teams]]` entry.
const TEAM_FIELDS: &[Field] = &[
    field("name", Kind::TeamName, "The team, as named in [[auth.tokens]]."),
    field(
        "priorities",
        Kind::Optional(&PRIORITIES),
        "The priorities its jobs may have. Not set: tenancy.priorities.",
    ),
    field(
        "max_queued",
        Kind::Optional(&Kind::Integer(Integers { min: 1, max: Some(100_000), unit: None, default: None })),
        "How many of its jobs may wait at once. Not set: tenancy.max_queued_per_team.",
    ),
];

/// The keys of a `[[tenancy.base_models]]` entry.
const BASE_MODEL_FIELDS: &[Field] = &[
    field("name", Kind::Name, "What a spec calls it: model.policy = \"base:NAME\"."),
    field("path", Kind::AbsolutePath(None), "The Hugging Face model directory."),
    field("teams", Kind::Optional(&TEAM_NAMES), "The teams that may use it. Not set: every team."),
];

/// The keys of a `[[tenancy.data_roots]]` entry.
const DATA_ROOT_FIELDS: &[Field] = &[
    field("name", Kind::Name, "What a spec calls it: \"root:NAME/…\"."),
    field("path", Kind::AbsolutePath(None), "The directory."),
    field("teams", TEAM_NAMES, "The teams that may read it."),
];

/// The keys of a `[[tenancy.secrets]]` entry.
const SECRET_FIELDS: &[Field] = &[
    field("name", Kind::Name, "What plugin options call it."),
    field("teams", TEAM_NAMES, "The teams whose jobs may use it."),
    field(
        "env",
        Kind::Optional(&Kind::EnvName),
        "The daemon's environment variable holding the value (set exactly one of env and file).",
    ),
    field(
        "file",
        Kind::Optional(&Kind::AbsolutePath(None)),
        "A file holding the value; a trailing newline is not part of it.",
    ),
];

/// The keys of a `[[devices.gpus]]` entry.
const GPU_FIELDS: &[Field] = &[
    field(
        "index",
        Kind::Optional(&Kind::Integer(Integers { min: 0, max: None, unit: None, default: None })),
        "The GPU's index as NVML and nvidia-smi number GPUs (set exactly one of index and uuid).",
    ),
    field(
        "uuid",
        Kind::Optional(&Kind::GpuUuid),
        "The UUID of a GPU (GPU-…) or of a MIG instance (MIG-…), as nvidia-smi -L prints it; a prefix \
         only it has will do.",
    ),
    field("memory_gb", Kind::Number(GIGABYTES), "Memory jobs may use on it."),
];

impl Field {
    /// The section of a top-level key: `queue` of `queue.poll_interval_ms`.
    pub fn section(&self) -> &'static str {
        self.path.split_once('.').map_or("", |(section, _)| section)
    }

    /// The key within its section or entry: `poll_interval_ms`.
    pub fn key(&self) -> &'static str {
        self.path.split_once('.').map_or(self.path, |(_, key)| key)
    }
}

/// The fields of `section`, in table order.
pub(super) fn in_section(section: &str) -> impl Iterator<Item = &'static Field> + '_ {
    FIELDS.iter().filter(move |field| field.section() == section)
}

/// The key paths of the secrets ([`Kind::Sha256`]), by their keys: `["auth", "tokens", "sha256"]`.
pub(super) fn secret_paths() -> impl Iterator<Item = Vec<&'static str>> {
    FIELDS.iter().flat_map(|field| {
        let entry_fields = match &field.kind {
            Kind::Tables { fields, .. } => *fields,
            _ => &[],
        };
        let own = matches!(field.kind, Kind::Sha256).then(|| vec![field.section(), field.key()]);
        let in_entries = entry_fields
            .iter()
            .filter(|entry_field| matches!(entry_field.kind, Kind::Sha256))
            .map(|entry_field| vec![field.section(), field.key(), entry_field.path]);
        own.into_iter().chain(in_entries)
    })
}

/// Whether an env var setting `path` is taken as text rather than parsed as a TOML value, so that
/// `RLVR__REDIS__URL=...` never turns into a number: the keys whose kind is a string.
pub(super) fn takes_text(path: &str) -> bool {
    FIELDS.iter().any(|field| {
        field.path == path
            && matches!(
                field.kind,
                Kind::AbsolutePath(_)
                    | Kind::Url { .. }
                    | Kind::SocketAddr(_)
                    | Kind::Optional(&Kind::Url { .. })
            )
    })
}

impl Kind {
    /// What the key must hold, for "expected …": its type and range in words. `path` names a
    /// [`Kind::Tables`] key in its own text.
    pub fn what(&self, path: &str) -> String {
        match self {
            Kind::AbsolutePath(_) => "an absolute path".to_owned(),
            Kind::Url { schemes, .. } => format!("a url starting with {}", or_list(schemes)),
            Kind::SocketAddr(default) => format!("a socket address like {default}"),
            Kind::Integer(integers) => integers.what(),
            Kind::Number(positive) => positive.what(),
            Kind::Dirs(default) => format!("a list of directories like {}", toml_text(&string_list(default))),
            Kind::Strings { item, .. } => format!("a list of strings, each {item}"),
            Kind::TeamName => TEAM_NAME.to_owned(),
            Kind::Name => format!("a name of {}", rlvr_protocol::names::NAME_RULE),
            Kind::EnvName => ENV_NAME.to_owned(),
            Kind::GpuUuid => GPU_UUID.to_owned(),
            Kind::Optional(kind) => kind.what(path),
            Kind::Sha256 => SHA256.to_owned(),
            Kind::Bool(_) => "true or false".to_owned(),
            Kind::Tables { .. } => format!("a list of tables ([[{path}]])"),
            Kind::Shares => "a table".to_owned(),
        }
    }

    /// The built-in default, as the defaults layer holds it; `None`: not set (or, in an entry,
    /// required).
    pub fn default_value(&self) -> Option<Value> {
        match self {
            Kind::AbsolutePath(default) => default.map(Value::from),
            Kind::Url { default, .. } | Kind::SocketAddr(default) => Some(Value::from(*default)),
            Kind::Integer(integers) => integers.default.map(Value::from),
            Kind::Number(positive) => positive.default.map(Value::from),
            Kind::Dirs(default) => Some(string_list(default)),
            Kind::Strings { default, .. } => default.map(string_list),
            Kind::Bool(default) => Some(Value::from(*default)),
            Kind::Tables { .. } => Some(Value::from(Vec::<Value>::new())),
            Kind::Shares => Some(Value::from(Dict::new())),
            Kind::TeamName
            | Kind::Sha256
            | Kind::Name
            | Kind::EnvName
            | Kind::GpuUuid
            | Kind::Optional(_) => None,
        }
    }

    /// Whether an entry of a [`Kind::Tables`] must set the key: it has no default and may not be
    /// left out.
    pub fn required_in_entry(&self) -> bool {
        !self.has_default() && !matches!(self, Kind::Optional(_))
    }

    /// Whether the key has a default. One without is not set by default (its serde field is an
    /// `Option`) or, in an entry of a [`Kind::Tables`], required.
    pub fn has_default(&self) -> bool {
        self.default_value().is_some()
    }
}

impl Integers {
    /// The largest value the key takes.
    pub fn max(&self) -> u64 {
        self.max.unwrap_or(u64::from(u32::MAX))
    }

    fn what(&self) -> String {
        let unit = self.unit.map(|unit| format!(" ({unit})")).unwrap_or_default();
        match self.max {
            Some(max) => format!("an integer from {} to {max}{unit}", self.min),
            None => format!("an integer of at least {}{unit}", self.min),
        }
    }
}

impl Positive {
    pub fn contains(&self, x: f64) -> bool {
        x.is_finite() && x > 0.0 && self.max.is_none_or(|max| x <= max)
    }

    pub fn what(&self) -> String {
        match self.max {
            Some(max) => format!("{} greater than 0 and at most {max}", self.what),
            None => format!("{} greater than 0", self.what),
        }
    }
}

/// The built-in defaults layer: every key that has a default, by section.
pub(super) fn defaults() -> Dict {
    let mut root = Dict::new();
    for section in &SECTIONS {
        let dict: Dict = in_section(section.name)
            .filter_map(|field| Some((field.key().to_owned(), field.kind.default_value()?)))
            .collect();
        root.insert(section.name.to_owned(), Value::from(dict));
    }
    root
}

fn string_list(dirs: &[&str]) -> Value {
    Value::from(dirs.iter().map(|dir| Value::from(*dir)).collect::<Vec<_>>())
}

/// `a, b or c`.
fn or_list(items: &[&str]) -> String {
    match items {
        [] => String::new(),
        [one] => (*one).to_owned(),
        [init @ .., last] => format!("{} or {last}", init.join(", ")),
    }
}

/// A default as TOML writes it: `"text"`, `250`, `["a", "b"]`.
pub(super) fn toml_text(value: &Value) -> String {
    to_toml(value).map(|value| value.to_string()).unwrap_or_default()
}

fn to_toml(value: &Value) -> Option<toml::Value> {
    Some(match value {
        Value::String(_, s) => toml::Value::String(s.clone()),
        Value::Bool(_, b) => toml::Value::Boolean(*b),
        Value::Num(_, n) => match integer_of(*n) {
            Some(i) => toml::Value::Integer(i64::try_from(i).ok()?),
            None => toml::Value::Float(float_of(*n)),
        },
        Value::Array(_, items) => toml::Value::Array(items.iter().map(to_toml).collect::<Option<_>>()?),
        Value::Dict(_, dict) => toml::Value::Table(
            dict.iter().map(|(k, v)| Some((k.clone(), to_toml(v)?))).collect::<Option<_>>()?,
        ),
        Value::Char(..) | Value::Empty(..) => return None,
    })
}
