//! Opens a log over arbitrary files and checks what recovery keeps (docs/log-format.md,
//! "Recovery").
//!
//! The input becomes the segment `00000000000000000000.log`, optionally a second segment
//! whose base offset comes from the input, and optionally `.idx` files, installed in a
//! `FaultyStorage`. Flags in the first byte can give the segments a correct header, set each
//! frame's version and expected offset, fix each frame's CRC-32C, and make the `.idx`
//! structurally valid with a good CRC, so that the fuzzer gets past the checksums.
//!
//! `Log::open` must succeed (the storage never fails), and the log must hold exactly what a
//! reference scan of the installed bytes keeps: reads never fail, offsets run consecutively
//! from the start to the end, every offset reads back on its own through the sparse index,
//! `offset_for_time` agrees with a linear search, no `.idx` is left for the active segment or
//! without its segment, an appended record gets the old end as its offset, and reopening finds
//! everything again with nothing to repair.
//!
//! One exception, by design: a sealed segment whose `.idx` checks out is trusted without its
//! records being read. When the input forges such an index for the first segment (easy here,
//! as the target fixes the CRC) and the second segment follows it, reads inside the first may
//! fail with `Error::Corrupt`; only the second segment is checked against the scan then.
//!
//! Second part: `record::decode` on the raw input never panics, claims no more than the input
//! holds, and a decoded record re-encodes to exactly the bytes it came from.

#![no_main]

use std::sync::Arc;

use bytes::Bytes;
use hayate_log::record::{self, Decoded};
use hayate_log::{Entry, Error, FaultyStorage, FsyncPolicy, Log, LogConfig, ReadLimit, Record};
use libfuzzer_sys::fuzz_target;

/// Flags, the input's first byte.
const TWO_SEGMENTS: u8 = 0x01; // install the second segment
const IDX0: u8 = 0x02; // install an .idx for the first segment
const HEADERS: u8 = 0x04; // put a correct 16-byte header in front of each segment's bytes
const FIX_CRC: u8 = 0x08; // rewrite each frame's CRC-32C
const FIX_OFFSETS: u8 = 0x10; // rewrite each frame's version byte and offset to the expected ones
const FIX_IDX: u8 = 0x20; // make the .idx structurally valid: magic, base, length, counts, CRC
const FOLLOW: u8 = 0x40; // the second segment's base = the frames in the first (and the .idx's next)
const IDX1: u8 = 0x80; // also install the .idx bytes for the second segment's base

const SEG_MAGIC: &[u8; 8] = b"HYTLOG01";
const IDX_MAGIC: &[u8; 8] = b"HYTIDX01";
const SEG_HEADER_LEN: usize = 16;
const IDX_HEADER_LEN: usize = 48;

fn config() -> LogConfig {
    LogConfig {
        segment_bytes: 4096,
        index_interval_bytes: 64,
        fsync: FsyncPolicy::Never,
        ..LogConfig::default()
    }
}

/// The largest body length the log accepts with [`config`].
fn max_body() -> u32 {
    u32::try_from(config().max_record_bytes - record::FRAME_HEADER_LEN).unwrap_or(u32::MAX)
}

/// CRC-32C (Castagnoli): reflected polynomial 0x82F63B78, initial value and final XOR all ones.
fn crc32c(data: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in data {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = (crc >> 1) ^ (0x82F6_3B78 & (crc & 1).wrapping_neg());
        }
    }
    !crc
}

fn log_name(base: u64) -> String {
    format!("{base:020}.log")
}

fn idx_name(base: u64) -> String {
    format!("{base:020}.idx")
}

fn header(base: u64) -> [u8; SEG_HEADER_LEN] {
    let mut h = [0u8; SEG_HEADER_LEN];
    h[..8].copy_from_slice(SEG_MAGIC);
    h[8..].copy_from_slice(&base.to_le_bytes());
    h
}

fn encoded_len(r: &Record) -> usize {
    record::RECORD_OVERHEAD + r.key.len() + r.headers.len() + r.value.len()
}

/// The input, read front to back; past its end everything reads as zeros.
struct Input<'a>(&'a [u8]);

impl<'a> Input<'a> {
    fn take(&mut self, n: usize) -> &'a [u8] {
        let s: &'a [u8] = self.0;
        let (a, b) = s.split_at(n.min(s.len()));
        self.0 = b;
        a
    }

    fn u8(&mut self) -> u8 {
        self.take(1).first().copied().unwrap_or(0)
    }

    fn u16(&mut self) -> usize {
        let mut a = [0u8; 2];
        let b = self.take(2);
        a[..b.len()].copy_from_slice(b);
        usize::from(u16::from_le_bytes(a))
    }

    fn u64(&mut self) -> u64 {
        let mut a = [0u8; 8];
        let b = self.take(8);
        a[..b.len()].copy_from_slice(b);
        u64::from_le_bytes(a)
    }
}

/// A segment file for `base`: `body`, after a correct header if asked. Then walks the frames
/// from byte 16 as far as their lengths are plausible, fixing what the flags say. Returns the
/// file and the number of frames walked.
fn segment(body: &[u8], base: u64, flags: u8) -> (Vec<u8>, u64) {
    let mut f = Vec::with_capacity(SEG_HEADER_LEN + body.len());
    if flags & HEADERS != 0 {
        f.extend_from_slice(&header(base));
    }
    f.extend_from_slice(body);
    let mut pos = SEG_HEADER_LEN;
    let mut n = 0u64;
    while pos + record::FRAME_HEADER_LEN <= f.len() {
        let mut l = [0u8; 4];
        l.copy_from_slice(&f[pos..pos + 4]);
        let len = u32::from_le_bytes(l) as usize;
        let body_at = pos + record::FRAME_HEADER_LEN;
        if len < record::BODY_FIXED_LEN || len > f.len() - body_at {
            break;
        }
        if flags & FIX_OFFSETS != 0 {
            f[body_at] = record::RECORD_VERSION;
            f[body_at + 1..body_at + 9].copy_from_slice(&base.wrapping_add(n).to_le_bytes());
        }
        if flags & FIX_CRC != 0 {
            let crc = crc32c(&f[body_at..body_at + len]);
            f[pos + 4..pos + 8].copy_from_slice(&crc.to_le_bytes());
        }
        pos = body_at + len;
        n += 1;
    }
    (f, n)
}

/// The `.idx` bytes: `raw` as it is, or (FIX_IDX) made structurally valid for the segment
/// `base` of `data_len` bytes: magic, base, `next` if given, length, at most 255 entries of
/// each kind (counts from the low bytes of the input's), size to match, CRC. The entries, the
/// largest timestamp and, without `next`, the next offset stay the input's.
fn index(raw: &[u8], base: u64, next: Option<u64>, data_len: usize, flags: u8) -> Vec<u8> {
    let mut ix = raw.to_vec();
    if flags & FIX_IDX == 0 {
        return ix;
    }
    ix.resize(ix.len().max(IDX_HEADER_LEN), 0);
    let n_off = usize::from(ix[40]);
    let n_time = usize::from(ix[44]);
    ix.resize(IDX_HEADER_LEN + 8 * n_off + 12 * n_time, 0);
    ix[..8].copy_from_slice(IDX_MAGIC);
    ix[8..16].copy_from_slice(&base.to_le_bytes());
    if let Some(next) = next {
        ix[16..24].copy_from_slice(&next.to_le_bytes());
    }
    ix[24..32].copy_from_slice(&(data_len as u64).to_le_bytes());
    ix[40..44].copy_from_slice(&(n_off as u32).to_le_bytes());
    ix[44..48].copy_from_slice(&(n_time as u32).to_le_bytes());
    let crc = crc32c(&ix);
    ix.extend_from_slice(&crc.to_le_bytes());
    ix
}

/// What recovery keeps of a segment it scans (the reference: docs/log-format.md, step 2.3).
struct Scanned {
    records: Vec<Record>,
    /// One past the last record kept.
    next: u64,
    /// Bytes recovery reports as cut: after the last valid record, or all of them when the
    /// header is wrong.
    cut: u64,
    damaged: bool,
}

fn scan(file: &[u8], base: u64, max_body: u32) -> Scanned {
    let mut s = Scanned {
        records: Vec::new(),
        next: base,
        cut: file.len() as u64,
        damaged: true,
    };
    if file.len() < SEG_HEADER_LEN || file[..SEG_HEADER_LEN] != header(base) {
        return s;
    }
    let bytes = Bytes::copy_from_slice(file);
    let mut pos = SEG_HEADER_LEN;
    while pos < file.len() {
        match record::decode(&bytes.slice(pos..), max_body) {
            Decoded::Record { record: r, len } if r.offset == s.next => {
                // A record at offset u64::MAX would leave no next offset: count it as damage.
                let Some(next) = s.next.checked_add(1) else {
                    break;
                };
                s.next = next;
                pos += len;
                s.records.push(r);
            }
            _ => break,
        }
    }
    s.damaged = pos < file.len();
    s.cut = (file.len() - pos) as u64;
    s
}

/// The directory after an open: only segment and index names, one `.log` per segment, an
/// `.idx` for every sealed segment and none for the active one or without its segment, and
/// the segments' bytes as the log counts them.
fn check_directory(storage: &FaultyStorage, log: &Log) {
    let mut logs = Vec::new();
    let mut idxs = Vec::new();
    for name in storage.names() {
        let (stem, list) = match (name.strip_suffix(".log"), name.strip_suffix(".idx")) {
            (Some(s), _) => (s, &mut logs),
            (_, Some(s)) => (s, &mut idxs),
            _ => panic!("unexpected file {name}"),
        };
        assert_eq!(stem.len(), 20, "{name}");
        list.push(stem.parse::<u64>().expect("a segment or index name"));
    }
    let stats = log.stats();
    assert_eq!(logs.len(), stats.segments, "segment files: {logs:?}");
    let active = logs.iter().copied().max().expect("a log has a segment");
    for b in &logs {
        if *b != active {
            assert!(idxs.contains(b), "sealed segment {b} has no .idx");
        }
    }
    for b in &idxs {
        assert!(logs.contains(b), ".idx {b} without its segment");
        assert_ne!(*b, active, "the active segment has an .idx");
    }
    let bytes: u64 = logs
        .iter()
        .map(|b| {
            storage
                .contents(&log_name(*b))
                .map_or(0, |c| c.len() as u64)
        })
        .sum();
    assert_eq!(bytes, stats.bytes, "segment bytes on disk and in the log");
}

/// Reads `[from, end)` front to back with the input's limits, and each offset on its own; both
/// must give exactly `expected`, which runs from `from` to the end of the log.
fn check_reads(log: &Log, from: u64, expected: &[Record], limits: u8) {
    let end = log.end_offset();
    assert_eq!(
        end - from,
        expected.len() as u64,
        "records from {from} to the end"
    );
    let limit = ReadLimit {
        max_records: 1 + usize::from(limits & 7),
        max_bytes: if limits & 8 != 0 { 64 } else { 1 << 20 },
        confirmed_only: false,
    };
    let mut at = from;
    let mut got = Vec::with_capacity(expected.len());
    while at < end {
        let batch = log
            .read(at, limit)
            .unwrap_or_else(|e| panic!("read at {at} (end {end}): {e}"));
        assert!(
            !batch.records.is_empty(),
            "read at {at} < end {end} gave nothing"
        );
        assert!(batch.records.len() <= limit.max_records);
        let bytes: usize = batch.records.iter().map(encoded_len).sum();
        assert!(batch.records.len() == 1 || bytes <= limit.max_bytes);
        for r in &batch.records {
            assert_eq!(r.offset, at, "offsets are consecutive");
            at += 1;
        }
        assert_eq!(batch.next, at);
        got.extend(batch.records);
    }
    assert_eq!(got, expected);
    let at_end = log.read(end, limit).expect("a read at the end");
    assert!(at_end.records.is_empty() && at_end.next == end);

    let one = ReadLimit {
        max_records: 1,
        max_bytes: 1,
        confirmed_only: false,
    };
    for r in expected {
        let b = log
            .read(r.offset, one)
            .unwrap_or_else(|e| panic!("read of {} alone: {e}", r.offset));
        assert_eq!(b.records.as_slice(), std::slice::from_ref(r));
        assert_eq!(b.next, r.offset + 1);
    }
}

/// `offset_for_time` against a linear search of `expected`, which runs from the start of the
/// log to its end.
fn check_times(log: &Log, expected: &[Record], ts: i64) {
    let end = log.end_offset();
    let mut probes = vec![ts, i64::MIN, i64::MAX];
    for r in expected.iter().take(64) {
        probes.push(r.timestamp);
        probes.push(r.timestamp.saturating_add(1));
    }
    for t in probes {
        let want = expected
            .iter()
            .find(|r| r.timestamp >= t)
            .map_or(end, |r| r.offset);
        let got = log
            .offset_for_time(t)
            .unwrap_or_else(|e| panic!("offset_for_time({t}): {e}"));
        assert_eq!(got, want, "offset_for_time({t})");
    }
}

fn recovery(data: &[u8]) {
    let mut input = Input(data);
    let flags = input.u8();
    let limits = input.u8();
    let raw_base1 = input.u64();
    let ts = input.u64() as i64;
    let len0 = input.u16();
    let body0 = input.take(len0);
    let len1 = input.u16();
    let body1 = input.take(len1);
    let len_idx = input.u16();
    let idx_raw = input.take(len_idx);
    let value = input.take(256);

    let (seg0, frames0) = segment(body0, 0, flags);
    let base1 = if flags & FOLLOW != 0 {
        frames0
    } else {
        raw_base1
    };
    // Base 0 would name the first segment again.
    let two = flags & TWO_SEGMENTS != 0 && base1 != 0;
    let (seg1, _) = segment(body1, base1, flags);

    let storage = FaultyStorage::new();
    storage.set_contents(&log_name(0), seg0.clone());
    if two {
        storage.set_contents(&log_name(base1), seg1.clone());
    }
    if flags & IDX0 != 0 {
        let next = (flags & FOLLOW != 0).then_some(base1);
        storage.set_contents(&idx_name(0), index(idx_raw, 0, next, seg0.len(), flags));
    }
    if flags & IDX1 != 0 && base1 != 0 {
        storage.set_contents(
            &idx_name(base1),
            index(idx_raw, base1, None, seg1.len(), flags),
        );
    }

    let config = config();
    let log = Log::open(Arc::new(storage.clone()), config)
        .unwrap_or_else(|e| panic!("open failed on a storage that never fails: {e}"));
    let rep = log.recovery().clone();

    // With two segment files the first is not the last, so recovery either trusted it (its
    // .idx checked out) or scanned it and counted it in `rebuilt_indexes`. Trusted and still
    // followed by the second segment: its records were never read.
    let trusted0 = two && rep.rebuilt_indexes == 0;
    let unchecked0 = trusted0 && rep.segments == 2;
    let max_body = max_body();
    let m0 = scan(&seg0, 0, max_body);
    // A trusted first segment is followed when the .idx's next offset is the second's base (a
    // gap drops the second, and the first is then scanned as the last); a scanned one when it
    // is undamaged and ends where the second begins.
    let keep1 = two
        && if trusted0 {
            unchecked0
        } else {
            !m0.damaged && m0.next == base1
        };
    // A hole (the first ends below the second's base, undamaged): recovery takes the first
    // for the remains of an interrupted retention and removes it; the second is kept, alone.
    let hole = two && base1 > 0 && log.start_offset() == base1;
    if hole {
        assert!(trusted0 || (!m0.damaged && m0.next < base1), "{:?}", rep.repairs);
    }
    let keep1 = keep1 || hole;
    let m1 = keep1.then(|| scan(&seg1, base1, max_body));
    let (from, mut expected, cut) = match (&m1, unchecked0) {
        (Some(m1), _) if hole => (base1, m1.records.clone(), m1.cut),
        (Some(m1), true) => (base1, m1.records.clone(), m1.cut),
        (Some(m1), false) => (
            0,
            [m0.records.clone(), m1.records.clone()].concat(),
            m0.cut + m1.cut,
        ),
        (None, _) => (0, m0.records.clone(), m0.cut),
    };
    for (i, r) in expected.iter().enumerate() {
        assert_eq!(
            r.offset,
            from + i as u64,
            "the reference itself is consecutive"
        );
    }

    assert_eq!(rep.segments, 1 + usize::from(keep1 && !hole), "{:?}", rep.repairs);
    assert_eq!(
        rep.dropped_segments,
        usize::from(two && (!keep1 || hole)),
        "{:?}",
        rep.repairs
    );
    assert_eq!(rep.truncated_bytes, cut, "{:?}", rep.repairs);
    assert_eq!(log.start_offset(), if hole { base1 } else { 0 });
    assert_eq!(log.end_offset(), from + expected.len() as u64);
    check_directory(&storage, &log);
    check_reads(&log, from, &expected, limits);
    if unchecked0 {
        // Unread records: a read may fail, but only as corrupt, and nothing may panic.
        let limit = ReadLimit {
            confirmed_only: false,
            ..ReadLimit::default()
        };
        for at in [0, base1 / 2, base1 - 1] {
            match log.read(at, limit) {
                Ok(_) | Err(Error::Corrupt { .. }) => {}
                Err(e) => panic!("read at {at} in a trusted segment: {e}"),
            }
        }
        match log.offset_for_time(ts) {
            Ok(_) | Err(Error::Corrupt { .. }) => {}
            Err(e) => panic!("offset_for_time({ts}) over a trusted segment: {e}"),
        }
    } else {
        check_times(&log, &expected, ts);
    }

    // One more record goes at the end.
    let end = log.end_offset();
    let entry = Entry {
        timestamp: ts,
        key: b"k",
        headers: b"h",
        value,
    };
    if end >= u64::MAX - 1 {
        // The offsets are used up: the log refuses, and says so.
        assert!(log.append(&entry).is_err(), "append at {end} must be refused");
        return;
    }
    let at = log
        .append(&entry)
        .unwrap_or_else(|e| panic!("append at {end}: {e}"));
    assert_eq!(at, end, "the new record's offset is the old end");
    assert_eq!(log.end_offset(), end + 1);
    let appended = Record {
        offset: at,
        timestamp: ts,
        key: Bytes::from_static(b"k"),
        headers: Bytes::from_static(b"h"),
        value: Bytes::copy_from_slice(value),
    };
    expected.push(appended);
    check_reads(&log, from, &expected, limits);

    // Closed cleanly, it reopens as it was, with nothing to repair.
    drop(log);
    let log =
        Log::open(Arc::new(storage.clone()), config).unwrap_or_else(|e| panic!("reopen: {e}"));
    assert!(
        log.recovery().repairs.is_empty(),
        "repairs after a clean close: {:?}",
        log.recovery().repairs
    );
    assert_eq!(log.start_offset(), if hole { base1 } else { 0 });
    assert_eq!(log.end_offset(), end + 1);
    check_directory(&storage, &log);
    check_reads(&log, from, &expected, limits);
    if !unchecked0 {
        check_times(&log, &expected, ts);
    }
}

fn decode(data: &[u8]) {
    let buf = Bytes::copy_from_slice(data);
    match record::decode(&buf, 1 << 20) {
        Decoded::Record { record: r, len } => {
            assert!(len <= data.len());
            assert_eq!(len, encoded_len(&r));
            let mut again = Vec::new();
            record::encode(
                &mut again,
                r.offset,
                &Entry {
                    timestamp: r.timestamp,
                    key: &r.key,
                    headers: &r.headers,
                    value: &r.value,
                },
            );
            assert_eq!(
                again,
                &data[..len],
                "a decoded record re-encodes to its bytes"
            );
        }
        Decoded::Incomplete { need } => assert!(need > data.len(), "need {need}"),
        Decoded::Corrupt(_) => {}
    }
}

fuzz_target!(|data: &[u8]| {
    decode(data);
    recovery(data);
});
