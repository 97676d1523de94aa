//! Encoding: [`encode`] writes any [`Frame`]; the hot path's encoders write a frame's head
//! without its payload, for the caller to append (copied, or as a zero-copy chunk), and
//! [`check_options`] checks that a message's options fit their wire fields.

use bytes::{BufMut, Bytes, BytesMut};
use hayate_core::{Key, Message};

use super::HEADER_LEN;
use crate::frame::{Frame, Sub, flag, ty};

fn put_str16(out: &mut BytesMut, s: &[u8]) {
    debug_assert!(s.len() <= u16::MAX as usize);
    out.put_u16(s.len() as u16);
    out.put_slice(s);
}

/// Starts a frame: reserves the length, writes the type; returns the frame start offset.
fn begin(out: &mut BytesMut, t: u8) -> usize {
    let start = out.len();
    out.put_u32(0);
    out.put_u8(t);
    start
}

/// Finishes a frame begun at `start`, whose body continues for `extra` bytes not yet written.
fn finish(out: &mut BytesMut, start: usize, extra: usize) {
    let len = out.len() - start - 4 + extra;
    out[start..start + 4].copy_from_slice(&(len as u32).to_be_bytes());
}

fn options_len(msg: &Message) -> (u8, usize) {
    let mut flags = 0;
    let mut n = 0;
    if let Some(r) = &msg.reply_to {
        flags |= flag::REPLY_TO;
        n += 2 + r.as_bytes().len();
    }
    if let Some(c) = &msg.correlation_id {
        flags |= flag::CORRELATION;
        n += 2 + c.len();
    }
    if let Some(h) = &msg.headers {
        flags |= flag::HEADERS;
        n += 2 + h.iter().map(|(k, v)| 6 + k.len() + v.len()).sum::<usize>();
    }
    (flags, n)
}

fn put_options(out: &mut BytesMut, msg: &Message) {
    if let Some(r) = &msg.reply_to {
        put_str16(out, r.as_bytes());
    }
    if let Some(c) = &msg.correlation_id {
        put_str16(out, c);
    }
    if let Some(h) = &msg.headers {
        out.put_u16(h.len() as u16);
        for (k, v) in h {
            put_str16(out, k.as_bytes());
            out.put_u32(v.len() as u32);
            out.put_slice(v);
        }
    }
}

/// Checks that `msg`'s options fit their wire fields (correlation id up to 65535 bytes, up to
/// 65535 headers, names up to 65535 bytes, values up to 4 GiB - 1). Encoders assume it.
pub fn check_options(msg: &Message) -> Result<(), &'static str> {
    const MAX16: usize = u16::MAX as usize;
    if msg.correlation_id.as_ref().is_some_and(|c| c.len() > MAX16) {
        return Err("correlation id longer than 65535 bytes");
    }
    if let Some(h) = &msg.headers {
        if h.len() > MAX16 {
            return Err("more than 65535 headers");
        }
        if h.iter().any(|(k, _)| k.len() > MAX16) {
            return Err("header name longer than 65535 bytes");
        }
        if h.iter().any(|(_, v)| v.len() > u32::MAX as usize) {
            return Err("header value longer than 4 GiB - 1");
        }
    }
    Ok(())
}

/// Encodes PUB for `msg` (payload included).
pub fn encode_pub(msg: &Message, out: &mut BytesMut) {
    out.reserve(msg.payload.len());
    encode_pub_head(msg, out);
    out.put_slice(&msg.payload);
}

/// Encodes a PUB frame *without its payload*: the frame length counts the payload, which the
/// caller writes right after.
pub fn encode_pub_head(msg: &Message, out: &mut BytesMut) {
    let (flags, opt) = options_len(msg);
    out.reserve(HEADER_LEN + 3 + msg.key.as_bytes().len() + opt);
    let start = begin(out, ty::PUB);
    out.put_u8(flags);
    put_str16(out, msg.key.as_bytes());
    put_options(out, msg);
    finish(out, start, msg.payload.len());
}

/// Encodes a MSG frame *without its payload*: the frame length counts the payload, which the
/// caller appends next (copied, or as a separate zero-copy chunk for a vectored write).
pub fn encode_msg_head(sid: u32, msg: &Message, out: &mut BytesMut) {
    let (flags, opt) = options_len(msg);
    out.reserve(HEADER_LEN + 7 + msg.key.as_bytes().len() + opt);
    let start = begin(out, ty::MSG);
    out.put_u32(sid);
    out.put_u8(flags);
    put_str16(out, msg.key.as_bytes());
    put_options(out, msg);
    finish(out, start, msg.payload.len());
}

/// Encodes a MSG_ACKED frame *without its payload* (see [`encode_msg_head`]).
pub fn encode_msg_acked_head(sid: u32, delivery: u64, msg: &Message, out: &mut BytesMut) {
    let (mut flags, opt) = options_len(msg);
    if msg.attrs.redelivered {
        flags |= flag::REDELIVERED;
    }
    if msg.attrs.stream_offset.is_some() {
        flags |= flag::STREAM;
    }
    out.reserve(HEADER_LEN + 27 + msg.key.as_bytes().len() + opt);
    let start = begin(out, ty::MSG_ACKED);
    out.put_u32(sid);
    out.put_u64(delivery);
    out.put_u8(flags);
    if let Some(o) = msg.attrs.stream_offset {
        out.put_u64(o);
        out.put_u32(msg.attrs.deliveries);
    }
    put_str16(out, msg.key.as_bytes());
    put_options(out, msg);
    finish(out, start, msg.payload.len());
}

/// Encodes a MSG_REF frame (see [`Frame::MsgRef`]).
pub fn encode_msg_ref(sid: u32, at: u64, len: u32, tag: u64, out: &mut BytesMut) {
    let start = begin(out, ty::MSG_REF);
    out.put_u32(sid);
    out.put_u64(at);
    out.put_u32(len);
    out.put_u64(tag);
    finish(out, start, 0);
}

/// Encodes a whole MSG frame.
pub fn encode_msg(sid: u32, msg: &Message, out: &mut BytesMut) {
    encode_msg_head(sid, msg, out);
    out.extend_from_slice(&msg.payload);
}

/// Encodes the head of a MSG_BATCH whose items (each `4 + payload` bytes) total
/// `items_len` bytes; the caller appends each item with [`encode_batch_item`] or
/// [`encode_msg_batch_item_head`] + the payload.
pub fn encode_msg_batch_head(sid: u32, key: &Key, items_len: usize, out: &mut BytesMut) {
    let start = begin(out, ty::MSG_BATCH);
    out.put_u32(sid);
    put_str16(out, key.as_bytes());
    finish(out, start, items_len);
}

/// Encodes the head of a PUB_BATCH whose items total `items_len` bytes.
pub fn encode_pub_batch_head(key: &Key, items_len: usize, out: &mut BytesMut) {
    let start = begin(out, ty::PUB_BATCH);
    put_str16(out, key.as_bytes());
    finish(out, start, items_len);
}

/// Encodes one batch item, payload included.
pub fn encode_batch_item(payload: &[u8], out: &mut BytesMut) {
    out.put_u32(payload.len() as u32);
    out.put_slice(payload);
}

/// Encodes the length prefix of one batch item; the caller appends the payload.
pub fn encode_msg_batch_item_head(payload_len: usize, out: &mut BytesMut) {
    out.put_u32(payload_len as u32);
}

/// Encodes a SUB frame.
pub fn encode_sub(sub: &Sub, out: &mut BytesMut) {
    let start = begin(out, ty::SUB);
    out.put_u32(sub.sid);
    out.put_u8(sub.qos.to_bits());
    put_str16(out, sub.group.as_deref().unwrap_or("").as_bytes());
    put_str16(out, sub.expr.as_str().as_bytes());
    finish(out, start, 0);
}

/// Encodes a PING frame.
pub fn encode_ping(token: u64, out: &mut BytesMut) {
    let start = begin(out, ty::PING);
    out.put_u64(token);
    finish(out, start, 0);
}

fn encode_pub_batch(key: &Key, payloads: &[Bytes], out: &mut BytesMut) {
    let start = begin(out, ty::PUB_BATCH);
    put_str16(out, key.as_bytes());
    for p in payloads {
        encode_batch_item(p, out);
    }
    finish(out, start, 0);
}

/// Encodes any frame.
pub fn encode(frame: &Frame, out: &mut BytesMut) {
    match frame {
        Frame::Hello(h) => {
            let start = begin(out, ty::HELLO);
            out.put_u32(crate::MAGIC);
            out.put_u16(h.version);
            out.put_u16(h.flags);
            put_str16(out, h.name.as_bytes());
            out.put_u32(h.auth.len() as u32);
            out.put_slice(&h.auth);
            finish(out, start, 0);
        }
        Frame::Welcome(w) => {
            let start = begin(out, ty::WELCOME);
            out.put_u16(w.version);
            out.put_u64(w.session);
            out.put_u64(w.max_payload);
            put_str16(out, w.server.as_bytes());
            put_str16(out, w.inbox.as_bytes());
            if let Some(shm) = &w.shm {
                put_str16(out, shm.as_bytes());
            }
            finish(out, start, 0);
        }
        Frame::Pub(m) => encode_pub(m, out),
        Frame::Sub(s) => encode_sub(s, out),
        Frame::Unsub { sid } => {
            let start = begin(out, ty::UNSUB);
            out.put_u32(*sid);
            finish(out, start, 0);
        }
        Frame::Msg { sid, msg } => encode_msg(*sid, msg, out),
        Frame::PubBatch { key, payloads } => encode_pub_batch(key, payloads, out),
        Frame::MsgBatch { sid, key, payloads } => {
            let start = begin(out, ty::MSG_BATCH);
            out.put_u32(*sid);
            put_str16(out, key.as_bytes());
            out.put_slice(payloads.wire());
            finish(out, start, 0);
        }
        Frame::Ping(t) => encode_ping(*t, out),
        Frame::Pong(t) => {
            let start = begin(out, ty::PONG);
            out.put_u64(*t);
            finish(out, start, 0);
        }
        Frame::Lost { sid, count } => {
            let start = begin(out, ty::LOST);
            out.put_u32(*sid);
            out.put_u64(*count);
            finish(out, start, 0);
        }
        Frame::MsgRef { sid, at, len, tag } => encode_msg_ref(*sid, *at, *len, *tag, out),
        Frame::Err { code, message } => {
            let start = begin(out, ty::ERR);
            out.put_u16(code.code());
            // A str16 holds at most 65535 bytes: cut a longer message on a char boundary so
            // what is sent is still valid UTF-8.
            let mut n = message.len().min(u16::MAX as usize);
            while !message.is_char_boundary(n) {
                n -= 1;
            }
            put_str16(out, &message.as_bytes()[..n]);
            finish(out, start, 0);
        }
        Frame::Close => {
            let start = begin(out, ty::CLOSE);
            finish(out, start, 0);
        }
        Frame::MsgAcked { sid, delivery, msg } => {
            encode_msg_acked_head(*sid, *delivery, msg, out);
            out.extend_from_slice(&msg.payload);
        }
        Frame::Ack {
            delivery,
            cumulative,
        } => {
            let start = begin(out, ty::ACK);
            out.put_u8(u8::from(*cumulative));
            out.put_u64(*delivery);
            finish(out, start, 0);
        }
        Frame::Nack { delivery, delay_ms } => {
            let start = begin(out, ty::NACK);
            out.put_u64(*delivery);
            if *delay_ms > 0 {
                out.put_u32(*delay_ms);
            }
            finish(out, start, 0);
        }
        Frame::PubConfirm { id, msg } => {
            let (flags, opt) = options_len(msg);
            out.reserve(HEADER_LEN + 11 + msg.key.as_bytes().len() + opt + msg.payload.len());
            let start = begin(out, ty::PUB_CONFIRM);
            out.put_u64(*id);
            out.put_u8(flags);
            put_str16(out, msg.key.as_bytes());
            put_options(out, msg);
            out.put_slice(&msg.payload);
            finish(out, start, 0);
        }
        Frame::Confirm { id, outcome } => encode_confirm(*id, outcome, out),
        Frame::Consume {
            sid,
            stream,
            consumer,
            prefetch,
        } => {
            let start = begin(out, ty::CONSUME);
            out.put_u32(*sid);
            put_text16(out, stream);
            put_text16(out, consumer);
            if *prefetch > 0 {
                out.put_u32(*prefetch);
            }
            finish(out, start, 0);
        }
    }
}

fn put_text16(out: &mut BytesMut, s: &str) {
    let mut n = s.len().min(u16::MAX as usize);
    while !s.is_char_boundary(n) {
        n -= 1;
    }
    put_str16(out, &s.as_bytes()[..n]);
}

/// Encodes a CONFIRM.
pub fn encode_confirm(id: u64, outcome: &crate::ConfirmOutcome, out: &mut BytesMut) {
    use crate::ConfirmOutcome as C;
    let start = begin(out, ty::CONFIRM);
    out.put_u64(id);
    match outcome {
        C::Stored { stream, offset } => {
            out.put_u8(0);
            out.put_u64(*offset);
            put_text16(out, stream);
        }
        C::NotCaptured => out.put_u8(1),
        C::Failed(why) => {
            out.put_u8(2);
            put_text16(out, why);
        }
    }
    finish(out, start, 0);
}
