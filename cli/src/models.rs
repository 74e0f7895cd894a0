//! `rlvrctl models`: the model lines a team may see, a line's published versions, one version's
//! manifest, and its files downloaded with every SHA-256 checked against that manifest.
//!
//! A download writes into a staging directory next to the target and renames it into place only
//! when every file matched: a failure (a dropped connection, a tampered file) leaves nothing
//! behind that looks like a model.

use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use rlvr_client::{Client, Exit, HttpError};
use rlvr_protocol::gates::Manifest;
use sha2::{Digest, Sha256};

use crate::LineCommand;
use crate::answer::{BadInput, Context, Json};
use crate::render::{format_table, short_time};

/// Why a download did not end in a complete, checked directory.
#[derive(Debug, thiserror::Error)]
pub(crate) enum DownloadError {
    #[error("{0} exists and is not empty; choose another directory or empty it")]
    NotEmpty(PathBuf),
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: io::Error },
    #[error(transparent)]
    Http(#[from] HttpError),
    #[error("{file}: SHA-256 {got}, but the manifest of version {version} says {expected}; nothing was kept")]
    Mismatch { file: String, version: u64, expected: String, got: String },
}

/// A version in a command line: a number or `latest`.
pub(crate) fn parse_version(text: &str) -> Result<Option<u64>, String> {
    match text {
        "latest" => Ok(None),
        number => {
            number.parse().map(Some).map_err(|_| format!("{text:?} is not a version number or `latest`"))
        }
    }
}

/// `rlvrctl models LINE`: one row per published version, from its manifest.
pub(crate) fn versions_table(manifests: &[Manifest]) -> String {
    let rows: Vec<[String; 6]> = manifests
        .iter()
        .map(|manifest| {
            let evaluation = manifest.metrics.evaluation.as_ref();
            let accuracy = |scores: &rlvr_protocol::worker::ModelScores| {
                scores.heldout.as_ref().map(|score| score.figures.accuracy)
            };
            let heldout = match evaluation.map(|e| (accuracy(&e.baseline_scores), accuracy(&e.candidate))) {
                Some((Some(before), Some(after))) => format!("{before:.3} → {after:.3}"),
                Some((None, Some(after))) => format!("{after:.3}"),
                _ => "-".to_owned(),
            };
            [
                manifest.version.to_string(),
                short_time(&manifest.published_at),
                manifest.job_id.clone(),
                manifest.step.to_string(),
                heldout,
                gates_word(&manifest.gates).to_owned(),
            ]
        })
        .collect();
    format_table(["VERSION", "PUBLISHED", "JOB", "STEP", "HELD-OUT", "GATES"], &rows)
}

/// How a version got through its gates.
fn gates_word(report: &rlvr_protocol::gates::GateReport) -> &'static str {
    match (report.passed, &report.forced) {
        (true, _) => "passed",
        (false, Some(_)) => "forced by an admin",
        (false, None) => "refused",
    }
}

/// `rlvrctl models LINE VERSION`: what a version is, from its manifest.
pub(crate) fn manifest_block(manifest: &Manifest) -> String {
    let mut text = format!(
        "line:      {}@{}\njob:       {} (step {})\npublished: {}\nweights:   sha256 {}\n",
        manifest.model_line,
        manifest.version,
        manifest.job_id,
        manifest.step,
        manifest.published_at,
        manifest.weights_sha256,
    );
    text.push_str(&format!("gates:     {}\n", gates_word(&manifest.gates)));
    text.push_str("files:\n");
    for (name, sha256) in &manifest.files {
        text.push_str(&format!("  {name}  {sha256}\n"));
    }
    text
}

/// Downloads `manifest`'s version of its line into `dir` (created; it must not hold anything),
/// with `manifest.json` beside the files. Prints a line per file on stderr.
pub(crate) fn download(api: &Client, manifest: &Manifest, dir: &Path) -> Result<(), DownloadError> {
    let io_error = |path: &Path| {
        let path = path.to_owned();
        move |source| DownloadError::Io { path, source }
    };
    if fs::read_dir(dir).is_ok_and(|mut entries| entries.next().is_some()) {
        return Err(DownloadError::NotEmpty(dir.to_owned()));
    }
    let parent = match dir.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent.to_owned(),
        _ => PathBuf::from("."),
    };
    fs::create_dir_all(&parent).map_err(io_error(&parent))?;
    // In the target's own directory, so the rename at the end is atomic (one filesystem).
    let staging =
        tempfile::Builder::new().prefix(".rlvr-download-").tempdir_in(&parent).map_err(io_error(&parent))?;
    for (name, expected) in &manifest.files {
        let path = staging.path().join(name);
        let file = fs::File::create(&path).map_err(io_error(&path))?;
        let mut sink = Hashing { file, hasher: Sha256::new() };
        let bytes = api.download_file(&manifest.model_line, manifest.version, name, &mut sink)?;
        sink.file.sync_all().map_err(io_error(&path))?;
        let got = hex::encode(sink.hasher.finalize());
        if got != *expected {
            return Err(DownloadError::Mismatch {
                file: name.clone(),
                version: manifest.version,
                expected: expected.clone(),
                got,
            });
        }
        eprintln!("rlvrctl: {name}: {bytes} bytes, sha256 checked");
    }
    let manifest_path = staging.path().join("manifest.json");
    let text =
        serde_json::to_string_pretty(manifest).map_err(|error| io_error(&manifest_path)(error.into()))?;
    fs::write(&manifest_path, text).map_err(io_error(&manifest_path))?;
    // An empty target (made by hand) is replaced; a missing one is made by the rename.
    if dir.exists() {
        fs::remove_dir(dir).map_err(io_error(dir))?;
    }
    let staged = staging.keep();
    fs::rename(&staged, dir).map_err(|source| {
        let _ = fs::remove_dir_all(&staged);
        DownloadError::Io { path: dir.to_owned(), source }
    })?;
    Ok(())
}

/// A file that hashes what is written to it.
struct Hashing {
    file: fs::File,
    hasher: Sha256,
}

impl Write for Hashing {
    fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
        let written = self.file.write(bytes)?;
        self.hasher.update(&bytes[..written]);
        Ok(written)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.file.flush()
    }
}

/// `models`: every model line the team may read, with its versions.
pub(crate) fn list(cx: &Context) -> anyhow::Result<Exit> {
    let list = cx.client()?.model_lines()?;
    cx.answer(&list, Json::Block, || {
        let rows: Vec<[String; 3]> = list
            .lines
            .iter()
            .map(|line| {
                let newest = line.versions.last().map_or("-".to_owned(), u64::to_string);
                [line.name.clone(), line.owner.clone(), format!("{} (newest {newest})", line.versions.len())]
            })
            .collect();
        format_table(["LINE", "OWNER", "VERSIONS"], &rows)
    })?;
    Ok(Exit::Done)
}

/// `models LINE`: each published version's manifest.
pub(crate) fn versions(cx: &Context, line: &str) -> anyhow::Result<Exit> {
    let api = cx.client()?;
    let versions = api.model_line(line)?.versions;
    let manifests =
        versions.iter().map(|version| api.manifest(line, Some(*version))).collect::<Result<Vec<_>, _>>()?;
    cx.answer(&manifests, Json::Block, || {
        if manifests.is_empty() {
            eprintln!("rlvrctl: model line {line} has no published version yet");
            return String::new();
        }
        versions_table(&manifests)
    })?;
    Ok(Exit::Done)
}

/// `models LINE [VERSION] [--download DIR]`: one version's manifest, or its files downloaded.
pub(crate) fn show(
    cx: &Context,
    line: &str,
    version: Option<String>,
    download_to: Option<PathBuf>,
) -> anyhow::Result<Exit> {
    let api = cx.client()?;
    let version = version.as_deref().map(parse_version).transpose().map_err(BadInput)?.flatten();
    let manifest = api.manifest(line, version)?;
    match download_to {
        Some(dir) => {
            download(&api, &manifest, &dir).map_err(|error| match error {
                DownloadError::Http(http) => anyhow::Error::from(http),
                other => BadInput(other.to_string()).into(),
            })?;
            println!("{}", dir.display());
        }
        None => cx.answer(&manifest, Json::Block, || manifest_block(&manifest))?,
    }
    Ok(Exit::Done)
}

/// `line list | show | set`: model lines' owners, readers, publishers and gate policy.
pub(crate) fn lines(cx: &Context, command: LineCommand) -> anyhow::Result<Exit> {
    let api = cx.client()?;
    let lines = match command {
        LineCommand::List => api.model_lines()?.lines,
        LineCommand::Show { name } => vec![api.model_line(&name)?],
        LineCommand::Set { name, readers, publishers, policy, owner } => {
            let policy = policy
                .map(|text| serde_json::from_str(&text))
                .transpose()
                .map_err(|error| BadInput(format!("--policy: {error}")))?;
            let update = rlvr_protocol::api::ModelLineUpdate { owner, readers, publishers, policy };
            vec![api.put_model_line(&name, &update)?]
        }
    };
    for line in &lines {
        let policy = serde_json::to_string(&line.policy)?;
        cx.answer(line, Json::Line, || {
            format!(
                "{}\towner {}\treaders [{}]\tpublishers [{}]\tversions {:?}\tpolicy {policy}\n",
                line.name,
                line.owner,
                line.readers.join(","),
                line.publishers.join(","),
                line.versions,
            )
        })?;
    }
    Ok(Exit::Done)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_are_numbers_or_latest() {
        let check = |text: &str, expected: Result<Option<u64>, ()>| {
            assert_eq!(parse_version(text).map_err(drop), expected, "{text}");
        };
        check("latest", Ok(None));
        check("3", Ok(Some(3)));
        check("v3", Err(()));
        check("-1", Err(()));
        check("", Err(()));
    }
}
