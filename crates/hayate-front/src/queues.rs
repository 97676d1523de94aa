//! A connection's consumers of the engine's queues (STOMP `SUBSCRIBE /queue/<q>`, native
//! `CONSUME` of a queue): [`OutboxSink`], the [`QueueSink`] that writes a queue's
//! deliveries into the session's outbox as deliveries of one subscription, so that the
//! protocol's delivery ids, cumulative ACKs and NACKs work as for any acknowledged
//! subscription; [`crate::Memberships`] maps them back to the queue.
//!
//! An acknowledged delivery carries `attrs.stream_offset` = its id in the queue's ledger
//! (not a stream offset), by which the sink keeps it ([`Unacked`]) until it is settled: acknowledged ([`Queue::settled`]), or given back in place
//! ([`give_back_all`]) by a NACK or when the consumer leaves.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use hayate_broker::queue::{
    Delivered, QItem, Queue, QueueConsumer, QueueSink, ToFlush, Unacked, give_back_all,
};
use hayate_broker::{Batch, Outbox};
use hayate_core::sync::lock;

/// A queue consumer's sink: subscription `sid` of a session's outbox.
#[derive(Debug)]
pub struct OutboxSink {
    outbox: Arc<Outbox>,
    sid: u32,
    /// Acknowledged deliveries not settled yet, by ledger id (in delivery order).
    held: Mutex<BTreeMap<u64, Unacked>>,
}

impl OutboxSink {
    pub fn new(outbox: Arc<Outbox>, sid: u32) -> OutboxSink {
        OutboxSink {
            outbox,
            sid,
            held: Mutex::new(BTreeMap::new()),
        }
    }

    /// Takes the held delivery of ledger id `id`.
    fn take(&self, id: u64) -> Option<Unacked> {
        lock(&self.held).remove(&id)
    }

    /// Takes every held delivery, in delivery order.
    fn take_all(&self) -> Vec<Unacked> {
        std::mem::take(&mut *lock(&self.held))
            .into_values()
            .collect()
    }
}

impl QueueSink for OutboxSink {
    fn has_credit(&self, _acked: bool) -> bool {
        !self.outbox.is_closed()
    }

    fn outbox(&self) -> &Arc<Outbox> {
        &self.outbox
    }

    fn deliver(&self, d: Delivered<'_>, item: &QItem, _to_flush: ToFlush<'_>) -> bool {
        let mut msg = item.msg.clone();
        msg.attrs.redelivered = d.redelivered;
        if d.no_ack {
            // Settled as written (what a closed outbox did not take is lost with it).
            self.outbox.force_unbudgeted(self.sid, 0, Batch::One(&msg));
            return false;
        }
        msg.attrs.stream_offset = Some(d.id);
        msg.attrs.deliveries = d.returns.saturating_add(1);
        // Kept even if the outbox is closed: the consumer's leaving gives it back.
        lock(&self.held).insert(
            d.id,
            Unacked {
                queue: d.queue.clone(),
                consumer: d.consumer.cloned(),
                id: d.id,
            },
        );
        self.outbox.force_unbudgeted(self.sid, 0, Batch::One(&msg));
        true
    }
}

/// One consumer of a queue held by a connection.
pub(crate) struct QueueMember {
    pub(crate) queue: Arc<Queue>,
    consumer: Arc<QueueConsumer>,
    sink: Arc<OutboxSink>,
}

impl QueueMember {
    /// Consumer of `queue` on subscription `sid` of `outbox` (`no_ack`: settled as written;
    /// otherwise at most `prefetch` unacknowledged, 0: no limit). `Err`: the queue is
    /// deleted or has an exclusive consumer.
    pub(crate) fn join(
        outbox: &Arc<Outbox>,
        sid: u32,
        queue: Arc<Queue>,
        no_ack: bool,
        prefetch: usize,
    ) -> Result<QueueMember, ()> {
        if !no_ack {
            outbox.set_acked(sid, true);
        }
        let sink = Arc::new(OutboxSink::new(outbox.clone(), sid));
        let consumer = Arc::new(QueueConsumer::new(sink.clone(), no_ack, false, prefetch));
        if queue.add_consumer(consumer.clone(), || {}).is_err() {
            outbox.set_acked(sid, false);
            return Err(());
        }
        Ok(QueueMember {
            queue,
            consumer,
            sink,
        })
    }

    /// Leaves the queue: what the consumer held goes back to its place, for another
    /// consumer. The outbox forgets the subscription's unacknowledged deliveries.
    pub(crate) fn leave(self, broker: &hayate_broker::Broker, outbox: &Outbox) {
        let unused = self.queue.remove_consumer(&self.consumer);
        let _ = outbox.take_unacked(Some(self.sink.sid));
        outbox.set_acked(self.sink.sid, false);
        give_back_all(self.sink.take_all(), true);
        if unused {
            // Auto-delete: its last consumer left.
            self.queue.delete_unused(broker);
        }
    }

    /// The held delivery a settled delivery (token in `attrs.stream_offset`) stands for.
    pub(crate) fn take(&self, d: &hayate_broker::Delivery) -> Option<Unacked> {
        self.sink.take(d.msg.attrs.stream_offset?)
    }
}
