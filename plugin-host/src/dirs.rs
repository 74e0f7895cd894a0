//! Where a program that loads plugins itself (`rlvrctl verify`, `rlvr-worker run` by hand) finds
//! them: the daemon config's `plugins.dirs`, then each `--plugin-dir`.
//!
//! Only that one key is read, from the same places the daemon reads it (the file, then
//! `RLVR__PLUGINS__DIRS`): a workstation running `rlvrctl verify` must not need a config the
//! daemon would accept as a whole, nor the daemon's crate (Redis, the HTTP server).

use std::path::{Path, PathBuf};

/// The daemon's config file when none is named.
pub const DEFAULT_CONFIG_PATH: &str = "/etc/rlvr/rlvrd.toml";
/// `plugins.dirs` when the config does not set it.
pub const DEFAULT_PLUGIN_DIR: &str = "/usr/lib/rlvr/plugins";
/// The environment variable that overrides `plugins.dirs` (a TOML list, as for the daemon).
pub const PLUGIN_DIRS_ENV: &str = "RLVR__PLUGINS__DIRS";

/// Why the plugin directories could not be worked out; each names the file, variable or flag.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DirsError {
    /// The named config file could not be read.
    #[error("{path}: {reason}")]
    Unreadable {
        /// The file.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// `plugins.dirs` is not a list of paths.
    #[error("{source_name}: plugins.dirs: {reason}")]
    BadValue {
        /// The file or the environment variable.
        source_name: String,
        /// What was wrong.
        reason: String,
    },
    /// A `--plugin-dir` that is not a directory.
    #[error("--plugin-dir {0}: not a directory")]
    NotADirectory(PathBuf),
}

/// The config's `plugins.dirs` that exist on this machine (they are the daemon's: on a
/// workstation they may not), then every `extra` directory (each must exist).
///
/// `config`: the file named with `--config` (it must exist); `None` reads
/// [`DEFAULT_CONFIG_PATH`] when it exists.
pub fn plugin_dirs(config: Option<&Path>, extra: Vec<PathBuf>) -> Result<Vec<PathBuf>, DirsError> {
    let env = std::env::var(PLUGIN_DIRS_ENV).ok();
    let mut dirs: Vec<PathBuf> =
        configured(config, env.as_deref())?.into_iter().filter(|dir| dir.is_dir()).collect();
    for dir in extra {
        if !dir.is_dir() {
            return Err(DirsError::NotADirectory(dir));
        }
        dirs.push(dir);
    }
    Ok(dirs)
}

/// `plugins.dirs` from the environment's value, else the file, else the default.
fn configured(config: Option<&Path>, env: Option<&str>) -> Result<Vec<PathBuf>, DirsError> {
    if let Some(raw) = env {
        return parse_dirs(&format!("dirs = {raw}"), PLUGIN_DIRS_ENV, &[]);
    }
    let (path, required) = match config {
        Some(path) => (path, true),
        None => (Path::new(DEFAULT_CONFIG_PATH), false),
    };
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(error) if !required && error.kind() == std::io::ErrorKind::NotFound => {
            return Ok(vec![PathBuf::from(DEFAULT_PLUGIN_DIR)]);
        }
        Err(error) => return Err(DirsError::Unreadable { path: path.to_owned(), reason: error.to_string() }),
    };
    parse_dirs(&text, &path.display().to_string(), &["plugins"])
}

/// The list of paths at `table.dirs` of a TOML document (the default when absent).
fn parse_dirs(text: &str, source_name: &str, table: &[&str]) -> Result<Vec<PathBuf>, DirsError> {
    let bad = |reason: String| DirsError::BadValue { source_name: source_name.to_owned(), reason };
    let document: toml::Table = toml::from_str(text).map_err(|error| bad(error.message().to_owned()))?;
    let mut at = &document;
    for key in table {
        match at.get(*key) {
            Some(toml::Value::Table(inner)) => at = inner,
            Some(_) => return Err(bad(format!("[{key}] is not a table"))),
            None => return Ok(vec![PathBuf::from(DEFAULT_PLUGIN_DIR)]),
        }
    }
    let Some(value) = at.get("dirs") else { return Ok(vec![PathBuf::from(DEFAULT_PLUGIN_DIR)]) };
    let expected = || bad("expected a list of directories like [\"/usr/lib/rlvr/plugins\"]".to_owned());
    let items = value.as_array().ok_or_else(expected)?;
    items
        .iter()
        .map(|item| item.as_str().filter(|dir| !dir.is_empty()).map(PathBuf::from).ok_or_else(expected))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(file: Option<&str>, env: Option<&str>, expected: Result<&[&str], &str>) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("rlvrd.toml");
        if let Some(text) = file {
            std::fs::write(&path, text).unwrap();
        }
        let got = configured(Some(&path), env);
        match expected {
            Ok(dirs) => assert_eq!(got.unwrap(), dirs.iter().map(PathBuf::from).collect::<Vec<_>>()),
            Err(message) => {
                let error = got.unwrap_err().to_string();
                assert!(error.contains(message), "{error:?} should contain {message:?}");
            }
        }
    }

    #[test]
    fn the_dirs_come_from_the_env_then_the_file_then_the_default() {
        let file = "[plugins]\ndirs = [\"/a\", \"/b\"]\n[api]\nlisten = 3\n";
        check(Some(file), None, Ok(&["/a", "/b"]));
        check(Some(file), Some("[\"/e\"]"), Ok(&["/e"]));
        check(Some("[redis]\nurl = \"redis://x\"\n"), None, Ok(&[DEFAULT_PLUGIN_DIR]));
        check(Some(""), None, Ok(&[DEFAULT_PLUGIN_DIR]));
    }

    #[test]
    fn problems_name_their_source() {
        check(None, None, Err("rlvrd.toml: "));
        check(Some("[plugins]\ndirs = \"/a\"\n"), None, Err("plugins.dirs: expected a list"));
        check(Some("[plugins]\ndirs = [\"\"]\n"), None, Err("plugins.dirs: expected a list"));
        check(Some("plugins = 3\n"), None, Err("[plugins] is not a table"));
        check(Some("[plugins"), None, Err("rlvrd.toml: plugins.dirs: "));
        check(None, Some("/not-a-list"), Err("RLVR__PLUGINS__DIRS: plugins.dirs: "));
    }
}
