//! Bounded blocking: a subscriber that never reads (a "hog") holds its publishers back for at
//! most `limits.max_block_ms`; then a `block` subscription's connection is cut off as a slow
//! consumer, a `Stall::Drop` subscription loses (and is told so), and an MQTT QoS 0
//! subscription never holds anyone back at all. Everybody else gets everything.
//!
//! The hogs are raw sockets that send their handshake and subscription, read the answers
//! that show the subscription is in place, and then never read again. A hog's kernel buffers
//! (its receive buffer and the broker's send buffer) absorb a few MB before its outbox even
//! starts to fill, so the publishers send well beyond that.
//!
//! The last test drives the engine alone (no sockets): a cut-off subscriber whose session
//! has not ended yet must not hold publishers again.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use common::{TestBroker, start, within};
use hayate_client::{Client, Key, Subscription};
use hayate_core::{KeyExpr, Qos, Stall};
use hayate_server::Config;
use rumqttc::{AsyncClient, Event, MqttOptions, QoS};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::mpsc;

/// Messages each publisher sends.
const N: u32 = 2_000;
/// Payload size of the hog tests: `2 × N × SIZE` (16 MB) is far more than a hog's kernel
/// buffers hold.
const SIZE: usize = 4 * 1024;
/// The bound on blocking in the hog tests.
const MAX_BLOCK_MS: u64 = 300;
/// How long publishing may take in all, blocked once for `MAX_BLOCK_MS` included (an
/// unhindered run takes a few hundred ms; a publisher blocked per message would take hours).
const PUBLISH_BOUND: Duration = Duration::from_secs(5);

fn config(outbox_bytes: u64, max_block_ms: u64) -> Config {
    let mut c = Config::default();
    c.limits.outbox_bytes = outbox_bytes;
    c.limits.max_block_ms = max_block_ms;
    c
}

/// Sequence number `i` in the first four bytes of `size` bytes.
fn payload(i: u32, size: usize) -> Bytes {
    let mut v = vec![0xA5u8; size];
    v[..4].copy_from_slice(&i.to_be_bytes());
    v.into()
}

fn seq(p: &[u8]) -> u32 {
    u32::from_be_bytes(p[..4].try_into().unwrap())
}

#[derive(Debug, Clone, Copy)]
struct Stats {
    dropped: u64,
    slow_consumers: u64,
    stalls: u64,
}

fn stats(b: &TestBroker) -> Stats {
    let s = b.broker.stats();
    Stats {
        dropped: s.dropped.load(Ordering::Relaxed),
        slow_consumers: s.slow_consumers.load(Ordering::Relaxed),
        stalls: s.stalls.load(Ordering::Relaxed),
    }
}

/// The broker's WARN log lines on this thread: the test's runtime, where the broker runs
/// too (`#[tokio::test]` is single-threaded).
#[derive(Clone, Default)]
struct Warnings(Arc<Mutex<Vec<String>>>);

impl Warnings {
    /// Captures WARN events on this thread until the guard is dropped.
    fn capture() -> (Warnings, tracing::subscriber::DefaultGuard) {
        let w = Warnings::default();
        let guard = tracing::subscriber::set_default(w.clone());
        (w, guard)
    }

    /// The captured lines about slow consumers that contain `what`.
    fn slow_consumer(&self, what: &str) -> usize {
        self.0
            .lock()
            .unwrap()
            .iter()
            .filter(|l| l.contains("slow consumer") && l.contains(what))
            .count()
    }
}

struct MessageField(String);

impl tracing::field::Visit for MessageField {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            self.0 = format!("{value:?}");
        }
    }
}

impl tracing::Subscriber for Warnings {
    fn enabled(&self, m: &tracing::Metadata<'_>) -> bool {
        *m.level() == tracing::Level::WARN
    }
    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        tracing::span::Id::from_u64(1)
    }
    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
    fn event(&self, e: &tracing::Event<'_>) {
        let mut m = MessageField(String::new());
        e.record(&mut m);
        self.0.lock().unwrap().push(m.0);
    }
    fn enter(&self, _: &tracing::span::Id) {}
    fn exit(&self, _: &tracing::span::Id) {}
}

/// Waits until the broker has `n` subscriptions: a cut-off connection's session has ended
/// (without its client reading anything).
async fn wait_subscriptions(b: &TestBroker, n: usize) {
    let r = tokio::time::timeout(Duration::from_secs(5), async {
        while b.broker.subscription_count() != n {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    assert!(
        r.is_ok(),
        "{} subscriptions, expected {n}: the hog's session did not end",
        b.broker.subscription_count()
    );
}

/// Reads what the broker sent until it closes the connection (end of stream or a reset);
/// returns the bytes read. Fails if the connection is still open after `secs` seconds.
async fn drain_until_closed<S: tokio::io::AsyncRead + Unpin + ?Sized>(
    s: &mut S,
    secs: u64,
) -> usize {
    let mut buf = vec![0u8; 256 * 1024];
    let mut n = 0;
    tokio::time::timeout(Duration::from_secs(secs), async {
        loop {
            match s.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(k) => n += k,
            }
        }
    })
    .await
    .unwrap_or_else(|_| panic!("the hog's connection is still open ({n} bytes read)"));
    n
}

// ---------------------------------------------------------------------------------------
// Native clients.

/// A raw native connection: HELLO and SUB sent, WELCOME and the PONG after the SUB read.
struct NativeHog {
    s: hayate_io::transport::Reader,
    _w: hayate_io::transport::Writer,
    buf: BytesMut,
}

impl NativeHog {
    async fn connect(addr: &str, expr: &str, qos: Qos) -> NativeHog {
        let (r, w) = hayate_io::transport::tcp(TcpStream::connect(addr).await.unwrap());
        NativeHog::over(r, w, expr, qos).await
    }

    /// The same over shared memory (a ticket taken from the broker's offer directly).
    async fn connect_shm(b: &TestBroker, expr: &str, qos: Qos) -> NativeHog {
        let offer = b
            .shm
            .as_ref()
            .expect("shared memory offered")
            .issue(None, None, None);
        let (r, w, _) = hayate_io::transport::shm::connect(
            &offer,
            Default::default(),
            Duration::from_secs(5),
            false,
        )
        .await
        .unwrap();
        NativeHog::over(r, w, expr, qos).await
    }

    async fn over(
        r: hayate_io::transport::Reader,
        w: hayate_io::transport::Writer,
        expr: &str,
        qos: Qos,
    ) -> NativeHog {
        use hayate_native::{Frame, Hello, PROTOCOL_VERSION, Sub, encode};
        let mut h = NativeHog {
            s: r,
            _w: w,
            buf: BytesMut::new(),
        };
        let mut b = BytesMut::new();
        encode(
            &Frame::Hello(Hello {
                version: PROTOCOL_VERSION,
                flags: 0,
                name: "hog".into(),
                auth: Bytes::new(),
            }),
            &mut b,
        );
        encode(
            &Frame::Sub(Sub {
                sid: 1,
                qos,
                group: None,
                expr: KeyExpr::new(expr).unwrap(),
            }),
            &mut b,
        );
        // Answered after the SUB is handled: the subscription is in place.
        encode(&Frame::Ping(7), &mut b);
        hayate_io::transport::write_all(&*h._w, b.freeze())
            .await
            .unwrap();
        match h.next().await {
            Some(Frame::Welcome(_)) => {}
            other => panic!("expected WELCOME, got {other:?}"),
        }
        match h.next().await {
            Some(Frame::Pong(7)) => {}
            other => panic!("expected PONG, got {other:?}"),
        }
        h
    }

    /// The next frame, `None` at end of stream.
    async fn next(&mut self) -> Option<hayate_native::Frame> {
        within(10, async {
            loop {
                if let Some(f) = hayate_native::decode(&mut self.buf, 1 << 24).unwrap() {
                    return Some(f);
                }
                if self.s.read_buf(&mut self.buf).await.unwrap_or(0) == 0 {
                    return None;
                }
            }
        })
        .await
    }
}

/// A native client subscribed (block, the default) to `key`, which it publishes on.
async fn native_peer(addr: &str, key: &str) -> (Client, Subscription) {
    let c = Client::connect(addr).await.unwrap();
    let s = c.subscribe(key).await.unwrap();
    c.flush().await.unwrap();
    (c, s)
}

/// Publishes `n` messages of `size` bytes on `key` and waits until the broker has handled
/// them all; returns how long that took.
fn native_publish(c: Client, key: &str, n: u32, size: usize) -> tokio::task::JoinHandle<Duration> {
    let key = Key::new(key).unwrap();
    tokio::spawn(async move {
        let t = Instant::now();
        for i in 0..n {
            c.publish(&key, payload(i, size)).await.unwrap();
        }
        c.flush().await.unwrap();
        t.elapsed()
    })
}

/// Receives `n` messages, in order, on `s`; gives `s` back (dropping it would unsubscribe).
fn native_receive(mut s: Subscription, n: u32) -> tokio::task::JoinHandle<Subscription> {
    tokio::spawn(async move {
        for i in 0..n {
            let m = s.next().await.expect("subscription ended");
            assert_eq!(seq(&m.payload), i, "lost or out of order on {}", m.key);
        }
        assert_eq!(s.lost(), 0);
        s
    })
}

/// Joins publishers and receivers (all within `bound`, counted from now); returns the
/// longest publish time and what the receivers returned.
async fn join_all<R>(
    pubs: Vec<tokio::task::JoinHandle<Duration>>,
    recvs: Vec<tokio::task::JoinHandle<R>>,
    bound: Duration,
) -> (Duration, Vec<R>) {
    let deadline = tokio::time::Instant::now() + bound;
    let mut longest = Duration::ZERO;
    for p in pubs {
        let d = tokio::time::timeout_at(deadline, p)
            .await
            .expect("publishers were held back past the bound")
            .unwrap();
        longest = longest.max(d);
    }
    let mut got = Vec::new();
    for r in recvs {
        let v = tokio::time::timeout_at(deadline, r)
            .await
            .expect("a subscriber did not get all its messages in time")
            .unwrap();
        got.push(v);
    }
    (longest, got)
}

#[tokio::test]
async fn hog_native() {
    hog_native_over(false).await;
}

/// The same with the hog on shared memory: its ring fills, then its outbox, and it is cut
/// off as on TCP.
#[tokio::test]
async fn hog_native_shm() {
    hog_native_over(true).await;
}

async fn hog_native_over(shm: bool) {
    let (warnings, _guard) = Warnings::capture();
    let b = start(config(64 * 1024, MAX_BLOCK_MS)).await;
    let mut hog = if shm {
        NativeHog::connect_shm(&b, "**", Qos::default()).await
    } else {
        NativeHog::connect(&b.addr, "**", Qos::default()).await
    };
    let (a, sa) = native_peer(&b.addr, "hog/a").await;
    let (c, sc) = native_peer(&b.addr, "hog/c").await;
    let with_hog = b.broker.subscription_count();

    let recvs = vec![native_receive(sa, N), native_receive(sc, N)];
    let pubs = vec![
        native_publish(a.clone(), "hog/a", N, SIZE),
        native_publish(c.clone(), "hog/c", N, SIZE),
    ];
    let (took, _subs) = join_all(pubs, recvs, PUBLISH_BOUND).await;
    eprintln!("hog_native: published in {took:?}");

    let s = stats(&b);
    assert!(s.slow_consumers >= 1, "the hog was not cut off: {s:?}");
    assert_eq!(s.dropped, 0, "{s:?}");
    assert!(
        !a.is_closed() && !c.is_closed(),
        "a reader was disconnected"
    );
    assert!(warnings.slow_consumer("disconnecting") >= 1, "no warning");
    wait_subscriptions(&b, with_hog - 1).await;
    let got = drain_until_closed(&mut hog.s, 10).await;
    eprintln!("hog_native: the hog drained {got} bytes");
    assert!(
        got < 2 * N as usize * SIZE,
        "the hog got everything ({got} bytes): it was never stalled"
    );
}

#[tokio::test]
async fn stall_drop_native() {
    const MAX_BLOCK: u64 = 500;
    let (warnings, _guard) = Warnings::capture();
    let b = start(config(64 * 1024, MAX_BLOCK)).await;
    let qos = Qos {
        stall: Stall::Drop,
        ..Qos::default()
    };
    let mut hog = NativeHog::connect(&b.addr, "stall/**", qos).await;
    let (p, sp) = native_peer(&b.addr, "stall/x").await;

    let recvs = vec![native_receive(sp, 2 * N)];
    let pubs = vec![native_publish(p.clone(), "stall/x", 2 * N, SIZE)];
    // Held once for MAX_BLOCK, then the hog's messages are dropped at once.
    let (took, _subs) = join_all(pubs, recvs, PUBLISH_BOUND).await;
    eprintln!("stall_drop_native: published in {took:?}");

    let s = stats(&b);
    assert_eq!(s.stalls, 1, "held back for max_block once only: {s:?}");
    assert!(s.dropped > 0, "{s:?}");
    assert_eq!(
        s.slow_consumers, 0,
        "a Stall::Drop hog is not cut off: {s:?}"
    );
    assert_eq!(warnings.slow_consumer("dropping"), 1);
    assert_eq!(warnings.slow_consumer("disconnecting"), 0);

    // The hog is still connected: it reads what was queued for it, told how many it lost.
    let (mut received, mut lost) = (0u64, 0u64);
    let mut last = None;
    while received + lost < u64::from(2 * N) {
        match hog.next().await {
            Some(hayate_native::Frame::Msg { sid: 1, msg }) => {
                let i = seq(&msg.payload);
                assert!(last.is_none_or(|l| i > l), "out of order");
                last = Some(i);
                received += 1;
            }
            Some(hayate_native::Frame::MsgBatch {
                sid: 1, payloads, ..
            }) => {
                for p in payloads {
                    let i = seq(&p);
                    assert!(last.is_none_or(|l| i > l), "out of order");
                    last = Some(i);
                    received += 1;
                }
            }
            Some(hayate_native::Frame::Lost { sid: 1, count }) => lost += count,
            other => panic!("unexpected {other:?} ({received} received, {lost} lost)"),
        }
    }
    eprintln!("stall_drop_native: the hog received {received} and lost {lost}");
    assert!(lost > 0, "no LOST frame");
    assert_eq!(lost, stats(&b).dropped, "LOST reports what was dropped");
    // And it is still subscribed: a new message arrives.
    p.publish(&Key::new("stall/x").unwrap(), payload(2 * N, 8))
        .await
        .unwrap();
    p.flush().await.unwrap();
    match hog.next().await {
        Some(hayate_native::Frame::Msg { sid: 1, msg }) => assert_eq!(seq(&msg.payload), 2 * N),
        Some(hayate_native::Frame::MsgBatch {
            sid: 1, payloads, ..
        }) => assert_eq!(payloads.iter().next().map(seq), Some(2 * N)),
        other => panic!("expected the new message, got {other:?}"),
    }
}

// ---------------------------------------------------------------------------------------
// STOMP.

/// A raw STOMP connection.
struct Stomp {
    s: TcpStream,
    buf: BytesMut,
}

impl Stomp {
    async fn connect(addr: &str) -> Stomp {
        use hayate_stomp::{Command, Frame};
        let mut c = Stomp {
            s: TcpStream::connect(addr).await.unwrap(),
            buf: BytesMut::new(),
        };
        c.send(
            Frame::new(Command::Connect)
                .header("accept-version", "1.2")
                .header("host", "test"),
        )
        .await;
        let r = c.next().await.expect("CONNECTED");
        assert_eq!(r.command, Command::Connected, "{r:?}");
        c
    }

    async fn send(&mut self, f: hayate_stomp::Frame) {
        let mut b = BytesMut::new();
        hayate_stomp::encode(&f, hayate_stomp::Version::V1_2, &mut b);
        self.s.write_all(&b).await.unwrap();
    }

    async fn next(&mut self) -> Option<hayate_stomp::Frame> {
        use hayate_stomp::{Item, Limits, Version, decode};
        within(10, async {
            loop {
                match decode(&mut self.buf, Version::V1_2, &Limits::default()).unwrap() {
                    Some(Item::Frame(f)) => return Some(f),
                    Some(Item::HeartBeat) => continue,
                    None => {}
                }
                if self.s.read_buf(&mut self.buf).await.unwrap_or(0) == 0 {
                    return None;
                }
            }
        })
        .await
    }

    /// Waits for the RECEIPT `id`.
    async fn receipt(&mut self, id: &str) {
        let r = self.next().await.expect("RECEIPT");
        assert_eq!(r.command, hayate_stomp::Command::Receipt, "{r:?}");
        assert_eq!(r.get("receipt-id"), Some(id));
    }
}

#[tokio::test]
async fn hog_stomp() {
    use hayate_stomp::{Command, Frame};
    let (warnings, _guard) = Warnings::capture();
    let b = start(config(64 * 1024, MAX_BLOCK_MS)).await;
    let mut hog = Stomp::connect(&b.stomp).await;
    hog.send(
        Frame::new(Command::Subscribe)
            .header("id", "all")
            .header("destination", "/topic/**")
            .header("ack", "auto")
            .header("receipt", "subscribed"),
    )
    .await;
    hog.receipt("subscribed").await;

    let (a, sa) = native_peer(&b.addr, "hog/a").await;
    let (c, sc) = native_peer(&b.addr, "hog/c").await;
    let (_s, ss) = native_peer(&b.addr, "hog/s").await;
    let with_hog = b.broker.subscription_count();
    let recvs = vec![
        native_receive(sa, N),
        native_receive(sc, N),
        native_receive(ss, N),
    ];
    let mut pubs = vec![
        native_publish(a.clone(), "hog/a", N, SIZE),
        native_publish(c.clone(), "hog/c", N, SIZE),
    ];
    // A STOMP publisher too: its SENDs, then a DISCONNECT whose RECEIPT says all were handled.
    let mut sp = Stomp::connect(&b.stomp).await;
    pubs.push(tokio::spawn(async move {
        let t = Instant::now();
        let mut out = BytesMut::new();
        for i in 0..N {
            hayate_stomp::encode_send(
                "/topic/hog/s",
                &[],
                &payload(i, SIZE),
                hayate_stomp::Version::V1_2,
                &mut out,
            );
            if out.len() >= 256 * 1024 {
                sp.s.write_all(&out).await.unwrap();
                out.clear();
            }
        }
        sp.s.write_all(&out).await.unwrap();
        sp.send(Frame::new(Command::Disconnect).header("receipt", "bye"))
            .await;
        sp.receipt("bye").await;
        t.elapsed()
    }));
    let (took, _subs) = join_all(pubs, recvs, PUBLISH_BOUND).await;
    eprintln!("hog_stomp: published in {took:?}");

    let s = stats(&b);
    assert!(s.slow_consumers >= 1, "the hog was not cut off: {s:?}");
    assert_eq!(s.dropped, 0, "{s:?}");
    assert!(warnings.slow_consumer("disconnecting") >= 1, "no warning");
    wait_subscriptions(&b, with_hog - 1).await;
    let got = drain_until_closed(&mut hog.s, 10).await;
    eprintln!("hog_stomp: the hog drained {got} bytes");
    assert!(
        got < 3 * N as usize * SIZE,
        "the hog got everything ({got} bytes): it was never stalled"
    );
}

// ---------------------------------------------------------------------------------------
// MQTT.

/// What a rumqttc client's event loop reports.
#[derive(Debug)]
enum Ev {
    Publish(String, Bytes),
    PubAck,
    SubAck,
}

/// A slow consumer: it sleeps `.1` after every `.0` messages (and acknowledges everything it
/// reads, as rumqttc does).
type Pace = Option<(u32, Duration)>;

/// A rumqttc client (MQTT 3.1.1) whose event loop runs in a task, reporting on the channel,
/// paced by `pace`. Returns once the CONNACK is in.
async fn mqtt_client(
    addr: &str,
    id: &str,
    pace: Pace,
) -> (AsyncClient, mpsc::UnboundedReceiver<Ev>) {
    let (host, port) = addr.rsplit_once(':').unwrap();
    let mut o = MqttOptions::new(id, host, port.parse().unwrap());
    o.set_keep_alive(Duration::from_secs(30))
        .set_max_packet_size(1 << 20, 1 << 20);
    let (c, mut el) = AsyncClient::new(o, 100);
    let (tx, rx) = mpsc::unbounded_channel();
    let (ctx, crx) = tokio::sync::oneshot::channel();
    tokio::spawn(async move {
        let mut ctx = Some(ctx);
        let mut received = 0u32;
        loop {
            let ev = match el.poll().await {
                Ok(Event::Incoming(rumqttc::Packet::ConnAck(_))) => {
                    if let Some(t) = ctx.take() {
                        let _ = t.send(());
                    }
                    continue;
                }
                Ok(Event::Incoming(rumqttc::Packet::Publish(p))) => {
                    received += 1;
                    if let Some((every, d)) = pace
                        && received.is_multiple_of(every)
                    {
                        tokio::time::sleep(d).await;
                    }
                    Ev::Publish(p.topic.clone(), p.payload.clone())
                }
                Ok(Event::Incoming(rumqttc::Packet::PubAck(_))) => Ev::PubAck,
                Ok(Event::Incoming(rumqttc::Packet::SubAck(_))) => Ev::SubAck,
                Ok(_) => continue,
                Err(_) => return,
            };
            if tx.send(ev).is_err() {
                return;
            }
        }
    });
    within(10, crx).await.unwrap();
    (c, rx)
}

/// A rumqttc subscriber to `topic` at QoS 1 (SUBACK received).
async fn mqtt_subscriber(
    addr: &str,
    id: &str,
    topic: &str,
    pace: Pace,
) -> (AsyncClient, mpsc::UnboundedReceiver<Ev>) {
    let (c, mut rx) = mqtt_client(addr, id, pace).await;
    c.subscribe(topic, QoS::AtLeastOnce).await.unwrap();
    match within(10, rx.recv()).await {
        Some(Ev::SubAck) => {}
        other => panic!("expected SUBACK, got {other:?}"),
    }
    (c, rx)
}

/// Publishes `n` QoS 1 messages of `size` bytes on `topic` and waits for every PUBACK (each
/// sent once the broker has handled the message); returns how long that took.
async fn mqtt_publisher(
    addr: &str,
    id: &str,
    topic: &str,
    n: u32,
    size: usize,
) -> tokio::task::JoinHandle<Duration> {
    let (c, mut rx) = mqtt_client(addr, id, None).await;
    let topic = topic.to_string();
    tokio::spawn(async move {
        let t = Instant::now();
        let acks = tokio::spawn(async move {
            let mut acks = 0;
            while acks < n {
                match rx.recv().await {
                    Some(Ev::PubAck) => acks += 1,
                    Some(_) => {}
                    None => panic!("publisher's connection ended after {acks} PUBACKs"),
                }
            }
        });
        for i in 0..n {
            c.publish(&topic, QoS::AtLeastOnce, false, payload(i, size))
                .await
                .unwrap();
        }
        acks.await.unwrap();
        t.elapsed()
    })
}

/// Receives `n` messages on `topic`, in order; returns when the last one was processed.
fn mqtt_receive(
    mut rx: mpsc::UnboundedReceiver<Ev>,
    topic: &str,
    n: u32,
) -> tokio::task::JoinHandle<()> {
    let topic = topic.to_string();
    tokio::spawn(async move {
        let mut i = 0;
        while i < n {
            match rx.recv().await {
                Some(Ev::Publish(t, p)) => {
                    assert_eq!(t, topic);
                    assert_eq!(seq(&p), i, "lost or out of order on {topic}");
                    i += 1;
                }
                Some(_) => {}
                None => panic!("{topic}: connection ended after {i} messages"),
            }
        }
    })
}

/// A raw MQTT 3.1.1 connection, subscribed to `filter` at `qos` (SUBACK read).
async fn mqtt_hog(addr: &str, filter: &str, qos: hayate_mqtt::QoS) -> (TcpStream, BytesMut) {
    use hayate_mqtt::{Connect, Packet, ProtocolVersion, ReasonCode, Subscribe, decode, encode};
    let v = ProtocolVersion::V3_1_1;
    let mut s = TcpStream::connect(addr).await.unwrap();
    let mut c = Connect::new(v, "hog");
    c.keep_alive = 0;
    let mut b = BytesMut::new();
    encode(&Packet::Connect(Box::new(c)), v, &mut b).unwrap();
    encode(
        &Packet::Subscribe(Subscribe::new(
            1,
            vec![hayate_mqtt::Subscription::new(filter, qos)],
        )),
        v,
        &mut b,
    )
    .unwrap();
    s.write_all(&b).await.unwrap();
    let mut buf = BytesMut::new();
    let mut next = async || {
        within(10, async {
            loop {
                if let Some(p) = decode(&mut buf, v, u32::MAX).unwrap() {
                    return p;
                }
                assert!(s.read_buf(&mut buf).await.unwrap() > 0, "closed");
            }
        })
        .await
    };
    match next().await {
        Packet::ConnAck(a) => assert_eq!(a.reason_code, ReasonCode::Success),
        other => panic!("expected CONNACK, got {other:?}"),
    }
    match next().await {
        Packet::SubAck(a) => assert_eq!(a.reason_codes, vec![ReasonCode::granted(qos)]),
        other => panic!("expected SUBACK, got {other:?}"),
    }
    (s, buf)
}

#[tokio::test]
async fn hog_mqtt_qos0() {
    // A QoS 0 subscription never blocks: were it to, publishers would wait 20 s, far past
    // the bound.
    let (warnings, _guard) = Warnings::capture();
    let b = start(config(64 * 1024, 20_000)).await;
    let (mut hog, mut hog_buf) = mqtt_hog(&b.mqtt, "#", hayate_mqtt::QoS::AtMostOnce).await;
    let (_sa, ra) = mqtt_subscriber(&b.mqtt, "sub-a", "hog/a", None).await;
    let (_sc, rc) = mqtt_subscriber(&b.mqtt, "sub-c", "hog/c", None).await;
    let with_hog = b.broker.subscription_count();
    let recvs = vec![mqtt_receive(ra, "hog/a", N), mqtt_receive(rc, "hog/c", N)];
    let pubs = vec![
        mqtt_publisher(&b.mqtt, "pub-a", "hog/a", N, SIZE).await,
        mqtt_publisher(&b.mqtt, "pub-c", "hog/c", N, SIZE).await,
    ];
    let (took, _subs) = join_all(pubs, recvs, PUBLISH_BOUND).await;
    eprintln!("hog_mqtt_qos0: published in {took:?}");

    let s = stats(&b);
    assert_eq!(s.slow_consumers, 0, "a QoS 0 subscriber is never cut off");
    assert_eq!(warnings.slow_consumer(""), 0);
    assert!(s.dropped > 0, "nothing was dropped for the hog: {s:?}");
    assert_eq!(b.broker.subscription_count(), with_hog, "the hog is gone");

    // The hog is still connected: what it gets and what was dropped for it add up.
    let mut received = 0u64;
    let v = hayate_mqtt::ProtocolVersion::V3_1_1;
    within(10, async {
        while received + s.dropped < u64::from(2 * N) {
            if let Some(p) = hayate_mqtt::decode(&mut hog_buf, v, u32::MAX).unwrap() {
                match p {
                    hayate_mqtt::Packet::Publish(p) => {
                        assert!(p.topic.starts_with("hog/"), "{p:?}");
                        received += 1;
                    }
                    other => panic!("unexpected {other:?}"),
                }
                continue;
            }
            let n = hog.read_buf(&mut hog_buf).await.unwrap();
            assert!(n > 0, "the hog was disconnected after {received} messages");
        }
    })
    .await;
    eprintln!(
        "hog_mqtt_qos0: the hog received {received}, {} dropped",
        s.dropped
    );
    assert_eq!(received + stats(&b).dropped, u64::from(2 * N));
}

#[tokio::test]
async fn hog_mqtt_qos1() {
    let (warnings, _guard) = Warnings::capture();
    let b = start(config(64 * 1024, MAX_BLOCK_MS)).await;
    let (mut hog, _) = mqtt_hog(&b.mqtt, "#", hayate_mqtt::QoS::AtLeastOnce).await;
    let (_sa, ra) = mqtt_subscriber(&b.mqtt, "sub-a", "hog/a", None).await;
    let (_sc, rc) = mqtt_subscriber(&b.mqtt, "sub-c", "hog/c", None).await;
    let with_hog = b.broker.subscription_count();
    let recvs = vec![mqtt_receive(ra, "hog/a", N), mqtt_receive(rc, "hog/c", N)];
    let pubs = vec![
        mqtt_publisher(&b.mqtt, "pub-a", "hog/a", N, SIZE).await,
        mqtt_publisher(&b.mqtt, "pub-c", "hog/c", N, SIZE).await,
    ];
    let (took, _subs) = join_all(pubs, recvs, PUBLISH_BOUND).await;
    eprintln!("hog_mqtt_qos1: published in {took:?}");

    let s = stats(&b);
    assert!(s.slow_consumers >= 1, "the hog was not cut off: {s:?}");
    assert_eq!(s.dropped, 0, "{s:?}");
    assert!(warnings.slow_consumer("disconnecting") >= 1, "no warning");
    wait_subscriptions(&b, with_hog - 1).await;
    let got = drain_until_closed(&mut hog, 10).await;
    eprintln!("hog_mqtt_qos1: the hog drained {got} bytes");
    // Its deliveries in flight count against its 64 KiB outbox budget: it was sent about
    // that much, although its socket would have taken megabytes.
    assert!(
        got < 2 * 64 * 1024,
        "the hog was sent {got} bytes: its unacknowledged deliveries were not counted"
    );
}

#[tokio::test]
async fn slow_mqtt_qos1_subscriber_blocks_and_loses_nothing() {
    // 4 ms every 4 messages: at least 2 s for all.
    const EVERY: u32 = 4;
    const PAUSE: Duration = Duration::from_millis(4);
    // Never stalled for max_block: the subscriber acknowledges as it goes.
    let (warnings, _guard) = Warnings::capture();
    let b = start(config(256 * 1024, 10_000)).await;
    let (_s, rx) = mqtt_subscriber(&b.mqtt, "slow", "slow/x", Some((EVERY, PAUSE))).await;
    let sub_start = Instant::now();
    let recv = mqtt_receive(rx, "slow/x", N);
    let publisher = mqtt_publisher(&b.mqtt, "fast", "slow/x", N, SIZE).await;
    let took = within(20, publisher).await.unwrap();
    within(20, recv).await.unwrap();
    let sub_took = sub_start.elapsed();
    eprintln!("slow subscriber: published in {took:?}, received in {sub_took:?}");

    let s = stats(&b);
    assert_eq!(s.dropped, 0, "{s:?}");
    assert_eq!(s.slow_consumers, 0, "{s:?}");
    assert_eq!(warnings.slow_consumer(""), 0);
    // What the subscriber holds in flight and waiting counts against its 256 KiB budget (64
    // messages): the publisher cannot get further ahead than that, so it is done only once
    // the subscriber has processed nearly everything, at its pace at least.
    let floor = PAUSE * ((N - 200) / EVERY);
    assert!(
        took >= floor,
        "the publisher was not held back: done in {took:?}, the subscriber needs at least {floor:?}"
    );
}

// ---------------------------------------------------------------------------------------
// The engine alone: a cut-off subscriber whose session is still open.

/// Encodes a delivery as its payload: the bytes only count against the budget.
struct PayloadEncoder;

impl hayate_broker::Encoder for PayloadEncoder {
    fn encode(
        &mut self,
        _sid: u32,
        batch: hayate_broker::Batch<'_>,
        _origin: u64,
        out: &mut hayate_broker::OutBuf,
    ) {
        for i in 0..batch.len() {
            out.tail().extend_from_slice(&batch.message(i).payload);
        }
    }

    fn encode_lost(&mut self, _sid: u32, _count: u64, _out: &mut hayate_broker::OutBuf) {}
}

/// Once a slow consumer is cut off, deliveries to it are accepted and discarded without
/// waiting (`Outbox::cut`) until its connection has ended, however long that takes (its reader
/// may itself be blocked publishing). A publisher is held for `max_block` once, not once per
/// batch.
#[tokio::test]
async fn cut_off_subscriber_takes_later_batches_without_waiting() {
    use hayate_broker::{Batch, Broker, BrokerConfig};
    let max_block = Duration::from_millis(MAX_BLOCK_MS);
    let broker = Broker::new(BrokerConfig {
        outbox_bytes: 64 * 1024,
        max_block: Some(max_block),
        ..BrokerConfig::default()
    });
    // Nobody drains the hog's outbox, and its session stays open.
    let mut hog = broker.open_session(Box::new(PayloadEncoder));
    hog.subscribe(1, KeyExpr::new("cut/**").unwrap(), None, Qos::default())
        .unwrap();
    let mut p = broker.open_session(Box::new(PayloadEncoder));
    let key = Key::new("cut/x").unwrap();
    // 256 KiB: four times the budget (a native client's PUB_BATCH can be that large).
    let payloads: Vec<Bytes> = (0..64).map(|i| payload(i, SIZE)).collect();
    let batch = Batch::Plain {
        key: &key,
        payloads: &payloads,
    };

    let t = Instant::now();
    within(10, p.publish(batch)).await;
    let first = t.elapsed();
    assert!(first >= max_block, "not held back at all: {first:?}");
    assert!(hog.outbox().is_cut(), "the hog was not cut off");
    assert_eq!(broker.stats().slow_consumers.load(Ordering::Relaxed), 1);

    for round in 0..3 {
        let t = Instant::now();
        within(10, p.publish(batch)).await;
        let again = t.elapsed();
        assert!(
            again < max_block / 3,
            "batch {round} after the cut was held {again:?} by the cut-off subscriber"
        );
    }
    drop(hog);
}

/// Publishers that never read their own answers (MQTT PUBACKs, STOMP RECEIPTs, native
/// PONGs) are held back by the connection driver once their output is over the outbox
/// budget, whatever the protocol; everybody else carries on.
#[tokio::test]
async fn publishers_that_never_read_their_answers_are_held_back() {
    let mut c = Config::default();
    c.limits.outbox_bytes = 64 * 1024;
    let b = start(c).await;
    // Each attempt writes up to 5,000 chunks; the answers to them would be tens of MB.
    async fn stalls(addr: &str, hello: &[u8], chunk: &[u8]) -> bool {
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(hello).await.unwrap();
        let mut first = [0u8; 64];
        let _ = s.read(&mut first).await.unwrap();
        for _ in 0..5_000 {
            match tokio::time::timeout(Duration::from_secs(2), s.write_all(chunk)).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => panic!("write failed: {e}"),
                Err(_) => return true,
            }
        }
        false
    }
    // MQTT 3.1.1: CONNECT, then QoS 1 PUBLISHes on `ab` (PUBACK: 4 bytes each).
    let connect = b"\x10\x0d\x00\x04MQTT\x04\x02\x00\x3c\x00\x01c";
    let mut publishes = Vec::new();
    for i in 0..1000u16 {
        publishes.extend_from_slice(&[0x32, 7, 0, 2, b'a', b'b']);
        publishes.extend_from_slice(&(i + 1).to_be_bytes());
        publishes.push(b'x');
    }
    assert!(
        stalls(&b.mqtt, connect, &publishes).await,
        "MQTT: PUBACKs piled up without bound"
    );
    // STOMP: SENDs with receipts.
    let stomp_connect = b"CONNECT\naccept-version:1.2\nhost:/\n\n\0";
    let mut sends = Vec::new();
    for i in 0..1000 {
        sends.extend_from_slice(
            format!("SEND\ndestination:/topic/ab\nreceipt:r{i}\n\nx\0").as_bytes(),
        );
    }
    assert!(
        stalls(&b.stomp, stomp_connect, &sends).await,
        "STOMP: RECEIPTs piled up without bound"
    );
    // Everybody else carries on.
    let other = Client::connect(&b.addr).await.unwrap();
    within(5, other.flush()).await.unwrap();
}
