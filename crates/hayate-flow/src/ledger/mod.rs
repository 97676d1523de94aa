//! The delivery ledger: what a receiver (a session's acknowledged subscriptions, an MQTT
//! session, a queue's consumers) has been given and not yet settled, and what waits.
//!
//! A [`Ledger`] numbers each delivery with a *delivery id* (per ledger, increasing, never
//! reused). Items wait *ready*, one first-in first-out list per priority (the highest served
//! first; level 0 is a plain ring, other levels exist only once an item of that priority
//! arrives), each with a *seq*: its place, so that an item given back goes back *in place*
//! (by seq among its priority), not to the back. Taken, an item is *in flight* under its
//! delivery id, with an owner (a consumer, a channel), an optional deadline (the ack wait),
//! its counts of deliveries and returns, and a stage byte for the protocol (MQTT QoS 2:
//! 0 sent, 1 released). It leaves flight when settled ([`Ledger::settle`], [`Ledger::ack`]):
//! acknowledged (done), requeued in place (now, or *delayed* until a time), or rejected
//! (a dead letter).
//!
//! Two ways into flight:
//! - [`Ledger::next_ready`]: within a *window* of deliveries in flight (an outbox's
//!   `max_unacked`, an MQTT Receive Maximum); no owner, no deadline, no delivery limit;
//! - [`Ledger::claim`]: for a queue's consumer (the caller checked its credit; no window):
//!   owner, ack wait and `max_deliveries` ([`Policy`]).
//!
//! A delivery superseded by a later delivery of the same message to the same receiver (a
//! durable consumer's message whose ack wait ran out, delivered again) is *retired*
//! ([`Ledger::retire`]): out of the window and the byte count, so redeliveries never fill
//! the window, and kept (stripped, at most `window` of them) only so that a late
//! acknowledgement of its id still counts.
//!
//! The ledger counts the bytes it holds (ready, delayed and in flight), so the owner can
//! charge them to a budget: a receiver that does not acknowledge slows its publishers
//! instead of growing without bound.
//!
//! Time is passed in (`now`), never read here: callers (and tests) control it.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

/// Seqs of items pushed to the back count up from here; those pushed to the front count down.
const SEQ_BASE: u64 = 1 << 63;

mod ready;

use ready::Ready;

/// Why an item left a ledger (or its queue) without being acknowledged.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Reason {
    /// Rejected by its receiver ([`Settle::Reject`]).
    Rejected,
    /// Its time to live ran out ([`Ledger::expire_ready`]).
    Expired,
    /// Its queue was full (the caller's limit).
    MaxLen,
    /// Given back more often than [`Policy::max_returns`] allows.
    DeliveryLimit,
    /// Delivered as often as [`Policy::max_deliveries`] allows.
    MaxDeliver,
}

impl Reason {
    /// The reason's name (AMQP `x-death` reasons; `max_deliver` for streams).
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::Rejected => "rejected",
            Reason::Expired => "expired",
            Reason::MaxLen => "maxlen",
            Reason::DeliveryLimit => "delivery_limit",
            Reason::MaxDeliver => "max_deliver",
        }
    }
}

/// What the ledger enforces by itself.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Policy {
    /// How long a claimed delivery may stay unsettled before [`Ledger::expire`] puts it
    /// back (`None`: for ever).
    pub ack_wait: Option<Duration>,
    /// Most deliveries of one item (0: no limit). Checked at [`Ledger::claim`]: an item
    /// delivered that often already is a dead letter ([`Reason::MaxDeliver`]).
    pub max_deliveries: u32,
    /// Most returns of one item (a quorum queue's delivery limit; `None`: no limit).
    /// Checked when it is given back: past it, a dead letter ([`Reason::DeliveryLimit`]).
    pub max_returns: Option<u32>,
}

/// How a receiver settles a delivery.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Settle {
    /// Done with it.
    Ack,
    /// Give it back, to its place among the ready items.
    Requeue,
    /// Give it back after a while ([`Ledger::promote`] makes it ready again).
    RequeueAfter(Duration),
    /// Refuse it: a dead letter ([`Reason::Rejected`]).
    Reject,
}

/// What [`Ledger::settle`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome<T> {
    /// Acknowledged (or a retired delivery, whatever the verb): the item is the caller's.
    Done(T),
    /// Back in its place among the ready items.
    Requeued,
    /// Waiting for its time ([`Ledger::promote`]).
    Delayed,
    /// Out of the ledger, unacknowledged, and why.
    DeadLetter(T, Reason),
    /// No such delivery in flight (or retired).
    Unknown,
}

/// What [`Ledger::claim`] took.
#[derive(Debug, PartialEq, Eq)]
pub enum Claim<'a, T> {
    /// In flight under `id`, for the caller to send; `deliveries` counts this one.
    Deliver {
        /// Its delivery id.
        id: u64,
        /// The item.
        item: &'a T,
        /// Times delivered, this one included.
        deliveries: u32,
        /// Times given back.
        returns: u32,
    },
    /// The next ready item had been delivered [`Policy::max_deliveries`] times: it left.
    DeadLetter(T, Reason),
}

/// Deliveries given back together ([`Ledger::release_owner`], [`Ledger::expire`]).
#[derive(Debug, PartialEq, Eq)]
pub struct Returned<T> {
    /// How many went back to their places.
    pub requeued: usize,
    /// Those past [`Policy::max_returns`], in id order.
    pub dead: Vec<(T, Reason)>,
}

/// A delivery in flight as [`Ledger::flight`] shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FlightInfo {
    /// Its owner (0 for deliveries of [`Ledger::next_ready`] and restored ones).
    pub owner: u64,
    /// When its ack wait runs out.
    pub deadline: Option<Instant>,
    /// The protocol's stage byte.
    pub stage: u8,
    /// Its priority.
    pub priority: u8,
    /// Times delivered, this one included.
    pub deliveries: u32,
    /// Times given back.
    pub returns: u32,
}

/// One item the ledger holds. `size` is what the caller said it holds (saturated at
/// `u32::MAX`).
#[derive(Debug, Clone)]
struct Entry<T> {
    item: T,
    seq: u64,
    size: u32,
    deliveries: u32,
    returns: u32,
    priority: u8,
    /// In flight only (0 when ready).
    stage: u8,
}

/// One delivery in flight.
#[derive(Debug, Clone)]
struct Flight<T> {
    entry: Entry<T>,
    owner: u64,
    deadline: Option<Instant>,
}

/// Deliveries in flight, ready, delayed and retired for one receiver or queue (see the
/// module documentation).
#[derive(Debug, Clone)]
pub struct Ledger<T> {
    next_id: u64,
    window: usize,
    /// The next seq at the back, and the last one given at the front.
    next_seq: u64,
    front_seq: u64,
    ready: Ready<T>,
    inflight: BTreeMap<u64, Flight<T>>,
    /// Retired deliveries (see the module documentation), by id.
    retired: BTreeMap<u64, T>,
    /// Ack-wait deadlines of deliveries in flight: (when, id).
    deadlines: BTreeSet<(Instant, u64)>,
    /// Items given back for later: by (when, seq).
    delayed: BTreeMap<(Instant, u64), Entry<T>>,
    bytes: usize,
    policy: Policy,
}

fn clamp(size: usize) -> u32 {
    u32::try_from(size).unwrap_or(u32::MAX)
}

impl<T> Ledger<T> {
    /// A ledger allowing `window` deliveries in flight through [`Ledger::next_ready`] (at
    /// least 1), with no policy.
    pub fn new(window: usize) -> Ledger<T> {
        Ledger::with_policy(window, Policy::default())
    }

    /// A ledger with `policy`.
    pub fn with_policy(window: usize, policy: Policy) -> Ledger<T> {
        Ledger {
            next_id: 1,
            window: window.max(1),
            next_seq: SEQ_BASE,
            front_seq: SEQ_BASE,
            ready: Ready::new(),
            inflight: BTreeMap::new(),
            retired: BTreeMap::new(),
            deadlines: BTreeSet::new(),
            delayed: BTreeMap::new(),
            bytes: 0,
            policy,
        }
    }

    /// The policy.
    pub fn policy(&self) -> Policy {
        self.policy
    }

    /// Changes the policy (deliveries in flight keep their deadlines).
    pub fn set_policy(&mut self, policy: Policy) {
        self.policy = policy;
    }

    /// The most deliveries in flight through [`Ledger::next_ready`].
    pub fn window(&self) -> usize {
        self.window
    }

    /// Changes the window (at least 1). Deliveries already in flight stay in flight.
    pub fn set_window(&mut self, window: usize) {
        self.window = window.max(1);
    }

    fn entry(&mut self, item: T, size: usize, seq: u64, priority: u8) -> Entry<T> {
        let size = clamp(size);
        self.bytes += size as usize;
        Entry {
            item,
            seq,
            size,
            deliveries: 0,
            returns: 0,
            priority,
            stage: 0,
        }
    }

    /// Queues `item` (of `size` bytes, for accounting) behind the ready items of its
    /// `priority`; returns its seq.
    pub fn push(&mut self, item: T, size: usize, priority: u8) -> u64 {
        let seq = self.next_seq;
        self.next_seq += 1;
        let e = self.entry(item, size, seq, priority);
        self.ready.push_back(e);
        seq
    }

    /// [`Ledger::push`] of an item given back `returns` times already (read back from a
    /// store after a restart: its returns still count against [`Policy::max_returns`]).
    pub fn push_returned(&mut self, item: T, size: usize, priority: u8, returns: u32) -> u64 {
        let seq = self.next_seq;
        self.next_seq += 1;
        let mut e = self.entry(item, size, seq, priority);
        e.returns = returns;
        self.ready.push_back(e);
        seq
    }

    /// Queues `item` ahead of every item of its `priority` (a delivery given back to this
    /// receiver from elsewhere); returns its seq, below every seq given before.
    pub fn push_front(&mut self, item: T, size: usize, priority: u8) -> u64 {
        self.front_seq -= 1;
        let seq = self.front_seq;
        let e = self.entry(item, size, seq, priority);
        self.ready.push_front(e);
        seq
    }

    /// Queues `item` as one delivered `deliveries` times already (a durable consumer's
    /// position restored at start-up, a claim given back unsent): behind the ready items of
    /// its `priority`, or with `at`, delayed until then ([`Ledger::promote`]); returns its
    /// seq. The count goes on from there ([`Policy::max_deliveries`] included).
    pub fn push_delivered(
        &mut self,
        item: T,
        size: usize,
        priority: u8,
        deliveries: u32,
        at: Option<Instant>,
    ) -> u64 {
        let seq = self.next_seq;
        self.next_seq += 1;
        let mut e = self.entry(item, size, seq, priority);
        e.deliveries = deliveries;
        match at {
            Some(at) => {
                self.delayed.insert((at, seq), e);
            }
            None => self.ready.push_back(e),
        }
        seq
    }

    fn fly(
        &mut self,
        mut entry: Entry<T>,
        owner: u64,
        deadline: Option<Instant>,
    ) -> (u64, &Flight<T>) {
        let id = self.next_id;
        self.next_id += 1;
        entry.deliveries = entry.deliveries.saturating_add(1);
        if let Some(at) = deadline {
            self.deadlines.insert((at, id));
        }
        let f = Flight {
            entry,
            owner,
            deadline,
        };
        (id, self.inflight.entry(id).or_insert(f))
    }

    /// Moves the next ready item into flight if the window has room; returns its new
    /// delivery id and the item, for the caller to send. No owner, no deadline, no
    /// delivery limit (see [`Ledger::claim`]).
    pub fn next_ready(&mut self) -> Option<(u64, &T)> {
        if self.inflight.len() >= self.window {
            return None;
        }
        let e = self.ready.pop()?;
        let (id, f) = self.fly(e, 0, None);
        Some((id, &f.entry.item))
    }

    /// Moves the next ready item into flight for `owner`, whatever the window (the caller
    /// checked the owner's credit), with the ack wait of the policy from `now`. An item
    /// delivered [`Policy::max_deliveries`] times already leaves as a dead letter instead.
    pub fn claim(&mut self, owner: u64, now: Instant) -> Option<Claim<'_, T>> {
        let e = self.ready.pop()?;
        let max = self.policy.max_deliveries;
        if max > 0 && e.deliveries >= max {
            self.bytes -= e.size as usize;
            return Some(Claim::DeadLetter(e.item, Reason::MaxDeliver));
        }
        let deadline = self.policy.ack_wait.map(|w| now + w);
        let (id, f) = self.fly(e, owner, deadline);
        Some(Claim::Deliver {
            id,
            item: &f.entry.item,
            deliveries: f.entry.deliveries,
            returns: f.entry.returns,
        })
    }

    /// Puts `item` straight into flight under a new delivery id at `stage`, whatever the
    /// window: a delivery that was in flight when its state was saved, restored before
    /// anything else is sent (the receiver may still acknowledge it).
    pub fn insert_in_flight(&mut self, item: T, size: usize, stage: u8) -> u64 {
        let seq = self.next_seq;
        self.next_seq += 1;
        let mut e = self.entry(item, size, seq, 0);
        e.stage = stage;
        self.fly(e, 0, None).0
    }

    /// The item in flight (or retired) under `id`.
    pub fn get(&self, id: u64) -> Option<&T> {
        self.inflight
            .get(&id)
            .map(|f| &f.entry.item)
            .or_else(|| self.retired.get(&id))
    }

    /// The item in flight under `id`, to update what the owner keeps beside it; its size
    /// stays as given.
    pub fn get_mut(&mut self, id: u64) -> Option<&mut T> {
        self.inflight.get_mut(&id).map(|f| &mut f.entry.item)
    }

    /// What the ledger knows of delivery `id` in flight.
    pub fn flight(&self, id: u64) -> Option<FlightInfo> {
        self.inflight.get(&id).map(|f| FlightInfo {
            owner: f.owner,
            deadline: f.deadline,
            stage: f.entry.stage,
            priority: f.entry.priority,
            deliveries: f.entry.deliveries,
            returns: f.entry.returns,
        })
    }

    /// Sets the stage byte of delivery `id` in flight; false if it is not in flight.
    pub fn set_stage(&mut self, id: u64, stage: u8) -> bool {
        match self.inflight.get_mut(&id) {
            Some(f) => {
                f.entry.stage = stage;
                true
            }
            None => false,
        }
    }

    /// The stage byte of delivery `id` in flight.
    pub fn stage(&self, id: u64) -> Option<u8> {
        self.inflight.get(&id).map(|f| f.entry.stage)
    }

    /// Deliveries in flight to `owner` (counted: O(in flight)).
    pub fn owner_count(&self, owner: u64) -> usize {
        self.inflight.values().filter(|f| f.owner == owner).count()
    }

    /// Takes delivery `id` out of flight (its bytes and deadline with it).
    fn take_flight(&mut self, id: u64) -> Option<Flight<T>> {
        let f = self.inflight.remove(&id)?;
        self.bytes -= f.entry.size as usize;
        if let Some(at) = f.deadline {
            self.deadlines.remove(&(at, id));
        }
        Some(f)
    }

    fn remove(&mut self, id: u64) -> Option<T> {
        match self.take_flight(id) {
            Some(f) => Some(f.entry.item),
            None => self.retired.remove(&id),
        }
    }

    /// Counts a return of `e`: past the policy's limit, it is a dead letter.
    fn count_return(&self, e: &mut Entry<T>) -> bool {
        e.returns = e.returns.saturating_add(1);
        e.stage = 0;
        self.policy.max_returns.is_some_and(|m| e.returns > m)
    }

    /// Gives `e` (out of flight) back to its place, or out as a dead letter.
    fn give_back(&mut self, mut e: Entry<T>) -> Result<(), (T, Reason)> {
        if self.count_return(&mut e) {
            return Err((e.item, Reason::DeliveryLimit));
        }
        self.bytes += e.size as usize;
        self.ready.insert(e);
        Ok(())
    }

    /// Acknowledges delivery `id` (in flight or retired); returns its item, or `None` if it
    /// was neither (already settled, given back, or never sent).
    pub fn ack(&mut self, id: u64) -> Option<T> {
        self.remove(id)
    }

    /// Acknowledges every delivery in flight (or retired) with an id up to and including
    /// `id`; returns how many there were.
    pub fn ack_through(&mut self, id: u64) -> usize {
        let rest = self.inflight.split_off(&id.saturating_add(1));
        let done = std::mem::replace(&mut self.inflight, rest);
        for (k, f) in &done {
            self.bytes -= f.entry.size as usize;
            if let Some(at) = f.deadline {
                self.deadlines.remove(&(at, *k));
            }
        }
        let rest = self.retired.split_off(&id.saturating_add(1));
        let retired = std::mem::replace(&mut self.retired, rest);
        done.len() + retired.len()
    }

    /// Removes and returns, in id order, the deliveries in flight (or retired) with an id
    /// up to and including `id` for which `pick` is true (a cumulative acknowledgement of
    /// one subscription's deliveries).
    pub fn take_through(&mut self, id: u64, mut pick: impl FnMut(&T) -> bool) -> Vec<T> {
        let mut ids: Vec<u64> = self
            .inflight
            .range(..=id)
            .filter(|(_, f)| pick(&f.entry.item))
            .map(|(&k, _)| k)
            .collect();
        if !self.retired.is_empty() {
            ids.extend(
                self.retired
                    .range(..=id)
                    .filter(|(_, t)| pick(t))
                    .map(|(&k, _)| k),
            );
            ids.sort_unstable();
        }
        ids.into_iter().filter_map(|k| self.remove(k)).collect()
    }

    /// Settles delivery `id` as `how` says (`now`: from when a delay counts). A retired
    /// delivery is [`Outcome::Done`] whatever the verb (a later delivery superseded it).
    pub fn settle(&mut self, id: u64, how: Settle, now: Instant) -> Outcome<T> {
        let Some(f) = self.take_flight(id) else {
            return match self.retired.remove(&id) {
                Some(t) => Outcome::Done(t),
                None => Outcome::Unknown,
            };
        };
        let mut e = f.entry;
        match how {
            Settle::Ack => Outcome::Done(e.item),
            Settle::Reject => Outcome::DeadLetter(e.item, Reason::Rejected),
            Settle::Requeue => match self.give_back(e) {
                Ok(()) => Outcome::Requeued,
                Err((t, why)) => Outcome::DeadLetter(t, why),
            },
            Settle::RequeueAfter(d) => {
                if self.count_return(&mut e) {
                    return Outcome::DeadLetter(e.item, Reason::DeliveryLimit);
                }
                self.bytes += e.size as usize;
                self.delayed.insert((now + d, e.seq), e);
                Outcome::Delayed
            }
        }
    }

    /// Gives back deliveries `ids` (in flight) to their places, each a return.
    fn give_back_all(&mut self, ids: Vec<u64>) -> Returned<T> {
        let mut r = Returned {
            requeued: 0,
            dead: Vec::new(),
        };
        for id in ids {
            if let Some(f) = self.take_flight(id) {
                match self.give_back(f.entry) {
                    Ok(()) => r.requeued += 1,
                    Err(d) => r.dead.push(d),
                }
            }
        }
        r
    }

    /// Gives back every delivery in flight to `owner` (a consumer, channel or member gone):
    /// each to its place (so their original order), a return each.
    pub fn release_owner(&mut self, owner: u64) -> Returned<T> {
        let ids = self
            .inflight
            .iter()
            .filter(|(_, f)| f.owner == owner)
            .map(|(&id, _)| id)
            .collect();
        self.give_back_all(ids)
    }

    /// Gives back the deliveries whose ack wait ran out by `now` (each to its place, a
    /// return each).
    pub fn expire(&mut self, now: Instant) -> Returned<T> {
        let mut ids = Vec::new();
        while let Some(&(at, id)) = self.deadlines.first()
            && at <= now
        {
            self.deadlines.pop_first();
            ids.push(id);
        }
        ids.sort_unstable();
        self.give_back_all(ids)
    }

    /// Makes the delayed items whose time came by `now` ready again, each in its place;
    /// how many.
    pub fn promote(&mut self, now: Instant) -> usize {
        let mut n = 0;
        while let Some(entry) = self.delayed.first_entry()
            && entry.key().0 <= now
        {
            let e = entry.remove();
            self.ready.insert(e);
            n += 1;
        }
        n
    }

    /// When [`Ledger::expire`] or [`Ledger::promote`] next has something to do.
    pub fn next_due(&self) -> Option<Instant> {
        let a = self.deadlines.first().map(|&(at, _)| at);
        let b = self.delayed.first_key_value().map(|(&(at, _), _)| at);
        match (a, b) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Removes, at the head of each priority, the ready items for which `expired` is true
    /// (a time to live: only heads are looked at, as RabbitMQ does); returns them, highest
    /// priority first.
    pub fn expire_ready(&mut self, expired: impl FnMut(&T) -> bool) -> Vec<T> {
        let out = self.ready.pop_heads(expired);
        out.into_iter()
            .map(|e| {
                self.bytes -= e.size as usize;
                e.item
            })
            .collect()
    }

    /// The ready item of `priority` with `seq` (as [`Ledger::push`] returned it), if it
    /// is still ready.
    pub fn ready_mut(&mut self, priority: u8, seq: u64) -> Option<&mut T> {
        self.ready.get_mut(priority, seq).map(|e| &mut e.item)
    }

    /// Removes the next ready item (in delivery order): a full queue dropping its head.
    pub fn pop_ready(&mut self) -> Option<T> {
        let e = self.ready.pop()?;
        self.bytes -= e.size as usize;
        Some(e.item)
    }

    /// Retires delivery `id` (in flight): a later delivery of the same message to the same
    /// receiver supersedes it. It leaves the window and the byte count; `strip` drops what
    /// a late acknowledgement does not need (the payload, say). At most `window` retired
    /// deliveries are kept, the oldest forgotten first (an acknowledgement of a forgotten
    /// one is then unknown). False if `id` is not in flight.
    pub fn retire(&mut self, id: u64, strip: impl FnOnce(&mut T)) -> bool {
        let Some(mut f) = self.take_flight(id) else {
            return false;
        };
        strip(&mut f.entry.item);
        self.retired.insert(id, f.entry.item);
        while self.retired.len() > self.window {
            self.retired.pop_first();
        }
        true
    }

    /// Drops the ready (never sent) items for which `pick` is true (superseded before they
    /// went out); how many.
    pub fn drop_ready_if(&mut self, mut pick: impl FnMut(&T) -> bool) -> usize {
        let before = self.ready.len;
        let mut freed = 0;
        self.ready.retain(|e| {
            let drop = pick(&e.item);
            if drop {
                freed += e.size as usize;
            }
            !drop
        });
        self.bytes -= freed;
        before - self.ready.len
    }

    /// Takes everything: the deliveries in flight in id order, then the ready ones in
    /// delivery order, then the delayed ones by time (retired ones are forgotten: a later
    /// delivery superseded each). The ledger is empty afterwards (ids are not reused).
    pub fn take_all(&mut self) -> Vec<T> {
        self.retired.clear();
        self.deadlines.clear();
        let mut all: Vec<T> = std::mem::take(&mut self.inflight)
            .into_values()
            .map(|f| f.entry.item)
            .collect();
        all.extend(self.ready.take().into_iter().map(|e| e.item));
        all.extend(
            std::mem::take(&mut self.delayed)
                .into_values()
                .map(|e| e.item),
        );
        self.bytes = 0;
        all
    }

    /// Deliveries in flight, in id order.
    pub fn inflight(&self) -> impl DoubleEndedIterator<Item = (u64, &T)> {
        self.inflight.iter().map(|(&id, f)| (id, &f.entry.item))
    }

    /// Deliveries in flight with their stage bytes, in id order.
    pub fn inflight_staged(&self) -> impl DoubleEndedIterator<Item = (u64, &T, u8)> {
        self.inflight
            .iter()
            .map(|(&id, f)| (id, &f.entry.item, f.entry.stage))
    }

    /// Every item held (in flight, ready and delayed), to change in place (its accounted
    /// size stays as it was pushed).
    pub fn for_each_mut(&mut self, mut f: impl FnMut(&mut T)) {
        for fl in self.inflight.values_mut() {
            f(&mut fl.entry.item);
        }
        for e in self.ready.iter_mut() {
            f(&mut e.item);
        }
        for e in self.delayed.values_mut() {
            f(&mut e.item);
        }
    }

    /// Every item held with its count of deliveries so far: in flight (in id order), ready
    /// (in delivery order), delayed (by time).
    pub fn deliveries(&self) -> impl Iterator<Item = (&T, u32)> {
        let flying = self.inflight.values().map(|f| &f.entry);
        flying
            .chain(self.ready.iter())
            .chain(self.delayed.values())
            .map(|e| (&e.item, e.deliveries))
    }

    /// Ready items, in delivery order (highest priority first, then by seq).
    pub fn ready(&self) -> impl DoubleEndedIterator<Item = &T> {
        self.ready.iter().map(|e| &e.item)
    }

    /// Delayed items, by the time they become ready.
    pub fn delayed(&self) -> impl DoubleEndedIterator<Item = (Instant, &T)> {
        self.delayed.iter().map(|(&(at, _), e)| (at, &e.item))
    }

    /// Number of deliveries in flight.
    pub fn in_flight_len(&self) -> usize {
        self.inflight.len()
    }

    /// Number of ready items.
    pub fn ready_len(&self) -> usize {
        self.ready.len
    }

    /// Number of delayed items.
    pub fn delayed_len(&self) -> usize {
        self.delayed.len()
    }

    /// Number of items held: in flight, ready and delayed (not retired).
    pub fn len(&self) -> usize {
        self.inflight.len() + self.ready.len + self.delayed.len()
    }

    /// True when nothing is in flight, ready or delayed.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes of every item held (in flight, ready and delayed), as given to `push`.
    pub fn held_bytes(&self) -> usize {
        self.bytes
    }

    /// Bytes of the ledger's own storage, were `more` items pushed at priority 0 beyond
    /// what it holds (for an owner that charges them to the memory budget beside its
    /// items' heap bytes): the rings' capacities (one grows by doubling, from 4), and the
    /// maps' nodes, one entry (and its key) per slot. A B-tree's nodes of 11 entries are at
    /// least 5 full except the root: at most 2.5 slots per entry with the internal nodes,
    /// and a whole node for the root.
    pub fn storage_bytes(&self, more: usize) -> usize {
        fn tree(n: usize, slot: usize) -> usize {
            match n {
                0 => 0,
                n => (n * 5 / 2 + 11) * slot,
            }
        }
        let slot = std::mem::size_of::<Entry<T>>();
        let need = self.ready.base.len() + more;
        let mut cap = self.ready.base.capacity();
        while cap < need {
            cap = (cap * 2).max(4);
        }
        let levels: usize = self.ready.levels.iter().map(|(_, l)| l.capacity()).sum();
        (cap + levels) * slot
            + tree(self.inflight.len(), std::mem::size_of::<Flight<T>>() + 8)
            + tree(self.delayed.len(), slot + 24)
            + tree(self.deadlines.len(), 24)
    }
}
