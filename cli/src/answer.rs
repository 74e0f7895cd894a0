//! What every command shares: the daemon it talks to ([`Context`]), how it prints what it got —
//! as JSON with `--json`, else as text ([`Context::answer`]) — and the error for input that is
//! wrong on this side ([`BadInput`]).

use std::fmt;
use std::time::Duration;

use rlvr_client::settings::{Sources, read_config_text, resolve_settings};
use rlvr_client::{Auth, Client, ClientConfig, StatusCode};

/// The global options a command that talks to the daemon is given.
pub struct Context {
    pub server: Option<String>,
    pub token: Option<String>,
    /// `--json`: answers as JSON.
    pub json: bool,
}

impl Context {
    /// A client of the daemon with the team's token, from the options, the environment or
    /// `cli.toml`.
    pub fn client(&self) -> anyhow::Result<Client> {
        let sources = Sources::with_process_env(self.server.clone(), self.token.clone());
        let settings = resolve_settings(&sources, Auth::Token, read_config_text)?;
        Ok(Client::with_config(settings, client_config())?)
    }

    /// Prints a command's answer: `value` as JSON with `--json`, else the text `text` makes (its
    /// lines each ending in a newline). The one place a command's two forms are chosen between.
    pub fn answer<T: serde::Serialize + ?Sized>(
        &self,
        value: &T,
        shape: Json,
        text: impl FnOnce() -> String,
    ) -> anyhow::Result<()> {
        if self.json {
            match shape {
                Json::Block => println!("{}", serde_json::to_string_pretty(value)?),
                Json::Line => println!("{}", serde_json::to_string(value)?),
            }
        } else {
            print!("{}", text());
        }
        Ok(())
    }
}

/// How rlvrctl talks to the daemon: as itself, saying when it waits out a busy daemon.
pub fn client_config() -> ClientConfig {
    ClientConfig {
        user_agent: concat!("rlvrctl/", env!("CARGO_PKG_VERSION")).to_owned(),
        on_busy: Some(say_busy),
        ..ClientConfig::default()
    }
}

fn say_busy(status: StatusCode, wait: Duration) {
    eprintln!("rlvrctl: the daemon is busy ({status}); retrying in {} s", wait.as_secs());
}

/// How `--json` writes an answer: pretty over several lines, or one line (what a script reading
/// lines, or following a job, takes).
#[derive(Clone, Copy)]
pub enum Json {
    Block,
    Line,
}

/// Something wrong on this side (a spec file, a plugin directory): exit 2, like a 4xx.
#[derive(Debug)]
pub struct BadInput(pub String);

impl fmt::Display for BadInput {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for BadInput {}
