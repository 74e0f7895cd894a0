//! Log set-up for every binary: `tracing` to stderr, human-readable or JSON lines.

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
/// `rlvr_daemon=trace`), else `default_level`.
pub fn init(format: LogFormat, default_level: &str) {
    let filter = EnvFilter::try_from_env("RLVR_LOG").unwrap_or_else(|_| EnvFilter::new(default_level));
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    // A second init (tests running several servers in one process) keeps the first subscriber.
    let _ = match format {
        LogFormat::Human => builder.try_init(),
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
    };
}
