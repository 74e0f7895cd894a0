//! A spec's names, resolved inside its team's namespace: at submit ([`admit`]: checked and
//! pinned, what the job record keeps) and when its worker starts ([`worker_spec`]: the spec the
//! worker reads, with the server's paths in place of the names).
//!
//! Messages name the field as the spec writes it and never show a server path: a team learns
//! whether a name is available to it, nothing about the host.
//!
//! A distill job's `optimizer.teacher` is resolved as `model.policy` is, and its tokenizer
//! compared with the student's (`same_tokenizer`).

use std::fs;
use std::path::{Path, PathBuf};

use rlvr_protocol::kind::JobKind;
use rlvr_protocol::names::{CurriculumRef, DataRef, ModelRef, PinnedSpec, ServerSpec};
use rlvr_protocol::reward_model::is_reward_model;
use rlvr_protocol::spec::{JobSpec, SpecError};
use serde_json::Value;

use super::datasets::DatasetError;
use super::lines::LineError;
use super::{Tenancy, refuse};

/// A spec's field that names data: resolved in the team's namespace, pinned at submit, made a
/// server path for the worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum DataField {
    Train,
    Heldout,
    Canaries,
}

impl DataField {
    /// The field as the spec writes it.
    fn name(self) -> &'static str {
        match self {
            DataField::Train => "data.train",
            DataField::Heldout => "data.heldout",
            DataField::Canaries => "data.canaries",
        }
    }

    /// Its value in `spec`, if the spec has it.
    fn slot(self, spec: &mut JobSpec) -> Option<&mut PathBuf> {
        match self {
            DataField::Train => Some(&mut spec.data.train),
            DataField::Heldout => spec.data.heldout.as_mut(),
            DataField::Canaries => spec.data.canaries.as_mut(),
        }
    }
}

/// The data fields of a spec, with their values.
fn data_fields(spec: &JobSpec) -> Vec<(DataField, &Path)> {
    let mut fields = vec![(DataField::Train, spec.data.train.as_path())];
    fields.extend(spec.data.heldout.as_deref().map(|path| (DataField::Heldout, path)));
    fields.extend(spec.data.canaries.as_deref().map(|path| (DataField::Canaries, path)));
    fields
}

/// The dataset contents `spec` pins (`dataset:NAME@SHA256` in its data fields): what a job, a
/// pipeline stage or a published version of it keeps from the sweep.
pub fn pinned_datasets(spec: &JobSpec) -> Vec<String> {
    data_fields(spec)
        .into_iter()
        .filter_map(|(_, value)| match DataRef::parse(value.to_str()?).ok()? {
            DataRef::Dataset { sha256, .. } => sha256,
            DataRef::Root { .. } => None,
        })
        .collect()
}

/// A spec's field that names a model: resolved by the same rules wherever it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum ModelField {
    Policy,
    Reference,
    /// A distillation job's `optimizer.teacher`.
    Teacher,
    /// The `model` of the reward-model grader `verifiers[i]`.
    RewardModel(usize),
}

impl ModelField {
    /// The field as the spec writes it.
    fn name(self) -> String {
        match self {
            ModelField::Policy => "model.policy".to_owned(),
            ModelField::Reference => "model.reference".to_owned(),
            ModelField::Teacher => "optimizer.teacher".to_owned(),
            ModelField::RewardModel(i) => format!("verifiers[{i}].model"),
        }
    }

    /// Writes `value` into this field of `spec`.
    fn set(self, spec: &mut JobSpec, value: String) {
        match self {
            ModelField::Policy => spec.model.policy = value,
            ModelField::Reference => spec.model.reference = value,
            ModelField::Teacher => {
                spec.optimizer.options.insert("teacher".into(), Value::String(value));
            }
            ModelField::RewardModel(i) => {
                if let Some(section) = spec.verifiers.get_mut(i) {
                    section.options.insert("model".into(), Value::String(value));
                }
            }
        }
    }
}

/// The fields of a spec that name a model, with their values: the policy, the reference, a
/// distillation job's teacher, and each reward-model grader's `model`.
fn model_fields(spec: &JobSpec) -> Vec<(ModelField, String)> {
    let mut fields = vec![(ModelField::Policy, spec.model.policy.clone())];
    if spec.model.reference != "same" {
        fields.push((ModelField::Reference, spec.model.reference.clone()));
    }
    // A distillation job's teacher (a bad or missing key is `checks`' to refuse).
    if JobKind::of(spec, None) == Some(JobKind::Distill)
        && let Some(Value::String(teacher)) = spec.optimizer.options.get("teacher")
    {
        fields.push((ModelField::Teacher, teacher.clone()));
    }
    for (i, section) in spec.verifiers.iter().enumerate() {
        // A missing or non-string `model` is `checks`' to refuse.
        if is_reward_model(section)
            && let Some(Value::String(model)) = section.options.get("model")
        {
            fields.push((ModelField::RewardModel(i), model.clone()));
        }
    }
    fields
}

/// Why [`admit`] refused a spec: every problem, each naming its field, and whether one of them
/// is a permission the team lacks (a priority not granted to it, a model line it may not publish
/// into) rather than a spec that cannot run.
#[derive(Debug, Default)]
pub struct NotAdmitted {
    pub problems: Vec<SpecError>,
    pub forbidden: bool,
}

/// Checks what `spec` names against its team's namespace and returns it pinned: every
/// `dataset:NAME` with its content's sha256, every `line:L` with its newest version. The model
/// line is claimed for the team when nobody owns it yet (not on a dry run).
pub fn admit(tenancy: &Tenancy, spec: &JobSpec, dry_run: bool) -> Result<PinnedSpec, NotAdmitted> {
    let team = spec.job.team.as_str();
    let mut pinned = spec.clone();
    let mut problems = Vec::new();
    let mut forbidden = false;

    // A team's name is a directory of its namespace: only an admin submits for another team,
    // and even an admin's must be a team name.
    if !rlvr_protocol::names::valid_team_name(team) {
        problems.push(refuse("job.team", format!("expected {}", rlvr_protocol::names::TEAM_RULE)));
    }
    let allowance = tenancy.allowance(team);
    if !allowance.priorities.contains(&spec.job.priority) {
        forbidden = true;
        let allowed: Vec<String> =
            allowance.priorities.iter().map(|p| format!("{p:?}").to_lowercase()).collect();
        problems.push(refuse(
            "job.priority",
            format!("team {team} may use priorities {}; the operator grants others", allowed.join(", ")),
        ));
    }

    for (field, value) in data_fields(spec) {
        match data_file(tenancy, team, value) {
            Ok((reference, _)) => {
                if let Some(slot) = field.slot(&mut pinned) {
                    *slot = PathBuf::from(reference.to_string());
                }
            }
            Err(message) => problems.push(refuse(field.name(), message)),
        }
    }

    let mut dirs = std::collections::BTreeMap::new();
    for (field, value) in model_fields(spec) {
        match model_dir(tenancy, team, &value) {
            Ok((ModelRef::Builtin(_), _)) if matches!(field, ModelField::RewardModel(_)) => {
                problems.push(refuse(&field.name(), BUILTIN_IS_NO_REWARD_MODEL))
            }
            Ok((reference, dir)) => {
                field.set(&mut pinned, reference.to_string());
                dirs.insert(field, Tokens::of(&reference, dir));
            }
            Err(message) => problems.push(refuse(&field.name(), message)),
        }
    }
    // A teacher's distributions are over its own tokens: the student must read the same ones.
    if let (Some(student), Some(teacher)) = (dirs.get(&ModelField::Policy), dirs.get(&ModelField::Teacher))
        && let Err(message) = same_tokenizer(student, teacher)
    {
        problems.push(refuse(&ModelField::Teacher.name(), message));
    }

    if let Some(name) = spec.curriculum.as_ref().and_then(|curriculum| curriculum.name.as_deref()) {
        // Its syntax is check_runnable's to refuse.
        if let Ok(reference) = CurriculumRef::parse(name)
            && let Err(message) = tenancy.curricula.dir_for(team, &reference)
        {
            problems.push(refuse("curriculum.name", message));
        }
    }

    // The line is claimed for the team only by a job that is taken: a refused submit leaves
    // nothing behind.
    // Any answer about the line but the registry failing is one of permission: it is another
    // team's, or nobody's until an admin says, or the team has made its quota of lines.
    let mut line_problem = |error: LineError| match error {
        LineError::Io(error) => {
            tracing::error!(%error, "cannot read the registry");
            refuse("job.model_line", "the registry cannot be read now; retry later")
        }
        error => {
            forbidden = true;
            refuse("job.model_line", error.to_string())
        }
    };
    match tenancy.lines.publisher(team, &spec.job.model_line, false) {
        Ok(policy) => problems.extend(spec.gates.loosened_against(&policy)),
        Err(error) => problems.push(line_problem(error)),
    }
    if problems.is_empty() && !dry_run {
        match tenancy.lines.publisher(team, &spec.job.model_line, true) {
            // Another team's job took the name a moment ago.
            Err(error) => problems.push(line_problem(error)),
            Ok(policy) => problems.extend(spec.gates.loosened_against(&policy)),
        }
    }

    if problems.is_empty() {
        Ok(PinnedSpec::admitted(pinned))
    } else {
        Err(NotAdmitted { problems, forbidden })
    }
}

/// The spec `spec`'s worker reads: its names replaced by the server's paths. Fails (the job's
/// fault) when something it names went away since submit or is no longer granted.
pub fn worker_spec(tenancy: &Tenancy, spec: &JobSpec) -> Result<ServerSpec, String> {
    let team = spec.job.team.as_str();
    let mut resolved = spec.clone();
    for (field, value) in data_fields(spec) {
        let (_, path) =
            data_file(tenancy, team, value).map_err(|message| format!("{}: {message}", field.name()))?;
        if let Some(slot) = field.slot(&mut resolved) {
            *slot = path;
        }
    }
    for (field, value) in model_fields(spec) {
        let (_, dir) =
            model_dir(tenancy, team, &value).map_err(|message| format!("{}: {message}", field.name()))?;
        if let Some(dir) = dir {
            field.set(&mut resolved, dir.display().to_string());
        }
    }
    Ok(ServerSpec::resolved(resolved))
}

/// One of a spec's data files, as submit reads its records.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DataFile {
    /// `data.train`, …
    pub field: &'static str,
    /// What a team is shown for it: `dataset NAME` or `root:ROOT/PATH`, never a server path.
    pub shown: String,
    /// A dataset's content (which never changes under its SHA-256); `None` for a data root's
    /// file, which may.
    pub sha256: Option<String>,
    /// The file.
    pub path: PathBuf,
}

/// The files the spec's data fields name, for the fields that resolve (one that does not is
/// [`admit`]'s to refuse, with its field).
pub fn data_files(tenancy: &Tenancy, spec: &JobSpec) -> Vec<DataFile> {
    data_fields(spec)
        .into_iter()
        .filter_map(|(field, value)| {
            let (reference, path) = data_file(tenancy, &spec.job.team, value).ok()?;
            let (shown, sha256) = match reference {
                DataRef::Dataset { name, sha256 } => (format!("dataset {name}"), sha256),
                DataRef::Root { root, path } => (format!("root:{root}/{path}"), None),
            };
            Some(DataFile { field: field.name(), shown, sha256, path })
        })
        .collect()
}

/// A data field's reference, pinned, and the file it names.
fn data_file(tenancy: &Tenancy, team: &str, value: &Path) -> Result<(DataRef, PathBuf), String> {
    let text = value.to_str().ok_or("expected UTF-8 text")?;
    let reference = DataRef::parse(text)?;
    match reference {
        DataRef::Dataset { name, sha256 } => {
            let (sha256, path) =
                tenancy.datasets.resolve(team, &name, sha256.as_deref()).map_err(|error| match error {
                    DatasetError::NotFound { .. } | DatasetError::Gone { .. } => {
                        format!("{error}; upload it with PUT /v1/datasets/{name} (rlvrctl dataset put)")
                    }
                    // The server's disk, not the team's dataset (full, read-only): no upload helps.
                    other => format!("{other}; retry once the server's operator has fixed it"),
                })?;
            Ok((DataRef::Dataset { name, sha256: Some(sha256) }, path))
        }
        DataRef::Root { root, path } => {
            let dir = tenancy.data_root(team, &root)?;
            let file = file_in_root(dir, &path, tenancy.datasets.max_bytes())
                .map_err(|why| format!("root:{root}/{path}: {why}"))?;
            Ok((DataRef::Root { root, path }, file))
        }
    }
}

/// `relative` inside `root`, after following every symbolic link: a regular file no larger than
/// `max_bytes`. The reasons never show the root's path.
fn file_in_root(root: &Path, relative: &str, max_bytes: u64) -> Result<PathBuf, String> {
    let root = root.canonicalize().map_err(|_| "the data root is not available now".to_owned())?;
    let file = root.join(relative).canonicalize().map_err(|_| "no such file in the data root".to_owned())?;
    if !file.starts_with(&root) {
        return Err("leads outside the data root".into());
    }
    let meta = fs::metadata(&file).map_err(|_| "no such file in the data root".to_owned())?;
    if !meta.is_file() {
        return Err("not a file".into());
    }
    if meta.len() > max_bytes {
        return Err(format!("over {max_bytes} bytes (tenancy.max_dataset_bytes)"));
    }
    Ok(file)
}

/// Where a model's tokens are known from: a built-in model's vocabulary size (every built-in
/// model has the character tokenizer, padded to its vocabulary), or the model's directory.
enum Tokens {
    Builtin(u64),
    Dir(Option<PathBuf>),
}

impl Tokens {
    fn of(reference: &ModelRef, dir: Option<PathBuf>) -> Tokens {
        match reference {
            ModelRef::Builtin(source) => Tokens::Builtin(
                rlvr_protocol::builtin_models::BuiltinSource::parse(source)
                    .map_or(0, |source| source.shape().vocab),
            ),
            _ => Tokens::Dir(dir),
        }
    }
}

/// Whether two models read the same tokens: equal `tokenizer.json` vocabularies (`model`,
/// `added_tokens`) for two directories; two built-in models' vocabulary sizes; against a
/// built-in model's character tokenizer, the directory's `vocab_size` (the worker compares the
/// token maps themselves when it loads both). The message never shows a path.
fn same_tokenizer(student: &Tokens, teacher: &Tokens) -> Result<(), String> {
    fn vocabulary(dir: &Path) -> Result<(Value, Value), String> {
        let text = fs::read_to_string(dir.join("tokenizer.json"))
            .map_err(|_| "a model has no readable tokenizer.json to compare".to_owned())?;
        let mut json: Value =
            serde_json::from_str(&text).map_err(|_| "a model's tokenizer.json is not JSON".to_owned())?;
        Ok((json["model"].take(), json["added_tokens"].take()))
    }
    fn vocab_size(dir: &Path) -> Option<u64> {
        let text = fs::read_to_string(dir.join("config.json")).ok()?;
        serde_json::from_str::<Value>(&text).ok()?["vocab_size"].as_u64()
    }
    let differs = "the teacher's tokenizer differs from model.policy's: distillation compares their \
                   distributions token by token, so they must share one";
    match (student, teacher) {
        (Tokens::Builtin(a), Tokens::Builtin(b)) if a == b => Ok(()),
        (Tokens::Builtin(a), Tokens::Builtin(b)) => Err(format!("{differs} ({b} tokens against {a})")),
        (Tokens::Dir(Some(dir)), Tokens::Builtin(builtin))
        | (Tokens::Builtin(builtin), Tokens::Dir(Some(dir))) => match vocab_size(dir) {
            Some(size) if size == *builtin => Ok(()),
            Some(size) => Err(format!("{differs} ({size} tokens against the built-in model's {builtin})")),
            None => Err(format!("{differs} (a model's config.json has no vocab_size)")),
        },
        (Tokens::Dir(Some(a)), Tokens::Dir(Some(b))) => {
            if vocabulary(a)? == vocabulary(b)? {
                Ok(())
            } else {
                Err(differs.to_owned())
            }
        }
        // A reference with no directory of its own is checked where it is loaded.
        (Tokens::Dir(None), _) | (_, Tokens::Dir(None)) => Ok(()),
    }
}

const BUILTIN_IS_NO_REWARD_MODEL: &str = "the built-in model is a language model, not a reward model: name a \
     base model or a model line's version in sequence-classification format";

/// A reward-model grader's `model` as `team`'s job would pin it (`line:rm@3`), by the rules of a
/// submit: what `POST /v1/graders/validate` shows.
pub fn reward_model(tenancy: &Tenancy, team: &str, value: &str) -> Result<String, String> {
    match model_dir(tenancy, team, value)? {
        (ModelRef::Builtin(_), _) => Err(BUILTIN_IS_NO_REWARD_MODEL.to_owned()),
        (reference, _) => Ok(reference.to_string()),
    }
}

/// A model field's reference, pinned, and its directory (none for the built-in model).
fn model_dir(tenancy: &Tenancy, team: &str, value: &str) -> Result<(ModelRef, Option<PathBuf>), String> {
    let reference = ModelRef::parse(value)?;
    match reference {
        ModelRef::Builtin(_) => Ok((reference, None)),
        ModelRef::Base(ref name) => {
            let dir = tenancy.base_model(team, name)?.to_owned();
            has_config(&dir)?;
            Ok((reference, Some(dir)))
        }
        ModelRef::Line { line, version } => {
            let (version, dir) =
                tenancy.lines.version(team, &line, version).map_err(|error| match error {
                    LineError::Io(error) => {
                        tracing::error!(%error, "cannot read the registry");
                        "the registry cannot be read now; retry later".to_owned()
                    }
                    error => error.to_string(),
                })?;
            has_config(&dir)?;
            Ok((ModelRef::Line { line, version: Some(version) }, Some(dir)))
        }
        ModelRef::Tinker(ref path) => {
            // The adapter (a PEFT directory naming the base its client trained on).
            let state = path.dir(&tenancy.tinker_root, team);
            let dir = state.join("adapter");
            if !dir.join("adapter_config.json").is_file() {
                return Err(format!("no saved state {path} of team {team}"));
            }
            // Its base must still be one the team may use.
            let base = fs::read_to_string(state.join(rlvr_protocol::tinker::process::SDK_BASE_FILE))
                .map_err(|_| format!("the saved state {path} does not name its base model"))?;
            let base = base.trim();
            if !base.starts_with("builtin:") {
                tenancy.base_model(team, base)?;
            }
            Ok((reference, Some(dir)))
        }
    }
}

fn has_config(dir: &Path) -> Result<(), String> {
    if dir.join("config.json").is_file() {
        Ok(())
    } else {
        Err("the model has no config.json; ask the operator (base models) or the line's owner".into())
    }
}
