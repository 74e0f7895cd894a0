//! The plugin registry in a running `rlvrd serve`: real libraries through the real loader,
//! drop-ins, side-by-side versions, and every refusal with its message, the daemon serving on.

use std::fs;
use std::time::Duration;

use rlvr_tests::{Daemon, TEAM_TOKEN, drop_bytes, drop_in, plugin_lib, rlvrctl, wait_until};
use serde_json::Value;

const NO_REDIS: &str = "redis://127.0.0.1:1";

fn listed(daemon: &Daemon) -> Value {
    daemon.get_json("/v1/plugins")
}

fn plugin_ids(daemon: &Daemon) -> Vec<String> {
    listed(daemon)["plugins"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["id"].as_str().unwrap().to_owned())
        .collect()
}

#[test]
fn every_built_plugin_loads_through_the_real_loader() {
    let daemon = Daemon::start(
        &[
            "rlvr-verifier-format",
            "rlvr-verifier-template",
            "rlvr-verifier-math",
            "rlvr-verifier-code",
            "rlvr-verifier-ifeval",
            "rlvr-verifier-http",
            "rlvr-verifier-judge",
            "rlvr-verifier-python",
            "rlvr-verifier-string-check",
            "rlvr-verifier-text-similarity",
            "rlvr-optimizer-grpo",
            "rlvr-optimizer-rloo",
            "rlvr-optimizer-ppo",
            "rlvr-optimizer-dpo",
            "rlvr-optimizer-sft",
            "rlvr-optimizer-rm",
            "rlvr-curriculum-frontier",
            "rlvr-curriculum-uniform",
            "rlvr-fixture-echo-v1",
            "rlvr-fixture-optimizer-centred",
            "rlvr-fixture-curriculum-cycle",
            "rlvr-fixture-stall",
            "rlvr-fixture-legacy-verifier",
        ],
        NO_REDIS,
    );
    let list = listed(&daemon);
    let mut plugins: Vec<(String, String)> = list["plugins"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| (p["id"].as_str().unwrap().to_owned(), p["kind"].as_str().unwrap().to_owned()))
        .collect();
    plugins.sort();
    assert_eq!(
        plugins,
        [
            ("centred@0.1.0".to_owned(), "optimizer".to_owned()),
            ("code@0.1.0".to_owned(), "verifier".to_owned()),
            ("cycle@0.1.0".to_owned(), "curriculum".to_owned()),
            ("dpo@0.1.0".to_owned(), "optimizer".to_owned()),
            ("echo@1.0.0".to_owned(), "verifier".to_owned()),
            ("exact-match@0.1.0".to_owned(), "verifier".to_owned()),
            ("format@0.1.0".to_owned(), "verifier".to_owned()),
            ("frontier@0.1.0".to_owned(), "curriculum".to_owned()),
            ("grpo@0.1.0".to_owned(), "optimizer".to_owned()),
            ("http@0.1.0".to_owned(), "verifier".to_owned()),
            ("ifeval@0.1.0".to_owned(), "verifier".to_owned()),
            ("judge@0.1.0".to_owned(), "verifier".to_owned()),
            ("legacy@1.0.0".to_owned(), "verifier".to_owned()),
            ("math@0.1.0".to_owned(), "verifier".to_owned()),
            ("ppo@0.1.0".to_owned(), "optimizer".to_owned()),
            ("python@0.1.0".to_owned(), "verifier".to_owned()),
            ("rloo@0.1.0".to_owned(), "optimizer".to_owned()),
            ("rm@0.1.0".to_owned(), "optimizer".to_owned()),
            ("sft@0.1.0".to_owned(), "optimizer".to_owned()),
            ("stall@0.1.0".to_owned(), "verifier".to_owned()),
            ("string-check@0.1.0".to_owned(), "verifier".to_owned()),
            ("text-similarity@0.1.0".to_owned(), "verifier".to_owned()),
            ("uniform@0.1.0".to_owned(), "curriculum".to_owned()),
        ]
    );
    assert_eq!(list["refused"], Value::Array(vec![]), "{list}");
    let centred = list["plugins"].as_array().unwrap().iter().find(|p| p["name"] == "centred").unwrap();
    assert_eq!(centred["data_mode"], "online-groups", "{centred}");
    let ppo = list["plugins"].as_array().unwrap().iter().find(|p| p["name"] == "ppo").unwrap();
    assert_eq!(ppo["data_mode"], "online-with-critic", "{ppo}");
    let format = list["plugins"].as_array().unwrap().iter().find(|p| p["name"] == "format").unwrap();
    assert_eq!(format["reference_schema"], "{}", "{format}");
    assert_eq!(format["sha256"].as_str().unwrap().len(), 64);
    // What a plugin found about the host at load is listed, logged and shown by `rlvrctl plugins`.
    let note = "stall: hangs on request; the host's deadline must answer for it";
    let stall = list["plugins"].as_array().unwrap().iter().find(|p| p["name"] == "stall").unwrap();
    assert_eq!(stall["notes"], serde_json::json!([note]), "{stall}");
    assert!(format.get("notes").is_none(), "{format}");
    assert!(daemon.log().contains(note), "{}", daemon.log());
    let table = rlvrctl(&["--server", &daemon.url, "--token", TEAM_TOKEN, "plugins"], b"");
    let (table, stderr) = (String::from_utf8_lossy(&table.stdout), String::from_utf8_lossy(&table.stderr));
    assert!(
        table.lines().any(|line| line.starts_with("stall@0.1.0") && line.ends_with(note)),
        "{table}{stderr}"
    );
    // The content-addressed copy is what got loaded.
    let cache = &daemon.plugin_cache;
    let cached: Vec<String> =
        fs::read_dir(cache).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    let sha = format["sha256"].as_str().unwrap();
    assert!(cached.contains(&format!("librlvr_verifier_format-{sha}.so")), "{cached:?}");
}

/// `rlvr_plugin_probes_total`: probe processes the daemon started since it started.
fn probes_run(daemon: &Daemon) -> u64 {
    let (_, metrics) = daemon.get("/metrics");
    metrics
        .lines()
        .find_map(|line| line.strip_prefix("rlvr_plugin_probes_total "))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no rlvr_plugin_probes_total in:\n{metrics}"))
}

#[test]
fn a_dropped_in_plugin_loads_beside_the_old_version_and_a_restart_probes_only_new_libraries() {
    let mut daemon = Daemon::start(&["rlvr-verifier-format"], NO_REDIS);
    assert_eq!(plugin_ids(&daemon), ["format@0.1.0"]);

    drop_in(&plugin_lib("rlvr-fixture-echo-v1"), &daemon.plugins, "echo.so");
    assert!(
        wait_until(Duration::from_secs(20), || plugin_ids(&daemon).contains(&"echo@1.0.0".to_owned())),
        "echo@1.0.0 not picked up; log:\n{}",
        daemon.log()
    );
    // A new build dropped over the same file name: the old one stays loaded beside it.
    drop_in(&plugin_lib("rlvr-fixture-echo-v2"), &daemon.plugins, "echo.so");
    assert!(
        wait_until(Duration::from_secs(20), || plugin_ids(&daemon).contains(&"echo@2.0.0".to_owned())),
        "echo@2.0.0 not picked up; log:\n{}",
        daemon.log()
    );
    assert_eq!(plugin_ids(&daemon), ["echo@1.0.0", "echo@2.0.0", "format@0.1.0"]);
    assert_eq!(daemon.get("/healthz").0, 200);

    // Restarted over the same directory, the daemon starts no probe process: each library's
    // report was kept beside its copy, under its sha256 and the worker's build.
    assert!(daemon.stop().success());
    daemon.restart();
    assert_eq!(plugin_ids(&daemon), ["echo@2.0.0", "format@0.1.0"], "echo.so holds 2.0.0 now");
    assert_eq!(probes_run(&daemon), 0, "log:\n{}", daemon.log());
    assert!(daemon.log().contains("plugin probe report from the cache"), "{}", daemon.log());

    // A library replaced while the daemon was down (another build: bytes no cache has seen, even
    // one shared with other daemons) is probed again, and only it.
    assert!(daemon.stop().success());
    let mut rebuilt = fs::read(plugin_lib("rlvr-fixture-echo-v1")).unwrap();
    rebuilt.extend_from_slice(
        format!("another build of echo 1.0.0 for {}", daemon.dir.path().display()).as_bytes(),
    );
    drop_bytes(&rebuilt, &daemon.plugins, "echo.so");
    daemon.restart();
    assert_eq!(plugin_ids(&daemon), ["echo@1.0.0", "format@0.1.0"]);
    assert_eq!(probes_run(&daemon), 1, "log:\n{}", daemon.log());
}

/// One bad library: how it is made, and the reason and message it must be refused with.
struct Case {
    file: &'static str,
    bytes: Vec<u8>,
    reason: &'static str,
    message: &'static str,
}

fn refusal_cases() -> Vec<Case> {
    let format = fs::read(plugin_lib("rlvr-verifier-format")).unwrap();
    let fixture = |name: &str| fs::read(plugin_lib(&format!("rlvr-fixture-{name}"))).unwrap();
    let mut rebuilt = format.clone();
    rebuilt.extend_from_slice(b"another build of format 0.1.0");
    vec![
        Case {
            file: "corrupt.so",
            bytes: (0..4096u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 24) as u8).collect(),
            reason: "not_a_library",
            message: "not a loadable shared library",
        },
        Case {
            file: "truncated.so",
            bytes: format[..format.len() / 3].to_vec(),
            reason: "not_a_library",
            message: "not a loadable shared library",
        },
        Case {
            file: "empty.so",
            bytes: Vec::new(),
            reason: "not_a_library",
            message: "not a loadable shared library",
        },
        Case {
            file: "not-a-plugin.so",
            bytes: fixture("not-a-plugin"),
            reason: "not_a_plugin",
            message: "a shared library but not an rlvr plugin",
        },
        Case {
            file: "wrong-api.so",
            bytes: fixture("wrong-api"),
            reason: "api_version",
            message: "built against plugin API version 999, this daemon speaks version 3",
        },
        Case {
            file: "wrong-kind.so",
            bytes: fixture("wrong-kind"),
            reason: "kind",
            message: "unknown plugin kind \"reranker\": expected one of verifier, optimizer, curriculum",
        },
        Case {
            file: "wrong-libtorch.so",
            bytes: fixture("wrong-libtorch"),
            reason: "libtorch_version",
            message: "was built against libtorch 2.3.0, this daemon uses libtorch 2.11.0",
        },
        Case {
            file: "failing-self-test.so",
            bytes: fixture("failing-self-test"),
            reason: "self_test_failed",
            message: "self-test failed: expected score 1 for a known-good answer, got 0",
        },
        Case {
            file: "panic-info.so",
            bytes: fixture("panic-info"),
            reason: "crashed",
            message: "plugin panicked in info(): metadata exploded",
        },
        Case {
            file: "panic-self-test.so",
            bytes: fixture("panic-self-test"),
            reason: "crashed",
            message: "plugin panicked in self_test(): self-test exploded",
        },
        Case {
            file: "format-rebuilt.so",
            bytes: rebuilt,
            reason: "duplicate_version",
            message: "plugin format@0.1.0 is already loaded from",
        },
    ]
}

#[test]
fn every_bad_library_is_refused_by_name_and_the_daemon_serves_on() {
    let mut daemon = Daemon::start(&["rlvr-verifier-format"], NO_REDIS);
    let cases = refusal_cases();
    for case in &cases {
        let path = drop_bytes(&case.bytes, &daemon.plugins, case.file);
        let source = path.display().to_string();
        let mut refusal = Value::Null;
        let found = wait_until(Duration::from_secs(20), || {
            refusal = listed(&daemon)["refused"]
                .as_array()
                .unwrap()
                .iter()
                .find(|r| r["source"] == source.as_str())
                .cloned()
                .unwrap_or(Value::Null);
            !refusal.is_null()
        });
        assert!(found, "{}: no refusal listed; log:\n{}", case.file, daemon.log());
        assert_eq!(refusal["reason"], case.reason, "{}: {refusal}", case.file);
        let message = refusal["message"].as_str().unwrap();
        assert!(
            message.starts_with(&format!("{source}: ")),
            "{}: message must name the file: {message}",
            case.file
        );
        assert!(message.contains(case.message), "{}: {message:?} lacks {:?}", case.file, case.message);
        assert!(daemon.is_running(), "{} stopped the daemon; log:\n{}", case.file, daemon.log());
        assert_eq!(daemon.get("/healthz").0, 200, "{}", case.file);
        // The refusal is logged with the file name.
        assert!(daemon.log().contains(&format!("plugin refused: {source}")), "{}: not logged", case.file);
    }
    // The good plugin is untouched, and the refusals are counted by reason.
    assert_eq!(plugin_ids(&daemon), ["format@0.1.0"]);
    let (_, metrics) = daemon.get("/metrics");
    let count = |reason: &str| {
        let prefix = format!("rlvr_plugin_refusals_total{{reason=\"{reason}\"}} ");
        metrics.lines().find_map(|line| line.strip_prefix(&prefix)).map(|n| n.parse::<u64>().unwrap())
    };
    for reason in [
        "not_a_library",
        "not_a_plugin",
        "api_version",
        "kind",
        "libtorch_version",
        "self_test_failed",
        "crashed",
        "duplicate_version",
    ] {
        let expected = cases.iter().filter(|case| case.reason == reason).count() as u64;
        assert_eq!(count(reason), Some(expected), "{reason} in:\n{metrics}");
    }
    assert!(metrics.contains("rlvr_plugin_loads_total{kind=\"verifier\"} 1"), "{metrics}");

    // `rlvrctl plugins` shows both tables.
    let output = rlvrctl(&["--server", &daemon.url, "--token", TEAM_TOKEN, "plugins"], b"");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    assert!(
        stdout.lines().any(|l| l.starts_with("format ") && l.contains("0.1.0") && l.contains("verifier")),
        "{stdout}"
    );
    assert!(stdout.contains("REFUSED FILE"), "{stdout}");
    assert!(stdout.lines().any(|l| l.contains("wrong-api.so") && l.contains("api_version")), "{stdout}");

    // A refused file that disappears leaves the listing.
    fs::remove_file(daemon.plugins.join("corrupt.so")).unwrap();
    assert!(wait_until(Duration::from_secs(10), || {
        !listed(&daemon)["refused"]
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r["source"].as_str().unwrap().ends_with("corrupt.so"))
    }));
    assert!(daemon.stop().success(), "rlvrd must exit 0 on SIGTERM; log:\n{}", daemon.log());
}

/// What an optimizer trains is a symbol beside the root module (`rlvr_optimizer_trains`), so no
/// checked layout changed: a library built before it loads and trains the policy, a library
/// naming a model this host does not know is refused by that name, and `rm` trains a reward
/// model.
#[test]
fn an_optimizer_without_the_trains_symbol_trains_the_policy_and_an_unknown_model_is_refused() {
    use rlvr_plugin_host::loader::{RefusalReason, load_and_check};
    let (_, legacy) = load_and_check(&plugin_lib("rlvr-fixture-legacy-optimizer")).unwrap();
    assert_eq!((legacy.name.as_str(), legacy.trains.as_deref()), ("legacy-optimizer", Some("policy")));
    let (_, rm) = load_and_check(&plugin_lib("rlvr-optimizer-rm")).unwrap();
    assert_eq!(rm.trains.as_deref(), Some("reward-model"));
    let refusal = load_and_check(&plugin_lib("rlvr-fixture-unknown-trains")).err().expect("refused");
    assert_eq!(refusal.reason, RefusalReason::InvalidMetadata, "{refusal}");
    assert_eq!(
        refusal.message,
        "optimizer unknown-trains trains \"critic\", a model this daemon does not know (it knows policy, reward-model)"
    );
}
