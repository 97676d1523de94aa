//! What comes out of an outbox: the writer task takes everything queued and releases it once
//! written; a reader may instead flush inline, straight to the sink, without blocking.

use std::collections::VecDeque;
use std::time::Duration;

use bytes::Bytes;
// Tokio's clock (the system's, outside tests that pause it).
use tokio::time::Instant;

use super::{Outbox, State, Taken};
use crate::write_some;

/// Deliveries of different sessions to one outbox closer together than this are gathered
/// by its writer into one write (see [`Outbox::flush_from`]).
/// A burst of requests to one RPC server arrives within a few microseconds; the calls of a
/// single caller are a round trip apart, and its own deliveries are never gathered.
pub const GATHER_GAP: Duration = Duration::from_micros(50);

impl Outbox {
    /// More bytes are queued (not yet taken by a writer) than the budget: the connection's
    /// peer is not reading. Its driver stops reading it until the writer takes some.
    pub fn backed_up(&self) -> bool {
        let st = self.lock();
        !st.closed && st.buf.len() > self.budget
    }

    /// Bytes queued and not yet taken by a writer, and whether a write is under way.
    pub fn backlog(&self) -> (usize, bool) {
        let st = self.lock();
        (st.buf.len(), st.writing)
    }

    /// For the writer: waits until there is something to write and nobody else is writing,
    /// then moves everything queued into `into`. The caller must call [`Outbox::release`]
    /// once it has written it. After flushes of several sessions close together (see
    /// [`Outbox::flush_from`]) it first lets the tasks ready now run, once, so what they
    /// deliver leaves in the same write.
    pub async fn take(&self, into: &mut VecDeque<Bytes>, epoch: u64) -> Taken {
        let mut gathered = false;
        loop {
            let gather = {
                let mut guard = self.lock();
                let st = &mut *guard;
                if st.epoch != epoch || st.cut {
                    return Taken::Closed;
                }
                let mut gather = false;
                if !st.writing {
                    Self::encode_lost(st);
                    if !st.buf.is_empty() || st.sink_pending {
                        if std::mem::take(&mut st.gather) && !gathered {
                            gather = true;
                        } else {
                            st.sink_pending = false;
                            st.taken = st.buf.len();
                            st.buf.take_into(into);
                            st.probe_writing = st.probe.take();
                            st.wake_pending = false;
                            st.writing = true;
                            drop(guard);
                            self.after_take();
                            return Taken::Data;
                        }
                    } else if st.closed {
                        return Taken::Closed;
                    }
                }
                if !gather {
                    st.wake_pending = false;
                }
                gather
            };
            if gather {
                // Behind the tasks ready now (tokio runs a yielded task after them and
                // after the next look at the sockets), at most once per take: a steady
                // stream of flushes cannot hold the writer back.
                gathered = true;
                tokio::task::yield_now().await;
            } else {
                self.data.notified().await;
            }
        }
    }

    /// For the writer: the data from [`Outbox::take`] is written.
    pub fn release(&self, epoch: u64) {
        let mut st = self.lock();
        if st.epoch == epoch {
            st.writing = false;
            st.taken = 0;
            if let Some((at, hist)) = st.probe_writing.take() {
                hist.observe(at.elapsed());
            }
            st.settle_charge();
            if st.stalled
                && st.buf.len() + st.acks.held_bytes() + st.encoder.held_bytes() < self.budget / 2
            {
                st.stalled = false;
            }
        }
    }

    /// Writes what is queued straight to the sink, without blocking, if nobody else is
    /// writing. What the socket does not take now is put back and the writer is woken for
    /// it. `scratch` is the caller's reusable queue (empty on return).
    pub fn try_flush(&self, scratch: &mut VecDeque<Bytes>) {
        self.flush_inline(scratch, None);
    }

    /// [`Outbox::try_flush`] for the session `session` after it delivered here, unless
    /// another session asked less than [`GATHER_GAP`] ago: then many publishers are
    /// delivering to this one subscriber (an RPC server, a queue's consumer), and the
    /// writer, woken instead, takes what they all queued for one write (see
    /// [`Outbox::take`]) rather than each of them writing its own. A session's own
    /// successive flushes are always inline, so one publisher's latency is unchanged.
    pub fn flush_from(&self, scratch: &mut VecDeque<Bytes>, session: u64) {
        self.flush_inline(scratch, Some(session));
    }

    /// Notes that session `session` delivered here now; true when another session did less
    /// than [`GATHER_GAP`] ago (many publishers, one subscriber).
    fn fan_in(st: &mut State, session: u64) -> bool {
        let now = Instant::now();
        let near = st.last_delivery.is_some_and(|(other, at)| {
            other != session && now.saturating_duration_since(at) < GATHER_GAP
        });
        st.last_delivery = Some((session, now));
        near
    }

    fn flush_inline(&self, scratch: &mut VecDeque<Bytes>, session: Option<u64>) {
        let (sink, epoch, probe) = {
            let mut guard = self.lock();
            let st = &mut *guard;
            if st.writing || st.closed || st.cut {
                return;
            }
            let Some(sink) = st.sink.clone() else {
                return;
            };
            Self::encode_lost(st);
            if st.buf.is_empty() {
                return;
            }
            if let Some(id) = session
                && Self::fan_in(st, id)
            {
                st.gather = true;
                self.wake(st);
                return;
            }
            st.taken = st.buf.len();
            st.buf.take_into(scratch);
            st.writing = true;
            (sink, st.epoch, st.probe.take())
        };
        self.after_take();
        let result = write_some(&*sink, scratch);
        let failed = result.is_err();
        let mut st = self.lock();
        if st.epoch != epoch {
            // Detached meanwhile: the rest belonged to the old connection.
            scratch.clear();
            return;
        }
        st.writing = false;
        st.taken = 0;
        if failed {
            // The connection is broken: its writer fails too and ends it. The outbox stays
            // open (a persistent session outlives its connection).
            scratch.clear();
            st.sink = None;
            self.space.notify_waiters();
        } else if !scratch.is_empty() {
            st.buf.restore_front(scratch);
            // Not all written: the writer that finishes records the probe.
            st.probe = st.probe.take().or(probe);
        } else if result.is_ok_and(|done| !done) {
            st.sink_pending = true;
            st.probe = st.probe.take().or(probe);
        } else if let Some((at, hist)) = probe {
            hist.observe(at.elapsed());
        }
        st.settle_charge();
        // The writer finishes whatever is left (or notices the close).
        if !st.buf.is_empty() || st.sink_pending || st.closed {
            st.wake_pending = false;
            self.wake(&mut st);
        }
    }
}
