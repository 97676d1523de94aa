//! The broker, its sessions and the publish path.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use bytes::Bytes;
use hayate_core::{Congestion, Key, KeyExpr, Qos, Stall};

use crate::Batch;
use crate::index::{SubKey, SubscriptionIndex};
use crate::outbox::{Delivery, Encoder, Offer, Outbox};

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
}

impl Default for BrokerConfig {
    fn default() -> Self {
        BrokerConfig {
            outbox_bytes: 8 * 1024 * 1024,
            max_block: Some(Duration::from_secs(2)),
            max_unacked: 1024,
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
}

#[derive(Debug)]
struct SubEntry {
    outbox: Arc<Outbox>,
    group: Option<Arc<str>>,
    qos: Qos,
}

#[derive(Debug, Default)]
struct Registry {
    index: SubscriptionIndex,
    subs: HashMap<SubKey, SubEntry>,
    /// Round-robin cursor and member count per queue group (id: name, NUL, expression).
    groups: HashMap<Arc<str>, (Arc<AtomicUsize>, usize)>,
    /// Declared queues: groups whose messages wait while they have no member.
    queues: HashMap<Arc<str>, (KeyExpr, Arc<Backlog>)>,
}

/// Messages waiting for a declared queue's first member, oldest first, at most `limit`.
#[derive(Debug)]
pub struct Backlog {
    /// The queue group's registry id.
    id: Arc<str>,
    q: std::sync::Mutex<BacklogState>,
    limit: usize,
    dropped: AtomicU64,
}

#[derive(Debug, Default)]
struct BacklogState {
    q: VecDeque<hayate_core::Message>,
    /// The group has members (set and cleared under the registry write lock, with the
    /// drain): a publisher whose route still says "no member" must not park here.
    served: bool,
}

impl Backlog {
    fn lock(&self) -> std::sync::MutexGuard<'_, BacklogState> {
        self.q
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Parks `batch` for the queue's first member; false (nothing parked) when the queue has
    /// members now: the caller's route is older than them and it must deliver through a
    /// fresh one.
    fn park(&self, batch: Batch<'_>) -> bool {
        let mut st = self.lock();
        if st.served {
            return false;
        }
        self.push_locked(&mut st.q, batch);
        true
    }

    /// Puts `batch` in the backlog whatever the members (messages given back).
    fn push(&self, batch: Batch<'_>) {
        let mut st = self.lock();
        self.push_locked(&mut st.q, batch);
    }

    fn push_locked(&self, q: &mut VecDeque<hayate_core::Message>, batch: Batch<'_>) {
        for i in 0..batch.len() {
            if q.len() >= self.limit {
                self.dropped
                    .fetch_add((batch.len() - i) as u64, Ordering::Relaxed);
                return;
            }
            q.push_back(batch.message(i));
        }
    }

    /// The first member joined: takes what waits and marks the queue served.
    fn open(&self) -> VecDeque<hayate_core::Message> {
        let mut st = self.lock();
        st.served = true;
        std::mem::take(&mut st.q)
    }

    /// The last member left.
    fn close(&self) {
        self.lock().served = false;
    }

    /// Messages waiting.
    pub fn len(&self) -> usize {
        self.lock().q.len()
    }

    /// True if no message waits.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Messages dropped because the backlog was full.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }
}

/// The registry id of queue group `name` on `expr`.
fn group_id(name: &str, expr: &KeyExpr) -> String {
    format!("{name}\u{0}{}", expr.as_str())
}

#[derive(Debug)]
struct Shared {
    registry: RwLock<Registry>,
    /// Bumped (under the registry write lock) on every subscription change.
    generation: AtomicU64,
    next_session: AtomicU64,
    config: BrokerConfig,
    stats: BrokerStats,
}

/// The engine. Cheap to clone: a handle to shared state.
#[derive(Debug, Clone)]
pub struct Broker {
    shared: Arc<Shared>,
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
}

#[derive(Debug, Clone)]
struct Target {
    outbox: Arc<Outbox>,
    session: u64,
    sid: u32,
    congestion: Congestion,
    stall: Stall,
    no_echo: bool,
}

#[derive(Debug)]
struct GroupRoute {
    id: Arc<str>,
    rr: Arc<AtomicUsize>,
    members: Vec<Target>,
}

#[derive(Debug)]
struct Route {
    fanout: Vec<Target>,
    groups: Vec<GroupRoute>,
    /// Declared queues matching the key that have no member now.
    backlogs: Vec<Arc<Backlog>>,
}

impl Broker {
    /// A broker with `config`.
    pub fn new(config: BrokerConfig) -> Broker {
        Broker {
            shared: Arc::new(Shared {
                registry: RwLock::new(Registry::default()),
                generation: AtomicU64::new(1),
                next_session: AtomicU64::new(1),
                config,
                stats: BrokerStats::default(),
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

    /// Number of live subscriptions.
    pub fn subscription_count(&self) -> usize {
        self.read().subs.len()
    }

    /// Declares queue group `name` on `expr`: while it has no member, matching messages
    /// wait (at most `limit`) and go to the first member that subscribes. Idempotent;
    /// returns the queue's backlog.
    pub fn declare_queue(&self, name: &str, expr: &KeyExpr, limit: usize) -> Arc<Backlog> {
        let id = group_id(name, expr);
        let mut reg = self.write();
        if let Some((_, b)) = reg.queues.get(id.as_str()) {
            return b.clone();
        }
        let id: Arc<str> = Arc::from(id);
        let b = Arc::new(Backlog {
            q: std::sync::Mutex::new(BacklogState {
                q: VecDeque::new(),
                served: reg.groups.contains_key(&id),
            }),
            id: id.clone(),
            limit,
            dropped: AtomicU64::new(0),
        });
        reg.queues.insert(id, (expr.clone(), b.clone()));
        self.bump();
        b
    }

    /// Opens a session whose deliveries are encoded by `encoder`.
    pub fn open_session(&self, encoder: Box<dyn Encoder>) -> Session {
        let id = self.shared.next_session.fetch_add(1, Ordering::Relaxed);
        self.shared
            .stats
            .sessions_opened
            .fetch_add(1, Ordering::Relaxed);
        Session {
            broker: self.clone(),
            id,
            outbox: Arc::new(Outbox::with_window(
                self.shared.config.outbox_bytes,
                encoder,
                self.shared.config.max_unacked,
            )),
            subs: HashMap::new(),
            cache: HashMap::default(),
            cache_generation: 0,
            touched: Vec::new(),
            scratch: VecDeque::new(),
        }
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Registry> {
        self.shared
            .registry
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, Registry> {
        self.shared
            .registry
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn bump(&self) {
        self.shared.generation.fetch_add(1, Ordering::Release);
    }

    fn route(&self, key: &Key) -> (u64, Arc<Route>) {
        let reg = self.read();
        let generation = self.shared.generation.load(Ordering::Acquire);
        let mut route = Route {
            fanout: Vec::new(),
            groups: Vec::new(),
            backlogs: Vec::new(),
        };
        let mut by_group: Vec<(Arc<str>, Vec<Target>)> = Vec::new();
        for sk in reg.index.matches(key) {
            let Some(e) = reg.subs.get(&sk) else { continue };
            let t = Target {
                outbox: e.outbox.clone(),
                session: sk.0,
                sid: sk.1,
                congestion: e.qos.effective_congestion(),
                stall: e.qos.effective_stall(),
                no_echo: e.qos.no_echo,
            };
            match &e.group {
                None => route.fanout.push(t),
                Some(g) => match by_group.iter_mut().find(|(n, _)| n == g) {
                    Some((_, v)) => v.push(t),
                    None => by_group.push((g.clone(), vec![t])),
                },
            }
        }
        for (id, expr, backlog) in reg.queues.iter().map(|(id, (e, b))| (id, e, b)) {
            if expr.matches(key) && !by_group.iter().any(|(g, _)| g == id) {
                route.backlogs.push(backlog.clone());
            }
        }
        for (g, members) in by_group {
            if let Some((rr, _)) = reg.groups.get(&g) {
                route.groups.push(GroupRoute {
                    id: g,
                    rr: rr.clone(),
                    members,
                });
            }
        }
        (generation, Arc::new(route))
    }
}

/// One client's presence in the broker: its subscriptions, its outbox and its route cache.
///
/// Owned by the connection's reader task. Dropping it removes its subscriptions and closes
/// its outbox.
#[derive(Debug)]
pub struct Session {
    broker: Broker,
    id: u64,
    outbox: Arc<Outbox>,
    subs: HashMap<u32, (KeyExpr, Option<Arc<str>>)>,
    cache: HashMap<Bytes, Arc<Route>, foldhash::fast::RandomState>,
    cache_generation: u64,
    /// Outboxes that received data since the last [`Session::flush`].
    touched: Vec<Arc<Outbox>>,
    /// Reused by inline flushes.
    scratch: VecDeque<Bytes>,
}

const CACHE_LIMIT: usize = 4096;

impl Session {
    /// The session id (unique for the broker's life).
    pub fn id(&self) -> u64 {
        self.id
    }

    /// The session's outbox, for its writer and for control output.
    pub fn outbox(&self) -> &Arc<Outbox> {
        &self.outbox
    }

    /// The broker this session belongs to.
    pub fn broker(&self) -> &Broker {
        &self.broker
    }

    /// Adds subscription `sid` on `expr`, fan-out or in queue `group`.
    pub fn subscribe(
        &mut self,
        sid: u32,
        expr: KeyExpr,
        group: Option<&str>,
        qos: Qos,
    ) -> Result<(), SubscribeError> {
        if self.subs.contains_key(&sid) {
            return Err(SubscribeError::DuplicateId(sid));
        }
        let mut reg = self.broker.write();
        // A queue group is a name *and* an expression (as NATS queue groups are per subject
        // and MQTT shared subscriptions per share name and filter): `g` on `a/**` and `g`
        // on `a/b` are two groups, and a message matching both goes to a member of each.
        let group: Option<Arc<str>> = group.map(|g| {
            let id = group_id(g, &expr);
            match reg.groups.get_key_value(id.as_str()) {
                Some((k, _)) => k.clone(),
                None => Arc::from(id),
            }
        });
        if qos.ack {
            self.outbox.set_acked(sid, true);
        }
        if let Some(g) = &group {
            reg.groups
                .entry(g.clone())
                .or_insert_with(|| (Arc::new(AtomicUsize::new(0)), 0))
                .1 += 1;
        }
        reg.index.insert(&expr, (self.id, sid));
        reg.subs.insert(
            (self.id, sid),
            SubEntry {
                outbox: self.outbox.clone(),
                group: group.clone(),
                qos,
            },
        );
        // A declared queue's waiting messages go to its first member, before anything
        // routed after this change (still under the write lock).
        let mut drained = false;
        if let Some(g) = &group
            && let Some((_, backlog)) = reg.queues.get(g)
        {
            for m in backlog.open() {
                self.outbox.force(sid, 0, Batch::One(&m));
                drained = true;
            }
        }
        self.broker.bump();
        drop(reg);
        if drained {
            self.touch_own();
        }
        self.subs.insert(sid, (expr, group));
        Ok(())
    }

    /// Gives `msg` back to queue group `group` on `expr`: it goes to another member than
    /// this session (round-robin), to this session's own membership when it is the only
    /// member and `may_return` (a NACK), or else to the queue's backlog (a message left
    /// unacknowledged by a consumer that is going away). Returns whether it was placed.
    pub async fn requeue(
        &mut self,
        group: &str,
        expr: &KeyExpr,
        msg: &hayate_core::Message,
        may_return: bool,
    ) -> bool {
        self.requeue_to(&group_id(group, expr), msg, may_return)
            .await
    }

    async fn requeue_to(&mut self, id: &str, msg: &hayate_core::Message, may_return: bool) -> bool {
        let route = self.lookup(&msg.key);
        if let Some(g) = route.groups.iter().find(|g| &*g.id == id) {
            let others: Vec<Target> = g
                .members
                .iter()
                .filter(|t| t.session != self.id)
                .cloned()
                .collect();
            let members = if others.is_empty() && may_return {
                g.members.clone()
            } else {
                others
            };
            if !members.is_empty()
                && self
                    .deliver_group(&g.id, &g.rr, &members, Batch::One(msg), false)
                    .await
                    > 0
            {
                return true;
            }
        }
        let backlog = self.broker.read().queues.get(id).map(|(_, b)| b.clone());
        match backlog {
            Some(b) => {
                b.push(Batch::One(msg));
                true
            }
            None => false,
        }
    }

    /// Gives back delivery `d` of an acknowledged subscription of this session (a NACK when
    /// `nack`, or unacknowledged when the subscription or the connection ends): a queue
    /// group's message goes to another member (or back to this one on a NACK when it is the
    /// only member, or to the queue's backlog); a fan-out message is delivered again to the
    /// same subscription on a NACK, and dropped when the subscriber goes away. Returns
    /// whether it was placed (counted in `BrokerStats::unplaced` when not).
    pub async fn give_back(&mut self, mut d: Delivery, nack: bool) -> bool {
        d.msg.attrs.redelivered = true;
        let group = self.subs.get(&d.sid).and_then(|(_, g)| g.clone());
        let placed = match group {
            Some(g) => self.requeue_to(&g, &d.msg, nack).await,
            None if nack && self.subs.contains_key(&d.sid) => self.outbox.redeliver(d),
            None => false,
        };
        if placed {
            self.touch_own();
        } else {
            self.broker
                .shared
                .stats
                .unplaced
                .fetch_add(1, Ordering::Relaxed);
        }
        placed
    }

    /// Gives back every unacknowledged delivery of subscription `sid` (or of all), as when
    /// the subscriber goes away; call before [`Session::unsubscribe`] and before dropping
    /// the session.
    pub async fn release_unacked(&mut self, sid: Option<u32>) {
        for d in self.outbox.take_unacked(sid) {
            self.give_back(d, false).await;
        }
    }

    /// Removes subscription `sid`; returns whether it existed.
    pub fn unsubscribe(&mut self, sid: u32) -> bool {
        let Some((expr, group)) = self.subs.remove(&sid) else {
            return false;
        };
        self.outbox.set_acked(sid, false);
        let mut reg = self.broker.write();
        remove_sub(&mut reg, self.id, sid, &expr, group.as_ref());
        self.broker.bump();
        true
    }

    /// Delivers `batch` to every matching subscription.
    ///
    /// Awaits only when a `block` subscriber's outbox is full; drops (and counts) for `drop`
    /// subscribers. Returns the number of deliveries made (messages × subscribers).
    pub async fn publish(&mut self, batch: Batch<'_>) -> usize {
        let route = self.lookup(batch.key());
        let mut delivered = 0;
        for t in &route.fanout {
            delivered += self.deliver(t, batch).await.0;
        }
        for g in &route.groups {
            delivered += self
                .deliver_group(&g.id, &g.rr, &g.members, batch, true)
                .await;
        }
        for b in &route.backlogs {
            if b.park(batch) {
                continue;
            }
            // The queue got its first member after this route was made: deliver through a
            // fresh route (the subscription bumped the generation), or park if it has none
            // again by now.
            let fresh = self.lookup(batch.key());
            match fresh.groups.iter().find(|g| g.id == b.id) {
                Some(g) => {
                    delivered += self
                        .deliver_group(&g.id, &g.rr, &g.members, batch, true)
                        .await;
                }
                None => b.push(batch),
            }
        }
        delivered
    }

    fn touch(&mut self, outbox: &Arc<Outbox>) {
        if !self.touched.iter().any(|o| Arc::ptr_eq(o, outbox)) {
            self.touched.push(outbox.clone());
        }
    }

    /// Marks this session's own outbox as holding new output (control frames).
    pub fn touch_own(&mut self) {
        let own = self.outbox.clone();
        self.touch(&own);
    }

    /// Writes what this session queued since the last call straight to the target sockets
    /// where they can take it now (see [`Outbox::try_flush`]); call it after handling every
    /// frame of a read, before reading again. Saves a task wake-up per target in the common
    /// case, as nats-server's flush of pending clients at the end of a read does.
    pub fn flush(&mut self) {
        for o in self.touched.drain(..) {
            o.try_flush(&mut self.scratch);
        }
    }

    fn lookup(&mut self, key: &Key) -> Arc<Route> {
        let g = self.broker.shared.generation.load(Ordering::Acquire);
        if g != self.cache_generation || self.cache.len() >= CACHE_LIMIT {
            self.cache.clear();
            self.cache_generation = g;
        }
        if let Some(r) = self.cache.get(key.as_shared()) {
            return r.clone();
        }
        let (generation, route) = self.broker.route(key);
        if generation == self.cache_generation {
            self.cache.insert(key.as_shared().clone(), route.clone());
        }
        route
    }

    async fn deliver_group(
        &mut self,
        id: &str,
        rr: &AtomicUsize,
        members: &[Target],
        batch: Batch<'_>,
        park: bool,
    ) -> usize {
        // Round-robin per message: consecutive items of a batch go to consecutive members.
        let n = members.len();
        let mut delivered = 0;
        let mut i = 0;
        while i < batch.len() {
            let start = rr.fetch_add(1, Ordering::Relaxed);
            // The next member whose session is still open takes it (one outbox lock per
            // member tried: the offer itself reports a closed session). Members with a
            // connection come first; a detached one (an offline MQTT session) only when no
            // member is connected.
            let mut done = false;
            let any_attached = members.iter().any(|t| t.outbox.is_attached());
            for k in 0..n {
                let t = &members[(start + k) % n];
                if any_attached && !t.outbox.is_attached() {
                    continue;
                }
                let (n_delivered, closed) = self.deliver(t, batch_item(batch, i)).await;
                delivered += n_delivered;
                if !closed {
                    done = true;
                    break;
                }
            }
            if !done && !park {
                break;
            }
            if !done {
                // Every member went away while this was routed (their sessions closed): what
                // is left waits in the group's declared queue, or is counted as unplaced.
                let rest = batch.slice(i, batch.len());
                let backlog = self.broker.read().queues.get(id).map(|(_, b)| b.clone());
                match backlog {
                    Some(b) => b.push(rest),
                    None => {
                        self.broker
                            .shared
                            .stats
                            .unplaced
                            .fetch_add(rest.len() as u64, Ordering::Relaxed);
                    }
                }
                break;
            }
            i += 1;
        }
        delivered
    }

    /// Offers `batch` to one target; returns the number delivered and whether the target's
    /// session turned out to be closed (nothing more was delivered to it).
    async fn deliver(&mut self, t: &Target, batch: Batch<'_>) -> (usize, bool) {
        let own = t.session == self.id;
        if own && t.no_echo {
            // Skipped like a closed member, so a queue group tries its next member.
            return (0, true);
        }
        let mut rest = batch;
        let mut delivered = 0;
        // Registered for a space notification only once an offer has failed (the common
        // path, where everything fits, neither registers nor makes the writer notify).
        let mut space = None;
        let mut deadline = None;
        loop {
            let took = match t.outbox.offer(t.sid, self.id, rest, own) {
                Offer::Took(n) => n,
                Offer::Closed => return (delivered, true),
            };
            delivered += took;
            if took > 0 {
                self.touch(&t.outbox);
            }
            if took == rest.len() {
                return (delivered, false);
            }
            // The outbox is full: its writer must run (offer woke it). Send what this
            // session queued elsewhere before possibly waiting.
            self.flush();
            // An offline session's outbox (nobody writes it) and a stalled `Stall::Drop`
            // subscriber drop at once instead of blocking.
            let drop_now = match t.congestion {
                Congestion::Drop => true,
                Congestion::Block => {
                    !t.outbox.is_attached() || (t.stall == Stall::Drop && t.outbox.is_stalled())
                }
            };
            if drop_now {
                self.count_dropped(t, (rest.len() - took) as u64);
                return (delivered, false);
            }
            rest = rest.slice(took, rest.len());
            let Some(s) = space.take() else {
                // Register, then offer again: room made after this offer failed but before
                // registering would otherwise be missed.
                space = Some(t.outbox.wait_space());
                continue;
            };
            // Registered before the offer that just failed: wait, at most `max_block` in
            // all for this delivery.
            let Some(max) = self.broker.shared.config.max_block else {
                s.await;
                continue;
            };
            let until = *deadline.get_or_insert_with(|| tokio::time::Instant::now() + max);
            if tokio::time::timeout_at(until, s).await.is_ok() {
                continue;
            }
            self.stalled(t, max, rest.len() as u64);
            if t.stall == Stall::Drop {
                return (delivered, false);
            }
            // Cut off: the next offer is accepted (and discarded, or held by the tracker for
            // giving back) without waiting.
        }
    }

    fn count_dropped(&self, t: &Target, lost: u64) {
        t.outbox.count_lost(t.sid, lost);
        self.broker
            .shared
            .stats
            .dropped
            .fetch_add(lost, Ordering::Relaxed);
    }

    /// A publisher waited `max` for room in `t`'s outbox: apply its stall policy.
    fn stalled(&self, t: &Target, max: Duration, waiting: u64) {
        let stats = &self.broker.shared.stats;
        match t.stall {
            Stall::Drop => {
                tracing::warn!(
                    session = t.session,
                    sid = t.sid,
                    max_block_ms = max.as_millis() as u64,
                    "slow consumer: stalled past max_block; dropping its messages until it catches up"
                );
                stats.stalls.fetch_add(1, Ordering::Relaxed);
                t.outbox.set_stalled();
                self.count_dropped(t, waiting);
            }
            Stall::Disconnect => {
                // Counted and logged once, by whichever publisher cut it.
                if t.outbox.cut() {
                    tracing::warn!(
                        session = t.session,
                        sid = t.sid,
                        max_block_ms = max.as_millis() as u64,
                        "slow consumer: stalled past max_block; disconnecting it"
                    );
                    stats.slow_consumers.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
    }
}

fn batch_item(batch: Batch<'_>, i: usize) -> Batch<'_> {
    batch.slice(i, i + 1)
}

fn remove_sub(
    reg: &mut Registry,
    session: u64,
    sid: u32,
    expr: &KeyExpr,
    group: Option<&Arc<str>>,
) {
    reg.index.remove(expr, (session, sid));
    reg.subs.remove(&(session, sid));
    if let Some(g) = group
        && let Some(e) = reg.groups.get_mut(g)
    {
        e.1 -= 1;
        if e.1 == 0 {
            reg.groups.remove(g);
            if let Some((_, b)) = reg.queues.get(g) {
                b.close();
            }
        }
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        // Deliveries this session made since its last flush still have to leave.
        self.flush();
        self.outbox.close();
        if self.subs.is_empty() {
            return;
        }
        let mut reg = self.broker.write();
        for (sid, (expr, group)) in self.subs.drain() {
            remove_sub(&mut reg, self.id, sid, &expr, group.as_ref());
        }
        self.broker.bump();
    }
}
