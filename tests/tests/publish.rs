//! Publishing a checkpoint into a model line (design.md §1 "Published checkpoint"), with real
//! processes: two publishers of one line at once never take the same version nor leave half a
//! checkpoint, and a publisher killed with SIGKILL mid-copy leaves no numbered version behind;
//! the job's retry publishes it exactly once.
//!
//! The publishers are this test binary run again as a child (`publisher` below, which does
//! nothing unless `RLVR_TEST_PUBLISH` is set) calling the daemon's own `publish::publish`.

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use rlvr_daemon::jobs::publish;
use rlvr_protocol::gates::{GateReport, Manifest};
use rlvr_protocol::spec::JobSpec;
use rlvr_protocol::worker::Outcome;
use serde_json::Value;
use sha2::{Digest, Sha256};

/// The child side: publishes `RLVR_TEST_PUBLISH_COUNT` versions as jobs `<prefix>-<i>`.
#[test]
fn publisher() {
    let Ok(prefix) = std::env::var("RLVR_TEST_PUBLISH") else { return };
    let line = PathBuf::from(std::env::var("RLVR_TEST_PUBLISH_LINE").unwrap());
    let model = PathBuf::from(std::env::var("RLVR_TEST_PUBLISH_MODEL").unwrap());
    let count: usize = std::env::var("RLVR_TEST_PUBLISH_COUNT").unwrap().parse().unwrap();
    for i in 0..count {
        let job = format!("{prefix}-{i}");
        publish::publish(&line, &model, manifest(&job)).unwrap();
    }
}

/// The manifest of job `job`, of a run that trained nothing (publishing fills in its version and
/// files).
fn manifest(job: &str) -> Manifest {
    let spec = JobSpec::from_toml(
        "[job]\nname = \"a\"\nteam = \"t\"\nmodel_line = \"line\"\n[model]\npolicy = \"builtin:tiny-arith\"\n\
         [data]\ntrain = \"/t.jsonl\"\n[optimizer]\nplugin = \"sft\"\n[budget]\nmax_steps = 2\n",
    )
    .unwrap();
    Manifest::new(job, &spec, &Outcome::default(), GateReport::new(None, Vec::new()), String::new())
}

/// [`publisher`]'s name as the test binary knows it: its path below the crate (`publish::publisher`
/// in the integration binary), which `--exact` must match or the child runs nothing.
fn publisher_test_name() -> String {
    let module = module_path!().split_once("::").map_or("", |(_crate, module)| module);
    format!("{module}::publisher")
}

fn spawn_publisher(line: &Path, model: &Path, prefix: &str, count: usize) -> Child {
    Command::new(std::env::current_exe().unwrap())
        .args(["--exact", &publisher_test_name(), "--test-threads", "1", "--nocapture"])
        .env("RLVR_TEST_PUBLISH", prefix)
        .env("RLVR_TEST_PUBLISH_LINE", line)
        .env("RLVR_TEST_PUBLISH_MODEL", model)
        .env("RLVR_TEST_PUBLISH_COUNT", count.to_string())
        .stdout(Stdio::null())
        .spawn()
        .unwrap()
}

/// A model directory whose weights file is `mb` MiB of varied bytes.
fn model_dir(root: &Path, mb: usize) -> PathBuf {
    let model = root.join("model");
    fs::create_dir_all(&model).unwrap();
    fs::write(model.join("config.json"), r#"{"model_type": "llama"}"#).unwrap();
    fs::write(model.join("tokenizer.json"), "{}").unwrap();
    let weights: Vec<u8> = (0..mb << 20).map(|i| (i * 31 % 251) as u8).collect();
    fs::write(model.join("model.safetensors"), weights).unwrap();
    model
}

/// Every numbered version of `line` is whole: a manifest whose files all match their sha256.
/// Returns the job id of each version, by version.
fn whole_versions(line: &Path) -> Vec<(u64, String)> {
    let mut found = Vec::new();
    // Killed before it made the line's directory: nothing published.
    let Ok(entries) = fs::read_dir(line) else { return found };
    for entry in entries.flatten() {
        let Some(version) = entry.file_name().to_str().and_then(|n| n.parse::<u64>().ok()) else { continue };
        let manifest: Value = serde_json::from_slice(&fs::read(entry.path().join("manifest.json")).unwrap())
            .unwrap_or_else(|e| panic!("version {version}'s manifest: {e}"));
        let files = manifest["files"].as_object().unwrap();
        assert_eq!(files.len(), 3, "version {version}: {files:?}");
        for (file, sha) in files {
            let bytes = fs::read(entry.path().join(file)).unwrap();
            assert_eq!(sha, &hex::encode(Sha256::digest(&bytes)), "version {version} {file}");
        }
        assert_eq!(manifest["version"], version);
        found.push((version, manifest["job_id"].as_str().unwrap().to_owned()));
    }
    found.sort();
    found
}

#[test]
fn two_publishers_of_one_line_never_take_one_version_nor_leave_half_a_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let model = model_dir(dir.path(), 4);
    let line = dir.path().join("registry/line");
    let mut children = [spawn_publisher(&line, &model, "A", 12), spawn_publisher(&line, &model, "B", 12)];
    for child in &mut children {
        assert!(child.wait().unwrap().success());
    }
    let versions = whole_versions(&line);
    let numbers: Vec<u64> = versions.iter().map(|(v, _)| *v).collect();
    assert_eq!(numbers, (1..=24).collect::<Vec<_>>(), "versions 1 to 24, none skipped or shared");
    let jobs: BTreeSet<&str> = versions.iter().map(|(_, job)| job.as_str()).collect();
    assert_eq!(jobs.len(), 24, "each job published once");
    let staging: Vec<_> = fs::read_dir(&line)
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with(".staging"))
        .collect();
    assert!(staging.is_empty(), "{staging:?}");
}

#[test]
fn a_publisher_killed_mid_publish_leaves_no_half_version_and_the_retry_publishes_once() {
    let dir = tempfile::tempdir().unwrap();
    let model = model_dir(dir.path(), 96);
    let line = dir.path().join("registry/line");
    // Kill before the publisher starts, as soon as its staging directory appears, and 40 ms into
    // its copy and hashing (about 150 ms for 96 MiB here).
    let mut caught_mid_publish = 0;
    for (round, after_staging_ms) in [None, Some(0u64), Some(40)].into_iter().enumerate() {
        let job = format!("K{round}");
        let staging = line.join(format!(".staging-{job}-0"));
        let mut child = spawn_publisher(&line, &model, &job, 1);
        match after_staging_ms {
            None => std::thread::sleep(Duration::from_millis(5)),
            Some(ms) => {
                // A tight poll: the whole publish takes about 150 ms.
                let started = std::time::Instant::now();
                while !staging.exists() {
                    assert!(started.elapsed() < Duration::from_secs(30), "never staged");
                    std::thread::sleep(Duration::from_millis(1));
                }
                std::thread::sleep(Duration::from_millis(ms));
            }
        }
        kill9(child.id());
        let _ = child.wait();
        caught_mid_publish += usize::from(staging.exists());
        // Whatever the moment: only whole versions, at most one of this job.
        let before = whole_versions(&line);
        assert!(before.iter().filter(|(_, j)| j == &format!("{job}-0")).count() <= 1, "{before:?}");
        // The daemon gates the job again after its restart: one version of it, whole.
        let mut retry = spawn_publisher(&line, &model, &job, 1);
        assert!(retry.wait().unwrap().success());
        let after = whole_versions(&line);
        assert_eq!(after.iter().filter(|(_, j)| j == &format!("{job}-0")).count(), 1, "{after:?}");
        assert_eq!(after.len(), round + 1, "{after:?}");
        assert_eq!(after.last().unwrap().1, format!("{job}-0"), "{after:?}");
        assert!(!staging.exists(), "the retry cleared the staging");
    }
    assert!(caught_mid_publish > 0, "no kill landed mid-publish: the test would prove little");
}

/// SIGKILL, as an operator's `kill -9` or the OOM killer.
fn kill9(pid: u32) {
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), nix::sys::signal::Signal::SIGKILL)
        .unwrap();
}
