//! The daemon's library: everything `rlvrd` and `rlvrctl` share.
//!
//! `main` functions are thin: they parse arguments and call into here, so the whole server runs
//! in-process in tests. See ARCHITECTURE.md for the map.
pub mod api;
pub mod arith;
pub mod config;
pub mod curricula;
pub mod events;
pub mod health;
pub mod jobs;
pub mod logging;
pub mod metrics;
pub mod registry;
pub mod report;
pub mod sched;
pub mod serve;
pub mod time;
pub mod tls;
pub mod verify;
pub mod worker;
