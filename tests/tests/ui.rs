//! The web page at `/ui`, end to end: real Redis, real `rlvrd serve` with two teams' tokens, and
//! Debian's Chromium driven by Playwright (`tests/ui/drive.cjs`, installed by
//! `scripts/ui-browser.sh`). Team `tests` logs in, watches its running job's reward curve grow,
//! opens its gates, and is refused team `others`' job; the job page's screenshot goes to
//! `target/ui/ui-job.png`, and with `RLVR_UPDATE_SCREENSHOT=1` to the book's `docs/src/images/ui-job.png`.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use rlvr_protocol::job::JobState;
use rlvr_tests::jobs::{api, submit, submit_ok, wait_job};
use rlvr_tests::{
    Daemon, OTHER_TOKEN, PERMISSIVE_GATES, Redis, TEAM_TOKEN, arith_data, arith_grpo_spec, workspace_root,
};
use serde_json::Value;

const PLUGINS: [&str; 3] = ["rlvr-optimizer-grpo", "rlvr-verifier-math", "rlvr-verifier-text-similarity"];

/// Steps of the watched job: about 0.15 to 0.3 s each here, so the page, which needs about 2 s to
/// start and log in, sees it train for several seconds.
const STEPS: u32 = 40;

/// One CPU slot that a job fills (`memory_gb = 8`), so team `others`' job waits for ours and the
/// one being watched runs alone.
const CONFIG: &str = "[queue]\nworker_threads = 1\n[devices]\ncpu_slots = 1\ncpu_slot_memory_gb = 8\n";

/// A GRPO job of `team` on the arithmetic data, publishing to `line`: `steps` steps, held-out
/// scored every 5 (a curve of its own), gates that pass it (its gate table is what is looked at).
fn job(data: &Path, name: &str, team: &str, line: &str, steps: u32) -> String {
    arith_grpo_spec(data, name, "builtin:tiny-arith", steps, steps)
        .replace("team = \"tests\"", &format!("team = \"{team}\""))
        .replace("model_line = \"tiny-arith\"", &format!("model_line = \"{line}\""))
        .replace("[eval]\n", "[eval]\nevery_steps = 5\n")
        // Partial credit beside the exact answer, which the untrained built-in model rarely
        // gets: the reward curve the page draws (and the README's screenshot) moves.
        + "[[verifiers]]\nplugin = \"text-similarity\"\nmetric = \"fuzzy_match\"\npass_threshold = 0.99\n"
        + PERMISSIVE_GATES
        + "[resources]\nmemory_gb = 8\n"
}

/// Runs `scripts/ui-browser.sh`: the node_modules directory holding playwright-core.
fn install_browser() -> String {
    let started = Instant::now();
    let output =
        Command::new(workspace_root().join("scripts/ui-browser.sh")).output().expect("run ui-browser.sh");
    assert!(
        output.status.success(),
        "scripts/ui-browser.sh failed:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    eprintln!("browser and playwright-core ready in {:.1} s", started.elapsed().as_secs_f64());
    String::from_utf8(output.stdout).expect("utf-8 path").trim().to_owned()
}

#[test]
fn a_team_watches_its_job_grow_on_the_web_page_and_is_refused_another_teams() {
    let node_modules = install_browser();
    let redis = Redis::start();
    let daemon = Daemon::start_with(&PLUGINS, &redis.url(), CONFIG);
    let dir = tempfile::tempdir().unwrap();
    let data = arith_data(dir.path(), &[]);

    let ours = submit_ok(&daemon, &job(&data, "watched-on-the-page", "tests", "tiny-arith", STEPS));
    let (status, theirs) =
        submit(&daemon, OTHER_TOKEN, &job(&data, "another-teams", "others", "others-line", 2), None);
    assert_eq!(status, 201, "{theirs}");
    let theirs = theirs["id"].as_str().unwrap().to_owned();
    // The page is opened on a job that is training, so its curve has room to grow.
    wait_job(&daemon, &ours, Duration::from_secs(60), |job| job.state == JobState::Running);

    // Under target/ on every run; the README's copy only when asked (RLVR_UPDATE_SCREENSHOT=1), so
    // a test run leaves the checkout as it was.
    let screenshot = if std::env::var_os("RLVR_UPDATE_SCREENSHOT").is_some_and(|v| v == "1") {
        workspace_root().join("docs/src/images/ui-job.png")
    } else {
        rlvr_tests::target_dir().join("ui/ui-job.png")
    };
    std::fs::create_dir_all(screenshot.parent().unwrap()).unwrap();
    let started = Instant::now();
    // The Node.js scripts/ui-browser.sh chose (20 or newer), linked beside node_modules.
    let node = Path::new(&node_modules).with_file_name("node");
    let output = Command::new(node)
        .arg(workspace_root().join("tests/ui/drive.cjs"))
        .env("NODE_PATH", &node_modules)
        .env("RLVR_UI_URL", &daemon.url)
        .env("RLVR_UI_TOKEN", TEAM_TOKEN)
        .env("RLVR_UI_JOB", &ours)
        .env("RLVR_UI_STEPS", STEPS.to_string())
        .env("RLVR_UI_OTHER_JOB", &theirs)
        .env("RLVR_UI_SCREENSHOT", &screenshot)
        .output()
        .expect("run node tests/ui/drive.cjs");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "the browser script failed:\n{stderr}\ndaemon log:\n{}", daemon.log());
    eprintln!("browser script: {:.1} s", started.elapsed().as_secs_f64());
    let seen: Value = serde_json::from_slice(&output.stdout)
        .unwrap_or_else(|error| panic!("{error}: {}", String::from_utf8_lossy(&output.stdout)));
    let context = format!("{seen:#}");

    // The page itself: static, open, locked down.
    assert_eq!(seen["page"]["status"], 200, "{context}");
    assert!(seen["page"]["url"].as_str().unwrap().ends_with("/ui/"), "{context}");
    assert_eq!(seen["page"]["content_type"], "text/html; charset=utf-8", "{context}");
    assert_eq!(seen["page"]["nosniff"], "nosniff", "{context}");
    let csp = seen["page"]["csp"].as_str().unwrap_or_default();
    for directive in
        ["default-src 'none'", "script-src 'self'", "connect-src 'self'", "frame-ancestors 'none'"]
    {
        assert!(csp.contains(directive), "{directive} not in {csp:?}");
    }
    assert!(seen["wrong_token"].as_str().unwrap().contains("token refused"), "{context}");
    // Nothing went wrong in the page, and no API call went out without the token.
    assert_eq!(seen["console_errors"], serde_json::json!([]), "{context}");
    assert_eq!(seen["requests_without_token"], serde_json::json!([]), "{context}");
    // The only answers that were not a success: the wrong token's and team `others`' job's.
    let failed = serde_json::json!(["401 /v1/plugins", format!("404 /v1/jobs/{theirs}")]);
    assert_eq!(seen["failed_loads"], failed, "{context}");

    // The list: our job, not theirs; the filters narrow it.
    let listed: Vec<&str> = seen["listed"].as_array().unwrap().iter().filter_map(Value::as_str).collect();
    assert_eq!(listed, [ours.as_str()], "{context}");
    assert_eq!(seen["rows_filtered_out"], 0, "{context}");
    assert_eq!(seen["rows_filtered_by_id"], serde_json::json!([ours]), "{context}");
    assert_eq!(seen["rows_published_filter"], serde_json::json!([]), "{context}");

    // The reward curve grew while the job ran: more points at a later sample, both running.
    let samples = seen["samples"].as_array().unwrap();
    let running: Vec<i64> = samples
        .iter()
        .filter(|sample| sample["state"] == "running")
        .map(|sample| sample["points"].as_i64().unwrap())
        .collect();
    let grew = running.windows(2).filter(|pair| pair[1] > pair[0]).count();
    assert!(grew >= 3, "the reward curve grew {grew} times while running: {running:?}\n{context}");
    // And, the job over, every step is on it, and the other curves are there.
    assert_eq!(seen["final_state"], "published", "{context}");
    // Its summary says what kind of job it is and which version of its line it published.
    assert_eq!(seen["summary"]["kind"], "online groups", "{context}");
    assert_eq!(seen["summary"]["published"], "tiny-arith version 1", "{context}");
    assert_eq!(
        (seen["nav_visible_at_login"].as_bool(), seen["nav_visible_logged_in"].as_bool()),
        (Some(false), Some(true)),
        "the navigation shows once logged in, not on the login screen: {context}"
    );
    // Every series of a chart in a colour of its own, and the chart's own figure (its first
    // series) drawn last, over the others.
    for (chart, drawn) in seen["chart_colours"].as_object().unwrap() {
        let drawn: Vec<(String, String)> = serde_json::from_value(drawn.clone()).unwrap();
        let colours: std::collections::BTreeSet<&String> = drawn.iter().map(|(_, colour)| colour).collect();
        assert_eq!(colours.len(), drawn.len(), "{chart}: {drawn:?}");
        assert!(colours.iter().all(|colour| colour.starts_with('#')), "{chart}: {drawn:?}");
    }
    let reward_drawn: Vec<(String, String)> =
        serde_json::from_value(seen["chart_colours"]["reward"].clone()).unwrap();
    assert_eq!(reward_drawn.last().map(|(name, _)| name.as_str()), Some("reward"), "{reward_drawn:?}");
    let charts = &seen["charts"];
    assert_eq!(charts["reward"]["reward"], STEPS, "{context}");
    assert_eq!(charts["reward"]["component math"], STEPS, "{context}");
    assert_eq!(charts["reward"]["component text-similarity"], STEPS, "{context}");
    assert_eq!(charts["length"]["length"], STEPS, "{context}");
    assert_eq!(charts["step-time"]["step time"], STEPS, "{context}");
    assert_eq!(charts["kl"]["kl"], STEPS, "{context}");
    // Before the first step, then every 5 (the last step's is the final evaluation).
    assert_eq!(charts["heldout"]["held-out"], STEPS / 5 + 1, "{context}");
    let events: Vec<&str> = seen["events"].as_array().unwrap().iter().filter_map(Value::as_str).collect();
    assert_eq!(events.first(), Some(&"queued"), "{context}");
    assert_eq!(events.last(), Some(&"published"), "{context}");
    // The log, followed from the first step to the last, without its terminal colours.
    assert_eq!(seen["log"]["first_step"], true, "{context}");
    assert_eq!(seen["log"]["last_step"], true, "{context}");
    assert_eq!(seen["log"]["escapes"], false, "{context}");

    // The gate table: held-out gain measured, against its threshold, with its interval.
    let gates = seen["gates"].as_array().unwrap();
    let gain = gates.iter().find(|row| row["name"] == "heldout_gain").unwrap_or_else(|| panic!("{context}"));
    assert_eq!(gain["status"], "pass", "{context}");
    let cells: Vec<&str> = gain["cells"].as_array().unwrap().iter().filter_map(Value::as_str).collect();
    assert_eq!(cells[..2], ["heldout_gain", "pass"], "{context}");
    assert!(cells[2].parse::<f64>().is_ok(), "measured {:?}", cells[2]);
    assert_eq!(cells[3], ">= -1", "{context}");
    assert!(cells[4].contains("95%") && cells[4].contains("16 prompts"), "interval {:?}", cells[4]);
    // The page shows what the API says, row for row.
    let report = api(&daemon, Some(TEAM_TOKEN)).job(&ours).unwrap().gates.expect("a gate report");
    let names: Vec<&str> = gates.iter().filter_map(|row| row["name"].as_str()).collect();
    let expected: Vec<&str> = report.criteria.iter().map(|criterion| criterion.name.as_str()).collect();
    assert_eq!(names, expected, "{context}");

    // regression guard: team `others`' job by its URL is the API's 404, shown as such.
    assert_eq!(seen["other_team"]["status"], 404, "{context}");
    assert_eq!(seen["other_team"]["code"], "not_found", "{context}");

    // Plugins, model lines and the published version's manifest.
    let mut plugins: Vec<&str> =
        seen["plugins"].as_array().unwrap().iter().filter_map(Value::as_str).collect();
    plugins.sort_unstable();
    assert_eq!(plugins.len(), 3, "{context}");
    assert!(
        plugins[0].starts_with("grpo@")
            && plugins[1].starts_with("math@")
            && plugins[2].starts_with("text-similarity@"),
        "{plugins:?}"
    );
    assert_eq!(seen["lines"], serde_json::json!([{"line": "tiny-arith", "versions": ["v1"]}]), "{context}");
    assert_eq!(seen["manifest"]["status"], 200, "{context}");
    assert_eq!(seen["manifest"]["json"]["job_id"], ours, "{context}");

    let png = std::fs::read(&screenshot).unwrap();
    assert!(png.starts_with(b"\x89PNG") && png.len() > 20_000, "{} bytes", png.len());
    eprintln!("timings: {}", seen["timings"]);
}
