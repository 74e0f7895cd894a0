//! Learning, shown: on `builtin:tiny-arith`, an SFT cold start and then GRPO with the math
//! verifier raise held-out accuracy by at least 15 points over the SFT checkpoint, with a fixed
//! seed, through `rlvrd worker` and the real plugin libraries.

use std::fs;
use std::path::Path;
use std::process::Command;
use std::time::Instant;

use rlvr_tests::{artifact, drop_in, plugin_lib};
use serde_json::Value;

fn worker(spec: &Path, state: &Path, plugins: &Path) -> Value {
    let output = Command::new(artifact("rlvrd"))
        .args(["worker", "--device", "cpu", "--spec"])
        .arg(spec)
        .arg("--state-dir")
        .arg(state)
        .arg("--plugin-dir")
        .arg(plugins)
        .env("RLVR_LOG", "warn")
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    serde_json::from_slice(&output.stdout).unwrap()
}

#[test]
fn an_sft_cold_start_then_grpo_raises_heldout_accuracy_by_15_points() {
    let dir = tempfile::tempdir().unwrap();
    let plugins = dir.path().join("plugins");
    fs::create_dir_all(&plugins).unwrap();
    for name in ["rlvr-optimizer-grpo", "rlvr-optimizer-sft", "rlvr-verifier-math"] {
        drop_in(&plugin_lib(name), &plugins, &format!("lib{}.so", name.replace('-', "_")));
    }
    let data = dir.path().join("data");
    let made = Command::new(artifact("rlvrd"))
        .args([
            "data",
            "arith",
            "--seed",
            "11",
            "--max-operand",
            MAX_OPERAND,
            "--sft",
            "300",
            "--train",
            "300",
            "--heldout",
            "150",
            "--out",
        ])
        .arg(&data)
        .output()
        .unwrap();
    assert!(made.status.success(), "{}", String::from_utf8_lossy(&made.stderr));

    let started = Instant::now();
    let sft_spec = dir.path().join("sft.toml");
    fs::write(&sft_spec, SFT.replace("{data}", &data.display().to_string())).unwrap();
    let sft = worker(&sft_spec, &dir.path().join("sft"), &plugins);
    let sft_accuracy = sft["heldout_after"].as_f64().unwrap();
    let sft_s = started.elapsed().as_secs_f64();

    let policy = Path::new(sft["checkpoint"].as_str().unwrap()).join("model");
    let grpo_spec = dir.path().join("grpo.toml");
    let text = GRPO
        .replace("{data}", &data.display().to_string())
        .replace("{policy}", &policy.display().to_string());
    fs::write(&grpo_spec, text).unwrap();
    let grpo = worker(&grpo_spec, &dir.path().join("grpo"), &plugins);
    let before = grpo["heldout_before"].as_f64().unwrap();
    let after = grpo["heldout_after"].as_f64().unwrap();
    eprintln!(
        "held-out accuracy: SFT {sft_accuracy:.3} ({sft_s:.0} s), GRPO {before:.3} → {after:.3} ({:.0} s in all)",
        started.elapsed().as_secs_f64()
    );
    assert_eq!(before, sft_accuracy, "GRPO starts from the SFT checkpoint and scores it the same way");
    assert!(
        after >= sft_accuracy + 0.15,
        "held-out accuracy {sft_accuracy:.3} → {after:.3}: less than +15 points"
    );
}

const MAX_OPERAND: &str = "20";

const SFT: &str = r#"
[job]
name = "arith-sft"
team = "tests"
model_line = "tiny-arith"
seed = 1
[model]
policy = "builtin:tiny-arith"
[data]
train = "{data}/sft.jsonl"
heldout = "{data}/heldout.jsonl"
[optimizer]
plugin = "sft"
lr = 1e-2
warmup_steps = 10
micro_batch_size = 128
[[verifiers]]
plugin = "math"
fallback = "last"
[rollout]
max_new_tokens = 4
prompts_per_step = 128
[budget]
max_steps = 150
[checkpoint]
every_steps = 1000
"#;

const GRPO: &str = r#"
[job]
name = "arith-grpo"
team = "tests"
model_line = "tiny-arith"
seed = 2
[model]
policy = "{policy}"
[data]
train = "{data}/train.jsonl"
heldout = "{data}/heldout.jsonl"
[optimizer]
plugin = "grpo"
group_size = 8
lr = 2e-3
micro_batch_size = 128
kl_beta = 0.0
[[verifiers]]
plugin = "math"
fallback = "last"
[rollout]
max_new_tokens = 4
prompts_per_step = 16
[budget]
max_steps = 100
[checkpoint]
every_steps = 1000
"#;
