//! `curriculum list | share | refresh`: the team's shared curricula.

use rlvr_client::Exit;

use crate::CurriculumCommand;
use crate::answer::{Context, Json};

pub fn run(cx: &Context, command: CurriculumCommand) -> anyhow::Result<Exit> {
    let api = cx.client()?;
    match command {
        CurriculumCommand::Refresh { name } => {
            let refreshed = api.curriculum_refresh(&name)?;
            cx.answer(&refreshed, Json::Line, || format!("{}\n", refreshed.message))?;
        }
        CurriculumCommand::List => {
            let list = api.curricula()?;
            cx.answer(&list, Json::Line, || {
                let mut text = String::new();
                for c in &list.curricula {
                    let version =
                        c.latest_version.map_or("no version yet".to_owned(), |v| format!("version {v}"));
                    text +=
                        &format!("{}/{}\t{version}\treaders [{}]\n", c.owner, c.name, c.readers.join(","));
                }
                text
            })?;
        }
        CurriculumCommand::Share { name, readers } => {
            let shared = api.share_curriculum(&name, &readers)?;
            cx.answer(&shared, Json::Line, || match shared.readers.as_slice() {
                [] => format!("curriculum {name} is your team's alone\n"),
                readers => format!("curriculum {name} is shared with {}\n", readers.join(", ")),
            })?;
        }
    }
    Ok(Exit::Done)
}
