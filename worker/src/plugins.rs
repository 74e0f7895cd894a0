//! The job's plugins: loaded from the files the daemon named (its copies of the job's
//! libraries) or, for a run by hand, found in the plugin directories; the versions a resumed run
//! pinned, else the newest; created with the spec's options, and checked against each other
//! before anything is written.
//!
//! They are exactly the `--plugin-file`s the daemon named, checked with `rlvr_plugin_host::fit`,
//! and each is created with the run's host context (`create_in`). Why files, not the plugin
//! directories: scanning made every job load, hash, copy and self-test every library there
//! (optimizer debug builds are 40 MB each) to use two or three, and the daemon already knows which
//! loaded libraries a spec names. It passes every loaded version of each name, so a resume finds
//! the version its record pins; a name nothing loaded answers to fails the job at its field.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rlvr_plugin_api::{
    CurriculumBox, HostContext, OptimizerBox, OptimizerInfo, OptionError, PluginError, PluginErrorKind,
    PluginInstance, PluginKind, TrainedModel,
};
use rlvr_plugin_host::fit::{fit_problems, optimizer_needs, trained_model};
use rlvr_plugin_host::metrics::PluginMetrics;
use rlvr_plugin_host::options::spec_field;
use rlvr_plugin_host::reward::{Combiner, Grader};
use rlvr_plugin_host::{Isolation, LoadedPlugin, Registry};
use rlvr_protocol::builtin::Builtin;
use rlvr_protocol::reward_model::is_reward_model;
use rlvr_protocol::spec::{CurriculumSection, JobSpec};
use rlvr_protocol::worker::PluginUse;
use tracing::{info, warn};

use crate::WorkerError;
use crate::state::JobRecord;
use rlvr_protocol::records::PromptRecord;

/// Prefix of the temp directory holding a worker's content-addressed plugin copies, followed by
/// the worker's pid and `-`.
const PLUGIN_COPIES_PREFIX: &str = "rlvrd-worker-plugins-";

/// The plugins of one run.
pub struct JobPlugins {
    /// The optimizer, created with `[optimizer]`'s keys.
    pub optimizer: OptimizerBox,
    /// What it needs.
    pub optimizer_info: OptimizerInfo,
    /// The model it trains: the policy, or a reward model.
    pub trains: TrainedModel,
    /// Its `name@version`.
    pub optimizer_id: String,
    /// The graders, in the spec's order.
    pub graders: Vec<Grader>,
    /// How their verdicts make the reward.
    pub combiner: Combiner,
    /// Every plugin used so far, for the manifest (the curriculum joins when created).
    pub uses: Vec<PluginUse>,
    /// The libraries the plugins' code comes from: kept for the whole run.
    pub libraries: Libraries,
    source: PluginSource,
    /// What every plugin of the run is created with.
    host: HostContext,
}

/// Where a run's plugin libraries come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PluginSource {
    /// Exactly these files, and nothing else (`--plugin-file`: the daemon's copies of the job's
    /// libraries).
    Files(Vec<PathBuf>),
    /// Every library in these directories (`--plugin-dir` and the config's `plugins.dirs`: a
    /// run by hand).
    Dirs(Vec<PathBuf>),
}

impl PluginSource {
    fn load_into(&self, registry: &Registry) {
        let summary = match self {
            PluginSource::Files(files) => registry.load_files(files),
            PluginSource::Dirs(dirs) => registry.scan(dirs, std::time::Duration::ZERO),
        };
        info!(loaded = summary.loaded, refused = summary.refused, "plugin libraries loaded");
    }

    /// Where a plugin was looked for, for the message of one not found.
    fn looked_in(&self) -> String {
        let list = |paths: &[PathBuf]| {
            paths.iter().map(|path| path.display().to_string()).collect::<Vec<_>>().join(", ")
        };
        match self {
            PluginSource::Files(files) => format!("the job's libraries: {}", list(files)),
            PluginSource::Dirs(dirs) => format!("looked in {}", list(dirs)),
        }
    }
}

/// The registry and the content-addressed copies of the libraries it loaded. The copies stay
/// while the run lasts and are removed when it returns (a killed worker's are swept by the next
/// worker: [`sweep_stale_plugin_copies`]).
pub struct Libraries {
    registry: Registry,
    _copies: tempfile::TempDir,
}

impl JobPlugins {
    /// Loads the optimizer and the verifiers of `spec` (the versions `pinned` records, on a
    /// resume), creates them with the host's context, and checks that they fit the spec.
    pub fn load(
        spec: &JobSpec,
        pinned: Option<&JobRecord>,
        source: &PluginSource,
        host: &HostContext,
    ) -> Result<Self, WorkerError> {
        sweep_stale_plugin_copies(&std::env::temp_dir());
        let temp_error = |message: String| WorkerError::Plugin { field: "plugins".into(), message };
        let copies = tempfile::Builder::new()
            .prefix(&format!("{PLUGIN_COPIES_PREFIX}{}-", std::process::id()))
            .tempdir()
            .map_err(|error| temp_error(format!("cannot create a temp dir for plugins: {error}")))?;
        let registry =
            Registry::new(copies.path().to_owned(), Isolation::InProcess, PluginMetrics::unexported())
                .map_err(|error| temp_error(error.to_string()))?;
        // A job of built-ins only (a distillation graded by a reward model) loads no library.
        if !spec.plugin_libraries().is_empty() {
            source.load_into(&registry);
        }
        // A built-in optimizer is the worker's own code: no library, nothing to pin.
        let (created, optimizer_info, optimizer_id, trains, uses) = match Builtin::of(spec) {
            Some(builtin) => {
                let (created, info) = crate::sampling::builtin_optimizer();
                (created, info, format!("{} (built in)", builtin.name()), TrainedModel::Policy, Vec::new())
            }
            None => {
                let pin = pinned.map(|record| record.optimizer.as_str());
                let optimizer = find(
                    &registry,
                    source,
                    "optimizer.plugin",
                    &spec.optimizer.plugin,
                    pin,
                    PluginKind::Optimizer,
                )?;
                let info = optimizer_needs(&optimizer.meta).ok_or_else(|| WorkerError::Plugin {
                    field: "optimizer.plugin".into(),
                    message: format!("{} reports no data mode this worker knows", optimizer.id()),
                })?;
                // The optimizer learns the job's max_new_tokens (DAPO's L_max) from its context.
                let job_host =
                    HostContext { max_new_tokens: Some(spec.rollout.max_new_tokens), ..host.clone() };
                let created =
                    match create(&optimizer, "optimizer", &spec.optimizer_plugin_config(), &[], &job_host)? {
                        PluginInstance::Optimizer(created) => created,
                        other => return Err(created_other(&optimizer, "optimizer.plugin", &other)),
                    };
                (created, info, optimizer.id(), trained_model(&optimizer.meta), vec![use_of(&optimizer)])
            }
        };
        let mut plugins = JobPlugins {
            optimizer: created,
            optimizer_info,
            optimizer_id,
            trains,
            graders: Vec::new(),
            // With [env], the environment's reward is the last term, weight 1.
            combiner: Combiner {
                names: spec
                    .verifiers
                    .iter()
                    .map(|section| section.grader_name())
                    .chain(spec.env_term())
                    .map(str::to_owned)
                    .collect(),
                weights: spec
                    .verifiers
                    .iter()
                    .map(|section| section.weight)
                    .chain(spec.env_term().map(|_| 1.0))
                    .collect(),
                formula: spec
                    .reward_formula()
                    .map_err(|error| WorkerError::Plugin { field: error.field, message: error.message })?,
            },
            uses,
            libraries: Libraries { registry, _copies: copies },
            source: source.clone(),
            host: host.clone(),
        };
        // The record pins the plugin graders only, in order: the built-in reward models are
        // the worker's own (`reward_models`).
        let plugin_sections =
            spec.verifiers.iter().enumerate().filter(|(_, section)| !is_reward_model(section));
        for (pinned_at, (i, section)) in plugin_sections.enumerate() {
            let pin = pinned.and_then(|record| record.verifiers.get(pinned_at)).map(String::as_str);
            let field = format!("verifiers[{i}].plugin");
            let plugin = plugins.find(&field, &section.plugin, pin, PluginKind::Verifier)?;
            let verifier = plugin
                .verifier_in(&section.plugin_config(), host)
                .map_err(|error| refused(&plugin, &format!("verifiers[{i}]"), error))?;
            plugins.graders.push(Grader { id: plugin.id(), verifier: Arc::new(verifier) });
            // What the options carry (a python grader's source), by digest, for the manifest:
            // the plugin accepted these options at submit, so its report is there to ask for.
            let mut used = use_of(&plugin);
            if let Ok(Some(report)) = plugin.check_options(&section.plugin_config()) {
                used.digests = report.digests.into_iter().map(|digest| (digest.key, digest.sha256)).collect();
            }
            plugins.uses.push(used);
        }
        // A built-in optimizer's needs are its own (`rlvr_protocol::builtin`), checked by `run`.
        if let Some((field, message)) =
            fit_problems(spec, &plugins.optimizer_info, plugins.trains, &plugins.optimizer_id)
                .into_iter()
                .find(|_| Builtin::of(spec).is_none())
        {
            return Err(WorkerError::Plugin { field, message });
        }
        Ok(plugins)
    }

    /// Creates the job's curriculum over the training prompts: its keys, plus `history` from
    /// the version of the shared curriculum the daemon pinned (`pinned_version`: the curricula
    /// directory and the number), when the job names one.
    pub fn curriculum(
        &mut self,
        section: &CurriculumSection,
        prompts: &[PromptRecord],
        pinned: Option<&JobRecord>,
        pinned_version: Option<&(PathBuf, u64)>,
    ) -> Result<(String, CurriculumBox), WorkerError> {
        let pin = pinned.and_then(|record| record.curriculum.as_deref());
        let plugin = self.find("curriculum.plugin", &section.plugin, pin, PluginKind::Curriculum)?;
        let ids: Vec<String> = prompts.iter().map(|prompt| prompt.id.clone()).collect();
        let config = curriculum_config(section, pinned_version)?;
        let curriculum = match create(&plugin, "curriculum", &config, &ids, &self.host)? {
            PluginInstance::Curriculum(created) => created,
            other => return Err(created_other(&plugin, "curriculum.plugin", &other)),
        };
        self.uses.push(use_of(&plugin));
        Ok((plugin.id(), curriculum))
    }

    fn find(
        &self,
        field: &str,
        wanted: &str,
        pin: Option<&str>,
        kind: PluginKind,
    ) -> Result<Arc<LoadedPlugin>, WorkerError> {
        find(&self.libraries.registry, &self.source, field, wanted, pin, kind)
    }
}

/// The plugin of `kind` named `wanted`, or the pinned `name@version`; a miss names the spec's
/// `field` and where it was looked for.
fn find(
    registry: &Registry,
    source: &PluginSource,
    field: &str,
    wanted: &str,
    pin: Option<&str>,
    kind: PluginKind,
) -> Result<Arc<LoadedPlugin>, WorkerError> {
    registry.find(pin.unwrap_or(wanted), Some(kind)).map_err(|error| WorkerError::Plugin {
        field: field.to_owned(),
        message: format!("{error} ({})", source.looked_in()),
    })
}

fn use_of(plugin: &LoadedPlugin) -> PluginUse {
    PluginUse { id: plugin.id(), sha256: plugin.sha256.clone(), digests: Default::default() }
}

/// Creates `plugin` with its options and the host's context; a refusal names the spec's field.
fn create(
    plugin: &LoadedPlugin,
    section: &str,
    config: &str,
    prompt_ids: &[String],
    host: &HostContext,
) -> Result<PluginInstance, WorkerError> {
    plugin.create_in(config, prompt_ids, host).map_err(|error| refused(plugin, section, error))
}

/// A plugin's refusal of its options at `section`, in the spec's terms the daemon uses at
/// submit: `verifiers[1].fallbak: unknown key; expected one of … (math@0.1.0)`.
fn refused(plugin: &LoadedPlugin, section: &str, error: PluginError) -> WorkerError {
    if error.kind == PluginErrorKind::InvalidConfig {
        let OptionError { key, message } = OptionError::from(error);
        return WorkerError::Plugin {
            field: spec_field(section, &key),
            message: format!("{message} ({})", plugin.id()),
        };
    }
    WorkerError::Plugin {
        field: section.to_owned(),
        message: format!("{} refused its options: {error}", plugin.id()),
    }
}

fn created_other(plugin: &LoadedPlugin, field: &str, created: &PluginInstance) -> WorkerError {
    WorkerError::Plugin {
        field: field.to_owned(),
        message: format!("{} created a {}", plugin.id(), created.kind().as_str()),
    }
}

/// The curriculum plugin's keys, with `history` from the pinned version of the shared
/// curriculum when the job names one and the daemon pinned a version.
fn curriculum_config(
    section: &CurriculumSection,
    pinned: Option<&(PathBuf, u64)>,
) -> Result<String, WorkerError> {
    let (Some(name), Some((dir, version))) = (&section.name, pinned) else {
        return Ok(section.plugin_config());
    };
    let field_error = |message: String| WorkerError::Plugin { field: "curriculum.name".into(), message };
    // `dir` is the owner's curricula directory (another team's for `TEAM/NAME`), chosen by the
    // daemon; the name picks the curriculum in it.
    let reference = rlvr_protocol::names::CurriculumRef::parse(name).map_err(field_error)?;
    let version = rlvr_protocol::curricula::load(dir, &reference.name, *version)
        .map_err(|error| field_error(error.to_string()))?;
    let mut options = section.options.clone();
    options.insert("history".into(), version.history());
    info!(curriculum = %name, version = version.version, prompts = version.prompts.len(), "curriculum pinned");
    Ok(serde_json::Value::Object(options).to_string())
}

/// Removes plugin-copy directories left in `temp` by workers that no longer run.
///
/// A worker removes its own when it returns, but one killed (SIGKILL, OOM, a cancelled job)
/// cannot, and each holds a copy of every plugin it loaded (about 150 MB for four plugins): a
/// machine that kills workers as a matter of course would fill its temp dir. A directory is
/// stale when the pid in its name has no `/proc` entry; names without a pid are left alone.
fn sweep_stale_plugin_copies(temp: &Path) {
    let Ok(entries) = std::fs::read_dir(temp) else { return };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_prefix(PLUGIN_COPIES_PREFIX))
            .and_then(|rest| rest.split_once('-'))
            .and_then(|(pid, _)| pid.parse::<u32>().ok())
        else {
            continue;
        };
        if !Path::new("/proc").join(pid.to_string()).exists() {
            match std::fs::remove_dir_all(entry.path()) {
                Ok(()) => {
                    info!(path = %entry.path().display(), pid, "removed the plugin copies of a worker that is gone")
                }
                Err(error) => {
                    warn!(path = %entry.path().display(), %error, "cannot remove a stale plugin-copy directory")
                }
            }
        }
    }
}
