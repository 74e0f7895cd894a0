//! OpenEnv servers for the `[env]` stories: `examples/envs/arith_feedback.py` on the venv
//! `scripts/openenv-venv.sh` makes (openenv 0.10.0 from its hashed lock).

use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::{free_port, peer_python, wait_until, workspace_root};

/// An `arith_feedback.py` server on a free loopback port, with `extra` arguments
/// (`--max-concurrent-envs N`, `--step-delay-s S`, `--pad`); killed when dropped.
pub struct EnvServer {
    child: Child,
    pub url: String,
}

impl EnvServer {
    pub fn start(extra: &[&str]) -> EnvServer {
        let python = peer_python("scripts/openenv-venv.sh", &[]);
        let port = free_port();
        let child = Command::new(python)
            .arg(workspace_root().join("examples/envs/arith_feedback.py"))
            .args(["--port", &port.to_string()])
            .args(extra)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut server = EnvServer { child, url: format!("http://127.0.0.1:{port}") };
        // Importing OpenEnv's server (FastAPI, Gradio) takes seconds on 2 cores.
        let up = wait_until(Duration::from_secs(120), || {
            TcpStream::connect(("127.0.0.1", port)).is_ok() || server.child.try_wait().unwrap().is_some()
        });
        assert!(up && server.child.try_wait().unwrap().is_none(), "the environment server did not start");
        server
    }
}

impl Drop for EnvServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Installed environments as an operator sets them up, in a fresh directory anyone may traverse:
/// `environments/` holds `arith_feedback.py` and `hostile.py` (tests/data/envs), and `venv/` is
/// the OpenEnv venv, hard-linked. (When the tests run as root, sandboxes drop to `nobody`, who
/// cannot reach the project cache under /root.) Returns the directory's guard, the environments'
/// directory and the venv's python.
pub fn installed_environments() -> (tempfile::TempDir, std::path::PathBuf, std::path::PathBuf) {
    use std::os::unix::fs::PermissionsExt;
    let python = peer_python("scripts/openenv-venv.sh", &[]);
    let venv = python.parent().and_then(std::path::Path::parent).expect("the venv of its python");
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let copy = dir.path().join("venv");
    let linked = Command::new("cp").arg("-al").arg(venv).arg(&copy).status().unwrap().success()
        || Command::new("cp").arg("-a").arg(venv).arg(&copy).status().unwrap().success();
    assert!(linked, "cannot copy the OpenEnv venv {}", venv.display());
    let environments = dir.path().join("environments");
    std::fs::create_dir(&environments).unwrap();
    std::fs::set_permissions(&environments, std::fs::Permissions::from_mode(0o755)).unwrap();
    for (name, source) in [
        ("arith_feedback.py", workspace_root().join("examples/envs/arith_feedback.py")),
        ("hostile.py", workspace_root().join("tests/data/envs/hostile.py")),
    ] {
        std::fs::copy(source, environments.join(name)).unwrap();
        std::fs::set_permissions(environments.join(name), std::fs::Permissions::from_mode(0o644)).unwrap();
    }
    let python = copy.join("bin").join(python.file_name().unwrap());
    (dir, environments, python)
}
