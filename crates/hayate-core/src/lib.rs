//! Hayate's core model, shared by every front-end, the broker and the clients.
//!
//! # Layout
//! - [`key`]: [`Key`] (a concrete `/`-separated name) and [`KeyExpr`] (what a subscription
//!   selects: `*` is one segment, `**` is zero or more) with matching.
//! - [`message`]: [`Message`] (key, payload as [`bytes::Bytes`], headers, reply-to,
//!   correlation id).
//! - [`qos`]: [`Qos`] (reliability and congestion behaviour of a subscription).
//! - [`route`]: the route table (subscriptions by key expression in a trie, queue groups and
//!   their round-robin turn, routes cached per key), generic over what a subscription leads
//!   to: the broker's and peer nodes' one router.
//! - [`sync`]: [`sync::lock`], a `Mutex` lock that ignores poisoning.
//!
//! Nothing here does I/O or knows about a protocol: MQTT, STOMP and the native protocol all
//! translate into these types.

pub mod key;
pub mod message;
pub mod qos;
pub mod route;
pub mod sync;

pub use key::{Key, KeyError, KeyExpr};
pub use message::{Attrs, COMPACT_PAYLOAD_MAX, Guarantee, Headers, Message};
pub use qos::{Congestion, Qos, Reliability, Stall};

/// The prefix of per-session reply inboxes: `_inbox/<session-id>/...`.
pub const INBOX_PREFIX: &str = "_inbox";

/// Is `key` `prefix` itself or under it (`prefix/...`)? Segment-wise: `_inboxes` is not
/// under `_inbox`.
pub fn is_under(key: &str, prefix: &str) -> bool {
    key.strip_prefix(prefix)
        .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
}

/// Is `key` a reply inbox key (under `_inbox/`)?
pub fn is_inbox_key(key: &str) -> bool {
    key.len() > INBOX_PREFIX.len() && is_under(key, INBOX_PREFIX)
}
