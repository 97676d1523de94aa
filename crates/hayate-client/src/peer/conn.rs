//! One connection of a [`PeerServer`](super::PeerServer): the handshake, the frames a client
//! sends, the requests in hand (at most [`PeerOptions::max_in_flight`](super::PeerOptions))
//! and the replies, routed to the connection's subscriptions.
//!
//! The connection runs on hayate-io's connection driver ([`Conn`]), as the broker's
//! front-ends do: this module is the peer's [`Handler`] (its frames, its requests in hand as
//! the handler's events) and what happens after the driver returns (answer what is in hand,
//! close, linger). Replies go out through a broker [`Outbox`]: written from this task after
//! each read or answer, the rest by the outbox's writer task.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use bytes::BytesMut;
use futures::FutureExt;
use futures::stream::{FuturesUnordered, StreamExt};
use hayate_core::{INBOX_PREFIX, KeyExpr, Message};
use hayate_io::conn::{Handler, InputBudget, Stop};
use hayate_native::{ErrorCode, Frame, check_options, encode_msg_head};
use tokio::net::TcpStream;
use tokio::sync::watch;
use tokio::time::Instant;

use super::listen::{End, Names, Wire, close_and_linger, open};
use super::{Reply, Shared};

/// How long a closed connection reads (and discards) what the caller still sends, so that
/// closing with unread input does not reset the connection and lose the last replies.
pub(super) const LINGER: Duration = Duration::from_secs(1);

/// Replies queued and not yet written, at most: past it the connection reads no more
/// requests until the caller has taken some (a caller that does not read its replies).
const OUT_BUDGET: usize = 4 * 1024 * 1024;

/// How a `PeerServer`'s connection names itself.
static NAMES: Names = Names {
    hello: "peer",
    log: "peer",
    their_err: "client error",
};

/// The peer's side of one connection, as the driver sees it.
struct Peer {
    wire: Wire,
    shared: Arc<Shared>,
    subs: Vec<(u32, KeyExpr)>,
    /// Requests decoded but not started (the rest of a PUB_BATCH past the in-flight limit).
    queued: VecDeque<Message>,
    running: FuturesUnordered<Reply>,
}

pub(super) async fn serve_conn(
    stream: TcpStream,
    id: u64,
    shared: Arc<Shared>,
    stop: watch::Receiver<bool>,
) {
    let (mut conn, outbox) = open(stream, stop, OUT_BUDGET, None, InputBudget::default());
    let mut p = Peer {
        wire: Wire::new(
            id,
            outbox.clone(),
            shared.options.max_payload,
            shared.options.handshake_timeout,
            &NAMES,
        ),
        shared,
        subs: Vec::new(),
        queued: VecDeque::new(),
        running: FuturesUnordered::new(),
    };
    let end = conn.drive(&mut p).await;
    tracing::debug!(conn = id, ?end, "peer: connection ends");
    // The caller gets its replies in hand, the ERR or nothing, within drain_timeout (a
    // caller that does not read must not hold a stopping server).
    let deadline = Instant::now() + p.shared.options.drain_timeout;
    match end {
        End::Closed | End::Shutdown => p.answer_in_hand(deadline).await,
        End::Refused => p.wire.flush(),
        End::Gone => {}
    }
    drop(p);
    close_and_linger(conn, &outbox, deadline, LINGER).await;
}

impl Peer {
    /// At the in-flight limit, or the caller is behind on its replies: read no requests.
    fn held(&self) -> bool {
        self.running.len() + self.queued.len() >= self.shared.options.max_in_flight
            || self.wire.outbox.backlog().0 >= OUT_BUDGET
    }

    /// Starts queued requests up to the in-flight limit.
    fn start_queued(&mut self) {
        while self.running.len() < self.shared.options.max_in_flight
            && let Some(m) = self.queued.pop_front()
        {
            self.running.push((self.shared.handler)(m));
        }
    }

    /// Starts what the in-flight limit allows and routes every reply already available.
    fn progress(&mut self) {
        loop {
            self.start_queued();
            match self.running.next().now_or_never() {
                Some(Some(done)) => self.route(done),
                _ => return,
            }
        }
    }

    /// Answers the requests in hand (queued ones too) until `deadline`, writing each reply
    /// as it comes.
    async fn answer_in_hand(&mut self, deadline: Instant) {
        loop {
            self.start_queued();
            if self.running.is_empty() {
                break;
            }
            match tokio::time::timeout_at(deadline, self.running.next()).await {
                Ok(Some(done)) => {
                    self.route(done);
                    self.wire.flush();
                }
                _ => break,
            }
        }
    }

    /// Sends a handler's reply to each subscription of the connection that matches its key.
    fn route(&mut self, reply: Option<Message>) {
        let Some(m) = reply else { return };
        if let Err(e) = check_options(&m) {
            tracing::warn!(conn = self.wire.id, key = %m.key, "peer: reply not sent: {e}");
            return;
        }
        let subs = &self.subs;
        self.wire.outbox.push_reply_unbudgeted(|o| {
            for (sid, expr) in subs {
                if expr.matches(&m.key) {
                    encode_msg_head(*sid, &m, o.tail());
                    o.put_payload(&m.payload);
                }
            }
        });
    }

    fn serves(&self, key: &hayate_core::Key) -> bool {
        self.shared.exprs.iter().any(|e| e.matches(key))
    }

    fn hello(&mut self, frame: Frame) -> Result<(), End> {
        self.wire.hello(frame)?;
        self.wire.welcome(
            self.shared.options.name.clone(),
            format!("{INBOX_PREFIX}/{}", self.wire.id),
        );
        Ok(())
    }

    fn on_frame(&mut self, frame: Frame) -> Result<(), End> {
        if !self.wire.welcomed() {
            return self.hello(frame);
        }
        match frame {
            Frame::Pub(m) => {
                if let Some(end) = self.wire.too_large(m.payload.len()) {
                    return Err(end);
                }
                if self.serves(&m.key) {
                    self.running.push((self.shared.handler)(m));
                }
            }
            Frame::PubBatch { key, payloads } => {
                if let Some(end) = payloads.iter().find_map(|p| self.wire.too_large(p.len())) {
                    return Err(end);
                }
                if self.serves(&key) {
                    // Started as the in-flight limit allows.
                    self.queued
                        .extend(payloads.into_iter().map(|p| Message::new(key.clone(), p)));
                }
            }
            Frame::Sub(s) => {
                if self.subs.iter().any(|(sid, _)| *sid == s.sid) {
                    return Err(self.wire.refuse(
                        ErrorCode::BadSubscription,
                        &format!("subscription id {} is already in use", s.sid),
                    ));
                }
                // One connection, so a queue group has one member: a plain subscription.
                self.subs.push((s.sid, s.expr));
            }
            Frame::Unsub { sid } => self.subs.retain(|(s, _)| *s != sid),
            Frame::Ping(t) => self.wire.send(&Frame::Pong(t)),
            // A peer keeps no streams: the request is served as a PUB, and confirmed as not
            // captured.
            Frame::PubConfirm { id, msg } => {
                if let Some(end) = self.wire.too_large(msg.payload.len()) {
                    return Err(end);
                }
                if self.serves(&msg.key) {
                    self.running.push((self.shared.handler)(msg));
                }
                self.wire.not_captured(id);
            }
            // PONG, ACK, NACK, CLOSE, ERR, or one a client may not send.
            other => return self.wire.on_other(other),
        }
        Ok(())
    }
}

impl Handler for Peer {
    type Frame = Frame;
    type End = End;

    fn decode(&mut self, buf: &mut BytesMut) -> Result<Option<Frame>, End> {
        // Replies already available are queued first: they count against the output
        // budget before more requests are read, and make room under the in-flight limit.
        self.progress();
        if self.held() {
            return Ok(None);
        }
        self.wire.decode(buf)
    }

    async fn handle(&mut self, frame: Frame) -> Result<(), End> {
        self.on_frame(frame)
    }

    /// Starts what the in-flight limit allows, routes every reply already available and
    /// writes them all at once.
    fn flush(&mut self) {
        self.progress();
        self.wire.flush();
    }

    fn read_limit(&mut self, buf: &mut BytesMut) -> Option<usize> {
        let held = self.held();
        self.wire.read_limit(buf, held)
    }

    fn deadline(&self) -> Option<Instant> {
        self.wire.deadline()
    }

    async fn on_timer(&mut self) -> Result<(), End> {
        self.wire.on_timer()
    }

    /// A request answered, or (when the caller is behind on its replies) room in the
    /// outbox.
    async fn event(&mut self) -> Result<(), End> {
        let outbox = self.wire.outbox.clone();
        let room = async {
            if outbox.backlog().0 < OUT_BUDGET {
                return std::future::pending().await;
            }
            // Registered before the second look, so that a take in between is not missed.
            let taken = outbox.wait_space();
            tokio::pin!(taken);
            taken.as_mut().enable();
            if outbox.backlog().0 >= OUT_BUDGET {
                taken.await;
            }
        };
        tokio::select! {
            Some(done) = self.running.next(), if !self.running.is_empty() => self.route(done),
            () = room => {}
        }
        Ok(())
    }

    fn stopped(&mut self, why: Stop) -> End {
        match why {
            Stop::Eof => End::Closed,
            Stop::Shutdown => End::Shutdown,
            Stop::Io | Stop::WriterGone | Stop::Memory => End::Gone,
        }
    }
}
