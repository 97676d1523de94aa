//! The MQTT log, `<data_dir>/mqtt/`: every change to a persistent session or to the retained
//! messages is appended to it (the *journal* records) before the client is told about it,
//! so that what was acknowledged survives `kill -9` of the broker; and *checkpoints* (the
//! whole state, `persist::checkpoint`) are appended to the same log, after which the records
//! before the checkpoint's journal mark are removed. Every byte goes through the storage root
//! ([`hayate_log::Root`]).
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
//! - A checkpoint: [`Journal::mark`] (the offset P the checkpoint covers up to), the state
//!   read, [`Journal::write_checkpoint`] (one batch, synced whatever the fsync policy),
//!   [`Journal::checkpointed`] (segments below P removed). With `mqtt.journal` off nothing is
//!   pushed: the log holds checkpoints only.
//!
//! The record formats are `persist`'s; this module only buffers, writes and waits. Records
//! get keys for inspection (`persist::codec::key_of`); nothing reads them.
//!
//! # Locks
//! `writer` → `buf`. `buf` is a leaf: it is taken under outbox, delivery-state, registry and
//! retained locks, and nothing is taken under it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use std::collections::HashMap;

use hayate_log::{Entry, FsyncPolicy, Log, LogConfig, ReadLimit, Root};

use hayate_core::sync::lock;

use crate::persist::Records;
use crate::persist::checkpoint::Source;
use crate::persist::codec::key_of;

/// The background task writes what is buffered at least this often.
pub(crate) const FLUSH_EVERY: Duration = Duration::from_millis(20);
/// A push that leaves this many bytes buffered writes them at once.
pub(crate) const FLUSH_AT: usize = 1 << 20;
/// The log's directory under the data directory (`mqtt-journal/` is the journal of format 1,
/// read once by the migration).
pub(crate) const DIR: &str = "mqtt";

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
#[derive(Debug)]
struct Writer {
    /// `None` only while `failed` is set (a reopen failed).
    log: Option<Log>,
    /// The first write error: the log refuses writes from then on, until a checkpoint
    /// reopens it ([`Journal::mark`]).
    failed: Option<String>,
    /// Client id of each session generation (for the records' keys).
    names: HashMap<u64, String>,
    /// The keys of the records being written (reused).
    keys: Vec<u8>,
}

/// The MQTT journal. See the module documentation.
#[derive(Debug)]
pub(crate) struct Journal {
    root: Arc<dyn Root>,
    config: LogConfig,
    fsync: FsyncPolicy,
    writer: Mutex<Writer>,
    buf: Mutex<Pending>,
    /// Records pushed so far (raised under `buf`).
    pushed: AtomicU64,
    /// Records written (or dropped after a failure) so far (raised under `writer`, after the
    /// write); waiters are woken through `notify`.
    written: AtomicU64,
    /// While the journal is broken (a write failed, records were dropped): the number of the
    /// last record written before; `u64::MAX` when not broken. Acknowledgements that need a
    /// record after it fail until a checkpoint (which has the state the dropped records
    /// described) is on disk: records written after the failure may depend on dropped ones.
    broken_after: AtomicU64,
    /// Records written successfully so far.
    ok_upto: AtomicU64,
    /// Closed at shutdown (pushes are ignored, acknowledgements fail).
    closed: std::sync::atomic::AtomicBool,
    notify: tokio::sync::Notify,
    /// Bytes written since the last checkpoint.
    since_checkpoint: AtomicU64,
}

/// Whether what was pushed before is durable: now, or once a group commit covers it.
#[derive(Debug)]
pub(crate) enum Durable {
    Ready(Result<(), String>),
    Wait(hayate_log::Confirmed),
    /// Once the journal has written records up to this number.
    Later(Arc<Journal>, u64),
}

impl Durable {
    /// The answer if it is known without waiting.
    pub(crate) fn ready(&self) -> Option<Result<(), String>> {
        match self {
            Durable::Ready(r) => Some(r.clone()),
            Durable::Wait(_) | Durable::Later(..) => None,
        }
    }

    /// Waits for the answer.
    pub(crate) async fn wait(self) -> Result<(), String> {
        match self {
            Durable::Ready(r) => r,
            Durable::Wait(c) => c.await.map_err(|e| format!("mqtt journal: {e}")),
            Durable::Later(j, seq) => j.wait(seq).await,
        }
    }
}

impl Journal {
    /// Opens (or creates) the journal in `<data_dir>/mqtt-journal` (through the storage
    /// root) with `fsync`.
    pub(crate) fn open(
        root: Arc<dyn Root>,
        fsync: FsyncPolicy,
    ) -> Result<Journal, hayate_log::Error> {
        let config = LogConfig {
            // Small segments: a checkpoint can remove all but the active one.
            segment_bytes: 16 << 20,
            // Records carry whole MQTT messages (up to 256 MiB).
            max_record_bytes: 1 << 30,
            fsync,
            ..LogConfig::default()
        };
        let log = open_log(&*root, config)?;
        Ok(Journal {
            root,
            config,
            fsync,
            writer: Mutex::new(Writer {
                log: Some(log),
                failed: None,
                names: HashMap::new(),
                keys: Vec::new(),
            }),
            buf: Mutex::new(Pending::default()),
            pushed: AtomicU64::new(0),
            written: AtomicU64::new(0),
            broken_after: AtomicU64::new(u64::MAX),
            ok_upto: AtomicU64::new(0),
            closed: std::sync::atomic::AtomicBool::new(false),
            notify: tokio::sync::Notify::new(),
            since_checkpoint: AtomicU64::new(0),
        })
    }

    /// The storage root the log is in.
    pub(crate) fn root(&self) -> &Arc<dyn Root> {
        &self.root
    }

    /// Reads the log (at start, before any push): the last complete checkpoint and the
    /// journal after it.
    pub(crate) fn load(&self) -> Result<crate::persist::checkpoint::Loaded, String> {
        let w = lock(&self.writer);
        let Some(log) = &w.log else {
            return Err("mqtt log: not open".into());
        };
        crate::persist::checkpoint::load(log)
    }

    /// Removes every record (an interrupted migration is done again from the start).
    pub(crate) fn reset(&self) -> Result<(), String> {
        let mut w = lock(&self.writer);
        drop(w.log.take());
        self.root
            .remove_dir(DIR)
            .map_err(|e| format!("mqtt log: cannot remove: {e}"))?;
        let log = open_log(&*self.root, self.config).map_err(|e| format!("mqtt log: {e}"))?;
        w.log = Some(log);
        w.failed = None;
        Ok(())
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
        self.flush_locked(&mut w)
    }

    fn flush_locked(&self, w: &mut Writer) -> Result<u64, String> {
        let (bytes, ends, count) = {
            let mut p = lock(&self.buf);
            let count = self.pushed.load(Ordering::Acquire);
            (
                std::mem::take(&mut p.bytes),
                std::mem::take(&mut p.ends),
                count,
            )
        };
        let Writer {
            log,
            failed,
            names,
            keys,
        } = w;
        let log = match (&*failed, &*log) {
            (None, Some(log)) => log,
            (Some(e), _) => {
                // Nothing is written any more; the records are dropped (the state in memory
                // still has their changes, and the next checkpoint saves them).
                self.written.store(count, Ordering::Release);
                self.notify.notify_waiters();
                return Err(e.clone());
            }
            (None, None) => return Err("mqtt journal: not open".into()),
        };
        if ends.is_empty() {
            return Ok(log.end_offset());
        }
        let r = append(log, &bytes, &ends, false, names, keys);
        let written_bytes = bytes.len() as u64;
        // The buffer goes back for the next records (no allocation per write).
        {
            let mut bytes = bytes;
            bytes.clear();
            let mut p = lock(&self.buf);
            if p.bytes.is_empty() && bytes.capacity() <= FLUSH_AT * 2 {
                let fresh = std::mem::replace(&mut p.bytes, bytes);
                drop(fresh);
            }
        }
        if r.is_ok() {
            self.ok_upto.store(count, Ordering::Release);
        }
        self.written.store(count, Ordering::Release);
        self.notify.notify_waiters();
        match r {
            Ok(range) => {
                self.since_checkpoint
                    .fetch_add(written_bytes, Ordering::Relaxed);
                Ok(range.end)
            }
            Err(e) => {
                let e = format!("mqtt journal: {e}");
                tracing::error!(
                    "{e}; acknowledgements that need the journal fail until the next \
                     checkpoint reopens it"
                );
                *failed = Some(e.clone());
                let last_good = self.ok_upto.load(Ordering::Acquire);
                self.broken_after.fetch_min(last_good, Ordering::AcqRel);
                Err(e)
            }
        }
    }

    /// Whether records up to number `seq` were written: `None` not yet, `Some(Err)` one of
    /// them was dropped after a write error.
    fn written_upto(&self, seq: u64) -> Option<Result<(), String>> {
        if self.closed.load(Ordering::Acquire) {
            return Some(Err("mqtt journal: closed (shutting down)".into()));
        }
        if self.written.load(Ordering::Acquire) < seq {
            return None;
        }
        Some(if seq <= self.broken_after.load(Ordering::Acquire) {
            Ok(())
        } else {
            Err("mqtt journal: write failed".into())
        })
    }

    /// Whether everything pushed before this call is durable, writing it now if needed (for
    /// acknowledgements that are rare enough to pay a write each: SUBACK, UNSUBACK,
    /// PUBCOMP).
    pub(crate) fn durable(&self) -> Durable {
        let seq = self.pushed.load(Ordering::Acquire);
        if self.fsync != FsyncPolicy::Always
            && let Some(r) = self.written_upto(seq)
        {
            // Written (to the page cache) already: durable under `interval` and `never`.
            return Durable::Ready(r);
        }
        let mut w = lock(&self.writer);
        let flushed = self.flush_locked(&mut w);
        if let Some(Err(e)) = self.written_upto(seq) {
            return Durable::Ready(Err(e));
        }
        let end = match flushed {
            Ok(end) => end,
            Err(e) => return Durable::Ready(Err(e)),
        };
        match &w.log {
            Some(log) if end > 0 && log.confirmed_offset() < end => {
                Durable::Wait(log.confirmed(end - 1))
            }
            _ => Durable::Ready(Ok(())),
        }
    }

    /// Whether everything pushed before this call is durable, without writing it: the
    /// answer is ready if it was written already, else it comes once somebody writes it
    /// (the connection at the end of its read, [`Journal::flush_buffered`]; the background
    /// task within [`FLUSH_EVERY`]). For PUBACK/PUBREC: one write for every PUBLISH of a read.
    pub(crate) fn durable_later(self: &Arc<Self>) -> Durable {
        let seq = self.pushed.load(Ordering::Acquire);
        if self.fsync != FsyncPolicy::Always
            && let Some(r) = self.written_upto(seq)
        {
            return Durable::Ready(r);
        }
        Durable::Later(self.clone(), seq)
    }

    /// Waits until records up to `seq` are written, then (fsync `always`) synced.
    async fn wait(&self, seq: u64) -> Result<(), String> {
        loop {
            let notified = self.notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if let Some(r) = self.written_upto(seq) {
                r?;
                break;
            }
            notified.await;
        }
        if self.fsync != FsyncPolicy::Always {
            return Ok(());
        }
        let c = {
            let w = lock(&self.writer);
            match &w.log {
                Some(log) if log.end_offset() > log.confirmed_offset() => {
                    log.confirmed(log.end_offset() - 1)
                }
                _ => return Ok(()),
            }
        };
        c.await.map_err(|e| format!("mqtt journal: {e}"))
    }

    /// Writes what is buffered, if anything (cheap when nothing is).
    pub(crate) fn flush_buffered(&self) {
        if self.has_buffered() {
            let _ = self.flush();
        }
    }

    /// Writes what is buffered and returns the offset a checkpoint taken now covers up to.
    /// A log that failed is reopened first (what it had not written is dropped: the
    /// checkpoint, which reads the state after this, has it).
    pub(crate) fn mark(&self) -> Result<u64, String> {
        let mut w = lock(&self.writer);
        if w.failed.is_some() || w.log.is_none() {
            {
                let mut p = lock(&self.buf);
                p.bytes.clear();
                p.ends.clear();
                self.written
                    .store(self.pushed.load(Ordering::Acquire), Ordering::Release);
            }
            // Closed before the directory is opened again.
            drop(w.log.take());
            let log = open_log(&*self.root, self.config)
                .map_err(|e| format!("mqtt log: cannot reopen: {e}"))?;
            w.log = Some(log);
            w.failed = None;
            tracing::info!("mqtt log: reopened");
        } else {
            let _ = self.flush_locked(&mut w);
        }
        Ok(w.log.as_ref().map_or(0, Log::end_offset))
    }

    /// Appends a checkpoint's records (`C` … `K`) in one batch after what is buffered, and
    /// syncs them whatever the fsync policy; returns the offset of its `C`. A failure breaks
    /// the log as a failed journal write does (the next checkpoint reopens it).
    pub(crate) fn write_checkpoint(&self, recs: &Records) -> Result<u64, String> {
        let mut w = lock(&self.writer);
        let _ = self.flush_locked(&mut w);
        let Writer {
            log,
            failed,
            names,
            keys,
        } = &mut *w;
        let log = match (&*failed, &*log) {
            (None, Some(log)) => log,
            (Some(e), _) => return Err(e.clone()),
            (None, None) => return Err("mqtt log: not open".into()),
        };
        let r = append(log, &recs.bytes, &recs.ends, true, names, keys)
            .and_then(|range| log.sync().map(|()| range.start));
        r.map_err(|e| {
            let e = format!("mqtt log: checkpoint: {e}");
            *failed = Some(e.clone());
            let last_good = self.ok_upto.load(Ordering::Acquire);
            self.broken_after.fetch_min(last_good, Ordering::AcqRel);
            e
        })
    }

    /// After a checkpoint covering up to `offset` is on disk: removes the segments before it,
    /// and ends a failure (the checkpoint has what the dropped records described).
    pub(crate) fn checkpointed(&self, offset: u64) {
        self.since_checkpoint.store(0, Ordering::Relaxed);
        if self.broken_after.load(Ordering::Acquire) != u64::MAX
            && lock(&self.writer).failed.is_none()
        {
            self.broken_after.store(u64::MAX, Ordering::Release);
            tracing::info!("mqtt journal: a checkpoint covers the records dropped");
        }
        if let Some(log) = &lock(&self.writer).log
            && let Err(e) = log.delete_before(offset)
        {
            tracing::warn!("mqtt journal: cannot remove old segments: {e}");
        }
    }

    /// Bytes written since the last checkpoint.
    pub(crate) fn since_checkpoint(&self) -> u64 {
        self.since_checkpoint.load(Ordering::Relaxed)
    }

    /// Whether a write failed (the next checkpoint reopens the journal).
    pub(crate) fn failed(&self) -> bool {
        self.broken_after.load(Ordering::Acquire) != u64::MAX
    }

    /// Whether records wait in the buffer.
    pub(crate) fn has_buffered(&self) -> bool {
        self.written.load(Ordering::Acquire) < self.pushed.load(Ordering::Acquire)
    }

    /// Ignores pushes from now on (after the checkpoint at shutdown: sessions dropped then
    /// are not ended).
    pub(crate) fn close(&self) {
        lock(&self.buf).closed = true;
        self.closed.store(true, Ordering::Release);
        self.notify.notify_waiters();
    }
}

/// Appends `bytes`, cut at `ends`, as records with their keys (`snapshot`: a checkpoint's).
fn append(
    log: &Log,
    bytes: &[u8],
    ends: &[usize],
    snapshot: bool,
    names: &mut HashMap<u64, String>,
    keys: &mut Vec<u8>,
) -> hayate_log::Result<std::ops::Range<u64>> {
    keys.clear();
    let mut key_ends = Vec::with_capacity(ends.len());
    let mut start = 0;
    for &end in ends {
        key_of(&bytes[start..end], snapshot, names, keys);
        key_ends.push(keys.len());
        start = end;
    }
    let now = hayate_broker::stream::codec::now_ms();
    let mut entries = Vec::with_capacity(ends.len());
    let (mut start, mut kstart) = (0, 0);
    for (&end, &kend) in ends.iter().zip(&key_ends) {
        entries.push(Entry {
            timestamp: now,
            key: &keys[kstart..kend],
            headers: &[],
            value: &bytes[start..end],
        });
        (start, kstart) = (end, kend);
    }
    log.append_batch(&entries)
}

impl Source for Log {
    fn first(&self) -> u64 {
        self.start_offset()
    }

    fn each(&self, from: u64, f: &mut dyn FnMut(u64, &[u8]) -> bool) -> Result<(), String> {
        let mut at = from.max(self.start_offset());
        let end = self.end_offset();
        while at < end {
            let limit = ReadLimit {
                max_bytes: 8 << 20,
                max_records: 100_000,
                confirmed_only: false,
            };
            let batch = self
                .read(at, limit)
                .map_err(|e| format!("mqtt log: read at {at}: {e}"))?;
            if batch.records.is_empty() {
                break;
            }
            for r in &batch.records {
                if !f(r.offset, &r.value) {
                    return Ok(());
                }
            }
            at = batch.next;
        }
        Ok(())
    }
}

fn open_log(root: &dyn Root, config: LogConfig) -> Result<Log, hayate_log::Error> {
    let log = Log::open_in(root, DIR, config)?;
    for line in &log.recovery().repairs {
        tracing::warn!("mqtt journal: {line}");
    }
    Ok(log)
}

#[cfg(test)]
mod tests {
    use super::*;
    use hayate_log::FsRoot;

    /// Every record from `from` on, with its key.
    fn records(j: &Journal, from: u64) -> Vec<(Vec<u8>, Vec<u8>)> {
        let w = lock(&j.writer);
        let log = w.log.as_ref().unwrap();
        let mut v = Vec::new();
        let mut at = from;
        while at < log.end_offset() {
            let limit = ReadLimit {
                max_bytes: 1 << 20,
                max_records: 1000,
                confirmed_only: false,
            };
            let b = log.read(at, limit).unwrap();
            for r in &b.records {
                v.push((r.key.to_vec(), r.value.to_vec()));
            }
            at = b.next;
        }
        v
    }

    fn values(j: &Journal, from: u64) -> Vec<Vec<u8>> {
        records(j, from).into_iter().map(|(_, v)| v).collect()
    }

    #[test]
    fn pushed_records_are_written_by_durable_and_read_back_after_a_reopen() {
        let dir = std::env::temp_dir().join(format!("hayate-journal-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let policy = FsyncPolicy::Interval(Duration::from_millis(50));
        let j = Journal::open(Arc::new(FsRoot(dir.clone())), policy).unwrap();
        assert!(dir.join(DIR).is_dir());
        assert!(matches!(j.durable(), Durable::Ready(Ok(()))));
        for i in 0..3u8 {
            j.push(|b| b.extend_from_slice(&[i; 10]));
        }
        assert!(j.has_buffered());
        assert!(matches!(j.durable(), Durable::Ready(Ok(()))));
        assert!(!j.has_buffered());
        let p = j.mark().unwrap();
        assert_eq!(p, 3);
        j.push(|b| b.push(9));
        drop(j); // no flush: the record pushed last is not written (a crash)
        let j = Journal::open(Arc::new(FsRoot(dir.clone())), policy).unwrap();
        assert_eq!(values(&j, 0), vec![vec![0; 10], vec![1; 10], vec![2; 10]]);
        assert_eq!(values(&j, 2), vec![vec![2; 10]]);
        // A checkpoint at the end: nothing before it is needed.
        j.checkpointed(j.mark().unwrap());
        assert_eq!(j.since_checkpoint(), 0);
        assert!(values(&j, 3).is_empty());
        // Closed: pushes are ignored.
        j.close();
        j.push(|b| b.push(1));
        assert!(!j.has_buffered());
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// Records carry their keys: `s/<client>` for a session's, `m/<client>` for its
    /// deliveries', `r/<topic>` for a retained message, `checkpoint` for `C` and `K`; a
    /// checkpoint's session names its client for the records after it.
    #[test]
    fn records_are_keyed_by_client_and_topic() {
        use crate::delivery::Queued;
        use crate::persist::codec::{ckpt, rec};
        use hayate_core::{Key, Message};
        use hayate_mqtt::{ProtocolVersion, QoS};
        let root = Arc::new(hayate_log::FaultyRoot::new());
        let j = Journal::open(root, FsyncPolicy::Never).unwrap();
        let q = Queued {
            msg: Message::new(Key::new("t/1").unwrap(), "x"),
            qos: QoS::AtLeastOnce,
            retain: false,
            sub_id: None,
        };
        let mut m = Message::new(Key::new("a/b").unwrap(), "r");
        m.attrs.retain = true;
        j.push(|b| rec::open(b, "alice", 7, ProtocolVersion::V5, 60));
        j.push(|b| rec::queue(b, 7, 1, &q));
        j.push(|b| rec::ack(b, 7, 1));
        j.push(|b| rec::retained(b, &m));
        j.push(|b| rec::end(b, 7));
        j.push(|b| rec::ack(b, 7, 2));
        j.flush().unwrap();
        let mut recs = Records::default();
        recs.push(|b| ckpt::begin(b, 1, 0, 9));
        recs.push(|b| {
            ckpt::session_head(b, 1, "bob", 8, ProtocolVersion::V5, 10);
            b.extend_from_slice(&[0; 12]);
        });
        recs.push(|b| ckpt::owner(b, "bob", "u"));
        recs.push(|b| ckpt::end(b, 1));
        assert_eq!(j.write_checkpoint(&recs).unwrap(), 6);
        j.push(|b| rec::sub(b, 8, 1, &crate::persist::tests::sub("x", 1)));
        j.flush().unwrap();
        let keys: Vec<String> = records(&j, 0)
            .into_iter()
            .map(|(k, _)| String::from_utf8(k).unwrap())
            .collect();
        assert_eq!(
            keys,
            [
                "s/alice",
                "m/alice",
                "m/alice",
                "r/a/b",
                "s/alice",
                "g/7",
                "checkpoint",
                "s/bob",
                "s/bob",
                "checkpoint",
                "s/bob"
            ]
        );
    }
}
