//! What goes into an outbox: publishers' offers within the byte budget (and what does not
//! fit: drops counted, publishers waiting for room, the stalled state), deliveries outside
//! the budget, and the session's own control output and replies.

use std::sync::atomic::Ordering;
use std::sync::{Arc, MutexGuard};

use bytes::BytesMut;

use super::{Delivery, Offer, OutBuf, Outbox, State};
use crate::Batch;

impl Outbox {
    /// Queues as many items of `batch` (from the front) as fit the budget. Items that do not
    /// fit are left to the caller, who drops them ([`Outbox::count_lost`]) or waits
    /// ([`Outbox::wait_space`]). When the outbox has a sink, the caller must later call
    /// [`Outbox::try_flush`] (as `Session::flush` does), or the data waits for the next wake.
    ///
    /// The budget counts the queued bytes and the bytes held for acknowledgements (by the
    /// ack tracker and the encoder). `own` says the publisher is this outbox's own session:
    /// then only the queued bytes count, because held deliveries are freed by acknowledgements
    /// that this very publisher's reader would have to read.
    pub fn offer(&self, sid: u32, origin: u64, batch: Batch<'_>, own: bool) -> Offer {
        let mut st = self.lock();
        if st.closed {
            return Offer::Closed;
        }
        let queued = if own {
            st.buf.len()
        } else {
            st.buf.len() + st.acks.held_bytes() + st.encoder.held_bytes()
        };
        let mut fit = 0;
        let mut size = 0;
        while fit < batch.len() {
            let c = batch.cost(fit);
            // A connection being cut off takes everything (and discards it): its
            // publishers must not wait for a budget that only its closing frees.
            if !st.cut && queued + size + c > self.budget && !(queued == 0 && fit == 0) {
                break;
            }
            size += c;
            fit += 1;
        }
        let st = &mut *st;
        if fit > 0 && !st.cut {
            fit = Self::charge_offer(st, &batch, fit, size, queued == 0);
        }
        if fit > 0 {
            if let Some(i) = st.lost.iter().position(|&(s, _)| s == sid) {
                let (_, n) = st.lost.swap_remove(i);
                st.encoder.encode_lost(sid, n, &mut st.buf);
            }
            let skipped = Self::put(st, sid, origin, batch.slice(0, fit));
            if !st.cut {
                self.note_sent(&batch.slice(0, fit), skipped);
            }
        }
        // With a sink, the publishing session flushes inline after its read
        // (`Session::flush`), so the writer task is woken only when the outbox is full.
        if fit < batch.len() || st.sink.is_none() {
            self.wake(st);
        }
        Offer::Took(fit)
    }

    /// Charges the broker-wide budget for the first `fit` items of `batch` (`size` bytes);
    /// returns how many it covers. When the pool has no room, only what the charge already
    /// covers is taken, and at least one item when the outbox is `empty` (forced: it is
    /// what guarantees every subscriber progress).
    fn charge_offer(
        st: &mut State,
        batch: &Batch<'_>,
        fit: usize,
        size: usize,
        empty: bool,
    ) -> usize {
        let held = st.buf.len() + st.taken + st.acks.held_bytes();
        let need = (held + size).saturating_sub(super::FREE_BYTES);
        if st.charge.cover(need) {
            return fit;
        }
        let allowed = super::FREE_BYTES + st.charge.bytes();
        let mut n = 0;
        let mut total = held;
        while n < fit && total + batch.cost(n) <= allowed {
            total += batch.cost(n);
            n += 1;
        }
        if n == 0 && empty {
            st.charge
                .force((held + batch.cost(0)).saturating_sub(super::FREE_BYTES));
            n = 1;
        }
        n
    }

    /// Records that `n` messages for `sid` were dropped; reported before its next delivery
    /// or when the writer next drains the outbox.
    pub fn count_lost(&self, sid: u32, n: u64) {
        let mut st = self.lock();
        match st.lost.iter_mut().find(|(s, _)| *s == sid) {
            Some((_, c)) => *c += n,
            None => st.lost.push((sid, n)),
        }
        // The writer encodes the report when it next drains, even if nothing else arrives.
        self.wake(&mut st);
    }

    /// Delivers `batch` to subscription `sid` whatever the budget (a queue's delivery
    /// to its consumer, within the consumer's credit: it must not be lost nor block the queue). False if
    /// the outbox is closed.
    pub fn force_unbudgeted(&self, sid: u32, origin: u64, batch: Batch<'_>) -> bool {
        let mut st = self.lock();
        if st.closed {
            return false;
        }
        let st = &mut *st;
        let held = st.buf.len() + st.taken + st.acks.held_bytes();
        let size: usize = (0..batch.len()).map(|i| batch.cost(i)).sum();
        st.charge
            .force((held + size).saturating_sub(super::FREE_BYTES));
        let skipped = Self::put(st, sid, origin, batch);
        if !st.cut {
            self.note_sent(&batch, skipped);
        }
        self.wake(st);
        true
    }

    /// Counts `batch` as sent to this outbox's session, but the deliveries its encoder
    /// discarded (`skipped`: count, payload bytes).
    fn note_sent(&self, batch: &Batch<'_>, skipped: (u64, u64)) {
        let bytes: u64 = (0..batch.len()).map(|i| batch.payload_len(i) as u64).sum();
        let n = (batch.len() as u64).saturating_sub(skipped.0);
        if n > 0 {
            self.traffic.note_out(n, bytes.saturating_sub(skipped.1));
        }
    }

    /// Encodes `batch` for `sid`: through the ack tracker for an acknowledged subscription,
    /// straight to the encoder otherwise. While the connection is being cut off, the bytes
    /// are discarded (the tracker and the encoder keep what they must give back).
    /// Returns what the encoder discarded (see [`super::Encoder::take_skipped`]).
    fn put(st: &mut State, sid: u32, origin: u64, batch: Batch<'_>) -> (u64, u64) {
        if !st.acked.is_empty() && st.acked.contains(&sid) {
            for i in 0..batch.len() {
                let msg = batch.message(i);
                st.acks.push(Delivery { sid, msg }, batch.cost(i), 0);
            }
            Self::fill_window(st);
        } else {
            st.encoder.encode(sid, batch, origin, &mut st.buf);
        }
        if st.cut {
            st.buf = OutBuf::default();
        }
        st.encoder.take_skipped()
    }

    /// Marks the outbox stalled: a publisher gave up waiting for room for a `Stall::Drop`
    /// subscription. Until the writer catches up (less than half the budget left), further
    /// deliveries that do not fit are dropped without waiting.
    pub fn set_stalled(&self) {
        self.lock().stalled = true;
    }

    /// See [`Outbox::set_stalled`].
    pub fn is_stalled(&self) -> bool {
        self.lock().stalled
    }

    /// Queues control output (handshake answers, PONG, errors) outside the budget.
    pub fn push_control_unbudgeted(&self, f: impl FnOnce(&mut BytesMut)) {
        if let Some(mut st) = self.append(|b| f(b.tail())) {
            self.wake(&mut st);
        }
    }

    /// Runs `f` on the output buffer unless the outbox is closed; the lock, still held, for
    /// what follows.
    fn append(&self, f: impl FnOnce(&mut OutBuf)) -> Option<MutexGuard<'_, State>> {
        let mut st = self.lock();
        if st.closed {
            return None;
        }
        f(&mut st.buf);
        Some(st)
    }

    /// Appends output like [`Outbox::push_control_unbudgeted`], given the whole output
    /// buffer (large payloads queued by reference, [`OutBuf::put_payload`]), and wakes the
    /// writer.
    pub fn push_control_buf(self: &Arc<Self>, f: impl FnOnce(&mut OutBuf)) {
        self.push_control_buf_in(None, f);
    }

    /// [`Outbox::push_control_buf`] on behalf of a publishing session (a queue delivering
    /// what a publisher routed to it): an outbox with a sink goes into `to_flush`, the
    /// outboxes that session writes at the end of its read as it writes its other
    /// deliveries (the broker's `Session::flush`, gathered with other publishers' by
    /// [`Outbox::flush_from`]), instead of waking its writer. Without `to_flush`, the
    /// writer is woken.
    pub fn push_control_buf_in(
        self: &Arc<Self>,
        to_flush: Option<&mut Vec<Arc<Outbox>>>,
        f: impl FnOnce(&mut OutBuf),
    ) {
        let Some(mut st) = self.append(f) else {
            return;
        };
        if st.sink.is_some()
            && let Some(t) = to_flush
        {
            if !t.iter().any(|o| Arc::ptr_eq(o, self)) {
                t.push(self.clone());
            }
            return;
        }
        self.wake(&mut st);
    }

    /// Runs `f` on the queue under the outbox's lock, for a reader answering its own client
    /// with output that depends on the encoder's state (an MQTT session releasing held
    /// messages when an acknowledgement frees its window): `f` may lock that state (lock
    /// order: outbox, then encoder state). Publishers blocked on a full outbox are woken.
    /// The writer is not woken when the outbox has a sink, because the caller sends the output itself with
    /// the broker's `Session::mark_own_output` and `Session::flush` at the end of its read.
    pub fn push_reply_unbudgeted(&self, f: impl FnOnce(&mut OutBuf)) {
        let Some(mut st) = self.append(f) else {
            return;
        };
        if st.sink.is_none() && !st.buf.is_empty() {
            self.wake(&mut st);
        }
        drop(st);
        self.after_take();
    }

    /// Waits until a writer has taken data (room may have appeared) or the outbox closed.
    /// Register before offering to avoid a lost wake-up: call this, pin it, `enable()` it,
    /// then offer, then await it.
    pub fn wait_space(&self) -> tokio::sync::futures::Notified<'_> {
        self.has_blocked.store(true, Ordering::SeqCst);
        self.space.notified()
    }
}
