//! One AMQP 0-9-1 connection: the protocol header, connection.start / start-ok (SASL PLAIN,
//! AMQPLAIN, ANONYMOUS when allowed) / tune / open, then channels and their methods until
//! connection.close, an error, a heartbeat timeout or shutdown.
//!
//! Errors follow RabbitMQ: a soft error closes the channel (channel.close with the code and
//! `CODE_NAME - text`; the channel's frames are ignored until channel.close-ok), a hard one
//! the connection (connection.close, then the socket).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use hayate_amqp::frame::{PROTOCOL_HEADER, ProtocolHeader, decode_protocol_header};
use hayate_amqp::{
    ContentHeader, DecodeError, FieldTable, FieldValue, Frame, FrameDecoder, Method, ReplyCode,
    ShortStr,
};
use hayate_broker::{Batch, Session};
use hayate_core::{Key, KeyExpr, Qos};
use tokio::time::Instant;

use super::delivery::{AmqpEncoder, OwnConsumer, encode_content, message_of};
use super::names::{self, Kind, REPLY_TO_QUEUE};
use super::queue::{Chan, ChanState, Consumer, Queue, QueueArgs, Unacked, give_back_all, lock};
use super::{Amqp, Exchange, FastMap, VHost};
use crate::auth::{Credentials, Identity};
use crate::frontend::{self, Accepted, Handler, Stop};

const READ_BUF: usize = 64 * 1024;

/// Consumers per channel, at most.
const MAX_CONSUMERS: usize = 4096;

/// Exchange-to-exchange bindings per vhost, at most.
const MAX_EXCHANGE_BINDINGS: usize = 4096;

/// Operations one transaction holds, at most.
const MAX_TX_OPS: usize = 65_536;

/// The key, under the connection's inbox, of its direct reply-to consumer.
const REPLY_SUFFIX: &str = "amqp";

/// An error: its code, text, and the method it answers.
#[derive(Debug, Clone)]
pub(crate) struct AmqpError {
    code: ReplyCode,
    text: String,
    class: u16,
    method: u16,
}

fn err(code: ReplyCode, text: impl Into<String>) -> AmqpError {
    AmqpError {
        code,
        text: text.into(),
        class: 0,
        method: 0,
    }
}

impl AmqpError {
    fn on(mut self, m: &Method) -> AmqpError {
        (self.class, self.method) = m.ids();
        self
    }

    /// The error as an answer to basic.publish (its content is what failed).
    fn at_publish(self) -> AmqpError {
        AmqpError {
            class: 60,
            method: 40,
            ..self
        }
    }

    fn reply_text(&self) -> ShortStr {
        ShortStr::lit(&format!("{} - {}", self.code.name(), self.text))
    }
}

/// How a connection ends.
#[derive(Debug)]
pub(crate) enum End {
    /// connection.close answered, the client went away, or shutdown.
    Done,
    /// Not AMQP 0-9-1: answer with our protocol header.
    BadHeader,
    /// A hard error: connection.close with it.
    Hard(AmqpError),
}

/// What the decoder produces, and what handling a frame may leave for its future.
#[derive(Debug)]
pub(crate) enum Item {
    Header,
    Frame(Frame),
    Later(Later),
}

/// What a frame leaves to wait for ([`Conn::frame_now`] does the rest without a future):
/// the larger, rarer paths.
#[derive(Debug)]
pub(crate) enum Later {
    /// A method of channel 0.
    ConnectionMethod(Method),
    /// A channel's method other than basic.publish, ack, nack and reject.
    ChannelMethod(u16, Method),
    /// channel.close (`true`: with its close-ok sent) or close-ok on a closing channel:
    /// its consumers and unacknowledged messages released.
    Release(u16, bool),
    /// A message whole on a channel in confirm mode or a transaction, or mandatory.
    Complete(u16),
    /// A publish whose deliveries found a full outbox or a queue group: the rest of them.
    Rest(Box<Rest>),
}

/// [`Later::Rest`]: the deliveries left, the message, and the content bytes it holds.
#[derive(Debug)]
pub(crate) struct Rest {
    rest: hayate_broker::PublishRest,
    msg: hayate_core::Message,
    held: usize,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    Header,
    StartOk,
    TuneOk,
    Open,
    Ready,
    /// connection.close-ok sent: what the client still sends is discarded until it closes
    /// the socket (or `CLOSE_LINGER` passes).
    Closed,
}

/// How long, after connection.close-ok, the broker waits for the client to close the
/// socket before it closes it. The client that asked to close is the one to close the
/// socket (RabbitMQ waits up to 30 s): a client that reads close-ok and the broker's end of
/// the stream together may take its own close for a broken connection (lapin logs it as an
/// error). Kept short, so that a client that never closes holds its connection only briefly.
const CLOSE_LINGER: Duration = Duration::from_secs(1);

/// What a content frame left to do.
enum Content {
    /// Nothing yet: more content to come (or the channel is closing).
    More,
    /// The message is whole.
    Complete,
    /// The message is refused: a soft error for the channel.
    Refused(AmqpError),
}

/// A publish waiting for its content.
#[derive(Debug)]
struct Pending {
    exchange: ShortStr,
    routing_key: ShortStr,
    mandatory: bool,
    /// Boxed as the frame brought it: moved from frame to publish without copying its
    /// properties.
    header: Option<Box<ContentHeader>>,
    body: Body,
}

/// A publish checked and made a message ([`Conn::prepare`]).
struct Prepared {
    /// The exchange's type.
    kind: Kind,
    msg: hayate_core::Message,
    /// Whether its key is valid: if not, it is routed nowhere and `msg`'s key only carries
    /// the content (for a basic.return).
    routable: bool,
}

/// A message's body as its frames bring it: the one frame's bytes as they are (no copy:
/// most bodies come in one frame), or the frames copied together.
#[derive(Debug, Default)]
struct Body {
    one: Option<Bytes>,
    many: BytesMut,
}

/// The most a body of several frames reserves at once (a larger one grows as it arrives).
const BODY_RESERVE: usize = 16 << 20;

impl Body {
    fn len(&self) -> usize {
        self.one.as_ref().map_or(0, Bytes::len) + self.many.len()
    }

    /// Adds a body frame's payload of a body of `total` bytes (as its header announced).
    fn push(&mut self, b: Bytes, total: usize) {
        if self.one.is_none() && self.many.is_empty() {
            self.one = Some(b);
            return;
        }
        if let Some(first) = self.one.take() {
            // The second frame: room for the whole body at once (up to `BODY_RESERVE`),
            // instead of a buffer doubling through copies of everything received so far.
            // Only what arrives is written (and charged to the memory budget).
            self.many.reserve(total.min(BODY_RESERVE));
            self.many.extend_from_slice(&first);
        }
        self.many.extend_from_slice(&b);
    }

    fn freeze(self) -> Bytes {
        match self.one {
            Some(b) => b,
            None => self.many.freeze(),
        }
    }
}

/// What a transaction holds until tx.commit.
#[derive(Debug)]
enum TxOp {
    Publish(Box<Pending>),
    Ack(u64, bool),
    Nack(u64, bool, bool),
}

/// A consumer of a channel.
#[derive(Debug)]
enum ConsumerReg {
    Queue(Arc<Queue>),
    /// Direct reply-to: a subscription of the connection's own session.
    ReplyTo(u32),
}

/// A channel, as its connection keeps it.
#[derive(Debug)]
struct Channel {
    shared: Arc<Chan>,
    /// We sent channel.close: everything but channel.close(-ok) is ignored.
    closing: bool,
    pending: Option<Pending>,
    /// Confirm mode: what is published and confirmed.
    confirms: Option<Arc<Mutex<Confirms>>>,
    tx: Option<Vec<TxOp>>,
    consumers: HashMap<ShortStr, ConsumerReg>,
    /// basic.qos without `global`: the prefetch of consumers started from now on.
    prefetch: usize,
}

/// Publisher confirms of a channel in confirm mode, shared with the task that waits for
/// stored messages to be durable ([`drain_confirms`]). Confirms go out in order: nothing
/// after a publish still waiting is acknowledged before it.
#[derive(Default)]
struct Confirms {
    /// Publishes counted (the last delivery tag given).
    published: u64,
    /// Acknowledged (or nacked) up to here.
    confirmed: u64,
    /// Publishes a queue refused, or whose storing failed: nacked instead.
    refused: std::collections::BTreeSet<u64>,
    /// Publishes whose stored records are not durable yet.
    waiting: std::collections::BTreeSet<u64>,
    /// What they wait for, in order, for the channel's one waiting task.
    pending: std::collections::VecDeque<(u64, Vec<Durable>)>,
    /// That task runs.
    draining: bool,
    /// The channel is closed: nothing more is sent.
    closed: bool,
}

impl std::fmt::Debug for Confirms {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Confirms")
            .field("published", &self.published)
            .field("confirmed", &self.confirmed)
            .field("waiting", &self.waiting.len())
            .finish_non_exhaustive()
    }
}

impl Confirms {
    /// The basic.ack / basic.nack due now, in order (one ack with `multiple` for a run).
    fn due(&mut self) -> Vec<Method> {
        let mut out = Vec::new();
        if self.closed {
            return out;
        }
        let limit = self
            .waiting
            .first()
            .map_or(self.published, |w| w.saturating_sub(1));
        while let Some(&tag) = self.refused.first() {
            if tag > limit {
                break;
            }
            self.refused.pop_first();
            if tag > self.confirmed + 1 {
                out.push(Method::BasicAck {
                    delivery_tag: tag - 1,
                    multiple: true,
                });
            }
            out.push(Method::BasicNack {
                delivery_tag: tag,
                multiple: false,
                requeue: false,
            });
            self.confirmed = tag;
        }
        if limit > self.confirmed {
            out.push(Method::BasicAck {
                delivery_tag: limit,
                multiple: true,
            });
            self.confirmed = limit;
        }
        out
    }
}

/// What a publish waits for before it is confirmed (or a transaction committed): a durable
/// queue's record, or streams' appends, to be durable.
enum Durable {
    Record(Arc<super::store::Store>, u64),
    Streams(hayate_broker::stream::Stored),
}

impl Durable {
    /// `Some(true)` once durable; `None` while not known yet (or failed: [`Durable::wait`]
    /// says so). Takes no waker: probing a publish behind the one awaited costs nothing.
    fn ready(&self) -> Option<bool> {
        match self {
            Durable::Record(s, o) => s.is_durable(*o).then_some(true),
            Durable::Streams(st) => st.ready().map(|r| r.is_ok()),
        }
    }

    /// Durable (true) or failed (false).
    async fn wait(self) -> bool {
        match self {
            Durable::Record(s, o) => match s.confirmed(o) {
                None => true,
                Some(c) => c.await.is_ok(),
            },
            Durable::Streams(st) => st.confirmed().await.is_ok(),
        }
    }
}

/// All of `waits` durable (false: one failed).
async fn all_durable(waits: Vec<Durable>) -> bool {
    futures::future::join_all(waits.into_iter().map(Durable::wait))
        .await
        .into_iter()
        .all(|ok| ok)
}

/// The waiting task of a channel's confirms: awaits its publishes in order and sends the
/// confirms that become due, every publish already durable at once (one fsync covers many
/// publishes: one basic.ack with `multiple` for them), until none is left.
async fn drain_confirms(cf: Arc<Mutex<Confirms>>, outbox: Arc<hayate_broker::Outbox>, ch: u16) {
    loop {
        let (tag, waits) = {
            let mut c = lock(&cf);
            match c.pending.pop_front() {
                Some(p) => p,
                None => {
                    c.draining = false;
                    return;
                }
            }
        };
        let mut settled = vec![(tag, all_durable(waits).await)];
        // Those after it already durable too. Probed outside the lock (a probe takes the
        // log's own locks); only this task takes from the front, so one put back keeps
        // its place.
        loop {
            let next = lock(&cf).pending.pop_front();
            let Some((t, waits)) = next else { break };
            if let Some(ok) = waits
                .iter()
                .map(Durable::ready)
                .try_fold(true, |all, r| r.map(|ok| all && ok))
            {
                settled.push((t, ok));
            } else {
                lock(&cf).pending.push_front((t, waits));
                break;
            }
        }
        let mut c = lock(&cf);
        for (t, ok) in settled {
            c.waiting.remove(&t);
            if !ok {
                c.refused.insert(t);
            }
        }
        let due = c.due();
        if !due.is_empty() {
            outbox.push_control_unbudgeted(|b| {
                for m in due {
                    Frame::Method(ch, m).encode(b);
                }
            });
        }
    }
}

/// Per-connection state.
struct Conn<'a> {
    amqp: &'a Arc<Amqp>,
    id: u64,
    identity: Identity,
    entry: Option<Arc<hayate_io::registry::ConnEntry>>,
    peer: Option<std::net::IpAddr>,
    verified_name: Option<String>,
    stage: Stage,
    channel_max: u16,
    frame_max: Arc<AtomicUsize>,
    heartbeat: Option<Duration>,
    /// By channel number, looked up several times per message: hashed with foldhash, not
    /// SipHash. The client picks the numbers, but at most `channel_max` of them, in its own
    /// connection's map, hashed with a random seed: it can slow only its own lookups.
    channels: FastMap<u16, Channel>,
    /// Queues this connection declared exclusive (deleted when it closes).
    exclusive: Vec<Arc<Queue>>,
    /// The connection session's consumers (direct reply-to), shared with its encoder.
    own: Arc<Mutex<FastMap<u32, OwnConsumer>>>,
    /// The key direct reply-to replies go to (under the session's inbox), made once.
    reply_key: Option<Key>,
    next_sid: u32,
    /// connection.blocked sent (the memory budget is nearly spent).
    blocked: bool,
    /// The client said it understands connection.blocked.
    wants_blocked: bool,
    /// Content bytes held (messages being received, transactions' publishes), and their
    /// share of the broker-wide memory budget.
    held: usize,
    input: hayate_io::memory::Charge,
    /// The exchange last published to, with the registry's `exchanges_changed` it was read
    /// at.
    last_exchange: Option<(u64, ShortStr, Exchange)>,
    /// The keys of this connection's recent publishes and reply-tos (see
    /// [`Conn::publish_key`]).
    publish_keys: PublishKeys,
    /// The virtual host connection.open named.
    vhost: Arc<VHost>,
}

/// Publish keys a connection remembers ([`Conn::publish_key`]): one RPC server answering
/// this many callers still finds every reply-to's key.
const PUBLISH_KEYS: usize = 32;

/// The keys of a connection's last [`PUBLISH_KEYS`] distinct (exchange, routing key)
/// pairs. Each entry keeps its own copy of the two names (`names`, the exchange's first
/// `split` bytes), so no read buffer is kept alive; once full, a miss overwrites the oldest
/// entry in its buffer, so a connection that cycles through more targets than this pays a
/// copy of two short names per publish and no allocation beyond the key's own.
#[derive(Default)]
struct PublishKeys {
    entries: Vec<KeyEntry>,
    /// The entry the next miss overwrites once full.
    next: usize,
}

struct KeyEntry {
    names: Vec<u8>,
    split: usize,
    kind: Kind,
    key: Option<Key>,
}

impl PublishKeys {
    fn get(&self, x: &[u8], kind: Kind, rk: &[u8]) -> Option<&Option<Key>> {
        self.entries
            .iter()
            .find(|e| {
                e.kind == kind
                    && e.names.len() == x.len() + rk.len()
                    && e.names[..e.split] == *x
                    && e.names[e.split..] == *rk
            })
            .map(|e| &e.key)
    }

    fn put(&mut self, x: &[u8], kind: Kind, rk: &[u8], key: Option<Key>) {
        let e = if self.entries.len() < PUBLISH_KEYS {
            self.entries.push(KeyEntry {
                names: Vec::new(),
                split: 0,
                kind,
                key: None,
            });
            self.entries.last_mut().expect("just pushed")
        } else {
            let e = &mut self.entries[self.next];
            self.next = (self.next + 1) % PUBLISH_KEYS;
            e
        };
        e.names.clear();
        e.names.extend_from_slice(x);
        e.names.extend_from_slice(rk);
        e.split = x.len();
        e.kind = kind;
        e.key = key;
    }

    fn clear(&mut self) {
        self.entries.clear();
        self.next = 0;
    }
}

/// The front-end as the connection driver sees it.
struct Driven<'a> {
    c: Conn<'a>,
    session: Session,
    decoder: FrameDecoder,
    /// Until open: the handshake deadline; then the client's heartbeat deadline.
    quiet: Instant,
    beat: Option<Instant>,
    last_read: Instant,
}

impl Driven<'_> {
    /// After each frame handled: the stage's timers and frame size.
    fn handled(&mut self) {
        let c = &mut self.c;
        if c.stage == Stage::Closed {
            // Until the client closes the socket, at most CLOSE_LINGER; no heartbeats.
            self.quiet = self.quiet.min(Instant::now() + CLOSE_LINGER);
            self.beat = None;
            return;
        }
        if c.stage == Stage::Ready && self.beat.is_none() {
            let now = Instant::now();
            if let Some(hb) = c.heartbeat {
                self.beat = Some(now + hb / 2);
                self.quiet = now + hb * 2;
            } else {
                self.quiet = now + Duration::from_secs(86_400 * 365);
            }
            // A sentinel: the heartbeat timers are set.
            self.beat
                .get_or_insert(now + Duration::from_secs(86_400 * 365));
        }
        if let Some(fm) = c.stage_frame_max() {
            self.decoder.set_max_frame(fm);
        }
    }
}

impl Handler for Driven<'_> {
    type Frame = Item;
    type End = End;

    fn decode(&mut self, buf: &mut BytesMut) -> Result<Option<Item>, End> {
        if self.c.stage == Stage::Closed {
            buf.clear();
            return Ok(None);
        }
        if self.c.stage == Stage::Header {
            return match decode_protocol_header(buf) {
                None => Ok(None),
                Some(ProtocolHeader::Amqp091) => Ok(Some(Item::Header)),
                Some(ProtocolHeader::Other) => Err(End::BadHeader),
            };
        }
        match self.decoder.decode(buf) {
            Ok(f) => Ok(f.map(Item::Frame)),
            Err(e) => Err(End::Hard(decode_error(&e))),
        }
    }

    async fn handle(&mut self, item: Item) -> Result<(), End> {
        let (c, session) = (&mut self.c, &mut self.session);
        match item {
            Item::Header => c.start(session),
            Item::Frame(f) => {
                if let Some(l) = c.frame_now(f, session)? {
                    c.later(l, session).await?;
                }
            }
            Item::Later(l) => c.later(l, session).await?,
        }
        self.handled();
        Ok(())
    }

    fn handle_now(&mut self, item: Item) -> Result<Option<Item>, End> {
        let Item::Frame(f) = item else {
            return Ok(Some(item));
        };
        match self.c.frame_now(f, &mut self.session)? {
            Some(l) => Ok(Some(Item::Later(l))),
            None => {
                self.handled();
                Ok(None)
            }
        }
    }

    fn flush(&mut self) {
        self.c.send_confirms(&mut self.session);
        self.c.check_blocked(&mut self.session);
        self.session.flush();
    }

    fn on_read(&mut self) {
        self.last_read = Instant::now();
    }

    fn deadline(&self) -> Option<Instant> {
        Some(self.beat.map_or(self.quiet, |b| b.min(self.quiet)))
    }

    async fn on_timer(&mut self) -> Result<(), End> {
        let now = Instant::now();
        if self.c.stage != Stage::Ready {
            if now >= self.quiet {
                return Err(End::Done);
            }
            return Ok(());
        }
        if let Some(hb) = self.c.heartbeat {
            if self.last_read + hb * 2 > self.quiet {
                self.quiet = self.last_read + hb * 2;
            }
            if now >= self.quiet {
                tracing::debug!(conn = self.c.id, "amqp: missed heartbeats");
                return Err(End::Done);
            }
            if self.beat.is_some_and(|b| now >= b) {
                self.beat = Some(now + hb / 2);
                self.session
                    .outbox()
                    .push_control_unbudgeted(|b| Frame::Heartbeat.encode(b));
            }
        }
        Ok(())
    }

    fn stopped(&mut self, why: Stop) -> End {
        match why {
            Stop::Shutdown => End::Hard(err(ReplyCode::ConnectionForced, "broker shutdown")),
            Stop::Memory => End::Hard(err(
                ReplyCode::ResourceError,
                "the broker's memory budget is spent",
            )),
            Stop::Eof | Stop::Io | Stop::WriterGone => End::Done,
        }
    }
}

fn decode_error(e: &DecodeError) -> AmqpError {
    let mut a = err(e.reply_code(), e.to_string());
    if let DecodeError::UnknownMethod { class, method } = e {
        a.class = *class;
        a.method = *method;
    }
    a
}

/// Serves one AMQP connection until it closes.
pub async fn serve(io: Accepted, amqp: Arc<Amqp>) {
    let mut io = io;
    let (_registered, entry) = io.take_registered();
    let peer = io.peer.map(|a| a.ip());
    let verified_name = io.verified_name.clone();
    let frame_max = Arc::new(AtomicUsize::new(hayate_amqp::FRAME_MIN_SIZE as usize));
    let own = Arc::new(Mutex::new(FastMap::default()));
    let session = amqp.broker.open_session_in(
        Box::new(AmqpEncoder {
            consumers: own.clone(),
            frame_max: frame_max.clone(),
            routing_key: Vec::new(),
        }),
        io.class.as_ref(),
    );
    let outbox = session.outbox().clone();
    let mut conn = frontend::Conn::new(io, BytesMut::with_capacity(READ_BUF), &outbox);
    if let Some(e) = &entry {
        e.attach(session.id(), outbox.clone());
    }
    let now = Instant::now();
    let mut h = Driven {
        c: Conn {
            amqp: &amqp,
            id: amqp.next_id(),
            identity: Identity::anonymous(),
            entry,
            peer,
            verified_name,
            stage: Stage::Header,
            channel_max: amqp.cfg.channel_max,
            frame_max,
            heartbeat: None,
            channels: FastMap::default(),
            exclusive: Vec::new(),
            own,
            reply_key: None,
            next_sid: 1,
            blocked: false,
            wants_blocked: false,
            held: 0,
            input: hayate_io::memory::Charge::exact(&amqp.broker.config().memory),
            last_exchange: None,
            publish_keys: PublishKeys::default(),
            // Until connection.open names one (no method that uses it comes before).
            vhost: amqp.first_vhost(),
        },
        session,
        decoder: FrameDecoder::new(amqp.max_preauth as u32),
        quiet: now + amqp.handshake_timeout,
        beat: None,
        last_read: now,
    };
    let end = conn.drive(&mut h).await;
    let (mut c, mut session) = (h.c, h.session);
    c.release_all(&mut session).await;
    match end {
        End::BadHeader => outbox.push_control_unbudgeted(|b| b.extend_from_slice(&PROTOCOL_HEADER)),
        End::Hard(e) => {
            tracing::debug!(
                conn = c.id,
                code = e.code.code(),
                text = e.text,
                "amqp: closing"
            );
            let m = Method::ConnectionClose {
                reply_code: e.code.code(),
                reply_text: e.reply_text(),
                class_id: e.class,
                method_id: e.method,
            };
            outbox.push_control_unbudgeted(|b| Frame::Method(0, m).encode(b));
        }
        End::Done => {}
    }
    session.flush();
    drop(session);
    conn.close(&*outbox).await;
}

impl Conn<'_> {
    fn stage_frame_max(&self) -> Option<u32> {
        (self.stage == Stage::Ready || self.stage == Stage::Open)
            .then(|| self.frame_max.load(Ordering::Relaxed) as u32)
    }

    /// `m` unless the client asked for no answer (`no-wait`).
    fn answer(&self, session: &mut Session, channel: u16, no_wait: bool, m: Method) {
        if !no_wait {
            self.send(session, channel, m);
        }
    }

    fn send(&self, session: &mut Session, channel: u16, m: Method) {
        session
            .outbox()
            .push_reply_unbudgeted(|o| Frame::Method(channel, m).encode(o.tail()));
        session.mark_own_output();
    }

    /// connection.start.
    fn start(&mut self, session: &mut Session) {
        let mut caps = FieldTable::default();
        for c in [
            "publisher_confirms",
            "basic.nack",
            "consumer_cancel_notify",
            "connection.blocked",
            "authentication_failure_close",
            "per_consumer_qos",
            "direct_reply_to",
        ] {
            caps.insert(c, FieldValue::Bool(true));
        }
        caps.insert("exchange_exchange_bindings", FieldValue::Bool(true));
        let mut props = FieldTable::default();
        props.insert(
            "product",
            FieldValue::LongStr(Bytes::from_static(b"Hayate")),
        );
        props.insert(
            "version",
            FieldValue::LongStr(Bytes::from_static(env!("CARGO_PKG_VERSION").as_bytes())),
        );
        props.insert("platform", FieldValue::LongStr(Bytes::from_static(b"Rust")));
        props.insert("capabilities", FieldValue::Table(caps));
        // EXTERNAL (the user a verified client certificate names: `[tls] cert_user`) when
        // the connection has one, as RabbitMQ's rabbitmq_auth_mechanism_ssl offers it.
        let mechanisms: &[u8] = match (self.verified_name.is_some(), self.amqp.auth.required()) {
            (true, true) => b"EXTERNAL PLAIN AMQPLAIN",
            (true, false) => b"EXTERNAL PLAIN AMQPLAIN ANONYMOUS",
            (false, true) => b"PLAIN AMQPLAIN",
            (false, false) => b"PLAIN AMQPLAIN ANONYMOUS",
        };
        self.send(
            session,
            0,
            Method::ConnectionStart {
                version_major: 0,
                version_minor: 9,
                server_properties: props,
                mechanisms: Bytes::from_static(mechanisms),
                locales: Bytes::from_static(b"en_US"),
            },
        );
        self.stage = Stage::StartOk;
    }

    /// Handles `f` as far as it goes without waiting (see `Handler::handle_now`): every
    /// content frame, basic.publish, ack, nack and reject, channel.open, and a publish that
    /// every subscriber takes at once. What is left is for [`Conn::later`].
    fn frame_now(&mut self, f: Frame, session: &mut Session) -> Result<Option<Later>, End> {
        let ch = f.channel();
        match f {
            Frame::Heartbeat => Ok(None),
            Frame::Method(0, m) => Ok(Some(Later::ConnectionMethod(m))),
            _ if self.stage != Stage::Ready => Err(End::Hard(err(
                ReplyCode::CommandInvalid,
                "the connection is not open yet",
            ))),
            _ if ch > self.channel_max => Err(End::Hard(err(
                ReplyCode::ChannelError,
                format!(
                    "channel {ch} is out of range (channel_max {})",
                    self.channel_max
                ),
            ))),
            Frame::Method(ch, m) => self.channel_method(ch, m, session),
            Frame::Header(ch, h) => {
                let c = self.content_header(ch, h)?;
                self.content_done(ch, c, session)
            }
            Frame::Body(ch, b) => {
                let c = self.content_body(ch, b)?;
                self.content_done(ch, c, session)
            }
        }
    }

    /// What [`Conn::frame_now`] left: the paths that may wait.
    async fn later(&mut self, l: Later, session: &mut Session) -> Result<(), End> {
        match l {
            // Rare, and its future is large: on the heap.
            Later::ConnectionMethod(m) => Box::pin(self.connection_method(m, session)).await,
            Later::ChannelMethod(ch, m) => {
                // The other methods are rarer and some wait: their larger future goes on
                // the heap too.
                let r = Box::pin(self.method(ch, &m, session)).await;
                self.method_done(ch, &m, r, session)
            }
            Later::Release(ch, close_ok) => {
                self.release_channel(ch, session).await;
                if close_ok {
                    self.send(session, ch, Method::ChannelCloseOk {});
                }
                Ok(())
            }
            Later::Complete(ch) => self.complete(ch, session).await,
            Later::Rest(r) => {
                let Rest { rest, msg, held } = *r;
                session.publish_rest(rest, Batch::One(&msg)).await;
                self.release_held(held);
                Ok(())
            }
        }
    }

    async fn connection_method(&mut self, m: Method, session: &mut Session) -> Result<(), End> {
        let hard = |code, text: String, m: &Method| Err(End::Hard(err(code, text).on(m)));
        match (self.stage, m) {
            (
                Stage::StartOk,
                Method::ConnectionStartOk {
                    client_properties,
                    mechanism,
                    response,
                    ..
                },
            ) => {
                self.wants_blocked = matches!(
                    client_properties.get("capabilities"),
                    Some(FieldValue::Table(t)) if t.get("connection.blocked").and_then(FieldValue::as_bool) == Some(true)
                );
                self.login(mechanism.as_str().unwrap_or(""), &response)
                    .await?;
                self.send(
                    session,
                    0,
                    Method::ConnectionTune {
                        channel_max: self.amqp.cfg.channel_max,
                        frame_max: self.amqp.cfg.frame_max,
                        heartbeat: self.amqp.cfg.heartbeat_secs,
                    },
                );
                self.stage = Stage::TuneOk;
                Ok(())
            }
            (Stage::TuneOk, m @ Method::ConnectionTuneOk { .. }) => {
                let Method::ConnectionTuneOk {
                    channel_max,
                    frame_max,
                    heartbeat,
                } = m
                else {
                    return Ok(());
                };
                let server = self.amqp.cfg.frame_max;
                let fm = if frame_max == 0 { server } else { frame_max };
                if fm < hayate_amqp::FRAME_MIN_SIZE || fm > server {
                    return hard(
                        ReplyCode::NotAllowed,
                        format!(
                            "negotiated frame_max = {fm} is outside {}..={server}",
                            hayate_amqp::FRAME_MIN_SIZE
                        ),
                        &m,
                    );
                }
                self.frame_max.store(fm as usize, Ordering::Relaxed);
                let cm = self.amqp.cfg.channel_max;
                self.channel_max = if channel_max == 0 {
                    cm
                } else {
                    channel_max.min(cm)
                };
                self.heartbeat = (heartbeat > 0).then(|| Duration::from_secs(u64::from(heartbeat)));
                self.stage = Stage::Open;
                Ok(())
            }
            (Stage::Open, m @ Method::ConnectionOpen { .. }) => {
                let Method::ConnectionOpen { virtual_host, .. } = &m else {
                    return Ok(());
                };
                let Some(vh) = virtual_host
                    .as_str()
                    .and_then(|v| self.amqp.vhosts.get(v))
                    .cloned()
                else {
                    return hard(
                        ReplyCode::NotAllowed,
                        format!("vhost {virtual_host} not found"),
                        &m,
                    );
                };
                self.vhost = vh;
                self.publish_keys.clear();
                self.send(
                    session,
                    0,
                    Method::ConnectionOpenOk {
                        known_hosts: ShortStr::lit(""),
                    },
                );
                self.stage = Stage::Ready;
                Ok(())
            }
            (_, Method::ConnectionClose { .. }) => {
                // Channels close now (nothing is delivered after close-ok); the connection
                // ends when the client closes the socket.
                self.release_all(session).await;
                self.send(session, 0, Method::ConnectionCloseOk {});
                self.stage = Stage::Closed;
                Ok(())
            }
            (_, Method::ConnectionCloseOk {}) => Err(End::Done),
            (Stage::Ready, Method::ConnectionUpdateSecret { .. }) => {
                self.send(session, 0, Method::ConnectionUpdateSecretOk {});
                Ok(())
            }
            (_, m) => hard(
                ReplyCode::CommandInvalid,
                format!("{} is not allowed on channel 0 now", m.name()),
                &m,
            ),
        }
    }

    /// SASL PLAIN (`\0user\0password`), AMQPLAIN (a table of LOGIN and PASSWORD),
    /// ANONYMOUS or EXTERNAL (a verified client certificate), through the server's
    /// authenticator.
    async fn login(&mut self, mechanism: &str, response: &[u8]) -> Result<(), End> {
        let refused = |why: String| {
            End::Hard(err(
                ReplyCode::AccessRefused,
                format!("Login was refused using authentication mechanism {mechanism}: {why}"),
            ))
        };
        let (user, password): (Option<String>, Option<Vec<u8>>) = match mechanism {
            "PLAIN" => {
                let mut parts = response.splitn(3, |&b| b == 0);
                let _authzid = parts.next();
                let user = parts
                    .next()
                    .map(|u| String::from_utf8_lossy(u).into_owned());
                let pw = parts.next().map(<[u8]>::to_vec);
                (user, pw)
            }
            "AMQPLAIN" => {
                // A field table without its length prefix.
                let mut framed = Vec::with_capacity(response.len() + 4);
                framed.extend_from_slice(&(response.len() as u32).to_be_bytes());
                framed.extend_from_slice(response);
                let t = hayate_amqp::types::Reader::new(&framed)
                    .table()
                    .map_err(|e| refuse_syntax(e.to_string()))?;
                let get = |k: &str| -> Option<Vec<u8>> {
                    match t.get(k) {
                        Some(FieldValue::LongStr(b)) => Some(b.to_vec()),
                        _ => None,
                    }
                };
                (
                    get("LOGIN").map(|u| String::from_utf8_lossy(&u).into_owned()),
                    get("PASSWORD"),
                )
            }
            "ANONYMOUS" => (None, None),
            // The certificate's user; a response names the user (authzid) it must be.
            "EXTERNAL" if self.verified_name.is_some() => {
                (Some(String::from_utf8_lossy(response).into_owned()), None)
            }
            other => return Err(refused(format!("mechanism {other} is not offered"))),
        };
        let creds = Credentials {
            user: user.as_deref().filter(|u| !u.is_empty()),
            password: password.as_deref(),
            token: None,
            peer: self.peer,
            verified: self.verified_name.as_deref(),
        };
        match self.amqp.auth.authenticate("amqp", creds).await {
            Ok(id) => {
                self.identity = id;
                if let Some(e) = &self.entry {
                    e.set_user(self.identity.user.as_deref());
                }
                Ok(())
            }
            Err(e) => Err(refused(e.to_string())),
        }
    }

    /// A method on channel `ch`: channel.open, and basic.publish, ack, nack and reject here;
    /// the others for [`Conn::later`].
    fn channel_method(
        &mut self,
        ch: u16,
        m: Method,
        session: &mut Session,
    ) -> Result<Option<Later>, End> {
        if let Method::ChannelOpen { .. } = m {
            if self.channels.contains_key(&ch) {
                return Err(End::Hard(
                    err(ReplyCode::ChannelError, "second 'channel.open' seen").on(&m),
                ));
            }
            let shared = Arc::new(Chan {
                channel: ch,
                outbox: session.outbox().clone(),
                frame_max: self.frame_max.clone(),
                active: AtomicBool::new(true),
                next_tag: Arc::new(AtomicU64::new(0)),
                st: Mutex::new(ChanState::default()),
            });
            self.channels.insert(
                ch,
                Channel {
                    shared,
                    closing: false,
                    pending: None,
                    confirms: None,
                    tx: None,
                    consumers: HashMap::new(),
                    prefetch: 0,
                },
            );
            self.send(
                session,
                ch,
                Method::ChannelOpenOk {
                    channel_id: Bytes::new(),
                },
            );
            return Ok(None);
        }
        let Some(chan) = self.channels.get(&ch) else {
            return Err(End::Hard(
                err(ReplyCode::ChannelError, "expected 'channel.open'").on(&m),
            ));
        };
        if chan.closing {
            return Ok(match m {
                Method::ChannelCloseOk {} => Some(Later::Release(ch, false)),
                Method::ChannelClose { .. } => Some(Later::Release(ch, true)),
                _ => None,
            });
        }
        if chan.pending.is_some() {
            return Err(End::Hard(
                err(
                    ReplyCode::UnexpectedFrame,
                    format!("expected content header for class 60, got non content header frame instead ({})", m.name()),
                )
                .on(&m),
            ));
        }
        match self.basic_now(ch, &m) {
            Some(r) => self.method_done(ch, &m, r, session).map(|()| None),
            None => Ok(Some(Later::ChannelMethod(ch, m))),
        }
    }

    /// The outcome of channel method `m`: a hard error closes the connection, a soft one
    /// the channel.
    fn method_done(
        &mut self,
        ch: u16,
        m: &Method,
        r: Result<(), AmqpError>,
        session: &mut Session,
    ) -> Result<(), End> {
        match r {
            Ok(()) => Ok(()),
            Err(e) if e.code.is_hard() => Err(End::Hard(e.on(m))),
            Err(e) => {
                self.soft_close(ch, e.on(m), session);
                Ok(())
            }
        }
    }

    /// The methods of every message (basic.publish, and basic.ack, nack and reject), which
    /// never wait: handled here, or `None` for [`Conn::method`].
    fn basic_now(&mut self, ch: u16, m: &Method) -> Option<Result<(), AmqpError>> {
        let (tag, multiple, requeue) = match m {
            Method::BasicPublish {
                exchange,
                routing_key,
                mandatory,
                ..
            } => {
                return Some(self.chan(ch).map(|c| {
                    c.pending = Some(Pending {
                        exchange: exchange.clone(),
                        routing_key: routing_key.clone(),
                        mandatory: *mandatory,
                        header: None,
                        body: Body::default(),
                    });
                }));
            }
            Method::BasicAck {
                delivery_tag,
                multiple,
            } => (*delivery_tag, *multiple, None),
            Method::BasicNack {
                delivery_tag,
                multiple,
                requeue,
            } => (*delivery_tag, *multiple, Some(*requeue)),
            Method::BasicReject {
                delivery_tag,
                requeue,
            } => (*delivery_tag, false, Some(*requeue)),
            _ => return None,
        };
        Some(self.chan(ch).and_then(|c| match &mut c.tx {
            Some(tx) => {
                tx_room(tx)?;
                tx.push(match requeue {
                    None => TxOp::Ack(tag, multiple),
                    Some(r) => TxOp::Nack(tag, multiple, r),
                });
                Ok(())
            }
            None => settle(c, tag, multiple, requeue),
        }))
    }

    fn chan(&mut self, ch: u16) -> Result<&mut Channel, AmqpError> {
        self.channels
            .get_mut(&ch)
            .ok_or_else(|| err(ReplyCode::ChannelError, "channel is not open"))
    }

    async fn method(
        &mut self,
        ch: u16,
        m: &Method,
        session: &mut Session,
    ) -> Result<(), AmqpError> {
        match m {
            Method::ChannelClose { .. } => {
                self.release_channel(ch, session).await;
                self.send(session, ch, Method::ChannelCloseOk {});
            }
            Method::ChannelFlow { active } => {
                let c = self.chan(ch)?;
                c.shared.active.store(*active, Ordering::Release);
                let queues: Vec<_> = c
                    .consumers
                    .values()
                    .filter_map(|r| match r {
                        ConsumerReg::Queue(q) => Some(q.clone()),
                        ConsumerReg::ReplyTo(_) => None,
                    })
                    .collect();
                self.send(session, ch, Method::ChannelFlowOk { active: *active });
                for q in queues {
                    q.dispatch();
                }
            }
            Method::ChannelFlowOk { .. } => {}
            Method::ExchangeDeclare {
                exchange,
                kind,
                passive,
                durable,
                auto_delete,
                internal,
                no_wait,
                ..
            } => {
                self.exchange_declare(exchange, kind, *passive, *durable, *auto_delete, *internal)?;
                self.answer(session, ch, *no_wait, Method::ExchangeDeclareOk {});
            }
            Method::ExchangeDelete {
                exchange,
                if_unused,
                no_wait,
                ..
            } => {
                self.exchange_delete(exchange, *if_unused)?;
                self.answer(session, ch, *no_wait, Method::ExchangeDeleteOk {});
            }
            Method::ExchangeBind {
                destination,
                source,
                routing_key,
                no_wait,
                arguments,
                ..
            } => {
                self.exchange_bind(destination, source, routing_key, arguments, true)?;
                self.answer(session, ch, *no_wait, Method::ExchangeBindOk {});
            }
            Method::ExchangeUnbind {
                destination,
                source,
                routing_key,
                no_wait,
                arguments,
                ..
            } => {
                self.exchange_bind(destination, source, routing_key, arguments, false)?;
                self.answer(session, ch, *no_wait, Method::ExchangeUnbindOk {});
            }
            Method::QueueDeclare {
                queue,
                passive,
                durable,
                exclusive,
                auto_delete,
                no_wait,
                arguments,
                ..
            } => {
                let (name, n, c) = self
                    .queue_declare(
                        queue,
                        *passive,
                        *durable,
                        *exclusive,
                        *auto_delete,
                        arguments,
                    )
                    .await?;
                self.answer(
                    session,
                    ch,
                    *no_wait,
                    Method::QueueDeclareOk {
                        queue: ShortStr::lit(&name),
                        message_count: n,
                        consumer_count: c,
                    },
                );
            }
            Method::QueueBind {
                queue,
                exchange,
                routing_key,
                no_wait,
                arguments,
                ..
            } => {
                self.queue_bind(queue, exchange, routing_key, arguments, true)?;
                self.answer(session, ch, *no_wait, Method::QueueBindOk {});
            }
            Method::QueueUnbind {
                queue,
                exchange,
                routing_key,
                arguments,
                ..
            } => {
                self.queue_bind(queue, exchange, routing_key, arguments, false)?;
                self.send(session, ch, Method::QueueUnbindOk {});
            }
            Method::QueuePurge { queue, no_wait, .. } => {
                let q = self.queue(queue)?;
                self.may_serve(&q)?;
                let n = q.purge();
                self.answer(
                    session,
                    ch,
                    *no_wait,
                    Method::QueuePurgeOk { message_count: n },
                );
            }
            Method::QueueDelete {
                queue,
                if_unused,
                if_empty,
                no_wait,
                ..
            } => {
                let n = self.queue_delete(queue, *if_unused, *if_empty)?;
                self.answer(
                    session,
                    ch,
                    *no_wait,
                    Method::QueueDeleteOk { message_count: n },
                );
            }
            Method::BasicQos {
                prefetch_size,
                prefetch_count,
                global,
            } => {
                if *prefetch_size != 0 {
                    return Err(err(
                        ReplyCode::NotImplemented,
                        "prefetch_size!=0 is not implemented",
                    ));
                }
                let c = self.chan(ch)?;
                if *global {
                    lock(&c.shared.st).prefetch = usize::from(*prefetch_count);
                } else {
                    c.prefetch = usize::from(*prefetch_count);
                }
                let queues = channel_queues(c);
                self.send(session, ch, Method::BasicQosOk {});
                for q in queues {
                    q.dispatch();
                }
            }
            Method::BasicConsume {
                queue,
                consumer_tag,
                no_ack,
                exclusive,
                no_wait,
                ..
            } => {
                self.consume(
                    ch,
                    queue,
                    consumer_tag,
                    *no_ack,
                    *exclusive,
                    *no_wait,
                    session,
                )?;
            }
            Method::BasicCancel {
                consumer_tag,
                no_wait,
            } => {
                self.cancel(ch, consumer_tag, session);
                self.answer(
                    session,
                    ch,
                    *no_wait,
                    Method::BasicCancelOk {
                        consumer_tag: consumer_tag.clone(),
                    },
                );
            }
            Method::BasicGet { queue, no_ack, .. } => {
                let q = self.queue(queue)?;
                self.may_serve(&q)?;
                let chan = self.chan(ch)?.shared.clone();
                if !q.get(&chan, *no_ack) {
                    self.send(
                        session,
                        ch,
                        Method::BasicGetEmpty {
                            cluster_id: ShortStr::lit(""),
                        },
                    );
                } else {
                    session.mark_own_output();
                }
            }
            Method::BasicRecover { requeue } | Method::BasicRecoverAsync { requeue } => {
                let c = self.chan(ch)?;
                let all = std::mem::take(&mut lock(&c.shared.st).unacked);
                // Redelivered to whoever the queue picks (RabbitMQ requeues even when asked
                // to redeliver to the same consumer), all back before any goes out again:
                // in their original order.
                let _ = requeue;
                give_back_all(all.into_values(), true);
                if let Method::BasicRecover { .. } = m {
                    self.send(session, ch, Method::BasicRecoverOk {});
                }
            }
            Method::ConfirmSelect { no_wait } => {
                let c = self.chan(ch)?;
                if c.tx.is_some() {
                    return Err(err(
                        ReplyCode::PreconditionFailed,
                        "cannot switch from tx to confirm mode",
                    ));
                }
                c.confirms.get_or_insert_with(Default::default);
                self.answer(session, ch, *no_wait, Method::ConfirmSelectOk {});
            }
            Method::TxSelect {} => {
                let c = self.chan(ch)?;
                if c.confirms.is_some() {
                    return Err(err(
                        ReplyCode::PreconditionFailed,
                        "cannot switch from confirm to tx mode",
                    ));
                }
                c.tx.get_or_insert_with(Vec::new);
                self.send(session, ch, Method::TxSelectOk {});
            }
            Method::TxCommit {} | Method::TxRollback {} => {
                let c = self.chan(ch)?;
                if c.tx.is_none() {
                    return Err(err(
                        ReplyCode::PreconditionFailed,
                        "channel is not transactional",
                    ));
                }
                let ops = c.tx.replace(Vec::new()).unwrap_or_default();
                let bytes: usize = ops
                    .iter()
                    .map(|o| match o {
                        TxOp::Publish(p) => p.body.len(),
                        _ => 0,
                    })
                    .sum();
                if let Method::TxCommit {} = m {
                    let mut result = Ok(());
                    let mut waits = Vec::new();
                    for op in ops {
                        if result.is_err() {
                            break;
                        }
                        result = match op {
                            TxOp::Publish(p) => {
                                self.publish(ch, *p, session).await.map(|w| waits.extend(w))
                            }
                            TxOp::Ack(t, multi) => {
                                self.chan(ch).and_then(|c| settle(c, t, multi, None))
                            }
                            TxOp::Nack(t, multi, rq) => {
                                self.chan(ch).and_then(|c| settle(c, t, multi, Some(rq)))
                            }
                        };
                    }
                    self.release_held(bytes);
                    result?;
                    // commit-ok once what durable queues stored is durable.
                    if !all_durable(waits).await {
                        return Err(err(
                            ReplyCode::InternalError,
                            "persistent messages of the transaction could not be stored",
                        ));
                    }
                    self.send(session, ch, Method::TxCommitOk {});
                } else {
                    self.release_held(bytes);
                    self.send(session, ch, Method::TxRollbackOk {});
                }
            }
            m => {
                return Err(err(
                    ReplyCode::CommandInvalid,
                    format!("{} is not a client method", m.name()),
                ));
            }
        }
        Ok(())
    }

    /// A content header: `Content::Complete` when it ends the message (an empty body).
    fn content_header(&mut self, ch: u16, h: Box<ContentHeader>) -> Result<Content, End> {
        let max = self.amqp.cfg.max_message_size;
        let Some(c) = self.channels.get_mut(&ch) else {
            return Err(End::Hard(err(
                ReplyCode::ChannelError,
                "expected 'channel.open'",
            )));
        };
        if c.closing {
            return Ok(Content::More);
        }
        let Some(p) = c.pending.as_mut().filter(|p| p.header.is_none()) else {
            return Err(End::Hard(err(
                ReplyCode::UnexpectedFrame,
                "content header without a basic.publish before it",
            )));
        };
        if h.body_size > max {
            c.pending = None;
            let e = err(
                ReplyCode::PreconditionFailed,
                format!(
                    "message size {} is larger than configured max size {max}",
                    h.body_size
                ),
            );
            return Ok(Content::Refused(e.at_publish()));
        }
        let done = h.body_size == 0;
        p.header = Some(h);
        Ok(if done {
            Content::Complete
        } else {
            Content::More
        })
    }

    /// A content body frame: `Content::Complete` when it ends the message.
    fn content_body(&mut self, ch: u16, b: Bytes) -> Result<Content, End> {
        let Some(c) = self.channels.get_mut(&ch) else {
            return Err(End::Hard(err(
                ReplyCode::ChannelError,
                "expected 'channel.open'",
            )));
        };
        if c.closing {
            return Ok(Content::More);
        }
        let Some((p, size)) = c
            .pending
            .as_mut()
            .and_then(|p| p.header.as_ref().map(|h| h.body_size).map(|s| (p, s)))
        else {
            return Err(End::Hard(err(
                ReplyCode::UnexpectedFrame,
                "content body without a content header before it",
            )));
        };
        if p.body.len() as u64 + b.len() as u64 > size {
            return Err(End::Hard(err(
                ReplyCode::FrameError,
                format!("content body exceeds the {size} bytes its header announced"),
            )));
        }
        let n = b.len();
        p.body.push(b, usize::try_from(size).unwrap_or(usize::MAX));
        let full = p.body.len() as u64 == size;
        // Content held (this body, other channels', open transactions'): charged to the
        // memory budget, which may refuse it.
        self.held += n;
        if !self.input.cover(self.held) {
            return Err(End::Hard(err(
                ReplyCode::ResourceError,
                "the broker's memory budget has no room for this message",
            )));
        }
        Ok(if full {
            Content::Complete
        } else {
            Content::More
        })
    }

    /// What follows a content frame: nothing yet, the message published (or left to
    /// [`Conn::later`]: [`Conn::complete_now`]), or the channel closed.
    fn content_done(
        &mut self,
        ch: u16,
        c: Content,
        session: &mut Session,
    ) -> Result<Option<Later>, End> {
        match c {
            Content::More => Ok(None),
            Content::Complete => self.complete_now(ch, session),
            Content::Refused(e) => {
                self.soft_close(ch, e, session);
                Ok(None)
            }
        }
    }

    /// A message whole on channel `ch`: published now when nothing waits for its route
    /// (no confirm mode, no transaction, not mandatory) and every subscriber takes it at
    /// once; otherwise left to [`Conn::later`] ([`Later::Complete`], or [`Later::Rest`] for
    /// the deliveries that found a full outbox or a queue group).
    fn complete_now(&mut self, ch: u16, session: &mut Session) -> Result<Option<Later>, End> {
        let Some(c) = self.channels.get_mut(&ch) else {
            return Ok(None);
        };
        if c.pending.is_none() {
            return Ok(None);
        }
        let waits = c.tx.is_some() || c.confirms.is_some();
        let Some(p) = c.pending.take_if(|p| !p.mandatory && !waits) else {
            return Ok(Some(Later::Complete(ch)));
        };
        let held = p.body.len();
        let Pending {
            exchange,
            routing_key,
            header,
            body,
            ..
        } = p;
        let r = self.prepare(&exchange, &routing_key, header, body, session);
        let msg = match r {
            Ok(Prepared { msg, routable, .. }) => routable.then_some(msg),
            Err(e) => {
                self.release_held(held);
                return self.publish_failed(ch, e, session).map(|()| None);
            }
        };
        let rest = msg.and_then(|msg| match session.publish_now(Batch::One(&msg)) {
            Ok(_) => None,
            Err(rest) => Some(Rest { rest, msg, held }),
        });
        match rest {
            Some(r) => Ok(Some(Later::Rest(Box::new(r)))),
            None => {
                self.release_held(held);
                Ok(None)
            }
        }
    }

    /// A publish refused: a hard error closes the connection, a soft one the channel.
    fn publish_failed(&mut self, ch: u16, e: AmqpError, session: &mut Session) -> Result<(), End> {
        if e.code.is_hard() {
            return Err(End::Hard(e));
        }
        self.soft_close(ch, e.at_publish(), session);
        Ok(())
    }

    /// Content no longer held (published, discarded).
    fn release_held(&mut self, bytes: usize) {
        self.held = self.held.saturating_sub(bytes);
        self.input.shrink(self.held);
    }

    /// A publish with all its content: published now, or held by the transaction.
    async fn complete(&mut self, ch: u16, session: &mut Session) -> Result<(), End> {
        let Some(c) = self.channels.get_mut(&ch) else {
            return Ok(());
        };
        let Some(p) = c.pending.take() else {
            return Ok(());
        };
        if let Some(tx) = &mut c.tx {
            if let Err(e) = tx_room(tx) {
                let n = p.body.len();
                self.release_held(n);
                self.soft_close(ch, e.at_publish(), session);
                return Ok(());
            }
            tx.push(TxOp::Publish(Box::new(p)));
            return Ok(());
        }
        let n = p.body.len();
        let r = self.publish(ch, p, session).await.map(drop);
        self.release_held(n);
        match r {
            Ok(()) => Ok(()),
            Err(e) => self.publish_failed(ch, e, session),
        }
    }

    /// A soft error: channel.close with it; the channel's frames are ignored until the
    /// client's channel.close-ok, its deliveries stop now and its messages go back once it
    /// is closed.
    fn soft_close(&mut self, ch: u16, e: AmqpError, session: &mut Session) {
        tracing::debug!(
            conn = self.id,
            ch,
            code = e.code.code(),
            text = e.text,
            "amqp: channel error"
        );
        self.send(
            session,
            ch,
            Method::ChannelClose {
                reply_code: e.code.code(),
                reply_text: e.reply_text(),
                class_id: e.class,
                method_id: e.method,
            },
        );
        let dropped = self.channels.get_mut(&ch).map_or(0, |c| {
            c.closing = true;
            if let Some(cf) = &c.confirms {
                lock(cf).closed = true;
            }
            c.pending.take().map_or(0, |p| p.body.len())
        });
        self.release_held(dropped);
        self.release_channel_consumers(ch, session);
    }

    /// Publishes one message: to the key of its exchange and routing key, where every
    /// binding and subscriber that covers it takes it. In confirm mode its confirm is
    /// counted (and sent once what stored it made it durable); in a transaction, what to
    /// wait for before commit-ok is returned.
    /// The checks of a publish to `exchange` with `routing_key` (the exchange exists and is
    /// not internal, direct reply-to is consumed, the user may publish to the key) and its
    /// message.
    fn prepare(
        &mut self,
        exchange: &ShortStr,
        routing_key: &ShortStr,
        header: Option<Box<ContentHeader>>,
        body: Body,
        session: &Session,
    ) -> Result<Prepared, AmqpError> {
        let name = || exchange.as_str().unwrap_or("");
        let Some(x) = self.exchange(exchange) else {
            return Err(err(
                ReplyCode::NotFound,
                format!(
                    "no exchange '{x}' in vhost '{vh}'",
                    x = name(),
                    vh = self.vhost.name
                ),
            ));
        };
        if x.internal {
            return Err(err(
                ReplyCode::AccessRefused,
                format!(
                    "cannot publish to internal exchange '{x}' in vhost '{vh}'",
                    x = name(),
                    vh = self.vhost.name
                ),
            ));
        }
        let header = header.unwrap_or_default();
        let props = &header.properties;
        let key = self.publish_key(exchange, x.kind, routing_key);
        let reply_to = match props
            .reply_to
            .as_ref()
            .filter(|r| r.as_str().is_some_and(|s| !s.is_empty()))
        {
            None => None,
            Some(r) if r.as_bytes() == REPLY_TO_QUEUE.as_bytes() => {
                if !self.own_reply_consumer() {
                    return Err(err(
                        ReplyCode::PreconditionFailed,
                        "fast reply consumer does not exist",
                    ));
                }
                if self.reply_key.is_none() {
                    self.reply_key = Key::new(&format!("{}/{REPLY_SUFFIX}", session.inbox())).ok();
                }
                self.reply_key.clone()
            }
            // A queue name of this vhost, or an inbox (of no vhost).
            Some(r) => self.publish_key(&ShortStr::default(), Kind::Direct, r),
        };
        let body = body.freeze();
        let (key, routable) = match key {
            Some(key) => {
                frontend::check_publish(&self.identity, &key, reply_to.is_some())
                    .map_err(|d| err(ReplyCode::AccessRefused, d.to_string()))?;
                (key, true)
            }
            // Not a valid key: routed nowhere. The key below only carries the content.
            None => (return_key(), false),
        };
        Ok(Prepared {
            kind: x.kind,
            msg: message_of(key, props, reply_to, body),
            routable,
        })
    }

    async fn publish(
        &mut self,
        ch: u16,
        p: Pending,
        session: &mut Session,
    ) -> Result<Vec<Durable>, AmqpError> {
        let Pending {
            exchange,
            routing_key,
            mandatory,
            header,
            body,
        } = p;
        let Prepared {
            kind,
            msg,
            routable,
        } = self.prepare(&exchange, &routing_key, header, body, session)?;
        let mut routed = 0;
        let mut refused = false;
        let mut waits: Vec<Durable> = Vec::new();
        let (confirms, in_tx) = self
            .channels
            .get(&ch)
            .map_or((None, false), |c| (c.confirms.clone(), c.tx.is_some()));
        if routable {
            // Queues decide what they take after the broker offered it (a headers
            // binding's arguments, a route's hops, a key of another vhost under a `/`
            // wildcard): a mandatory publish is routed only if a queue took it or
            // something other than a queue was offered it.
            if confirms.is_some() || in_tx || mandatory {
                let (n, queued, offers, r, stored, streams) = super::queue::ROUTED
                    .scope(super::queue::Routed::default(), async {
                        let (n, streams) = session.publish_stored(Batch::One(&msg)).await;
                        let (q, o, r, stored) = super::queue::ROUTED.with(|r| {
                            (
                                r.queued.get(),
                                r.queue_offers.get(),
                                r.refused.get(),
                                r.stored.take(),
                            )
                        });
                        (n, q, o, r, stored, streams)
                    })
                    .await;
                routed = if queued {
                    n
                } else if kind == Kind::Headers {
                    // As RabbitMQ: through a headers exchange only a queue counts.
                    0
                } else {
                    n.saturating_sub(offers)
                };
                refused = r;
                // Durable queues' records and streams' appends, until durable.
                for (store, o) in stored {
                    if !store.is_durable(o) {
                        waits.push(Durable::Record(store, o));
                    }
                }
                match streams.ready() {
                    Some(Ok(_)) => {}
                    Some(Err(e)) => {
                        tracing::warn!(conn = self.id, "amqp: publish not stored: {e}");
                        refused = true;
                    }
                    None => waits.push(Durable::Streams(streams)),
                }
            } else {
                routed = session.publish(Batch::One(&msg)).await;
            }
        }
        let returned = msg;
        if mandatory && routed == 0 {
            let frame_max = self.frame_max.load(Ordering::Relaxed);
            let m = Method::BasicReturn {
                reply_code: ReplyCode::NoRoute.code(),
                reply_text: ShortStr::lit("NO_ROUTE"),
                exchange,
                routing_key,
            };
            session.outbox().push_reply_unbudgeted(|o| {
                Frame::Method(ch, m).encode(o.tail());
                encode_content(ch, &returned, &self.vhost.prefix, frame_max, o);
            });
            session.mark_own_output();
        }
        let Some(cf) = confirms else {
            return Ok(waits);
        };
        let mut c = lock(&cf);
        c.published += 1;
        let tag = c.published;
        if refused {
            c.refused.insert(tag);
        }
        if waits.is_empty() {
            return Ok(Vec::new());
        }
        // Confirmed (with whatever followed it) once durable, by the channel's waiting task.
        c.waiting.insert(tag);
        c.pending.push_back((tag, waits));
        if !c.draining {
            c.draining = true;
            drop(c);
            tokio::spawn(drain_confirms(cf, session.outbox().clone(), ch));
        }
        Ok(Vec::new())
    }

    /// Acknowledges what was published in confirm mode since the last time (one
    /// basic.ack with `multiple` per channel and read).
    /// A publish a queue refused gets its own basic.nack, those before it an ack.
    fn send_confirms(&mut self, session: &mut Session) {
        for (ch, c) in &self.channels {
            let Some(cf) = &c.confirms else { continue };
            // Under the lock while written: a waiting task's confirms stay in order.
            let mut cf = lock(cf);
            if cf.published == cf.confirmed {
                continue;
            }
            let due = cf.due();
            if !due.is_empty() {
                session.outbox().push_reply_unbudgeted(|o| {
                    for m in due {
                        Frame::Method(*ch, m).encode(o.tail());
                    }
                });
                session.mark_own_output();
            }
        }
    }

    /// connection.blocked while the memory budget is nearly spent (90%), unblocked below
    /// 80%, for clients that said they understand it.
    fn check_blocked(&mut self, session: &mut Session) {
        if !self.wants_blocked || self.stage != Stage::Ready {
            return;
        }
        let mem = &self.amqp.broker.config().memory;
        let (used, limit) = (mem.used() as u128, mem.limit() as u128);
        if limit == 0 || limit >= usize::MAX as u128 {
            return;
        }
        if !self.blocked && used * 10 >= limit * 9 {
            self.blocked = true;
            self.send(
                session,
                0,
                Method::ConnectionBlocked {
                    reason: ShortStr::lit("low on memory"),
                },
            );
        } else if self.blocked && used * 10 < limit * 8 {
            self.blocked = false;
            self.send(session, 0, Method::ConnectionUnblocked {});
        }
    }

    /// Exchange `name`, from the one-entry cache while no exchange was declared or deleted
    /// since it was read (a publisher sending to one exchange takes no registry lock).
    fn exchange(&mut self, name: &ShortStr) -> Option<Exchange> {
        let now = self.vhost.exchanges_changed.load(Ordering::Acquire);
        if let Some((at, n, x)) = &self.last_exchange
            && *at == now
            && n == name
        {
            return Some(x.clone());
        }
        let x = lock(&self.vhost.registry)
            .exchanges
            .get(name.as_str().unwrap_or(""))
            .cloned()?;
        self.last_exchange = Some((now, name.clone(), x.clone()));
        Some(x)
    }

    /// [`VHost::publish_key`] of exchange `x` (of type `kind`) and routing key `rk`,
    /// remembered for the connection's last [`PUBLISH_KEYS`] distinct ones ([`PublishKeys`]):
    /// a publisher sends to few keys (an RPC server answers each caller's reply-to), and
    /// computing one (escaping, checks, an allocation) costs more than comparing a few short
    /// names. A routing key no key can hold (not UTF-8, a control character) gives none:
    /// the vhost's `publish_key` says how (unroutable, or the `%!` stand-in of a fanout or
    /// headers exchange), as RabbitMQ takes any bytes there; a reply-to that cannot be a
    /// key is left out. No key the validator refuses is ever made (`Key` has no unchecked
    /// constructor).
    fn publish_key(&mut self, x: &ShortStr, kind: Kind, rk: &ShortStr) -> Option<Key> {
        let (xb, rb) = (x.as_bytes(), rk.as_bytes());
        if let Some(key) = self.publish_keys.get(xb, kind, rb) {
            return key.clone();
        }
        // A routing key that is not UTF-8 is one no key can hold (as a control character),
        // not the empty routing key.
        let key =
            self.vhost
                .publish_key(x.as_str().unwrap_or(""), kind, rk.as_str().unwrap_or("\0"));
        self.publish_keys.put(xb, kind, rb, key.clone());
        key
    }

    fn own_reply_consumer(&self) -> bool {
        !lock(&self.own).is_empty()
    }

    fn queue(&self, name: &ShortStr) -> Result<Arc<Queue>, AmqpError> {
        let n = name.as_str().unwrap_or("");
        let q = lock(&self.vhost.registry).queues.get(n).cloned();
        let Some(q) = q.filter(|q| !q.is_deleted()) else {
            return Err(err(
                ReplyCode::NotFound,
                format!("no queue '{n}' in vhost '{vh}'", vh = self.vhost.name),
            ));
        };
        if q.owner.is_some_and(|o| o != self.id) {
            return Err(err(
                ReplyCode::ResourceLocked,
                format!(
                    "cannot obtain exclusive access to locked queue '{n}' in vhost '{vh}'",
                    vh = self.vhost.name
                ),
            ));
        }
        Ok(q)
    }

    /// May this connection's user take messages from `q` (serve its key)?
    fn may_serve(&self, q: &Queue) -> Result<(), AmqpError> {
        let Some(key) = self.vhost.key(names::queue_key(&q.name)) else {
            return Ok(());
        };
        let expr = KeyExpr::new(key.as_str())
            .map_err(|e| err(ReplyCode::PreconditionFailed, e.to_string()))?;
        // A queue's messages carry no per-key guard: all of it must be readable.
        match self.identity.access.may_read_all(&expr, true) {
            true => Ok(()),
            false => Err(err(
                ReplyCode::AccessRefused,
                format!(
                    "access to queue '{}' in vhost '{vh}' refused for user '{}'",
                    q.name,
                    self.identity.name(),
                    vh = self.vhost.name
                ),
            )),
        }
    }

    fn exchange_declare(
        &self,
        name: &ShortStr,
        kind: &ShortStr,
        passive: bool,
        durable: bool,
        auto_delete: bool,
        internal: bool,
    ) -> Result<(), AmqpError> {
        let n = name
            .as_str()
            .ok_or_else(|| err(ReplyCode::PreconditionFailed, "exchange name is not UTF-8"))?;
        let mut reg = lock(&self.vhost.registry);
        if passive {
            return if reg.exchanges.contains_key(n) {
                Ok(())
            } else {
                Err(err(
                    ReplyCode::NotFound,
                    format!("no exchange '{n}' in vhost '{vh}'", vh = self.vhost.name),
                ))
            };
        }
        let k = kind.as_str().unwrap_or("");
        let Some(kind) = Kind::parse(k) else {
            return Err(err(
                ReplyCode::CommandInvalid,
                format!("invalid exchange type '{k}'"),
            ));
        };
        if let Some(x) = reg.exchanges.get(n) {
            if x.kind != kind {
                return Err(err(
                    ReplyCode::PreconditionFailed,
                    format!(
                        "inequivalent arg 'type' for exchange '{n}' in vhost '{vh}': received '{}' but current is '{}'",
                        kind.name(),
                        x.kind.name(),
                        vh = self.vhost.name
                    ),
                ));
            }
            if !x.builtin && x.durable != durable {
                return Err(err(
                    ReplyCode::PreconditionFailed,
                    format!(
                        "inequivalent arg 'durable' for exchange '{n}' in vhost '{vh}': received '{durable}' but current is '{}'",
                        x.durable,
                        vh = self.vhost.name
                    ),
                ));
            }
            return Ok(());
        }
        if n.starts_with("amq.") {
            return Err(err(
                ReplyCode::AccessRefused,
                format!("exchange name '{n}' contains reserved prefix 'amq.*'"),
            ));
        }
        if !n.is_empty() && names::binding_expr(n, Kind::Topic, "#").is_none() {
            return Err(err(
                ReplyCode::PreconditionFailed,
                format!("exchange name '{n}' cannot be a key"),
            ));
        }
        if n.is_empty() {
            return Err(err(
                ReplyCode::AccessRefused,
                "operation not permitted on the default exchange",
            ));
        }
        if reg.exchanges.len() >= self.amqp.cfg.max_queues {
            return Err(err(
                ReplyCode::PreconditionFailed,
                format!(
                    "exchange limit in vhost '{vh}' ({}) is reached",
                    self.amqp.cfg.max_queues,
                    vh = self.vhost.name
                ),
            ));
        }
        self.vhost.exchanges_changed.fetch_add(1, Ordering::AcqRel);
        reg.exchanges.insert(
            n.to_string(),
            Exchange {
                kind,
                durable,
                auto_delete,
                internal,
                builtin: false,
            },
        );
        drop(reg);
        if let Some(s) = self.vhost.store_for(durable) {
            let def = super::store::ExchangeDef {
                kind: kind.name().to_string(),
                auto_delete,
                internal,
            };
            s.put_exchange(n, def).map_err(|e| {
                err(
                    ReplyCode::InternalError,
                    format!("cannot keep durable exchange '{n}': {e}"),
                )
            })?;
        }
        Ok(())
    }

    fn exchange_delete(&self, name: &ShortStr, if_unused: bool) -> Result<(), AmqpError> {
        let n = name.as_str().unwrap_or("");
        let _topology = lock(&self.vhost.topology);
        let reg = lock(&self.vhost.registry);
        let Some(x) = reg.exchanges.get(n) else {
            // Deleting what is not there is not an error (RabbitMQ 3.x).
            return Ok(());
        };
        if x.builtin {
            return Err(err(
                ReplyCode::AccessRefused,
                format!("operation not permitted on exchange '{n}'"),
            ));
        }
        // Deleting an exchange ends what is published through it: publish on all of its
        // keys is needed.
        // (A name that is no key, declared by an older version, has no keys to protect.)
        let writable = self
            .vhost
            .expr(names::binding_expr(n, Kind::Topic, "#"))
            .is_none_or(|e| self.identity.access.may_publish_all(&e));
        if !writable {
            return Err(err(
                ReplyCode::AccessRefused,
                format!(
                    "access to exchange '{n}' in vhost '{vh}' refused for user '{}'",
                    self.identity.name(),
                    vh = self.vhost.name
                ),
            ));
        }
        let queues: Vec<_> = reg.queues.values().cloned().collect();
        let forwards = reg.edges.iter().any(|e| e.source == n);
        drop(reg);
        // In use: the source of a binding (a queue's or another exchange's), as RabbitMQ.
        let used = forwards || queues.iter().any(|q| q.bound_to(|b| b == n));
        if if_unused && used {
            return Err(err(
                ReplyCode::PreconditionFailed,
                format!(
                    "exchange '{n}' in vhost '{vh}' in use",
                    vh = self.vhost.name
                ),
            ));
        }
        let affected = self.vhost.queues_after(n);
        let sources: Vec<String>;
        {
            let mut reg = lock(&self.vhost.registry);
            sources = reg
                .edges
                .iter()
                .filter(|e| e.destination == n && e.source != n)
                .map(|e| e.source.clone())
                .collect();
            reg.exchanges.remove(n);
            reg.edges.retain(|e| e.source != n && e.destination != n);
        }
        self.vhost.exchanges_changed.fetch_add(1, Ordering::AcqRel);
        for q in queues {
            q.unbind_exchange(n);
        }
        if let Err(e) = self.vhost.reroute(&affected) {
            tracing::warn!(conn = self.id, vhost = %self.vhost.name, "amqp: routes after deleting exchange {n:?}: {e}");
        }
        self.vhost.drop_unused_exchanges(sources);
        if let Some(s) = self.vhost.store.get() {
            s.remove_exchange(n).map_err(|e| {
                err(
                    ReplyCode::InternalError,
                    format!("cannot forget durable exchange '{n}': {e}"),
                )
            })?;
        }
        Ok(())
    }

    /// exchange.bind (`bind`) or exchange.unbind: messages `source` routes with
    /// `routing_key` go on through `destination`'s bindings. Every queue bound downstream
    /// gets (or loses) the routes this makes (docs/amqp.md, "Exchange-to-exchange
    /// bindings").
    fn exchange_bind(
        &self,
        destination: &ShortStr,
        source: &ShortStr,
        routing_key: &ShortStr,
        arguments: &FieldTable,
        bind: bool,
    ) -> Result<(), AmqpError> {
        let d = destination.as_str().unwrap_or("");
        let s = source.as_str().unwrap_or("");
        if d.is_empty() || s.is_empty() {
            return Err(err(
                ReplyCode::AccessRefused,
                "operation not permitted on the default exchange",
            ));
        }
        let key = routing_key.as_str().unwrap_or("");
        let vh = &self.vhost.name;
        let _topology = lock(&self.vhost.topology);
        let reg = lock(&self.vhost.registry);
        let exchange = |x: &str| {
            reg.exchanges.get(x).cloned().ok_or_else(|| {
                err(
                    ReplyCode::NotFound,
                    format!("no exchange '{x}' in vhost '{vh}'"),
                )
            })
        };
        let (sx, dx) = (exchange(s)?, exchange(d)?);
        let edge = super::Edge {
            source: s.to_string(),
            destination: d.to_string(),
            key: key.to_string(),
            args: arguments.clone(),
        };
        // As RabbitMQ: reading the source (what the binding takes of it, as a queue binding
        // there would) and writing the destination (what queues bound there get is as if
        // published there: all of its keys), to bind and to unbind.
        let Some(read) = self.vhost.expr(names::binding_expr(s, sx.kind, key)) else {
            return Err(err(
                ReplyCode::PreconditionFailed,
                format!("binding key '{key}' of exchange '{s}' cannot be a key expression"),
            ));
        };
        let write = self
            .vhost
            .expr(names::binding_expr(d, Kind::Topic, "#"))
            .filter(|w| self.identity.access.may_publish_all(w));
        if !self.identity.access.may_read_all(&read, false) || write.is_none() {
            return Err(err(
                ReplyCode::AccessRefused,
                format!(
                    "access to exchange '{s}' (read) and '{d}' (write) in vhost '{vh}' refused for user '{}'",
                    self.identity.name()
                ),
            ));
        }
        let exists = reg.edges.contains(&edge);
        if bind && exists || !bind && !exists {
            return Ok(());
        }
        if bind && reg.edges.len() >= MAX_EXCHANGE_BINDINGS {
            return Err(err(
                ReplyCode::PreconditionFailed,
                format!(
                    "exchange-to-exchange binding limit in vhost '{vh}' ({MAX_EXCHANGE_BINDINGS}) is reached"
                ),
            ));
        }
        drop(reg);
        let affected = self.vhost.queues_after(d);
        let change = |add: bool| {
            let mut reg = lock(&self.vhost.registry);
            if add {
                reg.edges.push(edge.clone());
            } else {
                reg.edges.retain(|e| e != &edge);
            }
            drop(reg);
            self.vhost.exchanges_changed.fetch_add(1, Ordering::AcqRel);
        };
        change(bind);
        if let Err(e) = self.vhost.reroute(&affected) {
            // Too many routes for some queue (nothing changed), or a subscription refused
            // midway: back to the bindings as they were.
            change(!bind);
            let _ = self.vhost.reroute(&affected);
            return Err(err(ReplyCode::PreconditionFailed, e));
        }
        // Kept when both ends are durable, as in RabbitMQ.
        let mut kept = Ok(());
        if let Some(st) = self.vhost.store_for(sx.durable && dx.durable) {
            let def = super::store::EdgeDef {
                source: s.to_string(),
                destination: d.to_string(),
                key: key.to_string(),
                arguments: super::store::table_hex(arguments),
            };
            let written = if bind {
                st.put_edge(def)
            } else {
                st.remove_edge(def)
            };
            kept = written.map_err(|e| {
                err(
                    ReplyCode::InternalError,
                    format!("cannot keep the exchange-to-exchange bindings of '{d}': {e}"),
                )
            });
        }
        if !bind {
            // The source lost a binding: an auto-delete source may now be unused.
            self.vhost.drop_unused_exchanges(vec![s.to_string()]);
        }
        kept
    }

    async fn queue_declare(
        &mut self,
        name: &ShortStr,
        passive: bool,
        durable: bool,
        exclusive: bool,
        auto_delete: bool,
        arguments: &FieldTable,
    ) -> Result<(String, u32, u32), AmqpError> {
        let mut n = name
            .as_str()
            .ok_or_else(|| err(ReplyCode::PreconditionFailed, "queue name is not UTF-8"))?
            .to_string();
        if passive {
            let q = self.queue(name)?;
            let (m, c) = q.counts();
            return Ok((n, m, c));
        }
        if n.is_empty() {
            n = format!("amq.gen-{:016x}{:08x}", rand_u64(), self.amqp.next_id());
        } else if n.starts_with("amq.") {
            return Err(err(
                ReplyCode::AccessRefused,
                format!("queue name '{n}' contains reserved prefix 'amq.*'"),
            ));
        }
        let args =
            QueueArgs::parse(arguments).map_err(|e| err(ReplyCode::PreconditionFailed, e))?;
        // A quorum queue is durable, shared and kept (RabbitMQ's texts).
        if args.quorum {
            for (bad, what) in [
                (!durable, "non-durable"),
                (exclusive, "exclusive-owner"),
                (auto_delete, "auto-delete"),
            ] {
                if bad {
                    return Err(err(
                        ReplyCode::PreconditionFailed,
                        format!(
                            "invalid property '{what}' for queue '{n}' in vhost '{vh}'",
                            vh = self.vhost.name
                        ),
                    ));
                }
            }
        }
        let existing = lock(&self.vhost.registry).queues.get(&n).cloned();
        if let Some(q) = existing.filter(|q| !q.is_deleted()) {
            if q.owner.is_some_and(|o| o != self.id) {
                return Err(err(
                    ReplyCode::ResourceLocked,
                    format!(
                        "cannot obtain exclusive access to locked queue '{n}' in vhost '{vh}'",
                        vh = self.vhost.name
                    ),
                ));
            }
            for (what, got, have) in [
                ("durable", durable, q.durable),
                ("exclusive", exclusive, q.owner.is_some()),
                ("auto_delete", auto_delete, q.auto_delete),
            ] {
                if got != have {
                    return Err(err(
                        ReplyCode::PreconditionFailed,
                        format!(
                            "inequivalent arg '{what}' for queue '{n}' in vhost '{vh}': received '{got}' but current is '{have}'",
                            vh = self.vhost.name
                        ),
                    ));
                }
            }
            if args != q.args {
                return Err(err(
                    ReplyCode::PreconditionFailed,
                    format!(
                        "inequivalent arguments for queue '{n}' in vhost '{vh}'",
                        vh = self.vhost.name
                    ),
                ));
            }
            q.touch();
            let (m, c) = q.counts();
            return Ok((n, m, c));
        }
        let Some(key) = self.vhost.key(names::queue_key(&n)) else {
            return Err(err(
                ReplyCode::PreconditionFailed,
                format!("queue name '{n}' cannot be a key"),
            ));
        };
        let expr = KeyExpr::new(key.as_str())
            .map_err(|e| err(ReplyCode::PreconditionFailed, e.to_string()))?;
        // A queue's default binding reads its own key: never a reply inbox's, whoever asks.
        // Messages it collects leave only through a consumer (serve, checked then) or as
        // dead letters: with a dead-letter exchange, a client names only a queue it may
        // consume from (serve on all of its key). A server-named one is a fresh random key.
        if !name.is_empty()
            && (crate::auth::inbox_guard(&expr).is_err()
                || args.dead_letter_exchange.is_some()
                    && !self.identity.access.may_read_all(&expr, true))
        {
            return Err(err(
                ReplyCode::AccessRefused,
                format!(
                    "access to queue '{n}' in vhost '{vh}' refused for user '{}'",
                    self.identity.name(),
                    vh = self.vhost.name
                ),
            ));
        }
        // Dead letters are published on the dead-letter exchange's keys: the declarer must
        // be allowed to publish on all of them, as RabbitMQ checks write on the DLX.
        if let Some(dlx) = &args.dead_letter_exchange {
            let space = if dlx.is_empty() {
                self.vhost.expr(KeyExpr::new("**").ok())
            } else {
                self.vhost.expr(names::binding_expr(dlx, Kind::Topic, "#"))
            };
            if !space.is_some_and(|s| self.identity.access.may_publish_all(&s)) {
                return Err(err(
                    ReplyCode::AccessRefused,
                    format!(
                        "access to dead-letter exchange '{dlx}' in vhost '{vh}' refused for user '{}'",
                        self.identity.name(),
                        vh = self.vhost.name
                    ),
                ));
            }
        }
        {
            let reg = lock(&self.vhost.registry);
            if reg.queues.len() >= self.amqp.cfg.max_queues {
                return Err(err(
                    ReplyCode::PreconditionFailed,
                    format!(
                        "queue limit in vhost '{vh}' ({}) is reached",
                        self.amqp.cfg.max_queues,
                        vh = self.vhost.name
                    ),
                ));
            }
        }
        // A durable queue (not exclusive: those end with their connection) is kept in the
        // vhost's store, with a number of its own.
        let store = self
            .vhost
            .store_for(durable && !exclusive)
            .map(|s| (s.clone(), s.new_queue_id()));
        let q = self.amqp.make_queue(
            &self.vhost,
            &n,
            durable,
            auto_delete,
            exclusive.then_some(self.id),
            args.clone(),
            store.clone(),
        );
        q.bind("", Kind::Direct, &n, FieldTable::default(), expr, None)
            .map_err(|e| err(ReplyCode::InternalError, e))?;
        // Into the registry, unless another connection declared it meanwhile (that one
        // stands) or the limit is reached; the queue found is looked at outside the
        // registry's lock (a leaf).
        loop {
            let found = {
                let mut reg = lock(&self.vhost.registry);
                match reg.queues.get(&n).cloned() {
                    Some(other) => Some(other),
                    None if reg.queues.len() >= self.amqp.cfg.max_queues => {
                        drop(reg);
                        q.delete();
                        return Err(err(
                            ReplyCode::PreconditionFailed,
                            format!(
                                "queue limit in vhost '{vh}' ({}) is reached",
                                self.amqp.cfg.max_queues,
                                vh = self.vhost.name
                            ),
                        ));
                    }
                    None => {
                        reg.queues.insert(n.clone(), q.clone());
                        None
                    }
                }
            };
            let Some(other) = found else { break };
            if !other.is_deleted() {
                let (m, c) = other.counts();
                q.delete();
                return Ok((n, m, c));
            }
            // A queue on its way out: ours takes its place.
            let mut reg = lock(&self.vhost.registry);
            if reg.queues.get(&n).is_some_and(|o| Arc::ptr_eq(o, &other)) {
                reg.queues.insert(n.clone(), q.clone());
                break;
            }
        }
        if let Some((s, id)) = store {
            let def = super::store::QueueDef {
                id,
                auto_delete,
                arguments: super::store::table_hex(arguments),
                bindings: Vec::new(),
            };
            if let Err(e) = s.put_queue(&n, def) {
                tracing::error!(queue = %n, "amqp: cannot keep a durable queue: {e}");
                delete_queue(&q);
                return Err(err(
                    ReplyCode::InternalError,
                    format!("cannot keep durable queue '{n}': {e}"),
                ));
            }
        }
        if exclusive {
            self.exclusive.retain(|q| !q.is_deleted());
            self.exclusive.push(q);
        }
        Ok((n, 0, 0))
    }

    fn queue_bind(
        &self,
        queue: &ShortStr,
        exchange: &ShortStr,
        routing_key: &ShortStr,
        arguments: &FieldTable,
        bind: bool,
    ) -> Result<(), AmqpError> {
        let q = self.queue(queue)?;
        let _topology = lock(&self.vhost.topology);
        // What a binding brings into a queue is as if published to it: binding and
        // unbinding need publish on all of the queue's key (as RabbitMQ's write on the
        // queue), but for a queue exclusive to this connection, which nobody else reaches.
        if q.owner != Some(self.id) {
            let writable = self
                .vhost
                .key(names::queue_key(&q.name))
                .and_then(|k| KeyExpr::new(k.as_str()).ok())
                .is_some_and(|e| self.identity.access.may_publish_all(&e));
            if !writable {
                return Err(err(
                    ReplyCode::AccessRefused,
                    format!(
                        "access to queue '{}' in vhost '{vh}' refused for user '{}'",
                        q.name,
                        self.identity.name(),
                        vh = self.vhost.name
                    ),
                ));
            }
        }
        let x = exchange.as_str().unwrap_or("");
        if x.is_empty() {
            return Err(err(
                ReplyCode::AccessRefused,
                "operation not permitted on the default exchange",
            ));
        }
        let kind = lock(&self.vhost.registry).exchanges.get(x).map(|e| e.kind);
        let Some(kind) = kind else {
            return Err(err(
                ReplyCode::NotFound,
                format!("no exchange '{x}' in vhost '{vh}'", vh = self.vhost.name),
            ));
        };
        let rk = routing_key.as_str().unwrap_or("");
        let saved = |q: &Queue| {
            q.save_bindings().map_err(|e| {
                err(
                    ReplyCode::InternalError,
                    format!(
                        "cannot keep the bindings of durable queue '{}': {e}",
                        q.name
                    ),
                )
            })
        };
        if !bind {
            if q.unbind(x, rk, arguments) {
                if let Err(e) = self.vhost.reroute(std::slice::from_ref(&q)) {
                    tracing::warn!(conn = self.id, queue = %q.name, "amqp: routes after an unbind: {e}");
                }
                let kept = saved(&q);
                self.vhost.drop_unused_exchanges(vec![x.to_string()]);
                kept?;
            }
            return Ok(());
        }
        if q.bindings()
            .iter()
            .any(|b| b.exchange == x && b.key == rk && &b.args == arguments)
        {
            return Ok(());
        }
        let Some(expr) = self.vhost.expr(names::binding_expr(x, kind, rk)) else {
            return Err(err(
                ReplyCode::PreconditionFailed,
                format!("binding key '{rk}' of exchange '{x}' cannot be a key expression"),
            ));
        };
        // As a subscription of the binder's: what the expression covers that the binder may
        // not read (other clients' reply inboxes, denied keys) its guard keeps out.
        let guard = match self.identity.access.check_subscribe(&expr, false, "") {
            // A durable queue's binding outlives the guard (a restart puts it back with
            // the reply-inbox guard only): all of it must be readable.
            Ok(_) if q.store.is_some() && !self.identity.access.may_read_all(&expr, false) => {
                return Err(err(
                    ReplyCode::AccessRefused,
                    format!(
                        "access to all of '{}' refused for user '{}' (a durable queue's bindings must be readable in full)",
                        expr.as_str(),
                        self.identity.name()
                    ),
                ));
            }
            Ok(guard) => guard,
            Err(_) => {
                return Err(err(
                    ReplyCode::AccessRefused,
                    format!(
                        "access to '{}' refused for user '{}'",
                        expr.as_str(),
                        self.identity.name()
                    ),
                ));
            }
        };
        q.bind(x, kind, rk, arguments.clone(), expr, guard)
            .map_err(|e| err(ReplyCode::InternalError, e))?;
        // The routes exchange-to-exchange bindings lead into the exchange.
        if let Err(e) = self.vhost.reroute(std::slice::from_ref(&q)) {
            q.unbind(x, rk, arguments);
            let _ = self.vhost.reroute(std::slice::from_ref(&q));
            return Err(err(ReplyCode::PreconditionFailed, e));
        }
        saved(&q)
    }

    fn queue_delete(
        &mut self,
        name: &ShortStr,
        if_unused: bool,
        if_empty: bool,
    ) -> Result<u32, AmqpError> {
        let q = match self.queue(name) {
            Ok(q) => q,
            Err(e) if e.code == ReplyCode::NotFound => return Ok(0),
            Err(e) => return Err(e),
        };
        self.may_serve(&q)?;
        let (m, c) = q.counts();
        if if_unused && c > 0 {
            return Err(err(
                ReplyCode::PreconditionFailed,
                format!(
                    "queue '{}' in vhost '{vh}' in use",
                    q.name,
                    vh = self.vhost.name
                ),
            ));
        }
        if if_empty && m > 0 {
            return Err(err(
                ReplyCode::PreconditionFailed,
                format!(
                    "queue '{}' in vhost '{vh}' is not empty",
                    q.name,
                    vh = self.vhost.name
                ),
            ));
        }
        Ok(delete_queue(&q))
    }

    #[allow(clippy::too_many_arguments)]
    fn consume(
        &mut self,
        ch: u16,
        queue: &ShortStr,
        tag: &ShortStr,
        no_ack: bool,
        exclusive: bool,
        no_wait: bool,
        session: &mut Session,
    ) -> Result<(), AmqpError> {
        let tag = if tag.is_empty() {
            ShortStr::lit(&format!("amq.ctag-{:016x}", rand_u64()))
        } else {
            tag.clone()
        };
        let c = self.chan(ch)?;
        // Consumers the broker cancelled (their queue deleted) are forgotten first.
        c.consumers
            .retain(|_, r| !matches!(r, ConsumerReg::Queue(q) if q.is_deleted()));
        if c.consumers.len() >= MAX_CONSUMERS {
            return Err(err(
                ReplyCode::PreconditionFailed,
                format!("a channel has at most {MAX_CONSUMERS} consumers"),
            ));
        }
        if c.consumers.contains_key(&tag) {
            return Err(err(
                ReplyCode::NotAllowed,
                format!("attempt to reuse consumer tag '{tag}'"),
            ));
        }
        let ok = Method::BasicConsumeOk {
            consumer_tag: tag.clone(),
        };
        if queue.as_bytes() == REPLY_TO_QUEUE.as_bytes() {
            if !no_ack {
                return Err(err(
                    ReplyCode::PreconditionFailed,
                    "reply consumer cannot acknowledge",
                ));
            }
            if self.own_reply_consumer() {
                return Err(err(
                    ReplyCode::PreconditionFailed,
                    "reply consumer already set",
                ));
            }
            let sid = self.next_sid;
            self.next_sid += 1;
            let next_tag = self.chan(ch)?.shared.next_tag.clone();
            lock(&self.own).insert(
                sid,
                OwnConsumer {
                    channel: ch,
                    tag: tag.clone(),
                    next_tag,
                },
            );
            let expr = KeyExpr::new(&format!("{}/{REPLY_SUFFIX}", session.inbox()))
                .map_err(|e| err(ReplyCode::InternalError, e.to_string()))?;
            if let Err(e) = session.subscribe(sid, expr, None, Qos::default()) {
                lock(&self.own).remove(&sid);
                return Err(err(ReplyCode::InternalError, e.to_string()));
            }
            self.answer(session, ch, no_wait, ok);
            self.chan(ch)?
                .consumers
                .insert(tag, ConsumerReg::ReplyTo(sid));
            return Ok(());
        }
        let q = self.queue(queue)?;
        self.may_serve(&q)?;
        let c = self.chan(ch)?;
        let consumer = Arc::new(Consumer {
            tag: tag.clone(),
            chan: c.shared.clone(),
            no_ack,
            exclusive,
            prefetch: c.prefetch,
            in_flight: AtomicUsize::new(0),
        });
        // consume-ok once the queue took the consumer, before any delivery (under the
        // queue's lock: the queue may deliver as soon as it is added).
        let outbox = session.outbox().clone();
        let added = || {
            if !no_wait {
                outbox.push_reply_unbudgeted(|o| Frame::Method(ch, ok).encode(o.tail()));
            }
        };
        if q.add_consumer(consumer, added).is_err() {
            return Err(err(
                ReplyCode::AccessRefused,
                format!(
                    "queue '{}' in vhost '{vh}' in exclusive use",
                    q.name,
                    vh = self.vhost.name
                ),
            ));
        }
        self.chan(ch)?.consumers.insert(tag, ConsumerReg::Queue(q));
        session.mark_own_output();
        Ok(())
    }

    fn cancel(&mut self, ch: u16, tag: &ShortStr, session: &mut Session) {
        let Some(c) = self.channels.get_mut(&ch) else {
            return;
        };
        match c.consumers.remove(tag) {
            Some(ConsumerReg::Queue(q)) if q.remove_consumer(&c.shared, tag) => {
                delete_queue(&q);
            }
            Some(ConsumerReg::ReplyTo(sid)) => {
                session.unsubscribe(sid);
                lock(&self.own).remove(&sid);
            }
            Some(ConsumerReg::Queue(_)) | None => {}
        }
    }

    /// Stops a channel's deliveries: its consumers leave their queues.
    fn release_channel_consumers(&mut self, ch: u16, session: &mut Session) {
        let Some(c) = self.channels.get_mut(&ch) else {
            return;
        };
        lock(&c.shared.st).closed = true;
        for (_, reg) in c.consumers.drain() {
            match reg {
                ConsumerReg::Queue(q) => {
                    if q.remove_channel(&c.shared) {
                        delete_queue(&q);
                    }
                }
                ConsumerReg::ReplyTo(sid) => {
                    session.unsubscribe(sid);
                    lock(&self.own).remove(&sid);
                }
            }
        }
    }

    /// Closes a channel: consumers leave, unacknowledged deliveries go back to their
    /// queues (redelivered).
    async fn release_channel(&mut self, ch: u16, session: &mut Session) {
        self.release_channel_consumers(ch, session);
        let Some(c) = self.channels.remove(&ch) else {
            return;
        };
        if let Some(cf) = &c.confirms {
            lock(cf).closed = true;
        }
        let held = c.pending.as_ref().map_or(0, |p| p.body.len())
            + c.tx
                .iter()
                .flatten()
                .map(|o| match o {
                    TxOp::Publish(p) => p.body.len(),
                    _ => 0,
                })
                .sum::<usize>();
        self.release_held(held);
        let unacked = std::mem::take(&mut lock(&c.shared.st).unacked);
        // All back to their places before any goes out again: the original order is kept.
        give_back_all(unacked.into_values(), true);
    }

    /// The connection ends: every channel closes, exclusive queues go.
    async fn release_all(&mut self, session: &mut Session) {
        let chans: Vec<u16> = self.channels.keys().copied().collect();
        for ch in chans {
            self.release_channel(ch, session).await;
        }
        for q in std::mem::take(&mut self.exclusive) {
            delete_queue(&q);
        }
    }
}

/// Room for one more operation in a transaction?
fn tx_room(tx: &[TxOp]) -> Result<(), AmqpError> {
    if tx.len() >= MAX_TX_OPS {
        return Err(err(
            ReplyCode::PreconditionFailed,
            format!("a transaction holds at most {MAX_TX_OPS} operations"),
        ));
    }
    Ok(())
}

/// A key for content that has none (an unroutable publish returned).
fn return_key() -> Key {
    Key::new("amqp").unwrap_or_else(|_| unreachable!("a valid key"))
}

fn refuse_syntax(why: String) -> End {
    End::Hard(err(ReplyCode::SyntaxError, why))
}

/// The queues a channel's consumers take from.
fn channel_queues(c: &Channel) -> Vec<Arc<Queue>> {
    c.consumers
        .values()
        .filter_map(|r| match r {
            ConsumerReg::Queue(q) => Some(q.clone()),
            ConsumerReg::ReplyTo(_) => None,
        })
        .collect()
}

/// basic.ack (`requeue` None), basic.nack / basic.reject (`Some(requeue)`) of `tag` (and
/// every earlier one with `multiple`; tag 0 with `multiple` is all of them).
fn settle(
    c: &mut Channel,
    tag: u64,
    multiple: bool,
    requeue: Option<bool>,
) -> Result<(), AmqpError> {
    let settled: Vec<Unacked> = {
        let mut st = lock(&c.shared.st);
        if multiple {
            let upto = if tag == 0 { u64::MAX } else { tag };
            let keep = st.unacked.split_off(&upto.saturating_add(1));
            let taken = std::mem::replace(&mut st.unacked, keep);
            if taken.is_empty() && tag != 0 {
                return Err(err(
                    ReplyCode::PreconditionFailed,
                    format!("unknown delivery tag {tag}"),
                ));
            }
            taken.into_values().collect()
        } else {
            match st.unacked.remove(&tag) {
                Some(u) => vec![u],
                None => {
                    return Err(err(
                        ReplyCode::PreconditionFailed,
                        format!("unknown delivery tag {tag}"),
                    ));
                }
            }
        }
    };
    match requeue {
        None => {
            for u in &settled {
                u.queue.settled(u);
            }
        }
        // All back to their places (or dead-lettered) before any goes out again: given
        // back in their original order.
        Some(rq) => give_back_all(settled, rq),
    }
    Ok(())
}

/// Deletes a queue: out of the registry, its consumers told (basic.cancel on their
/// channels), its bindings gone. How many messages it held.
pub(crate) fn delete_queue(q: &Arc<Queue>) -> u32 {
    let _topology = lock(&q.vhost.topology);
    // Its bindings go with it: auto-delete exchanges they were the last of go too.
    let exchanges: Vec<String> = q.bindings().into_iter().map(|b| b.exchange).collect();
    {
        let mut reg = lock(&q.vhost.registry);
        if reg.queues.get(&q.name).is_some_and(|x| Arc::ptr_eq(x, q)) {
            reg.queues.remove(&q.name);
        }
    }
    let (n, consumers) = q.delete();
    for c in consumers {
        let m = Method::BasicCancel {
            consumer_tag: c.tag.clone(),
            no_wait: true,
        };
        let ch = c.chan.channel;
        c.chan
            .outbox
            .push_control_unbudgeted(|b| Frame::Method(ch, m).encode(b));
    }
    q.vhost.drop_unused_exchanges(exchanges);
    n
}

/// 64 random bits for generated names (not secret: uniqueness with the counter beside).
fn rand_u64() -> u64 {
    let mut b = [0u8; 8];
    let _ = getrandom::fill(&mut b);
    u64::from_le_bytes(b)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(s: &str) -> Option<Key> {
        Key::new(s).ok()
    }

    /// Hits by both names and the type; the split between the names counts; once full, a
    /// miss replaces the oldest entry and the rest stay.
    #[test]
    fn publish_keys_remember_the_last_distinct_targets() {
        let mut k = PublishKeys::default();
        k.put(b"ab", Kind::Direct, b"c", key("one"));
        assert_eq!(k.get(b"ab", Kind::Direct, b"c"), Some(&key("one")));
        assert_eq!(k.get(b"a", Kind::Direct, b"bc"), None);
        assert_eq!(k.get(b"ab", Kind::Topic, b"c"), None);
        for i in 1..PUBLISH_KEYS {
            k.put(
                b"",
                Kind::Direct,
                format!("q{i}").as_bytes(),
                key(&format!("q{i}")),
            );
        }
        assert_eq!(k.entries.len(), PUBLISH_KEYS);
        // Full: the next miss takes the oldest slot ("ab"/"c"), the others stay.
        k.put(b"", Kind::Direct, b"new", None);
        assert_eq!(k.entries.len(), PUBLISH_KEYS);
        assert_eq!(k.get(b"ab", Kind::Direct, b"c"), None);
        assert_eq!(k.get(b"", Kind::Direct, b"new"), Some(&None));
        assert_eq!(k.get(b"", Kind::Direct, b"q1"), Some(&key("q1")));
        k.clear();
        assert_eq!(k.get(b"", Kind::Direct, b"q1"), None);
    }
}
