//! Property tests of the MQTT codec: arbitrary valid packets of every version survive
//! encode → decode, whole, as a stream, or fed in arbitrary pieces; the hot-path PUBLISH
//! encoder agrees with `encode`; the encoder refuses whatever the decoder would reject (so
//! a spoilt packet either fails to encode or round-trips); and arbitrary or mutated bytes
//! never make the decoder panic, claim a packet without consuming it, or consume input on
//! an error.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::fmt::Debug;

use bytes::{Bytes, BytesMut};
use hayate_mqtt::{
    Ack, AckProperties, Auth, AuthProperties, ByteStr, ConnAck, ConnAckProperties, Connect,
    ConnectProperties, Disconnect, DisconnectProperties, MAX_PACKET_SIZE, MAX_VAR_INT, Packet,
    PacketType, PayloadFormat, ProtocolVersion, Publish, PublishProperties, QoS, ReasonCode,
    RetainHandling, SubAck, Subscribe, SubscribeProperties, Subscription, SubscriptionOptions,
    UnsubAck, Unsubscribe, UnsubscribeProperties, UserProperties, Will, WillProperties, decode,
    encode, encode_publish_head, encoded_len, valid_topic_filter, valid_topic_name,
};
use proptest::collection::vec;
use proptest::prelude::*;
use proptest::sample::{Index, select};
use proptest::strategy::Union;

// ---------------------------------------------------------------------------------------
// Strategies: values

fn opt<S: Strategy>(s: S) -> impl Strategy<Value = Option<S::Value>> {
    proptest::option::of(s)
}

/// Text without U+0000: mostly ASCII words and separators, sometimes any characters.
fn text() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => "[a-z0-9/ ]{0,8}",
        1 => vec(any::<char>().prop_filter("no NUL", |c| *c != '\0'), 0..5)
            .prop_map(|c| c.into_iter().collect::<String>()),
    ]
}

fn bstr() -> impl Strategy<Value = ByteStr> {
    text().prop_map(ByteStr::from)
}

fn bytes(max: usize) -> impl Strategy<Value = Bytes> {
    vec(any::<u8>(), 0..max).prop_map(Bytes::from)
}

fn user() -> impl Strategy<Value = UserProperties> {
    vec((bstr(), bstr()), 0..3)
}

fn qos() -> impl Strategy<Value = QoS> {
    select(QoS::ALL.to_vec())
}

fn level() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => "[a-z0-9]{0,4}",
        1 => Just("é".to_string()),
        1 => Just("$x".to_string()),
    ]
}

fn topic_name() -> impl Strategy<Value = ByteStr> {
    vec(level(), 1..4)
        .prop_map(|levels| levels.join("/"))
        .prop_filter("a valid topic name", |t| valid_topic_name(t))
        .prop_map(ByteStr::from)
}

fn plain_filter() -> impl Strategy<Value = String> {
    (
        vec(prop_oneof![3 => level(), 1 => Just("+".to_string())], 0..4),
        any::<bool>(),
    )
        .prop_map(|(mut levels, hash)| {
            if hash {
                levels.push("#".to_string());
            }
            levels.join("/")
        })
        .prop_filter("a valid topic filter", |f| valid_topic_filter(f))
}

fn topic_filter() -> impl Strategy<Value = ByteStr> {
    prop_oneof![
        3 => plain_filter(),
        1 => ("[a-z]{1,4}", plain_filter()).prop_map(|(g, f)| format!("$share/{g}/{f}")),
    ]
    .prop_map(ByteStr::from)
}

fn reason(packet: PacketType, version: ProtocolVersion) -> impl Strategy<Value = ReasonCode> {
    select(
        ReasonCode::ALL
            .iter()
            .copied()
            .filter(|c| c.allowed_in(packet, version))
            .collect::<Vec<_>>(),
    )
}

fn payload_format() -> impl Strategy<Value = PayloadFormat> {
    select(vec![PayloadFormat::Unspecified, PayloadFormat::Utf8])
}

/// A property set in 5.0, the empty one before.
fn props<T: Default + Clone + Debug + 'static>(
    v5: bool,
    s: impl Strategy<Value = T> + 'static,
) -> BoxedStrategy<T> {
    if v5 {
        s.boxed()
    } else {
        Just(T::default()).boxed()
    }
}

// ---------------------------------------------------------------------------------------
// Strategies: property sets (5.0, valid)

fn connect_props() -> impl Strategy<Value = ConnectProperties> {
    (
        opt(any::<u32>()),
        opt(1..=u16::MAX),
        opt(1..=u32::MAX),
        opt(any::<u16>()),
        opt(any::<bool>()),
        opt(any::<bool>()),
        opt((bstr(), opt(bytes(8)))),
        user(),
    )
        .prop_map(|(sei, rm, mps, tam, rri, rpi, auth, user_properties)| {
            let (authentication_method, authentication_data) = match auth {
                Some((method, data)) => (Some(method), data),
                None => (None, None),
            };
            ConnectProperties {
                session_expiry_interval: sei,
                receive_maximum: rm,
                maximum_packet_size: mps,
                topic_alias_maximum: tam,
                request_response_information: rri,
                request_problem_information: rpi,
                authentication_method,
                authentication_data,
                user_properties,
            }
        })
}

fn will_props() -> impl Strategy<Value = WillProperties> {
    (
        opt(any::<u32>()),
        opt(payload_format()),
        opt(any::<u32>()),
        opt(bstr()),
        opt(topic_name()),
        opt(bytes(8)),
        user(),
    )
        .prop_map(
            |(delay, pf, expiry, ct, rt, cd, user_properties)| WillProperties {
                will_delay_interval: delay,
                payload_format_indicator: pf,
                message_expiry_interval: expiry,
                content_type: ct,
                response_topic: rt,
                correlation_data: cd,
                user_properties,
            },
        )
}

fn connack_props() -> impl Strategy<Value = ConnAckProperties> {
    let a = (
        opt(any::<u32>()),
        opt(1..=u16::MAX),
        opt(select(vec![QoS::AtMostOnce, QoS::AtLeastOnce])),
        opt(any::<bool>()),
        opt(1..=u32::MAX),
        opt(bstr()),
        opt(any::<u16>()),
        opt(bstr()),
        user(),
    );
    let b = (
        opt(any::<bool>()),
        opt(any::<bool>()),
        opt(any::<bool>()),
        opt(any::<u16>()),
        opt(bstr()),
        opt(bstr()),
        opt(bstr()),
        opt(bytes(8)),
    );
    (a, b).prop_map(
        |((sei, rm, mq, ra, mps, aci, tam, rs, up), (wsa, sia, ssa, ska, ri, sr, am, ad))| {
            ConnAckProperties {
                session_expiry_interval: sei,
                receive_maximum: rm,
                maximum_qos: mq,
                retain_available: ra,
                maximum_packet_size: mps,
                assigned_client_identifier: aci,
                topic_alias_maximum: tam,
                reason_string: rs,
                user_properties: up,
                wildcard_subscription_available: wsa,
                subscription_identifiers_available: sia,
                shared_subscription_available: ssa,
                server_keep_alive: ska,
                response_information: ri,
                server_reference: sr,
                authentication_method: am,
                authentication_data: ad,
            }
        },
    )
}

fn publish_props() -> impl Strategy<Value = PublishProperties> {
    (
        opt(payload_format()),
        opt(any::<u32>()),
        opt(1..=u16::MAX),
        opt(topic_name()),
        opt(bytes(8)),
        user(),
        vec(1..=MAX_VAR_INT, 0..3),
        opt(bstr()),
    )
        .prop_map(
            |(pf, expiry, alias, rt, cd, user_properties, ids, ct)| PublishProperties {
                payload_format_indicator: pf,
                message_expiry_interval: expiry,
                topic_alias: alias,
                response_topic: rt,
                correlation_data: cd,
                user_properties,
                subscription_identifiers: ids,
                content_type: ct,
            },
        )
}

fn ack_props() -> impl Strategy<Value = AckProperties> {
    (opt(bstr()), user()).prop_map(|(reason_string, user_properties)| AckProperties {
        reason_string,
        user_properties,
    })
}

fn subscribe_props() -> impl Strategy<Value = SubscribeProperties> {
    (opt(1..=MAX_VAR_INT), user()).prop_map(|(subscription_identifier, user_properties)| {
        SubscribeProperties {
            subscription_identifier,
            user_properties,
        }
    })
}

fn unsubscribe_props() -> impl Strategy<Value = UnsubscribeProperties> {
    user().prop_map(|user_properties| UnsubscribeProperties { user_properties })
}

fn disconnect_props() -> impl Strategy<Value = DisconnectProperties> {
    (opt(any::<u32>()), opt(bstr()), user(), opt(bstr())).prop_map(|(sei, rs, up, sr)| {
        DisconnectProperties {
            session_expiry_interval: sei,
            reason_string: rs,
            user_properties: up,
            server_reference: sr,
        }
    })
}

fn auth_props() -> impl Strategy<Value = AuthProperties> {
    (opt(bstr()), opt(bytes(8)), opt(bstr()), user()).prop_map(|(am, ad, rs, up)| AuthProperties {
        authentication_method: am,
        authentication_data: ad,
        reason_string: rs,
        user_properties: up,
    })
}

// ---------------------------------------------------------------------------------------
// Strategies: packets (valid in `version`)

fn connect(version: ProtocolVersion) -> BoxedStrategy<Packet> {
    let v5 = version.is_v5();
    let will = opt((
        topic_name(),
        bytes(16),
        qos(),
        any::<bool>(),
        props(v5, will_props()),
    )
        .prop_map(|(topic, payload, qos, retain, properties)| Will {
            topic,
            payload,
            qos,
            retain,
            properties,
        }));
    (
        bstr(),
        any::<bool>(),
        any::<u16>(),
        will,
        opt(bstr()),
        opt(bytes(8)),
        props(v5, connect_props()),
    )
        .prop_map(
            move |(client_id, clean_start, keep_alive, will, username, password, properties)| {
                let password = if v5 || username.is_some() {
                    password
                } else {
                    None
                };
                Packet::from(Connect {
                    protocol_version: version,
                    clean_start,
                    keep_alive,
                    client_id,
                    will,
                    username,
                    password,
                    properties,
                })
            },
        )
        .boxed()
}

fn connack(version: ProtocolVersion) -> BoxedStrategy<Packet> {
    (
        any::<bool>(),
        reason(PacketType::ConnAck, version),
        props(version.is_v5(), connack_props()),
    )
        .prop_map(|(session_present, reason_code, properties)| {
            Packet::from(ConnAck {
                session_present: session_present && reason_code == ReasonCode::Success,
                reason_code,
                properties,
            })
        })
        .boxed()
}

fn publish(version: ProtocolVersion) -> BoxedStrategy<Publish> {
    let v5 = version.is_v5();
    (
        qos(),
        any::<bool>(),
        any::<bool>(),
        prop_oneof![4 => topic_name(), 1 => Just(ByteStr::new())],
        1..=u16::MAX,
        props(v5, publish_props()),
        prop_oneof![3 => bytes(64), 1 => bytes(1000)],
    )
        .prop_map(
            move |(qos, dup, retain, topic, id, mut properties, payload)| {
                let topic = if topic.is_empty() && !v5 {
                    ByteStr::from_static("t")
                } else {
                    topic
                };
                if topic.is_empty() && properties.topic_alias.is_none() {
                    properties.topic_alias = Some(1);
                }
                let acknowledged = qos != QoS::AtMostOnce;
                Publish {
                    dup: dup && acknowledged,
                    qos,
                    retain,
                    topic,
                    packet_id: acknowledged.then_some(id),
                    properties,
                    payload,
                }
            },
        )
        .boxed()
}

fn ack(version: ProtocolVersion) -> BoxedStrategy<Packet> {
    select(vec![
        PacketType::PubAck,
        PacketType::PubRec,
        PacketType::PubRel,
        PacketType::PubComp,
    ])
    .prop_flat_map(move |t| {
        (
            Just(t),
            1..=u16::MAX,
            reason(t, version),
            props(version.is_v5(), ack_props()),
        )
    })
    .prop_map(|(t, packet_id, reason_code, properties)| {
        let ack = Ack {
            packet_id,
            reason_code,
            properties,
        };
        match t {
            PacketType::PubAck => Packet::PubAck(ack),
            PacketType::PubRec => Packet::PubRec(ack),
            PacketType::PubRel => Packet::PubRel(ack),
            _ => Packet::PubComp(ack),
        }
    })
    .boxed()
}

fn subscription(v5: bool) -> impl Strategy<Value = Subscription> {
    (
        topic_filter(),
        qos(),
        any::<bool>(),
        any::<bool>(),
        select(vec![
            RetainHandling::SendAtSubscribe,
            RetainHandling::SendAtSubscribeIfNew,
            RetainHandling::DoNotSend,
        ]),
    )
        .prop_map(
            move |(filter, qos, no_local, retain_as_published, retain_handling)| {
                let options = if v5 {
                    SubscriptionOptions {
                        qos,
                        no_local: no_local && !filter.starts_with("$share/"),
                        retain_as_published,
                        retain_handling,
                    }
                } else {
                    SubscriptionOptions::new(qos)
                };
                Subscription { filter, options }
            },
        )
}

fn subscribe(version: ProtocolVersion) -> BoxedStrategy<Packet> {
    let v5 = version.is_v5();
    (
        1..=u16::MAX,
        vec(subscription(v5), 1..4),
        props(v5, subscribe_props()),
    )
        .prop_map(|(packet_id, subscriptions, properties)| {
            Packet::from(Subscribe {
                packet_id,
                subscriptions,
                properties,
            })
        })
        .boxed()
}

fn suback(version: ProtocolVersion) -> BoxedStrategy<Packet> {
    (
        1..=u16::MAX,
        vec(reason(PacketType::SubAck, version), 0..4),
        props(version.is_v5(), ack_props()),
    )
        .prop_map(|(packet_id, reason_codes, properties)| {
            Packet::from(SubAck {
                packet_id,
                reason_codes,
                properties,
            })
        })
        .boxed()
}

fn unsubscribe(version: ProtocolVersion) -> BoxedStrategy<Packet> {
    (
        1..=u16::MAX,
        vec(topic_filter(), 1..4),
        props(version.is_v5(), unsubscribe_props()),
    )
        .prop_map(|(packet_id, filters, properties)| {
            Packet::from(Unsubscribe {
                packet_id,
                filters,
                properties,
            })
        })
        .boxed()
}

fn unsuback(version: ProtocolVersion) -> BoxedStrategy<Packet> {
    let codes = if version.is_v5() {
        vec(reason(PacketType::UnsubAck, version), 0..4).boxed()
    } else {
        Just(Vec::new()).boxed()
    };
    (1..=u16::MAX, codes, props(version.is_v5(), ack_props()))
        .prop_map(|(packet_id, reason_codes, properties)| {
            Packet::from(UnsubAck {
                packet_id,
                reason_codes,
                properties,
            })
        })
        .boxed()
}

fn disconnect(version: ProtocolVersion) -> BoxedStrategy<Packet> {
    (
        reason(PacketType::Disconnect, version),
        props(version.is_v5(), disconnect_props()),
    )
        .prop_map(|(reason_code, properties)| {
            Packet::from(Disconnect {
                reason_code,
                properties,
            })
        })
        .boxed()
}

fn auth() -> BoxedStrategy<Packet> {
    (reason(PacketType::Auth, ProtocolVersion::V5), auth_props())
        .prop_map(|(reason_code, properties)| {
            Packet::from(Auth {
                reason_code,
                properties,
            })
        })
        .boxed()
}

/// Any packet that is valid in `version`.
fn packet(version: ProtocolVersion) -> BoxedStrategy<Packet> {
    let mut options = vec![
        connect(version),
        connack(version),
        publish(version).prop_map(Packet::from).boxed(),
        publish(version).prop_map(Packet::from).boxed(),
        ack(version),
        subscribe(version),
        suback(version),
        unsubscribe(version),
        unsuback(version),
        Just(Packet::PingReq).boxed(),
        Just(Packet::PingResp).boxed(),
        disconnect(version),
    ];
    if version.is_v5() {
        options.push(auth());
    }
    Union::new(options).boxed()
}

fn any_version() -> impl Strategy<Value = ProtocolVersion> {
    select(ProtocolVersion::ALL.to_vec())
}

fn versioned_packet() -> impl Strategy<Value = (ProtocolVersion, Packet)> {
    any_version().prop_flat_map(|v| (Just(v), packet(v)))
}

fn versioned_packets() -> impl Strategy<Value = (ProtocolVersion, Vec<Packet>)> {
    any_version().prop_flat_map(|v| (Just(v), vec(packet(v), 1..6)))
}

fn versioned_publish() -> impl Strategy<Value = (ProtocolVersion, Publish)> {
    any_version().prop_flat_map(|v| (Just(v), publish(v)))
}

// ---------------------------------------------------------------------------------------
// Spoiling a valid packet

/// Text rich in what MQTT forbids somewhere: U+0000, wildcards, empty.
fn spoiler_text() -> impl Strategy<Value = String> {
    vec(
        prop_oneof![
            Just('\0'),
            Just('+'),
            Just('#'),
            Just('/'),
            Just('a'),
            Just('$'),
        ],
        0..4,
    )
    .prop_map(|c| c.into_iter().collect())
}

fn any_reason(n: u32) -> ReasonCode {
    ReasonCode::ALL[n as usize % ReasonCode::ALL.len()]
}

/// Changes one field of `p`, chosen by `what`, to something that may be invalid.
fn spoil(p: &mut Packet, what: u8, n: u32, text: &str) {
    let t = ByteStr::from(text);
    match p {
        Packet::Connect(c) => match what % 7 {
            0 => c.client_id = t,
            1 => c.will = Some(Will::new(t, Bytes::new())),
            2 => c.properties.receive_maximum = Some((n % 3) as u16),
            3 => c.properties.authentication_data = Some(Bytes::new()),
            4 => {
                c.password = Some(Bytes::new());
                c.username = None;
            }
            5 => c.properties.maximum_packet_size = Some(n % 2),
            _ => c.properties.user_properties.push((t.clone(), t)),
        },
        Packet::ConnAck(a) => match what % 3 {
            0 => a.session_present = true,
            1 => a.reason_code = any_reason(n),
            _ => a.properties.maximum_qos = QoS::from_u8((n % 3) as u8),
        },
        Packet::Publish(p) => match what % 7 {
            0 => p.topic = t,
            1 => p.packet_id = (n % 2 == 1).then_some((n % 3) as u16),
            2 => p.dup = true,
            3 => p.properties.topic_alias = Some((n % 2) as u16),
            4 => p.properties.subscription_identifiers.push(n),
            5 => p.properties.response_topic = Some(t),
            _ => p.qos = QoS::ALL[n as usize % 3],
        },
        Packet::PubAck(a) | Packet::PubRec(a) | Packet::PubRel(a) | Packet::PubComp(a) => {
            match what % 3 {
                0 => a.packet_id = (n % 2) as u16,
                1 => a.reason_code = any_reason(n),
                _ => a.properties.reason_string = Some(t),
            }
        }
        Packet::Subscribe(s) => match what % 6 {
            0 => s.packet_id = 0,
            1 => s.subscriptions.clear(),
            2 => s.subscriptions.push(Subscription::new(t, QoS::AtMostOnce)),
            3 => {
                for sub in &mut s.subscriptions {
                    sub.options.no_local = true;
                }
            }
            4 => {
                for sub in &mut s.subscriptions {
                    sub.options.retain_handling = RetainHandling::DoNotSend;
                }
            }
            _ => s.properties.subscription_identifier = Some(n % 2),
        },
        Packet::SubAck(a) => a.reason_codes.push(any_reason(n)),
        Packet::Unsubscribe(u) => match what % 2 {
            0 => u.filters.clear(),
            _ => u.filters.push(t),
        },
        Packet::UnsubAck(a) => a.reason_codes.push(any_reason(n)),
        Packet::Disconnect(d) => match what % 2 {
            0 => d.reason_code = any_reason(n),
            _ => d.properties.server_reference = Some(t),
        },
        Packet::Auth(a) => a.reason_code = any_reason(n),
        Packet::PingReq | Packet::PingResp => {}
    }
}

// ---------------------------------------------------------------------------------------
// Checks

fn encoded(p: &Packet, version: ProtocolVersion) -> BytesMut {
    let mut out = BytesMut::new();
    encode(p, version, &mut out).unwrap_or_else(|e| panic!("{p:?} in {version}: {e}"));
    out
}

/// Decodes `data` as a stream until it needs more or fails, checking the decoder's
/// promises on the way; every packet it decodes must re-encode and decode to itself.
fn check_stream(data: &[u8], version: ProtocolVersion, max: u32) -> Result<(), TestCaseError> {
    let mut buf = BytesMut::from(data);
    loop {
        let before = buf.clone();
        match decode(&mut buf, version, max) {
            Ok(Some(p)) => {
                let consumed = before.len() - buf.len();
                prop_assert!(consumed >= 2, "a packet is at least 2 bytes");
                prop_assert!(consumed as u64 <= u64::from(max));
                prop_assert_eq!(&before[consumed..], &buf[..]);
                let mut again = BytesMut::new();
                encode(&p, version, &mut again)
                    .map_err(|e| TestCaseError::fail(format!("{p:?} does not re-encode: {e}")))?;
                prop_assert_eq!(decode(&mut again, version, MAX_PACKET_SIZE), Ok(Some(p)));
                prop_assert!(again.is_empty());
            }
            Ok(None) => {
                prop_assert_eq!(&buf, &before, "Ok(None) consumes nothing");
                return Ok(());
            }
            Err(e) => {
                prop_assert_eq!(&buf, &before, "an error consumes nothing");
                prop_assert!(e.reason_code().is_error());
                prop_assert!(!e.to_string().is_empty());
                return Ok(());
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn valid_packets_round_trip((version, p) in versioned_packet()) {
        let mut wire = encoded(&p, version);
        prop_assert_eq!(encoded_len(&p, version), Ok(wire.len()));
        prop_assert_eq!(decode(&mut wire, version, MAX_PACKET_SIZE), Ok(Some(p)));
        prop_assert!(wire.is_empty());
    }

    #[test]
    fn every_proper_prefix_needs_more((version, p) in versioned_packet(), cut in any::<Index>()) {
        let wire = encoded(&p, version);
        let cut = cut.index(wire.len());
        let mut prefix = BytesMut::from(&wire[..cut]);
        prop_assert_eq!(decode(&mut prefix, version, MAX_PACKET_SIZE), Ok(None));
        prop_assert_eq!(prefix.len(), cut);
    }

    #[test]
    fn packets_in_pieces((version, packets) in versioned_packets(), cuts in vec(any::<Index>(), 0..10)) {
        let mut wire = BytesMut::new();
        for p in &packets {
            encode(p, version, &mut wire).unwrap();
        }
        let mut cuts: Vec<usize> = cuts.iter().map(|i| i.index(wire.len())).collect();
        cuts.push(wire.len());
        cuts.sort_unstable();
        let mut buf = BytesMut::new();
        let mut got = Vec::new();
        let mut fed = 0;
        for cut in cuts {
            buf.extend_from_slice(&wire[fed..cut]);
            fed = cut;
            while let Some(p) = decode(&mut buf, version, MAX_PACKET_SIZE).unwrap() {
                got.push(p);
            }
        }
        prop_assert_eq!(got, packets);
        prop_assert!(buf.is_empty());
    }

    #[test]
    fn publish_head_and_payload_equal_encode((version, p) in versioned_publish()) {
        let mut head = BytesMut::new();
        encode_publish_head(&p.head(), p.payload.len(), version, &mut head).unwrap();
        head.extend_from_slice(&p.payload);
        let whole = encoded(&Packet::from(p), version);
        prop_assert_eq!(head, whole);
    }

    #[test]
    fn spoilt_packets_are_refused_or_round_trip(
        (version, mut p) in versioned_packet(),
        spoils in vec((any::<u8>(), any::<u32>(), spoiler_text()), 0..3),
        other in any_version(),
    ) {
        for (what, n, text) in &spoils {
            spoil(&mut p, *what, *n, text);
        }
        for v in [version, other] {
            let mut out = BytesMut::new();
            match encode(&p, v, &mut out) {
                Ok(()) => {
                    prop_assert_eq!(encoded_len(&p, v), Ok(out.len()));
                    prop_assert_eq!(decode(&mut out, v, MAX_PACKET_SIZE), Ok(Some(p.clone())));
                    prop_assert!(out.is_empty());
                }
                Err(e) => {
                    prop_assert!(out.is_empty(), "nothing is written on error");
                    prop_assert_eq!(encoded_len(&p, v), Err(e));
                }
            }
        }
    }

    #[test]
    fn garbage_never_panics(
        data in vec(any::<u8>(), 0..300),
        version in any_version(),
        max in prop_oneof![Just(MAX_PACKET_SIZE), 0u32..64],
    ) {
        check_stream(&data, version, max)?;
    }

    #[test]
    fn mutated_packets_never_panic(
        (version, packets) in versioned_packets(),
        edits in vec((any::<Index>(), any::<u8>()), 1..4),
        max in prop_oneof![Just(MAX_PACKET_SIZE), 2u32..200],
    ) {
        let mut wire = BytesMut::new();
        for p in &packets {
            encode(p, version, &mut wire).unwrap();
        }
        for (at, byte) in &edits {
            let i = at.index(wire.len());
            wire[i] = *byte;
        }
        check_stream(&wire, version, max)?;
    }
}
