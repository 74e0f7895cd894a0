//! A rejection-sampling job's end: its dataset judged ([`judge`], pure) and, when every
//! criterion passes, published as the team's dataset `optimizer.output` ([`gate_and_publish`]):
//! the same content-addressed store `PUT /v1/datasets/{name}` writes, so a later job of the team
//! names it `dataset:NAME@SHA256` — the job's `output` — and no other team
//! can.
//!
//! [`judge`] reads the rows, the acceptance rate and the mean reward.

use std::fs;
use std::io::{self, Read as _, Write as _};

use rlvr_protocol::builtin::{RejectionSamplingOptions, SampledDataset};
use rlvr_protocol::gates::{Criterion, GateReport, Op};
use rlvr_protocol::job::JobOutput;
use rlvr_protocol::spec::JobSpec;
use rlvr_protocol::worker::Outcome;
use sha2::{Digest, Sha256};

use crate::tenancy::datasets::{DatasetError, Datasets};

/// What the gates decided about a dataset.
#[derive(Debug, Clone, PartialEq)]
pub enum DatasetVerdict {
    /// Published as the team's dataset (a spec names it `dataset:NAME@SHA256`), and the report.
    Published { output: JobOutput, report: GateReport },
    /// Refused: the failing criteria, one line each.
    Refused { reason: String, report: GateReport },
}

/// Why a dataset the gates let through could not be published.
#[derive(Debug, thiserror::Error)]
pub enum OutputError {
    #[error("optimizer: {0}")]
    Options(String),
    #[error("publishing dataset {name:?}: {source}")]
    Store { name: String, source: DatasetError },
}

/// The gate table of a dataset: at least `min_accepted` rows (1 by default: an empty dataset
/// is never published), the acceptance rate when asked for, and the rows' mean reward shown.
pub fn judge(options: &RejectionSamplingOptions, produced: Option<&SampledDataset>) -> GateReport {
    let accepted = produced.map(|p| p.accepted as f64);
    let note = match produced {
        Some(p) => format!(
            "{} rows from {} completions of {} prompts ({} duplicates left out)",
            p.accepted, p.completions, p.prompts, p.duplicates
        ),
        None => "the worker reported no dataset".to_owned(),
    };
    let rate = produced.and_then(SampledDataset::acceptance_rate);
    let rate_note = match produced {
        Some(p) => format!("{} of {} prompts got a row", p.prompts_accepted, p.prompts),
        None => "the worker reported no dataset".to_owned(),
    };
    let reward_note = match produced.and_then(|p| Some((p.accepted_reward_mean()?, p.reward_mean()?))) {
        Some((accepted, all)) => {
            format!("mean reward of the rows {accepted:.4}, of every completion {all:.4}")
        }
        None => "no rows".to_owned(),
    };
    let criteria = vec![
        Criterion::judged("accepted_rows", Op::AtLeast, accepted, Some(options.min_accepted as f64), note),
        Criterion::judged("acceptance_rate", Op::AtLeast, rate, options.min_acceptance_rate, rate_note),
        Criterion::judged(
            "accepted_reward_mean",
            Op::AtLeast,
            produced.and_then(SampledDataset::accepted_reward_mean),
            options.threshold,
            reward_note,
        ),
    ];
    GateReport::new(None, criteria)
}

/// Judges the dataset of `outcome` and, when it passes, publishes `rows` (the job's own run
/// directory's file, never a path the worker reported) as `spec`'s team's dataset
/// `optimizer.output` (replacing that name's content, as an upload does).
pub fn gate_and_publish(
    spec: &JobSpec,
    outcome: &Outcome,
    rows: &std::path::Path,
    datasets: &Datasets,
    max_datasets: u32,
) -> Result<DatasetVerdict, OutputError> {
    let options = RejectionSamplingOptions::from_spec(spec)
        .map_err(|error| OutputError::Options(format!("{}: {}", error.field, error.message)))?;
    let report = judge(&options, outcome.dataset.as_ref());
    if outcome.dataset.is_none() || !report.passed {
        return Ok(DatasetVerdict::Refused { reason: report.refusal(), report });
    }
    let name = options.output.clone();
    let store = |source: DatasetError| OutputError::Store { name: name.clone(), source };
    let team = spec.job.team.as_str();
    let incoming = datasets.incoming(team).map_err(|error| store(error.into()))?;
    let (sha256, bytes) = copy_hashing(rows, &incoming).map_err(|error| {
        let _ = fs::remove_file(&incoming);
        store(error.into())
    })?;
    let (dataset, _) =
        datasets.finish(team, &name, &incoming, &sha256, bytes, max_datasets).map_err(store)?;
    let output = JobOutput::Dataset { name: dataset.name, sha256: dataset.sha256 };
    Ok(DatasetVerdict::Published { output, report })
}

/// Copies `from` to `to`, fsynced; its SHA-256 and length.
fn copy_hashing(from: &std::path::Path, to: &std::path::Path) -> io::Result<(String, u64)> {
    let mut source = fs::File::open(from)?;
    let mut target = fs::File::create(to)?;
    let mut hasher = Sha256::new();
    let mut buffer = vec![0u8; 1 << 16];
    let mut bytes = 0u64;
    loop {
        let read = source.read(&mut buffer)?;
        if read == 0 {
            break;
        }
        hasher.update(&buffer[..read]);
        target.write_all(&buffer[..read])?;
        bytes += read as u64;
    }
    target.sync_all()?;
    Ok((hex::encode(hasher.finalize()), bytes))
}

#[cfg(test)]
mod tests {
    use rlvr_protocol::gates::Status;

    use super::*;

    fn options(keys: &str) -> RejectionSamplingOptions {
        let spec = JobSpec::from_toml(&format!(
            "[job]\nname = \"rs\"\nteam = \"t\"\nmodel_line = \"l\"\n[model]\npolicy = \"builtin:tiny-arith\"\n\
             [data]\ntrain = \"dataset:d\"\n[budget]\nmax_steps = 1\n[optimizer]\nplugin = \"rejection-sampling\"\n\
             output = \"o\"\n{keys}"
        ))
        .unwrap();
        RejectionSamplingOptions::from_spec(&spec).unwrap()
    }

    fn produced(prompts: u64, prompts_accepted: u64, accepted: u64) -> SampledDataset {
        SampledDataset {
            prompts,
            completions: prompts * 4,
            accepted,
            prompts_accepted,
            reward_sum: accepted as f64,
            all_reward_sum: prompts_accepted as f64,
            ..SampledDataset::default()
        }
    }

    fn check(keys: &str, dataset: Option<SampledDataset>, expected: [Status; 3]) {
        let report = judge(&options(keys), dataset.as_ref());
        let got: Vec<Status> = report.criteria.iter().map(|c| c.status).collect();
        assert_eq!(got, expected, "{keys} {dataset:?}: {report:?}");
        assert_eq!(report.passed, !expected.contains(&Status::Fail));
    }

    #[test]
    fn a_dataset_passes_with_rows_and_the_asked_rate() {
        use Status::{Fail, NotChecked, Pass};
        check("", Some(produced(10, 3, 3)), [Pass, NotChecked, NotChecked]);
        // Nothing accepted: never published, whatever else was asked.
        check("", Some(produced(10, 0, 0)), [Fail, NotChecked, NotChecked]);
        check("", None, [Fail, NotChecked, NotChecked]);
        check("min_accepted = 4", Some(produced(10, 3, 3)), [Fail, NotChecked, NotChecked]);
        check("min_acceptance_rate = 0.5", Some(produced(10, 3, 3)), [Pass, Fail, NotChecked]);
        check("min_acceptance_rate = 0.3", Some(produced(10, 3, 6)), [Pass, Pass, NotChecked]);
        check("threshold = 0.5", Some(produced(10, 3, 3)), [Pass, NotChecked, Pass]);
    }
}
