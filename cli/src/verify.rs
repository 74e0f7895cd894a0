//! `rlvrctl verify`: JSONL items judged by a verifier plugin loaded in this process, through the
//! plugin host's batch engine; no daemon needed. The plugin runs on its user's behalf: it gets
//! the secrets they pass (`--secret NAME=ENV_VAR`) and no restriction on where it sends requests.

use std::fs::File;
use std::io::{self, BufReader};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use rlvr_plugin_api::{HostContext, PluginKind, Secret};
use rlvr_plugin_host::metrics::PluginMetrics;
use rlvr_plugin_host::verify::{BatchOptions, run_batch};
use rlvr_plugin_host::{Isolation, Registry};

use crate::BadInput;

/// The knobs of `rlvrctl verify` besides where to find the plugin and the input.
pub(crate) struct VerifyOptions {
    pub(crate) plugin_config: String,
    pub(crate) parallel: usize,
    pub(crate) deadline: Duration,
    pub(crate) explain: bool,
    /// `(secret name, environment variable)` pairs of `--secret`.
    pub(crate) secrets: Vec<(String, String)>,
}

/// The plugin's host context: the user's own secrets, read from their environment, and no
/// outbound restriction (it runs as they do).
fn host_context(secrets: &[(String, String)]) -> Result<HostContext, BadInput> {
    let mut host = HostContext::unrestricted();
    for (name, variable) in secrets {
        let value = std::env::var(variable).map_err(|_| {
            BadInput(format!(
                "--secret {name}={variable}: the environment variable {variable} is not set (or not UTF-8)"
            ))
        })?;
        host.secrets.insert(name.clone(), Secret::new(value));
    }
    Ok(host)
}

pub(crate) fn verify(
    plugin: &str,
    jsonl: Option<PathBuf>,
    extra_dirs: Vec<PathBuf>,
    config_path: Option<PathBuf>,
    options: VerifyOptions,
) -> anyhow::Result<()> {
    let dirs = rlvr_plugin_host::dirs::plugin_dirs(config_path.as_deref(), extra_dirs)
        .map_err(|error| BadInput(error.to_string()))?;
    // Content-addressed copies live only as long as this process; the libraries stay mapped.
    let cache =
        tempfile::Builder::new().prefix("rlvrctl-plugins-").tempdir().context("cannot create a temp dir")?;
    let registry = Registry::new(cache.path().to_owned(), Isolation::InProcess, PluginMetrics::unexported())?;
    registry.scan(&dirs, std::time::Duration::ZERO);
    let loaded = registry.find(plugin, Some(PluginKind::Verifier)).with_context(|| {
        format!(
            "looked in {}",
            dirs.iter().map(|dir| dir.display().to_string()).collect::<Vec<_>>().join(", ")
        )
    })?;
    let host = host_context(&options.secrets)?;
    let verifier = Arc::new(
        loaded
            .verifier_in(&options.plugin_config, &host)
            .with_context(|| format!("plugin {}", loaded.id()))?,
    );
    let batch = BatchOptions {
        verifier_id: loaded.id(),
        parallel: options.parallel,
        deadline: options.deadline,
        explain: options.explain,
    };
    let stdout = io::BufWriter::new(io::stdout().lock());
    let summary = match jsonl {
        Some(path) => {
            let file = File::open(&path).with_context(|| format!("cannot open {}", path.display()))?;
            run_batch(verifier, BufReader::new(file), stdout, &batch)
        }
        None => run_batch(verifier, BufReader::new(io::stdin()), stdout, &batch),
    }
    .context("reading input or writing output")?;
    eprintln!(
        "rlvrctl: {} item(s) verified with {}: {} passed, {} with errors ({} timed out)",
        summary.items,
        loaded.id(),
        summary.passed,
        summary.errors,
        summary.timeouts
    );
    Ok(())
}
