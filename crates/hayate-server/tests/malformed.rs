//! Bad input gets ERR and a close; the broker keeps serving everyone else.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use bytes::BytesMut;
use common::{start_default, within};
use hayate_client::{Client, Key};
use hayate_native::{ErrorCode, Frame, Hello, PROTOCOL_VERSION, decode, encode};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

fn hello() -> Vec<u8> {
    let mut b = BytesMut::new();
    encode(
        &Frame::Hello(Hello {
            version: PROTOCOL_VERSION,
            flags: 0,
            name: "raw".into(),
            auth: Default::default(),
        }),
        &mut b,
    );
    b.to_vec()
}

/// Sends `bytes` on a raw connection and returns every frame received until the server
/// closes the connection.
async fn exchange(addr: &str, bytes: &[u8]) -> Vec<Frame> {
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(bytes).await.unwrap();
    let mut buf = BytesMut::new();
    within(10, async {
        loop {
            let n = s.read_buf(&mut buf).await.unwrap_or(0);
            if n == 0 {
                break;
            }
        }
    })
    .await;
    let mut frames = Vec::new();
    while let Some(f) = decode(&mut buf, 1 << 20).unwrap() {
        frames.push(f);
    }
    frames
}

fn last_error(frames: &[Frame]) -> ErrorCode {
    match frames.last() {
        Some(Frame::Err { code, .. }) => *code,
        other => panic!("expected ERR last, got {other:?}"),
    }
}

#[tokio::test]
async fn bad_frames_get_err_and_close_while_others_carry_on() {
    let b = start_default().await;
    // A healthy pair of clients that keeps working throughout.
    let c = Client::connect(&b.addr).await.unwrap();
    let mut sub = c.subscribe("ok/**").await.unwrap();
    c.flush().await.unwrap();

    let h = hello();
    let mut cases: Vec<(&str, Vec<u8>, ErrorCode)> = vec![
        (
            "unknown type",
            [&h[..], &[0, 0, 0, 1, 0x7f]].concat(),
            ErrorCode::UnknownFrame,
        ),
        (
            "zero length",
            [&h[..], &[0, 0, 0, 0, 0x03]].concat(),
            ErrorCode::Malformed,
        ),
        (
            "too large",
            [&h[..], &[0xff, 0xff, 0xff, 0xff, 0x03]].concat(),
            ErrorCode::FrameTooLarge,
        ),
        (
            "truncated SUB",
            [&h[..], &[0, 0, 0, 3, 0x04, 0, 0]].concat(),
            ErrorCode::Malformed,
        ),
        // PUB with flags 0, key "a//b" (empty segment).
        (
            "bad key",
            [&h[..], &[0, 0, 0, 8, 0x03, 0, 0, 4, b'a', b'/', b'/', b'b']].concat(),
            ErrorCode::BadKey,
        ),
        (
            "PUB before HELLO",
            vec![0, 0, 0, 5, 0x03, 0, 0, 1, b'a'],
            ErrorCode::Protocol,
        ),
        (
            "second HELLO",
            [&h[..], &h[..]].concat(),
            ErrorCode::Protocol,
        ),
        (
            "server-only frame",
            [
                &h[..],
                &[0, 0, 0, 13, 0x0B, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 1],
            ]
            .concat(),
            ErrorCode::Protocol,
        ),
    ];
    // HELLO with version 9.
    let mut v9 = h.clone();
    v9[9..11].copy_from_slice(&9u16.to_be_bytes());
    cases.push(("bad version", v9, ErrorCode::UnsupportedVersion));
    // Duplicate subscription id.
    let mut dup = BytesMut::from(&h[..]);
    let sub_frame = Frame::Sub(hayate_native::Sub {
        sid: 7,
        qos: Default::default(),
        group: None,
        expr: "a/*".parse().unwrap(),
    });
    encode(&sub_frame, &mut dup);
    encode(&sub_frame, &mut dup);
    cases.push(("duplicate sid", dup.to_vec(), ErrorCode::BadSubscription));

    for (name, bytes, want) in cases {
        let frames = exchange(&b.addr, &bytes).await;
        assert_eq!(last_error(&frames), want, "case {name}: {frames:?}");
        // The broker still serves the healthy client.
        c.publish(&Key::new("ok/x").unwrap(), name).await.unwrap();
        let m = within(10, sub.next()).await.unwrap();
        assert_eq!(m.payload, name.as_bytes(), "case {name}");
    }
}

#[tokio::test]
async fn graceful_close_and_ping() {
    let b = start_default().await;
    let mut bytes = BytesMut::from(&hello()[..]);
    encode(&Frame::Ping(42), &mut bytes);
    encode(&Frame::Close, &mut bytes);
    let frames = exchange(&b.addr, &bytes).await;
    assert!(matches!(frames[0], Frame::Welcome(_)), "{frames:?}");
    assert_eq!(frames[1], Frame::Pong(42));
    assert_eq!(frames.len(), 2);
}
