//! Sparse offset and time indexes: in memory for the active segment, one `.idx` file per
//! sealed segment (written once, after the segment's data is synced, and checked by CRC when
//! the log is opened).
//!
//! ```text
//! .idx file
//! 0   8 bytes  magic "HYTIDX01"
//! 8   u64 LE   base offset
//! 16  u64 LE   next offset (one past the segment's last record)
//! 24  u64 LE   length of the .log file in bytes
//! 32  i64 LE   largest timestamp in the segment (i64::MIN when empty)
//! 40  u32 LE   N, offset entries;  44 u32 LE T, time entries
//! 48  N x (u32 LE offset - base, u32 LE byte position)
//!     T x (i64 LE largest timestamp up to the record, u32 LE offset - base)
//! end u32 LE   CRC-32C of every byte before it
//! ```

use std::sync::Arc;

use crate::storage::{StorageFile, read_full_at};

pub(crate) const IDX_MAGIC: &[u8; 8] = b"HYTIDX01";
pub(crate) const IDX_HEADER_LEN: u64 = 48;
const OFF_ENTRY: u64 = 8;
const TIME_ENTRY: u64 = 12;

/// The index of one segment while it is being written.
#[derive(Debug, Default, Clone)]
pub(crate) struct Index {
    /// (offset - base, byte position), ascending in both.
    pub(crate) offsets: Vec<(u32, u32)>,
    /// (largest timestamp of records up to and including this one, offset - base): all
    /// records at or below the offset have timestamps at or below the first field.
    pub(crate) times: Vec<(i64, u32)>,
    bytes_since: u64,
}

impl Index {
    /// Notes the record at `rel`/`pos` of `len` bytes, `max_ts` being the largest timestamp
    /// up to and including it.
    pub(crate) fn on_record(&mut self, rel: u32, pos: u32, len: usize, max_ts: i64, interval: u32) {
        if self.offsets.is_empty() || self.bytes_since >= u64::from(interval) {
            self.offsets.push((rel, pos));
            self.bytes_since = 0;
            self.note_time(max_ts, rel);
        }
        self.bytes_since += len as u64;
    }

    /// Adds a time entry if `max_ts` is above the last one.
    pub(crate) fn note_time(&mut self, max_ts: i64, rel: u32) {
        if self.times.last().is_none_or(|&(t, _)| max_ts > t) {
            self.times.push((max_ts, rel));
        }
    }

    /// The last entry at or below `rel`.
    pub(crate) fn floor(&self, rel: u32) -> Option<(u32, u32)> {
        let i = self.offsets.partition_point(|&(r, _)| r <= rel);
        i.checked_sub(1).map(|i| self.offsets[i])
    }

    /// The offset (relative) after which records may have timestamps at or above `ts`:
    /// `Some(r)` means every record at or below `r` is older than `ts`.
    pub(crate) fn older_than(&self, ts: i64) -> Option<u32> {
        let i = self.times.partition_point(|&(t, _)| t < ts);
        i.checked_sub(1).map(|i| self.times[i].1)
    }

    /// Encodes the `.idx` file.
    pub(crate) fn encode(&self, meta: &SealedMeta) -> Vec<u8> {
        let mut b = Vec::with_capacity(
            IDX_HEADER_LEN as usize + self.offsets.len() * 8 + self.times.len() * 12 + 4,
        );
        b.extend_from_slice(IDX_MAGIC);
        b.extend_from_slice(&meta.base.to_le_bytes());
        b.extend_from_slice(&meta.next.to_le_bytes());
        b.extend_from_slice(&meta.data_len.to_le_bytes());
        b.extend_from_slice(&meta.max_ts.to_le_bytes());
        b.extend_from_slice(&(self.offsets.len() as u32).to_le_bytes());
        b.extend_from_slice(&(self.times.len() as u32).to_le_bytes());
        for &(r, p) in &self.offsets {
            b.extend_from_slice(&r.to_le_bytes());
            b.extend_from_slice(&p.to_le_bytes());
        }
        for &(t, r) in &self.times {
            b.extend_from_slice(&t.to_le_bytes());
            b.extend_from_slice(&r.to_le_bytes());
        }
        let crc = crc32c::crc32c(&b);
        b.extend_from_slice(&crc.to_le_bytes());
        b
    }
}

/// What a sealed segment's `.idx` file says about it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SealedMeta {
    pub(crate) base: u64,
    pub(crate) next: u64,
    pub(crate) data_len: u64,
    pub(crate) max_ts: i64,
}

/// A sealed segment's index, read from its file on demand (only the metadata stays in memory).
#[derive(Debug, Clone)]
pub(crate) struct SealedIndex {
    file: Arc<dyn StorageFile>,
    n_off: u64,
    n_time: u64,
}

fn le_u32(b: &[u8]) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[..4]);
    u32::from_le_bytes(a)
}

fn le_u64(b: &[u8]) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[..8]);
    u64::from_le_bytes(a)
}

impl SealedIndex {
    /// Reads and checks an `.idx` file: magic, lengths, CRC, and that entries ascend and stay
    /// inside the segment. `None` when anything is off (the caller rebuilds it by a scan).
    pub(crate) fn load(file: Arc<dyn StorageFile>) -> Option<(SealedIndex, SealedMeta)> {
        let len = file.len().ok()?;
        if !(IDX_HEADER_LEN + 4..=64 << 20).contains(&len) {
            return None;
        }
        let mut b = vec![0u8; usize::try_from(len).ok()?];
        if read_full_at(&*file, &mut b, 0).ok()? != b.len() {
            return None;
        }
        let (body, crc) = b.split_at(b.len() - 4);
        if &body[..8] != IDX_MAGIC || crc32c::crc32c(body) != le_u32(crc) {
            return None;
        }
        let meta = SealedMeta {
            base: le_u64(&body[8..]),
            next: le_u64(&body[16..]),
            data_len: le_u64(&body[24..]),
            max_ts: le_u64(&body[32..]) as i64,
        };
        let n_off = u64::from(le_u32(&body[40..]));
        let n_time = u64::from(le_u32(&body[44..]));
        if IDX_HEADER_LEN + n_off * OFF_ENTRY + n_time * TIME_ENTRY != body.len() as u64
            || meta.next < meta.base
        {
            return None;
        }
        let idx = SealedIndex {
            file,
            n_off,
            n_time,
        };
        let span = meta.next - meta.base;
        let mut prev: Option<(u32, u32)> = None;
        for i in 0..n_off {
            let at = (IDX_HEADER_LEN + i * OFF_ENTRY) as usize;
            let e = (le_u32(&body[at..]), le_u32(&body[at + 4..]));
            if u64::from(e.0) >= span.max(1)
                || u64::from(e.1) >= meta.data_len
                || prev.is_some_and(|p| p.0 >= e.0 || p.1 >= e.1)
            {
                return None;
            }
            prev = Some(e);
        }
        Some((idx, meta))
    }

    fn read_entry(&self, at: u64, n: usize) -> Option<[u8; 12]> {
        let mut b = [0u8; 12];
        (read_full_at(&*self.file, &mut b[..n], at).ok()? == n).then_some(b)
    }

    fn offset_entry(&self, i: u64) -> Option<(u32, u32)> {
        let b = self.read_entry(IDX_HEADER_LEN + i * OFF_ENTRY, 8)?;
        Some((le_u32(&b), le_u32(&b[4..])))
    }

    fn time_entry(&self, i: u64) -> Option<(i64, u32)> {
        let b = self.read_entry(IDX_HEADER_LEN + self.n_off * OFF_ENTRY + i * TIME_ENTRY, 12)?;
        Some((le_u64(&b) as i64, le_u32(&b[8..])))
    }

    /// The last entry at or below `rel`; `None` also when the file cannot be read (the caller
    /// then scans from the segment's start, which is slower but right).
    pub(crate) fn floor(&self, rel: u32) -> Option<(u32, u32)> {
        let (mut lo, mut hi) = (0u64, self.n_off); // first entry above rel is in [lo, hi]
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            if self.offset_entry(mid)?.0 <= rel {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        lo.checked_sub(1).and_then(|i| self.offset_entry(i))
    }

    /// As [`Index::older_than`].
    pub(crate) fn older_than(&self, ts: i64) -> Option<u32> {
        let (mut lo, mut hi) = (0u64, self.n_time);
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            if self.time_entry(mid)?.0 < ts {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        lo.checked_sub(1)
            .and_then(|i| self.time_entry(i))
            .map(|(_, r)| r)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::{FaultyStorage, Storage, write_all_at};

    fn built() -> (Index, SealedMeta) {
        let mut ix = Index::default();
        let mut max = i64::MIN;
        for rel in 0..1000u32 {
            let ts = i64::from(rel % 97) * 10 + i64::from(rel);
            max = max.max(ts);
            ix.on_record(rel, 16 + rel * 100, 100, max, 1000);
        }
        ix.note_time(max, 999);
        (
            ix,
            SealedMeta {
                base: 5000,
                next: 6000,
                data_len: 16 + 100_000,
                max_ts: max,
            },
        )
    }

    #[test]
    fn sealed_file_answers_as_the_memory_index_does() {
        let (ix, meta) = built();
        let s = FaultyStorage::new();
        let f = s.open("x.idx", true).unwrap();
        write_all_at(&*f, &ix.encode(&meta), 0).unwrap();
        let (sealed, m) = SealedIndex::load(f).unwrap();
        assert_eq!(m, meta);
        for rel in 0..1000 {
            assert_eq!(sealed.floor(rel), ix.floor(rel), "rel {rel}");
        }
        for ts in [i64::MIN, -1, 0, 5, 500, 1000, 1500, 2000, i64::MAX] {
            assert_eq!(sealed.older_than(ts), ix.older_than(ts), "ts {ts}");
        }
    }

    #[test]
    fn damaged_index_files_are_refused() {
        let (ix, meta) = built();
        let good = ix.encode(&meta);
        let s = FaultyStorage::new();
        for cut in [0, 10, 48, good.len() - 1] {
            s.set_contents("x.idx", good[..cut].to_vec());
            assert!(
                SealedIndex::load(s.open("x.idx", false).unwrap()).is_none(),
                "cut {cut}"
            );
        }
        for at in [0, 9, 30, 60, good.len() - 2] {
            let mut bad = good.clone();
            bad[at] ^= 0x40;
            s.set_contents("x.idx", bad);
            assert!(
                SealedIndex::load(s.open("x.idx", false).unwrap()).is_none(),
                "flip at {at}"
            );
        }
    }
}
