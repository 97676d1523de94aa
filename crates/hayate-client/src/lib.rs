//! Async Rust client for Hayate's native protocol.
//!
//! ```no_run
//! # async fn demo() -> Result<(), hayate_client::Error> {
//! use hayate_client::Client;
//! use hayate_core::Key;
//!
//! let client = Client::connect("127.0.0.1:4700").await?;
//! let mut sub = client.subscribe("demo/**").await?;
//! client.publish(&Key::new("demo/x")?, "hello").await?;
//! let msg = sub.next().await.expect("delivered");
//! assert_eq!(&msg.payload[..], b"hello");
//! client.close().await?;
//! # Ok(()) }
//! ```
//!
//! # Layout
//! - [`Client`]: a cheap, cloneable handle. Publishing encodes into a shared outgoing buffer;
//!   a writer task sends everything buffered in one write, so publishes are batched
//!   automatically without waiting for a timer (consecutive plain publishes to one key
//!   share one PUB_BATCH frame). A reader task decodes every frame of each read and hands
//!   messages to subscriptions a read's worth at a time.
//! - [`Subscription`]: a stream of [`Message`]s; dropping it unsubscribes.
//! - Request/reply: [`Client::request`] publishes with a reply-to key under this session's
//!   inbox (`<inbox>/<token>`: the inbox named in WELCOME, from a broker `_inbox/` and 24
//!   random hex digits; the token a decimal counter of the connection) and waits for the
//!   reply; [`Client::reply`] answers.
//! - [`rpc`]: an RPC layer in the style of oslo.messaging on top of request/reply and queue
//!   groups: [`Client::call`], [`Client::cast`], [`Client::fanout`] and [`Client::serve`]
//!   (wire convention in `docs/rpc.md`).
//! - [`peer`]: [`peer::PeerServer`], a listener that answers clients directly, peer to
//!   peer, without a broker hop ([`rpc::serve_peer`] for RPC); [`peer::Node`], peer-mode
//!   pub/sub (queue groups, request/reply, discovery) with no broker at all.
//! - [`blocking`]: a synchronous wrapper for programs without an async runtime.

pub mod blocking;
mod conn;
mod error;
pub mod peer;
pub mod rpc;
pub mod streams;
mod sub;

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
pub use error::{Error, Result};
pub use hayate_core::{Key, KeyExpr, Message, Qos};
/// A TLS client configuration trusting a PEM CA file (and presenting a client certificate):
/// what `tls://` connections use, for other TLS clients that should behave the same.
pub use hayate_io::transport::tls::client_config as tls_client_config;
pub use hayate_native::ConfirmOutcome;
/// Credentials sent in HELLO: none, a user and password, or a bearer token.
pub use hayate_native::HelloAuth as Auth;
pub use sub::{Batch, Payloads, Subscription};

use conn::Inner;

/// Connection settings.
#[derive(Debug, Clone)]
pub struct ConnectOptions {
    /// Client name sent in HELLO.
    pub name: String,
    /// Outgoing bytes buffered before `publish` waits for the writer (back-pressure).
    pub write_buffer: usize,
    /// How long connecting and the handshake may take.
    pub connect_timeout: Duration,
    /// Deliveries a subscription buffers before the reader stops reading (back-pressure):
    /// each the messages of one read for it, or one batch frame ([`Batch`]).
    pub subscription_capacity: usize,
    /// Payload bytes a subscription buffers before the reader stops reading (default
    /// 64 MiB): with `subscription_capacity`, the bound of what a subscriber that does not
    /// keep up holds in this process. An empty queue takes one delivery of any size.
    pub subscription_bytes: usize,
    /// Keepalive: after this long without input from the server the client sends a PING;
    /// `None`: never. The broker pings idle clients too, so an idle connection keeps input
    /// flowing both ways.
    pub ping_interval: Option<Duration>,
    /// PINGs sent with no input at all in between before the client gives the connection
    /// up as dead (its calls then fail with `Error::Io("... presumed dead")`).
    pub max_pings_out: u32,
    /// Credentials for HELLO. A `hayate://user:password@host:port` address sets them too
    /// (when these are [`Auth::Anonymous`]).
    pub auth: Auth,
    /// PEM file with the CA certificate(s) a `tls://` server's certificate must chain to
    /// (needed for `tls://` addresses).
    pub tls_ca: Option<std::path::PathBuf>,
    /// A client certificate chain and key (PEM files) for servers that ask for one.
    pub tls_client_cert: Option<(std::path::PathBuf, std::path::PathBuf)>,
    /// Shared memory with a broker on this host: `Auto` (the default) asks for it and uses
    /// it when offered (on the broker's host, `native.shm` on), `Require` fails to connect
    /// without it, `Off` never asks. The connection then runs on two rings instead of the
    /// socket (docs/protocol.md, *Shared memory with the broker*).
    pub shm: peer::ShmMode,
    /// The ring this client writes into (its publications), when on shared memory.
    pub shm_geometry: hayate_io::transport::shm::ShmGeometry,
    /// On shared memory with a broker that has a fan-out arena: read the messages it fans
    /// out in place (`true`, the default: a message's payload is the arena's bytes, no
    /// copy, and holds its entry until dropped), or copy each out (`false`). A client
    /// that holds many messages undropped reaches its quota of the arena, and then gets
    /// copies (docs/shm.md, *Reading in place*).
    pub shm_in_place: bool,
}

impl Default for ConnectOptions {
    fn default() -> Self {
        ConnectOptions {
            name: format!("hayate-client/{}", env!("CARGO_PKG_VERSION")),
            write_buffer: 4 * 1024 * 1024,
            connect_timeout: Duration::from_secs(10),
            subscription_capacity: 64,
            subscription_bytes: 64 * 1024 * 1024,
            ping_interval: Some(Duration::from_secs(30)),
            max_pings_out: 2,
            auth: Auth::Anonymous,
            tls_ca: None,
            tls_client_cert: None,
            shm: peer::ShmMode::Auto,
            shm_geometry: Default::default(),
            shm_in_place: true,
        }
    }
}

impl ConnectOptions {
    /// Logs in as `user` with `password`.
    pub fn password(mut self, user: impl Into<String>, password: impl AsRef<[u8]>) -> Self {
        self.auth = Auth::Password {
            user: user.into(),
            password: Bytes::copy_from_slice(password.as_ref()),
        };
        self
    }

    /// Trusts the CA certificate(s) in `pem` for `tls://` servers.
    pub fn tls_ca(mut self, pem: impl Into<std::path::PathBuf>) -> Self {
        self.tls_ca = Some(pem.into());
        self
    }

    /// Presents this client certificate (chain and key, PEM) to TLS servers that ask.
    pub fn tls_client_cert(
        mut self,
        cert: impl Into<std::path::PathBuf>,
        key: impl Into<std::path::PathBuf>,
    ) -> Self {
        self.tls_client_cert = Some((cert.into(), key.into()));
        self
    }

    /// Logs in with a bearer token (`hyt_...`).
    pub fn token(mut self, token: impl AsRef<[u8]>) -> Self {
        self.auth = Auth::Token(Bytes::copy_from_slice(token.as_ref()));
        self
    }

    /// Sets the client name.
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }
}

/// A queue group name must be 1..=65535 bytes (it travels with a u16 length).
pub(crate) fn check_group(group: Option<&str>) -> Result<()> {
    match group {
        Some(g) if g.is_empty() || g.len() > usize::from(u16::MAX) => Err(Error::Protocol(
            "a queue group name must be 1..=65535 bytes".into(),
        )),
        _ => Ok(()),
    }
}

/// Subscription settings.
#[derive(Debug, Clone, Default)]
pub struct SubscribeOptions {
    /// Queue group: each message goes to one member of the group.
    pub group: Option<String>,
    /// Reliability and congestion behaviour.
    pub qos: Qos,
}

impl SubscribeOptions {
    /// Membership of queue group `group`, default QoS.
    pub fn queue(group: &str) -> SubscribeOptions {
        SubscribeOptions {
            group: Some(group.to_string()),
            qos: Qos::default(),
        }
    }

    /// `expr` as an expression, these options' group checked: what subscribing with them
    /// (to a broker or as a peer node) starts with.
    pub(crate) fn check(&self, expr: &str) -> Result<KeyExpr> {
        let expr = KeyExpr::new(expr)?;
        check_group(self.group.as_deref())?;
        Ok(expr)
    }
}

/// A connection to a Hayate broker. Cloning gives another handle to the same connection.
#[derive(Debug, Clone)]
pub struct Client {
    inner: Arc<Inner>,
}

impl Client {
    /// Connects to `addr` (`HOST:PORT`, `tls://HOST:PORT` with a CA in the options, or
    /// `unix:PATH`) with default options.
    pub async fn connect(addr: &str) -> Result<Client> {
        Client::connect_with(addr, ConnectOptions::default()).await
    }

    /// Connects with `options`.
    pub async fn connect_with(addr: &str, options: ConnectOptions) -> Result<Client> {
        let inner = tokio::time::timeout(options.connect_timeout, conn::connect(addr, options))
            .await
            .map_err(|_| Error::Timeout)??;
        Ok(Client { inner })
    }

    /// The session id the server assigned.
    pub fn session_id(&self) -> u64 {
        self.inner.welcome.session
    }

    /// The server's name.
    pub fn server_name(&self) -> &str {
        &self.inner.welcome.server
    }

    /// The largest payload the server accepts.
    pub fn max_payload(&self) -> u64 {
        self.inner.welcome.max_payload
    }

    /// What the connection runs on: `tcp`, `unix`, `tls`, or `shm` (shared memory with a
    /// broker on this host).
    pub fn transport(&self) -> &'static str {
        self.inner.transport_name()
    }

    /// Publishes `payload` on `key`. Returns once the message is buffered for sending; waits
    /// only when the outgoing buffer is full.
    pub async fn publish(&self, key: &Key, payload: impl Into<Bytes>) -> Result<()> {
        self.inner.publish_plain(key, payload.into()).await
    }

    /// Publishes a message with all its metadata (reply-to, correlation id, headers).
    pub async fn publish_message(&self, msg: &Message) -> Result<()> {
        self.inner.publish_message(msg).await
    }

    /// Publishes `msg` and waits until the streams capturing its key keep it durably (under
    /// their fsync policy): [`ConfirmOutcome::Stored`] with the stream and offset,
    /// [`ConfirmOutcome::NotCaptured`] when no stream captures the key, or
    /// [`ConfirmOutcome::Failed`]. The message is delivered live in every case.
    pub async fn publish_confirmed(&self, msg: &Message) -> Result<ConfirmOutcome> {
        self.inner.publish_confirmed(msg).await
    }

    /// The stream administration API (create, delete, list, inspect, purge).
    pub fn streams(&self) -> streams::Streams<'_> {
        streams::Streams { client: self }
    }

    /// Subscribes to a key expression (fan-out, default QoS: reliable back-pressure).
    pub async fn subscribe(&self, expr: &str) -> Result<Subscription> {
        self.subscribe_with(expr, SubscribeOptions::default()).await
    }

    /// Joins queue group `group` on `expr`: each message goes to one member.
    pub async fn queue_subscribe(&self, expr: &str, group: &str) -> Result<Subscription> {
        self.subscribe_with(expr, SubscribeOptions::queue(group))
            .await
    }

    /// Subscribes with acknowledged delivery (optionally in queue group `group`): each
    /// message carries a delivery id (`msg.attrs.delivery`) and stays held by the broker
    /// until [`Client::ack`]; [`Client::nack`] gives it back for redelivery (to another
    /// member of the group when there is one), and so does a disconnect for everything not
    /// acknowledged. At most `limits.max_unacked` deliveries (broker setting, 1024 by
    /// default) are in flight per connection; the rest wait in the broker and count against
    /// the connection's outbox budget, so publishers slow down.
    pub async fn subscribe_acked(&self, expr: &str, group: Option<&str>) -> Result<Subscription> {
        self.subscribe_with(
            expr,
            SubscribeOptions {
                group: group.map(str::to_string),
                qos: Qos::ACKED,
            },
        )
        .await
    }

    /// Acknowledges `msg`, received on an acknowledged subscription: the broker forgets it.
    pub fn ack(&self, msg: &Message) -> Result<()> {
        self.inner.settle(msg.attrs.delivery, conn::Settle::Ack)
    }

    /// Gives `msg` back like [`Client::nack`]; a stream consumer or a queue delivers it again no sooner
    /// than `delay` from now (up to about 49 days; longer is cut).
    pub fn nack_after(&self, msg: &Message, delay: Duration) -> Result<()> {
        let ms = u32::try_from(delay.as_millis()).unwrap_or(u32::MAX).max(1);
        self.inner
            .settle(msg.attrs.delivery, conn::Settle::NackAfter(ms))
    }

    /// Joins durable consumer `consumer` of stream `stream` (create it first with
    /// [`Client::streams`]`().consumer_add`): its messages arrive here, shared with its other
    /// members, each with `attrs.stream_offset` and `attrs.deliveries`; acknowledge each with
    /// [`Client::ack`] (or give it back with [`Client::nack`] / [`Client::nack_after`]).
    /// Unacknowledged messages go to another member when this subscription or connection
    /// ends, and again after the consumer's `ack_wait_ms`.
    pub async fn consume(&self, stream: &str, consumer: &str) -> Result<Subscription> {
        self.inner.consume(stream, consumer, 0)
    }

    /// Consumes the broker's queue `name` (the one AMQP's vhost `/` and STOMP's
    /// `/queue/<name>` name too; made, in memory, if there is none): each message goes to
    /// one of the queue's consumers, whatever their protocol, and arrives here with
    /// `attrs.redelivered` set when it was delivered before. At most `prefetch`
    /// (1 to `limits.max_unacked`; 0: `limits.max_unacked`) wait unacknowledged here;
    /// acknowledge each with [`Client::ack`] (or [`Client::ack_through`]), or put it back
    /// in its place with [`Client::nack`] (another consumer may get it). Unacknowledged
    /// messages go back to the queue when this subscription or connection ends.
    pub async fn consume_queue(&self, name: &str, prefetch: u32) -> Result<Subscription> {
        self.inner.consume("", name, prefetch)
    }

    /// Acknowledges `msg` and every delivery of this connection received before it.
    pub fn ack_through(&self, msg: &Message) -> Result<()> {
        self.inner
            .settle(msg.attrs.delivery, conn::Settle::AckThrough)
    }

    /// Gives `msg` back: the broker delivers it again, marked redelivered
    /// (`msg.attrs.redelivered`), to another member of its queue group if there is one,
    /// otherwise to this subscription.
    pub fn nack(&self, msg: &Message) -> Result<()> {
        self.inner.settle(msg.attrs.delivery, conn::Settle::Nack)
    }

    /// Subscribes with explicit options.
    pub async fn subscribe_with(
        &self,
        expr: &str,
        options: SubscribeOptions,
    ) -> Result<Subscription> {
        let expr = options.check(expr)?;
        self.inner.subscribe(expr, options)
    }

    /// Sends a request and waits up to `timeout` for its reply.
    pub async fn request(
        &self,
        key: &Key,
        payload: impl Into<Bytes>,
        timeout: Duration,
    ) -> Result<Message> {
        self.inner
            .request(Message::new(key.clone(), payload), timeout)
            .await
    }

    /// Sends `msg` (with its headers) as a request and waits up to `timeout` for its reply.
    /// The message's reply-to key and correlation id are replaced by this connection's
    /// inbox key and a fresh token.
    pub async fn request_message(&self, msg: Message, timeout: Duration) -> Result<Message> {
        self.inner.request(msg, timeout).await
    }

    /// Answers `request` by publishing `payload` to its reply-to key, echoing its
    /// correlation id.
    pub async fn reply(&self, request: &Message, payload: impl Into<Bytes>) -> Result<()> {
        let m = request.reply(payload).ok_or(Error::NoReplyTo)?;
        self.inner.publish_message(&m).await
    }

    /// Waits until the server has processed everything sent before this call.
    pub async fn flush(&self) -> Result<()> {
        self.inner.flush().await
    }

    /// Closes the connection gracefully: buffered messages are sent first.
    pub async fn close(&self) -> Result<()> {
        self.inner.close().await
    }

    /// True once the connection has ended.
    pub fn is_closed(&self) -> bool {
        self.inner.is_closed()
    }

    /// The error that ended the connection, if any.
    pub fn last_error(&self) -> Option<Error> {
        self.inner.last_error()
    }
}
