//! What crosses rlvr's process boundaries, as types both sides share, so that renaming a field is
//! a compile error rather than a silent "not checked" (design.md §2). No IO beyond the job
//! directory's own files; no Redis, no HTTP, no libtorch: every program links it.
//!
//! - [`spec`]: the job spec of design.md §1, parsed from TOML or JSON, with errors that name the
//!   field.
//! - [`job`]: job states, the allowed changes between them and the API's wire types.
//! - [`api`]: the daemon's own wire types (health, plugin listing, the dry-run of graders).
//! - [`batch`]: the verifier batch format's output line.
//! - [`time`]: timestamps on the wire.
//! - [`grants`]: the grant socket's messages between a worker and the scheduler.
//! - [`curricula`]: the shared curricula's versions, which the daemon writes and workers pin.
//! - [`worker`]: the worker protocol — its arguments, exit statuses, outcome, metrics and
//!   progress.
//! - [`gates`]: the gate report, one status per criterion.
//! - [`engine`]: `[engine]`, the mapping of a job onto TRL's trainer and the contract its entry
//!   script reads (pure).
//! - [`jobdir`]: where a job's files are.
//! - [`checkpoints`]: which checkpoints a run keeps, and which it offers the gates (pure).
//! - [`formula`]: a job's reward as a formula over its named graders (`[reward] formula`).
//! - [`fs`]: the one atomic file write.
//! - [`runtime`]: what the worker's libtorch can do on this host (`rlvr-worker doctor`), and the
//!   platform a run recorded.
//! - [`memory`]: a job's memory estimate (resident and per phase) from its model's shape and
//!   its spec.
//! - [`reward_model`]: the built-in `reward-model` grader's keys.
//! - [`pipeline`]: multi-stage pipelines — the spec, its checks, a stage's input from the
//!   previous stage's output, and the pipeline routes' wire types.
//! - [`names`]: the names a tenant writes (datasets, data roots, base models, model lines) and
//!   their rule.
//! - [`env`]: `[env]`, a multi-turn job's environment, and its checks (pure).
//! - [`builtin_models`]: the built-in models (`builtin:tiny-arith`, random weights at published
//!   models' shapes) and their sources.
//! - [`signals`]: why a job may not be learning (steps whose groups were all-fail or all-pass).

pub mod api;
pub mod batch;
pub mod builtin;
pub mod builtin_models;
pub mod checkpoints;
pub mod curricula;
pub mod engine;
pub mod env;
pub mod formula;
pub mod fs;
pub mod gates;
pub mod grants;
pub mod job;
pub mod jobdir;
pub mod kind;
pub mod memory;
pub mod names;
pub mod pipeline;
pub mod records;
pub mod reward_model;
pub mod runtime;
pub mod signals;
pub mod spec;
pub mod time;
pub mod tinker;
pub mod worker;
