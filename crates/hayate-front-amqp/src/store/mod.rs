//! Durable queues: what of a virtual host survives a restart of the broker (docs/amqp.md,
//! "Durable queues").
//!
//! One store per virtual host, in `<data>/amqp/<vhost dir>/`:
//! - `definitions.json`: the durable exchanges clients declared and the durable queues (flags,
//!   arguments, bindings), each queue with a number of its own (a queue deleted and declared
//!   again is another queue: the first one's messages do not come back into it);
//!   `definitions.log`: the changes since, one JSON line each, synced before the client's
//!   declare-ok (bind-ok, delete-ok); folded into `definitions.json` (temporary file,
//!   fsync, rename) at start and once it outgrows it.
//! - `log/`: a hayate-log with one record per persistent message and durable queue it entered
//!   (the queue's number, the exchange and routing key it is delivered with, its priority and
//!   expiry, then the message as streams store it). Appended in the publisher's task before
//!   its confirm; durable under the store's fsync policy (`[amqp] fsync`).
//! - `acks`: the offsets (8 bytes, big-endian) of records not to read back: their message
//!   left its queue (acknowledged, rejected, expired, dropped, purged, its queue deleted),
//!   or it was moved (the original, and copies a failed move left), appended every 100 ms:
//!   a message acknowledged just before a crash may come back once (at least once).
//! - `returns`: how often a quorum queue's message was given back (its id, 8 bytes, and the
//!   count, 4 bytes, big-endian; the last entry of an id counts), appended every 100 ms and
//!   rewritten with only the messages still held at start and once it has grown.
//!
//! Opening reads every record of a known queue whose offset is not in `acks` back into its
//! queue, marked redelivered, in the order the messages were first stored. Whole log
//! segments below the oldest message still held are removed as the queues move on, and
//! `acks` is rewritten without what they covered. So that one message held for long does
//! not keep every later segment, the records still held in the oldest segments are moved
//! to the log's end once the log outgrows what is held ([`Store::compact`]).
//!
//! Locks: [`Store::st`] is taken under a queue's state, never the other way round, and
//! only the log's own locks are taken under it (no append is made under it);
//! [`Store::files`] is taken before `st` when both are needed, and never under a queue's
//! lock; [`Store::flushing`] before `files`.
//!
//! # Layout
//! - this module: [`Store`], what it holds in memory of the log's records (`State`), the
//!   flush that writes it (every 100 ms), the vhost's directory name;
//! - `defs`: the definitions (exchanges, queues, bindings): `definitions.json` and
//!   `definitions.log`;
//! - `log`: the persistent messages' log (records, appends, settling, compaction);
//! - `entries`: the `acks` and `returns` files;
//! - `recovery`: opening a store and reading back what it kept ([`Recovered`]).

mod defs;
mod entries;
mod log;
mod recovery;
#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use hayate_core::sync::lock;
use hayate_log::Log;

pub(crate) use defs::{BindingDef, EdgeDef, ExchangeDef, QueueDef, table_hex, table_of_hex};
use defs::{Defs, JOURNAL_FOLD_BYTES};
use entries::{Entries, acks_bytes, read_entries, returns_bytes};

/// How often acknowledgements are written and old segments removed.
const FLUSH_EVERY: Duration = Duration::from_millis(100);

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
    /// Quorum queues' messages given back: id → times.
    returns: HashMap<u64, u32>,
    /// Ids whose count changed since the last flush.
    returned: HashSet<u64>,
    /// Appends in progress: the log's end offset before each (a lower bound of the offset
    /// it gets), with how many share it.
    in_flight: BTreeMap<u64, usize>,
    /// The bytes of the records in `live`.
    live_bytes: u64,
    /// Offsets settled since the last flush.
    acks: Vec<u64>,
    defs: Defs,
}

impl State {
    /// The lowest offset a flush must keep: the first record held or being appended, else
    /// `end` (the log's end, read under `st`).
    fn floor(&self, end: u64) -> u64 {
        let held = self.live.first_key_value().map(|(o, _)| *o);
        let appending = self.in_flight.first_key_value().map(|(o, _)| *o);
        held.into_iter().chain(appending).min().unwrap_or(end)
    }

    /// Record `o` was copied to `c` (`bytes` long, synced): the copy holds its message from
    /// now on and `o` is settled; if the message was settled meanwhile, so is the copy.
    fn moved_to(&mut self, o: u64, c: u64, bytes: u64) {
        match self.live.remove(&o) {
            Some(h) => {
                self.live_bytes = self.live_bytes - h.bytes + bytes;
                self.live.insert(c, Held { id: h.id, bytes });
                self.moved.insert(h.id, c);
                self.acks.push(o);
            }
            None => self.acks.push(c),
        }
    }
}

#[derive(Debug)]
struct Files {
    acks: Entries,
    returns: Entries,
    /// `definitions.log`: the changes since `definitions.json` was written.
    journal: std::fs::File,
    /// The size of `definitions.json` when last written.
    snapshot_bytes: u64,
}

/// The durable state of one virtual host.
pub(crate) struct Store {
    dir: PathBuf,
    log: Log,
    /// The largest record [`Store::append`] takes.
    max_record: usize,
    st: Mutex<State>,
    files: Mutex<Files>,
    /// Held by a flush (one at a time; only a flush appends moved records and removes
    /// segments): until when compaction rests after a failure.
    flushing: Mutex<Option<Instant>>,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store")
            .field("dir", &self.dir)
            .finish_non_exhaustive()
    }
}

/// The directory name of virtual host `name`: its characters a file name cannot hold (and
/// `%`) as `%XX`.
pub(crate) fn vhost_dir(name: &str) -> String {
    if name == "/" {
        return "default".into();
    }
    let mut d = String::from("vhost-");
    for b in name.bytes() {
        if b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.' {
            d.push(b as char);
        } else {
            d.push_str(&format!("%{b:02X}"));
        }
    }
    if d.len() > 120 {
        // Too long for a file name: cut, and told apart by a hash of the whole name.
        let h = hayate_front::stable_hash(name);
        let cut: String = d.chars().take(100).collect();
        d = format!("{cut}-{h:016x}");
    }
    d
}

impl Store {
    /// Starts the task that writes acknowledgements and removes old segments (every
    /// [`FLUSH_EVERY`]) until the store is dropped.
    pub(crate) fn start(self: &Arc<Self>) {
        let weak: Weak<Store> = Arc::downgrade(self);
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(FLUSH_EVERY).await;
                let Some(s) = weak.upgrade() else { return };
                // File work off the runtime's threads.
                let _ = tokio::task::spawn_blocking(move || s.flush()).await;
            }
        });
    }

    /// Compacts the log, writes the acknowledgements and return counts gathered since the
    /// last time, removes the segments no queue needs any more, folds `definitions.log`,
    /// and rewrites `acks` and `returns` when they have grown.
    pub(crate) fn flush(&self) {
        let mut paused = lock(&self.flushing);
        self.compact(&mut paused);
        let mut files = lock(&self.files);
        let rewrite_returns = files.returns.wants_rewrite();
        let (acks, floor, returned) = {
            let mut st = lock(&self.st);
            let floor = st.floor(self.log.end_offset());
            let changed = std::mem::take(&mut st.returned);
            // All counts when rewriting, else those that changed (and are still held).
            let returned: Vec<(u64, u32)> = if rewrite_returns {
                st.returns.iter().map(|(a, b)| (*a, *b)).collect()
            } else {
                changed
                    .into_iter()
                    .filter_map(|id| st.returns.get(&id).map(|n| (id, *n)))
                    .collect()
            };
            (std::mem::take(&mut st.acks), floor, returned)
        };
        let r = if rewrite_returns {
            files
                .returns
                .rewrite(&self.dir, &returns_bytes(returned.iter().copied()))
        } else if returned.is_empty() {
            Ok(())
        } else {
            files
                .returns
                .append(&returns_bytes(returned.iter().copied()))
        };
        if let Err(e) = r {
            tracing::error!(dir = %self.dir.display(), "amqp store: cannot write returns: {e}");
            // Again at the next flush.
            lock(&self.st)
                .returned
                .extend(returned.iter().map(|(id, _)| *id));
        }
        if !acks.is_empty()
            && let Err(e) = files.acks.append(&acks_bytes(acks.iter().copied()))
        {
            tracing::error!(dir = %self.dir.display(), "amqp store: cannot write acks: {e}");
            lock(&self.st).acks.extend(acks);
        }
        if floor > self.log.start_offset()
            && let Err(e) = self.log.delete_before(floor)
        {
            tracing::error!(dir = %self.dir.display(), "amqp store: cannot remove segments: {e}");
        }
        let journal = files.journal.metadata().map_or(0, |m| m.len());
        if journal >= JOURNAL_FOLD_BYTES
            && journal >= files.snapshot_bytes
            && let Err(e) = self.snapshot(&mut files)
        {
            tracing::error!(dir = %self.dir.display(), "amqp store: cannot fold definitions.log: {e}");
        }
        if files.acks.wants_rewrite() {
            // Without the offsets of removed segments.
            let start = self.log.start_offset();
            let r = read_entries::<8>(&self.dir.join("acks")).and_then(|a| {
                let mut keep: Vec<u64> = a
                    .into_iter()
                    .map(u64::from_be_bytes)
                    .filter(|o| *o >= start)
                    .collect();
                keep.sort_unstable();
                files.acks.rewrite(&self.dir, &acks_bytes(keep))
            });
            if let Err(e) = r {
                tracing::error!(dir = %self.dir.display(), "amqp store: cannot rewrite acks: {e}");
            }
        }
    }

    /// Records whose message a queue still holds (for tests).
    #[cfg(test)]
    pub(crate) fn held(&self) -> usize {
        lock(&self.st).live.len()
    }
}

impl Drop for Store {
    fn drop(&mut self) {
        self.flush();
    }
}
