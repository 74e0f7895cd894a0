//! The outbound policy: the operator's allow-list and whether private addresses may be reached,
//! and the two checks every request passes — its url before anything is sent, each address its
//! host resolves to before a connection is made.
//!
//! Pure: no DNS, no sockets. The reqwest edge (`client.rs`) calls these checks.

use std::fmt;
use std::net::IpAddr;

use reqwest::Url;

use crate::addr::{non_public, special_ranges};
use crate::entry::{AllowEntry, EntryError, Parsed, normalize_name, parse_host};

/// Longest piece of a tenant's url quoted back in a refusal; longer ones are cut.
const MAX_SHOWN: usize = 100;

/// Where outbound requests may go: built from the operator's plain data, so that a process that
/// only receives the two fields (a plugin) builds the same policy as the daemon.
///
/// An empty allow-list allows nothing. A destination must be covered by an entry; an address
/// that is not public (private, loopback, link-local, CGNAT, unique-local, multicast, broadcast,
/// documentation, reserved, or an IPv6 form of one of those) is refused even then, unless
/// `allow_private` is set or an address/CIDR entry that lies inside that non-public range holds it
/// (`127.0.0.1/32` lets loopback `127.0.0.1` through; `0.0.0.0/0` opens the public IPv4 internet,
/// never the private ranges inside it; a host-name entry never lets a private address through).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Policy {
    entries: Vec<AllowEntry>,
    allow_private: bool,
}

/// Allow-list entries that could not be parsed; each with its index in the list.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}", lines(.problems))]
pub struct PolicyError {
    /// `(index, entry as written, why)`, in list order.
    pub problems: Vec<(usize, String, EntryError)>,
}

fn lines(problems: &[(usize, String, EntryError)]) -> String {
    let lines: Vec<String> =
        problems.iter().map(|(i, entry, error)| format!("allow[{i}] {}: {error}", shown(entry))).collect();
    lines.join("; ")
}

/// Why a request was not sent: said in words a tenant can act on, about the tenant's own url,
/// never about the server (its addresses, its allow-list, its network).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// Not a url at all.
    #[error("not a valid url: {0}")]
    Invalid(String),
    /// `file:`, `gopher:`, `ftp:`, …
    #[error("{scheme}: urls are not allowed; expected http or https")]
    Scheme {
        /// The url's scheme, as the parser lowercased it.
        scheme: String,
    },
    /// `http://user:pw@host/`: credentials do not go in a url a daemon logs and records.
    #[error("a user name or password in the url is not allowed")]
    Credentials,
    /// An http(s) url without a host.
    #[error("expected a host in the url")]
    NoHost,
    /// No entry covers the destination.
    #[error("{destination}: destination not in the operator's outbound allow-list{}", missed(near))]
    NotAllowed {
        /// `host:port` as the url says it (cut if long).
        destination: String,
        /// The entries that name the destination's host or hold its address for another port:
        /// the ones it missed (by port).
        near: Vec<String>,
    },
    /// The url's host is an address that is not public.
    #[error("{address} is {} {what} address; outbound requests go only to public addresses", article(what))]
    NonPublicAddress {
        /// The url's address.
        address: IpAddr,
        /// "loopback", "private", "link-local", …
        what: &'static str,
    },
    /// Every address the host resolves to is not public (checked after DNS).
    #[error(
        "{host} resolves to a non-public address (private, loopback, link-local or reserved); outbound \
         requests go only to public addresses"
    )]
    ResolvesToNonPublic {
        /// The url's host.
        host: String,
    },
    /// DNS found no address at all.
    #[error("{host} resolves to no address")]
    Unresolved {
        /// The url's host.
        host: String,
    },
}

impl Policy {
    /// A policy from the operator's allow-list entries and `allow_private`; every bad entry is
    /// reported at once.
    pub fn new(allow: &[String], allow_private: bool) -> Result<Policy, PolicyError> {
        let mut entries = Vec::with_capacity(allow.len());
        let mut problems = Vec::new();
        for (i, text) in allow.iter().enumerate() {
            match text.parse::<AllowEntry>() {
                Ok(entry) => entries.push(entry),
                Err(error) => problems.push((i, text.clone(), error)),
            }
        }
        if problems.is_empty() {
            Ok(Policy { entries, allow_private })
        } else {
            Err(PolicyError { problems })
        }
    }

    /// The policy that allows nothing: an empty allow-list.
    pub fn deny_all() -> Policy {
        Policy { entries: Vec::new(), allow_private: false }
    }

    /// The parsed entries, in the operator's order.
    pub fn entries(&self) -> &[AllowEntry] {
        &self.entries
    }

    /// Whether non-public addresses may be reached (when an entry covers the destination).
    pub fn allow_private(&self) -> bool {
        self.allow_private
    }

    /// Checks `url` before anything is sent: http or https, no credentials, a destination
    /// (host and port) an entry covers, and, for an address written in the url, that address as
    /// [`Policy::check_addr`] would check it. Returns the parsed url, which is what to request.
    ///
    /// A host name passing here is only half the check: its addresses are checked after DNS
    /// (the clients of this crate do it in their resolver).
    pub fn check_url(&self, url: &str) -> Result<Url, Refusal> {
        let parsed = Url::parse(url).map_err(|error| Refusal::Invalid(error.to_string()))?;
        if !matches!(parsed.scheme(), "http" | "https") {
            return Err(Refusal::Scheme { scheme: shown(parsed.scheme()) });
        }
        if !parsed.username().is_empty() || parsed.password().is_some() {
            return Err(Refusal::Credentials);
        }
        let port = parsed.port_or_known_default();
        let not_allowed = |host: &str, near: Vec<String>| Refusal::NotAllowed {
            destination: shown(&match port {
                Some(port) => format!("{host}:{port}"),
                None => host.to_owned(),
            }),
            near,
        };
        match parsed.host() {
            None => return Err(Refusal::NoHost),
            Some(url::Host::Domain(name)) => {
                let name = normalize_name(name).map_err(|error| Refusal::Invalid(error.to_string()))?;
                if !self.entries.iter().any(|entry| entry.covers_name(&name, port)) {
                    let near =
                        self.entries.iter().filter(|entry| entry.names(&name)).map(ToString::to_string);
                    return Err(not_allowed(&name, near.collect()));
                }
            }
            Some(url::Host::Ipv4(ip)) => {
                self.check_literal(IpAddr::V4(ip), port, |near| not_allowed(&ip.to_string(), near))?
            }
            Some(url::Host::Ipv6(ip)) => {
                self.check_literal(IpAddr::V6(ip), port, |near| not_allowed(&format!("[{ip}]"), near))?;
            }
        }
        Ok(parsed)
    }

    /// Checks `ip`, one address DNS gave for `host`, before a connection is made to it: `host`
    /// must be a name an entry covers (for some port: the port was checked with the url), and
    /// `ip` public, or let through by `allow_private` or by an address/CIDR entry for any port
    /// that lies inside `ip`'s non-public range.
    pub fn check_addr(&self, host: &str, ip: IpAddr) -> Result<(), Refusal> {
        self.check_name(host)?;
        if self.refuses_non_public(ip, None) {
            return Err(Refusal::ResolvesToNonPublic { host: shown(host) });
        }
        Ok(())
    }

    /// The addresses of `found` that [`Policy::check_addr`] lets through, in their order; when
    /// none is left, why.
    pub fn keep_allowed(
        &self,
        host: &str,
        found: impl IntoIterator<Item = IpAddr>,
    ) -> Result<Vec<IpAddr>, Refusal> {
        self.check_name(host)?;
        let mut any = false;
        let kept: Vec<IpAddr> = found
            .into_iter()
            .inspect(|_| any = true)
            .filter(|ip| self.check_addr(host, *ip).is_ok())
            .collect();
        match (kept.is_empty(), any) {
            (false, _) => Ok(kept),
            (true, true) => Err(Refusal::ResolvesToNonPublic { host: shown(host) }),
            (true, false) => Err(Refusal::Unresolved { host: shown(host) }),
        }
    }

    /// Whether a host name (as reqwest hands it to a resolver) is one an entry covers, for any
    /// port. Checked before it is looked up, so no other name is ever resolved.
    pub(crate) fn check_name(&self, host: &str) -> Result<(), Refusal> {
        let refused = |near: Vec<String>| Refusal::NotAllowed { destination: shown(host), near };
        match parse_host(host).map_err(|_| refused(Vec::new()))? {
            Parsed::Name(name) if self.entries.iter().any(|entry| entry.names(&name)) => Ok(()),
            Parsed::Name(_) => Err(refused(Vec::new())),
            // reqwest never resolves an address; one named as a host is checked as an address.
            Parsed::Ip(ip) => self.check_literal(ip, None, refused),
        }
    }

    /// An address written as a url's host: not refused for being non-public, and covered by an
    /// address/CIDR entry for `port`.
    fn check_literal(
        &self,
        ip: IpAddr,
        port: Option<u16>,
        not_allowed: impl FnOnce(Vec<String>) -> Refusal,
    ) -> Result<(), Refusal> {
        // The entries holding the address, whatever their port: when one would let it through
        // on its own port, the url missed that entry's port, and the refusal says so rather than
        // that only public addresses are reached.
        let holding: Vec<&AllowEntry> = self
            .entries
            .iter()
            .filter(|entry| {
                crate::addr::forms(ip).any(|form| entry.net().is_some_and(|net| net.contains(&form)))
            })
            .collect();
        if self.refuses_non_public(ip, port) {
            let on_their_port = |entry: &&AllowEntry| !self.refuses_non_public(ip, entry.port);
            if holding.iter().any(on_their_port) {
                return Err(not_allowed(holding.iter().map(ToString::to_string).collect()));
            }
            let what = non_public(ip).unwrap_or("non-public");
            return Err(Refusal::NonPublicAddress { address: ip, what });
        }
        let covered =
            crate::addr::forms(ip).any(|form| self.entries.iter().any(|entry| entry.covers_ip(form, port)));
        if covered { Ok(()) } else { Err(not_allowed(holding.iter().map(ToString::to_string).collect())) }
    }

    /// Whether `ip` is non-public and nothing lets it through: not `allow_private`, and no
    /// address/CIDR entry for `port` that holds it and lies inside its non-public range.
    fn refuses_non_public(&self, ip: IpAddr, port: Option<u16>) -> bool {
        if self.allow_private {
            return false;
        }
        let mut ranges = special_ranges(ip).peekable();
        if ranges.peek().is_none() {
            return false;
        }
        !ranges.any(|(form, special)| {
            self.entries.iter().any(|entry| {
                entry.covers_ip(form, port) && entry.net().is_some_and(|net| special.net.contains(net))
            })
        })
    }
}

impl fmt::Display for Policy {
    /// `allow = [...]`, `allow_private = …`: for logs at start.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let entries: Vec<String> = self.entries.iter().map(ToString::to_string).collect();
        write!(f, "allow = [{}], allow_private = {}", entries.join(", "), self.allow_private)
    }
}

/// How a not-allowed refusal names the entries the destination missed.
fn missed(near: &[String]) -> String {
    if near.is_empty() {
        String::new()
    } else {
        format!("; for this host it allows only {}", near.join(", "))
    }
}

/// "a" or "an" before `what`, one of the names of the non-public ranges.
fn article(what: &str) -> &'static str {
    // "unique-local" starts with a vowel and takes "a"; of the names, only these take "an".
    if what.starts_with("unspecified") { "an" } else { "a" }
}

/// `text`, cut at [`MAX_SHOWN`] characters.
fn shown(text: &str) -> String {
    if text.chars().count() <= MAX_SHOWN {
        text.to_owned()
    } else {
        let cut: String = text.chars().take(MAX_SHOWN).collect();
        format!("{cut}…")
    }
}
