//! An `[env]` job's sidecar: the operator-installed environment (`env.environment`) the worker
//! starts for the job, in the sandbox the code and python graders use, serving OpenEnv on a Unix
//! socket in a work directory of its own. It has no network (a network namespace of its own,
//! Landlock's TCP rules), nothing of the file system but its interpreter and libraries, its
//! script's directory (read-only) and its work directory, no signals out; it dies with the worker
//! (`PR_SET_PDEATHSIG`, its PID namespace with it) and when dropped.
//!
//! Unlike a grader's sandbox it may make sockets (the seccomp layer, which kills a process that
//! calls `socket`, is left out): a server needs one to listen on, and what it could reach with one
//! is bounded by the other layers.

use std::fs;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use rlvr_sandbox_common::layers::{Layer, LayerSet};
use rlvr_sandbox_common::sandbox::{Limits, Sandbox, Spawned, Stream};

/// A running sidecar; killed, with everything it started, when dropped (`Spawned`'s drop).
pub struct Sidecar {
    spawned: Spawned,
    /// Its server's socket: the episodes' server is `unix:` and this path.
    pub socket: PathBuf,
    /// Its stdout and stderr.
    pub log: PathBuf,
    /// The sandbox's layers it runs under.
    pub layers: String,
}

/// What a sidecar may use: enough for a Python web server and its environments, bounded.
const LIMITS: Limits = Limits {
    // A sidecar lives as long as its job.
    cpu_seconds: 7 * 24 * 3600,
    address_space: 8 << 30,
    // Threads count (a server's thread pool grows with its sessions, and RLIMIT_NPROC counts all
    // of `nobody`'s under a root daemon): 256 failed a step's 256 sessions in the examples' story.
    processes: 4096,
    file_size: 256 << 20,
    open_files: 4096,
};

/// The socket's name in the work directory (relative: the sidecar starts there).
const SOCKET: &str = "env.sock";

impl Sidecar {
    /// Starts `python script --uds env.sock args...` in `workdir` (made afresh) and waits up to
    /// `wait` for its socket to take a connection.
    pub fn start(
        python: &Path,
        script: &Path,
        args: &[String],
        workdir: &Path,
        wait: Duration,
    ) -> Result<Sidecar, String> {
        let script_dir =
            script.parent().ok_or_else(|| format!("{}: not a script's path", script.display()))?;
        if workdir.exists() {
            fs::remove_dir_all(workdir).map_err(|error| format!("{}: {error}", workdir.display()))?;
        }
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(workdir)
            .map_err(|error| format!("{}: {error}", workdir.display()))?;
        let probe = rlvr_sandbox_common::probe(python);
        if let Err(error) = &probe.python {
            return Err(format!("the environments' python {}: {error}", python.display()));
        }
        let layers = probe.available.minus(LayerSet::default().with(Layer::Seccomp));
        let sandbox = Sandbox {
            python: python.to_owned(),
            layers,
            limits: LIMITS,
            read_paths: probe
                .read_paths(&[&[script_dir.to_owned(), prefix(python)?][..], &web_files()].concat()),
            landlock_abi: probe.landlock_abi,
            seccomp: Vec::new(),
        };
        let log = workdir.with_extension("log");
        let out = fs::File::create(&log).map_err(|error| format!("{}: {error}", log.display()))?;
        let err = out.try_clone().map_err(|error| format!("{}: {error}", log.display()))?;
        let mut argv = vec![script.to_string_lossy().into_owned(), "--uds".to_owned(), SOCKET.to_owned()];
        argv.extend(args.iter().cloned());
        let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
        let spawned = sandbox
            .spawn(
                workdir,
                &argv,
                Stream::Null,
                Stream::Pipe(out.into()),
                Stream::Pipe(err.into()),
                [None, None],
            )
            .map_err(|error| format!("cannot start the environment {}: {error}", script.display()))?;
        let mut sidecar = Sidecar { spawned, socket: workdir.join(SOCKET), log, layers: layers.names() };
        let started = Instant::now();
        loop {
            if std::os::unix::net::UnixStream::connect(&sidecar.socket).is_ok() {
                return Ok(sidecar);
            }
            if sidecar.spawned.has_ended() {
                return Err(format!(
                    "the environment {} ended before it served; {}",
                    script.display(),
                    sidecar.tail()
                ));
            }
            if started.elapsed() > wait {
                return Err(format!(
                    "the environment {} did not serve within {} s; {}",
                    script.display(),
                    wait.as_secs(),
                    sidecar.tail()
                ));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The server the episodes connect to.
    pub fn server(&self) -> String {
        format!("{}{}", rlvr_env::openenv::UNIX, self.socket.display())
    }

    /// The last lines of its log, for an error.
    fn tail(&self) -> String {
        let text = fs::read_to_string(&self.log).unwrap_or_default();
        let last: Vec<&str> = text.lines().rev().take(5).collect();
        let last: Vec<&str> = last.into_iter().rev().collect();
        format!("its log {} ends: {}", self.log.display(), last.join(" | "))
    }
}

/// `python`'s `sys.prefix`: its venv, whose packages (OpenEnv's server among them) the sidecar
/// reads. The probe's paths are the interpreter's alone (it asks with `-S`).
fn prefix(python: &Path) -> Result<PathBuf, String> {
    let output = std::process::Command::new(python)
        .args(["-c", "import sys; print(sys.prefix)"])
        .env_clear()
        .stdin(std::process::Stdio::null())
        .output()
        .map_err(|error| format!("the environments' python {}: {error}", python.display()))?;
    let prefix = String::from_utf8_lossy(&output.stdout).trim().to_owned();
    match output.status.success() && !prefix.is_empty() {
        true => Ok(PathBuf::from(prefix)),
        false => Err(format!(
            "the environments' python {} did not say its prefix: {}",
            python.display(),
            String::from_utf8_lossy(&output.stderr).trim()
        )),
    }
}

/// What a Python web server reads of the system beyond the sandbox's own list (`mimetypes`, name
/// lookups of its own host), read-only; those that exist.
fn web_files() -> Vec<PathBuf> {
    [
        "/etc/mime.types",
        "/etc/hosts",
        "/etc/nsswitch.conf",
        "/etc/host.conf",
        "/etc/gai.conf",
        "/usr/share/mime",
    ]
    .iter()
    .map(PathBuf::from)
    .collect()
}
