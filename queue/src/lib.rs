//! The job queue on Redis, shared by the daemons: job records and their events, and the dispatch
//! queues that carry job ids to daemons. The types it stores are `rlvr-protocol`'s.
//!
//! - [`store`]: **the job record is the truth** about a job — job records, events, the index,
//!   idempotency keys and dead letters on Redis (atomic scripts), `Store::page`.
//! - [`pipelines`]: pipeline records and their events, the running set (atomic scripts, as
//!   the jobs').
//! - [`tinker`]: the Tinker SDK's sessions.
//! - [`dispatch`]: the apalis-redis queues (one per priority) that carry job ids, and only job
//!   ids, to daemons.

pub mod dispatch;
pub mod pipelines;
pub mod store;
pub mod tinker;
