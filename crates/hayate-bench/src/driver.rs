//! Client drivers: one connection type over Hayate (`hayate-client`), NATS (`async-nats`),
//! STOMP ([`stomp`], over the workspace's `hayate-stomp` codec) and MQTT ([`mqttc`], over the
//! workspace's `hayate-mqtt` codec), and, with feature `peers`, MQTT through `rumqttc`
//! ([`mqtt`], `mqtt://...?client=rumqttc`), AMQP 0-9-1 (`lapin`, [`amqp`]), ZeroMQ
//! (`zeromq`, [`zmq`], brokerless: mode "peer-to-peer"), Kafka (`rdkafka`, [`kafka`]) and
//! Zenoh, so that the harness runs the same code for every system. gRPC (`tonic`, [`grpc`],
//! feature `peers`) has no connection here: it is measured by `bench rpc` only. Each peer module's docs
//! give its method and fairness settings (MQTT QoS 0, AMQP no-ack without confirms, Kafka
//! linger.ms=0 / batch.size 1 MiB / acks=0, ZeroMQ counts what arrives).
//!
//! Keys are written Hayate-style (`bench/thr/8`); the NATS driver maps `/` to `.`. Each point
//! works under its own prefix ([`point_prefix`]), so that a point never sees the messages of
//! another point or of another benchmark run sharing the server.
//!
//! [`Conn::flush`] is a round trip on *that* connection for both systems: Hayate's `flush` is a
//! PING/PONG; async-nats' `flush` only writes the client's buffer to the socket, so the NATS
//! driver sends a message to itself through nats-server and waits for it (see
//! [`NatsConn::round_trip`]). Only then is a subscription known to be active at the server.
//!
//! NATS settings: the subscriber's client-side pending limit (`subscription_capacity`) is raised
//! (up to 1 Mi messages, bounded by ~256 MiB of payload) so that the client does not drop;
//! nats-server may still disconnect a slow consumer (its default pending limit is 64 MiB per
//! connection). Such a disconnect, a client-side slow-consumer drop or a server error is
//! recorded and fails the point. Payloads above the server's `max_payload` (1 MiB by default;
//! up to 64 MiB with `max_payload` in the nats-server config) fail the point up front.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, bail};
use bytes::Bytes;
use futures::StreamExt;
use hayate_core::sync::lock;

use crate::target::{System, Target};

#[cfg(feature = "peers")]
pub(crate) mod amqp;
pub(crate) mod amqpc;
#[cfg(feature = "peers")]
pub(crate) mod grpc;
#[cfg(feature = "peers")]
mod kafka;
#[cfg(feature = "peers")]
mod mqtt;
pub(crate) mod mqttc;
pub(crate) mod stomp;
pub(crate) mod wbuf;
mod ws;
#[cfg(feature = "peers")]
pub(crate) mod zenoh;
#[cfg(feature = "peers")]
pub(crate) mod zmq;

#[cfg(feature = "peers")]
pub(crate) use zenoh::check_params as zenoh_check_params;

/// `amqp://...?client=hayate`: the workspace's own AMQP client instead of lapin.
fn wants_amqpc(target: &Target) -> bool {
    target.param("client") == Some("hayate")
}

/// Whether an `mqtt://` target asks for the `rumqttc` driver (`?client=rumqttc`).
#[cfg(feature = "peers")]
fn wants_rumqttc(target: &Target) -> bool {
    target.param("client") == Some("rumqttc")
}

/// The client library used for a target, for records.
pub(crate) fn client_name(target: &Target) -> &'static str {
    match target.system {
        System::Hayate => concat!("hayate-client ", env!("CARGO_PKG_VERSION")),
        System::Nats => "async-nats 0.51",
        System::Stomp => stomp::CLIENT,
        #[cfg(feature = "peers")]
        System::Zenoh => zenoh::CLIENT,
        #[cfg(feature = "peers")]
        System::Mqtt if wants_rumqttc(target) => mqtt::CLIENT,
        System::Mqtt => match mqttc::version(target) {
            Ok(v) if v.is_v5() => mqttc::CLIENT_V5,
            _ => mqttc::CLIENT,
        },
        System::Amqp if wants_amqpc(target) => amqpc::CLIENT,
        #[cfg(feature = "peers")]
        System::Amqp => amqp::CLIENT,
        #[cfg(feature = "peers")]
        System::Zmq => zmq::CLIENT,
        #[cfg(feature = "peers")]
        System::Kafka => kafka::CLIENT,
        #[cfg(feature = "peers")]
        System::Grpc => grpc::CLIENT,
        #[cfg(not(feature = "peers"))]
        _ => "(not compiled in)",
    }
}

/// A connection to a target.
#[derive(Clone)]
pub(crate) enum Conn {
    Hayate(hayate_client::Client),
    /// `hayate://HOST:0?mode=peer`: a peer node (no broker); see [`hayate_peer`].
    HayatePeer(hayate_client::peer::Node),
    Nats(NatsConn),
    Stomp(stomp::StompConn),
    Mqtt(mqttc::MqttConn),
    #[cfg(feature = "peers")]
    Rumqttc(mqtt::MqttConn),
    #[cfg(feature = "peers")]
    Amqp(amqp::AmqpConn),
    Amqpc(amqpc::AmqpcConn),
    #[cfg(feature = "peers")]
    Zmq(zmq::ZmqConn),
    #[cfg(feature = "peers")]
    Kafka(kafka::KafkaConn),
    #[cfg(feature = "peers")]
    Zenoh(zenoh::ZenohConn),
}

#[derive(Clone)]
pub(crate) struct NatsConn {
    client: async_nats::Client,
    /// The first asynchronous trouble reported by the client (disconnect, slow consumer...).
    trouble: Arc<Mutex<Option<String>>>,
}

/// Where to publish: a validated key or subject, made once per point.
pub(crate) enum Topic {
    Hayate(hayate_core::Key),
    Nats(async_nats::Subject),
    /// STOMP destination, MQTT topic, AMQP routing key, ZeroMQ topic frame or Kafka topic.
    Peer(String),
    /// A declared Zenoh publisher.
    #[cfg(feature = "peers")]
    Zenoh(Arc<::zenoh::pubsub::Publisher<'static>>),
}

/// A subscription.
pub(crate) enum Sub {
    Hayate(hayate_client::Subscription),
    Nats(async_nats::Subscriber),
    Stomp(stomp::StompSub),
    Mqtt(mqttc::MqttSub),
    #[cfg(feature = "peers")]
    Rumqttc(mqtt::MqttSub),
    #[cfg(feature = "peers")]
    Amqp(amqp::AmqpSub),
    Amqpc(amqpc::AmqpcSub),
    #[cfg(feature = "peers")]
    Zmq(zmq::ZmqSub),
    #[cfg(feature = "peers")]
    Kafka(kafka::KafkaSub),
    #[cfg(feature = "peers")]
    Zenoh(zenoh::ZenohSub),
}

fn nats_subject(key: &str) -> String {
    key.replace('/', ".")
}

/// Why a `grpc://` target has no connection (thr, lat).
pub(crate) const GRPC_RPC_ONLY: &str = "not supported: gRPC is only measured by bench rpc";

/// Fails when a target is `grpc://`: thr and lat do not measure gRPC.
pub(crate) fn refuse_rpc_only(targets: &[Target]) -> anyhow::Result<()> {
    if let Some(t) = targets.iter().find(|t| t.system == System::Grpc) {
        bail!("{t}: {GRPC_RPC_ONLY}");
    }
    Ok(())
}

/// How long [`Conn::flush`] waits for its round trip.
const FLUSH_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a peer driver waits for its connection to be established.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// A TCP connection to `target` within `timeout`, with TCP_NODELAY, split in halves (the
/// MQTT and STOMP drivers' transport).
pub(crate) async fn connect_tcp(
    target: &Target,
    timeout: std::time::Duration,
) -> anyhow::Result<(
    tokio::net::tcp::OwnedReadHalf,
    tokio::net::tcp::OwnedWriteHalf,
)> {
    use anyhow::Context as _;
    let stream = tokio::time::timeout(timeout, tokio::net::TcpStream::connect(target.addr()))
        .await
        .with_context(|| format!("connecting to {target}: timed out"))?
        .with_context(|| format!("connecting to {target}"))?;
    stream.set_nodelay(true)?;
    Ok(stream.into_split())
}

/// A TLS client connection (tokio-rustls) to `target`, trusting the CA in PEM file `ca`,
/// split in halves: the MQTT driver's `transport=tls` (the same client code for every
/// broker measured).
pub(crate) async fn connect_tls(
    target: &Target,
    ca: &str,
    timeout: std::time::Duration,
) -> anyhow::Result<(hayate_io::transport::Reader, TransportWrite)> {
    use anyhow::Context as _;
    let config = hayate_client::tls_client_config(std::path::Path::new(ca), None)
        .with_context(|| format!("ca={ca}"))?;
    let stream = tokio::time::timeout(timeout, tokio::net::TcpStream::connect(target.addr()))
        .await
        .with_context(|| format!("connecting to {target}: timed out"))?
        .with_context(|| format!("connecting to {target}"))?;
    stream.set_nodelay(true)?;
    let name = rustls::pki_types::ServerName::try_from(target.host.clone())?;
    // hayate-io's TLS transport (the one Hayate's own client and broker use): one `recv` of
    // up to 64 KiB per read, where tokio-rustls makes one per 4 KiB.
    let (r, w) = hayate_io::transport::tls::connect(stream, config, name, timeout)
        .await
        .with_context(|| format!("TLS handshake with {target}"))?;
    Ok((r, TransportWrite(w)))
}

/// `AsyncWrite` over a transport's write half. `poll_flush` pushes what the transport still
/// holds (TLS ciphertext): call it after a `write_all`.
pub(crate) struct TransportWrite(hayate_io::transport::Writer);

impl tokio::io::AsyncWrite for TransportWrite {
    fn poll_write(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        loop {
            match self.0.try_write_vectored(&[std::io::IoSlice::new(buf)]) {
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    std::task::ready!(self.0.poll_write_ready(cx))?
                }
                r => return std::task::Poll::Ready(r),
            }
        }
    }
    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        self.0.poll_write_ready(cx)
    }
    fn poll_shutdown(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::task::ready!(self.0.poll_write_ready(cx))?;
        self.0.shutdown();
        std::task::Poll::Ready(Ok(()))
    }
}

/// A key prefix unique to one point of one process: `bench/<pid>-<n>`.
pub(crate) fn point_prefix() -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    format!(
        "bench/{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// Hayate peer mode: the first connection made for an address starts a node listening on
/// `HOST:0`; the next one starts a node linked to it (as the Zenoh driver pairs its peer
/// sessions: the harness makes a point's connections one after the other, subscriber then
/// publisher, echo then pinger) and waits until both have linked. No broker, no scouting.
/// The options of a peer node for `target`: listening on its host (a free port), linking to
/// `peers`, with the target's ring settings (`shm`, `slots`, `slot`, `arena`, `spin`).
pub(crate) fn peer_node_options(
    target: &Target,
    peers: Vec<String>,
) -> anyhow::Result<hayate_client::peer::NodeOptions> {
    let mut any_port = target.clone();
    any_port.port = 0;
    let mut options = hayate_client::peer::NodeOptions {
        listen: any_port.addr(),
        peers,
        ..Default::default()
    };
    if let Some(m) = target.param("shm") {
        options.shm.mode = m.parse().map_err(anyhow::Error::msg)?;
    }
    if let Some(n) = target.param("slots") {
        options.shm.slots = n
            .parse()
            .with_context(|| format!("{target}: slots is a number"))?;
    }
    if let Some(n) = target.param("slot") {
        options.shm.slot_bytes = n
            .parse()
            .with_context(|| format!("{target}: slot is in bytes"))?;
    }
    if let Some(n) = target.param("arena") {
        options.shm.arena_bytes = n
            .parse()
            .with_context(|| format!("{target}: arena is in bytes"))?;
    }
    if let Some(us) = target.param("spin") {
        options.shm.spin = Duration::from_micros(
            us.parse()
                .with_context(|| format!("{target}: spin is in microseconds"))?,
        );
    }
    Ok(options)
}

async fn hayate_peer(target: &Target) -> anyhow::Result<hayate_client::peer::Node> {
    use hayate_client::peer::Node;
    static PENDING: Mutex<Option<std::collections::HashMap<String, String>>> = Mutex::new(None);
    // `peers=ADDR,...` (the fan-out benchmark): link to those, no pairing in this process.
    let explicit: Option<Vec<String>> = target.param("peers").map(|p| {
        p.split(',')
            .filter(|a| !a.is_empty())
            .map(str::to_string)
            .collect()
    });
    let partner = match &explicit {
        Some(list) => list.first().cloned(),
        None => lock(&PENDING)
            .get_or_insert_with(Default::default)
            .remove(&target.addr()),
    };
    let options = peer_node_options(
        target,
        explicit
            .clone()
            .unwrap_or_else(|| partner.iter().cloned().collect()),
    )?;
    let node = Node::start(options)
        .await
        .with_context(|| format!("starting a peer node for {target}"))?;
    match partner {
        Some(_) => node
            .wait_peers(1, Duration::from_secs(10))
            .await
            .with_context(|| format!("{target}: the peer nodes did not link"))?,
        None if explicit.is_some() => {}
        None => {
            lock(&PENDING)
                .get_or_insert_with(Default::default)
                .insert(target.addr(), node.local_addr().to_string());
        }
    }
    Ok(node)
}

impl NatsConn {
    /// A round trip through nats-server on this connection: subscribes a fresh inbox, publishes
    /// one empty message to it and waits for that message. nats-server handles a connection's
    /// protocol in order, so once the message is back every SUB and PUB sent earlier on this
    /// connection has been processed (a subscription is registered). `Client::flush` alone
    /// does not ensure this: it only writes the client's buffer to the socket.
    async fn round_trip(&self) -> anyhow::Result<()> {
        let inbox = self.client.new_inbox();
        let mut probe = self.client.subscribe(inbox.clone()).await?;
        self.client.publish(inbox, Bytes::new()).await?;
        self.client.flush().await?;
        tokio::time::timeout(FLUSH_TIMEOUT, probe.next())
            .await
            .with_context(|| format!("no round trip to nats-server within {FLUSH_TIMEOUT:?}"))?
            .context("the connection ended during a round trip")?;
        probe.unsubscribe().await?;
        Ok(())
    }
}

/// A broker client for a `hayate://` target, with the target's settings: `?shm=off|auto|require`
/// (shared memory with a broker on this host; auto, the client's default, takes it when
/// offered), `?in_place=1|0` (read what the broker's fan-out arena holds in place, the
/// default, or copy it out), `?slots=`, `?slot=` (the client's ring) and `?ca=FILE` (over
/// TLS, trusting that CA).
/// A flag parameter: `1`/`true`/`on` or `0`/`false`/`off`.
fn parse_flag(v: &str) -> anyhow::Result<bool> {
    match v {
        "1" | "true" | "on" => Ok(true),
        "0" | "false" | "off" => Ok(false),
        _ => anyhow::bail!("{v:?} is not 1 or 0"),
    }
}

pub(crate) async fn hayate_client(
    target: &Target,
    name: &str,
) -> anyhow::Result<hayate_client::Client> {
    let mut opts = hayate_client::ConnectOptions::default().name(name);
    if let Some(m) = target.param("shm") {
        opts.shm = m.parse().map_err(anyhow::Error::msg)?;
    }
    if let Some(v) = target.param("in_place") {
        opts.shm_in_place = parse_flag(v).context("in_place=")?;
    }
    if let Some(n) = target.param("slots") {
        opts.shm_geometry.slots = n.parse().context("slots=")?;
    }
    if let Some(n) = target.param("slot") {
        opts.shm_geometry.slot_bytes = n.parse().context("slot=")?;
    }
    let addr = target.addr();
    let addr = match target.param("ca") {
        Some(ca) => {
            opts = opts.tls_ca(ca);
            format!("tls://{addr}")
        }
        None => addr,
    };
    hayate_client::Client::connect_with(addr.as_str(), opts)
        .await
        .with_context(|| format!("connecting to {target}"))
}

impl Conn {
    /// Connects. `expect_payload` sizes the NATS client-side pending limit of subscriptions.
    pub(crate) async fn connect(
        target: &Target,
        name: &str,
        expect_payload: usize,
    ) -> anyhow::Result<Conn> {
        let addr = target.addr();
        match target.system {
            System::Grpc => bail!("{target}: {GRPC_RPC_ONLY}"),
            System::Hayate if target.param("mode") == Some("peer") => {
                Ok(Conn::HayatePeer(hayate_peer(target).await?))
            }
            System::Hayate => Ok(Conn::Hayate(hayate_client(target, name).await?)),
            System::Nats => {
                let trouble: Arc<Mutex<Option<String>>> = Arc::new(Mutex::new(None));
                let t = trouble.clone();
                let who = name.to_string();
                let capacity = ((256usize << 20) / (expect_payload + 256)).clamp(1024, 1 << 20);
                let client = async_nats::ConnectOptions::new()
                    .name(name)
                    .subscription_capacity(capacity)
                    .connection_timeout(Duration::from_secs(5))
                    .event_callback(move |event| {
                        let (t, who) = (t.clone(), who.clone());
                        async move {
                            use async_nats::Event;
                            let msg = match event {
                                Event::Disconnected => {
                                    "disconnected by nats-server (slow consumer?)".to_string()
                                }
                                Event::SlowConsumer(sid) => {
                                    format!("client-side slow consumer: dropped (sid {sid})")
                                }
                                Event::ServerError(e) => format!("nats-server error: {e}"),
                                Event::ClientError(e) => format!("nats client error: {e}"),
                                _ => return,
                            };
                            let mut slot = lock(&t);
                            if slot.is_none() {
                                *slot = Some(format!("{who}: {msg}"));
                            }
                        }
                    })
                    .connect(format!("nats://{addr}"))
                    .await
                    .with_context(|| format!("connecting to {target}"))?;
                Ok(Conn::Nats(NatsConn { client, trouble }))
            }
            System::Stomp => Ok(Conn::Stomp(
                stomp::StompConn::connect(target, name, CONNECT_TIMEOUT).await?,
            )),
            #[cfg(feature = "peers")]
            System::Zenoh => Ok(Conn::Zenoh(zenoh::ZenohConn::connect(target).await?)),
            #[cfg(feature = "peers")]
            System::Mqtt if wants_rumqttc(target) => Ok(Conn::Rumqttc(
                mqtt::MqttConn::connect(target, name, expect_payload, CONNECT_TIMEOUT).await?,
            )),
            System::Mqtt => Ok(Conn::Mqtt(
                mqttc::MqttConn::connect(target, name, expect_payload, CONNECT_TIMEOUT).await?,
            )),
            System::Amqp if wants_amqpc(target) => Ok(Conn::Amqpc(
                amqpc::AmqpcConn::connect(target, CONNECT_TIMEOUT).await?,
            )),
            #[cfg(feature = "peers")]
            System::Amqp => Ok(Conn::Amqp(
                amqp::AmqpConn::connect(target, name, expect_payload).await?,
            )),
            #[cfg(feature = "peers")]
            System::Zmq => Ok(Conn::Zmq(
                zmq::ZmqConn::connect(target, expect_payload).await?,
            )),
            #[cfg(feature = "peers")]
            System::Kafka => Ok(Conn::Kafka(
                kafka::KafkaConn::connect(target, name, expect_payload).await?,
            )),
            #[cfg(not(feature = "peers"))]
            _ => bail!("{target}: built without the peers feature"),
        }
    }

    pub(crate) async fn topic(&self, key: &str) -> anyhow::Result<Topic> {
        Ok(match self {
            Conn::Hayate(_) | Conn::HayatePeer(_) => Topic::Hayate(hayate_core::Key::new(key)?),
            Conn::Nats(_) => Topic::Nats(async_nats::Subject::from(nats_subject(key))),
            Conn::Stomp(_) => Topic::Peer(stomp::topic_destination(key)),
            #[cfg(feature = "peers")]
            Conn::Zenoh(z) => Topic::Zenoh(z.publisher(key).await?),
            Conn::Mqtt(_) => Topic::Peer(key.to_string()),
            #[cfg(feature = "peers")]
            Conn::Rumqttc(_) => Topic::Peer(key.to_string()),
            #[cfg(feature = "peers")]
            Conn::Amqp(_) => Topic::Peer(amqp::routing_key(key)),
            Conn::Amqpc(_) => Topic::Peer(key.replace('/', ".")),
            #[cfg(feature = "peers")]
            Conn::Zmq(z) => Topic::Peer(z.topic(key)?),
            #[cfg(feature = "peers")]
            Conn::Kafka(_) => Topic::Peer(kafka::topic_name(key)),
        })
    }

    /// Publishes (buffered by the client; awaits when the client applies back-pressure).
    #[inline]
    pub(crate) async fn publish(&self, topic: &Topic, payload: Bytes) -> anyhow::Result<()> {
        match (self, topic) {
            (Conn::Hayate(c), Topic::Hayate(k)) => c.publish(k, payload).await?,
            (Conn::HayatePeer(n), Topic::Hayate(k)) => n.publish(k, payload).await?,
            (Conn::Nats(n), Topic::Nats(s)) => n.client.publish(s.clone(), payload).await?,
            (Conn::Stomp(c), Topic::Peer(t)) => c.publish(t, payload).await?,
            #[cfg(feature = "peers")]
            (Conn::Zenoh(c), Topic::Zenoh(p)) => c.publish(p, payload).await?,
            (Conn::Mqtt(c), Topic::Peer(t)) => c.publish(t, payload).await?,
            #[cfg(feature = "peers")]
            (Conn::Rumqttc(c), Topic::Peer(t)) => c.publish(t, payload).await?,
            #[cfg(feature = "peers")]
            (Conn::Amqp(c), Topic::Peer(t)) => c.publish(t, payload).await?,
            (Conn::Amqpc(c), Topic::Peer(t)) => c.publish(t, payload).await?,
            #[cfg(feature = "peers")]
            (Conn::Zmq(c), Topic::Peer(t)) => c.publish(t, payload).await?,
            #[cfg(feature = "peers")]
            (Conn::Kafka(c), Topic::Peer(t)) => c.publish(t, payload).await?,
            _ => bail!("topic of another system"),
        }
        Ok(())
    }

    pub(crate) async fn subscribe(&self, key: &str) -> anyhow::Result<Sub> {
        Ok(match self {
            Conn::Hayate(c) => Sub::Hayate(c.subscribe(key).await?),
            Conn::HayatePeer(n) => Sub::Hayate(n.subscribe(key).await?),
            Conn::Nats(n) => Sub::Nats(n.client.subscribe(nats_subject(key)).await?),
            Conn::Stomp(c) => Sub::Stomp(c.subscribe(key).await?),
            #[cfg(feature = "peers")]
            Conn::Zenoh(c) => Sub::Zenoh(c.subscribe(key).await?),
            Conn::Mqtt(c) => Sub::Mqtt(c.subscribe(key).await?),
            #[cfg(feature = "peers")]
            Conn::Rumqttc(c) => Sub::Rumqttc(c.subscribe(key).await?),
            #[cfg(feature = "peers")]
            Conn::Amqp(c) => Sub::Amqp(c.subscribe(key).await?),
            Conn::Amqpc(c) => Sub::Amqpc(c.subscribe(key).await?),
            #[cfg(feature = "peers")]
            Conn::Zmq(c) => Sub::Zmq(c.subscribe(key).await?),
            #[cfg(feature = "peers")]
            Conn::Kafka(c) => Sub::Kafka(c.subscribe(key).await?),
        })
    }

    /// A round trip to the server on this connection: when it returns, the server has
    /// processed everything sent before (subscriptions are active, publications routed).
    pub(crate) async fn flush(&self) -> anyhow::Result<()> {
        match self {
            Conn::Hayate(c) => c.flush().await?,
            Conn::HayatePeer(n) => n.flush().await?,
            Conn::Nats(n) => n.round_trip().await?,
            Conn::Stomp(c) => c.flush(FLUSH_TIMEOUT).await?,
            #[cfg(feature = "peers")]
            Conn::Zenoh(c) => c.flush(FLUSH_TIMEOUT).await?,
            Conn::Mqtt(c) => c.flush(FLUSH_TIMEOUT).await?,
            #[cfg(feature = "peers")]
            Conn::Rumqttc(c) => c.flush(FLUSH_TIMEOUT).await?,
            #[cfg(feature = "peers")]
            Conn::Amqp(c) => c.flush(FLUSH_TIMEOUT).await?,
            Conn::Amqpc(c) => c.flush(FLUSH_TIMEOUT).await?,
            #[cfg(feature = "peers")]
            Conn::Zmq(c) => c.flush(FLUSH_TIMEOUT).await?,
            #[cfg(feature = "peers")]
            Conn::Kafka(c) => c.flush(FLUSH_TIMEOUT).await?,
        }
        Ok(())
    }

    /// Trouble reported asynchronously by the client (NATS: disconnect, slow consumer;
    /// Hayate: the error that ended the connection).
    pub(crate) fn trouble(&self) -> Option<String> {
        match self {
            Conn::Hayate(c) => c.last_error().map(|e| format!("connection ended: {e}")),
            Conn::HayatePeer(n) => {
                let slow = n
                    .stats()
                    .slow_consumers
                    .load(std::sync::atomic::Ordering::Relaxed);
                (slow > 0).then(|| format!("{slow} subscription(s) cut as slow consumers"))
            }
            Conn::Nats(n) => lock(&n.trouble).clone(),
            Conn::Stomp(c) => c.trouble(),
            #[cfg(feature = "peers")]
            Conn::Zenoh(c) => c.trouble(),
            Conn::Mqtt(c) => c.trouble(),
            #[cfg(feature = "peers")]
            Conn::Rumqttc(c) => c.trouble(),
            #[cfg(feature = "peers")]
            Conn::Amqp(c) => c.trouble(),
            Conn::Amqpc(c) => c.trouble(),
            #[cfg(feature = "peers")]
            Conn::Zmq(c) => c.trouble(),
            #[cfg(feature = "peers")]
            Conn::Kafka(c) => c.trouble(),
        }
    }

    /// The largest payload the server accepts, when it says.
    pub(crate) fn max_payload(&self) -> Option<usize> {
        match self {
            Conn::Hayate(c) => Some(usize::try_from(c.max_payload()).unwrap_or(usize::MAX)),
            Conn::HayatePeer(_) => Some(64 << 20),
            Conn::Nats(n) => Some(n.client.server_info().max_payload),
            _ => None,
        }
    }

    /// NATS: the server version; Hayate: the server's name (from its welcome).
    pub(crate) fn server_version(&self) -> Option<String> {
        match self {
            Conn::Hayate(c) => Some(c.server_name().to_string()),
            Conn::Nats(n) => Some(n.client.server_info().version),
            Conn::Stomp(c) => c.server_version(),
            #[cfg(feature = "peers")]
            Conn::Amqp(c) => c.server_version(),
            Conn::Amqpc(c) => c.server_version(),
            #[cfg(feature = "peers")]
            Conn::Kafka(c) => c.server_version(),
            _ => None,
        }
    }

    /// Flushes and closes, giving up after `timeout`.
    pub(crate) async fn close(self, timeout: Duration) {
        let done = match self {
            Conn::Hayate(c) => tokio::time::timeout(timeout, async move {
                if let Err(e) = c.close().await {
                    tracing::debug!("closing hayate connection: {e}");
                }
            })
            .await
            .is_ok(),
            Conn::HayatePeer(n) => tokio::time::timeout(timeout, n.close()).await.is_ok(),
            Conn::Nats(n) => tokio::time::timeout(timeout, async move {
                if let Err(e) = n.client.drain().await {
                    tracing::debug!("draining nats connection: {e}");
                }
            })
            .await
            .is_ok(),
            Conn::Stomp(c) => tokio::time::timeout(timeout, c.close()).await.is_ok(),
            #[cfg(feature = "peers")]
            Conn::Zenoh(c) => tokio::time::timeout(timeout, c.close()).await.is_ok(),
            Conn::Mqtt(c) => tokio::time::timeout(timeout, c.close()).await.is_ok(),
            #[cfg(feature = "peers")]
            Conn::Rumqttc(c) => tokio::time::timeout(timeout, c.close()).await.is_ok(),
            #[cfg(feature = "peers")]
            Conn::Amqp(c) => tokio::time::timeout(timeout, c.close()).await.is_ok(),
            Conn::Amqpc(c) => tokio::time::timeout(timeout, c.close()).await.is_ok(),
            #[cfg(feature = "peers")]
            Conn::Zmq(c) => tokio::time::timeout(timeout, c.close()).await.is_ok(),
            #[cfg(feature = "peers")]
            Conn::Kafka(c) => tokio::time::timeout(timeout, c.close()).await.is_ok(),
        };
        if !done {
            tracing::debug!("closing a connection timed out");
        }
    }
}

impl Sub {
    /// The next messages that arrived together, each payload shown to `f`; how many, or
    /// `None` at the end. A Hayate subscription takes a whole delivery at once
    /// ([`hayate_client::Subscription::next_batch`]: a plain batch's payloads are lent, no
    /// message is made for each); every other client gives one message.
    pub(crate) async fn next_many(&mut self, mut f: impl FnMut(&[u8])) -> Option<usize> {
        if let Sub::Hayate(s) = self {
            let b = s.next_batch().await?;
            b.payloads().for_each(&mut f);
            return Some(b.len());
        }
        let p = self.next().await?;
        f(&p);
        Some(1)
    }

    /// The next message's payload; `None` when the subscription or connection ended.
    #[inline]
    pub(crate) async fn next(&mut self) -> Option<Bytes> {
        match self {
            Sub::Hayate(s) => s.next().await.map(|m| m.payload),
            Sub::Nats(s) => s.next().await.map(|m| m.payload),
            Sub::Stomp(s) => s.next().await,
            #[cfg(feature = "peers")]
            Sub::Zenoh(s) => s.next().await,
            Sub::Mqtt(s) => s.next().await,
            #[cfg(feature = "peers")]
            Sub::Rumqttc(s) => s.next().await,
            #[cfg(feature = "peers")]
            Sub::Amqp(s) => s.next().await,
            Sub::Amqpc(s) => s.next().await,
            #[cfg(feature = "peers")]
            Sub::Zmq(s) => s.next().await,
            #[cfg(feature = "peers")]
            Sub::Kafka(s) => s.next().await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_keys_to_subjects() {
        assert_eq!(nats_subject("bench/thr/8"), "bench.thr.8");
        assert_eq!(nats_subject("bench/ping"), "bench.ping");
    }

    #[test]
    fn point_prefixes_are_unique_keys() {
        let (a, b) = (point_prefix(), point_prefix());
        assert_ne!(a, b);
        hayate_core::Key::new(&format!("{a}/ping")).unwrap();
        assert!(!nats_subject(&a).contains(['/', '*', '>', ' ']));
    }
}
