//! Where the daemon is and who we are: the server's URL and the team's bearer token, each from
//! the highest place that has it — a flag, else the environment (`RLVR_SERVER`, `RLVR_TOKEN`),
//! else the config file `~/.config/rlvr/cli.toml`, else the default server.
//!
//! Nothing here ever shows a token: not [`Token`]'s `Debug`, not an error, not the config file's
//! text (it holds the token), not a URL with a password in it.

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};

use reqwest::Url;

/// The daemon's address when nothing else names one.
pub const DEFAULT_SERVER: &str = "http://127.0.0.1:8470";

/// Why the settings could not be resolved: something wrong on this side (a flag, a variable,
/// the config file), which a program reports as a refused input.
#[derive(Debug, thiserror::Error)]
pub enum SettingsError {
    /// The config file exists and cannot be read.
    #[error("cannot read {}", path.display())]
    Read {
        /// The config file.
        path: PathBuf,
        /// Why.
        source: io::Error,
    },
    /// The config file is not TOML.
    #[error("{}: not valid TOML{}: {message}", path.display(), line_text(*line))]
    Syntax {
        /// The config file.
        path: PathBuf,
        /// Where the parser stopped, from 1.
        line: Option<usize>,
        /// The parser's message (never the file's text).
        message: String,
    },
    /// The config file has a key other than `server` and `token`.
    #[error("{}: unknown key `{key}` (expected `server` or `token`)", path.display())]
    UnknownKey {
        /// The config file.
        path: PathBuf,
        /// The key.
        key: String,
    },
    /// A key of the config file holds something other than a string.
    #[error("{}: `{key}`: expected a string, got {found}", path.display())]
    NotAString {
        /// The config file.
        path: PathBuf,
        /// The key.
        key: String,
        /// What it holds instead (`integer`, `table`, …).
        found: &'static str,
    },
    /// A token that cannot go into an HTTP header.
    #[error(
        "the token from {from}: expected visible ASCII characters only (no spaces, line breaks or other text)"
    )]
    Token {
        /// Where it came from (`--token`, `RLVR_TOKEN`, the config file's path).
        from: String,
    },
    /// A server that is not an http(s) URL.
    #[error("server {text:?} (from {from}): expected an http:// or https:// URL")]
    Server {
        /// What was given.
        text: String,
        /// Where it came from.
        from: String,
    },
    /// A server URL with a user or password in it (errors print the URL; the token has its own
    /// place).
    #[error(
        "server (from {from}): expected a URL without a user or password; the token goes in --token, \
         RLVR_TOKEN or cli.toml"
    )]
    ServerCredentials {
        /// Where it came from.
        from: String,
    },
}

/// ` (line N)`, or nothing.
fn line_text(line: Option<usize>) -> String {
    line.map(|line| format!(" (line {line})")).unwrap_or_default()
}

/// The line (from 1) at which a TOML parser stopped in `text`, when it says where.
pub fn toml_error_line(text: &str, error: &toml::de::Error) -> Option<usize> {
    let span = error.span()?;
    text.get(..span.start).map(|before| before.matches('\n').count() + 1)
}

/// The places settings come from besides the config file, highest first.
pub struct Sources<'a> {
    /// `--server`.
    pub flag_server: Option<String>,
    /// `--token`.
    pub flag_token: Option<String>,
    /// Looks up an environment variable (injected, so tests need not touch the process's).
    pub env: &'a dyn Fn(&str) -> Option<String>,
}

impl Sources<'static> {
    /// These flags, and the process's environment.
    pub fn with_process_env(flag_server: Option<String>, flag_token: Option<String>) -> Self {
        Sources { flag_server, flag_token, env: &env_var }
    }
}

impl Sources<'_> {
    /// A set, non-empty environment variable.
    fn var(&self, key: &str) -> Option<String> {
        (self.env)(key).filter(|value| !value.is_empty())
    }
}

fn env_var(key: &str) -> Option<String> {
    std::env::var(key).ok()
}

/// Whether a command speaks for a team.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Auth {
    /// Look for the team's token (the job API).
    Token,
    /// No token, none read, not even from the config file (the open routes: `GET /healthz`).
    Anonymous,
}

/// The daemon's address and the team's token, each from the highest place that has it.
#[derive(Debug, Clone, PartialEq)]
pub struct Settings {
    /// The daemon's API (a path prefix is kept: `https://host/rlvr/`).
    pub server: Url,
    /// Absent: requests go without `Authorization` (only `/healthz` and `/metrics` answer them).
    pub token: Option<Token>,
    /// The config file consulted (or that would be), for hints in errors.
    pub config_path: Option<PathBuf>,
}

impl Settings {
    /// Settings given whole (a test, a benchmark): no config file is involved.
    pub fn new(server: Url, token: Option<Token>) -> Self {
        Settings { server, token, config_path: None }
    }
}

/// A bearer token. Its `Debug` shows where it came from, never the token.
#[derive(Clone, PartialEq)]
pub struct Token {
    secret: String,
    /// `--token`, `RLVR_TOKEN` or the config file's path.
    from: String,
}

impl Token {
    /// `secret`, which came from `from` (said in errors instead of the token).
    pub fn new(secret: impl Into<String>, from: impl Into<String>) -> Self {
        Token { secret: secret.into(), from: from.into() }
    }

    /// The token itself, for the `Authorization` header.
    pub fn secret(&self) -> &str {
        &self.secret
    }

    /// Where it came from.
    pub fn from(&self) -> &str {
        &self.from
    }
}

impl fmt::Debug for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Token(from {})", self.from)
    }
}

/// What `cli.toml` holds.
#[derive(Debug, Default, PartialEq)]
struct FileSettings {
    server: Option<String>,
    token: Option<String>,
}

/// `$XDG_CONFIG_HOME/rlvr/cli.toml`, else `~/.config/rlvr/cli.toml`.
pub fn config_path(sources: &Sources<'_>) -> Option<PathBuf> {
    // The XDG spec: a relative $XDG_CONFIG_HOME is invalid and ignored.
    if let Some(dir) = sources.var("XDG_CONFIG_HOME").map(PathBuf::from).filter(|dir| dir.is_absolute()) {
        return Some(dir.join("rlvr").join("cli.toml"));
    }
    sources.var("HOME").map(|home| PathBuf::from(home).join(".config").join("rlvr").join("cli.toml"))
}

/// A config file's text; `None` when there is no such file.
pub fn read_config_text(path: &Path) -> Result<Option<String>, SettingsError> {
    match std::fs::read_to_string(path) {
        Ok(text) => Ok(Some(text)),
        Err(error) if error.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(SettingsError::Read { path: path.to_owned(), source }),
    }
}

/// Flag, else environment, else config file, else the default — per setting. The file is read
/// (by `read_file`, [`read_config_text`] outside tests) only when a flag or variable leaves
/// something open, so a broken file does not stop a command that names everything itself. The
/// token is looked for only for [`Auth::Token`].
pub fn resolve_settings(
    sources: &Sources<'_>,
    auth: Auth,
    read_file: impl FnOnce(&Path) -> Result<Option<String>, SettingsError>,
) -> Result<Settings, SettingsError> {
    let need_token = auth == Auth::Token;
    // An empty flag is no flag, as an empty variable is no variable.
    let flag = |value: &Option<String>| value.clone().filter(|value| !value.is_empty());
    let mut server = flag(&sources.flag_server)
        .map(|server| (server, "--server".to_owned()))
        .or_else(|| sources.var("RLVR_SERVER").map(|server| (server, "RLVR_SERVER".to_owned())));
    let mut token = if need_token {
        flag(&sources.flag_token)
            .map(|secret| Token::new(secret, "--token"))
            .or_else(|| sources.var("RLVR_TOKEN").map(|secret| Token::new(secret, "RLVR_TOKEN")))
    } else {
        None
    };
    let config_path = config_path(sources);
    let missing = server.is_none() || (need_token && token.is_none());
    if missing
        && let Some(path) = &config_path
        && let Some(text) = read_file(path)?
    {
        let file = parse_config(path, &text)?;
        let from = path.display().to_string();
        if server.is_none() {
            server = file.server.map(|server| (server, from.clone()));
        }
        if need_token && token.is_none() {
            token = file.token.map(|secret| Token { secret, from });
        }
    }
    if let Some(token) = &token {
        check_token(token)?;
    }
    let (server, from) = server.unwrap_or_else(|| (DEFAULT_SERVER.to_owned(), "the default".to_owned()));
    Ok(Settings { server: parse_server(&server, &from)?, token, config_path })
}

/// A token goes into an HTTP header: visible ASCII only. The error says where it came from and
/// never shows it.
fn check_token(token: &Token) -> Result<(), SettingsError> {
    if token.secret.bytes().all(|byte| byte.is_ascii_graphic()) {
        Ok(())
    } else {
        Err(SettingsError::Token { from: token.from.clone() })
    }
}

/// `cli.toml`: only `server` and `token`, both strings. Errors name the file and the key, and
/// never quote the file's text (it holds the token).
fn parse_config(path: &Path, text: &str) -> Result<FileSettings, SettingsError> {
    let table: toml::Table = text.parse().map_err(|error: toml::de::Error| SettingsError::Syntax {
        path: path.to_owned(),
        line: toml_error_line(text, &error),
        message: error.message().to_owned(),
    })?;
    let mut settings = FileSettings::default();
    for (key, value) in table {
        let slot = match key.as_str() {
            "server" => &mut settings.server,
            "token" => &mut settings.token,
            _ => return Err(SettingsError::UnknownKey { path: path.to_owned(), key }),
        };
        match value {
            toml::Value::String(text) => *slot = Some(text),
            other => {
                return Err(SettingsError::NotAString {
                    path: path.to_owned(),
                    key,
                    found: other.type_str(),
                });
            }
        }
    }
    Ok(settings)
}

fn parse_server(text: &str, from: &str) -> Result<Url, SettingsError> {
    let url = Url::parse(text).ok().filter(|url| matches!(url.scheme(), "http" | "https") && url.has_host());
    let Some(url) = url else {
        return Err(SettingsError::Server { text: text.to_owned(), from: from.to_owned() });
    };
    // The URL is printed in errors; a password in it would be too. The token has its own place.
    if !url.username().is_empty() || url.password().is_some() {
        return Err(SettingsError::ServerCredentials { from: from.to_owned() });
    }
    Ok(url)
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    /// Resolves with these flags, environment and config file (at the path it would be read).
    fn settings(
        flags: (Option<&str>, Option<&str>),
        env: &[(&str, &str)],
        file: Option<&str>,
        auth: Auth,
    ) -> Result<Settings, SettingsError> {
        let env: HashMap<String, String> =
            env.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect();
        let lookup = move |key: &str| env.get(key).cloned();
        let sources = Sources {
            flag_server: flags.0.map(str::to_owned),
            flag_token: flags.1.map(str::to_owned),
            env: &lookup,
        };
        resolve_settings(&sources, auth, |_| Ok(file.map(str::to_owned)))
    }

    fn check_settings(settings: Result<Settings, SettingsError>, server: &str, token: Option<(&str, &str)>) {
        let settings = settings.unwrap();
        assert_eq!(settings.server.as_str(), server);
        assert_eq!(settings.token.as_ref().map(|t| (t.secret(), t.from())), token);
    }

    const HOME: (&str, &str) = ("HOME", "/home/me");
    const FILE: &str = "server = \"http://file:1/\"\ntoken = \"file-token\"\n";

    #[test]
    fn flag_beats_env_beats_file_beats_default() {
        let env = [HOME, ("RLVR_SERVER", "http://env:1"), ("RLVR_TOKEN", "env-token")];
        check_settings(
            settings((Some("http://flag:1"), Some("flag-token")), &env, Some(FILE), Auth::Token),
            "http://flag:1/",
            Some(("flag-token", "--token")),
        );
        check_settings(
            settings((None, None), &env, Some(FILE), Auth::Token),
            "http://env:1/",
            Some(("env-token", "RLVR_TOKEN")),
        );
        check_settings(
            settings((None, None), &[HOME], Some(FILE), Auth::Token),
            "http://file:1/",
            Some(("file-token", "/home/me/.config/rlvr/cli.toml")),
        );
        check_settings(settings((None, None), &[HOME], None, Auth::Token), "http://127.0.0.1:8470/", None);
        // Per setting: the server from a flag, the token from the file.
        check_settings(
            settings((Some("http://flag:1"), None), &[HOME], Some(FILE), Auth::Token),
            "http://flag:1/",
            Some(("file-token", "/home/me/.config/rlvr/cli.toml")),
        );
        // An empty variable or flag is none.
        check_settings(
            settings(
                (Some(""), Some("")),
                &[HOME, ("RLVR_SERVER", ""), ("RLVR_TOKEN", "")],
                Some(FILE),
                Auth::Token,
            ),
            "http://file:1/",
            Some(("file-token", "/home/me/.config/rlvr/cli.toml")),
        );
        // No token wanted (the open routes): none is read, not even from the file.
        check_settings(settings((None, None), &env, Some(FILE), Auth::Anonymous), "http://env:1/", None);
    }

    #[test]
    fn the_file_lives_under_xdg_config_home_when_it_is_set_and_absolute() {
        let path = |env: &[(&str, &str)]| {
            let env: HashMap<&str, &str> = env.iter().copied().collect();
            let lookup = move |key: &str| env.get(key).map(|v| (*v).to_owned());
            config_path(&Sources { flag_server: None, flag_token: None, env: &lookup })
        };
        assert_eq!(path(&[HOME]), Some(PathBuf::from("/home/me/.config/rlvr/cli.toml")));
        assert_eq!(path(&[HOME, ("XDG_CONFIG_HOME", "/xdg")]), Some(PathBuf::from("/xdg/rlvr/cli.toml")));
        assert_eq!(
            path(&[HOME, ("XDG_CONFIG_HOME", "rel")]),
            Some(PathBuf::from("/home/me/.config/rlvr/cli.toml"))
        );
        assert_eq!(path(&[]), None);
        let settings =
            settings((None, None), &[HOME, ("XDG_CONFIG_HOME", "/xdg")], Some(FILE), Auth::Token).unwrap();
        assert_eq!(settings.token.unwrap().from(), "/xdg/rlvr/cli.toml");
    }

    #[test]
    fn a_broken_file_is_named_with_its_key_and_never_quoted() {
        let error =
            |file: &str| settings((None, None), &[HOME], Some(file), Auth::Token).unwrap_err().to_string();
        assert_eq!(
            error("token = 5\n"),
            "/home/me/.config/rlvr/cli.toml: `token`: expected a string, got integer"
        );
        assert_eq!(
            error("server = \"http://x\"\ntokn = \"s3cret\"\n"),
            "/home/me/.config/rlvr/cli.toml: unknown key `tokn` (expected `server` or `token`)"
        );
        let syntax = error("server = \"http://x\"\ntoken = \"s3cret\n");
        assert!(syntax.starts_with("/home/me/.config/rlvr/cli.toml: not valid TOML (line 2): "), "{syntax}");
        assert!(!syntax.contains("s3cret"), "the token leaked: {syntax}");
        assert_eq!(
            error("server = \"localhost:8470\"\n"),
            "server \"localhost:8470\" (from /home/me/.config/rlvr/cli.toml): expected an http:// or https:// URL"
        );
        // A broken file is not read when flags and environment say everything.
        check_settings(
            settings((Some("http://flag:1"), None), &[HOME, ("RLVR_TOKEN", "t")], Some("{{{"), Auth::Token),
            "http://flag:1/",
            Some(("t", "RLVR_TOKEN")),
        );
    }

    #[test]
    fn an_unreadable_file_is_named_with_why() {
        let dir = std::env::temp_dir().join(format!("rlvr-client-settings-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        // A directory where the file goes: it exists and cannot be read as one.
        let error = read_config_text(&dir).unwrap_err();
        assert!(matches!(&error, SettingsError::Read { path, .. } if *path == dir), "{error:?}");
        assert_eq!(error.to_string(), format!("cannot read {}", dir.display()));
        assert_eq!(read_config_text(&dir.join("missing.toml")).unwrap(), None);
        std::fs::remove_dir(&dir).unwrap();
    }

    #[test]
    fn tokens_and_urls_that_cannot_go_into_a_request_are_refused_up_front() {
        let error =
            |flags, env: &[(&str, &str)]| settings(flags, env, None, Auth::Token).unwrap_err().to_string();
        let refused = error((None, None), &[HOME, ("RLVR_TOKEN", "s3cret\n")]);
        assert_eq!(
            refused,
            "the token from RLVR_TOKEN: expected visible ASCII characters only (no spaces, line breaks or other text)"
        );
        assert!(error((None, Some("a b")), &[HOME]).starts_with("the token from --token: "));
        let with_password = error((Some("http://me:s3cret@h:1"), Some("t")), &[HOME]);
        assert!(
            with_password.starts_with("server (from --server): expected a URL without a user or password")
        );
        assert!(!with_password.contains("s3cret"), "{with_password}");
    }

    #[test]
    fn a_token_is_never_in_debug_output() {
        let token = Token::new("s3cret", "RLVR_TOKEN");
        assert_eq!(format!("{token:?}"), "Token(from RLVR_TOKEN)");
        let settings = Settings::new(Url::parse("http://h:1").unwrap(), Some(token));
        assert!(!format!("{settings:?}").contains("s3cret"));
    }
}
