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

use bytes::{Bytes, BytesMut};
use futures::FutureExt;
use futures::stream::{FuturesUnordered, StreamExt};
use hayate_core::{INBOX_PREFIX, KeyExpr, Message};
use hayate_flow::Outbox;
use hayate_io::conn::{Accepted, Conn, Handler, Stop};
use hayate_io::transport;
use hayate_native::{
    ErrorCode, Frame, PROTOCOL_VERSION, ReadPlanner, Welcome, check_options, encode_msg_head,
};
use tokio::net::TcpStream;
use tokio::sync::watch;
use tokio::time::Instant;

use super::{NoDeliveries, READ_BUF, Reply, Shared, close_and_linger, send_frame, too_large};

/// How long a closed connection reads (and discards) what the caller still sends, so that
/// closing with unread input does not reset the connection and lose the last replies.
pub(super) const LINGER: Duration = Duration::from_secs(1);

/// Replies queued and not yet written, at most: past it the connection reads no more
/// requests until the caller has taken some (a caller that does not read its replies).
const OUT_BUDGET: usize = 4 * 1024 * 1024;

/// Why the driver returned.
#[derive(Debug)]
enum End {
    /// An ERR was queued: close at once, without answering what is in hand.
    Refused,
    /// CLOSE, an ERR from the caller or the end of its stream: answer what is in hand.
    Closed,
    /// The server is stopping: answer what is in hand.
    Shutdown,
    /// The transport failed (or the writer ended): nothing more can be sent.
    Gone,
}

/// The peer's side of one connection, as the driver sees it.
struct Peer {
    id: u64,
    shared: Arc<Shared>,
    outbox: Arc<Outbox>,
    scratch: VecDeque<Bytes>,
    welcomed: bool,
    handshake_until: Instant,
    subs: Vec<(u32, KeyExpr)>,
    /// Requests decoded but not started (the rest of a PUB_BATCH past the in-flight limit).
    queued: VecDeque<Message>,
    running: FuturesUnordered<Reply>,
    planner: ReadPlanner,
    max_frame: usize,
}

pub(super) async fn serve_conn(
    stream: TcpStream,
    id: u64,
    shared: Arc<Shared>,
    stop: watch::Receiver<bool>,
) {
    let _ = stream.set_nodelay(true);
    let (reader, writer) = transport::tcp(stream);
    let outbox = Arc::new(Outbox::new(OUT_BUDGET, Box::new(NoDeliveries)));
    let mut conn = Conn::new(
        Accepted::new(reader, writer, stop),
        BytesMut::with_capacity(READ_BUF),
        &outbox,
    );
    let mut p = Peer {
        id,
        max_frame: usize::try_from(shared.options.max_payload)
            .unwrap_or(usize::MAX)
            .saturating_add(64 * 1024),
        handshake_until: Instant::now() + shared.options.handshake_timeout,
        shared,
        outbox: outbox.clone(),
        scratch: VecDeque::new(),
        welcomed: false,
        subs: Vec::new(),
        queued: VecDeque::new(),
        running: FuturesUnordered::new(),
        planner: ReadPlanner::new(),
    };
    let end = conn.drive(&mut p).await;
    tracing::debug!(conn = id, ?end, "peer: connection ends");
    // The caller gets its replies in hand, the ERR or nothing, within drain_timeout (a
    // caller that does not read must not hold a stopping server).
    let deadline = Instant::now() + p.shared.options.drain_timeout;
    match end {
        End::Closed | End::Shutdown => p.answer_in_hand(deadline).await,
        End::Refused => p.outbox.try_flush(&mut p.scratch),
        End::Gone => {}
    }
    drop(p);
    close_and_linger(conn, &outbox, deadline, LINGER).await;
}

impl Peer {
    /// At the in-flight limit, or the caller is behind on its replies: read no requests.
    fn held(&self) -> bool {
        self.running.len() + self.queued.len() >= self.shared.options.max_in_flight
            || self.outbox.backlog().0 >= OUT_BUDGET
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
                    self.outbox.try_flush(&mut self.scratch);
                }
                _ => break,
            }
        }
    }

    /// Queues a frame for the caller.
    fn send(&self, f: &Frame) {
        send_frame(&self.outbox, f);
    }

    /// Queues an ERR frame; the connection closes after writing it.
    fn refuse(&self, code: ErrorCode, message: &str) -> End {
        tracing::debug!(
            conn = self.id,
            code = code.code(),
            message,
            "peer: protocol error"
        );
        self.send(&Frame::Err {
            code,
            message: message.to_string(),
        });
        End::Refused
    }

    /// Sends a handler's reply to each subscription of the connection that matches its key.
    fn route(&mut self, reply: Option<Message>) {
        let Some(m) = reply else { return };
        if let Err(e) = check_options(&m) {
            tracing::warn!(conn = self.id, key = %m.key, "peer: reply not sent: {e}");
            return;
        }
        let subs = &self.subs;
        self.outbox.push_reply_unbudgeted(|o| {
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

    fn too_large(&self, len: usize) -> Option<End> {
        too_large(len, self.shared.options.max_payload).map(|(c, m)| self.refuse(c, &m))
    }

    fn hello(&mut self, frame: Frame) -> Result<(), End> {
        hayate_native::check_hello(frame, "peer").map_err(|(c, m)| self.refuse(c, &m))?;
        self.welcomed = true;
        self.send(&Frame::Welcome(Welcome {
            version: PROTOCOL_VERSION,
            session: self.id,
            max_payload: self.shared.options.max_payload,
            server: self.shared.options.name.clone(),
            inbox: format!("{INBOX_PREFIX}/{}", self.id),
            shm: None,
        }));
        Ok(())
    }

    fn on_frame(&mut self, frame: Frame) -> Result<(), End> {
        if !self.welcomed {
            return self.hello(frame);
        }
        match frame {
            Frame::Pub(m) => {
                if let Some(end) = self.too_large(m.payload.len()) {
                    return Err(end);
                }
                if self.serves(&m.key) {
                    self.running.push((self.shared.handler)(m));
                }
            }
            Frame::PubBatch { key, payloads } => {
                if let Some(end) = payloads.iter().find_map(|p| self.too_large(p.len())) {
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
                    return Err(self.refuse(
                        ErrorCode::BadSubscription,
                        &format!("subscription id {} is already in use", s.sid),
                    ));
                }
                // One connection, so a queue group has one member: a plain subscription.
                self.subs.push((s.sid, s.expr));
            }
            Frame::Unsub { sid } => self.subs.retain(|(s, _)| *s != sid),
            Frame::Ping(t) => self.send(&Frame::Pong(t)),
            Frame::Pong(_) => {}
            Frame::Close => return Err(End::Closed),
            Frame::Err { code, message } => {
                tracing::debug!(
                    conn = self.id,
                    code = code.code(),
                    message,
                    "peer: client error"
                );
                return Err(End::Closed);
            }
            // Nothing is delivered with acknowledgements here: an ACK or NACK names no
            // delivery and is ignored, as the broker ignores unknown ids.
            Frame::Ack { .. } | Frame::Nack { .. } => {}
            // A peer keeps no streams: the request is served as a PUB, and confirmed as not
            // captured.
            Frame::PubConfirm { id, msg } => {
                if let Some(end) = self.too_large(msg.payload.len()) {
                    return Err(end);
                }
                if self.serves(&msg.key) {
                    self.running.push((self.shared.handler)(msg));
                }
                self.send(&Frame::Confirm {
                    id,
                    outcome: hayate_native::ConfirmOutcome::NotCaptured,
                });
            }
            // A second HELLO, a server's frame, or a CONSUME (a peer keeps no streams).
            other => {
                let (code, why) = hayate_native::refusal(&other);
                return Err(self.refuse(code, why));
            }
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
        let max_frame = self.max_frame;
        self.planner
            .decode(buf, max_frame)
            .map_err(|e| self.refuse(e.code(), &e.to_string()))
    }

    async fn handle(&mut self, frame: Frame) -> Result<(), End> {
        self.on_frame(frame)
    }

    /// Starts what the in-flight limit allows, routes every reply already available and
    /// writes them all at once.
    fn flush(&mut self) {
        self.progress();
        self.outbox.try_flush(&mut self.scratch);
    }

    fn read_limit(&mut self, buf: &mut BytesMut) -> Option<usize> {
        if self.held() {
            Some(0)
        } else {
            self.planner.plan(buf, READ_BUF)
        }
    }

    fn deadline(&self) -> Option<Instant> {
        (!self.welcomed).then_some(self.handshake_until)
    }

    async fn on_timer(&mut self) -> Result<(), End> {
        if self.welcomed || Instant::now() < self.handshake_until {
            return Ok(());
        }
        Err(self.refuse(ErrorCode::Protocol, "no HELLO within the handshake timeout"))
    }

    /// A request answered, or (when the caller is behind on its replies) room in the
    /// outbox.
    async fn event(&mut self) -> Result<(), End> {
        let outbox = self.outbox.clone();
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
