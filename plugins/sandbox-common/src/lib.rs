//! The layered sandbox that the `code` and `python` verifiers run untrusted Python in.
//!
//! A plain library linked into each plugin that needs it (two plugin `cdylib`s cannot depend on
//! each other). It holds:
//! - [`layers`]: the isolation layers, the Landlock ruleset and the seccomp programs;
//! - [`sandbox`]: one fresh sandboxed interpreter per run, every layer applied in `pre_exec`;
//! - [`fdio`]: pipes with deadlines toward sandboxed processes;
//! - [`probe`]: which layers this kernel allows, found once per interpreter by starting real
//!   sandboxes, [`check_layers`] (a missing layer refuses unless the config accepts it) and the
//!   [`notes`] a plugin reports at load;
//! - [`Semaphore`]: at most `max_parallel` runs at once across a verifier's threads.
//!
//! What stays in each plugin: its options, what it sends into the sandbox and how it reads back
//! a verdict (the code verifier's trusted evaluator, the python grader's result channel).

pub mod fdio;
pub mod layers;
pub mod sandbox;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::Duration;

use crate::layers::{Layer, LayerSet, PythonInfo};
use crate::sandbox::{Limits, Sandbox, Spawned, Stream, Termination};

/// What this host allows, found once per interpreter by starting real sandboxes.
#[derive(Debug)]
pub struct Probe {
    /// The interpreter's answer, or why it could not be asked.
    pub python: Result<PythonInfo, String>,
    /// Landlock ABI version, 0 when absent.
    pub landlock_abi: i32,
    /// Layers a sandboxed `python -c pass` started under.
    pub available: LayerSet,
    /// Why each missing layer is missing.
    pub missing: Vec<(Layer, String)>,
    /// The seccomp programs, when they could be built.
    pub seccomp: Result<Vec<Vec<libc::sock_filter>>, String>,
}

// Plain data (the BPF programs).
unsafe impl Send for Probe {}
unsafe impl Sync for Probe {}

impl Probe {
    /// The read-only paths for `python`, plus `extra`.
    pub fn read_paths(&self, extra: &[PathBuf]) -> Vec<PathBuf> {
        let mut paths: Vec<PathBuf> = layers::SYSTEM_READ_PATHS.iter().map(PathBuf::from).collect();
        if let Ok(info) = &self.python {
            paths.extend(info.paths.iter().cloned());
        }
        paths.extend(extra.iter().cloned());
        paths.retain(|path| path.exists());
        paths.sort();
        paths.dedup();
        paths
    }
}

/// Probes `python` once per process and interpreter.
pub fn probe(python: &Path) -> Arc<Probe> {
    static PROBES: OnceLock<Mutex<BTreeMap<PathBuf, Arc<Probe>>>> = OnceLock::new();
    let probes = PROBES.get_or_init(Default::default);
    let mut probes = probes.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    probes.entry(python.to_owned()).or_insert_with(|| Arc::new(run_probe(python))).clone()
}

fn run_probe(python: &Path) -> Probe {
    let python_info = layers::python_info(python);
    let landlock_abi = layers::landlock_abi();
    let seccomp = layers::seccomp_programs();
    let mut probe = Probe {
        python: python_info,
        landlock_abi,
        available: LayerSet::default(),
        missing: Vec::new(),
        seccomp,
    };
    if let Err(error) = &probe.python {
        probe.missing = Layer::ALL.iter().map(|&layer| (layer, error.clone())).collect();
        return probe;
    }
    let read_paths = probe.read_paths(&[]);
    let try_layers = |layers: LayerSet| -> Result<(), String> {
        let sandbox = Sandbox {
            python: python.to_owned(),
            layers,
            limits: probe_limits(),
            read_paths: read_paths.clone(),
            landlock_abi,
            seccomp: probe.seccomp.clone().unwrap_or_default(),
        };
        start_trivial(&sandbox)
    };
    let user = try_layers(LayerSet::default().with(Layer::UserNamespace));
    let base =
        if user.is_ok() { LayerSet::default().with(Layer::UserNamespace) } else { LayerSet::default() };
    for layer in Layer::ALL {
        let result = match layer {
            Layer::UserNamespace => user.clone(),
            Layer::LandlockFs | Layer::LandlockNet | Layer::LandlockScopes => {
                let needed = match layer {
                    Layer::LandlockFs => 1,
                    Layer::LandlockNet => 4,
                    _ => 6,
                };
                if landlock_abi < needed {
                    Err(format!("needs Landlock ABI {needed}, the kernel has {landlock_abi}"))
                } else {
                    try_layers(LayerSet::default().with(Layer::LandlockFs).with(layer))
                }
            }
            Layer::Seccomp => match &probe.seccomp {
                Err(error) => Err(error.clone()),
                Ok(_) => try_layers(LayerSet::default().with(Layer::Seccomp)),
            },
            namespace => try_layers(base.with(namespace)),
        };
        match result {
            Ok(()) => probe.available = probe.available.with(layer),
            Err(error) => probe.missing.push((layer, error)),
        }
    }
    probe
}

fn probe_limits() -> Limits {
    Limits { cpu_seconds: 5, address_space: 1 << 30, processes: 32, file_size: 1 << 20, open_files: 64 }
}

/// Starts `python -c pass` in `sandbox` and checks it exits 0.
fn start_trivial(sandbox: &Sandbox) -> Result<(), String> {
    let workdir = tempfile::Builder::new()
        .prefix("rlvr-sandbox-probe-")
        .tempdir()
        .map_err(|error| format!("cannot create a probe directory: {error}"))?;
    let mut child: Spawned = sandbox
        .spawn(
            workdir.path(),
            &["-S", "-s", "-c", "pass"],
            Stream::Null,
            Stream::Null,
            Stream::Null,
            [None, None],
        )
        .map_err(|error| format!("cannot start a sandboxed python: {error}"))?;
    match child.finish(Duration::from_secs(5)) {
        Termination::Exited(0) => Ok(()),
        other => Err(format!("a sandboxed `python -c pass` ended with {other:?}")),
    }
}

/// A counting semaphore: at most `max_parallel` runs at once across threads.
#[derive(Debug)]
pub struct Semaphore {
    free: Mutex<usize>,
    freed: Condvar,
}

impl Semaphore {
    /// A semaphore with `permits` free.
    pub fn new(permits: usize) -> Self {
        Semaphore { free: Mutex::new(permits), freed: Condvar::new() }
    }

    /// Waits for a free permit; it is given back when the [`Permit`] drops.
    pub fn acquire(&self) -> Permit<'_> {
        let mut free = self.free.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        while *free == 0 {
            free = self.freed.wait(free).unwrap_or_else(|poisoned| poisoned.into_inner());
        }
        *free -= 1;
        Permit(self)
    }
}

/// A held permit of a [`Semaphore`].
pub struct Permit<'a>(&'a Semaphore);

impl Drop for Permit<'_> {
    fn drop(&mut self) {
        *self.0.free.lock().unwrap_or_else(|poisoned| poisoned.into_inner()) += 1;
        self.0.freed.notify_one();
    }
}

/// Which layers a run uses, or why the verifier refuses: every missing layer must be accepted.
pub fn check_layers(available: LayerSet, allowed_missing: LayerSet) -> Result<LayerSet, String> {
    let missing = LayerSet::all().minus(available);
    let refused = missing.minus(allowed_missing);
    if refused.is_empty() {
        Ok(missing)
    } else {
        Err(format!(
            "allow_missing_layers: the kernel lacks {} and the config does not accept running \
             untrusted code without them (expected these names in allow_missing_layers to accept weaker \
             isolation)",
            refused.names()
        ))
    }
}

/// What a plugin reports at load about `python` and this host's isolation layers (`rlvrd` logs
/// them, `rlvrctl plugins` shows them).
pub fn notes(python: &Path) -> Vec<String> {
    let probe = probe(python);
    let mut notes = Vec::new();
    match &probe.python {
        Ok(info) => notes.push(format!("python: {} ({})", python.display(), info.version)),
        Err(error) => notes.push(error.clone()),
    }
    notes.push(format!("isolation layers available: {}", probe.available.names()));
    for (layer, why) in &probe.missing {
        notes.push(format!(
            "isolation layer {layer} unavailable: {why}; jobs are refused unless their config lists it \
             in allow_missing_layers"
        ));
    }
    notes.push(format!("landlock ABI {}", probe.landlock_abi));
    if Sandbox::running_as_root() {
        notes.push(format!("running as root: sandboxed processes drop to uid {}", sandbox::NOBODY));
    }
    notes
}

#[cfg(test)]
mod tests {
    use super::*;

    /// (available, accepted missing, the missing layers run without or the refusal)
    type PolicyCase<'a> = (&'a [Layer], &'a [Layer], Result<&'a str, &'a str>);

    fn check_policy(available: &[Layer], allowed: &[Layer], expected: Result<&str, &str>) {
        let available: LayerSet = available.iter().copied().collect();
        let allowed: LayerSet = allowed.iter().copied().collect();
        let got = check_layers(available, allowed).map(LayerSet::names);
        match (&got, expected) {
            (Ok(missing), Ok(expected)) => assert_eq!(missing, expected),
            (Err(message), Err(expected)) => assert!(message.contains(expected), "{message}"),
            _ => panic!("got {got:?}, expected {expected:?}"),
        }
    }

    #[test]
    fn a_missing_layer_refuses_unless_the_config_accepts_it() {
        let all = Layer::ALL;
        let no_landlock = [
            Layer::UserNamespace,
            Layer::PidNamespace,
            Layer::NetworkNamespace,
            Layer::MountNamespace,
            Layer::IpcNamespace,
            Layer::Seccomp,
        ];
        let landlock = [Layer::LandlockFs, Layer::LandlockNet, Layer::LandlockScopes];
        let cases: &[PolicyCase] = &[
            (&all, &[], Ok("none")),
            (&all, &[Layer::Seccomp], Ok("none")),
            (&no_landlock, &[], Err("the kernel lacks landlock_fs, landlock_net, landlock_scopes")),
            (&no_landlock, &[Layer::LandlockFs], Err("the kernel lacks landlock_net, landlock_scopes")),
            (&no_landlock, &landlock, Ok("landlock_fs, landlock_net, landlock_scopes")),
            (
                &[],
                &all,
                Ok(
                    "user_namespace, pid_namespace, network_namespace, mount_namespace, ipc_namespace, landlock_fs, landlock_net, landlock_scopes, seccomp",
                ),
            ),
        ];
        for (available, allowed, expected) in cases {
            check_policy(available, allowed, *expected);
        }
    }
}
