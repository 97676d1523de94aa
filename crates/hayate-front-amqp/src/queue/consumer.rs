//! Consumers and dispatch: a channel's delivery state as queues see it ([`Chan`],
//! [`ChanState`], [`Unacked`]), a queue's [`Consumer`]s, and how messages go out to them
//! (round robin within prefetch, basic.get).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use hayate_amqp::ShortStr;
use hayate_broker::{OutBuf, Outbox};
use hayate_core::sync::lock;

use super::{EXPIRED, QMsg, QState, Queue};
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

/// Most bytes a consumer's outbox may hold before its queue stops delivering to it.
pub(super) const OUTBOX_LIMIT: usize = 1024 * 1024;

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
    pub(super) fn has_credit(&self, chan: &ChanState) -> bool {
        !chan.closed
            && self.chan.active.load(Ordering::Acquire)
            && (self.no_ack
                || ((self.prefetch == 0 || self.in_flight.load(Ordering::Acquire) < self.prefetch)
                    && (chan.prefetch == 0 || chan.unacked.len() < chan.prefetch)))
    }
}

impl Queue {
    /// Delivers what it can now.
    pub(crate) fn dispatch(self: &Arc<Self>) {
        let mut st = lock(&self.st);
        self.dispatch_locked(&mut st);
    }

    pub(super) fn dispatch_locked(self: &Arc<Self>, st: &mut QState) {
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
    pub(super) fn deliver(self: &Arc<Self>, st: &mut QState, c: &Arc<Consumer>, m: QMsg) {
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
    pub(super) fn write_delivery(
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
}
