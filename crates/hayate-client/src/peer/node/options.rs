//! A node's settings ([`NodeOptions`]) and counters ([`NodeStats`]).

use std::sync::atomic::AtomicU64;
use std::time::Duration;

use super::scout::ScoutOptions;
use super::shm::ShmOptions;
use crate::ConnectOptions;

/// Settings of a [`Node`](super::Node).
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
    /// How long [`Node::subscribe`](super::Node::subscribe) waits for each linked node to confirm the interest.
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
