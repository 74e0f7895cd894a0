//! The policy's checks, case by case: allow-list entries, urls before a request, addresses after
//! DNS.

use std::net::IpAddr;

use super::*;

fn policy(allow: &[&str], allow_private: bool) -> Policy {
    let allow: Vec<String> = allow.iter().map(|entry| (*entry).to_owned()).collect();
    Policy::new(&allow, allow_private).unwrap()
}

/// What a check answered, as text: `allowed`, or the refusal's message.
fn answer<T>(result: Result<T, Refusal>) -> String {
    match result {
        Ok(_) => "allowed".to_owned(),
        Err(refusal) => refusal.to_string(),
    }
}

/// Under the policy `(allow, allow_private)`, each `(url, expected)`: `allowed` or the refusal.
fn check(allow: &[&str], allow_private: bool, cases: &[(&str, &str)]) {
    let policy = policy(allow, allow_private);
    for (url, expected) in cases {
        assert_eq!(answer(policy.check_url(url)), *expected, "{url} under {policy}");
    }
}

/// Under the policy, each `(host, address, expected)` after DNS.
fn check_addr(allow: &[&str], allow_private: bool, cases: &[(&str, &str, &str)]) {
    let policy = policy(allow, allow_private);
    for (host, ip, expected) in cases {
        let ip: IpAddr = ip.parse().unwrap();
        assert_eq!(answer(policy.check_addr(host, ip)), *expected, "{host} at {ip} under {policy}");
    }
}

const NOT_LISTED: &str = "destination not in the operator's outbound allow-list";

fn not_listed(destination: &str) -> String {
    format!("{destination}: {NOT_LISTED}")
}

/// A destination whose host an entry lists for another port.
fn missed(destination: &str, entries: &str) -> String {
    format!("{}; for this host it allows only {entries}", not_listed(destination))
}

fn non_public(address: &str, what: &str) -> String {
    let article = if what == "unspecified" { "an" } else { "a" };
    format!("{address} is {article} {what} address; outbound requests go only to public addresses")
}

fn resolves_non_public(host: &str) -> String {
    format!(
        "{host} resolves to a non-public address (private, loopback, link-local or reserved); outbound \
         requests go only to public addresses"
    )
}

#[test]
fn allow_list_entries_parse_or_say_why() {
    let cases: &[(&str, Result<&str, &str>)] = &[
        ("hooks.example.com", Ok("hooks.example.com")),
        ("Hooks.Example.COM.", Ok("hooks.example.com")),
        ("hooks.example.com:8443", Ok("hooks.example.com:8443")),
        ("*.example.com", Ok("*.example.com")),
        ("*.example.com:443", Ok("*.example.com:443")),
        ("bücher.example", Ok("xn--bcher-kva.example")),
        ("localhost", Ok("localhost")),
        ("203.0.113.5", Ok("203.0.113.5")),
        ("127.0.0.1:9000", Ok("127.0.0.1:9000")),
        ("0x7f000001", Ok("127.0.0.1")),
        ("::1", Ok("::1")),
        ("[::1]", Ok("::1")),
        ("[::1]:8080", Ok("[::1]:8080")),
        ("10.1.0.0/16", Ok("10.1.0.0/16")),
        ("127.0.0.1/32", Ok("127.0.0.1")),
        ("fd00::/8", Ok("fd00::/8")),
        ("0.0.0.0/0", Ok("0.0.0.0/0")),
        ("", Err("an empty entry")),
        ("  ", Err("an empty entry")),
        ("hooks example.com", Err("whitespace inside an entry")),
        ("https://hooks.example.com/x", Err("a url, not a destination: write its host (and port) alone")),
        ("10.0.0.0/33", Err("not a CIDR network: invalid IP address syntax")),
        ("example.com/24", Err("not a CIDR network: invalid IP address syntax")),
        ("10.0.0.0/8:80", Err("a CIDR network takes no port")),
        ("example.com:0", Err("the port must be a number from 1 to 65535")),
        ("example.com:65536", Err("the port must be a number from 1 to 65535")),
        ("example.com:+80", Err("the port must be a number from 1 to 65535")),
        ("example.com:", Err("the port must be a number from 1 to 65535")),
        ("*", Err("a wildcard is only allowed as a leading \"*.\" (subdomains of a domain)")),
        ("a.*.example.com", Err("a wildcard is only allowed as a leading \"*.\" (subdomains of a domain)")),
        ("*.*.example.com", Err("a wildcard is only allowed as a leading \"*.\" (subdomains of a domain)")),
        ("*.10.0.0.1", Err("\"*.\" goes before a domain name, not an address")),
        ("exa<mple.com", Err("not a valid host: invalid international domain name")),
        ("[::1", Err("not a valid host: a \"[\" without its \"]\"")),
        ("[::1]x", Err("not a valid host: expected \":port\" after \"]\"")),
        ("1:2:3", Err("not a valid host: not a host name or an IP address")),
        ("example..com", Err("not a valid host: an empty label")),
        (".", Err("not a valid host: an empty label")),
    ];
    for (entry, expected) in cases {
        let parsed =
            entry.parse::<AllowEntry>().map(|entry| entry.to_string()).map_err(|error| error.to_string());
        let expected = expected.map(str::to_owned).map_err(str::to_owned);
        assert_eq!(parsed, expected, "{entry:?}");
    }
}

#[test]
fn every_bad_entry_is_reported_with_its_index() {
    let allow: Vec<String> = ["ok.example.com", "", "http://x", "10.0.0.0/8"].map(str::to_owned).to_vec();
    let error = Policy::new(&allow, false).unwrap_err();
    let indexes: Vec<usize> = error.problems.iter().map(|(i, _, _)| *i).collect();
    assert_eq!(indexes, [1, 2]);
    assert_eq!(
        error.to_string(),
        "allow[1] : an empty entry; allow[2] http://x: a url, not a destination: write its host (and port) alone"
    );
}

#[test]
fn only_http_and_https_without_credentials() {
    let allow = &["hooks.example.com"];
    check(
        allow,
        false,
        &[
            ("https://hooks.example.com/published", "allowed"),
            ("http://hooks.example.com/published?x=1#y", "allowed"),
            ("HTTPS://HOOKS.EXAMPLE.COM/", "allowed"),
            ("file:///etc/passwd", "file: urls are not allowed; expected http or https"),
            ("gopher://hooks.example.com:70/_stats", "gopher: urls are not allowed; expected http or https"),
            ("ftp://hooks.example.com/", "ftp: urls are not allowed; expected http or https"),
            ("ws://hooks.example.com/", "ws: urls are not allowed; expected http or https"),
            ("unix:///run/rlvr.sock", "unix: urls are not allowed; expected http or https"),
            ("data:text/plain,hi", "data: urls are not allowed; expected http or https"),
            ("http://user:pw@hooks.example.com/", "a user name or password in the url is not allowed"),
            ("http://user@hooks.example.com/", "a user name or password in the url is not allowed"),
            ("http://:pw@hooks.example.com/", "a user name or password in the url is not allowed"),
            ("hooks.example.com/published", "not a valid url: relative URL without a base"),
            ("", "not a valid url: relative URL without a base"),
            ("http://", "not a valid url: empty host"),
            ("http://hooks.example.com:99999/", "not a valid url: invalid port number"),
            ("http://[::1/", "not a valid url: invalid IPv6 address"),
        ],
    );
}

#[test]
fn hosts_ports_and_subdomains() {
    let allow =
        &["hooks.example.com", "grader.example.org:8443", "*.judges.example.net", "*.tls.example.net:443"];
    check(
        allow,
        false,
        &[
            ("http://hooks.example.com:8080/any/port", "allowed"),
            ("https://hooks.example.com./fqdn", "allowed"),
            ("https://grader.example.org:8443/verify", "allowed"),
            // Listed for another port: the refusal names the entry the url missed.
            (
                "https://grader.example.org/verify",
                &missed("grader.example.org:443", "grader.example.org:8443"),
            ),
            (
                "http://grader.example.org:8080/",
                &missed("grader.example.org:8080", "grader.example.org:8443"),
            ),
            ("https://a.judges.example.net/", "allowed"),
            ("https://a.b.judges.example.net:9000/", "allowed"),
            ("https://judges.example.net/", &not_listed("judges.example.net:443")),
            ("https://evil-judges.example.net/", &not_listed("evil-judges.example.net:443")),
            ("https://judges.example.net.evil.com/", &not_listed("judges.example.net.evil.com:443")),
            ("https://x.tls.example.net/", "allowed"),
            ("http://x.tls.example.net/", &missed("x.tls.example.net:80", "*.tls.example.net:443")),
            ("https://hooks.example.com.evil.com/", &not_listed("hooks.example.com.evil.com:443")),
            ("https://sub.hooks.example.com/", &not_listed("sub.hooks.example.com:443")),
            ("https://example.com/", &not_listed("example.com:443")),
            ("http://localhost/", &not_listed("localhost:80")),
            ("http://localhost:8470/v1/jobs", &not_listed("localhost:8470")),
            ("http://8.8.8.8/", &not_listed("8.8.8.8:80")),
            ("http://[2606:4700::1111]/", &not_listed("[2606:4700::1111]:80")),
        ],
    );
}

#[test]
fn an_empty_allow_list_allows_nothing() {
    for allow_private in [false, true] {
        check(
            &[],
            allow_private,
            &[
                ("https://hooks.example.com/", &not_listed("hooks.example.com:443")),
                ("http://8.8.8.8/", &not_listed("8.8.8.8:80")),
            ],
        );
    }
    let deny = Policy::deny_all();
    assert_eq!(answer(deny.check_url("https://a.example.com/")), not_listed("a.example.com:443"));
}

#[test]
fn non_public_addresses_in_urls_are_refused() {
    // A list that would let almost anything through by name: the address is what is refused.
    let allow = &["hooks.example.com", "0.0.0.0/0", "::/0"];
    check(
        allow,
        false,
        &[
            ("http://169.254.169.254/latest/meta-data", &non_public("169.254.169.254", "link-local")),
            ("http://127.0.0.1:8470/v1/jobs", &non_public("127.0.0.1", "loopback")),
            ("http://127.1/", &non_public("127.0.0.1", "loopback")),
            ("http://0x7f000001/", &non_public("127.0.0.1", "loopback")),
            ("http://2130706433/", &non_public("127.0.0.1", "loopback")),
            ("http://0177.0.0.1/", &non_public("127.0.0.1", "loopback")),
            ("http://127.0.0.1./", &non_public("127.0.0.1", "loopback")),
            ("http://0/", "0.0.0.0 is an unspecified address; outbound requests go only to public addresses"),
            ("http://10.0.0.5/", &non_public("10.0.0.5", "private")),
            ("http://192.168.1.1/", &non_public("192.168.1.1", "private")),
            ("http://100.64.0.1/", &non_public("100.64.0.1", "shared (carrier-grade NAT)")),
            ("http://255.255.255.255/", &non_public("255.255.255.255", "broadcast")),
            ("http://224.0.0.1/", &non_public("224.0.0.1", "multicast")),
            ("http://192.0.2.1/", &non_public("192.0.2.1", "documentation")),
            ("http://[::1]:8470/", &non_public("::1", "loopback")),
            ("http://[::]/", &non_public("::", "unspecified")),
            ("http://[fe80::1]/", &non_public("fe80::1", "link-local")),
            ("http://[fd00::1]/", &non_public("fd00::1", "unique-local")),
            ("http://[::ffff:127.0.0.1]/", &non_public("::ffff:127.0.0.1", "loopback")),
            ("http://[::ffff:7f00:1]/", &non_public("::ffff:127.0.0.1", "loopback")),
            ("http://[::ffff:169.254.169.254]/", &non_public("::ffff:169.254.169.254", "link-local")),
            ("http://[::127.0.0.1]/", &non_public("::7f00:1", "loopback")),
            ("http://[64:ff9b::a9fe:a9fe]/", &non_public("64:ff9b::a9fe:a9fe", "link-local")),
            ("http://[2002:7f00:1::]/", &non_public("2002:7f00:1::", "loopback")),
            ("http://8.8.8.8/", "allowed"),
            ("http://[2606:4700::1111]/", "allowed"),
            ("http://[::ffff:8.8.8.8]/", "allowed"),
        ],
    );
}

#[test]
fn an_address_entry_inside_a_non_public_range_lets_it_through() {
    let allow = &["127.0.0.1/32", "10.1.0.0/16", "[fd00::5]:9000", "169.254.169.254:80"];
    check(
        allow,
        false,
        &[
            ("http://127.0.0.1:8470/v1/jobs", "allowed"),
            ("http://0x7f000001:8470/", "allowed"),
            ("http://127.0.0.2/", &non_public("127.0.0.2", "loopback")),
            ("http://10.1.2.3/", "allowed"),
            ("http://10.2.0.1/", &non_public("10.2.0.1", "private")),
            ("http://[fd00::5]:9000/", "allowed"),
            // The address is listed for another port: the refusal names the entry it missed.
            (
                "http://[fd00::5]:9001/",
                &format!("{}; for this host it allows only [fd00::5]:9000", not_listed("[fd00::5]:9001")),
            ),
            // The operator's own choice, however unwise.
            ("http://169.254.169.254/latest", "allowed"),
            (
                "http://169.254.169.254:8080/latest",
                &format!(
                    "{}; for this host it allows only 169.254.169.254:80",
                    not_listed("169.254.169.254:8080")
                ),
            ),
            // Mapped forms of an allowed address are that address.
            ("http://[::ffff:127.0.0.1]/", "allowed"),
            ("http://[::1]/", &non_public("::1", "loopback")),
            ("http://8.8.8.8/", &not_listed("8.8.8.8:80")),
        ],
    );
}

#[test]
fn allow_private_opens_listed_non_public_destinations_only() {
    let allow = &["grader.internal", "10.0.0.0/8"];
    check(
        allow,
        true,
        &[
            ("http://10.9.8.7:5000/", "allowed"),
            ("http://grader.internal/", "allowed"),
            ("http://192.168.1.1/", &not_listed("192.168.1.1:80")),
            ("http://127.0.0.1/", &not_listed("127.0.0.1:80")),
            ("http://other.internal/", &not_listed("other.internal:80")),
        ],
    );
}

#[test]
fn addresses_after_dns() {
    let allow =
        &["hooks.example.com", "*.corp.example", "grader.example.org:8443", "127.0.0.1/32", "10.1.0.1:80"];
    check_addr(
        allow,
        false,
        &[
            ("hooks.example.com", "93.184.215.14", "allowed"),
            ("hooks.example.com", "2606:4700::1111", "allowed"),
            ("HOOKS.example.com.", "93.184.215.14", "allowed"),
            ("grader.example.org", "93.184.215.14", "allowed"),
            ("a.corp.example", "93.184.215.14", "allowed"),
            // A listed name that resolves to a non-public address (DNS rebinding, a stale record,
            // an internal name) is refused: the name was allowed, the address is not.
            ("hooks.example.com", "169.254.169.254", &resolves_non_public("hooks.example.com")),
            ("hooks.example.com", "10.0.0.1", &resolves_non_public("hooks.example.com")),
            ("hooks.example.com", "::1", &resolves_non_public("hooks.example.com")),
            ("hooks.example.com", "::ffff:10.0.0.1", &resolves_non_public("hooks.example.com")),
            ("hooks.example.com", "64:ff9b::a9fe:a9fe", &resolves_non_public("hooks.example.com")),
            ("hooks.example.com", "fe80::1", &resolves_non_public("hooks.example.com")),
            // An address entry for any port covers the address whatever name led to it...
            ("hooks.example.com", "127.0.0.1", "allowed"),
            ("hooks.example.com", "::ffff:127.0.0.1", "allowed"),
            // ...one for a port only does not: the port of a name's request is the name's.
            ("hooks.example.com", "10.1.0.1", &resolves_non_public("hooks.example.com")),
            // A name no entry covers is refused before its addresses matter.
            ("evil.example.com", "93.184.215.14", &not_listed("evil.example.com")),
            ("corp.example", "93.184.215.14", &not_listed("corp.example")),
        ],
    );
    check_addr(
        &["localhost", "hooks.example.com"],
        true,
        &[("localhost", "127.0.0.1", "allowed"), ("hooks.example.com", "10.0.0.1", "allowed")],
    );
    check_addr(&["localhost"], false, &[("localhost", "127.0.0.1", &resolves_non_public("localhost"))]);
}

#[test]
fn refused_addresses_are_dropped_from_what_dns_found() {
    let policy = policy(&["hooks.example.com"], false);
    let ips = |list: &[&str]| list.iter().map(|ip| ip.parse::<IpAddr>().unwrap()).collect::<Vec<_>>();
    let kept = policy.keep_allowed("hooks.example.com", ips(&["127.0.0.1", "93.184.215.14", "10.0.0.1"]));
    assert_eq!(kept, Ok(ips(&["93.184.215.14"])));
    let kept = policy.keep_allowed("hooks.example.com", ips(&["127.0.0.1", "::1"]));
    assert_eq!(answer(kept), resolves_non_public("hooks.example.com"));
    let kept = policy.keep_allowed("hooks.example.com", Vec::new());
    assert_eq!(answer(kept), "hooks.example.com resolves to no address");
    let kept = policy.keep_allowed("other.example.com", ips(&["93.184.215.14"]));
    assert_eq!(answer(kept), not_listed("other.example.com"));
}

#[test]
fn refusals_quote_at_most_a_little_of_the_url() {
    let policy = policy(&["hooks.example.com"], false);
    let long = format!("https://{}.example.com/", "a".repeat(5000));
    let message = answer(policy.check_url(&long));
    assert!(message.chars().count() < 200, "{message}");
    assert!(message.ends_with(NOT_LISTED), "{message}");
}

#[test]
fn never_panics_on_odd_urls_and_entries() {
    let policy = policy(&["hooks.example.com", "127.0.0.1/32", "*.example.org"], false);
    let pieces = [
        "http://",
        "https://",
        "[",
        "]",
        ":",
        "@",
        "%",
        "%00",
        "/",
        "\\",
        "#",
        "?",
        "*.",
        "0x",
        "é",
        "\u{0}",
        ".",
        "::ffff:",
        "99999999999",
    ];
    let mut state = 0x2545_f491_4f6c_dd1d_u64;
    let mut next = |bound: usize| {
        // xorshift: enough to mix the pieces; the point is coverage, not randomness.
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state % bound as u64) as usize
    };
    for _ in 0..5000 {
        let text: String = (0..1 + next(6)).map(|_| pieces[next(pieces.len())]).collect();
        let _ = policy.check_url(&text);
        let _ = text.parse::<AllowEntry>();
        let _ = policy.check_addr(&text, "127.0.0.1".parse().unwrap());
    }
}
