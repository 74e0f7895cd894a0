//! `[env]` environments through `rlvr_env`'s OpenEnv client against real OpenEnv 0.10.0 servers
//! (`examples/envs/arith_feedback.py` on the venv `scripts/openenv-venv.sh` makes): an episode
//! of two turns, a malformed action refused with the environment's reason, a server at capacity
//! refused with its limit, a slow step cut at the timeout, and a destination the outbound policy
//! does not allow never reached.

use std::process::Stdio;
use std::time::Duration;

use rlvr_env::{EnvError, Session};
use rlvr_outbound::Policy;
use rlvr_tests::openenv::EnvServer;
use rlvr_tests::wait_until;
use serde_json::{Map, Value, json};

fn args(value: Value) -> Map<String, Value> {
    value.as_object().unwrap().clone()
}

fn text(reply: &rlvr_env::Reply) -> &str {
    reply.observation["text"].as_str().unwrap()
}

#[test]
fn an_openenv_episode_its_refusals_and_limits_each_as_the_server_says() {
    let server = EnvServer::start(&["--max-concurrent-envs", "2"]);
    // Far slower than the timeout below, which is far above what a loaded machine takes to open
    // a session: only the step can run past it.
    let slow = EnvServer::start(&["--step-delay-s", "30"]);
    let policy = Policy::new(&["127.0.0.1/32".to_owned()], false).unwrap();
    let timeout = Duration::from_secs(20);

    // Two turns: a wrong answer gets the sum back, the right one ends the episode with reward 1.
    let mut session = Session::open(&server.url, &policy, timeout).unwrap();
    let first = session.reset(&args(json!({"a": 12, "b": 30}))).unwrap();
    assert_eq!((text(&first), first.done), ("12+30=", false));
    let wrong = session.step(&json!({"answer": "41"})).unwrap();
    assert_eq!((text(&wrong), wrong.reward, wrong.done), (" no:42 12+30=", Some(0.0), false));
    let right = session.step(&json!({"answer": "42"})).unwrap();
    assert_eq!((right.reward, right.done), (Some(1.0), true));

    // A malformed action: the environment's validation, naming the missing field; the session
    // goes on.
    session.reset(&args(json!({"a": 1, "b": 2}))).unwrap();
    let error = session.step(&json!({"wrong": "3"})).unwrap_err();
    assert!(
        matches!(&error, EnvError::Env { code, message, .. } if code == "VALIDATION_ERROR" && message.contains("answer")),
        "{error}"
    );
    assert_eq!(session.step(&json!({"answer": "3"})).unwrap().reward, Some(1.0));

    // At capacity (2): a third session is refused with the limit named; one closed, it opens.
    let second = Session::open(&server.url, &policy, timeout).unwrap();
    let mut third = Session::open(&server.url, &policy, timeout).unwrap();
    let error = third.reset(&Map::new()).unwrap_err();
    assert!(matches!(error, EnvError::Capacity { max: Some(2), .. }), "{error}");
    assert!(error.to_string().contains("at most 2 sessions"), "{error}");
    second.close();
    let reopened = wait_until(Duration::from_secs(10), || {
        Session::open(&server.url, &policy, timeout).and_then(|mut s| s.reset(&Map::new())).is_ok()
    });
    assert!(reopened, "a closed session's place was not given back");

    // A step slower than the timeout is cut there, naming it.
    let mut session = Session::open(&slow.url, &policy, Duration::from_secs(5)).unwrap();
    session.reset(&args(json!({"a": 1, "b": 1}))).unwrap();
    let error = session.step(&json!({"answer": "2"})).unwrap_err();
    assert!(matches!(error, EnvError::Timeout { what: "step", .. }), "{error}");

    // regression: an allow-list entry of the server's address and port refused the session
    // (the address was checked again as if a name had resolved to it, without its port).
    let exact = Policy::new(&[server.url.trim_start_matches("http://").to_owned()], false).unwrap();
    Session::open(&server.url, &exact, timeout).unwrap().close();

    // Loopback the policy does not allow: refused before any connection.
    let error = Session::open(&server.url, &Policy::new(&[], false).unwrap(), timeout).err().unwrap();
    assert!(matches!(error, EnvError::Refused(_)), "{error}");
    let error = Session::open("https://127.0.0.1:1", &policy, timeout).err().unwrap();
    assert!(error.to_string().contains("only http://"), "{error}");
}

/// Episodes played by the worker (`rlvr_worker::episodes::play`) on `builtin:tiny-arith` against
/// the same server: each a session of its own, turns sampled in one batch, the replies appended as
/// they come, masked out, the sessions kept for the next round. The untrained model's turns end at the first character of the stop
/// list (so most turns are actions), and its answers are wrong: a first wrong answer gets the sum
/// back and a second try; the environment ends the episode after it.
#[test]
fn the_worker_plays_multi_turn_episodes_token_in_token_out() {
    use rlvr_protocol::env::EnvReward;
    use rlvr_worker::episodes::{DeviceUse, EpisodeEnd, EpisodeSettings, play};

    // Room for one round's sessions and no more: a second round must run on the first's.
    let server = EnvServer::start(&["--max-concurrent-envs", "8"]);
    let model = rlvr_model::load("builtin:tiny-arith", tch::Device::Cpu, tch::Kind::Float).unwrap();
    let settings = EpisodeSettings {
        server: server.url.clone(),
        policy: Policy::new(&["127.0.0.1/32".to_owned()], false).unwrap(),
        step_timeout: Duration::from_secs(20),
        max_turns: 3,
        action: rlvr_env::ActionFormat::Field("answer".into()),
        observation_field: "text".into(),
        reply_role: "user".into(),
        reward: EnvReward::Sum,
        sessions: 8,
    };
    let stop: Vec<String> = ('a'..='z').chain('0'..='9').map(String::from).collect();
    let params =
        rlvr_model::SamplingParams { max_new_tokens: 6, temperature: 1.0, stop, ..Default::default() };
    let problems = [(12, 30), (5, 7)];
    let resets: Vec<Map<String, Value>> =
        problems.iter().flat_map(|&(a, b)| std::iter::repeat_n(args(json!({"a": a, "b": b})), 4)).collect();
    let mut rng = rlvr_model::SamplerRng::new(7);
    let mut uses = Vec::new();
    let mut idle = Vec::new();
    let round = play(&model, &params, &mut rng, &resets, (&settings, &mut idle), &mut |used| {
        uses.push(used);
        Ok(())
    })
    .unwrap();
    // The device given back while the sessions open and reset and while each turn's steps run,
    // held again to sample each turn.
    assert_eq!(uses.first(), Some(&DeviceUse::Release), "{uses:?}");
    assert!(uses.windows(2).all(|pair| pair[0] != pair[1]), "{uses:?}");
    let turns = uses.iter().filter(|&&used| used == DeviceUse::Hold).count();
    assert!((2..=3).contains(&turns), "{uses:?}");
    assert!(round.env_s > 0.0);
    let played = round.played;
    assert_eq!(played.len(), 8);
    let tokenizer = &model.tokenizer;
    let mut replies = 0;
    for (i, game) in played.iter().enumerate() {
        let (a, b) = problems[i / 4];
        let episode = &game.episode;
        assert_eq!(episode.prompt, tokenizer.encode_prompt(&format!("{a}+{b}=")).unwrap(), "episode {i}");
        assert!(episode.turns >= 1 && game.env_s > 0.0, "episode {i}");
        // The environment's text between turns, exactly, masked out; the turns 1.
        let reply: Vec<i64> = tokenizer.encode(&format!(" no:{} {a}+{b}=", a + b)).unwrap();
        let spans = runs(&episode.mask);
        assert_eq!(
            spans.iter().filter(|(sampled, _)| *sampled).count(),
            episode.turns,
            "episode {i}: {spans:?}"
        );
        for &(sampled, ref range) in &spans {
            if !sampled {
                assert_eq!(&episode.tokens[range.clone()], reply.as_slice(), "episode {i}");
                assert!(episode.logprobs[range.clone()].iter().all(|&l| l == 0.0));
                replies += 1;
            }
        }
        // How it ended, and what the environment paid (every answer here is wrong).
        assert_eq!(game.reward, 0.0, "episode {i}");
        match &game.end {
            EpisodeEnd::Done => assert_eq!((game.rewards.len(), episode.turns), (2, 2), "episode {i}"),
            EpisodeEnd::TokenBudget => assert_eq!(game.rewards.len(), episode.turns - 1, "episode {i}"),
            other => panic!("episode {i} ended {other:?}"),
        }
    }
    assert!(replies > 0, "no episode got a reply");

    // The sessions are kept for the next round, which resets them instead of opening more (the
    // server holds 8), and keeps them again.
    assert_eq!(idle.len(), 8);
    let again = play(&model, &params, &mut rng, &resets, (&settings, &mut idle), &mut |_| Ok(())).unwrap();
    assert!(again.played.iter().all(|game| !matches!(game.end, EpisodeEnd::EnvError(_))));
    assert_eq!(idle.len(), 8);

    // A turn that is not an action (here no turn is JSON) ends its episode there, naming why;
    // nothing is sent, and its session is kept.
    let json = EpisodeSettings { action: rlvr_env::ActionFormat::Json, ..settings.clone() };
    let round = play(&model, &params, &mut rng, &resets, (&json, &mut idle), &mut |_| Ok(())).unwrap();
    for game in &round.played {
        assert!(matches!(&game.end, EpisodeEnd::NotAnAction(why) if why.contains("JSON")), "{:?}", game.end);
        assert_eq!((game.episode.turns, game.rewards.len()), (1, 0));
    }
    assert_eq!(idle.len(), 8);

    // An action the environment's schema refuses (no `answer`) is the model's fault too: its
    // episode ends naming the environment's reason, and its session goes on.
    let wrong_field =
        EpisodeSettings { action: rlvr_env::ActionFormat::Field("guess".into()), ..settings.clone() };
    let round = play(&model, &params, &mut rng, &resets, (&wrong_field, &mut idle), &mut |_| Ok(())).unwrap();
    let refused = |game: &&rlvr_worker::episodes::Played| matches!(&game.end, EpisodeEnd::NotAnAction(why) if why.starts_with("the environment refused the action") && why.contains("answer"));
    assert!(
        round.played.iter().any(|game| refused(&game)),
        "{:?}",
        round.played.iter().map(|g| &g.end).collect::<Vec<_>>()
    );
    assert!(round.played.iter().all(|game| refused(&game) || game.end == EpisodeEnd::TokenBudget));
    assert_eq!(idle.len(), 8);

    // A step slower than step_timeout_s ends its episode with an environment error naming the
    // timeout; the session it was cut on is not kept.
    let slow = EnvServer::start(&["--step-delay-s", "30"]);
    let cut = EpisodeSettings {
        server: slow.url.clone(),
        step_timeout: Duration::from_secs(5),
        ..settings.clone()
    };
    let mut slow_idle = Vec::new();
    let round =
        play(&model, &params, &mut rng, &resets[..4], (&cut, &mut slow_idle), &mut |_| Ok(())).unwrap();
    let cut_off = round.played.iter().filter(|game| matches!(&game.end, EpisodeEnd::EnvError(why) if why.contains("no answer to step within 5"))).count();
    assert!(cut_off > 0, "{:?}", round.played.iter().map(|game| &game.end).collect::<Vec<_>>());
    assert_eq!(slow_idle.len(), 4 - cut_off, "a session cut at its timeout was kept");

    // A server gone (crashed, stopped): the round cannot start, and says where.
    drop(server);
    let error =
        play(&model, &params, &mut rng, &resets, (&settings, &mut idle), &mut |_| Ok(())).err().unwrap();
    assert!(error.to_string().contains("127.0.0.1"), "{error}");
}

/// The runs of equal values in `mask`: (sampled, the range).
fn runs(mask: &[f32]) -> Vec<(bool, std::ops::Range<usize>)> {
    let mut runs: Vec<(bool, std::ops::Range<usize>)> = Vec::new();
    for (i, &m) in mask.iter().enumerate() {
        let sampled = m > 0.0;
        match runs.last_mut() {
            Some((last, range)) if *last == sampled => range.end = i + 1,
            _ => runs.push((sampled, i..i + 1)),
        }
    }
    runs
}

/// An `[env]` GRPO job on `builtin:tiny-arith` (turns end at their first character, so most are
/// wrong answers that get the sum back) with `max_turns` 3 against an `arith_feedback.py` server,
/// its reward a formula over the environment's (`2 * env`).
fn env_spec(dir: &std::path::Path, url: &str, prompts: u32, checkpoint_every: u32) -> std::path::PathBuf {
    let (train, heldout) = (dir.join("env-train.jsonl"), dir.join("env-heldout.jsonl"));
    for (path, problems) in
        [(&train, &[(3, 4), (12, 30), (5, 7), (9, 9)][..]), (&heldout, &[(2, 2), (6, 1)][..])]
    {
        let lines: Vec<String> = problems
            .iter()
            .enumerate()
            .map(|(i, (a, b))| {
                json!({"id": format!("p{i}"), "prompt": format!("{a}+{b}="), "reference": {"a": a, "b": b}})
                    .to_string()
            })
            .collect();
        std::fs::write(path, lines.join("\n") + "\n").unwrap();
    }
    let stop: Vec<String> =
        ('a'..='z').chain('0'..='9').map(|c| format!("{c:?}").replace('\'', "\"")).collect();
    let spec = format!(
        r#"
[job]
name = "env"
team = "tests"
model_line = "tiny-arith"
seed = 3
[model]
policy = "builtin:tiny-arith"
[data]
train = "{train}"
heldout = "{heldout}"
[optimizer]
plugin = "grpo"
group_size = 4
lr = 1e-3
[rollout]
max_new_tokens = 6
prompts_per_step = {prompts}
stop = [{stop}]
[budget]
max_steps = 4
[checkpoint]
every_steps = {checkpoint_every}
[reward]
formula = "2 * env"
[env]
kind = "openenv"
url = "{url}"
max_turns = 3
action = "field"
action_field = "answer"
"#,
        train = train.display(),
        heldout = heldout.display(),
        stop = stop.join(", "),
    );
    let path = dir.join(format!("env-{prompts}.toml"));
    std::fs::write(&path, spec).unwrap();
    path
}

/// An `[env]` job through `rlvr-worker run` with the real grpo plugin: a server that cannot hold a
/// step's sessions is refused before the first step, naming its limit; a job's rollout records hold
/// each episode token in, token out (the environment's replies exactly as the template — here the
/// built-in model's plain text — gives them, masked out with log-probability 0, the model's turns
/// as sampled); a run killed with SIGKILL and resumed ends exactly as an uninterrupted one (each
/// step's episodes replayed from their start).
#[test]
fn an_env_job_trains_on_episodes_token_in_token_out_and_resumes_exactly() {
    use rlvr_protocol::worker::RolloutRecord;
    use rlvr_tests::{worker_command, worker_plugins};

    let server = EnvServer::start(&["--max-concurrent-envs", "8"]);
    let dir = tempfile::tempdir().unwrap();
    let plugins = worker_plugins(dir.path());

    // 4 prompts × 4 = 16 sessions a step on a server of 8: refused at start, saying so.
    let too_many = env_spec(dir.path(), &server.url, 4, 2);
    let output = worker_command(&too_many, &dir.path().join("too-many"), &plugins, &[]).output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("env.url: ") && stderr.contains("at most 8 sessions"), "{stderr}");

    // What the job would train on, before it runs: its first two episodes, turn by turn.
    let spec = env_spec(dir.path(), &server.url, 2, 2);
    let check = std::process::Command::new(rlvr_tests::artifact("rlvr-worker"))
        .args(["env-check", "--episodes", "2", "--spec"])
        .arg(&spec)
        .output()
        .unwrap();
    let shown = String::from_utf8_lossy(&check.stdout);
    assert!(check.status.success(), "{shown}{}", String::from_utf8_lossy(&check.stderr));
    assert_eq!(shown.matches("episode ").count(), 2, "{shown}");
    assert!(shown.contains("episode 1 of 2: record p0, reset {\"a\":3,\"b\":4}"), "{shown}");
    assert!(shown.contains("  prompt \"3+4=\""), "{shown}");
    assert!(shown.lines().any(|line| line.starts_with("  model ") && line.ends_with("trained")), "{shown}");
    assert!(shown.contains("  env    \" no:7 3+4=\""), "{shown}");
    assert!(shown.lines().any(|line| line.starts_with("  env ") && line.ends_with("masked out")), "{shown}");
    assert!(shown.contains("  end    "), "{shown}");

    // 2 × 4 = 8: it runs, straight through, and again killed after step 3 and resumed from step 2.
    let straight = dir.path().join("straight");
    let outcome = worker_command(&spec, &straight, &plugins, &[]).output().unwrap();
    assert!(outcome.status.success(), "{}", String::from_utf8_lossy(&outcome.stderr));
    let killed = dir.path().join("killed");
    let mut child = worker_command(&spec, &killed, &plugins, &[])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let past_step_3 = wait_until(Duration::from_secs(120), || {
        std::fs::read_to_string(killed.join("metrics.jsonl")).is_ok_and(|text| text.lines().count() >= 4)
    });
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(past_step_3, "the run never reached step 3");
    let resumed = worker_command(&spec, &killed, &plugins, &["--resume"]).output().unwrap();
    assert!(resumed.status.success(), "{}", String::from_utf8_lossy(&resumed.stderr));
    let weights = |output: &std::process::Output| {
        serde_json::from_slice::<Value>(&output.stdout).unwrap()["weights_sha256"].clone()
    };
    assert_eq!(weights(&resumed), weights(&outcome), "weights differ after resume");
    let rollouts = |state: &std::path::Path| std::fs::read_to_string(state.join("rollouts.jsonl")).unwrap();
    assert_eq!(rollouts(&killed), rollouts(&straight), "the resumed run played its episodes otherwise");

    // Token in, token out, row by row.
    let tokenizer =
        rlvr_model::load("builtin:tiny-arith", tch::Device::Cpu, tch::Kind::Float).unwrap().tokenizer;
    let records: Vec<RolloutRecord> =
        rollouts(&straight).lines().map(|line| serde_json::from_str(line).unwrap()).collect();
    assert_eq!(records.len(), 4 * 2 * 4, "steps × prompts × group");
    let mut replies = 0;
    for record in &records {
        let episode = record.episode.as_ref().expect("every record of an [env] job holds its episode");
        let (a, b) = record.prompt.trim_end_matches('=').split_once('+').unwrap();
        let sum = a.parse::<i64>().unwrap() + b.parse::<i64>().unwrap();
        assert_eq!(episode.prompt_tokens, tokenizer.encode_prompt(&record.prompt).unwrap(), "{record:?}");
        assert_eq!((episode.tokens.len(), episode.logprobs.len()), (episode.mask.len(), episode.mask.len()));
        assert_eq!(record.completion, tokenizer.decode(&episode.tokens));
        assert_eq!(record.finish, episode.end);
        let mask: Vec<f32> = episode.mask.iter().map(|&m| f32::from(m)).collect();
        let spans = runs(&mask);
        assert_eq!(spans.iter().filter(|(sampled, _)| *sampled).count(), episode.turns, "{record:?}");
        for (sampled, range) in spans {
            if sampled {
                assert!(episode.logprobs[range].iter().all(|&l| l.is_finite() && l <= 0.0), "{record:?}");
            } else {
                let reply = tokenizer.encode(&format!(" no:{sum} {a}+{b}=")).unwrap();
                assert_eq!(&episode.tokens[range.clone()], reply.as_slice(), "{record:?}");
                assert!(episode.logprobs[range].iter().all(|&l| l == 0.0), "{record:?}");
                replies += 1;
            }
        }
        // The reward is the formula's over the environment's (a right answer is the only way to 1).
        assert_eq!(record.components.get("env").map(|env| 2.0 * env), Some(record.reward), "{record:?}");
        assert_eq!(record.passed, record.reward > 0.0);
    }
    assert!(replies > 0, "no episode got a reply");
    let metrics = std::fs::read_to_string(straight.join("metrics.jsonl")).unwrap();
    let step: Value = serde_json::from_str(metrics.lines().nth(1).unwrap()).unwrap();
    assert_eq!(step["env"]["episodes"], 8, "{step}");
    assert!(step["env"]["turns_mean"].as_f64().unwrap() >= 1.0, "{step}");

    // The environment gone (its server stopped): not the job's fault, exit 70 (the daemon
    // requeues the job, within its crash limit), naming the server.
    let url = server.url.clone();
    drop(server);
    let output = worker_command(&spec, &dir.path().join("gone"), &plugins, &[]).output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(70), "{stderr}");
    assert!(stderr.contains(&format!("env.url: {url}")), "{stderr}");
}

/// An installed environment (`env.environment`) runs as the job's sidecar, in the graders'
/// sandbox on a Unix socket: `hostile.py` first tries to read a file outside its directories, to
/// reach the host's loopback and to leave a process behind, then serves `arith_feedback.py`. The
/// job trains on its episodes; the file and the port were out of reach (the listener never saw a
/// connection), and nothing it started outlives the worker — killed with SIGKILL mid-run here.
#[test]
fn an_installed_environment_runs_as_the_jobs_sandboxed_sidecar_and_reaches_nothing_else() {
    use rlvr_tests::{worker_command, worker_plugins};

    let (_installed, environments, python) = rlvr_tests::openenv::installed_environments();
    let dir = tempfile::tempdir().unwrap();
    let plugins = worker_plugins(dir.path());
    let secret = dir.path().join("secret");
    std::fs::write(&secret, "the worker's secret").unwrap();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let marker = format!("rlvr-sidecar-marker-{}", std::process::id());
    let url_spec = std::fs::read_to_string(env_spec(dir.path(), "http://127.0.0.1:1", 2, 1)).unwrap();
    let sidecar = format!(
        "environment = \"hostile\"\nargs = [\"--secret\", \"{}\", \"--probe-port\", \"{}\", \"--marker\", \"{marker}\", \"--max-concurrent-envs\", \"8\"]",
        secret.display(),
        listener.local_addr().unwrap().port()
    );
    let spec = dir.path().join("sidecar.toml");
    std::fs::write(&spec, url_spec.replace("url = \"http://127.0.0.1:1\"", &sidecar)).unwrap();
    let script = environments.join("hostile.py");
    let env_args = ["--env-script", script.to_str().unwrap(), "--env-python", python.to_str().unwrap()];

    // Straight through: it trains on the sidecar's episodes.
    let state = dir.path().join("state");
    let output = worker_command(&spec, &state, &plugins, &env_args).output().unwrap();
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let metrics = std::fs::read_to_string(state.join("metrics.jsonl")).unwrap();
    assert_eq!(metrics.matches("\"episodes\":8").count(), 4, "{metrics}");
    let log = std::fs::read_to_string(state.join("env-sidecar.log")).unwrap();
    assert!(log.contains("read: refused: PermissionError"), "{log}");
    assert!(log.contains("connect: refused:"), "{log}");
    assert!(log.contains("left behind:"), "{log}");
    assert!(listener.accept().is_err(), "the sidecar reached the host's loopback");
    let left = || -> Vec<String> {
        std::fs::read_dir("/proc")
            .unwrap()
            .filter_map(|entry| std::fs::read(entry.ok()?.path().join("cmdline")).ok())
            .map(|bytes| String::from_utf8_lossy(&bytes).replace('\0', " "))
            .filter(|line| line.contains(&marker))
            .collect()
    };
    assert!(wait_until(Duration::from_secs(10), || left().is_empty()), "outlived the job: {:?}", left());

    // Killed with SIGKILL while it plays: the sidecar and what it left go with the worker.
    let mut child = worker_command(&spec, &dir.path().join("killed"), &plugins, &env_args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let serving = wait_until(Duration::from_secs(120), || !left().is_empty());
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(serving, "the sidecar never started");
    assert!(
        wait_until(Duration::from_secs(10), || left().is_empty()),
        "outlived a killed worker: {:?}",
        left()
    );
}
