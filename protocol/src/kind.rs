//! What kind of job a spec is, decided in one place ([`JobKind::of`]) from the spec and what its
//! optimizer plugin says of itself (its data mode and the model it trains): the worker picks its
//! step from it, and everything a kind alone has (a teacher, a reward model, a dataset written)
//! belongs to that kind's variant there.
//!
//! The kinds: online with groups, online with a critic, offline SFT, offline pairs, reward model,
//! rejection sampling, distillation, engine. Submit records the kind (`JobView.kind`; a record made
//! before it has none), the daemon passes it to the worker (`--kind`), and the worker refuses to run
//! a job as another kind; the worker's `Job` holds each kind's own parts in one `Work` variant.
//! (`Builtin::of` only says whether the optimizer is a library to load.)

use rlvr_plugin_api::{DataMode, TrainedModel};
use serde::{Deserialize, Serialize};

use crate::builtin::Builtin;
use crate::spec::JobSpec;

/// A job's kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum JobKind {
    /// An optimizer plugin on groups of completions sampled per prompt and graded (GRPO, RLOO).
    OnlineGroups,
    /// An optimizer plugin on sampled completions, with a learned critic (PPO).
    OnlineWithCritic,
    /// An optimizer plugin on demonstrations `{prompt, completion}` (SFT).
    OfflineSft,
    /// An optimizer plugin on preference pairs, training the policy (DPO).
    OfflinePairs,
    /// An optimizer plugin on preference pairs, training a reward model (a backbone and a score
    /// head) that the policy lends its tokenizer and config.
    RewardModel,
    /// The built-in rejection sampling: completions sampled and graded, the accepted ones written
    /// as a dataset; no weight changes.
    RejectionSampling,
    /// The built-in distillation: the policy learns a frozen teacher's distributions.
    Distill,
    /// Trained by an external engine (`[engine]`); the worker starts it and follows it.
    Engine,
}

/// What an optimizer plugin says of itself that decides a job's kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OptimizerTraits {
    pub data_mode: DataMode,
    pub trains: TrainedModel,
}

impl JobKind {
    /// The kind of `spec`, whose optimizer plugin (none for a built-in) says `optimizer` of
    /// itself. `None`: a plugin optimizer whose traits are not known.
    pub fn of(spec: &JobSpec, optimizer: Option<OptimizerTraits>) -> Option<JobKind> {
        if spec.engine.is_engine() {
            return Some(JobKind::Engine);
        }
        match Builtin::of(spec) {
            Some(Builtin::RejectionSampling) => return Some(JobKind::RejectionSampling),
            Some(Builtin::Distill) => return Some(JobKind::Distill),
            None => {}
        }
        let OptimizerTraits { data_mode, trains } = optimizer?;
        Some(match (data_mode, trains) {
            (_, TrainedModel::RewardModel) => JobKind::RewardModel,
            (DataMode::OnlineGroups, _) => JobKind::OnlineGroups,
            (DataMode::OnlineWithCritic, _) => JobKind::OnlineWithCritic,
            (DataMode::OfflineSft, _) => JobKind::OfflineSft,
            (DataMode::OfflinePairs, _) => JobKind::OfflinePairs,
        })
    }

    /// Every kind, in the order above.
    pub const ALL: [JobKind; 8] = [
        JobKind::OnlineGroups,
        JobKind::OnlineWithCritic,
        JobKind::OfflineSft,
        JobKind::OfflinePairs,
        JobKind::RewardModel,
        JobKind::RejectionSampling,
        JobKind::Distill,
        JobKind::Engine,
    ];

    /// Its name, as the job record, the API and `rlvr-worker run --kind` write it.
    pub fn as_str(self) -> &'static str {
        match self {
            JobKind::OnlineGroups => "online_groups",
            JobKind::OnlineWithCritic => "online_with_critic",
            JobKind::OfflineSft => "offline_sft",
            JobKind::OfflinePairs => "offline_pairs",
            JobKind::RewardModel => "reward_model",
            JobKind::RejectionSampling => "rejection_sampling",
            JobKind::Distill => "distill",
            JobKind::Engine => "engine",
        }
    }

    /// Whether its steps sample completions (and so grade them) before they update.
    pub fn samples(self) -> bool {
        matches!(self, JobKind::OnlineGroups | JobKind::OnlineWithCritic | JobKind::RejectionSampling)
    }
}

impl std::fmt::Display for JobKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for JobKind {
    type Err = String;

    fn from_str(text: &str) -> Result<JobKind, String> {
        JobKind::ALL.into_iter().find(|kind| kind.as_str() == text).ok_or_else(|| {
            let names: Vec<&str> = JobKind::ALL.iter().map(|kind| kind.as_str()).collect();
            format!("expected a job kind ({}), got {text:?}", names.join(", "))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_spec_and_its_optimizers_traits_make_one_kind() {
        let spec = |optimizer: &str, engine: bool| {
            let engine = if engine { "[engine]\nkind = \"trl\"\n" } else { "" };
            JobSpec::from_toml(&format!(
                "[job]\nname = \"k\"\nteam = \"t\"\nmodel_line = \"l\"\n[model]\npolicy = \"builtin:tiny-arith\"\n\
                 [data]\ntrain = \"train.jsonl\"\n[optimizer]\nplugin = \"{optimizer}\"\n[budget]\nmax_steps = 10\n{engine}"
            ))
            .unwrap()
        };
        let traits = |data_mode, trains| Some(OptimizerTraits { data_mode, trains });
        let policy = TrainedModel::Policy;
        let rows = [
            (spec("grpo", false), traits(DataMode::OnlineGroups, policy), Some(JobKind::OnlineGroups)),
            (spec("ppo", false), traits(DataMode::OnlineWithCritic, policy), Some(JobKind::OnlineWithCritic)),
            (spec("sft", false), traits(DataMode::OfflineSft, policy), Some(JobKind::OfflineSft)),
            (spec("dpo", false), traits(DataMode::OfflinePairs, policy), Some(JobKind::OfflinePairs)),
            (
                spec("rm", false),
                traits(DataMode::OfflinePairs, TrainedModel::RewardModel),
                Some(JobKind::RewardModel),
            ),
            (spec("rejection-sampling", false), None, Some(JobKind::RejectionSampling)),
            (spec("distill", false), None, Some(JobKind::Distill)),
            // The engine trains whatever its optimizer's traits.
            (spec("grpo", true), traits(DataMode::OnlineGroups, policy), Some(JobKind::Engine)),
            (spec("sft", true), None, Some(JobKind::Engine)),
            // A plugin whose traits are unknown has no kind.
            (spec("grpo", false), None, None),
        ];
        for (spec, traits, kind) in rows {
            assert_eq!(JobKind::of(&spec, traits), kind, "{} {traits:?}", spec.optimizer.plugin);
        }
        assert!(JobKind::OnlineGroups.samples() && JobKind::RejectionSampling.samples());
        // Its name reads back, and is the one serde writes.
        for kind in JobKind::ALL {
            assert_eq!(kind.as_str().parse::<JobKind>(), Ok(kind));
            assert_eq!(serde_json::to_value(kind).unwrap(), kind.as_str());
        }
        assert!("grpo".parse::<JobKind>().unwrap_err().contains("online_groups"));
        assert!(!JobKind::OfflineSft.samples() && !JobKind::Distill.samples());
    }
}
