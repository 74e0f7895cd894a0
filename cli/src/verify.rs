//! `rlvrctl verify`: JSONL items judged by a verifier plugin loaded in this process, through the
//! plugin host's batch engine; no daemon needed. With `--server` the daemon grades them
//! (`POST /v1/verify`), with one grader or a spec's whole reward, under the team's rules. The plugin runs on its user's behalf: it gets
//! the secrets they pass (`--secret NAME=ENV_VAR`) and no restriction on where it sends requests.

use std::fs::File;
use std::io::{self, BufRead, BufReader, Write};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use rlvr_plugin_api::{HostContext, PluginKind, Secret};
use rlvr_plugin_host::metrics::PluginMetrics;
use rlvr_plugin_host::verify::{BatchOptions, run_batch};
use rlvr_plugin_host::{Isolation, Registry};

use rlvr_protocol::api::{RewardRequest, VerifyRequest};

use crate::BadInput;

/// The knobs of `rlvrctl verify` besides where to find the plugin and the input.
pub(crate) struct VerifyOptions {
    pub(crate) plugin_config: String,
    pub(crate) parallel: usize,
    pub(crate) deadline: Duration,
    pub(crate) explain: bool,
    /// `(secret name, environment variable)` pairs of `--secret`.
    pub(crate) secrets: Vec<(String, String)>,
}

/// The plugin's host context: the user's own secrets, read from their environment, and no
/// outbound restriction (it runs as they do).
fn host_context(secrets: &[(String, String)]) -> Result<HostContext, BadInput> {
    let mut host = HostContext::unrestricted();
    for (name, variable) in secrets {
        let value = std::env::var(variable).map_err(|_| {
            BadInput(format!(
                "--secret {name}={variable}: the environment variable {variable} is not set (or not UTF-8)"
            ))
        })?;
        host.secrets.insert(name.clone(), Secret::new(value));
    }
    Ok(host)
}

pub(crate) fn verify(
    plugin: &str,
    jsonl: Option<PathBuf>,
    extra_dirs: Vec<PathBuf>,
    config_path: Option<PathBuf>,
    options: VerifyOptions,
) -> anyhow::Result<()> {
    let dirs = rlvr_plugin_host::dirs::plugin_dirs(config_path.as_deref(), extra_dirs)
        .map_err(|error| BadInput(error.to_string()))?;
    // Content-addressed copies live only as long as this process; the libraries stay mapped.
    let cache =
        tempfile::Builder::new().prefix("rlvrctl-plugins-").tempdir().context("cannot create a temp dir")?;
    let registry = Registry::new(cache.path().to_owned(), Isolation::InProcess, PluginMetrics::unexported())?;
    registry.scan(&dirs, std::time::Duration::ZERO);
    let loaded = registry.find(plugin, Some(PluginKind::Verifier)).with_context(|| {
        format!(
            "looked in {}",
            dirs.iter().map(|dir| dir.display().to_string()).collect::<Vec<_>>().join(", ")
        )
    })?;
    let host = host_context(&options.secrets)?;
    let verifier = Arc::new(
        loaded
            .verifier_in(&options.plugin_config, &host)
            .with_context(|| format!("plugin {}", loaded.id()))?,
    );
    let batch = BatchOptions {
        verifier_id: loaded.id(),
        parallel: options.parallel,
        deadline: options.deadline,
        explain: options.explain,
        stop: None,
    };
    let stdout = io::BufWriter::new(io::stdout().lock());
    let summary = match jsonl {
        Some(path) => {
            let file = File::open(&path).with_context(|| format!("cannot open {}", path.display()))?;
            run_batch(verifier, BufReader::new(file), stdout, &batch)
        }
        None => run_batch(verifier, BufReader::new(io::stdin()), stdout, &batch),
    }
    .context("reading input or writing output")?;
    eprintln!(
        "rlvrctl: {} item(s) verified with {}: {} passed, {} with errors ({} timed out)",
        summary.items,
        loaded.id(),
        summary.passed,
        summary.errors,
        summary.timeouts
    );
    Ok(())
}

/// The dry-run a `rlvrctl verify --server` asks for: `--plugin` with `--plugin-config`, or the
/// graders and formula of a job spec file (`--spec`, TOML or JSON).
pub(crate) fn server_request(
    plugin: Option<&str>,
    spec: Option<&std::path::Path>,
    plugin_config: &str,
) -> Result<VerifyRequest, BadInput> {
    if let Some(path) = spec {
        let text = std::fs::read_to_string(path)
            .map_err(|error| BadInput(format!("cannot read {}: {error}", path.display())))?;
        let document: serde_json::Value =
            if path.extension().is_some_and(|ext| ext.eq_ignore_ascii_case("json")) {
                serde_json::from_str(&text)
                    .map_err(|error| BadInput(format!("{}: {error}", path.display())))?
            } else {
                let table: toml::Table = text
                    .parse()
                    .map_err(|error| BadInput(format!("{}: not valid TOML: {error}", path.display())))?;
                serde_json::to_value(table).map_err(|error| BadInput(error.to_string()))?
            };
        let graders = document.get("verifiers").cloned().unwrap_or(serde_json::Value::Array(Vec::new()));
        let graders = serde_json::from_value(graders)
            .map_err(|error| BadInput(format!("{}: verifiers: {error}", path.display())))?;
        let formula = document.pointer("/reward/formula").and_then(|f| f.as_str()).map(str::to_owned);
        return Ok(VerifyRequest {
            grader: None,
            reward: Some(RewardRequest { formula, graders }),
            items: Vec::new(),
        });
    }
    let plugin = plugin.ok_or_else(|| BadInput("expected --plugin NAME or --spec FILE".into()))?;
    let mut entry: serde_json::Map<String, serde_json::Value> = serde_json::from_str(plugin_config)
        .map_err(|error| BadInput(format!("--plugin-config: expected a JSON object: {error}")))?;
    entry.insert("plugin".into(), plugin.into());
    let grader = serde_json::from_value(serde_json::Value::Object(entry))
        .map_err(|error| BadInput(format!("--plugin-config: {error}")))?;
    Ok(VerifyRequest { grader: Some(grader), reward: None, items: Vec::new() })
}

/// Grades the JSONL input on the daemon, `VerifyRequest::MAX_ITEMS` items a request, printing
/// one result line per item; or, with `validate`, prints the daemon's check of the graders.
pub(crate) fn on_server(
    api: &rlvr_client::Client,
    mut request: VerifyRequest,
    jsonl: Option<PathBuf>,
    validate: bool,
) -> anyhow::Result<()> {
    if validate {
        let valid = api.validate_graders(&request)?;
        println!("{}", serde_json::to_string_pretty(&valid)?);
        return Ok(());
    }
    let input: Box<dyn BufRead> = match &jsonl {
        Some(path) => Box::new(BufReader::new(
            File::open(path).with_context(|| format!("cannot open {}", path.display()))?,
        )),
        None => Box::new(BufReader::new(io::stdin())),
    };
    let mut items = Vec::new();
    for (number, line) in input.lines().enumerate() {
        let line = line.context("reading input")?;
        if line.trim().is_empty() {
            continue;
        }
        let item: serde_json::Value = serde_json::from_str(&line)
            .map_err(|error| BadInput(format!("input line {}: invalid JSON: {error}", number + 1)))?;
        items.push(item);
    }
    let mut stdout = io::BufWriter::new(io::stdout().lock());
    let (mut graded, mut passed, mut errors) = (0, 0, 0);
    for chunk in items.chunks(VerifyRequest::MAX_ITEMS) {
        request.items = chunk.to_vec();
        for line in api.verify(&request)?.results {
            graded += 1;
            passed += usize::from(line.passed);
            errors += usize::from(line.error.is_some());
            serde_json::to_writer(&mut stdout, &line)?;
            stdout.write_all(b"\n")?;
        }
    }
    stdout.flush()?;
    eprintln!("rlvrctl: {graded} item(s) graded on the daemon: {passed} passed, {errors} with errors");
    Ok(())
}
