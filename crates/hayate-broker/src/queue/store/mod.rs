//! Queue stores: what of a namespace's durable queues survives a restart (docs/amqp.md,
//! *Durable queues*; docs/log-format.md, *Queue stores*). A durable queue is a stream with
//! a durable consumer: the namespace's queues share one log of their messages, and what
//! their consumers settled is a position in the meta log.
//!
//! One store per namespace, everything through the broker's storage root:
//! - `queues/<ns dir>/` ([`dir_of`]): a hayate-log with one record per persistent message
//!   and durable queue it entered (the queue's number, the source and subject it is
//!   delivered with, its priority and expiry, then the message as streams store it),
//!   appended in the publisher's task before its confirm, durable under the store's fsync
//!   policy. A record's offset is its message's id for good.
//! - meta records ([`settled`] has the keys): the definitions (`ns/<ns>/queue/<name>`: the
//!   queue's number and its front-end's bytes; `ns/<ns>/<anything else>`: the front-end's,
//!   opaque) and `next/<ns>`, appended and synced before the caller answers; what is
//!   settled (`store/<ns>`: a floor and ranges of offsets not to read back: their message
//!   left its queue, or it was moved) and the return counts (`returns/<ns>`), handed to the
//!   meta log's writer every 100 ms as additions to the last full value (a full one again
//!   once the additions outgrow it). A message settled just before a crash may come back
//!   once (at least once).
//!
//! Opening reads every record of a known queue not settled back into its queue, marked
//! redelivered, in the order the messages were first stored, then writes what is settled as
//! a full value and waits for it: a settled range beyond the log's end (its tail lost to a
//! power loss) is cut to the end before a new record can take its offsets. Whole segments
//! below the oldest record held are removed as the queues move on; so that one message
//! held for long does not keep every later segment, the records still held in the oldest
//! segments are moved to the log's end once the log outgrows what is held
//! ([`Store::compact`]).
//!
//! Locks: [`Store::st`] is taken under a queue's state, never the other way round, and
//! only the log's own locks are taken under it (no append is made under it);
//! [`Store::defs`] is taken alone (then the meta log's); [`Store::flushing`] before `st`.
//!
//! # Layout
//! - this module: [`Store`], what it holds in memory of the log's records (`State`), the
//!   flush (every 100 ms), the definitions;
//! - `log`: the records, appends, settling, compaction;
//! - `settled`: the meta records' keys and values;
//! - `recovery`: opening a store and reading back what it kept ([`Recovered`]);
//! - `import`: the records of a namespace written from an older release's files.

#[cfg(test)]
mod crash_model;
mod import;
mod log;
mod recovery;
pub mod settled;
#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use hayate_core::sync::lock;
use hayate_log::Log;

use crate::meta::Meta;
pub use import::{Import, import, imported};
pub use recovery::{Recovered, RecoveredQueue};

/// How often what is settled is handed to the meta log and old segments removed.
pub const FLUSH_EVERY: Duration = Duration::from_millis(100);

/// Additions written after a full value, in bytes, before a full one is written again (at
/// least; or as large as the last full one).
const FULL_AFTER: usize = 64 << 10;

/// The directory of namespace `ns`'s store under the storage root: `queues/default` for
/// the default namespace (`""`), else `queues/` + [`file_name`]`("ns-", ns)`.
pub fn dir_of(ns: &str) -> String {
    if ns.is_empty() {
        return "queues/default".into();
    }
    format!("queues/{}", file_name("ns-", ns))
}

/// `prefix` and `name` with every character a file name cannot hold (and `%`) as `%XX`;
/// past 120 bytes, cut and told apart by a hash of the whole name (FNV-1a: the same in
/// every build).
pub fn file_name(prefix: &str, name: &str) -> String {
    let mut d = String::from(prefix);
    for b in name.bytes() {
        if b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.' {
            d.push(b as char);
        } else {
            d.push_str(&format!("%{b:02X}"));
        }
    }
    if d.len() > 120 {
        let h = name.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
        });
        let cut: String = d.chars().take(100).collect();
        d = format!("{cut}-{h:016x}");
    }
    d
}

/// A record whose message a queue still holds.
#[derive(Debug, Clone, Copy)]
struct Held {
    /// The message's id: the offset it was first stored at (what its queue knows it by).
    id: u64,
    /// The record's bytes on disk.
    bytes: u64,
}

#[derive(Debug, Default)]
struct State {
    /// The records whose message a queue still holds (ready or unacknowledged), by offset.
    live: BTreeMap<u64, Held>,
    /// Messages whose record is not where they were first stored: id → offset now.
    moved: HashMap<u64, u64>,
    /// Messages given back (counted): id → times.
    returns: HashMap<u64, u32>,
    /// Ids whose count changed since the last flush.
    returned: HashSet<u64>,
    /// Appends in progress: the log's end offset before each (a lower bound of the offset
    /// it gets), with how many share it.
    in_flight: BTreeMap<u64, usize>,
    /// The bytes of the records in `live`.
    live_bytes: u64,
    /// Offsets settled since the last flush.
    settled: Vec<u64>,
}

impl State {
    /// The lowest offset a flush must keep: the first record held or being appended, else
    /// `end` (the log's end, read under `st`).
    fn floor(&self, end: u64) -> u64 {
        let held = self.live.first_key_value().map(|(o, _)| *o);
        held.into_iter()
            .chain(self.appending())
            .min()
            .unwrap_or(end)
    }

    /// The lowest offset an append in progress may get.
    fn appending(&self) -> Option<u64> {
        self.in_flight.first_key_value().map(|(o, _)| *o)
    }

    /// Record `o` was copied to `c` (`bytes` long, synced): the copy holds its message from
    /// now on and `o` is settled; if the message was settled meanwhile, so is the copy.
    fn moved_to(&mut self, o: u64, c: u64, bytes: u64) {
        match self.live.remove(&o) {
            Some(h) => {
                self.live_bytes = self.live_bytes - h.bytes + bytes;
                self.live.insert(c, Held { id: h.id, bytes });
                self.moved.insert(h.id, c);
                self.settled.push(o);
            }
            None => self.settled.push(c),
        }
    }

    /// What is settled as a full `store/` value: below the floor, every offset below
    /// `end` no record held, and `extra` (settled offsets at or past where appends in
    /// progress may land).
    fn full_settled(&self, end: u64, extra: &[u64]) -> Vec<u8> {
        let floor = self.floor(end);
        let limit = self.appending().map_or(end, |a| a.min(end));
        let mut ranges = Vec::new();
        let mut at = floor;
        for &o in self.live.range(floor..limit).map(|(o, _)| o) {
            if o > at {
                ranges.push((at, o));
            }
            at = o + 1;
        }
        if at < limit {
            ranges.push((at, limit));
        }
        ranges.extend(settled::ranges_of(
            extra.iter().copied().filter(|o| *o >= limit).collect(),
        ));
        let mut v = Vec::with_capacity(13 + 16 * ranges.len());
        settled::encode_settled(true, floor, &ranges, &mut v);
        v
    }

    fn full_returns(&self) -> Vec<u8> {
        let all: Vec<(u64, u32)> = self.returns.iter().map(|(a, b)| (*a, *b)).collect();
        let mut v = Vec::with_capacity(5 + 12 * all.len());
        settled::encode_returns(true, &all, &mut v);
        v
    }
}

/// The definitions' bookkeeping, under [`Store::defs`].
#[derive(Debug, Default)]
struct Defs {
    /// Each durable queue's number, by name.
    queues: HashMap<String, u64>,
    /// The last number given.
    next_id: u64,
    /// The last number in `next/<ns>`.
    next_written: u64,
}

/// What the flush keeps between runs, under [`Store::flushing`].
#[derive(Debug, Default)]
struct Flushing {
    /// Until when compaction rests after a failure.
    paused: Option<Instant>,
    /// Bytes of additions written since the last full value (settled, returns).
    settled_more: usize,
    returns_more: usize,
    /// The size of the last full values.
    settled_full: usize,
    returns_full: usize,
    /// The floor last written.
    floor_written: u64,
}

/// The durable state of one namespace's queues.
pub struct Store {
    ns: String,
    /// The log's directory under the root (logs).
    dir: String,
    log: Log,
    meta: Arc<Meta>,
    /// The largest record [`Store::append`] takes.
    max_record: usize,
    st: Mutex<State>,
    defs: Mutex<Defs>,
    /// Held by a flush (one at a time; only a flush appends moved records and removes
    /// segments).
    flushing: Mutex<Flushing>,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store")
            .field("dir", &self.dir)
            .finish_non_exhaustive()
    }
}

impl Store {
    /// Starts the task that flushes (every [`FLUSH_EVERY`]) until the store is dropped.
    pub fn start(self: &Arc<Self>) {
        let weak: Weak<Store> = Arc::downgrade(self);
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(FLUSH_EVERY).await;
                let Some(s) = weak.upgrade() else { return };
                // Log work off the runtime's threads.
                let _ = tokio::task::spawn_blocking(move || s.flush()).await;
            }
        });
    }

    /// Compacts the log, hands what was settled and the return counts changed since the
    /// last time to the meta log's writer, and removes the segments no queue needs any
    /// more.
    pub fn flush(&self) {
        let mut fl = lock(&self.flushing);
        self.compact(&mut fl.paused);
        let (settled, returns, floor) = {
            let mut st = lock(&self.st);
            let end = self.log.end_offset();
            let floor = st.floor(end);
            let taken = std::mem::take(&mut st.settled);
            let settled = if fl.settled_more > FULL_AFTER.max(fl.settled_full) {
                let v = st.full_settled(end, &taken);
                fl.settled_full = v.len();
                fl.settled_more = 0;
                Some(v)
            } else if taken.is_empty() && floor <= fl.floor_written {
                None
            } else {
                let mut v = Vec::new();
                settled::encode_settled(false, floor, &settled::ranges_of(taken), &mut v);
                fl.settled_more += v.len();
                Some(v)
            };
            fl.floor_written = fl.floor_written.max(floor);
            let changed = std::mem::take(&mut st.returned);
            let returns = if changed.is_empty() {
                None
            } else if fl.returns_more > FULL_AFTER.max(fl.returns_full) {
                let v = st.full_returns();
                fl.returns_full = v.len();
                fl.returns_more = 0;
                Some(v)
            } else {
                let counts: Vec<(u64, u32)> = changed
                    .into_iter()
                    .filter_map(|id| st.returns.get(&id).map(|n| (id, *n)))
                    .collect();
                let mut v = Vec::new();
                settled::encode_returns(false, &counts, &mut v);
                fl.returns_more += v.len();
                Some(v)
            };
            (settled, returns, floor)
        };
        if let Some(v) = settled {
            self.meta.stage(settled::settled_key(&self.ns), v);
        }
        if let Some(v) = returns {
            self.meta.stage(settled::returns_key(&self.ns), v);
        }
        if floor > self.log.start_offset()
            && let Err(e) = self.log.delete_before(floor)
        {
            tracing::error!(dir = %self.dir, "queue store: cannot remove segments: {e}");
        }
    }

    /// Records whose message a queue still holds.
    pub fn held(&self) -> usize {
        lock(&self.st).live.len()
    }

    /// The log of the messages (tests and the admin look at its size).
    pub fn log(&self) -> &Log {
        &self.log
    }

    /// Its namespace.
    pub fn ns(&self) -> &str {
        &self.ns
    }

    /// Appends `records` (keys under `ns/<ns>/`) to the meta log and waits for them.
    fn define(&self, records: &[(&str, &[u8])]) -> Result<(), String> {
        let at = self.meta.put(records).map_err(|e| e.to_string())?;
        self.meta.wait(at).map_err(|e| e.to_string())
    }

    /// The number a new durable queue gets (kept by [`Store::put_queue`]).
    pub fn new_queue_id(&self) -> u64 {
        let mut d = lock(&self.defs);
        d.next_id += 1;
        d.next_id
    }

    /// Keeps durable queue `name`, number `id` (replacing a queue of the same name), with
    /// its front-end's `def`; waits until it is durable.
    pub fn put_queue(&self, name: &str, id: u64, def: &[u8]) -> Result<(), String> {
        self.write_queue(name, id, def, false)
    }

    /// Durable queue `name`, if it is still number `id`, has `def` now.
    pub fn set_queue(&self, name: &str, id: u64, def: &[u8]) -> Result<(), String> {
        self.write_queue(name, id, def, true)
    }

    fn write_queue(&self, name: &str, id: u64, def: &[u8], only_same: bool) -> Result<(), String> {
        let at = {
            let mut d = lock(&self.defs);
            if only_same && d.queues.get(name) != Some(&id) {
                return Ok(());
            }
            let mut value = Vec::with_capacity(8 + def.len());
            value.extend_from_slice(&id.to_be_bytes());
            value.extend_from_slice(def);
            let key = settled::queue_key(&self.ns, name);
            let next = d.next_id.max(id);
            let next_bytes = next.to_be_bytes();
            let next_key = settled::next_key(&self.ns);
            let mut records: Vec<(&str, &[u8])> = vec![(key.as_str(), &value)];
            if next > d.next_written {
                records.push((next_key.as_str(), &next_bytes));
            }
            let at = self.meta.put(&records).map_err(|e| e.to_string())?;
            d.next_written = d.next_written.max(next);
            d.queues.insert(name.to_owned(), id);
            at
        };
        self.meta.wait(at).map_err(|e| e.to_string())
    }

    /// Forgets durable queue `name` if it is still number `id` (its messages are settled
    /// by the queue).
    pub fn remove_queue(&self, name: &str, id: u64) -> Result<(), String> {
        let at = {
            let mut d = lock(&self.defs);
            if d.queues.get(name) != Some(&id) {
                return Ok(());
            }
            let key = settled::queue_key(&self.ns, name);
            let at = self.meta.put(&[(&key, &[])]).map_err(|e| e.to_string())?;
            d.queues.remove(name);
            at
        };
        self.meta.wait(at).map_err(|e| e.to_string())
    }

    /// The front-end's own definitions whose key (under `ns/<ns>/`) starts with `prefix`.
    pub fn defs(&self, prefix: &str) -> Vec<(String, bytes::Bytes)> {
        let all = settled::defs_prefix(&self.ns);
        self.meta
            .scan(&format!("{all}{prefix}"))
            .into_iter()
            .map(|(k, v)| (k[all.len()..].to_owned(), v))
            .collect()
    }

    /// Sets (or, with an empty value, removes) the front-end's own definitions, each under
    /// `ns/<ns>/<key>` (`key` is not `queue/…`: those are [`Store::put_queue`]'s), in one
    /// batch; waits until it is durable.
    pub fn put_defs(&self, changes: &[(String, Vec<u8>)]) -> Result<(), String> {
        let prefix = settled::defs_prefix(&self.ns);
        let keys: Vec<String> = changes
            .iter()
            .map(|(k, _)| format!("{prefix}{k}"))
            .collect();
        if changes.iter().any(|(k, _)| k.starts_with("queue/")) {
            return Err("queue definitions are written by put_queue".into());
        }
        let records: Vec<(&str, &[u8])> = keys
            .iter()
            .zip(changes)
            .map(|(k, (_, v))| (k.as_str(), v.as_slice()))
            .collect();
        if records.is_empty() {
            return Ok(());
        }
        self.define(&records)
    }
}

impl Drop for Store {
    fn drop(&mut self) {
        self.flush();
        self.meta.flush();
    }
}
