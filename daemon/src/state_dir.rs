//! The daemon's state directory (`daemon.state_dir`): the one place that knows what is where in
//! it. The jobs' own directories are `rlvr_protocol::jobdir`'s (the worker writes in them too).
//!
//! ```text
//! <state_dir>/
//!   jobs/<job id>/     JobDir: spec.json, worker.log, run/
//!   registry/          the registry of published model lines unless `daemon.registry` says
//!                      otherwise
//!   datasets/<team>/   the teams' uploaded datasets (`tenancy::datasets`)
//!   curricula/<team>/<name>/  each team's curricula's versions
//!   grader-work/       graders' sandbox work directories unless `graders.work_dir` says
//!                      otherwise
//!   plugin-cache/      content-addressed copies of the plugin libraries loaded and their probe
//!                      reports, unless `plugins.cache_dir` says otherwise
//!   tinker/<team>/<run>/{weights,sampler_weights}/<name>/  the Tinker clients' saved states
//!   tinker-clients/<client id>/  a Tinker client's checkpoints, its samplers' snapshots, its
//!                      process's log (removed when its session finishes)
//!   rlvrd.addr         the API's bound address (for `listen = "…:0"`), while serving
//!   sched.sock         the grant socket the workers ask for their devices on
//! ```

use std::path::{Path, PathBuf};

use rlvr_protocol::jobdir::JobsDir;

/// The file that holds the API's bound address, for tools and tests that start the daemon on
/// port 0.
pub const ADDR_FILE: &str = "rlvrd.addr";

/// A daemon's state directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StateDir {
    root: PathBuf,
}

impl StateDir {
    /// The state directory at `root`.
    pub fn new(root: PathBuf) -> Self {
        StateDir { root }
    }

    /// The directory itself.
    pub fn path(&self) -> &Path {
        &self.root
    }

    /// `jobs/`: every job's directory.
    pub fn jobs(&self) -> JobsDir {
        JobsDir::of_state_dir(&self.root)
    }

    /// `registry/`: where gated checkpoints go unless `daemon.registry` names another place.
    pub fn default_registry(&self) -> PathBuf {
        self.root.join("registry")
    }

    /// `datasets/`: the teams' uploaded datasets (`tenancy::datasets`).
    pub fn datasets(&self) -> PathBuf {
        self.root.join("datasets")
    }

    /// `grader-work/`: where graders' sandboxes make their work directories unless
    /// `graders.work_dir` names another place.
    pub fn default_grader_work(&self) -> PathBuf {
        self.root.join("grader-work")
    }

    /// `curricula/`: the shared curricula's versions.
    pub fn curricula(&self) -> PathBuf {
        self.root.join("curricula")
    }

    /// `plugin-cache/`: the registry's copies of plugin libraries and their probe reports, unless
    /// `plugins.cache_dir` names another place.
    pub fn plugin_cache(&self) -> PathBuf {
        self.root.join("plugin-cache")
    }

    /// `tinker/`: the `tinker://` paths Tinker clients saved, by team.
    pub fn tinker(&self) -> PathBuf {
        self.root.join("tinker")
    }

    /// `tinker-clients/`: each open Tinker client's checkpoints and log.
    pub fn tinker_clients(&self) -> PathBuf {
        self.root.join("tinker-clients")
    }

    /// `rlvrd.addr`.
    pub fn addr_file(&self) -> PathBuf {
        self.root.join(ADDR_FILE)
    }

    /// `sched.sock`.
    pub fn grant_socket(&self) -> PathBuf {
        self.root.join(rlvr_protocol::grants::SOCKET_FILE)
    }
}
