//! The job commands: `submit` (and its dry run), `estimate`, `status`, `list`, `cancel`, `gates`,
//! `promote`, `report`. Each asks the daemon and prints the answer as a table or block of text,
//! or as JSON with `--json`; `watch` and `logs` follow a job (their own modules).

use std::path::Path;

use rlvr_client::{Exit, JobQuery};

use crate::answer::{Context, Json};
use crate::render::{LIST_HEADER, cancel_line, format_table, gate_table, list_rows, status_block};
use crate::spec::{fresh_idempotency_key, read_spec};
use crate::{render, report, spec, watch};

/// `submit --dry-run FILE`: the daemon's checks; prints the spec as the job would keep it.
pub fn dry_run(cx: &Context, file: &Path) -> anyhow::Result<Exit> {
    let spec = read_spec(file)?;
    let api = cx.client()?;
    // A dry run moves none of the team's dataset names: a queued job's data stays its own.
    let body = api.check_spec_data(&spec.body, spec.format, Path::new("/"))?;
    let checked = if spec.is_pipeline() {
        serde_json::to_value(api.dry_run_pipeline(&body, spec.format)?.spec)?
    } else {
        serde_json::to_value(api.dry_run(&body, spec.format)?.spec)?
    };
    cx.answer(&checked, Json::Block, || spec::spec_text(&checked))?;
    eprintln!("rlvrctl: {} passes the daemon's checks; nothing was queued", file.display());
    Ok(Exit::Done)
}

/// `submit FILE [--wait]`: queues the job (its local data uploaded first), prints its id.
pub fn submit(
    cx: &Context,
    file: &Path,
    wait: bool,
    idempotency_key: Option<String>,
) -> anyhow::Result<Exit> {
    // The spec first: a wrong file needs no daemon to be found out.
    let spec = read_spec(file)?;
    let api = cx.client()?;
    let key = idempotency_key.unwrap_or_else(|| fresh_idempotency_key(file));
    // Local data files become the team's datasets; the spec then names them.
    let body = api.upload_spec_data(&spec.body, spec.format, Path::new("/"))?;
    let submitted = api.submit(&body, spec.format, Some(&key))?;
    cx.answer(&submitted, Json::Line, || {
        if !submitted.created {
            eprintln!(
                "rlvrctl: an earlier submit with this idempotency key made this job; nothing new was queued"
            );
        }
        format!("{}\n", submitted.id)
    })?;
    if wait { watch::watch(&api, &submitted.id, cx.json) } else { Ok(Exit::Done) }
}

/// `estimate FILE`: the job's memory estimate.
pub fn estimate(cx: &Context, file: &Path) -> anyhow::Result<Exit> {
    let spec = read_spec(file)?;
    let api = cx.client()?;
    let body = api.check_spec_data(&spec.body, spec.format, Path::new("/"))?;
    let estimate = api.estimate(&body, spec.format)?;
    cx.answer(&estimate, Json::Block, || render::estimate_table(&estimate))?;
    Ok(Exit::Done)
}

/// `env check FILE [--episodes N]`: the spec's first episodes against its environment.
pub fn env_check(cx: &Context, file: &Path, episodes: usize) -> anyhow::Result<Exit> {
    let spec = read_spec(file)?;
    let api = cx.client()?;
    let body = api.check_spec_data(&spec.body, spec.format, Path::new("/"))?;
    let check = api.env_check(&body, spec.format, episodes)?;
    cx.answer(&check, Json::Block, || check.render())?;
    Ok(Exit::Done)
}

/// `status ID`.
pub fn status(cx: &Context, id: &str) -> anyhow::Result<Exit> {
    let job = cx.client()?.job(id)?;
    cx.answer(&job, Json::Block, || status_block(&job))?;
    Ok(Exit::Done)
}

/// `list`: a page of jobs, or every page with `all`.
pub fn list(cx: &Context, mut query: JobQuery, all: bool) -> anyhow::Result<Exit> {
    let api = cx.client()?;
    let mut list = api.jobs(&query)?;
    while all && let Some(next) = list.next.take() {
        query.cursor = Some(next);
        let page = api.jobs(&query)?;
        list.jobs.extend(page.jobs);
        list.next = page.next;
    }
    cx.answer(&list, Json::Block, || {
        if list.jobs.is_empty() {
            eprintln!("rlvrctl: no jobs");
            return String::new();
        }
        format_table(LIST_HEADER, &list_rows(&list.jobs))
    })?;
    if let (false, Some(next)) = (cx.json, &list.next) {
        eprintln!("rlvrctl: more: rlvrctl list --cursor {next} (or --all)");
    }
    Ok(Exit::Done)
}

/// `cancel ID`.
pub fn cancel(cx: &Context, id: &str) -> anyhow::Result<Exit> {
    let job = cx.client()?.cancel(id)?;
    cx.answer(&job, Json::Block, || format!("{}\n", cancel_line(&job)))?;
    Ok(Exit::Done)
}

/// `gates ID`: the gate report, then what was published. Exit 0 passed (or promoted), 1 refused
/// or ended ungated, 2 not gated yet.
pub fn gates(cx: &Context, id: &str) -> anyhow::Result<Exit> {
    let job = cx.client()?.job(id)?;
    let Some(report) = &job.gates else {
        eprintln!("rlvrctl: {}", render::not_gated(&job));
        // An ended job will never be gated: it ended otherwise.
        return Ok(if job.state.is_terminal() { Exit::Ended } else { Exit::Refused });
    };
    cx.answer(report, Json::Block, || {
        let mut text = gate_table(&job.id, report);
        if let Some(path) = &job.published {
            text += &format!("published: {path}\n");
        }
        if let Some(dataset) = &job.published_dataset {
            text += &format!("dataset:   {dataset}\n");
        }
        if let Some(webhook) = &job.webhook {
            text += &format!("webhook:   {webhook}\n");
        }
        text
    })?;
    Ok(if report.promoted() { Exit::Done } else { Exit::Ended })
}

/// `promote ID --force --reason TEXT` (clap requires `--force`; the request says it).
pub fn promote(cx: &Context, id: &str, reason: &str) -> anyhow::Result<Exit> {
    let job = cx.client()?.promote(id, reason)?;
    cx.answer(&job, Json::Block, || format!("{}\n", job.reason))?;
    Ok(Exit::Done)
}

/// `report ID --out DIR`: the HTML report and its plots.
pub fn report(cx: &Context, id: &str, out: &Path) -> anyhow::Result<Exit> {
    let api = cx.client()?;
    let job = api.job(id)?;
    let metrics = api.metrics(id)?;
    let report = report::write(out, &job, &metrics)?;
    let written = serde_json::json!({"index": report.index, "plots": report.plots});
    cx.answer(&written, Json::Line, || format!("{}\n", report.index.display()))?;
    Ok(Exit::Done)
}
