//! The protocol header and frames.
//!
//! A frame is `type (u8) · channel (u16) · size (u32) · payload (size bytes) · 0xCE`. Its
//! payload is a method, a content header, a piece of content body, or nothing (a heartbeat,
//! on channel 0).

use bytes::{Buf, BufMut, Bytes, BytesMut};

use crate::error::DecodeError;
use crate::types::Reader;
use crate::{ContentHeader, Method};

/// What a client sends first: `AMQP 0 0 9 1`.
pub const PROTOCOL_HEADER: [u8; 8] = *b"AMQP\x00\x00\x09\x01";

/// The frame end octet.
pub const FRAME_END: u8 = 0xCE;

/// Bytes around a frame's payload (type, channel, size, end).
pub const FRAME_OVERHEAD: usize = 8;

/// Frame types.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum FrameType {
    /// A method.
    Method = 1,
    /// A content header.
    Header = 2,
    /// A piece of content body.
    Body = 3,
    /// A heartbeat (channel 0, empty).
    Heartbeat = 8,
}

/// A decoded frame.
#[derive(Debug, Clone, PartialEq)]
pub enum Frame {
    /// A method on `channel`.
    Method(u16, Method),
    /// A content header on `channel` (boxed: it is much larger than the other frames).
    Header(u16, Box<ContentHeader>),
    /// A piece of content body on `channel`.
    Body(u16, Bytes),
    /// A heartbeat.
    Heartbeat,
}

impl Frame {
    /// The frame's channel (0 for heartbeats).
    pub fn channel(&self) -> u16 {
        match self {
            Frame::Method(c, _) | Frame::Header(c, _) | Frame::Body(c, _) => *c,
            Frame::Heartbeat => 0,
        }
    }

    /// Appends the frame's bytes to `out`.
    pub fn encode(&self, out: &mut BytesMut) {
        let (ty, ch) = match self {
            Frame::Method(c, _) => (FrameType::Method, *c),
            Frame::Header(c, _) => (FrameType::Header, *c),
            Frame::Body(c, _) => (FrameType::Body, *c),
            Frame::Heartbeat => (FrameType::Heartbeat, 0),
        };
        out.put_u8(ty as u8);
        out.put_u16(ch);
        let at = out.len();
        out.put_u32(0);
        match self {
            Frame::Method(_, m) => m.encode(out),
            Frame::Header(_, h) => h.encode(out),
            Frame::Body(_, b) => out.put_slice(b),
            Frame::Heartbeat => {}
        }
        let n = (out.len() - at - 4) as u32;
        out[at..at + 4].copy_from_slice(&n.to_be_bytes());
        out.put_u8(FRAME_END);
    }

    /// Appends a body frame holding `body` without building a [`Frame`] (no copy of the
    /// body into a `Bytes` first).
    pub fn encode_body(channel: u16, body: &[u8], out: &mut BytesMut) {
        out.put_u8(FrameType::Body as u8);
        out.put_u16(channel);
        out.put_u32(body.len() as u32);
        out.put_slice(body);
        out.put_u8(FRAME_END);
    }
}

/// What the first 8 bytes of a connection said.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProtocolHeader {
    /// `AMQP 0 0 9 1`.
    Amqp091,
    /// Something else: answer with [`PROTOCOL_HEADER`] and close (spec 4.2.2).
    Other,
}

/// Reads the protocol header from the front of `buf` once 8 bytes are there. A wrong
/// header is known as soon as a byte differs, so a client that sends `GET / HTTP/1.1` is
/// answered without waiting for more.
pub fn decode_protocol_header(buf: &mut BytesMut) -> Option<ProtocolHeader> {
    let n = buf.len().min(PROTOCOL_HEADER.len());
    if buf[..n] != PROTOCOL_HEADER[..n] {
        return Some(ProtocolHeader::Other);
    }
    if buf.len() < PROTOCOL_HEADER.len() {
        return None;
    }
    buf.advance(PROTOCOL_HEADER.len());
    Some(ProtocolHeader::Amqp091)
}

/// Splits frames off a read buffer, refusing any larger than the negotiated frame size
/// before its payload is read.
#[derive(Debug, Clone)]
pub struct FrameDecoder {
    /// The largest frame accepted, overhead included (`frame-max` of connection.tune-ok;
    /// 0 means no limit, which this decoder does not allow: see [`FrameDecoder::new`]).
    max_frame: u32,
}

impl FrameDecoder {
    /// A decoder accepting frames of at most `max_frame` bytes (0, "no limit" in AMQP,
    /// is taken as 128 KiB: a server must bound what it buffers).
    pub fn new(max_frame: u32) -> FrameDecoder {
        FrameDecoder {
            max_frame: if max_frame == 0 {
                128 * 1024
            } else {
                max_frame
            },
        }
    }

    /// The largest frame accepted.
    pub fn max_frame(&self) -> u32 {
        self.max_frame
    }

    /// Changes the largest frame accepted (after tuning).
    pub fn set_max_frame(&mut self, max_frame: u32) {
        *self = FrameDecoder::new(max_frame);
    }

    /// The next frame from the front of `buf`, or `None` until it is complete.
    pub fn decode(&self, buf: &mut BytesMut) -> Result<Option<Frame>, DecodeError> {
        if buf.len() < 7 {
            return Ok(None);
        }
        let ty = buf[0];
        let channel = u16::from_be_bytes([buf[1], buf[2]]);
        let size = u32::from_be_bytes([buf[3], buf[4], buf[5], buf[6]]);
        let total = size as u64 + FRAME_OVERHEAD as u64;
        if total > u64::from(self.max_frame) {
            return Err(DecodeError::FrameTooLarge {
                size: total,
                max: self.max_frame,
            });
        }
        if !matches!(ty, 1..=3 | 8) {
            return Err(DecodeError::UnknownFrameType(ty));
        }
        let total = total as usize;
        if buf.len() < total {
            buf.reserve(total - buf.len());
            return Ok(None);
        }
        let end = buf[total - 1];
        if end != FRAME_END {
            return Err(DecodeError::BadFrameEnd(end));
        }
        let mut frame = buf.split_to(total);
        frame.advance(7);
        frame.truncate(size as usize);
        let payload = frame.freeze();
        Ok(Some(match ty {
            1 => {
                let m = Method::decode(&payload)?;
                Frame::Method(channel, m)
            }
            2 => {
                let mut r = Reader::shared(&payload);
                let h = ContentHeader::read(&mut r)?;
                r.finish()?;
                Frame::Header(channel, Box::new(h))
            }
            3 => Frame::Body(channel, payload),
            _ => Frame::Heartbeat,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn protocol_header() {
        let mut b = BytesMut::from(&b"AMQP"[..]);
        assert_eq!(decode_protocol_header(&mut b), None);
        b.extend_from_slice(&[0, 0, 9, 1, 1]);
        assert_eq!(
            decode_protocol_header(&mut b),
            Some(ProtocolHeader::Amqp091)
        );
        assert_eq!(&b[..], &[1]);
        let mut b = BytesMut::from(&b"GET"[..]);
        assert_eq!(decode_protocol_header(&mut b), Some(ProtocolHeader::Other));
        let mut b = BytesMut::from(&b"AMQP\x00\x00\x09\x00"[..]);
        assert_eq!(decode_protocol_header(&mut b), Some(ProtocolHeader::Other));
    }

    #[test]
    fn frames_are_bounded_and_checked() {
        let d = FrameDecoder::new(4096);
        let mut b = BytesMut::new();
        Frame::Heartbeat.encode(&mut b);
        Frame::Body(3, Bytes::from_static(b"hello")).encode(&mut b);
        assert_eq!(d.decode(&mut b), Ok(Some(Frame::Heartbeat)));
        let mut half = b.split_to(6);
        assert_eq!(d.decode(&mut half), Ok(None));
        half.unsplit(b);
        let mut b = half;
        assert_eq!(
            d.decode(&mut b),
            Ok(Some(Frame::Body(3, Bytes::from_static(b"hello"))))
        );
        assert!(b.is_empty());
        // A size past the maximum is refused from the 7-byte head alone.
        let mut b = BytesMut::from(&[3, 0, 1, 0x7f, 0xff, 0xff, 0xff][..]);
        assert!(matches!(
            d.decode(&mut b),
            Err(DecodeError::FrameTooLarge { .. })
        ));
        let mut b = BytesMut::from(&[9, 0, 0, 0, 0, 0, 0, FRAME_END][..]);
        assert_eq!(d.decode(&mut b), Err(DecodeError::UnknownFrameType(9)));
        let mut b = BytesMut::from(&[8, 0, 0, 0, 0, 0, 0, 0][..]);
        assert_eq!(d.decode(&mut b), Err(DecodeError::BadFrameEnd(0)));
    }
}
