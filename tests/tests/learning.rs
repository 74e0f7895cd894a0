//! Learning, shown: on `builtin:tiny-arith`, an SFT cold start and then GRPO with the math
//! verifier raise held-out accuracy by at least 15 points over the SFT checkpoint, with a fixed
//! seed, through `rlvr-worker run` and the real plugin libraries — and so does the same GRPO job
//! training LoRA adapters instead of the weights, each for 100 steps (`GRPO_STEPS`; 0.400 → 0.760
//! full, → 0.825 LoRA on 2026-12-01), and that LoRA job again, for 50 steps (`VLLM_STEPS`), with its rollouts on vLLM's server, synced by adapter
//! every step (its sync checked every step to 1e-3, the base loaded once; `vllm.rs` has the
//! server's other stories), on policy and one step off policy (0.840 and 0.875 in
//! `scripts/bench/off-policy.sh --steps 100`, native 0.855). Each test
//! prints its jobs' CPU seconds, each worker's own (2026-11-28, the two tests side by side on the
//! 2-core development machine: 238 CPU s for these three jobs, 184 for the four of
//! multiplication's; alone, earlier, 14 + 43 + 50 s for the three). They are not asserted: on a
//! shared machine CPU time moves with the load, and speed is a benchmark's business.
//! And on a second task family the recipe was not tuned on, multiplication by one digit
//! (`042*7=` → `294`), the same two stages at GRPO lr 1e-4 raise held-out accuracy with the 95%
//! paired bootstrap interval of the gain above zero (notes at the end of this comment).
//!
//! The task: `a+b=` with operands below 50, zero-padded (`07+31=` → `38`): 2 500 distinct
//! problems, split into 300 demonstrations (sft.jsonl), 2 000 prompts with references
//! (train.jsonl) and 200 held-out prompts; no problem is in two files (checked here).
//!
//! The cold start is small, as cold starts are (demonstrations are dear, verifiable prompts
//! cheap), and trained to its plateau, not stopped early: held-out accuracy rises to about
//! 0.45–0.55 by step 250 and stays there to step 500 (300 problems are memorised more than
//! generalised from). GRPO then learns from 2 000 prompts it has no answers for, rewarded by the
//! math verifier alone, and generalises: on the 2-core development machine, 0.400 → 0.860 in
//! `grpo.toml`'s 200 steps for this seed (2026-12-01; 0.425 → 0.890 and 0.50 → 0.915 in earlier versions
//! whose float rounding differed, which changes every sampled token after the first difference);
//! over six data/job seeds (in an earlier version), SFT 0.375–0.51 and +38 to +48 points, in
//! 70–95 CPU seconds.
//!
//! What mattered: the SFT learning rate (1e-2 and 3e-3 learn far slower than 1e-3 here); a GRPO
//! learning rate well below SFT's (2e-3 collapses the policy onto one answer); temperature 0.85
//! (1.0 mostly misses; much lower explores too little); 64 prompts a step rather than 16;
//! zero-padded operands (each digit in a fixed place); addition only (with subtraction and
//! negative answers the same budget hardly moves held-out accuracy).
//!
//! One libtorch thread per worker: for a model this small a second thread mostly adds
//! synchronisation (about 1.4× the CPU time for the same steps, far more on a loaded machine), and
//! a fixed thread count keeps the run bit-exact whatever the machine's core count.
//!
//! Multiplication by one digit, measured with this file's jobs (worker alone, one thread; held-out
//! is 200 unseen problems, greedy; the interval is the 95% paired bootstrap of the gain):
//!
//! | multiplicand | demos / SFT steps | GRPO prompts | lr, steps | held-out | gain's interval |
//! |---|---|---|---|---|---|
//! | below 100 | 300 / 300 | 500 | 1e-4, 100 | 0.185 → 0.250 | [+0.02, +0.11] |
//! | below 100 | 300 / 300 | 500 | 5e-4, 100 | 0.185 → 0.190 | [−0.04, +0.045] |
//! | below 100 | 300 / 300 | 500 | 1e-4, 200 | 0.185 → 0.270 | [+0.035, +0.135] |
//! | below 100 | 400 / 400 | 400 | 1e-4, 100 | 0.270 → 0.280 | [−0.03, +0.05] |
//! | below 1000 | 2000 / 500 | 4000 | 1e-4, 100 | 0.240 → 0.325 | [+0.04, +0.135] |
//! | below 1000 | 2000 / 500 | 4000 | 1e-4, 200 | 0.240 → 0.375 | [+0.08, +0.195] (this test) |
//! | below 1000 | 2000 / 500 | 4000 | 5e-4, 200 | 0.240 → 0.405 | [+0.105, +0.225] |
//! | below 1000 | 2000 / 500 | 4000 | 1e-3, 200 | 0.240 → 0.220 | [−0.07, +0.03] |
//!
//! What mattered: many distinct training prompts (with 400, GRPO memorised them: training reward
//! 0.25 → 0.42, held-out flat; with 500, small gains; with 4 000, the largest); the learning rate (1e-3 learns nothing, 1e-4 and 5e-4
//! learn; 1e-4 is the one kept, as the safe choice the TRL comparison found); and steps.

use std::collections::HashSet;
use std::fs;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use rlvr_tests::{ADDITION_DATA, ADDITION_LORA, artifact, changed, drop_in, plugin_lib};
use serde_json::Value;

/// The prompts of a JSONL data file.
fn prompts(path: &Path) -> Vec<String> {
    fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(|line| serde_json::from_str::<Value>(line).unwrap()["prompt"].as_str().unwrap().to_owned())
        .collect()
}

/// Writes `rlvrd data arith` data (`args`, and `--heldout heldout`) under `dir`, and checks
/// that no held-out problem is among the demonstrations or the training prompts: no peeking.
fn arith_data(dir: &Path, args: &[&str], heldout: usize) -> PathBuf {
    let data = dir.join("data");
    let made = Command::new(artifact("rlvrd"))
        .args(["data", "arith"])
        .args(args)
        .args(["--heldout", &heldout.to_string(), "--out"])
        .arg(&data)
        .output()
        .unwrap();
    assert!(made.status.success(), "{}", String::from_utf8_lossy(&made.stderr));
    let heldout_prompts: HashSet<String> = prompts(&data.join("heldout.jsonl")).into_iter().collect();
    assert_eq!(heldout_prompts.len(), heldout);
    for file in ["sft.jsonl", "train.jsonl"] {
        let seen: Vec<String> =
            prompts(&data.join(file)).into_iter().filter(|p| heldout_prompts.contains(p)).collect();
        assert!(seen.is_empty(), "{file} holds held-out problems: {seen:?}");
    }
    data
}

/// Each held-out prompt's verdict for `model`, in `heldout.jsonl`'s order: its greedy completion
/// passed the math verifier. The worker's outcome carries only the accuracy, so this runs one
/// GRPO step at temperature 0 over the whole held-out file (2 identical completions a prompt,
/// every prompt in that one step) and reads `rollouts.jsonl`; the caller checks the accuracy
/// against the worker's own held-out score.
fn verdicts(model: &Path, data: &Path, plugins: &Path, state: &Path, cpu_s: &mut f64) -> Vec<bool> {
    let ids: Vec<String> = fs::read_to_string(data.join("heldout.jsonl"))
        .unwrap()
        .lines()
        .map(|line| serde_json::from_str::<Value>(line).unwrap()["id"].as_str().unwrap().to_owned())
        .collect();
    let spec = state.with_extension("toml");
    let text = SCORE
        .replace("{data}", &data.display().to_string())
        .replace("{policy}", &model.display().to_string())
        .replace("{prompts}", &ids.len().to_string());
    fs::write(&spec, text).unwrap();
    worker(&spec, state, plugins, cpu_s);
    let mut passed = std::collections::HashMap::new();
    for line in fs::read_to_string(state.join("rollouts.jsonl")).unwrap().lines() {
        let rollout: Value = serde_json::from_str(line).unwrap();
        let verdict = rollout["passed"].as_bool().unwrap();
        let earlier = passed.insert(rollout["prompt_id"].as_str().unwrap().to_owned(), verdict);
        assert!(earlier.is_none_or(|earlier| earlier == verdict), "greedy completions of one prompt differ");
    }
    ids.iter().map(|id| passed[id]).collect()
}

/// The 95% paired bootstrap interval of the held-out gain, `after` − `before` on the same
/// prompts: the prompts resampled with replacement 10 000 times (seeded), the 2.5th and 97.5th
/// percentiles of the resampled gains (the percentile interval; Efron and Tibshirani, "An
/// Introduction to the Bootstrap", 1993, ch. 13).
fn paired_interval(before: &[bool], after: &[bool]) -> (f64, f64) {
    let changes: Vec<i64> = before.iter().zip(after).map(|(&b, &a)| i64::from(a) - i64::from(b)).collect();
    let n = changes.len();
    let mut rng = rlvr_seeded::SplitMix64::new(21);
    let mut gains: Vec<f64> =
        (0..10_000).map(|_| (0..n).map(|_| changes[rng.below(n)]).sum::<i64>() as f64 / n as f64).collect();
    gains.sort_by(f64::total_cmp);
    (gains[249], gains[9_749])
}

fn accuracy(verdicts: &[bool]) -> f64 {
    verdicts.iter().filter(|&&passed| passed).count() as f64 / verdicts.len() as f64
}

/// Runs one job with `rlvr-worker run` (one libtorch thread) and returns its outcome; adds the
/// CPU seconds (user + system) that worker used to `cpu_s`. They are that one child's, from
/// `wait4`: the other test in this file runs at the same time in this process, so the process's
/// children's total (`/proc/self/stat`) would count its jobs too.
fn worker(spec: &Path, state: &Path, plugins: &Path, cpu_s: &mut f64) -> Value {
    worker_with(spec, state, plugins, &[], cpu_s)
}

/// [`worker`] with `extra` arguments.
#[expect(clippy::zombie_processes, reason = "reaped by wait4, which also gives its CPU time")]
fn worker_with(spec: &Path, state: &Path, plugins: &Path, extra: &[&str], cpu_s: &mut f64) -> Value {
    let mut child = Command::new(artifact("rlvr-worker"))
        .args(["run", "--device", "cpu", "--threads", "1", "--spec"])
        .arg(spec)
        .arg("--state-dir")
        .arg(state)
        .arg("--plugin-dir")
        .arg(plugins)
        .args(extra)
        .env("RLVR_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = child.stderr.take().unwrap();
    let stderr = std::thread::spawn(move || {
        let mut text = String::new();
        stderr.read_to_string(&mut text).map(|_| text)
    });
    let mut stdout = Vec::new();
    child.stdout.take().unwrap().read_to_end(&mut stdout).unwrap();
    let stderr = stderr.join().unwrap().unwrap();
    let pid = libc::pid_t::try_from(child.id()).unwrap();
    let (mut status, mut usage) = (0, unsafe { std::mem::zeroed::<libc::rusage>() });
    // SAFETY: `pid` is our own unreaped child (std's `Child` is never waited on after this), and
    // both pointers are to live locals of the types wait4 writes.
    let reaped = unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
    assert_eq!(reaped, pid, "wait4: {}", std::io::Error::last_os_error());
    let seconds = |time: libc::timeval| time.tv_sec as f64 + time.tv_usec as f64 / 1e6;
    *cpu_s += seconds(usage.ru_utime) + seconds(usage.ru_stime);
    assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0, "worker status {status:#x}: {stderr}");
    serde_json::from_slice(&stdout).unwrap()
}

/// The addition task's plugins (grpo, sft, math) and data (the module's notes) under `dir`.
fn addition(dir: &Path) -> (PathBuf, PathBuf) {
    let plugins = dir.join("plugins");
    fs::create_dir_all(&plugins).unwrap();
    for name in ["rlvr-optimizer-grpo", "rlvr-optimizer-sft", "rlvr-verifier-math"] {
        drop_in(&plugin_lib(name), &plugins, &format!("lib{}.so", name.replace('-', "_")));
    }
    let data = arith_data(dir, ADDITION_DATA, 200);
    (plugins, data)
}

#[test]
fn an_sft_cold_start_then_grpo_raises_heldout_accuracy_by_15_points() {
    let dir = tempfile::tempdir().unwrap();
    let (plugins, data) = addition(dir.path());

    let started = Instant::now();
    let mut cpu_s = 0.0;
    let sft_spec = dir.path().join("sft.toml");
    fs::write(&sft_spec, SFT.replace("{data}", &data.display().to_string())).unwrap();
    let sft = worker(&sft_spec, &dir.path().join("sft"), &plugins, &mut cpu_s);
    let sft_accuracy = sft["heldout_after"].as_f64().unwrap();
    let sft_s = started.elapsed().as_secs_f64();
    // The premise, before GRPO: the cold start learned something for GRPO to build on.
    let untrained = sft["heldout_before"].as_f64().expect("the SFT job's held-out baseline");
    assert!(
        sft_accuracy > untrained,
        "premise: the run did not learn: the SFT cold start's held-out accuracy {untrained:.3} → {sft_accuracy:.3}"
    );

    let policy = Path::new(sft["checkpoint"].as_str().unwrap()).join("model");
    let grpo_spec = dir.path().join("grpo.toml");
    let text = changed(
        &GRPO
            .replace("{data}", &data.display().to_string())
            .replace("{policy}", &policy.display().to_string()),
        &[("max_steps = 200", &format!("max_steps = {GRPO_STEPS}"))],
    );
    fs::write(&grpo_spec, &text).unwrap();
    let grpo = worker(&grpo_spec, &dir.path().join("grpo"), &plugins, &mut cpu_s);
    let before = grpo["heldout_before"].as_f64().unwrap();
    let after = grpo["heldout_after"].as_f64().unwrap();
    let grpo_s = started.elapsed().as_secs_f64() - sft_s;

    // The same GRPO job training LoRA adapters on the SFT checkpoint instead of its weights.
    let lora_spec = dir.path().join("grpo-lora.toml");
    let lora_text =
        text.replace("lr = 5e-4", "lr = 2e-3").replace("\n[data]", &format!("\n{ADDITION_LORA}\n[data]"));
    fs::write(&lora_spec, &lora_text).unwrap();
    let lora = worker(&lora_spec, &dir.path().join("grpo-lora"), &plugins, &mut cpu_s);
    let lora_after = lora["heldout_after"].as_f64().unwrap();

    // The same LoRA job with its rollouts on vLLM (its CPU build), for its first `VLLM_STEPS`
    // steps: on policy, and one step off policy with the server on a device of its own. The base
    // is loaded into each server once, each step's adapters under a new name.
    let python = rlvr_tests::peer_python("scripts/vllm-venv.sh", &[]);
    let vllm_args = ["--vllm-python", python.to_str().unwrap()];
    let vllm_started = Instant::now();
    let grpo_steps = format!("max_steps = {GRPO_STEPS}");
    let on_policy = [
        ("temperature = 0.85", "temperature = 0.85\nengine = \"vllm\""),
        (grpo_steps.as_str(), &format!("max_steps = {VLLM_STEPS}")),
    ];
    let vllm_text = changed(&lora_text, &on_policy);
    let off_text = changed(&vllm_text, &[("engine = \"vllm\"", "engine = \"vllm\"\noff_policy_steps = 1")])
        + "[resources]\ndevices = 2\n";
    let mut vllm_runs = Vec::new();
    for (name, text) in [("grpo-lora-vllm", vllm_text), ("grpo-lora-vllm-off-policy", off_text)] {
        let spec = dir.path().join(format!("{name}.toml"));
        fs::write(&spec, text).unwrap();
        let state = dir.path().join(name);
        let outcome = worker_with(&spec, &state, &plugins, &vllm_args, &mut cpu_s);
        vllm_runs.push((name, state, outcome));
    }
    let vllm_after: Vec<f64> =
        vllm_runs.iter().map(|(_, _, outcome)| outcome["heldout_after"].as_f64().unwrap()).collect();
    let vllm_s = vllm_started.elapsed().as_secs_f64();
    eprintln!(
        "held-out accuracy: SFT {sft_accuracy:.3} ({sft_s:.0} s), GRPO {before:.3} → {after:.3} ({grpo_s:.0} s), \
         LoRA GRPO → {lora_after:.3}; {VLLM_STEPS} steps on vLLM → {:.3}, one step off policy → {:.3} ({vllm_s:.0} s) \
         ({:.0} s in all, {:.0} CPU s)",
        vllm_after[0],
        vllm_after[1],
        started.elapsed().as_secs_f64(),
        cpu_s
    );
    assert_eq!(before, sft_accuracy, "GRPO starts from the SFT checkpoint and scores it the same way");
    assert!(
        after >= sft_accuracy + 0.15,
        "held-out accuracy {sft_accuracy:.3} → {after:.3}: less than +15 points"
    );
    assert_eq!(lora["heldout_before"].as_f64(), Some(sft_accuracy), "fresh adapters compute the SFT model");
    assert!(
        lora_after >= sft_accuracy + 0.15,
        "LoRA: held-out accuracy {sft_accuracy:.3} → {lora_after:.3}: less than +15 points"
    );
    for (name, state, outcome) in &vllm_runs {
        let off_policy = name.ends_with("off-policy");
        assert_eq!(
            outcome["heldout_before"].as_f64(),
            Some(sft_accuracy),
            "{name}: the same start, scored the same way"
        );
        let after = outcome["heldout_after"].as_f64().unwrap();
        assert!(
            after >= sft_accuracy + 0.15,
            "{name}: held-out accuracy {sft_accuracy:.3} → {after:.3}: less than +15 points"
        );
        // Synced by adapter: the base loaded once, an adapter at the start and after each update
        // that samples (one step off policy, the last update samples nothing).
        let log = fs::read_to_string(state.join("vllm/server.log")).unwrap();
        assert_eq!(
            log.matches("Starting to load model").count(),
            1,
            "{name}: the base loaded more than once"
        );
        let adapters = if off_policy { VLLM_STEPS } else { VLLM_STEPS + 1 };
        assert_eq!(log.matches("Loaded new LoRA adapter").count(), adapters, "{name}: one adapter a sync");
        // Each step's samples are the weights' that sampled them to 1e-3: the trainer's before
        // this update, or one step off policy (after the first step) the ones before the last.
        for line in fs::read_to_string(state.join("metrics.jsonl")).unwrap().lines() {
            let line: Value = serde_json::from_str(line).unwrap();
            let Some(step) = line["reward_mean"].as_f64().and(line["step"].as_u64()) else { continue };
            let gap = line["sampler_gap"]["max_abs"].as_f64().unwrap();
            assert!(gap < 1e-3, "{name}, step {step}: vLLM's log-probabilities {gap:e} from the trainer's");
            let lag = line["policy_lag"].as_u64();
            assert_eq!(lag, off_policy.then_some(u64::from(step > 1)), "{name}, step {step}");
        }
    }
}

/// Episodes against an environment (`[env]`), learned from: `examples/envs/arith_feedback.py`
/// answers a wrong first answer with the sum and a second try (`07+31=` → `39` → ` no:38 07+31=`
/// → `38`). The cold start is the addition test's SFT, with each demonstration also written as a
/// two-turn transcript (a wrong first answer, the environment's reply, the right answer), so the
/// model has seen the reply's form. GRPO then trains on the environment's reward alone, no
/// verifier: the same job with `max_turns = 2` earns far more than with `max_turns = 1` (the reply
/// is worth using), and its held-out accuracy, played greedily through the environment, rises.
/// (Measured 2026-11-30, the test's own line: mean reward 0.969 a step with two turns, 0.243 with
/// one; held-out 0.975 → 0.995 in 30 steps; the policy came to lean on the reply: turns per
/// episode 1.74 → 1.89.)
#[test]
fn episodes_against_an_environment_use_its_reply_and_earn_more_than_the_same_job_single_turn() {
    let dir = tempfile::tempdir().unwrap();
    let (plugins, data) = addition(dir.path());
    let records = |file: &str| -> Vec<Value> {
        let text = fs::read_to_string(data.join(file)).unwrap();
        text.lines().map(|line| serde_json::from_str(line).unwrap()).collect()
    };
    let write = |file: &str, lines: Vec<Value>| {
        let text: String = lines.iter().map(|line| format!("{line}\n")).collect();
        fs::write(data.join(file), text).unwrap();
    };
    // Each demonstration, and the same problem as two turns: a wrong answer (the first turn ends
    // with its end-of-sequence token, as a sampled one does), the reply, the right answer.
    let mut demonstrations = Vec::new();
    for (i, demo) in records("sft.jsonl").into_iter().enumerate() {
        let (prompt, answer) = (demo["prompt"].as_str().unwrap(), demo["completion"].as_str().unwrap());
        let right: u64 = answer.parse().unwrap();
        let wrong = [right + 1, right + 10, right.checked_sub(1).unwrap_or(right + 2)][i % 3];
        let transcript = format!("{prompt}{wrong}<|eos|> no:{right} {prompt}");
        demonstrations.push(serde_json::json!({"id": format!("{}-reply", demo["id"].as_str().unwrap()), "prompt": transcript, "completion": answer}));
        demonstrations.push(demo);
    }
    write("sft-replies.jsonl", demonstrations);
    // The environment's problems: each prompt's operands are reset's arguments.
    for file in ["train.jsonl", "heldout.jsonl"] {
        let problems = records(file)
            .into_iter()
            .map(|mut record| {
                let prompt = record["prompt"].as_str().unwrap().trim_end_matches('=').to_owned();
                let (a, b) = prompt.split_once('+').unwrap();
                record["reference"] =
                    serde_json::json!({"a": a.parse::<u64>().unwrap(), "b": b.parse::<u64>().unwrap()});
                record
            })
            .collect();
        write(&format!("env-{file}"), problems);
    }

    let started = Instant::now();
    let mut cpu_s = 0.0;
    let sft_spec = dir.path().join("sft.toml");
    let sft_text = changed(SFT, &[("{data}/sft.jsonl", "{data}/sft-replies.jsonl")]);
    fs::write(&sft_spec, sft_text.replace("{data}", &data.display().to_string())).unwrap();
    let sft = worker(&sft_spec, &dir.path().join("sft"), &plugins, &mut cpu_s);
    let (untrained, sft_accuracy) =
        (sft["heldout_before"].as_f64().unwrap(), sft["heldout_after"].as_f64().unwrap());
    assert!(
        sft_accuracy > untrained,
        "premise: the run did not learn: the SFT cold start's held-out accuracy {untrained:.3} → {sft_accuracy:.3}"
    );

    // A step's 64 × 8 episodes at once, each job's sessions kept open for its next step.
    let server = rlvr_tests::openenv::EnvServer::start(&["--pad", "--max-concurrent-envs", "512"]);
    let policy = Path::new(sft["checkpoint"].as_str().unwrap()).join("model");
    let env = format!(
        "[env]\nkind = \"openenv\"\nurl = \"{}\"\nmax_turns = 2\naction = \"field\"\naction_field = \"answer\"\n",
        server.url
    );
    let two_turns = changed(
        GRPO,
        &[
            ("{data}/train.jsonl", "{data}/env-train.jsonl"),
            ("{data}/heldout.jsonl", "{data}/env-heldout.jsonl"),
            ("[[verifiers]]\nplugin = \"math\"\nfallback = \"last\"\n", ""),
            ("max_steps = 200", "max_steps = 30"),
        ],
    ) + &env;
    let one_turn = changed(&two_turns, &[("max_turns = 2", "max_turns = 1")]);
    let mut runs = Vec::new();
    for (name, text) in [("two-turns", two_turns), ("one-turn", one_turn)] {
        let spec = dir.path().join(format!("{name}.toml"));
        let text = text
            .replace("{data}", &data.display().to_string())
            .replace("{policy}", &policy.display().to_string());
        fs::write(&spec, text).unwrap();
        let state = dir.path().join(name);
        let outcome = worker(&spec, &state, &plugins, &mut cpu_s);
        let steps: Vec<Value> = fs::read_to_string(state.join("metrics.jsonl"))
            .unwrap()
            .lines()
            .map(|line| serde_json::from_str::<Value>(line).unwrap())
            .filter(|line| line["env"].is_object())
            .collect();
        let mean = |key: &str, steps: &[Value]| {
            steps.iter().map(|s| s["env"][key].as_f64().unwrap()).sum::<f64>() / steps.len() as f64
        };
        let reward = mean("reward_mean", &steps);
        let turns = (mean("turns_mean", &steps[..5]), mean("turns_mean", &steps[steps.len() - 5..]));
        runs.push((name, outcome, reward, turns));
    }
    let [(_, two, two_reward, two_turns), (_, one, one_reward, _)] = &runs[..] else { unreachable!() };
    let (before, after) = (two["heldout_before"].as_f64().unwrap(), two["heldout_after"].as_f64().unwrap());
    eprintln!(
        "[env] episodes from the SFT cold start (held-out {sft_accuracy:.3} single-turn, by the math verifier): \
         mean reward {two_reward:.3} with two turns, {one_reward:.3} with one; two turns' held-out through the \
         environment {before:.3} → {after:.3}, turns per episode {:.2} → {:.2}; one turn's {:.3} → {:.3} \
         ({:.0} s in all, {cpu_s:.0} CPU s)",
        two_turns.0,
        two_turns.1,
        one["heldout_before"].as_f64().unwrap(),
        one["heldout_after"].as_f64().unwrap(),
        started.elapsed().as_secs_f64(),
    );
    assert!(
        *two_reward > one_reward + 0.3,
        "two turns earned {two_reward:.3} a step on average, one turn {one_reward:.3}: the reply was not used"
    );
    assert!(after > before, "held-out accuracy through the environment {before:.3} → {after:.3}: no gain");
}

/// The second task family, multiplication by one digit (`42*7=` → `294`), which no setting here
/// was tuned on before this test: the same recipe as addition's — a small SFT cold start, then
/// GRPO on prompts it has no answers for — at GRPO lr 1e-4 (as measured against TRL's
/// GRPOTrainer: 1e-3 collapses a good checkpoint, 1e-4 learns), raises held-out accuracy over
/// the SFT checkpoint on 200 unseen problems with the 95% paired bootstrap interval of the gain
/// above zero. Seeded; the numbers are in the module's notes.
#[test]
fn multiplication_by_one_digit_an_sft_cold_start_then_grpo_gains_on_heldout_with_the_interval_above_zero() {
    let dir = tempfile::tempdir().unwrap();
    let plugins = dir.path().join("plugins");
    fs::create_dir_all(&plugins).unwrap();
    for name in ["rlvr-optimizer-grpo", "rlvr-optimizer-sft", "rlvr-verifier-math"] {
        drop_in(&plugin_lib(name), &plugins, &format!("lib{}.so", name.replace('-', "_")));
    }
    let data = arith_data(dir.path(), MUL_DATA, 200);
    let started = Instant::now();
    let mut cpu_s = 0.0;

    let sft_spec = dir.path().join("sft.toml");
    fs::write(&sft_spec, changed(&SFT.replace("{data}", &data.display().to_string()), MUL_SFT)).unwrap();
    let sft = worker(&sft_spec, &dir.path().join("sft"), &plugins, &mut cpu_s);
    let sft_model = Path::new(sft["checkpoint"].as_str().unwrap()).join("model");
    // The premise, before GRPO: the cold start learned something for GRPO to build on.
    let (untrained, cold) = (sft["heldout_before"].as_f64(), sft["heldout_after"].as_f64());
    assert!(
        cold > untrained,
        "premise: the run did not learn: the SFT cold start's held-out accuracy {untrained:?} → {cold:?}"
    );

    let grpo_spec = dir.path().join("grpo.toml");
    let grpo_text = GRPO
        .replace("{data}", &data.display().to_string())
        .replace("{policy}", &sft_model.display().to_string());
    let text = changed(&grpo_text, MUL_GRPO);
    fs::write(&grpo_spec, text).unwrap();
    let grpo = worker(&grpo_spec, &dir.path().join("grpo"), &plugins, &mut cpu_s);
    let grpo_model = Path::new(grpo["checkpoint"].as_str().unwrap()).join("model");

    let before = verdicts(&sft_model, &data, &plugins, &dir.path().join("score-sft"), &mut cpu_s);
    let after = verdicts(&grpo_model, &data, &plugins, &dir.path().join("score-grpo"), &mut cpu_s);
    let (low, high) = paired_interval(&before, &after);
    eprintln!(
        "a*d= held-out accuracy: SFT {:.3} → GRPO {:.3}, gain 95% interval [{low:+.3}, {high:+.3}] over {} prompts \
         ({:.0} s, {:.0} CPU s)",
        accuracy(&before),
        accuracy(&after),
        before.len(),
        started.elapsed().as_secs_f64(),
        cpu_s
    );
    // The verdicts are the worker's own held-out scoring, prompt by prompt.
    assert_eq!(grpo["heldout_before"].as_f64(), Some(accuracy(&before)), "the SFT checkpoint's verdicts");
    assert_eq!(grpo["heldout_after"].as_f64(), Some(accuracy(&after)), "the GRPO result's verdicts");
    assert!(
        low > 0.0,
        "held-out accuracy {:.3} → {:.3}: the gain's interval [{low:+.3}, {high:+.3}] does not clear zero",
        accuracy(&before),
        accuracy(&after)
    );
}

/// `a*d=` with the multiplicand below 1 000, zero-padded (`042*7=`): 2 000 demonstrations,
/// 4 000 training prompts and 200 held-out ones, of the 10 000 such problems. Many distinct
/// training prompts, not a few hundred: with 1 000 problems (multiplicand below 100, 400
/// prompts) GRPO memorised them (training reward 0.25 → 0.42) and held-out moved 0.27 → 0.28.
const MUL_DATA: &[&str] =
    &["--seed", "11", "--max-operand", "1000", "--ops", "*", "--pad", "--sft", "2000", "--train", "4000"];

/// The addition test's SFT job, changed where shown: 500 steps over the 2 000 demonstrations
/// (about 16 epochs) start GRPO at 0.24, near enough to the frontier that groups of 8 often hold
/// a right and a wrong answer; answers have up to 4 digits and the end of text.
const MUL_SFT: &[(&str, &str)] =
    &[("max_steps = 300", "max_steps = 500"), ("max_new_tokens = 4", "max_new_tokens = 5")];

/// The addition test's GRPO job (200 steps, 64 prompts × 8, cosine), changed where shown.
const MUL_GRPO: &[(&str, &str)] = &[("lr = 5e-4", "lr = 1e-4"), ("max_new_tokens = 4", "max_new_tokens = 5")];

/// Steps of this file's first test's GRPO jobs, full and LoRA, on the native sampler: half of
/// `grpo.toml`'s 200 (which the other tests and `scripts/bench/off-policy.sh` run), the learning
/// rate's cosine over them. Measured 2026-12-01 (2 cores, each job alone): from the SFT
/// checkpoint's 0.400, full 0.760 and LoRA 0.825 after 100 steps (0.860 and 0.895 after 200).
const GRPO_STEPS: usize = 100;

/// Steps of the LoRA job on vLLM, on and off policy: a quarter of `grpo.toml`'s 200, with the
/// learning rate's cosine over them. Measured 2026-12-01 (this file's jobs, 2 cores): from the
/// SFT checkpoint's 0.400, 0.725 on policy and 0.740 one step off after 50 steps (0.855 and
/// 0.810 after 100), both clear of the +15 points asserted, in about 230 s for the two jobs
/// (each server's start about 30 s of it) rather than 330 s.
const VLLM_STEPS: usize = 50;

/// SFT on the 300 demonstrations, 64 a step, to its plateau.
/// (`scripts/bench/off-policy.sh` runs this file too.)
const SFT: &str = include_str!("../data/learning/sft.toml");

/// GRPO on the 2 000 training prompts: 64 prompts × 8 completions a step in one micro-batch, no
/// KL term (so no reference pass), the learning rate's cosine decay to 0 over the 200 steps.
/// (`scripts/bench/off-policy.sh` runs this file too, with the changes of this file's LoRA jobs.)
const GRPO: &str = include_str!("../data/learning/grpo.toml");

/// The held-out prompts scored by one GRPO step: greedy, two completions a prompt, all of them
/// at once; the learning rate is the smallest the spec takes (the step's update is not used).
const SCORE: &str = r#"
[job]
name = "arith-score"
team = "tests"
model_line = "tiny-arith"
seed = 3
[model]
policy = "{policy}"
[data]
train = "{data}/heldout.jsonl"
[optimizer]
plugin = "grpo"
group_size = 2
lr = 1e-30
micro_batch_size = 512
kl_beta = 0.0
[[verifiers]]
plugin = "math"
fallback = "last"
[rollout]
max_new_tokens = 5
temperature = 0.0
prompts_per_step = {prompts}
[budget]
max_steps = 1
[checkpoint]
every_steps = 1000
"#;
