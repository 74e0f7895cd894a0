//! The daemon's Prometheus metrics, served as text on `GET /metrics`.
//!
//! Counters are only incremented by the operator-facing events in `events`, which log and count in
//! one place so logs and metrics never drift apart. Labels are bounded (kinds, reasons), never a
//! job id or a file name.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

use crate::registry::RefusalReason;

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

/// Every metric the daemon exports.
pub struct Metrics {
    registry: Registry,
    /// `rlvr_plugin_loads_total{kind}`.
    pub plugin_loads: Family<KindLabel, Counter>,
    /// `rlvr_plugin_refusals_total{reason}`.
    pub plugin_refusals: Family<ReasonLabel, Counter>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// All metrics at zero; every refusal reason and kind is present from the start so that a
    /// dashboard can tell "none yet" from "not exported".
    pub fn new() -> Self {
        let mut registry = Registry::default();
        let plugin_loads = Family::<KindLabel, Counter>::default();
        let plugin_refusals = Family::<ReasonLabel, Counter>::default();
        registry.register("rlvr_plugin_loads", "Plugin libraries loaded, by kind", plugin_loads.clone());
        registry.register(
            "rlvr_plugin_refusals",
            "Plugin libraries refused, by reason",
            plugin_refusals.clone(),
        );
        for kind in rlvr_plugin_api::PluginKind::ALL {
            let _ = plugin_loads.get_or_create(&KindLabel { kind: kind.as_str().to_owned() });
        }
        for reason in RefusalReason::ALL {
            let _ = plugin_refusals.get_or_create(&ReasonLabel { reason: reason.as_str().to_owned() });
        }
        Metrics { registry, plugin_loads, plugin_refusals }
    }

    /// The Prometheus text exposition of every metric.
    pub fn encode(&self) -> String {
        let mut text = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut text, &self.registry);
        text
    }
}
