//! The web page at `/ui`, end to end: real Redis, real `rlvrd serve` with two teams' tokens, and
//! Debian's Chromium driven by Playwright (`tests/ui/drive.cjs`, installed by
//! `scripts/ui-browser.sh`). Team `tests` logs in, watches its running job's reward curve grow,
//! opens its gates, and is refused team `others`' job; the job page's screenshot goes to
//! `target/ui/ui-job.png`, and with `RLVR_UPDATE_SCREENSHOT=1` to the book's `docs/src/images/ui-job.png`.
//!
//! The watched job is one that learns, judged by the default gates, so the page (and the book's
//! screenshot) shows what a team sees when training works: the learning test's recipe
//! (`tests/data/learning/`, notes in `learning.rs`), shortened — an SFT cold start of 200 steps
//! run by `rlvr-worker run` before the daemon starts (held-out 0 → about 0.5), declared to the
//! daemon as the base model `arith-sft`, then LoRA GRPO from it for 40 steps (about 0.5 → 0.66 on
//! 200 held-out prompts here). The premise, that it learned, is checked first.
//!
//! The same daemon serves the book at `/docs` (`api.docs_dir`, built here by the real mdBook):
//! the browser opens its first page, whose screenshot goes to `target/ui/book-first-page.png` (the
//! book's `docs/src/images/book-first-page.png` with `RLVR_UPDATE_SCREENSHOT=1`), and follows a
//! link of its table of contents; its inline scripts run under the book's Content-Security-Policy.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use rlvr_protocol::job::JobState;
use rlvr_tests::jobs::{api, submit, submit_ok, wait_job};
use rlvr_tests::{
    ADDITION_DATA, ADDITION_LORA, Daemon, OTHER_TOKEN, PERMISSIVE_GATES, Redis, TEAM_TOKEN, arith_data,
    arith_grpo_spec, build_book, changed, worker_command, worker_plugins, workspace_root,
};
use serde_json::Value;

const PLUGINS: [&str; 3] = ["rlvr-optimizer-grpo", "rlvr-verifier-math", "rlvr-verifier-text-similarity"];

/// Steps of the watched job: about 0.3 to 0.5 s each here, so the page, which needs about 2 s to
/// start and log in, sees it train for several seconds.
const STEPS: u32 = 40;

/// One CPU slot that a job fills (`memory_gb = 8`), so team `others`' job waits for ours and the
/// one being watched runs alone; the cold start's model as the base model `arith-sft`.
fn config(cold_start: &Path) -> String {
    format!(
        "[queue]\nworker_threads = 1\n[devices]\ncpu_slots = 1\ncpu_slot_memory_gb = 8\n\
         [[tenancy.base_models]]\nname = \"arith-sft\"\npath = {:?}\n",
        cold_start.display().to_string()
    )
}

/// The learning test's SFT cold start for 200 steps, by `rlvr-worker run`: its model directory.
fn cold_start(dir: &Path, data: &Path) -> std::path::PathBuf {
    let spec = dir.join("sft.toml");
    let text = changed(include_str!("../data/learning/sft.toml"), &[("max_steps = 300", "max_steps = 200")]);
    std::fs::write(&spec, text.replace("{data}", &data.display().to_string())).unwrap();
    let output =
        worker_command(&spec, &dir.join("sft"), &worker_plugins(dir), &["--threads", "1"]).output().unwrap();
    assert!(output.status.success(), "the cold start failed: {}", String::from_utf8_lossy(&output.stderr));
    let outcome: Value = serde_json::from_slice(&output.stdout).unwrap();
    let (before, after) =
        (outcome["heldout_before"].as_f64().unwrap(), outcome["heldout_after"].as_f64().unwrap());
    assert!(
        after >= before + 0.2,
        "premise: the cold start did not learn: held-out {before:.3} → {after:.3}"
    );
    Path::new(outcome["checkpoint"].as_str().unwrap()).join("model")
}

/// The watched job: the learning test's GRPO job with its LoRA adapters (`learning.rs`), from the
/// cold start, `STEPS` steps, held-out scored every 5 on all 200 prompts (a curve of its own), the
/// default gates. A text-similarity grader at weight 0 shows a component of its own on the
/// reward chart without changing the reward.
fn watched_job(data: &Path) -> String {
    changed(
        include_str!("../data/learning/grpo.toml"),
        &[
            ("name = \"arith-grpo\"", "name = \"watched-on-the-page\""),
            ("policy = \"{policy}\"", &format!("policy = \"base:arith-sft\"\n{ADDITION_LORA}")),
            ("lr = 5e-4", "lr = 2e-3"),
            // A KL term small enough to leave the learning as it was (0.5 → 0.67 here), so that
            // the page's KL chart has its curve.
            ("kl_beta = 0.0", "kl_beta = 0.001"),
            ("max_steps = 200", &format!("max_steps = {STEPS}")),
        ],
    )
    .replace("{data}", &data.display().to_string())
        + "[eval]\nevery_steps = 5\n"
        + "[[verifiers]]\nplugin = \"text-similarity\"\nmetric = \"fuzzy_match\"\npass_threshold = 0.99\nweight = 0.0\n"
        + "[resources]\nmemory_gb = 8\n"
}

/// Team `others`' job, which waits behind ours and is only ever opened by its URL.
fn other_teams_job(data: &Path) -> String {
    arith_grpo_spec(data, "another-teams", "builtin:tiny-arith", 2, 2)
        .replace("team = \"tests\"", "team = \"others\"")
        .replace("model_line = \"tiny-arith\"", "model_line = \"others-line\"")
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
    let dir = tempfile::tempdir().unwrap();
    // The learning test's addition data, 200 held-out prompts.
    let data = arith_data(dir.path(), &[ADDITION_DATA, &["--heldout", "200"]].concat());
    let cold_start = cold_start(dir.path(), &data);
    let book = dir.path().join("book");
    build_book(&book);
    let redis = Redis::start();
    let docs_dir = format!("docs_dir = {:?}", book.display().to_string());
    let daemon = Daemon::start_with_api(&PLUGINS, &redis.url(), &docs_dir, &config(&cold_start));

    let ours = submit_ok(&daemon, &watched_job(&data));
    let (status, theirs) = submit(&daemon, OTHER_TOKEN, &other_teams_job(&data), None);
    assert_eq!(status, 201, "{theirs}");
    let theirs = theirs["id"].as_str().unwrap().to_owned();
    // The page is opened on a job that is training, so its curve has room to grow.
    wait_job(&daemon, &ours, Duration::from_secs(60), |job| job.state == JobState::Running);

    // Under target/ on every run; the README's copy only when asked (RLVR_UPDATE_SCREENSHOT=1), so
    // a test run leaves the checkout as it was.
    let shot_path = |name: &str| {
        let path = if std::env::var_os("RLVR_UPDATE_SCREENSHOT").is_some_and(|v| v == "1") {
            workspace_root().join("docs/src/images").join(name)
        } else {
            rlvr_tests::target_dir().join("ui").join(name)
        };
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        path
    };
    let (screenshot, book_screenshot) = (shot_path("ui-job.png"), shot_path("book-first-page.png"));
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
        .env("RLVR_UI_BOOK_SCREENSHOT", &book_screenshot)
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

    // The gate table: held-out gain measured, against the default threshold, with its interval:
    // the job learned, and the gates say so with every prompt.
    let gates = seen["gates"].as_array().unwrap();
    let gain = gates.iter().find(|row| row["name"] == "heldout_gain").unwrap_or_else(|| panic!("{context}"));
    assert_eq!(gain["status"], "pass", "{context}");
    let cells: Vec<&str> = gain["cells"].as_array().unwrap().iter().filter_map(Value::as_str).collect();
    assert_eq!(cells[..2], ["heldout_gain", "pass"], "{context}");
    let measured: f64 = cells[2].parse().unwrap_or_else(|_| panic!("measured {:?}", cells[2]));
    assert!(
        measured >= 0.05,
        "the watched job's held-out gain {measured} is not one that learned: {context}"
    );
    assert_eq!(cells[3], ">= 0.01", "{context}");
    assert!(cells[4].contains("95%") && cells[4].contains("200 prompts"), "interval {:?}", cells[4]);
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

    // The book at /docs: its first page under /docs/ (so its relative links resolve), its scripts
    // run (they build the table of contents) with nothing refused, and a link of the table of
    // contents leads to its page.
    let first = &seen["book"]["first"];
    assert_eq!(first["status"], 200, "{context}");
    assert_eq!(first["url"], format!("{}/docs/", daemon.url), "{context}");
    assert_eq!(first["h1"], "rlvr", "{context}");
    assert_eq!(first["csp"], rlvr_daemon::api::docs::CONTENT_SECURITY_POLICY, "{context}");
    assert!(first["toc_links"].as_u64().unwrap() > 50, "{context}");
    assert_eq!(seen["book"]["console_errors"], serde_json::json!([]), "{context}");
    assert_eq!(seen["book"]["failed_loads"], serde_json::json!([]), "{context}");
    let job_spec = &seen["book"]["job_spec"];
    assert_eq!(job_spec["url"], format!("{}/docs/reference/job-spec.html", daemon.url), "{context}");
    assert_eq!(job_spec["h1"], "The job spec, every key", "{context}");

    for shot in [&screenshot, &book_screenshot] {
        let png = std::fs::read(shot).unwrap();
        assert!(png.starts_with(b"\x89PNG") && png.len() > 20_000, "{}: {} bytes", shot.display(), png.len());
    }
    eprintln!("timings: {}", seen["timings"]);
}
