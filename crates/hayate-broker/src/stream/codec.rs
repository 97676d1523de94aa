//! How a message is kept in a stream record: the record's key is the message key, its value
//! the payload, and its headers field carries the rest (empty for a plain message).
//!
//! ```text
//! headers field (all big-endian, as the native protocol)
//! u8   version, 1
//! u8   flags: 0x01 reply-to, 0x02 correlation id, 0x04 headers, 0x08 expiry,
//!             0x10 guarantee, 0x20 retain, 0x40 UTF-8 payload
//! [u16 len, reply-to key]            if 0x01
//! [u16 len, correlation id]          if 0x02
//! [u16 n, n x (u16 len, name, u32 len, value)]   if 0x04
//! [i64 expiry, ms since the Unix epoch]          if 0x08
//! [u8 guarantee 0..2]                             if 0x10
//! ```

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::{Buf, BufMut, Bytes};
use hayate_core::{Attrs, Guarantee, Key, Message};
use hayate_log::Record;

const VERSION: u8 = 1;
const REPLY_TO: u8 = 0x01;
const CORRELATION: u8 = 0x02;
const HEADERS: u8 = 0x04;
const EXPIRES: u8 = 0x08;
const GUARANTEE: u8 = 0x10;
const RETAIN: u8 = 0x20;
const UTF8: u8 = 0x40;

/// Milliseconds since the Unix epoch now.
pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// `at` as milliseconds since the Unix epoch (by the clocks now).
pub fn instant_to_ms(at: Instant) -> i64 {
    let now = Instant::now();
    let base = now_ms();
    if at >= now {
        base.saturating_add(i64::try_from((at - now).as_millis()).unwrap_or(i64::MAX))
    } else {
        base.saturating_sub(i64::try_from((now - at).as_millis()).unwrap_or(i64::MAX))
    }
}

/// Milliseconds since the Unix epoch as an instant (by the clocks now).
pub fn ms_to_instant(ms: i64) -> Instant {
    let now = Instant::now();
    let base = now_ms();
    let d = Duration::from_millis(ms.abs_diff(base));
    if ms >= base {
        now + d
    } else {
        now.checked_sub(d).unwrap_or(now)
    }
}

/// Encodes the metadata of `msg` (empty for a plain message). `msg`'s options must fit their
/// fields (as the native protocol's `check_options` ensures; longer ones are cut).
pub fn encode_meta(msg: &Message, out: &mut Vec<u8>) {
    out.clear();
    if msg.is_plain() {
        return;
    }
    let a = &msg.attrs;
    let mut flags = 0u8;
    flags |= if msg.reply_to.is_some() { REPLY_TO } else { 0 };
    flags |= if msg.correlation_id.is_some() {
        CORRELATION
    } else {
        0
    };
    flags |= if msg.headers.is_some() { HEADERS } else { 0 };
    flags |= if a.expires.is_some() { EXPIRES } else { 0 };
    flags |= if a.guarantee.is_some() { GUARANTEE } else { 0 };
    flags |= if a.retain { RETAIN } else { 0 };
    flags |= if a.utf8 { UTF8 } else { 0 };
    out.put_u8(VERSION);
    out.put_u8(flags);
    let put16 = |out: &mut Vec<u8>, b: &[u8]| {
        let n = b.len().min(u16::MAX as usize);
        out.put_u16(n as u16);
        out.put_slice(&b[..n]);
    };
    if let Some(r) = &msg.reply_to {
        put16(out, r.as_bytes());
    }
    if let Some(c) = &msg.correlation_id {
        put16(out, c);
    }
    if let Some(h) = &msg.headers {
        let h = &h[..h.len().min(u16::MAX as usize)];
        out.put_u16(h.len() as u16);
        for (k, v) in h {
            put16(out, k.as_bytes());
            let n = v.len().min(u32::MAX as usize);
            out.put_u32(n as u32);
            out.put_slice(&v[..n]);
        }
    }
    if let Some(e) = a.expires {
        out.put_i64(instant_to_ms(e));
    }
    if let Some(g) = a.guarantee {
        out.put_u8(g as u8);
    }
}

/// Why stored bytes are not a message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("stored message at offset {offset}: {what}")]
pub struct DecodeError {
    /// The record's offset.
    pub offset: u64,
    /// What is wrong.
    pub what: &'static str,
}

/// Rebuilds the message kept in `r`.
pub fn decode(r: &Record) -> Result<Message, DecodeError> {
    let err = |what| DecodeError {
        offset: r.offset,
        what,
    };
    let key = std::str::from_utf8(&r.key)
        .ok()
        .and_then(|k| Key::new(k).ok())
        .ok_or(err("bad key"))?;
    let mut msg = Message::new(key, r.value.clone());
    if r.headers.is_empty() {
        return Ok(msg);
    }
    let mut b = r.headers.clone();
    let need = |b: &Bytes, n: usize| {
        if b.remaining() >= n {
            Ok(())
        } else {
            Err(err("truncated metadata"))
        }
    };
    need(&b, 2)?;
    if b.get_u8() != VERSION {
        return Err(err("unknown metadata version"));
    }
    let flags = b.get_u8();
    let take16 = |b: &mut Bytes| -> Result<Bytes, DecodeError> {
        need(b, 2)?;
        let n = b.get_u16() as usize;
        need(b, n)?;
        Ok(b.split_to(n))
    };
    if flags & REPLY_TO != 0 {
        let k = take16(&mut b)?;
        msg.reply_to = Some(
            std::str::from_utf8(&k)
                .ok()
                .and_then(|k| Key::new(k).ok())
                .ok_or(err("bad reply-to"))?,
        );
    }
    if flags & CORRELATION != 0 {
        msg.correlation_id = Some(take16(&mut b)?);
    }
    if flags & HEADERS != 0 {
        need(&b, 2)?;
        let n = b.get_u16();
        let mut h = Vec::with_capacity(usize::from(n).min(64));
        for _ in 0..n {
            let name =
                String::from_utf8(take16(&mut b)?.to_vec()).map_err(|_| err("bad header name"))?;
            need(&b, 4)?;
            let len = b.get_u32() as usize;
            need(&b, len)?;
            h.push((name, b.split_to(len)));
        }
        msg.headers = Some(h);
    }
    let mut attrs = Attrs {
        retain: flags & RETAIN != 0,
        utf8: flags & UTF8 != 0,
        ..Attrs::default()
    };
    if flags & EXPIRES != 0 {
        need(&b, 8)?;
        attrs.expires = Some(ms_to_instant(b.get_i64()));
    }
    if flags & GUARANTEE != 0 {
        need(&b, 1)?;
        attrs.guarantee = Some(match b.get_u8() {
            0 => Guarantee::AtMostOnce,
            1 => Guarantee::AtLeastOnce,
            2 => Guarantee::ExactlyOnce,
            _ => return Err(err("bad guarantee")),
        });
    }
    if b.has_remaining() {
        return Err(err("trailing metadata"));
    }
    msg.attrs = attrs;
    Ok(msg)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn record(key: &str, meta: Vec<u8>, payload: &[u8]) -> Record {
        Record {
            offset: 3,
            timestamp: 0,
            key: Bytes::copy_from_slice(key.as_bytes()),
            headers: Bytes::from(meta),
            value: Bytes::copy_from_slice(payload),
        }
    }

    #[test]
    fn a_message_with_everything_round_trips() {
        let mut m = Message::new(Key::new("a/b").unwrap(), &b"payload"[..]);
        m.reply_to = Some(Key::new("_inbox/1/2").unwrap());
        m.correlation_id = Some(Bytes::from_static(b"c1"));
        m.headers = Some(vec![
            ("content-type".into(), Bytes::from_static(b"text/plain")),
            ("x".into(), Bytes::new()),
        ]);
        m.attrs.guarantee = Some(Guarantee::AtLeastOnce);
        m.attrs.retain = true;
        m.attrs.utf8 = true;
        m.attrs.expires = Some(Instant::now() + Duration::from_secs(60));
        let mut meta = Vec::new();
        encode_meta(&m, &mut meta);
        let back = decode(&record("a/b", meta, b"payload")).unwrap();
        let (e1, e2) = (m.attrs.expires.unwrap(), back.attrs.expires.unwrap());
        assert!(e1.max(e2) - e1.min(e2) < Duration::from_millis(5));
        let mut back = back;
        back.attrs.expires = m.attrs.expires;
        assert_eq!(back, m);
        let mut plain = Vec::new();
        encode_meta(&Message::new(Key::new("k").unwrap(), &b"p"[..]), &mut plain);
        assert!(plain.is_empty());
    }

    proptest! {
        #[test]
        fn garbage_metadata_is_an_error_not_a_panic(meta in proptest::collection::vec(any::<u8>(), 0..64)) {
            let _ = decode(&record("k", meta, b""));
        }
    }
}
