//! A run's TensorBoard event files, read by TensorBoard's own loader (the `tensorboard` package,
//! `scripts/tensorboard-venv.sh`): a real `rlvr-worker run` is killed with SIGKILL past a
//! checkpoint and resumed, and what TensorBoard shows is exactly `metrics.jsonl`, step by step —
//! the steps the killed process wrote after its checkpoint dropped, their re-run shown instead.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use rlvr_tests::{arith_data, arith_grpo_spec, wait_until, worker_command, worker_plugins, workspace_root};
use serde_json::Value;

/// The python of `scripts/tensorboard-venv.sh` (installs it on first use).
fn tensorboard_python() -> PathBuf {
    let output = Command::new("bash")
        .arg(workspace_root().join("scripts/tensorboard-venv.sh"))
        .output()
        .expect("run scripts/tensorboard-venv.sh");
    assert!(
        output.status.success(),
        "tensorboard-venv.sh failed:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    PathBuf::from(String::from_utf8(output.stdout).unwrap().trim())
}

/// Reads a TensorBoard log directory as TensorBoard does: `shown`, every scalar series of
/// `EventAccumulator` (the loader behind TensorBoard's scalar charts, with its purge of the
/// steps a restarted run writes again), and `files`, each event file's records in name order
/// (the raw loader, nothing dropped) as `[kind, step]`.
const READ_EVENTS: &str = r#"
import json, os, sys
from tensorboard.backend.event_processing import event_accumulator, event_file_loader

logdir = sys.argv[1]
accumulator = event_accumulator.EventAccumulator(logdir, size_guidance={event_accumulator.SCALARS: 0})
accumulator.Reload()
shown = {
    tag: [[event.step, event.value] for event in accumulator.Scalars(tag)]
    for tag in accumulator.Tags()["scalars"]
}
files = []
for name in sorted(os.listdir(logdir)):
    records = []
    for event in event_file_loader.LegacyEventFileLoader(os.path.join(logdir, name)).Load():
        kind = event.WhichOneof("what")
        if kind == "session_log":
            kind = event.session_log.SessionStatus.Name(event.session_log.status)
        records.append([kind, event.step])
    files.append({"name": name, "records": records})
print(json.dumps({"shown": shown, "files": files}))
"#;

/// `metrics.jsonl` as TensorBoard's series should be: every number of each line but `step`,
/// tagged `train/<key>` at the top level and by its path inside an object, at the line's step.
/// Written here from the README's rule, apart from the writer's own code.
fn expected_series(metrics: &str) -> BTreeMap<String, Vec<(u64, f64)>> {
    fn walk(tag: String, value: &Value, step: u64, out: &mut BTreeMap<String, Vec<(u64, f64)>>) {
        match value {
            Value::Number(number) => out.entry(tag).or_default().push((step, number.as_f64().unwrap())),
            Value::Object(fields) => {
                for (key, value) in fields {
                    walk(format!("{tag}/{key}"), value, step, out);
                }
            }
            _ => {}
        }
    }
    let mut out = BTreeMap::new();
    for line in metrics.lines() {
        let line: Value = serde_json::from_str(line).unwrap();
        let step = line["step"].as_u64().unwrap();
        for (key, value) in line.as_object().unwrap() {
            match value {
                _ if key == "step" => {}
                Value::Object(_) => walk(key.clone(), value, step, &mut out),
                _ => walk(format!("train/{key}"), value, step, &mut out),
            }
        }
    }
    out
}

fn read_events(python: &Path, logdir: &Path) -> Value {
    let output = Command::new(python).arg("-c").arg(READ_EVENTS).arg(logdir).output().unwrap();
    assert!(output.status.success(), "the reader failed:\n{}", String::from_utf8_lossy(&output.stderr));
    serde_json::from_slice(&output.stdout).unwrap()
}

/// How many whole TFRecord frames (length, its CRC, the bytes, their CRC) the log directory's
/// one event file holds so far: a frame being written is not counted.
fn complete_records(logdir: &Path) -> usize {
    let Some(file) = fs::read_dir(logdir).ok().and_then(|mut entries| entries.next()) else {
        return 0;
    };
    let bytes = fs::read(file.unwrap().path()).unwrap_or_default();
    let (mut at, mut records) = (0, 0);
    while let Some(length) = bytes.get(at..at + 8) {
        let length = u64::from_le_bytes(length.try_into().unwrap()) as usize;
        at += 8 + 4 + length + 4;
        if at > bytes.len() {
            break;
        }
        records += 1;
    }
    records
}

fn checkpoint_step(state: &Path) -> u64 {
    let latest = fs::read_to_string(state.join("checkpoints/LATEST")).unwrap();
    latest.trim().strip_prefix("step-").unwrap().parse().unwrap()
}

#[test]
fn a_resumed_runs_event_files_show_in_tensorboard_what_metrics_jsonl_holds() {
    let python = tensorboard_python();
    let dir = tempfile::tempdir().unwrap();
    let plugins = worker_plugins(dir.path());
    let data =
        arith_data(dir.path(), &["--train", "64", "--heldout", "16", "--sft", "0", "--max-operand", "10"]);
    let spec = dir.path().join("job.toml");
    fs::write(&spec, arith_grpo_spec(&data, "tensorboard", "builtin:tiny-arith", 6, 2)).unwrap();
    let state = dir.path().join("state");
    let logdir = state.join("tensorboard");

    // The first process: killed once step 3's event is written, past the step-2 checkpoint. The
    // event file is waited on, not `metrics.jsonl`: the worker writes each line there first, so
    // a kill between the two would leave the events one step short.
    let mut child = worker_command(&spec, &state, &plugins, &[])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // The version and the START, then one event for each of steps 0 to 3.
    let past_step_3 = wait_until(Duration::from_secs(300), || complete_records(&logdir) >= 2 + 4);
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(past_step_3, "the run never reached step 3");
    let resumed_from = checkpoint_step(&state);
    let before = read_events(&python, &logdir);
    let killed_file = &before["files"][0]["records"];
    let written_last = killed_file.as_array().unwrap().last().unwrap()[1].as_u64().unwrap();
    assert!(
        written_last > resumed_from,
        "nothing for a resume to drop: the killed run's last event is step {written_last}, its checkpoint step {resumed_from}"
    );

    // The second process resumes from the checkpoint and writes the steps after it again.
    let resumed = worker_command(&spec, &state, &plugins, &["--resume"]).output().unwrap();
    assert!(
        resumed.status.success(),
        "the resumed run failed:\n{}",
        String::from_utf8_lossy(&resumed.stderr)
    );
    let read = read_events(&python, &logdir);

    // One file per process, in name order; each opens with its version and a START at the first
    // step it writes (0, then the step after the checkpoint).
    let files = read["files"].as_array().unwrap();
    assert_eq!(files.len(), 2, "{files:?}");
    let opening = |file: &Value| file["records"].as_array().unwrap()[..3].to_vec();
    let expected_opening = |start: u64| {
        serde_json::json!([["file_version", 0], ["START", start], ["summary", start]])
            .as_array()
            .unwrap()
            .clone()
    };
    assert_eq!(opening(&files[0]), expected_opening(0), "{}", files[0]["name"]);
    assert_eq!(opening(&files[1]), expected_opening(resumed_from + 1), "{}", files[1]["name"]);
    assert_eq!(files[0], before["files"][0], "the killed process's file is never written again");

    // What TensorBoard shows is metrics.jsonl: every series, step and value (as the 32-bit float
    // TensorBoard keeps), once per step — the re-run steps with their second run's figures (their
    // step times differ from the killed run's, which TensorBoard dropped).
    let metrics = fs::read_to_string(state.join("metrics.jsonl")).unwrap();
    let expected = expected_series(&metrics);
    let shown: BTreeMap<String, Vec<(u64, f64)>> = serde_json::from_value(read["shown"].clone()).unwrap();
    let as_f32 = |series: &Vec<(u64, f64)>| -> Vec<(u64, f64)> {
        series.iter().map(|&(step, value)| (step, f64::from(value as f32))).collect()
    };
    assert_eq!(shown.keys().collect::<Vec<_>>(), expected.keys().collect::<Vec<_>>());
    for (tag, series) in &expected {
        assert_eq!(shown[tag], as_f32(series), "{tag}");
    }
    // The figures teams look for, at the steps they belong to.
    let steps = |tag: &str| shown[tag].iter().map(|(step, _)| *step).collect::<Vec<_>>();
    for tag in [
        "train/reward_mean",
        "train/passed_frac",
        "components/math",
        "train/kl_ref",
        "train/loss",
        "train/entropy",
        "train/completion_len_mean",
        "train/lr",
        "time/step_s",
        "time/generation_tokens_per_s",
    ] {
        assert_eq!(steps(tag), [1, 2, 3, 4, 5, 6], "{tag}");
    }
    assert_eq!(steps("heldout/accuracy"), [0, 6]);
}
