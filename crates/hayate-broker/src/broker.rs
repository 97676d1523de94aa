//! The broker: the registry of subscriptions (the route table: trie, subscriptions, queue
//! groups, queues' bindings) behind one lock, its generation counter, settings and
//! counters.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use hayate_core::route::{Sub, SubKey, Table};
use hayate_core::{KeyExpr, Qos};
use hayate_flow::memory::Memory;

use crate::outbox::{Encoder, Outbox};
use crate::session::Session;

/// Engine settings (the server maps its config file onto these).
#[derive(Debug, Clone)]
pub struct BrokerConfig {
    /// Byte budget of each session's outbox.
    pub outbox_bytes: usize,
    /// Longest a publisher waits for room in one `block` subscriber's outbox before that
    /// subscription's stall policy applies (disconnect or drop); `None` waits forever.
    pub max_block: Option<Duration>,
    /// Most deliveries of a session's acknowledged subscriptions in flight at once.
    pub max_unacked: usize,
    /// The data directory on the local file system (front-ends keep their own files in it);
    /// `None`: nothing is kept. [`Broker::new`] makes `data` from it when `data` is `None`.
    pub data_dir: Option<std::path::PathBuf>,
    /// The storage root every durable log of the broker opens through (streams in
    /// `streams/<name>`, the front-ends' logs); `None`: no streams. Tests pass a
    /// [`hayate_log::FaultyRoot`].
    pub data: Option<Arc<dyn hayate_log::Root>>,
    /// Most streams the broker keeps (each has files and, unless `never`, a sync thread).
    pub max_streams: usize,
    /// Most durable consumers per stream.
    pub max_consumers: usize,
    /// Most streams one user may own (created through the API while logged in).
    pub max_streams_per_user: usize,
    /// Most durable consumers one user may have created through the API, over every
    /// stream (shared consumers included, though they have no owner).
    pub max_consumers_per_user: usize,
    /// Name prefixes of the durable consumers that are shared work queues (the server sets
    /// those of its front-ends' durable queues: STOMP's `/queue/`): one made through the
    /// stream API gets no owner (whoever asks), or its maker could keep everyone else off
    /// the queue. Empty by default.
    pub shared_consumers: Vec<String>,
    /// Most subscriptions one session may hold (0: no limit).
    pub max_subscriptions: usize,
    /// Most payload bytes an implicit queue (made by a first use: STOMP `/queue/`, native
    /// CONSUME) holds ready (0: no limit); further messages are refused.
    pub queue_max_bytes: usize,
    /// Most messages an implicit queue holds ready; further messages are refused.
    pub queue_max_length: usize,
    /// The broker-wide memory budget every outbox and queue charges (shared with the
    /// server's front-ends, which charge their input and stores to it).
    pub memory: Arc<Memory>,
}

impl Default for BrokerConfig {
    fn default() -> Self {
        BrokerConfig {
            outbox_bytes: 8 * 1024 * 1024,
            max_block: Some(Duration::from_secs(2)),
            max_unacked: 1024,
            data_dir: None,
            data: None,
            max_streams: 256,
            max_consumers: 1024,
            max_streams_per_user: 32,
            max_consumers_per_user: 256,
            shared_consumers: Vec::new(),
            max_subscriptions: 10_000,
            queue_max_bytes: 64 * 1024 * 1024,
            queue_max_length: 10_000,
            memory: Memory::unlimited(),
        }
    }
}

/// Counters over the broker's life.
#[derive(Debug, Default)]
pub struct BrokerStats {
    /// Sessions opened.
    pub sessions_opened: AtomicU64,
    /// Messages dropped for `drop` subscriptions with a full outbox (and for stalled
    /// `Stall::Drop` subscriptions).
    pub dropped: AtomicU64,
    /// Slow consumers disconnected (a `block` subscription stalled past `max_block`).
    pub slow_consumers: AtomicU64,
    /// Times a publisher gave up waiting on a `Stall::Drop` subscription.
    pub stalls: AtomicU64,
    /// Deliveries given back (NACK, or unacknowledged when their receiver went away) that
    /// found no receiver and no queue to wait in.
    pub unplaced: AtomicU64,
    /// Messages appended to streams (once per stream).
    pub stored: AtomicU64,
    /// Messages a capturing stream failed to append (disk full, failed fsync, ...).
    pub store_failed: AtomicU64,
    /// Sampled time from a publish reaching the broker to its delivery being written to a
    /// subscriber's socket (see [`crate::latency`]).
    pub delivery_latency: Arc<crate::latency::LatencyHistogram>,
}

/// Which subscriptions [`Broker::subscriptions`] lists (every filter given must pass).
#[derive(Debug, Clone, Copy)]
pub struct SubFilter<'a> {
    /// Those of this session.
    pub session: Option<u64>,
    /// Those that would receive a message on this key (expression matches, guard admits).
    pub key: Option<&'a hayate_core::Key>,
    /// Those whose expression intersects this one.
    pub expr: Option<&'a KeyExpr>,
    /// Those in the queue group of this name.
    pub group: Option<&'a str>,
    /// At most this many listed.
    pub limit: usize,
}

/// One subscription, as [`Broker::subscriptions`] lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubscriptionView {
    /// The broker session that holds it.
    pub session: u64,
    /// Its id within the session.
    pub sid: u32,
    /// Its key expression.
    pub expr: String,
    /// Its queue group's name, if it is in one.
    pub group: Option<String>,
    /// Acknowledged delivery.
    pub ack: bool,
    /// Drops (rather than blocks) when the subscriber cannot keep up.
    pub drop: bool,
}

/// Decides, key by key, whether a subscription may receive messages its expression selects
/// (permissions: a wildcard subscription that covers keys its owner may not read, or other
/// clients' reply inboxes). Checked when a route is built for a key (routes are cached per
/// key until subscriptions change, so the cost is not paid per message).
pub trait KeyGuard: Send + Sync + std::fmt::Debug {
    /// True when the subscription may receive messages published on `key`.
    fn admits(&self, key: &hayate_core::Key) -> bool;
}

/// What a subscription leads to (the route table holds its expression and queue group).
#[derive(Debug)]
pub(crate) struct SubEntry {
    pub(crate) to: To,
    pub(crate) qos: Qos,
    pub(crate) guard: Option<Arc<dyn KeyGuard>>,
}

/// A session's outbox (a subscription), or a queue (a binding, with its filter).
#[derive(Debug)]
pub(crate) enum To {
    Outbox(Arc<Outbox>),
    Queue(
        Arc<crate::queue::Queue>,
        Option<Arc<dyn crate::queue::BindingFilter>>,
    ),
}

#[derive(Debug, Default)]
pub(crate) struct Registry {
    /// Subscriptions by (session, id), their trie and their queue groups (id: name, NUL,
    /// expression) with their round-robin turns.
    pub(crate) routes: Table<SubEntry>,
}

#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) registry: RwLock<Registry>,
    /// Streams by name. Lock order: registry -> streams.
    pub(crate) streams: RwLock<crate::stream::registry::StreamMap>,
    /// Serialises creating and deleting streams, so that their file work runs without
    /// holding `streams` (which routing and every stream lookup read). Taken before `streams`.
    pub(crate) stream_admin: std::sync::Mutex<()>,
    /// The meta log, opened (and older files migrated) by the first stream operation.
    pub(crate) meta: std::sync::Mutex<Option<Arc<crate::meta::Meta>>>,
    /// Bumped (under the registry write lock) on every subscription change.
    pub(crate) generation: AtomicU64,
    pub(crate) next_session: AtomicU64,
    pub(crate) config: BrokerConfig,
    pub(crate) stats: BrokerStats,
    /// Sampled messages per key prefix (admin API's top keys).
    pub(crate) keys: crate::keys::KeySampler,
    /// Queues by namespace and name (a leaf lock).
    pub(crate) queues: std::sync::Mutex<HashMap<crate::queue::QueueId, Arc<crate::queue::Queue>>>,
    /// Most implicit queues ([`Broker::queue_implicit`]) in the table.
    pub(crate) max_implicit: std::sync::atomic::AtomicUsize,
}

/// The engine. Cheap to clone: a handle to shared state.
#[derive(Debug, Clone)]
pub struct Broker {
    pub(crate) shared: Arc<Shared>,
}

impl Default for Broker {
    fn default() -> Self {
        Broker::new(BrokerConfig::default())
    }
}

/// Why a subscription was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SubscribeError {
    /// The session already has a subscription with this id.
    #[error("subscription id {0} is already in use")]
    DuplicateId(u32),
    /// The session holds `limits.max_subscriptions` already.
    #[error("at most {0} subscriptions per session (limits.max_subscriptions)")]
    TooMany(usize),
}

impl Broker {
    /// A broker with `config`.
    pub fn new(mut config: BrokerConfig) -> Broker {
        if config.data.is_none()
            && let Some(d) = &config.data_dir
        {
            config.data = Some(Arc::new(hayate_log::FsRoot(d.clone())));
        }
        Broker {
            shared: Arc::new(Shared {
                registry: RwLock::new(Registry::default()),
                streams: RwLock::new(Default::default()),
                stream_admin: std::sync::Mutex::new(()),
                meta: std::sync::Mutex::new(None),
                generation: AtomicU64::new(1),
                next_session: AtomicU64::new(1),
                config,
                stats: BrokerStats::default(),
                keys: crate::keys::KeySampler::default(),
                queues: std::sync::Mutex::new(HashMap::new()),
                max_implicit: std::sync::atomic::AtomicUsize::new(
                    crate::queue::MAX_IMPLICIT_QUEUES,
                ),
            }),
        }
    }

    /// The settings.
    pub fn config(&self) -> &BrokerConfig {
        &self.shared.config
    }

    /// The counters.
    pub fn stats(&self) -> &BrokerStats {
        &self.shared.stats
    }

    /// Sampled messages per key prefix ([`crate::keys`]).
    pub fn key_sampler(&self) -> &crate::keys::KeySampler {
        &self.shared.keys
    }

    /// Number of live subscriptions.
    pub fn subscription_count(&self) -> usize {
        self.read().routes.len()
    }

    /// Subscriptions per session id (one pass under the registry's read lock).
    pub fn subscriptions_by_session(&self) -> HashMap<u64, usize> {
        let mut m = HashMap::new();
        for ((session, _), _) in self.read().routes.iter() {
            *m.entry(session).or_insert(0) += 1;
        }
        m
    }

    /// Subscriptions, by session and id, that pass `filter`: at most `filter.limit` of them,
    /// and how many pass in all.
    pub fn subscriptions(&self, filter: SubFilter<'_>) -> (Vec<SubscriptionView>, usize) {
        let SubFilter {
            session,
            key,
            expr,
            group,
            limit,
        } = filter;
        let reg = self.read();
        let mut v = Vec::new();
        let mut total = 0;
        let mut keep = |sk: SubKey, e: &Sub<SubEntry>| {
            let group_name = e
                .group
                .as_deref()
                .map(|g| g.split_once('\0').map_or(g, |(n, _)| n));
            if session.is_some_and(|s| s != sk.0)
                || expr.is_some_and(|x| !x.intersects(&e.expr))
                || group.is_some_and(|g| group_name != Some(g))
            {
                return;
            }
            total += 1;
            if v.len() < limit {
                v.push(SubscriptionView {
                    session: sk.0,
                    sid: sk.1,
                    expr: e.expr.as_str().to_string(),
                    group: group_name.map(str::to_string),
                    ack: e.target.qos.ack,
                    drop: e.target.qos.congestion == hayate_core::Congestion::Drop,
                });
            }
        };
        match key {
            Some(k) => {
                for (sk, e) in reg.routes.matching(k) {
                    if e.target.guard.as_ref().is_none_or(|g| g.admits(k)) {
                        keep(sk, e);
                    }
                }
            }
            None => {
                for (sk, e) in reg.routes.iter() {
                    keep(sk, e);
                }
            }
        }
        drop(reg);
        v.sort_by_key(|s| (s.session, s.sid));
        (v, total)
    }

    /// Queue groups: (name, key expression, members).
    pub fn queue_groups(&self) -> Vec<(String, String, usize)> {
        let reg = self.read();
        let mut v: Vec<_> = reg
            .routes
            .groups()
            .map(|(id, members)| {
                let (name, expr) = id.split_once('\0').unwrap_or((id, ""));
                (name.to_string(), expr.to_string(), members)
            })
            .collect();
        v.sort();
        v
    }

    /// Opens a session whose deliveries are encoded by `encoder`.
    pub fn open_session(&self, encoder: Box<dyn Encoder>) -> Session {
        self.open_session_in(encoder, None)
    }

    /// [`Broker::open_session`] for a session whose traffic counts in `class` (its
    /// listener's totals).
    pub fn open_session_in(
        &self,
        encoder: Box<dyn Encoder>,
        class: Option<&Arc<hayate_flow::traffic::TrafficClass>>,
    ) -> Session {
        let id = self.shared.next_session.fetch_add(1, Ordering::Relaxed);
        self.shared
            .stats
            .sessions_opened
            .fetch_add(1, Ordering::Relaxed);
        let outbox = Arc::new(
            Outbox::with_memory(
                self.shared.config.outbox_bytes,
                encoder,
                self.shared.config.max_unacked,
                &self.shared.config.memory,
            )
            .in_class(class),
        );
        Session::new(self.clone(), id, outbox)
    }

    pub(crate) fn read(&self) -> std::sync::RwLockReadGuard<'_, Registry> {
        self.shared
            .registry
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    pub(crate) fn write(&self) -> std::sync::RwLockWriteGuard<'_, Registry> {
        self.shared
            .registry
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    pub(crate) fn bump(&self) {
        self.shared.generation.fetch_add(1, Ordering::Release);
    }

    /// Makes every session build its routes again at its next publish: what the
    /// subscriptions' [`KeyGuard`]s answer has changed (permissions reloaded).
    pub fn forget_routes(&self) {
        self.bump();
    }
}

/// Removes subscription `sid` of `session`.
pub(crate) fn remove_sub(reg: &mut Registry, session: u64, sid: u32) {
    reg.routes.remove((session, sid));
}
