//! `rlvr-worker tinker-client`: one training client's process. It loads the base model, attaches
//! the client's adapter (fresh, or from what a suspend wrote), says it is ready, then runs the
//! daemon's commands (`rlvr_protocol::tinker::process`) one at a time as they come on stdin,
//! answering each on stdout, until stdin closes or a suspend. Each command asks the daemon's
//! scheduler for the device first (update for forward/backward and steps, rollout for sampling)
//! and gives it back after, so other jobs' phases use the device between a client's requests.

use std::collections::HashMap;
use std::io::{BufRead, Write};
use std::path::PathBuf;

use rlvr_protocol::grants::Phase;
use rlvr_protocol::tinker::answers;
use rlvr_protocol::tinker::datums::{self, Limits};
use rlvr_protocol::tinker::loss::Loss;
use rlvr_protocol::tinker::process::{Answer, ClientCommand, ClientEvent};
use rlvr_protocol::tinker::proto::{ForwardBackwardRequest, Message};
use rlvr_protocol::tinker::wire::{self, ErrorCategory, InputChunk, SampleRequest};
use rlvr_protocol::worker::TinkerClientArgs;
use serde_json::json;
use tch::{Device, Kind, Tensor};

use super::client::{BaseModel, ClientError, TrainingClient, adapter_tensors};
use crate::grants::Grants;

/// Datums one request may carry.
const MAX_DATUMS: usize = 1024;
/// Tokens over one request's datums.
const MAX_REQUEST_TOKENS: usize = 1 << 20;
/// Samples one request may ask for.
const MAX_SAMPLES: u32 = 256;
/// Saved samplers' adapters kept in memory at once (a client may save any number).
const CACHED_SAMPLERS: usize = 8;

/// Serves commands from `input`, writing events to `output`, until `input` ends or a suspend.
/// Errors: the process cannot go on (the model does not load, the grant socket fails, a line
/// that is not a command: the daemon's bug), said on stderr by the caller.
pub fn serve(args: &TinkerClientArgs, input: impl BufRead, mut output: impl Write) -> Result<(), String> {
    let device = match &args.device {
        Some(text) => crate::parse_device(text).map_err(|e| e.to_string())?,
        None => Device::cuda_if_available(),
    };
    if let Some(threads) = args.threads {
        tch::set_num_threads(i32::try_from(threads.max(1)).unwrap_or(i32::MAX));
    }
    let lora: wire::LoraConfig =
        serde_json::from_str(&args.lora).map_err(|error| format!("--lora: not a lora_config: {error}"))?;
    let model =
        rlvr_model::load(&args.base, device, Kind::Float).map_err(|error| format!("--base: {error}"))?;
    let context = model.config.max_position_embeddings.and_then(|n| usize::try_from(n).ok()).unwrap_or(4096);
    let limits =
        Limits { datums: MAX_DATUMS, tokens_per_datum: context, tokens: MAX_REQUEST_TOKENS, columns: 1 };
    let mut client = match (&args.resume, &args.from_state) {
        (Some(dir), _) => TrainingClient::resume(model, dir),
        (None, Some(dir)) => TrainingClient::load_state(model, dir, args.with_optimizer),
        (None, None) => TrainingClient::new(model, &lora, args.seed),
    }
    .map_err(|error| format!("the client's adapter: {error}"))?;
    let grants = match args.grant_socket.as_deref().zip(args.job_id.as_deref()) {
        Some((socket, job)) => Grants::connect(socket, job).map_err(|e| e.to_string())?,
        None => Grants::none(),
    };
    let base = BaseModel { location: args.base.clone(), name: args.base_name.clone() };
    let mut emit = |event: &ClientEvent| -> Result<(), String> {
        let line = serde_json::to_string(event).map_err(|e| e.to_string())?;
        writeln!(output, "{line}").and_then(|()| output.flush()).map_err(|e| format!("stdout: {e}"))
    };
    emit(&ClientEvent::Ready { vocab_size: client.model().model.vocab_size(), steps: client.steps() })?;
    let mut samplers: HashMap<PathBuf, Vec<(String, Tensor)>> = HashMap::new();
    for line in input.lines() {
        let line = line.map_err(|e| format!("stdin: {e}"))?;
        if line.trim().is_empty() {
            continue;
        }
        let command: ClientCommand =
            serde_json::from_str(&line).map_err(|error| format!("stdin: not a command ({error}): {line}"))?;
        match &command {
            ClientCommand::Suspend { dir } => {
                client.suspend(&base, dir).map_err(|e| e.to_string())?;
                emit(&ClientEvent::Suspended)?;
                return Ok(());
            }
            ClientCommand::Checkpoint { dir } => {
                client.suspend(&base, dir).map_err(|e| e.to_string())?;
                emit(&ClientEvent::Checkpointed)?;
                continue;
            }
            _ => {}
        }
        let phase = match &command {
            ClientCommand::Sample { .. } => Phase::Rollout,
            _ => Phase::Update,
        };
        let grant = grants.hold(phase).map_err(|e| e.to_string())?;
        let (request_id, answered) = run(&mut client, &limits, &base, &mut samplers, command);
        grant.release(device);
        emit(&match answered {
            Ok(answer) => ClientEvent::Done { request_id, answer },
            Err(ClientError::Request(error)) => {
                ClientEvent::Failed { request_id, error, category: ErrorCategory::User }
            }
            Err(ClientError::Internal(error)) => {
                ClientEvent::Failed { request_id, error, category: ErrorCategory::Server }
            }
        })?;
    }
    Ok(())
}

/// One command (not a suspend): its request id and its answer.
fn run(
    client: &mut TrainingClient,
    limits: &Limits,
    base: &BaseModel,
    samplers: &mut HashMap<PathBuf, Vec<(String, Tensor)>>,
    command: ClientCommand,
) -> (String, Result<Answer, ClientError>) {
    let request = |message: String| ClientError::Request(message);
    match command {
        ClientCommand::ForwardBackward { request_id, body } => {
            let answered = (|| {
                let decoded = ForwardBackwardRequest::decode(body.as_slice())
                    .map_err(|e| request(format!("not a ForwardBackwardRequest: {e}")))?;
                let loss = Loss::parse(&decoded.loss_fn, &decoded.loss_fn_config, &decoded.loss_fn_config_v2)
                    .map_err(|e| request(e.0))?;
                let data = datums::read(&decoded.data, limits).map_err(|e| request(e.to_string()))?;
                let pass = client.forward_backward(&data, &loss, decoded.forward_only)?;
                let metrics = [("loss:sum".to_owned(), pass.loss)].into();
                Ok(Answer::Proto {
                    bytes: answers::forward_backward_output(&pass.logprobs, metrics).encode_to_vec(),
                })
            })();
            (request_id, answered)
        }
        ClientCommand::OptimStep { request_id, params } => {
            let answered =
                client.optim_step(&params).map(|metrics| Answer::Json { value: json!({"metrics": metrics}) });
            (request_id, answered)
        }
        ClientCommand::Sample { request_id, request: asked, weights } => {
            let answered = (|| {
                if weights.as_ref().is_some_and(|dir| !samplers.contains_key(dir))
                    && samplers.len() >= CACHED_SAMPLERS
                {
                    samplers.clear();
                }
                let weights = match weights {
                    Some(dir) => Some(match samplers.get(&dir) {
                        Some(tensors) => tensors,
                        None => samplers.entry(dir.clone()).or_insert(adapter_tensors(&dir)?),
                    }),
                    None => None,
                };
                let sample = |client: &TrainingClient| sample(client, &asked);
                match weights {
                    Some(tensors) => client.with_adapter(tensors, sample)?,
                    None => sample(client),
                }
            })();
            (request_id, answered)
        }
        ClientCommand::SaveState { request_id, dir, optimizer, overwrite } => {
            let answered = replacing(&dir, overwrite, |dir| client.save_state(base, dir, optimizer))
                .map(|()| Answer::Json { value: json!({}) });
            (request_id, answered)
        }
        ClientCommand::SaveSampler { request_id, dir, overwrite } => {
            let answered = replacing(&dir, overwrite, |dir| client.save_state(base, dir, false))
                .map(|()| Answer::Json { value: json!({}) });
            (request_id, answered)
        }
        ClientCommand::LoadState { request_id, dir, optimizer } => {
            let answered =
                client.load_state_into(&dir, optimizer).map(|()| Answer::Json { value: json!({}) });
            (request_id, answered)
        }
        ClientCommand::Suspend { .. } | ClientCommand::Checkpoint { .. } => {
            unreachable!("serve handles a suspend and a checkpoint itself")
        }
    }
}

/// Runs `save` (which writes a directory that must not exist) to `dir`; with `overwrite` an
/// existing one is moved aside first, removed once the new one is whole, put back if the save
/// fails. Without, an existing one is the request's fault.
fn replacing(
    dir: &std::path::Path,
    overwrite: bool,
    save: impl FnOnce(&std::path::Path) -> Result<(), ClientError>,
) -> Result<(), ClientError> {
    if !dir.exists() {
        return save(dir);
    }
    if !overwrite {
        return Err(ClientError::Request(format!(
            "{} exists; save under another name, or with overwrite",
            dir.display()
        )));
    }
    let aside = dir.with_file_name(format!(
        ".replaced-{}",
        dir.file_name().map(|name| name.to_string_lossy().into_owned()).unwrap_or_default()
    ));
    let _ = std::fs::remove_dir_all(&aside);
    std::fs::rename(dir, &aside).map_err(|e| ClientError::Internal(format!("{}: {e}", dir.display())))?;
    match save(dir) {
        Ok(()) => {
            let _ = std::fs::remove_dir_all(&aside);
            Ok(())
        }
        Err(error) => {
            let _ = std::fs::rename(&aside, dir);
            Err(error)
        }
    }
}

/// A sample request's answer (`SampleResponse`).
fn sample(client: &TrainingClient, asked: &SampleRequest) -> Result<Answer, ClientError> {
    let request = |message: String| ClientError::Request(message);
    if asked.num_samples == 0 || asked.num_samples > MAX_SAMPLES {
        return Err(request(format!("num_samples: expected 1 to {MAX_SAMPLES}, got {}", asked.num_samples)));
    }
    let unserved = [
        ("topk_prompt_logprobs", asked.topk_prompt_logprobs > 0),
        ("topk_sample_logprobs", asked.topk_sample_logprobs > 0),
        ("prompt_alt_tokens_k", asked.prompt_alt_tokens_k > 0),
        ("prompt_logprobs_last_n", asked.prompt_logprobs_last_n.is_some()),
        ("target_prompt_logprobs", asked.target_prompt_logprobs.is_some()),
    ];
    if let Some((name, _)) = unserved.iter().find(|(_, asked)| *asked) {
        return Err(request(format!("{name}: not served here")));
    }
    let mut prompt = Vec::new();
    for (i, chunk) in asked.prompt.chunks.iter().enumerate() {
        match chunk {
            InputChunk::EncodedText { tokens } => prompt.extend(tokens),
            _ => return Err(request(format!("prompt.chunks[{i}]: only text chunks are served here"))),
        }
    }
    let (sequences, prompt_logprobs) =
        client.sample(&prompt, &asked.sampling_params, asked.num_samples, asked.prompt_logprobs)?;
    Ok(Answer::Proto {
        bytes: answers::sample_response(&sequences, prompt_logprobs.as_deref()).encode_to_vec(),
    })
}
