//! The plugin registry: finds plugin libraries in the configured directories, loads each through
//! `loader`, and keeps every loaded `name@version` for the life of the process.
//!
//! - Libraries are never unloaded (abi_stable's rule, and jobs pin `name@version` for their life).
//! - Before loading, a file is copied to `<cache>/<stem>-<sha256>.so`: `dlopen` returns the
//!   already-loaded handle for a path it has seen, so loading a new build from the same path would
//!   silently give the old one; a content-addressed copy lets a new version load beside the old,
//!   and an in-place overwrite of the original cannot corrupt mapped code.
//! - With [`Isolation::Subprocess`] (the daemon), each new library is first loaded and self-tested
//!   in a child process (`rlvr-worker probe-plugin`): a library that segfaults or aborts kills the child,
//!   and is refused, instead of killing the daemon. What the probe answered is kept beside the copy
//!   ([`crate::probes`]), so a restart over the same libraries and worker probes nothing.
//! - Every refusal names the file and what was wrong, is logged and counted once per file content,
//!   and is kept for `rlvrctl plugins` and `GET /v1/plugins`.
//!
//! - Scans poll (a `readdir` and a few `stat`s a second) rather than use inotify: it works on every
//!   filesystem (NFS, bind mounts) and needs the same "is the file still being written?" settle
//!   time that inotify events would. [`Registry::load_files`] loads a given list instead.
//! - Optimizers probed in a child process are recorded from the probe, never mapped into the
//!   daemon. Their `check_options` runs in `rlvr-worker check-options`, its answers cached by
//!   library sha256 and canonical options (512 at most), two such processes at once.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

use rlvr_plugin_api::abi_stable::std_types::{RResult, RString};
use rlvr_plugin_api::{
    HostContext, OptionsReport, PluginError, PluginInstance, PluginKind, PluginModRef, VerifierBox,
};
use rlvr_protocol::api::{PluginList, PluginView, RefusedView};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::child::{self, ChildError};
use crate::events::{PluginLoaded, PluginProbed, PluginRefused};
use crate::fair::FairSlots;
use crate::loader;
pub use crate::loader::{LoadRefusal, PluginMeta, RefusalReason};
use crate::metrics::PluginMetrics as Metrics;
use crate::options::{self, OptionsCache, OptionsProblem};
use crate::probes::{self, WorkerIdentity};

/// Answers of worker processes about options kept (by library and options): one a submit of
/// the same options does not pay for again.
const OPTIONS_CACHE_ANSWERS: usize = 512;

/// Worker processes asking about options at once. Each maps libtorch (about 160 MB resident): a
/// burst of submits with new options waits its turn instead of starting one each.
const OPTIONS_CHECKS_AT_ONCE: usize = 2;

/// How new libraries are loaded.
#[derive(Debug, Clone)]
pub enum Isolation {
    /// Load directly in this process; for one-shot tools like `rlvrctl verify` and for the worker.
    InProcess,
    /// Probe in a child process first (`<exe> probe-plugin FILE`), then load here if it passed —
    /// except optimizers: their code (and the libtorch it links) is never mapped into this
    /// process; the registry keeps what the probe reported. For `rlvrd serve`, which lists and
    /// checks optimizers but never runs one.
    Subprocess {
        /// The worker executable (`rlvr-worker`): it links libtorch, so an optimizer plugin
        /// finds the library it needs there.
        exe: PathBuf,
        /// How long loading and the self-test may take before the library is refused.
        timeout: Duration,
    },
}

/// What a probe process reports on stdout, as one JSON line (and what the probe cache keeps).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ProbeReport {
    /// The library loaded, checked out and passed its self-test.
    Loaded(PluginMeta),
    /// The library was refused.
    Refused(LoadRefusal),
}

/// A plugin library that loaded, passed its checks and its self-test.
pub struct LoadedPlugin {
    /// What it is.
    pub meta: PluginMeta,
    /// The file it was found as.
    pub source: PathBuf,
    /// SHA-256 of the library's bytes, hex.
    pub sha256: String,
    /// The content-addressed copy that was loaded (or probed): what a worker process asked
    /// about this plugin loads, whatever happened to `source` since.
    pub library: PathBuf,
    /// When it was loaded.
    pub loaded_at: SystemTime,
    /// The library's root module; `None` for an optimizer a [`Isolation::Subprocess`] registry
    /// only probed.
    module: Option<PluginModRef>,
}

impl std::fmt::Debug for LoadedPlugin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoadedPlugin")
            .field("meta", &self.meta)
            .field("source", &self.source)
            .field("sha256", &self.sha256)
            .finish_non_exhaustive()
    }
}

impl LoadedPlugin {
    /// `name@version`.
    pub fn id(&self) -> String {
        self.meta.id()
    }

    fn module(&self) -> Result<&PluginModRef, PluginError> {
        self.module.as_ref().ok_or_else(|| {
            PluginError::internal(format!(
                "plugin {} was only probed by this process, not loaded: create it in a worker",
                self.id()
            ))
        })
    }

    /// Creates a plugin object from its configuration (a JSON object) and, for curricula, the
    /// job's prompt ids, with the most restricted host context (no secrets, no destinations).
    pub fn create(&self, config_json: &str, prompt_ids: &[String]) -> Result<PluginInstance, PluginError> {
        self.create_in(config_json, prompt_ids, &HostContext::default())
    }

    /// Creates a plugin object with the host's context: the job's secrets and outbound policy.
    /// A plugin built before `create_in` is created with `create` and never sees the context.
    pub fn create_in(
        &self,
        config_json: &str,
        prompt_ids: &[String],
        host: &HostContext,
    ) -> Result<PluginInstance, PluginError> {
        let module = self.module()?;
        let prompt_ids: Vec<RString> = prompt_ids.iter().map(|id| RString::from(id.as_str())).collect();
        let created = match module.create_in() {
            Some(create_in) => {
                create_in(config_json.into(), prompt_ids.as_slice().into(), host.to_json().as_str().into())
            }
            None => module.create()(config_json.into(), prompt_ids.as_slice().into()),
        };
        match created {
            RResult::ROk(instance) => Ok(instance),
            RResult::RErr(error) => Err(error),
        }
    }

    /// Asks the plugin, loaded in this process, about `options_json` without creating it:
    /// `Ok(None)` when the plugin predates `check_options`. For an optimizer a daemon only
    /// probed, ask through [`Registry::check_options`].
    pub fn check_options(&self, options_json: &str) -> Result<Option<OptionsReport>, OptionsProblem> {
        let module =
            self.module().map_err(|error| OptionsProblem::Unavailable { message: error.message.into() })?;
        options::check_in_process(module, options_json)
    }

    /// Whether the library has `check_options`: `None` when this process only probed it.
    pub fn checks_options(&self) -> Option<bool> {
        self.module.as_ref().map(|module| module.check_options().is_some())
    }

    /// Creates a verifier object; an error when this plugin is not a verifier.
    pub fn verifier(&self, config_json: &str) -> Result<VerifierBox, PluginError> {
        self.verifier_in(config_json, &HostContext::default())
    }

    /// [`verifier`](Self::verifier) with the host's context.
    pub fn verifier_in(&self, config_json: &str, host: &HostContext) -> Result<VerifierBox, PluginError> {
        match self.create_in(config_json, &[], host)? {
            PluginInstance::Verifier(verifier) => Ok(verifier),
            other => Err(PluginError::internal(format!(
                "plugin {} created a {} where a verifier was expected",
                self.id(),
                other.kind().as_str()
            ))),
        }
    }
}

/// A library that was refused.
#[derive(Debug, Clone, Serialize)]
pub struct Refused {
    /// The file it was found as.
    pub source: PathBuf,
    /// SHA-256 of its bytes, when they could be read.
    pub sha256: Option<String>,
    /// The class of problem.
    pub reason: RefusalReason,
    /// What was wrong, naming the file.
    pub message: String,
    /// When it was refused.
    #[serde(with = "rlvr_protocol::time::rfc3339")]
    pub at: SystemTime,
}

/// Why a plugin asked for by name was not found.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LookupError {
    /// No loaded plugin matches.
    #[error("no {kind}plugin {spec:?} is loaded; loaded: {}", if available.is_empty() { "none".to_owned() } else { available.join(", ") })]
    NotFound {
        /// What was asked for.
        spec: String,
        /// `"verifier "` etc., or empty.
        kind: String,
        /// The `name@version` of every loaded plugin of that kind.
        available: Vec<String>,
    },
    /// `name@version` did not parse.
    #[error("plugin {spec:?}: expected NAME or NAME@VERSION with a semantic version like 1.2.3")]
    BadSpec {
        /// What was asked for.
        spec: String,
    },
}

/// The registry could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    /// The cache directory for content-addressed copies could not be created.
    #[error("plugin cache directory {path}: {source}")]
    CacheDir {
        /// The directory.
        path: PathBuf,
        /// The cause.
        source: io::Error,
    },
}

/// Size and modification time: how a scan tells that a file changed without reading it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct FileStamp {
    len: u64,
    modified: Option<SystemTime>,
}

#[derive(Default)]
struct State {
    loaded: BTreeMap<(String, semver::Version), Arc<LoadedPlugin>>,
    /// Content hashes already loaded, so the same bytes found twice load once.
    by_sha: HashMap<String, Arc<LoadedPlugin>>,
    /// The latest refusal per source file; cleared when the file loads or disappears.
    refused: BTreeMap<PathBuf, Refused>,
    /// The stamp each source file had when it was last handled.
    stamps: HashMap<PathBuf, FileStamp>,
    /// Plugin directories already reported missing, so a missing one is logged once.
    missing_dirs: HashSet<PathBuf>,
}

/// The set of loaded plugins, and what was refused.
pub struct Registry {
    cache_dir: PathBuf,
    isolation: Isolation,
    metrics: Metrics,
    state: Mutex<State>,
    /// Serialises scans and loads; `state` is only locked briefly so listings never wait on a
    /// self-test.
    load_lock: Mutex<()>,
    /// What worker processes said of optimizers' options: each answer costs a process start
    /// (and libtorch's load) that a submit should not pay twice for the same options.
    options_cache: Mutex<OptionsCache>,
    /// Slots for those worker processes ([`OPTIONS_CHECKS_AT_ONCE`]), shared fairly by teams.
    options_slots: FairSlots,
}

impl Registry {
    /// A registry that copies libraries into `cache_dir` before loading them.
    pub fn new(cache_dir: PathBuf, isolation: Isolation, metrics: Metrics) -> Result<Self, RegistryError> {
        fs::create_dir_all(&cache_dir)
            .map_err(|source| RegistryError::CacheDir { path: cache_dir.clone(), source })?;
        Ok(Registry {
            cache_dir,
            isolation,
            metrics,
            state: Mutex::default(),
            load_lock: Mutex::default(),
            options_cache: Mutex::new(OptionsCache::new(OPTIONS_CACHE_ANSWERS)),
            options_slots: FairSlots::new(OPTIONS_CHECKS_AT_ONCE),
        })
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock leaves the maps consistent (every update is one insert).
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Looks at every `*.so` in `dirs` and loads what is new or changed. Files modified less than
    /// `settle` ago are left for a later scan: they may still be being written.
    pub fn scan(&self, dirs: &[PathBuf], settle: Duration) -> ScanSummary {
        let _loading = self.load_lock.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let mut summary = ScanSummary::default();
        let mut present = HashSet::new();
        for dir in dirs {
            let entries = match fs::read_dir(dir) {
                Ok(entries) => {
                    self.state().missing_dirs.remove(dir);
                    entries
                }
                Err(error) => {
                    if self.state().missing_dirs.insert(dir.clone()) {
                        tracing::warn!(dir = %dir.display(), %error, "plugin directory unreadable; will look again");
                    }
                    continue;
                }
            };
            let mut paths: Vec<PathBuf> = entries
                .filter_map(Result::ok)
                .map(|entry| entry.path())
                .filter(|path| path.extension().is_some_and(|ext| ext == "so"))
                .collect();
            paths.sort();
            for path in paths {
                let Ok(metadata) = fs::metadata(&path) else { continue };
                if !metadata.is_file() {
                    continue;
                }
                present.insert(path.clone());
                let stamp = FileStamp { len: metadata.len(), modified: metadata.modified().ok() };
                if self.state().stamps.get(&path) == Some(&stamp) {
                    continue;
                }
                let young = stamp
                    .modified
                    .and_then(|modified| SystemTime::now().duration_since(modified).ok())
                    .is_some_and(|age| age < settle);
                if young {
                    continue;
                }
                self.state().stamps.insert(path.clone(), stamp);
                summary.count(&self.load_file(&path));
            }
        }
        let mut state = self.state();
        state.stamps.retain(|path, _| present.contains(path));
        state.refused.retain(|path, _| present.contains(path));
        summary
    }

    /// Loads exactly `files`, each as a scan would load it, and looks at no directory: for a
    /// worker the daemon told which libraries its job uses.
    pub fn load_files(&self, files: &[PathBuf]) -> ScanSummary {
        let _loading = self.load_lock.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let mut summary = ScanSummary::default();
        for file in files {
            summary.count(&self.load_file(file));
        }
        summary
    }

    fn load_file(&self, path: &Path) -> Result<Arc<LoadedPlugin>, Refused> {
        let result = self.try_load(path);
        match &result {
            Ok(_) => {
                self.state().refused.remove(path);
            }
            Err(refused) => {
                PluginRefused { refused }.emit(&self.metrics);
                self.state().refused.insert(path.to_owned(), refused.clone());
            }
        }
        result
    }

    fn try_load(&self, path: &Path) -> Result<Arc<LoadedPlugin>, Refused> {
        let refuse = |sha256: Option<&str>, refusal: LoadRefusal| Refused {
            source: path.to_owned(),
            sha256: sha256.map(str::to_owned),
            reason: refusal.reason,
            message: format!("{}: {}", path.display(), refusal.message),
            at: SystemTime::now(),
        };
        let bytes = fs::read(path).map_err(|error| {
            refuse(
                None,
                LoadRefusal::new(RefusalReason::Unreadable, format!("cannot read the file: {error}")),
            )
        })?;
        let sha256 = hex::encode(Sha256::digest(&bytes));
        if let Some(plugin) = self.state().by_sha.get(&sha256) {
            return Ok(plugin.clone());
        }
        // Before anything maps it (here or in the probe), and before it is copied into the cache.
        loader::check_elf(&bytes).map_err(|refusal| refuse(Some(&sha256), refusal))?;
        let library = self.cached_copy(path, &sha256, &bytes).map_err(|error| {
            refuse(
                Some(&sha256),
                LoadRefusal::new(
                    RefusalReason::Unreadable,
                    format!("cannot copy it into the plugin cache {}: {error}", self.cache_dir.display()),
                ),
            )
        })?;
        let (module, meta) = match &self.isolation {
            Isolation::Subprocess { exe, timeout } => {
                let meta = self
                    .probe_report(exe, *timeout, &library, &sha256)
                    .map_err(|refusal| refuse(Some(&sha256), refusal))?;
                // Refuse a duplicate before its code is mapped into this process for good.
                if let Some(refusal) = self.duplicate_of(&meta) {
                    return Err(refuse(Some(&sha256), refusal));
                }
                if meta.kind == PluginKind::Optimizer {
                    (None, meta)
                } else {
                    let (module, meta) =
                        loader::load_and_check(&library).map_err(|refusal| refuse(Some(&sha256), refusal))?;
                    (Some(module), meta)
                }
            }
            Isolation::InProcess => {
                let (module, meta) =
                    loader::load_and_check(&library).map_err(|refusal| refuse(Some(&sha256), refusal))?;
                (Some(module), meta)
            }
        };
        if let Some(refusal) = self.duplicate_of(&meta) {
            return Err(refuse(Some(&sha256), refusal));
        }
        let plugin = Arc::new(LoadedPlugin {
            meta,
            source: path.to_owned(),
            sha256: sha256.clone(),
            library,
            loaded_at: SystemTime::now(),
            module,
        });
        // Loads are serialised by `load_lock`, so nothing was registered since `duplicate_of`.
        let mut state = self.state();
        state.loaded.insert((plugin.meta.name.clone(), plugin.meta.version.clone()), plugin.clone());
        state.by_sha.insert(sha256, plugin.clone());
        drop(state);
        PluginLoaded { plugin: &plugin }.emit(&self.metrics);
        Ok(plugin)
    }

    /// The refusal for `meta` when its `name@version` is already loaded (with other content: the
    /// same content was found by hash before this point).
    fn duplicate_of(&self, meta: &PluginMeta) -> Option<LoadRefusal> {
        let state = self.state();
        let existing = state.loaded.get(&(meta.name.clone(), meta.version.clone()))?;
        Some(LoadRefusal::new(
            RefusalReason::DuplicateVersion,
            format!(
                "plugin {} is already loaded from {} with different content (sha256 {}): give the new build a new version to load it beside the old one",
                meta.id(),
                existing.source.display(),
                existing.sha256
            ),
        ))
    }

    /// What a probe process says of `library` (the copy of the library with `sha256`): the
    /// report a worker of the same build gave before, kept beside the copy, else a new probe's,
    /// kept when it is the library's own answer (loaded, or refused by the probe process) — a
    /// crash or a timeout may be the machine's, and is asked again next time.
    fn probe_report(
        &self,
        exe: &Path,
        timeout: Duration,
        library: &Path,
        sha256: &str,
    ) -> Result<PluginMeta, LoadRefusal> {
        let worker = WorkerIdentity::of(exe)
            .inspect_err(|error| {
                tracing::warn!(exe = %exe.display(), %error, "cannot tell the worker's build; its probe reports are not kept");
            })
            .ok();
        let kept = worker.as_ref().and_then(|worker| probes::read(library, sha256, worker));
        let report = match kept {
            Some(report) => {
                PluginProbed { library, sha256, from_cache: true }.emit(&self.metrics);
                report
            }
            None => {
                let answered = probe(exe, library, timeout);
                PluginProbed { library, sha256, from_cache: false }.emit(&self.metrics);
                if let (Ok(report), Some(worker)) = (&answered, &worker)
                    && let Err(error) = probes::write(library, sha256, worker, report)
                {
                    tracing::warn!(library = %library.display(), %error, "cannot keep the plugin's probe report; it is probed again at the next start");
                }
                answered?
            }
        };
        match report {
            ProbeReport::Loaded(meta) => Ok(meta),
            ProbeReport::Refused(refusal) => Err(refusal),
        }
    }

    /// Writes `bytes` to `<cache>/<stem>-<sha256>.so` unless that file holds them already. A
    /// source that is such a copy already (a worker given the daemon's) keeps its name.
    fn cached_copy(&self, source: &Path, sha256: &str, bytes: &[u8]) -> io::Result<PathBuf> {
        let stem = source.file_stem().and_then(|stem| stem.to_str()).unwrap_or("plugin");
        let name = if stem.ends_with(&format!("-{sha256}")) {
            format!("{stem}.so")
        } else {
            format!("{stem}-{sha256}.so")
        };
        let target = self.cache_dir.join(name);
        // The name is the content's sha256 and a copy is only ever written whole, by rename: a
        // file of the right size there is these bytes, without reading 40 MB again at each start.
        if !fs::metadata(&target).is_ok_and(|metadata| metadata.len() == bytes.len() as u64) {
            rlvr_protocol::fs::write_atomic(&target, bytes)?;
        }
        Ok(target)
    }

    /// Asks `plugin` about `options_json` without creating it: in this process when it is loaded
    /// here, else (an optimizer a [`Isolation::Subprocess`] registry only probed) in a worker
    /// process (`rlvr-worker check-options`), whose answers are cached by library and options.
    /// Those processes run two at a time, taken in turn by the teams asking (`team`: the spec's),
    /// so one team's many checks do not hold up another's. Blocks for as long as that process
    /// (and the wait for its slot) lasts: call it off an async runtime's threads.
    pub fn check_options(
        &self,
        plugin: &LoadedPlugin,
        options_json: &str,
        team: &str,
    ) -> Result<Option<OptionsReport>, OptionsProblem> {
        let Isolation::Subprocess { exe, timeout } = &self.isolation else {
            return plugin.check_options(options_json);
        };
        if plugin.module.is_some() {
            return plugin.check_options(options_json);
        }
        let cache = || self.options_cache.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(answer) = cache().get(&plugin.sha256, options_json) {
            return answer;
        }
        let _slot = self.options_slots.take(team);
        // Another submit of the same options may have asked while this one waited.
        if let Some(answer) = cache().get(&plugin.sha256, options_json) {
            return answer;
        }
        let answer = options::check_in_child(exe, &plugin.library, options_json, *timeout);
        cache().put(&plugin.sha256, options_json, &answer);
        answer
    }

    /// Every loaded plugin, by name then version.
    pub fn plugins(&self) -> Vec<Arc<LoadedPlugin>> {
        self.state().loaded.values().cloned().collect()
    }

    /// The current refusal of every file that is still present and refused.
    pub fn refusals(&self) -> Vec<Refused> {
        self.state().refused.values().cloned().collect()
    }

    /// The listing of `GET /v1/plugins` and `rlvrctl plugins`.
    pub fn listing(&self) -> PluginList {
        PluginList {
            plugins: self.plugins().iter().map(|plugin| PluginView::from(plugin.as_ref())).collect(),
            refused: self.refusals().iter().map(RefusedView::from).collect(),
        }
    }

    /// Finds a loaded plugin by `name` (newest version) or `name@version`, optionally of a kind.
    pub fn find(&self, spec: &str, kind: Option<PluginKind>) -> Result<Arc<LoadedPlugin>, LookupError> {
        self.versions(spec, kind).map(|mut found| found.pop().expect("versions finds one or fails"))
    }

    /// Every loaded version of `name` (oldest first; never empty), or just `name@version`,
    /// optionally of a kind: the libraries a job naming `spec` may use (a resumed one, the
    /// version its record pinned).
    pub fn versions(
        &self,
        spec: &str,
        kind: Option<PluginKind>,
    ) -> Result<Vec<Arc<LoadedPlugin>>, LookupError> {
        let (name, version) = match spec.split_once('@') {
            Some((name, version)) => {
                let version = semver::Version::parse(version)
                    .map_err(|_| LookupError::BadSpec { spec: spec.to_owned() })?;
                (name, Some(version))
            }
            None => (spec, None),
        };
        let state = self.state();
        let of_kind = |plugin: &&Arc<LoadedPlugin>| kind.is_none_or(|kind| plugin.meta.kind == kind);
        let found: Vec<Arc<LoadedPlugin>> = state
            .loaded
            .values()
            .filter(of_kind)
            .filter(|plugin| {
                plugin.meta.name == name
                    && version.as_ref().is_none_or(|version| &plugin.meta.version == version)
            })
            .cloned()
            .collect();
        if found.is_empty() {
            return Err(LookupError::NotFound {
                spec: spec.to_owned(),
                kind: kind.map(|kind| format!("{} ", kind.as_str())).unwrap_or_default(),
                available: state.loaded.values().filter(of_kind).map(|plugin| plugin.id()).collect(),
            });
        }
        Ok(found)
    }
}

impl From<&LoadedPlugin> for PluginView {
    fn from(plugin: &LoadedPlugin) -> Self {
        PluginView {
            id: plugin.id(),
            name: plugin.meta.name.clone(),
            version: plugin.meta.version.to_string(),
            kind: plugin.meta.kind.as_str().to_owned(),
            description: plugin.meta.description.clone(),
            sha256: plugin.sha256.clone(),
            source: plugin.source.display().to_string(),
            reference_schema: plugin.meta.reference_schema.clone(),
            data_mode: plugin.meta.data_mode.clone(),
            notes: plugin.meta.notes.clone(),
            loaded_at: rlvr_protocol::time::rfc3339::format(plugin.loaded_at),
        }
    }
}

impl From<&Refused> for RefusedView {
    fn from(refused: &Refused) -> Self {
        RefusedView {
            source: refused.source.display().to_string(),
            reason: refused.reason.as_str().to_owned(),
            message: refused.message.clone(),
            at: rlvr_protocol::time::rfc3339::format(refused.at),
        }
    }
}

/// What one scan did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct ScanSummary {
    /// Libraries newly loaded (or found again with known content).
    pub loaded: usize,
    /// Libraries refused.
    pub refused: usize,
}

impl ScanSummary {
    fn count(&mut self, loaded: &Result<Arc<LoadedPlugin>, Refused>) {
        match loaded {
            Ok(_) => self.loaded += 1,
            Err(_) => self.refused += 1,
        }
    }
}

/// Loads `library` in a child process and reads its report; `Err` when the process gave none
/// (it did not start, crashed or ran out of time), a refusal of reason `crashed`.
fn probe(exe: &Path, library: &Path, timeout: Duration) -> Result<ProbeReport, LoadRefusal> {
    let crashed = |message: String| LoadRefusal::new(RefusalReason::Crashed, message);
    let mut command = Command::new(exe);
    command.arg("probe-plugin").arg(library);
    let output = child::run(command, timeout).map_err(|error| match error {
        ChildError::Spawn { exe, source } => {
            crashed(format!("cannot start the probe process {}: {source}", exe.display()))
        }
        ChildError::Timeout { limit } => crashed(format!(
            "loading and self-test did not finish within {} s; the probe process was killed",
            limit.as_secs()
        )),
    })?;
    output
        .last_line::<ProbeReport>()
        .ok_or_else(|| crashed(format!("the library crashed the probe process ({})", output.describe())))
}

/// The body of `rlvr-worker probe-plugin FILE`: load and check in this process, report on stdout.
pub fn probe_main(library: &Path) -> ProbeReport {
    match loader::load_and_check(library) {
        Ok((_module, meta)) => ProbeReport::Loaded(meta),
        Err(refusal) => ProbeReport::Refused(refusal),
    }
}
