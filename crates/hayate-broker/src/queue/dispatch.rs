//! Consumers and dispatch: a queue's [`QueueConsumer`]s and their [`QueueSink`]s, how
//! messages go out to them (round robin within credit, a consumer with a backed-up outbox
//! skipped, `get`), and how deliveries come back ([`Unacked`]: acknowledged, or given
//! back in place or dead-lettered, [`give_back_all`]).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Instant;

use hayate_core::sync::lock;
use hayate_flow::ledger::{Claim, Outcome};

use super::{QItem, QState, Queue, Reason, Settle};
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
    /// Writes one delivery (`item` stays in the queue's ledger), under the queue's lock.
    /// Unless `d.no_ack`, keeps `(d.queue, d.consumer, d.id)` (an [`Unacked`]) until it is
    /// settled and says true; false when it kept nothing (its outbox closed: the queue
    /// settles it). A delivery made for a publishing session leaves its outbox in
    /// `to_flush` (see [`Outbox::push_control_buf_in`]).
    fn deliver(&self, d: Delivered<'_>, item: &QItem, to_flush: ToFlush<'_>) -> bool;
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
    /// Its id in the queue's ledger (0 with `no_ack`: settled as written).
    pub id: u64,
    /// A get's messages left behind it.
    pub left: Option<u32>,
    pub no_ack: bool,
    /// Delivered before (given back since, or read back from a store).
    pub redelivered: bool,
    /// Times given back, in a queue that counts them (`count_returns`; 0 otherwise).
    pub returns: u32,
}

/// The ids of consumers (the owners of their deliveries in a queue's ledger; 0 is a get's).
static NEXT_CONSUMER: AtomicU64 = AtomicU64::new(1);

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
    /// Its deliveries' owner in the ledger.
    id: u64,
}

impl QueueConsumer {
    pub fn new(sink: Arc<dyn QueueSink>, no_ack: bool, exclusive: bool, prefetch: usize) -> Self {
        QueueConsumer {
            sink,
            no_ack,
            exclusive,
            prefetch,
            in_flight: AtomicUsize::new(0),
            id: NEXT_CONSUMER.fetch_add(1, Ordering::Relaxed),
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

/// A delivery waiting for its acknowledgement (kept by the sink; its item is in the
/// queue's ledger under `id`).
#[derive(Debug, Clone)]
pub struct Unacked {
    pub queue: Arc<Queue>,
    /// The consumer it was delivered to (none: a get).
    pub consumer: Option<Arc<QueueConsumer>>,
    pub id: u64,
}

/// Gives back deliveries taken together (a nack of several, a recover, a channel closed):
/// each goes back to its place in its queue, redelivered (`requeue`), or is
/// dead-lettered, and only once all are back does each queue dispatch (once). So they are
/// redelivered in their original order whatever order they come in. The consumer that gave
/// them back is the last one its queue's round robin offers them to (a NACK reaches
/// another consumer when one has credit).
pub fn give_back_all(items: impl IntoIterator<Item = Unacked>, requeue: bool) {
    let how = if requeue {
        Settle::Requeue
    } else {
        Settle::Reject
    };
    give_back(items, how);
}

/// Gives back deliveries taken together to wait `delay` (a native NACK's `delay_ms`):
/// each is ready again, in its place and redelivered, once its time comes (the queue's
/// task promotes it and dispatches); meanwhile it counts in the queue's bytes. A zero
/// delay is [`give_back_all`]'s requeue.
pub fn give_back_after(items: impl IntoIterator<Item = Unacked>, delay: std::time::Duration) {
    if delay.is_zero() {
        give_back(items, Settle::Requeue);
    } else {
        give_back(items, Settle::RequeueAfter(delay));
    }
}

fn give_back(items: impl IntoIterator<Item = Unacked>, how: Settle) {
    let mut queues: Vec<(Arc<Queue>, Option<Arc<QueueConsumer>>)> = Vec::new();
    for u in items {
        match queues.iter_mut().find(|(q, _)| Arc::ptr_eq(q, &u.queue)) {
            Some((_, c)) => c.clone_from(&u.consumer),
            None => queues.push((u.queue.clone(), u.consumer.clone())),
        }
        let q = u.queue.clone();
        q.take_back(u, how);
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

    /// Makes the delayed messages whose time has come ready again (in their places; the
    /// clock is read only if some are delayed), their body bytes counted again.
    pub(super) fn promote_due(st: &mut QState, now: &mut Option<Instant>) {
        if st.ledger.delayed_len() == 0 {
            return;
        }
        let now = *now.get_or_insert_with(Instant::now);
        let body: usize = st
            .ledger
            .delayed()
            .take_while(|(at, _)| *at <= now)
            .map(|(_, m)| m.msg.payload.len())
            .sum();
        st.ledger.promote(now);
        st.body_bytes += body;
    }

    /// Takes the expired messages at the heads of the ready lists into `expired` (the
    /// clock is read only if some head has an expiry).
    fn expire_heads(st: &mut QState, now: &mut Option<Instant>, expired: &mut Vec<QItem>) {
        let gone = st.ledger.expire_ready(|m| {
            m.expires
                .is_some_and(|at| *now.get_or_insert_with(Instant::now) >= at)
        });
        for m in gone {
            st.body_bytes -= m.msg.payload.len();
            expired.push(m);
        }
    }

    pub(super) fn dispatch_locked(self: &Arc<Self>, st: &mut QState, mut to_flush: ToFlush<'_>) {
        let mut now = None;
        // Set again below if a consumer is still skipped; the task is woken only when the
        // queue starts to be stalled.
        let was_stalled = std::mem::take(&mut st.stalled);
        let mut expired = Vec::new();
        Self::promote_due(st, &mut now);
        loop {
            Self::expire_heads(st, &mut now, &mut expired);
            if st.ledger.ready_len() == 0 || st.consumers.is_empty() {
                break;
            }
            let Some(at) = Self::pick(st) else { break };
            st.next = (at + 1) % st.consumers.len();
            let c = st.consumers[at].clone();
            if !self.deliver(
                st,
                &c.sink,
                Some(&c),
                None,
                c.no_ack,
                to_flush.as_deref_mut(),
            ) {
                break;
            }
        }
        let held = st.ledger.held_bytes();
        st.charge.shrink(held);
        if st.stalled && !was_stalled {
            self.wake.notify_one();
        }
        self.dead_letter_all(expired, Reason::Expired);
    }

    /// Writes the next ready message through `sink` to consumer `c` (none: a get, with
    /// `left`) under the queue's lock; false when there was none.
    fn deliver(
        self: &Arc<Self>,
        st: &mut QState,
        sink: &Arc<dyn QueueSink>,
        c: Option<&Arc<QueueConsumer>>,
        left: Option<u32>,
        no_ack: bool,
        to_flush: ToFlush<'_>,
    ) -> bool {
        let mut d = Delivered {
            queue: self,
            consumer: c,
            id: 0,
            left,
            no_ack,
            redelivered: false,
            returns: 0,
        };
        if no_ack {
            // Settled as written: never in flight.
            let Some(m) = st.ledger.pop_ready() else {
                return false;
            };
            st.body_bytes -= m.msg.payload.len();
            d.redelivered = m.redelivered;
            d.returns = if self.cfg.count_returns { m.returns } else { 0 };
            sink.deliver(d, &m, to_flush);
            self.forget(&m);
            return true;
        }
        // No ack wait: the claim does not read the clock.
        let owner = c.map_or(0, |c| c.id);
        let Some(Claim::Deliver {
            id, item, returns, ..
        }) = st.ledger.claim(owner, self.born)
        else {
            return false;
        };
        let size = item.size();
        st.body_bytes -= item.msg.payload.len();
        d.id = id;
        d.redelivered = item.redelivered;
        d.returns = if self.cfg.count_returns { returns } else { 0 };
        if sink.deliver(d, item, to_flush) {
            st.unacked_bytes += size;
            if let Some(c) = c {
                c.in_flight.fetch_add(1, Ordering::AcqRel);
            }
        } else if let Some(m) = st.ledger.ack(id) {
            self.forget(&m);
        }
        true
    }

    /// A get: the next message through `sink` (`no_ack`: settled at once); false when
    /// there is none.
    pub fn get(self: &Arc<Self>, sink: &Arc<dyn QueueSink>, no_ack: bool) -> bool {
        let mut st = lock(&self.st);
        st.used = Some(Instant::now());
        let mut expired = Vec::new();
        let mut now = None;
        Self::promote_due(&mut st, &mut now);
        Self::expire_heads(&mut st, &mut now, &mut expired);
        let left = st.ledger.ready_len().saturating_sub(1) as u32;
        let got = self.deliver(&mut st, sink, None, Some(left), no_ack, None);
        let held = st.ledger.held_bytes();
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

    /// Delivery `u` leaves flight: its bytes and its consumer's credit back; the item's
    /// size, or `None` if it was not in flight.
    fn land(st: &mut QState, u: &Unacked) -> Option<usize> {
        let size = st.ledger.get(u.id)?.size();
        st.unacked_bytes = st.unacked_bytes.saturating_sub(size);
        if let Some(c) = &u.consumer {
            c.in_flight.fetch_sub(1, Ordering::AcqRel);
        }
        Some(size)
    }

    /// An acknowledgement of one of its deliveries: it leaves for good, credit back.
    pub fn settled(self: &Arc<Self>, u: &Unacked) {
        let mut st = lock(&self.st);
        if Self::land(&mut st, u).is_some()
            && let Some(m) = st.ledger.ack(u.id)
        {
            self.forget(&m);
        }
        self.dispatch_locked(&mut st, None);
    }

    /// A delivery given back: to its place (redelivered), or dead-lettered (rejected, or
    /// past the delivery limit). Not dispatched: see [`give_back_all`].
    fn take_back(self: &Arc<Self>, u: Unacked, how: Settle) {
        let mut st = lock(&self.st);
        if Self::land(&mut st, &u).is_none() {
            return;
        }
        // Its returns so far (shown on a dead letter of a queue that counts them), and with
        // this one.
        let so_far = st.ledger.flight(u.id).map_or(0, |f| f.returns);
        let returns = so_far + 1;
        let Some(m) = st.ledger.get_mut(u.id) else {
            return;
        };
        m.redelivered = true;
        if self.cfg.count_returns {
            m.returns = so_far;
        }
        let (body, stored) = (m.msg.payload.len(), m.stored);
        if st.deleted {
            // Nowhere to go back to.
            if let Some(m) = st.ledger.ack(u.id) {
                self.forget(&m);
            }
            return;
        }
        let delayed = matches!(how, Settle::RequeueAfter(_));
        if how != Settle::Reject
            && self.cfg.count_returns
            && let (Some((s, _)), Some(id)) = (&self.store, stored)
        {
            // Counted in the store too (`x-delivery-count` survives a restart).
            s.note_return(id, returns);
        }
        // A delay reads the clock (its time is now + delay).
        let now = if delayed { Instant::now() } else { self.born };
        match st.ledger.settle(u.id, how, now) {
            Outcome::Delayed => {
                let held = st.ledger.held_bytes();
                st.charge.force(held);
                drop(st);
                // The task sleeps until the earliest delayed item is due.
                self.wake.notify_one();
            }
            Outcome::Requeued => {
                st.body_bytes += body;
                let held = st.ledger.held_bytes();
                st.charge.force(held);
            }
            Outcome::DeadLetter(mut m, why) => {
                drop(st);
                if why == Reason::DeliveryLimit {
                    m.returns = returns;
                }
                self.dead_letter_all(vec![m], why);
            }
            Outcome::Done(m) => self.forget(&m),
            Outcome::Unknown => {}
        }
    }
}
