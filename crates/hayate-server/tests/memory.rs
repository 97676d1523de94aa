//! MQTT and STOMP sessions driven byte for byte over in-memory connections
//! ([`hayate_server::transport::memory`]): no socket, no listener, no accept loop. Each
//! connection is the front-end's own `serve` function on a task the test spawns, so a test
//! can wait for a connection to have ended (its session parked or its unacknowledged
//! messages given back) by awaiting that task instead of sleeping. Timeouts are only a
//! watchdog against hangs.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use hayate_broker::{Broker, BrokerConfig};
use hayate_io::memory::Memory;
use hayate_mqtt::{
    Ack, ConnAck, Connect, Disconnect, Packet, ProtocolVersion, Publish, QoS, ReasonCode,
    Subscribe, Subscription, decode, encode,
};
use hayate_server::auth::ConfigAuth;
use hayate_server::frontend::Accepted;
use hayate_server::mqtt::Mqtt;
use hayate_server::stomp::Stomp;
use hayate_server::transport::{MemoryPeer, Reader, Writer, memory};
use hayate_server::{Config, mqtt, stomp};
use hayate_stomp::{Command, Frame, Item, Limits, Version};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// Bytes each direction of a connection holds: small, so that sessions write through
/// `WouldBlock` and readiness waits as they would on a congested socket.
const CAPACITY: usize = 256;

/// Awaits `f`, failing the test after 10 s (a watchdog, not a timing assertion).
async fn within<T>(f: impl Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(10), f)
        .await
        .expect("test watchdog expired")
}

/// One broker with its MQTT and STOMP front-ends, as `Server` assembles them, and the
/// shutdown signal their connections watch.
struct Hub {
    mqtt: Arc<Mqtt>,
    /// The broker's memory budget.
    memory: Arc<Memory>,
    stomp: Arc<Stomp>,
    stop: watch::Sender<bool>,
}

impl Hub {
    fn new() -> Hub {
        Hub::with_broker(BrokerConfig::default())
    }

    /// A hub whose broker has a memory budget of `limit` bytes (shared by its front-ends,
    /// as `Server` shares it).
    fn with_budget(limit: usize) -> Hub {
        Hub::with_broker(BrokerConfig {
            memory: Memory::new(limit),
            ..BrokerConfig::default()
        })
    }

    fn with_broker(broker: BrokerConfig) -> Hub {
        let mut config = Config::default();
        config.server.data_dir.clear(); // nothing on disk
        let broker = Broker::new(broker);
        let auth = Arc::new(ConfigAuth::from_section(&config.auth).expect("default auth"));
        Hub {
            memory: broker.config().memory.clone(),
            mqtt: Mqtt::new(broker.clone(), &config, auth.clone()),
            stomp: Stomp::new(broker, &config, auth),
            stop: watch::channel(false).0,
        }
    }

    /// A new in-memory connection served by `serve`: the test's end and the serving task.
    fn connect<F>(&self, serve: impl FnOnce(Reader, Writer) -> F) -> (MemoryPeer, JoinHandle<()>)
    where
        F: Future<Output = ()> + Send + 'static,
    {
        let ((r, w), peer) = memory(CAPACITY);
        (peer, tokio::spawn(serve(r, w)))
    }

    fn mqtt(&self) -> (MemoryPeer, JoinHandle<()>) {
        let (m, stop) = (self.mqtt.clone(), self.stop.subscribe());
        self.connect(|r, w| mqtt::conn::serve(Accepted::new(r, w, stop), m))
    }

    fn stomp(&self) -> (MemoryPeer, JoinHandle<()>) {
        let (s, stop) = (self.stomp.clone(), self.stop.subscribe());
        self.connect(|r, w| stomp::conn::serve(Accepted::new(r, w, stop), s))
    }
}

/// An MQTT client over an in-memory connection, with our codec.
struct MqttPeer {
    io: MemoryPeer,
    buf: BytesMut,
    v: ProtocolVersion,
    task: JoinHandle<()>,
}

impl MqttPeer {
    /// Connects with `c` and returns the client with the CONNACK.
    async fn connect(hub: &Hub, c: Connect) -> (MqttPeer, ConnAck) {
        let (io, task) = hub.mqtt();
        let mut p = MqttPeer {
            io,
            buf: BytesMut::new(),
            v: c.protocol_version,
            task,
        };
        p.send(&Packet::Connect(Box::new(c))).await;
        match p.next().await {
            Some(Packet::ConnAck(a)) => (p, *a),
            other => panic!("expected CONNACK, got {other:?}"),
        }
    }

    async fn send(&mut self, p: &Packet) {
        let mut b = BytesMut::new();
        encode(p, self.v, &mut b).unwrap();
        within(self.io.write_all(&b)).await.unwrap();
    }

    /// The next packet, or `None` at the end of the stream.
    async fn next(&mut self) -> Option<Packet> {
        within(async {
            loop {
                if let Some(p) = decode(&mut self.buf, self.v, u32::MAX).unwrap() {
                    return Some(p);
                }
                if self.io.read_buf(&mut self.buf).await.unwrap() == 0 {
                    assert!(self.buf.is_empty(), "a partial packet at the end");
                    return None;
                }
            }
        })
        .await
    }

    /// The next packet, which must be a PUBLISH.
    async fn publication(&mut self) -> Publish {
        match self.next().await {
            Some(Packet::Publish(p)) => p,
            other => panic!("expected PUBLISH, got {other:?}"),
        }
    }

    /// Sends DISCONNECT, sees the server close the stream and waits until the connection
    /// has ended (a persistent session is parked by then).
    async fn disconnect(mut self) {
        self.send(&Packet::Disconnect(Disconnect::new(ReasonCode::Success)))
            .await;
        assert_eq!(
            self.next().await,
            None,
            "the server closes after DISCONNECT"
        );
        within(self.task).await.unwrap();
    }
}

fn connect(v: ProtocolVersion, id: &str, clean: bool) -> Connect {
    let mut c = Connect::new(v, id);
    c.clean_start = clean;
    if v.is_v5() && !clean {
        c.properties.session_expiry_interval = Some(300);
    }
    c
}

fn publish_qos1(topic: &str, pid: u16, payload: &'static str) -> Packet {
    let mut p = Publish::new(topic, Bytes::from_static(payload.as_bytes()));
    p.qos = QoS::AtLeastOnce;
    p.packet_id = Some(pid);
    Packet::Publish(p)
}

/// CONNECT, SUBSCRIBE at QoS 1, a PUBLISH from a second client delivered with a packet
/// id and acknowledged, DISCONNECT; then a QoS 1 message published while the subscriber is
/// offline, held by its persistent session and delivered when it reconnects.
async fn mqtt_session(v: ProtocolVersion) {
    let hub = Hub::new();
    let sub_id = format!("sub-{v:?}");

    let (mut sub, ack) = MqttPeer::connect(&hub, connect(v, &sub_id, false)).await;
    assert_eq!(ack.reason_code, ReasonCode::Success);
    assert!(!ack.session_present);
    sub.send(&Packet::Subscribe(Subscribe::new(
        1,
        vec![Subscription::new("m/#", QoS::AtLeastOnce)],
    )))
    .await;
    match sub.next().await {
        Some(Packet::SubAck(a)) => {
            assert_eq!(a.packet_id, 1);
            assert_eq!(a.reason_codes, vec![ReasonCode::GrantedQoS1]);
        }
        other => panic!("expected SUBACK, got {other:?}"),
    }

    // A second client publishes at QoS 1: acknowledged once routed.
    let (mut publisher, ack) = MqttPeer::connect(&hub, connect(v, "pub", true)).await;
    assert_eq!(ack.reason_code, ReasonCode::Success);
    publisher.send(&publish_qos1("m/a", 7, "one")).await;
    assert_eq!(publisher.next().await, Some(Packet::PubAck(Ack::new(7))));

    // Delivered at QoS 1 with a packet id of the subscriber's session.
    let got = sub.publication().await;
    assert_eq!(
        (got.topic.as_str(), &got.payload[..], got.qos, got.dup),
        ("m/a", &b"one"[..], QoS::AtLeastOnce, false)
    );
    let pid = got.packet_id.expect("a QoS 1 delivery has a packet id");
    sub.send(&Packet::PubAck(Ack::new(pid))).await;
    sub.disconnect().await;

    // Published while the subscriber is offline: its parked session holds it.
    publisher.send(&publish_qos1("m/b", 8, "two")).await;
    assert_eq!(publisher.next().await, Some(Packet::PubAck(Ack::new(8))));

    let (mut sub, ack) = MqttPeer::connect(&hub, connect(v, &sub_id, false)).await;
    assert_eq!(ack.reason_code, ReasonCode::Success);
    assert!(ack.session_present, "the session was resumed");
    let got = sub.publication().await;
    assert_eq!(
        (got.topic.as_str(), &got.payload[..], got.qos),
        ("m/b", &b"two"[..], QoS::AtLeastOnce)
    );
    let pid = got.packet_id.expect("a QoS 1 delivery has a packet id");
    sub.send(&Packet::PubAck(Ack::new(pid))).await;
    // Nothing else was held: the acknowledged "one" is not delivered again, and the
    // PINGRESP queued behind the held messages comes next.
    sub.send(&Packet::PingReq).await;
    assert_eq!(sub.next().await, Some(Packet::PingResp));

    sub.disconnect().await;
    publisher.disconnect().await;
}

#[tokio::test]
async fn mqtt_3_1_1_session_in_memory() {
    mqtt_session(ProtocolVersion::V3_1_1).await;
}

#[tokio::test]
async fn mqtt_5_session_in_memory() {
    mqtt_session(ProtocolVersion::V5).await;
}

#[tokio::test]
async fn mqtt_output_goes_through_a_congested_connection_whole_and_in_order() {
    let hub = Hub::new();
    let v = ProtocolVersion::V5;
    let (mut sub, _) = MqttPeer::connect(&hub, connect(v, "slow", true)).await;
    sub.send(&Packet::Subscribe(Subscribe::new(
        1,
        vec![Subscription::new("flood", QoS::AtMostOnce)],
    )))
    .await;
    assert!(matches!(sub.next().await, Some(Packet::SubAck(_))));
    let (mut publisher, _) = MqttPeer::connect(&hub, connect(v, "flooder", true)).await;
    // Far more than the connection holds: the subscriber's session writes it in pieces as
    // the test reads, each piece after a WouldBlock and a readiness wait.
    const N: u32 = 200;
    for i in 0..N {
        let payload = Bytes::from(format!("{i:0>40}"));
        publisher
            .send(&Packet::Publish(Publish::new("flood", payload)))
            .await;
    }
    // A round trip: every PUBLISH before it was routed.
    publisher.send(&Packet::PingReq).await;
    assert_eq!(publisher.next().await, Some(Packet::PingResp));
    for i in 0..N {
        let got = sub.publication().await;
        assert_eq!(&got.payload[..], format!("{i:0>40}").as_bytes());
    }
    sub.disconnect().await;
    publisher.disconnect().await;
}

/// A STOMP 1.2 client over an in-memory connection, with our codec.
struct StompPeer {
    io: MemoryPeer,
    buf: BytesMut,
    task: JoinHandle<()>,
}

impl StompPeer {
    /// Connects (CONNECT, CONNECTED 1.2).
    async fn connect(hub: &Hub) -> StompPeer {
        let (io, task) = hub.stomp();
        let mut c = StompPeer {
            io,
            buf: BytesMut::new(),
            task,
        };
        c.send(
            Frame::new(Command::Connect)
                .header("accept-version", "1.2")
                .header("host", "memory"),
        )
        .await;
        let r = c.next().await.expect("CONNECTED");
        assert_eq!(r.command, Command::Connected, "{r:?}");
        assert_eq!(r.get("version"), Some("1.2"));
        c
    }

    async fn send(&mut self, f: Frame) {
        let mut b = BytesMut::new();
        hayate_stomp::encode(&f, Version::V1_2, &mut b);
        within(self.io.write_all(&b)).await.unwrap();
    }

    /// The next frame (heart-beats skipped), `None` at the end of the stream.
    async fn next(&mut self) -> Option<Frame> {
        within(async {
            loop {
                match hayate_stomp::decode(&mut self.buf, Version::V1_2, &Limits::default())
                    .unwrap()
                {
                    Some(Item::Frame(f)) => return Some(f),
                    Some(Item::HeartBeat) => continue,
                    None => {}
                }
                if self.io.read_buf(&mut self.buf).await.unwrap() == 0 {
                    assert!(self.buf.is_empty(), "a partial frame at the end");
                    return None;
                }
            }
        })
        .await
    }

    async fn expect_receipt(&mut self, id: &str) {
        let r = self.next().await.expect("RECEIPT");
        assert_eq!(r.command, Command::Receipt, "{r:?}");
        assert_eq!(r.get("receipt-id"), Some(id));
    }

    /// The next frame, which must be a MESSAGE.
    async fn message(&mut self) -> Frame {
        let m = self.next().await.expect("MESSAGE");
        assert_eq!(m.command, Command::Message, "{m:?}");
        m
    }

    /// DISCONNECT with a receipt: the RECEIPT, the end of the stream, the connection ended.
    async fn disconnect(mut self) {
        self.send(Frame::new(Command::Disconnect).header("receipt", "bye"))
            .await;
        self.expect_receipt("bye").await;
        assert!(
            self.next().await.is_none(),
            "the server closes after DISCONNECT"
        );
        within(self.task).await.unwrap();
    }
}

fn body(f: &Frame) -> &str {
    std::str::from_utf8(&f.body).unwrap()
}

#[tokio::test]
async fn stomp_session_in_memory() {
    let hub = Hub::new();
    let mut c = StompPeer::connect(&hub).await;
    c.send(
        Frame::new(Command::Subscribe)
            .header("id", "s1")
            .header("destination", "/queue/x")
            .header("ack", "client-individual")
            .header("receipt", "sub"),
    )
    .await;
    c.expect_receipt("sub").await;

    // A second client sends to the queue.
    let mut p = StompPeer::connect(&hub).await;
    p.send(
        Frame::new(Command::Send)
            .header("destination", "/queue/x")
            .header("receipt", "sent")
            .body("job"),
    )
    .await;
    p.expect_receipt("sent").await;

    // MESSAGE with the subscription, a message id and, in client-individual mode, an ack id.
    let m = c.message().await;
    assert_eq!(body(&m), "job");
    assert_eq!(m.get("destination"), Some("/queue/x"));
    assert_eq!(m.get("subscription"), Some("s1"));
    let message_id = m.get("message-id").expect("message-id").to_string();
    let ack = m.get("ack").expect("ack header").to_string();

    // NACK: the message goes back to the queue, whose only consumer gets it again.
    c.send(
        Frame::new(Command::Nack)
            .header("id", &ack)
            .header("receipt", "nacked"),
    )
    .await;
    let (mut receipt, mut again) = (None, None);
    while receipt.is_none() || again.is_none() {
        let f = c.next().await.expect("RECEIPT and MESSAGE");
        match f.command {
            Command::Receipt => receipt = Some(f),
            Command::Message => again = Some(f),
            other => panic!("unexpected {other:?}: {f:?}"),
        }
    }
    assert_eq!(receipt.unwrap().get("receipt-id"), Some("nacked"));
    let again = again.unwrap();
    assert_eq!(body(&again), "job");
    assert_eq!(again.get("subscription"), Some("s1"));
    assert!(again.get("message-id").is_some());
    let ack_again = again.get("ack").expect("ack header").to_string();
    assert_ne!(
        (again.get("message-id").unwrap(), ack_again.as_str()),
        (message_id.as_str(), ack.as_str()),
        "a redelivery is a new delivery"
    );

    // ACK settles it.
    c.send(
        Frame::new(Command::Ack)
            .header("id", &ack_again)
            .header("receipt", "acked"),
    )
    .await;
    c.expect_receipt("acked").await;
    c.disconnect().await;

    // Acknowledged: nothing goes back to the queue when the consumer leaves, so a new
    // consumer gets only what is sent after.
    let mut d = StompPeer::connect(&hub).await;
    d.send(
        Frame::new(Command::Subscribe)
            .header("id", "s2")
            .header("destination", "/queue/x")
            .header("ack", "client-individual")
            .header("receipt", "sub2"),
    )
    .await;
    d.expect_receipt("sub2").await;
    p.send(
        Frame::new(Command::Send)
            .header("destination", "/queue/x")
            .body("next"),
    )
    .await;
    let m = d.message().await;
    assert_eq!(
        body(&m),
        "next",
        "the acknowledged job is not delivered again"
    );
    d.send(Frame::new(Command::Ack).header("id", m.get("ack").unwrap()))
        .await;
    d.disconnect().await;
    p.disconnect().await;
}

#[tokio::test]
async fn stomp_unacknowledged_message_goes_back_to_the_queue_when_its_consumer_leaves() {
    let hub = Hub::new();
    let mut p = StompPeer::connect(&hub).await;
    let mut c = StompPeer::connect(&hub).await;
    c.send(
        Frame::new(Command::Subscribe)
            .header("id", "s")
            .header("destination", "/queue/work")
            .header("ack", "client-individual")
            .header("receipt", "sub"),
    )
    .await;
    c.expect_receipt("sub").await;
    p.send(
        Frame::new(Command::Send)
            .header("destination", "/queue/work")
            .body("w1"),
    )
    .await;
    assert_eq!(body(&c.message().await), "w1");
    // Not acknowledged; the consumer leaves, and once its connection has ended the
    // message is back in the queue for the next consumer.
    c.disconnect().await;
    let mut d = StompPeer::connect(&hub).await;
    d.send(
        Frame::new(Command::Subscribe)
            .header("id", "s")
            .header("destination", "/queue/work")
            .header("ack", "client-individual"),
    )
    .await;
    let m = d.message().await;
    assert_eq!(body(&m), "w1");
    d.send(Frame::new(Command::Ack).header("id", m.get("ack").unwrap()))
        .await;
    d.disconnect().await;
    p.disconnect().await;
}

#[tokio::test]
async fn shutdown_ends_in_memory_connections() {
    let hub = Hub::new();
    let (mut m, _) = MqttPeer::connect(&hub, connect(ProtocolVersion::V5, "m", true)).await;
    let mut s = StompPeer::connect(&hub).await;
    hub.stop.send(true).unwrap();
    match m.next().await {
        Some(Packet::Disconnect(d)) => {
            assert_eq!(d.reason_code, ReasonCode::ServerShuttingDown);
        }
        other => panic!("expected DISCONNECT, got {other:?}"),
    }
    assert_eq!(m.next().await, None);
    let e = s.next().await.expect("ERROR");
    assert_eq!(e.command, Command::Error, "{e:?}");
    assert_eq!(e.get("message"), Some("server shutting down"));
    assert!(s.next().await.is_none());
    within(m.task).await.unwrap();
    within(s.task).await.unwrap();
}

/// A client's DISCONNECT is written just before its new connection's CONNECT: whichever the
/// broker handles first, the old session ends as the DISCONNECT said. With no Session
/// Expiry (5.0) the session ends with the connection, so the new one finds none; with an
/// expiry the session is kept and the new connection gets it. A takeover that reaches the
/// old connection while its DISCONNECT is still unread must handle the DISCONNECT first
/// (before that fix, the session was handed over as if the DISCONNECT had not been sent).
/// Both orders occur across the rounds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_disconnect_just_before_the_same_clients_reconnect_counts() {
    let hub = Hub::new();
    let v = ProtocolVersion::V5;
    for round in 0..200 {
        for persistent in [false, true] {
            let id = format!("dr-{round}-{persistent}");
            let (mut old, ack) = MqttPeer::connect(&hub, connect(v, &id, !persistent)).await;
            assert!(!ack.session_present);
            old.send(&Packet::Disconnect(Disconnect::new(ReasonCode::Success)))
                .await;
            let (new, ack) = MqttPeer::connect(&hub, connect(v, &id, false)).await;
            assert_eq!(ack.reason_code, ReasonCode::Success);
            assert_eq!(
                ack.session_present,
                persistent,
                "round {round}: a session {} after DISCONNECT",
                if persistent { "lost" } else { "resumed" }
            );
            within(old.task).await.unwrap();
            new.disconnect().await;
        }
    }
}

/// A budget small enough that a few thousand one-byte messages fill it once each is
/// charged its footprint (some 500 bytes: the `Message`, its allocations, its slot), and
/// that they would not come near if only their key and payload bytes were charged (about
/// 10 bytes each: 40 KB for 4,096).
const SMALL_BUDGET: usize = 1 << 20;

/// One-byte messages sent in the two tests below.
const TINY: u16 = 4096;

/// A hostile publisher stores 4,096 one-byte retained messages on distinct topics under a
/// 1 MiB budget. Each is charged what it costs the process, not its 10 bytes of topic and
/// payload: the budget fills after about 2,000, and the rest are delivered but not kept,
/// each PUBLISH acknowledged with 0x97 Quota exceeded (5.0). Before, all 4,096 were kept
/// with 40 KB charged (so 7.7 M of them took a 128 MiB broker to 4.48 GB).
#[tokio::test]
async fn tiny_retained_messages_are_charged_their_footprint() {
    let hub = Hub::with_budget(SMALL_BUDGET);
    let pool = hub.memory.clone();
    let (mut p, ack) = MqttPeer::connect(&hub, connect(ProtocolVersion::V5, "ret", true)).await;
    assert_eq!(ack.reason_code, ReasonCode::Success);
    let mut codes = Vec::new();
    for i in 0..TINY {
        let mut publish = Publish::new(format!("r/{i}").as_str(), Bytes::from_static(b"x"));
        publish.qos = QoS::AtLeastOnce;
        publish.packet_id = Some(i + 1);
        publish.retain = true;
        p.send(&Packet::Publish(publish)).await;
        match p.next().await {
            Some(Packet::PubAck(a)) if a.packet_id == i + 1 => codes.push(a.reason_code),
            other => panic!("expected PUBACK {}, got {other:?}", i + 1),
        }
    }
    let refused = codes
        .iter()
        .filter(|&&c| c == ReasonCode::QuotaExceeded)
        .count();
    let kept = codes.len() - refused;
    assert_eq!(
        codes[0],
        ReasonCode::Success,
        "the first ones fit the budget"
    );
    assert!(
        refused > 0,
        "4,096 tiny retained messages all kept under a 1 MiB budget: charged only their bytes"
    );
    assert!(
        kept * 400 <= SMALL_BUDGET,
        "{kept} kept: less than 400 bytes charged for each"
    );
    assert_eq!(
        hub.mqtt
            .stats
            .retained_refused
            .load(std::sync::atomic::Ordering::Relaxed),
        refused as u64,
        "each one not kept is counted"
    );
    assert!(pool.used() <= pool.limit(), "overdrawn: {}", pool.used());
    p.disconnect().await;
}

/// An offline persistent session (3.1.1) subscribed at QoS 1 is sent 4,096 one-byte
/// messages under a 1 MiB budget: it keeps what the budget covers at each delivery's
/// footprint (its `Message`, allocations and queue slot), the rest is dropped for it and
/// counted. Before, it kept all 4,096 with 40 KB charged (and 50 such sessions holding 5 M
/// messages took a 128 MiB broker to 1.87 GB).
#[tokio::test]
async fn an_offline_session_holds_tiny_messages_at_their_footprint() {
    let v = ProtocolVersion::V3_1_1;
    let hub = Hub::with_budget(SMALL_BUDGET);
    let pool = hub.memory.clone();
    let (mut sub, _) = MqttPeer::connect(&hub, connect(v, "off", false)).await;
    sub.send(&Packet::Subscribe(Subscribe::new(
        1,
        vec![Subscription::new("o/#", QoS::AtLeastOnce)],
    )))
    .await;
    assert!(matches!(sub.next().await, Some(Packet::SubAck(_))));
    sub.disconnect().await;

    let (mut p, _) = MqttPeer::connect(&hub, connect(v, "flood", true)).await;
    for i in 0..TINY {
        p.send(&publish_qos1("o/x", i + 1, "x")).await;
        assert_eq!(p.next().await, Some(Packet::PubAck(Ack::new(i + 1))));
    }
    let held = hub
        .mqtt
        .stats
        .held
        .messages
        .load(std::sync::atomic::Ordering::Relaxed);
    assert!(
        held < u64::from(TINY),
        "all 4,096 held by the offline session under a 1 MiB budget: charged only their bytes"
    );
    assert!(held > 0, "what fits is kept");
    assert!(
        held * 400 <= SMALL_BUDGET as u64,
        "{held} held: less than 400 bytes charged for each"
    );
    assert!(pool.refused() > 0, "the budget refused the rest");
    assert!(pool.used() <= pool.limit(), "overdrawn: {}", pool.used());
    p.disconnect().await;
}
