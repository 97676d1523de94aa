//! The broker-wide memory budget from the outside: clients that each hold a large frame half
//! sent spend the budget; past it the others are not read and, after `max_block_ms`, get
//! ERR 11 (SERVER_BUSY) and a close, while a normal pair carries on and large messages flow
//! again once the offenders are gone.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use bytes::BytesMut;
use common::{start, within};
use hayate_client::{Client, Key};
use hayate_native::{ErrorCode, Frame, Hello, PROTOCOL_VERSION, decode, encode};
use hayate_server::Config;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const MIB: usize = 1024 * 1024;

/// A raw connection that sends HELLO and the first `sent` bytes of a PUB frame carrying
/// `size` bytes of payload, then stops sending.
async fn half_sender(addr: &str, size: usize, sent: usize) -> TcpStream {
    let mut out = BytesMut::new();
    encode(
        &Frame::Hello(Hello {
            version: PROTOCOL_VERSION,
            flags: 0,
            name: "half".into(),
            auth: Default::default(),
        }),
        &mut out,
    );
    let hello = out.len();
    encode(
        &Frame::Pub(hayate_client::Message::new(
            Key::new("big/half").unwrap(),
            vec![7u8; size],
        )),
        &mut out,
    );
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(&out[..hello + sent]).await.unwrap();
    s
}

/// Reads for up to 3 s: `Some(code of the last ERR)` if the server closed the connection
/// meanwhile, `None` if it is still open.
async fn outcome(s: &mut TcpStream) -> Option<Option<ErrorCode>> {
    let mut buf = BytesMut::new();
    let read = tokio::time::timeout(Duration::from_secs(3), async {
        while s.read_buf(&mut buf).await.unwrap_or(0) > 0 {}
    })
    .await;
    read.ok()?;
    let mut code = None;
    while let Ok(Some(f)) = decode(&mut buf, 1 << 20) {
        if let Frame::Err { code: c, .. } = f {
            code = Some(c);
        }
    }
    Some(code)
}

#[tokio::test]
async fn half_sent_frames_cannot_spend_more_than_the_budget() {
    let mut config = Config::default();
    config.limits.memory_budget = 4 * MIB as u64;
    config.limits.max_block_ms = 500;
    let b = start(config).await;
    let pool = b.broker.config().memory.clone();
    assert_eq!(pool.limit(), 4 * MIB);

    // A normal pair, working throughout. On TCP: over shared memory its connection would
    // hold 2 MiB of this 4 MiB budget (the broker's ring) for its whole life.
    let tcp = hayate_client::ConnectOptions {
        shm: hayate_client::peer::ShmMode::Off,
        ..Default::default()
    };
    let c = Client::connect_with(&b.addr, tcp).await.unwrap();
    let mut sub = c.subscribe("ok/**").await.unwrap();
    c.flush().await.unwrap();

    // Eight clients each send 3 MiB of an 8 MiB message: 24 MiB if nothing bounded them.
    let mut stallers = Vec::new();
    for _ in 0..8 {
        stallers.push(half_sender(&b.addr, 8 * MIB, 3 * MIB).await);
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(pool.used() <= pool.limit(), "overdrawn: {}", pool.used());
    c.publish(&Key::new("ok/1").unwrap(), "during")
        .await
        .unwrap();
    c.flush().await.unwrap();
    let m = within(10, sub.next()).await.unwrap();
    assert_eq!(&m.payload[..], b"during");

    // Those the budget could not cover are cut off with SERVER_BUSY after max_block_ms;
    // the budget covers at most one and a bit of them (3 MiB less the 256 KiB allowance).
    let mut busy = 0;
    let mut open = Vec::new();
    for mut s in stallers {
        match outcome(&mut s).await {
            Some(code) => {
                assert_eq!(code, Some(ErrorCode::ServerBusy));
                busy += 1;
            }
            None => open.push(s),
        }
    }
    assert!(busy >= 6, "only {busy} of 8 were cut off");
    assert!(pool.used() <= pool.limit(), "overdrawn: {}", pool.used());

    // The survivors give up; a large message from a normal client then goes through.
    // (Retained `$SYS` messages keep a step or two charged.)
    drop(open);
    within(10, async {
        while pool.used() > MIB {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    let mut big = c.subscribe("large").await.unwrap();
    c.flush().await.unwrap();
    c.publish(&Key::new("large").unwrap(), vec![1u8; 3 * MIB])
        .await
        .unwrap();
    c.flush().await.unwrap();
    let m = within(10, big.next()).await.unwrap();
    assert_eq!(m.payload.len(), 3 * MIB);
    c.publish(&Key::new("ok/2").unwrap(), "after")
        .await
        .unwrap();
    c.flush().await.unwrap();
    assert_eq!(&within(10, sub.next()).await.unwrap().payload[..], b"after");
    assert!(
        pool.peak() <= pool.limit() + 3 * MIB,
        "peak {}",
        pool.peak()
    );
}

#[tokio::test]
async fn connections_per_address_are_rate_limited() {
    let mut config = Config::default();
    config.limits.max_connection_rate_per_address = 20;
    let b = start(config).await;
    // 40 connections at once: about 20 are served, the rest closed at accept.
    let mut ok = 0;
    for _ in 0..40 {
        if Client::connect(&b.addr).await.is_ok() {
            ok += 1;
        }
    }
    assert!((20..30).contains(&ok), "{ok} of 40 accepted");
    // The bucket refills.
    tokio::time::sleep(Duration::from_millis(500)).await;
    Client::connect(&b.addr).await.unwrap();
}
