//! The control plane and the CLI need no libtorch (issue 16): `rlvrd` and `rlvrctl` link none of
//! it, the CLI crate's dependency tree has no `torch-sys` (and its crate checks with no torch venv
//! in the environment), and `rlvrctl` run on a host without the torch venv submits, follows and
//! inspects jobs against a real daemon and runs verifier plugins itself. Only `rlvr-worker` links libtorch (checked too, so the test can
//! fail).

use std::fs;
use std::path::Path;
use std::process::{Command, Output};

use rlvr_tests::cli::text;
use rlvr_tests::{
    Daemon, PERMISSIVE_GATES, Redis, TEAM_TOKEN, arith_data, arith_grpo_spec, artifact, workspace_root,
};
use serde_json::Value;

/// The libraries whose presence means "links libtorch or CUDA".
const TORCH_LIBRARIES: [&str; 6] = ["libtorch", "libc10", "libcuda", "libcudart", "libnvrtc", "libcublas"];

/// The `NEEDED` entries of an ELF file's dynamic section (`readelf -d`).
fn needed(binary: &Path) -> Vec<String> {
    let output = Command::new("readelf").arg("-d").arg(binary).output().expect("run readelf");
    assert!(
        output.status.success(),
        "readelf -d {}: {}",
        binary.display(),
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter(|line| line.contains("(NEEDED)"))
        .filter_map(|line| Some(line.split('[').nth(1)?.trim_end_matches(']').to_owned()))
        .collect()
}

fn links_torch(binary: &Path) -> bool {
    needed(binary).iter().any(|library| TORCH_LIBRARIES.iter().any(|torch| library.starts_with(torch)))
}

/// The packages in `cargo tree -p <package>`'s normal and build dependencies.
fn dependency_tree(package: &str) -> String {
    let output = Command::new(env!("CARGO"))
        .args(["tree", "--offline", "--prefix", "none", "-e", "normal,build", "-p", package])
        .arg("--manifest-path")
        .arg(workspace_root().join("Cargo.toml"))
        .current_dir(workspace_root())
        .output()
        .expect("run cargo tree");
    assert!(output.status.success(), "cargo tree -p {package}: {}", String::from_utf8_lossy(&output.stderr));
    String::from_utf8(output.stdout).unwrap()
}

#[test]
fn rlvrd_and_rlvrctl_link_no_libtorch_and_the_cli_crate_depends_on_no_torch_sys() {
    for binary in ["rlvrd", "rlvrctl"] {
        let path = artifact(binary);
        assert!(!links_torch(&path), "{binary} links libtorch: {:?}", needed(&path));
    }
    assert!(links_torch(&artifact("rlvr-worker")), "the worker is the one that links libtorch");
    for package in ["rlvr-cli", "rlvr-daemon", "rlvr-client"] {
        let tree = dependency_tree(package);
        assert!(
            !tree.lines().any(|line| line.starts_with("torch-sys ")),
            "{package} depends on torch-sys:\n{tree}"
        );
    }
    assert!(dependency_tree("rlvr-worker").lines().any(|line| line.starts_with("torch-sys ")));
}

/// `rlvrctl`'s crate alone checked (`cargo check -p rlvr-cli`) in its own target directory with no
/// torch venv in the environment (no `LIBTORCH*`, no venv on `PATH`, no `LD_LIBRARY_PATH`): a
/// check runs every build script of the tree, so had torch-sys been in it, its build script would
/// have failed to find libtorch. A check and not a build: what a build adds is code generation and
/// the link, and what the binary links is read from the workspace's `rlvrctl` itself (below and in
/// the test above); a cold build of the crate alone took 155 s of CPU here, a cold check 110 s.
fn check_rlvrctl_without_torch() {
    let target = rlvr_tests::target_dir().join("no-torch");
    let path = std::env::var("PATH").unwrap_or_default();
    let venv = std::env::var("RLVR_VENV").unwrap_or_else(|_| "/nonexistent".to_owned());
    let path: Vec<&str> = path.split(':').filter(|dir| !dir.starts_with(&venv)).collect();
    let mut command = Command::new(env!("CARGO"));
    command
        .args(["check", "--offline", "--quiet", "-p", "rlvr-cli", "--target-dir"])
        .arg(&target)
        // The workspace where the tests were built from (a kept target directory's fixed link,
        // scripts/test.sh): the kept check of the last run is then fresh.
        .arg("--manifest-path")
        .arg(workspace_root().join("Cargo.toml"))
        .current_dir(workspace_root())
        .env("PATH", path.join(":"));
    for variable in [
        "LIBTORCH",
        "LIBTORCH_USE_PYTORCH",
        "LIBTORCH_LIB",
        "LIBTORCH_INCLUDE",
        "LD_LIBRARY_PATH",
        "PYTHON_SYS_EXECUTABLE",
        "CARGO_TARGET_DIR",
    ] {
        command.env_remove(variable);
    }
    let output = command.output().expect("run cargo check");
    assert!(output.status.success(), "rlvrctl does not build without torch: {}", text(&output));
}

/// Runs the torch-less `rlvrctl` with nothing but a system `PATH`, a home and `env`.
fn run(rlvrctl: &Path, args: &[&str], cwd: &Path, env: &[(&str, &str)]) -> Output {
    let mut command = Command::new(rlvrctl);
    command
        .args(args)
        .current_dir(cwd)
        .env_clear()
        .env("PATH", "/usr/local/bin:/usr/bin:/bin")
        .env("HOME", cwd)
        .env("XDG_CONFIG_HOME", cwd.join("no-config"));
    for (key, value) in env {
        command.env(key, value);
    }
    command.output().expect("run rlvrctl")
}

#[test]
fn rlvrctl_checked_and_run_without_the_torch_venv_submits_watches_and_verifies() {
    check_rlvrctl_without_torch();
    let rlvrctl = artifact("rlvrctl");
    assert!(!links_torch(&rlvrctl), "{:?}", needed(&rlvrctl));

    let redis = Redis::start();
    let daemon = Daemon::start_with(
        &["rlvr-optimizer-grpo", "rlvr-verifier-math"],
        &redis.url(),
        "[queue]\nheartbeat_ms = 500\nmissed_heartbeats = 6\nworker_threads = 1\n",
    );
    let dir = tempfile::tempdir().unwrap();
    let cwd = dir.path();
    let data = arith_data(cwd, &["--train", "32", "--heldout", "8", "--sft", "0"]);
    let spec = arith_grpo_spec(&data, "no-torch", "builtin:tiny-arith", 2, 2);
    fs::write(cwd.join("job.toml"), format!("{spec}\n{PERMISSIVE_GATES}")).unwrap();
    let env = [("RLVR_SERVER", daemon.url.as_str()), ("RLVR_TOKEN", TEAM_TOKEN)];

    let submitted = run(&rlvrctl, &["submit", "job.toml"], cwd, &env);
    assert_eq!(submitted.status.code(), Some(0), "{}", text(&submitted));
    let id = String::from_utf8(submitted.stdout).unwrap().trim().to_owned();
    let watched = run(&rlvrctl, &["watch", &id], cwd, &env);
    assert_eq!(watched.status.code(), Some(0), "published: {}\n{}", text(&watched), daemon.log());
    let status = run(&rlvrctl, &["--json", "status", &id], cwd, &env);
    let job: Value =
        serde_json::from_slice(&status.stdout).unwrap_or_else(|e| panic!("{e}: {}", text(&status)));
    assert_eq!((job["state"].as_str(), job["step"].as_u64()), (Some("published"), Some(2)), "{job}");

    // verify loads the verifier plugin itself: no daemon, no torch.
    let plugins = cwd.join("verifiers");
    fs::create_dir_all(&plugins).unwrap();
    rlvr_tests::drop_in(&rlvr_tests::plugin_lib("rlvr-verifier-math"), &plugins, "librlvr_verifier_math.so");
    fs::write(
        cwd.join("items.jsonl"),
        "{\"id\": \"a\", \"gold\": \"4\", \"pred\": \"\\\\boxed{4}\"}\n{\"id\": \"b\", \"gold\": \"4\", \"pred\": \"5\"}\n",
    )
    .unwrap();
    let plugin_dir = plugins.display().to_string();
    let verified = run(
        &rlvrctl,
        &["verify", "--plugin", "math", "--plugin-dir", &plugin_dir, "--jsonl", "items.jsonl"],
        cwd,
        &[],
    );
    assert_eq!(verified.status.code(), Some(0), "{}", text(&verified));
    let passed: Vec<bool> =
        rlvr_tests::json_lines(&verified.stdout).iter().map(|line| line["passed"] == true).collect();
    assert_eq!(passed, [true, false], "{}", text(&verified));
}
