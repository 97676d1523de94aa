//! A server that sends malformed MSG_BATCH frames: the client ends the connection with a
//! protocol error, having delivered what came before intact, and never panics. And one
//! that ends the connection with an ERR right after messages: they are delivered.

#![allow(clippy::unwrap_used, clippy::expect_used)]

#[allow(dead_code)] // each test file uses some of the helpers
mod common;

use std::time::Duration;

use bytes::{Bytes, BytesMut};
use hayate_client::{Client, Error, Key};
use hayate_native::{Frame, Items, decode, encode};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// A MSG_BATCH for `sid` of `payloads` on `hb/x`, encoded.
fn batch(sid: u32, payloads: &[&'static [u8]]) -> BytesMut {
    let ps: Vec<Bytes> = payloads.iter().map(|p| Bytes::from_static(p)).collect();
    let mut out = BytesMut::new();
    encode(
        &Frame::MsgBatch {
            sid,
            key: Key::new("hb/x").unwrap(),
            payloads: Items::new(&ps),
        },
        &mut out,
    );
    out
}

/// Sets a frame's length field (the bytes after it).
fn set_len(f: &mut BytesMut) {
    let len = (f.len() - 4) as u32;
    f[..4].copy_from_slice(&len.to_be_bytes());
}

/// The malformed MSG_BATCH frames, each for `sid`.
fn malformed(sid: u32) -> Vec<(&'static str, BytesMut)> {
    // Bytes after the last payload.
    let mut junk = batch(sid, &[b"c"]);
    junk.extend_from_slice(&[0, 0, 1]);
    set_len(&mut junk);
    // The last payload's length past the frame's end.
    let mut long = batch(sid, &[b"c", b"dd"]);
    let at = long.len() - 2 - 4;
    long[at..at + 4].copy_from_slice(&3u32.to_be_bytes());
    // No payload at all.
    let mut empty = batch(sid, &[b"c"]);
    empty.truncate(empty.len() - 5);
    set_len(&mut empty);
    // One payload more than a batch may hold (each empty).
    let mut many = batch(sid, &[b""]);
    many.extend_from_slice(&vec![0u8; 4 * hayate_native::MAX_BATCH_ITEMS]);
    set_len(&mut many);
    vec![
        ("junk", junk),
        ("long", long),
        ("empty", empty),
        ("many", many),
    ]
}

/// A server that welcomes the client, and on its first SUB sends a good batch of "a" and
/// "b" for it, then `bad(sid)`; it then reads until the client goes.
async fn server(bad: BytesMut) -> String {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap().to_string();
    tokio::spawn(async move {
        let (mut s, _) = l.accept().await.unwrap();
        let mut buf = BytesMut::new();
        let mut bad = Some(bad);
        loop {
            while let Ok(Some(f)) = decode(&mut buf, 1 << 20) {
                let mut out = BytesMut::new();
                match f {
                    Frame::Hello(_) => out = common::welcome("hostile"),
                    Frame::Sub(sub) if sub.sid != u32::MAX => {
                        if let Some(mut bad) = bad.take() {
                            out.extend_from_slice(&batch(sub.sid, &[b"a", b"b"]));
                            // A bad batch names the subscription too.
                            if bad[4] == 0x08 {
                                bad[5..9].copy_from_slice(&sub.sid.to_be_bytes());
                            }
                            out.extend_from_slice(&bad);
                        }
                    }
                    Frame::Ping(t) => encode(&Frame::Pong(t), &mut out),
                    _ => {}
                }
                if !out.is_empty() && s.write_all(&out).await.is_err() {
                    return;
                }
            }
            if s.read_buf(&mut buf).await.unwrap_or(0) == 0 {
                return;
            }
        }
    });
    addr
}

#[tokio::test]
async fn a_malformed_batch_ends_the_connection_after_what_came_before() {
    for (what, bad) in malformed(0) {
        let addr = server(bad).await;
        let c = Client::connect(&addr).await.unwrap();
        let mut sub = c.subscribe("hb/x").await.unwrap();
        tokio::time::timeout(Duration::from_secs(10), async {
            // The good batch before it arrives whole: once one by one, once taken whole.
            if what == "junk" {
                let b = sub.next_batch().await.unwrap();
                assert_eq!(
                    b.payloads().collect::<Vec<_>>(),
                    [&b"a"[..], b"b"],
                    "{what}"
                );
            } else {
                assert_eq!(&sub.next().await.unwrap().payload[..], b"a", "{what}");
                assert_eq!(&sub.next().await.unwrap().payload[..], b"b", "{what}");
            }
            // Then nothing more: the subscription ends with the connection.
            assert!(
                sub.next().await.is_none(),
                "{what}: a message from the bad frame"
            );
        })
        .await
        .unwrap_or_else(|_| panic!("{what}: the subscription did not end"));
        assert!(c.is_closed(), "{what}");
        let e = c.last_error();
        if what == "err" {
            assert!(matches!(e, Some(Error::Server { .. })), "{what}: {e:?}");
        } else {
            assert!(matches!(e, Some(Error::Protocol(_))), "{what}: {e:?}");
        }
    }
}

/// A server that floods the first subscription with `frames` MSG_BATCH frames of `items`
/// payloads of `len` bytes each, numbered from 1 (the number repeated over the payload).
/// Gives its address and the bytes it has written so far.
async fn flood_server(
    frames: usize,
    items: usize,
    len: usize,
) -> (String, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap().to_string();
    let written = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let w = written.clone();
    tokio::spawn(async move {
        let (mut s, _) = l.accept().await.unwrap();
        let mut buf = BytesMut::new();
        loop {
            let Ok(Some(f)) = decode(&mut buf, 1 << 20) else {
                if s.read_buf(&mut buf).await.unwrap_or(0) == 0 {
                    return;
                }
                continue;
            };
            match f {
                Frame::Hello(_) => s.write_all(&common::welcome("flood")).await.unwrap(),
                Frame::Sub(sub) if sub.sid != u32::MAX => {
                    let mut n = 0u32;
                    for _ in 0..frames {
                        let ps: Vec<Bytes> = (0..items)
                            .map(|_| {
                                n += 1;
                                Bytes::from(n.to_be_bytes().repeat(len / 4))
                            })
                            .collect();
                        let mut out = BytesMut::new();
                        encode(
                            &Frame::MsgBatch {
                                sid: sub.sid,
                                key: Key::new("hb/x").unwrap(),
                                payloads: Items::new(&ps),
                            },
                            &mut out,
                        );
                        if s.write_all(&out).await.is_err() {
                            return;
                        }
                        w.fetch_add(out.len(), std::sync::atomic::Ordering::Relaxed);
                    }
                }
                _ => {}
            }
        }
    });
    (addr, written)
}

/// Waits until a flood stops moving (nothing taken meanwhile); gives the bytes written.
async fn stalled(written: &std::sync::atomic::AtomicUsize) -> usize {
    let mut last = 0;
    for _ in 0..50 {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let now = written.load(std::sync::atomic::Ordering::Relaxed);
        if now == last && now > 0 {
            break;
        }
        last = now;
    }
    written.load(std::sync::atomic::Ordering::Relaxed)
}

/// Takes every payload of a flood, checking each is `len` bytes and numbered in order.
async fn take_flood(sub: &mut hayate_client::Subscription, count: usize, len: usize) {
    let mut next = 1u32;
    tokio::time::timeout(Duration::from_secs(60), async {
        while (next as usize) <= count {
            let b = sub.next_batch().await.expect("the subscription ended");
            for p in b.payloads() {
                assert_eq!(p.len(), len);
                assert_eq!(u32::from_be_bytes(p[..4].try_into().unwrap()), next);
                next += 1;
            }
        }
    })
    .await
    .expect("not all of the flood arrived");
}

/// A server floods a subscriber that never takes anything: the client stops reading once
/// its subscription holds `subscription_capacity` (64) deliveries, one per MSG_BATCH, so
/// the flood stalls after a bounded amount (those, the read buffer and the kernel's socket
/// buffers), not after all of it; taken afterwards, every message arrives, in order.
#[tokio::test]
async fn a_flood_to_a_subscriber_that_never_takes_is_held_back() {
    const FRAMES: usize = 3000;
    const ITEMS: usize = 64;
    let (addr, written) = flood_server(FRAMES, ITEMS, 1024).await;
    let c = Client::connect(&addr).await.unwrap();
    let mut sub = c.subscribe("hb/x").await.unwrap();
    let total = FRAMES * ITEMS * (4 + 1024);
    // Not taking anything: wait until the flood stops moving.
    let held = stalled(&written).await;
    eprintln!(
        "the flood stalled after {} KiB of {} KiB",
        held >> 10,
        total >> 10
    );
    assert!(held > 0, "nothing was sent");
    assert!(
        held < total / 2,
        "the client took {held} bytes of {total} untaken"
    );
    // Taken now: all of it, in order, by batches.
    take_flood(&mut sub, FRAMES * ITEMS, 1024).await;
    assert!(!c.is_closed());
}

/// Large messages: the client stops reading once its subscription holds
/// `subscription_bytes` (8 MiB here) of payload, long before `subscription_capacity`
/// deliveries (64 of nearly 1 MiB); taken afterwards, every message arrives, in order.
#[tokio::test]
async fn a_flood_of_large_messages_is_held_to_subscription_bytes() {
    const FRAMES: usize = 160;
    const LEN: usize = 960 * 1024;
    const BOUND: usize = 8 << 20;
    let (addr, written) = flood_server(FRAMES, 1, LEN).await;
    let c = Client::connect_with(
        &addr,
        hayate_client::ConnectOptions {
            subscription_bytes: BOUND,
            ..Default::default()
        },
    )
    .await
    .unwrap();
    let mut sub = c.subscribe("hb/x").await.unwrap();
    let held = stalled(&written).await;
    let pending = sub.pending_bytes();
    eprintln!(
        "the flood stalled after {} KiB of {} KiB, {} KiB queued",
        held >> 10,
        (FRAMES * LEN) >> 10,
        pending >> 10
    );
    assert!(pending > 0, "nothing was queued");
    // The bound, or one delivery past it.
    assert!(pending <= BOUND + LEN, "{pending} bytes queued");
    // Besides the queue: the client's read buffer and both ends' socket buffers.
    assert!(held < 40 << 20, "the client took {held} bytes untaken");
    take_flood(&mut sub, FRAMES, LEN).await;
    assert!(!c.is_closed());
}
