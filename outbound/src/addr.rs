//! Which addresses are not public: the special-purpose ranges a request is never sent to by
//! default, and the IPv4 address an IPv6 one stands for.
//!
//! Pure. The ranges are IANA's special-purpose registries (RFC 6890 and its updates) reduced to
//! what matters for an outbound request: anything that is not a unicast address on the public
//! internet. An IPv6 address that embeds an IPv4 one (mapped `::ffff:a.b.c.d`, compatible
//! `::a.b.c.d`, NAT64 `64:ff9b::a.b.c.d`, 6to4 `2002:AABB:CCDD::`) is judged by that IPv4 address
//! too: a dual-stack socket or a translator delivers it there.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::{IpNet, Ipv4Net, Ipv6Net};

/// A non-public range and what it is, for messages ("a link-local address").
pub(crate) struct Special {
    pub net: IpNet,
    pub what: &'static str,
}

const fn v4(a: u8, b: u8, c: u8, d: u8, prefix: u8, what: &'static str) -> Special {
    Special { net: IpNet::V4(Ipv4Net::new_assert(Ipv4Addr::new(a, b, c, d), prefix)), what }
}

const fn v6(segments: [u16; 8], prefix: u8, what: &'static str) -> Special {
    let [a, b, c, d, e, f, g, h] = segments;
    Special { net: IpNet::V6(Ipv6Net::new_assert(Ipv6Addr::new(a, b, c, d, e, f, g, h), prefix)), what }
}

/// The non-public ranges, the more specific first where they overlap (the first match names it).
pub(crate) const SPECIAL: &[Special] = &[
    v4(0, 0, 0, 0, 32, "unspecified"),
    v4(0, 0, 0, 0, 8, "\"this network\""),
    v4(10, 0, 0, 0, 8, "private"),
    v4(100, 64, 0, 0, 10, "shared (carrier-grade NAT)"),
    v4(127, 0, 0, 0, 8, "loopback"),
    v4(169, 254, 0, 0, 16, "link-local"),
    v4(172, 16, 0, 0, 12, "private"),
    v4(192, 0, 0, 0, 24, "reserved"),
    v4(192, 0, 2, 0, 24, "documentation"),
    v4(192, 88, 99, 0, 24, "reserved"),
    v4(192, 168, 0, 0, 16, "private"),
    v4(198, 18, 0, 0, 15, "benchmarking"),
    v4(198, 51, 100, 0, 24, "documentation"),
    v4(203, 0, 113, 0, 24, "documentation"),
    v4(224, 0, 0, 0, 4, "multicast"),
    v4(255, 255, 255, 255, 32, "broadcast"),
    v4(240, 0, 0, 0, 4, "reserved"),
    v6([0, 0, 0, 0, 0, 0, 0, 0], 128, "unspecified"),
    v6([0, 0, 0, 0, 0, 0, 0, 1], 128, "loopback"),
    v6([0x64, 0xff9b, 1, 0, 0, 0, 0, 0], 48, "reserved"),
    v6([0x100, 0, 0, 0, 0, 0, 0, 0], 64, "reserved"),
    v6([0x2001, 2, 0, 0, 0, 0, 0, 0], 48, "benchmarking"),
    v6([0x2001, 0xdb8, 0, 0, 0, 0, 0, 0], 32, "documentation"),
    v6([0x2001, 0, 0, 0, 0, 0, 0, 0], 23, "reserved"),
    v6([0x3fff, 0, 0, 0, 0, 0, 0, 0], 20, "documentation"),
    v6([0xfc00, 0, 0, 0, 0, 0, 0, 0], 7, "unique-local"),
    v6([0xfe80, 0, 0, 0, 0, 0, 0, 0], 10, "link-local"),
    v6([0xfec0, 0, 0, 0, 0, 0, 0, 0], 10, "site-local"),
    v6([0xff00, 0, 0, 0, 0, 0, 0, 0], 8, "multicast"),
];

/// `ip` itself, then the IPv4 address it embeds, if any.
pub(crate) fn forms(ip: IpAddr) -> impl Iterator<Item = IpAddr> {
    let embedded = match ip {
        IpAddr::V4(_) => None,
        IpAddr::V6(v6) => embedded_v4(v6).map(IpAddr::V4),
    };
    std::iter::once(ip).chain(embedded)
}

/// The IPv4 address an IPv6 address stands for: mapped, compatible (deprecated, but a stack may
/// still route it), NAT64's well-known prefix, 6to4.
fn embedded_v4(ip: Ipv6Addr) -> Option<Ipv4Addr> {
    let s = ip.segments();
    let low = Ipv4Addr::new((s[6] >> 8) as u8, s[6] as u8, (s[7] >> 8) as u8, s[7] as u8);
    match s {
        [0, 0, 0, 0, 0, 0xffff, _, _] => Some(low),
        // `::` and `::1` are IPv6's own unspecified and loopback, not compatible addresses.
        [0, 0, 0, 0, 0, 0, 0, 0 | 1] => None,
        [0, 0, 0, 0, 0, 0, _, _] | [0x64, 0xff9b, 0, 0, 0, 0, _, _] => Some(low),
        [0x2002, high, next, ..] => {
            Some(Ipv4Addr::new((high >> 8) as u8, high as u8, (next >> 8) as u8, next as u8))
        }
        _ => None,
    }
}

/// The non-public ranges `ip` falls in, through any of its forms: `(form, range)`.
pub(crate) fn special_ranges(ip: IpAddr) -> impl Iterator<Item = (IpAddr, &'static Special)> {
    forms(ip).flat_map(|form| SPECIAL.iter().filter(move |s| s.net.contains(&form)).map(move |s| (form, s)))
}

/// What makes `ip` non-public ("loopback", "private", …), or `None` for a public address.
pub fn non_public(ip: IpAddr) -> Option<&'static str> {
    special_ranges(ip).next().map(|(_, special)| special.what)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `ip` → what makes it non-public (`None`: public).
    fn check(ip: &str, expected: Option<&str>) {
        let parsed: IpAddr = ip.parse().unwrap();
        assert_eq!(non_public(parsed), expected, "{ip}");
    }

    #[test]
    fn non_public_addresses_and_their_names() {
        let cases: &[(&str, Option<&str>)] = &[
            ("0.0.0.0", Some("unspecified")),
            ("0.1.2.3", Some("\"this network\"")),
            ("10.0.0.1", Some("private")),
            ("172.16.0.1", Some("private")),
            ("172.31.255.255", Some("private")),
            ("172.32.0.1", None),
            ("192.168.1.1", Some("private")),
            ("100.64.0.1", Some("shared (carrier-grade NAT)")),
            ("100.127.255.255", Some("shared (carrier-grade NAT)")),
            ("100.128.0.1", None),
            ("127.0.0.1", Some("loopback")),
            ("127.255.0.9", Some("loopback")),
            ("169.254.169.254", Some("link-local")),
            ("192.0.0.8", Some("reserved")),
            ("192.0.2.1", Some("documentation")),
            ("198.51.100.7", Some("documentation")),
            ("203.0.113.9", Some("documentation")),
            ("198.18.0.1", Some("benchmarking")),
            ("224.0.0.1", Some("multicast")),
            ("239.255.255.250", Some("multicast")),
            ("255.255.255.255", Some("broadcast")),
            ("240.0.0.1", Some("reserved")),
            ("8.8.8.8", None),
            ("93.184.215.14", None),
            ("::", Some("unspecified")),
            ("::1", Some("loopback")),
            ("fe80::1", Some("link-local")),
            ("febf::1", Some("link-local")),
            ("fec0::1", Some("site-local")),
            ("fc00::1", Some("unique-local")),
            ("fd12:3456::1", Some("unique-local")),
            ("ff02::1", Some("multicast")),
            ("2001:db8::1", Some("documentation")),
            ("3fff::1", Some("documentation")),
            ("100::1", Some("reserved")),
            ("64:ff9b:1::1", Some("reserved")),
            ("2606:4700::1111", None),
            ("2001:4860:4860::8888", None),
            // IPv4 inside IPv6: judged by the IPv4 address.
            ("::ffff:127.0.0.1", Some("loopback")),
            ("::ffff:169.254.169.254", Some("link-local")),
            ("::ffff:10.0.0.1", Some("private")),
            ("::ffff:8.8.8.8", None),
            ("::127.0.0.1", Some("loopback")),
            ("::10.1.2.3", Some("private")),
            ("::8.8.8.8", None),
            ("64:ff9b::127.0.0.1", Some("loopback")),
            ("64:ff9b::a9fe:a9fe", Some("link-local")),
            ("64:ff9b::8.8.8.8", None),
            ("2002:7f00:1::", Some("loopback")),
            ("2002:a9fe:a9fe::1", Some("link-local")),
            ("2002:808:808::1", None),
        ];
        for (ip, expected) in cases {
            check(ip, *expected);
        }
    }

    #[test]
    fn the_ranges_are_well_formed() {
        for special in SPECIAL {
            assert_eq!(special.net, special.net.trunc(), "{} has host bits set", special.net);
        }
    }
}
