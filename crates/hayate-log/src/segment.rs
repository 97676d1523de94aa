//! One segment file: its header, the scan that recovery and index rebuilding use, and the
//! read of a run of records.
//!
//! ```text
//! NNNNNNNNNNNNNNNNNNNN.log   (the base offset, 20 digits)
//! 0   8 bytes  magic "HYTLOG01"
//! 8   u64 LE   base offset (the offset of the first record, equal to the name)
//! 16  records, back to back (record.rs)
//! ```

use std::sync::Arc;

use bytes::{Bytes, BytesMut};

use crate::config::LogConfig;
use crate::error::{Error, Result};
use crate::index::{Index, SealedIndex};
use crate::record::{self, Corruption, Record};
use crate::storage::map::MAP_MIN;
use crate::storage::{StorageFile, read_full_at};

pub(crate) const SEG_MAGIC: &[u8; 8] = b"HYTLOG01";
pub(crate) const SEG_HEADER_LEN: u64 = 16;

pub(crate) fn log_name(base: u64) -> String {
    format!("{base:020}.log")
}

pub(crate) fn idx_name(base: u64) -> String {
    format!("{base:020}.idx")
}

/// The base offset named by a segment or index file name, and whether it is the index.
pub(crate) fn parse_name(name: &str) -> Option<(u64, bool)> {
    let (stem, is_idx) = match (name.strip_suffix(".log"), name.strip_suffix(".idx")) {
        (Some(s), _) => (s, false),
        (_, Some(s)) => (s, true),
        _ => return None,
    };
    (stem.len() == 20 && stem.bytes().all(|b| b.is_ascii_digit()))
        .then(|| stem.parse().ok())
        .flatten()
        .map(|b| (b, is_idx))
}

pub(crate) fn header(base: u64) -> [u8; SEG_HEADER_LEN as usize] {
    let mut h = [0u8; SEG_HEADER_LEN as usize];
    h[..8].copy_from_slice(SEG_MAGIC);
    h[8..].copy_from_slice(&base.to_le_bytes());
    h
}

/// How a segment's index is held.
#[derive(Debug, Clone)]
pub(crate) enum SegIndex {
    /// In memory: the active segment, and sealed ones whose `.idx` is not written yet.
    Memory(Index),
    /// In the segment's `.idx` file.
    File(SealedIndex),
}

/// One segment as the log holds it.
#[derive(Debug)]
pub(crate) struct Segment {
    pub(crate) base: u64,
    pub(crate) file: Arc<dyn StorageFile>,
    /// One past the last record.
    pub(crate) next: u64,
    /// Valid bytes, header included; appends go here.
    pub(crate) size: u64,
    /// The largest timestamp in it (`i64::MIN` when empty).
    pub(crate) max_ts: i64,
    pub(crate) index: SegIndex,
}

impl Segment {
    pub(crate) fn records(&self) -> u64 {
        self.next - self.base
    }

    /// The byte position to start reading at for `offset` (at or before its record).
    pub(crate) fn position_hint(&self, offset: u64) -> (u64, Option<SealedIndex>) {
        let rel = u32::try_from(offset.saturating_sub(self.base)).unwrap_or(u32::MAX);
        match &self.index {
            SegIndex::Memory(ix) => (
                ix.floor(rel).map_or(SEG_HEADER_LEN, |(_, p)| u64::from(p)),
                None,
            ),
            SegIndex::File(f) => (SEG_HEADER_LEN, Some(f.clone())),
        }
    }
}

/// What a scan of a segment found.
#[derive(Debug)]
pub(crate) struct Scan {
    pub(crate) index: Index,
    pub(crate) next: u64,
    /// Bytes up to the end of the last valid record.
    pub(crate) valid_len: u64,
    pub(crate) max_ts: i64,
    /// Why the scan stopped before the end of the file, if it did.
    pub(crate) damage: Option<Damage>,
}

/// Why a scan stopped early.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Damage {
    /// The file ends inside a record.
    TornRecord,
    /// The bytes there are not a record.
    Corrupt(Corruption),
    /// The segment header is missing or wrong.
    Header,
}

const SCAN_CHUNK: usize = 1 << 20;

/// Reads a whole segment, checking every record, and rebuilds its index.
pub(crate) fn scan(file: &dyn StorageFile, base: u64, cfg: &LogConfig) -> Result<Scan> {
    let len = file.len().map_err(Error::io("scan"))?;
    let mut out = Scan {
        index: Index::default(),
        next: base,
        valid_len: SEG_HEADER_LEN,
        max_ts: i64::MIN,
        damage: None,
    };
    let mut h = [0u8; SEG_HEADER_LEN as usize];
    if read_full_at(file, &mut h, 0).map_err(Error::io("scan"))? != h.len() || h != header(base) {
        out.valid_len = 0;
        out.damage = Some(Damage::Header);
        return Ok(out);
    }
    let max_body = cfg.max_body();
    let mut buf: Vec<u8> = Vec::new();
    let mut buf_pos = SEG_HEADER_LEN; // file position of buf[0]
    let mut at = 0usize; // cursor in buf
    loop {
        let pos = buf_pos + at as u64;
        match record::check(&buf[at..], max_body) {
            Ok(Ok(l)) => {
                if l.offset != out.next || l.offset == u64::MAX {
                    out.damage = Some(Damage::Corrupt(Corruption::Offset {
                        expected: out.next,
                        found: l.offset,
                    }));
                    break;
                }
                out.max_ts = out.max_ts.max(l.timestamp);
                let rel = u32::try_from(l.offset - base).unwrap_or(u32::MAX);
                out.index
                    .on_record(rel, pos as u32, l.len, out.max_ts, cfg.index_interval_bytes);
                out.next += 1;
                at += l.len;
                out.valid_len = pos + l.len as u64;
            }
            Ok(Err(need)) => {
                if pos >= len {
                    break; // clean end
                }
                if pos + need as u64 > len {
                    out.damage = Some(Damage::TornRecord);
                    break;
                }
                // Keep the unread tail, read at least what the record needs.
                buf.drain(..at);
                buf_pos = pos;
                at = 0;
                let want = need
                    .max(SCAN_CHUNK)
                    .min(usize::try_from(len - pos).unwrap_or(usize::MAX));
                let have = buf.len();
                buf.resize(want.max(have), 0);
                let n = read_full_at(file, &mut buf[have..], pos + have as u64)
                    .map_err(Error::io("scan"))?;
                buf.truncate(have + n);
                if n == 0 {
                    out.damage = Some(Damage::TornRecord);
                    break;
                }
            }
            Err(c) => {
                out.damage = Some(Damage::Corrupt(c));
                break;
            }
        }
    }
    if out.next > base {
        out.index.note_time(
            out.max_ts,
            u32::try_from(out.next - 1 - base).unwrap_or(u32::MAX),
        );
    }
    Ok(out)
}

/// What to read from one segment.
#[derive(Debug, Clone)]
pub(crate) struct ReadPlan {
    pub(crate) base: u64,
    pub(crate) file: Arc<dyn StorageFile>,
    pub(crate) start: u64,
    pub(crate) end: u64,
    pub(crate) from: u64,
    /// Records at or above this offset are not returned.
    pub(crate) upto: u64,
    pub(crate) max_bytes: usize,
    pub(crate) max_records: usize,
}

/// What to do after taking one record.
enum Took {
    More,
    Done,
}

/// Reads the records of one segment in `[plan.from, plan.upto)` that fit the limits (at least
/// one whole record when there is one, however large).
///
/// Records of [`MAP_MIN`] bytes or more are not copied where the storage can map them
/// (zero-copy: the record's fields are slices of a read-only mapping of the file); smaller ones
/// are read in chunks, one copy each.
pub(crate) fn read(plan: &ReadPlan, max_body: u32, out: &mut Vec<Record>) -> Result<()> {
    let mut pos = plan.start;
    let mut bytes = 0usize;
    let corrupt = |pos: u64, kind| Error::Corrupt {
        segment: plan.base,
        position: pos,
        kind,
    };
    // Takes one checked record (`frame` starts at it): skips it below `from`, stops at `upto`
    // or at the limits.
    let mut take = |l: record::Layout, frame: &Bytes, out: &mut Vec<Record>| -> Option<Took> {
        if l.offset >= plan.upto {
            return None;
        }
        if l.offset >= plan.from {
            if !out.is_empty() && bytes + l.len > plan.max_bytes {
                return None;
            }
            bytes += l.len;
            out.push(l.record(&frame.slice(..l.len)));
            if out.len() >= plan.max_records {
                return Some(Took::Done);
            }
        }
        Some(Took::More)
    };
    let mappable = plan.file.map(pos, 0).is_some();
    // The length of the record at `pos`, read from its frame header (mappable storage only:
    // it decides between mapping the record and reading a chunk).
    let peek = |pos: u64| -> Result<Option<usize>> {
        if !mappable || pos + record::FRAME_HEADER_LEN as u64 > plan.end {
            return Ok(None);
        }
        let mut h = [0u8; record::FRAME_HEADER_LEN];
        let n = read_full_at(&*plan.file, &mut h, pos).map_err(Error::io("read"))?;
        record::frame_len(&h[..n], max_body).map_err(|c| corrupt(pos, c))
    };
    let mut next_len = peek(pos)?;
    while pos < plan.end && out.len() < plan.max_records {
        if let Some(len) = next_len.take()
            && len >= MAP_MIN
        {
            if pos + len as u64 > plan.end {
                return Err(corrupt(pos, Corruption::LengthTooLarge(len as u32)));
            }
            let frame = match plan.file.map(pos, len) {
                Some(Ok(b)) => b,
                Some(Err(e)) => return Err(Error::io("map")(e)),
                None => unreachable!("mappable storage stopped mapping"),
            };
            match record::check(&frame, max_body) {
                Ok(Ok(l)) => match take(l, &frame, out) {
                    None | Some(Took::Done) => return Ok(()),
                    Some(Took::More) => {}
                },
                Ok(Err(_)) => return Err(corrupt(pos, Corruption::LengthTooSmall(len as u32))),
                Err(c) => return Err(corrupt(pos, c)),
            }
            pos += len as u64;
            next_len = peek(pos)?;
            continue;
        }
        let want = usize::try_from(plan.end - pos)
            .unwrap_or(usize::MAX)
            .min(plan.max_bytes.max(64 << 10));
        let mut chunk = BytesMut::zeroed(want);
        let n = read_full_at(&*plan.file, &mut chunk, pos).map_err(Error::io("read"))?;
        chunk.truncate(n);
        let mut chunk: Bytes = chunk.freeze();
        if chunk.is_empty() {
            return Err(corrupt(pos, Corruption::LengthTooSmall(0)));
        }
        let mut used = 0usize;
        loop {
            match record::check(&chunk[used..], max_body) {
                Ok(Ok(l)) => {
                    let len = l.len;
                    match take(l, &chunk.slice(used..), out) {
                        None | Some(Took::Done) => return Ok(()),
                        Some(Took::More) => {}
                    }
                    used += len;
                }
                Ok(Err(need)) => {
                    if mappable && need >= MAP_MIN {
                        // A large record next: map it rather than read it.
                        next_len = Some(need);
                        break;
                    }
                    if used == 0 {
                        // One record larger than the chunk: read exactly it.
                        if pos + need as u64 > plan.end {
                            return Err(corrupt(pos, Corruption::LengthTooLarge(need as u32)));
                        }
                        let mut whole = BytesMut::zeroed(need);
                        let n = read_full_at(&*plan.file, &mut whole, pos)
                            .map_err(Error::io("read"))?;
                        if n != need {
                            return Err(corrupt(pos, Corruption::LengthTooSmall(n as u32)));
                        }
                        chunk = whole.freeze();
                        continue;
                    }
                    break;
                }
                Err(c) => return Err(corrupt(pos + used as u64, c)),
            }
            if used >= chunk.len() {
                break;
            }
        }
        pos += used as u64;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_strangers_are_ignored() {
        assert_eq!(parse_name(&log_name(42)), Some((42, false)));
        assert_eq!(parse_name(&idx_name(u64::MAX)), Some((u64::MAX, true)));
        for n in [
            "42.log",
            "000000000000000000042.log",
            "0000000000000000004x.log",
            "x.idx",
            "lock",
        ] {
            assert_eq!(parse_name(n), None, "{n}");
        }
    }
}
