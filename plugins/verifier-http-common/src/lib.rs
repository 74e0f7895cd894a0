//! What the verifiers that call a remote service over HTTP share (`http`, `judge`): the
//! resilience keys and their checks ([`resilience`]), the secret and url options ([`options`]),
//! the client under the host's outbound policy ([`outbound`]), one attempt ([`attempt`]), the
//! retry loop with backoff ([`call`]) and the circuit breaker ([`breaker`]).
//!
//! A plain library linked into each such plugin: the plugins differ in what they send and how
//! they read the answer, never in how they survive a slow, failing or dead peer.

pub mod attempt;
pub mod breaker;
pub mod call;
pub mod options;
pub mod outbound;
pub mod resilience;
pub mod tls;

pub use attempt::{Failure, backoff, jitter_unit};
pub use breaker::{Admission, Breaker};
pub use call::{Answered, Caller, Trail};
pub use outbound::{Sender, outbound};
pub use resilience::{
    MAX_ITEM_BUDGET_MS, MAX_RESPONSE_BYTES_LIMIT, MAX_RETRIES, Resilience, ResilienceKeys, RetryOn,
    hold_to_caps,
};
