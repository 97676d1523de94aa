//! A session: one client's presence in the broker (its subscriptions, its outbox, its route
//! cache) and the publish path (`deliver`: outbox offers, queue groups, bounded blocking).

mod deliver;

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::Ordering;

use bytes::Bytes;
use hayate_core::route::RouteCache;
use hayate_core::{Key, KeyExpr, Qos};

use crate::Batch;
use crate::broker::{Broker, SubEntry, SubscribeError, To, remove_sub};
use crate::outbox::{Delivery, Outbox};
use crate::queue::Routed;
use crate::route::{Route, Target};
use crate::stream::Stored;

/// What [`Session::publish_now`] could not do without waiting: a subscriber's outbox was
/// full, or the key's route has queue groups. Give it to
/// [`Session::publish_rest`] with the same batch.
#[must_use = "the publish is not finished: give it to Session::publish_rest"]
#[derive(Debug)]
pub struct PublishRest {
    route: Arc<Route>,
    /// The fanout target to go on with (`route.to.fanout.len()`: the queues), and how many
    /// of the batch's items it took already.
    at: usize,
    took: usize,
    /// Deliveries made so far.
    delivered: usize,
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
    cache: RouteCache<Route>,
    /// Outboxes that received data since the last [`Session::flush`].
    to_flush: Vec<Arc<Outbox>>,
    /// Reused by inline flushes.
    scratch: VecDeque<Bytes>,
    /// Reused for stored messages' metadata.
    meta: Vec<u8>,
    /// This session's reply inbox, `_inbox/<24 random hex digits>`: unguessable, and readable
    /// by this session alone when permissions are enforced.
    inbox: Arc<str>,
    /// Publishes until the next one offered to the broker's key sampler.
    sample_in: u32,
    /// When the publish being delivered reached the broker, if it is timed (the sampled
    /// one in [`crate::keys::EVERY`]; see [`crate::latency`]).
    probe: Option<std::time::Instant>,
    /// What the queues the publish under way reached did with it
    /// ([`Session::publish_routed`]).
    routed: Routed,
    /// A `publish_routed` is under way: `routed` gathers.
    routing: bool,
}

/// A fresh inbox name: 96 random bits (a fallback mixes the session id into a per-process
/// random hasher if the OS has no randomness to give).
fn new_inbox(id: u64) -> Arc<str> {
    let mut b = [0u8; 12];
    if getrandom::fill(&mut b).is_err() {
        use std::hash::BuildHasher;
        let h = foldhash::fast::RandomState::default().hash_one((id, std::time::Instant::now()));
        b[..8].copy_from_slice(&h.to_le_bytes());
        b[8..].copy_from_slice(&(id as u32).to_le_bytes());
    }
    let mut s = String::with_capacity(hayate_core::INBOX_PREFIX.len() + 25);
    s.push_str(hayate_core::INBOX_PREFIX);
    s.push('/');
    for x in b {
        s.push_str(&format!("{x:02x}"));
    }
    s.into()
}

const CACHE_LIMIT: usize = 4096;

impl Session {
    pub(crate) fn new(broker: Broker, id: u64, outbox: Arc<Outbox>) -> Session {
        Session {
            broker,
            id,
            outbox,
            subs: HashMap::new(),
            cache: RouteCache::new(CACHE_LIMIT),
            to_flush: Vec::new(),
            scratch: VecDeque::new(),
            meta: Vec::new(),
            inbox: new_inbox(id),
            sample_in: (id as u32) % crate::keys::EVERY,
            probe: None,
            routed: Routed::default(),
            routing: false,
        }
    }

    /// This session's reply inbox (`_inbox/<random>`): replies to its requests are
    /// published under it.
    pub fn inbox(&self) -> &str {
        &self.inbox
    }

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

    /// Whether subscription id `sid` is in use.
    pub fn has_subscription(&self, sid: u32) -> bool {
        self.subs.contains_key(&sid)
    }

    /// Adds subscription `sid` on `expr`, fan-out or in queue `group`.
    pub fn subscribe(
        &mut self,
        sid: u32,
        expr: KeyExpr,
        group: Option<&str>,
        qos: Qos,
    ) -> Result<(), SubscribeError> {
        self.subscribe_guarded(sid, expr, group, qos, None)
    }

    /// [`Session::subscribe`], with a guard that decides key by key what the subscription
    /// may receive (permissions; see [`crate::KeyGuard`]).
    pub fn subscribe_guarded(
        &mut self,
        sid: u32,
        expr: KeyExpr,
        group: Option<&str>,
        qos: Qos,
        guard: Option<Arc<dyn crate::KeyGuard>>,
    ) -> Result<(), SubscribeError> {
        if self.subs.contains_key(&sid) {
            return Err(SubscribeError::DuplicateId(sid));
        }
        let max = self.broker.shared.config.max_subscriptions;
        if max > 0 && self.subs.len() >= max {
            return Err(SubscribeError::TooMany(max));
        }
        // A queue group is a name *and* an expression (as NATS queue groups are per subject
        // and MQTT shared subscriptions per share name and filter): `g` on `a/**` and `g`
        // on `a/b` are two groups, and a message matching both goes to a member of each.
        let group = group.map(|g| group_id(g, &expr));
        let mut reg = self.broker.write();
        if qos.ack {
            self.outbox.set_acked(sid, true);
        }
        let group = reg.routes.insert(
            (self.id, sid),
            expr.clone(),
            group.as_deref(),
            SubEntry {
                to: To::Outbox(self.outbox.clone()),
                qos,
                guard: guard.clone(),
            },
        );
        self.broker.bump();
        drop(reg);
        self.subs.insert(sid, (expr, group));
        Ok(())
    }

    /// Gives `msg` back to queue group `group` on `expr`: it goes to another member than
    /// this session (round-robin), or to this session's own membership when it is the only
    /// member and `may_return` (a NACK). Returns whether it was placed.
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
        if let Some(g) = route.to.group(id) {
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
                    .deliver_group(&g.rr, &members, Batch::One(msg), false)
                    .await
                    > 0
            {
                return true;
            }
        }
        false
    }

    /// Gives back delivery `d` of an acknowledged subscription of this session (a NACK when
    /// `nack`, or unacknowledged when the subscription or the connection ends): a queue
    /// group's message goes to another member (or back to this one on a NACK when it is the
    /// only member); a fan-out message is delivered again to the
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
            self.mark_own_output();
        } else {
            self.broker
                .shared
                .stats
                .unplaced
                .fetch_add(1, Ordering::Relaxed);
        }
        placed
    }

    /// Gives back deliveries settled together (a cumulative NACK, taken with
    /// [`Outbox::settle_back`](crate::Outbox::settle_back)), given in their delivery order:
    /// as [`Session::give_back`] each, except that those going back to their own fan-out
    /// subscription are put back ahead of what waits all at once, in that order (one by
    /// one, each ahead of the one before, they came back the last first), and only then is
    /// the room in the window filled.
    pub async fn give_back_all(&mut self, ds: Vec<Delivery>, nack: bool) {
        let mut again = Vec::new();
        for d in ds {
            let fanout = nack && self.subs.get(&d.sid).is_some_and(|(_, g)| g.is_none());
            if fanout {
                again.push(d);
            } else {
                self.give_back(d, nack).await;
            }
        }
        let n = again.len();
        if self.outbox.redeliver_all(again) {
            self.mark_own_output();
        } else if n > 0 {
            self.broker
                .shared
                .stats
                .unplaced
                .fetch_add(n as u64, Ordering::Relaxed);
        }
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
        if self.subs.remove(&sid).is_none() {
            return false;
        }
        self.outbox.set_acked(sid, false);
        let mut reg = self.broker.write();
        remove_sub(&mut reg, self.id, sid);
        self.broker.bump();
        true
    }

    /// Delivers `batch` to every matching subscription.
    ///
    /// Awaits only when a `block` subscriber's outbox is full; drops (and counts) for `drop`
    /// subscribers. Returns the number of deliveries made (messages × subscribers).
    pub async fn publish(&mut self, batch: Batch<'_>) -> usize {
        match self.publish_now(batch) {
            Ok(n) => n,
            Err(rest) => self.publish_rest(rest, batch).await,
        }
    }

    /// [`Session::publish`] without a future, for a caller that wants none on its common
    /// path: `Ok` (the deliveries made) when every subscriber took `batch` at once and no
    /// queue group matches its key (queues bound to it are offered it
    /// here: they never block); otherwise what is left to do, which
    /// the caller must finish with [`Session::publish_rest`] on the same batch (what was
    /// delivered stays delivered, in order).
    pub fn publish_now(&mut self, batch: Batch<'_>) -> Result<usize, PublishRest> {
        self.note_in(batch);
        let route = self.lookup(batch.key());
        if !route.streams.is_empty() {
            drop(self.store(&route, batch));
        }
        let mut delivered = 0;
        for (i, t) in route.to.fanout.iter().enumerate() {
            match self.deliver_now(t, batch) {
                Ok((n, _)) => delivered += n,
                Err(took) => {
                    return Err(PublishRest {
                        route,
                        at: i,
                        took,
                        delivered: delivered + took,
                    });
                }
            }
        }
        delivered += self.offer_queues(&route, batch);
        if route.to.groups.is_empty() {
            self.probe = None;
            return Ok(delivered);
        }
        let at = route.to.fanout.len();
        Err(PublishRest {
            route,
            at,
            took: 0,
            delivered,
        })
    }

    /// Finishes what [`Session::publish_now`] left (may wait, as [`Session::publish`]
    /// does); the deliveries made in all.
    pub async fn publish_rest(&mut self, rest: PublishRest, batch: Batch<'_>) -> usize {
        let PublishRest {
            route,
            at,
            took,
            mut delivered,
        } = rest;
        if let Some(t) = route.to.fanout.get(at) {
            // The target whose outbox was full: the rest of the batch may wait.
            delivered += self.deliver(t, batch.slice(took, batch.len())).await.0;
            delivered += self.deliver_fanout(&route.to.fanout[at + 1..], batch).await;
            delivered += self.offer_queues(&route, batch);
        }
        delivered += self.deliver_queues(&route, batch).await;
        self.probe = None;
        delivered
    }

    /// As [`Session::publish`], and says what the streams capturing the key appended (they
    /// append before anything is delivered live). Await [`Stored::confirmed`] for a
    /// publisher's confirm.
    pub async fn publish_stored(&mut self, batch: Batch<'_>) -> (usize, Stored) {
        self.note_in(batch);
        let route = self.lookup(batch.key());
        let stored = if route.streams.is_empty() {
            Stored::default()
        } else {
            self.store(&route, batch)
        };
        let n = self.deliver_route(&route, batch).await;
        self.probe = None;
        (n, stored)
    }

    /// Counts `batch` as published by this session (and, one publish in
    /// [`crate::keys::EVERY`], in the broker's key sampler).
    fn note_in(&mut self, batch: Batch<'_>) {
        let bytes = (0..batch.len()).map(|i| batch.payload_len(i) as u64).sum();
        let traffic = self.outbox.traffic();
        traffic.note_in(batch.len() as u64, bytes);
        let calls = matches!(batch, Batch::One(m) if m.reply_to.is_some());
        if calls || hayate_core::is_inbox_key(batch.key().as_str()) {
            let replies = if calls { 0 } else { batch.len() as u64 };
            traffic.note_rpc(u64::from(calls), replies);
        }
        self.probe = None;
        if self.sample_in == 0 {
            self.sample_in = crate::keys::EVERY;
            self.probe = Some(std::time::Instant::now());
            self.broker.shared.keys.note(
                batch.key(),
                batch.len() as u64 * u64::from(crate::keys::EVERY),
            );
        }
        self.sample_in -= 1;
    }

    /// As [`Session::publish_stored`], and says what the queues the publish reached did
    /// with it ([`Routed`]: taken, refused, stored records to wait for).
    pub async fn publish_routed(&mut self, batch: Batch<'_>) -> (usize, Routed, Stored) {
        self.routed = Routed::default();
        self.routing = true;
        let (n, stored) = self.publish_stored(batch).await;
        self.routing = false;
        (n, std::mem::take(&mut self.routed), stored)
    }

    /// What [`Session::publish_routed`] is gathering (empty between its calls: a plain
    /// publish keeps nothing). For tests.
    #[doc(hidden)]
    pub fn routed_pending(&self) -> (usize, usize) {
        (self.routed.queued, self.routed.stored.len())
    }

    /// Delivers `batch` along `route` (the publish path after the streams).
    async fn deliver_route(&mut self, route: &Route, batch: Batch<'_>) -> usize {
        let fanout = self.deliver_fanout(&route.to.fanout, batch).await;
        fanout + self.offer_queues(route, batch) + self.deliver_queues(route, batch).await
    }

    /// Offers `batch` to the queues bound to its key (they never block: a full one drops,
    /// refuses or dead-letters); the items they admitted, counted as deliveries. Their
    /// deliveries to consumers leave with this session's [`Session::flush`].
    fn offer_queues(&mut self, route: &Route, batch: Batch<'_>) -> usize {
        if route.queues.is_empty() {
            return 0;
        }
        let mut routed = Routed::default();
        for r in &route.queues {
            r.queue
                .offer_batch(batch, &r.filters, &mut routed, &mut self.to_flush);
        }
        let n = routed.queued;
        // Only a publish that asked (`publish_routed`) keeps what queues did: a plain
        // publish's store records would otherwise pile up for the session's life.
        if self.routing {
            self.routed.merge(routed);
        }
        n
    }

    /// Delivers `batch` to each of `targets` (subscriptions outside queue groups).
    async fn deliver_fanout(&mut self, targets: &[Target], batch: Batch<'_>) -> usize {
        let mut delivered = 0;
        for t in targets {
            delivered += match self.deliver_now(t, batch) {
                Ok((n, _)) => n,
                // The outbox is full: the rest may wait (a future only on this path).
                Err(took) => took + self.deliver(t, batch.slice(took, batch.len())).await.0,
            };
        }
        delivered
    }

    /// Delivers `batch` to `route`'s queue groups (one member each).
    async fn deliver_queues(&mut self, route: &Route, batch: Batch<'_>) -> usize {
        let mut delivered = 0;
        for g in &route.to.groups {
            delivered += self.deliver_group(&g.rr, &g.members, batch, true).await;
        }
        delivered
    }

    fn store(&mut self, route: &Route, batch: Batch<'_>) -> Stored {
        let mut stored = Stored::default();
        let stats = &self.broker.shared.stats;
        for s in &route.streams {
            match s.append(batch, &mut self.meta) {
                Ok(r) => {
                    stats.stored.fetch_add(r.end - r.start, Ordering::Relaxed);
                    stored.appended.push((s.clone(), r));
                }
                Err(e) => {
                    stats
                        .store_failed
                        .fetch_add(batch.len() as u64, Ordering::Relaxed);
                    tracing::warn!(stream = %s.name(), "append failed: {e}");
                    stored.failed.push((s.name().to_owned(), e));
                }
            }
        }
        stored
    }

    fn mark_output(&mut self, outbox: &Arc<Outbox>) {
        if !self.to_flush.iter().any(|o| Arc::ptr_eq(o, outbox)) {
            self.to_flush.push(outbox.clone());
        }
    }

    /// Marks this session's own outbox as holding new output (control frames).
    pub fn mark_own_output(&mut self) {
        let own = self.outbox.clone();
        self.mark_output(&own);
    }

    /// Writes what this session queued since the last call straight to the target sockets
    /// where they can take it now (see [`Outbox::try_flush`]); call it after handling every
    /// frame of a read, before reading again. Saves a task wake-up per target in the common
    /// case, as nats-server's flush of pending clients at the end of a read does. A target
    /// that other sessions flushed to a moment ago is left to its writer, which gathers
    /// their deliveries into one write (see [`Outbox::flush_from`]).
    pub fn flush(&mut self) {
        for o in self.to_flush.drain(..) {
            o.flush_from(&mut self.scratch, self.id);
        }
    }

    /// `key`'s route: from this session's cache while the broker's generation is
    /// unchanged (the common case: one atomic load and one hash lookup), else made anew
    /// under the registry's read lock.
    fn lookup(&mut self, key: &Key) -> Arc<Route> {
        let g = self.broker.shared.generation.load(Ordering::Acquire);
        let broker = &self.broker;
        self.cache.get_or_build(g, key, || broker.route(key))
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
        for sid in self.subs.keys() {
            remove_sub(&mut reg, self.id, *sid);
        }
        self.subs.clear();
        self.broker.bump();
    }
}

/// The registry id of queue group `name` on `expr`.
fn group_id(name: &str, expr: &KeyExpr) -> String {
    format!("{name}\u{0}{}", expr.as_str())
}
