//! A message into a queue ([`Queue::offer`]): the queue's bounds and overflow policy, the
//! memory budget, the store; and a message given back to its place.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use hayate_core::sync::lock;

use super::{Overflow, QItem, QState, Queue, Reason, persistent};
use crate::Outbox;

/// What a queue did with a message offered to it.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Offered {
    /// The queue took it (it may still drop it later: drop-head, TTL).
    pub taken: bool,
    /// The queue refused it (reject-publish, no room in the memory budget) or could not
    /// store it: a publisher waiting for a confirmation is told no.
    pub refused: bool,
    /// Its record in the queue's store (a confirmation waits until it is durable).
    pub stored: Option<u64>,
}

impl Queue {
    /// A new message (made by [`Queue::item`]) in: room is made by the queue's bounds
    /// (drop-head) or it is refused (reject-publish, the memory budget), a persistent one
    /// (or any, with `persist_all`) is stored in a durable queue's store, and the queue
    /// delivers what it can. Never blocks.
    pub fn offer(self: &Arc<Self>, m: QItem) -> Offered {
        self.offer_in(m, None)
    }

    /// [`Queue::offer`] on behalf of a publishing session: deliveries to outboxes with a
    /// sink go into `to_flush` (see [`Outbox::push_control_buf_in`]).
    pub fn offer_in(
        self: &Arc<Self>,
        m: QItem,
        to_flush: Option<&mut Vec<Arc<Outbox>>>,
    ) -> Offered {
        let mut out = Offered::default();
        let mut st = lock(&self.st);
        if st.deleted {
            return out;
        }
        let size = m.size();
        let body = m.msg.payload.len();
        let mut dead = Vec::new();
        // Room by the queue's limits: the oldest go (drop-head), or this one is refused.
        while st.ledger.ready_len() > 0 && self.full(&st, size, body) {
            if self.cfg.overflow != Overflow::DropHead {
                drop(st);
                out.refused = true;
                if self.cfg.overflow == Overflow::RejectPublishDeadLetter {
                    self.dead_letter_all(vec![m], Reason::MaxLen);
                } else {
                    self.dropped.fetch_add(1, Ordering::Relaxed);
                }
                return out;
            }
            if let Some(old) = st.ledger.pop_ready() {
                st.body_bytes -= old.msg.payload.len();
                dead.push(old);
            }
        }
        out.taken = true;
        if self.cfg.max_length == Some(0) {
            dead.push(m);
            drop(st);
            self.dead_letter_all(dead, Reason::MaxLen);
            return out;
        }
        // And by the broker-wide budget.
        let held = st.ledger.held_bytes();
        if !st.charge.cover(held + size) {
            st.charge.shrink(held);
            drop(st);
            out.refused = true;
            dead.push(m);
            self.dead_letter_all(dead, Reason::MaxLen);
            return out;
        }
        let mut m = m;
        // A persistent message entering a durable queue is written to its store first
        // (the publisher's confirm waits until it is durable). If it cannot be, the
        // publisher is told and the message is still delivered.
        if let Some((store, id)) = &self.store
            && (self.cfg.persist_all || persistent(&m.msg))
        {
            match store.append(*id, &m) {
                Ok(o) => {
                    m.stored = Some(o);
                    out.stored = Some(o);
                }
                Err(e) => {
                    tracing::error!(queue = %self.id.name, "cannot store a persistent message: {e}");
                    out.refused = true;
                }
            }
        }
        st.body_bytes += body;
        let priority = m.priority;
        let seq = st.ledger.push(m, size, priority);
        self.dispatch_locked(&mut st, to_flush);
        // Still here (no consumer took it at once): it may stay long, so it gets
        // allocations of its own instead of pinning the read buffer it came in.
        if let Some(m) = st.ledger.ready_mut(priority, seq) {
            m.msg = m.msg.compact();
        }
        drop(st);
        self.dead_letter_all(dead, Reason::MaxLen);
        out
    }

    /// Would one more message of `size` (`body` bytes) pass the queue's bounds?
    fn full(&self, st: &QState, size: usize, body: usize) -> bool {
        self.cfg
            .max_length
            .is_some_and(|n| st.ledger.ready_len() >= n)
            || self
                .cfg
                .max_body_bytes
                .is_some_and(|b| st.body_bytes + body > b)
            || Self::ready_bytes(st) + size > self.cfg.max_bytes
    }
}
