//! The mapping onto TRL's `GRPOConfig`, case by case: what each spec maps to, and what each key
//! TRL cannot honour is refused with.

use super::*;

/// A GRPO job on the trl engine with 2 processes; `extra` goes under `[optimizer]` unless it
/// starts with a section header.
fn spec(optimizer: &str, extra: &str) -> JobSpec {
    let rows = if optimizer.contains("micro_batch_size") { "" } else { "micro_batch_size = 4" };
    let optimizer = format!("{rows}\n{optimizer}");
    let text = format!(
        r#"
[job]
name = "engine"
team = "math"
model_line = "tiny"
seed = 7
[model]
policy = "builtin:tiny-arith"
[data]
train = "train.jsonl"
[optimizer]
plugin = "grpo"
group_size = 4
{optimizer}
[[verifiers]]
plugin = "math"
[rollout]
prompts_per_step = 4
max_new_tokens = 6
[budget]
max_steps = 20
[resources]
devices = 2
[engine]
kind = "trl"
{extra}
"#
    );
    let spec = JobSpec::from_toml(&text).unwrap();
    spec.validate().unwrap();
    spec
}

#[test]
fn a_default_grpo_job_maps_onto_trls_keys() {
    let config = trl_grpo(&spec("", ""), 2).unwrap();
    let expected = TrlGrpoConfig {
        training: TrlTraining {
            learning_rate: config.training.learning_rate,
            lr_scheduler_type: "constant".into(),
            warmup_steps: 0,
            weight_decay: 0.0,
            adam_beta1: 0.9,
            adam_beta2: 0.999,
            adam_epsilon: 1e-8,
            max_grad_norm: 1.0,
            per_device_train_batch_size: 4,
            // 4 prompts × 4 completions over 2 processes of 4 rows a pass.
            gradient_accumulation_steps: 2,
            max_steps: 20,
            save_steps: config.training.save_steps,
            save_total_limit: config.training.save_total_limit,
            seed: 7,
            bf16: false,
            fsdp: None,
        },
        num_generations: 4,
        num_iterations: 1,
        loss_type: "grpo".into(),
        scale_rewards: "group".into(),
        epsilon: 0.2,
        epsilon_high: 0.2,
        beta: 0.04,
        importance_sampling_level: "token".into(),
        max_completion_length: 6,
        temperature: 1.0,
        top_p: 1.0,
        top_k: 0,
        overlong: None,
        vllm: None,
    };
    assert_eq!(config, expected);
}

/// `rollout.engine = "vllm"`: vLLM colocated in each rank, asleep through the optimizer step, the
/// mismatch corrected per token at the job's cap (off at 0).
#[test]
fn a_grpo_job_on_vllm_colocates_it_with_its_importance_cap() {
    let on_vllm = |rollout: &str| {
        let mut spec = spec("", "");
        let patch: RolloutSection = toml::from_str(&format!("engine = \"vllm\"\n{rollout}")).unwrap();
        spec.rollout.engine = patch.engine;
        spec.rollout.importance_cap = patch.importance_cap;
        spec.validate().unwrap();
        trl_grpo(&spec, 2).unwrap().vllm.unwrap()
    };
    let vllm = on_vllm("");
    assert_eq!(
        vllm,
        TrlVllm {
            use_vllm: true,
            vllm_mode: "colocate".into(),
            vllm_enable_sleep_mode: true,
            vllm_importance_sampling_correction: true,
            vllm_importance_sampling_mode: "token_truncate".into(),
            vllm_importance_sampling_clip_max: 2.0,
        }
    );
    assert_eq!(on_vllm("importance_cap = 5.0").vllm_importance_sampling_clip_max, 5.0);
    assert!(!on_vllm("importance_cap = 0.0").vllm_importance_sampling_correction);
    // As TRL's GRPOConfig takes them: at the top level of the keys, and none without vLLM.
    let keys = serde_json::to_value(trl_grpo(&spec("", ""), 2).unwrap()).unwrap();
    assert!(keys.get("use_vllm").is_none(), "{keys}");
    let mut spec = spec("", "");
    spec.rollout.engine = RolloutEngine::Vllm;
    let keys = serde_json::to_value(trl_grpo(&spec, 2).unwrap()).unwrap();
    assert_eq!(keys["use_vllm"], true, "{keys}");
    assert_eq!(keys["vllm_mode"], "colocate", "{keys}");
}

/// The `[optimizer]` lines, what is read of the mapping, and what it must read.
type Case = (&'static str, fn(&TrlGrpoConfig) -> String, &'static str);

#[test]
fn each_mapped_key_lands_on_its_trl_key() {
    let cases: &[Case] = &[
        ("loss_agg = \"token-mean\"", |c| c.loss_type.clone(), "dapo"),
        ("loss_agg = \"seq-mean-token-sum-norm\"", |c| c.loss_type.clone(), "dr_grpo"),
        ("scale_rewards = \"none\"", |c| c.scale_rewards.clone(), "none"),
        ("clip_eps_high = 0.28", |c| format!("{} {}", c.epsilon, c.epsilon_high), "0.2 0.28"),
        ("kl_beta = 0.0", |c| c.beta.to_string(), "0"),
        ("importance_ratio = \"sequence\"", |c| c.importance_sampling_level.clone(), "sequence"),
        ("mu = 2", |c| c.num_iterations.to_string(), "2"),
        (
            "lr = 3e-5\nlr_schedule = \"cosine\"",
            |c| format!("{} {}", c.training.learning_rate, c.training.lr_scheduler_type),
            "0.00003 cosine",
        ),
        (
            "overlong_buffer = 2",
            |c| format!("{:?}", c.overlong),
            "Some(TrlOverlong { buffer: 2, weight: 1.0 })",
        ),
        (
            "overlong_buffer = 2\noverlong_penalty = 0.5",
            |c| format!("{:?}", c.overlong),
            "Some(TrlOverlong { buffer: 2, weight: 0.5 })",
        ),
        (
            "std = \"sample\"\neps = 1e-4\nkl_estimator = \"k3\"\nkl_in = \"loss\"\nentropy_coef = 0.0",
            |c| c.loss_type.clone(),
            "grpo",
        ),
        (
            "micro_batch_size = 8",
            |c| {
                format!(
                    "{} {}",
                    c.training.per_device_train_batch_size, c.training.gradient_accumulation_steps
                )
            },
            "8 1",
        ),
        ("grad_clip = 0.0", |c| c.training.max_grad_norm.to_string(), "0"),
    ];
    for (optimizer, get, expected) in cases {
        let config = trl_grpo(&spec(optimizer, ""), 2).unwrap_or_else(|e| panic!("{optimizer}: {e:?}"));
        assert_eq!(get(&config), *expected, "{optimizer}");
    }
}

#[test]
fn what_trl_cannot_do_is_refused_naming_the_key() {
    // (optimizer keys, other sections, the refused field, words of its message)
    let cases: &[(&str, &str, &str, &str)] = &[
        ("kl_in = \"reward\"", "", "optimizer.kl_in", "no KL in the reward"),
        ("kl_estimator = \"k1\"", "", "optimizer.kl_estimator", "k3"),
        ("std = \"population\"", "", "optimizer.std", "Bessel"),
        ("eps = 1e-6", "", "optimizer.eps", "1e-4"),
        ("loss = \"cispo\"", "", "optimizer.loss", "cispo"),
        ("clip_ratio_c = 3.0", "", "optimizer.clip_ratio_c", "no dual clip"),
        ("entropy_coef = 0.01", "", "optimizer.entropy_coef", "no entropy bonus"),
        ("made_up = 1", "", "optimizer.made_up", "not a grpo key"),
        ("micro_batch_size = 3", "", "optimizer.micro_batch_size", "must split into passes"),
        ("micro_batch_tokens = 512", "", "optimizer.micro_batch_tokens", "rows only"),
        ("", "[rollout]\nstop = [\"\\n\"]", "rollout.stop", "EOS"),
        ("", "[rollout]\nignore_eos = true", "rollout.ignore_eos", "at its EOS token"),
        ("", "[budget]\nmax_wall_minutes = 5.0", "budget.max_wall_minutes", "budget.max_steps"),
        ("", "[eval]\nevery_steps = 5", "eval.every_steps", "before and after its run only"),
        ("", "[stop]\nkl_max = 1.0", "stop.kl_max", "[stop]"),
        ("", "[model]\nreference = \"/models/other\"", "model.reference", "starting policy"),
        ("", "[rollout]\nengine = \"vllm\"\noff_policy_steps = 1", "rollout.off_policy_steps", "server mode"),
        (
            "",
            "[rollout]\nengine = \"vllm\"\nmax_logprob_gap = 0.5",
            "rollout.max_logprob_gap",
            "does not check",
        ),
    ];
    for (optimizer, extra, field, words) in cases {
        let text = spec(optimizer, "");
        // Sections after [engine] replace the spec's own: re-parse with them spliced in.
        let spec = if extra.is_empty() {
            text
        } else {
            let mut value = serde_json::to_value(&text).unwrap();
            let patch: toml::Table = toml::from_str(extra).unwrap();
            for (section, table) in patch {
                for (key, item) in table.as_table().unwrap() {
                    value[&section][key] = serde_json::to_value(item).unwrap();
                }
            }
            serde_json::from_value(value).unwrap()
        };
        let refusals = trl_trainer(&spec, 2).expect_err(field);
        assert!(
            refusals.iter().any(|r| r.field == *field && r.message.contains(words)),
            "{field}: {refusals:?}"
        );
        assert_eq!(engine_problems(&spec), refusals, "the submit's check is the mapping's");
    }
}

#[test]
fn an_optimizer_without_a_trl_counterpart_is_refused_and_a_native_job_has_no_engine_problems() {
    let mut ppo = spec("", "");
    ppo.optimizer.plugin = "ppo".into();
    let refusals = trl_trainer(&ppo, 2).unwrap_err();
    assert_eq!(refusals.len(), 1);
    assert_eq!(refusals[0].field, "optimizer.plugin");
    assert!(refusals[0].message.contains("no TRL counterpart"), "{refusals:?}");
    ppo.engine.kind = EngineKind::Native;
    assert!(engine_problems(&ppo).is_empty());
}

#[test]
fn a_native_job_may_not_take_two_devices_an_engine_job_may() {
    let engine = spec("", "");
    assert_eq!(engine.resources.devices, 2);
    let mut native = engine.clone();
    native.engine = EngineSection::default();
    let errors = native.validate().unwrap_err().0;
    assert_eq!(errors[0].field, "resources.devices", "{errors:?}");
    assert!(errors[0].message.contains("an [engine] job may take more"), "{errors:?}");
    // The native default is not written back: specs without [engine] serialise as before.
    assert!(serde_json::to_value(&native).unwrap().get("engine").is_none());
}

#[test]
fn an_sft_job_maps_its_shared_keys_and_splits_its_demonstrations() {
    let mut sft = spec("", "");
    sft.optimizer.plugin = "sft".into();
    sft.rollout.prompts_per_step = 16;
    sft.optimizer.options.clear();
    let TrlTrainer::Sft(config) = trl_trainer(&sft, 2).unwrap() else { panic!("an sft trainer") };
    // 16 demonstrations over 2 processes of 4 a pass.
    assert_eq!(
        (config.training.per_device_train_batch_size, config.training.gradient_accumulation_steps),
        (4, 2)
    );
    assert_eq!(config.training.max_steps, 20);
    sft.optimizer.options.insert("loss_agg".into(), "seq-mean-token-mean".into());
    sft.rollout.prompts_per_step = 6;
    let refusals = trl_trainer(&sft, 2).unwrap_err();
    let fields: Vec<&str> = refusals.iter().map(|r| r.field.as_str()).collect();
    assert_eq!(fields, ["optimizer.loss_agg", "optimizer.micro_batch_size"], "{refusals:?}");
}

#[test]
fn a_dpo_job_takes_its_beta_and_whole_pairs() {
    let mut dpo = spec("", "");
    dpo.optimizer.plugin = "dpo".into();
    dpo.optimizer.options.clear();
    dpo.optimizer.options.insert("beta".into(), 0.2.into());
    dpo.rollout.prompts_per_step = 8;
    // Passes of 4 sequences are 2 pairs; 8 pairs over 2 processes.
    let TrlTrainer::Dpo(config) = trl_trainer(&dpo, 2).unwrap() else { panic!("a dpo trainer") };
    assert_eq!((config.beta, config.label_smoothing), (0.2, 0.0));
    assert_eq!(
        (config.training.per_device_train_batch_size, config.training.gradient_accumulation_steps),
        (2, 2)
    );
    dpo.optimizer.micro_batch_size = 3;
    let refusals = trl_trainer(&dpo, 2).unwrap_err();
    assert!(
        refusals.iter().any(|r| r.field == "optimizer.micro_batch_size" && r.message.contains("even")),
        "{refusals:?}"
    );
}

#[test]
fn the_book_shows_the_mapping_as_it_is() {
    let page = include_str!("../../docs/src/operators/engines.md");
    for row in GRPO_MAPPING.iter().chain(SFT_MAPPING).chain(DPO_MAPPING) {
        let line = format!("| `{}` | `{}` | {} |", row.ours, row.theirs, row.note);
        assert!(page.contains(&line), "docs/src/operators/engines.md lacks the mapping row {line}");
    }
}

#[test]
fn fsdp2_shards_over_two_ranks_or_more_of_an_engine_job_and_is_refused_elsewhere() {
    let ddp = trl_grpo(&spec("", ""), 2).unwrap();
    assert_eq!(ddp.training.fsdp, None, "DDP is the default");
    let text = serde_json::to_value(&ddp).unwrap();
    assert!(text.get("fsdp").is_none() && text.get("fsdp_config").is_none(), "{text}");

    let sharded = spec("", "strategy = \"fsdp2\"");
    let config = trl_grpo(&sharded, 2).unwrap();
    // What TrainingArguments takes, flat beside the other keys.
    let text = serde_json::to_value(&config).unwrap();
    assert_eq!(text["fsdp"], true);
    assert_eq!(
        text["fsdp_config"],
        serde_json::json!({
            "version": 2,
            "auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
            "reshard_after_forward": true,
            "state_dict_type": "SHARDED_STATE_DICT",
        })
    );
    let back: TrlGrpoConfig = serde_json::from_value(text).unwrap();
    assert_eq!(back, config, "the contract reads back as written");

    // (ranks, engine kind, the refusal's words, or none)
    let cases: &[(u32, EngineKind, Option<&str>)] = &[
        (2, EngineKind::Trl, None),
        (8, EngineKind::Trl, None),
        (1, EngineKind::Trl, Some("this job has 1: ask for at least 2")),
        (1, EngineKind::Native, Some("the native worker trains on one device")),
    ];
    for (ranks, kind, words) in cases {
        let mut spec = sharded.clone();
        spec.resources.devices = *ranks;
        spec.engine.kind = *kind;
        spec.optimizer.micro_batch_size = 16 / ranks.min(&16);
        let problems = engine_problems(&spec);
        match words {
            None => assert!(problems.is_empty(), "{ranks} {kind:?}: {problems:?}"),
            Some(words) => assert!(
                problems.iter().any(|p| p.field == "engine.strategy" && p.message.contains(words)),
                "{ranks} {kind:?}: {problems:?}"
            ),
        }
    }
}

#[test]
fn an_engine_job_spans_nodes_on_a_ray_cluster_only_its_ranks_devices_times_nodes() {
    /// The refused field and words of its message.
    type Refused = Option<(&'static str, &'static str)>;
    // (nodes, launcher, engine kind, what is refused)
    let cases: &[(u32, Launcher, EngineKind, Refused)] = &[
        (1, Launcher::Local, EngineKind::Trl, None),
        (2, Launcher::Ray, EngineKind::Trl, None),
        (2, Launcher::Local, EngineKind::Trl, Some(("resources.nodes", "set engine.launcher = \"ray\""))),
        (2, Launcher::Ray, EngineKind::Native, Some(("resources.nodes", "a native job runs on one host"))),
        (0, Launcher::Ray, EngineKind::Trl, Some(("resources.nodes", "expected 1"))),
    ];
    for (nodes, launcher, kind, refused) in cases {
        let mut spec = spec("", "");
        spec.resources.devices = if *kind == EngineKind::Native { 1 } else { 2 };
        spec.resources.nodes = *nodes;
        spec.engine.launcher = *launcher;
        spec.engine.kind = *kind;
        let mut problems = spec.validate().err().map(|errors| errors.0).unwrap_or_default();
        problems.extend(engine_problems(&spec));
        match refused {
            None => assert!(problems.is_empty(), "{nodes} {launcher:?} {kind:?}: {problems:?}"),
            Some((field, words)) => assert!(
                problems.iter().any(|p| p.field == *field && p.message.contains(words)),
                "{nodes} {launcher:?} {kind:?}: {problems:?}"
            ),
        }
    }
    // 2 devices on each of 2 nodes are 4 ranks: a step's 16 completions in passes of 4 rows on
    // each is one pass; 3 rows a pass do not split.
    let mut spec = spec("", "launcher = \"ray\"");
    spec.resources.nodes = 2;
    assert_eq!(spec.resources.ranks(), 4);
    assert_eq!(trl_grpo(&spec, spec.resources.ranks()).unwrap().training.gradient_accumulation_steps, 1);
    spec.optimizer.micro_batch_size = 3;
    let refused = engine_problems(&spec);
    assert!(refused.iter().any(|p| p.message.contains("on each of the 4 processes")), "{refused:?}");
}

#[test]
fn the_ranks_score_held_out_on_engine_jobs_only_and_then_during_the_run_too() {
    // (engine kind, engine.heldout, eval.every_steps, the refused field and words, or none)
    type Refused = Option<(&'static str, &'static str)>;
    let cases: &[(EngineKind, HeldoutBy, u64, Refused)] = &[
        (EngineKind::Trl, HeldoutBy::Worker, 0, None),
        (EngineKind::Trl, HeldoutBy::Engine, 0, None),
        (EngineKind::Trl, HeldoutBy::Engine, 5, None),
        (
            EngineKind::Trl,
            HeldoutBy::Worker,
            5,
            Some(("eval.every_steps", "set engine.heldout = \"engine\"")),
        ),
        (EngineKind::Native, HeldoutBy::Engine, 0, Some(("engine.heldout", "set engine.kind = \"trl\""))),
    ];
    for (kind, heldout, every, refused) in cases {
        let mut spec = spec("", "");
        spec.engine.kind = *kind;
        spec.engine.heldout = *heldout;
        spec.eval.every_steps = *every;
        let problems = engine_problems(&spec);
        match refused {
            None => assert!(problems.is_empty(), "{kind:?} {heldout:?} {every}: {problems:?}"),
            Some((field, words)) => assert!(
                problems.iter().any(|p| p.field == *field && p.message.contains(words)),
                "{kind:?} {heldout:?} {every}: {problems:?}"
            ),
        }
    }
    // The contract's set, as the worker writes it and the entry script reads it.
    let line: EngineCompletion = serde_json::from_str(r#"{"tokens": [5, 7, 2]}"#).unwrap();
    assert_eq!(line.tokens, [5, 7, 2]);
}
