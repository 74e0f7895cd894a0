//! `rlvr-client`: the typed, blocking HTTP client of `rlvrd serve`'s API, shared by `rlvrctl`,
//! the integration tests and the benchmarks, so that each speaks the API the same way.
//!
//! - [`settings`]: where the daemon is and who we are — the server URL and the team's token from
//!   flags, the environment (`RLVR_SERVER`, `RLVR_TOKEN`) or `~/.config/rlvr/cli.toml`.
//! - [`Client`] (`client.rs`): one typed method per route (`submit`, `job`, `jobs`, `cancel`,
//!   `promote`, `metrics`, `plugins`, `health`, `curriculum_refresh`, datasets, model lines),
//!   reading and writing the wire types of [`rlvr_protocol`]; busy answers (429, 503 with
//!   Retry-After) waited out a few times.
//! - [`HttpError`] (`error.rs`): every failure, classified as the exit status a program ends
//!   with ([`Exit`]): refused (4xx, input on this side) or unreachable (no answer, 5xx, an answer
//!   this version cannot read).
//! - [`events`]: [`Client::follow`] reads a job's server-sent events to its end, reconnecting
//!   across daemon restarts; the caller shows them through a [`View`].
//! - `spec_data.rs`: a spec's local data files uploaded ([`SpecDataError`]).
//!
//! Blocking on purpose: its users are plain synchronous programs, which get concurrency from
//! threads. It links neither libtorch nor Redis nor the daemon: what it knows of the daemon is
//! the wire types. Errors are typed; nothing here prints.

#![deny(missing_docs)]

mod client;
mod error;
pub mod events;
pub mod settings;
mod spec_data;

pub use client::{
    BUSY_RETRIES, BUSY_WAIT_MAX, CONNECT_TIMEOUT, Client, ClientConfig, JobQuery, REQUEST_TIMEOUT,
    STREAM_SILENCE, SpecFormat,
};
pub use error::{Exit, HttpError, api_error_text};
pub use events::View;
pub use reqwest::{StatusCode, Url};
pub use settings::{Auth, Settings, SettingsError, Token};
pub use spec_data::SpecDataError;
