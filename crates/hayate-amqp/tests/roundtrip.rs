//! Property tests of the AMQP 0-9-1 codec: arbitrary field tables, methods, content headers
//! and frames survive encode → decode, whole or fed in arbitrary pieces; arbitrary bytes
//! never make the decoder panic, and a frame larger than the limit is refused before its
//! payload arrives.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use bytes::{Bytes, BytesMut};
use hayate_amqp::types::{Decimal, Reader, Writer};
use hayate_amqp::{
    BasicProperties, ContentHeader, DecodeError, FieldTable, FieldValue, Frame, FrameDecoder,
    Method, ShortStr,
};
use proptest::collection::vec;
use proptest::prelude::*;

fn short() -> impl Strategy<Value = ShortStr> {
    prop_oneof![
        "[a-z._*#/-]{0,20}".prop_map(|s| ShortStr::lit(&s)),
        vec(any::<u8>(), 0..=255).prop_map(|b| ShortStr::new(b).unwrap()),
    ]
}

fn long() -> impl Strategy<Value = Bytes> {
    vec(any::<u8>(), 0..300).prop_map(Bytes::from)
}

fn value() -> impl Strategy<Value = FieldValue> {
    let leaf = prop_oneof![
        any::<bool>().prop_map(FieldValue::Bool),
        any::<i8>().prop_map(FieldValue::I8),
        any::<u8>().prop_map(FieldValue::U8),
        any::<i16>().prop_map(FieldValue::I16),
        any::<u16>().prop_map(FieldValue::U16),
        any::<i32>().prop_map(FieldValue::I32),
        any::<u32>().prop_map(FieldValue::U32),
        any::<i64>().prop_map(FieldValue::I64),
        any::<u64>().prop_map(FieldValue::U64),
        (-1e30f32..1e30).prop_map(FieldValue::F32),
        (-1e300f64..1e300).prop_map(FieldValue::F64),
        (any::<u8>(), any::<u32>())
            .prop_map(|(scale, value)| FieldValue::Decimal(Decimal { scale, value })),
        long().prop_map(FieldValue::LongStr),
        long().prop_map(FieldValue::Bytes),
        any::<u64>().prop_map(FieldValue::Timestamp),
        Just(FieldValue::Void),
    ];
    leaf.prop_recursive(4, 64, 6, |inner| {
        prop_oneof![
            vec(inner.clone(), 0..6).prop_map(FieldValue::Array),
            vec((short(), inner), 0..6).prop_map(|f| FieldValue::Table(FieldTable(f))),
        ]
    })
}

fn table() -> impl Strategy<Value = FieldTable> {
    vec((short(), value()), 0..8).prop_map(FieldTable)
}

prop_compose! {
    fn bits()(b in vec(any::<bool>(), 5)) -> [bool; 5] {
        [b[0], b[1], b[2], b[3], b[4]]
    }
}

fn method() -> impl Strategy<Value = Method> {
    prop_oneof![
        (table(), long(), long()).prop_map(|(t, m, l)| Method::ConnectionStart {
            version_major: 0,
            version_minor: 9,
            server_properties: t,
            mechanisms: m,
            locales: l,
        }),
        (table(), short(), long(), short()).prop_map(|(t, m, r, l)| Method::ConnectionStartOk {
            client_properties: t,
            mechanism: m,
            response: r,
            locale: l,
        }),
        (any::<u16>(), any::<u32>(), any::<u16>()).prop_map(|(c, f, h)| Method::ConnectionTune {
            channel_max: c,
            frame_max: f,
            heartbeat: h,
        }),
        (short(), short(), any::<bool>()).prop_map(|(v, c, i)| Method::ConnectionOpen {
            virtual_host: v,
            capabilities: c,
            insist: i,
        }),
        (any::<u16>(), short(), any::<u16>(), any::<u16>()).prop_map(|(c, t, k, m)| {
            Method::ChannelClose {
                reply_code: c,
                reply_text: t,
                class_id: k,
                method_id: m,
            }
        }),
        any::<bool>().prop_map(|active| Method::ChannelFlow { active }),
        (short(), short(), bits(), table()).prop_map(|(e, k, b, a)| Method::ExchangeDeclare {
            ticket: 0,
            exchange: e,
            kind: k,
            passive: b[0],
            durable: b[1],
            auto_delete: b[2],
            internal: b[3],
            no_wait: b[4],
            arguments: a,
        }),
        (short(), bits(), table()).prop_map(|(q, b, a)| Method::QueueDeclare {
            ticket: 0,
            queue: q,
            passive: b[0],
            durable: b[1],
            exclusive: b[2],
            auto_delete: b[3],
            no_wait: b[4],
            arguments: a,
        }),
        (short(), any::<u32>(), any::<u32>()).prop_map(|(q, m, c)| Method::QueueDeclareOk {
            queue: q,
            message_count: m,
            consumer_count: c,
        }),
        (short(), short(), short(), any::<bool>(), table()).prop_map(|(q, e, k, n, a)| {
            Method::QueueBind {
                ticket: 0,
                queue: q,
                exchange: e,
                routing_key: k,
                no_wait: n,
                arguments: a,
            }
        }),
        (short(), bits()).prop_map(|(q, b)| Method::QueueDelete {
            ticket: 7,
            queue: q,
            if_unused: b[0],
            if_empty: b[1],
            no_wait: b[2],
        }),
        (any::<u32>(), any::<u16>(), any::<bool>()).prop_map(|(s, c, g)| Method::BasicQos {
            prefetch_size: s,
            prefetch_count: c,
            global: g,
        }),
        (short(), short(), bits(), table()).prop_map(|(q, t, b, a)| Method::BasicConsume {
            ticket: 0,
            queue: q,
            consumer_tag: t,
            no_local: b[0],
            no_ack: b[1],
            exclusive: b[2],
            no_wait: b[3],
            arguments: a,
        }),
        (short(), short(), any::<bool>(), any::<bool>()).prop_map(|(e, k, m, i)| {
            Method::BasicPublish {
                ticket: 0,
                exchange: e,
                routing_key: k,
                mandatory: m,
                immediate: i,
            }
        }),
        (short(), any::<u64>(), any::<bool>(), short(), short()).prop_map(|(c, d, r, e, k)| {
            Method::BasicDeliver {
                consumer_tag: c,
                delivery_tag: d,
                redelivered: r,
                exchange: e,
                routing_key: k,
            }
        }),
        (any::<u64>(), any::<bool>(), any::<bool>()).prop_map(|(d, m, r)| Method::BasicNack {
            delivery_tag: d,
            multiple: m,
            requeue: r,
        }),
        (any::<u64>(), any::<bool>()).prop_map(|(d, m)| Method::BasicAck {
            delivery_tag: d,
            multiple: m
        }),
        any::<bool>().prop_map(|n| Method::ConfirmSelect { no_wait: n }),
        Just(Method::TxCommit {}),
        Just(Method::ConnectionCloseOk {}),
    ]
}

fn opt<T: std::fmt::Debug + Clone>(
    s: impl Strategy<Value = T>,
) -> impl Strategy<Value = Option<T>> {
    proptest::option::of(s)
}

fn properties() -> impl Strategy<Value = BasicProperties> {
    (
        (
            opt(short()),
            opt(short()),
            opt(table()),
            opt(any::<u8>()),
            opt(any::<u8>()),
        ),
        (
            opt(short()),
            opt(short()),
            opt(short()),
            opt(short()),
            opt(any::<u64>()),
        ),
        (opt(short()), opt(short()), opt(short()), opt(short())),
    )
        .prop_map(|(a, b, c)| BasicProperties {
            content_type: a.0,
            content_encoding: a.1,
            headers: a.2,
            delivery_mode: a.3,
            priority: a.4,
            correlation_id: b.0,
            reply_to: b.1,
            expiration: b.2,
            message_id: b.3,
            timestamp: b.4,
            kind: c.0,
            user_id: c.1,
            app_id: c.2,
            cluster_id: c.3,
        })
}

fn frame() -> impl Strategy<Value = Frame> {
    prop_oneof![
        (any::<u16>(), method()).prop_map(|(c, m)| Frame::Method(c, m)),
        (any::<u16>(), any::<u64>(), properties()).prop_map(|(c, n, p)| Frame::Header(
            c,
            Box::new(ContentHeader {
                body_size: n,
                properties: p
            })
        )),
        (any::<u16>(), long()).prop_map(|(c, b)| Frame::Body(c, b)),
        Just(Frame::Heartbeat),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn tables_round_trip(t in table()) {
        let mut out = BytesMut::new();
        Writer::new(&mut out).table(&t);
        let mut r = Reader::new(&out);
        prop_assert_eq!(r.table().unwrap(), t);
        prop_assert!(r.finish().is_ok());
    }

    #[test]
    fn methods_round_trip(m in method()) {
        let mut out = BytesMut::new();
        m.encode(&mut out);
        prop_assert_eq!(Method::decode(&out.freeze()).unwrap(), m);
    }

    #[test]
    fn frames_round_trip_in_any_pieces(
        frames in vec(frame(), 1..8),
        cuts in vec(any::<prop::sample::Index>(), 0..8),
    ) {
        let mut wire = BytesMut::new();
        for f in &frames {
            f.encode(&mut wire);
        }
        let wire = wire.freeze();
        let mut at: Vec<usize> = cuts.iter().map(|i| i.index(wire.len() + 1)).collect();
        at.push(wire.len());
        at.sort_unstable();
        let d = FrameDecoder::new(u32::MAX);
        let mut buf = BytesMut::new();
        let mut got = Vec::new();
        let mut from = 0;
        for to in at {
            buf.extend_from_slice(&wire[from..to]);
            from = to;
            while let Some(f) = d.decode(&mut buf).unwrap() {
                got.push(f);
            }
        }
        prop_assert!(buf.is_empty());
        prop_assert_eq!(got, frames);
    }

    #[test]
    fn garbage_never_panics(bytes in vec(any::<u8>(), 0..600), max in 8u32..1024) {
        let d = FrameDecoder::new(max);
        let mut buf = BytesMut::from(&bytes[..]);
        // Each step consumes a frame, waits for more, or fails: never loops in place.
        for _ in 0..bytes.len() + 1 {
            let before = buf.len();
            match d.decode(&mut buf) {
                Ok(Some(_)) => prop_assert!(buf.len() < before),
                Ok(None) | Err(_) => break,
            }
        }
        let b = Bytes::from(bytes.clone());
        let _ = Method::decode(&b);
        let _ = ContentHeader::read(&mut Reader::new(&bytes));
        let _ = Reader::new(&bytes).table();
    }

    #[test]
    fn frames_past_the_limit_are_refused_from_their_head(size in 4089u32..u32::MAX) {
        // A 4096-byte limit: any larger announced size fails on the 7-byte head alone.
        let mut buf = BytesMut::new();
        buf.extend_from_slice(&[3, 0, 1]);
        buf.extend_from_slice(&size.to_be_bytes());
        let r = FrameDecoder::new(4096).decode(&mut buf);
        prop_assert!(
            matches!(r, Err(DecodeError::FrameTooLarge { .. })),
            "{:?}",
            r
        );
    }
}
