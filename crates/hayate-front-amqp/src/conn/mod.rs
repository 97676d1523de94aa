//! One AMQP 0-9-1 connection: the protocol header, connection.start / start-ok (SASL PLAIN,
//! AMQPLAIN, ANONYMOUS when allowed) / tune / open, then channels and their methods until
//! connection.close, an error, a heartbeat timeout or shutdown.
//!
//! Errors follow RabbitMQ: a soft error closes the channel (channel.close with the code and
//! `CODE_NAME - text`; the channel's frames are ignored until channel.close-ok), a hard one
//! the connection (connection.close, then the socket).
//!
//! # Layout
//! - this module: [`Conn`] (a connection's state) and [`serve`];
//! - `frames`: the driver's side (decoding, timers, heartbeats), what each frame leads to,
//!   and the dispatch of a channel's methods to their class;
//! - `error`: [`AmqpError`] (soft and hard errors) and how a connection ends ([`End`]);
//! - by AMQP class: `connection` (handshake, SASL / login, tune, open, close, blocked),
//!   `channel` (open, close, flow; a channel's state), `exchange`, `queue`, `basic`
//!   (qos, consume, cancel, get, recover, ack / nack / reject), `confirm` (publisher
//!   confirms: `Confirms`), `tx`;
//! - `publish`: basic.publish and its content frames, from frames to a routed message.

mod basic;
mod channel;
mod confirm;
mod connection;
mod error;
mod exchange;
mod frames;
mod publish;
mod queue;
mod tx;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hayate_amqp::frame::PROTOCOL_HEADER;
use hayate_amqp::{Frame, FrameDecoder, Method, ShortStr};
use hayate_broker::Session;
use hayate_core::Key;
use tokio::time::Instant;

use super::delivery::{AmqpEncoder, OwnConsumer};
use super::queue::Queue;
use super::{Amqp, Exchange, FastMap, VHost};
use channel::Channel;
use error::End;
use frames::Driven;
use hayate_front::auth::Identity;
use hayate_front::{Accepted, Peer, Serving};
use publish::PublishKeys;
pub(crate) use queue::delete_queue;

/// The key, under the connection's inbox, of its direct reply-to consumer.
const REPLY_SUFFIX: &str = "amqp";

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

/// Per-connection state.
struct Conn<'a> {
    amqp: &'a Arc<Amqp>,
    id: u64,
    identity: Identity,
    /// Who is at the other end (address, verified certificate's user) and the connection's
    /// entry among the server's live connections.
    peer: Peer,
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

/// Serves one AMQP connection until it closes.
pub async fn serve(io: Accepted, amqp: Arc<Amqp>) {
    let frame_max = Arc::new(AtomicUsize::new(hayate_amqp::FRAME_MIN_SIZE as usize));
    let own = Arc::new(Mutex::new(FastMap::default()));
    let encoder = Box::new(AmqpEncoder {
        consumers: own.clone(),
        frame_max: frame_max.clone(),
        routing_key: Vec::new(),
    });
    let (peer, session, mut serving) = Serving::open(io, &amqp.broker, encoder);
    let now = Instant::now();
    let mut h = Driven {
        c: Conn {
            amqp: &amqp,
            id: amqp.next_id(),
            identity: Identity::anonymous(),
            peer,
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
    let end = serving.conn.drive(&mut h).await;
    let (mut c, mut session) = (h.c, h.session);
    c.release_all(&mut session).await;
    match end {
        End::BadHeader => serving
            .outbox
            .push_control_unbudgeted(|b| b.extend_from_slice(&PROTOCOL_HEADER)),
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
            serving
                .outbox
                .push_control_unbudgeted(|b| Frame::Method(0, m).encode(b));
        }
        End::Done => {}
    }
    serving.close(session).await;
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
}
