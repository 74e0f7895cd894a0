//! Conformance of the optimizer plugins (grpo, rloo, ppo, dpo, sft) with an independent reference.
//!
//! `tests/conformance/make_goldens.py` computes, in PyTorch float64 and from the papers' formulas,
//! the advantages, returns, loss, gradients and metrics of every plugin for every option value
//! and for the degenerate batches (all-pass, all-fail, groups of one, completions with no tokens).
//! Here each case runs through the real plugin library, loaded by the daemon's loader, with
//! tensors crossing the ABI boundary as handles — in float64 at 1e-6, and in float32 (what the
//! trainer uses) at a tolerance float32 can meet. A failure names the file, the case and the
//! quantity. The plugin libraries must be built first (`cargo build --workspace`, as
//! `scripts/test.sh` does).

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::{Mutex, OnceLock};

use rlvr_plugin_api::abi_stable::std_types::RSlice;
use rlvr_plugin_api::{
    AdvantageInputs, LossInputs, LossScale, OptimizerBox, PluginErrorKind, PluginInstance, PluginModRef,
    ROption, RStr, TensorHandle,
};
use rlvr_plugin_host::loader::load_and_check;
use rlvr_plugin_tensor::TensorHandleExt;
use rlvr_tests::{plugin_lib, workspace_root};
use serde_json::{Value, json};
use tch::{Device, Kind, Tensor};

const PLUGINS: [&str; 5] = ["grpo", "rloo", "ppo", "dpo", "sft"];

/// How close a value must be: `|got − want| ≤ tolerance · max(1, |want|)`.
#[derive(Debug, Clone, Copy)]
struct Precision {
    kind: Kind,
    tolerance: f64,
}

const F64: Precision = Precision { kind: Kind::Double, tolerance: 1e-6 };
/// float32 carries about 7 digits; sums over a batch and exp() lose one or two of them.
const F32: Precision = Precision { kind: Kind::Float, tolerance: 1e-4 };

// --- goldens ---------------------------------------------------------------------------------

struct Golden {
    file: String,
    crate_name: String,
    batches: serde_json::Map<String, Value>,
    cases: Vec<Value>,
}

fn golden_dir() -> PathBuf {
    workspace_root().join("tests/conformance")
}

fn golden(plugin: &str) -> Golden {
    let path = golden_dir().join(format!("{plugin}.json"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|error| panic!("{}: {error}", path.display()));
    let mut document: Value =
        serde_json::from_str(&text).unwrap_or_else(|error| panic!("{}: {error}", path.display()));
    assert_eq!(document["plugin"], plugin, "{}", path.display());
    Golden {
        file: format!("tests/conformance/{plugin}.json"),
        crate_name: document["crate"].as_str().unwrap().to_owned(),
        batches: document["batches"].as_object().unwrap().clone(),
        cases: document["cases"].as_array_mut().map(std::mem::take).unwrap(),
    }
}

fn numbers(value: &Value) -> Vec<f64> {
    match value {
        Value::Array(items) => items.iter().flat_map(numbers).collect(),
        Value::Number(number) => vec![number.as_f64().unwrap()],
        other => panic!("expected numbers, got {other}"),
    }
}

fn metrics_of(value: &Value) -> BTreeMap<String, f64> {
    value
        .as_object()
        .map(|map| map.iter().map(|(k, v)| (k.clone(), v.as_f64().unwrap())).collect())
        .unwrap_or_default()
}

/// A batch's tensors in one dtype.
struct Batch {
    rewards: Option<Vec<f64>>,
    group_ids: Option<Vec<u64>>,
    mask: Tensor,
    old_logprobs: Option<Tensor>,
    ref_logprobs: Option<Tensor>,
    logprobs: Tensor,
    values: Option<Tensor>,
    new_values: Option<Tensor>,
    scale: LossScale,
}

fn matrix(value: &Value, kind: Kind) -> Tensor {
    let rows = value.as_array().unwrap();
    let cols = rows.first().and_then(Value::as_array).map_or(0, Vec::len);
    Tensor::from_slice(&numbers(value)).reshape([rows.len() as i64, cols as i64]).to_kind(kind)
}

impl Batch {
    fn new(json: &Value, kind: Kind) -> Batch {
        let tensor = |key: &str| json.get(key).map(|value| matrix(value, kind));
        let scale = &json["scale"];
        Batch {
            rewards: json.get("rewards").map(numbers),
            group_ids: json
                .get("group_ids")
                .map(|ids| ids.as_array().unwrap().iter().map(|id| id.as_u64().unwrap()).collect()),
            mask: tensor("mask").unwrap(),
            old_logprobs: tensor("old_logprobs"),
            ref_logprobs: tensor("ref_logprobs"),
            logprobs: tensor("logprobs").unwrap(),
            values: tensor("values"),
            new_values: tensor("new_values"),
            scale: LossScale {
                batch_sequences: scale["batch_sequences"].as_u64().unwrap(),
                batch_tokens: scale["batch_tokens"].as_u64().unwrap(),
                max_new_tokens: scale["max_new_tokens"].as_u64().unwrap() as u32,
            },
        }
    }

    fn rows(&self) -> i64 {
        self.logprobs.size()[0]
    }
}

// --- plugins through the real loader ----------------------------------------------------------

/// Each library once per process: the loader never unloads, and `dlopen` of a path it has seen
/// returns the first handle anyway.
fn module(crate_name: &str) -> PluginModRef {
    static MODULES: OnceLock<Mutex<HashMap<String, PluginModRef>>> = OnceLock::new();
    // A refused library panics below; the next test still gets the lock (and its own refusal).
    let mut modules =
        MODULES.get_or_init(Default::default).lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    *modules.entry(crate_name.to_owned()).or_insert_with(|| {
        let path = plugin_lib(crate_name);
        match load_and_check(&path) {
            Ok((module, _)) => module,
            Err(refusal) => panic!("{} refused: {refusal}", path.display()),
        }
    })
}

fn create(crate_name: &str, config: &Value) -> Result<OptimizerBox, rlvr_plugin_api::PluginError> {
    create_for(crate_name, config, None)
}

/// An optimizer created as the worker creates it: through `create_in`, with a host context that
/// gives the job's `max_new_tokens` (DAPO's `L_max`), or none (a host that does not give it).
fn create_for(
    crate_name: &str,
    config: &Value,
    max_new_tokens: Option<u32>,
) -> Result<OptimizerBox, rlvr_plugin_api::PluginError> {
    let config = config.to_string();
    let host = rlvr_plugin_api::HostContext { max_new_tokens, ..rlvr_plugin_api::HostContext::default() };
    let create_in = module(crate_name).create_in().expect("every plugin of this workspace has create_in");
    let created =
        create_in(RStr::from(config.as_str()), RSlice::from_slice(&[]), RStr::from(host.to_json().as_str()));
    match created.into_result()? {
        PluginInstance::Optimizer(optimizer) => Ok(optimizer),
        _ => panic!("{crate_name} did not create an optimizer"),
    }
}

fn borrow(tensor: &Option<Tensor>) -> ROption<TensorHandle> {
    match tensor {
        Some(tensor) => ROption::RSome(TensorHandle::borrow(tensor)),
        None => ROption::RNone,
    }
}

// --- one case ------------------------------------------------------------------------------------

/// What a plugin computed for one case.
struct Outcome {
    advantages: Option<Tensor>,
    returns: Option<Tensor>,
    advantage_metrics: BTreeMap<String, f64>,
    loss: f64,
    grad_logprobs: Tensor,
    grad_values: Option<Tensor>,
    loss_metrics: BTreeMap<String, f64>,
}

fn metric_map(metrics: &[rlvr_plugin_api::Metric]) -> BTreeMap<String, f64> {
    metrics.iter().map(|metric| (metric.name.to_string(), metric.value)).collect()
}

/// Runs advantages (online plugins) and the loss of the whole batch as micro-batches split at
/// `cuts` (row indices); the loss's advantages and returns are the golden ones, so each quantity
/// is checked on its own.
fn run(
    optimizer: &OptimizerBox,
    batch: &Batch,
    expected: &Value,
    kind: Kind,
    cuts: &[i64],
) -> Result<Outcome, String> {
    let mut outcome = Outcome {
        advantages: None,
        returns: None,
        advantage_metrics: BTreeMap::new(),
        loss: 0.0,
        grad_logprobs: Tensor::new(),
        grad_values: None,
        loss_metrics: BTreeMap::new(),
    };
    if let (Some(rewards), Some(group_ids)) = (&batch.rewards, &batch.group_ids) {
        let output = optimizer
            .advantages(&AdvantageInputs {
                rewards: rewards.as_slice().into(),
                group_ids: group_ids.as_slice().into(),
                old_logprobs: TensorHandle::borrow(batch.old_logprobs.as_ref().unwrap()),
                ref_logprobs: borrow(&batch.ref_logprobs),
                mask: TensorHandle::borrow(&batch.mask),
                values: borrow(&batch.values),
            })
            .into_result()
            .map_err(|error| format!("advantages() failed: {error}"))?;
        // SAFETY: owned handles from the plugin, each taken back once.
        unsafe {
            outcome.advantages = Some(output.advantages.into_tensor());
            outcome.returns = output.returns.into_option().map(|handle| handle.into_tensor());
        }
        outcome.advantage_metrics = metric_map(&output.metrics);
    }

    let golden = |key: &str| expected.get(key).map(|value| matrix(value, kind));
    let advantages = golden("advantages");
    let returns = golden("returns");
    let logprobs = batch.logprobs.copy().set_requires_grad(true);
    let values =
        batch.new_values.as_ref().filter(|_| returns.is_some()).map(|v| v.copy().set_requires_grad(true));
    let mut total: Option<Tensor> = None;
    let bounds: Vec<i64> = std::iter::once(0).chain(cuts.iter().copied()).chain([batch.rows()]).collect();
    for window in bounds.windows(2) {
        let (start, length) = (window[0], window[1] - window[0]);
        let rows = |tensor: &Tensor| tensor.narrow(0, start, length);
        let part = |tensor: &Option<Tensor>| tensor.as_ref().map(rows);
        let (logprobs_part, mask_part, values_part) = (rows(&logprobs), rows(&batch.mask), part(&values));
        let (old_part, ref_part) = (part(&batch.old_logprobs), part(&batch.ref_logprobs));
        let (advantages_part, returns_part) = (part(&advantages), part(&returns));
        let old_values_part = if values.is_some() { part(&batch.values) } else { None };
        let output = optimizer
            .loss(&LossInputs {
                logprobs: TensorHandle::borrow(&logprobs_part),
                mask: TensorHandle::borrow(&mask_part),
                old_logprobs: if advantages.is_some() { borrow(&old_part) } else { ROption::RNone },
                ref_logprobs: borrow(&ref_part),
                advantages: borrow(&advantages_part),
                values: borrow(&values_part),
                old_values: borrow(&old_values_part),
                returns: borrow(&returns_part),
                scale: batch.scale,
            })
            .into_result()
            .map_err(|error| format!("loss() of rows {start}..{} failed: {error}", start + length))?;
        // SAFETY: an owned handle from the plugin, taken back once.
        let loss = unsafe { output.loss.into_tensor() };
        if loss.size() != Vec::<i64>::new() || loss.kind() != kind || !loss.requires_grad() {
            return Err(format!(
                "loss: expected a scalar {kind:?} with grad, got {:?} {:?}",
                loss.size(),
                loss.kind()
            ));
        }
        if bounds.len() == 2 {
            outcome.loss_metrics = metric_map(&output.metrics);
        }
        total = Some(match total {
            Some(sum) => sum + loss,
            None => loss,
        });
    }
    let total = total.unwrap();
    total.backward();
    outcome.loss = total.double_value(&[]);
    outcome.grad_logprobs = logprobs.grad();
    outcome.grad_values = values.map(|values| values.grad());
    Ok(outcome)
}

/// Compares one quantity; a NaN never passes.
fn compare(failures: &mut Vec<String>, what: &str, got: &[f64], want: &[f64], tolerance: f64) {
    if got.len() != want.len() {
        failures.push(format!("{what}: expected {} values, got {}", want.len(), got.len()));
        return;
    }
    for (index, (got, want)) in got.iter().zip(want).enumerate() {
        let close = (got - want).abs() <= tolerance * want.abs().max(1.0);
        if !close || got.is_nan() {
            failures.push(format!("{what}[{index}]: expected {want}, got {got}"));
            return;
        }
    }
}

fn host(tensor: &Tensor) -> Vec<f64> {
    Vec::<f64>::try_from(&tensor.to_kind(Kind::Double).reshape([-1])).unwrap()
}

fn compare_tensor(
    failures: &mut Vec<String>,
    what: &str,
    got: Option<&Tensor>,
    want: Option<&Value>,
    precision: Precision,
) {
    match (got, want) {
        (Some(got), Some(want)) => {
            if got.kind() != precision.kind {
                failures.push(format!("{what}: expected dtype {:?}, got {:?}", precision.kind, got.kind()));
            }
            compare(failures, what, &host(got), &numbers(want), precision.tolerance);
        }
        (None, None) => {}
        (Some(_), None) => failures.push(format!("{what}: returned, expected none")),
        (None, Some(_)) => failures.push(format!("{what}: expected, got none")),
    }
}

fn compare_metrics(
    failures: &mut Vec<String>,
    what: &str,
    got: &BTreeMap<String, f64>,
    want: &BTreeMap<String, f64>,
    tolerance: f64,
) {
    if got.keys().ne(want.keys()) {
        failures.push(format!("{what}: expected the metrics {:?}, got {:?}", want.keys(), got.keys()));
    }
    for (name, want) in want {
        if let Some(got) = got.get(name) {
            compare(failures, &format!("{what}.{name}"), &[*got], &[*want], tolerance);
        }
    }
}

/// Every case of one golden file at one precision, split into micro-batches at `cuts(rows)`;
/// returns the failures, each naming file, case and quantity.
fn check_file(plugin: &str, precision: Precision, cuts: impl Fn(i64) -> Vec<i64>) -> (usize, Vec<String>) {
    let golden = golden(plugin);
    let mut failures = Vec::new();
    for case in &golden.cases {
        let name = case["name"].as_str().unwrap();
        let batch = Batch::new(&golden.batches[case["batch"].as_str().unwrap()], precision.kind);
        let expected = &case["expected"];
        let cuts = cuts(batch.rows());
        let label =
            format!("{} case {name} ({:?}, micro-batches cut at {cuts:?})", golden.file, precision.kind);
        let optimizer =
            match create_for(&golden.crate_name, &case["config"], Some(batch.scale.max_new_tokens)) {
                Ok(optimizer) => optimizer,
                Err(error) => {
                    failures.push(format!("{label}: create failed: {error}"));
                    continue;
                }
            };
        let outcome = match run(&optimizer, &batch, expected, precision.kind, &cuts) {
            Ok(outcome) => outcome,
            Err(error) => {
                failures.push(format!("{label}: {error}"));
                continue;
            }
        };
        let mut problems = Vec::new();
        let tolerance = precision.tolerance;
        compare_tensor(
            &mut problems,
            "advantages",
            outcome.advantages.as_ref(),
            expected.get("advantages"),
            precision,
        );
        compare_tensor(
            &mut problems,
            "returns",
            outcome.returns.as_ref(),
            expected.get("returns"),
            precision,
        );
        compare(&mut problems, "loss", &[outcome.loss], &numbers(&expected["loss"]), tolerance);
        compare_tensor(
            &mut problems,
            "grad_logprobs",
            Some(&outcome.grad_logprobs),
            expected.get("grad_logprobs"),
            precision,
        );
        compare_tensor(
            &mut problems,
            "grad_values",
            outcome.grad_values.as_ref(),
            expected.get("grad_values"),
            precision,
        );
        let want = metrics_of(&expected["advantage_metrics"]);
        compare_metrics(&mut problems, "advantage_metrics", &outcome.advantage_metrics, &want, tolerance);
        if cuts.is_empty() {
            let want = metrics_of(&expected["loss_metrics"]);
            compare_metrics(&mut problems, "loss_metrics", &outcome.loss_metrics, &want, tolerance);
        }
        failures.extend(problems.into_iter().map(|problem| format!("{label}: {problem}")));
    }
    (golden.cases.len(), failures)
}

fn assert_all(results: Vec<(usize, Vec<String>)>) {
    let cases: usize = results.iter().map(|(cases, _)| cases).sum();
    let failures: Vec<String> = results.into_iter().flat_map(|(_, failures)| failures).collect();
    assert!(failures.is_empty(), "{} failures over {cases} cases:\n{}", failures.len(), failures.join("\n"));
    assert!(cases > 0, "no golden cases in {}", golden_dir().display());
}

fn whole(_rows: i64) -> Vec<i64> {
    Vec::new()
}

/// Cuts at about a third and two thirds, on pair boundaries: pairs (DPO) must stay together, and
/// groups need not (advantages are computed before the split).
fn thirds(rows: i64) -> Vec<i64> {
    let mut cuts: Vec<i64> = [rows / 3, 2 * rows / 3]
        .into_iter()
        .map(|cut| cut - cut % 2)
        .filter(|&cut| cut > 0 && cut < rows)
        .collect();
    cuts.dedup();
    cuts
}

// --- tests ---------------------------------------------------------------------------------------

#[test]
fn every_golden_case_matches_in_f64() {
    assert_all(PLUGINS.iter().map(|plugin| check_file(plugin, F64, whole)).collect());
}

#[test]
fn every_golden_case_matches_in_f32() {
    assert_all(PLUGINS.iter().map(|plugin| check_file(plugin, F32, whole)).collect());
}

/// The host sums micro-batch losses of one step: whatever the split, the sum and its gradient
/// are the whole batch's.
#[test]
fn micro_batch_losses_sum_to_the_whole_batch() {
    assert_all(PLUGINS.iter().map(|plugin| check_file(plugin, F64, thirds)).collect());
}

#[test]
fn each_plugin_states_its_needs() {
    // crate, name, data mode, reference, value head, groups
    let table = [
        ("rlvr-optimizer-grpo", "grpo", "online-groups", true, false, true),
        ("rlvr-optimizer-rloo", "rloo", "online-groups", true, false, true),
        ("rlvr-optimizer-ppo", "ppo", "online-with-critic", true, true, false),
        ("rlvr-optimizer-dpo", "dpo", "offline-pairs", true, false, false),
        ("rlvr-optimizer-sft", "sft", "offline-sft", false, false, false),
    ];
    for (crate_name, name, data_mode, reference, value_head, groups) in table {
        module(crate_name);
        let (_, meta) = load_and_check(&plugin_lib(crate_name)).unwrap();
        assert_eq!(meta.name, name);
        assert_eq!(meta.data_mode.as_deref(), Some(data_mode), "{name}");
        assert_eq!(meta.needs_reference, Some(reference), "{name}");
        assert_eq!(meta.needs_value_head, Some(value_head), "{name}");
        assert_eq!(meta.needs_groups, Some(groups), "{name}");
    }
}

#[test]
fn an_instance_uses_the_reference_only_when_its_options_read_it() {
    let cases = [
        ("rlvr-optimizer-grpo", json!({}), true),
        ("rlvr-optimizer-grpo", json!({"kl_beta": 0.0}), false),
        ("rlvr-optimizer-grpo", json!({"kl_beta": 0.1, "kl_in": "reward"}), true),
        ("rlvr-optimizer-rloo", json!({"kl_beta": 0.0}), false),
        ("rlvr-optimizer-ppo", json!({}), true),
        ("rlvr-optimizer-dpo", json!({}), true),
        ("rlvr-optimizer-sft", json!({}), false),
    ];
    for (crate_name, config, expected) in cases {
        let optimizer = create(crate_name, &config).unwrap();
        assert_eq!(optimizer.uses_reference(), expected, "{crate_name} {config}");
    }
}

#[test]
fn unknown_keys_and_out_of_range_values_are_refused_by_name() {
    // crate, config, what the message must contain: `<key>: <problem>`, the key first, as the
    // daemon reads it back to name `optimizer.<key>`
    let table = [
        ("grpo", r#"{"clip_eps_hihg": 0.28}"#, "clip_eps_hihg: unknown key; expected one of scale_rewards,"),
        ("grpo", r#"{"lr": 1e-6}"#, "lr: unknown key; expected one of scale_rewards,"),
        (
            "grpo",
            r#"{"clip_eps_high": 0.1}"#,
            "clip_eps_high: expected a number ≥ clip_eps_low (0.2), got 0.1",
        ),
        ("grpo", r#"{"eps": 0}"#, "eps: expected a number > 0, got 0"),
        ("grpo", r#"{"kl_estimator": "k4"}"#, "kl_estimator: expected one of k1, k2, k3, got \"k4\""),
        (
            "grpo",
            r#"{"loss_agg": "sum"}"#,
            "loss_agg: expected one of token-mean, seq-mean-token-mean, seq-mean-token-sum-norm, got \"sum\"",
        ),
        ("grpo", r#"{"kl_beta": -0.1}"#, "kl_beta: expected a number ≥ 0, got -0.1"),
        ("rloo", r#"{"baseline": "mean"}"#, "baseline: unknown key; expected one of kl_beta,"),
        ("rloo", r#"{"clip_eps": 1.5}"#, "clip_eps: expected a number in (0, 1), got 1.5"),
        (
            "rloo",
            r#"{"normalize_advantages": "yes"}"#,
            "normalize_advantages: expected a boolean, got string \"yes\"",
        ),
        ("ppo", r#"{"lambda": 0.9}"#, "lambda: unknown key; expected one of gamma, lam,"),
        ("ppo", r#"{"lam": 1.5}"#, "lam: expected a number in [0, 1], got 1.5"),
        ("ppo", r#"{"vf_clip": 0}"#, "vf_clip: expected a number > 0, got 0"),
        ("dpo", r#"{"betta": 0.1}"#, "betta: unknown key; expected one of beta, label_smoothing"),
        ("dpo", r#"{"beta": 0}"#, "beta: expected a number > 0, got 0"),
        ("dpo", r#"{"label_smoothing": 0.5}"#, "label_smoothing: expected a number in [0, 0.5), got 0.5"),
        ("sft", r#"{"label_smoothing": 0.1}"#, "label_smoothing: unknown key; expected one of loss_agg"),
        ("sft", r#"{"loss_agg": "seq-mean-token-sum-norm"}"#, "loss_agg: expected one of "),
        (
            "grpo",
            r#"{"importance_ratio": "seq"}"#,
            "importance_ratio: expected one of token, sequence, got \"seq\"",
        ),
        ("grpo", r#"{"loss": "grpo"}"#, "loss: expected one of ppo-clip, cispo, got \"grpo\""),
        (
            "grpo",
            r#"{"loss": "cispo", "importance_ratio": "sequence"}"#,
            "importance_ratio: \"sequence\" applies to loss = \"ppo-clip\" only",
        ),
        (
            "grpo",
            r#"{"loss": "cispo", "clip_ratio_c": 3}"#,
            "clip_ratio_c: applies to loss = \"ppo-clip\" only",
        ),
        ("grpo", r#"{"clip_ratio_c": 1}"#, "clip_ratio_c: expected a number > 1, got 1"),
        ("grpo", r#"{"overlong_penalty": 0.5}"#, "overlong_penalty: needs overlong_buffer"),
        ("grpo", r#"{"entropy_coef": -0.1}"#, "entropy_coef: expected a number ≥ 0, got -0.1"),
        ("rloo", r#"{"overlong_buffer": 0}"#, "overlong_buffer: expected a number of tokens ≥ 1, got 0"),
        (
            "rloo",
            r#"{"overlong_buffer": 4, "overlong_penalty": -1}"#,
            "overlong_penalty: expected a number ≥ 0",
        ),
        ("rloo", r#"{"clip_ratio_c": 3}"#, "clip_ratio_c: unknown key; expected one of kl_beta,"),
        ("ppo", r#"{"clip_ratio_c": 0.9}"#, "clip_ratio_c: expected a number > 1, got 0.9"),
        ("ppo", r#"{"entropy_coef": -0.1}"#, "entropy_coef: expected a number ≥ 0, got -0.1"),
        ("ppo", r#"{"overlong_buffer": "long"}"#, "overlong_buffer: expected u32, got string \"long\""),
    ];
    for (plugin, config, message) in table {
        let config: Value = serde_json::from_str(config).unwrap();
        let error = create(&format!("rlvr-optimizer-{plugin}"), &config)
            .err()
            .unwrap_or_else(|| panic!("{plugin} took {config}"));
        assert_eq!(error.kind, PluginErrorKind::InvalidConfig, "{plugin} {config}: {error}");
        assert!(
            error.message.contains(message),
            "{plugin} {config}: {:?} does not contain {message:?}",
            error.message
        );
    }
}

#[test]
fn a_shape_mismatch_is_an_error_that_names_the_tensor() {
    for plugin in PLUGINS {
        let optimizer =
            create(&format!("rlvr-optimizer-{plugin}"), &Value::Object(Default::default())).unwrap();
        let logprobs = Tensor::zeros([2, 3], (Kind::Double, Device::Cpu));
        let mask = Tensor::ones([2, 2], (Kind::Double, Device::Cpu));
        let error = optimizer
            .loss(&LossInputs {
                logprobs: TensorHandle::borrow(&logprobs),
                mask: TensorHandle::borrow(&mask),
                old_logprobs: ROption::RSome(TensorHandle::borrow(&logprobs)),
                ref_logprobs: ROption::RSome(TensorHandle::borrow(&logprobs)),
                advantages: ROption::RSome(TensorHandle::borrow(&logprobs)),
                values: ROption::RSome(TensorHandle::borrow(&logprobs)),
                old_values: ROption::RSome(TensorHandle::borrow(&logprobs)),
                returns: ROption::RSome(TensorHandle::borrow(&logprobs)),
                scale: LossScale { batch_sequences: 2, batch_tokens: 6, max_new_tokens: 3 },
            })
            .into_result()
            .err()
            .unwrap_or_else(|| panic!("{plugin} took a [2, 2] mask for [2, 3] logprobs"));
        assert_eq!(error.kind, PluginErrorKind::InvalidInput, "{plugin}: {error}");
        assert_eq!(error.message, "mask: expected shape [2, 3] like logprobs, got [2, 2]", "{plugin}");
    }
}

/// DAPO's `L_max` is the job's `max_new_tokens`, which the host context carries at creation: a
/// buffer longer than it is refused naming the key, and so is shaping in an optimizer created
/// by a host that does not give it.
#[test]
fn overlong_shaping_is_refused_by_name_without_the_jobs_max_new_tokens() {
    for plugin in ["grpo", "rloo", "ppo"] {
        let golden = golden(plugin);
        let batch = Batch::new(&golden.batches["base"], Kind::Double);
        let (rewards, group_ids) = (batch.rewards.clone().unwrap(), batch.group_ids.clone().unwrap());
        let inputs = AdvantageInputs {
            rewards: rewards.as_slice().into(),
            group_ids: group_ids.as_slice().into(),
            old_logprobs: TensorHandle::borrow(batch.old_logprobs.as_ref().unwrap()),
            ref_logprobs: borrow(&batch.ref_logprobs),
            mask: TensorHandle::borrow(&batch.mask),
            values: borrow(&batch.values),
        };
        let budget = batch.scale.max_new_tokens;
        let too_long =
            create_for(&golden.crate_name, &json!({"overlong_buffer": budget + 1}), Some(budget)).unwrap();
        let error = too_long.advantages(&inputs).into_result().err();
        let error = error.unwrap_or_else(|| panic!("{plugin} took a buffer above max_new_tokens"));
        assert_eq!(
            error.message,
            format!(
                "overlong_buffer: expected at most the job's max_new_tokens ({budget}), got {}",
                budget + 1
            ),
            "{plugin}"
        );
        let fits = create_for(&golden.crate_name, &json!({"overlong_buffer": budget}), Some(budget)).unwrap();
        assert!(fits.advantages(&inputs).into_result().is_ok(), "{plugin}");
        let unknown = create_for(&golden.crate_name, &json!({"overlong_buffer": budget}), None).unwrap();
        let error = unknown.advantages(&inputs).into_result().err();
        let error = error.unwrap_or_else(|| panic!("{plugin} shaped lengths without max_new_tokens"));
        assert!(
            error.message.starts_with("overlong_buffer: needs the job's max_new_tokens"),
            "{plugin}: {error}"
        );
        let plain = create(&golden.crate_name, &json!({})).unwrap();
        assert!(plain.advantages(&inputs).into_result().is_ok(), "{plugin} without shaping");
    }
}

/// The peer cross-check: verl 0.9.1's own policy-loss functions (dual-clip `vanilla`, `gspo`,
/// `cispo`, with its k3 KL term and aggregations), run by `tests/conformance/peer_verl.py` in
/// the venv of `scripts/peer-rl-venv.sh` on golden batches and their golden advantages, give
/// the plugin's loss and gradient (float64, completion tokens) within 1e-6.
#[test]
fn verl_computes_the_same_losses_and_gradients() {
    let root = workspace_root();
    let venv = std::process::Command::new("bash")
        .arg(root.join("scripts/peer-rl-venv.sh"))
        .output()
        .expect("run scripts/peer-rl-venv.sh");
    assert!(venv.status.success(), "peer-rl-venv.sh failed:\n{}", String::from_utf8_lossy(&venv.stderr));
    let python = String::from_utf8(venv.stdout).unwrap().trim().to_owned();
    let peer = std::process::Command::new(&python)
        .arg(root.join("tests/conformance/peer_verl.py"))
        .output()
        .expect("run peer_verl.py");
    assert!(peer.status.success(), "peer_verl.py failed:\n{}", String::from_utf8_lossy(&peer.stderr));
    let peer: Value = serde_json::from_slice(&peer.stdout).unwrap();
    let cases = peer["cases"].as_array().unwrap();
    assert!(cases.len() >= 12, "{} peer cases", cases.len());
    let mut failures = Vec::new();
    for result in cases {
        let (plugin, name) = (result["plugin"].as_str().unwrap(), result["case"].as_str().unwrap());
        let golden = golden(plugin);
        let case = golden.cases.iter().find(|case| case["name"] == name).unwrap();
        let batch = Batch::new(&golden.batches[case["batch"].as_str().unwrap()], Kind::Double);
        let optimizer =
            create_for(&golden.crate_name, &case["config"], Some(batch.scale.max_new_tokens)).unwrap();
        let outcome = run(&optimizer, &batch, &case["expected"], Kind::Double, &[]).unwrap();
        let label = format!("verl {} vs {plugin} case {name}", result["mode"]);
        let mut problems = Vec::new();
        compare(&mut problems, "loss", &[outcome.loss], &[result["loss"].as_f64().unwrap()], 1e-6);
        let ours = host(&(&outcome.grad_logprobs * &batch.mask));
        compare(&mut problems, "grad_logprobs", &ours, &numbers(&result["grad_logprobs"]), 1e-6);
        failures.extend(problems.into_iter().map(|problem| format!("{label}: {problem}")));
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

// --- rm: a reward model's pairs --------------------------------------------------------------

/// `rm` reads scores, not log-probabilities (`TrainedModel::RewardModel`): `logprobs` is `[B, 1]`
/// of scores, `mask` ones, `returns` each pair's margin. Its goldens come from their own script,
/// `tests/conformance/make_rm_goldens.py`; one case's batch split at `cuts`.
fn check_rm(precision: Precision, cuts: impl Fn(i64) -> Vec<i64>) -> (usize, Vec<String>) {
    let path = golden_dir().join("rm.json");
    let document: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    assert_eq!(document["plugin"], "rm");
    let mut failures = Vec::new();
    let cases = document["cases"].as_array().unwrap();
    for case in cases {
        let name = case["name"].as_str().unwrap();
        let batch = &document["batches"][case["batch"].as_str().unwrap()];
        let expected = &case["expected"];
        let scores = matrix(&batch["scores"], precision.kind).set_requires_grad(true);
        let margins = matrix(&batch["margins"], precision.kind);
        let rows = scores.size()[0];
        let mask = Tensor::ones([rows, 1], (precision.kind, Device::Cpu));
        let scale = LossScale {
            batch_sequences: batch["scale"]["batch_sequences"].as_u64().unwrap(),
            batch_tokens: batch["scale"]["batch_tokens"].as_u64().unwrap(),
            max_new_tokens: batch["scale"]["max_new_tokens"].as_u64().unwrap() as u32,
        };
        let cuts = cuts(rows);
        let label = format!("tests/conformance/rm.json case {name} ({:?}, cut at {cuts:?})", precision.kind);
        let optimizer = create("rlvr-optimizer-rm", &case["config"]).unwrap();
        let bounds: Vec<i64> = std::iter::once(0).chain(cuts.iter().copied()).chain([rows]).collect();
        let mut total: Option<Tensor> = None;
        let mut metrics = BTreeMap::new();
        for window in bounds.windows(2) {
            let part = |t: &Tensor| t.narrow(0, window[0], window[1] - window[0]);
            let (scores_part, mask_part, margins_part) = (part(&scores), part(&mask), part(&margins));
            let output = optimizer
                .loss(&LossInputs {
                    logprobs: TensorHandle::borrow(&scores_part),
                    mask: TensorHandle::borrow(&mask_part),
                    old_logprobs: ROption::RNone,
                    ref_logprobs: ROption::RNone,
                    advantages: ROption::RNone,
                    values: ROption::RNone,
                    old_values: ROption::RNone,
                    returns: ROption::RSome(TensorHandle::borrow(&margins_part)),
                    scale,
                })
                .into_result();
            let output = match output {
                Ok(output) => output,
                Err(error) => {
                    failures.push(format!("{label}: loss() failed: {error}"));
                    break;
                }
            };
            // SAFETY: an owned handle from the plugin, taken back once.
            let loss = unsafe { output.loss.into_tensor() };
            if loss.kind() != precision.kind || !loss.requires_grad() {
                failures.push(format!("{label}: loss: expected a {:?} scalar with grad", precision.kind));
            }
            metrics = metric_map(&output.metrics);
            total = Some(match total {
                Some(sum) => sum + loss,
                None => loss,
            });
        }
        let Some(total) = total else { continue };
        total.backward();
        let mut problems = Vec::new();
        compare(
            &mut problems,
            "loss",
            &[total.double_value(&[])],
            &numbers(&expected["loss"]),
            precision.tolerance,
        );
        compare_tensor(
            &mut problems,
            "grad_scores",
            Some(&scores.grad()),
            expected.get("grad_scores"),
            precision,
        );
        if cuts.is_empty() {
            let want = metrics_of(&expected["loss_metrics"]);
            compare_metrics(&mut problems, "loss_metrics", &metrics, &want, precision.tolerance);
        }
        failures.extend(problems.into_iter().map(|problem| format!("{label}: {problem}")));
    }
    (cases.len(), failures)
}

#[test]
fn every_rm_golden_case_matches_in_f64_and_f32_whole_and_in_micro_batches() {
    assert_all(vec![check_rm(F64, whole), check_rm(F32, whole), check_rm(F64, thirds)]);
}

#[test]
fn rm_states_that_it_trains_a_reward_model_on_pairs() {
    let (_, meta) = load_and_check(&plugin_lib("rlvr-optimizer-rm")).unwrap();
    assert_eq!(meta.name, "rm");
    assert_eq!(meta.data_mode.as_deref(), Some("offline-pairs"));
    assert_eq!(meta.trains.as_deref(), Some("reward-model"));
    assert_eq!(
        (meta.needs_reference, meta.needs_value_head, meta.needs_groups),
        (Some(false), Some(false), Some(false))
    );
    // The policy trainers say so too (a library built before `trains` says nothing: a policy).
    let (_, dpo) = load_and_check(&plugin_lib("rlvr-optimizer-dpo")).unwrap();
    assert_eq!(dpo.trains.as_deref(), Some("policy"));
}

/// What `rm` refuses, each naming the key or tensor: its options, and inputs that are not a
/// reward model's pairs.
#[test]
fn rm_refuses_options_and_inputs_naming_them() {
    for (config, message) in [
        (r#"{"margn": 1}"#, "margn: unknown key; expected one of margin"),
        (r#"{"margin": -1}"#, "margin: expected a number ≥ 0, got -1"),
        (r#"{"beta": 0.1}"#, "beta: unknown key; expected one of margin"),
    ] {
        let config: Value = serde_json::from_str(config).unwrap();
        let error = create("rlvr-optimizer-rm", &config).err().unwrap_or_else(|| panic!("rm took {config}"));
        assert_eq!(error.kind, PluginErrorKind::InvalidConfig, "{config}: {error}");
        assert!(error.message.contains(message), "{config}: {:?} lacks {message:?}", error.message);
    }
    let optimizer = create("rlvr-optimizer-rm", &json!({})).unwrap();
    let f = |rows: i64, cols: i64, value: f64| Tensor::full([rows, cols], value, (Kind::Double, Device::Cpu));
    let scale = |rows: u64| LossScale { batch_sequences: rows, batch_tokens: rows, max_new_tokens: 4 };
    let uneven_margins = Tensor::from_slice(&[0.5f64, 0.0]).reshape([2, 1]);
    // scores, mask, margins, scale, the message
    let cases: [(Tensor, Tensor, Option<Tensor>, LossScale, &str); 6] = [
        (
            f(2, 3, 0.0),
            f(2, 3, 1.0),
            Some(f(2, 3, 0.0)),
            scale(2),
            "logprobs: expected one score per row, [B, 1], got [2, 3]",
        ),
        (f(3, 1, 0.0), f(3, 1, 1.0), Some(f(3, 1, 0.0)), scale(4), "logprobs: expected pairs of rows"),
        (f(2, 1, 0.0), f(2, 1, 1.0), None, scale(2), "returns: required (each pair's margin), got none"),
        (
            f(2, 1, 0.0),
            f(2, 1, 1.0),
            Some(uneven_margins),
            scale(2),
            "returns: expected each pair's margin, finite and the same on both of its rows",
        ),
        (
            f(2, 1, 0.0),
            f(2, 1, 1.0),
            Some(f(2, 1, 0.0)),
            scale(3),
            "scale.batch_sequences: expected an even number",
        ),
        (
            f(2, 1, 0.0),
            f(2, 1, 0.0),
            Some(f(2, 1, 0.0)),
            scale(2),
            "mask: a reward model scores every row once",
        ),
    ];
    for (scores, mask, margins, scale, message) in cases {
        let error = optimizer
            .loss(&LossInputs {
                logprobs: TensorHandle::borrow(&scores),
                mask: TensorHandle::borrow(&mask),
                old_logprobs: ROption::RNone,
                ref_logprobs: ROption::RNone,
                advantages: ROption::RNone,
                values: ROption::RNone,
                old_values: ROption::RNone,
                returns: borrow(&margins),
                scale,
            })
            .into_result()
            .err()
            .unwrap_or_else(|| panic!("rm took the inputs of {message:?}"));
        assert_eq!(error.kind, PluginErrorKind::InvalidInput, "{error}");
        assert!(error.message.starts_with(message), "{:?} does not start with {message:?}", error.message);
    }
}
