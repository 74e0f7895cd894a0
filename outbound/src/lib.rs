//! Outbound requests (webhooks, remote verifiers, judges) go only to the destinations the operator
//! allows, without redirects (design.md §8).
//!
//! A job spec names urls the daemon or a plugin will call. Left alone, such a url reaches the
//! cloud's metadata service (`169.254.169.254`), the daemon's own API, a database on the private
//! network, or a local file (`file:`). This crate is the one place that decides where a request
//! may go:
//!
//! - [`Policy`] (pure): the operator's allow-list and `allow_private`, from plain data
//!   ([`Policy::new`]), so the daemon and a plugin that receives the same two fields build the
//!   same policy. [`Policy::check_url`] runs before a request is made (http or https, no
//!   credentials, a destination an entry covers, an address written in the url checked as an
//!   address); [`Policy::check_addr`] runs on every address DNS gives for an allowed host name,
//!   so a name that resolves to a private address is refused too. Private, loopback, link-local
//!   and other non-public addresses (IPv6 forms of IPv4 ones included) are refused unless the
//!   operator says otherwise.
//! - [`Client`] and [`blocking::Client`] (the reqwest edge): every request goes through
//!   `check_url`, names are resolved by a resolver that applies `check_addr` to what it finds,
//!   redirects are never followed and no proxy is used. reqwest resolves only host names, never
//!   an address written in the url; the clients therefore make requests only through methods that
//!   check the url first, and never hand out the reqwest client inside.
//!
//! A [`Refusal`] says why in words a tenant can act on, about the tenant's own url only.
//!
//! Files: `policy.rs` (**pure**: [`Policy`], `check_url`, `check_addr`), `entry.rs` (**pure**: one
//! allow-list entry), `addr.rs` (**pure**: which addresses are not public), `client.rs` (the
//! reqwest edge).
//!
//! ```
//! use rlvr_outbound::{Policy, Refusal};
//!
//! let allow = vec!["hooks.example.com".to_owned(), "127.0.0.1/32".to_owned()];
//! let policy = Policy::new(&allow, false).unwrap();
//! assert!(policy.check_url("https://hooks.example.com/published").is_ok());
//! assert!(policy.check_url("http://127.0.0.1:8080/").is_ok());
//! assert!(matches!(policy.check_url("file:///etc/passwd"), Err(Refusal::Scheme { .. })));
//! assert!(matches!(
//!     policy.check_url("http://169.254.169.254/latest/meta-data"),
//!     Err(Refusal::NonPublicAddress { .. })
//! ));
//! ```

mod addr;
mod client;
mod entry;
mod policy;
#[cfg(test)]
mod tests;

pub use addr::non_public;
pub use client::{BuildError, Client, blocking, describe, refusal_of};
pub use entry::{AllowEntry, ENTRY_FORMS, EntryError};
pub use policy::{Policy, PolicyError, Refusal};
