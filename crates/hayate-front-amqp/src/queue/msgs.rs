//! A message in a queue ([`QMsg`]) and a queue's ready messages in delivery order
//! ([`Msgs`]: a FIFO per priority).

use std::collections::VecDeque;
use std::time::Instant;

use hayate_amqp::ShortStr;
use hayate_core::Message;

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
    pub(super) fn size(&self) -> usize {
        use hayate_broker::footprint::{ALLOC, data};
        data(&self.msg)
            + self.exchange.len()
            + self.routing_key.len()
            + 4 * ALLOC
            + 3 * std::mem::size_of::<QMsg>()
    }
}

/// A queue's ready messages in delivery order: a first-in first-out list per priority
/// (a queue without `x-max-priority` has priority 0 only), the highest served first. New
/// messages go to the back of their priority's list (O(1)); a message given back goes to
/// its place in its own list.
#[derive(Debug, Default)]
pub(super) struct Msgs {
    /// Index: the priority (grown to the highest one seen).
    levels: Vec<VecDeque<QMsg>>,
    len: usize,
}

impl Msgs {
    pub(super) fn len(&self) -> usize {
        self.len
    }

    pub(super) fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub(super) fn level(&mut self, priority: u8) -> &mut VecDeque<QMsg> {
        let p = usize::from(priority);
        if self.levels.len() <= p {
            self.levels.resize_with(p + 1, VecDeque::new);
        }
        &mut self.levels[p]
    }

    /// The next to deliver.
    pub(super) fn front(&self) -> Option<&QMsg> {
        self.levels.iter().rev().find_map(VecDeque::front)
    }

    pub(super) fn pop_front(&mut self) -> Option<QMsg> {
        let m = self.levels.iter_mut().rev().find_map(VecDeque::pop_front)?;
        self.len -= 1;
        Some(m)
    }

    /// A new message (its `seq` the highest yet): at the back of its priority.
    pub(super) fn push_back(&mut self, m: QMsg) {
        self.level(m.priority).push_back(m);
        self.len += 1;
    }

    /// A message given back: to its place among those of its priority.
    pub(super) fn insert_in_place(&mut self, m: QMsg) {
        let level = self.level(m.priority);
        let at = level.partition_point(|x| x.seq < m.seq);
        level.insert(at, m);
        self.len += 1;
    }

    /// The message with `priority` and `seq`, if it is still here.
    pub(super) fn get_mut(&mut self, priority: u8, seq: u64) -> Option<&mut QMsg> {
        let level = self.levels.get_mut(usize::from(priority))?;
        let at = level.partition_point(|x| x.seq < seq);
        level.get_mut(at).filter(|m| m.seq == seq)
    }

    pub(super) fn clear(&mut self) {
        self.levels.clear();
        self.len = 0;
    }
}
