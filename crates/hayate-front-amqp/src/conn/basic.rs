//! The basic class but basic.publish (`publish`): basic.qos, consume, cancel, get and
//! recover, and the acknowledgements (basic.ack, nack, reject) of deliveries.

use std::sync::Arc;

use hayate_amqp::{Frame, Method, ReplyCode, ShortStr};
use hayate_broker::Session;
use hayate_core::sync::lock;
use hayate_core::{KeyExpr, Qos};

use super::channel::{Channel, ConsumerReg, channel_queues};
use super::error::{AmqpError, err, not_client};
use super::publish::{Body, Pending};
use super::queue::{delete_queue, rand_u64};
use super::tx::{TxOp, tx_room};
use super::{Conn, REPLY_SUFFIX};
use crate::delivery::OwnConsumer;
use crate::names::REPLY_TO_QUEUE;
use crate::queue::ConsumerSink;
use hayate_broker::queue::{QueueConsumer, Unacked, give_back_all};

/// Consumers per channel, at most.
const MAX_CONSUMERS: usize = 4096;

/// basic.ack (`requeue` None), basic.nack / basic.reject (`Some(requeue)`) of `tag` (and
/// every earlier one with `multiple`; tag 0 with `multiple` is all of them).
pub(super) fn settle(
    c: &mut Channel,
    tag: u64,
    multiple: bool,
    requeue: Option<bool>,
) -> Result<(), AmqpError> {
    let unknown = || {
        err(
            ReplyCode::PreconditionFailed,
            format!("unknown delivery tag {tag}"),
        )
    };
    let settled: Vec<Unacked> = {
        let mut st = lock(&c.shared.st);
        if multiple {
            let upto = if tag == 0 { u64::MAX } else { tag };
            let keep = st.unacked.split_off(&upto.saturating_add(1));
            let taken = std::mem::replace(&mut st.unacked, keep);
            if taken.is_empty() && tag != 0 {
                return Err(unknown());
            }
            taken.into_values().collect()
        } else {
            vec![st.unacked.remove(&tag).ok_or_else(unknown)?]
        }
    };
    match requeue {
        None => {
            for u in &settled {
                u.queue.settled(u);
            }
        }
        // All back to their places (or dead-lettered) before any goes out again: given
        // back in their original order.
        Some(rq) => give_back_all(settled, rq),
    }
    Ok(())
}

impl Conn<'_> {
    /// The basic class's methods that may wait or are rare (basic.publish, ack, nack and
    /// reject are [`Conn::basic_now`]'s).
    pub(super) fn basic_class(
        &mut self,
        ch: u16,
        m: &Method,
        session: &mut Session,
    ) -> Result<(), AmqpError> {
        match m {
            Method::BasicQos {
                prefetch_size,
                prefetch_count,
                global,
            } => {
                if *prefetch_size != 0 {
                    return Err(err(
                        ReplyCode::NotImplemented,
                        "prefetch_size!=0 is not implemented",
                    ));
                }
                let c = self.chan(ch)?;
                if *global {
                    lock(&c.shared.st).prefetch = usize::from(*prefetch_count);
                } else {
                    c.prefetch = usize::from(*prefetch_count);
                }
                let queues = channel_queues(c);
                self.send(session, ch, Method::BasicQosOk {});
                for q in queues {
                    q.core.dispatch();
                }
            }
            Method::BasicConsume {
                queue,
                consumer_tag,
                no_ack,
                exclusive,
                no_wait,
                ..
            } => {
                self.consume(
                    ch,
                    queue,
                    consumer_tag,
                    *no_ack,
                    *exclusive,
                    *no_wait,
                    session,
                )?;
            }
            Method::BasicCancel {
                consumer_tag,
                no_wait,
            } => {
                self.cancel(ch, consumer_tag, session);
                self.answer(
                    session,
                    ch,
                    *no_wait,
                    Method::BasicCancelOk {
                        consumer_tag: consumer_tag.clone(),
                    },
                );
            }
            Method::BasicGet { queue, no_ack, .. } => {
                let q = self.queue(queue)?;
                self.may_serve(&q)?;
                let chan: Arc<dyn hayate_broker::queue::QueueSink> = self.chan(ch)?.shared.clone();
                if !q.core.get(&chan, *no_ack) {
                    self.send(
                        session,
                        ch,
                        Method::BasicGetEmpty {
                            cluster_id: ShortStr::lit(""),
                        },
                    );
                } else {
                    session.mark_own_output();
                }
            }
            Method::BasicRecover { requeue } | Method::BasicRecoverAsync { requeue } => {
                let c = self.chan(ch)?;
                let all = std::mem::take(&mut lock(&c.shared.st).unacked);
                // Redelivered to whoever the queue picks (RabbitMQ requeues even when asked
                // to redeliver to the same consumer), all back before any goes out again:
                // in their original order.
                let _ = requeue;
                give_back_all(all.into_values(), true);
                if let Method::BasicRecover { .. } = m {
                    self.send(session, ch, Method::BasicRecoverOk {});
                }
            }
            m => return Err(not_client(m)),
        }
        Ok(())
    }

    /// The methods of every message (basic.publish, and basic.ack, nack and reject), which
    /// never wait: handled here, or `None` for [`Conn::method`].
    pub(super) fn basic_now(&mut self, ch: u16, m: &Method) -> Option<Result<(), AmqpError>> {
        let (tag, multiple, requeue) = match m {
            Method::BasicPublish {
                exchange,
                routing_key,
                mandatory,
                ..
            } => {
                return Some(self.chan(ch).map(|c| {
                    c.pending = Some(Pending {
                        exchange: exchange.clone(),
                        routing_key: routing_key.clone(),
                        mandatory: *mandatory,
                        header: None,
                        body: Body::default(),
                    });
                }));
            }
            Method::BasicAck {
                delivery_tag,
                multiple,
            } => (*delivery_tag, *multiple, None),
            Method::BasicNack {
                delivery_tag,
                multiple,
                requeue,
            } => (*delivery_tag, *multiple, Some(*requeue)),
            Method::BasicReject {
                delivery_tag,
                requeue,
            } => (*delivery_tag, false, Some(*requeue)),
            _ => return None,
        };
        Some(self.chan(ch).and_then(|c| match &mut c.tx {
            Some(tx) => {
                tx_room(tx)?;
                tx.push(match requeue {
                    None => TxOp::Ack(tag, multiple),
                    Some(r) => TxOp::Nack(tag, multiple, r),
                });
                Ok(())
            }
            None => settle(c, tag, multiple, requeue),
        }))
    }

    #[allow(clippy::too_many_arguments)]
    fn consume(
        &mut self,
        ch: u16,
        queue: &ShortStr,
        tag: &ShortStr,
        no_ack: bool,
        exclusive: bool,
        no_wait: bool,
        session: &mut Session,
    ) -> Result<(), AmqpError> {
        let tag = if tag.is_empty() {
            ShortStr::lit(&format!("amq.ctag-{:016x}", rand_u64()))
        } else {
            tag.clone()
        };
        let c = self.chan(ch)?;
        // Consumers the broker cancelled (their queue deleted) are forgotten first.
        c.consumers
            .retain(|_, r| !matches!(r, ConsumerReg::Queue(q, _) if q.is_deleted()));
        if c.consumers.len() >= MAX_CONSUMERS {
            return Err(err(
                ReplyCode::PreconditionFailed,
                format!("a channel has at most {MAX_CONSUMERS} consumers"),
            ));
        }
        if c.consumers.contains_key(&tag) {
            return Err(err(
                ReplyCode::NotAllowed,
                format!("attempt to reuse consumer tag '{tag}'"),
            ));
        }
        let ok = Method::BasicConsumeOk {
            consumer_tag: tag.clone(),
        };
        if queue.as_bytes() == REPLY_TO_QUEUE.as_bytes() {
            if !no_ack {
                return Err(err(
                    ReplyCode::PreconditionFailed,
                    "reply consumer cannot acknowledge",
                ));
            }
            if self.own_reply_consumer() {
                return Err(err(
                    ReplyCode::PreconditionFailed,
                    "reply consumer already set",
                ));
            }
            let sid = self.next_sid;
            self.next_sid += 1;
            let next_tag = self.chan(ch)?.shared.next_tag.clone();
            lock(&self.own).insert(
                sid,
                OwnConsumer {
                    channel: ch,
                    tag: tag.clone(),
                    next_tag,
                },
            );
            let expr = KeyExpr::new(&format!("{}/{REPLY_SUFFIX}", session.inbox()))
                .map_err(|e| err(ReplyCode::InternalError, e.to_string()))?;
            if let Err(e) = session.subscribe(sid, expr, None, Qos::default()) {
                lock(&self.own).remove(&sid);
                return Err(err(ReplyCode::InternalError, e.to_string()));
            }
            self.answer(session, ch, no_wait, ok);
            self.chan(ch)?
                .consumers
                .insert(tag, ConsumerReg::ReplyTo(sid));
            return Ok(());
        }
        let q = self.queue(queue)?;
        self.may_serve(&q)?;
        let c = self.chan(ch)?;
        let sink = Arc::new(ConsumerSink {
            chan: c.shared.clone(),
            tag: tag.clone(),
        });
        let consumer = Arc::new(QueueConsumer::new(sink, no_ack, exclusive, c.prefetch));
        // consume-ok once the queue took the consumer, before any delivery (under the
        // queue's lock: the queue may deliver as soon as it is added).
        let outbox = session.outbox().clone();
        let added = || {
            if !no_wait {
                outbox.push_reply_unbudgeted(|o| Frame::Method(ch, ok).encode(o.tail()));
            }
        };
        if q.core.add_consumer(consumer.clone(), added).is_err() {
            return Err(err(
                ReplyCode::AccessRefused,
                format!(
                    "queue '{}' in vhost '{vh}' in exclusive use",
                    q.name,
                    vh = self.vhost.name
                ),
            ));
        }
        self.chan(ch)?
            .consumers
            .insert(tag, ConsumerReg::Queue(q, consumer));
        session.mark_own_output();
        Ok(())
    }

    fn cancel(&mut self, ch: u16, tag: &ShortStr, session: &mut Session) {
        let Some(c) = self.channels.get_mut(&ch) else {
            return;
        };
        match c.consumers.remove(tag) {
            Some(ConsumerReg::Queue(q, consumer)) if q.remove_consumer(&consumer) => {
                delete_queue(&q);
            }
            Some(ConsumerReg::ReplyTo(sid)) => {
                session.unsubscribe(sid);
                lock(&self.own).remove(&sid);
            }
            Some(ConsumerReg::Queue(..)) | None => {}
        }
    }

    pub(super) fn own_reply_consumer(&self) -> bool {
        !lock(&self.own).is_empty()
    }
}
