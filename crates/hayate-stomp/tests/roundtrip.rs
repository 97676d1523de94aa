//! Property tests of the STOMP codec: arbitrary frames survive encode → decode, whole or fed
//! in arbitrary pieces; the hot-path encoders agree with `encode`; and arbitrary bytes never
//! make the decoder panic or claim a frame without consuming input.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use bytes::{Bytes, BytesMut};
use hayate_stomp::{
    Command, Frame, Item, Limits, Version, decode, encode, encode_message, encode_send, escape,
    unescape,
};
use proptest::collection::vec;
use proptest::prelude::*;
use proptest::sample::Index;

// ---------------------------------------------------------------------------------------
// Strategies

/// Text rich in the characters that matter to STOMP (`:`, `\`, CR, LF, NUL, non-ASCII).
fn text() -> impl Strategy<Value = String> {
    prop_oneof![
        2 => vec(
            prop_oneof![
                Just(':'),
                Just('\\'),
                Just('\n'),
                Just('\r'),
                Just('\0'),
                Just('c'),
                Just('n'),
                Just('é'),
                Just(' '),
            ],
            0..10
        )
        .prop_map(|c| c.into_iter().collect()),
        1 => vec(any::<char>(), 0..10).prop_map(|c| c.into_iter().collect()),
        1 => "[a-z-]{0,12}",
    ]
}

/// A header name other than `content-length` (whose value the decoder interprets).
fn name() -> impl Strategy<Value = String> {
    text().prop_filter("not content-length", |n| n != "content-length")
}

/// Text that survives a frame without escaping: no CR or LF, and no `:` in names.
fn raw_text(name: bool) -> impl Strategy<Value = String> {
    text().prop_map(move |s| {
        s.chars()
            .filter(|&c| c != '\r' && c != '\n' && !(name && c == ':'))
            .collect()
    })
}

fn raw_name() -> impl Strategy<Value = String> {
    raw_text(true).prop_filter("not content-length", |n| n != "content-length")
}

fn body() -> impl Strategy<Value = Bytes> {
    prop_oneof![
        3 => vec(any::<u8>(), 0..300),
        1 => vec(prop_oneof![Just(0u8), Just(b'\n'), Just(b'a')], 0..20),
    ]
    .prop_map(Bytes::from)
}

fn escaped_command() -> impl Strategy<Value = Command> {
    proptest::sample::select(
        Command::ALL
            .into_iter()
            .filter(|c| !matches!(c, Command::Connect | Command::Connected))
            .collect::<Vec<_>>(),
    )
}

fn any_command() -> impl Strategy<Value = Command> {
    proptest::sample::select(Command::ALL.to_vec())
}

fn modern() -> impl Strategy<Value = Version> {
    prop_oneof![Just(Version::V1_1), Just(Version::V1_2)]
}

fn any_version() -> impl Strategy<Value = Version> {
    proptest::sample::select(Version::ALL.to_vec())
}

/// A frame whose headers are escaped (1.1/1.2, not CONNECT/CONNECTED), with its version.
fn escaped_frame() -> impl Strategy<Value = (Frame, Version)> {
    (
        escaped_command(),
        vec((name(), text()), 0..6),
        body(),
        modern(),
    )
        .prop_map(|(command, headers, body, v)| {
            (
                Frame {
                    command,
                    headers,
                    body,
                },
                v,
            )
        })
}

/// A frame whose headers are not escaped (1.0, or CONNECT/CONNECTED), with its version.
fn unescaped_frame() -> impl Strategy<Value = (Frame, Version)> {
    let cv = prop_oneof![
        (any_command(), Just(Version::V1_0)),
        (
            prop_oneof![Just(Command::Connect), Just(Command::Connected)],
            any_version()
        ),
    ];
    (cv, vec((raw_name(), raw_text(false)), 0..6), body()).prop_map(
        |((command, v), headers, body)| {
            (
                Frame {
                    command,
                    headers,
                    body,
                },
                v,
            )
        },
    )
}

/// What a frame decodes to after `encode`: itself, plus the `content-length` header the
/// encoder adds to a non-empty body.
fn expected(f: &Frame) -> Frame {
    let mut e = f.clone();
    if !f.body.is_empty() {
        e.headers
            .push(("content-length".into(), f.body.len().to_string()));
    }
    e
}

fn encoded(f: &Frame, v: Version) -> BytesMut {
    let mut out = BytesMut::new();
    encode(f, v, &mut out);
    out
}

/// Decodes every item of `wire`, fed in pieces that end at the given cut points.
fn decode_in_pieces(wire: &[u8], cuts: &[Index], v: Version) -> Vec<Item> {
    let mut cuts: Vec<usize> = cuts.iter().map(|i| i.index(wire.len() + 1)).collect();
    cuts.push(wire.len());
    cuts.sort_unstable();
    let limits = Limits::default();
    let mut buf = BytesMut::new();
    let mut fed = 0;
    let mut items = Vec::new();
    for cut in cuts {
        buf.extend_from_slice(&wire[fed..cut]);
        fed = cut;
        loop {
            let before = buf.clone();
            match decode(&mut buf, v, &limits).expect("valid input") {
                Some(item) => {
                    assert!(buf.len() < before.len(), "an item consumes input");
                    items.push(item);
                }
                None => {
                    assert_eq!(buf, before, "Ok(None) leaves the buffer untouched");
                    break;
                }
            }
        }
    }
    assert!(buf.is_empty());
    items
}

/// Runs the decoder over arbitrary bytes and checks its contract.
fn check_garbage(data: &[u8], v: Version, limits: &Limits) {
    let mut buf = BytesMut::from(data);
    loop {
        let before = buf.clone();
        match decode(&mut buf, v, limits) {
            Ok(Some(item)) => {
                let consumed = before.len() - buf.len();
                assert!(consumed > 0, "Ok(Some) consumed nothing");
                assert_eq!(
                    &before[consumed..],
                    &buf[..],
                    "consumes from the front only"
                );
                if let Item::Frame(f) = item {
                    assert!(f.headers.len() <= limits.max_headers);
                    assert!(f.body.len() <= limits.max_body);
                }
            }
            Ok(None) => {
                assert_eq!(buf, before, "Ok(None) leaves the buffer untouched");
                break;
            }
            Err(e) => {
                assert_eq!(buf, before, "an error leaves the buffer untouched");
                assert!(!e.to_string().is_empty());
                break;
            }
        }
    }
}

fn small_limits() -> Limits {
    Limits {
        max_headers: 3,
        max_header_bytes: 40,
        max_body: 16,
    }
}

/// Tokens that make random input look like STOMP, to reach deep into the decoder.
fn stompish() -> impl Strategy<Value = Vec<u8>> {
    let token = proptest::sample::select(vec![
        &b"SEND"[..],
        b"MESSAGE",
        b"CONNECT",
        b"ERROR",
        b"\n",
        b"\r\n",
        b"\r",
        b":",
        b"\\",
        b"\\n",
        b"\\c",
        b"\\t",
        b"content-length:",
        b"content-length:3",
        b"3",
        b"99999999999999999999999",
        b"\0",
        b"a",
        b"\xff",
        b"\xc3\xa9",
    ]);
    vec(token, 0..40).prop_map(|t| t.concat())
}

// ---------------------------------------------------------------------------------------
// Properties

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn escaped_frames_round_trip((f, v) in escaped_frame()) {
        let mut wire = encoded(&f, v);
        let item = decode(&mut wire, v, &Limits::default()).unwrap();
        prop_assert_eq!(item, Some(Item::Frame(expected(&f))));
        prop_assert!(wire.is_empty());
    }

    #[test]
    fn unescaped_frames_round_trip((f, v) in unescaped_frame()) {
        let mut wire = encoded(&f, v);
        let item = decode(&mut wire, v, &Limits::default()).unwrap();
        prop_assert_eq!(item, Some(Item::Frame(expected(&f))));
        prop_assert!(wire.is_empty());
    }

    #[test]
    fn one_frame_in_pieces((f, v) in escaped_frame(), cuts in vec(any::<Index>(), 0..8)) {
        let wire = encoded(&f, v);
        let mut cuts: Vec<usize> = cuts.iter().map(|i| i.index(wire.len())).collect();
        cuts.sort_unstable();
        let mut buf = BytesMut::new();
        let mut fed = 0;
        for cut in cuts {
            buf.extend_from_slice(&wire[fed..cut]);
            fed = cut;
            // Not complete yet: always "need more", never an error or a frame.
            prop_assert_eq!(decode(&mut buf, v, &Limits::default()), Ok(None));
            prop_assert_eq!(&buf[..], &wire[..cut]);
        }
        buf.extend_from_slice(&wire[fed..]);
        let item = decode(&mut buf, v, &Limits::default()).unwrap();
        prop_assert_eq!(item, Some(Item::Frame(expected(&f))));
        prop_assert!(buf.is_empty());
    }

    #[test]
    fn a_stream_in_pieces(
        frames in vec((escaped_frame(), 0usize..3, any::<bool>()), 1..5),
        v in modern(),
        cuts in vec(any::<Index>(), 0..12),
    ) {
        let mut wire = BytesMut::new();
        let mut expect = Vec::new();
        for ((f, _), beats, crlf) in &frames {
            encode(f, v, &mut wire);
            expect.push(Item::Frame(expected(f)));
            for _ in 0..*beats {
                wire.extend_from_slice(if *crlf { b"\r\n" } else { b"\n" });
                expect.push(Item::HeartBeat);
            }
        }
        prop_assert_eq!(decode_in_pieces(&wire, &cuts, v), expect);
    }

    #[test]
    fn encode_send_agrees_with_encode(
        dest in text(),
        headers in vec((name(), text()), 0..4),
        body in body(),
        v in any_version(),
    ) {
        let headers: Vec<(String, String)> = headers
            .into_iter()
            .filter(|(n, _)| n != "destination")
            .collect();
        let pairs: Vec<(&str, &str)> =
            headers.iter().map(|(n, v)| (n.as_str(), v.as_str())).collect();
        let mut fast = BytesMut::new();
        encode_send(&dest, &pairs, &body, v, &mut fast);
        let mut f = Frame::new(Command::Send).header("destination", &dest);
        for (n, val) in &pairs {
            f = f.header(n, val);
        }
        let f = f.header("content-length", &body.len().to_string()).body(body.clone());
        prop_assert_eq!(&fast[..], &encoded(&f, v)[..]);
    }

    #[test]
    fn encode_message_agrees_with_encode(
        dest in text(),
        sub in text(),
        id in text(),
        headers in vec((name(), text()), 0..4),
        body in body(),
        v in any_version(),
    ) {
        let pairs: Vec<(&str, &str)> =
            headers.iter().map(|(n, v)| (n.as_str(), v.as_str())).collect();
        let mut fast = BytesMut::new();
        encode_message(&dest, &sub, &id, &pairs, &body, v, &mut fast);
        let mut f = Frame::new(Command::Message)
            .header("destination", &dest)
            .header("subscription", &sub)
            .header("message-id", &id);
        for (n, val) in &pairs {
            f = f.header(n, val);
        }
        let f = f.header("content-length", &body.len().to_string()).body(body.clone());
        prop_assert_eq!(&fast[..], &encoded(&f, v)[..]);
        if v != Version::V1_0 {
            let mut wire = fast.clone();
            let item = decode(&mut wire, v, &Limits::default()).unwrap();
            prop_assert_eq!(item, Some(Item::Frame(f)));
        }
    }

    #[test]
    fn escape_round_trips(s in text()) {
        let mut out = BytesMut::new();
        escape(&s, &mut out);
        prop_assert!(!out.iter().any(|&b| b == b':' || b == b'\n' || b == b'\r'));
        let raw = std::str::from_utf8(&out).unwrap();
        prop_assert_eq!(unescape(raw).unwrap(), s.as_str());
    }

    #[test]
    fn garbage_never_panics(data in vec(any::<u8>(), 0..200), v in any_version()) {
        check_garbage(&data, v, &Limits::default());
        check_garbage(&data, v, &small_limits());
    }

    #[test]
    fn stompish_garbage_never_panics(data in stompish(), v in any_version()) {
        check_garbage(&data, v, &Limits::default());
        check_garbage(&data, v, &small_limits());
        let _ = unescape(&String::from_utf8_lossy(&data));
    }
}
