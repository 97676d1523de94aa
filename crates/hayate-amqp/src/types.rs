//! AMQP's primitive types: short strings, long strings, field values and tables, and the
//! [`Reader`] / writer functions every method and header is built from.
//!
//! Field value types are those RabbitMQ reads and writes (its "errata" to the 0-9-1 spec,
//! which every common client follows): `t` bool, `b` i8, `B` u8, `s` i16, `u` u16, `I` i32,
//! `i` u32, `l` i64, `f` f32, `d` f64, `D` decimal, `S` long string, `x` byte array, `A`
//! array, `T` timestamp, `F` table, `V` void. The spec's own `U` (i16) and `L` (u64) are
//! read too; `U` decodes as `s` does, `L` keeps its own variant.

use bytes::{BufMut, Bytes, BytesMut};

use crate::MAX_TABLE_DEPTH;
use crate::error::DecodeError;

/// A short string: at most 255 bytes (usually UTF-8: names, routing keys, tags).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default, PartialOrd, Ord)]
pub struct ShortStr(Bytes);

impl ShortStr {
    /// `s` as a short string; `None` when it is longer than 255 bytes.
    pub fn new(s: impl Into<Bytes>) -> Option<ShortStr> {
        let b = s.into();
        (b.len() <= 255).then_some(ShortStr(b))
    }

    /// A short string from a literal known to fit (longer ones are cut at 255 bytes, on a
    /// character boundary).
    pub fn lit(s: &str) -> ShortStr {
        let mut end = s.len().min(255);
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        ShortStr(Bytes::copy_from_slice(&s.as_bytes()[..end]))
    }

    /// The bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }

    /// The bytes, shared.
    pub fn bytes(&self) -> &Bytes {
        &self.0
    }

    /// The text, when it is UTF-8.
    pub fn as_str(&self) -> Option<&str> {
        std::str::from_utf8(&self.0).ok()
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// True when empty.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl std::fmt::Display for ShortStr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&String::from_utf8_lossy(&self.0))
    }
}

/// A decimal: `value` × 10^-`scale`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Decimal {
    /// Digits after the point.
    pub scale: u8,
    /// The unscaled value.
    pub value: u32,
}

/// A value in a field table or array.
#[derive(Debug, Clone, PartialEq)]
pub enum FieldValue {
    /// `t`
    Bool(bool),
    /// `b`
    I8(i8),
    /// `B`
    U8(u8),
    /// `s` (also read from the spec's `U`)
    I16(i16),
    /// `u`
    U16(u16),
    /// `I`
    I32(i32),
    /// `i`
    U32(u32),
    /// `l`
    I64(i64),
    /// `L` (the spec's unsigned 64-bit; RabbitMQ does not send it)
    U64(u64),
    /// `f`
    F32(f32),
    /// `d`
    F64(f64),
    /// `D`
    Decimal(Decimal),
    /// `S`: bytes, usually UTF-8 text.
    LongStr(Bytes),
    /// `x`
    Bytes(Bytes),
    /// `A`
    Array(Vec<FieldValue>),
    /// `T`: seconds since the Unix epoch.
    Timestamp(u64),
    /// `F`
    Table(FieldTable),
    /// `V`
    Void,
}

/// A field table: names (short strings) and values, in the order they came.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct FieldTable(pub Vec<(ShortStr, FieldValue)>);

impl FieldTable {
    /// The value of `name` (the first, if it repeats).
    pub fn get(&self, name: &str) -> Option<&FieldValue> {
        self.0
            .iter()
            .find(|(k, _)| k.as_bytes() == name.as_bytes())
            .map(|(_, v)| v)
    }

    /// Adds `name` = `value` (a name longer than 255 bytes is cut).
    pub fn insert(&mut self, name: &str, value: FieldValue) {
        self.0.push((ShortStr::lit(name), value));
    }

    /// True when it has no field.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Number of fields.
    pub fn len(&self) -> usize {
        self.0.len()
    }
}

impl FieldValue {
    /// The value as an integer, whatever its integer type.
    pub fn as_i64(&self) -> Option<i64> {
        Some(match *self {
            FieldValue::I8(v) => v.into(),
            FieldValue::U8(v) => v.into(),
            FieldValue::I16(v) => v.into(),
            FieldValue::U16(v) => v.into(),
            FieldValue::I32(v) => v.into(),
            FieldValue::U32(v) => v.into(),
            FieldValue::I64(v) => v,
            FieldValue::U64(v) => i64::try_from(v).ok()?,
            FieldValue::Timestamp(v) => i64::try_from(v).ok()?,
            _ => return None,
        })
    }

    /// The value as text (a long string that is UTF-8).
    pub fn as_str(&self) -> Option<&str> {
        match self {
            FieldValue::LongStr(b) => std::str::from_utf8(b).ok(),
            _ => None,
        }
    }

    /// The value as a boolean.
    pub fn as_bool(&self) -> Option<bool> {
        match self {
            FieldValue::Bool(b) => Some(*b),
            _ => None,
        }
    }
}

/// Reads the fields of one method or header, within its frame's payload.
#[derive(Debug)]
pub struct Reader<'a> {
    buf: &'a [u8],
    /// The payload as shared bytes, when there is one: strings are then sliced from it
    /// instead of copied.
    shared: Option<&'a Bytes>,
    pos: usize,
    /// The octet of packed bits being read, and how many of its bits are used.
    bits: Option<(u8, u8)>,
}

impl<'a> Reader<'a> {
    /// A reader over `buf`.
    pub fn new(buf: &'a [u8]) -> Reader<'a> {
        Reader {
            buf,
            shared: None,
            pos: 0,
            bits: None,
        }
    }

    /// A reader over shared bytes (strings are sliced, not copied).
    pub fn shared(buf: &'a Bytes) -> Reader<'a> {
        Reader {
            buf,
            shared: Some(buf),
            pos: 0,
            bits: None,
        }
    }

    /// Bytes not read yet.
    pub fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    /// Fails unless everything was read.
    pub fn finish(&self) -> Result<(), DecodeError> {
        match self.remaining() {
            0 => Ok(()),
            n => Err(DecodeError::TrailingBytes(n)),
        }
    }

    fn take(&mut self, n: usize, what: &'static str) -> Result<&'a [u8], DecodeError> {
        self.bits = None;
        if self.remaining() < n {
            return Err(DecodeError::Truncated(what));
        }
        let s = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    fn take_bytes(&mut self, n: usize, what: &'static str) -> Result<Bytes, DecodeError> {
        let start = self.pos;
        let s = self.take(n, what)?;
        Ok(match self.shared {
            Some(b) => b.slice(start..start + n),
            None => Bytes::copy_from_slice(s),
        })
    }

    /// An octet.
    pub fn u8(&mut self) -> Result<u8, DecodeError> {
        Ok(self.take(1, "octet")?[0])
    }

    /// A short (big-endian u16).
    pub fn u16(&mut self) -> Result<u16, DecodeError> {
        let s = self.take(2, "short")?;
        Ok(u16::from_be_bytes([s[0], s[1]]))
    }

    /// A long (big-endian u32).
    pub fn u32(&mut self) -> Result<u32, DecodeError> {
        let s = self.take(4, "long")?;
        Ok(u32::from_be_bytes([s[0], s[1], s[2], s[3]]))
    }

    /// A long long (big-endian u64).
    pub fn u64(&mut self) -> Result<u64, DecodeError> {
        let s = self.take(8, "long long")?;
        let mut a = [0u8; 8];
        a.copy_from_slice(s);
        Ok(u64::from_be_bytes(a))
    }

    /// One bit. Consecutive bits share octets, lowest bit first.
    pub fn bit(&mut self) -> Result<bool, DecodeError> {
        let (octet, used) = match self.bits {
            Some((o, n)) if n < 8 => (o, n),
            _ => {
                let o = self.u8()?;
                (o, 0)
            }
        };
        self.bits = Some((octet, used + 1));
        Ok(octet & (1 << used) != 0)
    }

    /// A short string.
    pub fn shortstr(&mut self) -> Result<ShortStr, DecodeError> {
        let n = self.u8()? as usize;
        Ok(ShortStr(self.take_bytes(n, "short string")?))
    }

    /// A long string.
    pub fn longstr(&mut self) -> Result<Bytes, DecodeError> {
        let n = self.u32()? as usize;
        self.take_bytes(n, "long string")
    }

    /// A field table.
    pub fn table(&mut self) -> Result<FieldTable, DecodeError> {
        self.table_at(0)
    }

    fn table_at(&mut self, depth: usize) -> Result<FieldTable, DecodeError> {
        if depth >= MAX_TABLE_DEPTH {
            return Err(DecodeError::TooDeep);
        }
        let n = self.u32()? as usize;
        if n > self.remaining() {
            return Err(DecodeError::Truncated("field table"));
        }
        let end = self.pos + n;
        let mut fields = Vec::new();
        while self.pos < end {
            let name = self.shortstr()?;
            let value = self.value(depth)?;
            if self.pos > end {
                return Err(DecodeError::Truncated("field table"));
            }
            fields.push((name, value));
        }
        Ok(FieldTable(fields))
    }

    fn value(&mut self, depth: usize) -> Result<FieldValue, DecodeError> {
        let tag = self.u8()?;
        Ok(match tag {
            b't' => FieldValue::Bool(self.u8()? != 0),
            b'b' => FieldValue::I8(self.u8()? as i8),
            b'B' => FieldValue::U8(self.u8()?),
            b's' | b'U' => FieldValue::I16(self.u16()? as i16),
            b'u' => FieldValue::U16(self.u16()?),
            b'I' => FieldValue::I32(self.u32()? as i32),
            b'i' => FieldValue::U32(self.u32()?),
            b'l' => FieldValue::I64(self.u64()? as i64),
            b'L' => FieldValue::U64(self.u64()?),
            b'f' => FieldValue::F32(f32::from_bits(self.u32()?)),
            b'd' => FieldValue::F64(f64::from_bits(self.u64()?)),
            b'D' => {
                let scale = self.u8()?;
                FieldValue::Decimal(Decimal {
                    scale,
                    value: self.u32()?,
                })
            }
            b'S' => FieldValue::LongStr(self.longstr()?),
            b'x' => FieldValue::Bytes(self.longstr()?),
            b'A' => {
                if depth + 1 >= MAX_TABLE_DEPTH {
                    return Err(DecodeError::TooDeep);
                }
                let n = self.u32()? as usize;
                if n > self.remaining() {
                    return Err(DecodeError::Truncated("field array"));
                }
                let end = self.pos + n;
                let mut items = Vec::new();
                while self.pos < end {
                    items.push(self.value(depth + 1)?);
                    if self.pos > end {
                        return Err(DecodeError::Truncated("field array"));
                    }
                }
                FieldValue::Array(items)
            }
            b'T' => FieldValue::Timestamp(self.u64()?),
            b'F' => FieldValue::Table(self.table_at(depth + 1)?),
            b'V' => FieldValue::Void,
            other => return Err(DecodeError::UnknownFieldType(other as char)),
        })
    }
}

/// Writes fields; consecutive bits are packed into octets as the spec requires.
#[derive(Debug)]
pub struct Writer<'a> {
    out: &'a mut BytesMut,
    /// Where the octet of packed bits being written is, and how many bits it holds.
    bits: Option<(usize, u8)>,
}

impl<'a> Writer<'a> {
    /// A writer appending to `out`.
    pub fn new(out: &'a mut BytesMut) -> Writer<'a> {
        Writer { out, bits: None }
    }

    /// An octet.
    pub fn u8(&mut self, v: u8) {
        self.bits = None;
        self.out.put_u8(v);
    }

    /// A short.
    pub fn u16(&mut self, v: u16) {
        self.bits = None;
        self.out.put_u16(v);
    }

    /// A long.
    pub fn u32(&mut self, v: u32) {
        self.bits = None;
        self.out.put_u32(v);
    }

    /// A long long.
    pub fn u64(&mut self, v: u64) {
        self.bits = None;
        self.out.put_u64(v);
    }

    /// One bit.
    pub fn bit(&mut self, v: bool) {
        match self.bits {
            Some((at, n)) if n < 8 => {
                if v {
                    self.out[at] |= 1 << n;
                }
                self.bits = Some((at, n + 1));
            }
            _ => {
                let at = self.out.len();
                self.out.put_u8(u8::from(v));
                self.bits = Some((at, 1));
            }
        }
    }

    /// A short string.
    pub fn shortstr(&mut self, s: &ShortStr) {
        self.u8(s.len() as u8);
        self.out.put_slice(s.as_bytes());
    }

    /// A long string.
    pub fn longstr(&mut self, s: &[u8]) {
        self.u32(s.len() as u32);
        self.out.put_slice(s);
    }

    /// A field table.
    pub fn table(&mut self, t: &FieldTable) {
        self.bits = None;
        let at = self.out.len();
        self.out.put_u32(0);
        for (k, v) in &t.0 {
            self.shortstr(k);
            self.value(v);
        }
        let n = (self.out.len() - at - 4) as u32;
        self.out[at..at + 4].copy_from_slice(&n.to_be_bytes());
    }

    fn value(&mut self, v: &FieldValue) {
        match v {
            FieldValue::Bool(b) => {
                self.u8(b't');
                self.u8(u8::from(*b));
            }
            FieldValue::I8(x) => {
                self.u8(b'b');
                self.u8(*x as u8);
            }
            FieldValue::U8(x) => {
                self.u8(b'B');
                self.u8(*x);
            }
            FieldValue::I16(x) => {
                self.u8(b's');
                self.u16(*x as u16);
            }
            FieldValue::U16(x) => {
                self.u8(b'u');
                self.u16(*x);
            }
            FieldValue::I32(x) => {
                self.u8(b'I');
                self.u32(*x as u32);
            }
            FieldValue::U32(x) => {
                self.u8(b'i');
                self.u32(*x);
            }
            FieldValue::I64(x) => {
                self.u8(b'l');
                self.u64(*x as u64);
            }
            FieldValue::U64(x) => {
                self.u8(b'L');
                self.u64(*x);
            }
            FieldValue::F32(x) => {
                self.u8(b'f');
                self.u32(x.to_bits());
            }
            FieldValue::F64(x) => {
                self.u8(b'd');
                self.u64(x.to_bits());
            }
            FieldValue::Decimal(d) => {
                self.u8(b'D');
                self.u8(d.scale);
                self.u32(d.value);
            }
            FieldValue::LongStr(b) => {
                self.u8(b'S');
                self.longstr(b);
            }
            FieldValue::Bytes(b) => {
                self.u8(b'x');
                self.longstr(b);
            }
            FieldValue::Array(items) => {
                self.u8(b'A');
                let at = self.out.len();
                self.out.put_u32(0);
                for i in items {
                    self.value(i);
                }
                let n = (self.out.len() - at - 4) as u32;
                self.out[at..at + 4].copy_from_slice(&n.to_be_bytes());
            }
            FieldValue::Timestamp(t) => {
                self.u8(b'T');
                self.u64(*t);
            }
            FieldValue::Table(t) => {
                self.u8(b'F');
                self.table(t);
            }
            FieldValue::Void => self.u8(b'V'),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bits_pack_lowest_first_and_reset_on_other_fields() {
        let mut out = BytesMut::new();
        let mut w = Writer::new(&mut out);
        for b in [true, false, true, true, false, false, false, false, true] {
            w.bit(b);
        }
        w.u8(7);
        w.bit(true);
        assert_eq!(&out[..], &[0b0000_1101, 0b1, 7, 1]);
        let mut r = Reader::new(&out);
        let bits: Vec<bool> = (0..9).map(|_| r.bit().unwrap_or_default()).collect();
        assert_eq!(
            bits,
            [true, false, true, true, false, false, false, false, true]
        );
        assert_eq!(r.u8(), Ok(7));
        assert_eq!(r.bit(), Ok(true));
        assert!(r.finish().is_ok());
    }

    #[test]
    fn lengths_are_checked_before_use() {
        // A table claiming 4 GiB in a 6-byte buffer.
        let mut r = Reader::new(&[0xff, 0xff, 0xff, 0xff, 1, 2]);
        assert_eq!(r.table(), Err(DecodeError::Truncated("field table")));
        let mut r = Reader::new(&[0, 0, 0, 3, 1, b'a', b'S']);
        assert!(r.table().is_err());
        let mut r = Reader::new(&[10, b'a']);
        assert_eq!(r.shortstr(), Err(DecodeError::Truncated("short string")));
        // A value running past its table's end.
        let mut r = Reader::new(&[0, 0, 0, 3, 1, b'a', b'I', 0, 0, 0, 1]);
        assert_eq!(r.table(), Err(DecodeError::Truncated("field table")));
    }

    #[test]
    fn deep_nesting_is_refused() {
        let mut t = FieldTable::default();
        for _ in 0..MAX_TABLE_DEPTH + 1 {
            let mut outer = FieldTable::default();
            outer.insert("t", FieldValue::Table(t));
            t = outer;
        }
        let mut out = BytesMut::new();
        Writer::new(&mut out).table(&t);
        assert_eq!(Reader::new(&out).table(), Err(DecodeError::TooDeep));
    }
}
