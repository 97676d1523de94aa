//! AMQP 0-9-1 driver (`amqp://HOST:PORT`, default 5672, user guest/guest), through `lapin`.
//!
//! - Routing: publications go to the topic exchange `amq.topic` with the routing key = the key
//!   with `/` turned into `.` (`bench/1-0/thr/8` -> `bench.1-0.thr.8`).
//! - A subscription is a server-named, exclusive, auto-delete queue bound to `amq.topic` with
//!   that routing key, consumed with `no_ack` (automatic acknowledgement: the best-effort
//!   setting, like MQTT QoS 0). Publisher confirms are off; messages are transient.
//! - One channel per connection. lapin's `basic_publish` queues the frames at once but resolves
//!   only when its I/O loop has written them; awaiting each one would allow a single message in
//!   flight in the client. `publish` therefore keeps up to 1024 (and ~64 MiB of) publications
//!   pending, in order, like any client's write buffer.
//! - Flush: a synchronous method on the channel (a passive `exchange.declare` of `amq.topic`).
//!   RabbitMQ handles one channel's methods in order, so once it answers every publication
//!   sent before has been routed and every binding made before is in place.

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::Poll;
use std::time::Duration;

use anyhow::Context;
use bytes::Bytes;
use futures::StreamExt;
use hayate_core::sync::lock;
use lapin::options::{
    BasicConsumeOptions, BasicPublishOptions, ExchangeDeclareOptions, QueueBindOptions,
    QueueDeclareOptions,
};
use lapin::types::{FieldTable, ShortString};
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties, ExchangeKind};

use crate::target::Target;

/// The client library, for records.
pub(crate) const CLIENT: &str = "lapin 4.12";

const EXCHANGE: &str = "amq.topic";

/// The routing key of a key: `/` -> `.`.
pub(crate) fn routing_key(key: &str) -> String {
    key.replace('/', ".")
}

type Pending = Pin<Box<dyn Future<Output = lapin::Result<lapin::PublisherConfirm>> + Send>>;

#[derive(Clone)]
pub(crate) struct AmqpConn {
    conn: Arc<Connection>,
    channel: Channel,
    trouble: Arc<Mutex<Option<String>>>,
    /// Publications queued but not yet written (see the module docs).
    pending: Arc<tokio::sync::Mutex<VecDeque<Pending>>>,
    window: usize,
}

pub(crate) struct AmqpSub(lapin::Consumer);

impl AmqpConn {
    pub(crate) async fn connect(
        target: &Target,
        name: &str,
        expect_payload: usize,
    ) -> anyhow::Result<AmqpConn> {
        let conn = connect(target, name).await?;
        let trouble: Arc<Mutex<Option<String>>> = Arc::default();
        {
            let (trouble, who) = (trouble.clone(), name.to_string());
            let mut events = conn.events_listener();
            tokio::spawn(async move {
                while let Some(ev) = events.next().await {
                    let msg = match ev {
                        lapin::Event::Error(e) => format!("amqp: {e}"),
                        lapin::Event::ConnectionBlocked(r) => format!("amqp: blocked: {r}"),
                        _ => continue,
                    };
                    lock(&trouble).get_or_insert(format!("{who}: {msg}"));
                }
            });
        }
        let channel = conn.create_channel().await?;
        Ok(AmqpConn {
            conn: Arc::new(conn),
            channel,
            trouble,
            pending: Arc::default(),
            window: ((64usize << 20) / (expect_payload + 64)).clamp(1, 1024),
        })
    }

    #[inline]
    pub(crate) async fn publish(&self, routing_key: &str, payload: Bytes) -> anyhow::Result<()> {
        let channel = self.channel.clone();
        let routing_key = routing_key.into();
        // Without confirms the PublisherConfirm resolves at once: not awaited.
        let mut publication: Pending = Box::pin(async move {
            channel
                .basic_publish(
                    EXCHANGE.into(),
                    routing_key,
                    BasicPublishOptions::default(),
                    &payload,
                    BasicProperties::default(),
                )
                .await
        });
        let mut pending = self.pending.lock().await;
        // The first poll queues the frames, in order.
        if let Poll::Ready(r) = futures::poll!(publication.as_mut()) {
            r?;
        } else {
            pending.push_back(publication);
        }
        loop {
            let full = pending.len() > self.window;
            let Some(front) = pending.front_mut() else {
                break;
            };
            if full {
                front.await?;
            } else if let Poll::Ready(r) = futures::poll!(front.as_mut()) {
                r?;
            } else {
                break;
            }
            pending.pop_front();
        }
        Ok(())
    }

    /// Waits until every publication has been written.
    async fn drain(&self) -> anyhow::Result<()> {
        let mut pending = self.pending.lock().await;
        while let Some(p) = pending.pop_front() {
            p.await?;
        }
        Ok(())
    }

    pub(crate) async fn subscribe(&self, key: &str) -> anyhow::Result<AmqpSub> {
        let qname = private_queue(&self.channel, "").await?;
        self.channel
            .queue_bind(
                qname.clone(),
                EXCHANGE.into(),
                routing_key(key).into(),
                QueueBindOptions::default(),
                FieldTable::default(),
            )
            .await?;
        let consumer = consume_no_ack(&self.channel, qname, true).await?;
        Ok(AmqpSub(consumer))
    }

    /// A round trip on the channel (see the module docs).
    pub(crate) async fn flush(&self, timeout: Duration) -> anyhow::Result<()> {
        tokio::time::timeout(timeout, self.drain())
            .await
            .context("amqp: publications not written within the flush timeout")??;
        tokio::time::timeout(
            timeout,
            self.channel.exchange_declare(
                EXCHANGE.into(),
                ExchangeKind::Topic,
                ExchangeDeclareOptions {
                    passive: true,
                    ..ExchangeDeclareOptions::default()
                },
                FieldTable::default(),
            ),
        )
        .await
        .with_context(|| format!("no round trip to the amqp broker within {timeout:?}"))??;
        Ok(())
    }

    pub(crate) fn trouble(&self) -> Option<String> {
        lock(&self.trouble).clone()
    }

    pub(crate) fn server_version(&self) -> Option<String> {
        None
    }

    pub(crate) async fn close(self) {
        if let Err(e) = self.drain().await {
            tracing::debug!("amqp: {e:#}");
        }
        if let Err(e) = self.conn.close(200, "bye".into()).await {
            tracing::debug!("amqp close: {e}");
        }
    }
}

impl AmqpSub {
    #[inline]
    pub(crate) async fn next(&mut self) -> Option<Bytes> {
        match self.0.next().await? {
            Ok(d) => Some(Bytes::from(d.data)),
            Err(e) => {
                tracing::debug!("amqp consumer: {e}");
                None
            }
        }
    }
}

/// Declares an exclusive, auto-delete queue (`name` empty: server-named); returns its name.
async fn private_queue(channel: &Channel, name: &str) -> lapin::Result<ShortString> {
    let q = channel
        .queue_declare(
            name.into(),
            QueueDeclareOptions {
                exclusive: true,
                auto_delete: true,
                ..QueueDeclareOptions::default()
            },
            FieldTable::default(),
        )
        .await?;
    Ok(q.name().clone())
}

/// Consumes `queue` with automatic acknowledgement (no_ack: the best-effort setting).
async fn consume_no_ack(
    channel: &Channel,
    queue: ShortString,
    exclusive: bool,
) -> lapin::Result<lapin::Consumer> {
    channel
        .basic_consume(
            queue,
            "".into(),
            BasicConsumeOptions {
                no_ack: true,
                exclusive,
                ..BasicConsumeOptions::default()
            },
            FieldTable::default(),
        )
        .await
}

/// RabbitMQ's pseudo-queue for direct reply-to.
const REPLY_TO: &str = "amq.rabbitmq.reply-to";

/// Connects as guest/guest to the default vhost.
async fn connect(target: &Target, name: &str) -> anyhow::Result<Connection> {
    let uri = format!("amqp://guest:guest@{}/%2f", target.addr());
    let props = ConnectionProperties::default().with_connection_name(name.into());
    Connection::connect(&uri, props)
        .await
        .with_context(|| format!("connecting to {target}"))
}

async fn rpc_channel(target: &Target, name: &str) -> anyhow::Result<(Connection, Channel)> {
    let conn = connect(target, name).await?;
    let channel = conn.create_channel().await?;
    Ok((conn, channel))
}

/// The RPC server: consumes a queue (auto-ack) and publishes each answer to the request's
/// `reply_to` through the default exchange, with the request's correlation id.
pub(crate) struct RpcServer {
    conn: Connection,
    task: tokio::task::JoinHandle<()>,
}

impl RpcServer {
    pub(crate) async fn start(
        target: &Target,
        queue: &str,
        handler: fn(&[u8]) -> Bytes,
    ) -> anyhow::Result<RpcServer> {
        let (conn, channel) = rpc_channel(target, "bench-rpc-server").await?;
        let queue = private_queue(&channel, queue).await?;
        let mut consumer = consume_no_ack(&channel, queue, false).await?;
        let task = tokio::spawn(async move {
            while let Some(Ok(d)) = consumer.next().await {
                let Some(reply_to) = d.properties.reply_to().clone() else {
                    continue;
                };
                let mut props = BasicProperties::default();
                if let Some(id) = d.properties.correlation_id().clone() {
                    props = props.with_correlation_id(id);
                }
                let answer = handler(&d.data);
                let sent = channel
                    .basic_publish(
                        "".into(),
                        reply_to,
                        BasicPublishOptions::default(),
                        &answer,
                        props,
                    )
                    .await;
                if sent.is_err() {
                    break;
                }
            }
        });
        Ok(RpcServer { conn, task })
    }

    pub(crate) async fn close(self) {
        self.task.abort();
        let _ = self.conn.close(200, "bye".into()).await;
    }
}

/// An RPC caller: consumes `amq.rabbitmq.reply-to` (no-ack, as RabbitMQ requires) and
/// publishes each request to the server's queue with `reply_to` set to it.
pub(crate) struct RpcCaller {
    conn: Connection,
    channel: Channel,
    replies: lapin::Consumer,
    queue: String,
}

impl RpcCaller {
    pub(crate) async fn connect(target: &Target, queue: &str) -> anyhow::Result<RpcCaller> {
        let (conn, channel) = rpc_channel(target, "bench-rpc-caller").await?;
        let replies = consume_no_ack(&channel, REPLY_TO.into(), false).await?;
        Ok(RpcCaller {
            conn,
            channel,
            replies,
            queue: queue.to_string(),
        })
    }

    pub(crate) async fn call(&mut self, req: &[u8]) -> anyhow::Result<Bytes> {
        self.channel
            .basic_publish(
                "".into(),
                self.queue.as_str().into(),
                BasicPublishOptions::default(),
                req,
                BasicProperties::default().with_reply_to(REPLY_TO.into()),
            )
            .await?;
        let d = self
            .replies
            .next()
            .await
            .context("amqp: the reply consumer ended")??;
        Ok(Bytes::from(d.data))
    }

    pub(crate) async fn close(self) {
        let _ = self.conn.close(200, "bye".into()).await;
    }
}
