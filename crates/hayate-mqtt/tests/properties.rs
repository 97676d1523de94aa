//! Unit tests of MQTT 5.0 properties: every identifier in every packet (allowed or not,
//! once or twice), every property of every packet with its type, and value checks.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use bytes::{Bytes, BytesMut};
use hayate_mqtt::{
    Ack, AckProperties, Auth, ByteStr, ConnAck, ConnAckProperties, Connect, ConnectProperties,
    DecodeError, Disconnect, EncodeError, MAX_PACKET_SIZE, MAX_VAR_INT, Packet, PacketType,
    PayloadFormat, PropertyContext, PropertyId, PropertyType, ProtocolVersion, Publish, QoS,
    ReasonCode, Subscribe, Subscription, Will, decode, encode,
};

const V5: ProtocolVersion = ProtocolVersion::V5;

fn s(text: &str) -> ByteStr {
    ByteStr::from(text)
}

fn cat(parts: &[&[u8]]) -> Vec<u8> {
    parts.concat()
}

/// A packet: first byte, remaining length, body.
fn packet(first: u8, body: &[u8]) -> Vec<u8> {
    let mut out = vec![first];
    let mut n = body.len();
    loop {
        let mut b = (n % 128) as u8;
        n /= 128;
        if n > 0 {
            b |= 0x80;
        }
        out.push(b);
        if n == 0 {
            break;
        }
    }
    out.extend_from_slice(body);
    out
}

/// A 5.0 packet of kind `context` carrying the properties `props` (without their length).
fn wrap(context: PropertyContext, props: &[u8]) -> Vec<u8> {
    use PropertyContext as C;
    assert!(props.len() < 128);
    let block = cat(&[&[props.len() as u8][..], props]);
    let b = &block[..];
    match context {
        C::Connect => packet(
            0x10,
            &cat(&[b"\x00\x04MQTT\x05\x02\x00\x3c", b, b"\x00\x01c"]),
        ),
        C::Will => packet(
            0x10,
            &cat(&[
                b"\x00\x04MQTT\x05\x06\x00\x3c\x00\x00\x01c",
                b,
                b"\x00\x01w\x00\x00",
            ]),
        ),
        C::ConnAck => packet(0x20, &cat(&[b"\x00\x00", b])),
        C::Publish => packet(0x32, &cat(&[b"\x00\x01t\x00\x01", b])),
        C::PubAck => packet(0x40, &cat(&[b"\x00\x01\x00", b])),
        C::PubRec => packet(0x50, &cat(&[b"\x00\x01\x00", b])),
        C::PubRel => packet(0x62, &cat(&[b"\x00\x01\x00", b])),
        C::PubComp => packet(0x70, &cat(&[b"\x00\x01\x00", b])),
        C::Subscribe => packet(0x82, &cat(&[b"\x00\x01", b, b"\x00\x01t\x00"])),
        C::SubAck => packet(0x90, &cat(&[b"\x00\x01", b, b"\x00"])),
        C::Unsubscribe => packet(0xa2, &cat(&[b"\x00\x01", b, b"\x00\x01t"])),
        C::UnsubAck => packet(0xb0, &cat(&[b"\x00\x01", b, b"\x00"])),
        C::Disconnect => packet(0xe0, &cat(&[b"\x00", b])),
        C::Auth => packet(0xf0, &cat(&[b"\x00", b])),
    }
}

/// One property with a valid value of its type.
fn sample(id: PropertyId) -> Vec<u8> {
    let value: &[u8] = match id.property_type() {
        PropertyType::Byte => b"\x01",
        PropertyType::TwoByteInteger => b"\x00\x05",
        PropertyType::FourByteInteger => b"\x00\x00\x00\x05",
        PropertyType::VariableByteInteger => b"\x05",
        PropertyType::Utf8String => b"\x00\x01r",
        PropertyType::BinaryData => b"\x00\x01\xff",
        PropertyType::Utf8StringPair => b"\x00\x01k\x00\x01v",
    };
    cat(&[&[id.as_u8()][..], value])
}

fn decode_v5(bytes: &[u8]) -> Result<Packet, DecodeError> {
    let mut buf = BytesMut::from(bytes);
    let before = buf.clone();
    match decode(&mut buf, V5, MAX_PACKET_SIZE) {
        Ok(Some(p)) => {
            assert!(buf.is_empty(), "left over: {:02x?}", &buf[..]);
            Ok(p)
        }
        Ok(None) => panic!("{bytes:02x?} is incomplete"),
        Err(e) => {
            assert_eq!(buf, before, "an error consumes nothing");
            Err(e)
        }
    }
}

fn encode_v5(p: &Packet) -> Vec<u8> {
    let mut out = BytesMut::new();
    encode(p, V5, &mut out).unwrap_or_else(|e| panic!("{p:?}: {e}"));
    out.to_vec()
}

fn encode_err(p: &Packet) -> EncodeError {
    let mut out = BytesMut::new();
    let e = encode(p, V5, &mut out).expect_err("expected an encode error");
    assert!(out.is_empty(), "nothing is written on error");
    e
}

/// Decodes `bytes`, checks they are the packet's canonical encoding, returns the packet.
fn both_ways(bytes: &[u8]) -> Packet {
    let p = decode_v5(bytes).unwrap_or_else(|e| panic!("{bytes:02x?}: {e}"));
    assert_eq!(encode_v5(&p), bytes, "{p:?}");
    p
}

// ---------------------------------------------------------------------------------------
// The table of section 2.2.2.2

#[test]
fn there_are_27_properties_with_their_types() {
    use PropertyId as P;
    use PropertyType as T;
    assert_eq!(PropertyId::ALL.len(), 27);
    let expect = [
        (P::PayloadFormatIndicator, 0x01, T::Byte),
        (P::MessageExpiryInterval, 0x02, T::FourByteInteger),
        (P::ContentType, 0x03, T::Utf8String),
        (P::ResponseTopic, 0x08, T::Utf8String),
        (P::CorrelationData, 0x09, T::BinaryData),
        (P::SubscriptionIdentifier, 0x0b, T::VariableByteInteger),
        (P::SessionExpiryInterval, 0x11, T::FourByteInteger),
        (P::AssignedClientIdentifier, 0x12, T::Utf8String),
        (P::ServerKeepAlive, 0x13, T::TwoByteInteger),
        (P::AuthenticationMethod, 0x15, T::Utf8String),
        (P::AuthenticationData, 0x16, T::BinaryData),
        (P::RequestProblemInformation, 0x17, T::Byte),
        (P::WillDelayInterval, 0x18, T::FourByteInteger),
        (P::RequestResponseInformation, 0x19, T::Byte),
        (P::ResponseInformation, 0x1a, T::Utf8String),
        (P::ServerReference, 0x1c, T::Utf8String),
        (P::ReasonString, 0x1f, T::Utf8String),
        (P::ReceiveMaximum, 0x21, T::TwoByteInteger),
        (P::TopicAliasMaximum, 0x22, T::TwoByteInteger),
        (P::TopicAlias, 0x23, T::TwoByteInteger),
        (P::MaximumQoS, 0x24, T::Byte),
        (P::RetainAvailable, 0x25, T::Byte),
        (P::UserProperty, 0x26, T::Utf8StringPair),
        (P::MaximumPacketSize, 0x27, T::FourByteInteger),
        (P::WildcardSubscriptionAvailable, 0x28, T::Byte),
        (P::SubscriptionIdentifierAvailable, 0x29, T::Byte),
        (P::SharedSubscriptionAvailable, 0x2a, T::Byte),
    ];
    for (id, byte, ty) in expect {
        assert_eq!(id.as_u8(), byte, "{id:?}");
        assert_eq!(id.property_type(), ty, "{id:?}");
        assert_eq!(PropertyId::from_u8(byte), Some(id));
    }
    assert_eq!(PropertyId::TopicAlias.to_string(), "Topic Alias (0x23)");
    let defined: Vec<u8> = PropertyId::ALL.iter().map(|p| p.as_u8()).collect();
    for b in 0..=255u8 {
        assert_eq!(PropertyId::from_u8(b).is_some(), defined.contains(&b));
    }
}

#[test]
fn where_each_property_is_allowed() {
    use PropertyContext as C;
    use PropertyId as P;
    // Spot checks of the table; the test below checks the decoder follows `allowed_in`.
    assert!(P::PayloadFormatIndicator.allowed_in(C::Publish));
    assert!(P::PayloadFormatIndicator.allowed_in(C::Will));
    assert!(!P::PayloadFormatIndicator.allowed_in(C::Connect));
    assert!(P::SubscriptionIdentifier.allowed_in(C::Subscribe));
    assert!(!P::SubscriptionIdentifier.allowed_in(C::Unsubscribe));
    assert!(P::WillDelayInterval.allowed_in(C::Will));
    assert!(!P::WillDelayInterval.allowed_in(C::Publish));
    assert!(P::ReasonString.allowed_in(C::PubComp));
    assert!(!P::ReasonString.allowed_in(C::Publish));
    assert!(P::ServerReference.allowed_in(C::Disconnect));
    assert!(P::AuthenticationData.allowed_in(C::Auth));
    assert!(!P::TopicAlias.allowed_in(C::Will));
    for ctx in PropertyContext::ALL {
        assert!(P::UserProperty.allowed_in(ctx));
        assert!(P::UserProperty.repeatable_in(ctx));
    }
    assert!(P::SubscriptionIdentifier.repeatable_in(C::Publish));
    assert!(!P::SubscriptionIdentifier.repeatable_in(C::Subscribe));
    // How many contexts each property has, from the specification's table.
    let count = |id: PropertyId| C::ALL.iter().filter(|&&c| id.allowed_in(c)).count();
    assert_eq!(count(P::ReasonString), 9);
    assert_eq!(count(P::SessionExpiryInterval), 3);
    assert_eq!(count(P::MaximumQoS), 1);
}

#[test]
fn every_property_in_every_packet() {
    for &id in PropertyId::ALL {
        for ctx in PropertyContext::ALL {
            let bytes = wrap(ctx, &sample(id));
            let result = decode_v5(&bytes);
            if !id.allowed_in(ctx) {
                assert_eq!(
                    result,
                    Err(DecodeError::PropertyNotAllowed {
                        property: id,
                        context: ctx
                    }),
                    "{id:?} in {ctx:?}"
                );
                assert_eq!(
                    result.unwrap_err().reason_code(),
                    ReasonCode::MalformedPacket
                );
            } else if (id, ctx) == (PropertyId::AuthenticationData, PropertyContext::Connect) {
                assert_eq!(result, Err(DecodeError::AuthDataWithoutMethod));
            } else {
                let p = result.unwrap_or_else(|e| panic!("{id:?} in {ctx:?}: {e}"));
                assert_eq!(encode_v5(&p), bytes, "{id:?} in {ctx:?}");
            }
        }
    }
}

#[test]
fn every_property_twice() {
    for &id in PropertyId::ALL {
        for ctx in PropertyContext::ALL {
            if !id.allowed_in(ctx) {
                continue;
            }
            let method = if ctx == PropertyContext::Connect && id == PropertyId::AuthenticationData
            {
                sample(PropertyId::AuthenticationMethod)
            } else {
                Vec::new()
            };
            let bytes = wrap(ctx, &cat(&[&method, &sample(id), &sample(id)]));
            let result = decode_v5(&bytes);
            if id.repeatable_in(ctx) {
                let p = result.unwrap_or_else(|e| panic!("{id:?} in {ctx:?}: {e}"));
                assert_eq!(encode_v5(&p), bytes, "{id:?} in {ctx:?}");
            } else {
                assert_eq!(
                    result,
                    Err(DecodeError::DuplicateProperty(id)),
                    "{id:?} in {ctx:?}"
                );
                assert_eq!(result.unwrap_err().reason_code(), ReasonCode::ProtocolError);
            }
        }
    }
}

// ---------------------------------------------------------------------------------------
// Every property of every packet, typed

#[test]
fn publish_properties() {
    let props: &[u8] = b"\x01\x01\
        \x02\x00\x00\x0e\x10\
        \x23\x00\x07\
        \x08\x00\x05reply\
        \x09\x00\x02\x01\x02\
        \x26\x00\x01a\x00\x01b\
        \x26\x00\x01a\x00\x01c\
        \x0b\x80\x01\
        \x0b\x01\
        \x03\x00\x04json";
    assert_eq!(props.len(), 49);
    let bytes = cat(&[b"\x33\x3b\x00\x03t/1\x00\x2a\x31", props, b"{}"]);
    let Packet::Publish(p) = both_ways(&bytes) else {
        panic!("expected PUBLISH")
    };
    assert!(p.retain);
    assert_eq!((p.qos, p.packet_id), (QoS::AtLeastOnce, Some(42)));
    let props = &p.properties;
    assert_eq!(props.payload_format_indicator, Some(PayloadFormat::Utf8));
    assert_eq!(props.message_expiry_interval, Some(3600));
    assert_eq!(props.topic_alias, Some(7));
    assert_eq!(props.response_topic, Some(s("reply")));
    assert_eq!(
        props.correlation_data,
        Some(Bytes::from_static(b"\x01\x02"))
    );
    assert_eq!(
        props.user_properties,
        vec![(s("a"), s("b")), (s("a"), s("c"))],
        "repeated names are kept, in order"
    );
    assert_eq!(props.subscription_identifiers, vec![128, 1]);
    assert_eq!(props.content_type, Some(s("json")));
    assert_eq!(&p.payload[..], b"{}");
}

#[test]
fn connect_and_will_properties() {
    let props: &[u8] = b"\x11\x00\x00\x00\x3c\
        \x21\x00\x14\
        \x27\x00\x01\x00\x00\
        \x22\x00\x0a\
        \x19\x01\
        \x17\x00\
        \x15\x00\x05SCRAM\
        \x16\x00\x03abc\
        \x26\x00\x01k\x00\x01v";
    assert_eq!(props.len(), 41);
    let will_props: &[u8] = b"\x18\x00\x00\x00\x05\
        \x01\x00\
        \x02\x00\x00\x00\x0a\
        \x03\x00\x04text\
        \x08\x00\x01r\
        \x09\x00\x01\x07\
        \x26\x00\x01k\x00\x01v";
    assert_eq!(will_props.len(), 34);
    let bytes = cat(&[
        b"\x10\x6c\x00\x04MQTT\x05\xf6\x00\x00\x29",
        props,
        b"\x00\x02id\x22",
        will_props,
        b"\x00\x03w/1\x00\x04gone\x00\x01u\x00\x01p",
    ]);
    let Packet::Connect(c) = both_ways(&bytes) else {
        panic!("expected CONNECT")
    };
    let expected = Connect {
        keep_alive: 0,
        will: Some(Will {
            topic: s("w/1"),
            payload: Bytes::from_static(b"gone"),
            qos: QoS::ExactlyOnce,
            retain: true,
            properties: hayate_mqtt::WillProperties {
                will_delay_interval: Some(5),
                payload_format_indicator: Some(PayloadFormat::Unspecified),
                message_expiry_interval: Some(10),
                content_type: Some(s("text")),
                response_topic: Some(s("r")),
                correlation_data: Some(Bytes::from_static(b"\x07")),
                user_properties: vec![(s("k"), s("v"))],
            },
        }),
        username: Some(s("u")),
        password: Some(Bytes::from_static(b"p")),
        properties: ConnectProperties {
            session_expiry_interval: Some(60),
            receive_maximum: Some(20),
            maximum_packet_size: Some(65536),
            topic_alias_maximum: Some(10),
            request_response_information: Some(true),
            request_problem_information: Some(false),
            authentication_method: Some(s("SCRAM")),
            authentication_data: Some(Bytes::from_static(b"abc")),
            user_properties: vec![(s("k"), s("v"))],
        },
        ..Connect::new(V5, "id")
    };
    assert_eq!(*c, expected);
}

#[test]
fn connack_properties() {
    let props: &[u8] = b"\x11\x00\x00\x00\x3c\
        \x21\x00\x0a\
        \x24\x01\
        \x25\x00\
        \x27\x00\x00\x10\x00\
        \x12\x00\x03abc\
        \x22\x00\x05\
        \x1f\x00\x02ok\
        \x26\x00\x01k\x00\x01v\
        \x28\x00\
        \x29\x00\
        \x2a\x01\
        \x13\x00\x1e\
        \x1a\x00\x04resp\
        \x1c\x00\x03srv\
        \x15\x00\x05SCRAM\
        \x16\x00\x01\x00";
    assert_eq!(props.len(), 72);
    let bytes = cat(&[b"\x20\x4b\x01\x00\x48", props]);
    let Packet::ConnAck(ack) = both_ways(&bytes) else {
        panic!("expected CONNACK")
    };
    let expected = ConnAck {
        session_present: true,
        reason_code: ReasonCode::Success,
        properties: ConnAckProperties {
            session_expiry_interval: Some(60),
            receive_maximum: Some(10),
            maximum_qos: Some(QoS::AtLeastOnce),
            retain_available: Some(false),
            maximum_packet_size: Some(4096),
            assigned_client_identifier: Some(s("abc")),
            topic_alias_maximum: Some(5),
            reason_string: Some(s("ok")),
            user_properties: vec![(s("k"), s("v"))],
            wildcard_subscription_available: Some(false),
            subscription_identifiers_available: Some(false),
            shared_subscription_available: Some(true),
            server_keep_alive: Some(30),
            response_information: Some(s("resp")),
            server_reference: Some(s("srv")),
            authentication_method: Some(s("SCRAM")),
            authentication_data: Some(Bytes::from_static(b"\x00")),
        },
    };
    assert_eq!(*ack, expected);
}

#[test]
fn disconnect_auth_subscribe_and_ack_properties() {
    let Packet::Disconnect(d) = both_ways(
        b"\xe0\x1a\x8b\x18\x11\x00\x00\x00\x00\x1f\x00\x03bye\x26\x00\x01k\x00\x01v\x1c\x00\x03srv",
    ) else {
        panic!("expected DISCONNECT")
    };
    assert_eq!(d.reason_code, ReasonCode::ServerShuttingDown);
    assert_eq!(d.properties.session_expiry_interval, Some(0));
    assert_eq!(d.properties.reason_string, Some(s("bye")));
    assert_eq!(d.properties.user_properties, vec![(s("k"), s("v"))]);
    assert_eq!(d.properties.server_reference, Some(s("srv")));

    let Packet::Auth(a) = both_ways(
        b"\xf0\x1b\x18\x19\x15\x00\x05SCRAM\x16\x00\x02\x01\x02\x1f\x00\x02go\x26\x00\x01k\x00\x01v",
    ) else {
        panic!("expected AUTH")
    };
    assert_eq!(a.reason_code, ReasonCode::ContinueAuthentication);
    assert_eq!(a.properties.authentication_method, Some(s("SCRAM")));
    assert_eq!(
        a.properties.authentication_data,
        Some(Bytes::from_static(b"\x01\x02"))
    );
    assert_eq!(a.properties.reason_string, Some(s("go")));
    assert_eq!(a.properties.user_properties, vec![(s("k"), s("v"))]);

    let Packet::Subscribe(sub) =
        both_ways(b"\x82\x12\x00\x01\x0b\x0b\x80\x80\x01\x26\x00\x01k\x00\x01v\x00\x01#\x01")
    else {
        panic!("expected SUBSCRIBE")
    };
    assert_eq!(sub.properties.subscription_identifier, Some(16_384));
    assert_eq!(sub.properties.user_properties, vec![(s("k"), s("v"))]);
    assert_eq!(
        sub.subscriptions,
        vec![Subscription::new("#", QoS::AtLeastOnce)]
    );

    let ack = Ack {
        packet_id: 1,
        reason_code: ReasonCode::Success,
        properties: AckProperties {
            reason_string: Some(s("fine")),
            user_properties: vec![],
        },
    };
    assert_eq!(
        both_ways(b"\x70\x0b\x00\x01\x00\x07\x1f\x00\x04fine"),
        Packet::PubComp(ack)
    );
}

// ---------------------------------------------------------------------------------------
// Values

#[test]
fn invalid_values_are_protocol_errors() {
    use PropertyContext as C;
    use PropertyId as P;
    let cases: [(PropertyContext, &[u8], PropertyId, u32); 12] = [
        (C::Connect, b"\x21\x00\x00", P::ReceiveMaximum, 0),
        (C::ConnAck, b"\x21\x00\x00", P::ReceiveMaximum, 0),
        (C::Connect, b"\x27\x00\x00\x00\x00", P::MaximumPacketSize, 0),
        (C::Publish, b"\x23\x00\x00", P::TopicAlias, 0),
        (C::Subscribe, b"\x0b\x00", P::SubscriptionIdentifier, 0),
        (C::Connect, b"\x17\x02", P::RequestProblemInformation, 2),
        (C::Connect, b"\x19\x02", P::RequestResponseInformation, 2),
        (C::Publish, b"\x01\x02", P::PayloadFormatIndicator, 2),
        (C::ConnAck, b"\x24\x02", P::MaximumQoS, 2),
        (C::ConnAck, b"\x25\x02", P::RetainAvailable, 2),
        (
            C::ConnAck,
            b"\x28\xff",
            P::WildcardSubscriptionAvailable,
            255,
        ),
        (C::ConnAck, b"\x2a\x03", P::SharedSubscriptionAvailable, 3),
    ];
    for (ctx, prop, property, value) in cases {
        let e = decode_v5(&wrap(ctx, prop)).unwrap_err();
        assert_eq!(e, DecodeError::InvalidPropertyValue { property, value });
        assert_eq!(e.reason_code(), ReasonCode::ProtocolError);
    }
    let e = decode_v5(&wrap(C::ConnAck, b"\x29\x02")).unwrap_err();
    assert!(matches!(e, DecodeError::InvalidPropertyValue { .. }));
    let e = decode_v5(&wrap(C::Publish, b"\x08\x00\x03a/#")).unwrap_err();
    assert_eq!(e, DecodeError::InvalidResponseTopic("a/#".into()));
    assert_eq!(e.reason_code(), ReasonCode::ProtocolError);
    let e = decode_v5(&wrap(C::Will, b"\x08\x00\x00")).unwrap_err();
    assert_eq!(e, DecodeError::InvalidResponseTopic(String::new()));
    // Topic Alias Maximum and Server Keep Alive may be 0.
    both_ways(&wrap(C::Connect, b"\x22\x00\x00"));
    both_ways(&wrap(C::ConnAck, b"\x13\x00\x00"));
    // The largest subscription identifier.
    both_ways(&wrap(C::Publish, b"\x0b\xff\xff\xff\x7f"));
}

#[test]
fn malformed_property_blocks() {
    use PropertyContext as C;
    let truncated = DecodeError::Truncated(PacketType::PubAck);
    let cases: [(PropertyContext, &[u8], DecodeError); 7] = [
        (C::PubAck, b"\x04\x00", DecodeError::UnknownProperty(0x04)),
        (C::PubAck, b"\x00", DecodeError::UnknownProperty(0)),
        (C::PubAck, b"\x80\x01", DecodeError::UnknownProperty(128)),
        (C::Publish, b"\x0b\x80\x00", DecodeError::MalformedVarInt),
        (
            C::Publish,
            b"\x0b\xff\xff\xff\xff\x01",
            DecodeError::MalformedVarInt,
        ),
        // A value cut short by the end of the property block.
        (C::PubAck, b"\x1f\x00", truncated.clone()),
        // A user property missing its value.
        (C::PubAck, b"\x26\x00\x01k", truncated.clone()),
    ];
    for (ctx, prop, expected) in cases {
        let e = decode_v5(&wrap(ctx, prop)).unwrap_err();
        assert_eq!(e, expected, "{prop:02x?}");
        assert_eq!(e.reason_code(), ReasonCode::MalformedPacket);
    }
    // A property length running past the packet.
    assert_eq!(decode_v5(b"\x40\x04\x00\x01\x00\x05"), Err(truncated));
}

#[test]
fn encoder_checks_values_too() {
    use PropertyId as P;
    let mut c = Connect::new(V5, "c");
    c.properties.receive_maximum = Some(0);
    assert_eq!(
        encode_err(&c.into()),
        EncodeError::Invalid(DecodeError::InvalidPropertyValue {
            property: P::ReceiveMaximum,
            value: 0
        })
    );

    let mut c = Connect::new(V5, "c");
    c.properties.authentication_data = Some(Bytes::from_static(b"x"));
    assert_eq!(
        encode_err(&c.into()),
        EncodeError::Invalid(DecodeError::AuthDataWithoutMethod)
    );

    let mut p = Publish::new("t", "x");
    p.properties.subscription_identifiers = vec![MAX_VAR_INT + 1];
    assert_eq!(
        encode_err(&p.into()),
        EncodeError::Invalid(DecodeError::InvalidPropertyValue {
            property: P::SubscriptionIdentifier,
            value: MAX_VAR_INT + 1
        })
    );

    let mut p = Publish::new("t", "x");
    p.properties.response_topic = Some(s("a/+"));
    assert_eq!(
        encode_err(&p.into()),
        EncodeError::Invalid(DecodeError::InvalidResponseTopic("a/+".into()))
    );

    let mut p = Publish::new("", "x");
    p.properties.topic_alias = Some(0);
    assert!(matches!(
        encode_err(&p.into()),
        EncodeError::Invalid(DecodeError::InvalidPropertyValue { .. })
    ));

    let mut a = ConnAck::default();
    a.properties.maximum_qos = Some(QoS::ExactlyOnce);
    assert_eq!(
        encode_err(&a.into()),
        EncodeError::Invalid(DecodeError::InvalidPropertyValue {
            property: P::MaximumQoS,
            value: 2
        })
    );

    let mut d = Disconnect::default();
    d.properties.user_properties = vec![(s("k\0"), s("v"))];
    assert_eq!(
        encode_err(&d.into()),
        EncodeError::Invalid(DecodeError::NulInString)
    );

    let mut a = Auth::default();
    a.properties.reason_string = Some(ByteStr::from("x".repeat(70_000)));
    assert_eq!(encode_err(&a.into()), EncodeError::StringTooLong(70_000));

    let mut a = Auth::default();
    a.properties.authentication_data = Some(Bytes::from(vec![0u8; 65_536]));
    assert_eq!(encode_err(&a.into()), EncodeError::BinaryTooLong(65_536));

    let mut sub = Subscribe::new(1, vec![Subscription::new("a", QoS::AtMostOnce)]);
    sub.properties.subscription_identifier = Some(0);
    assert!(matches!(
        encode_err(&sub.into()),
        EncodeError::Invalid(DecodeError::InvalidPropertyValue { .. })
    ));
}

#[test]
fn longest_strings_are_fine() {
    let mut a = Auth::default();
    a.properties.reason_string = Some(ByteStr::from("é".repeat(32_767) + "x"));
    a.properties.authentication_data = Some(Bytes::from(vec![1u8; 65_535]));
    let p = Packet::from(a);
    let bytes = encode_v5(&p);
    assert_eq!(decode_v5(&bytes), Ok(p));
}
