//! The worker protocol: how `rlvrd serve` starts a worker and learns how it ended.
//!
//! The worker (`rlvr-worker run`) crosses the process boundary on these channels, each typed here
//! and used by both sides:
//! - its arguments: [`WorkerArgs`] (the daemon writes them with [`WorkerArgs::to_args`], the
//!   worker parses them with clap);
//! - the job's spec: `spec.json` in the job directory ([`crate::spec::JobSpec`]);
//! - its exit status: [`WorkerExit`];
//! - the grant socket: [`crate::grants`].

use std::ffi::OsString;
use std::path::PathBuf;

/// The worker's arguments for one run of one job.
#[derive(Debug, Clone, PartialEq, Default)]
#[cfg_attr(feature = "cli", derive(clap::Args))]
pub struct WorkerArgs {
    /// The job spec (TOML, or JSON by extension).
    #[cfg_attr(feature = "cli", arg(long))]
    pub spec: PathBuf,
    /// Where checkpoints, metrics.jsonl and rollouts.jsonl go.
    #[cfg_attr(feature = "cli", arg(long))]
    pub state_dir: PathBuf,
    /// Continue from the newest checkpoint in the state dir.
    #[cfg_attr(feature = "cli", arg(long))]
    pub resume: bool,
    /// A directory to load plugins from, besides the config's plugins.dirs (repeatable).
    #[cfg_attr(feature = "cli", arg(long = "plugin-dir"))]
    pub plugin_dirs: Vec<PathBuf>,
    /// The daemon config whose plugins.dirs to use [default: /etc/rlvr/rlvrd.toml when it
    /// exists].
    #[cfg_attr(feature = "cli", arg(long, short))]
    pub config: Option<PathBuf>,
    /// `cpu`, `cuda` or `cuda:N` [default: cuda when available (CUDA_VISIBLE_DEVICES applies),
    /// else cpu].
    #[cfg_attr(feature = "cli", arg(long))]
    pub device: Option<String>,
    /// Verifier calls at once [default: the number of cores].
    #[cfg_attr(feature = "cli", arg(long))]
    pub verify_parallel: Option<usize>,
    /// libtorch's CPU threads [default: the number of cores]. Results are bit-exact only for the
    /// same thread count: resume with the one the run started with.
    #[cfg_attr(feature = "cli", arg(long))]
    pub threads: Option<usize>,
    /// Die with this process (the daemon passes its pid): SIGKILL when it exits.
    #[cfg_attr(feature = "cli", arg(long, value_name = "PID"))]
    pub exit_with_parent: Option<u32>,
    /// Ask the daemon's scheduler on this socket for the devices before each device phase (the
    /// daemon passes it, with --job-id).
    #[cfg_attr(feature = "cli", arg(long, value_name = "SOCKET", requires = "job_id"))]
    pub grant_socket: Option<PathBuf>,
    /// This job's id at the grant socket.
    #[cfg_attr(feature = "cli", arg(long, value_name = "ID", requires = "grant_socket"))]
    pub job_id: Option<String>,
    /// The gates compare the trained model with this published checkpoint (the model line's
    /// current version; the daemon passes it) instead of the starting one.
    #[cfg_attr(feature = "cli", arg(long, value_name = "DIR", requires = "baseline_version"))]
    pub baseline: Option<PathBuf>,
    /// The version number of --baseline.
    #[cfg_attr(feature = "cli", arg(long, value_name = "N", requires = "baseline"))]
    pub baseline_version: Option<u64>,
    /// Where the shared curricula are (the daemon's `<state_dir>/curricula`).
    #[cfg_attr(feature = "cli", arg(long, value_name = "DIR", requires = "curriculum_version"))]
    pub curricula_dir: Option<PathBuf>,
    /// The version of `[curriculum] name` pinned at admission: the estimates start from it.
    #[cfg_attr(feature = "cli", arg(long, value_name = "N", requires = "curricula_dir"))]
    pub curriculum_version: Option<u64>,
}

impl WorkerArgs {
    /// The command line that parses back into `self`, after the `run` subcommand.
    pub fn to_args(&self) -> Vec<OsString> {
        let mut args: Vec<OsString> = Vec::new();
        let mut flag = |name: &str, value: OsString| {
            args.push(format!("--{name}").into());
            args.push(value);
        };
        flag("spec", self.spec.clone().into());
        flag("state-dir", self.state_dir.clone().into());
        for dir in &self.plugin_dirs {
            flag("plugin-dir", dir.clone().into());
        }
        if let Some(config) = &self.config {
            flag("config", config.clone().into());
        }
        if let Some(device) = &self.device {
            flag("device", device.into());
        }
        if let Some(parallel) = self.verify_parallel {
            flag("verify-parallel", parallel.to_string().into());
        }
        if let Some(threads) = self.threads {
            flag("threads", threads.to_string().into());
        }
        if let Some(pid) = self.exit_with_parent {
            flag("exit-with-parent", pid.to_string().into());
        }
        if let Some(socket) = &self.grant_socket {
            flag("grant-socket", socket.clone().into());
        }
        if let Some(id) = &self.job_id {
            flag("job-id", id.into());
        }
        if let Some(baseline) = &self.baseline {
            flag("baseline", baseline.clone().into());
        }
        if let Some(version) = self.baseline_version {
            flag("baseline-version", version.to_string().into());
        }
        if let Some(dir) = &self.curricula_dir {
            flag("curricula-dir", dir.clone().into());
        }
        if let Some(version) = self.curriculum_version {
            flag("curriculum-version", version.to_string().into());
        }
        if self.resume {
            args.push("--resume".into());
        }
        args
    }
}

/// How a worker process ends: its exit status, which the daemon turns into the job's next state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WorkerExit {
    /// Trained to its end (or a budget); the outcome is on stdout. The job is gated.
    Finished,
    /// The job cannot start or go on (its spec, plugins, data, model, or a tripped `[stop]`
    /// condition): the job fails with the worker's last error line.
    JobError,
    /// Not the job's fault (the grant socket failed, a panic in our own code): the daemon counts
    /// a crash and requeues the job, which resumes from its last checkpoint.
    Transient,
    /// Stopped on request (SIGTERM: the daemon is stopping, or preempted the job) after
    /// checkpointing at a step boundary: the job resumes later.
    Interrupted,
}

impl WorkerExit {
    /// Every exit.
    pub const ALL: [WorkerExit; 4] =
        [WorkerExit::Finished, WorkerExit::JobError, WorkerExit::Transient, WorkerExit::Interrupted];

    /// The process exit status (70 is sysexits' EX_SOFTWARE, 75 its EX_TEMPFAIL).
    pub fn code(self) -> u8 {
        match self {
            WorkerExit::Finished => 0,
            WorkerExit::JobError => 2,
            WorkerExit::Transient => 70,
            WorkerExit::Interrupted => 75,
        }
    }

    /// The exit a status means; `None` for a status no worker gives (a crash of another kind).
    pub fn from_code(code: i32) -> Option<WorkerExit> {
        WorkerExit::ALL.into_iter().find(|exit| i32::from(exit.code()) == code)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_exit_status_reads_back_as_itself() {
        for exit in WorkerExit::ALL {
            assert_eq!(WorkerExit::from_code(i32::from(exit.code())), Some(exit));
        }
        assert_eq!(WorkerExit::from_code(1), None);
    }
}
