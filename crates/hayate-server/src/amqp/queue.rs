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

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::{Duration, Instant};

use hayate_amqp::{FieldTable, FieldValue, ShortStr};
use hayate_broker::{Batch, Encoder, OutBuf, Outbox, Session};
use hayate_core::{Message, Qos};
use hayate_io::memory::Charge;

use super::delivery::{Delivery, encode_delivery};
use super::names::{self, Kind};
use super::store::Store;

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A message in a queue.
#[derive(Debug, Clone)]
pub(crate) struct QMsg {
    pub(crate) msg: Message,
    /// The exchange and routing key it is delivered with.
    pub(crate) exchange: ShortStr,
    pub(crate) routing_key: ShortStr,
    pub(crate) redelivered: bool,
    /// When it expires (x-message-ttl, or its own expiration).
    pub(crate) expires: Option<Instant>,
    /// Its place in the queue (set when it enters): a message given back goes back to it,
    /// as in RabbitMQ.
    pub(crate) seq: u64,
    /// Its priority in a queue with `x-max-priority` (the message's own, at most the
    /// queue's); 0 in any other queue.
    pub(crate) priority: u8,
    /// Its record in its durable queue's store, when it is kept there.
    pub(crate) stored: Option<u64>,
    /// Times it was given back (requeued) by consumers (a quorum queue's delivery limit).
    pub(crate) returns: u32,
}

/// Is `m` persistent: AMQP delivery mode 2 (STOMP's and native `persistent: true` header),
/// or MQTT QoS 1 or 2, as RabbitMQ's MQTT plugin counts them?
pub(crate) fn persistent(m: &Message) -> bool {
    m.attrs
        .guarantee
        .is_some_and(|g| g != hayate_core::Guarantee::AtMostOnce)
        || m.headers
            .iter()
            .flatten()
            .any(|(k, v)| k == "persistent" && v.eq_ignore_ascii_case(b"true"))
}

impl QMsg {
    /// What the message costs the process while a queue holds it (counted against
    /// `amqp.queue_max_bytes` and charged to the memory budget; `x-max-length-bytes`
    /// counts the body alone, as RabbitMQ does): its data with their
    /// allocations (`footprint::data`), its exchange and routing key, and three `QMsg`s of
    /// slot: ready, it sits in its priority's `VecDeque`, which grows by doubling (at most
    /// two slots per message); unacknowledged, in a channel's `BTreeMap` of `Unacked` (a
    /// `QMsg` and two pointers, in nodes at least 5/11 full: at most 2.5 slots).
    fn size(&self) -> usize {
        use hayate_broker::footprint::{ALLOC, data};
        data(&self.msg)
            + self.exchange.len()
            + self.routing_key.len()
            + 4 * ALLOC
            + 3 * std::mem::size_of::<QMsg>()
    }
}

/// What `x-` arguments of queue.declare set.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct QueueArgs {
    pub(crate) message_ttl: Option<Duration>,
    pub(crate) max_length: Option<usize>,
    pub(crate) max_length_bytes: Option<usize>,
    pub(crate) dead_letter_exchange: Option<String>,
    pub(crate) dead_letter_routing_key: Option<String>,
    pub(crate) expires: Option<Duration>,
    /// `x-overflow = reject-publish`: new messages are refused (dropped) instead of the
    /// oldest.
    pub(crate) reject_publish: bool,
    /// `x-overflow = reject-publish-dlx`: and dead-lettered.
    pub(crate) reject_publish_dlx: bool,
    /// `x-max-priority`: a priority queue, message priorities 0 to this (higher ones count
    /// as this).
    pub(crate) max_priority: Option<u8>,
    /// `x-queue-type = quorum`: every message is kept in the store (persistent or not), and
    /// `x-delivery-limit` applies. (One node: nothing is replicated.)
    pub(crate) quorum: bool,
    /// `x-delivery-limit` (quorum queues): a message given back more often than this is
    /// dead-lettered (or dropped) instead of requeued.
    pub(crate) delivery_limit: Option<u32>,
}

impl QueueArgs {
    /// Reads the arguments this broker knows; `Err` (PRECONDITION_FAILED's text) for a bad
    /// value. Unknown arguments are ignored, as RabbitMQ does.
    pub(crate) fn parse(t: &FieldTable) -> Result<QueueArgs, String> {
        let mut a = QueueArgs::default();
        let int = |name: &str, v: &FieldValue| -> Result<u64, String> {
            v.as_i64()
                .and_then(|n| u64::try_from(n).ok())
                .ok_or_else(|| format!("invalid arg '{name}' for queue: a non-negative integer"))
        };
        let text = |name: &str, v: &FieldValue| -> Result<String, String> {
            v.as_str()
                .map(str::to_string)
                .ok_or_else(|| format!("invalid arg '{name}' for queue: a string"))
        };
        for (k, v) in &t.0 {
            let Some(name) = k.as_str() else { continue };
            match name {
                "x-message-ttl" => a.message_ttl = Some(Duration::from_millis(int(name, v)?)),
                "x-expires" => {
                    let ms = int(name, v)?;
                    if ms == 0 {
                        return Err("invalid arg 'x-expires' for queue: must be positive".into());
                    }
                    a.expires = Some(Duration::from_millis(ms));
                }
                "x-max-length" => a.max_length = Some(int(name, v)? as usize),
                "x-max-priority" => match int(name, v)? {
                    n @ 1..=255 => a.max_priority = Some(n as u8),
                    _ => {
                        return Err("invalid arg 'x-max-priority' for queue: from 1 to 255".into());
                    }
                },
                "x-max-length-bytes" => a.max_length_bytes = Some(int(name, v)? as usize),
                "x-dead-letter-exchange" => a.dead_letter_exchange = Some(text(name, v)?),
                "x-dead-letter-routing-key" => {
                    a.dead_letter_routing_key = Some(text(name, v)?);
                }
                "x-overflow" => match text(name, v)?.as_str() {
                    "drop-head" => a.reject_publish = false,
                    "reject-publish" => a.reject_publish = true,
                    "reject-publish-dlx" => {
                        a.reject_publish = true;
                        a.reject_publish_dlx = true;
                    }
                    o => return Err(format!("invalid arg 'x-overflow' for queue: '{o}'")),
                },
                "x-queue-type" => match text(name, v)?.as_str() {
                    "classic" => {}
                    // A durable queue whose every message is stored, with a delivery limit:
                    // what a single-node RabbitMQ quorum queue is (nothing to replicate to).
                    "quorum" => a.quorum = true,
                    // RabbitMQ's streams are read by offset with their own protocol
                    // extensions: not this queue model.
                    o => {
                        return Err(format!(
                            "invalid arg 'x-queue-type' for queue: '{o}' (this broker has classic and quorum queues)"
                        ));
                    }
                },
                "x-delivery-limit" => {
                    a.delivery_limit = Some(u32::try_from(int(name, v)?).unwrap_or(u32::MAX));
                }
                _ => {}
            }
        }
        if !a.quorum {
            // As RabbitMQ: a classic queue has no delivery limit.
            a.delivery_limit = None;
        } else if a.max_priority.is_some() {
            return Err(
                "invalid arg 'x-max-priority' for queue of queue type quorum: priorities need a classic queue"
                    .into(),
            );
        }
        Ok(a)
    }
}

/// One binding of a queue: the exchange, its type, the binding key, its arguments, and the
/// broker subscription that implements it.
///
/// A binding a client made has no `via`. A route (a derived binding) has: it exists because
/// the queue is bound to an exchange that exchange-to-exchange bindings lead to from
/// `exchange` (the route's source, where its messages are published); its subscription is
/// the first of those bindings, and a message must also pass every hop of one of the paths
/// in `via` (the further exchange-to-exchange bindings, then the queue's own binding).
/// Routes are made, changed and removed by [`Queue::set_routes`] only; clients never see
/// them.
#[derive(Debug, Clone)]
pub(crate) struct Binding {
    pub(crate) exchange: String,
    /// The exchange's name as deliveries show it (made once, shared by every delivery).
    exchange_s: ShortStr,
    pub(crate) kind: Kind,
    pub(crate) key: String,
    pub(crate) args: FieldTable,
    pub(crate) sid: u32,
    pub(crate) via: Option<Arc<Vec<Vec<Hop>>>>,
    /// A client's binding: the guard of its maker's permissions (its subscription carries
    /// it too); routes into the binding check it in their last hop.
    pub(crate) guard: Option<Arc<dyn hayate_broker::KeyGuard>>,
}

/// A binding a message must pass on its way through exchange-to-exchange bindings: that of
/// exchange `exchange` (of `kind`) with `key` and `args`, matched as that exchange routes.
/// What the exchange's type ignores is left out (a fanout or headers exchange's key, the
/// arguments of any but a headers one), so bindings that route alike are equal.
#[derive(Debug, Clone)]
pub(crate) struct Hop {
    pub(crate) exchange: String,
    pub(crate) kind: Kind,
    pub(crate) key: String,
    pub(crate) args: FieldTable,
    /// The binding's expression (of the `/` mapping) for direct and topic exchanges.
    expr: Option<hayate_core::KeyExpr>,
    /// A queue's own binding (the last hop of a route): its maker's guard, asked about the
    /// key the message would have had if published to the hop's exchange (under the
    /// vhost's key prefix, `prefix`), so a route brings in only what the binding would.
    pub(crate) guard: Option<(Arc<dyn hayate_broker::KeyGuard>, String)>,
}

impl PartialEq for Hop {
    fn eq(&self, other: &Hop) -> bool {
        self.exchange == other.exchange
            && self.kind == other.kind
            && self.key == other.key
            && self.args == other.args
            && match (&self.guard, &other.guard) {
                (None, None) => true,
                (Some((a, p)), Some((b, q))) => Arc::ptr_eq(a, b) && p == q,
                _ => false,
            }
    }
}

impl Hop {
    pub(crate) fn new(exchange: &str, kind: Kind, key: &str, args: &FieldTable) -> Hop {
        let expr = match kind {
            Kind::Direct | Kind::Topic => names::binding_expr(exchange, kind, key),
            Kind::Fanout | Kind::Headers => None,
        };
        Hop {
            exchange: exchange.to_string(),
            kind,
            key: match kind {
                Kind::Direct | Kind::Topic => key.to_string(),
                Kind::Fanout | Kind::Headers => String::new(),
            },
            args: if kind == Kind::Headers {
                args.clone()
            } else {
                FieldTable::default()
            },
            expr,
            guard: None,
        }
    }

    /// Does a message with routing key `rk` pass this binding? Matched through the same
    /// key mapping a publish to the hop's exchange would take (so exactly as if the message
    /// had been published there).
    fn passes(&self, rk: &str, msg: &Message) -> bool {
        let matched = match self.kind {
            Kind::Fanout => true,
            Kind::Headers => super::headers_match(&self.args, msg),
            Kind::Direct | Kind::Topic => self.expr.as_ref().is_some_and(|e| {
                names::publish_key(&self.exchange, self.kind, rk).is_some_and(|k| e.matches(&k))
            }),
        };
        matched
            && self.guard.as_ref().is_none_or(|(g, prefix)| {
                names::publish_key(&self.exchange, self.kind, rk)
                    .and_then(|k| hayate_core::Key::new(&format!("{prefix}{}", k.as_str())).ok())
                    .is_some_and(|k| g.admits(&k))
            })
    }
}

/// What a delivery needs of a binding: its exchange (shared), its arguments for a headers
/// exchange, a route's paths of further hops.
type BindingView = (ShortStr, Option<FieldTable>, Option<Arc<Vec<Vec<Hop>>>>);

/// A route to make into a queue (see [`Binding`]): the source exchange's binding (in the
/// effective form of [`Hop`]), and the paths of hops from it, any of which lets a message
/// in.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Route {
    pub(crate) source: String,
    pub(crate) kind: Kind,
    pub(crate) key: String,
    pub(crate) args: FieldTable,
    pub(crate) paths: Vec<Vec<Hop>>,
}

/// What a route is known by: its subscription (source exchange, key and arguments in the
/// effective form of [`Hop`]). Routes computed with one are merged
/// (`super::Topology::routes`); a queue's kept routes are found by it ([`Queue::set_routes`]).
pub(crate) fn route_id(source: &str, key: &str, args: &FieldTable) -> (String, String, String) {
    (
        source.to_string(),
        key.to_string(),
        super::store::table_hex(args),
    )
}

/// A channel of a consumer connection, as queues see it.
#[derive(Debug)]
pub(crate) struct Chan {
    pub(crate) channel: u16,
    pub(crate) outbox: Arc<Outbox>,
    /// The connection's negotiated frame size (bodies are split to fit).
    pub(crate) frame_max: Arc<AtomicUsize>,
    /// `channel.flow`: deliveries paused while false.
    pub(crate) active: AtomicBool,
    /// Delivery tags (the next one is this plus one); shared with the connection's own
    /// encoder (direct reply-to deliveries), which takes tags without this lock.
    pub(crate) next_tag: Arc<AtomicU64>,
    pub(crate) st: Mutex<ChanState>,
}

/// What a channel tracks of its deliveries.
#[derive(Debug, Default)]
pub(crate) struct ChanState {
    /// Deliveries not yet acknowledged: tag → delivery.
    pub(crate) unacked: BTreeMap<u64, Unacked>,
    /// `basic.qos` with `global`: the most unacknowledged deliveries on the channel (0: no
    /// limit).
    pub(crate) prefetch: usize,
    pub(crate) closed: bool,
}

/// A delivery waiting for its acknowledgement.
#[derive(Debug)]
pub(crate) struct Unacked {
    pub(crate) queue: Arc<Queue>,
    /// The consumer it was delivered to (none: basic.get).
    pub(crate) consumer: Option<Arc<Consumer>>,
    pub(crate) msg: QMsg,
}

/// Gives back deliveries taken together (basic.recover, basic.nack or basic.reject with
/// `multiple`, a channel closed): each goes back to its place in its queue, redelivered
/// (`requeue`), or is dead-lettered, and only once all are back does each queue dispatch
/// (once). So they are redelivered in their original order (their places in the queue), as
/// RabbitMQ does, whatever order they come in; given back one by one, each went out again
/// at once, the last given back first.
pub(crate) fn give_back_all(items: impl IntoIterator<Item = Unacked>, requeue: bool) {
    let mut queues: Vec<Arc<Queue>> = Vec::new();
    for u in items {
        if !queues.iter().any(|q| Arc::ptr_eq(q, &u.queue)) {
            queues.push(u.queue.clone());
        }
        let q = u.queue.clone();
        q.take_back(u, requeue);
    }
    for q in queues {
        q.dispatch();
    }
}

/// Bindings per queue, at most.
pub(crate) const MAX_BINDINGS: usize = 4096;

/// Routes (derived bindings, through exchange-to-exchange bindings) per queue, at most.
pub(crate) const MAX_ROUTES: usize = 1024;

/// The cost of one queue's routes (`super::route_cost`: one per route and per hop of each
/// of its paths), at most.
pub(crate) const MAX_ROUTE_COST: usize = 8192;

/// Most bytes a consumer's outbox may hold before its queue stops delivering to it.
const OUTBOX_LIMIT: usize = 1024 * 1024;

/// One consumer of a queue.
#[derive(Debug)]
pub(crate) struct Consumer {
    pub(crate) tag: ShortStr,
    pub(crate) chan: Arc<Chan>,
    pub(crate) no_ack: bool,
    pub(crate) exclusive: bool,
    /// Most unacknowledged deliveries (`basic.qos` without `global`; 0: no limit).
    pub(crate) prefetch: usize,
    pub(crate) in_flight: AtomicUsize,
}

impl Consumer {
    /// May it take one more delivery now?
    fn has_credit(&self, chan: &ChanState) -> bool {
        !chan.closed
            && self.chan.active.load(Ordering::Acquire)
            && (self.no_ack
                || ((self.prefetch == 0 || self.in_flight.load(Ordering::Acquire) < self.prefetch)
                    && (chan.prefetch == 0 || chan.unacked.len() < chan.prefetch)))
    }
}

/// What queues did with a message an AMQP connection's task is routing, for its publish
/// to read after: a queue encodes synchronously in the publishing task, so what it notes
/// here reaches the publish that caused it (and nobody else's).
#[derive(Debug, Default)]
pub(crate) struct Routed {
    /// A queue took it (a headers binding's arguments matched): routed, for `mandatory`.
    pub(crate) queued: std::cell::Cell<bool>,
    /// A queue refused it (`x-overflow` `reject-publish`, or no room in the memory
    /// budget): the publisher's confirm is a basic.nack, as in RabbitMQ.
    pub(crate) refused: std::cell::Cell<bool>,
    /// Durable queues stored it: the confirm waits until these records are durable.
    pub(crate) stored: std::cell::RefCell<Vec<(Arc<Store>, u64)>>,
    /// Offers to queues' bindings and routes (each counted as delivered by the broker,
    /// taken or not: a headers binding's arguments, a route's hops, a key of another vhost
    /// may refuse it): a mandatory publish is routed if a queue took it or something other
    /// than a queue was offered it.
    pub(crate) queue_offers: std::cell::Cell<usize>,
}

tokio::task_local! {
    pub(crate) static ROUTED: Routed;
}

fn note_refused() {
    let _ = ROUTED.try_with(|r| r.refused.set(true));
}

fn note_stored(store: &Arc<Store>, offset: u64) {
    let _ = ROUTED.try_with(|r| r.stored.borrow_mut().push((store.clone(), offset)));
}

/// A queue's ready messages in delivery order: a first-in first-out list per priority
/// (a queue without `x-max-priority` has priority 0 only), the highest served first. New
/// messages go to the back of their priority's list (O(1)); a message given back goes to
/// its place in its own list.
#[derive(Debug, Default)]
struct Msgs {
    /// Index: the priority (grown to the highest one seen).
    levels: Vec<VecDeque<QMsg>>,
    len: usize,
}

impl Msgs {
    fn len(&self) -> usize {
        self.len
    }

    fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn level(&mut self, priority: u8) -> &mut VecDeque<QMsg> {
        let p = usize::from(priority);
        if self.levels.len() <= p {
            self.levels.resize_with(p + 1, VecDeque::new);
        }
        &mut self.levels[p]
    }

    /// The next to deliver.
    fn front(&self) -> Option<&QMsg> {
        self.levels.iter().rev().find_map(VecDeque::front)
    }

    fn pop_front(&mut self) -> Option<QMsg> {
        let m = self.levels.iter_mut().rev().find_map(VecDeque::pop_front)?;
        self.len -= 1;
        Some(m)
    }

    /// A new message (its `seq` the highest yet): at the back of its priority.
    fn push_back(&mut self, m: QMsg) {
        self.level(m.priority).push_back(m);
        self.len += 1;
    }

    /// A message given back: to its place among those of its priority.
    fn insert_in_place(&mut self, m: QMsg) {
        let level = self.level(m.priority);
        let at = level.partition_point(|x| x.seq < m.seq);
        level.insert(at, m);
        self.len += 1;
    }

    /// The message with `priority` and `seq`, if it is still here.
    fn get_mut(&mut self, priority: u8, seq: u64) -> Option<&mut QMsg> {
        let level = self.levels.get_mut(usize::from(priority))?;
        let at = level.partition_point(|x| x.seq < seq);
        level.get_mut(at).filter(|m| m.seq == seq)
    }

    fn clear(&mut self) {
        self.levels.clear();
        self.len = 0;
    }
}

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

/// Dead letters waiting for their task, at most (past it they are dropped, counted).
const DEAD_LETTER_BACKLOG: usize = 65_536;

impl std::fmt::Debug for Queue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Queue")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

/// Publishes a dead letter (the message, and why: [`REJECTED`], [`EXPIRED`], [`MAXLEN`]).
pub(crate) type DeadLetters = Arc<
    dyn Fn(QMsg, &'static str) -> std::pin::Pin<Box<dyn Future<Output = ()> + Send>> + Send + Sync,
>;

/// Why a message left a queue without being acknowledged (the `x-death` reason).
pub(crate) const REJECTED: &str = "rejected";
pub(crate) const EXPIRED: &str = "expired";
pub(crate) const MAXLEN: &str = "maxlen";
pub(crate) const DELIVERY_LIMIT: &str = "delivery_limit";

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

    /// Where dead letters go (set when the queue has `x-dead-letter-exchange`): a task
    /// publishes them one after the other, in the order they left the queue.
    pub(crate) fn set_dead_letters(&self, f: DeadLetters) {
        let (tx, mut rx) = tokio::sync::mpsc::channel::<(QMsg, &'static str)>(DEAD_LETTER_BACKLOG);
        *lock(&self.dead) = Some(tx);
        tokio::spawn(async move {
            while let Some((m, why)) = rx.recv().await {
                f(m, why).await;
            }
        });
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

    /// Is one of the bindings clients made to an exchange `bound(exchange)` says yes to?
    /// (Without copying them.)
    pub(crate) fn bound_to(&self, bound: impl Fn(&str) -> bool) -> bool {
        lock(&self.st)
            .bindings
            .iter()
            .any(|b| b.via.is_none() && bound(&b.exchange))
    }

    /// The bindings clients made (not routes).
    pub(crate) fn bindings(&self) -> Vec<Binding> {
        lock(&self.st)
            .bindings
            .iter()
            .filter(|b| b.via.is_none())
            .cloned()
            .collect()
    }

    /// A durable queue's bindings into its store's definitions (after a bind or unbind).
    pub(crate) fn save_bindings(&self) -> Result<(), String> {
        let Some((store, id)) = &self.store else {
            return Ok(());
        };
        let defs = lock(&self.st)
            .bindings
            .iter()
            .filter(|b| !b.exchange.is_empty() && b.via.is_none())
            .map(|b| super::store::BindingDef {
                exchange: b.exchange.clone(),
                key: b.key.clone(),
                arguments: super::store::table_hex(&b.args),
            })
            .collect();
        store.set_bindings(&self.name, *id, defs)
    }

    /// Adds a binding (a broker subscription on `expr`); an identical one is kept as is.
    pub(crate) fn bind(
        &self,
        exchange: &str,
        kind: Kind,
        key: &str,
        args: FieldTable,
        expr: hayate_core::KeyExpr,
        guard: Option<Arc<dyn hayate_broker::KeyGuard>>,
    ) -> Result<(), String> {
        let mut session = lock(&self.session);
        let Some(session) = session.as_mut() else {
            return Err("queue is being deleted".into());
        };
        let st = lock(&self.st);
        if st
            .bindings
            .iter()
            .any(|b| b.via.is_none() && b.exchange == exchange && b.key == key && b.args == args)
        {
            return Ok(());
        }
        if st.bindings.iter().filter(|b| b.via.is_none()).count() >= MAX_BINDINGS {
            return Err(format!("a queue has at most {MAX_BINDINGS} bindings"));
        }
        drop(st);
        self.add_binding(session, exchange, kind, key, args, None, expr, guard)
    }

    /// Adds a binding, or a route (with its paths `via`), with `session` held.
    ///
    /// Sids are never reused while others are in use before them: a publisher that looked
    /// its route up before a binding went could still offer to the old sid, and must not
    /// find another binding there. They come from a counter that wraps (skipping those in
    /// use); `bindings` stays sorted by sid, so [`Queue::binding`] is a binary search.
    #[allow(clippy::too_many_arguments)]
    fn add_binding(
        &self,
        session: &mut Session,
        exchange: &str,
        kind: Kind,
        key: &str,
        args: FieldTable,
        via: Option<Arc<Vec<Vec<Hop>>>>,
        expr: hayate_core::KeyExpr,
        guard: Option<Arc<dyn hayate_broker::KeyGuard>>,
    ) -> Result<(), String> {
        let mut st = lock(&self.st);
        let sid = loop {
            st.next_sid = st.next_sid.wrapping_add(1).max(1);
            let sid = st.next_sid;
            if st.bindings.binary_search_by_key(&sid, |b| b.sid).is_err() {
                break sid;
            }
        };
        let at = st.bindings.partition_point(|b| b.sid < sid);
        st.bindings.insert(
            at,
            Binding {
                exchange: exchange.to_string(),
                exchange_s: ShortStr::lit(exchange),
                kind,
                key: key.to_string(),
                args,
                sid,
                guard: if via.is_none() { guard.clone() } else { None },
                via,
            },
        );
        drop(st);
        // Drop, not block: a queue past its limits drops (counted), it never holds a
        // publisher back.
        let qos = Qos {
            congestion: hayate_core::Congestion::Drop,
            ..Qos::default()
        };
        if let Err(e) = session.subscribe_guarded(sid, expr, None, qos, guard) {
            lock(&self.st).bindings.retain(|b| b.sid != sid);
            return Err(e.to_string());
        }
        Ok(())
    }

    /// The queue's routes become `routes`. A route whose subscription stays keeps it (only
    /// its paths change, in place), new ones are subscribed before the old ones go (a
    /// message offered to both enters once), so no message in flight is lost. Each route's
    /// subscription is on the source's binding expression in the queue's vhost. Keeps the
    /// queue's and the vhost's count of route cost (nothing for a queue being deleted).
    pub(crate) fn set_routes(&self, routes: Vec<Route>) -> Result<(), String> {
        let mut session = lock(&self.session);
        let Some(session) = session.as_mut() else {
            return Ok(()); // being deleted
        };
        let cost = super::route_cost(&routes);
        let old = self.route_cost.swap(cost, Ordering::AcqRel);
        self.vhost.route_cost.fetch_add(cost, Ordering::AcqRel);
        self.vhost.route_cost.fetch_sub(old, Ordering::AcqRel);
        // One lookup per route, not a scan of every binding: a change may reroute many
        // queues.
        // Kept subscriptions take their new paths; the rest are added.
        let mut new = Vec::new();
        let mut keep = std::collections::HashSet::new();
        {
            let mut st = lock(&self.st);
            let at: std::collections::HashMap<_, usize> = st
                .bindings
                .iter()
                .enumerate()
                .filter(|(_, b)| b.via.is_some())
                .map(|(i, b)| (route_id(&b.exchange, &b.key, &b.args), i))
                .collect();
            for r in routes {
                match at.get(&route_id(&r.source, &r.key, &r.args)) {
                    Some(&i) => {
                        let b = &mut st.bindings[i];
                        if b.via.as_deref() != Some(&r.paths) {
                            b.via = Some(Arc::new(r.paths.clone()));
                        }
                        keep.insert(b.sid);
                    }
                    None => new.push(r),
                }
            }
        }
        let mut failed = Ok(());
        for r in new {
            let Some(expr) = self
                .vhost
                .expr(names::binding_expr(&r.source, r.kind, &r.key))
            else {
                continue; // a binding key that is no expression routes nothing
            };
            // No reply inbox reaches a queue (the binder's permissions were checked when
            // the exchange binding was made).
            let Ok(guard) = crate::auth::inbox_guard(&expr) else {
                continue;
            };
            let paths = Some(Arc::new(r.paths));
            match self.add_binding(
                session, &r.source, r.kind, &r.key, r.args, paths, expr, guard,
            ) {
                Ok(()) => {
                    keep.insert(lock(&self.st).next_sid);
                }
                Err(e) => failed = failed.and(Err(e)),
            }
        }
        let gone: Vec<u32> = {
            let mut st = lock(&self.st);
            let (gone, kept) = std::mem::take(&mut st.bindings)
                .into_iter()
                .partition::<Vec<_>, _>(|b| b.via.is_some() && !keep.contains(&b.sid));
            st.bindings = kept;
            gone.into_iter().map(|b| b.sid).collect()
        };
        for sid in gone {
            session.unsubscribe(sid);
        }
        failed
    }

    /// The cost of its routes now.
    pub(crate) fn route_cost(&self) -> usize {
        self.route_cost.load(Ordering::Acquire)
    }

    /// Removes a binding; false if there was none.
    pub(crate) fn unbind(&self, exchange: &str, key: &str, args: &FieldTable) -> bool {
        let mut st = lock(&self.st);
        let Some(i) = st.bindings.iter().position(|b| {
            b.via.is_none() && b.exchange == exchange && b.key == key && &b.args == args
        }) else {
            return false;
        };
        let b = st.bindings.remove(i);
        drop(st);
        if let Some(s) = lock(&self.session).as_mut() {
            s.unsubscribe(b.sid);
        }
        true
    }

    /// Removes every binding to `exchange` and route from it (it is being deleted).
    pub(crate) fn unbind_exchange(&self, exchange: &str) {
        let gone: Vec<u32> = {
            let mut st = lock(&self.st);
            let (gone, keep) = std::mem::take(&mut st.bindings)
                .into_iter()
                .partition::<Vec<_>, _>(|b| b.exchange == exchange);
            st.bindings = keep;
            gone.into_iter().map(|b| b.sid).collect()
        };
        if let Some(s) = lock(&self.session).as_mut() {
            for sid in gone {
                s.unsubscribe(sid);
            }
        }
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

    /// Messages that leave the queue unacknowledged: counted, and handed to the
    /// dead-letter task if there is one (the caller may hold a publisher's outbox lock; a
    /// dead letter may come back to this very queue).
    fn dead_letter_all(&self, msgs: Vec<QMsg>, why: &'static str) {
        if msgs.is_empty() {
            return;
        }
        for m in &msgs {
            self.forget(m);
        }
        if why != REJECTED {
            self.dropped.fetch_add(msgs.len() as u64, Ordering::Relaxed);
        }
        let tx = lock(&self.dead).clone();
        if let Some(tx) = tx {
            for m in msgs {
                if tx.try_send((m, why)).is_err() {
                    self.dropped.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
    }

    /// Delivers what it can now.
    pub(crate) fn dispatch(self: &Arc<Self>) {
        let mut st = lock(&self.st);
        self.dispatch_locked(&mut st);
    }

    fn dispatch_locked(self: &Arc<Self>, st: &mut QState) {
        // The clock is read only if some message has an expiry.
        let mut now = None;
        // Set again below if a consumer is still skipped; the task is woken only when the
        // queue starts to be stalled (it looks again every 2 ms while it is).
        let was_stalled = std::mem::take(&mut st.stalled);
        let mut expired = Vec::new();
        while let Some(front) = st.msgs.front() {
            if front
                .expires
                .is_some_and(|at| *now.get_or_insert_with(Instant::now) >= at)
            {
                if let Some(m) = st.msgs.pop_front() {
                    st.bytes -= m.size();
                    st.body_bytes -= m.msg.payload.len();
                    expired.push(m);
                }
                continue;
            }
            let n = st.consumers.len();
            if n == 0 {
                break;
            }
            let mut chosen = None;
            for i in 0..n {
                let at = (st.next + i) % n;
                let c = &st.consumers[at];
                if c.chan.outbox.backlog().0 > OUTBOX_LIMIT {
                    st.stalled = true;
                    let ob = c.chan.outbox.clone();
                    if !st.stalled_on.iter().any(|o| Arc::ptr_eq(o, &ob)) {
                        st.stalled_on.push(ob);
                    }
                    continue;
                }
                let cs = lock(&c.chan.st);
                if c.has_credit(&cs) {
                    drop(cs);
                    chosen = Some(at);
                    break;
                }
            }
            let Some(at) = chosen else { break };
            st.next = (at + 1) % n;
            let c = st.consumers[at].clone();
            let Some(m) = st.msgs.pop_front() else { break };
            st.bytes -= m.size();
            st.body_bytes -= m.msg.payload.len();
            self.deliver(st, &c, m);
        }
        lock(&self.charge).shrink(st.bytes + st.unacked_bytes);
        if st.stalled && !was_stalled {
            self.wake.notify_one();
        }
        self.dead_letter_all(expired, EXPIRED);
    }

    /// Writes one delivery to consumer `c` (under the queue's lock).
    fn deliver(self: &Arc<Self>, st: &mut QState, c: &Arc<Consumer>, m: QMsg) {
        if !c.no_ack {
            st.unacked_bytes += m.size();
            c.in_flight.fetch_add(1, Ordering::AcqRel);
        }
        self.write_delivery(&c.chan, Some(c), None, m, c.no_ack);
    }

    /// Writes a delivery (basic.deliver to `consumer`, or basic.get-ok with `left`) on
    /// `chan`, and keeps it until acknowledged unless `no_ack`. The channel's state is held
    /// throughout and the tag is taken under the outbox's lock, so tags go out in order
    /// (whoever else delivers on the channel) and an acknowledgement never finds its tag
    /// missing.
    fn write_delivery(
        self: &Arc<Self>,
        chan: &Arc<Chan>,
        consumer: Option<&Arc<Consumer>>,
        left: Option<u32>,
        m: QMsg,
        no_ack: bool,
    ) {
        let mut cs = lock(&chan.st);
        let frame_max = chan.frame_max.load(Ordering::Relaxed);
        let mut tag = 0;
        chan.outbox.push_control_buf(|b: &mut OutBuf| {
            tag = chan.next_tag.fetch_add(1, Ordering::AcqRel) + 1;
            let d = Delivery {
                channel: chan.channel,
                consumer_tag: consumer.map(|c| &c.tag),
                delivery_tag: tag,
                redelivered: m.redelivered,
                exchange: &m.exchange,
                routing_key: m.routing_key.as_bytes(),
                message_count: left,
                msg: &m.msg,
                vhost_prefix: &self.vhost.prefix,
            };
            encode_delivery(&d, frame_max, b);
        });
        if no_ack || tag == 0 {
            self.forget(&m);
        } else {
            cs.unacked.insert(
                tag,
                Unacked {
                    queue: self.clone(),
                    consumer: consumer.cloned(),
                    msg: m,
                },
            );
        }
    }

    /// basic.get: the next message for channel `chan` (`no_ack`: settled at once); false
    /// when there is none.
    pub(crate) fn get(self: &Arc<Self>, chan: &Arc<Chan>, no_ack: bool) -> bool {
        let mut st = lock(&self.st);
        let now = Instant::now();
        st.used = Some(now);
        let mut expired = Vec::new();
        let mut found = None;
        while let Some(m) = st.msgs.pop_front() {
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
            let left = st.msgs.len() as u32;
            if !no_ack {
                st.unacked_bytes += m.size();
            }
            self.write_delivery(chan, None, Some(left), m, no_ack);
        }
        lock(&self.charge).shrink(st.bytes + st.unacked_bytes);
        drop(st);
        self.dead_letter_all(expired, EXPIRED);
        got
    }

    /// Adds a consumer and delivers what it can. `Err`: an exclusive consumer is there (or
    /// this one wants to be exclusive and others are).
    /// `added` runs once it is in, before any delivery (the caller's consume-ok: it may
    /// lock the consumer connection's outbox).
    pub(crate) fn add_consumer(
        self: &Arc<Self>,
        c: Arc<Consumer>,
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
        self.dispatch_locked(&mut st);
        Ok(())
    }

    /// Marks the queue used now (declared again: x-expires counts from here).
    pub(crate) fn touch(&self) {
        lock(&self.st).used = Some(Instant::now());
    }

    /// Removes consumer `tag` of channel `chan`; true if the queue is now to be
    /// auto-deleted.
    pub(crate) fn remove_consumer(&self, chan: &Arc<Chan>, tag: &ShortStr) -> bool {
        let mut st = lock(&self.st);
        st.consumers
            .retain(|c| !(Arc::ptr_eq(&c.chan, chan) && &c.tag == tag));
        if st.next >= st.consumers.len() {
            st.next = 0;
        }
        st.used = Some(Instant::now());
        let gone = self.auto_delete && st.had_consumer && st.consumers.is_empty() && !st.deleted;
        // Marked at once, under the same lock: a declare or consume from now on sees it gone.
        st.deleted |= gone;
        gone
    }

    /// Removes every consumer of channel `chan` (the channel closed); true if the queue is
    /// now to be auto-deleted.
    pub(crate) fn remove_channel(&self, chan: &Arc<Chan>) -> bool {
        let mut st = lock(&self.st);
        let before = st.consumers.len();
        st.consumers.retain(|c| !Arc::ptr_eq(&c.chan, chan));
        if st.next >= st.consumers.len() {
            st.next = 0;
        }
        let gone = before != st.consumers.len()
            && self.auto_delete
            && st.had_consumer
            && st.consumers.is_empty()
            && !st.deleted;
        st.deleted |= gone;
        gone
    }

    /// An acknowledgement of one of its deliveries to `consumer`: credit back.
    pub(crate) fn settled(self: &Arc<Self>, u: &Unacked) {
        if let Some(c) = &u.consumer {
            c.in_flight.fetch_sub(1, Ordering::AcqRel);
        }
        self.forget(&u.msg);
        let mut st = lock(&self.st);
        st.unacked_bytes = st.unacked_bytes.saturating_sub(u.msg.size());
        self.dispatch_locked(&mut st);
    }

    /// A delivery given back: to its place at the front of the queue (redelivered), or
    /// dead-lettered. Not dispatched: see [`give_back_all`].
    fn take_back(self: &Arc<Self>, u: Unacked, requeue: bool) {
        if let Some(c) = &u.consumer {
            c.in_flight.fetch_sub(1, Ordering::AcqRel);
        }
        {
            let mut st = lock(&self.st);
            st.unacked_bytes = st.unacked_bytes.saturating_sub(u.msg.size());
        }
        let mut m = u.msg;
        if requeue && self.args.quorum {
            // A quorum queue counts returns (shown as `x-delivery-count`) and, past its
            // delivery limit, dead-letters the message instead.
            m.returns = m.returns.saturating_add(1);
            set_delivery_count(&mut m);
            if let (Some((s, _)), Some(id)) = (&self.store, m.stored) {
                s.note_return(id, m.returns);
            }
            if self.args.delivery_limit.is_some_and(|l| m.returns > l) {
                self.dead_letter_all(vec![m], DELIVERY_LIMIT);
                return;
            }
        }
        if requeue {
            m.redelivered = true;
            self.put(m, true, false);
        } else {
            self.dead_letter_all(vec![m], REJECTED);
        }
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

    /// A binding's exchange (shared), its arguments for a headers exchange (the only type
    /// whose arguments a delivery needs), and a route's further hops.
    fn binding(&self, sid: u32) -> Option<BindingView> {
        let st = lock(&self.st);
        st.bindings
            .binary_search_by_key(&sid, |b| b.sid)
            .ok()
            .map(|i| &st.bindings[i])
            .map(|b| {
                let args = (b.kind == Kind::Headers).then(|| b.args.clone());
                (b.exchange_s.clone(), args, b.via.clone())
            })
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

/// A queue's broker session's encoder: appends what its bindings receive to the queue.
pub(crate) struct QueueEncoder {
    pub(crate) queue: Weak<Queue>,
    /// The last publishes taken, as `hayate_broker::session::current_publish` names them,
    /// with the items of each batch taken: a publish matching several bindings enters the
    /// queue once, as in RabbitMQ.
    pub(crate) taken: Taken,
}

/// The publishes a queue took last (one entry per publishing session, the most recent
/// [`TAKEN_SESSIONS`]).
#[derive(Debug, Default)]
pub(crate) struct Taken(std::collections::VecDeque<((u64, u64), Vec<bool>)>);

/// Publishing sessions whose last publish a queue remembers. One forgotten (more sessions
/// publishing into the queue at the same moment) can only let a duplicate in, as before.
const TAKEN_SESSIONS: usize = 16;

impl Taken {
    /// Item `i` of publish `p` (of `n` items) was taken already; else notes it as taken
    /// (`(0, 0)`, no publish known: never a duplicate).
    fn seen(&mut self, p: (u64, u64), i: usize, n: usize) -> bool {
        if p == (0, 0) {
            return false;
        }
        let e = match self.0.iter().position(|(q, _)| q.0 == p.0) {
            Some(at) if self.0[at].0 == p => &mut self.0[at].1,
            Some(at) => {
                let e = &mut self.0[at];
                e.0 = p;
                e.1.clear();
                e.1.resize(n, false);
                &mut e.1
            }
            None => {
                if self.0.len() == TAKEN_SESSIONS {
                    self.0.pop_front();
                }
                self.0.push_back((p, vec![false; n]));
                &mut self.0.back_mut().expect("pushed").1
            }
        };
        if e.len() < n {
            e.resize(n, false);
        }
        std::mem::replace(&mut e[i], true)
    }
}

impl Encoder for QueueEncoder {
    fn encode(&mut self, sid: u32, batch: Batch<'_>, _origin: u64, _out: &mut OutBuf) {
        let _ = ROUTED.try_with(|r| r.queue_offers.set(r.queue_offers.get() + batch.len()));
        let Some(q) = self.queue.upgrade() else {
            return;
        };
        let Some((exchange, args, via)) = q.binding(sid) else {
            return;
        };
        let x = exchange.as_str().unwrap_or("");
        let publish = hayate_broker::session::current_publish();
        for i in 0..batch.len() {
            let msg = batch.message(i);
            // A key of another vhost (a `/` binding's wildcard covers them all): not this
            // queue's.
            if q.vhost.foreign(msg.key.as_str()) {
                continue;
            }
            if args
                .as_ref()
                .is_some_and(|a| !super::headers_match(a, &msg))
            {
                continue;
            }
            let rk = names::routing_key_of(x, q.vhost.strip(msg.key.as_str()));
            // A route: every further exchange-to-exchange hop of one of its paths, and the
            // queue's binding, must take it too.
            if via.as_ref().is_some_and(|paths| {
                !paths
                    .iter()
                    .any(|hops| hops.iter().all(|h| h.passes(&rk, &msg)))
            }) {
                continue;
            }
            // Taken already through another of the queue's bindings.
            if self.taken.seen(publish, i, batch.len()) {
                continue;
            }
            // The string's buffer becomes the short string's (no second copy).
            let routing_key = if rk.len() <= 255 {
                ShortStr::new(bytes::Bytes::from(rk)).unwrap_or_default()
            } else {
                ShortStr::lit(&rk)
            };
            let _ = ROUTED.try_with(|r| r.queued.set(true));
            // A priority queue orders by the message's priority (the AMQP property, or a
            // `priority` header from another protocol).
            let priority = q.args.max_priority.map_or(0, |max| {
                msg.headers
                    .iter()
                    .flatten()
                    .find(|(k, _)| k == "priority")
                    .and_then(|(_, v)| std::str::from_utf8(v).ok()?.trim().parse::<u64>().ok())
                    .map_or(0, |p| p.min(u64::from(max)) as u8)
            });
            let expires = match (q.args.message_ttl, msg.attrs.expires) {
                (Some(ttl), Some(at)) => Some((Instant::now() + ttl).min(at)),
                (Some(ttl), None) => Some(Instant::now() + ttl),
                (None, at) => at,
            };
            q.push(
                QMsg {
                    msg,
                    exchange: exchange.clone(),
                    routing_key,
                    redelivered: false,
                    expires,
                    seq: 0,
                    priority,
                    stored: None,
                    returns: 0,
                },
                false,
            );
        }
    }

    fn encode_lost(&mut self, _sid: u32, count: u64, _out: &mut OutBuf) {
        if let Some(q) = self.queue.upgrade() {
            q.dropped.fetch_add(count, Ordering::Relaxed);
        }
    }
}

/// Sets a quorum queue message's `x-delivery-count` header to its count of returns.
fn set_delivery_count(m: &mut QMsg) {
    let h = m.msg.headers.get_or_insert_with(Vec::new);
    h.retain(|(k, _)| k != "x-delivery-count");
    h.push((
        "x-delivery-count".into(),
        bytes::Bytes::from(m.returns.to_string()),
    ));
}

#[cfg(test)]
mod tests {
    use super::{Hop, Kind, Taken};
    use hayate_amqp::{FieldTable, FieldValue};
    use hayate_core::{Key, Message};

    #[test]
    fn a_hop_matches_as_its_exchange_would_route() {
        let m = Message::new(
            Key::new("x").unwrap_or_else(|_| panic!()),
            bytes::Bytes::new(),
        );
        let none = FieldTable::default();
        let topic = Hop::new("t", Kind::Topic, "a.*.#", &none);
        assert!(topic.passes("a.b", &m) && topic.passes("a.b.c.d", &m));
        assert!(!topic.passes("a", &m) && !topic.passes("b.a.c", &m));
        let amq = Hop::new("amq.topic", Kind::Topic, "#", &none);
        assert!(amq.passes("any.thing", &m));
        let direct = Hop::new("d", Kind::Direct, "a.*", &none);
        assert!(direct.passes("a.*", &m), "a direct key's * is literal");
        assert!(!direct.passes("a.b", &m));
        assert!(Hop::new("f", Kind::Fanout, "k", &none).passes("", &m));
        let mut args = FieldTable::default();
        args.insert(
            "x-match",
            FieldValue::LongStr(bytes::Bytes::from_static(b"all")),
        );
        args.insert("k", FieldValue::LongStr(bytes::Bytes::from_static(b"v")));
        let headers = Hop::new("h", Kind::Headers, "", &args);
        assert!(!headers.passes("", &m));
        let mut with = m.clone();
        with.headers = Some(vec![("k".into(), bytes::Bytes::from_static(b"v"))]);
        assert!(headers.passes("", &with));
    }

    #[test]
    fn a_publish_is_taken_once_per_item_whatever_the_bindings_and_interleavings() {
        let mut t = Taken::default();
        // Publish 7 of session 1, two items, offered through two bindings.
        assert!(!t.seen((1, 7), 0, 2));
        assert!(!t.seen((1, 7), 1, 2));
        // Session 2's publish offered in between.
        assert!(!t.seen((2, 3), 0, 1));
        assert!(t.seen((1, 7), 0, 2), "the second binding's offer of item 0");
        assert!(t.seen((1, 7), 1, 2));
        assert!(t.seen((2, 3), 0, 1));
        // Session 1's next publish is new.
        assert!(!t.seen((1, 8), 0, 1));
        // No publish known: never a duplicate.
        assert!(!t.seen((0, 0), 0, 1));
        assert!(!t.seen((0, 0), 0, 1));
        // Sixteen other sessions push session 1 out: a duplicate can then pass, nothing
        // is refused.
        for s in 10..26 {
            assert!(!t.seen((s, 1), 0, 1));
        }
        assert!(!t.seen((1, 8), 0, 1));
    }
}
