//! The reader task: decodes every frame of each read, answers the server's PINGs, completes
//! requests and flushes, and hands the messages of a read to their subscriptions.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use bytes::{BufMut, BytesMut};
use hayate_core::Message;
use hayate_native::{Frame, Items, ReadPlanner, encode};
use tokio::io::AsyncReadExt;

use hayate_io::transport::shm::Fanout;

use super::{FRAME_SLACK, INBOX_SID, Inner, Reader, lock};
use crate::Error;
use crate::sub::Batch;

/// What one read delivers, per subscription in the order it came: single messages of a
/// subscription gathered into one [`Batch::Messages`] until a plain batch comes between.
#[derive(Default)]
struct Pending {
    batches: Vec<(u32, Batch)>,
}

impl Pending {
    fn push(&mut self, sid: u32, msg: Message) {
        match self.batches.iter_mut().rev().find(|(s, _)| *s == sid) {
            Some((_, Batch::Messages(v))) => v.push(msg),
            _ => self.batches.push((sid, Batch::Messages(vec![msg]))),
        }
    }

    /// A MSG_BATCH's messages (plain ones: replies published without options come so too),
    /// handed over as they came: the subscriber slices them out.
    fn push_batch(&mut self, inner: &Inner, sid: u32, key: hayate_core::Key, payloads: Items) {
        if sid == INBOX_SID {
            for p in payloads {
                deliver_reply(inner, Message::new(key.clone(), p));
            }
        } else {
            self.batches.push((sid, Batch::Plain { key, payloads }));
        }
    }
}

pub(super) async fn read_loop(
    inner: Arc<Inner>,
    mut r: Reader,
    mut buf: BytesMut,
    mut fanout: Option<Fanout>,
) {
    let max_frame = usize::try_from(inner.welcome.max_payload)
        .unwrap_or(usize::MAX)
        .saturating_add(FRAME_SLACK);
    let mut pending = Pending::default();
    // MSG_REF entries are copied here, then decoded (their payloads slices of it).
    let mut entry = BytesMut::new();
    let mut planner = ReadPlanner::new();
    // Keepalive: one timer; reads are counted, and a tick that saw none sends a PING.
    let every = inner.options.ping_interval;
    let tick = tokio::time::sleep(every.unwrap_or(Duration::from_secs(86_400)));
    tokio::pin!(tick);
    let (mut reads, mut reads_at_tick, mut pings_out) = (0u64, 0u64, 0u32);
    let err = loop {
        // `Some(end)`: the connection ends after this read's messages are handed over
        // (what came intact before an error or the server's ERR is delivered).
        let ended: Option<Option<Error>> = 'frames: loop {
            match planner.decode(&mut buf, max_frame) {
                Ok(Some(frame)) => match frame {
                    Frame::Msg { sid, msg } => {
                        if sid == INBOX_SID {
                            deliver_reply(&inner, msg);
                        } else {
                            pending.push(sid, msg);
                        }
                    }
                    Frame::MsgRef { sid, at, len, tag } => {
                        match by_reference(fanout.as_mut(), &mut entry, (at, len, tag), max_frame) {
                            Ok(Frame::Msg { sid: 0, msg }) if sid == INBOX_SID => {
                                deliver_reply(&inner, msg);
                            }
                            Ok(Frame::Msg { sid: 0, msg }) => pending.push(sid, msg),
                            Ok(Frame::MsgBatch {
                                sid: 0,
                                key,
                                payloads,
                            }) => pending.push_batch(&inner, sid, key, payloads),
                            Ok(other) => {
                                break 'frames Some(Some(Error::Protocol(format!(
                                    "a fan-out entry is not a MSG or MSG_BATCH for sid 0: \
                                     {other:?}"
                                ))));
                            }
                            Err(e) => break 'frames Some(Some(e)),
                        }
                    }
                    Frame::MsgAcked {
                        sid,
                        delivery,
                        mut msg,
                    } => {
                        msg.attrs.delivery = delivery;
                        pending.push(sid, msg);
                    }
                    Frame::MsgBatch { sid, key, payloads } => {
                        pending.push_batch(&inner, sid, key, payloads);
                    }
                    Frame::Pong(t) => {
                        if let Some(tx) = lock(&inner.pings).remove(&t) {
                            let _ = tx.send(());
                        }
                    }
                    Frame::Ping(t) => {
                        let _ = inner.queue_frame(|b| encode(&Frame::Pong(t), b));
                    }
                    Frame::Lost { sid, count } => {
                        if let Some(s) = lock(&inner.subs).get(&sid) {
                            s.lost.fetch_add(count, Ordering::Relaxed);
                        }
                    }
                    Frame::Err { code, message } => {
                        tracing::warn!(code = code.code(), %message, "server error");
                        if code.is_fatal() {
                            break 'frames Some(Some(Error::Server { code, message }));
                        }
                    }
                    Frame::Confirm { id, outcome } => inner.confirmed(id, outcome),
                    Frame::Close => break 'frames Some(None),
                    other => {
                        break 'frames Some(Some(Error::Protocol(format!(
                            "unexpected frame from server: {other:?}"
                        ))));
                    }
                },
                Ok(None) => break None,
                Err(e) => break 'frames Some(Some(Error::Protocol(e.to_string()))),
            }
        };
        // The entries of this read's MSG_REFs are copied out: their places are free.
        if let Some(f) = &fanout {
            f.publish_releases();
        }
        // Hand this read's messages to their subscriptions (one channel send per batch).
        for (sid, msgs) in pending.batches.drain(..) {
            let tx = lock(&inner.subs).get(&sid).map(|s| s.tx.clone());
            if let Some(tx) = tx {
                // Waiting here is the back-pressure of a slow subscriber.
                if tx.send(msgs).await.is_err() {
                    lock(&inner.subs).remove(&sid);
                }
            }
        }
        if let Some(end) = ended {
            break end;
        }
        let limit = planner.plan(&mut buf, 64 * 1024);
        let read = tokio::select! {
            r = read_some(&mut r, &mut buf, limit) => r,
            () = &mut tick, if every.is_some() => {
                let every = every.unwrap_or_default();
                tick.as_mut().reset(tokio::time::Instant::now() + every);
                if reads != reads_at_tick {
                    reads_at_tick = reads;
                    pings_out = 0;
                } else if pings_out >= inner.options.max_pings_out {
                    break Some(Error::Io(format!(
                        "no input from the server through {pings_out} PINGs: connection presumed dead"
                    )));
                } else {
                    pings_out += 1;
                    let _ = inner.queue_frame(|b| encode(&Frame::Ping(KEEPALIVE_TOKEN), b));
                }
                continue;
            }
        };
        match read {
            Ok(0) => break None,
            Ok(_) => reads += 1,
            Err(e) => break Some(e.into()),
        }
    };
    if let Some(e) = &err {
        tracing::debug!("connection ends: {e}");
    }
    inner.fail(err);
}

/// The token of keepalive PINGs (flush PINGs use tokens from 1 up; a PONG of this one is
/// not waited for).
const KEEPALIVE_TOKEN: u64 = u64::MAX;

async fn read_some(
    r: &mut Reader,
    buf: &mut BytesMut,
    limit: Option<usize>,
) -> std::io::Result<usize> {
    match limit {
        Some(n) => r.read_buf(&mut buf.limit(n)).await,
        None => r.read_buf(buf).await,
    }
}

/// The frame a MSG_REF names (a MSG or MSG_BATCH for sid 0): its entry read in place in the
/// fan-out arena (held, unwritten by the broker, until the last payload of it is dropped)
/// or copied out of it (and counted released at once), decoded; its payloads are slices of
/// the entry.
fn by_reference(
    fanout: Option<&mut Fanout>,
    entry: &mut BytesMut,
    (at, len, tag): (u64, u32, u64),
    max_frame: usize,
) -> Result<Frame, Error> {
    let Some(f) = fanout else {
        return Err(Error::Protocol(
            "MSG_REF without a fan-out arena (not taken at the shared-memory set-up)".into(),
        ));
    };
    if len as usize > max_frame.saturating_add(hayate_native::HEADER_LEN) {
        return Err(Error::Protocol(format!(
            "MSG_REF of {len} bytes, past the largest frame"
        )));
    }
    // Copied entries go into one buffer, split off (their payloads are slices of it): one
    // allocation for many, as for the read buffer. Entries read in place are not copied.
    if !f.in_place() && entry.capacity() < len as usize {
        entry.reserve((len as usize).max(ENTRY_BUF));
    }
    let bytes = f
        .get_bytes(at, u64::from(len), tag, entry)
        .map_err(|e| Error::Protocol(e.to_string()))?;
    hayate_native::decode_frame(bytes, max_frame).map_err(|e| {
        Error::Protocol(format!(
            "the fan-out entry of a MSG_REF ({len} bytes) is not one whole frame: {e}"
        ))
    })
}

/// What the buffer of fan-out entries grows by, at least.
const ENTRY_BUF: usize = 64 * 1024;

fn deliver_reply(inner: &Inner, msg: Message) {
    crate::sub::complete_request(&inner.requests, msg);
}
