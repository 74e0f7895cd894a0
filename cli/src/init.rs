//! `rlvrctl init KIND [DIR]`: writes the example job spec of one kind (examples/jobs/, built
//! into rlvrctl) and the data files it names, so a first job starts from a spec that runs.
//!
//! The examples are built in with `include_dir`; `build.rs` rebuilds when they change. Their data
//! paths are relative to the spec file, as `rlvrctl submit` reads them.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use include_dir::{Dir, include_dir};

/// examples/jobs/: one `KIND.toml` per job kind, and `data/`.
static EXAMPLES: Dir<'static> = include_dir!("$CARGO_MANIFEST_DIR/../examples/jobs");

/// Why `init` wrote nothing.
#[derive(Debug, thiserror::Error)]
pub(crate) enum InitError {
    #[error("no example of kind {kind:?}; the kinds are: {}", kinds().join(", "))]
    UnknownKind { kind: String },
    #[error("{0} exists; remove it or choose another directory")]
    Exists(PathBuf),
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: io::Error },
}

/// The kinds there is an example of, sorted.
pub(crate) fn kinds() -> Vec<&'static str> {
    let mut kinds: Vec<&str> =
        EXAMPLES.files().filter_map(|file| file.path().to_str()?.strip_suffix(".toml")).collect();
    kinds.sort_unstable();
    kinds
}

/// What `init` wrote: the spec, the data files it added, and those it found already there.
#[derive(Debug)]
pub(crate) struct Written {
    pub spec: PathBuf,
    pub data: Vec<PathBuf>,
    pub kept: Vec<PathBuf>,
}

/// Writes `DIR/KIND.toml` and each `data/...` file it names that `DIR` lacks. Refuses to
/// overwrite the spec; a data file already there is kept as it is.
pub(crate) fn init(kind: &str, dir: &Path) -> Result<Written, InitError> {
    let name = format!("{kind}.toml");
    let spec = EXAMPLES.get_file(&name).ok_or_else(|| InitError::UnknownKind { kind: kind.to_owned() })?;
    let text = spec.contents_utf8().unwrap_or_default();
    let target = dir.join(&name);
    // A symbolic link counts as there, dangling or not: init writes through none.
    if target.symlink_metadata().is_ok() {
        return Err(InitError::Exists(target));
    }
    let io_error = |path: &Path| {
        let path = path.to_owned();
        move |source| InitError::Io { path, source }
    };
    let mut written = Written { spec: target.clone(), data: Vec::new(), kept: Vec::new() };
    for relative in data_files(text) {
        let Some(file) = EXAMPLES.get_file(&relative) else { continue };
        let path = dir.join(&relative);
        if path.symlink_metadata().is_ok() {
            written.kept.push(path);
            continue;
        }
        if let Some(parent) = path.parent() {
            fs::create_dir_all(parent).map_err(io_error(parent))?;
        }
        write_new(&path, file.contents()).map_err(io_error(&path))?;
        written.data.push(path);
    }
    fs::create_dir_all(dir).map_err(io_error(dir))?;
    match write_new(&target, text.as_bytes()) {
        Err(error) if error.kind() == std::io::ErrorKind::AlreadyExists => Err(InitError::Exists(target)),
        Err(error) => Err(io_error(&target)(error)),
        Ok(()) => Ok(written),
    }
}

/// Writes a file that must not exist yet: `O_EXCL`, which follows no symbolic link (a dangling
/// one made `init` create a file wherever it pointed) and loses no race with another writer.
fn write_new(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write as _;
    fs::OpenOptions::new().write(true).create_new(true).open(path)?.write_all(bytes)
}

/// The `data/...` paths a spec's values name, wherever they are (a pipeline's stages too).
fn data_files(spec: &str) -> Vec<String> {
    fn walk(value: &toml::Value, found: &mut Vec<String>) {
        match value {
            toml::Value::String(text) if text.starts_with("data/") => found.push(text.clone()),
            toml::Value::Array(items) => items.iter().for_each(|item| walk(item, found)),
            toml::Value::Table(table) => table.values().for_each(|item| walk(item, found)),
            _ => {}
        }
    }
    let mut found = Vec::new();
    if let Ok(table) = spec.parse::<toml::Table>() {
        walk(&toml::Value::Table(table), &mut found);
    }
    found.sort();
    found.dedup();
    found
}

/// `init KIND [DIR]` (or `init --list`): writes the example and says what to run next.
pub(crate) fn run(kind: Option<String>, dir: &Path, list: bool) -> anyhow::Result<rlvr_client::Exit> {
    if list {
        println!("{}", kinds().join("\n"));
        return Ok(rlvr_client::Exit::Done);
    }
    let written =
        init(&kind.unwrap_or_default(), dir).map_err(|error| crate::answer::BadInput(error.to_string()))?;
    println!("{}", written.spec.display());
    for path in &written.data {
        eprintln!("rlvrctl: wrote {}", path.display());
    }
    for path in &written.kept {
        eprintln!("rlvrctl: kept {} (already there)", path.display());
    }
    eprintln!(
        "rlvrctl: check it with `rlvrctl submit --dry-run {0}`, run it with `rlvrctl submit --wait {0}`",
        written.spec.display()
    );
    Ok(rlvr_client::Exit::Done)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_example_is_a_kind_and_names_only_data_that_is_built_in() {
        let kinds = kinds();
        for kind in
            ["sft", "grpo", "rloo", "ppo", "dpo", "lora", "rm", "rejection-sampling", "distill", "pipeline"]
        {
            assert!(kinds.contains(&kind), "no example of {kind}: {kinds:?}");
        }
        for kind in kinds {
            let text = EXAMPLES.get_file(format!("{kind}.toml")).unwrap().contents_utf8().unwrap();
            for path in data_files(text) {
                assert!(
                    EXAMPLES.get_file(&path).is_some(),
                    "{kind}.toml names {path}, which is not in examples/jobs"
                );
            }
        }
    }

    #[test]
    fn init_writes_the_spec_and_its_data_and_never_overwrites_the_spec() {
        let dir = tempfile::tempdir().unwrap();
        let written = init("grpo", dir.path()).unwrap();
        assert_eq!(written.spec, dir.path().join("grpo.toml"));
        assert!(!written.data.is_empty(), "grpo names its data");
        assert!(written.data.iter().all(|path| path.is_file()));
        // A second kind keeps the data files the first wrote.
        let second = init("sft", dir.path()).unwrap();
        assert!(second.data.iter().all(|path| !written.data.contains(path)));
        assert!(matches!(init("grpo", dir.path()), Err(InitError::Exists(_))));
        assert!(matches!(init("nope", dir.path()), Err(InitError::UnknownKind { .. })));
    }

    #[test]
    fn init_writes_through_no_symbolic_link() {
        let dir = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        // A dangling link where the spec goes, and one where a data file goes.
        std::os::unix::fs::symlink(outside.path().join("spec"), dir.path().join("grpo.toml")).unwrap();
        assert!(matches!(init("grpo", dir.path()), Err(InitError::Exists(_))));
        fs::remove_file(dir.path().join("grpo.toml")).unwrap();
        let data = data_files(EXAMPLES.get_file("grpo.toml").unwrap().contents_utf8().unwrap());
        fs::create_dir_all(dir.path().join("data")).unwrap();
        std::os::unix::fs::symlink(outside.path().join("data"), dir.path().join(&data[0])).unwrap();
        let written = init("grpo", dir.path()).unwrap();
        assert!(written.kept.contains(&dir.path().join(&data[0])), "{written:?}");
        assert!(fs::read_dir(outside.path()).unwrap().next().is_none(), "nothing written outside");
    }

    #[test]
    fn data_files_are_found_anywhere_in_a_spec() {
        let spec = "[data]\ntrain = \"data/a.jsonl\"\n[[stages]]\n[stages.data]\ntrain = \"data/b.jsonl\"\nheldout = \"data/a.jsonl\"\n[job]\nname = \"x\"\n";
        assert_eq!(data_files(spec), ["data/a.jsonl", "data/b.jsonl"]);
    }
}
