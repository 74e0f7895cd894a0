//! The isolation layers: what each is, how to tell whether the kernel allows it, and the
//! Landlock ruleset and seccomp filters the sandbox installs.

use std::collections::BTreeMap;
use std::fmt;
use std::io;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

use landlock::{
    ABI, Access, AccessFs, AccessNet, CompatLevel, Compatible, PathBeneath, PathFd, Ruleset, RulesetAttr,
    RulesetCreatedAttr, Scope, path_beneath_rules,
};
use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter, SeccompRule,
    TargetArch,
};
use serde::Deserialize;

/// One isolation layer the kernel may or may not allow. Resource limits, the throw-away
/// directory and the wall-clock timeout are always there and are not listed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Layer {
    /// A user namespace: uid 1000 inside, no capabilities after `exec`.
    UserNamespace,
    /// A PID namespace: the solution is PID 1; killing it ends all it started.
    PidNamespace,
    /// A network namespace: no interface but a down loopback.
    NetworkNamespace,
    /// A private mount namespace.
    MountNamespace,
    /// Private IPC (System V, POSIX queues) and UTS namespaces.
    IpcNamespace,
    /// Landlock file-system rules: read-only interpreter and libraries, the work dir, nothing else.
    LandlockFs,
    /// Landlock network rules (ABI 4): no TCP bind or connect.
    LandlockNet,
    /// Landlock scopes (ABI 6): no signals and no abstract unix sockets out of the sandbox.
    LandlockScopes,
    /// A seccomp filter: no sockets, ptrace, mounts, namespaces, modules, io_uring, bpf, ...
    Seccomp,
}

impl Layer {
    /// Every layer, in the order they are reported.
    pub const ALL: [Layer; 9] = [
        Layer::UserNamespace,
        Layer::PidNamespace,
        Layer::NetworkNamespace,
        Layer::MountNamespace,
        Layer::IpcNamespace,
        Layer::LandlockFs,
        Layer::LandlockNet,
        Layer::LandlockScopes,
        Layer::Seccomp,
    ];

    /// The name used in configs and notes.
    pub fn name(self) -> &'static str {
        match self {
            Layer::UserNamespace => "user_namespace",
            Layer::PidNamespace => "pid_namespace",
            Layer::NetworkNamespace => "network_namespace",
            Layer::MountNamespace => "mount_namespace",
            Layer::IpcNamespace => "ipc_namespace",
            Layer::LandlockFs => "landlock_fs",
            Layer::LandlockNet => "landlock_net",
            Layer::LandlockScopes => "landlock_scopes",
            Layer::Seccomp => "seccomp",
        }
    }

    fn bit(self) -> u16 {
        1 << (self as u16)
    }
}

impl fmt::Display for Layer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A set of layers.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LayerSet(u16);

impl LayerSet {
    /// Every layer.
    pub fn all() -> Self {
        Layer::ALL.into_iter().collect()
    }

    /// Whether `layer` is in the set.
    pub fn contains(self, layer: Layer) -> bool {
        self.0 & layer.bit() != 0
    }

    /// The set with `layer` added.
    pub fn with(self, layer: Layer) -> Self {
        LayerSet(self.0 | layer.bit())
    }

    /// The layers of `self` that are not in `other`.
    pub fn minus(self, other: LayerSet) -> Self {
        LayerSet(self.0 & !other.0)
    }

    /// Whether the set is empty.
    pub fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// The layers, in report order.
    pub fn iter(self) -> impl Iterator<Item = Layer> {
        Layer::ALL.into_iter().filter(move |layer| self.contains(*layer))
    }

    /// Comma-separated names, or `none`.
    pub fn names(self) -> String {
        if self.is_empty() {
            return "none".to_owned();
        }
        self.iter().map(Layer::name).collect::<Vec<_>>().join(", ")
    }
}

impl FromIterator<Layer> for LayerSet {
    fn from_iter<T: IntoIterator<Item = Layer>>(iter: T) -> Self {
        iter.into_iter().fold(LayerSet::default(), LayerSet::with)
    }
}

/// The kernel's Landlock ABI version, 0 when Landlock is absent or disabled.
pub fn landlock_abi() -> i32 {
    const LANDLOCK_CREATE_RULESET_VERSION: libc::c_uint = 1;
    // SAFETY: the documented version query: null attributes, size 0, the version flag.
    let version = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<u8>(),
            0usize,
            LANDLOCK_CREATE_RULESET_VERSION,
        )
    };
    i32::try_from(version).unwrap_or(0).max(0)
}

/// A Landlock ruleset for one run, as an fd the child passes to `landlock_restrict_self`:
/// read and execute beneath `read_paths`, everything beneath `workdir`, and (as `layers` say) no
/// TCP and no signals or abstract sockets out of the domain.
pub fn landlock_ruleset(
    abi: i32,
    layers: LayerSet,
    read_paths: &[PathBuf],
    workdir: &Path,
) -> io::Result<OwnedFd> {
    let abi = ABI::from(abi);
    let to_io = |error: landlock::RulesetError| io::Error::other(format!("landlock: {error}"));
    let mut ruleset = Ruleset::default()
        .set_compatibility(CompatLevel::HardRequirement)
        .handle_access(AccessFs::from_all(abi))
        .map_err(to_io)?;
    if layers.contains(Layer::LandlockNet) {
        ruleset = ruleset.handle_access(AccessNet::from_all(abi)).map_err(to_io)?;
    }
    if layers.contains(Layer::LandlockScopes) {
        ruleset = ruleset.scope(Scope::from_all(abi)).map_err(to_io)?;
    }
    let workdir_fd = PathFd::new(workdir).map_err(|error| io::Error::other(format!("landlock: {error}")))?;
    let created = ruleset
        .create()
        .map_err(to_io)?
        .add_rules(path_beneath_rules(read_paths, AccessFs::from_read(abi)))
        .map_err(to_io)?
        .add_rule(PathBeneath::new(workdir_fd, AccessFs::from_all(abi)))
        .map_err(to_io)?;
    Option::<OwnedFd>::from(created).ok_or_else(|| io::Error::other("landlock: no ruleset fd"))
}

/// System calls that kill the sandboxed process (seccomp `KILL_PROCESS`), so an attempt is seen
/// by the host as a SIGSYS death and reported as `unsafe`.
///
/// `socketpair` stays allowed: it only connects a process to itself (asyncio's event loop uses
/// one), and the network namespace and Landlock scopes leave nothing to reach anyway.
const KILLED_SYSCALLS: &[libc::c_long] = &[
    libc::SYS_socket,
    libc::SYS_ptrace,
    libc::SYS_process_vm_readv,
    libc::SYS_process_vm_writev,
    libc::SYS_pidfd_getfd,
    libc::SYS_kcmp,
    libc::SYS_mount,
    libc::SYS_umount2,
    libc::SYS_pivot_root,
    libc::SYS_chroot,
    libc::SYS_fsopen,
    libc::SYS_fsmount,
    libc::SYS_fspick,
    libc::SYS_move_mount,
    libc::SYS_open_tree,
    libc::SYS_mount_setattr,
    libc::SYS_unshare,
    libc::SYS_setns,
    libc::SYS_init_module,
    libc::SYS_finit_module,
    libc::SYS_delete_module,
    libc::SYS_kexec_load,
    libc::SYS_kexec_file_load,
    libc::SYS_bpf,
    libc::SYS_perf_event_open,
    libc::SYS_userfaultfd,
    libc::SYS_keyctl,
    libc::SYS_add_key,
    libc::SYS_request_key,
    libc::SYS_io_uring_setup,
    libc::SYS_io_uring_enter,
    libc::SYS_io_uring_register,
    libc::SYS_open_by_handle_at,
    libc::SYS_name_to_handle_at,
    libc::SYS_acct,
    libc::SYS_swapon,
    libc::SYS_swapoff,
    libc::SYS_reboot,
    libc::SYS_syslog,
    libc::SYS_settimeofday,
    libc::SYS_clock_settime,
    libc::SYS_clock_adjtime,
    libc::SYS_adjtimex,
    libc::SYS_quotactl,
    libc::SYS_fanotify_init,
    libc::SYS_vhangup,
    #[cfg(target_arch = "x86_64")]
    libc::SYS_iopl,
    #[cfg(target_arch = "x86_64")]
    libc::SYS_ioperm,
];

/// `clone` flags that would create namespaces: a sandboxed process creates none.
const NAMESPACE_CLONE_FLAGS: [u64; 7] = [
    libc::CLONE_NEWUSER as u64,
    libc::CLONE_NEWNS as u64,
    libc::CLONE_NEWNET as u64,
    libc::CLONE_NEWPID as u64,
    libc::CLONE_NEWIPC as u64,
    libc::CLONE_NEWUTS as u64,
    libc::CLONE_NEWCGROUP as u64,
];

fn target_arch() -> Option<TargetArch> {
    if cfg!(target_arch = "x86_64") {
        Some(TargetArch::x86_64)
    } else if cfg!(target_arch = "aarch64") {
        Some(TargetArch::aarch64)
    } else if cfg!(target_arch = "riscv64") {
        Some(TargetArch::riscv64)
    } else {
        None
    }
}

/// The seccomp programs, in installation order: `clone3` answers ENOSYS (its flags sit in memory
/// a filter cannot read, and libc then falls back to `clone`, whose flags it can), then the kill
/// list, including `clone` with any namespace flag.
pub fn seccomp_programs() -> Result<Vec<Vec<libc::sock_filter>>, String> {
    let arch = target_arch().ok_or("seccomp: no filter for this architecture")?;
    let to_string = |error: seccompiler::BackendError| format!("seccomp: {error}");
    let clone3 = SeccompFilter::new(
        BTreeMap::from([(libc::SYS_clone3, Vec::new())]),
        SeccompAction::Allow,
        SeccompAction::Errno(libc::ENOSYS as u32),
        arch,
    )
    .map_err(to_string)?;
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> =
        KILLED_SYSCALLS.iter().map(|&syscall| (syscall, Vec::new())).collect();
    let clone_rules = NAMESPACE_CLONE_FLAGS
        .iter()
        .map(|&flag| {
            SeccompCondition::new(0, SeccompCmpArgLen::Qword, SeccompCmpOp::MaskedEq(flag), flag)
                .and_then(|condition| SeccompRule::new(vec![condition]))
        })
        .collect::<Result<Vec<_>, _>>()
        .map_err(to_string)?;
    rules.insert(libc::SYS_clone, clone_rules);
    // A datagram socket can `sendto` any path-named socket on the host (the journal, /dev/log),
    // which neither the network namespace nor Landlock stops; a stream pair cannot reach past
    // itself. Other domains are not needed.
    let socketpair_rules = [
        SeccompCondition::new(0, SeccompCmpArgLen::Dword, SeccompCmpOp::Ne, libc::AF_UNIX as u64),
        SeccompCondition::new(
            1,
            SeccompCmpArgLen::Dword,
            SeccompCmpOp::MaskedEq(0xf),
            libc::SOCK_DGRAM as u64,
        ),
    ]
    .into_iter()
    .map(|condition| condition.and_then(|condition| SeccompRule::new(vec![condition])))
    .collect::<Result<Vec<_>, _>>()
    .map_err(to_string)?;
    rules.insert(libc::SYS_socketpair, socketpair_rules);
    let kill = SeccompFilter::new(rules, SeccompAction::Allow, SeccompAction::KillProcess, arch)
        .map_err(to_string)?;
    let mut programs = x32_program();
    for filter in [clone3, kill] {
        let program: BpfProgram = filter.try_into().map_err(|error| format!("seccomp: {error}"))?;
        let program = program
            .iter()
            .map(|op| libc::sock_filter { code: op.code, jt: op.jt, jf: op.jf, k: op.k })
            .collect();
        programs.push(program);
    }
    Ok(programs)
}

/// On x86_64, a program that kills any x32 system call (number | `0x4000_0000`): x32 calls carry
/// the x86_64 audit arch, so filters matching x86_64 numbers would let them all through on a
/// kernel built with x32 support. Nothing elsewhere.
fn x32_program() -> Vec<Vec<libc::sock_filter>> {
    if !cfg!(target_arch = "x86_64") {
        return Vec::new();
    }
    const AUDIT_ARCH_X86_64: u32 = 62 | 0x8000_0000 | 0x4000_0000;
    const X32_SYSCALL_BIT: u32 = 0x4000_0000;
    let op = |code: u32, jt: u8, jf: u8, k: u32| libc::sock_filter { code: code as u16, jt, jf, k };
    let (load, ret) = (libc::BPF_LD | libc::BPF_W | libc::BPF_ABS, libc::BPF_RET | libc::BPF_K);
    vec![vec![
        // seccomp_data: nr at offset 0, arch at offset 4.
        op(load, 0, 0, 4),
        op(libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K, 1, 0, AUDIT_ARCH_X86_64),
        op(ret, 0, 0, libc::SECCOMP_RET_KILL_PROCESS),
        op(load, 0, 0, 0),
        op(libc::BPF_JMP | libc::BPF_JSET | libc::BPF_K, 0, 1, X32_SYSCALL_BIT),
        op(ret, 0, 0, libc::SECCOMP_RET_KILL_PROCESS),
        op(ret, 0, 0, libc::SECCOMP_RET_ALLOW),
    ]]
}

/// What the interpreter told us about itself (asked once, outside any sandbox, with fixed code).
#[derive(Debug, Clone, Deserialize)]
pub struct PythonInfo {
    /// `sys.version`, first word.
    pub version: String,
    /// Directories and files it reads to start: the executable, the standard library, its
    /// shared libraries' directories.
    pub paths: Vec<PathBuf>,
}

const PYTHON_INFO: &str = r#"
import json, os, sys, sysconfig
paths = {os.path.realpath(sys.executable)}
for key in ("stdlib", "platstdlib"):
    paths.add(os.path.realpath(sysconfig.get_paths()[key]))
libdir = sysconfig.get_config_var("LIBDIR")
if libdir:
    paths.add(os.path.realpath(libdir))
cfg = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(sys.executable))), "pyvenv.cfg")
if os.path.exists(cfg):
    paths.add(cfg)
print(json.dumps({"version": sys.version.split()[0], "paths": sorted(paths)}))
"#;

/// Asks `python` for its version and the paths it needs.
pub fn python_info(python: &Path) -> Result<PythonInfo, String> {
    let output = std::process::Command::new(python)
        .args(["-S", "-s", "-c", PYTHON_INFO])
        .env_clear()
        .stdin(std::process::Stdio::null())
        .output()
        .map_err(|error| format!("python: cannot run {}: {error}", python.display()))?;
    if !output.status.success() {
        return Err(format!(
            "python: {} failed ({}): {}",
            python.display(),
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        ));
    }
    serde_json::from_slice(&output.stdout)
        .map_err(|error| format!("python: unexpected answer from {}: {error}", python.display()))
}

/// The system directories a dynamically linked interpreter loads from.
pub const SYSTEM_READ_PATHS: &[&str] = &[
    "/lib",
    "/lib64",
    "/usr/lib",
    "/usr/lib64",
    "/etc/ld.so.cache",
    "/etc/localtime",
    "/usr/share/zoneinfo",
];
