//! The AMQP 0-9-1 front-end: RabbitMQ's clients (pika, kombu, amqp091-go, lapin, the Java
//! client) on Hayate's core. docs/amqp.md describes the model and its limits.
//!
//! - Exchanges are names with a type (direct, fanout, topic, headers); `""`, `amq.direct`,
//!   `amq.fanout`, `amq.topic`, `amq.headers` and `amq.match` exist from the start. An
//!   exchange holds nothing: publishing to it publishes to the broker on the key
//!   [`names::publish_key`] gives, where every protocol's subscribers can see it.
//! - Queues ([`queue::Queue`], on the engine's `hayate_broker::queue::Queue`) hold messages
//!   for their consumers; their bindings are broker
//!   subscriptions on [`names::binding_expr`], so an MQTT publish on `a/b` reaches a queue
//!   bound to `amq.topic` with `a.b` (or `a.*`, `#`).
//! - Durable queues, durable exchanges and the persistent messages in durable queues are
//!   kept in the engine's queue store of the virtual host's namespace
//!   (`hayate_broker::queue::store`: a log of the messages, definitions and settlement in
//!   the meta log) and read back at start; every queue also holds its messages in memory.
//!
//! # Layout
//! - this crate's root: [`Amqp`] (the front-end's shared state: exchanges, queues, settings);
//! - `names`: exchanges and routing keys as keys;
//! - `queue`: AMQP on the engine's queues (`hayate_broker::queue`): arguments, bindings,
//!   channels as consumers' sinks, dead letters to an exchange;
//! - `delivery`: messages ↔ frames and properties, the connection session's encoder;
//! - `defs`: what AMQP keeps in the store of its durable definitions;
//! - `legacy`: the one-time conversion of an earlier release's `<data>/amqp/` files;
//! - `conn`: one connection (handshake, channels, every method).

pub mod conn;
pub(crate) mod defs;
pub(crate) mod delivery;
pub(crate) mod legacy;
pub(crate) mod names;
pub(crate) mod queue;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use hayate_amqp::{FieldTable, FieldValue};
use hayate_broker::Broker;
use hayate_broker::queue::store::{Recovered, RecoveredQueue, Store as QStore};
use hayate_core::{Key, KeyExpr, Message};

use hayate_core::sync::lock;
use hayate_front::auth::Authenticator;
use hayate_front::config::{AmqpSection, Config};
use names::Kind;
use queue::Queue;

/// A declared exchange.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Exchange {
    pub(crate) kind: Kind,
    pub(crate) durable: bool,
    pub(crate) auto_delete: bool,
    pub(crate) internal: bool,
    /// Predeclared (`""`, `amq.*`): cannot be deleted.
    pub(crate) builtin: bool,
}

/// An exchange-to-exchange binding: what `source` routes with `key` and `args` (as its
/// type routes) goes on through `destination`'s bindings.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Edge {
    pub(crate) source: String,
    pub(crate) destination: String,
    pub(crate) key: String,
    pub(crate) args: FieldTable,
}

/// Exchanges and queues of a virtual host.
#[derive(Debug, Default)]
pub(crate) struct Registry {
    pub(crate) exchanges: HashMap<String, Exchange>,
    pub(crate) queues: HashMap<String, Arc<Queue>>,
    /// Exchange-to-exchange bindings.
    pub(crate) edges: Vec<Edge>,
}

impl Registry {
    /// `x` and every exchange that exchange-to-exchange bindings lead to from it.
    pub(crate) fn downstream(&self, x: &str) -> HashSet<String> {
        let mut seen = HashSet::from([x.to_string()]);
        let mut todo = vec![x.to_string()];
        while let Some(at) = todo.pop() {
            for e in self.edges.iter().filter(|e| e.source == at) {
                if seen.insert(e.destination.clone()) {
                    todo.push(e.destination.clone());
                }
            }
        }
        seen
    }

    /// What routes are computed from: each exchange's type, and the exchange bindings in
    /// their effective form (a fanout or headers source ignores the key, only a headers one
    /// reads the arguments), each once.
    fn topology(&self) -> Topology {
        let kinds: HashMap<String, Kind> = self
            .exchanges
            .iter()
            .map(|(n, x)| (n.clone(), x.kind))
            .collect();
        let mut edges: Vec<Edge> = Vec::new();
        let mut seen = HashSet::new();
        for e in &self.edges {
            let Some(&kind) = kinds.get(&e.source) else {
                continue;
            };
            let hop = queue::Hop::new(&e.source, kind, &e.key, &e.args);
            let effective = Edge {
                source: e.source.clone(),
                destination: e.destination.clone(),
                key: hop.key,
                args: hop.args,
            };
            if seen.insert((
                effective.source.clone(),
                effective.destination.clone(),
                effective.key.clone(),
                defs::table_hex(&effective.args),
            )) {
                edges.push(effective);
            }
        }
        Topology { kinds, edges }
    }
}

/// A snapshot of a vhost's exchanges and exchange bindings (see [`Registry::topology`]),
/// from which routes are computed without holding the registry.
struct Topology {
    kinds: HashMap<String, Kind>,
    edges: Vec<Edge>,
}

impl Topology {
    /// Every chain of exchange-to-exchange bindings that ends at `x` and names no exchange
    /// twice (so cycles end), as indices into `edges`, source first; `None` past
    /// [`queue::MAX_ROUTES`] chains. The work is bounded by the chains found times the
    /// bindings into each exchange on them.
    fn chains_into(&self, x: &str) -> Option<Vec<Vec<usize>>> {
        fn walk(
            t: &Topology,
            into: &HashMap<&str, Vec<usize>>,
            at: &str,
            path: &mut Vec<usize>,
            on_path: &mut Vec<String>,
            out: &mut Vec<Vec<usize>>,
        ) -> bool {
            for &i in into.get(at).map(Vec::as_slice).unwrap_or_default() {
                let e = &t.edges[i];
                if on_path.contains(&e.source) {
                    continue;
                }
                path.push(i);
                out.push(path.iter().rev().copied().collect());
                if out.len() > queue::MAX_ROUTES {
                    return false;
                }
                on_path.push(e.source.clone());
                let ok = walk(t, into, &e.source, path, on_path, out);
                on_path.pop();
                path.pop();
                if !ok {
                    return false;
                }
            }
            true
        }
        let mut into: HashMap<&str, Vec<usize>> = HashMap::new();
        for (i, e) in self.edges.iter().enumerate() {
            into.entry(e.destination.as_str()).or_default().push(i);
        }
        let mut out = Vec::new();
        walk(
            self,
            &into,
            x,
            &mut Vec::new(),
            &mut vec![x.to_string()],
            &mut out,
        )
        .then_some(out)
    }

    /// The routes a queue with client-made `bindings` gets: one per distinct subscription
    /// on a source exchange (its first binding), with every chain of hops that leads from
    /// it through one of the queue's bindings. `chains` caches [`Topology::chains_into`]
    /// across queues. `Err` (the text of the 406) past [`queue::MAX_ROUTES`] routes or
    /// [`queue::MAX_ROUTE_COST`] for the queue.
    fn routes(
        &self,
        name: &str,
        vhost: &str,
        prefix: &str,
        bindings: &[queue::Binding],
        chains: &mut HashMap<String, Option<Vec<Vec<usize>>>>,
    ) -> Result<Vec<queue::Route>, String> {
        let too_many = || {
            format!(
                "exchange-to-exchange bindings would give queue '{name}' in vhost '{vhost}' more than {} routes of at most {} hops in all",
                queue::MAX_ROUTES,
                queue::MAX_ROUTE_COST
            )
        };
        let mut routes: Vec<queue::Route> = Vec::new();
        let mut at: HashMap<(String, String, String), usize> = HashMap::new();
        let mut cost = 0;
        let mut seen_bindings = HashSet::new();
        for b in bindings.iter().filter(|b| !b.exchange.is_empty()) {
            let mut last = queue::Hop::new(&b.exchange, b.kind, &b.key, &b.args);
            last.guard = b.guard.clone().map(|g| (g, prefix.to_string()));
            // Bindings that differ only in what their exchange ignores route the same (and
            // the same guard lets the same in).
            if !seen_bindings.insert((
                last.exchange.clone(),
                last.key.clone(),
                defs::table_hex(&last.args),
                b.guard
                    .as_ref()
                    .map(|g| Arc::as_ptr(g) as *const () as usize),
            )) {
                continue;
            }
            let found = chains
                .entry(b.exchange.clone())
                .or_insert_with(|| self.chains_into(&b.exchange));
            let Some(found) = found else {
                return Err(too_many());
            };
            for chain in found.iter() {
                let first = &self.edges[chain[0]];
                let Some(&kind) = self.kinds.get(&first.source) else {
                    continue;
                };
                let mut hops = Vec::with_capacity(chain.len());
                for &i in &chain[1..] {
                    let e = &self.edges[i];
                    if let Some(&k) = self.kinds.get(&e.source) {
                        hops.push(queue::Hop::new(&e.source, k, &e.key, &e.args));
                    }
                }
                hops.push(last.clone());
                cost += hops.len();
                let id = queue::route_id(&first.source, &first.key, &first.args);
                match at.get(&id) {
                    Some(&i) => routes[i].paths.push(hops),
                    None => {
                        cost += 1;
                        at.insert(id, routes.len());
                        routes.push(queue::Route {
                            source: first.source.clone(),
                            kind,
                            key: first.key.clone(),
                            args: first.args.clone(),
                            paths: vec![hops],
                        });
                    }
                }
                if routes.len() > queue::MAX_ROUTES || cost > queue::MAX_ROUTE_COST {
                    return Err(too_many());
                }
            }
        }
        Ok(routes)
    }
}

/// The cost of routes: one per route and per hop of each of its paths (what their
/// memory and per-message work are in proportion to).
pub(crate) fn route_cost(routes: &[queue::Route]) -> usize {
    routes
        .iter()
        .map(|r| 1 + r.paths.iter().map(Vec::len).sum::<usize>())
        .sum()
}

/// A virtual host: its exchanges and queues, and where its keys are.
#[derive(Debug)]
pub(crate) struct VHost {
    pub(crate) name: String,
    /// What every key of the vhost starts with: nothing for `/` (whose keys meet MQTT,
    /// STOMP and native clients' as they are), `amqp-vhost/<name>/` for the others.
    pub(crate) prefix: String,
    pub(crate) registry: Mutex<Registry>,
    /// Bumped whenever an exchange is declared or deleted, or its exchange-to-exchange
    /// bindings change: a connection's cached exchange is good while it is unchanged
    /// (publishing takes no registry lock).
    pub(crate) exchanges_changed: AtomicU64,
    /// Held through every change of bindings (queue's and exchange-to-exchange) and the
    /// routes it leads to, so routes are computed and applied in the order of the changes.
    /// Taken before `registry`.
    pub(crate) topology: Mutex<()>,
    /// The cost ([`route_cost`]) of all its queues' routes.
    pub(crate) route_cost: std::sync::atomic::AtomicUsize,

    /// Where its durable exchanges, queues and persistent messages are kept (set at
    /// start when the broker has a data directory).
    pub(crate) store: std::sync::OnceLock<Arc<QStore>>,
}

impl VHost {
    fn new(name: &str) -> VHost {
        let mut reg = Registry::default();
        for (x, kind) in [
            ("", Kind::Direct),
            ("amq.direct", Kind::Direct),
            ("amq.fanout", Kind::Fanout),
            ("amq.topic", Kind::Topic),
            ("amq.headers", Kind::Headers),
            ("amq.match", Kind::Headers),
        ] {
            reg.exchanges.insert(
                x.to_string(),
                Exchange {
                    kind,
                    durable: true,
                    auto_delete: false,
                    internal: false,
                    builtin: true,
                },
            );
        }
        let prefix = if name == "/" {
            String::new()
        } else {
            // One key segment, with nothing a key expression would read as a wildcard.
            let mut p = String::from("amqp-vhost/");
            for c in name.chars() {
                match c {
                    '%' => p.push_str("%25"),
                    '/' => p.push_str("%2F"),
                    '*' => p.push_str("%2A"),
                    c => p.push(c),
                }
            }
            p.push('/');
            p
        };
        VHost {
            name: name.to_string(),
            prefix,
            registry: Mutex::new(reg),
            exchanges_changed: AtomicU64::new(0),
            topology: Mutex::new(()),
            route_cost: std::sync::atomic::AtomicUsize::new(0),

            store: std::sync::OnceLock::new(),
        }
    }

    /// Forgets durable exchange `x` in the store: its record and the exchange-to-exchange
    /// bindings it is an end of.
    pub(crate) fn forget_exchange(&self, x: &str) -> Result<(), String> {
        let Some(s) = self.store.get() else {
            return Ok(());
        };
        let mut gone = vec![(defs::exchange_key(x), Vec::new())];
        for (k, v) in s.defs("edge/") {
            if defs::EdgeDef::decode(&v).is_ok_and(|e| e.source == x || e.destination == x) {
                gone.push((k, Vec::new()));
            }
        }
        s.put_defs(&gone)
    }

    /// The store, for something durable (none without a data directory).
    pub(crate) fn store_for(&self, durable: bool) -> Option<&Arc<QStore>> {
        self.store.get().filter(|_| durable)
    }

    /// `k` (a key of the `/` mapping) as a key of this vhost.
    pub(crate) fn key(&self, k: Option<Key>) -> Option<Key> {
        let k = k?;
        if self.prefix.is_empty() {
            return Some(k);
        }
        Key::new(&format!("{}{}", self.prefix, k.as_str())).ok()
    }

    /// `e` (an expression of the `/` mapping) as an expression of this vhost.
    pub(crate) fn expr(&self, e: Option<KeyExpr>) -> Option<KeyExpr> {
        let e = e?;
        if self.prefix.is_empty() {
            return Some(e);
        }
        KeyExpr::new(&format!("{}{}", self.prefix, e.as_str())).ok()
    }

    /// The key a publish to exchange `x` with routing key `rk` goes to in this vhost:
    /// [`names::publish_key`] under the vhost's prefix; `None` (unroutable) for a key of
    /// another vhost (`/` reaching `amqp-vhost/...`). Inboxes (direct reply-to) belong to no
    /// vhost: the default exchange reaches them as they are.
    pub(crate) fn publish_key(&self, x: &str, kind: Kind, rk: &str) -> Option<Key> {
        if x.is_empty() && (rk.starts_with(names::REPLY_TO_PREFIX) || hayate_core::is_inbox_key(rk))
        {
            return names::queue_key(rk);
        }
        self.key(names::publish_key(x, kind, rk))
            .filter(|k| !self.foreign(k.as_str()))
    }

    /// Deletes each auto-delete exchange of `candidates` that is no longer the source of any
    /// binding (a queue's or an exchange's), as RabbitMQ deletes an auto-delete exchange
    /// when its last binding goes; an exchange bound to one deleted so loses a binding, and
    /// goes too if it was its last (cascading). Called with `topology` held, after a binding
    /// went (unbind, a queue deleted, an exchange deleted).
    /// No route passes through an exchange so deleted (it is the source of no exchange
    /// binding, and no queue is bound to it), so no queue's routes change.
    pub(crate) fn drop_unused_exchanges(&self, mut candidates: Vec<String>) {
        while let Some(x) = candidates.pop() {
            let queues = {
                let reg = lock(&self.registry);
                let unused = reg
                    .exchanges
                    .get(&x)
                    .is_some_and(|e| e.auto_delete && !e.builtin)
                    && !reg.edges.iter().any(|e| e.source == x);
                if !unused {
                    continue;
                }
                reg.queues.values().cloned().collect::<Vec<_>>()
            };
            if queues.iter().any(|q| q.bound_to(|b| b == x)) {
                continue;
            }
            let durable = {
                let mut reg = lock(&self.registry);
                let durable = reg.exchanges.remove(&x).is_some_and(|e| e.durable);
                for e in reg.edges.iter().filter(|e| e.destination == x) {
                    candidates.push(e.source.clone());
                }
                reg.edges.retain(|e| e.source != x && e.destination != x);
                durable
            };
            self.exchanges_changed.fetch_add(1, Ordering::AcqRel);
            tracing::debug!(vhost = %self.name, "amqp: auto-delete exchange {x:?} unused: deleted");
            if durable && let Err(e) = self.forget_exchange(&x) {
                tracing::error!(vhost = %self.name, "amqp: auto-deleted exchange {x:?} not forgotten by its store: {e}");
            }
        }
    }

    /// The queues whose routes depend on the bindings of exchange `x`: those bound to it or
    /// to an exchange downstream of it (read without holding `registry` while a queue's
    /// state is locked).
    pub(crate) fn queues_after(&self, x: &str) -> Vec<Arc<Queue>> {
        let (down, queues) = {
            let reg = lock(&self.registry);
            (
                reg.downstream(x),
                reg.queues.values().cloned().collect::<Vec<_>>(),
            )
        };
        queues
            .into_iter()
            .filter(|q| q.bound_to(|x| down.contains(x)))
            .collect()
    }

    /// Recomputes the routes of `queues` (called with `topology` held, after a change of
    /// bindings). Computes them all first (without holding the registry) and changes
    /// nothing if one queue, or the vhost, would have too many ([`MAX_VHOST_ROUTE_COST`]);
    /// then applies each queue's, going on past a queue whose subscriptions fail (the
    /// first failure is returned).
    pub(crate) fn reroute(&self, queues: &[Arc<Queue>]) -> Result<(), String> {
        let bindings: Vec<Vec<queue::Binding>> = queues.iter().map(|q| q.bindings()).collect();
        let topology = lock(&self.registry).topology();
        let mut chains = HashMap::new();
        let plans = queues
            .iter()
            .zip(&bindings)
            .map(|(q, b)| topology.routes(&q.name, &self.name, &self.prefix, b, &mut chains))
            .collect::<Result<Vec<_>, String>>()?;
        let old: usize = queues.iter().map(|q| q.route_cost()).sum();
        let new: usize = plans.iter().map(|r| route_cost(r)).sum();
        let total = self.route_cost.load(Ordering::Acquire);
        if new > old && total - old.min(total) + new > MAX_VHOST_ROUTE_COST {
            return Err(format!(
                "exchange-to-exchange bindings would give the queues of vhost '{}' more than {MAX_VHOST_ROUTE_COST} routes and hops in all",
                self.name
            ));
        }
        let mut failed = Ok(());
        for (q, routes) in queues.iter().zip(plans) {
            if let Err(e) = q.set_routes(routes) {
                failed = failed.and(Err(e));
            }
        }
        failed
    }

    /// The namespace of its queues in the broker: `""` for `/`, else its name.
    pub(crate) fn ns(&self) -> &str {
        if self.name == "/" { "" } else { &self.name }
    }

    /// A key of this vhost as a key of the `/` mapping (what routing keys and reply-to
    /// queue names are read from).
    pub(crate) fn strip<'a>(&self, key: &'a str) -> &'a str {
        if self.prefix.is_empty() {
            return key;
        }
        key.strip_prefix(self.prefix.as_str()).unwrap_or(key)
    }

    /// A key of another vhost (so not this one's, when this one is `/`)?
    pub(crate) fn foreign(&self, key: &str) -> bool {
        if self.prefix.is_empty() {
            key.starts_with(VHOST_KEYS)
        } else {
            !key.starts_with(self.prefix.as_str())
        }
    }
}

/// The cost of all the routes of one vhost's queues, at most (see [`route_cost`]).
pub(crate) const MAX_VHOST_ROUTE_COST: usize = 65_536;

/// A connection's maps looked up on every message, keyed by small numbers (channel numbers,
/// subscription ids): foldhash, about a tenth of SipHash's cost per lookup, randomly seeded.
pub(crate) type FastMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;

/// Where the keys of the vhosts other than `/` are.
pub(crate) const VHOST_KEYS: &str = "amqp-vhost/";

/// The AMQP front-end's shared state.
pub struct Amqp {
    pub(crate) broker: Broker,
    pub(crate) cfg: AmqpSection,
    pub(crate) auth: Arc<dyn Authenticator>,
    pub(crate) handshake_timeout: std::time::Duration,
    /// Largest connection.start-ok accepted before login (`limits.max_preauth_bytes`).
    pub(crate) max_preauth: usize,
    /// The virtual hosts (`[amqp] vhosts`).
    pub(crate) vhosts: HashMap<String, Arc<VHost>>,
    /// Numbers connections (exclusive queues' owners) and server-named queues.
    next: AtomicU64,
}

impl std::fmt::Debug for Amqp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Amqp").finish_non_exhaustive()
    }
}

impl Amqp {
    /// The front-end for `broker` with `config`'s AMQP and auth settings.
    pub fn new(broker: Broker, config: &Config, auth: Arc<dyn Authenticator>) -> Arc<Amqp> {
        let vhosts = config
            .amqp
            .vhosts
            .iter()
            .map(|v| (v.clone(), Arc::new(VHost::new(v))))
            .collect();
        Arc::new(Amqp {
            broker,
            cfg: config.amqp.clone(),
            auth,
            handshake_timeout: std::time::Duration::from_millis(config.limits.handshake_timeout_ms),
            max_preauth: (config.limits.max_preauth_bytes as usize).max(4096),
            vhosts,
            next: AtomicU64::new(1),
        })
    }

    /// The first virtual host of `[amqp] vhosts` (`/` by default).
    pub(crate) fn first_vhost(&self) -> Arc<VHost> {
        self.cfg
            .vhosts
            .first()
            .and_then(|v| self.vhosts.get(v))
            .cloned()
            .unwrap_or_else(|| Arc::new(VHost::new("/")))
    }

    pub(crate) fn next_id(&self) -> u64 {
        self.next.fetch_add(1, Ordering::Relaxed)
    }

    /// A new queue with its task and (with `x-dead-letter-exchange`) its dead-letter task.
    /// It has no binding yet, not even the default exchange's.
    pub(crate) fn make_queue(
        self: &Arc<Self>,
        vhost: &Arc<VHost>,
        name: &str,
        made: Made<'_>,
        args: queue::QueueArgs,
        store: Option<(Arc<QStore>, u64)>,
    ) -> Arc<Queue> {
        let max_bytes = self.cfg.queue_max_bytes as usize;
        let mut cfg = args.config(made.durable, made.auto_delete, made.owner, max_bytes);
        cfg.args = bytes::Bytes::from(defs::table_bytes(made.arguments));
        let id = hayate_broker::queue::QueueId {
            ns: Arc::from(vhost.ns()),
            name: Arc::from(name),
        };
        let kept = store
            .as_ref()
            .map(|(s, n)| (s.clone() as Arc<dyn hayate_broker::queue::QueueStore>, *n));
        let core = hayate_broker::queue::Queue::new(id, cfg, &self.broker.config().memory, kept);
        if let Some(dlx) = &args.dead_letter_exchange {
            let dl = queue::AmqpDeadLetters {
                vhost: vhost.clone(),
                exchange: dlx.clone(),
                routing_key: args.dead_letter_routing_key.clone(),
            };
            core.set_dead_letterer(&self.broker, Arc::new(dl));
        }
        let q = Queue::new(
            vhost.clone(),
            name.to_string(),
            args,
            core,
            self.broker.clone(),
            store,
        );
        q.attach();
        q
    }

    /// Queue `name` of `vhost` as the broker has it without AMQP knowing it: an implicit
    /// queue (made by a first use from STOMP's `/queue/<name>` or a native CONSUME, in the
    /// namespace of vhost `/`). It enters the vhost's registry as it is (its settings,
    /// messages, consumers and binding to its key kept; no AMQP argument applies), so it
    /// is declared, consumed, bound and deleted as any; `None` when there is none.
    pub(crate) fn adopt_implicit(&self, vhost: &Arc<VHost>, name: &str) -> Option<Arc<Queue>> {
        let id = hayate_broker::queue::QueueId {
            ns: Arc::from(vhost.ns()),
            name: Arc::from(name),
        };
        let core = self.broker.queue(&id).filter(|q| !q.config().declared)?;
        let mut reg = lock(&vhost.registry);
        if let Some(q) = reg.queues.get(name).filter(|q| !q.is_deleted()) {
            return Some(q.clone());
        }
        let q = Queue::new(
            vhost.clone(),
            name.to_string(),
            queue::QueueArgs::default(),
            core,
            self.broker.clone(),
            None,
        );
        q.attach();
        reg.queues.insert(name.to_string(), q.clone());
        Some(q)
    }

    /// Opens every virtual host's queue store (`hayate_broker::queue::store`, through the
    /// broker's storage root; a vhost's files of an earlier release converted first,
    /// `legacy`) and puts back what they kept: durable exchanges, durable queues with their
    /// bindings, and the persistent messages they held (marked redelivered). Without a data
    /// directory nothing is kept.
    pub fn open_durable(self: &Arc<Self>) -> Result<(), String> {
        let Some(root) = self.broker.config().data.clone() else {
            return Ok(());
        };
        let fsync: hayate_log::FsyncPolicy = self
            .cfg
            .fsync
            .parse()
            .map_err(|e| format!("amqp.fsync: {e}"))?;
        let meta = self.broker.meta().map_err(|e| e.to_string())?;
        let max = usize::try_from(self.cfg.max_message_size).unwrap_or(usize::MAX);
        for vhost in self.vhosts.values() {
            if vhost.store.get().is_some() {
                continue;
            }
            if let Some(data) = root.path() {
                legacy::migrate(data, &meta, &vhost.name, vhost.ns())?;
            }
            let (st, rec) = QStore::open(&*root, meta.clone(), vhost.ns(), fsync, max)?;
            let (queues, messages) = self.restore(vhost, &st, rec);
            st.start();
            let _ = vhost.store.set(st);
            tracing::info!(vhost = %vhost.name, queues, messages, "amqp: durable queues opened");
        }
        Ok(())
    }

    /// Puts what `vhost`'s store kept back; the queues and messages put back.
    fn restore(
        self: &Arc<Self>,
        vhost: &Arc<VHost>,
        st: &Arc<QStore>,
        rec: Recovered,
    ) -> (usize, usize) {
        let (mut queues, mut messages) = (0, 0);
        {
            let mut reg = lock(&vhost.registry);
            let mut edges = Vec::new();
            for (key, value) in &rec.defs {
                if let Some(name) = defs::exchange_of_key(key) {
                    let x = defs::ExchangeDef::decode(value);
                    let Some((x, kind)) = x
                        .ok()
                        .and_then(|x| Some((x.clone(), Kind::parse(&x.kind)?)))
                    else {
                        tracing::warn!(vhost = %vhost.name, "amqp store: exchange {name:?} unreadable: left out");
                        continue;
                    };
                    reg.exchanges.entry(name).or_insert(Exchange {
                        kind,
                        durable: true,
                        auto_delete: x.auto_delete,
                        internal: x.internal,
                        builtin: false,
                    });
                } else if key.starts_with("edge/") {
                    match defs::EdgeDef::decode(value) {
                        Ok(e) => edges.push(e),
                        Err(e) => {
                            tracing::warn!(vhost = %vhost.name, "amqp store: {key}: {e}: left out")
                        }
                    }
                }
            }
            for e in edges {
                if reg.exchanges.contains_key(&e.source)
                    && reg.exchanges.contains_key(&e.destination)
                {
                    reg.edges.push(Edge {
                        source: e.source,
                        destination: e.destination,
                        key: e.key,
                        args: e.args,
                    });
                } else {
                    tracing::warn!(vhost = %vhost.name, "amqp store: exchange binding {:?} -> {:?} left out", e.source, e.destination);
                }
            }
        }
        vhost.exchanges_changed.fetch_add(1, Ordering::AcqRel);
        for rq in rec.queues {
            messages += rq.items.len();
            if self.restore_queue(vhost, st, rq) {
                queues += 1;
            }
        }
        let _topology = lock(&vhost.topology);
        let all: Vec<_> = lock(&vhost.registry).queues.values().cloned().collect();
        for q in all {
            if let Err(e) = vhost.reroute(std::slice::from_ref(&q)) {
                tracing::warn!(vhost = %vhost.name, "amqp store: queue {:?}: {e}", q.name);
            }
        }
        (queues, messages)
    }

    /// Puts durable queue `rq` back with its messages and bindings; false if left out.
    fn restore_queue(
        self: &Arc<Self>,
        vhost: &Arc<VHost>,
        st: &Arc<QStore>,
        rq: RecoveredQueue,
    ) -> bool {
        let name = rq.name;
        let def = defs::QueueDef::decode(&rq.def);
        let args = def
            .as_ref()
            .map_err(Clone::clone)
            .and_then(|d| queue::QueueArgs::parse(&d.args));
        let (def, args, key) = match (def, args, vhost.key(names::queue_key(&name))) {
            (Ok(d), Ok(a), Some(k)) => (d, a, k),
            (Err(e), _, _) | (_, Err(e), _) => {
                tracing::warn!(vhost = %vhost.name, "amqp store: queue {name:?}: bad definition ({e}): left out");
                return false;
            }
            (_, _, None) => {
                // Refused when declared since keys refuse control characters; one
                // saved by an older build costs that queue, not the vhost's others.
                tracing::warn!(vhost = %vhost.name, "amqp store: queue {name:?}: its name cannot be a key: left out");
                return false;
            }
        };
        let Ok(expr) = KeyExpr::new(key.as_str()) else {
            return false;
        };
        let made = Made {
            durable: true,
            auto_delete: def.auto_delete,
            owner: None,
            arguments: &def.args,
        };
        let q = self.make_queue(vhost, &name, made, args, Some((st.clone(), rq.id)));
        q.restore(rq.items);
        if hayate_front::auth::inbox_guard(&expr).is_err() {
            tracing::warn!(vhost = %vhost.name, "amqp store: queue {name:?} is a reply inbox's key: left unbound");
        } else if let Err(e) = q.bind("", Kind::Direct, &name, FieldTable::default(), expr, None) {
            tracing::warn!(vhost = %vhost.name, "amqp store: queue {name:?}: {e}");
        }
        for b in def.bindings {
            let kind = lock(&vhost.registry)
                .exchanges
                .get(&b.exchange)
                .map(|x| x.kind);
            let Some(kind) = kind else {
                tracing::warn!(vhost = %vhost.name, "amqp store: queue {name:?}: binding to {:?} left out", b.exchange);
                continue;
            };
            let Some(expr) = vhost.expr(names::binding_expr(&b.exchange, kind, &b.key)) else {
                continue;
            };
            // Checked when made; what it covers of reply inboxes stays out.
            let Ok(guard) = hayate_front::auth::inbox_guard(&expr) else {
                continue;
            };
            if let Err(e) = q.bind(&b.exchange, kind, &b.key, b.args, expr, guard) {
                tracing::warn!(vhost = %vhost.name, "amqp store: queue {name:?}: {e}");
            }
        }
        q.listed();
        lock(&vhost.registry).queues.insert(name, q);
        true
    }
}

/// How a queue is made ([`Amqp::make_queue`]).
pub(crate) struct Made<'a> {
    pub(crate) durable: bool,
    pub(crate) auto_delete: bool,
    /// Exclusive to this connection.
    pub(crate) owner: Option<u64>,
    /// queue.declare's arguments as given (kept with a durable queue).
    pub(crate) arguments: &'a FieldTable,
}

/// Does a message match a headers-exchange binding's arguments (`x-match` `all`, the
/// default, or `any`; the other `x-` arguments are not compared)? Values compare as text.
pub(crate) fn headers_match(args: &FieldTable, msg: &Message) -> bool {
    let any = args
        .get("x-match")
        .and_then(FieldValue::as_str)
        .is_some_and(|m| m.starts_with("any"));
    let header = |name: &str| {
        msg.headers
            .iter()
            .flatten()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
    };
    let mut wanted = args
        .0
        .iter()
        .filter(|(k, _)| !k.as_bytes().starts_with(b"x-"))
        .peekable();
    if wanted.peek().is_none() {
        return true;
    }
    let mut results = wanted.map(|(k, v)| {
        let Some(name) = k.as_str() else { return false };
        match (header(name), v) {
            (None, _) => false,
            (Some(_), FieldValue::Void) => true,
            (Some(h), FieldValue::LongStr(want)) => h == *want,
            (Some(h), v) => v
                .as_i64()
                .map(|n| n.to_string())
                .or_else(|| v.as_bool().map(|b| b.to_string()))
                .is_some_and(|t| h == t.as_bytes()),
        }
    });
    if any {
        results.any(|r| r)
    } else {
        results.all(|r| r)
    }
}

#[cfg(test)]
mod tests {
    use super::{Edge, Exchange, Registry, queue::MAX_ROUTES};
    use crate::names::Kind;
    use hayate_amqp::{FieldTable, FieldValue};

    fn edge(s: &str, d: &str, key: &str) -> Edge {
        Edge {
            source: s.into(),
            destination: d.into(),
            key: key.into(),
            args: FieldTable::default(),
        }
    }

    fn registry(exchanges: &[(&str, Kind)], edges: Vec<Edge>) -> Registry {
        let mut reg = Registry {
            edges,
            ..Registry::default()
        };
        for (n, kind) in exchanges {
            reg.exchanges.insert(
                n.to_string(),
                Exchange {
                    kind: *kind,
                    durable: false,
                    auto_delete: false,
                    internal: false,
                    builtin: false,
                },
            );
        }
        reg
    }

    #[test]
    fn chains_end_at_cycles_and_at_the_limit() {
        // a -> b -> c, c -> a (a cycle), c -> c (a loop), d -> c.
        let f = Kind::Fanout;
        let reg = registry(
            &[("a", f), ("b", f), ("c", f), ("d", f)],
            vec![
                edge("a", "b", ""),
                edge("b", "c", ""),
                edge("c", "a", ""),
                edge("c", "c", ""),
                edge("d", "c", ""),
            ],
        );
        let t = reg.topology();
        let mut chains: Vec<Vec<&str>> = t
            .chains_into("c")
            .unwrap_or_else(|| panic!("few chains"))
            .iter()
            .map(|ch| ch.iter().map(|&i| t.edges[i].source.as_str()).collect())
            .collect();
        chains.sort();
        // Sources first; no exchange twice on a chain (c's loop and the way back to c are
        // left out).
        assert_eq!(chains, vec![vec!["a", "b"], vec!["b"], vec!["d"]]);
        assert_eq!(reg.downstream("a").len(), 3);
        // Ten exchanges all bound to each other: far more than MAX_ROUTES simple paths.
        let names: Vec<String> = (0..10).map(|i| format!("x{i}")).collect();
        let kinds: Vec<(&str, Kind)> = names.iter().map(|n| (n.as_str(), f)).collect();
        let edges = names
            .iter()
            .flat_map(|a| {
                names
                    .iter()
                    .filter(move |b| *b != a)
                    .map(move |b| edge(a, b, ""))
            })
            .collect();
        let t = registry(&kinds, edges).topology();
        let started = std::time::Instant::now();
        assert!(
            t.chains_into("x0").is_none(),
            "more than {MAX_ROUTES} chains"
        );
        assert!(started.elapsed() < std::time::Duration::from_secs(1));
    }

    #[test]
    fn bindings_that_route_alike_are_one_and_routes_share_their_subscription() {
        // 500 bindings fanout s -> topic d that differ only in what a fanout ignores (key,
        // arguments): one effective binding, one chain.
        let mut edges: Vec<Edge> = (0..500)
            .map(|i| {
                let mut e = edge("s", "d", &format!("k{i}"));
                e.args.insert("n", FieldValue::I32(i));
                e
            })
            .collect();
        // And two ways from topic t to d: directly and through s.
        edges.push(edge("t", "d", "a.#"));
        edges.push(edge("t", "s", "a.#"));
        let reg = registry(
            &[("s", Kind::Fanout), ("d", Kind::Topic), ("t", Kind::Topic)],
            edges,
        );
        let t = reg.topology();
        assert_eq!(t.edges.len(), 3);
        let chains = t.chains_into("d").unwrap_or_else(|| panic!("few chains"));
        assert_eq!(chains.len(), 3, "s->d, t->d, t->s->d");
    }
}
