//! The plugin host: everything a process needs to use plugin libraries, and nothing that needs
//! libtorch (optimizer plugins link it themselves; a host that only lists or probes them never
//! maps their code, see [`registry::Isolation`]).
//!
//! - [`loader`]: one library — ELF pre-check, abi_stable load, info checks, self-test.
//! - [`registry`]: the set of loaded `name@version`s over plugin directories (scans),
//!   content-addressed copies, the child-process probe, `check_options`, refusals.
//! - [`verify`]: the JSONL batch engine of `rlvrctl verify` and of the worker's rewards.
//! - [`reward`]: a completion's reward from its graders' verdicts (weighted sum or formula;
//!   `Reward`, `Combiner`), for the worker and the daemon's dry-run alike.
//! - [`fair`]: slots that teams take in turn.
//! - [`probes`]: what probe processes reported, kept beside the copies by library and worker
//!   build, so a restart probes nothing it probed before.
//! - [`options`]: a plugin's answer about its options before a job runs (in this process, or
//!   in a worker process for an optimizer the daemon only probed), in the spec's terms
//!   (`OptionsProblem`, `spec_field`).
//! - [`child`]: the short-lived helper processes (`probe-plugin`, `check-options`).
//! - [`dirs`]: where a program that loads plugins itself finds them (`plugins.dirs`).
//! - [`fit`]: whether a job's optimizer fits the rest of its spec (submit and start).
//! - [`events`], [`metrics`]: what the registry logs and counts.

pub mod child;
pub mod dirs;
pub mod events;
pub mod fair;
pub mod fit;
pub mod loader;
pub mod metrics;
pub mod options;
pub mod probes;
pub mod registry;
pub mod reward;
pub mod verify;

pub use registry::{Isolation, LoadedPlugin, Registry};
