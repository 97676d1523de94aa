//! Block versus drop under a slow subscriber.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use bytes::Bytes;
use common::{start, within};
use hayate_client::{Client, ConnectOptions, Key, Qos, SubscribeOptions};
use hayate_server::Config;

const N: u32 = 20_000;
/// Enough data (50 MB) that kernel socket buffers and client buffers cannot absorb it all.
const N_BLOCK: u32 = 50_000;
const BLOCK_PAYLOAD: usize = 1000;

fn small_outbox() -> Config {
    let mut c = Config::default();
    c.limits.outbox_bytes = 16 * 1024;
    c
}

fn payload(i: u32) -> Bytes {
    sized(i, 200)
}

fn sized(i: u32, n: usize) -> Bytes {
    let mut v = vec![0u8; n];
    v[..4].copy_from_slice(&i.to_be_bytes());
    v.into()
}

fn seq(m: &hayate_client::Message) -> u32 {
    u32::from_be_bytes(m.payload[..4].try_into().unwrap())
}

/// A subscriber whose client holds little, so the broker's outbox fills quickly.
async fn slow_subscriber(addr: &str, qos: Qos) -> (Client, hayate_client::Subscription) {
    let opts = ConnectOptions {
        subscription_capacity: 1,
        ..ConnectOptions::default()
    };
    let c = Client::connect_with(addr, opts).await.unwrap();
    let s = c
        .subscribe_with("flow/x", SubscribeOptions { group: None, qos })
        .await
        .unwrap();
    c.flush().await.unwrap();
    (c, s)
}

#[tokio::test]
async fn block_loses_nothing_and_holds_the_publisher_back() {
    let b = start(small_outbox()).await;
    let (_c, mut sub) = slow_subscriber(&b.addr, Qos::default()).await;
    let p = Client::connect(&b.addr).await.unwrap();
    let key = Key::new("flow/x").unwrap();
    let publisher = tokio::spawn(async move {
        for i in 0..N_BLOCK {
            p.publish(&key, sized(i, BLOCK_PAYLOAD)).await.unwrap();
        }
        p.flush().await.unwrap();
    });
    // The subscriber does not read for a while: the publisher cannot finish, because
    // nothing may be dropped and the broker stopped reading from it.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!publisher.is_finished(), "publisher was not held back");
    within(60, async {
        for i in 0..N_BLOCK {
            let m = sub.next().await.unwrap();
            assert_eq!(seq(&m), i, "out of order or lost");
        }
    })
    .await;
    within(30, publisher).await.unwrap();
    assert_eq!(sub.lost(), 0);
    assert_eq!(
        b.broker
            .stats()
            .dropped
            .load(std::sync::atomic::Ordering::Relaxed),
        0
    );
}

#[tokio::test]
async fn drop_reports_exactly_what_it_dropped() {
    let b = start(small_outbox()).await;
    let (_c, mut sub) = slow_subscriber(&b.addr, Qos::BEST_EFFORT_DROP).await;
    let p = Client::connect(&b.addr).await.unwrap();
    let key = Key::new("flow/x").unwrap();
    // The publisher is never held back by a drop subscriber: it finishes while the
    // subscriber reads nothing.
    within(60, async {
        for i in 0..N {
            p.publish(&key, payload(i)).await.unwrap();
        }
        p.flush().await.unwrap();
    })
    .await;
    let mut received = 0u64;
    let mut last = None;
    within(60, async {
        loop {
            match tokio::time::timeout(Duration::from_millis(500), sub.next()).await {
                Ok(Some(m)) => {
                    let s = seq(&m);
                    assert!(last.is_none_or(|l| s > l), "order broken");
                    last = Some(s);
                    received += 1;
                }
                Ok(None) => panic!("subscription ended"),
                Err(_) if received + sub.lost() == u64::from(N) => break,
                Err(_) => {}
            }
        }
    })
    .await;
    let dropped = b
        .broker
        .stats()
        .dropped
        .load(std::sync::atomic::Ordering::Relaxed);
    assert!(
        sub.lost() > 0,
        "nothing was dropped: the test did not congest"
    );
    assert_eq!(
        sub.lost(),
        dropped,
        "reported {} but broker dropped {dropped}",
        sub.lost()
    );
    assert_eq!(received + sub.lost(), u64::from(N));
}
