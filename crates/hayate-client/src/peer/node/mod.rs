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
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use bytes::Bytes;
use hayate_core::qos::Congestion;
use hayate_core::{Key, KeyExpr, Message, Qos};
use tokio::net::TcpListener;
use tokio::sync::{oneshot, watch};

use crate::sub::{Subscription, TrySendError, Unsubscribe};
use crate::{Client, ConnectOptions, Error, Result, SubscribeOptions};

mod inplace;
pub(crate) mod interest;
mod rendezvous;
pub mod scout;
mod server;
pub mod shm;

pub use interest::INTEREST_KEY;
use interest::Interest;
pub use scout::ScoutOptions;
pub use shm::{ShmMode, ShmOptions};

/// The header a publishing node adds to name the queue-group members (on the receiving
/// node) a message is for: one header per member, its value the member's subscription id
/// (u32, big-endian) followed by the group's name. Removed before delivery.
pub const TO_HEADER: &str = "hayate-peer-to";

/// HELLO names and WELCOME server names of nodes start with this.
const NODE_PREFIX: &str = "hayate-peer/1 ";

/// The subscription id of a node's reply inbox.
const INBOX_SID: u32 = u32::MAX;

/// Routes cached per node, at most (the cache is cleared past it).
const ROUTE_CACHE: usize = 4096;

/// Settings of a [`Node`].
#[derive(Debug, Clone)]
pub struct NodeOptions {
    /// Where the node listens for other nodes (`HOST:PORT`; port 0 picks one).
    pub listen: String,
    /// The address other nodes should dial (`HOST:PORT`); by default the listening address.
    /// An unspecified host (`0.0.0.0`) is replaced, by whoever receives it, with the address
    /// the announcement came from.
    pub advertise: Option<String>,
    /// Nodes to link to, dialled at start and redialled (every [`NodeOptions::redial`])
    /// while unreachable or after their link breaks.
    pub peers: Vec<String>,
    /// UDP multicast scouting (`None`: off).
    pub scout: Option<ScoutOptions>,
    /// A broker (`HOST:PORT`) used as a rendezvous: nodes announce themselves there and dial
    /// whoever else does.
    pub rendezvous: Option<String>,
    /// Options of the links this node dials (write buffer: how much a publisher may get
    /// ahead of a slow link before it waits).
    pub link: ConnectOptions,
    /// Batches of messages a subscription queues before its publishers wait (`block`) or
    /// its messages are dropped (`drop`). A batch is what one read of a link brought for
    /// the subscription, or one message published on this node (default 256).
    pub subscription_capacity: usize,
    /// Payload bytes a subscription queues before its publishers wait (`block`) or its
    /// messages are dropped (`drop`) (default 64 MiB). An empty queue takes one batch of
    /// any size.
    pub subscription_bytes: usize,
    /// The largest payload this node accepts from others (and announces).
    pub max_payload: u64,
    /// How long a new incoming connection may take to send HELLO.
    pub handshake_timeout: Duration,
    /// How long a `block` subscription may hold its publishers before it is ended as a slow
    /// consumer.
    pub max_block: Duration,
    /// Pause between attempts to dial an unreachable static peer.
    pub redial: Duration,
    /// How long [`Node::subscribe`] waits for each linked node to confirm the interest.
    pub confirm_timeout: Duration,
    /// Bytes the listener's connections may hold in partly read frames (past a free 256 KiB
    /// each), together; a connection that cannot read on within `max_block` is closed with
    /// ERR 11 (`SERVER_BUSY`). The same mechanism as the broker's memory budget.
    pub memory_budget: usize,
    /// Connections the listener serves at once (links from other nodes and plain clients);
    /// past it, new ones are closed at once.
    pub max_connections: usize,
    /// Shared memory with nodes on this host (docs/shm.md).
    pub shm: ShmOptions,
}

impl Default for NodeOptions {
    fn default() -> Self {
        NodeOptions {
            listen: "127.0.0.1:0".into(),
            advertise: None,
            peers: Vec::new(),
            scout: None,
            rendezvous: None,
            link: ConnectOptions {
                connect_timeout: Duration::from_secs(5),
                ..ConnectOptions::default()
            },
            subscription_capacity: 256,
            subscription_bytes: 64 * 1024 * 1024,
            max_payload: 64 * 1024 * 1024,
            handshake_timeout: Duration::from_secs(10),
            max_block: Duration::from_secs(10),
            redial: Duration::from_secs(1),
            confirm_timeout: Duration::from_secs(5),
            memory_budget: 256 * 1024 * 1024,
            max_connections: 1024,
            shm: ShmOptions::default(),
        }
    }
}

/// Counters of a node.
#[derive(Debug, Default)]
pub struct NodeStats {
    /// Messages not sent to a node because its link was full and all its matching
    /// subscriptions are `drop`.
    pub dropped_on_links: AtomicU64,
    /// Subscriptions ended because they held their publishers past `max_block`.
    pub slow_consumers: AtomicU64,
    /// Queue-group deliveries whose named member had gone and that no other local member of
    /// its group could take.
    pub unroutable: AtomicU64,
    /// Messages this node wrote into its shared-memory ring (once each, whatever the number
    /// of local nodes reading it).
    pub shm_sent: AtomicU64,
    /// Messages this node read from other nodes' rings (whether or not a subscription here
    /// matched them); not those it passed over unread, which were for other nodes.
    pub shm_received: AtomicU64,
    /// Slots lost in other nodes' rings (overwritten before this node read them: it had
    /// only `drop` subscriptions, so the writer did not wait for it). A message takes one
    /// slot unless it is larger than a slot; lost slots may have held messages for other
    /// nodes.
    pub shm_lost: AtomicU64,
    /// Rings found corrupt (no longer read).
    pub shm_corrupt: AtomicU64,
    /// Messages in other nodes' rings larger than this node's `max_payload` (skipped).
    pub shm_too_large: AtomicU64,
    /// Messages this node put into its arena and sent through its ring as references (read
    /// in place by the local nodes they were for): counted in `shm_sent` too.
    pub shm_refs_sent: AtomicU64,
    /// Messages this node read in place in other nodes' arenas (counted in `shm_received`
    /// too).
    pub shm_refs_read: AtomicU64,
}

/// Where a local delivery goes.
#[derive(Debug, Clone)]
enum Sink {
    Sub {
        tx: crate::sub::SubSender,
        lost: Arc<AtomicU64>,
        drop: bool,
    },
    /// The node's reply inbox: completes a waiting request.
    Inbox,
}

#[derive(Debug, Clone)]
struct LocalTarget {
    sid: u32,
    sink: Sink,
}

#[derive(Debug)]
struct Local {
    sid: u32,
    expr: KeyExpr,
    qos: Qos,
    group: Option<Arc<str>>,
    target: LocalTarget,
}

/// A subscription another node announced.
#[derive(Debug)]
struct Remote {
    expr: KeyExpr,
    group: Option<Arc<str>>,
    drop: bool,
}

/// One incoming connection from another node: who, and what it announced.
#[derive(Debug)]
struct Inbound {
    peer: u64,
    interest: HashMap<u32, Remote>,
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

#[derive(Debug, Clone)]
enum Member {
    Local(LocalTarget),
    Remote {
        peer: u64,
        link: Client,
        sid: u32,
        drop: bool,
        shm: Option<usize>,
    },
}

#[derive(Debug)]
struct GroupRoute {
    name: Arc<str>,
    /// Every member, on whichever node (a publishing node picks among these).
    members: Vec<Member>,
    /// The members on this node (a receiving node picks among these).
    locals: Vec<LocalTarget>,
}

#[derive(Debug)]
struct RemoteRoute {
    peer: u64,
    link: Client,
    /// Every matching subscription of that node is `drop`.
    drop: bool,
    /// The node reads this node's ring (with this cursor entry).
    shm: Option<usize>,
}

/// Queue-group members chosen on one node: the node, its link, whether all are `drop`, and
/// the members (subscription id, group).
type Named = (u64, Client, bool, Vec<(u32, Arc<str>)>);

/// Where messages on one key go.
#[derive(Debug, Default)]
struct Route {
    locals: Vec<LocalTarget>,
    remotes: Vec<RemoteRoute>,
    groups: Vec<GroupRoute>,
}

#[derive(Debug, Default)]
struct State {
    locals: Vec<Local>,
    inbound: HashMap<u64, Inbound>,
    links: HashMap<u64, Link>,
    /// Addresses being dialled.
    dialing: HashSet<String>,
    cache: HashMap<Key, Arc<Route>, foldhash::fast::RandomState>,
    stopped: bool,
    /// Bumped by every change of routes (read without the lock by route caches outside
    /// it: a ring reader's).
    generation: Arc<AtomicU64>,
}

impl State {
    fn changed(&mut self) {
        self.cache.clear();
        self.generation.fetch_add(1, Ordering::Release);
    }

    fn route(&mut self, key: &Key) -> Arc<Route> {
        if let Some(r) = self.cache.get(key) {
            return r.clone();
        }
        let mut r = Route::default();
        let group = |r: &mut Route, name: &Arc<str>, m: Member| {
            let i = match r.groups.iter().position(|g| g.name == *name) {
                Some(i) => i,
                None => {
                    r.groups.push(GroupRoute {
                        name: name.clone(),
                        members: Vec::new(),
                        locals: Vec::new(),
                    });
                    r.groups.len() - 1
                }
            };
            let g = &mut r.groups[i];
            if let Member::Local(t) = &m {
                g.locals.push(t.clone());
            }
            g.members.push(m);
        };
        for l in &self.locals {
            if !l.expr.matches(key) {
                continue;
            }
            match &l.group {
                None => r.locals.push(l.target.clone()),
                Some(g) => group(&mut r, g, Member::Local(l.target.clone())),
            }
        }
        // Each node once, even if it announced on two connections (a redial racing the old
        // link's end).
        let mut seen: HashSet<(u64, u32)> = HashSet::new();
        for inb in self.inbound.values() {
            let Some(link) = self.links.get(&inb.peer) else {
                continue; // not linked yet: its interest waits for the link
            };
            for (sid, rem) in &inb.interest {
                if !rem.expr.matches(key) || !seen.insert((inb.peer, *sid)) {
                    continue;
                }
                match &rem.group {
                    None => match r.remotes.iter_mut().find(|x| x.peer == inb.peer) {
                        Some(x) => x.drop &= rem.drop,
                        None => r.remotes.push(RemoteRoute {
                            peer: inb.peer,
                            link: link.client.clone(),
                            drop: rem.drop,
                            shm: link.shm,
                        }),
                    },
                    Some(g) => group(
                        &mut r,
                        g,
                        Member::Remote {
                            peer: inb.peer,
                            link: link.client.clone(),
                            sid: *sid,
                            drop: rem.drop,
                            shm: link.shm,
                        },
                    ),
                }
            }
        }
        let r = Arc::new(r);
        if self.cache.len() >= ROUTE_CACHE {
            self.cache.clear();
        }
        self.cache.insert(key.compact(), r.clone());
        r
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
    rr: AtomicUsize,
    requests: Mutex<HashMap<u64, oneshot::Sender<Message>>>,
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

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
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

/// Parses a node's HELLO name: its id and advertised address.
fn parse_hello_name(name: &str) -> Option<(u64, String)> {
    let rest = name.strip_prefix(NODE_PREFIX)?;
    let (id, addr) = rest.split_once(' ')?;
    Some((u64::from_str_radix(id, 16).ok()?, addr.to_string()))
}

/// `addr` with an unspecified host replaced by `seen` (the address it came from).
pub(crate) fn resolve_advertised(addr: &str, seen: std::net::IpAddr) -> Option<String> {
    let a: SocketAddr = addr.parse().ok()?;
    if a.ip().is_unspecified() {
        Some(SocketAddr::new(seen, a.port()).to_string())
    } else {
        Some(a.to_string())
    }
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
        let inner = Arc::new(NodeInner {
            id,
            advertise,
            local_addr,
            state: Mutex::new(State {
                generation: generation.clone(),
                ..State::default()
            }),
            generation,
            next_sid: AtomicU32::new(1),
            next_token: AtomicU64::new(1),
            next_conn: AtomicU64::new(1),
            rr: AtomicUsize::new(0),
            requests: Mutex::new(HashMap::new()),
            inbox: inbox.clone(),
            stop,
            stopping: AtomicBool::new(false),
            stats: NodeStats::default(),
            memory: hayate_io::memory::Memory::new(options.memory_budget),
            outgoing,
            options,
        });
        lock(&inner.state).locals.push(Local {
            sid: INBOX_SID,
            expr: KeyExpr::new(&format!("{inbox}/*"))?,
            qos: Qos::RELIABLE,
            group: None,
            target: LocalTarget {
                sid: INBOX_SID,
                sink: Sink::Inbox,
            },
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
        self.subscribe_with(
            expr,
            SubscribeOptions {
                group: Some(group.to_string()),
                qos: Qos::default(),
            },
        )
        .await
    }

    /// Subscribes with explicit options. Acknowledged subscriptions need a broker (refused
    /// here). Returns once every linked node has the interest (or
    /// [`NodeOptions::confirm_timeout`] passed for the slow ones).
    pub async fn subscribe_with(
        &self,
        expr: &str,
        options: SubscribeOptions,
    ) -> Result<Subscription> {
        let expr = KeyExpr::new(expr)?;
        if options.qos.ack {
            return Err(Error::Protocol(
                "acknowledged subscriptions need a broker; peer mode has none".into(),
            ));
        }
        crate::check_group(options.group.as_deref())?;
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
        st.locals.retain(|l| l.sid == INBOX_SID);
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

    fn hello_name(&self) -> String {
        format!("{NODE_PREFIX}{:016x} {}", self.id, self.advertise)
    }

    fn welcome_name(&self) -> String {
        format!("{NODE_PREFIX}{:016x}", self.id)
    }

    /// Dials `addr`; `Ok(Some(id))` once linked (or already linked) to node `id` (this
    /// node's own id when `addr` is this node), `Ok(None)` when someone is dialling it
    /// already.
    async fn dial(self: Arc<Self>, addr: String) -> Result<Option<u64>> {
        if self.is_stopped() {
            return Err(Error::Closed);
        }
        if !lock(&self.state).dialing.insert(addr.clone()) {
            return Ok(None); // someone is at it
        }
        let r = self.clone().dial_inner(&addr).await;
        lock(&self.state).dialing.remove(&addr);
        if let Err(e) = &r {
            tracing::debug!(node = %format_args!("{:016x}", self.id), %addr, "peer: dial failed: {e}");
        }
        r
    }

    async fn dial_inner(self: Arc<Self>, addr: &str) -> Result<Option<u64>> {
        let mut options = self.options.link.clone();
        options.name = self.hello_name();
        let client = Client::connect_with(addr, options).await?;
        let Some(rid) = client
            .server_name()
            .strip_prefix(NODE_PREFIX)
            .and_then(|id| u64::from_str_radix(id, 16).ok())
        else {
            let _ = client.close().await;
            return Err(Error::Protocol(format!(
                "{addr} is not a peer node (server {:?})",
                client.server_name()
            )));
        };
        if rid == self.id {
            let _ = client.close().await;
            return Ok(Some(rid)); // this node itself
        }
        if lock(&self.state).links.contains_key(&rid) {
            let _ = client.close().await;
            return Ok(Some(rid));
        }
        // Shared memory first, before any publication can use the link: all of this node's
        // publications for that node then go through the ring.
        let shm = match self.options.shm.mode {
            ShmMode::Off => None,
            mode => match self.shm_offer(rid, &client).await {
                Ok(Some(entry)) => Some(entry),
                Ok(None) | Err(_) if mode == ShmMode::Require => {
                    let _ = client.close().await;
                    return Err(Error::Protocol(format!(
                        "{addr}: shared memory required, and that node cannot take it"
                    )));
                }
                Ok(None) => None,
                Err(e) => {
                    tracing::debug!("peer: shared memory with {rid:016x} failed: {e}");
                    None
                }
            },
        };
        // Ok(true): linked now; Ok(false): linked already; Err: stopping.
        let linked: Result<bool> = {
            let mut st = lock(&self.state);
            if st.stopped {
                Err(Error::Closed)
            } else if st.links.contains_key(&rid) {
                Ok(false)
            } else {
                // Everything this node subscribes to, in order, before any publication can
                // use the link (both under the lock that subscribe and unsubscribe take).
                let mut r = announce(&client, &Interest::Reset);
                for l in &st.locals {
                    r = r.and_then(|()| announce(&client, &add(l)));
                }
                r.map(|()| {
                    st.links.insert(
                        rid,
                        Link {
                            client: client.clone(),
                            addr: addr.to_string(),
                            shm,
                        },
                    );
                    st.changed();
                    true
                })
            }
        };
        match linked {
            Ok(true) => {}
            Ok(false) => {
                let _ = client.close().await;
                return Ok(Some(rid));
            }
            Err(e) => {
                let _ = client.close().await;
                return Err(e);
            }
        }
        // The PING after the announcements tells the other node they are all there.
        let _ = tokio::time::timeout(self.options.confirm_timeout, client.flush()).await;
        tracing::debug!(node = %format_args!("{:016x}", self.id), peer = %format_args!("{rid:016x}"), %addr, shm, "peer: linked");
        let me = self.clone();
        tokio::spawn(async move {
            client.inner.closed().await;
            let mut st = lock(&me.state);
            if st
                .links
                .get(&rid)
                .is_some_and(|l| Arc::ptr_eq(&l.client.inner, &client.inner))
            {
                st.links.remove(&rid);
                st.changed();
            }
        });
        Ok(Some(rid))
    }

    /// Keeps a link to the static peer at `addr`: dials until it answers, and again after
    /// its link breaks.
    async fn keep_linked(self: Arc<Self>, addr: String) {
        let mut stop = self.stop.subscribe();
        loop {
            if self.is_stopped() {
                return;
            }
            let linked = match self.clone().dial(addr.clone()).await {
                Ok(Some(id)) if id == self.id => {
                    tracing::debug!(%addr, "peer: a static peer address is this node itself");
                    return;
                }
                Ok(Some(id)) => lock(&self.state).links.get(&id).map(|l| l.client.clone()),
                // This node itself, someone else dialling it now, or unreachable: look again
                // later.
                Ok(None) | Err(_) => None,
            };
            match linked {
                Some(c) => {
                    tokio::select! {
                        () = c.inner.closed() => {}
                        _ = stop.changed() => return,
                    }
                }
                None => {
                    tokio::select! {
                        () = tokio::time::sleep(self.options.redial) => {}
                        _ = stop.changed() => return,
                    }
                }
            }
        }
    }

    /// A node announced itself at `addr` (scouting, rendezvous, or its own HELLO): dial it
    /// unless linked already.
    fn discovered(self: &Arc<Self>, id: u64, addr: String) {
        if id == self.id || self.is_stopped() {
            return;
        }
        {
            let st = lock(&self.state);
            if st.links.contains_key(&id)
                || st.dialing.contains(&addr)
                || st.links.values().any(|l| l.addr == addr)
            {
                return;
            }
        }
        let me = self.clone();
        tokio::spawn(async move {
            let _ = me.dial(addr).await;
        });
    }

    fn route(&self, key: &Key) -> Arc<Route> {
        lock(&self.state).route(key)
    }

    async fn publish(&self, msg: Message) -> Result<()> {
        if self.is_stopped() {
            return Err(Error::Closed);
        }
        if msg.payload.len() as u64 > self.options.max_payload {
            return Err(Error::PayloadTooLarge {
                size: msg.payload.len(),
                max: self.options.max_payload,
            });
        }
        let route = self.route(&msg.key);
        if route.locals.is_empty() && route.remotes.is_empty() && route.groups.is_empty() {
            // Nothing here waits, ever: a task publishing to no one in a loop gives its
            // worker up now and then (as a Tokio channel's sender does). Not on the other
            // paths: yielding every 128 publishes cut 64 B throughput over TCP to a third
            // (smaller writes); they wait when their link or ring is full.
            tokio::task::coop::consume_budget().await;
            return Ok(());
        }
        // Queue groups: one member each, anywhere.
        let mut local_members: Vec<LocalTarget> = Vec::new();
        let mut named: Vec<Named> = Vec::new();
        // Members on nodes reading the ring: (node, subscription, group).
        let mut shm_named: Vec<(u64, u32, Arc<str>)> = Vec::new();
        // The cursor entries of the nodes reading the ring that this message is for.
        let mut to_ring: u64 = 0;
        for g in &route.groups {
            let i = self.rr.fetch_add(1, Ordering::Relaxed) % g.members.len();
            match &g.members[i] {
                Member::Local(t) => local_members.push(t.clone()),
                Member::Remote {
                    peer,
                    sid,
                    shm: Some(entry),
                    ..
                } => {
                    to_ring |= 1 << entry;
                    shm_named.push((*peer, *sid, g.name.clone()));
                }
                Member::Remote {
                    peer,
                    link,
                    sid,
                    drop,
                    ..
                } => match named.iter_mut().find(|n| n.0 == *peer) {
                    Some(n) => {
                        n.2 &= *drop;
                        n.3.push((*sid, g.name.clone()));
                    }
                    None => named.push((*peer, link.clone(), *drop, vec![(*sid, g.name.clone())])),
                },
            }
        }
        for t in route.locals.iter().chain(local_members.iter()) {
            self.deliver(t, vec![msg.clone()]).await;
        }
        // Sending to several nodes over TCP in turn: no inline writes (see
        // `Inner::publish_plain_opt`).
        let tcp_nodes = route.remotes.iter().filter(|r| r.shm.is_none()).count()
            + named
                .iter()
                .filter(|n| !route.remotes.iter().any(|r| r.peer == n.0))
                .count();
        let inline_ok = tcp_nodes <= 1;
        for r in &route.remotes {
            if let Some(entry) = r.shm {
                to_ring |= 1 << entry;
                continue;
            }
            let (drop, to) = match named.iter().position(|n| n.0 == r.peer) {
                Some(i) => {
                    let n = named.swap_remove(i);
                    (r.drop && n.2, n.3)
                }
                None => (r.drop, Vec::new()),
            };
            self.send_remote(&r.link, &msg, &to, drop, inline_ok).await;
        }
        for (_, link, drop, to) in &named {
            self.send_remote(link, &msg, to, *drop, inline_ok).await;
        }
        if to_ring != 0
            && let Some(out) = &self.outgoing
        {
            self.shm_publish(out, &msg, &shm_named, to_ring).await;
            self.stats.shm_sent.fetch_add(1, Ordering::Relaxed);
        }
        Ok(())
    }

    async fn send_remote(
        &self,
        link: &Client,
        msg: &Message,
        to: &[(u32, Arc<str>)],
        drop: bool,
        inline_ok: bool,
    ) {
        if drop && !link.inner.has_room() {
            self.stats.dropped_on_links.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let r = if to.is_empty() {
            link.inner.publish_message_opt(msg, inline_ok).await
        } else {
            let m =
                server::with_named(msg, TO_HEADER, to.iter().map(|(sid, g)| (None, *sid, &**g)));
            link.inner.publish_message_opt(&m, inline_ok).await
        };
        if let Err(e) = r {
            // The link broke: its watcher removes it; the message is lost for that node as
            // it would be for a subscriber whose connection to a broker broke.
            tracing::debug!("peer: send on a link failed: {e}");
        }
    }

    /// Hands `batch` to one local target, as its QoS says (waits for room for `block`, at
    /// most `max_block`, then ends the subscription as a slow consumer).
    async fn deliver(&self, t: &LocalTarget, batch: Vec<Message>) {
        match &t.sink {
            Sink::Inbox => {
                for m in batch {
                    self.complete_request(m);
                }
            }
            Sink::Sub { tx, lost, drop } => match tx.try_send(crate::sub::Batch::Messages(batch)) {
                Ok(()) | Err(TrySendError::Closed) => {}
                Err(TrySendError::Full(b)) if *drop => {
                    lost.fetch_add(b.len() as u64, Ordering::Relaxed);
                }
                Err(TrySendError::Full(b)) => {
                    // A node that stops ends its subscriptions: its links and ring readers
                    // do not wait for room in them past that (they would for `max_block`).
                    let mut stopped = self.stop.subscribe();
                    if *stopped.borrow_and_update() {
                        return;
                    }
                    let room = tokio::time::timeout(self.options.max_block, tx.reserve(b.bytes()));
                    tokio::select! {
                        r = room => match r {
                            Ok(Ok(permit)) => permit.send(b),
                            Ok(Err(_)) => {}
                            Err(_) => self.cut_slow(t.sid),
                        },
                        _ = stopped.changed() => {}
                    }
                }
            },
        }
    }

    /// Ends local subscription `sid`, which held its publishers past `max_block`.
    fn cut_slow(&self, sid: u32) {
        tracing::warn!(
            sid,
            "peer: a subscription held its publishers past max_block: ended as a slow consumer"
        );
        self.stats.slow_consumers.fetch_add(1, Ordering::Relaxed);
        self.remove_local(sid);
    }

    fn complete_request(&self, m: Message) {
        let token = m
            .key
            .as_str()
            .rsplit('/')
            .next()
            .and_then(|t| t.parse::<u64>().ok());
        if let Some(tx) = token.and_then(|t| lock(&self.requests).remove(&t)) {
            let _ = tx.send(m);
        }
    }

    async fn request(&self, mut m: Message, timeout: Duration) -> Result<Message> {
        let token = self.next_token.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        lock(&self.requests).insert(token, tx);
        m.reply_to = Some(Key::new(&format!("{}/{token}", self.inbox))?);
        m.correlation_id = Some(Bytes::copy_from_slice(&token.to_be_bytes()));
        if let Err(e) = self.publish(m).await {
            lock(&self.requests).remove(&token);
            return Err(e);
        }
        match tokio::time::timeout(timeout, rx).await {
            Ok(Ok(reply)) => Ok(reply),
            Ok(Err(_)) => Err(Error::Closed),
            Err(_) => {
                lock(&self.requests).remove(&token);
                Err(Error::Timeout)
            }
        }
    }

    async fn subscribe(
        self: &Arc<Self>,
        expr: KeyExpr,
        options: SubscribeOptions,
    ) -> Result<Subscription> {
        let sid = self.next_sid.fetch_add(1, Ordering::Relaxed);
        if sid == INBOX_SID {
            return Err(Error::Protocol("subscription ids exhausted".into()));
        }
        let (tx, rx) = crate::sub::queue(
            self.options.subscription_capacity,
            self.options.subscription_bytes,
        );
        let lost = Arc::new(AtomicU64::new(0));
        let drop = options.qos.effective_congestion() == Congestion::Drop;
        let local = Local {
            sid,
            expr,
            qos: options.qos,
            group: options.group.map(Arc::from),
            target: LocalTarget {
                sid,
                sink: Sink::Sub {
                    tx,
                    lost: lost.clone(),
                    drop,
                },
            },
        };
        let links: Vec<Client> = {
            let mut st = lock(&self.state);
            if st.stopped {
                return Err(Error::Closed);
            }
            let a = add(&local);
            let links: Vec<Client> = st.links.values().map(|l| l.client.clone()).collect();
            for l in &links {
                // A link that broke is removed by its watcher; the interest goes with the
                // next link.
                let _ = announce(l, &a);
            }
            st.locals.push(local);
            st.changed();
            links
        };
        // Every linked node has handled the announcement once its PONG is back.
        for l in links {
            let _ = tokio::time::timeout(self.options.confirm_timeout, l.flush()).await;
        }
        Ok(Subscription::new(sid, rx, lost, self.clone()))
    }

    /// Whether every subscription of this node is `drop` (and there is at least one): the
    /// writers of the rings it reads need not wait for it.
    fn all_drop(&self) -> bool {
        let st = lock(&self.state);
        let mut subs = st.locals.iter().filter(|l| l.sid != INBOX_SID).peekable();
        subs.peek().is_some() && subs.all(|l| matches!(l.target.sink, Sink::Sub { drop: true, .. }))
    }

    fn remove_local(&self, sid: u32) {
        let mut st = lock(&self.state);
        let before = st.locals.len();
        st.locals.retain(|l| l.sid != sid);
        if st.locals.len() == before {
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

fn add(l: &Local) -> Interest {
    Interest::Add {
        sid: l.sid,
        qos: l.qos,
        group: l.group.as_deref().map(str::to_string),
        expr: l.expr.clone(),
    }
}

fn announce(link: &Client, i: &Interest) -> Result<()> {
    let key = Key::new(INTEREST_KEY)?;
    link.inner.publish_now(&Message::new(key, i.encode()))
}
