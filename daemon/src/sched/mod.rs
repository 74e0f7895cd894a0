//! Scheduling jobs over this daemon's devices (design.md §7).
//!
//! - [`policy`]: the pure policy — admission, grant order, preemption victims.
//! - [`simulate`]: `rlvrd simulate`, a trace replayed through the policy next to a FCFS baseline.
pub mod inventory;
pub mod policy;
pub mod simulate;
