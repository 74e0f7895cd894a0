//! Distillation jobs (`[optimizer] plugin = "distill"`, issue 21) through `rlvrd serve`: a
//! student (`builtin:tiny-arith`) learns from a teacher of the same architecture and tokenizer
//! (the built-in model of another seed after a few SFT steps, an operator's base model here) in
//! each mode — SFT on the teacher's traces,
//! forward KL on the teacher's samples, reverse KL on the student's own — and what each step
//! measures before its update (the NLL of the teacher's traces, the KL to the teacher) falls; a
//! teacher whose tokenizer is not the student's is refused at submit, naming
//! `optimizer.teacher`, and so are the keys a distillation job does not know.

use std::fs;
use std::path::{Path, PathBuf};
use std::time::Duration;

use rlvr_protocol::jobdir::RunDir;

use rlvr_protocol::job::JobState;
use rlvr_tests::jobs::{ended, get, submit, submit_ok, wait_job};
use rlvr_tests::{Daemon, PERMISSIVE_GATES, Redis, TEAM_TOKEN, arith_data, worker_command, worker_plugins};

const PLUGINS: [&str; 1] = ["rlvr-verifier-math"];

/// A distillation job of `mode` on `data`'s prompts: 4 prompts a step, 4 completions each.
fn distill_spec(data: &Path, mode: &str, keys: &str, steps: u32) -> String {
    format!(
        "[job]\nname = \"distill-{mode}\"\nteam = \"tests\"\nmodel_line = \"tiny-distill\"\nseed = 5\n\
         [model]\npolicy = \"builtin:tiny-arith\"\n\
         [data]\ntrain = \"{data}/train.jsonl\"\nheldout = \"{data}/heldout.jsonl\"\n\
         [optimizer]\nplugin = \"distill\"\nteacher = \"builtin:tiny-arith?seed=11\"\nmode = \"{mode}\"\n\
         group_size = 4\nlr = 3e-3\n{keys}\n\
         [[verifiers]]\nplugin = \"math\"\nfallback = \"last\"\n\
         [rollout]\nmax_new_tokens = 6\nprompts_per_step = 4\n\
         [budget]\nmax_steps = {steps}\n[checkpoint]\nevery_steps = 100\n[eval]\nmax_prompts = 8\n\
         [resources]\nmemory_gb = 4\n{PERMISSIVE_GATES}",
        data = data.display()
    )
}

/// A teacher worth learning from: the built-in model after a few SFT steps on the arithmetic
/// demonstrations, run by the worker alone (an untrained model's next-token distribution is
/// near uniform: its traces teach nothing, NLL ≈ ln 101). Its checkpoint's `model/`.
fn sft_teacher(dir: &Path) -> PathBuf {
    let data = arith_data(&dir.join("teacher"), &["--train", "0", "--heldout", "0", "--sft", "64"]);
    let plugins = worker_plugins(dir);
    let spec = dir.join("teacher.toml");
    let text = format!(
        "[job]\nname = \"teacher\"\nteam = \"tests\"\nmodel_line = \"t\"\nseed = 1\n\
         [model]\npolicy = \"builtin:tiny-arith?seed=11\"\n[data]\ntrain = \"{data}/sft.jsonl\"\n\
         [optimizer]\nplugin = \"sft\"\nlr = 1e-2\nmicro_batch_size = 16\n\
         [rollout]\nprompts_per_step = 16\n[budget]\nmax_steps = 12\n[checkpoint]\nevery_steps = 12\n",
        data = data.display()
    );
    fs::write(&spec, text).unwrap();
    let state = dir.join("teacher-run");
    let output = worker_command(&spec, &state, &plugins, &[]).output().unwrap();
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    // The premise: the teacher learned (its loss from about ln 101, uniform, to about 2.5 here).
    let run = RunDir::at(state);
    let losses: Vec<f64> = run.read_metrics().unwrap().iter().filter_map(|line| line.loss).collect();
    let (first, last) = (losses[0], losses[losses.len() - 1]);
    assert!(
        last < 0.8 * first,
        "premise: the run did not learn: the teacher's SFT loss by step {losses:?}; its traces would teach nothing"
    );
    run.latest_checkpoint().unwrap().expect("a checkpoint").join("model")
}

#[test]
fn a_student_moves_toward_its_teacher_in_each_mode() {
    let redis = Redis::start();
    let dir = tempfile::tempdir().unwrap();
    let teacher = sft_teacher(dir.path());
    let data = arith_data(dir.path(), &["--train", "64", "--heldout", "8", "--sft", "0"]);
    let config = format!(
        "[devices]\ncpu_slots = 3\ncpu_slot_memory_gb = 4\n\
         [[tenancy.base_models]]\nname = \"arith-teacher\"\npath = {:?}\n",
        teacher.display().to_string()
    );
    let daemon = Daemon::start_with(&PLUGINS, &redis.url(), &config);
    let steps = 8;
    let jobs: Vec<(&str, &str, String)> = [
        ("traces", "distill.nll", ""),
        ("forward_kl", "distill.kl", "temperature = 2.0"),
        ("reverse_kl", "distill.kl", ""),
    ]
    .into_iter()
    .map(|(mode, figure, keys)| {
        let spec = distill_spec(&data, mode, keys, steps)
            .replace("builtin:tiny-arith?seed=11", "base:arith-teacher");
        (mode, figure, submit_ok(&daemon, &spec))
    })
    .collect();
    for (mode, figure, id) in jobs {
        let job = wait_job(&daemon, &id, Duration::from_secs(400), ended);
        assert_eq!(job.state, JobState::Published, "{mode}: {job}\n{}", daemon.log());
        assert_eq!(job.step, u64::from(steps), "{mode}: {job}");
        let (status, history) = get(&daemon, TEAM_TOKEN, &format!("/v1/jobs/{id}/metrics"));
        assert_eq!(status, 200, "{history}");
        // The optimizer's figures are flattened into each metrics line.
        let measured: Vec<f64> =
            history["lines"].as_array().unwrap().iter().filter_map(|line| line[figure].as_f64()).collect();
        assert_eq!(measured.len(), steps as usize, "{mode}: {history}");
        let first = measured[..2].iter().sum::<f64>() / 2.0;
        let last = measured[measured.len() - 2..].iter().sum::<f64>() / 2.0;
        println!("{mode}: {figure} {first:.4} (first 2 steps) → {last:.4} (last 2)");
        assert!(last < 0.8 * first, "{mode}: {figure} did not fall: {measured:?}");
    }
}

#[test]
fn a_teacher_of_another_tokenizer_and_unknown_keys_are_refused_by_name() {
    let redis = Redis::start();
    let dir = tempfile::tempdir().unwrap();
    let data = arith_data(dir.path(), &["--train", "8", "--heldout", "4", "--sft", "0"]);
    // A base model whose vocabulary is not the built-in model's.
    let wide = dir.path().join("wide");
    fs::create_dir_all(&wide).unwrap();
    fs::write(
        wide.join("config.json"),
        r#"{"vocab_size": 500, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
            "num_attention_heads": 4, "num_key_value_heads": 4, "max_position_embeddings": 128}"#,
    )
    .unwrap();
    fs::write(wide.join("tokenizer.json"), r#"{"model": {"type": "BPE", "vocab": {}}, "added_tokens": []}"#)
        .unwrap();
    let config = format!(
        "[devices]\ncpu_slots = 1\ncpu_slot_memory_gb = 4\n[[tenancy.base_models]]\nname = \"wide\"\npath = {:?}\n",
        wide.display().to_string()
    );
    let daemon = Daemon::start_with(&PLUGINS, &redis.url(), &config);
    let check = |spec: String, field: &str, words: &str| {
        let (status, body) = submit(&daemon, TEAM_TOKEN, &spec, None);
        assert!((400..500).contains(&status), "{body}");
        assert_eq!(body["error"]["field"], field, "{body}");
        let message = body["error"]["message"].as_str().unwrap_or_default();
        assert!(message.contains(words), "{message:?} lacks {words:?}");
    };
    let spec = distill_spec(&data, "forward_kl", "", 2);
    check(
        spec.replace("builtin:tiny-arith?seed=11", "base:wide"),
        "optimizer.teacher",
        "the teacher's tokenizer differs from model.policy's",
    );
    check(spec.replace("builtin:tiny-arith?seed=11", "/srv/models/x"), "optimizer.teacher", "server path");
    check(spec.replace("mode = \"forward_kl\"", "mode = \"sideways\""), "optimizer.mode", "sideways");
    check(spec.replace("lr = 3e-3", "lr = 3e-3\ntau = 2"), "optimizer.tau", "unknown");
    check(
        distill_spec(&data, "traces", "temperature = 2.0", 2),
        "optimizer.temperature",
        "no temperature applies",
    );
}
