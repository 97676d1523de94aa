//! Messages given back together come again in their original order while consumers are
//! attached. AMQP 0-9-1: after basic.recover(requeue), basic.nack(multiple, requeue) and a
//! channel closed with its deliveries unacknowledged, m1..m4 come again as m1, m2, m3, m4
//! (redelivered), as from RabbitMQ; each used to be delivered again as it was given back,
//! the newest first: m4, m3, m2, m1. STOMP: a `client`-mode NACK of m4 on a `/topic/`
//! subscription gives m1..m4 back to it in order (it gave them back m4 first too). Minimal
//! raw clients over `hayate_amqp`'s and `hayate_stomp`'s codecs.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use bytes::{Bytes, BytesMut};
use common::within;
use hayate_amqp::{ContentHeader, FieldTable, Frame, FrameDecoder, Method, ShortStr};
use hayate_server::{Config, Protocol, Server};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// A broker with only an AMQP listener; its address and the sender that stops it.
async fn amqp_broker() -> (String, tokio::sync::oneshot::Sender<()>) {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap().to_string();
    let mut config = Config::default();
    config.server.data_dir.clear();
    let server = Server::from_listeners(vec![(l, Protocol::Amqp)], &config);
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(server.run(async {
        let _ = rx.await;
    }));
    (addr, tx)
}

/// One delivery: its channel, consumer tag, delivery tag, redelivered flag and body.
#[derive(Debug)]
struct Got {
    channel: u16,
    consumer: String,
    tag: u64,
    redelivered: bool,
    body: Bytes,
}

struct Amqp {
    s: TcpStream,
    buf: BytesMut,
    dec: FrameDecoder,
}

impl Amqp {
    /// Connects, logs in (PLAIN guest/guest: the broker has no users) and opens vhost "/".
    async fn connect(addr: &str) -> Amqp {
        let mut a = Amqp {
            s: TcpStream::connect(addr).await.unwrap(),
            buf: BytesMut::new(),
            dec: FrameDecoder::new(131_072),
        };
        a.s.write_all(&hayate_amqp::PROTOCOL_HEADER).await.unwrap();
        a.expect(0, "connection.start").await;
        a.send(
            0,
            Method::ConnectionStartOk {
                client_properties: FieldTable::default(),
                mechanism: ShortStr::lit("PLAIN"),
                response: Bytes::from_static(b"\0guest\0guest"),
                locale: ShortStr::lit("en_US"),
            },
        )
        .await;
        a.expect(0, "connection.tune").await;
        a.send(
            0,
            Method::ConnectionTuneOk {
                channel_max: 16,
                frame_max: 131_072,
                heartbeat: 0,
            },
        )
        .await;
        a.send(
            0,
            Method::ConnectionOpen {
                virtual_host: ShortStr::lit("/"),
                capabilities: ShortStr::lit(""),
                insist: false,
            },
        )
        .await;
        a.expect(0, "connection.open-ok").await;
        a
    }

    async fn send(&mut self, ch: u16, m: Method) {
        let mut out = BytesMut::new();
        Frame::Method(ch, m).encode(&mut out);
        self.s.write_all(&out).await.unwrap();
    }

    async fn frame(&mut self) -> Frame {
        loop {
            if let Some(f) = self.dec.decode(&mut self.buf).unwrap() {
                return f;
            }
            let n = within(10, self.s.read_buf(&mut self.buf)).await.unwrap();
            assert!(n > 0, "the broker closed the connection");
        }
    }

    /// The next method on `ch` must be `name` (deliveries on other channels are not
    /// expected here).
    async fn expect(&mut self, ch: u16, name: &str) -> Method {
        match self.frame().await {
            Frame::Method(c, m) if c == ch && m.name() == name => m,
            other => panic!("expected {name} on channel {ch}, got {other:?}"),
        }
    }

    async fn open_channel(&mut self, ch: u16) {
        self.send(
            ch,
            Method::ChannelOpen {
                out_of_band: ShortStr::lit(""),
            },
        )
        .await;
        self.expect(ch, "channel.open-ok").await;
    }

    async fn declare(&mut self, ch: u16, queue: &str) {
        self.send(
            ch,
            Method::QueueDeclare {
                ticket: 0,
                queue: ShortStr::new(queue.to_owned()).unwrap(),
                passive: false,
                durable: false,
                exclusive: false,
                auto_delete: false,
                no_wait: false,
                arguments: FieldTable::default(),
            },
        )
        .await;
        self.expect(ch, "queue.declare-ok").await;
    }

    async fn publish(&mut self, ch: u16, queue: &str, body: &str) {
        let mut out = BytesMut::new();
        Frame::Method(
            ch,
            Method::BasicPublish {
                ticket: 0,
                exchange: ShortStr::lit(""),
                routing_key: ShortStr::new(queue.to_owned()).unwrap(),
                mandatory: false,
                immediate: false,
            },
        )
        .encode(&mut out);
        Frame::Header(
            ch,
            Box::new(ContentHeader {
                body_size: body.len() as u64,
                properties: Default::default(),
            }),
        )
        .encode(&mut out);
        Frame::encode_body(ch, body.as_bytes(), &mut out);
        self.s.write_all(&out).await.unwrap();
    }

    async fn consume(&mut self, ch: u16, queue: &str, tag: &str) {
        self.send(
            ch,
            Method::BasicConsume {
                ticket: 0,
                queue: ShortStr::new(queue.to_owned()).unwrap(),
                consumer_tag: ShortStr::new(tag.to_owned()).unwrap(),
                no_local: false,
                no_ack: false,
                exclusive: false,
                no_wait: false,
                arguments: FieldTable::default(),
            },
        )
        .await;
        self.expect(ch, "basic.consume-ok").await;
    }

    /// The next `n` deliveries, in the order they arrive; other methods (recover-ok,
    /// close-ok) are skipped.
    async fn deliveries(&mut self, n: usize) -> Vec<Got> {
        let mut got = Vec::new();
        while got.len() < n {
            let (channel, consumer, tag, redelivered) = match self.frame().await {
                Frame::Method(
                    c,
                    Method::BasicDeliver {
                        consumer_tag,
                        delivery_tag,
                        redelivered,
                        ..
                    },
                ) => (
                    c,
                    consumer_tag.as_str().unwrap().to_owned(),
                    delivery_tag,
                    redelivered,
                ),
                Frame::Method(_, m) if !m.has_content() => continue,
                other => panic!("expected a delivery, got {other:?}"),
            };
            let size = match self.frame().await {
                Frame::Header(_, h) => h.body_size as usize,
                other => panic!("expected a content header, got {other:?}"),
            };
            let mut body = BytesMut::new();
            while body.len() < size {
                match self.frame().await {
                    Frame::Body(_, b) => body.extend_from_slice(&b),
                    other => panic!("expected a body, got {other:?}"),
                }
            }
            got.push(Got {
                channel,
                consumer,
                tag,
                redelivered,
                body: body.freeze(),
            });
        }
        got
    }
}

fn bodies(got: &[Got]) -> Vec<&str> {
    got.iter()
        .map(|g| std::str::from_utf8(&g.body).unwrap())
        .collect()
}

/// A queue `q` with m1..m4 delivered to consumer "c1" on channel 1 of a connection and
/// not acknowledged: the connection and those deliveries.
async fn four_unacked(addr: &str, q: &str) -> (Amqp, Vec<Got>) {
    let mut a = Amqp::connect(addr).await;
    a.open_channel(1).await;
    a.declare(1, q).await;
    a.consume(1, q, "c1").await;
    for m in ["m1", "m2", "m3", "m4"] {
        a.publish(1, q, m).await;
    }
    let got = a.deliveries(4).await;
    assert_eq!(bodies(&got), ["m1", "m2", "m3", "m4"]);
    assert!(got.iter().all(|g| !g.redelivered), "{got:?}");
    (a, got)
}

fn assert_redelivered_in_order(again: &[Got], consumer: &str) {
    assert_eq!(
        bodies(again),
        ["m1", "m2", "m3", "m4"],
        "given back in their original order: {again:?}"
    );
    assert!(
        again
            .iter()
            .all(|g| g.redelivered && g.consumer == consumer),
        "{again:?}"
    );
    assert!(
        again.windows(2).all(|w| w[0].tag < w[1].tag),
        "tags in order: {again:?}"
    );
}

#[tokio::test]
async fn basic_recover_requeue_redelivers_in_the_original_order() {
    let (addr, _stop) = amqp_broker().await;
    let (mut a, _) = four_unacked(&addr, "rq-recover").await;
    a.send(1, Method::BasicRecover { requeue: true }).await;
    let again = a.deliveries(4).await;
    assert_redelivered_in_order(&again, "c1");
}

#[tokio::test]
async fn basic_nack_multiple_requeue_redelivers_in_the_original_order() {
    let (addr, _stop) = amqp_broker().await;
    let (mut a, got) = four_unacked(&addr, "rq-nack").await;
    a.send(
        1,
        Method::BasicNack {
            delivery_tag: got[3].tag,
            multiple: true,
            requeue: true,
        },
    )
    .await;
    let again = a.deliveries(4).await;
    assert_redelivered_in_order(&again, "c1");
    // And the same once more, with basic.recover-async this time.
    a.send(1, Method::BasicRecoverAsync { requeue: true }).await;
    let third = a.deliveries(4).await;
    assert_redelivered_in_order(&third, "c1");
}

#[tokio::test]
async fn a_channel_closed_with_unacked_deliveries_gives_them_to_another_consumer_in_order() {
    let (addr, _stop) = amqp_broker().await;
    let (mut a, _) = four_unacked(&addr, "rq-close").await;
    // A second consumer, on another connection, attached while the four are held.
    let mut b = Amqp::connect(&addr).await;
    b.open_channel(1).await;
    b.consume(1, "rq-close", "c2").await;
    a.send(
        1,
        Method::ChannelClose {
            reply_code: 200,
            reply_text: ShortStr::lit("bye"),
            class_id: 0,
            method_id: 0,
        },
    )
    .await;
    a.expect(1, "channel.close-ok").await;
    let again = b.deliveries(4).await;
    assert_redelivered_in_order(&again, "c2");
    assert!(again.iter().all(|g| g.channel == 1));
}

/// A STOMP 1.2 connection over raw frames.
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
        let r = c.next().await;
        assert_eq!(r.command, Command::Connected, "{r:?}");
        c
    }

    async fn send(&mut self, f: hayate_stomp::Frame) {
        let mut b = BytesMut::new();
        hayate_stomp::encode(&f, hayate_stomp::Version::V1_2, &mut b);
        self.s.write_all(&b).await.unwrap();
    }

    /// The next frame (heart-beats skipped).
    async fn next(&mut self) -> hayate_stomp::Frame {
        use hayate_stomp::{Item, Limits, Version, decode};
        loop {
            match decode(&mut self.buf, Version::V1_2, &Limits::default()).unwrap() {
                Some(Item::Frame(f)) => return f,
                Some(Item::HeartBeat) => continue,
                None => {}
            }
            let n = within(10, self.s.read_buf(&mut self.buf)).await.unwrap();
            assert!(n > 0, "the broker closed the connection");
        }
    }

    /// The next `n` MESSAGE frames (a RECEIPT in between is skipped).
    async fn messages(&mut self, n: usize) -> Vec<hayate_stomp::Frame> {
        let mut got = Vec::new();
        while got.len() < n {
            let f = self.next().await;
            match f.command {
                hayate_stomp::Command::Message => got.push(f),
                hayate_stomp::Command::Receipt => {}
                _ => panic!("expected a MESSAGE, got {f:?}"),
            }
        }
        got
    }
}

/// The session's window (`limits.max_unacked`) full, with more waiting behind it.
#[tokio::test]
async fn a_stomp_client_mode_nack_on_a_topic_redelivers_in_the_original_order() {
    use hayate_stomp::{Command, Frame};
    let mut config = Config::default();
    config.limits.max_unacked = 4;
    let b = common::start(config).await;
    let mut s = Stomp::connect(&b.stomp).await;
    s.send(
        Frame::new(Command::Subscribe)
            .header("id", "t")
            .header("destination", "/topic/order")
            .header("ack", "client")
            .header("receipt", "sub"),
    )
    .await;
    assert_eq!(s.next().await.command, Command::Receipt);
    for i in 1..=8 {
        s.send(
            Frame::new(Command::Send)
                .header("destination", "/topic/order")
                .body(format!("m{i}")),
        )
        .await;
    }
    let body = |f: &Frame| String::from_utf8(f.body.to_vec()).unwrap();
    let got = s.messages(4).await;
    assert_eq!(
        got.iter().map(body).collect::<Vec<_>>(),
        ["m1", "m2", "m3", "m4"]
    );
    // `client` mode: a NACK of m4 covers m1..m4. They come again first, in order, ahead of
    // m5..m8 (waiting for the window).
    s.send(Frame::new(Command::Nack).header("id", got[3].get("ack").unwrap()))
        .await;
    let again = s.messages(4).await;
    assert_eq!(
        again.iter().map(body).collect::<Vec<_>>(),
        ["m1", "m2", "m3", "m4"],
        "given back in their original order: {again:?}"
    );
    let ids: Vec<u64> = again
        .iter()
        .map(|f| f.get("ack").unwrap().parse().unwrap())
        .collect();
    assert!(ids.windows(2).all(|w| w[0] < w[1]), "{ids:?}");
    s.send(Frame::new(Command::Ack).header("id", again[3].get("ack").unwrap()))
        .await;
    let rest = s.messages(4).await;
    assert_eq!(
        rest.iter().map(body).collect::<Vec<_>>(),
        ["m5", "m6", "m7", "m8"]
    );
}
