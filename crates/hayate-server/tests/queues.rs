//! The engine's queues through the real front-ends (native CONSUME of a queue, STOMP
//! `/queue/<q>`): a NACK's delay, and hostile use (a consumer that never acknowledges, a
//! NACK storm, a queue filled past its bounds from two protocols, too many implicit
//! queues).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::{Duration, Instant};

use common::{start_default, within};
use hayate_client::{Client, Key};

/// A native NACK with a delay on a queue delivery: the message comes back, redelivered,
/// no sooner than the delay, and not to anyone meanwhile.
#[tokio::test]
async fn native_nack_delay_requeues_after_the_delay() {
    let b = start_default().await;
    let c = Client::connect(&b.addr).await.unwrap();
    let mut sub = c.consume_queue("q.delay", 10).await.unwrap();
    let p = Client::connect(&b.addr).await.unwrap();
    p.publish(&Key::new("q.delay").unwrap(), "m1")
        .await
        .unwrap();
    let m = within(5, sub.next()).await.unwrap();
    assert!(!m.attrs.redelivered);
    let t0 = Instant::now();
    c.nack_after(&m, Duration::from_millis(400)).unwrap();
    // Not back early (before the fix: at once).
    assert!(
        tokio::time::timeout(Duration::from_millis(250), sub.next())
            .await
            .is_err(),
        "redelivered before its delay"
    );
    let again = within(5, sub.next()).await.unwrap();
    assert!(t0.elapsed() >= Duration::from_millis(400));
    assert!(again.attrs.redelivered);
    assert_eq!(&again.payload[..], b"m1");
    c.ack(&again).unwrap();
    // Settled for good: nothing comes back.
    assert!(
        tokio::time::timeout(Duration::from_millis(300), sub.next())
            .await
            .is_err()
    );
    let q = b
        .broker
        .queues()
        .into_iter()
        .find(|q| q.name == "q.delay")
        .unwrap();
    assert_eq!((q.depth, q.unacked), (0, 0));
}
