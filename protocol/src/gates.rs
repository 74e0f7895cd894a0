//! The gate report (design.md §6): one line per criterion with its measured value, threshold and
//! [`Status`], judged once by the daemon and shown as it is by `rlvrctl gates`, the HTML report,
//! the API and the published manifest.
//!
//! Each [`Criterion`] has a [`Status`] (pass, fail, not checked) and an [`Op`]; the published
//! [`Manifest`] is here too. Every reader prints `status` as it is.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::spec::JobSpec;
use crate::worker::{Baseline, CandidateCheckpoint, GateEvaluation, Outcome, PluginUse, Trend};

/// How a criterion's measured value must compare with its threshold to pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub enum Op {
    /// `measured >= threshold`.
    #[serde(rename = ">=")]
    AtLeast,
    /// `measured <= threshold`.
    #[serde(rename = "<=")]
    AtMost,
}

impl Op {
    /// `>=` or `<=`.
    pub fn as_str(self) -> &'static str {
        match self {
            Op::AtLeast => ">=",
            Op::AtMost => "<=",
        }
    }

    /// The comparison a failing value makes: `<` or `>`.
    pub fn broken(self) -> &'static str {
        match self {
            Op::AtLeast => "<",
            Op::AtMost => ">",
        }
    }

    /// Whether `measured` passes `threshold`.
    pub fn holds(self, measured: f64, threshold: f64) -> bool {
        match self {
            Op::AtLeast => measured >= threshold,
            Op::AtMost => measured <= threshold,
        }
    }
}

/// A criterion's result.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum Status {
    /// Measured and within its threshold.
    Pass,
    /// Outside its threshold, or asked for (a threshold) and not measurable.
    Fail,
    /// Not judged: nothing was asked for (no threshold), or nothing could be measured. Shown,
    /// never a reason to refuse.
    NotChecked,
}

impl Status {
    /// `pass`, `FAIL` or `not checked`: how the CLI and the report print it.
    pub fn label(self) -> &'static str {
        match self {
            Status::Pass => "pass",
            Status::Fail => "FAIL",
            Status::NotChecked => "not checked",
        }
    }
}

/// One criterion's line of the gate table.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(from = "CriterionRecord")]
pub struct Criterion {
    /// `heldout_gain`, `canary_regressions`, …
    pub name: String,
    /// The result.
    pub status: Status,
    /// The value measured, when there was one.
    pub measured: Option<f64>,
    /// The threshold, when one applies.
    pub threshold: Option<f64>,
    /// How `measured` compares with `threshold` to pass.
    pub op: Op,
    /// What was measured, in words.
    pub note: String,
    /// The confidence interval `measured` was read from, for a criterion judged on one
    /// (`heldout_gain`: the interval's lower bound is what must clear the threshold).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interval: Option<PairedInterval>,
}

/// A paired comparison's estimate and confidence interval: the candidate's and the baseline's
/// verdicts on the same prompts (`heldout_gain`).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct PairedInterval {
    /// The gain measured on the prompts themselves (after − before).
    pub estimate: f64,
    /// The interval's bounds.
    pub low: f64,
    pub high: f64,
    /// Its confidence level (0.95).
    pub confidence: f64,
    /// Prompts paired.
    pub prompts: usize,
    /// Prompts the candidate passed and the baseline failed, and the other way round: only these
    /// discordant pairs move the gain.
    pub improved: usize,
    pub regressed: usize,
}

impl PairedInterval {
    /// `[+0.0208, +0.1458] 95%, 48 prompts`: the gate table's interval column.
    pub fn bounds(&self) -> String {
        format!(
            "[{:+.4}, {:+.4}] {:.0}%, {} prompts",
            self.low,
            self.high,
            self.confidence * 100.0,
            self.prompts
        )
    }

    /// `+0.0833 [95% +0.0208, +0.1458], 48 prompts (5 better, 1 worse)`.
    pub fn describe(&self) -> String {
        format!(
            "{:+.4} [{:.0}% {:+.4}, {:+.4}], {} prompts ({} better, {} worse)",
            self.estimate,
            self.confidence * 100.0,
            self.low,
            self.high,
            self.prompts,
            self.improved,
            self.regressed
        )
    }
}

impl Criterion {
    /// The criterion judged the usual way: measured against its threshold; without a threshold,
    /// not checked; with a threshold and nothing measured, failed (never a silent pass).
    pub fn judged(name: &str, op: Op, measured: Option<f64>, threshold: Option<f64>, note: String) -> Self {
        let status = match (measured, threshold) {
            (Some(measured), Some(threshold)) if op.holds(measured, threshold) => Status::Pass,
            (Some(_), Some(_)) => Status::Fail,
            (_, None) => Status::NotChecked,
            (None, Some(_)) => Status::Fail,
        };
        Criterion { name: name.to_owned(), status, measured, threshold, op, note, interval: None }
    }

    /// With the interval `measured` was read from.
    pub fn with_interval(self, interval: PairedInterval) -> Self {
        Criterion { interval: Some(interval), ..self }
    }

    /// Whether the criterion lets the candidate through (passed or not checked).
    pub fn allows(&self) -> bool {
        self.status != Status::Fail
    }

    /// `heldout_gain: -0.0200 < 0 (held-out accuracy 0.3100 → 0.2900)`.
    pub fn failure(&self) -> String {
        match (self.measured, self.threshold) {
            (Some(measured), Some(threshold)) => {
                format!("{}: {measured:.4} {} {threshold} ({})", self.name, self.op.broken(), self.note)
            }
            _ => format!("{}: {}", self.name, self.note),
        }
    }
}

/// A criterion as stored: with `status`, or from a record written before there was one (its
/// `passed`, and "not checked" where a number was missing).
#[derive(Deserialize)]
struct CriterionRecord {
    name: String,
    status: Option<Status>,
    #[serde(default)]
    passed: Option<bool>,
    measured: Option<f64>,
    threshold: Option<f64>,
    op: Op,
    note: String,
    #[serde(default)]
    interval: Option<PairedInterval>,
}

impl From<CriterionRecord> for Criterion {
    fn from(record: CriterionRecord) -> Self {
        let status = record.status.unwrap_or(match (record.passed, record.measured, record.threshold) {
            (Some(false), ..) => Status::Fail,
            (_, Some(_), Some(_)) => Status::Pass,
            _ => Status::NotChecked,
        });
        Criterion {
            name: record.name,
            status,
            measured: record.measured,
            threshold: record.threshold,
            op: record.op,
            note: record.note,
            interval: record.interval,
        }
    }
}

/// An admin's promotion of a refused candidate, recorded in the manifest.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Forced {
    /// The admin token's team.
    pub by: String,
    /// Why, in the admin's words.
    pub reason: String,
    /// RFC 3339.
    pub at: String,
}

/// The gate report stored with the job (`gates`) and in the manifest.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct GateReport {
    /// No criterion failed.
    pub passed: bool,
    /// What the candidate was compared with; `None` when it was not evaluated.
    pub baseline: Option<Baseline>,
    /// One line per criterion, in design.md §6's order.
    pub criteria: Vec<Criterion>,
    /// An admin's override, when the candidate was promoted by force.
    #[serde(default)]
    pub forced: Option<Forced>,
    /// Which of the run's checkpoints was judged (the best-scoring retained one) and its score;
    /// absent in reports made before the choice.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub candidate: Option<CandidateCheckpoint>,
}

impl CandidateCheckpoint {
    /// `checkpoint step 10 (held-out 0.4500; the best of 3 scored checkpoints kept)`: which
    /// checkpoint the gates judged, as the gate table says it.
    pub fn describe(&self) -> String {
        match self.heldout {
            Some(heldout) => format!(
                "checkpoint step {} (held-out {heldout:.4} when scored; the best of {} scored checkpoint{} kept)",
                self.step,
                self.scored.len(),
                if self.scored.len() == 1 { "" } else { "s" }
            ),
            None => format!("checkpoint step {} (the last; nothing was scored to choose by)", self.step),
        }
    }
}

impl GateReport {
    /// A report over `criteria`: passed when none failed.
    pub fn new(baseline: Option<Baseline>, criteria: Vec<Criterion>) -> Self {
        GateReport {
            passed: criteria.iter().all(Criterion::allows),
            baseline,
            criteria,
            forced: None,
            candidate: None,
        }
    }

    /// The refusal: each failing criterion with its measured value and threshold.
    pub fn refusal(&self) -> String {
        let failed: Vec<String> =
            self.criteria.iter().filter(|criterion| !criterion.allows()).map(Criterion::failure).collect();
        format!("gates refused: {}", failed.join("; "))
    }

    /// Whether the candidate was published: it passed, or an admin forced it.
    pub fn promoted(&self) -> bool {
        self.passed || self.forced.is_some()
    }
}

/// `manifest.json` of a published version (design.md §1): what was published, from what, and
/// why it was let through. POSTed as it is to the job's webhook.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    /// The job that trained it.
    pub job_id: String,
    /// The model line.
    pub model_line: String,
    /// Its version in the line (set when it is published).
    pub version: u64,
    /// The training step of the published checkpoint.
    pub step: u64,
    /// SHA-256 over the trained tensors.
    pub weights_sha256: String,
    /// The plugins it trained with.
    pub plugins: Vec<PluginUse>,
    /// SHA-256 of each data file.
    pub data_sha256: BTreeMap<String, String>,
    /// Training's trend, the gates' evaluation, and why training stopped early.
    pub metrics: ManifestMetrics,
    /// The gate report.
    pub gates: GateReport,
    /// The job's spec.
    pub spec: JobSpec,
    /// RFC 3339, UTC.
    pub published_at: String,
    /// SHA-256 of every file of the version, by name (set when it is published).
    pub files: BTreeMap<String, String>,
}

impl Manifest {
    /// The manifest of `outcome`'s checkpoint, trained by job `job_id` of `spec` and let through
    /// by `gates`; publishing fills in its `version` and `files`.
    pub fn new(
        job_id: &str,
        spec: &JobSpec,
        outcome: &Outcome,
        gates: GateReport,
        published_at: String,
    ) -> Self {
        Manifest {
            job_id: job_id.to_owned(),
            model_line: spec.job.model_line.clone(),
            version: 0,
            // The step of the weights published: the chosen checkpoint's.
            step: outcome.candidate.as_ref().map_or(outcome.steps, |candidate| candidate.step),
            weights_sha256: outcome.weights_sha256.clone(),
            plugins: outcome.plugins.clone(),
            data_sha256: outcome.data_sha256.clone(),
            metrics: ManifestMetrics {
                training: outcome.training,
                evaluation: outcome.evaluation.clone(),
                stopped: outcome.stopped.clone(),
            },
            gates,
            spec: spec.clone(),
            published_at,
            files: BTreeMap::new(),
        }
    }
}

/// The figures a manifest keeps.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ManifestMetrics {
    /// Training's trend.
    pub training: Option<Trend>,
    /// The gates' evaluation.
    pub evaluation: Option<GateEvaluation>,
    /// Why training stopped before `budget.max_steps`.
    pub stopped: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(op: Op, measured: Option<f64>, threshold: Option<f64>, expected: Status) {
        let criterion = Criterion::judged("c", op, measured, threshold, String::new());
        assert_eq!(criterion.status, expected, "{op:?} {measured:?} {threshold:?}");
    }

    #[test]
    fn a_criterion_passes_fails_or_is_not_checked() {
        check(Op::AtLeast, Some(0.1), Some(0.0), Status::Pass);
        check(Op::AtLeast, Some(-0.1), Some(0.0), Status::Fail);
        check(Op::AtMost, Some(2.0), Some(2.0), Status::Pass);
        check(Op::AtMost, Some(2.5), Some(2.0), Status::Fail);
        // Measured, nothing asked for: shown only.
        check(Op::AtMost, Some(0.9), None, Status::NotChecked);
        check(Op::AtMost, None, None, Status::NotChecked);
        // Asked for and not measurable: never a pass.
        check(Op::AtLeast, None, Some(0.0), Status::Fail);
    }

    #[test]
    fn the_report_round_trips_and_reads_records_made_before_status() {
        let report = GateReport::new(
            None,
            vec![
                Criterion::judged("kl", Op::AtMost, Some(0.9), None, "measured only".into()),
                Criterion::judged("heldout_gain", Op::AtLeast, Some(-0.1), Some(0.0), "down".into()),
            ],
        );
        assert!(!report.passed);
        assert_eq!(report.refusal(), "gates refused: heldout_gain: -0.1000 < 0 (down)");
        let text = serde_json::to_string(&report).unwrap();
        assert_eq!(serde_json::from_str::<GateReport>(&text).unwrap(), report);
        let old = r#"{"passed": true, "baseline": null, "criteria": [
            {"name": "kl", "passed": true, "measured": 0.9, "threshold": null, "op": "<=", "note": ""},
            {"name": "length_ratio", "passed": true, "measured": 1.0, "threshold": 2.0, "op": "<=", "note": ""},
            {"name": "heldout_gain", "passed": false, "measured": null, "threshold": 0.0, "op": ">=", "note": ""}]}"#;
        let statuses: Vec<Status> =
            serde_json::from_str::<GateReport>(old).unwrap().criteria.iter().map(|c| c.status).collect();
        assert_eq!(statuses, [Status::NotChecked, Status::Pass, Status::Fail]);
    }
}
