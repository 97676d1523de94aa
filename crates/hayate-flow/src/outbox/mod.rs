//! The outbox of one session: encoded output waiting for the session's writer.
//!
//! Publishers (the reader tasks of other sessions) encode deliveries straight into the
//! outbox under its lock, the way nats-server writes into a client's pending buffer; the
//! session's writer is woken once and takes *everything* queued for one (vectored) write.
//! Small payloads are copied into a contiguous tail buffer; large ones are queued as
//! zero-copy [`Bytes`](bytes::Bytes) chunks, so a payload is copied at most once between
//! the publisher's read buffer and the subscriber's socket.
//!
//! The outbox is bounded in bytes. A delivery that does not fit is dropped and counted
//! (`drop`, reported to the subscriber through [`Encoder::encode_lost`]) or waits for room
//! (`block`: the publisher's reader stops reading, so TCP back-pressure reaches the
//! publisher). A single delivery larger than the budget is accepted when the outbox is
//! empty, so no message is ever undeliverable because of its size.
//!
//! # Layout
//! - this module: [`Encoder`], [`Outbox`] and its state, the results of its calls
//!   ([`Offer`], [`Taken`], [`Settle`]);
//! - `offer`: what goes in: offers within the budget, lost deliveries, waiting for room,
//!   deliveries outside the budget, control output and replies;
//! - `writer`: what comes out: the writer's take and release, inline flushes;
//! - `connection`: the connection served: its sink, detaching (epochs), cutting off a slow
//!   consumer, closing;
//! - `acked`: acknowledged delivery: the ack tracker, settled by ACK / NACK;
//! - `buf`: [`OutBuf`], the encoded output;
//! - `outgoing`: the outbox as hayate-io's connection driver sees it
//!   ([`Outgoing`](crate::outgoing::Outgoing)).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use hayate_core::Message;
use tokio::sync::Notify;

mod acked;
mod buf;
mod connection;
mod offer;
mod outgoing;
mod writer;

pub use buf::{OutBuf, ZERO_COPY_THRESHOLD};
pub use writer::GATHER_GAP;

use crate::Batch;
use crate::Sink;
use crate::ledger::Ledger;
use crate::memory::{Charge, Memory};
/// What the writer took from the outbox.
pub use crate::outgoing::Taken;
use crate::registry::SessionView;
use crate::traffic::{Totals, Traffic, TrafficClass};

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
    /// Deliveries the encoder discarded since the last call (count, payload bytes): those
    /// it could not send nor keep (an MQTT QoS 0 message for an offline session, a full
    /// session queue, a no-local subscription's own message). They are not counted as
    /// sent. Called after every encode.
    fn take_skipped(&mut self) -> (u64, u64) {
        (0, 0)
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
    acks: Ledger<Delivery>,
    /// The acknowledged subscriptions (usually none: checked with one `is_empty`).
    acked: Vec<u32>,
    /// A publisher gave up waiting for room (a `Stall::Drop` subscription): further
    /// deliveries that do not fit are dropped at once until the writer catches up.
    stalled: bool,
    /// The connection is being cut off as a slow consumer: output is discarded, the writer
    /// stops, the connection ends (see [`Outbox::cut`]).
    cut: bool,
    /// Bytes a writer took and has not yet written (they are still in memory).
    taken: usize,
    /// An inline flush left bytes inside the sink (TLS records not yet on the socket): the
    /// writer must run, even with nothing queued, to push them once the socket is ready.
    sink_pending: bool,
    /// This outbox's share of the broker-wide memory budget: what it holds past
    /// [`FREE_BYTES`].
    charge: Charge,
    /// A sampled publish queued here and not yet taken by a writer: when it reached the
    /// broker, and the histogram to record its delivery in (see `crate::latency`).
    probe: Option<Probe>,
    /// The probe in the data a writer took: recorded when the writer releases it.
    probe_writing: Option<Probe>,
    /// The last session that flushed its deliveries here ([`Outbox::flush_from`]), and
    /// when.
    last_delivery: Option<(u64, tokio::time::Instant)>,
    /// Deliveries of several sessions came close together: the writer lets the tasks ready
    /// now run before it takes the queue, so what they deliver leaves in one write.
    gather: bool,
}

/// A timed delivery (see [`Outbox::probe`]).
type Probe = (std::time::Instant, Arc<crate::latency::LatencyHistogram>);

/// What an outbox may hold (queued, being written, held for acknowledgements) without
/// charging the broker-wide memory budget: a subscriber that keeps up never touches it.
pub const FREE_BYTES: usize = 256 * 1024;

impl State {
    /// Bytes of this outbox that count against the broker-wide budget. (An encoder's held
    /// deliveries, an MQTT session's queue, are charged by the encoder itself.)
    fn pooled(&self) -> usize {
        (self.buf.len() + self.taken + self.acks.held_bytes()).saturating_sub(FREE_BYTES)
    }

    /// Gives back the budget this outbox no longer needs.
    fn settle_charge(&mut self) {
        let p = self.pooled();
        self.charge.shrink(p);
    }
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
    /// The session's traffic (what it published, what was delivered to it).
    traffic: Traffic,
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
        Outbox::with_memory(budget, encoder, window, &Memory::unlimited())
    }

    /// An outbox as [`Outbox::with_window`] that charges what it holds past [`FREE_BYTES`]
    /// to `memory`: when the pool has no room, an offer takes nothing more (the publisher
    /// drops or waits as for a full outbox), except the one delivery an empty outbox always
    /// takes.
    pub fn with_memory(
        budget: usize,
        encoder: Box<dyn Encoder>,
        window: usize,
        memory: &Arc<Memory>,
    ) -> Outbox {
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
                acks: Ledger::new(window),
                acked: Vec::new(),
                stalled: false,
                cut: false,
                taken: 0,
                sink_pending: false,
                charge: Charge::new(memory),
                probe: None,
                probe_writing: None,
                last_delivery: None,
                gather: false,
            }),
            budget,
            data: Notify::new(),
            space: Notify::new(),
            has_blocked: AtomicBool::new(false),
            attached: AtomicBool::new(true),
            cut: AtomicBool::new(false),
            cut_notify: Notify::new(),
            traffic: Traffic::default(),
        }
    }

    /// This outbox counting its session's traffic in `class` (see
    /// [`crate::traffic::TrafficClass`]).
    pub fn in_class(mut self, class: Option<&Arc<TrafficClass>>) -> Outbox {
        self.traffic = Traffic::new(class);
        self
    }

    /// The session's traffic: messages and payload bytes it published and was delivered.
    pub fn traffic(&self) -> &Traffic {
        &self.traffic
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // A panic while encoding cannot leave the queue half-written in a way that matters
        // more than losing the session, so poisoning is ignored.
        hayate_core::sync::lock(&self.state)
    }

    fn wake(&self, st: &mut State) {
        if !st.wake_pending {
            st.wake_pending = true;
            self.data.notify_one();
        }
    }

    /// Sends what the acknowledgement window has room for.
    fn fill_window(st: &mut State) {
        while let Some((id, d)) = st.acks.next_ready() {
            st.encoder.encode_acked(d.sid, id, &d.msg, &mut st.buf);
        }
    }

    fn encode_lost(st: &mut State) {
        if !st.lost.is_empty() {
            for (sid, n) in std::mem::take(&mut st.lost) {
                st.encoder.encode_lost(sid, n, &mut st.buf);
            }
        }
    }

    /// Times a delivery just queued: the publish reached the broker at `at`; the write that
    /// takes it records the time elapsed in `hist`. Ignored while another probe is pending
    /// and when no connection takes the output.
    pub fn probe(&self, at: std::time::Instant, hist: &Arc<crate::latency::LatencyHistogram>) {
        let mut st = self.lock();
        if st.probe.is_none() && st.sink.is_some() && !st.cut && !st.closed {
            st.probe = Some((at, hist.clone()));
        }
    }

    fn after_take(&self) {
        if self.has_blocked.swap(false, Ordering::SeqCst) {
            self.space.notify_waiters();
        }
    }
}

impl SessionView for Outbox {
    fn queued_bytes(&self) -> usize {
        self.backlog().0
    }

    fn traffic(&self) -> Totals {
        self.traffic.totals()
    }

    fn close(&self) {
        self.cut();
    }
}
