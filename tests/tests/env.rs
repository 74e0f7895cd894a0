//! `[env]` environments through `rlvr_env`'s OpenEnv client against real OpenEnv 0.10.0 servers
//! (`examples/envs/arith_feedback.py` on the venv `scripts/openenv-venv.sh` makes): an episode
//! of two turns, a malformed action refused with the environment's reason, a server at capacity
//! refused with its limit, a slow step cut at the timeout, and a destination the outbound policy
//! does not allow never reached.

use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use rlvr_env::{EnvError, Session};
use rlvr_outbound::Policy;
use rlvr_tests::{free_port, peer_python, wait_until, workspace_root};
use serde_json::{Map, Value, json};

/// An `arith_feedback.py` server on a free loopback port; killed when dropped.
struct EnvServer {
    child: Child,
    url: String,
}

impl EnvServer {
    fn start(python: &std::path::Path, extra: &[&str]) -> EnvServer {
        let port = free_port();
        let child = Command::new(python)
            .arg(workspace_root().join("examples/envs/arith_feedback.py"))
            .args(["--port", &port.to_string()])
            .args(extra)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut server = EnvServer { child, url: format!("http://127.0.0.1:{port}") };
        // Importing OpenEnv's server (FastAPI, Gradio) takes seconds on 2 cores.
        let up = wait_until(Duration::from_secs(120), || {
            TcpStream::connect(("127.0.0.1", port)).is_ok() || server.child.try_wait().unwrap().is_some()
        });
        assert!(up && server.child.try_wait().unwrap().is_none(), "the environment server did not start");
        server
    }
}

impl Drop for EnvServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn args(value: Value) -> Map<String, Value> {
    value.as_object().unwrap().clone()
}

fn text(reply: &rlvr_env::Reply) -> &str {
    reply.observation["text"].as_str().unwrap()
}

#[test]
fn an_openenv_episode_its_refusals_and_limits_each_as_the_server_says() {
    let python = peer_python("scripts/openenv-venv.sh", &[]);
    let server = EnvServer::start(&python, &["--max-concurrent-envs", "2"]);
    // Far slower than the timeout below, which is far above what a loaded machine takes to open
    // a session: only the step can run past it.
    let slow = EnvServer::start(&python, &["--step-delay-s", "30"]);
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

    // Loopback the policy does not allow: refused before any connection.
    let error = Session::open(&server.url, &Policy::new(&[], false).unwrap(), timeout).err().unwrap();
    assert!(matches!(error, EnvError::Refused(_)), "{error}");
    let error = Session::open("https://127.0.0.1:1", &policy, timeout).err().unwrap();
    assert!(error.to_string().contains("only http://"), "{error}");
}

/// Episodes played by the worker (`rlvr_worker::episodes::play`) on `builtin:tiny-arith` against
/// the same server: each a session of its own, turns sampled in one batch, the replies appended as
/// they come, masked out. The untrained model's turns end at the first character of the stop
/// list (so most turns are actions), and its answers are wrong: a first wrong answer gets the sum
/// back and a second try; the environment ends the episode after it.
#[test]
fn the_worker_plays_multi_turn_episodes_token_in_token_out() {
    use rlvr_worker::episodes::{EpisodeEnd, EpisodeReward, EpisodeSettings, play};

    let python = peer_python("scripts/openenv-venv.sh", &[]);
    let server = EnvServer::start(&python, &[]);
    let model = rlvr_model::load("builtin:tiny-arith", tch::Device::Cpu, tch::Kind::Float).unwrap();
    let settings = EpisodeSettings {
        server: server.url.clone(),
        policy: Policy::new(&["127.0.0.1/32".to_owned()], false).unwrap(),
        step_timeout: Duration::from_secs(20),
        max_turns: 3,
        action: rlvr_env::ActionFormat::Field("answer".into()),
        observation_field: "text".into(),
        reply_role: "user".into(),
        reward: EpisodeReward::Sum,
    };
    let stop: Vec<String> = ('a'..='z').chain('0'..='9').map(String::from).collect();
    let params =
        rlvr_model::SamplingParams { max_new_tokens: 6, temperature: 1.0, stop, ..Default::default() };
    let problems = [(12, 30), (5, 7)];
    let resets: Vec<Map<String, Value>> =
        problems.iter().flat_map(|&(a, b)| std::iter::repeat_n(args(json!({"a": a, "b": b})), 4)).collect();
    let mut rng = rlvr_model::SamplerRng::new(7);
    let played = play(&model, &params, &mut rng, &resets, &settings).unwrap();
    assert_eq!(played.len(), 8);
    let tokenizer = &model.tokenizer;
    let mut replies = 0;
    for (i, game) in played.iter().enumerate() {
        let (a, b) = problems[i / 4];
        let episode = &game.episode;
        assert_eq!(
            episode.prompt,
            tokenizer.encode_prompt(&format!("{a:02}+{b:02}=")).unwrap(),
            "episode {i}"
        );
        assert!(episode.turns >= 1 && game.env_s > 0.0, "episode {i}");
        // The environment's text between turns, exactly, masked out; the turns 1.
        let reply: Vec<i64> = tokenizer.encode(&format!(" no:{} {a:02}+{b:02}=", a + b)).unwrap();
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
