//! Malformed and forbidden input: every decode error, the reason code it maps to, that it
//! consumes nothing, and that a too-large packet is refused from its fixed header alone.
//! Then the encoder's refusals.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use bytes::{Bytes, BytesMut};
use hayate_mqtt::{
    Ack, Auth, ByteStr, ConnAck, Connect, DecodeError, Disconnect, EncodeError, MAX_PACKET_SIZE,
    Packet, PacketType, ProtocolVersion, Publish, QoS, ReasonCode, RetainHandling, SubAck,
    Subscribe, Subscription, SubscriptionOptions, UnsubAck, Unsubscribe, Will, decode,
    decode_connect, encode, encode_publish_head, packet_len,
};

const V31: ProtocolVersion = ProtocolVersion::V3_1;
const V3: ProtocolVersion = ProtocolVersion::V3_1_1;
const V5: ProtocolVersion = ProtocolVersion::V5;

/// Decodes `bytes` expecting an error, which must consume nothing.
fn err(bytes: &[u8], version: ProtocolVersion) -> DecodeError {
    err_max(bytes, version, MAX_PACKET_SIZE)
}

fn err_max(bytes: &[u8], version: ProtocolVersion, max: u32) -> DecodeError {
    let mut buf = BytesMut::from(bytes);
    let e = decode(&mut buf, version, max).expect_err("expected an error");
    assert_eq!(&buf[..], bytes, "an error consumes nothing");
    assert!(!e.to_string().is_empty());
    e
}

/// The error and its reason code.
fn check(bytes: &[u8], version: ProtocolVersion, expected: DecodeError, reason: ReasonCode) {
    let e = err(bytes, version);
    assert_eq!(e, expected, "{bytes:02x?}");
    assert_eq!(e.reason_code(), reason, "{e}");
}

fn ok(bytes: &[u8], version: ProtocolVersion) -> Packet {
    let mut buf = BytesMut::from(bytes);
    let p = decode(&mut buf, version, MAX_PACKET_SIZE)
        .unwrap_or_else(|e| panic!("{bytes:02x?}: {e}"))
        .expect("complete");
    assert!(buf.is_empty());
    p
}

const MALFORMED: ReasonCode = ReasonCode::MalformedPacket;
const PROTOCOL: ReasonCode = ReasonCode::ProtocolError;

// ---------------------------------------------------------------------------------------
// Fixed header

#[test]
fn too_large_is_refused_from_the_fixed_header() {
    // Remaining length 268,435,455 announced, no body yet.
    let e = err_max(b"\x30\xff\xff\xff\x7f", V5, 1024);
    assert_eq!(
        e,
        DecodeError::PacketTooLarge {
            size: 268_435_460,
            max: 1024
        }
    );
    assert_eq!(e.reason_code(), ReasonCode::PacketTooLarge);
    assert_eq!(
        packet_len(b"\x30\xff\xff\xff\x7f", V5, 1024),
        Err(e.clone())
    );
    // Exactly the maximum is fine (and incomplete).
    let mut buf = BytesMut::from(&b"\x30\x7e"[..]);
    assert_eq!(decode(&mut buf, V5, 128), Ok(None));
    assert!(matches!(
        err_max(b"\x30\x7f", V5, 128),
        DecodeError::PacketTooLarge {
            size: 129,
            max: 128
        }
    ));
    // CONNECT too.
    assert!(matches!(
        decode_connect(&mut BytesMut::from(&b"\x10\x80\x08"[..]), 1000),
        Err(DecodeError::PacketTooLarge { size: 1027, .. })
    ));
}

#[test]
fn remaining_length_encoding() {
    // Five bytes.
    check(
        b"\x30\xff\xff\xff\xff\x01",
        V5,
        DecodeError::MalformedVarInt,
        MALFORMED,
    );
    // The fourth byte already continues: known to be malformed before the fifth arrives.
    check(
        b"\x30\xff\xff\xff\xff",
        V3,
        DecodeError::MalformedVarInt,
        MALFORMED,
    );
    // Not the shortest form.
    check(b"\xc0\x80\x00", V3, DecodeError::MalformedVarInt, MALFORMED);
    check(
        b"\x30\x82\x80\x00",
        V3,
        DecodeError::MalformedVarInt,
        MALFORMED,
    );
    // Incomplete is not an error.
    for partial in [&b"\x30"[..], b"\x30\xff", b"\x30\xff\xff\xff"] {
        assert_eq!(
            decode(&mut BytesMut::from(partial), V3, MAX_PACKET_SIZE),
            Ok(None)
        );
    }
}

#[test]
fn reserved_packet_types() {
    check(
        b"\x00\x00",
        V5,
        DecodeError::ReservedPacketType(0),
        MALFORMED,
    );
    check(
        b"\xf0\x00",
        V3,
        DecodeError::ReservedPacketType(15),
        MALFORMED,
    );
    check(
        b"\xf0\x00",
        V31,
        DecodeError::ReservedPacketType(15),
        MALFORMED,
    );
    assert_eq!(ok(b"\xf0\x00", V5), Packet::from(Auth::default()));
}

#[test]
fn fixed_header_flags() {
    let cases: [(&[u8], PacketType, u8); 7] = [
        (b"\x41\x02\x00\x01", PacketType::PubAck, 1),
        (b"\x60\x02\x00\x01", PacketType::PubRel, 0),
        (b"\x80\x06\x00\x01\x00\x01a\x00", PacketType::Subscribe, 0),
        (b"\xa0\x05\x00\x01\x00\x01a", PacketType::Unsubscribe, 0),
        (b"\xc8\x00", PacketType::PingReq, 8),
        (b"\x1f\x00", PacketType::Connect, 15),
        // DUP on a QoS 0 PUBLISH.
        (b"\x38\x03\x00\x01a", PacketType::Publish, 8),
    ];
    for (bytes, packet, flags) in cases {
        for version in [V3, V5] {
            check(
                bytes,
                version,
                DecodeError::InvalidFlags { packet, flags },
                MALFORMED,
            );
        }
    }
    // The flag nibble is checked as soon as the first byte is there.
    assert!(matches!(
        decode(&mut BytesMut::from(&b"\x41"[..]), V5, MAX_PACKET_SIZE),
        Err(DecodeError::InvalidFlags { .. })
    ));
    // MQTT 3.1 may set DUP on PUBREL, SUBSCRIBE and UNSUBSCRIBE.
    assert_eq!(ok(b"\x6a\x02\x00\x01", V31), Packet::PubRel(Ack::new(1)));
    let sub = Subscribe::new(1, vec![Subscription::new("a", QoS::AtMostOnce)]);
    assert_eq!(ok(b"\x8a\x06\x00\x01\x00\x01a\x00", V31), Packet::from(sub));
    check(
        b"\x8a\x06\x00\x01\x00\x01a\x00",
        V3,
        DecodeError::InvalidFlags {
            packet: PacketType::Subscribe,
            flags: 0x0a,
        },
        MALFORMED,
    );
}

#[test]
fn qos_3() {
    check(
        b"\x36\x05\x00\x01a\x00\x01",
        V3,
        DecodeError::InvalidQoS(PacketType::Publish),
        MALFORMED,
    );
    // Will QoS 3.
    check(
        b"\x10\x12\x00\x04MQTT\x04\x1e\x00\x3c\x00\x01c\x00\x01w\x00\x00",
        V3,
        DecodeError::InvalidQoS(PacketType::Connect),
        MALFORMED,
    );
    // Subscription QoS 3 is a Protocol Error in 5.0 (3.8.3.1).
    check(
        b"\x82\x07\x00\x01\x00\x00\x01a\x03",
        V5,
        DecodeError::InvalidQoS(PacketType::Subscribe),
        PROTOCOL,
    );
}

// ---------------------------------------------------------------------------------------
// Lengths and data representations

#[test]
fn remaining_length_mismatches() {
    // Too short for the packet identifier.
    check(
        b"\x40\x01\x00",
        V3,
        DecodeError::Truncated(PacketType::PubAck),
        MALFORMED,
    );
    // A string running past the packet.
    check(
        b"\x30\x03\x00\x05a",
        V3,
        DecodeError::Truncated(PacketType::Publish),
        MALFORMED,
    );
    // Bytes after the last field.
    check(
        b"\xc0\x01\x00",
        V3,
        DecodeError::TrailingBytes(PacketType::PingReq),
        MALFORMED,
    );
    check(
        b"\x40\x03\x00\x01\x00",
        V3,
        DecodeError::TrailingBytes(PacketType::PubAck),
        MALFORMED,
    );
    check(
        b"\xe0\x01\x00",
        V3,
        DecodeError::TrailingBytes(PacketType::Disconnect),
        MALFORMED,
    );
    check(
        b"\x20\x03\x00\x00\x00",
        V3,
        DecodeError::TrailingBytes(PacketType::ConnAck),
        MALFORMED,
    );
    check(
        b"\xb0\x03\x00\x01\x00",
        V3,
        DecodeError::TrailingBytes(PacketType::UnsubAck),
        MALFORMED,
    );
    check(
        b"\x10\x0e\x00\x04MQTT\x04\x02\x00\x3c\x00\x01ax",
        V3,
        DecodeError::TrailingBytes(PacketType::Connect),
        MALFORMED,
    );
    // 5.0 CONNACK needs its property length.
    check(
        b"\x20\x02\x00\x00",
        V5,
        DecodeError::Truncated(PacketType::ConnAck),
        MALFORMED,
    );
    // Truncated CONNECT fields.
    check(
        b"\x10\x04\x00\x04MQ",
        V5,
        DecodeError::Truncated(PacketType::Connect),
        MALFORMED,
    );
}

#[test]
fn strings() {
    check(
        b"\x30\x04\x00\x02\xc3\x28",
        V3,
        DecodeError::InvalidUtf8,
        MALFORMED,
    );
    // An encoded surrogate (U+D800) is not UTF-8.
    check(
        b"\x30\x05\x00\x03\xed\xa0\x80",
        V3,
        DecodeError::InvalidUtf8,
        MALFORMED,
    );
    check(
        b"\x30\x04\x00\x02a\x00",
        V3,
        DecodeError::NulInString,
        MALFORMED,
    );
    // In a client identifier, a user property, a filter too.
    check(
        b"\x10\x0d\x00\x04MQTT\x04\x02\x00\x3c\x00\x01\x00",
        V3,
        DecodeError::NulInString,
        MALFORMED,
    );
    check(
        b"\xe0\x08\x00\x06\x26\x00\x01\xff\x00\x00",
        V5,
        DecodeError::InvalidUtf8,
        MALFORMED,
    );
    check(
        b"\xa2\x05\x00\x01\x00\x01\x00",
        V3,
        DecodeError::NulInString,
        MALFORMED,
    );
    // U+FEFF is allowed and kept (1.5.4).
    let Packet::Publish(p) = ok(b"\x30\x05\x00\x03\xef\xbb\xbf", V3) else {
        panic!()
    };
    assert_eq!(p.topic, "\u{feff}");
}

// ---------------------------------------------------------------------------------------
// CONNECT and CONNACK

#[test]
fn protocol_name_and_level() {
    check(
        b"\x10\x0d\x00\x04MQTX\x04\x02\x00\x3c\x00\x01a",
        V5,
        DecodeError::InvalidProtocolName("MQTX".into()),
        ReasonCode::UnsupportedProtocolVersion,
    );
    check(
        b"\x10\x0d\x00\x04MQTT\x06\x02\x00\x3c\x00\x01a",
        V5,
        DecodeError::UnsupportedProtocolVersion {
            name: "MQTT",
            level: 6,
        },
        ReasonCode::UnsupportedProtocolVersion,
    );
    check(
        b"\x10\x0d\x00\x04MQTT\x03\x02\x00\x3c\x00\x01a",
        V5,
        DecodeError::UnsupportedProtocolVersion {
            name: "MQTT",
            level: 3,
        },
        ReasonCode::UnsupportedProtocolVersion,
    );
    check(
        b"\x10\x0f\x00\x06MQIsdp\x04\x02\x00\x3c\x00\x01a",
        V3,
        DecodeError::UnsupportedProtocolVersion {
            name: "MQIsdp",
            level: 4,
        },
        ReasonCode::UnsupportedProtocolVersion,
    );
}

#[test]
fn connect_flags() {
    let connect = |flags: u8| -> Vec<u8> {
        let mut v = b"\x10\x0d\x00\x04MQTT\x04".to_vec();
        v.push(flags);
        v.extend_from_slice(b"\x00\x3c\x00\x01a");
        v
    };
    // Reserved bit.
    check(
        &connect(0x03),
        V3,
        DecodeError::InvalidConnectFlags(0x03),
        MALFORMED,
    );
    // Will QoS or retain without a will.
    check(
        &connect(0x0a),
        V3,
        DecodeError::InvalidConnectFlags(0x0a),
        MALFORMED,
    );
    check(
        &connect(0x22),
        V3,
        DecodeError::InvalidConnectFlags(0x22),
        MALFORMED,
    );
    // A password without a user name, before 5.0.
    check(
        &connect(0x42),
        V3,
        DecodeError::InvalidConnectFlags(0x42),
        MALFORMED,
    );
    // Fields the flags announce must be there.
    check(
        &connect(0x82),
        V3,
        DecodeError::Truncated(PacketType::Connect),
        MALFORMED,
    );
    // A will topic with a wildcard.
    check(
        b"\x10\x12\x00\x04MQTT\x04\x06\x00\x3c\x00\x01c\x00\x01#\x00\x00",
        V3,
        DecodeError::InvalidTopicName("#".into()),
        ReasonCode::TopicNameInvalid,
    );
    check(
        b"\x10\x11\x00\x04MQTT\x04\x06\x00\x3c\x00\x01c\x00\x00\x00\x00",
        V3,
        DecodeError::InvalidTopicName(String::new()),
        ReasonCode::TopicNameInvalid,
    );
    // Authentication data needs a method (5.0).
    check(
        b"\x10\x12\x00\x04MQTT\x05\x02\x00\x3c\x04\x16\x00\x01x\x00\x01a",
        V5,
        DecodeError::AuthDataWithoutMethod,
        PROTOCOL,
    );
}

#[test]
fn connack_errors() {
    check(
        b"\x20\x02\x02\x00",
        V3,
        DecodeError::InvalidConnAckFlags(0x02),
        MALFORMED,
    );
    check(
        b"\x20\x02\x01\x05",
        V3,
        DecodeError::SessionPresentOnFailure,
        PROTOCOL,
    );
    check(
        b"\x20\x03\x01\x87\x00",
        V5,
        DecodeError::SessionPresentOnFailure,
        PROTOCOL,
    );
    check(
        b"\x20\x02\x00\x06",
        V3,
        DecodeError::InvalidReasonCode {
            packet: PacketType::ConnAck,
            code: 6,
        },
        PROTOCOL,
    );
    // A 5.0 code that CONNACK does not allow (Granted QoS 1), and an undefined one.
    for code in [0x01, 0x05] {
        check(
            &[0x20, 0x03, 0x00, code, 0x00],
            V5,
            DecodeError::InvalidReasonCode {
                packet: PacketType::ConnAck,
                code,
            },
            PROTOCOL,
        );
    }
}

#[test]
fn decode_connect_wants_connect_first() {
    for (first, t) in [
        (0x30, PacketType::Publish),
        (0xc0, PacketType::PingReq),
        (0x20, PacketType::ConnAck),
    ] {
        let mut buf = BytesMut::from(&[first][..]);
        let e = decode_connect(&mut buf, MAX_PACKET_SIZE).unwrap_err();
        assert_eq!(e, DecodeError::ExpectedConnect(t));
        assert_eq!(e.reason_code(), PROTOCOL);
        assert_eq!(buf.len(), 1);
    }
    let mut buf = BytesMut::from(&b"\x00"[..]);
    assert_eq!(
        decode_connect(&mut buf, MAX_PACKET_SIZE),
        Err(DecodeError::ReservedPacketType(0))
    );
}

// ---------------------------------------------------------------------------------------
// PUBLISH, acknowledgements, subscriptions

#[test]
fn packet_identifier_zero() {
    check(
        b"\x32\x05\x00\x01a\x00\x00",
        V3,
        DecodeError::ZeroPacketId(PacketType::Publish),
        PROTOCOL,
    );
    check(
        b"\x40\x02\x00\x00",
        V3,
        DecodeError::ZeroPacketId(PacketType::PubAck),
        PROTOCOL,
    );
    check(
        b"\x62\x02\x00\x00",
        V5,
        DecodeError::ZeroPacketId(PacketType::PubRel),
        PROTOCOL,
    );
    check(
        b"\x82\x06\x00\x00\x00\x01a\x00",
        V3,
        DecodeError::ZeroPacketId(PacketType::Subscribe),
        PROTOCOL,
    );
    check(
        b"\x90\x03\x00\x00\x00",
        V3,
        DecodeError::ZeroPacketId(PacketType::SubAck),
        PROTOCOL,
    );
    check(
        b"\xa2\x05\x00\x00\x00\x01a",
        V3,
        DecodeError::ZeroPacketId(PacketType::Unsubscribe),
        PROTOCOL,
    );
    check(
        b"\xb0\x02\x00\x00",
        V3,
        DecodeError::ZeroPacketId(PacketType::UnsubAck),
        PROTOCOL,
    );
    // QoS 0 has no packet identifier: the two bytes are payload.
    let Packet::Publish(p) = ok(b"\x30\x05\x00\x01a\x00\x00", V3) else {
        panic!()
    };
    assert_eq!((p.packet_id, &p.payload[..]), (None, &b"\x00\x00"[..]));
}

#[test]
fn publish_topics() {
    for topic in [&b"a/+"[..], b"#", b"a/b#", b"+"] {
        let mut bytes = vec![0x30, (topic.len() + 2) as u8, 0, topic.len() as u8];
        bytes.extend_from_slice(topic);
        let name = String::from_utf8(topic.to_vec()).unwrap();
        check(
            &bytes,
            V3,
            DecodeError::InvalidTopicName(name),
            ReasonCode::TopicNameInvalid,
        );
    }
    check(
        b"\x30\x02\x00\x00",
        V3,
        DecodeError::EmptyTopicName,
        PROTOCOL,
    );
    check(
        b"\x30\x03\x00\x00\x00",
        V5,
        DecodeError::EmptyTopicName,
        PROTOCOL,
    );
    // With a topic alias, 5.0 allows an empty topic.
    assert!(matches!(
        ok(b"\x30\x06\x00\x00\x03\x23\x00\x01", V5),
        Packet::Publish(_)
    ));
}

#[test]
fn reason_codes_per_packet() {
    let not_allowed = |bytes: &[u8], packet: PacketType, code: u8| {
        check(
            bytes,
            V5,
            DecodeError::InvalidReasonCode { packet, code },
            PROTOCOL,
        );
    };
    not_allowed(b"\x40\x03\x00\x01\x92", PacketType::PubAck, 0x92);
    not_allowed(b"\x50\x03\x00\x01\x8f", PacketType::PubRec, 0x8f);
    not_allowed(b"\x62\x03\x00\x01\x10", PacketType::PubRel, 0x10);
    not_allowed(b"\x70\x03\x00\x01\x80", PacketType::PubComp, 0x80);
    not_allowed(b"\x90\x04\x00\x01\x00\x11", PacketType::SubAck, 0x11);
    not_allowed(b"\xb0\x04\x00\x01\x00\x01", PacketType::UnsubAck, 0x01);
    not_allowed(b"\xe0\x01\x18", PacketType::Disconnect, 0x18);
    not_allowed(b"\xf0\x01\x04", PacketType::Auth, 0x04);
    not_allowed(b"\xe0\x01\x03", PacketType::Disconnect, 0x03);
    // 3.1.1 SUBACK: only 0, 1, 2 and 0x80.
    check(
        b"\x90\x03\x00\x01\x87",
        V3,
        DecodeError::InvalidReasonCode {
            packet: PacketType::SubAck,
            code: 0x87,
        },
        PROTOCOL,
    );
}

#[test]
fn subscribe_errors() {
    // No topic filter.
    check(
        b"\x82\x02\x00\x01",
        V3,
        DecodeError::NoTopicFilters(PacketType::Subscribe),
        PROTOCOL,
    );
    check(
        b"\x82\x03\x00\x01\x00",
        V5,
        DecodeError::NoTopicFilters(PacketType::Subscribe),
        PROTOCOL,
    );
    check(
        b"\xa2\x02\x00\x01",
        V3,
        DecodeError::NoTopicFilters(PacketType::Unsubscribe),
        PROTOCOL,
    );
    // A filter without its options byte.
    check(
        b"\x82\x05\x00\x01\x00\x01a",
        V3,
        DecodeError::Truncated(PacketType::Subscribe),
        MALFORMED,
    );
    // Reserved option bits: 2 to 7 before 5.0, 6 and 7 in 5.0.
    check(
        b"\x82\x06\x00\x01\x00\x01a\x04",
        V3,
        DecodeError::InvalidSubscriptionOptions(0x04),
        MALFORMED,
    );
    check(
        b"\x82\x07\x00\x01\x00\x00\x01a\x40",
        V5,
        DecodeError::InvalidSubscriptionOptions(0x40),
        MALFORMED,
    );
    check(
        b"\x82\x07\x00\x01\x00\x00\x01a\x30",
        V5,
        DecodeError::InvalidRetainHandling,
        PROTOCOL,
    );
    // Invalid filters.
    for filter in [
        "a/#/b",
        "a#",
        "a/b+",
        "",
        "$share/g",
        "$share//a",
        "$share/g+/a",
        "$share/g/",
    ] {
        let mut bytes = vec![0x82, (filter.len() + 5) as u8, 0, 1, 0, filter.len() as u8];
        bytes.extend_from_slice(filter.as_bytes());
        bytes.push(0);
        check(
            &bytes,
            V3,
            DecodeError::InvalidTopicFilter(filter.into()),
            ReasonCode::TopicFilterInvalid,
        );
        let mut bytes = vec![0xa2, (filter.len() + 4) as u8, 0, 1, 0, filter.len() as u8];
        bytes.extend_from_slice(filter.as_bytes());
        check(
            &bytes,
            V3,
            DecodeError::InvalidTopicFilter(filter.into()),
            ReasonCode::TopicFilterInvalid,
        );
    }
    // No Local on a shared subscription (5.0, 3.8.3.1).
    check(
        b"\x82\x10\x00\x01\x00\x00\x0a$share/g/a\x04",
        V5,
        DecodeError::NoLocalOnSharedSubscription("$share/g/a".into()),
        PROTOCOL,
    );
}

#[test]
fn every_decode_error_has_a_failure_reason_code() {
    // A sample of each shape; the point is that reason_code() never says Success.
    let errors = [
        DecodeError::MalformedVarInt,
        DecodeError::ReservedPacketType(0),
        DecodeError::InvalidUtf8,
        DecodeError::EmptyTopicName,
        DecodeError::AuthDataWithoutMethod,
        DecodeError::ExpectedConnect(PacketType::Publish),
        DecodeError::InvalidRetainHandling,
    ];
    for e in errors {
        assert!(e.reason_code().is_error(), "{e}");
    }
}

// ---------------------------------------------------------------------------------------
// The encoder's refusals

fn encode_err(p: &Packet, version: ProtocolVersion) -> EncodeError {
    let mut out = BytesMut::from(&b"keep"[..]);
    let e = encode(p, version, &mut out).expect_err("expected an encode error");
    assert_eq!(&out[..], b"keep", "nothing is written on error");
    assert!(!e.to_string().is_empty());
    e
}

fn s(text: &str) -> ByteStr {
    ByteStr::from(text)
}

#[test]
fn five_point_oh_only() {
    let not_in_v3 = |p: Packet| {
        for version in [V31, V3] {
            assert!(
                matches!(encode_err(&p, version), EncodeError::NotInVersion { .. }),
                "{p:?}"
            );
        }
    };
    not_in_v3(Auth::default().into());
    let mut publish = Publish::new("t", "x");
    publish.properties.content_type = Some(s("json"));
    not_in_v3(publish.into());
    not_in_v3(Packet::PubAck(Ack::with_reason(
        1,
        ReasonCode::NoMatchingSubscribers,
    )));
    not_in_v3(Disconnect::new(ReasonCode::ServerBusy).into());
    not_in_v3(UnsubAck::new(1, vec![ReasonCode::Success]).into());
    not_in_v3(ConnAck::new(ReasonCode::Banned).into());
    not_in_v3(SubAck::new(1, vec![ReasonCode::QuotaExceeded]).into());
    let options = SubscriptionOptions {
        retain_handling: RetainHandling::DoNotSend,
        ..SubscriptionOptions::default()
    };
    not_in_v3(
        Subscribe::new(
            1,
            vec![Subscription {
                filter: s("a"),
                options,
            }],
        )
        .into(),
    );
    let mut connect = Connect::new(V3, "c");
    connect.properties.session_expiry_interval = Some(1);
    not_in_v3(connect.into());
    let mut will = Will::new("w", "x");
    will.properties.will_delay_interval = Some(1);
    let connect = Connect {
        will: Some(will),
        ..Connect::new(V3, "c")
    };
    not_in_v3(connect.into());
}

#[test]
fn publish_refusals() {
    let qos1_without_id = Publish {
        qos: QoS::AtLeastOnce,
        ..Publish::new("t", "x")
    };
    assert_eq!(
        encode_err(&qos1_without_id.into(), V5),
        EncodeError::PacketIdForQoS {
            qos: QoS::AtLeastOnce,
            packet_id: None
        }
    );
    let qos0_with_id = Publish {
        packet_id: Some(1),
        ..Publish::new("t", "x")
    };
    assert!(matches!(
        encode_err(&qos0_with_id.into(), V3),
        EncodeError::PacketIdForQoS { .. }
    ));
    let zero = Publish {
        qos: QoS::ExactlyOnce,
        packet_id: Some(0),
        ..Publish::new("t", "x")
    };
    assert_eq!(
        encode_err(&zero.into(), V3),
        EncodeError::Invalid(DecodeError::ZeroPacketId(PacketType::Publish))
    );
    let dup = Publish {
        dup: true,
        ..Publish::new("t", "x")
    };
    assert!(matches!(
        encode_err(&dup.into(), V3),
        EncodeError::Invalid(DecodeError::InvalidFlags { .. })
    ));
    assert_eq!(
        encode_err(&Publish::new("a/+", "x").into(), V3),
        EncodeError::Invalid(DecodeError::InvalidTopicName("a/+".into()))
    );
    assert_eq!(
        encode_err(&Publish::new("", "x").into(), V5),
        EncodeError::Invalid(DecodeError::EmptyTopicName)
    );
    assert_eq!(
        encode_err(&Publish::new("a\0", "x").into(), V3),
        EncodeError::Invalid(DecodeError::NulInString)
    );
    assert_eq!(
        encode_err(&Publish::new("a".repeat(65_536), "x").into(), V3),
        EncodeError::StringTooLong(65_536)
    );
    // Too large for MQTT, found without a payload in memory.
    let p = Publish::new("t", Bytes::new());
    let mut out = BytesMut::new();
    assert_eq!(
        encode_publish_head(&p.head(), 268_435_453, V3, &mut out),
        Err(EncodeError::PacketTooLarge { size: 268_435_456 })
    );
    assert!(out.is_empty());
    encode_publish_head(&p.head(), 268_435_452, V3, &mut out).unwrap();
}

#[test]
fn other_refusals() {
    assert_eq!(
        encode_err(&Packet::PubAck(Ack::new(0)), V5),
        EncodeError::Invalid(DecodeError::ZeroPacketId(PacketType::PubAck))
    );
    assert_eq!(
        encode_err(&Subscribe::new(1, vec![]).into(), V5),
        EncodeError::Invalid(DecodeError::NoTopicFilters(PacketType::Subscribe))
    );
    assert_eq!(
        encode_err(&Unsubscribe::new(1, vec![]).into(), V3),
        EncodeError::Invalid(DecodeError::NoTopicFilters(PacketType::Unsubscribe))
    );
    assert_eq!(
        encode_err(&Unsubscribe::new(1, vec![s("a/#/b")]).into(), V3),
        EncodeError::Invalid(DecodeError::InvalidTopicFilter("a/#/b".into()))
    );
    let shared_no_local = Subscription {
        filter: s("$share/g/a"),
        options: SubscriptionOptions {
            no_local: true,
            ..SubscriptionOptions::default()
        },
    };
    assert!(matches!(
        encode_err(&Subscribe::new(1, vec![shared_no_local]).into(), V5),
        EncodeError::Invalid(DecodeError::NoLocalOnSharedSubscription(_))
    ));
    let refused_but_resumed = ConnAck {
        session_present: true,
        ..ConnAck::new(ReasonCode::NotAuthorized)
    };
    assert_eq!(
        encode_err(&refused_but_resumed.into(), V5),
        EncodeError::Invalid(DecodeError::SessionPresentOnFailure)
    );
    assert_eq!(
        encode_err(&Disconnect::new(ReasonCode::GrantedQoS1).into(), V5),
        EncodeError::Invalid(DecodeError::InvalidReasonCode {
            packet: PacketType::Disconnect,
            code: 1
        })
    );
    let v3_password_only = Connect {
        password: Some(Bytes::from_static(b"pw")),
        ..Connect::new(V3, "c")
    };
    assert!(matches!(
        encode_err(&v3_password_only.into(), V5),
        EncodeError::Invalid(DecodeError::InvalidConnectFlags(_))
    ));
    let wild_will = Connect {
        will: Some(Will::new("a/#", "x")),
        ..Connect::new(V5, "c")
    };
    assert!(matches!(
        encode_err(&wild_will.into(), V5),
        EncodeError::Invalid(DecodeError::InvalidTopicName(_))
    ));
    let big_will = Connect {
        will: Some(Will::new("a", vec![0u8; 65_536])),
        ..Connect::new(V5, "c")
    };
    assert_eq!(
        encode_err(&big_will.into(), V5),
        EncodeError::BinaryTooLong(65_536)
    );
}
