//! The scheduler with real processes on CPU slots: jobs sharing a slot take turns through phase
//! grants, urgent work preempts and the preempted job resumes exactly, a team over its share
//! waits while another team's job runs, and a killed worker gives its grants back.
//! `builtin:tiny-arith` jobs, one libtorch thread each, so weights are bit-exact across runs.

use std::path::Path;
use std::time::Duration;

use rlvr_protocol::job::{JobEvent, JobState};
use rlvr_tests::jobs::{
    ended, event_ms, get, job, state_events, submit, submit_ok, uninterrupted_weights, wait_job, worker_pids,
};
use rlvr_tests::{
    ADMIN_TOKEN, Daemon, OTHER_TOKEN, PERMISSIVE_GATES, Redis, arith_data, arith_grpo_spec, wait_until,
};

const PLUGINS: [&str; 2] = ["rlvr-optimizer-grpo", "rlvr-verifier-math"];

/// `slots` CPU slots of 8 GB; the teams' shares, if any. Team `tests` may use every priority
/// (the operator's grant); `others` the default low and normal.
fn config(slots: u32, shares: &str) -> String {
    format!(
        "[queue]\nheartbeat_ms = 500\nmissed_heartbeats = 6\nworker_threads = 1\n\
         [devices]\ncpu_slots = {slots}\ncpu_slot_memory_gb = 8\n\
         [[tenancy.teams]]\nname = \"tests\"\npriorities = [\"low\", \"normal\", \"high\"]\n\
         [scheduler]\npreempt_grace_s = 60\n{shares}"
    )
}

/// A GRPO job of `team` at `priority` (gate always passes); `memory_gb` per device, or a whole
/// 8 GB slot when `None` (left out, submit would fill in the job's estimate, and the jobs of a
/// test would share a slot).
fn spec(data: &Path, name: &str, team: &str, priority: &str, steps: u32, memory_gb: Option<f64>) -> String {
    // Each team publishes into its own line: a line belongs to the team that made it.
    let base = arith_grpo_spec(data, name, "builtin:tiny-arith", steps, 5)
        .replace("team = \"tests\"", &format!("team = \"{team}\"\npriority = \"{priority}\""))
        .replace("model_line = \"tiny-arith\"", &format!("model_line = \"tiny-arith-{team}\""));
    let resources = format!("[resources]\nmemory_gb = {}\n", memory_gb.unwrap_or(8.0));
    format!("{base}\n{PERMISSIVE_GATES}{resources}")
}

/// A counter or gauge of `/metrics` (the first sample whose line starts with `name`).
fn metric(daemon: &Daemon, name: &str) -> f64 {
    let (_, text) = daemon.get("/metrics");
    text.lines()
        .find(|line| line.starts_with(name))
        .and_then(|line| line.rsplit(' ').next())
        .and_then(|value| value.parse().ok())
        .unwrap_or_else(|| panic!("no {name} in /metrics:\n{text}"))
}

/// The time of the job's first event in `state`.
fn first(events: &[JobEvent], state: JobState) -> u64 {
    event_ms(events.iter().find(|event| event.state == state).unwrap_or_else(|| panic!("no {state:?}")))
}

fn last_event_ms(events: &[JobEvent]) -> u64 {
    event_ms(events.last().expect("events"))
}

#[test]
fn two_jobs_on_one_slot_take_turns_through_grants_and_end_with_their_solo_weights() {
    let redis = Redis::start();
    let daemon = Daemon::start_with(&PLUGINS, &redis.url(), &config(1, ""));
    let dir = tempfile::tempdir().unwrap();
    let data = arith_data(dir.path(), &[]);
    let specs = [
        spec(&data, "a", "tests", "normal", 60, Some(2.0)),
        spec(&data, "b", "tests", "normal", 60, Some(2.0)),
    ];
    let ids: Vec<String> = specs.iter().map(|toml| submit_ok(&daemon, toml)).collect();
    for id in &ids {
        let done = wait_job(&daemon, id, Duration::from_secs(240), ended);
        assert_eq!(done.state, JobState::Published, "{done}");
        assert_eq!(done.devices, ["cpu:0"], "both on the one slot");
    }
    // Both ran at once on the one slot: each started before the other ended...
    let (a, b) = (state_events(&daemon, &ids[0]), state_events(&daemon, &ids[1]));
    assert!(
        first(&a, JobState::Running) < last_event_ms(&b) && first(&b, JobState::Running) < last_event_ms(&a)
    );
    // ...taking turns: requests waited for the other's phases, and the slot was busy.
    assert!(metric(&daemon, "rlvr_grant_waits_total") > 0.0);
    assert!(metric(&daemon, "rlvr_device_busy_seconds_total{device=\"cpu:0\"}") > 0.0);
    for (id, toml) in ids.iter().zip(&specs) {
        let weights = job(&daemon, id).weights();
        let solo = tempfile::tempdir().unwrap();
        assert_eq!(
            weights,
            uninterrupted_weights(&daemon, solo.path(), toml),
            "job {id} = the same job alone"
        );
    }
}

#[test]
fn an_urgent_job_preempts_a_low_priority_one_which_resumes_to_its_uninterrupted_weights() {
    let redis = Redis::start();
    let daemon = Daemon::start_with(&PLUGINS, &redis.url(), &config(1, ""));
    let dir = tempfile::tempdir().unwrap();
    let data = arith_data(dir.path(), &[]);
    // 60 steps: the urgent job arrives after its fifth, and the resumed run still has most of
    // them to go (at 200 the story trained 140 more steps to the same comparison).
    let low_spec = spec(&data, "low", "tests", "low", 60, None);
    let low = submit_ok(&daemon, &low_spec);
    wait_job(&daemon, &low, Duration::from_secs(120), |job| job.step >= 5);
    let urgent = submit_ok(&daemon, &spec(&data, "urgent", "tests", "high", 5, None));

    let done = wait_job(&daemon, &urgent, Duration::from_secs(120), ended);
    assert_eq!(done.state, JobState::Published, "{done}");
    let low_done = wait_job(&daemon, &low, Duration::from_secs(240), ended);
    assert_eq!(low_done.state, JobState::Published, "{low_done}");
    assert_eq!((low_done.preemptions, low_done.crashes), (1, 0));
    let events = state_events(&daemon, &low);
    let preempted =
        events.iter().find(|event| event.state == JobState::Preempted).expect("a preempted event");
    let reason = preempted.reason.as_str();
    assert!(reason.contains(&format!("to make room for job {urgent}; checkpointed")), "{reason}");
    // The urgent job ran while the low one waited, and the low one came back once the urgent
    // one's worker was done (its gating needs no device).
    let urgent_events = state_events(&daemon, &urgent);
    assert!(event_ms(preempted) <= first(&urgent_events, JobState::Running));
    let resumed = events.iter().rev().find(|event| event.state == JobState::Running).unwrap();
    assert!(event_ms(resumed) >= first(&urgent_events, JobState::Evaluating), "{events:?}");
    // By the victim's priority: team names are never metric labels.
    assert_eq!(metric(&daemon, "rlvr_preemptions_total{priority=\"low\"}"), 1.0);
    let weights = low_done.weights();
    assert_eq!(weights, uninterrupted_weights(&daemon, dir.path(), &low_spec), "resumed = uninterrupted");
}

#[test]
fn a_team_over_its_share_waits_while_another_teams_job_runs() {
    let redis = Redis::start();
    let shares = "[scheduler.shares]\ntests = 0.5\nothers = 0.5\n";
    let daemon = Daemon::start_with(&PLUGINS, &redis.url(), &config(2, shares));
    let dir = tempfile::tempdir().unwrap();
    let data = arith_data(dir.path(), &[]);
    let (status, theirs) =
        submit(&daemon, OTHER_TOKEN, &spec(&data, "theirs", "others", "low", 100_000, None), None);
    assert_eq!(status, 201, "{theirs}");
    let theirs = theirs["id"].as_str().unwrap().to_owned();
    let first_ours = submit_ok(&daemon, &spec(&data, "ours-1", "tests", "normal", 100_000, None));
    for id in [&theirs, &first_ours] {
        wait_job(&daemon, id, Duration::from_secs(120), |job| job.step >= 2);
    }
    // Team tests holds its half; its second job (even urgent) may not take the other team's.
    let second_ours = submit_ok(&daemon, &spec(&data, "ours-2", "tests", "high", 3, None));
    // Urgent work of its own team goes first: it takes its own team's slot, not theirs.
    wait_job(&daemon, &first_ours, Duration::from_secs(60), |job| job.preemptions >= 1);
    let done = wait_job(&daemon, &second_ours, Duration::from_secs(120), ended);
    assert_eq!(done.state, JobState::Published, "{done}\n{}", daemon.log());
    let third_ours = submit_ok(&daemon, &spec(&data, "ours-3", "tests", "normal", 3, None));
    std::thread::sleep(Duration::from_secs(3));
    let waiting = job(&daemon, &third_ours);
    assert_eq!(waiting.state, JobState::Queued, "over its share, it waits: {waiting}\n{}", daemon.log());
    let their_job = job(&daemon, &theirs);
    assert_eq!(
        (their_job.state, their_job.preemptions),
        (JobState::Running, 0),
        "{their_job}\n{}",
        daemon.log()
    );
    // When its own slot frees, it runs.
    let cancel = |id: &str| {
        rlvr_tests::jobs::client()
            .delete(format!("{}/v1/jobs/{id}", daemon.url))
            .bearer_auth(ADMIN_TOKEN)
            .send()
    };
    cancel(&first_ours).unwrap();
    let done = wait_job(&daemon, &third_ours, Duration::from_secs(120), ended);
    assert_eq!(done.state, JobState::Published, "{done}\n{}", daemon.log());
    assert_eq!(job(&daemon, &theirs).preemptions, 0, "{}", daemon.log());
    cancel(&theirs).unwrap();
    let (_, list) = get(&daemon, ADMIN_TOKEN, "/v1/jobs");
    assert_eq!(list["jobs"].as_array().map(Vec::len), Some(4), "{list}");
}

#[test]
fn a_killed_worker_gives_its_grants_back_and_the_other_job_goes_on() {
    let redis = Redis::start();
    let daemon = Daemon::start_with(&PLUGINS, &redis.url(), &config(1, ""));
    let dir = tempfile::tempdir().unwrap();
    let data = arith_data(dir.path(), &[]);
    let victim = submit_ok(&daemon, &spec(&data, "victim", "tests", "normal", 80, Some(2.0)));
    let other = submit_ok(&daemon, &spec(&data, "other", "tests", "normal", 80, Some(2.0)));
    for id in [&victim, &other] {
        wait_job(&daemon, id, Duration::from_secs(120), |job| job.step >= 3);
    }
    let pids = worker_pids(&victim);
    assert_eq!(pids.len(), 1, "one worker");
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pids[0] as i32), nix::sys::signal::Signal::SIGKILL)
        .unwrap();
    // The other job keeps stepping: whatever the victim held came back.
    let step = job(&daemon, &other).step;
    let stepping = || job(&daemon, &other).step >= (step + 5).min(80);
    assert!(wait_until(Duration::from_secs(30), stepping), "the other job stalled\n{}", daemon.log());
    for id in [&other, &victim] {
        assert_eq!(wait_job(&daemon, id, Duration::from_secs(240), ended).state, JobState::Published);
    }
    assert_eq!(job(&daemon, &victim).crashes, 1);
    assert_eq!(job(&daemon, &other).crashes, 0);
}
