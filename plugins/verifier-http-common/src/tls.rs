//! TLS set-up of the client: the crypto provider, and what the host's root certificates look like.

/// Installs ring as rustls's process-wide provider. The plugins link rustls without a default
/// provider; ring is the one they ship. Installing twice (a second config) is refused by rustls
/// and harmless.
pub fn install_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// Notes for the plugin's load: how many root certificates there are, and from where.
///
/// The same store rustls-platform-verifier reads on Linux: an empty one means every https peer
/// fails its handshake, which an operator should learn at load, not per item.
pub fn notes() -> Vec<String> {
    let roots = rustls_native_certs::load_native_certs();
    let source = match (std::env::var_os("SSL_CERT_FILE"), std::env::var_os("SSL_CERT_DIR")) {
        (None, None) => "the system store".to_owned(),
        (file, dir) => format!(
            "SSL_CERT_FILE={} SSL_CERT_DIR={}",
            file.map_or_else(|| "(unset)".into(), |f| f.to_string_lossy().into_owned()),
            dir.map_or_else(|| "(unset)".into(), |d| d.to_string_lossy().into_owned())
        ),
    };
    let mut notes = vec![format!(
        "https: rustls (ring), {} trusted root certificate(s) from {source}",
        roots.certs.len()
    )];
    if roots.certs.is_empty() {
        notes.push(
            "https: no root certificates found, every https peer will fail its handshake; install \
             ca-certificates or set SSL_CERT_FILE"
                .to_owned(),
        );
    }
    notes.extend(
        roots.errors.iter().take(3).map(|error| format!("https: reading root certificates: {error}")),
    );
    notes
}
