//! Declared queues: messages that wait for a queue group's first member.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use hayate_core::KeyExpr;

use hayate_flow::memory::Charge;

use crate::Batch;

/// Messages waiting for a declared queue's first member, oldest first, at most `limit`.
#[derive(Debug)]
pub struct Backlog {
    /// The queue group's registry id.
    pub(crate) id: Arc<str>,
    pub(crate) q: std::sync::Mutex<BacklogState>,
    pub(crate) limit: usize,
    /// Most payload bytes waiting (0: no limit).
    pub(crate) max_bytes: usize,
    pub(crate) dropped: AtomicU64,
}

#[derive(Debug)]
pub(crate) struct BacklogState {
    pub(crate) q: VecDeque<hayate_core::Message>,
    /// Payload bytes in `q`.
    pub(crate) bytes: usize,
    /// The footprint of what `q` holds ([`held_size`]: what the memory budget is charged
    /// for).
    pub(crate) held: usize,
    /// The group has members (set and cleared under the registry write lock, with the
    /// drain): a publisher whose route still says "no member" must not park here.
    pub(crate) served: bool,
    /// The waiting messages' share of the broker-wide memory budget.
    pub(crate) charge: Charge,
}

/// What one waiting message costs the process: its data as `Message::compact` keeps it and
/// its slot in the `VecDeque` (which only grows, by doubling, and is taken whole by
/// [`Backlog::open`]: at most two `Message`s per message waiting).
fn held_size(m: &hayate_core::Message) -> usize {
    crate::footprint::data(m) + crate::footprint::deque_slot::<hayate_core::Message>()
}

impl Backlog {
    pub(crate) fn lock(&self) -> std::sync::MutexGuard<'_, BacklogState> {
        self.q
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Parks `batch` for the queue's first member; false (nothing parked) when the queue has
    /// members now: the caller's route is older than them and it must deliver through a
    /// fresh one.
    pub(crate) fn park(&self, batch: Batch<'_>) -> bool {
        let mut st = self.lock();
        if st.served {
            return false;
        }
        self.push_locked(&mut st, batch);
        true
    }

    /// Puts `batch` in the backlog whatever the members (messages given back).
    pub(crate) fn push(&self, batch: Batch<'_>) {
        let mut st = self.lock();
        self.push_locked(&mut st, batch);
    }

    /// Parks what fits: at most `limit` messages and `max_bytes` payload bytes wait, within
    /// the broker-wide memory budget; the rest is dropped and counted.
    fn push_locked(&self, st: &mut BacklogState, batch: Batch<'_>) {
        for i in 0..batch.len() {
            let m = batch.message(i);
            let size = held_size(&m);
            let full = st.q.len() >= self.limit
                || (self.max_bytes > 0 && st.bytes + m.payload.len() > self.max_bytes)
                || !st.charge.cover(st.held + size);
            if full {
                self.dropped
                    .fetch_add((batch.len() - i) as u64, Ordering::Relaxed);
                return;
            }
            st.bytes += m.payload.len();
            st.held += size;
            // Kept until a member comes: in allocations of its own, not pinning the
            // publisher's read buffer.
            st.q.push_back(m.compact());
        }
    }

    /// The first member joined: takes what waits and marks the queue served.
    pub(crate) fn open(&self) -> VecDeque<hayate_core::Message> {
        let mut st = self.lock();
        st.served = true;
        st.bytes = 0;
        st.held = 0;
        st.charge.shrink(0);
        std::mem::take(&mut st.q)
    }

    /// The last member left.
    pub(crate) fn close(&self) {
        self.lock().served = false;
    }

    /// Messages waiting.
    pub fn len(&self) -> usize {
        self.lock().q.len()
    }

    /// True if no message waits.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Messages dropped because the backlog was full.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }
}

/// The registry id of queue group `name` on `expr`.
pub(crate) fn group_id(name: &str, expr: &KeyExpr) -> String {
    format!("{name}\u{0}{}", expr.as_str())
}
