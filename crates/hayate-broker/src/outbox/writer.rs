//! What comes out of an outbox: the writer task takes everything queued and releases it once
//! written; a reader may instead flush inline, straight to the sink, without blocking.

use std::collections::VecDeque;

use bytes::Bytes;
use hayate_io::write_some;

use super::{Outbox, Taken};

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
    /// once it has written it.
    pub async fn take(&self, into: &mut VecDeque<Bytes>, epoch: u64) -> Taken {
        loop {
            {
                let mut guard = self.lock();
                let st = &mut *guard;
                if st.epoch != epoch || st.cut {
                    return Taken::Closed;
                }
                if !st.writing {
                    Self::encode_lost(st);
                    if !st.buf.is_empty() || st.sink_pending {
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
                    if st.closed {
                        return Taken::Closed;
                    }
                }
                st.wake_pending = false;
            }
            self.data.notified().await;
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
