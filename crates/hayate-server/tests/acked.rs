//! Acknowledged delivery on the native protocol (MSG_ACKED / ACK / NACK), the server's
//! keepalive PINGs, the zero-length frame and the no-echo subscription bit.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::HashMap;
use std::time::Duration;

use bytes::BytesMut;
use common::{start, start_default, within};
use hayate_client::{Client, Key, Qos, SubscribeOptions};
use hayate_native::{ErrorCode, Frame, Hello, PROTOCOL_VERSION, decode, encode};
use hayate_server::Config;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

fn key(s: &str) -> Key {
    Key::new(s).unwrap()
}

#[tokio::test]
async fn slow_acker_gets_every_message_once_and_the_window_holds_the_rest() {
    let mut c = Config::default();
    c.limits.max_unacked = 8;
    let b = start(c).await;
    let sub_c = Client::connect(&b.addr).await.unwrap();
    let mut sub = sub_c.subscribe_acked("jobs/*", None).await.unwrap();
    sub_c.flush().await.unwrap();
    let p = Client::connect(&b.addr).await.unwrap();
    for i in 0..200u32 {
        p.publish(&key("jobs/a"), i.to_string()).await.unwrap();
    }
    p.flush().await.unwrap();
    let mut seen = Vec::new();
    let mut last_id = 0;
    within(20, async {
        while seen.len() < 200 {
            let m = sub.next().await.unwrap();
            assert!(m.attrs.delivery > last_id, "delivery ids increase");
            assert!(!m.attrs.redelivered);
            last_id = m.attrs.delivery;
            seen.push(String::from_utf8(m.payload.to_vec()).unwrap());
            if seen.len() % 10 == 0 {
                // A slow consumer: the broker holds the rest behind the window of 8.
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            sub_c.ack(&m).unwrap();
        }
    })
    .await;
    let want: Vec<String> = (0..200).map(|i| i.to_string()).collect();
    assert_eq!(seen, want, "every message once, in order");
    // Nothing more arrives: every delivery was acknowledged.
    sub_c.flush().await.unwrap();
    assert!(
        tokio::time::timeout(Duration::from_millis(100), sub.next())
            .await
            .is_err()
    );
    assert_eq!(
        b.broker
            .stats()
            .dropped
            .load(std::sync::atomic::Ordering::Relaxed),
        0
    );
}

#[tokio::test]
async fn window_stops_deliveries_until_acked() {
    let mut c = Config::default();
    c.limits.max_unacked = 4;
    let b = start(c).await;
    let sub_c = Client::connect(&b.addr).await.unwrap();
    let mut sub = sub_c.subscribe_acked("w/x", None).await.unwrap();
    sub_c.flush().await.unwrap();
    let p = Client::connect(&b.addr).await.unwrap();
    for i in 0..10u32 {
        p.publish(&key("w/x"), i.to_string()).await.unwrap();
    }
    p.flush().await.unwrap();
    let mut got = Vec::new();
    for _ in 0..4 {
        got.push(within(5, sub.next()).await.unwrap());
    }
    // The window is full: the fifth waits for an acknowledgement.
    assert!(
        tokio::time::timeout(Duration::from_millis(200), sub.next())
            .await
            .is_err()
    );
    // A cumulative ACK of the fourth frees all four.
    sub_c.ack_through(&got[3]).unwrap();
    for i in 4..8 {
        let m = within(5, sub.next()).await.unwrap();
        assert_eq!(&m.payload[..], i.to_string().as_bytes());
    }
}

#[tokio::test]
async fn nack_redelivers_marked_redelivered() {
    let b = start_default().await;
    let sub_c = Client::connect(&b.addr).await.unwrap();
    let mut sub = sub_c.subscribe_acked("n/x", None).await.unwrap();
    sub_c.flush().await.unwrap();
    let p = Client::connect(&b.addr).await.unwrap();
    p.publish(&key("n/x"), "one").await.unwrap();
    p.flush().await.unwrap();
    let first = within(5, sub.next()).await.unwrap();
    assert!(!first.attrs.redelivered);
    sub_c.nack(&first).unwrap();
    let again = within(5, sub.next()).await.unwrap();
    assert_eq!(&again.payload[..], b"one");
    assert!(again.attrs.redelivered);
    assert_ne!(
        again.attrs.delivery, first.attrs.delivery,
        "a new delivery id"
    );
    sub_c.ack(&again).unwrap();
    sub_c.flush().await.unwrap();
    assert!(
        tokio::time::timeout(Duration::from_millis(100), sub.next())
            .await
            .is_err()
    );
}

#[tokio::test]
async fn nack_in_a_group_goes_to_another_member() {
    let b = start_default().await;
    let a = Client::connect(&b.addr).await.unwrap();
    let mut sa = a.subscribe_acked("g/*", Some("workers")).await.unwrap();
    a.flush().await.unwrap();
    let c = Client::connect(&b.addr).await.unwrap();
    let mut sc = c.subscribe_acked("g/*", Some("workers")).await.unwrap();
    c.flush().await.unwrap();
    let p = Client::connect(&b.addr).await.unwrap();
    p.publish(&key("g/1"), "job").await.unwrap();
    p.flush().await.unwrap();
    // Whoever got it gives it back; the other member gets it, redelivered.
    let (first, other) = tokio::select! {
        m = sa.next() => { a.nack(&m.unwrap()).unwrap(); (0, within(5, sc.next()).await.unwrap()) }
        m = sc.next() => { c.nack(&m.unwrap()).unwrap(); (1, within(5, sa.next()).await.unwrap()) }
    };
    let _ = first;
    assert_eq!(&other.payload[..], b"job");
    assert!(other.attrs.redelivered);
}

#[tokio::test]
async fn disconnect_hands_unacked_messages_to_another_member() {
    let b = start_default().await;
    let quitter = Client::connect(&b.addr).await.unwrap();
    let mut sq = quitter.subscribe_acked("d/*", Some("q")).await.unwrap();
    quitter.flush().await.unwrap();
    let p = Client::connect(&b.addr).await.unwrap();
    for i in 0..20u32 {
        p.publish(&key("d/x"), i.to_string()).await.unwrap();
    }
    p.flush().await.unwrap();
    // The only member receives all twenty, acknowledges the first five and goes away.
    let mut got = Vec::new();
    for _ in 0..20 {
        got.push(within(5, sq.next()).await.unwrap());
    }
    for m in &got[..5] {
        quitter.ack(m).unwrap();
    }
    quitter.flush().await.unwrap();
    // A second member joins, then the first disconnects.
    let stayer = Client::connect(&b.addr).await.unwrap();
    let mut ss = stayer.subscribe_acked("d/*", Some("q")).await.unwrap();
    stayer.flush().await.unwrap();
    quitter.close().await.unwrap();
    drop(sq);
    let mut counts: HashMap<String, u32> = HashMap::new();
    within(10, async {
        while counts.len() < 15 {
            let m = ss.next().await.unwrap();
            assert!(m.attrs.redelivered);
            *counts
                .entry(String::from_utf8(m.payload.to_vec()).unwrap())
                .or_default() += 1;
            stayer.ack(&m).unwrap();
        }
    })
    .await;
    let mut keys: Vec<u32> = counts.keys().map(|k| k.parse().unwrap()).collect();
    keys.sort_unstable();
    assert_eq!(
        keys,
        (5..20).collect::<Vec<_>>(),
        "the 15 unacknowledged, once each"
    );
    assert!(counts.values().all(|&n| n == 1));
}

#[tokio::test]
async fn ack_of_an_unknown_delivery_is_ignored_and_plain_messages_cannot_be_acked() {
    let b = start_default().await;
    let c = Client::connect(&b.addr).await.unwrap();
    let mut sub = c.subscribe("plain/x").await.unwrap();
    c.flush().await.unwrap();
    c.publish(&key("plain/x"), "p").await.unwrap();
    let m = within(5, sub.next()).await.unwrap();
    assert_eq!(m.attrs.delivery, 0);
    assert!(c.ack(&m).is_err(), "not from an acknowledged subscription");
    // A raw ACK / NACK of an id never delivered: ignored, the connection carries on.
    let mut s = raw_welcomed(&b.addr).await;
    let mut out = BytesMut::new();
    encode(
        &Frame::Ack {
            delivery: 99,
            cumulative: true,
        },
        &mut out,
    );
    encode(
        &Frame::Nack {
            delivery: 7,
            delay_ms: 0,
        },
        &mut out,
    );
    encode(&Frame::Ping(5), &mut out);
    s.write_all(&out).await.unwrap();
    let frames = read_frames_until(&mut s, |f| matches!(f, Frame::Pong(5))).await;
    assert!(frames.iter().all(|f| !matches!(f, Frame::Err { .. })));
}

async fn raw_welcomed(addr: &str) -> TcpStream {
    let mut s = TcpStream::connect(addr).await.unwrap();
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
    s.write_all(&b).await.unwrap();
    read_frames_until(&mut s, |f| matches!(f, Frame::Welcome(_))).await;
    s
}

/// Reads frames until one matches `stop` (returned last) or the connection closes.
async fn read_frames_until(s: &mut TcpStream, stop: impl Fn(&Frame) -> bool) -> Vec<Frame> {
    let mut buf = BytesMut::new();
    let mut frames = Vec::new();
    within(10, async {
        loop {
            while let Some(f) = decode(&mut buf, 1 << 20).unwrap() {
                let done = stop(&f);
                frames.push(f);
                if done {
                    return;
                }
            }
            if s.read_buf(&mut buf).await.unwrap_or(0) == 0 {
                return;
            }
        }
    })
    .await;
    frames
}

#[tokio::test]
async fn zero_length_frame_is_malformed_at_once() {
    let b = start_default().await;
    let mut s = raw_welcomed(&b.addr).await;
    // Four zero bytes alone: answered at once, without waiting for a fifth byte.
    s.write_all(&[0, 0, 0, 0]).await.unwrap();
    let frames = read_frames_until(&mut s, |_| false).await;
    match frames.last() {
        Some(Frame::Err { code, .. }) => assert_eq!(*code, ErrorCode::Malformed),
        other => panic!("expected ERR 2, got {other:?}"),
    }
}

#[tokio::test]
async fn server_pings_an_idle_client_and_closes_a_dead_one() {
    let mut c = Config::default();
    c.native.ping_interval_ms = 100;
    c.native.max_pings_out = 2;
    let b = start(c).await;
    // A client that never answers: PINGs, then ERR 9 and a close.
    let mut dead = raw_welcomed(&b.addr).await;
    let t0 = std::time::Instant::now();
    let frames = read_frames_until(&mut dead, |_| false).await;
    let pings = frames
        .iter()
        .filter(|f| matches!(f, Frame::Ping(_)))
        .count();
    assert_eq!(pings, 2, "{frames:?}");
    match frames.last() {
        Some(Frame::Err { code, .. }) => assert_eq!(code.code(), 9),
        other => panic!("expected ERR 9, got {other:?}"),
    }
    assert!(t0.elapsed() < Duration::from_secs(5));
    // The client library answers PINGs: it stays connected through many intervals.
    let live = Client::connect(&b.addr).await.unwrap();
    let mut sub = live.subscribe("alive/x").await.unwrap();
    live.flush().await.unwrap();
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert!(!live.is_closed());
    live.publish(&key("alive/x"), "still here").await.unwrap();
    assert_eq!(
        &within(5, sub.next()).await.unwrap().payload[..],
        b"still here"
    );
}

#[tokio::test]
async fn no_echo_skips_the_sessions_own_publishes() {
    let b = start_default().await;
    let c = Client::connect(&b.addr).await.unwrap();
    let mut echo = c.subscribe("e/x").await.unwrap();
    let mut quiet = c
        .subscribe_with(
            "e/x",
            SubscribeOptions {
                group: None,
                qos: Qos {
                    no_echo: true,
                    ..Qos::default()
                },
            },
        )
        .await
        .unwrap();
    c.flush().await.unwrap();
    c.publish(&key("e/x"), "mine").await.unwrap();
    let other = Client::connect(&b.addr).await.unwrap();
    other.publish(&key("e/x"), "theirs").await.unwrap();
    other.flush().await.unwrap();
    // The plain subscription sees both (a session receives its own publishes by default).
    assert_eq!(&within(5, echo.next()).await.unwrap().payload[..], b"mine");
    assert_eq!(
        &within(5, echo.next()).await.unwrap().payload[..],
        b"theirs"
    );
    // The no-echo one only the other session's.
    assert_eq!(
        &within(5, quiet.next()).await.unwrap().payload[..],
        b"theirs"
    );
}
