//! Encoding and decoding of native frames.

use bytes::{Buf, BufMut, Bytes, BytesMut};
use hayate_core::{Key, KeyError, KeyExpr, Message, Qos};

use crate::frame::{ErrorCode, Frame, Hello, Sub, Welcome, flag, ty};

/// Bytes before the body: `length: u32` and `type: u8`.
pub const HEADER_LEN: usize = 5;

/// The most payloads one PUB_BATCH or MSG_BATCH may carry. Each item costs 4 bytes on the
/// wire but a whole `Bytes` (and a routing step) once decoded, so without a cap a frame of
/// empty items would multiply its size in memory many times over. 65,536 items of 4 bytes
/// make 256 KiB, the client library's batch size.
pub const MAX_BATCH_ITEMS: usize = 65_536;

/// Why bytes could not be decoded. Every variant maps to an [`ErrorCode`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DecodeError {
    /// Unknown frame type.
    #[error("unknown frame type 0x{0:02x}")]
    UnknownFrame(u8),
    /// The body does not match the frame type.
    #[error("malformed {frame} frame: {what}")]
    Malformed {
        /// Frame name.
        frame: &'static str,
        /// What was wrong.
        what: &'static str,
    },
    /// The frame is longer than allowed.
    #[error("frame of {len} bytes exceeds the maximum of {max}")]
    TooLarge {
        /// Announced length.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// A key or key expression is invalid.
    #[error("invalid key: {0}")]
    BadKey(#[from] KeyError),
    /// A HELLO whose magic is not `"HYT1"`: the peer does not speak this protocol.
    #[error("bad HELLO magic 0x{0:08x}")]
    BadMagic(u32),
}

impl DecodeError {
    /// The ERR code to answer with.
    pub fn code(&self) -> ErrorCode {
        match self {
            DecodeError::UnknownFrame(_) => ErrorCode::UnknownFrame,
            DecodeError::Malformed { .. } => ErrorCode::Malformed,
            DecodeError::TooLarge { .. } => ErrorCode::FrameTooLarge,
            DecodeError::BadKey(_) => ErrorCode::BadKey,
            DecodeError::BadMagic(_) => ErrorCode::UnsupportedVersion,
        }
    }
}

/// A cursor over one frame's body that hands out zero-copy slices.
struct Body {
    frame: &'static str,
    b: Bytes,
}

impl Body {
    fn err(&self, what: &'static str) -> DecodeError {
        DecodeError::Malformed {
            frame: self.frame,
            what,
        }
    }
    fn need(&self, n: usize, what: &'static str) -> Result<(), DecodeError> {
        if self.b.len() < n {
            Err(self.err(what))
        } else {
            Ok(())
        }
    }
    fn u8(&mut self, what: &'static str) -> Result<u8, DecodeError> {
        self.need(1, what)?;
        Ok(self.b.get_u8())
    }
    fn u16(&mut self, what: &'static str) -> Result<u16, DecodeError> {
        self.need(2, what)?;
        Ok(self.b.get_u16())
    }
    fn u32(&mut self, what: &'static str) -> Result<u32, DecodeError> {
        self.need(4, what)?;
        Ok(self.b.get_u32())
    }
    fn u64(&mut self, what: &'static str) -> Result<u64, DecodeError> {
        self.need(8, what)?;
        Ok(self.b.get_u64())
    }
    fn take(&mut self, n: usize, what: &'static str) -> Result<Bytes, DecodeError> {
        self.need(n, what)?;
        Ok(self.b.split_to(n))
    }
    fn bytes16(&mut self, what: &'static str) -> Result<Bytes, DecodeError> {
        let n = self.u16(what)? as usize;
        self.take(n, what)
    }
    fn bytes32(&mut self, what: &'static str) -> Result<Bytes, DecodeError> {
        let n = self.u32(what)? as usize;
        self.take(n, what)
    }
    fn str16(&mut self, what: &'static str) -> Result<String, DecodeError> {
        let b = self.bytes16(what)?;
        String::from_utf8(b.to_vec()).map_err(|_| self.err("string is not UTF-8"))
    }
    fn key(&mut self, what: &'static str) -> Result<Key, DecodeError> {
        Ok(Key::from_bytes(self.bytes16(what)?)?)
    }
    fn rest(&mut self) -> Bytes {
        std::mem::take(&mut self.b)
    }
    fn end(&self) -> Result<(), DecodeError> {
        if self.b.is_empty() {
            Ok(())
        } else {
            Err(self.err("trailing bytes"))
        }
    }
}

fn frame_name(t: u8) -> Option<&'static str> {
    Some(match t {
        ty::HELLO => "HELLO",
        ty::WELCOME => "WELCOME",
        ty::PUB => "PUB",
        ty::SUB => "SUB",
        ty::UNSUB => "UNSUB",
        ty::MSG => "MSG",
        ty::PUB_BATCH => "PUB_BATCH",
        ty::MSG_BATCH => "MSG_BATCH",
        ty::PING => "PING",
        ty::PONG => "PONG",
        ty::LOST => "LOST",
        ty::ERR => "ERR",
        ty::CLOSE => "CLOSE",
        ty::MSG_ACKED => "MSG_ACKED",
        ty::ACK => "ACK",
        ty::NACK => "NACK",
        _ => return None,
    })
}

/// Decodes one frame from the front of `buf`.
///
/// Returns `Ok(None)` if `buf` does not yet hold a whole frame (and reserves room for the rest
/// of it, so a large frame is read straight into place). A frame longer than `max_frame`
/// (type byte and body) is refused from its header alone. On success the frame's bytes are
/// removed from `buf`; payloads are zero-copy slices of it.
pub fn decode(buf: &mut BytesMut, max_frame: usize) -> Result<Option<Frame>, DecodeError> {
    if buf.len() < 4 {
        return Ok(None);
    }
    let len = u32::from_be_bytes([buf[0], buf[1], buf[2], buf[3]]) as usize;
    // A length of 0 cannot hold the type byte: refused as soon as the length is read, not
    // after waiting for a type byte that is really the next frame's first byte.
    if len == 0 {
        return Err(DecodeError::Malformed {
            frame: "frame",
            what: "length 0",
        });
    }
    if buf.len() < HEADER_LEN {
        return Ok(None);
    }
    if len > max_frame {
        return Err(DecodeError::TooLarge {
            len,
            max: max_frame,
        });
    }
    let t = buf[4];
    let Some(name) = frame_name(t) else {
        return Err(DecodeError::UnknownFrame(t));
    };
    let total = 4 + len;
    if buf.len() < total {
        buf.reserve(total - buf.len());
        return Ok(None);
    }
    buf.advance(HEADER_LEN);
    let body = buf.split_to(len - 1).freeze();
    parse(
        t,
        Body {
            frame: name,
            b: body,
        },
    )
    .map(Some)
}

fn options(b: &mut Body, flags: u8, key: Key) -> Result<Message, DecodeError> {
    if flags & !flag::ALL != 0 {
        return Err(b.err("reserved flag bits set"));
    }
    options_checked(b, flags, key)
}

fn options_checked(b: &mut Body, flags: u8, key: Key) -> Result<Message, DecodeError> {
    let reply_to = if flags & flag::REPLY_TO != 0 {
        Some(b.key("reply-to")?)
    } else {
        None
    };
    let correlation_id = if flags & flag::CORRELATION != 0 {
        Some(b.bytes16("correlation id")?)
    } else {
        None
    };
    let headers = if flags & flag::HEADERS != 0 {
        let n = b.u16("header count")?;
        let mut h = Vec::with_capacity(n.min(64) as usize);
        for _ in 0..n {
            let name = b.str16("header name")?;
            let value = b.bytes32("header value")?;
            h.push((name, value));
        }
        Some(h)
    } else {
        None
    };
    Ok(Message {
        key,
        payload: b.rest(),
        reply_to,
        correlation_id,
        headers,
        attrs: Default::default(),
    })
}

fn batch_payloads(b: &mut Body) -> Result<Vec<Bytes>, DecodeError> {
    let mut v = Vec::new();
    while !b.b.is_empty() {
        if v.len() == MAX_BATCH_ITEMS {
            return Err(b.err("more than 65536 batch items"));
        }
        v.push(b.bytes32("batch payload")?);
    }
    if v.is_empty() {
        return Err(b.err("empty batch"));
    }
    Ok(v)
}

fn parse(t: u8, mut b: Body) -> Result<Frame, DecodeError> {
    let f = match t {
        ty::HELLO => {
            let magic = b.u32("magic")?;
            if magic != crate::MAGIC {
                return Err(DecodeError::BadMagic(magic));
            }
            Frame::Hello(Hello {
                version: b.u16("version")?,
                flags: b.u16("flags")?,
                name: b.str16("name")?,
                auth: b.bytes32("auth")?,
            })
        }
        ty::WELCOME => Frame::Welcome(Welcome {
            version: b.u16("version")?,
            session: b.u64("session")?,
            max_payload: b.u64("max payload")?,
            server: b.str16("server")?,
            inbox: b.str16("inbox")?,
        }),
        ty::PUB => {
            let flags = b.u8("flags")?;
            let key = b.key("key")?;
            return Ok(Frame::Pub(options(&mut b, flags, key)?));
        }
        ty::SUB => {
            let sid = b.u32("sid")?;
            let qos = Qos::from_bits(b.u8("qos")?).ok_or_else(|| b.err("reserved qos bits"))?;
            let group = b.str16("group")?;
            let expr = KeyExpr::from_bytes(&b.bytes16("expr")?)?;
            Frame::Sub(Sub {
                sid,
                qos,
                group: (!group.is_empty()).then_some(group),
                expr,
            })
        }
        ty::UNSUB => Frame::Unsub { sid: b.u32("sid")? },
        ty::MSG => {
            let sid = b.u32("sid")?;
            let flags = b.u8("flags")?;
            let key = b.key("key")?;
            let msg = options(&mut b, flags, key)?;
            return Ok(Frame::Msg { sid, msg });
        }
        ty::PUB_BATCH => {
            let key = b.key("key")?;
            let payloads = batch_payloads(&mut b)?;
            return Ok(Frame::PubBatch { key, payloads });
        }
        ty::MSG_BATCH => {
            let sid = b.u32("sid")?;
            let key = b.key("key")?;
            let payloads = batch_payloads(&mut b)?;
            return Ok(Frame::MsgBatch { sid, key, payloads });
        }
        ty::PING => Frame::Ping(b.u64("token")?),
        ty::PONG => Frame::Pong(b.u64("token")?),
        ty::LOST => Frame::Lost {
            sid: b.u32("sid")?,
            count: b.u64("count")?,
        },
        ty::ERR => Frame::Err {
            code: ErrorCode::from_code(b.u16("code")?),
            message: b.str16("message")?,
        },
        ty::CLOSE => Frame::Close,
        ty::MSG_ACKED => {
            let sid = b.u32("sid")?;
            let delivery = b.u64("delivery")?;
            let flags = b.u8("flags")?;
            if flags & !(flag::ALL | flag::REDELIVERED) != 0 {
                return Err(b.err("reserved flag bits set"));
            }
            let key = b.key("key")?;
            let mut msg = options_checked(&mut b, flags & flag::ALL, key)?;
            msg.attrs.redelivered = flags & flag::REDELIVERED != 0;
            return Ok(Frame::MsgAcked { sid, delivery, msg });
        }
        ty::ACK => {
            let flags = b.u8("flags")?;
            if flags & !1 != 0 {
                return Err(b.err("reserved flag bits set"));
            }
            Frame::Ack {
                cumulative: flags & 1 != 0,
                delivery: b.u64("delivery")?,
            }
        }
        ty::NACK => Frame::Nack {
            delivery: b.u64("delivery")?,
        },
        other => return Err(DecodeError::UnknownFrame(other)),
    };
    b.end()?;
    Ok(f)
}

// ---------------------------------------------------------------------------------------
// Encoding

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
    let (flags, opt) = options_len(msg);
    out.reserve(HEADER_LEN + 3 + msg.key.as_bytes().len() + opt + msg.payload.len());
    let start = begin(out, ty::PUB);
    out.put_u8(flags);
    put_str16(out, msg.key.as_bytes());
    put_options(out, msg);
    out.put_slice(&msg.payload);
    finish(out, start, 0);
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
    out.reserve(HEADER_LEN + 15 + msg.key.as_bytes().len() + opt);
    let start = begin(out, ty::MSG_ACKED);
    out.put_u32(sid);
    out.put_u64(delivery);
    out.put_u8(flags);
    put_str16(out, msg.key.as_bytes());
    put_options(out, msg);
    finish(out, start, msg.payload.len());
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

fn encode_batch(t: u8, sid: Option<u32>, key: &Key, payloads: &[Bytes], out: &mut BytesMut) {
    let start = begin(out, t);
    if let Some(sid) = sid {
        out.put_u32(sid);
    }
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
        Frame::PubBatch { key, payloads } => encode_batch(ty::PUB_BATCH, None, key, payloads, out),
        Frame::MsgBatch { sid, key, payloads } => {
            encode_batch(ty::MSG_BATCH, Some(*sid), key, payloads, out)
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
        Frame::Nack { delivery } => {
            let start = begin(out, ty::NACK);
            out.put_u64(*delivery);
            finish(out, start, 0);
        }
    }
}
