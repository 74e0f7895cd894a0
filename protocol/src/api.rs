//! The daemon's own wire types on the HTTP API (jobs' are in [`crate::job`]): what `rlvrd serve`
//! answers and reads, and what `rlvr-client` sends and reads.

use serde::{Deserialize, Serialize};

/// `GET /healthz`: always 200 while the daemon serves; `status` says whether all is well.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Health {
    /// `ok`, or `degraded` while Redis does not answer.
    pub status: String,
    /// `ok`, `unknown` before the first ping, or why Redis does not answer.
    pub redis: String,
    /// Plugins loaded.
    pub plugins: usize,
}

/// A loaded plugin, as `GET /v1/plugins` lists it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct PluginView {
    /// `name@version`, what jobs pin.
    pub id: String,
    /// Short name.
    pub name: String,
    /// Semantic version.
    pub version: String,
    /// `verifier`, `optimizer` or `curriculum`.
    pub kind: String,
    /// One line.
    pub description: String,
    /// SHA-256 of the library, hex.
    pub sha256: String,
    /// Where it was found.
    pub source: String,
    /// Verifiers: the `reference` object they read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reference_schema: Option<String>,
    /// Optimizers: their data mode.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data_mode: Option<String>,
    /// What the plugin found about this host when it loaded (e.g. sandbox layers).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
    /// When it was loaded, RFC 3339.
    pub loaded_at: String,
}

/// A refused library, as `GET /v1/plugins` lists it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct RefusedView {
    /// The file.
    pub source: String,
    /// The class of problem (the `reason` label of `rlvr_plugin_refusals_total`).
    pub reason: String,
    /// What was wrong.
    pub message: String,
    /// When, RFC 3339.
    pub at: String,
}

/// `GET /v1/plugins`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct PluginList {
    /// Loaded plugins, by name then version.
    pub plugins: Vec<PluginView>,
    /// Refused files that are still present.
    pub refused: Vec<RefusedView>,
}

/// `POST /v1/jobs/{id}/promote` body.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct PromoteRequest {
    /// Must be true: a promotion overrides the gates.
    pub force: bool,
    /// Why; recorded in the manifest with the admin's team and the time.
    pub reason: String,
}

/// `POST /v1/curricula/{name}/refresh` answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Refreshed {
    /// The curriculum.
    pub name: String,
    /// The UTC date the refresh counts for.
    pub date: String,
    /// This request ran the refresh; false when an earlier one today did (or runs now).
    pub ran: bool,
    /// The version written today; `None` while another asker's refresh still runs.
    pub version: Option<u64>,
    /// Rollout records the version added (when this request ran it).
    pub records: Option<u64>,
    /// What happened, in words.
    pub message: String,
}
