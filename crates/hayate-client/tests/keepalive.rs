//! The client's keepalive: it PINGs a silent server and gives up a dead one.

#![allow(clippy::unwrap_used, clippy::expect_used)]

#[allow(dead_code)] // each test file uses some of the helpers
mod common;

use std::time::Duration;

use bytes::BytesMut;
use hayate_client::{Client, ConnectOptions};
use hayate_native::{Frame, decode, encode};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// A server that answers HELLO with WELCOME and then, if `answer`, answers PINGs; otherwise
/// stays silent. Returns its address and a channel of the PINGs it saw.
async fn server(answer: bool) -> (String, tokio::sync::mpsc::UnboundedReceiver<u64>) {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap().to_string();
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        let (mut s, _) = l.accept().await.unwrap();
        let mut buf = BytesMut::new();
        loop {
            while let Ok(Some(f)) = decode(&mut buf, 1 << 20) {
                let mut out = BytesMut::new();
                match f {
                    Frame::Hello(_) => out = common::welcome("fake"),
                    Frame::Ping(t) => {
                        let _ = tx.send(t);
                        if answer {
                            encode(&Frame::Pong(t), &mut out);
                        }
                    }
                    _ => {}
                }
                if !out.is_empty() {
                    s.write_all(&out).await.unwrap();
                }
            }
            if s.read_buf(&mut buf).await.unwrap_or(0) == 0 {
                return;
            }
        }
    });
    (addr, rx)
}

fn options() -> ConnectOptions {
    ConnectOptions {
        ping_interval: Some(Duration::from_millis(100)),
        max_pings_out: 2,
        ..ConnectOptions::default()
    }
}

#[tokio::test]
async fn a_dead_server_is_given_up() {
    let (addr, mut pings) = server(false).await;
    let c = Client::connect_with(&addr, options()).await.unwrap();
    let t0 = std::time::Instant::now();
    tokio::time::timeout(Duration::from_secs(5), async {
        while !c.is_closed() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("the client never gave up the silent server");
    assert!(
        t0.elapsed() >= Duration::from_millis(250),
        "gave up too early"
    );
    let mut seen = 0;
    while pings.try_recv().is_ok() {
        seen += 1;
    }
    // The first PING may be the client's flush of the inbox subscription: at least 2.
    assert!(seen >= 2, "{seen} PINGs");
    let e = c.last_error().expect("an error says why");
    assert!(e.to_string().contains("presumed dead"), "{e}");
}

#[tokio::test]
async fn a_live_server_keeps_the_connection() {
    let (addr, mut pings) = server(true).await;
    let c = Client::connect_with(&addr, options()).await.unwrap();
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert!(!c.is_closed(), "{:?}", c.last_error());
    assert!(
        pings.try_recv().is_ok(),
        "the client pinged the silent-but-alive server"
    );
}
