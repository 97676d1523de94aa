//! One STOMP connection: CONNECT (or STOMP), then frames until DISCONNECT, an error, a
//! heart-beat timeout or shutdown.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use hayate_broker::{Batch, Session, Settle};
use hayate_core::{INBOX_PREFIX, Key, KeyExpr, Message, Qos};
use hayate_stomp::{Command, Frame, Item, Limits, Version, decode, encode};
use tokio::time::Instant;

use super::Stomp;
use super::delivery::{AckMode, Kind, StompDeliveries, StompEncoder, Sub, lock};
use crate::frontend::{self, Accepted, Handler, Stop, SubTable};

const READ_BUF: usize = 64 * 1024;

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
    out: Arc<Mutex<StompDeliveries>>,
    connected: bool,
    version: Version,
    /// Subscription ids → broker subscription ids.
    subs: SubTable,
    /// The broker subscription of the temp-queues, once one is used.
    temp_sid: Option<u32>,
    /// Open transactions: their buffered SEND, ACK and NACK frames.
    tx: HashMap<String, Vec<Frame>>,
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
}

/// `None`: a graceful end; `Some`: an ERROR frame for the client.
type End = Option<Refusal>;

impl Handler for Driven<'_> {
    type Frame = Item;
    type End = End;

    fn decode(&mut self, buf: &mut BytesMut) -> Result<Option<Item>, End> {
        decode(buf, self.c.version, &self.limits)
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

    fn session(&mut self) -> &mut Session {
        &mut self.session
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
    let session = stomp
        .broker
        .open_session(Box::new(StompEncoder { out: out.clone() }));
    lock(&out).temp_prefix = format!("{INBOX_PREFIX}/{}/", session.id());
    let outbox = session.outbox().clone();
    let mut conn = frontend::Conn::new(io, BytesMut::with_capacity(READ_BUF), &outbox);
    let mut h = Driven {
        c: Conn {
            stomp: &stomp,
            out: out.clone(),
            connected: false,
            version: Version::V1_0,
            subs: SubTable::default(),
            temp_sid: None,
            tx: HashMap::new(),
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
    };
    let end = conn.drive(&mut h).await;
    let (c, mut session) = (h.c, h.session);
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
        outbox.push_control_unbudgeted(|b| encode(&f, v, b));
    }
    // Messages left unacknowledged go back to their queues (topic messages are dropped).
    session.release_unacked(None).await;
    session.flush();
    drop(session);
    conn.close(&outbox).await;
}

/// Headers of a SEND that are the frame's, not the message's.
fn is_frame_header(name: &str) -> bool {
    matches!(
        name,
        "destination"
            | "content-length"
            | "receipt"
            | "transaction"
            | "reply-to"
            | "correlation-id"
            | "message-id"
            | "subscription"
            | "ack"
    )
}

impl Conn<'_> {
    fn reply(&self, session: &mut Session, f: Frame) {
        let v = self.version;
        session
            .outbox()
            .push_reply_unbudgeted(|o| encode(&f, v, o.tail()));
        session.mark_own_output();
    }

    /// Handles one frame; `Ok(false)` ends the connection (DISCONNECT).
    async fn handle(&mut self, f: Frame, session: &mut Session) -> Result<bool, Refusal> {
        if !self.connected {
            return match f.command {
                Command::Connect | Command::Stomp => {
                    self.connect(&f, session)?;
                    Ok(true)
                }
                other => Err(refuse(
                    "not connected",
                    format!(
                        "the first frame must be CONNECT or STOMP, not {}",
                        other.as_str()
                    ),
                )),
            };
        }
        match f.command {
            Command::Send | Command::Ack | Command::Nack if f.get("transaction").is_some() => {
                let t = f.get("transaction").unwrap_or_default().to_string();
                match self.tx.get_mut(&t) {
                    Some(frames) => frames.push(f),
                    None => {
                        return Err(refuse(
                            "unknown transaction",
                            format!("no transaction {t:?} was begun"),
                        ));
                    }
                }
            }
            Command::Send => self.send(&f, session).await?,
            Command::Subscribe => self.subscribe(&f, session)?,
            Command::Unsubscribe => self.unsubscribe(&f, session).await?,
            Command::Ack => self.ack(&f, session, false).await?,
            Command::Nack => self.ack(&f, session, true).await?,
            Command::Begin => {
                let t = tx_name(&f)?;
                if self.tx.contains_key(&t) {
                    return Err(refuse(
                        "transaction exists",
                        format!("transaction {t:?} was already begun"),
                    ));
                }
                self.tx.insert(t, Vec::new());
            }
            Command::Commit => {
                let t = tx_name(&f)?;
                let Some(frames) = self.tx.remove(&t) else {
                    return Err(refuse(
                        "unknown transaction",
                        format!("no transaction {t:?} was begun"),
                    ));
                };
                for f in frames {
                    match f.command {
                        Command::Send => self.send(&f, session).await?,
                        Command::Ack => self.ack(&f, session, false).await?,
                        Command::Nack => self.ack(&f, session, true).await?,
                        _ => {}
                    }
                }
            }
            Command::Abort => {
                let t = tx_name(&f)?;
                if self.tx.remove(&t).is_none() {
                    return Err(refuse(
                        "unknown transaction",
                        format!("no transaction {t:?} was begun"),
                    ));
                }
            }
            Command::Disconnect => return Ok(false),
            Command::Connect | Command::Stomp => {
                return Err(refuse("already connected", "a second CONNECT"));
            }
            other => {
                return Err(refuse(
                    "unexpected frame",
                    format!("a client may not send {}", other.as_str()),
                ));
            }
        }
        Ok(true)
    }

    fn connect(&mut self, f: &Frame, session: &mut Session) -> Result<(), Refusal> {
        let version = match f.get("accept-version") {
            None => Version::V1_0,
            Some(a) => match Version::parse_accept(a) {
                Some(v) => v,
                None => {
                    let mut e = refuse(
                        "unsupported protocol version",
                        format!("the client accepts {a:?}; this server speaks 1.0, 1.1 and 1.2"),
                    );
                    // STOMP 1.2: the ERROR lists the versions the server supports.
                    e.headers.push(("version", "1.0,1.1,1.2"));
                    return Err(e);
                }
            },
        };
        let login = f.get("login");
        let passcode = f.get("passcode").map(str::as_bytes);
        if self
            .stomp
            .auth
            .authenticate("stomp", login, passcode)
            .is_err()
        {
            return Err(refuse("access refused", "bad login or passcode"));
        }
        let (cx, cy) = match f.get("heart-beat") {
            None => (0, 0),
            Some(h) => parse_heart_beat(h).ok_or_else(|| {
                refuse(
                    "malformed heart-beat",
                    format!("heart-beat {h:?} is not two numbers"),
                )
            })?,
        };
        let s = self.stomp.cfg.heart_beat_ms;
        let (sx, sy) = (s, s);
        if version >= Version::V1_1 {
            if sx > 0 && cy > 0 {
                self.send_every = Some(Duration::from_millis(u64::from(sx.max(cy))));
            }
            if cx > 0 && sy > 0 {
                self.recv_timeout = Some(Duration::from_millis(2 * u64::from(cx.max(sy))));
            }
        }
        self.version = version;
        lock(&self.out).version = version;
        self.connected = true;
        let mut r = Frame::new(Command::Connected)
            .header("version", version.as_str())
            .header("server", &self.stomp.server_name)
            .header("session", &session.id().to_string());
        if version >= Version::V1_1 {
            r = r.header("heart-beat", &format!("{sx},{sy}"));
        }
        self.reply(session, r);
        Ok(())
    }

    /// The key a SEND destination names.
    fn send_key(&mut self, dest: &str, session: &mut Session) -> Result<Key, Refusal> {
        let key = |k: &str| {
            Key::new(k).map_err(|e| refuse("invalid destination", format!("{dest:?}: {e}")))
        };
        if let Some(k) = dest.strip_prefix("/topic/") {
            key(k)
        } else if let Some(q) = dest.strip_prefix("/queue/") {
            let k = key(q)?;
            self.declare(q, session)?;
            Ok(k)
        } else if let Some(t) = dest.strip_prefix("/temp-queue/") {
            self.temp_key(t, session)
        } else {
            Err(refuse(
                "unknown destination",
                format!(
                    "{dest:?}: destinations are /topic/<key>, /queue/<name> or /temp-queue/<name>"
                ),
            ))
        }
    }

    /// Declares queue `name` (messages wait for a consumer), once per connection. Inbox
    /// keys are not queues.
    fn declare(&mut self, name: &str, session: &mut Session) -> Result<(), Refusal> {
        if name.starts_with(INBOX_PREFIX) || self.declared.contains(name) {
            return Ok(());
        }
        let expr = KeyExpr::new(name)
            .map_err(|e| refuse("invalid destination", format!("/queue/{name}: {e}")))?;
        session
            .broker()
            .declare_queue(name, &expr, self.stomp.cfg.queue_max_backlog);
        self.declared.insert(name.to_string());
        Ok(())
    }

    /// The key of this connection's temp-queue `name`, subscribing the temp-queues first.
    fn temp_key(&mut self, name: &str, session: &mut Session) -> Result<Key, Refusal> {
        let prefix = lock(&self.out).temp_prefix.clone();
        let k = Key::new(&format!("{prefix}{name}"))
            .map_err(|e| refuse("invalid destination", format!("/temp-queue/{name}: {e}")))?;
        if self.temp_sid.is_none() {
            let sid = self.subs.next_sid();
            lock(&self.out).subs.insert(
                sid,
                Sub {
                    id: String::new(),
                    destination: String::new(),
                    ack: AckMode::Auto,
                    kind: Kind::Temp,
                },
            );
            let expr = KeyExpr::new(&format!("{prefix}**"))
                .map_err(|e| refuse("internal error", e.to_string()))?;
            session
                .subscribe(sid, expr, None, Qos::default())
                .map_err(|e| refuse("internal error", e.to_string()))?;
            self.temp_sid = Some(sid);
        }
        Ok(k)
    }

    async fn send(&mut self, f: &Frame, session: &mut Session) -> Result<(), Refusal> {
        let dest = f
            .get("destination")
            .ok_or_else(|| refuse("missing destination", "SEND needs a destination header"))?;
        let key = self.send_key(dest, session)?;
        let mut msg = Message::new(key, f.body.clone());
        if let Some(r) = f.get("reply-to") {
            msg.reply_to = Some(if let Some(t) = r.strip_prefix("/temp-queue/") {
                self.temp_key(t, session)?
            } else if let Some(k) = r
                .strip_prefix("/queue/")
                .or_else(|| r.strip_prefix("/topic/"))
            {
                Key::new(k).map_err(|e| refuse("invalid reply-to", format!("{r:?}: {e}")))?
            } else {
                return Err(refuse(
                    "invalid reply-to",
                    format!("{r:?}: use /temp-queue/<name>, /queue/<name> or /topic/<key>"),
                ));
            });
        }
        if let Some(c) = f.get("correlation-id") {
            msg.correlation_id = Some(super::delivery::correlation_bytes(c));
        }
        let mut headers: Vec<(String, Bytes)> = Vec::new();
        for (k, v) in &f.headers {
            // The first of repeated headers wins (STOMP 1.2).
            if !is_frame_header(k) && !headers.iter().any(|(n, _)| n == k) {
                headers.push((k.clone(), Bytes::copy_from_slice(v.as_bytes())));
            }
        }
        if !headers.is_empty() {
            msg.headers = Some(headers);
        }
        session.publish(Batch::One(&msg)).await;
        Ok(())
    }

    fn subscribe(&mut self, f: &Frame, session: &mut Session) -> Result<(), Refusal> {
        let dest = f.get("destination").ok_or_else(|| {
            refuse(
                "missing destination",
                "SUBSCRIBE needs a destination header",
            )
        })?;
        let id = match f.get("id") {
            Some(id) => id.to_string(),
            None if self.version == Version::V1_0 => dest.to_string(),
            None => return Err(refuse("missing id", "SUBSCRIBE needs an id header")),
        };
        if self.subs.contains(&id) {
            return Err(refuse(
                "duplicate subscription",
                format!("subscription id {id:?} is in use"),
            ));
        }
        let ack = match f.get("ack").unwrap_or("auto") {
            "auto" => AckMode::Auto,
            "client" => AckMode::Client,
            "client-individual" => AckMode::ClientIndividual,
            a => {
                return Err(refuse(
                    "invalid ack mode",
                    format!("ack {a:?}: use auto, client or client-individual"),
                ));
            }
        };
        let (expr, kind, group) = if let Some(e) = dest.strip_prefix("/topic/") {
            let expr = KeyExpr::new(e)
                .map_err(|e| refuse("invalid destination", format!("{dest:?}: {e}")))?;
            (expr, Kind::Topic, None)
        } else if let Some(q) = dest.strip_prefix("/queue/") {
            Key::new(q).map_err(|e| refuse("invalid destination", format!("{dest:?}: {e}")))?;
            self.declare(q, session)?;
            let expr = KeyExpr::new(q)
                .map_err(|e| refuse("invalid destination", format!("{dest:?}: {e}")))?;
            (
                expr.clone(),
                Kind::Queue {
                    name: q.to_string(),
                    expr,
                },
                Some(q.to_string()),
            )
        } else if let Some(t) = dest.strip_prefix("/temp-queue/") {
            self.temp_key(t, session)?;
            lock(&self.out).temp_ids.insert(t.to_string(), id.clone());
            if let Some(sid) = self.temp_sid {
                self.subs.bind(id, sid);
            }
            return Ok(());
        } else {
            return Err(refuse(
                "unknown destination",
                format!(
                    "{dest:?}: destinations are /topic/<expr>, /queue/<name> or /temp-queue/<name>"
                ),
            ));
        };
        let sid = self.subs.next_sid();
        // Options first: the queue's waiting messages are delivered by `subscribe`.
        lock(&self.out).subs.insert(
            sid,
            Sub {
                id: id.clone(),
                destination: dest.to_string(),
                ack,
                kind,
            },
        );
        let qos = if ack == AckMode::Auto {
            Qos::default()
        } else {
            Qos::ACKED
        };
        if let Err(e) = session.subscribe(sid, expr, group.as_deref(), qos) {
            lock(&self.out).subs.remove(&sid);
            return Err(refuse("subscribe failed", e.to_string()));
        }
        self.subs.bind(id, sid);
        Ok(())
    }

    async fn unsubscribe(&mut self, f: &Frame, session: &mut Session) -> Result<(), Refusal> {
        let id = f
            .get("id")
            .or_else(|| {
                f.get("destination")
                    .filter(|_| self.version == Version::V1_0)
            })
            .ok_or_else(|| refuse("missing id", "UNSUBSCRIBE needs an id header"))?;
        let Some(sid) = self.subs.remove(id) else {
            return Err(refuse(
                "unknown subscription",
                format!("no subscription {id:?}"),
            ));
        };
        if Some(sid) == self.temp_sid {
            lock(&self.out).temp_ids.retain(|_, v| v != id);
            return Ok(());
        }
        // Unacknowledged messages go to other consumers of the queue first (they need the
        // subscription's group).
        session.release_unacked(Some(sid)).await;
        session.unsubscribe(sid);
        lock(&self.out).subs.remove(&sid);
        Ok(())
    }

    async fn ack(&mut self, f: &Frame, session: &mut Session, nack: bool) -> Result<(), Refusal> {
        let name = if self.version == Version::V1_2 {
            "id"
        } else {
            "message-id"
        };
        let id = f.get(name).ok_or_else(|| {
            refuse(
                "missing id",
                format!(
                    "{} needs an {name} header",
                    if nack { "NACK" } else { "ACK" }
                ),
            )
        })?;
        if id.starts_with('a') && id[1..].parse::<u64>().is_ok() {
            return Ok(()); // a message of an `auto` subscription: nothing to settle
        }
        let Ok(n) = id.parse::<u64>() else {
            return Err(refuse(
                "unknown message",
                format!("{name} {id:?} was not delivered here"),
            ));
        };
        // `client` mode settles every earlier message of the subscription too.
        let Some(sid) = session.outbox().delivery_sid(n) else {
            return Ok(()); // already settled (a cumulative ACK covered it)
        };
        let how = match lock(&self.out).subs.get(&sid).map(|s| s.ack) {
            Some(AckMode::Client) => Settle::ThroughSubscription,
            _ => Settle::One,
        };
        let settled = session.outbox().settle(n, how);
        session.mark_own_output();
        if nack {
            for d in settled {
                session.give_back(d, true).await;
            }
        }
        Ok(())
    }
}

fn tx_name(f: &Frame) -> Result<String, Refusal> {
    f.get("transaction").map(str::to_string).ok_or_else(|| {
        refuse(
            "missing transaction",
            format!("{} needs a transaction header", f.command.as_str()),
        )
    })
}

fn parse_heart_beat(h: &str) -> Option<(u32, u32)> {
    let (a, b) = h.split_once(',')?;
    Some((a.trim().parse().ok()?, b.trim().parse().ok()?))
}
