//! Helpers shared by the trainer's integration tests: the project venv's python, the
//! SmolLM2 directory (scripts/fetch-smollm2.sh), and the reference script.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use serde_json::Value;
use tch::{Device, Kind, Tensor};

pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_owned()
}

/// The project venv's python (scripts/setup.sh writes `RLVR_VENV` into the env file).
pub fn python() -> PathBuf {
    let venv = std::env::var_os("RLVR_VENV").map(PathBuf::from).unwrap_or_else(|| {
        let cache = std::env::var_os("RLVR_CACHE_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from(std::env::var("HOME").unwrap()).join(".cache/rlvr"));
        cache.join("venv")
    });
    venv.join("bin/python")
}

/// The path a set-up script of `scripts/` prints, the script run once per test binary.
fn set_up(once: &'static OnceLock<PathBuf>, script: &str) -> PathBuf {
    once.get_or_init(|| {
        let out = Command::new("bash")
            .arg(repo_root().join("scripts").join(script))
            .output()
            .unwrap_or_else(|e| panic!("run scripts/{script}: {e}"));
        assert!(out.status.success(), "{script} failed:\n{}", String::from_utf8_lossy(&out.stderr));
        PathBuf::from(String::from_utf8(out.stdout).unwrap().trim())
    })
    .clone()
}

/// Runs `python tests/SCRIPT ARGS` (with `env`) and parses its one JSON answer.
fn reference(python: PathBuf, script: &str, args: &[&str], env: &[(&str, PathBuf)]) -> Value {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests").join(script);
    let mut command = Command::new(python);
    command.arg(path).args(args);
    for (name, value) in env {
        command.env(name, value);
    }
    let out = command.output().unwrap_or_else(|e| panic!("run {script}: {e}"));
    assert!(out.status.success(), "{script} {args:?} failed:\n{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{script} prints JSON: {e}"))
}

/// The SmolLM2-135M-Instruct directory, made by scripts/fetch-smollm2.sh once per test binary.
pub fn smollm2_dir() -> PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    set_up(&DIR, "fetch-smollm2.sh")
}

/// Runs `hf_reference.py ARGS` and parses its JSON answer.
pub fn hf_reference(args: &[&str]) -> Value {
    reference(python(), "hf_reference.py", args, &[("SMOLLM2_DIR", smollm2_dir())])
}

/// A JSON array of numbers (any nesting), or a tensor packed as `{"f32_hex", "shape"}`
/// (`hf_reference.py`'s logits), as a flat f32 tensor.
pub fn flat_tensor(v: &Value) -> Tensor {
    if let Some(hex) = v.get("f32_hex").and_then(Value::as_str) {
        let bytes = hex::decode(hex).expect("f32_hex is hex");
        let values: Vec<f32> =
            bytes.chunks_exact(4).map(|b| f32::from_le_bytes(b.try_into().expect("4 bytes"))).collect();
        let count: i64 =
            v["shape"].as_array().expect("a shape").iter().map(|d| d.as_i64().unwrap()).product();
        assert_eq!(values.len() as i64, count, "f32_hex holds its shape's count of numbers");
        return Tensor::from_slice(&values);
    }
    fn walk(v: &Value, out: &mut Vec<f32>) {
        match v {
            Value::Array(items) => items.iter().for_each(|i| walk(i, out)),
            Value::Number(n) => out.push(n.as_f64().unwrap() as f32),
            other => panic!("not a number: {other}"),
        }
    }
    let mut out = Vec::new();
    walk(v, &mut out);
    Tensor::from_slice(&out)
}

pub fn max_abs_diff(a: &Tensor, b: &Tensor) -> f64 {
    (a.to_kind(Kind::Float).to_device(Device::Cpu).flatten(0, -1) - b.to_kind(Kind::Float).flatten(0, -1))
        .abs()
        .max()
        .double_value(&[])
}

/// Logits `[B, T, V]` of unpadded `ids` through our model.
pub fn our_logits(model: &rlvr_model::Llama, ids: &[Vec<i64>]) -> Tensor {
    let b = ids.len() as i64;
    let t = ids[0].len() as i64;
    let flat: Vec<i64> = ids.iter().flatten().copied().collect();
    let input = Tensor::from_slice(&flat).view([b, t]).to_device(model.device());
    let mask = Tensor::ones([b, t], (Kind::Int64, model.device()));
    let pos = rlvr_model::positions_from_mask(&mask);
    tch::no_grad(|| model.logits(&model.forward(&input, &pos, &mask, None)).to_kind(Kind::Float))
}

/// The PEFT venv's python (scripts/peft-venv.sh makes it once per test binary).
pub fn peft_python() -> PathBuf {
    static PYTHON: OnceLock<PathBuf> = OnceLock::new();
    set_up(&PYTHON, "peft-venv.sh")
}

/// Runs `peft_reference.py ARGS` and parses its JSON answer.
pub fn peft_reference(args: &[&str]) -> Value {
    reference(peft_python(), "peft_reference.py", args, &[])
}
