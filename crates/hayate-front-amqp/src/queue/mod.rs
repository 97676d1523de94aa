//! AMQP queues: messages held in order until a consumer takes them, as RabbitMQ's classic
//! queues do, fed by broker subscriptions (the queue's bindings).
//!
//! Each queue has a broker [`Session`] of its own whose subscriptions are its bindings
//! (the default exchange's binding to its own key included); the session's encoder
//! ([`QueueEncoder`]) does not encode bytes: it appends each message it is given to the
//! queue and hands what it can to consumers at once. So a message published by any
//! protocol on a key a binding covers enters the queue (once, however many of its bindings
//! and routes cover it: [`Taken`]). Routes are the bindings exchange-to-exchange bindings
//! lead to ([`Binding`], [`Queue::set_routes`]).
//!
//! A delivery is written straight into the consumer connection's outbox (AMQP frames).
//! Consumers are served round robin, each within its prefetch (and its channel's); a
//! consumer whose outbox is backed up is skipped until it drains (the queue's task looks
//! again every few milliseconds while one is).
//!
//! Locks, in order: the queue session's outbox (publishers offering) → [`Queue`]'s state →
//! a channel's state ([`Chan`]) → the consumer connection's outbox (a leaf). Nothing takes
//! them the other way round: acknowledgements take a channel's state, release it, then a
//! queue's.
//!
//! # Layout
//! - this module: [`Queue`] (its state, limits, the memory budget, its task), messages in
//!   and out of it, purge and delete;
//! - `msgs`: a message in a queue ([`QMsg`]) and the ready messages' FIFOs (`Msgs`);
//! - `args`: [`QueueArgs`], the `x-` arguments of queue.declare;
//! - `binding`: bindings and routes ([`Binding`], [`Hop`], [`Route`]);
//! - `consumer`: channels' delivery state ([`Chan`], [`Unacked`]), [`Consumer`]s and
//!   dispatch;
//! - `giveback`: deliveries given back ([`give_back_all`]) and dead-lettering;
//! - `encoder`: [`QueueEncoder`], what the queue's session is given, and [`ROUTED`], what
//!   queues did with a publish.

mod args;
mod binding;
mod consumer;
mod encoder;
mod giveback;
mod msgs;

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use hayate_broker::{Outbox, Session};
use hayate_core::sync::lock;
use hayate_io::memory::Charge;

use super::store::Store;
pub(crate) use args::QueueArgs;
pub(crate) use binding::{Binding, Hop, Route, route_id};
use consumer::OUTBOX_LIMIT;
pub(crate) use consumer::{Chan, ChanState, Consumer, Unacked};
pub(crate) use encoder::{QueueEncoder, ROUTED, Routed, Taken};
use encoder::{note_refused, note_stored};
use giveback::set_delivery_count;
pub(crate) use giveback::{EXPIRED, MAXLEN, REJECTED, give_back_all};
use msgs::Msgs;
pub(crate) use msgs::{QMsg, persistent};

/// Bindings per queue, at most.
pub(crate) const MAX_BINDINGS: usize = 4096;

/// Routes (derived bindings, through exchange-to-exchange bindings) per queue, at most.
pub(crate) const MAX_ROUTES: usize = 1024;

/// The cost of one queue's routes (`super::route_cost`: one per route and per hop of each
/// of its paths), at most.
pub(crate) const MAX_ROUTE_COST: usize = 8192;

/// Queue state under its lock.
#[derive(Debug, Default)]
struct QState {
    msgs: Msgs,
    /// What the ready messages cost (`QMsg::size`): the memory budget, `queue_max_bytes`.
    bytes: usize,
    /// The ready messages' body bytes: what `x-max-length-bytes` counts, as in RabbitMQ.
    body_bytes: usize,
    consumers: Vec<Arc<Consumer>>,
    /// Round robin: where the next delivery starts looking.
    next: usize,
    /// Sorted by sid.
    bindings: Vec<Binding>,
    /// The last sid given (see [`Queue::add_binding`]).
    next_sid: u32,
    deleted: bool,
    /// Some consumer was skipped because its outbox was backed up.
    stalled: bool,
    /// The outboxes of the consumers skipped (the task waits for one to drain).
    stalled_on: Vec<Arc<Outbox>>,
    /// A consumer existed once (auto-delete applies from then on).
    had_consumer: bool,
    /// The place of the next message in.
    next_seq: u64,
    /// When the queue was last used (x-expires): declared, consumed from, got from.
    used: Option<Instant>,
    /// Bytes of its deliveries not yet acknowledged (still charged to the memory budget).
    unacked_bytes: usize,
}

/// A queue.
pub(crate) struct Queue {
    /// Its virtual host (registry, key prefix).
    pub(crate) vhost: Arc<super::VHost>,
    pub(crate) name: String,
    pub(crate) durable: bool,
    pub(crate) auto_delete: bool,
    /// The connection that declared it exclusive.
    pub(crate) owner: Option<u64>,
    pub(crate) args: QueueArgs,
    /// Bytes a queue holds at most (`amqp.queue_max_bytes`), whatever its arguments say.
    max_bytes: usize,
    st: Mutex<QState>,
    /// Its share of the broker-wide memory budget.
    charge: Mutex<Charge>,
    /// The broker session whose subscriptions are its bindings.
    session: Mutex<Option<Session>>,
    /// Messages dropped (length limits, the memory budget).
    pub(crate) dropped: AtomicU64,
    /// Wakes the queue's task (a stalled consumer to look at again, expiry).
    wake: Arc<tokio::sync::Notify>,
    /// Where dead letters go, in order, when the queue has a dead-letter exchange: the
    /// queue of its dead-letter task.
    dead: Mutex<Option<tokio::sync::mpsc::Sender<(QMsg, &'static str)>>>,
    /// A durable queue's store and number there (persistent messages are kept in it).
    pub(crate) store: Option<(Arc<Store>, u64)>,
    /// The cost of its routes (`super::route_cost`), counted in its vhost's too until it is
    /// deleted.
    route_cost: AtomicUsize,
}

impl std::fmt::Debug for Queue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Queue")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

impl Queue {
    /// A queue with its broker session (opened by the caller with a [`QueueEncoder`] for
    /// it: see [`Queue::attach`]).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        vhost: Arc<super::VHost>,
        name: String,
        durable: bool,
        auto_delete: bool,
        owner: Option<u64>,
        args: QueueArgs,
        max_bytes: usize,
        memory: &Arc<hayate_io::memory::Memory>,
        store: Option<(Arc<Store>, u64)>,
    ) -> Arc<Queue> {
        Arc::new(Queue {
            vhost,
            name,
            durable,
            auto_delete,
            owner,
            args,
            max_bytes,
            st: Mutex::new(QState {
                used: Some(Instant::now()),
                ..QState::default()
            }),
            charge: Mutex::new(Charge::exact(memory)),
            session: Mutex::new(None),
            dropped: AtomicU64::new(0),
            wake: Arc::new(tokio::sync::Notify::new()),
            dead: Mutex::new(None),
            store,
            route_cost: AtomicUsize::new(0),
        })
    }

    /// Message `m` leaves the queue for good: its record (if any) is settled.
    fn forget(&self, m: &QMsg) {
        if let (Some((s, _)), Some(o)) = (&self.store, m.stored) {
            s.settle(o);
        }
    }

    /// Puts messages read back from the store into the (new, durable) queue, in order.
    pub(crate) fn restore(self: &Arc<Self>, msgs: Vec<QMsg>) {
        let mut st = lock(&self.st);
        for mut m in msgs {
            st.next_seq += 1;
            m.seq = st.next_seq;
            if m.returns > 0 {
                set_delivery_count(&mut m);
            }
            if self.args.max_priority.is_none() {
                m.priority = 0;
            }
            st.bytes += m.size();
            st.body_bytes += m.msg.payload.len();
            st.msgs.push_back(m);
        }
        let held = st.bytes;
        lock(&self.charge).force(held);
    }

    /// Gives the queue its broker session and starts its task.
    pub(crate) fn attach(self: &Arc<Self>, session: Session) {
        *lock(&self.session) = Some(session);
        let weak = Arc::downgrade(self);
        tokio::spawn(async move { run(weak).await });
    }

    /// Messages ready (not delivered), and consumers.
    pub(crate) fn counts(&self) -> (u32, u32) {
        let st = lock(&self.st);
        (st.msgs.len() as u32, st.consumers.len() as u32)
    }

    /// True once deleted.
    pub(crate) fn is_deleted(&self) -> bool {
        lock(&self.st).deleted
    }

    /// Appends a message (from a binding, or requeued at the front) and delivers what it
    /// can.
    pub(crate) fn push(self: &Arc<Self>, m: QMsg, front: bool) {
        self.put(m, front, true);
    }

    /// [`Queue::push`]; without `dispatch`, the message is only put in its place (a
    /// give-back of several: they are all put back, then the queue dispatches once).
    fn put(self: &Arc<Self>, m: QMsg, front: bool, dispatch: bool) {
        let mut st = lock(&self.st);
        if st.deleted {
            drop(st);
            self.forget(&m);
            return;
        }
        let size = m.size();
        let body = m.msg.payload.len();
        let max_len = self.args.max_length;
        let max_body = self.args.max_length_bytes;
        let mut dead = Vec::new();
        // Room by the queue's limits: the oldest go (drop-head), or this one is refused.
        // `x-max-length-bytes` counts bodies, as RabbitMQ does; `amqp.queue_max_bytes` what
        // the messages cost the process.
        while !front
            && !st.msgs.is_empty()
            && (max_len.is_some_and(|n| st.msgs.len() >= n)
                || max_body.is_some_and(|b| st.body_bytes + body > b)
                || st.bytes + size > self.max_bytes)
        {
            if self.args.reject_publish {
                drop(st);
                note_refused();
                if self.args.reject_publish_dlx {
                    self.dead_letter_all(vec![m], MAXLEN);
                } else {
                    self.dropped.fetch_add(1, Ordering::Relaxed);
                }
                return;
            }
            if let Some(old) = st.msgs.pop_front() {
                st.bytes -= old.size();
                st.body_bytes -= old.msg.payload.len();
                dead.push(old);
            }
        }
        if max_len == Some(0) {
            dead.push(m);
            drop(st);
            self.dead_letter_all(dead, MAXLEN);
            return;
        }
        // And by the broker-wide budget (a requeued message is held already: forced).
        {
            let mut c = lock(&self.charge);
            let held = st.bytes + st.unacked_bytes;
            if front {
                c.force(held + size);
            } else if !c.cover(held + size) {
                c.shrink(held);
                drop(c);
                drop(st);
                note_refused();
                dead.push(m);
                self.dead_letter_all(dead, MAXLEN);
                return;
            }
        }
        let mut m = m;
        // A persistent message entering a durable queue is written to its store first
        // (the publisher's confirm waits until it is durable). If it cannot be, the
        // publisher is told (basic.nack) and the message is still delivered.
        if !front
            && let Some((store, id)) = &self.store
            && (self.args.quorum || persistent(&m.msg))
        {
            match store.append(*id, &m) {
                Ok(o) => {
                    m.stored = Some(o);
                    note_stored(store, o);
                }
                Err(e) => {
                    tracing::error!(queue = %self.name, "amqp: cannot store a persistent message: {e}");
                    note_refused();
                }
            }
        }
        st.bytes += size;
        st.body_bytes += body;
        if !front {
            st.next_seq += 1;
            m.seq = st.next_seq;
        }
        let new = (!front).then_some((m.priority, m.seq));
        if front {
            st.msgs.insert_in_place(m);
        } else {
            st.msgs.push_back(m);
        }
        if dispatch {
            self.dispatch_locked(&mut st);
        }
        // Still here (no consumer took it at once): it may stay long, so it gets
        // allocations of its own instead of pinning the read buffer it came in.
        if let Some((priority, seq)) = new
            && let Some(m) = st.msgs.get_mut(priority, seq)
        {
            m.msg = m.msg.compact();
        }
        drop(st);
        self.dead_letter_all(dead, MAXLEN);
    }

    /// Removes every message; how many there were.
    pub(crate) fn purge(&self) -> u32 {
        let mut st = lock(&self.st);
        let n = st.msgs.len() as u32;
        self.forget_all(&mut st);
        st.bytes = 0;
        st.body_bytes = 0;
        lock(&self.charge).shrink(st.unacked_bytes);
        n
    }

    /// Empties the ready messages, settling their records.
    fn forget_all(&self, st: &mut QState) {
        if self.store.is_some() {
            while let Some(m) = st.msgs.pop_front() {
                self.forget(&m);
            }
        }
        st.msgs.clear();
    }

    /// Marks the queue deleted, ends its bindings and takes its consumers (the caller
    /// tells them); the number of messages it held.
    pub(crate) fn delete(&self) -> (u32, Vec<Arc<Consumer>>) {
        let (n, consumers) = {
            let mut st = lock(&self.st);
            st.deleted = true;
            let n = st.msgs.len() as u32;
            self.forget_all(&mut st);
            st.bytes = 0;
            st.body_bytes = 0;
            st.bindings.clear();
            (n, std::mem::take(&mut st.consumers))
        };
        lock(&self.charge).shrink(0);
        if let Some((store, id)) = &self.store
            && let Err(e) = store.remove_queue(&self.name, *id)
        {
            tracing::error!(queue = %self.name, "amqp: durable queue deleted but not from its store: {e}");
        }
        // Dropping the session removes its subscriptions (outside the session's mutex). Its
        // routes stop counting against the vhost's (under that mutex, as set_routes counts).
        let session = {
            let mut guard = lock(&self.session);
            let cost = self.route_cost.swap(0, Ordering::AcqRel);
            self.vhost.route_cost.fetch_sub(cost, Ordering::AcqRel);
            guard.take()
        };
        drop(session);
        self.wake.notify_one();
        (n, consumers)
    }

    /// Unused (no consumer, no basic.get) for longer than x-expires?
    pub(crate) fn expired(&self) -> bool {
        let Some(ttl) = self.args.expires else {
            return false;
        };
        let st = lock(&self.st);
        st.consumers.is_empty() && st.used.is_some_and(|u| u.elapsed() >= ttl)
    }

    /// Marks the queue used now (declared again: x-expires counts from here).
    pub(crate) fn touch(&self) {
        lock(&self.st).used = Some(Instant::now());
    }
}

/// The queue's task: looks again at stalled consumers and expired messages, and ends when
/// the queue is deleted.
async fn run(q: Weak<Queue>) {
    loop {
        let Some(queue) = q.upgrade() else { return };
        let wake = queue.wake.clone();
        let notified = wake.notified();
        let stalled_on = {
            let mut st = lock(&queue.st);
            if st.deleted {
                return;
            }
            if st.stalled {
                std::mem::take(&mut st.stalled_on)
            } else {
                st.stalled_on.clear();
                Vec::new()
            }
        };
        drop(queue);
        if stalled_on.is_empty() {
            let _ = tokio::time::timeout(Duration::from_secs(1), notified).await;
        } else {
            // Until a skipped consumer's writer takes what its outbox holds (registered
            // before looking again, so the wake-up cannot be missed), or 50 ms.
            let mut waits: Vec<_> = stalled_on
                .iter()
                .map(|o| Box::pin(o.wait_space()))
                .collect();
            for w in &mut waits {
                w.as_mut().enable();
            }
            let drained = stalled_on.iter().any(|o| o.backlog().0 <= OUTBOX_LIMIT);
            if !drained {
                let _ = tokio::time::timeout(
                    Duration::from_millis(50),
                    futures::future::select_all(waits),
                )
                .await;
            }
        }
        // Expired messages at the head go even without a consumer to see them; a queue
        // unused past its x-expires goes.
        if let Some(queue) = q.upgrade() {
            queue.dispatch();
            if queue.expired() {
                super::conn::delete_queue(&queue);
                return;
            }
        }
    }
}
