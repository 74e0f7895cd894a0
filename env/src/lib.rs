//! The environments a multi-turn job's rollouts talk to (`[env]`), client side.
//!
//! - [`action`] (**pure**): a model's turn read as an environment's action — one named field, the
//!   first JSON object, or one Hermes `<tool_call>`.
//! - [`openenv`]: OpenEnv's stateful interface (openenv 0.10.0): one environment per WebSocket
//!   session, `reset` and `step` as typed JSON frames, the server's errors (capacity, a malformed
//!   action, a failing environment) as [`EnvError`]s that name the server and what it said.
//!
//! Every connection goes through the operator's outbound policy (`rlvr_outbound::Policy`): the
//! url is checked before anything is sent, and each address its host resolves to before the
//! connection is made, as for every other destination a spec names.

pub mod action;
pub mod openenv;

pub use action::{ActionError, ActionFormat, read_action};
pub use openenv::{EnvError, Reply, Session};
