//! MQTT end to end with rumqttc (a client nobody here wrote) and with raw packets from our
//! codec: QoS levels, cross-protocol routing, shared subscriptions, wills, persistence
//! across a restart, and bad input. The paho-mqtt and mosquitto suites in tests/interop
//! cover the rest of the behaviour list.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use bytes::{Bytes, BytesMut};
use common::{start, start_default, within};
use hayate_client::{Client, Key};
use hayate_mqtt::{Connect, Packet, ProtocolVersion, ReasonCode, Will, decode, encode};
use rumqttc::{AsyncClient, Event, MqttOptions, QoS};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::mpsc;

/// A received PUBLISH: topic, payload, QoS.
type Got = (String, Bytes, QoS);

/// A rumqttc client whose event loop runs in a task; publishes arrive on the channel.
/// Returns once the CONNACK is in (with its session-present flag).
async fn client(
    addr: &str,
    id: &str,
    clean: bool,
) -> (AsyncClient, mpsc::UnboundedReceiver<Got>, bool) {
    let (host, port) = addr.rsplit_once(':').unwrap();
    let mut o = MqttOptions::new(id, host, port.parse().unwrap());
    o.set_keep_alive(Duration::from_secs(10))
        .set_clean_session(clean);
    let (c, mut el) = AsyncClient::new(o, 1000);
    let (tx, rx) = mpsc::unbounded_channel();
    let (ctx, crx) = tokio::sync::oneshot::channel();
    tokio::spawn(async move {
        let mut ctx = Some(ctx);
        loop {
            match el.poll().await {
                Ok(Event::Incoming(rumqttc::Packet::ConnAck(a))) => {
                    if let Some(t) = ctx.take() {
                        let _ = t.send(a.session_present);
                    }
                }
                Ok(Event::Incoming(rumqttc::Packet::Publish(p))) => {
                    let _ = tx.send((p.topic.clone(), p.payload.clone(), p.qos));
                }
                Ok(_) => {}
                Err(_) => return,
            }
        }
    });
    let present = within(10, crx).await.unwrap();
    (c, rx, present)
}

/// Subscribes and waits until the broker has processed it (a round trip on a private
/// topic through the same connection).
async fn sub(c: &AsyncClient, rx: &mut mpsc::UnboundedReceiver<Got>, filter: &str, qos: QoS) {
    c.subscribe(filter, qos).await.unwrap();
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let probe = format!("probe/{n}");
    c.subscribe(&probe, QoS::AtMostOnce).await.unwrap();
    c.publish(&probe, QoS::AtMostOnce, false, "p")
        .await
        .unwrap();
    within(10, async {
        loop {
            let (t, _, _) = rx.recv().await.unwrap();
            if t == probe {
                break;
            }
        }
    })
    .await;
}

async fn recv(rx: &mut mpsc::UnboundedReceiver<Got>) -> Got {
    within(10, rx.recv()).await.unwrap()
}

#[tokio::test]
async fn qos_levels_round_trip_at_the_lower_qos() {
    let b = start_default().await;
    let (s, mut srx, _) = client(&b.mqtt, "sub-q", true).await;
    sub(&s, &mut srx, "q/#", QoS::ExactlyOnce).await;
    let (s1, mut s1rx, _) = client(&b.mqtt, "sub-q1", true).await;
    sub(&s1, &mut s1rx, "q/+", QoS::AtLeastOnce).await;
    let (p, _prx, _) = client(&b.mqtt, "pub-q", true).await;
    for (i, q) in [QoS::AtMostOnce, QoS::AtLeastOnce, QoS::ExactlyOnce]
        .into_iter()
        .enumerate()
    {
        p.publish(format!("q/{i}"), q, false, vec![i as u8; 100])
            .await
            .unwrap();
        let (t, pl, got) = recv(&mut srx).await;
        assert_eq!(
            (t.as_str(), &pl[..], got),
            (&*format!("q/{i}"), &[i as u8; 100][..], q)
        );
        let (_, _, got1) = recv(&mut s1rx).await;
        assert_eq!(
            got1,
            if q == QoS::ExactlyOnce {
                QoS::AtLeastOnce
            } else {
                q
            }
        );
    }
}

#[tokio::test]
async fn mqtt_and_native_clients_see_each_other() {
    let b = start_default().await;
    let native = Client::connect(&b.addr).await.unwrap();
    let mut ns = native.subscribe("x/**").await.unwrap();
    native.flush().await.unwrap();
    let (m, mut mrx, _) = client(&b.mqtt, "cross", true).await;
    sub(&m, &mut mrx, "x/+", QoS::AtLeastOnce).await;

    m.publish("x/from-mqtt", QoS::AtLeastOnce, false, "hello native")
        .await
        .unwrap();
    let got = within(10, ns.next()).await.unwrap();
    assert_eq!(got.key.as_str(), "x/from-mqtt");
    assert_eq!(&got.payload[..], b"hello native");

    native
        .publish(&Key::new("x/from-native").unwrap(), "hello mqtt")
        .await
        .unwrap();
    native.flush().await.unwrap();
    loop {
        let (t, pl, q) = recv(&mut mrx).await;
        if t == "x/from-native" {
            // A native message has no QoS of its own: it goes at the subscription's.
            assert_eq!((&pl[..], q), (&b"hello mqtt"[..], QoS::AtLeastOnce));
            break;
        }
    }
}

#[tokio::test]
async fn shared_subscription_gives_each_message_to_one_member() {
    let b = start_default().await;
    let (a, mut arx, _) = client(&b.mqtt, "share-a", true).await;
    sub(&a, &mut arx, "$share/g/work/#", QoS::AtLeastOnce).await;
    let (c, mut crx, _) = client(&b.mqtt, "share-c", true).await;
    sub(&c, &mut crx, "$share/g/work/#", QoS::AtLeastOnce).await;
    let (p, _prx, _) = client(&b.mqtt, "share-p", true).await;
    for i in 0..100u32 {
        p.publish(
            "work/job",
            QoS::AtLeastOnce,
            false,
            i.to_be_bytes().to_vec(),
        )
        .await
        .unwrap();
    }
    let mut seen = std::collections::HashSet::new();
    let (mut na, mut nc) = (0, 0);
    within(20, async {
        while seen.len() < 100 {
            tokio::select! {
                Some((_, pl, _)) = arx.recv() => { na += 1; assert!(seen.insert(pl)); }
                Some((_, pl, _)) = crx.recv() => { nc += 1; assert!(seen.insert(pl)); }
            }
        }
    })
    .await;
    assert_eq!(na + nc, 100);
    assert!(na > 0 && nc > 0, "both members get work: {na} / {nc}");
}

/// Raw MQTT over TCP with our codec.
struct Raw {
    s: TcpStream,
    buf: BytesMut,
    v: ProtocolVersion,
}

impl Raw {
    async fn connect(addr: &str, c: Connect) -> Raw {
        let v = c.protocol_version;
        let mut r = Raw {
            s: TcpStream::connect(addr).await.unwrap(),
            buf: BytesMut::new(),
            v,
        };
        r.send(&Packet::Connect(Box::new(c))).await;
        match r.next().await {
            Some(Packet::ConnAck(a)) => assert_eq!(a.reason_code, ReasonCode::Success),
            other => panic!("expected CONNACK, got {other:?}"),
        }
        r
    }

    async fn send(&mut self, p: &Packet) {
        let mut b = BytesMut::new();
        encode(p, self.v, &mut b).unwrap();
        self.s.write_all(&b).await.unwrap();
    }

    /// The next packet, or `None` at end of stream.
    async fn next(&mut self) -> Option<Packet> {
        within(10, async {
            loop {
                if let Some(p) = decode(&mut self.buf, self.v, u32::MAX).unwrap() {
                    return Some(p);
                }
                if self.s.read_buf(&mut self.buf).await.unwrap_or(0) == 0 {
                    return None;
                }
            }
        })
        .await
    }
}

#[tokio::test]
async fn malformed_input_closes_only_that_connection() {
    let b = start_default().await;
    let mut bad = Raw::connect(&b.mqtt, Connect::new(ProtocolVersion::V5, "bad")).await;
    // Packet type 0 is reserved.
    bad.s.write_all(&[0x00, 0x00]).await.unwrap();
    match bad.next().await {
        Some(Packet::Disconnect(d)) => assert_eq!(d.reason_code, ReasonCode::MalformedPacket),
        other => panic!("expected DISCONNECT, got {other:?}"),
    }
    assert!(bad.next().await.is_none(), "the connection is closed");

    // A second CONNECT is a protocol error.
    let mut twice = Raw::connect(&b.mqtt, Connect::new(ProtocolVersion::V5, "twice")).await;
    twice
        .send(&Packet::Connect(Box::new(Connect::new(
            ProtocolVersion::V5,
            "twice",
        ))))
        .await;
    match twice.next().await {
        Some(Packet::Disconnect(d)) => assert_eq!(d.reason_code, ReasonCode::ProtocolError),
        other => panic!("expected DISCONNECT, got {other:?}"),
    }

    // Others carry on.
    let (s, mut srx, _) = client(&b.mqtt, "good", true).await;
    sub(&s, &mut srx, "ok", QoS::AtMostOnce).await;
    s.publish("ok", QoS::AtMostOnce, false, "fine")
        .await
        .unwrap();
    assert_eq!(&recv(&mut srx).await.1[..], b"fine");
}

#[tokio::test]
async fn will_is_published_when_the_connection_drops() {
    let b = start_default().await;
    let (s, mut srx, _) = client(&b.mqtt, "watcher", true).await;
    sub(&s, &mut srx, "status/#", QoS::AtLeastOnce).await;
    let mut c = Connect::new(ProtocolVersion::V3_1_1, "dying");
    c.will = Some(Will::new("status/dying", "gone"));
    let raw = Raw::connect(&b.mqtt, c).await;
    drop(raw);
    let (t, pl, _) = recv(&mut srx).await;
    assert_eq!((t.as_str(), &pl[..]), ("status/dying", &b"gone"[..]));

    // A clean DISCONNECT discards the will.
    let mut c = Connect::new(ProtocolVersion::V3_1_1, "polite");
    c.will = Some(Will::new("status/polite", "gone"));
    let mut raw = Raw::connect(&b.mqtt, c).await;
    raw.send(&Packet::Disconnect(hayate_mqtt::Disconnect::new(
        ReasonCode::Success,
    )))
    .await;
    assert!(raw.next().await.is_none());
    s.publish("status/marker", QoS::AtLeastOnce, false, "m")
        .await
        .unwrap();
    let (t, _, _) = recv(&mut srx).await;
    assert_eq!(t, "status/marker", "no will after a clean DISCONNECT");
}

/// A persistent session `keeper` on `keep/#` holding five messages, and `keep/retained`
/// retained, saved in `config`'s data directory.
async fn persist_keeper(config: &hayate_server::Config) {
    let b = start(config.clone()).await;
    let (s, mut srx, present) = client(&b.mqtt, "keeper", false).await;
    assert!(!present);
    sub(&s, &mut srx, "keep/#", QoS::AtLeastOnce).await;
    s.disconnect().await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let (p, _prx, _) = client(&b.mqtt, "sender", true).await;
    for i in 0..5u8 {
        p.publish("keep/x", QoS::AtLeastOnce, false, vec![i])
            .await
            .unwrap();
    }
    p.publish("keep/retained", QoS::AtLeastOnce, true, "r")
        .await
        .unwrap();
    p.disconnect().await.unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    b.shutdown().await;
}

/// What [`persist_keeper`] saved is there after a start with `config`.
async fn keeper_is_back(config: &hayate_server::Config) {
    let b = start(config.clone()).await;
    let (_s, mut srx, present) = client(&b.mqtt, "keeper", false).await;
    assert!(present, "the session survived the restart");
    let mut got = Vec::new();
    while got.len() < 6 {
        let (t, pl, _) = recv(&mut srx).await;
        got.push((t, pl));
    }
    for i in 0..5u8 {
        assert!(
            got.contains(&("keep/x".to_string(), Bytes::from(vec![i]))),
            "{got:?}"
        );
    }
    assert!(got.contains(&("keep/retained".to_string(), Bytes::from_static(b"r"))));
    let (n, mut nrx, _) = client(&b.mqtt, "newcomer", true).await;
    n.subscribe("keep/retained", QoS::AtMostOnce).await.unwrap();
    let (t, pl, _) = recv(&mut nrx).await;
    assert_eq!((t.as_str(), &pl[..]), ("keep/retained", &b"r"[..]));
    b.shutdown().await;
}

fn restart_dir(name: &str) -> (std::path::PathBuf, hayate_server::Config) {
    let dir = std::env::temp_dir().join(format!("hayate-mqtt-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let mut config = hayate_server::Config::default();
    config.server.data_dir = dir.display().to_string();
    (dir, config)
}

#[tokio::test]
async fn persistent_session_and_retained_survive_a_restart() {
    let (dir, config) = restart_dir("restart");
    persist_keeper(&config).await;
    keeper_is_back(&config).await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// A server on the same data directory that never recovers (built from listeners, no
/// `Server::recover`) and is stopped writes nothing over MQTT's saved state, not even what
/// its own clients did (a retained message replaced, a session taken over cleanly): the next
/// server that recovers finds the session and the retained message as they were.
#[tokio::test]
async fn a_server_that_never_recovered_leaves_mqtt_state_alone() {
    let (dir, config) = restart_dir("unrecovered");
    persist_keeper(&config).await;

    let b = common::start_recovering(config.clone(), false).await;
    let (p, _prx, _) = client(&b.mqtt, "sender", true).await;
    p.publish("keep/retained", QoS::AtLeastOnce, true, "lost")
        .await
        .unwrap();
    p.disconnect().await.unwrap();
    let (k, _krx, present) = client(&b.mqtt, "visitor", false).await;
    assert!(!present);
    k.disconnect().await.unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    b.shutdown().await;

    keeper_is_back(&config).await;
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn delayed_will_on_takeover_is_published_only_if_the_new_connection_starts_clean() {
    let b = start_default().await;
    let (s, mut srx, _) = client(&b.mqtt, "will-watcher", true).await;
    sub(&s, &mut srx, "wills/#", QoS::AtLeastOnce).await;
    let connect = |clean: bool, topic: &str| {
        let mut c = Connect::new(ProtocolVersion::V5, "taken");
        c.clean_start = clean;
        c.properties.session_expiry_interval = Some(300);
        let mut w = Will::new(topic, "gone");
        w.properties.will_delay_interval = Some(60);
        c.will = Some(w);
        c
    };
    // Resumed by the new connection: the delayed will is cancelled.
    let mut first = Raw::connect(&b.mqtt, connect(true, "wills/resumed")).await;
    let _second = Raw::connect(&b.mqtt, connect(false, "wills/clean")).await;
    match first.next().await {
        Some(Packet::Disconnect(d)) => assert_eq!(d.reason_code, ReasonCode::SessionTakenOver),
        other => panic!("expected DISCONNECT 0x8E, got {other:?}"),
    }
    // Taken over by a clean start: the old session ends, its will is due now.
    let _third = Raw::connect(&b.mqtt, connect(true, "wills/never")).await;
    let (t, pl, _) = recv(&mut srx).await;
    assert_eq!((t.as_str(), &pl[..]), ("wills/clean", &b"gone"[..]));
    s.publish("wills/marker", QoS::AtLeastOnce, false, "m")
        .await
        .unwrap();
    let (t, _, _) = recv(&mut srx).await;
    assert_eq!(t, "wills/marker", "no other will was published");
}

/// Deliveries in flight (a QoS 1 PUBLISH not acknowledged, a QoS 2 one released but not
/// completed) are saved with their packet ids and stages, and a restarted broker takes them
/// back in flight: the client gets the PUBLISH again with DUP and the same packet id, and the
/// PUBREL again; once it acknowledges both, nothing is sent again and new deliveries flow.
#[tokio::test]
async fn deliveries_in_flight_survive_a_restart_with_their_packet_ids() {
    use hayate_mqtt::{Ack, QoS as MqttQoS, Subscribe, Subscription};
    let dir = std::env::temp_dir().join(format!("hayate-mqtt-inflight-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let mut config = hayate_server::Config::default();
    config.server.data_dir = dir.display().to_string();
    let connect = || {
        let mut c = Connect::new(ProtocolVersion::V5, "in-flight");
        c.clean_start = false;
        c.properties.session_expiry_interval = Some(300);
        c
    };

    let b = start(config.clone()).await;
    let mut r = Raw::connect(&b.mqtt, connect()).await;
    r.send(&Packet::Subscribe(Subscribe::new(
        1,
        vec![
            Subscription::new("if1/#", MqttQoS::AtLeastOnce),
            Subscription::new("if2/#", MqttQoS::ExactlyOnce),
        ],
    )))
    .await;
    assert!(matches!(r.next().await, Some(Packet::SubAck(_))));
    let (p, _prx, _) = client(&b.mqtt, "in-flight-sender", true).await;
    p.publish("if1/a", QoS::AtLeastOnce, false, "one")
        .await
        .unwrap();
    let Some(Packet::Publish(one)) = r.next().await else {
        panic!("expected the QoS 1 PUBLISH")
    };
    p.publish("if2/b", QoS::ExactlyOnce, false, "two")
        .await
        .unwrap();
    let Some(Packet::Publish(two)) = r.next().await else {
        panic!("expected the QoS 2 PUBLISH")
    };
    let (pid1, pid2) = (one.packet_id.unwrap(), two.packet_id.unwrap());
    r.send(&Packet::PubRec(Ack::new(pid2))).await;
    assert_eq!(r.next().await, Some(Packet::PubRel(Ack::new(pid2))));
    // No PUBACK for the first, no PUBCOMP for the second: the connection just goes away.
    drop(r);
    tokio::time::sleep(Duration::from_millis(200)).await;
    b.shutdown().await;

    let b = start(config).await;
    let v = ProtocolVersion::V5;
    let mut r = Raw {
        s: TcpStream::connect(&b.mqtt).await.unwrap(),
        buf: BytesMut::new(),
        v,
    };
    r.send(&Packet::Connect(Box::new(connect()))).await;
    match r.next().await {
        Some(Packet::ConnAck(a)) => assert!(a.session_present, "the session survived"),
        other => panic!("expected CONNACK, got {other:?}"),
    }
    let Some(Packet::Publish(again)) = r.next().await else {
        panic!("expected the QoS 1 PUBLISH again")
    };
    assert_eq!(
        (again.packet_id, again.dup, &again.payload[..]),
        (Some(pid1), true, &b"one"[..])
    );
    assert_eq!(r.next().await, Some(Packet::PubRel(Ack::new(pid2))));
    r.send(&Packet::PubAck(Ack::new(pid1))).await;
    r.send(&Packet::PubComp(Ack::new(pid2))).await;
    let (p, _prx, _) = client(&b.mqtt, "in-flight-sender", true).await;
    p.publish("if1/c", QoS::AtLeastOnce, false, "three")
        .await
        .unwrap();
    let Some(Packet::Publish(three)) = r.next().await else {
        panic!("expected the new PUBLISH")
    };
    assert_eq!((three.dup, &three.payload[..]), (false, &b"three"[..]));
    b.shutdown().await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// A client that comes back with a smaller Receive Maximum than it had deliveries in flight
/// (4 unacknowledged, now 2): the oldest two are sent again (DUP, same packet ids), the
/// newest two go back to their places among the held messages, ahead of those that never
/// went out; each message arrives once more at most, all in their order.
#[tokio::test]
async fn a_smaller_receive_maximum_on_reconnect_requeues_the_newest_in_place() {
    use hayate_mqtt::{Ack, QoS as MqttQoS, Subscribe, Subscription};
    let b = start_default().await;
    let connect = |max: u16| {
        let mut c = Connect::new(ProtocolVersion::V5, "shrink");
        c.clean_start = false;
        c.properties.session_expiry_interval = Some(300);
        c.properties.receive_maximum = Some(max);
        c
    };
    let mut r = Raw::connect(&b.mqtt, connect(4)).await;
    r.send(&Packet::Subscribe(Subscribe::new(
        1,
        vec![Subscription::new("rm/#", MqttQoS::AtLeastOnce)],
    )))
    .await;
    assert!(matches!(r.next().await, Some(Packet::SubAck(_))));
    let (p, _prx, _) = client(&b.mqtt, "shrink-sender", true).await;
    for i in 0..6 {
        p.publish("rm/x", QoS::AtLeastOnce, false, format!("m{i}"))
            .await
            .unwrap();
    }
    let mut pids = Vec::new();
    for i in 0..4 {
        let Some(Packet::Publish(m)) = r.next().await else {
            panic!("expected PUBLISH {i}")
        };
        assert_eq!(&m.payload[..], format!("m{i}").as_bytes());
        pids.push(m.packet_id.unwrap());
    }
    // The last two reach the session (held behind the window) before it goes offline.
    tokio::time::sleep(Duration::from_millis(200)).await;
    drop(r);
    tokio::time::sleep(Duration::from_millis(200)).await;

    let mut r = Raw::connect(&b.mqtt, connect(2)).await;
    let mut got = Vec::new();
    for _ in 0..2 {
        let Some(Packet::Publish(m)) = r.next().await else {
            panic!("expected a PUBLISH sent again")
        };
        got.push((m.payload.clone(), m.dup, m.packet_id.unwrap()));
    }
    assert_eq!(
        got,
        vec![
            (Bytes::from_static(b"m0"), true, pids[0]),
            (Bytes::from_static(b"m1"), true, pids[1]),
        ]
    );
    let mut order = Vec::new();
    let mut unacked: Vec<u16> = vec![pids[0], pids[1]];
    while order.len() < 4 {
        r.send(&Packet::PubAck(Ack::new(unacked.remove(0)))).await;
        let Some(Packet::Publish(m)) = r.next().await else {
            panic!("expected the next PUBLISH")
        };
        assert!(!m.dup, "a requeued delivery goes out as a new PUBLISH");
        unacked.push(m.packet_id.unwrap());
        order.push(m.payload.clone());
    }
    assert_eq!(
        order,
        [&b"m2"[..], b"m3", b"m4", b"m5"].map(Bytes::from_static)
    );
    b.shutdown().await;
}

/// A message larger than the native protocol's `max_payload`, published over MQTT (whose
/// limit is its own), is not sent to a native subscriber: its client would refuse the frame
/// and lose its connection with every subscription. The subscription is told by a LOST, and
/// the connection carries on (before: the client closed on the oversized frame).
#[tokio::test]
async fn an_mqtt_message_over_max_payload_is_lost_for_native_subscribers_not_their_connection() {
    let mut config = hayate_server::Config::default();
    config.limits.max_payload = 4096;
    let b = start(config).await;
    let native = Client::connect(&b.addr).await.unwrap();
    let mut ns = native.subscribe("big/**").await.unwrap();
    native.flush().await.unwrap();

    let (host, port) = b.mqtt.rsplit_once(':').unwrap();
    let mut o = MqttOptions::new("big", host, port.parse().unwrap());
    o.set_keep_alive(Duration::from_secs(10))
        .set_max_packet_size(1 << 20, 1 << 20);
    let (m, mut el) = AsyncClient::new(o, 100);
    tokio::spawn(async move { while el.poll().await.is_ok() {} });
    // Past the client's frame limit (max_payload + 128 KiB), then a small one.
    m.publish("big/x", QoS::AtLeastOnce, false, vec![7u8; 300 * 1024])
        .await
        .unwrap();
    m.publish("big/y", QoS::AtLeastOnce, false, "small")
        .await
        .unwrap();
    let got = within(10, ns.next()).await.unwrap();
    assert_eq!(
        (got.key.as_str(), &got.payload[..]),
        ("big/y", &b"small"[..])
    );
    assert_eq!(ns.lost(), 1);
    // The connection is still there: a native publish comes back.
    native
        .publish(&Key::new("big/z").unwrap(), "still here")
        .await
        .unwrap();
    let got = within(10, ns.next()).await.unwrap();
    assert_eq!(got.key.as_str(), "big/z");
    drop(m);
    b.shutdown().await;
}
