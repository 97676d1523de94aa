//! The live connections of a server, for the admin API: who is connected, over what, as
//! whom, how much is queued for them; and a way to end one.
//!
//! The accept loop registers every accepted connection ([`ConnRegistry::register`]) and hands
//! the [`ConnGuard`] to the protocol's `serve`, which fills in what it learns (the user once
//! authenticated, the session once opened: [`ConnEntry::set_user`], [`ConnEntry::attach`]).
//! Dropping the guard (the connection's task ending) removes the entry.
//!
//! Lock: the registry's map, and each entry's fields, are leaves: nothing else is taken while
//! one is held, and no entry lock is taken under the map's.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use hayate_core::sync::lock;

use crate::traffic::Totals;

/// What the registry sees of a connection's session (implemented by the broker's outbox).
pub trait SessionView: Send + Sync {
    /// Bytes queued for the client and not yet written.
    fn queued_bytes(&self) -> usize;
    /// The session's traffic so far.
    fn traffic(&self) -> Totals;
    /// Ends the connection: what is queued for it is dropped, its writer stops, and its
    /// task ends as for a client that went away.
    fn close(&self);
}

/// One connection.
pub struct ConnEntry {
    /// Unique within the server's run.
    pub id: u64,
    /// The protocol (`native`, `mqtt`, `mqtt-ws`, `stomp`, ...).
    pub protocol: &'static str,
    /// The listener's address (or `unix:PATH`, `shm`).
    pub listener: String,
    /// The client's address (TCP, or the address a shared-memory ticket was issued to).
    pub peer: Option<SocketAddr>,
    /// When it was accepted.
    pub since: SystemTime,
    user: Mutex<Option<String>>,
    client_id: Mutex<Option<String>>,
    session: Mutex<Option<(u64, Arc<dyn SessionView>)>>,
    closing: AtomicBool,
}

impl std::fmt::Debug for ConnEntry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConnEntry")
            .field("id", &self.id)
            .field("protocol", &self.protocol)
            .field("listener", &self.listener)
            .field("peer", &self.peer)
            .finish_non_exhaustive()
    }
}

impl ConnEntry {
    /// The authenticated user (none: anonymous, or not authenticated yet).
    pub fn user(&self) -> Option<String> {
        lock(&self.user).clone()
    }

    /// Records the authenticated user.
    pub fn set_user(&self, user: Option<&str>) {
        *lock(&self.user) = user.map(str::to_string);
    }

    /// The client's own name for itself (MQTT client id, native client name).
    pub fn client_id(&self) -> Option<String> {
        lock(&self.client_id).clone()
    }

    /// Records the client's name for itself.
    pub fn set_client_id(&self, id: Option<&str>) {
        *lock(&self.client_id) = id.map(str::to_string);
    }

    /// Records the connection's broker session (its id and what can be seen of it).
    pub fn attach(&self, session_id: u64, view: Arc<dyn SessionView>) {
        let view2 = view.clone();
        // The one this replaces (if any) is dropped outside the lock.
        let old = lock(&self.session).replace((session_id, view));
        drop(old);
        // An admin close that came before the session: carried out now.
        if self.closing.load(Ordering::Acquire) {
            view2.close();
        }
    }

    /// The broker session id, once there is one.
    pub fn session_id(&self) -> Option<u64> {
        lock(&self.session).as_ref().map(|(id, _)| *id)
    }

    /// Bytes queued for the client (0 before the session).
    pub fn queued_bytes(&self) -> usize {
        self.view().map_or(0, |v| v.queued_bytes())
    }

    /// The session's traffic (zero before the session).
    pub fn traffic(&self) -> Totals {
        self.view().map(|v| v.traffic()).unwrap_or_default()
    }

    fn view(&self) -> Option<Arc<dyn SessionView>> {
        lock(&self.session).as_ref().map(|(_, v)| v.clone())
    }

    /// Ends the connection: at once when it has a session, else as soon as it has one (a
    /// connection still in its handshake ends at the handshake timeout at the latest).
    pub fn close(&self) {
        self.closing.store(true, Ordering::Release);
        if let Some(v) = self.view() {
            v.close();
        }
    }

    /// True once [`ConnEntry::close`] was called.
    pub fn is_closing(&self) -> bool {
        self.closing.load(Ordering::Acquire)
    }
}

/// The live connections of a server.
#[derive(Debug, Default)]
pub struct ConnRegistry {
    next: AtomicU64,
    map: Mutex<BTreeMap<u64, Arc<ConnEntry>>>,
}

impl ConnRegistry {
    /// An empty registry.
    pub fn new() -> Arc<ConnRegistry> {
        Arc::new(ConnRegistry::default())
    }

    /// Registers a connection accepted on `listener` from `peer`; the entry goes when the
    /// guard is dropped.
    pub fn register(
        self: &Arc<Self>,
        protocol: &'static str,
        listener: String,
        peer: Option<SocketAddr>,
    ) -> ConnGuard {
        let id = self.next.fetch_add(1, Ordering::Relaxed) + 1;
        let entry = Arc::new(ConnEntry {
            id,
            protocol,
            listener,
            peer,
            since: SystemTime::now(),
            user: Mutex::new(None),
            client_id: Mutex::new(None),
            session: Mutex::new(None),
            closing: AtomicBool::new(false),
        });
        lock(&self.map).insert(id, entry.clone());
        ConnGuard {
            registry: self.clone(),
            entry,
        }
    }

    /// Every live connection, by id.
    pub fn list(&self) -> Vec<Arc<ConnEntry>> {
        lock(&self.map).values().cloned().collect()
    }

    /// One connection.
    pub fn get(&self, id: u64) -> Option<Arc<ConnEntry>> {
        lock(&self.map).get(&id).cloned()
    }

    /// How many connections are live.
    pub fn len(&self) -> usize {
        lock(&self.map).len()
    }

    /// True when no connection is live.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A registered connection; dropping it removes the entry.
#[derive(Debug)]
pub struct ConnGuard {
    registry: Arc<ConnRegistry>,
    entry: Arc<ConnEntry>,
}

impl ConnGuard {
    /// The entry, to fill in.
    pub fn entry(&self) -> &Arc<ConnEntry> {
        &self.entry
    }
}

impl Drop for ConnGuard {
    fn drop(&mut self) {
        lock(&self.registry.map).remove(&self.entry.id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct View(AtomicBool);
    impl SessionView for View {
        fn queued_bytes(&self) -> usize {
            7
        }
        fn traffic(&self) -> Totals {
            Totals {
                msgs_in: 1,
                ..Totals::default()
            }
        }
        fn close(&self) {
            self.0.store(true, Ordering::SeqCst);
        }
    }

    #[test]
    fn entries_come_and_go_and_close() {
        let r = ConnRegistry::new();
        let a = r.register("native", "127.0.0.1:1".into(), None);
        let b = r.register("mqtt", "127.0.0.1:2".into(), None);
        assert_eq!(r.len(), 2);
        assert_ne!(a.entry().id, b.entry().id);
        a.entry().set_user(Some("alice"));
        assert_eq!(
            r.get(a.entry().id).unwrap().user().as_deref(),
            Some("alice")
        );
        assert_eq!(a.entry().queued_bytes(), 0);
        let v = Arc::new(View(AtomicBool::new(false)));
        a.entry().attach(9, v.clone());
        assert_eq!(a.entry().session_id(), Some(9));
        assert_eq!(a.entry().queued_bytes(), 7);
        assert_eq!(a.entry().traffic().msgs_in, 1);
        a.entry().close();
        assert!(v.0.load(Ordering::SeqCst));
        // Closed before its session: the session is closed as it attaches.
        b.entry().close();
        let w = Arc::new(View(AtomicBool::new(false)));
        b.entry().attach(10, w.clone());
        assert!(w.0.load(Ordering::SeqCst));
        drop(a);
        assert_eq!(r.len(), 1);
        drop(b);
        assert!(r.is_empty());
    }
}
