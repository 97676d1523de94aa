//! The broker-wide memory budget through the public API: outboxes past their free
//! allowance and declared queues draw on one pool; when it is spent, `drop` subscribers lose
//! what does not fit (counted), `block` publishers wait, an empty outbox still takes one
//! delivery, and whatever drains gives its share back.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::Arc;
use std::sync::atomic::Ordering;

use common::{drain, expr, fill, open, publish, within};
use hayate_broker::queue::{Delivered, QItem, QueueConsumer, QueueSink, ToFlush};
use hayate_broker::{Broker, BrokerConfig, FREE_BYTES};
use hayate_core::Qos;
use hayate_flow::memory::{Memory, STEP};

const KB64: usize = 64 * 1024;

fn broker(pool: &Arc<Memory>) -> Broker {
    Broker::new(BrokerConfig {
        outbox_bytes: 64 * 1024 * 1024,
        memory: pool.clone(),
        ..Default::default()
    })
}

/// Two subscribers that never read fill their free allowance and then the pool; past it
/// their messages are dropped and counted, the pool is never overdrawn, and a drained outbox
/// gives its share back so deliveries resume.
#[tokio::test]
async fn outboxes_share_the_pool_and_drop_past_it() {
    let pool = Memory::new(4 * STEP);
    let b = broker(&pool);
    let (mut a, a_log) = open(&b);
    let (mut c, c_log) = open(&b);
    a.subscribe(1, expr("flood"), None, Qos::BEST_EFFORT_DROP)
        .unwrap();
    c.subscribe(1, expr("flood"), None, Qos::BEST_EFFORT_DROP)
        .unwrap();
    let (mut p, _) = open(&b);
    let n = 100; // 6.4 MiB to each, far past the pool (1 MiB) and the allowances
    for _ in 0..n {
        publish(&mut p, "flood", fill('x', KB64)).await;
        assert!(pool.used() <= pool.limit(), "overdrawn: {}", pool.used());
    }
    let (got_a, got_c) = (a_log.payloads().len(), c_log.payloads().len());
    // Each holds its allowance; together they hold the pool, give or take a message.
    let held = (got_a + got_c) * (KB64 + 16);
    assert!(
        held <= 2 * FREE_BYTES + pool.limit()
            && held + 2 * (KB64 + 16) > 2 * FREE_BYTES + pool.limit() - 2 * STEP,
        "a {got_a}, c {got_c}: {held} bytes held with a pool of {}",
        pool.limit()
    );
    let dropped = b.stats().dropped.load(Ordering::Relaxed);
    assert_eq!(dropped as usize, 2 * n - got_a - got_c);
    assert!(pool.refused() > 0);

    // `a` drains: its share goes back, and it receives again.
    let before = pool.used();
    drain(a.outbox()).await;
    assert!(
        pool.used() + STEP <= before,
        "still charged: {} of {before}",
        pool.used()
    );
    publish(&mut p, "flood", fill('y', KB64)).await;
    assert_eq!(a_log.payloads().len(), got_a + 1);
}

/// With the pool spent by others, an empty outbox still takes one delivery (forced), so no
/// subscriber is starved by another's backlog; the pool then shows it.
#[tokio::test]
async fn an_empty_outbox_always_takes_one_delivery() {
    let pool = Memory::new(STEP);
    let b = broker(&pool);
    let (mut hog, _) = open(&b);
    hog.subscribe(1, expr("hog"), None, Qos::BEST_EFFORT_DROP)
        .unwrap();
    let (mut p, _) = open(&b);
    for _ in 0..40 {
        publish(&mut p, "hog", fill('h', KB64)).await;
    }
    assert!(pool.used() > pool.limit() - KB64 - 16, "the pool is spent");
    let (mut fresh, fresh_log) = open(&b);
    fresh
        .subscribe(1, expr("big"), None, Qos::BEST_EFFORT_DROP)
        .unwrap();
    // One delivery larger than the free allowance: forced in.
    assert_eq!(
        publish(&mut p, "big", fill('b', FREE_BYTES + KB64)).await,
        1
    );
    assert_eq!(fresh_log.payloads().len(), 1);
    assert!(
        pool.used() > pool.limit(),
        "forced past the limit, and accounted"
    );
    // The next one does not fit (the outbox is not empty and the pool is spent).
    assert_eq!(publish(&mut p, "big", fill('c', KB64)).await, 0);
    drain(fresh.outbox()).await;
    drain(hog.outbox()).await;
    assert_eq!(pool.used(), 0, "everything drained: nothing charged");
}

/// A `block` publisher facing a spent pool waits (it is not dropped) and goes on once the
/// subscriber's writer drains.
#[tokio::test]
async fn a_block_publisher_waits_for_the_pool() {
    let pool = Memory::new(STEP);
    let b = Broker::new(BrokerConfig {
        outbox_bytes: 64 * 1024 * 1024,
        memory: pool.clone(),
        max_block: None,
        ..Default::default()
    });
    let (mut s, log) = open(&b);
    s.subscribe(1, expr("b"), None, Qos::default()).unwrap();
    let (mut p, _) = open(&b);
    // Fill the allowance and the pool.
    let mut sent = 0;
    while (sent + 1) * (KB64 + 16) <= FREE_BYTES + pool.limit() {
        assert_eq!(publish(&mut p, "b", fill('z', KB64)).await, 1);
        sent += 1;
    }
    let m = common::msg("b", fill('w', 2 * KB64));
    let pending = p.publish(hayate_broker::Batch::One(&m));
    tokio::pin!(pending);
    common::assert_pending(&mut pending).await;
    let outbox = s.outbox().clone();
    drain(&outbox).await;
    assert_eq!(within(pending).await, 1);
    assert_eq!(log.payloads().len(), sent + 1);
    assert_eq!(b.stats().dropped.load(Ordering::Relaxed), 0);
}

/// Counts what a queue hands it, settled as written.
#[derive(Debug)]
struct Count(Arc<hayate_broker::Outbox>, std::sync::atomic::AtomicUsize);

impl QueueSink for Count {
    fn has_credit(&self, _acked: bool) -> bool {
        true
    }

    fn outbox(&self) -> &Arc<hayate_broker::Outbox> {
        &self.0
    }

    fn deliver(&self, _d: Delivered<'_>, _item: &QItem, _to_flush: ToFlush<'_>) -> bool {
        self.1.fetch_add(1, Ordering::Relaxed);
        false
    }
}

/// An implicit queue without consumers keeps what the pool has room for and refuses the
/// rest (counted); handing its messages to a consumer frees its share. (Ported from the
/// declared queues' backlog.)
#[tokio::test]
async fn an_implicit_queue_draws_on_the_pool() {
    let pool = Memory::new(2 * STEP);
    let b = Broker::new(BrokerConfig {
        queue_max_bytes: 0,
        queue_max_length: 1_000_000,
        memory: pool.clone(),
        ..Default::default()
    });
    let (q, _) = b
        .queue_implicit(&hayate_core::Key::new("jobs/a").unwrap())
        .unwrap();
    let (mut p, _) = open(&b);
    for _ in 0..20 {
        publish(&mut p, "jobs/a", fill('j', KB64)).await;
    }
    let kept = q.view().depth;
    assert!(
        (1..=(2 * STEP) / KB64).contains(&kept),
        "what the pool covers: {kept}"
    );
    assert_eq!(q.dropped() as usize, 20 - kept);
    assert!(pool.used() <= pool.limit());
    let (m, _) = open(&b);
    let sink = Arc::new(Count(m.outbox().clone(), Default::default()));
    q.add_consumer(
        Arc::new(QueueConsumer::new(sink.clone(), true, false, 0)),
        || {},
    )
    .unwrap();
    assert_eq!(sink.1.load(Ordering::Relaxed), kept);
    assert_eq!(pool.used(), 0);
}
