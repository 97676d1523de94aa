//! Consumers and dispatch: a queue's [`QueueConsumer`]s and their [`QueueSink`]s, how
//! messages go out to them (round robin within credit, a consumer with a backed-up outbox
//! skipped, `get`), and how deliveries come back ([`Unacked`]: acknowledged, or given
//! back in place or dead-lettered, [`give_back_all`]).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use hayate_core::sync::lock;

use super::{QItem, QState, Queue, Reason};
use crate::Outbox;

/// Most bytes a consumer's outbox may hold before its queue stops delivering to it.
pub const OUTBOX_LIMIT: usize = 1024 * 1024;

/// Where a queue's deliveries go: a front-end's consumer (AMQP: a channel writing
/// basic.deliver frames into its connection's outbox).
pub trait QueueSink: Send + Sync + std::fmt::Debug {
    /// May it take one more delivery now, beside its consumer's own prefetch (AMQP: the
    /// channel is open, not paused by channel.flow, within its global prefetch)?
    /// `acked`: the delivery will wait for an acknowledgement.
    fn has_credit(&self, acked: bool) -> bool;
    /// The outbox deliveries are written to (a consumer whose outbox holds more than
    /// [`OUTBOX_LIMIT`] is skipped until it drains).
    fn outbox(&self) -> &Arc<Outbox>;
    /// Writes one delivery of `queue` to `consumer` (none: a `get`, `left` messages
    /// behind it), under the queue's lock. Keeps it (an [`Unacked`]) until settled unless
    /// `no_ack`; gives back an item it did not keep (the queue forgets it). A delivery
    /// made for a publishing session leaves its outbox in `to_flush` (see
    /// [`Outbox::push_control_buf_in`]).
    fn deliver(&self, d: Delivered<'_>, item: QItem, to_flush: ToFlush<'_>) -> Option<QItem>;
    /// The queue was deleted: the consumer is gone.
    fn cancelled(&self) {}
}

/// The publishing session's outboxes to flush, when a queue delivers on its behalf.
pub type ToFlush<'a> = Option<&'a mut Vec<Arc<Outbox>>>;

/// A delivery as a [`QueueSink`] is given it.
#[derive(Debug, Clone, Copy)]
pub struct Delivered<'a> {
    pub queue: &'a Arc<Queue>,
    /// The consumer it goes to (none: a get).
    pub consumer: Option<&'a Arc<QueueConsumer>>,
    /// A get's messages left behind it.
    pub left: Option<u32>,
    pub no_ack: bool,
}

/// One consumer of a queue.
#[derive(Debug)]
pub struct QueueConsumer {
    pub sink: Arc<dyn QueueSink>,
    /// Deliveries are settled as they are written.
    pub no_ack: bool,
    /// The queue's only consumer.
    pub exclusive: bool,
    /// Most unacknowledged deliveries (0: no limit).
    pub prefetch: usize,
    /// Its unacknowledged deliveries.
    pub in_flight: AtomicUsize,
}

impl QueueConsumer {
    pub fn new(sink: Arc<dyn QueueSink>, no_ack: bool, exclusive: bool, prefetch: usize) -> Self {
        QueueConsumer {
            sink,
            no_ack,
            exclusive,
            prefetch,
            in_flight: AtomicUsize::new(0),
        }
    }

    /// May it take one more delivery now?
    fn has_credit(&self) -> bool {
        self.sink.has_credit(!self.no_ack)
            && (self.no_ack
                || self.prefetch == 0
                || self.in_flight.load(Ordering::Acquire) < self.prefetch)
    }
}

/// A delivery waiting for its acknowledgement (kept by the sink).
#[derive(Debug)]
pub struct Unacked {
    pub queue: Arc<Queue>,
    /// The consumer it was delivered to (none: a get).
    pub consumer: Option<Arc<QueueConsumer>>,
    pub item: QItem,
}

/// Gives back deliveries taken together (a nack of several, a recover, a channel closed):
/// each goes back to its place in its queue, redelivered (`requeue`), or is
/// dead-lettered, and only once all are back does each queue dispatch (once). So they are
/// redelivered in their original order whatever order they come in. The consumer that gave
/// them back is the last one its queue's round robin offers them to (a NACK reaches
/// another consumer when one has credit).
pub fn give_back_all(items: impl IntoIterator<Item = Unacked>, requeue: bool) {
    let mut queues: Vec<(Arc<Queue>, Option<Arc<QueueConsumer>>)> = Vec::new();
    for u in items {
        match queues.iter_mut().find(|(q, _)| Arc::ptr_eq(q, &u.queue)) {
            Some((_, c)) => c.clone_from(&u.consumer),
            None => queues.push((u.queue.clone(), u.consumer.clone())),
        }
        let q = u.queue.clone();
        q.take_back(u, requeue);
    }
    for (q, c) in queues {
        if let Some(c) = c {
            q.turn_after(&c);
        }
        q.dispatch();
    }
}

impl Queue {
    /// The round robin's next turn is the consumer after `c` (if `c` is a consumer).
    fn turn_after(&self, c: &Arc<QueueConsumer>) {
        let mut st = lock(&self.st);
        if let Some(i) = st.consumers.iter().position(|o| Arc::ptr_eq(o, c)) {
            st.next = (i + 1) % st.consumers.len();
        }
    }

    /// Delivers what it can now.
    pub fn dispatch(self: &Arc<Self>) {
        let mut st = lock(&self.st);
        self.dispatch_locked(&mut st, None);
    }

    /// The next consumer with credit whose outbox is not backed up (those that are are
    /// noted: the task waits for them).
    fn pick(st: &mut QState) -> Option<usize> {
        let n = st.consumers.len();
        for i in 0..n {
            let at = (st.next + i) % n;
            let c = &st.consumers[at];
            let ob = c.sink.outbox();
            if ob.backlog().0 > OUTBOX_LIMIT {
                st.stalled = true;
                if !st.stalled_on.iter().any(|o| Arc::ptr_eq(o, ob)) {
                    let ob = ob.clone();
                    st.stalled_on.push(ob);
                }
                continue;
            }
            if c.has_credit() {
                return Some(at);
            }
        }
        None
    }

    pub(super) fn dispatch_locked(self: &Arc<Self>, st: &mut QState, mut to_flush: ToFlush<'_>) {
        // The clock is read only if some message has an expiry.
        let mut now = None;
        // Set again below if a consumer is still skipped; the task is woken only when the
        // queue starts to be stalled.
        let was_stalled = std::mem::take(&mut st.stalled);
        let mut expired = Vec::new();
        while let Some(front) = st.ready.front() {
            if front
                .expires
                .is_some_and(|at| *now.get_or_insert_with(Instant::now) >= at)
            {
                if let Some(m) = st.ready.pop_front() {
                    st.bytes -= m.size();
                    st.body_bytes -= m.msg.payload.len();
                    expired.push(m);
                }
                continue;
            }
            if st.consumers.is_empty() {
                break;
            }
            let Some(at) = Self::pick(st) else { break };
            st.next = (at + 1) % st.consumers.len();
            let c = st.consumers[at].clone();
            let Some(m) = st.ready.pop_front() else { break };
            st.bytes -= m.size();
            st.body_bytes -= m.msg.payload.len();
            let d = Delivered {
                queue: self,
                consumer: Some(&c),
                left: None,
                no_ack: c.no_ack,
            };
            self.deliver(st, &c.sink, d, m, to_flush.as_deref_mut());
        }
        let held = st.bytes + st.unacked_bytes;
        st.charge.shrink(held);
        if st.stalled && !was_stalled {
            self.wake.notify_one();
        }
        self.dead_letter_all(expired, Reason::Expired);
    }

    /// Writes one delivery through `sink` (under the queue's lock).
    fn deliver(
        &self,
        st: &mut QState,
        sink: &Arc<dyn QueueSink>,
        d: Delivered<'_>,
        m: QItem,
        to_flush: ToFlush<'_>,
    ) {
        let size = m.size();
        match sink.deliver(d, m, to_flush) {
            None if !d.no_ack => {
                st.unacked_bytes += size;
                st.unacked += 1;
                if let Some(c) = d.consumer {
                    c.in_flight.fetch_add(1, Ordering::AcqRel);
                }
            }
            None => {}
            Some(m) => self.forget(&m),
        }
    }

    /// A get: the next message through `sink` (`no_ack`: settled at once); false when
    /// there is none.
    pub fn get(self: &Arc<Self>, sink: &Arc<dyn QueueSink>, no_ack: bool) -> bool {
        let mut st = lock(&self.st);
        let now = Instant::now();
        st.used = Some(now);
        let mut expired = Vec::new();
        let mut found = None;
        while let Some(m) = st.ready.pop_front() {
            st.bytes -= m.size();
            st.body_bytes -= m.msg.payload.len();
            if m.expires.is_some_and(|at| now >= at) {
                expired.push(m);
                continue;
            }
            found = Some(m);
            break;
        }
        let got = found.is_some();
        if let Some(m) = found {
            let d = Delivered {
                queue: self,
                consumer: None,
                left: Some(st.ready.len() as u32),
                no_ack,
            };
            self.deliver(&mut st, sink, d, m, None);
        }
        let held = st.bytes + st.unacked_bytes;
        st.charge.shrink(held);
        drop(st);
        self.dead_letter_all(expired, Reason::Expired);
        got
    }

    /// Adds a consumer and delivers what it can. `Err`: the queue is deleted, or an
    /// exclusive consumer is there (or this one wants to be exclusive and others are).
    /// `added` runs once it is in, before any delivery (a front-end's consume-ok).
    #[allow(clippy::result_unit_err)]
    pub fn add_consumer(
        self: &Arc<Self>,
        c: Arc<QueueConsumer>,
        added: impl FnOnce(),
    ) -> Result<(), ()> {
        let mut st = lock(&self.st);
        if st.deleted
            || st.consumers.iter().any(|o| o.exclusive)
            || (c.exclusive && !st.consumers.is_empty())
        {
            return Err(());
        }
        st.consumers.push(c);
        st.had_consumer = true;
        st.used = Some(Instant::now());
        added();
        self.dispatch_locked(&mut st, None);
        Ok(())
    }

    /// Removes consumer `c`; true if the queue is now to be auto-deleted (marked deleted
    /// at once: a declare or consume from now on sees it gone; the caller deletes it).
    pub fn remove_consumer(&self, c: &Arc<QueueConsumer>) -> bool {
        let mut st = lock(&self.st);
        let before = st.consumers.len();
        st.consumers.retain(|o| !Arc::ptr_eq(o, c));
        if st.next >= st.consumers.len() {
            st.next = 0;
        }
        st.used = Some(Instant::now());
        let gone = before != st.consumers.len()
            && self.cfg.auto_delete
            && st.had_consumer
            && st.consumers.is_empty()
            && !st.deleted;
        st.deleted |= gone;
        gone
    }

    /// An acknowledgement of one of its deliveries: it leaves for good, credit back.
    pub fn settled(self: &Arc<Self>, u: &Unacked) {
        if let Some(c) = &u.consumer {
            c.in_flight.fetch_sub(1, Ordering::AcqRel);
        }
        self.forget(&u.item);
        let mut st = lock(&self.st);
        st.unacked_bytes = st.unacked_bytes.saturating_sub(u.item.size());
        st.unacked = st.unacked.saturating_sub(1);
        self.dispatch_locked(&mut st, None);
    }

    /// A delivery given back: to its place (redelivered), or dead-lettered. Not
    /// dispatched: see [`give_back_all`].
    fn take_back(self: &Arc<Self>, u: Unacked, requeue: bool) {
        if let Some(c) = &u.consumer {
            c.in_flight.fetch_sub(1, Ordering::AcqRel);
        }
        {
            let mut st = lock(&self.st);
            st.unacked_bytes = st.unacked_bytes.saturating_sub(u.item.size());
            st.unacked = st.unacked.saturating_sub(1);
        }
        let mut m = u.item;
        if requeue && self.cfg.count_returns {
            // Returns are counted and, past the delivery limit, the message is
            // dead-lettered instead.
            m.returns = m.returns.saturating_add(1);
            if let (Some((s, _)), Some(id)) = (&self.store, m.stored) {
                s.note_return(id, m.returns);
            }
            if self.cfg.delivery_limit.is_some_and(|l| m.returns > l) {
                self.dead_letter_all(vec![m], Reason::DeliveryLimit);
                return;
            }
        }
        if requeue {
            m.redelivered = true;
            self.requeue_in_place(m);
        } else {
            self.dead_letter_all(vec![m], Reason::Rejected);
        }
    }
}
