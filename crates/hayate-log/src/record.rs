//! The record frame: how one record is laid out on disk (sans-IO).
//!
//! ```text
//! 0   u32 LE  body length L (bytes after the CRC field)
//! 4   u32 LE  CRC-32C (Castagnoli) of the L body bytes
//! 8   u8      format version, 1
//! 9   u64 LE  offset
//! 17  i64 LE  timestamp, milliseconds since the Unix epoch
//! 25  u32 LE  key length K
//! 29  u32 LE  headers length H
//! 33  K bytes key, H bytes headers, then the value (L - 25 - K - H bytes)
//! ```
//!
//! docs/log-format.md is the reference; keep the two in step.

use bytes::{BufMut, Bytes};

/// Bytes before the body: the length and the CRC.
pub const FRAME_HEADER_LEN: usize = 8;
/// Fixed part of the body: version, offset, timestamp, key length, headers length.
pub const BODY_FIXED_LEN: usize = 1 + 8 + 8 + 4 + 4;
/// Bytes a record takes on disk beyond its key, headers and value.
pub const RECORD_OVERHEAD: usize = FRAME_HEADER_LEN + BODY_FIXED_LEN;
/// The only record format version written and accepted.
pub const RECORD_VERSION: u8 = 1;

/// A record to append: what the caller supplies (the log assigns the offset).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry<'a> {
    /// Milliseconds since the Unix epoch; the time index and age retention use it.
    pub timestamp: i64,
    /// The record's key (for Hayate: the message key). Opaque to the log.
    pub key: &'a [u8],
    /// Metadata the caller wants kept beside the value. Opaque to the log.
    pub headers: &'a [u8],
    /// The payload. Opaque to the log.
    pub value: &'a [u8],
}

impl Entry<'_> {
    /// Bytes this entry takes on disk.
    pub fn encoded_len(&self) -> usize {
        RECORD_OVERHEAD + self.key.len() + self.headers.len() + self.value.len()
    }
}

/// A record read back from the log. `key`, `headers` and `value` share one buffer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// Its position in the log: consecutive, starting where the log starts.
    pub offset: u64,
    /// Milliseconds since the Unix epoch, as appended.
    pub timestamp: i64,
    /// As appended.
    pub key: Bytes,
    /// As appended.
    pub headers: Bytes,
    /// As appended.
    pub value: Bytes,
}

/// Why bytes at some position are not a record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Corruption {
    /// The length field is smaller than the fixed body (a zeroed tail reads as this).
    LengthTooSmall(u32),
    /// The length field is larger than the configured record limit.
    LengthTooLarge(u32),
    /// The body's CRC-32C does not match the stored one.
    Crc,
    /// The version byte is not [`RECORD_VERSION`].
    Version(u8),
    /// Key and headers lengths run past the body.
    FieldLengths,
    /// The record's offset is not the one expected at this position.
    Offset {
        /// The offset the log expected next.
        expected: u64,
        /// The offset the record carries.
        found: u64,
    },
}

impl std::fmt::Display for Corruption {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Corruption::LengthTooSmall(n) => write!(f, "record length {n} is below the minimum"),
            Corruption::LengthTooLarge(n) => write!(f, "record length {n} is above the limit"),
            Corruption::Crc => f.write_str("CRC-32C mismatch"),
            Corruption::Version(v) => write!(f, "unknown record version {v}"),
            Corruption::FieldLengths => f.write_str("key and headers lengths exceed the record"),
            Corruption::Offset { expected, found } => {
                write!(f, "record offset {found} where {expected} was expected")
            }
        }
    }
}

/// The result of looking for a record at the start of a buffer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decoded {
    /// A whole, valid record that took `len` bytes.
    Record {
        /// The record.
        record: Record,
        /// Bytes it took, frame header included.
        len: usize,
    },
    /// The buffer holds only the start of a record; `need` bytes in all would hold it
    /// (`need` is [`FRAME_HEADER_LEN`] while the length field itself is incomplete).
    Incomplete {
        /// Total bytes needed from the start of the buffer.
        need: usize,
    },
    /// The bytes are not a valid record.
    Corrupt(Corruption),
}

/// Appends the frame of `entry` at `offset` to `buf`.
pub fn encode(buf: &mut Vec<u8>, offset: u64, entry: &Entry<'_>) {
    let body_len = entry.encoded_len() - FRAME_HEADER_LEN;
    buf.reserve(entry.encoded_len());
    let start = buf.len();
    buf.put_u32_le(u32::try_from(body_len).unwrap_or(u32::MAX));
    buf.put_u32_le(0); // the CRC, filled in below
    buf.put_u8(RECORD_VERSION);
    buf.put_u64_le(offset);
    buf.put_i64_le(entry.timestamp);
    buf.put_u32_le(u32::try_from(entry.key.len()).unwrap_or(u32::MAX));
    buf.put_u32_le(u32::try_from(entry.headers.len()).unwrap_or(u32::MAX));
    buf.extend_from_slice(entry.key);
    buf.extend_from_slice(entry.headers);
    buf.extend_from_slice(entry.value);
    let body = start + FRAME_HEADER_LEN;
    let crc = crc32c::crc32c(&buf[body..]);
    buf[start + 4..body].copy_from_slice(&crc.to_le_bytes());
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(a)
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(a)
}

/// The total length (frame header included) of the record starting `buf`, once the length
/// field is complete and plausible.
pub fn frame_len(buf: &[u8], max_body: u32) -> Result<Option<usize>, Corruption> {
    if buf.len() < FRAME_HEADER_LEN {
        return Ok(None);
    }
    let body = u32_at(buf, 0);
    if (body as usize) < BODY_FIXED_LEN {
        return Err(Corruption::LengthTooSmall(body));
    }
    if body > max_body {
        return Err(Corruption::LengthTooLarge(body));
    }
    Ok(Some(FRAME_HEADER_LEN + body as usize))
}

/// Where the parts of a checked record lie, relative to the start of its frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Layout {
    pub(crate) len: usize,
    pub(crate) offset: u64,
    pub(crate) timestamp: i64,
    pub(crate) key: std::ops::Range<usize>,
    pub(crate) headers: std::ops::Range<usize>,
    pub(crate) value: std::ops::Range<usize>,
}

/// Checks the record at the start of `buf` (length bound first, then CRC, version and field
/// lengths) without copying anything.
pub(crate) fn check(buf: &[u8], max_body: u32) -> Result<Result<Layout, usize>, Corruption> {
    let total = match frame_len(buf, max_body)? {
        Some(n) => n,
        None => return Ok(Err(FRAME_HEADER_LEN)),
    };
    if buf.len() < total {
        return Ok(Err(total));
    }
    let b = &buf[..total];
    let body = &b[FRAME_HEADER_LEN..];
    if crc32c::crc32c(body) != u32_at(b, 4) {
        return Err(Corruption::Crc);
    }
    if body[0] != RECORD_VERSION {
        return Err(Corruption::Version(body[0]));
    }
    let key_len = u32_at(body, 17) as usize;
    let headers_len = u32_at(body, 21) as usize;
    let key_at = FRAME_HEADER_LEN + BODY_FIXED_LEN;
    let headers_at = key_at
        .checked_add(key_len)
        .ok_or(Corruption::FieldLengths)?;
    let value_at = headers_at
        .checked_add(headers_len)
        .ok_or(Corruption::FieldLengths)?;
    if value_at > total {
        return Err(Corruption::FieldLengths);
    }
    Ok(Ok(Layout {
        len: total,
        offset: u64_at(body, 1),
        timestamp: u64_at(body, 9) as i64,
        key: key_at..headers_at,
        headers: headers_at..value_at,
        value: value_at..total,
    }))
}

impl Layout {
    /// The record, its fields sliced from `frame` (which starts at the record).
    pub(crate) fn record(&self, frame: &Bytes) -> Record {
        Record {
            offset: self.offset,
            timestamp: self.timestamp,
            key: frame.slice(self.key.clone()),
            headers: frame.slice(self.headers.clone()),
            value: frame.slice(self.value.clone()),
        }
    }
}

/// Decodes the record at the start of `buf`. `max_body` bounds the length field (checked
/// before anything is read past it); the returned record's fields are slices of `buf`.
pub fn decode(buf: &Bytes, max_body: u32) -> Decoded {
    match check(buf, max_body) {
        Ok(Ok(l)) => Decoded::Record {
            record: l.record(buf),
            len: l.len,
        },
        Ok(Err(need)) => Decoded::Incomplete { need },
        Err(c) => Decoded::Corrupt(c),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const MAX: u32 = 1 << 20;

    fn entry<'a>(key: &'a [u8], headers: &'a [u8], value: &'a [u8], ts: i64) -> Entry<'a> {
        Entry {
            timestamp: ts,
            key,
            headers,
            value,
        }
    }

    proptest! {
        #[test]
        fn round_trip(offset in any::<u64>(), ts in any::<i64>(),
                      key in proptest::collection::vec(any::<u8>(), 0..64),
                      headers in proptest::collection::vec(any::<u8>(), 0..64),
                      value in proptest::collection::vec(any::<u8>(), 0..512)) {
            let e = entry(&key, &headers, &value, ts);
            let mut buf = Vec::new();
            encode(&mut buf, offset, &e);
            prop_assert_eq!(buf.len(), e.encoded_len());
            let bytes = Bytes::from(buf.clone());
            match decode(&bytes, MAX) {
                Decoded::Record { record, len } => {
                    prop_assert_eq!(len, buf.len());
                    prop_assert_eq!(record.offset, offset);
                    prop_assert_eq!(record.timestamp, ts);
                    prop_assert_eq!(&record.key[..], &key[..]);
                    prop_assert_eq!(&record.headers[..], &headers[..]);
                    prop_assert_eq!(&record.value[..], &value[..]);
                }
                other => prop_assert!(false, "{:?}", other),
            }
            // Every strict prefix is incomplete, never a record and never a panic.
            for cut in 0..buf.len() {
                let d = decode(&Bytes::copy_from_slice(&buf[..cut]), MAX);
                prop_assert!(matches!(d, Decoded::Incomplete { .. }), "cut {}: {:?}", cut, d);
            }
        }

        #[test]
        fn any_single_bit_flip_is_detected(value in proptest::collection::vec(any::<u8>(), 0..256),
                                           bit in any::<prop::sample::Index>()) {
            let mut buf = Vec::new();
            encode(&mut buf, 7, &entry(b"k", b"", &value, 1));
            let i = bit.index(buf.len() * 8);
            buf[i / 8] ^= 1 << (i % 8);
            let d = decode(&Bytes::from(buf), MAX);
            prop_assert!(!matches!(d, Decoded::Record { .. }), "flip of bit {} accepted", i);
        }

        #[test]
        fn garbage_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
            let _ = decode(&Bytes::from(bytes), MAX);
        }
    }

    #[test]
    fn zeroed_tail_is_corrupt_not_a_record() {
        assert_eq!(
            decode(&Bytes::from(vec![0u8; 64]), MAX),
            Decoded::Corrupt(Corruption::LengthTooSmall(0))
        );
    }

    #[test]
    fn length_above_limit_is_refused_before_reading_the_body() {
        let mut b = vec![0u8; 8];
        b[..4].copy_from_slice(&(MAX + 1).to_le_bytes());
        assert_eq!(
            decode(&Bytes::from(b), MAX),
            Decoded::Corrupt(Corruption::LengthTooLarge(MAX + 1))
        );
    }

    #[test]
    fn field_lengths_past_the_body_are_corrupt() {
        let mut buf = Vec::new();
        encode(&mut buf, 0, &entry(b"key", b"", b"v", 0));
        // Claim a 4 GiB key and fix the CRC so that only the lengths are wrong.
        buf[FRAME_HEADER_LEN + 17..FRAME_HEADER_LEN + 21].copy_from_slice(&u32::MAX.to_le_bytes());
        let crc = crc32c::crc32c(&buf[FRAME_HEADER_LEN..]);
        buf[4..8].copy_from_slice(&crc.to_le_bytes());
        assert_eq!(
            decode(&Bytes::from(buf), MAX),
            Decoded::Corrupt(Corruption::FieldLengths)
        );
    }
}
