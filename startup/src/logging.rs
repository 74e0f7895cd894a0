//! Log set-up for every binary: `tracing` to stderr, human-readable or JSON lines.

use std::ffi::OsStr;
use std::io::IsTerminal;

use tracing_subscriber::EnvFilter;

/// How log lines look.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum LogFormat {
    /// One readable line per event.
    #[default]
    Human,
    /// One JSON object per event, for log shippers.
    Json,
}

/// Installs the global subscriber. The level comes from `RLVR_LOG` (e.g. `debug`,
/// `rlvr_daemon=trace`), else `default_level`. Colours only on a terminal and without
/// `NO_COLOR` (no-color.org): a worker's stderr is its job's log file, a daemon's is journald's.
pub fn init(format: LogFormat, default_level: &str) {
    let filter = EnvFilter::try_from_env("RLVR_LOG").unwrap_or_else(|_| EnvFilter::new(default_level));
    let colour = colour(std::io::stderr().is_terminal(), std::env::var_os("NO_COLOR").as_deref());
    // A line that cannot be written (stderr a log file on a full disk) is lost, not reported on
    // stderr again: `eprintln!` panics when that write fails too, and a worker whose log filled
    // the disk died with exit 101 before it could say the disk was full (the full-disk story,
    // one run in six).
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(colour)
        .log_internal_errors(false);
    // A second init (tests running several servers in one process) keeps the first subscriber.
    let _ = match format {
        LogFormat::Human => builder.try_init(),
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
    };
}

/// Whether log lines may carry ANSI colours: on a terminal, unless `NO_COLOR` is set to anything
/// but the empty string.
fn colour(terminal: bool, no_color: Option<&OsStr>) -> bool {
    terminal && no_color.is_none_or(OsStr::is_empty)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn colours_only_on_a_terminal_without_no_color() {
        let check = |terminal, no_color: Option<&str>, expected| {
            assert_eq!(colour(terminal, no_color.map(OsStr::new)), expected, "{terminal} {no_color:?}");
        };
        check(true, None, true);
        check(true, Some(""), true);
        check(true, Some("1"), false);
        check(false, None, false);
        check(false, Some("1"), false);
    }
}
