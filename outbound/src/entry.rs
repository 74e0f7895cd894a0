//! One entry of the operator's allow-list: a host, a host's subdomains, an address or a network,
//! with or without a port.
//!
//! Pure. Host names are normalized as a url's host is (IDNA to ASCII, lowercase, no trailing
//! dot), so an entry and a url's host compare as the same text; an IPv4 written the WHATWG ways
//! (`0x7f000001`, `2130706433`) is the address it means, here as in a url.

use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;

use ipnet::IpNet;

/// What an allow-list entry may be, for messages.
pub const ENTRY_FORMS: &str =
    "a host, host:port, *.domain (its subdomains), an IP address, IP:port or a CIDR like 10.1.0.0/16";

/// One parsed allow-list entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AllowEntry {
    pub(crate) target: Target,
    /// `None`: any port.
    pub(crate) port: Option<u16>,
}

/// What an entry names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Target {
    /// This host name exactly.
    Host(String),
    /// Every host under this domain, not the domain itself (`*.example.com`).
    Subdomains(String),
    /// An address (a full-length prefix) or a network.
    Net(IpNet),
}

/// Why an allow-list entry was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EntryError {
    /// Nothing, or only whitespace.
    #[error("an empty entry")]
    Empty,
    /// Whitespace inside.
    #[error("whitespace inside an entry")]
    Whitespace,
    /// A whole url: `https://hooks.example.com/x`.
    #[error("a url, not a destination: write its host (and port) alone")]
    Url,
    /// `/` with something that is not a network.
    #[error("not a CIDR network: {0}")]
    Cidr(String),
    /// A CIDR with `:port`.
    #[error("a CIDR network takes no port")]
    CidrPort,
    /// `:` followed by something other than 1 to 65535.
    #[error("the port must be a number from 1 to 65535")]
    Port,
    /// `*` anywhere but a leading `*.`.
    #[error("a wildcard is only allowed as a leading \"*.\" (subdomains of a domain)")]
    Wildcard,
    /// `*.` before an address.
    #[error("\"*.\" goes before a domain name, not an address")]
    WildcardAddress,
    /// Not a host name or address a url could hold.
    #[error("not a valid host: {0}")]
    Host(String),
}

impl AllowEntry {
    /// Whether the entry names `host` (normalized), exactly or as a subdomain, for whatever port.
    pub(crate) fn names(&self, host: &str) -> bool {
        match &self.target {
            Target::Host(name) => name == host,
            Target::Subdomains(domain) => host
                .strip_suffix(domain.as_str())
                .is_some_and(|label| label.len() > 1 && label.ends_with('.')),
            Target::Net(_) => false,
        }
    }

    /// Whether the entry names `host` (normalized) for `port`.
    pub(crate) fn covers_name(&self, host: &str, port: Option<u16>) -> bool {
        self.names(host) && self.port_matches(port)
    }

    /// Whether the entry is an address or network holding `ip`.
    pub(crate) fn covers_ip(&self, ip: IpAddr, port: Option<u16>) -> bool {
        matches!(&self.target, Target::Net(net) if net.contains(&ip)) && self.port_matches(port)
    }

    /// The network of an address or CIDR entry.
    pub(crate) fn net(&self) -> Option<&IpNet> {
        match &self.target {
            Target::Net(net) => Some(net),
            Target::Host(_) | Target::Subdomains(_) => None,
        }
    }

    /// `port`: the request's, or `None` where it is not known (after DNS), which only an entry
    /// for any port matches.
    pub(crate) fn port_matches(&self, port: Option<u16>) -> bool {
        match (self.port, port) {
            (None, _) => true,
            (Some(wanted), Some(port)) => wanted == port,
            (Some(_), None) => false,
        }
    }
}

impl FromStr for AllowEntry {
    type Err = EntryError;

    fn from_str(entry: &str) -> Result<Self, Self::Err> {
        if entry.trim().is_empty() {
            return Err(EntryError::Empty);
        }
        if entry.contains(char::is_whitespace) {
            return Err(EntryError::Whitespace);
        }
        if entry.contains("://") {
            return Err(EntryError::Url);
        }
        if let Some((_, prefix)) = entry.split_once('/') {
            if prefix.contains(':') {
                return Err(EntryError::CidrPort);
            }
            let net = entry.parse::<IpNet>().map_err(|error| EntryError::Cidr(error.to_string()))?;
            return Ok(AllowEntry { target: Target::Net(net), port: None });
        }
        let (host, port) = split_port(entry)?;
        let (wildcard, host) = match host.strip_prefix("*.") {
            Some(domain) => (true, domain),
            None => (false, host),
        };
        if host.contains('*') {
            return Err(EntryError::Wildcard);
        }
        let target = match parse_host(host)? {
            Parsed::Name(name) if wildcard => Target::Subdomains(name),
            Parsed::Name(name) => Target::Host(name),
            Parsed::Ip(_) if wildcard => return Err(EntryError::WildcardAddress),
            Parsed::Ip(ip) => Target::Net(IpNet::from(ip)),
        };
        Ok(AllowEntry { target, port })
    }
}

impl fmt::Display for AllowEntry {
    /// The entry as it matches: normalized, an address's `/32` or `/128` left out.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let host = match &self.target {
            Target::Host(name) => name.clone(),
            Target::Subdomains(domain) => format!("*.{domain}"),
            Target::Net(net) if net.prefix_len() == net.max_prefix_len() => match net.addr() {
                IpAddr::V6(ip) if self.port.is_some() => format!("[{ip}]"),
                ip => ip.to_string(),
            },
            Target::Net(net) => net.to_string(),
        };
        match self.port {
            Some(port) => write!(f, "{host}:{port}"),
            None => f.write_str(&host),
        }
    }
}

/// `host:port`, `[v6]:port`, `[v6]`, a bare IPv6 (several `:`), or a host alone.
fn split_port(entry: &str) -> Result<(&str, Option<u16>), EntryError> {
    let (host, port) = if entry.starts_with('[') {
        match entry.split_once(']') {
            Some((v6, "")) => (&entry[..=v6.len()], None),
            Some((v6, rest)) => match rest.strip_prefix(':') {
                Some(port) => (&entry[..=v6.len()], Some(port)),
                None => return Err(EntryError::Host("expected \":port\" after \"]\"".to_owned())),
            },
            None => return Err(EntryError::Host("a \"[\" without its \"]\"".to_owned())),
        }
    } else if entry.matches(':').count() == 1 {
        let (host, port) = entry.split_once(':').unwrap_or((entry, ""));
        (host, Some(port))
    } else {
        (entry, None)
    };
    let port = match port {
        None => None,
        Some(text) => match text.parse::<u16>() {
            Ok(port) if port > 0 && text.bytes().all(|b| b.is_ascii_digit()) => Some(port),
            _ => return Err(EntryError::Port),
        },
    };
    Ok((host, port))
}

/// A host as a url's parser sees it.
pub(crate) enum Parsed {
    /// Lowercase ASCII (IDNA), without a trailing dot.
    Name(String),
    Ip(IpAddr),
}

/// Parses a host the way a url's host is parsed, so that an entry and a url agree on it.
pub(crate) fn parse_host(host: &str) -> Result<Parsed, EntryError> {
    // A bare IPv6 (no brackets) is no url host, but is how an operator writes one.
    if host.contains(':') && !host.starts_with('[') {
        return host
            .parse::<IpAddr>()
            .map(Parsed::Ip)
            .map_err(|_| EntryError::Host("not a host name or an IP address".to_owned()));
    }
    match url::Host::parse(host) {
        Ok(url::Host::Domain(name)) => normalize_name(&name).map(Parsed::Name),
        Ok(url::Host::Ipv4(ip)) => Ok(Parsed::Ip(IpAddr::V4(ip))),
        Ok(url::Host::Ipv6(ip)) => Ok(Parsed::Ip(IpAddr::V6(ip))),
        Err(error) => Err(EntryError::Host(error.to_string())),
    }
}

/// A url's domain as entries hold it: without the trailing dot of a fully qualified name.
pub(crate) fn normalize_name(name: &str) -> Result<String, EntryError> {
    let name = name.strip_suffix('.').unwrap_or(name);
    if name.is_empty() || name.starts_with('.') || name.contains("..") {
        return Err(EntryError::Host("an empty label".to_owned()));
    }
    Ok(name.to_ascii_lowercase())
}
