//! Reward models: scores of a sequence-classification checkpoint against transformers'
//! `AutoModelForSequenceClassification` (tiny models made by `rm_reference.py`, 1e-4 in f32),
//! batched with padding, one and two labels, with and without a chat template; and a reward
//! model made and saved here, scored by transformers the same.

use crate::common;

use std::path::Path;
use std::process::Command;

use rlvr_model::reward::RewardModel;
use rlvr_model::{load, load_reward_model, save_pretrained};
use serde_json::{Value, json};
use tch::{Device, Kind};

const TOLERANCE: f64 = 1e-4;

/// Texts of different lengths, among them the built-in tokenizer's pad token (id 0, the
/// config's `pad_token_id`) inside a text, at its end, and as a whole text.
fn texts() -> Value {
    json!([
        "12+7=19",
        "What is 3 * 4? The answer is 12.",
        "x",
        "a<|pad|>b: a pad id inside the text",
        "ends with pad ids<|pad|><|pad|>",
        "<|pad|>",
        "<|bos|>a longer text, long enough to be the widest row of the batch by some margin: 0123456789",
        "\ttabs\nand newlines\n",
    ])
}

fn pairs() -> Value {
    json!([
        ["What is 2+2?", " 4"],
        ["Add 17 and 25.", " 17 + 25 = 42, so the answer is 42."],
        ["?", ""],
        ["Multiply 6 by 7 and explain.", " 6 * 7 = 42<|pad|>"],
    ])
}

/// Runs `rm_reference.py ARGS` with the project venv's python and parses its answer.
fn reference(args: &[&str]) -> Value {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/rm_reference.py");
    let out = Command::new(common::python()).arg(script).args(args).output().expect("run rm_reference.py");
    assert!(
        out.status.success(),
        "rm_reference.py {:?} failed:\n{}",
        &args[..2],
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("rm_reference.py prints JSON")
}

/// A directory with the built-in model's tokenizer files (character-level, `<|pad|>` = 0), and
/// `template` as its `chat_template.jinja`.
fn tokenizer_dir(root: &Path, template: Option<&str>) -> std::path::PathBuf {
    let builtin = load("builtin:tiny-arith", Device::Cpu, Kind::Float).unwrap();
    let dir = root.join("tokenizer");
    save_pretrained(&builtin, &dir).unwrap();
    if let Some(template) = template {
        std::fs::write(dir.join("chat_template.jinja"), template).unwrap();
    }
    dir
}

const TEMPLATE: &str =
    "{% for m in messages %}<|bos|>{{ m['role'] }}\n{{ m['content'] }}<|eos|>\n{% endfor %}";

fn ids_of(v: &Value) -> Vec<Vec<i64>> {
    serde_json::from_value(v.clone()).unwrap()
}

fn scores_of(v: &Value) -> Vec<Vec<f32>> {
    serde_json::from_value(v.clone()).unwrap()
}

fn max_diff(a: &[Vec<f32>], b: &[Vec<f32>]) -> f64 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .flat_map(|(x, y)| {
            assert_eq!(x.len(), y.len());
            x.iter().zip(y).map(|(p, q)| f64::from((p - q).abs()))
        })
        .fold(0.0, f64::max)
}

/// Our encoding and scores of `items` against the reference's: ids equal, scores within
/// [`TOLERANCE`] of transformers' right-padded batch at two batch sizes, and of its left-padded
/// batch except rows of nothing but the pad id (see `rlvr_model::reward`).
fn check_against(model: &RewardModel, items: &Value, reference: &Value) {
    let ours: Vec<Vec<i64>> = items
        .as_array()
        .unwrap()
        .iter()
        .map(|item| match item {
            Value::String(text) => model.encode(text).unwrap(),
            pair => model.encode_exchange(pair[0].as_str().unwrap(), pair[1].as_str().unwrap()).unwrap(),
        })
        .collect();
    assert_eq!(ours, ids_of(&reference["ids"]), "token ids");
    let right = scores_of(&reference["right"]);
    assert!(right.iter().all(|r| r.len() == model.num_labels()));
    // The scores differ between rows: the position read and the text matter.
    assert!(right.iter().any(|r| (r[0] - right[0][0]).abs() > 1e-2), "{right:?}");
    for batch_size in [3, 8] {
        let scores = model.score(&ours, batch_size).unwrap();
        let diff = max_diff(&scores, &right);
        eprintln!("batch_size {batch_size}: max |ours - transformers| = {diff:e}");
        assert!(diff < TOLERANCE, "batch_size {batch_size}: max |ours - transformers| = {diff:e}");
    }
    let pad = model.pad_token_id();
    let keep: Vec<usize> = (0..ours.len()).filter(|&i| ours[i].iter().any(|id| Some(*id) != pad)).collect();
    let left = scores_of(&reference["left"]);
    let scores = model.score(&ours, 8).unwrap();
    let pick = |s: &[Vec<f32>]| keep.iter().map(|&i| s[i].clone()).collect::<Vec<_>>();
    let diff = max_diff(&pick(&scores), &pick(&left));
    assert!(diff < TOLERANCE, "left padding: max |ours - transformers| = {diff:e}");
}

#[test]
fn scores_match_transformers() {
    struct Case {
        num_labels: usize,
        template: Option<&'static str>,
        items: Value,
    }
    let cases = [
        Case { num_labels: 1, template: None, items: texts() },
        // Transformers writes no id2label for two labels (its default): the count is implied.
        Case { num_labels: 2, template: None, items: texts() },
        Case { num_labels: 1, template: None, items: pairs() },
        Case { num_labels: 1, template: Some(TEMPLATE), items: pairs() },
    ];
    // Every case's model made and scored by one python.
    let tmp = tempfile::tempdir().unwrap();
    let mut commands = Vec::new();
    let mut dirs = Vec::new();
    for (i, case) in cases.iter().enumerate() {
        let root = tmp.path().join(i.to_string());
        std::fs::create_dir(&root).unwrap();
        let tokenizer = tokenizer_dir(&root, case.template);
        let dir = root.join("rm");
        commands.push(serde_json::json!([
            "make",
            case.num_labels.to_string(),
            tokenizer.to_str().unwrap(),
            dir.to_str().unwrap(),
            case.items.to_string(),
        ]));
        dirs.push(dir);
    }
    let references = reference(&["each", &Value::Array(commands).to_string()]);
    for (i, (case, dir)) in cases.iter().zip(&dirs).enumerate() {
        let reference = &references[i];
        let model = load_reward_model(dir, Device::Cpu, Kind::Float).unwrap();
        assert_eq!(model.num_labels(), case.num_labels, "case {i}");
        assert_eq!(model.pad_token_id(), Some(0));
        assert_eq!(model.tokenizer.has_chat_template(), case.template.is_some());
        check_against(&model, &case.items, reference);
    }
}

#[test]
fn a_reward_model_made_here_scores_the_same_in_transformers() {
    let tmp = tempfile::tempdir().unwrap();
    let base = load("builtin:tiny-arith?seed=4", Device::Cpu, Kind::Float).unwrap();
    let made = RewardModel::from_base(&base, 1, 9).unwrap();
    let dir = tmp.path().join("rm");
    made.save_pretrained(&dir).unwrap();
    let back = load_reward_model(&dir, Device::Cpu, Kind::Float).unwrap();
    assert_eq!(back.labels(), ["LABEL_0"]);
    let items = texts();
    let reference = reference(&["score", dir.to_str().unwrap(), &items.to_string()]);
    let ids = ids_of(&reference["ids"]);
    let made_scores = made.score(&ids, 4).unwrap();
    assert_eq!(made_scores, back.score(&ids, 4).unwrap(), "the saved model is the one made");
    check_against(&back, &items, &reference);
}

#[test]
fn refusals_name_what_is_wrong() {
    let tmp = tempfile::tempdir().unwrap();
    // A causal LM directory is not a reward model.
    let base = load("builtin:tiny-arith", Device::Cpu, Kind::Float).unwrap();
    let causal = tmp.path().join("causal");
    save_pretrained(&base, &causal).unwrap();
    let err = load_reward_model(&causal, Device::Cpu, Kind::Float).unwrap_err().to_string();
    assert!(err.ends_with("field \"architectures\": [\"LlamaForCausalLM\"] does not name LlamaForSequenceClassification: not a sequence-classification checkpoint"), "{err}");
    let model = RewardModel::from_base(&base, 2, 0).unwrap();
    let check = |rows: Vec<Vec<i64>>, batch_size: usize, expected: &str| {
        let err = model.score(&rows, batch_size).unwrap_err().to_string();
        assert_eq!(err, expected);
    };
    check(vec![vec![5], vec![]], 2, "invalid input: row 1 has no tokens");
    check(vec![vec![5, 101]], 2, "invalid input: row 0: token id 101 outside the vocabulary of 101");
    check(vec![vec![5, -1]], 2, "invalid input: row 0: token id -1 outside the vocabulary of 101");
    check(vec![vec![5]], 0, "invalid input: batch_size must be at least 1");
    assert_eq!(model.score(&[], 4).unwrap(), Vec::<Vec<f32>>::new());
    assert_eq!(model.label_id("LABEL_1"), Some(1));
    assert_eq!(model.label_id("1"), Some(1));
    assert_eq!(model.label_id("2"), None);
}
