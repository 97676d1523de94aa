//! Control characters never become keys (issue 44, items 1 and 2): MQTT allows every
//! character but U+0000 in a topic, a key holds none of U+0000–U+001F and U+007F. A topic
//! with one, whatever the path (a PUBLISH, a retained one, a topic alias, a will, a Response
//! Topic), is refused with a protocol error and the connection closed, as are a STOMP
//! destination and an AMQP routing key with one; other clients carry on. Such a key once
//! reached the MQTT checkpoint, which could then not be read back (every persistent session
//! lost), and subscribers of every protocol (the Rust client refuses it, so `hayate sub`
//! exited). Raw bytes throughout: client libraries may refuse to send these.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use bytes::{BufMut, BytesMut};
use common::{start, start_default, within};
use hayate_server::Config;
use rumqttc::{AsyncClient, Event, EventLoop, MqttOptions, Packet, QoS};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

// ----- raw MQTT -----

fn varint(mut n: usize, out: &mut Vec<u8>) {
    loop {
        let mut b = (n % 128) as u8;
        n /= 128;
        if n > 0 {
            b |= 0x80;
        }
        out.push(b);
        if n == 0 {
            return;
        }
    }
}

fn string(s: &[u8], out: &mut Vec<u8>) {
    out.put_u16(s.len() as u16);
    out.extend_from_slice(s);
}

fn packet(first: u8, body: &[u8]) -> Vec<u8> {
    let mut p = vec![first];
    varint(body.len(), &mut p);
    p.extend_from_slice(body);
    p
}

/// A CONNECT (clean start) at protocol level `level` (4: 3.1.1, 5: 5.0), with a will on
/// `will` if given.
fn connect(level: u8, id: &str, will: Option<&[u8]>) -> Vec<u8> {
    let mut b = Vec::new();
    string(b"MQTT", &mut b);
    b.push(level);
    b.push(0x02 | if will.is_some() { 0x04 } else { 0 });
    b.put_u16(60);
    if level == 5 {
        b.push(0); // no properties
    }
    string(id.as_bytes(), &mut b);
    if let Some(t) = will {
        if level == 5 {
            b.push(0); // no will properties
        }
        string(t, &mut b);
        string(b"will", &mut b);
    }
    packet(0x10, &b)
}

/// A QoS 0 PUBLISH on `topic`; `props` are 5.0 properties (already encoded), if any.
fn publish(level: u8, retain: bool, topic: &[u8], props: &[u8], payload: &[u8]) -> Vec<u8> {
    let mut b = Vec::new();
    string(topic, &mut b);
    if level == 5 {
        varint(props.len(), &mut b);
        b.extend_from_slice(props);
    }
    b.extend_from_slice(payload);
    packet(0x30 | u8::from(retain), &b)
}

/// A raw MQTT connection, CONNACK read (and checked to be a success).
async fn mqtt_raw(addr: &str, level: u8, id: &str) -> TcpStream {
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(&connect(level, id, None)).await.unwrap();
    let mut ack = [0u8; 4];
    s.read_exact(&mut ack[..2]).await.unwrap();
    assert_eq!(ack[0], 0x20, "CONNACK");
    let n = usize::from(ack[1]);
    let mut rest = vec![0u8; n];
    s.read_exact(&mut rest).await.unwrap();
    let code = rest[1];
    assert_eq!(code, 0, "CONNACK code");
    s
}

/// Everything the broker sends until it closes the connection (the test fails if it does
/// not within 10 s: the offender was not refused).
async fn until_closed(s: &mut TcpStream, what: &str) -> Vec<u8> {
    let mut got = Vec::new();
    within(10, async {
        let mut buf = [0u8; 256];
        loop {
            match s.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => got.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await;
    let _ = what;
    got
}

/// Sends `bytes` on a fresh connection at `level` and checks that the broker refuses them:
/// a 5.0 client gets DISCONNECT with 0x90 (Topic Name invalid), a 3.1.1 one is closed.
async fn refused(addr: &str, level: u8, bytes: &[u8], what: &str) {
    let mut s = mqtt_raw(addr, level, "offender").await;
    s.write_all(bytes).await.unwrap();
    let got = until_closed(&mut s, what).await;
    if level == 5 {
        assert_eq!(
            got.first(),
            Some(&0xE0),
            "{what}: DISCONNECT expected, got {got:x?}"
        );
        assert_eq!(
            got.get(2),
            Some(&0x90),
            "{what}: reason 0x90 expected, got {got:x?}"
        );
    } else {
        assert!(
            got.is_empty(),
            "{what}: closed without a packet, got {got:x?}"
        );
    }
}

// ----- rumqttc, for the well-behaved clients -----

async fn mqtt_client(addr: &str, id: &str, clean: bool) -> (AsyncClient, EventLoop, bool) {
    let (host, port) = addr.rsplit_once(':').unwrap();
    let mut o = MqttOptions::new(id, host, port.parse().unwrap());
    o.set_clean_session(clean)
        .set_keep_alive(Duration::from_secs(30));
    let (c, mut el) = AsyncClient::new(o, 100);
    let present = within(10, async {
        loop {
            if let Event::Incoming(Packet::ConnAck(a)) = el.poll().await.unwrap() {
                return a.session_present;
            }
        }
    })
    .await;
    (c, el, present)
}

/// Polls `el` until `pred` holds for an incoming packet.
async fn until(el: &mut EventLoop, mut pred: impl FnMut(&Packet) -> bool) {
    within(10, async {
        loop {
            if let Event::Incoming(p) = el.poll().await.unwrap()
                && pred(&p)
            {
                return;
            }
        }
    })
    .await;
}

/// The topics of the next `n` PUBLISHes `el` receives.
async fn received(el: &mut EventLoop, n: usize) -> Vec<String> {
    let mut got = Vec::new();
    until(el, |p| {
        if let Packet::Publish(p) = p {
            got.push(p.topic.clone());
        }
        got.len() == n
    })
    .await;
    got
}

async fn disconnect(c: AsyncClient, mut el: EventLoop) {
    c.disconnect().await.unwrap();
    within(10, async { while el.poll().await.is_ok() {} }).await;
}

fn data_dir(name: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("hayate-ctl-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

/// The attack: an anonymous QoS 0 retained PUBLISH on `x\u{1}` (3.1.1 and 5.0) is
/// refused and its connection closed, while a persistent session and a publisher carry on;
/// after a restart the session is there with every message it held.
#[tokio::test]
async fn a_retained_publish_with_a_control_character_is_refused_and_sessions_survive() {
    let d = data_dir("retained");
    let mut cfg = Config::default();
    cfg.server.data_dir = d.to_string_lossy().into_owned();
    let b = start(cfg.clone()).await;
    let (keeper, mut kel, _) = mqtt_client(&b.mqtt, "keeper", false).await;
    keeper.subscribe("t/#", QoS::AtLeastOnce).await.unwrap();
    until(&mut kel, |p| matches!(p, Packet::SubAck(_))).await;
    disconnect(keeper, kel).await;
    let (publisher, mut pel, _) = mqtt_client(&b.mqtt, "publisher", true).await;

    for level in [4, 5] {
        refused(
            &b.mqtt,
            level,
            &publish(level, true, b"x\x01", &[], b"boom"),
            "retained x\\u0001",
        )
        .await;
    }

    // The other clients carry on: three messages for the offline session.
    for i in 1..=3 {
        publisher
            .publish(format!("t/{i}"), QoS::AtLeastOnce, false, "kept")
            .await
            .unwrap();
        until(&mut pel, |p| matches!(p, Packet::PubAck(_))).await;
    }
    disconnect(publisher, pel).await;
    b.shutdown().await;

    let b = start(cfg).await;
    let (keeper, mut kel, present) = mqtt_client(&b.mqtt, "keeper", false).await;
    assert!(present, "the persistent session was lost");
    let mut got = received(&mut kel, 3).await;
    got.sort();
    assert_eq!(got, ["t/1", "t/2", "t/3"]);
    disconnect(keeper, kel).await;
    b.shutdown().await;
    let _ = std::fs::remove_dir_all(&d);
}

/// A checkpoint (in the MQTT log) holding one entry with a key no key may be (written by a
/// broker that let it in, or edited) is read with that entry left out: the persistent
/// session, its queued messages and the other retained messages come back. Without the journal, so that the
/// checkpoint alone is the state (with it, a journal still holding every record since the
/// first start would hide the loss; in a longer run its early segments are gone).
#[tokio::test]
async fn a_checkpoint_with_a_bad_key_keeps_the_rest() {
    let d = data_dir("checkpoint");
    let mut cfg = Config::default();
    cfg.server.data_dir = d.to_string_lossy().into_owned();
    cfg.mqtt.journal = false;
    let b = start(cfg.clone()).await;
    let (keeper, mut kel, _) = mqtt_client(&b.mqtt, "keeper", false).await;
    keeper.subscribe("t/#", QoS::AtLeastOnce).await.unwrap();
    until(&mut kel, |p| matches!(p, Packet::SubAck(_))).await;
    disconnect(keeper, kel).await;
    let (publisher, mut pel, _) = mqtt_client(&b.mqtt, "publisher", true).await;
    publisher
        .publish("r/good", QoS::AtLeastOnce, true, "retained")
        .await
        .unwrap();
    until(&mut pel, |p| matches!(p, Packet::PubAck(_))).await;
    for i in 1..=3 {
        publisher
            .publish(format!("t/{i}"), QoS::AtLeastOnce, false, "kept")
            .await
            .unwrap();
        until(&mut pel, |p| matches!(p, Packet::PubAck(_))).await;
    }
    disconnect(publisher, pel).await;
    b.shutdown().await;

    // A copy of the last checkpoint appended to the MQTT log with a retained message on
    // `x\u{1}` in it, as docs/log-format.md says: `C` (number + 1, the same P and next
    // generation), its records, `R` key, payload, no reply-to, no correlation, no headers,
    // QoS 0, retained, not UTF-8, no expiry; then `K` (number + 1).
    forge_checkpoint(&d.join("mqtt"), |r| {
        r.put_u8(b'R');
        for v in [&b"x\x01"[..], b"boom"] {
            r.put_u32(v.len() as u32);
            r.put_slice(v);
        }
        r.put_slice(&[0, 0, 0, 0, 0, 0, 0, 1, 0]);
        r.put_u64(u64::MAX);
    });

    let b = start(cfg).await;
    let (keeper, mut kel, present) = mqtt_client(&b.mqtt, "keeper", false).await;
    assert!(present, "the persistent session was lost");
    let mut got = received(&mut kel, 3).await;
    got.sort();
    assert_eq!(got, ["t/1", "t/2", "t/3"]);
    keeper.subscribe("r/#", QoS::AtLeastOnce).await.unwrap();
    assert_eq!(received(&mut kel, 1).await, ["r/good"]);
    disconnect(keeper, kel).await;
    b.shutdown().await;
    let _ = std::fs::remove_dir_all(&d);
}

/// Appends to the MQTT log in `dir` a copy of its last complete checkpoint with one more
/// record (`extra` writes it) before its `K`.
fn forge_checkpoint(dir: &std::path::Path, extra: impl FnOnce(&mut BytesMut)) {
    let log = hayate_log::Log::open_dir(dir, hayate_log::LogConfig::default()).unwrap();
    let b = log
        .read(
            log.start_offset(),
            hayate_log::ReadLimit {
                max_bytes: 64 << 20,
                max_records: 1 << 20,
                confirmed_only: false,
            },
        )
        .unwrap();
    let values: Vec<&[u8]> = b.records.iter().map(|r| &r.value[..]).collect();
    let k = values
        .iter()
        .rposition(|v| v[0] == b'K')
        .expect("a checkpoint");
    let c = values[..k].iter().rposition(|v| v[0] == b'C').unwrap();
    let number = u64::from_be_bytes(values[c][1..9].try_into().unwrap()) + 1;
    let mut recs: Vec<Vec<u8>> = Vec::new();
    let mut head = values[c].to_vec();
    head[1..9].copy_from_slice(&number.to_be_bytes());
    recs.push(head);
    for v in &values[c + 1..k] {
        let mut v = v.to_vec();
        if v[0] == b'Z' {
            v[1..9].copy_from_slice(&number.to_be_bytes());
        }
        recs.push(v);
    }
    let mut r = BytesMut::new();
    extra(&mut r);
    recs.push(r.to_vec());
    let mut end = vec![b'K'];
    end.extend_from_slice(&number.to_be_bytes());
    recs.push(end);
    let entries: Vec<hayate_log::Entry<'_>> = recs
        .iter()
        .map(|v| hayate_log::Entry {
            timestamp: 0,
            key: b"",
            headers: &[],
            value: v,
        })
        .collect();
    log.append_batch(&entries).unwrap();
    log.close().unwrap();
}

/// MQTT topics with LF, CR, U+0001 and U+007F, by every path (a PUBLISH at 3.1.1 and 5.0, a
/// topic alias, a Response Topic, a will), never reach a native subscriber of `**`: the
/// first thing it receives is the well-formed message published after them.
#[tokio::test]
async fn control_characters_in_mqtt_topics_do_not_reach_native_subscribers() {
    let b = start_default().await;
    let native = hayate_client::Client::connect(&b.addr).await.unwrap();
    let mut sub = native.subscribe("**").await.unwrap();
    native.flush().await.unwrap();
    for c in [b'\n', b'\r', 0x01, 0x7f] {
        let topic = [b'a', c, b'b'];
        let what = format!("topic a{:?}b", char::from(c));
        for level in [4, 5] {
            refused(
                &b.mqtt,
                level,
                &publish(level, false, &topic, &[], b"x"),
                &what,
            )
            .await;
        }
        // Topic Alias 1 set to it.
        let alias = [0x23, 0, 1];
        refused(&b.mqtt, 5, &publish(5, false, &topic, &alias, b"x"), &what).await;
        // As the Response Topic of a well-formed PUBLISH.
        let mut resp = vec![0x08];
        string(&topic, &mut resp);
        refused(&b.mqtt, 5, &publish(5, false, b"ok", &resp, b"x"), &what).await;
        // As a will topic: the CONNECT is refused (5.0: CONNACK 0x90; 3.1.1: closed).
        for level in [4u8, 5] {
            let mut s = TcpStream::connect(&b.mqtt).await.unwrap();
            s.write_all(&connect(level, "will", Some(&topic)))
                .await
                .unwrap();
            let got = until_closed(&mut s, "will").await;
            if level == 5 {
                assert_eq!(
                    &got[..1],
                    &[0x20],
                    "will {what}: CONNACK expected: {got:x?}"
                );
                assert_eq!(
                    got.get(3),
                    Some(&0x90),
                    "will {what}: 0x90 expected: {got:x?}"
                );
            } else {
                assert!(got.is_empty(), "will {what}: closed expected, got {got:x?}");
            }
        }
    }
    let mut s = mqtt_raw(&b.mqtt, 4, "good").await;
    s.write_all(&publish(4, false, b"done", &[], b"x"))
        .await
        .unwrap();
    let m = within(10, async {
        loop {
            let m = sub.next().await.expect("the native subscription ended");
            if !m.key.as_str().starts_with("$SYS") {
                return m;
            }
        }
    })
    .await;
    assert_eq!(m.key.as_str(), "done");
}

/// A STOMP destination with a control character (escaped in the header, as STOMP 1.2
/// allows) is ERROR `invalid destination` and a close; an AMQP basic.publish whose routing
/// key has one (or is not UTF-8) is taken, as RabbitMQ takes it, but makes no such key: it
/// is routed nowhere through a topic or direct exchange, and through a fanout exchange
/// under the stand-in `%!`; the channel carries on.
#[tokio::test]
async fn stomp_destinations_and_amqp_routing_keys_with_control_characters_make_no_key() {
    use hayate_amqp::{
        BasicProperties, ContentHeader, FieldTable, Frame, FrameDecoder, Method, PROTOCOL_HEADER,
        ShortStr,
    };
    use hayate_stomp::{Command, Item, Limits, Version};

    let cfg = Config::default();
    let a = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let amqp_addr = a.local_addr().unwrap().to_string();
    let n = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let native_addr = n.local_addr().unwrap().to_string();
    let st = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let stomp_addr = st.local_addr().unwrap().to_string();
    let server = hayate_server::Server::from_listeners(
        vec![
            (n, hayate_server::Protocol::Native),
            (st, hayate_server::Protocol::Stomp),
            (a, hayate_server::Protocol::Amqp),
        ],
        &cfg,
    );
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let run = tokio::spawn(server.run(async {
        let _ = stopped.await;
    }));
    let native = hayate_client::Client::connect(&native_addr).await.unwrap();
    let mut sub = native.subscribe("**").await.unwrap();
    native.flush().await.unwrap();

    // STOMP: SEND and SUBSCRIBE, each on its own connection.
    for (cmd, c) in [
        (Command::Send, '\n'),
        (Command::Send, '\r'),
        (Command::Send, '\u{1}'),
        (Command::Send, '\u{7f}'),
        (Command::Subscribe, '\n'),
        (Command::Subscribe, '\u{1}'),
    ] {
        let mut s = TcpStream::connect(&stomp_addr).await.unwrap();
        let mut out = BytesMut::new();
        let f = hayate_stomp::Frame::new(Command::Connect)
            .header("accept-version", "1.2")
            .header("host", "t");
        hayate_stomp::encode(&f, Version::V1_2, &mut out);
        let f = hayate_stomp::Frame::new(cmd)
            .header("destination", &format!("/topic/a{c}b"))
            .header("id", "1")
            .body("x".to_string());
        hayate_stomp::encode(&f, Version::V1_2, &mut out);
        s.write_all(&out).await.unwrap();
        let mut buf = BytesMut::new();
        let err = within(10, async {
            loop {
                while let Some(item) =
                    hayate_stomp::decode(&mut buf, Version::V1_2, &Limits::default()).unwrap()
                {
                    if let Item::Frame(f) = item
                        && f.command == Command::Error
                    {
                        return f;
                    }
                }
                assert!(
                    s.read_buf(&mut buf).await.unwrap() > 0,
                    "closed without ERROR"
                );
            }
        })
        .await;
        assert_eq!(
            err.get("message"),
            Some("invalid destination"),
            "{cmd:?} {c:?}"
        );
    }

    // AMQP: one connection, channel 1 publishes with a bad routing key to each kind of
    // exchange (each refusal closes it; it is opened again), then channel 2 publishes a
    // good one.
    let mut s = TcpStream::connect(&amqp_addr).await.unwrap();
    let dec = FrameDecoder::new(128 << 10);
    let mut buf = BytesMut::new();
    let next = async |s: &mut TcpStream, buf: &mut BytesMut| -> Method {
        within(10, async {
            loop {
                if let Some(Frame::Method(_, m)) = dec.decode(buf).unwrap() {
                    return m;
                }
                assert!(s.read_buf(buf).await.unwrap() > 0, "AMQP connection closed");
            }
        })
        .await
    };
    let send = async |s: &mut TcpStream, ch: u16, m: Method| {
        let mut b = BytesMut::new();
        Frame::Method(ch, m).encode(&mut b);
        s.write_all(&b).await.unwrap();
    };
    s.write_all(&PROTOCOL_HEADER).await.unwrap();
    assert!(matches!(
        next(&mut s, &mut buf).await,
        Method::ConnectionStart { .. }
    ));
    send(
        &mut s,
        0,
        Method::ConnectionStartOk {
            client_properties: FieldTable::default(),
            mechanism: ShortStr::lit("PLAIN"),
            response: bytes::Bytes::from_static(b"\0guest\0guest"),
            locale: ShortStr::lit("en_US"),
        },
    )
    .await;
    assert!(matches!(
        next(&mut s, &mut buf).await,
        Method::ConnectionTune { .. }
    ));
    send(
        &mut s,
        0,
        Method::ConnectionTuneOk {
            channel_max: 8,
            frame_max: 128 << 10,
            heartbeat: 0,
        },
    )
    .await;
    send(
        &mut s,
        0,
        Method::ConnectionOpen {
            virtual_host: ShortStr::lit("/"),
            capabilities: ShortStr::lit(""),
            insist: false,
        },
    )
    .await;
    assert!(matches!(
        next(&mut s, &mut buf).await,
        Method::ConnectionOpenOk { .. }
    ));
    let publish = async |s: &mut TcpStream, ch: u16, x: &str, rk: &[u8]| {
        let mut b = BytesMut::new();
        Frame::Method(
            ch,
            Method::BasicPublish {
                ticket: 0,
                exchange: ShortStr::new(x.as_bytes().to_vec()).unwrap(),
                routing_key: ShortStr::new(rk.to_vec()).unwrap(),
                mandatory: false,
                immediate: false,
            },
        )
        .encode(&mut b);
        Frame::Header(
            ch,
            Box::new(ContentHeader {
                body_size: 1,
                properties: BasicProperties::default(),
            }),
        )
        .encode(&mut b);
        Frame::encode_body(ch, b"x", &mut b);
        s.write_all(&b).await.unwrap();
    };
    send(
        &mut s,
        1,
        Method::ChannelOpen {
            out_of_band: ShortStr::lit(""),
        },
    )
    .await;
    assert!(matches!(
        next(&mut s, &mut buf).await,
        Method::ChannelOpenOk { .. }
    ));
    for (x, rk) in [
        ("amq.topic", &b"a\nb"[..]),
        ("amq.topic", b"a\x01b"),
        ("amq.topic", b"a\xffb"),
        ("amq.direct", b"a\rb"),
        ("", b"q\x7f"),
        ("amq.fanout", b"a\x01b"),
    ] {
        publish(&mut s, 1, x, rk).await;
    }
    publish(&mut s, 1, "amq.topic", b"done").await;

    // What reached the native subscriber before "done": only the fanout's stand-in.
    let mut keys = Vec::new();
    within(10, async {
        loop {
            let m = sub.next().await.expect("the native subscription ended");
            if m.key.as_str().starts_with("$SYS") {
                continue;
            }
            keys.push(m.key.as_str().to_string());
            if m.key.as_str() == "done" {
                return;
            }
        }
    })
    .await;
    assert_eq!(keys, ["amqp/amq.fanout/%!", "done"]);
    let _ = stop.send(());
    let _ = run.await;
}
