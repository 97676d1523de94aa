//! AMQP 0-9-1 driver over the workspace's own codec (`amqp://HOST:PORT?client=hayate`,
//! login guest/guest): a small client that costs little per message, so that a throughput
//! figure measures the broker rather than the client (lapin, the default AMQP client, takes
//! most of a 2-core machine at 200k msg/s). Always compiled in.
//!
//! The same model as the lapin driver: publications to `amq.topic` with the key's `/` turned
//! into `.`; a subscription is a server-named exclusive auto-delete queue bound with that
//! routing key and consumed with no-ack; one channel per connection.
//!
//! - Writes: frames are encoded into one buffer that a writer task sends with one
//!   `write_all` per batch; a publisher waits while more than [`HIGH_WATER`] bytes are
//!   buffered.
//! - Synchronous methods (declare, bind, consume, the flush's passive declare) are sent one
//!   at a time; the reader hands their answers back in order.
//! - Flush: a passive `exchange.declare` of `amq.topic`: the server handles a channel's
//!   methods in order, so its answer means everything sent before was routed.
//! - A channel.close or connection.close from the server is trouble and fails the point.
//! - `durable=1`: the at-least-once setting. Publications are persistent (delivery mode 2)
//!   on a channel in confirm mode, at most [`CONFIRM_WINDOW`] unconfirmed; a flush waits for
//!   every confirm. A subscription is a durable queue named `bench-durable.<routing key>`
//!   (purged when subscribed, deleted when the connection closes), consumed with
//!   acknowledgements (one `multiple` ack per [`ACK_EVERY`] deliveries).
//!
//! # Layout
//! - this module: the pub/sub connection ([`AmqpcConn`], [`AmqpcSub`]) and its reader task;
//! - `wire`: the handshake, publishing's frames, and putting deliveries back together from
//!   their frames (shared with `rpc`);
//! - `rpc`: direct reply-to request/reply ([`RpcServer`], [`RpcCaller`], [`BlockingCaller`]),
//!   each end owning its socket (Tokio, or blocking with `io=blocking`).

use std::collections::HashMap;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, bail};
use bytes::{Bytes, BytesMut};
use hayate_amqp::{FieldTable, Frame, FrameDecoder, Method, ShortStr};
use hayate_core::sync::lock;
use tokio::io::AsyncReadExt;
use tokio::sync::mpsc;

use crate::target::Target;

mod rpc;
mod wire;

pub(crate) use rpc::{BlockingCaller, RpcCaller, RpcServer};
use wire::{Assembled, Assembly, Incoming, Opened, encode_publish, open};

/// The client library, for records.
pub(crate) const CLIENT: &str = concat!("hayate-amqp client ", env!("CARGO_PKG_VERSION"));

const HIGH_WATER: usize = 1 << 20;
/// Unconfirmed publications at most (`durable=1`).
const CONFIRM_WINDOW: u64 = 4096;
/// A consumer's acknowledgement covers this many deliveries (`durable=1`).
const ACK_EVERY: u64 = 64;
const SUB_CAPACITY: usize = 64 << 10;
const CHANNEL: u16 = 1;
const FRAME_MAX: u32 = 131_072;

/// Publisher confirms (`durable=1`).
#[derive(Default)]
struct Confirms {
    published: std::sync::atomic::AtomicU64,
    acked: std::sync::atomic::AtomicU64,
    nacked: std::sync::atomic::AtomicU64,
    changed: tokio::sync::Notify,
}

struct Shared {
    buf: super::wbuf::WriteBuf,
    /// `durable=1`.
    durable: bool,
    confirms: Confirms,
    /// Durable queues declared (deleted at close).
    queues: Mutex<Vec<ShortStr>>,
    /// Consumer tag → its messages' bodies.
    subs: Mutex<HashMap<Bytes, (mpsc::Sender<Delivery>, bool)>>,
    frame_max: usize,
    server: Option<String>,
}

#[derive(Clone)]
pub(crate) struct AmqpcConn {
    shared: Arc<Shared>,
    /// Answers to synchronous methods, in order; one caller at a time.
    replies: Arc<tokio::sync::Mutex<mpsc::Receiver<Method>>>,
    tasks: Arc<Vec<tokio::task::AbortHandle>>,
}

pub(crate) struct AmqpcSub(mpsc::Receiver<Delivery>);

/// A message received: its body, and the properties RPC needs.
pub(crate) struct Delivery {
    pub(crate) body: Bytes,
    pub(crate) reply_to: Option<ShortStr>,
    pub(crate) correlation_id: Option<ShortStr>,
}

impl AmqpcConn {
    pub(crate) async fn connect(target: &Target, timeout: Duration) -> anyhow::Result<AmqpcConn> {
        let Opened {
            mut rd,
            wr,
            mut buf,
            frame_max: fm,
            server,
        } = open(target, timeout).await?;
        let durable = target.param("durable") == Some("1");
        let shared = Arc::new(Shared {
            buf: super::wbuf::WriteBuf::new(HIGH_WATER),
            durable,
            confirms: Confirms::default(),
            queues: Mutex::default(),
            subs: Mutex::default(),
            frame_max: fm as usize,
            server,
        });
        let (tx, rx) = mpsc::channel(16);
        let reader = {
            let shared = shared.clone();
            let dec = FrameDecoder::new(fm.max(FRAME_MAX));
            tokio::spawn(async move {
                let e = read_loop(&mut rd, &mut buf, &dec, &shared, tx).await;
                shared.buf.close();
                lock(&shared.subs).clear();
                if let Err(e) = e {
                    shared.buf.fail(format!("amqp: {e:#}"));
                }
            })
        };
        let writer = super::wbuf::spawn_writer(shared.clone(), wr, |s| &s.buf, "amqp");
        let c = AmqpcConn {
            shared,
            replies: Arc::new(tokio::sync::Mutex::new(rx)),
            tasks: Arc::new(vec![reader.abort_handle(), writer]),
        };
        if durable {
            match c
                .call(Method::ConfirmSelect { no_wait: false }, timeout)
                .await?
            {
                Method::ConfirmSelectOk {} => {}
                m => bail!("expected confirm.select-ok, got {}", m.name()),
            }
        }
        Ok(c)
    }

    /// Waits until at most `outstanding` publications are unconfirmed (`durable=1`).
    async fn wait_confirms(&self, outstanding: u64) -> anyhow::Result<()> {
        use std::sync::atomic::Ordering::Acquire;
        let c = &self.shared.confirms;
        loop {
            let changed = c.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            if c.nacked.load(Acquire) > 0 {
                bail!("amqp: the broker refused (nacked) a publication");
            }
            if c.published.load(Acquire) <= c.acked.load(Acquire) + outstanding {
                return Ok(());
            }
            if let Some(t) = self.trouble() {
                bail!("{t}");
            }
            if tokio::time::timeout(Duration::from_secs(30), changed)
                .await
                .is_err()
            {
                bail!("amqp: no publisher confirm within 30 s");
            }
        }
    }

    async fn write(&self, f: impl Fn(&mut BytesMut)) -> anyhow::Result<()> {
        if !self.shared.buf.write(f).await {
            bail!(
                "{}",
                self.trouble()
                    .unwrap_or_else(|| "amqp: connection closed".into())
            );
        }
        Ok(())
    }

    /// A synchronous method and its answer.
    async fn call(&self, m: Method, timeout: Duration) -> anyhow::Result<Method> {
        let mut replies = self.replies.lock().await;
        let name = m.name();
        self.write(|out| Frame::Method(CHANNEL, m.clone()).encode(out))
            .await?;
        match tokio::time::timeout(timeout, replies.recv()).await {
            Ok(Some(m)) => Ok(m),
            Ok(None) => bail!(
                "{}",
                self.trouble()
                    .unwrap_or_else(|| format!("amqp: connection closed waiting for {name}"))
            ),
            Err(_) => bail!("amqp: no answer to {name} within {timeout:?}"),
        }
    }

    pub(crate) async fn publish(&self, routing_key: &str, payload: Bytes) -> anyhow::Result<()> {
        if !self.shared.durable {
            return self
                .publish_to("amq.topic", routing_key, Default::default(), &payload)
                .await;
        }
        self.wait_confirms(CONFIRM_WINDOW - 1).await?;
        let props = hayate_amqp::BasicProperties {
            delivery_mode: Some(2),
            ..Default::default()
        };
        self.shared
            .confirms
            .published
            .fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        self.publish_to("amq.topic", routing_key, props, &payload)
            .await
    }

    /// basic.publish to `exchange` with `props` (RPC: reply-to, correlation id).
    pub(crate) async fn publish_to(
        &self,
        exchange: &str,
        routing_key: &str,
        props: hayate_amqp::BasicProperties,
        payload: &[u8],
    ) -> anyhow::Result<()> {
        let (x, rk) = (ShortStr::lit(exchange), ShortStr::lit(routing_key));
        let fm = self.shared.frame_max;
        self.write(|out| encode_publish(&x, &rk, &props, payload, fm, out))
            .await
    }

    pub(crate) async fn subscribe(&self, key: &str) -> anyhow::Result<AmqpcSub> {
        const T: Duration = Duration::from_secs(10);
        // A server-named queue, or (durable=1) a durable queue of the key's own, emptied.
        let q = if self.shared.durable {
            let name = format!("bench-durable.{}", key.replace('/', "."));
            let q = self.declare_queue(&name, true).await?;
            self.call(
                Method::QueuePurge {
                    ticket: 0,
                    queue: q.clone(),
                    no_wait: false,
                },
                T,
            )
            .await?;
            lock(&self.shared.queues).push(q.clone());
            q
        } else {
            self.declare("").await?
        };
        self.call(
            Method::QueueBind {
                ticket: 0,
                queue: q.clone(),
                exchange: ShortStr::lit("amq.topic"),
                routing_key: ShortStr::lit(&key.replace('/', ".")),
                no_wait: false,
                arguments: FieldTable::default(),
            },
            T,
        )
        .await?;
        self.consume(q, !self.shared.durable).await
    }

    /// Declares queue `name` (exclusive, auto-delete; `""`: the server names it).
    pub(crate) async fn declare(&self, name: &str) -> anyhow::Result<ShortStr> {
        self.declare_queue(name, false).await
    }

    /// Declares queue `name`: `durable` (shared, kept), or exclusive and auto-delete.
    async fn declare_queue(&self, name: &str, durable: bool) -> anyhow::Result<ShortStr> {
        match self
            .call(
                Method::QueueDeclare {
                    ticket: 0,
                    queue: ShortStr::lit(name),
                    passive: false,
                    durable,
                    exclusive: !durable,
                    auto_delete: !durable,
                    no_wait: false,
                    arguments: FieldTable::default(),
                },
                Duration::from_secs(10),
            )
            .await?
        {
            Method::QueueDeclareOk { queue, .. } => Ok(queue),
            m => bail!("expected queue.declare-ok, got {}", m.name()),
        }
    }

    /// Consumes `queue`, with no-ack or (`no_ack` false) acknowledgements.
    pub(crate) async fn consume(&self, queue: ShortStr, no_ack: bool) -> anyhow::Result<AmqpcSub> {
        let tag = ShortStr::lit(&format!("c-{queue}"));
        let (tx, rx) = mpsc::channel(SUB_CAPACITY);
        lock(&self.shared.subs).insert(tag.bytes().clone(), (tx, !no_ack));
        self.call(
            Method::BasicConsume {
                ticket: 0,
                queue,
                consumer_tag: tag,
                no_local: false,
                no_ack,
                exclusive: false,
                no_wait: false,
                arguments: FieldTable::default(),
            },
            Duration::from_secs(10),
        )
        .await?;
        Ok(AmqpcSub(rx))
    }

    pub(crate) async fn flush(&self, timeout: Duration) -> anyhow::Result<()> {
        if self.shared.durable {
            tokio::time::timeout(timeout, self.wait_confirms(0))
                .await
                .context("amqp: waiting for publisher confirms")??;
        }
        self.call(
            Method::ExchangeDeclare {
                ticket: 0,
                exchange: ShortStr::lit("amq.topic"),
                kind: ShortStr::lit("topic"),
                passive: true,
                durable: true,
                auto_delete: false,
                internal: false,
                no_wait: false,
                arguments: FieldTable::default(),
            },
            timeout,
        )
        .await
        .map(|_| ())
    }

    pub(crate) fn trouble(&self) -> Option<String> {
        self.shared.buf.trouble()
    }

    pub(crate) fn server_version(&self) -> Option<String> {
        self.shared.server.clone()
    }

    pub(crate) async fn close(self) {
        let queues = std::mem::take(&mut *lock(&self.shared.queues));
        for q in queues {
            let _ = self
                .call(
                    Method::QueueDelete {
                        ticket: 0,
                        queue: q,
                        if_unused: false,
                        if_empty: false,
                        no_wait: false,
                    },
                    Duration::from_secs(5),
                )
                .await;
        }
        let bye = Method::ConnectionClose {
            reply_code: 200,
            reply_text: ShortStr::lit("bye"),
            class_id: 0,
            method_id: 0,
        };
        let _ = self
            .write(|out| Frame::Method(0, bye.clone()).encode(out))
            .await;
        tokio::time::sleep(Duration::from_millis(20)).await;
        for t in self.tasks.iter() {
            t.abort();
        }
    }
}

impl AmqpcSub {
    pub(crate) async fn next(&mut self) -> Option<Bytes> {
        self.0.recv().await.map(|d| d.body)
    }
}

async fn read_loop(
    rd: &mut tokio::net::tcp::OwnedReadHalf,
    buf: &mut BytesMut,
    dec: &FrameDecoder,
    shared: &Shared,
    replies: mpsc::Sender<Method>,
) -> anyhow::Result<()> {
    let mut asm = Assembly::default();
    loop {
        while let Some(f) = dec.decode(buf)? {
            let f = match asm.frame(f) {
                Assembled::Delivery(i, body) => {
                    deliver(shared, i, body).await;
                    continue;
                }
                Assembled::Partial => continue,
                Assembled::Other(f) => f,
            };
            match f {
                Frame::Method(
                    _,
                    Method::ChannelClose {
                        reply_code,
                        reply_text,
                        ..
                    },
                )
                | Frame::Method(
                    _,
                    Method::ConnectionClose {
                        reply_code,
                        reply_text,
                        ..
                    },
                ) => bail!("closed by the server: {reply_code} {reply_text}"),
                // Publisher confirms (both brokers confirm in order).
                Frame::Method(_, Method::BasicAck { delivery_tag, .. }) => {
                    let c = &shared.confirms;
                    c.acked
                        .fetch_max(delivery_tag, std::sync::atomic::Ordering::AcqRel);
                    c.changed.notify_waiters();
                }
                Frame::Method(_, Method::BasicNack { delivery_tag, .. }) => {
                    let c = &shared.confirms;
                    c.nacked.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
                    c.acked
                        .fetch_max(delivery_tag, std::sync::atomic::Ordering::AcqRel);
                    c.changed.notify_waiters();
                }
                Frame::Method(_, m) => {
                    if replies.send(m).await.is_err() {
                        return Ok(());
                    }
                }
                // Content frames are the assembly's.
                Frame::Heartbeat | Frame::Header(..) | Frame::Body(..) => {}
            }
        }
        if buf.capacity() - buf.len() < 16 << 10 {
            buf.reserve(64 << 10);
        }
        if rd.read_buf(buf).await? == 0 {
            bail!("connection closed by the server");
        }
    }
}

async fn deliver(shared: &Shared, i: Incoming, body: Bytes) {
    let Some((tx, acked)) = lock(&shared.subs).get(&i.tag).cloned() else {
        return;
    };
    // Consumed with acknowledgements: one per ACK_EVERY deliveries.
    if acked && i.delivery_tag.is_multiple_of(ACK_EVERY) {
        let ack = Method::BasicAck {
            delivery_tag: i.delivery_tag,
            multiple: true,
        };
        shared
            .buf
            .write(|out| Frame::Method(CHANNEL, ack.clone()).encode(out))
            .await;
    }
    let _ = tx
        .send(Delivery {
            body,
            reply_to: i.reply_to,
            correlation_id: i.correlation_id,
        })
        .await;
}
