//! One connection of a [`PeerServer`](super::PeerServer): the handshake, the frames a client
//! sends, the requests in hand (at most [`PeerOptions::max_in_flight`](super::PeerOptions))
//! and the replies, routed to the connection's subscriptions.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use bytes::{BufMut, BytesMut};
use futures::FutureExt;
use futures::stream::{FuturesUnordered, StreamExt};
use hayate_core::{INBOX_PREFIX, KeyExpr, Message};
use hayate_native::{
    ErrorCode, Frame, PROTOCOL_VERSION, ReadPlanner, Welcome, check_options, decode, encode,
    encode_msg,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::net::tcp::OwnedWriteHalf;
use tokio::sync::watch;
use tokio::time::Instant;

use super::{READ_BUF, Reply, Shared};

/// One connection's state, apart from the socket.
struct Conn {
    id: u64,
    welcomed: bool,
    subs: Vec<(u32, KeyExpr)>,
    out: BytesMut,
    /// Requests decoded but not started (the rest of a PUB_BATCH past the in-flight limit).
    queued: VecDeque<Message>,
    /// An ERR was sent: close without answering what is in hand.
    refused: bool,
}

/// What the reader does after a frame.
enum Next {
    Continue,
    /// Stop reading (CLOSE, or an error already reported with ERR).
    Stop,
}

/// How long a closed connection reads (and discards) what the caller still sends, so that
/// closing with unread input does not reset the connection and lose the last replies.
pub(super) const LINGER: Duration = Duration::from_secs(1);

pub(super) async fn serve_conn(
    stream: TcpStream,
    id: u64,
    shared: Arc<Shared>,
    mut stop: watch::Receiver<bool>,
) {
    let _ = stream.set_nodelay(true);
    let (mut r, mut w) = stream.into_split();
    let mut c = Conn {
        id,
        welcomed: false,
        subs: Vec::new(),
        out: BytesMut::new(),
        queued: VecDeque::new(),
        refused: false,
    };
    let mut buf = BytesMut::with_capacity(READ_BUF);
    let mut planner = ReadPlanner::new();
    let mut running: FuturesUnordered<Reply> = FuturesUnordered::new();
    let max_frame = usize::try_from(shared.options.max_payload)
        .unwrap_or(usize::MAX)
        .saturating_add(64 * 1024);
    let handshake = tokio::time::sleep(shared.options.handshake_timeout);
    tokio::pin!(handshake);
    let max_in_flight = shared.options.max_in_flight;
    let drain = shared.options.drain_timeout;
    let mut reading = true;
    // Set once the connection stops reading: the end of its grace period.
    let mut deadline: Option<Instant> = None;
    loop {
        // Start queued requests, then decode every complete frame of the buffer, both up to
        // the in-flight limit; then collect every reply already available and write it all
        // at once.
        while running.len() < max_in_flight
            && let Some(m) = c.queued.pop_front()
        {
            running.push((shared.handler)(m));
        }
        let mut held = false;
        while reading {
            if running.len() + c.queued.len() >= max_in_flight {
                held = true;
                break;
            }
            let before = buf.len();
            match decode(&mut buf, max_frame) {
                Ok(Some(frame)) => {
                    planner.decoded(before - buf.len(), &frame);
                    if let Next::Stop = on_frame(frame, &mut c, &shared, &mut running) {
                        reading = false;
                    }
                }
                Ok(None) => break,
                Err(e) => {
                    refuse(&mut c, e.code(), &e.to_string());
                    reading = false;
                }
            }
        }
        if !reading && deadline.is_none() {
            deadline = Some(Instant::now() + drain);
        }
        if c.refused {
            // After an ERR the connection closes at once (protocol.md); replies in hand are
            // dropped.
            running = FuturesUnordered::new();
            c.queued.clear();
        }
        while let Some(Some(done)) = running.next().now_or_never() {
            route(&mut c, done);
        }
        if !c.out.is_empty()
            && !write_out(&mut w, &mut c.out, &mut stop, &mut deadline, drain).await
        {
            return;
        }
        if !reading || held {
            if running.is_empty() && c.queued.is_empty() {
                if reading {
                    continue; // held by queued work that just finished: decode again
                }
                break;
            }
            if running.is_empty() {
                continue; // start queued requests
            }
            // Answer what is in hand (before reading more, or before closing).
            let done = match deadline {
                Some(d) => match tokio::time::timeout_at(d, running.next()).await {
                    Ok(done) => done,
                    Err(_) => break,
                },
                None => tokio::select! {
                    done = running.next() => done,
                    _ = stop.changed() => {
                        reading = false;
                        continue;
                    }
                },
            };
            if let Some(done) = done {
                route(&mut c, done);
            }
            continue;
        }
        let limit = planner.plan(&mut buf, READ_BUF);
        tokio::select! {
            n = async {
                match limit {
                    Some(n) => r.read_buf(&mut (&mut buf).limit(n)).await,
                    None => r.read_buf(&mut buf).await,
                }
            } => match n {
                Ok(0) | Err(_) => reading = false,
                Ok(_) => {}
            },
            Some(done) = running.next(), if !running.is_empty() => route(&mut c, done),
            _ = &mut handshake, if !c.welcomed => {
                refuse(&mut c, ErrorCode::Protocol, "no HELLO within the handshake timeout");
                reading = false;
            }
            _ = stop.changed() => reading = false,
        }
    }
    let _ = w.shutdown().await;
    // Drain what the caller still sends until it closes (or briefly), so that the close
    // does not reset the connection with replies still in flight.
    let _ = tokio::time::timeout(LINGER, async {
        let mut sink = [0u8; 4096];
        while matches!(r.read(&mut sink).await, Ok(n) if n > 0) {}
    })
    .await;
}

/// Writes all of `out`. Gives up (false) on an error or, once the server is stopping, at
/// `deadline` (a caller that does not read must not hold a stopping server).
async fn write_out(
    w: &mut OwnedWriteHalf,
    out: &mut BytesMut,
    stop: &mut watch::Receiver<bool>,
    deadline: &mut Option<Instant>,
    drain: Duration,
) -> bool {
    while !out.is_empty() {
        let r = match *deadline {
            Some(d) => match tokio::time::timeout_at(d, w.write_buf(out)).await {
                Ok(r) => r,
                Err(_) => return false,
            },
            None => tokio::select! {
                r = w.write_buf(out) => r,
                _ = stop.changed() => {
                    *deadline = Some(Instant::now() + drain);
                    continue;
                }
            },
        };
        if !matches!(r, Ok(n) if n > 0) {
            return false;
        }
    }
    true
}

/// Queues an ERR frame (the caller stops reading and closes after writing it).
fn refuse(c: &mut Conn, code: ErrorCode, message: &str) {
    c.refused = true;
    tracing::debug!(
        conn = c.id,
        code = code.code(),
        message,
        "peer: protocol error"
    );
    encode(
        &Frame::Err {
            code,
            message: message.to_string(),
        },
        &mut c.out,
    );
}

fn on_frame(
    frame: Frame,
    c: &mut Conn,
    shared: &Shared,
    running: &mut FuturesUnordered<Reply>,
) -> Next {
    if !c.welcomed {
        let Frame::Hello(h) = frame else {
            refuse(c, ErrorCode::Protocol, "the first frame must be HELLO");
            return Next::Stop;
        };
        if h.version != PROTOCOL_VERSION {
            refuse(
                c,
                ErrorCode::UnsupportedVersion,
                &format!(
                    "protocol version {} is not supported (this peer speaks {PROTOCOL_VERSION})",
                    h.version
                ),
            );
            return Next::Stop;
        }
        c.welcomed = true;
        let w = Frame::Welcome(Welcome {
            version: PROTOCOL_VERSION,
            session: c.id,
            max_payload: shared.options.max_payload,
            server: shared.options.name.clone(),
            inbox: format!("{INBOX_PREFIX}/{}", c.id),
        });
        encode(&w, &mut c.out);
        return Next::Continue;
    }
    let served = |k: &hayate_core::Key| shared.exprs.iter().any(|e| e.matches(k));
    match frame {
        Frame::Pub(m) => {
            if let Some(refusal) = too_large(m.payload.len(), shared) {
                refuse(c, ErrorCode::FrameTooLarge, &refusal);
                return Next::Stop;
            }
            if served(&m.key) {
                running.push((shared.handler)(m));
            }
        }
        Frame::PubBatch { key, payloads } => {
            if let Some(refusal) = payloads.iter().find_map(|p| too_large(p.len(), shared)) {
                refuse(c, ErrorCode::FrameTooLarge, &refusal);
                return Next::Stop;
            }
            if served(&key) {
                // Started as the in-flight limit allows.
                c.queued
                    .extend(payloads.into_iter().map(|p| Message::new(key.clone(), p)));
            }
        }
        Frame::Sub(s) => {
            if c.subs.iter().any(|(sid, _)| *sid == s.sid) {
                refuse(
                    c,
                    ErrorCode::BadSubscription,
                    &format!("subscription id {} is already in use", s.sid),
                );
                return Next::Stop;
            }
            // One connection, so a queue group has one member: a plain subscription.
            c.subs.push((s.sid, s.expr));
        }
        Frame::Unsub { sid } => c.subs.retain(|(s, _)| *s != sid),
        Frame::Ping(t) => encode(&Frame::Pong(t), &mut c.out),
        Frame::Pong(_) => {}
        Frame::Close => return Next::Stop,
        Frame::Err { code, message } => {
            tracing::debug!(
                conn = c.id,
                code = code.code(),
                message,
                "peer: client error"
            );
            return Next::Stop;
        }
        Frame::Hello(_) => {
            refuse(c, ErrorCode::Protocol, "HELLO was already received");
            return Next::Stop;
        }
        // Nothing is delivered with acknowledgements here: an ACK or NACK names no delivery
        // and is ignored, as the broker ignores unknown ids.
        Frame::Ack { .. } | Frame::Nack { .. } => {}
        Frame::Welcome(_)
        | Frame::Msg { .. }
        | Frame::MsgBatch { .. }
        | Frame::MsgAcked { .. }
        | Frame::Lost { .. } => {
            refuse(c, ErrorCode::Protocol, "a client may not send this frame");
            return Next::Stop;
        }
    }
    Next::Continue
}

fn too_large(len: usize, shared: &Shared) -> Option<String> {
    (len as u64 > shared.options.max_payload).then(|| {
        format!(
            "payload of {len} bytes exceeds max_payload {}",
            shared.options.max_payload
        )
    })
}

/// Sends a handler's reply to each subscription of the connection that matches its key.
fn route(c: &mut Conn, reply: Option<Message>) {
    let Some(m) = reply else { return };
    if let Err(e) = check_options(&m) {
        tracing::warn!(conn = c.id, key = %m.key, "peer: reply not sent: {e}");
        return;
    }
    for (sid, expr) in &c.subs {
        if expr.matches(&m.key) {
            encode_msg(*sid, &m, &mut c.out);
        }
    }
}
