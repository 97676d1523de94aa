//! The engine's queues ([`hayate_broker::queue`]) under hostile use: a consumer that never
//! acknowledges, a nack storm, a dead-letter cycle, a queue filled past its bounds; and
//! their ordinary semantics (priorities, requeue in place, TTL at the head, credit).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use hayate_broker::queue::{
    BindingFilter, DeadLetterer, Delivered, Overflow, QItem, Queue, QueueConfig, QueueConsumer,
    QueueId, QueueSink, Reason, ToFlush, Unacked, Via, give_back_all,
};
use hayate_broker::{Batch, Broker, Encoder, OutBuf, Outbox};
use hayate_core::{Key, KeyExpr, Message};
use hayate_flow::memory::Memory;

/// Writes nothing.
struct Nothing;

impl Encoder for Nothing {
    fn encode(&mut self, _sid: u32, _batch: Batch<'_>, _origin: u64, _out: &mut OutBuf) {}
    fn encode_lost(&mut self, _sid: u32, _count: u64, _out: &mut OutBuf) {}
}

/// A delivery a [`Sink`] kept.
#[derive(Debug)]
struct Got {
    u: Unacked,
    item: QItem,
    redelivered: bool,
}

/// A consumer's sink that keeps what it is given.
#[derive(Debug)]
struct Sink {
    outbox: Arc<Outbox>,
    open: AtomicBool,
    got: Mutex<Vec<Got>>,
    seen: AtomicUsize,
}

impl Sink {
    fn new() -> Arc<Sink> {
        Arc::new(Sink {
            outbox: Arc::new(Outbox::new(1 << 20, Box::new(Nothing))),
            open: AtomicBool::new(true),
            got: Mutex::new(Vec::new()),
            seen: AtomicUsize::new(0),
        })
    }

    fn take(&self) -> Vec<Unacked> {
        self.take_all().into_iter().map(|g| g.u).collect()
    }

    fn take_all(&self) -> Vec<Got> {
        std::mem::take(&mut *self.got.lock().unwrap())
    }

    fn bodies(&self) -> Vec<String> {
        let got = self.got.lock().unwrap();
        got.iter().map(|g| body(&g.item)).collect()
    }
}

impl QueueSink for Sink {
    fn has_credit(&self, _acked: bool) -> bool {
        self.open.load(Ordering::Acquire)
    }

    fn outbox(&self) -> &Arc<Outbox> {
        &self.outbox
    }

    fn deliver(&self, d: Delivered<'_>, item: &QItem, _to_flush: ToFlush<'_>) -> bool {
        self.seen.fetch_add(1, Ordering::AcqRel);
        if d.no_ack {
            return false;
        }
        let u = Unacked {
            queue: d.queue.clone(),
            consumer: d.consumer.cloned(),
            id: d.id,
        };
        self.got.lock().unwrap().push(Got {
            u,
            item: item.clone(),
            redelivered: d.redelivered,
        });
        true
    }
}

fn body(m: &QItem) -> String {
    String::from_utf8_lossy(&m.msg.payload).into_owned()
}

fn msg(key: &str, body: &str) -> Message {
    Message::new(Key::new(key).unwrap(), Bytes::from(body.to_string()))
}

fn queue(name: &str, cfg: QueueConfig) -> Arc<Queue> {
    let id = QueueId {
        ns: Arc::from(""),
        name: Arc::from(name),
    };
    Queue::new(id, cfg, &Memory::unlimited(), None)
}

fn offer(q: &Arc<Queue>, body: &str) -> hayate_broker::queue::Offered {
    q.offer(q.item(msg("k", body), Via::default()))
}

fn consumer(q: &Arc<Queue>, sink: &Arc<Sink>, prefetch: usize) -> Arc<QueueConsumer> {
    let c = Arc::new(QueueConsumer::new(sink.clone(), false, false, prefetch));
    q.add_consumer(c.clone(), || {}).unwrap();
    c
}

#[tokio::test]
async fn a_consumer_that_never_acknowledges_holds_at_most_its_prefetch() {
    let q = queue("q", QueueConfig::default());
    let sink = Sink::new();
    consumer(&q, &sink, 5);
    for i in 0..1000 {
        assert!(offer(&q, &i.to_string()).taken);
    }
    assert_eq!(sink.seen.load(Ordering::Acquire), 5);
    let v = q.view();
    assert_eq!((v.depth, v.unacked, v.consumers), (995, 5, 1));
    // Channel-wide credit gone (a closed channel, flow off): nothing more, even after
    // acknowledgements.
    sink.open.store(false, Ordering::Release);
    for u in sink.take() {
        q.settled(&u);
    }
    assert_eq!(sink.seen.load(Ordering::Acquire), 5);
    sink.open.store(true, Ordering::Release);
    q.dispatch();
    assert_eq!(sink.seen.load(Ordering::Acquire), 10);
    assert_eq!(sink.bodies(), ["5", "6", "7", "8", "9"]);
}

#[tokio::test]
async fn a_nack_storm_keeps_order_and_loses_nothing() {
    let q = queue("q", QueueConfig::default());
    let sink = Sink::new();
    consumer(&q, &sink, 10);
    for i in 0..10 {
        offer(&q, &i.to_string());
    }
    for _ in 0..1000 {
        // Given back last first: redelivered in their original order all the same.
        let mut all = sink.take();
        all.reverse();
        assert_eq!(all.len(), 10);
        give_back_all(all, true);
        assert_eq!(
            sink.bodies(),
            (0..10).map(|i| i.to_string()).collect::<Vec<_>>()
        );
    }
    let v = q.view();
    assert_eq!((v.depth, v.unacked, v.dropped), (0, 10, 0));
    assert!(sink.take_all().iter().all(|g| g.redelivered));
    assert_eq!(q.view().unacked, 10, "taken, not settled");
}

#[tokio::test]
async fn a_delivery_limit_ends_a_nack_storm_with_dead_letters() {
    let cfg = QueueConfig {
        count_returns: true,
        delivery_limit: Some(3),
        ..QueueConfig::default()
    };
    let q = queue("q", cfg);
    let sink = Sink::new();
    consumer(&q, &sink, 0);
    for i in 0..100 {
        offer(&q, &i.to_string());
    }
    for _ in 0..10 {
        give_back_all(sink.take(), true);
    }
    let v = q.view();
    assert_eq!((v.depth, v.unacked, v.dropped), (0, 0, 100));
}

/// Republishes every dead letter on key `k` (no cycle check of its own).
struct Loop;

impl DeadLetterer for Loop {
    fn letter(&self, _q: &QueueId, item: QItem, _why: Reason) -> Option<Message> {
        Some(item.msg)
    }
}

#[tokio::test]
async fn a_dead_letter_cycle_stays_bounded_and_ends_with_its_queue() {
    let broker = Broker::default();
    let cfg = QueueConfig {
        max_length: Some(3),
        ..QueueConfig::default()
    };
    let q = queue("q", cfg);
    q.set_dead_letterer(&broker, Arc::new(Loop));
    broker.queue_bind(&q, KeyExpr::new("k").unwrap(), None, None);
    let mut publisher = broker.open_session(Box::new(Nothing));
    for i in 0..100 {
        publisher
            .publish(Batch::One(&msg("k", &i.to_string())))
            .await;
    }
    // Every new one pushes the oldest out, whose dead letter comes back and pushes the
    // next out: the queue churns but never holds more than its bound.
    for _ in 0..20 {
        tokio::time::sleep(Duration::from_millis(5)).await;
        assert!(q.view().depth <= 3);
    }
    assert!(q.view().dead_lettered > 100);
    broker.queue_delete(&q);
    tokio::time::sleep(Duration::from_millis(20)).await;
    let after = q.view().dead_lettered;
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert_eq!(q.view().dead_lettered, after, "deleted: the cycle ended");
}

#[tokio::test]
async fn a_queue_filled_past_its_bounds_drops_or_refuses() {
    // Drop-head: the newest stay.
    let cfg = QueueConfig {
        max_length: Some(10),
        ..QueueConfig::default()
    };
    let q = queue("a", cfg);
    for i in 0..1000 {
        assert!(!offer(&q, &i.to_string()).refused);
    }
    let v = q.view();
    assert_eq!((v.depth, v.dropped), (10, 990));
    let sink = Sink::new();
    consumer(&q, &sink, 0);
    assert_eq!(sink.bodies()[0], "990");
    // Reject-publish: the oldest stay, the rest are refused.
    let cfg = QueueConfig {
        max_body_bytes: Some(10),
        overflow: Overflow::RejectPublish,
        ..QueueConfig::default()
    };
    let q = queue("b", cfg);
    let refused = (0..1000).filter(|_| offer(&q, "12345").refused).count();
    assert_eq!((q.view().depth, refused), (2, 998));
    // The footprint bound and the memory budget: refused past them.
    let cfg = QueueConfig {
        max_bytes: 64 * 1024,
        overflow: Overflow::RejectPublish,
        ..QueueConfig::default()
    };
    let q = queue("c", cfg);
    let big = "x".repeat(1000);
    let taken = (0..1000).filter(|_| !offer(&q, &big).refused).count();
    assert!(taken < 64, "{taken}");
    assert!(q.view().bytes <= 64 * 1024);
    let memory = Memory::new(256 * 1024);
    let id = QueueId {
        ns: Arc::from(""),
        name: Arc::from("d"),
    };
    let q = Queue::new(id, QueueConfig::default(), &memory, None);
    let taken = (0..10_000).filter(|_| !offer(&q, &big).refused).count();
    assert!(taken < 256, "{taken}");
    assert!(memory.used() <= 256 * 1024);
    q.purge();
    assert_eq!(memory.used(), 0);
}

#[tokio::test]
async fn priorities_requeue_in_place_and_ttl_at_the_head() {
    let cfg = QueueConfig {
        max_priority: Some(5),
        ..QueueConfig::default()
    };
    let q = queue("p", cfg);
    for (b, p) in [("a", 1), ("b", 9), ("c", 0), ("d", 5)] {
        let mut m = msg("k", b);
        m.headers = Some(vec![("priority".into(), Bytes::from(p.to_string()))]);
        q.offer(q.item(m, Via::default()));
    }
    let sink = Sink::new();
    let c = consumer(&q, &sink, 2);
    assert_eq!(
        sink.bodies(),
        ["b", "d"],
        "9 counts as 5, before the 5 after it"
    );
    let first = sink.take();
    q.remove_consumer(&c);
    let next = Sink::new();
    consumer(&q, &next, 0);
    assert_eq!(next.bodies(), ["a", "c"]);
    let _ = next.take();
    give_back_all(first, true);
    assert_eq!(next.bodies(), ["b", "d"], "back in place, in order");
    // A message TTL: expired ones never go out.
    let cfg = QueueConfig {
        message_ttl: Some(Duration::from_millis(10)),
        ..QueueConfig::default()
    };
    let q = queue("t", cfg);
    offer(&q, "old");
    tokio::time::sleep(Duration::from_millis(20)).await;
    offer(&q, "new");
    let sink = Sink::new();
    consumer(&q, &sink, 0);
    assert_eq!(sink.bodies(), ["new"]);
    assert_eq!(q.view().dropped, 1);
}

#[tokio::test]
async fn the_broker_lists_its_queues_and_an_exclusive_consumer_is_alone() {
    let broker = Broker::default();
    let q = queue("b", QueueConfig::default());
    broker.queue_insert(&q);
    broker.queue_insert(&queue("a", QueueConfig::default()));
    offer(&q, "1");
    let names: Vec<_> = broker.queues().into_iter().map(|v| v.name).collect();
    assert_eq!(names, ["a", "b"]);
    assert_eq!(broker.queues()[1].depth, 1);
    let sink = Sink::new();
    let alone = Arc::new(QueueConsumer::new(sink.clone(), false, true, 0));
    q.add_consumer(alone.clone(), || {}).unwrap();
    let other = Arc::new(QueueConsumer::new(sink.clone(), false, false, 0));
    assert!(q.add_consumer(other, || {}).is_err());
    assert!(!q.remove_consumer(&alone), "not auto-delete");
    assert_eq!(broker.queue_delete(&q), 0);
    assert!(broker.queue(q.id()).is_none());
    assert_eq!(broker.queues().len(), 1);
}

/// Admits messages whose payload starts with its prefix, shown with its name.
#[derive(Debug)]
struct Prefix(&'static str);

impl BindingFilter for Prefix {
    fn admit(&self, m: &Message) -> Option<Via> {
        m.payload.starts_with(self.0.as_bytes()).then(|| Via {
            source: Bytes::from_static(self.0.as_bytes()),
            subject: Bytes::new(),
        })
    }
}

#[tokio::test]
async fn a_publish_matching_several_bindings_enters_once_and_says_so() {
    let broker = Broker::default();
    let q = queue("q", QueueConfig::default());
    broker.queue_bind(&q, KeyExpr::new("a/*").unwrap(), None, None);
    broker.queue_bind(&q, KeyExpr::new("a/b").unwrap(), None, None);
    broker.queue_bind(&q, KeyExpr::new("**").unwrap(), None, None);
    let filtered = queue("f", QueueConfig::default());
    let x = Arc::new(Prefix("x"));
    let y = Arc::new(Prefix("y"));
    broker.queue_bind(&filtered, KeyExpr::new("a/b").unwrap(), None, Some(x));
    let bid = broker.queue_bind(&filtered, KeyExpr::new("a/b").unwrap(), None, Some(y));
    let mut s = broker.open_session(Box::new(Nothing));
    let (n, routed, _) = s.publish_routed(Batch::One(&msg("a/b", "x1"))).await;
    assert_eq!((n, routed.queued, routed.refused), (2, 2, false));
    let (n, _, _) = s.publish_routed(Batch::One(&msg("a/b", "y1"))).await;
    assert_eq!(n, 2);
    s.publish(Batch::One(&msg("a/b", "z1"))).await;
    assert_eq!(
        s.routed_pending(),
        (0, 0),
        "a plain publish keeps nothing of what queues did (it would pile up for ever)"
    );
    assert_eq!(q.view().depth, 3, "each once, whatever its bindings");
    assert_eq!(filtered.view().depth, 2, "z1 passed no filter");
    let sink = Sink::new();
    consumer(&filtered, &sink, 0);
    let shown: Vec<_> = sink
        .take_all()
        .into_iter()
        .map(|g| g.item.via.source)
        .collect();
    assert_eq!(shown, [Bytes::from_static(b"x"), Bytes::from_static(b"y")]);
    assert!(broker.queue_unbind(&filtered, bid));
    assert!(!broker.queue_unbind(&filtered, bid));
    s.publish(Batch::One(&msg("a/b", "y2"))).await;
    assert_eq!(filtered.view().depth, 0);
    // A deleted queue's bindings go with it.
    broker.queue_delete(&q);
    let (n, routed, _) = s.publish_routed(Batch::One(&msg("a/b", "x2"))).await;
    assert_eq!((n, routed.queued), (1, 1));
}

#[tokio::test]
async fn a_full_queue_refuses_through_the_publish_that_reached_it() {
    let broker = Broker::default();
    let cfg = QueueConfig {
        max_length: Some(1),
        overflow: Overflow::RejectPublish,
        ..QueueConfig::default()
    };
    let q = queue("q", cfg);
    broker.queue_bind(&q, KeyExpr::new("k").unwrap(), None, None);
    let mut s = broker.open_session(Box::new(Nothing));
    let (_, first, _) = s.publish_routed(Batch::One(&msg("k", "1"))).await;
    let (_, second, _) = s.publish_routed(Batch::One(&msg("k", "2"))).await;
    assert!(!first.refused && second.refused);
    // Many publishes: the publisher never waits, the queue holds one.
    for i in 0..10_000 {
        s.publish(Batch::One(&msg("k", &i.to_string()))).await;
    }
    assert_eq!(q.view().depth, 1);
    assert_eq!(q.view().dropped, 10_001);
}
