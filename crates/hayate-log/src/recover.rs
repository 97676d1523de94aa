//! Opening a log directory: find the segments, trust sealed ones whose `.idx` checks out,
//! scan the rest, cut a torn or garbage tail, and drop whatever follows damage.
//!
//! Rules (docs/log-format.md, "Recovery"):
//! - a sealed segment is trusted without a scan when its `.idx` file has a good CRC, names the
//!   same base offset and the `.log` file has exactly the length the index recorded;
//! - any other segment is scanned record by record; at the first byte that is not a valid
//!   record with the expected offset, the file is truncated there;
//! - segments after a truncated one are removed: their records were never confirmed
//!   (confirmation is in offset order), and keeping them would leave a hole;
//! - segments before a hole in offsets are removed: retention removes oldest first, and a
//!   file system may persist a later removal before an earlier one;
//! - a segment overlapping the one before it (never written so) is removed with all after it;
//! - the last segment is always scanned (its `.idx`, if any, is stale and removed).

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::config::LogConfig;
use crate::error::{Error, Result};
use crate::index::SealedIndex;
use crate::segment::{self, Damage, SEG_HEADER_LEN, SegIndex, Segment, idx_name, log_name};
use crate::storage::{Storage, StorageFile, write_all_at};

/// What opening the log found and repaired.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RecoveryReport {
    /// Segments kept.
    pub segments: usize,
    /// Segments read record by record (the last one, and sealed ones without a good index).
    pub scanned: usize,
    /// Sealed segments whose index was rebuilt.
    pub rebuilt_indexes: usize,
    /// Bytes cut from damaged tails.
    pub truncated_bytes: u64,
    /// Segments removed because they followed damage or a gap.
    pub dropped_segments: usize,
    /// One line per repair, for the broker's log.
    pub repairs: Vec<String>,
}

pub(crate) struct Recovered {
    pub(crate) segments: Vec<Segment>,
    /// Sealed segments whose index must be written (after a sync).
    pub(crate) pending: Vec<u64>,
    pub(crate) report: RecoveryReport,
}

pub(crate) fn create_segment(storage: &dyn Storage, base: u64) -> Result<Segment> {
    let file = storage
        .open(&log_name(base), true)
        .map_err(Error::io("create segment"))?;
    file.set_len(0).map_err(Error::io("create segment"))?;
    write_all_at(&*file, &segment::header(base), 0).map_err(Error::io("create segment"))?;
    Ok(Segment {
        base,
        file,
        next: base,
        size: SEG_HEADER_LEN,
        max_ts: i64::MIN,
        index: SegIndex::Memory(Default::default()),
    })
}

fn scanned(
    file: Arc<dyn StorageFile>,
    base: u64,
    cfg: &LogConfig,
    rep: &mut RecoveryReport,
) -> Result<(Segment, bool)> {
    rep.scanned += 1;
    let s = segment::scan(&*file, base, cfg)?;
    let len = file.len().map_err(Error::io("open"))?;
    let damaged = s.damage.is_some();
    let mut size = s.valid_len;
    if let Some(d) = s.damage {
        rep.truncated_bytes += len - s.valid_len;
        rep.repairs.push(format!(
            "segment {base}: {} at byte {}; cut {} bytes, {} records kept",
            match d {
                Damage::TornRecord => "torn record".to_owned(),
                Damage::Corrupt(c) => c.to_string(),
                Damage::Header => "bad segment header".to_owned(),
            },
            s.valid_len,
            len - s.valid_len,
            s.next - base
        ));
        if d == Damage::Header {
            file.set_len(0).map_err(Error::io("truncate"))?;
            write_all_at(&*file, &segment::header(base), 0).map_err(Error::io("truncate"))?;
            size = SEG_HEADER_LEN;
        } else {
            file.set_len(s.valid_len).map_err(Error::io("truncate"))?;
        }
        file.sync_data().map_err(Error::io("truncate"))?;
    }
    let seg = Segment {
        base,
        file,
        next: s.next,
        size,
        max_ts: s.max_ts,
        index: SegIndex::Memory(s.index),
    };
    Ok((seg, damaged))
}

pub(crate) fn recover(storage: &dyn Storage, cfg: &LogConfig) -> Result<Recovered> {
    let mut rep = RecoveryReport::default();
    // base -> has an index file
    let mut found: BTreeMap<u64, (bool, bool)> = BTreeMap::new();
    for name in storage.list().map_err(Error::io("open"))? {
        if let Some((base, is_idx)) = segment::parse_name(&name) {
            let e = found.entry(base).or_default();
            if is_idx { e.1 = true } else { e.0 = true }
        }
    }
    let mut segments: Vec<Segment> = Vec::new();
    let mut pending = Vec::new();
    let mut drop_from: Option<usize> = None;
    let bases: Vec<(u64, bool)> = found
        .iter()
        .filter_map(|(&b, &(log, idx))| {
            if !log && idx {
                let _ = storage.remove(&idx_name(b)); // an index without its segment
            }
            log.then_some((b, idx))
        })
        .collect();
    for (i, &(base, has_idx)) in bases.iter().enumerate() {
        if let Some(prev) = segments.last()
            && prev.next != base
        {
            if prev.next < base {
                // A hole: retention removes segments oldest first but a file system may
                // persist a later removal before an earlier one; what precedes the hole was
                // being removed. Finish the removal.
                for s in segments.drain(..) {
                    rep.dropped_segments += 1;
                    rep.repairs.push(format!(
                        "segment {} removed: it precedes a hole before segment {base} (an interrupted retention)",
                        s.base
                    ));
                    storage
                        .remove(&log_name(s.base))
                        .map_err(Error::io("remove"))?;
                    let _ = storage.remove(&idx_name(s.base));
                }
                pending.clear();
            } else {
                rep.repairs.push(format!(
                    "segment {base} overlaps segment {} (ends at {})",
                    prev.base, prev.next
                ));
                drop_from = Some(i);
                break;
            }
        }
        let last = i + 1 == bases.len();
        let file = storage
            .open(&log_name(base), false)
            .map_err(Error::io("open"))?;
        if has_idx && !last {
            let ok = storage
                .open(&idx_name(base), false)
                .ok()
                .and_then(SealedIndex::load);
            let len = file.len().map_err(Error::io("open"))?;
            if let Some((ix, meta)) = ok
                && meta.base == base
                && meta.data_len == len
            {
                segments.push(Segment {
                    base,
                    file,
                    next: meta.next,
                    size: len,
                    max_ts: meta.max_ts,
                    index: SegIndex::File(ix),
                });
                continue;
            }
            rep.repairs
                .push(format!("segment {base}: index does not match; rebuilt"));
        }
        if has_idx {
            let _ = storage.remove(&idx_name(base));
        }
        let (seg, damaged) = scanned(file, base, cfg, &mut rep)?;
        if !last {
            rep.rebuilt_indexes += 1;
            pending.push(base);
        }
        segments.push(seg);
        if damaged && !last {
            drop_from = Some(i + 1);
            break;
        }
    }
    if let Some(from) = drop_from {
        for &(base, _) in &bases[from..] {
            rep.dropped_segments += 1;
            rep.repairs.push(format!(
                "segment {base} removed: it follows damage or a gap"
            ));
            storage
                .remove(&log_name(base))
                .map_err(Error::io("remove"))?;
            let _ = storage.remove(&idx_name(base));
        }
    }
    // The last segment becomes the active one: it needs its index in memory.
    if let Some(last) = segments.last_mut()
        && matches!(last.index, SegIndex::File(_))
    {
        let base = last.base;
        let _ = storage.remove(&idx_name(base));
        let file = last.file.clone();
        segments.pop();
        let (seg, _) = scanned(file, base, cfg, &mut rep)?;
        segments.push(seg);
    }
    pending.retain(|b| segments.last().is_some_and(|l| l.base != *b));
    if segments.is_empty() {
        segments.push(create_segment(storage, 0)?);
    }
    storage.sync_dir().map_err(Error::io("open"))?;
    rep.segments = segments.len();
    Ok(Recovered {
        segments,
        pending,
        report: rep,
    })
}
