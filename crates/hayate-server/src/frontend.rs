//! The front-end layer: one connection driver for every protocol.
//!
//! A protocol front-end (native, MQTT, STOMP) is a [`Handler`]: it decodes frames, handles
//! them against its broker [`Session`] and says when its timers are due. The driver owns the
//! lifecycle they share: attach the session's outbox to the transport and run its writer
//! task ([`attach`]), decode and handle *every* complete frame of a read before reading again,
//! flush what the read produced from this task ([`Session::flush`]), then wait for the next
//! read, the handler's timer, an outside event (an MQTT session takeover), the writer's end
//! or shutdown ([`drive`]); and at the end let the writer flush and stop ([`close`]).
//! Each protocol's own code is its handshake, its frame handling and its translation.

/// A connection's subscriptions as its protocol names them (an MQTT filter, a STOMP
/// subscription id), each with the broker subscription id it was given. Set the protocol's
/// options for a subscription before `Session::subscribe` (a delivery may arrive as soon as
/// the broker knows it), bind the name after it succeeded.
#[derive(Debug, Default)]
pub(crate) struct SubTable {
    ids: std::collections::HashMap<String, u32>,
    next: u32,
}

impl SubTable {
    /// The broker subscription id of `name`.
    pub(crate) fn get(&self, name: &str) -> Option<u32> {
        self.ids.get(name).copied()
    }

    /// Whether `name` is subscribed.
    pub(crate) fn contains(&self, name: &str) -> bool {
        self.ids.contains_key(name)
    }

    /// A broker subscription id not used yet on this connection.
    pub(crate) fn next_sid(&mut self) -> u32 {
        self.next = self.next.max(1);
        let sid = self.next;
        self.next += 1;
        sid
    }

    /// Binds `name` to `sid` (a restored subscription may bring its own id).
    pub(crate) fn bind(&mut self, name: String, sid: u32) {
        self.next = self.next.max(sid.saturating_add(1));
        self.ids.insert(name, sid);
    }

    /// Unbinds `name`; returns its broker subscription id.
    pub(crate) fn remove(&mut self, name: &str) -> Option<u32> {
        self.ids.remove(name)
    }
}

pub use hayate_io::conn::Accepted;
pub(crate) use hayate_io::conn::{Conn, Handler, Stop};
