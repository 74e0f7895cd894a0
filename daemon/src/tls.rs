//! TLS for this process's outgoing HTTPS: rustls with the ring provider.
//!
//! The workspace builds reqwest with `rustls-no-provider` (see the root Cargo.toml), so a process
//! must install a provider before it builds its first client, or reqwest panics.

/// Installs ring as the process's rustls provider; a second call is a no-op.
pub fn install_crypto_provider() {
    // Err only means a provider is installed already, which is what we want.
    let _ = rustls::crypto::ring::default_provider().install_default();
}
