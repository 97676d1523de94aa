//! The connection: shared outgoing buffer, writer task, reader task.
//!
//! - this module: the connection's shared state (`Inner`) with the outgoing buffer, the
//!   handshake (`connect`), and what the [`Client`](crate::Client) handle does through it
//!   (publish, subscribe, settle, request, flush, close);
//! - `writer`: the writer task, which sends everything buffered in one (vectored) write;
//! - `reader`: the reader task, which decodes every frame of each read and hands the messages
//!   to their subscriptions, a read's worth at a time.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use hayate_core::sync::lock;
use hayate_core::{Key, KeyExpr, Message, Qos};
use hayate_io::transport::{self, Reader, Writer};
use hayate_native::{
    ConfirmOutcome, Frame, HELLO_SHM, Hello, MAX_BATCH_ITEMS, PROTOCOL_VERSION, Sub, Welcome,
    check_options, decode, encode, encode_ping, encode_pub, encode_pub_batch_head, encode_sub,
};
use tokio::io::AsyncReadExt;
use tokio::sync::{Notify, oneshot};

use crate::peer::ShmMode;
use crate::sub::{INBOX_SID, Subscription};
use crate::{ConnectOptions, Error, Result, SubscribeOptions};

mod reader;
mod writer;

use reader::read_loop;
use writer::write_loop;

/// A PUB_BATCH is closed once it holds this many bytes.
const MAX_BATCH: usize = 256 * 1024;
/// Payloads at least this large are queued by reference, not copied.
const ZERO_COPY: usize = 64 * 1024;
/// Payloads queued by reference on one key while the writer is busy go out as one
/// PUB_BATCH of at most this many bytes of items (and at most the server's largest
/// payload): one frame, one delivery to each subscriber, for several large messages.
const MAX_LARGE_BATCH: usize = 1024 * 1024;
/// A publish that finds nothing queued, nobody writing, and no such publish in the last
/// `INLINE_GAP`, is written by the publishing task itself (one non-blocking write, the rest
/// left to the writer task): an isolated message (request/reply, ping-pong) saves the
/// writer task's wake-up, while a stream of publishes (closer together than this) still
/// goes out in batches from the writer task.
const INLINE_GAP: Duration = Duration::from_micros(5);
/// Largest frame accepted from the server beyond its announced maximum payload.
const FRAME_SLACK: usize = 128 * 1024;

struct OpenBatch {
    start: usize,
    key: Key,
    /// Payloads in the batch so far (at most [`MAX_BATCH_ITEMS`]).
    items: usize,
}

/// A PUB_BATCH of payloads queued by reference, still open: its head is the chunk at
/// `head` (re-encoded as items are added), each item a 4-byte length chunk and the payload.
/// Open only while nothing follows its last payload in the queue: any other frame, a
/// seal, or the queue taken closes it.
struct OpenLargeBatch {
    head: usize,
    key: Key,
    items: usize,
    /// Bytes of the items: each payload and its 4-byte length.
    bytes: usize,
}

#[derive(Default)]
struct Out {
    /// Large payloads queued by reference, each after the tail bytes that precede it.
    chunks: VecDeque<Bytes>,
    tail: BytesMut,
    batch: Option<OpenBatch>,
    large: Option<OpenLargeBatch>,
    wake_pending: bool,
    closing: bool,
    /// Someone (the writer task, or a publisher writing inline) is writing taken data.
    writing: bool,
    /// When the last plain publish that found the queue empty was made (for
    /// [`INLINE_GAP`]).
    last_publish: Option<std::time::Instant>,
}

impl Out {
    fn len(&self) -> usize {
        self.tail.len() + self.chunks.iter().map(Bytes::len).sum::<usize>()
    }
    fn seal_tail(&mut self) {
        if !self.tail.is_empty() {
            let t = self.tail.split().freeze();
            self.chunks.push_back(t);
        }
        self.batch = None;
        self.large = None;
    }

    /// Queues `payload` (at least [`ZERO_COPY`] bytes) for `key` by reference: added to the
    /// open large batch when it is on that key, nothing follows it and it has room for
    /// `payload` within `max` bytes of items, else as a new one.
    fn push_large(&mut self, key: &Key, payload: Bytes, max: usize) {
        let item = 4 + payload.len();
        let len = Bytes::copy_from_slice(&(payload.len() as u32).to_be_bytes());
        let open = self.tail.is_empty()
            && self.large.as_ref().is_some_and(|b| {
                b.key == *key && b.items < MAX_BATCH_ITEMS && b.bytes + item <= max
            });
        match self.large.as_mut().filter(|_| open) {
            Some(b) => {
                b.items += 1;
                b.bytes += item;
                let mut head = BytesMut::new();
                encode_pub_batch_head(key, b.bytes, &mut head);
                self.chunks[b.head] = head.freeze();
            }
            None => {
                self.seal_tail();
                encode_pub_batch_head(key, item, &mut self.tail);
                let head = self.tail.split().freeze();
                self.large = Some(OpenLargeBatch {
                    head: self.chunks.len(),
                    key: key.clone(),
                    items: 1,
                    bytes: item,
                });
                self.chunks.push_back(head);
            }
        }
        self.chunks.push_back(len);
        self.chunks.push_back(payload);
    }
}

struct SubSlot {
    tx: crate::sub::SubSender,
    lost: Arc<std::sync::atomic::AtomicU64>,
}

/// Shared state of one connection.
pub(crate) struct Inner {
    pub(crate) welcome: Welcome,
    inbox: String,
    options: ConnectOptions,
    out: Mutex<Out>,
    wake_writer: Notify,
    space: Notify,
    subs: Mutex<HashMap<u32, SubSlot>>,
    next_sid: AtomicU32,
    requests: crate::sub::Requests,
    confirms: Mutex<HashMap<u64, oneshot::Sender<ConfirmOutcome>>>,
    pings: Mutex<HashMap<u64, oneshot::Sender<()>>>,
    next_token: AtomicU64,
    closed: AtomicBool,
    closed_notify: Notify,
    error: Mutex<Option<Error>>,
    writer_done: Notify,
    writer_finished: AtomicBool,
    /// The write half, for publishers writing inline (see [`INLINE_GAP`]).
    inline: Writer,
}

impl std::fmt::Debug for Inner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connection")
            .field("session", &self.welcome.session)
            .finish_non_exhaustive()
    }
}

/// Connects to `addr` (`unix:<path>`, or `[hayate://]host:port` with TCP_NODELAY) and splits
/// the stream into hayate-io's transport halves.
async fn open(addr: &str, options: &ConnectOptions) -> Result<(Reader, Writer)> {
    if let Some(path) = addr.strip_prefix("unix:") {
        let s = tokio::net::UnixStream::connect(path).await?;
        return Ok(transport::unix(s));
    }
    if let Some(hostport) = addr.strip_prefix("tls://") {
        return open_tls(hostport, options).await;
    }
    let addr = addr.strip_prefix("hayate://").unwrap_or(addr);
    let s = tokio::net::TcpStream::connect(addr).await?;
    s.set_nodelay(true)?;
    Ok(transport::tcp(s))
}

/// TLS to `hostport`, verified against `options.tls_ca`, with the host as the server name.
async fn open_tls(hostport: &str, options: &ConnectOptions) -> Result<(Reader, Writer)> {
    use rustls::pki_types::ServerName;
    let bad = |m: String| Error::Protocol(m);
    let ca = options.tls_ca.as_ref().ok_or_else(|| {
        bad("a tls:// address needs the server's CA (ConnectOptions::tls_ca, --tls-ca)".into())
    })?;
    let client = options
        .tls_client_cert
        .as_ref()
        .map(|(c, k)| (c.as_path(), k.as_path()));
    let config = transport::tls::client_config(ca, client).map_err(|e| bad(e.to_string()))?;
    let host = match hostport.rsplit_once(':') {
        Some((h, _)) => h.trim_start_matches('[').trim_end_matches(']'),
        None => hostport,
    };
    let name = ServerName::try_from(host.to_owned())
        .map_err(|e| bad(format!("server name {host:?}: {e}")))?;
    let s = tokio::net::TcpStream::connect(hostport).await?;
    s.set_nodelay(true)?;
    Ok(transport::tls::connect(s, config, name, options.connect_timeout).await?)
}

/// Splits credentials off an address: `[hayate://]user:password@host:port` → (the address
/// without them, the credentials). A `user` without `:password` logs in with an empty
/// password; a password starting `hyt_` with an empty user is a token.
pub(crate) fn split_credentials(addr: &str) -> (String, Option<crate::Auth>) {
    let (scheme, rest) = match addr.split_once("://") {
        Some((sch, r)) if sch == "hayate" || sch == "tls" => (&addr[..sch.len() + 3], r),
        _ => ("", addr),
    };
    if rest.starts_with("unix:") {
        return (addr.to_owned(), None);
    }
    let Some((cred, host)) = rest.rsplit_once('@') else {
        return (addr.to_owned(), None);
    };
    let (user, password) = cred.split_once(':').unwrap_or((cred, ""));
    let auth = if user.is_empty() && password.starts_with("hyt_") {
        crate::Auth::Token(Bytes::copy_from_slice(password.as_bytes()))
    } else {
        crate::Auth::Password {
            user: user.to_owned(),
            password: Bytes::copy_from_slice(password.as_bytes()),
        }
    };
    (format!("{scheme}{host}"), Some(auth))
}

/// Sends HELLO (with `flags`) on a fresh transport and reads WELCOME: the transport, what
/// was read past WELCOME, and WELCOME.
async fn handshake(
    mut r: Reader,
    w: Writer,
    options: &ConnectOptions,
    auth: &crate::Auth,
    flags: u16,
) -> Result<(Reader, Writer, BytesMut, Welcome)> {
    let mut b = BytesMut::new();
    encode(
        &Frame::Hello(Hello {
            version: PROTOCOL_VERSION,
            flags,
            name: truncate(&options.name, u16::MAX as usize).to_string(),
            auth: auth.encode(),
        }),
        &mut b,
    );
    transport::write_all(&*w, b.freeze()).await?;
    let mut buf = BytesMut::with_capacity(64 * 1024);
    let welcome = loop {
        match decode(&mut buf, 1 << 20).map_err(|e| Error::Protocol(e.to_string()))? {
            Some(Frame::Welcome(w)) => break w,
            Some(Frame::Err { code, message }) => return Err(Error::Server { code, message }),
            Some(other) => {
                return Err(Error::Protocol(format!("expected WELCOME, got {other:?}")));
            }
            None => {
                if r.read_buf(&mut buf).await? == 0 {
                    return Err(Error::Closed);
                }
            }
        }
    };
    Ok((r, w, buf, welcome))
}

pub(crate) async fn connect(addr: &str, options: ConnectOptions) -> Result<Arc<Inner>> {
    let (addr, from_url) = split_credentials(addr);
    let auth = match (&options.auth, from_url) {
        (crate::Auth::Anonymous, Some(a)) => a,
        (a, _) => a.clone(),
    };
    let (r, w) = open(&addr, &options).await?;
    let mode = options.shm;
    let flags = if mode == ShmMode::Off { 0 } else { HELLO_SHM };
    let (mut r, mut w, mut buf, mut welcome) = handshake(r, w, &options, &auth, flags).await?;
    let mut fanout = None;
    // Shared memory: the broker offers it to clients on its host that ask; the session on
    // the first transport only served to learn where, and closes.
    match welcome.shm.clone().filter(|o| !o.is_empty()) {
        Some(offer) => {
            // The first session ends before the second logs in: limits that count a user's
            // or an address's connections see one at a time.
            let mut b = BytesMut::new();
            encode(&Frame::Close, &mut b);
            let _ = transport::write_all(&*w, b.freeze()).await;
            w.shutdown();
            let mut sink = [0u8; 4096];
            let _ = tokio::time::timeout(options.connect_timeout, async {
                while matches!(r.read(&mut sink).await, Ok(n) if n > 0) {}
            })
            .await;
            drop(r);
            let moved = async {
                let (r2, w2, f) = transport::shm::connect(
                    &offer,
                    options.shm_geometry,
                    options.connect_timeout,
                    options.shm_in_place,
                )
                .await
                .map_err(|e| Error::Protocol(format!("shared memory: {e}")))?;
                handshake(r2, w2, &options, &auth, 0)
                    .await
                    .map(|hs| (hs, f))
            };
            (r, w, buf, welcome) = match moved.await {
                Ok((hs, f)) => {
                    fanout = f;
                    hs
                }
                // Refused (`NO`) or the rings broke before WELCOME (not a refusal by the
                // broker's session): back to the first transport, on a new connection.
                Err(e) if mode == ShmMode::Auto && !matches!(e, Error::Server { .. }) => {
                    tracing::debug!("shared memory not used: {e}");
                    let (r, w) = open(&addr, &options).await?;
                    handshake(r, w, &options, &auth, 0).await?
                }
                Err(e) => return Err(e),
            };
        }
        None if mode == ShmMode::Require => {
            return Err(Error::Protocol(
                "shared memory required, but the broker offers none to this client (not on \
                 its host, native.shm off, or at native.shm_max_connections)"
                    .into(),
            ));
        }
        None => {}
    }
    let inbox = welcome.inbox.clone();
    let inner = Arc::new(Inner {
        welcome,
        inbox,
        options,
        out: Mutex::new(Out::default()),
        wake_writer: Notify::new(),
        space: Notify::new(),
        subs: Mutex::new(HashMap::new()),
        next_sid: AtomicU32::new(1),
        requests: Mutex::new(HashMap::new()),
        confirms: Mutex::new(HashMap::new()),
        pings: Mutex::new(HashMap::new()),
        next_token: AtomicU64::new(1),
        closed: AtomicBool::new(false),
        closed_notify: Notify::new(),
        error: Mutex::new(None),
        writer_done: Notify::new(),
        writer_finished: AtomicBool::new(false),
        inline: w.clone(),
    });
    // The reply inbox, subscribed before anything else is sent.
    let inbox_expr = KeyExpr::new(&format!("{}/*", inner.inbox))?;
    inner.queue_frame(|t| {
        encode_sub(
            &Sub {
                sid: INBOX_SID,
                qos: Qos::RELIABLE,
                group: None,
                expr: inbox_expr,
            },
            t,
        )
    })?;
    tokio::spawn(write_loop(inner.clone(), w));
    tokio::spawn(read_loop(inner.clone(), r, buf, fanout));
    Ok(inner)
}

impl crate::sub::Unsubscribe for Inner {
    fn unsubscribe(&self, sid: u32) {
        Inner::unsubscribe(self, sid);
    }
}

impl Inner {
    pub(crate) fn transport_name(&self) -> &'static str {
        self.inline.name()
    }

    pub(crate) fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    pub(crate) fn last_error(&self) -> Option<Error> {
        lock(&self.error).clone()
    }

    fn closed_error(&self) -> Error {
        self.last_error().unwrap_or(Error::Closed)
    }

    fn wake(&self, out: &mut Out) {
        if !out.wake_pending {
            out.wake_pending = true;
            self.wake_writer.notify_one();
        }
    }

    /// Appends a control frame to the outgoing buffer (no back-pressure).
    fn queue_frame(&self, f: impl FnOnce(&mut BytesMut)) -> Result<()> {
        let mut out = lock(&self.out);
        if out.closing || self.is_closed() {
            return Err(self.closed_error());
        }
        out.batch = None;
        f(&mut out.tail);
        self.wake(&mut out);
        Ok(())
    }

    /// Waits while the outgoing buffer is over its limit.
    async fn wait_room(&self) -> Result<()> {
        loop {
            let room = self.space.notified();
            tokio::pin!(room);
            room.as_mut().enable();
            {
                let out = lock(&self.out);
                if self.is_closed() {
                    return Err(self.closed_error());
                }
                if out.len() < self.options.write_buffer {
                    return Ok(());
                }
            }
            room.await;
        }
    }

    fn check_size(&self, size: usize) -> Result<()> {
        if size as u64 > self.welcome.max_payload {
            return Err(Error::PayloadTooLarge {
                size,
                max: self.welcome.max_payload,
            });
        }
        Ok(())
    }

    pub(crate) async fn publish_plain(&self, key: &Key, payload: Bytes) -> Result<()> {
        self.publish_plain_opt(key, payload, true).await
    }

    /// `inline_ok: false`: never written by the publishing task (a publisher sending each
    /// message on several connections in turn, a peer node's fan-out: each connection would
    /// see gaps longer than `INLINE_GAP` and write every message with a system call of its
    /// own).
    async fn publish_plain_opt(&self, key: &Key, payload: Bytes, inline_ok: bool) -> Result<()> {
        self.check_size(payload.len())?;
        {
            let mut guard = lock(&self.out);
            if guard.closing || self.is_closed() {
                return Err(self.closed_error());
            }
            let out = &mut *guard;
            // The clock is read only when the queue is empty and nobody writes: at most
            // once per batch while publishes stream.
            let inline =
                inline_ok && out.tail.is_empty() && out.chunks.is_empty() && !out.writing && {
                    let now = std::time::Instant::now();
                    let gap = out
                        .last_publish
                        .is_none_or(|t| now.duration_since(t) >= INLINE_GAP);
                    out.last_publish = Some(now);
                    gap
                };
            if payload.len() >= ZERO_COPY {
                let max = MAX_LARGE_BATCH.min(self.welcome.max_payload as usize);
                out.push_large(key, payload, max);
            } else {
                let extend = match &out.batch {
                    Some(b) => {
                        b.key == *key
                            && b.items < MAX_BATCH_ITEMS
                            && out.tail.len() - b.start + payload.len() < MAX_BATCH
                    }
                    None => false,
                };
                if extend {
                    let start = out.batch.as_mut().map_or(0, |b| {
                        b.items += 1;
                        b.start
                    });
                    out.tail.put_u32(payload.len() as u32);
                    out.tail.extend_from_slice(&payload);
                    let len = (out.tail.len() - start - 4) as u32;
                    out.tail[start..start + 4].copy_from_slice(&len.to_be_bytes());
                } else {
                    let start = out.tail.len();
                    encode_pub_batch_head(key, 4 + payload.len(), &mut out.tail);
                    out.tail.put_u32(payload.len() as u32);
                    out.tail.extend_from_slice(&payload);
                    out.batch = Some(OpenBatch {
                        start,
                        key: key.clone(),
                        items: 1,
                    });
                }
            }
            if inline {
                out.seal_tail();
                let mut q = std::mem::take(&mut out.chunks);
                out.writing = true;
                drop(guard);
                self.write_inline(&mut q);
                return Ok(());
            }
            self.wake(out);
            if out.tail.len() < self.options.write_buffer && out.chunks.is_empty() {
                return Ok(());
            }
        }
        self.wait_room().await
    }

    /// Writes `q` (everything that was queued) without waiting; what the socket does not
    /// take now goes back in front of the queue for the writer task, which is woken for it
    /// (and for anything queued meanwhile, or for a failed write, which it will see too).
    fn write_inline(&self, q: &mut VecDeque<Bytes>) {
        let r = hayate_io::write_some(&*self.inline, q);
        let mut out = lock(&self.out);
        out.writing = false;
        if r.is_err() {
            q.clear();
        }
        if out.chunks.is_empty() {
            // What is left (usually nothing) goes back with the queue's allocation, which
            // the next inline publish then reuses.
            std::mem::swap(&mut out.chunks, q);
        } else {
            // In front of what was queued meanwhile: a large batch opened there would find
            // its head moved, so it is closed.
            out.large = None;
            while let Some(b) = q.pop_back() {
                out.chunks.push_front(b);
            }
        }
        if r.is_err() || !out.tail.is_empty() || !out.chunks.is_empty() || out.closing {
            out.wake_pending = false;
            self.wake(&mut out);
        }
    }

    pub(crate) async fn publish_message(&self, msg: &Message) -> Result<()> {
        self.publish_message_opt(msg, true).await
    }

    /// [`Inner::publish_message`]; `inline_ok` as for [`Inner::publish_plain_opt`].
    pub(crate) async fn publish_message_opt(&self, msg: &Message, inline_ok: bool) -> Result<()> {
        if msg.is_plain() {
            return self
                .publish_plain_opt(&msg.key, msg.payload.clone(), inline_ok)
                .await;
        }
        self.check_size(msg.payload.len())?;
        check_options(msg).map_err(|e| Error::InvalidMessage(e.into()))?;
        self.queue_frame(|t| encode_pub(msg, t))?;
        self.wait_room().await
    }

    /// Joins consumer `consumer` of `stream` as a member, or with an empty `stream`
    /// consumes queue `consumer` with at most `prefetch` unacknowledged (CONSUME).
    pub(crate) fn consume(
        self: &Arc<Self>,
        stream: &str,
        consumer: &str,
        prefetch: u32,
    ) -> Result<Subscription> {
        let (sid, sub) = self.new_subscription()?;
        let frame = Frame::Consume {
            sid,
            stream: stream.to_owned(),
            consumer: consumer.to_owned(),
            prefetch,
        };
        if let Err(e) = self.queue_frame(|t| encode(&frame, t)) {
            lock(&self.subs).remove(&sid);
            return Err(e);
        }
        Ok(sub)
    }

    fn new_subscription(self: &Arc<Self>) -> Result<(u32, Subscription)> {
        let (capacity, bytes) = (
            self.options.subscription_capacity,
            self.options.subscription_bytes,
        );
        let o = crate::sub::open(&self.next_sid, capacity, bytes, self.clone())?;
        let slot = SubSlot {
            tx: o.tx,
            lost: o.lost,
        };
        lock(&self.subs).insert(o.sid, slot);
        Ok((o.sid, o.sub))
    }

    pub(crate) fn subscribe(
        self: &Arc<Self>,
        expr: KeyExpr,
        options: SubscribeOptions,
    ) -> Result<Subscription> {
        let (sid, subscription) = self.new_subscription()?;
        let sub = Sub {
            sid,
            qos: options.qos,
            group: options.group,
            expr,
        };
        if let Err(e) = self.queue_frame(|t| encode_sub(&sub, t)) {
            lock(&self.subs).remove(&sid);
            return Err(e);
        }
        Ok(subscription)
    }

    /// Sends ACK (or, `cumulative`, an ACK of every delivery up to this one) or NACK for
    /// delivery `delivery`.
    pub(crate) fn settle(&self, delivery: u64, how: Settle) -> Result<()> {
        if delivery == 0 {
            return Err(Error::Protocol(
                "the message was not received on an acknowledged subscription".into(),
            ));
        }
        let f = match how {
            Settle::Ack => Frame::Ack {
                delivery,
                cumulative: false,
            },
            Settle::AckThrough => Frame::Ack {
                delivery,
                cumulative: true,
            },
            Settle::Nack => Frame::Nack {
                delivery,
                delay_ms: 0,
            },
            Settle::NackAfter(delay_ms) => Frame::Nack { delivery, delay_ms },
        };
        self.queue_frame(|t| encode(&f, t))
    }

    pub(crate) fn unsubscribe(&self, sid: u32) {
        if lock(&self.subs).remove(&sid).is_some() {
            let _ = self.queue_frame(|t| encode(&Frame::Unsub { sid }, t));
        }
    }

    /// Queues `msg` without waiting for room (small control messages: a peer node's
    /// interest announcements, which must go out in order under the node's lock).
    pub(crate) fn publish_now(&self, msg: &Message) -> Result<()> {
        self.check_size(msg.payload.len())?;
        check_options(msg).map_err(|e| Error::InvalidMessage(e.into()))?;
        self.queue_frame(|t| encode_pub(msg, t))
    }

    /// Whether the outgoing buffer is under its limit (a publish would not wait).
    pub(crate) fn has_room(&self) -> bool {
        lock(&self.out).len() < self.options.write_buffer
    }

    /// Resolves once the connection has ended.
    pub(crate) async fn closed(&self) {
        loop {
            let n = self.closed_notify.notified();
            tokio::pin!(n);
            n.as_mut().enable();
            if self.is_closed() {
                return;
            }
            n.await;
        }
    }

    /// Sends `m` as a request (its reply-to and correlation id are replaced by this
    /// connection's) and waits up to `timeout` for the reply.
    pub(crate) async fn request(&self, mut m: Message, timeout: Duration) -> Result<Message> {
        let token = self.next_token.fetch_add(1, Ordering::Relaxed);
        let reply_to = Key::new(&format!("{}/{token}", self.inbox))?;
        let (tx, rx) = oneshot::channel();
        lock(&self.requests).insert(token, tx);
        m.reply_to = Some(reply_to);
        m.correlation_id = Some(Bytes::copy_from_slice(&token.to_be_bytes()));
        let res = async {
            self.publish_message(&m).await?;
            match tokio::time::timeout(timeout, rx).await {
                Ok(Ok(reply)) => Ok(reply),
                Ok(Err(_)) => Err(self.closed_error()),
                Err(_) => Err(Error::Timeout),
            }
        }
        .await;
        lock(&self.requests).remove(&token);
        res
    }

    /// Publishes `m` with PUB_CONFIRM and waits for the CONFIRM.
    pub(crate) async fn publish_confirmed(&self, m: &Message) -> Result<ConfirmOutcome> {
        self.check_size(m.payload.len())?;
        check_options(m).map_err(|e| Error::InvalidMessage(e.into()))?;
        let id = self.next_token.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        lock(&self.confirms).insert(id, tx);
        let frame = Frame::PubConfirm { id, msg: m.clone() };
        let res = async {
            self.queue_frame(|t| encode(&frame, t))?;
            self.wait_room().await?;
            rx.await.map_err(|_| self.closed_error())
        }
        .await;
        lock(&self.confirms).remove(&id);
        res
    }

    pub(super) fn confirmed(&self, id: u64, outcome: ConfirmOutcome) {
        if let Some(tx) = lock(&self.confirms).remove(&id) {
            let _ = tx.send(outcome);
        }
    }

    pub(crate) async fn flush(&self) -> Result<()> {
        let token = self.next_token.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        lock(&self.pings).insert(token, tx);
        if let Err(e) = self.queue_frame(|t| encode_ping(token, t)) {
            lock(&self.pings).remove(&token);
            return Err(e);
        }
        rx.await.map_err(|_| self.closed_error())
    }

    pub(crate) async fn close(&self) -> Result<()> {
        let done = self.writer_done.notified();
        tokio::pin!(done);
        done.as_mut().enable();
        {
            let mut out = lock(&self.out);
            if !out.closing && !self.is_closed() {
                out.batch = None;
                encode(&Frame::Close, &mut out.tail);
                out.closing = true;
                self.wake(&mut out);
            }
        }
        if !self.writer_finished.load(Ordering::Acquire) {
            done.await;
        }
        Ok(())
    }

    fn fail(&self, err: Option<Error>) {
        if let Some(e) = err {
            lock(&self.error).get_or_insert(e);
        }
        self.closed.store(true, Ordering::Release);
        lock(&self.subs).clear();
        lock(&self.requests).clear();
        lock(&self.confirms).clear();
        lock(&self.pings).clear();
        self.space.notify_waiters();
        self.wake_writer.notify_one();
        self.closed_notify.notify_waiters();
    }
}

/// How a delivery is settled.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Settle {
    Ack,
    AckThrough,
    Nack,
    /// NACK: deliver again no sooner than this many ms from now (stream consumers).
    NackAfter(u32),
}

/// `s` cut to at most `max` bytes on a character boundary.
fn truncate(s: &str, max: usize) -> &str {
    let mut end = s.len().min(max);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The frames `out` queued, decoded from its chunks and tail in order.
    fn frames(out: &Out) -> Vec<Frame> {
        let mut b = BytesMut::new();
        for c in &out.chunks {
            b.extend_from_slice(c);
        }
        b.extend_from_slice(&out.tail);
        let mut v = Vec::new();
        while let Some(f) = decode(&mut b, 16 << 20).unwrap() {
            v.push(f);
        }
        assert!(b.is_empty(), "a partial frame queued");
        v
    }

    fn batch(key: &str, payloads: &[&Bytes]) -> Frame {
        Frame::PubBatch {
            key: Key::new(key).unwrap(),
            payloads: payloads.iter().map(|&p| p.clone()).collect(),
        }
    }

    /// Large payloads on one key queued back to back are one PUB_BATCH, by reference, up to
    /// the bound; another key, another frame queued after, or the queue taken start a new
    /// one; the payloads are never copied.
    #[test]
    fn large_payloads_on_one_key_go_as_one_batch() {
        let (a, b) = (Key::new("a").unwrap(), Key::new("b").unwrap());
        let p: Vec<Bytes> = (0..6u8).map(|i| Bytes::from(vec![i; ZERO_COPY])).collect();
        let max = 3 * (ZERO_COPY + 4);
        let mut out = Out::default();
        for x in &p[..4] {
            out.push_large(&a, x.clone(), max);
        }
        // Another key.
        out.push_large(&b, p[4].clone(), max);
        // Another frame after it: the next is a batch of its own.
        encode_ping(7, &mut out.tail);
        out.push_large(&b, p[5].clone(), max);
        assert_eq!(
            frames(&out),
            vec![
                batch("a", &[&p[0], &p[1], &p[2]]),
                batch("a", &[&p[3]]),
                batch("b", &[&p[4]]),
                Frame::Ping(7),
                batch("b", &[&p[5]]),
            ]
        );
        // By reference: the queued payload chunks are the payloads themselves.
        assert!(out.chunks.iter().any(|c| c.as_ptr() == p[1].as_ptr()));
        // Taken (sealed) by the writer: the next payload starts a new batch.
        out.seal_tail();
        let taken = std::mem::take(&mut out.chunks);
        out.push_large(&b, p[0].clone(), max);
        assert_eq!(frames(&out), vec![batch("b", &[&p[0]])]);
        drop(taken);
    }
}
