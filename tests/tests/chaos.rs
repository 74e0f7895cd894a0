//! Faults mixed at random moments over many jobs of three teams: the daemon killed (`kill -9`)
//! and stopped (SIGTERM), workers killed (`kill -9`) and frozen past their heartbeats (SIGSTOP,
//! then SIGCONT), Redis killed (`kill -9`) and restarted from its append-only file, the state
//! directory's disk filled for a moment (a tmpfs of the daemon's own, [`SmallDisk`]) — while GRPO,
//! SFT and rejection-sampling jobs and a pipeline run. Afterwards every job has ended, none ran
//! in two workers at once, none was lost, every published version's manifest matches its files
//! and names a job that published once, no version or checkpoint in the making is visible, every
//! sampled dataset is the team's, and `/healthz` is ok.
//!
//! The suite runs a bounded schedule (about a minute); `scripts/chaos.sh` runs the same test at
//! full size through `RLVR_CHAOS_JOBS` (jobs of each kind per team), `RLVR_CHAOS_FAULTS` and
//! `RLVR_CHAOS_SEED`, and the README carries its figures. A job whose checkpoint or logs meet the
//! full disk fails (its reason naming the path): ended, not lost.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use rlvr_client::{SpecFormat, View};
use rlvr_protocol::gates::Manifest;
use rlvr_protocol::job::{JobEvent, JobOutput, JobState, JobView};
use rlvr_protocol::pipeline::PipelineState;
use rlvr_seeded::SplitMix64;
use rlvr_tests::jobs::{Job, api, job, submit, workers_of_daemon};
use rlvr_tests::{
    ADMIN_TOKEN, Daemon, OTHER_TOKEN, PERMISSIVE_GATES, Redis, STAGE_GRPO, STAGE_SFT, SmallDisk, TEAM_TOKEN,
    arith_data, arith_grpo_spec, fill_disk, pipeline, sha256_hex, stage, wait_until,
};
use sha2::{Digest, Sha256};

const PLUGINS: [&str; 3] = ["rlvr-optimizer-grpo", "rlvr-optimizer-sft", "rlvr-verifier-math"];
const THIRD_TOKEN: &str = "third-team-token-0123456789abcdef";

/// Fast heartbeats (a frozen worker is noticed in 1.5 s), crashes allowed enough for the kills,
/// a short stop, two CPU slots with room for the rejection-sampling jobs' memory, and the third
/// team's token.
fn config() -> String {
    format!(
        "[queue]\nheartbeat_ms = 500\nmissed_heartbeats = 6\nworker_threads = 1\nmax_crashes = 20\n\
         stop_timeout_s = 30\n[devices]\ncpu_slots = 2\ncpu_slot_memory_gb = 8\n\
         [[auth.tokens]]\nteam = \"third\"\nsha256 = {:?}\nadmin = false\n",
        sha256_hex(THIRD_TOKEN)
    )
}

/// The run's size, from the environment (the suite's bounded run by default).
struct Plan {
    jobs_per_kind: usize,
    faults: usize,
    seed: u64,
}

impl Plan {
    fn from_env() -> Plan {
        let number = |name: &str, default: u64| {
            std::env::var(name).ok().map_or(default, |text| {
                text.parse().unwrap_or_else(|_| panic!("{name}={text}: expected a whole number"))
            })
        };
        Plan {
            jobs_per_kind: number("RLVR_CHAOS_JOBS", 1) as usize,
            faults: number("RLVR_CHAOS_FAULTS", 6) as usize,
            seed: number("RLVR_CHAOS_SEED", 1),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Fault {
    DaemonKilled,
    DaemonStopped,
    WorkerKilled,
    WorkerFrozen,
    RedisKilled,
    DiskFilled,
}

const FAULTS: [Fault; 6] = [
    Fault::DaemonKilled,
    Fault::DaemonStopped,
    Fault::WorkerKilled,
    Fault::WorkerFrozen,
    Fault::RedisKilled,
    Fault::DiskFilled,
];

/// A team's job spec of `kind` number `i`, on its own model line.
fn job_spec(data: &Path, team: &str, kind: &str, i: usize) -> String {
    let name = format!("{kind}-{i}");
    let toml = match kind {
        "grpo" => format!("{}\n{PERMISSIVE_GATES}", arith_grpo_spec(data, &name, "builtin:tiny-arith", 6, 2)),
        "sft" => format!(
            "[job]\nname = {name:?}\nteam = \"tests\"\nmodel_line = \"tiny-arith\"\nseed = {i}\n\
             [model]\npolicy = \"builtin:tiny-arith\"\n[data]\ntrain = \"{data}/sft.jsonl\"\n\
             [optimizer]\nplugin = \"sft\"\nlr = 1e-3\nmicro_batch_size = 8\n\
             [rollout]\nprompts_per_step = 8\n[budget]\nmax_steps = 6\n[checkpoint]\nevery_steps = 2\n",
            data = data.display()
        ),
        "rejection" => format!(
            "[job]\nname = {name:?}\nteam = \"tests\"\nmodel_line = \"tiny-arith\"\nseed = {i}\n\
             [model]\npolicy = \"builtin:tiny-arith\"\n[data]\ntrain = \"{data}/train.jsonl\"\n\
             [optimizer]\nplugin = \"rejection-sampling\"\ngroup_size = 4\noutput = \"rows-{i}\"\n\
             threshold = 0.0\nkeep = 2\n[[verifiers]]\nplugin = \"math\"\nfallback = \"last\"\n\
             [rollout]\nmax_new_tokens = 5\nprompts_per_step = 4\n[budget]\nmax_steps = 3\n\
             [checkpoint]\nevery_steps = 1\n[resources]\nmemory_gb = 4\n",
            data = data.display()
        ),
        other => unreachable!("no job kind {other}"),
    };
    toml.replace("team = \"tests\"", &format!("team = {team:?}"))
        .replace("model_line = \"tiny-arith\"", &format!("model_line = \"{team}-{kind}\""))
}

/// The workers of each job that hold its run's lock (`jobs/ID/run.lock`, the `flock` a worker
/// takes before it touches the run): pids by job id, from `/proc/locks` and each worker's open
/// files. A worker merely alive does not count: one whose daemon was killed while it was starting
/// lives on for up to a second (the loader and libtorch's initialisers run before it can see that
/// its parent is gone), and exits before it takes the lock.
fn lock_holders(state: &Path) -> BTreeMap<String, Vec<u32>> {
    use std::os::unix::fs::MetadataExt;
    let locks = fs::read_to_string("/proc/locks").unwrap_or_default();
    // `1: FLOCK  ADVISORY  WRITE 2298 08:01:1234 0 EOF`; a waiter's line has `->` after the number.
    let held: Vec<(u32, u64)> = locks
        .lines()
        .filter(|line| !line.contains("->"))
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let pid = fields.get(4)?.parse().ok()?;
            let inode = fields.get(5)?.rsplit(':').next()?.parse().ok()?;
            Some((pid, inode))
        })
        .collect();
    let mut holders: BTreeMap<String, Vec<u32>> = BTreeMap::new();
    for (pid, job) in workers_of_daemon(state) {
        let lock = format!("/jobs/{job}/run.lock");
        let holds = fs::read_dir(format!("/proc/{pid}/fd")).into_iter().flatten().flatten().any(|fd| {
            fs::read_link(fd.path()).is_ok_and(|target| target.to_string_lossy().ends_with(&lock))
                && fs::metadata(fd.path()).is_ok_and(|meta| held.contains(&(pid, meta.ino())))
        });
        if holds {
            holders.entry(job).or_default().push(pid);
        }
    }
    holders
}

/// The most workers seen at once for each job, alive and holding its lock, sampled every 20 ms
/// in the background.
struct Watch {
    stop: Arc<AtomicBool>,
    most: Arc<Mutex<BTreeMap<String, (usize, usize)>>>,
    thread: std::thread::JoinHandle<()>,
}

impl Watch {
    fn start(state: PathBuf) -> Watch {
        let stop = Arc::new(AtomicBool::new(false));
        let most: Arc<Mutex<BTreeMap<String, (usize, usize)>>> = Arc::default();
        let (s, m) = (stop.clone(), most.clone());
        let thread = std::thread::spawn(move || {
            while !s.load(Ordering::SeqCst) {
                let mut alive: BTreeMap<String, usize> = BTreeMap::new();
                for (_, id) in workers_of_daemon(&state) {
                    *alive.entry(id).or_default() += 1;
                }
                let holders = lock_holders(&state);
                let mut most = m.lock().unwrap();
                for (id, count) in alive {
                    let holding = holders.get(&id).map_or(0, Vec::len);
                    let seen = most.entry(id).or_default();
                    *seen = (seen.0.max(count), seen.1.max(holding));
                }
                drop(most);
                std::thread::sleep(Duration::from_millis(20));
            }
        });
        Watch { stop, most, thread }
    }

    /// The most (alive, holding the lock) for each job.
    fn most(self) -> BTreeMap<String, (usize, usize)> {
        self.stop.store(true, Ordering::SeqCst);
        let _ = self.thread.join();
        Arc::try_unwrap(self.most).map(|most| most.into_inner().unwrap()).unwrap_or_default()
    }
}

/// A job's states, read from its event stream to its end.
#[derive(Default)]
struct States(Vec<JobState>);

impl View for States {
    fn state(&mut self, event: &JobEvent, _: &str) {
        self.0.push(event.state);
    }

    fn progress(&mut self, _: &JobView, _: &str) {}
}

/// Injects `fault` (one of this daemon's running workers, if it needs one, chosen by `rng`; never
/// another test's); false when there was no worker to hit.
fn inject(fault: Fault, daemon: &mut Daemon, redis: &mut Redis, rng: &mut SplitMix64) -> bool {
    let state = daemon.state_as_configured();
    let mut worker = || {
        let running = workers_of_daemon(&state);
        (!running.is_empty()).then(|| Pid::from_raw(running[rng.below(running.len())].0 as i32))
    };
    match fault {
        Fault::DaemonKilled => {
            daemon.kill();
            daemon.restart();
        }
        Fault::DaemonStopped => {
            let status = daemon.stop();
            assert!(status.success(), "SIGTERM: {status}\n{}", daemon.log());
            daemon.restart();
        }
        Fault::WorkerKilled => {
            let Some(pid) = worker() else { return false };
            let _ = kill(pid, Signal::SIGKILL);
        }
        Fault::WorkerFrozen => {
            let Some(pid) = worker() else { return false };
            let _ = kill(pid, Signal::SIGSTOP);
            // Past the daemon's 3 missed heartbeats of 500 ms.
            std::thread::sleep(Duration::from_millis(2500));
            let _ = kill(pid, Signal::SIGCONT);
        }
        Fault::RedisKilled => {
            redis.kill();
            std::thread::sleep(Duration::from_millis(500));
            redis.restart();
        }
        Fault::DiskFilled => {
            let ballast = daemon.state.join("ballast");
            fill_disk(&ballast);
            std::thread::sleep(Duration::from_millis(1500));
            fs::remove_file(&ballast).unwrap();
        }
    }
    true
}

/// What is wrong with the published version in `dir`, if anything: its manifest unreadable, a
/// file missing or not the bytes the manifest hashed.
fn version_problems(dir: &Path) -> Result<Manifest, String> {
    let text = fs::read(dir.join("manifest.json")).map_err(|error| format!("{}: {error}", dir.display()))?;
    let manifest: Manifest =
        serde_json::from_slice(&text).map_err(|error| format!("{}/manifest.json: {error}", dir.display()))?;
    for (file, sha256) in &manifest.files {
        let bytes = fs::read(dir.join(file)).map_err(|error| format!("{}/{file}: {error}", dir.display()))?;
        if &hex::encode(Sha256::digest(&bytes)) != sha256 {
            return Err(format!("{}/{file}: not the bytes its manifest hashed", dir.display()));
        }
    }
    Ok(manifest)
}

#[test]
fn jobs_of_three_teams_survive_kills_of_the_daemon_workers_and_redis_with_nothing_lost_or_run_twice() {
    let plan = Plan::from_env();
    let mut redis = Redis::start_with_aof();
    // Room for every job's checkpoints and logs (a tiny model's checkpoint is ~9 MB), filled up
    // by the disk faults.
    let jobs_total = 9 * plan.jobs_per_kind as u32 + 2;
    let disk = SmallDisk { state_mb: 128 + 32 * jobs_total, registry_mb: 256 };
    let mut daemon = Daemon::start_on(disk, &PLUGINS, &redis.url(), &config());
    let dir = tempfile::tempdir().unwrap();
    let data = arith_data(dir.path(), &["--train", "32", "--heldout", "16", "--sft", "64"]);
    let teams = [("tests", TEAM_TOKEN), ("others", OTHER_TOKEN), ("third", THIRD_TOKEN)];
    let started = Instant::now();

    // Every job first (a submit needs the daemon and Redis up), then the faults while they run.
    let watch = Watch::start(daemon.state_as_configured());
    let mut jobs: Vec<(String, &str, String)> = Vec::new();
    for i in 0..plan.jobs_per_kind {
        for (team, token) in teams {
            for kind in ["grpo", "sft", "rejection"] {
                let (status, body) = submit(&daemon, token, &job_spec(&data, team, kind, i), None);
                assert_eq!(status, 201, "{team} {kind}-{i}: {body}");
                jobs.push((body["id"].as_str().unwrap().to_owned(), token, format!("{team} {kind}-{i}")));
            }
        }
    }
    let stages = [
        stage(&data, "cold-start", "builtin:tiny-arith", STAGE_SFT, 3, PERMISSIVE_GATES),
        stage(&data, "grpo", "previous", STAGE_GRPO, 3, PERMISSIVE_GATES),
    ];
    let pipeline_toml =
        pipeline("chaos", &stages).replace("model_line = \"tiny-arith\"", "model_line = \"pipeline\"");
    let team_api = api(&daemon, Some(TEAM_TOKEN));
    let pipeline_toml = team_api.upload_spec_data(&pipeline_toml, SpecFormat::Toml, Path::new("/")).unwrap();
    let pipeline_id = team_api.submit_pipeline(&pipeline_toml, SpecFormat::Toml, None).unwrap().id;

    let mut rng = SplitMix64::new(plan.seed);
    let mut injected: BTreeMap<Fault, usize> = BTreeMap::new();
    for _ in 0..plan.faults {
        std::thread::sleep(Duration::from_millis(1000 + rng.below(3000) as u64));
        let fault = FAULTS[rng.below(FAULTS.len())];
        if inject(fault, &mut daemon, &mut redis, &mut rng) {
            *injected.entry(fault).or_default() += 1;
        }
    }

    // Every job and the pipeline end.
    let admin = api(&daemon, Some(ADMIN_TOKEN));
    let bound = Duration::from_secs(300 + 60 * (plan.jobs_per_kind as u64));
    let settled = wait_until(bound, || {
        jobs.iter().all(|(id, _, _)| admin.job(id).is_ok_and(|job| job.state.is_terminal()))
            && admin.pipeline(&pipeline_id).is_ok_and(|view| view.state.is_terminal())
    });
    let most = watch.most();
    let ended: Vec<(Job, &str, &str)> =
        jobs.iter().map(|(id, token, what)| (job(&daemon, id), *token, what.as_str())).collect();
    assert!(
        settled,
        "not every job ended in {bound:?}: {:#?}\n{}",
        ended
            .iter()
            .filter(|(job, _, _)| !job.state.is_terminal())
            .map(|(job, _, what)| (what, job.to_string()))
            .collect::<Vec<_>>(),
        daemon.log()
    );
    let pipeline_view = admin.pipeline(&pipeline_id).unwrap();

    // Lost: a job the daemon no longer knows (job() panics on a 404, so every id was found), or
    // one without its events to its end.
    let mut lost = Vec::new();
    for (job, _, what) in &ended {
        let mut states = States::default();
        match admin.follow(&job.id, &mut states) {
            Ok(_) if states.0.last() == Some(&job.state) => {}
            other => {
                lost.push(format!("{what}: events {:?} ({:?}), state {:?}", states.0, other.err(), job.state))
            }
        }
    }
    // Duplicated: two workers of one job at once, or one job published twice.
    let mut duplicated: Vec<String> = most
        .iter()
        .filter(|(_, (_, holding))| *holding > 1)
        .map(|(id, (_, holding))| format!("{id}: {holding} workers past its lock at once"))
        .collect();
    let most_alive = most.values().map(|(alive, _)| *alive).max().unwrap_or(0);
    let holding_seen = most.values().filter(|(_, holding)| *holding > 0).count();
    // Inconsistent: a version whose files are not its manifest's, a write in the making left
    // visible, a published job whose version is not there, a sampled dataset the team lacks.
    let mut inconsistent = Vec::new();
    let registry = daemon.state.join("registry");
    // Each job's versions as `LINE/VERSION`: the daemon names them by its own path to the
    // registry, this test reaches them through the disk's namespace.
    let mut publishers: BTreeMap<String, Vec<PathBuf>> = BTreeMap::new();
    for line in fs::read_dir(&registry).into_iter().flatten().flatten() {
        for entry in fs::read_dir(line.path()).into_iter().flatten().flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.starts_with(".staging-") {
                inconsistent.push(format!("{}: a version in the making", entry.path().display()));
            } else if name.parse::<u64>().is_ok() {
                match version_problems(&entry.path()) {
                    Ok(manifest) => publishers
                        .entry(manifest.job_id)
                        .or_default()
                        .push(entry.path().strip_prefix(&registry).unwrap().to_owned()),
                    Err(problem) => inconsistent.push(problem),
                }
            }
        }
    }
    duplicated.extend(
        publishers
            .iter()
            .filter(|(_, versions)| versions.len() > 1)
            .map(|(id, versions)| format!("{id} published {versions:?}")),
    );
    for (job, token, what) in &ended {
        let checkpoints = daemon.state.join(format!("jobs/{}/run/checkpoints", job.id));
        for entry in fs::read_dir(&checkpoints).into_iter().flatten().flatten() {
            if entry.file_name().to_string_lossy().starts_with(".staging-") {
                inconsistent.push(format!("{what}: {} in the making", entry.path().display()));
            }
        }
        let registry_as_configured = daemon.state_as_configured().join("registry");
        match &job.output {
            Some(JobOutput::Checkpoint { path, .. })
                if !Path::new(path).strip_prefix(&registry_as_configured).is_ok_and(|version| {
                    publishers.get(&job.id).is_some_and(|versions| versions.iter().any(|v| v == version))
                }) =>
            {
                inconsistent.push(format!("{what}: published {path}, which is not its version"));
            }
            Some(JobOutput::Dataset { name, sha256 }) => {
                let listed = api(&daemon, Some(token)).datasets().unwrap();
                if !listed.datasets.iter().any(|dataset| &dataset.name == name && &dataset.sha256 == sha256) {
                    inconsistent.push(format!("{what}: its dataset {name}@{sha256} is not the team's"));
                }
            }
            _ => {}
        }
        if job.state == JobState::Published && job.output.is_none() {
            inconsistent.push(format!("{what}: published with no output"));
        }
    }

    let count = |state: JobState| ended.iter().filter(|(job, _, _)| job.state == state).count();
    println!(
        "chaos (seed {}): {} faults injected {injected:?} over {:.0} s; {} jobs and a pipeline of {} stages: \
         {} published, {} refused, {} failed, {} cancelled; pipeline {:?}; lost {}, duplicated {}, inconsistent {} \
         (the lock seen held by the worker of {holding_seen} jobs, never by two; at most {most_alive} \
         worker processes of one job alive at once)",
        plan.seed,
        injected.values().sum::<usize>(),
        started.elapsed().as_secs_f64(),
        ended.len(),
        pipeline_view.stages.len(),
        count(JobState::Published),
        count(JobState::Refused),
        count(JobState::Failed),
        count(JobState::Cancelled),
        pipeline_view.state,
        lost.len(),
        duplicated.len(),
        inconsistent.len(),
    );
    for (job, _, what) in ended.iter().filter(|(job, _, _)| job.state != JobState::Published) {
        println!("  {what}: {:?}: {}", job.state, job.reason);
    }
    // The daemon pings Redis every 2 s: ok by the next ping after the last fault.
    let healthy = wait_until(Duration::from_secs(10), || {
        let (status, body) = daemon.get("/healthz");
        status == 200 && body.contains("\"status\":\"ok\"")
    });
    assert!(healthy, "/healthz: {:?}", daemon.get("/healthz"));
    // A watch that never saw a worker hold its lock could not have seen two.
    assert!(holding_seen * 2 >= ended.len(), "the lock seen held for {holding_seen} jobs of {}", ended.len());
    assert!(
        lost.is_empty() && duplicated.is_empty() && inconsistent.is_empty(),
        "lost {lost:#?}\nduplicated {duplicated:#?}\ninconsistent {inconsistent:#?}"
    );
    assert_ne!(pipeline_view.state, PipelineState::Running);
}
