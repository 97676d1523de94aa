//! The engine's queues through the real front-ends (native CONSUME of a queue, STOMP
//! `/queue/<q>`): a NACK's delay, and hostile use (a consumer that never acknowledges, a
//! NACK storm, a queue filled past its bounds from two protocols, too many implicit
//! queues).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::{Duration, Instant};

use common::{start_default, within};
use hayate_client::{Client, Key};
use hayate_stomp::{Command, Frame, Item, Limits, Version, decode, encode};

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

/// A raw STOMP 1.2 connection: one frame out, the next frame in (heart-beats skipped).
struct Raw(tokio::net::TcpStream, bytes::BytesMut);

impl Raw {
    async fn open(addr: &str) -> Raw {
        let mut r = Raw(
            tokio::net::TcpStream::connect(addr).await.unwrap(),
            bytes::BytesMut::new(),
        );
        r.put(Frame::new(Command::Connect).header("accept-version", "1.2"))
            .await;
        assert_eq!(r.take().await.unwrap().command, Command::Connected);
        r
    }

    async fn put(&mut self, f: Frame) {
        use tokio::io::AsyncWriteExt;
        let mut b = bytes::BytesMut::new();
        encode(&f, Version::V1_2, &mut b);
        self.0.write_all(&b).await.unwrap();
    }

    async fn take(&mut self) -> Option<Frame> {
        use tokio::io::AsyncReadExt;
        within(10, async {
            loop {
                if let Some(Item::Frame(f)) =
                    decode(&mut self.1, Version::V1_2, &Limits::default()).unwrap()
                {
                    return Some(f);
                }
                if self.0.read_buf(&mut self.1).await.unwrap_or(0) == 0 {
                    return None;
                }
            }
        })
        .await
    }
}

/// One client making implicit queues past the broker's limit gets STOMP `ERROR` `too many
/// queues` (and a native CONSUME of one more is refused), while the queues there carry on
/// for everyone; queues a front-end declared do not count.
#[tokio::test]
async fn implicit_queues_past_the_limit_are_refused_others_carry_on() {
    let b = start_default().await;
    b.broker.set_max_implicit_queues(4);
    let mut s = Raw::open(&b.stomp).await;
    for i in 0..4 {
        let f = Frame::new(Command::Send)
            .header("destination", &format!("/queue/imp.{i}"))
            .header("receipt", "r");
        s.put(f).await;
        assert_eq!(s.take().await.unwrap().command, Command::Receipt);
    }
    s.put(Frame::new(Command::Send).header("destination", "/queue/imp.4"))
        .await;
    let e = s.take().await.unwrap();
    assert_eq!(e.command, Command::Error, "{e:?}");
    assert_eq!(e.get("message"), Some("too many queues"));
    // A native first use is refused too (the connection ends with ERR).
    let n = Client::connect(&b.addr).await.unwrap();
    let mut refused = n.consume_queue("imp.5", 0).await.unwrap();
    assert!(within(5, refused.next()).await.is_none());
    // The queues there carry on: imp.0 delivers its message to a new client.
    let c = Client::connect(&b.addr).await.unwrap();
    let mut sub = c.consume_queue("imp.0", 0).await.unwrap();
    let m = within(5, sub.next()).await.unwrap();
    c.ack(&m).unwrap();
    assert_eq!(b.broker.queues().len(), 4);
}

/// A native consumer that never acknowledges holds at most its prefetch; the rest stay
/// ready in the queue, and a second consumer gets them.
#[tokio::test]
async fn never_acking_consumer_is_bounded_by_its_credit() {
    let b = start_default().await;
    let c = Client::connect(&b.addr).await.unwrap();
    let mut hog = c.consume_queue("q.hog", 3).await.unwrap();
    let p = Client::connect(&b.addr).await.unwrap();
    let k = Key::new("q.hog").unwrap();
    for i in 0..20 {
        p.publish(&k, format!("m{i}")).await.unwrap();
    }
    for _ in 0..3 {
        within(5, hog.next()).await.unwrap();
    }
    assert!(
        tokio::time::timeout(Duration::from_millis(300), hog.next())
            .await
            .is_err()
    );
    let q = |b: &common::TestBroker| {
        b.broker
            .queues()
            .into_iter()
            .find(|q| q.name == "q.hog")
            .unwrap()
    };
    assert_eq!((q(&b).depth, q(&b).unacked), (17, 3));
    let d = Client::connect(&b.addr).await.unwrap();
    let mut other = d.consume_queue("q.hog", 0).await.unwrap();
    for _ in 0..17 {
        let m = within(5, other.next()).await.unwrap();
        d.ack(&m).unwrap();
    }
    within(5, async {
        while q(&b).unacked != 3 || q(&b).depth != 0 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
}

/// A NACK storm (every delivery given back at once, many times) neither grows the queue
/// nor loses a message; with a delay it does not spin either.
#[tokio::test]
async fn nack_storm_neither_spins_nor_grows() {
    let b = start_default().await;
    let c = Client::connect(&b.addr).await.unwrap();
    let mut sub = c.consume_queue("q.storm", 5).await.unwrap();
    let p = Client::connect(&b.addr).await.unwrap();
    let k = Key::new("q.storm").unwrap();
    for i in 0..5 {
        p.publish(&k, format!("m{i}")).await.unwrap();
    }
    for _ in 0..500 {
        let m = within(5, sub.next()).await.unwrap();
        c.nack(&m).unwrap();
    }
    let v = b
        .broker
        .queues()
        .into_iter()
        .find(|q| q.name == "q.storm")
        .unwrap();
    assert_eq!(v.depth + v.unacked, 5);
    // Delayed NACKs: 5 messages given back for 200 ms come back at most once each per
    // 200 ms (no spinning).
    let t0 = Instant::now();
    let mut n = 0;
    while t0.elapsed() < Duration::from_millis(700) {
        if let Ok(Some(m)) = tokio::time::timeout(Duration::from_millis(50), sub.next()).await {
            n += 1;
            c.nack_after(&m, Duration::from_millis(200)).unwrap();
        }
    }
    assert!(n <= 5 * 5, "{n} deliveries in 700 ms");
    let v = b
        .broker
        .queues()
        .into_iter()
        .find(|q| q.name == "q.storm")
        .unwrap();
    assert!(v.unacked + v.depth <= 5, "{v:?}");
}
