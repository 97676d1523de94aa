//! Durable consumers: a named position in a stream shared by any number of members (a work
//! queue: each message goes to one member and is acknowledged on its own).
//!
//! State: the *position* — `floor` (every offset below is done: acknowledged, filtered out,
//! expired or dead-lettered), `next` (the first offset never handed out), the done offsets
//! above the floor (as ranges) — and a delivery [`Ledger`] of the offsets handed out and not
//! done: in flight to a member (its owner) with an ack-wait deadline, ready to be delivered
//! again (the ack wait ran out, a NACK, a member gone, a restart: served before new records),
//! or delayed (a NACK with a delay, a message scheduled for later), each with its count of
//! deliveries (past `max_deliver`, a dead letter). New records are read from the log at
//! `next`, not held: the ledger holds offsets only (size 0).
//!
//! Persisted in the meta log (`crate::meta`): the definition as `consumer/<stream>/<name>`
//! when it is made, the position as `pos/<stream>/<name>` at most every [`PERSIST_EVERY`]
//! while it changes. After a restart every offset in `[floor, next)` that is not done is
//! delivered again (at least once): acknowledgements of the last moments before a crash may
//! be lost, so duplicates are possible and counted by the delivery count.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use hayate_core::KeyExpr;
use hayate_flow::Ledger;
use hayate_flow::ledger::{Claim, Policy, Settle};

/// A consumer's definition and state as the API carries them (hayate-native's wire types).
pub use hayate_api::stream::{ConsumerConfig, ConsumerInfo, Start};

use super::{Stream, StreamError};
use crate::meta::Meta;
use crate::meta::record::{self, Position};

/// At most this often a changing consumer saves its position.
pub const PERSIST_EVERY: Duration = Duration::from_millis(100);

/// Checks a consumer's definition; returns its parsed filter.
fn check(config: &ConsumerConfig) -> Result<Option<KeyExpr>, StreamError> {
    let n = &config.name;
    super::check_name("consumer", n)?;
    if config.ack_wait_ms == 0 || config.max_in_flight == 0 {
        return Err(StreamError::Invalid(format!(
            "consumer {n}: ack_wait_ms and max_in_flight must be above 0"
        )));
    }
    config
        .filter
        .as_deref()
        .map(KeyExpr::new)
        .transpose()
        .map_err(|e| StreamError::Invalid(format!("consumer {n}: filter: {e}")))
}

/// Offsets as ranges `[start, end)`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Ranges(BTreeMap<u64, u64>);

impl Ranges {
    pub(crate) fn contains(&self, o: u64) -> bool {
        self.0.range(..=o).next_back().is_some_and(|(_, &e)| o < e)
    }

    pub(crate) fn insert(&mut self, o: u64) -> bool {
        if self.contains(o) {
            return false;
        }
        let mut start = o;
        let mut end = o + 1;
        if let Some((&s, &e)) = self.0.range(..o).next_back()
            && e == o
        {
            start = s;
            self.0.remove(&s);
        }
        if let Some(e) = self.0.remove(&(o + 1)) {
            end = e;
        }
        self.0.insert(start, end);
        true
    }

    /// Removes the range starting at `floor`, if any; returns where the floor moves.
    fn take_from(&mut self, floor: u64) -> u64 {
        self.0.remove(&floor).unwrap_or(floor)
    }

    /// Drops everything below `floor`.
    fn drop_below(&mut self, floor: u64) {
        let mut keep = self.0.split_off(&floor);
        if let Some((_, &e)) = self.0.iter().next_back()
            && e > floor
        {
            keep.insert(floor, e);
        }
        self.0 = keep;
    }

    fn len(&self) -> u64 {
        self.0.iter().map(|(s, e)| e - s).sum()
    }
}

#[derive(Debug)]
pub(crate) struct CState {
    pub(crate) floor: u64,
    pub(crate) next: u64,
    pub(crate) done: Ranges,
    /// The offsets handed out and not done (see the module documentation). An offset done
    /// while it waits in it (a late acknowledgement after its ack wait ran out, retention)
    /// is dropped when it comes up ([`CState::claim_ready`]).
    ledger: Ledger<u64>,
    /// Offset -> ledger id of its latest delivery, until it is done or given back (the
    /// front-ends settle by offset and delivery count).
    ids: HashMap<u64, u64>,
    pub(crate) dirty: bool,
    pub(crate) last_persist: Option<Instant>,
    pub(crate) deleted: bool,
}

impl CState {
    fn new(floor: u64, next: u64, config: &ConsumerConfig) -> CState {
        let policy = Policy {
            ack_wait: Some(Duration::from_millis(config.ack_wait_ms)),
            max_deliveries: config.max_deliver,
            max_returns: None,
        };
        CState {
            floor,
            next,
            done: Ranges::default(),
            ledger: Ledger::with_policy(1, policy),
            ids: HashMap::new(),
            dirty: false,
            last_persist: None,
            deleted: false,
        }
    }

    /// Whether `o` is done (or below the floor).
    fn settled(&self, o: u64) -> bool {
        o < self.floor || self.done.contains(o)
    }

    /// Claims the next ready offset for `owner` (what is delivered again comes before new
    /// records), dropping those done meanwhile.
    fn claim_ready(&mut self, owner: u64, now: Instant) -> Option<Step> {
        loop {
            let (o, flight) = match self.ledger.claim(owner, now)? {
                Claim::Deliver {
                    id,
                    item,
                    deliveries,
                    ..
                } => (*item, Some((id, deliveries))),
                Claim::DeadLetter(o, _) => (o, None),
            };
            if self.settled(o) {
                self.ids.remove(&o);
                if let Some((id, _)) = flight {
                    self.ledger.ack(id);
                }
                continue;
            }
            self.dirty = true;
            return Some(match flight {
                Some((id, n)) => {
                    self.ids.insert(o, id);
                    Step::Deliver { offset: o, n }
                }
                None => {
                    self.ids.remove(&o);
                    Step::DeadLetter {
                        offset: o,
                        n: self.ledger.policy().max_deliveries,
                    }
                }
            });
        }
    }

    /// The latest delivery of `o`, if it is in flight as delivery `n` (any `n`: `None`).
    fn flight(&self, o: u64, n: Option<u32>) -> Option<u64> {
        let id = *self.ids.get(&o)?;
        let f = self.ledger.flight(id)?;
        n.is_none_or(|n| n == f.deliveries).then_some(id)
    }
}

/// What a member should do next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Step {
    /// Deliver `offset` (claimed: in flight now); this is its `n`th delivery.
    Deliver { offset: u64, n: u32 },
    /// Dead-letter `offset`, delivered `n` times (`max_deliver`): out of the ledger, to be
    /// marked done ([`Consumer::done`]) or tried again ([`Consumer::dead_letter_later`]).
    DeadLetter { offset: u64, n: u32 },
    /// Nothing now: wait for a change, for `until`, or for records at `tail` (none: the
    /// consumer is full, new records do not matter).
    Wait {
        until: Option<Instant>,
        tail: Option<u64>,
    },
    /// The consumer was deleted.
    Stop,
}

/// A consumer's dead-letter counters (see [`ConsumerInfo`]).
#[derive(Debug, Default)]
pub(crate) struct DeadLetterStats {
    pub(crate) moved: AtomicU64,
    pub(crate) cycles: AtomicU64,
    pub(crate) dropped: AtomicU64,
}

/// A durable consumer. Members deliver through `stream::member`.
#[derive(Debug)]
pub struct Consumer {
    pub(crate) config: ConsumerConfig,
    pub(crate) filter: Option<KeyExpr>,
    pub(crate) stream: Arc<Stream>,
    meta: Arc<Meta>,
    state: Mutex<CState>,
    /// Woken on every acknowledgement, NACK, release and deletion.
    pub(crate) changed: tokio::sync::Notify,
    /// Held while the position is saved (one writer at a time, and not across a delete).
    persisting: Mutex<()>,
    /// What became of its dead letters.
    pub(crate) dead: DeadLetterStats,
    /// The last owner number given to a member ([`Consumer::member`]).
    members: AtomicU64,
}

impl Consumer {
    pub(crate) fn lock(&self) -> MutexGuard<'_, CState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Creates a new consumer of `stream` (its definition and position are durable when
    /// this returns).
    pub(crate) fn create(
        stream: Arc<Stream>,
        meta: Arc<Meta>,
        config: ConsumerConfig,
    ) -> Result<Consumer, StreamError> {
        let filter = check(&config)?;
        let log = stream.log();
        let start = match config.start {
            Start::First => log.start_offset(),
            Start::New => log.end_offset(),
            Start::Offset(o) => o.clamp(log.start_offset(), log.end_offset()),
            Start::Time(t) => log.offset_for_time(t).map_err(|source| StreamError::Log {
                name: stream.name().to_owned(),
                source,
            })?,
        };
        let c = Consumer {
            state: Mutex::new(CState::new(start, start, &config)),
            config,
            filter,
            stream,
            meta,
            changed: tokio::sync::Notify::new(),
            persisting: Mutex::new(()),
            dead: DeadLetterStats::default(),
            members: AtomicU64::new(0),
        };
        c.write_state(true)?;
        Ok(c)
    }

    /// Opens a consumer from its definition and saved position: everything in flight
    /// before is due now. A position beyond the end of the stream is moved back to the end
    /// and saved so (durably) before this returns.
    pub(crate) fn load(
        stream: Arc<Stream>,
        meta: Arc<Meta>,
        config: ConsumerConfig,
        s: Position,
    ) -> Result<Consumer, StreamError> {
        let filter = check(&config)?;
        let start = stream.log().start_offset();
        let end = stream.log().end_offset();
        // A position beyond the end (the log lost its tail in a crash and will give those
        // offsets to new records) is brought back to the end, or new records would be
        // skipped as done; the position saved says so before anything is appended.
        let beyond = s.floor > end || s.next > end;
        if beyond {
            tracing::warn!(stream = %stream.name(), consumer = %config.name, floor = s.floor, next = s.next, end,
                "consumer position beyond the end of the log (its tail was lost): moved back to the end");
        }
        let floor = s.floor.clamp(start, end);
        let mut st = CState::new(floor, s.next.clamp(floor, end), &config);
        for (a, b) in s.done {
            let (a, b) = (a.max(st.floor), b.min(st.next));
            if a < b {
                st.done.0.insert(a, b);
            }
        }
        let deliveries: HashMap<u64, u32> = s.deliveries.into_iter().collect();
        // Everything between the floor and next that is not done was in flight or waiting:
        // ready now, in offset order, with its count of deliveries. Walked gap by gap (the
        // done ranges may cover most of it).
        let mut at = st.floor;
        let ranges: Vec<(u64, u64)> = st.done.0.iter().map(|(a, b)| (*a, *b)).collect();
        for (a, b) in ranges
            .into_iter()
            .chain(std::iter::once((st.next, st.next)))
        {
            for o in at..a.min(st.next) {
                let n = deliveries.get(&o).copied().unwrap_or(0);
                st.ledger.push_delivered(o, 0, 0, n, None);
            }
            at = at.max(b);
        }
        let floor = st.floor;
        st.floor = st.done.take_from(floor).max(floor);
        let c = Consumer {
            config,
            filter,
            stream,
            meta,
            state: Mutex::new(st),
            changed: tokio::sync::Notify::new(),
            persisting: Mutex::new(()),
            dead: DeadLetterStats::default(),
            members: AtomicU64::new(0),
        };
        if beyond {
            c.write_state(true)?;
        }
        Ok(c)
    }

    /// The definition.
    pub fn config(&self) -> &ConsumerConfig {
        &self.config
    }

    /// Its state now.
    pub fn info(&self) -> ConsumerInfo {
        let st = self.lock();
        ConsumerInfo {
            floor: st.floor,
            next: st.next,
            in_flight: st.ledger.in_flight_len() as u64,
            waiting: (st.ledger.ready_len() + st.ledger.delayed_len()) as u64,
            done_above_floor: st.done.len(),
            pending: self.stream.log().end_offset().saturating_sub(st.next),
            dead_lettered: self.dead.moved.load(Ordering::Relaxed),
            dead_letter_cycles: self.dead.cycles.load(Ordering::Relaxed),
            dead_letter_dropped: self.dead.dropped.load(Ordering::Relaxed),
        }
    }

    /// A new member's owner number (what it claims is in flight to it).
    pub(crate) fn member(&self) -> u64 {
        self.members.fetch_add(1, Ordering::Relaxed) + 1
    }

    /// Claims the next thing to deliver, for member `owner`, at `now`: what is due (again)
    /// first, then, when `take_new` (the member's session has room for more), the next new
    /// record. Ack timeouts are looked at either way, so a member whose session is full
    /// still redelivers what it holds when its ack wait runs out.
    pub(crate) fn step(&self, owner: u64, now: Instant, take_new: bool) -> Step {
        let mut st = self.lock();
        if st.deleted {
            return Step::Stop;
        }
        // Ack timeouts and delays that ran out: ready (again), each in its place.
        st.ledger.expire(now);
        st.ledger.promote(now);
        // Records removed by retention while waiting are done (those the ledger holds are
        // dropped as they come up).
        let first = self.stream.log().start_offset();
        if st.floor < first {
            st.floor = first;
            st.next = st.next.max(first);
            st.done.drop_below(first);
            let floor = st.floor;
            st.floor = st.done.take_from(floor);
            st.dirty = true;
        }
        if let Some(step) = st.claim_ready(owner, now) {
            return step;
        }
        // What is waiting (NACKed with a delay, scheduled) counts against max_in_flight too,
        // so the consumer's state stays bounded whatever its members do.
        let full = !take_new || st.ledger.len() >= self.config.max_in_flight as usize;
        if !full {
            let visible = self.stream.log().confirmed_offset();
            if st.next < visible {
                let o = st.next;
                st.next += 1;
                st.ledger.push(o, 0, 0);
                if let Some(step) = st.claim_ready(owner, now) {
                    return step;
                }
            }
        }
        let until = match (st.ledger.next_due(), st.dirty, st.last_persist) {
            (u, true, Some(last)) => {
                Some(u.map_or(last + PERSIST_EVERY, |u| u.min(last + PERSIST_EVERY)))
            }
            (u, true, None) => Some(u.map_or(now, |u| u.min(now))),
            (u, false, _) => u,
        };
        Step::Wait {
            until,
            // Full: new records change nothing until an acknowledgement (do not wake on them).
            tail: (!full).then_some(st.next),
        }
    }

    /// Claims what a member would deliver now, if anything: `(offset, delivery)` (tests
    /// drive consumers without a session). An offset due for its dead letter is put back
    /// (nothing is claimed then).
    #[doc(hidden)]
    pub fn claim_next(&self) -> Option<(u64, u32)> {
        match self.step(0, Instant::now(), true) {
            Step::Deliver { offset, n } => Some((offset, n)),
            Step::DeadLetter { offset, n } => {
                self.dead_letter_later(offset, n, Duration::ZERO);
                None
            }
            _ => None,
        }
    }

    /// Marks `o` done (acknowledged, filtered out, expired, dead-lettered).
    pub(crate) fn done(&self, o: u64) {
        {
            let mut st = self.lock();
            Self::finish(&mut st, o);
        }
        self.changed.notify_waiters();
    }

    fn finish(st: &mut CState, o: u64) {
        if let Some(id) = st.ids.remove(&o) {
            st.ledger.ack(id);
        }
        if o < st.floor || !st.done.insert(o) {
            return;
        }
        let floor = st.floor;
        st.floor = st.done.take_from(floor);
        st.dirty = true;
    }

    /// Acknowledges `o` (any delivery of it).
    pub fn ack(&self, o: u64) {
        self.done(o);
    }

    /// Gives back delivery `n` of `o`: due again after `delay` (a NACK), or now (its member
    /// went away). Ignored unless that delivery is the one in flight (an older one, whose
    /// ack wait ran out and which was delivered again since, changes nothing).
    pub fn give_back(&self, o: u64, n: u32, delay: Duration) {
        {
            let mut st = self.lock();
            let Some(id) = st.flight(o, Some(n)) else {
                return; // acknowledged, due again already, or delivered again since
            };
            st.ids.remove(&o);
            let how = match delay {
                Duration::ZERO => Settle::Requeue,
                d => Settle::RequeueAfter(d),
            };
            st.ledger.settle(id, how, Instant::now());
        }
        self.changed.notify_waiters();
    }

    /// Puts `o` (claimed, not delivered) off until `at` (a message scheduled for later): its
    /// claim is not counted as a delivery.
    pub(crate) fn defer(&self, o: u64, at: Instant) {
        let mut st = self.lock();
        let Some(id) = st.flight(o, None) else {
            return;
        };
        let n = st.ledger.flight(id).map_or(0, |f| f.deliveries);
        st.ids.remove(&o);
        st.ledger.ack(id);
        st.ledger
            .push_delivered(o, 0, 0, n.saturating_sub(1), Some(at));
    }

    /// Puts `o` back after `delay` (from [`Step::DeadLetter`]: its dead letter could not be
    /// kept now), delivered `n` times: it comes up as a dead letter again.
    pub(crate) fn dead_letter_later(&self, o: u64, n: u32, delay: Duration) {
        {
            let mut st = self.lock();
            if st.settled(o) {
                return;
            }
            let at = (!delay.is_zero()).then(|| Instant::now() + delay);
            st.ledger.push_delivered(o, 0, 0, n, at);
        }
        self.changed.notify_waiters();
    }

    /// Saves the position if it changed and the last save is older than [`PERSIST_EVERY`]
    /// (the meta log's writer appends it within [`crate::meta::FLUSH_EVERY`]).
    pub fn persist_if_due(&self) {
        let due = {
            let st = self.lock();
            st.dirty && st.last_persist.is_none_or(|t| t.elapsed() >= PERSIST_EVERY)
        };
        if due && let Err(e) = self.persist_now() {
            tracing::warn!(stream = %self.stream.name(), consumer = %self.config.name, "saving consumer state: {e}");
        }
    }

    /// Saves the position now (appended to the meta log at once, not waiting for its
    /// fsync).
    pub fn persist_now(&self) -> Result<(), StreamError> {
        self.write_state(false)?;
        self.meta.flush();
        Ok(())
    }

    /// Saves the position: staged for the meta log's writer, or (`define`: creation, a
    /// position moved back at start) appended with the definition and waited for.
    fn write_state(&self, define: bool) -> Result<(), StreamError> {
        let _one = self.persisting.lock().unwrap_or_else(|p| p.into_inner());
        let pos = {
            let mut st = self.lock();
            if st.deleted {
                return Ok(());
            }
            st.dirty = false;
            st.last_persist = Some(Instant::now());
            Position {
                floor: st.floor,
                next: st.next,
                done: st.done.0.iter().map(|(a, b)| (*a, *b)).collect(),
                deliveries: (st.ledger.deliveries())
                    .filter(|&(&o, n)| n > 0 && !st.settled(o))
                    .map(|(&o, n)| (o, n))
                    .collect(),
            }
        };
        let (stream, name) = (self.stream.name(), &self.config.name);
        let pos_key = record::pos_key(stream, name);
        if !define {
            self.meta.stage(pos_key, pos.encode());
            return Ok(());
        }
        let json =
            serde_json::to_vec(&self.config).map_err(|e| StreamError::Invalid(e.to_string()))?;
        let written = self.meta.put_durable(&[
            (&record::consumer_key(stream, name), &json),
            (&pos_key, &pos.encode()),
        ]);
        written.map_err(|source| {
            self.lock().dirty = true; // try again on the next change or persist
            StreamError::Log {
                name: stream.to_owned(),
                source,
            }
        })
    }

    /// Marks the consumer deleted (members stop); its records are not touched (see
    /// [`Consumer::delete`]).
    pub(crate) fn stop(&self) {
        self.lock().deleted = true;
        self.changed.notify_waiters();
    }

    /// Marks the consumer deleted (members stop) and deletes its records.
    pub(crate) fn delete(&self) -> Result<(), StreamError> {
        let _one = self.persisting.lock().unwrap_or_else(|p| p.into_inner());
        self.stop();
        let (stream, name) = (self.stream.name(), &self.config.name);
        self.meta
            .put_durable(&[
                (&record::consumer_key(stream, name), &[]),
                (&record::pos_key(stream, name), &[]),
            ])
            .map_err(|source| StreamError::Log {
                name: stream.to_owned(),
                source,
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn ranges_behave_as_a_set(ops in proptest::collection::vec(0u64..64, 0..200), floor in 0u64..64) {
            let mut r = Ranges::default();
            let mut model = std::collections::BTreeSet::new();
            for o in ops {
                prop_assert_eq!(r.insert(o), model.insert(o));
            }
            for o in 0..70 {
                prop_assert_eq!(r.contains(o), model.contains(&o), "{}", o);
            }
            prop_assert_eq!(r.len(), model.len() as u64);
            // Ranges never touch: each is separated from the next by a gap.
            let v: Vec<(u64, u64)> = r.0.iter().map(|(a, b)| (*a, *b)).collect();
            for w in v.windows(2) {
                prop_assert!(w[0].1 < w[1].0);
            }
            r.drop_below(floor);
            for o in 0..70 {
                prop_assert_eq!(r.contains(o), o >= floor && model.contains(&o), "{} after drop_below({})", o, floor);
            }
        }
    }
}
