//! The `rlvr` Python package (`python/`) as a user gets it: installed with `pip install ./python`
//! into a fresh venv with the network forbidden, then its unittest suite (`python/tests`) run
//! against a real `rlvrd serve` and Redis with two teams' tokens, plus a second daemon whose
//! per-team rate limit the busy-answer retries meet.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Instant;

use rlvr_tests::cli::text;
use rlvr_tests::{Daemon, OTHER_TOKEN, Redis, TEAM_TOKEN, arith_data, workspace_root};

const PLUGINS: [&str; 2] = ["rlvr-optimizer-grpo", "rlvr-verifier-math"];
const QUEUE: &str = "[queue]\nheartbeat_ms = 500\nmissed_heartbeats = 6\nworker_threads = 1\n";

/// The project venv's interpreter (Python 3.11, what setup.sh installs), else the system's.
fn base_python() -> PathBuf {
    match std::env::var_os("RLVR_VENV") {
        Some(venv) => Path::new(&venv).join("bin/python"),
        None => {
            std::env::var_os("PYTHON_SYS_EXECUTABLE").map_or_else(|| PathBuf::from("python3"), PathBuf::from)
        }
    }
}

fn check(output: &Output, what: &str) {
    assert!(output.status.success(), "{what}: {}", text(output));
}

#[test]
fn the_python_package_installs_offline_and_its_tests_pass_against_a_real_daemon() {
    let dir = tempfile::tempdir().unwrap();
    let venv = dir.path().join("venv");
    let started = Instant::now();
    let made = Command::new(base_python()).args(["-m", "venv"]).arg(&venv).output().unwrap();
    check(&made, "python -m venv");
    let python = venv.join("bin/python");

    // What the README says, from the checkout's root; PIP_NO_INDEX forbids the network, so the
    // install (its build backend included) needs nothing downloaded.
    let install = Command::new(venv.join("bin/pip"))
        .args(["install", "./python"])
        .current_dir(workspace_root())
        .env("PIP_NO_INDEX", "1")
        .env("PIP_DISABLE_PIP_VERSION_CHECK", "1")
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .output()
        .unwrap();
    check(&install, "pip install ./python");
    let installed = started.elapsed();

    let redis = Redis::start();
    let daemon = Daemon::start_with_api(&PLUGINS, &redis.url(), "", QUEUE);
    // A second daemon, with its own Redis, whose teams may send 60 requests a minute.
    let limited_redis = Redis::start();
    let limited = Daemon::start_with_api(&[], &limited_redis.url(), "rate_limit_per_minute = 60\n", "");
    let data = arith_data(dir.path(), &[]);
    let source = workspace_root().join("python");
    let tests = source.join("tests");
    let run = Command::new(&python)
        .args(["-m", "unittest", "discover", "-v", "-s"])
        .arg(&tests)
        .arg("-t")
        .arg(&tests)
        // Not the checkout: the package imported is the installed one.
        .current_dir(dir.path())
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .env_remove("PYTHONPATH")
        .env("XDG_CONFIG_HOME", dir.path().join("no-config"))
        .env("RLVR_SERVER", &daemon.url)
        .env("RLVR_TOKEN", TEAM_TOKEN)
        .env("RLVR_OTHER_TOKEN", OTHER_TOKEN)
        .env("RLVR_TEST_DATA", &data)
        .env("RLVR_LIMITED_SERVER", &limited.url)
        .env("RLVR_PYTHON_SOURCE", &source)
        .output()
        .unwrap();
    let report = text(&run);
    assert_eq!(run.status.code(), Some(0), "{report}\n{}", daemon.log());
    let stderr = String::from_utf8_lossy(&run.stderr);
    // Every test ran: a skipped one (its environment missing) would pass without testing.
    assert!(stderr.trim_end().ends_with("\nOK"), "{report}");
    let ran: usize = stderr
        .lines()
        .find_map(|line| line.strip_prefix("Ran ")?.split(' ').next()?.parse().ok())
        .unwrap_or_else(|| panic!("{report}"));
    assert!(ran >= 25, "{ran} tests ran: {report}");
    eprintln!(
        "venv and install: {:.1} s; {ran} tests: {:.1} s",
        installed.as_secs_f64(),
        started.elapsed().as_secs_f64()
    );

    // The venv holds the package and no dependency: the standard library is all it needs.
    let listed = Command::new(&python).args(["-m", "pip", "list", "--format=freeze"]).output().unwrap();
    let listed = String::from_utf8_lossy(&listed.stdout).into_owned();
    let mut packages: Vec<&str> = listed.lines().filter_map(|line| line.split("==").next()).collect();
    packages.sort_unstable();
    packages.retain(|name| !["pip", "setuptools"].contains(name));
    assert_eq!(packages, ["rlvr"], "{listed}");
    let site = fs::read_dir(venv.join("lib")).unwrap().next().unwrap().unwrap().path().join("site-packages");
    assert!(site.join("rlvr/py.typed").is_file(), "the package is marked typed");
}
