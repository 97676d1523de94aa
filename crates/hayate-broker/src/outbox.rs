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
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use bytes::{Bytes, BytesMut};
use tokio::sync::Notify;

use crate::Batch;

/// Payloads at least this large are queued by reference instead of copied.
pub const ZERO_COPY_THRESHOLD: usize = 16 * 1024;

/// Turns deliveries into a protocol's bytes. One per session, owned by its outbox.
///
/// This is the seam between the broker and the protocol front-ends: the native protocol
/// writes MSG / MSG_BATCH frames, MQTT will write PUBLISH packets, STOMP MESSAGE frames.
pub trait Encoder: Send + 'static {
    /// Encodes the delivery of every item of `batch` to subscription `sid`.
    fn encode(&mut self, sid: u32, batch: Batch<'_>, out: &mut OutBuf);
    /// Tells subscription `sid` that `count` messages were dropped for it.
    fn encode_lost(&mut self, sid: u32, count: u64, out: &mut OutBuf);
}

/// Encoded output: a queue of chunks plus a contiguous tail for small writes.
#[derive(Debug, Default)]
pub struct OutBuf {
    chunks: VecDeque<Bytes>,
    tail: BytesMut,
    chunk_bytes: usize,
}

impl OutBuf {
    /// The contiguous buffer to encode small things into.
    pub fn tail(&mut self) -> &mut BytesMut {
        &mut self.tail
    }

    /// Appends `payload`: copied into the tail when small, queued by reference when large.
    pub fn put_payload(&mut self, payload: &Bytes) {
        if payload.len() < ZERO_COPY_THRESHOLD {
            self.tail.extend_from_slice(payload);
        } else {
            self.seal_tail();
            self.chunk_bytes += payload.len();
            self.chunks.push_back(payload.clone());
        }
    }

    fn seal_tail(&mut self) {
        if !self.tail.is_empty() {
            let t = self.tail.split().freeze();
            self.chunk_bytes += t.len();
            self.chunks.push_back(t);
        }
    }

    /// Bytes queued.
    pub fn len(&self) -> usize {
        self.chunk_bytes + self.tail.len()
    }

    /// True if nothing is queued.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn take_into(&mut self, into: &mut VecDeque<Bytes>) {
        self.seal_tail();
        into.append(&mut self.chunks);
        self.chunk_bytes = 0;
    }
}

struct State {
    buf: OutBuf,
    encoder: Box<dyn Encoder>,
    /// Drops not yet reported, per subscription id.
    lost: Vec<(u32, u64)>,
    /// The writer has been signalled and has not yet taken the queue.
    wake_pending: bool,
    closed: bool,
}

/// How much of an offered batch the outbox took.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Offer {
    /// This many items (from the front) were queued; the rest did not fit.
    Took(usize),
    /// The session is closed; nothing was queued.
    Closed,
}

/// What the writer took from the outbox.
#[derive(Debug, PartialEq, Eq)]
pub enum Taken {
    /// Chunks were appended to the writer's queue.
    Data,
    /// The outbox is closed and empty: flush and shut down.
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
        Outbox {
            state: Mutex::new(State {
                buf: OutBuf::default(),
                encoder,
                lost: Vec::new(),
                wake_pending: false,
                closed: false,
            }),
            budget,
            data: Notify::new(),
            space: Notify::new(),
            has_blocked: AtomicBool::new(false),
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
    /// ([`Outbox::wait_space`]).
    pub fn offer(&self, sid: u32, batch: Batch<'_>) -> Offer {
        let mut st = self.lock();
        if st.closed {
            return Offer::Closed;
        }
        let queued = st.buf.len();
        let mut fit = 0;
        let mut size = 0;
        while fit < batch.len() {
            let c = batch.cost(fit);
            if queued + size + c > self.budget && !(queued == 0 && fit == 0) {
                break;
            }
            size += c;
            fit += 1;
        }
        if fit == 0 {
            return Offer::Took(0);
        }
        let st = &mut *st;
        if let Some(i) = st.lost.iter().position(|&(s, _)| s == sid) {
            let (_, n) = st.lost.swap_remove(i);
            st.encoder.encode_lost(sid, n, &mut st.buf);
        }
        st.encoder.encode(sid, batch.slice(0, fit), &mut st.buf);
        self.wake(st);
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

    /// Queues control output (handshake answers, PONG, errors) outside the budget.
    pub fn push_control(&self, f: impl FnOnce(&mut BytesMut)) {
        let mut st = self.lock();
        if st.closed {
            return;
        }
        f(st.buf.tail());
        self.wake(&mut st);
    }

    /// Closes the outbox: nothing more is accepted; the writer drains what is queued, then
    /// sees [`Taken::Closed`]. Blocked publishers are released.
    pub fn close(&self) {
        let mut st = self.lock();
        st.closed = true;
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

    /// For the writer: moves everything queued into `into`, waiting until there is something.
    pub async fn take(&self, into: &mut VecDeque<Bytes>) -> Taken {
        loop {
            {
                let mut guard = self.lock();
                let st = &mut *guard;
                if !st.lost.is_empty() {
                    for (sid, n) in std::mem::take(&mut st.lost) {
                        st.encoder.encode_lost(sid, n, &mut st.buf);
                    }
                }
                if !st.buf.is_empty() {
                    st.buf.take_into(into);
                    st.wake_pending = false;
                    drop(guard);
                    if self.has_blocked.swap(false, Ordering::SeqCst) {
                        self.space.notify_waiters();
                    }
                    return Taken::Data;
                }
                if st.closed {
                    return Taken::Closed;
                }
                st.wake_pending = false;
            }
            self.data.notified().await;
        }
    }
}
