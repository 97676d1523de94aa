//! The connection an outbox serves: its sink (set by a new connection), detaching it (the
//! epochs that tell a writer its connection is gone), cutting off a slow consumer, and
//! closing.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::{OutBuf, Outbox};
use crate::Sink;

impl Outbox {
    /// Cuts the connection off as a slow consumer: queued output is discarded, blocked
    /// publishers are released, the writer stops (even in the middle of a write that cannot
    /// finish) and so the connection ends. Deliveries offered meanwhile are accepted and
    /// discarded; what the ack tracker and the encoder hold is kept, to be given back or
    /// kept for a later connection. A new connection ([`Outbox::set_sink`]) or
    /// [`Outbox::detach`] clears the state.
    /// Returns true for the call that cut it (not when it was already cut or closed).
    pub fn cut(&self) -> bool {
        let mut st = self.lock();
        if st.cut || st.closed {
            return false;
        }
        st.cut = true;
        st.buf = OutBuf::default();
        st.settle_charge();
        st.lost.clear();
        st.sink = None;
        st.wake_pending = true;
        drop(st);
        self.cut.store(true, Ordering::Release);
        self.cut_notify.notify_waiters();
        self.data.notify_waiters();
        self.space.notify_waiters();
        true
    }

    /// True once [`Outbox::cut`] was called (until the next connection).
    pub fn is_cut(&self) -> bool {
        self.cut.load(Ordering::Acquire)
    }

    /// Resolves when the outbox is cut off (see [`Outbox::cut`]); the writer selects on it.
    pub async fn cut_off(&self) {
        loop {
            let n = self.cut_notify.notified();
            tokio::pin!(n);
            n.as_mut().enable();
            if self.is_cut() {
                return;
            }
            n.await;
        }
    }

    /// Detaches the outbox from its connection without closing it: what is queued is
    /// discarded (it belonged to that connection's byte stream), the sink is dropped and
    /// the current writer sees [`Taken::Closed`](super::Taken::Closed). Offers are still
    /// accepted (the encoder decides what to keep for a later connection, as an offline MQTT
    /// session does).
    /// `f` runs under the lock, so the encoder's state changes atomically with the
    /// detachment. Returns the new epoch, for the next writer.
    pub fn detach(&self, f: impl FnOnce()) -> u64 {
        let mut st = self.lock();
        st.epoch += 1;
        st.buf = OutBuf::default();
        // Timed deliveries of the connection that goes are not timed further.
        st.probe = None;
        st.probe_writing = None;
        st.lost.clear();
        st.sink = None;
        st.writing = false;
        st.taken = 0;
        st.sink_pending = false;
        st.settle_charge();
        st.wake_pending = false;
        st.stalled = false;
        st.cut = false;
        self.cut.store(false, Ordering::Release);
        self.attached.store(false, Ordering::Release);
        f();
        let epoch = st.epoch;
        drop(st);
        self.data.notify_waiters();
        self.space.notify_waiters();
        epoch
    }

    /// The current epoch (see [`Outbox::detach`]); a writer passes it to
    /// [`Outbox::take`] and [`Outbox::release`].
    pub fn epoch(&self) -> u64 {
        self.lock().epoch
    }

    /// Closes the outbox: nothing more is accepted; the writer drains what is queued, then
    /// sees [`Taken::Closed`](super::Taken::Closed). Blocked publishers are released.
    pub fn close(&self) {
        let mut st = self.lock();
        st.closed = true;
        st.sink = None;
        st.wake_pending = true;
        drop(st);
        self.data.notify_one();
        self.space.notify_waiters();
    }

    /// True once [`Outbox::close`] was called.
    pub fn is_closed(&self) -> bool {
        self.lock().closed
    }

    /// Sets the socket used by [`Outbox::try_flush`]; without one, only the writer writes.
    pub fn set_sink(&self, sink: Arc<dyn Sink>) {
        let mut st = self.lock();
        st.sink = Some(sink);
        st.cut = false;
        st.stalled = false;
        self.cut.store(false, Ordering::Release);
        self.attached.store(true, Ordering::Release);
    }

    /// False from [`Outbox::detach`] until a connection sets its sink again.
    pub fn is_attached(&self) -> bool {
        self.attached.load(Ordering::Acquire)
    }
}
