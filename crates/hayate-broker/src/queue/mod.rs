//! Queues, a broker noun: messages held in order until a consumer takes them, with the
//! classic semantics of RabbitMQ's queues (requeue in place, priorities, TTL at the head,
//! length and byte limits with an overflow policy, dead letters, exclusive, auto-delete
//! and expiring queues, consumers with credit).
//!
//! The engine names no protocol: a front-end feeds a queue ([`Queue::offer`]), turns its
//! consumers into [`QueueSink`]s (which write deliveries into their outboxes), builds its
//! dead letters ([`DeadLetterer`]) and may keep its messages in a [`QueueStore`].
//!
//! Locks, in order: a queue's state (its ready messages, consumers and its share of the
//! memory budget, all under one mutex) → a sink's own state (AMQP: its channel's) → the
//! consumer's outbox (a leaf) and the store. Nothing takes them the other way round:
//! acknowledgements take a sink's state, release it, then the queue's. The broker's queue
//! table ([`crate::Broker::queues`]) is a leaf.
//!
//! # Layout
//! - this module: [`Queue`], its identity and configuration, counts, purge and delete, its
//!   task (stalled consumers, expiry, x-expires);
//! - `limits`: a message in ([`Queue::offer`]): overflow, the memory budget, the store;
//! - `dispatch`: consumers ([`QueueConsumer`], [`QueueSink`]), round robin within credit,
//!   `get`, settling and giving back ([`Unacked`], [`give_back_all`]);
//! - `dead`: dead letters ([`Reason`], [`DeadLetterer`], the queue's dead-letter task);
//! - `bind`: bindings in the broker's route table ([`BindingFilter`]), a publish offered
//!   to the queues its route reaches ([`Routed`]);
//! - `registry`: the broker's table of queues ([`QueueView`]);
//! - `store`: durable queues' messages and definitions ([`store::Store`]).

mod bind;
mod dead;
mod dispatch;
mod limits;
mod registry;
pub mod store;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::{Duration, Instant};

use bytes::Bytes;
use hayate_core::Message;
use hayate_core::sync::lock;
use hayate_flow::ledger::{Ledger, Policy};
use hayate_flow::memory::{Charge, Memory};

use crate::Outbox;
pub(crate) use bind::QueueRoute;
pub use bind::{BindingFilter, Routed};
pub use dead::{DEAD_LETTER_BACKLOG, DeadLetterer};
pub use dispatch::{
    Delivered, OUTBOX_LIMIT, QueueConsumer, QueueSink, ToFlush, Unacked, give_back_after,
    give_back_all,
};
pub use hayate_flow::ledger::{Reason, Settle};
pub use limits::Offered;
pub use registry::{ImplicitError, MAX_IMPLICIT_QUEUES, QueueView};

/// A queue's name: its namespace (`""`: the default one) and its name there.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct QueueId {
    pub ns: Arc<str>,
    pub name: Arc<str>,
}

/// What a queue does with a message that finds it full.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Overflow {
    /// The oldest messages go (dead-lettered, [`Reason::MaxLen`]).
    #[default]
    DropHead,
    /// The new message is refused ([`Offered::refused`]).
    RejectPublish,
    /// The new message is refused and dead-lettered.
    RejectPublishDeadLetter,
}

/// How a queue behaves (fixed when it is made).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueConfig {
    pub durable: bool,
    /// Deleted when its last consumer leaves (once it had one).
    pub auto_delete: bool,
    /// Exclusive to this connection (an opaque id of the front-end's).
    pub owner: Option<u64>,
    /// Deleted once unused (no consumer, no get) this long.
    pub expires: Option<Duration>,
    /// Messages expire this long after they enter (or at their own expiry, if sooner).
    pub message_ttl: Option<Duration>,
    /// Most ready messages.
    pub max_length: Option<usize>,
    /// Most body bytes of the ready messages.
    pub max_body_bytes: Option<usize>,
    /// Most bytes the ready messages may cost the process ([`QItem::size`]).
    pub max_bytes: usize,
    pub overflow: Overflow,
    /// A priority queue: message priorities 0 to this (higher count as this).
    pub max_priority: Option<u8>,
    /// Every message is kept in the store, persistent or not (quorum).
    pub persist_all: bool,
    /// Returns (requeues) are counted per message (quorum).
    pub count_returns: bool,
    /// With `count_returns`: a message returned more often is dead-lettered instead.
    pub delivery_limit: Option<u32>,
    /// Declared by a client (false: made implicitly by a first use).
    pub declared: bool,
    /// The declaring front-end's own arguments, opaque (equivalence, definitions).
    pub args: Bytes,
}

impl Default for QueueConfig {
    fn default() -> Self {
        QueueConfig {
            durable: false,
            auto_delete: false,
            owner: None,
            expires: None,
            message_ttl: None,
            max_length: None,
            max_body_bytes: None,
            max_bytes: usize::MAX,
            overflow: Overflow::DropHead,
            max_priority: None,
            persist_all: false,
            count_returns: false,
            delivery_limit: None,
            declared: true,
            args: Bytes::new(),
        }
    }
}

/// Where a message came from, as its deliveries show it (AMQP: the exchange and the
/// routing key; empty for the other protocols).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Via {
    /// At most 255 bytes.
    pub source: Bytes,
    /// At most 65,535 bytes.
    pub subject: Bytes,
}

/// A message in a queue (its place, deliveries and returns are the queue's ledger's).
#[derive(Debug, Clone)]
pub struct QItem {
    pub msg: Message,
    pub via: Via,
    /// Delivered before this process (read back from a store).
    pub redelivered: bool,
    /// When it expires (the queue's message TTL, or its own expiry).
    pub expires: Option<Instant>,
    /// Its priority in a priority queue (0 in any other).
    pub priority: u8,
    /// Its record in the queue's store, when it is kept there.
    pub stored: Option<u64>,
    /// Times consumers gave it back: as read back from a store, and as it leaves as a
    /// dead letter (the ledger counts them meanwhile).
    pub returns: u32,
}

impl QItem {
    /// What the message costs the process while a queue holds it (counted against
    /// `max_bytes` and charged to the memory budget; `max_body_bytes` counts the body
    /// alone): its data with their allocations (`footprint::data`), its `via`, and three
    /// `QItem`s of slot: ready, it sits in its priority's `VecDeque` of the queue's ledger
    /// (a `QItem` and 24 bytes of place and counts), which grows by doubling (at most two
    /// slots per message); in flight, in the ledger's `BTreeMap` (48 bytes more: owner and
    /// deadline, in nodes at least 5/11 full: at most 2.2 slots), and the front-end keeps
    /// an [`Unacked`] of three words.
    pub fn size(&self) -> usize {
        use crate::footprint::{ALLOC, data};
        data(&self.msg)
            + self.via.source.len()
            + self.via.subject.len()
            + 4 * ALLOC
            + 3 * std::mem::size_of::<QItem>()
    }
}

/// Is `m` persistent: a guarantee above at-most-once (MQTT QoS 1 or 2, AMQP delivery mode
/// 2), or a `persistent: true` header (STOMP, native)?
pub fn persistent(m: &Message) -> bool {
    m.attrs
        .guarantee
        .is_some_and(|g| g != hayate_core::Guarantee::AtMostOnce)
        || m.headers
            .iter()
            .flatten()
            .any(|(k, v)| k == "persistent" && v.eq_ignore_ascii_case(b"true"))
}

/// Where a durable queue keeps its messages (records appended when they enter, settled
/// when they leave). The store's format is its own.
pub trait QueueStore: std::any::Any + Send + Sync {
    /// Appends `item`, entering queue `queue` (its number in the store); its record's
    /// offset.
    fn append(&self, queue: u64, item: &QItem) -> Result<u64, String>;
    /// The record at `offset` left its queue for good.
    fn settle(&self, offset: u64);
    /// The message of record `offset` was returned `returns` times.
    fn note_return(&self, offset: u64, returns: u32);
    /// Queue `queue` (named `name`) is deleted.
    fn remove_queue(&self, name: &str, queue: u64) -> Result<(), String>;
}

/// Queue state under its lock.
struct QState {
    /// Ready messages (one FIFO per priority, requeue in place) and deliveries in flight
    /// (owner: the consumer, 0 for a get), with the quorum delivery limit as its
    /// `max_returns`.
    ledger: Ledger<QItem>,
    /// The ready messages' body bytes (`max_body_bytes`).
    body_bytes: usize,
    consumers: Vec<Arc<QueueConsumer>>,
    /// Round robin: where the next delivery starts looking.
    next: usize,
    deleted: bool,
    /// Some consumer was skipped because its outbox was backed up.
    stalled: bool,
    /// The outboxes of the consumers skipped (the task waits for one to drain).
    stalled_on: Vec<Arc<Outbox>>,
    /// A consumer existed once (auto-delete applies from then on).
    had_consumer: bool,
    /// When the queue was last used (x-expires): made, consumed from, got from.
    used: Option<Instant>,
    /// Bytes of its deliveries not yet acknowledged (still charged to the memory budget).
    unacked_bytes: usize,
    /// Its share of the broker-wide memory budget (ready and unacknowledged).
    charge: Charge,
}

/// A queue.
pub struct Queue {
    id: QueueId,
    cfg: QueueConfig,
    st: Mutex<QState>,
    /// Messages dropped (length limits, the memory budget, dead letters past their task's
    /// backlog).
    dropped: AtomicU64,
    /// Messages handed to the dead-letter task.
    dead_lettered: AtomicU64,
    /// Wakes the queue's task (a stalled consumer to look at again, expiry).
    wake: Arc<tokio::sync::Notify>,
    /// The queue of its dead-letter task, when it has a [`DeadLetterer`].
    dead: OnceLock<tokio::sync::mpsc::Sender<(QItem, Reason)>>,
    /// A durable queue's store and number there.
    store: Option<(Arc<dyn QueueStore>, u64)>,
    /// What deletes the queue when it expires (its front-end's delete, which also forgets
    /// what it keeps of the queue); the queue deletes itself without.
    on_expired: OnceLock<Box<dyn Fn() + Send + Sync>>,
    /// Its bindings' keys in the route table: `(space, bid)`, `space` drawn from the
    /// sessions' ids at the first binding.
    space: OnceLock<u64>,
    /// The last bid given, and those in use.
    binds: Mutex<(u32, std::collections::BTreeSet<u32>)>,
    /// When it was made: the `now` of ledger calls that do not need the clock (no ack
    /// wait, no delay).
    born: Instant,
}

impl std::fmt::Debug for Queue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Queue")
            .field("id", &self.id)
            .finish_non_exhaustive()
    }
}

impl Queue {
    /// A queue charging `memory`, with its task (needs a tokio runtime).
    pub fn new(
        id: QueueId,
        cfg: QueueConfig,
        memory: &Arc<Memory>,
        store: Option<(Arc<dyn QueueStore>, u64)>,
    ) -> Arc<Queue> {
        let policy = Policy {
            ack_wait: None,
            max_deliveries: 0,
            max_returns: cfg.delivery_limit.filter(|_| cfg.count_returns),
        };
        let q = Arc::new(Queue {
            id,
            cfg,
            st: Mutex::new(QState {
                ledger: Ledger::with_policy(1, policy),
                body_bytes: 0,
                consumers: Vec::new(),
                next: 0,
                deleted: false,
                stalled: false,
                stalled_on: Vec::new(),
                had_consumer: false,
                used: Some(Instant::now()),
                unacked_bytes: 0,
                charge: Charge::exact(memory),
            }),
            dropped: AtomicU64::new(0),
            dead_lettered: AtomicU64::new(0),
            wake: Arc::new(tokio::sync::Notify::new()),
            dead: OnceLock::new(),
            store,
            on_expired: OnceLock::new(),
            space: OnceLock::new(),
            binds: Mutex::new((0, std::collections::BTreeSet::new())),
            born: Instant::now(),
        });
        let weak = Arc::downgrade(&q);
        tokio::spawn(async move { run(weak).await });
        q
    }

    pub fn id(&self) -> &QueueId {
        &self.id
    }

    pub fn name(&self) -> &str {
        &self.id.name
    }

    pub fn config(&self) -> &QueueConfig {
        &self.cfg
    }

    /// Messages dropped so far.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

    /// Messages dead-lettered so far.
    pub fn dead_lettered(&self) -> u64 {
        self.dead_lettered.load(Ordering::Relaxed)
    }

    /// Counts `n` more messages dropped (a front-end lost them on their way in).
    pub fn note_dropped(&self, n: u64) {
        self.dropped.fetch_add(n, Ordering::Relaxed);
    }

    /// Sets what deletes the queue when it expires (once).
    pub fn set_on_expired(&self, f: Box<dyn Fn() + Send + Sync>) {
        let _ = self.on_expired.set(f);
    }

    /// Deletes the queue as its expiry does (through what [`Queue::set_on_expired`] set,
    /// else out of `broker`'s table): an auto-delete queue whose last consumer left through
    /// another front-end than the one that made it.
    pub fn delete_unused(self: &Arc<Self>, broker: &crate::Broker) {
        match self.on_expired.get() {
            Some(f) => f(),
            None => {
                broker.queue_delete(self);
            }
        }
    }

    /// A new message for this queue: its priority (a `priority` header, at most the
    /// queue's `max_priority`; 0 in any other queue) and its expiry (the queue's message
    /// TTL or its own, whichever comes first).
    pub fn item(&self, msg: Message, via: Via) -> QItem {
        let priority = self.cfg.max_priority.map_or(0, |max| {
            msg.headers
                .iter()
                .flatten()
                .find(|(k, _)| k == "priority")
                .and_then(|(_, v)| std::str::from_utf8(v).ok()?.trim().parse::<u64>().ok())
                .map_or(0, |p| p.min(u64::from(max)) as u8)
        });
        let expires = match (self.cfg.message_ttl, msg.attrs.expires) {
            (Some(ttl), Some(at)) => Some((Instant::now() + ttl).min(at)),
            (Some(ttl), None) => Some(Instant::now() + ttl),
            (None, at) => at,
        };
        QItem {
            msg,
            via,
            redelivered: false,
            expires,
            priority,
            stored: None,
            returns: 0,
        }
    }

    /// Item `m` leaves the queue for good: its record (if any) is settled.
    fn forget(&self, m: &QItem) {
        if let (Some((s, _)), Some(o)) = (&self.store, m.stored) {
            s.settle(o);
        }
    }

    /// Puts messages read back from the store into the (new, durable) queue, in order
    /// (forced into the memory budget: they are held already).
    pub fn restore(&self, items: Vec<QItem>) {
        let mut st = lock(&self.st);
        for mut m in items {
            if self.cfg.max_priority.is_none() {
                m.priority = 0;
            }
            st.body_bytes += m.msg.payload.len();
            let (size, priority, returns) = (m.size(), m.priority, m.returns);
            st.ledger.push_returned(m, size, priority, returns);
        }
        let held = st.ledger.held_bytes();
        st.charge.force(held);
    }

    /// Messages ready (not delivered), and consumers.
    pub fn counts(&self) -> (u32, u32) {
        let st = lock(&self.st);
        (st.ledger.ready_len() as u32, st.consumers.len() as u32)
    }

    /// True once deleted.
    pub fn is_deleted(&self) -> bool {
        lock(&self.st).deleted
    }

    /// Removes every ready message; how many there were.
    pub fn purge(&self) -> u32 {
        let mut st = lock(&self.st);
        Self::promote_all(&mut st);
        let n = st.ledger.ready_len() as u32;
        self.forget_all(&mut st);
        let held = st.ledger.held_bytes();
        st.charge.shrink(held);
        n
    }

    /// Empties the ready messages, settling their records (deliveries in flight stay
    /// until settled).
    fn forget_all(&self, st: &mut QState) {
        while let Some(m) = st.ledger.pop_ready() {
            self.forget(&m);
        }
        st.body_bytes = 0;
    }

    /// Makes every delayed message ready (a purge or a delete takes them too).
    fn promote_all(st: &mut QState) {
        let last = st.ledger.delayed().next_back().map(|(at, _)| at);
        if let Some(at) = last {
            Self::promote_due(st, &mut Some(at));
        }
    }

    /// What the ready messages cost ([`QItem::size`]): `max_bytes`.
    fn ready_bytes(st: &QState) -> usize {
        st.ledger.held_bytes().saturating_sub(st.unacked_bytes)
    }

    /// Marks the queue deleted (its store forgets it) and takes its consumers (each told
    /// through [`QueueSink::cancelled`]); the number of messages it held.
    pub fn delete(&self) -> u32 {
        let (n, consumers) = {
            let mut st = lock(&self.st);
            st.deleted = true;
            Self::promote_all(&mut st);
            let n = st.ledger.ready_len() as u32;
            self.forget_all(&mut st);
            st.charge.shrink(0);
            (n, std::mem::take(&mut st.consumers))
        };
        if let Some((store, id)) = &self.store
            && let Err(e) = store.remove_queue(&self.id.name, *id)
        {
            tracing::error!(queue = %self.id.name, "durable queue deleted but not from its store: {e}");
        }
        for c in consumers {
            c.sink.cancelled();
        }
        self.wake.notify_one();
        n
    }

    /// Unused (no consumer, no get) for longer than its `expires`?
    pub fn expired(&self) -> bool {
        let Some(ttl) = self.cfg.expires else {
            return false;
        };
        let st = lock(&self.st);
        st.consumers.is_empty() && st.used.is_some_and(|u| u.elapsed() >= ttl)
    }

    /// Marks the queue used now (`expires` counts from here).
    pub fn touch(&self) {
        lock(&self.st).used = Some(Instant::now());
    }
}

/// Waits until one of `outboxes` has room again, or `max`.
async fn any_space(outboxes: &[Arc<Outbox>], max: Duration) {
    let mut waits: Vec<_> = outboxes.iter().map(|o| Box::pin(o.wait_space())).collect();
    for w in &mut waits {
        w.as_mut().enable();
    }
    if outboxes.iter().any(|o| o.backlog().0 <= OUTBOX_LIMIT) {
        return;
    }
    let any = std::future::poll_fn(|cx| {
        for w in &mut waits {
            if w.as_mut().poll(cx).is_ready() {
                return std::task::Poll::Ready(());
            }
        }
        std::task::Poll::Pending
    });
    let _ = tokio::time::timeout(max, any).await;
}

/// The queue's task: looks again at stalled consumers, expired messages and delayed ones
/// due (a NACK's delay), and ends when
/// the queue is deleted (or expires: deleted then).
async fn run(q: Weak<Queue>) {
    loop {
        let Some(queue) = q.upgrade() else { return };
        let wake = queue.wake.clone();
        let notified = wake.notified();
        let (stalled_on, due) = {
            let mut st = lock(&queue.st);
            if st.deleted {
                return;
            }
            let due = st.ledger.next_due();
            let stalled_on = if st.stalled {
                std::mem::take(&mut st.stalled_on)
            } else {
                st.stalled_on.clear();
                Vec::new()
            };
            (stalled_on, due)
        };
        drop(queue);
        // Until the earliest delayed message (a NACK's delay) is due, at most 1 s.
        let wait = due.map_or(Duration::from_secs(1), |at| {
            at.saturating_duration_since(Instant::now())
                .min(Duration::from_secs(1))
        });
        if stalled_on.is_empty() {
            let _ = tokio::time::timeout(wait, notified).await;
        } else {
            // Until a skipped consumer's writer takes what its outbox holds (registered
            // before looking again, so the wake-up cannot be missed), or 50 ms.
            any_space(&stalled_on, wait.min(Duration::from_millis(50))).await;
        }
        // Expired messages at the head go even without a consumer to see them; a queue
        // unused past its expiry goes.
        if let Some(queue) = q.upgrade() {
            queue.dispatch();
            if queue.expired() {
                match queue.on_expired.get() {
                    Some(f) => f(),
                    None => {
                        queue.delete();
                    }
                }
                return;
            }
        }
    }
}
