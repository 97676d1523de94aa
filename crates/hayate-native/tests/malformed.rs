//! Malformed input: each case asserts the exact `DecodeError` and the ERR code it maps to,
//! and a property checks that arbitrary bytes never panic the decoder.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use bytes::BytesMut;
use hayate_core::KeyError;
use hayate_native::{
    DecodeError, ErrorCode, Frame, HEADER_LEN, MAGIC, MAX_BATCH_ITEMS, decode, decode_frame, encode,
};
use proptest::collection::vec;
use proptest::prelude::*;

const MAX_FRAME: usize = 1 << 20;

// Frame type bytes (docs/protocol.md).
const HELLO: u8 = 0x01;
const WELCOME: u8 = 0x02;
const PUB: u8 = 0x03;
const SUB: u8 = 0x04;
const UNSUB: u8 = 0x05;
const MSG: u8 = 0x06;
const PUB_BATCH: u8 = 0x07;
const MSG_BATCH: u8 = 0x08;
const PING: u8 = 0x09;
const PONG: u8 = 0x0A;
const LOST: u8 = 0x0B;
const MSG_REF: u8 = 0x14;
const ERR: u8 = 0x0C;
const CLOSE: u8 = 0x0D;

/// Builds a body from pieces.
fn cat(parts: &[&[u8]]) -> Vec<u8> {
    parts.concat()
}

fn str16(s: &[u8]) -> Vec<u8> {
    let mut v = (s.len() as u16).to_be_bytes().to_vec();
    v.extend_from_slice(s);
    v
}

fn bytes32(s: &[u8]) -> Vec<u8> {
    let mut v = (s.len() as u32).to_be_bytes().to_vec();
    v.extend_from_slice(s);
    v
}

/// A frame with a correct length field.
fn frame(t: u8, body: &[u8]) -> BytesMut {
    raw((body.len() + 1) as u32, t, body)
}

/// A frame with the given length field, whatever the body.
fn raw(len: u32, t: u8, body: &[u8]) -> BytesMut {
    let mut b = BytesMut::new();
    b.extend_from_slice(&len.to_be_bytes());
    b.extend_from_slice(&[t]);
    b.extend_from_slice(body);
    b
}

fn malformed(frame: &'static str, what: &'static str) -> DecodeError {
    DecodeError::Malformed { frame, what }
}

/// Decodes `buf` and asserts the error and its code.
#[track_caller]
fn assert_err(mut buf: BytesMut, want: DecodeError, code: ErrorCode) {
    let got = decode(&mut buf, MAX_FRAME);
    assert_eq!(got, Err(want.clone()));
    assert_eq!(want.code(), code);
    assert_eq!(want.code().code(), code.code());
}

#[track_caller]
fn assert_malformed(buf: BytesMut, frame: &'static str, what: &'static str) {
    assert_err(buf, malformed(frame, what), ErrorCode::Malformed);
}

#[track_caller]
fn assert_bad_key(buf: BytesMut, e: KeyError) {
    assert_err(buf, DecodeError::BadKey(e), ErrorCode::BadKey);
}

fn hello_body(magic: u32) -> Vec<u8> {
    cat(&[
        &magic.to_be_bytes(),
        &1u16.to_be_bytes(),
        &0u16.to_be_bytes(),
        &str16(b"cli"),
        &bytes32(b""),
    ])
}

fn welcome_body() -> Vec<u8> {
    cat(&[
        &1u16.to_be_bytes(),
        &7u64.to_be_bytes(),
        &1024u64.to_be_bytes(),
        &str16(b"srv"),
        &str16(b"_inbox/7"),
    ])
}

fn sub_body(qos: u8, group: &[u8], expr: &[u8]) -> Vec<u8> {
    cat(&[&1u32.to_be_bytes(), &[qos], &str16(group), &str16(expr)])
}

fn pub_body(flags: u8, key: &[u8], rest: &[u8]) -> Vec<u8> {
    cat(&[&[flags], &str16(key), rest])
}

fn msg_body(flags: u8, key: &[u8], rest: &[u8]) -> Vec<u8> {
    cat(&[&9u32.to_be_bytes(), &[flags], &str16(key), rest])
}

// ---------------------------------------------------------------------------------------
// Header

#[test]
fn sanity_the_valid_bodies_decode() {
    for (t, body) in [
        (HELLO, hello_body(MAGIC)),
        (WELCOME, welcome_body()),
        (SUB, sub_body(0, b"", b"a/*")),
        (PUB, pub_body(0, b"a/b", b"payload")),
        (MSG, msg_body(0, b"a/b", b"")),
    ] {
        let mut b = frame(t, &body);
        assert!(
            matches!(decode(&mut b, MAX_FRAME), Ok(Some(_))),
            "type {t:#x}"
        );
        assert!(b.is_empty());
    }
}

#[test]
fn unknown_frame_type() {
    for t in [0x00, 0x15, 0x7F, 0xFF] {
        // Refused from the header alone, body or not.
        assert_err(
            raw(100, t, &[]),
            DecodeError::UnknownFrame(t),
            ErrorCode::UnknownFrame,
        );
        assert_err(
            frame(t, b"abc"),
            DecodeError::UnknownFrame(t),
            ErrorCode::UnknownFrame,
        );
    }
}

#[test]
fn zero_length() {
    // Refused as soon as the length is read, whatever follows: the next byte is not this
    // frame's type (a length of 0 cannot include one) but the start of the next frame.
    for t in [PING, CLOSE, 0x42] {
        assert_malformed(raw(0, t, &[]), "frame", "length 0");
    }
    let mut alone = BytesMut::from(&[0u8; 4][..]);
    assert_eq!(
        decode(&mut alone, MAX_FRAME),
        Err(DecodeError::Malformed {
            frame: "frame",
            what: "length 0"
        })
    );
    assert_eq!(alone.len(), 4, "nothing consumed");
    // `00 00 00 00` then a valid PING: ERR 2, not a PING with a byte swallowed.
    let mut then_ping = BytesMut::from(&[0u8; 4][..]);
    then_ping.extend_from_slice(&frame(PING, &7u64.to_be_bytes()));
    let e = decode(&mut then_ping, MAX_FRAME).expect_err("length 0");
    assert_eq!(e.code(), ErrorCode::Malformed);
    assert_eq!(e.code().code(), 2);
}

#[test]
fn too_large_is_refused_from_the_header_alone() {
    for len in [MAX_FRAME as u32 + 1, u32::MAX] {
        let mut b = raw(len, PUB, &[]);
        assert_eq!(b.len(), HEADER_LEN);
        assert_eq!(
            decode(&mut b, MAX_FRAME),
            Err(DecodeError::TooLarge {
                len: len as usize,
                max: MAX_FRAME
            })
        );
        assert_eq!(b.len(), HEADER_LEN, "nothing consumed");
    }
    let mut b = raw(11, PING, &[]);
    let e = decode(&mut b, 10).expect_err("too large");
    assert_eq!(e, DecodeError::TooLarge { len: 11, max: 10 });
    assert_eq!(e.code(), ErrorCode::FrameTooLarge);
    assert_eq!(e.code().code(), 3);
    // At the limit the frame is merely incomplete.
    let mut b = raw(MAX_FRAME as u32, PUB, &[]);
    assert_eq!(decode(&mut b, MAX_FRAME), Ok(None));
    assert_eq!(b.len(), HEADER_LEN);
}

#[test]
fn incomplete_header_or_body_is_not_an_error() {
    for n in 0..=4 {
        let mut b = BytesMut::from(&[0xFFu8; 4][..n]);
        assert_eq!(decode(&mut b, MAX_FRAME), Ok(None));
    }
    let mut whole = frame(PING, &5u64.to_be_bytes());
    let mut partial = whole.split_to(whole.len() - 1);
    assert_eq!(decode(&mut partial, MAX_FRAME), Ok(None));
    partial.unsplit(whole);
    assert_eq!(decode(&mut partial, MAX_FRAME), Ok(Some(Frame::Ping(5))));
}

// ---------------------------------------------------------------------------------------
// Truncated fields: the length field says the frame ends before its fields do.

#[test]
fn truncated_hello() {
    let full = hello_body(MAGIC);
    assert_malformed(frame(HELLO, &full[..3]), "HELLO", "magic");
    assert_malformed(frame(HELLO, &full[..5]), "HELLO", "version");
    assert_malformed(frame(HELLO, &full[..7]), "HELLO", "flags");
    assert_malformed(frame(HELLO, &full[..9]), "HELLO", "name");
    // name says 3 bytes, 2 present
    assert_malformed(frame(HELLO, &full[..12]), "HELLO", "name");
    assert_malformed(frame(HELLO, &full[..14]), "HELLO", "auth");
    let body = cat(&[&full[..13], &bytes32(b"secret")[..7]]);
    assert_malformed(frame(HELLO, &body), "HELLO", "auth");
}

#[test]
fn truncated_welcome() {
    let full = welcome_body();
    assert_malformed(frame(WELCOME, &[]), "WELCOME", "version");
    assert_malformed(frame(WELCOME, &full[..9]), "WELCOME", "session");
    assert_malformed(frame(WELCOME, &full[..17]), "WELCOME", "max payload");
    assert_malformed(frame(WELCOME, &full[..19]), "WELCOME", "server");
    assert_malformed(frame(WELCOME, &full[..full.len() - 1]), "WELCOME", "inbox");
}

#[test]
fn truncated_sub() {
    let full = sub_body(1, b"grp", b"a/**");
    // Length 3: type + 2 bytes, though the buffer holds the whole SUB body after it.
    let mut b = raw(3, SUB, &full);
    assert_eq!(decode(&mut b, MAX_FRAME), Err(malformed("SUB", "sid")));
    assert_eq!(
        b.len(),
        full.len() - 2,
        "the 3-byte frame was consumed, no more"
    );
    assert_malformed(frame(SUB, &full[..4]), "SUB", "qos");
    assert_malformed(frame(SUB, &full[..6]), "SUB", "group");
    assert_malformed(frame(SUB, &full[..9]), "SUB", "group");
    assert_malformed(frame(SUB, &full[..10]), "SUB", "expr");
    assert_malformed(frame(SUB, &full[..full.len() - 1]), "SUB", "expr");
}

#[test]
fn truncated_unsub_ping_pong_lost_err() {
    assert_malformed(frame(UNSUB, &[0, 0, 1]), "UNSUB", "sid");
    assert_malformed(frame(PING, &[0; 7]), "PING", "token");
    assert_malformed(frame(PONG, &[]), "PONG", "token");
    assert_malformed(frame(LOST, &[0; 3]), "LOST", "sid");
    assert_malformed(frame(LOST, &[0; 11]), "LOST", "count");
    assert_malformed(frame(ERR, &[0]), "ERR", "code");
    assert_malformed(frame(ERR, &[0, 2]), "ERR", "message");
    assert_malformed(frame(ERR, &[0, 2, 0, 5, b'a']), "ERR", "message");
    assert_malformed(frame(MSG_REF, &[0; 3]), "MSG_REF", "sid");
    assert_malformed(frame(MSG_REF, &[0; 11]), "MSG_REF", "at");
    assert_malformed(frame(MSG_REF, &[0; 15]), "MSG_REF", "len");
    assert_malformed(frame(MSG_REF, &[0; 23]), "MSG_REF", "tag");
}

#[test]
fn truncated_pub_and_msg() {
    assert_malformed(frame(PUB, &[]), "PUB", "flags");
    assert_malformed(frame(PUB, &[0, 0]), "PUB", "key");
    assert_malformed(frame(PUB, &[0, 0, 3, b'a']), "PUB", "key");
    assert_malformed(frame(MSG, &[0, 0, 0]), "MSG", "sid");
    assert_malformed(frame(MSG, &[0, 0, 0, 1]), "MSG", "flags");
    assert_malformed(frame(MSG, &[0, 0, 0, 1, 0, 0, 9, b'a']), "MSG", "key");

    // Options whose flag is set but whose bytes are missing or cut short.
    for (t, name) in [(PUB, "PUB"), (MSG, "MSG")] {
        let body = |flags: u8, rest: &[u8]| {
            if t == PUB {
                pub_body(flags, b"a", rest)
            } else {
                msg_body(flags, b"a", rest)
            }
        };
        assert_malformed(frame(t, &body(0x01, &[])), name, "reply-to");
        assert_malformed(frame(t, &body(0x01, &[0, 4, b'r'])), name, "reply-to");
        assert_malformed(frame(t, &body(0x02, &[0])), name, "correlation id");
        assert_malformed(frame(t, &body(0x02, &[0, 2, 1])), name, "correlation id");
        assert_malformed(frame(t, &body(0x04, &[0])), name, "header count");
        assert_malformed(frame(t, &body(0x04, &[0, 1])), name, "header name");
        assert_malformed(
            frame(t, &body(0x04, &[0, 1, 0, 1, b'h'])),
            name,
            "header value",
        );
        let rest = cat(&[&[0, 1], &str16(b"h"), &[0, 0, 0, 5, b'v']]);
        assert_malformed(frame(t, &body(0x04, &rest)), name, "header value");
        // Count says 2, one header present.
        let rest = cat(&[&[0, 2], &str16(b"h"), &bytes32(b"v")]);
        assert_malformed(frame(t, &body(0x04, &rest)), name, "header name");
        // All three: reply-to and correlation present, headers missing.
        let rest = cat(&[&str16(b"r"), &str16(b"c")]);
        assert_malformed(frame(t, &body(0x07, &rest)), name, "header count");
    }
}

#[test]
fn truncated_batches() {
    assert_malformed(frame(PUB_BATCH, &[0]), "PUB_BATCH", "key");
    assert_malformed(frame(PUB_BATCH, &[0, 5, b'a', b'b']), "PUB_BATCH", "key");
    assert_malformed(frame(MSG_BATCH, &[0, 0]), "MSG_BATCH", "sid");
    assert_malformed(frame(MSG_BATCH, &[0, 0, 0, 1, 0]), "MSG_BATCH", "key");
    // An item length prefix cut short.
    let body = cat(&[&str16(b"k"), &[0, 0]]);
    assert_malformed(frame(PUB_BATCH, &body), "PUB_BATCH", "batch payload");
}

// ---------------------------------------------------------------------------------------
// Trailing bytes

#[test]
fn trailing_bytes() {
    let cases: [(u8, &'static str, Vec<u8>); 10] = [
        (HELLO, "HELLO", hello_body(MAGIC)),
        // WELCOME's optional `shm` last: after it, nothing more.
        (WELCOME, "WELCOME", cat(&[&welcome_body(), &str16(b"")])),
        (SUB, "SUB", sub_body(0, b"", b"a")),
        (UNSUB, "UNSUB", 1u32.to_be_bytes().to_vec()),
        (PING, "PING", 1u64.to_be_bytes().to_vec()),
        (PONG, "PONG", 1u64.to_be_bytes().to_vec()),
        (LOST, "LOST", [0u8; 12].to_vec()),
        (ERR, "ERR", cat(&[&2u16.to_be_bytes(), &str16(b"oops")])),
        (CLOSE, "CLOSE", Vec::new()),
        (MSG_REF, "MSG_REF", [0u8; 24].to_vec()),
    ];
    for (t, name, mut body) in cases {
        body.push(0);
        assert_malformed(frame(t, &body), name, "trailing bytes");
    }
    // One byte after `inbox` is a cut `shm` field.
    let body = cat(&[&welcome_body(), &[0]]);
    assert_malformed(frame(WELCOME, &body), "WELCOME", "shm");
}

// ---------------------------------------------------------------------------------------
// Reserved bits

#[test]
fn reserved_flag_bits_in_pub_and_msg() {
    for flags in [0x08, 0x10, 0x80, 0xFF] {
        assert_malformed(
            frame(PUB, &pub_body(flags, b"a/b", b"x")),
            "PUB",
            "reserved flag bits set",
        );
        assert_malformed(
            frame(MSG, &msg_body(flags, b"a/b", b"x")),
            "MSG",
            "reserved flag bits set",
        );
    }
}

#[test]
fn reserved_qos_bits_in_sub() {
    for qos in [0x20, 0x40, 0x80, 0xFF] {
        assert_malformed(
            frame(SUB, &sub_body(qos, b"", b"a")),
            "SUB",
            "reserved qos bits",
        );
    }
}

// ---------------------------------------------------------------------------------------
// Keys, strings and magic

#[test]
fn invalid_utf8_key() {
    assert_bad_key(frame(PUB, &pub_body(0, b"a/\xff", b"")), KeyError::NotUtf8);
    assert_bad_key(frame(MSG, &msg_body(0, b"\xc3", b"")), KeyError::NotUtf8);
    assert_bad_key(frame(SUB, &sub_body(0, b"", b"a/\xfe")), KeyError::NotUtf8);
    let body = cat(&[&str16(b"\x80"), &bytes32(b"p")]);
    assert_bad_key(frame(PUB_BATCH, &body), KeyError::NotUtf8);
}

#[test]
fn invalid_utf8_strings_are_malformed() {
    let mut hello = hello_body(MAGIC);
    let name_at = 10; // magic 4, version 2, flags 2, name length 2
    hello[name_at] = 0xFF;
    assert_malformed(frame(HELLO, &hello), "HELLO", "string is not UTF-8");
    assert_malformed(
        frame(SUB, &sub_body(0, b"g\xff", b"a")),
        "SUB",
        "string is not UTF-8",
    );
    let body = cat(&[&2u16.to_be_bytes(), &str16(b"\xe2\x82")]);
    assert_malformed(frame(ERR, &body), "ERR", "string is not UTF-8");
    let rest = cat(&[&[0, 1], &str16(b"\xff"), &bytes32(b"v")]);
    assert_malformed(
        frame(PUB, &pub_body(0x04, b"a", &rest)),
        "PUB",
        "string is not UTF-8",
    );
}

#[test]
fn empty_segment_and_empty_keys() {
    for key in [&b"a//b"[..], b"/a", b"a/", b"/"] {
        assert_bad_key(frame(PUB, &pub_body(0, key, b"")), KeyError::EmptySegment);
        assert_bad_key(frame(SUB, &sub_body(0, b"", key)), KeyError::EmptySegment);
    }
    assert_bad_key(frame(PUB, &pub_body(0, b"", b"")), KeyError::Empty);
    assert_bad_key(frame(SUB, &sub_body(0, b"", b"")), KeyError::Empty);
    let body = cat(&[&1u32.to_be_bytes(), &str16(b""), &bytes32(b"p")]);
    assert_bad_key(frame(MSG_BATCH, &body), KeyError::Empty);
}

#[test]
fn wildcard_in_a_concrete_key() {
    assert_bad_key(
        frame(PUB, &pub_body(0, b"a/*", b"")),
        KeyError::Wildcard("*"),
    );
    assert_bad_key(
        frame(PUB, &pub_body(0, b"**/b", b"")),
        KeyError::Wildcard("**"),
    );
    assert_bad_key(frame(MSG, &msg_body(0, b"*", b"")), KeyError::Wildcard("*"));
    // The reply-to key is a concrete key too.
    let body = pub_body(0x01, b"a", &str16(b"r/**"));
    assert_bad_key(frame(PUB, &body), KeyError::Wildcard("**"));
    let body = cat(&[&str16(b"x/*"), &bytes32(b"p")]);
    assert_bad_key(frame(PUB_BATCH, &body), KeyError::Wildcard("*"));
    // In an expression `*` must be a whole segment.
    assert_bad_key(
        frame(SUB, &sub_body(0, b"", b"a/b*")),
        KeyError::PartialWildcard,
    );
}

#[test]
fn bad_hello_magic() {
    assert_err(
        frame(HELLO, &hello_body(0x4854_5450)),
        DecodeError::BadMagic(0x4854_5450),
        ErrorCode::UnsupportedVersion,
    );
}

// ---------------------------------------------------------------------------------------
// Batches

#[test]
fn empty_batch() {
    assert_malformed(frame(PUB_BATCH, &str16(b"a/b")), "PUB_BATCH", "empty batch");
    let body = cat(&[&1u32.to_be_bytes(), &str16(b"a/b")]);
    assert_malformed(frame(MSG_BATCH, &body), "MSG_BATCH", "empty batch");
}

#[test]
fn batch_item_count_is_capped() {
    // MAX_BATCH_ITEMS empty items decode; one more is refused (an item is 4 bytes on the wire
    // but a whole `Bytes` once decoded).
    let items = |n: usize| vec![0u8; 4 * n];
    let at_cap = cat(&[&str16(b"a"), &items(MAX_BATCH_ITEMS)]);
    match decode(&mut frame(PUB_BATCH, &at_cap), MAX_FRAME) {
        Ok(Some(Frame::PubBatch { payloads, .. })) => assert_eq!(payloads.len(), MAX_BATCH_ITEMS),
        other => panic!("expected a PUB_BATCH, got {other:?}"),
    }
    let over = cat(&[&str16(b"a"), &items(MAX_BATCH_ITEMS + 1)]);
    assert_malformed(
        frame(PUB_BATCH, &over),
        "PUB_BATCH",
        "more than 65536 batch items",
    );
    let over = cat(&[
        &1u32.to_be_bytes(),
        &str16(b"a"),
        &items(MAX_BATCH_ITEMS + 1),
    ]);
    assert_malformed(
        frame(MSG_BATCH, &over),
        "MSG_BATCH",
        "more than 65536 batch items",
    );
}

#[test]
fn batch_item_overruns_the_frame() {
    let body = cat(&[&str16(b"a"), &bytes32(b"ok"), &[0, 0, 0, 10, 1, 2, 3]]);
    assert_malformed(frame(PUB_BATCH, &body), "PUB_BATCH", "batch payload");
    let body = cat(&[
        &1u32.to_be_bytes(),
        &str16(b"a"),
        &u32::MAX.to_be_bytes(),
        b"x",
    ]);
    assert_malformed(frame(MSG_BATCH, &body), "MSG_BATCH", "batch payload");
    // The item length reaches into the next frame in the buffer: still refused.
    let mut b = frame(PUB_BATCH, &cat(&[&str16(b"a"), &[0, 0, 0, 13]]));
    let mut next = BytesMut::new();
    encode(&Frame::Ping(1), &mut next);
    b.unsplit(next);
    assert_eq!(
        decode(&mut b, MAX_FRAME),
        Err(malformed("PUB_BATCH", "batch payload"))
    );
    assert_eq!(decode(&mut b, MAX_FRAME), Ok(Some(Frame::Ping(1))));
}

// ---------------------------------------------------------------------------------------
// Arbitrary input

/// Mostly-well-framed junk: frames of random type (including unknown ones) with a length
/// that is right or a little off, and random bodies.
fn framed_junk() -> impl Strategy<Value = Vec<u8>> {
    vec((0u8..16, vec(any::<u8>(), 0..64), -2i32..=2), 0..8).prop_map(|frames| {
        let mut v = Vec::new();
        for (t, body, skew) in frames {
            let len = (body.len() as i32 + 1 + skew).max(0) as u32;
            v.extend_from_slice(&len.to_be_bytes());
            v.push(t);
            v.extend_from_slice(&body);
        }
        v
    })
}

/// Checks the decode contract on `input`; returns the frames decoded before the first error.
fn check_decode(input: &[u8], max_frame: usize) -> Result<(), TestCaseError> {
    let mut buf = BytesMut::from(input);
    loop {
        let before = buf.len();
        match decode(&mut buf, max_frame) {
            Ok(Some(f)) => {
                let consumed = before - buf.len();
                prop_assert!(
                    consumed >= HEADER_LEN,
                    "a frame consumes at least its header"
                );
                // What was decoded re-encodes to exactly the bytes it came from.
                let at = input.len() - before;
                let mut again = BytesMut::new();
                encode(&f, &mut again);
                prop_assert_eq!(&again[..], &input[at..at + consumed]);
            }
            Ok(None) => {
                prop_assert_eq!(buf.len(), before, "Ok(None) consumes nothing");
                // Only when the header or the announced frame is really incomplete.
                if buf.len() >= HEADER_LEN {
                    let len = u32::from_be_bytes([buf[0], buf[1], buf[2], buf[3]]) as usize;
                    prop_assert!(buf.len() < 4 + len);
                }
                return Ok(());
            }
            Err(_) => return Ok(()),
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2048))]

    #[test]
    fn arbitrary_bytes_never_panic(input in vec(any::<u8>(), 0..512), small in any::<bool>()) {
        check_decode(&input, if small { 64 } else { MAX_FRAME })?;
    }

    #[test]
    fn framed_junk_never_panics(input in framed_junk()) {
        check_decode(&input, MAX_FRAME)?;
    }

    /// `decode_frame` (a fan-out entry read in place) takes exactly what `decode` takes as
    /// one whole frame filling the buffer, and refuses the rest (never panics).
    #[test]
    fn decode_frame_agrees_with_decode(input in framed_junk(), small in any::<bool>()) {
        let max = if small { 64 } else { MAX_FRAME };
        let mut buf = BytesMut::from(&input[..]);
        let streamed = decode(&mut buf, max);
        let whole = decode_frame(bytes::Bytes::copy_from_slice(&input), max);
        match streamed {
            Ok(Some(f)) if buf.is_empty() => prop_assert_eq!(whole, Ok(f)),
            _ => prop_assert!(whole.is_err(), "{whole:?}"),
        }
    }
}
