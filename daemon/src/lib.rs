//! The control plane, `rlvrd serve`: the HTTP API, the queue consumer and the supervision of
//! each job's worker process, the scheduler, the gates and publishing, the shared curricula.
//! It never touches a tensor: this crate does not depend on libtorch, and its plugin registry
//! only probes optimizer plugins in a worker process (see ARCHITECTURE.md).
//!
//! `main` is thin: it parses arguments and calls into here, so the whole server runs in-process
//! in tests.
pub mod api;
pub mod arith;
pub mod config;
pub mod curricula;
pub mod doctor;
pub mod health;
pub mod jobs;
pub mod metrics;
pub mod pipelines;
pub mod sched;
pub mod serve;
pub mod state_dir;
pub mod tenancy;
