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
