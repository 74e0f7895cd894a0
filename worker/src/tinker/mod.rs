//! The training client of the Tinker front door (`rlvr_protocol::tinker`): what a team's own
//! training loop asks of its model through the SDK, computed here.
//!
//! - [`loss`]: each `forward_backward` loss on a datum's target log-probabilities, as a sum.

pub mod client;
pub mod loss;
pub mod serve;
