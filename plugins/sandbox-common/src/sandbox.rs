//! The sandboxed child: one fresh process per run, wrapped in every isolation layer available.
//!
//! Layers, applied in the forked child before `exec` (see [`child_setup`]):
//! 1. a throw-away working directory, a cleared environment, its own process group;
//! 2. when running as root, the uid/gid drop to `nobody` (65534);
//! 3. new user, mount, network, IPC, UTS and PID namespaces (one `unshare`); the uid inside is
//!    1000, so `exec` drops every capability the new namespace granted;
//! 4. with a PID namespace, a second fork: the solution is PID 1 of its namespace, so killing it
//!    kills everything it started, and the process between (the "reaper", our own code, never
//!    sandboxed code) reports its wait status over a pipe the solution does not hold;
//! 5. rlimits (CPU, address space, processes, file size, open files, no core dumps);
//! 6. `no_new_privs`, then Landlock (read-only interpreter and libraries, read-write work
//!    directory, nothing else; no TCP; no signals or abstract sockets out of the domain);
//! 7. seccomp (no sockets, ptrace, mounts, namespaces, kernel modules, io_uring, bpf, ...).
//!
//! Everything the child needs (the Landlock ruleset fd, the BPF programs, the uid map lines) is
//! built before `fork`: after it, in a copy of a multi-threaded process, only async-signal-safe
//! raw system calls run — no allocation, no locks. Why `pre_exec` rather than a separate launcher
//! binary: a plugin is one `.so` that the daemon copies to a content-addressed name, so a helper
//! binary shipped beside it could not be found reliably, nor be pinned to the plugin's version.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::fdio;
use crate::layers::{Layer, LayerSet};

/// Resource limits of one sandboxed process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// CPU seconds (`RLIMIT_CPU`); the wall-clock timeout is enforced separately.
    pub cpu_seconds: u64,
    /// Address space in bytes (`RLIMIT_AS`).
    pub address_space: u64,
    /// Processes and threads (`RLIMIT_NPROC`).
    pub processes: u64,
    /// Largest file it may write, bytes (`RLIMIT_FSIZE`).
    pub file_size: u64,
    /// Open file descriptors (`RLIMIT_NOFILE`).
    pub open_files: u64,
}

/// What stays the same across runs: the interpreter, the layers, the limits and the filters.
#[derive(Debug)]
pub struct Sandbox {
    /// The interpreter.
    pub python: PathBuf,
    /// The layers to apply; the caller checked they are available.
    pub layers: LayerSet,
    /// Limits of every child.
    pub limits: Limits,
    /// Paths the child may read and execute (interpreter, standard library, shared libraries).
    pub read_paths: Vec<PathBuf>,
    /// The kernel's Landlock ABI version (0 when absent).
    pub landlock_abi: i32,
    /// The seccomp programs, installed in order.
    pub seccomp: Vec<Vec<libc::sock_filter>>,
}

// The BPF programs are plain data; `sock_filter` is only missing the auto traits because it comes
// from `libc`.
unsafe impl Send for Sandbox {}
unsafe impl Sync for Sandbox {}

/// Where the child's standard streams go.
#[derive(Debug)]
pub enum Stream {
    /// `/dev/null`.
    Null,
    /// One end of a pipe; the other end stays with the caller.
    Pipe(OwnedFd),
}

/// The child's fds besides 0, 1 and 2.
pub const REQUEST_FD: RawFd = 3;
/// The fd the child answers on.
pub const REPLY_FD: RawFd = 4;
/// The fd the reaper reports the solution's wait status on (never the solution's).
const STATUS_FD: RawFd = 5;

/// One spawned sandbox. Dropping it kills everything inside.
#[derive(Debug)]
pub struct Spawned {
    child: Child,
    /// Read end of the reaper's status pipe, when there is a reaper (PID namespace).
    status: Option<OwnedFd>,
    finished: Option<Termination>,
    /// Set once [`Spawned::kill`] ran, so a termination by our own SIGKILL is not blamed on the
    /// solution.
    killed: bool,
}

/// How the sandboxed process ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Termination {
    /// It exited with a code (never trusted for a verdict).
    Exited(i32),
    /// A signal ended it.
    Signaled(i32),
    /// It did not end by itself: we killed it, or its status could not be read.
    #[default]
    Killed,
}

impl Termination {
    fn from_wait_status(status: i32) -> Self {
        if libc::WIFEXITED(status) {
            Termination::Exited(libc::WEXITSTATUS(status))
        } else if libc::WIFSIGNALED(status) {
            Termination::Signaled(libc::WTERMSIG(status))
        } else {
            Termination::Killed
        }
    }

    /// A seccomp filter killed it: an attempted forbidden system call.
    pub fn seccomp_violation(self) -> bool {
        self == Termination::Signaled(libc::SIGSYS)
    }

    /// The CPU limit ended it.
    pub fn cpu_limit(self) -> bool {
        self == Termination::Signaled(libc::SIGXCPU)
    }
}

/// Everything the forked child reads: raw values only, prepared before `fork`.
struct ChildPlan {
    /// (source, target) pairs for `dup2`; sources are all above the targets.
    fd_map: Vec<(RawFd, RawFd)>,
    /// Drop to this uid/gid first (when running as root).
    drop_to: Option<(libc::uid_t, libc::gid_t)>,
    /// `unshare` flags besides `CLONE_NEWUSER`.
    namespace_flags: libc::c_int,
    user_namespace: bool,
    uid_map: CString,
    gid_map: CString,
    pid_namespace: bool,
    limits: [(libc::__rlimit_resource_t, u64); 6],
    landlock_fd: RawFd,
    seccomp: Vec<libc::sock_fprog>,
    /// Keeps the fds of `fd_map`, the ruleset and the programs alive until after `fork`.
    _keep: Vec<OwnedFd>,
    _programs: Vec<Vec<libc::sock_filter>>,
}

// Raw pointers into `_programs`, which the plan owns.
unsafe impl Send for ChildPlan {}
unsafe impl Sync for ChildPlan {}

const PROC_SETGROUPS: &std::ffi::CStr = c"/proc/self/setgroups";
const PROC_UID_MAP: &std::ffi::CStr = c"/proc/self/uid_map";
const PROC_GID_MAP: &std::ffi::CStr = c"/proc/self/gid_map";
/// The uid and gid the solution has inside its user namespace: not 0, so `exec` clears every
/// capability the namespace granted.
const INNER_ID: u32 = 1000;
/// `nobody`, the uid a root host drops to.
pub const NOBODY: u32 = 65534;

impl Sandbox {
    /// Whether this process runs as root, in which case children drop to [`NOBODY`].
    pub fn running_as_root() -> bool {
        // SAFETY: geteuid has no preconditions.
        unsafe { libc::geteuid() == 0 }
    }

    /// Starts `args` under the interpreter in `workdir` with every layer of `self.layers`.
    /// `extra` are pipe ends the child gets as fds 3 and 4.
    pub fn spawn(
        &self,
        workdir: &Path,
        args: &[&str],
        stdin: Stream,
        stdout: Stream,
        stderr: Stream,
        extra: [Option<OwnedFd>; 2],
    ) -> io::Result<Spawned> {
        let layers = self.layers;
        let mut keep = Vec::new();
        let mut fd_map = Vec::new();
        for (fd, target) in extra.into_iter().zip([REQUEST_FD, REPLY_FD]) {
            if let Some(fd) = fd {
                let high = fdio::dup_high(&fd)?;
                fd_map.push((high.as_raw_fd(), target));
                keep.push(high);
            }
        }
        let pid_namespace = layers.contains(Layer::PidNamespace);
        let status = if pid_namespace {
            let (read, write) = fdio::pipe()?;
            let high = fdio::dup_high(&write)?;
            fd_map.push((high.as_raw_fd(), STATUS_FD));
            keep.push(high);
            Some(read)
        } else {
            None
        };
        let landlock_fd = if layers.contains(Layer::LandlockFs) {
            let ruleset =
                crate::layers::landlock_ruleset(self.landlock_abi, layers, &self.read_paths, workdir)?;
            // Above the fds the child's `dup2`s write, as the pipes are: a ruleset that the kernel
            // numbered 3, 4 or 5 would be replaced by a pipe before `landlock_restrict_self`
            // reads it (EBADFD, seen in parallel runs).
            let fd = fdio::dup_high(&ruleset)?;
            let raw = fd.as_raw_fd();
            keep.push(fd);
            raw
        } else {
            -1
        };
        let root = Self::running_as_root();
        let drop_to = root.then_some((NOBODY, NOBODY));
        if let Some((uid, gid)) = drop_to {
            std::os::unix::fs::chown(workdir, Some(uid), Some(gid))?;
        }
        // SAFETY: getuid/getgid have no preconditions.
        let (outer_uid, outer_gid) = drop_to.unwrap_or_else(|| unsafe { (libc::geteuid(), libc::getegid()) });
        let mut namespace_flags = 0;
        for (layer, flag) in [
            (Layer::MountNamespace, libc::CLONE_NEWNS),
            (Layer::NetworkNamespace, libc::CLONE_NEWNET),
            (Layer::IpcNamespace, libc::CLONE_NEWIPC | libc::CLONE_NEWUTS),
            (Layer::PidNamespace, libc::CLONE_NEWPID),
        ] {
            if layers.contains(layer) {
                namespace_flags |= flag;
            }
        }
        let programs = if layers.contains(Layer::Seccomp) { self.seccomp.clone() } else { Vec::new() };
        let seccomp = programs
            .iter()
            .map(|program| libc::sock_fprog {
                len: u16::try_from(program.len()).unwrap_or(u16::MAX),
                filter: program.as_ptr().cast_mut(),
            })
            .collect();
        let limits = &self.limits;
        let plan = ChildPlan {
            fd_map,
            drop_to,
            namespace_flags,
            user_namespace: layers.contains(Layer::UserNamespace),
            uid_map: CString::new(format!("{INNER_ID} {outer_uid} 1")).expect("no nul"),
            gid_map: CString::new(format!("{INNER_ID} {outer_gid} 1")).expect("no nul"),
            pid_namespace,
            limits: [
                (libc::RLIMIT_CPU, limits.cpu_seconds),
                (libc::RLIMIT_AS, limits.address_space),
                (libc::RLIMIT_NPROC, limits.processes),
                (libc::RLIMIT_FSIZE, limits.file_size),
                (libc::RLIMIT_NOFILE, limits.open_files),
                (libc::RLIMIT_CORE, 0),
            ],
            landlock_fd,
            seccomp,
            _keep: keep,
            _programs: programs,
        };

        let mut command = Command::new(&self.python);
        command
            .args(args)
            .env_clear()
            // Fixed hash seed: set and dict-of-str iteration orders, and so outputs, repeat.
            .env("PYTHONHASHSEED", "0")
            .env("PYTHONIOENCODING", "utf-8")
            .env("PYTHONDONTWRITEBYTECODE", "1")
            .env("LANG", "C.UTF-8")
            .env("PATH", "/usr/bin:/bin")
            .env("HOME", workdir)
            .current_dir(workdir)
            .stdin(stdio(stdin)?)
            .stdout(stdio(stdout)?)
            .stderr(stdio(stderr)?)
            .process_group(0);
        // SAFETY: `child_setup` only makes async-signal-safe system calls on data prepared above.
        unsafe {
            command.pre_exec(move || child_setup(&plan));
        }
        let child = command.spawn()?;
        // `command` (and with it the plan's copies of the child's fds) is dropped here.
        drop(command);
        Ok(Spawned { child, status, finished: None, killed: false })
    }
}

fn stdio(stream: Stream) -> io::Result<Stdio> {
    Ok(match stream {
        Stream::Null => Stdio::null(),
        Stream::Pipe(fd) => Stdio::from(fd),
    })
}

impl Spawned {
    /// Kills everything in the sandbox: the process group of the direct child, and with it (by
    /// `PR_SET_PDEATHSIG` and the PID namespace) every process the solution started.
    pub fn kill(&mut self) {
        if self.finished.is_some() {
            // Reaped: the pid may belong to someone else by now.
            return;
        }
        self.killed = true;
        let pid = self.child.id() as libc::pid_t;
        // SAFETY: plain kill(2); the child is not reaped yet (we hold it), so the pid is ours.
        unsafe {
            libc::kill(-pid, libc::SIGKILL);
            libc::kill(pid, libc::SIGKILL);
        }
    }

    /// Whether the sandbox's direct child has ended (a long-running sandbox's early death).
    pub fn has_ended(&mut self) -> bool {
        self.finished.is_some() || matches!(self.child.try_wait(), Ok(Some(_)))
    }

    /// Waits up to `grace` for the solution to end by itself and returns how it ended. Call it
    /// when the solution seems gone (its pipes closed); a process still running then is killed
    /// and reported as [`Termination::Killed`].
    pub fn finish(&mut self, grace: Duration) -> Termination {
        if let Some(finished) = self.finished {
            return finished;
        }
        let deadline = Instant::now() + grace;
        let termination = match self.status.take() {
            Some(status) => {
                let mut bytes = [0u8; 4];
                match fdio::read_exact_until(&status, &mut bytes, deadline) {
                    Ok(()) => Termination::from_wait_status(i32::from_ne_bytes(bytes)),
                    Err(_) => Termination::Killed,
                }
            }
            None => loop {
                match self.child.try_wait() {
                    Ok(Some(status)) => {
                        use std::os::unix::process::ExitStatusExt;
                        break match (status.code(), status.signal()) {
                            (Some(code), _) => Termination::Exited(code),
                            (None, Some(signal)) => Termination::Signaled(signal),
                            _ => Termination::Killed,
                        };
                    }
                    Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(1)),
                    _ => break Termination::Killed,
                }
            },
        };
        let termination = if self.killed { Termination::Killed } else { termination };
        self.kill();
        let _ = self.child.wait();
        self.finished = Some(termination);
        termination
    }
}

impl Drop for Spawned {
    fn drop(&mut self) {
        if self.finished.is_none() {
            self.kill();
            let _ = self.child.wait();
        }
    }
}

/// Runs in the forked child, before `exec`. Async-signal-safe: raw system calls on `plan` only.
fn child_setup(plan: &ChildPlan) -> io::Result<()> {
    // SAFETY: every call below is a plain system call on values owned by `plan`, which outlives
    // the call (the closure owns it until exec).
    unsafe {
        // The sandbox must never outlive the thread that runs it.
        check(libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong, 0, 0, 0))?;
        for &(source, target) in &plan.fd_map {
            check(libc::dup2(source, target))?;
        }
        if !plan.user_namespace && plan.namespace_flags != 0 {
            // Without a user namespace only root may unshare, so do it before the drop.
            check(libc::unshare(plan.namespace_flags))?;
        }
        if let Some((uid, gid)) = plan.drop_to {
            check(libc::syscall(libc::SYS_setgroups, 0, std::ptr::null::<libc::gid_t>()) as libc::c_int)?;
            check(libc::syscall(libc::SYS_setresgid, gid, gid, gid) as libc::c_int)?;
            check(libc::syscall(libc::SYS_setresuid, uid, uid, uid) as libc::c_int)?;
            // A uid change makes the process undumpable, which makes /proc/self/uid_map root's.
            check(libc::prctl(libc::PR_SET_DUMPABLE, 1, 0, 0, 0))?;
        }
        if plan.user_namespace {
            check(libc::unshare(libc::CLONE_NEWUSER | plan.namespace_flags))?;
            write_file(PROC_SETGROUPS, b"deny")?;
            write_file(PROC_UID_MAP, plan.uid_map.as_bytes())?;
            write_file(PROC_GID_MAP, plan.gid_map.as_bytes())?;
        }
        // Again: a change of credentials (the drop to `nobody`, the user namespace) clears the
        // parent-death signal, and without it a sandbox started by root outlived a killed host.
        check(libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong, 0, 0, 0))?;
        if plan.pid_namespace {
            // The first child of the unshared PID namespace becomes its PID 1.
            let pid = libc::syscall(libc::SYS_clone, libc::SIGCHLD as libc::c_ulong, 0, 0, 0, 0);
            if pid < 0 {
                return Err(io::Error::last_os_error());
            }
            if pid > 0 {
                reap(pid as libc::pid_t);
            }
            check(libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong, 0, 0, 0))?;
            libc::close(STATUS_FD);
            // Its own session: kill(0, ...) from the solution reaches nothing outside.
            libc::setsid();
        }
        for &(resource, value) in &plan.limits {
            let limit = libc::rlimit { rlim_cur: value, rlim_max: value };
            check(libc::setrlimit(resource, &limit))?;
        }
        check(libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0))?;
        if plan.landlock_fd >= 0 {
            check(libc::syscall(libc::SYS_landlock_restrict_self, plan.landlock_fd, 0) as libc::c_int)?;
        }
        for program in &plan.seccomp {
            check(libc::syscall(
                libc::SYS_seccomp,
                libc::SECCOMP_SET_MODE_FILTER,
                0,
                program as *const libc::sock_fprog,
            ) as libc::c_int)?;
        }
        close_inherited_fds(&plan.fd_map);
    }
    Ok(())
}

/// Fds the host process did not open close-on-exec (a shell's, a library's: a GPU driver's
/// device, a log pipe) must not reach the solution: everything from [`STATUS_FD`] up is marked
/// close-on-exec, or closed where the kernel lacks that flag (before 5.11); so are fds 3 and 4
/// when this run does not give the child one there (io runs have no reply fd).
unsafe fn close_inherited_fds(fd_map: &[(RawFd, RawFd)]) {
    let first = STATUS_FD as libc::c_uint;
    // SAFETY: fcntl, close_range and close on fds of this process only; the fds it still needs
    // before `exec` (the ruleset, the programs' data) are not used after this point.
    unsafe {
        for fd in [REQUEST_FD, REPLY_FD] {
            if !fd_map.iter().any(|&(_, target)| target == fd) {
                libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC);
            }
        }
        if libc::syscall(libc::SYS_close_range, first, libc::c_uint::MAX, libc::CLOSE_RANGE_CLOEXEC) == 0 {
            return;
        }
        if libc::syscall(libc::SYS_close_range, first, libc::c_uint::MAX, 0) == 0 {
            return;
        }
        for fd in first..(1 << 16) {
            libc::close(fd as libc::c_int);
        }
    }
}

/// The reaper: closes everything but the status pipe, waits for the solution, reports its wait
/// status, and exits. Never returns.
unsafe fn reap(pid: libc::pid_t) -> ! {
    // SAFETY: raw system calls only; the fds closed are this process's own copies.
    unsafe {
        // Copies of the host's fds (other runs' pipes among them) must not be held open here.
        libc::syscall(libc::SYS_close_range, 0, STATUS_FD - 1, 0);
        libc::syscall(libc::SYS_close_range, STATUS_FD + 1, libc::c_uint::MAX, 0);
        let mut status: libc::c_int = 0;
        loop {
            let waited = libc::waitpid(pid, &mut status, 0);
            if waited == pid {
                break;
            }
            if waited < 0 && *libc::__errno_location() != libc::EINTR {
                libc::_exit(1);
            }
        }
        let bytes = status.to_ne_bytes();
        libc::write(STATUS_FD, bytes.as_ptr().cast(), bytes.len());
        libc::_exit(0)
    }
}

unsafe fn write_file(path: &std::ffi::CStr, data: &[u8]) -> io::Result<()> {
    // SAFETY: `path` is nul-terminated; `data` is valid for its length.
    unsafe {
        let fd = libc::open(path.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        let written = libc::write(fd, data.as_ptr().cast(), data.len());
        let error = io::Error::last_os_error();
        libc::close(fd);
        if written != data.len() as isize {
            return Err(error);
        }
    }
    Ok(())
}

fn check(result: libc::c_int) -> io::Result<()> {
    if result < 0 { Err(io::Error::last_os_error()) } else { Ok(()) }
}
