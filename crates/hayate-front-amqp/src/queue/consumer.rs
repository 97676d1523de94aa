//! Channels as queues see them: a channel's delivery state ([`Chan`], [`ChanState`]), the
//! engine's [`QueueSink`] for basic.get (the channel) and for a consumer
//! ([`ConsumerSink`]), which write basic.get-ok and basic.deliver frames.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use hayate_amqp::{Frame, Method, ShortStr};
use hayate_broker::queue::{Delivered, QItem, QueueSink, ToFlush, Unacked};
use hayate_broker::{OutBuf, Outbox};
use hayate_core::Message;
use hayate_core::sync::lock;

use crate::delivery::{Delivery, encode_delivery};

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
    /// The channel's vhost (its key prefix: reply-to names are shown without it).
    pub(crate) vhost: Arc<crate::VHost>,
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

/// A consumer's sink: its channel and its consumer tag.
#[derive(Debug)]
pub(crate) struct ConsumerSink {
    pub(crate) chan: Arc<Chan>,
    pub(crate) tag: ShortStr,
}

/// A quorum queue's message given back: shown with `x-delivery-count`, its returns.
pub(super) fn with_delivery_count(m: &Message, returns: u32) -> Message {
    let mut m = m.clone();
    let h = m.headers.get_or_insert_with(Vec::new);
    h.retain(|(k, _)| k != "x-delivery-count");
    h.push((
        "x-delivery-count".into(),
        bytes::Bytes::from(returns.to_string()),
    ));
    m
}

impl Chan {
    /// May the channel take one more delivery (`acked`: one to acknowledge)?
    fn credit(&self, acked: bool) -> bool {
        let cs = lock(&self.st);
        !cs.closed
            && self.active.load(Ordering::Acquire)
            && (!acked || cs.prefetch == 0 || cs.unacked.len() < cs.prefetch)
    }

    /// Writes a delivery (basic.deliver with consumer tag `tag`, or basic.get-ok with
    /// `left`) and keeps it until acknowledged unless `no_ack`. The channel's state is held
    /// throughout and the tag is taken under the outbox's lock, so tags go out in order
    /// (whoever else delivers on the channel) and an acknowledgement never finds its tag
    /// missing.
    fn write(
        &self,
        d: Delivered<'_>,
        ctag: Option<&ShortStr>,
        m: &QItem,
        to_flush: ToFlush<'_>,
    ) -> bool {
        let mut cs = lock(&self.st);
        let frame_max = self.frame_max.load(Ordering::Relaxed);
        let counted;
        let msg = if d.returns > 0 {
            counted = with_delivery_count(&m.msg, d.returns);
            &counted
        } else {
            &m.msg
        };
        let exchange = ShortStr::new(m.via.source.clone()).unwrap_or_default();
        let mut tag = 0;
        self.outbox.push_control_buf_in(to_flush, |b: &mut OutBuf| {
            tag = self.next_tag.fetch_add(1, Ordering::AcqRel) + 1;
            let out = Delivery {
                channel: self.channel,
                consumer_tag: ctag,
                delivery_tag: tag,
                redelivered: d.redelivered,
                exchange: &exchange,
                routing_key: &m.via.subject,
                message_count: d.left,
                msg,
                vhost_prefix: &self.vhost.prefix,
            };
            encode_delivery(&out, frame_max, b);
        });
        if d.no_ack || tag == 0 {
            return false;
        }
        cs.unacked.insert(
            tag,
            Unacked {
                queue: d.queue.clone(),
                consumer: d.consumer.cloned(),
                id: d.id,
            },
        );
        true
    }
}

/// basic.get: the channel itself.
impl QueueSink for Chan {
    fn has_credit(&self, acked: bool) -> bool {
        self.credit(acked)
    }

    fn outbox(&self) -> &Arc<Outbox> {
        &self.outbox
    }

    fn deliver(&self, d: Delivered<'_>, item: &QItem, to_flush: ToFlush<'_>) -> bool {
        self.write(d, None, item, to_flush)
    }
}

/// basic.consume: basic.deliver with the consumer's tag.
impl QueueSink for ConsumerSink {
    fn has_credit(&self, acked: bool) -> bool {
        self.chan.credit(acked)
    }

    fn outbox(&self) -> &Arc<Outbox> {
        &self.chan.outbox
    }

    fn deliver(&self, d: Delivered<'_>, item: &QItem, to_flush: ToFlush<'_>) -> bool {
        self.chan.write(d, Some(&self.tag), item, to_flush)
    }

    /// The queue is deleted: basic.cancel.
    fn cancelled(&self) {
        let m = Method::BasicCancel {
            consumer_tag: self.tag.clone(),
            no_wait: true,
        };
        let ch = self.chan.channel;
        self.chan
            .outbox
            .push_control_unbudgeted(|b| Frame::Method(ch, m).encode(b));
    }
}
