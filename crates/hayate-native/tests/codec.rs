//! Round-trip tests of the native codec: arbitrary valid frames of every type are encoded,
//! then decoded back (whole, or fed in arbitrary pieces), and the hot-path encoders are
//! checked byte for byte against `encode`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use bytes::{Bytes, BytesMut};
use hayate_core::{Key, KeyExpr, Message, Qos};
use hayate_native::{
    ErrorCode, Frame, HEADER_LEN, Hello, Items, Sub, Welcome, decode, encode, encode_batch_item,
    encode_msg, encode_msg_batch_head, encode_msg_batch_item_head, encode_msg_head, encode_ping,
    encode_pub, encode_pub_batch_head, encode_sub,
};
use proptest::collection::vec;
use proptest::prelude::*;
use proptest::sample::Index;

const MAX_FRAME: usize = 1 << 20;

// ---------------------------------------------------------------------------------------
// Strategies

fn segment() -> impl Strategy<Value = String> {
    "[a-z0-9]{1,8}"
}

fn key() -> impl Strategy<Value = Key> {
    vec(segment(), 1..5).prop_map(|s| Key::new(&s.join("/")).expect("valid key"))
}

fn expr() -> impl Strategy<Value = KeyExpr> {
    let seg = prop_oneof![
        3 => segment(),
        1 => Just("*".to_string()),
        1 => Just("**".to_string()),
    ];
    vec(seg, 1..6).prop_map(|mut s| {
        // The parser collapses `**/**`; keep expressions free of it so the text is canonical.
        s.dedup_by(|a, b| a == "**" && b == "**");
        KeyExpr::new(&s.join("/")).expect("valid key expression")
    })
}

fn text(max: usize) -> impl Strategy<Value = String> {
    proptest::string::string_regex(&format!("\\PC{{0,{max}}}")).expect("regex")
}

fn bytes(max: usize) -> impl Strategy<Value = Bytes> {
    vec(any::<u8>(), 0..=max).prop_map(Bytes::from)
}

fn message() -> impl Strategy<Value = Message> {
    (
        key(),
        bytes(300),
        proptest::option::of(key()),
        proptest::option::of(bytes(40)),
        proptest::option::of(vec((text(12), bytes(40)), 0..4)),
    )
        .prop_map(
            |(key, payload, reply_to, correlation_id, headers)| Message {
                key,
                payload,
                reply_to,
                correlation_id,
                headers,
                attrs: Default::default(),
            },
        )
}

fn qos() -> impl Strategy<Value = Qos> {
    (0u8..32).prop_map(|b| Qos::from_bits(b).expect("valid qos bits"))
}

fn payloads() -> impl Strategy<Value = Vec<Bytes>> {
    vec(bytes(300), 1..6)
}

fn frame() -> impl Strategy<Value = Frame> {
    prop_oneof![
        (any::<u16>(), any::<u16>(), text(20), bytes(64)).prop_map(
            |(version, flags, name, auth)| {
                Frame::Hello(Hello {
                    version,
                    flags,
                    name,
                    auth,
                })
            }
        ),
        (
            any::<u16>(),
            any::<u64>(),
            any::<u64>(),
            text(20),
            text(20),
            proptest::option::of(text(40))
        )
            .prop_map(|(version, session, max_payload, server, inbox, shm)| {
                Frame::Welcome(Welcome {
                    version,
                    session,
                    max_payload,
                    server,
                    inbox,
                    shm,
                })
            }),
        message().prop_map(Frame::Pub),
        (
            any::<u32>(),
            qos(),
            // An empty group is "no group" on the wire, so a present group is never empty.
            proptest::option::of(text(12).prop_filter("non-empty", |g| !g.is_empty())),
            expr(),
        )
            .prop_map(|(sid, qos, group, expr)| Frame::Sub(Sub {
                sid,
                qos,
                group,
                expr
            })),
        any::<u32>().prop_map(|sid| Frame::Unsub { sid }),
        (any::<u32>(), message()).prop_map(|(sid, msg)| Frame::Msg { sid, msg }),
        (key(), payloads()).prop_map(|(key, payloads)| Frame::PubBatch { key, payloads }),
        (any::<u32>(), key(), payloads()).prop_map(|(sid, key, payloads)| Frame::MsgBatch {
            sid,
            key,
            payloads: Items::new(&payloads),
        }),
        any::<u64>().prop_map(Frame::Ping),
        any::<u64>().prop_map(Frame::Pong),
        (any::<u32>(), any::<u64>()).prop_map(|(sid, count)| Frame::Lost { sid, count }),
        (any::<u32>(), any::<u64>(), any::<u32>(), any::<u64>())
            .prop_map(|(sid, at, len, tag)| Frame::MsgRef { sid, at, len, tag }),
        (any::<u16>(), text(40)).prop_map(|(code, message)| Frame::Err {
            code: ErrorCode::from_code(code),
            message,
        }),
        Just(Frame::Close),
        (any::<u32>(), any::<u64>(), message(), any::<bool>()).prop_map(
            |(sid, delivery, mut msg, redelivered)| {
                msg.attrs.redelivered = redelivered;
                Frame::MsgAcked { sid, delivery, msg }
            }
        ),
        (any::<u64>(), any::<bool>()).prop_map(|(delivery, cumulative)| Frame::Ack {
            delivery,
            cumulative
        }),
        (any::<u64>(), any::<u32>())
            .prop_map(|(delivery, delay_ms)| Frame::Nack { delivery, delay_ms }),
        (any::<u64>(), message()).prop_map(|(id, msg)| Frame::PubConfirm { id, msg }),
        (any::<u32>(), text(20), text(20), any::<u32>()).prop_map(
            |(sid, stream, consumer, prefetch)| Frame::Consume {
                sid,
                stream,
                consumer,
                prefetch
            }
        ),
        (
            any::<u32>(),
            any::<u64>(),
            message(),
            any::<u64>(),
            any::<u32>()
        )
            .prop_map(|(sid, delivery, mut msg, offset, n)| {
                msg.attrs.stream_offset = Some(offset);
                msg.attrs.deliveries = n;
                Frame::MsgAcked { sid, delivery, msg }
            }),
        (any::<u64>(), any::<u64>(), text(20)).prop_map(|(id, offset, stream)| Frame::Confirm {
            id,
            outcome: hayate_native::ConfirmOutcome::Stored { stream, offset }
        }),
        any::<u64>().prop_map(|id| Frame::Confirm {
            id,
            outcome: hayate_native::ConfirmOutcome::NotCaptured
        }),
        (any::<u64>(), text(40)).prop_map(|(id, why)| Frame::Confirm {
            id,
            outcome: hayate_native::ConfirmOutcome::Failed(why)
        }),
    ]
}

// ---------------------------------------------------------------------------------------
// Helpers

fn encoded(frame: &Frame) -> BytesMut {
    let mut b = BytesMut::new();
    encode(frame, &mut b);
    b
}

/// Encodes all frames into one buffer; also returns the end offset of each frame.
fn encode_all(frames: &[Frame]) -> (BytesMut, Vec<usize>) {
    let mut buf = BytesMut::new();
    let mut ends = Vec::with_capacity(frames.len());
    for f in frames {
        encode(f, &mut buf);
        ends.push(buf.len());
    }
    (buf, ends)
}

/// Decodes every whole frame at the front of `rx`, checking that `Ok(None)` consumes nothing.
fn drain(rx: &mut BytesMut, out: &mut Vec<Frame>) -> Result<(), TestCaseError> {
    loop {
        let before = rx.len();
        match decode(rx, MAX_FRAME) {
            Ok(Some(f)) => {
                prop_assert!(rx.len() < before, "a decoded frame consumes bytes");
                out.push(f);
            }
            Ok(None) => {
                prop_assert_eq!(rx.len(), before, "Ok(None) consumes nothing");
                return Ok(());
            }
            Err(e) => return Err(TestCaseError::fail(format!("decode error: {e}"))),
        }
    }
}

// ---------------------------------------------------------------------------------------
// Properties

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn round_trip_one_buffer(frames in vec(frame(), 1..10)) {
        let (mut buf, ends) = encode_all(&frames);
        let total = buf.len();
        for (i, f) in frames.iter().enumerate() {
            let got = decode(&mut buf, MAX_FRAME).map_err(|e| TestCaseError::fail(e.to_string()))?;
            prop_assert_eq!(got.as_ref(), Some(f));
            prop_assert_eq!(total - buf.len(), ends[i]);
        }
        prop_assert!(buf.is_empty());
        prop_assert_eq!(decode(&mut buf, MAX_FRAME), Ok(None));
    }

    #[test]
    fn length_field_counts_type_and_body(f in frame()) {
        let b = encoded(&f);
        let len = u32::from_be_bytes([b[0], b[1], b[2], b[3]]) as usize;
        prop_assert_eq!(len + 4, b.len());
        prop_assert!(len >= 1);
        // The frame decodes with a limit of exactly its length, and not with one byte less.
        prop_assert!(decode(&mut b.clone(), len).is_ok_and(|f| f.is_some()));
        prop_assert!(decode(&mut b.clone(), len - 1).is_err());
    }

    #[test]
    fn round_trip_split_reads(
        frames in vec(frame(), 1..8),
        cuts in vec(any::<Index>(), 0..16),
    ) {
        let (wire, ends) = encode_all(&frames);
        let mut cuts: Vec<usize> = cuts.iter().map(|c| c.index(wire.len() + 1)).collect();
        cuts.push(wire.len());
        cuts.sort_unstable();
        cuts.dedup();

        let mut rx = BytesMut::new();
        let mut got = Vec::new();
        let mut fed = 0;
        for cut in cuts {
            rx.extend_from_slice(&wire[fed..cut]);
            fed = cut;
            drain(&mut rx, &mut got)?;
            // Exactly the frames that have fully arrived are out; the rest is still buffered.
            let complete = ends.iter().filter(|&&e| e <= fed).count();
            prop_assert_eq!(got.len(), complete);
            let consumed = if complete == 0 { 0 } else { ends[complete - 1] };
            prop_assert_eq!(rx.len(), fed - consumed);
        }
        prop_assert!(rx.is_empty());
        prop_assert_eq!(got, frames);
    }

    #[test]
    fn round_trip_byte_by_byte(f in frame()) {
        let wire = encoded(&f);
        let mut rx = BytesMut::new();
        for (i, &byte) in wire.iter().enumerate() {
            rx.extend_from_slice(&[byte]);
            let got = decode(&mut rx, MAX_FRAME).map_err(|e| TestCaseError::fail(e.to_string()))?;
            if i + 1 < wire.len() {
                prop_assert_eq!(got, None);
                prop_assert_eq!(rx.len(), i + 1);
            } else {
                prop_assert_eq!(got, Some(f.clone()));
                prop_assert!(rx.is_empty());
            }
        }
    }

    #[test]
    fn hot_path_msg_matches_encode(sid in any::<u32>(), msg in message()) {
        let want = encoded(&Frame::Msg { sid, msg: msg.clone() });

        let mut head = BytesMut::new();
        encode_msg_head(sid, &msg, &mut head);
        prop_assert_eq!(head.len() + msg.payload.len(), want.len());
        head.extend_from_slice(&msg.payload);
        prop_assert_eq!(&head, &want);

        let mut whole = BytesMut::new();
        encode_msg(sid, &msg, &mut whole);
        prop_assert_eq!(&whole, &want);
    }

    #[test]
    fn hot_path_pub_matches_encode(msg in message()) {
        let mut got = BytesMut::new();
        encode_pub(&msg, &mut got);
        prop_assert_eq!(got, encoded(&Frame::Pub(msg)));
    }

    #[test]
    fn hot_path_msg_batch_matches_encode(
        sid in any::<u32>(),
        key in key(),
        payloads in payloads(),
    ) {
        let want = encoded(&Frame::MsgBatch { sid, key: key.clone(), payloads: Items::new(&payloads) });
        let items_len: usize = payloads.iter().map(|p| 4 + p.len()).sum();
        let mut got = BytesMut::new();
        encode_msg_batch_head(sid, &key, items_len, &mut got);
        for (i, p) in payloads.iter().enumerate() {
            // Both ways of writing an item: whole, or length prefix then the payload.
            if i % 2 == 0 {
                encode_batch_item(p, &mut got);
            } else {
                encode_msg_batch_item_head(p.len(), &mut got);
                got.extend_from_slice(p);
            }
        }
        prop_assert_eq!(got, want);
    }

    #[test]
    fn hot_path_pub_batch_matches_encode(key in key(), payloads in payloads()) {
        let want = encoded(&Frame::PubBatch { key: key.clone(), payloads: payloads.clone() });
        let items_len: usize = payloads.iter().map(|p| 4 + p.len()).sum();
        let mut got = BytesMut::new();
        encode_pub_batch_head(&key, items_len, &mut got);
        for p in &payloads {
            encode_batch_item(p, &mut got);
        }
        prop_assert_eq!(got, want);
    }

    #[test]
    fn hot_path_sub_and_ping_match_encode(
        sid in any::<u32>(),
        qos in qos(),
        expr in expr(),
        token in any::<u64>(),
    ) {
        let sub = Sub { sid, qos, group: Some("workers".into()), expr };
        let mut got = BytesMut::new();
        encode_sub(&sub, &mut got);
        prop_assert_eq!(got, encoded(&Frame::Sub(sub)));

        let mut got = BytesMut::new();
        encode_ping(token, &mut got);
        prop_assert_eq!(got, encoded(&Frame::Ping(token)));
    }
}

// ---------------------------------------------------------------------------------------
// Examples

#[test]
fn expr_with_repeated_double_star_round_trips_as_written() {
    let expr = KeyExpr::new("a/**/**/b").expect("valid");
    let f = Frame::Sub(Sub {
        sid: 1,
        qos: Qos::RELIABLE,
        group: None,
        expr,
    });
    let mut b = encoded(&f);
    let Ok(Some(Frame::Sub(got))) = decode(&mut b, MAX_FRAME) else {
        panic!("SUB did not decode");
    };
    assert_eq!(got.expr.as_str(), "a/**/**/b");
    assert_eq!(Frame::Sub(got), f);
}

#[test]
fn empty_group_is_no_group() {
    let f = Frame::Sub(Sub {
        sid: 7,
        qos: Qos::default(),
        group: Some(String::new()),
        expr: KeyExpr::new("a/*").expect("valid"),
    });
    let mut b = encoded(&f);
    let Ok(Some(Frame::Sub(got))) = decode(&mut b, MAX_FRAME) else {
        panic!("SUB did not decode");
    };
    assert_eq!(got.group, None);
}

#[test]
fn long_err_message_is_cut_on_a_char_boundary() {
    // 65534 ASCII bytes then a 3-byte char: the 65535-byte limit falls inside the char.
    let message = format!("{}€tail", "x".repeat(u16::MAX as usize - 1));
    let f = Frame::Err {
        code: ErrorCode::Protocol,
        message: message.clone(),
    };
    let mut b = encoded(&f);
    assert_eq!(b.len(), HEADER_LEN + 2 + 2 + (u16::MAX as usize - 1));
    let got = decode(&mut b, MAX_FRAME).expect("valid UTF-8 after the cut");
    assert_eq!(
        got,
        Some(Frame::Err {
            code: ErrorCode::Protocol,
            message: "x".repeat(u16::MAX as usize - 1),
        })
    );

    // Exactly 65535 bytes are kept whole.
    let message = "é".repeat(30_000) + &"y".repeat(5_535);
    assert_eq!(message.len(), u16::MAX as usize);
    let f = Frame::Err {
        code: ErrorCode::Other(4242),
        message,
    };
    let mut b = encoded(&f);
    assert_eq!(decode(&mut b, MAX_FRAME), Ok(Some(f)));
}

#[test]
fn every_frame_type_round_trips() {
    let key = Key::new("a/b").expect("valid");
    let msg = Message {
        key: key.clone(),
        payload: Bytes::from_static(b"hi"),
        reply_to: Some(Key::new("_inbox/1/r").expect("valid")),
        correlation_id: Some(Bytes::from_static(b"c1")),
        headers: Some(vec![("h".into(), Bytes::from_static(b"v"))]),
        attrs: Default::default(),
    };
    let frames = vec![
        Frame::Hello(Hello {
            version: 1,
            flags: 0,
            name: "client".into(),
            auth: Bytes::new(),
        }),
        Frame::Welcome(Welcome {
            version: 1,
            session: 9,
            max_payload: 1 << 20,
            server: "hayate".into(),
            inbox: "_inbox/9".into(),
            shm: None,
        }),
        Frame::Pub(msg.clone()),
        Frame::Pub(Message::new(key.clone(), Bytes::new())),
        Frame::Sub(Sub {
            sid: 1,
            qos: Qos::BEST_EFFORT_DROP,
            group: Some("g".into()),
            expr: KeyExpr::new("**").expect("valid"),
        }),
        Frame::Unsub { sid: 1 },
        Frame::Msg { sid: 2, msg },
        Frame::PubBatch {
            key: key.clone(),
            payloads: vec![Bytes::new(), Bytes::from_static(b"x")],
        },
        Frame::MsgBatch {
            sid: 3,
            key,
            payloads: Items::new(&[Bytes::from_static(b"y")]),
        },
        Frame::Ping(u64::MAX),
        Frame::Pong(0),
        Frame::Lost { sid: 4, count: 5 },
        Frame::MsgRef {
            sid: 4,
            at: 64,
            len: 100,
            tag: 9,
        },
        Frame::Err {
            code: ErrorCode::BadKey,
            message: "bad".into(),
        },
        Frame::Close,
    ];
    let (mut buf, _) = encode_all(&frames);
    for f in &frames {
        assert_eq!(decode(&mut buf, MAX_FRAME).as_ref(), Ok(&Some(f.clone())));
    }
    assert!(buf.is_empty());
}

#[test]
fn hello_auth_forms_round_trip_and_garbage_is_refused() {
    use hayate_native::HelloAuth;
    for a in [
        HelloAuth::Anonymous,
        HelloAuth::Password {
            user: "alice".into(),
            password: bytes::Bytes::from_static(b"s3cret\0x"),
        },
        HelloAuth::Password {
            user: String::new(),
            password: bytes::Bytes::new(),
        },
        HelloAuth::Token(bytes::Bytes::from_static(b"hyt_abc")),
    ] {
        assert_eq!(HelloAuth::decode(&a.encode()), Some(a.clone()), "{a:?}");
    }
    for bad in [
        &b"\x03"[..],
        b"\x01",
        b"\x01\x00\x05ab",
        b"\x01\x00\x01a\x00\x02x",
        b"\x01\x00\x01a\x00\x01xy",
        b"\x01\x00\x01\xff\x00\x00",
    ] {
        assert_eq!(
            HelloAuth::decode(&bytes::Bytes::copy_from_slice(bad)),
            None,
            "{bad:?}"
        );
    }
}

#[test]
fn refusal_names_a_second_hello_and_server_frames() {
    let hello = Frame::Hello(Hello {
        version: 1,
        flags: 0,
        name: String::new(),
        auth: Bytes::new(),
    });
    assert_eq!(
        hayate_native::refusal(&hello),
        (ErrorCode::Protocol, "HELLO was already received")
    );
    assert_eq!(
        hayate_native::refusal(&Frame::Lost { sid: 1, count: 1 }),
        (ErrorCode::Protocol, "a client may not send this frame")
    );
}
