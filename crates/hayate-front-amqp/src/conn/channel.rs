//! The channel class: channel.open, close and flow; a channel's state ([`Channel`]), soft
//! errors (channel.close from the broker) and what closing a channel releases.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use hayate_amqp::{Method, ReplyCode, ShortStr};
use hayate_broker::Session;
use hayate_core::sync::lock;

use super::Conn;
use super::confirm::Confirms;
use super::error::{AmqpError, End, err, not_client};
use super::frames::Later;
use super::publish::Pending;
use super::queue::delete_queue;
use super::tx::{TxOp, tx_bytes};
use crate::queue::{Chan, ChanState, Queue};
use hayate_broker::queue::{QueueConsumer, give_back_all};

/// A consumer of a channel.
#[derive(Debug)]
pub(super) enum ConsumerReg {
    Queue(Arc<Queue>, Arc<QueueConsumer>),
    /// Direct reply-to: a subscription of the connection's own session.
    ReplyTo(u32),
}

/// A channel, as its connection keeps it.
#[derive(Debug)]
pub(super) struct Channel {
    pub(super) shared: Arc<Chan>,
    /// We sent channel.close: everything but channel.close(-ok) is ignored.
    pub(super) closing: bool,
    pub(super) pending: Option<Pending>,
    /// Confirm mode: what is published and confirmed.
    pub(super) confirms: Option<Arc<Mutex<Confirms>>>,
    pub(super) tx: Option<Vec<TxOp>>,
    pub(super) consumers: HashMap<ShortStr, ConsumerReg>,
    /// basic.qos without `global`: the prefetch of consumers started from now on.
    pub(super) prefetch: usize,
}

/// The queues a channel's consumers take from.
pub(super) fn channel_queues(c: &Channel) -> Vec<Arc<Queue>> {
    c.consumers
        .values()
        .filter_map(|r| match r {
            ConsumerReg::Queue(q, _) => Some(q.clone()),
            ConsumerReg::ReplyTo(_) => None,
        })
        .collect()
}

impl Conn<'_> {
    /// The channel class's methods but channel.open ([`Conn::channel_method`]'s).
    pub(super) async fn channel_class(
        &mut self,
        ch: u16,
        m: &Method,
        session: &mut Session,
    ) -> Result<(), AmqpError> {
        match m {
            Method::ChannelClose { .. } => {
                self.release_channel(ch, session).await;
                self.send(session, ch, Method::ChannelCloseOk {});
            }
            Method::ChannelFlow { active } => {
                let c = self.chan(ch)?;
                c.shared.active.store(*active, Ordering::Release);
                let queues = channel_queues(c);
                self.send(session, ch, Method::ChannelFlowOk { active: *active });
                for q in queues {
                    q.core.dispatch();
                }
            }
            Method::ChannelFlowOk { .. } => {}
            m => return Err(not_client(m)),
        }
        Ok(())
    }

    /// A method on channel `ch`: channel.open, and basic.publish, ack, nack and reject here;
    /// the others for [`Conn::later`].
    pub(super) fn channel_method(
        &mut self,
        ch: u16,
        m: Method,
        session: &mut Session,
    ) -> Result<Option<Later>, End> {
        if let Method::ChannelOpen { .. } = m {
            if self.channels.contains_key(&ch) {
                return Err(End::Hard(
                    err(ReplyCode::ChannelError, "second 'channel.open' seen").on(&m),
                ));
            }
            let shared = Arc::new(Chan {
                channel: ch,
                outbox: session.outbox().clone(),
                frame_max: self.frame_max.clone(),
                active: AtomicBool::new(true),
                next_tag: Arc::new(AtomicU64::new(0)),
                vhost: self.vhost.clone(),
                st: Mutex::new(ChanState::default()),
            });
            self.channels.insert(
                ch,
                Channel {
                    shared,
                    closing: false,
                    pending: None,
                    confirms: None,
                    tx: None,
                    consumers: HashMap::new(),
                    prefetch: 0,
                },
            );
            self.send(
                session,
                ch,
                Method::ChannelOpenOk {
                    channel_id: Bytes::new(),
                },
            );
            return Ok(None);
        }
        let Some(chan) = self.channels.get(&ch) else {
            return Err(End::Hard(
                err(ReplyCode::ChannelError, "expected 'channel.open'").on(&m),
            ));
        };
        if chan.closing {
            return Ok(match m {
                Method::ChannelCloseOk {} => Some(Later::Release(ch, false)),
                Method::ChannelClose { .. } => Some(Later::Release(ch, true)),
                _ => None,
            });
        }
        if chan.pending.is_some() {
            return Err(End::Hard(
                err(
                    ReplyCode::UnexpectedFrame,
                    format!("expected content header for class 60, got non content header frame instead ({})", m.name()),
                )
                .on(&m),
            ));
        }
        match self.basic_now(ch, &m) {
            Some(r) => self.method_done(ch, &m, r, session).map(|()| None),
            None => Ok(Some(Later::ChannelMethod(ch, m))),
        }
    }

    pub(super) fn chan(&mut self, ch: u16) -> Result<&mut Channel, AmqpError> {
        self.channels
            .get_mut(&ch)
            .ok_or_else(|| err(ReplyCode::ChannelError, "channel is not open"))
    }

    /// A soft error: channel.close with it; the channel's frames are ignored until the
    /// client's channel.close-ok, its deliveries stop now and its messages go back once it
    /// is closed.
    pub(super) fn soft_close(&mut self, ch: u16, e: AmqpError, session: &mut Session) {
        tracing::debug!(
            conn = self.id,
            ch,
            code = e.code.code(),
            text = e.text,
            "amqp: channel error"
        );
        self.send(
            session,
            ch,
            Method::ChannelClose {
                reply_code: e.code.code(),
                reply_text: e.reply_text(),
                class_id: e.class,
                method_id: e.method,
            },
        );
        let dropped = self.channels.get_mut(&ch).map_or(0, |c| {
            c.closing = true;
            if let Some(cf) = &c.confirms {
                lock(cf).closed = true;
            }
            c.pending.take().map_or(0, |p| p.body.len())
        });
        self.release_held(dropped);
        self.release_channel_consumers(ch, session);
    }

    /// Stops a channel's deliveries: its consumers leave their queues.
    fn release_channel_consumers(&mut self, ch: u16, session: &mut Session) {
        let Some(c) = self.channels.get_mut(&ch) else {
            return;
        };
        lock(&c.shared.st).closed = true;
        for (_, reg) in c.consumers.drain() {
            match reg {
                ConsumerReg::Queue(q, consumer) => {
                    if q.remove_consumer(&consumer) {
                        delete_queue(&q);
                    }
                }
                ConsumerReg::ReplyTo(sid) => {
                    session.unsubscribe(sid);
                    lock(&self.own).remove(&sid);
                }
            }
        }
    }

    /// Closes a channel: consumers leave, unacknowledged deliveries go back to their
    /// queues (redelivered).
    pub(super) async fn release_channel(&mut self, ch: u16, session: &mut Session) {
        self.release_channel_consumers(ch, session);
        let Some(c) = self.channels.remove(&ch) else {
            return;
        };
        if let Some(cf) = &c.confirms {
            lock(cf).closed = true;
        }
        let held =
            c.pending.as_ref().map_or(0, |p| p.body.len()) + c.tx.as_deref().map_or(0, tx_bytes);
        self.release_held(held);
        let unacked = std::mem::take(&mut lock(&c.shared.st).unacked);
        // All back to their places before any goes out again: the original order is kept.
        give_back_all(unacked.into_values(), true);
    }
}
