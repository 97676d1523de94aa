//! Who may connect, and what they may do: the same users, tokens and permissions for every
//! front-end.
//!
//! - [`Authenticator`] is the hook front-ends call with what the client presented
//!   ([`Credentials`]) and where it came from; it answers with an [`Identity`] or an
//!   [`AuthError`]. [`ConfigAuth`] is the implementation over the `[auth]` section: users with
//!   argon2 password hashes, bearer tokens (stored as SHA-256 digests), groups, and failed-login
//!   throttling per (source address, user name) and across all addresses (`users.rs`). The
//!   argon2 checks run on a pool of their own, at most two at once, with memory that is reused
//!   and charged to the memory budget (`hashing.rs`).
//! - An [`Identity`] carries the user's [`Access`]: allow/deny rules on key expressions for
//!   publishing, subscribing, serving (queue-group subscriptions) and calling (publishing with a
//!   reply-to), plus the rules every client gets: `$SYS` is read-only, and each session's reply
//!   inbox is readable by that session alone (`access.rs`).
//!
//! docs/security.md is the user-facing description; keep the two in step.

use std::future::Future;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::Arc;

mod access;
mod hashing;
mod users;

pub use access::{Access, Denied, Grant, Rule, SYS_PREFIX, inbox_guard};
pub use hashing::HashStats;
pub use users::{ConfigAuth, Slot, TOKEN_PREFIX, hash_password, new_token, token_digest};

/// The address a source is counted under, by the login throttle's lanes and the listeners'
/// connection rate: an IPv4 address as it is (also when it comes IPv4-mapped, `::ffff:a.b.c.d`,
/// from a dual-stack listener), any other IPv6 address by its /64 (one host's usual allocation:
/// a guesser or a flood cannot step through it).
pub fn address_group(ip: std::net::IpAddr) -> std::net::IpAddr {
    use std::net::IpAddr;
    match ip {
        IpAddr::V4(_) => ip,
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => {
                let s = v6.segments();
                IpAddr::V6(std::net::Ipv6Addr::new(s[0], s[1], s[2], s[3], 0, 0, 0, 0))
            }
        },
    }
}

#[cfg(test)]
mod address_tests {
    use super::address_group;
    use std::net::IpAddr;

    #[test]
    fn sources_are_grouped_by_ipv4_address_or_ipv6_64() {
        let g = |s: &str| address_group(s.parse::<IpAddr>().unwrap_or_else(|e| panic!("{e}")));
        assert_eq!(g("192.0.2.7"), g("192.0.2.7"));
        assert_ne!(g("192.0.2.7"), g("192.0.2.8"));
        assert_eq!(g("::ffff:192.0.2.7"), g("192.0.2.7"));
        assert_ne!(g("::ffff:192.0.2.7"), g("::ffff:192.0.2.8"));
        assert_eq!(g("2001:db8:1:2:aaaa::1"), g("2001:db8:1:2:bbbb::2"));
        assert_ne!(g("2001:db8:1:2::1"), g("2001:db8:1:3::1"));
    }
}

/// Why a client was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuthError {
    /// No credentials, and anonymous access is off.
    NotAuthorized,
    /// Unknown user, wrong password or unknown token.
    BadCredentials,
    /// Too many failed logins lately for this user name from this address (or, past the
    /// global failure rate, any failure of the pair lately): refused without checking.
    Throttled,
    /// The password checks are saturated: refused without checking, and not counted as a
    /// failure. Try again.
    Busy,
    /// The user has `auth.max_connections_per_user` connections open already.
    TooManyConnections,
}

impl std::fmt::Display for AuthError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            AuthError::NotAuthorized => "not authorized: credentials required",
            AuthError::BadCredentials => "bad user name, password or token",
            AuthError::Throttled => {
                "too many failed logins for this user name from this address: try again later"
            }
            AuthError::Busy => "server busy: too many logins being checked: try again",
            AuthError::TooManyConnections => {
                "the user has as many connections as it may (auth.max_connections_per_user)"
            }
        })
    }
}

/// What a client presented.
#[derive(Debug, Clone, Copy, Default)]
pub struct Credentials<'a> {
    /// The user name, if any (MQTT user name, STOMP `login`, native user/password form).
    pub user: Option<&'a str>,
    /// The password, if any. A password that starts with [`TOKEN_PREFIX`] is a bearer token.
    pub password: Option<&'a [u8]>,
    /// A bearer token given as such (native HELLO token form).
    pub token: Option<&'a [u8]>,
    /// The source address (throttling); `None` for Unix sockets and in-process transports.
    pub peer: Option<IpAddr>,
    /// A user name the transport vouches for: the subject CN of a verified TLS client
    /// certificate (with `tls.cert_user`). Logs in as that user without a password.
    pub verified: Option<&'a str>,
}

/// Who a connected client is.
#[derive(Debug, Clone)]
pub struct Identity {
    /// The user; `None` for an anonymous client.
    pub user: Option<Arc<str>>,
    /// What it may do, as it is now (a config reload changes it in place).
    pub access: Arc<Grant>,
    /// The connection's place in its user's count (`auth.max_connections_per_user`): freed
    /// when the identity (the connection) goes.
    pub slot: Option<Arc<users::Slot>>,
}

impl Identity {
    /// An anonymous client with every permission (brokers without users).
    pub fn anonymous() -> Identity {
        Identity {
            user: None,
            access: Grant::all(),
            slot: None,
        }
    }

    /// The user name for logs (`-` when anonymous).
    pub fn name(&self) -> &str {
        self.user.as_deref().unwrap_or("-")
    }
}

/// The future [`Authenticator::authenticate`] returns.
pub type AuthFuture<'a> = Pin<Box<dyn Future<Output = Result<Identity, AuthError>> + Send + 'a>>;

/// Decides who may connect and what they may do.
pub trait Authenticator: Send + Sync + std::fmt::Debug + 'static {
    /// Checks what a client presented. `protocol` names the front-end (`"native"`,
    /// `"mqtt"`, `"stomp"`) for logs. Slow checks (password hashes) run off the async
    /// threads.
    fn authenticate<'a>(&'a self, protocol: &'a str, creds: Credentials<'a>) -> AuthFuture<'a>;

    /// True when clients must present credentials (no anonymous access).
    fn required(&self) -> bool;

    /// Takes a new `[auth]` section (config reload): logins from now on use it, the
    /// permissions of users still configured change in place for their connections, and
    /// what was revoked is returned (the caller closes those connections). Authenticators
    /// that cannot say so.
    fn reload(&self, _section: &crate::config::AuthSection) -> Result<Revoked, String> {
        Err("this authenticator cannot reload its users".into())
    }
}

/// Who lost access in a config reload: their connections are to be closed.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Revoked {
    /// Users removed from the configuration.
    pub users: Vec<String>,
    /// Anonymous (and open-mode, user-name-only) access ended: every connection logged in
    /// before the reload was let in that way.
    pub all: bool,
}
