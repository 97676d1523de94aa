//! Durable consumers: a named position in a stream shared by any number of members (a work
//! queue: each message goes to one member and is acknowledged on its own).
//!
//! State: `floor` (every offset below is done: acknowledged, filtered out, expired or
//! dead-lettered), `next` (the first offset never handed out), the done offsets above the
//! floor (as ranges), the in-flight offsets with their ack deadlines, the delivery count of
//! each offset not done, and the offsets due for (re)delivery at a time (NACK with a delay,
//! ack timeout, a member gone, a message scheduled for later).
//!
//! Persisted in the meta log (`crate::meta`): the definition as `consumer/<stream>/<name>`
//! when it is made, the position as `pos/<stream>/<name>` at most every [`PERSIST_EVERY`]
//! while it changes. After a restart every offset in `[floor, next)` that is not done is
//! delivered again (at least once): acknowledgements of the last moments before a crash may
//! be lost, so duplicates are possible and counted by the delivery count.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use hayate_core::KeyExpr;

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

#[derive(Debug, Default)]
pub(crate) struct CState {
    pub(crate) floor: u64,
    pub(crate) next: u64,
    pub(crate) done: Ranges,
    /// Offset -> (ack deadline, which delivery of it this is).
    pub(crate) in_flight: HashMap<u64, (Instant, u32)>,
    /// The same deadlines ordered, so that a step finds the expired and the earliest one
    /// without walking every message in flight.
    deadlines: BTreeSet<(Instant, u64)>,
    /// Deliveries so far of offsets not done.
    pub(crate) deliveries: HashMap<u64, u32>,
    /// (when, offset): due for delivery at that time.
    pub(crate) due: BTreeSet<(Instant, u64)>,
    pub(crate) dirty: bool,
    pub(crate) last_persist: Option<Instant>,
    pub(crate) deleted: bool,
}

impl CState {
    fn fly(&mut self, o: u64, deadline: Instant, n: u32) {
        if let Some((d, _)) = self.in_flight.insert(o, (deadline, n)) {
            self.deadlines.remove(&(d, o));
        }
        self.deadlines.insert((deadline, o));
    }

    fn land(&mut self, o: u64) -> Option<(Instant, u32)> {
        let v = self.in_flight.remove(&o)?;
        self.deadlines.remove(&(v.0, o));
        Some(v)
    }
}

/// What a member should do next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Step {
    /// Deliver `offset` (claimed: in flight now); this is its `n`th delivery.
    Deliver { offset: u64, n: u32 },
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
            state: Mutex::new(CState {
                floor: start,
                next: start,
                ..CState::default()
            }),
            config,
            filter,
            stream,
            meta,
            changed: tokio::sync::Notify::new(),
            persisting: Mutex::new(()),
            dead: DeadLetterStats::default(),
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
        let mut st = CState {
            floor,
            next: s.next.clamp(floor, end),
            ..CState::default()
        };
        for (a, b) in s.done {
            let (a, b) = (a.max(st.floor), b.min(st.next));
            if a < b {
                st.done.0.insert(a, b);
            }
        }
        st.deliveries = s
            .deliveries
            .into_iter()
            .filter(|(o, _)| *o >= st.floor && *o < st.next)
            .collect();
        // Everything between the floor and next that is not done was in flight or waiting:
        // due now. Walked gap by gap (the done ranges may cover most of it).
        let now = Instant::now();
        let mut at = st.floor;
        let ranges: Vec<(u64, u64)> = st.done.0.iter().map(|(a, b)| (*a, *b)).collect();
        for (a, b) in ranges
            .into_iter()
            .chain(std::iter::once((st.next, st.next)))
        {
            for o in at..a.min(st.next) {
                st.due.insert((now, o));
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
            in_flight: st.in_flight.len() as u64,
            waiting: st.due.len() as u64,
            done_above_floor: st.done.len(),
            pending: self.stream.log().end_offset().saturating_sub(st.next),
            dead_lettered: self.dead.moved.load(Ordering::Relaxed),
            dead_letter_cycles: self.dead.cycles.load(Ordering::Relaxed),
            dead_letter_dropped: self.dead.dropped.load(Ordering::Relaxed),
        }
    }

    fn ack_wait(&self) -> Duration {
        Duration::from_millis(self.config.ack_wait_ms)
    }

    /// Claims the next thing to deliver, at `now`: what is due (again) first, then, when
    /// `take_new` (the member's session has room for more), the next new record. Ack
    /// timeouts are looked at either way, so a member whose session is full still
    /// redelivers what it holds when its ack wait runs out.
    pub(crate) fn step(&self, now: Instant, take_new: bool) -> Step {
        let mut st = self.lock();
        if st.deleted {
            return Step::Stop;
        }
        // Ack timeouts: due again now.
        while let Some(&(d, o)) = st.deadlines.first()
            && d <= now
        {
            st.land(o);
            st.due.insert((now, o));
        }
        // Records removed by retention while waiting are done.
        let first = self.stream.log().start_offset();
        if st.floor < first {
            st.floor = first;
            st.next = st.next.max(first);
            st.done.drop_below(first);
            st.due.retain(|(_, o)| *o >= first);
            st.in_flight.retain(|o, _| *o >= first);
            st.deadlines.retain(|(_, o)| *o >= first);
            st.deliveries.retain(|o, _| *o >= first);
            let floor = st.floor;
            st.floor = st.done.take_from(floor);
            st.dirty = true;
        }
        // Waiting entries of offsets done meanwhile (a late ACK after an ack timeout) go.
        while let Some(&(at, o)) = st.due.iter().next() {
            if o >= st.floor && !st.done.contains(o) {
                break;
            }
            st.due.remove(&(at, o));
        }
        // What is waiting (NACKed with a delay, scheduled) counts against max_in_flight too,
        // so the consumer's state stays bounded whatever its members do.
        let held = st.in_flight.len() + st.due.len();
        let full = !take_new || held >= self.config.max_in_flight as usize;
        let earliest_deadline = st.deadlines.first().map(|(d, _)| *d);
        if let Some(&(at, o)) = st.due.iter().next()
            && at <= now
        {
            st.due.remove(&(at, o));
            return self.claim(&mut st, o, now);
        }
        if !full {
            let visible = self.stream.log().confirmed_offset();
            if st.next < visible {
                let o = st.next;
                st.next += 1;
                return self.claim(&mut st, o, now);
            }
        }
        let due = st.due.iter().next().map(|(t, _)| *t);
        let until = match (due, earliest_deadline) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        let until = match (until, st.dirty, st.last_persist) {
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
    /// drive consumers without a session).
    #[doc(hidden)]
    pub fn claim_next(&self) -> Option<(u64, u32)> {
        match self.step(Instant::now(), true) {
            Step::Deliver { offset, n } => Some((offset, n)),
            _ => None,
        }
    }

    fn claim(&self, st: &mut CState, o: u64, now: Instant) -> Step {
        let n = st.deliveries.entry(o).or_insert(0);
        *n += 1;
        let n = *n;
        st.fly(o, now + self.ack_wait(), n);
        st.dirty = true;
        Step::Deliver { offset: o, n }
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
        st.land(o);
        st.deliveries.remove(&o);
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
            if st.in_flight.get(&o).is_none_or(|(_, cur)| *cur != n) {
                return; // acknowledged, due again already, or delivered again since
            }
            st.land(o);
            st.due.insert((Instant::now() + delay, o));
        }
        self.changed.notify_waiters();
    }

    /// Puts `o` (claimed, not delivered) off until `at` (a message scheduled for later).
    pub(crate) fn defer(&self, o: u64, at: Instant) {
        let mut st = self.lock();
        st.land(o);
        if let Some(n) = st.deliveries.get_mut(&o) {
            *n = n.saturating_sub(1);
        }
        st.due.insert((at, o));
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
                deliveries: st.deliveries.iter().map(|(o, n)| (*o, *n)).collect(),
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
