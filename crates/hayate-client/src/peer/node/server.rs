//! A node's listener: the native protocol's server side for the links other nodes dial (and
//! for plain clients that only publish). Publications are handed to this node's local
//! subscriptions (never forwarded to other nodes: every node sends to every other itself);
//! interest announcements update what this node sends back on its own link to that node.
//!
//! Runs on hayate-io's connection driver, like [`PeerServer`](crate::peer::PeerServer)'s
//! connections. Deliveries decoded from one read are handed over per subscription, one
//! batch each, after the read (`Handler::flush`); a `block` subscription whose queue is full
//! holds the connection: no more input is decoded or read (TCP pushes back on the
//! publishing node) until it has room, or until `max_block` has passed and it is ended as a
//! slow consumer. A PING is answered only once everything before it is handed over.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use hayate_core::{Key, Message};
use hayate_io::conn::{Handler, InputBudget, Stop};
use hayate_native::{ErrorCode, Frame};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::time::Instant;

use super::interest::{INTEREST_KEY, Interest};
use super::{
    Inbound, LocalTarget, NodeInner, Route, Sink, TO_HEADER, lock, parse_hello_name,
    resolve_advertised,
};
use crate::peer::listen::{self, End, Names, Wire, close_and_linger, open};
use crate::sub::{Batch, TrySendError};

/// Output (WELCOME, PONG, ERR) queued at most.
const OUT_BUDGET: usize = 256 * 1024;

/// How long a closed connection reads and discards what the other side still sends.
const LINGER: Duration = Duration::from_millis(500);

pub(super) async fn accept_loop(
    listener: TcpListener,
    node: Arc<NodeInner>,
    stop: watch::Receiver<bool>,
) {
    let max = node.options.max_connections;
    let serve = |s, addr, stop| {
        let id = node.next_conn.fetch_add(1, Ordering::Relaxed);
        serve_conn(s, addr, id, node.clone(), stop)
    };
    listen::accept_loop(
        listener,
        stop,
        max,
        Duration::from_secs(2),
        "peer node",
        serve,
    )
    .await;
}

/// How a node's listener names itself.
static NAMES: Names = Names {
    hello: "node",
    log: "peer node",
    their_err: "error from the other side",
};

struct PeerConn {
    wire: Wire,
    node: Arc<NodeInner>,
    addr: SocketAddr,
    /// The node at the other end (`None`: a plain client).
    from: Option<u64>,
    /// A PING came from that node (see `Inbound::ready`).
    ready: bool,
    /// Deliveries decoded from this read, one batch per target.
    pending: Vec<(LocalTarget, Vec<Message>)>,
    /// Batches for `block` targets that had no room, oldest first.
    stuck: VecDeque<(LocalTarget, Batch)>,
    stuck_since: Option<Instant>,
    /// PINGs to answer once `stuck` is empty.
    pongs: Vec<u64>,
}

async fn serve_conn(
    stream: TcpStream,
    addr: SocketAddr,
    id: u64,
    node: Arc<NodeInner>,
    stop: watch::Receiver<bool>,
) {
    let budget = InputBudget {
        memory: node.memory.clone(),
        wait: Some(node.options.max_block),
    };
    let (mut conn, outbox) = open(stream, stop, OUT_BUDGET, Some(addr), budget);
    let mut p = PeerConn {
        wire: Wire::new(
            id,
            outbox.clone(),
            node.options.max_payload,
            node.options.handshake_timeout,
            &NAMES,
        ),
        node,
        addr,
        from: None,
        ready: false,
        pending: Vec::new(),
        stuck: VecDeque::new(),
        stuck_since: None,
        pongs: Vec::new(),
    };
    let end = conn.drive(&mut p).await;
    tracing::debug!(conn = id, ?end, "peer node: connection ends");
    if p.from.is_some() {
        lock(&p.node.state).inbound_gone(id);
    }
    if matches!(end, End::Refused) {
        p.wire.flush();
    }
    drop(p);
    close_and_linger(
        conn,
        &outbox,
        Instant::now() + Duration::from_secs(2),
        LINGER,
    )
    .await;
}

/// The queue-group members a node named in `m` (removed from its headers).
fn take_named(m: &mut Message) -> Vec<(u32, Bytes)> {
    take_named_by(m, TO_HEADER, |v| {
        (v.len() >= 4).then(|| (u32::from_be_bytes([v[0], v[1], v[2], v[3]]), v.slice(4..)))
    })
}

/// `msg` with one `header` header per queue-group member named (what [`take_named_by`]
/// takes): each value is the member's node id if given (u64), its subscription id (u32),
/// both big-endian, then the group's name.
pub(super) fn with_named<'a>(
    msg: &Message,
    header: &str,
    members: impl IntoIterator<Item = (Option<u64>, u32, &'a str)>,
) -> Message {
    let mut m = msg.clone();
    let h = m.headers.get_or_insert_with(Vec::new);
    for (node, sid, group) in members {
        let mut v = Vec::with_capacity(12 + group.len());
        if let Some(node) = node {
            v.extend_from_slice(&node.to_be_bytes());
        }
        v.extend_from_slice(&sid.to_be_bytes());
        v.extend_from_slice(group.as_bytes());
        h.push((header.to_string(), Bytes::from(v)));
    }
    m
}

/// The queue-group members named in `m`'s `header` headers, every one of which is removed:
/// `parse` gives the subscription id and group of a value meant for this node, `None` for
/// one that is not (or is malformed).
pub(super) fn take_named_by(
    m: &mut Message,
    header: &str,
    parse: impl Fn(&Bytes) -> Option<(u32, Bytes)>,
) -> Vec<(u32, Bytes)> {
    let Some(h) = m.headers.as_mut() else {
        return Vec::new();
    };
    if !h.iter().any(|(n, _)| n == header) {
        return Vec::new();
    }
    let mut named = Vec::new();
    h.retain(|(n, v)| {
        if n != header {
            return true;
        }
        named.extend(parse(v));
        false
    });
    if h.is_empty() {
        m.headers = None;
    }
    named
}

/// Adds `m` to the batch for target `t`.
pub(super) fn push(pending: &mut Vec<(LocalTarget, Vec<Message>)>, t: &LocalTarget, m: Message) {
    match pending.iter_mut().find(|(p, _)| p.sid == t.sid) {
        Some((_, v)) => v.push(m),
        None => pending.push((t.clone(), vec![m])),
    }
}

/// Hands `m` to the local subscriptions of `route`: every plain one, and one member of
/// each queue group: the one the publishing node named (`named`: from a node), or for a
/// plain client's message (`None`) one of ours, round robin.
pub(super) fn dispatch(
    node: &NodeInner,
    route: &Route,
    m: Message,
    named: Option<Vec<(u32, Bytes)>>,
    push: &mut dyn FnMut(&LocalTarget, Message),
) {
    // Each target but the last gets a clone; the last gets `m` itself.
    let mut last: Option<&LocalTarget> = None;
    for g in &route.groups {
        let locals = &g.locals;
        let chosen = if let Some(named) = &named {
            let Some((sid, _)) = named.iter().find(|(_, n)| n[..] == *g.name.as_bytes()) else {
                continue; // the publisher chose a member elsewhere
            };
            // The named member, or if it has gone meanwhile another of ours, if any.
            let t = locals.iter().find(|t| t.sid == *sid);
            let t = t.or_else(|| g.rr.pick(locals));
            if t.is_none() {
                node.stats.unroutable.fetch_add(1, Ordering::Relaxed);
            }
            t
        } else {
            g.rr.pick(locals)
        };
        if let Some(t) = chosen
            && let Some(p) = last.replace(t)
        {
            push(p, m.clone());
        }
    }
    for t in &route.locals {
        if let Some(p) = last.replace(t) {
            push(p, m.clone());
        }
    }
    if let Some(t) = last {
        push(t, m);
    }
}

impl PeerConn {
    /// Hands `m` to the local subscriptions of `route` (see [`dispatch`]).
    fn dispatch(&mut self, route: &Route, mut m: Message) {
        let named = self.from.is_some().then(|| take_named(&mut m));
        let mut pending = std::mem::take(&mut self.pending);
        dispatch(&self.node, route, m, named, &mut |t, m| {
            push(&mut pending, t, m)
        });
        self.pending = pending;
    }

    fn on_publish(&mut self, m: Message) -> Result<(), End> {
        if let Some(end) = self.wire.too_large(m.payload.len()) {
            return Err(end);
        }
        if self.from.is_some() && m.key.as_bytes() == INTEREST_KEY.as_bytes() {
            return self.on_interest(&m.payload);
        }
        let route = self.node.route(&m.key);
        self.dispatch(&route, m);
        Ok(())
    }

    fn on_interest(&mut self, payload: &[u8]) -> Result<(), End> {
        let i = Interest::decode(payload).map_err(|e| self.wire.refuse(ErrorCode::Protocol, &e))?;
        lock(&self.node.state).interest(self.wire.id, i);
        Ok(())
    }

    fn hello(&mut self, frame: Frame) -> Result<(), End> {
        let h = self.wire.hello(frame)?;
        if let Some((peer, advertised)) = parse_hello_name(&h.name) {
            self.from = Some(peer);
            {
                let mut st = lock(&self.node.state);
                if st.stopped {
                    return Err(End::Closed);
                }
                st.inbound
                    .insert(self.wire.id, Inbound { peer, ready: false });
            }
            // Dial back: this node's publications travel on its own link to that node.
            match resolve_advertised(&advertised, self.addr.ip()) {
                Some(a) => self.node.discovered(peer, a),
                None => {
                    return Err(self.wire.refuse(
                        ErrorCode::Protocol,
                        &format!("node HELLO with a bad address {advertised:?}"),
                    ));
                }
            }
        }
        self.wire.welcome(
            self.node.welcome_name(),
            format!("{}/peer-conn-{}", hayate_core::INBOX_PREFIX, self.wire.id),
        );
        Ok(())
    }

    fn on_frame(&mut self, frame: Frame) -> Result<(), End> {
        if !self.wire.welcomed() {
            return self.hello(frame);
        }
        match frame {
            Frame::Pub(m) => self.on_publish(m)?,
            Frame::PubBatch { key, payloads } => {
                if let Some(end) = payloads.iter().find_map(|p| self.wire.too_large(p.len())) {
                    return Err(end);
                }
                if self.from.is_some() && key.as_bytes() == INTEREST_KEY.as_bytes() {
                    for p in &payloads {
                        self.on_interest(p)?;
                    }
                } else {
                    let route = self.node.route(&key);
                    for p in payloads {
                        self.dispatch(&route, Message::new(Key::clone(&key), p));
                    }
                }
            }
            Frame::PubConfirm { id, msg } => {
                self.on_publish(msg)?;
                self.wire.not_captured(id);
            }
            // Every client subscribes its reply inbox first (sid u32::MAX): accepted, and
            // nothing is ever sent to it.
            Frame::Sub(s) if s.sid == u32::MAX => {}
            Frame::Sub(_) => {
                return Err(self.wire.refuse(
                    ErrorCode::BadSubscription,
                    "a peer node takes no subscriptions over the wire: subscribe through a \
                     Node of your own",
                ));
            }
            Frame::Unsub { .. } => {}
            Frame::Ping(t) => {
                if self.from.is_some() && !self.ready {
                    self.ready = true;
                    if let Some(i) = lock(&self.node.state).inbound.get_mut(&self.wire.id) {
                        i.ready = true;
                    }
                }
                self.hand_over();
                if self.stuck.is_empty() {
                    self.wire.send(&Frame::Pong(t));
                } else {
                    self.pongs.push(t);
                }
            }
            // PONG, ACK, NACK, CLOSE, ERR, or one a client may not send.
            other => return self.wire.on_other(other),
        }
        Ok(())
    }

    /// Hands the batches decoded so far to their subscriptions without waiting; those a
    /// full `block` subscription cannot take wait in `stuck`.
    fn hand_over(&mut self) {
        // Drained, not taken: the list keeps its allocation for the next read.
        let mut pending = std::mem::take(&mut self.pending);
        for (t, batch) in pending.drain(..) {
            match &t.sink {
                Sink::Inbox => {
                    for m in batch {
                        self.node.complete_request(m);
                    }
                }
                Sink::Sub { tx, lost, drop } => {
                    let batch = Batch::Messages(batch);
                    if !*drop && self.stuck.iter().any(|(s, _)| s.sid == t.sid) {
                        self.stuck.push_back((t, batch)); // keeps its order
                        continue;
                    }
                    match tx.try_send(batch) {
                        Ok(()) | Err(TrySendError::Closed) => {}
                        Err(TrySendError::Full(b)) if *drop => {
                            lost.fetch_add(b.len() as u64, Ordering::Relaxed);
                        }
                        Err(TrySendError::Full(b)) => {
                            self.stuck_since.get_or_insert_with(Instant::now);
                            self.stuck.push_back((t, b));
                        }
                    }
                }
            }
        }
        self.pending = pending;
    }

    /// Waits for room for the oldest stuck batch (until `max_block` from when it got
    /// stuck), then hands over what fits.
    async fn unstick(&mut self) {
        let Some((t, b)) = self.stuck.front() else {
            return;
        };
        let Sink::Sub { tx, .. } = &t.sink else {
            return;
        };
        let (tx, sid, bytes) = (tx.clone(), t.sid, b.bytes());
        let since = *self.stuck_since.get_or_insert_with(Instant::now);
        match tokio::time::timeout_at(since + self.node.options.max_block, tx.reserve(bytes)).await
        {
            Ok(Ok(permit)) => {
                if let Some((_, b)) = self.stuck.pop_front() {
                    permit.send(b);
                }
            }
            Ok(Err(_)) => {
                self.stuck.pop_front();
            }
            Err(_) => {
                self.stuck.retain(|(s, _)| s.sid != sid);
                self.node.cut_slow(sid);
            }
        }
        // The rest, as far as it goes without waiting.
        while let Some((t, b)) = self.stuck.pop_front() {
            let Sink::Sub { tx, .. } = &t.sink else {
                continue;
            };
            match tx.try_send(b) {
                Ok(()) | Err(TrySendError::Closed) => {}
                Err(TrySendError::Full(b)) => {
                    self.stuck.push_front((t, b));
                    break;
                }
            }
        }
        if self.stuck.is_empty() {
            self.stuck_since = None;
            for t in std::mem::take(&mut self.pongs) {
                self.wire.send(&Frame::Pong(t));
            }
            self.wire.flush();
        } else {
            self.stuck_since = Some(Instant::now());
        }
    }
}

impl Handler for PeerConn {
    type Frame = Frame;
    type End = End;

    fn decode(&mut self, buf: &mut BytesMut) -> Result<Option<Frame>, End> {
        if !self.stuck.is_empty() {
            return Ok(None); // the rest waits, in order, until there is room
        }
        self.wire.decode(buf)
    }

    async fn handle(&mut self, frame: Frame) -> Result<(), End> {
        self.on_frame(frame)
    }

    /// Every frame: a peer connection's handling never waits (what does not fit waits in
    /// `stuck`, for `event`).
    fn handle_now(&mut self, frame: Frame) -> Result<Option<Frame>, End> {
        self.on_frame(frame).map(|()| None)
    }

    fn flush(&mut self) {
        self.hand_over();
        self.wire.flush();
    }

    fn read_limit(&mut self, buf: &mut BytesMut) -> Option<usize> {
        let held = !self.stuck.is_empty();
        self.wire.read_limit(buf, held)
    }

    fn deadline(&self) -> Option<Instant> {
        self.wire.deadline()
    }

    async fn on_timer(&mut self) -> Result<(), End> {
        self.wire.on_timer()
    }

    async fn event(&mut self) -> Result<(), End> {
        if self.stuck.is_empty() {
            return std::future::pending().await;
        }
        self.unstick().await;
        Ok(())
    }

    fn stopped(&mut self, why: Stop) -> End {
        match why {
            Stop::Eof | Stop::Shutdown => End::Closed,
            Stop::Io | Stop::WriterGone => End::Gone,
            Stop::Memory => self.wire.refuse(
                ErrorCode::ServerBusy,
                "memory budget spent: frame not read within max_block",
            ),
        }
    }
}
