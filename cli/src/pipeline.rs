//! `rlvrctl pipeline`: submit a pipeline spec, show one, follow it to its end, cancel it.
//! `watch` polls `GET /v1/pipelines/{id}` (each stage's job state included) and prints a line
//! per change; the client's busy retries carry it across a daemon restart.

use std::time::Duration;

use rlvr_client::{Client, Exit};
use rlvr_protocol::pipeline::{PipelineState, PipelineView};

use crate::PipelineCommand;
use crate::answer::{Context, Json};
use crate::spec::{fresh_idempotency_key, read_spec};

/// How often `watch` looks.
const POLL: Duration = Duration::from_secs(1);

/// The status block of `rlvrctl pipeline status`: the pipeline, then one line per stage.
pub(crate) fn status_block(view: &PipelineView) -> String {
    let mut text = format!("pipeline {} ({}, team {})\n", view.id, view.name, view.team);
    let reason = if view.reason.is_empty() { String::new() } else { format!(": {}", view.reason) };
    let cancel = if view.cancel_requested && !view.state.is_terminal() { " (cancel requested)" } else { "" };
    text.push_str(&format!("state   {}{reason}{cancel}\n", view.state));
    for stage in &view.stages {
        text.push_str(&format!("{}\n", stage_line(view, stage.index as usize)));
    }
    text
}

/// One stage: its place, name, job and job state, and what it handed on.
fn stage_line(view: &PipelineView, index: usize) -> String {
    let stage = &view.stages[index];
    let marker = if index as u32 == view.stage && view.state == PipelineState::Running { "▶" } else { " " };
    let job = stage.job.as_deref().unwrap_or("-");
    let state = stage.job_state.map_or_else(|| "-".to_owned(), |state| state.to_string());
    let output = stage.output.as_ref().map(|output| format!(" → {}", output.reference())).unwrap_or_default();
    format!("{marker} stages[{index}] {:<20} job {job:<26} {state}{output}", stage.name)
}

/// Follows the pipeline until it ends: exit 0 when it succeeded, 1 when it ended otherwise.
pub(crate) fn watch(api: &Client, id: &str, json: bool) -> anyhow::Result<Exit> {
    let mut last: Option<PipelineView> = None;
    loop {
        let view = api.pipeline(id)?;
        let changed = last.as_ref().is_none_or(|before| {
            before.state != view.state
                || before.stage != view.stage
                || before
                    .stages
                    .iter()
                    .zip(&view.stages)
                    .any(|(a, b)| a.job_state != b.job_state || a.job != b.job)
        });
        if changed {
            if json {
                println!("{}", serde_json::to_string(&view)?);
            } else {
                match &last {
                    None => print!("{}", status_block(&view)),
                    Some(_) => {
                        let index = (view.stage as usize).min(view.stages.len().saturating_sub(1));
                        let reason = if view.reason.is_empty() {
                            String::new()
                        } else {
                            format!(" ({})", view.reason)
                        };
                        println!("{}  [{}{reason}]", stage_line(&view, index), view.state);
                    }
                }
            }
        }
        if view.state.is_terminal() {
            if !json && last.is_some() {
                print!("{}", status_block(&view));
            }
            return Ok(if view.state == PipelineState::Succeeded { Exit::Done } else { Exit::Ended });
        }
        last = Some(view);
        std::thread::sleep(POLL);
    }
}

/// `pipeline submit | status | watch | cancel | list`.
pub(crate) fn run(cx: &Context, command: PipelineCommand) -> anyhow::Result<Exit> {
    let print = |view: &PipelineView| cx.answer(view, Json::Block, || status_block(view));
    match command {
        PipelineCommand::Submit { file, wait, idempotency_key } => {
            let spec = read_spec(&file)?;
            let api = cx.client()?;
            let key = idempotency_key.unwrap_or_else(|| fresh_idempotency_key(&file));
            let body = api.upload_spec_data(&spec.body, spec.format, std::path::Path::new("/"))?;
            let submitted = api.submit_pipeline(&body, spec.format, Some(&key))?;
            cx.answer(&submitted, Json::Line, || format!("{}\n", submitted.id))?;
            if wait { watch(&api, &submitted.id, cx.json) } else { Ok(Exit::Done) }
        }
        PipelineCommand::Status { id } => {
            print(&cx.client()?.pipeline(&id)?)?;
            Ok(Exit::Done)
        }
        PipelineCommand::Watch { id } => watch(&cx.client()?, &id, cx.json),
        PipelineCommand::Cancel { id } => {
            print(&cx.client()?.cancel_pipeline(&id)?)?;
            Ok(Exit::Done)
        }
        PipelineCommand::List => {
            let list = cx.client()?.pipelines()?;
            // regression: with --json the list's lines followed its JSON, which then did not parse
            cx.answer(&list, Json::Block, || {
                if list.pipelines.is_empty() {
                    eprintln!("rlvrctl: no pipelines");
                }
                let mut text = String::new();
                for view in &list.pipelines {
                    let stage = (view.stage as usize).min(view.stages.len());
                    text += &format!(
                        "{}  {:<20} {:<10} stage {stage}/{}  {}\n",
                        view.id,
                        view.name,
                        view.state,
                        view.stages.len(),
                        view.reason
                    );
                }
                text
            })?;
            Ok(Exit::Done)
        }
    }
}
