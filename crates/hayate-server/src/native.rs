//! The native protocol front-end.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use bytes::{BufMut, BytesMut};
use hayate_broker::{Batch, Broker, Encoder, OutBuf, Outbox, Session, Taken};
use hayate_core::{INBOX_PREFIX, Message};
use hayate_wire::{
    ErrorCode, Frame, PROTOCOL_VERSION, ReadPlanner, Welcome, decode, encode,
    encode_msg_acked_head, encode_msg_batch_head, encode_msg_head,
};
use tokio::io::AsyncRead;
use tokio::sync::watch;

use crate::config::Limits;
use crate::transport::{Writer, read_some, write_chunks};

/// Encodes deliveries as native MSG / MSG_BATCH frames.
#[derive(Debug, Default)]
pub struct NativeEncoder;

impl Encoder for NativeEncoder {
    fn encode(&mut self, sid: u32, batch: Batch<'_>, _origin: u64, out: &mut OutBuf) {
        match batch {
            Batch::One(m) => {
                encode_msg_head(sid, m, out.tail());
                out.put_payload(&m.payload);
            }
            Batch::Plain { key, payloads } => {
                let items: usize = payloads.iter().map(|p| 4 + p.len()).sum();
                encode_msg_batch_head(sid, key, items, out.tail());
                for p in payloads {
                    out.tail().put_u32(p.len() as u32);
                    out.put_payload(p);
                }
            }
        }
    }

    fn encode_lost(&mut self, sid: u32, count: u64, out: &mut OutBuf) {
        encode(&Frame::Lost { sid, count }, out.tail());
    }

    fn encode_acked(&mut self, sid: u32, delivery: u64, msg: &Message, out: &mut OutBuf) {
        encode_msg_acked_head(sid, delivery, msg, out.tail());
        out.put_payload(&msg.payload);
    }
}

/// The server side of the native protocol's keepalive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Keepalive {
    /// Silence after which the server sends a PING; `None`: never.
    pub interval: Option<Duration>,
    /// PINGs with no input at all in between before the connection is closed (ERR 9).
    pub max_pings_out: u32,
}

/// Read buffer: start size and the free space kept before each read.
const READ_BUF: usize = 64 * 1024;

/// Why a connection ended.
#[derive(Debug)]
enum End {
    /// The peer closed (EOF or CLOSE) or the server shut down.
    Graceful,
    /// A protocol error was reported to the peer.
    Error,
    /// An I/O error.
    Io,
}

/// Serves one native-protocol connection until it closes.
///
/// The reader runs in the calling task; a writer task drains the session's outbox.
pub async fn serve<R>(
    mut reader: R,
    writer: Writer,
    broker: Broker,
    limits: Arc<Limits>,
    server_name: Arc<str>,
    keepalive: Keepalive,
    mut shutdown: watch::Receiver<bool>,
) where
    R: AsyncRead + Unpin,
{
    let mut session = broker.open_session(Box::new(NativeEncoder));
    let outbox = session.outbox().clone();
    outbox.set_sink(writer.clone());
    let mut writer_task = tokio::spawn(write_loop(writer, outbox.clone(), outbox.epoch()));
    let mut buf = BytesMut::with_capacity(READ_BUF);
    let max_frame = limits.max_frame();
    let mut welcomed = false;
    let mut planner = ReadPlanner::new();
    let handshake = tokio::time::sleep(Duration::from_millis(limits.handshake_timeout_ms));
    tokio::pin!(handshake);
    // Keepalive: a tick every interval; reads are counted (no clock on the read path) and a
    // tick that saw none sends a PING.
    let tick_every = keepalive.interval.unwrap_or(Duration::from_secs(86_400));
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + tick_every, tick_every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let (mut reads, mut reads_at_tick, mut pings_out) = (0u64, 0u64, 0u32);

    let end = 'conn: loop {
        // Decode and handle every complete frame before reading again.
        loop {
            let before = buf.len();
            match decode(&mut buf, max_frame) {
                Ok(Some(frame)) => {
                    planner.decoded(before - buf.len(), &frame);
                    match handle(frame, &mut session, &mut welcomed, &limits, &server_name).await {
                        Ok(true) => {}
                        Ok(false) => break 'conn End::Graceful,
                        Err((code, msg)) => {
                            send_err(&outbox, code, &msg);
                            break 'conn End::Error;
                        }
                    }
                }
                Ok(None) => break,
                Err(e) => {
                    send_err(&outbox, e.code(), &e.to_string());
                    break 'conn End::Error;
                }
            }
        }
        // Send what this read produced now, from this task, where the sockets can take it.
        session.flush();
        let limit = planner.plan(&mut buf, READ_BUF);
        tokio::select! {
            r = read_some(&mut reader, &mut buf, limit) => match r {
                Ok(0) => break End::Graceful,
                Ok(_) => reads += 1,
                Err(_) => break End::Io,
            },
            _ = &mut handshake, if !welcomed => {
                send_err(&outbox, ErrorCode::Protocol, "no HELLO within the handshake timeout");
                break End::Error;
            }
            _ = tick.tick(), if welcomed && keepalive.interval.is_some() => {
                if reads != reads_at_tick {
                    reads_at_tick = reads;
                    pings_out = 0;
                } else if pings_out >= keepalive.max_pings_out {
                    send_err(&outbox, ErrorCode::Stale, "no input through the keepalive PINGs");
                    break End::Error;
                } else {
                    pings_out += 1;
                    outbox.push_control(|b| encode(&Frame::Ping(u64::from(pings_out)), b));
                    session.touch_own();
                    session.flush();
                }
            }
            _ = &mut writer_task => break End::Io,
            _ = shutdown.changed() => break End::Graceful,
        }
    };
    tracing::debug!(session = session.id(), ?end, "connection ends");
    // Deliveries not acknowledged go to other members of their queue groups.
    session.release_unacked(None).await;
    session.flush();
    // Dropping the session removes its subscriptions and closes the outbox; the writer then
    // flushes what is queued (an ERR included) and shuts the socket down.
    drop(session);
    outbox.close();
    if !writer_task.is_finished() {
        let _ = tokio::time::timeout(Duration::from_secs(5), writer_task).await;
    }
}

fn send_err(outbox: &Outbox, code: ErrorCode, message: &str) {
    tracing::debug!(code = code.code(), message, "protocol error");
    outbox.push_control(|b| {
        encode(
            &Frame::Err {
                code,
                message: message.to_string(),
            },
            b,
        )
    });
}

type Refusal = (ErrorCode, String);

/// Handles one frame; `Ok(false)` ends the connection gracefully.
async fn handle(
    frame: Frame,
    session: &mut Session,
    welcomed: &mut bool,
    limits: &Limits,
    server_name: &str,
) -> Result<bool, Refusal> {
    if !*welcomed {
        let Frame::Hello(h) = frame else {
            return Err((ErrorCode::Protocol, "the first frame must be HELLO".into()));
        };
        if h.version != PROTOCOL_VERSION {
            return Err((
                ErrorCode::UnsupportedVersion,
                format!(
                    "protocol version {} is not supported (this server speaks 1)",
                    h.version
                ),
            ));
        }
        *welcomed = true;
        let w = Frame::Welcome(Welcome {
            version: PROTOCOL_VERSION,
            session: session.id(),
            max_payload: limits.max_payload,
            server: server_name.to_string(),
            inbox: format!("{INBOX_PREFIX}/{}", session.id()),
        });
        session.outbox().push_control(|b| encode(&w, b));
        session.touch_own();
        return Ok(true);
    }
    match frame {
        Frame::Pub(m) => {
            check_payload(m.payload.len(), limits)?;
            session.publish(Batch::One(&m)).await;
        }
        Frame::PubBatch { key, payloads } => {
            for p in &payloads {
                check_payload(p.len(), limits)?;
            }
            session
                .publish(Batch::Plain {
                    key: &key,
                    payloads: &payloads,
                })
                .await;
        }
        Frame::Sub(s) => {
            session
                .subscribe(s.sid, s.expr, s.group.as_deref(), s.qos)
                .map_err(|e| (ErrorCode::BadSubscription, e.to_string()))?;
        }
        Frame::Unsub { sid } => {
            // Unacknowledged deliveries go to another member first (they need the
            // subscription's group).
            session.release_unacked(Some(sid)).await;
            session.unsubscribe(sid);
        }
        Frame::Ack {
            delivery,
            cumulative,
        } => {
            // An unknown or already acknowledged id is ignored (an ACK may cross a
            // redelivery after an UNSUB).
            session.outbox().ack(delivery, cumulative);
            session.touch_own();
        }
        Frame::Nack { delivery } => {
            if let Some(d) = session.outbox().nack(delivery) {
                session.give_back(d, true).await;
            }
            session.touch_own();
        }
        Frame::Ping(t) => session
            .outbox()
            .push_control(|b| encode(&Frame::Pong(t), b)),
        Frame::Pong(_) => {}
        Frame::Close => return Ok(false),
        Frame::Err { code, message } => {
            tracing::debug!(code = code.code(), message, "client reported an error");
            return Ok(false);
        }
        Frame::Hello(_) => return Err((ErrorCode::Protocol, "HELLO was already received".into())),
        Frame::Welcome(_)
        | Frame::Msg { .. }
        | Frame::MsgBatch { .. }
        | Frame::MsgAcked { .. }
        | Frame::Lost { .. } => {
            return Err((
                ErrorCode::Protocol,
                "a client may not send this frame".into(),
            ));
        }
    }
    Ok(true)
}

fn check_payload(len: usize, limits: &Limits) -> Result<(), Refusal> {
    if len as u64 > limits.max_payload {
        return Err((
            ErrorCode::FrameTooLarge,
            format!(
                "payload of {len} bytes exceeds max_payload {}",
                limits.max_payload
            ),
        ));
    }
    Ok(())
}

/// Drains `outbox` into `w` until the outbox closes or is detached from this connection
/// (its epoch changes), then shuts the socket's write side down.
pub(crate) async fn write_loop(w: Writer, outbox: Arc<Outbox>, epoch: u64) {
    let mut q = VecDeque::new();
    loop {
        match outbox.take(&mut q, epoch).await {
            Taken::Data => {
                // A write that cannot finish (a client that does not read) ends when the
                // broker cuts the connection off as a slow consumer.
                let r = tokio::select! {
                    r = write_chunks(&*w, &mut q) => r,
                    _ = outbox.cut_off() => Err(std::io::ErrorKind::TimedOut.into()),
                };
                outbox.release(epoch);
                if r.is_err() {
                    // The reader sees this task end and ends the connection.
                    return;
                }
            }
            Taken::Closed => {
                w.shutdown();
                return;
            }
        }
    }
}
