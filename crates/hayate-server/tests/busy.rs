//! Busy-polling (`[server] busy_poll_us`): the poll loop runs while input is recent, sleeps
//! once the window has passed, wakes on new input, and the broker works throughout.
//!
//! The loop's state belongs to the server (`Server::busy_poll`).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::{start, within};
use hayate_client::{Client, Key};
use hayate_server::Config;
use hayate_server::busy::BusyPoll;

/// Waits until the poll loop has stopped turning (it sleeps), or fails.
async fn until_asleep(busy: &BusyPoll) -> u64 {
    for _ in 0..100 {
        let a = busy.turns();
        tokio::time::sleep(Duration::from_millis(100)).await;
        if busy.turns() == a {
            return a;
        }
    }
    panic!("the busy-poll loop never went to sleep");
}

/// Waits (up to 2 s) until the poll loop turns past `idle`: input wakes it, but the woken
/// loop may run its first turn only after the reply has reached the client.
async fn until_awake(busy: &BusyPoll, idle: u64, what: &str) {
    for _ in 0..200 {
        if busy.turns() > idle {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("{what}");
}

async fn round_trip(c: &Client, sub: &mut hayate_client::Subscription, payload: &'static str) {
    c.publish(&Key::new("busy/x").unwrap(), payload)
        .await
        .unwrap();
    c.flush().await.unwrap();
    within(10, async {
        assert_eq!(&sub.next().await.unwrap().payload[..], payload.as_bytes());
    })
    .await;
}

// One worker, as `hayate broker --busy-poll-us` runs: the loop must be on the thread that
// polls the I/O driver.
#[tokio::test(flavor = "multi_thread", worker_threads = 1)]
async fn polls_while_traffic_flows_and_sleeps_when_idle() {
    let mut config = Config::default();
    config.server.busy_poll_us = 20_000;
    let b = start(config).await;
    let busy = b.busy.clone().expect("busy-polling is on");
    let c = Client::connect(&b.addr).await.unwrap();
    let mut sub = c.subscribe("busy/*").await.unwrap();
    c.flush().await.unwrap();

    // Input arrived (HELLO, SUB, PING): the loop turns, then sleeps 20 ms after the last.
    let idle = until_asleep(&busy).await;
    assert!(idle > 0, "the loop never turned after input");
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(busy.turns(), idle, "the loop turned with no input");

    // New input wakes it; messages flow.
    round_trip(&c, &mut sub, "1").await;
    until_awake(&busy, idle, "input did not wake the loop").await;
    let idle = until_asleep(&busy).await;
    round_trip(&c, &mut sub, "2").await;
    until_awake(&busy, idle, "input did not wake the loop again").await;
    b.shutdown().await;
}

#[test]
fn the_window_is_at_most_one_second() {
    let mut config = Config::default();
    config.server.busy_poll_us = 1_000_000;
    config.validate().unwrap();
    config.server.busy_poll_us = 1_000_001;
    let e = config.validate().unwrap_err().to_string();
    assert!(e.contains("busy_poll_us"), "{e}");
}
