//! What `POST /v1/jobs` checks beyond the spec itself, so a job that cannot run is refused at
//! submit, not at 3 a.m.: the plugins it names are loaded and of the right kind, their options
//! are what they accept (each plugin's `check_options`, its keys named as the spec writes them:
//! `verifiers[1].fallbak`), the URLs those options, its webhook and its MLflow server name are
//! destinations the operator's `[outbound]` policy allows, they fit each other and the data (the
//! rules the worker applies at start, `rlvr_plugin_host::fit`), its budget is sane, and its
//! `[resources]` fit this daemon's devices, and every record of its data files is one the job can
//! read ([`data_problems`]). A runnable job's [`PluginRefs`] say which secrets its
//! options and its `[tracking]` name. What its names reach (datasets, models, the model line,
//! secrets) is `tenancy`'s.
//!
//! Options are judged where the plugin lives: verifiers' and curricula's in the daemon, an
//! optimizer's in `rlvr-worker check-options`, its answers cached. Each refusal is at the key as the
//! spec writes it.

use rlvr_plugin_api::PluginKind;
use rlvr_plugin_host::options::{OptionsProblem, spec_field};
use rlvr_plugin_host::{LoadedPlugin, Registry};
use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use rlvr_protocol::builtin::{
    DistillOptions, RejectionSamplingOptions, distill_problems, rejection_sampling_problems,
};
use rlvr_protocol::builtin_models;
use rlvr_protocol::kind::{JobKind, OptimizerTraits};
use rlvr_protocol::records::{self, RecordKind};
use rlvr_protocol::reward_model::{RewardModelOptions, is_reward_model};
use rlvr_protocol::spec::{JobSpec, OptimizerSection, PluginSection, SpecError};

use rlvr_plugin_host::fit::{fit_problems, optimizer_needs, trained_model};

use crate::sched::service::Scheduler;
use crate::tenancy::Tenancy;
use crate::tenancy::resolve::data_files;

/// Longest wall-clock budget a job may ask for: 30 days.
const MAX_WALL_MINUTES: f64 = 30.0 * 24.0 * 60.0;

/// What a runnable job's plugin options refer to, each with the spec's field that names it: the
/// secrets to check against the team's grants and the URLs against the operator's outbound
/// allow-list. Complete only for the plugins that checked their options: a section in
/// `unchecked` (a plugin built before `check_options`, or one that could not be asked) may name
/// more, which only show when a worker creates the plugin.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PluginRefs {
    /// `(field, secret name)`, e.g. `("verifiers[0].bearer_token_secret", "grader-token")`.
    pub secrets: Vec<(String, String)>,
    /// `(field, url)`, e.g. `("verifiers[0].url", "https://grader.example/v1")`.
    pub urls: Vec<(String, String)>,
    /// Sections whose options were not checked at submit (`verifiers[2]`, `optimizer`).
    pub unchecked: Vec<String>,
    /// `(field, sha256)` of content the options carry, e.g. `("verifiers[0].source", "ab…")`.
    pub digests: Vec<(String, String)>,
}

/// Every problem found, each naming its field; or, for a job that can run, what its plugins'
/// options refer to. Blocks while a worker process checks the optimizer's options (once per
/// plugin build and options: the answers are cached): call it off the async threads.
pub fn check_runnable(
    spec: &JobSpec,
    registry: &Registry,
    scheduler: &Scheduler,
    outbound: &rlvr_outbound::Policy,
) -> Result<PluginRefs, Vec<SpecError>> {
    let mut problems = Vec::new();
    let mut refs = PluginRefs::default();
    let mut problem =
        |field: &str, message: String| problems.push(SpecError { field: field.to_owned(), message });
    // Whose turn it is at the options checks run in worker processes (`plugin_host::fair`).
    let team = spec.job.team.as_str();

    // Plugins: loaded, and of the right kind; a built-in optimizer is no library (its keys and
    // what it needs of the spec are checked here).
    // A built-in's kind is the spec's alone (`None` here: an optimizer plugin's, asked below).
    let builtin =
        JobKind::of(spec, None).filter(|kind| matches!(kind, JobKind::RejectionSampling | JobKind::Distill));
    if builtin == Some(JobKind::RejectionSampling) {
        if let Err(error) = RejectionSamplingOptions::from_spec(spec) {
            problem(&error.field, error.message);
        }
        for error in rejection_sampling_problems(spec) {
            problem(&error.field, error.message);
        }
    }
    if builtin == Some(JobKind::Distill) {
        match DistillOptions::from_spec(spec) {
            // The teacher's name is resolved, and its tokenizer compared, in `tenancy::resolve`.
            Ok(options) => builtin_model(&mut problem, "optimizer.teacher", &options.teacher),
            Err(error) => problem(&error.field, error.message),
        }
        for error in distill_problems(spec) {
            problem(&error.field, error.message);
        }
    }
    // An engine job: what its engine cannot run as written (`protocol::engine`'s mapping).
    for error in rlvr_protocol::engine::engine_problems(spec) {
        problem(&error.field, error.message);
    }
    let optimizer = match find(registry, &spec.optimizer.plugin, PluginKind::Optimizer) {
        _ if builtin.is_some() => None,
        Ok(plugin) => {
            let options = spec.optimizer_plugin_config();
            check_options(registry, team, &plugin, "optimizer", &options, &mut refs, &mut problem);
            Some(plugin)
        }
        Err(message) => {
            problem("optimizer.plugin", message);
            None
        }
    };
    check_graders(registry, team, &spec.verifiers, "verifiers", &mut refs, &mut problem);
    if let Some(curriculum) = &spec.curriculum {
        match find(registry, &curriculum.plugin, PluginKind::Curriculum) {
            Ok(plugin) => check_options(
                registry,
                team,
                &plugin,
                "curriculum",
                &curriculum.plugin_config(),
                &mut refs,
                &mut problem,
            ),
            Err(message) => problem("curriculum.plugin", message),
        }
    }
    if let Some(name) = spec.curriculum.as_ref().and_then(|c| c.name.as_deref())
        && let Err(message) = rlvr_protocol::names::CurriculumRef::parse(name)
    {
        problem("curriculum.name", format!("{message}, got {name:?}"));
    }

    // The optimizer's needs against the rest of the spec: the worker's own rules.
    if let Some(optimizer) = &optimizer {
        match optimizer_needs(&optimizer.meta) {
            None => problem(
                "optimizer.plugin",
                format!("{} reports no data mode this daemon knows", optimizer.id()),
            ),
            Some(info) => {
                let trains = trained_model(&optimizer.meta);
                for (field, message) in fit_problems(spec, &info, trains, &optimizer.id()) {
                    problem(&field, message);
                }
            }
        }
    }

    // The built-in model's name; the data and the other models are the team's names, which
    // `tenancy::resolve` checks.
    builtin_model(&mut problem, "model.policy", &spec.model.policy);
    builtin_model(&mut problem, "model.reference", &spec.model.reference);

    // The webhook and the URLs the plugins' options name: checked again, with DNS, when each is
    // called (the worker gets the same policy).
    let webhook = spec.publish.as_ref().and_then(|publish| publish.webhook.as_deref());
    let urls = webhook.map(|url| ("publish.webhook", url)).into_iter();
    // The MLflow server the daemon logs the job to: a url a tenant wrote, as the webhook's.
    let tracking =
        spec.tracking.as_ref().map(|tracking| ("tracking.mlflow_uri", tracking.mlflow_uri.as_str()));
    let urls = urls.chain(tracking);
    // The environment's server: the worker's sessions go through the same policy.
    let urls = urls.chain(spec.env.as_ref().and_then(|env| env.url.as_deref()).map(|url| ("env.url", url)));
    let urls = urls.chain(refs.urls.iter().map(|(field, url)| (field.as_str(), url.as_str())));
    refuse_urls(outbound, urls, &mut problem);
    // Its token, one of the team's secrets: granted or refused with the plugins' secrets.
    if let Some(name) = spec.tracking.as_ref().and_then(|tracking| tracking.token_secret.as_ref()) {
        refs.secrets.push(("tracking.token_secret".to_owned(), name.clone()));
    }

    // Budgets and resources within what a daemon can honour.
    if let Some(minutes) = spec.budget.max_wall_minutes
        && minutes > MAX_WALL_MINUTES
    {
        problem(
            "budget.max_wall_minutes",
            format!("expected at most {MAX_WALL_MINUTES} (30 days), got {minutes}"),
        );
    }
    let demand = scheduler.demand("submitted", spec, std::time::Duration::ZERO);
    if let Err(why) = scheduler.can_ever_fit(&demand) {
        problem(why.field, why.message);
    }
    if problems.is_empty() { Ok(refs) } else { Err(problems) }
}

/// A loaded plugin of `kind` by `name` or `name@version`; else why not, with what is loaded.
fn find(registry: &Registry, name: &str, kind: PluginKind) -> Result<Arc<LoadedPlugin>, String> {
    registry.find(name, Some(kind)).map_err(|error| {
        let known: Vec<String> = registry
            .plugins()
            .iter()
            .filter(|plugin| plugin.meta.kind == kind)
            .map(|plugin| plugin.id())
            .collect();
        format!(
            "{error}; loaded {} plugins: {}",
            kind.as_str(),
            if known.is_empty() { "none".into() } else { known.join(", ") }
        )
    })
}

/// The graders at `field` (`verifiers` in a job, `grader` or `reward.graders` in a dry-run):
/// each a loaded verifier whose options it accepts, or the built-in `reward-model` grader with
/// its keys checked (no registry lookup). Their secrets and URLs go into `refs`; the plugins
/// found, in order (`None` where a grader's plugin is not loaded, and for a reward model). `team`
/// asks (its turn at an options check run in a worker process).
pub fn check_graders(
    registry: &Registry,
    team: &str,
    graders: &[PluginSection],
    field: &str,
    refs: &mut PluginRefs,
    problem: &mut impl FnMut(&str, String),
) -> Vec<Option<Arc<LoadedPlugin>>> {
    graders
        .iter()
        .enumerate()
        .map(|(i, grader)| {
            let section = format!("{field}[{i}]");
            if is_reward_model(grader) {
                // Built in, not a library: its keys here, its `model` in `tenancy::resolve`.
                if let Err(error) = RewardModelOptions::from_section(grader, &format!("{section}.")) {
                    problem(&error.field, error.message);
                }
                return None;
            }
            match find(registry, &grader.plugin, PluginKind::Verifier) {
                Ok(plugin) => {
                    check_options(registry, team, &plugin, &section, &grader.plugin_config(), refs, problem);
                    Some(plugin)
                }
                Err(message) => {
                    problem(&format!("{section}.plugin"), message);
                    None
                }
            }
        })
        .collect()
}

/// Refuses each `(field, url)` the operator's outbound policy does not allow (checked again,
/// with DNS, when it is called).
pub fn refuse_urls<'a>(
    outbound: &rlvr_outbound::Policy,
    urls: impl IntoIterator<Item = (&'a str, &'a str)>,
    problem: &mut impl FnMut(&str, String),
) {
    for (field, url) in urls {
        if let Err(refusal) = outbound.check_url(url) {
            problem(field, refusal.to_string());
        }
    }
}

/// Asks `plugin` (at the spec's `section`) about `options`: a refusal is a problem at the key it
/// names, an acceptance adds what the options refer to. A plugin built before `check_options`
/// is checked when a worker creates it, as before; so is one that could not be asked (the
/// worker process failed), with a warning: its secrets are unknown, so none is granted for it.
fn check_options(
    registry: &Registry,
    team: &str,
    plugin: &LoadedPlugin,
    section: &str,
    options: &str,
    refs: &mut PluginRefs,
    problem: &mut impl FnMut(&str, String),
) {
    match registry.check_options(plugin, options, team) {
        Ok(Some(report)) => {
            let field = |key: &str| spec_field(section, key);
            refs.secrets.extend(report.secrets.into_iter().map(|secret| (field(&secret.key), secret.name)));
            refs.urls.extend(report.urls.into_iter().map(|url| (field(&url.key), url.url)));
            refs.digests.extend(report.digests.into_iter().map(|digest| (field(&digest.key), digest.sha256)));
            // regression: the code verifier's python, read_paths and work_root let a spec choose
            // the interpreter the worker runs and the directories it reads and writes
            for path in report.paths {
                problem(
                    &field(&path.key),
                    "a job spec cannot name a server path; under the daemon the plugin uses its \
                     defaults on the daemon's host"
                        .to_owned(),
                );
            }
        }
        Ok(None) => refs.unchecked.push(section.to_owned()),
        Err(OptionsProblem::Refused(error)) => {
            let mut message = error.message;
            if section == "optimizer" && message.starts_with("unknown key") {
                // The plugin lists its own keys; the trainer's share the table.
                message.push_str(&format!(
                    " (or one of the trainer's: {})",
                    OptimizerSection::TRAINER_KEYS.join(", ")
                ));
            }
            problem(&spec_field(section, &error.key), message);
        }
        Err(OptionsProblem::Failed { message }) => {
            problem(section, format!("{} failed checking its options: {message}", plugin.id()))
        }
        Err(OptionsProblem::Unavailable { message }) => {
            tracing::warn!(plugin = %plugin.id(), section, %message, "plugin options not checked at submit; the worker checks them");
            refs.unchecked.push(section.to_owned());
        }
    }
}

fn builtin_model(problem: &mut impl FnMut(&str, String), field: &str, source: &str) {
    if source.starts_with(builtin_models::PREFIX)
        && let Err(message) = builtin_models::BuiltinSource::parse(source)
    {
        problem(field, message);
    }
}

/// Dataset contents already read through as a kind, by SHA-256: a dataset's content never
/// changes under its hash, so a sweep of jobs over one dataset reads it once. In memory only (a
/// restarted daemon reads each once more), and forgotten wholesale past [`CheckedRecords::MAX`].
#[derive(Debug, Default)]
pub struct CheckedRecords(Mutex<HashSet<(String, RecordKind)>>);

impl CheckedRecords {
    /// Entries kept before the memo starts over.
    const MAX: usize = 10_000;

    fn contains(&self, key: &(String, RecordKind)) -> bool {
        self.0.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).contains(key)
    }

    fn insert(&self, key: (String, RecordKind)) {
        let mut seen = self.0.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if seen.len() >= Self::MAX {
            seen.clear();
        }
        seen.insert(key);
    }
}

/// Every record of the job's data files, read as its worker will read them
/// (`rlvr_protocol::records`, by the optimizer's data mode and the model it trains): a file the
/// job cannot use — records without `prompt`, pairs given to an SFT job — is refused at submit
/// with its field, the line and the key, rather than failing the job when it starts. A file is
/// shown by the name the spec gave it, never by its path on the server; the `skipped` fields are
/// not read. Blocks while it reads (a line at a time): call it off the async threads.
pub fn data_problems(
    spec: &JobSpec,
    registry: &Registry,
    tenancy: &Tenancy,
    checked: &CheckedRecords,
    skipped: &[&str],
) -> Vec<SpecError> {
    let Some((train, heldout)) = record_kinds(spec, registry) else {
        // An optimizer that is not loaded: `check_runnable` names it.
        return Vec::new();
    };
    let mut problems = Vec::new();
    for file in data_files(tenancy, spec).into_iter().filter(|file| !skipped.contains(&file.field)) {
        let kind = match file.field {
            "data.train" => train,
            "data.heldout" => heldout,
            _ => RecordKind::Prompts,
        };
        let key = file.sha256.clone().map(|sha256| (sha256, kind));
        if key.as_ref().is_some_and(|key| checked.contains(key)) {
            continue;
        }
        match records::check(kind, file.field, &file.path) {
            Ok(_) => key.into_iter().for_each(|key| checked.insert(key)),
            Err(error) => problems.push(SpecError {
                field: error.field().to_owned(),
                message: format!("{}; this job reads {}", error.message_for(&file.shown), kind.expected()),
            }),
        }
    }
    problems
}

/// What the job's `data.train` and `data.heldout` hold: the built-in jobs sample prompts; a
/// plugin's by its data mode and the model it trains. `None` when the optimizer is not loaded.
fn record_kinds(spec: &JobSpec, registry: &Registry) -> Option<(RecordKind, RecordKind)> {
    if let Some(JobKind::RejectionSampling | JobKind::Distill) = JobKind::of(spec, None) {
        return Some((RecordKind::Prompts, RecordKind::Prompts));
    }
    // An engine job's data is its optimizer's, as a native job's.
    let traits = optimizer_traits(spec, registry)?;
    Some((RecordKind::of_train(traits.data_mode), RecordKind::of_heldout(traits.trains)))
}

/// What the job's optimizer plugin, as loaded here, says of itself that decides the job's kind;
/// `None` for a built-in optimizer, or a plugin not loaded.
pub fn optimizer_traits(spec: &JobSpec, registry: &Registry) -> Option<OptimizerTraits> {
    let plugin = registry.find(&spec.optimizer.plugin, Some(PluginKind::Optimizer)).ok()?;
    let info = optimizer_needs(&plugin.meta)?;
    Some(OptimizerTraits { data_mode: info.data_mode, trains: trained_model(&plugin.meta) })
}

/// The job's kind (`JobKind::of`), its optimizer plugin asked through the registry; `None` when
/// that plugin is not loaded here.
pub fn job_kind(spec: &JobSpec, registry: &Registry) -> Option<JobKind> {
    JobKind::of(spec, optimizer_traits(spec, registry))
}

/// The job's graders created as its worker will create them — with its team's host context and
/// this daemon's caps (`[graders]`) — and dropped at once: options a plugin's own check accepts
/// but the caps refuse (a python grader's `memory_mb` past `graders.max_memory_mb`) are refused
/// at submit with the grader's field, not when the worker starts. A plugin not loaded is
/// `check_runnable`'s to name.
pub fn grader_problems(
    spec: &JobSpec,
    registry: &Registry,
    host: &rlvr_plugin_api::HostContext,
) -> Vec<SpecError> {
    let mut problems = Vec::new();
    for (i, grader) in spec.verifiers.iter().enumerate() {
        if is_reward_model(grader) {
            continue;
        }
        let Ok(plugin) = registry.find(&grader.plugin, Some(PluginKind::Verifier)) else { continue };
        if let Err(error) = plugin.verifier_in(&grader.plugin_config(), host) {
            problems.push(SpecError {
                field: format!("verifiers[{i}]"),
                message: format!("{} refused its options on this daemon: {error}", plugin.id()),
            });
        }
    }
    problems
}
