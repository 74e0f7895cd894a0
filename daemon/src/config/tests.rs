//! The config's tests: loading through every layer, each problem's message and source, the
//! defaults and the example file against the field table, and inputs that must not panic.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use rlvr_seeded::SplitMix64;

use super::fields::{Example, FIELDS, Kind, toml_text};
use super::layers::{ConfigFile, load_with};
use super::*;

const EXAMPLE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../configs/rlvrd.toml");
const SHA_A: &str = "fc370c33546204391aad5a828b0b76a2b8cc73c1f3a2b6d6b437574760089ab4";
const SHA_B: &str = "47276e0703c50cdecbe34a9ca7d1d202246b0ca57271aacc86a9b7bb24e939a0";
/// Stands for "no file": optional and absent, like a missing DEFAULT_CONFIG_PATH.
fn no_file() -> ConfigFile<'static> {
    ConfigFile { path: Path::new("/nonexistent/rlvr-config-test/rlvrd.toml"), required: false }
}

fn env_vec(env: &[(&str, &str)]) -> Vec<(String, String)> {
    env.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
}

fn load_file(file: ConfigFile<'_>, env: &[(&str, &str)]) -> Result<Config, ConfigErrors> {
    load_with(file, env_vec(env), Vec::new())
}

/// Loads `toml` (written to a temp file; `None`: no file) under `env`. `expected` lists the
/// problems as displayed, `{file}` standing for the temp file's path; empty means the config must
/// load. (Loading is where serde would disagree with the validator: it builds the `Config` from
/// what the validator accepted, and a value it refuses is a problem.)
fn check(toml: Option<&str>, env: &[(&str, &str)], expected: &[&str]) -> Config {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("rlvrd.toml");
    let file = match toml {
        Some(toml) => {
            std::fs::write(&path, toml).unwrap();
            ConfigFile { path: &path, required: true }
        }
        None => no_file(),
    };
    let result = load_file(file, env);
    let expected: Vec<String> =
        expected.iter().map(|e| e.replace("{file}", &path.display().to_string())).collect();
    match result {
        Ok(config) => {
            assert!(expected.is_empty(), "loaded, but expected problems:\n{}", expected.join("\n"));
            config
        }
        Err(errors) => {
            let got: Vec<String> = errors.problems.iter().map(ToString::to_string).collect();
            assert_eq!(got, expected);
            Config::default()
        }
    }
}

#[test]
fn defaults_alone_are_valid() {
    assert_eq!(check(None, &[], &[]), Config::default());
    assert_eq!(check(Some(""), &[], &[]), Config::default());
}

#[test]
fn defaults_are_the_documented_ones() {
    let config = Config::default();
    assert_eq!(config.daemon.state_dir, Path::new("/var/lib/rlvr"));
    assert_eq!(config.redis.url, "redis://127.0.0.1:6379");
    assert_eq!(config.api.listen.to_string(), "127.0.0.1:8470");
    assert_eq!(config.plugins.dirs, [PathBuf::from("/usr/lib/rlvr/plugins")]);
    assert_eq!(config.plugins.scan_interval_ms, 1000);
    assert!(config.auth.tokens.is_empty());
    assert_eq!(config.devices, DevicesConfig { cpu_slots: None, cpu_slot_memory_gb: None, gpus: vec![] });
    assert_eq!(
        config.scheduler,
        SchedulerConfig {
            starvation_after_s: 600,
            fair_share_half_life_s: 3600,
            preempt_grace_s: 120,
            shares: BTreeMap::new(),
        }
    );
}

/// `Config::default()` holds each key's default from the table, and the structs have no key the
/// table lacks, nor the reverse (entries of `[[…]]` lists included).
#[test]
fn defaults_are_the_tables() {
    let defaults = figment::value::Value::serialize(Config::default()).unwrap();
    let mut from_structs: Vec<(String, String)> = Vec::new();
    for (section, keys) in defaults.as_dict().unwrap() {
        for (key, value) in keys.as_dict().unwrap() {
            from_structs.push((format!("{section}.{key}"), toml_text(value)));
        }
    }
    let mut from_table: Vec<(String, String)> = FIELDS
        .iter()
        .map(|field| {
            (field.path.to_owned(), field.kind.default_value().map(|v| toml_text(&v)).unwrap_or_default())
        })
        .collect();
    from_structs.sort();
    from_table.sort();
    assert_eq!(from_structs, from_table);

    let token = TokenConfig { team: "a".into(), sha256: SHA_A.into(), admin: false };
    let gpu = GpuConfig { index: Some(0), uuid: Some("GPU-0".into()), memory_gb: 1.0 };
    let entries = [
        ("auth.tokens", figment::value::Value::serialize(token).unwrap()),
        ("devices.gpus", figment::value::Value::serialize(gpu).unwrap()),
    ];
    for (path, entry) in entries {
        let field = FIELDS.iter().find(|field| field.path == path).unwrap();
        let Kind::Tables { fields, .. } = &field.kind else { panic!("{path} is not a list of tables") };
        let table_keys: Vec<&str> = fields.iter().map(|field| field.path).collect();
        let struct_keys: Vec<&str> = entry.as_dict().unwrap().keys().map(String::as_str).collect();
        let mut table_sorted = table_keys.clone();
        table_sorted.sort();
        assert_eq!(struct_keys, table_sorted, "{path}");
    }
}

/// `configs/rlvrd.toml` is the table's rendering, so it cannot drift from what the daemon
/// accepts. After changing the table: `UPDATE_EXPECT=1 cargo test -p rlvr-daemon config`, or
/// `rlvrd config-example > configs/rlvrd.toml`.
#[test]
fn the_example_file_is_rendered_from_the_table() {
    expect_test::expect_file!["../../../configs/rlvrd.toml"].assert_eq(&example_toml());
}

/// The book's configuration reference is the table's rendering too.
#[test]
fn the_books_configuration_reference_is_rendered_from_the_table() {
    expect_test::expect_file!["../../../docs/src/reference/config.md"]
        .assert_eq(&super::example::reference_markdown());
}

/// What the example shows commented out is a valid way to set its key.
#[test]
fn the_commented_out_examples_load_and_set_their_key() {
    for field in FIELDS {
        let Example::Commented(lines) = field.example else { continue };
        let toml =
            if lines.starts_with('[') { lines.to_owned() } else { format!("[{}]\n{lines}", field.section()) };
        let config = check(Some(&toml), &[], &[]);
        assert_ne!(config, Config::default(), "{}", field.path);
    }
}

#[test]
fn file_overrides_default() {
    let toml = format!(
        r#"
        [daemon]
        state_dir = "/srv/rlvr"
        [redis]
        url = "unix:///run/redis.sock"
        [api]
        listen = "0.0.0.0:9000"
        [plugins]
        dirs = ["/a", "relative/b"]
        scan_interval_ms = 100
        cache_dir = "/srv/cache/plugins"
        [[auth.tokens]]
        team = "research"
        sha256 = "{SHA_A}"
        [[auth.tokens]]
        team = "ops-2"
        sha256 = "{SHA_B}"
        admin = true
        [tenancy]
        max_queued_per_team = 7
        priorities = ["low"]
        [[tenancy.teams]]
        name = "research"
        priorities = ["low", "normal", "high"]
        [[tenancy.base_models]]
        name = "smollm2"
        path = "/srv/models/smollm2"
        [[tenancy.data_roots]]
        name = "shared"
        path = "/srv/data"
        teams = ["research", "ops-2"]
        [[tenancy.secrets]]
        name = "grader-token"
        teams = ["research"]
        file = "/etc/rlvr/grader-token"
        [outbound]
        allow = ["hooks.example.com", "*.graders.example.com:443", "127.0.0.1/32"]
        allow_private = true
        [devices]
        cpu_slots = 3
        cpu_slot_memory_gb = 8
        [[devices.gpus]]
        index = 1
        memory_gb = 79.5
        [[devices.gpus]]
        uuid = "MIG-8932f937"
        memory_gb = 20
        [scheduler]
        starvation_after_s = 1
        fair_share_half_life_s = 2592000
        preempt_grace_s = 3600
        [scheduler.shares]
        research = 0.5
        ops-2 = 0.25
        eval_team = 0.25
        "#
    );
    let config = check(Some(&toml), &[], &[]);
    let expected = Config {
        daemon: DaemonConfig { state_dir: "/srv/rlvr".into(), worker_exe: None, registry: None },
        redis: RedisConfig { url: "unix:///run/redis.sock".into() },
        api: ApiConfig { listen: "0.0.0.0:9000".parse().unwrap(), ..ApiConfig::default() },
        plugins: PluginsConfig {
            dirs: vec!["/a".into(), "relative/b".into()],
            scan_interval_ms: 100,
            cache_dir: Some("/srv/cache/plugins".into()),
        },
        auth: AuthConfig {
            tokens: vec![
                TokenConfig { team: "research".into(), sha256: SHA_A.into(), admin: false },
                TokenConfig { team: "ops-2".into(), sha256: SHA_B.into(), admin: true },
            ],
        },
        tenancy: TenancyConfig {
            max_queued_per_team: 7,
            priorities: vec![Priority::Low],
            teams: vec![TeamConfig {
                name: "research".into(),
                priorities: Some(vec![Priority::Low, Priority::Normal, Priority::High]),
                max_queued: None,
            }],
            base_models: vec![BaseModelConfig {
                name: "smollm2".into(),
                path: "/srv/models/smollm2".into(),
                teams: None,
            }],
            data_roots: vec![DataRootConfig {
                name: "shared".into(),
                path: "/srv/data".into(),
                teams: vec!["research".into(), "ops-2".into()],
            }],
            secrets: vec![SecretConfig {
                name: "grader-token".into(),
                teams: vec!["research".into()],
                env: None,
                file: Some("/etc/rlvr/grader-token".into()),
            }],
            ..TenancyConfig::default()
        },
        outbound: OutboundConfig {
            allow: vec![
                "hooks.example.com".into(),
                "*.graders.example.com:443".into(),
                "127.0.0.1/32".into(),
            ],
            allow_private: true,
        },
        devices: DevicesConfig {
            cpu_slots: Some(3),
            cpu_slot_memory_gb: Some(8.0),
            gpus: vec![
                GpuConfig { index: Some(1), uuid: None, memory_gb: 79.5 },
                GpuConfig { index: None, uuid: Some("MIG-8932f937".into()), memory_gb: 20.0 },
            ],
        },
        queue: QueueConfig::default(),
        scheduler: SchedulerConfig {
            starvation_after_s: 1,
            fair_share_half_life_s: 2_592_000,
            preempt_grace_s: 3600,
            shares: BTreeMap::from([
                ("research".to_owned(), 0.5),
                ("ops-2".to_owned(), 0.25),
                ("eval_team".to_owned(), 0.25),
            ]),
        },
        graders: GradersConfig::default(),
        engines: EnginesConfig::default(),
        tinker: TinkerConfig::default(),
    };
    assert_eq!(config, expected);
}

#[test]
fn env_overrides_file() {
    let toml = "[api]\nlisten = \"127.0.0.1:1\"\n[plugins]\ndirs = [\"/from/file\"]\n";
    let tokens = format!(r#"[{{team = "ci", sha256 = "{SHA_A}", admin = true}}]"#);
    let env = [
        ("RLVR__API__LISTEN", "0.0.0.0:8470"),
        ("RLVR__PLUGINS__DIRS", r#"["/a", "/b"]"#),
        ("RLVR__DEVICES__CPU_SLOTS", "4"),
        ("RLVR__DEVICES__CPU_SLOT_MEMORY_GB", "8.1"),
        ("RLVR__DEVICES__GPUS", "[{index = 0, memory_gb = 80.5}]"),
        ("RLVR__AUTH__TOKENS", &tokens),
        ("RLVR__REDIS__URL", "rediss://cache.internal:6380"),
        ("RLVR__DAEMON__STATE_DIR", r#""/quoted/dir""#),
        ("RLVR__DAEMON__WORKER_EXE", "/opt/rlvr/rlvr-worker"),
        ("RLVR__SCHEDULER__PREEMPT_GRACE_S", "30"),
        ("RLVR__SCHEDULER__SHARES", "{research = 0.6, ci = 0.4}"),
        ("RLVR__OUTBOUND__ALLOW", r#"["hooks.example.com:443"]"#),
        ("OTHER__API__LISTEN", "nonsense"),
    ];
    let config = check(Some(toml), &env, &[]);
    assert_eq!(config.api.listen.to_string(), "0.0.0.0:8470");
    assert_eq!(config.plugins.dirs, [PathBuf::from("/a"), PathBuf::from("/b")]);
    assert_eq!(config.plugins.scan_interval_ms, 1000);
    assert_eq!(config.devices.cpu_slots, Some(4));
    assert_eq!(config.devices.cpu_slot_memory_gb, Some(8.1));
    assert_eq!(config.devices.gpus, [GpuConfig { index: Some(0), uuid: None, memory_gb: 80.5 }]);
    assert_eq!(config.auth.tokens, [TokenConfig { team: "ci".into(), sha256: SHA_A.into(), admin: true }]);
    assert_eq!(config.redis.url, "rediss://cache.internal:6380");
    assert_eq!(config.daemon.state_dir, Path::new("/quoted/dir"));
    assert_eq!(config.daemon.worker_exe.as_deref(), Some(Path::new("/opt/rlvr/rlvr-worker")));
    assert_eq!(config.scheduler.preempt_grace_s, 30);
    assert_eq!(config.outbound.allow, ["hooks.example.com:443"]);
    assert_eq!(config.scheduler.starvation_after_s, 600);
    assert_eq!(
        config.scheduler.shares,
        BTreeMap::from([("ci".to_owned(), 0.4), ("research".to_owned(), 0.6)])
    );
    // One share per variable, merged with the file's table.
    let toml = "[scheduler.shares]\nresearch = 0.5\n";
    let config = check(Some(toml), &[("RLVR__SCHEDULER__SHARES__CI", "0.5")], &[]);
    assert_eq!(
        config.scheduler.shares,
        BTreeMap::from([("ci".to_owned(), 0.5), ("research".to_owned(), 0.5)])
    );
}

#[test]
fn every_problem_is_reported_at_once_with_its_source() {
    let toml = r#"
        [api]
        listen = "nonsense"
        lisen = "127.0.0.1:1"
        [[auth.tokens]]
        team = "research"
        sha256 = "not-a-hash"
        [devices]
        cpu_slots = 0
    "#;
    let env = [("RLVR__PLUGINS__SCAN_INTERVAL_MS", "5"), ("RLVR__REDIS__URL", "http://user:pw@host:1")];
    check(
        Some(toml),
        &env,
        &[
            r#"redis.url: expected a url starting with redis://, rediss:// or unix://, found "http://…@host:1" (from env RLVR__REDIS__URL)"#,
            "api.lisen: unknown key, expected one of: listen, max_body_bytes, rate_limit_per_minute, auth_failures_per_minute, max_connections, header_timeout_s, body_timeout_s, idle_timeout_s, dry_runs_at_once, dry_runs_per_team, dry_run_budget_s, streams_per_team, requests_per_team, docs_dir (from file {file})",
            r#"api.listen: expected a socket address like 127.0.0.1:8470, found "nonsense" (from file {file})"#,
            "plugins.scan_interval_ms: expected an integer from 100 to 60000 (milliseconds), found 5 (from env RLVR__PLUGINS__SCAN_INTERVAL_MS)",
            r#"auth.tokens[0].sha256: expected the hex sha256 of the token (64 lowercase hex characters: printf %s "$TOKEN" | sha256sum), found a string of 10 characters (from file {file})"#,
            "devices.cpu_slots: expected an integer of at least 1, found 0 (from file {file})",
        ],
    );
}

#[test]
fn named_file_must_exist() {
    let missing = Path::new("/nonexistent/rlvr-config-test/missing.toml");
    let errors = load_from(Some(missing), Vec::new()).unwrap_err();
    assert_eq!(
        errors.to_string(),
        "config has 1 problem(s):\n  \
         cannot read config file: no such file (from file /nonexistent/rlvr-config-test/missing.toml)"
    );
    // `load` reads the process env, which the tests never set; the file problem is there either way.
    let errors = load(Some(missing)).unwrap_err();
    assert!(errors.problems.iter().any(|p| p.source == format!("file {}", missing.display())));
}

#[test]
fn missing_default_file_means_defaults_and_env() {
    let config = load_file(no_file(), &[("RLVR__API__LISTEN", "127.0.0.1:9")]).unwrap();
    assert_eq!(config.api.listen.to_string(), "127.0.0.1:9");
}

#[test]
fn a_directory_is_not_a_config_file() {
    let dir = tempfile::tempdir().unwrap();
    let errors = load_from(Some(dir.path()), Vec::new()).unwrap_err();
    assert_eq!(errors.problems.len(), 1);
    assert_eq!(errors.problems[0].key, "");
    assert_eq!(errors.problems[0].source, format!("file {}", dir.path().display()));
}

#[test]
fn toml_syntax_error_is_one_problem_with_file_and_line() {
    check(
        Some("[api]\nlisten = \"127.0.0.1:1\"\nscan_interval_ms = = 3\n"),
        &[],
        &["invalid TOML at line 3, column 20: invalid string; expected `\"`, `'` (from file {file})"],
    );
    check(
        Some("[api]\nlisten = \"a\"\nlisten = \"b\"\n"),
        &[],
        &["invalid TOML at line 3, column 1: duplicate key `listen` in table `api` (from file {file})"],
    );
    check(Some("a = 1\n\u{0}\n"), &[], &["invalid TOML at line 2, column 1: invalid key (from file {file})"]);
}

#[test]
fn file_that_is_not_utf8_is_one_problem_with_its_line() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("rlvrd.toml");
    std::fs::write(&path, b"[api]\nlisten = \"\xff\"\n").unwrap();
    let errors = load_from(Some(&path), Vec::new()).unwrap_err();
    assert_eq!(
        errors.to_string(),
        format!("config has 1 problem(s):\n  not valid UTF-8 at line 2 (from file {})", path.display())
    );
}

#[test]
fn unknown_sections_and_keys() {
    check(
        Some("[apii]\nlisten = \"127.0.0.1:1\"\n[devices]\ncpu = 1\n"),
        &[("RLVR__METRICS__PORT", "9")],
        &[
            "apii: unknown section, expected one of: daemon, redis, api, plugins, auth, tenancy, outbound, devices, queue, scheduler, graders, engines, tinker (from file {file})",
            "metrics: unknown section, expected one of: daemon, redis, api, plugins, auth, tenancy, outbound, devices, queue, scheduler, graders, engines, tinker (from env RLVR__METRICS__PORT)",
            "devices.cpu: unknown key, expected one of: cpu_slots, cpu_slot_memory_gb, gpus (from file {file})",
        ],
    );
    check(
        Some("\"a.b\" = 1\n[api]\n\"with space\" = 2\n"),
        &[],
        &[
            r#""a.b": unknown section, expected one of: daemon, redis, api, plugins, auth, tenancy, outbound, devices, queue, scheduler, graders, engines, tinker (from file {file})"#,
            r#"api."with space": unknown key, expected one of: listen, max_body_bytes, rate_limit_per_minute, auth_failures_per_minute, max_connections, header_timeout_s, body_timeout_s, idle_timeout_s, dry_runs_at_once, dry_runs_per_team, dry_run_budget_s, streams_per_team, requests_per_team, docs_dir (from file {file})"#,
        ],
    );
}

#[test]
fn example_config_loads() {
    let config = load_file(ConfigFile { path: Path::new(EXAMPLE), required: true }, &[]).unwrap();
    assert_eq!(config.daemon.state_dir, Path::new("/var/lib/rlvr"));
    assert_eq!(config.api.listen.to_string(), "127.0.0.1:8470");
    assert_eq!(config.plugins.dirs, [PathBuf::from("/usr/lib/rlvr/plugins")]);
    // The example leaves the devices to NVML or one CPU slot: a copy on a GPU machine must
    // not turn its GPUs into CPU slots.
    assert_eq!(config.devices, DevicesConfig::default());
    assert_eq!(config.scheduler, SchedulerConfig::default());
    // regression: the example config shipped a working admin token (admin-example-token)
    assert!(config.auth.tokens.is_empty(), "the example config must not let anyone in");
    check(Some(&std::fs::read_to_string(EXAMPLE).unwrap()), &[], &[]);
}

/// Loads each file and expects its problems, one per line, all from the file.
fn check_file_problems(cases: &[(&str, &str)]) {
    for (toml, expected) in cases {
        let expected: Vec<String> = expected.lines().map(|l| format!("{l} (from file {{file}})")).collect();
        let expected: Vec<&str> = expected.iter().map(String::as_str).collect();
        check(Some(toml), &[], &expected);
    }
}

#[test]
fn value_problems() {
    let cases: &[(&str, &str)] = &[
        (
            "[daemon]\nstate_dir = \"var/lib\"",
            r#"daemon.state_dir: expected an absolute path, found "var/lib""#,
        ),
        ("[daemon]\nstate_dir = \"\"", r#"daemon.state_dir: expected an absolute path, found """#),
        (
            "[daemon]\nworker_exe = \"bin/w\"",
            r#"daemon.worker_exe: expected an absolute path, found "bin/w""#,
        ),
        (
            "[queue]\nheartbeat_ms = 100\nworker_threads = 1025",
            "queue.heartbeat_ms: expected an integer from 200 to 60000 (milliseconds), found 100\n\
             queue.worker_threads: expected an integer from 0 to 1024, found 1025",
        ),
        (
            "[api]\nmax_body_bytes = 1023",
            "api.max_body_bytes: expected an integer from 1024 to 67108864 (bytes), found 1023",
        ),
        // Each in range, together a window the dispatch queue's whole seconds cannot keep.
        (
            "[queue]\nheartbeat_ms = 500\nmissed_heartbeats = 5",
            "queue.missed_heartbeats: heartbeat_ms × missed_heartbeats is 2500 ms; at least 3000: the dispatch \
             queue counts heartbeats in whole seconds, and under that a busy daemon's own queue consumers \
             count each other dead",
        ),
        (
            "[daemon]\nstate_dir = 1979-05-27",
            "daemon.state_dir: expected an absolute path, found a date-time",
        ),
        ("daemon = 5", "daemon: expected a table, found 5"),
        (
            "[redis]\nurl = \"redis://\"",
            r#"redis.url: expected a host or socket path after the scheme, found "redis://""#,
        ),
        (
            "[redis]\nurl = \"redis://a b\"",
            r#"redis.url: expected a host or socket path after the scheme, found "redis://a b""#,
        ),
        (
            "[redis]\nurl = \"localhost:6379\"",
            r#"redis.url: expected a url starting with redis://, rediss:// or unix://, found "localhost:6379""#,
        ),
        ("[api]\nlisten = 8470", "api.listen: expected a socket address like 127.0.0.1:8470, found 8470"),
        (
            "[api]\nlisten = \"localhost:8470\"",
            r#"api.listen: expected a socket address like 127.0.0.1:8470, found "localhost:8470""#,
        ),
        (
            "[plugins]\ndirs = \"/a\"",
            r#"plugins.dirs: expected a list of directories like ["/usr/lib/rlvr/plugins"], found "/a""#,
        ),
        (
            "[plugins]\ndirs = [\"/a\", \"\", 3]",
            "plugins.dirs[1]: expected a non-empty directory path, found \"\"\nplugins.dirs[2]: expected a directory path, found 3",
        ),
        (
            "[plugins]\nscan_interval_ms = 60001",
            "plugins.scan_interval_ms: expected an integer from 100 to 60000 (milliseconds), found 60001",
        ),
        (
            "[plugins]\nscan_interval_ms = -1",
            "plugins.scan_interval_ms: expected an integer from 100 to 60000 (milliseconds), found -1",
        ),
        (
            "[plugins]\nscan_interval_ms = 1000.0",
            "plugins.scan_interval_ms: expected an integer from 100 to 60000 (milliseconds), found 1000",
        ),
        (
            "[auth]\ntokens = {team = \"a\"}",
            "auth.tokens: expected a list of tables ([[auth.tokens]]), found a table",
        ),
        (
            "[[auth.tokens]]\nadmin = \"yes\"\nuser = \"x\"",
            "auth.tokens[0].user: unknown key, expected one of: team, sha256, admin\nauth.tokens[0].team: missing required key\nauth.tokens[0].sha256: missing required key\nauth.tokens[0].admin: expected true or false, found \"yes\"",
        ),
    ];
    check_file_problems(cases);
}

#[test]
fn device_and_scheduler_problems() {
    let cases: &[(&str, &str)] = &[
        (
            "[devices]\ncpu_slots = 4294967296",
            "devices.cpu_slots: expected an integer of at least 1, found 4294967296",
        ),
        (
            "[devices]\ncpu_slot_memory_gb = nan",
            "devices.cpu_slot_memory_gb: expected a number of gigabytes greater than 0, found NaN",
        ),
        (
            "[devices]\ncpu_slot_memory_gb = -inf",
            "devices.cpu_slot_memory_gb: expected a number of gigabytes greater than 0, found -inf",
        ),
        (
            "[devices]\ncpu_slot_memory_gb = 0",
            "devices.cpu_slot_memory_gb: expected a number of gigabytes greater than 0, found 0",
        ),
        (
            "[[devices.gpus]]\nindex = 0\nmemory_gb = 80\n[[devices.gpus]]\nindex = 0\nmemory_gb = 40\n[[devices.gpus]]\nmemory_gb = \"80\"",
            "devices.gpus[1].index: gpu 0 is already listed at devices.gpus[0]\ndevices.gpus[2].memory_gb: expected a number of gigabytes greater than 0, found \"80\"\ndevices.gpus[2]: expected exactly one of index, uuid to be set, found 0",
        ),
        (
            "[[devices.gpus]]\nindex = -1\nmemory_gb = 1",
            "devices.gpus[0].index: expected an integer of at least 0, found -1",
        ),
        (
            "[[devices.gpus]]\nuuid = \"0\"\nmemory_gb = 1\n[[devices.gpus]]\nuuid = \"MIG-GPU-1/1/0\"\nmemory_gb = 1\n\
             [[devices.gpus]]\nindex = 1\nuuid = \"GPU-1\"\nmemory_gb = 1",
            "devices.gpus[0].uuid: expected a GPU-… or MIG-… UUID as nvidia-smi -L prints it, or a prefix of one, found \"0\"\n\
             devices.gpus[1].uuid: expected a GPU-… or MIG-… UUID as nvidia-smi -L prints it, or a prefix of one, found \"MIG-GPU-1/1/0\"\n\
             devices.gpus[2]: expected exactly one of index, uuid to be set, found 2",
        ),
        (
            "[scheduler]\nstarvation_after_s = 0\nfair_share_half_life_s = 2592001\npreempt_grace_s = 1.5\npreempt = 1",
            "scheduler.preempt: unknown key, expected one of: starvation_after_s, fair_share_half_life_s, preempt_grace_s, shares\n\
             scheduler.starvation_after_s: expected an integer from 1 to 604800 (seconds), found 0\n\
             scheduler.fair_share_half_life_s: expected an integer from 1 to 2592000 (seconds), found 2592001\n\
             scheduler.preempt_grace_s: expected an integer from 1 to 3600 (seconds), found 1.5",
        ),
        ("[scheduler]\nshares = 0.5", "scheduler.shares: expected a table, found 0.5"),
        (
            "[scheduler.shares]\nResearch = 0.5\n\"a b\" = \"0.1\"\nzero = 0\nbig = 1.5\nok = 1",
            "scheduler.shares.Research: expected a team name of lowercase letters, digits, '_' and '-', found \"Research\"\n\
             scheduler.shares.\"a b\": expected a team name of lowercase letters, digits, '_' and '-', found \"a b\"\n\
             scheduler.shares.\"a b\": expected a fraction of the capacity greater than 0 and at most 1, found \"0.1\"\n\
             scheduler.shares.big: expected a fraction of the capacity greater than 0 and at most 1, found 1.5\n\
             scheduler.shares.zero: expected a fraction of the capacity greater than 0 and at most 1, found 0",
        ),
        (
            "[scheduler.shares]\nresearch = 0.7\nvision = 0.2\nops = 0.2",
            "scheduler.shares: expected shares summing to at most 1, found 1.1 (ops 0.2, research 0.7, vision 0.2)",
        ),
    ];
    check_file_problems(cases);
}

#[test]
fn tenancy_problems() {
    let cases: &[(&str, &str)] = &[
        (
            "[tenancy]\npriorities = [\"urgent\"]\nmax_queued_per_team = 0",
            "tenancy.max_queued_per_team: expected an integer from 1 to 100000, found 0\n\
             tenancy.priorities[0]: expected \"low\", \"normal\" or \"high\", found \"urgent\"",
        ),
        (
            "[[tenancy.secrets]]\nname = \"t\"\nteams = [\"a\"]\nenv = \"X\"\nfile = \"/f\"\n\
             [[tenancy.secrets]]\nname = \"u\"\nteams = [\"a\"]\n\
             [[tenancy.secrets]]\nname = \"../v\"\nteams = [\"A\"]\nenv = \"lower\"",
            "tenancy.secrets[0]: expected exactly one of env, file to be set, found 2\n\
             tenancy.secrets[1]: expected exactly one of env, file to be set, found 0\n\
             tenancy.secrets[2].name: expected a name of 1 to 64 characters among letters, digits, '-', '_' and '.', not starting with '.', found \"../v\"\n\
             tenancy.secrets[2].teams[0]: expected a team name of lowercase letters, digits, '_' and '-', found \"A\"\n\
             tenancy.secrets[2].env: expected an environment variable name of uppercase letters, digits and '_', found \"lower\"",
        ),
        (
            "[[tenancy.data_roots]]\nname = \"d\"\npath = \"relative\"\n",
            "tenancy.data_roots[0].path: expected an absolute path, found \"relative\"\n\
             tenancy.data_roots[0].teams: missing required key",
        ),
        (
            "[[tenancy.teams]]\nname = \"a\"\n[[tenancy.teams]]\nname = \"a\"\nmax_queued = 0",
            "tenancy.teams[1].max_queued: expected an integer from 1 to 100000, found 0\n\
             tenancy.teams[1].name: team a is already listed at tenancy.teams[0]",
        ),
    ];
    check_file_problems(cases);
}

#[test]
fn outbound_problems_name_each_bad_entry() {
    let what =
        "a host, host:port, *.domain (its subdomains), an IP address, IP:port or a CIDR like 10.1.0.0/16";
    let cases: &[(&str, &str)] = &[
        (
            "[outbound]\nallow = [\"hooks.example.com\", \"https://x.example.com/hook\", \"10.0.0.0/33\", 3, \"\"]",
            &format!(
                "outbound.allow[1]: expected {what}, found \"https://x.example.com/hook\" (a url, not a destination: write its host (and port) alone)\n\
                 outbound.allow[2]: expected {what}, found \"10.0.0.0/33\" (not a CIDR network: invalid IP address syntax)\n\
                 outbound.allow[3]: expected {what}, found 3\n\
                 outbound.allow[4]: expected {what}, found \"\" (an empty entry)"
            ),
        ),
        (
            "[outbound]\nallow = \"hooks.example.com\"\nallow_private = \"no\"",
            &format!(
                "outbound.allow: expected a list of strings, each {what}, found \"hooks.example.com\"\n\
                 outbound.allow_private: expected true or false, found \"no\""
            ),
        ),
    ];
    check_file_problems(cases);
}

#[test]
fn outbound_allows_nothing_by_default_and_builds_its_policy() {
    let config = Config::default();
    assert!(config.outbound.allow.is_empty());
    assert!(!config.outbound.allow_private);
    let policy = config.outbound.policy().unwrap();
    assert!(policy.check_url("https://hooks.example.com/").is_err());
    let config = check(Some("[outbound]\nallow = [\"hooks.example.com\"]\n"), &[], &[]);
    assert!(config.outbound.policy().unwrap().check_url("https://hooks.example.com/").is_ok());
}

#[test]
fn shares_that_sum_to_one_in_decimals_are_accepted() {
    // 0.1 + 0.2 + 0.7 is 1.0000000000000002 in f64.
    let config = check(Some("[scheduler.shares]\na = 0.1\nb = 0.2\nc = 0.7\n"), &[], &[]);
    assert_eq!(config.scheduler.shares.len(), 3);
    check(Some("[scheduler.shares]\nall = 1\n"), &[], &[]);
    check(Some("[scheduler.shares]\n"), &[], &[]);
}

#[test]
fn token_problems_never_quote_the_secret() {
    let upper = SHA_A.to_uppercase();
    let toml = format!(
        r#"
        [[auth.tokens]]
        team = "Research"
        sha256 = "{upper}"
        [[auth.tokens]]
        team = "a"
        sha256 = "my-secret-token"
        [[auth.tokens]]
        team = "b"
        sha256 = "{SHA_B}"
        [[auth.tokens]]
        team = "c"
        sha256 = "{SHA_B}"
        "#
    );
    let what = r#"expected the hex sha256 of the token (64 lowercase hex characters: printf %s "$TOKEN" | sha256sum)"#;
    check(
        Some(&toml),
        &[],
        &[
            r#"auth.tokens[0].team: expected a team name of lowercase letters, digits, '_' and '-', found "Research" (from file {file})"#,
            &format!(
                "auth.tokens[0].sha256: {what}, found 64 hex characters with uppercase letters (from file {{file}})"
            ),
            &format!("auth.tokens[1].sha256: {what}, found a string of 15 characters (from file {{file}})"),
            "auth.tokens[3].sha256: same sha256 as auth.tokens[2], every token must be different (from file {file})",
        ],
    );
}

#[test]
fn what_holds_a_token_hash_is_never_quoted_back() {
    // regression: an env value that did not parse as a list of tables was quoted back whole, hash
    // included.
    let tokens = format!("[{{team='a',sha256='{SHA_A}'}}]");
    check(
        Some(&format!("[auth]\ntokens = [\"{SHA_A}\"]\n")),
        &[],
        &["auth.tokens[0]: expected a table, found a string (from file {file})"],
    );
    check(
        None,
        &[("RLVR__AUTH__TOKENS", &tokens)],
        &[
            "auth.tokens: expected a list of tables ([[auth.tokens]]), found a string (from env RLVR__AUTH__TOKENS)",
        ],
    );
    check(None, &[("RLVR__AUTH", SHA_A)], &["auth: expected a table, found a string (from env RLVR__AUTH)"]);
}

#[test]
fn env_problems_name_the_variable() {
    let bad_tokens = r#"[{team = "ci", sha256 = "abc"}]"#;
    check(
        None,
        &[
            ("RLVR__API__LISEN", "127.0.0.1:1"),
            ("RLVR__API____X", "1"),
            ("RLVR__", "1"),
            ("RLVR__AUTH__TOKENS", bad_tokens),
            ("RLVR__DEVICES", "{cpu_slots = 2}"),
            ("RLVR__DEVICES__CPU_SLOTS", "3"),
            ("RLVR__PLUGINS__DIRS", "/one/dir"),
            ("RLVR__REDIS__URL", "42"),
        ],
        &[
            "malformed variable name, expected RLVR__SECTION__KEY (from env RLVR__)",
            "api..x: malformed variable name, expected RLVR__SECTION__KEY (from env RLVR__API____X)",
            "devices.cpu_slots: conflicts with RLVR__DEVICES, set only one (from env RLVR__DEVICES__CPU_SLOTS)",
            r#"redis.url: expected a url starting with redis://, rediss:// or unix://, found "42" (from env RLVR__REDIS__URL)"#,
            "api.lisen: unknown key, expected one of: listen, max_body_bytes, rate_limit_per_minute, auth_failures_per_minute, max_connections, header_timeout_s, body_timeout_s, idle_timeout_s, dry_runs_at_once, dry_runs_per_team, dry_run_budget_s, streams_per_team, requests_per_team, docs_dir (from env RLVR__API__LISEN)",
            r#"plugins.dirs: expected a list of directories like ["/usr/lib/rlvr/plugins"], found "/one/dir" (from env RLVR__PLUGINS__DIRS)"#,
            r#"auth.tokens[0].sha256: expected the hex sha256 of the token (64 lowercase hex characters: printf %s "$TOKEN" | sha256sum), found a string of 3 characters (from env RLVR__AUTH__TOKENS)"#,
        ],
    );
}

#[test]
fn errors_display_one_problem_per_line() {
    let errors = ConfigErrors {
        problems: vec![
            ConfigProblem::new("api.listen", "expected a socket address", "env RLVR__API__LISTEN"),
            ConfigProblem::new("", "cannot read config file: no such file", "file /x.toml"),
        ],
    };
    assert_eq!(
        errors.to_string(),
        "config has 2 problem(s):\n  \
         api.listen: expected a socket address (from env RLVR__API__LISTEN)\n  \
         cannot read config file: no such file (from file /x.toml)"
    );
}

#[test]
fn never_panics_on_mangled_files() {
    let example = std::fs::read_to_string(EXAMPLE).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("rlvrd.toml");
    let file = ConfigFile { path: &path, required: true };
    let inserts = ["[", "]", "{", "}", "=", "\"", "'", "\n", ".", "#", "-", "0x", "nan", "[[", "\u{0}", "é"];
    let mut rng = SplitMix64::new(0x5eed);
    let mut next = move |bound: usize| rng.below(bound);
    for _ in 0..300 {
        let mut text = example.clone();
        for _ in 0..1 + next(4) {
            let mut at = next(text.len() + 1);
            while !text.is_char_boundary(at) {
                at -= 1;
            }
            text.insert_str(at, inserts[next(inserts.len())]);
        }
        std::fs::write(&path, &text).unwrap();
        let _ = load_file(file, &[]);
    }
    let deep = format!("a = {}", "[".repeat(100_000));
    std::fs::write(&path, deep).unwrap();
    assert!(load_file(file, &[]).is_err());
}

#[test]
fn never_panics_on_odd_env_values() {
    let deep = "[".repeat(100_000);
    let values = [
        "",
        " ",
        "[",
        "]",
        "{",
        "}",
        "[[",
        "{a=}",
        "{=1}",
        "nan",
        "-1",
        "1e999",
        "1.5",
        "-0",
        "true",
        "'",
        "'ab'",
        "'a'",
        "\"",
        "\"\\u{0}\"",
        "\"\\q\"",
        "\u{0}",
        "99999999999999999999999999999999999999999",
        "-99999999999999999999999999999999999999999",
        "[{team=1}]",
        "[{index=-1, memory_gb=1}]",
        &deep,
    ];
    let keys = [
        "RLVR__DAEMON__STATE_DIR",
        "RLVR__REDIS__URL",
        "RLVR__API__LISTEN",
        "RLVR__PLUGINS__DIRS",
        "RLVR__PLUGINS__SCAN_INTERVAL_MS",
        "RLVR__AUTH__TOKENS",
        "RLVR__DEVICES__CPU_SLOTS",
        "RLVR__DEVICES__CPU_SLOT_MEMORY_GB",
        "RLVR__DEVICES__GPUS",
        "RLVR__DEVICES",
        "RLVR__SCHEDULER__STARVATION_AFTER_S",
        "RLVR__SCHEDULER__SHARES",
        "RLVR__SCHEDULER__SHARES__A",
        "RLVR__OUTBOUND__ALLOW",
        "RLVR__OUTBOUND__ALLOW_PRIVATE",
        "RLVR__SCHEDULER",
        "RLVR__X",
    ];
    for key in keys {
        for value in values {
            let _ = load_file(no_file(), &[(key, value)]);
        }
    }
    let errors = load_file(no_file(), &[("RLVR__PLUGINS__DIRS", &deep)]).unwrap_err();
    assert_eq!(
        errors.to_string(),
        "config has 1 problem(s):\n  \
         plugins.dirs: value nested more than 32 levels deep (from env RLVR__PLUGINS__DIRS)"
    );
}
