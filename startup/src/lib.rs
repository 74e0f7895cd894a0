//! What every rlvr program does first, the same way: its log subscriber ([`logging`]) and its
//! TLS provider ([`install_crypto_provider`]).
//!
//! Logs are `tracing` to stderr, human or JSON, at the level `RLVR_LOG` names (`logging.rs`); the
//! TLS provider is rustls' ring.

pub mod logging;

/// Installs ring as the process's rustls provider; a second call is a no-op.
///
/// The workspace builds reqwest with `rustls-no-provider` (see the root Cargo.toml), so a process
/// must install a provider before it builds its first client, or reqwest panics.
pub fn install_crypto_provider() {
    // Err only means a provider is installed already, which is what we want.
    let _ = rustls::crypto::ring::default_provider().install_default();
}
