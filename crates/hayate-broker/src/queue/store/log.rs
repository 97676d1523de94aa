//! The persistent messages' log: one record per persistent message and durable queue it
//! entered; appends, settling, and compaction (records still held moved to the end).

use std::time::{Duration, Instant};

use bytes::{Buf, BufMut, Bytes};
use hayate_core::sync::lock;
use hayate_log::{Entry, ReadLimit, Record};

use super::{Held, Store};
use crate::queue::{QItem, QueueStore, Via};
use crate::stream::codec;

/// The record format this store writes (its first byte).
const FORMAT: u8 = 1;

/// The format of a record moved to the log's end ([`Store::compact`]): [`FORMAT`]'s head
/// with the offset the message was first stored at (its id) after the format byte.
const FORMAT_MOVED: u8 = 2;

/// Log bytes allowed beyond twice the bytes of the records still held before the oldest
/// segment's held records are moved to the end (two segments).
pub(super) const COMPACT_SLACK: u64 = 32 << 20;

/// The most segments one flush compacts (the rest wait for the next).
const COMPACT_SEGMENTS: usize = 4;

/// How long compaction waits after it failed before it tries again.
const COMPACT_PAUSE: Duration = Duration::from_secs(30);

/// Bytes a moved record's head takes beyond the original's (the log is opened with this
/// much room above the largest record [`Store::append`] accepts, so every record can move).
pub(super) const MOVED_EXTRA: usize = 8;

/// Encodes the record of `m` in durable queue `queue`: its `headers` field (`u8` format,
/// `u64` queue, `u8` priority, `u8` len + the source (an exchange), `u16` len + the
/// subject (a routing key), `i64` expiry in ms or -1, then the message's metadata as
/// streams store it).
fn encode_head(queue: u64, m: &QItem, meta: &[u8], out: &mut Vec<u8>) {
    out.clear();
    out.put_u8(FORMAT);
    out.put_u64(queue);
    out.put_u8(m.priority);
    let x = &m.via.source[..];
    out.put_u8(x.len().min(255) as u8);
    out.put_slice(&x[..x.len().min(255)]);
    let rk = &m.via.subject[..];
    let n = rk.len().min(u16::MAX as usize);
    out.put_u16(n as u16);
    out.put_slice(&rk[..n]);
    out.put_i64(m.expires.map_or(-1, codec::instant_to_ms));
    out.put_slice(meta);
}

/// A record back into its queue's number, its message's id and the message (marked
/// redelivered); `Err` says what is wrong with it.
pub(super) fn decode_record(r: &Record) -> Result<(u64, u64, QItem), String> {
    let mut h = r.headers.clone();
    let need = |h: &Bytes, n: usize| {
        if h.remaining() < n {
            Err(format!("record {}: truncated head", r.offset))
        } else {
            Ok(())
        }
    };
    need(&h, 1 + 8 + 1 + 1)?;
    let id = match h.get_u8() {
        FORMAT => r.offset,
        FORMAT_MOVED => {
            need(&h, 8 + 8 + 1 + 1)?;
            h.get_u64()
        }
        _ => return Err(format!("record {}: unknown format", r.offset)),
    };
    let queue = h.get_u64();
    let priority = h.get_u8();
    let xl = usize::from(h.get_u8());
    need(&h, xl + 2)?;
    let exchange = h.split_to(xl);
    let rl = usize::from(h.get_u16());
    need(&h, rl + 8)?;
    let rk = h.split_to(rl);
    let expires = h.get_i64();
    let meta = Record {
        offset: r.offset,
        timestamp: r.timestamp,
        key: r.key.clone(),
        headers: h,
        value: r.value.clone(),
    };
    let msg = codec::decode(&meta).map_err(|e| e.to_string())?;
    Ok((
        queue,
        id,
        QItem {
            msg,
            via: Via {
                source: exchange,
                subject: rk,
            },
            redelivered: true,
            expires: (expires >= 0).then(|| codec::ms_to_instant(expires)),
            priority,
            stored: Some(id),
            returns: 0,
        },
    ))
}

/// The head of record `r` moved to the log's end: its message keeps its id.
fn moved_head(r: &Record) -> Vec<u8> {
    match r.headers.first() {
        Some(&FORMAT) => {
            let mut h = Vec::with_capacity(r.headers.len() + 8);
            h.push(FORMAT_MOVED);
            h.extend_from_slice(&r.offset.to_be_bytes());
            h.extend_from_slice(&r.headers[1..]);
            h
        }
        _ => r.headers.to_vec(),
    }
}

/// The bytes record `r` takes in the log.
pub(super) fn record_bytes(r: &Record) -> u64 {
    Entry {
        timestamp: r.timestamp,
        key: &r.key,
        headers: &r.headers,
        value: &r.value,
    }
    .encoded_len() as u64
}

impl Store {
    /// Appends `m`, entering durable queue `queue`; returns its offset, the message's id
    /// (held from now on, until [`Store::settle`]).
    pub fn append(&self, queue: u64, m: &QItem) -> Result<u64, hayate_log::Error> {
        thread_local! {
            /// The message's metadata and the record's head, reused: no allocation per
            /// message.
            static SCRATCH: std::cell::RefCell<(Vec<u8>, Vec<u8>)> = Default::default();
        }
        SCRATCH.with_borrow_mut(|(meta, head)| {
            codec::encode_meta(&m.msg, meta);
            encode_head(queue, m, meta, head);
            let e = Entry {
                timestamp: codec::now_ms(),
                key: m.msg.key.as_bytes(),
                headers: head,
                value: &m.msg.payload,
            };
            let bytes = e.encoded_len();
            if bytes > self.max_record {
                return Err(hayate_log::Error::RecordTooLarge {
                    size: bytes,
                    max: self.max_record,
                });
            }
            // A flush must not remove the segment of a record appended but not yet in
            // `live`: the log's end before the append bounds it until then.
            let bound = {
                let mut st = lock(&self.st);
                let b = self.log.end_offset();
                *st.in_flight.entry(b).or_default() += 1;
                b
            };
            let r = self.log.append(&e);
            let mut st = lock(&self.st);
            if let Some(n) = st.in_flight.get_mut(&bound) {
                *n -= 1;
                if *n == 0 {
                    st.in_flight.remove(&bound);
                }
            }
            let o = r?;
            st.live.insert(
                o,
                Held {
                    id: o,
                    bytes: bytes as u64,
                },
            );
            st.live_bytes += bytes as u64;
            Ok(o)
        })
    }

    /// The record at `offset` is durable under the fsync policy.
    pub fn is_durable(&self, offset: u64) -> bool {
        self.log.confirmed_offset() > offset
    }

    /// Resolves once the record at `offset` is durable under the fsync policy; `None` when
    /// it is already.
    pub fn confirmed(&self, offset: u64) -> Option<hayate_log::Confirmed> {
        (!self.is_durable(offset)).then(|| self.log.confirmed(offset))
    }

    /// The message `id` (the offset [`Store::append`] gave) left its queue.
    pub fn settle(&self, id: u64) {
        let mut st = lock(&self.st);
        let offset = st.moved.remove(&id).unwrap_or(id);
        st.returns.remove(&id);
        if let Some(h) = st.live.remove(&offset) {
            st.live_bytes -= h.bytes;
            st.settled.push(offset);
        }
    }

    /// Message `id` of a quorum queue was given back: `n` times so far.
    pub fn note_return(&self, id: u64, n: u32) {
        let mut st = lock(&self.st);
        let at = st.moved.get(&id).copied().unwrap_or(id);
        if st.live.contains_key(&at) {
            st.returns.insert(id, n);
            st.returned.insert(id);
        }
    }

    /// Moves the records still held in the oldest segments to the log's end while the log
    /// is more than twice the bytes held (plus [`COMPACT_SLACK`]), so that one message
    /// held for long (a consumer that never acknowledges) does not keep every segment
    /// after it. A moved record keeps its message's id; the old one is settled once the
    /// copy is synced. A crash in between leaves both, and opening keeps the first. After a
    /// failure the copies made are settled and compaction rests for [`COMPACT_PAUSE`]
    /// (`paused`). Called by a flush, with `flushing` held.
    pub(super) fn compact(&self, paused: &mut Option<Instant>) {
        if paused.is_some_and(|t| Instant::now() < t) {
            return;
        }
        for _ in 0..COMPACT_SEGMENTS {
            let segs = self.log.segments();
            let total: u64 = segs.iter().map(|s| s.bytes).sum();
            let (Some(first), true) = (segs.first(), segs.len() > 1) else {
                return;
            };
            let held: Vec<u64> = {
                let st = lock(&self.st);
                if total <= 2 * st.live_bytes + COMPACT_SLACK {
                    return;
                }
                st.live.range(..first.next).map(|(o, _)| *o).collect()
            };
            let mut copies = Vec::with_capacity(held.len());
            let mut failed = None;
            for &o in &held {
                match self.copy_to_end(o) {
                    Ok(c) => copies.push((o, c)),
                    Err(e) => {
                        failed = Some(format!("cannot move record {o}: {e}"));
                        break;
                    }
                }
            }
            if failed.is_none()
                && !copies.is_empty()
                && let Err(e) = self.log.sync()
            {
                failed = Some(format!("cannot sync moved records: {e}"));
            }
            let mut st = lock(&self.st);
            if let Some(why) = failed {
                // The copies made must not outlive their message after a restart.
                st.settled.extend(copies.iter().map(|(_, (c, _))| *c));
                drop(st);
                tracing::error!(dir = %self.dir, "queue store: {why}; compaction rests for {COMPACT_PAUSE:?}");
                *paused = Some(Instant::now() + COMPACT_PAUSE);
                return;
            }
            for (o, (c, bytes)) in copies {
                st.moved_to(o, c, bytes);
            }
            let floor = st.floor(self.log.end_offset());
            drop(st);
            if let Err(e) = self.log.delete_before(floor) {
                tracing::error!(dir = %self.dir, "queue store: cannot remove segments: {e}");
                return;
            }
        }
    }

    /// Appends a copy of record `o` (as moved); its offset and size.
    pub(super) fn copy_to_end(&self, o: u64) -> Result<(u64, u64), hayate_log::Error> {
        let batch = self.log.read(
            o,
            ReadLimit {
                max_bytes: 0,
                max_records: 1,
                confirmed_only: false,
            },
        )?;
        let Some(r) = batch.records.first().filter(|r| r.offset == o) else {
            return Err(hayate_log::Error::OffsetOutOfRange {
                offset: o,
                start: self.log.start_offset(),
                end: self.log.end_offset(),
            });
        };
        let head = moved_head(r);
        let e = Entry {
            timestamp: r.timestamp,
            key: &r.key,
            headers: &head,
            value: &r.value,
        };
        let c = self.log.append(&e)?;
        Ok((c, e.encoded_len() as u64))
    }
}

/// Durable queues keep their messages here.
impl QueueStore for Store {
    fn append(&self, queue: u64, item: &QItem) -> Result<u64, String> {
        Store::append(self, queue, item).map_err(|e| e.to_string())
    }

    fn settle(&self, offset: u64) {
        Store::settle(self, offset);
    }

    fn note_return(&self, offset: u64, returns: u32) {
        Store::note_return(self, offset, returns);
    }

    fn remove_queue(&self, name: &str, queue: u64) -> Result<(), String> {
        Store::remove_queue(self, name, queue)
    }
}
