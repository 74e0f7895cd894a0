//! The policy on simulated inventories and job traces. Each case is a small script; after every
//! event the policy decides, and the decisions are the snapshot (`UPDATE_EXPECT=1 cargo test`
//! rewrites them; read the diff before committing it).
//!
//! Script lines:
//!   devices 80 80!          the inventory: one device per number (its memory in GB), dev0, dev1, …;
//!                           `!`: exclusive (one job at a time)
//!   share TEAM FRACTION     a guaranteed share
//!   starve SECONDS          starvation_after_s (default 600)
//!   half-life SECONDS       fair_share_half_life_s (default 3600)
//!   fit DEVICESxGB          can_ever_fit of such a job (`-` for whole devices)
//!   @T submit JOB TEAM PRIORITY DEVICESxGB[/RESIDENT] [queued=T0]
//!   @T request JOB PHASE    the worker asks for its devices
//!   @T release JOB          it gives them back
//!   @T leave JOB            the job ends (or a preempted one has left)
//!   @T tick                 nothing happens; the policy decides again

use expect_test::{Expect, expect};

use super::*;

fn priority(text: &str) -> Priority {
    match text {
        "high" => Priority::High,
        "normal" => Priority::Normal,
        "low" => Priority::Low,
        other => panic!("priority {other}"),
    }
}

/// `2x40` → (2, Some(40.0), None); `1x-` → (1, None, None); `1x40/25` → 40 GB at its peak, 25
/// of them resident.
fn size(text: &str) -> (u32, Option<f64>, Option<f64>) {
    let (devices, memory) = text.split_once('x').expect("DEVICESxGB");
    let (memory, resident) = match memory.split_once('/') {
        Some((memory, resident)) => (memory, Some(resident.parse().expect("resident GB"))),
        None => (memory, None),
    };
    let memory = (memory != "-").then(|| memory.parse().expect("GB"));
    (devices.parse().expect("devices"), memory, resident)
}

fn run(script: &str) -> String {
    let mut devices = Vec::new();
    let mut config = PolicyConfig::default();
    let mut policy: Option<Policy> = None;
    let mut out = String::new();
    for line in script.lines().map(str::trim).filter(|line| !line.is_empty()) {
        let words: Vec<&str> = line.split_whitespace().collect();
        let Some(at) = words[0].strip_prefix('@') else {
            match words[0] {
                "devices" => {
                    devices = words[1..]
                        .iter()
                        .enumerate()
                        .map(|(n, gb)| Device {
                            name: format!("dev{n}"),
                            memory_gb: gb.trim_end_matches('!').parse().unwrap(),
                            exclusive: gb.ends_with('!'),
                        })
                        .collect();
                }
                "share" => {
                    config.shares.insert(words[1].to_owned(), words[2].parse().unwrap());
                }
                "starve" => config.starvation_after_s = words[1].parse().unwrap(),
                "half-life" => config.fair_share_half_life_s = words[1].parse().unwrap(),
                "fit" => {
                    let (count, memory_gb, resident_gb) = size(words[1]);
                    let demand = Demand {
                        job: "j".to_owned(),
                        team: "t".to_owned(),
                        priority: Priority::Normal,
                        devices: count,
                        memory_gb,
                        resident_gb,
                        queued_at: 0.0,
                    };
                    let policy = Policy::new(devices.clone(), config.clone());
                    let verdict = policy
                        .can_ever_fit(&demand)
                        .map_or_else(|why| why.to_string(), |()| "fits".to_owned());
                    out.push_str(&format!("fit {}: {verdict}\n", words[1]));
                }
                other => panic!("unknown line {other}"),
            }
            continue;
        };
        let now: f64 = at.parse().unwrap();
        let policy = policy.get_or_insert_with(|| Policy::new(devices.clone(), config.clone()));
        let result = match words[1] {
            "submit" => {
                let (count, memory_gb, resident_gb) = size(words[5]);
                let queued_at =
                    words.get(6).and_then(|w| w.strip_prefix("queued=")).map_or(now, |t| t.parse().unwrap());
                let demand = Demand {
                    job: words[2].to_owned(),
                    team: words[3].to_owned(),
                    priority: priority(words[4]),
                    devices: count,
                    memory_gb,
                    resident_gb,
                    queued_at,
                };
                policy.enqueue(demand, now)
            }
            "request" => {
                let phase = match words[3] {
                    "rollout" => Phase::Rollout,
                    "update" => Phase::Update,
                    "eval" => Phase::Eval,
                    other => panic!("phase {other}"),
                };
                policy.request(words[2], phase, now)
            }
            "release" => {
                policy.release(words[2], now);
                Ok(())
            }
            "leave" => {
                policy.leave(words[2], now);
                Ok(())
            }
            "tick" => Ok(()),
            other => panic!("unknown event {other}"),
        };
        if let Err(error) = result {
            out.push_str(&format!("@{at} error: {error}\n"));
        }
        for decision in policy.decide(now) {
            let text = match decision {
                Decision::Admit { job, devices } => {
                    let names: Vec<String> = devices.iter().map(|d| format!("dev{d}")).collect();
                    format!("admit {job} on {}", names.join(","))
                }
                Decision::Preempt { job, for_job } => format!("preempt {job} for {for_job}"),
                Decision::Grant { job, phase } => format!("grant {job} {phase}"),
            };
            out.push_str(&format!("@{at} {text}\n"));
        }
    }
    out
}

fn check(script: &str, expected: Expect) {
    expected.assert_eq(&run(script));
}

#[test]
fn memory_packs_best_fit_and_whole_device_jobs_need_an_empty_device() {
    check(
        "
        devices 80 40
        @0 submit a1 a normal 1x30
        @1 submit a2 a normal 1x40
        @2 submit a3 a normal 1x-
        @3 submit a4 a normal 1x30
        @4 leave a1
        @5 leave a2
        ",
        expect![[r#"
            @0 admit a1 on dev1
            @1 admit a2 on dev0
            @3 admit a4 on dev0
            @4 admit a3 on dev1
        "#]],
    );
}

#[test]
fn jobs_on_a_device_need_their_resident_parts_plus_the_largest_phase() {
    // A device serves one phase at a time: a1 (30 resident, 50 at its peak) and a2 (20, 45)
    // need 30 + 20 + max(20, 25) = 75 of 80, where their peaks would sum to 95. a3 (10 of 10)
    // would make it 85: it waits for a1. Without a resident part a job holds all of its memory.
    check(
        "
        devices 80
        @0 submit a1 a normal 1x50/30
        @1 submit a2 a normal 1x45/20
        @2 submit a3 a normal 1x10
        @3 leave a1
        ",
        expect![[r#"
            @0 admit a1 on dev0
            @1 admit a2 on dev0
            @3 admit a3 on dev0
        "#]],
    );
}

#[test]
fn an_exclusive_device_takes_one_job_at_a_time_whatever_its_memory() {
    // dev0 is a GPU in exclusive-process mode: a second worker could not open it.
    check(
        "
        devices 80! 40
        @0 submit a1 a normal 1x20
        @1 submit a2 a normal 1x30
        @2 submit a3 a normal 1x10
        @3 submit a4 a normal 1x10
        @4 submit a5 a normal 1x10
        @5 leave a2
        ",
        expect![[r#"
            @0 admit a1 on dev1
            @1 admit a2 on dev0
            @2 admit a3 on dev1
            @3 admit a4 on dev1
            @5 admit a5 on dev0
        "#]],
    );
}

#[test]
fn a_job_on_an_exclusive_device_holds_all_of_it_for_quotas() {
    // a1 takes 10 GB of dev0 but keeps everyone else off it: it fills team a's half, so a2 is
    // borrowing and makes room for b's job within b's share.
    check(
        "
        devices 80! 80
        share a 0.5
        share b 0.5
        @0 submit a1 a normal 1x10
        @1 submit a2 a normal 1x10
        @2 submit b1 b normal 1x80
        @3 leave a2
        ",
        expect![[r#"
            @0 admit a1 on dev0
            @1 admit a2 on dev1
            @2 preempt a2 for b1
            @3 admit b1 on dev1
        "#]],
    );
}

#[test]
fn a_multi_device_job_gets_all_its_devices_at_once_and_small_jobs_backfill_until_it_starves() {
    check(
        "
        devices 80 80
        starve 100
        @0 submit small1 a normal 1x80
        @1 submit big b normal 2x80
        @2 submit small2 a normal 1x80
        @50 leave small2
        @60 submit small3 a normal 1x80
        @150 leave small3
        @160 submit small4 a normal 1x80
        @200 leave small1
        ",
        expect![[r#"
            @0 admit small1 on dev0
            @2 admit small2 on dev1
            @60 admit small3 on dev1
            @200 admit big on dev0,dev1
        "#]],
    );
}

#[test]
fn priority_first_then_fair_share_then_age() {
    // `urgent` preempts `first` (its own team's, lower priority). Then team a has used the
    // device and b has not: b's younger job goes before a's older one; then the oldest.
    check(
        "
        devices 10
        @0 submit first a normal 1x10
        @1 submit a-old a normal 1x10
        @2 submit b-young b normal 1x10
        @3 submit urgent a high 1x10
        @4 submit low b low 1x10
        @5 leave first
        @6 leave urgent
        @7 leave b-young
        @8 leave a-old
        ",
        expect![[r#"
            @0 admit first on dev0
            @3 preempt first for urgent
            @5 admit urgent on dev0
            @6 admit b-young on dev0
            @7 admit a-old on dev0
            @8 admit low on dev0
        "#]],
    );
}

#[test]
fn past_use_fades_with_the_half_life() {
    // a ran for 150 s, then b for 50 s. With a 10 s half-life a's use has faded by the time
    // b's ends, and b's fresher use puts a's older job first; with an hour's, a's 150 s still
    // weigh more than b's 50 and b's second job goes first.
    let script = |half_life: u32| {
        format!(
            "
            devices 10
            half-life {half_life}
            @0 submit a1 a normal 1x10
            @1 submit a2 a normal 1x10
            @2 submit b1 b normal 1x10
            @3 submit b2 b normal 1x10
            @150 leave a1
            @200 leave b1
            "
        )
    };
    check(
        &script(10),
        expect![[r#"
            @0 admit a1 on dev0
            @150 admit b1 on dev0
            @200 admit a2 on dev0
        "#]],
    );
    check(
        &script(3600),
        expect![[r#"
            @0 admit a1 on dev0
            @150 admit b1 on dev0
            @200 admit b2 on dev0
        "#]],
    );
}

#[test]
fn fair_share_follows_the_guaranteed_shares() {
    // Team a holds half of the devices; b holds one; a's weight is 3× b's, so a goes first.
    check(
        "
        devices 10 10 10 10
        share a 0.75
        share b 0.25
        @0 submit a1 a normal 1x10
        @0 submit a2 a normal 1x10
        @0 submit b1 b normal 1x10
        @0 submit x1 a normal 1x10
        @0 submit y1 b normal 1x10
        @1 leave a1
        ",
        expect![[r#"
            @0 admit a1 on dev0
            @0 admit a2 on dev1
            @0 admit b1 on dev2
            @0 admit x1 on dev3
            @1 admit y1 on dev0
        "#]],
    );
}

#[test]
fn a_team_borrows_idle_capacity_and_gives_it_back_when_another_claims_its_share() {
    check(
        "
        devices 10 10
        share a 0.5
        share b 0.5
        @0 submit a1 a high 1x10
        @1 submit a2 a high 1x10
        @2 submit b1 b low 1x10
        @3 tick
        @4 leave a2
        @5 submit a3 a high 1x10
        ",
        expect![[r#"
            @0 admit a1 on dev0
            @1 admit a2 on dev1
            @2 preempt a2 for b1
            @4 admit b1 on dev1
        "#]],
    );
}

#[test]
fn a_team_over_its_share_cannot_preempt_a_job_within_another_teams_share_even_when_urgent() {
    check(
        "
        devices 10 10
        share a 0.5
        share b 0.5
        @0 submit b1 b low 1x10
        @1 submit a1 a high 1x10
        @2 submit a2 a high 1x10
        @3 submit b2 b low 1x10
        ",
        expect![[r#"
            @0 admit b1 on dev0
            @1 admit a1 on dev1
        "#]],
    );
}

#[test]
fn urgent_work_preempts_the_cheapest_lower_priority_jobs_only() {
    // Victims: lowest priority first, then the newest; a victim the others make unnecessary is
    // spared. Until the victims have left, nothing passes the urgent job.
    check(
        "
        devices 10 10 10
        @0 submit old-low t low 1x10
        @1 submit normal t normal 1x10
        @2 submit new-low t low 1x10
        @3 submit urgent t high 1x10
        @4 submit urgent2 t high 2x10
        @5 submit filler t high 1x5
        @6 leave new-low
        @7 leave old-low
        @8 leave normal
        ",
        expect![[r#"
            @0 admit old-low on dev0
            @1 admit normal on dev1
            @2 admit new-low on dev2
            @3 preempt new-low for urgent
            @6 admit urgent on dev2
            @6 preempt old-low for urgent2
            @6 preempt normal for urgent2
            @8 admit urgent2 on dev0,dev1
        "#]],
    );
}

#[test]
fn grants_interleave_two_jobs_on_one_device_in_request_order() {
    check(
        "
        devices 10
        @0 submit a t normal 1x4
        @0 submit b t normal 1x4
        @1 request a rollout
        @2 request b rollout
        @3 release a
        @4 request a update
        @5 release b
        @6 release a
        @7 request b update
        @7 request a rollout
        @8 release b
        ",
        expect![[r#"
            @0 admit a on dev0
            @0 admit b on dev0
            @1 grant a rollout
            @3 grant b rollout
            @5 grant a update
            @7 grant b update
            @8 grant a rollout
        "#]],
    );
}

#[test]
fn grants_go_to_the_urgent_first_and_a_waiting_multi_device_request_is_not_overtaken() {
    // `wide` waits for dev0 (held by `left`) and keeps dev1 for itself: `right`, asking later
    // at the same priority, waits too; `hot` goes first.
    check(
        "
        devices 10 10
        @0 submit wide t normal 2x2
        @0 submit left t normal 1x6
        @0 submit right t normal 1x6
        @0 submit hot t high 1x2
        @1 request left rollout
        @2 request wide rollout
        @3 request right rollout
        @3 request hot rollout
        @4 release left
        @5 release hot
        @6 release wide
        ",
        expect![[r#"
            @0 admit wide on dev0,dev1
            @0 admit left on dev0
            @0 admit right on dev1
            @0 admit hot on dev0
            @1 grant left rollout
            @4 grant hot rollout
            @5 grant wide rollout
            @6 grant right rollout
        "#]],
    );
}

#[test]
fn a_job_that_leaves_returns_its_grant_and_its_memory() {
    check(
        "
        devices 10
        @0 submit a t normal 1x10
        @1 request a rollout
        @2 submit b t normal 1x10
        @3 leave a
        @4 request b rollout
        @5 request b update
        @6 release b
        @7 release b
        ",
        expect![[r#"
            @0 admit a on dev0
            @1 grant a rollout
            @3 admit b on dev0
            @4 grant b rollout
            @5 error: job b has a phase granted or asked for already
        "#]],
    );
}

#[test]
fn jobs_that_can_never_fit_are_named_with_the_inventory() {
    check(
        "
        devices 80 40
        fit 1x80
        fit 2x40
        fit 2x80
        fit 3x-
        fit 0x1
        ",
        expect![[r#"
            fit 1x80: fits
            fit 2x40: fits
            fit 2x80: resources.memory_gb: 2 device(s) with 80 GB each never fit here: 1 of this daemon's devices have that much (dev0 80 GB, dev1 40 GB)
            fit 3x-: resources.devices: 3 devices never fit here: this daemon has 2 (dev0 80 GB, dev1 40 GB)
            fit 0x1: resources.devices: expected at least 1
        "#]],
    );
}
