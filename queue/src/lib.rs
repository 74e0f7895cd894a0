//! Job specs, queue names and job state on Redis, shared by `rlvrd` and `rlvrctl`; no libtorch.
//!
//! - [`spec`]: the job spec of design.md §1, parsed from TOML or JSON, with errors that name the
//!   field. The queue itself (Redis, states, events) lands with issue 5.

pub mod spec;
