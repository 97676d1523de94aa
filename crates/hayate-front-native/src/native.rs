//! The native protocol front-end.

use std::sync::Arc;
use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use futures::future::BoxFuture;
use futures::stream::FuturesUnordered;
use futures::{FutureExt, StreamExt};

use hayate_broker::{Batch, Broker, Delivery, Encoder, OutBuf, Outbox, Session, Settle, Stored};
use hayate_core::{Key, KeyExpr, Message};
use hayate_native::{HELLO_SHM, HelloAuth};

use hayate_front::auth::{Authenticator, Credentials, Identity};
use hayate_native::{
    ConfirmOutcome, ErrorCode, Frame, PROTOCOL_VERSION, ReadPlanner, Welcome, encode,
    encode_msg_acked_head, encode_msg_batch_head, encode_msg_head, encode_msg_ref,
};
use tokio::time::Instant;

use hayate_broker::stream::api::{self, API_PREFIX};
use hayate_front::config::Limits;
use hayate_front::{self as frontend, Accepted, Handler, Peer, Serving, Stop};
use hayate_io::conn::READ_BUF;

use crate::fanout::{self, FanoutClient};
use crate::shm::ShmOffer;

/// Shared memory as a native connection sees it.
#[derive(Debug, Default)]
pub struct Shm {
    /// What this server offers a client on this host that asks (`None` on a connection
    /// that is shared memory already).
    pub offer: Option<Arc<ShmOffer>>,
    /// A shared-memory connection's share of its user's fan-out arena.
    pub fanout: Option<crate::shm::FanoutGrant>,
}

/// Encodes deliveries as native MSG / MSG_BATCH frames.
#[derive(Debug, Default)]
pub struct NativeEncoder {
    /// This client's share of its user's fan-out arena (a shared-memory client that took it):
    /// messages and publishers' batches of at least [`fanout::MIN_PAYLOAD`] bytes go there
    /// once for all such clients, and this one gets a MSG_REF.
    fanout: Option<Arc<FanoutClient>>,
    /// The frame head (MSG or MSG_BATCH, sid 0) of what is placed in the arena.
    scratch: BytesMut,
    /// The largest payload sent in a MSG: the broker's `max_payload` (in WELCOME), by which
    /// clients size the frames they accept. A larger message (published over MQTT, STOMP or
    /// AMQP, which have limits of their own) is not sent, as a frame the client would refuse
    /// would end its connection and all its subscriptions: it is reported as LOST for the
    /// subscription instead, and counted as skipped.
    max_payload: usize,
    skipped: (u64, u64),
}

impl NativeEncoder {
    pub fn new(max_payload: u64) -> NativeEncoder {
        NativeEncoder {
            max_payload: usize::try_from(max_payload).unwrap_or(usize::MAX),
            ..NativeEncoder::default()
        }
    }

    /// Delivers through the fan-out arena (see [`crate::fanout`]).
    pub fn with_fanout(mut self, fanout: Option<Arc<FanoutClient>>) -> NativeEncoder {
        self.fanout = fanout;
        self
    }

    /// A MSG_BATCH of `payloads` (none: nothing). Native publishers' batches, whose items
    /// are within `max_payload` already (checked all the same).
    fn encode_batch(&mut self, sid: u32, key: &Key, payloads: &[Bytes], out: &mut OutBuf) {
        let mut items = 0;
        for p in payloads {
            if !self.refuse(sid, p, out) {
                items += 4 + p.len();
            }
        }
        if items == 0 {
            return;
        }
        encode_msg_batch_head(sid, key, items, out.tail());
        for p in payloads.iter().filter(|p| p.len() <= self.max_payload) {
            out.tail().put_u32(p.len() as u32);
            out.put_payload(p);
        }
    }

    /// Sends `m` to `sid` as a MSG_REF to the fan-out arena, if it goes there.
    fn by_reference(&mut self, sid: u32, m: &Message, out: &mut OutBuf) -> bool {
        if self.fanout.is_none() || m.payload.len() < fanout::MIN_PAYLOAD || is_inbox(&m.key) {
            return false;
        }
        self.scratch.clear();
        encode_msg_head(0, m, &mut self.scratch);
        let body = fanout::Body::new(std::slice::from_ref(&m.payload), false);
        self.place(sid, body, out)
    }

    /// Sends a publisher's batch to `sid` as one MSG_REF to a MSG_BATCH in the fan-out
    /// arena, if it goes there (every item within `max_payload`: the others are refused
    /// one by one by [`NativeEncoder::encode_batch`]).
    fn batch_by_reference(
        &mut self,
        sid: u32,
        key: &Key,
        payloads: &[Bytes],
        out: &mut OutBuf,
    ) -> bool {
        if self.fanout.is_none() {
            return false;
        }
        let body = fanout::Body::new(payloads, true);
        if body.bytes() < fanout::MIN_PAYLOAD
            || is_inbox(key)
            || payloads.iter().any(|p| p.len() > self.max_payload)
        {
            return false;
        }
        self.scratch.clear();
        encode_msg_batch_head(0, key, body.bytes(), &mut self.scratch);
        self.place(sid, body, out)
    }

    fn place(&mut self, sid: u32, body: fanout::Body<'_>, out: &mut OutBuf) -> bool {
        let Some(f) = &self.fanout else { return false };
        match f.place(&self.scratch, &body) {
            Some((at, len, tag)) => {
                encode_msg_ref(sid, at, len, tag, out.tail());
                true
            }
            None => false,
        }
    }

    /// Whether `payload` is too large to send; if so, it is counted and reported as LOST.
    fn refuse(&mut self, sid: u32, payload: &[u8], out: &mut OutBuf) -> bool {
        if payload.len() <= self.max_payload {
            return false;
        }
        self.skipped.0 += 1;
        self.skipped.1 += payload.len() as u64;
        encode(&Frame::Lost { sid, count: 1 }, out.tail());
        true
    }
}

impl Encoder for NativeEncoder {
    fn encode(&mut self, sid: u32, batch: Batch<'_>, _origin: u64, out: &mut OutBuf) {
        match batch {
            Batch::One(m) => {
                if self.refuse(sid, &m.payload, out) || self.by_reference(sid, m, out) {
                    return;
                }
                encode_msg_head(sid, m, out.tail());
                out.put_payload(&m.payload);
            }
            Batch::Plain { key, payloads } => {
                if !self.batch_by_reference(sid, key, payloads, out) {
                    self.encode_batch(sid, key, payloads, out);
                }
            }
        }
    }

    fn encode_lost(&mut self, sid: u32, count: u64, out: &mut OutBuf) {
        encode(&Frame::Lost { sid, count }, out.tail());
    }

    fn take_skipped(&mut self) -> (u64, u64) {
        std::mem::take(&mut self.skipped)
    }

    fn encode_acked(&mut self, sid: u32, delivery: u64, msg: &Message, out: &mut OutBuf) {
        encode_msg_acked_head(sid, delivery, msg, out.tail());
        out.put_payload(&msg.payload);
    }
}

/// Whether `key` is under a session's reply inbox: replies have one reader, whom other
/// clients of the same arena must not be able to read, so they never go to the arena.
fn is_inbox(key: &Key) -> bool {
    hayate_core::is_inbox_key(key.as_str())
}

/// The server side of the native protocol's keepalive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Keepalive {
    /// Silence after which the server sends a PING; `None`: never.
    pub interval: Option<Duration>,
    /// PINGs with no input at all in between before the connection is closed (ERR 9).
    pub max_pings_out: u32,
}

/// PUB_CONFIRMs of one connection waiting for their streams' fsync; at this many, the
/// connection's input is held until some are answered (bounds what a publisher that never
/// reads its CONFIRMs can pile up).
pub const MAX_PENDING_CONFIRMS: usize = 4096;

type PendingConfirm = BoxFuture<'static, (u64, ConfirmOutcome)>;

fn outcome(r: Result<Option<(String, u64)>, String>) -> ConfirmOutcome {
    match r {
        Ok(Some((stream, offset))) => ConfirmOutcome::Stored { stream, offset },
        Ok(None) => ConfirmOutcome::NotCaptured,
        Err(why) => ConfirmOutcome::Failed(why),
    }
}

/// Answers a PUB_CONFIRM now when its streams already count it as durable (fsync `interval`
/// and `never`, or no stream), or queues the wait (`always`: the next group commit).
fn confirm(
    id: u64,
    stored: Stored,
    session: &mut Session,
    pending: &mut FuturesUnordered<PendingConfirm>,
) {
    match stored.ready() {
        Some(r) => {
            let c = Frame::Confirm {
                id,
                outcome: outcome(r),
            };
            session.outbox().push_control_unbudgeted(|b| encode(&c, b));
            session.mark_own_output();
        }
        None => pending.push(Box::pin(
            async move { (id, outcome(stored.confirmed().await)) },
        )),
    }
}

/// Why a connection ended.
#[derive(Debug)]
enum End {
    /// The peer closed (EOF or CLOSE) or the server shut down.
    Graceful,
    /// A protocol error, reported to the peer.
    Error(ErrorCode, String),
    /// An I/O error, or the writer ended.
    Io,
}

/// The native protocol as the connection driver sees it.
struct Native {
    session: Session,
    welcomed: bool,
    limits: Arc<Limits>,
    server_name: Arc<str>,
    max_frame: usize,
    planner: ReadPlanner,
    /// Until WELCOME: the handshake deadline; then the next keepalive check.
    deadline: Option<Instant>,
    keepalive: Keepalive,
    /// Reads are counted (no clock on the read path); a check that saw none sends a PING.
    reads: u64,
    reads_at_check: u64,
    pings_out: u32,
    /// PUB_CONFIRMs waiting for an fsync.
    confirms: FuturesUnordered<PendingConfirm>,
    /// Stream consumers this connection is a member of, by subscription id.
    consumers: frontend::Memberships,
    auth: Arc<dyn Authenticator>,
    /// Who the client is (anonymous until HELLO's credentials are checked).
    identity: Identity,
    /// The client's address (also for a shared-memory ticket), its verified certificate's
    /// user and the connection's entry among the server's live connections.
    peer: Peer,
    /// Shared memory this server offers (not on a connection that is shared memory already).
    shm: Option<Arc<ShmOffer>>,
    /// WELCOME's `shm` field, once HELLO asked for it.
    shm_answer: Option<String>,
    /// The fan-out arena this shared-memory connection took: revoked unless HELLO logs in
    /// as the arena's user.
    fanout: Option<crate::shm::FanoutGrant>,
}

impl Native {
    async fn handle_other(&mut self, frame: Frame) -> Result<(), End> {
        let was_welcomed = self.welcomed;
        if let (false, Frame::Hello(h)) = (self.welcomed, &frame) {
            self.login(h).await?;
            // A HELLO of another version is refused next (ERR 7): no ticket for it.
            if h.flags & HELLO_SHM != 0 && h.version == PROTOCOL_VERSION {
                self.shm_answer = Some(
                    self.shm
                        .as_ref()
                        .map(|o| {
                            let user = self.identity.user.clone();
                            o.issue(self.peer.addr, self.peer.verified_name.clone(), user)
                        })
                        .unwrap_or_default(),
                );
            }
        }
        if let Frame::PubConfirm { id, msg } = frame {
            if !self.welcomed {
                return Err(End::Error(
                    ErrorCode::Protocol,
                    "the first frame must be HELLO".into(),
                ));
            }
            check_payload(msg.payload.len(), &self.limits).map_err(|(c, m)| End::Error(c, m))?;
            frontend::check_publish(&self.identity, &msg.key, msg.reply_to.is_some())
                .map_err(|d| End::Error(ErrorCode::NotAuthorized, d.to_string()))?;
            let (_, stored) = self.session.publish_stored(Batch::One(&msg)).await;
            confirm(id, stored, &mut self.session, &mut self.confirms);
            return Ok(());
        }
        match handle(
            frame,
            &mut self.session,
            &mut self.welcomed,
            &self.limits,
            &self.server_name,
            &self.identity,
            self.shm_answer.take(),
        )
        .await
        {
            Ok(true) => {}
            Ok(false) => return Err(End::Graceful),
            Err((code, msg)) => return Err(End::Error(code, msg)),
        }
        if self.welcomed && !was_welcomed {
            self.deadline = self.keepalive.interval.map(|i| Instant::now() + i);
        }
        Ok(())
    }

    /// Checks HELLO's credentials; on success the connection's identity is the user's.
    async fn login(&mut self, h: &hayate_native::Hello) -> Result<(), End> {
        let refused = |m: String| End::Error(ErrorCode::NotAuthorized, m);
        let Some(form) = HelloAuth::decode(&h.auth) else {
            return Err(refused(
                "HELLO's auth field is none of its forms (empty, 0x01 user/password, 0x02 token)"
                    .into(),
            ));
        };
        let creds = match &form {
            HelloAuth::Anonymous => Credentials::default(),
            HelloAuth::Password { user, password } => Credentials {
                user: Some(user),
                password: Some(password),
                ..Credentials::default()
            },
            HelloAuth::Token(t) => Credentials {
                token: Some(t),
                ..Credentials::default()
            },
        };
        self.identity = self
            .peer
            .login(&*self.auth, "native", creds)
            .await
            .map_err(|e| refused(e.to_string()))?;
        // The arena is readable by every client that took it: only its user's connections
        // may have their deliveries placed there.
        if self
            .fanout
            .as_ref()
            .is_some_and(|g| g.user != self.identity.user)
            && let Some(g) = self.fanout.take()
        {
            g.client.revoke();
        }
        self.peer
            .set_client_id(Some(&h.name).filter(|n| !n.is_empty()).map(|n| n.as_str()));
        Ok(())
    }

    /// May the connection join one more consumer or queue as `sid`?
    fn may_join(&self, sid: u32) -> Result<(), End> {
        let bad = |m: String| End::Error(ErrorCode::BadConsumer, m);
        if self.consumers.contains(sid) || self.session.has_subscription(sid) {
            return Err(bad(format!("subscription id {sid} is already in use")));
        }
        if self.consumers.len() >= frontend::MAX_MEMBERSHIPS {
            return Err(bad(format!(
                "at most {} CONSUMEs per connection",
                frontend::MAX_MEMBERSHIPS
            )));
        }
        Ok(())
    }

    /// Consumes queue `name` (of the default namespace: AMQP vhost `/`'s, STOMP's
    /// `/queue/<name>`; made implicitly if there is none) as subscription `sid`, with at
    /// most `prefetch` unacknowledged (0: `limits.max_unacked`, and never more).
    fn consume_queue(&mut self, sid: u32, name: &str, prefetch: u32) -> Result<(), End> {
        let bad = |m: String| End::Error(ErrorCode::BadConsumer, m);
        self.may_join(sid)?;
        let key = Key::new(name).map_err(|e| bad(format!("no queue {name:?}: {e}")))?;
        if hayate_core::is_inbox_key(name) {
            return Err(bad(format!("no queue {name:?}: a reply inbox")));
        }
        // A queue's consumer serves all of its key (as a STOMP or AMQP consumer).
        let expr = KeyExpr::new(name).map_err(|e| bad(format!("no queue {name:?}: {e}")))?;
        if !self.identity.access.may_read_all(&expr, true) {
            return Err(End::Error(
                ErrorCode::NotAuthorized,
                format!("not authorized: serve {name}"),
            ));
        }
        let (queue, _) = self
            .session
            .broker()
            .queue_implicit(&key)
            .map_err(|e| bad(format!("queue {name}: {e}")))?;
        let most = self.session.broker().config().max_unacked.max(1);
        let prefetch = match prefetch as usize {
            0 => most,
            n => n.min(most),
        };
        if !self
            .consumers
            .join_queue(&self.session, sid, queue, false, prefetch)
        {
            return Err(bad(format!(
                "queue {name}: deleted, or it has an exclusive consumer"
            )));
        }
        self.session.mark_own_output();
        Ok(())
    }

    /// Joins consumer `name` of `stream` as subscription `sid`.
    fn consume(&mut self, sid: u32, stream: &str, name: &str) -> Result<(), End> {
        let bad = |m: String| End::Error(ErrorCode::BadConsumer, m);
        self.may_join(sid)?;
        let s = self
            .session
            .broker()
            .stream(stream)
            .ok_or_else(|| bad(format!("no stream {stream}")))?;
        let consumer = s
            .consumer(name)
            .ok_or_else(|| bad(format!("no consumer {stream}/{name}")))?;
        frontend::check_consume(&self.identity, &s, &consumer)
            .map_err(|d| End::Error(ErrorCode::NotAuthorized, d.to_string()))?;
        self.consumers.join(&self.session, sid, consumer, false);
        Ok(())
    }
}

impl Handler for Native {
    type Frame = Frame;
    type End = End;

    fn decode(&mut self, buf: &mut BytesMut) -> Result<Option<Frame>, End> {
        // Before WELCOME a frame may be at most `max_preauth_bytes` (an anonymous client
        // cannot make the broker buffer a 64 MiB HELLO).
        let max = if self.welcomed {
            self.max_frame
        } else {
            self.max_frame.min(self.limits.max_preauth_bytes as usize)
        };
        self.planner
            .decode(buf, max)
            .map_err(|e| End::Error(e.code(), e.to_string()))
    }

    async fn handle(&mut self, frame: Frame) -> Result<(), End> {
        if self.welcomed {
            match frame {
                Frame::Consume {
                    sid,
                    stream,
                    consumer,
                    prefetch,
                } if stream.is_empty() => return self.consume_queue(sid, &consumer, prefetch),
                Frame::Consume {
                    sid,
                    stream,
                    consumer,
                    ..
                } => return self.consume(sid, &stream, &consumer),
                Frame::Unsub { sid } if self.consumers.contains(sid) => {
                    self.consumers.leave(&self.session, sid).await;
                    return Ok(());
                }
                Frame::Ack {
                    delivery,
                    cumulative,
                } if !self.consumers.is_empty() => {
                    let how = if cumulative {
                        Settle::Through
                    } else {
                        Settle::One
                    };
                    let settled = self.session.outbox().settle(delivery, how);
                    let _ = self.consumers.settle(settled, None);
                    self.session.mark_own_output();
                    return Ok(());
                }
                Frame::Nack { delivery, delay_ms } if !self.consumers.is_empty() => {
                    let taken: Vec<Delivery> =
                        self.session.outbox().nack(delivery).into_iter().collect();
                    let delay = Duration::from_millis(u64::from(delay_ms));
                    for d in self.consumers.settle(taken, Some(delay)) {
                        self.session.give_back(d, true).await;
                    }
                    self.session.mark_own_output();
                    return Ok(());
                }
                Frame::Sub(s) if self.consumers.contains(s.sid) => {
                    return Err(End::Error(
                        ErrorCode::BadSubscription,
                        format!("subscription id {} is in use (CONSUME)", s.sid),
                    ));
                }
                other => return self.handle_other(other).await,
            }
        }
        self.handle_other(frame).await
    }

    fn flush(&mut self) {
        self.session.flush();
    }

    fn read_limit(&mut self, buf: &mut BytesMut) -> Option<usize> {
        if self.confirms.len() >= MAX_PENDING_CONFIRMS {
            return Some(0);
        }
        self.planner.plan(buf, READ_BUF)
    }

    async fn event(&mut self) -> Result<(), End> {
        let next = if self.confirms.is_empty() {
            std::future::pending().await
        } else {
            self.confirms.next().await
        };
        if let Some(first) = next {
            // One group commit answers many at once: send every CONFIRM that is ready now,
            // not one per turn of the connection's loop.
            let mut ready = vec![first];
            while let Some(Some(more)) = self.confirms.next().now_or_never() {
                ready.push(more);
            }
            self.session.outbox().push_control_unbudgeted(|b| {
                for (id, outcome) in ready {
                    encode(&Frame::Confirm { id, outcome }, b);
                }
            });
            self.session.mark_own_output();
        }
        Ok(())
    }

    fn on_read(&mut self) {
        self.reads += 1;
    }

    fn deadline(&self) -> Option<Instant> {
        self.deadline
    }

    async fn on_timer(&mut self) -> Result<(), End> {
        if !self.welcomed {
            return Err(End::Error(
                ErrorCode::Protocol,
                "no HELLO within the handshake timeout".into(),
            ));
        }
        let Some(every) = self.keepalive.interval else {
            self.deadline = None;
            return Ok(());
        };
        self.deadline = Some(Instant::now() + every);
        if self.reads != self.reads_at_check {
            self.reads_at_check = self.reads;
            self.pings_out = 0;
        } else if self.pings_out >= self.keepalive.max_pings_out {
            return Err(End::Error(
                ErrorCode::Stale,
                "no input through the keepalive PINGs".into(),
            ));
        } else {
            self.pings_out += 1;
            let ping = Frame::Ping(u64::from(self.pings_out));
            self.session
                .outbox()
                .push_control_unbudgeted(|b| encode(&ping, b));
            self.session.mark_own_output();
        }
        Ok(())
    }

    fn stopped(&mut self, why: Stop) -> End {
        match why {
            Stop::Eof | Stop::Shutdown => End::Graceful,
            Stop::Io | Stop::WriterGone => End::Io,
            Stop::Memory => End::Error(
                ErrorCode::ServerBusy,
                "memory budget spent: frame not read within limits.max_block_ms".into(),
            ),
        }
    }
}

/// Serves one native-protocol connection until it closes.
///
/// The reader runs in the calling task; a writer task drains the session's outbox.
pub async fn serve(
    io: Accepted,
    broker: Broker,
    limits: Arc<Limits>,
    server_name: Arc<str>,
    keepalive: Keepalive,
    auth: Arc<dyn Authenticator>,
    shm: Shm,
) {
    let encoder = NativeEncoder::new(limits.max_payload)
        .with_fanout(shm.fanout.as_ref().map(|g| g.client.clone()));
    let (peer, session, mut serving) = Serving::open(io, &broker, Box::new(encoder));
    let mut h = Native {
        session,
        welcomed: false,
        max_frame: limits.max_frame(),
        deadline: Some(Instant::now() + Duration::from_millis(limits.handshake_timeout_ms)),
        limits,
        server_name,
        planner: ReadPlanner::new(),
        keepalive,
        reads: 0,
        reads_at_check: 0,
        pings_out: 0,
        confirms: FuturesUnordered::new(),
        consumers: frontend::Memberships::default(),
        auth,
        identity: Identity::anonymous(),
        peer,
        shm: shm.offer,
        shm_answer: None,
        fanout: shm.fanout,
    };
    let end = serving.conn.drive(&mut h).await;
    // What this connection's consumer memberships had in flight goes back to the consumers.
    h.consumers.leave_all(&h.session).await;
    tracing::debug!(session = h.session.id(), ?end, "connection ends");
    if let End::Error(code, msg) = &end {
        send_err(&serving.outbox, *code, msg);
    }
    // The writer flushes what is queued (an ERR included) and shuts the socket down.
    serving.close(h.session).await;
    // Its share of the fan-out arena ends with the connection, not with the encoder (which
    // a publisher's route cache may keep a while): what it holds is then freed by its
    // rules (released, the grace, or its process's exit).
    if let Some(g) = &h.fanout {
        g.client.revoke();
    }
}

fn send_err(outbox: &Outbox, code: ErrorCode, message: &str) {
    tracing::debug!(code = code.code(), message, "protocol error");
    outbox.push_control_unbudgeted(|b| {
        encode(
            &Frame::Err {
                code,
                message: message.to_string(),
            },
            b,
        )
    });
}

type Refusal = (ErrorCode, String);

/// Handles one frame; `Ok(false)` ends the connection gracefully.
async fn handle(
    frame: Frame,
    session: &mut Session,
    welcomed: &mut bool,
    limits: &Limits,
    server_name: &str,
    who: &Identity,
    shm: Option<String>,
) -> Result<bool, Refusal> {
    if !*welcomed {
        hayate_native::check_hello(frame, "server")?;
        *welcomed = true;
        let w = Frame::Welcome(Welcome {
            version: PROTOCOL_VERSION,
            session: session.id(),
            max_payload: limits.max_payload,
            server: server_name.to_string(),
            inbox: session.inbox().to_owned(),
            shm,
        });
        session.outbox().push_control_unbudgeted(|b| encode(&w, b));
        session.mark_own_output();
        return Ok(true);
    }
    match frame {
        Frame::Pub(m) => {
            check_payload(m.payload.len(), limits)?;
            frontend::check_publish(who, &m.key, m.reply_to.is_some())
                .map_err(|d| (ErrorCode::NotAuthorized, d.to_string()))?;
            if m.key.as_bytes().starts_with(API_PREFIX.as_bytes()) {
                api_request(session, &m, who).await;
            } else {
                session.publish(Batch::One(&m)).await;
            }
        }
        Frame::PubBatch { key, payloads } => {
            for p in &payloads {
                check_payload(p.len(), limits)?;
            }
            frontend::check_publish(who, &key, false)
                .map_err(|d| (ErrorCode::NotAuthorized, d.to_string()))?;
            session
                .publish(Batch::Plain {
                    key: &key,
                    payloads: &payloads,
                })
                .await;
        }
        Frame::Sub(s) => {
            frontend::subscribe_checked(session, who, s.sid, s.expr, s.group.as_deref(), s.qos)
                .map_err(|e| match e {
                    frontend::SubFail::Denied(d) => (ErrorCode::NotAuthorized, d.to_string()),
                    frontend::SubFail::Broker(e) => (ErrorCode::BadSubscription, e.to_string()),
                })?;
        }
        Frame::Unsub { sid } => {
            // Unacknowledged deliveries go to another member first (they need the
            // subscription's group).
            session.release_unacked(Some(sid)).await;
            session.unsubscribe(sid);
        }
        Frame::Ack {
            delivery,
            cumulative,
        } => {
            // An unknown or already acknowledged id is ignored (an ACK may cross a
            // redelivery after an UNSUB).
            session.outbox().ack(delivery, cumulative);
            session.mark_own_output();
        }
        Frame::Nack { delivery, .. } => {
            if let Some(d) = session.outbox().nack(delivery) {
                session.give_back(d, true).await;
            }
            session.mark_own_output();
        }
        Frame::Ping(t) => session
            .outbox()
            .push_control_unbudgeted(|b| encode(&Frame::Pong(t), b)),
        Frame::Pong(_) => {}
        // Handled by the caller (it keeps the pending confirms and the consumers).
        Frame::PubConfirm { .. } | Frame::Consume { .. } => {}
        Frame::Close => return Ok(false),
        Frame::Err { code, message } => {
            tracing::debug!(code = code.code(), message, "client reported an error");
            return Ok(false);
        }
        // A second HELLO, or a server's frame.
        other => {
            let (code, why) = hayate_native::refusal(&other);
            return Err((code, why.into()));
        }
    }
    Ok(true)
}

fn check_payload(len: usize, limits: &Limits) -> Result<(), Refusal> {
    if len as u64 > limits.max_payload {
        return Err((
            ErrorCode::FrameTooLarge,
            format!(
                "payload of {len} bytes exceeds max_payload {}",
                limits.max_payload
            ),
        ));
    }
    Ok(())
}

/// Answers a request to the broker's API (`$hayate/api/...`) on its reply-to key (nothing is
/// sent without one). The request is not delivered to subscribers.
async fn api_request(session: &mut Session, m: &Message, who: &Identity) {
    let broker = session.broker().clone();
    let (key, body) = (m.key.as_str().to_owned(), m.payload.clone());
    if let Err(d) = frontend::check_stream_api(who, &broker, &key, &body) {
        let reply = api::ApiReply {
            ok: false,
            error: Some(d.to_string()),
            ..Default::default()
        };
        if let Some(r) = m.reply(serde_json::to_vec(&reply).unwrap_or_default()) {
            session.publish(Batch::One(&r)).await;
        }
        return;
    }
    let caller = who.user.as_deref().map(str::to_owned);
    let api_key = key.clone();
    // Creating, deleting and purging streams touch files: off the I/O threads.
    let mut reply =
        tokio::task::spawn_blocking(move || api::handle(&broker, &key, &body, caller.as_deref()))
            .await
            .unwrap_or_else(|e| api::ApiReply {
                ok: false,
                error: Some(e.to_string()),
                ..Default::default()
            });
    frontend::filter_stream_api_reply(who, &api_key, &mut reply);
    let payload = serde_json::to_vec(&reply).unwrap_or_default();
    if let Some(r) = m.reply(payload) {
        session.publish(Batch::One(&r)).await;
    }
}
