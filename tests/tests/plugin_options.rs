//! Plugin options checked at submit: each plugin's `check_options` through the real loader, and
//! through a real daemon (verifiers and curricula in its process, the optimizer in a worker
//! process), refusals naming the key as the spec writes it; a plugin built before
//! `check_options` still loads, submits, and has its options checked when the worker starts it.

use std::path::Path;
use std::time::{Duration, Instant};

use rlvr_plugin_api::{HostContext, OptionError, OptionsReport, PluginInstance, Secret, VerifyItem};
use rlvr_plugin_host::loader::NOT_CHECKED_AT_SUBMIT;
use rlvr_plugin_host::metrics::PluginMetrics;
use rlvr_plugin_host::options::OptionsProblem;
use rlvr_plugin_host::{Isolation, Registry};
use rlvr_tests::jobs::submit;
use rlvr_tests::{
    Daemon, PERMISSIVE_GATES, Redis, TEAM_TOKEN, arith_data, arith_grpo_spec, drop_in, plugin_lib,
};

/// An in-process registry (as the worker and `rlvrctl verify` have) over these plugin crates.
fn registry(dir: &Path, crates: &[&str]) -> Registry {
    let plugins = dir.join("plugins");
    std::fs::create_dir_all(&plugins).unwrap();
    for name in crates {
        drop_in(&plugin_lib(name), &plugins, &format!("lib{}.so", name.replace('-', "_")));
    }
    let registry =
        Registry::new(dir.join("cache"), Isolation::InProcess, PluginMetrics::unexported()).unwrap();
    let summary = registry.scan(&[plugins], Duration::ZERO);
    assert_eq!(summary.refused, 0, "{:?}", registry.refusals());
    registry
}

/// What `check_options` of plugin `name` says of `options`: the report, `None` for a plugin that
/// predates the call, or the refused key and message.
type Answer = Result<Option<OptionsReport>, (String, String)>;

fn check_options(registry: &Registry, name: &str, options: &str) -> Answer {
    let plugin = registry.find(name, None).unwrap();
    registry.check_options(&plugin, options, "tests").map_err(|problem| match problem {
        OptionsProblem::Refused(OptionError { key, message }) => (key, message),
        other => panic!("{name} {options}: {other}"),
    })
}

#[test]
fn each_plugin_answers_about_its_options_through_the_real_loader() {
    let dir = tempfile::tempdir().unwrap();
    let registry = registry(
        dir.path(),
        &[
            "rlvr-verifier-math",
            "rlvr-verifier-http",
            "rlvr-curriculum-frontier",
            "rlvr-fixture-legacy-verifier",
        ],
    );
    let refused = |key: &str, message: &str| -> Answer { Err((key.to_owned(), message.to_owned())) };
    let none = OptionsReport::default();
    let cases: Vec<(&str, &str, Answer)> = vec![
        ("math", r#"{"fallback": "last"}"#, Ok(Some(none.clone()))),
        (
            "math",
            r#"{"fallbak": "last"}"#,
            refused("fallbak", "unknown key; expected one of fallback, precision_digits, work_budget"),
        ),
        (
            "http",
            r#"{"url": "https://grader.example/v1", "bearer_token_secret": "grader-token"}"#,
            Ok(Some(
                none.clone()
                    .url("url", "https://grader.example/v1")
                    .secret("bearer_token_secret", "grader-token"),
            )),
        ),
        ("http", r#"{"url": "http://h/", "retries": 99}"#, refused("retries", "expected 0 to 10, got 99")),
        (
            "frontier",
            r#"{"band": [0.9, 0.1]}"#,
            refused("band[1]", "expected a pass rate above band[0], at most 1, got 0.1"),
        ),
        // Built before check_options: not checked here, whatever the options.
        ("legacy", "{}", Ok(None)),
        ("legacy", r#"{"scor": 2}"#, Ok(None)),
    ];
    for (name, options, expected) in cases {
        assert_eq!(check_options(&registry, name, options), expected, "{name} {options}");
    }
}

#[test]
fn a_plugin_built_before_check_options_loads_says_so_and_is_created_without_a_context() {
    let dir = tempfile::tempdir().unwrap();
    let registry = registry(dir.path(), &["rlvr-fixture-legacy-verifier", "rlvr-verifier-math"]);
    let legacy = registry.find("legacy", None).unwrap();
    assert_eq!(legacy.id(), "legacy@1.0.0");
    assert_eq!(legacy.meta.notes, [NOT_CHECKED_AT_SUBMIT]);
    assert_eq!(legacy.checks_options(), Some(false));
    let math = registry.find("math", None).unwrap();
    assert_eq!(math.checks_options(), Some(true));
    assert!(!math.meta.notes.iter().any(|note| note == NOT_CHECKED_AT_SUBMIT));

    // `create_in` falls back to `create`; the context goes nowhere.
    let mut host = HostContext::default();
    host.secrets.insert("grader-token".into(), Secret::new("s3cret"));
    let Ok(PluginInstance::Verifier(verifier)) = legacy.create_in(r#"{"score": 0.5}"#, &[], &host) else {
        panic!("the legacy verifier was not created");
    };
    let verdict = verifier.verify(VerifyItem::new("a", "p", "c", "{}")).unwrap();
    assert_eq!(verdict.score, 0.5);
    // Its options are checked when it is created, as before, naming the key.
    let error = legacy.create_in(r#"{"scor": 2}"#, &[], &host).err().expect("refused");
    assert_eq!(error.message.as_str(), "scor: unknown key; expected one of score");
}

/// The good spec of these tests: GRPO on the arithmetic data with `[[verifiers]]` math twice (the
/// second with weight 0), and `sections` appended.
fn spec(data: &Path, sections: &str) -> String {
    let good = arith_grpo_spec(data, "options", "builtin:tiny-arith", 1, 1);
    format!(
        "{good}\n{PERMISSIVE_GATES}\n[[verifiers]]\nplugin = \"math\"\nname = \"math_unweighted\"\nweight = 0.0\n{sections}"
    )
}

/// The http verifier as `verifiers[0]`, with `line` among its keys.
fn http_first(data: &Path, line: &str) -> String {
    spec(data, "").replacen(
        "[[verifiers]]\nplugin = \"math\"\nfallback = \"last\"\n",
        &format!("[[verifiers]]\nplugin = \"http\"\nurl = \"http://127.0.0.1:9/\"\n{line}\n"),
        1,
    )
}

#[test]
fn submit_refuses_bad_plugin_options_naming_the_key_as_the_spec_writes_it() {
    let redis = Redis::start();
    let daemon = Daemon::start(
        &[
            "rlvr-optimizer-grpo",
            "rlvr-verifier-math",
            "rlvr-verifier-http",
            "rlvr-verifier-code",
            "rlvr-curriculum-frontier",
            "rlvr-fixture-legacy-verifier",
        ],
        &redis.url(),
    );
    let dir = tempfile::tempdir().unwrap();
    let data = arith_data(dir.path(), &["--train", "8", "--heldout", "4", "--sft", "0"]);
    let good = spec(&data, "");
    let cases: Vec<(String, &str, &str)> = vec![
        // regression: `kl_bta` passed submit and failed after the job started
        (
            good.replace("kl_beta = 0.04", "kl_bta = 0.04"),
            "optimizer.kl_bta",
            "optimizer.kl_bta: unknown key; expected one of scale_rewards, std, eps, clip_eps_low, clip_eps_high, \
             kl_beta, kl_estimator, kl_in, loss_agg, loss, importance_ratio, clip_ratio_c, overlong_buffer, \
             overlong_penalty, entropy_coef (or one of the trainer's: plugin, group_size,",
        ),
        (
            good.replace("kl_beta = 0.04", "kl_estimator = \"k4\""),
            "optimizer.kl_estimator",
            "optimizer.kl_estimator: expected one of k1, k2, k3, got \"k4\"",
        ),
        (
            good.replace("kl_beta = 0.04", "kl_beta = -1.0"),
            "optimizer.kl_beta",
            "optimizer.kl_beta: expected a number ≥ 0, got -1",
        ),
        // regression: `fallbak` passed submit and failed at start pointing at "line 1 column 9"
        (
            spec(&data, "fallbak = \"last\"\n"),
            "verifiers[1].fallbak",
            "verifiers[1].fallbak: unknown key; expected one of fallback, precision_digits, work_budget",
        ),
        (
            spec(&data, "precision_digits = 5000\n"),
            "verifiers[1].precision_digits",
            "verifiers[1].precision_digits: expected at most 1000, got 5000",
        ),
        (
            spec(&data, "[[verifiers]]\nplugin = \"http\"\nurl = \"http://127.0.0.1:9/\"\nretries = 99\n"),
            "verifiers[2].retries",
            "verifiers[2].retries: expected 0 to 10, got 99",
        ),
        (
            http_first(&data, "bearer_token_env = \"HOME\""),
            "verifiers[0].bearer_token_env",
            "verifiers[0].bearer_token_env: environment variable names are not accepted; ask the daemon's operator",
        ),
        // regression: the code verifier's options let a spec choose the interpreter the worker
        // runs and the directories it reads and writes
        (
            spec(&data, "[[verifiers]]\nplugin = \"code\"\nweight = 0.0\nwork_root = \"/etc\"\n"),
            "verifiers[2].work_root",
            "verifiers[2].work_root: a job spec cannot name a server path",
        ),
        (
            spec(&data, "[[verifiers]]\nplugin = \"code\"\nweight = 0.0\npython = \"/bin/sh\"\n"),
            "verifiers[2].python",
            "verifiers[2].python: a job spec cannot name a server path",
        ),
        (
            spec(&data, "[curriculum]\nplugin = \"frontier\"\ndecai = 0.5\n"),
            "curriculum.decai",
            "curriculum.decai: unknown key; expected one of band, prior_passes, prior_fails, decay, history",
        ),
        (
            spec(&data, "[curriculum]\nplugin = \"frontier\"\nband = [0.9, 0.1]\n"),
            "curriculum.band[1]",
            "curriculum.band[1]: expected a pass rate above band[0], at most 1, got 0.1",
        ),
    ];
    for (body, field, message) in &cases {
        let (status, answer) = submit(&daemon, TEAM_TOKEN, body, None);
        assert_eq!(status, 422, "{field}: {answer}\n{}", daemon.log());
        let error = &answer["error"];
        assert_eq!(error["code"], "cannot_run", "{answer}");
        assert_eq!(error["field"].as_str(), Some(*field), "{answer}");
        let got = error["message"].as_str().unwrap();
        assert!(got.starts_with(message), "{field}: {got:?} does not start with {message:?}");
        assert!(!got.contains("line 1") && !got.contains("column"), "{got}");
    }

    // regression: "environment variable X is not set" told a tenant which variables exist
    let refusal = |variable: &str| {
        submit(&daemon, TEAM_TOKEN, &http_first(&data, &format!("bearer_token_env = {variable:?}")), None)
    };
    assert!(std::env::var_os("HOME").is_some());
    assert_eq!(refusal("HOME"), refusal("RLVR_TEST_NO_SUCH_VARIABLE"));

    // Nothing was queued.
    let (_, jobs) = rlvr_tests::jobs::get(&daemon, TEAM_TOKEN, "/v1/jobs");
    assert_eq!(jobs["jobs"].as_array().map(Vec::len), Some(0), "{jobs}");

    // A verifier built before check_options: listed as such, and its options checked at submit
    // by creating it as its worker will (they used to fail the job when its worker started).
    let listing = daemon.get_json("/v1/plugins");
    let legacy = listing["plugins"].as_array().unwrap().iter().find(|p| p["id"] == "legacy@1.0.0").unwrap();
    assert_eq!(legacy["notes"], serde_json::json!([NOT_CHECKED_AT_SUBMIT]), "{legacy}");
    let legacy_spec = |line: &str| spec(&data, &format!("[[verifiers]]\nplugin = \"legacy\"\n{line}\n"));
    let (status, answer) = submit(&daemon, TEAM_TOKEN, &legacy_spec("scor = 2.0"), None);
    let error = &answer["error"];
    assert_eq!((status, error["field"].as_str()), (422, Some("verifiers[2]")), "{answer}");
    let message = error["message"].as_str().unwrap();
    assert!(message.contains("legacy@1.0.0 refused its options on this daemon: "), "{message}");
    assert!(message.contains("scor: unknown key; expected one of score"), "{message}");

    // Good specs still submit; the optimizer's answer is cached by plugin build and options.
    let timed = |body: &str| {
        let started = Instant::now();
        let (status, answer) = submit(&daemon, TEAM_TOKEN, body, None);
        assert_eq!(status, 201, "{answer}\n{}", daemon.log());
        started.elapsed()
    };
    let first = timed(&good.replace("kl_beta = 0.04", "kl_beta = 0.05"));
    let cached: Vec<Duration> =
        (0..5).map(|_| timed(&good.replace("kl_beta = 0.04", "kl_beta = 0.05"))).collect();
    let legacy_ok = timed(&legacy_spec(""));
    eprintln!(
        "submit latency: new optimizer options {first:?} (a worker process answers), the same again {cached:?} \
         (cached), a legacy verifier {legacy_ok:?}"
    );
    // Timings on a shared machine vary; a cached answer is still far below a process start.
    assert!(cached.iter().min().is_some_and(|fastest| *fastest < first), "{first:?} {cached:?}");
}
