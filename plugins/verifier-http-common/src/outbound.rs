//! The one place where the host's outbound policy meets the HTTP client.

use reqwest::Url;
use reqwest::blocking::{Client, ClientBuilder};
use rlvr_plugin_api::{HostContext, OptionError};

/// The client requests go out through, under the host's outbound policy.
///
/// Always: no redirects (a redirect would reach a destination nobody checked; a redirected POST
/// also turns into a GET on 301/302, and a verdict from wherever that lands would be wrong — a
/// 3xx is reported instead) and no proxy from the environment (the worker's environment is not
/// the job's to choose, and a proxy would see every request). Under the daemon, `url` must be on
/// the operator's allow-list (a refusal is an `OptionError` at `key`) and every address its host
/// resolves to is checked again when it connects (`rlvr_outbound`). A run by hand (`rlvrctl
/// verify`, a worker without a daemon) is unrestricted.
pub fn outbound(
    builder: ClientBuilder,
    key: &str,
    url: &Url,
    host: &HostContext,
) -> Result<Sender, OptionError> {
    let build_error = |error: &dyn std::fmt::Display| {
        OptionError::new(key, format!("cannot build an HTTP client: {error}"))
    };
    if host.outbound_unrestricted {
        let client = builder.redirect(reqwest::redirect::Policy::none()).no_proxy().build();
        return client.map(Sender::Unrestricted).map_err(|error| build_error(&error));
    }
    let policy = rlvr_outbound::Policy::new(&host.outbound_allow, host.outbound_allow_private)
        .map_err(|error| OptionError::new(key, format!("the host's outbound policy: {error}")))?;
    policy.check_url(url.as_str()).map_err(|refusal| OptionError::new(key, refusal.to_string()))?;
    let client =
        rlvr_outbound::blocking::Client::new(policy, builder).map_err(|error| build_error(&error))?;
    Ok(Sender::Checked(client))
}

/// What requests go out through: the outbound policy's client, or, run by hand, a plain one.
#[derive(Debug)]
pub enum Sender {
    /// Under the host's policy.
    Checked(rlvr_outbound::blocking::Client),
    /// A program run by hand, on its user's behalf.
    Unrestricted(Client),
}

impl Sender {
    /// `POST url`; `None` when the policy refuses it (never for the url checked at creation).
    pub fn post(&self, url: &Url) -> Option<reqwest::blocking::RequestBuilder> {
        match self {
            Sender::Checked(client) => client.post(url.as_str()).ok(),
            Sender::Unrestricted(client) => Some(client.post(url.clone())),
        }
    }
}
