//! The environments a multi-turn job's rollouts talk to (`[env]`), client side.
//!
//! - [`action`] (**pure**): [`read_action`], a model's turn read as an environment's action — one
//!   named field, the first JSON object, or one Hermes `<tool_call>`.
//! - [`openenv`]: OpenEnv's stateful interface (openenv 0.10.0): one environment per WebSocket
//!   session ([`Session`]: `open` checks the url and every address against the outbound policy,
//!   `reset`, `step`, `close`), `reset` and `step` as typed JSON frames (serde types `Request`,
//!   `Answer`), the server's errors (capacity, a malformed action, a failing environment, a
//!   timeout) as [`EnvError`]s that name the server and what it said. `read_answer` (**pure**)
//!   reads a frame to a [`Reply`] or an [`EnvError`] (capacity, the environment's refusal).
//!
//! Every connection goes through the operator's outbound policy (`rlvr_outbound::Policy`): the
//! url is checked before anything is sent, and each address its host resolves to before the
//! connection is made, as for every other destination a spec names.
//!
//! This crate is the environment's half; `rlvr_model::episode` is the tokens' half (token in,
//! token out), and `rlvr-worker`'s `episodes` plays a round of episodes with both (`play`: one
//! session each, kept between rounds, turns batched, steps at once) for a job with `[env]`
//! (`rlvr_protocol::env`: the section and its checks, **pure**); the worker's `step` trains on
//! them with the replies masked out, its `eval` plays the held-out set through them.
//! `examples/envs/arith_feedback.py` is a small OpenEnv environment (two tries at `a+b=`, the sum
//! as feedback) on `scripts/openenv-venv.sh`'s venv.

pub mod action;
pub mod openenv;

pub use action::{ActionError, ActionFormat, read_action};
pub use openenv::{EnvError, Reply, Session};
