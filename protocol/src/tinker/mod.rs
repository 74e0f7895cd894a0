//! The Tinker front door's types: the SDK's JSON messages under `/api/v1` ([`wire`]) and its
//! protobuf messages ([`proto`], mirrored from `protocol/proto/tinker_public.proto`), as the
//! `tinker` SDK 0.38.0 speaks them.
//!
//! A team runs its own training loop (the SDK's `ServiceClient`, `TrainingClient`,
//! `SamplingClient`, or tinker-cookbook's recipes) with `base_url` pointing at `rlvrd serve` and a
//! `tml-` key of its own; each training client is a job of rlvr's, scheduled and preempted like
//! any other.

pub mod answers;
pub mod datums;
pub mod loss;
pub mod paths;
pub mod process;
pub mod proto;
pub mod wire;

/// Where the SDK's routes are, under the daemon's listener.
pub const API_PREFIX: &str = "/api/v1";

/// The SDK refuses a key that does not start so (before it sends anything).
pub const KEY_PREFIX: &str = "tml-";

/// The SDK versions the tests run (`create_session` warns naming any other).
pub const TESTED_SDK: &str = "0.38.0";
