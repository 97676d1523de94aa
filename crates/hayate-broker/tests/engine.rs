//! The engine through the public API: queue groups, implicit queues (a first use's), requeueing,
//! and the per-session route cache.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::HashSet;
use std::sync::Arc;

use bytes::Bytes;
use common::{Log, expr, key, msg, open, publish, within};
use hayate_broker::queue::{
    Delivered, ImplicitError, QItem, Queue, QueueConfig, QueueConsumer, QueueId, QueueSink,
    ToFlush, Unacked, give_back_all,
};
use hayate_broker::{Batch, Broker, BrokerConfig, Session, SubscribeError};
use hayate_core::Qos;

/// Which of `logs` received each payload `0..n` (as decimal text); fails if a payload was
/// received twice or not at all.
fn recipients(logs: &[&Log], n: usize) -> Vec<usize> {
    let mut who = vec![None; n];
    for (i, log) in logs.iter().enumerate() {
        for p in log.payloads() {
            let k: usize = p.parse().unwrap();
            assert!(who[k].is_none(), "payload {k} delivered twice");
            who[k] = Some(i);
        }
    }
    who.into_iter()
        .enumerate()
        .map(|(k, w)| w.unwrap_or_else(|| panic!("payload {k} not delivered")))
        .collect()
}

/// Every log holds its payloads in increasing order.
fn assert_in_order(logs: &[&Log]) {
    for log in logs {
        let p: Vec<usize> = log.payloads().iter().map(|p| p.parse().unwrap()).collect();
        assert!(p.windows(2).all(|w| w[0] < w[1]), "out of order: {p:?}");
    }
}

fn members(b: &Broker, n: usize, group: &str, e: &str) -> Vec<(Session, Log)> {
    (0..n)
        .map(|_| {
            let (mut s, log) = open(b);
            s.subscribe(1, expr(e), Some(group), Qos::default())
                .unwrap();
            (s, log)
        })
        .collect()
}

async fn publish_numbered(p: &mut Session, k: &str, range: std::ops::Range<usize>, want: usize) {
    for i in range {
        assert_eq!(publish(p, k, i.to_string()).await, want, "message {i}");
    }
}

/// Three members of one group share 30 messages equally, in rotation.
#[tokio::test]
async fn queue_group_round_robin() {
    let b = Broker::default();
    let m = members(&b, 3, "g", "q/*");
    let (mut p, _) = open(&b);
    publish_numbered(&mut p, "q/x", 0..30, 1).await;
    let logs: Vec<&Log> = m.iter().map(|(_, l)| l).collect();
    for l in &logs {
        assert_eq!(l.len(), 10);
    }
    let who = recipients(&logs, 30);
    assert_eq!(who[..3].iter().collect::<HashSet<_>>().len(), 3, "{who:?}");
    for i in 3..30 {
        assert_eq!(who[i], who[i - 3], "rotation broken at {i}: {who:?}");
    }
    assert_in_order(&logs);
    for (sid, k, _) in logs[0].deliveries() {
        assert_eq!((sid, k.as_str()), (1, "q/x"));
    }
}

/// The items of one batch are spread over the members like separate messages.
#[tokio::test]
async fn queue_group_round_robin_within_a_batch() {
    let b = Broker::default();
    let m = members(&b, 3, "g", "q/x");
    let (mut p, _) = open(&b);
    let payloads: Vec<Bytes> = (0..30).map(|i| Bytes::from(i.to_string())).collect();
    let k = key("q/x");
    let n = within(p.publish(Batch::Plain {
        key: &k,
        payloads: &payloads,
    }))
    .await;
    assert_eq!(n, 30);
    let logs: Vec<&Log> = m.iter().map(|(_, l)| l).collect();
    let who = recipients(&logs, 30);
    for l in &logs {
        assert_eq!(l.len(), 10);
    }
    for i in 3..30 {
        assert_eq!(who[i], who[i - 3], "rotation broken at {i}: {who:?}");
    }
    assert_in_order(&logs);
}

/// A member whose session was dropped gets nothing; the others share everything.
#[tokio::test]
async fn queue_group_skips_a_dropped_member() {
    let b = Broker::default();
    let mut m = members(&b, 3, "g", "q/*");
    let (mut p, _) = open(&b);
    // Warm the publisher's route cache with all three members.
    publish_numbered(&mut p, "q/x", 0..3, 1).await;
    let (gone, gone_log) = m.remove(1);
    drop(gone);
    assert_eq!(b.subscription_count(), 2);
    publish_numbered(&mut p, "q/x", 3..33, 1).await;
    assert_eq!(gone_log.len(), 1, "only its share of the first three");
    let logs: Vec<&Log> = m.iter().map(|(_, l)| l).collect();
    assert_eq!(logs[0].len() + logs[1].len(), 32);
    let after: Vec<usize> = recipients(&[logs[0], logs[1], &gone_log], 33)[3..].to_vec();
    assert!(after.iter().all(|&w| w < 2));
    for i in 1..after.len() {
        assert_ne!(after[i], after[i - 1], "not alternating: {after:?}");
    }
}

/// A member whose outbox is closed but whose subscription is still registered (its
/// session is going away) is skipped without losing the message.
#[tokio::test]
async fn queue_group_skips_a_closed_outbox() {
    let b = Broker::default();
    let m = members(&b, 3, "g", "q/*");
    let (mut p, _) = open(&b);
    m[1].0.outbox().close();
    assert_eq!(b.subscription_count(), 3);
    publish_numbered(&mut p, "q/x", 0..30, 1).await;
    assert_eq!(m[1].1.len(), 0);
    assert!(m[0].1.len() >= 10 && m[2].1.len() >= 10);
    assert_eq!(m[0].1.len() + m[2].1.len(), 30);
    assert_in_order(&[&m[0].1, &m[2].1]);
}

/// Members with a connection are preferred over detached ones; a detached member gets
/// messages only when no member is connected.
#[tokio::test]
async fn queue_group_prefers_attached_members() {
    let b = Broker::default();
    let m = members(&b, 3, "g", "q/*");
    let (mut p, _) = open(&b);
    m[0].0.outbox().detach(|| {});
    publish_numbered(&mut p, "q/x", 0..10, 1).await;
    assert_eq!(m[0].1.len(), 0);
    assert_eq!(m[1].1.len() + m[2].1.len(), 10);
    m[1].0.outbox().detach(|| {});
    m[2].0.outbox().detach(|| {});
    publish_numbered(&mut p, "q/x", 10..16, 1).await;
    assert_eq!(m[0].1.len(), 2);
    assert_eq!(m[0].1.len() + m[1].1.len() + m[2].1.len(), 16);
}

/// A queue group is a name and an expression: `g` on `a/**` and `g` on `a/b` are two
/// groups, each of which gets every matching message.
#[tokio::test]
async fn same_group_name_on_two_expressions_is_two_groups() {
    let b = Broker::default();
    let (mut wide1, wide1_log) = open(&b);
    wide1
        .subscribe(1, expr("a/**"), Some("g"), Qos::default())
        .unwrap();
    let (mut wide2, wide2_log) = open(&b);
    wide2
        .subscribe(1, expr("a/**"), Some("g"), Qos::default())
        .unwrap();
    let (mut narrow, narrow_log) = open(&b);
    narrow
        .subscribe(1, expr("a/b"), Some("g"), Qos::default())
        .unwrap();
    let (mut p, _) = open(&b);

    publish_numbered(&mut p, "a/b", 0..4, 2).await;
    assert_eq!(narrow_log.len(), 4);
    assert_eq!(wide1_log.len(), 2);
    assert_eq!(wide2_log.len(), 2);
    // Only the wide group matches `a/c`.
    publish_numbered(&mut p, "a/c", 4..8, 1).await;
    assert_eq!(narrow_log.len(), 4);
    assert_eq!(wide1_log.len() + wide2_log.len(), 8);
}

/// Fan-out subscribers and a queue group on the same key: every fan-out subscriber gets
/// every message, the group one copy of each.
#[tokio::test]
async fn fanout_and_group_together() {
    let b = Broker::default();
    let m = members(&b, 2, "g", "k");
    let (mut f, f_log) = open(&b);
    f.subscribe(9, expr("k"), None, Qos::default()).unwrap();
    let (mut p, _) = open(&b);
    publish_numbered(&mut p, "k", 0..6, 2).await;
    assert_eq!(f_log.len(), 6);
    assert_eq!(m[0].1.len() + m[1].1.len(), 6);
    assert!(f_log.deliveries().iter().all(|(sid, _, _)| *sid == 9));
}

/// A consumer of an engine queue that keeps what it is given (acknowledged later).
#[derive(Debug)]
struct Keep {
    outbox: Arc<hayate_broker::Outbox>,
    /// What it was given: the delivery, its body, and whether it was redelivered.
    got: std::sync::Mutex<Vec<(Unacked, String, bool)>>,
}

impl Keep {
    fn new(b: &Broker) -> Arc<Keep> {
        let (s, _) = open(b);
        Arc::new(Keep {
            outbox: s.outbox().clone(),
            got: std::sync::Mutex::new(Vec::new()),
        })
    }

    fn bodies(&self) -> Vec<String> {
        let got = self.got.lock().unwrap();
        got.iter().map(|(_, b, _)| b.clone()).collect()
    }
}

impl QueueSink for Keep {
    fn has_credit(&self, _acked: bool) -> bool {
        true
    }

    fn outbox(&self) -> &Arc<hayate_broker::Outbox> {
        &self.outbox
    }

    fn deliver(&self, d: Delivered<'_>, item: &QItem, _to_flush: ToFlush<'_>) -> bool {
        let u = Unacked {
            queue: d.queue.clone(),
            consumer: d.consumer.cloned(),
            id: d.id,
        };
        let body = String::from_utf8_lossy(&item.msg.payload).into_owned();
        self.got.lock().unwrap().push((u, body, d.redelivered));
        true
    }
}

/// Messages published on an implicit queue's key with no consumer wait, and go to the
/// first consumer in order, before anything published after it came; when it leaves with
/// them unacknowledged, they wait again for the next one, in their places. (Ported from
/// the declared queues' backlog.)
#[tokio::test]
async fn an_implicit_queue_keeps_messages_for_its_consumers_in_order() {
    let b = Broker::default();
    let (q, made) = b.queue_implicit(&key("jobs/a")).unwrap();
    assert!(made && !q.config().declared);
    let (again, made) = b.queue_implicit(&key("jobs/a")).unwrap();
    assert!(Arc::ptr_eq(&q, &again) && !made);
    let (mut p, _) = open(&b);
    publish_numbered(&mut p, "jobs/a", 0..5, 1).await;
    assert_eq!(q.view().depth, 5);

    let k = Keep::new(&b);
    let c = Arc::new(QueueConsumer::new(k.clone(), false, false, 0));
    q.add_consumer(c.clone(), || {}).unwrap();
    assert_eq!(k.bodies(), ["0", "1", "2", "3", "4"]);
    publish_numbered(&mut p, "jobs/a", 5..8, 1).await;
    let want: Vec<String> = (0..8).map(|i| i.to_string()).collect();
    assert_eq!(k.bodies(), want);
    assert_eq!((q.view().depth, q.view().unacked), (0, 8));

    // The consumer leaves: what it held goes back, in place, for the next one.
    assert!(!q.remove_consumer(&c));
    let held: Vec<Unacked> = k.got.lock().unwrap().drain(..).map(|(u, _, _)| u).collect();
    give_back_all(held, true);
    publish_numbered(&mut p, "jobs/a", 8..9, 1).await;
    assert_eq!((q.view().depth, q.view().unacked), (9, 0));
    let n = Keep::new(&b);
    q.add_consumer(
        Arc::new(QueueConsumer::new(n.clone(), false, false, 0)),
        || {},
    )
    .unwrap();
    let want: Vec<String> = (0..9).map(|i| i.to_string()).collect();
    assert_eq!(n.bodies(), want);
    assert!(n.got.lock().unwrap()[..8].iter().all(|(_, _, r)| *r));
}

/// An implicit queue holds at most `queue_max_length` messages and `queue_max_bytes` body
/// bytes: further ones are refused and counted; what waits is delivered in order.
#[tokio::test]
async fn an_implicit_queue_is_bounded() {
    for (cfg, kept) in [
        (
            BrokerConfig {
                queue_max_length: 3,
                ..Default::default()
            },
            3,
        ),
        (
            BrokerConfig {
                queue_max_bytes: 2,
                ..Default::default()
            },
            2,
        ),
    ] {
        let b = Broker::new(cfg);
        let (q, _) = b.queue_implicit(&key("jobs/a")).unwrap();
        let (mut p, _) = open(&b);
        for i in 0..5 {
            publish(&mut p, "jobs/a", i.to_string()).await; // payloads of 1 byte each
        }
        assert_eq!((q.view().depth, q.dropped()), (kept, 5 - kept as u64));
        let k = Keep::new(&b);
        q.add_consumer(
            Arc::new(QueueConsumer::new(k.clone(), false, false, 0)),
            || {},
        )
        .unwrap();
        let want: Vec<String> = (0..kept).map(|i| i.to_string()).collect();
        assert_eq!(k.bodies(), want);
    }
}

/// A queue there is what a first use finds (an explicit one included), but another
/// connection's exclusive queue; the broker's table bounds the implicit ones.
#[tokio::test]
async fn queue_implicit_finds_the_queue_there() {
    let b = Broker::default();
    let id = |n: &str| QueueId {
        ns: Arc::from(""),
        name: Arc::from(n),
    };
    let memory = b.config().memory.clone();
    let declared = Queue::new(id("d"), QueueConfig::default(), &memory, None);
    b.queue_insert(&declared);
    let (q, made) = b.queue_implicit(&key("d")).unwrap();
    assert!(Arc::ptr_eq(&q, &declared) && !made);
    let owned = QueueConfig {
        owner: Some(7),
        ..QueueConfig::default()
    };
    b.queue_insert(&Queue::new(id("x"), owned, &memory, None));
    assert_eq!(
        b.queue_implicit(&key("x")).unwrap_err(),
        ImplicitError::Exclusive
    );
    // Deleted: made again.
    b.queue_delete(&q);
    let (again, made) = b.queue_implicit(&key("d")).unwrap();
    assert!(made && !Arc::ptr_eq(&again, &q));
    let names: Vec<String> = b.queues().into_iter().map(|v| v.name).collect();
    assert_eq!(names, ["d", "x"]);
}

/// `requeue` hands a message to another member of the group, never back to the session
/// that gives it up while another member exists.
#[tokio::test]
async fn requeue_goes_to_another_member() {
    let b = Broker::default();
    let e = expr("jobs/*");
    let mut m = members(&b, 2, "work", "jobs/*");
    let message = msg("jobs/1", "retry");
    for _ in 0..4 {
        assert!(within(m[0].0.requeue("work", &e, &message, true)).await);
    }
    assert_eq!(m[0].1.len(), 0);
    assert_eq!(m[1].1.payloads(), ["retry"; 4]);
    for _ in 0..2 {
        assert!(within(m[1].0.requeue("work", &e, &message, false)).await);
    }
    assert_eq!(m[0].1.payloads(), ["retry"; 2]);
    assert_eq!(m[1].1.len(), 4);
}

/// With no other member, `may_return` gives the message back to the same session; without
/// it, it goes nowhere.
#[tokio::test]
async fn requeue_with_a_single_member() {
    let b = Broker::default();
    let e = expr("jobs/*");
    let message = msg("jobs/1", "nack");
    let (mut a, a_log) = open(&b);
    a.subscribe(5, e.clone(), Some("work"), Qos::default())
        .unwrap();

    assert!(within(a.requeue("work", &e, &message, true)).await);
    assert_eq!(
        a_log.deliveries(),
        [(5, "jobs/1".to_string(), "nack".to_string())]
    );

    // Not returnable: nowhere to go.
    assert!(!within(a.requeue("work", &e, &message, false)).await);
    assert_eq!(a_log.len(), 1);
}

/// With no member at all, a requeued message is not placed.
#[tokio::test]
async fn requeue_with_no_member_is_not_placed() {
    let b = Broker::default();
    let e = expr("jobs/*");
    let message = msg("jobs/1", "orphan");
    let (mut a, a_log) = open(&b);
    a.subscribe(1, e.clone(), Some("work"), Qos::default())
        .unwrap();
    assert!(a.unsubscribe(1));
    assert!(!within(a.requeue("work", &e, &message, true)).await);
    assert_eq!(a_log.len(), 0);
}

/// The publisher's route cache follows subscription changes made by other sessions.
#[tokio::test]
async fn route_cache_is_invalidated_by_subscription_changes() {
    let b = Broker::default();
    let (mut p, _) = open(&b);
    let (mut s, s_log) = open(&b);
    // Route cached: nobody.
    assert_eq!(publish(&mut p, "k", "0").await, 0);
    assert_eq!(publish(&mut p, "k", "1").await, 0);
    s.subscribe(1, expr("k"), None, Qos::default()).unwrap();
    assert_eq!(publish(&mut p, "k", "2").await, 1);
    assert_eq!(s_log.payloads(), ["2"]);
    assert!(s.unsubscribe(1));
    assert!(!s.unsubscribe(1));
    assert_eq!(publish(&mut p, "k", "3").await, 0);
    assert_eq!(s_log.payloads(), ["2"]);
    // A wildcard subscription elsewhere also invalidates it.
    s.subscribe(2, expr("**"), None, Qos::default()).unwrap();
    assert_eq!(publish(&mut p, "k", "4").await, 1);
    // Dropping the session removes its subscriptions.
    drop(s);
    assert_eq!(b.subscription_count(), 0);
    assert_eq!(publish(&mut p, "k", "5").await, 0);
    assert_eq!(s_log.payloads(), ["2", "4"]);
    // Making a queue (its binding) changes the route too.
    let (q, _) = b.queue_implicit(&key("k")).unwrap();
    assert_eq!(publish(&mut p, "k", "6").await, 1);
    assert_eq!(q.view().depth, 1);
}

/// A session's own subscription counts like any other, and ids are per session.
#[tokio::test]
async fn subscription_ids_are_per_session() {
    let b = Broker::default();
    let (mut s, s_log) = open(&b);
    let (mut t, t_log) = open(&b);
    s.subscribe(1, expr("k"), None, Qos::default()).unwrap();
    assert_eq!(
        s.subscribe(1, expr("other"), None, Qos::default()),
        Err(SubscribeError::DuplicateId(1))
    );
    t.subscribe(1, expr("k"), None, Qos::default()).unwrap();
    assert_eq!(b.subscription_count(), 2);
    assert_eq!(publish(&mut s, "k", "x").await, 2);
    assert_eq!(s_log.payloads(), ["x"]);
    assert_eq!(t_log.payloads(), ["x"]);
    assert_ne!(s.id(), t.id());
    assert_eq!(
        b.stats()
            .sessions_opened
            .load(std::sync::atomic::Ordering::Relaxed),
        2
    );
}
