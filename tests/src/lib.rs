//! Helpers shared by the integration tests: built artifacts, daemons under test, the CLI.
//!
//! Tests run the real binaries and plugin libraries that `cargo build --workspace` produced
//! (`scripts/test.sh` builds them before `cargo test`), real `redis-server` processes on free
//! ports, and real signals.

use std::fs;
use std::io::Write;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

pub mod cli;
pub mod grants;
pub mod jobs;
pub mod openenv;
pub mod peer;
pub mod sandbox;

/// The workspace root.
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("tests/ sits in the workspace").to_owned()
}

/// Builds the book (`docs/`) into `dest` with the mdBook `scripts/setup.sh` installed and named in
/// `RLVR_MDBOOK`; panics when it fails. Returns mdBook's log (its stderr: where warnings show).
pub fn build_book(dest: &Path) -> String {
    let mdbook = std::env::var_os("RLVR_MDBOOK")
        .map(PathBuf::from)
        .expect("RLVR_MDBOOK names mdBook: source the env file scripts/setup.sh writes");
    assert!(mdbook.is_file(), "RLVR_MDBOOK: no mdbook at {}", mdbook.display());
    let built = std::process::Command::new(&mdbook)
        .args(["build", "docs", "--dest-dir"])
        .arg(dest)
        .current_dir(workspace_root())
        .output()
        .expect("run mdbook");
    let log = String::from_utf8_lossy(&built.stderr).into_owned();
    assert!(built.status.success(), "mdbook build failed:\n{log}");
    log
}

/// The cargo target directory.
pub fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR").map(PathBuf::from).unwrap_or_else(|| workspace_root().join("target"))
}

/// A file built by `cargo build --workspace` (debug profile).
pub fn artifact(name: &str) -> PathBuf {
    let path = target_dir().join("debug").join(name);
    assert!(
        path.exists(),
        "{} is missing: run `cargo build --workspace` first (scripts/test.sh does)",
        path.display()
    );
    path
}

/// A plugin library by crate name, e.g. `plugin_lib("rlvr-verifier-format")`.
pub fn plugin_lib(crate_name: &str) -> PathBuf {
    artifact(&format!("lib{}.so", crate_name.replace('-', "_")))
}

/// A free TCP port on 127.0.0.1 (bound then released; good enough for tests).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").and_then(|listener| listener.local_addr()).expect("free port").port()
}

/// Polls `condition` every 50 ms until it holds or `timeout` passes; returns whether it held.
pub fn wait_until(timeout: Duration, mut condition: impl FnMut() -> bool) -> bool {
    let started = Instant::now();
    loop {
        if condition() {
            return true;
        }
        if started.elapsed() > timeout {
            return false;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Copies `source` into `dir` as `name` the way an operator should: write a temp file, rename.
pub fn drop_in(source: &Path, dir: &Path, name: &str) -> PathBuf {
    let bytes = fs::read(source).expect("read plugin");
    drop_bytes(&bytes, dir, name)
}

/// Writes `bytes` into `dir` as `name` atomically (temp file, then rename).
pub fn drop_bytes(bytes: &[u8], dir: &Path, name: &str) -> PathBuf {
    let temp = dir.join(format!(".{name}.partial"));
    fs::write(&temp, bytes).expect("write plugin");
    let target = dir.join(name);
    fs::rename(&temp, &target).expect("rename plugin");
    target
}

/// Sends SIGTERM, waits up to `grace`, then SIGKILL. Returns the exit status.
pub fn stop(child: &mut Child, grace: Duration) -> std::process::ExitStatus {
    let pid = Pid::from_raw(i32::try_from(child.id()).expect("pid fits"));
    let _ = kill(pid, Signal::SIGTERM);
    let started = Instant::now();
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            return status;
        }
        if started.elapsed() > grace {
            let _ = child.kill();
            return child.wait().expect("wait after kill");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A `redis-server` on a free port in a temp dir, stopped on drop.
pub struct Redis {
    child: Option<Child>,
    /// Its port.
    pub port: u16,
    aof: bool,
    dir: tempfile::TempDir,
}

impl Redis {
    /// Starts one without persistence and waits until it accepts connections.
    pub fn start() -> Redis {
        Redis::launch(false)
    }

    /// Starts one with the production persistence of `configs/redis.conf` (AOF, fsync every
    /// second), so a [`Redis::stop`] and [`Redis::restart`] keep every acknowledged write.
    pub fn start_with_aof() -> Redis {
        Redis::launch(true)
    }

    fn launch(aof: bool) -> Redis {
        let mut redis =
            Redis { child: None, port: free_port(), aof, dir: tempfile::tempdir().expect("temp dir") };
        redis.restart();
        redis
    }

    /// Starts it again on the same port and directory (after [`Redis::stop`]).
    pub fn restart(&mut self) {
        assert!(self.child.is_none(), "redis-server is running");
        let server =
            std::env::var_os("RLVR_REDIS_SERVER").map(PathBuf::from).unwrap_or_else(|| "redis-server".into());
        let port = self.port;
        let mut command = Command::new(&server);
        command.args(["--port", &port.to_string(), "--bind", "127.0.0.1", "--save", ""]);
        if self.aof {
            command.args(["--appendonly", "yes", "--appendfsync", "everysec"]);
        } else {
            command.args(["--appendonly", "no"]);
        }
        let child = command
            .arg("--dir")
            .arg(self.dir.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|error| {
                panic!("cannot start {} (scripts/setup.sh installs it): {error}", server.display())
            });
        self.child = Some(child);
        let up = wait_until(Duration::from_secs(10), || redis_ping(port));
        assert!(up, "redis-server did not answer on {port}");
    }

    /// Stops it with SIGTERM (it writes its AOF before exiting).
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            stop(&mut child, Duration::from_secs(10));
        }
    }

    /// Kills it with SIGKILL, as the OOM killer would: what it acknowledged is in its AOF (see
    /// [`Redis::start_with_aof`]) but never fsynced past the last second.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// `redis://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// How many times `command` (lower case: `xread`) has run since the server started, from
    /// `INFO commandstats`.
    pub fn calls(&self, command: &str) -> u64 {
        let mut stream = std::net::TcpStream::connect(("127.0.0.1", self.port)).expect("redis answers");
        stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        stream.write_all(b"INFO commandstats\r\n").unwrap();
        // A bulk string: `$LEN\r\n`, LEN bytes, `\r\n`.
        let mut reader = std::io::BufReader::new(stream);
        let mut header = String::new();
        std::io::BufRead::read_line(&mut reader, &mut header).unwrap();
        let length: usize = header.trim().trim_start_matches('$').parse().expect("a bulk reply");
        let mut body = vec![0u8; length];
        std::io::Read::read_exact(&mut reader, &mut body).unwrap();
        let prefix = format!("cmdstat_{command}:calls=");
        String::from_utf8_lossy(&body)
            .lines()
            .find_map(|line| line.strip_prefix(&prefix))
            .and_then(|rest| rest.split(',').next())
            .map_or(0, |calls| calls.parse().expect("a count"))
    }
}

/// Whether a Redis answers PING on `port` (and has finished loading its data).
fn redis_ping(port: u16) -> bool {
    let Ok(mut stream) = std::net::TcpStream::connect(("127.0.0.1", port)) else { return false };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(1)));
    if stream.write_all(b"PING\r\n").is_err() {
        return false;
    }
    let mut reply = [0u8; 7];
    std::io::Read::read(&mut stream, &mut reply).is_ok_and(|n| reply[..n].starts_with(b"+PONG"))
}

impl Drop for Redis {
    fn drop(&mut self) {
        self.stop();
    }
}

/// `rlvrd serve` in a temp state directory, with its own plugin directory; stopped on drop.
pub struct Daemon {
    child: Option<Child>,
    /// Temp dir holding `state/`, `plugins/`, `rlvrd.toml` and `rlvrd.log`.
    pub dir: tempfile::TempDir,
    /// The plugin directory it scans.
    pub plugins: PathBuf,
    /// `http://127.0.0.1:PORT`.
    pub url: String,
    /// Its config file.
    pub config: PathBuf,
    /// Its state directory, as this process reaches it (on a [`SmallDisk`], through its
    /// namespace's `/proc/PID/root`).
    pub state: PathBuf,
    /// The process holding the mount namespace of its [`SmallDisk`], when it has one.
    small_disk: Option<Child>,
    /// Where it keeps its copies of plugin libraries and their probe reports (`plugins.cache_dir`):
    /// one directory for every daemon of the tests, [`shared_plugin_cache`].
    pub plugin_cache: PathBuf,
}

/// The plugin cache every test daemon shares (`target/test-plugin-cache`): a library's probe
/// report is kept there under its sha256 and the worker's build, so only the first daemon of a
/// run that loads a library probes it — each probe is a worker process loading libtorch, and the
/// tests start about 80 daemons. Entries of older builds stay until `cargo clean`.
pub fn shared_plugin_cache() -> PathBuf {
    target_dir().join("test-plugin-cache")
}

/// How long [`Daemon::restart`] waits for a daemon to listen before it calls it hung.
const START_BOUND: Duration = Duration::from_secs(300);

/// Bearer token of team `tests` in a [`Daemon`]'s config.
pub const TEAM_TOKEN: &str = "tests-team-token";
/// Bearer token of team `others`.
pub const OTHER_TOKEN: &str = "others-team-token";
/// An admin's bearer token.
pub const ADMIN_TOKEN: &str = "ops-admin-token";
/// Team `tests`'s key for the Tinker SDK (`X-API-Key`; the SDK wants the `tml-` prefix).
pub const TINKER_KEY: &str = "tml-tests-team-key";
/// Team `others`'s key for the Tinker SDK.
pub const OTHER_TINKER_KEY: &str = "tml-others-team-key";

/// Config that lets a daemon's outbound requests (webhooks) reach servers the tests run on
/// 127.0.0.1: the default `[outbound]` allows nothing, and loopback only through an entry inside
/// it. Append it with [`Daemon::start_with`].
pub const OUTBOUND_LOOPBACK: &str = "[outbound]\nallow = [\"127.0.0.1/32\"]\n";

/// Hex SHA-256 of `text`.
pub fn sha256_hex(text: &str) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(text.as_bytes()))
}

impl Daemon {
    /// Starts a daemon whose plugin directory holds `plugins` (crate names), with `redis_url`.
    pub fn start(plugins: &[&str], redis_url: &str) -> Daemon {
        Daemon::start_with(plugins, redis_url, "")
    }

    /// As [`Daemon::start`], with more config appended (sections the base config does not
    /// have). The token [`TEAM_TOKEN`] acts for team `tests`, [`OTHER_TOKEN`] for team `others`,
    /// [`ADMIN_TOKEN`] is an admin's.
    pub fn start_with(plugins: &[&str], redis_url: &str, extra_config: &str) -> Daemon {
        Daemon::start_with_api(plugins, redis_url, "", extra_config)
    }

    /// As [`Daemon::start_with`], with `api_keys` (lines such as `idle_timeout_s = 1`) added to
    /// the config's `[api]` section, which a section in `extra_config` cannot repeat.
    pub fn start_with_api(plugins: &[&str], redis_url: &str, api_keys: &str, extra_config: &str) -> Daemon {
        let mut daemon = Daemon::prepare(plugins, redis_url, api_keys, extra_config);
        daemon.restart();
        daemon
    }

    /// A daemon's directory, plugins and config, not started.
    fn prepare(plugins: &[&str], redis_url: &str, api_keys: &str, extra_config: &str) -> Daemon {
        let dir = tempfile::tempdir().expect("temp dir");
        let plugins_dir = dir.path().join("plugins");
        let state_dir = dir.path().join("state");
        fs::create_dir_all(&plugins_dir).expect("plugins dir");
        for name in plugins {
            let lib = plugin_lib(name);
            drop_in(&lib, &plugins_dir, lib.file_name().and_then(|n| n.to_str()).expect("utf-8 name"));
        }
        let plugin_cache = shared_plugin_cache();
        let config = dir.path().join("rlvrd.toml");
        let token = |team: &str, token: &str, admin: bool| {
            format!("[[auth.tokens]]\nteam = {team:?}\nsha256 = {:?}\nadmin = {admin}\n", sha256_hex(token))
        };
        let toml = format!(
            "[daemon]\nstate_dir = {state:?}\n[redis]\nurl = {redis_url:?}\n[api]\nlisten = \"127.0.0.1:0\"\n\
             {api_keys}\n[plugins]\ndirs = [{plugins:?}]\nscan_interval_ms = 200\ncache_dir = {cache:?}\n\
             {tokens}{extra_config}\n",
            state = state_dir.display().to_string(),
            plugins = plugins_dir.display().to_string(),
            cache = plugin_cache.display().to_string(),
            tokens = token("tests", TEAM_TOKEN, false)
                + &token("others", OTHER_TOKEN, false)
                + &token("tests", TINKER_KEY, false)
                + &token("others", OTHER_TINKER_KEY, false)
                + &token("ops", ADMIN_TOKEN, true),
        );
        fs::write(&config, toml).expect("write config");
        Daemon {
            child: None,
            dir,
            plugins: plugins_dir,
            url: String::new(),
            config,
            state: state_dir,
            small_disk: None,
            plugin_cache,
        }
    }

    /// As [`Daemon::start_with`], its state directory on filesystems of their own: see
    /// [`SmallDisk`]. Its restarts keep them.
    pub fn start_on(disk: SmallDisk, plugins: &[&str], redis_url: &str, extra_config: &str) -> Daemon {
        let mut daemon = Daemon::prepare(plugins, redis_url, "", extra_config);
        fs::create_dir_all(&daemon.state).expect("state dir");
        let holder = disk.hold(&daemon.state);
        let root = PathBuf::from(format!("/proc/{}/root", holder.id()));
        daemon.state = root.join(daemon.state.strip_prefix("/").expect("an absolute state dir"));
        daemon.small_disk = Some(holder);
        daemon.restart();
        daemon
    }

    /// Runs `mount ARGS` in the daemon's mount namespace (on a [`SmallDisk`]), e.g. to make its
    /// registry read-only (`-o remount,ro`) and writable again.
    pub fn mount(&self, args: &[&str]) {
        let holder =
            self.small_disk.as_ref().expect("only a daemon on a small disk has a namespace of its own");
        let pid = holder.id().to_string();
        let output = Command::new("nsenter")
            .args(["-t", &pid, "-U", "-m", "--preserve-credentials", "mount"])
            .args(args)
            .output()
            .expect("nsenter (util-linux)");
        assert!(output.status.success(), "mount {args:?}: {}", String::from_utf8_lossy(&output.stderr));
    }

    /// The state directory's path as the daemon itself writes it (its config's).
    pub fn state_as_configured(&self) -> PathBuf {
        self.dir.path().join("state")
    }

    /// Starts the daemon again with the same config and state (after [`Daemon::kill`] or
    /// [`Daemon::stop`]); its log is appended to.
    pub fn restart(&mut self) {
        assert!(self.child.is_none(), "rlvrd is running");
        // Back on the address it had, as a daemon under systemd comes back: clients that follow
        // a job (rlvrctl watch) reconnect to it.
        if let Some(addr) = self.url.strip_prefix("http://") {
            let text = fs::read_to_string(&self.config).expect("read config");
            let text = text.replace("listen = \"127.0.0.1:0\"", &format!("listen = {addr:?}"));
            fs::write(&self.config, text).expect("write config");
        }
        let _ = fs::remove_file(self.state.join("rlvrd.addr"));
        let log = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join("rlvrd.log"))
            .expect("log file");
        let mut command = match &self.small_disk {
            Some(holder) => SmallDisk::enter(holder.id()),
            None => Command::new(artifact("rlvrd")),
        };
        let child = command
            .arg("serve")
            .arg("--config")
            .arg(&self.config)
            .env("RLVR_LOG", "info")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start rlvrd");
        let addr_file = self.state.join("rlvrd.addr");
        self.child = Some(child);
        // Until it writes its address, or exits. It probes every library it has not seen in a
        // worker process that loads libtorch (seconds each on a loaded machine, and one test
        // drops 30 libraries in), so the bound is for a hang, not a measure of speed.
        let mut exited = None;
        let started = wait_until(START_BOUND, || {
            exited = self.child.as_mut().and_then(|child| child.try_wait().ok().flatten());
            exited.is_some() || fs::read_to_string(&addr_file).is_ok_and(|text| text.ends_with('\n'))
        });
        if let Some(status) = exited {
            self.child = None;
            panic!("rlvrd exited ({status}) before it listened; its log:\n{}", self.log());
        }
        assert!(
            started,
            "rlvrd did not write its address ({}) within {START_BOUND:?} of its start; its log:\n{}",
            addr_file.display(),
            self.log()
        );
        self.url = format!("http://{}", fs::read_to_string(&addr_file).expect("addr").trim());
    }

    /// Kills the daemon with SIGKILL, as a power cut or the OOM killer would.
    pub fn kill(&mut self) {
        let mut child = self.child.take().expect("daemon running");
        let _ = child.kill();
        let _ = child.wait();
    }

    /// The daemon's pid, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Everything the daemon logged so far.
    pub fn log(&self) -> String {
        fs::read_to_string(self.dir.path().join("rlvrd.log")).unwrap_or_default()
    }

    /// `GET path` without a token, as raw text (`/metrics`, or a status alone): status and body.
    pub fn get(&self, path: &str) -> (u16, String) {
        let response = http_get(&format!("{}{path}", self.url)).unwrap_or_else(|error| {
            panic!(
                "GET {path}: {error}; daemon log:\n{}\n(again, after the log: GET {path}: {error})",
                self.log()
            )
        });
        let status = response.status().as_u16();
        (status, response.text().expect("body"))
    }

    /// `GET path` (a JSON route) with team `tests`' token (the open `/healthz` ignores it),
    /// expecting 200.
    pub fn get_json(&self, path: &str) -> serde_json::Value {
        jobs::api(self, Some(TEAM_TOKEN)).get(&jobs::segments(path), &[]).unwrap_or_else(|error| {
            panic!(
                "GET {path}: {error}; daemon log:\n{}\n(again, after the log: GET {path}: {error})",
                self.log()
            )
        })
    }

    /// Stops the daemon with SIGTERM and returns its exit status, once it has exited: waits as
    /// long as the daemon's own drain may take (its config's `queue.stop_timeout_s` and the drain's
    /// margins), so a stop that is slow because the machine is loaded is not mistaken for one that
    /// hangs. A daemon still running past that is killed and the call panics, saying what it
    /// waited for.
    pub fn stop(&mut self) -> std::process::ExitStatus {
        let mut child = self.child.take().expect("daemon running");
        let (bound, why) = self.drain_bound();
        let started = Instant::now();
        let pid = Pid::from_raw(i32::try_from(child.id()).expect("pid fits"));
        let _ = kill(pid, Signal::SIGTERM);
        loop {
            if let Ok(Some(status)) = child.try_wait() {
                return status;
            }
            if started.elapsed() > bound {
                let _ = child.kill();
                let _ = child.wait();
                panic!(
                    "rlvrd did not exit within {bound:?} of SIGTERM ({why}); killed it with SIGKILL; \
                     its log:\n{}",
                    self.log()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// How long a SIGTERM'd daemon may take to exit, and why: its drain gives running jobs
    /// `queue.stop_timeout_s` to checkpoint (read from its config; 100 s when unset), then 10 s
    /// for the requeue writes, before the grant socket and the API stop; 30 s more for that and
    /// for a machine loaded by other work.
    fn drain_bound(&self) -> (Duration, String) {
        let text = fs::read_to_string(&self.config).expect("read config");
        // The harness writes the config: the key appears once, in `[queue]`, when set at all.
        let configured = text.lines().find_map(|line| {
            let (key, value) = line.split_once('=')?;
            (key.trim() == "stop_timeout_s").then(|| value.trim().parse::<u64>().ok())?
        });
        let stop_timeout_s = configured.unwrap_or(100);
        let bound = Duration::from_secs(stop_timeout_s + 10 + 30);
        let why = format!(
            "its drain: queue.stop_timeout_s = {stop_timeout_s} s for running jobs to checkpoint{}, \
             10 s for the requeue writes, 30 s for the API to stop on a loaded machine",
            if configured.is_some() { "" } else { " (the default)" }
        );
        (bound, why)
    }

    /// Whether the process is still running.
    pub fn is_running(&mut self) -> bool {
        self.child.as_mut().is_some_and(|child| child.try_wait().ok().flatten().is_none())
    }
}

/// A daemon's state directory on a tmpfs of `state_mb` and its registry (`<state>/registry`) on
/// one of `registry_mb`, mounted in a mount namespace of their own: a disk that fills up, and a
/// registry the test can make read-only ([`Daemon::mount`]), with no privilege (a user namespace
/// maps the test's user to root inside it; util-linux's `unshare` and `nsenter`). A process that
/// only sleeps holds the namespace, so the daemon's restarts (and kills) keep its files; the test
/// reaches them through that process's `/proc/PID/root`.
#[derive(Debug, Clone, Copy)]
pub struct SmallDisk {
    pub state_mb: u32,
    pub registry_mb: u32,
}

impl SmallDisk {
    /// The process holding the namespace, once both filesystems are mounted at `state`.
    fn hold(&self, state: &Path) -> Child {
        let holder = Command::new("unshare")
            .args(["--user", "--map-root-user", "--mount", "sh", "-c"])
            .arg(
                "set -e; mount -t tmpfs -o size=\"$1\"m tmpfs \"$3\"; mkdir \"$3/registry\"; \
                 mount -t tmpfs -o size=\"$2\"m tmpfs \"$3/registry\"; exec sleep infinity",
            )
            .arg("sh")
            .arg(self.state_mb.to_string())
            .arg(self.registry_mb.to_string())
            .arg(state)
            .stdout(Stdio::null())
            .spawn()
            .expect("unshare (util-linux)");
        let mountinfo = format!("/proc/{}/mountinfo", holder.id());
        let at = format!(" {} ", state.display());
        let at_registry = format!(" {}/registry ", state.display());
        let mounted = wait_until(Duration::from_secs(10), || {
            fs::read_to_string(&mountinfo).is_ok_and(|info| info.contains(&at) && info.contains(&at_registry))
        });
        assert!(mounted, "the small disk's tmpfs mounts at {}", state.display());
        holder
    }

    /// `nsenter` into the namespace `holder` holds, running rlvrd (in the same process: the
    /// daemon's pid is the child's); the daemon's arguments are added.
    fn enter(holder: u32) -> Command {
        let mut command = Command::new("nsenter");
        command
            .args(["-t", &holder.to_string(), "-U", "-m", "--preserve-credentials"])
            .arg(artifact("rlvrd"));
        command
    }
}

/// Fills the filesystem of `path` with a file of zeros there until it is full (`ENOSPC`); its
/// size. Deleting the file frees the space again.
pub fn fill_disk(path: &Path) -> u64 {
    use std::io::Write;
    let mut file = fs::File::create(path).expect("the ballast file");
    let chunk = vec![0u8; 64 * 1024];
    let mut written = 0;
    loop {
        match file.write(&chunk) {
            Ok(0) => break,
            Ok(n) => written += n as u64,
            Err(error) if error.raw_os_error() == Some(libc::ENOSPC) => break,
            Err(error) => panic!("{}: {error}", path.display()),
        }
    }
    written
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            stop(&mut child, Duration::from_secs(5));
        }
        // Its filesystems end with the namespace's holder.
        if let Some(mut holder) = self.small_disk.take() {
            let _ = holder.kill();
            let _ = holder.wait();
        }
    }
}

/// A raw blocking `GET url`, for what is not the daemon's JSON API. Tests use this rather than
/// `reqwest::blocking::get`: the workspace's reqwest needs a TLS provider installed in the
/// process first (see the root Cargo.toml).
pub fn http_get(url: &str) -> reqwest::Result<reqwest::blocking::Response> {
    // Err only means a provider is installed already.
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::blocking::get(url)
}

/// Runs `rlvrctl` with `args`, feeding `stdin`.
pub fn rlvrctl(args: &[&str], stdin: &[u8]) -> Output {
    let mut child = Command::new(artifact("rlvrctl"))
        .args(args)
        .env_remove("RLVR_SERVER")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start rlvrctl");
    let mut input = child.stdin.take().expect("stdin");
    let stdin = stdin.to_vec();
    let writer = std::thread::spawn(move || {
        let _ = input.write_all(&stdin);
    });
    let output = child.wait_with_output().expect("rlvrctl output");
    let _ = writer.join();
    output
}

/// Parses JSONL output into values.
pub fn json_lines(stdout: &[u8]) -> Vec<serde_json::Value> {
    String::from_utf8_lossy(stdout)
        .lines()
        .map(|line| {
            serde_json::from_str(line).unwrap_or_else(|error| panic!("output line {line:?}: {error}"))
        })
        .collect()
}

/// `spec` with each `(from, to)` of `changes` made; each `from` must be in it exactly once, so a
/// change that no longer applies fails here rather than running the unchanged job.
pub fn changed(spec: &str, changes: &[(&str, &str)]) -> String {
    changes.iter().fold(spec.to_owned(), |text, (from, to)| {
        assert_eq!(text.matches(from).count(), 1, "{from:?} in the spec");
        text.replace(from, to)
    })
}

/// The learning test's addition task (`rlvrd data arith` arguments, the held-out count aside):
/// `a+b=` below 50, 300 demonstrations, 2 000 training prompts. The web page's test trains on it
/// too, so that the job it watches learns.
pub const ADDITION_DATA: &[&str] =
    &["--seed", "11", "--max-operand", "50", "--ops", "+", "--pad", "--sft", "300", "--train", "2000"];

/// LoRA on every linear layer of the decoder, rank 16, scale 2, as the learning test's LoRA jobs
/// and the web page's watched job take it (with a learning rate of 2e-3, 4× full fine-tuning's:
/// 5e-3 collapses the policy onto one answer; low-rank updates take a larger step for the same
/// change of the outputs).
pub const ADDITION_LORA: &str = "lora = { rank = 16, alpha = 32.0 }";

/// Writes the arithmetic data sets (`rlvrd data arith`, with `extra` arguments) into `dir/data`.
pub fn arith_data(dir: &Path, extra: &[&str]) -> PathBuf {
    let data = dir.join("data");
    let output = Command::new(artifact("rlvrd"))
        .args(["data", "arith", "--out"])
        .arg(&data)
        .args(extra)
        .output()
        .expect("run rlvrd data arith");
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    data
}

/// A small GRPO job spec (TOML) on the arithmetic data in `data`: group 4, 4 prompts a step,
/// 5 new tokens, the math verifier, held-out scoring on 16 prompts.
/// `[gates]` that pass any candidate: for tests about something other than the gates (a few
/// steps of a tiny model move the held-out score and the reward by noise).
pub const PERMISSIVE_GATES: &str =
    "[gates]\nheldout_gain_min = -1.0\nrefuse_reward_hacking = false\nlength_ratio_max = 100.0\n";

pub fn arith_grpo_spec(data: &Path, name: &str, policy: &str, steps: u32, checkpoint_every: u32) -> String {
    format!(
        r#"
[job]
name = "{name}"
team = "tests"
model_line = "tiny-arith"
seed = 7

[model]
policy = "{policy}"

[data]
train = "{data}/train.jsonl"
heldout = "{data}/heldout.jsonl"

[optimizer]
plugin = "grpo"
group_size = 4
lr = 1e-3
micro_batch_size = 8
kl_beta = 0.04

[[verifiers]]
plugin = "math"
fallback = "last"

[rollout]
max_new_tokens = 5
prompts_per_step = 4

[budget]
max_steps = {steps}

[checkpoint]
every_steps = {checkpoint_every}

[eval]
max_prompts = 16
"#,
        data = data.display()
    )
}

/// One stage (a whole job spec as a `[[stages]]` entry): `optimizer` with its keys, on the
/// arithmetic data, starting from `policy`, with `gates` (the stages set theirs explicitly: a
/// few steps of a tiny model move the held-out score by noise).
pub fn stage(data: &Path, name: &str, policy: &str, optimizer: &str, steps: u32, gates: &str) -> String {
    let train = if optimizer.contains("sft") { "sft" } else { "train" };
    let gates = gates.replace("[gates]", "[stages.gates]");
    format!(
        r#"
[[stages]]
[stages.job]
name = "{name}"
team = "tests"
model_line = "tiny-arith"
seed = 3
[stages.model]
policy = "{policy}"
[stages.data]
train = "{data}/{train}.jsonl"
heldout = "{data}/heldout.jsonl"
[stages.optimizer]
{optimizer}
micro_batch_size = 8
[[stages.verifiers]]
plugin = "math"
fallback = "last"
[stages.rollout]
max_new_tokens = 4
prompts_per_step = 8
[stages.budget]
max_steps = {steps}
[stages.checkpoint]
every_steps = 2
[stages.eval]
max_prompts = 16
{gates}"#,
        data = data.display()
    )
}

/// A stage's `[optimizer]` keys: SFT.
pub const STAGE_SFT: &str = "plugin = \"sft\"\nlr = 1e-3";
/// A stage's `[optimizer]` keys: GRPO.
pub const STAGE_GRPO: &str = "plugin = \"grpo\"\ngroup_size = 4\nlr = 1e-4\nkl_beta = 0.04";

/// A pipeline of team `tests` with `stages` ([`stage`]).
pub fn pipeline(name: &str, stages: &[String]) -> String {
    format!("[pipeline]\nname = \"{name}\"\nteam = \"tests\"\n{}", stages.concat())
}

/// A plugin dir holding the libraries the worker tests' jobs use.
pub fn worker_plugins(dir: &Path) -> PathBuf {
    let plugins = dir.join("plugins");
    fs::create_dir_all(&plugins).unwrap();
    for name in [
        "rlvr-optimizer-grpo",
        "rlvr-optimizer-sft",
        "rlvr-optimizer-dpo",
        "rlvr-optimizer-rloo",
        "rlvr-optimizer-ppo",
        "rlvr-optimizer-rm",
        "rlvr-verifier-math",
        "rlvr-verifier-format",
        "rlvr-curriculum-frontier",
    ] {
        drop_in(&plugin_lib(name), &plugins, &format!("lib{}.so", name.replace('-', "_")));
    }
    plugins
}

/// A peer's python, its venv made (or found) by the project's script `script` (relative to the
/// workspace, e.g. `scripts/engine-venv.sh`) with `args`; the script prints the python.
pub fn peer_python(script: &str, args: &[&str]) -> PathBuf {
    let made = Command::new("bash")
        .arg(workspace_root().join(script))
        .args(args)
        .output()
        .unwrap_or_else(|error| panic!("run {script}: {error}"));
    assert!(made.status.success(), "{script} {args:?} failed:\n{}", String::from_utf8_lossy(&made.stderr));
    PathBuf::from(String::from_utf8(made.stdout).unwrap().trim())
}

/// `rlvr-worker run` of `spec` on the CPU, its state in `state`, its plugins from `plugins`.
pub fn worker_command(spec: &Path, state: &Path, plugins: &Path, extra: &[&str]) -> Command {
    let mut command = Command::new(artifact("rlvr-worker"));
    command
        .args(["run", "--device", "cpu", "--spec"])
        .arg(spec)
        .arg("--state-dir")
        .arg(state)
        .arg("--plugin-dir")
        .arg(plugins)
        .args(extra)
        .env("RLVR_LOG", "warn");
    command
}

/// Runs `command` to its end and returns its output with its own peak resident size (KiB), from
/// `wait4`: the child's figure alone, whatever other tests of this binary run meanwhile.
#[allow(clippy::zombie_processes, reason = "the child is reaped by wait4, which also gives its rusage")]
pub fn run_measuring_peak(command: &mut Command, dir: &Path) -> (Output, i64) {
    use std::os::unix::process::ExitStatusExt;
    let (stdout, stderr) = (dir.join("stdout"), dir.join("stderr"));
    let child = command
        .stdout(fs::File::create(&stdout).unwrap())
        .stderr(fs::File::create(&stderr).unwrap())
        .spawn()
        .unwrap();
    let mut status = 0;
    // SAFETY: wait4 fills the status and the rusage it is given, for our own child.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    let pid = unsafe { libc::wait4(child.id() as libc::pid_t, &mut status, 0, &mut usage) };
    assert_eq!(pid, child.id() as libc::pid_t, "wait4: {}", std::io::Error::last_os_error());
    let output = Output {
        status: std::process::ExitStatus::from_raw(status),
        stdout: fs::read(&stdout).unwrap(),
        stderr: fs::read(&stderr).unwrap(),
    };
    (output, usage.ru_maxrss)
}

/// An SFT job (TOML) of `steps` steps of 32 completions of 390 tokens, in one micro-batch, on
/// `builtin:tiny-arith`, its data written to `dir/long.jsonl`; `extra` is appended (more
/// sections). Memory-hungry for its size, on a CPU with one libtorch thread: about 0.4 GB
/// resident once loaded, 1.3 GB through its first update and 1.45 GB by its third (libtorch's
/// own ~0.6 GB included; activation checkpointing takes 0.2–0.3 GB off).
pub fn long_sft_spec(dir: &Path, name: &str, steps: u32, checkpointing: bool, extra: &str) -> String {
    let data = dir.join("long.jsonl");
    let lines: Vec<String> = (0..32)
        .map(|i| format!(r#"{{"prompt": "{i}:", "completion": "{}"}}"#, "0123456789+-=".repeat(30)))
        .collect();
    fs::write(&data, lines.join("\n") + "\n").expect("write long.jsonl");
    format!(
        "[job]\nname = {name:?}\nteam = \"tests\"\nmodel_line = \"tiny\"\n\
         [model]\npolicy = \"builtin:tiny-arith\"\nactivation_checkpointing = {checkpointing}\n\
         [data]\ntrain = {data:?}\n[optimizer]\nplugin = \"sft\"\nmicro_batch_size = 32\n\
         [rollout]\nprompts_per_step = 32\n[budget]\nmax_steps = {steps}\n{extra}",
        data = data.display().to_string(),
    )
}
