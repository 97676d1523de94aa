//! Bindings: entries of the broker's route table that lead to a queue, as subscriptions
//! lead to an outbox ([`Broker::queue_bind`]); what a route holds of the queues its key
//! reaches ([`QueueRoute`]); and a publish offered to them ([`Queue::offer_batch`],
//! [`Routed`]).

use std::sync::Arc;
use std::sync::atomic::Ordering;

use hayate_core::sync::lock;
use hayate_core::{KeyExpr, Message, Qos};

use super::{Queue, QueueStore, Via};
use crate::broker::{SubEntry, To, remove_sub};
use crate::{Batch, Broker, KeyGuard, Outbox};

/// What a binding lets into its queue, message by message (AMQP: a headers exchange's
/// arguments, the hops of a route through exchange-to-exchange bindings, a key of another
/// vhost), and what the message is delivered with.
pub trait BindingFilter: Send + Sync + std::fmt::Debug {
    /// `None`: not taken through this binding.
    fn admit(&self, m: &Message) -> Option<Via>;
}

/// A queue a route's key reaches, with the filters of its matching bindings (`None`: a
/// binding that takes everything, with an empty [`Via`]): one entry per queue however many
/// of its bindings match, so a publish enters it once.
#[derive(Debug, Clone)]
pub(crate) struct QueueRoute {
    pub(crate) queue: Arc<Queue>,
    pub(crate) filters: Vec<Option<Arc<dyn BindingFilter>>>,
}

/// What the queues a publish reached did with it (for its publisher: confirms, mandatory).
#[derive(Default)]
pub struct Routed {
    /// Items a queue's binding admitted (each queue counts once per item).
    pub queued: usize,
    /// A queue refused an item (reject-publish, the memory budget, a failed store): a
    /// confirm is negative.
    pub refused: bool,
    /// Records durable queues' stores appended (a confirm waits until they are durable).
    pub stored: Vec<(Arc<dyn QueueStore>, u64)>,
}

impl std::fmt::Debug for Routed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Routed")
            .field("queued", &self.queued)
            .field("refused", &self.refused)
            .field("stored", &self.stored.len())
            .finish()
    }
}

impl Routed {
    /// Adds what `other` says.
    pub(crate) fn merge(&mut self, other: Routed) {
        self.queued += other.queued;
        self.refused |= other.refused;
        self.stored.extend(other.stored);
    }
}

impl Queue {
    /// Offers each item of `batch` (which reached the queue through bindings with
    /// `filters`) once: the first filter that admits it says what it is delivered with.
    /// Deliveries written to outboxes with a sink go into `to_flush` (the publishing
    /// session's). Never blocks.
    pub(crate) fn offer_batch(
        self: &Arc<Self>,
        batch: Batch<'_>,
        filters: &[Option<Arc<dyn BindingFilter>>],
        routed: &mut Routed,
        to_flush: &mut Vec<Arc<Outbox>>,
    ) {
        for i in 0..batch.len() {
            let msg = batch.message(i);
            let via = filters.iter().find_map(|f| match f {
                Some(f) => f.admit(&msg),
                None => Some(Via::default()),
            });
            let Some(via) = via else { continue };
            routed.queued += 1;
            let item = self.item(msg, via);
            let offered = self.offer_in(item, Some(&mut *to_flush));
            routed.refused |= offered.refused;
            if let (Some(o), Some((store, _))) = (offered.stored, &self.store) {
                routed.stored.push((store.clone(), o));
            }
        }
    }
}

impl Broker {
    /// Binds queue `q` to `expr` (with `guard`, as a subscription's, and `filter`): an entry
    /// of the route table beside the subscriptions. Its id in the queue (never reused
    /// while in use).
    pub fn queue_bind(
        &self,
        q: &Arc<Queue>,
        expr: KeyExpr,
        guard: Option<Arc<dyn KeyGuard>>,
        filter: Option<Arc<dyn BindingFilter>>,
    ) -> u32 {
        let space = *q
            .space
            .get_or_init(|| self.shared.next_session.fetch_add(1, Ordering::Relaxed));
        let mut reg = self.write();
        let bid = {
            let mut guard = lock(&q.binds);
            let b = &mut *guard;
            loop {
                b.0 = b.0.wrapping_add(1).max(1);
                if b.1.insert(b.0) {
                    break b.0;
                }
            }
        };
        let entry = SubEntry {
            to: To::Queue(q.clone(), filter),
            qos: Qos::default(),
            guard,
        };
        reg.routes.insert((space, bid), expr, None, entry);
        self.bump();
        bid
    }

    /// Changes binding `bid` of `q`'s filter (routes whose paths changed), in place.
    pub fn queue_refilter(&self, q: &Arc<Queue>, bid: u32, filter: Option<Arc<dyn BindingFilter>>) {
        let Some(&space) = q.space.get() else { return };
        let mut reg = self.write();
        let Some(old) = reg.routes.remove((space, bid)) else {
            return;
        };
        let sub = old.sub;
        let entry = SubEntry {
            to: To::Queue(q.clone(), filter),
            qos: sub.target.qos,
            guard: sub.target.guard,
        };
        reg.routes.insert((space, bid), sub.expr, None, entry);
        self.bump();
    }

    /// Removes binding `bid` of `q`; false if there was none.
    pub fn queue_unbind(&self, q: &Arc<Queue>, bid: u32) -> bool {
        let Some(&space) = q.space.get() else {
            return false;
        };
        let mut reg = self.write();
        if !lock(&q.binds).1.remove(&bid) {
            return false;
        }
        remove_sub(&mut reg, space, bid);
        self.bump();
        true
    }

    /// Removes every binding of `q`.
    pub(crate) fn queue_unbind_all(&self, q: &Arc<Queue>) {
        let Some(&space) = q.space.get() else { return };
        let mut reg = self.write();
        let bids = std::mem::take(&mut lock(&q.binds).1);
        if bids.is_empty() {
            return;
        }
        for bid in bids {
            remove_sub(&mut reg, space, bid);
        }
        self.bump();
    }
}
