//! Multi-stage pipelines on the daemon's side (issue 21): each stage a job whose input is the
//! previous stage's gated output.
//!
//! - [`next`] (**pure**): a pipeline's record and its running stage's job in, the next action
//!   out.
//! - [`drive`]: the IO shell — every daemon drives every running pipeline from Redis, so a
//!   restart (or another daemon) takes up where a killed one stopped.

pub mod drive;
pub mod next;
