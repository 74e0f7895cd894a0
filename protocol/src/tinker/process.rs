//! What the daemon and a training client's process (`rlvr-worker tinker-client`) say to each
//! other: one JSON line each way per message — commands on the process's stdin, events on its
//! stdout. A command carries the request id the SDK polls; its event answers that id, with the
//! bytes the SDK reads (`retrieve_future`'s protobuf answers travel as base64) or a failure whose
//! category is the SDK's. The process runs commands one at a time, in the order given: the daemon
//! gives them in `seq_id` order.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::wire::{AdamParams, ErrorCategory, SampleRequest};

/// The file of a saved state (`SaveState`, `SaveSampler`) that holds the SDK's name of the base,
/// beside `adapter/` (whose config names where the base is, so that it loads on its own).
pub const SDK_BASE_FILE: &str = "sdk-base-model";

/// A command to a training client's process.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "command", rename_all = "snake_case", deny_unknown_fields)]
pub enum ClientCommand {
    /// A `forward_backward` (or forward-only) request, as the SDK sent it (protobuf).
    ForwardBackward {
        request_id: String,
        #[serde(with = "base64_bytes")]
        body: Vec<u8>,
    },
    OptimStep {
        request_id: String,
        params: AdamParams,
    },
    /// A sample with the current weights, or with a saved sampler's (`weights`, an adapter
    /// directory).
    Sample {
        request_id: String,
        request: Box<SampleRequest>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        weights: Option<PathBuf>,
    },
    /// The state (adapter, and with `optimizer` AdamW's) written to `dir`, which must not exist
    /// unless `overwrite` (then it is replaced once the new one is whole).
    SaveState {
        request_id: String,
        dir: PathBuf,
        optimizer: bool,
        #[serde(default)]
        overwrite: bool,
    },
    /// The adapter alone written to `dir`: a sampler's weights.
    SaveSampler {
        request_id: String,
        dir: PathBuf,
        #[serde(default)]
        overwrite: bool,
    },
    /// The state in `dir` loaded (with `optimizer`, AdamW's too).
    LoadState {
        request_id: String,
        dir: PathBuf,
        optimizer: bool,
    },
    /// Everything written to `dir` (adapter, AdamW's state, the gradients accumulated since the
    /// last step), then the process exits: it is preempted, and resumes from `dir`.
    Suspend {
        dir: PathBuf,
    },
    /// What a suspend writes, written to `dir`, and the process goes on: the point a restarted
    /// process resumes from after a crash (the daemon replays what came after).
    Checkpoint {
        dir: PathBuf,
    },
}

impl ClientCommand {
    /// The request id the SDK polls for this command's answer (none for a suspend or a
    /// checkpoint: the daemon's own).
    pub fn request_id(&self) -> Option<&str> {
        match self {
            ClientCommand::ForwardBackward { request_id, .. }
            | ClientCommand::OptimStep { request_id, .. }
            | ClientCommand::Sample { request_id, .. }
            | ClientCommand::SaveState { request_id, .. }
            | ClientCommand::SaveSampler { request_id, .. }
            | ClientCommand::LoadState { request_id, .. } => Some(request_id),
            ClientCommand::Suspend { .. } | ClientCommand::Checkpoint { .. } => None,
        }
    }

    /// Whether it changes the client's state (adapter, AdamW's, accumulated gradients): what a
    /// restarted process must run again to be where the lost one was.
    pub fn changes_state(&self) -> bool {
        matches!(
            self,
            ClientCommand::ForwardBackward { .. }
                | ClientCommand::OptimStep { .. }
                | ClientCommand::LoadState { .. }
        )
    }
}

/// What a training client's process tells the daemon.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case", deny_unknown_fields)]
pub enum ClientEvent {
    /// Loaded and waiting for commands.
    Ready { vocab_size: i64, steps: i64 },
    /// A command's answer.
    Done { request_id: String, answer: Answer },
    /// A command that could not be served, and whose fault that is.
    Failed { request_id: String, error: String, category: ErrorCategory },
    /// Everything is in the suspend's directory; the process exits.
    Suspended,
    /// Everything is in the checkpoint's directory; the process goes on.
    Checkpointed,
}

/// A command's answer, as `retrieve_future` gives it to the SDK.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum Answer {
    /// A protobuf message (`ForwardBackwardOutput`, `SampleResponse`).
    Proto {
        #[serde(with = "base64_bytes")]
        bytes: Vec<u8>,
    },
    /// A JSON object (`OptimStepResponse`, a saved path, …).
    Json { value: Value },
}

/// Bytes as a base64 string (standard alphabet, padded).
mod base64_bytes {
    use base64::Engine;
    use base64::engine::general_purpose::STANDARD;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(bytes: &[u8], serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&STANDARD.encode(bytes))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Vec<u8>, D::Error> {
        let text = String::deserialize(deserializer)?;
        STANDARD.decode(text.as_bytes()).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_and_events_are_one_json_line_each_and_read_back() {
        let command = ClientCommand::ForwardBackward { request_id: "r1".into(), body: vec![0, 255, 10, 13] };
        let line = serde_json::to_string(&command).unwrap();
        assert_eq!(line, r#"{"command":"forward_backward","request_id":"r1","body":"AP8KDQ=="}"#);
        assert_eq!(serde_json::from_str::<ClientCommand>(&line).unwrap(), command);
        let event =
            ClientEvent::Done { request_id: "r1".into(), answer: Answer::Proto { bytes: vec![1, 2] } };
        let line = serde_json::to_string(&event).unwrap();
        assert!(!line.contains('\n'));
        assert_eq!(serde_json::from_str::<ClientEvent>(&line).unwrap(), event);
        let refused = serde_json::from_str::<ClientCommand>(
            r#"{"command":"forward_backward","request_id":"r","body":"@@"}"#,
        );
        assert!(refused.unwrap_err().to_string().contains("Invalid"), "not base64");
    }
}
