//! Scheduling jobs over this daemon's devices (design.md §7).
//!
//! - [`policy`]: the pure policy — admission, grant order, preemption victims.
pub mod policy;
