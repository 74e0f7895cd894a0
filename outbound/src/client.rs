//! The reqwest edge: HTTP clients that send only what the [`Policy`] allows.
//!
//! Each client checks a request's url ([`Policy::check_url`]) before it makes the request, and
//! resolves host names with a resolver that checks every address ([`Policy::check_addr`]) and
//! drops the refused ones, so the address connected to is the address checked (a name that
//! resolves to a public address at submit and to `127.0.0.1` at delivery is still refused). It
//! follows no redirect (a `3xx` is the answer) and uses no proxy (one from the environment would
//! connect on the client's behalf to wherever it is told, past the checks).
//!
//! reqwest calls a resolver only for host names: a url whose host is an address is connected to
//! directly. That is why the clients here offer no way to make a request but through a method
//! that runs [`Policy::check_url`] first, and why the reqwest client inside is never handed out.

use std::net::SocketAddr;
use std::sync::Arc;

use reqwest::Method;
use reqwest::dns::{Addrs, Name, Resolve, Resolving};

use crate::policy::{Policy, Refusal};

/// Why a client could not be built.
#[derive(Debug, thiserror::Error)]
#[error("cannot build an HTTP client: {0}")]
pub struct BuildError(#[source] reqwest::Error);

/// Resolves host names with the system's resolver (`getaddrinfo`, on tokio's blocking pool) and
/// keeps the addresses the policy allows.
struct CheckedResolver {
    policy: Arc<Policy>,
}

impl Resolve for CheckedResolver {
    fn resolve(&self, name: Name) -> Resolving {
        let policy = self.policy.clone();
        let host = name.as_str().to_owned();
        Box::pin(async move {
            // A name no entry covers is not even looked up.
            policy.check_name(&host)?;
            let found = tokio::net::lookup_host((host.as_str(), 0)).await?;
            let kept = policy.keep_allowed(&host, found.map(|addr| addr.ip()))?;
            // Port 0: reqwest puts the url's port in.
            let addrs: Addrs = Box::new(kept.into_iter().map(|ip| SocketAddr::new(ip, 0)));
            Ok(addrs)
        })
    }
}

/// The refusal somewhere in `error`'s chain of causes: a request the resolver refused fails
/// with a reqwest error whose cause is the [`Refusal`].
pub fn refusal_of<'a>(error: &'a (dyn std::error::Error + 'static)) -> Option<&'a Refusal> {
    let mut cause = Some(error);
    while let Some(error) = cause {
        if let Some(refusal) = error.downcast_ref::<Refusal>() {
            return Some(refusal);
        }
        cause = error.source();
    }
    None
}

/// A failed request's message and its causes, without the url it repeats (the caller names it
/// once): what the daemon records for a webhook or a tracking server that could not be reached.
pub fn describe(error: reqwest::Error) -> String {
    let error = error.without_url();
    let mut text = error.to_string();
    let mut source = std::error::Error::source(&error);
    while let Some(cause) = source {
        text = format!("{text}: {cause}");
        source = cause.source();
    }
    text
}

/// The process's rustls provider, if it has none yet: reqwest is built without one (see the
/// workspace's Cargo.toml) and would panic building a client.
fn install_tls_provider() {
    // Err only means a provider is installed already.
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// An async HTTP client that sends requests only where the policy allows.
#[derive(Clone)]
pub struct Client {
    http: reqwest::Client,
    policy: Arc<Policy>,
}

impl Client {
    /// Builds `builder` (timeouts, headers, user agent: the caller's) with the policy's
    /// resolver, no redirects and no proxy, which override whatever `builder` said of them.
    ///
    /// `builder` must not carry DNS overrides (`resolve`, `resolve_to_addrs`): reqwest applies
    /// them before any resolver, so their addresses would not be checked.
    pub fn new(policy: Policy, builder: reqwest::ClientBuilder) -> Result<Client, BuildError> {
        install_tls_provider();
        let policy = Arc::new(policy);
        let resolver = Arc::new(CheckedResolver { policy: policy.clone() });
        let http = builder
            .dns_resolver(resolver)
            .redirect(reqwest::redirect::Policy::none())
            .no_proxy()
            .build()
            .map_err(BuildError)?;
        Ok(Client { http, policy })
    }

    /// The policy it enforces.
    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    /// A request to `url`, once [`Policy::check_url`] allows it.
    pub fn request(&self, method: Method, url: &str) -> Result<reqwest::RequestBuilder, Refusal> {
        let url = self.policy.check_url(url)?;
        Ok(self.http.request(method, url))
    }

    /// `POST url`, once [`Policy::check_url`] allows it.
    pub fn post(&self, url: &str) -> Result<reqwest::RequestBuilder, Refusal> {
        self.request(Method::POST, url)
    }

    /// `GET url`, once [`Policy::check_url`] allows it.
    pub fn get(&self, url: &str) -> Result<reqwest::RequestBuilder, Refusal> {
        self.request(Method::GET, url)
    }
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client").field("policy", &self.policy).finish_non_exhaustive()
    }
}

/// The same client for blocking callers (the http verifier plugin): reqwest's blocking client,
/// whose own runtime thread runs the resolver.
pub mod blocking {
    use super::*;

    /// A blocking HTTP client that sends requests only where the policy allows. Like any
    /// `reqwest::blocking` client, not to be built, used or dropped on an async runtime's thread.
    #[derive(Clone)]
    pub struct Client {
        http: reqwest::blocking::Client,
        policy: Arc<Policy>,
    }

    impl Client {
        /// As [`super::Client::new`], for `reqwest::blocking`.
        pub fn new(policy: Policy, builder: reqwest::blocking::ClientBuilder) -> Result<Client, BuildError> {
            install_tls_provider();
            let policy = Arc::new(policy);
            let resolver = Arc::new(CheckedResolver { policy: policy.clone() });
            let http = builder
                .dns_resolver(resolver)
                .redirect(reqwest::redirect::Policy::none())
                .no_proxy()
                .build()
                .map_err(BuildError)?;
            Ok(Client { http, policy })
        }

        /// The policy it enforces.
        pub fn policy(&self) -> &Policy {
            &self.policy
        }

        /// A request to `url`, once [`Policy::check_url`] allows it.
        pub fn request(
            &self,
            method: Method,
            url: &str,
        ) -> Result<reqwest::blocking::RequestBuilder, Refusal> {
            let url = self.policy.check_url(url)?;
            Ok(self.http.request(method, url))
        }

        /// `POST url`, once [`Policy::check_url`] allows it.
        pub fn post(&self, url: &str) -> Result<reqwest::blocking::RequestBuilder, Refusal> {
            self.request(Method::POST, url)
        }

        /// `GET url`, once [`Policy::check_url`] allows it.
        pub fn get(&self, url: &str) -> Result<reqwest::blocking::RequestBuilder, Refusal> {
            self.request(Method::GET, url)
        }
    }

    impl std::fmt::Debug for Client {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.debug_struct("blocking::Client").field("policy", &self.policy).finish_non_exhaustive()
        }
    }
}
