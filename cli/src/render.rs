//! What `rlvrctl` prints: the status block, list rows, the gate table, a step's figures, state
//! lines, the plugin listing, and the padded tables they sit in. Pure functions of the API's
//! types; `main` and the views print what they return.

use rlvr_protocol::api::PluginList;
use rlvr_protocol::gates::{GateReport, Status};
use rlvr_protocol::job::{Estimate, JobEvent, JobState, JobView};
use rlvr_protocol::memory::{BYTES_PER_GB, DeviceKind, HEADROOM};
use rlvr_protocol::worker::{Baseline, BaselineKind, Outcome, Progress};

/// `rlvrctl gates`: the verdict, the baseline, then one row per criterion.
pub(crate) fn gate_table(id: &str, report: &GateReport) -> String {
    let verdict = match (report.passed, &report.forced) {
        (true, _) => "PASSED",
        (false, Some(_)) => "REFUSED, then promoted by an admin",
        (false, None) => "REFUSED",
    };
    let against = match &report.baseline {
        Some(Baseline { kind: BaselineKind::Published, version: Some(version), model }) => {
            format!("the model line's published version {version} ({model})")
        }
        Some(baseline) => format!("the starting checkpoint ({})", baseline.model),
        None => "nothing: the candidate was not evaluated".to_owned(),
    };
    let number = |value: Option<f64>| value.map_or_else(|| "-".to_owned(), |v| format!("{v:.4}"));
    let rows: Vec<[String; 6]> = report
        .criteria
        .iter()
        .map(|criterion| {
            let threshold = criterion
                .threshold
                .map_or_else(|| "-".to_owned(), |t| format!("{} {t}", criterion.op.as_str()));
            [
                criterion.name.clone(),
                criterion.status.label().to_owned(),
                number(criterion.measured),
                threshold,
                criterion.interval.as_ref().map_or_else(|| "-".to_owned(), |interval| interval.bounds()),
                criterion.note.clone(),
            ]
        })
        .collect();
    let mut text = format!("gates of job {id}: {verdict}\ncompared with {against}\n");
    if let Some(candidate) = &report.candidate {
        text.push_str(&format!("candidate: {}\n", candidate.describe()));
    }
    text.push_str(&format_table(["CRITERION", "RESULT", "MEASURED", "THRESHOLD", "INTERVAL", "NOTE"], &rows));
    if let Some(forced) = &report.forced {
        text.push_str(&format!("forced by admin team {} at {}: {}\n", forced.by, forced.at, forced.reason));
    }
    text
}

/// `rlvrctl estimate`: the job's memory on each device, part by part, and what submit fills.
pub(crate) fn estimate_table(answer: &Estimate) -> String {
    let gb = |bytes: u64| format!("{:.2}", bytes as f64 / BYTES_PER_GB);
    let estimate = &answer.estimate;
    let device = match estimate.device {
        DeviceKind::Cpu => "a CPU slot",
        DeviceKind::Cuda => "a GPU",
    };
    let mut rows: Vec<[String; 3]> = vec![["resident".into(), String::new(), gb(estimate.resident_bytes())]];
    rows.extend(estimate.resident.iter().map(|part| [String::new(), part.name.clone(), gb(part.bytes)]));
    for phase in &estimate.phases {
        rows.push([format!("{} (+)", phase.phase), String::new(), gb(phase.bytes())]);
        rows.extend(phase.parts.iter().map(|part| [String::new(), part.name.clone(), gb(part.bytes)]));
    }
    let mut text = format!(
        "memory on {device}: {:.2} GB at the peak ({} phase), {:.2} GB between phases\n",
        estimate.total_bytes() as f64 / BYTES_PER_GB,
        estimate.largest_phase().map_or("no", |phase| phase.phase.as_str()),
        estimate.resident_bytes() as f64 / BYTES_PER_GB,
    );
    text.push_str(&format_table(["PART", "", "GB"], &rows));
    text.push_str(&format!(
        "submit fills [resources] memory_gb = {} and resident_gb = {} when the spec leaves memory_gb out \
         (memory_gb: the peak and {:.0}% headroom, and the worker's cap)\n",
        answer.memory_gb,
        answer.resident_gb,
        HEADROOM * 100.0
    ));
    match &answer.fits {
        None => text.push_str("it fits a device of this daemon\n"),
        Some(why) => text.push_str(&format!("it fits no device of this daemon: {why}\n")),
    }
    text
}

/// `rlvrctl status`: one `label  value` line each, what is known only.
pub(crate) fn status_block(job: &JobView) -> String {
    let mut lines: Vec<(&str, String)> = vec![
        ("job", job.id.clone()),
        (
            "name",
            format!(
                "{} (team {}, {} priority, model line {})",
                job.name, job.team, job.priority, job.model_line
            ),
        ),
        ("state", job.state.to_string()),
    ];
    if !job.reason.is_empty() {
        lines.push(("reason", job.reason.clone()));
    }
    lines.push(("step", format!("{}/{}", job.step, job.max_steps)));
    if let Some(devices) = current_devices(job) {
        lines.push(("devices", devices));
    }
    if job.memory_gb > 0.0 {
        let resident =
            job.resident_gb.map(|gb| format!(", {gb} GB of it between phases")).unwrap_or_default();
        lines.push(("memory", format!("{} GB a device at its peak{resident}", job.memory_gb)));
    }
    if let Some(grant) = &job.grant {
        lines.push(("grant", grant.clone()));
    }
    if job.preemptions > 0 {
        lines.push(("preempted", format!("{} time(s)", job.preemptions)));
    }
    let figures = figures(job.progress.as_ref(), job.heldout, Detail::Full);
    if !figures.is_empty() {
        lines.push(("progress", figures));
    }
    for (index, warning) in job.progress.iter().flat_map(|progress| &progress.warnings).enumerate() {
        lines.push((if index == 0 { "warning" } else { "" }, warning.message.clone()));
    }
    if job.cancel_requested {
        lines.push(("cancel", "requested; the worker stops within a step".to_owned()));
    }
    if job.crashes > 0 {
        lines.push(("crashes", job.crashes.to_string()));
    }
    if let Some(result) = &job.result {
        // The figures only: the evaluation, plugins and hashes are `gates` and `--json`'s.
        for (index, line) in result_lines(result).into_iter().enumerate() {
            lines.push((if index == 0 { "result" } else { "" }, line));
        }
    }
    if let Some(gates) = &job.gates {
        let failed = gates.criteria.iter().filter(|criterion| criterion.status == Status::Fail).count();
        let verdict =
            if gates.passed { "passed".to_owned() } else { format!("refused ({failed} criteria failed)") };
        lines.push(("gates", format!("{verdict}; rlvrctl gates {} shows the table", job.id)));
    }
    if let Some(path) = &job.published {
        lines.push(("published", path.clone()));
    }
    if let Some(webhook) = &job.webhook {
        lines.push(("webhook", webhook.clone()));
    }
    lines.push(("created", job.created_at.clone()));
    lines.push(("updated", job.updated_at.clone()));
    lines.into_iter().map(|(label, value)| format!("{label:<9} {value}\n")).collect()
}

/// A run's outcome as `key: value` lines, its figures only.
pub(crate) fn result_lines(result: &Outcome) -> Vec<String> {
    let mut lines = vec![format!("steps: {}", result.steps)];
    let optional = [("heldout_before", result.heldout_before), ("heldout_after", result.heldout_after)];
    lines.extend(optional.iter().filter_map(|(key, value)| Some(format!("{key}: {}", (*value)?))));
    if !result.checkpoint.as_os_str().is_empty() {
        lines.push(format!("checkpoint: {}", result.checkpoint.display()));
    }
    if let Some(stopped) = &result.stopped {
        lines.push(format!("stopped: {stopped}"));
    }
    if !result.weights_sha256.is_empty() {
        lines.push(format!("weights_sha256: {}", result.weights_sha256));
    }
    lines
}

/// The devices a job holds now (admitted, running or evaluating): `cpu:0`, `cuda:0,cuda:1`.
pub(crate) fn current_devices(job: &JobView) -> Option<String> {
    (job.state.is_active() && !job.devices.is_empty()).then(|| job.devices.join(","))
}

/// The columns of [`LIST_HEADER`].
pub(crate) fn list_rows(jobs: &[JobView]) -> Vec<[String; 10]> {
    jobs.iter()
        .map(|job| {
            // The grant's first word: `holding` or `waiting`.
            let grant = job.grant.as_deref().and_then(|grant| grant.split(' ').next()).unwrap_or("-");
            [
                job.id.clone(),
                job.team.clone(),
                job.name.clone(),
                job.state.to_string(),
                format!("{}/{}", job.step, job.max_steps),
                current_devices(job).unwrap_or_else(|| "-".to_owned()),
                grant.to_owned(),
                job.preemptions.to_string(),
                short_time(&job.updated_at),
                truncate(&job.reason, 50),
            ]
        })
        .collect()
}

pub(crate) const LIST_HEADER: [&str; 10] =
    ["ID", "TEAM", "NAME", "STATE", "STEP", "DEVICES", "GRANT", "PREEMPTED", "UPDATED", "REASON"];

/// `rlvrctl gates` on a job without a gate report: why there is none, and what to do.
pub(crate) fn not_gated(job: &JobView) -> String {
    let id = &job.id;
    let why = if job.reason.is_empty() { String::new() } else { format!(": {}", job.reason) };
    match job.state {
        JobState::Failed => format!(
            "job {id} failed at step {} before it was gated{why}; `rlvrctl logs {id}` shows its worker's log",
            job.step
        ),
        JobState::Cancelled => {
            format!("job {id} was cancelled at step {} before it was gated{why}", job.step)
        }
        JobState::Refused => format!("job {id} was refused before it was gated{why}"),
        JobState::Published => format!("job {id} was published without a gate report{why}"),
        state => format!(
            "job {id} is {state} (step {}/{}) and has not been gated yet; `rlvrctl watch {id}` follows it",
            job.step, job.max_steps
        ),
    }
}

pub(crate) fn cancel_line(job: &JobView) -> String {
    if job.state == JobState::Cancelled {
        format!("cancelled job {}", job.id)
    } else if job.cancel_requested {
        format!("cancel requested for job {} ({}): its worker stops within a step", job.id, job.state)
    } else {
        format!("job {} is {}", job.id, job.state)
    }
}

/// `2026-11-21 06:03:00` from RFC 3339 (`2026-11-21T06:03:00.123Z`); anything else as it is.
pub(crate) fn short_time(at: &str) -> String {
    match (at.get(..10), clock(at)) {
        (Some(date), time) if time != at => format!("{date} {time}"),
        _ => at.to_owned(),
    }
}

/// `06:03:00` from RFC 3339; anything else as it is.
pub(crate) fn clock(at: &str) -> &str {
    match at.get(11..19) {
        Some(time) if at.as_bytes()[10] == b'T' => time,
        _ => at,
    }
}

/// At most `max` characters on one line, `…` marking a cut.
pub(crate) fn truncate(text: &str, max: usize) -> String {
    let line = text.replace(['\n', '\r'], " ");
    if line.chars().count() <= max {
        return line;
    }
    let mut cut: String = line.chars().take(max.saturating_sub(1)).collect();
    cut.push('…');
    cut
}

/// The figures of a job's latest step: `reward 0.625 · held-out 0.810 · KL 0.0123 · 1234 tok/s ·
/// ETA 3m 12s`; in [`Detail::Full`], loss and seconds per step too. Unknown figures are left out.
pub(crate) fn figures(progress: Option<&Progress>, heldout: Option<f64>, detail: Detail) -> String {
    let full = detail == Detail::Full;
    let number = |pick: fn(&Progress) -> Option<f64>| progress.and_then(pick);
    let mut parts = Vec::new();
    if let Some(reward) = number(|p| p.reward) {
        parts.push(format!("reward {reward:.3}"));
    }
    if full && let Some(loss) = number(|p| p.loss) {
        parts.push(format!("loss {loss:.4}"));
    }
    if let Some(heldout) = number(|p| p.heldout).or(heldout) {
        parts.push(format!("held-out {heldout:.3}"));
    }
    if let Some(kl) = number(|p| p.kl) {
        parts.push(format!("KL {kl:.4}"));
    }
    if let Some(rate) = number(|p| p.tokens_per_s) {
        parts.push(format!("{rate:.0} tok/s"));
    }
    if full && let Some(step_s) = number(|p| p.step_s) {
        parts.push(format!("{step_s:.2} s/step"));
    }
    if let Some(eta) = number(|p| p.eta_s).filter(|eta| eta.is_finite() && *eta >= 0.0) {
        parts.push(format!("ETA {}", duration_text(eta)));
    }
    parts.join(" · ")
}

/// How many figures [`figures`] shows: a progress line's, or `status`'s.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Detail {
    Brief,
    Full,
}

/// `45s`, `3m 12s`, `2h 05m`.
pub(crate) fn duration_text(seconds: f64) -> String {
    let total = seconds.round() as u64;
    match total {
        0..60 => format!("{total}s"),
        60..3600 => format!("{}m {:02}s", total / 60, total % 60),
        _ => format!("{}h {:02}m", total / 3600, total % 3600 / 60),
    }
}

/// `12:00:01 running — worker pid 123 started`: one change of state.
pub(crate) fn state_line(event: &JobEvent) -> String {
    let mut line = format!("{} {}", clock(&event.at), event.state);
    if event.step > 0 {
        line.push_str(&format!(" at step {}", event.step));
    }
    if !event.reason.is_empty() {
        line.push_str(" — ");
        line.push_str(&event.reason);
    }
    line
}

/// `job ID refused: gate heldout_min: 0.41 < 0.5`, without saying the state twice when the
/// reason starts with it (`cancelled: the worker was stopped`).
pub(crate) fn end_line(id: &str, end: &JobEvent) -> String {
    let state = end.state.as_str();
    if end.reason.is_empty() {
        format!("job {id} {state}")
    } else if end.reason.starts_with(state) {
        format!("job {id}: {}", end.reason)
    } else {
        format!("job {id} {state}: {}", end.reason)
    }
}

/// `rlvrctl plugins`: the loaded plugins, their notes, the refused files, each table when it has
/// rows (the first always), a blank line between them.
pub(crate) fn plugin_tables(list: &PluginList) -> String {
    let rows: Vec<[String; 5]> = list
        .plugins
        .iter()
        .map(|p| {
            let sha = p.sha256.get(..12).unwrap_or(&p.sha256).to_owned();
            [p.name.clone(), p.version.clone(), p.kind.clone(), sha, p.description.clone()]
        })
        .collect();
    let mut text = format_table(["NAME", "VERSION", "KIND", "SHA256", "DESCRIPTION"], &rows);
    let notes: Vec<[String; 2]> =
        list.plugins.iter().flat_map(|p| p.notes.iter().map(|note| [p.id.clone(), note.clone()])).collect();
    if !notes.is_empty() {
        text.push('\n');
        text.push_str(&format_table(["PLUGIN", "NOTE"], &notes));
    }
    if !list.refused.is_empty() {
        text.push('\n');
        let rows: Vec<[String; 3]> =
            list.refused.iter().map(|r| [r.source.clone(), r.reason.clone(), r.message.clone()]).collect();
        text.push_str(&format_table(["REFUSED FILE", "REASON", "MESSAGE"], &rows));
    }
    text
}

/// Columns padded to their widest cell, two spaces apart; the last one unpadded.
pub(crate) fn format_table<const N: usize>(header: [&str; N], rows: &[[String; N]]) -> String {
    let mut widths = header.map(str::len);
    for row in rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let line = |cells: [&str; N]| {
        let mut text = String::new();
        for (index, cell) in cells.iter().enumerate() {
            if index + 1 == N {
                text.push_str(cell);
            } else {
                text.push_str(&format!("{cell:<width$}  ", width = widths[index]));
            }
        }
        format!("{}\n", text.trim_end())
    };
    let mut table = line(header);
    for row in rows {
        table.push_str(&line(std::array::from_fn(|index| row[index].as_str())));
    }
    table
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn figures_show_what_is_known() {
        let progress = Progress {
            step: 12,
            max_steps: 100,
            reward: Some(0.625),
            loss: Some(0.1234),
            kl: Some(0.01234),
            heldout: None,
            tokens_per_s: Some(1234.4),
            step_s: Some(2.1),
            eta_s: Some(192.0),
            warnings: Vec::new(),
            engine_submission: None,
        };
        assert_eq!(
            figures(Some(&progress), Some(0.81), Detail::Brief),
            "reward 0.625 · held-out 0.810 · KL 0.0123 · 1234 tok/s · ETA 3m 12s"
        );
        assert_eq!(
            figures(Some(&progress), None, Detail::Full),
            "reward 0.625 · loss 0.1234 · KL 0.0123 · 1234 tok/s · 2.10 s/step · ETA 3m 12s"
        );
        assert_eq!(figures(None, None, Detail::Full), "");
        assert_eq!(
            [duration_text(45.4), duration_text(60.0), duration_text(7500.0)],
            ["45s", "1m 00s", "2h 05m"]
        );
    }

    fn job() -> JobView {
        JobView {
            id: "01JDX".to_owned(),
            team: "math".to_owned(),
            name: "arith".to_owned(),
            model_line: "tiny".to_owned(),
            kind: Some(rlvr_protocol::kind::JobKind::OnlineGroups),
            priority: rlvr_protocol::spec::Priority::Normal,
            state: JobState::Refused,
            step: 100,
            max_steps: 100,
            reason: "gate heldout_min: 0.41 < 0.5".to_owned(),
            created_at: "2026-11-21T06:00:00.000Z".to_owned(),
            updated_at: "2026-11-21T06:03:00.123Z".to_owned(),
            crashes: 0,
            cancel_requested: false,
            devices: vec!["cpu:0".to_owned()],
            preemptions: 0,
            grant: None,
            progress: None,
            heldout: Some(0.41),
            result: Some(Outcome { steps: 100, checkpoint: "/s/ckpt".into(), ..Outcome::default() }),
            gates: None,
            published: None,
            published_version: None,
            published_dataset: None,
            output: None,
            webhook: None,
            curriculum_version: None,
            memory_gb: 0.0,
            resident_gb: None,
        }
    }

    #[test]
    fn status_and_list_output() {
        assert_eq!(
            status_block(&job()),
            "job       01JDX\n\
             name      arith (team math, normal priority, model line tiny)\n\
             state     refused\n\
             reason    gate heldout_min: 0.41 < 0.5\n\
             step      100/100\n\
             progress  held-out 0.410\n\
             result    steps: 100\n\
             \x20         checkpoint: /s/ckpt\n\
             created   2026-11-21T06:00:00.000Z\n\
             updated   2026-11-21T06:03:00.123Z\n"
        );
        let mut long = job();
        long.reason = "x".repeat(60);
        let rows = list_rows(&[long]);
        assert_eq!(rows[0][4], "100/100");
        assert_eq!(rows[0][5..8], ["-", "-", "0"], "an ended job holds no devices");
        assert_eq!(rows[0][8], "2026-11-21 06:03:00");
        assert_eq!(rows[0][9], format!("{}…", "x".repeat(49)));
        let mut running = job();
        running.state = JobState::Running;
        running.grant = Some("waiting for update (0.4 s)".to_owned());
        running.preemptions = 2;
        assert_eq!(list_rows(std::slice::from_ref(&running))[0][5..8], ["cpu:0", "waiting", "2"]);
        let block = status_block(&running);
        assert!(
            block.contains("devices   cpu:0\ngrant     waiting for update (0.4 s)\npreempted 2 time(s)\n"),
            "{block}"
        );
        let mut cancelling = job();
        cancelling.state = JobState::Running;
        cancelling.cancel_requested = true;
        assert_eq!(
            cancel_line(&cancelling),
            "cancel requested for job 01JDX (running): its worker stops within a step"
        );
    }

    #[test]
    fn state_and_end_lines_say_the_state_once() {
        let event: JobEvent = serde_json::from_str(
            r#"{"id":"1-0","at":"2026-11-21T12:00:01.000Z","state":"running","reason":"worker pid 123 started","step":0}"#,
        )
        .unwrap();
        assert_eq!(state_line(&event), "12:00:01 running — worker pid 123 started");
        assert_eq!(end_line("J", &event), "job J running: worker pid 123 started");
        let cancelled =
            JobEvent { state: JobState::Cancelled, reason: "cancelled: by team a".to_owned(), ..event };
        assert_eq!(end_line("J", &cancelled), "job J: cancelled: by team a");
        let stepped = JobEvent { state: JobState::Published, reason: String::new(), step: 6, ..cancelled };
        assert_eq!(
            (state_line(&stepped).as_str(), end_line("J", &stepped).as_str()),
            ("12:00:01 published at step 6", "job J published")
        );
    }
}
