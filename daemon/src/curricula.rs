//! Curricula shared across jobs: per-prompt difficulty learned from the rollout records of every
//! job whose spec names the curriculum, kept as numbered, immutable versions that jobs pin.
//!
//! ```text
//! CURRICULA_DIR/
//!   arith/1.json     version 1 (format: `CurriculumVersion`)
//!   arith/2.json     version 2: version 1's counts × decay, plus the records since version 1
//! ```
//!
//! A refresh (`rlvrctl curriculum refresh NAME`, nightly) reads the complete lines each job of
//! the curriculum appended to `<jobs_dir>/<job id>/run/rollouts.jsonl` since the latest version,
//! adds them to that version's decayed counts and writes the next version. Each version records
//! the lines it used per job: the next refresh starts where it stopped, so no record is counted
//! twice. Versions are never rewritten: a job pinned to version N starts from the same counts on
//! every resume.
//!
//! **Concurrency.** A version is written to a temporary file in the curriculum's directory,
//! fsynced, and hard-linked to `<N>.json`; the link fails when that name exists, so two refreshes
//! can never both write N, and a reader sees a version whole or not at all. The refresh that loses
//! the race does not give up and does not return the winner's version: it re-reads the winner's
//! version and computes N+1 from it (its records are then counted once, on top of the winner's),
//! up to [`PUBLISH_ATTEMPTS`] times. Why not return the winner's version: the winner may have
//! read fewer lines than the loser saw, and a caller asking for a refresh should get one that
//! includes what was there when it asked. Once a day per curriculum is enforced above this module
//! (Redis); here, any number of refreshes is correct, just more decay.

use std::collections::BTreeMap;
use std::fs::{self, File};
use std::io::{self, BufRead, BufReader, Write};
use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

pub use rlvr_protocol::curricula::{
    CurriculaError, CurriculumVersion, JobLines, NAME_RULE, PromptCounts, RecordsUsed, SkippedJob, latest,
    latest_number, load, valid_name,
};
use rlvr_protocol::curricula::{check_name, io_error};
use rlvr_protocol::jobdir::JobDir;
use rlvr_protocol::spec::JobSpec;
use rlvr_protocol::worker::RolloutRecord;

/// How many times a refresh computes and tries to publish a version before it reports
/// contention: each lost race means another refresh published in between.
pub const PUBLISH_ATTEMPTS: u32 = 8;

/// Writes the next version of `team`'s curriculum `name` (in `curricula_dir`, that team's
/// directory) from the latest one (its counts × `decay`) and the records the jobs of `team` in
/// `jobs_dir` whose spec names `name` (`curriculum.name`) appended since, and returns it.
///
/// A refresh that finds no new records still writes a version (`records.count` 0, the counts
/// decayed): the nightly run is recorded, and the version says when the curriculum was last
/// looked at. A job directory that cannot be read is skipped, with the reason in
/// [`CurriculumVersion::skipped`]; a malformed complete line of a rollouts file fails the
/// refresh, naming the file and line (a partial last line is a record being written, and waits).
pub fn refresh(
    jobs_dir: &Path,
    curricula_dir: &Path,
    team: &str,
    name: &str,
    decay: f64,
    now: SystemTime,
) -> Result<CurriculumVersion, CurriculaError> {
    check_name(name)?;
    if !(0.0..=1.0).contains(&decay) {
        return Err(CurriculaError::InvalidDecay { decay });
    }
    let dir = curricula_dir.join(name);
    create_dir_durably(curricula_dir, &dir)?;
    // Milliseconds, as the file has them: the returned version equals what `load` reads back.
    let since_epoch = now.duration_since(UNIX_EPOCH).unwrap_or_default();
    let now = UNIX_EPOCH + Duration::from_millis(since_epoch.as_millis() as u64);
    for _ in 0..PUBLISH_ATTEMPTS {
        let previous = latest(curricula_dir, name)?;
        let watermarks: BTreeMap<&str, u64> = previous
            .iter()
            .flat_map(|version| &version.records.jobs)
            .map(|lines| (lines.job.as_str(), lines.to_line))
            .collect();
        let scan = scan_jobs(jobs_dir, team, name, &watermarks)?;
        let next = next_version(name, previous.as_ref(), decay, now, scan);
        if publish(&dir, &next)? {
            return Ok(next);
        }
        // Another refresh published this number first: start again from its version.
    }
    Err(CurriculaError::Contended { dir, attempts: PUBLISH_ATTEMPTS })
}

/// `dir` (and `parent`), with the new entry fsynced into `parent` so a crash cannot lose the
/// directory under a version that was reported written.
fn create_dir_durably(parent: &Path, dir: &Path) -> Result<(), CurriculaError> {
    if dir.is_dir() {
        return Ok(());
    }
    fs::create_dir_all(dir).map_err(io_error(dir))?;
    sync_dir(parent)
}

fn sync_dir(dir: &Path) -> Result<(), CurriculaError> {
    File::open(dir).and_then(|file| file.sync_all()).map_err(io_error(dir))
}

/// Writes `version` as `<dir>/<N>.json` unless that exists; `false` when it does.
fn publish(dir: &Path, version: &CurriculumVersion) -> Result<bool, CurriculaError> {
    let path = dir.join(format!("{}.json", version.version));
    let mut bytes = serde_json::to_vec_pretty(version)
        .map_err(|error| CurriculaError::Io { path: path.clone(), source: io::Error::other(error) })?;
    bytes.push(b'\n');
    // Dropping `temp` removes its name, whether or not it was linked.
    let mut temp =
        tempfile::Builder::new().prefix(".").suffix(".json.tmp").tempfile_in(dir).map_err(io_error(dir))?;
    temp.write_all(&bytes).and_then(|()| temp.as_file().sync_all()).map_err(io_error(temp.path()))?;
    // Not `rename`: it replaces an existing file, and two refreshes would both "publish" N.
    match fs::hard_link(temp.path(), &path) {
        Ok(()) => {}
        Err(error) if error.kind() == io::ErrorKind::AlreadyExists => return Ok(false),
        Err(source) => return Err(CurriculaError::Io { path, source }),
    }
    // The version is in place; a temporary name left behind (a failed unlink) is hidden and
    // harmless, so it does not fail a refresh that has published.
    let _ = temp.close();
    sync_dir(dir)?;
    Ok(true)
}

/// What a refresh read from the jobs directory.
#[derive(Debug, Default)]
struct Scan {
    /// Jobs of the curriculum whose rollouts were read (or held at their watermark).
    read: Vec<JobReading>,
    /// Jobs that could not be read.
    skipped: Vec<SkippedJob>,
    /// Skipped jobs' watermarks from the previous version, kept as empty ranges.
    carried: Vec<JobLines>,
}

/// Per prompt id: (attempts, passes) among the records read.
type Tally = BTreeMap<String, (u64, u64)>;

#[derive(Debug)]
struct JobReading {
    lines: JobLines,
    tally: Tally,
}

/// Reads, for each job dir of `jobs_dir` (by id) whose spec names curriculum `name`, the
/// complete lines of its rollouts file from its watermark on (line 0 for a job new to it).
fn scan_jobs(
    jobs_dir: &Path,
    team: &str,
    name: &str,
    watermarks: &BTreeMap<&str, u64>,
) -> Result<Scan, CurriculaError> {
    let mut scan = Scan::default();
    let entries = match fs::read_dir(jobs_dir) {
        Ok(entries) => entries,
        Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(scan),
        Err(source) => return Err(CurriculaError::Io { path: jobs_dir.to_owned(), source }),
    };
    let mut jobs = Vec::new();
    for entry in entries {
        let entry = entry.map_err(io_error(jobs_dir))?;
        let Ok(job) = entry.file_name().into_string() else {
            // Job ids are ULIDs: a name that is not UTF-8 is no job of ours.
            continue;
        };
        if !job.starts_with('.') && entry.path().is_dir() {
            jobs.push(job);
        }
    }
    jobs.sort();
    for job in jobs {
        let dir = jobs_dir.join(&job);
        let watermark = watermarks.get(job.as_str()).copied();
        let skip = |scan: &mut Scan, reason: String| {
            if let Some(at) = watermark {
                scan.carried.push(JobLines { job: job.clone(), from_line: at, to_line: at });
            }
            scan.skipped.push(SkippedJob { job: job.clone(), reason });
        };
        let job_dir = JobDir::at(dir.clone());
        let spec = match fs::read(job_dir.spec()) {
            Ok(bytes) => match serde_json::from_slice::<JobSpec>(&bytes) {
                Ok(spec) => spec,
                Err(error) => {
                    skip(&mut scan, format!("spec.json: {error}"));
                    continue;
                }
            },
            Err(error) => {
                skip(&mut scan, format!("spec.json: {error}"));
                continue;
            }
        };
        // A team's curriculum learns from that team's jobs only: a reader's job (`TEAM/NAME`)
        // starts from it and never feeds it.
        let named = spec.curriculum.as_ref().and_then(|curriculum| curriculum.name.as_deref());
        let reference = named.and_then(|named| rlvr_protocol::names::CurriculumRef::parse(named).ok());
        if spec.job.team != team
            || reference.is_none_or(|reference| reference.owner_for(team) != team || reference.name != name)
        {
            continue;
        }
        let path = job_dir.run().rollouts();
        match read_rollouts(&path, watermark.unwrap_or(0)) {
            Ok((lines, tally)) => {
                let from_line = watermark.unwrap_or(0);
                // Fewer lines than the watermark: the file was cut back on a resume, and the
                // worker writes the cut lines again, identically (worker/state.rs). Those were
                // counted already: the watermark holds until the file grows past it.
                let to_line = lines.max(from_line);
                scan.read
                    .push(JobReading { lines: JobLines { job: job.clone(), from_line, to_line }, tally });
            }
            Err(RolloutError::Io(error)) => skip(&mut scan, format!("run/rollouts.jsonl: {error}")),
            Err(RolloutError::Malformed { line, message }) => {
                return Err(CurriculaError::MalformedRecord { path, line, message });
            }
        }
    }
    Ok(scan)
}

enum RolloutError {
    Io(io::Error),
    /// `line` is 1-based.
    Malformed {
        line: u64,
        message: String,
    },
}

/// Counts the complete lines of `path` (none when it does not exist) and tallies the records
/// from 0-based line `from` on. A last line without its newline is being written: it is neither
/// counted nor read.
fn read_rollouts(path: &Path, from: u64) -> Result<(u64, Tally), RolloutError> {
    let mut tally = Tally::new();
    let file = match File::open(path) {
        Ok(file) => file,
        Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok((0, tally)),
        Err(error) => return Err(RolloutError::Io(error)),
    };
    let mut reader = BufReader::with_capacity(1 << 16, file);
    let mut line = Vec::new();
    let mut lines = 0u64;
    loop {
        line.clear();
        reader.read_until(b'\n', &mut line).map_err(RolloutError::Io)?;
        if line.last() != Some(&b'\n') {
            break;
        }
        if lines >= from {
            // Without its newline, so a line cut short is an error at its last column.
            let text = &line[..line.len() - 1];
            let record: RolloutRecord = serde_json::from_slice(text).map_err(|error| {
                // serde_json counts lines within the slice: always line 1 here, so say the column.
                let message = error.to_string();
                let position = format!(" at line {} column {}", error.line(), error.column());
                let message = message.strip_suffix(&position).unwrap_or(&message);
                RolloutError::Malformed {
                    line: lines + 1,
                    message: format!("{message} (column {})", error.column()),
                }
            })?;
            let counts = tally.entry(record.prompt_id).or_insert((0, 0));
            counts.0 += 1;
            counts.1 += u64::from(record.passed);
        }
        lines += 1;
    }
    Ok((lines, tally))
}

/// The version after `previous`, from what was read: no IO here.
fn next_version(
    name: &str,
    previous: Option<&CurriculumVersion>,
    decay: f64,
    now: SystemTime,
    scan: Scan,
) -> CurriculumVersion {
    let mut sums: BTreeMap<String, (f64, f64)> = previous
        .iter()
        .flat_map(|version| &version.prompts)
        .map(|(id, counts)| (id.clone(), (counts.attempts * decay, counts.passes * decay)))
        .filter(|(_, (attempts, _))| *attempts > 0.0)
        .collect();
    let mut count = 0;
    let mut jobs = scan.carried;
    for reading in scan.read {
        count += reading.lines.to_line - reading.lines.from_line;
        for (id, (attempts, passes)) in reading.tally {
            let sum = sums.entry(id).or_insert((0.0, 0.0));
            sum.0 += attempts as f64;
            sum.1 += passes as f64;
        }
        jobs.push(reading.lines);
    }
    jobs.sort_by(|a, b| a.job.cmp(&b.job));
    let prompts = sums
        .into_iter()
        .map(|(id, (attempts, passes))| (id, PromptCounts { attempts, passes, pass_rate: passes / attempts }))
        .collect();
    CurriculumVersion {
        name: name.to_owned(),
        version: previous.map_or(1, |version| version.version + 1),
        created_at: now,
        previous: previous.map(|version| version.version),
        decay,
        records: RecordsUsed { count, jobs },
        prompts,
        skipped: scan.skipped,
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;
    use std::sync::{Arc, Barrier};

    use serde_json::json;
    use tempfile::TempDir;

    use super::*;

    /// A state dir's `jobs/` and a curricula dir, in one temporary directory.
    struct Dirs {
        _root: TempDir,
        jobs: PathBuf,
        curricula: PathBuf,
    }

    impl Dirs {
        fn new() -> Dirs {
            let root = tempfile::tempdir().unwrap();
            let jobs = root.path().join("jobs");
            let curricula = root.path().join("curricula");
            fs::create_dir_all(&jobs).unwrap();
            Dirs { jobs, curricula, _root: root }
        }

        /// A job of team `t` whose spec names `curriculum` (none: no `[curriculum]` name).
        fn job(&self, id: &str, curriculum: Option<&str>) -> PathBuf {
            self.job_of("t", id, curriculum)
        }

        /// A job of `team` whose spec names `curriculum`.
        fn job_of(&self, team: &str, id: &str, curriculum: Option<&str>) -> PathBuf {
            let dir = self.jobs.join(id);
            fs::create_dir_all(dir.join("run")).unwrap();
            let section = match curriculum {
                Some(name) => format!("plugin = \"frontier\"\nname = \"{name}\""),
                None => "plugin = \"uniform\"".to_owned(),
            };
            let spec = JobSpec::from_toml(&format!(
                "[job]\nname = \"{id}\"\nteam = \"{team}\"\nmodel_line = \"line\"\n[model]\npolicy = \"builtin:tiny-arith\"\n\
                 [data]\ntrain = \"/t.jsonl\"\n[optimizer]\nplugin = \"grpo\"\n[[verifiers]]\nplugin = \"math\"\n\
                 [budget]\nmax_steps = 2\n[curriculum]\n{section}\n"
            ))
            .unwrap();
            fs::write(dir.join("spec.json"), serde_json::to_vec_pretty(&spec).unwrap()).unwrap();
            dir.join("run").join("rollouts.jsonl")
        }

        fn refresh(&self, decay: f64) -> Result<CurriculumVersion, CurriculaError> {
            refresh(&self.jobs, &self.curricula, "t", "arith", decay, at(0))
        }
    }

    fn at(seconds: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(1_790_000_000 + seconds)
    }

    /// Rollout lines, one per completion: `"p1+"` passed, `"p1-"` failed.
    fn lines(outcomes: &str) -> String {
        outcomes
            .split_whitespace()
            .enumerate()
            .map(|(i, outcome)| {
                let (prompt, passed) = outcome.split_at(outcome.len() - 1);
                let record = RolloutRecord {
                    step: i as u64 / 4 + 1,
                    prompt_id: prompt.to_owned(),
                    group_id: format!("{}-0", i / 4 + 1),
                    passed: passed == "+",
                    reward: if passed == "+" { 1.0 } else { 0.0 },
                    completion: "Answer: 4\n".to_owned(),
                    ..RolloutRecord::default()
                };
                format!("{}\n", serde_json::to_string(&record).unwrap())
            })
            .collect()
    }

    fn append(path: &Path, text: &str) {
        fs::OpenOptions::new()
            .append(true)
            .create(true)
            .open(path)
            .unwrap()
            .write_all(text.as_bytes())
            .unwrap();
    }

    /// `{prompt: (attempts, passes)}` of a version.
    fn counts(version: &CurriculumVersion) -> BTreeMap<&str, (f64, f64)> {
        version.prompts.iter().map(|(id, c)| (id.as_str(), (c.attempts, c.passes))).collect()
    }

    fn ranges(version: &CurriculumVersion) -> Vec<(&str, u64, u64)> {
        version.records.jobs.iter().map(|j| (j.job.as_str(), j.from_line, j.to_line)).collect()
    }

    #[test]
    fn the_first_refresh_counts_the_jobs_of_the_curriculum_only() {
        let dirs = Dirs::new();
        fs::write(dirs.job("job-a", Some("arith")), lines("p1+ p1- p1+ p1+ p2- p2-")).unwrap();
        fs::write(dirs.job("job-b", Some("arith")), lines("p2+ p2- p3-")).unwrap();
        fs::write(dirs.job("job-c", Some("poetry")), lines("p1- p1- p1-")).unwrap();
        fs::write(dirs.job("job-d", None), lines("p1- p1-")).unwrap();
        dirs.job("job-e", Some("arith")); // admitted, no rollouts yet
        // regression: every team's rollouts fed every other team's difficulty estimates
        fs::write(dirs.job_of("u", "job-f", Some("arith")), lines("p3+ p3+")).unwrap();

        let version = dirs.refresh(0.5).unwrap();
        assert_eq!((version.version, version.previous, version.records.count), (1, None, 9));
        assert_eq!(ranges(&version), [("job-a", 0, 6), ("job-b", 0, 3), ("job-e", 0, 0)]);
        assert_eq!(
            counts(&version),
            BTreeMap::from([("p1", (4.0, 3.0)), ("p2", (4.0, 1.0)), ("p3", (1.0, 0.0))])
        );
        assert_eq!(version.prompts["p1"].pass_rate, 0.75);
        assert!(version.skipped.is_empty(), "{:?}", version.skipped);
        assert_eq!(version.created_at, at(0));
        // What was returned is what was written.
        assert_eq!(load(&dirs.curricula, "arith", 1).unwrap(), version);
        assert_eq!(latest(&dirs.curricula, "arith").unwrap(), Some(version.clone()));
        assert_eq!(version.history()["p2"], json!({"passes": 1.0, "attempts": 4.0}));
    }

    #[test]
    fn a_second_refresh_reads_only_new_lines_and_decays_the_old_counts() {
        let dirs = Dirs::new();
        let a = dirs.job("job-a", Some("arith"));
        fs::write(&a, lines("p1+ p1- p1+ p1+")).unwrap();
        dirs.refresh(0.5).unwrap();
        append(&a, &lines("p1- p2+"));
        fs::write(dirs.job("job-b", Some("arith")), lines("p2+")).unwrap();

        let version = refresh(&dirs.jobs, &dirs.curricula, "t", "arith", 0.5, at(86_400)).unwrap();
        assert_eq!((version.version, version.previous, version.records.count), (2, Some(1), 3));
        assert_eq!(ranges(&version), [("job-a", 4, 6), ("job-b", 0, 1)]);
        // p1: (4 attempts, 3 passes) × 0.5 + 1 failed attempt.
        assert_eq!(counts(&version), BTreeMap::from([("p1", (3.0, 1.5)), ("p2", (2.0, 2.0))]));
        assert_eq!(version.prompts["p1"].pass_rate, 0.5);
        assert_eq!(
            humantime::format_rfc3339_millis(version.created_at).to_string(),
            "2026-09-22T14:13:20.000Z"
        );

        // Nothing new: a version all the same, the counts decayed once more.
        let version = dirs.refresh(0.5).unwrap();
        assert_eq!((version.version, version.records.count), (3, 0));
        assert_eq!(ranges(&version), [("job-a", 6, 6), ("job-b", 1, 1)]);
        assert_eq!(counts(&version), BTreeMap::from([("p1", (1.5, 0.75)), ("p2", (1.0, 1.0))]));

        // Decay 0 forgets: prompts with no new records are dropped rather than left at 0/0.
        append(&a, &lines("p3+"));
        let version = dirs.refresh(0.0).unwrap();
        assert_eq!(counts(&version), BTreeMap::from([("p3", (1.0, 1.0))]));
    }

    /// Runs one refresh per entry of `steps` on job `job-a`, whose rollouts file holds the
    /// step's text beforehand (`None`: no file), and checks the lines each refresh used and the
    /// attempts of prompt p1 after it.
    fn check(steps: &[(Option<&str>, (u64, u64), f64)]) {
        let dirs = Dirs::new();
        let path = dirs.job("job-a", Some("arith"));
        for (i, (text, expected_range, expected_attempts)) in steps.iter().enumerate() {
            match text {
                Some(text) => fs::write(&path, text).unwrap(),
                None => fs::remove_file(&path).unwrap_or(()),
            }
            let version = dirs.refresh(1.0).unwrap();
            let (from, to) = *expected_range;
            assert_eq!(ranges(&version), [("job-a", from, to)], "refresh {}", i + 1);
            assert_eq!(version.records.count, to - from, "refresh {}", i + 1);
            let attempts = version.prompts.get("p1").map_or(0.0, |c| c.attempts);
            assert_eq!(attempts, *expected_attempts, "refresh {}", i + 1);
        }
    }

    #[test]
    fn a_partial_last_line_waits_for_its_newline() {
        let three = lines("p1+ p1- p1+");
        let partial = &three[..three.len() - 5];
        check(&[(Some(partial), (0, 2), 2.0), (Some(&three), (2, 3), 3.0), (Some(&three), (3, 3), 3.0)]);
        // Only a partial line: nothing complete yet.
        check(&[(Some(&three[..10]), (0, 0), 0.0), (Some(&three), (0, 3), 3.0)]);
    }

    #[test]
    fn a_rollouts_file_cut_back_on_resume_is_never_counted_twice() {
        let four = lines("p1+ p1- p1+ p1+");
        let six = lines("p1+ p1- p1+ p1+ p1- p1-");
        check(&[
            (Some(&four), (0, 4), 4.0),
            // Cut back to the last checkpoint (2 lines): lines 2 and 3 were counted; the
            // worker writes them again, identically. The watermark holds.
            (Some(&four[..four.len() / 2]), (4, 4), 4.0),
            (Some(&four[..four.len() / 2 + 3]), (4, 4), 4.0),
            // Grown past the watermark: only the lines after it are new.
            (Some(&six), (4, 6), 6.0),
        ]);
        // A file that disappears and comes back behaves the same.
        check(&[(Some(&four), (0, 4), 4.0), (None, (4, 4), 4.0), (Some(&six), (4, 6), 6.0)]);
        check(&[(None, (0, 0), 0.0), (Some(&four), (0, 4), 4.0)]);
    }

    #[test]
    fn a_malformed_line_fails_the_refresh_naming_file_and_line() {
        let cases = [
            (r#"{"prompt_id": "p1", "passed": true"#, "EOF while parsing an object (column 34)"),
            (r#"{"prompt_id": "p1", "reward": 1.0}"#, "missing field `step` (column 34)"),
            (
                r#"{"prompt_id": 7, "passed": true}"#,
                "invalid type: integer `7`, expected a string (column 15)",
            ),
            ("", "EOF while parsing a value (column 0)"),
        ];
        for (bad, message) in cases {
            let dirs = Dirs::new();
            let path = dirs.job("job-a", Some("arith"));
            fs::write(&path, format!("{}{bad}\n{}", lines("p1+"), lines("p1-"))).unwrap();
            let error = dirs.refresh(0.5).unwrap_err();
            assert_eq!(error.to_string(), format!("{}:2: {message}", path.display()), "{bad}");
            assert!(matches!(error, CurriculaError::MalformedRecord { line: 2, .. }));
            assert_eq!(latest(&dirs.curricula, "arith").unwrap(), None, "nothing written");
        }
    }

    #[test]
    fn unreadable_jobs_are_skipped_with_a_reason_and_keep_their_watermark() {
        let dirs = Dirs::new();
        let a = dirs.job("job-a", Some("arith"));
        fs::write(&a, lines("p1+ p1-")).unwrap();
        fs::write(dirs.job("job-b", Some("arith")), lines("p2+")).unwrap();
        fs::create_dir_all(dirs.jobs.join("job-c")).unwrap();
        fs::write(dirs.jobs.join("job-c").join("spec.json"), "{not json").unwrap();
        fs::create_dir_all(dirs.jobs.join("job-d")).unwrap(); // no spec.json
        fs::write(dirs.jobs.join("stray-file"), "not a job dir").unwrap();

        let first = dirs.refresh(1.0).unwrap();
        assert_eq!(ranges(&first), [("job-a", 0, 2), ("job-b", 0, 1)]);
        let skipped: Vec<(&str, &str)> =
            first.skipped.iter().map(|s| (s.job.as_str(), s.reason.as_str())).collect();
        assert_eq!(
            skipped,
            [
                ("job-c", "spec.json: key must be a string at line 1 column 2"),
                ("job-d", "spec.json: No such file or directory (os error 2)"),
            ]
        );

        // job-a's rollouts cannot be read now (a directory in the file's place: root reads
        // anything, so no permission trick): skipped, its watermark carried as an empty range.
        fs::remove_file(&a).unwrap();
        fs::create_dir(&a).unwrap();
        let second = dirs.refresh(1.0).unwrap();
        assert_eq!(ranges(&second), [("job-a", 2, 2), ("job-b", 1, 1)]);
        assert_eq!(second.skipped[0].job, "job-a");
        assert!(
            second.skipped[0].reason.starts_with("run/rollouts.jsonl: Is a directory"),
            "{:?}",
            second.skipped
        );

        // Readable again: it goes on from the watermark.
        fs::remove_dir(&a).unwrap();
        fs::write(&a, lines("p1+ p1- p1+")).unwrap();
        let third = dirs.refresh(1.0).unwrap();
        assert_eq!(ranges(&third), [("job-a", 2, 3), ("job-b", 1, 1)]);
        assert_eq!(counts(&third)["p1"], (3.0, 2.0));

        // A job dir that is gone (removed by retention) drops out of the watermarks.
        fs::remove_dir_all(dirs.jobs.join("job-b")).unwrap();
        assert_eq!(ranges(&dirs.refresh(1.0).unwrap()), [("job-a", 3, 3)]);
    }

    #[test]
    fn a_refresh_with_no_jobs_still_writes_a_version() {
        let dirs = Dirs::new();
        fs::remove_dir(&dirs.jobs).unwrap();
        let first = dirs.refresh(0.5).unwrap();
        assert_eq!((first.version, first.records.count, first.prompts.len()), (1, 0, 0));
        let second = dirs.refresh(0.5).unwrap();
        assert_eq!((second.version, second.previous), (2, Some(1)));
        assert_eq!(fs::read_dir(dirs.curricula.join("arith")).unwrap().count(), 2, "no temporary files left");
    }

    #[test]
    fn concurrent_refreshes_publish_one_and_two_never_one_twice() {
        for round in 0..25 {
            let dirs = Arc::new(Dirs::new());
            fs::write(dirs.job("job-a", Some("arith")), lines("p1+ p1- p1+ p2-")).unwrap();
            let start = Arc::new(Barrier::new(3));
            let refreshes: Vec<_> = (0..2)
                .map(|_| {
                    let (dirs, start) = (dirs.clone(), start.clone());
                    std::thread::spawn(move || {
                        start.wait();
                        dirs.refresh(0.5).unwrap()
                    })
                })
                .collect();
            // A reader meanwhile: every version it sees is whole.
            let reader = {
                let (dirs, start) = (dirs.clone(), start.clone());
                std::thread::spawn(move || {
                    start.wait();
                    for _ in 0..200 {
                        latest(&dirs.curricula, "arith").unwrap();
                    }
                })
            };
            let mut got: Vec<CurriculumVersion> = refreshes.into_iter().map(|t| t.join().unwrap()).collect();
            reader.join().unwrap();
            got.sort_by_key(|version| version.version);
            let numbers: Vec<(u64, Option<u64>)> = got.iter().map(|v| (v.version, v.previous)).collect();
            assert_eq!(numbers, [(1, None), (2, Some(1))], "round {round}");
            // Every record counted once: by whichever refresh published first.
            assert_eq!((got[0].records.count, got[1].records.count), (4, 0), "round {round}");
            assert_eq!(ranges(&got[1]), [("job-a", 4, 4)]);
            assert_eq!(counts(&got[1])["p1"], (1.5, 1.0));
            for version in &got {
                assert_eq!(&load(&dirs.curricula, "arith", version.version).unwrap(), version);
            }
            let names: Vec<String> = fs::read_dir(dirs.curricula.join("arith"))
                .unwrap()
                .map(|entry| entry.unwrap().file_name().into_string().unwrap())
                .collect();
            assert_eq!(names.len(), 2, "no temporary files left: {names:?}");
        }
    }

    #[test]
    fn names_that_are_not_plain_directory_names_are_refused() {
        let long = "a".repeat(64);
        let too_long = "a".repeat(65);
        let cases: &[(&str, bool)] = &[
            ("arith", true),
            ("arith-v2.hard_set", true),
            ("A1", true),
            (&long, true),
            ("", false),
            (&too_long, false),
            (".hidden", false),
            ("..", false),
            ("a/b", false),
            ("../etc", false),
            ("white space", false),
            ("ari\u{0301}th", false),
            ("tab\t", false),
        ];
        let dirs = Dirs::new();
        for &(name, valid) in cases {
            assert_eq!(valid_name(name), valid, "{name:?}");
            if !valid {
                let refused = refresh(&dirs.jobs, &dirs.curricula, "t", name, 0.5, at(0)).unwrap_err();
                assert_eq!(
                    refused.to_string(),
                    format!(
                        "curriculum name {name:?}: expected 1 to 64 characters among letters, digits, '-', \
                         '_' and '.', not starting with '.'"
                    )
                );
                assert!(matches!(latest(&dirs.curricula, name), Err(CurriculaError::InvalidName { .. })));
                assert!(matches!(load(&dirs.curricula, name, 1), Err(CurriculaError::InvalidName { .. })));
            }
        }
        assert!(!dirs.curricula.exists(), "nothing created for a refused name");
    }

    #[test]
    fn bad_decays_missing_and_mislabelled_versions_are_refused() {
        let dirs = Dirs::new();
        for decay in [-0.1, 1.5, f64::NAN] {
            let error = dirs.refresh(decay).unwrap_err();
            assert_eq!(error.to_string(), format!("decay {decay}: expected a number in [0, 1]"));
        }
        assert_eq!(latest(&dirs.curricula, "arith").unwrap(), None);
        let missing = load(&dirs.curricula, "arith", 3).unwrap_err();
        assert_eq!(
            missing.to_string(),
            format!(
                "curriculum arith has no version 3 ({}/arith/3.json does not exist)",
                dirs.curricula.display()
            )
        );
        dirs.refresh(0.5).unwrap();
        // A version copied under another number.
        let dir = dirs.curricula.join("arith");
        fs::copy(dir.join("1.json"), dir.join("7.json")).unwrap();
        fs::write(dir.join("07.json"), "ignored: not a canonical version name").unwrap();
        let error = latest(&dirs.curricula, "arith").unwrap_err();
        assert_eq!(
            error.to_string(),
            format!("{}/7.json: holds curriculum arith version 1, expected arith version 7", dir.display())
        );
    }
}
