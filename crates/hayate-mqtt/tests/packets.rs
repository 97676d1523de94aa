//! Unit tests of every packet against byte vectors: the examples of the OASIS MQTT 3.1.1
//! and 5.0 specifications (marked "spec"), and hand-written ones. Each vector is checked
//! both ways: the bytes decode to the packet, and the packet encodes to the bytes.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use bytes::{Bytes, BytesMut};
use hayate_mqtt::{
    Ack, AckProperties, Auth, ByteStr, ConnAck, Connect, Disconnect, MAX_PACKET_SIZE, Packet,
    PacketType, ProtocolVersion, Publish, QoS, ReasonCode, RetainHandling, SubAck, Subscribe,
    Subscription, SubscriptionOptions, UnsubAck, Unsubscribe, Will, decode, decode_connect, encode,
    encode_publish_head, encoded_len, packet_len,
};

const V3: ProtocolVersion = ProtocolVersion::V3_1_1;
const V5: ProtocolVersion = ProtocolVersion::V5;

/// Decodes exactly one packet from `bytes`, checking that it consumes them all.
fn decode_one(bytes: &[u8], version: ProtocolVersion) -> Packet {
    let mut buf = BytesMut::from(bytes);
    let packet = decode(&mut buf, version, MAX_PACKET_SIZE)
        .unwrap_or_else(|e| panic!("{bytes:02x?} does not decode: {e}"))
        .expect("a complete packet");
    assert!(buf.is_empty(), "left over: {:02x?}", &buf[..]);
    packet
}

/// Encodes `packet`, checking `encoded_len` agrees.
fn encoded(packet: &Packet, version: ProtocolVersion) -> Vec<u8> {
    let mut out = BytesMut::new();
    encode(packet, version, &mut out).unwrap_or_else(|e| panic!("{packet:?}: {e}"));
    assert_eq!(encoded_len(packet, version).unwrap(), out.len());
    out.to_vec()
}

/// `bytes` decode to `packet`, and `packet` encodes to `bytes`.
fn both_ways(bytes: &[u8], version: ProtocolVersion, packet: Packet) {
    assert_eq!(decode_one(bytes, version), packet);
    assert_eq!(encoded(&packet, version), bytes);
}

fn s(text: &str) -> ByteStr {
    ByteStr::from(text)
}

// ---------------------------------------------------------------------------------------
// CONNECT

/// spec 3.1.1, 3.1.2.10 (Figure 3.6, variable header): protocol name "MQTT", level 4,
/// user name + password + will QoS 1 + will + clean session (0xCE), keep alive 10. The
/// payload is ours.
#[test]
fn connect_v3_spec_example() {
    let bytes = b"\x10\x23\x00\x04MQTT\x04\xce\x00\x0a\x00\x03cid\x00\x03w/t\x00\x03bye\x00\x04user\x00\x02pw";
    let mut will = Will::new("w/t", "bye");
    will.qos = QoS::AtLeastOnce;
    let connect = Connect {
        keep_alive: 10,
        will: Some(will),
        username: Some(s("user")),
        password: Some(Bytes::from_static(b"pw")),
        ..Connect::new(V3, "cid")
    };
    both_ways(bytes, V3, connect.into());
}

/// spec 5.0, 3.1.2.12 (the non-normative variable header example): as above with level 5
/// and a Session Expiry Interval of 10 as the only property.
#[test]
fn connect_v5_spec_example() {
    let bytes = b"\x10\x2a\x00\x04MQTT\x05\xce\x00\x0a\x05\x11\x00\x00\x00\x0a\x00\x03cid\x00\x00\x03w/t\x00\x03bye\x00\x04user\x00\x02pw";
    let mut will = Will::new("w/t", "bye");
    will.qos = QoS::AtLeastOnce;
    let mut connect = Connect {
        keep_alive: 10,
        will: Some(will),
        username: Some(s("user")),
        password: Some(Bytes::from_static(b"pw")),
        ..Connect::new(V5, "cid")
    };
    connect.properties.session_expiry_interval = Some(10);
    both_ways(bytes, V5, connect.into());
}

#[test]
fn connect_v3_1_mqisdp() {
    let bytes = b"\x10\x0f\x00\x06MQIsdp\x03\x02\x00\x3c\x00\x01a";
    let connect = Connect::new(ProtocolVersion::V3_1, "a");
    both_ways(bytes, ProtocolVersion::V3_1, connect.clone().into());
    // The CONNECT carries its version: any version argument decodes it, and encodes it.
    for version in ProtocolVersion::ALL {
        assert_eq!(decode_one(bytes, version), Packet::from(connect.clone()));
        assert_eq!(encoded(&Packet::from(connect.clone()), version), bytes);
    }
}

#[test]
fn connect_minimal_and_flags() {
    // Empty client id, no clean start, keep alive off.
    let connect = Connect {
        clean_start: false,
        keep_alive: 0,
        ..Connect::new(V3, "")
    };
    both_ways(
        b"\x10\x0c\x00\x04MQTT\x04\x00\x00\x00\x00\x00",
        V3,
        connect.into(),
    );

    // Will retained, QoS 2, empty payload.
    let mut will = Will::new("a", Bytes::new());
    will.qos = QoS::ExactlyOnce;
    will.retain = true;
    let connect = Connect {
        will: Some(will),
        ..Connect::new(V3, "c")
    };
    both_ways(
        b"\x10\x12\x00\x04MQTT\x04\x36\x00\x3c\x00\x01c\x00\x01a\x00\x00",
        V3,
        connect.into(),
    );

    // 5.0 allows a password without a user name.
    let connect = Connect {
        password: Some(Bytes::from_static(b"\x00\xff")),
        ..Connect::new(V5, "c")
    };
    both_ways(
        b"\x10\x12\x00\x04MQTT\x05\x42\x00\x3c\x00\x00\x01c\x00\x02\x00\xff",
        V5,
        connect.into(),
    );
}

#[test]
fn decode_connect_reads_the_first_packet_only() {
    let mut buf = BytesMut::from(&b"\x10\x0f\x00\x06MQIsdp\x03\x02\x00\x3c\x00\x01a\xc0\x00"[..]);
    let connect = decode_connect(&mut buf, MAX_PACKET_SIZE).unwrap().unwrap();
    assert_eq!(connect.protocol_version, ProtocolVersion::V3_1);
    assert_eq!(&buf[..], b"\xc0\x00");

    // Incomplete: need more, nothing consumed.
    let mut buf = BytesMut::from(&b"\x10\x0f\x00\x06MQ"[..]);
    assert_eq!(decode_connect(&mut buf, MAX_PACKET_SIZE), Ok(None));
    assert_eq!(buf.len(), 6);
    let mut empty = BytesMut::new();
    assert_eq!(decode_connect(&mut empty, MAX_PACKET_SIZE), Ok(None));
}

// ---------------------------------------------------------------------------------------
// CONNACK

#[test]
fn connack_v3() {
    both_ways(
        b"\x20\x02\x00\x00",
        V3,
        ConnAck::new(ReasonCode::Success).into(),
    );
    let resumed = ConnAck {
        session_present: true,
        ..ConnAck::default()
    };
    both_ways(b"\x20\x02\x01\x00", V3, resumed.into());
    // Return codes 1 to 5 and their 5.0 equivalents.
    let codes = [
        (1, ReasonCode::UnsupportedProtocolVersion),
        (2, ReasonCode::ClientIdentifierNotValid),
        (3, ReasonCode::ServerUnavailable),
        (4, ReasonCode::BadUserNameOrPassword),
        (5, ReasonCode::NotAuthorized),
    ];
    for (code, reason) in codes {
        both_ways(&[0x20, 0x02, 0x00, code], V3, ConnAck::new(reason).into());
        assert_eq!(ReasonCode::from_v3_connack(code), Some(reason));
        assert_eq!(reason.to_v3_connack(), Some(code));
    }
}

#[test]
fn connack_v5() {
    both_ways(b"\x20\x03\x00\x00\x00", V5, ConnAck::default().into());
    both_ways(
        b"\x20\x03\x00\x8a\x00",
        V5,
        ConnAck::new(ReasonCode::Banned).into(),
    );
    let mut ack = ConnAck {
        session_present: true,
        ..ConnAck::default()
    };
    ack.properties.topic_alias_maximum = Some(10);
    ack.properties.assigned_client_identifier = Some(s("x"));
    both_ways(
        b"\x20\x0a\x01\x00\x07\x12\x00\x01x\x22\x00\x0a",
        V5,
        ack.into(),
    );
}

// ---------------------------------------------------------------------------------------
// PUBLISH

/// spec 3.1.1, 3.3.2.3 (Figure 3.11): topic "a/b", packet identifier 10; payload ours.
#[test]
fn publish_v3_spec_example() {
    let publish = Publish {
        qos: QoS::AtLeastOnce,
        packet_id: Some(10),
        ..Publish::new("a/b", "hi")
    };
    both_ways(b"\x32\x09\x00\x03a/b\x00\x0ahi", V3, publish.into());
}

/// spec 5.0, 1.5.4 (Figure 1-1): the string "A𪛔" is 00 05 41 F0 AA 9B 94.
#[test]
fn publish_v5_utf8_spec_example() {
    let publish = Publish::new("A\u{2A6D4}", "x");
    both_ways(
        b"\x30\x09\x00\x05A\xf0\xaa\x9b\x94\x00x",
        V5,
        publish.into(),
    );
}

#[test]
fn publish_flags() {
    // QoS 0, retained, empty payload.
    let publish = Publish {
        retain: true,
        ..Publish::new("t", Bytes::new())
    };
    both_ways(b"\x31\x03\x00\x01t", V3, publish.into());
    // QoS 2, DUP.
    let publish = Publish {
        dup: true,
        qos: QoS::ExactlyOnce,
        packet_id: Some(0xffff),
        ..Publish::new("t", "p")
    };
    both_ways(b"\x3c\x06\x00\x01t\xff\xffp", V3, publish.into());
}

#[test]
fn publish_v5_topic_alias_with_empty_topic() {
    let mut publish = Publish::new("", "p");
    publish.properties.topic_alias = Some(3);
    both_ways(b"\x30\x07\x00\x00\x03\x23\x00\x03p", V5, publish.into());
}

#[test]
fn publish_payload_is_a_slice_of_the_read_buffer() {
    let mut buf = BytesMut::from(&b"\x30\x08\x00\x03a/bxyz\xc0\x00"[..]);
    let start = buf.as_ptr() as usize;
    let Some(Packet::Publish(p)) = decode(&mut buf, V3, MAX_PACKET_SIZE).unwrap() else {
        panic!("expected PUBLISH");
    };
    assert_eq!(&p.payload[..], b"xyz");
    assert_eq!(p.payload.as_ptr() as usize, start + 7, "payload not copied");
    assert_eq!(p.topic.as_ptr() as usize, start + 4, "topic not copied");
    assert_eq!(
        decode(&mut buf, V3, MAX_PACKET_SIZE).unwrap(),
        Some(Packet::PingReq)
    );
}

#[test]
fn publish_head_then_payload_equals_encode() {
    for version in [V3, V5] {
        let mut publish = Publish {
            qos: QoS::AtLeastOnce,
            packet_id: Some(7),
            retain: true,
            ..Publish::new("x/y", vec![1u8; 300])
        };
        if version == V5 {
            publish.properties.message_expiry_interval = Some(30);
            publish.properties.subscription_identifiers = vec![1, 300];
        }
        let mut head = BytesMut::new();
        encode_publish_head(&publish.head(), publish.payload.len(), version, &mut head).unwrap();
        head.extend_from_slice(&publish.payload);
        assert_eq!(
            &head[..],
            &encoded(&Packet::from(publish.clone()), version)[..]
        );
        assert_eq!(decode_one(&head, version), Packet::from(publish));
    }
}

/// spec 5.0, 1.5.5 (Table 1-1): variable byte integer sizes at every boundary, as the
/// remaining length of a PUBLISH (written without its payload).
#[test]
fn remaining_length_spec_boundaries() {
    let table: [(u32, &[u8]); 7] = [
        (127, b"\x7f"),
        (128, b"\x80\x01"),
        (16_383, b"\xff\x7f"),
        (16_384, b"\x80\x80\x01"),
        (2_097_151, b"\xff\xff\x7f"),
        (2_097_152, b"\x80\x80\x80\x01"),
        (268_435_455, b"\xff\xff\xff\x7f"),
    ];
    let publish = Publish::new("t", Bytes::new()); // 3 bytes of variable header
    for (remaining, vbi) in table {
        let mut head = BytesMut::new();
        encode_publish_head(&publish.head(), remaining as usize - 3, V3, &mut head).unwrap();
        assert_eq!(&head[1..1 + vbi.len()], vbi, "remaining length {remaining}");
        let size = 1 + vbi.len() + remaining as usize;
        assert_eq!(packet_len(&head, V3, MAX_PACKET_SIZE), Ok(Some(size)));
    }
    // 0: a PINGREQ.
    both_ways(b"\xc0\x00", V3, Packet::PingReq);
    assert_eq!(packet_len(b"\xc0", V3, MAX_PACKET_SIZE), Ok(None));
    assert_eq!(packet_len(b"\x30\xff\xff", V3, MAX_PACKET_SIZE), Ok(None));
}

// ---------------------------------------------------------------------------------------
// PUBACK, PUBREC, PUBREL, PUBCOMP

#[test]
fn acks_v3() {
    both_ways(b"\x40\x02\x00\x0a", V3, Packet::PubAck(Ack::new(10)));
    both_ways(b"\x50\x02\x00\x0a", V3, Packet::PubRec(Ack::new(10)));
    both_ways(b"\x62\x02\x00\x0a", V3, Packet::PubRel(Ack::new(10)));
    both_ways(b"\x70\x02\x00\x0a", V3, Packet::PubComp(Ack::new(10)));
}

#[test]
fn acks_v5_short_forms() {
    // Success without properties: the packet identifier only.
    both_ways(b"\x40\x02\x00\x01", V5, Packet::PubAck(Ack::new(1)));
    // A reason code without properties: no property length.
    let no_match = Ack::with_reason(1, ReasonCode::NoMatchingSubscribers);
    both_ways(b"\x40\x03\x00\x01\x10", V5, Packet::PubAck(no_match));
    let not_found = Ack::with_reason(2, ReasonCode::PacketIdentifierNotFound);
    both_ways(
        b"\x62\x03\x00\x02\x92",
        V5,
        Packet::PubRel(not_found.clone()),
    );
    both_ways(b"\x70\x03\x00\x02\x92", V5, Packet::PubComp(not_found));
    // A reason code and properties.
    let mut ack = Ack::with_reason(1, ReasonCode::NoMatchingSubscribers);
    ack.properties.reason_string = Some(s("r"));
    both_ways(
        b"\x40\x08\x00\x01\x10\x04\x1f\x00\x01r",
        V5,
        Packet::PubAck(ack),
    );
    // Longer forms than needed decode too.
    assert_eq!(
        decode_one(b"\x40\x04\x00\x01\x00\x00", V5),
        Packet::PubAck(Ack::new(1))
    );
    assert_eq!(
        decode_one(b"\x50\x03\x00\x01\x00", V5),
        Packet::PubRec(Ack::new(1))
    );
}

#[test]
fn ack_with_properties() {
    let ack = Ack {
        packet_id: 7,
        reason_code: ReasonCode::UnspecifiedError,
        properties: AckProperties {
            reason_string: Some(s("nope")),
            user_properties: vec![(s("k"), s("v"))],
        },
    };
    both_ways(
        b"\x50\x12\x00\x07\x80\x0e\x1f\x00\x04nope\x26\x00\x01k\x00\x01v",
        V5,
        Packet::PubRec(ack),
    );
}

// ---------------------------------------------------------------------------------------
// SUBSCRIBE, SUBACK, UNSUBSCRIBE, UNSUBACK

/// spec 3.1.1, 3.8.3 (Figure 3.22): "a/b" QoS 1 and "c/d" QoS 2, packet identifier 10.
#[test]
fn subscribe_v3_spec_example() {
    let subscribe = Subscribe::new(
        10,
        vec![
            Subscription::new("a/b", QoS::AtLeastOnce),
            Subscription::new("c/d", QoS::ExactlyOnce),
        ],
    );
    both_ways(
        b"\x82\x0e\x00\x0a\x00\x03a/b\x01\x00\x03c/d\x02",
        V3,
        subscribe.into(),
    );
}

#[test]
fn subscribe_v5_options_and_identifier() {
    let options = SubscriptionOptions {
        qos: QoS::AtLeastOnce,
        no_local: true,
        retain_as_published: true,
        retain_handling: RetainHandling::DoNotSend,
    };
    let mut subscribe = Subscribe::new(
        1,
        vec![Subscription {
            filter: s("a/+"),
            options,
        }],
    );
    subscribe.properties.subscription_identifier = Some(5);
    both_ways(
        b"\x82\x0b\x00\x01\x02\x0b\x05\x00\x03a/+\x2d",
        V5,
        subscribe.into(),
    );

    // Retain handling 1 on a shared subscription.
    let options = SubscriptionOptions {
        retain_handling: RetainHandling::SendAtSubscribeIfNew,
        ..SubscriptionOptions::default()
    };
    let subscribe = Subscribe::new(
        2,
        vec![Subscription {
            filter: s("$share/g/#"),
            options,
        }],
    );
    both_ways(
        b"\x82\x10\x00\x02\x00\x00\x0a$share/g/#\x10",
        V5,
        subscribe.into(),
    );
}

/// spec 3.1.1, 3.9.3 (Figure 3.26): granted QoS 0, granted QoS 2, failure.
#[test]
fn suback_v3_spec_example() {
    let suback = SubAck::new(
        10,
        vec![
            ReasonCode::GRANTED_QOS_0,
            ReasonCode::GrantedQoS2,
            ReasonCode::UnspecifiedError,
        ],
    );
    both_ways(b"\x90\x05\x00\x0a\x00\x02\x80", V3, suback.into());
}

#[test]
fn suback_v5() {
    let suback = SubAck::new(
        1,
        vec![
            ReasonCode::GrantedQoS1,
            ReasonCode::WildcardSubscriptionsNotSupported,
        ],
    );
    both_ways(b"\x90\x05\x00\x01\x00\x01\xa2", V5, suback.into());
    let mut suback = SubAck::new(1, vec![ReasonCode::Success, ReasonCode::NotAuthorized]);
    suback.properties.user_properties = vec![(s("k"), s("v"))];
    both_ways(
        b"\x90\x0c\x00\x01\x07\x26\x00\x01k\x00\x01v\x00\x87",
        V5,
        suback.into(),
    );
}

/// spec 3.1.1, 3.10.3 (Figure 3.30): "a/b" and "c/d", packet identifier 10.
#[test]
fn unsubscribe_v3_spec_example() {
    let unsubscribe = Unsubscribe::new(10, vec![s("a/b"), s("c/d")]);
    both_ways(
        b"\xa2\x0c\x00\x0a\x00\x03a/b\x00\x03c/d",
        V3,
        unsubscribe.into(),
    );
}

#[test]
fn unsubscribe_v5() {
    both_ways(
        b"\xa2\x06\x00\x01\x00\x00\x01#",
        V5,
        Unsubscribe::new(1, vec![s("#")]).into(),
    );
    let mut unsubscribe = Unsubscribe::new(1, vec![s("#")]);
    unsubscribe.properties.user_properties = vec![(s("k"), s("v"))];
    both_ways(
        b"\xa2\x0d\x00\x01\x07\x26\x00\x01k\x00\x01v\x00\x01#",
        V5,
        unsubscribe.into(),
    );
}

#[test]
fn unsuback() {
    both_ways(b"\xb0\x02\x00\x0a", V3, UnsubAck::new(10, vec![]).into());
    both_ways(
        b"\xb0\x04\x00\x01\x00\x11",
        V5,
        UnsubAck::new(1, vec![ReasonCode::NoSubscriptionExisted]).into(),
    );
    both_ways(
        b"\xb0\x05\x00\x01\x00\x00\x8f",
        V5,
        UnsubAck::new(1, vec![ReasonCode::Success, ReasonCode::TopicFilterInvalid]).into(),
    );
}

// ---------------------------------------------------------------------------------------
// PINGREQ, PINGRESP, DISCONNECT, AUTH

#[test]
fn ping() {
    for version in [ProtocolVersion::V3_1, V3, V5] {
        both_ways(b"\xc0\x00", version, Packet::PingReq);
        both_ways(b"\xd0\x00", version, Packet::PingResp);
    }
}

#[test]
fn disconnect() {
    both_ways(b"\xe0\x00", V3, Disconnect::default().into());
    both_ways(
        b"\xe0\x00",
        V5,
        Disconnect::new(ReasonCode::NORMAL_DISCONNECTION).into(),
    );
    both_ways(
        b"\xe0\x01\x04",
        V5,
        Disconnect::new(ReasonCode::DisconnectWithWillMessage).into(),
    );
    let mut d = Disconnect::new(ReasonCode::Success);
    d.properties.session_expiry_interval = Some(60);
    both_ways(b"\xe0\x07\x00\x05\x11\x00\x00\x00\x3c", V5, d.into());
    // A reason code with an empty property block decodes too.
    assert_eq!(
        decode_one(b"\xe0\x02\x8e\x00", V5),
        Packet::from(Disconnect::new(ReasonCode::SessionTakenOver))
    );
}

#[test]
fn auth() {
    both_ways(b"\xf0\x00", V5, Auth::default().into());
    let mut auth = Auth::new(ReasonCode::ContinueAuthentication);
    auth.properties.authentication_method = Some(s("SCRAM"));
    auth.properties.authentication_data = Some(Bytes::from_static(b"\x01\x02"));
    both_ways(
        b"\xf0\x0f\x18\x0d\x15\x00\x05SCRAM\x16\x00\x02\x01\x02",
        V5,
        auth.into(),
    );
    // A reason code always comes with a property length in AUTH (3.15.2.1)...
    both_ways(
        b"\xf0\x02\x19\x00",
        V5,
        Auth::new(ReasonCode::ReAuthenticate).into(),
    );
    // ...but a lone reason code is read anyway.
    assert_eq!(
        decode_one(b"\xf0\x01\x19", V5),
        Packet::from(Auth::new(ReasonCode::ReAuthenticate))
    );
}

// ---------------------------------------------------------------------------------------
// Streams and misc

#[test]
fn many_packets_in_one_buffer_and_byte_by_byte() {
    let packets: Vec<Packet> = vec![
        Connect::new(V5, "c").into(),
        Publish::new("a", "1").into(),
        Packet::PubAck(Ack::new(3)),
        Packet::PingReq,
        Subscribe::new(4, vec![Subscription::new("#", QoS::ExactlyOnce)]).into(),
        Disconnect::default().into(),
    ];
    let mut wire = BytesMut::new();
    for p in &packets {
        encode(p, V5, &mut wire).unwrap();
    }
    let all = wire.clone();
    let mut got = Vec::new();
    while let Some(p) = decode(&mut wire, V5, MAX_PACKET_SIZE).unwrap() {
        got.push(p);
    }
    assert_eq!(got, packets);
    assert!(wire.is_empty());

    let mut buf = BytesMut::new();
    let mut got = Vec::new();
    for &b in &all[..] {
        buf.extend_from_slice(&[b]);
        while let Some(p) = decode(&mut buf, V5, MAX_PACKET_SIZE).unwrap() {
            got.push(p);
        }
    }
    assert_eq!(got, packets);
}

#[test]
fn packet_types_and_versions() {
    for (i, t) in PacketType::ALL.into_iter().enumerate() {
        assert_eq!(usize::from(t.as_u8()), i + 1);
        assert_eq!(PacketType::from_u8(t.as_u8()), Some(t));
        assert_eq!(t.to_string(), t.name());
    }
    assert_eq!(PacketType::from_u8(0), None);
    assert_eq!(PacketType::from_u8(16), None);
    for v in ProtocolVersion::ALL {
        assert_eq!(ProtocolVersion::from_level(v.level()), Some(v));
    }
    assert_eq!(ProtocolVersion::V3_1_1.to_string(), "3.1.1");
    assert_eq!(ProtocolVersion::V5.protocol_name(), "MQTT");
    assert_eq!(ProtocolVersion::V3_1.protocol_name(), "MQIsdp");
    for q in QoS::ALL {
        assert_eq!(QoS::from_u8(q.as_u8()), Some(q));
    }
    assert_eq!(QoS::from_u8(3), None);
}

#[test]
fn reason_codes() {
    assert_eq!(ReasonCode::ALL.len(), 43);
    for &code in ReasonCode::ALL {
        assert_eq!(ReasonCode::from_u8(code.as_u8()), Some(code));
        assert_eq!(code.is_error(), code.as_u8() >= 0x80);
        assert!(!code.name().is_empty());
    }
    assert_eq!(ReasonCode::from_u8(0x03), None);
    assert_eq!(ReasonCode::PacketTooLarge.as_u8(), 0x95);
    assert_eq!(
        ReasonCode::TopicNameInvalid.to_string(),
        "0x90 Topic Name invalid"
    );
    assert_eq!(
        ReasonCode::granted(QoS::AtLeastOnce),
        ReasonCode::GrantedQoS1
    );
    // Only AUTH allows Continue authentication; only 5.0 has AUTH.
    assert!(ReasonCode::ContinueAuthentication.allowed_in(PacketType::Auth, V5));
    assert!(!ReasonCode::ContinueAuthentication.allowed_in(PacketType::Disconnect, V5));
    assert!(!ReasonCode::Success.allowed_in(PacketType::Auth, V3));
    // Every 5.0 code is allowed somewhere.
    for &code in ReasonCode::ALL {
        assert!(
            PacketType::ALL.iter().any(|&p| code.allowed_in(p, V5)),
            "{code} is allowed nowhere"
        );
    }
}
