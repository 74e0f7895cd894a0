//! `dataset put | list | rm`: the team's datasets.

use rlvr_client::Exit;

use crate::DatasetCommand;
use crate::answer::{BadInput, Context, Json};

pub fn run(cx: &Context, command: DatasetCommand) -> anyhow::Result<Exit> {
    let api = cx.client()?;
    match command {
        DatasetCommand::Put { name, file } => {
            let content = std::fs::read(&file)
                .map_err(|error| BadInput(format!("cannot read {}: {error}", file.display())))?;
            let dataset = api.put_dataset(&name, &content)?;
            cx.answer(&dataset, Json::Line, || {
                format!(
                    "dataset:{}@{} ({} records, {} bytes)\n",
                    dataset.name, dataset.sha256, dataset.records, dataset.bytes
                )
            })?;
        }
        DatasetCommand::List => {
            let list = api.datasets()?;
            cx.answer(&list, Json::Line, || {
                let rows = list.datasets.iter().map(|d| {
                    format!(
                        "{}\t{}\t{} records\t{} bytes\t{}\n",
                        d.name, d.sha256, d.records, d.bytes, d.uploaded_at
                    )
                });
                rows.collect()
            })?;
        }
        DatasetCommand::Rm { name } => api.delete_dataset(&name)?,
    }
    Ok(Exit::Done)
}
