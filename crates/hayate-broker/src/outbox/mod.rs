//! The outbox of one session: encoded output waiting for the session's writer.
//!
//! Publishers (the reader tasks of other sessions) encode deliveries straight into the
//! outbox under its lock, the way nats-server writes into a client's pending buffer; the
//! session's writer is woken once and takes *everything* queued for one (vectored) write.
//! Small payloads are copied into a contiguous tail buffer; large ones are queued as
//! zero-copy [`Bytes`] chunks, so a payload is copied at most once between the publisher's
//! read buffer and the subscriber's socket.
//!
//! The outbox is bounded in bytes. A delivery that does not fit is dropped and counted
//! (`drop`, reported to the subscriber through [`Encoder::encode_lost`]) or waits for room
//! (`block`: the publisher's reader stops reading, so TCP back-pressure reaches the
//! publisher). A single delivery larger than the budget is accepted when the outbox is
//! empty, so no message is ever undeliverable because of its size.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use bytes::{Bytes, BytesMut};
use hayate_core::Message;
use hayate_io::{Sink, write_some};
use tokio::sync::Notify;

mod acked;
mod buf;
mod outgoing;

pub use buf::{OutBuf, ZERO_COPY_THRESHOLD};
/// What the writer took from the outbox.
pub use hayate_io::conn::Taken;

use crate::Batch;
use crate::ack::AckTracker;

/// Turns deliveries into a protocol's bytes. One per session, owned by its outbox.
///
/// This is the seam between the broker and the protocol front-ends: the native protocol
/// writes MSG / MSG_BATCH frames, MQTT will write PUBLISH packets, STOMP MESSAGE frames.
pub trait Encoder: Send + 'static {
    /// Encodes the delivery of every item of `batch` to subscription `sid`; `origin` is the
    /// id of the publishing session (for MQTT's no-local). An encoder may also hold a
    /// delivery back (flow control, an offline session) or skip it.
    fn encode(&mut self, sid: u32, batch: Batch<'_>, origin: u64, out: &mut OutBuf);
    /// Tells subscription `sid` that `count` messages were dropped for it.
    fn encode_lost(&mut self, sid: u32, count: u64, out: &mut OutBuf);
    /// Encodes one delivery of an acknowledged subscription, carrying its delivery id (see
    /// [`Outbox::ack`]). A protocol without acknowledgements of its own encodes it as an
    /// ordinary delivery (the default).
    fn encode_acked(&mut self, sid: u32, delivery: u64, msg: &Message, out: &mut OutBuf) {
        let _ = delivery;
        self.encode(sid, Batch::One(msg), 0, out);
    }
    /// Bytes of deliveries the encoder holds back while its connection is attached (an MQTT
    /// session behind its in-flight window): they count against the outbox budget, so a
    /// client that does not acknowledge slows its publishers instead of growing the broker.
    fn held_bytes(&self) -> usize {
        0
    }
}

/// A delivery of an acknowledged subscription, held by its outbox until acknowledged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delivery {
    /// The subscription it was delivered to.
    pub sid: u32,
    /// The message.
    pub msg: Message,
}

struct State {
    buf: OutBuf,
    encoder: Box<dyn Encoder>,
    /// Drops not yet reported, per subscription id.
    lost: Vec<(u32, u64)>,
    /// The writer has been signalled and has not yet taken the queue.
    wake_pending: bool,
    /// Someone (the writer task or an inline flush) holds taken data that is not yet fully
    /// written: nobody else may take, so bytes leave in order.
    writing: bool,
    closed: bool,
    /// The socket for inline flushes; dropped on close so the socket can be released.
    sink: Option<Arc<dyn Sink>>,
    /// Bumped by [`Outbox::detach`]: a writer or inline flush of an earlier epoch writes to
    /// a connection that is gone and must not touch the queue again.
    epoch: u64,
    /// Deliveries of acknowledged subscriptions not yet acknowledged, and those waiting for
    /// the window.
    acks: AckTracker<Delivery>,
    /// The acknowledged subscriptions (usually none: checked with one `is_empty`).
    acked: Vec<u32>,
    /// A publisher gave up waiting for room (a `Stall::Drop` subscription): further
    /// deliveries that do not fit are dropped at once until the writer catches up.
    stalled: bool,
    /// The connection is being cut off as a slow consumer: output is discarded, the writer
    /// stops, the connection ends (see [`Outbox::cut`]).
    cut: bool,
}

/// What an acknowledgement covers (see [`Outbox::settle`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Settle {
    /// That delivery only.
    One,
    /// Every delivery of the session up to it (native cumulative ACK).
    Through,
    /// Every delivery of its subscription up to it (STOMP's `client` ack mode).
    ThroughSubscription,
}

/// How much of an offered batch the outbox took.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Offer {
    /// This many items (from the front) were queued; the rest did not fit.
    Took(usize),
    /// The session is closed; nothing was queued.
    Closed,
}

/// The bounded output queue of one session.
pub struct Outbox {
    state: Mutex<State>,
    budget: usize,
    /// Wakes the writer.
    data: Notify,
    /// Wakes publishers blocked on a full outbox.
    space: Notify,
    has_blocked: AtomicBool,
    /// A connection takes the output (see [`Outbox::detach`]); queue groups prefer
    /// attached members.
    attached: AtomicBool,
    /// Set by [`Outbox::cut`]; wakes the writer out of a write that cannot finish.
    cut: AtomicBool,
    cut_notify: Notify,
}

impl std::fmt::Debug for Outbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Outbox")
            .field("budget", &self.budget)
            .finish_non_exhaustive()
    }
}

impl Outbox {
    /// An outbox holding at most about `budget` bytes, encoding with `encoder`.
    pub fn new(budget: usize, encoder: Box<dyn Encoder>) -> Outbox {
        Outbox::with_window(budget, encoder, 1024)
    }

    /// An outbox as [`Outbox::new`] whose acknowledged subscriptions have at most `window`
    /// deliveries in flight.
    pub fn with_window(budget: usize, encoder: Box<dyn Encoder>, window: usize) -> Outbox {
        Outbox {
            state: Mutex::new(State {
                buf: OutBuf::default(),
                encoder,
                lost: Vec::new(),
                wake_pending: false,
                writing: false,
                closed: false,
                sink: None,
                epoch: 0,
                acks: AckTracker::new(window),
                acked: Vec::new(),
                stalled: false,
                cut: false,
            }),
            budget,
            data: Notify::new(),
            space: Notify::new(),
            has_blocked: AtomicBool::new(false),
            attached: AtomicBool::new(true),
            cut: AtomicBool::new(false),
            cut_notify: Notify::new(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // A panic while encoding cannot leave the queue half-written in a way that matters
        // more than losing the session, so poisoning is ignored.
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn wake(&self, st: &mut State) {
        if !st.wake_pending {
            st.wake_pending = true;
            self.data.notify_one();
        }
    }

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
        if fit > 0 {
            if let Some(i) = st.lost.iter().position(|&(s, _)| s == sid) {
                let (_, n) = st.lost.swap_remove(i);
                st.encoder.encode_lost(sid, n, &mut st.buf);
            }
            Self::put(st, sid, origin, batch.slice(0, fit));
        }
        // With a sink, the publishing session flushes inline after its read
        // (`Session::flush`), so the writer task is woken only when the outbox is full.
        if fit < batch.len() || st.sink.is_none() {
            self.wake(st);
        }
        Offer::Took(fit)
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

    /// Delivers `batch` to subscription `sid` whatever the budget (a queue's backlog
    /// handed to a new member, which must not be lost nor block the subscriber). False if
    /// the outbox is closed.
    pub fn force_unbudgeted(&self, sid: u32, origin: u64, batch: Batch<'_>) -> bool {
        let mut st = self.lock();
        if st.closed {
            return false;
        }
        let st = &mut *st;
        Self::put(st, sid, origin, batch);
        self.wake(st);
        true
    }

    /// Encodes `batch` for `sid`: through the ack tracker for an acknowledged subscription,
    /// straight to the encoder otherwise. While the connection is being cut off, the bytes
    /// are discarded (the tracker and the encoder keep what they must give back).
    fn put(st: &mut State, sid: u32, origin: u64, batch: Batch<'_>) {
        if !st.acked.is_empty() && st.acked.contains(&sid) {
            for i in 0..batch.len() {
                let msg = batch.message(i);
                st.acks.push(Delivery { sid, msg }, batch.cost(i));
            }
            Self::fill_window(st);
        } else {
            st.encoder.encode(sid, batch, origin, &mut st.buf);
        }
        if st.cut {
            st.buf = OutBuf::default();
        }
    }

    /// Sends what the acknowledgement window has room for.
    fn fill_window(st: &mut State) {
        while let Some((id, d)) = st.acks.next_ready() {
            st.encoder.encode_acked(d.sid, id, &d.msg, &mut st.buf);
        }
    }

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
        let mut st = self.lock();
        if st.closed {
            return;
        }
        f(st.buf.tail());
        self.wake(&mut st);
    }

    /// Runs `f` on the queue under the outbox's lock, for a reader answering its own client
    /// with output that depends on the encoder's state (an MQTT session releasing held
    /// messages when an acknowledgement frees its window): `f` may lock that state (lock
    /// order: outbox, then encoder state). Publishers blocked on a full outbox are woken.
    /// The writer is not woken when the outbox has a sink, because the caller sends the output itself with
    /// [`Session::mark_own_output`](crate::Session::mark_own_output) and
    /// [`Session::flush`](crate::Session::flush) at the end of its read.
    pub fn push_reply_unbudgeted(&self, f: impl FnOnce(&mut OutBuf)) {
        let mut st = self.lock();
        if st.closed {
            return;
        }
        f(&mut st.buf);
        if st.sink.is_none() && !st.buf.is_empty() {
            self.wake(&mut st);
        }
        drop(st);
        self.after_take();
    }

    /// Detaches the outbox from its connection without closing it: what is queued is
    /// discarded (it belonged to that connection's byte stream), the sink is dropped and
    /// the current writer sees [`Taken::Closed`]. Offers are still accepted (the encoder
    /// decides what to keep for a later connection, as an offline MQTT session does).
    /// `f` runs under the lock, so the encoder's state changes atomically with the
    /// detachment. Returns the new epoch, for the next writer.
    pub fn detach(&self, f: impl FnOnce()) -> u64 {
        let mut st = self.lock();
        st.epoch += 1;
        st.buf = OutBuf::default();
        st.lost.clear();
        st.sink = None;
        st.writing = false;
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
    /// sees [`Taken::Closed`]. Blocked publishers are released.
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

    /// Waits until a writer has taken data (room may have appeared) or the outbox closed.
    /// Register before offering to avoid a lost wake-up: call this, pin it, `enable()` it,
    /// then offer, then await it.
    pub fn wait_space(&self) -> tokio::sync::futures::Notified<'_> {
        self.has_blocked.store(true, Ordering::SeqCst);
        self.space.notified()
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

    /// Bytes queued and not yet taken by a writer, and whether a write is under way.
    pub fn backlog(&self) -> (usize, bool) {
        let st = self.lock();
        (st.buf.len(), st.writing)
    }

    fn encode_lost(st: &mut State) {
        if !st.lost.is_empty() {
            for (sid, n) in std::mem::take(&mut st.lost) {
                st.encoder.encode_lost(sid, n, &mut st.buf);
            }
        }
    }

    fn after_take(&self) {
        if self.has_blocked.swap(false, Ordering::SeqCst) {
            self.space.notify_waiters();
        }
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
                    if !st.buf.is_empty() {
                        st.buf.take_into(into);
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
        let (sink, epoch) = {
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
            st.buf.take_into(scratch);
            st.writing = true;
            (sink, st.epoch)
        };
        self.after_take();
        let failed = write_some(&*sink, scratch).is_err();
        let mut st = self.lock();
        if st.epoch != epoch {
            // Detached meanwhile: the rest belonged to the old connection.
            scratch.clear();
            return;
        }
        st.writing = false;
        if failed {
            // The connection is broken: its writer fails too and ends it. The outbox stays
            // open (a persistent session outlives its connection).
            scratch.clear();
            st.sink = None;
            self.space.notify_waiters();
        } else if !scratch.is_empty() {
            st.buf.restore_front(scratch);
        }
        // The writer finishes whatever is left (or notices the close).
        if !st.buf.is_empty() || st.closed {
            st.wake_pending = false;
            self.wake(&mut st);
        }
    }
}
