//! Messages to AMQP frames and back: basic.deliver / basic.get-ok with their content header
//! and body frames, the properties of a message of another protocol, and the encoder of a
//! connection's own broker session (direct reply-to deliveries).
//!
//! Properties and Hayate messages (docs/amqp.md, "Properties"): `reply-to` ↔ the reply-to
//! key, `correlation-id` ↔ the correlation id, `content-type` ↔ the `content-type` header,
//! `expiration` ↔ the message's expiry, and the rest as headers named as RabbitMQ's STOMP
//! plugin names them (`amqp-message-id`, `persistent`, `priority`, `timestamp`, `type`,
//! `user-id`, `app-id`, `content-encoding`); the headers table's entries are headers of
//! their own (values other than strings as their text), and the table itself travels whole
//! in [`TABLE_HEADER`] so that AMQP consumers get it back exactly.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use bytes::{BufMut, Bytes, BytesMut};
use hayate_amqp::frame::{FRAME_END, FrameType};
use hayate_amqp::{BasicProperties, ContentHeader, FieldTable, FieldValue, Method, ShortStr};
use hayate_broker::{Batch, Encoder, OutBuf};
use hayate_core::{Key, Message};

use super::FastMap;
use super::names;

/// The header that carries an AMQP publish's headers table exactly, types and nesting kept,
/// for AMQP consumers: the byte 0xFF, then the table as encoded on the wire. The 0xFF makes
/// the value invalid UTF-8, so MQTT and STOMP deliveries leave it out (they carry the
/// table's scalar entries as text headers of their own instead); native clients see it.
pub(crate) const TABLE_HEADER: &str = "amqp-table";
const TABLE_MARK: u8 = 0xFF;

/// Message headers that carry AMQP properties (and are not application headers).
const PROP_HEADERS: [&str; 10] = [
    TABLE_HEADER,
    "content-type",
    "content-encoding",
    "amqp-message-id",
    "persistent",
    "priority",
    "timestamp",
    "type",
    "user-id",
    "app-id",
];

/// One delivery to write.
#[derive(Debug)]
pub(crate) struct Delivery<'a> {
    pub(crate) channel: u16,
    /// basic.deliver's consumer tag; `None`: a basic.get-ok.
    pub(crate) consumer_tag: Option<&'a ShortStr>,
    pub(crate) delivery_tag: u64,
    pub(crate) redelivered: bool,
    pub(crate) exchange: &'a ShortStr,
    /// At most 255 bytes are written (a short string).
    pub(crate) routing_key: &'a [u8],
    /// basic.get-ok's message count.
    pub(crate) message_count: Option<u32>,
    pub(crate) msg: &'a Message,
    /// The consumer's vhost's key prefix (reply-to queue names are shown without it).
    pub(crate) vhost_prefix: &'a str,
}

/// Appends one frame whose payload `f` writes (type, channel, size patched after).
fn frame(out: &mut BytesMut, ty: u8, channel: u16, f: impl FnOnce(&mut BytesMut)) {
    out.put_u8(ty);
    out.put_u16(channel);
    let at = out.len();
    out.put_u32(0);
    f(out);
    let n = (out.len() - at - 4) as u32;
    out[at..at + 4].copy_from_slice(&n.to_be_bytes());
    out.put_u8(FRAME_END);
}

/// The method, content header and body frames of a delivery (bodies split to fit
/// `frame_max`, which counts the 8 bytes around each frame's payload).
pub(crate) fn encode_delivery(d: &Delivery<'_>, frame_max: usize, out: &mut OutBuf) {
    match d.consumer_tag {
        Some(tag) => frame(out.tail(), 1, d.channel, |b| {
            Method::encode_deliver(
                tag,
                d.delivery_tag,
                d.redelivered,
                d.exchange,
                d.routing_key,
                b,
            )
        }),
        None => frame(out.tail(), 1, d.channel, |b| {
            Method::BasicGetOk {
                delivery_tag: d.delivery_tag,
                redelivered: d.redelivered,
                exchange: d.exchange.clone(),
                routing_key: ShortStr::new(Bytes::copy_from_slice(
                    &d.routing_key[..d.routing_key.len().min(255)],
                ))
                .unwrap_or_default(),
                message_count: d.message_count.unwrap_or(0),
            }
            .encode(b)
        }),
    }
    encode_content(d.channel, d.msg, d.vhost_prefix, frame_max, out);
}

/// A message's content header and body frames. A body frame's payload of 16 KiB or more
/// is queued by reference to the message's payload, not copied
/// ([`OutBuf::put_payload`]).
pub(crate) fn encode_content(
    channel: u16,
    msg: &Message,
    vhost_prefix: &str,
    frame_max: usize,
    out: &mut OutBuf,
) {
    let mut header = ContentHeader {
        body_size: msg.payload.len() as u64,
        properties: properties_of(msg, vhost_prefix),
    };
    // A header must fit one frame: a message from another protocol with more headers than
    // that loses its headers table, then its other properties, rather than making a frame
    // the client must refuse.
    // (An upper bound first: the fixed part is at most 14 short strings and a few numbers.)
    let bound = 14 * 256
        + 64
        + msg
            .headers
            .iter()
            .flatten()
            .map(|(k, v)| k.len() + v.len() + 6)
            .sum::<usize>();
    let mut probe = BytesMut::new();
    if bound + 8 > frame_max {
        header.encode(&mut probe);
    }
    if probe.len() + 8 > frame_max {
        header.properties.headers = None;
        probe.clear();
        header.encode(&mut probe);
        if probe.len() + 8 > frame_max {
            header.properties = BasicProperties::default();
        }
    }
    frame(out.tail(), 2, channel, |b| header.encode(b));
    let chunk = frame_max.saturating_sub(8).max(1);
    let len = msg.payload.len();
    let mut at = 0;
    while at < len {
        let end = (at + chunk).min(len);
        let t = out.tail();
        t.put_u8(FrameType::Body as u8);
        t.put_u16(channel);
        t.put_u32((end - at) as u32);
        out.put_payload(&msg.payload.slice(at..end));
        out.tail().put_u8(FRAME_END);
        at = end;
    }
}

/// The AMQP properties of a message (from any protocol), for a consumer of the vhost whose
/// keys start with `vhost_prefix`.
pub(crate) fn properties_of(msg: &Message, vhost_prefix: &str) -> BasicProperties {
    let mut p = BasicProperties {
        correlation_id: msg
            .correlation_id
            .as_ref()
            .and_then(|c| ShortStr::new(c.clone())),
        reply_to: msg
            .reply_to
            .as_ref()
            .map(|k| reply_to_text(k, vhost_prefix)),
        ..BasicProperties::default()
    };
    if let Some(at) = msg.attrs.expires {
        let ms = at.saturating_duration_since(Instant::now()).as_millis();
        p.expiration = Some(ShortStr::lit(&ms.to_string()));
    }
    // A message published over AMQP brings its headers table whole: the text headers
    // beside it are copies of its entries for other protocols.
    let exact = msg
        .headers
        .iter()
        .flatten()
        .find(|(k, v)| k == TABLE_HEADER && v.first() == Some(&TABLE_MARK))
        .and_then(|(_, v)| hayate_amqp::types::Reader::new(&v[1..]).table().ok());
    // The exact table's names, looked up once per header (a linear search each would be
    // quadratic in a hostile publisher's thousands of headers, under the queue's lock).
    let copied: Option<std::collections::HashSet<&[u8]>> = exact
        .as_ref()
        .map(|t| t.0.iter().map(|(k, _)| k.as_bytes()).collect());
    let mut table = FieldTable::default();
    for (name, value) in msg.headers.iter().flatten() {
        let text = || std::str::from_utf8(value).ok().map(ShortStr::lit);
        match name.as_str() {
            TABLE_HEADER => {}
            "content-type" => p.content_type = text(),
            "content-encoding" => p.content_encoding = text(),
            "amqp-message-id" => p.message_id = text(),
            "persistent" => p.delivery_mode = Some(if &value[..] == b"true" { 2 } else { 1 }),
            "priority" => p.priority = std::str::from_utf8(value).ok().and_then(|v| v.parse().ok()),
            "timestamp" => {
                p.timestamp = std::str::from_utf8(value).ok().and_then(|v| v.parse().ok());
            }
            "type" => p.kind = text(),
            "user-id" => p.user_id = text(),
            "app-id" => p.app_id = text(),
            // A quorum queue's count of returns: a long, as RabbitMQ sends it (and newer
            // than any such entry of the publisher's table).
            "x-delivery-count" => {
                if let Some(n) = std::str::from_utf8(value).ok().and_then(|v| v.parse().ok()) {
                    table.insert(name, FieldValue::I64(n));
                }
            }
            // Copies of the exact table's entries; headers added since (dead-lettering's)
            // are not in it.
            _ if copied.as_ref().is_some_and(|c| c.contains(name.as_bytes())) => {}
            _ => table.insert(name, FieldValue::LongStr(value.clone())),
        }
    }
    drop(copied);
    if let Some(mut t) = exact {
        for (k, v) in table.0 {
            match t.0.iter_mut().find(|(n, _)| *n == k) {
                Some(e) => e.1 = v,
                None => t.0.push((k, v)),
            }
        }
        p.headers = Some(t);
    } else if !table.is_empty() {
        p.headers = Some(table);
    }
    p
}

/// How a reply-to key is shown to an AMQP client: as itself (the default exchange routes
/// that routing key back to the key; an inbox, direct reply-to's included, in any vhost),
/// a queue of the consumer's vhost without the vhost's prefix.
fn reply_to_text(k: &Key, vhost_prefix: &str) -> ShortStr {
    // A queue of the consumer's vhost is named without the vhost's prefix: a reply to that
    // name, published in the same vhost, comes back to the same key.
    let s = k.as_str();
    let s = if vhost_prefix.is_empty() {
        s
    } else {
        s.strip_prefix(vhost_prefix).unwrap_or(s)
    };
    ShortStr::new(Bytes::copy_from_slice(s.as_bytes())).unwrap_or_else(|| ShortStr::lit(""))
}

/// A field value as header text.
fn value_text(v: &FieldValue) -> Option<Bytes> {
    Some(match v {
        FieldValue::LongStr(b) | FieldValue::Bytes(b) => b.clone(),
        FieldValue::Bool(b) => Bytes::from(b.to_string()),
        FieldValue::F32(f) => Bytes::from(f.to_string()),
        FieldValue::F64(f) => Bytes::from(f.to_string()),
        FieldValue::Timestamp(t) => Bytes::from(t.to_string()),
        v => Bytes::from(v.as_i64()?.to_string()),
    })
}

/// A Hayate message from an AMQP publish: the key it goes to, its properties and body.
/// `reply_to_key` is the reply-to property as a key (the caller maps direct reply-to).
pub(crate) fn message_of(
    key: Key,
    props: &BasicProperties,
    reply_to: Option<Key>,
    body: Bytes,
) -> Message {
    let mut m = Message::new(key, body);
    m.reply_to = reply_to;
    m.correlation_id = props.correlation_id.as_ref().map(|c| c.bytes().clone());
    let mut h: Vec<(String, Bytes)> = Vec::new();
    let mut put = |name: &str, v: Option<Bytes>| {
        if let Some(v) = v {
            h.push((name.to_string(), v));
        }
    };
    let s = |v: &Option<ShortStr>| v.as_ref().map(|x| x.bytes().clone());
    put("content-type", s(&props.content_type));
    put("content-encoding", s(&props.content_encoding));
    put("amqp-message-id", s(&props.message_id));
    put(
        "persistent",
        props
            .delivery_mode
            .map(|d| Bytes::from_static(if d == 2 { b"true" } else { b"false" })),
    );
    put(
        "priority",
        props.priority.map(|p| Bytes::from(p.to_string())),
    );
    put(
        "timestamp",
        props.timestamp.map(|t| Bytes::from(t.to_string())),
    );
    put("type", s(&props.kind));
    put("user-id", s(&props.user_id));
    put("app-id", s(&props.app_id));
    if let Some(t) = props.headers.as_ref().filter(|t| !t.is_empty()) {
        let mut raw = BytesMut::with_capacity(64);
        raw.put_u8(TABLE_MARK);
        hayate_amqp::types::Writer::new(&mut raw).table(t);
        h.push((TABLE_HEADER.to_string(), raw.freeze()));
        for (k, v) in &t.0 {
            let (Some(name), Some(v)) = (k.as_str(), value_text(v)) else {
                continue;
            };
            if !PROP_HEADERS.contains(&name) {
                h.push((name.to_string(), v));
            }
        }
    }
    if !h.is_empty() {
        m.headers = Some(h);
    }
    if let Some(ms) = props
        .expiration
        .as_ref()
        .and_then(|e| e.as_str())
        .and_then(|e| e.parse::<u64>().ok())
    {
        m.attrs.expires = Some(Instant::now() + Duration::from_millis(ms));
    }
    m
}

/// A consumer of the connection's own session (direct reply-to): its channel, tag and the
/// channel's delivery-tag counter.
#[derive(Debug, Clone)]
pub(crate) struct OwnConsumer {
    pub(crate) channel: u16,
    pub(crate) tag: ShortStr,
    pub(crate) next_tag: Arc<AtomicU64>,
}

/// The encoder of an AMQP connection's broker session: what that session's subscriptions
/// receive (direct reply-to) as basic.deliver frames, never acknowledged.
pub(crate) struct AmqpEncoder {
    /// Subscription id → consumer; shared with the connection, which adds and removes.
    pub(crate) consumers: Arc<std::sync::Mutex<FastMap<u32, OwnConsumer>>>,
    pub(crate) frame_max: Arc<AtomicUsize>,
    /// The routing key being written (`amq.rabbitmq.reply-to.` and the key), its buffer
    /// kept from one delivery to the next.
    pub(crate) routing_key: Vec<u8>,
}

impl Encoder for AmqpEncoder {
    fn encode(&mut self, sid: u32, batch: Batch<'_>, _origin: u64, out: &mut OutBuf) {
        let Some(c) = hayate_core::sync::lock(&self.consumers).get(&sid).cloned() else {
            return;
        };
        let frame_max = self.frame_max.load(Ordering::Relaxed);
        let exchange = ShortStr::lit("");
        for i in 0..batch.len() {
            let msg = batch.message(i);
            let rk = &mut self.routing_key;
            rk.clear();
            rk.extend_from_slice(names::REPLY_TO_PREFIX.as_bytes());
            rk.extend_from_slice(msg.key.as_str().as_bytes());
            let d = Delivery {
                channel: c.channel,
                consumer_tag: Some(&c.tag),
                delivery_tag: c.next_tag.fetch_add(1, Ordering::AcqRel) + 1,
                redelivered: false,
                exchange: &exchange,
                routing_key: rk,
                message_count: None,
                msg: &msg,
                vhost_prefix: "",
            };
            encode_delivery(&d, frame_max, out);
        }
    }

    fn encode_lost(&mut self, _sid: u32, _count: u64, _out: &mut OutBuf) {
        // AMQP has no way to tell a consumer; the broker counts drops.
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table() -> FieldTable {
        let mut inner = FieldTable::default();
        inner.insert("k", FieldValue::I32(2));
        let mut t = FieldTable::default();
        t.insert("flag", FieldValue::Bool(false));
        t.insert("n", FieldValue::I64(-7));
        t.insert("s", FieldValue::LongStr(Bytes::from_static(b"text")));
        t.insert("void", FieldValue::Void);
        t.insert(
            "arr",
            FieldValue::Array(vec![FieldValue::U8(1), FieldValue::Void]),
        );
        t.insert("tbl", FieldValue::Table(inner));
        t
    }

    #[test]
    fn an_amqp_headers_table_comes_back_exactly() {
        let props = BasicProperties {
            headers: Some(table()),
            content_type: Some(ShortStr::lit("text/plain")),
            ..BasicProperties::default()
        };
        let mut msg = message_of(Key::new("q").unwrap(), &props, None, Bytes::new());
        // Other protocols get the scalar entries as text, and the table itself as a value
        // that is not UTF-8 (so MQTT and STOMP leave it out).
        let h = msg.headers.clone().unwrap();
        let text = |n: &str| h.iter().find(|(k, _)| k == n).map(|(_, v)| v.clone());
        assert_eq!(text("flag").as_deref(), Some(&b"false"[..]));
        assert_eq!(text("n").as_deref(), Some(&b"-7"[..]));
        assert_eq!(text("arr"), None);
        assert!(std::str::from_utf8(&text(TABLE_HEADER).unwrap()).is_err());

        let back = properties_of(&msg, "");
        assert_eq!(back.headers, Some(table()));
        assert_eq!(back.content_type, Some(ShortStr::lit("text/plain")));

        // A header added on the way (dead-lettering) follows the table's entries.
        msg.headers.as_mut().unwrap().push((
            "x-first-death-reason".into(),
            Bytes::from_static(b"expired"),
        ));
        let mut want = table();
        want.insert(
            "x-first-death-reason",
            FieldValue::LongStr(Bytes::from_static(b"expired")),
        );
        assert_eq!(properties_of(&msg, "").headers, Some(want));
    }

    #[test]
    fn a_table_header_that_does_not_decode_is_ignored() {
        let mut msg = Message::new(Key::new("q").unwrap(), Bytes::new());
        msg.headers = Some(vec![
            (
                TABLE_HEADER.into(),
                Bytes::from_static(b"\xff\x00\x00\x00\x09ab"),
            ),
            ("a".into(), Bytes::from_static(b"b")),
        ]);
        let mut want = FieldTable::default();
        want.insert("a", FieldValue::LongStr(Bytes::from_static(b"b")));
        assert_eq!(properties_of(&msg, "").headers, Some(want));
    }
}
