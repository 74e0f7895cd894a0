//! The registry's operator-facing events: each `emit()` logs and counts, so logs and metrics
//! agree.

use std::path::Path;

use crate::metrics::{KindLabel, PluginMetrics as Metrics, ReasonLabel};
use crate::registry::{LoadedPlugin, Refused};

/// A plugin library was loaded and registered.
pub struct PluginLoaded<'a> {
    /// The plugin.
    pub plugin: &'a LoadedPlugin,
}

impl PluginLoaded<'_> {
    /// Logs at info and counts `rlvr_plugin_loads_total{kind}`.
    pub fn emit(&self, metrics: &Metrics) {
        let meta = &self.plugin.meta;
        tracing::info!(
            plugin = %meta.id(),
            kind = meta.kind.as_str(),
            source = %self.plugin.source.display(),
            sha256 = %self.plugin.sha256,
            "plugin loaded"
        );
        for note in &meta.notes {
            tracing::info!(plugin = %meta.id(), "plugin note: {note}");
        }
        metrics.plugin_loads.get_or_create(&KindLabel { kind: meta.kind.as_str().to_owned() }).inc();
    }
}

/// A plugin library was refused.
pub struct PluginRefused<'a> {
    /// The refusal.
    pub refused: &'a Refused,
}

impl PluginRefused<'_> {
    /// Logs at warn and counts `rlvr_plugin_refusals_total{reason}`.
    pub fn emit(&self, metrics: &Metrics) {
        let refused = self.refused;
        tracing::warn!(
            source = %refused.source.display(),
            reason = refused.reason.as_str(),
            "plugin refused: {}",
            refused.message
        );
        metrics
            .plugin_refusals
            .get_or_create(&ReasonLabel { reason: refused.reason.as_str().to_owned() })
            .inc();
    }
}

/// A library's probe report was had: from a probe process, or from the probe cache.
pub struct PluginProbed<'a> {
    /// The content-addressed copy probed.
    pub library: &'a Path,
    /// Its sha256.
    pub sha256: &'a str,
    /// Whether the report came from the cache (no process was started).
    pub from_cache: bool,
}

impl PluginProbed<'_> {
    /// Logs at info and, when a process was started, counts `rlvr_plugin_probes_total`.
    pub fn emit(&self, metrics: &Metrics) {
        if self.from_cache {
            tracing::info!(library = %self.library.display(), sha256 = %self.sha256, from_cache = true, "plugin probe report from the cache");
        } else {
            tracing::info!(library = %self.library.display(), sha256 = %self.sha256, from_cache = false, "plugin probed in a worker process");
            metrics.plugin_probes.inc();
        }
    }
}
