//! Job specs, job records and the dispatch queue on Redis, shared by `rlvrd` and `rlvrctl`; no
//! libtorch.
//!
//! - [`spec`]: the job spec of design.md §1, parsed from TOML or JSON, with errors that name the
//!   field.
//! - [`job`]: states, allowed changes and the API's wire types (pure).
//! - [`store`]: job records, events, idempotency keys and dead letters on Redis (atomic scripts).
//! - [`dispatch`]: the apalis-redis queues (one per priority) that carry job ids to daemons.

pub mod dispatch;
pub mod job;
pub mod spec;
pub mod store;
