//! The log: a list of segments, the last one active.
//!
//! Lock order: `round` (one sync round at a time) -> `inner` (segments, the writer) ->
//! `marks.state`. Storage I/O under `inner` is limited to the append's own write (and a
//! roll's file creation); syncs, index writes and removals happen outside it.

use std::ops::Range;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::config::{FsyncPolicy, LogConfig};
use crate::error::{Error, Result};
use crate::index::{Index, SealedIndex, SealedMeta};
use crate::record::{self, Entry, Record};
use crate::recover::{self, RecoveryReport};
use crate::segment::{self, ReadPlan, SEG_HEADER_LEN, SegIndex, Segment, idx_name, log_name};
use crate::storage::{FsStorage, Storage, write_all_at};
use crate::sync::{Confirmed, Marks, lock};

/// How much one [`Log::read`] returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReadLimit {
    /// Stop before a record that would take the batch past this many bytes (on disk); the
    /// first record is returned whatever its size.
    pub max_bytes: usize,
    /// At most this many records.
    pub max_records: usize,
    /// Return only confirmed records (see [`Log::confirmed_offset`]); otherwise everything
    /// written.
    pub confirmed_only: bool,
}

impl Default for ReadLimit {
    fn default() -> Self {
        ReadLimit {
            max_bytes: 1 << 20,
            max_records: 10_000,
            confirmed_only: true,
        }
    }
}

/// Records read by [`Log::read`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Batch {
    /// Consecutive records.
    pub records: Vec<Record>,
    /// The offset to read from next.
    pub next: u64,
}

/// The log's shape at one moment.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LogStats {
    /// The first offset kept.
    pub start: u64,
    /// The next offset to be written.
    pub end: u64,
    /// Offsets below this are confirmed.
    pub confirmed: u64,
    /// Offsets below this are synced.
    pub synced: u64,
    /// Segment files.
    pub segments: usize,
    /// Bytes in segment files.
    pub bytes: u64,
}

/// One segment file: the offsets it holds and its size.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SegmentStats {
    /// Its first offset.
    pub base: u64,
    /// One past its last record.
    pub next: u64,
    /// Bytes in the file.
    pub bytes: u64,
}

/// What a removal took away.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Removed {
    /// Segment files removed.
    pub segments: usize,
    /// Records in them.
    pub records: u64,
    /// Bytes in them.
    pub bytes: u64,
}

struct Inner {
    /// Never empty; the last is the active segment.
    segments: Vec<Segment>,
    /// Sealed segments whose `.idx` is not yet written.
    pending: Vec<u64>,
    /// Sealed segments whose data is not yet synced.
    unsynced: Vec<u64>,
    /// A segment file was created since the directory was last synced.
    dir_dirty: bool,
    poisoned: Option<String>,
    closed: bool,
    buf: Vec<u8>,
}

impl Inner {
    fn active(&mut self) -> &mut Segment {
        let i = self.segments.len() - 1;
        &mut self.segments[i]
    }
    fn end(&self) -> u64 {
        self.segments.last().map_or(0, |s| s.next)
    }
    fn usable(&self) -> Result<()> {
        if self.closed {
            return Err(Error::Closed);
        }
        match &self.poisoned {
            Some(p) => Err(Error::Poisoned(p.clone())),
            None => Ok(()),
        }
    }
}

struct Shared {
    storage: Arc<dyn Storage>,
    config: LogConfig,
    inner: Mutex<Inner>,
    marks: Arc<Marks>,
    round: Mutex<()>,
}

/// A durable, segmented, append-only log. `Send + Sync`: appends are serialised inside, reads
/// run beside them.
pub struct Log {
    shared: Arc<Shared>,
    syncer: Option<JoinHandle<()>>,
    recovery: RecoveryReport,
}

impl std::fmt::Debug for Log {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Log").field("stats", &self.stats()).finish()
    }
}

impl Log {
    /// Opens (or creates) the log in `storage`, recovering from whatever a crash left.
    pub fn open(storage: Arc<dyn Storage>, config: LogConfig) -> Result<Log> {
        config.validate()?;
        let rec = recover::recover(&*storage, &config)?;
        // What recovery kept may be in the page cache only (after a process kill): sync it
        // before calling it synced.
        // (A segment trusted by its index may have been written under `never` before.)
        if config.fsync != FsyncPolicy::Never {
            for s in &rec.segments {
                s.file.sync_data().map_err(Error::io("open"))?;
            }
        }
        let end = rec.segments.last().map_or(0, |s| s.next);
        let shared = Arc::new(Shared {
            storage,
            config,
            inner: Mutex::new(Inner {
                segments: rec.segments,
                pending: rec.pending,
                unsynced: Vec::new(),
                dir_dirty: false,
                poisoned: None,
                closed: false,
                buf: Vec::new(),
            }),
            marks: Arc::new(Marks::new(
                end,
                if config.fsync == FsyncPolicy::Never {
                    0
                } else {
                    end
                },
            )),
            round: Mutex::new(()),
        });
        shared.write_pending_indexes();
        let syncer = match config.fsync {
            FsyncPolicy::Never => None,
            FsyncPolicy::Always => Some(spawn_syncer(shared.clone(), None)?),
            FsyncPolicy::Interval(d) => Some(spawn_syncer(shared.clone(), Some(d))?),
        };
        Ok(Log {
            shared,
            syncer,
            recovery: rec.report,
        })
    }

    /// Opens (or creates) the log in directory `dir`.
    pub fn open_dir(dir: impl AsRef<std::path::Path>, config: LogConfig) -> Result<Log> {
        let storage = FsStorage::new(dir).map_err(Error::io("open"))?;
        Log::open(Arc::new(storage), config)
    }

    /// Opens (or creates) the log in directory `rel` of `root`.
    pub fn open_in(root: &dyn crate::storage::Root, rel: &str, config: LogConfig) -> Result<Log> {
        let storage = root.dir(rel, true).map_err(Error::io("open"))?;
        Log::open(storage, config)
    }

    /// What opening found and repaired.
    pub fn recovery(&self) -> &RecoveryReport {
        &self.recovery
    }

    /// The configuration.
    pub fn config(&self) -> &LogConfig {
        &self.shared.config
    }

    /// Appends one record; returns its offset.
    pub fn append(&self, entry: &Entry<'_>) -> Result<u64> {
        Ok(self.append_batch(std::slice::from_ref(entry))?.start)
    }

    /// Appends records with consecutive offsets, with as few writes as segment boundaries
    /// allow; returns their offsets. On an error, a prefix of the batch may have been
    /// appended (it is readable; the caller sees it in [`Log::end_offset`]).
    pub fn append_batch(&self, entries: &[Entry<'_>]) -> Result<Range<u64>> {
        let sh = &*self.shared;
        let max = sh.config.max_record_bytes;
        if let Some(e) = entries.iter().find(|e| e.encoded_len() > max) {
            return Err(Error::RecordTooLarge {
                size: e.encoded_len(),
                max,
            });
        }
        let (range, rolled) = {
            let mut inner = lock(&sh.inner);
            inner.usable()?;
            sh.append_locked(&mut inner, entries)?
        };
        match sh.config.fsync {
            FsyncPolicy::Always => sh.marks.request(),
            FsyncPolicy::Interval(_) => sh.marks.raise(Some(range.end), None),
            FsyncPolicy::Never => {
                sh.marks.raise(Some(range.end), None);
                if rolled {
                    let _round = lock(&sh.round);
                    sh.write_pending_indexes();
                }
            }
        }
        Ok(range)
    }

    /// Resolves once `offset` is confirmed (durable under the fsync policy).
    pub fn confirmed(&self, offset: u64) -> Confirmed {
        Confirmed {
            marks: self.shared.marks.clone(),
            offset,
            registered: false,
        }
    }

    /// Blocks until `offset` is confirmed; `Ok(false)` if `timeout` passed first.
    pub fn wait_confirmed(&self, offset: u64, timeout: Duration) -> Result<bool> {
        self.shared.marks.wait(offset, timeout)
    }

    /// Syncs everything written so far now (whatever the policy), then returns.
    pub fn sync(&self) -> Result<()> {
        self.shared.sync_round()
    }

    /// Reads records from `from` on, within one segment, up to `limit`.
    pub fn read(&self, from: u64, limit: ReadLimit) -> Result<Batch> {
        let sh = &*self.shared;
        let (mut plan, sealed) = {
            let inner = lock(&sh.inner);
            let (start, end) = (inner.segments[0].base, inner.end());
            if from < start || from > end {
                return Err(Error::OffsetOutOfRange {
                    offset: from,
                    start,
                    end,
                });
            }
            let upto = if limit.confirmed_only {
                end.min(lock(&sh.marks.state).confirmed)
            } else {
                end
            };
            if from >= upto || limit.max_records == 0 {
                return Ok(Batch {
                    records: Vec::new(),
                    next: from,
                });
            }
            let i = inner.segments.partition_point(|s| s.base <= from) - 1;
            let seg = &inner.segments[i];
            let (start_pos, sealed) = seg.position_hint(from);
            let plan = ReadPlan {
                base: seg.base,
                file: seg.file.clone(),
                start: start_pos,
                end: seg.size,
                from,
                upto,
                max_bytes: limit.max_bytes,
                max_records: limit.max_records,
            };
            (plan, sealed)
        };
        if let Some(ix) = sealed
            && let Some((_, pos)) = ix.floor(u32::try_from(from - plan.base).unwrap_or(u32::MAX))
        {
            plan.start = u64::from(pos);
        }
        let mut records = Vec::new();
        segment::read(&plan, sh.config.max_body(), &mut records)?;
        let next = records.last().map_or(from, |r| r.offset + 1);
        Ok(Batch { records, next })
    }

    /// The first offset whose record has a timestamp at or after `ts` (ms), or the end.
    pub fn offset_for_time(&self, ts: i64) -> Result<u64> {
        let (mut from, end) = {
            let inner = lock(&self.shared.inner);
            let end = inner.end();
            let Some(seg) = inner
                .segments
                .iter()
                .find(|s| s.next > s.base && s.max_ts >= ts)
            else {
                return Ok(end);
            };
            let older = match &seg.index {
                SegIndex::Memory(ix) => ix.older_than(ts),
                SegIndex::File(ix) => ix.older_than(ts),
            };
            (seg.base + older.map_or(0, |r| u64::from(r) + 1), end)
        };
        let limit = ReadLimit {
            confirmed_only: false,
            ..ReadLimit::default()
        };
        while from < end {
            let b = self.read(from, limit)?;
            if let Some(r) = b.records.iter().find(|r| r.timestamp >= ts) {
                return Ok(r.offset);
            }
            if b.records.is_empty() {
                break;
            }
            from = b.next;
        }
        Ok(end)
    }

    /// The first offset kept.
    pub fn start_offset(&self) -> u64 {
        lock(&self.shared.inner).segments[0].base
    }

    /// The next offset to be written.
    pub fn end_offset(&self) -> u64 {
        lock(&self.shared.inner).end()
    }

    /// Offsets below this are durable under the fsync policy.
    pub fn confirmed_offset(&self) -> u64 {
        lock(&self.shared.marks.state).confirmed
    }

    /// Offsets below this are covered by an fsync.
    pub fn synced_offset(&self) -> u64 {
        lock(&self.shared.marks.state).synced
    }

    /// The log's shape now.
    pub fn stats(&self) -> LogStats {
        let (start, end, segments, bytes) = {
            let inner = lock(&self.shared.inner);
            let bytes = inner.segments.iter().map(|s| s.size).sum();
            (
                inner.segments[0].base,
                inner.end(),
                inner.segments.len(),
                bytes,
            )
        };
        let m = lock(&self.shared.marks.state);
        LogStats {
            start,
            end,
            confirmed: m.confirmed,
            synced: m.synced,
            segments,
            bytes,
        }
    }

    /// The segments, oldest first (the last is the active one).
    pub fn segments(&self) -> Vec<SegmentStats> {
        lock(&self.shared.inner)
            .segments
            .iter()
            .map(|s| SegmentStats {
                base: s.base,
                next: s.next,
                bytes: s.size,
            })
            .collect()
    }

    /// Removes the sealed segments the retention policy no longer keeps; `now_ms` is the
    /// current time in the records' clock.
    pub fn apply_retention(&self, now_ms: i64) -> Result<Removed> {
        let r = self.shared.config.retention;
        let inner = lock(&self.shared.inner);
        let mut bytes: u64 = inner.segments.iter().map(|s| s.size).sum();
        let mut records = inner.end() - inner.segments[0].base;
        let mut n = 0;
        while n + 1 < inner.segments.len() {
            let s = &inner.segments[n];
            let age = r
                .max_age
                .map(|a| now_ms.saturating_sub(i64::try_from(a.as_millis()).unwrap_or(i64::MAX)));
            let old = age.is_some_and(|cut| s.max_ts < cut);
            let big = r.max_bytes.is_some_and(|m| bytes - s.size >= m);
            let many = r.max_records.is_some_and(|m| records - s.records() >= m);
            if !(old || big || many) {
                break;
            }
            bytes -= s.size;
            records -= s.records();
            n += 1;
        }
        self.shared.remove_front(inner, n)
    }

    /// Removes the sealed segments all of whose records are below `offset` (consumers are
    /// done with them).
    pub fn delete_before(&self, offset: u64) -> Result<Removed> {
        let inner = lock(&self.shared.inner);
        let n = inner.segments[..inner.segments.len() - 1]
            .iter()
            .take_while(|s| s.next <= offset)
            .count();
        self.shared.remove_front(inner, n)
    }

    /// Removes every record: seals the active segment if it holds any, then removes all
    /// sealed ones. Offsets go on from where they were.
    pub fn purge(&self) -> Result<Removed> {
        let mut inner = lock(&self.shared.inner);
        inner.usable()?;
        if inner.segments.last().is_some_and(|s| s.next > s.base) {
            self.shared.roll(&mut inner)?;
        }
        let n = inner.segments.len() - 1;
        let removed = self.shared.remove_front(inner, n)?;
        self.shared.marks.request();
        Ok(removed)
    }

    /// The log's files are about to be removed (its stream is being deleted): from now on it
    /// writes, syncs, creates and removes nothing (appends fail with [`Error::Closed`]; what
    /// was written can still be read through the files already open). Waits for a sync round
    /// or an index write in progress to finish, so that once this returns no file of this
    /// log's directory is touched again, even if a new log is created there.
    pub fn discard(&self) {
        self.shared.marks.stop();
        let _round = lock(&self.shared.round);
        let mut inner = lock(&self.shared.inner);
        inner.closed = true;
        inner.pending.clear();
        inner.unsynced.clear();
        inner.dir_dirty = false;
    }

    /// Stops the syncer, syncs what was written (unless the policy is `never`) and writes the
    /// pending indexes. Dropping the log does the same.
    pub fn close(mut self) -> Result<()> {
        self.shutdown()
    }

    fn shutdown(&mut self) -> Result<()> {
        self.shared.marks.stop();
        if let Some(t) = self.syncer.take() {
            let _ = t.join();
        }
        let poisoned = lock(&self.shared.inner).poisoned.clone();
        let res = match poisoned {
            Some(p) => Err(Error::Poisoned(p)),
            None if self.shared.config.fsync == FsyncPolicy::Never => {
                let _round = lock(&self.shared.round);
                self.shared.write_pending_indexes();
                Ok(())
            }
            None => self.shared.sync_round(),
        };
        lock(&self.shared.inner).closed = true;
        res
    }
}

impl Drop for Log {
    fn drop(&mut self) {
        if !lock(&self.shared.inner).closed
            && let Err(e) = self.shutdown()
        {
            tracing::warn!("closing the log: {e}");
        }
    }
}

fn spawn_syncer(shared: Arc<Shared>, interval: Option<Duration>) -> Result<JoinHandle<()>> {
    std::thread::Builder::new()
        .name("hayate-log-sync".into())
        .spawn(move || {
            while shared.marks.next_round(interval).is_some() {
                if let Err(e) = shared.sync_round() {
                    tracing::error!("log sync failed, refusing writes: {e}");
                    break;
                }
            }
        })
        .map_err(Error::io("start the syncer"))
}

impl Shared {
    fn append_locked(
        &self,
        inner: &mut Inner,
        entries: &[Entry<'_>],
    ) -> Result<(Range<u64>, bool)> {
        let first = inner.end();
        let mut rolled = false;
        let mut i = 0;
        let cfg = &self.config;
        while i < entries.len() {
            let mut buf = std::mem::take(&mut inner.buf);
            buf.clear();
            let seg = inner.active();
            let start_i = i;
            let mut size = seg.size;
            while let Some(e) = entries.get(i) {
                let len = e.encoded_len() as u64;
                let rel = seg.next + (i - start_i) as u64 - seg.base;
                let full = size > SEG_HEADER_LEN && size + len > cfg.segment_bytes;
                if full || rel >= u64::from(u32::MAX) {
                    break;
                }
                if seg.base + rel >= u64::MAX - 1 {
                    inner.buf = buf;
                    return Err(Error::Config("offsets exhausted (u64)".into()));
                }
                record::encode(&mut buf, seg.base + rel, e);
                size += len;
                i += 1;
            }
            if i == start_i {
                inner.buf = buf;
                self.roll(inner)?;
                rolled = true;
                continue;
            }
            let seg = inner.active();
            if let Err(e) = write_all_at(&*seg.file, &buf, seg.size) {
                // Take back whatever part reached the file; if even that fails, nobody knows
                // what the file holds.
                if let Err(t) = seg.file.set_len(seg.size) {
                    inner.poisoned =
                        Some(format!("append failed ({e}) and could not be undone ({t})"));
                    self.marks.fail(&format!("append: {e}"));
                }
                inner.buf = buf;
                return Err(Error::Io {
                    op: "append",
                    source: e,
                });
            }
            let mut pos = seg.size;
            for e in &entries[start_i..i] {
                seg.max_ts = seg.max_ts.max(e.timestamp);
                let rel = (seg.next - seg.base) as u32;
                if let SegIndex::Memory(ix) = &mut seg.index {
                    ix.on_record(
                        rel,
                        pos as u32,
                        e.encoded_len(),
                        seg.max_ts,
                        cfg.index_interval_bytes,
                    );
                }
                pos += e.encoded_len() as u64;
                seg.next += 1;
            }
            seg.size = pos;
            inner.buf = buf;
        }
        Ok((first..inner.end(), rolled))
    }

    /// Seals the active segment and starts a new one at the end.
    fn roll(&self, inner: &mut Inner) -> Result<()> {
        let end = inner.end();
        let new = recover::create_segment(&*self.storage, end)?;
        let old = inner.active();
        if let SegIndex::Memory(ix) = &mut old.index
            && old.next > old.base
        {
            ix.note_time(old.max_ts, (old.next - 1 - old.base) as u32);
        }
        let base = old.base;
        inner.pending.push(base);
        inner.unsynced.push(base);
        inner.segments.push(new);
        inner.dir_dirty = true;
        Ok(())
    }

    fn poison(&self, why: String) {
        lock(&self.inner)
            .poisoned
            .get_or_insert_with(|| why.clone());
        self.marks.fail(&why);
    }

    /// One group commit: sync sealed-but-unsynced segments, the directory and the active
    /// segment, raise the marks to the end seen at the start, then write pending indexes.
    fn sync_round(&self) -> Result<()> {
        let _round = lock(&self.round);
        let (end, active, sealed, dir) = {
            let mut inner = lock(&self.inner);
            if let Some(p) = &inner.poisoned {
                return Err(Error::Poisoned(p.clone()));
            }
            if inner.closed {
                return Ok(()); // discarded (or closed): nothing more to make durable
            }
            let sealed: Vec<_> = inner
                .segments
                .iter()
                .filter(|s| inner.unsynced.contains(&s.base))
                .map(|s| (s.base, s.file.clone()))
                .collect();
            let dir = std::mem::take(&mut inner.dir_dirty);
            let active = inner.segments.last().map(|s| s.file.clone());
            (inner.end(), active, sealed, dir)
        };
        if sealed.is_empty() && !dir && lock(&self.marks.state).synced >= end {
            return Ok(()); // nothing written since the last sync
        }
        let res = (|| {
            for (_, f) in &sealed {
                f.sync_data()?;
            }
            if dir {
                self.storage.sync_dir()?;
            }
            if let Some(a) = &active {
                a.sync_data()?;
            }
            Ok::<(), std::io::Error>(())
        })();
        if let Err(e) = res {
            // After a failed fsync the kernel may have dropped the dirty pages: what is on
            // disk is unknown, so refuse further writes (reopening runs recovery).
            self.poison(format!("fsync failed: {e}"));
            return Err(Error::Io {
                op: "sync",
                source: e,
            });
        }
        lock(&self.inner)
            .unsynced
            .retain(|b| sealed.iter().all(|(s, _)| s != b));
        self.marks.raise(Some(end), Some(end));
        self.write_pending_indexes();
        Ok(())
    }

    /// Writes the `.idx` of each pending sealed segment (synced unless the policy is `never`)
    /// and switches the segment to it. A failure leaves the in-memory index in use; the next
    /// open rebuilds the file. The caller holds `round` (so that [`Log::discard`] waits for
    /// it), except at open, when nobody else has the log yet.
    fn write_pending_indexes(&self) {
        let todo: Vec<(Index, SealedMeta)> = {
            let inner = lock(&self.inner);
            let never = self.config.fsync == FsyncPolicy::Never;
            inner
                .segments
                .iter()
                .filter(|s| {
                    inner.pending.contains(&s.base) && (never || !inner.unsynced.contains(&s.base))
                })
                .filter_map(|s| match &s.index {
                    SegIndex::Memory(ix) => Some((
                        ix.clone(),
                        SealedMeta {
                            base: s.base,
                            next: s.next,
                            data_len: s.size,
                            max_ts: s.max_ts,
                        },
                    )),
                    SegIndex::File(_) => None,
                })
                .collect()
        };
        for (ix, meta) in todo {
            if lock(&self.inner).closed {
                return;
            }
            let written = (|| {
                let f = self.storage.open(&idx_name(meta.base), true)?;
                f.set_len(0)?;
                write_all_at(&*f, &ix.encode(&meta), 0)?;
                if self.config.fsync != FsyncPolicy::Never {
                    f.sync_data()?;
                }
                Ok::<_, std::io::Error>(f)
            })();
            let mut inner = lock(&self.inner);
            inner.pending.retain(|b| *b != meta.base);
            match written.ok().and_then(SealedIndex::load) {
                Some((sealed, _)) => {
                    if let Some(s) = inner.segments.iter_mut().find(|s| s.base == meta.base) {
                        s.index = SegIndex::File(sealed);
                    }
                }
                None => tracing::warn!(
                    "segment {}: could not write its index; kept in memory",
                    meta.base
                ),
            }
        }
    }

    fn remove_front(
        &self,
        mut inner: std::sync::MutexGuard<'_, Inner>,
        n: usize,
    ) -> Result<Removed> {
        let gone: Vec<Segment> = inner.segments.drain(..n).collect();
        inner.pending.retain(|b| gone.iter().all(|s| s.base != *b));
        inner.unsynced.retain(|b| gone.iter().all(|s| s.base != *b));
        drop(inner);
        let mut removed = Removed::default();
        // Oldest first, each removal made durable before the next (unless `never`): a crash
        // part-way then leaves a shorter log, never a hole (which recovery would have to
        // take for an interrupted retention).
        for s in &gone {
            removed.segments += 1;
            removed.records += s.records();
            removed.bytes += s.size;
            // Under `round`, so that a discarded log removes nothing from a directory that a
            // new log may now use (`discard` waits for `round`).
            let _round = lock(&self.round);
            if lock(&self.inner).closed {
                continue;
            }
            self.storage
                .remove(&log_name(s.base))
                .map_err(Error::io("remove segment"))?;
            let _ = self.storage.remove(&idx_name(s.base));
            if self.config.fsync != FsyncPolicy::Never {
                self.storage
                    .sync_dir()
                    .map_err(Error::io("remove segment"))?;
            }
        }
        Ok(removed)
    }
}
