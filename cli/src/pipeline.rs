//! `rlvrctl pipeline`: submit a pipeline spec, show one, follow it to its end, cancel it.
//! `watch` polls `GET /v1/pipelines/{id}` (each stage's job state included) and prints a line
//! per change; the client's busy retries carry it across a daemon restart.

use std::time::Duration;

use rlvr_client::{Client, Exit};
use rlvr_protocol::pipeline::{PipelineState, PipelineView};

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
