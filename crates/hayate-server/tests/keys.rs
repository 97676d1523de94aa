//! Keys cross protocols intact: random keys (any printable Unicode, STOMP's `:` and `\`,
//! MQTT's `+` and `#`, spaces, `%`, `*` inside segments) published from the native protocol
//! reach a STOMP and an MQTT subscriber, and from STOMP reach native and MQTT ones, each
//! under the name its protocol gives the key. A key no protocol can carry (a control
//! character) is refused at the edge (tests/security.rs).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use bytes::BytesMut;
use common::{start_default, within};
use hayate_client::{Client, Key};
use hayate_server::mqtt::translate::key_to_topic;
use hayate_stomp::{Command, Frame, Item, Limits, Version, decode, encode};
use proptest::prelude::*;
use proptest::test_runner::{Config as PtConfig, TestRunner};
use rumqttc::{AsyncClient, Event, MqttOptions, QoS};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc;

/// A segment: printable characters (no `/`, no control characters), not `*` or `**`.
fn segment() -> impl Strategy<Value = String> {
    proptest::string::string_regex("[a-z0-9 :\\\\+#%*.é日\\-]{1,6}")
        .unwrap()
        .prop_filter("not a wildcard segment", |s| s != "*" && s != "**")
}

fn key() -> impl Strategy<Value = String> {
    proptest::collection::vec(segment(), 1..4).prop_map(|v| format!("x/{}", v.join("/")))
}

struct Stomp {
    s: tokio::net::TcpStream,
    buf: BytesMut,
}

impl Stomp {
    async fn send(&mut self, f: Frame) {
        let mut b = BytesMut::new();
        encode(&f, Version::V1_2, &mut b);
        self.s.write_all(&b).await.unwrap();
    }
    async fn next(&mut self) -> Frame {
        within(10, async {
            loop {
                if let Some(Item::Frame(f)) =
                    decode(&mut self.buf, Version::V1_2, &Limits::default()).unwrap()
                {
                    return f;
                }
                assert!(self.s.read_buf(&mut self.buf).await.unwrap() > 0, "closed");
            }
        })
        .await
    }
}

#[test]
fn random_keys_cross_every_protocol_intact() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let (b, native, stomp, mqtt, mqtt_rx, native_sub) = rt.block_on(async {
        let b = start_default().await;
        let native = Client::connect(&b.addr).await.unwrap();
        let native_sub = native.subscribe("x/**").await.unwrap();
        native.flush().await.unwrap();
        let mut stomp = Stomp {
            s: tokio::net::TcpStream::connect(&b.stomp).await.unwrap(),
            buf: BytesMut::new(),
        };
        stomp
            .send(
                Frame::new(Command::Connect)
                    .header("accept-version", "1.2")
                    .header("host", "t"),
            )
            .await;
        assert_eq!(stomp.next().await.command, Command::Connected);
        stomp
            .send(
                Frame::new(Command::Subscribe)
                    .header("id", "1")
                    .header("destination", "/topic/x/**")
                    .header("receipt", "r"),
            )
            .await;
        assert_eq!(stomp.next().await.command, Command::Receipt);
        let (host, port) = b.mqtt.rsplit_once(':').unwrap();
        let mut o = MqttOptions::new("keys", host, port.parse().unwrap());
        o.set_keep_alive(Duration::from_secs(30));
        let (mqtt, mut el) = AsyncClient::new(o, 100);
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            loop {
                match el.poll().await {
                    Ok(Event::Incoming(rumqttc::Packet::Publish(p))) => {
                        let _ = tx.send(p.topic.clone());
                    }
                    Ok(_) => {}
                    Err(e) => {
                        let _ = tx.send(format!("ERROR {e}"));
                        return;
                    }
                }
            }
        });
        mqtt.subscribe("x/#", QoS::AtMostOnce).await.unwrap();
        tokio::time::sleep(Duration::from_millis(300)).await;
        (b, native, stomp, mqtt, rx, native_sub)
    });
    // The runner's closure is `Fn`: the receivers are borrowed through cells.
    let (stomp, mqtt_rx, native_sub) = (
        std::cell::RefCell::new(stomp),
        std::cell::RefCell::new(mqtt_rx),
        std::cell::RefCell::new(native_sub),
    );
    let mut runner = TestRunner::new(PtConfig {
        cases: 48,
        ..PtConfig::default()
    });
    runner
        .run(&(key(), any::<bool>()), |(k, from_native)| {
            let (mut stomp, mut mqtt_rx, mut native_sub) = (
                stomp.borrow_mut(),
                mqtt_rx.borrow_mut(),
                native_sub.borrow_mut(),
            );
            rt.block_on(async {
                if from_native {
                    native.publish(&Key::new(&k).unwrap(), "p").await.unwrap();
                    native.flush().await.unwrap();
                } else {
                    stomp
                        .send(
                            Frame::new(Command::Send)
                                .header("destination", &format!("/topic/{k}"))
                                .body("p".to_string()),
                        )
                        .await;
                }
                // Native receives the key itself.
                let m = within(10, native_sub.next()).await.unwrap();
                assert_eq!(m.key.as_str(), k);
                // STOMP receives `/topic/<key>` (its header escaping undone).
                let f = stomp.next().await;
                assert_eq!(f.command, Command::Message, "{f:?}");
                assert_eq!(f.get("destination"), Some(format!("/topic/{k}").as_str()));
                // MQTT receives the key's topic name: valid (no wildcard character), and
                // the documented mapping.
                let t = within(10, mqtt_rx.recv()).await.unwrap();
                assert!(!t.starts_with("ERROR"), "{t}");
                assert!(!t.contains(['+', '#']), "{t}");
                assert_eq!(t, key_to_topic(&k));
            });
            Ok(())
        })
        .unwrap();
    drop((mqtt, b));
}
