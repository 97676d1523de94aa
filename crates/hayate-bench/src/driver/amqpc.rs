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

use std::collections::HashMap;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, bail};
use bytes::{Bytes, BytesMut};
use hayate_amqp::frame::PROTOCOL_HEADER;
use hayate_amqp::{ContentHeader, FieldTable, Frame, FrameDecoder, Method, ShortStr};
use hayate_core::sync::lock;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc;

use crate::target::Target;

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

/// Reads frames until `want` says one is the answer.
async fn expect(
    rd: &mut tokio::net::tcp::OwnedReadHalf,
    buf: &mut BytesMut,
    dec: &FrameDecoder,
    what: &str,
) -> anyhow::Result<Method> {
    loop {
        if let Some(f) = dec.decode(buf)? {
            match f {
                Frame::Method(
                    _,
                    Method::ConnectionClose {
                        reply_code,
                        reply_text,
                        ..
                    },
                ) => bail!("connection.close {reply_code} {reply_text} (waiting for {what})"),
                Frame::Method(_, m) => return Ok(m),
                _ => continue,
            }
        }
        if rd.read_buf(buf).await? == 0 {
            bail!("connection closed waiting for {what}");
        }
    }
}

fn frame(m: Method, channel: u16) -> BytesMut {
    let mut b = BytesMut::new();
    Frame::Method(channel, m).encode(&mut b);
    b
}

/// A connection after its handshake (channel [`CHANNEL`] open), before any task runs.
struct Opened {
    rd: tokio::net::tcp::OwnedReadHalf,
    wr: tokio::net::tcp::OwnedWriteHalf,
    /// What was read past the handshake.
    buf: BytesMut,
    frame_max: u32,
    server: Option<String>,
}

/// Connects to `target`, logs in (guest/guest) and opens channel [`CHANNEL`].
async fn open(target: &Target, timeout: Duration) -> anyhow::Result<Opened> {
    let (mut rd, mut wr) = crate::driver::connect_tcp(target, timeout).await?;
    let mut buf = BytesMut::with_capacity(64 << 10);
    let dec = FrameDecoder::new(FRAME_MAX);
    let server = tokio::time::timeout(timeout, async {
        wr.write_all(&PROTOCOL_HEADER).await?;
        let start = expect(&mut rd, &mut buf, &dec, "connection.start").await?;
        let server = match &start {
            Method::ConnectionStart {
                server_properties, ..
            } => server_properties
                .get("version")
                .and_then(|v| v.as_str())
                .map(str::to_string),
            m => bail!("expected connection.start, got {}", m.name()),
        };
        let ok = Method::ConnectionStartOk {
            client_properties: FieldTable::default(),
            mechanism: ShortStr::lit("PLAIN"),
            response: Bytes::from_static(b"\0guest\0guest"),
            locale: ShortStr::lit("en_US"),
        };
        wr.write_all(&frame(ok, 0)).await?;
        let (channel_max, frame_max) = match expect(&mut rd, &mut buf, &dec, "tune").await? {
            Method::ConnectionTune {
                channel_max,
                frame_max,
                ..
            } => (channel_max, frame_max),
            m => bail!("expected connection.tune, got {}", m.name()),
        };
        let fm = if frame_max == 0 {
            FRAME_MAX
        } else {
            frame_max.min(FRAME_MAX)
        };
        let mut out = frame(
            Method::ConnectionTuneOk {
                channel_max: channel_max.min(8),
                frame_max: fm,
                heartbeat: 0,
            },
            0,
        );
        out.extend_from_slice(&frame(
            Method::ConnectionOpen {
                virtual_host: ShortStr::lit("/"),
                capabilities: ShortStr::lit(""),
                insist: false,
            },
            0,
        ));
        out.extend_from_slice(&frame(
            Method::ChannelOpen {
                out_of_band: ShortStr::lit(""),
            },
            CHANNEL,
        ));
        wr.write_all(&out).await?;
        for what in ["connection.open-ok", "channel.open-ok"] {
            expect(&mut rd, &mut buf, &dec, what).await?;
        }
        anyhow::Ok((server, fm))
    })
    .await
    .with_context(|| format!("{target}: no AMQP handshake within {timeout:?}"))??;
    let (server, frame_max) = server;
    Ok(Opened {
        rd,
        wr,
        buf,
        frame_max,
        server,
    })
}

/// Appends a basic.publish of `payload` to `exchange` with `routing_key` and `props`: the
/// method, the content header and the body in frames of at most `frame_max` bytes.
fn encode_publish(
    exchange: &ShortStr,
    routing_key: &ShortStr,
    props: &hayate_amqp::BasicProperties,
    payload: &[u8],
    frame_max: usize,
    out: &mut BytesMut,
) {
    Frame::Method(
        CHANNEL,
        Method::BasicPublish {
            ticket: 0,
            exchange: exchange.clone(),
            routing_key: routing_key.clone(),
            mandatory: false,
            immediate: false,
        },
    )
    .encode(out);
    Frame::Header(
        CHANNEL,
        Box::new(ContentHeader {
            body_size: payload.len() as u64,
            properties: props.clone(),
        }),
    )
    .encode(out);
    for part in payload.chunks(frame_max.saturating_sub(8).max(1)) {
        Frame::encode_body(CHANNEL, part, out);
    }
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

/// RabbitMQ's pseudo-queue for direct reply-to.
const REPLY_TO: &str = "amq.rabbitmq.reply-to";

/// The framing state of an RPC end: what was read and is still to be decoded, what is to be
/// written, and the delivery being put together. Shared by the Tokio end ([`Direct`]) and the
/// blocking one ([`Blocking`]), which differ only in how they read and write.
struct Framing {
    buf: BytesMut,
    out: BytesMut,
    dec: FrameDecoder,
    frame_max: usize,
    /// The delivery whose frames are arriving.
    asm: Assembly,
}

impl Framing {
    /// The next delivery complete in what was read, if any.
    fn take(&mut self) -> anyhow::Result<Option<Delivery>> {
        while let Some(f) = self.dec.decode(&mut self.buf)? {
            match self.asm.frame(f) {
                Assembled::Delivery(i, body) => return Ok(Some(i.done(body))),
                Assembled::Other(Frame::Method(_, m)) => {
                    closed(m)?;
                }
                Assembled::Partial | Assembled::Other(_) => {}
            }
        }
        Ok(None)
    }

    /// The next method in what was read, if any (a synchronous method's answer).
    fn method(&mut self) -> anyhow::Result<Option<Method>> {
        while let Some(f) = self.dec.decode(&mut self.buf)? {
            if let Frame::Method(_, m) = f {
                return closed(m).map(Some);
            }
        }
        Ok(None)
    }

    /// Whether what was read holds connection.close-ok.
    fn close_ok(&mut self) -> anyhow::Result<bool> {
        while let Some(f) = self.dec.decode(&mut self.buf)? {
            if let Frame::Method(_, Method::ConnectionCloseOk {}) = f {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// Appends connection.close.
    fn close(&mut self) {
        Frame::Method(
            0,
            Method::ConnectionClose {
                reply_code: 200,
                reply_text: ShortStr::lit("bye"),
                class_id: 0,
                method_id: 0,
            },
        )
        .encode(&mut self.out);
    }

    /// Appends a request to `queue`, its reply-to direct reply-to.
    fn request(&mut self, queue: &ShortStr, req: &[u8]) {
        let props = hayate_amqp::BasicProperties {
            reply_to: Some(ShortStr::lit(REPLY_TO)),
            ..Default::default()
        };
        let x = ShortStr::lit("");
        encode_publish(&x, queue, &props, req, self.frame_max, &mut self.out);
    }

    /// Appends the answer to every complete request read so far (to its reply-to, through
    /// the default exchange, with its correlation id); requests without a reply-to are
    /// dropped.
    fn answer_all(&mut self, handler: fn(&[u8]) -> Bytes) -> anyhow::Result<()> {
        let x = ShortStr::lit("");
        while let Some(r) = self.take()? {
            let Some(reply_to) = r.reply_to else { continue };
            let props = hayate_amqp::BasicProperties {
                correlation_id: r.correlation_id,
                ..Default::default()
            };
            let answer = handler(&r.body);
            encode_publish(
                &x,
                &reply_to,
                &props,
                &answer,
                self.frame_max,
                &mut self.out,
            );
        }
        Ok(())
    }
}

/// An RPC end that owns its socket: no reader or writer task, so a call costs the client
/// no wake-up of another task (the method of rpc-bench: one request in flight per
/// connection, the caller writes it and reads its answer itself). Both brokers are measured
/// with it.
struct Direct {
    rd: tokio::net::tcp::OwnedReadHalf,
    wr: tokio::net::tcp::OwnedWriteHalf,
    f: Framing,
}

impl Direct {
    async fn connect(target: &Target) -> anyhow::Result<Direct> {
        let o = open(target, Duration::from_secs(10)).await?;
        Ok(Direct {
            rd: o.rd,
            wr: o.wr,
            f: Framing {
                buf: o.buf,
                out: BytesMut::with_capacity(16 << 10),
                dec: FrameDecoder::new(o.frame_max.max(FRAME_MAX)),
                frame_max: o.frame_max as usize,
                asm: Assembly::default(),
            },
        })
    }

    /// Sends what `out` holds.
    async fn send(&mut self) -> anyhow::Result<()> {
        self.wr.write_all(&self.f.out).await?;
        self.f.out.clear();
        Ok(())
    }

    /// Reads more; an error at the end of the stream.
    async fn fill(&mut self) -> anyhow::Result<()> {
        let buf = &mut self.f.buf;
        if buf.capacity() - buf.len() < 4 << 10 {
            buf.reserve(64 << 10);
        }
        if self.rd.read_buf(buf).await? == 0 {
            bail!("amqp: connection closed by the server");
        }
        Ok(())
    }

    /// A synchronous method and its answer (before any delivery can arrive).
    async fn call(&mut self, m: Method) -> anyhow::Result<Method> {
        let name = m.name();
        Frame::Method(CHANNEL, m).encode(&mut self.f.out);
        self.send().await?;
        tokio::time::timeout(Duration::from_secs(10), async {
            loop {
                if let Some(m) = self.f.method()? {
                    return Ok(m);
                }
                self.fill().await?;
            }
        })
        .await
        .with_context(|| format!("amqp: no answer to {name}"))?
    }

    /// Consumes `queue` with no-ack.
    async fn consume(&mut self, queue: ShortStr) -> anyhow::Result<()> {
        let tag = ShortStr::lit(&format!("c-{queue}"));
        match self
            .call(Method::BasicConsume {
                ticket: 0,
                queue,
                consumer_tag: tag,
                no_local: false,
                no_ack: true,
                exclusive: false,
                no_wait: false,
                arguments: FieldTable::default(),
            })
            .await?
        {
            Method::BasicConsumeOk { .. } => Ok(()),
            m => bail!("expected basic.consume-ok, got {}", m.name()),
        }
    }

    /// Closes the connection (connection.close, then a short wait for its answer).
    async fn close(mut self) {
        self.f.close();
        let _ = tokio::time::timeout(Duration::from_secs(1), async {
            self.send().await?;
            while !self.f.close_ok()? {
                self.fill().await?;
            }
            anyhow::Ok(())
        })
        .await;
    }
}

/// An RPC end on a blocking socket (`io=blocking`), for a thread of its own: a reply wakes
/// the thread blocked in `read` directly, where a Tokio end is woken by `epoll_wait` and
/// then reads. The same client calls as [`Direct`] (made by it: the handshake and the
/// consume are done before the socket is taken over), the same framing.
struct Blocking {
    s: std::net::TcpStream,
    f: Framing,
    /// What one read takes at most.
    scratch: Box<[u8]>,
    /// The read timeout set on `s`.
    timeout: Option<Duration>,
}

impl Blocking {
    /// Takes `d`'s socket over (out of the Tokio runtime), reads timing out after `timeout`.
    fn new(d: Direct, timeout: Duration) -> anyhow::Result<Blocking> {
        let s = d.rd.reunite(d.wr)?.into_std()?;
        s.set_nonblocking(false)?;
        s.set_read_timeout(Some(timeout))?;
        Ok(Blocking {
            s,
            f: d.f,
            scratch: vec![0; 64 << 10].into_boxed_slice(),
            timeout: Some(timeout),
        })
    }

    /// Sets the read timeout (a system call only when it changes).
    fn set_timeout(&mut self, t: Duration) -> std::io::Result<()> {
        if self.timeout != Some(t) {
            self.s.set_read_timeout(Some(t))?;
            self.timeout = Some(t);
        }
        Ok(())
    }

    /// Sends what `out` holds.
    fn send(&mut self) -> std::io::Result<()> {
        use std::io::Write;
        (&self.s).write_all(&self.f.out)?;
        self.f.out.clear();
        Ok(())
    }

    /// Reads more: `Ok(false)` when the read timed out; an error at the end of the stream.
    fn fill(&mut self) -> anyhow::Result<bool> {
        use std::io::{ErrorKind, Read};
        match (&self.s).read(&mut self.scratch) {
            Ok(0) => bail!("amqp: connection closed by the server"),
            Ok(n) => {
                self.f.buf.extend_from_slice(&self.scratch[..n]);
                Ok(true)
            }
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => Ok(false),
            Err(e) if e.kind() == ErrorKind::Interrupted => Ok(true),
            Err(e) => Err(e.into()),
        }
    }

    /// Closes the connection (connection.close, then up to a second for its answer).
    fn close(mut self) {
        self.f.close();
        let _ = (|| -> anyhow::Result<()> {
            self.set_timeout(Duration::from_secs(1))?;
            self.send()?;
            while !self.f.close_ok()? {
                if !self.fill()? {
                    return Ok(());
                }
            }
            Ok(())
        })();
    }
}

/// `m`, or an error when it is the server closing the channel or the connection.
fn closed(m: Method) -> anyhow::Result<Method> {
    match m {
        Method::ChannelClose {
            reply_code,
            reply_text,
            ..
        }
        | Method::ConnectionClose {
            reply_code,
            reply_text,
            ..
        } => bail!("amqp: closed by the server: {reply_code} {reply_text}"),
        m => Ok(m),
    }
}

/// The RPC server: consumes `queue` (no-ack) and publishes each answer to the request's
/// reply-to through the default exchange, with its correlation id. One task (or, with
/// `blocking`, one thread on a blocking socket) reads the requests and answers every
/// request of a read with one write.
pub(crate) struct RpcServer(ServerEnd);

enum ServerEnd {
    Task(
        tokio::task::JoinHandle<()>,
        Option<tokio::sync::oneshot::Sender<()>>,
    ),
    Thread(
        std::thread::JoinHandle<()>,
        Arc<std::sync::atomic::AtomicBool>,
    ),
}

/// How long a blocking server's read waits before it looks whether it is to stop.
const SERVER_POLL: Duration = Duration::from_millis(50);

impl RpcServer {
    pub(crate) async fn start(
        target: &Target,
        queue: &str,
        handler: fn(&[u8]) -> Bytes,
        blocking: bool,
    ) -> anyhow::Result<RpcServer> {
        let mut d = Direct::connect(target).await?;
        let q = match d
            .call(Method::QueueDeclare {
                ticket: 0,
                queue: ShortStr::lit(queue),
                passive: false,
                durable: false,
                exclusive: true,
                auto_delete: true,
                no_wait: false,
                arguments: FieldTable::default(),
            })
            .await?
        {
            Method::QueueDeclareOk { queue, .. } => queue,
            m => bail!("expected queue.declare-ok, got {}", m.name()),
        };
        d.consume(q).await?;
        if blocking {
            let mut b = Blocking::new(d, SERVER_POLL)?;
            let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
            let stopped = stop.clone();
            let thread = std::thread::Builder::new()
                .name("amqp-rpc-server".into())
                .spawn(move || {
                    let served = (|| -> anyhow::Result<()> {
                        loop {
                            b.f.answer_all(handler)?;
                            if !b.f.out.is_empty() {
                                b.send()?;
                            }
                            if stopped.load(std::sync::atomic::Ordering::Relaxed) {
                                return Ok(());
                            }
                            b.fill()?;
                        }
                    })();
                    if served.is_ok() {
                        b.close();
                    }
                })?;
            return Ok(RpcServer(ServerEnd::Thread(thread, stop)));
        }
        let (stop, mut stopped) = tokio::sync::oneshot::channel();
        let task = tokio::spawn(async move {
            let served = async {
                loop {
                    d.f.answer_all(handler)?;
                    if !d.f.out.is_empty() {
                        d.send().await?;
                    }
                    tokio::select! {
                        r = d.fill() => r?,
                        _ = &mut stopped => return anyhow::Ok(()),
                    }
                }
            };
            if served.await.is_ok() {
                d.close().await;
            }
        });
        Ok(RpcServer(ServerEnd::Task(task, Some(stop))))
    }

    pub(crate) async fn close(self) {
        match self.0 {
            ServerEnd::Task(mut task, mut stop) => {
                if let Some(s) = stop.take() {
                    let _ = s.send(());
                }
                if tokio::time::timeout(Duration::from_secs(2), &mut task)
                    .await
                    .is_err()
                {
                    task.abort();
                }
            }
            ServerEnd::Thread(thread, stop) => {
                stop.store(true, std::sync::atomic::Ordering::Relaxed);
                // It looks every SERVER_POLL and closes within a second.
                let _ = tokio::task::spawn_blocking(move || thread.join()).await;
            }
        }
    }
}

/// An RPC caller: consumes `amq.rabbitmq.reply-to` (no-ack) and publishes each request to
/// the server's queue with reply-to set to it, then reads until the answer is in.
pub(crate) struct RpcCaller {
    d: Direct,
    queue: ShortStr,
}

impl RpcCaller {
    pub(crate) async fn connect(target: &Target, queue: &str) -> anyhow::Result<RpcCaller> {
        let mut d = Direct::connect(target).await?;
        d.consume(ShortStr::lit(REPLY_TO)).await?;
        Ok(RpcCaller {
            d,
            queue: ShortStr::lit(queue),
        })
    }

    pub(crate) async fn call(&mut self, req: &[u8]) -> anyhow::Result<Bytes> {
        let d = &mut self.d;
        d.f.request(&self.queue, req);
        d.send().await?;
        loop {
            if let Some(r) = d.f.take()? {
                return Ok(r.body);
            }
            d.fill().await?;
        }
    }

    pub(crate) async fn close(self) {
        self.d.close().await;
    }
}

/// [`RpcCaller`] on a blocking socket (`io=blocking`): its calls block the calling thread.
pub(crate) struct BlockingCaller {
    b: Blocking,
    queue: ShortStr,
}

impl BlockingCaller {
    pub(crate) async fn connect(target: &Target, queue: &str) -> anyhow::Result<BlockingCaller> {
        let RpcCaller { d, queue } = RpcCaller::connect(target, queue).await?;
        Ok(BlockingCaller {
            b: Blocking::new(d, Duration::from_secs(10))?,
            queue,
        })
    }

    /// One call: an error when no answer came within `timeout`.
    pub(crate) fn call(&mut self, req: &[u8], timeout: Duration) -> anyhow::Result<Bytes> {
        let b = &mut self.b;
        b.set_timeout(timeout)?;
        b.f.request(&self.queue, req);
        b.send()?;
        loop {
            if let Some(r) = b.f.take()? {
                return Ok(r.body);
            }
            if !b.fill()? {
                bail!("amqp: no answer within {timeout:?}");
            }
        }
    }

    pub(crate) fn close(self) {
        self.b.close();
    }
}

/// A delivery being received: its consumer, body size, properties and what came so far.
struct Incoming {
    tag: Bytes,
    delivery_tag: u64,
    size: u64,
    body: BytesMut,
    reply_to: Option<ShortStr>,
    correlation_id: Option<ShortStr>,
}

impl Incoming {
    fn done(self, body: Bytes) -> Delivery {
        Delivery {
            body,
            reply_to: self.reply_to,
            correlation_id: self.correlation_id,
        }
    }
}

/// Puts deliveries back together from their frames: basic.deliver, the content header,
/// then body frames up to the size the header announced.
#[derive(Default)]
struct Assembly(Option<Incoming>);

/// What a frame made of the delivery being put together.
enum Assembled {
    /// A complete delivery and its body.
    Delivery(Incoming, Bytes),
    /// Part of one (or content of none): nothing to do yet.
    Partial,
    /// A frame that is no part of a delivery.
    Other(Frame),
}

impl Assembly {
    fn frame(&mut self, f: Frame) -> Assembled {
        match f {
            Frame::Method(
                _,
                Method::BasicDeliver {
                    consumer_tag,
                    delivery_tag,
                    ..
                },
            ) => {
                self.0 = Some(Incoming {
                    tag: consumer_tag.bytes().clone(),
                    delivery_tag,
                    size: 0,
                    body: BytesMut::new(),
                    reply_to: None,
                    correlation_id: None,
                });
                Assembled::Partial
            }
            Frame::Header(_, h) => {
                let Some(i) = &mut self.0 else {
                    return Assembled::Partial;
                };
                let h = *h;
                i.size = h.body_size;
                i.reply_to = h.properties.reply_to;
                i.correlation_id = h.properties.correlation_id;
                if i.size == 0 {
                    return self.done(Bytes::new());
                }
                Assembled::Partial
            }
            Frame::Body(_, b) => {
                let Some(i) = &mut self.0 else {
                    return Assembled::Partial;
                };
                if i.body.is_empty() && b.len() as u64 >= i.size {
                    return self.done(b);
                }
                i.body.extend_from_slice(&b);
                if (i.body.len() as u64) < i.size {
                    return Assembled::Partial;
                }
                let body = std::mem::take(&mut i.body).freeze();
                self.done(body)
            }
            other => Assembled::Other(other),
        }
    }

    fn done(&mut self, body: Bytes) -> Assembled {
        match self.0.take() {
            Some(i) => Assembled::Delivery(i, body),
            None => Assembled::Partial,
        }
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

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};
    use std::net::{TcpListener, TcpStream};
    use std::time::Instant;

    use super::*;

    /// Reads until `dec` yields a method.
    fn method(s: &mut TcpStream, buf: &mut BytesMut, dec: &FrameDecoder) -> Method {
        loop {
            if let Some(Frame::Method(_, m)) = dec.decode(buf).unwrap() {
                return m;
            }
            let mut chunk = [0u8; 4096];
            let n = s.read(&mut chunk).unwrap();
            assert!(n > 0, "the client closed during the handshake");
            buf.extend_from_slice(&chunk[..n]);
        }
    }

    fn send(s: &mut TcpStream, channel: u16, m: Method) {
        s.write_all(&frame(m, channel)).unwrap();
    }

    /// A server that does the client's handshake and consume, then `then` with its socket.
    fn server(then: fn(&mut TcpStream)) -> Target {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        std::thread::spawn(move || {
            let (mut s, _) = l.accept().unwrap();
            let mut header = [0u8; 8];
            s.read_exact(&mut header).unwrap();
            let (mut buf, dec) = (BytesMut::new(), FrameDecoder::new(FRAME_MAX));
            let start = Method::ConnectionStart {
                version_major: 0,
                version_minor: 9,
                server_properties: FieldTable::default(),
                mechanisms: Bytes::from_static(b"PLAIN"),
                locales: Bytes::from_static(b"en_US"),
            };
            send(&mut s, 0, start);
            method(&mut s, &mut buf, &dec); // start-ok
            let tune = Method::ConnectionTune {
                channel_max: 8,
                frame_max: FRAME_MAX,
                heartbeat: 0,
            };
            send(&mut s, 0, tune);
            for _ in 0..3 {
                method(&mut s, &mut buf, &dec); // tune-ok, open, channel.open
            }
            let hosts = ShortStr::lit("");
            send(&mut s, 0, Method::ConnectionOpenOk { known_hosts: hosts });
            let id = Bytes::new();
            send(&mut s, CHANNEL, Method::ChannelOpenOk { channel_id: id });
            method(&mut s, &mut buf, &dec); // basic.consume
            let tag = ShortStr::lit("c");
            send(
                &mut s,
                CHANNEL,
                Method::BasicConsumeOk { consumer_tag: tag },
            );
            then(&mut s);
        });
        Target::parse(&format!(
            "amqp://127.0.0.1:{port}?client=hayate&io=blocking"
        ))
        .unwrap()
    }

    /// The error of one call through a blocking caller, and how long it took.
    fn call_against(then: fn(&mut TcpStream)) -> (String, Duration) {
        let target = server(then);
        let rt = tokio::runtime::Runtime::new().unwrap();
        let mut c = rt.block_on(BlockingCaller::connect(&target, "q")).unwrap();
        let t = Instant::now();
        let e = c.call(b"1", Duration::from_millis(300)).unwrap_err();
        (format!("{e:#}"), t.elapsed())
    }

    #[test]
    fn a_blocking_caller_gives_up_on_a_server_that_never_answers() {
        let (e, took) = call_against(|s| {
            // Reads the request, answers nothing, keeps the connection open a while.
            let mut b = [0u8; 4096];
            let _ = s.read(&mut b);
            std::thread::sleep(Duration::from_secs(3));
        });
        assert!(e.contains("no answer within"), "{e}");
        assert!(took < Duration::from_secs(2), "{took:?}");
    }

    #[test]
    fn a_blocking_caller_refuses_garbage_and_a_close() {
        let (e, _) = call_against(|s| {
            // A frame type that does not exist, with an absurd length.
            s.write_all(&[9, 0, 1, 0xff, 0xff, 0xff, 0xff, 0xce])
                .unwrap();
            std::thread::sleep(Duration::from_secs(1));
        });
        assert!(e.contains("exceeds the maximum"), "{e}");
        let (e, took) = call_against(|s| {
            let reply_text = ShortStr::lit("NOT_FOUND - no queue 'q'");
            let close = Method::ChannelClose {
                reply_code: 404,
                reply_text,
                class_id: 60,
                method_id: 40,
            };
            send(s, CHANNEL, close);
            std::thread::sleep(Duration::from_secs(1));
        });
        assert!(e.contains("404"), "{e}");
        assert!(took < Duration::from_millis(300), "{took:?}");
        let (e, _) = call_against(|s| {
            let _ = s.shutdown(std::net::Shutdown::Both);
        });
        assert!(e.contains("closed by the server"), "{e}");
    }
}
