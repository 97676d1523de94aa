//! The MQTT journal: every change to a persistent session or to the retained messages is
//! appended to a [`hayate_log`] log (`<data_dir>/mqtt-journal/`) before the client is told
//! about it, so that what was acknowledged survives `kill -9` of the broker.
//!
//! # How it is used
//! - Changes are *pushed* ([`Journal::push`]) where they are made, under the lock of what
//!   they change (a session's delivery state, the retained messages, the registry), so the
//!   journal's order is the order of the changes of each of them. A push copies the record
//!   into a buffer (no system call).
//! - Before an acknowledgement that promises something (PUBACK/PUBREC of a QoS 1/2 PUBLISH,
//!   SUBACK, UNSUBACK, PUBCOMP), the connection asks for [`Journal::durable`]: the buffer is
//!   written (one `pwrite` for everything buffered by every connection: concurrent callers
//!   share it) and, under fsync `always`, the acknowledgement waits for the group commit.
//!   Records nobody waits for (acknowledgements from subscribers, QoS 0 retained messages)
//!   are written by the background task within [`FLUSH_EVERY`] or once
//!   [`FLUSH_AT`] bytes are buffered.
//! - A *checkpoint* (`persist::checkpoint`) writes the whole state to `mqtt.state` together
//!   with the journal offset it covers, then removes the journal segments before that offset.
//!   At start the checkpoint is read and the journal replayed over it from that offset.
//!
//! The record formats are `persist`'s; this module only buffers, writes and waits.
//!
//! # Locks
//! `writer` → `buf`. `buf` is a leaf: it is taken under outbox, delivery-state, registry and
//! retained locks, and nothing is taken under it.

use std::path::Path;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use hayate_log::{Entry, FsyncPolicy, Log, LogConfig, ReadLimit};

use crate::lock;

/// The background task writes what is buffered at least this often.
pub(crate) const FLUSH_EVERY: Duration = Duration::from_millis(20);
/// A push that leaves this many bytes buffered writes them at once.
pub(crate) const FLUSH_AT: usize = 1 << 20;
/// The journal's directory under the data directory.
pub(crate) const DIR: &str = "mqtt-journal";

/// Records pushed and not yet written.
#[derive(Debug, Default)]
struct Pending {
    bytes: Vec<u8>,
    /// End of each record in `bytes`.
    ends: Vec<usize>,
    /// After the last checkpoint at shutdown: pushes are ignored.
    closed: bool,
}

/// The writer's state (its lock serialises writes).
#[derive(Debug, Default)]
struct Writer {
    /// The first write error: the log refuses writes from then on (until a restart).
    failed: Option<String>,
}

/// The MQTT journal. See the module documentation.
#[derive(Debug)]
pub(crate) struct Journal {
    log: Log,
    fsync: FsyncPolicy,
    writer: Mutex<Writer>,
    buf: Mutex<Pending>,
    /// Records pushed so far (raised under `buf`).
    pushed: AtomicU64,
    /// Records written so far (raised under `writer`, after the write).
    written: AtomicU64,
    /// Bytes written since the last checkpoint.
    since_checkpoint: AtomicU64,
}

/// Whether what was pushed before is durable: now, or once a group commit covers it.
#[derive(Debug)]
pub(crate) enum Durable {
    Ready(Result<(), String>),
    Wait(hayate_log::Confirmed),
}

impl Durable {
    /// The answer if it is known without waiting.
    pub(crate) fn ready(&self) -> Option<Result<(), String>> {
        match self {
            Durable::Ready(r) => Some(r.clone()),
            Durable::Wait(_) => None,
        }
    }

    /// Waits for the answer.
    pub(crate) async fn wait(self) -> Result<(), String> {
        match self {
            Durable::Ready(r) => r,
            Durable::Wait(c) => c.await.map_err(|e| format!("mqtt journal: {e}")),
        }
    }
}

impl Journal {
    /// Opens (or creates) the journal in `<data_dir>/mqtt-journal` with `fsync`.
    pub(crate) fn open(data_dir: &Path, fsync: FsyncPolicy) -> Result<Journal, hayate_log::Error> {
        let config = LogConfig {
            // Small segments: a checkpoint can remove all but the active one.
            segment_bytes: 16 << 20,
            // Records carry whole MQTT messages (up to 256 MiB).
            max_record_bytes: 1 << 30,
            fsync,
            ..LogConfig::default()
        };
        let log = Log::open_dir(data_dir.join(DIR), config)?;
        let r = log.recovery();
        for line in &r.repairs {
            tracing::warn!("mqtt journal: {line}");
        }
        Ok(Journal {
            log,
            fsync,
            writer: Mutex::new(Writer::default()),
            buf: Mutex::new(Pending::default()),
            pushed: AtomicU64::new(0),
            written: AtomicU64::new(0),
            since_checkpoint: AtomicU64::new(0),
        })
    }

    /// Every record from `from` on, in order, to `f` (at start, before any push).
    pub(crate) fn replay(
        &self,
        from: u64,
        mut f: impl FnMut(&[u8]) -> Result<(), String>,
    ) -> Result<u64, String> {
        let mut at = from.max(self.log.start_offset());
        let end = self.log.end_offset();
        let mut n = 0;
        while at < end {
            let limit = ReadLimit {
                max_bytes: 8 << 20,
                max_records: 100_000,
                confirmed_only: false,
            };
            let batch = self
                .log
                .read(at, limit)
                .map_err(|e| format!("mqtt journal: read at {at}: {e}"))?;
            if batch.records.is_empty() {
                break;
            }
            for r in &batch.records {
                f(&r.value).map_err(|e| format!("mqtt journal record {}: {e}", r.offset))?;
                n += 1;
            }
            at = batch.next;
        }
        Ok(n)
    }

    /// Appends a record: `f` writes it into the buffer.
    pub(crate) fn push(&self, f: impl FnOnce(&mut Vec<u8>)) {
        let big = {
            let mut p = lock(&self.buf);
            if p.closed {
                return;
            }
            f(&mut p.bytes);
            let end = p.bytes.len();
            p.ends.push(end);
            self.pushed.fetch_add(1, Ordering::Release);
            end >= FLUSH_AT
        };
        if big {
            let _ = self.flush();
        }
    }

    /// Writes what is buffered; returns the log's end offset after it.
    pub(crate) fn flush(&self) -> Result<u64, String> {
        let mut w = lock(&self.writer);
        let (bytes, ends, count) = {
            let mut p = lock(&self.buf);
            let count = self.pushed.load(Ordering::Acquire);
            (
                std::mem::take(&mut p.bytes),
                std::mem::take(&mut p.ends),
                count,
            )
        };
        if ends.is_empty() {
            return match &w.failed {
                Some(e) => Err(e.clone()),
                None => Ok(self.log.end_offset()),
            };
        }
        if let Some(e) = &w.failed {
            // Nothing is written any more; the records are dropped (the state in memory
            // still has their changes, and the next checkpoint saves them).
            self.written.store(count, Ordering::Release);
            return Err(e.clone());
        }
        let now = hayate_broker::stream::codec::now_ms();
        let mut entries = Vec::with_capacity(ends.len());
        let mut start = 0;
        for &end in &ends {
            entries.push(Entry {
                timestamp: now,
                key: &[],
                headers: &[],
                value: &bytes[start..end],
            });
            start = end;
        }
        let r = self.log.append_batch(&entries);
        self.written.store(count, Ordering::Release);
        match r {
            Ok(range) => {
                self.since_checkpoint
                    .fetch_add(bytes.len() as u64, Ordering::Relaxed);
                Ok(range.end)
            }
            Err(e) => {
                let e = format!("mqtt journal: {e}");
                tracing::error!("{e}; acknowledgements that need it fail until a restart");
                w.failed = Some(e.clone());
                Err(e)
            }
        }
    }

    /// Whether everything pushed before this call is durable (writes it if needed).
    pub(crate) fn durable(&self) -> Durable {
        let pushed = self.pushed.load(Ordering::Acquire);
        if self.written.load(Ordering::Acquire) >= pushed && self.fsync != FsyncPolicy::Always {
            // Written (to the page cache) already: durable under `interval` and `never` (a
            // write error is seen by whoever wrote, and by `failed` below otherwise).
            if lock(&self.writer).failed.is_none() {
                return Durable::Ready(Ok(()));
            }
        }
        let end = match self.flush() {
            Ok(end) => end,
            Err(e) => return Durable::Ready(Err(e)),
        };
        if end == 0 || self.log.confirmed_offset() >= end {
            return Durable::Ready(Ok(()));
        }
        Durable::Wait(self.log.confirmed(end - 1))
    }

    /// Writes what is buffered and returns the offset a checkpoint taken now covers up to.
    pub(crate) fn mark(&self) -> u64 {
        let _ = self.flush();
        self.log.end_offset()
    }

    /// After a checkpoint covering up to `offset`: removes the segments before it.
    pub(crate) fn checkpointed(&self, offset: u64) {
        self.since_checkpoint.store(0, Ordering::Relaxed);
        if let Err(e) = self.log.delete_before(offset) {
            tracing::warn!("mqtt journal: cannot remove old segments: {e}");
        }
    }

    /// Bytes written since the last checkpoint.
    pub(crate) fn since_checkpoint(&self) -> u64 {
        self.since_checkpoint.load(Ordering::Relaxed)
    }

    /// Whether records wait in the buffer.
    pub(crate) fn has_buffered(&self) -> bool {
        self.written.load(Ordering::Acquire) < self.pushed.load(Ordering::Acquire)
    }

    /// Ignores pushes from now on (after the checkpoint at shutdown: sessions dropped then
    /// are not ended).
    pub(crate) fn close(&self) {
        lock(&self.buf).closed = true;
    }
}
