//! Traffic accounting: what each session received and was sent, and the totals of a class of
//! sessions (a listener), for the admin API and `/metrics`.
//!
//! Each session has a [`Traffic`]: four relaxed atomic counters, written only on that
//! session's paths (a publish counts on the publisher's, a delivery on the receiver's), so no
//! counter is shared by every message of the broker. A [`TrafficClass`] (one per listener)
//! knows the counters of its live sessions and folds a session's counts into its own when
//! the session ends: [`TrafficClass::totals`] is then exact and never goes back, whatever
//! sessions come and go between two scrapes.
//!
//! Lock: the class's `live` map, a leaf (nothing else is taken while it is held; a session
//! ending takes it once).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

/// A session's counters (messages and payload bytes, in and out; request/reply calls and
/// replies it published).
#[derive(Debug, Default)]
pub struct Counters {
    msgs_in: AtomicU64,
    bytes_in: AtomicU64,
    msgs_out: AtomicU64,
    bytes_out: AtomicU64,
    calls: AtomicU64,
    replies: AtomicU64,
}

impl Counters {
    /// What the counters say now.
    pub fn totals(&self) -> Totals {
        Totals {
            msgs_in: self.msgs_in.load(Ordering::Relaxed),
            bytes_in: self.bytes_in.load(Ordering::Relaxed),
            msgs_out: self.msgs_out.load(Ordering::Relaxed),
            bytes_out: self.bytes_out.load(Ordering::Relaxed),
            calls: self.calls.load(Ordering::Relaxed),
            replies: self.replies.load(Ordering::Relaxed),
        }
    }

    fn add(&self, t: Totals) {
        self.msgs_in.fetch_add(t.msgs_in, Ordering::Relaxed);
        self.bytes_in.fetch_add(t.bytes_in, Ordering::Relaxed);
        self.msgs_out.fetch_add(t.msgs_out, Ordering::Relaxed);
        self.bytes_out.fetch_add(t.bytes_out, Ordering::Relaxed);
        self.calls.fetch_add(t.calls, Ordering::Relaxed);
        self.replies.fetch_add(t.replies, Ordering::Relaxed);
    }
}

/// Counts, as read from [`Counters`] or summed over a class.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Totals {
    /// Messages the session published (received from its client).
    pub msgs_in: u64,
    /// Their payload bytes.
    pub bytes_in: u64,
    /// Messages delivered to the session (queued for its client).
    pub msgs_out: u64,
    /// Their payload bytes.
    pub bytes_out: u64,
    /// Of the messages published, requests: those carrying a reply-to.
    pub calls: u64,
    /// Of the messages published, replies: those published to a reply inbox (`_inbox/...`).
    pub replies: u64,
}

impl std::ops::Add for Totals {
    type Output = Totals;
    fn add(self, o: Totals) -> Totals {
        Totals {
            msgs_in: self.msgs_in + o.msgs_in,
            bytes_in: self.bytes_in + o.bytes_in,
            msgs_out: self.msgs_out + o.msgs_out,
            bytes_out: self.bytes_out + o.bytes_out,
            calls: self.calls + o.calls,
            replies: self.replies + o.replies,
        }
    }
}

/// A session's traffic: its counters, and the class that folds them in when it ends.
#[derive(Debug, Default)]
pub struct Traffic {
    counters: Arc<Counters>,
    class: Option<(Arc<TrafficClass>, u64)>,
}

impl Traffic {
    /// Counters of a session that belongs to `class` (none: counted for itself only).
    pub fn new(class: Option<&Arc<TrafficClass>>) -> Traffic {
        let counters = Arc::new(Counters::default());
        let class = class.map(|c| {
            let mut live = c.live();
            live.next += 1;
            let id = live.next;
            live.map.insert(id, counters.clone());
            (c.clone(), id)
        });
        Traffic { counters, class }
    }

    /// `n` messages of `bytes` payload bytes published by the session.
    #[inline]
    pub fn note_in(&self, n: u64, bytes: u64) {
        self.counters.msgs_in.fetch_add(n, Ordering::Relaxed);
        self.counters.bytes_in.fetch_add(bytes, Ordering::Relaxed);
    }

    /// `calls` requests and `replies` replies among the messages the session published.
    #[inline]
    pub fn note_rpc(&self, calls: u64, replies: u64) {
        if calls > 0 {
            self.counters.calls.fetch_add(calls, Ordering::Relaxed);
        }
        if replies > 0 {
            self.counters.replies.fetch_add(replies, Ordering::Relaxed);
        }
    }

    /// `n` messages of `bytes` payload bytes delivered to the session.
    #[inline]
    pub fn note_out(&self, n: u64, bytes: u64) {
        self.counters.msgs_out.fetch_add(n, Ordering::Relaxed);
        self.counters.bytes_out.fetch_add(bytes, Ordering::Relaxed);
    }

    /// What the session has done so far.
    pub fn totals(&self) -> Totals {
        self.counters.totals()
    }
}

impl Drop for Traffic {
    fn drop(&mut self) {
        if let Some((class, id)) = self.class.take() {
            let mut live = class.live();
            if let Some(c) = live.map.remove(&id) {
                // Under the lock: a scrape sees these counts either live or folded, once.
                class.retired.add(c.totals());
            }
        }
    }
}

#[derive(Debug, Default)]
struct Live {
    next: u64,
    map: HashMap<u64, Arc<Counters>>,
}

/// The sessions of one listener: the counts of those that ended, and the live ones'.
#[derive(Debug, Default)]
pub struct TrafficClass {
    retired: Counters,
    live: Mutex<Live>,
}

impl TrafficClass {
    /// A class with nothing counted yet.
    pub fn new() -> Arc<TrafficClass> {
        Arc::new(TrafficClass::default())
    }

    fn live(&self) -> MutexGuard<'_, Live> {
        hayate_core::sync::lock(&self.live)
    }

    /// Everything the class's sessions, ended and live, have done: exact, and never less
    /// than an earlier call returned.
    pub fn totals(&self) -> Totals {
        let live = self.live();
        live.map
            .values()
            .fold(self.retired.totals(), |t, c| t + c.totals())
    }

    /// Sessions of the class alive now.
    pub fn live_sessions(&self) -> usize {
        self.live().map.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn totals_survive_sessions_that_end() {
        let class = TrafficClass::new();
        let a = Traffic::new(Some(&class));
        let b = Traffic::new(Some(&class));
        a.note_in(2, 100);
        b.note_out(3, 30);
        assert_eq!(class.live_sessions(), 2);
        let t = class.totals();
        assert_eq!(
            (t.msgs_in, t.bytes_in, t.msgs_out, t.bytes_out),
            (2, 100, 3, 30)
        );
        drop(a);
        assert_eq!(class.live_sessions(), 1);
        assert_eq!(class.totals(), t);
        b.note_in(1, 1);
        drop(b);
        let t = class.totals();
        assert_eq!(
            (t.msgs_in, t.bytes_in, t.msgs_out, t.bytes_out),
            (3, 101, 3, 30)
        );
        // Without a class: counted for the session only.
        let c = Traffic::new(None);
        c.note_in(5, 5);
        assert_eq!(c.totals().msgs_in, 5);
        assert_eq!(class.totals(), t);
    }
}
