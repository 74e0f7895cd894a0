//! Running the command-line programs (`rlvrctl`, `python3`) as a user does, from a directory and
//! with only the settings given.

use std::path::Path;
use std::process::{Command, Output};

/// Runs a client program from `cwd` with a clean environment for its settings: no server,
/// token or config file unless `env` gives them.
pub fn run(program: &Path, args: &[&str], cwd: &Path, env: &[(&str, &str)]) -> Output {
    command(program, args, cwd, env)
        .output()
        .unwrap_or_else(|error| panic!("run {}: {error}", program.display()))
}

/// The command [`run`] runs.
pub fn command(program: &Path, args: &[&str], cwd: &Path, env: &[(&str, &str)]) -> Command {
    let mut command = Command::new(program);
    command.args(args).current_dir(cwd).env_remove("RLVR_SERVER").env_remove("RLVR_TOKEN");
    // An empty config home: no user's ~/.config/rlvr/cli.toml leaks in.
    command.env("XDG_CONFIG_HOME", cwd.join("no-config"));
    for (key, value) in env {
        command.env(key, value);
    }
    command
}

pub fn text(output: &Output) -> String {
    format!(
        "exit {:?}\nstdout:\n{}\nstderr:\n{}",
        output.status.code(),
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}
