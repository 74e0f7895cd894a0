//! Whether a job's plugins fit each other and the rest of its spec: one set of rules, applied by
//! the daemon at submit (so a job that cannot run is refused then) and by the worker at start.

use rlvr_plugin_api::{DataMode, OptimizerInfo, TrainedModel};
use rlvr_protocol::spec::JobSpec;

use crate::loader::PluginMeta;

/// Every way the optimizer does not fit the rest of the spec, as `(field, message)`: checked by
/// the worker at start and by the daemon at submit.
pub fn fit_problems(
    spec: &JobSpec,
    info: &OptimizerInfo,
    trains: TrainedModel,
    optimizer_id: &str,
) -> Vec<(String, String)> {
    let mut problems = Vec::new();
    let online = matches!(info.data_mode, DataMode::OnlineGroups | DataMode::OnlineWithCritic);
    if trains == TrainedModel::RewardModel {
        reward_model_problems(spec, info, optimizer_id, &mut problems);
    } else if online && spec.verifiers.is_empty() && spec.env.is_none() {
        problems.push((
            "verifiers".to_owned(),
            format!(
                "{optimizer_id} trains on rewards ({}); name at least one verifier (or an [env], whose \
                 episodes' rewards are the environment's)",
                info.data_mode.as_str()
            ),
        ));
    } else if spec.verifiers.is_empty() && spec.env.is_none() {
        for (field, path) in [("data.heldout", &spec.data.heldout), ("data.canaries", &spec.data.canaries)] {
            if path.is_some() {
                problems.push((
                    "verifiers".to_owned(),
                    format!("{field} is scored with the job's verifiers; name at least one"),
                ));
                break;
            }
        }
    }
    if info.needs_groups && spec.optimizer.group_size < 2 {
        problems.push((
            "optimizer.group_size".to_owned(),
            format!(
                "{optimizer_id} compares completions within a group; expected at least 2, got {}",
                spec.optimizer.group_size
            ),
        ));
    }
    if spec.env.is_some() && info.data_mode == DataMode::OnlineWithCritic {
        problems.push((
            "env".to_owned(),
            format!(
                "{optimizer_id}'s critic gives credit by position, and an episode's turns are not contiguous \
                 (the environment's replies lie between them): train episodes with GRPO or RLOO"
            ),
        ));
    }
    if spec.env.is_some() && !online {
        problems.push((
            "env".to_owned(),
            format!(
                "an environment's episodes are the rollouts of online training (GRPO, RLOO, PPO); \
                 {optimizer_id} trains offline"
            ),
        ));
    }
    if spec.curriculum.is_some() && !online {
        problems.push((
            "curriculum".to_owned(),
            format!("a curriculum chooses prompts of online training; {optimizer_id} trains offline"),
        ));
    }
    problems
}

/// What does not fit an optimizer that trains a reward model: it reads preference pairs, scores
/// its held-out pairs itself (pairwise accuracy), and trains every weight.
fn reward_model_problems(
    spec: &JobSpec,
    info: &OptimizerInfo,
    optimizer_id: &str,
    problems: &mut Vec<(String, String)>,
) {
    if info.data_mode != DataMode::OfflinePairs {
        problems.push((
            "optimizer.plugin".to_owned(),
            format!(
                "{optimizer_id} trains a reward model but reads {}; a reward model trains on preference pairs",
                info.data_mode.as_str()
            ),
        ));
    }
    if !spec.verifiers.is_empty() {
        problems.push((
            "verifiers".to_owned(),
            format!(
                "{optimizer_id} trains a reward model on preference pairs; its held-out score is pairwise \
                 accuracy and no verifier grades it: remove [[verifiers]]"
            ),
        ));
    }
    if spec.data.canaries.is_some() {
        problems.push((
            "data.canaries".to_owned(),
            format!("{optimizer_id} trains a reward model: canaries are prompts graded by verifiers, which it has none of"),
        ));
    }
    if spec.model.lora.is_some() {
        problems.push((
            "model.lora".to_owned(),
            format!("{optimizer_id} trains every weight of a reward model; LoRA is not supported for it"),
        ));
    }
}

/// The model an optimizer trains, from the registry's record (absent: a policy).
pub fn trained_model(meta: &PluginMeta) -> TrainedModel {
    meta.trains.as_deref().and_then(TrainedModel::parse).unwrap_or_default()
}

/// What an optimizer plugin said it needs, from the registry's record of its info.
pub fn optimizer_needs(meta: &PluginMeta) -> Option<OptimizerInfo> {
    let modes =
        [DataMode::OnlineGroups, DataMode::OnlineWithCritic, DataMode::OfflinePairs, DataMode::OfflineSft];
    let data_mode = modes.into_iter().find(|mode| meta.data_mode.as_deref() == Some(mode.as_str()))?;
    Some(OptimizerInfo {
        data_mode,
        needs_reference: meta.needs_reference.unwrap_or(false),
        needs_value_head: meta.needs_value_head.unwrap_or(false),
        needs_groups: meta.needs_groups.unwrap_or(false),
        libtorch_version: rlvr_plugin_api::LIBTORCH_VERSION.into(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(data_mode: DataMode) -> OptimizerInfo {
        OptimizerInfo {
            data_mode,
            needs_reference: false,
            needs_value_head: data_mode == DataMode::OnlineWithCritic,
            needs_groups: false,
            libtorch_version: "2.11.0".into(),
        }
    }

    fn spec(more: &str) -> JobSpec {
        let text = format!(
            "[job]\nname = \"j\"\nteam = \"t\"\nmodel_line = \"j\"\nseed = 1\n[model]\npolicy = \"builtin:tiny-arith\"\n\
             [data]\ntrain = \"d.jsonl\"\n[optimizer]\nplugin = \"p\"\n[budget]\nmax_steps = 2\n{more}"
        );
        JobSpec::from_toml(&text).unwrap()
    }

    #[test]
    fn an_environment_stands_for_the_verifiers_of_online_training_and_only_there() {
        let env = "[env]\nkind = \"openenv\"\nurl = \"http://127.0.0.1:8000\"\n";
        let grader = "[[verifiers]]\nplugin = \"math\"\n";
        // (the spec's sections, its optimizer's data mode, the fields refused)
        let cases: &[(&str, DataMode, &[&str])] = &[
            ("", DataMode::OnlineGroups, &["verifiers"]),
            (env, DataMode::OnlineGroups, &[]),
            (&format!("{env}{grader}"), DataMode::OnlineGroups, &[]),
            (env, DataMode::OnlineWithCritic, &["env"]),
            (env, DataMode::OfflineSft, &["env"]),
            ("", DataMode::OfflineSft, &[]),
        ];
        for (more, mode, refused) in cases {
            let spec = spec(more);
            let problems = fit_problems(&spec, &info(*mode), TrainedModel::Policy, "opt@1");
            let fields: Vec<&str> = problems.iter().map(|(field, _)| field.as_str()).collect();
            assert_eq!(&fields, refused, "{more} {mode:?}: {problems:?}");
        }
        let spec = spec(env);
        let problems = fit_problems(&spec, &info(DataMode::OnlineWithCritic), TrainedModel::Policy, "ppo@1");
        assert!(problems[0].1.contains("ppo@1's critic gives credit by position"), "{problems:?}");
    }
}
