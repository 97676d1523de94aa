//! The confirm class (confirm.select) and publisher confirms: what a channel in confirm
//! mode published and confirmed ([`Confirms`]), what a publish waits for to be durable
//! ([`Durable`]), the task that waits ([`drain_confirms`]).

use std::sync::{Arc, Mutex};

use hayate_amqp::{Frame, Method, ReplyCode};
use hayate_broker::{Outbox, Session};
use hayate_core::sync::lock;

use super::Conn;
use super::error::{AmqpError, err, not_client};

/// Publisher confirms of a channel in confirm mode, shared with the task that waits for
/// stored messages to be durable ([`drain_confirms`]). Confirms go out in order: nothing
/// after a publish still waiting is acknowledged before it.
#[derive(Default)]
pub(super) struct Confirms {
    /// Publishes counted (the last delivery tag given).
    published: u64,
    /// Acknowledged (or nacked) up to here.
    confirmed: u64,
    /// Publishes a queue refused, or whose storing failed: nacked instead.
    refused: std::collections::BTreeSet<u64>,
    /// Publishes whose stored records are not durable yet.
    waiting: std::collections::BTreeSet<u64>,
    /// What they wait for, in order, for the channel's one waiting task.
    pending: std::collections::VecDeque<(u64, Vec<Durable>)>,
    /// That task runs.
    draining: bool,
    /// The channel is closed: nothing more is sent.
    pub(super) closed: bool,
}

impl std::fmt::Debug for Confirms {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Confirms")
            .field("published", &self.published)
            .field("confirmed", &self.confirmed)
            .field("waiting", &self.waiting.len())
            .finish_non_exhaustive()
    }
}

impl Confirms {
    /// The basic.ack / basic.nack due now, in order (one ack with `multiple` for a run).
    fn due(&mut self) -> Vec<Method> {
        let mut out = Vec::new();
        if self.closed {
            return out;
        }
        let limit = self
            .waiting
            .first()
            .map_or(self.published, |w| w.saturating_sub(1));
        while let Some(&tag) = self.refused.first() {
            if tag > limit {
                break;
            }
            self.refused.pop_first();
            if tag > self.confirmed + 1 {
                out.push(Method::BasicAck {
                    delivery_tag: tag - 1,
                    multiple: true,
                });
            }
            out.push(Method::BasicNack {
                delivery_tag: tag,
                multiple: false,
                requeue: false,
            });
            self.confirmed = tag;
        }
        if limit > self.confirmed {
            out.push(Method::BasicAck {
                delivery_tag: limit,
                multiple: true,
            });
            self.confirmed = limit;
        }
        out
    }
}

/// What a publish waits for before it is confirmed (or a transaction committed): a durable
/// queue's record, or streams' appends, to be durable.
pub(super) enum Durable {
    Record(Arc<hayate_broker::queue::store::Store>, u64),
    Streams(hayate_broker::stream::Stored),
}

impl Durable {
    /// `Some(true)` once durable; `None` while not known yet (or failed: [`Durable::wait`]
    /// says so). Takes no waker: probing a publish behind the one awaited costs nothing.
    fn ready(&self) -> Option<bool> {
        match self {
            Durable::Record(s, o) => s.is_durable(*o).then_some(true),
            Durable::Streams(st) => st.ready().map(|r| r.is_ok()),
        }
    }

    /// Durable (true) or failed (false).
    async fn wait(self) -> bool {
        match self {
            Durable::Record(s, o) => match s.confirmed(o) {
                None => true,
                Some(c) => c.await.is_ok(),
            },
            Durable::Streams(st) => st.confirmed().await.is_ok(),
        }
    }
}

/// All of `waits` durable (false: one failed).
pub(super) async fn all_durable(waits: Vec<Durable>) -> bool {
    futures::future::join_all(waits.into_iter().map(Durable::wait))
        .await
        .into_iter()
        .all(|ok| ok)
}

/// The waiting task of a channel's confirms: awaits its publishes in order and sends the
/// confirms that become due, every publish already durable at once (one fsync covers many
/// publishes: one basic.ack with `multiple` for them), until none is left.
async fn drain_confirms(cf: Arc<Mutex<Confirms>>, outbox: Arc<Outbox>, ch: u16) {
    loop {
        let (tag, waits) = {
            let mut c = lock(&cf);
            match c.pending.pop_front() {
                Some(p) => p,
                None => {
                    c.draining = false;
                    return;
                }
            }
        };
        let mut settled = vec![(tag, all_durable(waits).await)];
        // Those after it already durable too. Probed outside the lock (a probe takes the
        // log's own locks); only this task takes from the front, so one put back keeps
        // its place.
        loop {
            let next = lock(&cf).pending.pop_front();
            let Some((t, waits)) = next else { break };
            if let Some(ok) = waits
                .iter()
                .map(Durable::ready)
                .try_fold(true, |all, r| r.map(|ok| all && ok))
            {
                settled.push((t, ok));
            } else {
                lock(&cf).pending.push_front((t, waits));
                break;
            }
        }
        let mut c = lock(&cf);
        for (t, ok) in settled {
            c.waiting.remove(&t);
            if !ok {
                c.refused.insert(t);
            }
        }
        let due = c.due();
        if !due.is_empty() {
            outbox.push_control_unbudgeted(|b| {
                for m in due {
                    Frame::Method(ch, m).encode(b);
                }
            });
        }
    }
}

/// One more publish on channel `ch` in confirm mode (`refused`: nacked), confirmed once
/// `waits` are durable: at once (by the next [`Conn::send_confirms`]) if there are none,
/// else by the channel's waiting task (started if it does not run).
pub(super) fn count_publish(
    cf: Arc<Mutex<Confirms>>,
    refused: bool,
    waits: Vec<Durable>,
    outbox: &Arc<Outbox>,
    ch: u16,
) {
    let mut c = lock(&cf);
    c.published += 1;
    let tag = c.published;
    if refused {
        c.refused.insert(tag);
    }
    if waits.is_empty() {
        return;
    }
    // Confirmed (with whatever followed it) once durable, by the channel's waiting task.
    c.waiting.insert(tag);
    c.pending.push_back((tag, waits));
    if !c.draining {
        c.draining = true;
        drop(c);
        tokio::spawn(drain_confirms(cf, outbox.clone(), ch));
    }
}

impl Conn<'_> {
    /// The confirm class: confirm.select.
    pub(super) fn confirm_class(
        &mut self,
        ch: u16,
        m: &Method,
        session: &mut Session,
    ) -> Result<(), AmqpError> {
        let Method::ConfirmSelect { no_wait } = m else {
            return Err(not_client(m));
        };
        let c = self.chan(ch)?;
        if c.tx.is_some() {
            return Err(err(
                ReplyCode::PreconditionFailed,
                "cannot switch from tx to confirm mode",
            ));
        }
        c.confirms.get_or_insert_with(Default::default);
        self.answer(session, ch, *no_wait, Method::ConfirmSelectOk {});
        Ok(())
    }

    /// Acknowledges what was published in confirm mode since the last time (one
    /// basic.ack with `multiple` per channel and read).
    /// A publish a queue refused gets its own basic.nack, those before it an ack.
    pub(super) fn send_confirms(&mut self, session: &mut Session) {
        for (ch, c) in &self.channels {
            let Some(cf) = &c.confirms else { continue };
            // Under the lock while written: a waiting task's confirms stay in order.
            let mut cf = lock(cf);
            if cf.published == cf.confirmed {
                continue;
            }
            let due = cf.due();
            if !due.is_empty() {
                session.outbox().push_reply_unbudgeted(|o| {
                    for m in due {
                        Frame::Method(*ch, m).encode(o.tail());
                    }
                });
                session.mark_own_output();
            }
        }
    }
}
