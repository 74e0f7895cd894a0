//! The registry's Prometheus counters, registered into the host process's registry (the daemon's
//! `GET /metrics`; a one-shot tool keeps them to itself). Only the events in `events` touch them.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

use crate::loader::RefusalReason;

/// `kind` label.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabel {
    /// `verifier`, `optimizer` or `curriculum`.
    pub kind: String,
}

/// `reason` label.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabel {
    /// A [`RefusalReason`] name.
    pub reason: String,
}

/// The plugin counters.
#[derive(Debug, Clone, Default)]
pub struct PluginMetrics {
    /// `rlvr_plugin_loads_total{kind}`.
    pub plugin_loads: Family<KindLabel, Counter>,
    /// `rlvr_plugin_refusals_total{reason}`.
    pub plugin_refusals: Family<ReasonLabel, Counter>,
    /// `rlvr_plugin_probes_total`: probe processes started (a report read from the probe cache
    /// starts none).
    pub plugin_probes: Counter,
}

impl PluginMetrics {
    /// Counters at zero that nobody exports (a one-shot tool, a worker).
    pub fn unexported() -> Self {
        PluginMetrics::default()
    }

    /// Counters at zero, registered in `registry`; every refusal reason and kind is present from
    /// the start so that a dashboard can tell "none yet" from "not exported".
    pub fn register(registry: &mut Registry) -> Self {
        let metrics = PluginMetrics::default();
        registry.register(
            "rlvr_plugin_loads",
            "Plugin libraries loaded, by kind",
            metrics.plugin_loads.clone(),
        );
        registry.register(
            "rlvr_plugin_refusals",
            "Plugin libraries refused, by reason",
            metrics.plugin_refusals.clone(),
        );
        registry.register(
            "rlvr_plugin_probes",
            "Plugin probe processes started (rlvr-worker probe-plugin); a report kept from an earlier probe of the same library by the same worker build starts none",
            metrics.plugin_probes.clone(),
        );
        for kind in rlvr_plugin_api::PluginKind::ALL {
            let _ = metrics.plugin_loads.get_or_create(&KindLabel { kind: kind.as_str().to_owned() });
        }
        for reason in RefusalReason::ALL {
            let _ =
                metrics.plugin_refusals.get_or_create(&ReasonLabel { reason: reason.as_str().to_owned() });
        }
        metrics
    }
}
