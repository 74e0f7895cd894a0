//! `rlvrctl verify`: JSONL items judged by a verifier plugin loaded in this process, through the
//! plugin host's batch engine; no daemon needed.

use std::fs::File;
use std::io::{self, BufReader};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use rlvr_plugin_api::PluginKind;
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
    let verifier =
        Arc::new(loaded.verifier(&options.plugin_config).with_context(|| format!("plugin {}", loaded.id()))?);
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
