//! Unit tests of the STOMP codec: every command, escaping in each version, bodies with and
//! without `content-length`, line ends, heart-beats, repeated headers, and every error.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use bytes::BytesMut;
use hayate_stomp::{
    Command, DecodeError, Frame, Item, Limits, Version, decode, encode, encode_message,
    encode_message_head, encode_send, escape, unescape,
};

const ALL: [Version; 3] = Version::ALL;

fn buf(b: &[u8]) -> BytesMut {
    BytesMut::from(b)
}

/// Decodes one item from `bytes` with default limits.
fn one(bytes: &[u8], version: Version) -> Result<Option<Item>, DecodeError> {
    decode(&mut buf(bytes), version, &Limits::default())
}

/// Decodes one frame from `bytes` and checks it consumed everything.
fn frame(bytes: &[u8], version: Version) -> Frame {
    let mut b = buf(bytes);
    match decode(&mut b, version, &Limits::default()) {
        Ok(Some(Item::Frame(f))) => {
            assert!(b.is_empty(), "left over: {:?}", &b[..]);
            f
        }
        other => panic!("expected a frame, got {other:?}"),
    }
}

fn err(bytes: &[u8], version: Version, limits: &Limits) -> DecodeError {
    let mut b = buf(bytes);
    let before = b.clone();
    let e = decode(&mut b, version, limits).expect_err("expected an error");
    assert_eq!(b, before, "an error leaves the buffer as it was");
    e
}

fn encoded(f: &Frame, version: Version) -> Vec<u8> {
    let mut out = BytesMut::new();
    encode(f, version, &mut out);
    out.to_vec()
}

// ---------------------------------------------------------------------------------------
// Versions and commands

#[test]
fn version_negotiation() {
    assert_eq!(Version::parse_accept("1.0,1.1,1.2"), Some(Version::V1_2));
    assert_eq!(Version::parse_accept("1.2,1.0"), Some(Version::V1_2));
    assert_eq!(Version::parse_accept("1.0"), Some(Version::V1_0));
    assert_eq!(Version::parse_accept("1.1, 1.0"), Some(Version::V1_1));
    assert_eq!(Version::parse_accept("1.1,3.0"), Some(Version::V1_1));
    assert_eq!(Version::parse_accept("2.0,1.3"), None);
    assert_eq!(Version::parse_accept(""), None);
    assert_eq!(Version::V1_2.as_str(), "1.2");
    assert_eq!(Version::V1_1.to_string(), "1.1");
    assert_eq!(Version::V1_0.as_str(), "1.0");
    assert!(Version::V1_0 < Version::V1_1 && Version::V1_1 < Version::V1_2);
    for v in ALL {
        assert_eq!(Version::parse(v.as_str()), Some(v));
    }
}

#[test]
fn command_names() {
    for c in Command::ALL {
        assert_eq!(Command::from_bytes(c.as_str().as_bytes()), Some(c));
        assert_eq!(c.to_string(), c.as_str());
    }
    assert_eq!(Command::from_bytes(b"send"), None);
    assert_eq!(Command::from_bytes(b"SEND "), None);
    assert_eq!(Command::from_bytes(b""), None);
}

#[test]
fn every_command_round_trips() {
    for v in ALL {
        for c in Command::ALL {
            let f = Frame::new(c).header("receipt", "r-1").header("id", "7");
            let wire = encoded(&f, v);
            assert!(wire.starts_with(format!("{}\n", c.as_str()).as_bytes()));
            assert_eq!(frame(&wire, v), f, "{c} in {v}");
        }
    }
}

#[test]
fn exact_wire_bytes() {
    let f = Frame::new(Command::Subscribe)
        .header("id", "0")
        .header("destination", "/queue/a")
        .header("ack", "client");
    assert_eq!(
        encoded(&f, Version::V1_2),
        b"SUBSCRIBE\nid:0\ndestination:/queue/a\nack:client\n\n\0"
    );
    let f = Frame::new(Command::Send)
        .header("destination", "/q")
        .body(&b"hi"[..]);
    assert_eq!(
        encoded(&f, Version::V1_2),
        b"SEND\ndestination:/q\ncontent-length:2\n\nhi\0"
    );
    // An empty body gets no content-length.
    let f = Frame::new(Command::Send).header("destination", "/q");
    assert_eq!(encoded(&f, Version::V1_2), b"SEND\ndestination:/q\n\n\0");
    // A content-length the frame carries is not repeated.
    let f = Frame::new(Command::Message)
        .header("content-length", "3")
        .body(&b"abc"[..]);
    assert_eq!(
        encoded(&f, Version::V1_1),
        b"MESSAGE\ncontent-length:3\n\nabc\0"
    );
    // ERROR frames get one too.
    let f = Frame::new(Command::Error)
        .header("message", "bad")
        .body(&b"details"[..]);
    assert_eq!(
        encoded(&f, Version::V1_0),
        b"ERROR\nmessage:bad\ncontent-length:7\n\ndetails\0"
    );
}

#[test]
fn builder_and_get() {
    let f = Frame::new(Command::Send)
        .header("a", "1")
        .header("b", "2")
        .header("a", "3")
        .body(vec![1u8, 2, 3]);
    assert_eq!(f.get("a"), Some("1"));
    assert_eq!(f.get("b"), Some("2"));
    assert_eq!(f.get("c"), None);
    assert_eq!(f.headers.len(), 3);
    assert_eq!(&f.body[..], &[1, 2, 3]);
}

// ---------------------------------------------------------------------------------------
// Escaping

#[test]
fn escape_and_unescape() {
    let mut out = BytesMut::new();
    escape("plain", &mut out);
    assert_eq!(&out[..], b"plain");
    out.clear();
    escape("a:b\nc\rd\\e", &mut out);
    assert_eq!(&out[..], b"a\\cb\\nc\\rd\\\\e");
    out.clear();
    escape("", &mut out);
    assert!(out.is_empty());

    assert_eq!(unescape("plain").unwrap(), "plain");
    assert!(matches!(
        unescape("plain").unwrap(),
        std::borrow::Cow::Borrowed(_)
    ));
    assert_eq!(unescape("a\\cb\\nc\\rd\\\\e").unwrap(), "a:b\nc\rd\\e");
    assert_eq!(unescape("\\\\n").unwrap(), "\\n");
    assert_eq!(unescape("é\\cü").unwrap(), "é:ü");
    assert_eq!(
        unescape("x\\t").unwrap_err(),
        DecodeError::BadEscape("\\t".into())
    );
    assert_eq!(
        unescape("end\\").unwrap_err(),
        DecodeError::BadEscape("\\".into())
    );
    assert_eq!(
        unescape("\\é").unwrap_err(),
        DecodeError::BadEscape("\\é".into())
    );
}

#[test]
fn headers_are_escaped_in_1_1_and_1_2() {
    let f = Frame::new(Command::Send).header("we:ird\\", "line1\nline2:x\ry");
    for v in [Version::V1_1, Version::V1_2] {
        let wire = encoded(&f, v);
        assert_eq!(wire, b"SEND\nwe\\cird\\\\:line1\\nline2\\cx\\ry\n\n\0");
        assert_eq!(frame(&wire, v), f);
    }
}

#[test]
fn decoding_unescapes_in_1_1_and_1_2_only() {
    let wire = b"MESSAGE\nfoo\\cbar:a\\\\b\\nc\n\n\0";
    for v in [Version::V1_1, Version::V1_2] {
        let f = frame(wire, v);
        assert_eq!(f.headers, vec![("foo:bar".into(), "a\\b\nc".into())]);
    }
    // 1.0: backslashes are plain characters, and the name ends at the first ':'.
    let f = frame(wire, Version::V1_0);
    assert_eq!(f.headers, vec![("foo\\cbar".into(), "a\\\\b\\nc".into())]);
    // ... so an "invalid" escape is fine in 1.0.
    let f = frame(b"SEND\nx:tab\\t\n\n\0", Version::V1_0);
    assert_eq!(f.get("x"), Some("tab\\t"));
}

#[test]
fn connect_and_connected_are_never_escaped() {
    for v in ALL {
        for c in [Command::Connect, Command::Connected] {
            let wire = format!("{c}\nlogin:dom\\ain\\user\npasscode:a\\tb\n\n\0");
            let f = frame(wire.as_bytes(), v);
            assert_eq!(f.get("login"), Some("dom\\ain\\user"), "{c} {v}");
            assert_eq!(f.get("passcode"), Some("a\\tb"), "{c} {v}");
            // and encoding writes them back verbatim.
            assert_eq!(encoded(&f, v), wire.as_bytes());
        }
    }
    // STOMP is escaped like any other frame.
    assert_eq!(
        err(
            b"STOMP\nlogin:a\\tb\n\n\0",
            Version::V1_2,
            &Limits::default()
        ),
        DecodeError::BadEscape("\\t".into())
    );
}

#[test]
fn unescaped_frames_cannot_carry_line_ends() {
    // 1.0 (and CONNECT) have no escaping: CR and LF are written as spaces so the frame stays
    // well-formed, and backslashes and ':' in values go out verbatim.
    let f = Frame::new(Command::Send).header("a", "x\ny\rz:\\");
    assert_eq!(encoded(&f, Version::V1_0), b"SEND\na:x y z:\\\n\n\0");
    let f = Frame::new(Command::Connect).header("host", "a\nb");
    assert_eq!(encoded(&f, Version::V1_2), b"CONNECT\nhost:a b\n\n\0");
}

// ---------------------------------------------------------------------------------------
// Bodies

#[test]
fn content_length_body_may_hold_nuls() {
    for v in ALL {
        let body = b"\0a\0\0b\0";
        let wire = [
            &b"SEND\ndestination:/q\ncontent-length:6\n\n"[..],
            body,
            b"\0",
        ]
        .concat();
        let f = frame(&wire, v);
        assert_eq!(&f.body[..], body);
        assert_eq!(f.get("content-length"), Some("6"));
        // Encoding a frame with such a body round-trips.
        let g = Frame::new(Command::Message)
            .header("destination", "/q")
            .body(&body[..]);
        let back = frame(&encoded(&g, v), v);
        assert_eq!(&back.body[..], body);
        assert_eq!(back.get("content-length"), Some("6"));
    }
}

#[test]
fn body_without_content_length_runs_to_first_nul() {
    let mut b = buf(b"SEND\ndestination:/q\n\nhello\0world\0");
    let limits = Limits::default();
    let Some(Item::Frame(f)) = decode(&mut b, Version::V1_2, &limits).unwrap() else {
        panic!()
    };
    assert_eq!(&f.body[..], b"hello");
    assert_eq!(&b[..], b"world\0");
    // What follows waits for its command line's LF (and will then be rejected).
    assert_eq!(decode(&mut b, Version::V1_2, &limits), Ok(None));
    b.extend_from_slice(b"\n\n\0");
    assert_eq!(
        decode(&mut b, Version::V1_2, &limits).unwrap_err(),
        DecodeError::UnknownCommand("world\\u{0}".into())
    );
}

#[test]
fn content_length_zero_and_blank_tolerance() {
    let f = frame(b"SEND\ncontent-length:0\n\n\0", Version::V1_2);
    assert!(f.body.is_empty());
    let f = frame(b"SEND\ncontent-length: 3 \n\nab\0\0", Version::V1_2);
    assert_eq!(&f.body[..], b"ab\0");
    // Only the first content-length counts.
    let f = frame(
        b"SEND\ncontent-length:2\ncontent-length:junk\n\nab\0",
        Version::V1_2,
    );
    assert_eq!(&f.body[..], b"ab");
    assert_eq!(f.get("content-length"), Some("2"));
}

#[test]
fn body_is_a_slice_of_the_read_buffer() {
    let mut b = buf(b"SEND\ncontent-length:4\n\nbody\0");
    let start = b.as_ptr() as usize;
    let Some(Item::Frame(f)) = decode(&mut b, Version::V1_2, &Limits::default()).unwrap() else {
        panic!()
    };
    let body_at = f.body.as_ptr() as usize;
    assert_eq!(body_at - start, "SEND\ncontent-length:4\n\n".len());
}

// ---------------------------------------------------------------------------------------
// Line ends, heart-beats, partial input

#[test]
fn crlf_line_ends() {
    let wire = b"MESSAGE\r\ndestination:/q\r\nx:a\\rb\r\ncontent-length:2\r\n\r\nhi\0";
    for v in ALL {
        let f = frame(wire, v);
        assert_eq!(f.command, Command::Message);
        assert_eq!(f.get("destination"), Some("/q"));
        assert_eq!(&f.body[..], b"hi");
    }
    assert_eq!(frame(wire, Version::V1_2).get("x"), Some("a\rb"));
    assert_eq!(frame(wire, Version::V1_0).get("x"), Some("a\\rb"));
    // Only one CR is a line end.
    let f = frame(b"SEND\r\nx:a\r\r\n\r\n\0", Version::V1_0);
    assert_eq!(f.get("x"), Some("a\r"));
}

#[test]
fn heart_beats_between_frames() {
    let mut b = buf(b"\n\r\nRECEIPT\nreceipt-id:1\n\n\0\n\nERROR\n\n\0\r\n");
    let limits = Limits::default();
    let mut items = Vec::new();
    while let Some(item) = decode(&mut b, Version::V1_2, &limits).unwrap() {
        items.push(item);
    }
    assert!(b.is_empty());
    assert_eq!(
        items,
        vec![
            Item::HeartBeat,
            Item::HeartBeat,
            Item::Frame(Frame::new(Command::Receipt).header("receipt-id", "1")),
            Item::HeartBeat,
            Item::HeartBeat,
            Item::Frame(Frame::new(Command::Error)),
            Item::HeartBeat,
        ]
    );
}

#[test]
fn lone_cr_waits_for_more() {
    let mut b = buf(b"\r");
    assert_eq!(
        decode(&mut b, Version::V1_2, &Limits::default()).unwrap(),
        None
    );
    assert_eq!(&b[..], b"\r");
    // A CR that is not part of an EOL is not a command.
    assert!(matches!(
        one(b"\rSEND\n\n\0", Version::V1_2),
        Err(DecodeError::UnknownCommand(_))
    ));
}

#[test]
fn every_prefix_needs_more() {
    let wire = b"SEND\r\ndestination:/q\ncontent-length:3\n\na\0b\0";
    for v in ALL {
        for n in 0..wire.len() {
            let mut b = buf(&wire[..n]);
            assert_eq!(
                decode(&mut b, v, &Limits::default()),
                Ok(None),
                "prefix {n}"
            );
            assert_eq!(&b[..], &wire[..n], "Ok(None) leaves the buffer untouched");
        }
        assert_eq!(&frame(wire, v).body[..], b"a\0b");
    }
}

#[test]
fn repeated_headers_first_wins() {
    let f = frame(b"MESSAGE\nfoo:World\nfoo:Hello\nbar:1\n\n\0", Version::V1_2);
    assert_eq!(f.get("foo"), Some("World"));
    assert_eq!(
        f.headers,
        vec![
            ("foo".into(), "World".into()),
            ("foo".into(), "Hello".into()),
            ("bar".into(), "1".into()),
        ]
    );
}

#[test]
fn values_keep_colons_and_blanks() {
    let f = frame(
        b"SEND\nurl: http://x:80/ \n:empty-name\nempty:\n\n\0",
        Version::V1_0,
    );
    assert_eq!(f.get("url"), Some(" http://x:80/ "));
    assert_eq!(f.get(""), Some("empty-name"));
    assert_eq!(f.get("empty"), Some(""));
}

// ---------------------------------------------------------------------------------------
// Hot-path encoders

#[test]
fn encode_send_matches_encode() {
    for v in ALL {
        let mut fast = BytesMut::new();
        encode_send(
            "/q/a:b",
            &[("x", "1\n"), ("receipt", "r")],
            b"a\0b",
            v,
            &mut fast,
        );
        let f = frame(&fast, v);
        let expect = Frame::new(Command::Send)
            .header("destination", "/q/a:b")
            .header("x", if v == Version::V1_0 { "1 " } else { "1\n" })
            .header("receipt", "r")
            .header("content-length", "3")
            .body(&b"a\0b"[..]);
        assert_eq!(f, expect);
        assert_eq!(&fast[..], &encoded(&expect, v)[..]);
    }
    // Empty body: content-length:0.
    let mut out = BytesMut::new();
    encode_send("/q", &[], b"", Version::V1_2, &mut out);
    assert_eq!(&out[..], b"SEND\ndestination:/q\ncontent-length:0\n\n\0");
}

#[test]
fn encode_message_matches_encode() {
    for v in ALL {
        let mut fast = BytesMut::new();
        encode_message(
            "/t",
            "sub-0",
            "m:1",
            &[("ack", "a")],
            b"payload",
            v,
            &mut fast,
        );
        let expect = Frame::new(Command::Message)
            .header("destination", "/t")
            .header("subscription", "sub-0")
            .header("message-id", "m:1")
            .header("ack", "a")
            .header("content-length", "7")
            .body(&b"payload"[..]);
        assert_eq!(frame(&fast, v), expect);
        assert_eq!(&fast[..], &encoded(&expect, v)[..]);

        let mut head = BytesMut::new();
        encode_message_head("/t", "sub-0", "m:1", &[("ack", "a")], 7, v, &mut head);
        head.extend_from_slice(b"payload\0");
        assert_eq!(head, fast);
    }
    // A big length is written in full.
    let mut head = BytesMut::new();
    encode_message_head("d", "s", "m", &[], usize::MAX, Version::V1_2, &mut head);
    assert!(head.ends_with(format!("content-length:{}\n\n", usize::MAX).as_bytes()));
}

// ---------------------------------------------------------------------------------------
// Errors: one test per variant

#[test]
fn error_unknown_command() {
    let l = Limits::default();
    assert_eq!(
        err(b"FOO\n\n\0", Version::V1_2, &l),
        DecodeError::UnknownCommand("FOO".into())
    );
    assert_eq!(
        err(b"send\n\n\0", Version::V1_2, &l),
        DecodeError::UnknownCommand("send".into())
    );
    // Rejected early: no command line is this long, even before its LF arrives.
    assert_eq!(
        err(b"GET / HTTP/1.1", Version::V1_2, &l),
        DecodeError::UnknownCommand("GET / HTTP/1.".into())
    );
    assert_eq!(
        err(b"GET / HTTP/1.1", Version::V1_2, &l).to_string(),
        "unknown command \"GET / HTTP/1.\""
    );
}

#[test]
fn error_bad_header_line() {
    let e = err(
        b"SEND\ndestination:/q\nnocolon\n\n\0",
        Version::V1_2,
        &Limits::default(),
    );
    assert_eq!(e, DecodeError::BadHeaderLine("nocolon".into()));
    assert_eq!(
        e.to_string(),
        "malformed header line \"nocolon\" (expected name:value)"
    );
    // Reported before the frame is complete.
    assert_eq!(
        err(b"SEND\nnocolon\nx:", Version::V1_2, &Limits::default()),
        DecodeError::BadHeaderLine("nocolon".into())
    );
}

#[test]
fn error_bad_escape() {
    for v in [Version::V1_1, Version::V1_2] {
        let e = err(b"SEND\nx:a\\tb\n\n\0", v, &Limits::default());
        assert_eq!(e, DecodeError::BadEscape("\\t".into()));
        assert!(e.to_string().starts_with("invalid escape sequence \"\\t\""));
        // A raw ':' ends the name, leaving a lone '\' at its end.
        assert_eq!(
            err(b"SEND\nx\\:a\n\n\0", v, &Limits::default()),
            DecodeError::BadEscape("\\".into())
        );
        assert_eq!(
            err(b"SEND\nx:a\\\n\n\0", v, &Limits::default()),
            DecodeError::BadEscape("\\".into())
        );
    }
}

#[test]
fn error_bad_content_length() {
    for raw in ["abc", "", "-1", "1.5", "0x10", "+3"] {
        let wire = format!("SEND\ncontent-length:{raw}\n\n\0");
        let e = err(wire.as_bytes(), Version::V1_2, &Limits::default());
        assert_eq!(e, DecodeError::BadContentLength(raw.into()), "{raw}");
    }
    assert_eq!(
        DecodeError::BadContentLength("x".into()).to_string(),
        "invalid content-length \"x\" (expected a decimal number of bytes)"
    );
}

#[test]
fn error_missing_nul() {
    let e = err(
        b"SEND\ncontent-length:2\n\nabc\0",
        Version::V1_2,
        &Limits::default(),
    );
    assert_eq!(e, DecodeError::MissingNul(2));
    assert_eq!(
        e.to_string(),
        "frame body is not followed by a NUL octet after content-length 2 bytes"
    );
}

#[test]
fn error_too_many_headers() {
    let l = Limits {
        max_headers: 2,
        ..Limits::default()
    };
    assert!(one(b"SEND\na:1\nb:2\n\n\0", Version::V1_2).is_ok());
    assert!(matches!(
        decode(&mut buf(b"SEND\na:1\nb:2\n\n\0"), Version::V1_2, &l),
        Ok(Some(Item::Frame(_)))
    ));
    // Early: the third header line is enough.
    let e = err(b"SEND\na:1\nb:2\nc:3\n", Version::V1_2, &l);
    assert_eq!(e, DecodeError::TooManyHeaders { max: 2 });
    assert_eq!(e.to_string(), "too many headers (at most 2 are allowed)");
}

#[test]
fn error_headers_too_long() {
    let l = Limits {
        max_header_bytes: 16,
        ..Limits::default()
    };
    // Exactly at the limit is fine: "SEND\n" + "a:1234567\n" + "\n" = 5 + 10 + 1 = 16.
    let ok = b"SEND\na:1234567\n\n\0";
    assert!(matches!(
        decode(&mut buf(ok), Version::V1_2, &l),
        Ok(Some(Item::Frame(_)))
    ));
    // One byte more is not, and it is reported without waiting for the blank line.
    let e = err(b"SEND\na:123456789\n", Version::V1_2, &l);
    assert_eq!(e, DecodeError::HeadersTooLong { max: 16 });
    assert_eq!(
        e.to_string(),
        "command and headers exceed the maximum of 16 bytes"
    );
    // A header line that never ends.
    let long = [&b"SEND\nx:"[..], &[b'y'; 100]].concat();
    assert_eq!(
        err(&long, Version::V1_2, &l),
        DecodeError::HeadersTooLong { max: 16 }
    );
    // A limit shorter than the command line.
    let tiny = Limits {
        max_header_bytes: 3,
        ..Limits::default()
    };
    assert_eq!(
        err(b"SEND\n\n\0", Version::V1_2, &tiny),
        DecodeError::HeadersTooLong { max: 3 }
    );
}

#[test]
fn error_body_too_large() {
    let l = Limits {
        max_body: 4,
        ..Limits::default()
    };
    // At the limit, with and without content-length.
    assert!(matches!(
        decode(
            &mut buf(b"SEND\ncontent-length:4\n\nabcd\0"),
            Version::V1_2,
            &l
        ),
        Ok(Some(Item::Frame(_)))
    ));
    assert!(matches!(
        decode(&mut buf(b"SEND\n\nabcd\0"), Version::V1_2, &l),
        Ok(Some(Item::Frame(_)))
    ));
    // content-length over the limit: rejected before any body byte arrives.
    let e = err(b"SEND\ncontent-length:5\n\n", Version::V1_2, &l);
    assert_eq!(e, DecodeError::BodyTooLarge { max: 4 });
    assert_eq!(e.to_string(), "frame body exceeds the maximum of 4 bytes");
    // content-length that overflows usize.
    assert_eq!(
        err(
            b"SEND\ncontent-length:999999999999999999999999999999\n\n",
            Version::V1_2,
            &l
        ),
        DecodeError::BodyTooLarge { max: 4 }
    );
    // No NUL within max_body bytes: rejected without waiting for more.
    assert_eq!(
        err(b"SEND\n\nabcde", Version::V1_2, &l),
        DecodeError::BodyTooLarge { max: 4 }
    );
    assert_eq!(
        decode(&mut buf(b"SEND\n\nabcd"), Version::V1_2, &l),
        Ok(None)
    );
}

#[test]
fn error_non_utf8_header() {
    for v in ALL {
        let e = err(b"SEND\nx:\xff\xfe\n\n\0", v, &Limits::default());
        assert_eq!(e, DecodeError::NonUtf8Header);
        assert_eq!(e.to_string(), "header is not valid UTF-8");
        assert_eq!(
            err(b"SEND\n\xc3:v\n\n\0", v, &Limits::default()),
            DecodeError::NonUtf8Header
        );
    }
}

#[test]
fn error_messages_quote_control_characters_and_truncate() {
    let e = err(b"SE\tND\r\n\n\0", Version::V1_2, &Limits::default());
    assert_eq!(e.to_string(), "unknown command \"SE\\tND\"");
    let long = [&b"SEND\n"[..], &[b'x'; 40], b"\n\n\0"].concat();
    let e = err(&long, Version::V1_2, &Limits::default());
    assert_eq!(
        e,
        DecodeError::BadHeaderLine(format!("{}...", "x".repeat(32)))
    );
    // An error message can travel in an ERROR frame's `message` header in any version.
    for v in ALL {
        let f = Frame::new(Command::Error).header("message", &e.to_string());
        assert_eq!(frame(&encoded(&f, v), v), f);
    }
}
