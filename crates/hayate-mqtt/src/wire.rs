//! The data representations of section 1.5: integers, variable byte integers, strings and
//! binary data. A [`Reader`] over one packet's body for decoding, and writers for encoding.

use bytes::{BufMut, Bytes, BytesMut};

use crate::bytestr::ByteStr;
use crate::error::{DecodeError, EncodeError};
use crate::types::PacketType;

/// The largest value a variable byte integer can hold, and so the largest remaining length.
pub const MAX_VAR_INT: u32 = 268_435_455;

/// The longest string or binary data: the length prefix is two bytes.
pub(crate) const MAX_STR: usize = u16::MAX as usize;

/// Bytes a variable byte integer takes on the wire (values above [`MAX_VAR_INT`] count 4).
pub(crate) fn var_int_len(n: u32) -> usize {
    match n {
        0..=127 => 1,
        128..=16_383 => 2,
        16_384..=2_097_151 => 3,
        _ => 4,
    }
}

/// Writes a variable byte integer; `n` must be at most [`MAX_VAR_INT`].
pub(crate) fn put_var_int(out: &mut BytesMut, mut n: u32) {
    debug_assert!(n <= MAX_VAR_INT);
    loop {
        // `n % 128 < 128`, so the cast cannot truncate.
        let mut byte = (n % 128) as u8;
        n /= 128;
        if n > 0 {
            byte |= 0x80;
        }
        out.put_u8(byte);
        if n == 0 {
            break;
        }
    }
}

/// Reads a variable byte integer from the front of `b`: `Ok(Some((value, bytes used)))`, or
/// `Ok(None)` if `b` ends before it does. More than 4 bytes, or a longer form than needed
/// (a last byte of 0 after a continuation), is [`DecodeError::MalformedVarInt`].
pub(crate) fn var_int(b: &[u8]) -> Result<Option<(u32, usize)>, DecodeError> {
    let mut value: u32 = 0;
    for (i, &byte) in b.iter().enumerate().take(4) {
        value |= u32::from(byte & 0x7f) << (7 * i);
        if byte & 0x80 == 0 {
            if i > 0 && byte == 0 {
                return Err(DecodeError::MalformedVarInt);
            }
            return Ok(Some((value, i + 1)));
        }
    }
    if b.len() >= 4 {
        Err(DecodeError::MalformedVarInt)
    } else {
        Ok(None)
    }
}

/// Checks the MQTT rules for a string: valid UTF-8 (given by `&str`), no U+0000, at most
/// 65,535 bytes. Returns its size on the wire, length prefix included.
pub(crate) fn check_str(s: &str) -> Result<usize, EncodeError> {
    if s.len() > MAX_STR {
        return Err(EncodeError::StringTooLong(s.len()));
    }
    if s.as_bytes().contains(&0) {
        return Err(DecodeError::NulInString.into());
    }
    Ok(2 + s.len())
}

/// Checks binary data is at most 65,535 bytes; returns its size on the wire.
pub(crate) fn check_binary(b: &[u8]) -> Result<usize, EncodeError> {
    if b.len() > MAX_STR {
        return Err(EncodeError::BinaryTooLong(b.len()));
    }
    Ok(2 + b.len())
}

/// Writes a string or binary data checked by [`check_str`] or [`check_binary`].
pub(crate) fn put_binary(out: &mut BytesMut, b: &[u8]) {
    debug_assert!(b.len() <= MAX_STR);
    // Checked to be at most 65,535 bytes before writing.
    out.put_u16(b.len() as u16);
    out.put_slice(b);
}

/// Writes a string checked by [`check_str`].
pub(crate) fn put_str(out: &mut BytesMut, s: &str) {
    put_binary(out, s.as_bytes());
}

/// Validates bytes as an MQTT string: UTF-8 and no U+0000.
pub(crate) fn mqtt_str(bytes: Bytes) -> Result<ByteStr, DecodeError> {
    if bytes.contains(&0) {
        return Err(DecodeError::NulInString);
    }
    ByteStr::from_utf8(bytes).map_err(|_| DecodeError::InvalidUtf8)
}

/// A cursor over the body of one packet (everything after the fixed header).
///
/// Strings and binary data come out as slices of the body when `zero_copy` is set (PUBLISH),
/// and as copies otherwise, so that what a session keeps from a CONNECT or a SUBSCRIBE does
/// not keep the read buffer alive.
pub(crate) struct Reader {
    buf: Bytes,
    pos: usize,
    packet: PacketType,
    zero_copy: bool,
}

impl Reader {
    pub(crate) fn new(buf: Bytes, packet: PacketType, zero_copy: bool) -> Reader {
        Reader {
            buf,
            pos: 0,
            packet,
            zero_copy,
        }
    }

    /// Bytes left.
    pub(crate) fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.remaining() == 0
    }

    fn truncated(&self) -> DecodeError {
        DecodeError::Truncated(self.packet)
    }

    /// The next `n` bytes, borrowed.
    fn take(&mut self, n: usize) -> Result<&[u8], DecodeError> {
        if self.remaining() < n {
            return Err(self.truncated());
        }
        let start = self.pos;
        self.pos += n;
        Ok(&self.buf[start..start + n])
    }

    pub(crate) fn u8(&mut self) -> Result<u8, DecodeError> {
        Ok(self.take(1)?[0])
    }

    pub(crate) fn u16(&mut self) -> Result<u16, DecodeError> {
        let b = self.take(2)?;
        Ok(u16::from_be_bytes([b[0], b[1]]))
    }

    pub(crate) fn u32(&mut self) -> Result<u32, DecodeError> {
        let b = self.take(4)?;
        Ok(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }

    pub(crate) fn var_int(&mut self) -> Result<u32, DecodeError> {
        match var_int(&self.buf[self.pos..])? {
            Some((value, n)) => {
                self.pos += n;
                Ok(value)
            }
            None => Err(self.truncated()),
        }
    }

    /// A packet identifier, which must not be 0.
    pub(crate) fn packet_id(&mut self) -> Result<u16, DecodeError> {
        match self.u16()? {
            0 => Err(DecodeError::ZeroPacketId(self.packet)),
            id => Ok(id),
        }
    }

    /// The next `n` bytes as [`Bytes`]: a slice or a copy (see the type's documentation).
    fn bytes(&mut self, n: usize) -> Result<Bytes, DecodeError> {
        if self.remaining() < n {
            return Err(self.truncated());
        }
        let (start, end) = (self.pos, self.pos + n);
        self.pos = end;
        Ok(if n == 0 {
            Bytes::new()
        } else if self.zero_copy {
            self.buf.slice(start..end)
        } else {
            Bytes::copy_from_slice(&self.buf[start..end])
        })
    }

    /// Binary data: a two-byte length, then that many bytes.
    pub(crate) fn binary(&mut self) -> Result<Bytes, DecodeError> {
        let n = self.u16()?;
        self.bytes(usize::from(n))
    }

    /// A UTF-8 encoded string: a two-byte length, then that many bytes of UTF-8 without
    /// U+0000.
    pub(crate) fn string(&mut self) -> Result<ByteStr, DecodeError> {
        mqtt_str(self.binary()?)
    }

    /// Everything left (a PUBLISH payload).
    pub(crate) fn rest(&mut self) -> Result<Bytes, DecodeError> {
        self.bytes(self.remaining())
    }

    /// A reader over the next `n` bytes (a property block), which this reader skips.
    pub(crate) fn sub(&mut self, n: usize) -> Result<Reader, DecodeError> {
        if self.remaining() < n {
            return Err(self.truncated());
        }
        let start = self.pos;
        self.pos += n;
        Ok(Reader {
            buf: self.buf.slice(start..start + n),
            pos: 0,
            packet: self.packet,
            zero_copy: self.zero_copy,
        })
    }

    /// Fails if bytes are left over.
    pub(crate) fn finish(&self) -> Result<(), DecodeError> {
        if self.is_empty() {
            Ok(())
        } else {
            Err(DecodeError::TrailingBytes(self.packet))
        }
    }
}
