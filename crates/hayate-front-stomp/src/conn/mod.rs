//! One STOMP connection: CONNECT (or STOMP), then frames until DISCONNECT, an error, a
//! heart-beat timeout or shutdown.
//!
//! # Layout
//! - this module: [`serve`], the connection's state and the connection driver's handler
//!   (decoding, receipts, the handshake deadline and the heart-beat timers), the ERROR
//!   frame that ends a connection;
//! - `handshake`: CONNECT (or STOMP): version, login, heart-beat negotiation, CONNECTED;
//! - `frames`: every frame after it (SEND, SUBSCRIBE, ACK, transactions, ...) and the
//!   destinations they name.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use hayate_broker::Session;
use hayate_stomp::{Command, Frame, Item, Limits, Version, encode};
use tokio::time::Instant;

use super::Stomp;
use super::delivery::{StompDeliveries, StompEncoder};
use hayate_core::sync::lock;
use hayate_front::{Accepted, Handler, Peer, Serving, Stop, SubTable};

mod frames;
mod handshake;

/// A refusal: the ERROR frame's `message` header and body.
#[derive(Debug)]
struct Refusal {
    message: String,
    detail: String,
    /// Extra headers of the ERROR frame.
    headers: Vec<(&'static str, &'static str)>,
}

fn refuse(message: impl Into<String>, detail: impl Into<String>) -> Refusal {
    Refusal {
        message: message.into(),
        detail: detail.into(),
        headers: Vec::new(),
    }
}

/// Per-connection state.
struct Conn<'a> {
    stomp: &'a Stomp,
    /// Who the client is (anonymous until CONNECT's login is checked).
    identity: hayate_front::auth::Identity,
    /// Where the client comes from, and the connection's entry among the server's live
    /// connections (admin API).
    peer: Peer,
    out: Arc<Mutex<StompDeliveries>>,
    connected: bool,
    version: Version,
    /// Subscription ids → broker subscription ids.
    subs: SubTable,
    /// The broker subscription of the temp-queues, once one is used.
    temp_sid: Option<u32>,
    /// Open transactions: their buffered SEND, ACK and NACK frames.
    tx: HashMap<String, Vec<Frame>>,
    /// What the open transactions hold (bytes, as [`frames::tx_cost`] counts them), and its
    /// charge to the broker-wide memory budget.
    tx_bytes: usize,
    tx_charge: hayate_flow::memory::Charge,
    /// `/queue/` subscriptions served by a stream's consumer (durable queues).
    members: hayate_front::Memberships,
    /// Queues this connection declared (to avoid asking the broker again).
    declared: std::collections::HashSet<String>,
    /// Negotiated heart-beats: how often to send, how long to wait for the client.
    send_every: Option<Duration>,
    recv_timeout: Option<Duration>,
}

/// The STOMP front-end as the connection driver sees it: the connection state, its session
/// and its timers.
struct Driven<'a> {
    c: Conn<'a>,
    session: Session,
    limits: Limits,
    /// Until CONNECT: the handshake deadline; then the client's heart-beat deadline, if any.
    quiet: Instant,
    /// When our next heart-beat is due, once connected with heart-beats.
    beat: Option<Instant>,
    beating: bool,
    /// When the last read brought input (once heart-beats are expected).
    last_read: Option<Instant>,
    /// How much of a body arriving without `content-length` was already searched for its NUL.
    scanned: hayate_stomp::Scanned,
}

/// `None`: a graceful end; `Some`: an ERROR frame for the client.
type End = Option<Refusal>;

impl Handler for Driven<'_> {
    type Frame = Item;
    type End = End;

    fn decode(&mut self, buf: &mut BytesMut) -> Result<Option<Item>, End> {
        // Before CONNECT is accepted a frame may be at most `max_preauth_bytes` (headers and
        // body each).
        let pre;
        let limits = if self.c.connected {
            &self.limits
        } else {
            pre = Limits {
                max_headers: self.limits.max_headers,
                max_header_bytes: self.limits.max_header_bytes.min(self.c.stomp.max_preauth),
                max_body: self.limits.max_body.min(self.c.stomp.max_preauth),
            };
            &pre
        };
        hayate_stomp::decode_resuming(buf, self.c.version, limits, &mut self.scanned)
            .map_err(|e| Some(refuse("malformed frame", e.to_string())))
    }

    async fn handle(&mut self, item: Item) -> Result<(), End> {
        let Item::Frame(f) = item else {
            return Ok(()); // a heart-beat
        };
        let receipt = f.get("receipt").map(str::to_string);
        match self.c.handle(f, &mut self.session).await {
            Ok(go_on) => {
                if let Some(r) = receipt {
                    self.c.reply(
                        &mut self.session,
                        Frame::new(Command::Receipt).header("receipt-id", &r),
                    );
                }
                if !go_on {
                    return Err(None);
                }
            }
            Err(mut e) => {
                if let Some(r) = receipt {
                    e.detail = format!("{}\n(receipt {r})", e.detail);
                }
                return Err(Some(e));
            }
        }
        if self.c.connected && !self.beating {
            self.beating = true;
            let now = Instant::now();
            self.beat = self.c.send_every.map(|every| now + every);
            self.quiet = now
                + self
                    .c
                    .recv_timeout
                    .unwrap_or(Duration::from_secs(86_400 * 365));
        }
        Ok(())
    }

    fn flush(&mut self) {
        self.session.flush();
    }

    fn on_read(&mut self) {
        if self.c.connected && self.c.recv_timeout.is_some() {
            // A clock read, not a timer move: the deadline catches up when it fires.
            self.last_read = Some(Instant::now());
        }
    }

    fn deadline(&self) -> Option<Instant> {
        Some(self.beat.map_or(self.quiet, |b| b.min(self.quiet)))
    }

    async fn on_timer(&mut self) -> Result<(), End> {
        let now = Instant::now();
        if let (Some(last), Some(t)) = (self.last_read, self.c.recv_timeout)
            && last + t > self.quiet
        {
            self.quiet = last + t;
        }
        if now >= self.quiet {
            return Err(Some(if self.c.connected {
                refuse(
                    "heart-beat timeout",
                    "nothing received within twice the negotiated heart-beat interval",
                )
            } else {
                refuse(
                    "no CONNECT",
                    "no CONNECT frame within the handshake timeout",
                )
            }));
        }
        if let (Some(at), Some(every)) = (self.beat, self.c.send_every)
            && now >= at
        {
            self.beat = Some(now + every);
            self.session
                .outbox()
                .push_control_unbudgeted(|b| b.extend_from_slice(b"\n"));
        }
        Ok(())
    }

    fn stopped(&mut self, why: Stop) -> End {
        match why {
            Stop::Shutdown => Some(refuse("server shutting down", "")),
            Stop::Eof | Stop::Io | Stop::WriterGone => None,
            Stop::Memory => Some(refuse(
                "server busy",
                "the broker's memory budget is spent: the frame was not read within limits.max_block_ms",
            )),
        }
    }
}

/// Serves one STOMP connection until it closes.
pub async fn serve(io: Accepted, stomp: Arc<Stomp>) {
    let limits = Limits {
        max_headers: stomp.cfg.max_headers,
        max_header_bytes: 64 * 1024,
        max_body: stomp.cfg.max_frame_size,
    };
    let out = Arc::new(Mutex::new(StompDeliveries::new(String::new())));
    let encoder = Box::new(StompEncoder { out: out.clone() });
    let (peer, session, mut serving) = Serving::open(io, &stomp.broker, encoder);
    lock(&out).temp_prefix = format!("{}/", session.inbox());
    let mut h = Driven {
        c: Conn {
            stomp: &stomp,
            identity: hayate_front::auth::Identity::anonymous(),
            peer,
            out: out.clone(),
            connected: false,
            version: Version::V1_0,
            subs: SubTable::default(),
            temp_sid: None,
            tx: HashMap::new(),
            tx_bytes: 0,
            tx_charge: hayate_flow::memory::Charge::exact(&session.broker().config().memory),
            members: Default::default(),
            declared: Default::default(),
            send_every: None,
            recv_timeout: None,
        },
        session,
        limits,
        quiet: Instant::now() + stomp.handshake_timeout,
        beat: None,
        beating: false,
        last_read: None,
        scanned: hayate_stomp::Scanned::default(),
    };
    let end = serving.conn.drive(&mut h).await;
    let (mut c, session) = (h.c, h.session);
    // A durable queue's messages this connection held go back to its consumer, at once.
    c.members.leave_all(&session).await;
    if let Some(e) = end {
        tracing::debug!(message = e.message, "stomp: error");
        let mut f = Frame::new(Command::Error)
            .header("message", &e.message)
            .header("content-type", "text/plain");
        for (k, v) in &e.headers {
            f = f.header(k, v);
        }
        if !e.detail.is_empty() {
            f = f.body(Bytes::from(e.detail.into_bytes()));
        }
        let v = c.version;
        serving.outbox.push_control_unbudgeted(|b| encode(&f, v, b));
    }
    // Messages left unacknowledged go back to their queues (topic messages are dropped).
    serving.close(session).await;
}

impl Conn<'_> {
    fn reply(&self, session: &mut Session, f: Frame) {
        let v = self.version;
        session
            .outbox()
            .push_reply_unbudgeted(|o| encode(&f, v, o.tail()));
        session.mark_own_output();
    }
}
