//! Acknowledged delivery: which deliveries a receiver has not yet confirmed.
//!
//! An [`AckTracker`] numbers each delivery with a *delivery id* (per session, increasing,
//! never reused), keeps at most `window` deliveries in flight (sent and not yet acknowledged)
//! and holds the rest in a pending queue, oldest first. A receiver acknowledges one delivery
//! ([`AckTracker::ack`]) or every delivery up to an id ([`AckTracker::ack_through`]), or
//! gives one back ([`AckTracker::nack`]) for the caller to deliver again, to this receiver or
//! to another member of its queue group; when the receiver goes away the caller takes
//! everything ([`AckTracker::take_all`]) and hands it on.
//!
//! A delivery superseded by a later delivery of the same message to the same receiver (a
//! durable consumer's message whose ack wait ran out, delivered again) is *retired*
//! ([`AckTracker::retire`]): out of the window and the byte count, so redeliveries never
//! fill the window, and kept (stripped, at most `window` of them) only so that a late
//! acknowledgement of its id still counts.
//!
//! The tracker counts the bytes it holds (in flight and pending), so the owner can charge them
//! to the session's budget: a receiver that does not acknowledge slows its publishers instead
//! of growing without bound.
//!
//! This is the one place where the durable log will attach: a durable consumer's in-flight
//! set is this tracker's, persisted, and its pending queue is a read position in the log.

use std::collections::{BTreeMap, VecDeque};

/// One delivery the tracker holds.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Held<T> {
    item: T,
    size: usize,
}

/// Deliveries in flight and pending for one receiver (see the module documentation).
#[derive(Debug, Clone)]
pub struct AckTracker<T> {
    next_id: u64,
    window: usize,
    inflight: BTreeMap<u64, Held<T>>,
    pending: VecDeque<Held<T>>,
    /// Retired deliveries (see the module documentation), by id.
    retired: BTreeMap<u64, T>,
    bytes: usize,
}

impl<T> AckTracker<T> {
    /// A tracker allowing `window` deliveries in flight (at least 1).
    pub fn new(window: usize) -> AckTracker<T> {
        AckTracker {
            next_id: 1,
            window: window.max(1),
            inflight: BTreeMap::new(),
            pending: VecDeque::new(),
            retired: BTreeMap::new(),
            bytes: 0,
        }
    }

    /// The most deliveries in flight.
    pub fn window(&self) -> usize {
        self.window
    }

    /// Changes the window (at least 1). Deliveries already in flight stay in flight.
    pub fn set_window(&mut self, window: usize) {
        self.window = window.max(1);
    }

    /// Queues `item` (of `size` bytes, for accounting) behind what is pending. Call
    /// [`AckTracker::next_ready`] to move what the window allows into flight.
    pub fn push(&mut self, item: T, size: usize) {
        self.bytes += size;
        self.pending.push_back(Held { item, size });
    }

    /// Queues `item` ahead of everything pending (a delivery given back to this receiver).
    pub fn push_front(&mut self, item: T, size: usize) {
        self.bytes += size;
        self.pending.push_front(Held { item, size });
    }

    /// Moves the oldest pending item into flight if the window has room; returns its new
    /// delivery id and the item, for the caller to send.
    pub fn next_ready(&mut self) -> Option<(u64, &T)> {
        if self.inflight.len() >= self.window {
            return None;
        }
        let h = self.pending.pop_front()?;
        // A ring that held many (an offline session's backlog) gives its room back as it
        // drains: halved whenever it is less than a quarter full (so each halving follows
        // as many pops as it moves items).
        let cap = self.pending.capacity();
        if cap > 64 && self.pending.len() < cap / 4 {
            self.pending.shrink_to(cap / 2);
        }
        let id = self.next_id;
        self.next_id += 1;
        let h = self.inflight.entry(id).or_insert(h);
        Some((id, &h.item))
    }

    /// Puts `item` straight into flight under a new delivery id, whatever the window: a
    /// delivery that was in flight when its session was saved, restored before anything
    /// else is sent (the receiver may still acknowledge it).
    pub fn insert_in_flight(&mut self, item: T, size: usize) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        self.bytes += size;
        self.inflight.insert(id, Held { item, size });
        id
    }

    /// The item in flight (or retired) under `id`.
    pub fn get(&self, id: u64) -> Option<&T> {
        self.inflight
            .get(&id)
            .map(|h| &h.item)
            .or_else(|| self.retired.get(&id))
    }

    /// The item in flight under `id`, to update what the owner keeps beside it (the
    /// protocol's own stage of the exchange, say); its size stays as given.
    pub fn get_mut(&mut self, id: u64) -> Option<&mut T> {
        self.inflight.get_mut(&id).map(|h| &mut h.item)
    }

    /// Acknowledges delivery `id` (in flight or retired); returns its item, or `None` if it
    /// was neither (already acknowledged, given back, or never sent).
    pub fn ack(&mut self, id: u64) -> Option<T> {
        self.remove(id)
    }

    /// Acknowledges every delivery in flight with an id up to and including `id`; returns
    /// how many there were.
    pub fn ack_through(&mut self, id: u64) -> usize {
        let rest = self.inflight.split_off(&id.saturating_add(1));
        let done = std::mem::replace(&mut self.inflight, rest);
        self.bytes -= done.values().map(|h| h.size).sum::<usize>();
        let rest = self.retired.split_off(&id.saturating_add(1));
        let retired = std::mem::replace(&mut self.retired, rest);
        done.len() + retired.len()
    }

    /// Removes and returns, in id order, the deliveries in flight (or retired) with an id
    /// up to and including `id` for which `pick` is true (a cumulative acknowledgement of
    /// one subscription's deliveries).
    pub fn take_through(&mut self, id: u64, mut pick: impl FnMut(&T) -> bool) -> Vec<T> {
        let mut ids: Vec<u64> = self
            .inflight
            .range(..=id)
            .filter(|(_, h)| pick(&h.item))
            .map(|(&k, _)| k)
            .collect();
        if !self.retired.is_empty() {
            ids.extend(
                self.retired
                    .range(..=id)
                    .filter(|(_, t)| pick(t))
                    .map(|(&k, _)| k),
            );
            ids.sort_unstable();
        }
        ids.into_iter().filter_map(|k| self.remove(k)).collect()
    }

    /// Gives delivery `id` back: it leaves the tracker and is returned to the caller, who
    /// delivers it again (here with [`AckTracker::push_front`], or to another receiver).
    pub fn nack(&mut self, id: u64) -> Option<T> {
        self.remove(id)
    }

    fn remove(&mut self, id: u64) -> Option<T> {
        let Some(h) = self.inflight.remove(&id) else {
            return self.retired.remove(&id);
        };
        self.bytes -= h.size;
        Some(h.item)
    }

    /// Retires delivery `id` (in flight): a later delivery of the same message to the same
    /// receiver supersedes it. It leaves the window and the byte count; `strip` drops what
    /// a late acknowledgement does not need (the payload, say). At most `window` retired
    /// deliveries are kept, the oldest forgotten first (an acknowledgement of a forgotten
    /// one is then unknown). False if `id` is not in flight.
    pub fn retire(&mut self, id: u64, strip: impl FnOnce(&mut T)) -> bool {
        let Some(mut h) = self.inflight.remove(&id) else {
            return false;
        };
        self.bytes -= h.size;
        strip(&mut h.item);
        self.retired.insert(id, h.item);
        while self.retired.len() > self.window {
            self.retired.pop_first();
        }
        true
    }

    /// Drops the pending (never sent) deliveries for which `pick` is true (superseded
    /// before they went out); how many.
    pub fn drop_pending_if(&mut self, mut pick: impl FnMut(&T) -> bool) -> usize {
        let before = self.pending.len();
        let mut freed = 0;
        self.pending.retain(|h| {
            let drop = pick(&h.item);
            if drop {
                freed += h.size;
            }
            !drop
        });
        self.bytes -= freed;
        before - self.pending.len()
    }

    /// Takes everything: the deliveries in flight in id order, then the pending ones in
    /// order (retired ones are forgotten: a later delivery superseded each). The tracker is
    /// empty afterwards (delivery ids are not reused).
    pub fn take_all(&mut self) -> Vec<T> {
        self.retired.clear();
        let mut all: Vec<T> = std::mem::take(&mut self.inflight)
            .into_values()
            .map(|h| h.item)
            .collect();
        all.extend(
            std::mem::take(&mut self.pending)
                .into_iter()
                .map(|h| h.item),
        );
        self.bytes = 0;
        all
    }

    /// Deliveries in flight, in id order.
    pub fn inflight(&self) -> impl DoubleEndedIterator<Item = (u64, &T)> {
        self.inflight.iter().map(|(&id, h)| (id, &h.item))
    }

    /// Every delivery held, in flight and pending, to change in place (its accounted size
    /// stays as it was pushed).
    pub fn for_each_mut(&mut self, mut f: impl FnMut(&mut T)) {
        for h in self.inflight.values_mut() {
            f(&mut h.item);
        }
        for h in &mut self.pending {
            f(&mut h.item);
        }
    }

    /// Pending deliveries, oldest first.
    pub fn pending(&self) -> impl DoubleEndedIterator<Item = &T> {
        self.pending.iter().map(|h| &h.item)
    }

    /// Number of deliveries in flight.
    pub fn in_flight_len(&self) -> usize {
        self.inflight.len()
    }

    /// Number of pending deliveries.
    pub fn pending_len(&self) -> usize {
        self.pending.len()
    }

    /// True when nothing is in flight or pending.
    pub fn is_empty(&self) -> bool {
        self.inflight.is_empty() && self.pending.is_empty()
    }

    /// Bytes of every item held (in flight and pending), as given to `push`.
    pub fn held_bytes(&self) -> usize {
        self.bytes
    }

    /// Bytes of the tracker's own storage, were `more` items pushed beyond what it holds
    /// (for an owner that charges them to the memory budget beside its items' heap bytes):
    /// the pending ring's capacity (it grows by doubling, from 4) and the in-flight map's
    /// nodes, one `Held<T>` (and, in flight, its id) per slot. The map is a B-tree whose
    /// nodes of 11 entries are at least 5 full except the root: at most 2.5 slots per entry
    /// with the internal nodes, and a whole node for the root.
    pub fn storage_bytes(&self, more: usize) -> usize {
        let slot = std::mem::size_of::<Held<T>>();
        let need = self.pending.len() + more;
        let mut cap = self.pending.capacity();
        while cap < need {
            cap = (cap * 2).max(4);
        }
        let inflight = match self.inflight.len() {
            0 => 0,
            n => (n * 5 / 2 + 11) * (slot + 8),
        };
        cap * slot + inflight
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn window_and_acks() {
        let mut t = AckTracker::new(2);
        for i in 0..4 {
            t.push(i, 10);
        }
        assert_eq!(t.next_ready().map(|(id, &v)| (id, v)), Some((1, 0)));
        assert_eq!(t.next_ready().map(|(id, &v)| (id, v)), Some((2, 1)));
        assert_eq!(t.next_ready(), None);
        assert_eq!(t.held_bytes(), 40);
        assert_eq!(t.ack(1), Some(0));
        assert_eq!(t.ack(1), None);
        assert_eq!(t.next_ready().map(|(id, &v)| (id, v)), Some((3, 2)));
        assert_eq!(t.nack(2), Some(1));
        t.push_front(1, 10);
        assert_eq!(t.next_ready().map(|(id, &v)| (id, v)), Some((4, 1)));
        assert_eq!(t.ack_through(4), 2);
        assert_eq!(t.held_bytes(), 10);
        assert_eq!(t.take_all(), vec![3]);
        assert!(t.is_empty());
        assert_eq!(t.held_bytes(), 0);
    }

    #[test]
    fn a_retired_delivery_leaves_the_window_and_a_late_ack_still_finds_it() {
        let mut t = AckTracker::new(2);
        for i in 0..3 {
            t.push(i, 10);
        }
        assert_eq!(t.next_ready().map(|(id, &v)| (id, v)), Some((1, 0)));
        assert_eq!(t.next_ready().map(|(id, &v)| (id, v)), Some((2, 1)));
        assert_eq!(t.next_ready(), None, "the window is full");
        assert!(t.retire(1, |v| *v += 100));
        assert!(!t.retire(1, |_| {}), "retired once");
        assert_eq!((t.in_flight_len(), t.held_bytes()), (1, 20));
        assert_eq!(t.next_ready().map(|(id, &v)| (id, v)), Some((3, 2)));
        // A late ack of the retired id finds it (stripped as asked).
        assert_eq!(t.get(1), Some(&100));
        assert_eq!(t.ack(1), Some(100));
        assert_eq!(t.ack(1), None);
        // A cumulative ack covers retired ones too, in id order.
        assert!(t.retire(3, |_| {}));
        assert_eq!(t.take_through(3, |_| true), vec![1, 2]);
        // Pending ones superseded before they went out are dropped.
        t.push(7, 10);
        t.push(8, 10);
        assert_eq!(t.drop_pending_if(|&v| v == 7), 1);
        assert_eq!((t.pending_len(), t.held_bytes()), (1, 10));
        // At most `window` retired ones are kept, the oldest forgotten first.
        let mut t = AckTracker::new(2);
        for i in 0..4 {
            t.push(i, 1);
            let (id, _) = t.next_ready().unwrap();
            assert!(t.retire(id, |_| {}));
        }
        assert_eq!(
            (t.get(1), t.get(2), t.get(3), t.get(4)),
            (None, None, Some(&2), Some(&3))
        );
        assert_eq!(
            t.take_all(),
            Vec::<i32>::new(),
            "retired ones are not given back"
        );
        assert_eq!(t.ack(4), None);
    }
}
