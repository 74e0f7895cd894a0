//! Multi-stage pipelines (issue 21): a spec that chains jobs, each stage's input the previous
//! stage's gated output — DeepSeek-R1's cold-start SFT → GRPO → rejection sampling → SFT → GRPO
//! (arXiv:2501.12948 §2.3) is one such chain.
//!
//! A pipeline spec is `[pipeline] name, team` and `[[stages]]`, each stage a whole job spec. A
//! stage names the previous stage's output by writing [`PREVIOUS`] where a reference would go:
//! `model.policy` and `model.reference` take a published checkpoint (`line:LINE@VERSION`),
//! `data.train` a dataset (`dataset:NAME@SHA256`). Everything here is pure: parsing, the checks
//! a pipeline can make about itself (every error naming the field as written,
//! `stages[2].model.policy`), [`bind`] (a stage's spec with its input written in), and the wire
//! types of the pipeline routes. The daemon checks each stage as a job submit does, and runs them.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::job::JobState;
use crate::spec::{JobSpec, SpecError, SpecErrors};

/// The value of a field that takes the previous stage's output.
pub const PREVIOUS: &str = "previous";

/// Most stages one pipeline may have: R1's recipe has five.
pub const MAX_STAGES: usize = 16;

/// Longest pipeline name, as a job name.
const MAX_NAME_CHARS: usize = 128;

/// A pipeline spec.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct PipelineSpec {
    pub pipeline: PipelineSection,
    /// The stages in order, each a whole job spec.
    pub stages: Vec<JobSpec>,
}

/// `[pipeline]`: its name and the team that runs it (every stage's `job.team`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct PipelineSection {
    pub name: String,
    /// Left out, the submitting token's team ([`PipelineSpec::fill_team`]).
    #[serde(default)]
    pub team: String,
}

/// What a stage hands to the next one.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum StageOutput {
    /// A published version of a model line: `line:LINE@VERSION`.
    Checkpoint { line: String, version: u64 },
    /// A team dataset (a rejection-sampling stage's accepted completions): `dataset:NAME@SHA256`.
    Dataset { name: String, sha256: String },
}

impl StageOutput {
    /// What kind of output it is.
    pub fn kind(&self) -> OutputKind {
        match self {
            StageOutput::Checkpoint { .. } => OutputKind::Checkpoint,
            StageOutput::Dataset { .. } => OutputKind::Dataset,
        }
    }

    /// The reference a spec writes for it.
    pub fn reference(&self) -> String {
        match self {
            StageOutput::Checkpoint { line, version } => format!("line:{line}@{version}"),
            StageOutput::Dataset { name, sha256 } => format!("dataset:{name}@{sha256}"),
        }
    }
}

/// A checkpoint or a dataset.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutputKind {
    Checkpoint,
    Dataset,
}

impl fmt::Display for OutputKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            OutputKind::Checkpoint => "a checkpoint",
            OutputKind::Dataset => "a dataset",
        })
    }
}

/// What a job of `spec` hands on when it succeeds: the team dataset of a rejection-sampling job,
/// a published checkpoint of every other.
pub fn output_kind(spec: &JobSpec) -> OutputKind {
    match crate::kind::JobKind::of(spec, None) {
        Some(crate::kind::JobKind::RejectionSampling) => OutputKind::Dataset,
        _ => OutputKind::Checkpoint,
    }
}

/// The fields of `spec` that take the previous stage's output (those written [`PREVIOUS`]), with
/// the kind each takes, in spec order.
pub fn inputs(spec: &JobSpec) -> Vec<(&'static str, OutputKind)> {
    let mut fields = Vec::new();
    if spec.model.policy == PREVIOUS {
        fields.push(("model.policy", OutputKind::Checkpoint));
    }
    if spec.model.reference == PREVIOUS {
        fields.push(("model.reference", OutputKind::Checkpoint));
    }
    if spec.data.train.as_os_str() == PREVIOUS {
        fields.push(("data.train", OutputKind::Dataset));
    }
    fields
}

/// `spec` with `value` written into each field that takes the previous stage's output: the
/// output's reference when the stage runs, or a stand-in of the right kind when a pipeline's
/// stages are checked at submit.
pub fn fill(spec: &JobSpec, kind: OutputKind, value: &str) -> JobSpec {
    let mut filled = spec.clone();
    for (field, wanted) in inputs(spec) {
        if wanted != kind {
            continue;
        }
        match field {
            "model.policy" => filled.model.policy = value.to_owned(),
            "model.reference" => filled.model.reference = value.to_owned(),
            _ => filled.data.train = value.into(),
        }
    }
    filled
}

/// Stage `spec` with `previous`'s output written in; an error naming the field when the stage
/// takes a kind of output the previous stage did not give (the pipeline's check refuses that at
/// submit, so only a record changed by hand meets it).
pub fn bind(spec: &JobSpec, previous: &StageOutput) -> Result<JobSpec, SpecError> {
    if let Some((field, wanted)) = inputs(spec).into_iter().find(|(_, wanted)| *wanted != previous.kind()) {
        return Err(SpecError {
            field: field.to_owned(),
            message: format!("takes {wanted}, but the previous stage gave {}", previous.kind()),
        });
    }
    Ok(fill(spec, previous.kind(), &previous.reference()))
}

impl PipelineSpec {
    /// A pipeline that leaves out `pipeline.team` runs for `team`, the submitting token's; a
    /// stage that leaves out `job.team` runs for the pipeline's.
    pub fn fill_team(&mut self, team: &str) {
        if self.pipeline.team.is_empty() {
            team.clone_into(&mut self.pipeline.team);
        }
        for stage in &mut self.stages {
            stage.fill_team(&self.pipeline.team);
        }
    }

    /// Parses TOML, naming the field of a type error (`stages[1].budget.max_steps`).
    pub fn from_toml(text: &str) -> Result<PipelineSpec, SpecError> {
        let deserializer = toml::Deserializer::parse(text).map_err(|error| SpecError {
            field: String::new(),
            message: format!("not valid TOML: {}", error.message()),
        })?;
        serde_path_to_error::deserialize(deserializer).map_err(|error| {
            let field = crate::spec::clean_path(&error.path().to_string());
            let message = error.into_inner().message().to_owned();
            SpecError { field: crate::spec::with_missing_field(field, &message), message }
        })
    }

    /// Parses JSON, naming the field of a type error.
    pub fn from_json(text: &str) -> Result<PipelineSpec, SpecError> {
        let mut deserializer = serde_json::Deserializer::from_str(text);
        serde_path_to_error::deserialize(&mut deserializer).map_err(|error| {
            let field = crate::spec::clean_path(&error.path().to_string());
            let inner = error.into_inner();
            let message = if inner.is_syntax() || inner.is_eof() {
                format!("not valid JSON: {inner}")
            } else {
                crate::spec::strip_position(&inner.to_string())
            };
            SpecError { field: crate::spec::with_missing_field(field, &message), message }
        })
    }

    /// Everything a pipeline can say about itself: its name and team, the number of stages,
    /// each stage's own checks ([`JobSpec::validate`]) under `stages[i].`, every stage of the
    /// pipeline's team, and each [`PREVIOUS`] taking the kind of output the stage before gives.
    pub fn validate(&self) -> Result<(), SpecErrors> {
        let mut errors = Vec::new();
        let mut refuse = |field: String, message: String| errors.push(SpecError { field, message });
        let name = &self.pipeline.name;
        let name_ok = !name.is_empty()
            && name.len() <= MAX_NAME_CHARS
            && name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
        if !name_ok {
            refuse(
                "pipeline.name".into(),
                format!("expected 1–{MAX_NAME_CHARS} of [A-Za-z0-9._-], got {name:?}"),
            );
        }
        if !crate::names::valid_team_name(&self.pipeline.team) {
            refuse("pipeline.team".into(), format!("expected {}", crate::names::TEAM_RULE));
        }
        if self.stages.is_empty() || self.stages.len() > MAX_STAGES {
            refuse("stages".into(), format!("expected 1 to {MAX_STAGES} stages, got {}", self.stages.len()));
        }
        for (i, stage) in self.stages.iter().enumerate().take(MAX_STAGES) {
            let at = |field: &str| format!("stages[{i}].{field}");
            if stage.job.team != self.pipeline.team {
                refuse(
                    at("job.team"),
                    format!(
                        "expected the pipeline's team {:?}, got {:?}",
                        self.pipeline.team, stage.job.team
                    ),
                );
            }
            // The stage's own checks see a stand-in where it takes the previous output, so a
            // `previous` is judged here once, not as a malformed reference.
            let checked =
                fill(&fill(stage, OutputKind::Checkpoint, "builtin:tiny-arith"), OutputKind::Dataset, "x");
            if let Err(SpecErrors(stage_errors)) = checked.validate() {
                for error in stage_errors {
                    refuse(at(&error.field), error.message);
                }
            }
            let given = (i > 0).then(|| output_kind(&self.stages[i - 1]));
            for (field, wanted) in inputs(stage) {
                match given {
                    None => refuse(
                        at(field),
                        format!("the first stage has no previous stage to take {wanted} from"),
                    ),
                    Some(given) if given != wanted => {
                        refuse(at(field), format!("takes {wanted}, but stages[{}] gives {given}", i - 1))
                    }
                    Some(_) => {}
                }
            }
        }
        if errors.is_empty() { Ok(()) } else { Err(SpecErrors(errors)) }
    }
}

/// Where a pipeline is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "lowercase")]
pub enum PipelineState {
    /// A stage is submitted or running (or about to be).
    Running,
    /// Every stage's output passed its gates.
    Succeeded,
    /// A stage was refused at submit, failed, or its candidate was refused by its gates;
    /// `reason` says which and why.
    Failed,
    /// Cancelled by its team or an admin; the running stage was cancelled with it.
    Cancelled,
}

impl PipelineState {
    /// Every state.
    pub const ALL: [PipelineState; 4] =
        [PipelineState::Running, PipelineState::Succeeded, PipelineState::Failed, PipelineState::Cancelled];

    /// The name on the wire and in Redis.
    pub fn as_str(self) -> &'static str {
        match self {
            PipelineState::Running => "running",
            PipelineState::Succeeded => "succeeded",
            PipelineState::Failed => "failed",
            PipelineState::Cancelled => "cancelled",
        }
    }

    /// An end: nothing happens to the pipeline any more.
    pub fn is_terminal(self) -> bool {
        self != PipelineState::Running
    }
}

impl fmt::Display for PipelineState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for PipelineState {
    type Err = String;
    fn from_str(text: &str) -> Result<Self, String> {
        PipelineState::ALL.into_iter().find(|state| state.as_str() == text).ok_or_else(|| {
            format!(
                "expected one of {}, got {text:?}",
                PipelineState::ALL.map(PipelineState::as_str).join(", ")
            )
        })
    }
}

/// One stage of a pipeline as the API shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct StageView {
    /// Its place, from 0.
    pub index: u32,
    /// Its `job.name`.
    pub name: String,
    /// Its job, once submitted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job: Option<String>,
    /// Its job's state, when the daemon answering could read it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job_state: Option<JobState>,
    /// What it handed on, once it succeeded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output: Option<StageOutput>,
}

/// A pipeline as the API shows it (`GET /v1/pipelines/{id}`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct PipelineView {
    pub id: String,
    pub team: String,
    pub name: String,
    pub state: PipelineState,
    /// The stage it is at (the number of stages once it has succeeded).
    pub stage: u32,
    /// Why it is in this state (empty when nothing needs saying).
    pub reason: String,
    /// A cancel was asked for and the running stage is being stopped.
    pub cancel_requested: bool,
    /// RFC 3339.
    pub created_at: String,
    /// RFC 3339, the last change.
    pub updated_at: String,
    pub stages: Vec<StageView>,
}

/// One change of a pipeline, as stored on its event stream and sent over server-sent events.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct PipelineEvent {
    /// The stream entry id (`<ms>-<seq>`); pass it as `Last-Event-ID` to resume.
    pub id: String,
    /// RFC 3339.
    pub at: String,
    pub state: PipelineState,
    /// The stage it concerns.
    pub stage: u32,
    /// That stage's job, when it has one.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub job: String,
    pub reason: String,
}

/// `POST /v1/pipelines?dry_run=true` answer: every stage checked as the submit checks it,
/// queued nowhere.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct PipelineDryRun {
    /// The pipeline spec as it was read, with its defaults.
    pub spec: PipelineSpec,
}

/// `POST /v1/pipelines`' 200 answers: the pipeline an earlier submit with the same
/// `Idempotency-Key` made, or, with `dry_run=true`, the checked spec.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(untagged)]
pub enum PipelineSubmitAnswer {
    Submitted(crate::job::Submitted),
    DryRun(Box<PipelineDryRun>),
}

/// `GET /v1/pipelines` answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct PipelineList {
    /// Newest first.
    pub pipelines: Vec<PipelineView>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stage(name: &str, policy: &str, extra: &str) -> String {
        format!(
            "[[stages]]\n[stages.job]\nname = {name:?}\nteam = \"t\"\nmodel_line = \"l\"\n\
             [stages.model]\npolicy = {policy:?}\n{extra}[stages.data]\ntrain = \"dataset:d\"\n\
             [stages.optimizer]\nplugin = \"sft\"\n[stages.budget]\nmax_steps = 2\n"
        )
    }

    fn pipeline(stages: &[String]) -> String {
        format!("[pipeline]\nname = \"p\"\nteam = \"t\"\n{}", stages.concat())
    }

    /// Parses and validates `toml`: `Ok` or each problem as `field: message`.
    fn check(toml: &str, expected: &[&str]) {
        let problems: Vec<String> = match PipelineSpec::from_toml(toml) {
            Err(error) => vec![error.to_string()],
            Ok(spec) => match spec.validate() {
                Ok(()) => Vec::new(),
                Err(SpecErrors(errors)) => errors.iter().map(ToString::to_string).collect(),
            },
        };
        assert_eq!(problems, expected, "{toml}");
    }

    #[test]
    fn a_pipeline_or_stage_that_names_no_team_runs_for_the_submitting_tokens() {
        let sft = stage("sft", "builtin:tiny-arith", "");
        let named = sft.replace("team = \"t\"", "team = \"elsewhere\"");
        // (pipeline's team line, stages, the teams after filling in "mine")
        type Teams<'a> = (&'a str, Vec<&'a str>);
        let cases: [(&str, Vec<String>, Teams<'_>); 3] = [
            ("", vec![sft.replace("team = \"t\"\n", "")], ("mine", vec!["mine"])),
            ("team = \"t\"\n", vec![sft.replace("team = \"t\"\n", ""), sft.clone()], ("t", vec!["t", "t"])),
            // A stage naming another team is kept as written, for the check to refuse.
            ("", vec![named], ("mine", vec!["elsewhere"])),
        ];
        for (team_line, stages, (pipeline_team, stage_teams)) in cases {
            let toml = format!("[pipeline]\nname = \"p\"\n{team_line}{}", stages.concat());
            let mut spec = PipelineSpec::from_toml(&toml).unwrap();
            spec.fill_team("mine");
            let teams: Vec<&str> = spec.stages.iter().map(|stage| stage.job.team.as_str()).collect();
            assert_eq!((spec.pipeline.team.as_str(), teams), (pipeline_team, stage_teams), "{toml}");
        }
    }

    #[test]
    fn pipelines_are_checked_naming_each_field_as_written() {
        let sft = stage("sft", "builtin:tiny-arith", "");
        let grpo = stage("grpo", PREVIOUS, "reference = \"previous\"\n");
        check(&pipeline(&[sft.clone(), grpo.clone(), stage("sft2", PREVIOUS, "")]), &[]);
        check(
            &pipeline(std::slice::from_ref(&grpo)),
            &[
                "stages[0].model.policy: the first stage has no previous stage to take a checkpoint from",
                "stages[0].model.reference: the first stage has no previous stage to take a checkpoint from",
            ],
        );
        check(
            &pipeline(&[sft.clone(), sft.replace("train = \"dataset:d\"", "train = \"previous\"")]),
            &["stages[1].data.train: takes a dataset, but stages[0] gives a checkpoint"],
        );
        check(
            &pipeline(&[sft.clone(), grpo.replace("team = \"t\"", "team = \"u\"")]),
            &["stages[1].job.team: expected the pipeline's team \"t\", got \"u\""],
        );
        check(
            &pipeline(&[sft.clone(), grpo.replace("max_steps = 2", "max_steps = 99999999999")]),
            &["stages[1].budget.max_steps: expected 0 to 10000000, got 99999999999"],
        );
        // A rejection-sampling stage hands on a dataset, which a stage takes in data.train only.
        let sampling = stage("rs", "builtin:tiny-arith", "").replace(
            "plugin = \"sft\"\n",
            "plugin = \"rejection-sampling\"\noutput = \"rows\"\n[[stages.verifiers]]\nplugin = \"math\"\n",
        );
        let on_rows = sft.replace("train = \"dataset:d\"", "train = \"previous\"");
        check(&pipeline(&[sampling.clone(), on_rows.clone()]), &[]);
        check(
            &pipeline(&[sampling.clone(), stage("x", PREVIOUS, "")]),
            &["stages[1].model.policy: takes a checkpoint, but stages[0] gives a dataset"],
        );
        check(&pipeline(&[]), &["stages: missing field `stages`"]);
        check(
            &pipeline(std::slice::from_ref(&sft)).replace("name = \"p\"", "name = \"a b\""),
            &["pipeline.name: expected 1–128 of [A-Za-z0-9._-], got \"a b\""],
        );
        check(
            &pipeline(&[sft.clone(), grpo.replace("max_steps = 2", "max_steps = \"2\"")]),
            &["stages[1].budget.max_steps: invalid type: string \"2\", expected u64"],
        );
        check(&pipeline(&vec![sft.clone(); MAX_STAGES + 1]), &["stages: expected 1 to 16 stages, got 17"]);
    }

    #[test]
    fn a_stage_takes_the_previous_output_in_the_fields_that_say_previous() {
        let text = pipeline(&[
            stage("a", "builtin:tiny-arith", ""),
            stage("b", PREVIOUS, "reference = \"previous\"\n"),
        ]);
        let spec = PipelineSpec::from_toml(&text).unwrap();
        let output = StageOutput::Checkpoint { line: "l".into(), version: 3 };
        let bound = bind(&spec.stages[1], &output).unwrap();
        assert_eq!((bound.model.policy.as_str(), bound.model.reference.as_str()), ("line:l@3", "line:l@3"));
        assert_eq!(bound.data.train.as_os_str(), "dataset:d", "only the fields written previous change");
        let unchanged = bind(&spec.stages[0], &output).unwrap();
        assert_eq!(unchanged, spec.stages[0]);
        let dataset = StageOutput::Dataset { name: "rs".into(), sha256: "ab".repeat(32) };
        let error = bind(&spec.stages[1], &dataset).unwrap_err();
        assert_eq!(
            error.to_string(),
            "model.policy: takes a checkpoint, but the previous stage gave a dataset"
        );
        // The output's wire form names its kind.
        assert_eq!(
            serde_json::to_string(&output).unwrap(),
            r#"{"kind":"checkpoint","line":"l","version":3}"#
        );
    }
}
