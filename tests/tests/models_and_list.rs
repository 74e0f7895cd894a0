//! `rlvrctl` against a real `rlvrd serve` and Redis for what a team reaches for after its first
//! job: `models` (lines, versions, a manifest, a download checked file by file against it),
//! `list --since/--cursor/--all` (pages that neither repeat nor skip a job), `submit --dry-run`
//! (checked, printed, nothing queued), `init`, `gates` on a job that ended ungated, and worker
//! logs without colour codes.

use std::fs;
use std::path::Path;
use std::process::Output;

use rlvr_tests::cli::{run, text};
use rlvr_tests::jobs::client;
use rlvr_tests::{
    Daemon, OTHER_TOKEN, PERMISSIVE_GATES, Redis, TEAM_TOKEN, arith_data, arith_grpo_spec, artifact,
};
use serde_json::Value;
use sha2::Digest;

const PLUGINS: [&str; 2] = ["rlvr-optimizer-grpo", "rlvr-verifier-math"];
const QUEUE: &str = "[queue]\nheartbeat_ms = 500\nmissed_heartbeats = 6\nworker_threads = 1\n";

fn json(output: &Output) -> Value {
    assert_eq!(output.status.code(), Some(0), "{}", text(output));
    serde_json::from_slice(&output.stdout).unwrap_or_else(|error| panic!("{error}: {}", text(output)))
}

fn ids(list: &Value) -> Vec<String> {
    list["jobs"].as_array().unwrap().iter().map(|job| job["id"].as_str().unwrap().to_owned()).collect()
}

fn write_spec(dir: &Path, name: &str, steps: u32) -> String {
    let spec = arith_grpo_spec(Path::new("data"), name, "builtin:tiny-arith", steps, 2);
    fs::write(dir.join(format!("{name}.toml")), format!("{spec}\n{PERMISSIVE_GATES}")).unwrap();
    format!("{name}.toml")
}

#[test]
fn a_team_lists_pages_downloads_versions_and_dry_runs_specs_with_rlvrctl() {
    let redis = Redis::start();
    let daemon = Daemon::start_with(&PLUGINS, &redis.url(), QUEUE);
    let dir = tempfile::tempdir().unwrap();
    let cwd = dir.path();
    arith_data(cwd, &[]);
    let rlvrctl = artifact("rlvrctl");
    let env = [("RLVR_SERVER", daemon.url.as_str()), ("RLVR_TOKEN", TEAM_TOKEN)];
    let others = [("RLVR_SERVER", daemon.url.as_str()), ("RLVR_TOKEN", OTHER_TOKEN)];
    let ctl = |args: &[&str]| run(&rlvrctl, args, cwd, &env);

    // A dry run checks and prints the spec as the job would keep it, and queues nothing.
    let spec = write_spec(cwd, "first", 4);
    let checked = json(&ctl(&["--json", "submit", "--dry-run", &spec]));
    assert_eq!(checked["job"]["name"], "first", "{checked}");
    assert!(checked["resources"]["memory_gb"].as_f64().unwrap() > 0.0, "filled from the estimate: {checked}");
    let printed = ctl(&["submit", "--dry-run", &spec]);
    assert_eq!(printed.status.code(), Some(0), "{}", text(&printed));
    assert!(String::from_utf8_lossy(&printed.stdout).contains("[optimizer]"), "TOML: {}", text(&printed));
    assert!(String::from_utf8_lossy(&printed.stderr).contains("nothing was queued"));
    assert!(ids(&json(&ctl(&["--json", "list"]))).is_empty(), "a dry run queues nothing");
    let bad = cwd.join("bad.toml");
    fs::write(
        &bad,
        fs::read_to_string(cwd.join(&spec)).unwrap().replace("max_new_tokens = 5", "max_new_tokens = 0"),
    )
    .unwrap();
    let refused = ctl(&["submit", "--dry-run", "bad.toml"]);
    assert_eq!(refused.status.code(), Some(2), "{}", text(&refused));
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("rollout.max_new_tokens"),
        "{}",
        text(&refused)
    );

    // Three published jobs, then a cancelled one.
    let mut submitted = Vec::new();
    for name in ["first", "second", "third"] {
        let spec = write_spec(cwd, name, 4);
        let output = ctl(&["submit", "--wait", &spec]);
        assert_eq!(output.status.code(), Some(0), "{}\n{}", text(&output), daemon.log());
        submitted.push(String::from_utf8_lossy(&output.stdout).lines().next().unwrap().trim().to_owned());
    }
    let spec = write_spec(cwd, "cancelled", 400);
    let cancelled = String::from_utf8_lossy(&ctl(&["submit", &spec]).stdout).trim().to_owned();
    assert_eq!(ctl(&["cancel", &cancelled]).status.code(), Some(0));
    let newest_first: Vec<String> =
        [cancelled.clone()].into_iter().chain(submitted.iter().rev().cloned()).collect();

    // Pages of one: each page's cursor leads to the next job, none twice, none skipped.
    let mut paged = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let mut args = vec!["--json", "list", "--limit", "1"];
        if let Some(cursor) = &cursor {
            args.extend(["--cursor", cursor.as_str()]);
        }
        let page = json(&ctl(&args));
        paged.extend(ids(&page));
        match page["next"].as_str() {
            Some(next) => cursor = Some(next.to_owned()),
            None => break,
        }
    }
    assert_eq!(paged, newest_first);
    assert_eq!(ids(&json(&ctl(&["--json", "list", "--limit", "2", "--all"]))), newest_first);
    let first_page = ctl(&["list", "--limit", "2"]);
    assert!(
        String::from_utf8_lossy(&first_page.stderr).contains("more: rlvrctl list --cursor"),
        "{}",
        text(&first_page)
    );
    assert_eq!(ids(&json(&ctl(&["--json", "list", "--since", "1h"]))), newest_first);
    assert!(ids(&json(&ctl(&["--json", "list", "--since", "2100-01-01T00:00:00Z"]))).is_empty());
    assert_eq!(
        ids(&json(&ctl(&["--json", "list", "--state", "published", "--limit", "1", "--all"]))),
        submitted.iter().rev().cloned().collect::<Vec<_>>()
    );
    let raw = |token: &str, path: &str| {
        let response = client().get(format!("{}{path}", daemon.url)).bearer_auth(token).send().unwrap();
        let status = response.status().as_u16();
        (status, response.json::<Value>().unwrap_or(Value::Null))
    };
    let (status, answer) = raw(TEAM_TOKEN, "/v1/jobs?cursor=not-a-cursor");
    assert_eq!((status, answer["error"]["field"].as_str()), (400, Some("cursor")), "{answer}");
    // Another team's list is its own: empty.
    assert!(ids(&json(&run(&rlvrctl, &["--json", "list"], cwd, &others))).is_empty());

    // gates on a job that ended without being gated says why, exit 1.
    let gates = ctl(&["gates", &cancelled]);
    assert_eq!(gates.status.code(), Some(1), "{}", text(&gates));
    assert!(String::from_utf8_lossy(&gates.stderr).contains("was cancelled at step"), "{}", text(&gates));

    // models: the line, its versions, a manifest.
    let lines = ctl(&["models"]);
    assert!(String::from_utf8_lossy(&lines.stdout).contains("tiny-arith"), "{}", text(&lines));
    let versions = ctl(&["models", "tiny-arith"]);
    let table = String::from_utf8_lossy(&versions.stdout).into_owned();
    assert_eq!(versions.status.code(), Some(0), "{}", text(&versions));
    for id in &submitted {
        assert!(table.contains(id.as_str()), "version of job {id} listed: {table}");
    }
    let manifest = json(&ctl(&["--json", "models", "tiny-arith", "latest"]));
    assert_eq!(
        (manifest["version"].as_u64(), manifest["job_id"].as_str()),
        (Some(3), Some(submitted[2].as_str()))
    );
    let files = manifest["files"].as_object().unwrap().clone();
    assert!(files.contains_key("model.safetensors"), "{manifest}");

    // --download: every file, each equal to the manifest's sha256, and manifest.json.
    let download = ctl(&["models", "tiny-arith", "2", "--download", "v2"]);
    assert_eq!(download.status.code(), Some(0), "{}", text(&download));
    let manifest_2 = json(&ctl(&["--json", "models", "tiny-arith", "2"]));
    for (name, sha) in manifest_2["files"].as_object().unwrap() {
        let bytes = fs::read(cwd.join("v2").join(name)).unwrap();
        assert_eq!(hex::encode(sha2::Sha256::digest(&bytes)), sha.as_str().unwrap(), "{name}");
    }
    let kept: Value = serde_json::from_slice(&fs::read(cwd.join("v2/manifest.json")).unwrap()).unwrap();
    assert_eq!(kept, manifest_2);
    let again = ctl(&["models", "tiny-arith", "2", "--download", "v2"]);
    assert_eq!(again.status.code(), Some(2), "a non-empty target is refused: {}", text(&again));

    // A file that differs from its manifest on the daemon's side: refused, nothing left behind.
    let published = daemon.state.join("registry/tiny-arith/1/config.json");
    assert!(published.is_file(), "the published version's files: {}", published.display());
    fs::write(&published, b"{\"tampered\": true}").unwrap();
    let tampered = ctl(&["models", "tiny-arith", "1", "--download", "v1"]);
    assert_eq!(tampered.status.code(), Some(2), "{}", text(&tampered));
    assert!(
        String::from_utf8_lossy(&tampered.stderr).contains("config.json: SHA-256"),
        "{}",
        text(&tampered)
    );
    assert!(!cwd.join("v1").exists());
    let leftovers: Vec<_> = fs::read_dir(cwd)
        .unwrap()
        .flatten()
        .filter(|entry| entry.file_name().to_string_lossy().starts_with(".rlvr-download"))
        .collect();
    assert!(leftovers.is_empty(), "no staging directory is left: {leftovers:?}");

    // Another team does not see the line, its versions or their files.
    let hidden = run(&rlvrctl, &["models", "tiny-arith", "latest"], cwd, &others);
    assert_eq!(hidden.status.code(), Some(2), "{}", text(&hidden));
    assert_eq!(raw(OTHER_TOKEN, "/v1/model-lines/tiny-arith/versions/1/files/model.safetensors").0, 404);
    assert_eq!(raw(TEAM_TOKEN, "/v1/model-lines/tiny-arith/versions/1/files/model.safetensors").0, 200);
    // Only a file the manifest names is served: no path the request makes up.
    for path in ["..%2F..%2Fline.json", "manifest.json", "..", "nope", "%2Fetc%2Fpasswd"] {
        let (status, _) = raw(TEAM_TOKEN, &format!("/v1/model-lines/tiny-arith/versions/1/files/{path}"));
        assert_eq!(status, 404, "{path}");
    }
    assert_eq!(raw(TEAM_TOKEN, "/v1/model-lines/tiny-arith/versions/v1").0, 400);

    // The worker's log (its stderr, a file) carries no colour codes.
    let logs = ctl(&["logs", "--all", &submitted[0]]);
    assert_eq!(logs.status.code(), Some(0), "{}", text(&logs));
    assert!(!logs.stdout.is_empty() && !logs.stdout.contains(&0x1b), "{}", text(&logs));

    // init writes a runnable example with its data, which passes the dry run.
    let init = ctl(&["init", "sft", "mine"]);
    assert_eq!(init.status.code(), Some(0), "{}", text(&init));
    assert!(cwd.join("mine/sft.toml").is_file() && cwd.join("mine/data").is_dir());
    let unknown = ctl(&["init", "nope"]);
    assert_eq!(unknown.status.code(), Some(2), "{}", text(&unknown));
    assert!(String::from_utf8_lossy(&unknown.stderr).contains("grpo"), "names the kinds: {}", text(&unknown));
}
