//! Outbound requests under `rlvrd serve` (issue 17, finding 6: webhooks went anywhere and
//! followed redirects): a spec's `publish.webhook` is checked against the operator's `[outbound]`
//! policy at submit, and delivered without redirects, with each resolved address checked again.

use std::path::Path;
use std::time::Duration;

use rlvr_protocol::job::JobState;
use rlvr_tests::jobs::{ended, get, job, submit, submit_ok, wait_job};
use rlvr_tests::peer::Peer;
use rlvr_tests::{
    Daemon, OUTBOUND_LOOPBACK, PERMISSIVE_GATES, Redis, TEAM_TOKEN, arith_data, arith_grpo_spec, wait_until,
};
use serde_json::Value;

const PLUGINS: [&str; 2] = ["rlvr-optimizer-grpo", "rlvr-verifier-math"];
const QUEUE: &str = "[queue]\nworker_threads = 1\n";

/// A two-step job that publishes into the daemon's registry whatever it learns, calling
/// `webhook`.
fn spec(data: &Path, _dir: &Path, name: &str, webhook: &str) -> String {
    let base = arith_grpo_spec(data, name, "builtin:tiny-arith", 2, 2);
    format!("{base}\n{PERMISSIVE_GATES}[publish]\nwebhook = {webhook:?}\n")
}

/// Submits `webhook`, expecting a 4xx naming `publish.webhook` (its only problem) whose message
/// holds `expected`.
fn refused(daemon: &Daemon, data: &Path, dir: &Path, webhook: &str, expected: &str) {
    let (status, body) = submit(daemon, TEAM_TOKEN, &spec(data, dir, "hook", webhook), None);
    assert!((400..500).contains(&status), "{webhook}: {status} {body}");
    let error = &body["error"];
    assert_eq!(error["field"], "publish.webhook", "{webhook}: {body}");
    assert!(error["message"].as_str().unwrap().contains(expected), "{webhook}: {body}");
    assert_eq!(error["more"].as_array().map_or(0, Vec::len), 0, "{webhook}: {body}");
}

fn queued_jobs(daemon: &Daemon) -> Vec<Value> {
    let (status, body) = get(daemon, TEAM_TOKEN, "/v1/jobs");
    assert_eq!(status, 200, "{body}");
    body["jobs"].as_array().unwrap().clone()
}

const NOT_LISTED: &str = "destination not in the operator's outbound allow-list";

#[test]
fn webhooks_to_non_public_or_unlisted_destinations_are_refused_at_submit() {
    let redis = Redis::start();
    let daemon = Daemon::start_with(&PLUGINS, &redis.url(), "[outbound]\nallow = [\"hooks.example.com\"]\n");
    let dir = tempfile::tempdir().unwrap();
    let data = arith_data(dir.path(), &[]);
    let port = daemon.url.rsplit(':').next().unwrap().to_owned();
    let cases: &[(String, &str)] = &[
        // regression: the cloud metadata service was accepted as a webhook
        (
            "http://169.254.169.254/latest/meta-data/iam/security-credentials/".into(),
            "169.254.169.254 is a link-local address",
        ),
        // regression: a file url was accepted as a webhook
        ("file:///etc/passwd".into(), "file: urls are not allowed; expected http or https"),
        // regression: the daemon's own API was accepted as a webhook
        (format!("{}/v1/jobs", daemon.url), "127.0.0.1 is a loopback address"),
        (format!("http://[::1]:{port}/v1/jobs"), "::1 is a loopback address"),
        (format!("http://0x7f000001:{port}/v1/jobs"), "127.0.0.1 is a loopback address"),
        (format!("http://2130706433:{port}/"), "127.0.0.1 is a loopback address"),
        (format!("http://[::ffff:127.0.0.1]:{port}/"), "::ffff:127.0.0.1 is a loopback address"),
        (format!("http://localhost:{port}/v1/jobs"), NOT_LISTED),
        ("http://10.0.0.1/".into(), "10.0.0.1 is a private address"),
        ("http://not-listed.example.org/hook".into(), NOT_LISTED),
        ("http://hooks.example.com.evil.example.org/".into(), NOT_LISTED),
        ("gopher://hooks.example.com/".into(), "gopher: urls are not allowed"),
        ("http://user:pw@hooks.example.com/".into(), "a user name or password in the url is not allowed"),
    ];
    for (webhook, expected) in cases {
        refused(&daemon, &data, dir.path(), webhook, expected);
    }
    assert_eq!(queued_jobs(&daemon), Vec::<Value>::new(), "nothing was queued");
    assert!(!daemon.state.join("registry/tiny-arith/1").exists(), "nothing was published");

    // With no [outbound] section, no webhook at all.
    let default = Daemon::start(&PLUGINS, &redis.url());
    refused(&default, &data, dir.path(), "https://hooks.example.com/published", NOT_LISTED);
    assert_eq!(queued_jobs(&default), Vec::<Value>::new());
}

// regression: a 302 from the webhook was followed and reported "delivered"
#[test]
fn a_webhook_answering_a_redirect_is_not_delivered_and_its_target_gets_nothing() {
    let redis = Redis::start();
    let daemon = Daemon::start_with(&PLUGINS, &redis.url(), &format!("{QUEUE}{OUTBOUND_LOOPBACK}"));
    let dir = tempfile::tempdir().unwrap();
    let data = arith_data(dir.path(), &[]);
    let target = Peer::ok("");
    let redirect = Peer::redirecting_to(&target.url("/stolen"));
    let url = redirect.url("/published");

    let id = submit_ok(&daemon, &spec(&data, dir.path(), "redirected", &url));
    let done = wait_job(&daemon, &id, Duration::from_secs(180), ended);
    assert_eq!(done.state, JobState::Published, "{done}");
    assert!(wait_until(Duration::from_secs(30), || job(&daemon, &id).webhook.is_some()));
    assert_eq!(
        job(&daemon, &id).0.webhook.unwrap(),
        format!("not delivered to {url}: the webhook answered a redirect (HTTP 302), which is not followed")
    );
    // Asked once (a redirect is an answer, not a failure to retry); the target never.
    assert_eq!((redirect.received().len(), target.received().len()), (1, 0));
}

// regression: an allowed name that resolves to a loopback address was called
#[test]
fn a_listed_name_that_resolves_to_loopback_is_checked_again_at_delivery_and_not_called() {
    let redis = Redis::start();
    let daemon =
        Daemon::start_with(&PLUGINS, &redis.url(), &format!("{QUEUE}[outbound]\nallow = [\"localhost\"]\n"));
    let dir = tempfile::tempdir().unwrap();
    let data = arith_data(dir.path(), &[]);
    let server = Peer::ok("");
    let url = server.url("/published").replace("127.0.0.1", "localhost");

    // The name is on the list: submit cannot know where it will resolve when the job ends.
    let id = submit_ok(&daemon, &spec(&data, dir.path(), "rebound", &url));
    let done = wait_job(&daemon, &id, Duration::from_secs(180), ended);
    assert_eq!(done.state, JobState::Published, "{done}");
    assert!(wait_until(Duration::from_secs(30), || job(&daemon, &id).webhook.is_some()));
    assert_eq!(
        job(&daemon, &id).0.webhook.unwrap(),
        format!(
            "not delivered to {url}: localhost resolves to a non-public address (private, loopback, \
             link-local or reserved); outbound requests go only to public addresses"
        )
    );
    assert_eq!(server.received().len(), 0);
}
