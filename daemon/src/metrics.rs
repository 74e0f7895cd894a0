//! The daemon's Prometheus metrics, served as text on `GET /metrics`.
//!
//! The plugin counters are the plugin host's (`rlvr_plugin_host::metrics`), incremented only by
//! its events, which log and count in one place so logs and metrics never drift apart; the
//! scheduler's are kept by `sched::service`, the API's by `api::server` and `api::auth`. Labels
//! are bounded (kinds, reasons, devices, priorities), never a job id, a file name or a team:
//! `/metrics` needs no token, and a team's name and activity are not every caller's to read.

use prometheus_client::encoding::EncodeLabelSet;
use std::sync::atomic::AtomicU64;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use rlvr_plugin_host::metrics::PluginMetrics;

/// `device` label: `cuda:0`, `cpu:0`.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DeviceLabel {
    pub device: String,
}

/// `priority` label: `high`, `normal` or `low`.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PriorityLabel {
    pub priority: &'static str,
}

/// `reason` label, one of a fixed set each metric documents.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabel {
    pub reason: &'static str,
}

/// Every metric the daemon exports.
pub struct Metrics {
    registry: Registry,
    /// The plugin registry's: `rlvr_plugin_loads_total{kind}`, `rlvr_plugin_refusals_total{reason}`,
    /// `rlvr_plugin_probes_total`.
    pub plugins: PluginMetrics,
    /// `rlvr_device_busy_seconds_total{device}`: time a device served a phase grant. Its rate
    /// is the device's busy fraction.
    pub device_busy_seconds: Family<DeviceLabel, Counter<f64, AtomicU64>>,
    /// `rlvr_grants_waiting`: workers waiting for their devices now.
    pub grants_waiting: Gauge,
    /// `rlvr_grant_waits_total`: grant requests that had to wait (another job's phase had the
    /// devices, or a more urgent request came first).
    pub grant_waits: Counter,
    /// `rlvr_preemptions_total{priority}`: jobs asked to leave to make room, by the victim's
    /// priority.
    pub preemptions: Family<PriorityLabel, Counter>,
    /// `rlvr_queue_wait_seconds{priority}`: from queueing on this daemon to admission.
    pub queue_wait_seconds: Family<PriorityLabel, Histogram>,
    /// `rlvr_api_connections`: open API connections now.
    pub api_connections: Gauge,
    /// `rlvr_api_connections_closed_total{reason}`: connections the server closed on a client:
    /// `idle_timeout`, `header_timeout`, `body_timeout`, `evicted` (to make room at
    /// `api.max_connections`).
    pub api_connections_closed: Family<ReasonLabel, Counter>,
    /// `rlvr_api_auth_refusals_total{reason}`: requests refused before their handler: `missing`,
    /// `malformed`, `unknown` (token), `too_many_failures` (the client address's failed
    /// authentications), `rate_limited` (the team's allowance).
    pub api_auth_refusals: Family<ReasonLabel, Counter>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// All metrics at zero.
    pub fn new() -> Self {
        let mut registry = Registry::default();
        let plugins = PluginMetrics::register(&mut registry);
        let device_busy_seconds = Family::<DeviceLabel, Counter<f64, AtomicU64>>::default();
        registry.register(
            "rlvr_device_busy_seconds",
            "Time each device served a phase grant (rollout, update, evaluation)",
            device_busy_seconds.clone(),
        );
        let grants_waiting = Gauge::default();
        registry.register(
            "rlvr_grants_waiting",
            "Workers waiting for a device grant",
            grants_waiting.clone(),
        );
        let grant_waits = Counter::default();
        registry.register("rlvr_grant_waits", "Device grant requests that had to wait", grant_waits.clone());
        let preemptions = Family::<PriorityLabel, Counter>::default();
        registry.register(
            "rlvr_preemptions",
            "Jobs preempted to make room, by the victim's priority",
            preemptions.clone(),
        );
        // 0.1 s to about 1.8 days.
        let queue_wait_seconds = Family::<PriorityLabel, Histogram>::new_with_constructor(|| {
            Histogram::new(exponential_buckets(0.1, 4.0, 12))
        });
        registry.register(
            "rlvr_queue_wait_seconds",
            "Time from queueing on this daemon to admission, by priority",
            queue_wait_seconds.clone(),
        );
        let api_connections = Gauge::default();
        registry.register("rlvr_api_connections", "Open API connections", api_connections.clone());
        let api_connections_closed = Family::<ReasonLabel, Counter>::default();
        registry.register(
            "rlvr_api_connections_closed",
            "API connections closed by the server on a slow, idle or surplus client, by reason",
            api_connections_closed.clone(),
        );
        let api_auth_refusals = Family::<ReasonLabel, Counter>::default();
        registry.register(
            "rlvr_api_auth_refusals",
            "Requests refused by the token check or a rate limit before their handler, by reason",
            api_auth_refusals.clone(),
        );
        Metrics {
            registry,
            plugins,
            device_busy_seconds,
            grants_waiting,
            grant_waits,
            preemptions,
            queue_wait_seconds,
            api_connections,
            api_connections_closed,
            api_auth_refusals,
        }
    }

    /// The Prometheus text exposition of every metric.
    pub fn encode(&self) -> String {
        let mut text = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut text, &self.registry);
        text
    }
}
