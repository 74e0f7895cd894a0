//! Scheduling jobs over this daemon's devices (design.md §7).
//!
//! - [`inventory`]: the devices, found once at start (config, NVML, or CPU slots).
//! - [`policy`]: the pure policy — admission, grant order, preemption victims.
//! - [`service`]: the live scheduler of `rlvrd serve` — the policy, the supervisors' seats, and
//!   the workers' grant socket.
//! - [`simulate`]: `rlvrd simulate`, a trace replayed through the policy next to a FCFS baseline.
pub mod inventory;
pub mod policy;
pub mod service;
pub mod simulate;
