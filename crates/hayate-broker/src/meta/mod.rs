//! The meta log `<data>/meta/`: the broker's definitions and positions as records of one
//! [`hayate_log::Log`] (fsync `always`, 1 MiB segments), read back whole at start into a
//! catalog (the live value of each key).
//!
//! - A record's key names what it describes (`stream/<name>`, `consumer/<stream>/<name>`,
//!   `pos/<stream>/<consumer>`, `format`, `snap`, and the queue stores' `ns/<ns>/…`,
//!   `next/<ns>`, `store/<ns>`, `returns/<ns>`; [`record`]); the last value of a key wins
//!   and an empty value deletes it, except a value that adds ([`record::MORE_VALUE`] of a
//!   `store/` or `returns/` key), which the catalog appends to the key's value.
//! - Definitions are appended at once ([`Meta::put`]) and their callers wait for the fsync
//!   ([`Meta::put_durable`]) before they answer.
//! - Positions are staged ([`Meta::stage`]): one writer thread appends whatever is staged
//!   in one batch at most every [`FLUSH_EVERY`] ([`Meta::flush`] at once).
//! - Compaction: once the log holds more than twice the live records' bytes plus
//!   [`COMPACT_SLACK`], every live record is appended again (a snapshot), then `snap
//!   <start>`, a sync, and the segments before `start` are removed. A crash part-way leaves
//!   a valid log: the copies are the same values.
//!
//! The format is in docs/log-format.md (*The meta log*); [`migrate`] converts the files of
//! older releases.

pub(crate) mod migrate;
pub mod record;

use std::collections::BTreeMap;
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use bytes::Bytes;
use hayate_core::sync::lock;
use hayate_log::{Entry, FsyncPolicy, Log, LogConfig, ReadLimit, Root};

/// The directory of the meta log under the storage root.
pub const DIR: &str = "meta";
/// Staged positions are appended at most this often.
pub const FLUSH_EVERY: Duration = Duration::from_millis(100);
/// Bytes the log may hold beyond twice its live records before it is compacted.
pub const COMPACT_SLACK: u64 = 1 << 20;
/// The longest a definition waits for its fsync.
const DURABLE_WAIT: Duration = Duration::from_secs(30);

#[derive(Debug, Default)]
struct State {
    /// The live value of each key.
    live: BTreeMap<String, Bytes>,
    /// Bytes the live records take in the log.
    live_bytes: u64,
    /// Positions waiting for the writer.
    pending: BTreeMap<String, Vec<u8>>,
    stop: bool,
}

#[derive(Debug)]
struct Inner {
    log: Log,
    state: Mutex<State>,
    wake: Condvar,
}

/// The meta log and its catalog. Dropping it appends what is staged.
#[derive(Debug)]
pub struct Meta {
    inner: Arc<Inner>,
    writer: Option<JoinHandle<()>>,
}

fn entry_len(key: &str, value: &[u8]) -> u64 {
    Entry {
        timestamp: 0,
        key: key.as_bytes(),
        headers: &[],
        value,
    }
    .encoded_len() as u64
}

impl Inner {
    /// Appends `records` in one batch and applies them to the catalog; returns the offset of
    /// the last one. Called with `state` locked, so that the log's order is the catalog's.
    fn append_locked(
        &self,
        st: &mut State,
        records: &[(&str, &[u8])],
    ) -> Result<u64, hayate_log::Error> {
        let range = self.log.append_batch(&entries(records.iter().copied()))?;
        for (k, v) in records {
            apply(st, k, Bytes::copy_from_slice(v));
        }
        self.compact_locked(st);
        Ok(range.end.saturating_sub(1))
    }

    fn compact_locked(&self, st: &mut State) {
        let held = self.log.stats().bytes;
        if held <= 2 * st.live_bytes + COMPACT_SLACK {
            return;
        }
        let start = self.log.end_offset();
        let snap = start.to_be_bytes();
        let live = st.live.iter().map(|(k, v)| (k.as_str(), v.as_ref()));
        let all = entries(live.chain([(record::SNAP_KEY, &snap[..])]));
        let done = self
            .log
            .append_batch(&all)
            .and_then(|_| self.log.sync())
            .and_then(|()| self.log.delete_before(start));
        match done {
            Ok(r) => {
                tracing::debug!(records = r.records, bytes = r.bytes, "meta log compacted")
            }
            Err(e) => tracing::warn!("meta log: compaction: {e}"),
        }
    }

    fn flush_locked(&self, st: &mut State) {
        if st.pending.is_empty() {
            return;
        }
        let pending = std::mem::take(&mut st.pending);
        let records: Vec<(&str, &[u8])> = pending
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_slice()))
            .collect();
        if let Err(e) = self.append_locked(st, &records) {
            tracing::warn!("meta log: saving consumer positions: {e}");
            for (k, v) in pending {
                st.pending.entry(k).or_insert(v);
            }
        }
    }

    fn run_writer(&self) {
        let mut st = lock(&self.state);
        let mut last = Instant::now();
        loop {
            if st.stop {
                self.flush_locked(&mut st);
                return;
            }
            if st.pending.is_empty() {
                st = self.wake.wait(st).unwrap_or_else(|p| p.into_inner());
                continue;
            }
            let due = last + FLUSH_EVERY;
            let now = Instant::now();
            if now < due {
                st = self
                    .wake
                    .wait_timeout(st, due - now)
                    .unwrap_or_else(|p| p.into_inner())
                    .0;
                continue;
            }
            self.flush_locked(&mut st);
            last = Instant::now();
        }
    }
}

/// Log entries of `(key, value)` records, stamped now.
fn entries<'a>(records: impl Iterator<Item = (&'a str, &'a [u8])>) -> Vec<Entry<'a>> {
    let ts = crate::stream::codec::now_ms();
    records
        .map(|(k, v)| Entry {
            timestamp: ts,
            key: k.as_bytes(),
            headers: &[],
            value: v,
        })
        .collect()
}

fn apply(st: &mut State, key: &str, mut value: Bytes) {
    if key == record::SNAP_KEY {
        return;
    }
    if let Some(all) = record::merged(key, st.live.get(key).map(|v| &v[..]), &value) {
        value = Bytes::from(all);
    }
    if let Some(old) = st.live.remove(key) {
        st.live_bytes -= entry_len(key, &old);
    }
    if !value.is_empty() {
        st.live_bytes += entry_len(key, &value);
        st.live.insert(key.to_owned(), value);
    }
}

impl Meta {
    /// Opens (or creates) the meta log in `root` and reads it back.
    pub fn open(root: &dyn Root) -> Result<Meta, hayate_log::Error> {
        let config = LogConfig {
            segment_bytes: 1 << 20,
            fsync: FsyncPolicy::Always,
            ..LogConfig::default()
        };
        let log = Log::open_in(root, DIR, config)?;
        for r in &log.recovery().repairs {
            tracing::warn!("meta log recovery: {r}");
        }
        let mut st = State::default();
        let mut at = log.start_offset();
        let limit = ReadLimit {
            confirmed_only: false,
            ..ReadLimit::default()
        };
        while at < log.end_offset() {
            let batch = log.read(at, limit)?;
            for r in batch.records {
                match std::str::from_utf8(&r.key) {
                    Ok(k) => apply(&mut st, k, r.value),
                    Err(_) => tracing::warn!(
                        offset = r.offset,
                        "meta log: a key that is not UTF-8: left out"
                    ),
                }
            }
            if batch.next <= at {
                break;
            }
            at = batch.next;
        }
        let inner = Arc::new(Inner {
            log,
            state: Mutex::new(st),
            wake: Condvar::new(),
        });
        let w = inner.clone();
        let writer = std::thread::Builder::new()
            .name("hayate-meta".into())
            .spawn(move || w.run_writer())
            .map_err(|source| hayate_log::Error::Io {
                op: "spawn",
                source,
            })?;
        Ok(Meta {
            inner,
            writer: Some(writer),
        })
    }

    /// The live value of `key`.
    pub fn get(&self, key: &str) -> Option<Bytes> {
        lock(&self.inner.state).live.get(key).cloned()
    }

    /// The live records whose key starts with `prefix`, by key.
    pub fn scan(&self, prefix: &str) -> Vec<(String, Bytes)> {
        lock(&self.inner.state)
            .live
            .range(prefix.to_owned()..)
            .take_while(|(k, _)| k.starts_with(prefix))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    }

    /// Appends `records` now (an empty value deletes its key), replacing what is staged for
    /// the same keys; returns the offset of the last one (see [`Meta::wait`]).
    pub fn put(&self, records: &[(&str, &[u8])]) -> Result<u64, hayate_log::Error> {
        let mut st = lock(&self.inner.state);
        for (k, _) in records {
            st.pending.remove(*k);
        }
        self.inner.append_locked(&mut st, records)
    }

    /// Waits (blocking) until the record at `offset` is durable.
    pub fn wait(&self, offset: u64) -> Result<(), hayate_log::Error> {
        if self.inner.log.wait_confirmed(offset, DURABLE_WAIT)? {
            Ok(())
        } else {
            Err(hayate_log::Error::Poisoned(format!(
                "no fsync within {DURABLE_WAIT:?}"
            )))
        }
    }

    /// [`Meta::put`], then [`Meta::wait`].
    pub fn put_durable(&self, records: &[(&str, &[u8])]) -> Result<(), hayate_log::Error> {
        let at = self.put(records)?;
        self.wait(at)
    }

    /// Stages `value` for `key`: the writer appends it within [`FLUSH_EVERY`] (a later
    /// stage of the same key replaces it).
    /// A value that adds ([`record::merges`], [`record::MORE_VALUE`]) is appended to
    /// what is staged for its key instead.
    pub fn stage(&self, key: String, value: Vec<u8>) {
        let mut st = lock(&self.inner.state);
        let value = match record::merged(&key, st.pending.get(&key).map(|v| &v[..]), &value) {
            Some(all) => all,
            None => value,
        };
        st.pending.insert(key, value);
        drop(st);
        self.inner.wake.notify_one();
    }

    /// Appends what is staged now.
    pub fn flush(&self) {
        let mut st = lock(&self.inner.state);
        self.inner.flush_locked(&mut st);
    }

    /// Forgets every record (an interrupted migration is done again from the start).
    pub(crate) fn reset(&self) -> Result<(), hayate_log::Error> {
        let mut st = lock(&self.inner.state);
        self.inner.log.purge()?;
        self.inner.log.sync()?;
        *st = State::default();
        Ok(())
    }

    /// The log (tests and the admin look at its size).
    pub fn log(&self) -> &Log {
        &self.inner.log
    }
}

impl Drop for Meta {
    fn drop(&mut self) {
        lock(&self.inner.state).stop = true;
        self.inner.wake.notify_one();
        if let Some(w) = self.writer.take() {
            let _ = w.join();
        }
    }
}
