//! The bounded outbox through the public API: `drop` and `block` budgets, oversized
//! deliveries, detachment and epochs, and inline flushes to a non-blocking sink.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::VecDeque;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use bytes::Bytes;
use common::{
    Ev, FakeSink, SinkMode, assert_pending, concat, drain, expr, fill, key, lost_marker, msg, open,
    publish, spawn_writer, within,
};
use hayate_broker::{Batch, Broker, BrokerConfig, Taken};
use hayate_core::Qos;

/// A broker whose outboxes hold about `bytes` bytes. (The recording encoder writes the bare
/// payload; the outbox charges `payload + 16` per plain message when checking the budget.)
fn broker(bytes: usize) -> Broker {
    Broker::new(BrokerConfig {
        outbox_bytes: bytes,
        ..Default::default()
    })
}

fn dropped(b: &Broker) -> u64 {
    b.stats().dropped.load(Ordering::Relaxed)
}

/// A `drop` subscription loses what does not fit, counts it, and reports the count before
/// its next delivery (at offer time when room appears without a take).
#[tokio::test]
async fn drop_subscription_loses_what_does_not_fit_and_reports_it() {
    let b = broker(100);
    let (mut sub, log) = open(&b);
    sub.subscribe(1, expr("t/drop"), None, Qos::BEST_EFFORT_DROP)
        .unwrap();
    let (mut publ, _) = open(&b);

    // 60 bytes queued (charged 76).
    assert_eq!(publish(&mut publ, "t/drop", fill('a', 60)).await, 1);
    // 60 + 46 > 100: lost, twice.
    assert_eq!(publish(&mut publ, "t/drop", fill('b', 30)).await, 0);
    assert_eq!(publish(&mut publ, "t/drop", fill('c', 30)).await, 0);
    assert_eq!(dropped(&b), 2);
    assert_eq!(log.payloads(), vec![fill('a', 60)]);
    assert!(log.lost().is_empty(), "reported before the next delivery");
    // 60 + 26 <= 100: fits; the loss report comes right before it.
    assert_eq!(publish(&mut publ, "t/drop", fill('d', 10)).await, 1);
    assert_eq!(
        log.events(),
        vec![
            Ev::Msg {
                sid: 1,
                key: "t/drop".into(),
                payload: Bytes::from(fill('a', 60)),
            },
            Ev::Lost { sid: 1, count: 2 },
            Ev::Msg {
                sid: 1,
                key: "t/drop".into(),
                payload: Bytes::from(fill('d', 10)),
            },
        ]
    );
    let want = format!("{}{}{}", fill('a', 60), lost_marker(1, 2), fill('d', 10));
    assert_eq!(drain(sub.outbox()).await, want.as_bytes());
    assert_eq!(dropped(&b), 2);
}

/// When nothing else arrives for the subscription, the writer's next take carries the loss
/// report after what was queued.
#[tokio::test]
async fn drop_loss_is_reported_by_the_writer_when_nothing_else_arrives() {
    let b = broker(100);
    let (mut sub, log) = open(&b);
    sub.subscribe(7, expr("t/**"), None, Qos::BEST_EFFORT_DROP)
        .unwrap();
    let (mut publ, _) = open(&b);
    assert_eq!(publish(&mut publ, "t/x", fill('a', 80)).await, 1);
    for _ in 0..3 {
        assert_eq!(publish(&mut publ, "t/x", fill('z', 20)).await, 0);
    }
    assert_eq!(dropped(&b), 3);
    let want = format!("{}{}", fill('a', 80), lost_marker(7, 3));
    assert_eq!(drain(sub.outbox()).await, want.as_bytes());
    assert_eq!(log.lost(), vec![(7, 3)]);
    // Reported once: the next delivery carries no report.
    assert_eq!(publish(&mut publ, "t/x", "next").await, 1);
    assert_eq!(drain(sub.outbox()).await, b"next");
    assert_eq!(log.lost(), vec![(7, 3)]);
}

/// A `drop` subscription on a batch keeps the items that fit (from the front) and counts
/// the rest.
#[tokio::test]
async fn drop_subscription_keeps_the_front_of_a_batch() {
    let b = broker(100);
    let (mut sub, log) = open(&b);
    sub.subscribe(1, expr("t"), None, Qos::BEST_EFFORT_DROP)
        .unwrap();
    let (mut publ, _) = open(&b);
    // Each item is charged 30 + 16 = 46: two fit (0 + 46, 30 + 46), the third does not.
    let payloads: Vec<Bytes> = ['a', 'b', 'c', 'd', 'e']
        .map(|c| Bytes::from(fill(c, 30)))
        .into();
    let k = key("t");
    let n = within(publ.publish(Batch::Plain {
        key: &k,
        payloads: &payloads,
    }))
    .await;
    assert_eq!(n, 2);
    assert_eq!(dropped(&b), 3);
    assert_eq!(log.payloads(), vec![fill('a', 30), fill('b', 30)]);
}

/// A `block` subscription makes the publisher wait until a writer takes data, then the
/// publication completes with nothing lost.
#[tokio::test]
async fn block_subscription_waits_for_the_writer() {
    let b = broker(100);
    let (mut sub, log) = open(&b);
    sub.subscribe(1, expr("t/block"), None, Qos::default())
        .unwrap();
    let outbox = sub.outbox().clone();
    let (mut publ, _) = open(&b);

    assert_eq!(publish(&mut publ, "t/block", fill('a', 60)).await, 1);
    let m = msg("t/block", fill('b', 60));
    {
        let fut = publ.publish(Batch::One(&m));
        tokio::pin!(fut);
        assert_pending(&mut fut).await;
        assert_eq!(log.payloads(), vec![fill('a', 60)], "nothing queued yet");
        assert_eq!(outbox.backlog().0, 60);

        // The writer takes (room appears) and writes.
        let epoch = outbox.epoch();
        let mut q = VecDeque::new();
        assert_eq!(within(outbox.take(&mut q, epoch)).await, Taken::Data);
        assert_eq!(concat(&q), fill('a', 60).as_bytes());
        outbox.release(epoch);

        assert_eq!(within(fut).await, 1);
    }
    assert_eq!(drain(&outbox).await, fill('b', 60).as_bytes());
    assert_eq!(dropped(&b), 0);
    assert!(log.lost().is_empty());
    assert_eq!(log.payloads(), vec![fill('a', 60), fill('b', 60)]);
}

/// A blocked batch goes out in as many rounds as the budget requires, in order, with a
/// writer task running alongside.
#[tokio::test]
async fn block_batch_larger_than_budget_completes_in_rounds() {
    let b = broker(100);
    let (mut sub, log) = open(&b);
    sub.subscribe(1, expr("t"), None, Qos::RELIABLE).unwrap();
    let writer = spawn_writer(sub.outbox().clone());
    let (mut publ, _) = open(&b);
    let payloads: Vec<Bytes> = (0..10).map(|i| Bytes::from(fill('a', 30 + i))).collect();
    let k = key("t");
    let n = within(publ.publish(Batch::Plain {
        key: &k,
        payloads: &payloads,
    }))
    .await;
    assert_eq!(n, 10);
    drop(sub); // closes the outbox: the writer drains and stops
    let written = within(writer).await.unwrap();
    let want: Vec<u8> = payloads.iter().flat_map(|p| p.iter().copied()).collect();
    assert_eq!(written, want);
    assert_eq!(log.len(), 10);
    assert_eq!(dropped(&b), 0);
}

/// Closing the subscriber (dropping its session) releases a publisher blocked on it.
#[tokio::test]
async fn closing_the_subscriber_releases_a_blocked_publisher() {
    let b = broker(100);
    let (mut sub, _) = open(&b);
    sub.subscribe(1, expr("t"), None, Qos::default()).unwrap();
    let (mut publ, _) = open(&b);
    assert_eq!(publish(&mut publ, "t", fill('a', 90)).await, 1);
    let m = msg("t", fill('b', 50));
    let fut = publ.publish(Batch::One(&m));
    tokio::pin!(fut);
    assert_pending(&mut fut).await;
    drop(sub);
    assert_eq!(within(fut).await, 0);
    assert_eq!(dropped(&b), 0);
}

/// A single delivery larger than the whole budget is accepted when the outbox is empty
/// (never undeliverable because of its size), and only then.
#[tokio::test]
async fn oversized_delivery_is_accepted_into_an_empty_outbox() {
    let b = broker(64);
    let (mut drop_sub, drop_log) = open(&b);
    drop_sub
        .subscribe(1, expr("big/drop"), None, Qos::BEST_EFFORT_DROP)
        .unwrap();
    let (mut block_sub, block_log) = open(&b);
    block_sub
        .subscribe(2, expr("big/block"), None, Qos::default())
        .unwrap();
    let (mut publ, _) = open(&b);

    // Drop: accepted while empty, lost while not, accepted again once taken.
    let big = fill('x', 1000);
    assert_eq!(publish(&mut publ, "big/drop", big.clone()).await, 1);
    assert_eq!(dropped(&b), 0);
    assert_eq!(publish(&mut publ, "big/drop", big.clone()).await, 0);
    assert_eq!(dropped(&b), 1);
    let want = format!("{big}{}", lost_marker(1, 1));
    assert_eq!(drain(drop_sub.outbox()).await, want.as_bytes());
    assert_eq!(publish(&mut publ, "big/drop", big.clone()).await, 1);
    assert_eq!(drop_log.payloads(), vec![big.clone(), big]);

    // Block: a zero-copy sized payload completes at once ...
    let huge = Bytes::from(fill('y', 20_000));
    let m = msg("big/block", huge.clone());
    assert_eq!(within(publ.publish(Batch::One(&m))).await, 1);
    // ... and a small one behind it waits for the writer.
    let small = msg("big/block", "s");
    let fut = publ.publish(Batch::One(&small));
    tokio::pin!(fut);
    assert_pending(&mut fut).await;
    let outbox = block_sub.outbox().clone();
    let epoch = outbox.epoch();
    let mut q = VecDeque::new();
    assert_eq!(within(outbox.take(&mut q, epoch)).await, Taken::Data);
    assert_eq!(concat(&q), huge);
    // Large payloads are queued by reference, not copied.
    assert!(q.iter().any(|c| c.as_ptr() == huge.as_ptr()));
    outbox.release(epoch);
    assert_eq!(within(fut).await, 1);
    assert_eq!(block_log.len(), 2);
    assert_eq!(dropped(&b), 1);
}

/// `detach` discards what is queued, bumps the epoch (a writer of the old epoch sees
/// `Closed`), and the outbox keeps accepting offers for the next connection.
#[tokio::test]
async fn detach_discards_queue_and_bumps_epoch() {
    let b = Broker::default();
    let (mut sub, log) = open(&b);
    sub.subscribe(1, expr("d"), None, Qos::default()).unwrap();
    let outbox = sub.outbox().clone();
    let (mut publ, _) = open(&b);

    let e0 = outbox.epoch();
    assert!(outbox.is_attached());
    assert_eq!(publish(&mut publ, "d", "first").await, 1);
    // The old connection's writer takes "first" and is writing it.
    let mut q = VecDeque::new();
    assert_eq!(within(outbox.take(&mut q, e0)).await, Taken::Data);
    assert_eq!(concat(&q), b"first");
    q.clear();
    assert_eq!(publish(&mut publ, "d", "second").await, 1);
    assert_eq!(outbox.backlog(), (6, true));

    let mut ran = false;
    let e1 = outbox.detach(|| ran = true);
    assert!(ran, "the closure runs under the lock");
    assert_ne!(e1, e0);
    assert_eq!(outbox.epoch(), e1);
    assert!(!outbox.is_attached());
    assert!(!outbox.is_closed());
    assert_eq!(outbox.backlog(), (0, false), "queue discarded");

    // The old writer: its release is ignored, its next take ends it.
    outbox.release(e0);
    assert_eq!(within(outbox.take(&mut q, e0)).await, Taken::Closed);
    assert!(q.is_empty());

    // Still accepting; the next writer (new epoch) sees only what came after.
    assert_eq!(publish(&mut publ, "d", "third").await, 1);
    assert_eq!(within(outbox.take(&mut q, e1)).await, Taken::Data);
    assert_eq!(concat(&q), b"third");
    assert_eq!(outbox.backlog(), (0, true));
    // A stale release does not end the new writer's write.
    outbox.release(e0);
    assert_eq!(outbox.backlog(), (0, true));
    outbox.release(e1);
    assert_eq!(outbox.backlog(), (0, false));
    assert_eq!(log.payloads(), vec!["first", "second", "third"]);
}

/// A writer waiting in `take` when the outbox is detached is woken and sees `Closed`.
#[tokio::test]
async fn detach_wakes_a_waiting_writer_of_the_old_epoch() {
    let b = Broker::default();
    let (sub, _) = open(&b);
    let outbox = sub.outbox().clone();
    let e0 = outbox.epoch();
    let mut q = VecDeque::new();
    let fut = outbox.take(&mut q, e0);
    tokio::pin!(fut);
    assert_pending(&mut fut).await;
    let e1 = outbox.detach(|| {});
    assert_eq!(within(fut).await, Taken::Closed);
    assert_ne!(e1, e0);
    // Setting a sink reattaches.
    outbox.set_sink(FakeSink::new(usize::MAX, usize::MAX));
    assert!(outbox.is_attached());
}

/// Detaching empties the queue, so a publisher blocked on it completes.
#[tokio::test]
async fn detach_releases_a_blocked_publisher() {
    let b = broker(100);
    let (mut sub, log) = open(&b);
    sub.subscribe(1, expr("t"), None, Qos::default()).unwrap();
    let (mut publ, _) = open(&b);
    assert_eq!(publish(&mut publ, "t", fill('a', 90)).await, 1);
    let m = msg("t", fill('b', 50));
    let fut = publ.publish(Batch::One(&m));
    tokio::pin!(fut);
    assert_pending(&mut fut).await;
    sub.outbox().detach(|| {});
    assert_eq!(within(fut).await, 1);
    assert_eq!(sub.outbox().backlog().0, 50);
    assert_eq!(log.payloads(), vec![fill('a', 90), fill('b', 50)]);
}

/// `Session::flush` writes what the session queued straight to the subscriber's sink, in
/// order, without the writer.
#[tokio::test]
async fn flush_writes_to_the_sink_in_order() {
    let b = Broker::default();
    let (mut sub, _) = open(&b);
    sub.subscribe(1, expr("f"), None, Qos::default()).unwrap();
    let sink = FakeSink::new(7, usize::MAX);
    sub.outbox().set_sink(sink.clone());
    let (mut publ, _) = open(&b);
    for p in ["one", "two", "three", "four"] {
        assert_eq!(publish(&mut publ, "f", p).await, 1);
    }
    assert!(sink.written().is_empty(), "nothing before the flush");
    publ.flush();
    assert_eq!(sink.written(), b"onetwothreefour");
    assert!(sink.calls() >= 3, "7 bytes per call: {}", sink.calls());
    assert_eq!(sub.outbox().backlog(), (0, false));
    // Nothing left for the writer.
    let outbox = sub.outbox().clone();
    let epoch = outbox.epoch();
    let mut q = VecDeque::new();
    let fut = outbox.take(&mut q, epoch);
    tokio::pin!(fut);
    assert_pending(&mut fut).await;
}

/// What the sink does not take is put back in front of later output and taken by the
/// writer; an inline flush never overtakes a writer's write in progress.
#[tokio::test]
async fn flush_puts_back_what_the_sink_did_not_take() {
    let b = Broker::default();
    let (mut sub, _) = open(&b);
    sub.subscribe(1, expr("f"), None, Qos::default()).unwrap();
    let outbox = sub.outbox().clone();
    let sink = FakeSink::new(4, 10);
    outbox.set_sink(sink.clone());
    let (mut publ, _) = open(&b);
    for p in ["aaaaaa", "bbbbbb", "cccccc"] {
        assert_eq!(publish(&mut publ, "f", p).await, 1);
    }
    publ.flush();
    assert_eq!(sink.written(), b"aaaaaabbbb");
    assert_eq!(
        outbox.backlog(),
        (8, false),
        "the rest is back in the queue"
    );

    // Queued later: goes behind the rest.
    assert_eq!(publish(&mut publ, "f", "dddddd").await, 1);
    let epoch = outbox.epoch();
    let mut q = VecDeque::new();
    // The writer was woken for the rest.
    assert_eq!(within(outbox.take(&mut q, epoch)).await, Taken::Data);
    assert_eq!(concat(&q), b"bbccccccdddddd");

    // While the writer holds taken data, an inline flush does not write.
    sink.set_credit(usize::MAX);
    assert_eq!(publish(&mut publ, "f", "eeee").await, 1);
    publ.flush();
    let mut scratch = VecDeque::new();
    outbox.try_flush(&mut scratch);
    assert!(scratch.is_empty());
    assert_eq!(sink.written(), b"aaaaaabbbb");
    assert_eq!(outbox.backlog(), (4, true));
    // Once it released, it does.
    outbox.release(epoch);
    outbox.try_flush(&mut scratch);
    assert!(scratch.is_empty());
    assert_eq!(sink.written(), b"aaaaaabbbbeeee");
    assert_eq!(outbox.backlog(), (0, false));
}

/// Many publishers, one subscriber (an RPC server under concurrent callers): a flush less
/// than `GATHER_GAP` after another session's is left to the writer, which takes what they
/// all queued in one write; a session's own successive flushes stay inline. (The clock is
/// paused: "close together" does not depend on how fast the test runs.)
#[tokio::test(start_paused = true)]
async fn flushes_of_several_publishers_close_together_leave_in_one_write() {
    let b = Broker::default();
    let (mut sub, _) = open(&b);
    sub.subscribe(1, expr("f"), None, Qos::default()).unwrap();
    let outbox = sub.outbox().clone();
    let sink = FakeSink::new(usize::MAX, usize::MAX);
    outbox.set_sink(sink.clone());
    let (mut a, _) = open(&b);
    let (mut b2, _) = open(&b);
    let (mut c, _) = open(&b);

    // One publisher: every flush writes inline, however close together.
    for p in ["a1", "a2"] {
        assert_eq!(publish(&mut a, "f", p).await, 1);
        a.flush();
    }
    assert_eq!((sink.calls(), sink.written()), (2, b"a1a2".to_vec()));

    // Two others right after: left to the writer, which takes both at once.
    assert_eq!(publish(&mut b2, "f", "b").await, 1);
    b2.flush();
    assert_eq!(publish(&mut c, "f", "c").await, 1);
    c.flush();
    assert_eq!(
        sink.calls(),
        2,
        "no inline write for a flush close to another's"
    );
    assert_eq!(outbox.backlog(), (2, false));
    // The writer first lets what is ready run (here: one more publisher), then takes all.
    let taken = take_beside(&outbox, async {
        assert_eq!(publish(&mut a, "f", "d").await, 1);
        a.flush();
    });
    assert_eq!(taken.await, b"bcd");

    // Apart by more than the gap: inline again.
    tokio::time::advance(hayate_broker::outbox::GATHER_GAP * 2).await;
    assert_eq!(publish(&mut a, "f", "a3").await, 1);
    a.flush();
    assert_eq!(sink.calls(), 3);
    assert_eq!(sink.written(), b"a1a2a3");
    assert_eq!(outbox.backlog(), (0, false));
}

/// Hostile: 16 publishers at once to a subscriber whose socket takes nothing (the gathered
/// flushes write nothing either). Its outbox stays within its budget, what does not fit is
/// dropped and counted for it alone, and a subscriber that reads gets every message.
#[tokio::test(start_paused = true)]
async fn many_publishers_at_once_to_a_subscriber_that_never_reads() {
    let b = broker(4096);
    let (mut stuck, _) = open(&b);
    stuck
        .subscribe(1, expr("fan/in"), None, Qos::BEST_EFFORT_DROP)
        .unwrap();
    let stuck_sink = FakeSink::new(0, 0);
    stuck.outbox().set_sink(stuck_sink.clone());
    let (mut good, log) = open(&b);
    good.subscribe(1, expr("fan/in"), None, Qos::default())
        .unwrap();
    let good_sink = FakeSink::new(usize::MAX, usize::MAX);
    good.outbox().set_sink(good_sink.clone());
    let mut pubs: Vec<_> = (0..16).map(|_| open(&b).0).collect();
    let mut taken = Vec::new();
    for round in 0..20 {
        for (i, p) in pubs.iter_mut().enumerate() {
            publish(p, "fan/in", format!("{round:02}-{i:02}-{}", fill('x', 100))).await;
            p.flush();
        }
        // The good subscriber's writer runs as its connection's would.
        if good.outbox().backlog().0 > 0 {
            taken.extend(take_beside(good.outbox(), async {}).await);
        }
        let (queued, _) = stuck.outbox().backlog();
        assert!(
            queued <= 4096,
            "round {round}: {queued} bytes queued past the budget"
        );
    }
    // Written inline (the first of each burst) or gathered by the writer: all of it.
    assert_eq!(good_sink.written().len() + taken.len(), 20 * 16 * 106);
    assert_eq!(log.payloads().len(), 20 * 16);
    assert!(stuck_sink.written().is_empty());
    assert!(
        dropped(&b) >= 20 * 16 - 40,
        "the rest was dropped for the stuck one"
    );
}

/// What the writer's next take of `outbox` gets while `meanwhile` runs beside it. The take
/// is polled first: a writer that yields, or waits to be woken, lets `meanwhile` run
/// before it takes.
async fn take_beside(
    outbox: &hayate_broker::Outbox,
    meanwhile: impl Future<Output = ()>,
) -> Vec<u8> {
    let epoch = outbox.epoch();
    let mut q = VecDeque::new();
    let (taken, ()) = tokio::join!(within(outbox.take(&mut q, epoch)), meanwhile);
    assert_eq!(taken, Taken::Data);
    outbox.release(epoch);
    concat(&q)
}

/// A queue's consumer that writes each delivery's payload into its outbox, as an AMQP
/// channel writes basic.deliver frames.
#[derive(Debug)]
struct Forward(Arc<hayate_broker::Outbox>);

impl hayate_broker::queue::QueueSink for Forward {
    fn has_credit(&self, _acked: bool) -> bool {
        true
    }

    fn outbox(&self) -> &Arc<hayate_broker::Outbox> {
        &self.0
    }

    fn deliver(
        &self,
        _d: hayate_broker::queue::Delivered<'_>,
        item: &hayate_broker::queue::QItem,
        to_flush: hayate_broker::queue::ToFlush<'_>,
    ) -> bool {
        self.0
            .push_control_buf_in(to_flush, |b| b.put_payload(&item.msg.payload));
        false
    }
}

/// What a queue delivers to its consumer's outbox within a publisher's offer is written
/// by the publishing session at the end of its read, like its own deliveries, and
/// gathered with other publishers' when they come close together.
#[tokio::test(start_paused = true)]
async fn control_output_pushed_within_an_offer_is_flushed_by_the_publisher() {
    use hayate_broker::queue::{Queue, QueueConfig, QueueConsumer, QueueId};
    let b = Broker::default();
    let recorder = common::Recorder {
        log: common::Log::default(),
    };
    let consumer = Arc::new(hayate_broker::Outbox::new(1 << 20, Box::new(recorder)));
    let sink = FakeSink::new(usize::MAX, usize::MAX);
    consumer.set_sink(sink.clone());
    let id = QueueId {
        ns: Arc::from(""),
        name: Arc::from("q"),
    };
    let memory = &b.config().memory;
    let queue = Queue::new(id, QueueConfig::default(), memory, None);
    let forward = Arc::new(Forward(consumer.clone()));
    let c = Arc::new(QueueConsumer::new(forward, true, false, 0));
    queue.add_consumer(c, || {}).unwrap();
    b.queue_bind(&queue, expr("q"), None, None);
    let (mut a, _) = open(&b);
    let (mut b2, _) = open(&b);

    // Queued for the publisher's flush, not for the writer.
    assert_eq!(publish(&mut a, "q", "a").await, 1);
    assert_eq!(consumer.backlog(), (1, false));
    assert_eq!(sink.calls(), 0);
    a.flush();
    assert_eq!(sink.written(), b"a");

    // Another publisher right after: gathered by the writer with a third delivery.
    assert_eq!(publish(&mut b2, "q", "b").await, 1);
    b2.flush();
    assert_eq!(sink.calls(), 1);
    let taken = take_beside(&consumer, async {
        assert_eq!(publish(&mut a, "q", "c").await, 1);
        a.flush();
    });
    assert_eq!(taken.await, b"bc");

    // Outside an offer (a consumer given credit, a requeue): the writer is woken.
    let taken = take_beside(&consumer, async {
        consumer.push_control_buf(|o| o.tail().extend_from_slice(b"d"));
    });
    assert_eq!(taken.await, b"d");
}

/// What the sink did not take goes back in front, chunk order kept, ahead of output
/// queued while the write was under way.
#[tokio::test]
async fn flush_puts_back_several_chunks_ahead_of_later_output() {
    let b = Broker::default();
    let (mut sub, _) = open(&b);
    sub.subscribe(1, expr("f"), None, Qos::default()).unwrap();
    let outbox = sub.outbox().clone();
    let sink = FakeSink::new(usize::MAX, 3);
    outbox.set_sink(sink.clone());
    // Output queued (control frame) while the inline write is in progress.
    let during = outbox.clone();
    sink.on_first_write(move || during.push_control_unbudgeted(|t| t.extend_from_slice(b"<ctl>")));
    let (mut publ, _) = open(&b);
    // Small, large (queued by reference: its own chunk), small: three chunks.
    let big = fill('B', 20_000);
    for p in ["aaaaaa".to_string(), big.clone(), "cccc".to_string()] {
        assert_eq!(publish(&mut publ, "f", p).await, 1);
    }
    publ.flush();
    assert_eq!(sink.written(), b"aaa");
    let want = format!("aaa{big}cccc<ctl>");
    assert_eq!(drain(&outbox).await, want.as_bytes());
}

/// A sink that answers `WouldBlock` at once leaves everything queued, in order.
#[tokio::test]
async fn flush_to_a_full_sink_leaves_everything_for_the_writer() {
    let b = Broker::default();
    let (mut sub, _) = open(&b);
    sub.subscribe(1, expr("f"), None, Qos::default()).unwrap();
    let outbox = sub.outbox().clone();
    let sink = FakeSink::new(100, 0);
    outbox.set_sink(sink.clone());
    let (mut publ, _) = open(&b);
    assert_eq!(publish(&mut publ, "f", "xy").await, 1);
    assert_eq!(publish(&mut publ, "f", "z").await, 1);
    publ.flush();
    assert_eq!(sink.calls(), 1);
    assert!(sink.written().is_empty());
    assert_eq!(drain(&outbox).await, b"xyz");
}

/// A failing sink (an error, or `Ok(0)`) is dropped: what was taken for it is gone with the
/// connection, later output waits for the writer and the outbox stays open.
#[tokio::test]
async fn failing_sink_is_dropped() {
    for mode in [SinkMode::Fail, SinkMode::Zero] {
        let b = Broker::default();
        let (mut sub, _) = open(&b);
        sub.subscribe(1, expr("f"), None, Qos::default()).unwrap();
        let outbox = sub.outbox().clone();
        let sink = FakeSink::new(100, usize::MAX);
        sink.set_mode(mode);
        outbox.set_sink(sink.clone());
        let (mut publ, _) = open(&b);

        assert_eq!(publish(&mut publ, "f", "lost").await, 1);
        publ.flush();
        assert_eq!(sink.calls(), 1, "{mode:?}");
        assert_eq!(outbox.backlog(), (0, false), "{mode:?}");

        // The sink would work now, but it is no longer used.
        sink.set_mode(SinkMode::Accept);
        assert_eq!(publish(&mut publ, "f", "kept").await, 1);
        publ.flush();
        let mut scratch = VecDeque::new();
        outbox.try_flush(&mut scratch);
        assert_eq!(sink.calls(), 1, "{mode:?}");
        assert!(sink.written().is_empty(), "{mode:?}");
        assert!(!outbox.is_closed(), "{mode:?}");
        assert_eq!(drain(&outbox).await, b"kept", "{mode:?}");
    }
}

/// An outbox can also be used on its own, outside a session.
#[tokio::test]
async fn standalone_outbox_with_sink_and_lost_report() {
    let log = common::Log::default();
    let outbox = Arc::new(hayate_broker::Outbox::new(
        50,
        Box::new(common::Recorder { log: log.clone() }),
    ));
    let sink = FakeSink::new(usize::MAX, usize::MAX);
    outbox.set_sink(sink.clone());
    outbox.count_lost(3, 4);
    let mut scratch = VecDeque::new();
    outbox.try_flush(&mut scratch);
    assert_eq!(sink.written(), lost_marker(3, 4).as_bytes());
    assert_eq!(log.lost(), vec![(3, 4)]);
    outbox.close();
    assert!(outbox.is_closed());
    let mut q = VecDeque::new();
    assert_eq!(
        within(outbox.take(&mut q, outbox.epoch())).await,
        Taken::Closed
    );
}

/// `publish_now` delivers without a future when every subscriber takes the message at
/// once; a full `block` outbox, or a queue group on the key, leaves the rest to
/// `publish_rest`, which waits as `publish` does and delivers each message once, in order.
#[tokio::test]
async fn publish_now_leaves_a_full_outbox_and_queue_groups_to_publish_rest() {
    let b = broker(100);
    let (mut sub, log) = open(&b);
    sub.subscribe(1, expr("t/now"), None, Qos::default())
        .unwrap();
    let outbox = sub.outbox().clone();
    let (mut publ, _) = open(&b);

    let first = msg("t/now", fill('a', 60));
    assert_eq!(publ.publish_now(Batch::One(&first)).unwrap(), 1);
    // 60 + 76 > 100: the subscriber's outbox cannot take the second.
    let second = msg("t/now", fill('b', 60));
    let rest = publ.publish_now(Batch::One(&second)).unwrap_err();
    assert_eq!(log.payloads(), vec![fill('a', 60)]);
    {
        let fut = publ.publish_rest(rest, Batch::One(&second));
        tokio::pin!(fut);
        assert_pending(&mut fut).await;
        let epoch = outbox.epoch();
        let mut q = VecDeque::new();
        assert_eq!(within(outbox.take(&mut q, epoch)).await, Taken::Data);
        outbox.release(epoch);
        assert_eq!(within(fut).await, 1);
    }
    assert_eq!(log.payloads(), vec![fill('a', 60), fill('b', 60)]);

    // A queue group: one member takes each message, through publish_rest.
    let (mut member, member_log) = open(&b);
    member
        .subscribe(2, expr("q/now"), Some("g"), Qos::default())
        .unwrap();
    let m = msg("q/now", "x");
    let rest = publ.publish_now(Batch::One(&m)).unwrap_err();
    assert!(member_log.payloads().is_empty(), "left to publish_rest");
    assert_eq!(within(publ.publish_rest(rest, Batch::One(&m))).await, 1);
    assert_eq!(member_log.payloads(), vec!["x".to_string()]);
    assert_eq!(dropped(&b), 0);
}
