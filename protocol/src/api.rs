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

/// A team's dataset (`PUT /v1/datasets/{name}`, `GET /v1/datasets`): a name pointing at content,
/// which a spec names as `dataset:NAME` (pinned at submit to `dataset:NAME@SHA256`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Dataset {
    pub name: String,
    /// The content's sha256, hex.
    pub sha256: String,
    pub bytes: u64,
    /// JSON records (non-empty lines).
    pub records: u64,
    /// RFC 3339.
    pub uploaded_at: String,
}

/// `GET /v1/datasets`: the caller's team's datasets, by name.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct DatasetList {
    pub datasets: Vec<Dataset>,
}

/// A model line: who owns it, who may read and publish into it, its gate policy (a floor jobs
/// may tighten, never loosen) and its published versions.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ModelLine {
    pub name: String,
    /// The team that owns it: it publishes, reads and sets the rest.
    pub owner: String,
    /// Other teams that may start jobs from its versions (`model.policy = "line:NAME@N"`).
    #[serde(default)]
    pub readers: Vec<String>,
    /// Other teams that may publish into it (under its policy).
    #[serde(default)]
    pub publishers: Vec<String>,
    /// The floor of every job's `[gates]` publishing here.
    #[serde(default)]
    pub policy: crate::spec::GatesSection,
    /// Published version numbers, oldest first.
    #[serde(default)]
    pub versions: Vec<u64>,
}

/// `PUT /v1/model-lines/{name}`: creates the line (owned by the caller's team, or by `owner` when
/// an admin says so) or changes it (its owner or an admin). Fields left out stay as they are.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct ModelLineUpdate {
    /// Admins only: hand the line to this team.
    #[serde(default)]
    pub owner: Option<String>,
    #[serde(default)]
    pub readers: Option<Vec<String>>,
    #[serde(default)]
    pub publishers: Option<Vec<String>>,
    #[serde(default)]
    pub policy: Option<crate::spec::GatesSection>,
}

/// A team's curriculum (`GET /v1/curricula`): a job of its team names it `NAME`, a job of a reader
/// team `OWNER/NAME`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Curriculum {
    /// The team whose jobs feed it and who refreshes it.
    pub owner: String,
    pub name: String,
    /// The teams it is shared with (shown to its owner only).
    #[serde(default)]
    pub readers: Vec<String>,
    /// Its newest version, none before its first refresh.
    pub latest_version: Option<u64>,
}

/// `PUT /v1/curricula/{name}`: the teams the caller's team shares its curriculum with (replacing
/// the list; `[]` takes every grant back).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct CurriculumUpdate {
    pub readers: Vec<String>,
}

/// `GET /v1/curricula`: the caller's team's curricula and those shared with it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct CurriculumList {
    pub curricula: Vec<Curriculum>,
}

/// `GET /v1/model-lines`: the lines the caller's team may read.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ModelLineList {
    pub lines: Vec<ModelLine>,
}

/// `POST /v1/verify` and `POST /v1/graders/validate`: one grader, or a reward (graders and their
/// formula), and for `verify` the items to grade in the batch format (design.md §1).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct VerifyRequest {
    /// One `[[verifiers]]` entry as JSON, e.g. `{"plugin": "math", "fallback": "last"}`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grader: Option<crate::spec::PluginSection>,
    /// Graders and the formula over their names, as a job's `[[verifiers]]` and `[reward]`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reward: Option<RewardRequest>,
    /// Items in the batch format: `{"id", "prompt", "completion", "reference": {...}}`
    /// (`pred` and `gold` accepted). Ignored by `validate`.
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(value_type = Vec<Object>))]
    pub items: Vec<serde_json::Value>,
}

impl VerifyRequest {
    /// Most items one `POST /v1/verify` grades: the daemon refuses more, `rlvrctl verify
    /// --server` sends its input in requests of this many.
    pub const MAX_ITEMS: usize = 256;
}

/// A reward to dry-run: a job's `[[verifiers]]` (here `graders`) and `[reward] formula` (absent:
/// the graders' weighted sum).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct RewardRequest {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub formula: Option<String>,
    pub graders: Vec<crate::spec::PluginSection>,
}

/// `POST /v1/verify`'s answer: one line per item, in the items' order. A reward's line has the
/// reward as `score`, each grader's score and components as `NAME` and `NAME.COMPONENT`, and
/// `verifier` = `reward`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct VerifyResults {
    pub results: Vec<crate::batch::OutputLine>,
}

/// `POST /v1/graders/validate`'s answer: the graders as a job would use them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct GradersValid {
    pub graders: Vec<GraderCheck>,
    /// The formula, when there is one, as it will be evaluated.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub formula: Option<String>,
}

/// One grader that checked out.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct GraderCheck {
    /// Its name in the formula and in the components.
    pub name: String,
    /// `name@version` of the plugin a job submitted now would pin.
    pub plugin: String,
    /// Whether the plugin checked its options (one built before `check_options` is checked
    /// when a job creates it).
    pub options_checked: bool,
    /// Secret names its options use (each one the team's).
    #[serde(default)]
    pub secrets: Vec<String>,
    /// Destinations it will call (each allowed by the operator).
    #[serde(default)]
    pub urls: Vec<String>,
    /// SHA-256 of content its options carry (a `python` grader's `source`), by option key: what
    /// a job's manifest records.
    #[serde(default)]
    pub digests: std::collections::BTreeMap<String, String>,
}
