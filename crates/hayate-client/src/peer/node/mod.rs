//! Peer mode for pub/sub: a [`Node`] publishes straight to the nodes whose subscriptions
//! match, with no broker (docs/peer.md; wire in docs/protocol.md, "Peer mode").
//!
//! # How it works
//! - Every node listens (native protocol, server side: [`server`]) and keeps one outgoing
//!   *link* to every node it knows: an ordinary [`Client`] connection to that node's
//!   listener. A link carries, one way, the dialling node's publications for the other node
//!   and its interest announcements ([`interest`]): so between two nodes there are two TCP
//!   connections, each written by one side. A node that is dialled by a node it has no link
//!   to dials back (the HELLO names the dialler's id and listening address).
//! - Each node keeps the interest every other node announced, with its own subscriptions,
//!   in one table; a publication is matched against it once per key (a route, cached until
//!   the table changes) and sent once to each node with a matching subscription (that node
//!   hands it to each of its matching subscriptions), and handed to local subscriptions
//!   directly.
//! - Queue groups span nodes: the publishing node picks one member among all nodes' members
//!   (round robin) and names it in the message ([`TO_HEADER`]); a node delivers a message to
//!   its queue-group members only when named (or, for a message from a plain client, to one
//!   of its own members, round robin).
//! - Request/reply: [`Node::request`] publishes with a reply-to key under the node's inbox
//!   (`_inbox/peer-<id>/<token>`), a subscription every node announces; [`Node::reply`]
//!   publishes the answer like any message.
//! - Reliability per subscription, as with a broker: `block` (the default) holds the
//!   publisher (locally: the publishing task waits for room in the subscription's queue;
//!   across nodes: the receiving node stops reading the link, TCP pushes back, the link's
//!   write buffer fills and the publisher waits) up to [`NodeOptions::max_block`], after
//!   which the subscription is ended as a slow consumer; `drop` loses what does not fit
//!   and counts it ([`Subscription::lost`]).
//! - Discovery ([`NodeOptions`]): a static list of addresses (redialled while
//!   unreachable), UDP multicast scouting ([`scout`]), and a broker used as a rendezvous,
//!   all at once; a scouting socket that cannot be opened is a warning.

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use hayate_core::qos::Congestion;
use hayate_core::route::{RouteCache, Table};
use hayate_core::sync::lock;
use hayate_core::{Key, KeyExpr, Message, Qos};
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::sub::{INBOX_SID, Subscription, Unsubscribe};
use crate::{Client, Error, Result, SubscribeOptions};

mod delivery;
mod inplace;
pub(crate) mod interest;
mod links;
mod options;
mod rendezvous;
mod routes;
pub mod scout;
mod server;
pub mod shm;

pub use interest::INTEREST_KEY;
use interest::Interest;
use links::{announce, parse_hello_name, resolve_advertised};
pub use options::{NodeOptions, NodeStats};
use routes::{LocalTarget, Route, Sink};
pub use scout::ScoutOptions;
pub use shm::{ShmMode, ShmOptions};

/// The header a publishing node adds to name the queue-group members (on the receiving
/// node) a message is for: one header per member, its value the member's subscription id
/// (u32, big-endian) followed by the group's name. Removed before delivery.
pub const TO_HEADER: &str = "hayate-peer-to";

/// HELLO names and WELCOME server names of nodes start with this.
const NODE_PREFIX: &str = "hayate-peer/1 ";

/// Routes cached per node, at most (the cache is cleared past it).
const ROUTE_CACHE: usize = 4096;

/// One incoming connection from another node: who (what it announced is in the node's
/// route table, under this connection's number).
#[derive(Debug)]
struct Inbound {
    peer: u64,
    /// The first PING has come: the interest the node announced when it linked (which it
    /// follows with a PING) is all here.
    ready: bool,
}

#[derive(Debug, Clone)]
struct Link {
    client: Client,
    addr: String,
    /// The node reads this node's ring (with this cursor entry): publications for it go
    /// there.
    shm: Option<usize>,
}

#[derive(Debug)]
struct State {
    /// This node's subscriptions (under connection [`routes::LOCAL`]) and those other
    /// nodes announced (under the incoming connection that carried them).
    subs: Table<routes::Target>,
    inbound: HashMap<u64, Inbound>,
    links: HashMap<u64, Link>,
    /// Addresses being dialled.
    dialing: HashSet<String>,
    cache: RouteCache<Route>,
    stopped: bool,
    /// Bumped by every change of routes (read without the lock by route caches outside
    /// it: a ring reader's).
    generation: Arc<AtomicU64>,
}

impl State {
    fn new(generation: Arc<AtomicU64>) -> State {
        State {
            subs: Table::new(),
            inbound: HashMap::new(),
            links: HashMap::new(),
            dialing: HashSet::new(),
            cache: RouteCache::new(ROUTE_CACHE),
            stopped: false,
            generation,
        }
    }
}

/// Shared state of a node.
#[derive(Debug)]
pub(crate) struct NodeInner {
    id: u64,
    /// `HOST:PORT` other nodes dial.
    advertise: String,
    local_addr: SocketAddr,
    options: NodeOptions,
    state: Mutex<State>,
    next_sid: AtomicU32,
    next_token: AtomicU64,
    next_conn: AtomicU64,
    requests: crate::sub::Requests,
    inbox: String,
    stop: watch::Sender<bool>,
    stopping: AtomicBool,
    stats: NodeStats,
    /// What the listener's connections' input draws on.
    memory: Arc<hayate_io::memory::Memory>,
    /// This node's shared-memory ring (`None`: shared memory off, or unavailable).
    outgoing: Option<Arc<shm::Outgoing>>,
    /// `State::generation`, readable without the lock.
    generation: Arc<AtomicU64>,
}

/// Stops the node when the last [`Node`] handle goes.
#[derive(Debug)]
struct StopGuard(Arc<NodeInner>);

impl Drop for StopGuard {
    fn drop(&mut self) {
        self.0.shutdown();
    }
}

/// A peer-to-peer pub/sub node (see the [module](self) documentation). Cloning gives another
/// handle; the node stops when the last handle is dropped or [`Node::close`] is called.
#[derive(Debug, Clone)]
pub struct Node {
    inner: Arc<NodeInner>,
    _guard: Arc<StopGuard>,
}

fn random_id() -> u64 {
    let mut b = [0u8; 8];
    if getrandom::fill(&mut b).is_err() {
        // No entropy source: time and pid still tell nodes of one run apart.
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        b = (t ^ (u64::from(std::process::id()) << 32)).to_be_bytes();
    }
    u64::from_be_bytes(b).max(1)
}

impl Node {
    /// Starts a node with `options`: binds the listener, then dials the static peers and
    /// starts scouting and the rendezvous in the background.
    pub async fn start(options: NodeOptions) -> Result<Node> {
        if options.max_payload == 0 || options.max_payload > u64::from(u32::MAX) {
            return Err(Error::Protocol(
                "max_payload must be between 1 and 4 GiB".into(),
            ));
        }
        if options.shm.mode != ShmMode::Off
            && (!(2..=1 << 20).contains(&options.shm.slots)
                || !(64..=64 << 20).contains(&options.shm.slot_bytes)
                || options.shm.slots.saturating_mul(options.shm.slot_bytes) > 1 << 34
                || options.shm.arena_bytes > 1 << 34)
        {
            return Err(Error::Protocol(
                "shm: slots must be 2 to 2^20, slot_bytes 64 B to 64 MiB, the ring at most \
                 16 GiB, arena_bytes at most 16 GiB"
                    .into(),
            ));
        }
        let listener = TcpListener::bind(&options.listen).await?;
        let local_addr = listener.local_addr()?;
        let advertise = match &options.advertise {
            Some(a) => a
                .parse::<SocketAddr>()
                .map_err(|e| Error::Protocol(format!("advertise {a:?}: {e}")))?
                .to_string(),
            None => local_addr.to_string(),
        };
        let id = random_id();
        let outgoing = match options.shm.mode {
            ShmMode::Off => None,
            _ => match shm::Outgoing::new(&options.shm, id) {
                Ok(o) => Some(Arc::new(o)),
                Err(e) if options.shm.mode == ShmMode::Require => return Err(e),
                Err(e) => {
                    tracing::warn!("peer: no shared memory: {e}");
                    None
                }
            },
        };
        let (stop, stop_rx) = watch::channel(false);
        let generation = Arc::new(AtomicU64::new(0));
        let inbox = format!("{}/peer-{id:016x}", hayate_core::INBOX_PREFIX);
        let mut state = State::new(generation.clone());
        let target = LocalTarget {
            sid: INBOX_SID,
            sink: Sink::Inbox,
        };
        let inbox_expr = KeyExpr::new(&format!("{inbox}/*"))?;
        let target = routes::Target::Local {
            target,
            qos: Qos::RELIABLE,
        };
        state
            .subs
            .insert((routes::LOCAL, INBOX_SID), inbox_expr, None, target);
        let inner = Arc::new(NodeInner {
            id,
            advertise,
            local_addr,
            state: Mutex::new(state),
            generation,
            next_sid: AtomicU32::new(1),
            next_token: AtomicU64::new(1),
            next_conn: AtomicU64::new(1),
            requests: Mutex::new(HashMap::new()),
            inbox: inbox.clone(),
            stop,
            stopping: AtomicBool::new(false),
            stats: NodeStats::default(),
            memory: hayate_io::memory::Memory::new(options.memory_budget),
            outgoing,
            options,
        });
        if inner.options.shm.mode != ShmMode::Off {
            shm::listen(inner.clone(), stop_rx.clone());
        }
        tokio::spawn(server::accept_loop(listener, inner.clone(), stop_rx));
        for addr in inner.options.peers.clone() {
            tokio::spawn(inner.clone().keep_linked(addr));
        }
        if let Some(s) = inner.options.scout.clone() {
            scout::start(inner.clone(), s);
        }
        if let Some(b) = inner.options.rendezvous.clone() {
            tokio::spawn(rendezvous::run(inner.clone(), b));
        }
        Ok(Node {
            _guard: Arc::new(StopGuard(inner.clone())),
            inner,
        })
    }

    /// Starts a node listening on `listen` and linking to `peers`, other settings default.
    pub async fn bind(listen: &str, peers: &[&str]) -> Result<Node> {
        Node::start(NodeOptions {
            listen: listen.to_string(),
            peers: peers.iter().map(|p| p.to_string()).collect(),
            ..NodeOptions::default()
        })
        .await
    }

    /// This node's id (random, 64 bits).
    pub fn id(&self) -> u64 {
        self.inner.id
    }

    /// The address the listener is bound to.
    pub fn local_addr(&self) -> SocketAddr {
        self.inner.local_addr
    }

    /// The ids of the nodes this node has a link to.
    pub fn peers(&self) -> Vec<u64> {
        let mut v: Vec<u64> = lock(&self.inner.state).links.keys().copied().collect();
        v.sort_unstable();
        v
    }

    /// Waits until this node has links to at least `n` nodes, and they to it with all the
    /// interest they had when they linked announced here, or `timeout` passes
    /// (`Error::Timeout`).
    pub async fn wait_peers(&self, n: usize, timeout: Duration) -> Result<()> {
        let until = tokio::time::Instant::now() + timeout;
        loop {
            {
                let st = lock(&self.inner.state);
                let both = st
                    .links
                    .keys()
                    .filter(|p| st.inbound.values().any(|i| i.peer == **p && i.ready))
                    .count();
                if both >= n {
                    return Ok(());
                }
            }
            if tokio::time::Instant::now() >= until {
                return Err(Error::Timeout);
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Counters.
    pub fn stats(&self) -> &NodeStats {
        &self.inner.stats
    }

    /// Dials `addr` now (besides the static list and discovery).
    pub async fn link(&self, addr: &str) -> Result<()> {
        self.inner.clone().dial(addr.to_string()).await.map(|_| ())
    }

    /// Publishes `payload` on `key` to every matching subscription, local or on another
    /// node. Waits while a `block` subscriber's queue or a link's write buffer is full.
    pub async fn publish(&self, key: &Key, payload: impl Into<Bytes>) -> Result<()> {
        self.inner
            .publish(Message::new(key.clone(), payload.into()))
            .await
    }

    /// Publishes a message with its metadata (reply-to, correlation id, headers).
    pub async fn publish_message(&self, msg: &Message) -> Result<()> {
        self.inner.publish(msg.clone()).await
    }

    /// Subscribes to a key expression (fan-out, reliable back-pressure).
    pub async fn subscribe(&self, expr: &str) -> Result<Subscription> {
        self.subscribe_with(expr, SubscribeOptions::default()).await
    }

    /// Joins queue group `group` on `expr`: each message goes to one member, on whichever
    /// node.
    pub async fn queue_subscribe(&self, expr: &str, group: &str) -> Result<Subscription> {
        let options = SubscribeOptions::queue(group);
        self.subscribe_with(expr, options).await
    }

    /// Subscribes with explicit options. Acknowledged subscriptions need a broker (refused
    /// here). Returns once every linked node has the interest (or
    /// [`NodeOptions::confirm_timeout`] passed for the slow ones).
    pub async fn subscribe_with(
        &self,
        expr: &str,
        options: SubscribeOptions,
    ) -> Result<Subscription> {
        if options.qos.ack {
            return Err(Error::Protocol(
                "acknowledged subscriptions need a broker; peer mode has none".into(),
            ));
        }
        let expr = options.check(expr)?;
        if expr.as_str().len() > usize::from(u16::MAX) {
            return Err(Error::Protocol("key expression over 65535 bytes".into()));
        }
        self.inner.subscribe(expr, options).await
    }

    /// Sends a request and waits up to `timeout` for its reply.
    pub async fn request(
        &self,
        key: &Key,
        payload: impl Into<Bytes>,
        timeout: Duration,
    ) -> Result<Message> {
        self.inner
            .request(Message::new(key.clone(), payload.into()), timeout)
            .await
    }

    /// Sends `msg` as a request (its reply-to and correlation id replaced) and waits up to
    /// `timeout` for the reply.
    pub async fn request_message(&self, msg: Message, timeout: Duration) -> Result<Message> {
        self.inner.request(msg, timeout).await
    }

    /// Answers `request` by publishing `payload` to its reply-to key.
    pub async fn reply(&self, request: &Message, payload: impl Into<Bytes>) -> Result<()> {
        let m = request.reply(payload).ok_or(Error::NoReplyTo)?;
        self.inner.publish(m).await
    }

    /// Waits until every linked node has handled everything this node sent it before the
    /// call: a round trip on each TCP link, and for local nodes reading this node's ring,
    /// until each has handed on (committed) what the ring held at the call, at most
    /// `max_block` (a node that takes longer is being ended as a slow consumer).
    pub async fn flush(&self) -> Result<()> {
        let links: Vec<Client> = lock(&self.inner.state)
            .links
            .values()
            .map(|l| l.client.clone())
            .collect();
        for l in links {
            // A link that broke meanwhile is not an error of this node's.
            let _ = l.flush().await;
        }
        if let Some(out) = &self.inner.outgoing {
            out.flushed(self.inner.options.max_block).await;
        }
        Ok(())
    }

    /// The messages of this node's shared-memory arena that local nodes still hold in
    /// place (their subscribers keep them, or have not taken them yet), and the bytes they
    /// take, after freeing those every node is done with (docs/shm.md, *Messages read in
    /// place*). `None` without an arena (shared memory off, `arena_bytes` 0, or no arena
    /// could be made). Waits while a publication waits for room in the ring.
    pub async fn shm_arena_held(&self) -> Option<(usize, usize)> {
        self.inner.outgoing.as_ref()?.arena_held().await
    }

    /// Stops the node: no more accepting, links closed (what they buffered is sent first),
    /// subscriptions ended.
    pub async fn close(&self) {
        let links: Vec<Client> = lock(&self.inner.state)
            .links
            .values()
            .map(|l| l.client.clone())
            .collect();
        for l in &links {
            let _ = tokio::time::timeout(Duration::from_secs(5), l.close()).await;
        }
        self.inner.shutdown();
    }
}

impl NodeInner {
    fn shutdown(&self) {
        if self.stopping.swap(true, Ordering::AcqRel) {
            return;
        }
        let _ = self.stop.send(true);
        let mut st = lock(&self.state);
        st.stopped = true;
        // Subscriptions end once what they hold is read.
        st.subs.retain(|id, _| id == (routes::LOCAL, INBOX_SID));
        // The links are closed too (sending what they buffered) when a runtime is at hand:
        // a node dropped without `close` must not leave its connections open.
        let links: Vec<Client> = st.links.drain().map(|(_, l)| l.client).collect();
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move {
                for c in links {
                    let _ = tokio::time::timeout(Duration::from_secs(5), c.close()).await;
                }
            });
        }
        st.inbound.clear();
        st.changed();
        lock(&self.requests).clear();
    }

    fn is_stopped(&self) -> bool {
        self.stopping.load(Ordering::Acquire)
    }

    async fn subscribe(
        self: &Arc<Self>,
        expr: KeyExpr,
        options: SubscribeOptions,
    ) -> Result<Subscription> {
        let o = crate::sub::open(
            &self.next_sid,
            self.options.subscription_capacity,
            self.options.subscription_bytes,
            self.clone(),
        )?;
        let sink = Sink::Sub {
            tx: o.tx,
            lost: o.lost,
            drop: options.qos.effective_congestion() == Congestion::Drop,
        };
        let target = routes::Target::Local {
            target: LocalTarget { sid: o.sid, sink },
            qos: options.qos,
        };
        let links: Vec<Client> = {
            let mut st = lock(&self.state);
            if st.stopped {
                return Err(Error::Closed);
            }
            let id = (routes::LOCAL, o.sid);
            st.subs.insert(id, expr, options.group.as_deref(), target);
            let links: Vec<Client> = st.links.values().map(|l| l.client.clone()).collect();
            if let Some(a) = st.subs.get(id).and_then(|s| routes::add(o.sid, s)) {
                for l in &links {
                    // A link that broke is removed by its watcher; the interest goes with
                    // the next link.
                    let _ = announce(l, &a);
                }
            }
            st.changed();
            links
        };
        // Every linked node has handled the announcement once its PONG is back.
        for l in links {
            let _ = tokio::time::timeout(self.options.confirm_timeout, l.flush()).await;
        }
        Ok(o.sub)
    }

    /// Whether every subscription of this node is `drop` (and there is at least one): the
    /// writers of the rings it reads need not wait for it.
    fn all_drop(&self) -> bool {
        lock(&self.state).all_drop()
    }

    fn remove_local(&self, sid: u32) {
        let mut st = lock(&self.state);
        if st.subs.remove((routes::LOCAL, sid)).is_none() {
            return;
        }
        for l in st.links.values() {
            let _ = announce(&l.client, &Interest::Remove { sid });
        }
        st.changed();
    }
}

impl Unsubscribe for NodeInner {
    fn unsubscribe(&self, sid: u32) {
        self.remove_local(sid);
    }
}
