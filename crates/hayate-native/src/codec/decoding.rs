//! Decoding: [`decode`] checks a frame's header, then parses its body into a [`Frame`]
//! (payloads as zero-copy slices of the read buffer); [`DecodeError`] says why it could not.

use bytes::{Buf, Bytes, BytesMut};
use hayate_core::{Key, KeyError, KeyExpr, Message, Qos};

use super::HEADER_LEN;
use crate::frame::{ErrorCode, Frame, Hello, Sub, Welcome, flag, ty};

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
    /// A trailing `u32` a later version of the frame added: 0 when the body ends before it.
    fn trailing_u32(&mut self, what: &'static str) -> Result<u32, DecodeError> {
        if self.b.is_empty() {
            Ok(0)
        } else {
            self.u32(what)
        }
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
        ty::PUB_CONFIRM => "PUB_CONFIRM",
        ty::CONFIRM => "CONFIRM",
        ty::CONSUME => "CONSUME",
        ty::MSG_REF => "MSG_REF",
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
    let Some((t, name, len)) = header(buf, max_frame)? else {
        return Ok(None);
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

/// Decodes `frame`, which must be exactly one whole frame (a fan-out entry read in place:
/// its payloads stay slices of it, no copy). Checked as [`decode`] checks a frame; a
/// buffer shorter or longer than the frame its header announces is malformed.
pub fn decode_frame(frame: Bytes, max_frame: usize) -> Result<Frame, DecodeError> {
    let whole = |what| DecodeError::Malformed {
        frame: "frame",
        what,
    };
    let (t, name, len) = header(&frame, max_frame)?.ok_or(whole("shorter than its header"))?;
    if frame.len() != 4 + len {
        return Err(whole("not one whole frame"));
    }
    parse(
        t,
        Body {
            frame: name,
            b: frame.slice(HEADER_LEN..),
        },
    )
}

/// The header at the front of `buf`, checked: type, its name, length (type byte and
/// body). `None` while `buf` holds less than a header.
fn header(buf: &[u8], max_frame: usize) -> Result<Option<(u8, &'static str, usize)>, DecodeError> {
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
    Ok(Some((t, name, len)))
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

/// A PUB_BATCH's payloads, slices of the frame (the checks of [`crate::items::walk`]).
fn batch_payloads(b: &mut Body) -> Result<Vec<Bytes>, DecodeError> {
    let wire = b.rest();
    // One exact allocation for one payload (a lone publish, the common case).
    let mut v = Vec::with_capacity(1);
    crate::items::walk(&wire, |r| v.push(wire.slice(r))).map_err(|what| b.err(what))?;
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
            shm: if b.b.is_empty() {
                None
            } else {
                Some(b.str16("shm")?)
            },
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
            let payloads = crate::items::Items::parse(b.rest()).map_err(|what| b.err(what))?;
            return Ok(Frame::MsgBatch { sid, key, payloads });
        }
        ty::PING => Frame::Ping(b.u64("token")?),
        ty::PONG => Frame::Pong(b.u64("token")?),
        ty::LOST => Frame::Lost {
            sid: b.u32("sid")?,
            count: b.u64("count")?,
        },
        ty::MSG_REF => Frame::MsgRef {
            sid: b.u32("sid")?,
            at: b.u64("at")?,
            len: b.u32("len")?,
            tag: b.u64("tag")?,
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
            if flags & !(flag::ALL | flag::REDELIVERED | flag::STREAM) != 0 {
                return Err(b.err("reserved flag bits set"));
            }
            let stream = if flags & flag::STREAM != 0 {
                Some((b.u64("stream offset")?, b.u32("delivery count")?))
            } else {
                None
            };
            let key = b.key("key")?;
            let mut msg = options_checked(&mut b, flags & flag::ALL, key)?;
            msg.attrs.redelivered = flags & flag::REDELIVERED != 0;
            if let Some((offset, n)) = stream {
                msg.attrs.stream_offset = Some(offset);
                msg.attrs.deliveries = n;
            }
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
            delay_ms: b.trailing_u32("delay")?,
        },
        ty::PUB_CONFIRM => {
            let id = b.u64("id")?;
            let flags = b.u8("flags")?;
            let key = b.key("key")?;
            let msg = options(&mut b, flags, key)?;
            return Ok(Frame::PubConfirm { id, msg });
        }
        ty::CONSUME => Frame::Consume {
            sid: b.u32("sid")?,
            stream: b.str16("stream")?,
            consumer: b.str16("consumer")?,
            prefetch: b.trailing_u32("prefetch")?,
        },
        ty::CONFIRM => {
            let id = b.u64("id")?;
            let outcome = match b.u8("status")? {
                0 => {
                    let offset = b.u64("offset")?;
                    crate::ConfirmOutcome::Stored {
                        offset,
                        stream: b.str16("stream")?,
                    }
                }
                1 => crate::ConfirmOutcome::NotCaptured,
                2 => crate::ConfirmOutcome::Failed(b.str16("reason")?),
                _ => return Err(b.err("unknown confirm status")),
            };
            Frame::Confirm { id, outcome }
        }
        other => return Err(DecodeError::UnknownFrame(other)),
    };
    b.end()?;
    Ok(f)
}
