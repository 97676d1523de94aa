//! Every translation between MQTT and Hayate, in one place: the rest of the front-end speaks
//! MQTT packets ([`hayate_mqtt`], which knows nothing of Hayate) on one side and Hayate
//! keys, key expressions and [`Message`]s on the other, and crosses over only here.
//!
//! - Topic names ↔ [`Key`]s and topic filters → [`KeyExpr`]s: [`topic_to_key`],
//!   [`topic_bytes_to_key`] (zero-copy for plain topics), [`key_to_topic`],
//!   [`filter_to_expr`].
//! - QoS: a PUBLISH's [`QoS`] ↔ the message's [`Guarantee`] ([`guarantee`], [`qos_of`]),
//!   and a subscription's granted QoS → the broker's [`Qos`](hayate_core::Qos)
//!   ([`broker_qos`]).
//! - Message metadata: a PUBLISH or a will becomes a [`Message`] ([`publish_message`],
//!   [`will_message`]), and a delivered message's metadata becomes the 5.0 PUBLISH
//!   properties ([`delivery_properties`]).
//!
//! # Topics
//!
//! Hayate keys are `/`-separated, non-empty segments; `*` and `**` segments are wildcards in
//! key expressions. MQTT topic levels may be empty (`/a`, `a//b`) and may hold `*`
//! characters. The mapping keeps every MQTT topic addressable and is reversible:
//!
//! | MQTT level | Hayate segment |
//! |---|---|
//! | empty (`/a` has an empty first level) | `%` |
//! | a `%` character | `%25` |
//! | a `*` character | `%2A` |
//! | anything else | as is |
//!
//! So `sensors/room1/temp` is the key `sensors/room1/temp` (the common case costs nothing),
//! `/devices/x` is `%/devices/x`, and `a/*/b` is `a/%2A/b`. Filters: `+` is `*` and `#` is
//! `**` (which, as in MQTT, also matches the parent: `a/#` matches `a`); other levels are
//! mapped as above. Back from Hayate to MQTT, `%` alone is an empty level and `%25`/`%2A`
//! decode; any other `%` sequence and any `*` inside a segment (native keys such as
//! `a/b*c`) are kept as they are; a `+` or `#` in a key (legal natively, never in an MQTT
//! topic name) goes out as `%2B` / `%23`, so an MQTT subscriber never receives a topic name
//! with a wildcard character in it.
//!
//! # Metadata
//!
//! | MQTT 5.0 | Hayate message |
//! |---|---|
//! | QoS of the PUBLISH or will | `attrs.guarantee` |
//! | RETAIN | `attrs.retain` |
//! | Payload Format Indicator 1 | `attrs.utf8` |
//! | Message Expiry Interval | `attrs.expires` (the time left, on delivery) |
//! | Response Topic | `reply_to` (a key, mapped as a topic) |
//! | Correlation Data | `correlation_id` |
//! | Content Type | the header [`CONTENT_TYPE`] |
//! | User Property | a header (in order; values that are not UTF-8 are not delivered) |

use std::borrow::Cow;
use std::time::{Duration, Instant};

use bytes::Bytes;
use hayate_core::{Guarantee, Key, KeyError, KeyExpr, Message};
use hayate_mqtt::{ByteStr, PayloadFormat, Publish, PublishProperties, QoS, Will};

/// The header that carries an MQTT 5.0 content type (as STOMP's `content-type`).
pub const CONTENT_TYPE: &str = "content-type";

/// Why a topic or filter has no Hayate equivalent.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MapError {
    /// The key would be empty or too long, or the filter is not a valid MQTT filter.
    #[error("topic {0:?} has no Hayate key: {1}")]
    Topic(String, String),
}

fn level_to_segment(level: &str) -> Cow<'_, str> {
    if level.is_empty() {
        return Cow::Borrowed("%");
    }
    if !level.contains(['%', '*']) {
        return Cow::Borrowed(level);
    }
    let mut s = String::with_capacity(level.len() + 4);
    for c in level.chars() {
        match c {
            '%' => s.push_str("%25"),
            '*' => s.push_str("%2A"),
            c => s.push(c),
        }
    }
    Cow::Owned(s)
}

fn segment_to_level(seg: &str) -> Cow<'_, str> {
    if seg == "%" {
        return Cow::Borrowed("");
    }
    if !seg.contains(['%', '+', '#']) {
        return Cow::Borrowed(seg);
    }
    let mut out = String::with_capacity(seg.len() + 4);
    let mut rest = seg;
    while let Some(c) = rest.chars().next() {
        let (piece, n) = match c {
            '%' if rest.starts_with("%2A") => ("*", 3),
            '%' if rest.starts_with("%25") => ("%", 3),
            // Wildcards cannot appear in an MQTT topic name: a native key holding them
            // reaches MQTT subscribers percent-encoded (not reversible: MQTT has no way
            // to name that key).
            '+' => ("%2B", 1),
            '#' => ("%23", 1),
            _ => {
                out.push(c);
                rest = &rest[c.len_utf8()..];
                continue;
            }
        };
        out.push_str(piece);
        rest = &rest[n..];
    }
    Cow::Owned(out)
}

/// Whether `topic` is its own key: no empty level, no `%` or `*` to escape.
fn is_plain(topic: &str) -> bool {
    // One pass over the bytes: no `%` or `*`, no empty level (a `/` first, last or after
    // another `/`).
    let b = topic.as_bytes();
    if b.is_empty() || b[b.len() - 1] == b'/' {
        return false;
    }
    let mut prev = b'/';
    for &c in b {
        if c == b'%' || c == b'*' || (c == b'/' && prev == b'/') {
            return false;
        }
        prev = c;
    }
    true
}

/// The Hayate key of an MQTT topic name (no wildcards; validated by the codec).
pub fn topic_to_key(topic: &str) -> Result<Key, MapError> {
    let r = if is_plain(topic) {
        Key::new(topic)
    } else {
        let mapped: Vec<Cow<'_, str>> = topic.split('/').map(level_to_segment).collect();
        Key::new(&mapped.join("/"))
    };
    r.map_err(|e| MapError::Topic(topic.to_string(), e.to_string()))
}

/// [`topic_to_key`] for a topic in a read buffer: a plain topic becomes its key without a
/// copy (the key shares the buffer).
pub fn topic_bytes_to_key(topic: &ByteStr) -> Result<Key, MapError> {
    topic_into_key(topic.clone())
}

/// [`topic_bytes_to_key`] of a topic the caller gives up (no reference count taken).
///
/// A topic with no character to escape (`%`, `*`) is its own key unless it has an empty
/// level: [`Key::from_bytes_or_return`] decides, the one validation every key gets (a
/// single vectorised pass for the common ASCII topic), so a topic the key rules refuse (a
/// control character, which MQTT allows but no key holds) is refused here, whatever path
/// it came by (a PUBLISH, a topic alias, a will, a Response Topic, over TCP or WebSocket).
pub fn topic_into_key(topic: ByteStr) -> Result<Key, MapError> {
    if has_escapes(topic.as_bytes()) {
        return topic_to_key(topic.as_str());
    }
    match Key::from_bytes_or_return(topic.into_bytes()) {
        Ok(k) => Ok(k),
        // An empty level (`/a`, `a//b`, `a/`) is mapped (`%`); the mapped key is checked.
        Err((KeyError::Empty | KeyError::EmptySegment, b)) => {
            topic_to_key(std::str::from_utf8(&b).unwrap_or_default())
        }
        Err((e, b)) => Err(MapError::Topic(
            String::from_utf8_lossy(&b).into_owned(),
            e.to_string(),
        )),
    }
}

/// Whether `topic` has a character the mapping escapes (`%` or `*`): one branch-free pass.
fn has_escapes(b: &[u8]) -> bool {
    let mut found = 0u8;
    for &c in b {
        found |= u8::from(c == b'%') | u8::from(c == b'*');
    }
    found != 0
}

/// The MQTT topic name of a Hayate key.
pub fn key_to_topic(key: &str) -> Cow<'_, str> {
    if !key.contains(['%', '+', '#']) {
        return Cow::Borrowed(key);
    }
    let levels: Vec<Cow<'_, str>> = key.split('/').map(segment_to_level).collect();
    Cow::Owned(levels.join("/"))
}

/// The Hayate key expression of an MQTT topic filter (validated by the codec: `#` last and
/// alone in its level, `+` alone in its level).
pub fn filter_to_expr(filter: &str) -> Result<KeyExpr, MapError> {
    let segs: Vec<Cow<'_, str>> = filter
        .split('/')
        .map(|l| match l {
            "+" => Cow::Borrowed("*"),
            "#" => Cow::Borrowed("**"),
            l => level_to_segment(l),
        })
        .collect();
    KeyExpr::new(&segs.join("/")).map_err(|e| MapError::Topic(filter.to_string(), e.to_string()))
}

/// The delivery guarantee a publisher asks for with `q`.
pub fn guarantee(q: QoS) -> Guarantee {
    match q {
        QoS::AtMostOnce => Guarantee::AtMostOnce,
        QoS::AtLeastOnce => Guarantee::AtLeastOnce,
        QoS::ExactlyOnce => Guarantee::ExactlyOnce,
    }
}

/// The QoS of a delivery guarantee (the most a subscriber receives a message at).
pub fn qos_of(g: Guarantee) -> QoS {
    match g {
        Guarantee::AtMostOnce => QoS::AtMostOnce,
        Guarantee::AtLeastOnce => QoS::AtLeastOnce,
        Guarantee::ExactlyOnce => QoS::ExactlyOnce,
    }
}

/// The broker-side quality of service of an MQTT subscription granted `q`: QoS 0 is at
/// most once and never holds a publisher back (a full outbox drops, counted, as Mosquitto
/// does); QoS 1 and 2 block, for at most `limits.max_block_ms`, then the slow consumer is
/// disconnected (its session keeps what it holds).
pub fn broker_qos(q: QoS) -> hayate_core::Qos {
    match q {
        QoS::AtMostOnce => hayate_core::Qos::BEST_EFFORT_DROP,
        QoS::AtLeastOnce | QoS::ExactlyOnce => hayate_core::Qos::default(),
    }
}

/// The MQTT 5.0 properties a message keeps: those of a PUBLISH and of a will.
struct Meta<'a> {
    utf8: bool,
    expiry: Option<u32>,
    content_type: Option<&'a ByteStr>,
    response_topic: Option<&'a ByteStr>,
    correlation: Option<&'a Bytes>,
    user: &'a [(ByteStr, ByteStr)],
}

/// The message of a topic, payload, QoS, retain flag and metadata (from a PUBLISH or a
/// will).
fn build_message(
    topic: ByteStr,
    payload: Bytes,
    qos: QoS,
    retain: bool,
    meta: Meta<'_>,
) -> Result<Message, MapError> {
    let key = topic_into_key(topic)?;
    let mut msg = Message::new(key, payload);
    msg.attrs.guarantee = Some(guarantee(qos));
    msg.attrs.retain = retain;
    msg.attrs.utf8 = meta.utf8;
    msg.attrs.expires = meta
        .expiry
        .map(|s| Instant::now() + Duration::from_secs(u64::from(s)));
    if let Some(r) = meta.response_topic {
        msg.reply_to = Some(topic_bytes_to_key(r)?);
    }
    msg.correlation_id = meta.correlation.cloned();
    if meta.content_type.is_some() || !meta.user.is_empty() {
        let mut h = Vec::with_capacity(meta.user.len() + 1);
        if let Some(ct) = meta.content_type {
            h.push((CONTENT_TYPE.to_string(), ct.as_shared().clone()));
        }
        for (k, v) in meta.user {
            h.push((k.as_str().to_string(), v.as_shared().clone()));
        }
        msg.headers = Some(h);
    }
    Ok(msg)
}

/// The message a PUBLISH carries; `topic` is its topic name, resolved if the PUBLISH used
/// a topic alias. The topic and payload are moved into the message (no reference counts
/// taken). Fails if the topic or the Response Topic has no key.
pub(crate) fn publish_message(topic: ByteStr, p: Publish) -> Result<Message, MapError> {
    let pr = &p.properties;
    build_message(
        topic,
        p.payload,
        p.qos,
        p.retain,
        Meta {
            utf8: pr.payload_format_indicator == Some(PayloadFormat::Utf8),
            expiry: pr.message_expiry_interval,
            content_type: pr.content_type.as_ref(),
            response_topic: pr.response_topic.as_ref(),
            correlation: pr.correlation_data.as_ref(),
            user: &pr.user_properties,
        },
    )
}

/// The will as a message, with its delay in seconds. Fails if the will topic or its
/// Response Topic has no key.
pub(crate) fn will_message(w: Option<&Will>) -> Result<Option<(Message, u32)>, MapError> {
    let Some(w) = w else { return Ok(None) };
    let p = &w.properties;
    let msg = build_message(
        w.topic.clone(),
        w.payload.clone(),
        w.qos,
        w.retain,
        Meta {
            utf8: p.payload_format_indicator == Some(PayloadFormat::Utf8),
            expiry: p.message_expiry_interval,
            content_type: p.content_type.as_ref(),
            response_topic: p.response_topic.as_ref(),
            correlation: p.correlation_data.as_ref(),
            user: &p.user_properties,
        },
    )?;
    Ok(Some((msg, p.will_delay_interval.unwrap_or(0))))
}

/// Remaining whole seconds until `at` (rounded up, at least 1).
fn remaining_secs(at: Instant, now: Instant) -> u32 {
    let d = at.saturating_duration_since(now);
    let s = d.as_secs() + u64::from(d.subsec_nanos() > 0);
    u32::try_from(s.max(1)).unwrap_or(u32::MAX)
}

/// The 5.0 properties of a delivery of `msg` (if it has metadata) to a subscription with
/// identifier `sub_id`, `now` being the time to count the expiry interval from (needed
/// only when the message expires); `None` when there are none: the common case.
pub(crate) fn delivery_properties(
    msg: Option<&Message>,
    sub_id: Option<u32>,
    now: Option<Instant>,
) -> Option<PublishProperties> {
    let has_meta = msg.is_some_and(|m| !m.is_plain());
    if !has_meta && sub_id.is_none() {
        return None;
    }
    let mut p = PublishProperties::default();
    if let Some(id) = sub_id {
        p.subscription_identifiers.push(id);
    }
    if let Some(m) = msg {
        if m.attrs.utf8 {
            p.payload_format_indicator = Some(PayloadFormat::Utf8);
        }
        if let (Some(at), Some(now)) = (m.attrs.expires, now) {
            p.message_expiry_interval = Some(remaining_secs(at, now));
        }
        if let Some(r) = &m.reply_to {
            p.response_topic = Some(key_to_topic(r.as_str()).as_ref().into());
        }
        if let Some(c) = &m.correlation_id {
            p.correlation_data = Some(c.clone());
        }
        if let Some(h) = &m.headers {
            for (name, value) in h {
                // MQTT strings are UTF-8 without U+0000, of at most 65,535 bytes: a header
                // that is not (from another protocol) is left out, not the message lost.
                let Ok(v) = std::str::from_utf8(value) else {
                    continue;
                };
                if !mqtt_string(name) || !mqtt_string(v) {
                    continue;
                }
                if name == CONTENT_TYPE {
                    p.content_type = Some(v.into());
                } else {
                    p.user_properties.push((name.as_str().into(), v.into()));
                }
            }
        }
    }
    Some(p)
}

/// Whether `s` can be an MQTT string (UTF-8, which `&str` is; no U+0000; 65,535 bytes at
/// most).
fn mqtt_string(s: &str) -> bool {
    s.len() <= usize::from(u16::MAX) && !s.contains('\0')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_topics_map_to_themselves() {
        assert_eq!(topic_to_key("a/b/c").unwrap().as_str(), "a/b/c");
        assert_eq!(key_to_topic("a/b/c"), "a/b/c");
    }

    #[test]
    fn empty_levels_and_stars_round_trip() {
        for t in [
            "/a", "a/", "a//b", "/", "a/*/b", "x*y", "%", "a/%2A", "%/%%",
        ] {
            let k = topic_to_key(t).unwrap();
            assert_eq!(key_to_topic(k.as_str()), t, "{t} -> {}", k.as_str());
        }
        assert_eq!(topic_to_key("/devices/x").unwrap().as_str(), "%/devices/x");
        assert_eq!(topic_to_key("a/*/b").unwrap().as_str(), "a/%2A/b");
    }

    /// The zero-copy path ([`topic_into_key`]) gives what [`topic_to_key`] gives, and
    /// refuses what the key rules refuse: a control character (MQTT allows all but U+0000).
    #[test]
    fn topics_with_control_characters_have_no_key() {
        for t in [
            "x\u{1}",
            "a/\nb",
            "a\r",
            "\u{7f}",
            "a//b\u{1f}",
            "%\t",
            "é/\u{1}",
        ] {
            assert!(topic_into_key(ByteStr::from(t)).is_err(), "{t:?}");
            assert!(topic_to_key(t).is_err(), "{t:?}");
            assert!(filter_to_expr(t).is_err(), "{t:?}");
        }
        for t in [
            "a/b", "/a", "a/", "a//b", "/", "", "x*y", "é/ü", "a/%2A", "+/#",
        ] {
            let via_bytes = topic_into_key(ByteStr::from(t)).map(|k| k.as_str().to_owned());
            let via_str = topic_to_key(t).map(|k| k.as_str().to_owned());
            assert_eq!(via_bytes, via_str, "{t:?}");
        }
    }

    #[test]
    fn filters() {
        assert_eq!(
            filter_to_expr("a/+/c").unwrap(),
            KeyExpr::new("a/*/c").unwrap()
        );
        assert_eq!(
            filter_to_expr("a/#").unwrap(),
            KeyExpr::new("a/**").unwrap()
        );
        assert_eq!(filter_to_expr("#").unwrap(), KeyExpr::new("**").unwrap());
        assert_eq!(filter_to_expr("/+").unwrap(), KeyExpr::new("%/*").unwrap());
        // A literal `*` in a filter level is not a wildcard.
        let e = filter_to_expr("a/b*c").unwrap();
        assert!(e.matches(&topic_to_key("a/b*c").unwrap()));
        assert!(!e.matches(&topic_to_key("a/bxc").unwrap()));
    }

    proptest::proptest! {
        #[test]
        fn every_topic_round_trips(levels in proptest::collection::vec("[a-c%*2A5]{0,4}", 1..5)) {
            let topic = levels.join("/");
            let key = topic_to_key(&topic).unwrap();
            proptest::prop_assert_eq!(key_to_topic(key.as_str()), topic.as_str());
            // A filter made of the same levels (no wildcards) matches exactly that key.
            proptest::prop_assert!(filter_to_expr(&topic).unwrap().matches(&key));
        }
    }

    #[test]
    fn native_keys_with_stars_reach_mqtt_unchanged() {
        assert_eq!(key_to_topic("a/b*c"), "a/b*c");
        assert_eq!(key_to_topic("a/+/x#y"), "a/%2B/x%23y");
        assert_eq!(key_to_topic("%/a+%25"), "/a%2B%");
        assert_eq!(key_to_topic("a/%zz"), "a/%zz");
    }

    #[test]
    fn qos_and_guarantee_round_trip() {
        for q in QoS::ALL {
            assert_eq!(qos_of(guarantee(q)), q);
            // The guarantee's discriminant is the QoS number (the saved state relies on it).
            assert_eq!(guarantee(q) as u8, q.as_u8());
        }
        assert_eq!(
            broker_qos(QoS::AtMostOnce),
            hayate_core::Qos::BEST_EFFORT_DROP
        );
        assert_eq!(broker_qos(QoS::AtLeastOnce), hayate_core::Qos::default());
        assert_eq!(broker_qos(QoS::ExactlyOnce), hayate_core::Qos::default());
    }

    #[test]
    fn publish_metadata_round_trips() {
        let mut p = Publish::new("a/b", "x");
        p.qos = QoS::AtLeastOnce;
        p.packet_id = Some(1);
        p.retain = true;
        let pr = &mut p.properties;
        pr.payload_format_indicator = Some(PayloadFormat::Utf8);
        pr.content_type = Some("text/plain".into());
        pr.response_topic = Some("/replies".into());
        pr.correlation_data = Some(Bytes::from_static(b"c1"));
        pr.user_properties.push(("k".into(), "v".into()));
        let m = publish_message(p.topic.clone(), p.clone()).unwrap();
        assert_eq!(m.key.as_str(), "a/b");
        assert_eq!(m.attrs.guarantee, Some(Guarantee::AtLeastOnce));
        assert!(m.attrs.retain && m.attrs.utf8);
        assert_eq!(m.reply_to.as_ref().map(|k| k.as_str()), Some("%/replies"));
        let back = delivery_properties(Some(&m), Some(7), None).unwrap();
        assert_eq!(back.subscription_identifiers, vec![7]);
        assert_eq!(back.payload_format_indicator, Some(PayloadFormat::Utf8));
        assert_eq!(back.content_type.as_deref(), Some("text/plain"));
        assert_eq!(back.response_topic.as_deref(), Some("/replies"));
        assert_eq!(back.correlation_data.as_deref(), Some(&b"c1"[..]));
        assert_eq!(back.user_properties.len(), 1);
        // A plain message to a subscription without an identifier has no properties.
        let plain = Message::new(Key::new("a").unwrap(), Bytes::new());
        assert_eq!(delivery_properties(Some(&plain), None, None), None);
    }

    /// Headers from other protocols that MQTT strings cannot carry (a NUL, more than
    /// 65,535 bytes) are left out of a delivery's user properties; the rest, and the
    /// message, go (before, the packet failed to encode and the delivery was dropped, even
    /// at QoS 1).
    #[test]
    fn headers_mqtt_cannot_carry_are_left_out_not_the_message() {
        let mut m = Message::new(Key::new("a").unwrap(), Bytes::from_static(b"x"));
        m.headers = Some(vec![
            ("ok".into(), Bytes::from_static(b"v")),
            ("nul".into(), Bytes::from_static(b"a\0b")),
            ("n\0ame".into(), Bytes::from_static(b"v")),
            ("long".into(), Bytes::from(vec![b'a'; 70_000])),
        ]);
        let p = delivery_properties(Some(&m), None, None).unwrap();
        assert_eq!(p.user_properties, vec![("ok".into(), "v".into())]);
        let mut out = bytes::BytesMut::new();
        let head = hayate_mqtt::PublishHead {
            dup: false,
            qos: QoS::AtLeastOnce,
            retain: false,
            topic: "a",
            packet_id: Some(1),
            properties: &p,
        };
        assert!(
            hayate_mqtt::encode_publish_head(&head, 1, hayate_mqtt::ProtocolVersion::V5, &mut out)
                .is_ok()
        );
    }
}
