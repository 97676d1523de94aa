//! What this crate's two listeners share for each connection they serve: a
//! [`PeerServer`](super::PeerServer)'s (`conn`) and a node's (`node::server`). Both speak the
//! native protocol's server side on hayate-io's connection driver, with nothing routed to
//! them by a broker (their frames go out with [`Outbox::push_reply_unbudgeted`]): the same
//! opening of the connection, handshake and its deadline, reading (a [`ReadPlanner`] bounded
//! by `max_payload`), ERR and close, WELCOME, and the frames both treat alike (CLOSE, ERR,
//! PONG, ACK/NACK and the frames a client may not send).

use std::collections::VecDeque;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use hayate_flow::{Batch, Encoder, OutBuf, Outbox};
use hayate_io::conn::{Accepted, Conn, InputBudget, READ_BUF};
use hayate_io::transport;
use hayate_native::{ErrorCode, Frame, Hello, PROTOCOL_VERSION, ReadPlanner, Welcome, encode};
use tokio::io::AsyncReadExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::time::Instant;

/// Why a listener's connection driver returned.
#[derive(Debug)]
pub(super) enum End {
    /// An ERR was queued: close at once, without answering what is in hand.
    Refused,
    /// CLOSE, an ERR from the other side or the end of its stream: answer what is in hand.
    Closed,
    /// The server is stopping: answer what is in hand (a node's listener ends as `Closed`).
    Shutdown,
    /// The transport failed (or the writer ended): nothing more can be sent.
    Gone,
}

/// How a listener names itself: in the HELLO check's messages, and in its logs.
pub(super) struct Names {
    /// The listener in the ERR for a HELLO of another version ("this peer speaks ...").
    pub(super) hello: &'static str,
    /// The prefix of its log lines.
    pub(super) log: &'static str,
    /// Its log line for an ERR from the other side (after the prefix).
    pub(super) their_err: &'static str,
}

/// The outbox encoder of a connection nothing is routed to by a broker (a `PeerServer`'s or
/// a node's listener): its frames are written with [`Outbox::push_reply_unbudgeted`].
struct NoDeliveries;

impl Encoder for NoDeliveries {
    fn encode(&mut self, _sid: u32, _batch: Batch<'_>, _origin: u64, _out: &mut OutBuf) {}
    fn encode_lost(&mut self, _sid: u32, _count: u64, _out: &mut OutBuf) {}
}

/// Accepts connections on `listener` until `stop` changes, each served by `serve(stream,
/// address, stop)` on a task of its own, at most `max` at a time (one more is closed at
/// once); then gives those still open `backstop` to end, and aborts the rest. `log` names
/// the listener in its warnings.
pub(super) async fn accept_loop<F>(
    listener: TcpListener,
    mut stop: watch::Receiver<bool>,
    max: usize,
    backstop: Duration,
    log: &'static str,
    mut serve: impl FnMut(TcpStream, SocketAddr, watch::Receiver<bool>) -> F,
) where
    F: Future<Output = ()> + Send + 'static,
{
    let mut conns = tokio::task::JoinSet::new();
    loop {
        tokio::select! {
            r = listener.accept() => match r {
                Ok((s, addr)) if conns.len() >= max => {
                    tracing::warn!(%addr, "{log}: at max_connections: connection closed");
                    drop(s);
                }
                Ok((s, addr)) => {
                    conns.spawn(serve(s, addr, stop.clone()));
                }
                Err(e) => {
                    // Out of descriptors and the like: wait a little rather than spin.
                    tracing::warn!("{log}: accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
            _ = stop.changed() => break,
        }
    }
    drop(listener);
    let all = async { while conns.join_next().await.is_some() {} };
    if tokio::time::timeout(backstop, all).await.is_err() {
        conns.abort_all();
    }
}

/// Opens an accepted TCP connection on the driver: no Nagle, `peer` and `budget` as given,
/// and an outbox of `out_budget` bytes for its frames.
pub(super) fn open(
    stream: TcpStream,
    stop: watch::Receiver<bool>,
    out_budget: usize,
    peer: Option<SocketAddr>,
    budget: InputBudget,
) -> (Conn, Arc<Outbox>) {
    let _ = stream.set_nodelay(true);
    let (reader, writer) = transport::tcp(stream);
    let outbox = Arc::new(Outbox::new(out_budget, Box::new(NoDeliveries)));
    let mut accepted = Accepted::new(reader, writer, stop);
    accepted.peer = peer;
    accepted.budget = budget;
    let conn = Conn::new(accepted, BytesMut::with_capacity(READ_BUF), &outbox);
    (conn, outbox)
}

/// Closes a listener's connection: the writer gets until `deadline` to send what is queued
/// (a writer stuck on a peer that does not read is cut off instead), then what the other side
/// still sends is read and discarded for up to `linger`, so that closing with unread input
/// does not reset the connection and lose the last frames.
pub(super) async fn close_and_linger(
    conn: Conn,
    outbox: &Outbox,
    deadline: Instant,
    linger: Duration,
) {
    let Ok(mut reader) = tokio::time::timeout_at(deadline, conn.close(outbox)).await else {
        outbox.cut();
        return;
    };
    let _ = tokio::time::timeout(linger, async {
        let mut sink = [0u8; 4096];
        while matches!(reader.read(&mut sink).await, Ok(n) if n > 0) {}
    })
    .await;
}

/// The listener's side of one connection, as both listeners keep it.
pub(super) struct Wire {
    pub(super) id: u64,
    pub(super) outbox: Arc<Outbox>,
    scratch: VecDeque<Bytes>,
    welcomed: bool,
    handshake_until: Instant,
    planner: ReadPlanner,
    max_payload: u64,
    max_frame: usize,
    names: &'static Names,
}

impl Wire {
    /// Connection `id`, its frames queued on `outbox`: HELLO is due within
    /// `handshake_timeout`, payloads over `max_payload` are refused.
    pub(super) fn new(
        id: u64,
        outbox: Arc<Outbox>,
        max_payload: u64,
        handshake_timeout: Duration,
        names: &'static Names,
    ) -> Wire {
        Wire {
            id,
            outbox,
            scratch: VecDeque::new(),
            welcomed: false,
            handshake_until: Instant::now() + handshake_timeout,
            planner: ReadPlanner::new(),
            max_payload,
            max_frame: usize::try_from(max_payload)
                .unwrap_or(usize::MAX)
                .saturating_add(64 * 1024),
            names,
        }
    }

    /// Queues a frame for the other side.
    pub(super) fn send(&self, f: &Frame) {
        self.outbox.push_reply_unbudgeted(|o| encode(f, o.tail()));
    }

    /// Writes what is queued, as far as the transport takes it without waiting.
    pub(super) fn flush(&mut self) {
        self.outbox.try_flush(&mut self.scratch);
    }

    /// Queues an ERR frame; the connection closes after writing it.
    pub(super) fn refuse(&self, code: ErrorCode, message: &str) -> End {
        tracing::debug!(
            conn = self.id,
            code = code.code(),
            message,
            "{}: protocol error",
            self.names.log
        );
        self.send(&Frame::Err {
            code,
            message: message.to_string(),
        });
        End::Refused
    }

    /// A payload of `len` bytes over `max_payload`: refused.
    pub(super) fn too_large(&self, len: usize) -> Option<End> {
        let max = self.max_payload;
        (len as u64 > max).then(|| {
            self.refuse(
                ErrorCode::FrameTooLarge,
                &format!("payload of {len} bytes exceeds max_payload {max}"),
            )
        })
    }

    /// The first frame, which must be a HELLO of this protocol version: the connection is
    /// then welcomed (its WELCOME is [`welcome`](Wire::welcome)'s), or refused.
    pub(super) fn hello(&mut self, frame: Frame) -> Result<Hello, End> {
        let h = hayate_native::check_hello(frame, self.names.hello)
            .map_err(|(c, m)| self.refuse(c, &m))?;
        self.welcomed = true;
        Ok(h)
    }

    /// Queues the WELCOME: this connection's id as the session, `max_payload`, `server` and
    /// `inbox`.
    pub(super) fn welcome(&self, server: String, inbox: String) {
        self.send(&Frame::Welcome(Welcome {
            version: PROTOCOL_VERSION,
            session: self.id,
            max_payload: self.max_payload,
            server,
            inbox,
            shm: None,
        }));
    }

    /// Answers a PUB_CONFIRM: a listener keeps no streams, the message is not captured.
    pub(super) fn not_captured(&self, id: u64) {
        self.send(&Frame::Confirm {
            id,
            outcome: hayate_native::ConfirmOutcome::NotCaptured,
        });
    }

    /// The frames both listeners treat alike: PONG, ACK and NACK are ignored, CLOSE and an
    /// ERR end the connection, any other (a second HELLO, a server's frame, a CONSUME) is
    /// refused.
    pub(super) fn on_other(&self, frame: Frame) -> Result<(), End> {
        match frame {
            Frame::Pong(_) => Ok(()),
            // Nothing is delivered with acknowledgements here: an ACK or NACK names no
            // delivery and is ignored, as the broker ignores unknown ids.
            Frame::Ack { .. } | Frame::Nack { .. } => Ok(()),
            Frame::Close => Err(End::Closed),
            Frame::Err { code, message } => {
                tracing::debug!(
                    conn = self.id,
                    code = code.code(),
                    message,
                    "{}: {}",
                    self.names.log,
                    self.names.their_err
                );
                Err(End::Closed)
            }
            // A second HELLO, a server's frame, or a CONSUME (a listener keeps no streams).
            other => {
                let (code, why) = hayate_native::refusal(&other);
                Err(self.refuse(code, why))
            }
        }
    }

    /// The driver's `decode`: the next frame of `buf`, if whole.
    pub(super) fn decode(&mut self, buf: &mut BytesMut) -> Result<Option<Frame>, End> {
        let max_frame = self.max_frame;
        self.planner
            .decode(buf, max_frame)
            .map_err(|e| self.refuse(e.code(), &e.to_string()))
    }

    /// The driver's `read_limit`: nothing while `held`, else as the planner says.
    pub(super) fn read_limit(&mut self, buf: &mut BytesMut, held: bool) -> Option<usize> {
        if held {
            Some(0)
        } else {
            self.planner.plan(buf, READ_BUF)
        }
    }

    /// The driver's `deadline`: the handshake's, until welcomed.
    pub(super) fn deadline(&self) -> Option<Instant> {
        (!self.welcomed).then_some(self.handshake_until)
    }

    /// The driver's `on_timer`: no HELLO within the handshake timeout is refused.
    pub(super) fn on_timer(&self) -> Result<(), End> {
        if self.welcomed || Instant::now() < self.handshake_until {
            return Ok(());
        }
        Err(self.refuse(ErrorCode::Protocol, "no HELLO within the handshake timeout"))
    }

    /// Whether HELLO has been received.
    pub(super) fn welcomed(&self) -> bool {
        self.welcomed
    }
}
