//! Acknowledged delivery on an outbox: the ledger of the session's acknowledged
//! subscriptions, settled by ACK / NACK and given back when the subscriber goes away.

use super::{Delivery, OutBuf, Outbox, Settle, State};

impl Outbox {
    /// Makes subscription `sid` acknowledged (or not): its deliveries carry delivery ids and
    /// stay held until [`Outbox::ack`]. Set before the subscription is routed to.
    pub fn set_acked(&self, sid: u32, on: bool) {
        let mut st = self.lock();
        st.acked.retain(|&s| s != sid);
        if on {
            st.acked.push(sid);
        }
    }

    /// Acknowledges delivery `delivery` (or, `cumulative`, every delivery of the session up
    /// to it); returns how many were acknowledged (0: unknown or already acknowledged).
    pub fn ack(&self, delivery: u64, cumulative: bool) -> usize {
        let how = if cumulative {
            Settle::Through
        } else {
            Settle::One
        };
        self.settle(delivery, how).len()
    }

    /// Takes delivery `delivery` back (a NACK): the caller delivers it again (see
    /// `Session::give_back`). `None` if it is not in flight.
    pub fn nack(&self, delivery: u64) -> Option<Delivery> {
        self.settle(delivery, Settle::One).pop()
    }

    /// Removes from flight what an acknowledgement (or a NACK) of `delivery` covers, as `how`
    /// says, and returns it in order (an ACK drops it, a NACK gives it back). Frees room in
    /// the window and the budget: held deliveries are sent and blocked publishers woken. As
    /// with [`Outbox::push_reply_unbudgeted`], the caller flushes its own outbox after its read.
    pub fn settle(&self, delivery: u64, how: Settle) -> Vec<Delivery> {
        self.settle_filling(delivery, how, true)
    }

    /// [`Outbox::settle`] for a NACK of several: the room freed in the window is not filled
    /// yet with what waits, so that what the caller gives back to this outbox (then, with
    /// [`Outbox::redeliver_all`], which fills it) goes ahead of it, in its original order.
    /// The caller must call `redeliver_all` after (with nothing, if nothing comes back here).
    pub fn settle_back(&self, delivery: u64, how: Settle) -> Vec<Delivery> {
        self.settle_filling(delivery, how, false)
    }

    fn settle_filling(&self, delivery: u64, how: Settle, fill: bool) -> Vec<Delivery> {
        let mut st = self.lock();
        let taken = match how {
            Settle::One => st.acks.ack(delivery).into_iter().collect(),
            Settle::Through => st.acks.take_through(delivery, |_| true),
            Settle::ThroughSubscription => match st.acks.get(delivery).map(|d| d.sid) {
                Some(sid) => st.acks.take_through(delivery, |d| d.sid == sid),
                None => Vec::new(),
            },
        };
        self.after_ack(st, fill);
        taken
    }

    /// The subscription of delivery `delivery`, while it is in flight.
    pub fn delivery_sid(&self, delivery: u64) -> Option<u32> {
        self.lock().acks.get(delivery).map(|d| d.sid)
    }

    fn after_ack(&self, mut guard: std::sync::MutexGuard<'_, State>, fill: bool) {
        let st = &mut *guard;
        if st.closed {
            return;
        }
        if fill {
            Self::fill_window(st);
        }
        if st.cut {
            st.buf = OutBuf::default();
        }
        st.settle_charge();
        if st.sink.is_none() && !st.buf.is_empty() {
            self.wake(st);
        }
        drop(guard);
        self.after_take();
    }

    /// Delivers `d` again to its subscription on this outbox, ahead of what waits for the
    /// window, marked redelivered. False if the outbox is closed.
    pub fn redeliver(&self, d: Delivery) -> bool {
        self.redeliver_all(vec![d])
    }

    /// Delivers `ds` again, in their order, ahead of what waits for the window, marked
    /// redelivered (several NACKed at once come back in their original order, not the last
    /// first). False if the outbox is closed.
    pub fn redeliver_all(&self, ds: Vec<Delivery>) -> bool {
        let mut st = self.lock();
        if st.closed {
            return false;
        }
        for mut d in ds.into_iter().rev() {
            d.msg.attrs.redelivered = true;
            let size = d.msg.payload.len() + d.msg.key.as_bytes().len();
            st.acks.push_front(d, size, 0);
        }
        let st = &mut *st;
        Self::fill_window(st);
        if st.cut {
            st.buf = OutBuf::default();
        }
        self.wake(st);
        true
    }

    /// Takes every delivery not yet acknowledged (in flight, then waiting), of subscription
    /// `sid` or of all, in order: the session gives them to other members when its
    /// subscription or connection ends.
    pub fn take_unacked(&self, sid: Option<u32>) -> Vec<Delivery> {
        let mut st = self.lock();
        let all = st.acks.take_all();
        let (taken, kept): (Vec<Delivery>, Vec<Delivery>) = match sid {
            None => (all, Vec::new()),
            Some(s) => all.into_iter().partition(|d| d.sid == s),
        };
        // Deliveries of other subscriptions go out again with new ids (the receiver sees
        // them as redelivered); only an UNSUB of one of several acknowledged subscriptions
        // of a session takes this path.
        for mut d in kept {
            d.msg.attrs.redelivered = true;
            let size = d.msg.payload.len() + d.msg.key.as_bytes().len();
            st.acks.push(d, size, 0);
        }
        Self::fill_window(&mut st);
        st.settle_charge();
        drop(st);
        self.after_take();
        taken
    }

    /// Retires the deliveries to subscription `sid` that a later delivery of the same
    /// durable consumer message supersedes: those whose stream offset is a key of `latest`
    /// with a delivery count below the one it maps to (the delivery now on its way after an
    /// ack wait ran out). One sent leaves the window and the byte count, kept stripped so
    /// that a late ACK of its id still settles the message (`Ledger::retire`); one not
    /// sent yet is dropped. So however often the ack wait runs out, the session holds each
    /// message once. Returns how many were superseded.
    pub fn supersede(&self, sid: u32, latest: &std::collections::HashMap<u64, u32>) -> usize {
        if latest.is_empty() {
            return 0;
        }
        let old = |d: &Delivery| {
            d.sid == sid
                && d.msg
                    .attrs
                    .stream_offset
                    .and_then(|o| latest.get(&o))
                    .is_some_and(|&n| d.msg.attrs.deliveries < n)
        };
        let mut st = self.lock();
        let ids: Vec<u64> = st
            .acks
            .inflight()
            .filter(|(_, d)| old(d))
            .map(|(id, _)| id)
            .collect();
        for &id in &ids {
            st.acks.retire(id, |d| {
                d.msg.payload = bytes::Bytes::new();
                d.msg.headers = None;
            });
        }
        let dropped = st.acks.drop_ready_if(old);
        if ids.is_empty() && dropped == 0 {
            return 0;
        }
        self.after_ack(st, true);
        ids.len() + dropped
    }

    /// Deliveries of acknowledged subscriptions held (in flight and waiting).
    pub fn unacked(&self) -> usize {
        let st = self.lock();
        st.acks.len()
    }
}
