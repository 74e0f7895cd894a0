//! The job examples of `examples/jobs/` (what `rlvrctl init KIND` writes), against a real
//! `rlvrd serve` with real Redis and every plugin they name: the README's "A first job of your
//! own" runs as written, with a fresh team's token (its cold start `sft.toml`, then `grpo.toml`
//! to published, its gates and the download), beside `rm.toml` (whose reward model `ppo.toml`
//! scores with), submitted by `rlvrctl submit` from the examples' folder; then every `*.toml`
//! there — found by listing the folder, so a new example is covered without touching this file —
//! written by `rlvrctl init KIND DIR` passes `rlvrctl submit --dry-run` from there. And
//! `data/make.sh` remakes the data files byte for byte, so what the examples' comments say about
//! the data stays true.

use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use rlvr_protocol::env::SpanSource;
use rlvr_protocol::job::JobState;
use rlvr_protocol::kind::JobKind;
use rlvr_tests::jobs::{ended, wait_job};
use rlvr_tests::{Daemon, Redis, artifact, cli, sha256_hex, workspace_root};

/// Every plugin library an example names (the built-in optimizers and the reward-model grader
/// need none).
const PLUGINS: [&str; 9] = [
    "rlvr-optimizer-sft",
    "rlvr-optimizer-grpo",
    "rlvr-optimizer-rloo",
    "rlvr-optimizer-ppo",
    "rlvr-optimizer-dpo",
    "rlvr-optimizer-rm",
    "rlvr-verifier-math",
    "rlvr-verifier-format",
    "rlvr-curriculum-frontier",
];

/// The examples name no team: they run for the submitting token's, here a team no example mentions.
const NEWCOMER_TOKEN: &str = "newcomer-team-token";

/// The examples that publish what the others start from, run for real first: `sft.toml` by the
/// README's commands, `rm.toml` from the examples' folder.
const PUBLISHERS: [&str; 2] = ["sft.toml", "rm.toml"];

/// The README's "A first job of your own" commands, as written: each `rlvrctl` command of the
/// section's first code block (split at `&&` and `;`, comments cut), as its arguments. The
/// `export` line is checked to set what the test sets.
fn readme_first_job() -> Vec<Vec<String>> {
    let readme = fs::read_to_string(workspace_root().join("README.md")).expect("README.md");
    let section = readme.split("### A first job of your own").nth(1).expect("the README's first-job section");
    let block = section.split("```").nth(1).expect("its first code block");
    let mut commands = Vec::new();
    for line in block.lines().skip(1) {
        let line = line.split(" #").next().unwrap_or_default();
        for command in line.split(['&', ';']).map(str::trim).filter(|command| !command.is_empty()) {
            if let Some(exports) = command.strip_prefix("export ") {
                let names: Vec<&str> =
                    exports.split_whitespace().filter_map(|pair| pair.split('=').next()).collect();
                assert_eq!(names, ["RLVR_SERVER", "RLVR_TOKEN"], "the README's export line: {command}");
                continue;
            }
            let words: Vec<String> = command.split_whitespace().map(str::to_owned).collect();
            assert_eq!(
                words.first().map(String::as_str),
                Some("rlvrctl"),
                "not an rlvrctl command: {command}"
            );
            commands.push(words[1..].to_vec());
        }
    }
    assert!(commands.len() >= 6, "the README's first-job block: {commands:?}");
    commands
}

/// Runs the README's first-job commands in a new folder as a newcomer would, each to exit 0, `ID`
/// being the job the last `submit` printed; the ids of the jobs submitted.
fn run_readme_first_job(daemon: &Daemon, dir: &Path) -> Vec<String> {
    let env = [("RLVR_SERVER", daemon.url.as_str()), ("RLVR_TOKEN", NEWCOMER_TOKEN)];
    let mut submitted: Vec<String> = Vec::new();
    for command in readme_first_job() {
        let last = submitted.last().cloned();
        let args: Vec<&str> = command
            .iter()
            .map(|arg| if arg == "ID" { last.as_deref().expect("a job submitted before ID") } else { arg })
            .collect();
        let output = cli::run(&artifact("rlvrctl"), &args, dir, &env);
        assert!(output.status.success(), "the README's `rlvrctl {}`: {}", args.join(" "), cli::text(&output));
        if args[0] == "submit" && !args.contains(&"--dry-run") {
            let stdout = String::from_utf8_lossy(&output.stdout);
            submitted.push(stdout.lines().next().expect("the job's id first").trim().to_owned());
        }
        eprintln!("README: rlvrctl {}: done", args.join(" "));
    }
    submitted
}

fn examples_dir() -> PathBuf {
    workspace_root().join("examples/jobs")
}

/// Every job and pipeline spec of the examples, by name.
fn examples() -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = fs::read_dir(examples_dir())
        .expect("examples/jobs")
        .map(|entry| entry.expect("an entry").path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "toml"))
        .collect();
    files.sort();
    files
}

/// What a user does with an example: `rlvrctl init KIND DIR`, then `rlvrctl --json submit
/// --dry-run KIND.toml` from DIR (its data uploaded as the team's datasets, a pipeline checked as
/// one). The dry run's exit status and what it printed: the spec as the job would keep it.
fn init_and_dry_run(daemon: &Daemon, kind: &str, dir: &Path) -> (bool, String) {
    let rlvrctl = artifact("rlvrctl");
    let env = [("RLVR_SERVER", daemon.url.as_str()), ("RLVR_TOKEN", NEWCOMER_TOKEN)];
    let target = dir.join(kind);
    let init = cli::run(&rlvrctl, &["init", kind, target.to_str().unwrap()], dir, &[]);
    assert!(init.status.success(), "rlvrctl init {kind}: {}", cli::text(&init));
    let spec = format!("{kind}.toml");
    let output = cli::run(&rlvrctl, &["--json", "submit", "--dry-run", &spec], &target, &env);
    (output.status.success(), cli::text(&output))
}

#[test]
fn every_example_passes_the_dry_run_and_the_ones_others_start_from_run_to_published() {
    let started = Instant::now();
    let redis = Redis::start();
    // The newcomer team's token first (right after the harness's own [[auth.tokens]]); two CPU slots,
    // so the two examples that run do so side by side; one libtorch thread per worker.
    // env.toml's environment server is on loopback, which the operator allows as its comment says;
    // the same environment is installed too, for a job to start as its sidecar.
    let (_installed, environments, environments_python) = rlvr_tests::openenv::installed_environments();
    let config = format!(
        "[[auth.tokens]]\nteam = \"newcomer\"\nsha256 = {:?}\nadmin = false\n\
         [queue]\nworker_threads = 1\n[devices]\ncpu_slots = 2\ncpu_slot_memory_gb = 8\n{}\
         [engines]\nenvironments = {:?}\nenvironments_python = {:?}\n",
        sha256_hex(NEWCOMER_TOKEN),
        rlvr_tests::OUTBOUND_LOOPBACK,
        environments,
        environments_python,
    );
    let daemon = Daemon::start_with(&PLUGINS, &redis.url(), &config);
    eprintln!("rlvrd serving with {} plugins ({:.0} s)", PLUGINS.len(), started.elapsed().as_secs_f64());
    let examples = examples();
    let names: Vec<String> =
        examples.iter().map(|file| file.file_name().unwrap().to_string_lossy().into_owned()).collect();
    for publisher in PUBLISHERS {
        assert!(names.iter().any(|name| name == publisher), "{publisher} is missing: {names:?}");
    }

    // `rm.toml`, as a user runs an example: `rlvrctl submit FILE` from the examples' folder; the
    // README's commands beside it, in a folder of their own.
    let env = [("RLVR_SERVER", daemon.url.as_str()), ("RLVR_TOKEN", NEWCOMER_TOKEN)];
    let output = cli::run(&artifact("rlvrctl"), &["submit", "rm.toml"], &examples_dir(), &env);
    assert!(output.status.success(), "rlvrctl submit rm.toml: {}", cli::text(&output));
    let rm = String::from_utf8_lossy(&output.stdout).trim().to_owned();
    let newcomer = tempfile::tempdir().unwrap();
    let readme_jobs = run_readme_first_job(&daemon, newcomer.path());
    assert_eq!(readme_jobs.len(), 2, "the README submits the cold start and the GRPO job: {readme_jobs:?}");
    let downloaded = newcomer.path().join("model");
    assert!(downloaded.join("config.json").is_file(), "the README's download: {}", downloaded.display());
    eprintln!("the README's first job ran ({:.0} s)", started.elapsed().as_secs_f64());
    // `env.toml` from the cold start the README published, for real but for 8 of its steps, against
    // its environment server (on a port of its own): an [env] job under the daemon, its sessions
    // under the operator's outbound policy, its device grant given back while they wait.
    let server = rlvr_tests::openenv::EnvServer::start(&["--pad", "--max-concurrent-envs", "256"]);
    let env_dir = tempfile::tempdir().unwrap();
    let init = cli::run(&artifact("rlvrctl"), &["init", "env", "."], env_dir.path(), &[]);
    assert!(init.status.success(), "rlvrctl init env: {}", cli::text(&init));
    let env_spec = env_dir.path().join("env.toml");
    let text = fs::read_to_string(&env_spec).unwrap();
    let server_url = server.url.clone();
    let short = text.replace("http://127.0.0.1:8000", &server_url).replace("max_steps = 50", "max_steps = 8");
    assert_ne!(short, text, "env.toml's url and steps");
    fs::write(&env_spec, short).unwrap();
    // What the job will train on, before it is submitted: its first episodes played on the daemon.
    let check = cli::run(&artifact("rlvrctl"), &["env", "check", "env.toml"], env_dir.path(), &env);
    let shown = cli::text(&check);
    assert!(check.status.success(), "rlvrctl env check: {shown}\n{}", daemon.log());
    for expected in
        ["episode 1 of 2: record ", "episode 2 of 2: ", "  prompt ", "  model ", ", trained", "  end "]
    {
        assert!(shown.contains(expected), "rlvrctl env check: no {expected:?} in\n{shown}");
    }
    let too_many = cli::run(
        &artifact("rlvrctl"),
        &["env", "check", "env.toml", "--episodes", "9"],
        env_dir.path(),
        &env,
    );
    assert!(
        !too_many.status.success()
            && cli::text(&too_many).contains("episodes: expected 1 to 8 episodes, got 9"),
        "{}",
        cli::text(&too_many)
    );
    let output = cli::run(&artifact("rlvrctl"), &["submit", "env.toml"], env_dir.path(), &env);
    assert!(output.status.success(), "rlvrctl submit env.toml: {}", cli::text(&output));
    let env_job = String::from_utf8_lossy(&output.stdout).trim().to_owned();
    let jobs = [
        ("sft.toml", &readme_jobs[0], JobKind::OfflineSft),
        ("grpo.toml", &readme_jobs[1], JobKind::OnlineGroups),
        ("rm.toml", &rm, JobKind::RewardModel),
    ];
    for (name, id, kind) in jobs {
        let job = wait_job(&daemon, id, Duration::from_secs(300), ended);
        assert_eq!(job.kind, Some(kind), "{name}: {job}");
        // The premise of publishing (the gates publish a held-out gain over the start): the run
        // learned. Its candidate's held-out score against the start's, when it trained to a result.
        let result = job.outcome();
        let best = result.candidate.as_ref().and_then(|candidate| candidate.heldout).or(result.heldout_after);
        if let (Some(before), Some(best)) = (result.heldout_before, best) {
            assert!(
                best > before,
                "premise: the run did not learn: {name}: held-out {before:.3} → {best:.3} (its best)\n{job}"
            );
        }
        assert_eq!(job.state, JobState::Published, "{name}: {job}\n{}", daemon.log());
        eprintln!(
            "{name}: published as {} ({:.0} s)",
            job.published_dir().display(),
            started.elapsed().as_secs_f64()
        );
    }

    let job = wait_job(&daemon, &env_job, Duration::from_secs(300), ended);
    assert!(
        matches!(job.state, JobState::Published | JobState::Refused),
        "env.toml: {job}\n{}",
        daemon.log()
    );
    assert!(
        job.outcome().heldout_before.is_some(),
        "env.toml: held-out played through the environment: {job}"
    );
    let metrics = rlvr_tests::jobs::get(&daemon, NEWCOMER_TOKEN, &format!("/v1/jobs/{env_job}/metrics")).1;
    let lines = metrics.to_string();
    assert_eq!(lines.matches("\"episodes\":256").count(), 8, "each step's 32 × 8 episodes: {lines}");
    drop(server);
    eprintln!("env.toml: {:?} after 8 steps ({:.0} s)", job.state, started.elapsed().as_secs_f64());

    // The same job on the installed environment instead: the daemon starts it as the worker's
    // sidecar; a cancel while it plays ends the worker, and the sidecar with it.
    // Long enough that the cancel always comes while it plays.
    let installed = fs::read_to_string(&env_spec)
        .unwrap()
        .replace(
            &format!("url = \"{}\"", server_url),
            "environment = \"arith_feedback\"\nargs = [\"--pad\", \"--max-concurrent-envs\", \"256\"]",
        )
        .replace("max_steps = 8", "max_steps = 1000");
    fs::write(&env_spec, &installed).unwrap();
    // Checked on its sidecar too, the answer as JSON: spans from the prompt, the model, the reply.
    let check = cli::run(
        &artifact("rlvrctl"),
        &["--json", "env", "check", "env.toml", "--episodes", "1"],
        env_dir.path(),
        &env,
    );
    assert!(check.status.success(), "rlvrctl env check (installed): {}\n{}", cli::text(&check), daemon.log());
    let checked: rlvr_protocol::env::EnvCheck = serde_json::from_slice(&check.stdout).unwrap();
    let [episode] = checked.episodes.as_slice() else { panic!("one episode asked for: {checked:?}") };
    let sources: Vec<SpanSource> = episode.spans.iter().map(|span| span.from).collect();
    assert_eq!(sources[..2], [SpanSource::Prompt, SpanSource::Model], "{episode:?}");
    assert_eq!(
        sources.iter().filter(|from| **from == SpanSource::Model).count(),
        episode.turns,
        "{episode:?}"
    );
    let output = cli::run(&artifact("rlvrctl"), &["submit", "env.toml"], env_dir.path(), &env);
    assert!(output.status.success(), "rlvrctl submit env.toml (installed): {}", cli::text(&output));
    let sidecar_job = String::from_utf8_lossy(&output.stdout).trim().to_owned();
    let sidecars = || -> usize {
        fs::read_dir("/proc")
            .unwrap()
            .filter_map(|entry| fs::read(entry.ok()?.path().join("cmdline")).ok())
            .filter(|cmdline| String::from_utf8_lossy(cmdline).contains(environments.to_str().unwrap()))
            .count()
    };
    wait_job(&daemon, &sidecar_job, Duration::from_secs(300), |job| job.step >= 1 || ended(job));
    assert!(sidecars() > 0, "no sidecar serves the installed environment's job\n{}", daemon.log());
    let cancel = cli::run(&artifact("rlvrctl"), &["cancel", &sidecar_job], env_dir.path(), &env);
    assert!(cancel.status.success(), "rlvrctl cancel: {}", cli::text(&cancel));
    let job = wait_job(&daemon, &sidecar_job, Duration::from_secs(120), ended);
    assert_eq!(job.state, JobState::Cancelled, "{job}");
    assert!(
        rlvr_tests::wait_until(Duration::from_secs(30), || sidecars() == 0),
        "the sidecar outlived its cancelled job"
    );

    // Every example, as `rlvrctl init` writes it: the dry run checks what submit checks (plugins
    // and their options, the data, the lines it names, resources) and queues nothing.
    let dir = tempfile::tempdir().unwrap();
    let mut refused = Vec::new();
    for file in &examples {
        let kind = file.file_stem().unwrap().to_str().unwrap();
        let (passed, output) = init_and_dry_run(&daemon, kind, dir.path());
        if !passed {
            refused.push(format!("{kind}: {output}"));
            continue;
        }
        // It printed the spec as the job (or pipeline) would keep it: names pinned.
        assert!(!output.contains("\"data/"), "{kind}: a local path left in {output}");
        if output.contains("line:tiny-arith-sft") {
            assert!(output.contains("line:tiny-arith-sft@1"), "{kind}: the line not pinned: {output}");
        }
    }
    assert!(refused.is_empty(), "examples refused by the dry run:\n{}", refused.join("\n"));
    eprintln!("{} examples passed the dry run ({:.0} s)", examples.len(), started.elapsed().as_secs_f64());
}

/// `data/make.sh` writes exactly the data files the examples ship, and the folder stays small:
/// `rlvrctl` carries all of it for `rlvrctl init`.
#[test]
fn the_example_data_is_what_make_sh_makes_and_the_folder_stays_small() {
    let dir = tempfile::tempdir().unwrap();
    let script = examples_dir().join("data/make.sh");
    let rlvrd = artifact("rlvrd");
    let output = std::process::Command::new("bash")
        .arg(&script)
        .arg(&rlvrd)
        .arg(dir.path())
        .output()
        .expect("run data/make.sh");
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let mut made: Vec<String> = fs::read_dir(dir.path())
        .unwrap()
        .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    made.sort();
    let mut shipped: Vec<String> = fs::read_dir(examples_dir().join("data"))
        .unwrap()
        .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|name| name.ends_with(".jsonl"))
        .collect();
    shipped.sort();
    assert_eq!(made, shipped);
    for name in made {
        let ours = fs::read(examples_dir().join("data").join(&name)).unwrap();
        assert!(
            ours == fs::read(dir.path().join(&name)).unwrap(),
            "data/{name} differs from what make.sh makes"
        );
    }
}
